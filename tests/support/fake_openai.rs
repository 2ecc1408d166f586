//! A fake of OpenAI's HTTP API, written only from OpenAI's own
//! documentation (not from `src/ai/openai.rs`), for black-box tests of the
//! OpenAI adapter (issue 32). The pages it follows, as stored on
//! 2026-12-05:
//!
//! - Deprecations: <https://developers.openai.com/api/docs/deprecations>
//!   (lifecycle Active / Deprecated / Shutdown; "To monitor model shutdowns
//!   programmatically, call the List models endpoint (GET /v1/models) and
//!   check each model's optional shutdown_date field ... a YYYY-MM-DD
//!   string, or null if no shutdown date has been announced; the field is
//!   also available from the Retrieve a model endpoint"; the dates of
//!   [`documented_models`]).
//! - Models: <https://developers.openai.com/api/docs/models> ("GPT-6 Luna for
//!   cost-sensitive, high-volume workloads") and
//!   <https://developers.openai.com/api/docs/models/gpt-6-luna>.
//! - Image generation guide:
//!   <https://developers.openai.com/api/docs/guides/image-generation>
//!   (GPT-Image-2.6 Sunburst and Flare; `complexity` low / medium / high,
//!   2.6 only; GIF and SVG output, 2.6 only; send a `safety_identifier` with
//!   every image generation request).
//! - API reference, Create image:
//!   <https://developers.openai.com/api/reference/resources/images/methods/generate>
//!   (`POST /v1/images/generations`: model, prompt, n, size, quality,
//!   background, moderation, output_format, output_compression, stream,
//!   partial_images, response_format and style (DALL·E only: "isn't
//!   supported for the GPT image models, which always return base64-encoded
//!   images"), user, safety_identifier; the answer `created`, `data[]`
//!   (`b64_json`), `background`, `output_format`, `quality`, `size`,
//!   `usage`; "gpt-image-1 was shut down on October 23, 2026").
//! - API reference, Create chat completion:
//!   <https://developers.openai.com/api/reference/resources/chat/subresources/completions/methods/create>
//!   (the request fields in [`CHAT_FIELDS`]; `safety_identifier`: "a stable
//!   identifier ... with a maximum length of 64 characters. We recommend
//!   hashing their username or email address"; the answer `id`, `object`,
//!   `created`, `model`, `choices[].message.{role,content,refusal}`,
//!   `choices[].finish_reason` one of stop, length, tool_calls,
//!   content_filter, function_call; `usage`).
//! - API reference, Create image edit:
//!   <https://developers.openai.com/api/reference/resources/images/methods/edit>
//!   (`POST /v1/images/edits`, "Creates an edited or extended image given
//!   one or more source images and a prompt"; the answer is the same
//!   ImagesResponse as a generation's), in its multipart form as the Python
//!   SDK generated from OpenAI's spec lists it (openai/openai-python
//!   `src/openai/types/image_edit_params.py`, commit e43b4224 of
//!   2026-08-21: [`EDIT_FIELDS`]; `image` "a `png`, `webp`, or `jpg` file
//!   less than 50MB", up to 16; `prompt` required; `user` and no
//!   `safety_identifier`). The JSON shape (`images` as URLs or file ids)
//!   is not faked.
//! - Chat completions, message content parts: `text` (`text`),
//!   `image_url` (`image_url.url`: a URL or a base64-encoded data URL;
//!   `detail` auto, low or high), `input_audio`, `file`.
//! - API reference, Models: `GET /v1/models` (`{"object":"list","data":[...]}`)
//!   and `GET /v1/models/{model}` (`id`, `object`, `created`, `owned_by`).
//! - Safety checks / safety best practices:
//!   <https://developers.openai.com/api/docs/guides/safety-checks>,
//!   <https://help.openai.com/en/articles/5428082-incorporating-a-safety-identifier>.
//! - Error codes: <https://developers.openai.com/api/docs/guides/error-codes>
//!   (401 invalid authentication / incorrect API key; 429 "Rate limit
//!   reached for requests"; 429 "You exceeded your current quota, please
//!   check your plan and billing details" (run out of credits or hit the
//!   maximum monthly spend: retrying does not help); 500 "The server had an
//!   error while processing your request"; 503 "The engine is currently
//!   overloaded"). The error body is `{"error": {"message", "type",
//!   "param", "code"}}`.
//! - Rate limits: <https://developers.openai.com/api/docs/guides/rate-limits>
//!   (headers `x-ratelimit-limit-requests` 60, `x-ratelimit-limit-tokens`
//!   150000, `x-ratelimit-remaining-requests` 59,
//!   `x-ratelimit-remaining-tokens` 149984, `x-ratelimit-reset-requests`
//!   "1s", `x-ratelimit-reset-tokens` "6m0s").
//!
//! Where the documentation names an error but not its exact words, the
//! words are the ones OpenAI is known to answer (marked "(observed)" below):
//! `Unknown parameter: 'x'.` with `code: "unknown_parameter"`, the masked
//! key in "Incorrect API key provided", the shut-down model's "The model
//! `dall-e-3` has been deprecated", the old-style safety refusal (400,
//! `code: null`, "Your request was rejected as a result of our safety
//! system") and "Please try again in 20s" in a rate-limit message.
//!
//! It serves plain HTTP/1.1 on 127.0.0.1 from its own thread and actix
//! system, so it keeps answering while a test's thread blocks (e.g. waiting
//! for a `stagehand serve` child) and outlives nothing: dropping the handle
//! stops it. It records every request: method, path, headers, body (a
//! multipart form's parts too), when it arrived, when it was answered and
//! with what status.
//!
//! Knobs ([`FakeOpenAi`]): a queue of scripted answers ([`Scripted`]) for
//! the generation endpoints, a sticky answer (every generation request, until
//! cleared), the model list with settable shutdown dates and "today",
//! latency, `GET /v1/models` missing (a compatible server without it), the
//! list keeping shut-down models (with their past date) or not, and
//! a 401 that quotes the whole wrong key back (a compatible server that
//! does not mask it).
#![allow(dead_code)]
// The validators answer the documented error response itself.
#![allow(clippy::result_large_err)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpResponseBuilder, HttpServer};
use chrono::NaiveDate;
use serde_json::{json, Map, Value};

