//! stagehand's load tools, a crate of their own: `stagehand bench` (the
//! server measured as a user runs it, one table) and `stagehand rehearse`
//! (a synthetic event day and a GO / NO-GO verdict).
//!
//! They drive the server only through what a user has: its command line
//! (`stagehand serve`, `stagehand sim-ai`, `stagehand migrate`, and the
//! store's own claim-cost measurement, `stagehand claim-cost`), its HTTP and
//! WebSocket API and its metrics. This crate does not depend on the server
//! crate; the server binary links it for the two commands, so the tools run
//! `std::env::current_exe()` as the server they measure (or
//! `--server-binary`).
//!
//! # Layout
//!
//! This module: the flags of `stagehand bench`, the order of the run
//! (pgbench, then per backend one flat-out scenario per terminal count and
//! the paced push latency scenario, then the claim cost against queue
//! length, then the memory per idle socket), the temp dir of logs and
//! SQLite files, and the exit status. The load itself is in [`load`],
//! pgbench in [`pgbench`], the claim rounds in [`claim`], the idle sockets
//! in [`sockets`], the printed table in [`table`]. `stagehand rehearse` is
//! [`rehearse`].

pub mod claim;
pub mod cpu;
pub mod export;
pub mod load;
pub mod media;
pub mod outputs;
pub mod pgbench;
pub mod rehearse;
pub mod side;
pub mod sockets;
pub mod table;
pub mod webhooks;

/// The server's metrics these tools read, by the names `GET /metrics`
/// serves them (a public contract, as for any scraper; the server's tests
/// check that these are its names).
pub mod metric_names {
    /// Histogram: an AI job, submit to final status.
    pub const AI_JOB_DURATION: &str = "stagehand_ai_job_duration_seconds";
    /// Counter: messages handled by the server's actors, by actor.
    pub const ACTOR_MESSAGES: &str = "stagehand_actor_messages_total";
    /// Counter: tasks and actor futures the server started, by where.
    pub const TASKS_SPAWNED: &str = "stagehand_tasks_spawned_total";
    /// Counter: frames encoded to JSON text for the sockets, by kind.
    pub const FRAMES_ENCODED: &str = "stagehand_frames_encoded_total";
    /// Histogram: keeping one AI call's result files.
    pub const KEEP_DURATION: &str = "stagehand_keep_seconds";
    /// Histogram: one group COMMIT of SQLite's write gate.
    pub const SQLITE_COMMIT: &str = "stagehand_sqlite_commit_seconds";
}

/// A flag's duration: `250ms`, `10s`, `7m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration like 250ms, 10s or 7m: {e}"))
}

use std::path::{Path, PathBuf};
use std::time::Duration;

use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement,
};

use load::{Backend, Load, Scenario, ScenarioResult};
use pgbench::Pgbench;

/// Terminals of the push latency scenario, one display each.
pub const PUSH_TERMINALS: usize = 100;

