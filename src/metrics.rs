//! Metrics: the recording API the rest of the code calls (small named
//! functions: [`step_finished`], [`saga_ended`], [`claimed`],
//! [`ai_request`], [`AiJobTimes`], [`operator_socket_connected`]) and the
//! text of `GET /metrics` ([`render`]), in the Prometheus text format.
//!
//! Two kinds of figures, kept apart on purpose:
//!
//! - **What happens** (durations, batch sizes, AI answers) is recorded when
//!   it happens, with the `metrics` crate, into one Prometheus recorder per
//!   process. It is installed once ([`install`], behind a `OnceLock`, by
//!   the first recording or scrape), so building several applications in
//!   one process (the tests do) never tries to install a second one; a
//!   thread runs its upkeep every [`UPKEEP`] so histogram samples do not
//!   pile up between scrapes. These are process-wide: in tests that run
//!   several apps in one process they add up, which is why tests compare
//!   them before and after, never to a fixed value. Durations use
//!   explicit buckets from 10 ms to 10 min ([`DURATION_BUCKETS`]), but
//!   SQLite's write gate, whose waits and commits are milliseconds
//!   ([`GATE_BUCKETS`], 0.5 ms to 5 s).
//! - **What is** (sagas per step, queue depth, AI slots, breaker state,
//!   outbox lag, sockets, pool connections) is computed at scrape time
//!   from the scraping application's own state — its database, its pools,
//!   its instance id — and appended to the recorder's text. So two apps in
//!   one process never mix their gauges, and a gauge is never stale.
//!   Figures read from the database describe the whole database: on
//!   PostgreSQL every instance reports the same sagas, queue and lag
//!   (aggregate them with `max`, not `sum`); sockets and pools are this
//!   instance's own. The only process-wide gauge is the operator sockets'
//!   count ([`operator_socket_connected`]): one app per process in
//!   production.
//!
//! A scrape costs a few short statements (the operators' dashboard counts,
//! [`Store::operator_stats`], plus one over the connected displays and one
//! for the breaker) and one pool checkout per pool; no per-saga rows. If
//! the database cannot be read, the scrape still answers 200 with the
//! process figures and the pools, and `stagehand_metrics_database_up 0`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sea_orm::DbBackend;

use crate::ai::{JobStatus, JobView};
use crate::clock::SharedClock;
use crate::domain::failure::AiFailure;
use crate::domain::policy::EpochMs;
use crate::domain::presence::PRESENCE_STALE_MS;
use crate::domain::saga::{AbortReason, Step};
use crate::store::presence::DisplayPositions;
use crate::store::{Store, StoreResult, SQLITE_COMMIT, SQLITE_GATE_WAIT};

