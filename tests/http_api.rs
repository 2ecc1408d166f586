//! The HTTP contract around the saga: authentication, Idempotency-Key rules
//! (including duplicates fired concurrently), limits and JSON errors. On
//! SQLite and on PostgreSQL.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};
use support::{Backend, TestApp, OPERATOR};

const WITHIN: Duration = Duration::from_secs(20);

async fn error_of(resp: reqwest::Response) -> (u16, String) {
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.expect("errors are JSON");
    assert!(body["message"].is_string(), "{body}");
    (
        status,
        body["error"].as_str().unwrap_or_default().to_owned(),
    )
}

async fn duplicate_submissions_fired_concurrently_make_one_saga(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let (sid, ptok) = app.session(&slug, None, "dup").await;
    let body = json!({"prompt": "double click", "score": 7});
    let answers =
        join_all((0..10).map(|_| app.submit(&sid, &ptok, body.clone(), "same-key"))).await;
    let mut accepted = 0;
    let mut saga_ids = Vec::new();
    for resp in answers {
        match resp.status().as_u16() {
            202 => {
                accepted += 1;
                saga_ids.push(
                    resp.json::<Value>().await.unwrap()["saga_id"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                );
            }
            409 => assert_eq!(error_of(resp).await.1, "request_in_progress"),
            other => panic!("unexpected {other}"),
        }
    }
    assert!(accepted >= 1);
    saga_ids.dedup();
    assert_eq!(saga_ids.len(), 1, "replays carry the same saga");

    // Other keys fired at once: still one saga for the session.
    let keys: Vec<String> = (0..5).map(|i| format!("other-{i}")).collect();
    let answers = join_all(
        keys.iter()
            .map(|k| app.submit(&sid, &ptok, body.clone(), k)),
    )
    .await;
    for resp in answers {
        assert_eq!(error_of(resp).await, (409, "already_submitted".into()));
    }
    assert_eq!(
        app.wait_final(&sid, &ptok, WITHIN).await["status"],
        "COMPLETED"
    );

    // After completion the same key and body replays the 202.
    let replay = app.submit(&sid, &ptok, body.clone(), "same-key").await;
    assert_eq!(replay.status(), 202);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(
        replay.json::<Value>().await.unwrap()["saga_id"],
        saga_ids[0].as_str()
    );
    // Same key, other body.
    let reused = app
        .submit(&sid, &ptok, json!({"prompt": "other"}), "same-key")
        .await;
    assert_eq!(
        error_of(reused).await,
        (422, "idempotency_key_reused".into())
    );
    assert_eq!(app.sim.control.stats().jobs_created, 1);
    let ranking = app
        .get_json(&format!("/api/experiences/{slug}/ranking"))
        .await;
    assert_eq!(ranking["entries"].as_array().unwrap().len(), 1);
    app.stop().await;
}
db_test!(duplicate_submissions_fired_concurrently_make_one_saga);

async fn submission_checks_in_contract_order(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let (sid, ptok) = app.session(&slug, None, "erin").await;
    let prompt = json!({"prompt": "x"}).to_string();

    // Authentication first.
    let resp = app.submit_raw(&sid, None, Some("k"), prompt.clone()).await;
    assert_eq!(error_of(resp).await, (401, "unauthorized".into()));
    let resp = app
        .submit(&sid, "wrong-token", json!({"prompt": "x"}), "k")
        .await;
    assert_eq!(error_of(resp).await, (401, "unauthorized".into()));
    // Then the key.
    let resp = app.submit_raw(&sid, Some(&ptok), None, prompt).await;
    assert_eq!(
        error_of(resp).await,
        (400, "idempotency_key_required".into())
    );
    let long_key = "k".repeat(256);
    let resp = app
        .submit(&sid, &ptok, json!({"prompt": "x"}), &long_key)
        .await;
    assert_eq!(
        error_of(resp).await,
        (400, "idempotency_key_required".into())
    );
    // Then the body.
    let resp = app
        .submit(&sid, &ptok, json!({"prompt": ""}), "k-empty")
        .await;
    assert_eq!(error_of(resp).await, (422, "validation_failed".into()));
    let resp = app
        .submit(&sid, &ptok, json!({"prompt": "x".repeat(2_001)}), "k-long")
        .await;
    assert_eq!(error_of(resp).await, (422, "validation_failed".into()));
    let resp = app
        .submit_raw(&sid, Some(&ptok), Some("k-bad"), "{not json".into())
        .await;
    assert_eq!(error_of(resp).await, (400, "invalid_json".into()));
    let resp = app
        .submit_raw(
            &sid,
            Some(&ptok),
            Some("k-big"),
            format!("{{\"prompt\": \"{}\"}}", "x".repeat(70 * 1024)),
        )
        .await;
    assert_eq!(error_of(resp).await, (413, "payload_too_large".into()));
    // Nothing was lost: the session still accepts a good submission.
    assert_eq!(
        app.submit(&sid, &ptok, json!({"prompt": "ok"}), "k-ok")
            .await
            .status(),
        202
    );
    app.stop().await;
}
db_test!(submission_checks_in_contract_order);

async fn operators_need_their_token_and_errors_are_json(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let resp = app
        .http
        .post(format!("{}/api/experiences", app.base))
        .json(&json!({"slug": "x", "title": "t", "kind": "comic"}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(resp).await, (401, "unauthorized".into()));
    let bad_kind = app
        .http
        .post(format!("{}/api/experiences", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"slug": "x", "title": "t", "kind": "poem"}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(bad_kind).await, (422, "validation_failed".into()));
    let slug = app.experience(5).await;
    let create = |slug: String| {
        app.http
            .post(format!("{}/api/experiences", app.base))
            .bearer_auth(OPERATOR)
            .json(&json!({"slug": slug, "title": "t", "kind": "comic"}))
            .send()
    };
    let taken = create(slug.clone()).await.unwrap();
    assert_eq!(error_of(taken).await, (409, "conflict".into()));
    // Creates of one new slug fired at once: one wins, the rest conflict.
    let racing = join_all((0..6).map(|_| create("racing-slug".into()))).await;
    let mut statuses: Vec<u16> = racing
        .iter()
        .map(|r| r.as_ref().unwrap().status().as_u16())
        .collect();
    statuses.sort();
    assert_eq!(statuses, vec![201, 409, 409, 409, 409, 409]);
    let list: Value = app
        .http
        .get(format!("{}/api/experiences", app.base))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["experiences"][0]["slug"], slug.as_str());
    let resp = app
        .http
        .get(format!("{}/nope", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(resp).await, (404, "not_found".into()));
    let resp = app
        .http
        .post(format!("{}/api/experiences/{slug}/sessions", app.base))
        .json(&json!({"nickname": "a\u{1}b"}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(resp).await, (422, "validation_failed".into()));
    // The operator may read any session.
    let (sid, _) = app.session(&slug, None, "op-read").await;
    assert_eq!(app.status(&sid, OPERATOR).await["status"], "OPEN");
    // Terminal socket with a wrong token: 401 before the upgrade.
    let (tid, _) = app.terminal(&slug).await;
    let resp = app
        .http
        .get(format!("{}/ws/terminals/{tid}?token=wrong", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = app
        .http
        .get(format!(
            "{}/api/experiences/{slug}/ranking?limit=lots",
            app.base
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(resp).await, (422, "validation_failed".into()));
    for path in ["/healthz", "/readyz", "/"] {
        assert_eq!(
            app.http
                .get(format!("{}{path}", app.base))
                .send()
                .await
                .unwrap()
                .status(),
            200,
            "{path}"
        );
    }
    app.stop().await;
}
db_test!(operators_need_their_token_and_errors_are_json);
