//! The second AI provider: an OpenAI-compatible HTTP API (OpenAI itself, or
//! any server that speaks the same endpoints), called with a bearer key:
//! - `POST {base}/v1/chat/completions` for text kinds (`video`, `music`, and
//!   any kind that is not an image) and for score analysis (`score`);
//! - `POST {base}/v1/images/generations` for image kinds (`comic`, `image`);
//! - `POST {base}/v1/images/edits` for an image kind whose order carries the
//!   participant's photo.
//!
//! The photo ([`JobOrder::input`], a stored JPEG), as OpenAI's API
//! reference documents each endpoint: the image edit is a
//! `multipart/form-data` request whose `image` part is the photo's bytes
//! (file name and media type given), with `model`, `prompt`, `n` and `size`
//! as the generation sends them and the session's digest as `user` (the
//! edit documents no `safety_identifier`); its answer is read like a
//! generation's (`b64_json` or `url`). A chat completion gets the photo in
//! the user message: its `content` becomes a text part and an `image_url`
//! part whose URL is the photo as a `data:` URL. The photo's own URL is
//! not used: OpenAI gets the bytes, whether or not this server has a
//! public address.
//!
//! These endpoints are synchronous: the answer is the result. The adapter
//! fits the saga's submit/poll shape by answering a submit with a job that
//! is already final (`succeeded`, `failed` or `rejected`), so the saga
//! records the result right after the call and never polls.
//!
//! Idempotency: OpenAI has no idempotency key for these endpoints. The
//! saga's attempt key is sent anyway as `Idempotency-Key` (and as
//! `X-Client-Request-Id`, which OpenAI echoes in its logs) for compatible
//! servers that honour it; against OpenAI itself a crash between the call
//! and the recording of its result, or an unclear outcome (a dropped
//! connection after the request was sent, a timeout, an unreadable 2xx
//! body), makes the retry a second, billed generation. The participant
//! still gets exactly one result: only the recorded one is shown and ranked.
//!
//! Outside errors become [`AiFailure`]s here, in [`OpenAiClient::classify`],
//! with the same rules as the job API client (DESIGN.md rule 6), read from
//! OpenAI's error codes (developers.openai.com/api/docs/guides/error-codes):
//! - a content-policy refusal (an error code `content_policy_violation`,
//!   `moderation_blocked` or `content_filter`; the older 400 with `code:
//!   null` whose message says the safety system rejected it; a chat answer
//!   with a `refusal`, or `finish_reason: content_filter`) is
//!   `ContentRejected`: the saga aborts with `INPUT_REJECTED`;
//! - `insufficient_quota` (a 429: the account's hard spending limit, or no
//!   credit) is `OutOfQuota`: retrying cannot help, the provider's breaker
//!   opens with that reason, operators see it, the guest's place is kept;
//! - any other 429, 408 and 5xx are `Unavailable`; a 429 that names its
//!   wait (`retry-after-ms`, `Retry-After`, the exhausted limit's
//!   `x-ratelimit-reset-requests` / `-tokens` such as `6m0s`, or a message
//!   "Please try again in 20s") is `Throttled`, and that wait holds back
//!   every request to the provider;
//! - 409 ("this key is in progress" on servers that honour
//!   `Idempotency-Key`) and an unclear outcome (timeout, broken connection,
//!   unreadable 2xx) are `Unclear`: not an attempt, retried with the same
//!   key;
//! - any other 4xx is `RequestRejected` (an attempt).
//!
//! Every request carries `safety_identifier` (the image edit: `user`), a
//! digest of the session ([`crate::domain::keys::safety_identifier`]): a
//! booth's guests are anonymous, and OpenAI asks such services to send one
//! so that a violation is put down to that user, not to the organisation's
//! key.
//!
//! Models: the defaults are [`DEFAULT_CHAT_MODEL`] and
//! [`DEFAULT_IMAGE_MODEL`], which OpenAI serves with no shutdown announced.
//! Before serving, [`OpenAiClient::check_models`] reads `GET /v1/models`:
//! a configured model that is not listed, or whose `shutdown_date` has
//! come, stops the start with what to set instead; an announced date is
//! shown in the providers view and on /ops.
//!
//! The key never reaches a log line or a `Debug` output: it lives in an
//! [`ApiKey`], whose `Debug` prints `***` and which has no `Display`, it is
//! sent with reqwest's `bearer_auth` (a header marked sensitive), and any
//! provider text that quotes it back is scrubbed before it becomes a failure
//! detail.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::multipart::{Form, Part};
use reqwest::{RequestBuilder, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::client::{outside_client, InputPhoto, JobOrder, JobStatus, JobView};
use super::ModelNotice;
use crate::domain::failure::{AiFailure, AiResult, ContentItem};

/// A bearer key. `Debug` prints `ApiKey(***)`; there is no `Display`, so a
/// key cannot slip into a format string or a tracing field by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(Arc<str>);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(Arc::from(key.into()))
    }

    /// The key itself, for the `Authorization` header only (of this
    /// adapter and of `replicate`).
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

impl FromStr for ApiKey {
    type Err = String;

    fn from_str(s: &str) -> Result<ApiKey, String> {
        let key = s.trim();
        if key.is_empty() {
            return Err("the API key is empty".to_owned());
        }
        if key.chars().any(|c| c.is_control() || c == ' ') {
            return Err("the API key contains spaces or control characters".to_owned());
        }
        Ok(ApiKey::new(key))
    }
}

/// Model names and sizes used when the configuration does not say.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com";
/// OpenAI's model for "cost-sensitive, high-volume workloads", the
/// replacement its deprecations page names for gpt-4o-mini (which shuts down
/// on 2027-01-14); no shutdown announced (checked 2026-12-05).
pub const DEFAULT_CHAT_MODEL: &str = "gpt-6-luna";
/// The fast one of the two image models that replace the ones shut down on
/// 2026-12-01 (dall-e-3 went on 2026-05-12, gpt-image-1 on 2026-10-23); no
/// shutdown announced (checked 2026-12-05). `gpt-image-2.6-sunburst` is the
/// slower, detail-first one.
pub const DEFAULT_IMAGE_MODEL: &str = "gpt-image-2.6-flare";
pub const DEFAULT_IMAGE_SIZE: &str = "1024x1024";

