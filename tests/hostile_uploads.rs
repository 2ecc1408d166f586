//! The hostile guest at the upload desk (issue 45), black box over HTTP on
//! SQLite and PostgreSQL. A booth's QR code is public: whoever holds a
//! session may open slow uploads, upload again and again, or send a small
//! file that decodes into a huge one. None of it may stop another guest's
//! photo, fill the disk or the memory, or reach a 5xx.

mod support;

use std::time::{Duration, Instant};

use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{json, Value};
use stagehand::store::entities::photos;
use support::{Backend, TestApp, OPERATOR};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SMALL_PNG: &[u8] = include_bytes!("fixtures/photo-small.png");
const GPS_ROTATED: &[u8] = include_bytes!("fixtures/photo-gps-rotated.jpg");
/// 7071 × 7071, 16 bits a channel, RGBA, all zero: 389 KB that decode into
/// 400 MB (and 600 MB at the peak of a conversion to 8 bits).
const PNG16_RGBA: &[u8] = include_bytes!("fixtures/png16-rgba-7071.png");

/// An experience that takes `input`.
async fn experience(app: &TestApp, input: &str) -> String {
    let slug = format!("hu-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let resp = app
        .http
        .post(format!("{}/api/experiences", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"slug": slug, "title": "Photo booth", "kind": "comic", "input": input}))
        .send()
        .await
        .expect("POST /api/experiences");
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    slug
}

/// One upload of `body` under a fresh key: its status and JSON body.
async fn upload(app: &TestApp, sid: &str, token: &str, body: Vec<u8>) -> (u16, Value) {
    upload_replacing(app, sid, token, body, None).await
}