/// Flags of `stagehand bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Admin URL of a PostgreSQL server (e.g.
    /// postgres://postgres@127.0.0.1:5432/postgres). When given, pgbench and
    /// the PostgreSQL scenarios run, each on a fresh database dropped after.
    #[arg(long, env = "STAGEHAND_BENCH_POSTGRES_URL")]
    pub postgres_url: Option<String>,
    /// Sagas per scenario (enough for a few seconds at full rate).
    #[arg(long, default_value_t = 6000)]
    pub sessions: usize,
    /// Concurrent HTTP submitters (phones), each sending its next
    /// submission when the last was answered. With few of them the run
    /// measures their round trips, not the server: 32 clients waiting about
    /// 27 ms each cap the rate near 1,200/s whatever the server could do.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Run the SQLite scenarios (the default).
    #[arg(long, overrides_with = "no_sqlite")]
    pub sqlite: bool,
    /// Skip the SQLite scenarios.
    #[arg(long, overrides_with = "sqlite")]
    pub no_sqlite: bool,
    /// Extra flags for each `stagehand serve`, split on whitespace
    /// (repeatable): `--server-arg "--db-pool 20"`.
    #[arg(long = "server-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Run this build's `stagehand serve` instead of this one's, for two
    /// builds measured by the same client, simulator and accounting (run
    /// the bench once with, once without, and compare side by side). The
    /// build must take the flags `serve` gets here (`--database-url`,
    /// `--bind`, `--ai-url`, `--operator-token`, the `--server-arg`s) and
    /// be the process it is started as (a wrapper script must `exec`: CPU
    /// and memory are read from that process). The claim-cost figures run
    /// in this process: they stay this build's.
    #[arg(long, value_name = "PATH")]
    pub server_binary: Option<PathBuf>,
    /// Measure the build at this path (A) against the server build (B:
    /// `--server-binary`, else this one) side by side: A B B A, `--sets`
    /// times, each run pgbench and the flat-out scenarios only; prints a
    /// row per run and, per scenario, the medians, B ÷ A and its spread.
    /// Run it before landing any change on the saga's path, with the
    /// change's parent as A. Given more than once (A, B, C, then the
    /// server build D), the builds run in order and back (A B C D D C B
    /// A), and each is compared with the one before it: a bisect in one
    /// sitting.
    #[arg(long, value_name = "A_PATH")]
    pub side_by_side: Vec<PathBuf>,
    /// Sets of A B B A for `--side-by-side`.
    #[arg(long, default_value_t = 1)]
    pub sets: usize,
    /// Terminals of the flat-out scenarios, each its own scenario (one
    /// display WebSocket per terminal).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 50])]
    pub terminals: Vec<usize>,
    /// Keep the server and simulator logs (they are also kept when a
    /// scenario fails).
    #[arg(long)]
    pub keep_logs: bool,
    /// How long to wait, after the last 202, for every frame to arrive.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub deadline: Duration,
    /// Skip the push latency scenarios (100 terminals, one display each,
    /// submissions paced at --push-rate; 202-to-frame p50 / p99: from the
    /// client holding a submission's 202 to its display reading the
    /// session's completion frame).
    #[arg(long)]
    pub no_push_latency: bool,
    /// Submissions per second in the push latency scenarios: a steady load
    /// well under the ceiling, so the figure is push latency, not queueing.
    #[arg(long, default_value_t = 200.0)]
    pub push_rate: f64,
    /// Sagas per push latency scenario (3,000 at 200/s: 15 s).
    #[arg(long, default_value_t = 3000)]
    pub push_sessions: usize,
    /// Skip the memory per idle socket (a server on SQLite, its RSS without
    /// displays and with --idle-sockets display WebSockets open and idle).
    #[arg(long)]
    pub no_socket_memory: bool,
    /// Idle display WebSockets for the memory per idle socket. This process
    /// and the server each need about this many open files, plus 256.
    #[arg(long, default_value_t = 1000)]
    pub idle_sockets: usize,
    /// Skip the throughput scenarios (1 and 50 terminals flat out) and
    /// pgbench.
    #[arg(long)]
    pub no_throughput: bool,
    /// Skip the claim cost (per backend, a dispatcher claim round's time
    /// with 1,000 and with 100,000 sagas queued, and their ratio).
    #[arg(long)]
    pub no_claim_cost: bool,
    /// Claim rounds timed per queue length (their median is the figure).
    #[arg(long, default_value_t = 30)]
    pub claim_rounds: usize,
    /// Also run PostgreSQL's 1-terminal flat-out scenario with this many
    /// servers on its one database (submitters and the display alternate
    /// between them), beside the single server: do instances fight over
    /// locks? 1: only the single server.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// Skip the media figures (photo uploads of 1.5 and 12 MP: CPU, rate,
    /// peak memory; the keep stage; a display's bytes; the 202's p99
    /// during an upload burst; the export of 10,000 results and its peak
    /// memory).
    #[arg(long)]
    pub no_media: bool,
    /// The media figures on a tenth of the photos (to check they run, not
    /// to read them).
    #[arg(long)]
    pub media_quick: bool,
    /// Skip the event's outputs (the brand's and a print's CPU-ms; 100
    /// prints over two real printers, CUPS's ippeveprinter).
    #[arg(long)]
    pub no_outputs: bool,
    /// How long each bench printer takes a print.
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    pub print_pace: Duration,
    /// Prints queued at once over the two bench printers.
    #[arg(long, default_value_t = outputs::PRINTS)]
    pub prints: usize,
    /// Rounds of the brand's and a print's CPU-ms (their median is the
    /// figure).
    #[arg(long, default_value_t = 20)]
    pub output_rounds: usize,
    /// Skip the webhooks (the 202's p99 with and without a slow endpoint,
    /// and every delivery verified by the reference library).
    #[arg(long)]
    pub no_webhooks: bool,
    /// Submissions in each of the webhook figures' three sets.
    #[arg(long, default_value_t = webhooks::HOOKS)]
    pub hooks: usize,
    /// How long the bench's webhook endpoint takes to answer.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub hook_delay: Duration,
}

