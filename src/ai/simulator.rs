//! The built-in simulator of the AI provider's job API (DESIGN.md "The AI
//! provider"), an actix-web server that behaves on the wire like the contract
//! fake (`contract/fakeai.py`). It owns the simulated jobs, their idempotency
//! keys and the counters tests read. It has the job API's optional cancel
//! (`POST /v1/jobs/{id}/cancel`), which tests can switch off
//! ([`SimConfig::refuse_cancel`]) to play a provider without one.
//! `stagehand sim-ai` serves it,
//! `stagehand serve` starts it in-process when no AI URL is configured, and
//! tests use it as the fake provider, changing its behaviour at run time
//! through [`SimControl`].
//!
//! A succeeded job's result is an image the simulator draws itself and serves
//! from its own port, `GET /v1/jobs/{id}/image.svg` (an SVG drawn from the
//! job's kind and prompt, see `picture`), so that the pages show a real
//! picture with the built-in simulator too.
//!
//! A job whose `params.input_url` is a string is a photo job, as at an
//! image-to-image provider: the simulator fetches that photo (a signed URL
//! of the stagehand server) in a task of its own when the job is created,
//! turns it into a comic (see `comic`) off the actix workers, and serves the
//! PNG at `GET /v1/jobs/{id}/image.png`. A photo it cannot fetch or decode
//! ends the job `failed`, with an error that says so.
//!
//! Outputs can be deleted a while after their job ended
//! ([`SimConfig::delete_outputs_after`], as Replicate deletes them after an
//! hour): the job still answers, with a URL that now answers 404. For tests
//! of what stagehand fetches, a job's URL can point anywhere
//! ([`SimControl::set_result_url_override`]), the images can answer with a
//! redirect ([`SimControl::set_image_redirect`]), and every image request is
//! counted ([`SimStats::output_fetches`]).
//!
//! Job timing uses real monotonic time (`std::time::Instant`), not the app's
//! injectable clock: the simulator stands for a provider outside the app.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

mod comic;
mod picture;

/// Largest request body the simulator reads.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// How many characters of the prompt the generated text quotes.
const PROMPT_EXCERPT_CHARS: usize = 40;
/// Jobs the simulator keeps at most (`stagehand serve` runs it for as long
/// as the server runs); older finished ones are forgotten.
pub const MAX_JOBS: usize = 100_000;
/// How long a finished job stays readable.
pub const KEEP_FINISHED: Duration = Duration::from_secs(3_600);
/// Largest input photo the simulator downloads.
pub const MAX_PHOTO_BYTES: usize = 20 * 1024 * 1024;
/// Longest a photo download may take, connection included.
pub const PHOTO_FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest the connection for a photo download may take.
const PHOTO_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How the simulator behaves.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Time from a job's creation until it is done.
    pub latency: Duration,
    /// A prompt containing this word (case-insensitive) is refused by
    /// "moderation" with 422 `content_rejected`.
    pub reject_word: Option<String>,
    /// Probability, decided at creation, that a job ends `failed`.
    pub fail_rate: f64,
    /// Probability that any submit or poll answers 503.
    pub unavailable_rate: f64,
    /// Play a provider without cancel: `POST /v1/jobs/{id}/cancel` answers
    /// 405 `method_not_allowed` and leaves the job alone.
    pub refuse_cancel: bool,
    /// Time after a job ended from which its output is deleted: its image
    /// URL answers 404 `not_found` while the job still answers, with that
    /// URL. None: outputs are kept as long as their job.
    pub delete_outputs_after: Option<Duration>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            latency: Duration::from_secs(2),
            reject_word: Some("forbidden".to_owned()),
            fail_rate: 0.0,
            unavailable_rate: 0.0,
            refuse_cancel: false,
            delete_outputs_after: None,
        }
    }
}

/// Counters that let tests prove there are no duplicate jobs and that the
/// concurrency cap holds. Served by `GET /v1/stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimStats {
    /// Jobs created (a repeated idempotency key creates none).
    pub jobs_created: u64,
    /// Submit requests handled (outage answers not counted).
    pub submits: u64,
    /// Poll requests handled (outage answers not counted).
    pub polls: u64,
    /// Highest number of unfinished jobs seen right after a creation.
    pub max_concurrent_jobs: u64,
    /// Jobs not yet done now.
    pub running: u64,
    /// Submits that came without an `Idempotency-Key`.
    pub missing_key: u64,
    /// Requests answered 503 because of an outage (down, `unavailable_rate`,
    /// [`SimFaults::poll_unavailable`] or
    /// [`SimFaults::unavailable_after_unclear`]).
    #[serde(default)]
    pub refused: u64,
    /// Submits that created a job and then gave no readable answer
    /// ([`SimFaults::drop_after_create`], [`SimFaults::cut_body_after_create`]).
    #[serde(default)]
    pub unclear_answers: u64,
    /// Jobs stopped by a cancel while still running (a cancel of a job that
    /// had ended already, or a refused one, cancels nothing).
    #[serde(default)]
    pub cancelled: u64,
    /// Cancel requests handled, refused and unknown-job ones included
    /// (outage answers not counted).
    #[serde(default)]
    pub cancel_requests: u64,
    /// Requests for a job's image (`image.svg` or `image.png`), whatever
    /// they were answered (image, redirect or 404; outage answers not
    /// counted): how many times outputs were downloaded.
    #[serde(default)]
    pub output_fetches: u64,
}

/// Faults tests switch on at run time ([`SimControl::set_faults`]), each
/// one a way the provider's answer can leave the caller unsure of what
/// happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimFaults {
    /// The next `n` submits that create a job close the connection after
    /// creating it, in the middle of the answer.
    pub drop_after_create: u64,
    /// The next `n` submits that create a job answer 202 with a body cut
    /// short (not valid JSON).
    pub cut_body_after_create: u64,
    /// Polls answer 503 while the jobs go on running.
    pub poll_unavailable: bool,
    /// Polls answer 404 `not_found` while the jobs go on running (a
    /// provider that lost track of them for a while).
    pub poll_not_found: bool,
    /// After each unclear answer ([`Self::drop_after_create`],
    /// [`Self::cut_body_after_create`], [`Self::unavailable_after_create`]),
    /// the next `n` submits answer 503
    /// `unavailable` whatever their key (an outage that begins right after
    /// the job was made, so the retry of the unclear submit is refused).
    pub unavailable_after_unclear: u64,
    /// A submit that creates a job is answered this much later (the job
    /// runs meanwhile): the caller's submit is out while the job exists.
    pub submit_delay: Duration,
    /// The next `n` submits that create a job answer 503 `unavailable`
    /// after creating it (a server that failed once the job was made).
    pub unavailable_after_create: u64,
}

/// How a submit that created a job is answered under [`SimFaults`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AnswerFault {
    Drop,
    Cut,
    Unavailable,
}

/// One simulated job.
#[derive(Debug)]
struct SimJob {
    job_id: String,
    kind: String,
    prompt: String,
    done_at: Instant,
    will_fail: bool,
    score: u64,
    /// Stopped by a cancel before `done_at`: final, `cancelled`.
    cancelled: bool,
    /// The Idempotency-Key it was made under (forgotten with it).
    key: String,
    /// A photo job's input and its comic; None for a picture drawn from
    /// the prompt alone.
    photo: Option<PhotoJob>,
}

/// The participant's photo a job was given (`params.input_url`) and what
/// became of it.
#[derive(Debug)]
struct PhotoJob {
    input_url: String,
    comic: Comic,
}

/// A photo job's comic.
#[derive(Debug)]
enum Comic {
    /// The photo is being fetched or drawn: the job runs on, past its
    /// `done_at` if need be.
    Drawing,
    /// The comic's PNG, ready at `at`.
    Drawn { png: web::Bytes, at: Instant },
    /// No comic (the photo could not be fetched or decoded), known at `at`:
    /// the job ends `failed` with this error.
    Failed { error: String, at: Instant },
}

/// The kinds of output a job has: an SVG drawn from its prompt, or a PNG
/// drawn from its photo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutputFormat {
    Svg,
    Png,
}

impl OutputFormat {
    fn extension(self) -> &'static str {
        match self {
            Self::Svg => "svg",
            Self::Png => "png",
        }
    }
}

/// How a succeeded job's URL is written.
#[derive(Debug, Default)]
struct OutputLinks {
    /// Where results' images are served, e.g. `http://127.0.0.1:PORT`
    /// ([`start`] sets it to the address it listens on); empty until then,
    /// which makes the image URLs relative.
    image_base: String,
    /// Every succeeded job's URL instead of its image's
    /// ([`SimControl::set_result_url_override`]).
    url_override: Option<String>,
}

impl OutputLinks {
    fn url_of(&self, job: &SimJob) -> String {
        match &self.url_override {
            Some(url) => url.clone(),
            None => format!(
                "{}/v1/jobs/{}/image.{}",
                self.image_base,
                job.job_id,
                job.output_format().extension()
            ),
        }
    }
}

impl SimJob {
    /// Still fetching or drawing its photo.
    fn is_drawing(&self) -> bool {
        matches!(
            self.photo,
            Some(PhotoJob {
                comic: Comic::Drawing,
                ..
            })
        )
    }

