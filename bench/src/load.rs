//! One benchmark scenario: a simulator and a server as subprocesses (killed
//! by a guard), the untimed setup, one display WebSocket per terminal, the
//! timed submissions (flat out, with one client doing unrelated reads
//! meanwhile; or paced at a fixed rate, for push latency), the wait for every
//! frame, the correctness check and the figures.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

mod drive;

/// Time allowed for the simulator and the server to answer after start.
const START_DEADLINE: Duration = Duration::from_secs(60);
/// At most this many missing sessions are looked up on the server.
const LOOKUPS: usize = 200;
/// How often the unrelated reader reads.
pub(super) const READ_EVERY: Duration = Duration::from_millis(20);
/// Longest an unrelated read may take before it counts as failed.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A display acknowledges the last `seq` it saw at most this often (the
/// booth page acks once per burst of frames it draws).
const ACK_EVERY: Duration = Duration::from_millis(50);
/// At most this many failed unrelated reads are described.
const READ_FAILURES_SHOWN: usize = 5;
/// ERROR lines kept as samples of a server log.
const LOG_SAMPLES: usize = 3;
/// How long the client keeps an idle connection for reuse: under the
/// server's keep-alive (actix-web's default, 5 s), or a submission may go out
/// on a connection the server is closing and fail with "error sending
/// request" — the paced runs leave most of the submitters' connections idle.
const CLIENT_IDLE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "PostgreSQL",
            Backend::Sqlite => "SQLite",
        }
    }
}

/// How the submissions are sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Each submitter sends its next submission when the last was answered;
    /// one client reads the ranking meanwhile.
    FlatOut,
    /// Submission `i` is sent at `i / rate` seconds (rate per second) by
    /// whichever submitter is free, with no unrelated reader: a steady load
    /// well under the ceiling, so 202-to-frame is push latency rather than
    /// queueing.
    Paced(f64),
}

impl Load {
    pub fn is_paced(self) -> bool {
        matches!(self, Load::Paced(_))
    }
}

/// What one scenario runs.
pub struct Scenario {
    /// This build: the AI simulator.
    pub exe: PathBuf,
    /// The build whose `stagehand serve` runs (`--server-binary`, or this one).
    pub server_exe: PathBuf,
    pub backend: Backend,
    pub terminals: usize,
    pub sessions: usize,
    pub concurrency: usize,
    pub load: Load,
    /// Servers on the one database (PostgreSQL): submitters and displays
    /// alternate between them, so frames cross instances.
    pub instances: usize,
    pub server_args: Vec<String>,
    /// PostgreSQL admin URL (PostgreSQL scenarios only).
    pub admin_url: Option<String>,
    /// The run's temp dir (logs, SQLite files).
    pub dir: PathBuf,
    pub deadline: Duration,
}

impl Scenario {
    pub fn label(&self) -> String {
        let plural = if self.terminals == 1 { "" } else { "s" };
        let pace = match self.load {
            Load::FlatOut => String::new(),
            Load::Paced(rate) => format!(", paced at {rate}/s"),
        };
        let instances = if self.instances > 1 {
            format!(", {} instances", self.instances)
        } else {
            String::new()
        };
        format!(
            "{}, {} terminal{plural}{pace}{instances}",
            self.backend.name(),
            self.terminals
        )
    }

    fn file_stem(&self) -> String {
        let backend = match self.backend {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        };
        let pace = if self.load.is_paced() { "-paced" } else { "" };
        let instances = if self.instances > 1 {
            format!("-x{}", self.instances)
        } else {
            String::new()
        };
        format!("{backend}-{}{pace}{instances}", self.terminals)
    }
}

/// The figures of a correct run.
#[derive(Debug, Clone)]
pub struct Figures {
    pub accepted_per_s: f64,
    pub sagas_per_s: f64,
    pub submit_p50_ms: f64,
    pub submit_p99_ms: f64,
    /// Latency of the unrelated reads made while the sagas ran.
    pub read_p50_ms: f64,
    pub read_p99_ms: f64,
    /// How many unrelated reads were made.
    pub reads: usize,
    /// 202-to-frame: from the moment this client has a submission's 202
    /// (its saga committed) to the moment the display of the session's
    /// terminal has read the session's `session.completed` frame. It spans
    /// the saga's run (one job on the simulator at 0 ms), the completion's
    /// commit and the push; both instants are taken in this process.
    pub frame_after_202_p50_ms: f64,
    pub frame_after_202_p99_ms: f64,
    pub reconnects: usize,
    /// Submissions sent per second, first send to last send.
    pub sent_per_s: f64,
    /// Paced runs: how far the latest submission started behind its
    /// schedule (0 when flat out).
    pub behind_schedule_ms: f64,
    /// What the timed part cost per saga (CPU of the server, PostgreSQL
    /// and this client; the server's context switches; transactions and
    /// statements on PostgreSQL).
    pub per_saga: super::cpu::PerSaga,
}

