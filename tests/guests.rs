//! The guests' data (issue 34): the result link, erasure, the gallery and
//! its PIN, hiding, consent, retention and the export. Through HTTP and
//! the display's WebSocket, on SQLite and on PostgreSQL.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};
use stagehand::actors::cleanup::RunCleanup;
use stagehand::clock::ManualClock;
use stagehand::media::MediaPlace;
use support::{Backend, TestApp, OPERATOR};

const WITHIN: Duration = Duration::from_secs(30);
const PHOTO: &[u8] = include_bytes!("fixtures/photo-small.png");

/// An experience with `extra` settings; its slug.
async fn experience_with(app: &TestApp, extra: Value) -> String {
    let slug = format!("g-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let mut body = json!({"slug": slug, "title": "Comic booth", "kind": "comic"});
    for (k, v) in extra.as_object().expect("an object") {
        body[k] = v.clone();
    }
    let resp = app
        .http
        .post(format!("{}/api/experiences", app.base))
        .bearer_auth(OPERATOR)
        .json(&body)
        .send()
        .await
        .expect("POST /api/experiences");
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    slug
}

/// A session of `nickname` that submits `body` (a prompt by default).
async fn submitted(
    app: &TestApp,
    slug: &str,
    terminal: Option<&str>,
    nickname: &str,
    body: Value,
) -> (String, String) {
    let (sid, token) = app.session(slug, terminal, nickname).await;
    let resp = app
        .submit(&sid, &token, body, &uuid::Uuid::new_v4().to_string())
        .await;
    assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
    (sid, token)
}

/// A session of `nickname` at `base` that uploads the test photo and
/// submits it.
async fn photo_submitted(
    http: &reqwest::Client,
    base: &str,
    slug: &str,
    nickname: &str,
) -> (String, String) {
    let (sid, token) = support::create_session(http, base, slug, None, nickname).await;
    let resp = http
        .post(format!("{base}/api/sessions/{sid}/photo"))
        .bearer_auth(&token)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .header("content-type", "image/png")
        .body(PHOTO.to_vec())
        .send()
        .await
        .expect("POST photo");
    assert_eq!(resp.status(), 201);
    let photo: Value = resp.json().await.unwrap();
    let resp = support::submit(
        http,
        base,
        &sid,
        &token,
        json!({"photo_id": photo["photo_id"]}),
        &uuid::Uuid::new_v4().to_string(),
    )
    .await;
    assert_eq!(resp.status(), 202);
    (sid, token)
}

/// The same, run to its end: (session id, token, its final view).
async fn completed(
    app: &TestApp,
    slug: &str,
    terminal: Option<&str>,
    nickname: &str,
    body: Value,
) -> (String, String, Value) {
    let (sid, token) = submitted(app, slug, terminal, nickname, body).await;
    let done = app.wait_final(&sid, &token, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    (sid, token, done)
}

async fn get(app: &TestApp, path: &str) -> reqwest::Response {
    app.http
        .get(format!("{}{path}", app.base))
        .send()
        .await
        .expect("GET")
}

async fn delete(app: &TestApp, path: &str, token: &str) -> (u16, Value) {
    let resp = app
        .http
        .delete(format!("{}{path}", app.base))
        .bearer_auth(token)
        .send()
        .await
        .expect("DELETE");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Every object in the app's media folder, by key.
fn objects(app: &TestApp) -> BTreeSet<String> {
    let MediaPlace::Folder(root) = app.state.media.place().clone() else {
        panic!("a folder store");
    };
    support::files_under(&root)
}

/// The kept objects a completed view names (`r/…`).
fn kept_keys(done: &Value) -> Vec<String> {
    stagehand::domain::guests::kept_keys(&done["result"]["content"])
}

/// A guest gets the link, another device opens it and downloads the
/// kept file byte for byte; the guest erases it: the display is told at
/// once, the link answers 410, the objects and the ranking entry are gone,
/// and the erasure answers 200 again when repeated.
async fn a_result_link_lives_until_its_guest_erases_it(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = experience_with(&app, json!({})).await;
    let (terminal_id, terminal_token) = app.terminal(&slug).await;
    let mut display = app.terminal_socket(&terminal_id, &terminal_token, 0).await;
    let (sid, token, done) = completed(
        &app,
        &slug,
        Some(&terminal_id),
        "ana",
        json!({"prompt": "a fox"}),
    )
    .await;
    let share_url = done["share_url"].as_str().expect("share_url").to_owned();
    assert!(
        share_url.starts_with("/r/") && share_url.len() == 35,
        "{done}"
    );
    let share_id = &share_url[3..];
    assert!(!share_url.contains(&token), "the link is not the token");
    let shown = display.next_session_event(WITHIN).await.expect("shown");
    assert_eq!(shown["type"], "session.completed");
    assert_eq!(shown["share_url"], share_url.as_str(), "{shown}");

    // Another device: no token.
    let page = get(&app, &share_url).await;
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("result.js"));
    let view: Value = get(&app, &format!("/api/share/{share_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(view["title"], "Comic booth", "{view}");
    assert_eq!(view["nickname"], "ana");
    assert_eq!(view["session_id"], sid.as_str());
    let download = get(&app, view["download_url"].as_str().expect("download_url")).await;
    assert_eq!(download.status(), 200);
    let disposition = download.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        disposition.starts_with("attachment; filename=\""),
        "{disposition}"
    );
    let downloaded = download.bytes().await.unwrap();
    let content_url = done["result"]["content"][0]["url"].as_str().unwrap();
    let kept = get(&app, content_url).await.bytes().await.unwrap();
    assert_eq!(
        downloaded, kept,
        "the download is the kept file, byte for byte"
    );
    let qr = get(&app, &format!("{share_url}/qr.svg")).await;
    assert_eq!(qr.status(), 200);
    assert!(qr.text().await.unwrap().contains("<svg"));
    let keys = kept_keys(&done);
    assert!(!keys.is_empty(), "{done}");
    assert!(keys.iter().all(|k| objects(&app).contains(k)));
    let ranking = app
        .get_json(&format!("/api/experiences/{slug}/ranking"))
        .await;
    assert_eq!(ranking["entries"].as_array().unwrap().len(), 1);

    // Someone else's token cannot erase it.
    let (_, other_token) = app.session(&slug, None, "eve").await;
    let (status, _) = delete(&app, &format!("/api/sessions/{sid}"), &other_token).await;
    assert_eq!(status, 401);

    let (status, body) = delete(&app, &format!("/api/sessions/{sid}"), &token).await;
    assert_eq!((status, &body["erased"]), (200, &json!(true)), "{body}");
    let removed = display.next_session_event(WITHIN).await.expect("removed");
    assert_eq!(removed["type"], "session.removed", "{removed}");
    assert_eq!(removed["session_id"], sid.as_str());
    assert!(removed["seq"].as_i64().unwrap() > shown["seq"].as_i64().unwrap());
    let (status, _) = delete(&app, &format!("/api/sessions/{sid}"), &token).await;
    assert_eq!(status, 200, "repeated");
    // A display that reads its frames again from the start never sees
    // the erased nickname or result.
    let mut replay = app.terminal_socket(&terminal_id, &terminal_token, 0).await;
    // Its two frames: the completion (seq 1) and the removal (seq 2).
    for _ in 0..2 {
        let frame = replay.next_session_event(WITHIN).await.expect("a frame");
        assert_eq!(frame["type"], "session.removed", "{frame}");
        assert!(!frame.to_string().contains("ana"), "{frame}");
    }

    let gone = get(&app, &share_url).await;
    assert_eq!(gone.status(), 410);
    assert_eq!(gone.json::<Value>().await.unwrap()["error"], "gone");
    let page = app
        .http
        .get(format!("{}{share_url}", app.base))
        .header("Accept", "text/html,application/xhtml+xml")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 410);
    assert!(page.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(
        page.text().await.unwrap().contains("deleted"),
        "a plain page for a browser"
    );
    let gone = get(&app, &format!("/api/share/{share_id}")).await;
    assert_eq!(gone.status(), 410);
    assert_eq!(gone.json::<Value>().await.unwrap()["error"], "gone");
    assert_eq!(
        get(&app, content_url).await.status(),
        404,
        "the file is gone"
    );
    let left = objects(&app);
    assert!(
        keys.iter().all(|k| !left.contains(k)),
        "{keys:?} in {left:?}"
    );
    let view = app.status(&sid, &token).await;
    assert_eq!(view["erased"], true, "{view}");
    assert_eq!(view["nickname"], "");
    assert_eq!(view["share_url"], Value::Null);
    let ranking = app
        .get_json(&format!("/api/experiences/{slug}/ranking"))
        .await;
    assert_eq!(ranking["entries"], json!([]), "the ranking entry is gone");
    // An erased session takes no new submission.
    let resp = app
        .submit(
            &sid,
            &token,
            json!({"prompt": "again"}),
            &uuid::Uuid::new_v4().to_string(),
        )
        .await;
    assert_eq!(resp.status(), 409);
    // The statistics still count its saga; the activity says why it is
    // blank.
    let saga = app.saga_of(&sid).await;
    assert_eq!(saga["step"], "COMPLETED");
    assert_eq!(saga["forgotten"], "participant", "{saga}");
    app.stop().await;
}
db_test!(a_result_link_lives_until_its_guest_erases_it);

/// An operator's erasure of a running session cancels its saga first.
async fn an_operator_erases_a_running_session(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = experience_with(&app, json!({})).await;
    app.sim.control.set_latency(Duration::from_secs(60));
    let (sid, token) = submitted(&app, &slug, None, "kim", json!({"prompt": "slow"})).await;
    support::wait_for(WITHIN, || async {
        (app.status(&sid, &token).await["step"] == "AI_PENDING").then_some(())
    })
    .await
    .expect("waiting for the AI");
    let (status, found) = app
        .operator_get(&format!(
            "/api/admin/sessions?nickname=KI&experience={slug}"
        ))
        .await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["sessions"][0]["session_id"], sid.as_str(), "{found}");
    let (status, body) = delete(&app, &format!("/api/admin/sessions/{sid}"), OPERATOR).await;
    assert_eq!(status, 200, "{body}");
    let view = app.status(&sid, &token).await;
    assert_eq!(view["status"], "ABORTED", "cancelled first: {view}");
    assert_eq!(view["erased"], true);
    let saga = app.saga_of(&sid).await;
    assert_eq!(saga["abort_reason"], "CANCELLED", "{saga}");
    let (status, found) = app
        .operator_get(&format!(
            "/api/admin/sessions?nickname=kim&experience={slug}"
        ))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        found["sessions"],
        json!([]),
        "an erased nickname is not found"
    );
    // An operator's retry cannot bring it back.
    let saga_id = saga["saga_id"].as_str().or(saga["id"].as_str()).unwrap();
    let (status, _, body) = app
        .operator_post(&format!("/api/admin/sagas/{saga_id}/retry"), None)
        .await;
    assert_eq!(status, 409, "{body}");
    app.stop().await;
}
db_test!(an_operator_erases_a_running_session);

/// The gallery: only completed, approved, not opted out, not hidden, not
/// erased results; newest first with keyset paging; a hide reaches the
/// display at once.
async fn the_gallery_shows_only_what_it_should(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = experience_with(
        &app,
        json!({"gallery": "public", "review": "before_display"}),
    )
    .await;
    let (terminal_id, terminal_token) = app.terminal(&slug).await;
    let mut display = app.terminal_socket(&terminal_id, &terminal_token, 0).await;
    let mut sessions = Vec::new();
    for (nickname, opt) in [
        ("shown", true),
        ("opted-out", false),
        ("hidden", true),
        ("erased", true),
        ("rejected", true),
        ("in-review", true),
    ] {
        let body = json!({"prompt": format!("a picture of {nickname}"), "in_gallery": opt});
        let (sid, token) = submitted(&app, &slug, Some(&terminal_id), nickname, body).await;
        sessions.push((nickname, sid, token));
    }
    // All six wait in review; each is decided as its name says.
    let items = support::wait_for(WITHIN, || async {
        let (_, body) = app.operator_get("/api/admin/review").await;
        let items = body["items"].as_array().cloned().unwrap_or_default();
        (items.len() == 6).then_some(items)
    })
    .await
    .expect("six in review");
    let saga_of = |nickname: &str| {
        items
            .iter()
            .find(|i| i["nickname"] == nickname)
            .and_then(|i| i["saga_id"].as_str())
            .unwrap_or_else(|| panic!("{nickname} in {items:?}"))
            .to_owned()
    };
    for (nickname, _, _) in &sessions[..4] {
        let (status, _, body) = app
            .operator_post(
                &format!("/api/admin/sagas/{}/approve", saga_of(nickname)),
                None,
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, _, _) = app
        .operator_post(
            &format!("/api/admin/sagas/{}/reject", saga_of("rejected")),
            None,
        )
        .await;
    assert_eq!(status, 200);
    for (_, sid, token) in &sessions[..5] {
        app.wait_final(sid, token, WITHIN).await;
    }
    let sid_of = |nickname: &str| {
        sessions
            .iter()
            .find(|(n, _, _)| *n == nickname)
            .map(|(_, sid, token)| (sid.clone(), token.clone()))
            .unwrap()
    };
    // Every completion reached the display first.
    let mut completed_seen = 0;
    while completed_seen < 4 {
        let frame = display.next_session_event(WITHIN).await.expect("a frame");
        if frame["type"] == "session.completed" {
            completed_seen += 1;
        }
    }
    let (hidden, _) = sid_of("hidden");
    let (status, _, body) = app
        .operator_post(&format!("/api/admin/sessions/{hidden}/hide"), None)
        .await;
    assert_eq!((status, &body["hidden"]), (200, &json!(true)), "{body}");
    let removed = display.next_session_event(WITHIN).await.expect("removed");
    assert_eq!(
        (&removed["type"], &removed["session_id"]),
        (&json!("session.removed"), &json!(hidden)),
        "{removed}"
    );
    let (erased, erased_token) = sid_of("erased");
    let (status, _) = delete(&app, &format!("/api/sessions/{erased}"), &erased_token).await;
    assert_eq!(status, 200);

    let page = app
        .get_json(&format!("/api/experiences/{slug}/gallery"))
        .await;
    let names: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["nickname"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["shown"], "{page}");
    assert_eq!(page["next"], Value::Null);
    assert_eq!(page["items"][0]["session_id"], sid_of("shown").0.as_str());
    assert!(
        page["items"][0]["content"][0]["url"]
            .as_str()
            .unwrap()
            .starts_with("/media/r/"),
        "{page}"
    );

    // Shown again, it comes back; paging goes newest first with no gap.
    let (status, _, _) = app
        .operator_post(&format!("/api/admin/sessions/{hidden}/unhide"), None)
        .await;
    assert_eq!(status, 200);
    let first = app
        .get_json(&format!("/api/experiences/{slug}/gallery?limit=1"))
        .await;
    let next = first["next"].as_str().expect("a next page").to_owned();
    let second = app
        .get_json(&format!(
            "/api/experiences/{slug}/gallery?limit=1&before={next}"
        ))
        .await;
    assert_eq!(second["next"], Value::Null, "{second}");
    let (a, b) = (&first["items"][0], &second["items"][0]);
    let mut names = [
        a["nickname"].as_str().unwrap(),
        b["nickname"].as_str().unwrap(),
    ];
    names.sort_unstable();
    assert_eq!(names, ["hidden", "shown"], "each once: {first} {second}");
    assert!(
        a["completed_at"].as_str() >= b["completed_at"].as_str(),
        "newest first: {first} {second}"
    );
    let bad = get(
        &app,
        &format!("/api/experiences/{slug}/gallery?before=nonsense"),
    )
    .await;
    assert_eq!(bad.status(), 422);
    app.stop().await;
}
db_test!(the_gallery_shows_only_what_it_should);

/// A gallery that is off is not there; a PIN gallery asks for its PIN,
/// refuses a wrong one, never shows the PIN or its hash, and limits the
/// requests of one client, the right PIN's too once the limit is reached.
async fn a_pin_gallery_keeps_its_pin(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let off = experience_with(&app, json!({})).await;
    assert_eq!(
        get(&app, &format!("/api/experiences/{off}/gallery"))
            .await
            .status(),
        404
    );
    let slug = experience_with(&app, json!({"gallery": "pin", "gallery_pin": "246810"})).await;
    completed(&app, &slug, None, "ana", json!({"prompt": "a boat"})).await;
    let (_, every) = app.operator_get(&format!("/api/experiences/{slug}")).await;
    let public = app.get_json(&format!("/api/experiences/{slug}")).await;
    for shown in [&every, &public] {
        let text = shown.to_string();
        assert!(
            !text.contains("246810") && !text.contains("pbkdf2"),
            "{text}"
        );
        assert_eq!(shown["gallery"], "pin");
    }
    let with_pin = |pin: Option<&'static str>| {
        let mut req = app
            .http
            .get(format!("{}/api/experiences/{slug}/gallery", app.base));
        if let Some(pin) = pin {
            req = req.header("X-Gallery-Pin", pin);
        }
        req.send()
    };
    let resp = with_pin(None).await.unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["error"],
        "gallery_pin_required"
    );
    let resp = with_pin(Some("123456")).await.unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["error"],
        "gallery_pin_wrong"
    );
    let resp = with_pin(Some("246810")).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["items"][0]["nickname"],
        "ana"
    );
    // Guessing: the limit's 30 requests a minute (two used above).
    let mut limited = None;
    for guess in 0..40 {
        let resp = with_pin(Some("000000")).await.unwrap();
        if resp.status() == 429 {
            limited = Some((guess, resp.headers().contains_key("retry-after")));
            break;
        }
        assert_eq!(resp.status(), 401);
    }
    let (guesses, retry_after) = limited.expect("limited within 40 guesses");
    assert!(
        (26..=30).contains(&guesses),
        "limited after {guesses} guesses"
    );
    assert!(retry_after);
    let resp = with_pin(Some("246810")).await.unwrap();
    assert_eq!(
        resp.status(),
        429,
        "the right PIN too: guessing learns nothing"
    );
    // Settings that cannot work are refused.
    for bad in [
        json!({"gallery": "pin"}),
        json!({"gallery": "pin", "gallery_pin": "12"}),
        json!({"gallery": "pin", "gallery_pin": "12345"}),
        json!({"gallery": "public", "gallery_pin": "1234"}),
        json!({"gallery": "everyone"}),
        json!({"retention": "0s"}),
        json!({"photo_retention": "soon"}),
        json!({"display_share_qr": "5m"}),
        json!({"notice": 42}),
        json!({"notice": {"fr": "bonjour"}}),
    ] {
        let mut body = json!({"slug": "bad-settings", "title": "x", "kind": "comic"});
        for (k, v) in bad.as_object().unwrap() {
            body[k] = v.clone();
        }
        let resp = app
            .http
            .post(format!("{}/api/experiences", app.base))
            .bearer_auth(OPERATOR)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 422, "{bad}");
    }
    app.stop().await;
}
db_test!(a_pin_gallery_keeps_its_pin);

