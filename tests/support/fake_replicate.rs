//! A fake of Replicate's HTTP API, written only from Replicate's own
//! documentation (not from `src/ai/replicate.rs`): one instance is one
//! Replicate account, an actix-web server on 127.0.0.1:0.
//!
//! # The pages it follows
//!
//! - The OpenAPI document of the HTTP API, <https://api.replicate.com/openapi.json>
//!   (title "Replicate HTTP API"; read as mirrored in
//!   github.com/tryAGI/Replicate `src/libs/Replicate/openapi.yaml`, commit
//!   6c8ab8ea of 2026-04-09), which is what
//!   <https://replicate.com/docs/reference/http> renders:
//!   - `predictions.create` (`POST /v1/predictions`, body
//!     `schemas_version_prediction_request`: `version` and `input`
//!     required; `stream`, `webhook`, `webhook_events_filter` optional;
//!     `additionalProperties: false`; headers `Prefer: wait[=1..60]` and
//!     `Cancel-After`; answers 201, or 202 "created but does not yet have all
//!     outputs");
//!   - `models.predictions.create` (`POST /v1/models/{owner}/{name}/predictions`,
//!     "Create a prediction using an official model ... If you're not running
//!     an official model, use predictions.create"; body
//!     `schemas_prediction_request`: `input` required, no `version`,
//!     `additionalProperties: false`);
//!   - `predictions.get` (`GET /v1/predictions/{id}`), the prediction object
//!     `schemas_prediction_response`: required `id, model, version, input,
//!     output, data_removed, error, status, created_at, urls`; also `logs,
//!     metrics, source, started_at, completed_at, deadline, deployment`; **no
//!     `webhook` field**; `version` is `"hidden"` for official models; `urls`
//!     has `web, get, cancel` (and `stream`); `status` is one of
//!     `starting, processing, succeeded, failed, canceled, aborted`
//!     ("`canceled` means the prediction was canceled (either by the user or
//!     because it reached its deadline while running). `aborted` means the
//!     prediction was terminated before it started running");
//!   - `predictions.list` (`GET /v1/predictions`): every prediction of the
//!     account (API and website), 100 per page, "sorted with the most recent
//!     prediction first", `{"next", "previous", "results"}` with `next` and
//!     `previous` URLs; query `created_after`, `created_before`, `source=web`;
//!   - `predictions.cancel` (`POST /v1/predictions/{id}/cancel`): "Cancel a
//!     prediction that is currently running"; the only answer documented is
//!     200 with the prediction. Nothing is said about cancelling a prediction
//!     that is already final: this fake answers 200 with the prediction
//!     unchanged (the one documented answer), and a knob makes it refuse;
//!   - `models.get` (`GET /v1/models/{owner}/{name}`), the model object
//!     `schemas_model_response` (`url, owner, name, description, visibility,
//!     github_url, paper_url, license_url, run_count, cover_image_url,
//!     default_example, latest_version, is_official`);
//!   - `securitySchemes.bearerAuth`: "The token must be prefixed by
//!     "Bearer", followed by a space and the token value."
//!   - the `input` of both creates: "Files should be passed as HTTP URLs or
//!     data URLs. Use an HTTP URL when: you have a large file > 256kb ...
//!     Use a data URL when: you have a small file <= 256kb";
//!   - `files.create` (`POST /v1/files`, `multipart/form-data`: `content`
//!     the file, required; `filename` at most 255 bytes; `type`, default
//!     `application/octet-stream`; `metadata`, default `{}`; answers 201
//!     with the file, 413 "Files must be less than 100MB in size") and
//!     `files.get` (`GET /v1/files/{id}`); the file object
//!     `schemas_file_response`: `id, checksums {sha256}, content_type,
//!     created_at, expires_at, metadata, size, urls {get}`, `urls.get`
//!     being `https://api.replicate.com/v1/files/{id}`.
//! - Prediction lifecycle, <https://replicate.com/docs/topics/predictions/lifecycle>:
//!   the six statuses; "aborted: the prediction exceeded its deadline before
//!   it could start running".
//! - Prediction deadlines, <https://replicate.com/changelog/2025-10-16-prediction-deadlines>:
//!   `Cancel-After`; aborted before running, canceled while running.
//! - Rate limits, <https://replicate.com/docs/topics/predictions/rate-limits>:
//!   creates 600/min, other endpoints 3000/min; "If you hit a limit, you
//!   will receive a response with status `429` with a body like
//!   `{"detail":"Request was throttled. Your rate limit resets in ~30s."}`"
//!   (no header is documented; `Retry-After` is a knob).
//! - Validation of prediction payloads,
//!   <https://replicate.com/changelog/2024-05-01-improved-validation-for-api-prediction-payloads>:
//!   a misspelt top-level field is refused with `invalid_fields`
//!   (`{"type": "required" | "additional_property_not_allowed", "field",
//!   "description"}`). The page shows no status; 422 is the status the
//!   OpenAPI document's Prefer/validation answers and Replicate's clients
//!   use for it.
//! - Output files: a prediction's `output` holds the URLs of its files
//!   (a model's output schema says `"format": "uri"`; the documentation's
//!   examples are `https://replicate.delivery/...` URLs, fetched without
//!   the API token, which is how this fake serves its own); data
//!   retention, <https://replicate.com/docs/topics/predictions/data-retention>:
//!   "For predictions created through the API, all input parameters, output
//!   values, output files, and logs are automatically removed after an
//!   hour", and `data_removed` says so.
//! - Errors are problem details (RFC 7807: `type, title, status, detail,
//!   instance`), as Replicate's own client documents its `ReplicateError`
//!   (github.com/replicate/replicate-python `replicate/exceptions.py`); the
//!   OpenAPI document's 404s are `application/problem+json` with `detail`.
//!   The exact titles here ("Unauthenticated", "Not found", "Invalid version
//!   or not permitted") are not quoted from a page: only their shape is.
//!
//! # Where output files come from
//!
//! Real Replicate serves output files from `https://replicate.delivery`
//! (and its subdomains), a CDN apart from the API. The sandbox the tests
//! run in cannot reach it, and stagehand keeps every output file (it
//! downloads it before recording the result) from the provider's own
//! origin or from listed origins, and a listed origin such as
//! replicate.delivery only at a public address (never loopback). So this
//! fake serves its outputs itself, on its own origin (which is the
//! provider's: always allowed): a succeeded prediction's `output` is
//! `["{base}/xezq/{id}/out-0.webp"]`, and `GET /xezq/{id}/out-0.webp`
//! answers, with no token needed, a small real WebP image
//! ([`output_bytes`]: the same bytes for the same prediction, other bytes
//! for another), `Content-Type: image/webp`; 404 while the prediction has
//! not succeeded, and once its data is removed.
//!
//! # Knobs (the Rust API of [`FakeReplicate`])
//!
//! - Models: [`FakeReplicate::add_model`] (an official model: `GET
//!   /v1/models/{owner}/{name}` answers it and its predictions endpoint
//!   takes creates), [`FakeReplicate::add_version`]; anything else is 404
//!   on both endpoints (422 as a `version`).
//! - How predictions go: [`Plan`] (`starting` -> `processing` -> `succeeded`
//!   over set times, or `failed`, `aborted`, `canceled`, or held
//!   `processing` until cancelled), per create in order
//!   ([`FakeReplicate::push_plans`]) else [`FakeReplicate::set_default_plan`];
//!   [`FakeReplicate::insert`] makes a prediction in any status directly.
//! - Faults of the next creates, in order ([`FakeReplicate::push_create_faults`]):
//!   [`CreateFault::MadeThenDropped`], [`CreateFault::MadeThenLate`],
//!   [`CreateFault::DroppedBeforeMaking`], [`CreateFault::Throttled`].
//! - Cancels: [`CancelAnswer`] ([`FakeReplicate::set_cancel_answer`]);
//!   [`FakeReplicate::cancels`] lists every cancel with the status the
//!   prediction had when it came (so cancels of final ones can be counted);
//!   [`FakeReplicate::cancel_all_running`] ends what still runs.
//! - [`FakeReplicate::set_page_size`] (100 as documented).
//! - Outputs: [`FakeReplicate::output_url`], [`output_bytes`] (what the
//!   URL answers), [`FakeReplicate::output_fetches`] and
//!   [`FakeReplicate::output_fetches_of`] (every GET of an output file);
//!   [`FakeReplicate::remove_data`] does what Replicate does an hour after
//!   an API prediction: `data_removed: true`, the input, output and logs
//!   gone from the object (their removed shape is not documented: here
//!   `input` is `{}` and `output` null), and the files answer 404.
//! - File inputs: data URLs are decoded and refused past
//!   [`DATA_URI_MAX_BYTES`]; a Files-API URL must name an uploaded file
//!   ([`FakeReplicate::files`] lists them with their bytes).
//! - [`FakeReplicate::quote_token_in_401`]: a hostile, undocumented 401
//!   that quotes the token back (to check that stagehand scrubs it).
//! - Records: [`FakeReplicate::requests`] (method, path, query, body,
//!   arrival and answer instants, status; None when the connection was
//!   dropped), [`FakeReplicate::creates`], [`FakeReplicate::predictions`].
#![allow(dead_code)]
// The validators answer the documented error response itself.
#![allow(clippy::result_large_err)]

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::dev::Extensions;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Map, Value};

