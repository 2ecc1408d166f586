//! A recording fake of the AI job API, written from the contract
//! (docs/API.md, docs/PROVIDERS.md, `src/ai/client.rs`), not from the
//! server's code: one instance is one AI account. It serves plain HTTP/1.1
//! on 127.0.0.1 from its own thread and tokio runtime (so it outlives any
//! server process and never waits on the test's thread), and it records
//! every job it makes: its idempotency key, its `params`, when it started
//! and when it ended (at its scheduled time, or when it was cancelled).
//! From the records, [`max_running`] sweeps the start and end instants for
//! the most jobs that ran at once: the number the account's cap is about.
//!
//! The contract it serves:
//! - `POST /v1/jobs` with `Idempotency-Key`, body `{"kind","prompt","params"}`
//!   -> 202 `{"job_id","status"}`; the same key again answers the same job
//!   and makes none; a prompt with the moderation word -> 422
//!   `{"error":"content_rejected"}` and no job.
//! - `GET /v1/jobs/{id}` -> `{"job_id","status","result":{"content":[{"type",
//!   "url","text"}],"score"},"error"}`, status `queued|running|succeeded|
//!   failed|cancelled`.
//! - `POST /v1/jobs/{id}/cancel`: the job as it stands (cancelled now), or
//!   404 / 405 when this account has no cancel.
//!
//! Faults, each drawn from the instance's seeded RNG: a job's latency, a
//! failed job, 503 or 429 (`Retry-After`) on submit (no job made), an
//! unclear submit (the job is made, then the connection is dropped without
//! an answer, or the answer is cut in the middle of its body), 503 on poll,
//! and a delay before the submit's answer.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the account answers to `POST /v1/jobs/{id}/cancel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelMode {
    /// The job is cancelled at once: it stops running.
    Supported,
    /// 404: no such endpoint.
    NotFound,
    /// 405: no such method.
    NotAllowed,
}

/// How one account behaves. Rates are probabilities per request (or per
/// job for `fail_rate` and the latency).
#[derive(Debug, Clone)]
pub struct FakeConfig {
    pub name: String,
    /// Latency of most jobs, uniform in this range (ms).
    pub latency_ms: (u64, u64),
    /// Share of jobs that take `slow_ms` instead.
    pub slow_rate: f64,
    pub slow_ms: (u64, u64),
    pub fail_rate: f64,
    /// A prompt containing this word is refused by moderation (422).
    pub reject_word: Option<String>,
    pub submit_503_rate: f64,
    pub submit_429_rate: f64,
    /// The job is made, then the connection is dropped without an answer.
    pub unclear_drop_rate: f64,
    /// The job is made, then the answer stops in the middle of its body.
    pub unclear_cut_rate: f64,
    pub poll_503_rate: f64,
    /// The submit's answer waits up to this long after the job is made.
    pub submit_delay_ms: u64,
    pub cancel: CancelMode,
    /// The job is made, then the submit is answered 500, 502 or 503 (a
    /// server that failed once the job was made).
    pub made_then_5xx_rate: f64,
}

impl FakeConfig {
    /// A well-behaved account: 100 ms jobs, no faults, cancel supported.
    pub fn calm(name: &str) -> FakeConfig {
        FakeConfig {
            name: name.to_owned(),
            latency_ms: (100, 100),
            slow_rate: 0.0,
            slow_ms: (0, 0),
            fail_rate: 0.0,
            reject_word: None,
            submit_503_rate: 0.0,
            submit_429_rate: 0.0,
            unclear_drop_rate: 0.0,
            unclear_cut_rate: 0.0,
            poll_503_rate: 0.0,
            submit_delay_ms: 0,
            cancel: CancelMode::Supported,
            made_then_5xx_rate: 0.0,
        }
    }
}

/// How a job ends when nobody cancels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
}

