//! The OpenAI-compatible provider (`--ai-provider openai`), black box through
//! HTTP against a fake that speaks that API (chat completions and image
//! generation, an actix-web server on 127.0.0.1:0 in this file): text,
//! score and image kinds complete; a content-policy refusal aborts with
//! INPUT_REJECTED and its human message; 429, 5xx and unreadable 2xx
//! answers are retried with the same key and not counted as attempts; a
//! wrong key is a rejected request (counted), and the provider quoting it
//! back is scrubbed; the bearer key reaches the fake and never a log line
//! (this test binary captures every log at DEBUG). On SQLite and PostgreSQL.

mod support;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Value};
use stagehand::ai::{ApiKey, ProviderKind};
use support::{fast_sim, Backend, TestApp, OPERATOR};

const KEY: &str = "sk-fake-KEY-7d1e0c5a9b3f4e21";

// ---------------------------------------------------------------- logs

type Captured = support::CapturedLogs;

/// Every log of this test binary.
fn captured() -> Captured {
    support::captured_logs("debug,sqlx=info,sea_orm=info,sqlx_core=info,tokio_postgres=info")
}

fn assert_key_not_logged(logs: &Captured) {
    assert_secret_not_logged(logs, KEY);
}

fn assert_secret_not_logged(logs: &Captured, secret: &str) {
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(
        text.contains("AI provider: OpenAI-compatible API"),
        "the logs are captured"
    );
    assert!(
        !text.contains(secret),
        "the OpenAI key is in a log line:\n{}",
        text.lines().find(|l| l.contains(secret)).unwrap()
    );
}

// ---------------------------------------------------------------- the fake

/// One request the fake received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    authorization: Option<String>,
    idempotency_key: Option<String>,
    body: Value,
}

#[derive(Default)]
struct FakeState {
    /// Statuses to answer (in order) before answering normally.
    failures: Mutex<VecDeque<u16>>,
    seen: Mutex<Vec<Seen>>,
}

struct Fake {
    url: String,
    state: Arc<FakeState>,
    server: actix_web::dev::ServerHandle,
}