    /// Ended at `now`: cancelled, or its `done_at` has come and its photo
    /// (if any) is drawn or failed.
    fn is_done(&self, now: Instant) -> bool {
        self.cancelled || (self.done_at <= now && !self.is_drawing())
    }

    /// When it ended, or will at the earliest: its `done_at`, or later for
    /// a photo drawn after it.
    fn finished_at(&self) -> Instant {
        match &self.photo {
            Some(PhotoJob {
                comic: Comic::Drawn { at, .. } | Comic::Failed { at, .. },
                ..
            }) => self.done_at.max(*at),
            _ => self.done_at,
        }
    }

    /// Why it ends `failed`, if it does.
    fn failure(&self) -> Option<&str> {
        if self.will_fail {
            return Some("generation failed");
        }
        match &self.photo {
            Some(PhotoJob {
                comic: Comic::Failed { error, .. },
                ..
            }) => Some(error),
            _ => None,
        }
    }

    /// Ended `succeeded` at `now`: it has an output.
    fn has_succeeded(&self, now: Instant) -> bool {
        !self.cancelled && self.is_done(now) && self.failure().is_none()
    }

    fn output_format(&self) -> OutputFormat {
        match self.photo {
            Some(_) => OutputFormat::Png,
            None => OutputFormat::Svg,
        }
    }

    /// The job as `GET /v1/jobs/{id}` answers it at `now`, its URL written
    /// by `links`.
    fn view(&self, now: Instant, links: &OutputLinks) -> Value {
        if self.cancelled {
            return json!({ "job_id": self.job_id, "status": "cancelled" });
        }
        if !self.is_done(now) {
            return json!({ "job_id": self.job_id, "status": "running" });
        }
        if let Some(error) = self.failure() {
            return json!({ "job_id": self.job_id, "status": "failed", "error": error });
        }
        let excerpt: String = self.prompt.chars().take(PROMPT_EXCERPT_CHARS).collect();
        json!({
            "job_id": self.job_id,
            "status": "succeeded",
            "result": {
                "content": [{
                    "type": "image",
                    "url": links.url_of(self),
                    "text": format!("{} for {}", self.kind, excerpt),
                }],
                "score": self.score,
            },
        })
    }
}

/// How long one job takes: `median`, or with a `p99`, a log-normal sample
/// with that median and 99th percentile (sigma = ln(p99 / median) / z99).
fn job_latency(median: Duration, p99: Option<Duration>) -> Duration {
    const Z99: f64 = 2.326_347_874;
    let Some(p99) = p99.filter(|p| *p > median && !median.is_zero()) else {
        return median;
    };
    let sigma = (p99.as_secs_f64() / median.as_secs_f64()).ln() / Z99;
    // Box-Muller: a standard normal from two uniforms.
    let (u1, u2) = (
        rand::random::<f64>().max(f64::MIN_POSITIVE),
        rand::random::<f64>(),
    );
    let normal = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    median.mul_f64((sigma * normal).exp().min(1e6))
}

/// Everything the simulator knows, behind one lock.
#[derive(Debug)]
struct SimState {
    config: SimConfig,
    down: bool,
    jobs: HashMap<String, SimJob>,
    job_id_by_key: HashMap<String, String>,
    /// Job ids, oldest first, for forgetting old jobs: memory is bounded
    /// (see [`SimState::forget_old_jobs`]).
    created: VecDeque<String>,
    /// Jobs kept at most (finished ones beyond it are forgotten).
    max_jobs: usize,
    /// `done_at` of every job not yet seen past it, earliest on top: they
    /// are popped as time passes. Each job is pushed once and popped once,
    /// O(log n) each.
    unfinished: BinaryHeap<Reverse<Instant>>,
    /// `done_at` of the jobs cancelled before it, popped as `unfinished`
    /// is: always a part of `unfinished`, so the running count is the
    /// difference of the two lengths.
    cancelled_unfinished: BinaryHeap<Reverse<Instant>>,
    submits: u64,
    polls: u64,
    max_concurrent_jobs: u64,
    missing_key: u64,
    refused: u64,
    faults: SimFaults,
    /// Submits still to be answered 503 after an unclear answer
    /// ([`SimFaults::unavailable_after_unclear`]).
    refuse_submits: u64,
    unclear_answers: u64,
    cancelled: u64,
    cancel_requests: u64,
    /// Jobs still to be created `failed` ([`SimControl::fail_next`]).
    fail_next: u64,
    /// The 99th percentile of job times ([`SimControl::set_latency_p99`]).
    latency_p99: Option<Duration>,
    /// How succeeded jobs' URLs are written.
    links: OutputLinks,
    /// Image requests answer 302 to this URL instead of the image
    /// ([`SimControl::set_image_redirect`]).
    image_redirect: Option<String>,
    output_fetches: u64,
    /// `done_at` of the photo jobs still drawing their comic, by job id:
    /// those past their `done_at` still run (they left `unfinished`).
    drawing: HashMap<String, Instant>,
}

impl SimState {
    /// Jobs not done at `now` (not cancelled, and `done_at > now` or still
    /// drawing, as [`SimJob::is_done`] says). Forgets the ones that are past their
    /// `done_at`, so `now` must not go back in time between calls (it is
    /// always `Instant::now()`).
    fn running_jobs(&mut self, now: Instant) -> u64 {
        for heap in [&mut self.unfinished, &mut self.cancelled_unfinished] {
            while heap.peek().is_some_and(|Reverse(done_at)| *done_at <= now) {
                heap.pop();
            }
        }
        let overdue_drawing = self.drawing.values().filter(|done_at| **done_at <= now);
        let running = self
            .unfinished
            .len()
            .saturating_sub(self.cancelled_unfinished.len())
            + overdue_drawing.count();
        u64::try_from(running).unwrap_or(u64::MAX)
    }

    /// Forgets the oldest jobs that ended more than [`KEEP_FINISHED`] ago,
    /// and, to make room within `max_jobs`, the oldest ended ones whatever their age (as
    /// a real provider drops old jobs: a poll of one is then 404). A job
    /// still running is never forgotten, so memory is bounded by the jobs
    /// running plus `max_jobs`.
    fn forget_old_jobs(&mut self, now: Instant) {
        while let Some(oldest) = self.created.front() {
            let Some(job) = self.jobs.get(oldest) else {
                self.created.pop_front();
                continue;
            };
            let ended = job.is_done(now);
            let stale = ended && job.finished_at() + KEEP_FINISHED <= now;
            let over = ended && self.created.len() >= self.max_jobs;
            if !(stale || over) {
                break;
            }
            if let Some(job) = self.jobs.remove(oldest) {
                self.job_id_by_key.remove(&job.key);
            }
            self.created.pop_front();
        }
    }

    /// The output of a job that succeeded has been deleted by `now`
    /// ([`SimConfig::delete_outputs_after`]).
    fn is_output_deleted(&self, job: &SimJob, now: Instant) -> bool {
        self.config
            .delete_outputs_after
            .and_then(|after| job.finished_at().checked_add(after))
            .is_some_and(|deleted_at| deleted_at <= now)
    }

    /// A new job of `body` made at `now` under `key` (not filed yet).
    fn new_job(&mut self, key: String, body: &Value, prompt: String, now: Instant) -> SimJob {
        let job_uuid = uuid::Uuid::new_v4();
        let forced_failure = self.fail_next > 0;
        self.fail_next = self.fail_next.saturating_sub(1);
        let input_url = body
            .get("params")
            .and_then(|params| params.get("input_url"))
            .and_then(Value::as_str);
        let job = SimJob {
            job_id: format!("job-{}", job_uuid.simple()),
            kind: text_field(body, "kind").unwrap_or_else(|| "content".to_owned()),
            prompt,
            done_at: now + job_latency(self.config.latency, self.latency_p99),
            will_fail: forced_failure || rand::random::<f64>() < self.config.fail_rate,
            // The last six hex digits of the id, modulo 1000, like the contract fake.
            score: u64::try_from((job_uuid.as_u128() & 0xFF_FFFF) % 1000).unwrap_or(0),
            cancelled: false,
            key,
            photo: input_url.map(|url| PhotoJob {
                input_url: url.to_owned(),
                comic: Comic::Drawing,
            }),
        };
        tracing::debug!(
            job_id = %job.job_id,
            idempotency_key = %job.key,
            kind = %job.kind,
            latency_ms = u64::try_from(self.config.latency.as_millis()).unwrap_or(u64::MAX),
            will_fail = job.will_fail,
            photo = job.photo.is_some(),
            "simulator created a job"
        );
        job
    }

    fn is_rejected(&self, prompt: &str) -> bool {
        match self.config.reject_word.as_deref() {
            Some(word) if !word.is_empty() => prompt.to_lowercase().contains(&word.to_lowercase()),
            _ => false,
        }
    }
}

/// Cheap clonable handle to the simulator's state; tests use it to change behaviour at run time.
#[derive(Clone)]
pub struct SimControl {
    state: Arc<Mutex<SimState>>,
    /// The client photos are fetched with, made at the first photo job.
    photo_http: Arc<OnceLock<reqwest::Client>>,
}

impl std::fmt::Debug for SimControl {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("SimControl")
            .field("stats", &self.stats())
            .finish()
    }
}

