//! The third AI provider: [Replicate](https://replicate.com)'s HTTP API,
//! called with a bearer token. A saga's AI job is one Replicate
//! *prediction*; the job id is the prediction's `id`.
//!
//! # What Replicate's documentation says (and where it was read)
//!
//! - Create (async mode, the default): `POST /v1/predictions` with
//!   `{"version", "input", "webhook", "webhook_events_filter"}` for a
//!   community model version, or `POST /v1/models/{owner}/{name}/predictions`
//!   with `{"input", ...}` for an official model. The answer is the
//!   prediction, usually `starting`. (replicate.com/docs/topics/predictions/create-a-prediction;
//!   the "Create a prediction" page of the HTTP reference as mirrored at
//!   8mdkf4f12u.apifox.cn/api-135794485.)
//! - Sync mode: the header `Prefer: wait` (or `wait=n`) holds the request
//!   open up to 60 s and answers with the output when the model is done
//!   (same page). **Not used here**: the saga polls anyway, and a held-open
//!   create only widens the window in which a dropped connection leaves the
//!   create's outcome unclear.
//! - Get: `GET /v1/predictions/{id}`; `status` is one of `starting`,
//!   `processing`, `succeeded`, `failed`, `canceled`; `output` is the model's
//!   output (files are HTTPS URLs, on `replicate.delivery`); `error` is the
//!   error the prediction met. (HTTP reference "Get a prediction",
//!   8mdkf4f12u.apifox.cn/api-135794486.)
//! - Cancel: `POST /v1/predictions/{id}/cancel`, answers the prediction;
//!   a completed prediction cannot be canceled (its status stays final).
//!   (HTTP reference; hexdocs.pm/replicate Replicate.Predictions.)
//! - List: `GET /v1/predictions`, the predictions of the account (API and
//!   website), newest first, 100 per page, `{"next", "previous", "results"}`
//!   where `next` is the URL of the next page (a `cursor` query).
//!   (HTTP reference "List predictions", 8mdkf4f12u.apifox.cn/api-135794484.)
//!   Its documented example does not show a `webhook` field in the
//!   results; see "Idempotency" for how the adapter copes.
//! - Webhooks: `webhook` is an HTTPS URL Replicate POSTs the prediction to;
//!   `webhook_events_filter` picks among `start`, `output`, `logs`,
//!   `completed` (`completed` = succeeded, canceled or failed). The endpoint
//!   "should respond with a 2xx status code within a few seconds; otherwise,
//!   the webhook might be retried". Nothing in the documentation says a
//!   failed webhook delivery changes the prediction.
//!   (replicate.com/docs/topics/webhooks/receive-webhook and setup-webhook;
//!   replicate.com/changelog/2023-02-10-improved-webhook-events-and-event-filtering.)
//! - Auth: `Authorization: Bearer <token>` (older examples: `Token <token>`).
//! - Rate limits: creates 600/min, other endpoints 3000/min; over it, a
//!   429 with a body like `{"detail":"Request was throttled. Your rate limit
//!   resets in ~30s."}` (replicate.com/docs/topics/predictions/rate-limits).
//!   The wait is read from `Retry-After` when there is one, else from that
//!   "resets in ~Ns" text.
//! - Errors: non-2xx bodies carry `detail` (and on newer endpoints `title`,
//!   problem-details style); a bad input is a 422.
//! - Moderation: there is no moderation status. A refused input or output
//!   ends the prediction `failed` with an `error` such as "NSFW content
//!   detected. Try running it again, or try a different prompt." (raised by
//!   Replicate's own Stable Diffusion models, github.com/replicate/cog-stable-diffusion
//!   pull request 65) or Replicate's "flagged as sensitive" (E005) message
//!   (named in the brief; not found in the stored documentation). Some
//!   guides mention a 422 about safety on create. [`is_moderation`] matches
//!   these texts: such a prediction is `rejected`, such a create refusal is
//!   `ContentRejected`.
//!
//! # Mapping
//!
//! - Input: the model input is exactly `{"prompt": order.prompt}`. The
//!   model (`model` = `owner/name`, an official model) or model version
//!   (`version`, which wins when both are set) comes from configuration;
//!   `order.kind` and `order.params` choose nothing here.
//! - Status: `starting` -> `queued`, `processing` -> `running`, `succeeded`
//!   -> `succeeded`, `failed` -> `failed` (or `rejected` when the error is a
//!   moderation refusal), `canceled` -> `cancelled`. Any other status is an
//!   unreadable answer: `Unclear`.
//! - Output -> [`AiResult`]: a URL string is an item whose type follows the
//!   file extension (audio, video, text, else image); other text is a text
//!   item; a list is mapped item by item, with its non-URL strings joined
//!   into one text item (language models answer a list of tokens); an object
//!   with a numeric `score` gives the score (and its `comment` or `text` a
//!   text item); a bare number is the score. A `succeeded` prediction with
//!   nothing usable is `failed`.
//!
//! # Errors
//!
//! Outside errors become [`AiFailure`]s in one place,
//! `ReplicateClient::classify`, with the rules of the job API client
//! (DESIGN.md rule 6), whose transport classification it reuses: connect
//! error, 5xx, 429 -> `Unavailable` (`Throttled` when the wait is known);
//! no answer in time, a connection broken after sending, an unreadable 2xx,
//! a 504 -> `Unclear`; a 4xx whose text is a moderation refusal ->
//! `ContentRejected`; any other 4xx -> `RequestRejected`.
//!
//! # Idempotency
//!
//! Replicate takes no idempotency key. Every create carries a `webhook`
//! URL that names the saga's attempt key:
//! `{webhook_base}/replicate/{key}` with `webhook_events_filter:
//! ["completed"]` (one delivery per prediction, plus Replicate's retries).
//! Without a configured `webhook_base` it is
//! `https://stagehand.invalid/replicate/{key}`: `.invalid` never resolves,
//! so the delivery fails harmlessly (the documentation only says a failed
//! delivery "might be retried"), and no third party receives the
//! prediction. This is the least harmful choice short of a real receiver.
//! (If Replicate ever refused unresolvable webhook hosts at create time,
//! every create would be a 4xx: configure a real `webhook_base`.)
//!
//! When a create's outcome was unclear, its key goes into a small
//! in-memory set ([`UNCLEAR_KEYS_CAP`] keys at most, the oldest dropped
//! first). Before a create whose key is in that set, the adapter reads the
//! first [`LOOKUP_PAGES`] pages of `GET /v1/predictions` (newest first) and
//! adopts a prediction whose `webhook` ends in `/replicate/{key}` instead of
//! creating a second one. Since the documented list example shows no
//! `webhook` field, a listed prediction without one whose `input` equals the
//! order's input is read by id (at most [`LOOKUP_GETS`] of them) to see its
//! `webhook`. A failing lookup fails the submit (the key stays in the set):
//! no blind second create.
//!
//! Trade-off of looking only after an unclear create: a create costs no
//! extra list call, but the set is this process's memory. The remaining
//! window, where a second prediction (a second billed generation) can be
//! made:
//! - a restart (crash, deploy) between an unclear create and its retry, or
//!   a crash after a successful create before the saga recorded the job id:
//!   the retry creates again without looking;
//! - another instance retrying the saga (PostgreSQL clusters): its set does
//!   not hold the key;
//! - a prediction made but not yet visible in the list when the retry looks;
//! - a prediction pushed beyond the pages searched (more than
//!   `100 x LOOKUP_PAGES` newer predictions on the account, website ones
//!   included);
//! - more than [`UNCLEAR_KEYS_CAP`] unclear creates pending at once.
//!
//! The participant still gets exactly one result: only the recorded job is
//! shown and ranked.
//!
//! # The token
//!
//! It lives in an [`ApiKey`] (`Debug` prints `***`, no `Display`), is sent
//! with reqwest's `bearer_auth` (a sensitive header), is never logged, and
//! any provider text that quotes it back is scrubbed before it becomes a
//! failure detail or a job error. The list's `next` link is never followed
//! as given: only its query is reused on the configured base URL, so the
//! token cannot be sent to another host.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::client::{
    ensure_crypto_provider, path_segment, send, transport_failure, CancelOutcome, JobOrder,
    JobStatus, JobView, RawAnswer,
};
use super::openai::ApiKey;
use crate::domain::failure::{AiFailure, AiResult, ContentItem};

