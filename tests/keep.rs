//! Results kept (issue 33): every output file of a job is copied into the
//! media store before the result is recorded, and served by stagehand at
//! `/media/r/…` from then on, whatever the provider does with its copy.
//! Through HTTP on SQLite and PostgreSQL, on the local folder and on a
//! real S3-compatible server (s3s-fs on 127.0.0.1).

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{Backend, S3Server, TestApp};

/// Runs one prompt session to its end.
async fn completed(app: &TestApp, slug: &str, prompt: &str) -> Value {
    completed_at(app, slug, None, prompt).await
}

/// The same, scanned at the booth `terminal`.
async fn completed_at(app: &TestApp, slug: &str, terminal: Option<&str>, prompt: &str) -> Value {
    let (sid, token) = app.session(slug, terminal, "ana").await;
    let resp = app
        .submit(&sid, &token, json!({"prompt": prompt}), &uuid::Uuid::new_v4().to_string())
        .await;
    assert_eq!(resp.status(), 202);
    app.wait_final(&sid, &token, Duration::from_secs(30)).await
}

/// The one kept file of a completed session: its `/media/…` path.
fn kept_url(done: &Value) -> String {
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let url = done["result"]["content"][0]["url"].as_str().unwrap_or_default().to_owned();
    assert!(url.starts_with("/media/r/"), "this server's URL, not the provider's: {done}");
    url
}

