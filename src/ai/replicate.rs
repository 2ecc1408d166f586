//! The third AI provider: [Replicate](https://replicate.com)'s HTTP API,
//! called with a bearer token. A saga's AI job is one Replicate
//! *prediction*; the job id is the prediction's `id`.
//!
//! # What Replicate's documentation says (and where it was read)
//!
//! - Create (async mode, the default): `POST /v1/predictions` with
//!   `{"version", "input"}` for a model version, or
//!   `POST /v1/models/{owner}/{name}/predictions` with `{"input"}` for an
//!   **official** model (Replicate documents that endpoint for official
//!   models only; any other model is run by its `version`). Optional fields
//!   (`webhook`, `webhook_events_filter`, `stream`) are not sent. The answer
//!   is the prediction, usually `starting`.
//!   (replicate.com/docs/reference/http, "Create a prediction" and "Create a
//!   prediction using an official model"; api.replicate.com/openapi.json.)
//! - Sync mode (`Prefer: wait`) is **not used**: the saga polls anyway, and
//!   a held-open create only widens the window in which a dropped
//!   connection leaves the create's outcome unclear.
//! - The prediction object carries `id`, `model`, `version`, `input`,
//!   `output`, `data_removed`, `error`, `status`, `created_at`, `urls`,
//!   `logs`, `metrics`, `source`, `started_at`, `completed_at`, `deadline`,
//!   `deployment`. It has **no `webhook` field**: nothing a create sends
//!   comes back to name it but its `input` and the time it was made.
//! - `status` is one of `starting`, `processing`, `succeeded`, `failed`,
//!   `canceled`, `aborted` ("terminated before it started running, for
//!   example when a deadline is reached").
//! - Get: `GET /v1/predictions/{id}`. Cancel:
//!   `POST /v1/predictions/{id}/cancel`, answers the prediction. List:
//!   `GET /v1/predictions`, the account's predictions (API and website),
//!   newest first, `{"next", "previous", "results"}`, `next` the URL of the
//!   next page. Model: `GET /v1/models/{owner}/{name}` (404 when there is
//!   no such model).
//! - Auth: `Authorization: Bearer <token>`.
//! - Rate limits: creates 600/min, other endpoints 3000/min, **per
//!   account**; over it, a 429 with `Retry-After` or a body like
//!   `{"detail":"Request was throttled. Your rate limit resets in ~30s."}`
//!   (replicate.com/docs/topics/predictions/rate-limits).
//! - Errors: non-2xx bodies are problem details (`title`, `detail`,
//!   `status`); a bad input is a 422; 402 is an account that cannot pay
//!   (billing not set up, out of credit).
//! - Moderation: there is no moderation status. A refused input or output
//!   ends the prediction `failed` with an `error` such as "NSFW content
//!   detected. Try running it again, or try a different prompt." or
//!   Replicate's "flagged as sensitive" (E005). [`is_moderation`] matches
//!   these texts: such a prediction is `rejected`, such a create refusal is
//!   `ContentRejected`.
//!
//! # Mapping
//!
//! - Input: the model input is exactly `{"prompt": order.prompt}`, and with
//!   a photo also the photo's field (below). The model (`model` =
//!   `owner/name`, an official model) or model version (`version`, which
//!   wins when both are set) comes from configuration; `order.kind` and
//!   `order.params` choose nothing here.
//!
//! # The photo
//!
//! A participant's photo ([`JobOrder::input`]) is a file input of the
//! model, under the field the providers file names (`photo_input`, default
//! [`DEFAULT_PHOTO_INPUT`]). Replicate's reference (the `input` of a
//! create) says files go as HTTP URLs or data URLs: a data URL for "a
//! small file <= 256kb", an HTTP URL for a larger one. So the value is
//! - the photo's own URL (this server's signed URL) when the order has one;
//! - else, up to [`DATA_URI_MAX_BYTES`], a data URI
//!   (`data:image/jpeg;base64,…`);
//! - else the `urls.get` of a file uploaded with the Files API
//!   (`POST /v1/files`, multipart: the photo as the `content` part with its
//!   file name and media type, and the `filename` and `type` fields;
//!   answered 201 with the file, `schemas_file_response`). The upload is
//!   made only when the prediction is created, never for a look; since it
//!   makes no prediction, an upload whose outcome is unclear is only
//!   unavailable.
//! - Status ([`STATUSES`], every documented one): `starting` -> `queued`,
//!   `processing` -> `running`, `succeeded` -> `succeeded`, `failed` ->
//!   `failed` (or `rejected` when the error is a moderation refusal),
//!   `canceled` -> `cancelled`, `aborted` -> `failed` (final: it never ran,
//!   the attempt counts and the next one makes a new prediction). An
//!   undocumented status is an unreadable answer: `Unclear`.
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
//! error, 5xx, 429 -> `Unavailable` (`Throttled` when the wait is known,
//! which pauses the whole provider); 402 -> `OutOfQuota`; no answer in
//! time, a connection broken after sending, an unreadable 2xx, a 504 ->
//! `Unclear`; a 4xx whose text is a moderation refusal ->
//! `ContentRejected`; any other 4xx -> `RequestRejected`.
//!
//! # Idempotency: one billed prediction per call
//!
//! Replicate takes no idempotency key and its predictions carry nothing
//! the create sent but the input. So a create whose outcome was unclear
//! (the connection dropped after sending, no answer in time, an
//! unreadable answer), or a call resumed by another worker whose slot
//! holds a key but no job id, is never simply sent again. The saga marks
//! such an order [`MaybeMade`]: since when the job may exist, and which
//! prediction ids the slot ledger already holds for other calls. Before
//! creating, the adapter reads the list, newest first, and takes the
//! predictions that
//! - have an `input` equal to this order's (the photo compared as below),
//! - run this provider's model or version, and came from the API (not the
//!   website),
//! - were created no earlier than the key was first sent
//!   (less [`CLOCK_SLACK_MS`] for the two clocks), and
//! - are not held by another call in the ledger.
//!
//! The photo is part of the input, and a look must not take another
//! guest's prediction for ours: an experience's prompt is often the same
//! for everyone, so ignoring the photo's field would let two guests'
//! unclear creates adopt each other's picture. A data URI is compared as
//! sent (the same bytes make the same URI), and so is the photo's own URL.
//! A Files-API upload is not: each upload makes a new file and a new URL,
//! and the look happens precisely because the first create's answer (and
//! with it nothing of the upload) may have been lost, possibly in a worker
//! that died. Uploading once per order key would need that URL kept in the
//! ledger. Instead the file is known by its bytes: a listed input whose
//! photo is a Files-API URL (`…/v1/files/{id}`) fits when
//! `GET /v1/files/{id}`, asked of the configured base URL only, answers the
//! SHA-256 of this photo (`checksums.sha256`, which the file object
//! carries); a file that is gone (404) does not fit. Only predictions that
//! fit in every other way are read back, so a look costs one more request
//! per candidate at most.
//!
//! One found: it is this call's job (`adopted`). Several: the oldest is
//! adopted and the rest are left alone, at WARN (`ambiguous`). None, and
//! the last send is less than [`LIST_SETTLE_MS`] ago: not finding it
//! proves nothing yet, so the adapter waits until then and looks once
//! more. None then: the earlier create made nothing the list shows, and
//! the prediction is created again, at WARN (`created_again`). Each
//! outcome is counted in `stagehand_ai_unclear_creates_total{provider,
//! outcome}`. The slot adopter looks the same way but never creates: no
//! prediction found is its evidence that none runs.
//!
//! The window that remains, where a second billed prediction can be made:
//! - a prediction Replicate made but does not list [`LIST_SETTLE_MS`]
//!   after the send that made it (the documentation promises no delay
//!   either way);
//! - more than [`LOOKUP_PAGES`] pages (100 predictions each) of the
//!   account's newer predictions, website ones included, made between the
//!   first send and the look;
//! - another call of this deployment with an equal input whose create was
//!   unclear at the same time, or whose create succeeded moments before
//!   and whose job id the ledger does not hold yet: both calls may take
//!   the same prediction (one result shown to both; the other
//!   prediction, if made, is billed and unseen);
//! - a photo whose value is not listed as it was sent: the order's URL
//!   signed anew between the sends (compared as sent, it is another
//!   value), a Files-API file that expired or was deleted before the look,
//!   or an input Replicate lists with another URL than the one it got.
//!
//! A prediction of someone else on the account with an equal input, made
//! in the same seconds, can be taken for ours: the guest then gets that
//! result. The participant always gets exactly one result: only the
//! recorded job is shown and ranked.
//!
//! # At start
//!
//! With `model` set (and no `version`), the server reads
//! `GET /v1/models/{owner}/{name}` before it serves: a 404, or a model
//! whose `is_official` is false, stops the start with what to change
//! ([`ReplicateClient::check_model`]).
//!
//! # The token
//!
//! It lives in an [`ApiKey`] (`Debug` prints `***`, no `Display`), is sent
//! with reqwest's `bearer_auth` (a sensitive header), is never logged, and
//! any provider text that quotes it back is scrubbed before it becomes a
//! failure detail or a job error. The list's `next` link is never followed
//! as given: only its query is reused on the configured base URL, and a
//! listed Files-API URL is read by its file id on that base URL too, so the
//! token cannot be sent to another host.

