//! The AI provider's circuit breaker, black box, on SQLite and on
//! PostgreSQL: a run of unavailability opens it and no AI work is claimed
//! until its cool-down is over; then one probe goes out (a failed probe
//! opens it again), and a provider that answers closes it and the saga
//! completes. Operators open and close it by hand.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{fast_sim, Backend, TestApp};

const WITHIN: Duration = Duration::from_secs(20);

async fn breaker(app: &TestApp) -> Value {
    let (status, body) = app.operator_get("/api/admin/breaker").await;
    assert_eq!(status, 200, "{body}");
    body
}

fn millis(rfc3339: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339.as_str().unwrap())
        .unwrap()
        .timestamp_millis()
}

/// The provider is down: after five unavailable answers the breaker opens,
/// and the provider hears nothing more until the cool-down is over. The
/// probe fails (still down) and opens it again; once the provider is back
/// the next probe closes it and the session completes.
async fn unavailability_opens_the_breaker_and_a_probe_closes_it(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |config| {
        config.breaker_cool_down = Duration::from_millis(1_500);
    })
    .await;
    assert_eq!(breaker(&app).await["state"], "closed");
    app.sim.control.set_down(true);
    let slug = app.experience(5).await;
    let (sid, tok) = app.session(&slug, None, "probe").await;
    assert_eq!(
        app.submit(&sid, &tok, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );

    let open = support::wait_for(WITHIN, || async {
        let b = breaker(&app).await;
        (b["state"] == "open").then_some(b)
    })
    .await
    .expect("the breaker opens after a run of unavailability");
    let refused_when_opened = app.sim.control.stats().refused;
    assert!(refused_when_opened >= 5, "{refused_when_opened}");
    let open_until = millis(&open["open_until"]);

    // The next call the provider hears is the probe, after the cool-down.
    support::wait_for(WITHIN, || async {
        (app.sim.control.stats().refused > refused_when_opened).then_some(())
    })
    .await
    .expect("a probe after the cool-down");
    let heard_at = app.state.clock.now_ms();
    assert!(
        heard_at >= open_until,
        "the provider was called {} ms before the cool-down ended",
        open_until - heard_at
    );
    // The probe failed: open again.
    support::wait_for(WITHIN, || async {
        let b = breaker(&app).await;
        (b["state"] == "open" && millis(&b["open_until"]) > open_until).then_some(())
    })
    .await
    .expect("a failed probe opens the breaker again");

    app.sim.control.set_down(false);
    let done = app.wait_final(&sid, &tok, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    support::wait_for(WITHIN, || async {
        (breaker(&app).await["state"] == "closed").then_some(())
    })
    .await
    .expect("the provider answered: closed");
    app.stop().await;
}
db_test!(unavailability_opens_the_breaker_and_a_probe_closes_it);

/// Opened by hand, the breaker holds back new work (the provider gets no
/// job); closed by hand, the work starts at once.
async fn operators_open_and_close_it(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (status, _, opened) = app.operator_post("/api/admin/breaker/open", None).await;
    assert_eq!(status, 200, "{opened}");
    assert_eq!(opened["state"], "open");
    let slug = app.experience(5).await;
    let (sid, tok) = app.session(&slug, None, "held").await;
    assert_eq!(
        app.submit(&sid, &tok, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    // Held back: no job within a second (the dispatcher was woken by the
    // submission and polls every 200 ms here).
    let job = support::wait_for(Duration::from_secs(1), || async {
        (app.sim.control.stats().jobs_created > 0).then_some(())
    })
    .await;
    assert!(
        job.is_none(),
        "a job was created while the breaker was open"
    );
    assert_eq!(app.status(&sid, &tok).await["step"], "AI_PENDING");

    let (status, _, closed) = app.operator_post("/api/admin/breaker/close", None).await;
    assert_eq!((status, closed["state"].as_str()), (200, Some("closed")));
    let done = app.wait_final(&sid, &tok, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED");

    let resp = app
        .http
        .post(format!("{}/api/admin/breaker/open", app.base))
        .bearer_auth(support::OPERATOR)
        .json(&json!({"for_seconds": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);
    let anonymous = app
        .http
        .get(format!("{}/api/admin/breaker", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    app.stop().await;
}
db_test!(operators_open_and_close_it);
