//! The Replicate provider (`kind = "replicate"`), black box against
//! `tests/support/fake_replicate.rs`, a fake of Replicate's HTTP API
//! written only from Replicate's documentation (its module doc names the
//! pages). Issue 32's Replicate cases, as /work/notes/contract-32.md says
//! stagehand will behave:
//!
//! - through stagehand's HTTP API (a providers file with `kind =
//!   "replicate"`, on SQLite and PostgreSQL): an unclear create is adopted
//!   (one prediction, the session completes with its output, metric
//!   `adopted`, its output file kept by stagehand and served from
//!   `/media/r/…`); a create dropped before anything was made is created again
//!   (one prediction, metric `created_again`); an `aborted` prediction is a
//!   failed attempt (no cancel, breaker closed, a new prediction, or
//!   AI_FAILED at the last attempt); a 429 pauses the whole provider for
//!   `Retry-After` (else the body's "resets in ~Ns"); a refused or
//!   unreadable cancel never opens the breaker; an output Replicate
//!   deletes after the session completed still shows (stagehand's copy);
//! - `stagehand serve` (the binary) refuses to start with a model Replicate
//!   does not know, naming it, and starts with one it knows;
//! - through the adapter (`stagehand::ai::ReplicateClient`): every
//!   documented status maps; creates carry only `input` (and `version`);
//!   failures, moderation, auth, 429s, cancels and unclear creates; the
//!   participant's photo as a data URI (at most 256 KB), a Files-API
//!   upload (larger) or its URL, under the configured field, and an
//!   unclear create found by its photo.
//!
//! The token never reaches a log line (this test binary captures every log
//! at DEBUG), an answer, a `Debug` output or a failure text.

mod support;

#[path = "support/fake_replicate.rs"]
mod fake_replicate;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fake_replicate::{
    is_final, CancelAnswer, CreateFault, FakeReplicate, Plan, DOCUMENTED_STATUSES,
};
use serde_json::{json, Value};
use stagehand::ai::{
    replicate, ApiKey, CancelOutcome, JobOrder, JobStatus, Lookup, MaybeMade, ReplicateClient,
    ReplicateSettings,
};
use stagehand::config::Config;
use stagehand::domain::failure::AiFailure;
use support::{Backend, TestApp, OPERATOR};

const KEY: &str = "r8_fake-TOKEN-3f9a0c71d2e84b56";
/// The variable the providers files name (`api_key_env`).
const KEY_ENV: &str = "STAGEHAND_TEST_REPLICATE_TOKEN";
const MODEL: &str = "black-forest-labs/flux-schnell";
const VERSION: &str = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa";

// ---------------------------------------------------------------- logs

type Captured = support::CapturedLogs;

/// Every log of this test binary.
fn captured() -> Captured {
    support::captured_logs("debug,sqlx=info,sea_orm=info,sqlx_core=info,tokio_postgres=info")
}

fn logs_text() -> String {
    String::from_utf8_lossy(&captured().0.lock().unwrap()).into_owned()
}

fn assert_key_not_logged() {
    let text = logs_text();
    assert!(text.contains("Replicate"), "the logs are captured");
    assert!(
        !text.contains(KEY),
        "the Replicate token is in a log line:\n{}",
        text.lines().find(|l| l.contains(KEY)).unwrap()
    );
}

fn assert_no_key(failure: &AiFailure) {
    let shown = format!("{failure} {failure:?}");
    assert!(!shown.contains(KEY), "{shown}");
}

// ---------------------------------------------------------------- the adapter

async fn fake_with_model() -> FakeReplicate {
    let fake = FakeReplicate::start(KEY).await;
    fake.add_model(MODEL);
    fake
}

fn settings(fake: &FakeReplicate) -> ReplicateSettings {
    ReplicateSettings {
        base_url: format!("{}/v1", fake.url),
        model: Some(MODEL.into()),
        request_timeout: Duration::from_millis(700),
        ..ReplicateSettings::new(Some(ApiKey::new(KEY)))
    }
}