use std::time::Duration;

use reqwest::multipart::{Form, Part};
use reqwest::{RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::client::{
    create_failure, outside_client, path_segment, send, server_had_it, transport_failure,
    CancelOutcome, InputPhoto, JobOrder, JobStatus, JobView, Lookup, MaybeMade, PhotoPrint,
    RawAnswer,
};
use super::openai::ApiKey;
use super::ModelNotice;
use crate::domain::failure::{AiFailure, AiResult, ContentItem};
use crate::domain::media::photo_sha256;

/// Replicate's API.
pub const DEFAULT_BASE_URL: &str = "https://api.replicate.com";
/// Pages of `GET /v1/predictions` (100 each) read to find an unclear
/// create's prediction.
pub const LOOKUP_PAGES: usize = 3;
/// A prediction created up to this long before the key was first sent (by
/// our clock) may still be its: Replicate's clock is not ours.
pub const CLOCK_SLACK_MS: i64 = 2_000;
/// How long after a send the list may still not show the prediction that
/// send made: until then, not finding it proves nothing.
pub const LIST_SETTLE_MS: i64 = 5_000;
/// The `Cancel-After` of every create unless configured (the saga's
/// default deadline).
pub const DEFAULT_CANCEL_AFTER: Duration = Duration::from_secs(15 * 60);
/// How long past a prediction's deadline Replicate may still take to end
/// it, and the two clocks' difference: after `Cancel-After` and this, no
/// prediction made by a send still runs.
pub const DEADLINE_SLACK_MS: i64 = 60_000;
/// The input field a photo goes in when the providers file names none
/// (`photo_input`).
pub const DEFAULT_PHOTO_INPUT: &str = "image";
/// The largest photo sent as a data URI; a larger one goes through the
/// Files API. Replicate's reference says to use a data URL for "a small
/// file <= 256kb" and an HTTP URL above; read as 256,000 bytes, the smaller
/// reading of "kb".
pub const DATA_URI_MAX_BYTES: usize = 256_000;
/// Every prediction status Replicate documents, and what it is here.
pub const STATUSES: [(&str, JobStatus); 6] = [
    ("starting", JobStatus::Queued),
    ("processing", JobStatus::Running),
    ("succeeded", JobStatus::Succeeded),
    ("failed", JobStatus::Failed),
    ("canceled", JobStatus::Cancelled),
    ("aborted", JobStatus::Failed),
];

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
    /// The model input field the participant's photo goes in (the
    /// providers file's `photo_input`).
    pub photo_input: String,
    /// Sent with every create as its `Cancel-After` deadline: Replicate
    /// ends every prediction this long after it was made (module doc,
    /// "A deadline on every prediction"). The saga's deadline: a
    /// prediction that outlives its saga serves nobody.
    pub cancel_after: Duration,
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
            photo_input: DEFAULT_PHOTO_INPUT.to_owned(),
            cancel_after: DEFAULT_CANCEL_AFTER,
        }
    }
}

