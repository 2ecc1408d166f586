//! The Replicate adapter (`stagehand::ai::ReplicateClient`), black box
//! through HTTP against a fake Replicate written from Replicate's HTTP API
//! documentation (an actix-web server on 127.0.0.1:0 in this file):
//! create (with `version`, and for an official model), get, cancel, list
//! (newest first, paginated with a `next` URL), bearer auth (401 without),
//! statuses moving starting -> processing -> succeeded over polls, a failing
//! prediction, an NSFW failure, 429 with and without `Retry-After`, and a
//! create that makes its prediction but answers too late: the retry adopts
//! that prediction instead of making a second one. The token never reaches
//! a log line (this test binary captures every log at DEBUG), a `Debug`
//! output or a failure text.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Value};
use stagehand::ai::{
    ApiKey, CancelOutcome, JobOrder, JobStatus, ReplicateClient, ReplicateSettings,
};
use stagehand::domain::failure::AiFailure;

const KEY: &str = "r8_fake-TOKEN-3f9a0c71d2e84b56";

// ---------------------------------------------------------------- logs

type Captured = support::CapturedLogs;

/// Every log of this test binary.
fn captured() -> Captured {
    support::captured_logs("debug")
}

fn assert_key_not_logged() {
    let text = String::from_utf8_lossy(&captured().0.lock().unwrap()).into_owned();
    assert!(
        text.contains("Replicate: create a prediction"),
        "the logs are captured"
    );
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

// ---------------------------------------------------------------- the fake

/// One prediction of the fake account.
#[derive(Debug, Clone)]
struct Stored {
    id: String,
    model: String,
    version: Option<String>,
    input: Value,
    webhook: Option<String>,
    status: &'static str,
    output: Value,
    error: Value,
    /// Polls answered so far (drives starting -> processing -> final).
    polls: u32,
}

impl Stored {
    fn json(&self, with_webhook: bool) -> Value {
        let mut v = json!({
            "id": self.id,
            "model": self.model,
            "version": self.version.clone().unwrap_or_else(|| "hidden".into()),
            "input": self.input,
            "logs": "",
            "output": self.output,
            "error": self.error,
            "status": self.status,
            "source": "api",
            "created_at": "2025-01-01T00:00:00.000Z",
            "urls": {
                "get": format!("https://api.replicate.com/v1/predictions/{}", self.id),
                "cancel": format!("https://api.replicate.com/v1/predictions/{}/cancel", self.id),
            },
        });
        if with_webhook {
            v["webhook"] = json!(self.webhook);
        }
        v
    }

    /// What one poll sees: starting, then processing, then the outcome
    /// the prompt asks for ("slow" never ends by itself).
    fn advance(&mut self) {
        self.polls += 1;
        let prompt = self.input["prompt"].as_str().unwrap_or_default().to_owned();
        match (self.status, self.polls) {
            ("starting", _) => self.status = "processing",
            ("processing", _) if prompt.contains("slow") => {}
            ("processing", _) if prompt.contains("nsfw") => {
                self.status = "failed";
                self.error = json!(
                    "NSFW content detected. Try running it again, or try a different prompt."
                );
            }
            ("processing", _) if prompt.contains("fail") => {
                self.status = "failed";
                self.error = json!("CUDA out of memory");
            }
            ("processing", _) => {
                self.status = "succeeded";
                self.output = json!([format!(
                    "https://replicate.delivery/fake/{}/out-0.webp",
                    self.id
                )]);
            }
            _ => {}
        }
    }
}

#[derive(Default)]
struct FakeState {
    predictions: Mutex<Vec<Stored>>,
    creations: Mutex<u32>,
    list_calls: Mutex<u32>,
    /// Create bodies received, with their path.
    creates: Mutex<Vec<(String, Value)>>,
    /// The next create makes its prediction, then answers after this long.
    stall_next_create: Mutex<Option<Duration>>,
    /// The next request is throttled; `Some(seconds)` adds `Retry-After`.
    throttle_next: Mutex<Option<Option<u64>>>,
    /// Every token is refused, quoted back in the answer.
    revoked: Mutex<bool>,
    /// List results carry `webhook` (the documented list example does
    /// not show it; get answers always carry it).
    list_shows_webhook: Mutex<bool>,
    page_size: Mutex<usize>,
}

struct Fake {
    url: String,
    state: Arc<FakeState>,
    server: actix_web::dev::ServerHandle,
}

impl Fake {
    async fn start() -> Fake {
        let state = Arc::new(FakeState::default());
        *state.page_size.lock().unwrap() = 100;
        let data = web::Data::from(state.clone());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake");
        let port = listener.local_addr().unwrap().port();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .route("/v1/predictions", web::post().to(create_with_version))
                .route("/v1/predictions", web::get().to(list))
                .route(
                    "/v1/models/{owner}/{name}/predictions",
                    web::post().to(create_for_model),
                )
                .route("/v1/predictions/{id}", web::get().to(get))
                .route("/v1/predictions/{id}/cancel", web::post().to(cancel))
        })
        .workers(1)
        .listen(listener)
        .expect("listen")
        .disable_signals()
        .run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        Fake {
            url: format!("http://127.0.0.1:{port}"),
            state,
            server: handle,
        }
    }

    fn creations(&self) -> u32 {
        *self.state.creations.lock().unwrap()
    }

    fn list_calls(&self) -> u32 {
        *self.state.list_calls.lock().unwrap()
    }

    fn carrying(&self, key: uuid::Uuid) -> usize {
        let suffix = format!("/replicate/{key}");
        self.state
            .predictions
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.webhook.as_deref().is_some_and(|w| w.ends_with(&suffix)))
            .count()
    }

    async fn stop(self) {
        self.server.stop(false).await;
    }
}

