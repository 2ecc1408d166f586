//! `stagehand rehearse`: replays a synthetic event day — participants per
//! minute or one burst, an AI latency, failure and rejection rates, N booth
//! displays — against a running server (`--url`) or an embedded one (this
//! binary's `serve` and `sim-ai` as subprocesses, SQLite in a temp dir or
//! the PostgreSQL of `--database-url`), with a progress bar on stderr, and
//! prints (and with `--json`, writes) the figures an event team needs before
//! doors open. It owns the plan of the day (who submits when, whose prompt
//! is rejected), the samplers (operator stats socket, `pg_stat_activity`,
//! an unrelated reader, the server's RSS) and the run's order, the day's
//! stages in [`day`]; the pieces it shares with `stagehand bench`
//! (subprocesses, setup, displays, the submission) are in [`super::load`]
//! and [`super::sockets`], the figures and their table and JSON in
//! [`report`].

mod day;
mod report;
pub mod verdict;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::Value;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use super::load::{self, Session, Stack};
use super::sockets;
use crate::parse_duration;
use day::day;
pub use report::Report;
use report::{Latency, Memory, Outcomes, PgActivity, Reads};
use verdict::{BurstCapacity, Capacity, Targets, Verdict};

/// How often `pg_stat_activity` is sampled.
const PG_EVERY: Duration = Duration::from_millis(50);
/// Displays connecting at the same time.
const CONNECTING: usize = sockets::CONNECTING;
/// Sessions looked up at the same time after the run (their `updated_at`).
const LOOKING_UP: usize = 32;
/// Between two progress lines when stderr is not a terminal.
const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Flags of `stagehand rehearse`.
#[derive(Debug, Clone, clap::Args)]
pub struct RehearseArgs {
    /// A running server, `http://host:port`. Without it, an embedded server
    /// and the AI simulator are started (subprocesses on 127.0.0.1).
    #[arg(long)]
    pub url: Option<String>,
    /// Rehearse an experience that exists on the --url server (its slug)
    /// with its own max_in_flight and ai_calls, as an event would run it
    /// (--max-in-flight and --ai-calls are then not used): the way to
    /// check a change made with `PATCH /api/experiences/{slug}`. Its
    /// sessions count in its ranking and credits like any other.
    #[arg(long, requires = "url")]
    pub experience: Option<String>,
    /// The server's operator token (needed with --url; the embedded server
    /// gets a fresh one).
    #[arg(long, env = "STAGEHAND_OPERATOR_TOKEN", hide_env_values = true)]
    pub operator_token: Option<String>,
    /// PostgreSQL URL. Embedded: the server's database (default: SQLite in
    /// a temp dir). With --url: the server's database, only read to sample
    /// pg_stat_activity.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Participants arriving at a steady rate: `600/min`, `10/s`.
    #[arg(long, default_value = "60/min", value_parser = parse_arrivals)]
    pub rate: f64,
    /// How long participants keep arriving at --rate.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Instead of --rate: N participants submitting at the same moment.
    #[arg(long)]
    pub burst: Option<usize>,
    /// Median time the AI takes per job (embedded simulator).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub ai_latency: Duration,
    /// 99th percentile of the AI's time per job (log-normal between the
    /// median and this); unset: every job takes --ai-latency.
    #[arg(long, value_parser = parse_duration)]
    pub ai_latency_p99: Option<Duration>,
    /// Share of AI jobs that end `failed` (each failure is retried up to the
    /// server's --max-attempts; embedded simulator).
    #[arg(long, default_value_t = 0.0)]
    pub fail_rate: f64,
    /// Share of participants whose prompt moderation rejects (it contains
    /// --reject-word); chosen evenly, so exactly floor(N x rate) of N.
    #[arg(long, default_value_t = 0.0)]
    pub reject_rate: f64,
    /// The word the AI provider rejects (the simulator's --reject-word).
    #[arg(long, default_value = "forbidden")]
    pub reject_word: String,
    /// Booth displays connected during the run, each a WebSocket; session
    /// i shows on terminal i mod N.
    #[arg(long, default_value_t = 10)]
    pub terminals: usize,
    /// AI calls per submission (the experience's ai_calls).
    #[arg(long, default_value_t = 1)]
    pub ai_calls: u32,
    /// AI jobs in flight at most (the experience's max_in_flight).
    #[arg(long, default_value_t = 5)]
    pub max_in_flight: u32,
    /// The embedded server's --db-pool (connections for HTTP requests).
    #[arg(long)]
    pub db_pool: Option<u32>,
    /// Extra flags for the embedded `stagehand serve`, split on whitespace
    /// (repeatable): `--server-arg "--ai-poll-interval 100ms"`.
    #[arg(long = "server-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Submissions (and session creations) in flight at most.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Also write the figures as JSON to this file (`-`: stdout, instead of
    /// the table).
    #[arg(long)]
    pub json: Option<String>,
    /// How long to wait, after the last submission, for every frame.
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub deadline: Duration,
    /// Keep the embedded server's and simulator's logs.
    #[arg(long)]
    pub keep_logs: bool,
    /// Do not watch the operators' stats socket (no dashboard open: the
    /// server builds no stats frames; no queue depth or AI concurrency from
    /// it).
    #[arg(long)]
    pub no_operator_stats: bool,
    /// Target: the 95th percentile of the time from the 202 to the
    /// terminal's frame at most this, or NO-GO.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub target_p95: Duration,
    /// Target: the 99th percentile of the same at most this (unset: not
    /// checked).
    #[arg(long, value_parser = parse_duration)]
    pub target_p99: Option<Duration>,
    /// Target: at most this share of participants without their result
    /// for another reason than moderation (aborted, lost, or the
    /// submission refused): `2%` or `0.02`.
    #[arg(long, default_value = "2%", value_parser = verdict::parse_share)]
    pub target_abort_rate: f64,
}

