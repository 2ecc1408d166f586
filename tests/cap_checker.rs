//! A randomized checker that tries to break the AI account cap.
//!
//! Each seed (a u64) makes a random schedule and runs it against real
//! `stagehand serve` processes: one or two AI accounts, each a recording
//! fake of the job API (`tests/support/recording_provider.rs`, written from
//! the API contract) with its own `max_in_flight` in a providers file, and
//! with faults drawn from the seed (job latencies with a slow tail, failed
//! jobs, moderation, 503 and 429 on submit, unclear submits that make the
//! job and then drop the connection or cut the answer, or answer 500, 502
//! or 503 once it is made, 503 on poll, slow submit answers, accounts with
//! and without cancel); several experiences on them (weights, ceilings,
//! fan-out of 2 to 4 calls, `review: before_display`, photo experiences
//! whose guests upload a photo first); participants submitting over HTTP
//! with an Idempotency-Key, duplicates fired at once; guests erasing their
//! session while its saga runs; operators cancelling (some right after the
//! 202), retrying, approving and rejecting, one bulk action; short `AI_TIMEOUT`s (some shorter than the jobs), few attempts,
//! short saga deadlines; kill -9 and SIGTERM of a server process and its
//! restart on the same database, sometimes only after the saga deadline
//! passed. SQLite runs one instance, PostgreSQL two on one database.
//!
//! Once every saga is final and the accounts are idle it checks:
//! - (a) per account, the most jobs running at one instant (a sweep over
//!   the fake's own start and end records) is at most its `max_in_flight`;
//! - (b) no idempotency key made two jobs, no call (session + call index)
//!   had two jobs running at once, every job belongs to a session of the
//!   run, no session took two submissions, no job was made after every
//!   saga had ended;
//! - (c) every session that got a 202 ends COMPLETED or ABORTED (an
//!   erased one: its saga ended and the session answers 410);
//! - (d) `GET /api/admin/providers` says `in_flight` 0 for every account and
//!   experience (a leaked slot shows here);
//! - (e) every booth display got `seq` 1..N without gap or repeat, and for
//!   each of its sessions an event matching how it ended, once (once more
//!   per operator retry).
//!
//! A failing seed prints the seed, the schedule, the violations with their
//! numbers and where the server logs were kept. For each job at a cap peak
//! it names a suspect when the account's record of the job shows one (its
//! key refused after an unclear submit; never polled, its saga cancelled
//! around its submit; a kill during its run; a fan-out call that outlived
//! `AI_TIMEOUT`; polls that stopped before its end; the server's own log
//! line giving it up), and the summary groups the seeds by suspect.
//!
//! A seed fixes the schedule and the fakes' fault draws, not the timing of
//! threads and processes: a replay runs the same schedule, and most
//! violations show again, not always.
//!
//! Run (CI seeds, SQLite and PostgreSQL):
//!   `cargo test --test cap_checker -- --nocapture`
//! Replay one seed: `STAGEHAND_CHECK_SEED=<n> cargo test --test cap_checker
//!   -- --nocapture sqlite` (or `postgres`).
//! Long mode: `STAGEHAND_CHECK_SEEDS=<count>` runs that many seeds from
//!   `STAGEHAND_CHECK_SEED_START` (default 1), a progress line per seed and a
//!   summary line at the end.
//! The PostgreSQL test needs `STAGEHAND_TEST_POSTGRES_URL` (at build time too).

mod support;

#[path = "support/recording_provider.rs"]
mod recording_provider;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use recording_provider::{max_running, CancelMode, FakeConfig, JobRecord, RecordingProvider};
use serde_json::{json, Value};
use support::{Backend, Frame, Server, Socket, TestDb, OPERATOR};

/// The seeds of the CI run, per backend: each showed one or more of the
/// known cap bugs in most runs (a fan-out call that times out while the
/// next one is submitted, a killed worker's saga ended past its deadline,
/// an unclear submit followed by a 503/429, a cancel between the submit and
/// the record of the job id). About 10 s a seed; both backends at once take
/// about 1.5 minutes on 2 cores.
const CI_SEEDS_SQLITE: &[u64] = &[3, 10, 15, 19, 25, 27, 29];
const CI_SEEDS_POSTGRES: &[u64] = &[3, 5, 11, 18, 21, 24, 25];

// ------------------------------------------------------------ schedule ---

#[derive(Debug, Clone)]
struct ProviderPlan {
    name: String,
    cap: i32,
    fake: FakeConfig,
}

#[derive(Debug, Clone)]
struct ExperiencePlan {
    provider: usize,
    weight: u32,
    max_in_flight: i32,
    ai_calls: u32,
    min_success: Option<u32>,
    review: bool,
    /// Guests upload a photo and submit it (`input: photo`).
    photo: bool,
}

#[derive(Debug, Clone)]
struct ServerPlan {
    instances: usize,
    ai_timeout_ms: u64,
    max_attempts: u32,
    saga_deadline_ms: u64,
    lease_ms: u64,
    shutdown_grace_ms: u64,
}

#[derive(Debug, Clone)]
enum Action {
    /// Opens session `session` on `experience` and submits it: `copies`
    /// requests at once with one key, plus one with another key when
    /// `other_key`; an operator cancel `cancel_after_ms` after the 202.
    Submit {
        session: usize,
        experience: usize,
        copies: u32,
        other_key: bool,
        moderated: bool,
        cancel_after_ms: Option<u64>,
    },
    Cancel {
        session: usize,
    },
    /// The guest erases the session (`DELETE /api/sessions/{id}`): a
    /// running saga is cancelled first.
    Erase {
        session: usize,
    },
    Retry {
        session: usize,
    },
    Decide {
        session: usize,
        approve: bool,
    },
    /// Decides every waiting review item (approve unless its hash says no).
    ReviewSweep,
    Bulk {
        action: &'static str,
        experience: usize,
    },
    Kill9 {
        instance: usize,
        down_ms: u64,
    },
    Sigterm {
        instance: usize,
        down_ms: u64,
    },
}

#[derive(Debug, Clone)]
struct Step {
    pause_ms: u64,
    action: Action,
}

#[derive(Debug, Clone)]
struct Schedule {
    seed: u64,
    backend: Backend,
    providers: Vec<ProviderPlan>,
    experiences: Vec<ExperiencePlan>,
    server: ServerPlan,
    sessions: usize,
    steps: Vec<Step>,
}

fn pick<T: Copy>(rng: &mut StdRng, choices: &[T]) -> T {
    choices[rng.random_range(0..choices.len())]
}