/// [`upload`] as a retake of the photo `replaces`.
async fn upload_replacing(
    app: &TestApp,
    sid: &str,
    token: &str,
    body: Vec<u8>,
    replaces: Option<&str>,
) -> (u16, Value) {
    let query = replaces.map_or(String::new(), |id| format!("?replaces={id}"));
    let resp = app
        .http
        .post(format!("{}/api/sessions/{sid}/photo{query}", app.base))
        .bearer_auth(token)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .body(body)
        .send()
        .await
        .expect("POST photo");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// An upload that declares `declared` bytes, sends its head and first byte,
/// and then as little as its sender chooses: what a hostile guest (or a
/// phone on a dead Wi-Fi) holds open.
struct SlowUpload {
    socket: TcpStream,
}

impl SlowUpload {
    /// Opens the upload and waits until the server took its head (`Expect:
    /// 100-continue`: the server answers `100 Continue` once the request
    /// is dispatched to the handler).
    async fn open(port: u16, sid: &str, token: &str, declared: usize) -> SlowUpload {
        let mut socket = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let head = format!(
            "POST /api/sessions/{sid}/photo HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
             Idempotency-Key: {}\r\nContent-Type: image/jpeg\r\nContent-Length: {declared}\r\n\
             Expect: 100-continue\r\n\r\n",
            uuid::Uuid::new_v4(),
        );
        socket.write_all(head.as_bytes()).await.expect("head");
        // The interim answer alone, byte by byte: a final answer may follow
        // it at once, and stays unread for `answer`.
        let mut interim = Vec::new();
        while !interim.ends_with(b"\r\n\r\n") {
            let byte = tokio::time::timeout(Duration::from_secs(10), socket.read_u8())
                .await
                .expect("an answer to the head in time")
                .expect("read");
            interim.push(byte);
        }
        let interim = String::from_utf8_lossy(&interim).into_owned();
        assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");
        socket.write_all(&[0xFF]).await.expect("a first byte");
        SlowUpload { socket }
    }

    /// The answer the server sent within `within`, if any: what came
    /// until the server closed the connection (it closes one whose body it
    /// did not read) or the time was up.
    async fn answer(&mut self, within: Duration) -> Option<String> {
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(within, self.socket.read_to_end(&mut answer)).await;
        (!answer.is_empty()).then(|| String::from_utf8_lossy(&answer).into_owned())
    }
}

/// One session holds 24 uploads open, each declaring 3 MB and sending a
/// byte; meanwhile another guest uploads an ordinary photo. It is stored
/// within 2 s, and that guest's photo saga completes with its result kept:
/// an upload that waits on the network holds no shared place.
async fn slow_uploads_never_stop_another_guests_photo(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = experience(&app, "photo").await;
    let (attacker, attacker_token) = app.session(&slug, None, "mallory").await;
    let mut slow = Vec::new();
    for _ in 0..24 {
        slow.push(SlowUpload::open(app.port, &attacker, &attacker_token, 3_000_000).await);
    }
    let (terminal_id, _) = app.terminal(&slug).await;
    let (sid, token) = app.session(&slug, Some(&terminal_id), "ana").await;
    let started = Instant::now();
    let (status, body) = upload(&app, &sid, &token, GPS_ROTATED.to_vec()).await;
    let took = started.elapsed();
    assert_eq!(status, 201, "another guest's photo is stored: {body}");
    assert!(took < Duration::from_secs(2), "within 2 s: {took:?}");
    let resp = app
        .submit(
            &sid,
            &token,
            json!({"photo_id": body["photo_id"]}),
            &uuid::Uuid::new_v4().to_string(),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let done = app.wait_final(&sid, &token, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let kept = done["result"]["content"][0]["url"].as_str().unwrap_or("");
    assert!(kept.starts_with("/media/r/"), "its result is kept: {done}");
    // The slow uploads got no place they could hold: none was answered
    // "pool full".
    for upload in &mut slow {
        if let Some(answer) = upload.answer(Duration::from_millis(1)).await {
            assert!(!answer.contains("photo_pool_full"), "{answer}");
        }
    }
    app.stop().await;
}
db_test!(slow_uploads_never_stop_another_guests_photo);

/// Photos of `session` stored now (not given up).
async fn photos_kept(app: &TestApp, session: &str) -> u64 {
    photos::Entity::find()
        .filter(photos::Column::SessionId.eq(session))
        .filter(photos::Column::DeletedAtMs.is_null())
        .count(app.state.store.db())
        .await
        .expect("count photos")
}

/// Files in the media folder's photo part.
fn photo_files(app: &TestApp) -> usize {
    let stagehand::media::MediaPlace::Folder(folder) = app.state.media.place() else {
        panic!("the tests' media is a folder");
    };
    std::fs::read_dir(folder.join("p")).map_or(0, |files| files.count())
}

/// 40 uploads in a row from one session: at most `max_photos_per_session`
/// (5) are stored; the rest are a clear 409 `photo_limit`, never a 5xx.
async fn forty_uploads_from_one_session_store_at_most_the_limit(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let slug = experience(&app, "photo").await;
    let (sid, token) = app.session(&slug, None, "mallory").await;
    let mut answers = Vec::new();
    for _ in 0..40 {
        answers.push(upload(&app, &sid, &token, SMALL_PNG.to_vec()).await);
    }
    let stored = answers.iter().filter(|(status, _)| *status == 201).count();
    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(stored, 5, "the limit's worth: {statuses:?}");
    for (status, body) in answers.iter().filter(|(status, _)| *status != 201) {
        assert_eq!(*status, 409, "{body}");
        assert_eq!(body["error"], "photo_limit", "{body}");
        assert!(
            body["message"].as_str().is_some_and(|m| m.contains('5')),
            "the message names the limit: {body}"
        );
    }
    assert_eq!(photos_kept(&app, &sid).await, 5);
    assert_eq!(photo_files(&app), 5, "no file beyond the limit");
    app.stop().await;
}
db_test!(forty_uploads_from_one_session_store_at_most_the_limit);

/// What can be judged before a byte of the body is read is answered at
/// once, while the client has sent only the head of a 3 MB upload: a
/// prompt-only experience (409) and an erased session (410).
async fn refusals_come_before_the_body(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let prompt_only = experience(&app, "prompt").await;
    let (psid, ptoken) = app.session(&prompt_only, None, "cy").await;
    let photo = experience(&app, "photo").await;
    let (sid, token) = app.session(&photo, None, "ana").await;
    let erased = app
        .http
        .delete(format!("{}/api/sessions/{sid}", app.base))
        .bearer_auth(&token)
        .send()
        .await
        .expect("DELETE");
    assert_eq!(erased.status(), 200);
    for (session, token, status, code) in [
        (&psid, &ptoken, "409", "photo_not_taken"),
        (&sid, &token, "410", "gone"),
    ] {
        let mut upload = SlowUpload::open(app.port, session, token, 3_000_000).await;
        let answer = upload
            .answer(Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("no answer before the body for {code}"));
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{answer}"
        );
        assert!(answer.contains(code), "{answer}");
    }
    assert_eq!(photos_kept(&app, &sid).await, 0);
    app.stop().await;
}
db_test!(refusals_come_before_the_body);

/// A 389 KB PNG of 7071 × 7071 pixels at 16 bits a channel with alpha
/// passes the 50 MP limit but decodes into 400 MB, and 600 MB at the peak
/// of its conversion: the decode budget counts bit depth and channels, so
/// it is refused (422, naming the memory) before a pixel is decoded. In a
/// server of its own, whose peak memory (`VmHWM`) is read after.
#[actix_web::test]
async fn a_16_bit_png_bomb_is_refused_within_the_decode_budget() {
    let db = support::TestDb::fresh(Backend::Sqlite).await;
    let sim = support::start_sim(support::fast_sim()).await;
    let mut logs = support::Logs::new();
    let http = support::http_client();
    let server = support::Server::start(&db.url, &sim.url(), &logs.next(), &http).await;
    let slug = support::create_experience(&http, &server.base, 5).await;
    let patched = http
        .patch(format!("{}/api/experiences/{slug}", server.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"input": "photo"}))
        .send()
        .await
        .expect("PATCH");
    assert_eq!(patched.status(), 200, "{:?}", patched.text().await);
    let (sid, token) = support::create_session(&http, &server.base, &slug, None, "eve").await;
    let resp = http
        .post(format!("{}/api/sessions/{sid}/photo", server.base))
        .bearer_auth(&token)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .body(PNG16_RGBA.to_vec())
        .send()
        .await
        .expect("POST photo");
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    let peak_kib = support::peak_rss_kib(server.pid);
    println!("16-bit PNG bomb: {status} {body}; server VmHWM {peak_kib} KiB");
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"], "photo_unreadable", "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("memory")),
        "names the memory it would take: {body}"
    );
    assert!(
        peak_kib < 256 * 1024,
        "nothing near the 600 MB was allocated: VmHWM {peak_kib} KiB"
    );
}