/// Replicate's API.
pub const DEFAULT_BASE_URL: &str = "https://api.replicate.com";
/// Webhook base when none is configured: never resolves (see the module doc).
pub const DEFAULT_WEBHOOK_BASE: &str = "https://stagehand.invalid";
/// Pages of `GET /v1/predictions` read to find an unclear create.
pub const LOOKUP_PAGES: usize = 2;
/// Listed predictions without a `webhook` field read by id in one lookup.
pub const LOOKUP_GETS: usize = 3;
/// Keys of unclear creates remembered at most.
pub const UNCLEAR_KEYS_CAP: usize = 1024;

/// Everything the adapter needs, from configuration.
#[derive(Debug, Clone)]
pub struct ReplicateSettings {
    /// `https://api.replicate.com` (a trailing `/v1` is accepted and dropped).
    pub base_url: String,
    /// Sent as `Authorization: Bearer …`.
    pub api_key: Option<ApiKey>,
    /// An official model, `owner/name`, run with
    /// `POST /v1/models/{owner}/{name}/predictions`.
    pub model: Option<String>,
    /// A model version id, run with `POST /v1/predictions`; wins over `model`.
    pub version: Option<String>,
    /// Bound of one HTTP exchange (not of a prediction). Reaching it is an
    /// unclear outcome.
    pub request_timeout: Duration,
    /// Base of the webhook URL that carries the attempt key; default
    /// [`DEFAULT_WEBHOOK_BASE`].
    pub webhook_base: Option<String>,
}

