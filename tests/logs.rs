//! No token reaches a log line: the logs of a whole flow (experience,
//! booth, session, submission, display socket, refused sockets) are
//! captured at INFO with the request spans, and searched for every secret
//! handed out. Its own test binary, since it installs the global
//! subscriber. On SQLite and on PostgreSQL.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{Backend, Socket, TestApp, OPERATOR};

type Captured = support::CapturedLogs;

/// Every log of this test binary.
fn captured() -> Captured {
    support::captured_logs("info")
}

async fn no_token_reaches_a_log_line(backend: Backend) {
    let logs = captured();
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let (terminal_id, terminal_token) = app.terminal(&slug).await;
    let (other_terminal, other_token) = app.terminal(&slug).await;
    let mut display = app.terminal_socket(&terminal_id, &terminal_token, 0).await;
    let (sid, participant_token) = app.session(&slug, Some(&terminal_id), "mo").await;
    let resp = app
        .submit(&sid, &participant_token, json!({"prompt": "x"}), "k")
        .await;
    assert_eq!(resp.status(), 202);
    app.wait_final(&sid, &participant_token, Duration::from_secs(20))
        .await;
    assert!(display
        .next_session_event(Duration::from_secs(20))
        .await
        .is_some());
    // Refused: a real token on the wrong terminal, in the query string.
    for (id, token) in [
        (terminal_id.as_str(), other_token.as_str()),
        (other_terminal.as_str(), terminal_token.as_str()),
    ] {
        assert!(Socket::try_connect(app.port, id, token, 0).await.is_err());
    }
    assert!(Socket::operators(app.port, &participant_token)
        .await
        .is_err());
    let mut ops = Socket::operators(app.port, OPERATOR).await.unwrap();
    assert!(ops
        .next_of_type("stats", Duration::from_secs(5))
        .await
        .is_some());
    drop(display);
    app.stop().await;

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("/ws/terminals/"),
        "the request spans are in the captured logs:\n{text}"
    );
    for (name, secret) in [
        ("terminal token", terminal_token.as_str()),
        ("other terminal token", other_token.as_str()),
        ("participant token", participant_token.as_str()),
        ("operator token", OPERATOR),
    ] {
        assert!(
            !text.contains(secret),
            "the {name} is in a log line:\n{}",
            text.lines().find(|l| l.contains(secret)).unwrap()
        );
    }
}
db_test!(no_token_reaches_a_log_line);