fn order(prompt: &str) -> JobOrder {
    JobOrder {
        kind: "image".into(),
        prompt: prompt.into(),
        params: json!({"style": "ignored"}),
        idempotency_key: uuid::Uuid::new_v4(),
        ..JobOrder::default()
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// `order` sent again after an unclear send at `since_ms`: the saga says
/// the prediction may exist, and which ones other calls hold.
fn resent(order: &JobOrder, since_ms: i64, taken: &[&str], look_only: bool) -> JobOrder {
    JobOrder {
        maybe_made: Some(MaybeMade {
            since_ms,
            last_sent_ms: since_ms,
            now_ms: now_ms(),
            taken: taken.iter().map(|id| id.to_string()).collect(),
            look_only,
            photo: None,
        }),
        ..order.clone()
    }
}

/// Polls every 20 ms until the prediction is final (5 s at most); every
/// status seen, in order, and the final view.
async fn poll_until_final(
    client: &ReplicateClient,
    job_id: &str,
) -> (Vec<JobStatus>, stagehand::ai::JobView) {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let view = client.poll(job_id).await.expect("poll");
        if seen.last() != Some(&view.status) {
            seen.push(view.status);
        }
        if view.status.is_final() {
            return (seen, view);
        }
        assert!(Instant::now() < deadline, "{job_id} never ended: {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix_web::test]
async fn a_prediction_progresses_to_an_image_and_the_create_carries_only_input() {
    captured();
    let fake = fake_with_model().await;
    fake.set_default_plan(Plan::Succeed {
        starting: Duration::from_millis(150),
        processing: Duration::from_millis(150),
    });
    let client = ReplicateClient::new(&settings(&fake));
    let created = client
        .submit(&order("a lighthouse at dawn"))
        .await
        .expect("created");
    assert_eq!(created.status, JobStatus::Queued);
    let (seen, done) = poll_until_final(&client, &created.job_id).await;
    assert_eq!(
        seen,
        [JobStatus::Queued, JobStatus::Running, JobStatus::Succeeded],
        "starting -> processing -> succeeded"
    );
    let result = done.result.expect("a result");
    assert_eq!(result.content.len(), 1);
    assert_eq!(result.content[0].kind, "image");
    let url = fake.output_url(&created.job_id);
    assert_eq!(result.content[0].url.as_deref(), Some(url.as_str()));
    // The fake serves it, with no token, as a real WebP image.
    let file = support::http_client()
        .get(&url)
        .send()
        .await
        .expect("GET the output");
    assert_eq!(file.status(), 200);
    assert_eq!(file.headers()["content-type"], "image/webp");
    let bytes = file.bytes().await.expect("the output's bytes");
    assert_eq!(&bytes[..], &fake.output_bytes(&created.job_id)[..]);
    assert_eq!(
        image::guess_format(&bytes).ok(),
        Some(image::ImageFormat::WebP)
    );
    assert!(image::load_from_memory(&bytes).is_ok(), "a readable image");
    assert!(
        fake.requests_to("GET", "/v1/predictions")
            .iter()
            .all(|r| r.path != "/v1/predictions"),
        "no list without an unclear create"
    );
    assert!(!format!("{client:?}").contains(KEY));
    assert_key_not_logged();
    let creates = fake.creates();
    assert_eq!(creates.len(), 1);
    assert_eq!(creates[0].path, format!("/v1/models/{MODEL}/predictions"));
    assert_eq!(creates[0].status, Some(201));
    assert_eq!(
        creates[0].body,
        json!({"input": {"prompt": "a lighthouse at dawn"}}),
        "a create carries only `input`: no webhook, no webhook_events_filter"
    );
    fake.stop().await;
}

#[actix_web::test]
async fn a_version_creates_on_the_predictions_endpoint() {
    captured();
    let fake = FakeReplicate::start(KEY).await;
    fake.add_version(VERSION, "replicate/hello-world");
    let client = ReplicateClient::new(&ReplicateSettings {
        version: Some(VERSION.into()),
        model: None,
        ..settings(&fake)
    });
    let created = client.submit(&order("Alice")).await.expect("created");
    let (_, done) = poll_until_final(&client, &created.job_id).await;
    assert_eq!(done.status, JobStatus::Succeeded);
    let creates = fake.creates();
    assert_eq!(creates[0].path, "/v1/predictions");
    assert_eq!(
        creates[0].body,
        json!({"version": VERSION, "input": {"prompt": "Alice"}}),
        "only `version` and `input`"
    );
    fake.stop().await;
}

/// The documented statuses, each read through the adapter: the mapping of
/// the contract. A status the documentation adds later fails here first.
#[actix_web::test]
async fn every_documented_status_maps() {
    captured();
    let fake = fake_with_model().await;
    let client = ReplicateClient::new(&settings(&fake));
    let output = json!(["https://replicate.delivery/xezq/a/out-0.webp"]);
    let mut mapped = Vec::new();
    for status in DOCUMENTED_STATUSES {
        let (output, error) = match status {
            "succeeded" => (output.clone(), Value::Null),
            "failed" => (Value::Null, json!("CUDA out of memory")),
            _ => (Value::Null, Value::Null),
        };
        let id = fake.insert(MODEL, status, json!({"prompt": "p"}), output, error);
        let view = client.poll(&id).await;
        mapped.push((status, view.map(|v| v.status)));
    }
    let moderated = fake.insert(
        MODEL,
        "failed",
        json!({"prompt": "p"}),
        Value::Null,
        json!("NSFW content detected. Try running it again, or try a different prompt."),
    );
    let moderated = client.poll(&moderated).await.map(|v| v.status);
    let expected = [
        ("starting", JobStatus::Queued),
        ("processing", JobStatus::Running),
        ("succeeded", JobStatus::Succeeded),
        ("failed", JobStatus::Failed),
        ("canceled", JobStatus::Cancelled),
        ("aborted", JobStatus::Failed),
    ];
    for ((status, got), (documented, want)) in mapped.iter().zip(expected) {
        assert_eq!(*status, documented);
        assert_eq!(
            got.as_ref().ok(),
            Some(&want),
            "status {status:?} maps to {want:?}; got {got:?}"
        );
        assert_eq!(is_final(status), want.is_final(), "{status}");
    }
    assert_eq!(moderated, Ok(JobStatus::Rejected), "a moderation text");
    fake.stop().await;
}

#[actix_web::test]
async fn failures_and_moderation_end_the_job() {
    captured();
    let fake = fake_with_model().await;
    let quick = Duration::from_millis(20);
    fake.push_plans([
        Plan::Fail {
            starting: quick,
            processing: quick,
            error: "CUDA out of memory".into(),
        },
        Plan::Fail {
            starting: quick,
            processing: quick,
            error: "NSFW content detected. Try running it again, or try a different prompt.".into(),
        },
    ]);
    let client = ReplicateClient::new(&settings(&fake));
    let failing = client.submit(&order("please fail")).await.unwrap();
    let (_, failed) = poll_until_final(&client, &failing.job_id).await;
    assert_eq!(failed.status, JobStatus::Failed);
    assert_eq!(failed.error.as_deref(), Some("CUDA out of memory"));
    let nsfw = client.submit(&order("something")).await.unwrap();
    let (_, rejected) = poll_until_final(&client, &nsfw.job_id).await;
    assert_eq!(rejected.status, JobStatus::Rejected);
    assert!(rejected.error.unwrap().contains("NSFW"));
    fake.stop().await;
}

#[actix_web::test]
async fn auth_failures_are_rejected_requests_without_the_token() {
    captured();
    let fake = fake_with_model().await;
    let anonymous = ReplicateClient::new(&ReplicateSettings {
        api_key: None,
        ..settings(&fake)
    });
    let refused = anonymous.submit(&order("p")).await.unwrap_err();
    assert!(
        matches!(&refused, AiFailure::RequestRejected(m) if m.starts_with("HTTP 401")),
        "{refused:?}"
    );
    // A hostile answer that quotes the token back.
    fake.quote_token_in_401();
    let wrong = format!("{KEY}-revoked");
    let revoked_client = ReplicateClient::new(&ReplicateSettings {
        api_key: Some(ApiKey::new(&wrong)),
        ..settings(&fake)
    });
    let revoked = revoked_client.submit(&order("p")).await.unwrap_err();
    assert!(
        matches!(revoked, AiFailure::RequestRejected(_)),
        "{revoked:?}"
    );
    assert!(format!("{revoked}").contains("***"), "{revoked}");
    assert!(!format!("{revoked} {revoked:?}").contains(&wrong));
    assert_no_key(&revoked);
    assert_no_key(&revoked_client.poll("whatever").await.unwrap_err());
    assert!(fake.predictions().is_empty());
    assert_key_not_logged();
    fake.stop().await;
}

#[actix_web::test]
async fn a_429_is_throttled_not_an_attempt() {
    captured();
    let fake = fake_with_model().await;
    let client = ReplicateClient::new(&settings(&fake));
    fake.push_create_faults([
        CreateFault::Throttled {
            retry_after_s: Some(2),
            resets_in_s: 30,
        },
        CreateFault::Throttled {
            retry_after_s: None,
            resets_in_s: 30,
        },
    ]);
    let header = client.submit(&order("p")).await.unwrap_err();
    assert_eq!(header.retry_after_ms(), Some(2_000), "{header:?}");
    assert!(header.is_unavailable());
    let body = client.submit(&order("p")).await.unwrap_err();
    assert_eq!(
        body.retry_after_ms(),
        Some(30_000),
        "from the body: {body:?}"
    );
    assert!(fake.predictions().is_empty());
    let made = client
        .submit(&order("p"))
        .await
        .expect("then it goes through");
    assert_eq!(made.status, JobStatus::Queued);
    fake.stop().await;
}

/// The create makes its prediction but answers after the client's timeout:
/// unclear. The retry with the same order finds that prediction in the
/// list (by what the documentation promises: its input, its creation time)
/// and adopts it; `newer` predictions of other calls are made meanwhile, on
/// pages of `page_size`.
async fn unclear_create_is_adopted(newer: usize, page_size: usize) {
    captured();
    let fake = fake_with_model().await;
    fake.set_page_size(page_size);
    fake.set_default_plan(Plan::hold());
    let client = ReplicateClient::new(&settings(&fake));
    let order = order("a fox in the snow");
    fake.push_create_faults([CreateFault::MadeThenLate(Duration::from_secs(2))]);
    let sent = now_ms();
    let unclear = client.submit(&order).await.unwrap_err();
    assert!(matches!(unclear, AiFailure::Unclear(_)), "{unclear:?}");
    assert!(unclear.is_unavailable(), "not an attempt");
    assert_eq!(fake.predictions().len(), 1, "the prediction was made");
    for i in 0..newer {
        client
            .submit(&self::order(&format!("other {i}")))
            .await
            .unwrap();
    }
    let adopted = client
        .submit(&resent(&order, sent, &[], false))
        .await
        .expect("adopted");
    assert_eq!(adopted.lookup, Some(Lookup::Adopted));
    let ours: Vec<_> = fake
        .predictions()
        .into_iter()
        .filter(|p| p.input == json!({"prompt": "a fox in the snow"}))
        .collect();
    assert_eq!(
        ours.len(),
        1,
        "one prediction for the order, not a second billed one: {:?}",
        ours.iter().map(|p| &p.id).collect::<Vec<_>>()
    );
    assert_eq!(adopted.job_id, ours[0].id);
    assert_eq!(fake.predictions().len(), 1 + newer);
    assert_key_not_logged();
    fake.stop().await;
}

#[actix_web::test]
async fn an_unclear_create_is_adopted_from_the_list() {
    unclear_create_is_adopted(0, 100).await;
}

#[actix_web::test]
async fn an_unclear_create_is_found_on_the_second_page() {
    unclear_create_is_adopted(2, 2).await;
}

#[actix_web::test]
async fn an_unclear_create_that_made_nothing_is_sent_again() {
    captured();
    let fake = fake_with_model().await;
    let client = ReplicateClient::new(&settings(&fake));
    let order = order("p");
    fake.push_create_faults([CreateFault::DroppedBeforeMaking]);
    let sent = now_ms();
    let unclear = client.submit(&order).await.unwrap_err();
    assert!(matches!(unclear, AiFailure::Unclear(_)), "{unclear:?}");
    assert!(fake.predictions().is_empty());
    // Only looking (the slot adopter): none listed is no evidence (an
    // unclear answer, never a refusal that would free the slot), and
    // nothing is made.
    let none = client
        .submit(&resent(&order, sent, &[], true))
        .await
        .unwrap_err();
    assert!(matches!(none, AiFailure::Unclear(_)), "{none:?}");
    assert!(fake.predictions().is_empty(), "looking never makes one");
    // The saga's own retry: looked for, then made again once the list has
    // had its time to show it (5 s after the first send).
    let created = client
        .submit(&resent(&order, sent, &[], false))
        .await
        .expect("created");
    assert!(
        now_ms() - sent >= replicate::LIST_SETTLE_MS,
        "not before the list had its time"
    );
    assert_eq!(created.status, JobStatus::Queued);
    assert_eq!(created.lookup, Some(Lookup::CreatedAgain));
    assert_eq!(fake.predictions().len(), 1);
    assert_eq!(fake.creates().len(), 2);
    fake.stop().await;
}

/// A listed prediction with the same input that another call holds in the
/// ledger is never taken; of two that fit, the older is, and the look says
/// it was in doubt.
#[actix_web::test]
async fn a_prediction_held_by_another_call_is_never_taken() {
    captured();
    let fake = fake_with_model().await;
    fake.set_default_plan(Plan::hold());
    let client = ReplicateClient::new(&settings(&fake));
    let order = order("the same words");
    let sent = now_ms();
    let theirs = client.submit(&order).await.expect("another call's").job_id;
    fake.push_create_faults([CreateFault::MadeThenDropped]);
    assert!(client.submit(&order).await.is_err(), "unclear");
    let ours = fake
        .predictions()
        .into_iter()
        .map(|p| p.id)
        .find(|id| *id != theirs)
        .expect("the unclear create made one");
    let found = client
        .submit(&resent(&order, sent, &[&theirs], false))
        .await
        .expect("found");
    assert_eq!(
        found.job_id, ours,
        "not the one the ledger gives to another call"
    );
    assert_eq!(found.lookup, Some(Lookup::Adopted));
    let doubtful = client
        .submit(&resent(&order, sent, &[], false))
        .await
        .expect("found");
    assert_eq!(doubtful.job_id, theirs, "the older of two that fit");
    assert_eq!(doubtful.lookup, Some(Lookup::Ambiguous));
    assert_eq!(fake.creates().len(), 2, "no third create");
    fake.cancel_all_running();
    fake.stop().await;
}

#[actix_web::test]
async fn cancel_stops_a_running_prediction() {
    captured();
    let fake = fake_with_model().await;
    fake.push_plans([Plan::hold()]);
    let client = ReplicateClient::new(&settings(&fake));
    let slow = client.submit(&order("slow burn")).await.unwrap();
    assert_eq!(
        client.cancel(&slow.job_id).await.unwrap(),
        CancelOutcome::Final(JobStatus::Cancelled)
    );
    assert_eq!(
        client.poll(&slow.job_id).await.unwrap().status,
        JobStatus::Cancelled
    );
    // A prediction that ended before the cancel came: the documented
    // answer (200, the prediction as it stands) says it is final.
    let quick = client.submit(&order("quick")).await.unwrap();
    poll_until_final(&client, &quick.job_id).await;
    assert_eq!(
        client.cancel(&quick.job_id).await.unwrap(),
        CancelOutcome::Final(JobStatus::Succeeded),
    );
    assert_eq!(
        client.cancel("nosuchpredictionid").await.unwrap(),
        CancelOutcome::Unsupported
    );
    fake.stop().await;
}

#[actix_web::test]
async fn a_refused_connection_is_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = ReplicateClient::new(&ReplicateSettings {
        base_url: format!("http://{addr}"),
        model: Some("o/n".into()),
        request_timeout: Duration::from_millis(500),
        ..ReplicateSettings::new(Some(ApiKey::new(KEY)))
    });
    let failure = client.submit(&order("p")).await.unwrap_err();
    assert!(matches!(failure, AiFailure::Unavailable(_)), "{failure:?}");
    assert_no_key(&failure);
}

// ---------------------------------------------------------------- the photo

/// A JPEG's bytes as far as anyone checks (its first and last bytes), of
/// `len` bytes in all, the middle made from `seed`.
fn jpeg_bytes(len: usize, seed: u8) -> Vec<u8> {
    let mut bytes = vec![0xFF, 0xD8, 0xFF, 0xE0];
    bytes.extend((4..len - 2).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)));
    bytes.extend([0xFF, 0xD9]);
    bytes
}

/// `order` with the participant's photo.
fn with_photo(order: JobOrder, bytes: &[u8], url: Option<&str>) -> JobOrder {
    JobOrder {
        input: Some(stagehand::ai::InputPhoto {
            url: url.map(str::to_owned),
            bytes: bytes::Bytes::from(bytes.to_vec()),
            content_type: "image/jpeg".into(),
        }),
        ..order
    }
}

/// The bytes of a `data:image/jpeg;base64,…` input.
fn data_uri_bytes(value: &Value) -> Vec<u8> {
    use base64::Engine;
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("a string: {value}"));
    let data = text
        .strip_prefix("data:image/jpeg;base64,")
        .unwrap_or_else(|| panic!("a JPEG data URI: {}", &text[..text.len().min(60)]));
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .expect("base64")
}