impl RehearseArgs {
    fn targets(&self) -> Targets {
        Targets {
            p95: self.target_p95,
            p99: self.target_p99,
            abort_rate: self.target_abort_rate,
        }
    }
}

/// `600/min` -> 10.0 participants per second (a count, `/`, and a
/// period: `s`, `min`, `h` or a duration like `90s`).
fn parse_arrivals(s: &str) -> Result<f64, String> {
    let bad = || format!("{s:?}: a rate of participants like 600/min or 10/s");
    let (count, per) = s.trim().split_once('/').ok_or_else(bad)?;
    let count: u32 = count.trim().parse().map_err(|_| bad())?;
    let per = per.trim();
    // `min` means `1min`.
    let per = if per.starts_with(|c: char| c.is_ascii_digit()) {
        per.to_owned()
    } else {
        format!("1{per}")
    };
    let per = humantime::parse_duration(&per).map_err(|_| bad())?;
    if count == 0 || per.is_zero() {
        return Err(bad());
    }
    Ok(f64::from(count) / per.as_secs_f64())
}

/// When the participants arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// `per_s` participants a second for `duration`.
    Rate { per_s: f64, duration: Duration },
    /// `n` at once.
    Burst(usize),
}

impl Arrivals {
    /// Each participant's submission time, from the start of the run:
    /// `i / per_s` for a steady rate (`round(per_s x duration)` of them),
    /// all 0 for a burst.
    pub fn schedule(self) -> Vec<Duration> {
        match self {
            Arrivals::Burst(n) => vec![Duration::ZERO; n],
            Arrivals::Rate { per_s, duration } => {
                let n = (per_s * duration.as_secs_f64()).round() as usize;
                (0..n)
                    .map(|i| Duration::from_secs_f64(i as f64 / per_s))
                    .collect()
            }
        }
    }

    fn describe(self) -> String {
        match self {
            Arrivals::Burst(n) => format!("a burst of {n} at once"),
            Arrivals::Rate { per_s, duration } => format!(
                "{:.0}/min for {}",
                per_s * 60.0,
                humantime::format_duration(duration)
            ),
        }
    }
}

/// Whether participant `i` sends a prompt moderation rejects: the rejected
/// ones are spread evenly, exactly `floor(n x rate)` of the first `n`.
pub fn is_rejected(i: usize, rate: f64) -> bool {
    let before = |k: usize| (k as f64 * rate + 1e-9).floor();
    before(i + 1) > before(i)
}

/// Participant `i`'s game score: the scores 0 to 999 in a fixed scrambled
/// order (7919 is prime, so `i x 7919 mod 1000` visits each once per
/// thousand), as a game's scores come: the booth's top 10 changes often at
/// first and rarely later, not with every participant as rising scores
/// would make it (each change is a ranking frame to every display).
pub fn score(i: usize) -> f64 {
    ((i as u64 * 7919) % 1000) as f64
}

/// The server the day is replayed against.
enum Target {
    Embedded {
        stack: Stack,
        dir: PathBuf,
    },
    Remote {
        client: reqwest::Client,
        base: String,
        operator: String,
    },
}