/// Cheap clonable client of Replicate. `Debug` shows the key as
/// `ApiKey(***)`.
#[derive(Debug, Clone)]
pub struct ReplicateClient {
    http: reqwest::Client,
    base_url: String,
    api_key: Option<ApiKey>,
    model: Option<String>,
    version: Option<String>,
    photo_input: String,
    cancel_after: Duration,
}

/// A prediction as Replicate answers it (create, get, cancel, list items):
/// the fields the adapter reads; the others are ignored.
#[derive(Debug, Clone, Deserialize)]
struct Prediction {
    id: String,
    status: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    created_at: Option<String>,
    /// `api` or `web`: a prediction made on the website is never ours.
    #[serde(default)]
    source: Option<String>,
}

/// The fields of `GET /v1/models/{owner}/{name}` the start-up check reads.
#[derive(Debug, Deserialize)]
struct Model {
    #[serde(default)]
    is_official: Option<bool>,
}

/// One page of `GET /v1/predictions`.
#[derive(Debug, Deserialize)]
struct PredictionPage {
    #[serde(default)]
    next: Option<String>,
    results: Vec<Prediction>,
}

/// A file of Replicate's Files API (`schemas_file_response`): the fields
/// the adapter reads.
#[derive(Debug, Deserialize)]
struct FileObject {
    urls: FileUrls,
    #[serde(default)]
    checksums: Option<Checksums>,
}

#[derive(Debug, Deserialize)]
struct FileUrls {
    get: String,
}

#[derive(Debug, Deserialize)]
struct Checksums {
    #[serde(default)]
    sha256: Option<String>,
}

/// Where a create goes: the endpoint, and the version its body names.
struct CreateTarget {
    url: String,
    version: Option<String>,
}

impl CreateTarget {
    /// The create's URL and body for `input`.
    fn request(self, input: Value) -> (String, Value) {
        let body = match self.version {
            Some(version) => json!({ "version": version, "input": input }),
            None => json!({ "input": input }),
        };
        (self.url, body)
    }
}

/// How an order's photo goes into the input (module doc, "The photo").
enum PhotoValue<'a> {
    /// As it is: the photo's own URL, or a data URI of its bytes.
    Inline(String),
    /// Uploaded with the Files API when the prediction is created.
    Upload(&'a InputPhoto),
}

impl PhotoValue<'_> {
    fn of(photo: &InputPhoto) -> PhotoValue<'_> {
        if let Some(url) = &photo.url {
            PhotoValue::Inline(url.clone())
        } else if photo.bytes.len() <= DATA_URI_MAX_BYTES {
            PhotoValue::Inline(photo.data_url())
        } else {
            PhotoValue::Upload(photo)
        }
    }
}

