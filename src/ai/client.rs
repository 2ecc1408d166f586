//! Client of the AI provider's job API (DESIGN.md "The AI provider"): submit a
//! job under an idempotency key, poll it by id. It owns the translation of every
//! outside error (transport errors, HTTP statuses, malformed answers) into an
//! [`AiFailure`], done in one place: [`classify`]. Job statuses `failed` and
//! `rejected` are not errors here; the caller reads [`JobView::status`]. A
//! result's URLs that the pages may not show (a `javascript:` link, any
//! scheme but http(s)) are left out there too ([`leave_out_unshown_urls`],
//! which every adapter calls).
//!
//! A participant's photo ([`JobOrder::input`]) reaches the job API as a URL
//! it fetches: `params.input_url`, this server's signed URL of the photo.
//! Without one (no `STAGEHAND_PUBLIC_URL`) the submit is refused before it
//! is sent ([`submit_params`]).

use std::time::Duration;

use reqwest::{RequestBuilder, StatusCode};
use serde::{Deserialize, Serialize};

use crate::domain::failure::{AiFailure, AiResult};

/// Everything needed to submit one AI job. The same `idempotency_key` always
/// designates the same job at the provider.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobOrder {
    pub kind: String,
    pub prompt: String,
    pub params: serde_json::Value,
    pub idempotency_key: uuid::Uuid,
    /// A stable digest of the session, for providers that attribute abuse
    /// to an end user (OpenAI's `safety_identifier`): never the session id,
    /// a token or a nickname ([`crate::domain::keys::safety_identifier`]).
    pub safety_id: String,
    /// Set when an earlier submit of this key may have made a job.
    pub maybe_made: Option<MaybeMade>,
    /// The participant's photo, for an experience whose `input` takes one.
    pub input: Option<InputPhoto>,
}

/// A participant's photo as a provider gets it: each adapter sends it its
/// own way (the job API `params.input_url`, Replicate a file input, OpenAI
/// the image-edit endpoint).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InputPhoto {
    /// A signed, expiring URL of this server (`STAGEHAND_PUBLIC_URL`, or the
    /// loopback address for the built-in simulator) that serves the photo;
    /// None when no URL the provider can reach is known.
    pub url: Option<String>,
    /// The stored photo (a re-encoded JPEG, at most `photo_max_px`).
    pub bytes: bytes::Bytes,
    pub content_type: String,
}

impl InputPhoto {
    /// The photo's media type; `image/jpeg` (what the photo store keeps)
    /// when none is given.
    pub fn media_type(&self) -> &str {
        match self.content_type.trim() {
            "" => "image/jpeg",
            given => given,
        }
    }

    /// A file name for a multipart part, its extension from the media
    /// type (`photo.jpg`, `photo.png`, `photo.webp`).
    pub fn file_name(&self) -> &'static str {
        match self.media_type() {
            "image/png" => "photo.png",
            "image/webp" => "photo.webp",
            _ => "photo.jpg",
        }
    }

    /// The photo as a `data:<media type>;base64,…` URL.
    pub fn data_url(&self) -> String {
        use base64::Engine;
        let encoded = base64::engine::general_purpose::STANDARD.encode(&self.bytes);
        format!("data:{};base64,{encoded}", self.media_type())
    }
}

/// An earlier submit of an order's key may have made a job: its outcome
/// was unclear, or its worker died before recording the answer. A provider
/// with an idempotency key needs nothing of this (the key finds the job);
/// one without (Replicate) looks for that job by what its documentation
/// promises before it makes another.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MaybeMade {
    /// The job, if made, was made no earlier than this (epoch ms): when the
    /// key was first sent, or its slot took it.
    pub since_ms: i64,
    /// When the key was last sent (the send whose outcome is unclear); the
    /// list may not show what that send made until a while after it.
    pub last_sent_ms: i64,
    /// Now, by the same clock as `since_ms`.
    pub now_ms: i64,
    /// Jobs the ledger holds for other calls: never this call's.
    pub taken: std::collections::HashSet<String>,
    /// Only look (the slot adopter): never make a job. Finding none is
    /// no evidence that none runs.
    pub look_only: bool,
    /// The photo the earlier send carried, when the order no longer has
    /// it (the slot adopter's, from the ledger); else the order's own.
    pub photo: Option<PhotoPrint>,
}

/// How a photo that was sent is known again without the photo: its key
/// in the media store (its own URL names it) and the SHA-256 of its bytes
/// (a data URI or an uploaded file of the same bytes).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PhotoPrint {
    pub key: Option<String>,
    pub sha256: Option<String>,
}