/// The media figures, unless `--no-media` (a tenth with `--media-quick`).
async fn media_figures(
    args: &BenchArgs,
    builds: load::Builds<'_>,
    dir: &Path,
    server_args: &[String],
) -> Option<Result<media::MediaFigures, String>> {
    if args.no_media {
        return None;
    }
    eprintln!("bench: media (SQLite, photo uploads and kept results) running");
    let counts = if args.media_quick {
        media::MediaCounts::QUICK
    } else {
        media::MediaCounts::FULL
    };
    let mut m = media::run(builds, dir, server_args, counts).await;
    if let Ok(figures) = &mut m {
        eprintln!(
            "bench: the export (SQLite, {} results) running",
            counts.export_results
        );
        match export::run(builds, dir, server_args, counts.export_results).await {
            Ok(export) => figures.export = Some(export),
            Err(e) => m = Err(format!("the export: {e}")),
        }
    }
    if let Err(e) = &m {
        eprintln!("bench: media FAILED: {e}");
    }
    Some(m)
}

/// Runs the whole benchmark and prints the table. Err when pgbench or any
/// scenario failed or found a correctness violation.
pub async fn run(args: BenchArgs) -> Result<(), String> {
    check_args(&args)?;
    install_tls_provider();
    let bench = Bench::prepare(&args)?;
    if !args.side_by_side.is_empty() {
        return side::run(&args, &bench).await;
    }
    let started = chrono::Local::now().format("%Y-%m-%d %H:%M %Z").to_string();
    let load_start = load_average();
    let (sync_commit, pgbench) = run_pgbench(&args, &bench).await?;
    let results = run_scenarios(&args, &bench).await;
    let claim_costs = run_claim_costs(&args, &bench).await;
    let memory = run_socket_memory(&args, &bench).await;
    let media = media_figures(&args, bench.builds(), &bench.dir, &bench.server_args).await;
    let outputs = if args.no_outputs {
        None
    } else {
        eprintln!("bench: the event's outputs (brand, print) running");
        let counts = outputs::OutputCounts {
            prints: args.prints,
            rounds: args.output_rounds,
            pace: args.print_pace,
        };
        Some(outputs::run(bench.builds(), &bench.dir, &bench.server_args, counts).await)
    };
    let webhooks = if args.no_webhooks {
        None
    } else {
        eprintln!("bench: webhooks running");
        Some(
            webhooks::run(
                bench.builds(),
                &bench.dir,
                &bench.server_args,
                args.hooks.max(1),
                args.hook_delay,
            )
            .await,
        )
    };
    let m = Measured {
        sync_commit,
        pgbench,
        results,
        claim_costs,
        memory,
        media,
        outputs,
        webhooks,
    };
    print_tables(&args, &bench, started, load_start, &m);
    exit_status(&args, &bench.dir, &m)
}

/// The flags' values a run needs: at least one session, submitter and
/// instance; a push rate and sessions when push latency runs; sockets when
/// the memory per idle socket does.
fn check_args(args: &BenchArgs) -> Result<(), String> {
    if args.sessions == 0 || args.concurrency == 0 || args.instances == 0 || args.sets == 0 {
        return Err("--sessions, --concurrency, --instances and --sets must be at least 1".into());
    }
    if args.terminals.is_empty() || args.terminals.contains(&0) {
        return Err("--terminals takes terminal counts of at least 1, such as 1,50".into());
    }
    let push = !args.no_push_latency;
    if push && args.push_sessions == 0 {
        return Err("--push-sessions must be at least 1".into());
    }
    if push && !(args.push_rate.is_finite() && args.push_rate > 0.0) {
        return Err("--push-rate must be a positive number of submissions per second".into());
    }
    if !args.no_socket_memory && args.idle_sockets == 0 {
        return Err("--idle-sockets must be at least 1".into());
    }
    Ok(())
}

