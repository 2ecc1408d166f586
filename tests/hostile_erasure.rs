//! Erasure and retention leave nothing behind, and no secret at rest signs
//! a media URL (issue 45, items 6 and 7). Through HTTP, on SQLite and
//! PostgreSQL, on the local folder and on a real S3-compatible server
//! (s3s-fs on 127.0.0.1):
//! - a fan-out of three calls, two of them kept before the third failed,
//!   leaves no object after an erasure (the guest's or an operator's) or
//!   after its retention, and what its calls and its abort said is blank;
//! - a keep cut short (its first output stored, the next refused) is
//!   erased too;
//! - a photo nobody submitted whose delete fails is deleted by a later
//!   sweep, and one a submission names meanwhile is never deleted;
//! - a copy of the database signs no URL the server accepts, a signature
//!   good for more than 15 minutes is refused, a signed read of a photo
//!   that was given up is 404, and the instances of one database agree on
//!   the secret.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::ConnectionTrait;
use serde_json::{json, Value};
use stagehand::actors::cleanup::{CleanupReport, RunCleanup};
use stagehand::clock::ManualClock;
use stagehand::domain::failure::ContentItem;
use stagehand::domain::guests::ForgottenBy;
use stagehand::domain::media::{sign_media_url, ServerSecret};
use stagehand::media::keep::{KeepError, KeepLimits, Keeper, KeptFor, ResultOrigins};
use stagehand::media::pool::{PhotoPool, PoolSizes};
use stagehand::media::secret::SecretError;
use stagehand::media::MediaPlace;
use stagehand::startup::StartupError;
use stagehand::store::Store;
use support::{Backend, S3Server, TestApp, OPERATOR};

const WITHIN: Duration = Duration::from_secs(30);
const PHOTO: &[u8] = include_bytes!("fixtures/photo-small.png");
const START: i64 = 1_800_000_000_000;
const MINUTE: i64 = 60_000;
const BUCKET: &str = "erasure";

/// Where the app under test keeps its media.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Folder,
    S3,
}

/// The app (one attempt per call, so a failed call stays failed), its S3
/// server when the media is there, and its clock when it is a manual one.
struct Booth {
    app: TestApp,
    s3: Option<S3Server>,
}

impl Booth {
    async fn start(backend: Backend, place: Place, clock: Option<Arc<ManualClock>>) -> Booth {
        let s3 = match place {
            Place::Folder => None,
            Place::S3 => {
                S3Server::credentials_in_env();
                Some(S3Server::start(BUCKET).await)
            }
        };
        let media_url = s3.as_ref().map(|s3| s3.media_url(BUCKET));
        let tweak = move |c: &mut stagehand::config::Config| {
            c.max_attempts = 1;
            if let Some(url) = media_url {
                c.media_url = Some(url);
            }
        };
        let app = match clock {
            Some(clock) => {
                TestApp::spawn_with_clock(backend, support::fast_sim(), tweak, clock).await
            }
            None => TestApp::spawn_with(backend, support::fast_sim(), tweak).await,
        };
        Booth { app, s3 }
    }

    /// Every object in the media store, by key.
    fn objects(&self) -> BTreeSet<String> {
        let (root, in_bucket) = match (&self.s3, self.app.state.media.place()) {
            (Some(s3), _) => (s3.root.path().join(BUCKET), true),
            (None, MediaPlace::Folder(root)) => (root.clone(), false),
            (None, place) => panic!("a folder or the test's S3 server, not {place:?}"),
        };
        support::files_under(&root)
            .into_iter()
            // s3s-fs keeps its own records beside the objects.
            .filter(|k| !(in_bucket && k.contains(".s3s")))
            .filter(|k| !k.starts_with("probe/"))
            .collect()
    }

    async fn round(&self) -> CleanupReport {
        self.app
            .app_cleanup
            .send(RunCleanup)
            .await
            .expect("a cleanup round")
    }

    async fn stop(self) {
        self.app.stop().await;
    }
}