impl PhotoPrint {
    /// The print of a photo as an order carries it.
    pub fn of(photo: &InputPhoto) -> PhotoPrint {
        PhotoPrint {
            key: photo.url.as_deref().and_then(media_key_of),
            sha256: Some(crate::domain::media::photo_sha256(&photo.bytes)),
        }
    }

    /// Whether `url` is this photo's own URL, however it was signed: its
    /// path ends in `/media/<key>`.
    pub fn is_served_at(&self, url: &str) -> bool {
        self.key
            .as_deref()
            .is_some_and(|key| media_key_of(url) == Some(key.to_owned()))
    }
}

/// The media key a URL of this server names (`…/media/<key>?…`).
fn media_key_of(url: &str) -> Option<String> {
    let path = url.split(['?', '#']).next()?;
    let (_, key) = path.rsplit_once("/media/")?;
    (!key.is_empty()).then(|| key.to_owned())
}

impl JobOrder {
    /// The order of one AI call of a saga: a single call's params name its
    /// session, a fan-out call's its session and call index. The same call
    /// and key always make the same order, so a resent key finds its job.
    pub fn for_call(
        kind: &str,
        prompt: &str,
        session_id: &str,
        fan_out_call: Option<i32>,
        idempotency_key: uuid::Uuid,
    ) -> JobOrder {
        let params = match fan_out_call {
            None => serde_json::json!({"session_id": session_id}),
            Some(call) => serde_json::json!({"session_id": session_id, "call": call}),
        };
        JobOrder {
            kind: kind.to_owned(),
            prompt: prompt.to_owned(),
            params,
            idempotency_key,
            safety_id: crate::domain::keys::safety_identifier(session_id),
            maybe_made: None,
            input: None,
        }
    }
}

/// Status of a job as the provider reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Rejected,
    /// Stopped by a cancel (the optional `POST /v1/jobs/{id}/cancel`).
    Cancelled,
}

impl JobStatus {
    /// True when the job will not change any more.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Rejected | JobStatus::Cancelled
        )
    }
}

/// What a provider said to a cancel.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// The job is final now (cancelled, or it had ended already): its slot
    /// is free.
    Final(JobStatus),
    /// The provider took the cancel but the job is not final yet: poll it.
    Pending,
    /// The provider has no cancel (404 or 405 on the cancel endpoint, or an
    /// adapter without one): hold the slot and poll until the job ends.
    Unsupported,
}

impl CancelOutcome {
    /// What a provider's answer to a cancel (the job as it stands, or a
    /// failure) means; a refused request of HTTP 404 or 405 is no cancel.
    /// Every adapter with a cancel reads its answer here.
    pub fn of(answer: Result<JobView, AiFailure>) -> Result<CancelOutcome, AiFailure> {
        match answer {
            Ok(view) if view.status.is_final() => Ok(CancelOutcome::Final(view.status)),
            Ok(_) => Ok(CancelOutcome::Pending),
            Err(AiFailure::RequestRejected(detail))
                if detail.starts_with("HTTP 404") || detail.starts_with("HTTP 405") =>
            {
                Ok(CancelOutcome::Unsupported)
            }
            Err(failure) => Err(failure),
        }
    }
}

/// A job as the provider answers it to a submit or a poll.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobView {
    pub job_id: String,
    pub status: JobStatus,
    #[serde(default)]
    pub result: Option<AiResult>,
    #[serde(default)]
    pub error: Option<String>,
    /// The provider's hint of when to poll again (its `poll_after_ms`, or a
    /// `Retry-After` header on the answer), if it gave one.
    #[serde(default)]
    pub poll_after_ms: Option<i64>,
    /// How a submit whose key may have made a job already came by this
    /// one (providers without an idempotency key look for it; see
    /// [`MaybeMade`]). Counted by the AI actor; never sent anywhere.
    #[serde(skip)]
    pub lookup: Option<Lookup>,
}

/// What looking for the job of an earlier, unclear submit ended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The one job it made was found and is this one.
    Adopted,
    /// Several jobs fit; the oldest not held by another call is this one.
    Ambiguous,
    /// None was found after the list had time to show it: this job is a
    /// new one (the earlier submit made none, or one the list never showed).
    CreatedAgain,
}

impl Lookup {
    pub fn as_str(self) -> &'static str {
        match self {
            Lookup::Adopted => "adopted",
            Lookup::Ambiguous => "ambiguous",
            Lookup::CreatedAgain => "created_again",
        }
    }
}

/// Body of `POST /v1/jobs`.
#[derive(Serialize)]
struct SubmitBody<'a> {
    kind: &'a str,
    prompt: &'a str,
    params: &'a serde_json::Value,
}