/// Auth and scripted throttling, before any endpoint.
fn gate(state: &FakeState, req: &HttpRequest) -> Option<HttpResponse> {
    let authorization = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if *state.revoked.lock().unwrap() {
        let got = authorization.trim_start_matches("Bearer ");
        return Some(HttpResponse::Unauthorized().json(json!({
            "title": "Unauthenticated",
            "detail": format!("The token {got} was revoked"),
            "status": 401,
        })));
    }
    if authorization != format!("Bearer {KEY}") {
        return Some(HttpResponse::Unauthorized().json(json!({
            "title": "Unauthenticated",
            "detail": "You did not pass a valid authentication token",
            "status": 401,
        })));
    }
    if let Some(retry_after) = state.throttle_next.lock().unwrap().take() {
        let mut answer = HttpResponse::TooManyRequests();
        if let Some(seconds) = retry_after {
            answer.insert_header(("Retry-After", seconds.to_string()));
        }
        return Some(answer.json(json!({
            "detail": "Request was throttled. Your rate limit resets in ~30s."
        })));
    }
    None
}

async fn create(
    state: &FakeState,
    path: &str,
    model: String,
    version: Option<String>,
    body: Value,
) -> HttpResponse {
    state
        .creates
        .lock()
        .unwrap()
        .push((path.to_owned(), body.clone()));
    if !body["input"]["prompt"].is_string() {
        return HttpResponse::UnprocessableEntity().json(json!({
            "title": "Input validation failed",
            "detail": "- input: prompt is required",
            "status": 422,
        }));
    }
    let stored = Stored {
        id: uuid::Uuid::new_v4().simple().to_string()[..26].to_owned(),
        model,
        version,
        input: body["input"].clone(),
        webhook: body["webhook"].as_str().map(str::to_owned),
        status: "starting",
        output: Value::Null,
        error: Value::Null,
        polls: 0,
    };
    let answer = stored.json(true);
    state.predictions.lock().unwrap().push(stored);
    *state.creations.lock().unwrap() += 1;
    let stall = state.stall_next_create.lock().unwrap().take();
    if let Some(stall) = stall {
        // Made, but the answer comes after the client gave up.
        actix_web::rt::time::sleep(stall).await;
    }
    HttpResponse::Created().json(answer)
}

async fn create_with_version(
    state: web::Data<FakeState>,
    req: HttpRequest,
    body: web::Json<Value>,
) -> HttpResponse {
    if let Some(answer) = gate(&state, &req) {
        return answer;
    }
    let Some(version) = body["version"].as_str().map(str::to_owned) else {
        return HttpResponse::UnprocessableEntity().json(json!({
            "title": "Invalid version", "detail": "version is required", "status": 422}));
    };
    create(
        &state,
        req.path(),
        "community/model".into(),
        Some(version),
        body.into_inner(),
    )
    .await
}

