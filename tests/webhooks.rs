//! Webhooks (issue 48) through HTTP, against a receiver that checks every
//! signature with the reference library of Standard Webhooks
//! (tests/support/webhook_receiver.py), on SQLite and PostgreSQL:
//! - a completed session is delivered once, signed, with the session, the
//!   experience and the links, and no nickname the guest did not consent
//!   to show; the endpoint's log says so;
//! - an endpoint that answers 500 for ten minutes (on the injected clock)
//!   and then 200 gets every event, each with the same `webhook-id` on
//!   every attempt;
//! - a URL on a private address, an unknown event, a viewer: refused;
//! - erasure removes a session's deliveries;
//! - two instances on one PostgreSQL database: each delivery sent once.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use stagehand::clock::{Clock, ManualClock};
use support::webhooks::WebhookReceiver;
use support::{Backend, TestApp, OPERATOR};

const WITHIN: Duration = Duration::from_secs(30);

/// Adds an endpoint for `events`: its id and secret (asserted 201).
async fn add_webhook(app: &TestApp, url: &str, events: &[&str]) -> (String, String) {
    let resp = app
        .http
        .post(format!("{}/api/admin/webhooks", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"url": url, "events": events}))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(status, 201, "{body}");
    (
        body["webhook_id"].as_str().unwrap().to_owned(),
        body["secret"].as_str().unwrap().to_owned(),
    )
}

/// A text experience; its slug.
async fn experience(app: &TestApp) -> String {
    let slug = format!("wh-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    app.experience_from(
        json!({"slug": slug, "title": "Hook booth", "kind": "comic"}),
        json!({}),
    )
    .await
}

