//! The operators' review before the public screen, black box through HTTP
//! and WebSocket, on SQLite and on PostgreSQL: a result waits in IN_REVIEW
//! (no AI slot held, nothing on the display, the phone says it is being
//! checked), approve goes on to completion, reject ends it REVIEW_REJECTED
//! with the credits back and a neutral message; both are fenced and
//! idempotent, two operators at once decide once, the timeout acts on time
//! by itself, and an approved saga whose worker died is adopted again.

mod support;

use std::time::{Duration, Instant};

use futures_util::future::join;
use serde_json::{json, Value};
use support::{fast_sim, Backend, Socket, TestApp, OPERATOR};

const WITHIN: Duration = Duration::from_secs(20);

/// An experience whose results wait for review, with `extra` fields.
async fn review_experience(app: &TestApp, max_in_flight: i32, extra: Value) -> String {
    let slug = format!("rev-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let mut body = json!({
        "slug": slug, "title": "Reviewed booth", "kind": "image",
        "max_in_flight": max_in_flight, "review": "before_display",
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let resp = app
        .http
        .post(format!("{}/api/experiences", app.base))
        .bearer_auth(OPERATOR)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    slug
}

/// The items waiting in review, oldest first.
async fn review_items(app: &TestApp, query: &str) -> Vec<Value> {
    let (status, body) = app.operator_get(&format!("/api/admin/review{query}")).await;
    assert_eq!(status, 200, "{body}");
    body["items"].as_array().unwrap().clone()
}

/// Waits until `n` items wait in review.
async fn wait_in_review(app: &TestApp, n: usize) -> Vec<Value> {
    support::wait_for(WITHIN, || async {
        let items = review_items(app, "").await;
        (items.len() == n).then_some(items)
    })
    .await
    .unwrap_or_else(|| panic!("{n} items never waited in review"))
}

async fn credits_left(app: &TestApp, slug: &str) -> Value {
    let (_, body) = app.operator_get("/api/experiences").await;
    body["experiences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["slug"] == slug)
        .map(|e| e["credits"].clone())
        .unwrap()
}

/// Three results with one AI slot: all three reach review (a review holds
/// no slot), the display shows nothing until an operator decides, the
/// phone says the result is being checked. One is approved (completed, on
/// the display), one rejected (aborted REVIEW_REJECTED, credits back, no
/// content on the display), each decision fenced and idempotent; the
/// operators' socket announces each item as it arrives and leaves.
async fn only_approved_results_reach_the_display(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = review_experience(&app, 1, json!({"credits": 10})).await;
    let (terminal_id, terminal_token) = app.terminal(&slug).await;
    let mut operators = Socket::operators(app.port, OPERATOR).await.unwrap();
    let mut sessions = Vec::new();
    for name in ["ann", "bob", "cyd"] {
        let (sid, token) = app.session(&slug, Some(&terminal_id), name).await;
        let resp = app
            .submit(
                &sid,
                &token,
                json!({"prompt": format!("{name}'s cat")}),
                "k",
            )
            .await;
        assert_eq!(resp.status(), 202);
        sessions.push((sid, token));
        // One at a time, so the queue's order is known.
        wait_in_review(&app, sessions.len()).await;
    }
    let items = review_items(&app, &format!("?experience={slug}")).await;
    let names: Vec<&str> = items
        .iter()
        .map(|i| i["nickname"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ann", "bob", "cyd"], "oldest first");
    for item in &items {
        assert_eq!(item["experience"], slug.as_str());
        assert!(
            item["content"].is_array() || item["content"].is_object(),
            "{item}"
        );
        assert!(item["waiting_since"].is_string());
    }
    // Nothing running, nothing queued: no AI slot is held in review.
    let stats = app.sim.control.stats();
    assert_eq!(stats.jobs_created, 3, "{stats:?}");
    assert_eq!(credits_left(&app, &slug).await, 7);

    // The phone page says the result is being checked.
    let (ann, ann_token) = &sessions[0];
    let status = app.status(ann, ann_token).await;
    assert_eq!(status["status"], "SUBMITTING", "{status}");
    assert_eq!(status["step"], "IN_REVIEW", "{status}");
    assert!(
        status["message"].as_str().unwrap().contains("checked"),
        "{status}"
    );
    assert_eq!(status["result"], Value::Null);

    // The operators' socket announced each item.
    let mut added = Vec::new();
    while added.len() < 3 {
        let frame = operators
            .next_of_type("review.added", WITHIN)
            .await
            .expect("a review.added frame per item");
        added.push(frame["item"]["nickname"].as_str().unwrap().to_owned());
    }
    added.sort();
    assert_eq!(added, ["ann", "bob", "cyd"]);

    let ann_saga = items[0]["saga_id"].as_str().unwrap().to_owned();
    let bob_saga = items[1]["saga_id"].as_str().unwrap().to_owned();
    let approve = format!("/api/admin/sagas/{ann_saga}/approve");
    let reject = format!("/api/admin/sagas/{bob_saga}/reject");
    let (code, _, body) = app.operator_post(&approve, None).await;
    assert_eq!(code, 200, "{body}");
    let (code, _, body) = app.operator_post(&approve, None).await;
    assert_eq!(code, 200, "approving twice is success: {body}");
    let (code, _, body) = app
        .operator_post(&format!("/api/admin/sagas/{ann_saga}/reject"), None)
        .await;
    assert_eq!(code, 409, "reject after approve: {body}");
    assert_eq!(body["error"], "conflict", "{body}");
    let (ann, ann_token) = &sessions[0];
    let done = app.wait_final(ann, ann_token, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert!(done["result"]["content"].is_array(), "{done}");

    let (code, _, body) = app.operator_post(&reject, Some("r1")).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["saga"]["step"], "ABORTED");
    assert_eq!(body["saga"]["abort_reason"], "REVIEW_REJECTED");
    let (code, replayed, _) = app.operator_post(&reject, Some("r1")).await;
    assert_eq!((code, replayed), (200, true));
    let (code, replayed, body) = app.operator_post(&reject, None).await;
    assert_eq!(
        (code, replayed),
        (200, false),
        "rejecting twice is success: {body}"
    );
    let (code, _, body) = app
        .operator_post(&format!("/api/admin/sagas/{bob_saga}/approve"), None)
        .await;
    assert_eq!(code, 409, "approve after reject: {body}");

    let (bob, bob_token) = &sessions[1];
    let rejected = app.wait_final(bob, bob_token, WITHIN).await;
    assert_eq!(rejected["status"], "ABORTED");
    assert_eq!(rejected["abort_reason"], "REVIEW_REJECTED");
    // Bob's credit came back; ann's and cyd's stay spent.
    assert_eq!(credits_left(&app, &slug).await, 8);

    // The display: ann's result first (nothing of anyone was shown before
    // a decision), then bob's neutral abort without any content.
    let mut display = app.terminal_socket(&terminal_id, &terminal_token, 0).await;
    let first = display.next_session_event(WITHIN).await.unwrap();
    assert_eq!(first["type"], "session.completed", "{first}");
    assert_eq!(first["nickname"], "ann");
    let second = display.next_session_event(WITHIN).await.unwrap();
    assert_eq!(second["type"], "session.aborted", "{second}");
    assert_eq!(second["reason"], "REVIEW_REJECTED");
    assert_eq!(second["session_id"], bob.as_str());
    assert!(
        second.get("result").is_none() && second.get("content").is_none(),
        "{second}"
    );
    let message = second["message"].as_str().unwrap();
    assert!(!message.contains("cat"), "{message}");
    // Cyd waits still: the display has nothing more.
    let (cyd, cyd_token) = &sessions[2];
    assert_eq!(app.status(cyd, cyd_token).await["step"], "IN_REVIEW");
    assert_eq!(review_items(&app, "").await.len(), 1);

    // The operators' socket saw both leave.
    let mut removed = Vec::new();
    while removed.len() < 2 {
        let frame = operators
            .next_of_type("review.removed", WITHIN)
            .await
            .expect("a review.removed frame per decided item");
        removed.push(frame["saga_id"].as_str().unwrap().to_owned());
    }
    removed.sort();
    let mut expected = vec![ann_saga.clone(), bob_saga.clone()];
    expected.sort();
    assert_eq!(removed, expected);
    assert_eq!(app.sim.control.stats().jobs_created, 3, "no second AI job");
    app.stop().await;
}
db_test!(only_approved_results_reach_the_display);

/// Approve and reject fired at once at the same items: on each, exactly
/// one applies, the other is refused with 409, and the saga ends the way
/// the winner said.
async fn two_operators_at_once_decide_once(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = review_experience(&app, 10, json!({})).await;
    let mut sessions = Vec::new();
    for i in 0..6 {
        let (sid, token) = app.session(&slug, None, &format!("p{i}")).await;
        assert_eq!(
            app.submit(&sid, &token, json!({"prompt": "x"}), "k")
                .await
                .status(),
            202
        );
        sessions.push((sid, token));
    }
    let items = wait_in_review(&app, 6).await;
    for item in &items {
        let id = item["saga_id"].as_str().unwrap();
        let approve = format!("/api/admin/sagas/{id}/approve");
        let reject = format!("/api/admin/sagas/{id}/reject");
        let ((a, _, _), (r, _, _)) = join(
            app.operator_post(&approve, None),
            app.operator_post(&reject, None),
        )
        .await;
        let mut codes = [a, r];
        codes.sort();
        assert_eq!(codes, [200, 409], "approve {a}, reject {r}");
        let session = items
            .iter()
            .position(|i| i["saga_id"] == id)
            .map(|k| {
                &sessions[sessions
                    .iter()
                    .position(|(s, _)| *s == items[k]["session_id"])
                    .unwrap()]
            })
            .unwrap();
        let done = app.wait_final(&session.0, &session.1, WITHIN).await;
        if a == 200 {
            assert_eq!(done["status"], "COMPLETED", "{done}");
        } else {
            assert_eq!(done["abort_reason"], "REVIEW_REJECTED", "{done}");
        }
    }
    app.stop().await;
}
db_test!(two_operators_at_once_decide_once);

/// `review_timeout` decides by itself within about a second of running
/// out (the cleanup interval is an hour here, so it is not the cleanup):
/// `approve` completes, `reject` aborts REVIEW_REJECTED. The review actor
/// runs at its default period.
async fn the_review_timeout_decides_on_time(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let approving = review_experience(
        &app,
        5,
        json!({"review_timeout": "1s", "review_timeout_action": "approve"}),
    )
    .await;
    let rejecting = review_experience(&app, 5, json!({"review_timeout": "1s"})).await;
    let (_, body) = app.operator_get("/api/experiences").await;
    let shown = body["experiences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["slug"] == rejecting.as_str())
        .unwrap()
        .clone();
    assert_eq!(shown["review"], "before_display");
    assert_eq!(shown["review_timeout"], "1s");
    assert_eq!(
        shown["review_timeout_action"], "reject",
        "reject is the default action"
    );

    for (slug, expected) in [(&approving, "COMPLETED"), (&rejecting, "ABORTED")] {
        let (sid, token) = app.session(slug, None, "late").await;
        assert_eq!(
            app.submit(&sid, &token, json!({"prompt": "x"}), "k")
                .await
                .status(),
            202
        );
        let entered = support::wait_for(WITHIN, || async {
            (app.status(&sid, &token).await["step"] == "IN_REVIEW").then(Instant::now)
        })
        .await
        .expect("the result entered review");
        let done = app.wait_final(&sid, &token, WITHIN).await;
        let waited = entered.elapsed();
        assert_eq!(done["status"], expected, "{done}");
        if expected == "ABORTED" {
            assert_eq!(done["abort_reason"], "REVIEW_REJECTED");
        }
        // 1 s of timeout, and about a second more at most.
        assert!(
            waited < Duration::from_millis(3_500),
            "the timeout took {waited:?} to act"
        );
    }
    app.stop().await;
}
db_test!(the_review_timeout_decides_on_time);

/// An approved saga's adopter dies (here: the adoption is taken and
/// nobody runs it): its lease runs out and the review actor adopts it
/// again; it completes once, with one AI job.
async fn an_approved_saga_whose_adopter_died_is_adopted_again(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |c| c.lease = Duration::from_secs(1)).await;
    let slug = review_experience(&app, 5, json!({})).await;
    let (sid, token) = app.session(&slug, None, "orphan").await;
    assert_eq!(
        app.submit(&sid, &token, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    let items = wait_in_review(&app, 1).await;
    let saga_id = items[0]["saga_id"].as_str().unwrap().to_owned();
    // A dead adopter: the saga is approved and taken by a worker that
    // never runs it, before this instance's review actor sees it.
    let store = app.db.store().await;
    let now = chrono::Utc::now().timestamp_millis();
    store.approve(&saga_id, None, now).await.unwrap();
    let taken = store.adopt_approved(now, 1_000, 60_000, 10).await.unwrap();
    assert_eq!(taken.len(), 1, "the dead adopter took it");
    assert!(
        store
            .adopt_approved(now, 1_000, 60_000, 10)
            .await
            .unwrap()
            .is_empty(),
        "taken once"
    );
    let done = app.wait_final(&sid, &token, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(app.sim.control.stats().jobs_created, 1);
    app.stop().await;
}
db_test!(an_approved_saga_whose_adopter_died_is_adopted_again);

/// An approval that comes after the saga's deadline (a review queue that
/// waited longer than `SAGA_DEADLINE`), whose adopter renews its lease
/// while still in review, ranks the result and then dies: the result still
/// reaches the screen. The adopter's renewal is not refused as a lost
/// lease, and the adoption gives the saga a fresh deadline, so the saga
/// left at RANKING_DONE is resumed, never ended ORPHANED.
async fn an_approved_result_reaches_the_screen_after_a_late_approval_and_a_crash(backend: Backend) {
    use stagehand::store::transitions::SagaWrite;

    let app = TestApp::spawn_with(backend, fast_sim(), |c| {
        c.lease = Duration::from_secs(1);
        c.saga_deadline = Duration::from_secs(2);
        c.cleanup_interval = Duration::from_millis(200);
    })
    .await;
    let slug = review_experience(&app, 5, json!({})).await;
    let (sid, token) = app.session(&slug, None, "late").await;
    assert_eq!(
        app.submit(&sid, &token, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    let items = wait_in_review(&app, 1).await;
    let saga_id = items[0]["saga_id"].as_str().unwrap().to_owned();
    // The review outlasts the saga's deadline (the scenario itself).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let store = app.db.store().await;
    let now = chrono::Utc::now().timestamp_millis();
    store.approve(&saga_id, None, now).await.unwrap();
    // The adopter: it takes the saga, renews its lease while it ranks,
    // writes RANKING_DONE, and dies before completing.
    let taken = store
        .adopt_approved(now, 1_000, 2_000, 10)
        .await
        .unwrap()
        .remove(0);
    let adopter = taken.lock_token.clone().unwrap();
    store
        .renew_lease(&saga_id, &adopter, now + 100, 1_000)
        .await
        .expect("an adopted saga still in review renews its lease");
    let ranked = SagaWrite::RankingDone {
        saga_id: saga_id.clone(),
        token: adopter,
        entry: None,
        after_review: true,
    };
    let written = store
        .apply_saga_writes(&[ranked], now + 200, 1_000)
        .await
        .unwrap();
    assert!(written[0].is_ok(), "{:?}", written[0]);
    let done = app.wait_final(&sid, &token, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(app.sim.control.stats().jobs_created, 1);
    app.stop().await;
}
db_test!(an_approved_result_reaches_the_screen_after_a_late_approval_and_a_crash);

/// Review settings are checked: an unknown mode or action, a timeout that
/// is not a duration, or a timeout without review, is 422; an experience
/// without the field has review off.
async fn review_settings_are_validated(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    for (extra, why) in [
        (json!({"review": "sometimes"}), "review"),
        (
            json!({"review": "before_display", "review_timeout": "soon"}),
            "review_timeout",
        ),
        (
            json!({"review": "before_display", "review_timeout": "0s"}),
            "review_timeout",
        ),
        (
            json!({"review": "before_display", "review_timeout": "1m", "review_timeout_action": "shrug"}),
            "review_timeout_action",
        ),
        (json!({"review_timeout": "1m"}), "review_timeout"),
    ] {
        let mut body = json!({"slug": format!("v-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]), "title": "t", "kind": "image"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let resp = app
            .http
            .post(format!("{}/api/experiences", app.base))
            .bearer_auth(OPERATOR)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 422, "{extra}");
        let err: Value = resp.json().await.unwrap();
        assert!(err["message"].as_str().unwrap().contains(why), "{err}");
    }
    let plain = app.experience(5).await;
    let (_, body) = app.operator_get("/api/experiences").await;
    let shown = body["experiences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["slug"] == plain.as_str())
        .unwrap()
        .clone();
    assert_eq!(shown["review"], "off");
    assert_eq!(shown["review_timeout"], Value::Null);
    // A saga that never waited for review can be neither approved nor
    // rejected.
    let (sid, token) = app.session(&plain, None, "direct").await;
    assert_eq!(
        app.submit(&sid, &token, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    assert_eq!(
        app.wait_final(&sid, &token, WITHIN).await["status"],
        "COMPLETED"
    );
    let saga_id = app.saga_of(&sid).await["saga_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for action in ["approve", "reject"] {
        let (code, _, body) = app
            .operator_post(&format!("/api/admin/sagas/{saga_id}/{action}"), None)
            .await;
        assert_eq!(code, 409, "{action}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains("not in review"),
            "{body}"
        );
    }
    let (code, _, _) = app
        .operator_post(
            "/api/admin/sagas/00000000-0000-0000-0000-000000000000/approve",
            None,
        )
        .await;
    assert_eq!(code, 404);
    app.stop().await;
}
db_test!(review_settings_are_validated);

/// A result may wait in review far longer than a lease: the cleanup never
/// takes its session (SUBMITTING, with a saga that holds no lease) for a
/// stuck one, nor the saga for an orphan.
async fn the_cleanup_leaves_results_in_review_alone(backend: Backend) {
    let clock = stagehand::clock::ManualClock::new(1_800_000_000_000);
    let app = TestApp::spawn_with_clock(backend, fast_sim(), |_| {}, clock.clone()).await;
    let slug = review_experience(&app, 5, json!({})).await;
    let (sid, token) = app.session(&slug, None, "patient").await;
    assert_eq!(
        app.submit(&sid, &token, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    wait_in_review(&app, 1).await;
    // Ten minutes on: far past the cleanup's "stuck" age (one lease) since
    // the session last changed, and past the saga's deadline.
    clock.advance_ms(600_000);
    let report = app
        .app_cleanup
        .send(stagehand::actors::cleanup::RunCleanup)
        .await
        .unwrap();
    let status = app.status(&sid, &token).await;
    assert_eq!(status["step"], "IN_REVIEW", "{status} after {report:?}");
    assert_eq!(status["status"], "SUBMITTING", "{status}");
    assert_eq!(review_items(&app, "").await.len(), 1);
    app.stop().await;
}
db_test!(the_cleanup_leaves_results_in_review_alone);