/// A photo experience with `extra` settings; its slug.
async fn photo_experience(app: &TestApp, extra: Value) -> String {
    let slug = format!("he-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let mut body = json!({"slug": slug, "title": "Comic me", "kind": "comic", "input": "photo"});
    for (k, v) in extra.as_object().expect("an object") {
        body[k] = v.clone();
    }
    let (status, answer) = support::api_call(
        &app.http,
        &app.base,
        "POST",
        "/api/experiences",
        OPERATOR,
        Some(body),
        None,
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    slug
}

/// Uploads the test photo as the session's; the 201's body.
async fn upload(app: &TestApp, sid: &str, token: &str) -> Value {
    let resp = app
        .http
        .post(format!("{}/api/sessions/{sid}/photo", app.base))
        .bearer_auth(token)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .header("content-type", "image/png")
        .body(PHOTO.to_vec())
        .send()
        .await
        .expect("POST photo");
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    resp.json().await.expect("JSON")
}

/// Submits the photo `photo_id` for the session; its saga's id.
async fn submit_photo(app: &TestApp, sid: &str, token: &str, photo_id: &Value) -> String {
    let resp = app
        .submit(
            sid,
            token,
            json!({"photo_id": photo_id}),
            &uuid::Uuid::new_v4().to_string(),
        )
        .await;
    assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
    resp.json::<Value>().await.unwrap()["saga_id"]
        .as_str()
        .expect("a saga id")
        .to_owned()
}

/// A session that ran a fan-out of three calls of which the provider
/// failed one: its id, token, saga and the objects its two kept calls name.
struct FailedFanOut {
    sid: String,
    token: String,
    saga_id: String,
    kept: Vec<String>,
}

async fn failed_fan_out(app: &TestApp, extra: Value) -> FailedFanOut {
    let mut settings = json!({"ai_calls": 3, "max_in_flight": 3});
    for (k, v) in extra.as_object().expect("an object") {
        settings[k] = v.clone();
    }
    let slug = photo_experience(app, settings).await;
    let (sid, token) = app.session(&slug, None, "dana").await;
    let photo = upload(app, &sid, &token).await;
    app.sim.control.fail_next(1);
    let saga_id = submit_photo(app, &sid, &token, &photo["photo_id"]).await;
    let done = app.wait_final(&sid, &token, WITHIN).await;
    assert_eq!(
        (&done["status"], &done["abort_reason"]),
        (&json!("ABORTED"), &json!("AI_FAILED")),
        "{done}"
    );
    let calls = app.state.store.ai_calls_of(&saga_id).await.expect("calls");
    let mut kept = Vec::new();
    for call in calls.iter().filter(|c| c.status == "SUCCEEDED") {
        let content: Value = serde_json::from_str(call.content.as_deref().unwrap()).unwrap();
        kept.extend(stagehand::domain::guests::kept_keys(&content));
    }
    assert_eq!(calls.len(), 3, "three calls: {calls:?}");
    assert_eq!(
        calls.iter().filter(|c| c.status == "SUCCEEDED").count(),
        2,
        "two calls kept their results: {calls:?}"
    );
    // Each kept call names its picture and its thumbnail.
    assert_eq!(kept.len(), 4, "{kept:?}");
    assert_eq!(kept.iter().filter(|k| k.ends_with(".t.jpg")).count(), 2);
    FailedFanOut {
        sid,
        token,
        saga_id,
        kept,
    }
}

async fn delete(app: &TestApp, path: &str, token: &str) -> u16 {
    app.http
        .delete(format!("{}{path}", app.base))
        .bearer_auth(token)
        .send()
        .await
        .expect("DELETE")
        .status()
        .as_u16()
}

async fn get_status(app: &TestApp, path: &str, token: Option<&str>) -> u16 {
    let mut req = app.http.get(format!("{}{path}", app.base));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req.send().await.expect("GET").status().as_u16()
}

/// Before: the photo and the four kept files are in the store and served.
async fn all_kept(booth: &Booth, fan_out: &FailedFanOut) {
    let before = booth.objects();
    assert!(
        fan_out.kept.iter().all(|k| before.contains(k)),
        "{:?} in {before:?}",
        fan_out.kept
    );
    assert_eq!(
        before.iter().filter(|k| k.starts_with("p/")).count(),
        1,
        "the photo: {before:?}"
    );
    for key in &fan_out.kept {
        assert_eq!(
            get_status(&booth.app, &format!("/media/{key}"), None).await,
            200
        );
    }
}

/// After: nothing at all in the store, and nothing served.
async fn nothing_left(booth: &Booth, fan_out: &FailedFanOut) {
    let left = booth.objects();
    assert!(left.is_empty(), "left in the store: {left:?}");
    for key in &fan_out.kept {
        assert_eq!(
            get_status(&booth.app, &format!("/media/{key}"), None).await,
            404,
            "{key}"
        );
    }
}

/// What the saga's calls and its abort said, as stored: (call contents,
/// call errors, the abort's detail), the blanks left out.
async fn what_was_said(store: &Store, saga_id: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    let texts = |sql: &'static str| async move {
        store
            .db()
            .query_all_raw(store.sql(sql, vec![saga_id.into()]))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .iter()
            .filter_map(|r| r.try_get_by_index::<Option<String>>(0).unwrap())
            .filter(|t| !t.is_empty() && t != "[]")
            .collect::<Vec<String>>()
    };
    (
        texts("SELECT content FROM ai_calls WHERE saga_id = $1").await,
        texts("SELECT error FROM ai_calls WHERE saga_id = $1").await,
        texts("SELECT abort_detail FROM sagas WHERE id = $1").await,
    )
}

/// The guest erases a failed fan-out: every object (the photo, both kept
/// pictures and their thumbnails) is gone from the store, on a folder and
/// on S3 (`erased_by` says who asks: the guest or an operator).
async fn erasure_leaves_no_object(backend: Backend, place: Place, by: ForgottenBy) {
    let booth = Booth::start(backend, place, None).await;
    let fan_out = failed_fan_out(&booth.app, json!({})).await;
    all_kept(&booth, &fan_out).await;
    let status = match by {
        ForgottenBy::Participant => {
            delete(
                &booth.app,
                &format!("/api/sessions/{}", fan_out.sid),
                &fan_out.token,
            )
            .await
        }
        _ => {
            delete(
                &booth.app,
                &format!("/api/admin/sessions/{}", fan_out.sid),
                OPERATOR,
            )
            .await
        }
    };
    assert_eq!(status, 200);
    for _ in 0..3 {
        let report = booth.round().await;
        assert_eq!(report.failed, 0, "{report:?}");
    }
    nothing_left(&booth, &fan_out).await;
    booth.stop().await;
}

async fn a_guest_erasing_a_failed_fan_out_leaves_no_file_in_the_folder(backend: Backend) {
    erasure_leaves_no_object(backend, Place::Folder, ForgottenBy::Participant).await
}
db_test!(a_guest_erasing_a_failed_fan_out_leaves_no_file_in_the_folder);

async fn a_guest_erasing_a_failed_fan_out_leaves_no_object_on_s3(backend: Backend) {
    erasure_leaves_no_object(backend, Place::S3, ForgottenBy::Participant).await
}
db_test!(a_guest_erasing_a_failed_fan_out_leaves_no_object_on_s3);

async fn an_operator_erasing_a_failed_fan_out_leaves_no_object_on_s3(backend: Backend) {
    erasure_leaves_no_object(backend, Place::S3, ForgottenBy::Operator).await
}
db_test!(an_operator_erasing_a_failed_fan_out_leaves_no_object_on_s3);

/// The retention of a failed fan-out ends (on the injected clock): every
/// object goes, and what its calls and its abort said is blank.
async fn retention_leaves_no_object(backend: Backend, place: Place) {
    let clock = ManualClock::new(START);
    let booth = Booth::start(backend, place, Some(clock.clone())).await;
    let fan_out = failed_fan_out(
        &booth.app,
        json!({"photo_retention": "2s", "retention": "5s"}),
    )
    .await;
    all_kept(&booth, &fan_out).await;
    clock.advance_ms(6_000);
    let mut forgotten = 0;
    for _ in 0..3 {
        let report = booth.round().await;
        assert_eq!(report.failed, 0, "{report:?}");
        forgotten += report.forgotten_sessions;
    }
    assert_eq!(forgotten, 1);
    nothing_left(&booth, &fan_out).await;
    let view = booth.app.status(&fan_out.sid, &fan_out.token).await;
    assert_eq!(view["erased"], true, "{view}");
    let said = what_was_said(&booth.app.state.store, &fan_out.saga_id).await;
    assert_eq!(said, (vec![], vec![], vec![]), "blank after retention");
    booth.stop().await;
}

async fn retention_of_a_failed_fan_out_leaves_no_file_in_the_folder(backend: Backend) {
    retention_leaves_no_object(backend, Place::Folder).await
}
db_test!(retention_of_a_failed_fan_out_leaves_no_file_in_the_folder);

async fn retention_of_a_failed_fan_out_leaves_no_object_on_s3(backend: Backend) {
    retention_leaves_no_object(backend, Place::S3).await
}
db_test!(retention_of_a_failed_fan_out_leaves_no_object_on_s3);

/// What the calls and the abort said (the kept contents, the provider's
/// error, the abort's detail that quotes it) is blank once the guest
/// erased the session, in the store and in the operators' view.
async fn an_erasure_blanks_what_the_calls_and_the_abort_said(backend: Backend) {
    let booth = Booth::start(backend, Place::Folder, None).await;
    let app = &booth.app;
    let fan_out = failed_fan_out(app, json!({})).await;
    let (contents, errors, details) = what_was_said(&app.state.store, &fan_out.saga_id).await;
    assert_eq!(
        (contents.len(), errors.len(), details.len()),
        (2, 1, 1),
        "said before: {contents:?} {errors:?} {details:?}"
    );
    assert_eq!(
        delete(
            app,
            &format!("/api/sessions/{}", fan_out.sid),
            &fan_out.token
        )
        .await,
        200
    );
    let said = what_was_said(&app.state.store, &fan_out.saga_id).await;
    assert_eq!(said, (vec![], vec![], vec![]), "blank after the erasure");
    let saga = app.saga_of(&fan_out.sid).await;
    assert!(
        saga["abort_detail"].is_null() || saga["abort_detail"] == "",
        "{saga}"
    );
    let view = app.status(&fan_out.sid, &fan_out.token).await;
    assert!(
        view["abort_detail"].is_null() || view["abort_detail"] == "",
        "{view}"
    );
    booth.stop().await;
}
db_test!(an_erasure_blanks_what_the_calls_and_the_abort_said);

/// The one photo in the store (`p/…`).
fn the_photo(booth: &Booth) -> String {
    let photos: Vec<String> = booth
        .objects()
        .into_iter()
        .filter(|k| k.starts_with("p/"))
        .collect();
    assert_eq!(photos.len(), 1, "{photos:?}");
    photos[0].clone()
}

/// A photo nobody submitted, past `photo_orphan_ttl` (1 h), while the S3
/// server is down: its delete fails, and a later round deletes it once the
/// server is back (its row is not forgotten before its object is gone).
async fn an_orphan_photo_whose_delete_failed_is_deleted_by_a_later_sweep(backend: Backend) {
    let clock = ManualClock::new(START);
    let mut booth = Booth::start(backend, Place::S3, Some(clock.clone())).await;
    let slug = photo_experience(&booth.app, json!({})).await;
    let (sid, token) = booth.app.session(&slug, None, "eve").await;
    let photo = upload(&booth.app, &sid, &token).await;
    let photo_id = photo["photo_id"].as_str().unwrap().to_owned();
    let key = the_photo(&booth);
    clock.advance_ms(60 * MINUTE + 1_000);
    booth.s3.as_mut().unwrap().stop();
    let mut failed = 0;
    for _ in 0..2 {
        clock.advance_ms(2 * MINUTE);
        failed += booth.round().await.failed;
    }
    assert!(failed >= 1, "the delete failed while the store was down");
    assert!(booth.objects().contains(&key), "still in the bucket");
    booth.s3.as_mut().unwrap().resume().await;
    for _ in 0..2 {
        clock.advance_ms(2 * MINUTE);
        let report = booth.round().await;
        assert_eq!(report.failed, 0, "{report:?}");
    }
    let left = booth.objects();
    assert!(
        left.is_empty(),
        "the orphan is gone from the bucket: {left:?}"
    );
    assert!(booth
        .app
        .state
        .store
        .photo(&photo_id)
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        get_status(&booth.app, &format!("/media/{key}"), Some(&token)).await,
        404
    );
    booth.stop().await;
}
db_test!(an_orphan_photo_whose_delete_failed_is_deleted_by_a_later_sweep);

/// The race the sweep must never lose: a submission read a photo as live
/// just before the sweep took it for an orphan, and commits the saga that
/// names it just after. The photo stays, row and object, and the saga can
/// read it.
async fn a_photo_a_submission_names_meanwhile_is_never_deleted(backend: Backend) {
    let clock = ManualClock::new(START);
    let booth = Booth::start(backend, Place::Folder, Some(clock.clone())).await;
    let app = &booth.app;
    let slug = photo_experience(app, json!({"photo_retention": "30d"})).await;
    let (sid, token) = app.session(&slug, None, "fay").await;
    let late = upload(app, &sid, &token).await;
    let late_id = late["photo_id"].as_str().unwrap().to_owned();
    let late_key = app
        .state
        .store
        .photo(&late_id)
        .await
        .unwrap()
        .unwrap()
        .object_key;
    let first = upload(app, &sid, &token).await;
    let saga_id = submit_photo(app, &sid, &token, &first["photo_id"]).await;
    let done = app.wait_final(&sid, &token, WITHIN).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    clock.advance_ms(60 * MINUTE + 1_000);
    // The desk reads the photo as live...
    let live = app
        .state
        .store
        .photo_sessions(std::slice::from_ref(&late_id))
        .await
        .unwrap();
    assert!(live.contains_key(&late_id));
    // ...the sweep runs...
    booth.round().await;
    // ...and the desk commits the saga that names it.
    app.state
        .store
        .write_one(app.state.store.sql(
            "UPDATE sagas SET photo_id = $1 WHERE id = $2",
            vec![late_id.clone().into(), saga_id.into()],
        ))
        .await
        .unwrap();
    for _ in 0..3 {
        clock.advance_ms(2 * MINUTE);
        let report = booth.round().await;
        assert_eq!(report.failed, 0, "{report:?}");
    }
    assert!(
        app.state.store.photo(&late_id).await.unwrap().is_some(),
        "its row stays"
    );
    assert!(
        app.state.media.get(&late_key).await.is_ok(),
        "its object stays"
    );
    booth.stop().await;
}
db_test!(a_photo_a_submission_names_meanwhile_is_never_deleted);

/// A session with an uploaded photo nobody submitted: (session id, token,
/// photo key).
async fn a_photo(booth: &Booth) -> (String, String, String) {
    let slug = photo_experience(&booth.app, json!({})).await;
    let (sid, token) = booth.app.session(&slug, None, "gus").await;
    upload(&booth.app, &sid, &token).await;
    let key = the_photo(booth);
    (sid, token, key)
}

/// `/media/{key}` signed with `secret` until `expires_ms`.
fn signed(secret: &[u8], key: &str, expires_ms: i64) -> String {
    format!("/media/{key}?{}", sign_media_url(secret, key, expires_ms))
}

/// A store on what a thief of the database holds: a copy of the SQLite
/// files, or (PostgreSQL) its tables as they are.
async fn stolen_copy(app: &TestApp, into: &Path) -> Store {
    match app.db.backend {
        Backend::Sqlite => {
            let file = app
                .db
                .url
                .strip_prefix("sqlite://")
                .and_then(|rest| rest.split('?').next())
                .expect("a SQLite file");
            for suffix in ["", "-wal"] {
                let from = format!("{file}{suffix}");
                if Path::new(&from).exists() {
                    std::fs::copy(&from, into.join(format!("stolen.db{suffix}")))
                        .expect("copy the database file");
                }
            }
            Store::connect(
                &format!("sqlite://{}/stolen.db?mode=rwc", into.display()),
                2,
            )
            .await
            .expect("open the copy")
        }
        Backend::Postgres => Store::connect(&app.db.url, 2).await.expect("connect"),
    }
}

/// A thief copies the database and signs the photo's URL with every value
/// it holds in `server_keys`: as stored, hex-decoded, and put through the
/// server's own derivation. The server refuses each; the URL signed with
/// its real key opens (so the test tells an accepted URL from a refused
/// one).
async fn a_stolen_copy_of_the_database_signs_no_url_the_server_accepts(backend: Backend) {
    let booth = Booth::start(backend, Place::Folder, None).await;
    let app = &booth.app;
    let (_, _, key) = a_photo(&booth).await;
    let expires = app.state.clock.now_ms() + 10 * MINUTE;
    let genuine = signed(&app.state.photos.secret, &key, expires);
    assert_eq!(
        get_status(app, &genuine, None).await,
        200,
        "the server's own"
    );
    let dir = tempfile::tempdir().unwrap();
    let stolen = stolen_copy(app, dir.path()).await;
    let rows = stolen
        .db()
        .query_all_raw(stolen.sql("SELECT name, value FROM server_keys", vec![]))
        .await
        .expect("read server_keys");
    assert!(!rows.is_empty(), "the copy holds the table");
    for row in rows {
        let name: String = row.try_get_by_index(0).unwrap();
        let value: String = row.try_get_by_index(1).unwrap();
        let candidates = [
            value.as_bytes().to_vec(),
            hex::decode(&value).unwrap_or_default(),
            ServerSecret::new(&value)
                .map(|s| s.media_signing_key().to_vec())
                .unwrap_or_default(),
        ];
        for candidate in candidates.iter().filter(|c| !c.is_empty()) {
            let forged = signed(candidate, &key, expires);
            assert_eq!(
                get_status(app, &forged, None).await,
                401,
                "a URL signed with server_keys.{name} opened the photo"
            );
        }
    }
    booth.stop().await;
}
db_test!(a_stolen_copy_of_the_database_signs_no_url_the_server_accepts);

/// A signature good for more than 15 minutes is refused, even made with
/// the server's own key; one within 15 minutes opens; an expired one not.
async fn a_signed_url_good_for_more_than_15_minutes_is_refused(backend: Backend) {
    let booth = Booth::start(backend, Place::Folder, None).await;
    let app = &booth.app;
    let (_, _, key) = a_photo(&booth).await;
    let secret = app.state.photos.secret.clone();
    let now = app.state.clock.now_ms();
    for (ahead, expected) in [
        (14 * MINUTE, 200),
        (16 * MINUTE, 401),
        (365 * 24 * 60 * MINUTE, 401),
        (-1_000, 401),
    ] {
        assert_eq!(
            get_status(app, &signed(&secret, &key, now + ahead), None).await,
            expected,
            "a signature good for {ahead} ms"
        );
    }
    booth.stop().await;
}
db_test!(a_signed_url_good_for_more_than_15_minutes_is_refused);

/// A photo given up (here the first step of an erasure: its object still
/// waits for the purge) is 404 to a signed URL, to an operator and to its
/// own session.
async fn a_signed_read_of_a_photo_given_up_is_404(backend: Backend) {
    let booth = Booth::start(backend, Place::Folder, None).await;
    let app = &booth.app;
    let (sid, token, key) = a_photo(&booth).await;
    let url = signed(
        &app.state.photos.secret,
        &key,
        app.state.clock.now_ms() + 10 * MINUTE,
    );
    let plain = format!("/media/{key}");
    assert_eq!(get_status(app, &url, None).await, 200);
    assert_eq!(get_status(app, &plain, Some(OPERATOR)).await, 200);
    let forgot = app
        .state
        .store
        .forget_session(
            &sid,
            ForgottenBy::Participant,
            None,
            app.state.clock.now_ms(),
        )
        .await
        .unwrap();
    assert!(matches!(
        forgot,
        stagehand::store::guests::Forget::Forgotten { .. }
    ));
    assert!(booth.objects().contains(&key), "the purge has not run yet");
    assert_eq!(get_status(app, &url, None).await, 404, "signed");
    assert_eq!(
        get_status(app, &plain, Some(OPERATOR)).await,
        404,
        "operator"
    );
    assert_eq!(
        get_status(app, &plain, Some(&token)).await,
        404,
        "its session"
    );
    booth.stop().await;
}
db_test!(a_signed_read_of_a_photo_given_up_is_404);

/// An output as a provider may give it inline.
fn inline(kind: &str, media_type: &str, bytes: &[u8]) -> ContentItem {
    use base64::Engine as _;
    ContentItem {
        kind: kind.to_owned(),
        url: Some(format!(
            "data:{media_type};base64,{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )),
        text: None,
        thumb_url: None,
        original_url: None,
        print_url: None,
    }
}

/// A keep cut short: the job gave two outputs, the first was stored with
/// its thumbnail, the second is refused (not an image), so the attempt
/// fails and no content ever names the first. A worker that lost the
/// saga's lease writes nothing. An operator's erasure (which cancels the
/// running saga first) deletes what the keep wrote all the same.
async fn what_a_keep_cut_short_wrote_is_erased_too(backend: Backend) {
    let booth = Booth::start(backend, Place::Folder, None).await;
    let app = &booth.app;
    app.sim.control.set_latency(Duration::from_secs(3600));
    let slug = photo_experience(app, json!({})).await;
    let (sid, token) = app.session(&slug, None, "hal").await;
    let photo = upload(app, &sid, &token).await;
    let saga_id = submit_photo(app, &sid, &token, &photo["photo_id"]).await;
    let lease = support::wait_for(WITHIN, || async {
        let saga = app.state.store.saga(&saga_id).await.ok()??;
        (saga.step == "AI_PENDING" && saga.ai_job_id.is_some())
            .then_some(saga.lock_token)
            .flatten()
    })
    .await
    .expect("the saga's worker holds its lease while its job runs");
    let keeper = Keeper::new(
        app.state.media.clone(),
        PhotoPool::new(PoolSizes {
            workers: 1,
            queue: 4,
            memory: 1 << 30,
        })
        .expect("a photo pool"),
        b"the secret result keys are derived under",
        KeepLimits::default(),
    );
    let origins = ResultOrigins::new(&app.sim.url(), &[], &[]).expect("origins");
    let outputs = || {
        vec![
            inline("image", "image/png", PHOTO),
            inline("image", "text/plain", b"not a picture"),
        ]
    };
    let before = booth.objects();
    let lost = keeper
        .keep(
            &origins,
            KeptFor {
                lists: &app.state.store,
                saga_id: &saga_id,
                token: "a lease this worker lost",
            },
            0,
            outputs(),
            None,
        )
        .await;
    assert!(matches!(lost, Err(KeepError::Transient(_))), "{lost:?}");
    assert_eq!(booth.objects(), before, "nothing written without the lease");
    let cut_short = keeper
        .keep(
            &origins,
            KeptFor {
                lists: &app.state.store,
                saga_id: &saga_id,
                token: &lease,
            },
            0,
            outputs(),
            None,
        )
        .await;
    assert!(
        matches!(cut_short, Err(KeepError::Permanent(_))),
        "{cut_short:?}"
    );
    let written: Vec<String> = booth
        .objects()
        .into_iter()
        .filter(|k| k.starts_with("r/"))
        .collect();
    assert_eq!(
        written.len(),
        2,
        "the first output and its thumbnail: {written:?}"
    );
    assert_eq!(
        delete(app, &format!("/api/admin/sessions/{sid}"), OPERATOR).await,
        200
    );
    for _ in 0..3 {
        let report = booth.round().await;
        assert_eq!(report.failed, 0, "{report:?}");
    }
    let left = booth.objects();
    assert!(left.is_empty(), "left in the store: {left:?}");
    booth.stop().await;
}
db_test!(what_a_keep_cut_short_wrote_is_erased_too);

/// The instances of one PostgreSQL database agree on the secret: one with
/// another secret does not start while an instance lives (a provider sent
/// to it would be refused the other's URLs), one with the same secret
/// does, and a URL either signs opens on the other.
#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn the_instances_of_one_database_agree_on_the_secret() {
    let booth = Booth::start(Backend::Postgres, Place::Folder, None).await;
    let app = &booth.app;
    let (_, _, key) = a_photo(&booth).await;
    let MediaPlace::Folder(folder) = app.state.media.place().clone() else {
        panic!("a folder store");
    };
    let folder = folder.display().to_string();
    let mut stranger = support::test_config(&app.db, &app.sim.url());
    stranger.secret =
        Some(ServerSecret::new(&"another secret, 32 characters at least".repeat(2)).unwrap());
    stranger.media_url = Some(folder.clone());
    match stagehand::startup::Application::build(stranger).await {
        Err(StartupError::Secret(SecretError::Disagrees)) => {}
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("an instance with another secret started"),
    }
    let twin = support::Instance::start(&app.db, &app.sim.url(), move |c| {
        c.media_url = Some(folder);
    })
    .await;
    let url = signed(
        &app.state.photos.secret,
        &key,
        app.state.clock.now_ms() + 10 * MINUTE,
    );
    let resp = app
        .http
        .get(format!("{}{url}", twin.base))
        .send()
        .await
        .expect("GET");
    assert_eq!(
        resp.status(),
        200,
        "signed by one instance, read on the other"
    );
    twin.stop().await;
    booth.stop().await;
}

/// A session forgotten before `kept_objects` existed: its failed
/// fan-out's calls still name their files, nothing lists them, and the
/// upgrade queued its purge again (`objects_left`). The purge reads the
/// calls' contents, deletes the files and blanks the contents.
async fn a_session_forgotten_before_the_list_existed_is_purged_from_its_calls(backend: Backend) {
    let booth = Booth::start(backend, Place::Folder, None).await;
    let app = &booth.app;
    let store = &app.state.store;
    let fan_out = failed_fan_out(app, json!({})).await;
    let calls = store.ai_calls_of(&fan_out.saga_id).await.unwrap();
    let now = app.state.clock.now_ms();
    store
        .forget_session(&fan_out.sid, ForgottenBy::Retention, None, now)
        .await
        .unwrap();
    // As the old code left it: the calls' contents, no list.
    for call in calls.iter().filter(|c| c.content.is_some()) {
        store
            .write_one(store.sql(
                "UPDATE ai_calls SET content = $1 WHERE saga_id = $2 AND call_index = $3",
                vec![
                    call.content.clone().into(),
                    call.saga_id.clone().into(),
                    call.call_index.into(),
                ],
            ))
            .await
            .unwrap();
    }
    store
        .write_one(store.sql("DELETE FROM kept_objects", vec![]))
        .await
        .unwrap();
    all_kept(&booth, &fan_out).await;
    let report = booth.round().await;
    assert_eq!(report.failed, 0, "{report:?}");
    nothing_left(&booth, &fan_out).await;
    let said = what_was_said(store, &fan_out.saga_id).await;
    assert_eq!(said, (vec![], vec![], vec![]));
    booth.stop().await;
}
db_test!(a_session_forgotten_before_the_list_existed_is_purged_from_its_calls);