use crate::support::multipart::{self, Part};

/// Every status the documentation lists, in its order.
pub const DOCUMENTED_STATUSES: [&str; 6] = [
    "starting",
    "processing",
    "succeeded",
    "failed",
    "canceled",
    "aborted",
];

/// The statuses after which nothing changes.
pub const FINAL_STATUSES: [&str; 4] = ["succeeded", "failed", "canceled", "aborted"];

pub fn is_final(status: &str) -> bool {
    FINAL_STATUSES.contains(&status)
}

/// How one prediction goes, in time from its creation.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// `starting` for `starting`, `processing` for `processing`, then
    /// `succeeded` with one image URL, served by the fake itself (see the
    /// module doc: real Replicate's are on replicate.delivery).
    Succeed {
        starting: Duration,
        processing: Duration,
    },
    /// As `Succeed`, but ends `failed` with this `error`.
    Fail {
        starting: Duration,
        processing: Duration,
        error: String,
    },
    /// `starting` for `after`, then `aborted`: terminated before it ran
    /// (its deadline reached while it waited for a worker).
    Abort { after: Duration },
    /// `starting`, `processing`, then `canceled` (its deadline reached while
    /// it ran).
    Cancel {
        starting: Duration,
        processing: Duration,
    },
    /// `starting` for `starting`, then `processing` until cancelled.
    Hold { starting: Duration },
}

impl Plan {
    /// 100 ms starting, 100 ms processing, succeeded.
    pub fn quick() -> Plan {
        Plan::Succeed {
            starting: Duration::from_millis(100),
            processing: Duration::from_millis(100),
        }
    }

    pub fn hold() -> Plan {
        Plan::Hold {
            starting: Duration::from_millis(50),
        }
    }

    pub fn abort(after_ms: u64) -> Plan {
        Plan::Abort {
            after: Duration::from_millis(after_ms),
        }
    }

    /// The status `t` after creation, and when (since creation) it started
    /// and ended, without cancels or deadlines.
    fn natural(&self, t: Duration) -> (&'static str, Option<Duration>, Option<Duration>) {
        let ran = |starting: Duration, processing: Duration, end: &'static str| {
            if t < starting {
                ("starting", None, None)
            } else if t < starting + processing {
                ("processing", Some(starting), None)
            } else {
                (end, Some(starting), Some(starting + processing))
            }
        };
        match self {
            Plan::Succeed {
                starting,
                processing,
            } => ran(*starting, *processing, "succeeded"),
            Plan::Fail {
                starting,
                processing,
                ..
            } => ran(*starting, *processing, "failed"),
            Plan::Cancel {
                starting,
                processing,
            } => ran(*starting, *processing, "canceled"),
            Plan::Abort { after } if t < *after => ("starting", None, None),
            Plan::Abort { after } => ("aborted", None, Some(*after)),
            Plan::Hold { starting } if t < *starting => ("starting", None, None),
            Plan::Hold { starting } => ("processing", Some(*starting), None),
        }
    }
}

/// A fault of one create request.
#[derive(Debug, Clone, PartialEq)]
pub enum CreateFault {
    /// The prediction is made, then the connection is dropped without an
    /// answer.
    MadeThenDropped,
    /// The prediction is made; the answer comes this much later (after the
    /// client's request timeout).
    MadeThenLate(Duration),
    /// The connection is dropped before anything is made.
    DroppedBeforeMaking,
    /// 429 with the documented body ("... resets in ~{resets_in_s}s."), and
    /// `Retry-After: {retry_after_s}` when set. Nothing is made.
    Throttled {
        retry_after_s: Option<u64>,
        resets_in_s: u64,
    },
}