/// A body that stops coming is cut off once it falls behind the minimum
/// rate after its grace (408 `upload_too_slow`), and one that trickles is
/// cut off at the whole-body deadline: an upload's connection is the
/// only thing a slow client holds, and not for long.
async fn a_body_that_stalls_or_trickles_is_cut_off(backend: Backend) {
    let app = TestApp::spawn_with(backend, support::fast_sim(), |c| {
        c.upload_grace = Duration::from_millis(500);
        c.upload_min_rate = 1_000;
        c.upload_timeout = Duration::from_secs(3);
    })
    .await;
    let slug = experience(&app, "photo").await;
    let (sid, token) = app.session(&slug, None, "mallory").await;
    // One byte, then nothing.
    let mut stalled = SlowUpload::open(app.port, &sid, &token, 3_000_000).await;
    let answer = stalled
        .answer(Duration::from_secs(10))
        .await
        .expect("an answer to a stalled body");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("upload_too_slow"), "{answer}");
    // 2 KB a second keeps above the minimum rate, but 3 MB at that pace
    // would take 25 minutes: the deadline ends it.
    let mut trickle = SlowUpload::open(app.port, &sid, &token, 3_000_000).await;
    let started = Instant::now();
    let answer = loop {
        trickle
            .socket
            .write_all(&[0xAB; 200])
            .await
            .expect("the server reads on");
        if let Some(answer) = trickle.answer(Duration::from_millis(100)).await {
            break answer;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "cut off in time"
        );
    };
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "not before the deadline: {:?}",
        started.elapsed()
    );
    assert_eq!(photos_kept(&app, &sid).await, 0);
    app.stop().await;
}
db_test!(a_body_that_stalls_or_trickles_is_cut_off);