/// Models whose shutdown OpenAI's deprecations page announces (read on
/// 2026-12-05), with the date: a configured one is refused from that day
/// on, and flagged before, even where `GET /v1/models` no longer lists it
/// (or a compatible gateway in front of OpenAI does not say).
pub const SHUT_DOWN: [(&str, &str); 22] = [
    ("dall-e-2", "2026-05-12"),
    ("dall-e-3", "2026-05-12"),
    ("gpt-3.5-turbo", "2026-10-23"),
    ("gpt-4", "2026-10-23"),
    ("gpt-4-turbo", "2026-10-23"),
    ("gpt-4o-2024-05-13", "2026-10-23"),
    ("gpt-4.1-nano", "2026-10-23"),
    ("gpt-image-1", "2026-10-23"),
    ("o1", "2026-10-23"),
    ("o3-mini", "2026-10-23"),
    ("o4-mini", "2026-10-23"),
    ("gpt-image-1-mini", "2026-12-01"),
    ("gpt-image-1.5", "2026-12-01"),
    ("chatgpt-image-latest", "2026-12-01"),
    ("gpt-5", "2026-12-11"),
    ("gpt-5-mini", "2026-12-11"),
    ("gpt-5-nano", "2026-12-11"),
    ("o3", "2026-12-11"),
    ("gpt-4o", "2027-01-14"),
    ("gpt-4o-mini", "2027-01-14"),
    ("gpt-4.1", "2027-01-14"),
    ("gpt-4.1-mini", "2027-01-14"),
];

/// Everything the adapter needs, from configuration.
#[derive(Debug, Clone)]
pub struct OpenAiSettings {
    /// `https://api.openai.com` (a trailing `/v1` is accepted and dropped).
    pub base_url: String,
    /// Sent as `Authorization: Bearer …`; `None` sends no header (local
    /// compatible servers often need none).
    pub api_key: Option<ApiKey>,
    pub chat_model: String,
    pub image_model: String,
    pub image_size: String,
    pub connect_timeout: Duration,
    /// Bound of one call. Reaching it is an unclear outcome: unavailable.
    pub request_timeout: Duration,
}

/// The system prompt of text kinds; `{kind}` is the experience's kind.
pub const TEXT_SYSTEM_PROMPT: &str = "You create content for a participant at a live event booth. \
The booth's experience is: {kind}. From the participant's idea, write a short, vivid {kind} \
(at most 120 words), in the participant's language, in plain text.";

/// The system prompt of `score` (score analysis): the answer must be one
/// JSON object whose `score` is a number from 0 to 100.
pub const SCORE_SYSTEM_PROMPT: &str = "You are the judge of a game at a live event. Rate the \
participant's entry from 0 to 100. Answer with one JSON object and nothing else: \
{\"score\": <a number from 0 to 100>, \"comment\": \"<one short sentence for the participant, \
in their language>\"}";

/// The image prompt of `comic`; `{prompt}` is the participant's text.
pub const COMIC_IMAGE_PROMPT: &str =
    "A four-panel comic strip, panels in reading order, bright and friendly, based on this idea: {prompt}";

/// Which endpoint a kind uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// `images/generations`; `comic` wraps the prompt in [`COMIC_IMAGE_PROMPT`].
    Image { comic: bool },
    /// `chat/completions`; `score` asks for and parses a JSON score.
    Chat { score: bool },
}

fn route(kind: &str) -> Route {
    match kind {
        "comic" => Route::Image { comic: true },
        "image" => Route::Image { comic: false },
        "score" => Route::Chat { score: true },
        _ => Route::Chat { score: false },
    }
}

/// Cheap clonable client of one OpenAI-compatible provider.
#[derive(Debug, Clone)]
pub struct OpenAiClient {
    http: reqwest::Client,
    base_url: String,
    api_key: Option<ApiKey>,
    chat_model: String,
    image_model: String,
    image_size: String,
    request_timeout: Duration,
}

/// How long after a call's answer was due OpenAI may still be working on
/// it (the two clocks, and the server finishing a request whose client
/// hung up).
pub const SYNC_CALL_SLACK_MS: i64 = 60_000;

impl OpenAiClient {
    pub fn new(settings: &OpenAiSettings) -> OpenAiClient {
        let http = outside_client()
            .connect_timeout(settings.connect_timeout)
            .timeout(settings.request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("the OpenAI HTTP client configuration is static and valid");
        let base = settings.base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        OpenAiClient {
            http,
            base_url: base.to_owned(),
            api_key: settings.api_key.clone(),
            chat_model: settings.chat_model.clone(),
            image_model: settings.image_model.clone(),
            image_size: settings.image_size.clone(),
            request_timeout: settings.request_timeout,
        }
    }

    /// How long after its last send a call's work can still go on at
    /// OpenAI: the call is synchronous, so no longer than the request was
    /// allowed to take, and a little.
    pub fn jobs_end_within_ms(&self) -> i64 {
        self.request_timeout.as_millis() as i64 + SYNC_CALL_SLACK_MS
    }

    /// The base URL, without `/v1` and without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn has_key(&self) -> bool {
        self.api_key.is_some()
    }

    /// One synchronous call; the answer is a job that is already final, or
    /// a failure. The job id is `openai:<the answer's id or the attempt key>`.
    pub async fn submit(&self, order: &JobOrder) -> Result<JobView, AiFailure> {
        if order.maybe_made.as_ref().is_some_and(|m| m.look_only) {
            // OpenAI has nothing to look in: sending the order again is a
            // new, billed generation.
            return Err(AiFailure::Unclear(
                "an OpenAI call cannot be looked for, only made again".to_owned(),
            ));
        }
        let route = route(&order.kind);
        let (path, payload) = self.request_for(route, order)?;
        let key = order.idempotency_key.to_string();
        let request = self
            .http
            .post(format!("{}{path}", self.base_url))
            .header("Idempotency-Key", &key)
            .header("X-Client-Request-Id", &key);
        let mut request = match payload {
            Payload::Json(body) => request.json(&body),
            Payload::Form(form) => request.multipart(form),
        };
        if let Some(api_key) = &self.api_key {
            request = request.bearer_auth(api_key.expose());
        }
        tracing::debug!(endpoint = path, kind = %order.kind, idempotency_key = %key, photo = order.input.is_some(), "OpenAI-compatible call");
        let (status, headers, text) = exchange(request).await.map_err(|e| self.transport(&e))?;
        self.classify(route, &key, status, &headers, &text)
    }