/// Cheap clonable client of one provider's job API.
#[derive(Debug, Clone)]
pub struct AiClient {
    http: reqwest::Client,
    /// Provider base URL without a trailing slash, e.g. `http://127.0.0.1:9000`.
    base_url: String,
}

impl AiClient {
    /// `connect_timeout` bounds establishing the connection, `request_timeout`
    /// one whole HTTP exchange (not a whole job: that is the caller's
    /// `AI_TIMEOUT`).
    pub fn new(base_url: &str, connect_timeout: Duration, request_timeout: Duration) -> Self {
        let http = outside_client()
            .connect_timeout(connect_timeout)
            .timeout(request_timeout)
            // The job API never redirects; a redirect is a misconfigured URL and
            // is reported as such instead of being followed.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("the AI HTTP client configuration is static and valid");
        Self {
            http,
            base_url: base_url.trim_end_matches('/').to_owned(),
        }
    }

    /// The provider base URL this client talks to.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// POST {base}/v1/jobs with header Idempotency-Key, body {"kind","prompt","params"};
    /// an order's photo goes as `params.input_url` ([`submit_params`]).
    pub async fn submit(&self, order: &JobOrder) -> Result<JobView, AiFailure> {
        let params = submit_params(order)?;
        let body = SubmitBody {
            kind: &order.kind,
            prompt: &order.prompt,
            params: &params,
        };
        let request = self
            .http
            .post(format!("{}/v1/jobs", self.base_url))
            .header("Idempotency-Key", order.idempotency_key.to_string())
            .json(&body);
        let answer = send(request).await;
        classify_answer(&answer).map_err(|failure| create_failure(server_had_it(&answer), failure))
    }

    /// POST {base}/v1/jobs/{job_id}/cancel (optional in the job API): 404
    /// or 405 means the provider has no cancel.
    pub async fn cancel(&self, job_id: &str) -> Result<CancelOutcome, AiFailure> {
        let request = self.http.post(format!(
            "{}/v1/jobs/{}/cancel",
            self.base_url,
            path_segment(job_id)
        ));
        CancelOutcome::of(exchange(request).await)
    }

    /// GET {base}/v1/jobs/{job_id}
    pub async fn poll(&self, job_id: &str) -> Result<JobView, AiFailure> {
        let request = self.http.get(format!(
            "{}/v1/jobs/{}",
            self.base_url,
            path_segment(job_id)
        ));
        exchange(request).await
    }
}

/// The `params` a submit sends: the order's, with `input_url` when the
/// order carries a photo. The job API fetches the photo itself, so a photo
/// without a URL it can reach (no `STAGEHAND_PUBLIC_URL`) cannot be sent:
/// the submit is refused before anything is sent (`RequestRejected`: an
/// attempt, and no job was made). Params that are not a JSON object
/// cannot carry the field and are refused the same way.
pub(crate) fn submit_params(
    order: &JobOrder,
) -> Result<std::borrow::Cow<'_, serde_json::Value>, AiFailure> {
    use std::borrow::Cow;
    let Some(photo) = &order.input else {
        return Ok(Cow::Borrowed(&order.params));
    };
    let Some(url) = &photo.url else {
        return Err(AiFailure::RequestRejected(
            "the job API needs STAGEHAND_PUBLIC_URL to fetch the photo: this server has no URL the provider can reach".to_owned(),
        ));
    };
    let mut params = match &order.params {
        serde_json::Value::Null => serde_json::Map::new(),
        serde_json::Value::Object(fields) => fields.clone(),
        _ => {
            return Err(AiFailure::RequestRejected(
                "the order's params are not a JSON object, so they cannot carry input_url"
                    .to_owned(),
            ))
        }
    };
    params.insert(
        "input_url".to_owned(),
        serde_json::Value::String(url.clone()),
    );
    Ok(Cow::Owned(serde_json::Value::Object(params)))
}