/// The input an earlier create of an order sent, as a listed prediction's
/// `input` must be to be its (module doc, "Idempotency").
struct Wanted {
    /// The input but the photo's field.
    text: Map<String, Value>,
    /// The photo's field, and the photo its listed value must be.
    photo: Option<(String, PhotoPrint)>,
}

/// Whether a listed input is an order's.
#[derive(Debug, PartialEq)]
enum Fit {
    No,
    Yes,
    /// If the file of this Files-API URL has this SHA-256.
    IfChecksum {
        file_id: String,
        sha256: String,
    },
}

impl Wanted {
    /// A listed input fits when it has exactly the wanted fields, equal
    /// but for a Files-API photo, whose file is compared by checksum.
    fn fit(&self, listed: Option<&Value>) -> Fit {
        let Some(Value::Object(listed)) = listed else {
            return Fit::No;
        };
        let fields = self.text.len() + usize::from(self.photo.is_some());
        let text_same = self.text.iter().all(|(k, v)| listed.get(k) == Some(v));
        if listed.len() != fields || !text_same {
            return Fit::No;
        }
        let Some((field, known_by)) = &self.photo else {
            return Fit::Yes;
        };
        let Some(value) = listed.get(field).and_then(Value::as_str) else {
            return Fit::No;
        };
        if let Some(bytes) = data_uri_bytes(value) {
            return match &known_by.sha256 {
                Some(sha256) if photo_sha256(&bytes) == *sha256 => Fit::Yes,
                _ => Fit::No,
            };
        }
        match (file_id(value), &known_by.sha256) {
            (Some(file_id), Some(sha256)) => Fit::IfChecksum {
                file_id,
                sha256: sha256.clone(),
            },
            (Some(_), None) => Fit::No,
            (None, _) if known_by.is_served_at(value) => Fit::Yes,
            (None, _) => Fit::No,
        }
    }
}

/// `Cancel-After` as Replicate's documentation writes it (`1m`, `90s`).
fn cancel_after_header(after: Duration) -> String {
    let seconds = after.as_secs().max(1);
    if seconds.is_multiple_of(60) {
        format!("{}m", seconds / 60)
    } else {
        format!("{seconds}s")
    }
}

/// The bytes of a `data:…;base64,…` URI; None for anything else.
fn data_uri_bytes(value: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    let rest = value.strip_prefix("data:")?;
    let (_, encoded) = rest.split_once(";base64,")?;
    base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
}

/// The file id of a Files-API URL (`…/v1/files/{id}`), whatever its host:
/// it is only ever asked of the configured base URL.
fn file_id(url: &str) -> Option<String> {
    let path = url.split(['?', '#']).next()?;
    let (_, id) = path.split_once("/v1/files/")?;
    (!id.is_empty() && !id.contains('/')).then(|| id.to_owned())
}

/// What the list showed of an unclear create.
enum Found {
    /// The predictions that fit, oldest first.
    Some(Vec<Prediction>),
    None,
}