async fn create_for_model(
    state: web::Data<FakeState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    body: web::Json<Value>,
) -> HttpResponse {
    if let Some(answer) = gate(&state, &req) {
        return answer;
    }
    let (owner, name) = path.into_inner();
    create(
        &state,
        req.path(),
        format!("{owner}/{name}"),
        None,
        body.into_inner(),
    )
    .await
}

async fn get(state: web::Data<FakeState>, req: HttpRequest, id: web::Path<String>) -> HttpResponse {
    if let Some(answer) = gate(&state, &req) {
        return answer;
    }
    let mut predictions = state.predictions.lock().unwrap();
    match predictions.iter_mut().find(|p| p.id == *id) {
        Some(p) => {
            let answer = p.json(true);
            p.advance();
            HttpResponse::Ok().json(answer)
        }
        None => HttpResponse::NotFound().json(json!({"detail": "Not found."})),
    }
}

async fn cancel(
    state: web::Data<FakeState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    if let Some(answer) = gate(&state, &req) {
        return answer;
    }
    let mut predictions = state.predictions.lock().unwrap();
    match predictions.iter_mut().find(|p| p.id == *id) {
        Some(p) => {
            // A completed prediction cannot be canceled.
            if matches!(p.status, "starting" | "processing") {
                p.status = "canceled";
            }
            HttpResponse::Ok().json(p.json(true))
        }
        None => HttpResponse::NotFound().json(json!({"detail": "Not found."})),
    }
}

#[derive(serde::Deserialize)]
struct Cursor {
    cursor: Option<usize>,
}

async fn list(
    state: web::Data<FakeState>,
    req: HttpRequest,
    query: web::Query<Cursor>,
) -> HttpResponse {
    if let Some(answer) = gate(&state, &req) {
        return answer;
    }
    *state.list_calls.lock().unwrap() += 1;
    let size = *state.page_size.lock().unwrap();
    let with_webhook = *state.list_shows_webhook.lock().unwrap();
    let predictions = state.predictions.lock().unwrap();
    // Newest first.
    let newest_first: Vec<&Stored> = predictions.iter().rev().collect();
    let start = query.cursor.unwrap_or(0);
    let page: Vec<Value> = newest_first
        .iter()
        .skip(start)
        .take(size)
        .map(|p| p.json(with_webhook))
        .collect();
    let next = (start + size < newest_first.len()).then(|| {
        // The real API's absolute URL: the adapter must ask its own base.
        format!(
            "https://api.replicate.com/v1/predictions?cursor={}",
            start + size
        )
    });
    HttpResponse::Ok().json(json!({"next": next, "previous": null, "results": page}))
}

// ---------------------------------------------------------------- helpers

fn settings(fake: &Fake) -> ReplicateSettings {
    ReplicateSettings {
        base_url: format!("{}/v1", fake.url),
        model: Some("black-forest-labs/flux-schnell".into()),
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
    }
}

async fn poll_until_final(client: &ReplicateClient, job_id: &str) -> stagehand::ai::JobView {
    for _ in 0..10 {
        let view = client.poll(job_id).await.expect("poll");
        if view.status.is_final() {
            return view;
        }
    }
    panic!("{job_id} never ended");
}

// ---------------------------------------------------------------- tests

#[actix_web::test]
async fn a_prediction_progresses_to_an_image() {
    captured();
    let fake = Fake::start().await;
    let client = ReplicateClient::new(&settings(&fake));
    let order = order("a lighthouse at dawn");
    let created = client.submit(&order).await.expect("created");
    assert_eq!(created.status, JobStatus::Queued);
    let (path, body) = fake.state.creates.lock().unwrap()[0].clone();
    assert_eq!(
        path,
        "/v1/models/black-forest-labs/flux-schnell/predictions"
    );
    assert_eq!(body["input"], json!({"prompt": "a lighthouse at dawn"}));
    assert_eq!(
        body["webhook"],
        json!(format!(
            "https://stagehand.invalid/replicate/{}",
            order.idempotency_key
        ))
    );
    assert_eq!(body["webhook_events_filter"], json!(["completed"]));
    let first = client.poll(&created.job_id).await.unwrap();
    assert_eq!(first.status, JobStatus::Queued, "still starting");
    let second = client.poll(&created.job_id).await.unwrap();
    assert_eq!(second.status, JobStatus::Running);
    let done = client.poll(&created.job_id).await.unwrap();
    assert_eq!(done.status, JobStatus::Succeeded);
    let result = done.result.expect("a result");
    assert_eq!(result.content.len(), 1);
    assert_eq!(result.content[0].kind, "image");
    assert!(result.content[0]
        .url
        .as_deref()
        .unwrap()
        .ends_with("/out-0.webp"));
    assert_eq!(fake.list_calls(), 0, "no lookup without an unclear create");
    assert!(!format!("{client:?}").contains(KEY));
    assert_key_not_logged();
    fake.stop().await;
}