/// Histogram: how long a worker spent on one saga step.
pub const STEP_DURATION: &str = "stagehand_saga_step_duration_seconds";
/// Histogram: submission to COMPLETED or ABORTED.
pub const SAGA_DURATION: &str = "stagehand_saga_duration_seconds";
/// Histogram: one request to the AI provider.
pub const AI_REQUEST_DURATION: &str = "stagehand_ai_request_duration_seconds";
/// Histogram: an AI job, submit to final status.
pub const AI_JOB_DURATION: &str = "stagehand_ai_job_duration_seconds";
/// Keeping one call's result files (download, store, thumbnails).
pub const KEEP_DURATION: &str = "stagehand_keep_seconds";
/// Prints that moved on, by the status they reached.
pub const PRINTS: &str = "stagehand_prints_total";
/// 1 while a printer takes jobs, 0 while something holds its queue.
pub const PRINTER_UP: &str = "stagehand_printer_up";
/// Time to make a print-ready image.
pub const PRINT_PREPARE_DURATION: &str = "stagehand_print_prepare_seconds";
/// Webhook delivery attempts, by outcome (`delivered`, `retry`, `failed`).
pub const WEBHOOK_DELIVERIES: &str = "stagehand_webhook_deliveries_total";
/// Mail attempts, by outcome (`sent`, `retry`, `failed`).
pub const MAILS: &str = "stagehand_mails_total";
/// Decoding, cleaning and re-encoding one uploaded photo in the pool.
pub const PHOTO_DECODE_DURATION: &str = "stagehand_photo_decode_seconds";
/// Uploads (and thumbnails) refused because the photo pool was full.
pub const PHOTO_POOL_REFUSED: &str = "stagehand_photo_pool_refused_total";
/// Counter: AI jobs seen reaching a final status.
pub const AI_JOBS_FINISHED: &str = "stagehand_ai_jobs_finished_total";
/// Counter: slots of the ledger freed, by the evidence that no job ran in
/// them (`job_final`, `cancel_confirmed`, `submit_refused`,
/// `never_submitted`, `provider_deadline`).
pub const SLOTS_FREED: &str = "stagehand_ai_slots_freed_total";
/// Counter: rows of the ledger whose job was looked for by re-sending its
/// key (its id was never recorded), by what was found (`job`, `none`).
pub const SLOTS_FOUND_BY_KEY: &str = "stagehand_ai_slots_found_by_key_total";
/// Counter: submits of a provider without an idempotency key (Replicate)
/// whose key an earlier, unclear create may have used, by what the look
/// for that job found (`adopted`, `ambiguous`, `created_again`).
pub const UNCLEAR_CREATES: &str = "stagehand_ai_unclear_creates_total";
/// Histogram: sagas one claim round took.
pub const CLAIM_BATCH: &str = "stagehand_claim_batch_size";
/// Counter: messages handled by this process's actors, by actor (the
/// wake-ups and hand-offs of the hot path; `stagehand bench` divides them
/// by the sagas).
pub const ACTOR_MESSAGES: &str = "stagehand_actor_messages_total";
/// Counter: tasks and actor futures this process started, by where.
pub const TASKS_SPAWNED: &str = "stagehand_tasks_spawned_total";
/// Counter: frames encoded to JSON text for the sockets, by frame kind
/// (one encoding is shared by every socket that sends the frame).
pub const FRAMES_ENCODED: &str = "stagehand_frames_encoded_total";
/// Counter: reads of a terminal's outbox by its display sockets (each one
/// statement; a socket reads when rung, never for a ranking frame).
pub const OUTBOX_READS: &str = "stagehand_outbox_reads_total";

/// Buckets of every duration, in seconds: 10 ms to 10 min.
pub const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Buckets of the SQLite write gate's figures: its waits and commits are
/// milliseconds, and a disk's stalls tens of them.
pub const GATE_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];
/// Buckets of the claim batch sizes (a round claims at most `MAX_RUNNING`).
pub const BATCH_BUCKETS: &[f64] = &[
    0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];
/// How often the recorder's upkeep runs.
pub const UPKEEP: Duration = Duration::from_secs(5);
/// The scrape's own wait for a pool connection is cut off here.
pub const ACQUIRE_PROBE_LIMIT: Duration = Duration::from_secs(1);

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process's recorder, installed on first use. None when another
/// recorder was installed first (then only the scrape-time gauges show).
pub fn install() -> Option<&'static PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            let built = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), DURATION_BUCKETS)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(CLAIM_BATCH.into()), BATCH_BUCKETS))
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(SQLITE_GATE_WAIT.into()), GATE_BUCKETS))
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(SQLITE_COMMIT.into()), GATE_BUCKETS))
                .and_then(|b| b.install_recorder());
            let handle = match built {
                Ok(handle) => handle,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics recorder not installed (another one is); /metrics shows only the gauges read at scrape time");
                    return None;
                }
            };
            describe();
            let upkeep = handle.clone();
            let spawned = std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || loop {
                    std::thread::sleep(UPKEEP);
                    upkeep.run_upkeep();
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no metrics upkeep thread; histograms are compacted at each scrape only");
            }
            Some(handle)
        })
        .as_ref()
}

fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        PRINTS,
        "Prints that moved on, by the status they reached (status)."
    );
    describe_counter!(
        MAILS,
        "Attempts to send a guest's mail, by outcome (sent; retry: a temporary failure, tried again later; failed: refused for good or no tries left)."
    );
    describe_counter!(
        WEBHOOK_DELIVERIES,
        "Webhook delivery attempts, by outcome (delivered; retry: failed and tried again later; failed: no tries left)."
    );
    describe_gauge!(PRINTER_UP, "1 while the printer takes jobs, 0 while out of paper, jammed, paused or unreachable (printer).");
    describe_histogram!(
        PRINT_PREPARE_DURATION,
        Unit::Seconds,
        "Time to make one print-ready image (fitted to the media at its resolution, as JPEG)."
    );
    describe_histogram!(
        STEP_DURATION,
        Unit::Seconds,
        "Time a worker spent on one saga step, from starting it to its write committing, by the step it left (step)."
    );
    describe_histogram!(
        SAGA_DURATION,
        Unit::Seconds,
        "Sagas ended by their worker, from submission to COMPLETED or ABORTED, by outcome (COMPLETED or the abort reason)."
    );
    describe_histogram!(
        AI_REQUEST_DURATION,
        Unit::Seconds,
        "One request to the AI provider (request: submit or poll), by its outcome: the job status it answered, or the failure kind."
    );
    describe_histogram!(
        KEEP_DURATION,
        Unit::Seconds,
        "Keeping the files of one AI call's result in the media store (download or decode, store, thumbnails), from its start to its last write."
    );
    describe_histogram!(
        PHOTO_DECODE_DURATION,
        Unit::Seconds,
        "One uploaded photo in the photo pool: decoding, turning upright, downscaling and re-encoding, waiting for a worker included."
    );
    describe_histogram!(
        SQLITE_GATE_WAIT,
        Unit::Seconds,
        "SQLite only: how long a write waited for the process's one writer (the write gate), to begin or to commit its group. Long waits with short commits: the writes themselves are slow; long waits behind long commits: the disk."
    );
    describe_histogram!(
        SQLITE_COMMIT,
        Unit::Seconds,
        "SQLite only: one group COMMIT of the write gate, which waits for the disk (synchronous=FULL). Every write queued behind it waits as long, so a disk's stall shows here first."
    );
    describe_counter!(
        PHOTO_POOL_REFUSED,
        "Photo uploads and thumbnails refused because every photo worker was busy and the queue full (answered 503 with Retry-After)."
    );
    describe_histogram!(
        AI_JOB_DURATION,
        Unit::Seconds,
        "AI jobs whose submit this process sent, from that submit to the final status (outcome: succeeded, failed, rejected). A job adopted after a restart is only counted in stagehand_ai_jobs_finished_total."
    );
    describe_counter!(
        ACTOR_MESSAGES,
        "Messages handled by this process's actors, by actor."
    );
    describe_counter!(
        TASKS_SPAWNED,
        "Tasks and actor futures this process started, by task."
    );
    describe_counter!(
        FRAMES_ENCODED,
        "Socket frames encoded to JSON text, by frame kind."
    );
    describe_counter!(
        OUTBOX_READS,
        "Reads of a terminal's outbox by the display sockets of this process."
    );
    describe_counter!(
        AI_JOBS_FINISHED,
        "AI jobs seen reaching a final status by this process (outcome: succeeded, failed, rejected)."
    );
    describe_counter!(
        SLOTS_FREED,
        "AI slots of the ledger freed, by the evidence that no job runs in them (evidence: job_final, cancel_confirmed, submit_refused, never_submitted, provider_deadline)."
    );
    describe_counter!(
        SLOTS_FOUND_BY_KEY,
        "Adopted AI slots whose job id was never recorded, looked for by re-sending their key (found: job, none)."
    );
    describe_counter!(
        UNCLEAR_CREATES,
        "Creates at a provider without an idempotency key whose earlier create was unclear, by provider and by what looking for its job found (outcome: adopted, ambiguous, created_again)."
    );
    describe_histogram!(
        CLAIM_BATCH,
        "Sagas claimed per dispatcher claim round (0 included: the rounds that found nothing)."
    );
}

// ---- recording ----------------------------------------------------------------

/// A worker finished `step` (its write committed) after `elapsed` on it.
pub fn step_finished(step: Step, elapsed: Duration) {
    install();
    ::metrics::histogram!(STEP_DURATION, "step" => step.as_str()).record(elapsed.as_secs_f64());
}

