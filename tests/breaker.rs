//! The AI provider's circuit breaker, black box, on SQLite and on
//! PostgreSQL: a run of unavailability opens it and no AI work is claimed
//! until its cool-down is over; then one probe goes out (a failed probe
//! opens it again), and a provider that answers closes it and the saga
//! completes. Operators open and close it by hand. Only the probe's answer
//! closes it: a job that was already running succeeds without ending an
//! operator's pause or a cool-down.

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

/// Five sessions of a cap-1 experience whose jobs take `job`: the first job
/// is running when this returns; the others wait behind it.
async fn one_running_four_waiting(app: &TestApp, job: Duration) -> Vec<(String, String)> {
    app.sim.control.set_latency(job);
    let slug = app.experience(1).await;
    let mut sessions = Vec::new();
    for i in 0..5 {
        let (sid, tok) = app.session(&slug, None, &format!("held{i}")).await;
        assert_eq!(
            app.submit(&sid, &tok, json!({"prompt": "x"}), "k")
                .await
                .status(),
            202
        );
        sessions.push((sid, tok));
    }
    support::wait_for(WITHIN, || async {
        (app.sim.control.stats().jobs_created == 1).then_some(())
    })
    .await
    .expect("the first job runs");
    sessions
}

/// Waits until one of `sessions` is final (the job that was running has
/// answered and its success was recorded): that session.
async fn first_final(app: &TestApp, sessions: &[(String, String)]) -> Value {
    support::wait_for(WITHIN, || async {
        for (sid, tok) in sessions {
            let s = app.status(sid, tok).await;
            if s["status"] == "COMPLETED" || s["status"] == "ABORTED" {
                return Some(s);
            }
        }
        None
    })
    .await
    .expect("the running job ends")
}

/// After the running job's success: for `hold`, the breaker stays open
/// and the provider gets no other job. Panics with what gave way.
async fn holds(app: &TestApp, hold: Duration, what: &str) {
    let gave_way = support::wait_for(hold, || async {
        let b = breaker(app).await;
        let jobs = app.sim.control.stats().jobs_created;
        (b["state"] != "open" || jobs > 1).then_some((b, jobs))
    })
    .await;
    if let Some((b, jobs)) = gave_way {
        panic!("{what} gave way: breaker {b}, {jobs} jobs created at the provider");
    }
}