#[actix_web::test]
async fn a_version_creates_on_the_predictions_endpoint() {
    captured();
    let fake = Fake::start().await;
    let client = ReplicateClient::new(&ReplicateSettings {
        version: Some("5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa".into()),
        ..settings(&fake)
    });
    let created = client.submit(&order("Alice")).await.expect("created");
    let (path, body) = fake.state.creates.lock().unwrap()[0].clone();
    assert_eq!(path, "/v1/predictions");
    assert_eq!(
        body["version"],
        json!("5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa")
    );
    let done = poll_until_final(&client, &created.job_id).await;
    assert_eq!(done.status, JobStatus::Succeeded);
    fake.stop().await;
}

#[actix_web::test]
async fn failures_and_moderation_end_the_job() {
    captured();
    let fake = Fake::start().await;
    let client = ReplicateClient::new(&settings(&fake));
    let failing = client.submit(&order("please fail")).await.unwrap();
    let failed = poll_until_final(&client, &failing.job_id).await;
    assert_eq!(failed.status, JobStatus::Failed);
    assert_eq!(failed.error.as_deref(), Some("CUDA out of memory"));
    let nsfw = client.submit(&order("something nsfw")).await.unwrap();
    let rejected = poll_until_final(&client, &nsfw.job_id).await;
    assert_eq!(rejected.status, JobStatus::Rejected);
    assert!(rejected.error.unwrap().contains("NSFW"));
    fake.stop().await;
}

#[actix_web::test]
async fn auth_failures_are_rejected_requests_without_the_token() {
    captured();
    let fake = Fake::start().await;
    let anonymous = ReplicateClient::new(&ReplicateSettings {
        api_key: None,
        ..settings(&fake)
    });
    let refused = anonymous.submit(&order("p")).await.unwrap_err();
    assert!(
        matches!(&refused, AiFailure::RequestRejected(m) if m.starts_with("HTTP 401")),
        "{refused:?}"
    );
    *fake.state.revoked.lock().unwrap() = true;
    let client = ReplicateClient::new(&settings(&fake));
    let revoked = client.submit(&order("p")).await.unwrap_err();
    assert!(
        matches!(revoked, AiFailure::RequestRejected(_)),
        "{revoked:?}"
    );
    assert!(format!("{revoked}").contains("***"), "{revoked}");
    assert_no_key(&revoked);
    assert_no_key(&client.poll("whatever").await.unwrap_err());
    assert_eq!(fake.creations(), 0);
    assert_key_not_logged();
    fake.stop().await;
}

#[actix_web::test]
async fn a_429_is_throttled_not_an_attempt() {
    captured();
    let fake = Fake::start().await;
    let client = ReplicateClient::new(&settings(&fake));
    *fake.state.throttle_next.lock().unwrap() = Some(Some(2));
    let header = client.submit(&order("p")).await.unwrap_err();
    assert_eq!(header.retry_after_ms(), Some(2_000), "{header:?}");
    assert!(header.is_unavailable());
    *fake.state.throttle_next.lock().unwrap() = Some(None);
    let body = client.submit(&order("p")).await.unwrap_err();
    assert_eq!(
        body.retry_after_ms(),
        Some(30_000),
        "from the body: {body:?}"
    );
    assert_eq!(fake.creations(), 0);
    let made = client
        .submit(&order("p"))
        .await
        .expect("then it goes through");
    assert_eq!(made.status, JobStatus::Queued);
    fake.stop().await;
}