use crate::support::multipart::{self, Part};

/// A 1×1 PNG, the image every generation answers (base64).
pub const PNG_B64: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

/// The word that makes a prompt refused by moderation (images:
/// `moderation_blocked`; chat: an answer with `refusal`).
pub const FORBIDDEN_WORD: &str = "forbidden";

/// What a model is for: the endpoint that accepts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    Chat,
    Image,
}

/// One model of the account.
#[derive(Debug, Clone)]
pub struct Model {
    pub id: String,
    pub use_: Use,
    /// Announced shutdown date (`shutdown_date`); `None`: none announced.
    pub shutdown_date: Option<NaiveDate>,
    /// A model that was shut down before the list knew `shutdown_date`
    /// (DALL·E 3, gpt-image-1): never listed, refused as deprecated.
    pub gone: bool,
}

fn date(s: &str) -> NaiveDate {
    NaiveDate::parse_from_str(s, "%Y-%m-%d").expect("a YYYY-MM-DD date")
}

fn model(id: &str, use_: Use, shutdown: Option<&str>) -> Model {
    Model {
        id: id.to_owned(),
        use_,
        shutdown_date: shutdown.map(date),
        gone: false,
    }
}

/// The models this fake knows, with the shutdown dates of the deprecations
/// page (as stored 2026-12-05). Active models have no date.
pub fn documented_models() -> Vec<Model> {
    use Use::{Chat, Image};
    let mut models = vec![
        // Image models: the 2.6 pair is the recommended replacement of
        // everything shut down on 2026-12-01.
        model("gpt-image-2.6-flare", Image, None),
        model("gpt-image-2.6-sunburst", Image, None),
        model("gpt-image-2.5-flare", Image, None),
        model("gpt-image-2.5-flare-2026-09-08", Image, None),
        model("gpt-image-2.5-sunburst", Image, None),
        model("gpt-image-2.5-sunburst-2026-09-08", Image, None),
        model("gpt-image-2", Image, None),
        model("gpt-image-2-2026-04-21", Image, None),
        model("gpt-image-1.5", Image, Some("2026-12-01")),
        model("gpt-image-1.5-2025-12-16", Image, Some("2026-12-01")),
        model("gpt-image-1-mini", Image, Some("2026-12-01")),
        model("chatgpt-image-latest", Image, Some("2026-12-01")),
        model("gpt-image-1", Image, Some("2026-10-23")),
        model("dall-e-3", Image, Some("2026-05-12")),
        model("dall-e-2", Image, Some("2026-05-12")),
        // Chat models.
        model("gpt-6-luna", Chat, None),
        model("gpt-6.1-terra", Chat, None),
        model("gpt-6.1-sol", Chat, None),
        model("gpt-6.2-sol", Chat, None),
        model("gpt-6.2-astra", Chat, None),
        model("gpt-5", Chat, Some("2026-12-11")),
        model("gpt-5-mini", Chat, Some("2026-12-11")),
        model("gpt-5-nano", Chat, Some("2026-12-11")),
        model("gpt-4o", Chat, Some("2027-01-14")),
        model("gpt-4o-mini", Chat, Some("2027-01-14")),
        model("gpt-4o-mini-2024-07-18", Chat, Some("2027-01-14")),
        model("gpt-4.1-mini", Chat, Some("2027-01-14")),
        model("gpt-4.1-nano", Chat, Some("2026-10-23")),
    ];
    for m in &mut models {
        m.gone = matches!(m.id.as_str(), "dall-e-3" | "dall-e-2" | "gpt-image-1");
    }
    models
}

/// Where a 429 rate-limit answer says how long to wait (only there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// `Retry-After: <seconds>`.
    RetryAfter(u64),
    /// `x-ratelimit-remaining-requests: 0` and `x-ratelimit-reset-requests`
    /// with this OpenAI duration text (`"3s"`, `"6m0s"`, `"20ms"`).
    ResetRequests(String),
    /// `x-ratelimit-remaining-tokens: 0` and `x-ratelimit-reset-tokens`.
    ResetTokens(String),
    /// The message ends "Please try again in <text>." (`"3s"`, `"1.5s"`,
    /// `"250ms"`) (observed).
    Body(String),
    /// Nowhere.
    Unsaid,
}

/// An answer the fake gives a generation request (chat completions or
/// image generations) instead of the normal one, after authentication and
/// the request's validation (an invalid request is refused first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scripted {
    /// 429 `rate_limit_exceeded`, its wait said only where [`Wait`] says.
    RateLimit(Wait),
    /// 429 `insufficient_quota` (type and code), no wait anywhere.
    InsufficientQuota,
    /// 500 / 502 / 503 with a `server_error`.
    ServerError(u16),
    /// 400, `code: null`, "Your request was rejected as a result of our
    /// safety system." (observed, DALL·E era and still answered).
    OldSafetyRefusal,
    /// 400 `content_policy_violation`.
    ContentPolicyViolation,
    /// 400 `moderation_blocked` (GPT image models).
    ModerationBlocked,
    /// A 200 whose JSON body is cut short.
    CutShort,
    /// 400 `invalid_value` on `prompt`: an ordinary refused request.
    BadRequest,
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
    /// The JSON body (`Null` when there is none or it is not JSON).
    pub body: Value,
    /// The parts of a `multipart/form-data` body (None for any other).
    pub form: Option<Vec<Part>>,
    pub arrived: Instant,
    /// When its answer was made (None while it is being answered).
    pub answered: Option<Instant>,
    pub status: Option<u16>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// A chat completion, an image generation or an image edit: what is
    /// billed.
    pub fn is_generation(&self) -> bool {
        self.method == "POST"
            && (self.path == CHAT_PATH || self.path == IMAGES_PATH || self.path == EDITS_PATH)
    }

    /// The part of a multipart request named `name`.
    pub fn part(&self, name: &str) -> Option<&Part> {
        self.form.as_ref()?.iter().find(|p| p.name == name)
    }
}