impl ReplicateSettings {
    /// Defaults for everything but the token and the model.
    pub fn new(api_key: Option<ApiKey>) -> ReplicateSettings {
        ReplicateSettings {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key,
            model: None,
            version: None,
            request_timeout: Duration::from_secs(30),
            webhook_base: None,
        }
    }
}

/// Cheap clonable client of Replicate. Clones share the set of unclear
/// creates. `Debug` shows the key as `ApiKey(***)`.
#[derive(Debug, Clone)]
pub struct ReplicateClient {
    http: reqwest::Client,
    base_url: String,
    api_key: Option<ApiKey>,
    model: Option<String>,
    version: Option<String>,
    webhook_base: String,
    /// Attempt keys whose create had an unclear outcome, oldest first.
    unclear: Arc<Mutex<VecDeque<uuid::Uuid>>>,
}

/// A prediction as Replicate answers it (create, get, cancel, list items).
#[derive(Debug, Clone, Deserialize)]
struct Prediction {
    id: String,
    status: String,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    webhook: Option<String>,
}

/// One page of `GET /v1/predictions`.
#[derive(Debug, Deserialize)]
struct PredictionPage {
    #[serde(default)]
    next: Option<String>,
    results: Vec<Prediction>,
}

impl ReplicateClient {
    pub fn new(settings: &ReplicateSettings) -> ReplicateClient {
        ensure_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(settings.request_timeout.min(Duration::from_secs(5)))
            .timeout(settings.request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("the Replicate HTTP client configuration is static and valid");
        let base = settings.base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        ReplicateClient {
            http,
            base_url: base.to_owned(),
            api_key: settings.api_key.clone(),
            model: settings.model.clone().filter(|m| !m.trim().is_empty()),
            version: settings.version.clone().filter(|v| !v.trim().is_empty()),
            webhook_base: settings
                .webhook_base
                .as_deref()
                .unwrap_or(DEFAULT_WEBHOOK_BASE)
                .trim_end_matches('/')
                .to_owned(),
            unclear: Arc::default(),
        }
    }

    /// The base URL, without `/v1` and without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn has_key(&self) -> bool {
        self.api_key.is_some()
    }

    /// Creates the prediction of one attempt, or adopts the one an earlier
    /// unclear create of the same key made (see the module doc).
    pub async fn submit(&self, order: &JobOrder) -> Result<JobView, AiFailure> {
        let key = order.idempotency_key;
        let input = json!({ "prompt": order.prompt });
        if self.was_unclear(key) {
            if let Some(found) = self.find_created(key, &input).await? {
                tracing::info!(idempotency_key = %key, prediction = %found.id, "Replicate: adopted the prediction of an unclear create");
                self.forget_unclear(key);
                return self.view(found);
            }
        }
        let webhook = self.webhook_url(key);
        let mut body = json!({
            "input": input,
            "webhook": webhook,
            "webhook_events_filter": ["completed"],
        });
        let url = match (&self.version, &self.model) {
            (Some(version), _) => {
                body["version"] = json!(version);
                format!("{}/v1/predictions", self.base_url)
            }
            (None, Some(model)) => match model.split_once('/') {
                Some((owner, name)) if !owner.is_empty() && !name.is_empty() => format!(
                    "{}/v1/models/{}/{}/predictions",
                    self.base_url,
                    path_segment(owner),
                    path_segment(name)
                ),
                _ => {
                    return Err(AiFailure::RequestRejected(format!(
                        "the Replicate model must be owner/name, not {model:?}"
                    )))
                }
            },
            (None, None) => {
                return Err(AiFailure::RequestRejected(
                    "no Replicate model or version is configured".to_owned(),
                ))
            }
        };
        tracing::debug!(kind = %order.kind, idempotency_key = %key, "Replicate: create a prediction");
        let request = self.authorized(self.http.post(url).json(&body));
        let outcome = self
            .classify::<Prediction>(send(request).await)
            .and_then(|prediction| self.view(prediction));
        match &outcome {
            Err(AiFailure::Unclear(_)) => self.remember_unclear(key),
            Ok(_) | Err(AiFailure::RequestRejected(_)) | Err(AiFailure::ContentRejected(_)) => {
                self.forget_unclear(key)
            }
            // Refused before a prediction was made: an earlier unclear
            // create, if any, is still to be looked for.
            Err(_) => {}
        }
        outcome
    }