/// Notice and consent: the page's data carries the organiser's texts,
/// and a submission without the guest's consent is refused (and nothing
/// runs).
async fn consent_is_asked_before_anything_runs(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = experience_with(
        &app,
        json!({
            "notice": {"en": "Kept 30 days.", "ko": "30일 보관합니다."},
            "consent_required": true,
            "display_share_qr": "8s",
        }),
    )
    .await;
    let public = app.get_json(&format!("/api/experiences/{slug}")).await;
    assert_eq!(public["notice"]["ko"], "30일 보관합니다.", "{public}");
    assert_eq!(public["consent_required"], true);
    assert_eq!(public["display_share_qr"], "8s");
    let (sid, token) = app.session(&slug, None, "ana").await;
    let resp = app
        .submit(
            &sid,
            &token,
            json!({"prompt": "a cat"}),
            &uuid::Uuid::new_v4().to_string(),
        )
        .await;
    assert_eq!(resp.status(), 422);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("consent"),
        "{body}"
    );
    assert_eq!(app.sim.control.stats().submits, 0, "nothing ran");
    let resp = app
        .submit(
            &sid,
            &token,
            json!({"prompt": "a cat", "consent": true}),
            &uuid::Uuid::new_v4().to_string(),
        )
        .await;
    assert_eq!(resp.status(), 202);
    app.stop().await;
}
db_test!(consent_is_asked_before_anything_runs);

