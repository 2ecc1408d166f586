//! A display socket reads its terminal's outbox when it is rung, not after
//! each ranking frame: a display whose terminal gets no events reads
//! nothing while the other terminal's sagas change the ranking it shows.
//! (Before, each ranking frame cost every display one outbox read: with
//! 100 displays, most of the server's statements at a steady rate.)
//!
//! Its own test binary: `stagehand_outbox_reads_total` is process-wide, so
//! the SQLite and PostgreSQL variants take turns and nothing else runs
//! beside them.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{Backend, TestApp, OPERATOR};
use tokio::sync::Mutex;

/// One variant at a time (see the module doc).
static TURN: Mutex<()> = Mutex::const_new(());

/// Sagas whose ranking frames the display must take without reading.
const SAGAS: usize = 6;

async fn outbox_reads(app: &TestApp) -> f64 {
    let text = app
        .http
        .get(format!("{}/metrics", app.base))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("body");
    text.lines()
        .find_map(|l| l.strip_prefix("stagehand_outbox_reads_total "))
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}

async fn ranking_frames_cost_no_outbox_read(backend: Backend) {
    let _turn = TURN.lock().await;
    let app = TestApp::spawn(backend).await;
    let slug = format!("rank-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let created = app
        .http
        .post(format!("{}/api/experiences", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"slug": slug, "title": "Scores", "kind": "score", "max_in_flight": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let (watched, watched_token) = app.terminal(&slug).await;
    let (other, _) = app.terminal(&slug).await;
    let mut display = app.terminal_socket(&watched, &watched_token, 0).await;
    display
        .next_of_type("ranking", Duration::from_secs(10))
        .await
        .expect("the ranking on connect");
    // The socket's first read follows that frame, so it may land on either
    // side of this count: at most one read is the display's own.
    let before = outbox_reads(&app).await;
    for i in 0..SAGAS {
        let nickname = format!("player{i}");
        let (sid, token) = app.session(&slug, Some(&other), &nickname).await;
        let sent = app
            .submit(
                &sid,
                &token,
                json!({"prompt": "score", "score": i as f64}),
                &format!("k{i}"),
            )
            .await;
        assert_eq!(sent.status(), 202);
        // Each ranking frame arrives after the socket handled the one
        // before it (a socket sends in order), so when the frame with this
        // nickname is here, any read after the earlier frames was made.
        let shown = |frame: &Value| {
            frame["entries"]
                .as_array()
                .is_some_and(|e| e.iter().any(|x| x["nickname"] == nickname.as_str()))
        };
        loop {
            let frame = display
                .next_of_type("ranking", Duration::from_secs(10))
                .await
                .unwrap_or_else(|| panic!("no ranking frame with {nickname}"));
            if shown(&frame) {
                break;
            }
        }
    }
    let reads = outbox_reads(&app).await - before;
    // At most the first read (above), and one ring of every display when
    // the PostgreSQL listener connects; never one per ranking frame.
    assert!(
        reads <= 2.0,
        "{reads} outbox reads while {SAGAS} ranking frames reached a display with no events"
    );
    app.stop().await;
}
db_test!(ranking_frames_cost_no_outbox_read);