/// reqwest is built without a TLS provider of its own: installs ring's,
/// unless the process has one.
fn install_tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// What every stage of a bench run shares: the builds, the temp dir, the
/// server flags and which backends run.
struct Bench {
    /// This build: the AI simulator (and the server, unless
    /// `--server-binary`).
    exe: PathBuf,
    /// The build whose `stagehand serve` runs.
    server_exe: PathBuf,
    /// The run's temp dir (logs, SQLite files).
    dir: PathBuf,
    /// The `--server-arg`s, split on whitespace.
    server_args: Vec<String>,
    /// The PostgreSQL admin URL, unless none or empty.
    postgres: Option<String>,
    run_sqlite: bool,
}

impl Bench {
    /// Finds the builds, creates the temp dir and checks there is
    /// something to run.
    fn prepare(args: &BenchArgs) -> Result<Bench, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current executable: {e}"))?;
        let server_exe = match &args.server_binary {
            Some(path) if !path.is_file() => {
                return Err(format!("--server-binary {}: no such file", path.display()))
            }
            Some(path) => path.clone(),
            None => exe.clone(),
        };
        let dir = std::env::temp_dir().join(format!("stagehand-bench-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let server_args: Vec<String> = args
            .server_args
            .iter()
            .flat_map(|a| a.split_whitespace().map(str::to_owned))
            .collect();
        let postgres = args.postgres_url.clone().filter(|u| !u.trim().is_empty());
        let run_sqlite = !args.no_sqlite;
        if postgres.is_none() && !run_sqlite && args.no_socket_memory {
            return Err(
                "nothing to run: no --postgres-url, --no-sqlite and --no-socket-memory".into(),
            );
        }
        Ok(Bench {
            exe,
            server_exe,
            dir,
            server_args,
            postgres,
            run_sqlite,
        })
    }

    /// The backends measured, PostgreSQL first.
    fn backends(&self) -> Vec<Backend> {
        let mut backends = Vec::new();
        if self.postgres.is_some() {
            backends.push(Backend::Postgres);
        }
        if self.run_sqlite {
            backends.push(Backend::Sqlite);
        }
        backends
    }

    /// The simulator's build and the server's.
    fn builds(&self) -> load::Builds<'_> {
        load::Builds {
            sim: &self.exe,
            server: &self.server_exe,
        }
    }
}

/// What the stages measured.
struct Measured {
    /// PostgreSQL's `synchronous_commit`, when pgbench ran.
    sync_commit: Option<String>,
    pgbench: Option<Pgbench>,
    /// The load scenarios, in the order they ran.
    results: Vec<ScenarioResult>,
    claim_costs: Vec<claim::ClaimCostResult>,
    memory: Option<sockets::SocketMemoryResult>,
    media: Option<Result<media::MediaFigures, String>>,
    outputs: Option<Result<outputs::OutputFigures, String>>,
    webhooks: Option<Result<webhooks::HookFigures, String>>,
}

/// PostgreSQL's `synchronous_commit` and pgbench, with PostgreSQL and the
/// throughput scenarios; Err when `synchronous_commit` cannot be read.
async fn run_pgbench(
    args: &BenchArgs,
    bench: &Bench,
) -> Result<(Option<String>, Option<Pgbench>), String> {
    let Some(admin) = bench.postgres.as_ref().filter(|_| !args.no_throughput) else {
        return Ok((None, None));
    };
    let sync_commit = synchronous_commit(admin).await?;
    eprintln!("bench: pgbench (prepared single-row UPDATE, -c 8 -j 2 -T 8)");
    let outcome = pgbench::run(admin, &bench.dir).await;
    match &outcome {
        Pgbench::Tps(tps) => eprintln!("bench: pgbench {tps:.0} tps"),
        Pgbench::NotInstalled => eprintln!("bench: pgbench is not on PATH; no ratios"),
        Pgbench::Failed(e) => eprintln!("bench: pgbench failed: {e}"),
    }
    Ok((Some(sync_commit), Some(outcome)))
}