    /// `GET /v1/predictions/{id}`.
    pub async fn poll(&self, job_id: &str) -> Result<JobView, AiFailure> {
        let request = self.authorized(self.http.get(format!(
            "{}/v1/predictions/{}",
            self.base_url,
            path_segment(job_id)
        )));
        self.classify::<Prediction>(send(request).await)
            .and_then(|prediction| self.view(prediction))
    }

    /// `POST /v1/predictions/{id}/cancel`. The answer's status tells
    /// whether the prediction is final (canceled, or ended before) or still
    /// stopping. A 404 or 405 (an id this account does not know, e.g. one
    /// recorded by another provider) is "no cancel", like the job API's.
    pub async fn cancel(&self, job_id: &str) -> Result<CancelOutcome, AiFailure> {
        let request = self.authorized(self.http.post(format!(
            "{}/v1/predictions/{}/cancel",
            self.base_url,
            path_segment(job_id)
        )));
        CancelOutcome::of(
            self.classify::<Prediction>(send(request).await)
                .and_then(|prediction| self.view(prediction)),
        )
    }

    /// The webhook URL that carries an attempt key.
    fn webhook_url(&self, key: uuid::Uuid) -> String {
        format!("{}/replicate/{key}", self.webhook_base)
    }

    fn authorized(&self, request: RequestBuilder) -> RequestBuilder {
        match &self.api_key {
            Some(key) => request.bearer_auth(key.expose()),
            None => request,
        }
    }

    /// Looks for the prediction an unclear create of `key` made: the first
    /// pages of the list, newest first (see the module doc).
    async fn find_created(
        &self,
        key: uuid::Uuid,
        input: &Value,
    ) -> Result<Option<Prediction>, AiFailure> {
        let suffix = format!("/replicate/{key}");
        let carries_key =
            |p: &Prediction| p.webhook.as_deref().is_some_and(|w| w.ends_with(&suffix));
        let mut url = format!("{}/v1/predictions", self.base_url);
        let mut gets = 0;
        for _ in 0..LOOKUP_PAGES {
            let request = self.authorized(self.http.get(&url));
            let page: PredictionPage = self.classify(send(request).await)?;
            if let Some(found) = page.results.iter().find(|p| carries_key(p)) {
                return Ok(Some(found.clone()));
            }
            // A list without `webhook` fields: read the likely ones by id.
            for candidate in page
                .results
                .iter()
                .filter(|p| p.webhook.is_none() && p.input.as_ref() == Some(input))
            {
                if gets == LOOKUP_GETS {
                    break;
                }
                gets += 1;
                let full = self.fetch(&candidate.id).await?;
                if carries_key(&full) {
                    return Ok(Some(full));
                }
            }
            match page.next.as_deref().and_then(next_query) {
                Some(query) => url = format!("{}/v1/predictions?{query}", self.base_url),
                None => break,
            }
        }
        Ok(None)
    }

    async fn fetch(&self, id: &str) -> Result<Prediction, AiFailure> {
        let request = self.authorized(self.http.get(format!(
            "{}/v1/predictions/{}",
            self.base_url,
            path_segment(id)
        )));
        self.classify(send(request).await)
    }

    fn was_unclear(&self, key: uuid::Uuid) -> bool {
        self.unclear.lock().expect("unclear keys").contains(&key)
    }

    fn remember_unclear(&self, key: uuid::Uuid) {
        let mut keys = self.unclear.lock().expect("unclear keys");
        if !keys.contains(&key) {
            if keys.len() == UNCLEAR_KEYS_CAP {
                keys.pop_front();
            }
            keys.push_back(key);
        }
    }

    fn forget_unclear(&self, key: uuid::Uuid) {
        self.unclear
            .lock()
            .expect("unclear keys")
            .retain(|k| *k != key);
    }