impl SimControl {
    pub fn new(cfg: SimConfig) -> Self {
        Self {
            state: Arc::new(Mutex::new(SimState {
                config: cfg,
                down: false,
                jobs: HashMap::new(),
                job_id_by_key: HashMap::new(),
                created: VecDeque::new(),
                max_jobs: MAX_JOBS,
                unfinished: BinaryHeap::new(),
                cancelled_unfinished: BinaryHeap::new(),
                submits: 0,
                polls: 0,
                max_concurrent_jobs: 0,
                missing_key: 0,
                refused: 0,
                faults: SimFaults::default(),
                refuse_submits: 0,
                unclear_answers: 0,
                cancelled: 0,
                cancel_requests: 0,
                fail_next: 0,
                latency_p99: None,
                links: OutputLinks::default(),
                image_redirect: None,
                output_fetches: 0,
                drawing: HashMap::new(),
            })),
            photo_http: Arc::new(OnceLock::new()),
        }
    }

    /// A panic while holding the lock leaves counters that are still
    /// meaningful, so a poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn stats(&self) -> SimStats {
        let mut state = self.lock();
        let running = state.running_jobs(Instant::now());
        SimStats {
            jobs_created: u64::try_from(state.jobs.len()).unwrap_or(u64::MAX),
            submits: state.submits,
            polls: state.polls,
            max_concurrent_jobs: state.max_concurrent_jobs,
            running,
            missing_key: state.missing_key,
            refused: state.refused,
            unclear_answers: state.unclear_answers,
            cancelled: state.cancelled,
            cancel_requests: state.cancel_requests,
            output_fetches: state.output_fetches,
        }
    }

    /// Replaces the faults in force (see [`SimFaults`]).
    pub fn set_faults(&self, faults: SimFaults) {
        self.lock().faults = faults;
    }

    /// The faults in force (the counts left).
    pub fn faults(&self) -> SimFaults {
        self.lock().faults
    }

    /// The next `n` jobs created end `failed` (whatever `fail_rate` says).
    pub fn fail_next(&self, n: u64) {
        self.lock().fail_next = n;
    }

    /// Polls answer 503 while jobs keep running (`false`: normal again).
    pub fn set_poll_unavailable(&self, on: bool) {
        self.lock().faults.poll_unavailable = on;
    }

    /// True when a poll must answer 503 because of `poll_unavailable`.
    fn poll_refused(&self) -> bool {
        let mut state = self.lock();
        if state.faults.poll_unavailable {
            state.refused += 1;
        }
        state.faults.poll_unavailable
    }

    /// The fault, if any, of the answer to a submit that just created a job.
    fn take_answer_fault(&self) -> Option<AnswerFault> {
        let mut state = self.lock();
        if state.faults.unavailable_after_create > 0 {
            state.faults.unavailable_after_create -= 1;
            state.refused += 1;
            state.refuse_submits += state.faults.unavailable_after_unclear;
            return Some(AnswerFault::Unavailable);
        }
        let fault = if state.faults.drop_after_create > 0 {
            state.faults.drop_after_create -= 1;
            AnswerFault::Drop
        } else if state.faults.cut_body_after_create > 0 {
            state.faults.cut_body_after_create -= 1;
            AnswerFault::Cut
        } else {
            return None;
        };
        state.unclear_answers += 1;
        state.refuse_submits += state.faults.unavailable_after_unclear;
        Some(fault)
    }

    /// True when a submit must answer 503 because an unclear answer came
    /// just before ([`SimFaults::unavailable_after_unclear`]).
    fn submit_refused_after_unclear(&self) -> bool {
        let mut state = self.lock();
        if state.refuse_submits == 0 {
            return false;
        }
        state.refuse_submits -= 1;
        state.refused += 1;
        true
    }

    /// When down: every request answers 503 `{"error":"unavailable"}`.
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Applies to jobs created afterwards.
    pub fn set_latency(&self, latency: Duration) {
        self.lock().config.latency = latency;
    }

    /// Spread the latency: each job takes a log-normal time whose median is
    /// the latency and whose 99th percentile is `p99` (None: every job takes
    /// the latency). Applies to jobs created afterwards.
    pub fn set_latency_p99(&self, p99: Option<Duration>) {
        self.lock().latency_p99 = p99;
    }

    /// Keep at most `n` jobs (tests of the bound; default [`MAX_JOBS`]).
    pub fn set_max_jobs(&self, n: usize) {
        self.lock().max_jobs = n;
    }

    /// Jobs the simulator holds now (running or readable).
    pub fn jobs_held(&self) -> usize {
        self.lock().jobs.len()
    }

    /// Cancels answer 405 `method_not_allowed` and leave the job alone, as
    /// from a provider without cancel (`false`: cancels work again).
    pub fn set_refuse_cancel(&self, refuse: bool) {
        self.lock().config.refuse_cancel = refuse;
    }

    /// Applies to jobs created afterwards.
    pub fn set_fail_rate(&self, rate: f64) {
        self.lock().config.fail_rate = rate;
    }

    /// Outputs are deleted this long after their job ended (None: kept as
    /// long as the job). Applies to every job, the ended ones included.
    pub fn set_delete_outputs_after(&self, after: Option<Duration>) {
        self.lock().config.delete_outputs_after = after;
    }

    /// Every succeeded job's content URL is `url` instead of its image's
    /// (e.g. `http://169.254.169.254/latest/meta-data`), for tests of what
    /// stagehand agrees to fetch. None: the image's URL again.
    pub fn set_result_url_override(&self, url: Option<String>) {
        self.lock().links.url_override = url;
    }

    /// `GET /v1/jobs/{id}/image.*` answers 302 with `Location: url` where it
    /// would answer the image (a redirect out of the provider's origin).
    /// None: the image again.
    pub fn set_image_redirect(&self, url: Option<String>) {
        self.lock().image_redirect = url;
    }

    /// Number of created jobs whose prompt contains `needle` (tests prove no
    /// duplicate jobs with it).
    pub fn jobs_for_prompt(&self, needle: &str) -> usize {
        self.lock()
            .jobs
            .values()
            .filter(|job| job.prompt.contains(needle))
            .count()
    }

    /// True when this request must be answered 503: the simulator is down, or
    /// (for submits and polls) the `unavailable_rate` draw says so.
    fn is_unavailable(&self, draws_outage: bool) -> bool {
        let mut state = self.lock();
        let refused =
            state.down || (draws_outage && rand::random::<f64>() < state.config.unavailable_rate);
        if refused {
            state.refused += 1;
        }
        refused
    }

    /// `POST /v1/jobs` once the body is read: returns the status and the
    /// body. A photo job's photo is fetched and drawn in a task of its own.
    fn submit(&self, idempotency_key: Option<&str>, body: &Value) -> (StatusCode, Value) {
        let (status, view, input_url) = self.create_job(idempotency_key, body);
        if let (Some(url), Some(job_id)) = (input_url, view["job_id"].as_str()) {
            self.spawn_drawing(job_id.to_owned(), url);
        }
        (status, view)
    }

    /// The submit, under the lock: the status, the body, and the input URL
    /// of a photo job it created.
    fn create_job(
        &self,
        idempotency_key: Option<&str>,
        body: &Value,
    ) -> (StatusCode, Value, Option<String>) {
        let mut state = self.lock();
        state.submits += 1;
        let key = match idempotency_key {
            Some(key) => key.to_owned(),
            None => {
                state.missing_key += 1;
                format!("nokey-{}", uuid::Uuid::new_v4().simple())
            }
        };
        let now = Instant::now();
        if let Some(job) = state
            .job_id_by_key
            .get(&key)
            .and_then(|job_id| state.jobs.get(job_id))
        {
            return (StatusCode::OK, job.view(now, &state.links), None);
        }
        let prompt = text_field(body, "prompt").unwrap_or_default();
        if state.is_rejected(&prompt) {
            let refusal =
                json!({ "error": "content_rejected", "message": "input blocked by moderation" });
            return (StatusCode::UNPROCESSABLE_ENTITY, refusal, None);
        }
        let job = state.new_job(key, body, prompt, now);
        let view = job.view(now, &state.links);
        let input_url = job.photo.as_ref().map(|photo| photo.input_url.clone());
        if input_url.is_some() {
            state.drawing.insert(job.job_id.clone(), job.done_at);
        }
        state.forget_old_jobs(now);
        state
            .job_id_by_key
            .insert(job.key.clone(), job.job_id.clone());
        state.unfinished.push(Reverse(job.done_at));
        state.created.push_back(job.job_id.clone());
        state.jobs.insert(job.job_id.clone(), job);
        let running = state.running_jobs(now);
        state.max_concurrent_jobs = state.max_concurrent_jobs.max(running);
        (StatusCode::ACCEPTED, view, input_url)
    }

    /// `GET /v1/jobs/{id}`: returns the status and the body.
    fn poll(&self, job_id: &str) -> (StatusCode, Value) {
        let mut state = self.lock();
        state.polls += 1;
        match state.jobs.get(job_id) {
            Some(job) => (StatusCode::OK, job.view(Instant::now(), &state.links)),
            None => (StatusCode::NOT_FOUND, json!({ "error": "not_found" })),
        }
    }

    /// `POST /v1/jobs/{id}/cancel`: returns the status and the body. A job
    /// still running ends `cancelled` at once (it stops counting as running
    /// from now on); one that had ended keeps its final status. Unknown job:
    /// 404 as a poll; [`SimConfig::refuse_cancel`]: 405, the job untouched.
    fn cancel(&self, job_id: &str) -> (StatusCode, Value) {
        let mut guard = self.lock();
        let state = &mut *guard;
        state.cancel_requests += 1;
        if state.config.refuse_cancel {
            return (
                StatusCode::METHOD_NOT_ALLOWED,
                json!({ "error": "method_not_allowed", "message": "this provider has no cancel" }),
            );
        }
        let now = Instant::now();
        let Some(job) = state.jobs.get_mut(job_id) else {
            return (StatusCode::NOT_FOUND, json!({ "error": "not_found" }));
        };
        if job.is_done(now) {
            return (StatusCode::OK, job.view(now, &state.links));
        }
        job.cancelled = true;
        let (done_at, view) = (job.done_at, job.view(now, &state.links));
        tracing::debug!(job_id, "simulator cancelled a job");
        // Still in `unfinished` unless past its `done_at` (a photo still
        // drawing): then it stops counting as running by leaving `drawing`.
        if done_at > now {
            state.cancelled_unfinished.push(Reverse(done_at));
        }
        state.drawing.remove(job_id);
        state.cancelled += 1;
        (StatusCode::OK, view)
    }
}

