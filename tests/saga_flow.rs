//! Black-box tests of the whole flow through HTTP and the terminal socket:
//! the real application on a random port with a fresh database, the built-in
//! simulator as the AI provider. On SQLite and on PostgreSQL.

mod support;

use std::time::Duration;

use sea_orm::ConnectionTrait;
use serde_json::json;
use stagehand::actors::cleanup::{CleanupReport, RunCleanup};
use stagehand::ai::simulator::SimConfig;
use stagehand::clock::{Clock, ManualClock};
use support::{fast_sim, Backend, TestApp};

const WITHIN: Duration = Duration::from_secs(20);

async fn happy_path_reaches_the_terminal(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let (tid, ttok) = app.terminal(&slug).await;
    let mut socket = app.terminal_socket(&tid, &ttok, 0).await;
    let hello = socket.next_json(WITHIN).await.expect("hello");
    assert_eq!(hello["type"], "hello");
    assert_eq!(hello["terminal_id"], tid.as_str());
    assert_eq!(hello["last_seq"], 0);

    let (sid, ptok) = app.session(&slug, Some(&tid), "alice").await;
    let resp = app
        .submit(
            &sid,
            &ptok,
            json!({"prompt": "a cat on a skateboard", "score": 4200}),
            "k1",
        )
        .await;
    assert_eq!(resp.status(), 202);
    assert_eq!(
        resp.headers()["location"].to_str().unwrap(),
        format!("/api/sessions/{sid}")
    );
    let accepted: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(accepted["status"], "SUBMITTING");
    assert_eq!(accepted["step"], "AI_PENDING");
    assert!(accepted["saga_id"].is_string());

    let frame = socket
        .next_session_event(WITHIN)
        .await
        .expect("terminal frame");
    assert_eq!(frame["type"], "session.completed");
    assert_eq!(frame["session_id"], sid.as_str());
    assert_eq!(frame["nickname"], "alice");
    assert_eq!(frame["seq"], 1);
    assert_eq!(frame["score"], 4200.0);
    assert_eq!(frame["rank"], 1);
    assert!(!frame["result"]["content"].as_array().unwrap().is_empty());

    let s = app.status(&sid, &ptok).await;
    assert_eq!(s["status"], "COMPLETED");
    assert_eq!(s["step"], "COMPLETED");
    assert_eq!(s["experience"], slug.as_str());
    assert_eq!(s["result"]["rank"], 1);
    assert_eq!(s["result"]["score"], 4200.0);
    assert!(s["result"]["content"][0]["url"].is_string());

    let ranking = app
        .get_json(&format!("/api/experiences/{slug}/ranking?limit=5"))
        .await;
    assert_eq!(
        ranking["entries"],
        json!([{"rank": 1, "nickname": "alice", "score": 4200.0, "session_id": sid}])
    );
    assert_eq!(app.sim.control.stats().jobs_created, 1);

    // A display that reconnects with after=0 gets the event again; with the
    // last seen seq it gets nothing old.
    let mut again = app.terminal_socket(&tid, &ttok, 0).await;
    assert_eq!(again.next_json(WITHIN).await.unwrap()["last_seq"], 1);
    assert_eq!(again.next_session_event(WITHIN).await.unwrap()["seq"], 1);
    let mut caught_up = app.terminal_socket(&tid, &ttok, 1).await;
    caught_up.next_json(WITHIN).await.expect("hello");
    assert!(caught_up
        .next_session_event(Duration::from_millis(300))
        .await
        .is_none());
    app.stop().await;
}
db_test!(happy_path_reaches_the_terminal);