pub const CHAT_PATH: &str = "/v1/chat/completions";
pub const IMAGES_PATH: &str = "/v1/images/generations";
pub const EDITS_PATH: &str = "/v1/images/edits";
pub const MODELS_PATH: &str = "/v1/models";

struct State {
    key: String,
    scripted: Mutex<VecDeque<Scripted>>,
    sticky: Mutex<Option<Scripted>>,
    models: Mutex<Vec<Model>>,
    today: Mutex<NaiveDate>,
    latency: Mutex<Duration>,
    models_endpoint_missing: Mutex<bool>,
    list_shut_down: Mutex<bool>,
    quote_full_key: Mutex<bool>,
    recorded: Mutex<Vec<Recorded>>,
}

/// The running fake. Dropping it stops its server.
pub struct FakeOpenAi {
    /// `http://127.0.0.1:<port>` (the API is under `/v1`).
    pub url: String,
    state: Arc<State>,
    handle: actix_web::dev::ServerHandle,
}

impl FakeOpenAi {
    /// Starts a fake whose only valid key is `key`, with
    /// [`documented_models`] and today's (UTC) date.
    pub fn start(key: &str) -> FakeOpenAi {
        let state = Arc::new(State {
            key: key.to_owned(),
            scripted: Mutex::new(VecDeque::new()),
            sticky: Mutex::new(None),
            models: Mutex::new(documented_models()),
            today: Mutex::new(chrono::Utc::now().date_naive()),
            latency: Mutex::new(Duration::ZERO),
            models_endpoint_missing: Mutex::new(false),
            list_shut_down: Mutex::new(false),
            quote_full_key: Mutex::new(false),
            recorded: Mutex::new(Vec::new()),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake");
        let port = listener.local_addr().expect("its address").port();
        let (tx, rx) = std::sync::mpsc::channel();
        let data = web::Data::from(state.clone());
        std::thread::Builder::new()
            .name("fake-openai".into())
            .spawn(move || {
                let system = actix_web::rt::System::new();
                system.block_on(async move {
                    let server = HttpServer::new(move || {
                        App::new()
                            .app_data(data.clone())
                            .app_data(web::PayloadConfig::new(8 << 20))
                            .default_service(web::to(handle))
                    })
                    .workers(2)
                    .disable_signals()
                    .listen(listener)
                    .expect("listen")
                    .run();
                    tx.send(server.handle()).expect("hand over the server");
                    let _ = server.await;
                });
            })
            .expect("start the fake's thread");
        let handle = rx.recv().expect("the fake started");
        FakeOpenAi {
            url: format!("http://127.0.0.1:{port}"),
            state,
            handle,
        }
    }

    /// The base URL a client is configured with (`…/v1`).
    pub fn v1(&self) -> String {
        format!("{}/v1", self.url)
    }

    /// Answers the next generation requests with these, in order.
    pub fn script(&self, answers: impl IntoIterator<Item = Scripted>) {
        self.state.scripted.lock().unwrap().extend(answers);
    }

    /// Answers every generation request with this until cleared (None);
    /// scripted answers go first.
    pub fn set_sticky(&self, answer: Option<Scripted>) {
        *self.state.sticky.lock().unwrap() = answer;
    }

    /// Sets (or clears) a model's announced shutdown date; a model it does
    /// not know is added (for `use_`).
    pub fn set_shutdown_date(&self, id: &str, use_: Use, date: Option<NaiveDate>) {
        let mut models = self.state.models.lock().unwrap();
        match models.iter_mut().find(|m| m.id == id) {
            Some(m) => {
                m.shutdown_date = date;
                m.gone = false;
            }
            None => models.push(Model {
                id: id.to_owned(),
                use_,
                shutdown_date: date,
                gone: false,
            }),
        }
    }

    /// Replaces the model list.
    pub fn set_models(&self, models: Vec<Model>) {
        *self.state.models.lock().unwrap() = models;
    }

    /// The date the fake compares shutdown dates with (default: today, UTC).
    pub fn today(&self) -> NaiveDate {
        *self.state.today.lock().unwrap()
    }

    pub fn set_today(&self, today: NaiveDate) {
        *self.state.today.lock().unwrap() = today;
    }

    /// Every answer is made this long after the request arrived.
    pub fn set_latency(&self, latency: Duration) {
        *self.state.latency.lock().unwrap() = latency;
    }

    /// `GET /v1/models` answers 404 (a compatible server without it).
    pub fn set_models_endpoint_missing(&self, missing: bool) {
        *self.state.models_endpoint_missing.lock().unwrap() = missing;
    }

    /// `GET /v1/models` also lists models whose `shutdown_date` has come
    /// (not the ones shut down before the field existed). Default: a
    /// shut-down model is no longer listed.
    pub fn set_list_shut_down(&self, list: bool) {
        *self.state.list_shut_down.lock().unwrap() = list;
    }

    /// A wrong key's 401 quotes the whole key back (OpenAI masks it).
    pub fn set_quote_full_key(&self, quote: bool) {
        *self.state.quote_full_key.lock().unwrap() = quote;
    }

    /// Whether the fake would serve this model today (known, not shut down).
    pub fn is_active(&self, id: &str) -> bool {
        let today = self.today();
        self.state
            .models
            .lock()
            .unwrap()
            .iter()
            .any(|m| m.id == id && !shut_down(m, today))
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.recorded.lock().unwrap().clone()
    }

    /// The requests to `path`.
    pub fn seen(&self, path: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.path == path)
            .collect()
    }

    /// The chat completions and image generations.
    pub fn generations(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(Recorded::is_generation)
            .collect()
    }

    pub async fn stop(self) {
        self.handle.stop(false).await;
    }
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        // The stop command is sent when `stop` is called; its future only
        // waits for the end.
        drop(self.handle.stop(false));
    }
}