    /// The endpoint and body of an order (module doc): an image kind with
    /// a photo is an edit, without one a generation; a text kind is a chat
    /// completion, with the photo as an image part when there is one.
    fn request_for(
        &self,
        route: Route,
        order: &JobOrder,
    ) -> Result<(&'static str, Payload), AiFailure> {
        match (route, &order.input) {
            (Route::Image { comic }, Some(photo)) => Ok((
                EDITS_PATH,
                Payload::Form(self.edit_form(image_prompt(comic, order), order, photo)?),
            )),
            (Route::Image { comic }, None) => {
                let mut body = json!({
                    "model": self.image_model,
                    "prompt": image_prompt(comic, order),
                    "n": 1,
                    "size": self.image_size,
                });
                attribute(&mut body, order);
                Ok((GENERATIONS_PATH, Payload::Json(body)))
            }
            (Route::Chat { score }, photo) => {
                let system = if score {
                    SCORE_SYSTEM_PROMPT.to_owned()
                } else {
                    TEXT_SYSTEM_PROMPT.replace("{kind}", &order.kind)
                };
                let mut body = json!({
                    "model": self.chat_model,
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": user_content(&order.prompt, photo.as_ref())},
                    ],
                });
                attribute(&mut body, order);
                Ok((CHAT_PATH, Payload::Json(body)))
            }
        }
    }

    /// `POST /v1/images/edits` as OpenAI documents it: multipart, the
    /// photo as the `image` file part (with its file name and media type),
    /// and of the generation's fields those the edit documents (`model`,
    /// `prompt`, `n`, `size`). The edit documents no `safety_identifier`;
    /// its end-user field is `user`, which carries the same digest.
    fn edit_form(
        &self,
        prompt: String,
        order: &JobOrder,
        photo: &InputPhoto,
    ) -> Result<Form, AiFailure> {
        let image = Part::bytes(photo.bytes.to_vec())
            .file_name(photo.file_name())
            .mime_str(photo.media_type())
            .map_err(|_| {
                AiFailure::RequestRejected(format!(
                    "the photo's content type {:?} is not a media type",
                    photo.media_type()
                ))
            })?;
        let mut form = Form::new()
            .text("model", self.image_model.clone())
            .text("prompt", prompt)
            .part("image", image)
            .text("n", "1")
            .text("size", self.image_size.clone());
        if !order.safety_id.is_empty() {
            form = form.text("user", order.safety_id.clone());
        }
        Ok(form)
    }

    /// There are no jobs to poll: every answer is final at once. A job id
    /// recorded by another provider (the provider was switched while a
    /// job ran) cannot be read here: the job ends `failed`, which counts
    /// one attempt, and the next attempt calls this provider.
    pub async fn poll(&self, job_id: &str) -> Result<JobView, AiFailure> {
        Ok(JobView {
            job_id: job_id.to_owned(),
            status: JobStatus::Failed,
            result: None,
            error: Some(
                "the OpenAI-compatible provider has no job to poll (it was recorded by another provider)"
                    .to_owned(),
            ),
            poll_after_ms: None,
            lookup: None,
        })
    }

    /// Before serving: `GET /v1/models`, and each model this client uses
    /// looked up in it (OpenAI documents an optional `shutdown_date`,
    /// `YYYY-MM-DD`, per model; [`SHUT_DOWN`] says the dates its
    /// deprecations page announced). `Err`, and the start stops, for a
    /// model whose shutdown date is `today` or past, for one OpenAI itself
    /// does not list (on another server an unlisted model is a WARN: it may
    /// serve only what its booths use), and for a refused key. A date to
    /// come is a notice (and a WARN). A list that cannot be read (a
    /// compatible server without it, the provider unreachable) is logged
    /// and the start goes on.
    pub async fn check_models(&self, today: chrono::NaiveDate) -> Result<Vec<ModelNotice>, String> {
        let used = [
            (
                "chat",
                &self.chat_model,
                "chat_model",
                "STAGEHAND_OPENAI_CHAT_MODEL",
                DEFAULT_CHAT_MODEL,
            ),
            (
                "image",
                &self.image_model,
                "image_model",
                "STAGEHAND_OPENAI_IMAGE_MODEL",
                DEFAULT_IMAGE_MODEL,
            ),
        ];
        let unchecked = || {
            used.iter()
                .map(|(used_for, model, ..)| ModelNotice::new(used_for, model))
                .collect()
        };
        let Some(listed) = self.listed_models().await? else {
            return Ok(unchecked());
        };
        let mut notices = Vec::with_capacity(used.len());
        for (used_for, model, field, env, default) in used {
            let change = format!("set {field} in the providers file (or {env}) to a model it lists, e.g. {default:?}");
            let listed = listed.iter().find(|m| &m.id == model);
            let announced = SHUT_DOWN
                .iter()
                .find(|(id, _)| id == model)
                .map(|(_, date)| *date);
            let shutdown = listed
                .and_then(|m| m.shutdown_date.as_deref())
                .or(announced);
            match shutdown.and_then(|d| chrono::NaiveDate::parse_from_str(d, "%Y-%m-%d").ok()) {
                Some(date) if date <= today => {
                    return Err(format!(
                        "OpenAI shut the {used_for} model {model:?} down on {date}: {change}"
                    ))
                }
                Some(date) => tracing::warn!(
                    model = %model, shutdown_date = %date,
                    "OpenAI has announced that the {used_for} model shuts down; {change} before then"
                ),
                None => {}
            }
            if listed.is_none() && self.base_url == DEFAULT_BASE_URL {
                return Err(format!(
                    "OpenAI does not offer the {used_for} model {model:?} to this key (GET /v1/models does not list it): {change}"
                ));
            }
            if listed.is_none() {
                // A compatible server often serves only the models its
                // booths use (a chat model, no image one).
                tracing::warn!(model = %model, "the OpenAI-compatible server does not list the {used_for} model; experiences that need it will fail: {change}");
            }
            notices.push(ModelNotice {
                shutdown_date: shutdown.map(str::to_owned),
                ..ModelNotice::new(used_for, model)
            });
        }
        Ok(notices)
    }

    /// `GET /v1/models`: the models listed, None when the list could not
    /// be read (logged), `Err` for a refused key.
    async fn listed_models(&self) -> Result<Option<Vec<ListedModel>>, String> {
        let mut request = self.http.get(format!("{}/v1/models", self.base_url));
        if let Some(api_key) = &self.api_key {
            request = request.bearer_auth(api_key.expose());
        }
        let (status, _, body) = match exchange(request).await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(error = %self.scrub(&root_cause(&e)), "could not list the OpenAI models at start; going on unchecked");
                return Ok(None);
            }
        };
        if status == StatusCode::UNAUTHORIZED {
            let reason = ErrorAnswer::parse(&body).message.map(|m| self.scrub(&m));
            return Err(format!(
                "the OpenAI-compatible API refused the API key (HTTP 401: {}): check STAGEHAND_OPENAI_API_KEY or the variable api_key_env names",
                reason.unwrap_or_default()
            ));
        }
        if !status.is_success() {
            tracing::warn!(
                status = status.as_u16(),
                "could not list the OpenAI models at start; going on unchecked"
            );
            return Ok(None);
        }
        match serde_json::from_str::<ModelList>(&body) {
            Ok(list) => Ok(Some(list.data)),
            Err(e) => {
                tracing::warn!(error = %e, "could not read the OpenAI model list at start; going on unchecked");
                Ok(None)
            }
        }
    }

    fn transport(&self, error: &reqwest::Error) -> AiFailure {
        let cause = self.scrub(&root_cause(error));
        if error.is_builder() {
            AiFailure::RequestRejected(format!("invalid request: {cause}"))
        } else if error.is_timeout() {
            AiFailure::Unclear("no answer in time".to_owned())
        } else if error.is_connect() {
            AiFailure::Unavailable(format!("cannot connect: {cause}"))
        } else {
            // Sent, perhaps processed, answer lost: unclear, so unavailable.
            AiFailure::Unclear(format!("connection broken: {cause}"))
        }
    }

    /// The one place where this provider's answers become results or
    /// failures.
    fn classify(
        &self,
        route: Route,
        key: &str,
        status: StatusCode,
        headers: &HeaderMap,
        body: &str,
    ) -> Result<JobView, AiFailure> {
        if !status.is_success() {
            return Err(self.failure(status, headers, body));
        }
        let parsed = match route {
            Route::Image { .. } => {
                serde_json::from_str::<ImagesAnswer>(body).map(|answer| image_outcome(answer, key))
            }
            Route::Chat { score } => serde_json::from_str::<ChatAnswer>(body)
                .map(|answer| chat_outcome(answer, key, score)),
        };
        match parsed {
            Ok(mut view) => {
                if let Some(error) = view.error.take() {
                    view.error = Some(self.scrub(&error));
                }
                Ok(view)
            }
            // The provider did the work, perhaps; we cannot read it.
            Err(error) => Err(AiFailure::Unclear(format!(
                "unreadable answer (HTTP {}): {error}",
                status.as_u16()
            ))),
        }
    }

    fn failure(&self, status: StatusCode, headers: &HeaderMap, body: &str) -> AiFailure {
        let answer = ErrorAnswer::parse(body);
        let reason = answer
            .message
            .as_deref()
            .or(answer.code.as_deref())
            .or(answer.raw.as_deref())
            .map(|reason| self.scrub(reason));
        let described = match &reason {
            Some(reason) => format!("HTTP {}: {reason}", status.as_u16()),
            None => format!("HTTP {}", status.as_u16()),
        };
        if answer.is_content_policy()
            || (status == StatusCode::BAD_REQUEST && answer.is_safety_refusal())
        {
            return AiFailure::ContentRejected(
                reason.unwrap_or_else(|| "refused by the provider's content policy".to_owned()),
            );
        }
        if answer.is_out_of_quota() {
            return AiFailure::OutOfQuota(described);
        }
        if status == StatusCode::CONFLICT {
            // A server that honours Idempotency-Key: the same key is still
            // being processed. The generation may be running: unclear.
            return AiFailure::Unclear(described);
        }
        if status == StatusCode::TOO_MANY_REQUESTS
            || status.is_server_error()
            || status == StatusCode::REQUEST_TIMEOUT
        {
            let wait =
                retry_after(headers).or_else(|| answer.message.as_deref().and_then(wait_in_text));
            return match wait {
                Some(delay) if status == StatusCode::TOO_MANY_REQUESTS => AiFailure::Throttled {
                    retry_after_ms: (delay.as_millis().min(i64::MAX as u128) as i64).max(1),
                    detail: described,
                },
                Some(delay) => AiFailure::Unavailable(format!(
                    "{described} (retry after {}s)",
                    delay.as_secs()
                )),
                None => AiFailure::Unavailable(described),
            };
        }
        if status.is_client_error() {
            AiFailure::RequestRejected(described)
        } else {
            AiFailure::RequestRejected(format!("unexpected answer, {described}"))
        }
    }

    /// Provider text with the key replaced by `***`, should it quote it.
    fn scrub(&self, text: &str) -> String {
        match &self.api_key {
            Some(key) if !key.expose().is_empty() => text.replace(key.expose(), "***"),
            _ => text.to_owned(),
        }
    }
}