/// A completed session of `slug`: its id and token.
async fn completed(app: &TestApp, slug: &str, nickname: &str) -> (String, String) {
    let (sid, token) = app.session(slug, None, nickname).await;
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

/// Waits until the receiver has `count` deliveries; them.
async fn received(receiver: &WebhookReceiver, count: usize) -> Vec<Value> {
    support::wait_for(WITHIN, || async {
        let got = receiver.received().await;
        (got.len() >= count).then_some(got)
    })
    .await
    .unwrap_or_else(|| panic!("{count} deliveries never came"))
}

fn allow_private(config: &mut stagehand::config::Config) {
    config.webhook_allow_private = true;
}

async fn a_completed_session_is_delivered_once_and_signed(backend: Backend) {
    let receiver = WebhookReceiver::start();
    let app = TestApp::spawn_with(backend, support::fast_sim(), allow_private).await;
    let (webhook_id, secret) = add_webhook(&app, &receiver.url, &["session.completed"]).await;
    assert!(secret.starts_with("whsec_"), "{secret}");
    receiver.set_secret(&secret).await;
    let slug = experience(&app).await;
    let (sid, token) = completed(&app, &slug, "ana").await;

    let got = received(&receiver, 1).await;
    let delivery = &got[0];
    assert_eq!(
        delivery["verified"], true,
        "the reference library verified it: {delivery}"
    );
    let body = &delivery["body"];
    assert_eq!(body["type"], "session.completed", "{body}");
    assert_eq!(body["data"]["session_id"], sid.as_str(), "{body}");
    assert_eq!(body["data"]["experience"], slug.as_str(), "{body}");
    let view = app.status(&sid, &token).await;
    let share = view["share_url"].as_str().expect("a share link");
    assert!(
        body["data"]["share_url"].as_str().unwrap().ends_with(share),
        "{body} vs {share}"
    );
    assert!(
        body["data"]["media_url"]
            .as_str()
            .unwrap()
            .starts_with("http"),
        "{body}"
    );
    assert!(
        body["data"].get("nickname").is_none(),
        "no nickname without the guest's consent: {body}"
    );

    let (status, log) = app
        .operator_get(&format!("/api/admin/webhooks/{webhook_id}/deliveries"))
        .await;
    assert_eq!(status, 200, "{log}");
    let entry = &log["deliveries"][0];
    assert_eq!(
        (
            entry["status"].as_str(),
            entry["attempts"].as_i64(),
            entry["last_status"].as_i64()
        ),
        (Some("DELIVERED"), Some(1), Some(204)),
        "{log}"
    );
    assert_eq!(
        entry["delivery_id"], delivery["id"],
        "the log names the webhook-id"
    );
    // Nothing more: one event, one delivery.
    assert_eq!(receiver.received().await.len(), 1);
    app.stop().await;
}
db_test!(a_completed_session_is_delivered_once_and_signed);

/// An endpoint that answers 500 for ten minutes and then 200 gets every
/// event: the attempts follow the schedule (5 s, 5 min, 30 min) on the
/// injected clock, each event keeps its `webhook-id`, and the endpoint is
/// not disabled.
async fn an_endpoint_down_for_ten_minutes_gets_every_event(backend: Backend) {
    let receiver = WebhookReceiver::start();
    // The injected clock starts at this machine's time and, while the
    // sessions run, keeps its pace.
    let clock = ManualClock::new(stagehand::clock::SystemClock.now_ms());
    let app =
        TestApp::spawn_with_clock(backend, support::fast_sim(), allow_private, clock.clone()).await;
    let (webhook_id, secret) = add_webhook(&app, &receiver.url, &["session.completed"]).await;
    receiver.set_secret(&secret).await;
    receiver.answer(500, Duration::ZERO).await;
    let slug = experience(&app).await;
    let ticking = {
        let clock = clock.clone();
        tokio::spawn(async move {
            loop {
                clock.advance_ms(10);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let mut sessions = Vec::new();
    for nickname in ["a", "b", "c"] {
        sessions.push(completed(&app, &slug, nickname).await.0);
    }
    ticking.abort();
    let _ = ticking.await;

    // The first attempts, all refused; then each retry as the clock comes
    // to it: 5 s, 5 min, 30 min after the one before. The receiver checks
    // timestamps against the injected clock.
    let advance = |ms: i64| {
        let (clock, receiver) = (&clock, &receiver);
        async move {
            clock.advance_ms(ms);
            receiver.follow_clock(clock.now_ms()).await;
        }
    };
    advance(0).await;
    received(&receiver, 3).await;
    advance(5_000).await;
    received(&receiver, 6).await;
    advance(300_000).await;
    received(&receiver, 9).await;
    // Ten minutes down: the endpoint comes back.
    advance(300_000).await;
    receiver.answer(200, Duration::ZERO).await;
    advance(1_800_000).await;
    let got = received(&receiver, 12).await;

    assert!(got.iter().all(|d| d["verified"] == true), "{got:?}");
    let mut ids: Vec<&str> = got.iter().map(|d| d["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        3,
        "one webhook-id per event, on every attempt: {got:?}"
    );
    let delivered: Vec<&Value> = got.iter().filter(|d| d["status"] == 200).collect();
    assert_eq!(delivered.len(), 3, "{got:?}");
    let sessions_delivered: std::collections::BTreeSet<&str> = delivered
        .iter()
        .map(|d| d["body"]["data"]["session_id"].as_str().unwrap())
        .collect();
    let expected: std::collections::BTreeSet<&str> = sessions.iter().map(String::as_str).collect();
    assert_eq!(sessions_delivered, expected);
    let (_, log) = app
        .operator_get(&format!("/api/admin/webhooks/{webhook_id}/deliveries"))
        .await;
    assert_eq!(log["webhook"]["enabled"], true, "{log}");
    assert!(log["webhook"]["failing_since"].is_null(), "{log}");
    for entry in log["deliveries"].as_array().unwrap() {
        assert_eq!(
            (entry["status"].as_str(), entry["attempts"].as_i64()),
            (Some("DELIVERED"), Some(4)),
            "{log}"
        );
    }
    app.stop().await;
}
db_test!(an_endpoint_down_for_ten_minutes_gets_every_event);

/// Bad endpoints are refused with the reason: a private address (without
/// the setting that allows it), an unknown event, no event; a viewer
/// cannot add one.
async fn bad_endpoints_are_refused(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let post = |body: Value, token: &'static str| {
        let app = &app;
        async move {
            let resp = app
                .http
                .post(format!("{}/api/admin/webhooks", app.base))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    for url in [
        "http://127.0.0.1:9/hook",
        "http://10.1.2.3/hook",
        "http://169.254.169.254/latest",
        "http://[::1]/hook",
        "ftp://example.com/hook",
    ] {
        let (status, body) = post(
            json!({"url": url, "events": ["session.completed"]}),
            OPERATOR,
        )
        .await;
        assert_eq!(status, 422, "{url}: {body}");
    }
    let (status, body) = post(
        json!({"url": "https://example.com/hook", "events": ["session.started"]}),
        OPERATOR,
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("session.started"),
        "{body}"
    );
    let (status, body) = post(
        json!({"url": "https://example.com/hook", "events": []}),
        OPERATOR,
    )
    .await;
    assert_eq!(status, 422, "{body}");
    let (_, list) = app.operator_get("/api/admin/webhooks").await;
    assert_eq!(list["webhooks"], json!([]), "nothing was added: {list}");
    app.stop().await;
}
db_test!(bad_endpoints_are_refused);

/// A guest's erasure removes the deliveries about their session that were
/// not sent yet.
async fn erasure_removes_the_sessions_deliveries(backend: Backend) {
    let receiver = WebhookReceiver::start();
    let app = TestApp::spawn_with(backend, support::fast_sim(), allow_private).await;
    let (webhook_id, secret) = add_webhook(&app, &receiver.url, &["session.completed"]).await;
    receiver.set_secret(&secret).await;
    receiver.answer(503, Duration::ZERO).await;
    let slug = experience(&app).await;
    let (sid, token) = completed(&app, &slug, "ana").await;
    received(&receiver, 1).await;
    let (_, log) = app
        .operator_get(&format!("/api/admin/webhooks/{webhook_id}/deliveries"))
        .await;
    assert_eq!(log["deliveries"][0]["status"], "PENDING", "{log}");

    let resp = app
        .http
        .delete(format!("{}/api/sessions/{sid}", app.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (_, log) = app
        .operator_get(&format!("/api/admin/webhooks/{webhook_id}/deliveries"))
        .await;
    assert!(
        log["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["event"] != "session.completed"),
        "the completion's delivery is gone: {log}"
    );
    app.stop().await;
}
db_test!(erasure_removes_the_sessions_deliveries);

/// Two instances on one PostgreSQL database, both sending: every
/// completion is delivered, and none twice (a delivery is in flight on one
/// instance at a time; the receiver answers slowly, so a second sender
/// would overlap).
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn two_instances_send_each_delivery_once() {
    let receiver = WebhookReceiver::start();
    receiver.answer(204, Duration::from_millis(300)).await;
    let db = support::TestDb::fresh(Backend::Postgres).await;
    let sim = support::start_sim(support::fast_sim()).await;
    let one = support::Instance::start(&db, &sim.url(), allow_private).await;
    let two = support::Instance::start(&db, &sim.url(), allow_private).await;
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{}/api/admin/webhooks", one.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"url": receiver.url, "events": ["session.completed"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let secret: Value = resp.json().await.unwrap();
    receiver
        .set_secret(secret["secret"].as_str().unwrap())
        .await;
    // The other instance reads the endpoints again (every 2 s).
    let known = support::wait_for(WITHIN, || async {
        two.state
            .store
            .hooks()
            .take(stagehand::domain::webhook::WebhookEvent::SessionCompleted)
            .then_some(())
    })
    .await;
    assert!(
        known.is_some(),
        "the second instance learns of the endpoint"
    );
    let slug = support::create_experience(&http, &one.base, 20).await;
    support::sessions_across(&http, &[one.base.as_str(), two.base.as_str()], &slug, 20).await;
    let got = received(&receiver, 20).await;
    // Settle: a duplicate would come within a lease; none may.
    let again = support::wait_for(Duration::from_secs(3), || async {
        (receiver.received().await.len() > 20).then_some(())
    })
    .await;
    assert!(
        again.is_none(),
        "a delivery came twice: {:?}",
        receiver.received().await
    );
    let mut ids: Vec<&str> = got.iter().map(|d| d["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 20, "{got:?}");
    assert!(got.iter().all(|d| d["verified"] == true), "{got:?}");
    let delivered: std::collections::BTreeSet<&str> = got
        .iter()
        .map(|d| d["body"]["data"]["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(delivered.len(), 20);
    one.stop().await;
    two.stop().await;
}

/// An endpoint that keeps failing past `--webhook-disable-after` is
/// disabled (its deliveries wait, /ops says why); enabled again, its
/// pending delivery is sent.
async fn an_endpoint_failing_too_long_is_disabled_until_enabled(backend: Backend) {
    let receiver = WebhookReceiver::start();
    let clock = ManualClock::new(stagehand::clock::SystemClock.now_ms());
    let app = TestApp::spawn_with_clock(
        backend,
        support::fast_sim(),
        |c| {
            allow_private(c);
            c.webhook_disable_after = Duration::from_secs(600);
        },
        clock.clone(),
    )
    .await;
    let (webhook_id, secret) = add_webhook(&app, &receiver.url, &["session.completed"]).await;
    receiver.set_secret(&secret).await;
    receiver.answer(500, Duration::ZERO).await;
    let slug = experience(&app).await;
    let ticking = {
        let clock = clock.clone();
        tokio::spawn(async move {
            loop {
                clock.advance_ms(10);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let (sid, _) = completed(&app, &slug, "ana").await;
    ticking.abort();
    let _ = ticking.await;
    receiver.follow_clock(clock.now_ms()).await;
    received(&receiver, 1).await;

    // Eleven minutes of failing: past the ten allowed.
    clock.advance_ms(11 * 60_000);
    receiver.follow_clock(clock.now_ms()).await;
    let path = format!("/api/admin/webhooks/{webhook_id}/deliveries");
    let disabled = support::wait_for(WITHIN, || async {
        let (_, log) = app.operator_get(&path).await;
        (log["webhook"]["enabled"] == false).then_some(log)
    })
    .await
    .expect("the endpoint is disabled");
    assert_eq!(
        disabled["webhook"]["disabled_reason"], "kept failing",
        "{disabled}"
    );
    assert_eq!(disabled["deliveries"][0]["status"], "PENDING", "{disabled}");
    let attempts = receiver.received().await.len();

    // Its delivery is due (the 5 min retry passed) but waits while disabled.
    let waited = support::wait_for(Duration::from_secs(3), || async {
        (receiver.received().await.len() > attempts).then_some(())
    })
    .await;
    assert!(waited.is_none(), "a disabled endpoint got a delivery");

    receiver.answer(204, Duration::ZERO).await;
    let (status, _, enabled) = app
        .operator_post(&format!("/api/admin/webhooks/{webhook_id}/enable"), None)
        .await;
    assert_eq!(
        (status, &enabled["enabled"]),
        (200, &json!(true)),
        "{enabled}"
    );
    let got = received(&receiver, attempts + 1).await;
    let last = got.last().unwrap();
    assert_eq!(
        (last["verified"].as_bool(), last["status"].as_i64()),
        (Some(true), Some(204)),
        "{last}"
    );
    assert_eq!(last["body"]["data"]["session_id"], sid.as_str());
    app.stop().await;
}
db_test!(an_endpoint_failing_too_long_is_disabled_until_enabled);