fn shut_down(m: &Model, today: NaiveDate) -> bool {
    m.gone || m.shutdown_date.is_some_and(|d| d <= today)
}

// ---------------------------------------------------------------- answers

fn error_body(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

fn request_id() -> String {
    format!("req_{}", uuid::Uuid::new_v4().simple())
}

/// The headers every answer carries (rate limits healthy unless a 429 says
/// otherwise).
fn common(status: StatusCode) -> HttpResponseBuilder {
    let mut answer = HttpResponse::build(status);
    answer
        .insert_header(("x-request-id", request_id()))
        .insert_header(("openai-version", "2020-10-01"))
        .insert_header(("openai-processing-ms", "42"));
    answer
}

fn healthy_limits(answer: &mut HttpResponseBuilder) {
    answer
        .insert_header(("x-ratelimit-limit-requests", "500"))
        .insert_header(("x-ratelimit-remaining-requests", "499"))
        .insert_header(("x-ratelimit-reset-requests", "120ms"))
        .insert_header(("x-ratelimit-limit-tokens", "150000"))
        .insert_header(("x-ratelimit-remaining-tokens", "149984"))
        .insert_header(("x-ratelimit-reset-tokens", "6ms"));
}

fn invalid(message: String, param: &str, code: &str) -> HttpResponse {
    common(StatusCode::BAD_REQUEST).json(error_body(
        &message,
        "invalid_request_error",
        Some(param),
        Some(code),
    ))
}

fn unknown_parameter(name: &str) -> HttpResponse {
    invalid(
        format!("Unknown parameter: '{name}'."),
        name,
        "unknown_parameter",
    )
}

fn scripted_answer(answer: &Scripted, model: &str) -> HttpResponse {
    match answer {
        Scripted::RateLimit(wait) => {
            let mut message = format!(
                "Rate limit reached for {model} in organization org-fake on requests per min (RPM): Limit 3, Used 3, Requested 1."
            );
            let mut out = common(StatusCode::TOO_MANY_REQUESTS);
            match wait {
                Wait::RetryAfter(secs) => {
                    out.insert_header(("retry-after", secs.to_string()));
                }
                Wait::ResetRequests(text) => {
                    out.insert_header(("x-ratelimit-limit-requests", "3"))
                        .insert_header(("x-ratelimit-remaining-requests", "0"))
                        .insert_header(("x-ratelimit-reset-requests", text.as_str()));
                }
                Wait::ResetTokens(text) => {
                    out.insert_header(("x-ratelimit-limit-tokens", "150000"))
                        .insert_header(("x-ratelimit-remaining-tokens", "0"))
                        .insert_header(("x-ratelimit-reset-tokens", text.as_str()));
                }
                Wait::Body(text) => {
                    message.push_str(&format!(" Please try again in {text}."));
                }
                Wait::Unsaid => {}
            }
            message.push_str(
                " Visit https://platform.openai.com/account/rate-limits to learn more.",
            );
            out.json(error_body(
                &message,
                "requests",
                None,
                Some("rate_limit_exceeded"),
            ))
        }
        Scripted::InsufficientQuota => common(StatusCode::TOO_MANY_REQUESTS).json(error_body(
            "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
            "insufficient_quota",
            None,
            Some("insufficient_quota"),
        )),
        Scripted::ServerError(status) => {
            let status = StatusCode::from_u16(*status).expect("a status");
            let message = if status == StatusCode::SERVICE_UNAVAILABLE {
                "The engine is currently overloaded, please try again later."
            } else {
                "The server had an error while processing your request. Sorry about that!"
            };
            common(status).json(error_body(message, "server_error", None, None))
        }
        Scripted::OldSafetyRefusal => common(StatusCode::BAD_REQUEST).json(error_body(
            "Your request was rejected as a result of our safety system. Your prompt may contain text that is not allowed by our safety system.",
            "invalid_request_error",
            None,
            None,
        )),
        Scripted::ContentPolicyViolation => common(StatusCode::BAD_REQUEST).json(error_body(
            "Your request was rejected as a result of our safety system. Image descriptions generated from your prompt may contain text that is not allowed by our safety system.",
            "invalid_request_error",
            None,
            Some("content_policy_violation"),
        )),
        Scripted::ModerationBlocked => moderation_blocked(),
        Scripted::BadRequest => invalid(
            "Invalid value for 'prompt': the request could not be processed.".into(),
            "prompt",
            "invalid_value",
        ),
        Scripted::CutShort => {
            let mut out = common(StatusCode::OK);
            healthy_limits(&mut out);
            out.content_type("application/json")
                .body(r#"{"id":"chatcmpl-cut","created":1764900000,"data":[{"#)
        }
    }
}

fn moderation_blocked() -> HttpResponse {
    common(StatusCode::BAD_REQUEST).json(error_body(
        &format!("Your request was rejected by the safety system. If you believe this is an error, contact us at help.openai.com and include the request ID {}.", request_id()),
        "image_generation_user_error",
        None,
        Some("moderation_blocked"),
    ))
}

// ---------------------------------------------------------------- serving

async fn handle(state: web::Data<State>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    let arrived = Instant::now();
    let headers = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok());
    let form = multipart::is_form(content_type)
        .then(|| multipart::parse(content_type.unwrap_or_default(), &body));
    let index = {
        let mut recorded = state.recorded.lock().unwrap();
        recorded.push(Recorded {
            method: req.method().as_str().to_owned(),
            path: req.path().to_owned(),
            headers,
            body: parsed.clone().unwrap_or(Value::Null),
            form: form.clone().and_then(Result::ok),
            arrived,
            answered: None,
            status: None,
        });
        recorded.len() - 1
    };
    let latency = *state.latency.lock().unwrap();
    if !latency.is_zero() {
        actix_web::rt::time::sleep(latency).await;
    }
    let answer = answer(&state, &req, &body, parsed, form);
    let mut recorded = state.recorded.lock().unwrap();
    recorded[index].answered = Some(Instant::now());
    recorded[index].status = Some(answer.status().as_u16());
    answer
}

fn answer(
    state: &State,
    req: &HttpRequest,
    body: &[u8],
    parsed: Option<Value>,
    form: Option<Result<Vec<Part>, String>>,
) -> HttpResponse {
    if let Some(refusal) = authenticate(state, req) {
        return refusal;
    }
    let method = req.method().as_str();
    let path = req.path();
    match (method, path) {
        ("GET", MODELS_PATH) => list_models(state),
        ("GET", p) if p.starts_with("/v1/models/") => {
            retrieve_model(state, &p["/v1/models/".len()..])
        }
        ("POST", EDITS_PATH) => edit(state, form),
        ("POST", CHAT_PATH) | ("POST", IMAGES_PATH) => {
            let Some(Value::Object(fields)) = parsed else {
                let _ = body;
                return common(StatusCode::BAD_REQUEST).json(error_body(
                    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)",
                    "invalid_request_error",
                    None,
                    None,
                ));
            };
            let checked = if path == CHAT_PATH {
                check_chat(state, &fields)
            } else {
                check_image(state, &fields)
            };
            if let Err(refusal) = checked {
                return refusal;
            }
            let model = fields["model"].as_str().unwrap_or_default().to_owned();
            let next = state.scripted.lock().unwrap().pop_front();
            let next = next.or_else(|| state.sticky.lock().unwrap().clone());
            if let Some(scripted) = next {
                return scripted_answer(&scripted, &model);
            }
            if path == CHAT_PATH {
                chat_answer(&fields)
            } else {
                image_answer(&fields)
            }
        }
        _ => common(StatusCode::NOT_FOUND).json(error_body(
            &format!("Invalid URL ({method} {path})"),
            "invalid_request_error",
            None,
            None,
        )),
    }
}