/// Error and warning lines of the server log (of every instance).
#[derive(Debug, Clone, Default)]
pub struct LogSummary {
    pub errors: usize,
    pub warnings: usize,
    /// A few of the first ERROR lines, shortened.
    pub samples: Vec<String>,
}

impl LogSummary {
    /// Both logs' counts, and their samples up to the usual few.
    fn add(mut self, other: LogSummary) -> LogSummary {
        self.errors += other.errors;
        self.warnings += other.warnings;
        self.samples.extend(other.samples);
        self.samples.truncate(LOG_SAMPLES);
        self
    }
}

pub struct ScenarioResult {
    pub backend: Backend,
    pub terminals: usize,
    pub load: Load,
    pub instances: usize,
    pub label: String,
    pub outcome: Result<Figures, String>,
    pub log: Option<LogSummary>,
}

/// Runs one scenario end to end; never panics on a server failure.
pub async fn run(s: &Scenario) -> ScenarioResult {
    let logs = super::logs_dir(&s.dir);
    let server_log = logs.join(format!("{}-server.log", s.file_stem()));
    let mut pg_name = None;
    let outcome = async {
        let database_url = match s.backend {
            Backend::Sqlite => {
                let db_dir = s.dir.join(format!("db-{}", s.file_stem()));
                fresh_dir(&db_dir)?;
                std::fs::create_dir_all(&db_dir)
                    .map_err(|e| format!("create {}: {e}", db_dir.display()))?;
                format!("sqlite://{}/bench.db?mode=rwc", db_dir.display())
            }
            Backend::Postgres => {
                let admin = s.admin_url.as_deref().ok_or("no PostgreSQL admin URL")?;
                let (url, name) = super::create_database(admin).await?;
                pg_name = Some(name);
                url
            }
        };
        let result = drive::drive(s, &database_url, &logs, &server_log).await;
        result.map_err(|e| format!("{e}\n  server log: {}", server_log.display()))
    }
    .await;
    if let (Some(admin), Some(name)) = (&s.admin_url, &pg_name) {
        super::drop_database(admin, name).await;
    }
    ScenarioResult {
        backend: s.backend,
        terminals: s.terminals,
        load: s.load,
        instances: s.instances,
        label: s.label(),
        outcome,
        log: (1..=s.instances.max(1))
            .filter_map(|k| summarize_log(&instance_log(&server_log, k)))
            .reduce(LogSummary::add),
    }
}

/// The log of server `k` (1-based) of a scenario: the first is
/// `server_log`, the others beside it with `-k` before `.log`.
fn instance_log(server_log: &Path, k: usize) -> PathBuf {
    if k <= 1 {
        return server_log.to_owned();
    }
    let stem = server_log
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    server_log.with_file_name(format!("{stem}-{k}.log"))
}

/// A subprocess killed (and reaped) when dropped.
pub(super) struct Proc {
    pub(super) child: Child,
    what: &'static str,
    log: PathBuf,
}

impl Proc {
    fn start(
        exe: &Path,
        what: &'static str,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<Proc, String> {
        let out = File::create(log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("log {}: {e}", log.display()))?;
        let child = Command::new(exe)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("start {what}: {e}"))?;
        Ok(Proc {
            child,
            what,
            log: log.to_owned(),
        })
    }

    /// Waits until `GET url` answers 200, or the process exits, or the
    /// deadline passes.
    async fn wait_ready(&mut self, client: &reqwest::Client, url: &str) -> Result<(), String> {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "{} exited during start ({status}); see {}",
                    self.what,
                    self.log.display()
                ));
            }
            if let Ok(resp) = client.get(url).send().await {
                if resp.status() == StatusCode::OK {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not answer 200 on {url} within {START_DEADLINE:?}; see {}",
                    self.what,
                    self.log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("find a free port: {e}"))
}

/// One participant session of the run.
#[derive(Clone)]
pub(super) struct Session {
    pub(super) id: String,
    pub(super) token: String,
    /// Index of its terminal.
    pub(super) terminal: usize,
}

/// One terminal: its id and token.
pub(super) struct Terminal {
    pub(super) id: String,
    pub(super) token: String,
}

/// A frame as it arrived at a display.
pub(super) struct Frame {
    pub(super) at: Instant,
    pub(super) seq: i64,
    pub(super) session_id: String,
    /// `session.completed`, `session.rejected` or `session.aborted`.
    pub(super) kind: String,
    pub(super) reason: Option<String>,
}

/// What one display saw.
#[derive(Default)]
pub(super) struct DisplayLog {
    pub(super) frames: Vec<Frame>,
    pub(super) reconnects: usize,
    pub(super) problems: Vec<String>,
}