impl Schedule {
    fn generate(seed: u64, backend: Backend) -> Schedule {
        let mut rng = StdRng::seed_from_u64(seed);
        // Some schedules kill -9 a server while long jobs run on the first
        // account and the saga deadline is short.
        let kill_mid_job = rng.random_bool(0.4);
        let n_providers = rng.random_range(1..=2);
        let providers: Vec<ProviderPlan> = (0..n_providers)
            .map(|i| {
                let name = format!("acct{i}");
                let fake = FakeConfig {
                    name: name.clone(),
                    latency_ms: (rng.random_range(50..=200), rng.random_range(300..=800)),
                    slow_rate: pick(&mut rng, &[0.0, 0.1, 0.25]),
                    slow_ms: (1_500, pick(&mut rng, &[3_000, 5_000])),
                    fail_rate: pick(&mut rng, &[0.0, 0.05, 0.2]),
                    reject_word: Some("forbidden".into()),
                    submit_503_rate: pick(&mut rng, &[0.0, 0.1, 0.3]),
                    submit_429_rate: pick(&mut rng, &[0.0, 0.05, 0.15]),
                    unclear_drop_rate: pick(&mut rng, &[0.0, 0.1, 0.2]),
                    unclear_cut_rate: pick(&mut rng, &[0.0, 0.1]),
                    poll_503_rate: pick(&mut rng, &[0.0, 0.1, 0.2]),
                    submit_delay_ms: pick(&mut rng, &[0, 100, 300]),
                    made_then_5xx_rate: 0.0,
                    cancel: pick(
                        &mut rng,
                        &[
                            CancelMode::Supported,
                            CancelMode::NotFound,
                            CancelMode::NotAllowed,
                        ],
                    ),
                };
                let mut fake = fake;
                if kill_mid_job && i == 0 {
                    fake.slow_rate = 0.5;
                    fake.slow_ms = (2_500, 6_000);
                }
                ProviderPlan {
                    name,
                    cap: rng.random_range(1..=3),
                    fake,
                }
            })
            .collect();
        let n_experiences = rng.random_range(2..=4);
        let experiences: Vec<ExperiencePlan> = (0..n_experiences)
            .map(|_| {
                let ai_calls = if rng.random_bool(0.5) {
                    1
                } else {
                    rng.random_range(2..=4)
                };
                ExperiencePlan {
                    provider: rng.random_range(0..n_providers),
                    weight: rng.random_range(1..=3),
                    max_in_flight: rng.random_range(1..=4),
                    ai_calls,
                    min_success: (ai_calls > 1 && rng.random_bool(0.5))
                        .then(|| rng.random_range(1..=ai_calls)),
                    review: rng.random_bool(0.3),
                    photo: false,
                }
            })
            .collect();
        let saga_deadline_ms = if kill_mid_job {
            2_500
        } else {
            pick(&mut rng, &[2_500, 4_000, 8_000])
        };
        let server = ServerPlan {
            instances: match backend {
                Backend::Sqlite => 1,
                Backend::Postgres => 2,
            },
            ai_timeout_ms: pick(&mut rng, &[400, 700, 1_200, 3_000]),
            max_attempts: rng.random_range(1..=3),
            saga_deadline_ms,
            lease_ms: pick(&mut rng, &[1_000, 2_000]),
            shutdown_grace_ms: pick(&mut rng, &[200, 1_000]),
        };
        let sessions = rng.random_range(10..=22);
        let mut steps = Vec::new();
        let (mut submitted, mut process_events, mut bulks) = (0usize, 0, 0);
        let max_process_events = rng.random_range(0..=2);
        let mut kill_after = kill_mid_job.then(|| rng.random_range(sessions / 4..=sessions / 2));
        while submitted < sessions {
            if kill_after == Some(submitted) {
                kill_after = None;
                steps.push(Step {
                    pause_ms: pick(&mut rng, &[100, 400, 800]),
                    action: Action::Kill9 {
                        instance: 0,
                        down_ms: pick(&mut rng, &[0, 300, 3_000]),
                    },
                });
            }
            let pause_ms = pick(&mut rng, &[0, 20, 60, 150, 300]);
            let roll: f64 = rng.random();
            let action = if submitted == 0 || roll < 0.55 {
                let session = submitted;
                submitted += 1;
                Action::Submit {
                    session,
                    experience: rng.random_range(0..n_experiences),
                    copies: pick(&mut rng, &[1, 1, 2, 3]),
                    other_key: rng.random_bool(0.15),
                    moderated: rng.random_bool(0.1),
                    cancel_after_ms: rng
                        .random_bool(0.15)
                        .then(|| pick(&mut rng, &[0, 50, 150, 400])),
                }
            } else {
                let session = rng.random_range(0..submitted);
                let roll: f64 = rng.random();
                if roll < 0.3 {
                    Action::Cancel { session }
                } else if roll < 0.5 {
                    Action::Retry { session }
                } else if roll < 0.65 {
                    Action::Decide {
                        session,
                        approve: rng.random_bool(0.7),
                    }
                } else if roll < 0.75 {
                    Action::ReviewSweep
                } else if roll < 0.85 && bulks < 1 {
                    bulks += 1;
                    Action::Bulk {
                        action: pick(&mut rng, &["cancel", "retry", "approve", "reject"]),
                        experience: rng.random_range(0..n_experiences),
                    }
                } else if process_events < max_process_events {
                    process_events += 1;
                    let instance = rng.random_range(0..server.instances);
                    let down_ms = pick(&mut rng, &[0, 300, 1_500, saga_deadline_ms + 1_500]);
                    if rng.random_bool(0.65) {
                        Action::Kill9 { instance, down_ms }
                    } else {
                        Action::Sigterm { instance, down_ms }
                    }
                } else {
                    Action::Cancel { session }
                }
            };
            steps.push(Step { pause_ms, action });
        }
        let mut schedule = Schedule {
            seed,
            backend,
            providers,
            experiences,
            server,
            sessions,
            steps,
        };
        schedule.add_later_faults();
        schedule
    }

    /// The faults added after the CI seeds were chosen, drawn from a second
    /// stream of the seed so that every seed keeps the schedule it had and
    /// gains these on top: creates answered 5xx once their job is made,
    /// photo experiences, and some operator cancels turned into the
    /// guest's erasure.
    fn add_later_faults(&mut self) {
        let mut rng = StdRng::seed_from_u64(self.seed ^ 0x005E_ED0F_1A7E_u64);
        for p in &mut self.providers {
            p.fake.made_then_5xx_rate = pick(&mut rng, &[0.0, 0.1, 0.2]);
        }
        for e in &mut self.experiences {
            e.photo = rng.random_bool(0.35);
        }
        for step in &mut self.steps {
            if let Action::Cancel { session } = step.action {
                if rng.random_bool(0.4) {
                    step.action = Action::Erase { session };
                }
            }
        }
    }

    fn describe(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "schedule of seed {} on {:?}: {} sessions, server {:?}",
            self.seed, self.backend, self.sessions, self.server
        );
        for p in &self.providers {
            let f = &p.fake;
            let _ = writeln!(
                out,
                "  provider {} cap {}: latency {:?} ms, slow {} of jobs at {:?} ms, fail {}, \
                 submit 503 {} 429 {}, unclear drop {} cut {}, 5xx once made {}, poll 503 {}, submit delay <= {} ms, cancel {:?}",
                p.name,
                p.cap,
                f.latency_ms,
                f.slow_rate,
                f.slow_ms,
                f.fail_rate,
                f.submit_503_rate,
                f.submit_429_rate,
                f.unclear_drop_rate,
                f.unclear_cut_rate,
                f.made_then_5xx_rate,
                f.poll_503_rate,
                f.submit_delay_ms,
                f.cancel
            );
        }
        for (i, e) in self.experiences.iter().enumerate() {
            let _ = writeln!(out, "  experience e{i}: {e:?}");
        }
        for (i, s) in self.steps.iter().enumerate() {
            let _ = writeln!(out, "  step {i:>2}: +{:>3} ms {:?}", s.pause_ms, s.action);
        }
        out
    }
}

// ------------------------------------------------------------- the run ---

/// One participant's session as the driver knows it.
#[derive(Debug, Clone, Default)]
struct SessionRec {
    sid: String,
    token: String,
    experience: usize,
    saga_id: Option<String>,
    /// Distinct saga ids that answered 202 (more than one only after the
    /// earlier ones ended ABORTED).
    accepted: HashSet<String>,
    /// Operator retries that may have happened (200, or no answer).
    retries: u32,
    /// When an operator cancel of its saga was answered 200.
    cancels: Vec<Instant>,
    final_status: Option<Value>,
    /// The guest's erasure was answered 2xx: the session answers 410.
    erased: bool,
}

struct Ctx {
    http: reqwest::Client,
    db_url: String,
    ai_url: String,
    env: Vec<(String, String)>,
    instances: RefCell<Vec<Option<Server>>>,
    log_dir: PathBuf,
    logs: Cell<usize>,
    pending: RefCell<Vec<tokio::task::JoinHandle<()>>>,
    notes: RefCell<Vec<String>>,
    /// kill -9 and SIGTERM, when and which instance.
    process_events: RefCell<Vec<(Instant, String)>>,
    epoch: Instant,
    sessions: RefCell<Vec<SessionRec>>,
    slugs: RefCell<Vec<String>>,
    /// The booth terminal of each experience.
    terminals: RefCell<Vec<String>>,
    /// Bulk retries that may have happened, per experience.
    bulk_retries: RefCell<HashMap<usize, u32>>,
    rotate: Cell<usize>,
}