impl ReplicateClient {
    pub fn new(settings: &ReplicateSettings) -> ReplicateClient {
        let http = outside_client()
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
            photo_input: match settings.photo_input.trim() {
                "" => DEFAULT_PHOTO_INPUT.to_owned(),
                field => field.to_owned(),
            },
            cancel_after: settings.cancel_after.max(Duration::from_secs(60)),
        }
    }

    /// How long after its last send no prediction made under a key can
    /// still run: Replicate ends each at its `Cancel-After` deadline.
    pub fn jobs_end_within_ms(&self) -> i64 {
        self.cancel_after.as_millis() as i64 + DEADLINE_SLACK_MS
    }

    /// The base URL, without `/v1` and without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn has_key(&self) -> bool {
        self.api_key.is_some()
    }

    /// Creates the prediction of one attempt; when an earlier create of the
    /// same key may have made one, looks for it first (module doc,
    /// "Idempotency"). A photo that goes through the Files API is uploaded
    /// only once the prediction is to be created, never for a look.
    pub async fn submit(&self, order: &JobOrder) -> Result<JobView, AiFailure> {
        let target = self.create_target()?;
        let mut lookup = None;
        if let Some(earlier) = &order.maybe_made {
            let wanted = self.wanted(order, earlier);
            let found = self.find_made_settled(&wanted, earlier).await;
            // A look that only looks makes nothing: a refused read of the
            // list says nothing of a prediction, so it is no refusal.
            let found = match found {
                Err(refused) if earlier.look_only && !refused.is_unavailable() => {
                    Err(AiFailure::Unclear(format!(
                        "the look for the call's prediction failed: {refused}"
                    )))
                }
                found => found,
            };
            match found? {
                Found::Some(found) => return self.adopt(order, found),
                // Not finding it is no evidence (the list may not show it,
                // or show it otherwise than it was sent): the slot stays
                // until the prediction's deadline has passed.
                Found::None if earlier.look_only => {
                    return Err(AiFailure::Unclear(
                        "no prediction of this call is listed; not finding one proves nothing"
                            .to_owned(),
                    ))
                }
                Found::None => {
                    tracing::warn!(idempotency_key = %order.idempotency_key, since_ms = earlier.since_ms, "Replicate: no prediction of an unclear create is listed; creating it again");
                    lookup = Some(Lookup::CreatedAgain);
                }
            }
        }
        let photo = order.input.as_ref().map(PhotoValue::of);
        let input = self.input(order, photo).await?;
        tracing::debug!(kind = %order.kind, idempotency_key = %order.idempotency_key, photo = order.input.is_some(), "Replicate: create a prediction");
        let (url, body) = target.request(input);
        let request = self
            .authorized(self.http.post(url).json(&body))
            .header("Cancel-After", cancel_after_header(self.cancel_after));
        let answer = send(request).await;
        let had_it = server_had_it(&answer);
        let mut view = self
            .classify::<Prediction>(answer)
            .map_err(|failure| create_failure(had_it, failure))
            .and_then(|prediction| self.view(prediction))?;
        view.lookup = lookup;
        Ok(view)
    }

    /// The found predictions of an unclear create (oldest first): the
    /// oldest is this call's job.
    fn adopt(&self, order: &JobOrder, mut found: Vec<Prediction>) -> Result<JobView, AiFailure> {
        let outcome = if found.len() == 1 {
            tracing::info!(idempotency_key = %order.idempotency_key, prediction = %found[0].id, "Replicate: found the prediction of an unclear create");
            Lookup::Adopted
        } else {
            let ids: Vec<&str> = found.iter().map(|p| p.id.as_str()).collect();
            tracing::warn!(idempotency_key = %order.idempotency_key, predictions = ?ids, "Replicate: several predictions fit an unclear create; the oldest is taken, the others are left alone");
            Lookup::Ambiguous
        };
        let mut view = self.view(found.swap_remove(0))?;
        view.lookup = Some(outcome);
        Ok(view)
    }

    /// The model input of an order: `{"prompt": …}`, and the photo under
    /// the configured field (module doc, "The photo"), uploaded first when
    /// it goes through the Files API.
    async fn input(
        &self,
        order: &JobOrder,
        photo: Option<PhotoValue<'_>>,
    ) -> Result<Value, AiFailure> {
        let mut input = Map::new();
        input.insert("prompt".to_owned(), json!(order.prompt));
        if let Some(photo) = photo {
            let value = match photo {
                PhotoValue::Inline(value) => value,
                PhotoValue::Upload(photo) => self.upload(photo).await?,
            };
            input.insert(self.photo_input.clone(), Value::String(value));
        }
        Ok(Value::Object(input))
    }

    /// What an earlier create of this order sent, as the list shows it
    /// (module doc, "Idempotency").
    fn wanted(&self, order: &JobOrder, earlier: &MaybeMade) -> Wanted {
        let mut text = Map::new();
        text.insert("prompt".to_owned(), json!(order.prompt));
        let photo = earlier
            .photo
            .clone()
            .or_else(|| order.input.as_ref().map(PhotoPrint::of))
            .map(|print| (self.photo_input.clone(), print));
        Wanted { text, photo }
    }

    /// `POST /v1/files` (Replicate's Files API): the photo as the
    /// multipart `content` part, with its file name and media type (also
    /// as the `filename` and `type` fields the reference lists); the
    /// created file's `urls.get`. No prediction is made by it, so an
    /// upload whose outcome is unclear is only `Unavailable`.
    async fn upload(&self, photo: &InputPhoto) -> Result<String, AiFailure> {
        let content = Part::bytes(photo.bytes.to_vec())
            .file_name(photo.file_name())
            .mime_str(photo.media_type())
            .map_err(|_| {
                AiFailure::RequestRejected(format!(
                    "the photo's content type {:?} is not a media type",
                    photo.media_type()
                ))
            })?;
        let form = Form::new()
            .part("content", content)
            .text("filename", photo.file_name())
            .text("type", photo.media_type().to_owned());
        let url = format!("{}/v1/files", self.base_url);
        let request = self.authorized(self.http.post(url).multipart(form));
        match self.classify::<FileObject>(send(request).await) {
            Ok(file) => {
                tracing::debug!(bytes = photo.bytes.len(), file = %file.urls.get, "Replicate: photo uploaded with the Files API");
                Ok(file.urls.get)
            }
            Err(AiFailure::Unclear(detail)) => Err(AiFailure::Unavailable(format!(
                "the photo's upload to the Files API: {detail}"
            ))),
            Err(failure) => Err(failure),
        }
    }

    /// Where a create goes: a version on `/v1/predictions`, an official
    /// model on its own endpoint.
    fn create_target(&self) -> Result<CreateTarget, AiFailure> {
        match (&self.version, &self.model) {
            (Some(version), _) => Ok(CreateTarget {
                url: format!("{}/v1/predictions", self.base_url),
                version: Some(version.clone()),
            }),
            (None, Some(model)) => {
                let (owner, name) = owner_and_name(model)?;
                Ok(CreateTarget {
                    url: format!(
                        "{}/v1/models/{}/{}/predictions",
                        self.base_url,
                        path_segment(owner),
                        path_segment(name)
                    ),
                    version: None,
                })
            }
            (None, None) => Err(AiFailure::RequestRejected(
                "no Replicate model or version is configured".to_owned(),
            )),
        }
    }

    /// `GET /v1/predictions/{id}`.
    pub async fn poll(&self, job_id: &str) -> Result<JobView, AiFailure> {
        self.fetch(job_id)
            .await
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

    /// Before serving: with an official model configured (no version), its
    /// `GET /v1/models/{owner}/{name}`. `Err`: the start stops with what to
    /// change (no such model, a refused token, a model name that is not
    /// `owner/name`). A check that cannot be made (the provider unreachable
    /// or failing) is logged and the start goes on.
    pub async fn check_model(&self) -> Result<Vec<ModelNotice>, String> {
        if let Some(version) = &self.version {
            return Ok(vec![ModelNotice::new("version", version)]);
        }
        let Some(model) = &self.model else {
            return Err("no Replicate model is configured: set model = \"owner/name\" (an official model) or version = \"<version id>\"".to_owned());
        };
        let (owner, name) = owner_and_name(model).map_err(|f| f.to_string())?;
        let url = format!(
            "{}/v1/models/{}/{}",
            self.base_url,
            path_segment(owner),
            path_segment(name)
        );
        match self.read::<Model>(&url).await {
            Ok(Model { is_official: Some(false) }) => Err(format!(
                "the Replicate model {model:?} is not one of Replicate's official models, which alone run by name: set version = \"<version id>\" (its page lists the versions) instead of model"
            )),
            Ok(_) => Ok(vec![ModelNotice::new("model", model)]),
            Err(AiFailure::RequestRejected(detail)) if detail.starts_with("HTTP 404") => Err(format!(
                "Replicate has no model {model:?} ({detail}): check the name; a model that is not one of Replicate's official models is run by its version: set version = \"<version id>\" instead of model"
            )),
            Err(AiFailure::RequestRejected(detail)) if detail.starts_with("HTTP 401") || detail.starts_with("HTTP 403") => Err(format!(
                "Replicate refused the API token ({detail}): check the variable api_key_env names"
            )),
            Err(failure) => {
                tracing::warn!(model = %model, %failure, "could not check the Replicate model at start; going on");
                Ok(vec![ModelNotice::new("model", model)])
            }
        }
    }

    fn authorized(&self, request: RequestBuilder) -> RequestBuilder {
        match &self.api_key {
            Some(key) => request.bearer_auth(key.expose()),
            None => request,
        }
    }

    /// [`Self::find_made`], asked again once the list has had
    /// [`LIST_SETTLE_MS`] since the first send to show the prediction: only
    /// then does finding none say the earlier create made none. The wait
    /// holds no connection and no lock, like any wait for the provider.
    async fn find_made_settled(
        &self,
        wanted: &Wanted,
        earlier: &MaybeMade,
    ) -> Result<Found, AiFailure> {
        let found = self.find_made(wanted, earlier).await?;
        let settled_in = LIST_SETTLE_MS - (earlier.now_ms - earlier.last_sent_ms);
        match found {
            Found::None if settled_in > 0 => {
                tokio::time::sleep(Duration::from_millis(settled_in as u64)).await;
                self.find_made(wanted, earlier).await
            }
            found => Ok(found),
        }
    }

    /// The predictions an earlier create of this call may have made: the
    /// list, newest first, down to `earlier.since_ms` (module doc,
    /// "Idempotency"), oldest first.
    async fn find_made(&self, wanted: &Wanted, earlier: &MaybeMade) -> Result<Found, AiFailure> {
        let oldest = earlier.since_ms - CLOCK_SLACK_MS;
        let mut fits = Vec::new();
        let mut url = format!("{}/v1/predictions", self.base_url);
        for _ in 0..LOOKUP_PAGES {
            let page: PredictionPage = self.read(&url).await?;
            let mut older_seen = false;
            for p in page.results {
                match p.created_at.as_deref().and_then(epoch_ms) {
                    Some(at) if at < oldest => older_seen = true,
                    Some(at) if self.is_this_call(&p, earlier) => {
                        match wanted.fit(p.input.as_ref()) {
                            Fit::No => {}
                            fit => fits.push((at, p, fit)),
                        }
                    }
                    _ => {}
                }
            }
            if older_seen {
                break;
            }
            match page.next.as_deref().and_then(next_query) {
                Some(query) => url = format!("{}/v1/predictions?{query}", self.base_url),
                None => break,
            }
        }
        let mut fits = self.keep_same_photo(fits).await?;
        if fits.is_empty() {
            return Ok(Found::None);
        }
        // Oldest first; the list is newest first, so among equal times the
        // later one listed is the older.
        fits.reverse();
        fits.sort_by_key(|(at, _)| *at);
        Ok(Found::Some(fits.into_iter().map(|(_, p)| p).collect()))
    }

    /// A listed prediction that can be the call's, its input aside: this
    /// provider's model or version, made through the API, and no other
    /// call holds it.
    fn is_this_call(&self, p: &Prediction, earlier: &MaybeMade) -> bool {
        let same_model = match (&self.version, &self.model) {
            (Some(version), _) => p.version.as_deref().is_none_or(|v| v == version),
            (None, Some(model)) => p.model.as_deref().is_none_or(|m| m == model),
            (None, None) => false,
        };
        let from_api = p.source.as_deref().is_none_or(|s| s == "api");
        same_model && from_api && !earlier.taken.contains(&p.id)
    }

    /// The fits whose photo is this order's: a Files-API photo is read
    /// back (`GET /v1/files/{id}`, always on the configured base URL) and
    /// kept when its SHA-256 is the photo's; a file that is gone (404) is
    /// not ours to know.
    async fn keep_same_photo(
        &self,
        fits: Vec<(i64, Prediction, Fit)>,
    ) -> Result<Vec<(i64, Prediction)>, AiFailure> {
        let mut kept = Vec::with_capacity(fits.len());
        for (at, p, fit) in fits {
            let same = match fit {
                Fit::Yes => true,
                Fit::No => false,
                Fit::IfChecksum { file_id, sha256 } => {
                    self.file_sha256(&file_id).await?.as_deref() == Some(sha256.as_str())
                }
            };
            if same {
                kept.push((at, p));
            }
        }
        Ok(kept)
    }

    /// The SHA-256 Replicate keeps of an uploaded file; None when the file
    /// is gone (expired, deleted) or says none.
    async fn file_sha256(&self, file_id: &str) -> Result<Option<String>, AiFailure> {
        let url = format!("{}/v1/files/{}", self.base_url, path_segment(file_id));
        match self.read::<FileObject>(&url).await {
            Ok(file) => Ok(file.checksums.and_then(|c| c.sha256)),
            Err(AiFailure::RequestRejected(detail)) if detail.starts_with("HTTP 404") => Ok(None),
            Err(failure) => Err(failure),
        }
    }

    async fn fetch(&self, id: &str) -> Result<Prediction, AiFailure> {
        let url = format!("{}/v1/predictions/{}", self.base_url, path_segment(id));
        self.read(&url).await
    }

    /// A GET, asked once more at once when its connection broke before an
    /// answer (a kept-alive connection the server had closed): a read
    /// changes nothing, so asking again is safe. Not after a timeout.
    async fn read<T: DeserializeOwned>(&self, url: &str) -> Result<T, AiFailure> {
        let get = || send(self.authorized(self.http.get(url)));
        match get().await {
            Err(e) if !e.is_timeout() && !e.is_connect() => self.classify(get().await),
            answer => self.classify(answer),
        }
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
        } else if status == StatusCode::PAYMENT_REQUIRED {
            AiFailure::OutOfQuota(described)
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
            "canceled" => (JobStatus::Cancelled, None, error),
            // Ended before it ran (e.g. its deadline passed): final, and
            // never to be cancelled.
            "aborted" => (
                JobStatus::Failed,
                None,
                Some(error.unwrap_or_else(|| {
                    "the prediction was aborted before it ran (for example, its deadline passed)"
                        .to_owned()
                })),
            ),
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
            lookup: None,
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
            AiFailure::OutOfQuota(d) => AiFailure::OutOfQuota(self.scrub(&d)),
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

/// `owner/name` split, or the refusal that says what it must be.
fn owner_and_name(model: &str) -> Result<(&str, &str), AiFailure> {
    match model.split_once('/') {
        Some((owner, name)) if !owner.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((owner, name))
        }
        _ => Err(AiFailure::RequestRejected(format!(
            "the Replicate model must be owner/name, not {model:?}"
        ))),
    }
}

/// An RFC 3339 time (`created_at`) in epoch milliseconds.
fn epoch_ms(text: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
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
            thumb_url: None,
            original_url: None,
            print_url: None,
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
            thumb_url: None,
            original_url: None,
            print_url: None,
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
                    thumb_url: None,
                    original_url: None,
                    print_url: None,
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
    fn every_documented_status_maps() {
        for (status, expected) in STATUSES {
            let output = r#""output":"https://replicate.delivery/x/out.webp""#;
            let view = ok(&format!(r#"{{"id":"p1","status":"{status}",{output}}}"#));
            assert_eq!(view.status, expected, "{status}");
            assert_eq!(
                view.status.is_final(),
                !matches!(status, "starting" | "processing")
            );
            assert_eq!(view.job_id, "p1");
        }
        let aborted = ok(r#"{"id":"p","status":"aborted","error":null}"#);
        assert!(aborted.error.unwrap().contains("aborted before it ran"));
    }

    #[test]
    fn statuses_map() {
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
            answer(
                402,
                r#"{"title":"Payment required","detail":"You have insufficient credit","status":402}"#,
                None
            ),
            Err(AiFailure::OutOfQuota(_))
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
        assert_eq!(epoch_ms("1970-01-01T00:00:01.5Z"), Some(1_500));
        assert_eq!(
            epoch_ms("2026-12-05T10:00:00+01:00"),
            Some(1_796_461_200_000)
        );
        assert_eq!(epoch_ms("yesterday"), None);
        assert!(owner_and_name("owner/name").is_ok());
        for bad in ["name", "/name", "owner/", "a/b/c"] {
            assert!(owner_and_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_listed_input_fits_by_its_words_and_its_photo() {
        let text: Map<String, Value> = [("prompt".to_owned(), json!("p"))].into_iter().collect();
        // "QUJD" is "ABC"; the photo is known by its key and SHA-256.
        let data = "data:image/jpeg;base64,QUJD";
        let print = PhotoPrint {
            key: Some("p/abc.jpg".into()),
            sha256: Some(photo_sha256(b"ABC")),
        };
        let inline = Wanted {
            text: text.clone(),
            photo: Some(("image".into(), print.clone())),
        };
        // Its own URL, however it was signed, and a data URI of the same
        // bytes, however the URI's media type was written.
        for same in [
            json!({"prompt": "p", "image": "https://booth.example/media/p/abc.jpg?exp=1&sig=aa"}),
            json!({"prompt": "p", "image": "https://booth.example/media/p/abc.jpg?exp=2&sig=bb"}),
            json!({"prompt": "p", "image": "data:image/png;base64,QUJD"}),
        ] {
            assert_eq!(inline.fit(Some(&same)), Fit::Yes, "{same}");
        }
        assert_eq!(
            inline.fit(Some(&json!({"prompt": "p", "image": data}))),
            Fit::Yes
        );
        for other in [
            json!({"prompt": "p", "image": "data:image/jpeg;base64,QUJE"}),
            json!({"prompt": "p"}),
            json!({"prompt": "q", "image": data}),
            json!({"prompt": "p", "image": data, "seed": 1}),
            json!({"prompt": "p", "input_image": data}),
            json!({"prompt": "p", "image": "https://booth.example/media/p/abd.jpg?exp=1"}),
            json!({"prompt": "p", "image": "https://booth.example/p/abc.jpg"}),
            json!("p"),
        ] {
            assert_eq!(inline.fit(Some(&other)), Fit::No, "{other}");
        }
        assert_eq!(inline.fit(None), Fit::No);
        let upload = Wanted {
            text: text.clone(),
            photo: Some((
                "image".into(),
                PhotoPrint {
                    key: None,
                    sha256: Some("ab12".into()),
                },
            )),
        };
        assert_eq!(
            upload.fit(Some(
                &json!({"prompt": "p", "image": "https://api.replicate.com/v1/files/f1"})
            )),
            Fit::IfChecksum {
                file_id: "f1".into(),
                sha256: "ab12".into()
            }
        );
        assert_eq!(
            upload.fit(Some(
                &json!({"prompt": "p", "image": "https://booth.example/p.jpg"})
            )),
            Fit::No
        );
        let words = Wanted { text, photo: None };
        assert_eq!(words.fit(Some(&json!({"prompt": "p"}))), Fit::Yes);
        assert_eq!(
            words.fit(Some(&json!({"prompt": "p", "image": data}))),
            Fit::No
        );
        assert_eq!(
            file_id("https://api.replicate.com/v1/files/cneq?x=1"),
            Some("cneq".into())
        );
        for not_a_file in [
            "https://x/v1/files/",
            "https://x/v1/files/a/b",
            "data:x",
            "https://x/y",
        ] {
            assert_eq!(file_id(not_a_file), None, "{not_a_file}");
        }
    }

    #[test]
    fn a_photo_goes_inline_up_to_the_data_uri_limit() {
        let photo = |len: usize, url: Option<&str>| InputPhoto {
            url: url.map(str::to_owned),
            bytes: bytes::Bytes::from(vec![7u8; len]),
            content_type: "image/jpeg".into(),
        };
        let small = photo(DATA_URI_MAX_BYTES, None);
        assert!(
            matches!(PhotoValue::of(&small), PhotoValue::Inline(v) if v.starts_with("data:image/jpeg;base64,"))
        );
        let large = photo(DATA_URI_MAX_BYTES + 1, None);
        assert!(
            matches!(PhotoValue::of(&large), PhotoValue::Upload(p) if p.bytes.len() == DATA_URI_MAX_BYTES + 1)
        );
        let linked = photo(DATA_URI_MAX_BYTES + 1, Some("https://booth.example/p.jpg"));
        assert!(
            matches!(PhotoValue::of(&linked), PhotoValue::Inline(v) if v == "https://booth.example/p.jpg")
        );
    }

    #[tokio::test]
    async fn without_a_model_a_submit_is_refused() {
        let c = ReplicateClient::new(&ReplicateSettings::new(None));
        let order = JobOrder {
            kind: "image".into(),
            prompt: "p".into(),
            params: json!({}),
            idempotency_key: uuid::Uuid::new_v4(),
            ..JobOrder::default()
        };
        assert!(matches!(
            c.submit(&order).await,
            Err(AiFailure::RequestRejected(_))
        ));
    }
}