/// `POST /v1/images/edits`: the multipart form checked, then a scripted
/// answer or an edited image, answered like a generation. The JSON shape
/// of the edit (`images` as URLs or file ids) is not faked: a body that is
/// not a form is refused.
fn edit(state: &State, form: Option<Result<Vec<Part>, String>>) -> HttpResponse {
    let form = match form {
        Some(Ok(form)) => form,
        Some(Err(reason)) => {
            return common(StatusCode::BAD_REQUEST).json(error_body(
                &format!("Could not parse multipart form: {reason}"),
                "invalid_request_error",
                None,
                None,
            ))
        }
        None => {
            return common(StatusCode::BAD_REQUEST).json(error_body(
                "This fake takes the image edit as multipart/form-data only.",
                "invalid_request_error",
                None,
                None,
            ))
        }
    };
    let fields = match check_edit(state, &form) {
        Ok(fields) => fields,
        Err(refusal) => return refusal,
    };
    let model = fields["model"].as_str().unwrap_or_default().to_owned();
    let next = state.scripted.lock().unwrap().pop_front();
    let next = next.or_else(|| state.sticky.lock().unwrap().clone());
    if let Some(scripted) = next {
        return scripted_answer(&scripted, &model);
    }
    image_answer(&fields)
}

/// `Authorization: Bearer <key>`, or the documented 401.
fn authenticate(state: &State, req: &HttpRequest) -> Option<HttpResponse> {
    let header = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    let Some(given) = header.and_then(|h| h.strip_prefix("Bearer ")) else {
        return Some(common(StatusCode::UNAUTHORIZED).json(error_body(
            "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if you're accessing the API from your browser and are prompted for a username and password. You can obtain an API key from https://platform.openai.com/account/api-keys.",
            "invalid_request_error",
            None,
            None,
        )));
    };
    if given == state.key {
        return None;
    }
    let shown = if *state.quote_full_key.lock().unwrap() {
        given.to_owned()
    } else {
        // OpenAI shows the first characters and the last four (observed).
        let chars: Vec<char> = given.chars().collect();
        let head: String = chars.iter().take(8).collect();
        let tail: String = chars[chars.len().saturating_sub(4)..].iter().collect();
        format!("{head}{}{tail}", "*".repeat(chars.len().saturating_sub(12)))
    };
    Some(common(StatusCode::UNAUTHORIZED).json(error_body(
        &format!("Incorrect API key provided: {shown}. You can find your API key at https://platform.openai.com/account/api-keys."),
        "invalid_request_error",
        None,
        Some("invalid_api_key"),
    )))
}

fn model_object(m: &Model) -> Value {
    json!({
        "id": m.id,
        "object": "model",
        "created": 1_700_000_000,
        "owned_by": "system",
        "shutdown_date": m.shutdown_date.map(|d| d.format("%Y-%m-%d").to_string()),
    })
}

fn list_models(state: &State) -> HttpResponse {
    if *state.models_endpoint_missing.lock().unwrap() {
        return common(StatusCode::NOT_FOUND).json(error_body(
            "Invalid URL (GET /v1/models)",
            "invalid_request_error",
            None,
            None,
        ));
    }
    let today = *state.today.lock().unwrap();
    let list_shut_down = *state.list_shut_down.lock().unwrap();
    let data: Vec<Value> = state
        .models
        .lock()
        .unwrap()
        .iter()
        .filter(|m| !m.gone && (list_shut_down || !shut_down(m, today)))
        .map(model_object)
        .collect();
    let mut out = common(StatusCode::OK);
    out.json(json!({"object": "list", "data": data}))
}

fn not_found_model(id: &str) -> HttpResponse {
    common(StatusCode::NOT_FOUND).json(error_body(
        &format!("The model `{id}` does not exist or you do not have access to it."),
        "invalid_request_error",
        None,
        Some("model_not_found"),
    ))
}

fn deprecated_model(id: &str) -> HttpResponse {
    common(StatusCode::NOT_FOUND).json(error_body(
        &format!(
            "The model `{id}` has been deprecated. Learn more: https://platform.openai.com/docs/deprecations"
        ),
        "invalid_request_error",
        None,
        Some("model_not_found"),
    ))
}