/// What the unrelated reader saw: the latency of each successful read, and
/// the failed ones (1-based read number, what went wrong).
#[derive(Default)]
pub(super) struct ReadLog {
    pub(super) latencies_ms: Vec<f64>,
    pub(super) failures: Vec<(usize, String)>,
}

impl ReadLog {
    pub(super) fn count(&self) -> usize {
        self.latencies_ms.len() + self.failures.len()
    }

    /// Correctness violations: every read (`what`, e.g. `GET
    /// .../ranking?limit=10`) must answer 200 with what it asked for.
    pub(super) fn problems(&self, what: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.failures.is_empty() {
            return out;
        }
        out.push(format!(
            "  {} of {} unrelated read(s) ({what}) failed under load:",
            self.failures.len(),
            self.count()
        ));
        for (i, e) in self.failures.iter().take(READ_FAILURES_SHOWN) {
            out.push(format!("    read {i}: {e}"));
        }
        if self.failures.len() > READ_FAILURES_SHOWN {
            out.push(format!(
                "    and {} more",
                self.failures.len() - READ_FAILURES_SHOWN
            ));
        }
        out
    }
}

/// A running simulator and server, both killed when dropped, and what it
/// takes to talk to the server.
pub(super) struct Stack {
    pub(super) client: reqwest::Client,
    pub(super) sim: Proc,
    pub(super) server: Proc,
    /// `http://127.0.0.1:<port>`.
    pub(super) base: String,
    pub(super) operator: String,
    /// The simulator's base URL, `http://127.0.0.1:<port>`.
    pub(super) sim_url: String,
}

/// The submitters' client: keeps up to `pool` idle connections (for
/// [`CLIENT_IDLE`]), gives up on a request after 60 s.
pub(super) fn http_client(pool: usize) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(pool)
        .pool_idle_timeout(CLIENT_IDLE)
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| format!("HTTP client: {e}"))
}

/// The simulator flags of the bench: every job done at once.
pub(super) fn instant_ai() -> Vec<String> {
    vec!["--latency".into(), "0ms".into()]
}

/// The builds a stack runs: the AI simulator's and the server's (the same
/// build unless `stagehand bench --server-binary` names another).
#[derive(Debug, Clone, Copy)]
pub(super) struct Builds<'a> {
    pub sim: &'a Path,
    pub server: &'a Path,
}

impl<'a> Builds<'a> {
    /// Simulator and server both from `exe`.
    pub fn one(exe: &'a Path) -> Self {
        Builds {
            sim: exe,
            server: exe,
        }
    }
}

/// Starts the AI simulator (`builds.sim sim-ai` with `sim_args`, e.g.
/// [`instant_ai`]) and `builds.server serve` on `database_url`, as a user
/// runs them, and waits until both answer. The client keeps up to `pool`
/// idle connections.
pub(super) async fn start_stack(
    builds: Builds<'_>,
    database_url: &str,
    sim_args: &[String],
    server_args: &[String],
    sim_log: &Path,
    server_log: &Path,
    pool: usize,
) -> Result<Stack, String> {
    let client = http_client(pool)?;

    // The AI simulator.
    let sim_port = free_port()?;
    let sim_url = format!("http://127.0.0.1:{sim_port}");
    let mut args: Vec<String> = vec![
        "sim-ai".into(),
        "--bind".into(),
        format!("127.0.0.1:{sim_port}"),
    ];
    args.extend(sim_args.iter().cloned());
    let mut sim = Proc::start(builds.sim, "the AI simulator", &args, &[], sim_log)?;
    sim.wait_ready(&client, &format!("{sim_url}/v1/stats"))
        .await?;

    let operator = uuid::Uuid::new_v4().simple().to_string();
    let (server, base) = start_server(
        builds.server,
        database_url,
        &sim_url,
        &operator,
        server_args,
        server_log,
        &client,
    )
    .await?;
    Ok(Stack {
        client,
        sim,
        server,
        base,
        operator,
        sim_url,
    })
}

/// Starts one `stagehand serve` on `database_url` with the AI at `sim_url`
/// and the operator token `operator`, and waits until it is ready: the
/// process and its base URL, `http://127.0.0.1:<port>`.
pub(super) async fn start_server(
    exe: &Path,
    database_url: &str,
    sim_url: &str,
    operator: &str,
    server_args: &[String],
    log: &Path,
    client: &reqwest::Client,
) -> Result<(Proc, String), String> {
    let port = free_port()?;
    let base = format!("http://127.0.0.1:{port}");
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--database-url".into(),
        database_url.into(),
        "--bind".into(),
        format!("127.0.0.1:{port}"),
        "--ai-url".into(),
        sim_url.into(),
        "--operator-token".into(),
        operator.into(),
    ];
    // Media beside the server's log, never the working directory (on
    // PostgreSQL there is no database file to put it by). A build from
    // before the media store (`--server-binary`) has no such flag.
    if serve_takes(exe, "--media-url") {
        args.push("--media-url".into());
        args.push(log.with_extension("media").display().to_string());
    }
    args.extend(server_args.iter().cloned());
    let env: Vec<(&str, &str)> = server_env().collect();
    let mut server = Proc::start(exe, "the server", &args, &env, log)?;
    server.wait_ready(client, &format!("{base}/readyz")).await?;
    Ok((server, base))
}