/// A photo of at most 256 KB goes inline as a data URI, under the field
/// the providers file names (`photo_input`), and nothing is uploaded.
#[actix_web::test]
async fn a_small_photo_goes_as_a_data_uri_under_the_configured_field() {
    captured();
    let fake = fake_with_model().await;
    let client = ReplicateClient::new(&ReplicateSettings {
        photo_input: "input_image".into(),
        ..settings(&fake)
    });
    let photo = jpeg_bytes(20_000, 1);
    let created = client
        .submit(&with_photo(order("me in a comic"), &photo, None))
        .await
        .expect("created");
    let (_, done) = poll_until_final(&client, &created.job_id).await;
    assert_eq!(done.status, JobStatus::Succeeded);
    let input = &fake.creates()[0].body["input"];
    assert_eq!(input["prompt"], "me in a comic");
    assert!(
        data_uri_bytes(&input["input_image"]) == photo,
        "the data URI is the stored JPEG"
    );
    assert_eq!(
        input.as_object().unwrap().len(),
        2,
        "only prompt and the configured field: {}",
        input
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(fake.files().is_empty(), "nothing uploaded");
    assert!(fake.requests_to("POST", "/v1/files").is_empty());
    fake.stop().await;
}

/// A 300 KB photo (over the 256 KB of a data URI) is uploaded with the
/// Files API (`content` part: the exact bytes, file name and type) and the
/// input carries the file's `urls.get`.
#[actix_web::test]
async fn a_300_kb_photo_goes_through_the_files_api() {
    captured();
    let fake = fake_with_model().await;
    let client = ReplicateClient::new(&settings(&fake));
    let photo = jpeg_bytes(300 * 1024, 2);
    let created = client
        .submit(&with_photo(order("me in a comic"), &photo, None))
        .await
        .expect("created");
    let (_, done) = poll_until_final(&client, &created.job_id).await;
    assert_eq!(done.status, JobStatus::Succeeded);
    let files = fake.files();
    assert_eq!(files.len(), 1, "one upload");
    assert!(files[0].bytes == photo, "the file is the stored JPEG");
    assert_eq!(files[0].content_type, "image/jpeg");
    assert_eq!(files[0].filename, "photo.jpg");
    let uploads = fake.requests_to("POST", "/v1/files");
    assert_eq!(uploads[0].status, Some(201));
    let input = &fake.creates()[0].body["input"];
    assert_eq!(
        input,
        &json!({"prompt": "me in a comic", "image": fake.file_url(&files[0].id)})
    );
    assert_key_not_logged();
    fake.stop().await;
}

/// A photo with a URL (this server's signed URL) goes as that URL, however
/// large, and nothing is uploaded.
#[actix_web::test]
async fn a_photo_with_a_url_goes_as_that_url() {
    captured();
    let fake = fake_with_model().await;
    let client = ReplicateClient::new(&settings(&fake));
    let url = "https://booth.example/media/p1.jpg?exp=1796461200&sig=abc";
    client
        .submit(&with_photo(
            order("me"),
            &jpeg_bytes(300 * 1024, 3),
            Some(url),
        ))
        .await
        .expect("created");
    assert_eq!(
        fake.creates()[0].body["input"],
        json!({"prompt": "me", "image": url})
    );
    assert!(fake.files().is_empty(), "nothing uploaded");
    fake.stop().await;
}

/// An unclear create whose input carries a photo is found by that photo:
/// another guest's prediction with the same words and another photo, made
/// earlier in the window, is not taken (it would be, as the older, if the
/// photo were ignored). A Files-API photo is known by its checksum (the
/// retry would upload it under a new URL) and the adoption uploads
/// nothing.
async fn an_unclear_create_with_a_photo_is_found_by_it(len: usize) {
    captured();
    let fake = fake_with_model().await;
    fake.set_default_plan(Plan::hold());
    let client = ReplicateClient::new(&settings(&fake));
    let sent = now_ms();
    let theirs = client
        .submit(&with_photo(
            order("me as a knight"),
            &jpeg_bytes(len, 7),
            None,
        ))
        .await
        .expect("another guest's")
        .job_id;
    let ours = with_photo(order("me as a knight"), &jpeg_bytes(len, 8), None);
    fake.push_create_faults([CreateFault::MadeThenLate(Duration::from_secs(2))]);
    let unclear = client.submit(&ours).await.unwrap_err();
    assert!(matches!(unclear, AiFailure::Unclear(_)), "{unclear:?}");
    let made = fake
        .predictions()
        .into_iter()
        .map(|p| p.id)
        .find(|id| *id != theirs)
        .expect("the unclear create made one");
    let uploads = fake.files().len();
    let adopted = client
        .submit(&resent(&ours, sent, &[], false))
        .await
        .expect("found");
    assert_eq!(adopted.job_id, made, "ours, not the other guest's {theirs}");
    assert_eq!(adopted.lookup, Some(Lookup::Adopted));
    assert_eq!(fake.predictions().len(), 2, "no prediction made again");
    assert_eq!(fake.files().len(), uploads, "a look uploads nothing");
    fake.cancel_all_running();
    fake.stop().await;
}

#[actix_web::test]
async fn an_unclear_create_with_a_data_uri_photo_is_found_by_it() {
    an_unclear_create_with_a_photo_is_found_by_it(20_000).await;
}

#[actix_web::test]
async fn an_unclear_create_with_an_uploaded_photo_is_found_by_its_checksum() {
    an_unclear_create_with_a_photo_is_found_by_it(300 * 1024).await;
}

/// The fake takes file inputs as the reference has them: a Files-API
/// upload needs its `content` (and answers the file, readable with
/// `GET /v1/files/{id}`, 404 for another id); a data URL over 256 KB, or
/// one that is not base64, and a Files-API URL of no file are refused.
#[actix_web::test]
async fn the_fake_takes_file_inputs_as_documented() {
    use reqwest::multipart::{Form, Part};
    let fake = fake_with_model().await;
    let http = support::http_client();
    let upload = |form: Form| {
        http.post(format!("{}/v1/files", fake.url))
            .bearer_auth(KEY)
            .multipart(form)
            .send()
    };
    let content = Part::bytes(b"\xff\xd8\xff hello".to_vec())
        .file_name("photo.jpg")
        .mime_str("image/jpeg")
        .unwrap();
    let created = upload(Form::new().part("content", content)).await.unwrap();
    assert_eq!(created.status(), 201);
    let file: Value = created.json().await.unwrap();
    assert_eq!(file["content_type"], "image/jpeg");
    assert_eq!(file["size"], 9);
    assert_eq!(file["checksums"]["sha256"].as_str().map(str::len), Some(64));
    let get = |url: String| http.get(url).bearer_auth(KEY).send();
    let got = get(file["urls"]["get"].as_str().unwrap().to_owned())
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.json::<Value>().await.unwrap()["id"], file["id"]);
    assert_eq!(
        get(fake.file_url("nosuchfile")).await.unwrap().status(),
        404
    );
    let no_content = upload(Form::new().text("filename", "x.jpg")).await.unwrap();
    assert_eq!(no_content.status(), 422);
    let create = |input: Value| {
        http.post(format!("{}/v1/models/{MODEL}/predictions", fake.url))
            .bearer_auth(KEY)
            .json(&json!({ "input": input }))
            .send()
    };
    let big = {
        use base64::Engine;
        let bytes = vec![1u8; fake_replicate::DATA_URI_MAX_BYTES + 1];
        format!(
            "data:image/jpeg;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
    };
    for input in [
        json!({"prompt": "p", "image": big}),
        json!({"prompt": "p", "image": "data:image/jpeg;base64,***"}),
        json!({"prompt": "p", "image": fake.file_url("nosuchfile")}),
    ] {
        assert_eq!(create(input).await.unwrap().status(), 422);
    }
    let made = create(json!({"prompt": "p", "image": file["urls"]["get"]}))
        .await
        .unwrap();
    assert_eq!(made.status(), 201);
    fake.stop().await;
}

// ---------------------------------------------------------------- stagehand

/// The token in the variable the providers files name. Set once, before
/// the first app or server of this binary reads it.
fn key_in_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var(KEY_ENV, KEY));
}