async fn get(app_base: &str, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = reqwest::Client::new().get(format!("{app_base}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("GET")
}

/// A result stays on the display and the phone after the provider is gone
/// entirely: its file is stagehand's, immutable, with a
/// strong ETag, ranges and `nosniff`.
async fn a_result_outlives_the_provider(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = app.experience(5).await;
    let (terminal_id, terminal_token) = app.terminal(&slug).await;
    let mut display = app.terminal_socket(&terminal_id, &terminal_token, 0).await;
    let done = completed_at(&app, &slug, Some(&terminal_id), "a lighthouse at dawn").await;
    let url = kept_url(&done);
    let shown = display
        .next_session_event(Duration::from_secs(10))
        .await
        .expect("the display's event");
    assert_eq!(shown["type"], "session.completed", "{shown}");
    assert_eq!(shown["result"]["content"][0]["url"], url.as_str(), "the display shows the kept file: {shown}");
    let provider_copy = app.sim.control.stats();
    assert!(provider_copy.jobs_created >= 1);
    // The provider goes away for good.
    let sim_url = app.sim.url();
    let TestApp { sim, .. } = &app;
    sim.control.set_down(true);
    assert!(
        reqwest::get(format!("{sim_url}/v1/stats")).await.map(|r| r.status().as_u16()).unwrap_or(0) != 200,
        "the provider answers nothing"
    );
    let resp = get(&app.base, &url, &[]).await;
    assert_eq!(resp.status(), 200);
    let headers = resp.headers().clone();
    assert_eq!(headers["cache-control"], "public, max-age=31536000, immutable");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["content-type"], "image/svg+xml");
    let etag = headers["etag"].to_str().unwrap().to_owned();
    assert!(etag.starts_with('"'), "a strong ETag: {etag}");
    let body = resp.bytes().await.unwrap();
    assert!(body.starts_with(b"<svg") || body.starts_with(b"<?xml"), "the picture");
    let again = get(&app.base, &url, &[("if-none-match", &etag)]).await;
    assert_eq!(again.status(), 304);
    let part = get(&app.base, &url, &[("range", "bytes=0-9")]).await;
    assert_eq!(part.status(), 206);
    assert_eq!(part.headers()["content-range"], format!("bytes 0-9/{}", body.len()).as_str());
    assert_eq!(part.bytes().await.unwrap(), body.slice(0..10));
    // A key nobody made is 404; a probe or a path outside is never served.
    let unknown = get(&app.base, "/media/r/0123456789abcdef0123456789abcdef.png", &[]).await;
    assert_eq!(unknown.status(), 404);
    assert_eq!(get(&app.base, "/media/probe/x", &[]).await.status(), 404);
    app.stop().await;
}
db_test!(a_result_outlives_the_provider);

/// Two instances on one PostgreSQL database and one S3 bucket: a result
/// that instance A kept is served by instance B. (SQLite is one instance.)
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn instance_b_serves_what_instance_a_kept_on_s3() {
    S3Server::credentials_in_env();
    let s3 = S3Server::start("shared").await;
    let url = s3.media_url("shared");
    let url_b = url.clone();
    let app = TestApp::spawn_with(Backend::Postgres, support::fast_sim(), move |c| {
        c.media_url = Some(url);
    })
    .await;
    let slug = app.experience(5).await;
    let done = completed(&app, &slug, "a harbour in the rain").await;
    let kept = kept_url(&done);
    let b = support::Instance::start(&app.db, &app.sim.url(), move |c| {
        c.media_url = Some(url_b);
    })
    .await;
    let from_a = get(&app.base, &kept, &[]).await.bytes().await.unwrap();
    let resp = get(&b.base, &kept, &[]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap(), from_a, "the same file from the other instance");
    b.stop().await;
    app.stop().await;
}

/// The S3 server stops while sagas run: they wait (no new AI job, nothing
/// lost) and complete when it is back; an upload meanwhile is 503
/// `media_unavailable` with Retry-After.
async fn sagas_wait_for_the_media_store_and_complete(backend: Backend) {
    S3Server::credentials_in_env();
    let mut s3 = S3Server::start("media").await;
    let url = s3.media_url("media");
    let app = TestApp::spawn_with(backend, support::fast_sim(), move |c| {
        c.media_url = Some(url);
    })
    .await;
    let slug = app.experience(5).await;
    s3.stop();
    let mut sessions = Vec::new();
    for i in 0..3 {
        let (sid, token) = app.session(&slug, None, &format!("guest {i}")).await;
        let resp = app
            .submit(&sid, &token, json!({"prompt": format!("picture {i}")}), &uuid::Uuid::new_v4().to_string())
            .await;
        assert_eq!(resp.status(), 202);
        sessions.push((sid, token));
    }
    // Every job ran and succeeded at the provider; keeping waits.
    let jobs_done = support::wait_for(Duration::from_secs(20), || async {
        let stats = app.sim.control.stats();
        (stats.jobs_created == 3 && stats.running == 0).then_some(())
    })
    .await;
    assert!(jobs_done.is_some(), "{:?}", app.sim.control.stats());
    for (sid, token) in &sessions {
        let now = app.status(sid, token).await;
        assert_ne!(now["status"], "COMPLETED", "not completed while nothing could be kept: {now}");
        assert_ne!(now["status"], "ABORTED", "{now}");
    }
    let photo_slug = {
        let slug = format!("ph-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let resp = app
            .http
            .post(format!("{}/api/experiences", app.base))
            .bearer_auth(support::OPERATOR)
            .json(&json!({"slug": slug, "title": "Photos", "kind": "comic", "input": "photo"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        slug
    };
    let (psid, ptoken) = app.session(&photo_slug, None, "pat").await;
    let upload = app
        .http
        .post(format!("{}/api/sessions/{psid}/photo", app.base))
        .bearer_auth(&ptoken)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .body(include_bytes!("fixtures/photo-small.png").to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status(), 503);
    assert!(upload.headers().get("retry-after").is_some());
    let body: Value = upload.json().await.unwrap();
    assert_eq!(body["error"], "media_unavailable", "{body}");
    s3.resume().await;
    for (sid, token) in &sessions {
        let done = app.wait_final(sid, token, Duration::from_secs(60)).await;
        let url = kept_url(&done);
        assert_eq!(get(&app.base, &url, &[]).await.status(), 200);
    }
    assert_eq!(app.sim.control.stats().jobs_created, 3, "no second AI job");
    app.stop().await;
}
db_test!(sagas_wait_for_the_media_store_and_complete);