/// Whether `exe serve` takes `flag` (its `--help` names it): an older
/// build measured with `--server-binary` is given only the flags it knows.
/// A build that cannot say is given the flag.
fn serve_takes(exe: &Path, flag: &str) -> bool {
    Command::new(exe)
        .args(["serve", "--help"])
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
                .any(|word| word == flag)
        })
        .unwrap_or(true)
}

/// Environment the bench gives each server, unless the bench's own
/// environment sets the variable: the simulated crowd creates its sessions
/// and uploads its photos from one address, 127.0.0.1, which the
/// per-address limits on session creation and on uploads (600/min each by
/// default) rightly take for one client. Session creation is untimed
/// setup, and the uploads measure the photo path, not the limit; the
/// submissions keep their own limit (per session, at its default). A
/// `--server-arg` flag still wins over this.
pub const SERVER_ENV: &[(&str, &str)] = &[
    ("STAGEHAND_SESSION_RATE_LIMIT", "off"),
    ("STAGEHAND_UPLOAD_RATE_LIMIT", "off"),
];

/// The entries of [`SERVER_ENV`] the bench's environment does not set.
pub fn server_env() -> impl Iterator<Item = (&'static str, &'static str)> {
    SERVER_ENV
        .iter()
        .copied()
        .filter(|(name, _)| std::env::var_os(name).is_none())
}

/// The experience the bench creates: kind `score`, up to 1,000 sagas in
/// flight.
pub(super) fn bench_experience() -> Value {
    json!({"title": "Bench", "kind": "score", "max_in_flight": 1000})
}

/// Terminals created at the same time.
const CREATING: usize = 16;

/// Creates an experience (`experience`: the body of `POST /api/experiences`
/// without its slug, e.g. [`bench_experience`]) and `n` terminals on it;
/// returns its slug and the terminals.
pub(super) async fn create_terminals(
    client: &reqwest::Client,
    base: &str,
    operator: &str,
    experience: Value,
    n: usize,
) -> Result<(String, Vec<Terminal>), String> {
    let slug = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut body = experience;
    body["slug"] = json!(slug);
    post(
        client,
        &format!("{base}/api/experiences"),
        Some(operator),
        body,
        StatusCode::CREATED,
    )
    .await?;
    let terminals = terminals_of(client, base, operator, &slug, n).await?;
    Ok((slug, terminals))
}

/// Creates `n` terminals (displays) of the experience `slug`.
pub(super) async fn terminals_of(
    client: &reqwest::Client,
    base: &str,
    operator: &str,
    slug: &str,
    n: usize,
) -> Result<Vec<Terminal>, String> {
    let created = {
        let (client, base, operator, slug) = (
            client.clone(),
            base.to_owned(),
            operator.to_owned(),
            slug.to_owned(),
        );
        in_workers(n, CREATING, move |t| {
            let (client, base, operator, slug) =
                (client.clone(), base.clone(), operator.clone(), slug.clone());
            async move {
                let body = post(
                    &client,
                    &format!("{base}/api/terminals"),
                    Some(&operator),
                    json!({"experience": slug, "name": format!("bench display {t}")}),
                    StatusCode::CREATED,
                )
                .await?;
                Ok::<_, String>(Terminal {
                    id: field(&body, "terminal_id")?,
                    token: field(&body, "token")?,
                })
            }
        })
        .await
    };
    created.into_iter().collect()
}

/// Creates `n` participant sessions of `slug`, session `i` on terminal
/// `i % terminal_ids.len()`, `concurrency` at a time (untimed setup);
/// `created` counts them as they come.
pub(super) async fn create_sessions(
    client: &reqwest::Client,
    base: &str,
    slug: &str,
    terminal_ids: Vec<String>,
    n: usize,
    concurrency: usize,
    created: Arc<AtomicUsize>,
) -> Result<Vec<Session>, String> {
    let ids = Arc::new(terminal_ids);
    let (client, base, slug) = (client.clone(), base.to_owned(), slug.to_owned());
    let made = in_workers(n, concurrency, move |i| {
        let (client, base, slug, ids, created) = (
            client.clone(),
            base.clone(),
            slug.clone(),
            ids.clone(),
            created.clone(),
        );
        async move {
            let terminal = i % ids.len();
            let body = post(
                &client,
                &format!("{base}/api/experiences/{slug}/sessions"),
                None,
                json!({"nickname": format!("p{i}"), "terminal_id": ids[terminal]}),
                StatusCode::CREATED,
            )
            .await?;
            created.fetch_add(1, Ordering::Relaxed);
            Ok::<_, String>(Session {
                id: field(&body, "session_id")?,
                token: field(&body, "participant_token")?,
                terminal,
            })
        }
    })
    .await;
    made.into_iter().collect()
}