/// A providers file with one Replicate provider `name`.
fn providers_file(dir: &tempfile::TempDir, name: &str, url: &str, model_line: &str) -> PathBuf {
    let path = dir.path().join("providers.toml");
    std::fs::write(
        &path,
        format!(
            "[providers.{name}]\nkind = \"replicate\"\nurl = \"{url}/v1\"\n\
             max_in_flight = 20\napi_key_env = \"{KEY_ENV}\"\n{model_line}\n"
        ),
    )
    .expect("write the providers file");
    path
}

/// stagehand (in this process) with one Replicate provider, its own name
/// (so its metrics are this test's), on the fake.
struct Booth {
    app: TestApp,
    fake: FakeReplicate,
    provider: String,
    _dir: tempfile::TempDir,
}

async fn booth(backend: Backend, tweak: impl FnOnce(&mut Config)) -> Booth {
    captured();
    key_in_env();
    let fake = fake_with_model().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let provider = format!("rep-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let file = providers_file(&dir, &provider, &fake.url, &format!("model = \"{MODEL}\""));
    let app = TestApp::spawn_with(backend, support::fast_sim(), |c| {
        c.providers = Some(file);
        tweak(c);
    })
    .await;
    Booth {
        app,
        fake,
        provider,
        _dir: dir,
    }
}

impl Booth {
    async fn experience(&self) -> String {
        let slug = format!("rep-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let resp = self
            .app
            .http
            .post(format!("{}/api/experiences", self.app.base))
            .bearer_auth(OPERATOR)
            .json(
                &json!({"slug": slug, "title": "Booth", "kind": "image", "ai_calls": 1,
                          "max_in_flight": 10, "provider": self.provider}),
            )
            .send()
            .await
            .expect("POST /api/experiences");
        assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
        slug
    }

    /// A new session of `slug` with `prompt` submitted: (id, token).
    async fn submit(&self, slug: &str, prompt: &str) -> (String, String) {
        let (sid, token, _) = self.submit_saga(slug, prompt).await;
        (sid, token)
    }

    /// As [`Booth::submit`], with the saga's id.
    async fn submit_saga(&self, slug: &str, prompt: &str) -> (String, String, String) {
        let (sid, token) = self.app.session(slug, None, "mo").await;
        let resp = self
            .app
            .submit(&sid, &token, json!({"prompt": prompt}), "k1")
            .await;
        assert_eq!(resp.status(), 202);
        let body: Value = resp.json().await.expect("JSON");
        let saga = body["saga_id"].as_str().expect("saga_id").to_owned();
        (sid, token, saga)
    }

    /// The session once final, or as it stands after `within`.
    async fn final_or_last(&self, sid: &str, token: &str, within: Duration) -> Value {
        let done = support::wait_for(within, || async {
            let s = self.app.status(sid, token).await;
            matches!(s["status"].as_str(), Some("COMPLETED" | "ABORTED")).then_some(s)
        })
        .await;
        match done {
            Some(s) => s,
            None => self.app.status(sid, token).await,
        }
    }

    async fn breaker(&self) -> Value {
        let (status, body) = self
            .app
            .operator_get(&format!("/api/admin/breaker?provider={}", self.provider))
            .await;
        assert_eq!(status, 200, "{body}");
        body
    }

    async fn provider_view(&self) -> Value {
        let (status, body) = self.app.operator_get("/api/admin/providers").await;
        assert_eq!(status, 200, "{body}");
        body["providers"]
            .as_array()
            .and_then(|all| {
                all.iter()
                    .find(|p| p["name"] == self.provider.as_str())
                    .cloned()
            })
            .unwrap_or_else(|| panic!("no provider {} in {body}", self.provider))
    }

    /// `stagehand_ai_unclear_creates_total{provider=<ours>,outcome}`, 0 when absent.
    async fn unclear_creates(&self, outcome: &str) -> f64 {
        let text = self
            .app
            .http
            .get(format!("{}/metrics", self.app.base))
            .bearer_auth(OPERATOR)
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .unwrap();
        let provider = format!("provider=\"{}\"", self.provider);
        let outcome = format!("outcome=\"{outcome}\"");
        text.lines()
            .filter(|l| l.starts_with("stagehand_ai_unclear_creates_total{"))
            .filter(|l| l.contains(&provider) && l.contains(&outcome))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, |sum, n| sum + n)
    }

    /// Nothing stagehand answers about the session holds the token.
    async fn assert_no_key_in_answers(&self, sid: &str, token: &str) {
        let session = self.app.status(sid, token).await.to_string();
        assert!(!session.contains(KEY), "{session}");
        let saga = self.app.saga_of(sid).await.to_string();
        assert!(!saga.contains(KEY), "{saga}");
        let providers = self
            .app
            .operator_get("/api/admin/providers")
            .await
            .1
            .to_string();
        assert!(!providers.contains(KEY), "{providers}");
    }