/// reqwest is built with `rustls-no-provider`: building a client without a
/// process-wide crypto provider would panic. Installs ring unless some provider
/// is already installed (by `main` or an earlier client); losing a race against
/// another installer is fine.
pub fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The start of every HTTP client this server makes to the outside (the
/// AI providers, the keeping of result files, the simulator's photo
/// fetch): TLS set up ([`ensure_crypto_provider`]), and no proxy from the
/// environment (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`). A proxy would
/// resolve the target's name itself, past the keep stage's public-only
/// resolver, and reach whatever it can reach: every target is reached
/// directly, and judged where it is reached.
pub fn outside_client() -> reqwest::ClientBuilder {
    ensure_crypto_provider();
    reqwest::Client::builder().no_proxy()
}

/// Percent-encodes everything but RFC 3986 unreserved characters, so a job id
/// from the provider stays one path segment.
pub(crate) fn path_segment(raw: &str) -> String {
    let mut encoded = String::with_capacity(raw.len());
    for byte in raw.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// A create's failure, after its answer: a 500, 502 or 503 came from a
/// server that had the request and may have made the job before it
/// failed, so its outcome is unclear (the slot stays; the same key finds
/// the job), never a refusal. A 501, a 505 and a 429 stay refusals.
pub(crate) fn create_failure(server_had_it: bool, failure: AiFailure) -> AiFailure {
    match failure {
        AiFailure::Unavailable(detail) if server_had_it => {
            AiFailure::Unclear(format!("{detail} to a create: it may have made the job"))
        }
        failure => failure,
    }
}

/// Whether a create's answer came from a server that had the request
/// and failed with it (500, 502, 503): see [`create_failure`].
pub(crate) fn server_had_it(answer: &Result<RawAnswer, reqwest::Error>) -> bool {
    matches!(answer, Ok(a) if matches!(a.status.as_u16(), 500 | 502 | 503))
}

/// Sends one request and reads the whole answer; all interpretation is left to
/// [`classify`].
async fn exchange(request: RequestBuilder) -> Result<JobView, AiFailure> {
    classify_answer(&send(request).await)
}

fn classify_answer(answer: &Result<RawAnswer, reqwest::Error>) -> Result<JobView, AiFailure> {
    match answer {
        Ok(answer) => classify(Exchange::Answer {
            status: answer.status,
            body: &answer.body,
            retry_after_s: answer.retry_after_s,
        }),
        Err(error) => classify(Exchange::Transport(error)),
    }
}

/// A whole answer of the provider, read but not interpreted.
pub(crate) struct RawAnswer {
    pub(crate) status: StatusCode,
    pub(crate) body: String,
    /// The seconds of a `Retry-After` header, when it is a number.
    pub(crate) retry_after_s: Option<u64>,
}

/// Sends one request and reads the whole answer (status, `Retry-After`,
/// body); a transport error is left to the caller's classification.
pub(crate) async fn send(request: RequestBuilder) -> Result<RawAnswer, reqwest::Error> {
    let response = request.send().await?;
    let status = response.status();
    let retry_after_s = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let body = response.bytes().await?;
    Ok(RawAnswer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        retry_after_s,
    })
}

/// What one HTTP exchange with the provider produced, before interpretation.
enum Exchange<'a> {
    /// No complete answer: bad URL, connect error, timeout, broken connection.
    Transport(&'a reqwest::Error),
    /// The provider answered with this status and body (and, for a 429,
    /// the seconds of its `Retry-After`).
    Answer {
        status: StatusCode,
        body: &'a str,
        retry_after_s: Option<u64>,
    },
}

/// The one place where outside errors become [`AiFailure`] (DESIGN.md rule 6):
/// - connect error, 5xx, 429 -> `Unavailable` (the request was refused or
///   never arrived: no job);
/// - no answer in time, a connection broken after the request was sent, an
///   answer cut short, a 2xx whose body cannot be read, a gateway's 504 ->
///   `Unclear` (the provider may have made the job; the same key finds it);
/// - 422 `content_rejected` -> `ContentRejected`;
/// - any other 4xx, a bad URL or an unexpected status -> `RequestRejected`.
fn classify(exchange: Exchange<'_>) -> Result<JobView, AiFailure> {
    match exchange {
        Exchange::Transport(error) => Err(transport_failure(error)),
        Exchange::Answer {
            status,
            body,
            retry_after_s,
        } => {
            if status.is_success() {
                // The provider accepted something and may have made the job.
                return serde_json::from_str::<JobView>(body)
                    .map(|mut view| {
                        if let Some(result) = view.result.as_mut() {
                            leave_out_unshown_urls(result, &view.job_id);
                        }
                        if view.poll_after_ms.is_none() {
                            view.poll_after_ms = retry_after_s
                                .map(|s| s.saturating_mul(1_000).min(i64::MAX as u64) as i64);
                        }
                        view
                    })
                    .map_err(|error| {
                        AiFailure::Unclear(format!(
                            "malformed provider answer (HTTP {}): {error}",
                            status.as_u16()
                        ))
                    });
            }
            let answer = ErrorAnswer::parse(body);
            let described = answer.describe(status);
            Err(
                if let (StatusCode::TOO_MANY_REQUESTS, Some(seconds)) = (status, retry_after_s) {
                    AiFailure::Throttled {
                        retry_after_ms: seconds.saturating_mul(1_000).min(i64::MAX as u64) as i64,
                        detail: described,
                    }
                } else if status == StatusCode::GATEWAY_TIMEOUT {
                    // A gateway gave up waiting: the provider behind it may
                    // have made the job.
                    AiFailure::Unclear(described)
                } else if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
                    AiFailure::Unavailable(described)
                } else if status == StatusCode::UNPROCESSABLE_ENTITY
                    && answer.error.as_deref() == Some("content_rejected")
                {
                    AiFailure::ContentRejected(
                        answer
                            .message
                            .unwrap_or_else(|| "input blocked by moderation".to_owned()),
                    )
                } else if status.is_client_error() {
                    AiFailure::RequestRejected(described)
                } else {
                    AiFailure::RequestRejected(format!("unexpected answer, {described}"))
                },
            )
        }
    }
}

