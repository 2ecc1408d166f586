//! Mail to the guest (issue 48) through HTTP, against a real SMTP server
//! (`aiosmtpd`, tests/support/smtp_server.py) that parses every mail it
//! keeps with Python's `email` package, on SQLite and PostgreSQL:
//! - a guest asks; the mail arrives in the experience's language with
//!   the picture inline (a photo's result: the display-size JPEG), the link, a plain-text part and the file
//!   attached, its `Message-ID` derived from its row; an endpoint gets
//!   `email.sent` without the address;
//! - bad input is 422 naming the field (not an address, too long, a line
//!   break, no consent), the bounds are 409/429, and nothing is queued;
//! - a 451 is tried again and delivered once; a 550 ends FAILED with its
//!   reason on /ops, and "retry" sends it; a connection dropped after
//!   DATA is sent again with the same `Message-ID`;
//! - erasure removes the address from every table (and, on SQLite, from
//!   the database's files);
//! - two instances on one PostgreSQL database: every mail sent once.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use stagehand::clock::{Clock, ManualClock};
use support::smtp::SmtpServer;
use support::{Backend, TestApp, OPERATOR};

const WITHIN: Duration = Duration::from_secs(30);
const FROM: &str = "Stagehand Booth <booth@stagehand.test>";

fn mail_to(smtp: &SmtpServer) -> impl FnOnce(&mut stagehand::config::Config) {
    let url = smtp.url.clone();
    move |config: &mut stagehand::config::Config| {
        config.smtp_url = Some(url);
        config.mail_from = Some(FROM.into());
        config.webhook_allow_private = true;
    }
}

/// A text experience with `extra` settings; its slug.
async fn experience(app: &TestApp, extra: Value) -> String {
    let slug = format!("ml-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    app.experience_from(
        json!({"slug": slug, "title": "Lighthouse Days", "kind": "comic"}),
        extra,
    )
    .await
}