fn retrieve_model(state: &State, id: &str) -> HttpResponse {
    let today = *state.today.lock().unwrap();
    let models = state.models.lock().unwrap();
    match models.iter().find(|m| m.id == id) {
        Some(m) if !shut_down(m, today) => common(StatusCode::OK).json(model_object(m)),
        Some(_) => deprecated_model(id),
        None => not_found_model(id),
    }
}

/// The model a generation names, if the account may use it there.
fn check_model(
    state: &State,
    fields: &Map<String, Value>,
    use_: Use,
) -> Result<Model, HttpResponse> {
    let id = match fields.get("model") {
        Some(Value::String(id)) => id.clone(),
        Some(_) => return Err(invalid_type("model", "a string")),
        None if use_ == Use::Chat => return Err(missing("model")),
        // Images: the reference says to name the model explicitly.
        None => return Err(missing("model")),
    };
    let today = *state.today.lock().unwrap();
    let models = state.models.lock().unwrap();
    let Some(m) = models.iter().find(|m| m.id == id) else {
        return Err(not_found_model(&id));
    };
    if shut_down(m, today) {
        return Err(deprecated_model(&id));
    }
    if m.use_ != use_ {
        return Err(invalid(
            format!("Invalid value: '{id}'. This model is not supported by this endpoint."),
            "model",
            "invalid_value",
        ));
    }
    Ok(m.clone())
}

fn missing(name: &str) -> HttpResponse {
    invalid(
        format!("Missing required parameter: '{name}'."),
        name,
        "missing_required_parameter",
    )
}

fn invalid_type(name: &str, expected: &str) -> HttpResponse {
    invalid(
        format!("Invalid type for '{name}': expected {expected}."),
        name,
        "invalid_type",
    )
}

fn invalid_value(name: &str, value: &Value, allowed: &[&str]) -> HttpResponse {
    let allowed: Vec<String> = allowed.iter().map(|a| format!("'{a}'")).collect();
    invalid(
        format!(
            "Invalid value: {value}. Supported values are: {}.",
            allowed.join(", ")
        ),
        name,
        "invalid_value",
    )
}

fn check_enum(
    fields: &Map<String, Value>,
    name: &str,
    allowed: &[&str],
) -> Result<(), HttpResponse> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if allowed.contains(&s.as_str()) => Ok(()),
        Some(v @ Value::String(_)) => Err(invalid_value(name, v, allowed)),
        Some(_) => Err(invalid_type(name, "a string")),
    }
}

fn check_int(
    fields: &Map<String, Value>,
    name: &str,
    min: i64,
    max: i64,
) -> Result<(), HttpResponse> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(i) if (min..=max).contains(&i) => Ok(()),
            _ => Err(invalid(
                format!("Invalid '{name}': expected an integer from {min} to {max}, but got {n} instead."),
                name,
                "invalid_value",
            )),
        },
        Some(_) => Err(invalid_type(name, "an integer")),
    }
}

fn check_bool(fields: &Map<String, Value>, name: &str) -> Result<(), HttpResponse> {
    match fields.get(name) {
        None | Some(Value::Null) | Some(Value::Bool(_)) => Ok(()),
        Some(_) => Err(invalid_type(name, "a boolean")),
    }
}

/// `safety_identifier` and the older `user`: strings of at most 64
/// characters.
fn check_identifier(fields: &Map<String, Value>, name: &str) -> Result<(), HttpResponse> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if s.chars().count() <= 64 => Ok(()),
        Some(Value::String(s)) => Err(invalid(
            format!(
                "Invalid '{name}': string too long. Expected a string with maximum length 64, but got a string with length {} instead.",
                s.chars().count()
            ),
            name,
            "string_above_max_length",
        )),
        Some(_) => Err(invalid_type(name, "a string")),
    }
}

/// The request fields of `POST /v1/chat/completions`.
pub const CHAT_FIELDS: &[&str] = &[
    "messages",
    "model",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
];

/// The request fields of `POST /v1/images/generations`.
pub const IMAGE_FIELDS: &[&str] = &[
    "prompt",
    "model",
    "n",
    "size",
    "quality",
    "background",
    "moderation",
    "output_format",
    "output_compression",
    "stream",
    "partial_images",
    "complexity",
    "response_format",
    "style",
    "user",
    "safety_identifier",
];

fn check_chat(state: &State, fields: &Map<String, Value>) -> Result<Model, HttpResponse> {
    if let Some(unknown) = fields.keys().find(|k| !CHAT_FIELDS.contains(&k.as_str())) {
        return Err(unknown_parameter(unknown));
    }
    let messages = match fields.get("messages") {
        None => return Err(missing("messages")),
        Some(Value::Array(m)) => m,
        Some(_) => return Err(invalid_type("messages", "an array")),
    };
    if messages.is_empty() {
        return Err(invalid(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.".into(),
            "messages",
            "empty_array",
        ));
    }
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str);
        let allowed = [
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
            "function",
        ];
        match role {
            Some(r) if allowed.contains(&r) => {}
            Some(_) => {
                return Err(invalid_value(
                    &format!("messages[{i}].role"),
                    &message["role"],
                    &allowed,
                ))
            }
            None => return Err(missing(&format!("messages[{i}].role"))),
        }
        if message.get("content").is_none() && role != Some("assistant") {
            return Err(missing(&format!("messages[{i}].content")));
        }
        if let Some(Value::Array(parts)) = message.get("content") {
            check_content_parts(i, parts)?;
        }
    }
    check_identifier(fields, "safety_identifier")?;
    check_identifier(fields, "user")?;
    check_int(fields, "n", 1, 128)?;
    check_bool(fields, "stream")?;
    check_bool(fields, "store")?;
    check_enum(
        fields,
        "reasoning_effort",
        &["none", "minimal", "low", "medium", "high", "xhigh", "max"],
    )?;
    check_model(state, fields, Use::Chat)
}

