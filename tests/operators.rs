//! The operators' side, black box through HTTP and WebSocket: the saga list
//! (filters, pages, errors), cancel and retry (fenced, idempotent, 409 when
//! the saga's state does not allow them), and the live `stats` and `saga`
//! frames of the operators' socket. On
//! SQLite and on PostgreSQL.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};
use stagehand::ai::simulator::SimConfig;
use stagehand::config::Config;
use support::{fast_sim, Backend, Socket, TestApp, OPERATOR};

const WITHIN: Duration = Duration::from_secs(20);

/// Five sessions, two of them refused by moderation: the list filters by
/// step, reason and experience, pages by cursor without repeats or gaps, and
/// refuses bad input and missing tokens.
async fn the_saga_list_filters_and_pages(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let other = app.experience(5).await;
    let mut sessions = Vec::new();
    for (i, prompt) in ["a cat", "forbidden 1", "a dog", "forbidden 2", "a fox"]
        .iter()
        .enumerate()
    {
        let (sid, tok) = app.session(&slug, None, &format!("p{i}")).await;
        let resp = app.submit(&sid, &tok, json!({"prompt": prompt}), "k").await;
        assert_eq!(resp.status(), 202);
        sessions.push((sid, tok));
    }
    let (sid, tok) = app.session(&other, None, "elsewhere").await;
    assert_eq!(
        app.submit(&sid, &tok, json!({"prompt": "x"}), "k")
            .await
            .status(),
        202
    );
    sessions.push((sid, tok));
    support::wait_all_final(&app.http, &app.base, &sessions, WITHIN)
        .await
        .unwrap();

    let (status, all) = app.operator_get("/api/admin/sagas").await;
    assert_eq!(status, 200);
    assert_eq!(all["sagas"].as_array().unwrap().len(), 6);
    assert_eq!(all["next_cursor"], Value::Null);

    let (_, rejected) = app
        .operator_get("/api/admin/sagas?step=ABORTED&reason=INPUT_REJECTED")
        .await;
    let mut nicknames: Vec<&str> = rejected["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["nickname"].as_str().unwrap())
        .collect();
    nicknames.sort();
    assert_eq!(nicknames, vec!["p1", "p3"]);
    for saga in rejected["sagas"].as_array().unwrap() {
        assert_eq!(saga["step"], "ABORTED");
        assert_eq!(saga["abort_reason"], "INPUT_REJECTED");
        assert_eq!(saga["experience"], slug.as_str());
        assert_eq!(saga["stuck"], false);
    }

    let (_, completed_here) = app
        .operator_get(&format!(
            "/api/admin/sagas?step=COMPLETED&experience={slug}"
        ))
        .await;
    assert_eq!(completed_here["sagas"].as_array().unwrap().len(), 3);

    // Pages of 2: 6 sagas in 3 pages, each once, newest change first.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/admin/sagas?limit=2&cursor={c}"),
            None => "/api/admin/sagas?limit=2".to_owned(),
        };
        let (status, page) = app.operator_get(&path).await;
        assert_eq!(status, 200, "{page}");
        pages += 1;
        for saga in page["sagas"].as_array().unwrap() {
            seen.push((
                saga["updated_at"].as_str().unwrap().to_owned(),
                saga["saga_id"].as_str().unwrap().to_owned(),
            ));
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
        assert!(pages < 10, "the cursor does not advance");
    }
    assert_eq!(
        seen.len(),
        6,
        "every saga exactly once across pages: {seen:?}"
    );
    let mut ids: Vec<_> = seen.iter().map(|(_, id)| id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 6);
    assert!(
        seen.windows(2).all(|w| w[0] >= w[1]),
        "newest change first: {seen:?}"
    );

    for bad in [
        "/api/admin/sagas?step=DANCING",
        "/api/admin/sagas?reason=BORED",
        "/api/admin/sagas?limit=0",
        "/api/admin/sagas?limit=501",
        "/api/admin/sagas?cursor=nonsense",
    ] {
        let (status, body) = app.operator_get(bad).await;
        assert_eq!(status, 422, "{bad}: {body}");
        assert_eq!(body["error"], "validation_failed");
    }
    let anonymous = app
        .http
        .get(format!("{}/api/admin/sagas", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    app.stop().await;
}
db_test!(the_saga_list_filters_and_pages);

/// A saga waiting on a long AI job is cancelled: it ends ABORTED with
/// CANCELLED, the participant reads it, and the booth display is told.
/// Asking again is 200 (with a key: the first answer, replayed); a
/// cancel of a COMPLETED saga is 409 saying why.
async fn cancel_aborts_a_running_saga_and_tells_the_terminal(backend: Backend) {
    let sim = SimConfig {
        latency: Duration::from_secs(600),
        ..fast_sim()
    };
    let app = TestApp::spawn_with(backend, sim, |_| {}).await;
    let slug = app.experience(5).await;
    let (terminal_id, terminal_token) = app.terminal(&slug).await;
    let mut display = app.terminal_socket(&terminal_id, &terminal_token, 0).await;
    assert_eq!(
        display.next_json(WITHIN).await.expect("hello")["type"],
        "hello"
    );
    let (sid, tok) = app.session(&slug, Some(&terminal_id), "carol").await;
    assert_eq!(
        app.submit(&sid, &tok, json!({"prompt": "slow"}), "k")
            .await
            .status(),
        202
    );
    // Wait until a worker holds it, with the AI job submitted.
    support::wait_for(WITHIN, || async {
        (app.sim.control.stats().submits > 0).then_some(())
    })
    .await
    .expect("the AI job was submitted");
    let saga = app.saga_of(&sid).await;
    assert_eq!(saga["step"], "AI_PENDING");
    let saga_id = saga["saga_id"].as_str().unwrap().to_owned();
    let cancel = format!("/api/admin/sagas/{saga_id}/cancel");

    let (status, replayed, body) = app.operator_post(&cancel, Some("cancel-1")).await;
    assert_eq!(status, 200, "{body}");
    assert!(!replayed);
    assert_eq!(body["saga"]["step"], "ABORTED");
    assert_eq!(body["saga"]["abort_reason"], "CANCELLED");

    let event = display
        .next_session_event(WITHIN)
        .await
        .expect("the display is told");
    assert_eq!(event["type"], "session.aborted");
    assert_eq!(event["session_id"], sid.as_str());
    assert_eq!(event["reason"], "CANCELLED");
    assert!(event["message"].as_str().is_some_and(|m| !m.is_empty()));
    let session = app.status(&sid, &tok).await;
    assert_eq!(session["status"], "ABORTED");
    assert_eq!(session["abort_reason"], "CANCELLED");

    let (status, replayed, again) = app.operator_post(&cancel, Some("cancel-1")).await;
    assert_eq!((status, replayed), (200, true), "{again}");
    assert_eq!(again, body);
    let (status, _, _) = app.operator_post(&cancel, None).await;
    assert_eq!(status, 200, "cancelling a cancelled saga again is no error");
    // A retry is another endpoint: the same key is a new request there.
    let (status, replayed, _) = app
        .operator_post(
            &format!("/api/admin/sagas/{saga_id}/retry"),
            Some("cancel-1"),
        )
        .await;
    assert_eq!((status, replayed), (200, false));

    // A completed saga cannot be cancelled.
    app.sim.control.set_latency(Duration::from_millis(50));
    let (sid2, tok2) = app.session(&slug, None, "dave").await;
    assert_eq!(
        app.submit(&sid2, &tok2, json!({"prompt": "quick"}), "k")
            .await
            .status(),
        202
    );
    assert_eq!(
        app.wait_final(&sid2, &tok2, WITHIN).await["status"],
        "COMPLETED"
    );
    let done = app.saga_of(&sid2).await;
    let (status, _, refused) = app
        .operator_post(
            &format!(
                "/api/admin/sagas/{}/cancel",
                done["saga_id"].as_str().unwrap()
            ),
            None,
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"], "conflict");
    assert!(
        refused["message"].as_str().unwrap().contains("COMPLETED"),
        "says why: {refused}"
    );
    let (status, _, _) = app
        .operator_post("/api/admin/sagas/nope/cancel", None)
        .await;
    assert_eq!(status, 404);
    let (status, _, _) = app.operator_post("/api/admin/sagas/nope/retry", None).await;
    assert_eq!(status, 404);
    app.stop().await;
}
db_test!(cancel_aborts_a_running_saga_and_tells_the_terminal);

/// A saga aborted with AI_FAILED (the provider failed every attempt) is
/// retried once the provider is fixed: it runs again with fresh attempts
/// and completes. Two retries fired at once: exactly one runs, the other is
/// 409. A retry of a COMPLETED saga is 409.
async fn retry_runs_an_aborted_saga_again(backend: Backend) {
    let sim = SimConfig {
        fail_rate: 1.0,
        ..fast_sim()
    };
    let app = TestApp::spawn_with(backend, sim, |config| {
        config.max_attempts = 2;
    })
    .await;
    let slug = app.experience(5).await;
    let (sid, tok) = app.session(&slug, None, "erin").await;
    assert_eq!(
        app.submit(&sid, &tok, json!({"prompt": "x", "score": 42}), "k")
            .await
            .status(),
        202
    );
    let failed = app.wait_final(&sid, &tok, WITHIN).await;
    assert_eq!(failed["abort_reason"], "AI_FAILED", "{failed}");
    let saga = app.saga_of(&sid).await;
    assert!(saga["attempts"].as_i64().unwrap() >= 1, "{saga}");
    let saga_id = saga["saga_id"].as_str().unwrap().to_owned();
    let retry = format!("/api/admin/sagas/{saga_id}/retry");

    app.sim.control.set_fail_rate(0.0);
    let answers = join_all((0..2).map(|_| app.operator_post(&retry, None))).await;
    let mut statuses: Vec<u16> = answers.iter().map(|(s, _, _)| *s).collect();
    statuses.sort();
    assert_eq!(statuses, vec![200, 409], "{answers:?}");
    let (_, _, ran) = answers.iter().find(|(s, _, _)| *s == 200).unwrap();
    assert_eq!(ran["saga"]["abort_reason"], Value::Null);
    assert_eq!(ran["saga"]["attempts"], 0, "fresh attempts");

    let done = app.wait_final(&sid, &tok, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let ranking = app
        .get_json(&format!("/api/experiences/{slug}/ranking"))
        .await;
    assert_eq!(ranking["entries"].as_array().unwrap().len(), 1);
    assert_eq!(ranking["entries"][0]["nickname"], "erin");

    let (status, _, refused) = app.operator_post(&retry, None).await;
    assert_eq!(status, 409);
    assert!(
        refused["message"].as_str().unwrap().contains("COMPLETED")
            || refused["message"].as_str().unwrap().contains("ABORTED"),
        "says why: {refused}"
    );
    app.stop().await;
}
db_test!(retry_runs_an_aborted_saga_again);

/// The operators' socket sends a `stats` frame at once, and a `saga` frame
/// and a new `stats` frame when a saga ends, at the default poll interval and well before the hub's own
/// refresh period: the saga's end wakes it. A wrong token is refused.
async fn the_operator_socket_sends_stats_at_once_and_on_change(backend: Backend) {
    let app = TestApp::spawn_with(backend, fast_sim(), |config| {
        config.poll_interval = Config::defaults().poll_interval;
        config.ai_poll_interval = Config::defaults().ai_poll_interval;
    })
    .await;
    let slug = app.experience(3).await;
    let refused = Socket::operators(app.port, "wrong").await.err();
    assert!(refused.is_some_and(|e| e.contains("401")));
    let mut ops = Socket::operators(app.port, OPERATOR)
        .await
        .expect("operator socket");
    let first = ops
        .next_of_type("stats", Duration::from_secs(5))
        .await
        .expect("a stats frame at once");
    assert_eq!(first["steps"]["COMPLETED"], 0);
    assert_eq!(first["queue_depth"], 0);
    let load = first["experiences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["slug"] == slug.as_str())
        .expect("the experience's load");
    assert_eq!(load["max_in_flight"], 3);
    assert_eq!(load["in_flight"], 0);
    assert_eq!(
        load["queued"], 0,
        "an experience with no saga has none queued"
    );

    let (sid, tok) = app.session(&slug, None, "fay").await;
    assert_eq!(
        app.submit(&sid, &tok, json!({"prompt": "forbidden"}), "k")
            .await
            .status(),
        202
    );
    // The hub refreshes on its own every 5 s; 4 s is before that. Saga
    // frames come before the stats frame that counts them.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    let mut last = first;
    let mut saga_frames = Vec::new();
    while last["aborted_by_reason"]["INPUT_REJECTED"] != 1 {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let frame = ops
            .next_json(left)
            .await
            .unwrap_or_else(|| panic!("no stats frame counting the rejection; last: {last}"));
        match frame["type"].as_str() {
            Some("stats") => last = frame,
            Some("saga") => saga_frames.push(frame),
            _ => panic!("an unexpected frame: {frame}"),
        }
    }
    assert_eq!(last["steps"]["ABORTED"], 1);
    let recent = last["recent"].as_array().unwrap();
    assert_eq!(recent[0]["nickname"], "fay");
    assert_eq!(recent[0]["abort_reason"], "INPUT_REJECTED");
    let ended = saga_frames
        .iter()
        .rev()
        .find(|f| f["session_id"] == sid.as_str())
        .unwrap_or_else(|| panic!("no saga frame of fay's saga: {saga_frames:?}"));
    assert_eq!(ended["step"], "ABORTED");
    assert_eq!(ended["abort_reason"], "INPUT_REJECTED");
    app.stop().await;
}
db_test!(the_operator_socket_sends_stats_at_once_and_on_change);

/// An operator's retry never makes a second AI job for a submit whose job
/// was made but never recorded: the first submit's answer is lost after
/// the provider made the job, and the saga is cancelled while its worker
/// waits to ask again. The cancel detaches the call's slot, and the slot
/// adopter finds the job by its key (the provider has no cancel here, so
/// it would poll it to its end); the retry takes the slot back and goes on
/// with the same key, so it finds that job. Before the ledger the job was
/// counted nowhere once the saga ended; a retry with a fresh key would run
/// a second job beside it.
async fn a_retry_finds_the_unrecorded_job_of_the_cancelled_run(backend: Backend) {
    let sim = stagehand::ai::SimConfig {
        refuse_cancel: true,
        ..fast_sim()
    };
    let app = TestApp::spawn_with(backend, sim, |c| {
        // The worker waits long after the unclear submit: the cancel and
        // the retry happen meanwhile.
        c.backoff_base = Duration::from_secs(20);
        c.backoff_max = Duration::from_secs(20);
    })
    .await;
    app.sim.control.set_faults(stagehand::ai::SimFaults {
        drop_after_create: 1,
        ..Default::default()
    });
    let slug = app.experience(5).await;
    let (sid, token) = app.session(&slug, None, "lost").await;
    let resp = app
        .submit(&sid, &token, json!({"prompt": "a cat"}), "k1")
        .await;
    assert_eq!(resp.status(), 202);
    let made = support::wait_for(Duration::from_secs(5), || async {
        (app.sim.control.stats().unclear_answers == 1).then_some(())
    })
    .await;
    assert!(made.is_some(), "{:?}", app.sim.control.stats());
    assert_eq!(app.sim.control.stats().jobs_created, 1);
    let saga_id = app.saga_of(&sid).await["saga_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _, body) = app
        .operator_post(&format!("/api/admin/sagas/{saga_id}/cancel"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = app
        .operator_post(&format!("/api/admin/sagas/{saga_id}/retry"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let done = app.wait_final(&sid, &token, Duration::from_secs(10)).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(
        app.sim.control.stats().jobs_created,
        1,
        "the retry made a second job: {:?}",
        app.sim.control.stats()
    );
    let store = app.state.store.clone();
    let settled = support::wait_for(Duration::from_secs(5), || async {
        (store.ledger_rows().await.unwrap() == 0).then_some(())
    })
    .await;
    assert!(settled.is_some(), "a slot was never freed");
    app.stop().await;
}
db_test!(a_retry_finds_the_unrecorded_job_of_the_cancelled_run);