/// A completed session of `slug`: its id and token.
async fn completed(app: &TestApp, slug: &str) -> (String, String) {
    let (sid, token) = app.session(slug, None, "ana").await;
    let resp = app
        .submit(
            &sid,
            &token,
            json!({"prompt": "a lighthouse at dawn"}),
            &uuid::Uuid::new_v4().to_string(),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let done = app.wait_final(&sid, &token, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    (sid, token)
}

/// The guest's `POST /api/sessions/{sid}/email` with `body`.
async fn ask(app: &TestApp, sid: &str, token: &str, body: Value) -> (u16, Value) {
    let resp = app
        .http
        .post(format!("{}/api/sessions/{sid}/email", app.base))
        .bearer_auth(token)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// The mail `email_id` as /ops's log shows it.
async fn logged(app: &TestApp, email_id: &str) -> Value {
    let (status, log) = app.operator_get("/api/admin/mails").await;
    assert_eq!(status, 200, "{log}");
    log["mails"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["email_id"] == email_id)
        .cloned()
        .unwrap_or_else(|| panic!("{email_id} is not in the log: {log}"))
}

/// Waits until /ops shows mail `email_id` with `status`; the entry.
async fn wait_status(app: &TestApp, email_id: &str, status: &str) -> Value {
    support::wait_for(WITHIN, || async {
        let entry = logged(app, email_id).await;
        (entry["status"] == status).then_some(entry)
    })
    .await
    .unwrap_or_else(|| panic!("{email_id} never became {status}"))
}

async fn a_guest_gets_the_mail_in_their_language(backend: Backend) {
    let smtp = SmtpServer::start();
    let receiver = support::webhooks::WebhookReceiver::start();
    let app = TestApp::spawn_with(backend, support::fast_sim(), mail_to(&smtp)).await;
    hook_for(&app, &receiver, &["email.sent"]).await;
    let slug = experience(
        &app,
        json!({"locale": "ko", "mail_attach": true, "input": "photo",
               "mail_marketing": {"ko": "후원사 소식을 받겠습니다.", "en": "Send me the sponsor's news."}}),
    )
    .await;
    let offer = app.get_json(&format!("/api/experiences/{slug}")).await;
    let version = offer["mail"]["notice_version"]
        .as_str()
        .unwrap_or_else(|| panic!("the page is offered mail: {offer}"))
        .to_owned();
    assert!(offer["mail"]["consent"]["ko"].as_str().is_some(), "{offer}");
    // A photo's result: a raster picture, shown in the mail.
    let (sid, token, _) = app.photo_session(&slug, None).await;

    let address = "Guest.One+booth@Example.COM";
    let (status, body) = ask(
        &app,
        &sid,
        &token,
        json!({"email": address, "consent": true, "marketing": true, "notice_version": version}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "QUEUED", "{body}");
    let email_id = body["email_id"].as_str().unwrap().to_owned();
    assert!(
        !body.to_string().contains("Guest.One"),
        "the answer does not repeat the address: {body}"
    );

    let got = smtp.wait_received(1, WITHIN).await;
    let mail = &got[0];
    assert_eq!(mail["outcome"], "accepted", "{mail}");
    assert_eq!(
        mail["rcpt_tos"],
        json!(["Guest.One+booth@example.com"]),
        "{mail}"
    );
    assert_eq!(
        mail["message_id"],
        format!("<{email_id}@stagehand.test>"),
        "the Message-ID is derived from the mail's row"
    );
    let subject = mail["subject"].as_str().unwrap();
    assert!(
        subject.contains("Lighthouse Days") && subject.contains("사진"),
        "the Korean template, with the event's name: {subject}"
    );
    let view = app.status(&sid, &token).await;
    let share = view["share_url"].as_str().expect("a share link");
    let text = mail["text"].as_str().expect("a plain-text part");
    assert!(
        text.contains(share) && text.contains("안녕하세요"),
        "{text}"
    );
    let html = mail["html"].as_str().expect("an HTML part");
    assert!(
        html.contains("cid:result") && html.contains(share),
        "{html}"
    );
    let inline = &mail["inline_images"][0];
    assert_eq!(inline["content_id"], "result", "{mail}");
    assert_eq!(inline["content_type"], "image/jpeg", "{mail}");
    assert!(
        inline["width"].as_u64().unwrap_or(0) > 0,
        "a picture: {inline}"
    );
    assert_eq!(
        mail["attachments"].as_array().map(Vec::len),
        Some(1),
        "the full file attached: {mail}"
    );
    assert_eq!(mail["structure"][0], "multipart/mixed", "{mail}");
    assert_eq!(mail["structure"][1][0], "multipart/related", "{mail}");

    let entry = wait_status(&app, &email_id, "SENT").await;
    assert_eq!(entry["address"], "G…@example.com", "masked: {entry}");
    assert_eq!(entry["marketing"], true, "{entry}");
    assert_eq!(entry["consent_notice"], version.as_str(), "{entry}");
    let view = app.status(&sid, &token).await;
    assert_eq!(view["emails"][0]["status"], "SENT", "{view}");

    let hooks = support::wait_for(WITHIN, || async {
        let got = receiver.received().await;
        (!got.is_empty()).then_some(got)
    })
    .await
    .expect("email.sent was delivered");
    let event = &hooks[0];
    assert_eq!(event["verified"], true, "{event}");
    assert_eq!(event["body"]["type"], "email.sent", "{event}");
    assert_eq!(event["body"]["data"]["email_id"], email_id.as_str());
    assert!(
        !event.to_string().to_lowercase().contains("guest.one"),
        "no address in a webhook: {event}"
    );
    app.stop().await;
}
db_test!(a_guest_gets_the_mail_in_their_language);

async fn bad_input_is_refused_and_nothing_is_queued(backend: Backend) {
    let smtp = SmtpServer::start();
    let app = TestApp::spawn_with(backend, support::fast_sim(), mail_to(&smtp)).await;
    let slug = experience(&app, json!({"mails_per_guest": 2})).await;
    let (sid, token) = completed(&app, &slug).await;
    let long_local = format!("{}@example.com", "a".repeat(65));
    for (body, code, field) in [
        (
            json!({"email": "guest@example.com\r\nBcc: victim@example.org", "consent": true}),
            "invalid_email",
            "email",
        ),
        (
            json!({"email": "guest@example.com\nX-Evil: 1", "consent": true}),
            "invalid_email",
            "email",
        ),
        (
            json!({"email": "not an address", "consent": true}),
            "invalid_email",
            "email",
        ),
        (
            json!({"email": long_local, "consent": true}),
            "invalid_email",
            "email",
        ),
        (json!({"consent": true}), "invalid_email", "email"),
        (
            json!({"email": "guest@example.com"}),
            "consent_required",
            "consent",
        ),
        (
            json!({"email": "guest@example.com", "consent": false}),
            "consent_required",
            "consent",
        ),
    ] {
        let (status, answer) = ask(&app, &sid, &token, body.clone()).await;
        assert_eq!(
            (status, answer["error"].as_str(), answer["field"].as_str()),
            (422, Some(code), Some(field)),
            "{body}: {answer}"
        );
    }
    let (status, answer) = ask(
        &app,
        &sid,
        &token,
        json!({"email": "guest@example.com", "consent": true, "notice_version": "0000000000000000"}),
    )
    .await;
    assert_eq!(status, 409, "a consent text that changed since: {answer}");
    let (_, log) = app.operator_get("/api/admin/mails").await;
    assert_eq!(log["mails"], json!([]), "nothing was queued: {log}");

    // The session's bound: two addresses, then 409.
    for n in 0..2 {
        let (status, answer) = ask(
            &app,
            &sid,
            &token,
            json!({"email": format!("g{n}@example.com"), "consent": true}),
        )
        .await;
        assert_eq!(status, 202, "{answer}");
    }
    let (status, answer) = ask(
        &app,
        &sid,
        &token,
        json!({"email": "g3@example.com", "consent": true}),
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (409, Some("mail_limit")),
        "{answer}"
    );
    smtp.wait_received(2, WITHIN).await;

    // The address's bound: five mails in an hour, across sessions; the
    // sixth is refused.
    let mut accepted = 0;
    let refused = loop {
        let (sid, token) = completed(&app, &slug).await;
        let mut refused = None;
        for _ in 0..2 {
            let (status, answer) = ask(
                &app,
                &sid,
                &token,
                json!({"email": "popular@example.com", "consent": true}),
            )
            .await;
            if status == 202 {
                accepted += 1;
            } else {
                refused = Some((status, answer));
                break;
            }
        }
        if let Some(refused) = refused {
            break refused;
        }
        assert!(accepted <= 5, "more than five mails to one address");
    };
    assert_eq!(accepted, 5, "refused at the sixth: {refused:?}");
    assert_eq!(
        (refused.0, refused.1["error"].as_str()),
        (429, Some("address_limit")),
        "{refused:?}"
    );
    app.stop().await;
}
db_test!(bad_input_is_refused_and_nothing_is_queued);

/// Without an SMTP server, the page is offered no mail and a request is
/// 503 `mail_unavailable`.
async fn without_smtp_mail_is_not_offered(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = experience(&app, json!({})).await;
    let offer = app.get_json(&format!("/api/experiences/{slug}")).await;
    assert!(offer["mail"].is_null(), "{offer}");
    let (sid, token) = completed(&app, &slug).await;
    let (status, answer) = ask(
        &app,
        &sid,
        &token,
        json!({"email": "guest@example.com", "consent": true}),
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (503, Some("mail_unavailable")),
        "{answer}"
    );
    app.stop().await;
}
db_test!(without_smtp_mail_is_not_offered);

/// An app on an injected clock that keeps pace while `work` runs (the
/// sessions complete on it), then stands still.
async fn with_ticking<T>(
    clock: &std::sync::Arc<ManualClock>,
    work: impl std::future::Future<Output = T>,
) -> T {
    let ticking = {
        let clock = clock.clone();
        tokio::spawn(async move {
            loop {
                clock.advance_ms(10);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let out = work.await;
    ticking.abort();
    let _ = ticking.await;
    out
}

/// An app on an injected clock, its SMTP server in `mode`, and a mail
/// asked for `address` whose first attempt was made and written: the
/// server, the clock, the app and the mail's id.
async fn first_attempt_on_clock(
    backend: Backend,
    mode: &str,
    address: &str,
) -> (SmtpServer, std::sync::Arc<ManualClock>, TestApp, String) {
    let smtp = SmtpServer::start();
    smtp.mode(mode).await;
    let clock = ManualClock::new(stagehand::clock::SystemClock.now_ms());
    let app =
        TestApp::spawn_with_clock(backend, support::fast_sim(), mail_to(&smtp), clock.clone())
            .await;
    let slug = experience(&app, json!({})).await;
    let (sid, token) = with_ticking(&clock, completed(&app, &slug)).await;
    let (status, body) = ask(
        &app,
        &sid,
        &token,
        json!({"email": address, "consent": true}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let email_id = body["email_id"].as_str().unwrap().to_owned();
    smtp.wait_attempts(1, WITHIN).await;
    support::wait_for(WITHIN, || async {
        (logged(&app, &email_id).await["attempts"] == 1).then_some(())
    })
    .await
    .expect("the first attempt was written");
    (smtp, clock, app, email_id)
}

async fn a_451_is_retried_and_delivered_once(backend: Backend) {
    let (smtp, clock, app, email_id) =
        first_attempt_on_clock(backend, "tempfail_once", "later@example.com").await;
    let attempts = smtp.attempts().await;
    assert_eq!(attempts[0]["outcome"], "tempfail", "{attempts:?}");
    let entry = logged(&app, &email_id).await;
    assert_eq!(entry["status"], "QUEUED", "{entry}");
    assert!(
        entry["last_error"].as_str().unwrap().contains("451"),
        "{entry}"
    );
    // Not before its time: the retry waits 30 s on the clock.
    clock.advance_ms(29_000);
    let early = support::wait_for(Duration::from_secs(2), || async {
        (smtp.attempts().await.len() > 1).then_some(())
    })
    .await;
    assert!(early.is_none(), "tried again before 30 s");
    clock.advance_ms(1_000);
    let entry = wait_status(&app, &email_id, "SENT").await;
    assert_eq!(entry["attempts"], 2, "{entry}");
    let attempts = smtp.attempts().await;
    let accepted: Vec<&Value> = attempts
        .iter()
        .filter(|a| a["outcome"] == "accepted")
        .collect();
    assert_eq!(accepted.len(), 1, "delivered once: {attempts:?}");
    assert_eq!(smtp.received().await.len(), 1);
    app.stop().await;
}
db_test!(a_451_is_retried_and_delivered_once);

/// Adds an endpoint for `events` on `receiver` (asserted 201).
async fn hook_for(app: &TestApp, receiver: &support::webhooks::WebhookReceiver, events: &[&str]) {
    let resp = app
        .http
        .post(format!("{}/api/admin/webhooks", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"url": receiver.url, "events": events}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let hook: Value = resp.json().await.unwrap();
    receiver.set_secret(hook["secret"].as_str().unwrap()).await;
}

async fn a_550_fails_with_its_reason_and_retry_sends_it(backend: Backend) {
    let smtp = SmtpServer::start();
    smtp.mode("reject").await;
    let receiver = support::webhooks::WebhookReceiver::start();
    let app = TestApp::spawn_with(backend, support::fast_sim(), mail_to(&smtp)).await;
    hook_for(&app, &receiver, &["email.failed"]).await;
    let slug = experience(&app, json!({})).await;
    let (sid, token) = completed(&app, &slug).await;
    let (status, body) = ask(
        &app,
        &sid,
        &token,
        json!({"email": "nobody@example.com", "consent": true}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let email_id = body["email_id"].as_str().unwrap().to_owned();
    let failed = wait_status(&app, &email_id, "FAILED").await;
    let reason = failed["last_error"].as_str().unwrap();
    assert!(reason.contains("550"), "the server's answer: {failed}");
    assert!(
        !reason.contains("nobody@"),
        "no address in the reason: {failed}"
    );
    let (_, only_failed) = app.operator_get("/api/admin/mails?status=FAILED").await;
    assert_eq!(
        only_failed["mails"].as_array().map(Vec::len),
        Some(1),
        "{only_failed}"
    );
    assert_eq!(smtp.attempts().await.len(), 1, "a 5xx is not tried again");
    let hooks = support::wait_for(WITHIN, || async {
        let got = receiver.received().await;
        (!got.is_empty()).then_some(got)
    })
    .await
    .expect("email.failed was delivered");
    let event = &hooks[0];
    assert_eq!(event["verified"], true, "{event}");
    assert_eq!(event["body"]["type"], "email.failed", "{event}");
    assert!(
        event["body"]["data"]["reason"]
            .as_str()
            .unwrap()
            .contains("550"),
        "{event}"
    );
    assert!(
        !event.to_string().contains("nobody@"),
        "no address in a webhook: {event}"
    );

    smtp.mode("accept").await;
    let resp = app
        .http
        .post(format!("{}/api/admin/mails/retry", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"email_ids": [email_id]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let retried: Value = resp.json().await.unwrap();
    assert_eq!(retried["retried"], json!([email_id]), "{retried}");
    wait_status(&app, &email_id, "SENT").await;
    let got = smtp.wait_received(1, WITHIN).await;
    assert_eq!(got[0]["message_id"], format!("<{email_id}@stagehand.test>"));
    app.stop().await;
}
db_test!(a_550_fails_with_its_reason_and_retry_sends_it);

/// The SMTP server keeps the mail and drops the connection before it
/// answers: the mail is tried again, and both copies carry one
/// `Message-ID`.
async fn a_dropped_connection_is_sent_again_as_the_same_message(backend: Backend) {
    let (smtp, clock, app, email_id) =
        first_attempt_on_clock(backend, "drop_after_data", "twice@example.com").await;
    clock.advance_ms(30_000);
    wait_status(&app, &email_id, "SENT").await;
    let got = smtp.received().await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["outcome"], "dropped");
    assert_eq!(got[1]["outcome"], "accepted");
    assert_eq!(
        got[0]["message_id"], got[1]["message_id"],
        "the copy is recognisably the same message"
    );
    app.stop().await;
}
db_test!(a_dropped_connection_is_sent_again_as_the_same_message);

/// Every text column of every table that holds `needle`, as `table.column`.
async fn columns_holding(app: &TestApp, needle: &str) -> Vec<String> {
    use sea_orm::ConnectionTrait;
    let store = &app.state.store;
    let postgres = store.is_postgres();
    let columns_sql = if postgres {
        "SELECT table_name, column_name FROM information_schema.columns \
         WHERE table_schema = 'public' AND data_type IN ('text', 'character varying')"
            .to_owned()
    } else {
        "SELECT m.name, p.name FROM sqlite_master m JOIN pragma_table_info(m.name) p \
         WHERE m.type = 'table' AND (p.type LIKE '%TEXT%' OR p.type LIKE '%CHAR%' OR p.type = '')"
            .to_owned()
    };
    let rows = store
        .db()
        .query_all_raw(store.sql(&columns_sql, vec![]))
        .await
        .unwrap();
    let mut found = Vec::new();
    for row in rows {
        let table: String = row.try_get_by_index(0).unwrap();
        let column: String = row.try_get_by_index(1).unwrap();
        let probe = format!(
            "SELECT COUNT(*) FROM \"{table}\" WHERE lower(CAST(\"{column}\" AS TEXT)) LIKE $1"
        );
        let count = store
            .db()
            .query_one_raw(store.sql(&probe, vec![format!("%{needle}%").into()]))
            .await
            .unwrap()
            .and_then(|r| r.try_get_by_index::<i64>(0).ok())
            .unwrap_or(0);
        if count > 0 {
            found.push(format!("{table}.{column}"));
        }
    }
    found
}

async fn erasure_removes_the_address_everywhere(backend: Backend) {
    let smtp = SmtpServer::start();
    let app = TestApp::spawn_with(backend, support::fast_sim(), mail_to(&smtp)).await;
    let slug = experience(&app, json!({})).await;
    let (sid, token) = completed(&app, &slug).await;
    let address = format!(
        "erase-{}@example.com",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let (status, body) = ask(
        &app,
        &sid,
        &token,
        json!({"email": address, "consent": true}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let email_id = body["email_id"].as_str().unwrap().to_owned();
    wait_status(&app, &email_id, "SENT").await;
    assert_eq!(
        columns_holding(&app, &address).await,
        vec!["mails.address".to_owned()],
        "kept only in the outbox until erased"
    );

    let resp = app
        .http
        .delete(format!("{}/api/sessions/{sid}", app.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        columns_holding(&app, &address).await,
        Vec::<String>::new(),
        "no table holds the address after the erasure"
    );
    let entry = logged(&app, &email_id).await;
    assert!(entry["address"].is_null(), "{entry}");
    if backend == Backend::Sqlite {
        // The database's own files: the file and its write-ahead log.
        let file = app
            .db
            .url
            .trim_start_matches("sqlite://")
            .split('?')
            .next()
            .unwrap()
            .to_owned();
        for path in [file.clone(), format!("{file}-wal")] {
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            let found = bytes
                .windows(address.len())
                .any(|w| w.eq_ignore_ascii_case(address.as_bytes()));
            assert!(!found, "{path} still holds the address");
        }
    }
    app.stop().await;
}
db_test!(erasure_removes_the_address_everywhere);

/// Two instances on one PostgreSQL database, both sending: every mail is
/// sent once (the SMTP server holds each for a moment, so a second sender
/// of the same mail would overlap).
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn two_instances_send_each_mail_once() {
    let smtp = SmtpServer::start();
    let db = support::TestDb::fresh(Backend::Postgres).await;
    let sim = support::start_sim(support::fast_sim()).await;
    let one = support::Instance::start(&db, &sim.url(), mail_to(&smtp)).await;
    let two = support::Instance::start(&db, &sim.url(), mail_to(&smtp)).await;
    let http = reqwest::Client::new();
    let slug = support::create_experience(&http, &one.base, 20).await;
    let sessions =
        support::sessions_across(&http, &[one.base.as_str(), two.base.as_str()], &slug, 20).await;
    let mut ids = Vec::new();
    for (i, (base, sid, token)) in sessions.iter().enumerate() {
        let resp = http
            .post(format!("{base}/api/sessions/{sid}/email"))
            .bearer_auth(token)
            .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .json(&json!({"email": format!("guest{i}@example.com"), "consent": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        let body: Value = resp.json().await.unwrap();
        ids.push(body["email_id"].as_str().unwrap().to_owned());
    }
    let got = smtp.wait_received(20, Duration::from_secs(60)).await;
    // Settle: a duplicate would come within a lease; none may.
    let again = support::wait_for(Duration::from_secs(4), || async {
        (smtp.received().await.len() > 20).then_some(())
    })
    .await;
    assert!(
        again.is_none(),
        "a mail came twice: {:?}",
        smtp.received().await
    );
    let mut message_ids: Vec<&str> = got
        .iter()
        .map(|m| m["message_id"].as_str().unwrap())
        .collect();
    message_ids.sort_unstable();
    message_ids.dedup();
    assert_eq!(message_ids.len(), 20, "{got:?}");
    let outbox = one.state.store.mails_page(None, 100).await.unwrap();
    assert_eq!(outbox.len(), 20, "each mail once in the outbox");
    assert!(
        outbox
            .iter()
            .all(|(m, _)| m.status == "SENT" && m.attempts == 1),
        "each sent at its first attempt: {outbox:?}"
    );
    one.stop().await;
    two.stop().await;
}
