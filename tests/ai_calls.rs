//! AI calls that are never doubled, never run beyond the experience's cap
//! and always end (issue 8, "Holes found by reading the code"), black box
//! through HTTP against the built-in simulator with its faults switched on:
//! unclear submits (a dropped connection, a cut-short 2xx) make one job per
//! session; polls that fail while the jobs run never let the provider run
//! more than `max_in_flight`; AI_TIMEOUT fires while polls fail; and a
//! deadline that passes while the saga waits for the AI says AI_TIMEOUT.
//! On SQLite and on PostgreSQL.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use stagehand::actors::cleanup::RunCleanup;
use stagehand::ai::simulator::{SimConfig, SimFaults};
use stagehand::clock::{Clock, ManualClock};
use support::{fast_sim, wait_all_final, Backend, TestApp};

const WITHIN: Duration = Duration::from_secs(30);

/// Submits one prompt per session; returns the sessions and their saga ids.
async fn submit_all(
    app: &TestApp,
    slug: &str,
    prompts: &[String],
) -> (Vec<(String, String)>, Vec<String>) {
    let mut sessions = Vec::new();
    let mut sagas = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let (sid, ptok) = app.session(slug, None, &format!("p{i}")).await;
        let resp = app
            .submit(&sid, &ptok, json!({ "prompt": prompt }), &format!("k{i}"))
            .await;
        assert_eq!(resp.status(), 202);
        let body: Value = resp.json().await.expect("202 body");
        sagas.push(body["saga_id"].as_str().expect("saga_id").to_owned());
        sessions.push((sid, ptok));
    }
    (sessions, sagas)
}

async fn unclear_submits_make_one_job_per_session(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    app.sim.control.set_faults(SimFaults {
        drop_after_create: 4,
        cut_body_after_create: 4,
        ..SimFaults::default()
    });
    let slug = app.experience(3).await;
    let prompts: Vec<String> = (0..10).map(|i| format!("unclear #{i:02}#")).collect();
    let (sessions, sagas) = submit_all(&app, &slug, &prompts).await;

    let finals = wait_all_final(&app.http, &app.base, &sessions, WITHIN)
        .await
        .expect("every session ends");
    let stats = app.sim.control.stats();
    eprintln!(
        "[{backend:?}] unclear submits: {} sessions, jobs_created = {}, submits = {}, \
         unclear answers (dropped or cut short after creating the job) = {}, \
         max_concurrent_jobs = {}",
        sessions.len(),
        stats.jobs_created,
        stats.submits,
        stats.unclear_answers,
        stats.max_concurrent_jobs
    );
    for s in &finals {
        assert_eq!(s["status"], "COMPLETED", "{s}");
    }
    assert_eq!(stats.unclear_answers, 8, "every fault was used: {stats:?}");
    assert_eq!(stats.jobs_created, 10, "one job per session: {stats:?}");
    for prompt in &prompts {
        assert_eq!(app.sim.control.jobs_for_prompt(prompt), 1, "{prompt}");
    }
    // Each unclear submit was asked again: the same key found the same job.
    assert!(stats.submits >= 18, "{stats:?}");
    assert!(stats.max_concurrent_jobs <= 3, "{stats:?}");
    // Unclear is not an attempt: every saga ends on its first attempt.
    for saga_id in &sagas {
        let saga = app.state.store.saga(saga_id).await.unwrap().unwrap();
        assert_eq!(saga.attempts, 0, "saga {saga_id}");
        assert_eq!(saga.step, "COMPLETED");
    }
    app.stop().await;
}
db_test!(unclear_submits_make_one_job_per_session);