/// What `POST /v1/predictions/{id}/cancel` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelAnswer {
    /// As documented: 200 with the prediction; one still running becomes
    /// `canceled`, a final one stays as it was.
    Documented,
    /// This status (a 4xx) with a problem-details body; nothing changes.
    Refuse(u16),
    /// The prediction is cancelled as documented, then a 200 whose body is
    /// cut short (unreadable).
    Unreadable,
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    /// The JSON body, `Null` when there was none (or it was not JSON).
    pub body: Value,
    pub authorization: Option<String>,
    pub at: Instant,
    /// When the answer went (or the connection was dropped).
    pub answered: Instant,
    /// The status answered; None when the connection was dropped.
    pub status: Option<u16>,
}

impl Seen {
    pub fn is_create(&self) -> bool {
        self.method == "POST"
            && (self.path == "/v1/predictions"
                || (self.path.starts_with("/v1/models/") && self.path.ends_with("/predictions")))
    }
}

/// One cancel request, with the status the prediction had when it came.
#[derive(Debug, Clone)]
pub struct CancelSeen {
    pub id: String,
    /// None: no such prediction.
    pub status_before: Option<&'static str>,
    pub at: Instant,
}

/// A prediction as it stands now.
#[derive(Debug, Clone)]
pub struct PredictionNow {
    pub id: String,
    pub model: String,
    pub status: &'static str,
    pub input: Value,
    pub output: Value,
    pub created: Instant,
    pub json: Value,
}

/// A prediction's status forced by [`FakeReplicate::insert`].
#[derive(Debug, Clone)]
struct Forced {
    status: &'static str,
    output: Value,
    error: Value,
}

#[derive(Debug, Clone)]
struct Stored {
    id: String,
    model: String,
    /// The version id, or "hidden" (official model endpoint).
    version: String,
    input: Value,
    created: Instant,
    created_at: DateTime<Utc>,
    plan: Plan,
    forced: Option<Forced>,
    /// Since creation: when a cancel came while it still ran.
    canceled_after: Option<Duration>,
    /// Since creation: the `Cancel-After` deadline.
    deadline_after: Option<Duration>,
    /// Input, output, logs and files removed (an hour after an API
    /// prediction).
    data_removed: bool,
}

impl Stored {
    /// Status, started and completed (since creation), output, error, at `now`.
    fn state(&self, now: Instant) -> (&'static str, Option<Duration>, Option<Duration>) {
        if let Some(forced) = &self.forced {
            let t = now.saturating_duration_since(self.created);
            let started = (forced.status != "starting" && forced.status != "aborted")
                .then_some(Duration::ZERO);
            let ended = is_final(forced.status).then_some(t.min(Duration::from_millis(1)));
            return (forced.status, started, ended);
        }
        let t = now.saturating_duration_since(self.created);
        // The first of: a cancel, the deadline, while it had not ended.
        let stops = [
            self.canceled_after.map(|c| (c, false)),
            self.deadline_after.map(|d| (d, true)),
        ];
        let stop = stops.iter().flatten().min_by_key(|(at, _)| *at).copied();
        if let Some((at, by_deadline)) = stop {
            if at <= t {
                let (status, started, _) = self.plan.natural(at);
                if !is_final(status) {
                    // A deadline before it ran aborts it; a cancel (or a
                    // deadline while it ran) cancels it.
                    let stopped = if by_deadline && status == "starting" {
                        "aborted"
                    } else {
                        "canceled"
                    };
                    return (stopped, started, Some(at));
                }
            }
        }
        self.plan.natural(t)
    }

    fn json(&self, base: &str, now: Instant) -> Value {
        let (status, started, ended) = self.state(now);
        let at = |d: Duration| stamp(self.created_at + chrono::Duration::from_std(d).unwrap());
        let (output, error) = match (&self.forced, status) {
            (Some(forced), _) => (forced.output.clone(), forced.error.clone()),
            (None, "succeeded") => (json!([output_url(base, &self.id)]), Value::Null),
            (None, "failed") => match &self.plan {
                Plan::Fail { error, .. } => (Value::Null, json!(error)),
                _ => (Value::Null, json!("the prediction failed")),
            },
            _ => (Value::Null, Value::Null),
        };
        let mut v = json!({
            "id": self.id,
            "model": self.model,
            "version": self.version,
            "input": self.input,
            "logs": "",
            "output": output,
            "data_removed": false,
            "error": error,
            "status": status,
            "created_at": stamp(self.created_at),
            "source": "api",
            "urls": {
                "web": format!("https://replicate.com/p/{}", self.id),
                "get": format!("{base}/v1/predictions/{}", self.id),
                "cancel": format!("{base}/v1/predictions/{}/cancel", self.id),
            },
            "metrics": {},
        });
        if let Some(started) = started {
            v["started_at"] = json!(at(started));
        }
        if let Some(ended) = ended {
            v["completed_at"] = json!(at(ended));
            let total = ended.as_secs_f64();
            let predict = started.map(|s| (ended - s).as_secs_f64()).unwrap_or(0.0);
            v["metrics"] = json!({"predict_time": predict, "total_time": total});
        }
        if let Some(deadline) = self.deadline_after {
            v["deadline"] = json!(at(deadline));
        }
        if self.data_removed {
            v["data_removed"] = json!(true);
            v["input"] = json!({});
            v["output"] = Value::Null;
        }
        v
    }
}

/// The path of a prediction's one output file (real Replicate's is on
/// replicate.delivery: see the module doc).
fn output_path(id: &str) -> String {
    format!("/xezq/{id}/{OUTPUT_FILE}")
}

const OUTPUT_FILE: &str = "out-0.webp";

fn output_url(base: &str, id: &str) -> String {
    format!("{base}{}", output_path(id))
}