/// Leaves out the URLs of a provider's `result` that the pages may not
/// show ([`AiResult::leave_out_unshown_urls`]: not `http(s)://`, not this
/// server's own path, not a media item's `data:` URL), and any item left
/// with nothing, saying so in the log; the rest of the result stands.
/// Every adapter calls it where it turns the provider's answer into a
/// result, so such a URL is never stored, sent to a display or shown on
/// /ops.
pub(crate) fn leave_out_unshown_urls(result: &mut AiResult, job_id: &str) {
    let left_out = result.leave_out_unshown_urls();
    if !left_out.is_empty() {
        let urls: Vec<String> = left_out
            .iter()
            .map(|url| url.chars().take(80).collect())
            .collect();
        tracing::warn!(
            job_id, ?urls,
            "the AI provider's result has URLs the pages may not show (only http(s), this server's paths and media data: URLs): left out"
        );
    }
}

/// A transport error (no complete answer) as a failure: a connect error
/// (a connect timeout too) means the request never left: no job. Anything
/// after the connection was made is unclear.
pub(crate) fn transport_failure(error: &reqwest::Error) -> AiFailure {
    let cause = root_cause(error);
    if error.is_builder() {
        AiFailure::RequestRejected(format!("invalid request: {cause}"))
    } else if error.is_connect() {
        AiFailure::Unavailable(format!("cannot connect: {cause}"))
    } else if error.is_timeout() {
        AiFailure::Unclear("no answer in time".to_owned())
    } else if error.is_body() || error.is_decode() {
        AiFailure::Unclear(format!("answer cut short: {cause}"))
    } else {
        AiFailure::Unclear(format!("connection broken: {cause}"))
    }
}

/// The innermost error of a chain, which says what actually happened
/// ("Connection refused") where the outer ones only say where.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    while let Some(source) = current.source() {
        current = source;
    }
    current.to_string()
}

/// What a non-2xx answer says about itself, when it says anything.
#[derive(Debug, Default)]
struct ErrorAnswer {
    error: Option<String>,
    message: Option<String>,
    /// Start of a body that is not the usual JSON error object.
    raw: Option<String>,
}

impl ErrorAnswer {
    const RAW_CHARS: usize = 80;

    fn parse(body: &str) -> Self {
        #[derive(Deserialize)]
        struct Fields {
            error: Option<serde_json::Value>,
            message: Option<serde_json::Value>,
        }
        let as_text = |value: serde_json::Value| match value {
            serde_json::Value::String(text) => text,
            other => other.to_string(),
        };
        match serde_json::from_str::<Fields>(body) {
            Ok(fields) => Self {
                error: fields.error.map(as_text),
                message: fields.message.map(as_text),
                raw: None,
            },
            Err(_) => {
                let trimmed = body.trim();
                Self {
                    raw: (!trimmed.is_empty())
                        .then(|| trimmed.chars().take(Self::RAW_CHARS).collect()),
                    ..Self::default()
                }
            }
        }
    }