/// The endpoints.
const GENERATIONS_PATH: &str = "/v1/images/generations";
const EDITS_PATH: &str = "/v1/images/edits";
const CHAT_PATH: &str = "/v1/chat/completions";

/// A request body: JSON, or a multipart form (the image edit).
enum Payload {
    Json(Value),
    Form(Form),
}

/// The image prompt of an order: `comic` wraps the participant's words in
/// [`COMIC_IMAGE_PROMPT`].
fn image_prompt(comic: bool, order: &JobOrder) -> String {
    if comic {
        COMIC_IMAGE_PROMPT.replace("{prompt}", &order.prompt)
    } else {
        order.prompt.clone()
    }
}

/// The user message's content: the participant's text, and with a photo an
/// array of a text part and an `image_url` part whose URL is the photo as a
/// data URL (chat completions' image input).
fn user_content(prompt: &str, photo: Option<&InputPhoto>) -> Value {
    match photo {
        None => json!(prompt),
        Some(photo) => json!([
            {"type": "text", "text": prompt},
            {"type": "image_url", "image_url": {"url": photo.data_url()}},
        ]),
    }
}

/// Sends the session's `safety_identifier` (OpenAI asks services whose
/// users are anonymous to send one, so a violation is put down to that
/// user and not to the whole organisation's key). Orders made outside a
/// saga have none.
fn attribute(body: &mut Value, order: &JobOrder) {
    if !order.safety_id.is_empty() {
        body["safety_identifier"] = json!(order.safety_id);
    }
}