/// A message's content parts: `text` with its `text`; `image_url` with
/// `image_url.url` an http(s) URL or a base64 data URL of a png, jpeg,
/// webp or gif image (`detail` optional: auto, low, high);
/// `input_audio` and `file` are documented and not looked into.
fn check_content_parts(i: usize, parts: &[Value]) -> Result<(), HttpResponse> {
    use base64::Engine;
    for (j, part) in parts.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        match part["type"].as_str() {
            Some("text") if part["text"].is_string() => {}
            Some("text") => return Err(missing(&format!("{at}.text"))),
            Some("image_url") => {
                let Some(url) = part["image_url"]["url"].as_str() else {
                    return Err(missing(&format!("{at}.image_url.url")));
                };
                check_enum(
                    part["image_url"].as_object().unwrap_or(&Map::new()),
                    "detail",
                    &["auto", "low", "high"],
                )?;
                let data_ok = url
                    .strip_prefix("data:")
                    .and_then(|rest| rest.split_once(";base64,"))
                    .is_some_and(|(media, data)| {
                        ["image/png", "image/jpeg", "image/webp", "image/gif"].contains(&media)
                            && base64::engine::general_purpose::STANDARD
                                .decode(data)
                                .is_ok()
                    });
                if !(data_ok || url.starts_with("https://") || url.starts_with("http://")) {
                    return Err(invalid(
                        format!("Invalid '{at}.image_url.url': expected a URL or a base64-encoded data URL of an image."),
                        &format!("{at}.image_url.url"),
                        "invalid_image_url",
                    ));
                }
            }
            Some("input_audio" | "file") => {}
            _ => {
                return Err(invalid_value(
                    &format!("{at}.type"),
                    &part["type"],
                    &["text", "image_url", "input_audio", "file"],
                ))
            }
        }
    }
    Ok(())
}

fn check_image(state: &State, fields: &Map<String, Value>) -> Result<Model, HttpResponse> {
    if let Some(unknown) = fields.keys().find(|k| !IMAGE_FIELDS.contains(&k.as_str())) {
        return Err(unknown_parameter(unknown));
    }
    match fields.get("prompt") {
        None => return Err(missing("prompt")),
        Some(Value::String(p)) if p.chars().count() <= 32_000 => {}
        Some(Value::String(_)) => {
            return Err(invalid(
                "Invalid 'prompt': string too long. Expected a string with maximum length 32000."
                    .into(),
                "prompt",
                "string_above_max_length",
            ))
        }
        Some(_) => return Err(invalid_type("prompt", "a string")),
    }
    let model = check_model(state, fields, Use::Image)?;
    let id = model.id.as_str();
    let gen2 = id.starts_with("gpt-image-2");
    let gen25 = id.starts_with("gpt-image-2.5") || id.starts_with("gpt-image-2.6");
    let gen26 = id.starts_with("gpt-image-2.6");
    // DALL·E-only parameters: GPT image models always answer base64.
    for dalle_only in ["response_format", "style"] {
        if fields.contains_key(dalle_only) {
            return Err(unknown_parameter(dalle_only));
        }
    }
    if fields.contains_key("complexity") && !gen26 {
        return Err(invalid(
            "Unsupported parameter: 'complexity' is not supported with this model.".into(),
            "complexity",
            "unsupported_parameter",
        ));
    }
    check_enum(fields, "complexity", &["low", "medium", "high"])?;
    check_int(fields, "n", 1, 10)?;
    let qualities: &[&str] = if gen25 {
        &["low", "medium", "high", "xhigh", "max", "auto"]
    } else {
        &["low", "medium", "high", "auto"]
    };
    check_enum(fields, "quality", qualities)?;
    check_enum(fields, "background", &["transparent", "opaque", "auto"])?;
    check_enum(fields, "moderation", &["low", "auto"])?;
    let formats: &[&str] = if gen26 {
        &["png", "jpeg", "webp", "gif", "svg"]
    } else {
        &["png", "jpeg", "webp"]
    };
    check_enum(fields, "output_format", formats)?;
    check_int(fields, "output_compression", 0, 100)?;
    check_int(fields, "partial_images", 0, 3)?;
    check_bool(fields, "stream")?;
    check_identifier(fields, "safety_identifier")?;
    check_identifier(fields, "user")?;
    check_size(fields, gen2)?;
    Ok(model)
}

/// `size`: the three fixed sizes or `auto`; gpt-image-2 and later also
/// take a custom `WxH`.
fn check_size(fields: &Map<String, Value>, gen2: bool) -> Result<(), HttpResponse> {
    match fields.get("size") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(size)) => {
            let fixed = ["1024x1024", "1536x1024", "1024x1536", "auto"];
            let ok = fixed.contains(&size.as_str()) || (gen2 && custom_size_ok(size));
            if ok {
                Ok(())
            } else {
                Err(invalid_value("size", &fields["size"], &fixed))
            }
        }
        Some(_) => Err(invalid_type("size", "a string")),
    }
}

/// The request fields of `POST /v1/images/edits` as a multipart form (the
/// Python SDK's `ImageEditParams`, generated from OpenAI's spec: no
/// `safety_identifier` there; the end-user field is `user`).
pub const EDIT_FIELDS: &[&str] = &[
    "image",
    "image[]",
    "prompt",
    "background",
    "input_fidelity",
    "mask",
    "model",
    "n",
    "output_compression",
    "output_format",
    "partial_images",
    "quality",
    "response_format",
    "size",
    "stream",
    "user",
];