    /// "HTTP 404: not_found", "HTTP 503", ...
    fn describe(&self, status: StatusCode) -> String {
        let reason = self
            .message
            .as_deref()
            .or(self.error.as_deref())
            .or(self.raw.as_deref());
        match reason {
            Some(reason) => format!("HTTP {}: {reason}", status.as_u16()),
            None => format!("HTTP {}", status.as_u16()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str) -> Result<JobView, AiFailure> {
        let status = StatusCode::from_u16(status).expect("valid status in test");
        classify(Exchange::Answer {
            status,
            body,
            retry_after_s: None,
        })
    }

    #[test]
    fn a_poll_hint_comes_from_the_body_or_a_retry_after() {
        let running = r#"{"job_id": "j", "status": "running"}"#;
        let header = classify(Exchange::Answer {
            status: StatusCode::OK,
            body: running,
            retry_after_s: Some(3),
        })
        .unwrap();
        assert_eq!(header.poll_after_ms, Some(3_000));
        let body = answer(
            200,
            r#"{"job_id": "j", "status": "running", "poll_after_ms": 1500}"#,
        )
        .unwrap();
        assert_eq!(body.poll_after_ms, Some(1_500));
        assert_eq!(answer(200, running).unwrap().poll_after_ms, None);
    }

    #[test]
    fn a_429_with_retry_after_is_throttled_without_it_unavailable() {
        let throttled = classify(Exchange::Answer {
            status: StatusCode::TOO_MANY_REQUESTS,
            body: "{}",
            retry_after_s: Some(7),
        })
        .unwrap_err();
        assert_eq!(throttled.retry_after_ms(), Some(7_000));
        assert!(throttled.is_unavailable(), "not an attempt");
        let plain = answer(429, "{}").unwrap_err();
        assert!(matches!(plain, AiFailure::Unavailable(_)), "{plain:?}");
    }

    fn transport_failure(result: Result<JobView, AiFailure>) -> AiFailure {
        result.expect_err("the exchange must fail")
    }

    fn client(base_url: &str) -> AiClient {
        AiClient::new(
            base_url,
            Duration::from_millis(500),
            Duration::from_millis(300),
        )
    }

    #[test]
    fn accepted_job_parses() {
        let view = answer(202, r#"{"job_id":"job-1","status":"running"}"#).expect("parses");
        assert_eq!(view.job_id, "job-1");
        assert_eq!(view.status, JobStatus::Running);
        assert!(view.result.is_none());
        assert!(view.error.is_none());
    }

    #[test]
    fn succeeded_job_with_result_parses() {
        let body = r#"{"job_id":"job-2","status":"succeeded","result":{"content":[{"type":"image","url":"https://x/y.png","text":"t"}],"score":42}}"#;
        let view = answer(200, body).expect("parses");
        assert_eq!(view.status, JobStatus::Succeeded);
        let result = view.result.expect("has a result");
        assert_eq!(result.content.len(), 1);
        assert_eq!(result.content[0].kind, "image");
        assert_eq!(result.score, Some(42.0));
    }

    /// Only http(s), the server's own paths and media data: URLs of the
    /// media's type are shown: any other URL of a result is left out (an
    /// item left with nothing to show is dropped).
    #[test]
    fn result_urls_of_other_schemes_are_left_out() {
        let body = r#"{"job_id":"j","status":"succeeded","result":{"content":[
            {"type":"link","url":"javascript:alert(document.cookie)","text":"click"},
            {"type":"link","url":" JavaScript:alert(1)"},
            {"type":"link","url":"java\tscript:alert(1)"},
            {"type":"image","url":"data:text/html,<script>alert(1)</script>"},
            {"type":"link","url":"data:image/png;base64,QUJD"},
            {"type":"image","url":"//evil.example/x.png"},
            {"type":"image","url":"/\\evil.example/x.png"},
            {"type":"image","url":"vbscript:msgbox(1)"},
            {"type":"image","url":"HTTPS://cdn.example/a.png"},
            {"type":"image","url":"http://127.0.0.1:9/b.png"},
            {"type":"video","url":"/media/c.mp4"},
            {"type":"image","url":"data:image/png;base64,QUJD"},
            {"type":"text","text":"words"}
        ]}}"#;
        let content = answer(200, body)
            .expect("parses")
            .result
            .expect("a result")
            .content;
        let urls: Vec<Option<&str>> = content.iter().map(|c| c.url.as_deref()).collect();
        assert_eq!(
            urls,
            [
                None,
                Some("HTTPS://cdn.example/a.png"),
                Some("http://127.0.0.1:9/b.png"),
                Some("/media/c.mp4"),
                Some("data:image/png;base64,QUJD"),
                None,
            ],
            "{content:?}"
        );
        assert_eq!(content[0].text.as_deref(), Some("click"), "the words stay");
        assert_eq!(content[5].text.as_deref(), Some("words"));
    }