/// One job as the account made it.
#[derive(Debug, Clone)]
pub struct JobRecord {
    pub job_id: String,
    pub key: String,
    pub prompt: String,
    pub params: Value,
    pub started: Instant,
    /// When it ends by itself.
    pub scheduled_end: Instant,
    pub cancelled_at: Option<Instant>,
    pub outcome: Outcome,
    /// Submits that carried its key (1 = made once, never asked again).
    pub submits: u32,
    /// Submits of its key whose answer was dropped or cut.
    pub unclear_answers: u32,
    /// Every request about it, in order: `submit 202`, `submit dropped`,
    /// `submit cut`, `submit 503` / `submit 429` (its key sent again and
    /// refused), `poll <status>`, `poll 503`, `cancel <answer>`.
    pub history: Vec<(Instant, String)>,
}

impl JobRecord {
    /// The instant it stopped running (or will stop).
    pub fn end(&self) -> Instant {
        match self.cancelled_at {
            Some(c) if c < self.scheduled_end => c,
            _ => self.scheduled_end,
        }
    }

    pub fn session_id(&self) -> Option<&str> {
        self.params["session_id"].as_str()
    }

    /// The call index of a fan-out (`params.call`), 0 for a single call.
    pub fn call(&self) -> i64 {
        self.params["call"].as_i64().unwrap_or(0)
    }

    /// The last poll of it that the account answered with its status.
    pub fn last_poll(&self) -> Option<Instant> {
        self.history
            .iter()
            .rev()
            .find(|(_, what)| what.starts_with("poll ") && what != "poll 503")
            .map(|(at, _)| *at)
    }

    /// True when some submit of its key got its whole answer (the job id).
    pub fn id_answered(&self) -> bool {
        self.history.iter().any(|(_, what)| what == "submit 202")
    }

    /// True when its key was sent again after an unclear answer and that
    /// submit was refused (503 or 429).
    pub fn refused_after_unclear(&self) -> bool {
        let first_unclear = self
            .history
            .iter()
            .position(|(_, w)| w == "submit dropped" || w == "submit cut");
        first_unclear.is_some_and(|i| {
            self.history[i..]
                .iter()
                .any(|(_, w)| w == "submit 503" || w == "submit 429")
        })
    }

    fn status_at(&self, now: Instant) -> &'static str {
        if self.cancelled_at.is_some_and(|c| c < self.scheduled_end) {
            "cancelled"
        } else if now < self.scheduled_end {
            if now < self.started + Duration::from_millis(20) {
                "queued"
            } else {
                "running"
            }
        } else {
            match self.outcome {
                Outcome::Succeeded => "succeeded",
                Outcome::Failed => "failed",
            }
        }
    }

    fn view(&self, now: Instant) -> Value {
        let status = self.status_at(now);
        let mut v = json!({"job_id": self.job_id, "status": status});
        match status {
            "succeeded" => {
                v["result"] = json!({
                    "content": [{"type": "image",
                                 "url": format!("https://fake.invalid/{}.png", self.job_id),
                                 "text": format!("made from {}", self.prompt)}],
                    "score": (self.job_id.len() * 7 % 100) as f64,
                });
            }
            "failed" => v["error"] = json!("generation failed"),
            _ => {}
        }
        v
    }
}

/// Requests the account answered, by kind (for the report).
#[derive(Debug, Default, Clone)]
pub struct Counters {
    pub submits: u64,
    pub submits_503: u64,
    pub submits_429: u64,
    pub submits_rejected: u64,
    pub unclear_dropped: u64,
    /// Submits that made their job and were answered 5xx.
    pub made_then_5xx: u64,
    pub unclear_cut: u64,
    pub polls: u64,
    pub polls_503: u64,
    pub cancels: u64,
    pub cancels_refused: u64,
}

struct State {
    config: FakeConfig,
    rng: StdRng,
    jobs: Vec<JobRecord>,
    by_key: HashMap<String, usize>,
    by_id: HashMap<String, usize>,
    counters: Counters,
}