/// A saga ended, `elapsed` after its submission: COMPLETED (`None`) or
/// ABORTED with `reason`.
pub fn saga_ended(reason: Option<AbortReason>, elapsed: Duration) {
    install();
    let outcome = reason.map_or("COMPLETED", AbortReason::as_str);
    ::metrics::histogram!(SAGA_DURATION, "outcome" => outcome).record(elapsed.as_secs_f64());
}

/// An actor of this process handles a message.
pub fn actor_message(actor: &'static str) {
    install();
    ::metrics::counter!(ACTOR_MESSAGES, "actor" => actor).increment(1);
}

/// A task (or an actor's future) starts.
pub fn task_spawned(task: &'static str) {
    install();
    ::metrics::counter!(TASKS_SPAWNED, "task" => task).increment(1);
}

/// A socket frame was encoded to JSON text.
pub fn frame_encoded(kind: &'static str) {
    install();
    ::metrics::counter!(FRAMES_ENCODED, "kind" => kind).increment(1);
}

/// A display socket read its terminal's outbox.
pub fn outbox_read() {
    install();
    ::metrics::counter!(OUTBOX_READS).increment(1);
}

/// A claim round took `batch` sagas.
pub fn claimed(batch: usize) {
    install();
    ::metrics::histogram!(CLAIM_BATCH).record(batch as f64);
}

/// Slots of the ledger were freed (see [`SLOTS_FREED`]).
pub fn slots_freed(evidence: &'static str, n: u64) {
    install();
    ::metrics::counter!(SLOTS_FREED, "evidence" => evidence).increment(n);
}

/// An adopted slot's job was looked for by its key (see
/// [`SLOTS_FOUND_BY_KEY`]).
pub fn slot_found_by_key(found: &'static str) {
    install();
    ::metrics::counter!(SLOTS_FOUND_BY_KEY, "found" => found).increment(1);
}

/// A create whose earlier create was unclear ended in `lookup` (see
/// [`UNCLEAR_CREATES`]).
pub fn unclear_create(provider: &str, lookup: crate::ai::Lookup) {
    install();
    ::metrics::counter!(UNCLEAR_CREATES, "provider" => provider.to_owned(), "outcome" => lookup.as_str())
        .increment(1);
}

/// Which request to the AI provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AiRequest {
    Submit,
    Poll,
}

impl AiRequest {
    pub fn as_str(self) -> &'static str {
        match self {
            AiRequest::Submit => "submit",
            AiRequest::Poll => "poll",
        }
    }
}

/// The label of a job status.
pub fn status_label(status: JobStatus) -> &'static str {
    match status {
        JobStatus::Queued => "queued",
        JobStatus::Running => "running",
        JobStatus::Succeeded => "succeeded",
        JobStatus::Failed => "failed",
        JobStatus::Rejected => "rejected",
        JobStatus::Cancelled => "cancelled",
    }
}

/// The label of a failure kind.
pub fn failure_label(failure: &AiFailure) -> &'static str {
    match failure {
        AiFailure::Unavailable(_) => "unavailable",
        AiFailure::Unclear(_) => "unclear",
        AiFailure::Throttled { .. } => "throttled",
        AiFailure::OutOfQuota(_) => "out_of_quota",
        AiFailure::RequestRejected(_) => "request_rejected",
        AiFailure::ContentRejected(_) => "content_rejected",
        AiFailure::JobFailed(_) => "job_failed",
        AiFailure::Timeout => "timeout",
    }
}

/// One request to the AI provider answered `outcome` after `elapsed`.
pub fn ai_request(request: AiRequest, outcome: &Result<JobView, AiFailure>, elapsed: Duration) {
    install();
    let outcome = match outcome {
        Ok(view) => status_label(view.status),
        Err(failure) => failure_label(failure),
    };
    ::metrics::histogram!(AI_REQUEST_DURATION, "request" => request.as_str(), "outcome" => outcome)
        .record(elapsed.as_secs_f64());
}

