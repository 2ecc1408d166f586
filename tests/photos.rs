//! Photos in (issue 33): `POST /api/sessions/{id}/photo` through HTTP, on
//! SQLite and PostgreSQL. What a participant's phone may send and what the
//! server keeps of it: the format by its bytes, limits before decoding, no
//! metadata in the stored copy, a bounded pool that answers 503 past it,
//! and the rules a submission to a photo experience follows; then the
//! photo's way to the saga (`INPUT_MISSING` when it is gone, no AI job) and
//! the sweep of photos nobody submitted.

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{json, Value};
use stagehand::clock::ManualClock;
use stagehand::store::entities::photos;
use support::{Backend, TestApp, OPERATOR};

const GPS_ROTATED: &[u8] = include_bytes!("fixtures/photo-gps-rotated.jpg");
const SMALL_PNG: &[u8] = include_bytes!("fixtures/photo-small.png");

/// An experience that takes `input` (`photo`, `photo+prompt`, `prompt`).
async fn photo_experience(app: &TestApp, input: &str) -> String {
    let slug = format!("photo-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let resp = app
        .http
        .post(format!("{}/api/experiences", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"slug": slug, "title": "Photo booth", "kind": "comic", "input": input, "photo_max_px": 1024}))
        .send()
        .await
        .expect("POST /api/experiences");
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    slug
}

/// Uploads `body` with `content_type` as the session's photo.
async fn upload(
    app: &TestApp,
    sid: &str,
    token: &str,
    body: Vec<u8>,
    content_type: &str,
) -> (u16, Value) {
    let resp = app
        .http
        .post(format!("{}/api/sessions/{sid}/photo", app.base))
        .bearer_auth(token)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("POST photo");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A JPEG of `width` × `height` with something like a photo in it.
fn jpeg(width: u32, height: u32) -> Vec<u8> {
    let picture = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([
            (x * 7 % 256) as u8,
            (y * 5 % 256) as u8,
            ((x ^ y) % 256) as u8,
        ])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    picture
        .write_to(&mut out, image::ImageFormat::Jpeg)
        .expect("encode");
    out.into_inner()
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A PNG of a few dozen bytes that declares `side` × `side` pixels.
fn png_bomb(side: u32) -> Vec<u8> {
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8], data: &[u8]| {
        png.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut typed = kind.to_vec();
        typed.extend_from_slice(data);
        png.extend_from_slice(&typed);
        png.extend_from_slice(&crc32(&typed).to_be_bytes());
    };
    let mut ihdr = side.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&side.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(b"IHDR", &ihdr);
    chunk(b"IDAT", &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]);
    chunk(b"IEND", &[]);
    png
}

/// The stored copy of `photo_id`, read from the media store.
async fn stored_copy(app: &TestApp, photo_id: &str) -> (String, Vec<u8>) {
    let photo = app
        .state
        .store
        .photo(photo_id)
        .await
        .expect("read")
        .expect("the photo's row");
    let bytes = app
        .state
        .media
        .get(&photo.object_key)
        .await
        .expect("the stored copy");
    (photo.object_key, bytes.to_vec())
}