/// The delay a 429 or 503 asks for, if any: `retry-after-ms`, else
/// `Retry-After` (seconds), else the reset of the exhausted rate limit
/// (`x-ratelimit-reset-requests` / `-tokens`, durations like `6m0s`, whose
/// `x-ratelimit-remaining-*` is 0). When the answer does not say which ran
/// out, the shorter reset: a reset is the time until the limit is whole
/// again, and a whole booth must not wait six minutes for a token budget
/// that was not the one exhausted.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name)?.to_str().ok().map(str::trim);
    let number = |name: &str| header(name)?.parse::<f64>().ok().filter(|v| v.is_finite());
    let seconds = |v: f64| Duration::try_from_secs_f64(v.max(0.0)).ok();
    if let Some(ms) = number("retry-after-ms") {
        return seconds(ms / 1_000.0);
    }
    if let Some(s) = number("retry-after") {
        return seconds(s);
    }
    let reset =
        |limit: &str| header(&format!("x-ratelimit-reset-{limit}")).and_then(openai_duration);
    let exhausted = |limit: &str| header(&format!("x-ratelimit-remaining-{limit}")) == Some("0");
    let resets: Vec<Duration> = ["requests", "tokens"]
        .into_iter()
        .filter(|limit| exhausted(limit))
        .filter_map(reset)
        .collect();
    if resets.is_empty() {
        [reset("requests"), reset("tokens")]
            .into_iter()
            .flatten()
            .max()
    } else {
        resets.into_iter().max()
    }
}

/// The wait an error message names: "Please try again in 20s." (also
/// `1.5s`, `250ms`, `6m0s`).
fn wait_in_text(text: &str) -> Option<Duration> {
    let lower = text.to_ascii_lowercase();
    let rest = &lower[lower.find("try again in ")? + "try again in ".len()..];
    let token: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
        .collect();
    openai_duration(token.trim_end_matches('.'))
}

/// OpenAI's duration text (`1s`, `6m0s`, `20ms`, `1h2m3.5s`).
pub fn openai_duration(text: &str) -> Option<Duration> {
    let mut total = 0.0_f64;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&n| n > 0)?;
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let factor = match &rest[..unit] {
            "h" => 3_600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return None,
        };
        total += number * factor;
        rest = &rest[unit..];
    }
    Duration::try_from_secs_f64(total).ok()
}

async fn exchange(
    request: RequestBuilder,
) -> Result<(StatusCode, HeaderMap, String), reqwest::Error> {
    let response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await?;
    Ok((status, headers, String::from_utf8_lossy(&body).into_owned()))
}

fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    while let Some(source) = current.source() {
        current = source;
    }
    current.to_string()
}

/// `GET /v1/models`.
#[derive(Deserialize)]
struct ModelList {
    data: Vec<ListedModel>,
}

#[derive(Deserialize)]
struct ListedModel {
    id: String,
    #[serde(default)]
    shutdown_date: Option<String>,
}

#[derive(Deserialize)]
struct ChatAnswer {
    #[serde(default)]
    id: Option<String>,
    choices: Vec<ChatChoice>,
}

#[derive(Deserialize)]
struct ChatChoice {
    #[serde(default)]
    message: Option<ChatMessage>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ChatMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
}

#[derive(Deserialize)]
struct ImagesAnswer {
    data: Vec<ImageData>,
}

#[derive(Deserialize)]
struct ImageData {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    b64_json: Option<String>,
    #[serde(default)]
    revised_prompt: Option<String>,
}

fn final_view(job_id: String, outcome: Result<AiResult, (JobStatus, String)>) -> JobView {
    match outcome {
        Ok(result) => JobView {
            job_id,
            status: JobStatus::Succeeded,
            result: Some(result),
            error: None,
            poll_after_ms: None,
            lookup: None,
        },
        Err((status, error)) => JobView {
            job_id,
            status,
            result: None,
            error: Some(error),
            poll_after_ms: None,
            lookup: None,
        },
    }
}

fn chat_outcome(answer: ChatAnswer, key: &str, score: bool) -> JobView {
    let job_id = format!("openai:{}", answer.id.as_deref().unwrap_or(key));
    let Some(choice) = answer.choices.into_iter().next() else {
        return final_view(
            job_id,
            Err((JobStatus::Failed, "no choice in the answer".into())),
        );
    };
    let message = choice.message.unwrap_or(ChatMessage {
        content: None,
        refusal: None,
    });
    if let Some(refusal) = message.refusal.filter(|r| !r.trim().is_empty()) {
        return final_view(job_id, Err((JobStatus::Rejected, refusal)));
    }
    if choice.finish_reason.as_deref() == Some("content_filter") {
        return final_view(
            job_id,
            Err((
                JobStatus::Rejected,
                "stopped by the provider's content filter".into(),
            )),
        );
    }
    let text = match message.content.map(|c| c.trim().to_owned()) {
        Some(text) if !text.is_empty() => text,
        _ => return final_view(job_id, Err((JobStatus::Failed, "empty answer".into()))),
    };
    if !score {
        let content = vec![ContentItem {
            thumb_url: None,
            original_url: None,
            print_url: None,
            kind: "text".into(),
            url: None,
            text: Some(text),
        }];
        return final_view(
            job_id,
            Ok(AiResult {
                content,
                score: None,
            }),
        );
    }
    match parse_score(&text) {
        Some((score, comment)) => final_view(
            job_id,
            Ok(AiResult {
                content: vec![ContentItem {
                    thumb_url: None,
                    original_url: None,
                    print_url: None,
                    kind: "text".into(),
                    url: None,
                    text: Some(comment.unwrap_or_else(|| format!("{score}"))),
                }],
                score: Some(score),
            }),
        ),
        None => {
            let start: String = text.chars().take(80).collect();
            final_view(
                job_id,
                Err((
                    JobStatus::Failed,
                    format!("no score in the answer: {start}"),
                )),
            )
        }
    }
}

fn image_outcome(answer: ImagesAnswer, key: &str) -> JobView {
    let job_id = format!("openai:{key}");
    let content: Vec<ContentItem> = answer
        .data
        .into_iter()
        .filter_map(|image| {
            let url = image.url.filter(|u| !u.is_empty()).or_else(|| {
                image
                    .b64_json
                    .map(|b64| format!("data:image/png;base64,{b64}"))
            })?;
            Some(ContentItem {
                thumb_url: None,
                original_url: None,
                print_url: None,
                kind: "image".into(),
                url: Some(url),
                text: image.revised_prompt,
            })
        })
        .collect();
    let mut result = AiResult {
        content,
        score: None,
    };
    super::client::leave_out_unshown_urls(&mut result, &job_id);
    if result.content.is_empty() {
        return final_view(
            job_id,
            Err((JobStatus::Failed, "no image in the answer".into())),
        );
    }
    final_view(job_id, Ok(result))
}