/// Jobs timed at most at once by one [`AiJobTimes`].
pub const MAX_TIMED_JOBS: usize = 10_000;
/// A timed job not seen final for this long is forgotten when the table is
/// full (its saga was cancelled or taken over by another instance).
pub const FORGET_JOB_AFTER: Duration = Duration::from_secs(3_600);

/// When each AI job of this process was submitted, so that the poll that
/// sees it final can record its duration. Bounded: at most
/// [`MAX_TIMED_JOBS`]; when full, jobs older than [`FORGET_JOB_AFTER`] are
/// dropped, and if that frees nothing a new job is counted but not timed.
#[derive(Debug, Default)]
pub struct AiJobTimes {
    started: Mutex<HashMap<String, Instant>>,
}

impl AiJobTimes {
    /// A submit sent at `sent_at` answered `outcome`.
    pub fn submitted(&self, outcome: &Result<JobView, AiFailure>, sent_at: Instant) {
        let Ok(view) = outcome else { return };
        if view.status.is_final() {
            // Final at once (or a job found again by its key): timed from
            // its first submit when known, else from this one.
            let started = self.take(&view.job_id).unwrap_or(sent_at);
            job_finished(view.status, Some(started.elapsed()));
            return;
        }
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        if !started.contains_key(&view.job_id) && started.len() >= MAX_TIMED_JOBS {
            started.retain(|_, at| at.elapsed() < FORGET_JOB_AFTER);
            if started.len() >= MAX_TIMED_JOBS {
                return;
            }
        }
        // A second submit with the same key finds the same job: the first
        // submit's time stays.
        started.entry(view.job_id.clone()).or_insert(sent_at);
    }

    /// A poll of `job_id` answered `outcome`.
    pub fn polled(&self, job_id: &str, outcome: &Result<JobView, AiFailure>) {
        let Ok(view) = outcome else { return };
        if view.status.is_final() {
            let started = self.take(job_id);
            job_finished(view.status, started.map(|at| at.elapsed()));
        }
    }

    fn take(&self, job_id: &str) -> Option<Instant> {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(job_id)
    }