/// The load scenarios, per backend: flat out on 1 terminal (and on
/// PostgreSQL with `--instances` servers), flat out on 50, then push
/// latency; each as (backend, terminals, load, instances).
fn scenarios(args: &BenchArgs, bench: &Bench) -> Vec<(Backend, usize, Load, usize)> {
    let mut scenarios = Vec::new();
    for backend in bench.backends() {
        if !args.no_throughput {
            for &terminals in &args.terminals {
                scenarios.push((backend, terminals, Load::FlatOut, 1));
                if terminals == 1 && backend == Backend::Postgres && args.instances > 1 {
                    scenarios.push((backend, 1, Load::FlatOut, args.instances));
                }
            }
        }
        if !args.no_push_latency {
            scenarios.push((backend, PUSH_TERMINALS, Load::Paced(args.push_rate), 1));
        }
    }
    scenarios
}

/// Runs the load scenarios one after another, each reported when done.
async fn run_scenarios(args: &BenchArgs, bench: &Bench) -> Vec<ScenarioResult> {
    let mut results = Vec::new();
    for (backend, terminals, load, instances) in scenarios(args, bench) {
        let scenario = Scenario {
            exe: bench.exe.clone(),
            server_exe: bench.server_exe.clone(),
            backend,
            terminals,
            sessions: match load {
                Load::FlatOut => args.sessions,
                Load::Paced(_) => args.push_sessions,
            },
            concurrency: args.concurrency,
            load,
            instances,
            server_args: bench.server_args.clone(),
            admin_url: bench.postgres.clone(),
            dir: bench.dir.clone(),
            deadline: args.deadline,
        };
        eprintln!("bench: {} running", scenario.label());
        let result = load::run(&scenario).await;
        report_scenario(&scenario, &result);
        results.push(result);
    }
    results
}

/// One line on stderr: a scenario's main figures, or the first line of why
/// it failed.
fn report_scenario(scenario: &Scenario, result: &ScenarioResult) {
    match &result.outcome {
        Ok(f) if scenario.load.is_paced() => eprintln!(
            "bench: {} done: sent {:.1}/s (latest {:.1} ms behind schedule); \
             202-to-frame p50 {:.1} ms, p99 {:.1} ms; submit p50 {:.1} ms, p99 {:.1} ms",
            scenario.label(),
            f.sent_per_s,
            f.behind_schedule_ms,
            f.frame_after_202_p50_ms,
            f.frame_after_202_p99_ms,
            f.submit_p50_ms,
            f.submit_p99_ms
        ),
        Ok(f) => eprintln!(
            "bench: {} done: {:.0} accepted/s, {:.0} sagas/s end to end; \
             {} unrelated reads, p50 {:.1} ms, p99 {:.1} ms",
            scenario.label(),
            f.accepted_per_s,
            f.sagas_per_s,
            f.reads,
            f.read_p50_ms,
            f.read_p99_ms
        ),
        Err(e) => eprintln!(
            "bench: {} FAILED: {} (details at the end)",
            scenario.label(),
            e.trim().lines().next().unwrap_or_default()
        ),
    }
}

/// The claim cost per backend, unless `--no-claim-cost` (or no rounds).
async fn run_claim_costs(args: &BenchArgs, bench: &Bench) -> Vec<claim::ClaimCostResult> {
    let mut claim_costs = Vec::new();
    if args.no_claim_cost || args.claim_rounds == 0 {
        return claim_costs;
    }
    for backend in bench.backends() {
        eprintln!(
            "bench: claim cost ({}, {} rounds at 1,000 and at 100,000 queued) running",
            backend.name(),
            args.claim_rounds
        );
        let c = claim::run(
            backend,
            bench.postgres.as_deref(),
            &bench.dir,
            args.claim_rounds,
        )
        .await;
        if let Err(e) = &c.outcome {
            eprintln!("bench: claim cost ({}) FAILED: {e}", backend.name());
        }
        claim_costs.push(c);
    }
    claim_costs
}