/// Why a submission got no 202: the status when there was an answer.
#[derive(Debug, Clone)]
pub(super) struct Refused {
    pub(super) status: Option<StatusCode>,
    pub(super) detail: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(status) => write!(f, "{status} {}", self.detail),
            None => f.write_str(&self.detail),
        }
    }
}

/// Submits for `session` (a fresh `Idempotency-Key`), as the participant
/// page does; Ok on 202.
pub(super) async fn submit(
    client: &reqwest::Client,
    base: &str,
    session: &Session,
    body: &Value,
) -> Result<(), Refused> {
    let sent = client
        .post(format!("{base}/api/sessions/{}/submission", session.id))
        .bearer_auth(&session.token)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .json(body)
        .send()
        .await;
    match sent {
        Ok(resp) if resp.status() == StatusCode::ACCEPTED => Ok(()),
        Ok(resp) => {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            Err(Refused {
                status: Some(status),
                detail: shorten(&text, 200),
            })
        }
        Err(e) => Err(Refused {
            status: None,
            detail: with_causes(&e),
        }),
    }
}

/// A client for an unrelated reader: one kept-alive connection of its own,
/// not one of the submitters' pooled connections.
pub(super) fn read_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .pool_idle_timeout(CLIENT_IDLE)
        .timeout(READ_TIMEOUT)
        .build()
        .map_err(|e| format!("HTTP client: {e}"))
}

/// The unrelated reader: `GET url` every [`READ_EVERY`] (a read that takes
/// longer is followed by the next at once), from the first submission until
/// all `n` frames arrived (or the run is stopped), timing each read to the
/// last byte of its answer; a read counts when it answers 200 with JSON that
/// `valid` accepts. A read in flight when the last frame arrives is
/// finished and counted. Paced, not back to back: it samples what a reader
/// waits under the load, without becoming a load of its own.
pub(super) async fn unrelated_reads(
    client: reqwest::Client,
    url: String,
    valid: fn(&Value) -> bool,
    n: usize,
    arrived: Arc<AtomicUsize>,
    reads: Arc<AtomicUsize>,
    stop: watch::Receiver<bool>,
) -> ReadLog {
    let mut log = ReadLog::default();
    let mut pace = tokio::time::interval(READ_EVERY);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !*stop.borrow() && arrived.load(Ordering::Relaxed) < n {
        pace.tick().await;
        let start = Instant::now();
        let answer = match client.get(&url).send().await {
            Ok(resp) => {
                let status = resp.status();
                resp.text().await.map(|text| (status, text))
            }
            Err(e) => Err(e),
        };
        let took = start.elapsed();
        reads.fetch_add(1, Ordering::Relaxed);
        let number = log.count() + 1;
        match answer {
            Ok((StatusCode::OK, text)) => match serde_json::from_str::<Value>(&text) {
                Ok(v) if valid(&v) => log.latencies_ms.push(ms(took)),
                _ => log.failures.push((
                    number,
                    format!("200 but not the expected answer: {}", shorten(&text, 200)),
                )),
            },
            Ok((status, text)) => log.failures.push((
                number,
                format!("{status} after {:.0} ms: {}", ms(took), shorten(&text, 200)),
            )),
            Err(e) => log
                .failures
                .push((number, format!("after {:.0} ms: {e}", ms(took)))),
        }
    }
    log
}