/// A running fake account. Its thread stops when the value is dropped.
pub struct RecordingProvider {
    pub url: String,
    pub epoch: Instant,
    state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RecordingProvider {
    pub fn start(config: FakeConfig, seed: u64) -> RecordingProvider {
        let state = Arc::new(Mutex::new(State {
            config,
            rng: StdRng::seed_from_u64(seed),
            jobs: Vec::new(),
            by_key: HashMap::new(),
            by_id: HashMap::new(),
            counters: Counters::default(),
        }));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake provider");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = state.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("fake provider runtime");
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener).expect("tokio listener");
                let accept = async {
                    loop {
                        if let Ok((stream, _)) = listener.accept().await {
                            let _ = stream.set_nodelay(true);
                            tokio::spawn(serve_connection(stream, shared.clone()));
                        }
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stopped => {}
                }
            });
        });
        RecordingProvider {
            url: format!("http://127.0.0.1:{port}"),
            epoch: Instant::now(),
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn name(&self) -> String {
        self.state.lock().unwrap().config.name.clone()
    }

    /// Every job made so far.
    pub fn jobs(&self) -> Vec<JobRecord> {
        self.state.lock().unwrap().jobs.clone()
    }

    pub fn counters(&self) -> Counters {
        self.state.lock().unwrap().counters.clone()
    }

    /// When the last job made so far stops running (None: no job yet).
    pub fn idle_at(&self) -> Option<Instant> {
        self.state
            .lock()
            .unwrap()
            .jobs
            .iter()
            .map(JobRecord::end)
            .max()
    }

    /// Jobs running now.
    pub fn running_now(&self) -> usize {
        let now = Instant::now();
        let state = self.state.lock().unwrap();
        state
            .jobs
            .iter()
            .filter(|j| j.started <= now && now < j.end())
            .count()
    }
}

impl Drop for RecordingProvider {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The most jobs running at one instant, when, and which.
#[derive(Debug, Clone)]
pub struct Peak {
    pub max: usize,
    pub at: Option<Instant>,
    /// Indexes (into the slice given) of the jobs running at that instant.
    pub jobs: Vec<usize>,
}

/// Sweeps the jobs' start (+1) and end (-1) instants in time order, an end
/// before a start at the same instant (a job that ends as another starts
/// did not run beside it).
pub fn max_running(jobs: &[JobRecord]) -> Peak {
    let mut events: Vec<(Instant, i32, usize)> = Vec::with_capacity(jobs.len() * 2);
    for (i, j) in jobs.iter().enumerate() {
        if j.end() > j.started {
            events.push((j.started, 1, i));
            events.push((j.end(), -1, i));
        }
    }
    events.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut live: Vec<usize> = Vec::new();
    let mut peak = Peak {
        max: 0,
        at: None,
        jobs: Vec::new(),
    };
    for (at, delta, i) in events {
        if delta > 0 {
            live.push(i);
            if live.len() > peak.max {
                peak = Peak {
                    max: live.len(),
                    at: Some(at),
                    jobs: live.clone(),
                };
            }
        } else {
            live.retain(|x| *x != i);
        }
    }
    peak
}

impl fmt::Display for JobRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "job {} (key {}, session {}, call {}, ran {} ms{}, submits {}, unclear answers {})",
            self.job_id,
            &self.key[..self.key.len().min(8)],
            self.session_id()
                .map(|s| &s[..s.len().min(8)])
                .unwrap_or("?"),
            self.call(),
            self.end().duration_since(self.started).as_millis(),
            if self.cancelled_at.is_some_and(|c| c < self.scheduled_end) {
                ", cancelled"
            } else {
                ""
            },
            self.submits,
            self.unclear_answers,
        )
    }
}

// ---------------------------------------------------------------- HTTP ---

struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one request; None when the peer closed or sent garbage.
async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Request> {
    let head_end = loop {
        if let Some(p) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
        if buffer.len() > 1 << 20 {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split_whitespace();
    let method = first.next()?.to_owned();
    let path = first.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = buffer[head_end..head_end + length].to_vec();
    buffer.drain(..head_end + length);
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

/// What to send back.
enum Answer {
    Json {
        status: u16,
        body: Value,
        retry_after: Option<u64>,
        delay_ms: u64,
    },
    /// Close the connection without a word.
    Drop { delay_ms: u64 },
    /// A 202 whose body stops half way, then close.
    Cut { body: Value, delay_ms: u64 },
}

fn json(status: u16, body: Value) -> Answer {
    Answer::Json {
        status,
        body,
        retry_after: None,
        delay_ms: 0,
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        503 => "Service Unavailable",
        _ => "Other",
    }
}

async fn serve_connection(mut stream: TcpStream, state: Arc<Mutex<State>>) {
    let mut buffer = Vec::new();
    while let Some(request) = read_request(&mut stream, &mut buffer).await {
        let answer = handle(&state, &request);
        match answer {
            Answer::Json {
                status,
                body,
                retry_after,
                delay_ms,
            } => {
                if delay_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                }
                let body = body.to_string();
                let mut head = format!(
                    "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
                    reason(status),
                    body.len()
                );
                if let Some(s) = retry_after {
                    head.push_str(&format!("retry-after: {s}\r\n"));
                }
                head.push_str("\r\n");
                head.push_str(&body);
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
            }
            Answer::Drop { delay_ms } => {
                if delay_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                }
                return;
            }
            Answer::Cut { body, delay_ms } => {
                if delay_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                }
                let body = body.to_string();
                let half = &body[..body.len() / 2];
                let head = format!(
                    "HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{half}",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.flush().await;
                return;
            }
        }
    }
}

fn handle(state: &Mutex<State>, request: &Request) -> Answer {
    let mut st = state.lock().unwrap();
    let now = Instant::now();
    let path = request.path.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (request.method.as_str(), segments.as_slice()) {
        ("POST", ["v1", "jobs"]) => submit(&mut st, request, now),
        ("GET", ["v1", "jobs", id]) => {
            st.counters.polls += 1;
            let r503 = st.config.poll_503_rate;
            let known = st.by_id.get(*id).copied();
            if st.rng.random_bool(r503) {
                st.counters.polls_503 += 1;
                if let Some(i) = known {
                    st.jobs[i].history.push((now, "poll 503".into()));
                }
                return json(503, json!({"error": "unavailable"}));
            }
            match known {
                Some(i) => {
                    let job = &mut st.jobs[i];
                    let view = job.view(now);
                    job.history.push((
                        now,
                        format!("poll {}", view["status"].as_str().unwrap_or("?")),
                    ));
                    json(200, view)
                }
                None => json(404, json!({"error": "not_found"})),
            }
        }
        ("POST", ["v1", "jobs", id, "cancel"]) => {
            st.counters.cancels += 1;
            if let Some(&i) = st.by_id.get(*id) {
                let mode = st.config.cancel;
                st.jobs[i].history.push((now, format!("cancel {mode:?}")));
            }
            match st.config.cancel {
                CancelMode::NotFound => {
                    st.counters.cancels_refused += 1;
                    json(404, json!({"error": "not_found"}))
                }
                CancelMode::NotAllowed => {
                    st.counters.cancels_refused += 1;
                    json(405, json!({"error": "method_not_allowed"}))
                }
                CancelMode::Supported => match st.by_id.get(*id).copied() {
                    Some(i) => {
                        let job = &mut st.jobs[i];
                        if job.cancelled_at.is_none() && now < job.scheduled_end {
                            job.cancelled_at = Some(now);
                        }
                        json(200, job.view(now))
                    }
                    None => json(404, json!({"error": "not_found"})),
                },
            }
        }
        _ => json(404, json!({"error": "not_found"})),
    }
}

fn submit(st: &mut State, request: &Request, now: Instant) -> Answer {
    st.counters.submits += 1;
    let Some(key) = request.header("Idempotency-Key").map(str::to_owned) else {
        return json(400, json!({"error": "missing_idempotency_key"}));
    };
    let Ok(body) = serde_json::from_slice::<Value>(&request.body) else {
        return json(400, json!({"error": "invalid_json"}));
    };
    let prompt = body["prompt"].as_str().unwrap_or_default().to_owned();
    let (r503, r429) = (st.config.submit_503_rate, st.config.submit_429_rate);
    let known = st.by_key.get(&key).copied();
    // Refusals before anything is made: no job.
    if st.rng.random_bool(r503) {
        st.counters.submits_503 += 1;
        if let Some(i) = known {
            st.jobs[i].history.push((now, "submit 503".into()));
        }
        return json(503, json!({"error": "unavailable"}));
    }
    if st.rng.random_bool(r429) {
        st.counters.submits_429 += 1;
        if let Some(i) = known {
            st.jobs[i].history.push((now, "submit 429".into()));
        }
        return Answer::Json {
            status: 429,
            body: json!({"error": "rate_limited"}),
            retry_after: Some(1),
            delay_ms: 0,
        };
    }
    if let Some(word) = &st.config.reject_word {
        if prompt.contains(word.as_str()) {
            st.counters.submits_rejected += 1;
            return json(
                422,
                json!({"error": "content_rejected", "message": "input blocked by moderation"}),
            );
        }
    }
    let index = match st.by_key.get(&key).copied() {
        Some(i) => {
            st.jobs[i].submits += 1;
            i
        }
        None => {
            let cfg = &st.config;
            let (lat, slow, slow_rate, fail_rate) =
                (cfg.latency_ms, cfg.slow_ms, cfg.slow_rate, cfg.fail_rate);
            let rng = &mut st.rng;
            let ms = if rng.random_bool(slow_rate) {
                rng.random_range(slow.0..=slow.1)
            } else {
                rng.random_range(lat.0..=lat.1)
            };
            let outcome = if rng.random_bool(fail_rate) {
                Outcome::Failed
            } else {
                Outcome::Succeeded
            };
            let job_id = format!("job-{}", uuid::Uuid::new_v4().simple());
            let i = st.jobs.len();
            st.jobs.push(JobRecord {
                job_id: job_id.clone(),
                key: key.clone(),
                prompt,
                params: body["params"].clone(),
                started: now,
                scheduled_end: now + Duration::from_millis(ms),
                cancelled_at: None,
                outcome,
                submits: 1,
                unclear_answers: 0,
                history: Vec::new(),
            });
            st.by_key.insert(key, i);
            st.by_id.insert(job_id, i);
            i
        }
    };
    let view = st.jobs[index].view(now);
    let (drop_rate, cut_rate, delay_max) = (
        st.config.unclear_drop_rate,
        st.config.unclear_cut_rate,
        st.config.submit_delay_ms,
    );
    let delay_ms = if delay_max > 0 {
        st.rng.random_range(0..=delay_max)
    } else {
        0
    };
    // Drawn only when set, so the other draws of a seed stay as they were.
    let made_then_5xx = st.config.made_then_5xx_rate;
    if made_then_5xx > 0.0 && st.rng.random_bool(made_then_5xx) {
        st.counters.made_then_5xx += 1;
        let status = [500, 502, 503][st.rng.random_range(0..3)];
        st.jobs[index].unclear_answers += 1;
        st.jobs[index]
            .history
            .push((now, format!("submit {status} after the job was made")));
        return json(status, json!({"error": "internal_error"}));
    }
    if st.rng.random_bool(drop_rate) {
        st.counters.unclear_dropped += 1;
        st.jobs[index].unclear_answers += 1;
        st.jobs[index].history.push((now, "submit dropped".into()));
        return Answer::Drop { delay_ms };
    }
    if st.rng.random_bool(cut_rate) {
        st.counters.unclear_cut += 1;
        st.jobs[index].unclear_answers += 1;
        st.jobs[index].history.push((now, "submit cut".into()));
        return Answer::Cut {
            body: view,
            delay_ms,
        };
    }
    st.jobs[index].history.push((now, "submit 202".into()));
    Answer::Json {
        status: 202,
        body: view,
        retry_after: None,
        delay_ms,
    }
}