/// The create makes its prediction but answers after the client's timeout:
/// unclear. The retry with the same key finds that prediction in the list
/// and adopts it.
async fn unclear_create_is_adopted(list_shows_webhook: bool, newer: usize, page_size: usize) {
    captured();
    let fake = Fake::start().await;
    *fake.state.list_shows_webhook.lock().unwrap() = list_shows_webhook;
    *fake.state.page_size.lock().unwrap() = page_size;
    let client = ReplicateClient::new(&settings(&fake));
    let order = order("a fox in the snow");
    *fake.state.stall_next_create.lock().unwrap() = Some(Duration::from_secs(2));
    let unclear = client.submit(&order).await.unwrap_err();
    assert!(matches!(unclear, AiFailure::Unclear(_)), "{unclear:?}");
    assert!(unclear.is_unavailable(), "not an attempt");
    assert_eq!(fake.creations(), 1, "the prediction was made");
    // Other sagas' predictions, newer than ours.
    for i in 0..newer {
        client
            .submit(&self::order(&format!("other {i}")))
            .await
            .unwrap();
    }
    let adopted = client.submit(&order).await.expect("adopted");
    assert_eq!(fake.creations(), 1 + newer as u32, "no second prediction");
    assert_eq!(fake.carrying(order.idempotency_key), 1);
    let ours = fake
        .state
        .predictions
        .lock()
        .unwrap()
        .iter()
        .find(|p| p.input["prompt"] == "a fox in the snow")
        .unwrap()
        .id
        .clone();
    assert_eq!(adopted.job_id, ours);
    assert!(fake.list_calls() >= 1);
    // Adopted: the key is settled, the next submit would not look again.
    let lists = fake.list_calls();
    let done = poll_until_final(&client, &adopted.job_id).await;
    assert_eq!(done.status, JobStatus::Succeeded);
    assert_eq!(fake.list_calls(), lists);
    assert_key_not_logged();
    fake.stop().await;
}

#[actix_web::test]
async fn an_unclear_create_is_adopted_from_the_list() {
    unclear_create_is_adopted(true, 0, 100).await;
}

#[actix_web::test]
async fn an_unclear_create_is_adopted_when_the_list_hides_webhooks() {
    unclear_create_is_adopted(false, 0, 100).await;
}

#[actix_web::test]
async fn an_unclear_create_is_found_on_the_second_page() {
    unclear_create_is_adopted(true, 2, 2).await;
}

#[actix_web::test]
async fn an_unclear_create_that_made_nothing_is_sent_again() {
    captured();
    let fake = Fake::start().await;
    let client = ReplicateClient::new(&settings(&fake));
    let order = order("p");
    // Stalls before answering, but the fake never made it: drop it.
    *fake.state.stall_next_create.lock().unwrap() = Some(Duration::from_secs(2));
    assert!(matches!(
        client.submit(&order).await,
        Err(AiFailure::Unclear(_))
    ));
    fake.state.predictions.lock().unwrap().clear();
    let created = client.submit(&order).await.expect("created");
    assert_eq!(created.status, JobStatus::Queued);
    assert_eq!(fake.list_calls(), 1, "looked first");
    assert_eq!(fake.carrying(order.idempotency_key), 1);
    fake.stop().await;
}

#[actix_web::test]
async fn cancel_stops_a_running_prediction() {
    captured();
    let fake = Fake::start().await;
    let client = ReplicateClient::new(&settings(&fake));
    let slow = client.submit(&order("slow burn")).await.unwrap();
    client.poll(&slow.job_id).await.unwrap();
    assert_eq!(
        client.cancel(&slow.job_id).await.unwrap(),
        CancelOutcome::Final(JobStatus::Cancelled)
    );
    assert_eq!(
        client.poll(&slow.job_id).await.unwrap().status,
        JobStatus::Cancelled
    );
    assert_eq!(
        client.cancel(&slow.job_id).await.unwrap(),
        CancelOutcome::Final(JobStatus::Cancelled),
        "again: already final"
    );
    let quick = client.submit(&order("quick")).await.unwrap();
    poll_until_final(&client, &quick.job_id).await;
    assert_eq!(
        client.cancel(&quick.job_id).await.unwrap(),
        CancelOutcome::Final(JobStatus::Succeeded),
        "a completed prediction cannot be canceled"
    );
    assert_eq!(
        client.cancel("no-such-prediction").await.unwrap(),
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