/// Uploads per client address: past `--upload-rate-limit` an upload is
/// 429 `rate_limited` with `Retry-After`, before its body is read.
async fn uploads_per_address_are_limited(backend: Backend) {
    let app = TestApp::spawn_with(backend, support::fast_sim(), |c| {
        c.upload_rate_limit = stagehand::config::parse_rate_limit("3/min").expect("a limit");
    })
    .await;
    let slug = experience(&app, "photo").await;
    let mut answers = Vec::new();
    for n in 0..4 {
        let (sid, token) = app.session(&slug, None, &format!("guest {n}")).await;
        let resp = app
            .http
            .post(format!("{}/api/sessions/{sid}/photo", app.base))
            .bearer_auth(&token)
            .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .body(SMALL_PNG.to_vec())
            .send()
            .await
            .expect("POST photo");
        let retry_after = resp.headers().get("retry-after").cloned();
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        answers.push((status, retry_after, body));
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    assert_eq!(statuses, [201, 201, 201, 429], "{answers:?}");
    let (_, retry_after, body) = &answers[3];
    assert_eq!(body["error"], "rate_limited", "{body}");
    assert!(retry_after.is_some(), "429 says when to retry");
    app.stop().await;
}
db_test!(uploads_per_address_are_limited);

/// A retake replaces the session's unsubmitted photo (`?replaces=`): it is
/// given up and counts no more, so a guest who retakes never meets the
/// limit; a photo a submission named stays and counts.
async fn a_retake_replaces_the_unsubmitted_photo(backend: Backend) {
    let app = TestApp::spawn_with(backend, support::fast_sim(), |_| {}).await;
    let slug = experience(&app, "photo").await;
    let (sid, token) = app.session(&slug, None, "ana").await;
    let mut current: Option<String> = None;
    for _ in 0..12 {
        let (status, body) =
            upload_replacing(&app, &sid, &token, SMALL_PNG.to_vec(), current.as_deref()).await;
        assert_eq!(status, 201, "a retake: {body}");
        current = body["photo_id"].as_str().map(str::to_owned);
        assert_eq!(photos_kept(&app, &sid).await, 1, "one photo held at a time");
    }
    // Submitted, and refused by the AI's moderation: the session is
    // ABORTED and takes a new photo, but the submitted one stays (a saga
    // names it) and counts, whatever `replaces` says.
    let submitted = current.clone().expect("a photo");
    let resp = app
        .submit(
            &sid,
            &token,
            json!({"photo_id": submitted, "prompt": "forbidden"}),
            &uuid::Uuid::new_v4().to_string(),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let done = app.wait_final(&sid, &token, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "ABORTED", "{done}");
    let (status, body) =
        upload_replacing(&app, &sid, &token, SMALL_PNG.to_vec(), Some(&submitted)).await;
    assert_eq!(status, 201, "{body}");
    let stored = app.state.store.photo(&submitted).await.expect("read");
    assert!(stored.is_some(), "the submitted photo stays");
    assert_eq!(photos_kept(&app, &sid).await, 2);
    // A malformed `replaces` is a clear 422.
    let (other, other_token) = app.session(&slug, None, "bo").await;
    let (status, body) =
        upload_replacing(&app, &other, &other_token, SMALL_PNG.to_vec(), Some("nope")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (422, Some("validation_failed"))
    );
    app.stop().await;
}
db_test!(a_retake_replaces_the_unsubmitted_photo);