    /// The one place where this provider's outside errors become
    /// [`AiFailure`]s (module doc, "Errors"); a 2xx body is parsed as `T`.
    fn classify<T: DeserializeOwned>(
        &self,
        outcome: Result<RawAnswer, reqwest::Error>,
    ) -> Result<T, AiFailure> {
        let answer = match outcome {
            Ok(answer) => answer,
            Err(error) => return Err(self.scrub_failure(transport_failure(&error))),
        };
        let status = answer.status;
        if status.is_success() {
            // Replicate may have made the prediction; we cannot read it.
            return serde_json::from_str(&answer.body).map_err(|error| {
                AiFailure::Unclear(format!(
                    "unreadable answer (HTTP {}): {error}",
                    status.as_u16()
                ))
            });
        }
        let reason = error_reason(&answer.body).map(|reason| self.scrub(&reason));
        let described = match &reason {
            Some(reason) => format!("HTTP {}: {reason}", status.as_u16()),
            None => format!("HTTP {}", status.as_u16()),
        };
        Err(if status == StatusCode::TOO_MANY_REQUESTS {
            match answer
                .retry_after_s
                .or_else(|| reason.as_deref().and_then(resets_in_s))
            {
                Some(seconds) => AiFailure::Throttled {
                    retry_after_ms: seconds.saturating_mul(1_000).min(i64::MAX as u64) as i64,
                    detail: described,
                },
                None => AiFailure::Unavailable(described),
            }
        } else if status == StatusCode::GATEWAY_TIMEOUT {
            AiFailure::Unclear(described)
        } else if status.is_server_error() {
            AiFailure::Unavailable(described)
        } else if status.is_client_error() && reason.as_deref().is_some_and(is_moderation) {
            AiFailure::ContentRejected(reason.unwrap_or_default())
        } else if status.is_client_error() {
            AiFailure::RequestRejected(described)
        } else {
            AiFailure::RequestRejected(format!("unexpected answer, {described}"))
        })
    }

    /// A prediction as a job (module doc, "Mapping").
    fn view(&self, prediction: Prediction) -> Result<JobView, AiFailure> {
        let error = prediction.error.as_ref().and_then(|error| match error {
            Value::Null => None,
            Value::String(text) => Some(self.scrub(text)),
            other => Some(self.scrub(&other.to_string())),
        });
        let (status, result, error) = match prediction.status.as_str() {
            "starting" => (JobStatus::Queued, None, None),
            "processing" => (JobStatus::Running, None, None),
            "succeeded" => {
                let result = prediction.output.as_ref().map(|output| {
                    let mut result = output_result(output);
                    super::client::leave_out_unshown_urls(&mut result, &prediction.id);
                    result
                });
                match result.filter(|r| !r.content.is_empty() || r.score.is_some()) {
                    Some(result) => (JobStatus::Succeeded, Some(result), None),
                    None => (
                        JobStatus::Failed,
                        None,
                        Some("the prediction succeeded without a usable output".to_owned()),
                    ),
                }
            }
            "failed" => {
                let error = error.unwrap_or_else(|| "the prediction failed".to_owned());
                let status = if is_moderation(&error) {
                    JobStatus::Rejected
                } else {
                    JobStatus::Failed
                };
                (status, None, Some(error))
            }
            "canceled" | "cancelled" => (JobStatus::Cancelled, None, error),
            other => {
                let other: String = self.scrub(other).chars().take(40).collect();
                return Err(AiFailure::Unclear(format!(
                    "unreadable answer: unknown prediction status {other:?}"
                )));
            }
        };
        Ok(JobView {
            job_id: prediction.id,
            status,
            result,
            error,
            poll_after_ms: None,
        })
    }

    fn scrub(&self, text: &str) -> String {
        match &self.api_key {
            Some(key) if !key.expose().is_empty() => text.replace(key.expose(), "***"),
            _ => text.to_owned(),
        }
    }

    fn scrub_failure(&self, failure: AiFailure) -> AiFailure {
        match failure {
            AiFailure::Unavailable(d) => AiFailure::Unavailable(self.scrub(&d)),
            AiFailure::Unclear(d) => AiFailure::Unclear(self.scrub(&d)),
            AiFailure::RequestRejected(d) => AiFailure::RequestRejected(self.scrub(&d)),
            AiFailure::ContentRejected(d) => AiFailure::ContentRejected(self.scrub(&d)),
            AiFailure::JobFailed(d) => AiFailure::JobFailed(self.scrub(&d)),
            AiFailure::Throttled {
                retry_after_ms,
                detail,
            } => AiFailure::Throttled {
                retry_after_ms,
                detail: self.scrub(&detail),
            },
            AiFailure::Timeout => AiFailure::Timeout,
        }
    }
}

/// The query of a list's `next` link (`cursor=…`), to be asked of our own
/// base URL.
fn next_query(next: &str) -> Option<&str> {
    next.split_once('?')
        .map(|(_, query)| query)
        .filter(|query| !query.is_empty())
}