/// What prediction `id`'s output URL answers: a real 48 x 32 WebP
/// (lossless), its colours drawn from the id, so the same prediction always
/// has the same bytes and another has others.
pub fn output_bytes(id: &str) -> Vec<u8> {
    use sha2::Digest;
    let seed = sha2::Sha256::digest(id.as_bytes());
    let (width, height) = (48u32, 32u32);
    let picture = image::RgbImage::from_fn(width, height, |x, y| {
        let i = ((x / 8 + y / 8 * 6) as usize) % seed.len();
        image::Rgb([
            seed[i],
            seed[(i + 11) % seed.len()] ^ (x as u8 * 5),
            seed[(i + 23) % seed.len()] ^ (y as u8 * 7),
        ])
    });
    let mut bytes = Vec::new();
    image::codecs::webp::WebPEncoder::new_lossless(&mut bytes)
        .encode(
            picture.as_raw(),
            width,
            height,
            image::ExtendedColorType::Rgb8,
        )
        .expect("encode the output WebP");
    bytes
}

fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// A file of the Files API.
#[derive(Debug, Clone)]
pub struct StoredFile {
    pub id: String,
    pub bytes: Vec<u8>,
    pub content_type: String,
    pub filename: String,
    pub metadata: Value,
    pub created_at: DateTime<Utc>,
}

impl StoredFile {
    /// The file object (`schemas_file_response`).
    fn json(&self, base: &str) -> Value {
        use sha2::Digest;
        json!({
            "id": self.id,
            "checksums": {"sha256": hex::encode(sha2::Sha256::digest(&self.bytes))},
            "content_type": self.content_type,
            "created_at": stamp(self.created_at),
            // The document's example expires an hour after creation.
            "expires_at": stamp(self.created_at + chrono::Duration::hours(1)),
            "metadata": self.metadata,
            "size": self.bytes.len(),
            "urls": {"get": format!("{base}/v1/files/{}", self.id)},
        })
    }
}

/// The largest file a data URI may carry here: the reference's "use a data
/// URL when you have a small file <= 256kb", in its larger reading (KiB).
/// The reference says when to use one, not that a larger one is refused;
/// this fake refuses it so a test sees a data URI used past that.
pub const DATA_URI_MAX_BYTES: usize = 256 * 1024;

#[derive(Default)]
struct Account {
    files: Vec<StoredFile>,
    models: Vec<String>,
    /// version id -> model
    versions: HashMap<String, String>,
    predictions: Vec<Stored>,
    plans: VecDeque<Plan>,
    default_plan: Option<Plan>,
    create_faults: VecDeque<CreateFault>,
    cancel_answer: Option<CancelAnswer>,
    page_size: Option<usize>,
    /// `GET /v1/predictions` answers 503 (the list is down for a while).
    list_unavailable: bool,
    quote_token: bool,
    seen: Vec<Seen>,
    cancels: Vec<CancelSeen>,
}

struct Shared {
    token: String,
    base: String,
    account: Mutex<Account>,
}

impl Shared {
    fn account(&self) -> std::sync::MutexGuard<'_, Account> {
        self.account.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The raw socket of a connection, to drop it from a handler.
#[derive(Clone, Copy)]
struct ConnFd(RawFd);

/// The running fake.
pub struct FakeReplicate {
    /// `http://127.0.0.1:PORT` (the API is under `/v1`).
    pub url: String,
    shared: Arc<Shared>,
    server: actix_web::dev::ServerHandle,
}

impl FakeReplicate {
    /// An account whose API token is `token`, with no models yet.
    pub async fn start(token: &str) -> FakeReplicate {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake");
        let port = listener.local_addr().unwrap().port();
        let base = format!("http://127.0.0.1:{port}");
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            base: base.clone(),
            account: Mutex::new(Account::default()),
        });
        let data = web::Data::from(shared.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(8 << 20))
                .default_service(web::to(serve))
        })
        .on_connect(|conn: &dyn Any, ext: &mut Extensions| {
            if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
                ext.insert(ConnFd(tcp.as_raw_fd()));
            }
        })
        .workers(1)
        .listen(listener)
        .expect("listen")
        .disable_signals()
        .shutdown_timeout(1)
        .run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        FakeReplicate {
            url: base,
            shared,
            server: handle,
        }
    }

    pub async fn stop(self) {
        self.server.stop(false).await;
    }

    /// An official model `owner/name`.
    pub fn add_model(&self, model: &str) {
        self.shared.account().models.push(model.to_owned());
    }

    /// A version (64 hex characters) of `model` (added too).
    pub fn add_version(&self, version: &str, model: &str) {
        let mut account = self.shared.account();
        account.models.push(model.to_owned());
        account
            .versions
            .insert(version.to_owned(), model.to_owned());
    }

    pub fn set_default_plan(&self, plan: Plan) {
        self.shared.account().default_plan = Some(plan);
    }

    /// Plans of the next predictions made, in order (then the default).
    pub fn push_plans(&self, plans: impl IntoIterator<Item = Plan>) {
        self.shared.account().plans.extend(plans);
    }

    /// Faults of the next create requests, in order.
    pub fn push_create_faults(&self, faults: impl IntoIterator<Item = CreateFault>) {
        self.shared.account().create_faults.extend(faults);
    }

    pub fn set_cancel_answer(&self, answer: CancelAnswer) {
        self.shared.account().cancel_answer = Some(answer);
    }

    pub fn set_page_size(&self, size: usize) {
        self.shared.account().page_size = Some(size.max(1));
    }

    /// `GET /v1/predictions` answers 503 while `down` (the rest answers).
    pub fn set_list_unavailable(&self, down: bool) {
        self.shared.account().list_unavailable = down;
    }

    /// Every prediction still running is canceled now (as from the
    /// website, or by its deadline).
    pub fn cancel_all_running(&self) {
        let now = Instant::now();
        for p in self.shared.account().predictions.iter_mut() {
            if p.forced.is_none() && !is_final(p.state(now).0) {
                p.canceled_after = Some(now.saturating_duration_since(p.created));
            }
        }
    }

    /// Not documented: a 401 that quotes the token it got.
    pub fn quote_token_in_401(&self) {
        self.shared.account().quote_token = true;
    }

    /// A prediction of `model` in `status`, made now (as if from the
    /// website or another client): its id.
    pub fn insert(
        &self,
        model: &str,
        status: &'static str,
        input: Value,
        output: Value,
        error: Value,
    ) -> String {
        assert!(DOCUMENTED_STATUSES.contains(&status), "{status}");
        let id = prediction_id();
        self.shared.account().predictions.push(Stored {
            id: id.clone(),
            model: model.to_owned(),
            version: "hidden".into(),
            input,
            created: Instant::now(),
            created_at: Utc::now(),
            plan: Plan::hold(),
            forced: Some(Forced {
                status,
                output,
                error,
            }),
            canceled_after: None,
            deadline_after: None,
            data_removed: false,
        });
        id
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Seen> {
        self.shared.account().seen.clone()
    }

    /// Every create request so far (made something or not).
    pub fn creates(&self) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(Seen::is_create)
            .collect()
    }

    /// Requests whose path starts with `prefix` and method is `method`.
    pub fn requests_to(&self, method: &str, prefix: &str) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(|s| s.method == method && s.path.starts_with(prefix))
            .collect()
    }

    pub fn cancels(&self) -> Vec<CancelSeen> {
        self.shared.account().cancels.clone()
    }

    /// Cancels that came for a prediction already final at the fake.
    pub fn cancels_of_final(&self) -> Vec<CancelSeen> {
        self.cancels()
            .into_iter()
            .filter(|c| c.status_before.is_some_and(is_final))
            .collect()
    }

    /// Every file uploaded with the Files API, oldest first.
    pub fn files(&self) -> Vec<StoredFile> {
        self.shared.account().files.clone()
    }

    /// The Files API's URL of a file (its `urls.get`).
    pub fn file_url(&self, id: &str) -> String {
        format!("{}/v1/files/{id}", self.url)
    }

    /// The URL of prediction `id`'s output file (on this fake's origin).
    pub fn output_url(&self, id: &str) -> String {
        output_url(&self.url, id)
    }

    /// What prediction `id`'s output URL answers once it succeeded.
    pub fn output_bytes(&self, id: &str) -> Vec<u8> {
        output_bytes(id)
    }

    /// Every GET of an output file so far (whatever it answered), in
    /// arrival order.
    pub fn output_fetches(&self) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(|s| s.method == "GET" && s.path.starts_with("/xezq/"))
            .collect()
    }

    /// The GETs of prediction `id`'s output file so far.
    pub fn output_fetches_of(&self, id: &str) -> usize {
        let path = output_path(id);
        self.output_fetches()
            .iter()
            .filter(|s| s.path == path)
            .count()
    }

    /// What Replicate does an hour after an API prediction: its input,
    /// output and logs are removed (`data_removed: true`) and its output
    /// files answer 404 from now on.
    pub fn remove_data(&self, id: &str) {
        let mut account = self.shared.account();
        let p = account
            .predictions
            .iter_mut()
            .find(|p| p.id == id)
            .unwrap_or_else(|| panic!("no prediction {id}"));
        p.data_removed = true;
    }

    /// Every prediction of the account, oldest first, as it stands now.
    pub fn predictions(&self) -> Vec<PredictionNow> {
        let now = Instant::now();
        let account = self.shared.account();
        account
            .predictions
            .iter()
            .map(|p| {
                let json = p.json(&self.shared.base, now);
                PredictionNow {
                    id: p.id.clone(),
                    model: p.model.clone(),
                    status: p.state(now).0,
                    input: p.input.clone(),
                    output: json["output"].clone(),
                    created: p.created,
                    json,
                }
            })
            .collect()
    }
}