impl Target {
    fn client(&self) -> &reqwest::Client {
        match self {
            Target::Embedded { stack, .. } => &stack.client,
            Target::Remote { client, .. } => client,
        }
    }
    fn base(&self) -> &str {
        match self {
            Target::Embedded { stack, .. } => &stack.base,
            Target::Remote { base, .. } => base,
        }
    }
    fn operator(&self) -> &str {
        match self {
            Target::Embedded { stack, .. } => &stack.operator,
            Target::Remote { operator, .. } => operator,
        }
    }
    fn server_pid(&self) -> Option<u32> {
        match self {
            Target::Embedded { stack, .. } => Some(stack.server.child.id()),
            Target::Remote { .. } => None,
        }
    }
    /// Err when the embedded server has exited.
    fn alive(&mut self) -> Result<(), String> {
        match self {
            Target::Embedded { stack, .. } => match stack.server.child.try_wait() {
                Ok(Some(status)) => Err(format!("the server exited ({status})")),
                _ => Ok(()),
            },
            Target::Remote { .. } => Ok(()),
        }
    }
}

/// Runs the rehearsal, prints the table (and writes the JSON) and the
/// verdict against the targets, and returns it: NO-GO when a target was
/// missed, a session was lost (accepted but no frame by the deadline) or a
/// display saw a gap or a repeat. Err when the run could not start or
/// could not measure.
pub async fn run(args: RehearseArgs) -> Result<Verdict, String> {
    let arrivals = arrivals_of(&args);
    let schedule = arrivals.schedule();
    check_inputs(&args, &schedule)?;
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let started = chrono::Utc::now();
    let load_start = super::load_average();
    let exe = std::env::current_exe().map_err(|e| format!("current executable: {e}"))?;
    let database_url = args.database_url.clone().filter(|u| !u.trim().is_empty());
    let postgres = database_url
        .as_deref()
        .filter(|u| u.starts_with("postgres"))
        .map(str::to_owned);

    // Each display is a socket in this process (and in an embedded server,
    // which inherits the limit), besides the submitters' connections.
    sockets::ensure_open_files(
        (args.terminals + args.concurrency * 2) as u64 + sockets::FD_MARGIN,
        "or use fewer --terminals",
    )?;
    let mut notes = Vec::new();
    let (mut target, backend, ai) = match &args.url {
        Some(url) => remote_target(&args, url, postgres.is_some(), &mut notes)?,
        None => embedded_target(&args, &exe, database_url.as_deref(), postgres.is_some()).await?,
    };

    let args = match &args.experience {
        Some(slug) => as_the_experience_stands(args.clone(), &target, slug).await?,
        None => args,
    };
    let outcome = day(&args, &mut target, &schedule, postgres.as_deref()).await;
    let keep = args.keep_logs || outcome.as_ref().map_or(true, |d| !d.violations.is_empty());
    let (server_log, logs_note) = shut_down(target, keep);
    let day = outcome?;
    notes.extend(server_log);
    notes.extend(day.notes.iter().cloned());
    notes.extend(logs_note);

    let setting = Setting {
        started,
        load_start,
        arrivals,
        backend,
        ai,
    };
    let report = report_of(&args, setting, day, notes);
    print_report(&args, &report)?;
    Ok(report.verdict())
}

/// When the participants arrive: `--burst`, or `--rate` for `--duration`.
fn arrivals_of(args: &RehearseArgs) -> Arrivals {
    match args.burst {
        Some(n) => Arrivals::Burst(n),
        None => Arrivals::Rate {
            per_s: args.rate,
            duration: args.duration,
        },
    }
}

/// Err when the inputs make no day: no participants, no terminal, a rate
/// out of 0..=1, a reject rate without its word, a p99 under the median.
fn check_inputs(args: &RehearseArgs, schedule: &[Duration]) -> Result<(), String> {
    if schedule.is_empty() {
        return Err("no participants: --burst 0, or --rate x --duration under one".into());
    }
    if args.terminals == 0 || args.concurrency == 0 {
        return Err("--terminals and --concurrency must be at least 1".into());
    }
    for (name, rate) in [
        ("--fail-rate", args.fail_rate),
        ("--reject-rate", args.reject_rate),
    ] {
        if !(0.0..=1.0).contains(&rate) {
            return Err(format!("{name} must be between 0 and 1"));
        }
    }
    if args.reject_rate > 0.0 && args.reject_word.trim().is_empty() {
        return Err("--reject-rate needs a --reject-word".into());
    }
    if let Some(p99) = args.ai_latency_p99 {
        if p99 < args.ai_latency {
            return Err("--ai-latency-p99 must be at least --ai-latency (the median)".into());
        }
    }
    Ok(())
}

