//! Bulk actions and search, black box through HTTP, on SQLite and on
//! PostgreSQL: `POST /api/admin/sagas/bulk` counts first on a dry run and
//! changes nothing, then acts on each matching saga under the single
//! action's fence (a saga whose state refuses the action is matched, not
//! done), acts once per Idempotency-Key, and works through 10,000 sagas
//! a page at a time without a long transaction; `GET /api/admin/sagas?q=`
//! finds sagas by part of a nickname or by session id.

mod support;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sea_orm::ConnectionTrait;
use serde_json::{json, Value};
use stagehand::ai::simulator::SimConfig;
use stagehand::store::notify::LISTENER_APPLICATION_NAME;
use support::{fast_sim, Backend, TestApp, OPERATOR};

const WITHIN: Duration = Duration::from_secs(30);

async fn bulk(app: &TestApp, body: Value, key: Option<&str>) -> (u16, bool, Value) {
    let mut req = app
        .http
        .post(format!("{}/api/admin/sagas/bulk", app.base))
        .bearer_auth(OPERATOR)
        .json(&body);
    if let Some(key) = key {
        req = req.header("Idempotency-Key", key);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let replayed = resp.headers().get("Idempotent-Replayed").is_some();
    (status, replayed, resp.json().await.unwrap_or(Value::Null))
}

async fn steps_of(app: &TestApp, slug: &str) -> Vec<String> {
    let (_, body) = app
        .operator_get(&format!("/api/admin/sagas?experience={slug}&limit=500"))
        .await;
    let mut steps: Vec<String> = body["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap().to_owned())
        .collect();
    steps.sort();
    steps
}

/// Sagas waiting on a slow AI: a dry run counts them and changes nothing;
/// the cancel acts on each once; the same Idempotency-Key replays the
/// answer and acts on nothing new; a retry of the cancelled ones runs
/// them again, and a retry of sagas that are not ABORTED is matched but
/// not done.
async fn bulk_counts_first_then_acts_once(backend: Backend) {
    let slow = SimConfig {
        latency: Duration::from_secs(60),
        ..fast_sim()
    };
    let app = TestApp::spawn_with(backend, slow, |_| {}).await;
    let slug = app.experience(50).await;
    let other = app.experience(50).await;
    let mut sessions = Vec::new();
    for i in 0..5 {
        let (sid, token) = app.session(&slug, None, &format!("p{i}")).await;
        assert_eq!(
            app.submit(&sid, &token, json!({"prompt": "x"}), "k")
                .await
                .status(),
            202
        );
        sessions.push((sid, token));
    }
    let (sid, token) = app.session(&other, None, "elsewhere").await;
    assert_eq!(
        app.submit(&sid, &token, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );

    let filter = json!({"experience": slug, "step": "AI_PENDING"});
    let (code, _, body) = bulk(
        &app,
        json!({"action": "cancel", "filter": filter, "dry_run": true}),
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        (body["matched"].as_i64(), body["done"].as_i64()),
        (Some(5), Some(0)),
        "{body}"
    );
    assert_eq!(
        steps_of(&app, &slug).await,
        vec!["AI_PENDING"; 5],
        "a dry run changes nothing"
    );

    let (code, replayed, first) = bulk(
        &app,
        json!({"action": "cancel", "filter": filter}),
        Some("b1"),
    )
    .await;
    assert_eq!((code, replayed), (200, false), "{first}");
    assert_eq!(
        (first["matched"].as_i64(), first["done"].as_i64()),
        (Some(5), Some(5)),
        "{first}"
    );
    assert_eq!(steps_of(&app, &slug).await, vec!["ABORTED"; 5]);
    assert_eq!(
        steps_of(&app, &other).await,
        vec!["AI_PENDING"],
        "the filter held"
    );

    // A new saga matches the filter now; the same key acts on nothing.
    let (sid, token) = app.session(&slug, None, "late").await;
    assert_eq!(
        app.submit(&sid, &token, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    let (code, replayed, again) = bulk(
        &app,
        json!({"action": "cancel", "filter": filter}),
        Some("b1"),
    )
    .await;
    assert_eq!((code, replayed), (200, true));
    assert_eq!(again, first);
    let steps = steps_of(&app, &slug).await;
    assert_eq!(
        steps.iter().filter(|s| *s == "AI_PENDING").count(),
        1,
        "{steps:?}"
    );

    // Retry the cancelled ones: all five run again.
    let (code, _, body) = bulk(
        &app,
        json!({"action": "retry", "filter": {"experience": slug, "reason": "CANCELLED"}}),
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        (body["matched"].as_i64(), body["done"].as_i64()),
        (Some(5), Some(5)),
        "{body}"
    );
    assert_eq!(steps_of(&app, &slug).await, vec!["AI_PENDING"; 6]);
    // Retrying running sagas: matched, refused by each one's fence.
    let (_, _, body) = bulk(
        &app,
        json!({"action": "retry", "filter": {"experience": slug}}),
        None,
    )
    .await;
    assert_eq!(
        (body["matched"].as_i64(), body["done"].as_i64()),
        (Some(6), Some(0)),
        "{body}"
    );

    // Bad input is a clear 422 and changes nothing.
    for bad in [
        json!({"action": "explode"}),
        json!({"action": "cancel", "filter": {"step": "NOPE"}}),
        json!({"action": "cancel", "filter": {"updated_after": "yesterday"}}),
        json!({"action": "cancel", "filter": {"colour": "red"}}),
    ] {
        let (code, _, body) = bulk(&app, bad.clone(), None).await;
        assert!(code == 422 || code == 400, "{bad} -> {code} {body}");
        assert!(body["error"].is_string(), "{body}");
    }
    assert_eq!(steps_of(&app, &slug).await, vec!["AI_PENDING"; 6]);
    app.stop().await;
}
db_test!(bulk_counts_first_then_acts_once);

/// Bulk approve and reject go through the review's fences: results in
/// review are approved (they complete) or rejected; a time window keeps
/// out sagas changed outside it.
async fn bulk_decides_the_review_queue(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = format!("rev-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let resp = app
        .http
        .post(format!("{}/api/experiences", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"slug": slug, "title": "t", "kind": "image", "review": "before_display"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let mut sessions = Vec::new();
    for i in 0..4 {
        let (sid, token) = app.session(&slug, None, &format!("r{i}")).await;
        assert_eq!(
            app.submit(&sid, &token, json!({"prompt": "x"}), "k")
                .await
                .status(),
            202
        );
        sessions.push((sid, token));
    }
    support::wait_for(WITHIN, || async {
        (steps_of(&app, &slug).await == vec!["IN_REVIEW"; 4]).then_some(())
    })
    .await
    .expect("all four wait in review");
    // A window that ended before they entered review matches none.
    let (_, _, body) = bulk(
        &app,
        json!({"action": "approve", "filter": {"step": "IN_REVIEW", "updated_before": "2020-01-01T00:00:00Z"}, "dry_run": true}),
        None,
    )
    .await;
    assert_eq!(body["matched"], 0, "{body}");
    // Reject r0 by its nickname, approve the rest.
    let (_, _, body) = bulk(
        &app,
        json!({"action": "reject", "filter": {"step": "IN_REVIEW", "q": "r0"}}),
        None,
    )
    .await;
    assert_eq!(
        (body["matched"].as_i64(), body["done"].as_i64()),
        (Some(1), Some(1)),
        "{body}"
    );
    let (_, _, body) = bulk(
        &app,
        json!({"action": "approve", "filter": {"experience": slug, "step": "IN_REVIEW"}}),
        None,
    )
    .await;
    assert_eq!(
        (body["matched"].as_i64(), body["done"].as_i64()),
        (Some(3), Some(3)),
        "{body}"
    );
    for (i, (sid, token)) in sessions.iter().enumerate() {
        let done = app.wait_final(sid, token, WITHIN).await;
        let expected = if i == 0 { "ABORTED" } else { "COMPLETED" };
        assert_eq!(done["status"], expected, "{done}");
    }
    app.stop().await;
}
db_test!(bulk_decides_the_review_queue);

/// `q` finds sagas by part of a nickname, in any case, or by the start of
/// the session id; LIKE's wildcards in it match only themselves; a `q`
/// over 100 characters is 422.
async fn search_finds_by_nickname_or_session(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(10).await;
    let mut ids = Vec::new();
    for name in ["Alice", "malicia", "Bob", "100%_sure"] {
        let (sid, token) = app.session(&slug, None, name).await;
        assert_eq!(
            app.submit(&sid, &token, json!({"prompt": "x"}), "k")
                .await
                .status(),
            202
        );
        ids.push(sid);
    }
    let found = |q: String| {
        let app = &app;
        async move {
            let (status, body) = app
                .operator_get(&format!("/api/admin/sagas?q={}", urlencode(&q)))
                .await;
            assert_eq!(status, 200, "{body}");
            let mut names: Vec<String> = body["sagas"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["nickname"].as_str().unwrap().to_owned())
                .collect();
            names.sort();
            names
        }
    };
    assert_eq!(found("ali".into()).await, ["Alice", "malicia"]);
    assert_eq!(found("ALI".into()).await, ["Alice", "malicia"]);
    assert_eq!(found(ids[2][..8].to_owned()).await, ["Bob"]);
    assert_eq!(found(ids[2].clone()).await, ["Bob"]);
    assert_eq!(found("%".into()).await, ["100%_sure"]);
    assert_eq!(found("_".into()).await, ["100%_sure"]);
    assert!(found("zzz".into()).await.is_empty());
    let (status, body) = app
        .operator_get(&format!("/api/admin/sagas?q={}", "x".repeat(101)))
        .await;
    assert_eq!(status, 422, "{body}");
    app.stop().await;
}
db_test!(search_finds_by_nickname_or_session);

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// 10,000 sagas queued for later (so no worker takes them) are cancelled
/// by one bulk request: all matched, all done, in pages; on PostgreSQL no
/// transaction of the server stays open for more than one page's work.
async fn bulk_works_through_ten_thousand_sagas(backend: Backend) {
    const N: usize = 10_000;
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let store = app.db.store().await;
    let experience = store.experience_by_slug(&slug).await.unwrap().unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    let later = now + 3_600_000;
    for chunk in (0..N).collect::<Vec<_>>().chunks(500) {
        let mut sessions = Vec::new();
        let mut sagas = Vec::new();
        for _ in chunk {
            let session = uuid::Uuid::new_v4().to_string();
            let saga = uuid::Uuid::new_v4().to_string();
            sessions.push(format!(
                "('{session}', '{e}', NULL, 'bulk', '{hash}', 'SUBMITTING', NULL, {now}, {now})",
                e = experience.id,
                hash = uuid::Uuid::new_v4().simple()
            ));
            sagas.push(format!(
                "('{saga}', '{session}', '{e}', 'AI_PENDING', 'x', 0, 0, 0, {later}, '{key}', 0, FALSE, {later}, 0, {now}, {now})",
                e = experience.id,
                key = uuid::Uuid::new_v4()
            ));
        }
        store
            .db()
            .execute_unprepared(&format!(
                "INSERT INTO sessions (id, experience_id, terminal_id, nickname, participant_token_hash, status, abort_reason, created_at_ms, updated_at_ms) VALUES {}",
                sessions.join(", ")
            ))
            .await
            .unwrap();
        store
            .db()
            .execute_unprepared(&format!(
                "INSERT INTO sagas (id, session_id, experience_id, step, prompt, attempts, recoveries, unavailable_streak, next_attempt_at_ms, ai_base_key, attempt_offset, handed_over, deadline_at_ms, charged_credits, created_at_ms, updated_at_ms) VALUES {}",
                sagas.join(", ")
            ))
            .await
            .unwrap();
    }
    let filter = json!({"experience": slug, "step": "AI_PENDING"});
    let (_, _, dry) = bulk(
        &app,
        json!({"action": "cancel", "filter": filter, "dry_run": true}),
        None,
    )
    .await;
    assert_eq!(dry["matched"], N as i64, "{dry}");

    // On PostgreSQL, watch the server's transactions while it works. Not
    // its LISTEN connection: PostgreSQL reads incoming notifications there
    // in a short transaction of its own whose `xact_start` is the time of
    // that connection's last statement (its LISTEN, at start-up), so it
    // looks as old as the server while it lasts (seen in CI: 2,523 ms).
    let watching = Arc::new(AtomicBool::new(true));
    let longest_ms = Arc::new(AtomicI64::new(0));
    let watcher = (backend == Backend::Postgres).then(|| {
        let (watching, longest_ms, store) = (watching.clone(), longest_ms.clone(), store.clone());
        tokio::spawn(async move {
            while watching.load(Ordering::Relaxed) {
                let row = store
                    .db()
                    .query_one_raw(sea_orm::Statement::from_sql_and_values(
                        sea_orm::DbBackend::Postgres,
                        "SELECT COALESCE(MAX(EXTRACT(EPOCH FROM (now() - xact_start)) * 1000), 0)::bigint \
                         FROM pg_stat_activity WHERE datname = current_database() \
                         AND pid <> pg_backend_pid() AND backend_type = 'client backend' \
                         AND xact_start IS NOT NULL AND application_name <> $1",
                        [LISTENER_APPLICATION_NAME.into()],
                    ))
                    .await;
                if let Ok(Some(row)) = row {
                    let ms: i64 = row.try_get_by_index(0).unwrap_or(0);
                    longest_ms.fetch_max(ms, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    });
    let started = std::time::Instant::now();
    let (code, _, body) = bulk(
        &app,
        json!({"action": "cancel", "filter": filter}),
        Some("big"),
    )
    .await;
    let took = started.elapsed();
    watching.store(false, Ordering::Relaxed);
    if let Some(w) = watcher {
        w.await.unwrap();
    }
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["matched"], N as i64, "{body}");
    assert_eq!(body["done"], N as i64, "{body}");
    let (_, left) = app
        .operator_get(&format!(
            "/api/admin/sagas?experience={slug}&step=AI_PENDING"
        ))
        .await;
    assert!(left["sagas"].as_array().unwrap().is_empty(), "{left}");
    let longest = longest_ms.load(Ordering::Relaxed);
    eprintln!("bulk cancel of {N} sagas on {backend:?}: {took:?}; longest server transaction seen: {longest} ms");
    // Pages of short transactions: none lasts more than a small part of
    // the run (a page is 200 of the 10,000 aborts, a fiftieth). The bound
    // is relative, as a page's time grows with the machine's load.
    assert!(
        (longest as u128) < took.as_millis() / 5,
        "a transaction stayed open {longest} ms of a run of {took:?}"
    );
    app.stop().await;
}
db_test!(bulk_works_through_ten_thousand_sagas);