    async fn stop(self) {
        self.app.stop().await;
        self.fake.stop().await;
    }
}

/// The predictions made for `prompt`.
fn predictions_for(fake: &FakeReplicate, prompt: &str) -> Vec<fake_replicate::PredictionNow> {
    fake.predictions()
        .into_iter()
        .filter(|p| p.input == json!({"prompt": prompt}))
        .collect()
}

/// The session `done`'s one result is prediction `id`'s output, kept by
/// the stagehand at `base`: its URL is stagehand's own (`/media/r/…`), and
/// stagehand serves exactly the bytes the fake made for that prediction.
/// The URL.
async fn assert_output_kept(
    http: &reqwest::Client,
    base: &str,
    done: &Value,
    fake: &FakeReplicate,
    id: &str,
) -> String {
    let content = done["result"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no result content: {done}"));
    assert_eq!(content.len(), 1, "one output: {done}");
    let url = content[0]["url"]
        .as_str()
        .unwrap_or_else(|| panic!("no url: {done}"))
        .to_owned();
    assert!(
        url.starts_with("/media/r/") && url.ends_with(".webp"),
        "stagehand's own URL of a kept WebP, not the provider's: {url}; {done}"
    );
    let answer = http
        .get(format!("{base}{url}"))
        .send()
        .await
        .expect("GET the kept file");
    assert_eq!(answer.status(), 200, "GET {url}");
    assert_eq!(answer.headers()["content-type"], "image/webp", "GET {url}");
    let bytes = answer.bytes().await.expect("the kept file's bytes");
    assert!(
        bytes[..] == fake.output_bytes(id)[..],
        "GET {url}: {} bytes, not prediction {id}'s output ({} bytes)",
        bytes.len(),
        fake.output_bytes(id).len()
    );
    url
}

impl Booth {
    /// [`assert_output_kept`] of this booth's stagehand; and stagehand
    /// fetched that output from the fake once.
    async fn assert_kept(&self, done: &Value, id: &str) -> String {
        let url = assert_output_kept(&self.app.http, &self.app.base, done, &self.fake, id).await;
        assert_eq!(
            self.fake.output_fetches_of(id),
            1,
            "prediction {id}'s output fetched once: {:?}",
            self.fake.output_fetches()
        );
        url
    }
}

/// The create is made at the fake, then the connection drops with no
/// answer. stagehand finds that prediction (the list: same input, created
/// after its slot was taken, held by no other call) and adopts it: one
/// prediction, the session completes with its output.
async fn an_unclear_create_is_adopted_not_made_twice(backend: Backend) {
    let booth = booth(backend, |_| {}).await;
    let slug = booth.experience().await;
    booth
        .fake
        .push_create_faults([CreateFault::MadeThenDropped]);
    let (sid, token) = booth.submit(&slug, "a fox in the snow").await;
    let done = booth
        .final_or_last(&sid, &token, Duration::from_secs(20))
        .await;
    let ours = predictions_for(&booth.fake, "a fox in the snow");
    let creates = booth.fake.creates();
    assert_eq!(
        creates.first().map(|c| c.status),
        Some(None),
        "the first create was dropped"
    );
    assert_eq!(
        ours.len(),
        1,
        "exactly one prediction for the session (a second is a second bill); \
         creates: {} ({:?}); session: {done}",
        creates.len(),
        creates.iter().map(|c| c.status).collect::<Vec<_>>()
    );
    assert_eq!(done["status"], "COMPLETED", "{done}");
    // Its output: kept, and served by stagehand.
    booth.assert_kept(&done, &ours[0].id).await;
    assert!(
        booth.fake.cancels().is_empty(),
        "{:?}",
        booth.fake.cancels()
    );
    assert_eq!(
        booth.unclear_creates("adopted").await,
        1.0,
        "stagehand_ai_unclear_creates_total{{outcome=\"adopted\"}}"
    );
    booth.assert_no_key_in_answers(&sid, &token).await;
    assert_key_not_logged();
    booth.stop().await;
}
db_test!(an_unclear_create_is_adopted_not_made_twice);

/// The connection drops before the fake made anything: stagehand looks,
/// finds none, and creates again; one prediction in the end.
async fn a_create_dropped_before_anything_was_made_is_created_again(backend: Backend) {
    let booth = booth(backend, |_| {}).await;
    let slug = booth.experience().await;
    booth
        .fake
        .push_create_faults([CreateFault::DroppedBeforeMaking]);
    let (sid, token) = booth.submit(&slug, "a heron at dusk").await;
    let done = booth
        .final_or_last(&sid, &token, Duration::from_secs(20))
        .await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let ours = predictions_for(&booth.fake, "a heron at dusk");
    assert_eq!(ours.len(), 1, "one prediction");
    assert_eq!(booth.fake.creates().len(), 2, "dropped, then created again");
    booth.assert_kept(&done, &ours[0].id).await;
    assert_eq!(
        booth.unclear_creates("created_again").await,
        1.0,
        "stagehand_ai_unclear_creates_total{{outcome=\"created_again\"}}"
    );
    booth.assert_no_key_in_answers(&sid, &token).await;
    assert_key_not_logged();
    booth.stop().await;
}
db_test!(a_create_dropped_before_anything_was_made_is_created_again);

/// `aborted` ("terminated before it started running") is final: a failed
/// attempt. No cancel is sent to it, the breaker stays closed, and the saga
/// makes a new prediction; at the last attempt it ends AI_FAILED.
async fn an_aborted_prediction_is_a_failed_attempt(backend: Backend) {
    let booth = booth(backend, |c| {
        c.max_attempts = 2;
        c.ai_timeout = Duration::from_secs(4);
    })
    .await;
    let slug = booth.experience().await;

    booth.fake.push_plans([Plan::abort(200), Plan::quick()]);
    let (sid, token) = booth.submit(&slug, "a kite over dunes").await;
    let done = booth
        .final_or_last(&sid, &token, Duration::from_secs(20))
        .await;
    let ours = predictions_for(&booth.fake, "a kite over dunes");
    let statuses: Vec<&str> = ours.iter().map(|p| p.status).collect();
    let cancels = booth.fake.cancels();
    let breaker = booth.breaker().await;
    assert!(
        cancels.is_empty(),
        "no cancel to an aborted prediction: {} sent ({} to final ones); session {done}",
        cancels.len(),
        booth.fake.cancels_of_final().len()
    );
    assert_eq!(
        breaker["state"], "closed",
        "an aborted prediction opened the breaker: {breaker}; predictions {statuses:?}; \
         session {done}"
    );
    assert_eq!(
        statuses,
        ["aborted", "succeeded"],
        "a new prediction: {done}"
    );
    assert_eq!(done["status"], "COMPLETED", "{done}");
    // The second prediction's output, kept.
    booth.assert_kept(&done, &ours[1].id).await;
    assert_eq!(booth.fake.output_fetches_of(&ours[0].id), 0);
    let saga = booth.app.saga_of(&sid).await;
    assert_eq!(
        saga["attempts"], 1,
        "the aborted one was an attempt: {saga}"
    );

    // Aborted at every attempt: AI_FAILED after STAGEHAND_MAX_ATTEMPTS (2).
    booth.fake.push_plans([Plan::abort(100), Plan::abort(100)]);
    let (sid, token) = booth.submit(&slug, "a kite in the rain").await;
    let done = booth
        .final_or_last(&sid, &token, Duration::from_secs(20))
        .await;
    assert_eq!(done["status"], "ABORTED", "{done}");
    assert_eq!(done["abort_reason"], "AI_FAILED", "{done}");
    let ours = predictions_for(&booth.fake, "a kite in the rain");
    assert_eq!(ours.len(), 2, "one prediction per attempt");
    assert!(
        booth.fake.cancels().is_empty(),
        "{:?}",
        booth.fake.cancels()
    );
    assert_eq!(booth.breaker().await["state"], "closed");
    assert_key_not_logged();
    booth.stop().await;
}
db_test!(an_aborted_prediction_is_a_failed_attempt);

/// A 429 naming its wait pauses the whole provider (Replicate's limit is
/// per account): after it, no create of any saga reaches the fake for that
/// long. `retry_after_s` None: the wait is the body's "resets in ~Ns".
async fn a_429_pauses_the_whole_provider(backend: Backend, retry_after_s: Option<u64>) {
    let booth = booth(backend, |_| {}).await;
    let slug = booth.experience().await;
    let wait = match retry_after_s {
        // The header wins over the body.
        Some(seconds) => {
            booth.fake.push_create_faults([CreateFault::Throttled {
                retry_after_s: Some(seconds),
                resets_in_s: 30,
            }]);
            Duration::from_secs(seconds)
        }
        None => {
            booth.fake.push_create_faults([CreateFault::Throttled {
                retry_after_s: None,
                resets_in_s: 2,
            }]);
            Duration::from_secs(2)
        }
    };
    let first = booth.submit(&slug, "a gull").await;
    let throttled = support::wait_for(Duration::from_secs(10), || async {
        booth
            .fake
            .creates()
            .into_iter()
            .find(|c| c.status == Some(429))
    })
    .await
    .expect("the first create was throttled");
    // Another saga wants to create right after.
    let second = booth.submit(&slug, "a tern").await;
    let mut finals = Vec::new();
    for (sid, token) in [&first, &second] {
        finals.push(
            booth
                .final_or_last(sid, token, Duration::from_secs(25))
                .await,
        );
    }
    let slack = Duration::from_millis(100);
    let early: Vec<String> = booth
        .fake
        .creates()
        .iter()
        .filter(|c| c.at > throttled.answered)
        .map(|c| c.at.duration_since(throttled.answered))
        .filter(|gap| *gap + slack < wait)
        .map(|gap| format!("{:.2} s", gap.as_secs_f64()))
        .collect();
    assert!(
        early.is_empty(),
        "creates reached Replicate {early:?} after a 429 that said to wait {wait:?}"
    );
    for done in &finals {
        assert_eq!(done["status"], "COMPLETED", "{done}");
    }
    assert_eq!(booth.fake.predictions().len(), 2);
    for (prompt, done) in ["a gull", "a tern"].iter().zip(&finals) {
        let ours = predictions_for(&booth.fake, prompt);
        assert_eq!(ours.len(), 1, "{prompt}");
        booth.assert_kept(done, &ours[0].id).await;
    }
    assert_key_not_logged();
    booth.stop().await;
}

async fn a_429_with_retry_after_pauses_the_whole_provider(backend: Backend) {
    a_429_pauses_the_whole_provider(backend, Some(3)).await;
}
db_test!(a_429_with_retry_after_pauses_the_whole_provider);

async fn a_429_without_retry_after_pauses_for_the_body_s_wait(backend: Backend) {
    a_429_pauses_the_whole_provider(backend, None).await;
}
db_test!(a_429_without_retry_after_pauses_for_the_body_s_wait);

/// Replicate removes an API prediction's output files an hour after it
/// ran (its data retention page); stagehand kept its own copy when the job
/// succeeded, so the session's picture still shows once the original is
/// gone, and nothing is fetched from Replicate again.
async fn an_output_replicate_deletes_after_success_still_shows(backend: Backend) {
    let booth = booth(backend, |_| {}).await;
    let slug = booth.experience().await;
    let (sid, token) = booth.submit(&slug, "a lantern on a pier").await;
    let done = booth
        .final_or_last(&sid, &token, Duration::from_secs(20))
        .await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let ours = predictions_for(&booth.fake, "a lantern on a pier");
    assert_eq!(ours.len(), 1, "one prediction");
    let id = ours[0].id.clone();
    let url = booth.assert_kept(&done, &id).await;

    // An hour later at Replicate: the output is gone.
    booth.fake.remove_data(&id);
    let original = booth
        .app
        .http
        .get(booth.fake.output_url(&id))
        .send()
        .await
        .expect("GET the original");
    assert_eq!(original.status(), 404, "the fake removed the file");
    let removed = booth
        .fake
        .predictions()
        .into_iter()
        .find(|p| p.id == id)
        .expect("the prediction");
    assert_eq!(removed.json["data_removed"], true);
    assert_eq!(removed.output, Value::Null);

    // stagehand still shows it: the same URL, the same bytes.
    let now = booth.app.status(&sid, &token).await;
    assert_eq!(now["status"], "COMPLETED", "{now}");
    assert_eq!(now["result"]["content"][0]["url"], json!(url), "{now}");
    assert_output_kept(&booth.app.http, &booth.app.base, &now, &booth.fake, &id).await;
    let thumb = now["result"]["content"][0]["thumb_url"]
        .as_str()
        .unwrap_or_else(|| panic!("a thumbnail: {now}"))
        .to_owned();
    let answer = booth
        .app
        .http
        .get(format!("{}{thumb}", booth.app.base))
        .send()
        .await
        .expect("GET the thumbnail");
    assert_eq!(answer.status(), 200, "GET {thumb}");
    assert_eq!(
        answer.headers()["content-type"],
        "image/jpeg",
        "GET {thumb}"
    );
    assert_eq!(
        booth.fake.output_fetches_of(&id),
        2,
        "stagehand's one fetch and this test's: {:?}",
        booth.fake.output_fetches()
    );
    assert_key_not_logged();
    booth.stop().await;
}
db_test!(an_output_replicate_deletes_after_success_still_shows);

/// Operators cancel (one bulk cancel) sagas whose predictions are running;
/// Replicate refuses the cancels (a 4xx), then answers them unreadably
/// (the prediction is cancelled, the answer cut short). Neither is the
/// provider being down: the breaker stays closed, the slots come back, and
/// a new session completes at once.
async fn a_refused_cancel_never_opens_the_breaker(backend: Backend) {
    const SESSIONS: usize = 8;
    // Sagas poll rarely: the adopter's cancels are not interleaved with
    // the sagas' own polls, so refusals come in a row.
    let booth = booth(backend, |c| c.ai_poll_interval = Duration::from_secs(1)).await;
    let slug = booth.experience().await;
    for (round, answer) in [CancelAnswer::Refuse(409), CancelAnswer::Unreadable]
        .into_iter()
        .enumerate()
    {
        booth.fake.set_default_plan(Plan::hold());
        booth.fake.set_cancel_answer(answer);
        let cancels_before = booth.fake.cancels().len();
        let round_slug = booth.experience().await;
        for i in 0..SESSIONS {
            booth
                .submit(&round_slug, &format!("round {round} #{i}"))
                .await;
        }
        // Every prediction runs, and stagehand has seen it run.
        let prefix = format!("round {round} #");
        let running = support::wait_for(Duration::from_secs(15), || async {
            let running = booth
                .fake
                .predictions()
                .iter()
                .filter(|p| {
                    p.input["prompt"]
                        .as_str()
                        .is_some_and(|t| t.starts_with(&prefix))
                })
                .filter(|p| p.status == "processing")
                .count();
            (running == SESSIONS).then_some(())
        })
        .await;
        assert!(running.is_some(), "{answer:?}: the predictions never ran");
        // One bulk cancel: every saga at once, so the cancels go out
        // together (in a row, with no other request between them).
        let since = Instant::now();
        let resp = booth
            .app
            .http
            .post(format!("{}/api/admin/sagas/bulk", booth.app.base))
            .bearer_auth(OPERATOR)
            .json(&json!({"action": "cancel", "filter": {"experience": round_slug}}))
            .send()
            .await
            .expect("POST bulk cancel");
        assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
        // Each cancel went out (and maybe again); then either the breaker
        // opened, or the slots were given back.
        let settled = support::wait_for(Duration::from_secs(20), || async {
            let breaker = booth.breaker().await;
            if breaker["state"] != "closed" {
                return Some(breaker);
            }
            let cancels = booth.fake.cancels().len() - cancels_before;
            let view = booth.provider_view().await;
            let free = answer == CancelAnswer::Refuse(409) || view["in_flight"] == 0;
            (cancels >= SESSIONS && free).then_some(breaker)
        })
        .await
        .unwrap_or(Value::Null);
        let cancels = booth.fake.cancels().len() - cancels_before;
        let sequence: Vec<String> = booth
            .fake
            .requests()
            .iter()
            .filter(|r| r.at >= since)
            .map(|r| {
                let what = if r.path.ends_with("/cancel") {
                    "cancel"
                } else {
                    r.method.as_str()
                };
                format!(
                    "{what}:{}",
                    r.status.map_or("dropped".into(), |s| s.to_string())
                )
            })
            .collect();
        assert_eq!(
            settled["state"], "closed",
            "{answer:?}: {cancels} refused cancels opened the breaker: {settled}; requests: {sequence:?}"
        );
        let in_a_row = sequence
            .split(|r| !r.starts_with("cancel"))
            .map(<[String]>::len)
            .max()
            .unwrap_or(0);
        assert!(
            in_a_row >= 5,
            "the setup: {in_a_row} cancels in a row, fewer than a breaker counts: {sequence:?}"
        );
        assert!(settled["reason"].is_null(), "{settled}");
        assert!(cancels >= SESSIONS, "{answer:?}: {cancels} cancels");
        assert!(
            booth.fake.cancels_of_final().is_empty() || answer == CancelAnswer::Unreadable,
            "{answer:?}: a cancel to a final prediction: {:?}",
            booth.fake.cancels_of_final()
        );
        // The provider works: a new session completes at once.
        booth.fake.set_default_plan(Plan::quick());
        let (sid, token) = booth.submit(&slug, &format!("after round {round}")).await;
        let done = booth
            .final_or_last(&sid, &token, Duration::from_secs(10))
            .await;
        assert_eq!(done["status"], "COMPLETED", "{answer:?}: {done}");
        let ours = predictions_for(&booth.fake, &format!("after round {round}"));
        assert_eq!(ours.len(), 1, "{answer:?}");
        booth.assert_kept(&done, &ours[0].id).await;
        assert_eq!(booth.breaker().await["state"], "closed");
        // What still runs (refused cancels) ends, and its slots come back.
        booth.fake.cancel_all_running();
        let free = support::wait_for(Duration::from_secs(15), || async {
            (booth.provider_view().await["in_flight"] == 0).then_some(())
        })
        .await;
        assert!(free.is_some(), "{:?}", booth.provider_view().await);
    }
    assert_key_not_logged();
    booth.stop().await;
}
db_test!(a_refused_cancel_never_opens_the_breaker);

// ---------------------------------------------------------------- start-up

/// [`serve_until_exit_or_listening`] off the test's thread.
async fn serve(providers: &std::path::Path, db_url: &str) -> (Option<i32>, String) {
    let (providers, db_url) = (providers.to_owned(), db_url.to_owned());
    tokio::task::spawn_blocking(move || serve_until_exit_or_listening(&providers, &db_url))
        .await
        .expect("the serve thread")
}

/// `stagehand serve` with this providers file: its exit code and output
/// when it exits, or None (and the output so far) once it says it listens.
fn serve_until_exit_or_listening(
    providers: &std::path::Path,
    db_url: &str,
) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out.log");
    let file = std::fs::File::create(&out).expect("log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_stagehand"))
        .arg("serve")
        .env("STAGEHAND_DATABASE_URL", db_url)
        .env("STAGEHAND_BIND", "127.0.0.1:0")
        .env("STAGEHAND_OPERATOR_TOKEN", OPERATOR)
        .env("STAGEHAND_PROVIDERS", providers)
        .env("STAGEHAND_MEDIA_URL", dir.path().join("media"))
        .env(KEY_ENV, KEY)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file"))
        .stderr(file)
        .spawn()
        .expect("start stagehand serve");
    let started = Instant::now();
    let read = || std::fs::read_to_string(&out).unwrap_or_default();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return (status.code(), read());
        }
        if read().contains("stagehand listening on") {
            let _ = child.kill();
            let _ = child.wait();
            return (None, read());
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "stagehand serve neither exited nor listened in 60 s:\n{}",
                read()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A model Replicate does not know (404 on `GET /v1/models/{owner}/{name}`)
/// stops `stagehand serve` before it serves, with a message that names the
/// model and says what to change.
#[actix_web::test]
async fn serve_refuses_a_model_that_does_not_exist() {
    let fake = FakeReplicate::start(KEY).await;
    let db = support::TestDb::fresh(Backend::Sqlite).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = providers_file(&dir, "images", &fake.url, "model = \"acme/no-such-model\"");
    let (code, output) = serve(&file, &db.url).await;
    let asked = fake.requests_to("GET", "/v1/models/acme/no-such-model");
    assert!(
        code.is_some(),
        "stagehand serve started serving a model Replicate does not have \
         (GET /v1/models/acme/no-such-model asked {} times):\n{output}",
        asked.len()
    );
    assert_ne!(code, Some(0), "{output}");
    assert!(
        output.contains("acme/no-such-model"),
        "names the model:\n{output}"
    );
    assert!(output.contains("version"), "says what to change:\n{output}");
    assert_eq!(asked.len(), 1, "asked Replicate once");
    assert!(!output.contains(KEY), "{output}");
    fake.stop().await;
}

/// A model Replicate knows starts (after asking for it); with `version`
/// set, no model is looked up.
#[actix_web::test]
async fn serve_starts_with_a_model_that_exists() {
    let fake = fake_with_model().await;
    let db = support::TestDb::fresh(Backend::Sqlite).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = providers_file(&dir, "images", &fake.url, &format!("model = \"{MODEL}\""));
    let (code, output) = serve(&file, &db.url).await;
    assert_eq!(code, None, "it starts:\n{output}");
    assert!(!output.contains(KEY), "{output}");
    let asked = fake.requests_to("GET", &format!("/v1/models/{MODEL}"));
    assert_eq!(asked.len(), 1, "the model was checked at start");
    assert_eq!(
        asked[0].authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );

    let versioned = FakeReplicate::start(KEY).await;
    versioned.add_version(VERSION, "someone/community-model");
    let db = support::TestDb::fresh(Backend::Sqlite).await;
    let file = providers_file(
        &dir,
        "images",
        &versioned.url,
        &format!("version = \"{VERSION}\""),
    );
    let (code, output) = serve(&file, &db.url).await;
    assert_eq!(code, None, "it starts:\n{output}");
    assert!(
        versioned.requests_to("GET", "/v1/models/").is_empty(),
        "no check with a version"
    );
    fake.stop().await;
    versioned.stop().await;
}

// ---------------------------------------------------------------- a crash

/// `stagehand serve` of one Replicate provider on `db_url`, listening on
/// `port` (its output in `log`): the lease is short so another worker may
/// resume its sagas soon after it dies; its media in a folder beside the
/// providers file (shared by every process of one test; on PostgreSQL the
/// default would be `stagehand-media` in the working directory, the
/// checkout); every other setting is the default (the dispatcher's 10 s
/// poll among them).
fn serve_child(
    providers: &std::path::Path,
    db_url: &str,
    port: u16,
    log: &std::path::Path,
) -> Served {
    let file = std::fs::File::create(log).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_stagehand"))
        .arg("serve")
        .env("STAGEHAND_DATABASE_URL", db_url)
        .env("STAGEHAND_BIND", format!("127.0.0.1:{port}"))
        .env("STAGEHAND_OPERATOR_TOKEN", OPERATOR)
        .env("STAGEHAND_PROVIDERS", providers)
        .env("STAGEHAND_LEASE", "2s")
        .env(
            "STAGEHAND_MEDIA_URL",
            providers
                .parent()
                .expect("the providers file's folder")
                .join("media"),
        )
        .env(KEY_ENV, KEY)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file"))
        .stderr(file)
        .spawn()
        .expect("start stagehand serve");
    Served(child)
}

/// A `stagehand serve` child, killed (SIGKILL) and reaped when dropped, so
/// a failing test leaves no server behind.
struct Served(std::process::Child);

impl Served {
    fn kill(&mut self) {
        self.0.kill().expect("SIGKILL the server");
        self.0.wait().expect("reap it");
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// Waits until `log` says the server listens.
async fn listening(log: &std::path::Path) {
    let ready = support::wait_for(Duration::from_secs(60), || async {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains("stagehand listening on")
            .then_some(())
    })
    .await;
    assert!(
        ready.is_some(),
        "the server did not listen:\n{}",
        support::tail(log, 20)
    );
}

/// A worker killed (SIGKILL) after its create reached Replicate and before
/// it recorded the prediction: the next process resumes the call in the
/// slot it holds (a key, no job id), finds the prediction by the list, and
/// goes on with it. One prediction, the session COMPLETED. The adapter of
/// before kept the keys of unclear creates in memory, which a restart
/// loses: the new process created a second, billed prediction.
async fn a_worker_killed_before_it_recorded_its_prediction_is_not_doubled(backend: Backend) {
    key_in_env();
    let fake = fake_with_model().await;
    // The create is made at once; its answer would come a minute later.
    fake.push_create_faults([CreateFault::MadeThenLate(Duration::from_secs(60))]);
    let db = support::TestDb::fresh(backend).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let provider = "rep-crash";
    let providers = providers_file(&dir, provider, &fake.url, &format!("model = \"{MODEL}\""));
    let (first_log, second_log) = (dir.path().join("first.log"), dir.path().join("second.log"));
    let port = free_port();
    let mut first = serve_child(&providers, &db.url, port, &first_log);
    listening(&first_log).await;
    let http = support::http_client();
    let base = format!("http://127.0.0.1:{port}");
    let resp = http
        .post(format!("{base}/api/experiences"))
        .bearer_auth(OPERATOR)
        .json(&json!({"slug": "crash", "title": "Booth", "kind": "image", "provider": provider}))
        .send()
        .await
        .expect("POST /api/experiences");
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    let (sid, token) = support::create_session(&http, &base, "crash", None, "kit").await;
    let resp = support::submit(
        &http,
        &base,
        &sid,
        &token,
        json!({"prompt": "a lighthouse in a storm"}),
        "k1",
    )
    .await;
    assert_eq!(resp.status(), 202);
    let fake_ref = &fake;
    // The fake records a request once answered; the prediction is made at
    // once.
    let created = support::wait_for(Duration::from_secs(30), || async move {
        (fake_ref.predictions().len() == 1).then_some(())
    })
    .await;
    assert!(
        created.is_some(),
        "the create reached the fake:\n{}",
        support::tail(&first_log, 20)
    );
    first.kill();

    let port = free_port();
    let mut second = serve_child(&providers, &db.url, port, &second_log);
    listening(&second_log).await;
    let base = format!("http://127.0.0.1:{port}");
    let done = support::wait_final(&http, &base, &sid, &token, Duration::from_secs(60)).await;
    let metrics = http
        .get(format!("{base}/metrics"))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("the metrics");
    assert_eq!(
        done["status"],
        "COMPLETED",
        "{done}\n{}",
        support::tail(&second_log, 30)
    );
    let ours: Vec<String> = fake
        .predictions()
        .into_iter()
        .filter(|p| p.input == json!({"prompt": "a lighthouse in a storm"}))
        .map(|p| p.id)
        .collect();
    assert_eq!(ours.len(), 1, "one billed prediction, not two: {ours:?}");
    // Its output, kept by the second process and served by it.
    assert_output_kept(&http, &base, &done, &fake, &ours[0]).await;
    assert_eq!(fake.output_fetches_of(&ours[0]), 1, "fetched once");
    second.kill();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("stagehand_ai_unclear_creates_total")
                && l.contains(&format!("provider=\"{provider}\""))
                && l.contains("outcome=\"adopted\"")
                && l.ends_with(" 1")),
        "the look is counted as adopted:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("unclear_creates"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    fake.stop().await;
}
db_test!(a_worker_killed_before_it_recorded_its_prediction_is_not_doubled);

// ------------------------------------------- the ledger frees on evidence

const LEDGER_PHOTO: &[u8] = include_bytes!("fixtures/photo-small.png");

/// A prediction that runs well past the adopter's first look (which comes
/// about 5 s after the create, once the list has had its time).
const RUNS_ON: Plan = Plan::Succeed {
    starting: Duration::from_millis(50),
    processing: Duration::from_secs(12),
};

impl Booth {
    /// A photo experience on this booth's provider; its slug.
    async fn photo_experience(&self) -> String {
        let slug = format!("rep-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let resp = self
            .app
            .http
            .post(format!("{}/api/experiences", self.app.base))
            .bearer_auth(OPERATOR)
            .json(&json!({"slug": slug, "title": "Portrait", "kind": "image",
                          "input": "photo", "ai_calls": 1, "max_in_flight": 10,
                          "provider": self.provider}))
            .send()
            .await
            .expect("POST /api/experiences");
        assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
        slug
    }

    /// A session of the photo experience `slug` whose photo is uploaded
    /// and submitted: (id, token, saga id).
    async fn submit_photo(&self, slug: &str) -> (String, String, String) {
        let (sid, token) = self.app.session(slug, None, "pat").await;
        let photo: Value = self
            .app
            .http
            .post(format!("{}/api/sessions/{sid}/photo", self.app.base))
            .bearer_auth(&token)
            .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .header("content-type", "image/png")
            .body(LEDGER_PHOTO.to_vec())
            .send()
            .await
            .expect("POST photo")
            .json()
            .await
            .expect("the photo's JSON");
        let resp = self
            .app
            .submit(&sid, &token, json!({"photo_id": photo["photo_id"]}), "p1")
            .await;
        assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
        let body: Value = resp.json().await.expect("JSON");
        let saga = body["saga_id"].as_str().expect("saga_id").to_owned();
        (sid, token, saga)
    }

    /// The one create was made and its answer dropped: the prediction's id.
    async fn the_dropped_create(&self) -> String {
        let made = support::wait_for(Duration::from_secs(10), || async {
            let creates = self.fake.creates();
            let predictions = self.fake.predictions();
            (creates.len() == 1 && creates[0].status.is_none() && predictions.len() == 1)
                .then(|| predictions[0].id.clone())
        })
        .await;
        made.unwrap_or_else(|| {
            panic!(
                "no dropped create: creates {:?}, predictions {:?}",
                self.fake.creates().len(),
                self.fake.predictions().len()
            )
        })
    }

    /// Waits until the ledger holds no slot; then the prediction `id` must
    /// be final (no job runs in a freed slot), and it was never made twice.
    /// (A prediction found only by the list is watched to its end, never
    /// cancelled: it might be someone else's.)
    async fn assert_slot_freed_only_once_final(&self, id: &str) {
        let store = &self.app.state.store;
        let freed = support::wait_for(Duration::from_secs(45), || async {
            (store.ledger_rows().await.expect("the ledger") == 0).then_some(())
        })
        .await;
        let now: Vec<_> = self.fake.predictions();
        let ours = now.iter().find(|p| p.id == id).expect("the prediction");
        eprintln!(
            "prediction {id}: {} when the ledger emptied ({freed:?}); cancels {:?}",
            ours.status,
            self.fake
                .cancels()
                .iter()
                .map(|c| &c.id)
                .collect::<Vec<_>>()
        );
        assert!(freed.is_some(), "the slot was never freed");
        assert!(
            is_final(ours.status),
            "the slot was freed while its prediction is {}: the account runs more than its cap",
            ours.status
        );
        assert_eq!(
            self.fake.creates().len(),
            1,
            "the look made no second prediction"
        );
    }
}

/// A booth whose predictions run on (`RUNS_ON`) and whose first create
/// is made and its answer dropped; a saga's own look again comes only
/// 20 s later, after what the test does meanwhile.
async fn booth_whose_first_create_is_dropped(backend: Backend) -> Booth {
    let booth = booth(backend, |c| {
        c.backoff_base = Duration::from_secs(20);
        c.backoff_max = Duration::from_secs(20);
    })
    .await;
    booth.fake.set_default_plan(RUNS_ON);
    booth
        .fake
        .push_create_faults([CreateFault::MadeThenDropped]);
    booth
}

/// An unclear create of a photo experience, then the operator cancels the
/// saga: its slot is detached and adopted. The adopter must look with the
/// order as it was sent, photo included. Before, it rebuilt the order from
/// the prompt alone, found nothing, took that for a refusal and freed the
/// slot while the prediction ran on (never cancelled).
async fn an_unclear_create_then_a_cancel_on_a_photo_experience_keeps_the_slot(backend: Backend) {
    let booth = booth_whose_first_create_is_dropped(backend).await;
    let slug = booth.photo_experience().await;
    let (_sid, _token, saga) = booth.submit_photo(&slug).await;
    let id = booth.the_dropped_create().await;
    let (status, _, body) = booth
        .app
        .operator_post(&format!("/api/admin/sagas/{saga}/cancel"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    booth.assert_slot_freed_only_once_final(&id).await;
    booth.stop().await;
}
db_test!(an_unclear_create_then_a_cancel_on_a_photo_experience_keeps_the_slot);

/// An unclear create, then the guest erases the session while the saga
/// waits to look again: erasure blanks the saga's prompt. The adopter
/// must still look with the prompt that was sent (the ledger row's copy,
/// which goes with the row). Before, it looked with the blank prompt,
/// found nothing and freed the slot while the prediction ran on.
async fn an_unclear_create_then_erasure_keeps_the_slot(backend: Backend) {
    let booth = booth_whose_first_create_is_dropped(backend).await;
    let slug = booth.experience().await;
    let (sid, token) = booth.submit(&slug, "a wish to forget").await;
    let id = booth.the_dropped_create().await;
    // The list is down while the session is erased, so the adopter's
    // first look (which may read the order before erasure blanks it) is
    // refused and every later one comes after the erasure.
    booth.fake.set_list_unavailable(true);
    let erased = booth
        .app
        .http
        .delete(format!("{}/api/sessions/{sid}", booth.app.base))
        .bearer_auth(&token)
        .send()
        .await
        .expect("DELETE the session");
    assert!(erased.status().is_success(), "{:?}", erased.text().await);
    let refused = support::wait_for(Duration::from_secs(20), || async {
        booth
            .fake
            .requests_to("GET", "/v1/predictions")
            .iter()
            .any(|r| r.status == Some(503))
            .then_some(())
    })
    .await;
    assert!(refused.is_some(), "the adopter never looked at the list");
    booth.fake.set_list_unavailable(false);
    booth.assert_slot_freed_only_once_final(&id).await;
    booth.stop().await;
}
db_test!(an_unclear_create_then_erasure_keeps_the_slot);
