//! Results kept (issue 33): every output file of a job is copied into the
//! media store before the result is recorded, and served by stagehand at
//! `/media/r/…` from then on, whatever the provider does with its copy.
//! Through HTTP on SQLite and PostgreSQL, on the local folder and on a
//! real S3-compatible server (s3s-fs on 127.0.0.1).

mod support;

use std::time::Duration;

use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::{json, Value};
use stagehand::store::entities::sagas;
use support::{Backend, S3Server, TestApp};

/// Runs one prompt session to its end.
async fn completed(app: &TestApp, slug: &str, prompt: &str) -> Value {
    completed_at(app, slug, None, prompt).await
}

/// The same, scanned at the booth `terminal`.
async fn completed_at(app: &TestApp, slug: &str, terminal: Option<&str>, prompt: &str) -> Value {
    let (sid, token) = app.session(slug, terminal, "ana").await;
    let resp = app
        .submit(
            &sid,
            &token,
            json!({"prompt": prompt}),
            &uuid::Uuid::new_v4().to_string(),
        )
        .await;
    assert_eq!(resp.status(), 202);
    app.wait_final(&sid, &token, Duration::from_secs(30)).await
}

/// The one kept file of a completed session: its `/media/…` path.
fn kept_url(done: &Value) -> String {
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let url = done["result"]["content"][0]["url"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        url.starts_with("/media/r/"),
        "this server's URL, not the provider's: {done}"
    );
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
    assert_eq!(
        shown["result"]["content"][0]["url"],
        url.as_str(),
        "the display shows the kept file: {shown}"
    );
    let provider_copy = app.sim.control.stats();
    assert!(provider_copy.jobs_created >= 1);
    // The provider goes away for good.
    let sim_url = app.sim.url();
    let TestApp { sim, .. } = &app;
    sim.control.set_down(true);
    assert!(
        reqwest::get(format!("{sim_url}/v1/stats"))
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
            != 200,
        "the provider answers nothing"
    );
    let resp = get(&app.base, &url, &[]).await;
    assert_eq!(resp.status(), 200);
    let headers = resp.headers().clone();
    assert_eq!(
        headers["cache-control"],
        "public, max-age=31536000, immutable"
    );
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["content-type"], "image/svg+xml");
    let etag = headers["etag"].to_str().unwrap().to_owned();
    assert!(etag.starts_with('"'), "a strong ETag: {etag}");
    let body = resp.bytes().await.unwrap();
    assert!(
        body.starts_with(b"<svg") || body.starts_with(b"<?xml"),
        "the picture"
    );
    let again = get(&app.base, &url, &[("if-none-match", &etag)]).await;
    assert_eq!(again.status(), 304);
    let part = get(&app.base, &url, &[("range", "bytes=0-9")]).await;
    assert_eq!(part.status(), 206);
    assert_eq!(
        part.headers()["content-range"],
        format!("bytes 0-9/{}", body.len()).as_str()
    );
    assert_eq!(part.bytes().await.unwrap(), body.slice(0..10));
    // A key nobody made is 404; a probe or a path outside is never served.
    let unknown = get(
        &app.base,
        "/media/r/0123456789abcdef0123456789abcdef.png",
        &[],
    )
    .await;
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
    assert_eq!(
        resp.bytes().await.unwrap(),
        from_a,
        "the same file from the other instance"
    );
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
            .submit(
                &sid,
                &token,
                json!({"prompt": format!("picture {i}")}),
                &uuid::Uuid::new_v4().to_string(),
            )
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
        assert_ne!(
            now["status"], "COMPLETED",
            "not completed while nothing could be kept: {now}"
        );
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