/// Every session exactly once, at its own terminal (completed, when
/// `completed_only`); `seq` 1, 2, 3, ... per display. Returns the violations
/// (empty when all is well).
pub(super) fn check(
    sessions: &[Session],
    index_of: &HashMap<&str, usize>,
    logs: &[DisplayLog],
    completed_only: bool,
    timed_out: bool,
    deadline: Duration,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = vec![0usize; sessions.len()];
    let mut not_completed: BTreeMap<String, usize> = BTreeMap::new();
    for (t, log) in logs.iter().enumerate() {
        for p in &log.problems {
            out.push(format!("  terminal {t}: {p}"));
        }
        let mut prev = 0i64;
        let mut seq_errors = 0;
        for f in &log.frames {
            if f.seq != prev + 1 {
                seq_errors += 1;
                if seq_errors <= 5 {
                    out.push(format!(
                        "  terminal {t}: seq {} after {prev} (expected {})",
                        f.seq,
                        prev + 1
                    ));
                }
            }
            prev = prev.max(f.seq);
            match index_of.get(f.session_id.as_str()) {
                Some(&i) if sessions[i].terminal == t => seen[i] += 1,
                Some(&i) => out.push(format!(
                    "  terminal {t}: session {} of terminal {} arrived here (seq {})",
                    f.session_id, sessions[i].terminal, f.seq
                )),
                None => out.push(format!(
                    "  terminal {t}: unknown session {:?} (seq {})",
                    f.session_id, f.seq
                )),
            }
            if completed_only && f.kind != "session.completed" {
                let key = format!("{} {}", f.kind, f.reason.as_deref().unwrap_or("-"));
                *not_completed.entry(key).or_default() += 1;
            }
        }
        if seq_errors > 5 {
            out.push(format!(
                "  terminal {t}: {} more seq gaps or repeats",
                seq_errors - 5
            ));
        }
    }
    for (kind, n) in &not_completed {
        out.push(format!("  {n} frame(s) were not completions: {kind}"));
    }
    let duplicated: Vec<usize> = (0..sessions.len()).filter(|&i| seen[i] > 1).collect();
    if !duplicated.is_empty() {
        out.push(format!(
            "  {} session(s) arrived more than once, e.g. {} ({} times)",
            duplicated.len(),
            sessions[duplicated[0]].id,
            seen[duplicated[0]]
        ));
    }
    let mut missing_by_terminal: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for (i, s) in sessions.iter().enumerate() {
        if seen[i] == 0 {
            missing_by_terminal
                .entry(s.terminal)
                .or_default()
                .push(&s.id);
        }
    }
    let missing: usize = missing_by_terminal.values().map(Vec::len).sum();
    if missing > 0 {
        let why = if timed_out {
            format!(" after waiting {deadline:?}")
        } else {
            String::new()
        };
        out.push(format!(
            "  {missing} of {} session(s) never reached their terminal{why}:",
            sessions.len()
        ));
        for (t, ids) in missing_by_terminal.iter().take(5) {
            let shown: Vec<&str> = ids.iter().take(3).copied().collect();
            let more = if ids.len() > 3 {
                format!(" and {} more", ids.len() - 3)
            } else {
                String::new()
            };
            out.push(format!(
                "    terminal {t}: {} missing: {}{more}",
                ids.len(),
                shown.join(", ")
            ));
        }
        if missing_by_terminal.len() > 5 {
            out.push(format!(
                "    and {} more terminals",
                missing_by_terminal.len() - 5
            ));
        }
    } else if timed_out {
        out.push(format!(
            "  not every frame arrived within {deadline:?} (or the server exited)"
        ));
    }
    out
}

pub(super) fn missing_sessions<'a>(sessions: &'a [Session], logs: &[DisplayLog]) -> Vec<&'a str> {
    let seen: HashSet<&str> = logs
        .iter()
        .flat_map(|l| l.frames.iter().map(|f| f.session_id.as_str()))
        .collect();
    sessions
        .iter()
        .map(|s| s.id.as_str())
        .filter(|id| !seen.contains(id))
        .collect()
}

/// Asks the server where the missing sessions stand: "COMPLETED: 53, ...".
pub(super) async fn lookup(
    client: &reqwest::Client,
    base: &str,
    operator: &str,
    ids: &[&str],
) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for id in ids.iter().take(LOOKUPS) {
        let status = match client
            .get(format!("{base}/api/sessions/{id}"))
            .bearer_auth(operator)
            .send()
            .await
        {
            Ok(resp) if resp.status().is_success() => match resp.json::<Value>().await {
                Ok(v) => format!(
                    "{}/{}",
                    v["status"].as_str().unwrap_or("?"),
                    v["step"].as_str().unwrap_or("-")
                ),
                Err(e) => format!("unreadable ({e})"),
            },
            Ok(resp) => format!("HTTP {}", resp.status()),
            Err(e) => format!("unreachable ({e})"),
        };
        *counts.entry(status).or_default() += 1;
    }
    counts
        .iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The WebSocket base of a server's HTTP base URL: `http://h:p` ->
/// `ws://h:p` (`https` -> `wss`).
pub(super) fn ws_base(base: &str) -> String {
    match base.strip_prefix("http") {
        Some(rest) => format!("ws{rest}"),
        None => base.to_owned(),
    }
}

/// A terminal's display URL on the server at `base` (`http://...`),
/// without `after`.
pub(super) fn display_url(base: &str, terminal: &Terminal) -> String {
    format!(
        "{}/ws/terminals/{}?token={}",
        ws_base(base),
        terminal.id,
        terminal.token
    )
}