impl SimControl {
    /// Where results' images are served from now on (`start` sets it).
    fn set_image_base(&self, base: String) {
        self.lock().links.image_base = base;
    }

    /// A job's output in `format`, counted as a fetch: the image of a job
    /// that succeeded (or the redirect in its place); not found for an
    /// unknown job, one that did not (or not yet) succeed, one whose output
    /// is of the other format, or deleted.
    fn output(&self, job_id: &str, format: OutputFormat) -> OutputAnswer {
        let (kind, prompt) = {
            let mut guard = self.lock();
            let state = &mut *guard;
            state.output_fetches += 1;
            let now = Instant::now();
            let Some(job) = state.jobs.get(job_id) else {
                return OutputAnswer::NotFound;
            };
            if !job.has_succeeded(now)
                || job.output_format() != format
                || state.is_output_deleted(job, now)
            {
                return OutputAnswer::NotFound;
            }
            if let Some(location) = &state.image_redirect {
                return OutputAnswer::Redirect(location.clone());
            }
            if let Some(PhotoJob {
                comic: Comic::Drawn { png, .. },
                ..
            }) = &job.photo
            {
                return OutputAnswer::Png(png.clone());
            }
            (job.kind.clone(), job.prompt.clone())
        };
        OutputAnswer::Svg(picture::draw(&kind, &prompt))
    }

    /// Starts fetching and drawing a photo job's photo in a task of its own
    /// on the runtime the submit runs on. Without one (a submit made outside
    /// any runtime, in a unit test) nothing can fetch: the job fails.
    fn spawn_drawing(&self, job_id: String, input_url: String) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(draw_comic(self.clone(), job_id, input_url));
            }
            Err(_) => {
                let error = "input photo could not be fetched: no runtime to fetch it on";
                self.file_comic(&job_id, Err(error.to_owned()));
            }
        }
    }

    /// Files a photo job's comic, or why there is none: the job ends once
    /// its `done_at` has come too.
    fn file_comic(&self, job_id: &str, outcome: Result<web::Bytes, String>) {
        let mut state = self.lock();
        state.drawing.remove(job_id);
        let Some(photo) = state
            .jobs
            .get_mut(job_id)
            .and_then(|job| job.photo.as_mut())
        else {
            return;
        };
        let at = Instant::now();
        photo.comic = match outcome {
            Ok(png) => Comic::Drawn { png, at },
            Err(error) => {
                tracing::debug!(job_id, %error, "simulator has no comic for a photo job");
                Comic::Failed { error, at }
            }
        };
    }

    /// The client photos are fetched with (made once).
    fn photo_http(&self) -> reqwest::Client {
        self.photo_http
            .get_or_init(|| {
                crate::ai::client::outside_client()
                    .connect_timeout(PHOTO_CONNECT_TIMEOUT)
                    .timeout(PHOTO_FETCH_TIMEOUT)
                    .redirect(reqwest::redirect::Policy::limited(3))
                    .build()
                    .expect("the photo HTTP client configuration is static and valid")
            })
            .clone()
    }
}

/// What `GET /v1/jobs/{id}/image.{svg,png}` answers.
#[derive(Debug)]
enum OutputAnswer {
    Svg(String),
    Png(web::Bytes),
    Redirect(String),
    NotFound,
}

/// Fetches a photo job's photo and draws its comic (on the blocking pool:
/// no actix worker waits on either), then files the outcome. The state lock
/// is taken only to file it.
async fn draw_comic(control: SimControl, job_id: String, input_url: String) {
    let outcome = match fetch_photo(&control.photo_http(), &input_url).await {
        Err(error) => Err(format!("input photo could not be fetched: {error}")),
        Ok(photo) => match tokio::task::spawn_blocking(move || comic::comic(&photo)).await {
            Ok(Ok(png)) => Ok(web::Bytes::from(png)),
            Ok(Err(error)) => Err(format!("input photo could not be decoded: {error}")),
            Err(error) => Err(format!("the comic could not be drawn: {error}")),
        },
    };
    control.file_comic(&job_id, outcome);
}

/// The photo at `url`: a 2xx answer of at most [`MAX_PHOTO_BYTES`], read
/// within [`PHOTO_FETCH_TIMEOUT`]. The errors never quote the URL (a signed
/// one must not end up in a job's error).
async fn fetch_photo(http: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let too_large = || format!("larger than {} MiB", MAX_PHOTO_BYTES / (1024 * 1024));
    let mut answer = http.get(url).send().await.map_err(fetch_failure)?;
    let status = answer.status();
    if !status.is_success() {
        return Err(format!("HTTP {status}"));
    }
    let announced = answer.content_length().unwrap_or(0);
    if usize::try_from(announced).map_or(true, |length| length > MAX_PHOTO_BYTES) {
        return Err(too_large());
    }
    let mut photo = Vec::new();
    while let Some(chunk) = answer.chunk().await.map_err(fetch_failure)? {
        if photo.len() + chunk.len() > MAX_PHOTO_BYTES {
            return Err(too_large());
        }
        photo.extend_from_slice(&chunk);
    }
    Ok(photo)
}

/// What went wrong with a photo download, in its innermost error's words
/// (the outer one carries the URL).
fn fetch_failure(error: reqwest::Error) -> String {
    let error = error.without_url();
    if error.is_timeout() {
        return format!("no answer within {} s", PHOTO_FETCH_TIMEOUT.as_secs());
    }
    let mut cause: &(dyn std::error::Error + 'static) = &error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// A JSON field as text: strings as they are, other values in JSON notation.
fn text_field(body: &Value, name: &str) -> Option<String> {
    match body.get(name)? {
        Value::Null => None,
        Value::String(text) => Some(text.clone()),
        other => Some(other.to_string()),
    }
}

fn json_answer(status: StatusCode, body: Value) -> HttpResponse {
    HttpResponse::build(status).json(body)
}

fn unavailable_answer() -> HttpResponse {
    json_answer(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({ "error": "unavailable" }),
    )
}

async fn submit_job(
    control: web::Data<SimControl>,
    request: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    if control.is_unavailable(true) || control.submit_refused_after_unclear() {
        return unavailable_answer();
    }
    let parsed: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(parsed) => parsed,
            Err(_) => return json_answer(StatusCode::BAD_REQUEST, json!({ "error": "bad_json" })),
        }
    };
    if !parsed.is_object() {
        return json_answer(StatusCode::BAD_REQUEST, json!({ "error": "bad_json" }));
    }
    let idempotency_key = request
        .headers()
        .get("Idempotency-Key")
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|key| !key.is_empty());
    let (status, answer) = control.submit(idempotency_key, &parsed);
    // 202 means a job was just created: the place for the unclear faults.
    if status == StatusCode::ACCEPTED {
        let delay = control.faults().submit_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        match control.take_answer_fault() {
            Some(AnswerFault::Cut) => {
                let text = answer.to_string();
                return HttpResponse::build(status)
                    .content_type("application/json")
                    .body(text[..text.len() / 2].to_owned());
            }
            Some(AnswerFault::Drop) => {
                // Headers and half a body, then the connection breaks.
                let text = answer.to_string();
                let half = web::Bytes::from(text[..text.len() / 2].to_owned());
                let body = futures_util::stream::iter([
                    Ok::<_, std::io::Error>(half),
                    Err(std::io::Error::other("simulated dropped connection")),
                ]);
                return HttpResponse::build(status)
                    .content_type("application/json")
                    .streaming(body);
            }
            Some(AnswerFault::Unavailable) => return unavailable_answer(),
            None => {}
        }
    }
    json_answer(status, answer)
}