/// Reads the score the model was asked for: a JSON object `{"score": n,
/// "comment": "..."}` (possibly in a code fence or among other words), a
/// bare JSON number, or else the first number in the text. Finite only.
pub fn parse_score(text: &str) -> Option<(f64, Option<String>)> {
    let from_value = |value: &Value| -> Option<(f64, Option<String>)> {
        match value {
            Value::Number(n) => n.as_f64().map(|s| (s, None)),
            Value::Object(map) => {
                let score = match map.get("score")? {
                    Value::Number(n) => n.as_f64()?,
                    Value::String(s) => s.trim().parse().ok()?,
                    _ => return None,
                };
                let comment = map
                    .get("comment")
                    .and_then(Value::as_str)
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned);
                Some((score, comment))
            }
            _ => None,
        }
    };
    let trimmed = text.trim();
    let parsed = serde_json::from_str::<Value>(trimmed)
        .ok()
        .and_then(|v| from_value(&v))
        .or_else(|| {
            let (start, end) = (trimmed.find('{')?, trimmed.rfind('}')?);
            let object = serde_json::from_str::<Value>(trimmed.get(start..=end)?).ok()?;
            from_value(&object)
        })
        .or_else(|| first_number(trimmed).map(|s| (s, None)));
    parsed.filter(|(score, _)| score.is_finite())
}

fn first_number(text: &str) -> Option<f64> {
    let bytes = text.as_bytes();
    let start = bytes.iter().position(|b| b.is_ascii_digit())?;
    let start = if start > 0 && bytes[start - 1] == b'-' {
        start - 1
    } else {
        start
    };
    let end = text[start..]
        .char_indices()
        .skip(1)
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
        .map_or(text.len(), |(i, _)| start + i);
    text[start..end].trim_end_matches('.').parse().ok()
}

/// What a non-2xx answer says: OpenAI's `{"error": {"message", "type",
/// "code"}}`, or a compatible server's `{"error": "...", "message": "..."}`.
#[derive(Debug, Default)]
struct ErrorAnswer {
    message: Option<String>,
    code: Option<String>,
    kind: Option<String>,
    raw: Option<String>,
}

impl ErrorAnswer {
    const POLICY_CODES: [&'static str; 3] = [
        "content_policy_violation",
        "moderation_blocked",
        "content_filter",
    ];

    fn parse(body: &str) -> ErrorAnswer {
        let text = |v: Option<&Value>| -> Option<String> {
            match v? {
                Value::String(s) => Some(s.clone()),
                Value::Null => None,
                other => Some(other.to_string()),
            }
        };
        match serde_json::from_str::<Value>(body) {
            Ok(Value::Object(top)) => match top.get("error") {
                Some(Value::Object(error)) => ErrorAnswer {
                    message: text(error.get("message")),
                    code: text(error.get("code")),
                    kind: text(error.get("type")),
                    raw: None,
                },
                other => ErrorAnswer {
                    message: text(top.get("message")),
                    code: text(other),
                    kind: None,
                    raw: None,
                },
            },
            _ => {
                let trimmed = body.trim();
                ErrorAnswer {
                    raw: (!trimmed.is_empty()).then(|| trimmed.chars().take(80).collect()),
                    ..ErrorAnswer::default()
                }
            }
        }
    }

    fn is_content_policy(&self) -> bool {
        [&self.code, &self.kind]
            .into_iter()
            .flatten()
            .any(|c| Self::POLICY_CODES.contains(&c.as_str()))
    }

    /// The older shape of a safety refusal: a 400 with no code whose
    /// message says the safety system rejected the request.
    fn is_safety_refusal(&self) -> bool {
        const SIGNS: [&str; 3] = ["safety system", "content policy", "safety_violations"];
        self.code.is_none()
            && self.message.as_deref().is_some_and(|m| {
                let m = m.to_ascii_lowercase();
                SIGNS.iter().any(|sign| m.contains(sign))
            })
    }