    /// Jobs being timed now.
    pub fn len(&self) -> usize {
        self.started.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn job_finished(status: JobStatus, elapsed: Option<Duration>) {
    install();
    let outcome = status_label(status);
    ::metrics::counter!(AI_JOBS_FINISHED, "outcome" => outcome).increment(1);
    if let Some(elapsed) = elapsed {
        ::metrics::histogram!(AI_JOB_DURATION, "outcome" => outcome).record(elapsed.as_secs_f64());
    }
}

/// Operator sockets open in this process.
static OPERATOR_SOCKETS: AtomicI64 = AtomicI64::new(0);

/// Counts one operator socket while it lives: the socket holds it and the
/// count goes down when it is dropped.
#[derive(Debug)]
pub struct SocketGauge(());

/// An operator socket connected; keep the guard for as long as it lives.
pub fn operator_socket_connected() -> SocketGauge {
    OPERATOR_SOCKETS.fetch_add(1, Ordering::Relaxed);
    SocketGauge(())
}

impl Drop for SocketGauge {
    fn drop(&mut self) {
        OPERATOR_SOCKETS.fetch_sub(1, Ordering::Relaxed);
    }
}

// ---- the scrape -----------------------------------------------------------------

/// The last scrape's text, kept for [`SCRAPE_MAX_AGE`]: a flood of
/// scrapes renders (and reads the database) once a second at most, and
/// concurrent scrapes wait for the one render in progress instead of each
/// starting their own. One per application (in its state).
#[derive(Default)]
pub struct ScrapeCache {
    /// When it was made, and its text.
    last: tokio::sync::Mutex<Option<(std::time::Instant, String)>>,
    /// Times a scrape was rendered, the database read (for tests).
    pub reads: std::sync::atomic::AtomicU64,
}

/// How old a scrape's text may be.
pub const SCRAPE_MAX_AGE: Duration = Duration::from_secs(1);

/// What a scrape reads: the application's pools, clock and instance.
pub struct Scrape<'a> {
    /// The requests' pool; the scrape's statements run on it.
    pub requests: &'a Store,
    /// The pool of saga work and display streams.
    pub work: &'a Store,
    pub clock: &'a SharedClock,
    /// This instance (its display sockets are the ones counted).
    pub instance_id: &'a str,
    /// The database gauges of the last second.
    pub cache: &'a ScrapeCache,
}

/// The whole `GET /metrics` text: the process's recorded figures, then the
/// application's gauges.
pub async fn render(scrape: Scrape<'_>) -> String {
    // One render a second at most, shared by every scrape meanwhile (a
    // Prometheus scrapes every 15 s; a flood of scrapes costs one render).
    let mut last = scrape.cache.last.lock().await;
    if let Some((at, text)) = &*last {
        if at.elapsed() < SCRAPE_MAX_AGE {
            return text.clone();
        }
    }
    scrape.cache.reads.fetch_add(1, Ordering::Relaxed);
    let text = render_now(&scrape).await;
    *last = Some((std::time::Instant::now(), text.clone()));
    text
}

/// The whole text, made now.
async fn render_now(scrape: &Scrape<'_>) -> String {
    let mut text = install().map(PrometheusHandle::render).unwrap_or_default();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let mut out = Exposition(text);
    // The pools first, before the scrape's own statements use one.
    let mut pools = Vec::new();
    for (name, store) in [("requests", scrape.requests), ("work", scrape.work)] {
        pools.push((name, pool_state(store.db()).await));
    }
    let now = scrape.clock.now_ms();
    let mut section = Exposition(String::new());
    let displays = match database_gauges(&mut section, scrape.work, scrape.instance_id, now).await {
        Ok(displays) => Some(displays),
        Err(e) => {
            tracing::warn!(error = %e, "metrics: could not read the database gauges");
            section.0.clear();
            None
        }
    };
    out.0.push_str(&section.0);
    let up = if displays.is_some() { 1.0 } else { 0.0 };
    out.family(
        "stagehand_metrics_database_up",
        "1 when this scrape read the database gauges, 0 when the database could not be read (they are then missing).",
    );
    out.sample("stagehand_metrics_database_up", &[], up);
    out.family(
        "stagehand_sockets_connected",
        "WebSockets connected to this instance: kind display (booth displays, from the presence rows; missing when the database cannot be read) or operator (dashboards, counted in this process).",
    );
    if let Some(displays) = displays {
        out.sample(
            "stagehand_sockets_connected",
            &[("kind", "display")],
            displays as f64,
        );
    }
    out.sample(
        "stagehand_sockets_connected",
        &[("kind", "operator")],
        OPERATOR_SOCKETS.load(Ordering::Relaxed) as f64,
    );
    pool_gauges(&mut out, &pools);
    if let Some((commits, writes)) = scrape.work.group_commits() {
        out.family_of(
            "stagehand_sqlite_commits_total",
            "counter",
            "Commits of SQLite's write gate since this process opened the database: writers queued together share one (group commit).",
        );
        out.sample("stagehand_sqlite_commits_total", &[], commits as f64);
        out.family_of(
            "stagehand_sqlite_committed_writes_total",
            "counter",
            "Write transactions and statements those commits committed; divided by stagehand_sqlite_commits_total, the writes per commit.",
        );
        out.sample(
            "stagehand_sqlite_committed_writes_total",
            &[],
            writes as f64,
        );
    }
    out.0
}

/// The gauges read from the database at `now`; the display sockets
/// connected to this instance.
async fn database_gauges(
    out: &mut Exposition,
    store: &Store,
    instance_id: &str,
    now: EpochMs,
) -> StoreResult<i64> {
    // Read everything first, so that a failure writes no family halfway.
    let stats = store.operator_stats(now, now - PRESENCE_STALE_MS).await?;
    let displays = store
        .display_positions(instance_id, now - PRESENCE_STALE_MS)
        .await?;
    let mut breakers = Vec::new();
    for provider in store.providers().await? {
        let breaker = store.breaker(&provider.name).await?;
        breakers.push((provider.name, breaker));
    }

    out.family(
        "stagehand_sagas",
        "Sagas in the database per step (the whole database: every instance reports the same).",
    );
    for (step, n) in &stats.steps {
        out.sample("stagehand_sagas", &[("step", step)], *n as f64);
    }
    out.family(
        "stagehand_sagas_aborted_last_hour",
        "Sagas aborted in the last hour, per abort reason (as the operators' dashboard counts them).",
    );
    let mut aborted: Vec<(String, i64)> = AbortReason::ALL
        .iter()
        .map(|r| (r.as_str().to_owned(), 0))
        .collect();
    for (reason, n) in &stats.aborted_by_reason {
        match aborted.iter_mut().find(|(r, _)| r == reason) {
            Some(entry) => entry.1 = *n,
            None => aborted.push((reason.clone(), *n)),
        }
    }
    for (reason, n) in &aborted {
        out.sample(
            "stagehand_sagas_aborted_last_hour",
            &[("reason", reason)],
            *n as f64,
        );
    }
    out.family(
        "stagehand_queue_depth",
        "Runnable sagas nobody holds: queued for an AI slot, waiting for a retry, or to be resumed.",
    );
    out.sample("stagehand_queue_depth", &[], stats.queue_depth as f64);

    out.family(
        "stagehand_ai_jobs_in_flight",
        "AI slots in use now per experience: rows of the slot ledger, one per call that may have a job at the provider (of ended sagas too, until their jobs end).",
    );
    for e in &stats.experiences {
        out.sample(
            "stagehand_ai_jobs_in_flight",
            &[("experience", &e.slug)],
            e.in_flight as f64,
        );
    }
    out.family(
        "stagehand_ai_capacity",
        "AI jobs an experience may have in flight at once (its max_in_flight).",
    );
    for e in &stats.experiences {
        out.sample(
            "stagehand_ai_capacity",
            &[("experience", &e.slug)],
            f64::from(e.max_in_flight),
        );
    }
    out.family(
        "stagehand_ai_queued",
        "AI_PENDING sagas of an experience waiting for an AI slot or for their retry time.",
    );
    for e in &stats.experiences {
        out.sample(
            "stagehand_ai_queued",
            &[("experience", &e.slug)],
            e.queued as f64,
        );
    }

    out.family(
        "stagehand_breaker_state",
        "Each AI provider's circuit breaker: 0 closed, 1 open (no AI work is claimed), 2 probing (cool-down over, one saga tries the provider).",
    );
    for (provider, breaker) in &breakers {
        out.sample(
            "stagehand_breaker_state",
            &[("provider", provider)],
            f64::from(breaker.state(now).gauge()),
        );
    }

    out.family(
        "stagehand_outbox_lag",
        "Per terminal with a connected display (any instance): its newest event seq minus the acked seq of its slowest connected display.",
    );
    for d in &displays {
        out.sample(
            "stagehand_outbox_lag",
            &[("terminal", &d.terminal_id), ("experience", &d.experience)],
            d.lag() as f64,
        );
    }
    out.family(
        "stagehand_outbox_lag_max",
        "The largest stagehand_outbox_lag over the terminals (0 when no display is connected).",
    );
    let max = displays
        .iter()
        .map(DisplayPositions::lag)
        .max()
        .unwrap_or(0);
    out.sample("stagehand_outbox_lag_max", &[], max as f64);
    Ok(displays.iter().map(|d| d.here).sum())
}

/// Connections of each pool, and how long this scrape waited for one.
fn pool_gauges(out: &mut Exposition, rows: &[(&str, PoolState)]) {
    out.family(
        "stagehand_db_pool_connections",
        "Open connections of each database pool (pool: requests, work), by state: in_use or idle.",
    );
    for (name, p) in rows {
        out.sample(
            "stagehand_db_pool_connections",
            &[("pool", name), ("state", "in_use")],
            f64::from(p.size.saturating_sub(p.idle)),
        );
        out.sample(
            "stagehand_db_pool_connections",
            &[("pool", name), ("state", "idle")],
            f64::from(p.idle),
        );
    }
    out.family(
        "stagehand_db_pool_max_connections",
        "The most connections each pool opens.",
    );
    for (name, p) in rows {
        out.sample(
            "stagehand_db_pool_max_connections",
            &[("pool", name)],
            f64::from(p.max),
        );
    }
    out.family(
        "stagehand_db_pool_acquire_seconds",
        "How long this scrape waited for a connection of each pool (cut off at 1 s): a sample of what a request waits. The pool (sqlx) does not count its waiters, so no waiting count is reported.",
    );
    for (name, p) in rows {
        out.sample(
            "stagehand_db_pool_acquire_seconds",
            &[("pool", name)],
            p.acquire.as_secs_f64(),
        );
    }
}

struct PoolState {
    size: u32,
    idle: u32,
    max: u32,
    acquire: Duration,
}

async fn pool_state(db: &sea_orm::DatabaseConnection) -> PoolState {
    // Each probe takes a connection and gives it straight back.
    // The counts are read before the probe takes its connection.
    async fn probe<DB: sea_orm::sqlx::Database>(pool: &sea_orm::sqlx::Pool<DB>) -> PoolState {
        let (size, idle) = (pool.size(), pool.num_idle() as u32);
        let started = Instant::now();
        let taken = tokio::time::timeout(ACQUIRE_PROBE_LIMIT, pool.acquire()).await;
        let acquire = started.elapsed().min(ACQUIRE_PROBE_LIMIT);
        drop(taken);
        PoolState {
            acquire,
            size,
            idle,
            max: pool.options().get_max_connections(),
        }
    }
    match db.get_database_backend() {
        DbBackend::Postgres => probe(db.get_postgres_connection_pool()).await,
        _ => probe(db.get_sqlite_connection_pool()).await,
    }
}

/// Text in the Prometheus exposition format (0.0.4).
struct Exposition(String);

impl Exposition {
    /// The `# HELP` and `# TYPE` lines of a gauge family.
    fn family(&mut self, name: &str, help: &str) {
        self.family_of(name, "gauge", help);
    }