/// The fixture is 1200 × 900 with EXIF orientation 6 (turn 90° to stand
/// up), GPS, a camera and a serial: it is stored upright (900 × 1200,
/// within `photo_max_px` 1024: 768 × 1024) with no EXIF at all, whatever
/// Content-Type came with it, and only its owner (or an operator) reads it.
async fn a_photo_is_stored_upright_with_no_metadata(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = photo_experience(&app, "photo+prompt").await;
    let (sid, token) = app.session(&slug, None, "ana").await;
    // The bytes decide, not the header.
    let (status, body) = upload(&app, &sid, &token, GPS_ROTATED.to_vec(), "image/png").await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        (body["width"].as_u64(), body["height"].as_u64()),
        (Some(768), Some(1024)),
        "upright and downscaled: {body}"
    );
    let photo_id = body["photo_id"].as_str().expect("photo_id").to_owned();
    let (key, stored) = stored_copy(&app, &photo_id).await;
    assert_eq!(body["bytes"].as_u64(), Some(stored.len() as u64));
    assert!(
        matches!(
            exif::Reader::new().read_from_container(&mut std::io::Cursor::new(&stored)),
            Err(exif::Error::NotFound(_))
        ),
        "no EXIF survives (no GPS, no serial)"
    );
    assert!(
        GPS_ROTATED.windows(4).any(|w| w == b"Exif"),
        "the fixture itself has EXIF"
    );
    // A PNG with a JPEG header is taken as a PNG.
    let (status, body) = upload(&app, &sid, &token, SMALL_PNG.to_vec(), "image/jpeg").await;
    assert_eq!(status, 201, "{body}");
    // Read back: the owner, an operator; not another session, not anyone.
    let (_, other_token) = app.session(&slug, None, "ben").await;
    let read = |token: Option<String>| {
        let request = app.http.get(format!("{}/media/{key}", app.base));
        let request = match token {
            Some(t) => request.bearer_auth(t),
            None => request,
        };
        async move { request.send().await.expect("GET media") }
    };
    let own = read(Some(token.clone())).await;
    assert_eq!(own.status(), 200);
    assert_eq!(own.headers()["content-type"], "image/jpeg");
    assert_eq!(own.headers()["x-content-type-options"], "nosniff");
    assert_eq!(own.bytes().await.unwrap().to_vec(), stored);
    assert_eq!(read(Some(OPERATOR.to_owned())).await.status(), 200);
    assert_eq!(read(Some(other_token.clone())).await.status(), 401);
    assert_eq!(read(None).await.status(), 401);
    // Another session's token cannot upload to this session.
    let (status, body) = upload(&app, &sid, &other_token, SMALL_PNG.to_vec(), "image/png").await;
    assert_eq!(status, 401, "{body}");
    app.stop().await;
}
db_test!(a_photo_is_stored_upright_with_no_metadata);

/// Each bad upload gets its own clear answer, and nothing is stored.
async fn bad_uploads_are_refused_clearly(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = photo_experience(&app, "photo").await;
    let (sid, token) = app.session(&slug, None, "ana").await;
    let (status, body) = upload(
        &app,
        &sid,
        &token,
        b"just some text, not a picture".to_vec(),
        "image/jpeg",
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (415, Some("unsupported_media_type")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("JPEG, PNG or WebP"),
        "{body}"
    );
    let bomb = png_bomb(30_000);
    assert!(bomb.len() < 4096, "a few bytes: {}", bomb.len());
    let (status, body) = upload(&app, &sid, &token, bomb, "image/png").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (422, Some("photo_unreadable")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("30000 × 30000"),
        "names the size: {body}"
    );
    let whole = jpeg(600, 400);
    let (status, body) = upload(
        &app,
        &sid,
        &token,
        whole[..whole.len() / 2].to_vec(),
        "image/jpeg",
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (422, Some("photo_unreadable")),
        "a truncated JPEG: {body}"
    );
    // No Idempotency-Key.
    let resp = app
        .http
        .post(format!("{}/api/sessions/{sid}/photo", app.base))
        .bearer_auth(&token)
        .body(SMALL_PNG.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    // A prompt experience takes no photo (judged before the body is
    // read: tests/hostile_uploads.rs).
    let prompt_only = photo_experience(&app, "prompt").await;
    let (psid, ptoken) = app.session(&prompt_only, None, "cy").await;
    let (status, body) = upload(&app, &psid, &ptoken, SMALL_PNG.to_vec(), "image/png").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("photo_not_taken")),
        "{body}"
    );
    for session in [&sid, &psid] {
        let stored = photos::Entity::find()
            .filter(photos::Column::SessionId.eq(session.as_str()))
            .count(app.state.store.db())
            .await
            .unwrap();
        assert_eq!(stored, 0, "nothing was stored");
    }
    app.stop().await;
}
db_test!(bad_uploads_are_refused_clearly);