/// The server of `--url` (with a note of what does not apply to it): the
/// target, its backend and how the AI is described.
fn remote_target(
    args: &RehearseArgs,
    url: &str,
    postgres: bool,
    notes: &mut Vec<String>,
) -> Result<(Target, &'static str, String), String> {
    let operator = args
        .operator_token
        .clone()
        .ok_or("--url needs --operator-token (or STAGEHAND_OPERATOR_TOKEN)")?;
    notes.push(
        "remote server: its own AI provider, database pool and settings apply; \
         --ai-latency, --ai-latency-p99, --fail-rate, --db-pool and --server-arg are \
         not used, and the server's memory is not measured"
            .to_owned(),
    );
    let target = Target::Remote {
        client: load::http_client(args.concurrency * 2 + 8)?,
        base: url.trim_end_matches('/').to_owned(),
        operator,
    };
    let backend = if postgres {
        "remote, PostgreSQL"
    } else {
        "remote"
    };
    Ok((target, backend, "the server's own".to_owned()))
}

/// Starts the AI simulator and the server (this binary, subprocesses) on
/// `database_url` or SQLite, in a new temp dir (kept with the logs when
/// they fail to start): the target, its backend and how the AI is
/// described.
async fn embedded_target(
    args: &RehearseArgs,
    exe: &Path,
    database_url: Option<&str>,
    postgres: bool,
) -> Result<(Target, &'static str, String), String> {
    let dir = std::env::temp_dir().join(format!("stagehand-rehearse-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let db = match database_url {
        Some(url) => url.to_owned(),
        None => format!("sqlite://{}/rehearse.db?mode=rwc", dir.display()),
    };
    let (sim_args, ai) = simulator_args(args);
    let server_args = server_args(args);
    let logs = super::logs_dir(&dir);
    eprintln!("rehearse: starting the AI simulator and the server ({db})");
    let stack = load::start_stack(
        load::Builds::one(exe),
        &db,
        &sim_args,
        &server_args,
        &logs.join("sim.log"),
        &logs.join("server.log"),
        args.concurrency * 2 + 8,
    )
    .await;
    let stack = match stack {
        Ok(s) => s,
        Err(e) => {
            super::cleanup(&dir, true);
            return Err(format!("{e} (logs kept in {})", logs.display()));
        }
    };
    let backend = if postgres { "PostgreSQL" } else { "SQLite" };
    Ok((Target::Embedded { stack, dir }, backend, ai))
}

/// The embedded server's extra flags: `--db-pool`, then each `--server-arg`
/// split on whitespace.
fn server_args(args: &RehearseArgs) -> Vec<String> {
    let mut server_args: Vec<String> = Vec::new();
    if let Some(pool) = args.db_pool {
        server_args.extend(["--db-pool".into(), pool.to_string()]);
    }
    server_args.extend(
        args.server_args
            .iter()
            .flat_map(|a| a.split_whitespace().map(str::to_owned)),
    );
    server_args
}

/// Stops the embedded server and removes its temp dir unless `keep`:
/// the notes of its log (ERROR and WARN lines, a few samples) and of where
/// the logs are kept.
fn shut_down(target: Target, keep: bool) -> (Vec<String>, Option<String>) {
    let logs_note = match &target {
        Target::Embedded { dir, .. } if keep => {
            Some(format!("logs kept in {}", dir.join("logs").display()))
        }
        _ => None,
    };
    let server_log = match &target {
        Target::Embedded { dir, .. } => load::summarize_log(&dir.join("logs").join("server.log")),
        Target::Remote { .. } => None,
    };
    if let Target::Embedded { stack, dir } = target {
        drop(stack);
        super::cleanup(&dir, keep);
    }
    let mut log_notes = Vec::new();
    if let Some(log) = &server_log {
        log_notes.push(format!(
            "server log: {} ERROR, {} WARN line(s)",
            log.errors, log.warnings
        ));
        log_notes.extend(log.samples.iter().map(|s| format!("    {s}")));
    }
    (log_notes, logs_note)
}

/// What `run` knew before the day: when it started and the load then, the
/// arrivals, the backend and how the AI is described.
struct Setting {
    started: chrono::DateTime<chrono::Utc>,
    load_start: Option<f64>,
    arrivals: Arrivals,
    backend: &'static str,
    ai: String,
}

/// The [`Report`] of the day: the inputs, the figures, `notes`, and the
/// load average now.
fn report_of(args: &RehearseArgs, setting: Setting, day: Day, notes: Vec<String>) -> Report {
    Report {
        started: setting
            .started
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average: [setting.load_start, super::load_average()],
        target: args.url.clone().unwrap_or_else(|| "embedded".into()),
        backend: setting.backend.into(),
        arrivals: setting.arrivals.describe(),
        ai: setting.ai,
        fail_rate: args.fail_rate,
        reject_rate: args.reject_rate,
        terminals: args.terminals,
        ai_calls: args.ai_calls,
        max_in_flight: args.max_in_flight,
        db_pool: args.db_pool,
        outcomes: day.outcomes,
        accepted_per_s: day.accepted_per_s,
        completed_per_s: day.completed_per_s,
        submit_ms: day.submit_ms,
        submit_to_frame_ms: day.submit_to_frame_ms,
        push_ms: day.push_ms,
        queue_depth_peak: day.queue_depth_peak,
        ai_in_flight_peak: day.ai_in_flight_peak,
        simulator_max_concurrent_jobs: day.sim_max_concurrent,
        stats_frames: day.stats_frames,
        pg: day.pg,
        unrelated_reads: day.reads,
        memory: day.memory,
        notes,
        violations: day.violations,
        queue_depth_over_time: day.depth_over_time,
        queue_depth_growth_per_s: day.depth_growth_per_s,
        capacity: day.capacity,
        burst_capacity: day.burst_capacity,
        targets: args.targets(),
    }
}

/// Prints the table (with `--json -`, the JSON, and the decision on
/// stderr), writes the JSON to `--json`'s file, then lists the delivery
/// problems on stderr.
fn print_report(args: &RehearseArgs, report: &Report) -> Result<(), String> {
    let json = serde_json::to_string_pretty(&report.to_json())
        .map_err(|e| format!("JSON of the report: {e}"))?;
    match args.json.as_deref() {
        Some("-") => {
            println!("{json}");
            // stdout is the JSON: the decision for the person on stderr.
            for line in report.decision() {
                eprintln!("{line}");
            }
        }
        Some(path) => {
            std::fs::write(path, format!("{json}\n")).map_err(|e| format!("write {path}: {e}"))?;
            println!("{}", report.render());
        }
        None => println!("{}", report.render()),
    }
    if !report.violations.is_empty() {
        eprintln!("{} problem(s) with the delivery:", report.violations.len());
        for v in &report.violations {
            eprintln!("{v}");
        }
    }
    Ok(())
}

/// The simulator's flags for the AI inputs, and how the AI is described.
fn simulator_args(args: &RehearseArgs) -> (Vec<String>, String) {
    let mut sim = vec![
        "--latency".into(),
        humantime::format_duration(args.ai_latency).to_string(),
        "--fail-rate".into(),
        args.fail_rate.to_string(),
        "--reject-word".into(),
        args.reject_word.clone(),
    ];
    let median = humantime::format_duration(args.ai_latency).to_string();
    let ai = match args.ai_latency_p99 {
        Some(p99) => {
            let p99 = humantime::format_duration(p99).to_string();
            sim.extend(["--latency-p99".into(), p99.clone()]);
            format!("simulator, latency median {median}, p99 {p99} (log-normal)")
        }
        None => format!("simulator, latency {median} fixed"),
    };
    (sim, ai)
}

/// What the day gave, before it becomes a [`Report`].
struct Day {
    outcomes: Outcomes,
    accepted_per_s: f64,
    completed_per_s: f64,
    submit_ms: Latency,
    submit_to_frame_ms: Latency,
    push_ms: Latency,
    queue_depth_peak: Option<i64>,
    ai_in_flight_peak: Option<i64>,
    sim_max_concurrent: Option<u64>,
    stats_frames: usize,
    pg: PgActivity,
    reads: Reads,
    memory: Option<Memory>,
    notes: Vec<String>,
    violations: Vec<String>,
    /// `(seconds from the first arrival, depth)`, one a second at most.
    depth_over_time: Vec<(f64, i64)>,
    /// While participants arrived at a steady rate.
    depth_growth_per_s: Option<f64>,
    capacity: Option<Capacity>,
    burst_capacity: Option<BurstCapacity>,
}

/// What the operators' stats socket showed, shared with the progress bar.
#[derive(Default)]
struct Live {
    submitted: AtomicUsize,
    accepted: AtomicUsize,
    finished: Arc<AtomicUsize>,
    queue_depth: AtomicI64,
    queue_depth_peak: AtomicI64,
    in_flight: AtomicI64,
    in_flight_peak: AtomicI64,
    stats_frames: AtomicUsize,
    /// The queue depth of every stats frame, when it came.
    depth_samples: Mutex<Vec<(Instant, i64)>>,
}

/// `args` with the cap and calls of experience `slug` as it stands on the
/// server (`--experience`).
async fn as_the_experience_stands(
    mut args: RehearseArgs,
    target: &Target,
    slug: &str,
) -> Result<RehearseArgs, String> {
    let url = format!("{}/api/experiences/{slug}", target.base());
    let answer = target
        .client()
        .get(&url)
        .bearer_auth(target.operator())
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !answer.status().is_success() {
        return Err(format!(
            "--experience {slug}: GET {url} answered {}",
            answer.status()
        ));
    }
    let experience: Value = answer.json().await.map_err(|e| format!("GET {url}: {e}"))?;
    let number = |name: &str| {
        experience[name].as_u64().map(|n| n as u32).ok_or_else(|| {
            format!("--experience {slug}: no {name} in its settings (is the token an operator's?)")
        })
    };
    args.max_in_flight = number("max_in_flight")?;
    args.ai_calls = number("ai_calls")?;
    eprintln!(
        "rehearse: experience {slug} as it stands: max_in_flight {}, ai_calls {}",
        args.max_in_flight, args.ai_calls
    );
    Ok(args)
}

/// The server's totals of `stagehand_ai_job_duration_seconds`: seconds and
/// jobs, every outcome.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct JobTotals {
    sum_s: f64,
    count: f64,
}