    /// OpenAI's hard limit of the account (`insufficient_quota`): retrying
    /// does not restore access, only a change to the account does.
    fn is_out_of_quota(&self) -> bool {
        [&self.code, &self.kind]
            .into_iter()
            .flatten()
            .any(|c| c == "insufficient_quota")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-test-SECRET-0123456789";

    fn client() -> OpenAiClient {
        OpenAiClient::new(&OpenAiSettings {
            base_url: "http://127.0.0.1:9/v1/".into(),
            api_key: Some(ApiKey::new(KEY)),
            chat_model: DEFAULT_CHAT_MODEL.into(),
            image_model: DEFAULT_IMAGE_MODEL.into(),
            image_size: DEFAULT_IMAGE_SIZE.into(),
            connect_timeout: Duration::from_millis(200),
            request_timeout: Duration::from_millis(300),
        })
    }

    fn answer(route: Route, status: u16, body: &str) -> Result<JobView, AiFailure> {
        let status = StatusCode::from_u16(status).unwrap();
        client().classify(route, "key-1", status, &HeaderMap::new(), body)
    }

    const CHAT: Route = Route::Chat { score: false };
    const SCORE: Route = Route::Chat { score: true };
    const IMAGE: Route = Route::Image { comic: false };

    #[test]
    fn the_key_is_not_in_debug_output() {
        let c = client();
        assert_eq!(c.base_url(), "http://127.0.0.1:9");
        let shown = format!("{c:?} {:?}", ApiKey::new(KEY));
        assert!(!shown.contains(KEY), "{shown}");
        assert!(shown.contains("ApiKey(***)"), "{shown}");
    }

    #[test]
    fn keys_parse_and_bad_ones_are_refused() {
        assert_eq!("  sk-1 ".parse::<ApiKey>(), Ok(ApiKey::new("sk-1")));
        assert!("".parse::<ApiKey>().is_err());
        assert!("sk 1".parse::<ApiKey>().is_err());
    }

    #[test]
    fn kinds_choose_their_endpoint() {
        assert_eq!(route("comic"), Route::Image { comic: true });
        assert_eq!(route("image"), IMAGE);
        assert_eq!(route("score"), SCORE);
        assert_eq!(route("video"), CHAT);
        assert_eq!(route("music"), CHAT);
    }

    #[test]
    fn chat_text_becomes_a_text_item() {
        let view = answer(
            CHAT,
            200,
            r#"{"id":"chatcmpl-1","choices":[{"message":{"role":"assistant","content":" a song "},"finish_reason":"stop"}]}"#,
        )
        .unwrap();
        assert_eq!(view.job_id, "openai:chatcmpl-1");
        assert_eq!(view.status, JobStatus::Succeeded);
        let result = view.result.unwrap();
        assert_eq!(result.content[0].kind, "text");
        assert_eq!(result.content[0].text.as_deref(), Some("a song"));
        assert_eq!(result.score, None);
    }

    /// Every `finish_reason` OpenAI documents for a chat choice: only the
    /// content filter's is a refusal; the others end with usable text
    /// (`length`: cut at the token limit, still the guest's text).
    #[test]
    fn every_documented_finish_reason_maps() {
        for (reason, expected) in [
            ("stop", JobStatus::Succeeded),
            ("length", JobStatus::Succeeded),
            ("tool_calls", JobStatus::Succeeded),
            ("function_call", JobStatus::Succeeded),
            ("content_filter", JobStatus::Rejected),
        ] {
            let body = format!(
                r#"{{"id":"c","choices":[{{"message":{{"role":"assistant","content":"words"}},"finish_reason":"{reason}"}}]}}"#
            );
            assert_eq!(
                answer(CHAT, 200, &body).unwrap().status,
                expected,
                "{reason}"
            );
        }
    }

    #[test]
    fn score_answers_parse() {
        assert_eq!(
            parse_score(r#"{"score": 87.5, "comment": "Great"}"#),
            Some((87.5, Some("Great".into())))
        );
        assert_eq!(
            parse_score("```json\n{\"score\": \"42\"}\n```"),
            Some((42.0, None))
        );
        assert_eq!(parse_score("73"), Some((73.0, None)));
        assert_eq!(parse_score("I would give it 64.5."), Some((64.5, None)));
        assert_eq!(parse_score("no idea"), None);
        let view = answer(
            SCORE,
            200,
            r#"{"choices":[{"message":{"content":"{\"score\": 91, \"comment\": \"Sharp\"}"}}]}"#,
        )
        .unwrap();
        assert_eq!(view.job_id, "openai:key-1");
        let result = view.result.unwrap();
        assert_eq!(result.score, Some(91.0));
        assert_eq!(result.content[0].text.as_deref(), Some("Sharp"));
        let failed = answer(
            SCORE,
            200,
            r#"{"choices":[{"message":{"content":"cannot say"}}]}"#,
        )
        .unwrap();
        assert_eq!(failed.status, JobStatus::Failed);
    }

    #[test]
    fn images_become_image_items_with_urls() {
        let view = answer(
            IMAGE,
            200,
            r#"{"created":1,"data":[{"url":"https://img/1.png","revised_prompt":"a cat"},{"b64_json":"QUJD"}]}"#,
        )
        .unwrap();
        let result = view.result.unwrap();
        assert_eq!(result.content.len(), 2);
        assert_eq!(result.content[0].url.as_deref(), Some("https://img/1.png"));
        assert_eq!(result.content[0].text.as_deref(), Some("a cat"));
        assert_eq!(
            result.content[1].url.as_deref(),
            Some("data:image/png;base64,QUJD")
        );
        let empty = answer(IMAGE, 200, r#"{"data":[]}"#).unwrap();
        assert_eq!(empty.status, JobStatus::Failed);
    }

    #[test]
    fn refusals_are_content_rejected() {
        let policy = r#"{"error":{"code":"content_policy_violation","message":"Your request was rejected by our safety system.","type":"invalid_request_error"}}"#;
        assert_eq!(
            answer(IMAGE, 400, policy).unwrap_err(),
            AiFailure::ContentRejected("Your request was rejected by our safety system.".into())
        );
        assert!(matches!(
            answer(IMAGE, 400, r#"{"error":{"code":"moderation_blocked"}}"#),
            Err(AiFailure::ContentRejected(_))
        ));
        let refused = answer(
            CHAT,
            200,
            r#"{"choices":[{"message":{"content":null,"refusal":"I can't help with that."}}]}"#,
        )
        .unwrap();
        assert_eq!(refused.status, JobStatus::Rejected);
        assert_eq!(refused.error.as_deref(), Some("I can't help with that."));
        let filtered = answer(
            CHAT,
            200,
            r#"{"choices":[{"message":{"content":""},"finish_reason":"content_filter"}]}"#,
        )
        .unwrap();
        assert_eq!(filtered.status, JobStatus::Rejected);
    }

    #[test]
    fn rate_limits_and_server_errors_are_unavailable() {
        for status in [429, 500, 502, 503, 504, 408, 409] {
            assert!(
                answer(CHAT, status, r#"{"error":{"message":"busy"}}"#)
                    .unwrap_err()
                    .is_unavailable(),
                "{status}"
            );
        }
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", "7".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        let failure = client().classify(
            CHAT,
            "k",
            StatusCode::TOO_MANY_REQUESTS,
            &headers,
            r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
        );
        assert_eq!(
            failure.unwrap_err(),
            AiFailure::Throttled {
                retry_after_ms: 7_000,
                detail: "HTTP 429: Rate limit reached".into()
            },
            "a 429's Retry-After is the least wait"
        );
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().unwrap());
        }
        headers
    }

    fn throttled_ms(pairs: &[(&'static str, &str)], body: &str) -> Option<i64> {
        client()
            .classify(
                CHAT,
                "k",
                StatusCode::TOO_MANY_REQUESTS,
                &headers(pairs),
                body,
            )
            .unwrap_err()
            .retry_after_ms()
    }

    #[test]
    fn every_documented_way_to_name_a_wait_is_read() {
        let body = r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
        assert_eq!(
            throttled_ms(&[("retry-after-ms", "1500")], body),
            Some(1_500)
        );
        assert_eq!(
            throttled_ms(
                &[
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-requests", "20s"),
                    ("x-ratelimit-remaining-tokens", "900"),
                    ("x-ratelimit-reset-tokens", "6m0s")
                ],
                body
            ),
            Some(20_000),
            "the exhausted limit's reset"
        );
        assert_eq!(
            throttled_ms(
                &[
                    ("x-ratelimit-reset-tokens", "1m30s"),
                    ("x-ratelimit-reset-requests", "2s")
                ],
                body
            ),
            Some(90_000),
            "not saying which ran out: the larger"
        );
        let text = r#"{"error":{"message":"Rate limit reached for gpt-6-luna on requests per min (RPM): Limit 3, Used 3. Please try again in 20s.","type":"requests","code":"rate_limit_exceeded"}}"#;
        assert_eq!(throttled_ms(&[], text), Some(20_000));
        let ms =
            r#"{"error":{"message":"Please try again in 250ms.","code":"rate_limit_exceeded"}}"#;
        assert_eq!(throttled_ms(&[], ms), Some(250));
        assert_eq!(throttled_ms(&[], body), None, "no wait named: unavailable");
        for (text, ms) in [
            ("1s", 1_000),
            ("6m0s", 360_000),
            ("20ms", 20),
            ("1h2m3.5s", 3_723_500),
            ("0.5s", 500),
        ] {
            assert_eq!(
                openai_duration(text).map(|d| d.as_millis() as i64),
                Some(ms),
                "{text}"
            );
        }
        for bad in ["", "s", "5x", "1.2.3s", "99999999999999999999h"] {
            assert_eq!(openai_duration(bad), None, "{bad:?}");
        }
        for absurd in ["inf", "NaN", "1e300"] {
            assert_eq!(
                retry_after(&headers(&[("retry-after", absurd)])),
                None,
                "{absurd}"
            );
        }
    }

    #[test]
    fn out_of_quota_is_its_own_state() {
        let body = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        let failure = client()
            .classify(
                CHAT,
                "k",
                StatusCode::TOO_MANY_REQUESTS,
                &headers(&[("retry-after", "1")]),
                body,
            )
            .unwrap_err();
        assert!(
            matches!(failure, AiFailure::OutOfQuota(ref d) if d.contains("exceeded your current quota")),
            "{failure:?}"
        );
        assert!(failure.is_unavailable(), "not an attempt");
    }

    #[test]
    fn an_old_style_safety_refusal_is_content_rejected() {
        let body = r#"{"error":{"message":"Your request was rejected as a result of our safety system. Your prompt may contain text that is not allowed by our safety system.","type":"invalid_request_error","param":null,"code":null}}"#;
        assert!(matches!(
            answer(IMAGE, 400, body),
            Err(AiFailure::ContentRejected(_))
        ));
        let other = r#"{"error":{"message":"Invalid size","type":"invalid_request_error","param":"size","code":null}}"#;
        assert!(matches!(
            answer(IMAGE, 400, other),
            Err(AiFailure::RequestRejected(_))
        ));
    }

    #[test]
    fn every_request_carries_the_sessions_safety_identifier() {
        let order = JobOrder::for_call("image", "p", "session-1", None, uuid::Uuid::new_v4());
        for kind in ["image", "video"] {
            let mut body = json!({});
            attribute(
                &mut body,
                &JobOrder {
                    kind: kind.into(),
                    ..order.clone()
                },
            );
            assert_eq!(
                body["safety_identifier"],
                json!(crate::domain::keys::safety_identifier("session-1"))
            );
        }
        let mut body = json!({});
        attribute(&mut body, &JobOrder::default());
        assert!(
            body.get("safety_identifier").is_none(),
            "no session, none sent"
        );
    }

    #[test]
    fn unreadable_success_is_unavailable_other_4xx_are_rejected() {
        for body in ["", "not json", r#"{"choices":"x"}"#] {
            assert!(
                matches!(answer(CHAT, 200, body), Err(AiFailure::Unclear(_))),
                "{body:?}"
            );
        }
        assert!(matches!(
            answer(
                IMAGE,
                400,
                r#"{"error":{"code":"invalid_size","message":"bad size"}}"#
            ),
            Err(AiFailure::RequestRejected(_))
        ));
    }

    #[test]
    fn an_image_url_of_another_scheme_is_left_out() {
        let view = answer(
            IMAGE,
            200,
            r#"{"data":[{"url":"javascript:alert(1)","revised_prompt":"a cat"},{"url":"data:text/html,x"},{"b64_json":"QUJD"}]}"#,
        )
        .unwrap();
        let content = view.result.expect("a result").content;
        let urls: Vec<Option<&str>> = content.iter().map(|c| c.url.as_deref()).collect();
        assert_eq!(
            urls,
            [None, Some("data:image/png;base64,QUJD")],
            "{content:?}"
        );
        assert_eq!(content[0].text.as_deref(), Some("a cat"));
    }

    #[test]
    fn the_key_is_scrubbed_from_provider_text() {
        let body = format!(
            r#"{{"error":{{"message":"Incorrect API key provided: {KEY}","code":"invalid_api_key"}}}}"#
        );
        let failure = answer(CHAT, 401, &body).unwrap_err();
        let shown = format!("{failure} {failure:?}");
        assert!(!shown.contains(KEY), "{shown}");
        assert!(shown.contains("***"), "{shown}");
    }

    #[tokio::test]
    async fn a_connection_dropped_after_sending_is_unclear() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Reads the request, then hangs up without an answer.
        let rude = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut buffer = [0u8; 4096];
                let _ = stream.read(&mut buffer).await;
                drop(stream);
            }
        });
        let settings = OpenAiSettings {
            base_url: format!("http://{addr}"),
            api_key: Some(ApiKey::new(KEY)),
            chat_model: "m".into(),
            image_model: "i".into(),
            image_size: "s".into(),
            connect_timeout: Duration::from_millis(300),
            request_timeout: Duration::from_millis(1000),
        };
        let order = JobOrder {
            kind: "image".into(),
            prompt: "p".into(),
            params: json!({}),
            idempotency_key: uuid::Uuid::new_v4(),
            ..JobOrder::default()
        };
        let failure = OpenAiClient::new(&settings)
            .submit(&order)
            .await
            .unwrap_err();
        assert!(matches!(failure, AiFailure::Unclear(_)), "{failure:?}");
        assert!(!format!("{failure}").contains(KEY));
        rude.abort();
    }

    #[tokio::test]
    async fn a_connection_refused_is_unavailable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let mut settings = OpenAiSettings {
            base_url: format!("http://{addr}"),
            api_key: Some(ApiKey::new(KEY)),
            chat_model: "m".into(),
            image_model: "i".into(),
            image_size: "s".into(),
            connect_timeout: Duration::from_millis(300),
            request_timeout: Duration::from_millis(300),
        };
        settings.base_url.push('/');
        let order = JobOrder {
            kind: "music".into(),
            prompt: "p".into(),
            params: json!({}),
            idempotency_key: uuid::Uuid::new_v4(),
            ..JobOrder::default()
        };
        let failure = OpenAiClient::new(&settings)
            .submit(&order)
            .await
            .unwrap_err();
        assert!(matches!(failure, AiFailure::Unavailable(_)), "{failure:?}");
    }
}