    /// The `# HELP` and `# TYPE` lines of a family of this type.
    fn family_of(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (key, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{key}=\"{}\"", escape_label(value));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }
}

/// A label value as the text format writes it.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_escaped() {
        let mut out = Exposition(String::new());
        out.family("x", "a help\nline");
        out.sample("x", &[("a", "q\"b\\c\nd"), ("b", "e")], 1.5);
        out.sample("x", &[], 2.0);
        assert_eq!(
            out.0,
            "# HELP x a help\\nline\n# TYPE x gauge\nx{a=\"q\\\"b\\\\c\\nd\",b=\"e\"} 1.5\nx 2\n"
        );
    }

    #[test]
    fn lag_never_goes_below_zero() {
        let d = DisplayPositions {
            terminal_id: "t".into(),
            experience: "e".into(),
            last_seq: 3,
            slowest_acked: 5,
            here: 1,
        };
        assert_eq!(d.lag(), 0);
        assert_eq!(
            DisplayPositions {
                slowest_acked: 1,
                ..d
            }
            .lag(),
            2
        );
    }

    fn view(job_id: &str, status: JobStatus) -> Result<JobView, AiFailure> {
        Ok(JobView {
            job_id: job_id.into(),
            status,
            result: None,
            error: None,
            poll_after_ms: None,
            lookup: None,
        })
    }

    #[test]
    fn job_times_keep_the_first_submit_and_forget_final_jobs() {
        let times = AiJobTimes::default();
        let first = Instant::now();
        times.submitted(&view("j", JobStatus::Queued), first);
        times.submitted(&view("j", JobStatus::Running), Instant::now());
        assert_eq!(times.len(), 1);
        assert_eq!(times.started.lock().unwrap()["j"], first);
        times.polled("j", &view("j", JobStatus::Running));
        assert_eq!(times.len(), 1);
        times.polled("j", &view("j", JobStatus::Succeeded));
        assert!(times.is_empty());
        times.submitted(&view("k", JobStatus::Succeeded), Instant::now());
        times.submitted(&Err(AiFailure::Timeout), Instant::now());
        assert!(times.is_empty(), "nothing to wait for");
    }
}