/// Retention on the injected clock: after `photo_retention` the input
/// photo goes (the result stays); after `retention` the result, the
/// nickname, the prompt and the link go, the saga row stays counted, and
/// a session still running is not touched.
async fn retention_forgets_on_time_and_never_a_running_session(backend: Backend) {
    let clock = ManualClock::new(1_800_000_000_000);
    let app = TestApp::spawn_with_clock(backend, support::fast_sim(), |_| {}, clock.clone()).await;
    let slug = experience_with(
        &app,
        json!({"input": "photo", "photo_retention": "2s", "retention": "5s"}),
    )
    .await;
    let (done_sid, done_token) = photo_submitted(&app.http, &app.base, &slug, "ana").await;
    let done = app.wait_final(&done_sid, &done_token, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let share_url = done["share_url"].as_str().unwrap().to_owned();
    let results = kept_keys(&done);
    let photos_before: BTreeSet<String> = objects(&app)
        .into_iter()
        .filter(|k| k.starts_with("p/"))
        .collect();
    assert_eq!(photos_before.len(), 1, "{photos_before:?}");

    // A second guest's job runs long.
    app.sim.control.set_latency(Duration::from_secs(3600));
    let (running_sid, running_token) = photo_submitted(&app.http, &app.base, &slug, "bo").await;
    support::wait_for(WITHIN, || async {
        (app.status(&running_sid, &running_token).await["step"] == "AI_PENDING").then_some(())
    })
    .await
    .expect("running");
    let held_path = format!("/api/admin/experiences/{slug}/held");

    let before = app.operator_get(&held_path).await.1;
    assert_eq!(before["photos"], 2, "{before}");
    assert_eq!(before["results"], 1);
    assert_eq!(before["forgotten"], 0);
    assert!(before["next_purge_at"].is_string(), "{before}");

    // Not yet due: nothing goes.
    let report = app.app_cleanup.send(RunCleanup).await.unwrap();
    assert_eq!((report.photos_given_up, report.forgotten_sessions), (0, 0));

    clock.advance_ms(2_500);
    let report = app.app_cleanup.send(RunCleanup).await.unwrap();
    assert_eq!(report.photos_given_up, 1, "{report:?}");
    let left = objects(&app);
    assert!(
        photos_before.iter().all(|p| !left.contains(p)),
        "the photo is gone"
    );
    assert_eq!(
        left.iter().filter(|k| k.starts_with("p/")).count(),
        1,
        "the running session's photo stays: {left:?}"
    );
    assert!(results.iter().all(|k| left.contains(k)), "the result stays");
    assert_eq!(get(&app, &share_url).await.status(), 200);

    clock.advance_ms(3_000);
    let report = app.app_cleanup.send(RunCleanup).await.unwrap();
    assert_eq!(report.forgotten_sessions, 1, "{report:?}");
    assert!(report.purged_objects >= results.len() as u64, "{report:?}");
    let left = objects(&app);
    assert!(results.iter().all(|k| !left.contains(k)), "{left:?}");
    assert_eq!(get(&app, &share_url).await.status(), 410);
    let view = app.status(&done_sid, &done_token).await;
    assert_eq!(
        (&view["nickname"], &view["erased"]),
        (&json!(""), &json!(true)),
        "{view}"
    );
    let ranking = app
        .get_json(&format!("/api/experiences/{slug}/ranking"))
        .await;
    assert!(
        ranking["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["nickname"] == ""),
        "anonymised: {ranking}"
    );
    let after = app.operator_get(&held_path).await.1;
    assert_eq!(
        (&after["results"], &after["forgotten"]),
        (&json!(0), &json!(1)),
        "{after}"
    );
    assert_eq!(after["photos"], 1, "the running one's: {after}");
    // The statistics still count the saga.
    assert_eq!(app.saga_of(&done_sid).await["step"], "COMPLETED");
    // The running session was not touched.
    let running = app.status(&running_sid, &running_token).await;
    assert_eq!(
        (&running["nickname"], &running["step"], &running["erased"]),
        (&json!("bo"), &json!("AI_PENDING"), &json!(false)),
        "{running}"
    );
    // Another round finds nothing more (idempotent).
    let report = app.app_cleanup.send(RunCleanup).await.unwrap();
    assert_eq!(
        (
            report.forgotten_sessions,
            report.photos_given_up,
            report.purged_objects
        ),
        (0, 0, 0),
        "{report:?}"
    );
    app.stop().await;
}
db_test!(retention_forgets_on_time_and_never_a_running_session);

/// A purge cut short (the process died between forgetting a session and
/// deleting its objects, or between deleting them and marking them) is
/// finished by the next round, and deleting twice is harmless.
async fn a_purge_cut_short_is_finished_by_the_next_round(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = experience_with(&app, json!({})).await;
    let (a, _, done_a) = completed(&app, &slug, None, "ana", json!({"prompt": "one"})).await;
    let (b, _, done_b) = completed(&app, &slug, None, "bo", json!({"prompt": "two"})).await;
    let now = app.state.clock.now_ms();
    // Step 1 committed, step 2 never ran: as after a kill -9 between them.
    for sid in [&a, &b] {
        let forgot = app
            .state
            .store
            .forget_session(
                sid,
                stagehand::domain::guests::ForgottenBy::Operator,
                None,
                now,
            )
            .await
            .unwrap();
        assert!(matches!(
            forgot,
            stagehand::store::guests::Forget::Forgotten { .. }
        ));
    }
    // For b, its objects were deleted but the row not marked.
    for key in kept_keys(&done_b) {
        app.state.media.delete(&key).await.unwrap();
    }
    let report = app.app_cleanup.send(RunCleanup).await.unwrap();
    assert_eq!(report.failed, 0, "{report:?}");
    let left = objects(&app);
    for key in kept_keys(&done_a).iter().chain(&kept_keys(&done_b)) {
        assert!(!left.contains(key), "{key} in {left:?}");
    }
    let report = app.app_cleanup.send(RunCleanup).await.unwrap();
    assert_eq!(report.purged_objects, 0, "nothing left: {report:?}");
    app.stop().await;
}
db_test!(a_purge_cut_short_is_finished_by_the_next_round);

/// The export: a ZIP of every kept file of the sessions not erased, and a
/// results.csv that names them; each file is the kept object, byte for
/// byte.
async fn the_export_holds_every_kept_file_and_the_csv_names_them(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = experience_with(&app, json!({})).await;
    let mut kept = Vec::new();
    for nickname in ["ana", "=bo", "chul"] {
        let (sid, token, done) =
            completed(&app, &slug, None, nickname, json!({"prompt": nickname})).await;
        kept.push((sid, token, done));
    }
    let (erased, erased_token, _) = &kept[2];
    assert_eq!(
        delete(&app, &format!("/api/sessions/{erased}"), erased_token)
            .await
            .0,
        200
    );
    let resp = app
        .http
        .get(format!("{}/api/admin/experiences/{slug}/export", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401, "an operator's only");
    let resp = app
        .http
        .get(format!("{}/api/admin/experiences/{slug}/export", app.base))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/zip");
    let bytes = resp.bytes().await.unwrap();
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes.to_vec())).expect("a ZIP");
    let mut csv_text = String::new();
    std::io::Read::read_to_string(&mut zip.by_name("results.csv").unwrap(), &mut csv_text).unwrap();
    let mut rows = csv::Reader::from_reader(csv_text.as_bytes());
    let records: Vec<csv::StringRecord> = rows.records().map(Result::unwrap).collect();
    assert_eq!(records.len(), 2, "the erased one is left out: {csv_text}");
    assert_eq!(&records[0][1], "ana");
    assert_eq!(&records[1][1], "'=bo", "no formula for a spreadsheet");
    for (record, (sid, _, done)) in records.iter().zip(&kept) {
        assert_eq!(&record[0], sid.as_str());
        let names: Vec<&str> = record[5].split(' ').collect();
        assert_eq!(names.len(), 1, "{record:?}");
        let mut inside = Vec::new();
        std::io::Read::read_to_end(
            &mut zip.by_name(names[0]).expect("listed file"),
            &mut inside,
        )
        .unwrap();
        let url = done["result"]["content"][0]["url"].as_str().unwrap();
        let served = get(&app, url).await.bytes().await.unwrap();
        assert_eq!(inside, served.to_vec(), "{url}");
    }
    assert_eq!(zip.len(), 4, "the two CSVs and two files");
    // What operators did to the experience comes with it, newest first
    // (a guest's own erasure is no operator's action).
    let mut audit = String::new();
    std::io::Read::read_to_string(
        &mut zip.by_name("audit.csv").expect("audit.csv"),
        &mut audit,
    )
    .unwrap();
    let actions: Vec<String> = csv::Reader::from_reader(audit.as_bytes())
        .records()
        .map(|r| r.unwrap()[3].to_owned())
        .collect();
    assert_eq!(
        actions.first().map(String::as_str),
        Some("experience.export"),
        "{audit}"
    );
    assert!(!actions.iter().any(|a| a == "session.erase"), "{audit}");
    assert_eq!(
        actions.last().map(String::as_str),
        Some("experience.create"),
        "{audit}"
    );
    app.stop().await;
}
db_test!(the_export_holds_every_kept_file_and_the_csv_names_them);

/// Retention on PostgreSQL with two instances sharing the S3 server, both
/// running the purge (every 200 ms): every object of the expired sessions
/// goes from the bucket (listed), their fields are blank, their sagas are
/// still counted, and the session still running keeps its photo and its
/// nickname.
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn two_instances_purge_the_bucket_and_leave_a_running_session_alone() {
    const N: usize = 6;
    support::S3Server::credentials_in_env();
    let s3 = support::S3Server::start("guests").await;
    let url = s3.media_url("guests");
    let url_b = url.clone();
    let app = TestApp::spawn_with(Backend::Postgres, support::fast_sim(), move |c| {
        c.media_url = Some(url);
        c.cleanup_interval = Duration::from_millis(200);
    })
    .await;
    let b = support::Instance::start(&app.db, &app.sim.url(), move |c| {
        c.media_url = Some(url_b);
        c.cleanup_interval = Duration::from_millis(200);
    })
    .await;
    let slug = experience_with(
        &app,
        json!({"input": "photo", "photo_retention": "1s", "retention": "3s"}),
    )
    .await;
    let bucket = || -> BTreeSet<String> {
        support::files_under(&s3.root.path().join("guests"))
            .into_iter()
            .filter(|k| !k.contains(".s3s"))
            .collect()
    };
    let mut done = Vec::new();
    for i in 0..N {
        let base = if i % 2 == 0 {
            app.base.clone()
        } else {
            b.base.clone()
        };
        done.push(photo_submitted(&app.http, &base, &slug, "guest").await);
    }
    let finals = support::wait_all_final(&app.http, &app.base, &done, WITHIN)
        .await
        .expect("all final");
    assert!(
        finals.iter().all(|f| f["status"] == "COMPLETED"),
        "{finals:?}"
    );
    app.sim.control.set_latency(Duration::from_secs(3600));
    let (running_sid, running_token) =
        photo_submitted(&app.http, &b.base, &slug, "still-here").await;
    support::wait_for(WITHIN, || async {
        (app.status(&running_sid, &running_token).await["step"] == "AI_PENDING").then_some(())
    })
    .await
    .expect("running");
    let running_photo: BTreeSet<String> = {
        let store = &app.state.store;
        let saga = store
            .latest_saga_of_session(&running_sid)
            .await
            .unwrap()
            .unwrap();
        let photo = store
            .photo(saga.photo_id.as_deref().unwrap())
            .await
            .unwrap()
            .unwrap();
        [photo.object_key].into()
    };
    let held_path = format!("/api/admin/experiences/{slug}/held");
    let purged = support::wait_for(WITHIN, || async {
        let held = app.operator_get(&held_path).await.1;
        (held["forgotten"] == N && bucket() == running_photo).then_some(held)
    })
    .await;
    assert!(
        purged.is_some(),
        "the bucket still holds {:?} (the running photo is {running_photo:?}): {}",
        bucket(),
        app.operator_get(&held_path).await.1
    );
    for ((sid, token), before) in done.iter().zip(&finals) {
        let view = app.status(sid, token).await;
        assert_eq!(
            (&view["nickname"], &view["erased"]),
            (&json!(""), &json!(true)),
            "{view}"
        );
        let share = before["share_url"].as_str().unwrap();
        assert_eq!(get(&app, share).await.status(), 410);
        assert_eq!(app.saga_of(sid).await["step"], "COMPLETED", "still counted");
    }
    let running = app.status(&running_sid, &running_token).await;
    assert_eq!(
        (&running["nickname"], &running["step"]),
        (&json!("still-here"), &json!("AI_PENDING")),
        "{running}"
    );
    b.stop().await;
    app.stop().await;
}