async fn failing_polls_never_let_the_provider_exceed_the_cap(backend: Backend) {
    let slow = SimConfig {
        latency: Duration::from_millis(1_500),
        ..fast_sim()
    };
    // The failing polls open the breaker; only its probe closes it again
    // (the running jobs' answers do not), after its cool-down: short here.
    let app = TestApp::spawn_with(backend, slow, |c| {
        c.breaker_cool_down = Duration::from_secs(1)
    })
    .await;
    app.sim.control.set_poll_unavailable(true);
    let slug = app.experience(2).await;
    let prompts: Vec<String> = (0..6).map(|i| format!("polled #{i}#")).collect();
    let (sessions, _) = submit_all(&app, &slug, &prompts).await;

    // Polls fail again and again while the two jobs run: their sagas keep
    // their slots, so nothing else starts.
    support::wait_for(WITHIN, || async {
        (app.sim.control.stats().refused >= 12).then_some(())
    })
    .await
    .expect("polls are refused");
    let stats = app.sim.control.stats();
    assert_eq!(stats.jobs_created, 2, "no job beyond the cap: {stats:?}");

    app.sim.control.set_poll_unavailable(false);
    let finals = wait_all_final(&app.http, &app.base, &sessions, WITHIN)
        .await
        .expect("every session ends");
    for s in &finals {
        assert_eq!(s["status"], "COMPLETED", "{s}");
    }
    let stats = app.sim.control.stats();
    eprintln!("[{backend:?}] polls unavailable, cap 2: {stats:?}");
    assert_eq!(stats.jobs_created, 6, "{stats:?}");
    assert!(
        stats.max_concurrent_jobs <= 2,
        "the provider ran more jobs than the cap: {stats:?}"
    );
    app.stop().await;
}
db_test!(failing_polls_never_let_the_provider_exceed_the_cap);

async fn ai_timeout_fires_while_polls_fail(backend: Backend) {
    let endless = SimConfig {
        latency: Duration::from_secs(3600),
        ..fast_sim()
    };
    let app = TestApp::spawn_with(backend, endless, |c| {
        c.ai_timeout = Duration::from_millis(400);
        c.max_attempts = 2;
        c.saga_deadline = Duration::from_secs(120);
    })
    .await;
    app.sim.control.set_poll_unavailable(true);
    let slug = app.experience(5).await;
    let (tid, ttok) = app.terminal(&slug).await;
    let mut socket = app.terminal_socket(&tid, &ttok, 0).await;
    let (sid, ptok) = app.session(&slug, Some(&tid), "tess").await;
    let started = std::time::Instant::now();
    let resp = app
        .submit(&sid, &ptok, json!({"prompt": "never answered"}), "k")
        .await;
    assert_eq!(resp.status(), 202);

    let s = app.wait_final(&sid, &ptok, WITHIN).await;
    assert_eq!(s["status"], "ABORTED", "{s}");
    assert_eq!(s["abort_reason"], "AI_TIMEOUT", "{s}");
    let frame = socket.next_session_event(WITHIN).await.expect("frame");
    assert_eq!(frame["reason"], "AI_TIMEOUT");
    // Two attempts of 400 ms, far from the two-minute deadline.
    assert!(started.elapsed() < Duration::from_secs(20));
    let stats = app.sim.control.stats();
    assert!(stats.refused >= 2, "the polls failed: {stats:?}");
    // The second attempt adopted the first one's job, which still runs.
    assert_eq!(stats.jobs_created, 1, "{stats:?}");
    app.stop().await;
}
db_test!(ai_timeout_fires_while_polls_fail);

async fn a_deadline_spent_waiting_for_the_ai_says_ai_timeout(backend: Backend) {
    let endless = SimConfig {
        latency: Duration::from_secs(3600),
        ..fast_sim()
    };
    let app = TestApp::spawn_with(backend, endless, |c| {
        c.ai_timeout = Duration::from_secs(60);
        c.saga_deadline = Duration::from_millis(1_500);
        // A saga released for backoff when its deadline passes is ended
        // by the cleanup actor.
        c.cleanup_interval = Duration::from_millis(300);
    })
    .await;
    let slug = app.experience(5).await;
    // One saga whose job runs and whose polls then fail...
    let (polled, polled_tok) = app.session(&slug, None, "uma").await;
    let resp = app
        .submit(&polled, &polled_tok, json!({"prompt": "slow"}), "k1")
        .await;
    assert_eq!(resp.status(), 202);
    support::wait_for(WITHIN, || async {
        (app.sim.control.stats().jobs_created == 1).then_some(())
    })
    .await
    .expect("the job is created");
    // ...and one the provider refuses outright (503), released for backoff
    // (its deadline passes unowned: the cleanup actor ends it).
    app.sim.control.set_down(true);
    let (refused, refused_tok) = app.session(&slug, None, "vic").await;
    let resp = app
        .submit(&refused, &refused_tok, json!({"prompt": "down"}), "k2")
        .await;
    assert_eq!(resp.status(), 202);

    for (sid, tok) in [(&polled, &polled_tok), (&refused, &refused_tok)] {
        let s = app.wait_final(sid, tok, WITHIN).await;
        assert_eq!(s["status"], "ABORTED", "{s}");
        assert_eq!(s["abort_reason"], "AI_TIMEOUT", "{s}");
    }
    app.stop().await;
}
db_test!(a_deadline_spent_waiting_for_the_ai_says_ai_timeout);