/// What a request of the driver carries.
#[derive(Clone, Copy)]
enum Payload<'a> {
    None,
    Json(&'a Value),
    Png(&'a [u8]),
}

/// The photo guests of photo experiences upload.
const PHOTO: &[u8] = include_bytes!("fixtures/photo-small.png");

/// An HTTP answer; `uncertain` when some try got no answer (the request
/// may have been acted on before the answer was lost).
struct Reply {
    status: u16,
    body: Value,
    uncertain: bool,
}

impl Ctx {
    fn note(&self, text: String) {
        let at = self.epoch.elapsed().as_secs_f64();
        self.notes.borrow_mut().push(format!("+{at:.2}s {text}"));
    }

    fn next_log(&self) -> PathBuf {
        let n = self.logs.get() + 1;
        self.logs.set(n);
        self.log_dir.join(format!("server-{n}.log"))
    }

    async fn start_server(&self) -> Server {
        let log = self.next_log();
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        Server::start_with(&self.db_url, &self.ai_url, &log, &self.http, &env).await
    }

    fn live_bases(&self) -> Vec<String> {
        self.instances
            .borrow()
            .iter()
            .flatten()
            .map(|s| s.base.clone())
            .collect()
    }

    fn live_ports(&self) -> Vec<u16> {
        self.live_bases()
            .iter()
            .filter_map(|b| b.rsplit(':').next()?.parse().ok())
            .collect()
    }

    /// A live instance's base URL, rotating; waits (60 s at most) while
    /// every instance is down.
    async fn base(&self) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let bases = self.live_bases();
            if !bases.is_empty() {
                let n = self.rotate.get();
                self.rotate.set(n + 1);
                return Ok(bases[n % bases.len()].clone());
            }
            if Instant::now() > deadline {
                return Err("no server instance up for 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends until an answer that is not about the moment: a transport
    /// error, a 503 (and a 409 `request_in_progress` when
    /// `retry_in_progress`) is sent again, to any live instance, for 45 s.
    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: Option<&str>,
        key: Option<&str>,
        body: Option<&Value>,
        retry_in_progress: bool,
    ) -> Result<Reply, String> {
        let payload = body.map_or(Payload::None, Payload::Json);
        self.send_until_answered(method, path, bearer, key, payload, retry_in_progress)
            .await
    }

    /// [`Ctx::request`] with any body.
    async fn send_until_answered(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: Option<&str>,
        key: Option<&str>,
        payload: Payload<'_>,
        retry_in_progress: bool,
    ) -> Result<Reply, String> {
        let deadline = Instant::now() + Duration::from_secs(45);
        let mut uncertain = false;
        let mut last = String::new();
        while Instant::now() < deadline {
            let base = self.base().await?;
            let mut req = self.http.request(method.clone(), format!("{base}{path}"));
            if let Some(bearer) = bearer {
                req = req.bearer_auth(bearer);
            }
            if let Some(key) = key {
                req = req.header("Idempotency-Key", key);
            }
            match payload {
                Payload::None => {}
                Payload::Json(body) => req = req.json(body),
                Payload::Png(bytes) => {
                    req = req.header("content-type", "image/png").body(bytes.to_vec());
                }
            }
            match req.send().await {
                Err(e) => {
                    uncertain = true;
                    last = format!("no answer: {e}");
                }
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let body: Value = resp.json().await.unwrap_or(Value::Null);
                    let in_progress = status == 409 && body["error"] == "request_in_progress";
                    if status != 503 && !(retry_in_progress && in_progress) {
                        return Ok(Reply {
                            status,
                            body,
                            uncertain,
                        });
                    }
                    last = format!("HTTP {status}: {body}");
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "{method} {path}: no final answer in 45 s (last: {last})"
        ))
    }

    async fn operator(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Reply {
        self.request(method, path, Some(OPERATOR), None, body, true)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn session_status(&self, i: usize) -> Value {
        let (sid, token) = {
            let s = &self.sessions.borrow()[i];
            (s.sid.clone(), s.token.clone())
        };
        let r = self
            .request(
                reqwest::Method::GET,
                &format!("/api/sessions/{sid}"),
                Some(&token),
                None,
                None,
                true,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        if r.status == 410 && self.sessions.borrow()[i].erased {
            return json!({"session_id": sid, "status": "ERASED"});
        }
        assert_eq!(r.status, 200, "GET session {sid}: {}", r.body);
        r.body
    }

    fn saga_of(&self, i: usize) -> Option<String> {
        self.sessions
            .borrow()
            .get(i)
            .and_then(|s| s.saga_id.clone())
    }
}

fn is_final(status: &Value) -> bool {
    if status["status"] == "ERASED" {
        return true;
    }
    matches!(
        status["status"].as_str(),
        Some("COMPLETED") | Some("ABORTED")
    )
}

/// A booth display that follows its terminal on whichever instance is up,
/// resuming with `after=<last seq>` whenever its socket closes.
struct Watcher {
    terminal_id: String,
    token: String,
    experience: usize,
    events: Rc<RefCell<Vec<Value>>>,
    stop: Rc<Cell<bool>>,
    handle: tokio::task::JoinHandle<()>,
}

fn watch(ctx: Rc<Ctx>, terminal_id: String, token: String, experience: usize) -> Watcher {
    let events: Rc<RefCell<Vec<Value>>> = Rc::default();
    let stop: Rc<Cell<bool>> = Rc::default();
    let handle = {
        let (events, stop) = (events.clone(), stop.clone());
        let (tid, tok) = (terminal_id.clone(), token.clone());
        actix_web::rt::spawn(async move {
            let mut socket: Option<Socket> = None;
            let mut last_seq = 0i64;
            let mut turn = 0usize;
            while !stop.get() {
                let Some(s) = socket.as_mut() else {
                    let ports = ctx.live_ports();
                    if !ports.is_empty() {
                        turn += 1;
                        let port = ports[turn % ports.len()];
                        if let Ok(s) = Socket::try_connect(port, &tid, &tok, last_seq).await {
                            socket = Some(s);
                            continue;
                        }
                    }
                    // A real display's pause before it reconnects.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                match s.next_frame(Duration::from_millis(200)).await {
                    Frame::TimedOut => {}
                    Frame::Closed(_) => socket = None,
                    Frame::Json(v) => {
                        if v["type"]
                            .as_str()
                            .is_some_and(|t| t.starts_with("session."))
                        {
                            if let Some(seq) = v["seq"].as_i64() {
                                last_seq = seq;
                            }
                            events.borrow_mut().push(v);
                        }
                    }
                }
            }
        })
    };
    Watcher {
        terminal_id,
        token,
        experience,
        events,
        stop,
        handle,
    }
}

/// What a seed found.
struct SeedReport {
    seed: u64,
    seconds: f64,
    violations: Vec<String>,
    /// Suspected causes of the cap violations (see [`suspect`]).
    causes: Vec<&'static str>,
    stats: String,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn fmt_at(epoch: Instant, at: Instant) -> String {
    format!("+{:.2}s", at.saturating_duration_since(epoch).as_secs_f64())
}

async fn run_seed(backend: Backend, seed: u64) -> SeedReport {
    let started = Instant::now();
    let started_wall = chrono::Utc::now();
    let schedule = Schedule::generate(seed, backend);
    let fakes: Vec<RecordingProvider> = schedule
        .providers
        .iter()
        .enumerate()
        .map(|(i, p)| {
            RecordingProvider::start(
                p.fake.clone(),
                seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .wrapping_add(i as u64),
            )
        })
        .collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let providers_path = dir.path().join("providers.toml");
    let mut toml = String::new();
    for (p, fake) in schedule.providers.iter().zip(&fakes) {
        let _ = writeln!(
            toml,
            "[providers.{}]\nkind = \"jobs\"\nurl = \"{}\"\nmax_in_flight = {}\n",
            p.name, fake.url, p.cap
        );
    }
    std::fs::write(&providers_path, toml).expect("providers file");
    let db = TestDb::fresh(backend).await;
    let sp = &schedule.server;
    let env: Vec<(String, String)> = [
        ("STAGEHAND_PROVIDERS", providers_path.display().to_string()),
        ("STAGEHAND_AI_TIMEOUT", format!("{}ms", sp.ai_timeout_ms)),
        ("STAGEHAND_MAX_ATTEMPTS", sp.max_attempts.to_string()),
        (
            "STAGEHAND_SAGA_DEADLINE",
            format!("{}ms", sp.saga_deadline_ms),
        ),
        ("STAGEHAND_LEASE", format!("{}ms", sp.lease_ms)),
        (
            "STAGEHAND_SHUTDOWN_GRACE",
            format!("{}ms", sp.shutdown_grace_ms),
        ),
        ("STAGEHAND_CLEANUP_INTERVAL", "1s".into()),
        ("STAGEHAND_AI_POLL_INTERVAL", "50ms".into()),
        ("STAGEHAND_BACKOFF_BASE", "50ms".into()),
        ("STAGEHAND_BACKOFF_MAX", "300ms".into()),
        ("STAGEHAND_BREAKER_COOL_DOWN", "1s".into()),
        ("STAGEHAND_POLL_INTERVAL", "200ms".into()),
        ("STAGEHAND_SESSION_RATE_LIMIT", "off".into()),
        ("STAGEHAND_SUBMISSION_RATE_LIMIT", "off".into()),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b))
    .collect();
    stagehand::ai::client::ensure_crypto_provider();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let ctx = Rc::new(Ctx {
        http,
        db_url: db.url.clone(),
        ai_url: fakes[0].url.clone(),
        env,
        instances: RefCell::new(Vec::new()),
        log_dir: dir.path().to_owned(),
        logs: Cell::new(0),
        pending: RefCell::new(Vec::new()),
        notes: RefCell::new(Vec::new()),
        process_events: RefCell::new(Vec::new()),
        epoch: started,
        sessions: RefCell::new(Vec::new()),
        slugs: RefCell::new(Vec::new()),
        terminals: RefCell::new(Vec::new()),
        bulk_retries: RefCell::new(HashMap::new()),
        rotate: Cell::new(0),
    });
    for _ in 0..sp.instances {
        let server = ctx.start_server().await;
        ctx.instances.borrow_mut().push(Some(server));
    }

    // Experiences, one terminal (and display) each.
    let mut watchers = Vec::new();
    for (i, e) in schedule.experiences.iter().enumerate() {
        let slug = format!("cap-{seed}-e{i}");
        let mut body = json!({
            "slug": slug, "title": format!("Booth {i}"), "kind": "comic",
            "ai_calls": e.ai_calls, "max_in_flight": e.max_in_flight,
            "provider": schedule.providers[e.provider].name, "weight": e.weight,
            "review": if e.review { "before_display" } else { "off" },
        });
        if let Some(m) = e.min_success {
            body["min_success"] = json!(m);
        }
        if e.photo {
            body["input"] = json!("photo");
        }
        let r = ctx
            .operator(reqwest::Method::POST, "/api/experiences", Some(&body))
            .await;
        assert_eq!(r.status, 201, "create experience: {}", r.body);
        let r = ctx
            .operator(
                reqwest::Method::POST,
                "/api/terminals",
                Some(&json!({"experience": slug, "name": "booth"})),
            )
            .await;
        assert_eq!(r.status, 201, "create terminal: {}", r.body);
        let tid = r.body["terminal_id"].as_str().unwrap().to_owned();
        let tok = r.body["token"].as_str().unwrap().to_owned();
        ctx.terminals.borrow_mut().push(tid.clone());
        watchers.push(watch(ctx.clone(), tid, tok, i));
        ctx.slugs.borrow_mut().push(slug);
    }
    ctx.sessions
        .borrow_mut()
        .resize(schedule.sessions, SessionRec::default());

    // The schedule.
    for step in &schedule.steps {
        if step.pause_ms > 0 {
            tokio::time::sleep(Duration::from_millis(step.pause_ms)).await;
        }
        act(&ctx, &schedule, &step.action).await;
    }
    let actions_done = started.elapsed();
    let pending: Vec<_> = ctx.pending.borrow_mut().drain(..).collect();
    for task in pending {
        task.await.expect("a scheduled task panicked");
    }

    let mut violations = Vec::new();
    // (c) every submitted session ends; waiting items are decided.
    let final_budget = Duration::from_millis(sp.saga_deadline_ms) + Duration::from_secs(20);
    let final_deadline = Instant::now() + final_budget;
    loop {
        review_sweep(&ctx, seed).await;
        let mut open = Vec::new();
        let n = ctx.sessions.borrow().len();
        for i in 0..n {
            let needs = {
                let s = &ctx.sessions.borrow()[i];
                s.saga_id.is_some() && s.final_status.is_none()
            };
            if !needs {
                continue;
            }
            let status = ctx.session_status(i).await;
            if is_final(&status) {
                ctx.sessions.borrow_mut()[i].final_status = Some(status);
            } else {
                open.push((i, status));
            }
        }
        if open.is_empty() {
            break;
        }
        if Instant::now() > final_deadline {
            let list: Vec<String> = open
                .iter()
                .take(8)
                .map(|(i, s)| {
                    format!(
                        "s{i} ({}) status {} step {}",
                        &s["session_id"].as_str().unwrap_or("?")[..8],
                        s["status"],
                        s["step"]
                    )
                })
                .collect();
            violations.push(format!(
                "(c) {} sessions not final {:.1}s after the last action: {}",
                open.len(),
                final_budget.as_secs_f64(),
                list.join("; ")
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all_final_at = Instant::now();
    // Jobs each account had made when every saga had ended.
    let jobs_when_final: Vec<usize> = fakes.iter().map(|f| f.jobs().len()).collect();

    // The accounts go idle: every job they made has ended.
    let idle_deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let busy: usize = fakes.iter().map(|f| f.running_now()).sum();
        if busy == 0 {
            break;
        }
        if Instant::now() > idle_deadline {
            violations.push(format!(
                "(b) {busy} jobs still running at the accounts 15 s after every saga was final"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // (d) no slot held once the accounts are idle.
    // The slot adopter looks a job up every couple of seconds at most, and
    // a flaky account may refuse it several times in a row.
    let d_deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut held = Vec::new();
        for base in ctx.live_bases() {
            let r = ctx
                .http
                .get(format!("{base}/api/admin/providers"))
                .bearer_auth(OPERATOR)
                .send()
                .await;
            let Ok(r) = r else { continue };
            let body: Value = r.json().await.unwrap_or(Value::Null);
            for p in body["providers"].as_array().into_iter().flatten() {
                if p["in_flight"].as_i64() != Some(0) {
                    held.push(format!(
                        "{} in_flight {} (cap {})",
                        p["name"], p["in_flight"], p["max_in_flight"]
                    ));
                }
                for e in p["experiences"].as_array().into_iter().flatten() {
                    if e["in_flight"].as_i64().unwrap_or(0) != 0 {
                        held.push(format!("  {} in_flight {}", e["slug"], e["in_flight"]));
                    }
                }
            }
        }
        if held.is_empty() {
            break;
        }
        if Instant::now() > d_deadline {
            violations.push(format!(
                "(d) slots still held 30 s after the accounts went idle: {}; the ledger: {}",
                held.join(", "),
                ledger_rows(&ctx.db_url).await
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // (e) the displays.
    let sessions = ctx.sessions.borrow().clone();
    let bulk_retries = ctx.bulk_retries.borrow().clone();
    for w in &watchers {
        let expected: Vec<usize> = (0..sessions.len())
            .filter(|&i| sessions[i].experience == w.experience && sessions[i].saga_id.is_some())
            .collect();
        // The terminal's newest numbered event, from a fresh socket's hello.
        let mut newest = None;
        for _ in 0..40 {
            if let Some(port) = ctx.live_ports().first().copied() {
                if let Ok(mut probe) = Socket::try_connect(port, &w.terminal_id, &w.token, 0).await
                {
                    if let Some(hello) = probe.next_of_type("hello", Duration::from_secs(3)).await {
                        newest = hello["last_seq"].as_i64();
                        break;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let newest = newest.unwrap_or(0);
        let got = support::wait_for(Duration::from_secs(10), || {
            let last = w.events.borrow().last().and_then(|e| e["seq"].as_i64());
            async move { (last.unwrap_or(0) >= newest).then_some(()) }
        })
        .await;
        w.stop.set(true);
        let events = w.events.borrow().clone();
        let name = format!("display of e{}", w.experience);
        if got.is_none() {
            violations.push(format!(
                "(e) {name}: got up to seq {:?}, the terminal's newest is {newest} (10 s wait)",
                events.last().map(|e| e["seq"].clone())
            ));
        }
        let seqs: Vec<i64> = events
            .iter()
            .map(|e| e["seq"].as_i64().unwrap_or(-1))
            .collect();
        let want: Vec<i64> = (1..=seqs.len() as i64).collect();
        if seqs != want {
            let bad = seqs
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(seqs.len().min(want.len()));
            violations.push(format!(
                "(e) {name}: seqs not 1..={} at frame #{bad}: {:?}",
                seqs.len(),
                &seqs[bad.saturating_sub(2)..(bad + 3).min(seqs.len())]
            ));
        }
        let mut by_session: HashMap<&str, Vec<&Value>> = HashMap::new();
        for e in &events {
            by_session
                .entry(e["session_id"].as_str().unwrap_or("?"))
                .or_default()
                .push(e);
        }
        let known: HashSet<&str> = expected.iter().map(|&i| sessions[i].sid.as_str()).collect();
        let unexpected = by_session.keys().filter(|k| !known.contains(**k)).count();
        if unexpected > 0 {
            violations.push(format!(
                "(e) {name}: events of {unexpected} sessions that are not its submitted ones"
            ));
        }
        let group_budget = bulk_retries.get(&w.experience).copied().unwrap_or(0);
        let mut over_group = 0u32;
        for &i in &expected {
            let s = &sessions[i];
            let Some(fin) = &s.final_status else { continue };
            // An erased session's display hears its removal: no end to match.
            if s.erased {
                continue;
            }
            let got = by_session.get(s.sid.as_str()).cloned().unwrap_or_default();
            let want_type = match (fin["status"].as_str(), fin["abort_reason"].as_str()) {
                (Some("COMPLETED"), _) => "session.completed",
                (_, Some("INPUT_REJECTED")) => "session.rejected",
                _ => "session.aborted",
            };
            match got.last() {
                None => violations.push(format!(
                    "(e) {name}: no event for s{i}, which ended {} {}",
                    fin["status"], fin["abort_reason"]
                )),
                Some(last) if last["type"] != want_type => violations.push(format!(
                    "(e) {name}: the last event of s{i} is {} (reason {}), the session ended {} {}",
                    last["type"], last["reason"], fin["status"], fin["abort_reason"]
                )),
                _ => {}
            }
            // One end per accepted saga, and one more per operator retry.
            let allowed = s.accepted.len().max(1) as u32 + s.retries;
            if got.len() as u32 > allowed {
                over_group += got.len() as u32 - allowed;
            }
        }
        if over_group > group_budget {
            violations.push(format!(
                "(e) {name}: {over_group} events more than one per end of a session \
                 (operator retries allow {group_budget} more)"
            ));
        }
    }
    for w in watchers {
        let _ = w.handle.await;
    }

    // (a) and (b) from the accounts' records.
    let known_sessions: HashMap<&str, usize> = sessions
        .iter()
        .enumerate()
        .map(|(i, s)| (s.sid.as_str(), i))
        .collect();
    let mut all_keys: HashMap<String, String> = HashMap::new();
    let process_events = ctx.process_events.borrow().clone();
    let server_logs: String = (1..=ctx.logs.get())
        .map(|n| {
            std::fs::read_to_string(ctx.log_dir.join(format!("server-{n}.log"))).unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut causes: HashSet<&'static str> = HashSet::new();
    let mut stats = String::new();
    for (p, fake) in schedule.providers.iter().zip(&fakes) {
        let jobs = fake.jobs();
        let peak = max_running(&jobs);
        let c = fake.counters();
        let _ = write!(
            stats,
            "{}: cap {} max {} jobs {} (submits {}, 503 {}, 429 {}, 422 {}, dropped {}, cut {}, 5xx once made {}, polls {}, poll 503 {}, cancels {}); ",
            p.name, p.cap, peak.max, jobs.len(), c.submits, c.submits_503, c.submits_429,
            c.submits_rejected, c.unclear_dropped, c.unclear_cut, c.made_then_5xx, c.polls,
            c.polls_503, c.cancels
        );
        if peak.max as i32 > p.cap {
            let at = peak.at.map(|a| fmt_at(started, a)).unwrap_or_default();
            // How long the peak lasted: until the first of its jobs ended.
            let lasted = peak
                .jobs
                .iter()
                .map(|&j| jobs[j].end())
                .min()
                .zip(peak.at)
                .map(|(end, at)| end.saturating_duration_since(at).as_micros() as f64 / 1000.0)
                .unwrap_or(0.0);
            let mut text = format!(
                "(a) {} (cap {}) ran {} jobs at once at {at} for {lasted:.1} ms:",
                p.name, p.cap, peak.max
            );
            for &j in &peak.jobs {
                let job = &jobs[j];
                let session = job
                    .session_id()
                    .and_then(|sid| known_sessions.get(sid))
                    .copied();
                let who = session
                    .map(|i| {
                        let s = &sessions[i];
                        let e = &schedule.experiences[s.experience];
                        format!(
                            "s{i} e{} (calls {}) ended {} {} after {} retries",
                            s.experience,
                            e.ai_calls,
                            s.final_status
                                .as_ref()
                                .map(|f| f["status"].clone())
                                .unwrap_or_default(),
                            s.final_status
                                .as_ref()
                                .map(|f| f["abort_reason"].clone())
                                .unwrap_or_default(),
                            s.retries
                        )
                    })
                    .unwrap_or_else(|| "unknown session".into());
                let mut suspect = suspect(
                    job,
                    session.map(|i| &sessions[i]),
                    &schedule,
                    &process_events,
                    peak.at.unwrap_or(job.started),
                );
                // The server's own word on letting the job go, if it said so.
                let gave_up = server_logs.lines().find(|l| {
                    l.contains(&job.job_id) && l.contains("giving up on it and freeing its slot")
                });
                if let (Some(line), Some((label, why))) = (gave_up, suspect.as_mut()) {
                    let at = line.split_whitespace().next().unwrap_or_default();
                    let at = chrono::DateTime::parse_from_rfc3339(at)
                        .ok()
                        .and_then(|t| (t.with_timezone(&chrono::Utc) - started_wall).to_std().ok())
                        .map(|d| started + d);
                    let peak_at = peak.at.unwrap_or(job.started);
                    // It freed the slot this peak used only if it came first.
                    if at.is_some_and(|at| at <= peak_at + Duration::from_millis(5)) {
                        *label = "lingering job given up past its bound (documented)";
                    }
                    let _ = write!(
                        why,
                        "; server log at {}: giving up on it and freeing its slot",
                        at.map(|a| fmt_at(started, a)).unwrap_or_default()
                    );
                }
                let _ = write!(
                    text,
                    "\n      {}..{}: {job} [{who}]",
                    fmt_at(started, job.started),
                    fmt_at(started, job.end())
                );
                if let Some((label, why)) = suspect {
                    let _ = write!(text, "\n        suspect: {label}: {why}");
                    causes.insert(label);
                }
            }
            violations.push(text);
        }
        for job in &jobs {
            if let Some(other) = all_keys.insert(job.key.clone(), job.job_id.clone()) {
                violations.push(format!(
                    "(b) idempotency key {} made two jobs: {other} and {}",
                    job.key, job.job_id
                ));
            }
            match job.session_id().and_then(|sid| known_sessions.get(sid)) {
                None => violations.push(format!(
                    "(b) {} belongs to no session of the run: {job}",
                    p.name
                )),
                Some(&i) => {
                    let calls = schedule.experiences[sessions[i].experience].ai_calls as i64;
                    if job.call() < 0 || job.call() >= calls {
                        violations.push(format!("(b) {job} names a call outside 0..{calls}"));
                    }
                }
            }
        }
        // Two jobs of one call running at once.
        let mut by_call: BTreeMap<(String, i64), Vec<&JobRecord>> = BTreeMap::new();
        for job in &jobs {
            by_call
                .entry((job.session_id().unwrap_or("?").to_owned(), job.call()))
                .or_default()
                .push(job);
        }
        for ((sid, call), mut list) in by_call {
            list.sort_by_key(|j| j.started);
            for pair in list.windows(2) {
                if pair[1].started < pair[0].end() {
                    let i = known_sessions.get(sid.as_str()).copied();
                    violations.push(format!(
                        "(b) session s{} call {call}: two jobs ran at once: {} from {} and {} from {}",
                        i.map(|i| i.to_string()).unwrap_or("?".into()),
                        pair[0],
                        fmt_at(started, pair[0].started),
                        pair[1],
                        fmt_at(started, pair[1].started)
                    ));
                }
            }
        }
    }
    // A job made after every saga ended is a violation, unless the server
    // says its slot adopter made it by sending again the key of a slot
    // whose job id was never recorded: a submit under that slot may never
    // have gone out (the worker died first, or the saga ended first), and
    // the key then makes the job it looks for. That is the one window the
    // ledger's design leaves (docs/PROVIDERS.md); the job is counted and
    // seen to its end, so the cap holds. It is reported, not hidden.
    let mut made_by_adopter = Vec::new();
    for (fake, &at_final) in fakes.iter().zip(&jobs_when_final) {
        for job in fake.jobs().iter().skip(at_final) {
            let by_key = server_logs.lines().any(|l| {
                l.contains(&job.job_id) && l.contains("found the job of an AI slot by its key")
            });
            if by_key {
                made_by_adopter.push(job.job_id.clone());
            } else {
                violations.push(format!(
                    "(b) {job} was made after every saga had ended, not by the slot adopter's key"
                ));
            }
        }
    }
    if !made_by_adopter.is_empty() {
        println!(
            "  note: {} job(s) made after every saga ended by the slot adopter sending a never-recorded key again (the documented window): {made_by_adopter:?}",
            made_by_adopter.len()
        );
    }

    // A session takes a new submission once its saga ended ABORTED (the
    // contract): more than one accepted saga is a violation unless every
    // one but the newest ended ABORTED.
    for (i, s) in sessions.iter().enumerate() {
        if s.accepted.len() <= 1 {
            continue;
        }
        let base = ctx.live_bases().into_iter().next().unwrap_or_default();
        let listed: Value = match ctx
            .http
            .get(format!("{base}/api/admin/sagas?q={}&limit=50", s.sid))
            .bearer_auth(OPERATOR)
            .send()
            .await
        {
            Ok(r) => r.json().await.unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        let mut mine: Vec<&Value> = listed["sagas"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["session_id"] == s.sid.as_str())
            .collect();
        // RFC 3339 UTC times of one format sort as text.
        mine.sort_by_key(|v| v["created_at"].as_str().unwrap_or("").to_owned());
        let earlier_aborted = mine.len() == s.accepted.len()
            && mine[..mine.len() - 1]
                .iter()
                .all(|v| v["step"] == "ABORTED");
        if !earlier_aborted {
            violations.push(format!(
                "(b) s{i} took {} submissions (sagas {:?}) while an earlier one had not ended ABORTED: {mine:?}",
                s.accepted.len(),
                s.accepted
            ));
        }
    }

    let mut ends: BTreeMap<String, usize> = BTreeMap::new();
    for s in &sessions {
        let key = match &s.final_status {
            Some(f) if f["status"] == "COMPLETED" => "COMPLETED".to_owned(),
            Some(f) => f["abort_reason"].as_str().unwrap_or("ABORTED").to_owned(),
            None if s.saga_id.is_none() => "never accepted".to_owned(),
            None => "not final".to_owned(),
        };
        *ends.entry(key).or_default() += 1;
    }
    let _ = write!(
        stats,
        "sessions {ends:?}; actions took {:.1}s, final after {:.1}s",
        actions_done.as_secs_f64(),
        all_final_at.duration_since(started).as_secs_f64()
    );
    let seconds = started.elapsed().as_secs_f64();
    if !violations.is_empty() {
        let kept = dir.keep();
        eprintln!(
            "\n===== cap checker: seed {seed} on {backend:?} FAILED ({seconds:.1}s) =====\n{}\
             process and driver notes:\n  {}\nstats: {stats}\nviolations:\n  {}\n\
             server logs kept in {}\nreplay: STAGEHAND_CHECK_SEED={seed} cargo test --test cap_checker -- --nocapture {}\n",
            schedule.describe(),
            ctx.notes.borrow().join("\n  "),
            violations.join("\n  "),
            kept.display(),
            match backend {
                Backend::Sqlite => "sqlite",
                Backend::Postgres => "postgres",
            }
        );
    }
    drop(ctx);
    let mut causes: Vec<&'static str> = causes.into_iter().collect();
    causes.sort();
    SeedReport {
        seed,
        seconds,
        violations,
        causes,
        stats,
    }
}

/// Why a job at a peak may be one whose slot the server let go while it
/// ran: a label (for the summary) and the evidence, from the account's own
/// record of the job and what the driver did. None: nothing marks it (the
/// server followed it to its end and it stayed within its attempt's time).
fn suspect(
    job: &JobRecord,
    session: Option<&SessionRec>,
    schedule: &Schedule,
    process_events: &[(Instant, String)],
    peak_at: Instant,
) -> Option<(&'static str, String)> {
    let (start, end) = (job.started, job.end());
    let ms = |a: Instant| a.saturating_duration_since(start).as_millis();
    let cancelled_at = job.cancelled_at.filter(|c| *c < job.scheduled_end);
    let last_poll = job.last_poll();
    let abandoned =
        cancelled_at.is_none() && last_poll.is_some_and(|p| p + Duration::from_millis(400) < end);
    let cancel_late = cancelled_at.is_some_and(|c| c >= peak_at);
    let timeout = Duration::from_millis(schedule.server.ai_timeout_ms);
    let outlived_timeout = end.duration_since(start) > timeout + Duration::from_millis(100);
    let mut facts = match last_poll {
        Some(p) => format!("ran {} ms, last polled at {} ms", ms(end), ms(p)),
        None => format!("ran {} ms, never polled", ms(end)),
    };
    if let Some(c) = cancelled_at {
        let _ = write!(
            facts,
            ", cancelled at {} ms (peak at {} ms)",
            ms(c),
            ms(peak_at)
        );
    } else if job.history.iter().any(|(_, w)| w.starts_with("cancel ")) {
        facts.push_str(", a cancel was sent (this account has none)");
    }
    let _ = write!(facts, ", AI_TIMEOUT {} ms", timeout.as_millis());
    let kill = process_events
        .iter()
        .find(|(at, _)| *at + Duration::from_millis(200) >= start && *at <= end)
        .map(|(at, what)| format!("{what} at {} ms", ms(*at)));
    let session_cancel = session.and_then(|s| {
        s.cancels
            .iter()
            .find(|c| **c + Duration::from_millis(1_000) >= start && **c <= end)
            .copied()
    });
    let calls = session
        .map(|s| schedule.experiences[s.experience].ai_calls)
        .unwrap_or(1);
    if let Some(s) = session.and_then(|s| s.final_status.as_ref()) {
        let _ = write!(facts, "; saga ended {} {}", s["status"], s["abort_reason"]);
    }
    if job.refused_after_unclear() {
        let history: Vec<String> = job
            .history
            .iter()
            .filter(|(_, w)| w.starts_with("submit"))
            .map(|(at, w)| format!("{}ms {w}", ms(*at)))
            .collect();
        return Some((
            "unclear submit, then a 503/429",
            format!("its submit's answer was lost, then its key was refused: {history:?}; {facts}"),
        ));
    }
    if last_poll.is_none() && cancelled_at.is_none() {
        if let Some(c) = session_cancel {
            return Some((
                "cancel between submit and the job id",
                format!(
                    "its saga was cancelled {} ms after the job was made (id answered: {}); {facts}",
                    ms(c),
                    job.id_answered()
                ),
            ));
        }
    }
    if let Some(k) = kill {
        if abandoned || last_poll.is_none() || outlived_timeout {
            return Some(("killed worker", format!("{k}; {facts}")));
        }
    }
    if calls > 1 && (outlived_timeout || cancel_late || abandoned) {
        return Some((
            "fan-out call timed out, the next one went on",
            format!("call {} of {calls}; {facts}", job.call()),
        ));
    }
    if last_poll.is_none() && cancelled_at.is_none() {
        return Some((
            "never followed",
            format!("id answered: {}; {facts}", job.id_answered()),
        ));
    }
    if abandoned {
        return Some(("given up while running", facts));
    }
    if cancel_late {
        return Some(("slot let go before its cancel took effect", facts));
    }
    if outlived_timeout {
        return Some(("outlived its attempt", facts));
    }
    None
}

/// Executes one action of the schedule.
async fn act(ctx: &Rc<Ctx>, schedule: &Schedule, action: &Action) {
    use reqwest::Method;
    match action {
        Action::Submit {
            session,
            experience,
            copies,
            other_key,
            moderated,
            cancel_after_ms,
        } => {
            let slug = ctx.slugs.borrow()[*experience].clone();
            let key = uuid::Uuid::new_v4().to_string();
            let tid = ctx.terminals.borrow()[*experience].clone();
            let body = json!({"nickname": format!("e{experience}-s{session}"), "terminal_id": tid});
            let r = ctx
                .request(
                    Method::POST,
                    &format!("/api/experiences/{slug}/sessions"),
                    None,
                    Some(&key),
                    Some(&body),
                    true,
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(r.status, 201, "create session: {}", r.body);
            let sid = r.body["session_id"].as_str().unwrap().to_owned();
            let token = r.body["participant_token"].as_str().unwrap().to_owned();
            {
                let mut all = ctx.sessions.borrow_mut();
                all[*session].sid = sid.clone();
                all[*session].token = token.clone();
                all[*session].experience = *experience;
            }
            let prompt = if *moderated {
                format!("a forbidden comic about s{session}")
            } else {
                format!("a comic about s{session}")
            };
            let body = if schedule.experiences[*experience].photo {
                let r = ctx
                    .send_until_answered(
                        Method::POST,
                        &format!("/api/sessions/{sid}/photo"),
                        Some(&token),
                        Some(&uuid::Uuid::new_v4().to_string()),
                        Payload::Png(PHOTO),
                        true,
                    )
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(r.status, 201, "upload the photo: {}", r.body);
                json!({"photo_id": r.body["photo_id"]})
            } else {
                json!({"prompt": prompt})
            };
            let path = format!("/api/sessions/{sid}/submission");
            let key = uuid::Uuid::new_v4().to_string();
            let other = uuid::Uuid::new_v4().to_string();
            let mut sends = Vec::new();
            for _ in 0..*copies {
                sends.push(ctx.request(
                    Method::POST,
                    &path,
                    Some(&token),
                    Some(&key),
                    Some(&body),
                    false,
                ));
            }
            if *other_key {
                sends.push(ctx.request(
                    Method::POST,
                    &path,
                    Some(&token),
                    Some(&other),
                    Some(&body),
                    false,
                ));
            }
            let mut replies: Vec<Reply> = join_all(sends)
                .await
                .into_iter()
                .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
                .collect();
            if !replies.iter().any(|r| r.status == 202) {
                // The first copy may still run, or its answer was lost:
                // the phone sends it again with the same key.
                let again = ctx
                    .request(
                        Method::POST,
                        &path,
                        Some(&token),
                        Some(&key),
                        Some(&body),
                        true,
                    )
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                replies.push(again);
            }
            let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
            let mut accepted = None;
            {
                let mut all = ctx.sessions.borrow_mut();
                for r in &replies {
                    if r.status == 202 {
                        if let Some(id) = r.body["saga_id"].as_str() {
                            all[*session].accepted.insert(id.to_owned());
                            all[*session].saga_id = Some(id.to_owned());
                            accepted = Some(id.to_owned());
                        }
                    }
                }
            }
            if accepted.is_none() {
                ctx.note(format!("s{session}: submission not accepted: {statuses:?}"));
            }
            if let (Some(saga), Some(ms)) = (accepted, *cancel_after_ms) {
                let c = ctx.clone();
                let session = *session;
                let task = actix_web::rt::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    let status = cancel(&c, session, &saga).await;
                    c.note(format!(
                        "s{session}: cancel {ms} ms after the 202: {status}"
                    ));
                });
                ctx.pending.borrow_mut().push(task);
            }
        }
        Action::Cancel { session } => {
            if let Some(saga) = ctx.saga_of(*session) {
                let status = cancel(ctx, *session, &saga).await;
                ctx.note(format!("s{session}: cancel: {status}"));
            }
        }
        Action::Erase { session } => {
            let (sid, token) = {
                let s = &ctx.sessions.borrow()[*session];
                (s.sid.clone(), s.token.clone())
            };
            let r = ctx
                .request(
                    Method::DELETE,
                    &format!("/api/sessions/{sid}"),
                    Some(&token),
                    Some(&uuid::Uuid::new_v4().to_string()),
                    None,
                    true,
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            if (200..300).contains(&r.status) || r.status == 410 {
                ctx.sessions.borrow_mut()[*session].erased = true;
            }
            ctx.note(format!("s{session}: erase: {}", r.status));
        }
        Action::Retry { session } => {
            if let Some(saga) = ctx.saga_of(*session) {
                let key = uuid::Uuid::new_v4().to_string();
                let r = ctx
                    .request(
                        Method::POST,
                        &format!("/api/admin/sagas/{saga}/retry"),
                        Some(OPERATOR),
                        Some(&key),
                        None,
                        true,
                    )
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                if r.status == 200 || r.uncertain {
                    ctx.sessions.borrow_mut()[*session].retries += 1;
                }
                ctx.note(format!("s{session}: retry: {}", r.status));
            }
        }
        Action::Decide { session, approve } => {
            if let Some(saga) = ctx.saga_of(*session) {
                let verb = if *approve { "approve" } else { "reject" };
                let r = ctx
                    .operator(
                        Method::POST,
                        &format!("/api/admin/sagas/{saga}/{verb}"),
                        None,
                    )
                    .await;
                ctx.note(format!("s{session}: {verb}: {}", r.status));
            }
        }
        Action::ReviewSweep => review_sweep(ctx, schedule.seed).await,
        Action::Bulk { action, experience } => {
            let slug = ctx.slugs.borrow()[*experience].clone();
            let key = uuid::Uuid::new_v4().to_string();
            let body = json!({"action": action, "filter": {"experience": slug}});
            let r = ctx
                .request(
                    Method::POST,
                    "/api/admin/sagas/bulk",
                    Some(OPERATOR),
                    Some(&key),
                    Some(&body),
                    true,
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            if *action == "cancel" && r.body["done"].as_u64().unwrap_or(1) > 0 {
                let now = Instant::now();
                for s in ctx.sessions.borrow_mut().iter_mut() {
                    if s.experience == *experience && s.saga_id.is_some() {
                        s.cancels.push(now);
                    }
                }
            }
            if *action == "retry" {
                let done = if r.uncertain {
                    ctx.sessions.borrow().len() as u32
                } else {
                    r.body["done"].as_u64().unwrap_or(0) as u32
                };
                *ctx.bulk_retries
                    .borrow_mut()
                    .entry(*experience)
                    .or_default() += done;
            }
            ctx.note(format!(
                "bulk {action} on e{experience}: {} {}",
                r.status, r.body
            ));
        }
        Action::Kill9 { instance, down_ms } => {
            let taken = ctx.instances.borrow_mut()[*instance].take();
            match taken {
                None => ctx.note(format!(
                    "kill -9 of instance {instance}: it is down, skipped"
                )),
                Some(mut server) => {
                    server.kill9();
                    ctx.process_events
                        .borrow_mut()
                        .push((Instant::now(), format!("kill -9 of instance {instance}")));
                    ctx.note(format!(
                        "kill -9 of instance {instance} (pid {}), down {down_ms} ms",
                        server.pid
                    ));
                    drop(server);
                    restart_later(ctx, *instance, Duration::from_millis(*down_ms), None);
                }
            }
        }
        Action::Sigterm { instance, down_ms } => {
            let taken = ctx.instances.borrow_mut()[*instance].take();
            match taken {
                None => ctx.note(format!(
                    "SIGTERM of instance {instance}: it is down, skipped"
                )),
                Some(server) => {
                    server.sigterm();
                    ctx.process_events
                        .borrow_mut()
                        .push((Instant::now(), format!("SIGTERM of instance {instance}")));
                    ctx.note(format!(
                        "SIGTERM of instance {instance} (pid {}), down {down_ms} ms after it exits",
                        server.pid
                    ));
                    restart_later(
                        ctx,
                        *instance,
                        Duration::from_millis(*down_ms),
                        Some(server),
                    );
                }
            }
        }
    }
}

/// Restarts instance `i` after `down` (after the terminated `exiting`
/// process has exited, when given).
fn restart_later(ctx: &Rc<Ctx>, i: usize, down: Duration, exiting: Option<Server>) {
    let c = ctx.clone();
    let task = actix_web::rt::spawn(async move {
        if let Some(mut server) = exiting {
            let status = server.exited(Duration::from_secs(30)).await;
            c.note(format!(
                "instance {i} (pid {}) exited: {status:?}",
                server.pid
            ));
            if status.is_none() {
                server.kill9();
            }
        }
        tokio::time::sleep(down).await;
        let server = c.start_server().await;
        c.note(format!("instance {i} restarted (pid {})", server.pid));
        c.instances.borrow_mut()[i] = Some(server);
    });
    ctx.pending.borrow_mut().push(task);
}

/// Decides every waiting review item: approved, or rejected when the
/// seed's hash of its saga id says so (one in four).
async fn review_sweep(ctx: &Rc<Ctx>, seed: u64) {
    let r = ctx
        .operator(reqwest::Method::GET, "/api/admin/review?limit=500", None)
        .await;
    let items = r.body["items"].as_array().cloned().unwrap_or_default();
    for item in items {
        let Some(saga) = item["saga_id"].as_str() else {
            continue;
        };
        let h = saga
            .bytes()
            .fold(seed, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        let verb = if h % 4 == 0 { "reject" } else { "approve" };
        let r = ctx
            .operator(
                reqwest::Method::POST,
                &format!("/api/admin/sagas/{saga}/{verb}"),
                None,
            )
            .await;
        ctx.note(format!("review {verb} {}: {}", &saga[..8], r.status));
    }
}

/// The seeds to run: `STAGEHAND_CHECK_SEED` (one), `STAGEHAND_CHECK_SEEDS`
/// from `STAGEHAND_CHECK_SEED_START`, or the CI list.
fn seeds(ci: &[u64]) -> Vec<u64> {
    if let Some(one) = env_u64("STAGEHAND_CHECK_SEED") {
        return vec![one];
    }
    if let Some(count) = env_u64("STAGEHAND_CHECK_SEEDS") {
        let start = env_u64("STAGEHAND_CHECK_SEED_START").unwrap_or(1);
        return (start..start + count).collect();
    }
    ci.to_vec()
}

async fn check_seeds(backend: Backend, ci: &[u64]) {
    let seeds = seeds(ci);
    let started = Instant::now();
    let mut failed: Vec<(u64, Vec<String>)> = Vec::new();
    let mut by_cause: BTreeMap<&'static str, Vec<u64>> = BTreeMap::new();
    let mut slowest = 0f64;
    for (n, &seed) in seeds.iter().enumerate() {
        eprintln!(
            "cap checker {backend:?}: seed {seed} ({} of {})",
            n + 1,
            seeds.len()
        );
        let report = Box::pin(run_seed(backend, seed)).await;
        eprintln!(
            "cap checker {backend:?}: seed {} {} in {:.1}s: {}",
            report.seed,
            if report.violations.is_empty() {
                "ok".to_owned()
            } else {
                format!("FAILED ({} violations)", report.violations.len())
            },
            report.seconds,
            report.stats
        );
        for cause in &report.causes {
            by_cause.entry(cause).or_default().push(report.seed);
        }
        slowest = slowest.max(report.seconds);
        if !report.violations.is_empty() {
            failed.push((report.seed, report.violations));
        }
    }
    let mut by_invariant: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (seed, vs) in &failed {
        let mut kinds: Vec<String> = vs.iter().map(|v| v[..3].to_owned()).collect();
        kinds.dedup();
        for k in kinds.into_iter().collect::<HashSet<_>>() {
            by_invariant.entry(k).or_default().push(*seed);
        }
    }
    for seeds in by_invariant.values_mut() {
        seeds.sort();
    }
    let summary = format!(
        "cap checker {backend:?}: {} seeds in {:.1}s (slowest {slowest:.1}s), {} failed: {:?}; \
         by invariant: {:?}; cap violations by suspected cause: {:?}",
        seeds.len(),
        started.elapsed().as_secs_f64(),
        failed.len(),
        failed.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        by_invariant,
        by_cause
    );
    eprintln!("{summary}");
    if !failed.is_empty() {
        let mut text = summary.clone();
        for (seed, vs) in &failed {
            let _ = write!(text, "\nseed {seed}:\n  {}", vs.join("\n  "));
        }
        panic!("{text}");
    }
}

/// An operator's cancel of `session`'s saga; a 200 is remembered with its
/// time. Returns the status.
async fn cancel(ctx: &Ctx, session: usize, saga: &str) -> u16 {
    let r = ctx
        .operator(
            reqwest::Method::POST,
            &format!("/api/admin/sagas/{saga}/cancel"),
            None,
        )
        .await;
    if r.status == 200 {
        ctx.sessions.borrow_mut()[session]
            .cancels
            .push(Instant::now());
    }
    r.status
}

/// The rows of the slot ledger with their sagas, for a report.
async fn ledger_rows(db_url: &str) -> String {
    use sea_orm::{ConnectionTrait, Database};
    let Ok(db) = Database::connect(db_url).await else {
        return "<database unreachable>".into();
    };
    let sql = "SELECT l.saga_id, l.call_index, l.key_attempt, l.job_id, l.detached, \
               l.adopted_until_ms, l.cancel_tried, s.step, s.lock_token IS NOT NULL, \
               s.deadline_at_ms FROM ai_slots l LEFT JOIN sagas s ON s.id = l.saga_id";
    let rows = match db
        .query_all_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            sql.to_owned(),
        ))
        .await
    {
        Ok(rows) => rows,
        Err(e) => return format!("<{e}>"),
    };
    let listed: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "saga {:?} call {:?} key {:?} job {:?} detached {:?} adopted_until {:?} \
                 cancel_tried {:?} step {:?} leased {:?} deadline {:?}",
                r.try_get_by_index::<Option<String>>(0).ok().flatten(),
                r.try_get_by_index::<i32>(1).ok(),
                r.try_get_by_index::<i32>(2).ok(),
                r.try_get_by_index::<Option<String>>(3).ok().flatten(),
                r.try_get_by_index::<bool>(4).ok(),
                r.try_get_by_index::<i64>(5).ok(),
                r.try_get_by_index::<bool>(6).ok(),
                r.try_get_by_index::<Option<String>>(7).ok().flatten(),
                r.try_get_by_index::<Option<bool>>(8).ok().flatten(),
                r.try_get_by_index::<Option<i64>>(9).ok().flatten(),
            )
        })
        .collect();
    format!("[{}]", listed.join("; "))
}

#[actix_web::test]
async fn random_schedules_keep_the_account_caps_on_sqlite() {
    check_seeds(Backend::Sqlite, CI_SEEDS_SQLITE).await;
}

#[actix_web::test]
#[cfg_attr(not(pg_tests), ignore = "STAGEHAND_TEST_POSTGRES_URL is not set")]
async fn random_schedules_keep_the_account_caps_on_postgres() {
    check_seeds(Backend::Postgres, CI_SEEDS_POSTGRES).await;
}

/// The sweep the cap check relies on: jobs that overlap count together,
/// a job that ends as another starts does not, a cancelled job stops at
/// its cancel.
#[test]
fn the_sweep_counts_overlapping_jobs_only() {
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let job = |start: u64, end: u64, cancel: Option<u64>| JobRecord {
        job_id: format!("j{start}"),
        key: format!("k{start}"),
        prompt: String::new(),
        params: json!({}),
        started: ms(start),
        scheduled_end: ms(end),
        cancelled_at: cancel.map(ms),
        outcome: recording_provider::Outcome::Succeeded,
        submits: 1,
        unclear_answers: 0,
        history: Vec::new(),
    };
    // 0..100 and 100..200 touch: 1 at a time.
    assert_eq!(
        max_running(&[job(0, 100, None), job(100, 200, None)]).max,
        1
    );
    // 0..100, 50..150, 60..70: 3 at 60.
    let peak = max_running(&[job(0, 100, None), job(50, 150, None), job(60, 70, None)]);
    assert_eq!((peak.max, peak.at), (3, Some(ms(60))));
    // Cancelled at 40: no longer beside the one from 50.
    assert_eq!(
        max_running(&[job(0, 100, Some(40)), job(50, 150, None)]).max,
        1
    );
    assert_eq!(max_running(&[]).max, 0);
}