impl Fake {
    async fn start() -> Fake {
        let state = Arc::new(FakeState::default());
        let data = web::Data::from(state.clone());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake");
        let port = listener.local_addr().unwrap().port();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .route("/v1/chat/completions", web::post().to(chat))
                .route("/v1/images/generations", web::post().to(images))
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

    fn fail_next(&self, statuses: &[u16]) {
        self.state
            .failures
            .lock()
            .unwrap()
            .extend(statuses.iter().copied());
    }

    fn seen(&self, path: &str) -> Vec<Seen> {
        let seen = self.state.seen.lock().unwrap();
        seen.iter().filter(|s| s.path == path).cloned().collect()
    }

    async fn stop(self) {
        self.server.stop(false).await;
    }
}

/// Records the request; answers the next scripted failure if any, or a
/// 401 without the right key.
fn intake(state: &FakeState, req: &HttpRequest, body: &Value) -> Option<HttpResponse> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let authorization = header("authorization");
    state.seen.lock().unwrap().push(Seen {
        path: req.path().to_owned(),
        authorization: authorization.clone(),
        idempotency_key: header("idempotency-key"),
        body: body.clone(),
    });
    if authorization.as_deref() != Some(&format!("Bearer {KEY}")) {
        // Like OpenAI, it quotes what it got back (OpenAI masks most of it).
        let got = authorization.unwrap_or_default();
        let got = got.trim_start_matches("Bearer ");
        return Some(HttpResponse::Unauthorized().json(json!({"error": {
            "message": format!("Incorrect API key provided: {got}."), "type": "invalid_request_error",
            "code": "invalid_api_key"}})));
    }
    let failure = state.failures.lock().unwrap().pop_front()?;
    if failure == 0 {
        // A 2xx whose body is cut short: an unclear outcome.
        return Some(
            HttpResponse::Ok()
                .content_type("application/json")
                .body(r#"{"id":"chatcmpl-cut","choices":[{"message":"#),
        );
    }
    let status = actix_web::http::StatusCode::from_u16(failure).unwrap();
    let mut answer = HttpResponse::build(status);
    if failure == 429 {
        answer.insert_header(("Retry-After", "1"));
        return Some(answer.json(
            json!({"error": {"message": "Rate limit reached for requests",
            "type": "requests", "code": "rate_limit_exceeded"}}),
        ));
    }
    Some(
        answer.json(
            json!({"error": {"message": "The server is overloaded", "type": "server_error"}}),
        ),
    )
}

async fn chat(
    state: web::Data<FakeState>,
    req: HttpRequest,
    body: web::Json<Value>,
) -> HttpResponse {
    if let Some(answer) = intake(&state, &req, &body) {
        return answer;
    }
    let system = body["messages"][0]["content"].as_str().unwrap_or_default();
    let prompt = body["messages"][1]["content"].as_str().unwrap_or_default();
    let message = if prompt.contains("forbidden") {
        json!({"role": "assistant", "content": null, "refusal": "I can't help with that request."})
    } else if system.contains("judge") {
        let score = prompt.chars().count();
        json!({"role": "assistant", "content": format!("{{\"score\": {score}, \"comment\": \"Nice try\"}}"), "refusal": null})
    } else {
        json!({"role": "assistant", "content": format!("A song about {prompt}"), "refusal": null})
    };
    HttpResponse::Ok().json(json!({
        "id": format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        "object": "chat.completion",
        "model": body["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }))
}

async fn images(
    state: web::Data<FakeState>,
    req: HttpRequest,
    body: web::Json<Value>,
) -> HttpResponse {
    if let Some(answer) = intake(&state, &req, &body) {
        return answer;
    }
    let prompt = body["prompt"].as_str().unwrap_or_default();
    if prompt.contains("forbidden") {
        return HttpResponse::BadRequest().json(json!({"error": {
            "code": "content_policy_violation",
            "message": "Your request was rejected as a result of our safety system.",
            "param": null, "type": "invalid_request_error"}}));
    }
    HttpResponse::Ok().json(json!({
        "created": 1_700_000_000,
        "data": [{"url": format!("https://fake.invalid/img/{}.png", uuid::Uuid::new_v4().simple()),
                  "revised_prompt": prompt}],
    }))
}

// ---------------------------------------------------------------- helpers

async fn spawn(backend: Backend, fake: &Fake) -> TestApp {
    spawn_with_key(backend, fake, KEY).await
}

async fn spawn_with_key(backend: Backend, fake: &Fake, key: &str) -> TestApp {
    let url = fake.url.clone();
    let key = ApiKey::new(key);
    TestApp::spawn_with(backend, fast_sim(), move |c| {
        c.ai_provider = ProviderKind::Openai;
        c.openai_base_url = format!("{url}/v1");
        c.openai_api_key = Some(key);
    })
    .await
}

async fn experience(app: &TestApp, kind: &str) -> String {
    let slug = format!("oa-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let resp = app
        .http
        .post(format!("{}/api/experiences", app.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"slug": slug, "title": "Booth", "kind": kind, "ai_calls": 1, "max_in_flight": 5}))
        .send()
        .await
        .expect("POST /api/experiences");
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    slug
}

/// Submits `prompt` to a new session of `slug` and waits for its end.
async fn run(app: &TestApp, slug: &str, prompt: &str) -> (String, Value) {
    let (sid, token) = app.session(slug, None, "mo").await;
    let resp = app
        .submit(&sid, &token, json!({"prompt": prompt}), "k1")
        .await;
    assert_eq!(resp.status(), 202);
    let done = app.wait_final(&sid, &token, Duration::from_secs(30)).await;
    (sid, done)
}

// ---------------------------------------------------------------- tests

async fn text_and_score_kinds_complete(backend: Backend) {
    let logs = captured();
    let fake = Fake::start().await;
    let app = spawn(backend, &fake).await;

    let music = experience(&app, "music").await;
    let (_, done) = run(&app, &music, "the sea at night").await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let item = &done["result"]["content"][0];
    assert_eq!(item["type"], "text", "{done}");
    assert_eq!(item["text"], "A song about the sea at night", "{done}");

    let score = experience(&app, "score").await;
    let (sid, done) = run(&app, &score, "twelve chars").await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(done["result"]["score"], 12.0, "{done}");
    assert_eq!(done["result"]["rank"], 1, "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "Nice try", "{done}");
    let ranking = app
        .get_json(&format!("/api/experiences/{score}/ranking"))
        .await;
    assert_eq!(ranking["entries"][0]["session_id"], sid.as_str());

    let calls = fake.seen("/v1/chat/completions");
    assert_eq!(calls.len(), 2, "one call per submission");
    for call in &calls {
        assert_eq!(
            call.authorization.as_deref(),
            Some(format!("Bearer {KEY}").as_str())
        );
        let key = call
            .idempotency_key
            .as_deref()
            .expect("Idempotency-Key sent");
        uuid::Uuid::parse_str(key).expect("the saga's attempt key, a UUID");
        assert_eq!(call.body["model"], "gpt-4o-mini");
    }
    assert!(calls[1].body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .contains("JSON"));
    assert!(fake.seen("/v1/images/generations").is_empty());
    app.stop().await;
    fake.stop().await;
    assert_key_not_logged(&logs);
}
db_test!(text_and_score_kinds_complete);

async fn image_kinds_complete_with_urls(backend: Backend) {
    let logs = captured();
    let fake = Fake::start().await;
    let app = spawn(backend, &fake).await;
    for kind in ["image", "comic"] {
        let slug = experience(&app, kind).await;
        let (_, done) = run(&app, &slug, "a cat on a skateboard").await;
        assert_eq!(done["status"], "COMPLETED", "{kind}: {done}");
        let item = &done["result"]["content"][0];
        assert_eq!(item["type"], "image", "{done}");
        assert!(
            item["url"]
                .as_str()
                .is_some_and(|u| u.starts_with("https://fake.invalid/img/")),
            "{done}"
        );
    }
    let calls = fake.seen("/v1/images/generations");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].body["prompt"], "a cat on a skateboard");
    assert!(calls[1].body["prompt"]
        .as_str()
        .unwrap()
        .contains("four-panel comic"));
    assert_eq!(calls[0].body["model"], "dall-e-3");
    assert_eq!(calls[0].body["response_format"], "url");
    assert!(fake.seen("/v1/chat/completions").is_empty());
    app.stop().await;
    fake.stop().await;
    assert_key_not_logged(&logs);
}
db_test!(image_kinds_complete_with_urls);

async fn content_policy_refusals_abort_input_rejected(backend: Backend) {
    let logs = captured();
    let fake = Fake::start().await;
    let app = spawn(backend, &fake).await;
    for (kind, provider_says) in [
        ("image", "rejected as a result of our safety system"),
        ("music", "I can't help with that request."),
    ] {
        let slug = experience(&app, kind).await;
        let (sid, done) = run(&app, &slug, "something forbidden").await;
        assert_eq!(done["status"], "ABORTED", "{kind}: {done}");
        assert_eq!(done["abort_reason"], "INPUT_REJECTED", "{kind}: {done}");
        assert!(
            done["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("blocked: inappropriate input")),
            "the human message: {done}"
        );
        let saga = app.saga_of(&sid).await;
        assert_eq!(saga["attempts"], 0, "{saga}");
        assert!(
            saga.to_string().contains(provider_says),
            "the provider's words are kept for operators: {saga}"
        );
    }
    // Refused at once: one call each, no retry.
    assert_eq!(fake.seen("/v1/images/generations").len(), 1);
    assert_eq!(fake.seen("/v1/chat/completions").len(), 1);
    app.stop().await;
    fake.stop().await;
    assert_key_not_logged(&logs);
}
db_test!(content_policy_refusals_abort_input_rejected);

async fn rate_limits_and_server_errors_are_retried_not_counted(backend: Backend) {
    let logs = captured();
    let fake = Fake::start().await;
    let app = spawn(backend, &fake).await;
    let slug = experience(&app, "music").await;
    // More failures than MAX_ATTEMPTS (3): were they counted, it would
    // abort. 0: a 200 with a cut-short body (unclear, so retried too).
    fake.fail_next(&[429, 503, 0, 502]);
    let (sid, done) = run(&app, &slug, "the sea at night").await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(
        done["result"]["content"][0]["text"],
        "A song about the sea at night"
    );
    let saga = app.saga_of(&sid).await;
    assert_eq!(
        saga["attempts"], 0,
        "unavailability is not an attempt: {saga}"
    );
    let calls = fake.seen("/v1/chat/completions");
    assert_eq!(calls.len(), 5, "four failed, one answered");
    // Every retry of the attempt sends the same key.
    let keys: std::collections::HashSet<_> =
        calls.iter().map(|c| c.idempotency_key.clone()).collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    app.stop().await;
    fake.stop().await;
    assert_key_not_logged(&logs);
}
db_test!(rate_limits_and_server_errors_are_retried_not_counted);

async fn a_wrong_key_is_a_rejected_request_and_is_never_logged(backend: Backend) {
    let logs = captured();
    let fake = Fake::start().await;
    let wrong = format!("sk-wrong-{}", uuid::Uuid::new_v4().simple());
    let app = spawn_with_key(backend, &fake, &wrong).await;
    let slug = experience(&app, "music").await;
    let (sid, done) = run(&app, &slug, "the sea at night").await;
    assert_eq!(done["status"], "ABORTED", "{done}");
    assert_eq!(done["abort_reason"], "AI_FAILED", "{done}");
    let saga = app.saga_of(&sid).await;
    assert!(
        saga.to_string().contains("Incorrect API key provided: ***"),
        "the provider's words, the key scrubbed: {saga}"
    );
    assert!(!saga.to_string().contains(&wrong), "{saga}");
    // A 401 counts: MAX_ATTEMPTS (3) calls, then AI_FAILED.
    let calls = fake.seen("/v1/chat/completions");
    assert_eq!(calls.len(), 3);
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(format!("Bearer {wrong}").as_str())
    );
    app.stop().await;
    fake.stop().await;
    assert_secret_not_logged(&logs, &wrong);
}
db_test!(a_wrong_key_is_a_rejected_request_and_is_never_logged);