async fn poll_job(control: web::Data<SimControl>, job_id: web::Path<String>) -> HttpResponse {
    if control.is_unavailable(true) || control.poll_refused() {
        return unavailable_answer();
    }
    if control.faults().poll_not_found {
        control.lock().polls += 1;
        return json_answer(
            StatusCode::NOT_FOUND,
            json!({"error": "not_found", "message": "no such job (for now)"}),
        );
    }
    let (status, answer) = control.poll(&job_id);
    json_answer(status, answer)
}

/// Only a down simulator answers a cancel 503: `unavailable_rate` and
/// `poll_unavailable` are for submits and polls.
async fn cancel_job(control: web::Data<SimControl>, job_id: web::Path<String>) -> HttpResponse {
    if control.is_unavailable(false) {
        return unavailable_answer();
    }
    let (status, answer) = control.cancel(&job_id);
    json_answer(status, answer)
}

/// `GET /v1/jobs/{id}/image.svg`: the picture of a job that succeeded
/// without a photo.
async fn job_svg(control: web::Data<SimControl>, job_id: web::Path<String>) -> HttpResponse {
    serve_output(&control, &job_id, OutputFormat::Svg)
}

/// `GET /v1/jobs/{id}/image.png`: the comic of a photo job that succeeded.
async fn job_png(control: web::Data<SimControl>, job_id: web::Path<String>) -> HttpResponse {
    serve_output(&control, &job_id, OutputFormat::Png)
}

/// A job's image: the same bytes each time (cached a day), a redirect
/// instead ([`SimControl::set_image_redirect`]), or 404 `not_found`. The
/// SVG gets a CSP of its own that allows nothing but its inline drawing, in
/// case it is opened as a page.
fn serve_output(control: &SimControl, job_id: &str, format: OutputFormat) -> HttpResponse {
    if control.is_unavailable(false) {
        return unavailable_answer();
    }
    let image = |content_type: &str| {
        let mut answer = HttpResponse::Ok();
        answer
            .content_type(content_type)
            .insert_header(("Cache-Control", "public, max-age=86400, immutable"))
            .insert_header(("X-Content-Type-Options", "nosniff"));
        answer
    };
    match control.output(job_id, format) {
        OutputAnswer::Svg(svg) => image("image/svg+xml")
            .insert_header((
                "Content-Security-Policy",
                "default-src 'none'; style-src 'unsafe-inline'",
            ))
            .body(svg),
        OutputAnswer::Png(png) => image("image/png").body(png),
        OutputAnswer::Redirect(location) => HttpResponse::Found()
            .insert_header((actix_web::http::header::LOCATION, location))
            .finish(),
        OutputAnswer::NotFound => {
            json_answer(StatusCode::NOT_FOUND, json!({ "error": "not_found" }))
        }
    }
}

async fn serve_stats(control: web::Data<SimControl>) -> HttpResponse {
    if control.is_unavailable(false) {
        return unavailable_answer();
    }
    HttpResponse::Ok().json(control.stats())
}

async fn not_found(control: web::Data<SimControl>) -> HttpResponse {
    if control.is_unavailable(false) {
        return unavailable_answer();
    }
    json_answer(StatusCode::NOT_FOUND, json!({ "error": "not_found" }))
}

/// A simulator serving in the background.
pub struct RunningSim {
    pub addr: SocketAddr,
    pub control: SimControl,
    handle: ServerHandle,
}

impl RunningSim {
    /// Base URL for an [`AiClient`](super::AiClient), e.g. `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops serving at once (open connections are closed) and waits until the
    /// server is down.
    pub async fn stop(self) {
        self.handle.stop(false).await;
    }
}