    #[test]
    fn failed_and_rejected_jobs_are_not_errors() {
        let failed = answer(
            200,
            r#"{"job_id":"j","status":"failed","error":"generation failed"}"#,
        )
        .expect("a failed job is a valid answer");
        assert_eq!(failed.status, JobStatus::Failed);
        assert_eq!(failed.error.as_deref(), Some("generation failed"));
        let rejected = answer(201, r#"{"job_id":"j","status":"rejected"}"#)
            .expect("a rejected job is a valid answer");
        assert_eq!(rejected.status, JobStatus::Rejected);
    }

    #[test]
    fn malformed_success_answer_is_unclear() {
        for body in [
            "",
            "not json",
            r#"{"status":"running"}"#,
            r#"{"job_id":"j","status":"exploded"}"#,
        ] {
            match answer(200, body) {
                Err(AiFailure::Unclear(message)) => {
                    assert!(message.contains("malformed"), "{message}")
                }
                other => panic!("body {body:?}: unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn server_errors_and_rate_limits_are_unavailable() {
        for status in [500, 502, 503, 429] {
            match answer(status, r#"{"error":"unavailable"}"#) {
                Err(AiFailure::Unavailable(message)) => {
                    assert_eq!(message, format!("HTTP {status}: unavailable"))
                }
                other => panic!("HTTP {status}: unexpected {other:?}"),
            }
        }
        assert_eq!(
            answer(503, "").expect_err("fails"),
            AiFailure::Unavailable("HTTP 503".to_owned())
        );
    }

    #[test]
    fn a_gateway_timeout_is_unclear() {
        assert_eq!(
            answer(504, "").expect_err("fails"),
            AiFailure::Unclear("HTTP 504".to_owned())
        );
    }

    #[test]
    fn moderation_refusal_is_content_rejected() {
        assert_eq!(
            answer(
                422,
                r#"{"error":"content_rejected","message":"input blocked by moderation"}"#
            )
            .expect_err("fails"),
            AiFailure::ContentRejected("input blocked by moderation".to_owned())
        );
        assert_eq!(
            answer(422, r#"{"error":"content_rejected"}"#).expect_err("fails"),
            AiFailure::ContentRejected("input blocked by moderation".to_owned())
        );
    }

    #[test]
    fn other_client_errors_are_rejected_requests() {
        assert_eq!(
            answer(422, r#"{"error":"bad_params"}"#).expect_err("fails"),
            AiFailure::RequestRejected("HTTP 422: bad_params".to_owned())
        );
        assert_eq!(
            answer(422, "<html>nope</html>").expect_err("fails"),
            AiFailure::RequestRejected("HTTP 422: <html>nope</html>".to_owned())
        );
        assert_eq!(
            answer(404, r#"{"error":"not_found"}"#).expect_err("fails"),
            AiFailure::RequestRejected("HTTP 404: not_found".to_owned())
        );
        assert_eq!(
            answer(400, "").expect_err("fails"),
            AiFailure::RequestRejected("HTTP 400".to_owned())
        );
        assert!(matches!(
            answer(401, r#"{"error":"unauthorized"}"#),
            Err(AiFailure::RequestRejected(_))
        ));
    }

    #[test]
    fn unexpected_statuses_are_rejected_requests() {
        match answer(302, "") {
            Err(AiFailure::RequestRejected(message)) => {
                assert_eq!(message, "unexpected answer, HTTP 302")
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn long_error_bodies_are_cut() {
        let body = "x".repeat(1000);
        match answer(400, &body) {
            Err(AiFailure::RequestRejected(message)) => assert!(message.len() < 100),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn job_ids_stay_one_path_segment() {
        assert_eq!(path_segment("job-abc_1.2~"), "job-abc_1.2~");
        assert_eq!(path_segment("a/b c?"), "a%2Fb%20c%3F");
    }

    #[test]
    fn final_statuses() {
        assert!(!JobStatus::Queued.is_final());
        assert!(!JobStatus::Running.is_final());
        assert!(JobStatus::Succeeded.is_final());
        assert!(JobStatus::Failed.is_final());
        assert!(JobStatus::Rejected.is_final());
    }

    #[tokio::test]
    async fn connect_error_is_unavailable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let failure = transport_failure(client(&format!("http://{addr}")).poll("job-1").await);
        assert!(
            matches!(&failure, AiFailure::Unavailable(message) if message.starts_with("cannot connect")),
            "{failure:?}"
        );
    }

    #[tokio::test]
    async fn request_timeout_is_unclear() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        // Accepts and holds the connection without ever answering.
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let failure = transport_failure(client(&format!("http://{addr}")).poll("job-1").await);
        assert_eq!(failure, AiFailure::Unclear("no answer in time".to_owned()));
        silent.abort();
    }

    #[tokio::test]
    async fn broken_connection_is_unclear() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        // Reads the request, then hangs up without an answer.
        let rude = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut buffer = [0u8; 1024];
                let _ = stream.read(&mut buffer).await;
                drop(stream);
            }
        });
        let failure = transport_failure(client(&format!("http://{addr}")).poll("job-1").await);
        assert!(
            matches!(&failure, AiFailure::Unclear(message) if message.starts_with("connection broken")),
            "{failure:?}"
        );
        rude.abort();
    }

    #[tokio::test]
    async fn an_answer_cut_short_is_unclear() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        // Accepts the job (202), then hangs up in the middle of the body.
        let cut = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut buffer = [0u8; 4096];
                let _ = stream.read(&mut buffer).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"job_id\":")
                    .await;
                drop(stream);
            }
        });
        let order = JobOrder {
            kind: "image".into(),
            prompt: "p".into(),
            params: serde_json::json!({}),
            idempotency_key: uuid::Uuid::new_v4(),
            ..JobOrder::default()
        };
        let failure = transport_failure(client(&format!("http://{addr}")).submit(&order).await);
        assert!(matches!(&failure, AiFailure::Unclear(_)), "{failure:?}");
        cut.abort();
    }

    /// Accepts one request, answers it 202 with a running job, and gives
    /// back its JSON body.
    async fn answer_one(listener: tokio::net::TcpListener) -> serde_json::Value {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut stream, _) = listener.accept().await.expect("a request");
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        let body_start = loop {
            let n = stream.read(&mut buffer).await.expect("read the request");
            assert!(n > 0, "the request ended early");
            request.extend_from_slice(&buffer[..n]);
            let text = String::from_utf8_lossy(&request).into_owned();
            let Some(head_end) = text.find("\r\n\r\n") else {
                continue;
            };
            let length = text[..head_end]
                .lines()
                .find_map(|line| {
                    let line = line.to_ascii_lowercase();
                    line.strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().expect("a length"))
                })
                .unwrap_or(0);
            if request.len() >= head_end + 4 + length {
                break head_end + 4;
            }
        };
        let answer = r#"{"job_id":"j1","status":"running"}"#;
        let head = format!(
            "HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        );
        stream
            .write_all(format!("{head}{answer}").as_bytes())
            .await
            .expect("answer");
        serde_json::from_slice(&request[body_start..]).expect("a JSON body")
    }

    fn photo_order(url: Option<&str>) -> JobOrder {
        let mut order =
            JobOrder::for_call("image", "me as a comic", "s1", None, uuid::Uuid::new_v4());
        order.input = Some(InputPhoto {
            url: url.map(str::to_owned),
            bytes: bytes::Bytes::from_static(b"\xff\xd8\xff\xe0 not much of a jpeg"),
            content_type: "image/jpeg".into(),
        });
        order
    }

    #[tokio::test]
    async fn a_photo_goes_as_input_url_in_params() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(answer_one(listener));
        let url = "https://booth.example/media/p1.jpg?exp=9&sig=abc";
        let view = client(&format!("http://{addr}"))
            .submit(&photo_order(Some(url)))
            .await
            .expect("accepted");
        assert_eq!(view.job_id, "j1");
        let body = server.await.expect("the server's task");
        assert_eq!(
            body["params"],
            serde_json::json!({"session_id": "s1", "input_url": url}),
            "{body}"
        );
        assert_eq!(body["prompt"], "me as a comic");
    }