/// What a non-2xx body says: `detail` (and `title`) of Replicate's errors,
/// else the start of the body.
fn error_reason(body: &str) -> Option<String> {
    let text = |value: Option<&Value>| match value {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        _ => None,
    };
    match serde_json::from_str::<Value>(body) {
        Ok(Value::Object(fields)) => text(fields.get("detail"))
            .or_else(|| text(fields.get("title")))
            .or_else(|| text(fields.get("error")))
            .map(|reason| reason.chars().take(200).collect()),
        _ => {
            let trimmed = body.trim();
            (!trimmed.is_empty()).then(|| trimmed.chars().take(80).collect())
        }
    }
}

/// The seconds of "Your rate limit resets in ~30s." (Replicate's 429 body).
fn resets_in_s(detail: &str) -> Option<u64> {
    let rest = &detail[detail.find("resets in")? + "resets in".len()..];
    let digits: String = rest
        .trim_start_matches([' ', '~'])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// True when a prediction error or an error answer is a moderation refusal
/// (module doc, "Moderation").
pub fn is_moderation(text: &str) -> bool {
    const SIGNS: [&str; 7] = [
        "nsfw",
        "flagged as sensitive",
        "(e005)",
        "safety checker",
        "safety filter",
        "content policy",
        "content moderation",
    ];
    let lower = text.to_lowercase();
    SIGNS.iter().any(|sign| lower.contains(sign))
}

/// A prediction's `output` as a result (module doc, "Mapping").
fn output_result(output: &Value) -> AiResult {
    let mut result = AiResult::default();
    let mut text = String::new();
    collect(output, &mut result, &mut text);
    if !text.trim().is_empty() {
        result.content.push(ContentItem {
            kind: "text".into(),
            url: None,
            text: Some(text.trim().to_owned()),
        });
    }
    result
}

fn collect(value: &Value, result: &mut AiResult, text: &mut String) {
    match value {
        Value::String(s) if is_url(s) => result.content.push(ContentItem {
            kind: url_kind(s).into(),
            url: Some(s.clone()),
            text: None,
        }),
        Value::String(s) => text.push_str(s),
        Value::Array(items) => items.iter().for_each(|item| collect(item, result, text)),
        Value::Number(n) => {
            if result.score.is_none() {
                result.score = n.as_f64().filter(|s| s.is_finite());
            }
        }
        Value::Object(map) => {
            let score = match map.get("score") {
                Some(Value::Number(n)) => n.as_f64(),
                Some(Value::String(s)) => s.trim().parse().ok(),
                _ => None,
            };
            if let Some(score) = score.filter(|s| s.is_finite()) {
                result.score.get_or_insert(score);
            }
            let words = ["comment", "text", "output"]
                .iter()
                .find_map(|field| map.get(*field).and_then(Value::as_str));
            let url = map.get("url").and_then(Value::as_str).filter(|u| is_url(u));
            if let Some(url) = url {
                result.content.push(ContentItem {
                    kind: url_kind(url).into(),
                    url: Some(url.to_owned()),
                    text: words.map(str::to_owned),
                });
            } else if let Some(words) = words {
                text.push_str(words);
            } else if score.is_none() {
                text.push_str(&value.to_string());
            }
        }
        Value::Bool(_) | Value::Null => {}
    }
}

fn is_url(s: &str) -> bool {
    let s = s.trim_start();
    s.starts_with("https://") || s.starts_with("http://") || s.starts_with("data:")
}

/// The content type of a file URL, from its extension (or a data URL's
/// media type); image unless it says otherwise.
fn url_kind(url: &str) -> &'static str {
    if let Some(media) = url.strip_prefix("data:") {
        return match media.split('/').next().unwrap_or_default() {
            "audio" => "audio",
            "video" => "video",
            "text" => "text",
            _ => "image",
        };
    }
    let path = url.split(['?', '#']).next().unwrap_or_default();
    let file = path.rsplit('/').next().unwrap_or_default();
    let extension = file
        .rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase())
        .unwrap_or_default();
    match extension.as_str() {
        "mp3" | "wav" | "ogg" | "flac" | "m4a" | "aac" | "opus" => "audio",
        "mp4" | "webm" | "mov" | "mkv" | "avi" | "m4v" => "video",
        "txt" | "md" | "json" => "text",
        _ => "image",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "r8_test-SECRET-0123456789";

    fn client() -> ReplicateClient {
        ReplicateClient::new(&ReplicateSettings {
            base_url: "http://127.0.0.1:9/v1/".into(),
            model: Some("owner/model".into()),
            request_timeout: Duration::from_millis(300),
            ..ReplicateSettings::new(Some(ApiKey::new(KEY)))
        })
    }

    fn answer(status: u16, body: &str, retry_after_s: Option<u64>) -> Result<JobView, AiFailure> {
        let c = client();
        c.classify::<Prediction>(Ok(RawAnswer {
            status: StatusCode::from_u16(status).unwrap(),
            body: body.to_owned(),
            retry_after_s,
        }))
        .and_then(|p| c.view(p))
    }

    fn ok(body: &str) -> JobView {
        answer(200, body, None).expect("a readable prediction")
    }

    #[test]
    fn the_key_is_not_in_debug_output() {
        let c = client();
        assert_eq!(c.base_url(), "http://127.0.0.1:9");
        let shown = format!("{c:?}");
        assert!(!shown.contains(KEY), "{shown}");
        assert!(shown.contains("ApiKey(***)"), "{shown}");
    }

    #[test]
    fn statuses_map() {
        for (status, expected) in [
            ("starting", JobStatus::Queued),
            ("processing", JobStatus::Running),
            ("canceled", JobStatus::Cancelled),
        ] {
            let view = ok(&format!(r#"{{"id":"p1","status":"{status}"}}"#));
            assert_eq!(view.status, expected, "{status}");
            assert_eq!(view.job_id, "p1");
        }
        let failed = ok(r#"{"id":"p","status":"failed","error":"CUDA out of memory"}"#);
        assert_eq!(failed.status, JobStatus::Failed);
        assert_eq!(failed.error.as_deref(), Some("CUDA out of memory"));
        let nsfw = ok(
            r#"{"id":"p","status":"failed","error":"NSFW content detected. Try running it again, or try a different prompt."}"#,
        );
        assert_eq!(nsfw.status, JobStatus::Rejected);
        let sensitive = ok(
            r#"{"id":"p","status":"failed","error":"The input or output was flagged as sensitive. Please try again with different inputs. (E005)"}"#,
        );
        assert_eq!(sensitive.status, JobStatus::Rejected);
        assert!(matches!(
            answer(200, r#"{"id":"p","status":"exploded"}"#, None),
            Err(AiFailure::Unclear(_))
        ));
        for body in ["", "not json", r#"{"status":"starting"}"#] {
            assert!(
                matches!(answer(201, body, None), Err(AiFailure::Unclear(_))),
                "{body:?}"
            );
        }
    }

    #[test]
    fn output_urls_of_another_kind_are_left_out() {
        let view = ok(
            r#"{"id":"p","status":"succeeded","output":["data:text/html,<b>x</b>",{"url":"data:application/javascript,alert(1)","text":"t"},"https://replicate.delivery/x/out.webp"]}"#,
        );
        let content = view.result.expect("a result").content;
        let urls: Vec<Option<&str>> = content.iter().map(|c| c.url.as_deref()).collect();
        assert_eq!(
            urls,
            [None, Some("https://replicate.delivery/x/out.webp")],
            "{content:?}"
        );
        assert_eq!(content[0].text.as_deref(), Some("t"));
    }

    #[test]
    fn outputs_map_to_content() {
        let image = ok(
            r#"{"id":"p","status":"succeeded","output":"https://replicate.delivery/x/out.webp"}"#,
        )
        .result
        .unwrap();
        assert_eq!(image.content.len(), 1);
        assert_eq!(image.content[0].kind, "image");
        assert_eq!(
            image.content[0].url.as_deref(),
            Some("https://replicate.delivery/x/out.webp")
        );
        let many = output_result(&json!([
            "https://r.d/a.png",
            "https://r.d/b.mp3?sig=1",
            "https://r.d/c.mp4"
        ]));
        let kinds: Vec<&str> = many.content.iter().map(|c| c.kind.as_str()).collect();
        assert_eq!(kinds, ["image", "audio", "video"]);
        let tokens = output_result(&json!(["Once ", "upon ", "a time"]));
        assert_eq!(tokens.content.len(), 1);
        assert_eq!(tokens.content[0].kind, "text");
        assert_eq!(tokens.content[0].text.as_deref(), Some("Once upon a time"));
        let scored = output_result(&json!({"score": 87.5, "comment": "Sharp"}));
        assert_eq!(scored.score, Some(87.5));
        assert_eq!(scored.content[0].text.as_deref(), Some("Sharp"));
        assert_eq!(output_result(&json!(42)).score, Some(42.0));
        let object = output_result(&json!({"caption": "a cat"}));
        assert_eq!(
            object.content[0].text.as_deref(),
            Some(r#"{"caption":"a cat"}"#)
        );
        let empty = ok(r#"{"id":"p","status":"succeeded","output":null}"#);
        assert_eq!(empty.status, JobStatus::Failed);
        let blank = ok(r#"{"id":"p","status":"succeeded","output":[]}"#);
        assert_eq!(blank.status, JobStatus::Failed);
    }

    #[test]
    fn errors_are_classified() {
        let throttled = answer(
            429,
            r#"{"detail":"Request was throttled. Your rate limit resets in ~30s."}"#,
            None,
        )
        .unwrap_err();
        assert_eq!(throttled.retry_after_ms(), Some(30_000));
        assert!(throttled.is_unavailable());
        let header = answer(429, "{}", Some(7)).unwrap_err();
        assert_eq!(header.retry_after_ms(), Some(7_000));
        assert!(matches!(
            answer(429, "", None),
            Err(AiFailure::Unavailable(_))
        ));
        for status in [500, 502, 503] {
            assert!(matches!(
                answer(status, r#"{"detail":"down"}"#, None),
                Err(AiFailure::Unavailable(_))
            ));
        }
        assert!(matches!(answer(504, "", None), Err(AiFailure::Unclear(_))));
        assert_eq!(
            answer(
                422,
                r#"{"title":"Input validation failed","detail":"- input.prompt: Invalid type"}"#,
                None
            )
            .unwrap_err(),
            AiFailure::RequestRejected("HTTP 422: - input.prompt: Invalid type".into())
        );
        assert!(matches!(
            answer(
                422,
                r#"{"detail":"Prompt was flagged as sensitive (E005)"}"#,
                None
            ),
            Err(AiFailure::ContentRejected(_))
        ));
        assert!(matches!(
            answer(404, r#"{"detail":"Not found."}"#, None),
            Err(AiFailure::RequestRejected(_))
        ));
        assert!(matches!(
            answer(302, "", None),
            Err(AiFailure::RequestRejected(m)) if m.starts_with("unexpected")
        ));
    }

    #[test]
    fn the_key_is_scrubbed_from_provider_text() {
        let failure =
            answer(401, &format!(r#"{{"detail":"Invalid token {KEY}"}}"#), None).unwrap_err();
        let shown = format!("{failure} {failure:?}");
        assert!(!shown.contains(KEY), "{shown}");
        assert!(shown.contains("***"), "{shown}");
        let view = ok(&format!(
            r#"{{"id":"p","status":"failed","error":"bad token {KEY}"}}"#
        ));
        assert!(!view.error.unwrap().contains(KEY));
    }

    #[test]
    fn helpers() {
        assert_eq!(
            next_query("https://api.replicate.com/v1/predictions?cursor=abc"),
            Some("cursor=abc")
        );
        assert_eq!(next_query("https://elsewhere/v1/predictions"), None);
        assert_eq!(resets_in_s("Your rate limit resets in ~30s."), Some(30));
        assert_eq!(resets_in_s("slow down"), None);
        assert_eq!(url_kind("data:audio/wav;base64,AAA"), "audio");
        assert_eq!(url_kind("https://x/y/readme.TXT"), "text");
        assert_eq!(url_kind("https://x/y"), "image");
        let c = client();
        let key = uuid::Uuid::new_v4();
        assert_eq!(
            c.webhook_url(key),
            format!("https://stagehand.invalid/replicate/{key}")
        );
        assert!(!c.was_unclear(key));
        c.remember_unclear(key);
        assert!(c.clone().was_unclear(key), "clones share the set");
        c.forget_unclear(key);
        assert!(!c.was_unclear(key));
    }

    #[test]
    fn the_unclear_set_is_bounded() {
        let c = client();
        let first = uuid::Uuid::new_v4();
        c.remember_unclear(first);
        for _ in 0..UNCLEAR_KEYS_CAP {
            c.remember_unclear(uuid::Uuid::new_v4());
        }
        assert!(!c.was_unclear(first), "the oldest key is dropped");
        assert_eq!(c.unclear.lock().unwrap().len(), UNCLEAR_KEYS_CAP);
    }

    #[tokio::test]
    async fn without_a_model_a_submit_is_refused() {
        let c = ReplicateClient::new(&ReplicateSettings::new(None));
        let order = JobOrder {
            kind: "image".into(),
            prompt: "p".into(),
            params: json!({}),
            idempotency_key: uuid::Uuid::new_v4(),
        };
        assert!(matches!(
            c.submit(&order).await,
            Err(AiFailure::RequestRejected(_))
        ));
    }
}