/// The memory per idle socket, unless `--no-socket-memory`.
async fn run_socket_memory(args: &BenchArgs, bench: &Bench) -> Option<sockets::SocketMemoryResult> {
    if args.no_socket_memory {
        return None;
    }
    eprintln!(
        "bench: memory per idle socket (SQLite, {} display WebSockets) running",
        args.idle_sockets
    );
    let m = sockets::run(
        bench.builds(),
        &bench.dir,
        &bench.server_args,
        args.idle_sockets,
    )
    .await;
    match &m.outcome {
        Ok(x) => eprintln!(
            "bench: memory per idle socket done: {:.1} KiB per socket (VmRSS {} KiB -> {} KiB)",
            x.per_socket_kib(),
            x.rss_idle_kib,
            x.rss_sockets_kib
        ),
        Err(e) => eprintln!(
            "bench: memory per idle socket FAILED: {} (details at the end)",
            e.trim().lines().next().unwrap_or_default()
        ),
    }
    Some(m)
}

/// Prints the result on stdout: the header, the table of the scenarios,
/// the claim cost, the memory per idle socket, the media figures and the
/// notes on the server logs, each part only when it ran.
fn print_tables(
    args: &BenchArgs,
    bench: &Bench,
    started: String,
    load_start: Option<f64>,
    m: &Measured,
) {
    let header = table::header(&table::Header {
        started,
        load_start,
        load_end: load_average(),
        sessions: args.sessions,
        concurrency: args.concurrency,
        push: m
            .results
            .iter()
            .any(|r| r.load.is_paced())
            .then_some((args.push_sessions, args.push_rate)),
        flat: m.results.iter().any(|r| !r.load.is_paced()),
        terminals: &args.terminals,
        sync_commit: m.sync_commit.as_deref(),
        pgbench: m.pgbench.as_ref(),
        server_args: &bench.server_args,
        server_binary: args.server_binary.as_deref(),
    });
    println!("{header}");
    if !m.results.is_empty() {
        println!("{}", table::render(&m.results, m.pgbench.as_ref()));
    }
    let mut parts = Vec::new();
    if !m.claim_costs.is_empty() {
        parts.push(table::claim_cost(&m.claim_costs));
    }
    if let Some(memory) = &m.memory {
        parts.push(table::socket_memory(memory));
    }
    if let Some(Ok(media)) = &m.media {
        parts.push(table::media(media));
    }
    let notes = table::notes(&m.results);
    if !notes.is_empty() {
        parts.push(notes);
    }
    for lines in parts {
        println!();
        for line in lines {
            println!("{line}");
        }
    }
    if let Some(outputs) = &m.outputs {
        outputs::print_table(outputs);
    }
    if let Some(hooks) = &m.webhooks {
        webhooks::print_table(hooks);
    }
}

/// Prints the details of each failure, deletes the temp dir (keeping the
/// logs after a failure, or with `--keep-logs`), and the run's status: Err
/// naming what failed.
fn exit_status(args: &BenchArgs, dir: &Path, m: &Measured) -> Result<(), String> {
    let failed: Vec<&ScenarioResult> = m.results.iter().filter(|r| r.outcome.is_err()).collect();
    let pgbench_failed = matches!(m.pgbench, Some(Pgbench::Failed(_)));
    for r in &failed {
        if let Err(e) = &r.outcome {
            eprintln!("\n{} FAILED:\n{e}", r.label);
        }
    }
    let media_failed = matches!(m.media, Some(Err(_)))
        || matches!(m.outputs, Some(Err(_)))
        || matches!(m.webhooks, Some(Err(_)));
    let memory_failed = match &m.memory {
        Some(memory) => match &memory.outcome {
            Err(e) => {
                eprintln!("\nmemory per idle socket FAILED:\n{e}");
                true
            }
            Ok(_) => false,
        },
        None => false,
    };
    let claim_failed = m.claim_costs.iter().any(|c| c.outcome.is_err());
    let keep =
        args.keep_logs || !failed.is_empty() || pgbench_failed || memory_failed || media_failed;
    cleanup(dir, keep);
    if keep {
        eprintln!("logs kept in {}", dir.join("logs").display());
    }
    let mut what = Vec::new();
    if !failed.is_empty() {
        what.push(format!(
            "{} of {} scenario(s) failed",
            failed.len(),
            m.results.len()
        ));
    }
    if pgbench_failed {
        what.push("pgbench failed".into());
    }
    if media_failed {
        what.push("the media figures failed".into());
    }
    if memory_failed {
        what.push("the memory per idle socket failed".into());
    }
    if claim_failed {
        what.push("the claim cost failed".into());
    }
    if what.is_empty() {
        Ok(())
    } else {
        Err(what.join(", "))
    }
}