/// The first bytes of the file types an edit takes (png, webp, jpg).
fn image_type_of(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// An edit's images: 1 to 16 file parts, each a png, webp or jpg (its
/// first bytes as its declared type) of less than 50MB.
fn check_edit_images(form: &[Part]) -> Result<(), HttpResponse> {
    let images: Vec<&Part> = form
        .iter()
        .filter(|p| p.name == "image" || p.name == "image[]")
        .collect();
    if images.is_empty() {
        return Err(missing("image"));
    }
    if images.len() > 16 {
        return Err(invalid(
            "Invalid 'image': at most 16 images.".into(),
            "image",
            "invalid_value",
        ));
    }
    for image in &images {
        let declared = image.content_type.as_deref().unwrap_or_default();
        let actual = image_type_of(&image.bytes);
        if image.filename.is_none() || actual.is_none() || actual != Some(declared) {
            return Err(invalid(
                format!(
                    "Invalid image file or mode for image 1, please check your image file. Supported file formats are png, webp and jpg (got {declared:?})."
                ),
                "image",
                "invalid_image_file",
            ));
        }
        if image.bytes.len() >= 50 << 20 {
            return Err(invalid(
                "Invalid 'image': the file must be less than 50MB.".into(),
                "image",
                "invalid_value",
            ));
        }
    }
    Ok(())
}

/// An edit's form: its fields as JSON values (the numbers as numbers, so
/// the generation's checks apply), after the image parts are checked.
fn check_edit(state: &State, form: &[Part]) -> Result<Map<String, Value>, HttpResponse> {
    if let Some(unknown) = form
        .iter()
        .find(|p| !EDIT_FIELDS.contains(&p.name.as_str()))
    {
        return Err(unknown_parameter(&unknown.name));
    }
    check_edit_images(form)?;
    let mut fields = Map::new();
    for p in form.iter().filter(|p| p.filename.is_none()) {
        let text = p.text();
        let value = match p.name.as_str() {
            "n" | "output_compression" | "partial_images" => text
                .trim()
                .parse::<i64>()
                .map(Value::from)
                .unwrap_or(Value::String(text)),
            "stream" => text
                .parse::<bool>()
                .map(Value::Bool)
                .unwrap_or(Value::String(text)),
            _ => Value::String(text),
        };
        fields.insert(p.name.clone(), value);
    }
    match fields.get("prompt") {
        None => return Err(missing("prompt")),
        Some(Value::String(p)) if p.chars().count() <= 32_000 => {}
        Some(_) => {
            return Err(invalid(
                "Invalid 'prompt': string too long. Expected a string with maximum length 32000."
                    .into(),
                "prompt",
                "string_above_max_length",
            ))
        }
    }
    let model = check_model(state, &fields, Use::Image)?;
    if fields.contains_key("response_format") {
        return Err(unknown_parameter("response_format"));
    }
    check_int(&fields, "n", 1, 10)?;
    check_enum(&fields, "input_fidelity", &["high", "low"])?;
    check_enum(&fields, "background", &["transparent", "opaque", "auto"])?;
    check_enum(&fields, "output_format", &["png", "jpeg", "webp"])?;
    check_int(&fields, "output_compression", 0, 100)?;
    check_int(&fields, "partial_images", 0, 3)?;
    check_bool(&fields, "stream")?;
    check_identifier(&fields, "user")?;
    check_size(&fields, model.id.starts_with("gpt-image-2"))?;
    Ok(fields)
}

/// gpt-image-2 and later: any `WxH` with both edges multiples of 16, the
/// longer edge at most 3840, at most 3:1, 655,360 to 8,294,400 pixels.
fn custom_size_ok(size: &str) -> bool {
    let Some((w, h)) = size.split_once('x') else {
        return false;
    };
    let (Ok(w), Ok(h)) = (w.parse::<u64>(), h.parse::<u64>()) else {
        return false;
    };
    w > 0
        && h > 0
        && w % 16 == 0
        && h % 16 == 0
        && w.max(h) <= 3840
        && w.max(h) <= 3 * w.min(h)
        && (655_360..=8_294_400).contains(&(w * h))
}

fn now_unix() -> i64 {
    chrono::Utc::now().timestamp()
}

fn chat_answer(fields: &Map<String, Value>) -> HttpResponse {
    let messages = fields["messages"].as_array().cloned().unwrap_or_default();
    let text_of = |role: &str| -> String {
        messages
            .iter()
            .filter(|m| m["role"] == role)
            .flat_map(|m| match &m["content"] {
                Value::String(text) => vec![text.clone()],
                Value::Array(parts) => parts
                    .iter()
                    .filter(|p| p["type"] == "text")
                    .filter_map(|p| p["text"].as_str().map(str::to_owned))
                    .collect(),
                _ => Vec::new(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let system = format!("{}{}", text_of("system"), text_of("developer"));
    let prompt = text_of("user");
    let message = if prompt.contains(FORBIDDEN_WORD) {
        json!({"role": "assistant", "content": null, "refusal": "I can't help with that request.", "annotations": []})
    } else if system.contains("judge") {
        let score = prompt.chars().count();
        json!({"role": "assistant", "content": format!("{{\"score\": {score}, \"comment\": \"Nice try\"}}"), "refusal": null, "annotations": []})
    } else {
        json!({"role": "assistant", "content": format!("A song about {prompt}"), "refusal": null, "annotations": []})
    };
    let mut out = common(StatusCode::OK);
    healthy_limits(&mut out);
    out.json(json!({
        "id": format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        "object": "chat.completion",
        "created": now_unix(),
        "model": fields["model"],
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
                  "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                  "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                      "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}},
        "service_tier": "default",
        "system_fingerprint": null,
    }))
}

fn image_answer(fields: &Map<String, Value>) -> HttpResponse {
    let prompt = fields["prompt"].as_str().unwrap_or_default();
    if prompt.contains(FORBIDDEN_WORD) {
        return moderation_blocked();
    }
    let n = fields.get("n").and_then(Value::as_u64).unwrap_or(1);
    let data: Vec<Value> = (0..n).map(|_| json!({"b64_json": PNG_B64})).collect();
    let text = |name: &str, default: &str| -> String {
        fields
            .get(name)
            .and_then(Value::as_str)
            .filter(|v| *v != "auto")
            .unwrap_or(default)
            .to_owned()
    };
    let mut out = common(StatusCode::OK);
    healthy_limits(&mut out);
    out.json(json!({
        "created": now_unix(),
        "background": text("background", "opaque"),
        "data": data,
        "output_format": text("output_format", "png"),
        "quality": text("quality", "medium"),
        "size": text("size", "1024x1024"),
        "usage": {"input_tokens": 50, "input_tokens_details": {"image_tokens": 0, "text_tokens": 50},
                  "output_tokens": 1056, "total_tokens": 1106},
    }))
}