async fn moderation_rejection_reaches_the_terminal(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let (tid, ttok) = app.terminal(&slug).await;
    let mut socket = app.terminal_socket(&tid, &ttok, 0).await;
    let (sid, ptok) = app.session(&slug, Some(&tid), "bob").await;
    let resp = app
        .submit(
            &sid,
            &ptok,
            json!({"prompt": "something FORBIDDEN here"}),
            "k",
        )
        .await;
    assert_eq!(resp.status(), 202);
    let frame = socket.next_session_event(WITHIN).await.expect("frame");
    assert_eq!(frame["type"], "session.rejected");
    assert_eq!(frame["reason"], "INPUT_REJECTED");
    assert!(frame["message"]
        .as_str()
        .unwrap()
        .starts_with("blocked: inappropriate input"));
    let s = app.status(&sid, &ptok).await;
    assert_eq!(s["status"], "ABORTED");
    assert_eq!(s["abort_reason"], "INPUT_REJECTED");
    assert_eq!(app.sim.control.stats().jobs_created, 0);

    // An aborted session accepts a new submission.
    let resp = app
        .submit(&sid, &ptok, json!({"prompt": "a kind prompt"}), "k2")
        .await;
    assert_eq!(resp.status(), 202);
    assert_eq!(
        app.wait_final(&sid, &ptok, WITHIN).await["status"],
        "COMPLETED"
    );
    app.stop().await;
}
db_test!(moderation_rejection_reaches_the_terminal);

async fn ai_down_counts_no_attempt_and_finishes_when_back(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |c| c.max_attempts = 1).await;
    app.sim.control.set_down(true);
    let slug = app.experience(5).await;
    let (sid, ptok) = app.session(&slug, None, "carol").await;
    let resp = app
        .submit(&sid, &ptok, json!({"prompt": "down"}), "k")
        .await;
    assert_eq!(resp.status(), 202);
    let saga_id = resp.json::<serde_json::Value>().await.unwrap()["saga_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Several refused submits while down: none counts as an attempt (with
    // MAX_ATTEMPTS=1 a counted one would abort the saga).
    support::wait_for(WITHIN, || async {
        (app.sim.control.stats().refused >= 3).then_some(())
    })
    .await
    .expect("the saga keeps trying while the AI is down");
    let saga = app.state.store.saga(&saga_id).await.unwrap().unwrap();
    assert_eq!(saga.attempts, 0);
    assert_eq!(saga.step, "AI_PENDING");
    // A 503 to a create is unclear (the job may have been made): the saga
    // waits with its key, and its slot stays in the ledger meanwhile.
    assert_eq!(app.state.store.ledger_rows().await.unwrap(), 1);
    assert_eq!(app.status(&sid, &ptok).await["status"], "SUBMITTING");

    app.sim.control.set_down(false);
    let s = app.wait_final(&sid, &ptok, WITHIN).await;
    assert_eq!(s["status"], "COMPLETED", "{s}");
    assert_eq!(app.sim.control.stats().jobs_created, 1);
    app.stop().await;
}
db_test!(ai_down_counts_no_attempt_and_finishes_when_back);

async fn ai_timeout_counts_and_aborts_after_max_attempts(backend: Backend) {
    let slow = SimConfig {
        latency: Duration::from_secs(3600),
        ..fast_sim()
    };
    let app = TestApp::spawn_with(backend, slow, |c| {
        c.ai_timeout = Duration::from_millis(300);
        c.max_attempts = 2;
    })
    .await;
    let slug = app.experience(5).await;
    let (tid, ttok) = app.terminal(&slug).await;
    let mut socket = app.terminal_socket(&tid, &ttok, 0).await;
    let (sid, ptok) = app.session(&slug, Some(&tid), "dave").await;
    assert_eq!(
        app.submit(&sid, &ptok, json!({"prompt": "slow"}), "k")
            .await
            .status(),
        202
    );
    let frame = socket.next_session_event(WITHIN).await.expect("frame");
    assert_eq!(frame["type"], "session.aborted");
    assert_eq!(frame["reason"], "AI_TIMEOUT");
    let s = app.status(&sid, &ptok).await;
    assert_eq!(s["abort_reason"], "AI_TIMEOUT");
    // The timed-out job may still be running, so the second attempt adopts
    // it by id instead of starting another beside it (rule 10): one job.
    assert_eq!(app.sim.control.stats().jobs_created, 1);
    app.stop().await;
}
db_test!(ai_timeout_counts_and_aborts_after_max_attempts);