/// The 1-minute load average of `/proc/loadavg`, if there is one.
pub(crate) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Deletes the SQLite files always, and the logs unless `keep`.
pub(crate) fn cleanup(dir: &Path, keep: bool) {
    if keep {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_name() != "logs" {
                    let path = entry.path();
                    let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
                }
            }
        }
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A connection through the admin URL, without sqlx's statement logs (they
/// would land in the middle of the table).
pub(crate) async fn admin_connect(admin: &str) -> Result<DatabaseConnection, sea_orm::DbErr> {
    let mut options = ConnectOptions::new(admin);
    options.sqlx_logging(false).max_connections(1);
    Database::connect(options).await
}

/// `SHOW synchronous_commit` on the admin connection.
async fn synchronous_commit(admin: &str) -> Result<String, String> {
    let conn = admin_connect(admin)
        .await
        .map_err(|e| format!("connect to {admin}: {e}"))?;
    let row = conn
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SHOW synchronous_commit",
        ))
        .await
        .map_err(|e| format!("SHOW synchronous_commit: {e}"))?;
    conn.close().await.ok();
    row.and_then(|r| r.try_get::<String>("", "synchronous_commit").ok())
        .ok_or_else(|| "SHOW synchronous_commit returned nothing".into())
}

/// A fresh PostgreSQL database, `stagehand_bench_<random>`, created through
/// the admin URL; returns its URL and name.
pub async fn create_database(admin: &str) -> Result<(String, String), String> {
    let name = format!("stagehand_bench_{}", uuid::Uuid::new_v4().simple());
    let conn = admin_connect(admin)
        .await
        .map_err(|e| format!("connect to {admin}: {e}"))?;
    let created = conn
        .execute_unprepared(&format!("CREATE DATABASE \"{name}\""))
        .await
        .map_err(|e| format!("CREATE DATABASE {name}: {e}"));
    conn.close().await.ok();
    created?;
    Ok((database_url(admin, &name), name))
}

/// `DROP DATABASE ... WITH (FORCE)`; a failure is only reported.
pub async fn drop_database(admin: &str, name: &str) {
    let dropped = match admin_connect(admin).await {
        Ok(conn) => {
            let r = conn
                .execute_unprepared(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string());
            conn.close().await.ok();
            r
        }
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = dropped {
        eprintln!("bench: could not drop database {name}: {e}");
    }
}

/// The admin URL with its database name replaced by `name` (query kept).
fn database_url(admin: &str, name: &str) -> String {
    let (main, query) = match admin.split_once('?') {
        Some((m, q)) => (m, Some(q)),
        None => (admin, None),
    };
    let authority_start = main.find("://").map_or(0, |i| i + 3);
    let base = match main[authority_start..].find('/') {
        Some(i) => &main[..authority_start + i],
        None => main,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// `<dir>/logs`, created.
pub fn logs_dir(dir: &Path) -> PathBuf {
    let logs = dir.join("logs");
    let _ = std::fs::create_dir_all(&logs);
    logs
}

#[cfg(test)]
mod tests {
    use super::database_url;

    #[test]
    fn database_url_replaces_the_name() {
        assert_eq!(
            database_url("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            database_url("postgres://u@h:5432", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(
            database_url("postgres://u@h/postgres?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
    }
}