/// Connects a display with `after=<after>` and reads its hello frame.
pub(super) async fn connect_display(url: &str, after: i64) -> Result<Ws, String> {
    let full = format!("{url}&after={after}");
    let connected = tokio::time::timeout(Duration::from_secs(10), async {
        let (mut ws, _) = tokio_tungstenite::connect_async(full.as_str())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(text))) => {
                    let v: Value = serde_json::from_str(text.as_str())
                        .map_err(|e| format!("first frame is not JSON: {e}"))?;
                    if v["type"] != "hello" {
                        return Err(format!("first frame is not hello: {text}"));
                    }
                    return Ok(ws);
                }
                Some(Ok(Message::Close(frame))) => {
                    return Err(format!("closed at once: {frame:?}"))
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(format!("read hello: {e}")),
                None => return Err("closed before hello".into()),
            }
        }
    })
    .await;
    connected.unwrap_or_else(|_| Err("no hello within 10 s".into()))
}

/// Reads a display until told to stop, as a real display does: skips the
/// ranking snapshots, acknowledges the last `seq` it saw (at most every
/// [`ACK_EVERY`]), and reconnects with the last seen `seq` when the server
/// closes the socket.
pub(super) async fn display(
    url: String,
    mut ws: Ws,
    expected: HashSet<String>,
    arrived: Arc<AtomicUsize>,
    mut stop: watch::Receiver<bool>,
) -> DisplayLog {
    let mut log = DisplayLog::default();
    let mut counted: HashSet<String> = HashSet::new();
    let mut last_seq = 0i64;
    let mut acked = 0i64;
    let mut ack_tick = tokio::time::interval(ACK_EVERY);
    ack_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let msg = tokio::select! {
            biased;
            _ = stop.changed() => break,
            msg = ws.next() => msg,
            _ = ack_tick.tick(), if last_seq > acked => {
                let ack = json!({"type": "ack", "seq": last_seq}).to_string();
                // A failed send shows up as a read error next.
                if ws.send(Message::text(ack)).await.is_ok() {
                    acked = last_seq;
                }
                continue;
            }
        };
        let at = Instant::now();
        match msg {
            Some(Ok(Message::Text(text))) => match parse_frame(text.as_str(), at) {
                Ok(None) => {} // a ranking snapshot
                Ok(Some(frame)) => {
                    last_seq = last_seq.max(frame.seq);
                    if expected.contains(&frame.session_id)
                        && counted.insert(frame.session_id.clone())
                    {
                        arrived.fetch_add(1, Ordering::Relaxed);
                    }
                    log.frames.push(frame);
                }
                Err(e) => log.problems.push(e),
            },
            Some(Ok(Message::Binary(_))) => log.problems.push("unexpected binary frame".into()),
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                // Reconnect until it works or the run ends.
                loop {
                    tokio::select! {
                        biased;
                        _ = stop.changed() => return log,
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                    match connect_display(&url, last_seq).await {
                        Ok(new) => {
                            ws = new;
                            log.reconnects += 1;
                            break;
                        }
                        Err(e) => {
                            if log.problems.len() < 5 {
                                log.problems.push(format!("reconnect failed: {e}"));
                            }
                        }
                    }
                }
            }
            Some(Ok(_)) => {} // ping, pong: tungstenite answers pings itself
        }
    }
    let _ = ws.close(None).await;
    log
}

/// A session event; `None` for a ranking snapshot (`{"type": "ranking",
/// "entries"}`, no `seq`), which a display shows but the bench does not
/// count.
fn parse_frame(text: &str, at: Instant) -> Result<Option<Frame>, String> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| format!("frame is not JSON ({e}): {text}"))?;
    let kind = v["type"].as_str().unwrap_or_default().to_owned();
    match kind.as_str() {
        "session.completed" | "session.rejected" | "session.aborted" => {}
        "ranking" => return Ok(None),
        _ => return Err(format!("unexpected frame: {}", shorten(text, 200))),
    }
    let seq = v["seq"]
        .as_i64()
        .ok_or_else(|| format!("frame without seq: {}", shorten(text, 200)))?;
    let session_id = v["session_id"]
        .as_str()
        .ok_or_else(|| format!("frame without session_id: {}", shorten(text, 200)))?
        .to_owned();
    Ok(Some(Frame {
        at,
        seq,
        session_id,
        kind,
        reason: v["reason"].as_str().map(str::to_owned),
    }))
}