/// A body declared past `max_photo_bytes` (10 MiB) is answered 413 at once:
/// the client has sent 64 KiB of its 20 MiB when the answer comes.
#[actix_web::test]
async fn a_20_mib_body_is_refused_before_it_is_read() {
    let app = TestApp::spawn(Backend::Sqlite).await;
    let slug = photo_experience(&app, "photo").await;
    let (sid, token) = app.session(&slug, None, "ana").await;
    let port = app.port;
    let answer = tokio::task::spawn_blocking(move || {
        let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let head = format!(
            "POST /api/sessions/{sid}/photo HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
             Idempotency-Key: {}\r\nContent-Type: image/jpeg\r\nContent-Length: {}\r\n\r\n",
            uuid::Uuid::new_v4(),
            20 * 1024 * 1024
        );
        socket.write_all(head.as_bytes()).expect("head");
        socket.write_all(&vec![0xFF; 64 * 1024]).expect("a first part of the body");
        let mut answer = vec![0; 4096];
        let n = socket.read(&mut answer).expect("an answer before the rest of the body");
        String::from_utf8_lossy(&answer[..n]).into_owned()
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    app.stop().await;
}

/// 50 uploads at once into a pool of 2 workers and no queue: the excess is
/// 503 `photo_pool_full` with Retry-After, never another 5xx, and those
/// taken are stored.
#[actix_web::test]
async fn fifty_parallel_uploads_with_a_pool_of_two() {
    let app = TestApp::spawn_with(Backend::Sqlite, support::fast_sim(), |c| {
        c.photo_workers = Some(2);
        c.photo_queue = 0;
    })
    .await;
    let slug = photo_experience(&app, "photo").await;
    let photo = jpeg(3000, 2000);
    let mut sessions = Vec::new();
    for i in 0..50 {
        sessions.push(app.session(&slug, None, &format!("guest {i}")).await);
    }
    let uploads = sessions.iter().map(|(sid, token)| {
        let request = app
            .http
            .post(format!("{}/api/sessions/{sid}/photo", app.base))
            .bearer_auth(token)
            .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .body(photo.clone());
        async move {
            let resp = request.send().await.expect("POST photo");
            let retry_after = resp.headers().get("retry-after").is_some();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            (status, retry_after, body)
        }
    });
    let answers = futures_util::future::join_all(uploads).await;
    let stored = answers.iter().filter(|a| a.0 == 201).count();
    let refused: Vec<_> = answers.iter().filter(|a| a.0 == 503).collect();
    assert_eq!(stored + refused.len(), 50, "only 201 or 503: {answers:?}");
    assert!(stored >= 2, "the pool took some: {stored}");
    assert!(
        !refused.is_empty(),
        "the excess is refused, not queued without bound"
    );
    for (_, retry_after, body) in &refused {
        assert!(*retry_after, "503 says when to retry");
        assert_eq!(body["error"], "photo_pool_full", "{body}");
    }
    app.stop().await;
}

/// A photo experience needs the photo, of this session; a prompt
/// experience takes none. Each refusal is a 422 that says why.
async fn a_submission_names_its_own_photo(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = photo_experience(&app, "photo+prompt").await;
    let (sid, token) = app.session(&slug, None, "ana").await;
    let (other_sid, other_token) = app.session(&slug, None, "ben").await;
    let (_, theirs) = upload(
        &app,
        &other_sid,
        &other_token,
        SMALL_PNG.to_vec(),
        "image/png",
    )
    .await;
    let key = || uuid::Uuid::new_v4().to_string();
    let refused = |resp: reqwest::Response| async move {
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        (
            status,
            body["message"].as_str().unwrap_or_default().to_owned(),
        )
    };
    let (status, message) = refused(
        app.submit(&sid, &token, json!({"prompt": "a comic"}), &key())
            .await,
    )
    .await;
    assert_eq!(status, 422);
    assert!(message.contains("photo_id is required"), "{message}");
    let (status, message) = refused(
        app.submit(
            &sid,
            &token,
            json!({"prompt": "a comic", "photo_id": theirs["photo_id"]}),
            &key(),
        )
        .await,
    )
    .await;
    assert_eq!(status, 422);
    assert!(
        message.contains("not a photo uploaded to this session"),
        "{message}"
    );
    let (_, mine) = upload(&app, &sid, &token, SMALL_PNG.to_vec(), "image/png").await;
    let (status, message) = refused(
        app.submit(&sid, &token, json!({"photo_id": mine["photo_id"]}), &key())
            .await,
    )
    .await;
    assert_eq!(status, 422, "photo+prompt needs the prompt too");
    assert!(message.contains("prompt"), "{message}");
    let accepted = app
        .submit(
            &sid,
            &token,
            json!({"prompt": "a comic", "photo_id": mine["photo_id"]}),
            &key(),
        )
        .await;
    assert_eq!(accepted.status(), 202);
    let done = app.wait_final(&sid, &token, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let prompt_only = photo_experience(&app, "prompt").await;
    let (psid, ptoken) = app.session(&prompt_only, None, "cy").await;
    let (status, message) = refused(
        app.submit(
            &psid,
            &ptoken,
            json!({"prompt": "x", "photo_id": mine["photo_id"]}),
            &key(),
        )
        .await,
    )
    .await;
    assert_eq!(status, 422);
    assert!(message.contains("takes no photo"), "{message}");
    app.stop().await;
}
db_test!(a_submission_names_its_own_photo);

/// A photo that is gone from the media store when the saga needs it ends
/// the saga `INPUT_MISSING` at once, with a human message, and no AI job
/// is made.
async fn a_missing_photo_aborts_input_missing_without_an_ai_job(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = photo_experience(&app, "photo").await;
    let (sid, token) = app.session(&slug, None, "ana").await;
    let (_, photo) = upload(&app, &sid, &token, SMALL_PNG.to_vec(), "image/png").await;
    let photo_id = photo["photo_id"].as_str().unwrap().to_owned();
    let (key, _) = stored_copy(&app, &photo_id).await;
    app.state
        .media
        .delete(&key)
        .await
        .expect("delete the object");
    let resp = app
        .submit(
            &sid,
            &token,
            json!({"photo_id": photo_id}),
            &uuid::Uuid::new_v4().to_string(),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let done = app.wait_final(&sid, &token, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "ABORTED", "{done}");
    assert_eq!(done["abort_reason"], "INPUT_MISSING", "{done}");
    assert!(
        done["message"]
            .as_str()
            .unwrap_or_default()
            .contains("photo"),
        "a human message: {done}"
    );
    assert_eq!(app.sim.control.stats().jobs_created, 0, "no AI job");
    app.stop().await;
}
db_test!(a_missing_photo_aborts_input_missing_without_an_ai_job);

/// The cleanup sweep deletes a photo nobody submitted once
/// `photo_orphan_ttl` (1 h, the default) has passed, object then row: the
/// first round after it marks the photo (no submission may name it from
/// then on), a round once no submission that read it can still commit
/// deletes it; a photo a saga names stays, however old.
async fn orphan_photos_are_swept_and_submitted_ones_stay(backend: Backend) {
    let clock = ManualClock::new(1_800_000_000_000);
    let app = TestApp::spawn_with_clock(backend, support::fast_sim(), |_| {}, clock.clone()).await;
    let slug = photo_experience(&app, "photo").await;
    let (sid, token) = app.session(&slug, None, "ana").await;
    let (orphan_sid, orphan_token) = app.session(&slug, None, "ben").await;
    let (_, orphan) = upload(
        &app,
        &orphan_sid,
        &orphan_token,
        SMALL_PNG.to_vec(),
        "image/png",
    )
    .await;
    let (_, kept) = upload(&app, &sid, &token, SMALL_PNG.to_vec(), "image/png").await;
    let (orphan_key, _) = stored_copy(&app, orphan["photo_id"].as_str().unwrap()).await;
    let (kept_key, _) = stored_copy(&app, kept["photo_id"].as_str().unwrap()).await;
    let resp = app
        .submit(
            &sid,
            &token,
            json!({"photo_id": kept["photo_id"]}),
            &uuid::Uuid::new_v4().to_string(),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let run = || async {
        app.app_cleanup
            .send(stagehand::actors::cleanup::RunCleanup)
            .await
            .expect("cleanup round")
    };
    assert_eq!(run().await.orphan_photos, 0, "not an hour old yet");
    let orphan_row = || async {
        app.state
            .store
            .photo(orphan["photo_id"].as_str().unwrap())
            .await
            .unwrap()
    };
    clock.advance_ms(3_600_000 + 1_000);
    assert_eq!(run().await.orphan_photos, 0, "marked, not yet deleted");
    assert!(orphan_row().await.is_some());
    clock.advance_ms(stagehand::store::photos::SWEEP_GRACE_MS + 1_000);
    let report = run().await;
    assert_eq!(report.orphan_photos, 1, "{report:?}");
    assert!(orphan_row().await.is_none());
    assert!(matches!(
        app.state.media.get(&orphan_key).await,
        Err(stagehand::media::MediaError::NotFound(_))
    ));
    assert!(app
        .state
        .store
        .photo(kept["photo_id"].as_str().unwrap())
        .await
        .unwrap()
        .is_some());
    assert!(
        app.state.media.get(&kept_key).await.is_ok(),
        "a submitted photo stays"
    );
    app.stop().await;
}
db_test!(orphan_photos_are_swept_and_submitted_ones_stay);

/// The server as a user starts it (no `--photo-workers`) runs one photo
/// worker fewer than the cores, at least one, each below the server's CPU
/// priority: a burst of uploads never holds every core of a machine with
/// two or more (docs/BENCHMARKS.md §27: with a worker on each of two
/// cores, the 202's p99 of prompt submissions at 200/s during a burst was
/// 25-33 ms; with one core left free, 10-16 ms).
#[tokio::test]
async fn the_default_photo_pool_leaves_a_core_to_the_rest_of_the_server() {
    let db = support::TestDb::fresh(Backend::Sqlite).await;
    let sim = support::start_sim(support::fast_sim()).await;
    let http = support::http_client();
    let mut logs = support::Logs::new();
    let server = support::Server::start_with(
        &db.url,
        &sim.url(),
        &logs.next(),
        &http,
        &[("STAGEHAND_PHOTO_WORKERS", "")],
    )
    .await;
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let workers = photo_worker_nice_levels(server.pid);
    assert_eq!(
        workers.len(),
        cores.saturating_sub(1).max(1),
        "photo workers on {cores} cores (their nice levels: {workers:?})"
    );
    assert!(workers.iter().all(|nice| *nice >= 10), "{workers:?}");
}

/// The nice level of each `photo-N` thread of process `pid`, from /proc.
fn photo_worker_nice_levels(pid: u32) -> Vec<i64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the server's threads");
    let mut levels = Vec::new();
    for task in tasks {
        let dir = task.expect("a thread").path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !name.starts_with("photo-") {
            continue;
        }
        // stat: "pid (comm) state ..."; nice is the 19th field, the 17th
        // after the comm's closing parenthesis.
        let stat = std::fs::read_to_string(dir.join("stat")).expect("a thread's stat");
        let after = &stat[stat.rfind(')').expect("comm") + 2..];
        let nice = after
            .split_whitespace()
            .nth(16)
            .expect("nice")
            .parse()
            .expect("a number");
        levels.push(nice);
    }
    levels
}