/// 26 characters of a-z and 2-7, like the documented ids
/// ("gm3qorzdhgbfurvjtvhg6dckhu").
fn prediction_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    let bits = uuid::Uuid::new_v4().as_u128() ^ (uuid::Uuid::new_v4().as_u128() >> 7);
    (0..26)
        .map(|i| ALPHABET[((bits >> (i * 5 % 125)) & 31) as usize] as char)
        .collect()
}

/// A problem-details answer.
fn problem(status: u16, title: &str, detail: &str) -> HttpResponse {
    HttpResponse::build(StatusCode::from_u16(status).unwrap())
        .content_type("application/problem+json")
        .body(json!({"title": title, "detail": detail, "status": status}).to_string())
}

fn invalid(fields: Vec<(&str, String)>) -> HttpResponse {
    let detail = fields
        .iter()
        .map(|(_, d)| format!("- {d}"))
        .collect::<Vec<_>>()
        .join("\n");
    let invalid_fields: Vec<Value> = fields
        .iter()
        .map(|(kind, d)| json!({"type": kind, "field": "", "description": d}))
        .collect();
    HttpResponse::UnprocessableEntity()
        .content_type("application/problem+json")
        .body(
            json!({"title": "Invalid request", "detail": detail, "status": 422,
                   "invalid_fields": invalid_fields})
            .to_string(),
        )
}

/// What one handler decided.
enum Outcome {
    Answer(HttpResponse),
    /// Shut the connection down without an answer.
    Drop,
}

async fn serve(shared: web::Data<Shared>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    let at = Instant::now();
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let authorization = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let outcome = route(&shared, &req, &body, &parsed, authorization.as_deref()).await;
    let (status, answer) = match outcome {
        Outcome::Answer(answer) => (Some(answer.status().as_u16()), answer),
        Outcome::Drop => {
            if let Some(ConnFd(fd)) = req.conn_data::<ConnFd>().copied() {
                // SAFETY: shutdown(2) on the connection's own socket, still
                // open (actix owns and closes it): the client sees the
                // connection end with no answer.
                unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            }
            (None, HttpResponse::InternalServerError().finish())
        }
    };
    shared.account().seen.push(Seen {
        method: req.method().to_string(),
        path: req.path().to_owned(),
        query: req.query_string().to_owned(),
        body: parsed,
        authorization,
        at,
        answered: Instant::now(),
        status,
    });
    answer
}