async fn failed_jobs_are_retried_then_abort_ai_failed(backend: Backend) {
    let failing = SimConfig {
        fail_rate: 1.0,
        ..fast_sim()
    };
    let app = TestApp::spawn_with(backend, failing, |c| c.max_attempts = 3).await;
    let slug = app.experience(5).await;
    let (sid, ptok) = app.session(&slug, None, "erin").await;
    assert_eq!(
        app.submit(&sid, &ptok, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    let s = app.wait_final(&sid, &ptok, WITHIN).await;
    assert_eq!(s["abort_reason"], "AI_FAILED");
    assert_eq!(app.sim.control.stats().jobs_created, 3);
    app.stop().await;
}
db_test!(failed_jobs_are_retried_then_abort_ai_failed);

async fn cleanup_aborts_orphans_and_stuck_sessions_and_tells_the_terminal(backend: Backend) {
    // The app runs on a clock that only moves when the test says so.
    let clock = ManualClock::new(1_800_000_000_000);
    let app = TestApp::spawn_with_clock(
        backend,
        fast_sim(),
        |c| {
            c.saga_deadline = Duration::from_secs(60);
            // The dispatcher makes its first round at start and then only
            // when woken; this test never wakes it.
            c.poll_interval = Duration::from_secs(3600);
        },
        clock.clone(),
    )
    .await;
    let slug = app.experience(5).await;
    let (tid, ttok) = app.terminal(&slug).await;
    let mut socket = app.terminal_socket(&tid, &ttok, 0).await;
    let store = &app.state.store;
    // The dispatcher's start-up round may still be running: with the
    // provider's breaker open it claims no AI work, so nobody asks the AI
    // for this saga (else its end would rightly say AI_TIMEOUT).
    let opened = app
        .http
        .post(format!("{}/api/admin/breaker/open", app.base))
        .bearer_auth(support::OPERATOR)
        .json(&json!({"for_seconds": 86_400}))
        .send()
        .await
        .unwrap();
    assert_eq!(opened.status(), 200);

    // A saga nobody runs (no dispatcher round takes it).
    let (sid, ptok) = app.session(&slug, Some(&tid), "fay").await;
    let session = store.session(&sid).await.unwrap().unwrap();
    let submission = stagehand::store::submissions::Submission {
        photo_id: None,
        in_gallery: true,
        consent: false,
        prompt: "p".into(),
        score: None,
    };
    store
        .submit(&session, submission, 60_000, clock.now_ms())
        .await
        .unwrap();
    // A session stuck in SUBMITTING without any saga (as after restoring a
    // partial backup).
    let (sid2, ptok2) = app.session(&slug, Some(&tid), "gus").await;
    store
        .write_one(store.sql(
            "UPDATE sessions SET status = 'SUBMITTING', updated_at_ms = $1 WHERE id = $2",
            vec![clock.now_ms().into(), sid2.clone().into()],
        ))
        .await
        .unwrap();

    // Before the deadline and the lease-long grace nothing is touched.
    clock.advance_ms(1_000);
    assert_eq!(
        app.app_cleanup.send(RunCleanup).await.unwrap(),
        CleanupReport::default()
    );
    assert_eq!(app.status(&sid, &ptok).await["status"], "SUBMITTING");

    clock.advance_ms(60_000);
    let report = app.app_cleanup.send(RunCleanup).await.unwrap();
    assert_eq!(report.orphaned_sagas, 1);
    assert_eq!(report.stuck_sessions, 1);

    let mut frames = vec![
        socket.next_session_event(WITHIN).await.expect("first"),
        socket.next_session_event(WITHIN).await.expect("second"),
    ];
    frames.sort_by_key(|f| f["seq"].as_i64());
    for f in &frames {
        assert_eq!(f["type"], "session.aborted");
        assert_eq!(f["reason"], "ORPHANED");
    }
    let ids: Vec<_> = frames
        .iter()
        .map(|f| f["session_id"].as_str().unwrap().to_owned())
        .collect();
    assert!(ids.contains(&sid) && ids.contains(&sid2));
    assert_eq!(app.status(&sid, &ptok).await["abort_reason"], "ORPHANED");
    assert_eq!(app.status(&sid2, &ptok2).await["status"], "ABORTED");
    // A second round finds nothing left.
    assert_eq!(
        app.app_cleanup
            .send(RunCleanup)
            .await
            .unwrap()
            .orphaned_sagas,
        0
    );
    app.stop().await;
}
db_test!(cleanup_aborts_orphans_and_stuck_sessions_and_tells_the_terminal);

async fn capacity_cap_holds_end_to_end(backend: Backend) {
    let sim = SimConfig {
        latency: Duration::from_millis(300),
        ..fast_sim()
    };
    let app = TestApp::spawn_with(backend, sim, |_| {}).await;
    let slug = app.experience(2).await;
    let mut sessions = Vec::new();
    for i in 0..6 {
        let (sid, ptok) = app.session(&slug, None, &format!("p{i}")).await;
        assert_eq!(
            app.submit(&sid, &ptok, json!({"prompt": format!("job {i}")}), "k")
                .await
                .status(),
            202
        );
        sessions.push((sid, ptok));
    }
    for (sid, ptok) in &sessions {
        assert_eq!(
            app.wait_final(sid, ptok, WITHIN).await["status"],
            "COMPLETED"
        );
    }
    let stats = app.sim.control.stats();
    assert_eq!(stats.jobs_created, 6);
    assert!(stats.max_concurrent_jobs <= 2, "{stats:?}");
    app.stop().await;
}
db_test!(capacity_cap_holds_end_to_end);

/// A claim that fails for one experience (here a trigger refuses every
/// update of its sagas) does not hold up the others: the round goes on,
/// and what it claimed for them runs. Once the fault is gone, the refused
/// experience's saga runs too.
async fn a_claim_failing_for_one_experience_does_not_stop_the_others(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    // Experiences are visited oldest first: the failing one comes first.
    let failing = app.experience(5).await;
    let healthy = app.experience(5).await;
    let failing_id = app
        .state
        .store
        .experience_by_slug(&failing)
        .await
        .unwrap()
        .unwrap()
        .id;
    let db = app.state.store.db();
    let install = match backend {
        Backend::Postgres => vec![
            "CREATE FUNCTION refuse_claim() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'injected claim failure'; END $$"
                .to_owned(),
            format!(
                "CREATE TRIGGER refuse_claim BEFORE UPDATE ON sagas FOR EACH ROW \
                 WHEN (NEW.experience_id = '{failing_id}') EXECUTE FUNCTION refuse_claim()"
            ),
        ],
        Backend::Sqlite => vec![format!(
            "CREATE TRIGGER refuse_claim BEFORE UPDATE ON sagas FOR EACH ROW \
             WHEN NEW.experience_id = '{failing_id}' \
             BEGIN SELECT RAISE(ABORT, 'injected claim failure'); END"
        )],
    };
    for sql in install {
        db.execute_unprepared(&sql).await.expect("install trigger");
    }

    let (bad_sid, bad_tok) = app.session(&failing, None, "refused").await;
    let (good_sid, good_tok) = app.session(&healthy, None, "fine").await;
    for (sid, tok) in [(&bad_sid, &bad_tok), (&good_sid, &good_tok)] {
        let resp = app.submit(sid, tok, json!({"prompt": "a cat"}), "k").await;
        assert_eq!(resp.status(), 202);
    }
    let good = app.wait_final(&good_sid, &good_tok, WITHIN).await;
    assert_eq!(good["status"], "COMPLETED", "{good}");
    let bad = app.status(&bad_sid, &bad_tok).await;
    assert_eq!(
        bad["status"], "SUBMITTING",
        "the refused claim left it queued: {bad}"
    );

    let drop = match backend {
        Backend::Postgres => "DROP TRIGGER refuse_claim ON sagas",
        Backend::Sqlite => "DROP TRIGGER refuse_claim",
    };
    db.execute_unprepared(drop).await.expect("drop trigger");
    let bad = app.wait_final(&bad_sid, &bad_tok, WITHIN).await;
    assert_eq!(bad["status"], "COMPLETED", "{bad}");
    app.stop().await;
}
db_test!(a_claim_failing_for_one_experience_does_not_stop_the_others);
