//! A mail is not lost when its sender dies mid-send (issue 48): stagehand
//! killed with SIGKILL while the SMTP server holds its answer to the
//! mail's DATA; after a restart on the same database the mail is sent
//! again, and every copy the server got carries the same `Message-ID`.
//!
//! The SMTP server is real (`aiosmtpd`, tests/support/smtp_server.py); its
//! `hold` mode keeps the mail and answers nothing until released, which
//! is how the kill lands in that window every time. On SQLite and
//! PostgreSQL, with `stagehand serve` as a process.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::smtp::SmtpServer;
use support::{http_client, Backend, Logs, Server, TestDb, OPERATOR};

const WITHIN: Duration = Duration::from_secs(60);

async fn kill9_while_a_mail_is_sent_delivers_it_after_restart(backend: Backend) {
    let smtp = SmtpServer::start();
    smtp.mode("hold").await;
    let mut logs = Logs::new();
    let http = http_client();
    let db = TestDb::fresh(backend).await;
    let sim = support::start_sim(support::fast_sim()).await;
    // A lease long enough that the held attempt is still running when the
    // kill comes (an attempt ends within three quarters of its lease).
    let env = [
        ("STAGEHAND_SMTP_URL", smtp.url.as_str()),
        ("STAGEHAND_MAIL_FROM", "booth@stagehand.test"),
        ("STAGEHAND_LEASE", "10s"),
    ];
    let mut first = Server::start_with(&db.url, &sim.url(), &logs.next(), &http, &env).await;
    let slug = support::create_experience(&http, &first.base, 5).await;
    let (sid, token) = support::create_session(&http, &first.base, &slug, None, "ana").await;
    let resp = support::submit(
        &http,
        &first.base,
        &sid,
        &token,
        json!({"prompt": "a lighthouse"}),
        &uuid::Uuid::new_v4().to_string(),
    )
    .await;
    assert_eq!(resp.status(), 202);
    let done = support::wait_final(&http, &first.base, &sid, &token, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");

    let resp = http
        .post(format!("{}/api/sessions/{sid}/email", first.base))
        .bearer_auth(&token)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .json(&json!({"email": "crash@example.com", "consent": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.unwrap();
    let email_id = body["email_id"].as_str().unwrap().to_owned();
    let held = smtp.wait_attempts(1, WITHIN).await;
    assert_eq!(held[0]["outcome"], "held", "{held:?}");
    first.kill9();
    drop(first);
    smtp.mode("accept").await;
    smtp.release().await;

    // Restarted on the same database: the mail's lease ends and it is
    // sent again.
    let second = Server::start_with(&db.url, &sim.url(), &logs.next(), &http, &env).await;
    let sent = support::wait_for(WITHIN, || async {
        let resp = http
            .get(format!("{}/api/admin/mails", second.base))
            .bearer_auth(OPERATOR)
            .send()
            .await
            .ok()?;
        let log: Value = resp.json().await.ok()?;
        let entry = log["mails"]
            .as_array()?
            .iter()
            .find(|m| m["email_id"] == email_id.as_str())?
            .clone();
        (entry["status"] == "SENT").then_some(entry)
    })
    .await;
    assert!(sent.is_some(), "the mail was sent after the restart");
    let got = smtp.received().await;
    assert!(
        (1..=2).contains(&got.len()),
        "the held copy and at most one more: {got:?}"
    );
    assert!(
        got.iter().any(|m| m["outcome"] == "accepted"),
        "delivered: {got:?}"
    );
    let expected = format!("<{email_id}@stagehand.test>");
    assert!(
        got.iter().all(|m| m["message_id"] == expected.as_str()),
        "every copy carries the mail's one Message-ID: {got:?}"
    );
}
db_test!(kill9_while_a_mail_is_sent_delivers_it_after_restart);