async fn route(
    shared: &Shared,
    req: &HttpRequest,
    raw: &[u8],
    body: &Value,
    authorization: Option<&str>,
) -> Outcome {
    let path = req.path().trim_end_matches('/');
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let method = req.method().as_str();
    // Output files need no token (replicate.delivery serves them to
    // anyone who has the URL).
    if let ("GET", ["xezq", id, OUTPUT_FILE]) = (method, segments.as_slice()) {
        return Outcome::Answer(output_file(shared, id));
    }
    let expected = format!("Bearer {}", shared.token);
    if authorization != Some(expected.as_str()) {
        let quote = shared.account().quote_token;
        let detail = match (quote, authorization) {
            (true, Some(got)) => format!(
                "Invalid token {}",
                got.trim_start_matches("Bearer ")
                    .trim_start_matches("Token ")
            ),
            _ => "You did not pass a valid authentication token".to_owned(),
        };
        return Outcome::Answer(problem(401, "Unauthenticated", &detail));
    }
    match (method, segments.as_slice()) {
        ("POST", ["v1", "predictions"]) => create(shared, req, raw, body, None).await,
        ("GET", ["v1", "predictions"]) => Outcome::Answer(list(shared, req)),
        ("GET", ["v1", "predictions", id]) => Outcome::Answer(get(shared, id)),
        ("POST", ["v1", "predictions", id, "cancel"]) => cancel(shared, id),
        ("POST", ["v1", "files"]) => Outcome::Answer(create_file(shared, req, raw)),
        ("GET", ["v1", "files", id]) => Outcome::Answer(get_file(shared, id)),
        ("GET", ["v1", "models", owner, name]) => {
            Outcome::Answer(model(shared, &format!("{owner}/{name}")))
        }
        ("POST", ["v1", "models", owner, name, "predictions"]) => {
            let model = format!("{owner}/{name}");
            create(shared, req, raw, body, Some(model)).await
        }
        _ => Outcome::Answer(problem(404, "Not found", "Not found.")),
    }
}

/// `GET /xezq/{id}/out-0.webp`: a succeeded prediction's output file, as
/// long as its data is not removed; 404 otherwise (no such file yet, or no
/// more).
fn output_file(shared: &Shared, id: &str) -> HttpResponse {
    let now = Instant::now();
    let account = shared.account();
    let there = account
        .predictions
        .iter()
        .find(|p| p.id == id)
        .is_some_and(|p| p.forced.is_none() && !p.data_removed && p.state(now).0 == "succeeded");
    if !there {
        return HttpResponse::NotFound()
            .content_type("text/plain")
            .body("Not Found");
    }
    HttpResponse::Ok()
        .content_type("image/webp")
        .body(output_bytes(id))
}