    #[tokio::test]
    async fn a_photo_without_a_url_is_refused_before_sending() {
        // Nothing listens there: a request sent would be `Unavailable`.
        let failure = client("http://127.0.0.1:9")
            .submit(&photo_order(None))
            .await
            .expect_err("refused");
        assert!(
            matches!(&failure, AiFailure::RequestRejected(d) if d.contains("STAGEHAND_PUBLIC_URL")),
            "{failure:?}"
        );
        assert!(
            !failure.is_unavailable(),
            "an attempt: asking again cannot help"
        );
    }

    #[test]
    fn params_without_a_photo_are_sent_as_they_are() {
        let order = JobOrder::for_call("image", "p", "s1", Some(2), uuid::Uuid::new_v4());
        assert_eq!(*submit_params(&order).unwrap(), order.params);
        let mut odd = photo_order(Some("https://x/p.jpg"));
        odd.params = serde_json::json!(["not", "an", "object"]);
        assert!(matches!(
            submit_params(&odd),
            Err(AiFailure::RequestRejected(_))
        ));
        odd.params = serde_json::Value::Null;
        assert_eq!(
            *submit_params(&odd).unwrap(),
            serde_json::json!({"input_url": "https://x/p.jpg"})
        );
    }

    #[test]
    fn a_photo_is_described_by_its_media_type() {
        let mut photo = InputPhoto {
            url: None,
            bytes: bytes::Bytes::from_static(b"ABC"),
            content_type: String::new(),
        };
        assert_eq!(photo.data_url(), "data:image/jpeg;base64,QUJD");
        assert_eq!(photo.file_name(), "photo.jpg");
        photo.content_type = "image/png".into();
        assert_eq!(photo.file_name(), "photo.png");
        assert_eq!(photo.data_url(), "data:image/png;base64,QUJD");
    }

    #[tokio::test]
    async fn invalid_base_url_is_a_rejected_request() {
        let failure = transport_failure(client("not a url").poll("job-1").await);
        assert!(
            matches!(&failure, AiFailure::RequestRejected(message) if message.starts_with("invalid request")),
            "{failure:?}"
        );
    }
}