/// Binds (port 0 allowed), starts the server on the current actix runtime (actix_rt::spawn / tokio spawn of the Server future) and returns at once.
///
/// The server does not listen to OS signals: whoever embeds it (`serve`,
/// `sim-ai`, tests) stops it through [`RunningSim::stop`].
pub async fn start(bind: &str, control: SimControl) -> std::io::Result<RunningSim> {
    let app_control = web::Data::new(control.clone());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(app_control.clone())
            .app_data(web::PayloadConfig::new(MAX_BODY_BYTES))
            .route("/v1/jobs", web::post().to(submit_job))
            .route("/v1/jobs/{job_id}", web::get().to(poll_job))
            .route("/v1/jobs/{job_id}/cancel", web::post().to(cancel_job))
            .route("/v1/jobs/{job_id}/image.svg", web::get().to(job_svg))
            .route("/v1/jobs/{job_id}/image.png", web::get().to(job_png))
            .route("/v1/stats", web::get().to(serve_stats))
            .default_service(web::to(not_found))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .bind(bind)?;
    let addr = server
        .addrs()
        .into_iter()
        .next()
        .ok_or_else(|| std::io::Error::other(format!("no address to bind for {bind:?}")))?;
    // Images are linked at the address the simulator listens on (loopback
    // for an unspecified one: 0.0.0.0 is no address to fetch from).
    let mut image_addr = addr;
    if image_addr.ip().is_unspecified() {
        image_addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    control.set_image_base(format!("http://{image_addr}"));
    let server = server.run();
    let handle = server.handle();
    tokio::spawn(async move {
        if let Err(error) = server.await {
            tracing::error!(%error, "AI simulator stopped with an error");
        }
    });
    Ok(RunningSim {
        addr,
        control,
        handle,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_latency_spreads_around_the_median_up_to_the_p99() {
        let median = Duration::from_millis(100);
        assert_eq!(job_latency(median, None), median);
        let mut samples: Vec<Duration> = (0..20_000)
            .map(|_| job_latency(median, Some(Duration::from_millis(800))))
            .collect();
        samples.sort();
        let at = |q: f64| samples[(q * samples.len() as f64) as usize].as_millis();
        assert!((85..=115).contains(&at(0.5)), "median {}", at(0.5));
        assert!((600..=1000).contains(&at(0.99)), "p99 {}", at(0.99));
    }
    use crate::ai::{AiClient, CancelOutcome, JobOrder, JobStatus};
    use crate::domain::failure::AiFailure;

    fn test_config() -> SimConfig {
        SimConfig {
            latency: Duration::from_millis(50),
            ..SimConfig::default()
        }
    }

    async fn start_sim() -> RunningSim {
        start("127.0.0.1:0", SimControl::new(test_config()))
            .await
            .expect("the simulator starts")
    }

    fn client_for(url: &str) -> AiClient {
        AiClient::new(url, Duration::from_secs(1), Duration::from_secs(2))
    }

    /// A bare reqwest client for requests `AiClient` does not make; installs
    /// the crypto provider reqwest needs, as `AiClient::new` does.
    fn plain_http() -> reqwest::Client {
        crate::ai::client::ensure_crypto_provider();
        reqwest::Client::new()
    }

    fn order(prompt: &str) -> JobOrder {
        JobOrder {
            kind: "panel".to_owned(),
            prompt: prompt.to_owned(),
            params: json!({ "style": "comic" }),
            idempotency_key: uuid::Uuid::new_v4(),
            ..JobOrder::default()
        }
    }

    /// 640x480, served by [`start_photo_server`].
    const SMALL_PNG: &[u8] = include_bytes!("../../tests/fixtures/photo-small.png");

    /// A stand-in for stagehand's signed photo URLs: `/photo.png` (the
    /// fixture), `/gated.png` (the fixture once `gate` is notified),
    /// `/not-a-photo`, `/huge` (21 MiB, no Content-Length), 404 elsewhere.
    struct PhotoServer {
        url: String,
        gate: Arc<tokio::sync::Notify>,
        handle: ServerHandle,
    }

    async fn start_photo_server() -> PhotoServer {
        let gate = Arc::new(tokio::sync::Notify::new());
        let app_gate = web::Data::new(gate.clone());
        let png = || HttpResponse::Ok().content_type("image/png").body(SMALL_PNG);
        let server = HttpServer::new(move || {
            App::new()
                .app_data(app_gate.clone())
                .route("/photo.png", web::get().to(move || async move { png() }))
                .route(
                    "/gated.png",
                    web::get().to(
                        move |gate: web::Data<Arc<tokio::sync::Notify>>| async move {
                            gate.notified().await;
                            png()
                        },
                    ),
                )
                .route(
                    "/not-a-photo",
                    web::get().to(|| async { HttpResponse::Ok().body("<html>hi</html>") }),
                )
                .route("/huge", web::get().to(|| async { huge_answer() }))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        .bind("127.0.0.1:0")
        .expect("the photo server binds");
        let url = format!("http://{}", server.addrs()[0]);
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        PhotoServer { url, gate, handle }
    }

    /// 21 MiB of zeros, streamed without a Content-Length.
    fn huge_answer() -> HttpResponse {
        let chunk = web::Bytes::from(vec![0_u8; 1024 * 1024]);
        let chunks = (0..21).map(move |_| Ok::<_, std::io::Error>(chunk.clone()));
        HttpResponse::Ok()
            .content_type("image/png")
            .streaming(futures_util::stream::iter(chunks))
    }

    fn photo_order(input_url: &str) -> JobOrder {
        JobOrder {
            params: json!({ "style": "comic", "input_url": input_url }),
            ..order("me as a comic")
        }
    }

    /// Polls until the job is final, failing the test past a deadline.
    async fn wait_final(client: &AiClient, job_id: &str) -> crate::ai::JobView {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let view = client.poll(job_id).await.expect("poll");
            if view.status.is_final() {
                return view;
            }
            assert!(Instant::now() < deadline, "{job_id} did not finish in time");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn content_url(view: &crate::ai::JobView) -> String {
        let result = view.result.as_ref().expect("a result");
        result.content[0].url.clone().expect("a URL")
    }

    /// A job with `params.input_url` answers the participant's photo as a
    /// comic PNG, served at `image.png`; its `image.svg` does not exist.
    #[actix_web::test]
    async fn photo_job_result_is_a_comic_png_of_the_photo() {
        let (sim, photos) = (start_sim().await, start_photo_server().await);
        sim.control.set_latency(Duration::ZERO);
        let client = client_for(&sim.url());
        let job = client
            .submit(&photo_order(&format!("{}/photo.png", photos.url)))
            .await
            .expect("submit");
        let view = wait_final(&client, &job.job_id).await;
        assert_eq!(view.status, JobStatus::Succeeded, "{view:?}");
        let url = content_url(&view);
        assert_eq!(
            url,
            format!("{}/v1/jobs/{}/image.png", sim.url(), job.job_id)
        );
        let answer = plain_http().get(&url).send().await.expect("image answer");
        assert_eq!(answer.status(), reqwest::StatusCode::OK);
        assert_eq!(answer.headers()["content-type"], "image/png");
        let png = answer.bytes().await.expect("PNG bytes");
        let comic = image::load_from_memory_with_format(&png, image::ImageFormat::Png)
            .expect("a PNG")
            .to_rgb8();
        let photo = image::load_from_memory(SMALL_PNG)
            .expect("fixture")
            .to_rgb8();
        assert_eq!(comic.dimensions(), photo.dimensions());
        let changed = comic
            .pixels()
            .zip(photo.pixels())
            .filter(|(drawn, original)| drawn != original)
            .count();
        assert!(changed > 640 * 480 / 2, "only {changed} pixels changed");
        let svg = plain_http()
            .get(url.replace("image.png", "image.svg"))
            .send()
            .await
            .expect("SVG answer");
        assert_eq!(svg.status(), reqwest::StatusCode::NOT_FOUND);
        assert_eq!(sim.control.stats().output_fetches, 2);
        sim.stop().await;
        photos.handle.stop(false).await;
    }

    /// The job runs on while its photo is fetched, past its latency, and
    /// counts as running meanwhile.
    #[actix_web::test]
    async fn photo_job_runs_until_its_comic_is_drawn() {
        let (sim, photos) = (start_sim().await, start_photo_server().await);
        sim.control.set_latency(Duration::ZERO);
        let client = client_for(&sim.url());
        let gated = photo_order(&format!("{}/gated.png", photos.url));
        let job = client.submit(&gated).await.expect("submit");
        let view = client.poll(&job.job_id).await.expect("poll");
        assert_eq!(view.status, JobStatus::Running);
        assert_eq!(sim.control.stats().running, 1);
        photos.gate.notify_one();
        let view = wait_final(&client, &job.job_id).await;
        assert_eq!(view.status, JobStatus::Succeeded, "{view:?}");
        assert_eq!(sim.control.stats().running, 0);
        sim.stop().await;
        photos.handle.stop(false).await;
    }

    /// A photo that cannot be fetched or decoded ends the job `failed`,
    /// saying why, without quoting the (signed) URL.
    #[actix_web::test]
    async fn unusable_photos_end_the_job_failed() {
        let (sim, photos) = (start_sim().await, start_photo_server().await);
        sim.control.set_latency(Duration::ZERO);
        let client = client_for(&sim.url());
        let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port");
        let cases = [
            (format!("{}/missing.png", photos.url), "fetched: HTTP 404"),
            (
                format!("{}/not-a-photo", photos.url),
                "decoded: not an image",
            ),
            (
                format!("{}/huge", photos.url),
                "fetched: larger than 20 MiB",
            ),
            (
                format!("http://{closed_port}/p.png"),
                "could not be fetched",
            ),
            ("not a URL".to_owned(), "could not be fetched"),
        ];
        for (url, expected) in cases {
            let job = client.submit(&photo_order(&url)).await.expect("submit");
            let view = wait_final(&client, &job.job_id).await;
            assert_eq!(view.status, JobStatus::Failed, "{url}");
            let error = view.error.expect("an error");
            assert!(error.starts_with("input photo could not be"), "{error}");
            assert!(error.contains(expected), "{url}: {error}");
            assert!(!error.contains(&url), "{error}");
        }
        sim.stop().await;
        photos.handle.stop(false).await;
    }

    /// Once `delete_outputs_after` has passed since the job ended, its
    /// image answers 404 while the job still answers with its URL.
    #[actix_web::test]
    async fn outputs_are_deleted_after_the_configured_time() {
        let sim = start_sim().await;
        sim.control.set_latency(Duration::ZERO);
        let client = client_for(&sim.url());
        let job = client.submit(&order("fleeting")).await.expect("submit");
        let url = content_url(&wait_final(&client, &job.job_id).await);
        let http = plain_http();
        let status = |url: String| {
            let http = http.clone();
            async move { http.get(url).send().await.expect("image answer").status() }
        };
        assert_eq!(status(url.clone()).await, reqwest::StatusCode::OK);
        sim.control
            .set_delete_outputs_after(Some(Duration::from_secs(3_600)));
        assert_eq!(status(url.clone()).await, reqwest::StatusCode::OK);
        sim.control
            .set_delete_outputs_after(Some(Duration::from_millis(50)));
        let deadline = Instant::now() + Duration::from_secs(5);
        while status(url.clone()).await == reqwest::StatusCode::OK {
            assert!(Instant::now() < deadline, "the output was never deleted");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let answer = http.get(&url).send().await.expect("image answer");
        assert_eq!(answer.status(), reqwest::StatusCode::NOT_FOUND);
        let body: Value = answer.json().await.expect("JSON error body");
        assert_eq!(body, json!({ "error": "not_found" }));
        let view = client
            .poll(&job.job_id)
            .await
            .expect("the job still answers");
        assert_eq!(view.status, JobStatus::Succeeded);
        assert_eq!(content_url(&view), url);
        sim.stop().await;
    }

    #[actix_web::test]
    async fn result_url_override_shows_in_the_job_view() {
        let sim = start_sim().await;
        sim.control.set_latency(Duration::ZERO);
        let client = client_for(&sim.url());
        let metadata = "http://169.254.169.254/latest/meta-data";
        sim.control
            .set_result_url_override(Some(metadata.to_owned()));
        let job = client
            .submit(&order("aimed elsewhere"))
            .await
            .expect("submit");
        let view = wait_final(&client, &job.job_id).await;
        assert_eq!(content_url(&view), metadata);
        sim.control.set_result_url_override(None);
        let view = client.poll(&job.job_id).await.expect("poll");
        assert_eq!(
            content_url(&view),
            format!("{}/v1/jobs/{}/image.svg", sim.url(), job.job_id)
        );
        sim.stop().await;
    }

    /// The redirect takes the image's place (an unknown job is still 404),
    /// and every image request is counted, in `/v1/stats` too.
    #[actix_web::test]
    async fn image_redirect_answers_302_and_image_requests_are_counted() {
        let sim = start_sim().await;
        sim.control.set_latency(Duration::ZERO);
        let client = client_for(&sim.url());
        let job = client.submit(&order("moved")).await.expect("submit");
        let url = content_url(&wait_final(&client, &job.job_id).await);
        let elsewhere = "http://127.0.0.1:9/x.png";
        sim.control.set_image_redirect(Some(elsewhere.to_owned()));
        let no_redirects = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("HTTP client");
        let answer = no_redirects.get(&url).send().await.expect("answer");
        assert_eq!(answer.status(), reqwest::StatusCode::FOUND);
        assert_eq!(answer.headers()["location"], elsewhere);
        let unknown = format!("{}/v1/jobs/job-unknown/image.svg", sim.url());
        let answer = no_redirects.get(&unknown).send().await.expect("answer");
        assert_eq!(answer.status(), reqwest::StatusCode::NOT_FOUND);
        sim.control.set_image_redirect(None);
        let answer = no_redirects.get(&url).send().await.expect("answer");
        assert_eq!(answer.status(), reqwest::StatusCode::OK);
        let stats: SimStats = plain_http()
            .get(format!("{}/v1/stats", sim.url()))
            .send()
            .await
            .expect("stats answer")
            .json()
            .await
            .expect("stats JSON");
        assert_eq!(stats.output_fetches, 3);
        sim.stop().await;
    }

    /// Stats from a simulator without `output_fetches` still read.
    #[test]
    fn stats_without_output_fetches_still_deserialize() {
        let stats: SimStats = serde_json::from_value(json!({
            "jobs_created": 1, "submits": 1, "polls": 0, "max_concurrent_jobs": 1,
            "running": 0, "missing_key": 0,
        }))
        .expect("old stats");
        assert_eq!(stats.output_fetches, 0);
    }

    /// Memory is bounded: past `max_jobs`, the oldest finished jobs are
    /// forgotten (a poll of one is then 404, as at a provider that dropped
    /// it), never a running one. Before, every job stayed forever.
    #[actix_web::test]
    async fn old_finished_jobs_are_forgotten() {
        let sim = start_sim().await;
        sim.control.set_max_jobs(3);
        let client = client_for(&sim.url());
        let first = client.submit(&order("first")).await.expect("submit");
        tokio::time::sleep(Duration::from_millis(80)).await;
        for i in 0..5 {
            client
                .submit(&order(&format!("job {i}")))
                .await
                .expect("submit");
        }
        // Five running jobs are kept whatever the bound; the first, ended,
        // is gone.
        assert_eq!(sim.control.jobs_held(), 5);
        assert!(matches!(
            client.poll(&first.job_id).await,
            Err(AiFailure::RequestRejected(_))
        ));
        tokio::time::sleep(Duration::from_millis(80)).await;
        client.submit(&order("one more")).await.expect("submit");
        assert_eq!(
            sim.control.jobs_held(),
            3,
            "ended jobs beyond the bound are forgotten"
        );
    }

    #[actix_web::test]
    async fn same_key_returns_the_same_job() {
        let sim = start_sim().await;
        let client = client_for(&sim.url());
        let order = order("a cat on stage");
        let first = client.submit(&order).await.expect("first submit");
        let second = client.submit(&order).await.expect("second submit");
        assert_eq!(first.job_id, second.job_id);
        let stats = sim.control.stats();
        assert_eq!(stats.jobs_created, 1);
        assert_eq!(stats.submits, 2);
        assert_eq!(stats.missing_key, 0);
        assert_eq!(sim.control.jobs_for_prompt("cat on stage"), 1);
        sim.stop().await;
    }

    #[actix_web::test]
    async fn reject_word_is_content_rejected() {
        let sim = start_sim().await;
        let client = client_for(&sim.url());
        let failure = client
            .submit(&order("something FORBIDDEN here"))
            .await
            .expect_err("moderation refuses");
        assert!(
            matches!(failure, AiFailure::ContentRejected(_)),
            "{failure:?}"
        );
        assert_eq!(sim.control.stats().jobs_created, 0);
        sim.stop().await;
    }

    #[actix_web::test]
    async fn down_simulator_is_unavailable() {
        let sim = start_sim().await;
        let client = client_for(&sim.url());
        sim.control.set_down(true);
        let failure = client
            .submit(&order("a dog"))
            .await
            .expect_err("the simulator is down");
        // A 503 to a create may come after the job was made: unclear, and
        // the same key asked again finds it.
        assert!(matches!(failure, AiFailure::Unclear(_)), "{failure:?}");
        assert_eq!(sim.control.stats().jobs_created, 0);
        sim.control.set_down(false);
        client
            .submit(&order("a dog"))
            .await
            .expect("the simulator is back");
        sim.stop().await;
    }

    #[actix_web::test]
    async fn job_succeeds_with_content() {
        let sim = start_sim().await;
        let client = client_for(&sim.url());
        let submitted = client
            .submit(&order("a juggler in the spotlight"))
            .await
            .expect("submit");
        assert_eq!(submitted.status, JobStatus::Running);
        let deadline = Instant::now() + Duration::from_secs(5);
        let finished = loop {
            let view = client.poll(&submitted.job_id).await.expect("poll");
            if view.status.is_final() {
                break view;
            }
            assert!(Instant::now() < deadline, "the job did not finish in time");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(finished.status, JobStatus::Succeeded);
        let result = finished.result.expect("a succeeded job has a result");
        assert_eq!(result.content.len(), 1);
        assert_eq!(result.content[0].kind, "image");
        assert_eq!(
            result.content[0].text.as_deref(),
            Some("panel for a juggler in the spotlight")
        );
        let score = result.score.expect("a score");
        assert!((0.0..1000.0).contains(&score), "{score}");
        let stats = sim.control.stats();
        assert_eq!(stats.running, 0);
        assert_eq!(stats.max_concurrent_jobs, 1);
        assert!(stats.polls >= 1);
        sim.stop().await;
    }

    /// A result's image is served by the simulator itself, from its own
    /// address, as an SVG: the same bytes for the same job, the prompt
    /// escaped. Before, the URL was `https://sim.invalid/…png`, which no
    /// browser could load.
    #[actix_web::test]
    async fn result_image_is_an_svg_served_by_the_simulator() {
        let sim = start_sim().await;
        sim.control.set_latency(Duration::ZERO);
        let client = client_for(&sim.url());
        let prompt = "<script>alert(1)</script> cats & dogs";
        let comic = JobOrder {
            kind: "comic".to_owned(),
            ..order(prompt)
        };
        let job = client.submit(&comic).await.expect("submit");
        let view = client.poll(&job.job_id).await.expect("poll");
        assert_eq!(view.status, JobStatus::Succeeded);
        let url = view.result.expect("a result").content[0]
            .url
            .clone()
            .expect("an image URL");
        assert_eq!(
            url,
            format!("{}/v1/jobs/{}/image.svg", sim.url(), job.job_id)
        );
        let http = plain_http();
        let mut bodies = Vec::new();
        for _ in 0..2 {
            let answer = http.get(&url).send().await.expect("image answer");
            assert_eq!(answer.status(), reqwest::StatusCode::OK);
            assert_eq!(answer.headers()["content-type"], "image/svg+xml");
            assert_eq!(answer.headers()["x-content-type-options"], "nosniff");
            bodies.push(answer.text().await.expect("SVG text"));
        }
        assert_eq!(bodies[0], bodies[1], "the same job draws the same SVG");
        let svg = &bodies[0];
        assert!(
            svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
            "{svg}"
        );
        assert!(!svg.contains("<script"), "{svg}");
        assert!(
            svg.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{svg}"
        );
        assert!(svg.contains(" &amp; "), "{svg}");
        // Four panels for a comic.
        for n in 1..=4 {
            assert!(svg.contains(&format!(">{n}</text>")), "panel {n}: {svg}");
        }

        // No image for an unknown, a running or a failed job.
        sim.control.set_latency(Duration::from_secs(600));
        let running = client
            .submit(&order("still drawing"))
            .await
            .expect("submit");
        sim.control.set_latency(Duration::ZERO);
        sim.control.fail_next(1);
        let failed = client.submit(&order("broken")).await.expect("submit");
        for job_id in [
            "job-unknown",
            running.job_id.as_str(),
            failed.job_id.as_str(),
        ] {
            let answer = http
                .get(format!("{}/v1/jobs/{job_id}/image.svg", sim.url()))
                .send()
                .await
                .expect("image answer");
            assert_eq!(answer.status(), reqwest::StatusCode::NOT_FOUND, "{job_id}");
        }
        sim.stop().await;
    }

    #[actix_web::test]
    async fn failing_jobs_end_failed() {
        let sim = start_sim().await;
        sim.control.set_fail_rate(1.0);
        sim.control.set_latency(Duration::ZERO);
        let client = client_for(&sim.url());
        let submitted = client.submit(&order("a mime")).await.expect("submit");
        let view = client.poll(&submitted.job_id).await.expect("poll");
        assert_eq!(view.status, JobStatus::Failed);
        assert_eq!(view.error.as_deref(), Some("generation failed"));
        sim.stop().await;
    }

    #[actix_web::test]
    async fn unknown_job_is_a_rejected_request() {
        let sim = start_sim().await;
        let client = client_for(&sim.url());
        let failure = client.poll("job-unknown").await.expect_err("no such job");
        assert!(
            matches!(failure, AiFailure::RequestRejected(_)),
            "{failure:?}"
        );
        sim.stop().await;
    }

    #[actix_web::test]
    async fn stats_are_served_over_http() {
        let sim = start_sim().await;
        let client = client_for(&sim.url());
        client.submit(&order("one")).await.expect("submit");
        let answer = plain_http()
            .get(format!("{}/v1/stats", sim.url()))
            .send()
            .await
            .expect("stats answer");
        assert_eq!(answer.status(), reqwest::StatusCode::OK);
        let stats: SimStats = answer.json().await.expect("stats JSON");
        assert_eq!(stats.jobs_created, 1);
        assert_eq!(stats.submits, 1);
        sim.stop().await;
    }

    #[actix_web::test]
    async fn missing_key_is_counted_and_creates_a_fresh_job() {
        let sim = start_sim().await;
        let http = plain_http();
        for _ in 0..2 {
            let answer = http
                .post(format!("{}/v1/jobs", sim.url()))
                .json(&json!({ "kind": "panel", "prompt": "no key", "params": {} }))
                .send()
                .await
                .expect("submit answer");
            assert_eq!(answer.status(), reqwest::StatusCode::ACCEPTED);
        }
        let stats = sim.control.stats();
        assert_eq!(stats.missing_key, 2);
        assert_eq!(stats.jobs_created, 2);
        sim.stop().await;
    }

    /// The running count and the maximum follow each job's own `done_at`,
    /// also when a later job finishes before an earlier one.
    #[test]
    fn running_count_follows_done_at() {
        let control = SimControl::new(SimConfig {
            latency: Duration::from_secs(600),
            ..SimConfig::default()
        });
        let submit = |prompt: &str| {
            let (status, _) = control.submit(
                Some(&uuid::Uuid::new_v4().to_string()),
                &json!({ "prompt": prompt }),
            );
            assert_eq!(status, StatusCode::ACCEPTED);
        };
        submit("slow one");
        submit("slow two");
        control.set_latency(Duration::from_millis(30));
        submit("quick");
        control.set_latency(Duration::ZERO);
        submit("instant");
        let stats = control.stats();
        assert_eq!(stats.jobs_created, 4);
        assert_eq!(stats.running, 3);
        assert_eq!(stats.max_concurrent_jobs, 3);
        std::thread::sleep(Duration::from_millis(60));
        let stats = control.stats();
        assert_eq!(stats.running, 2);
        assert_eq!(stats.max_concurrent_jobs, 3);
        control.set_latency(Duration::from_secs(600));
        submit("slow three");
        let stats = control.stats();
        assert_eq!(stats.jobs_created, 5);
        assert_eq!(stats.running, 3);
        assert_eq!(stats.max_concurrent_jobs, 3);
    }

    #[actix_web::test]
    async fn unclear_answers_create_the_job_and_the_same_key_finds_it() {
        let sim = start_sim().await;
        let client = client_for(&sim.url());
        sim.control.set_faults(SimFaults {
            drop_after_create: 1,
            cut_body_after_create: 1,
            ..SimFaults::default()
        });
        let dropped = order("dropped");
        let failure = client.submit(&dropped).await.expect_err("dropped");
        assert!(matches!(failure, AiFailure::Unclear(_)), "{failure:?}");
        let cut = order("cut");
        let failure = client.submit(&cut).await.expect_err("cut short");
        assert!(
            matches!(&failure, AiFailure::Unclear(m) if m.contains("malformed")),
            "{failure:?}"
        );
        // Asked again with the same keys: the same jobs, no new one.
        client.submit(&dropped).await.expect("same key again");
        client.submit(&cut).await.expect("same key again");
        let stats = sim.control.stats();
        assert_eq!(stats.jobs_created, 2);
        assert_eq!(stats.unclear_answers, 2);
        assert_eq!(sim.control.faults(), SimFaults::default());
        sim.stop().await;
    }

    #[actix_web::test]
    async fn unavailable_polls_leave_the_job_running() {
        let sim = start_sim().await;
        let client = client_for(&sim.url());
        let job = client.submit(&order("long")).await.expect("submit");
        sim.control.set_poll_unavailable(true);
        let failure = client.poll(&job.job_id).await.expect_err("503");
        assert!(matches!(failure, AiFailure::Unavailable(_)), "{failure:?}");
        assert_eq!(sim.control.stats().running, 1);
        sim.control.set_poll_unavailable(false);
        client.poll(&job.job_id).await.expect("polls answer again");
        sim.stop().await;
    }

    #[actix_web::test]
    async fn cancel_of_a_running_job_ends_it_cancelled() {
        let sim = start_sim().await;
        sim.control.set_latency(Duration::from_secs(600));
        let client = client_for(&sim.url());
        let job = client.submit(&order("endless")).await.expect("submit");
        assert_eq!(sim.control.stats().running, 1);
        let outcome = client.cancel(&job.job_id).await.expect("cancel");
        assert_eq!(outcome, CancelOutcome::Final(JobStatus::Cancelled));
        let stats = sim.control.stats();
        assert_eq!(stats.running, 0);
        assert_eq!(stats.cancelled, 1);
        assert_eq!(stats.cancel_requests, 1);
        let view = client.poll(&job.job_id).await.expect("poll");
        assert_eq!(view.status, JobStatus::Cancelled);
        // Cancelled again: still cancelled, not counted twice.
        let again = client.cancel(&job.job_id).await.expect("cancel again");
        assert_eq!(again, CancelOutcome::Final(JobStatus::Cancelled));
        // The cancelled job no longer counts towards the concurrency maximum.
        client.submit(&order("next")).await.expect("submit");
        let answer = plain_http()
            .get(format!("{}/v1/stats", sim.url()))
            .send()
            .await
            .expect("stats answer");
        let stats: Value = answer.json().await.expect("stats JSON");
        assert_eq!(stats["cancelled"], 1);
        assert_eq!(stats["cancel_requests"], 2);
        assert_eq!(stats["running"], 1);
        assert_eq!(stats["max_concurrent_jobs"], 1);
        sim.stop().await;
    }

    #[actix_web::test]
    async fn cancel_of_a_finished_job_keeps_its_final_status() {
        let sim = start_sim().await;
        sim.control.set_latency(Duration::ZERO);
        let client = client_for(&sim.url());
        let job = client.submit(&order("instant")).await.expect("submit");
        let outcome = client.cancel(&job.job_id).await.expect("cancel");
        assert_eq!(outcome, CancelOutcome::Final(JobStatus::Succeeded));
        let stats = sim.control.stats();
        assert_eq!(stats.cancelled, 0);
        assert_eq!(stats.cancel_requests, 1);
        let view = client.poll(&job.job_id).await.expect("poll");
        assert_eq!(view.status, JobStatus::Succeeded);
        sim.stop().await;
    }

    #[actix_web::test]
    async fn refused_cancel_is_unsupported_and_the_job_runs_to_success() {
        let sim = start_sim().await;
        sim.control.set_refuse_cancel(true);
        let client = client_for(&sim.url());
        let job = client.submit(&order("unstoppable")).await.expect("submit");
        let outcome = client.cancel(&job.job_id).await.expect("cancel");
        assert_eq!(outcome, CancelOutcome::Unsupported);
        let answer = plain_http()
            .post(format!("{}/v1/jobs/{}/cancel", sim.url(), job.job_id))
            .send()
            .await
            .expect("cancel answer");
        assert_eq!(answer.status(), reqwest::StatusCode::METHOD_NOT_ALLOWED);
        let body: Value = answer.json().await.expect("JSON error body");
        assert_eq!(body["error"], "method_not_allowed");
        let stats = sim.control.stats();
        assert_eq!(stats.running, 1);
        assert_eq!(stats.cancelled, 0);
        assert_eq!(stats.cancel_requests, 2);
        let deadline = Instant::now() + Duration::from_secs(5);
        let finished = loop {
            let view = client.poll(&job.job_id).await.expect("poll");
            if view.status.is_final() {
                break view;
            }
            assert!(Instant::now() < deadline, "the job did not finish in time");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(finished.status, JobStatus::Succeeded);
        sim.stop().await;
    }

    /// 404 for an unknown job, as a poll answers; `AiClient::cancel` reads
    /// any 404 as "no cancel here" (it cannot tell the two apart), so an
    /// unknown job is `Unsupported` to it.
    #[actix_web::test]
    async fn cancel_of_an_unknown_job_is_404_and_unsupported_to_the_client() {
        let sim = start_sim().await;
        let client = client_for(&sim.url());
        let outcome = client.cancel("job-unknown").await.expect("cancel");
        assert_eq!(outcome, CancelOutcome::Unsupported);
        let answer = plain_http()
            .post(format!("{}/v1/jobs/job-unknown/cancel", sim.url()))
            .send()
            .await
            .expect("cancel answer");
        assert_eq!(answer.status(), reqwest::StatusCode::NOT_FOUND);
        let body: Value = answer.json().await.expect("JSON error body");
        assert_eq!(body["error"], "not_found");
        assert_eq!(sim.control.stats().cancelled, 0);
        sim.stop().await;
    }

    /// A cancelled job stops counting as running at the cancel, also for
    /// the maximum, and its `done_at` passing later changes nothing.
    #[test]
    fn cancelled_jobs_leave_the_running_count_at_once() {
        let control = SimControl::new(SimConfig {
            latency: Duration::from_secs(600),
            ..SimConfig::default()
        });
        let submit = |prompt: &str| {
            let (status, view) = control.submit(
                Some(&uuid::Uuid::new_v4().to_string()),
                &json!({ "prompt": prompt }),
            );
            assert_eq!(status, StatusCode::ACCEPTED);
            view["job_id"].as_str().expect("a job id").to_owned()
        };
        let slow = submit("slow");
        control.set_latency(Duration::from_millis(30));
        let quick = submit("quick");
        assert_eq!(control.stats().running, 2);
        let (status, view) = control.cancel(&quick);
        assert_eq!(status, StatusCode::OK);
        assert_eq!(view["status"], "cancelled");
        assert_eq!(control.stats().running, 1);
        std::thread::sleep(Duration::from_millis(60));
        // The quick job's done_at has passed: it is not taken off twice.
        assert_eq!(control.stats().running, 1);
        let (_, view) = control.poll(&quick);
        assert_eq!(view["status"], "cancelled");
        control.cancel(&slow);
        control.set_latency(Duration::from_secs(600));
        submit("after");
        let stats = control.stats();
        assert_eq!(stats.running, 1);
        assert_eq!(stats.max_concurrent_jobs, 2);
        assert_eq!(stats.cancelled, 2);
        assert_eq!(stats.cancel_requests, 2);
    }

    #[actix_web::test]
    async fn closed_port_is_unavailable() {
        let sim = start_sim().await;
        let url = sim.url();
        sim.stop().await;
        let failure = client_for(&url)
            .submit(&order("anyone there?"))
            .await
            .expect_err("nobody listens");
        assert!(matches!(failure, AiFailure::Unavailable(_)), "{failure:?}");
    }
}