/// Both create endpoints; `official` is the model of the official-model
/// endpoint.
async fn create(
    shared: &Shared,
    req: &HttpRequest,
    raw: &[u8],
    body: &Value,
    official: Option<String>,
) -> Outcome {
    // The path's model must exist before anything else is read.
    if let Some(model) = &official {
        if !shared.account().models.contains(model) {
            return Outcome::Answer(problem(
                404,
                "Not found",
                &format!("The requested model {model} was not found."),
            ));
        }
    }
    let Value::Object(fields) = body else {
        let detail = if raw.is_empty() {
            "the request body is empty"
        } else {
            "the request body is not a JSON object"
        };
        return Outcome::Answer(invalid(vec![("invalid_type", detail.to_owned())]));
    };
    if let Some(answer) = validate(fields, official.is_none()) {
        return Outcome::Answer(answer);
    }
    let (model, version) = match &official {
        Some(model) => (model.clone(), "hidden".to_owned()),
        None => match resolve_version(shared, fields["version"].as_str().unwrap_or_default()) {
            Some(found) => found,
            None => {
                return Outcome::Answer(problem(
                    422,
                    "Invalid version or not permitted",
                    "The specified version does not exist (or perhaps you don't have \
                     permission to use it?)",
                ))
            }
        },
    };
    if !fields["input"]["prompt"].is_string() {
        return Outcome::Answer(problem(
            422,
            "Input validation failed",
            "- input: prompt is required",
        ));
    }
    if let Some(answer) = check_file_inputs(shared, &fields["input"]) {
        return Outcome::Answer(answer);
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let wait = match header("prefer") {
        None => None,
        Some(prefer) => match parse_prefer(&prefer) {
            Some(seconds) => Some(Duration::from_secs(seconds)),
            None => {
                return Outcome::Answer(invalid(vec![(
                    "pattern",
                    format!("Prefer {prefer:?} does not match ^wait(=([1-9]|[1-9][0-9]|60))?$"),
                )]))
            }
        },
    };
    let deadline = match header("cancel-after") {
        None => None,
        Some(text) => match parse_cancel_after(&text) {
            Some(d) if d >= Duration::from_secs(5) => Some(d),
            _ => {
                return Outcome::Answer(invalid(vec![(
                    "invalid",
                    format!("Cancel-After {text:?} is not a duration of at least 5 seconds"),
                )]))
            }
        },
    };
    let fault = shared.account().create_faults.pop_front();
    match &fault {
        Some(CreateFault::DroppedBeforeMaking) => return Outcome::Drop,
        Some(CreateFault::Throttled {
            retry_after_s,
            resets_in_s,
        }) => {
            let mut answer = HttpResponse::TooManyRequests();
            if let Some(seconds) = retry_after_s {
                answer.insert_header(("Retry-After", seconds.to_string()));
            }
            return Outcome::Answer(
                answer.content_type("application/problem+json").body(
                    json!({"detail": format!(
                        "Request was throttled. Your rate limit resets in ~{resets_in_s}s."
                    )})
                    .to_string(),
                ),
            );
        }
        _ => {}
    }
    let id = prediction_id();
    {
        let mut account = shared.account();
        let plan = account
            .plans
            .pop_front()
            .or_else(|| account.default_plan.clone())
            .unwrap_or_else(Plan::quick);
        account.predictions.push(Stored {
            id: id.clone(),
            model,
            version,
            input: fields["input"].clone(),
            created: Instant::now(),
            created_at: Utc::now(),
            plan,
            forced: None,
            canceled_after: None,
            deadline_after: deadline,
            data_removed: false,
        });
    }
    match fault {
        Some(CreateFault::MadeThenDropped) => return Outcome::Drop,
        Some(CreateFault::MadeThenLate(delay)) => actix_web::rt::time::sleep(delay).await,
        _ => {}
    }
    // Sync mode: hold the answer until the prediction is final, or the wait.
    if let Some(wait) = wait {
        let until = Instant::now() + wait;
        while Instant::now() < until && !is_final(current(shared, &id).0) {
            actix_web::rt::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (status, json) = current(shared, &id);
    let code = if is_final(status) || wait.is_none() {
        StatusCode::CREATED
    } else {
        StatusCode::ACCEPTED
    };
    Outcome::Answer(HttpResponse::build(code).json(json))
}

/// The documented request schema: required fields, types, and no other
/// top-level field (`additionalProperties: false`).
fn validate(fields: &Map<String, Value>, with_version: bool) -> Option<HttpResponse> {
    let mut allowed = vec!["input", "stream", "webhook", "webhook_events_filter"];
    if with_version {
        allowed.push("version");
    }
    let mut problems: Vec<(&str, String)> = Vec::new();
    for required in ["version", "input"] {
        if (required != "version" || with_version) && !fields.contains_key(required) {
            problems.push(("required", format!("{required} is required")));
        }
    }
    for name in fields.keys() {
        if !allowed.contains(&name.as_str()) {
            problems.push((
                "additional_property_not_allowed",
                format!("Additional property {name} is not allowed"),
            ));
        }
    }
    let wrong = |name: &str, what: &str| {
        (
            "invalid_type",
            format!("{name}: Invalid type. Expected: {what}"),
        )
    };
    if fields.get("input").is_some_and(|v| !v.is_object()) {
        problems.push(wrong("input", "object"));
    }
    if with_version && fields.get("version").is_some_and(|v| !v.is_string()) {
        problems.push(wrong("version", "string"));
    }
    if fields.get("stream").is_some_and(|v| !v.is_boolean()) {
        problems.push(wrong("stream", "boolean"));
    }
    if fields.get("webhook").is_some_and(|v| !v.is_string()) {
        problems.push(wrong("webhook", "string"));
    }
    if let Some(filter) = fields.get("webhook_events_filter") {
        let ok = filter.as_array().is_some_and(|events| {
            events.iter().all(|e| {
                e.as_str()
                    .is_some_and(|e| ["start", "output", "logs", "completed"].contains(&e))
            })
        });
        if !ok {
            problems.push((
                "enum",
                "webhook_events_filter: must be a list of start, output, logs, completed"
                    .to_owned(),
            ));
        }
    }
    (!problems.is_empty()).then(|| invalid(problems))
}

/// File inputs as the reference has them: "Files should be passed as HTTP
/// URLs or data URLs". A data URL must be `data:<type>;base64,<data>` and
/// its file at most [`DATA_URI_MAX_BYTES`]; a URL of this account's Files
/// API must name a file it has. Other URLs are taken as they are (the
/// model fetches them).
fn check_file_inputs(shared: &Shared, input: &Value) -> Option<HttpResponse> {
    use base64::Engine;
    let files_prefix = format!("{}/v1/files/", shared.base);
    for (name, value) in input.as_object()? {
        let Some(text) = value.as_str() else {
            continue;
        };
        let refused = |detail: String| {
            Some(problem(
                422,
                "Input validation failed",
                &format!("- input.{name}: {detail}"),
            ))
        };
        if let Some(rest) = text.strip_prefix("data:") {
            let decoded = rest.split_once(";base64,").and_then(|(media, data)| {
                let media_ok = media.contains('/') && !media.contains(';');
                let bytes = base64::engine::general_purpose::STANDARD.decode(data).ok();
                bytes.filter(|_| media_ok)
            });
            match decoded {
                None => return refused("not a base64 data URL".into()),
                Some(bytes) if bytes.len() > DATA_URI_MAX_BYTES => {
                    return refused(format!(
                        "a data URL of {} bytes: use an HTTP URL for a file over 256kb",
                        bytes.len()
                    ))
                }
                Some(_) => {}
            }
        } else if let Some(id) = text.strip_prefix(&files_prefix) {
            if !shared.account().files.iter().any(|f| f.id == id) {
                return refused(format!("no file {id}"));
            }
        }
    }
    None
}

/// `POST /v1/files` (`files.create`): a multipart form whose `content` is
/// the file (required), with `filename` (required, at most 255 bytes; the
/// field, else the content part's file name), `type` (the field, else the
/// content part's type, else `application/octet-stream`) and `metadata`
/// (JSON, default `{}`); no other field. 201 with the file; a file over
/// 100 MB is the documented 413.
fn create_file(shared: &Shared, req: &HttpRequest, raw: &[u8]) -> HttpResponse {
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let form = match multipart::parse(content_type, raw) {
        Ok(form) => form,
        Err(reason) => {
            return invalid(vec![(
                "invalid_type",
                format!("multipart/form-data: {reason}"),
            )])
        }
    };
    let field = |name: &str| form.iter().find(|p| p.name == name);
    let mut problems: Vec<(&str, String)> = form
        .iter()
        .filter(|p| !["content", "filename", "type", "metadata"].contains(&p.name.as_str()))
        .map(|p| {
            (
                "additional_property_not_allowed",
                format!("Additional property {} is not allowed", p.name),
            )
        })
        .collect();
    let Some(content) = field("content") else {
        problems.push(("required", "content is required".into()));
        return invalid(problems);
    };
    let filename = field("filename")
        .map(Part::text)
        .or_else(|| content.filename.clone())
        .unwrap_or_default();
    if filename.is_empty() || filename.len() > 255 {
        problems.push((
            "required",
            "filename is required (at most 255 bytes)".into(),
        ));
    }
    let metadata = match field("metadata") {
        None => json!({}),
        Some(part) => match serde_json::from_slice::<Value>(&part.bytes) {
            Ok(value @ Value::Object(_)) => value,
            _ => {
                problems.push((
                    "invalid_type",
                    "metadata: Invalid type. Expected: object".into(),
                ));
                Value::Null
            }
        },
    };
    if !problems.is_empty() {
        return invalid(problems);
    }
    if content.bytes.len() >= 100 << 20 {
        return HttpResponse::PayloadTooLarge()
            .content_type("application/problem+json")
            .body(json!({"detail": "Files must be less than 100MB in size"}).to_string());
    }
    let file = StoredFile {
        id: prediction_id(),
        bytes: content.bytes.clone(),
        content_type: field("type")
            .map(Part::text)
            .or_else(|| content.content_type.clone())
            .unwrap_or_else(|| "application/octet-stream".into()),
        filename,
        metadata,
        created_at: Utc::now(),
    };
    let answer = file.json(&shared.base);
    shared.account().files.push(file);
    HttpResponse::Created().json(answer)
}

/// `GET /v1/files/{id}` (`files.get`).
fn get_file(shared: &Shared, id: &str) -> HttpResponse {
    match shared.account().files.iter().find(|f| f.id == id) {
        Some(file) => HttpResponse::Ok().json(file.json(&shared.base)),
        None => problem(404, "Not found", "Not found."),
    }
}

/// `version` as documented: `owner/name` (official models), or
/// `owner/name:version_id`, or `version_id`: the model and version id.
fn resolve_version(shared: &Shared, version: &str) -> Option<(String, String)> {
    let account = shared.account();
    match version.split_once(':') {
        Some((model, id)) => account
            .versions
            .get(id)
            .filter(|m| *m == model)
            .map(|m| (m.clone(), id.to_owned())),
        None if version.contains('/') => account
            .models
            .iter()
            .find(|m| *m == version)
            .map(|m| (m.clone(), "hidden".to_owned())),
        None => account
            .versions
            .get(version)
            .map(|m| (m.clone(), version.to_owned())),
    }
}

fn parse_prefer(text: &str) -> Option<u64> {
    let text = text.trim();
    if text == "wait" {
        return Some(60);
    }
    let n: u64 = text.strip_prefix("wait=")?.parse().ok()?;
    (1..=60).contains(&n).then_some(n)
}

/// `30`, `30s`, `5m`, `1h30m45s`.
fn parse_cancel_after(text: &str) -> Option<Duration> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let mut total = 0u64;
    let mut digits = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let n: u64 = digits.parse().ok()?;
        digits.clear();
        total += n * match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
    }
    digits.is_empty().then_some(Duration::from_secs(total))
}

fn current(shared: &Shared, id: &str) -> (&'static str, Value) {
    let now = Instant::now();
    let account = shared.account();
    let p = account
        .predictions
        .iter()
        .find(|p| p.id == id)
        .expect("a prediction the fake made");
    (p.state(now).0, p.json(&shared.base, now))
}

fn get(shared: &Shared, id: &str) -> HttpResponse {
    let now = Instant::now();
    let account = shared.account();
    match account.predictions.iter().find(|p| p.id == id) {
        Some(p) => HttpResponse::Ok().json(p.json(&shared.base, now)),
        None => problem(404, "Not found", "Not found."),
    }
}

fn cancel(shared: &Shared, id: &str) -> Outcome {
    let now = Instant::now();
    let mut account = shared.account();
    let answer = account.cancel_answer.unwrap_or(CancelAnswer::Documented);
    let index = account.predictions.iter().position(|p| p.id == id);
    let status_before = index.map(|i| account.predictions[i].state(now).0);
    account.cancels.push(CancelSeen {
        id: id.to_owned(),
        status_before,
        at: now,
    });
    let Some(i) = index else {
        return Outcome::Answer(problem(404, "Not found", "Not found."));
    };
    if let CancelAnswer::Refuse(status) = answer {
        return Outcome::Answer(problem(
            status,
            "Cancel refused",
            "The prediction could not be canceled.",
        ));
    }
    let p = &mut account.predictions[i];
    if !is_final(p.state(now).0) {
        p.canceled_after = Some(now.saturating_duration_since(p.created));
    }
    let json = p.json(&shared.base, now);
    Outcome::Answer(match answer {
        CancelAnswer::Unreadable => {
            let text = json.to_string();
            HttpResponse::Ok()
                .content_type("application/json")
                .body(text[..text.len() / 2].to_owned())
        }
        _ => HttpResponse::Ok().json(json),
    })
}

fn list(shared: &Shared, req: &HttpRequest) -> HttpResponse {
    if shared.account().list_unavailable {
        return problem(503, "Service Unavailable", "The list is unavailable.");
    }
    let query: HashMap<String, String> =
        web::Query::<HashMap<String, String>>::from_query(req.query_string())
            .map(|q| q.into_inner())
            .unwrap_or_default();
    let time = |name: &str| -> Result<Option<DateTime<Utc>>, HttpResponse> {
        match query.get(name) {
            None => Ok(None),
            Some(text) => DateTime::parse_from_rfc3339(text)
                .map(|t| Some(t.with_timezone(&Utc)))
                .map_err(|_| {
                    invalid(vec![(
                        "format",
                        format!("{name}: {text:?} is not an ISO 8601 date-time"),
                    )])
                }),
        }
    };
    let (after, before) = match (time("created_after"), time("created_before")) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(answer), _) | (_, Err(answer)) => return answer,
    };
    if let Some(source) = query.get("source") {
        if source != "web" {
            return invalid(vec![("enum", format!("source: {source:?} is not web"))]);
        }
    }
    let now = Instant::now();
    let account = shared.account();
    let size = account.page_size.unwrap_or(100);
    let matching: Vec<&Stored> = account
        .predictions
        .iter()
        .rev()
        .filter(|p| after.is_none_or(|a| p.created_at >= a))
        .filter(|p| before.is_none_or(|b| p.created_at < b))
        // Every prediction here was made through the API.
        .filter(|_| !query.contains_key("source"))
        .collect();
    let start: usize = query
        .get("cursor")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let results: Vec<Value> = matching
        .iter()
        .skip(start)
        .take(size)
        .map(|p| p.json(&shared.base, now))
        .collect();
    let link = |cursor: usize| {
        let mut query: Vec<(String, String)> = query
            .iter()
            .filter(|(k, _)| k.as_str() != "cursor")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        query.push(("cursor".into(), cursor.to_string()));
        query.sort();
        let text = query
            .iter()
            .map(|(k, v)| format!("{k}={}", urlencode(v)))
            .collect::<Vec<_>>()
            .join("&");
        format!("{}/v1/predictions?{text}", shared.base)
    };
    let next = (start + size < matching.len()).then(|| link(start + size));
    let previous = (start > 0).then(|| link(start.saturating_sub(size)));
    HttpResponse::Ok().json(json!({"next": next, "previous": previous, "results": results}))
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn model(shared: &Shared, model: &str) -> HttpResponse {
    let account = shared.account();
    if !account.models.iter().any(|m| m == model) {
        return problem(
            404,
            "Not found",
            &format!("The requested model {model} was not found."),
        );
    }
    let (owner, name) = model.split_once('/').unwrap_or((model, ""));
    let latest = account
        .versions
        .iter()
        .find(|(_, m)| *m == model)
        .map(|(id, _)| json!({"id": id, "created_at": stamp(Utc::now()), "cog_version": "0.9.0", "openapi_schema": {}}));
    HttpResponse::Ok().json(json!({
        "url": format!("https://replicate.com/{model}"),
        "owner": owner,
        "name": name,
        "description": "A fake model",
        "visibility": "public",
        "github_url": null,
        "paper_url": null,
        "license_url": null,
        "run_count": 0,
        "cover_image_url": null,
        "default_example": null,
        "latest_version": latest,
        "is_official": latest.is_none(),
    }))
}