impl JobTotals {
    fn since(self, before: JobTotals) -> JobTotals {
        JobTotals {
            sum_s: self.sum_s - before.sum_s,
            count: self.count - before.count,
        }
    }
}

/// [`JobTotals`] of the server's `GET /metrics` (the operator token opens it).
async fn ai_job_totals(
    client: &reqwest::Client,
    base: &str,
    operator: &str,
) -> Result<JobTotals, String> {
    let text = super::cpu::metrics_text(client, base, operator).await?;
    Ok(job_totals_of(&text))
}

/// The sums of `stagehand_ai_job_duration_seconds_sum` and `_count` over
/// their labels in a Prometheus text exposition (0 when absent: no job
/// finished yet).
fn job_totals_of(text: &str) -> JobTotals {
    let mut t = JobTotals::default();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(crate::metric_names::AI_JOB_DURATION) else {
            continue;
        };
        let (field, value) = match rest.split_once(['{', ' ']) {
            Some((field, tail)) => (field, tail.rsplit(' ').next().unwrap_or("")),
            None => continue,
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        match field {
            "_sum" => t.sum_s += value,
            "_count" => t.count += value,
            _ => {}
        }
    }
    t
}

/// `updated_at` (ms since the epoch) of each session, as the server
/// recorded it in the transaction that ended the saga. Sessions it could
/// not read are left out (no push latency for them).
async fn ended_at_ms(
    client: &reqwest::Client,
    base: &str,
    sessions: &[Session],
) -> HashMap<String, i64> {
    let sessions: Arc<Vec<Session>> = Arc::new(sessions.to_vec());
    let (client, base) = (client.clone(), base.to_owned());
    let read = {
        let sessions = sessions.clone();
        load::in_workers(sessions.len(), LOOKING_UP, move |i| {
            let (client, base, sessions) = (client.clone(), base.clone(), sessions.clone());
            async move {
                let s = &sessions[i];
                let v: Value = client
                    .get(format!("{base}/api/sessions/{}", s.id))
                    .bearer_auth(&s.token)
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                let at = chrono::DateTime::parse_from_rfc3339(v["updated_at"].as_str()?).ok()?;
                Some(at.timestamp_millis())
            }
        })
        .await
    };
    sessions
        .iter()
        .zip(read)
        .filter_map(|(s, at)| Some((s.id.clone(), at?)))
        .collect()
}