/// An experience that takes a photo: its slug.
async fn photo_experience(app: &TestApp) -> String {
    let slug = format!("ph-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let resp = app
        .http
        .post(format!("{}/api/experiences", app.base))
        .bearer_auth(support::OPERATOR)
        .json(&json!({"slug": slug, "title": "Comic me", "kind": "comic", "input": "photo"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    slug
}

/// A photo goes to the provider (the simulator fetches it with the signed
/// URL it got in `params.input_url`), comes back as a comic PNG, is kept
/// with a thumbnail for the displays, and still shows after the provider
/// deleted its output (one second after the job, as Replicate does after
/// an hour).
async fn a_photo_comes_back_transformed_and_stays_after_the_provider_deletes_it(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    app.sim
        .control
        .set_delete_outputs_after(Some(Duration::from_secs(1)));
    let slug = photo_experience(&app).await;
    let (terminal_id, terminal_token) = app.terminal(&slug).await;
    let mut display = app.terminal_socket(&terminal_id, &terminal_token, 0).await;
    let (sid, token) = app.session(&slug, Some(&terminal_id), "ana").await;
    let photo = app
        .http
        .post(format!("{}/api/sessions/{sid}/photo", app.base))
        .bearer_auth(&token)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .body(include_bytes!("fixtures/photo-gps-rotated.jpg").to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(photo.status(), 201);
    let photo: Value = photo.json().await.unwrap();
    let resp = app
        .submit(
            &sid,
            &token,
            json!({"photo_id": photo["photo_id"]}),
            &uuid::Uuid::new_v4().to_string(),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let done = app.wait_final(&sid, &token, Duration::from_secs(30)).await;
    let url = kept_url(&done);
    assert!(url.ends_with(".png"), "the comic is a PNG: {done}");
    let thumb = done["result"]["content"][0]["thumb_url"]
        .as_str()
        .expect("a thumbnail")
        .to_owned();
    assert!(thumb.ends_with(".t.jpg"), "{thumb}");
    let shown = display
        .next_session_event(Duration::from_secs(10))
        .await
        .expect("the display's event");
    assert_eq!(
        shown["result"]["content"][0]["thumb_url"],
        thumb.as_str(),
        "{shown}"
    );
    // The provider's copy is gone a second after the job.
    assert_eq!(app.sim.control.stats().jobs_created, 1);
    let saga = sagas::Entity::find()
        .filter(sagas::Column::SessionId.eq(sid.as_str()))
        .one(app.state.store.db())
        .await
        .unwrap()
        .expect("the saga");
    let job_id = saga.ai_job_id.expect("its job");
    let provider_copy = format!("{}/v1/jobs/{job_id}/image.png", app.sim.url());
    let gone = support::wait_for(Duration::from_secs(10), || async {
        let status = reqwest::get(&provider_copy).await.ok()?.status();
        (status == 404).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the provider deleted its output");
    let full = get(&app.base, &url, &[]).await;
    assert_eq!(full.status(), 200);
    assert_eq!(full.headers()["content-type"], "image/png");
    let full = full.bytes().await.unwrap();
    let picture = image::load_from_memory(&full).expect("a real PNG");
    // Upright (portrait), at most 1024 px: the simulator draws at that size.
    assert_eq!(
        (picture.width(), picture.height()),
        (768, 1024),
        "the upright photo, as a comic"
    );
    let small = get(&app.base, &thumb, &[]).await;
    assert_eq!(small.status(), 200);
    let small = small.bytes().await.unwrap();
    let preview = image::load_from_memory(&small).expect("a real JPEG");
    assert_eq!(preview.height(), 640, "display size");
    assert!(small.len() < full.len(), "{} < {}", small.len(), full.len());
    app.stop().await;
}
db_test!(a_photo_comes_back_transformed_and_stays_after_the_provider_deletes_it);

/// A listener on another port of 127.0.0.1 that counts the connections it
/// gets: a refused URL must never reach it.
struct Trap {
    port: u16,
    hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Trap {
    fn start() -> Trap {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().unwrap().port();
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = hits.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(stream);
            }
        });
        Trap { port, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// No SSRF: a result URL on another port of 127.0.0.1, one on the cloud
/// metadata address, and a redirect from the provider's own origin to
/// them: nothing is fetched, and each attempt fails with a detail that
/// says why (the saga ends `AI_FAILED` once its attempts are used).
async fn result_urls_outside_the_providers_origins_are_never_fetched(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let trap = Trap::start();
    let slug = app.experience(5).await;
    let cases = [
        (
            "another port",
            Some(format!("http://127.0.0.1:{}/x.png", trap.port)),
            None,
        ),
        (
            "metadata",
            Some("http://169.254.169.254/latest/meta-data/".to_owned()),
            None,
        ),
        (
            "redirect",
            None,
            Some(format!("http://127.0.0.1:{}/x.png", trap.port)),
        ),
        (
            "redirect to metadata",
            None,
            Some("http://169.254.169.254/latest/meta-data/".to_owned()),
        ),
    ];
    for (what, url, redirect) in cases {
        app.sim.control.set_result_url_override(url);
        app.sim.control.set_image_redirect(redirect);
        let done = completed(&app, &slug, &format!("ssrf {what}")).await;
        assert_eq!(done["status"], "ABORTED", "{what}: {done}");
        assert_eq!(done["abort_reason"], "AI_FAILED", "{what}: {done}");
        let saga = app.saga_of(done["session_id"].as_str().unwrap()).await;
        let detail = saga["abort_detail"].as_str().unwrap_or_default();
        assert!(detail.contains("could not be kept"), "{what}: {saga}");
        assert!(
            detail.contains("nothing was fetched"),
            "{what}: says nothing was fetched: {saga}"
        );
    }
    assert_eq!(trap.hits(), 0, "the trap was never reached");
    app.stop().await;
}
db_test!(result_urls_outside_the_providers_origins_are_never_fetched);