/// "Pause AI" while a job runs: the job's success (the provider answered)
/// does not close the breaker an operator opened; it stays open with the
/// operator's time and the provider gets no new job until an operator
/// closes it, and then the rest run.
async fn an_operators_pause_holds_when_a_running_job_succeeds(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let sessions = one_running_four_waiting(&app, Duration::from_millis(1_500)).await;

    let resp = app
        .http
        .post(format!("{}/api/admin/breaker/open", app.base))
        .bearer_auth(support::OPERATOR)
        .json(&json!({"for_seconds": 600}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let opened: Value = resp.json().await.unwrap();
    assert_eq!(opened["state"], "open", "{opened}");
    let open_until = millis(&opened["open_until"]);

    let done = first_final(&app, &sessions).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    holds(&app, Duration::from_secs(2), "the operator's pause").await;
    let b = breaker(&app).await;
    assert_eq!(millis(&b["open_until"]), open_until, "{b}");
    assert_eq!(
        (opened["opened_by"].as_str(), b["opened_by"].as_str()),
        (Some("operator"), Some("operator")),
        "{b}"
    );

    let (status, _, closed) = app.operator_post("/api/admin/breaker/close", None).await;
    assert_eq!((status, closed["state"].as_str()), (200, Some("closed")));
    for (sid, tok) in &sessions {
        let s = app.wait_final(sid, tok, WITHIN).await;
        assert_eq!(s["status"], "COMPLETED", "{s}");
    }
    app.stop().await;
}
db_test!(an_operators_pause_holds_when_a_running_job_succeeds);

/// The automatic breaker opens on a run of failed polls of a running job;
/// the provider then answers that job's poll, well inside the cool-down:
/// no probe was sent, so the breaker stays open and no new job goes out.
async fn only_its_probe_closes_the_automatic_breaker(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |config| {
        config.breaker_cool_down = Duration::from_secs(600);
    })
    .await;
    let sessions = one_running_four_waiting(&app, Duration::from_millis(1_500)).await;

    app.sim.control.set_poll_unavailable(true);
    let opened = support::wait_for(WITHIN, || async {
        let b = breaker(&app).await;
        (b["state"] == "open").then_some(b)
    })
    .await
    .expect("unavailable polls open the breaker");
    app.sim.control.set_poll_unavailable(false);

    let done = first_final(&app, &sessions).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    holds(&app, Duration::from_secs(2), "the cool-down").await;
    assert_eq!(opened["opened_by"], "unavailable", "{opened}");

    let (status, _, closed) = app.operator_post("/api/admin/breaker/close", None).await;
    assert_eq!((status, closed["state"].as_str()), (200, Some("closed")));
    for (sid, tok) in &sessions {
        let s = app.wait_final(sid, tok, WITHIN).await;
        assert_eq!(s["status"], "COMPLETED", "{s}");
    }
    app.stop().await;
}
db_test!(only_its_probe_closes_the_automatic_breaker);

/// An operator's pause for a second ends on its own: once its time is over
/// the probe goes out, the provider answers it, the breaker closes and the
/// held session completes.
async fn an_operators_pause_ends_with_its_time(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let resp = app
        .http
        .post(format!("{}/api/admin/breaker/open", app.base))
        .bearer_auth(support::OPERATOR)
        .json(&json!({"for_seconds": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let opened: Value = resp.json().await.unwrap();
    let open_until = millis(&opened["open_until"]);
    let slug = app.experience(5).await;
    let (sid, tok) = app.session(&slug, None, "paused").await;
    assert_eq!(
        app.submit(&sid, &tok, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    let done = app.wait_final(&sid, &tok, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert!(app.state.clock.now_ms() >= open_until);
    support::wait_for(WITHIN, || async {
        (breaker(&app).await["state"] == "closed").then_some(())
    })
    .await
    .expect("the probe's answer closes it");
    assert_eq!(app.sim.control.stats().jobs_created, 1);
    app.stop().await;
}
db_test!(an_operators_pause_ends_with_its_time);

/// A flaky provider: the answer to every create is lost (the job is made,
/// the connection dropped), and the same key asked again is answered. Ten
/// sessions at once, with the breaker's default cool-down (30 s): an
/// unclear create is settled by asking its key again, so the provider's
/// flakiness never keeps the breaker open by its own probe, and all ten
/// complete within 15 s with one job each.
async fn a_provider_that_drops_the_first_reply_of_every_job_is_not_down(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    app.sim.control.set_faults(stagehand::ai::SimFaults {
        drop_after_create: u64::MAX,
        ..Default::default()
    });
    let slug = app.experience(10).await;
    let mut sessions = Vec::new();
    for n in 0..10 {
        let (sid, tok) = app.session(&slug, None, &format!("guest {n}")).await;
        let resp = app
            .submit(&sid, &tok, json!({"prompt": "a cat"}), &format!("k{n}"))
            .await;
        assert_eq!(resp.status(), 202);
        sessions.push((sid, tok));
    }
    let started = std::time::Instant::now();
    let done =
        support::wait_all_final(&app.http, &app.base, &sessions, Duration::from_secs(15)).await;
    let done = match done {
        Ok(done) => done,
        Err(e) => panic!(
            "10 of 10 within 15 s: {e} after {:?}; breaker {}",
            started.elapsed(),
            breaker(&app).await
        ),
    };
    let completed = done.iter().filter(|s| s["status"] == "COMPLETED").count();
    assert_eq!(completed, 10, "{done:?}");
    let stats = app.sim.control.stats();
    assert_eq!(stats.jobs_created, 10, "one job each: {stats:?}");
    app.stop().await;
}
db_test!(a_provider_that_drops_the_first_reply_of_every_job_is_not_down);

/// The probe's answer is lost (the job is made, the connection dropped):
/// its key is asked again before the breaker decides, the provider
/// answers, and that answer closes the breaker. The session completes with
/// one job, long before a second cool-down (30 s, the default) could end.
async fn an_unclear_probe_is_settled_by_asking_its_key_again(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let resp = app
        .http
        .post(format!("{}/api/admin/breaker/open", app.base))
        .bearer_auth(support::OPERATOR)
        .json(&json!({"for_seconds": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    app.sim.control.set_faults(stagehand::ai::SimFaults {
        drop_after_create: 1,
        ..Default::default()
    });
    let slug = app.experience(5).await;
    let (sid, tok) = app.session(&slug, None, "probe").await;
    assert_eq!(
        app.submit(&sid, &tok, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    let done = app.wait_final(&sid, &tok, Duration::from_secs(10)).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let closed = support::wait_for(Duration::from_secs(5), || async {
        let b = breaker(&app).await;
        (b["state"] == "closed").then_some(b)
    })
    .await;
    assert!(
        closed.is_some(),
        "the retry's answer closed it: {}",
        breaker(&app).await
    );
    assert_eq!(app.sim.control.stats().jobs_created, 1, "one job");
    app.stop().await;
}
db_test!(an_unclear_probe_is_settled_by_asking_its_key_again);