/// Reads the operators' stats socket until `stop`, keeping the queue depth
/// and the experience's AI jobs in flight (now and their peaks) in `live`.
/// Reconnects when it closes. Returns what went wrong, for the notes.
async fn watch_operators(
    url: String,
    slug: String,
    live: Arc<Live>,
    mut stop: watch::Receiver<bool>,
) -> Vec<String> {
    let mut problems = Vec::new();
    'connect: loop {
        let ws = tokio::select! {
            biased;
            _ = stop.changed() => break,
            ws = tokio_tungstenite::connect_async(url.as_str()) => ws,
        };
        let mut ws = match ws {
            Ok((ws, _)) => ws,
            Err(e) => {
                if problems.len() < 3 {
                    problems.push(format!("operators' stats socket: {e}"));
                }
                tokio::select! {
                    biased;
                    _ = stop.changed() => break,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                }
            }
        };
        loop {
            let msg = tokio::select! {
                biased;
                _ = stop.changed() => break 'connect,
                msg = ws.next() => msg,
            };
            match msg {
                Some(Ok(Message::Text(text))) => {
                    if let Some((depth, in_flight)) = stats_of(text.as_str(), &slug) {
                        live.stats_frames.fetch_add(1, Ordering::Relaxed);
                        live.queue_depth.store(depth, Ordering::Relaxed);
                        live.queue_depth_peak.fetch_max(depth, Ordering::Relaxed);
                        live.depth_samples
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((Instant::now(), depth));
                        live.in_flight.store(in_flight, Ordering::Relaxed);
                        live.in_flight_peak.fetch_max(in_flight, Ordering::Relaxed);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => continue 'connect,
            }
        }
    }
    problems
}

/// `queue_depth` and the experience's `in_flight` of a `stats` frame.
fn stats_of(text: &str, slug: &str) -> Option<(i64, i64)> {
    let v: Value = serde_json::from_str(text).ok()?;
    if v["type"] != "stats" {
        return None;
    }
    let depth = v["queue_depth"].as_i64()?;
    let in_flight = v["experiences"]
        .as_array()?
        .iter()
        .find(|e| e["slug"] == slug)
        .and_then(|e| e["in_flight"].as_i64())
        .unwrap_or(0);
    Some((depth, in_flight))
}

/// Samples `pg_stat_activity` of the server's database every [`PG_EVERY`]
/// until `stop`: the most connections idle in a transaction at one sample,
/// the most that had been so for 100 ms or more, the longest one had been
/// so, and the most connections.
async fn sample_pg(url: String, mut stop: watch::Receiver<bool>) -> PgActivity {
    let conn = match super::admin_connect(&url).await {
        Ok(c) => c,
        Err(e) => return PgActivity::NotSampled(format!("n/a (connect: {e})")),
    };
    let mut tick = tokio::time::interval(PG_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut peak = PgPeaks::default();
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => break,
            _ = tick.tick() => {}
        }
        let row = conn
            .query_one_raw(Statement::from_string(
                DbBackend::Postgres,
                "SELECT \
                   count(*) FILTER (WHERE state LIKE 'idle in transaction%'), \
                   COALESCE(max((extract(epoch FROM clock_timestamp() - state_change) * 1000)) \
                     FILTER (WHERE state LIKE 'idle in transaction%'), 0)::bigint, \
                   count(*), \
                   count(*) FILTER (WHERE state LIKE 'idle in transaction%' \
                     AND clock_timestamp() - state_change >= interval '100 milliseconds') \
                 FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            ))
            .await;
        match row {
            Ok(Some(r)) => {
                let get = |i: usize| r.try_get_by_index::<i64>(i).unwrap_or(0);
                peak.add(get(0), get(1), get(2), get(3));
            }
            Ok(None) => {}
            Err(e) => {
                conn.close().await.ok();
                return PgActivity::NotSampled(format!("n/a (pg_stat_activity: {e})"));
            }
        }
    }
    conn.close().await.ok();
    PgActivity::Sampled {
        samples: peak.samples,
        idle_in_transaction_peak: peak.idle,
        idle_in_transaction_longest_ms: peak.longest_ms,
        idle_in_transaction_100ms_peak: peak.held,
        connections_peak: peak.connections,
        every_ms: PG_EVERY.as_millis() as u64,
    }
}

#[derive(Default)]
struct PgPeaks {
    samples: usize,
    idle: i64,
    longest_ms: i64,
    connections: i64,
    /// Idle in a transaction for 100 ms or more.
    held: i64,
}

impl PgPeaks {
    fn add(&mut self, idle: i64, longest_ms: i64, connections: i64, held: i64) {
        self.samples += 1;
        self.held = self.held.max(held);
        self.idle = self.idle.max(idle);
        self.longest_ms = self.longest_ms.max(longest_ms);
        self.connections = self.connections.max(connections);
    }
}

/// The progress bar on stderr (hidden when stderr is not a terminal).
fn progress_bar(n: usize) -> ProgressBar {
    let bar = ProgressBar::new(n as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} {elapsed_precise} [{bar:24}] {pos}/{len} finished | {msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Moves the bar every 100 ms: sessions finished (a frame arrived),
/// submitted, the queue depth and AI jobs in flight (against the cap) of
/// the last stats frame. When stderr is not a terminal, a line every
/// [`PLAIN_PROGRESS_EVERY`] instead.
async fn show_progress(bar: ProgressBar, n: usize, cap: u32, live: Arc<Live>) {
    let start = Instant::now();
    let mut last_line = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let finished = live.finished.load(Ordering::Relaxed);
        let msg = format!(
            "{} submitted, queue {}, AI {}/{cap}",
            live.submitted.load(Ordering::Relaxed),
            live.queue_depth.load(Ordering::Relaxed),
            live.in_flight.load(Ordering::Relaxed),
        );
        if bar.is_hidden() {
            if last_line.elapsed() >= PLAIN_PROGRESS_EVERY {
                last_line = Instant::now();
                eprintln!(
                    "rehearse: {:.0}s: {finished}/{n} finished, {msg}",
                    start.elapsed().as_secs_f64()
                );
            }
        } else {
            bar.set_position(finished as u64);
            bar.set_message(msg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_spreads_participants_evenly() {
        let s = Arrivals::Rate {
            per_s: 10.0,
            duration: Duration::from_secs(2),
        }
        .schedule();
        assert_eq!(s.len(), 20);
        assert_eq!(s[0], Duration::ZERO);
        assert_eq!(s[1], Duration::from_millis(100));
        assert_eq!(s[19], Duration::from_millis(1900));
        assert!(s.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_burst_arrives_at_once() {
        let s = Arrivals::Burst(40).schedule();
        assert_eq!(s.len(), 40);
        assert!(s.iter().all(|d| d.is_zero()));
        assert!(Arrivals::Burst(0).schedule().is_empty());
    }

    #[test]
    fn rates_parse_per_second() {
        assert_eq!(parse_arrivals("600/min"), Ok(10.0));
        assert_eq!(parse_arrivals("5/s"), Ok(5.0));
        assert!(parse_arrivals("off").is_err());
        assert!(parse_arrivals("fast").is_err());
    }

    #[test]
    fn rejections_are_exact_and_spread() {
        let picked: Vec<usize> = (0..40).filter(|&i| is_rejected(i, 0.1)).collect();
        assert_eq!(picked, vec![9, 19, 29, 39]);
        assert_eq!((0..1000).filter(|&i| is_rejected(i, 0.37)).count(), 370);
        assert_eq!((0..50).filter(|&i| is_rejected(i, 0.0)).count(), 0);
        assert_eq!((0..50).filter(|&i| is_rejected(i, 1.0)).count(), 50);
    }

    #[test]
    fn scores_are_a_scrambled_thousand() {
        let mut seen: Vec<f64> = (0..1000).map(score).collect();
        assert_ne!(
            seen[..10],
            [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
        );
        seen.sort_by(f64::total_cmp);
        assert_eq!(seen, (0..1000).map(|x| x as f64).collect::<Vec<_>>());
    }

    #[test]
    fn stats_frames_give_depth_and_in_flight() {
        let frame = r#"{"type":"stats","queue_depth":12,"experiences":[
            {"slug":"other","in_flight":9,"max_in_flight":9,"queued":0},
            {"slug":"mine","in_flight":5,"max_in_flight":5,"queued":12}]}"#;
        assert_eq!(stats_of(frame, "mine"), Some((12, 5)));
        assert_eq!(stats_of(frame, "absent"), Some((12, 0)));
        assert_eq!(stats_of(r#"{"type":"saga"}"#, "mine"), None);
    }

    #[test]
    fn job_totals_add_up_the_outcomes() {
        let text = "# TYPE stagehand_ai_job_duration_seconds histogram
stagehand_ai_job_duration_seconds_bucket{outcome=\"succeeded\",le=\"0.5\"} 3
stagehand_ai_job_duration_seconds_sum{outcome=\"succeeded\"} 4.5
stagehand_ai_job_duration_seconds_count{outcome=\"succeeded\"} 3
stagehand_ai_job_duration_seconds_sum{outcome=\"rejected\"} 0.25
stagehand_ai_job_duration_seconds_count{outcome=\"rejected\"} 1
stagehand_ai_jobs_finished_total{outcome=\"succeeded\"} 3
stagehand_saga_duration_seconds_sum{outcome=\"COMPLETED\"} 99
";
        assert_eq!(
            job_totals_of(text),
            JobTotals {
                sum_s: 4.75,
                count: 4.0
            }
        );
        assert_eq!(
            job_totals_of("stagehand_ai_job_duration_seconds_sum 2\n").sum_s,
            2.0
        );
        assert_eq!(job_totals_of(""), JobTotals::default());
    }

    #[test]
    fn pg_peaks_keep_the_most() {
        let mut p = PgPeaks::default();
        p.add(0, 0, 7, 0);
        p.add(2, 30, 5, 0);
        p.add(1, 150, 9, 1);
        assert_eq!(
            (p.samples, p.idle, p.longest_ms, p.connections, p.held),
            (3, 2, 150, 9, 1)
        );
    }
}