async fn cleanup_says_ai_timeout_for_a_lost_worker_waiting_for_the_ai(backend: Backend) {
    // The app runs on a clock that only moves when the test says so, and
    // its dispatcher is never woken: nobody runs the saga.
    let clock = ManualClock::new(1_800_000_000_000);
    let app = TestApp::spawn_with_clock(
        backend,
        fast_sim(),
        |c| {
            c.saga_deadline = Duration::from_secs(60);
            c.poll_interval = Duration::from_secs(3600);
        },
        clock.clone(),
    )
    .await;
    let slug = app.experience(5).await;
    let store = &app.state.store;
    let (sid, ptok) = app.session(&slug, None, "wes").await;
    let session = store.session(&sid).await.unwrap().unwrap();
    let submission = stagehand::store::submissions::Submission {
        photo_id: None,
        in_gallery: true,
        consent: false,
        prompt: "p".into(),
        score: None,
    };
    let saga = store
        .submit(&session, submission, 60_000, clock.now_ms())
        .await
        .unwrap();
    // A worker submitted the job, then died with the lease.
    let now = clock.now_ms();
    store
        .write_one(store.sql(
            "UPDATE sagas SET ai_job_id = 'job-lost', ai_submitted_at_ms = $1, \
             lock_token = 'dead-worker', locked_until_ms = $1 WHERE id = $2",
            vec![now.into(), saga.id.clone().into()],
        ))
        .await
        .unwrap();

    clock.advance_ms(61_000);
    let report = app.app_cleanup.send(RunCleanup).await.unwrap();
    assert_eq!(report.orphaned_sagas, 1);
    let s = app.status(&sid, &ptok).await;
    assert_eq!(s["status"], "ABORTED", "{s}");
    assert_eq!(s["abort_reason"], "AI_TIMEOUT", "{s}");
    app.stop().await;
}
db_test!(cleanup_says_ai_timeout_for_a_lost_worker_waiting_for_the_ai);

/// A poll answered 4xx (a provider that briefly lost track of the job)
/// does not abandon the job: it keeps its slot and is polled again, and
/// the saga ends with the one job. Before, such a poll counted an attempt
/// and cleared the job, and the next attempt made a second job beside the
/// one still running.
async fn a_refused_poll_keeps_polling_the_same_job(backend: Backend) {
    let app = TestApp::spawn_with(
        backend,
        SimConfig {
            latency: std::time::Duration::from_millis(600),
            ..support::fast_sim()
        },
        |_| {},
    )
    .await;
    app.sim.control.set_faults(SimFaults {
        poll_not_found: true,
        ..SimFaults::default()
    });
    let slug = app.experience(3).await;
    let (sessions, _) = submit_all(&app, &slug, &["briefly lost".to_owned()]).await;
    // Several polls answered 404 while the job runs on.
    let refused = support::wait_for(std::time::Duration::from_secs(5), || async {
        (app.sim.control.stats().polls >= 3).then_some(())
    })
    .await;
    assert!(refused.is_some(), "{:?}", app.sim.control.stats());
    app.sim.control.set_faults(SimFaults::default());
    let finals = wait_all_final(&app.http, &app.base, &sessions, WITHIN)
        .await
        .expect("the session ends");
    assert_eq!(finals[0]["status"], "COMPLETED", "{}", finals[0]);
    assert_eq!(
        app.sim.control.stats().jobs_created,
        1,
        "{:?}",
        app.sim.control.stats()
    );
    app.stop().await;
}
db_test!(a_refused_poll_keeps_polling_the_same_job);