/// Runs `f(0..n)` on `c` concurrent workers; results in index order.
pub(super) async fn in_workers<T, F, Fut>(n: usize, c: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = T> + Send,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..c.min(n) {
        let (f, next) = (f.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return done;
                }
                done.push((i, f(i).await));
            }
        }));
    }
    let mut slots: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for w in workers {
        for (i, t) in w.await.expect("bench worker panicked") {
            slots[i] = Some(t);
        }
    }
    slots
        .into_iter()
        .map(|t| t.expect("every index done"))
        .collect()
}

/// POSTs JSON and expects `want`; returns the JSON answer.
pub(super) async fn post(
    client: &reqwest::Client,
    url: &str,
    bearer: Option<&str>,
    body: Value,
    want: StatusCode,
) -> Result<Value, String> {
    let mut req = client.post(url).json(&body);
    if let Some(token) = bearer {
        req = req.bearer_auth(token);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| format!("POST {url}: {}", with_causes(&e)))?;
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if status != want {
        return Err(format!(
            "POST {url}: {status} (expected {want}): {}",
            shorten(&text, 300)
        ));
    }
    serde_json::from_str(&text).map_err(|e| format!("POST {url}: answer is not JSON: {e}"))
}

pub(super) fn field(v: &Value, name: &str) -> Result<String, String> {
    v[name]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("answer without {name}: {v}"))
}

/// An error and its causes: "error sending request ...: connection closed
/// before message completed".
pub(super) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

pub(super) fn shorten(text: &str, max: usize) -> String {
    let text = text.trim();
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_owned(),
    }
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub(super) fn secs(d: Duration) -> f64 {
    d.as_secs_f64().max(1e-9)
}

/// Nearest-rank percentile (`p` in 0..=1) of `values`, sorted in place.
pub(super) fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = (p * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// Counts ERROR and WARN lines of a server log (ANSI colours stripped).
pub(super) fn summarize_log(path: &Path) -> Option<LogSummary> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut summary = LogSummary::default();
    for line in text.lines() {
        let plain = strip_ansi(line);
        let level = plain.split_whitespace().nth(1).unwrap_or_default();
        if level == "ERROR" {
            summary.errors += 1;
            if summary.samples.len() < LOG_SAMPLES {
                summary.samples.push(shorten(&plain, 240));
            }
        } else if level == "WARN" {
            summary.warnings += 1;
        }
    }
    Some(summary)
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Removes what an earlier run left in `dir`: each run starts on an empty
/// SQLite file (a side-by-side sitting runs one scenario several times in
/// one folder; a file that grew with every run, or that a newer build
/// migrated past what an older one knows, would measure the file).
fn fresh_dir(dir: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("empty {}: {e}", dir.display())),
    }
}

/// A server of its own on a fresh SQLite file under `dir` (`db-<name>`),
/// with the instant simulator, its logs named after `name`, and a client
/// of `pool` connections.
pub(crate) async fn sqlite_stack(
    builds: Builds<'_>,
    dir: &Path,
    server_args: &[String],
    name: &str,
    pool: usize,
) -> Result<Stack, String> {
    let logs = crate::logs_dir(dir);
    let db_dir = dir.join(format!("db-{name}"));
    fresh_dir(&db_dir)?;
    std::fs::create_dir_all(&db_dir).map_err(|e| format!("create {}: {e}", db_dir.display()))?;
    let database_url = format!("sqlite://{}/bench.db?mode=rwc", db_dir.display());
    start_stack(
        builds,
        &database_url,
        &instant_ai(),
        server_args,
        &logs.join(format!("{name}-sim.log")),
        &logs.join(format!("{name}-server.log")),
        pool,
    )
    .await
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{instance_log, percentile, strip_ansi, LogSummary, LOG_SAMPLES};

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 0.50), 50.0);
        assert_eq!(percentile(&mut v, 0.99), 99.0);
        assert_eq!(percentile(&mut [7.0], 0.99), 7.0);
    }

    #[test]
    fn each_instance_logs_beside_the_first() {
        let first = Path::new("/tmp/logs/postgres-1-x2-server.log");
        assert_eq!(instance_log(first, 1), first);
        assert_eq!(
            instance_log(first, 2),
            Path::new("/tmp/logs/postgres-1-x2-server-2.log")
        );
    }

    #[test]
    fn instance_logs_add_up_and_keep_a_few_samples() {
        let one = |n: usize| LogSummary {
            errors: n,
            warnings: 1,
            samples: (0..n).map(|i| format!("error {i}")).collect(),
        };
        let sum = one(2).add(one(3));
        assert_eq!((sum.errors, sum.warnings), (5, 2));
        assert_eq!(sum.samples.len(), LOG_SAMPLES);
        assert_eq!(sum.samples[0], "error 0");
    }

    #[test]
    fn ansi_is_stripped() {
        assert_eq!(
            strip_ansi("2026 \u{1b}[31mERROR\u{1b}[0m boom"),
            "2026 ERROR boom"
        );
    }
}
