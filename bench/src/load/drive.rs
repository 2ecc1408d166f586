//! One scenario's run, stage by stage, on a database made for it: the
//! simulator and the servers, the untimed setup, one display per terminal,
//! the timed submissions (with the progress line, the unrelated reader and
//! the lock-wait sampler beside them), the wait for every frame, the
//! correctness check and the figures.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sea_orm::DatabaseConnection;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::super::cpu::{self, Counters, LockWaits, PerSaga};
use super::{
    bench_experience, check, connect_display, create_sessions, create_terminals, display,
    display_url, in_workers, instance_log, instant_ai, lookup, missing_sessions, ms, percentile,
    read_client, secs, start_server, start_stack, submit, unrelated_reads, Backend, Builds,
    DisplayLog, Figures, Load, Proc, ReadLog, Scenario, Session, Stack, Terminal, LOOKUPS,
};

/// Kinds of lock wait printed after a PostgreSQL scenario, most first.
const LOCK_WAITS_SHOWN: usize = 6;
/// The bench's unrelated read, as the failures name it.
const RANKING_READ: &str = "GET .../ranking?limit=10";

/// Runs scenario `s` on `database_url`: its figures, or what went wrong
/// (a refused submission, a correctness violation, a server that failed).
pub(super) async fn drive(
    s: &Scenario,
    database_url: &str,
    logs: &Path,
    server_log: &Path,
) -> Result<Figures, String> {
    let mut servers = start_servers(s, database_url, logs, server_log).await?;
    let setup = set_up(s, &servers).await?;
    let index_of = setup.index_of();
    let signals = Signals::new();
    let displays = connect_displays(&servers, &setup, &signals).await?;
    let watchers = start_watchers(s, &servers, &setup, &signals)?;
    let mut meters = Meters::start(s, database_url, &servers, &signals.stop_rx).await;
    let submitted = submit_all(s, &servers, &setup.sessions, &signals.accepted).await;
    let failed = refusals(&submitted);
    // Only when every submission was accepted is every frame due.
    let timed_out =
        failed.is_empty() && wait_for_frames(s, &signals.arrived, &mut servers.instances).await;
    let counters_after = meters.read(&servers).await;
    let seen = stop_watching(s, &signals, watchers, displays, meters.lock_waits.take()).await?;
    if !failed.is_empty() {
        return Err(not_accepted(s, &failed, &seen.read_log));
    }
    check_correctness(s, &servers, &setup.sessions, &index_of, &seen, timed_out).await?;
    servers.stop();
    let per_saga = per_saga(s, &meters.before, &counters_after, seen.lock_waits.as_ref());
    Ok(figures(
        &setup.sessions,
        &index_of,
        &submitted,
        seen,
        per_saga,
    ))
}

/// The scenario's processes, killed when dropped (the servers first), and
/// what it takes to talk to them.
struct Servers {
    client: reqwest::Client,
    /// Every instance, in start order.
    instances: Vec<Proc>,
    sim: Proc,
    /// The first instance's base URL (setup, the reader, the lookups).
    base: String,
    /// Every instance's base URL, in start order.
    bases: Arc<Vec<String>>,
    operator: String,
}

impl Servers {
    /// A client, the instances' base URLs and the operator token, for the
    /// counters of their `/metrics`.
    fn metrics(&self) -> (&reqwest::Client, &[String], &str) {
        (&self.client, &self.bases, &self.operator)
    }

    /// Stops every server, then the simulator.
    fn stop(self) {
        let Servers { instances, sim, .. } = self;
        drop(instances);
        drop(sim);
    }
}

/// The AI simulator and the scenario's servers as a user runs them: the
/// first, then the other instances on the same database, the same AI and
/// the same operator token.
async fn start_servers(
    s: &Scenario,
    database_url: &str,
    logs: &Path,
    server_log: &Path,
) -> Result<Servers, String> {
    let Stack {
        client,
        sim,
        server,
        base,
        operator,
        sim_url,
    } = start_stack(
        Builds {
            sim: &s.exe,
            server: &s.server_exe,
        },
        database_url,
        &instant_ai(),
        &s.server_args,
        &logs.join(format!("{}-sim.log", s.file_stem())),
        server_log,
        s.concurrency * 2 + 8,
    )
    .await?;
    let mut instances = vec![server];
    let mut bases = vec![base.clone()];
    for k in 2..=s.instances {
        let (server, base) = start_server(
            &s.server_exe,
            database_url,
            &sim_url,
            &operator,
            &s.server_args,
            &instance_log(server_log, k),
            &client,
        )
        .await?;
        instances.push(server);
        bases.push(base);
    }
    Ok(Servers {
        client,
        instances,
        sim,
        base,
        bases: Arc::new(bases),
        operator,
    })
}

/// What the untimed setup made: an experience, its terminals and the
/// participant sessions spread over them.
struct Setup {
    slug: String,
    terminals: Vec<Terminal>,
    sessions: Arc<Vec<Session>>,
}

impl Setup {
    /// Each session's index, by its id.
    fn index_of(&self) -> HashMap<&str, usize> {
        self.sessions
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id.as_str(), i))
            .collect()
    }
}

/// The untimed setup: the experience, `s.terminals` terminals and
/// `s.sessions` sessions.
async fn set_up(s: &Scenario, servers: &Servers) -> Result<Setup, String> {
    let (client, base, operator) = (&servers.client, &servers.base, &servers.operator);
    let (slug, terminals) =
        create_terminals(client, base, operator, bench_experience(), s.terminals).await?;
    eprintln!(
        "  {}: setup: {} sessions on {} terminal(s)",
        s.label(),
        s.sessions,
        s.terminals
    );
    let sessions = create_sessions(
        client,
        base,
        &slug,
        terminals.iter().map(|t| t.id.clone()).collect(),
        s.sessions,
        s.concurrency,
        Arc::default(),
    )
    .await?;
    Ok(Setup {
        slug,
        terminals,
        sessions: Arc::new(sessions),
    })
}

/// What the timed part shares with the tasks beside it: the signal to stop
/// and the running counts.
struct Signals {
    stop_tx: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
    /// Sessions whose frame reached their own terminal's display.
    arrived: Arc<AtomicUsize>,
    /// Submissions answered 202.
    accepted: Arc<AtomicUsize>,
    /// Unrelated reads made.
    reads: Arc<AtomicUsize>,
}

impl Signals {
    /// Not stopped, nothing counted yet.
    fn new() -> Signals {
        let (stop_tx, stop_rx) = watch::channel(false);
        Signals {
            stop_tx,
            stop_rx,
            arrived: Arc::new(AtomicUsize::new(0)),
            accepted: Arc::new(AtomicUsize::new(0)),
            reads: Arc::new(AtomicUsize::new(0)),
        }
    }
}

/// One display per terminal (terminal `t` on instance `t % instances`),
/// connected before the clock starts, each a task reading its frames until
/// told to stop.
async fn connect_displays(
    servers: &Servers,
    setup: &Setup,
    signals: &Signals,
) -> Result<Vec<JoinHandle<DisplayLog>>, String> {
    let mut displays = Vec::new();
    for (t, terminal) in setup.terminals.iter().enumerate() {
        let url = display_url(&servers.bases[t % servers.bases.len()], terminal);
        let ws = connect_display(&url, 0)
            .await
            .map_err(|e| format!("display {t}: {e}"))?;
        let expected: HashSet<String> = setup
            .sessions
            .iter()
            .filter(|x| x.terminal == t)
            .map(|x| x.id.clone())
            .collect();
        displays.push(tokio::spawn(display(
            url,
            ws,
            expected,
            signals.arrived.clone(),
            signals.stop_rx.clone(),
        )));
    }
    Ok(displays)
}

/// The tasks beside the timed submissions: the progress line and (flat out
/// only) the unrelated reader.
struct Watchers {
    progress: JoinHandle<()>,
    reader: Option<JoinHandle<ReadLog>>,
}

/// Starts the progress line and, flat out, one client reading the public
/// ranking, one read after another, until the last frame.
fn start_watchers(
    s: &Scenario,
    servers: &Servers,
    setup: &Setup,
    signals: &Signals,
) -> Result<Watchers, String> {
    let progress = tokio::spawn(report_progress(
        s.label(),
        s.sessions,
        signals.accepted.clone(),
        signals.arrived.clone(),
        (!s.load.is_paced()).then(|| signals.reads.clone()),
    ));
    let reader = if s.load.is_paced() {
        None
    } else {
        let read_client = read_client()?;
        Some(tokio::spawn(unrelated_reads(
            read_client,
            format!(
                "{}/api/experiences/{}/ranking?limit=10",
                servers.base, setup.slug
            ),
            |v| v["entries"].is_array(),
            s.sessions,
            signals.arrived.clone(),
            signals.reads.clone(),
            signals.stop_rx.clone(),
        )))
    };
    Ok(Watchers { progress, reader })
}

/// The machine's counters before the timed part, what it takes to read
/// them again after, and (PostgreSQL) the lock-wait sampler.
struct Meters {
    /// PostgreSQL: a connection of our own to the scenario's database.
    stats_db: Option<DatabaseConnection>,
    server_pids: Vec<u32>,
    simulator_pid: u32,
    before: Counters,
    /// When `before` was read.
    before_at: Instant,
    /// PostgreSQL: who waits for a lock, sampled until the last frame.
    lock_waits: Option<JoinHandle<Option<LockWaits>>>,
}

impl Meters {
    /// Reads the counters before the timed part and, on PostgreSQL, starts
    /// sampling the lock waits until `stop`.
    async fn start(
        s: &Scenario,
        database_url: &str,
        servers: &Servers,
        stop: &watch::Receiver<bool>,
    ) -> Meters {
        let stats_db = match s.backend {
            Backend::Postgres => super::super::admin_connect(database_url).await.ok(),
            Backend::Sqlite => None,
        };
        let server_pids: Vec<u32> = servers.instances.iter().map(|p| p.child.id()).collect();
        let simulator_pid = servers.sim.child.id();
        let before = Counters::read(
            &server_pids,
            Some(simulator_pid),
            stats_db.as_ref(),
            servers.metrics(),
        )
        .await;
        let before_at = Instant::now();
        let lock_waits = match s.backend {
            Backend::Postgres => Some(tokio::spawn(cpu::sample_lock_waits(
                database_url.to_owned(),
                stop.clone(),
            ))),
            Backend::Sqlite => None,
        };
        Meters {
            stats_db,
            server_pids,
            simulator_pid,
            before,
            before_at,
            lock_waits,
        }
    }

    /// The counters now, read no sooner than [`cpu::SCRAPE_REFRESH`] after
    /// `before` (a run shorter than that would otherwise read the same
    /// rendering of `/metrics` twice, and count nothing).
    async fn read(&self, servers: &Servers) -> Counters {
        tokio::time::sleep_until((self.before_at + cpu::SCRAPE_REFRESH).into()).await;
        Counters::read(
            &self.server_pids,
            Some(self.simulator_pid),
            self.stats_db.as_ref(),
            servers.metrics(),
        )
        .await
    }
}

/// One timed submission.
struct Submitted {
    /// When it was due (paced runs; `start` when flat out).
    due: Instant,
    start: Instant,
    end: Instant,
    outcome: Result<(), String>,
}

/// The timed submissions, one per session, `s.concurrency` at a time,
/// alternating between the instances: flat out, or paced (submission `i`
/// due at `t0 + i / rate`).
async fn submit_all(
    s: &Scenario,
    servers: &Servers,
    sessions: &Arc<Vec<Session>>,
    accepted: &Arc<AtomicUsize>,
) -> Vec<Submitted> {
    let t0 = Instant::now() + Duration::from_millis(20);
    let pace = match s.load {
        Load::FlatOut => None,
        Load::Paced(rate) => Some(rate),
    };
    let (client, bases, sessions, accepted) = (
        servers.client.clone(),
        servers.bases.clone(),
        sessions.clone(),
        accepted.clone(),
    );
    in_workers(s.sessions, s.concurrency, move |i| {
        let (client, sessions, accepted) = (client.clone(), sessions.clone(), accepted.clone());
        let base = bases[i % bases.len()].clone();
        let due = pace.map(|rate| t0 + Duration::from_secs_f64(i as f64 / rate));
        async move { submit_one(&client, &base, &sessions[i], i, due, &accepted).await }
    })
    .await
}

/// Submission `i`, for `session`: waits until it is `due` (paced), sends
/// it, times it and counts it when accepted.
async fn submit_one(
    client: &reqwest::Client,
    base: &str,
    session: &Session,
    i: usize,
    due: Option<Instant>,
    accepted: &AtomicUsize,
) -> Submitted {
    if let Some(due) = due {
        tokio::time::sleep_until(due.into()).await;
    }
    let start = Instant::now();
    let due = due.unwrap_or(start);
    let body = json!({"prompt": format!("bench prompt {i}"), "score": (i % 1000) as f64});
    let sent = submit(client, base, session, &body).await;
    let end = Instant::now();
    let outcome = match sent {
        Ok(()) => {
            accepted.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(refused) => Err(refused.to_string()),
    };
    Submitted {
        due,
        start,
        end,
        outcome,
    }
}

/// The submissions not accepted: their index and why.
fn refusals(submitted: &[Submitted]) -> Vec<(usize, &String)> {
    submitted
        .iter()
        .enumerate()
        .filter_map(|(i, x)| x.outcome.as_ref().err().map(|e| (i, e)))
        .collect()
}

/// Waits for every frame: false once they all arrived, true when the
/// deadline passed or a server exited first.
async fn wait_for_frames(s: &Scenario, arrived: &AtomicUsize, instances: &mut [Proc]) -> bool {
    let deadline = Instant::now() + s.deadline;
    loop {
        if arrived.load(Ordering::Relaxed) >= s.sessions {
            return false;
        }
        if Instant::now() > deadline {
            return true;
        }
        if let Some(status) = instances
            .iter_mut()
            .find_map(|p| p.child.try_wait().ok().flatten())
        {
            eprintln!("  {}: a server exited ({status})", s.label());
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the tasks beside the timed part saw.
struct Seen {
    /// Each display's frames, by terminal.
    logs_by_terminal: Vec<DisplayLog>,
    /// The unrelated reads (none when paced).
    read_log: ReadLog,
    /// PostgreSQL: the lock waits sampled.
    lock_waits: Option<LockWaits>,
}

/// Stops the progress line, tells every task to stop, and gathers what the
/// lock-wait sampler, the displays and the reader saw.
async fn stop_watching(
    s: &Scenario,
    signals: &Signals,
    watchers: Watchers,
    displays: Vec<JoinHandle<DisplayLog>>,
    lock_waits: Option<JoinHandle<Option<LockWaits>>>,
) -> Result<Seen, String> {
    watchers.progress.abort();
    let _ = signals.stop_tx.send(true);
    let lock_waits = match lock_waits {
        Some(task) => task.await.ok().flatten(),
        None => None,
    };
    let mut logs_by_terminal = Vec::new();
    for d in displays {
        logs_by_terminal.push(d.await.map_err(|e| format!("display task: {e}"))?);
    }
    let read_log = match watchers.reader {
        Some(reader) => {
            let log = reader.await.map_err(|e| format!("reader task: {e}"))?;
            eprintln!(
                "  {}: {} unrelated read(s) under load, {} failed",
                s.label(),
                log.count(),
                log.failures.len()
            );
            log
        }
        None => ReadLog::default(),
    };
    Ok(Seen {
        logs_by_terminal,
        read_log,
        lock_waits,
    })
}

/// The failure of a run whose submissions were not all accepted: the first
/// ten refusals, and the unrelated reads that failed.
fn not_accepted(s: &Scenario, failed: &[(usize, &String)], read_log: &ReadLog) -> String {
    let mut msg = format!(
        "{} of {} submissions were not accepted (202):",
        failed.len(),
        s.sessions
    );
    for (i, e) in failed.iter().take(10) {
        msg.push_str(&format!("\n  submission {i}: {e}"));
    }
    for line in read_log.problems(RANKING_READ) {
        msg.push('\n');
        msg.push_str(&line);
    }
    msg
}

/// The correctness check: every session completed exactly once at its own
/// terminal, in `seq` order, and every unrelated read answered. Err lists
/// the violations, and the server's view of the sessions that never
/// arrived.
async fn check_correctness(
    s: &Scenario,
    servers: &Servers,
    sessions: &[Session],
    index_of: &HashMap<&str, usize>,
    seen: &Seen,
    timed_out: bool,
) -> Result<(), String> {
    let logs = &seen.logs_by_terminal;
    let mut violations = check(sessions, index_of, logs, true, timed_out, s.deadline);
    violations.extend(seen.read_log.problems(RANKING_READ));
    if violations.is_empty() {
        return Ok(());
    }
    let mut msg = violations.join("\n");
    let missing: Vec<&str> = missing_sessions(sessions, logs);
    if !missing.is_empty() {
        msg.push_str(&format!(
            "\n  the server's view of {} missing session(s), status/step: {}",
            missing.len().min(LOOKUPS),
            lookup(&servers.client, &servers.base, &servers.operator, &missing).await
        ));
    }
    Err(msg)
}

/// What the timed part cost per saga (PostgreSQL: less the lock-wait
/// sampler's own CPU); prints the lock waits by statement and the actor
/// messages per saga.
fn per_saga(
    s: &Scenario,
    before: &Counters,
    after: &Counters,
    lock_waits: Option<&LockWaits>,
) -> PerSaga {
    let mut per_saga = before.per_saga(after, s.sessions, s.backend == Backend::Postgres);
    if let Some(w) = lock_waits {
        per_saga.lock_waits = Some(w.per_saga(s.sessions));
        if let Some(pg) = per_saga.postgres_cpu_ms.as_mut() {
            *pg = (*pg - w.sampler_cpu_ms(s.sessions)).max(0.0);
        }
        if w.failed_samples > 0 {
            eprintln!(
                "  {}: {} lock-wait sample(s) failed and counted no waits",
                s.label(),
                w.failed_samples
            );
        }
        for (what, n) in w.by_statement.iter().take(LOCK_WAITS_SHOWN) {
            eprintln!("  {}: {n} lock wait(s) on {what}", s.label());
        }
    }
    let by_actor: Vec<String> = per_saga
        .actor_messages_by_actor
        .iter()
        .map(|(actor, n)| format!("{actor} {n:.2}"))
        .collect();
    eprintln!(
        "  {}: actor messages per saga: {}",
        s.label(),
        by_actor.join(", ")
    );
    per_saga
}

/// When each session's first frame arrived (by session index).
fn first_frames(
    sessions: usize,
    index_of: &HashMap<&str, usize>,
    logs: &[DisplayLog],
) -> Vec<Option<Instant>> {
    let mut frame_at: Vec<Option<Instant>> = vec![None; sessions];
    for log in logs {
        for f in &log.frames {
            if let Some(&i) = index_of.get(f.session_id.as_str()) {
                frame_at[i].get_or_insert(f.at);
            }
        }
    }
    frame_at
}

/// The figures of a correct run (every submission accepted, every frame
/// arrived).
fn figures(
    sessions: &[Session],
    index_of: &HashMap<&str, usize>,
    submitted: &[Submitted],
    seen: Seen,
    per_saga: PerSaga,
) -> Figures {
    let frame_at = first_frames(sessions.len(), index_of, &seen.logs_by_terminal);
    let first_start = submitted
        .iter()
        .map(|x| x.start)
        .min()
        .expect("sessions > 0");
    let last_start = submitted
        .iter()
        .map(|x| x.start)
        .max()
        .expect("sessions > 0");
    let behind_schedule_ms = submitted
        .iter()
        .map(|x| ms(x.start.saturating_duration_since(x.due)))
        .fold(0.0, f64::max);
    let last_ack = submitted.iter().map(|x| x.end).max().expect("sessions > 0");
    let last_frame = frame_at
        .iter()
        .flatten()
        .max()
        .copied()
        .expect("all frames");
    let n = sessions.len() as f64;
    let mut submit_ms: Vec<f64> = submitted
        .iter()
        .map(|x| ms(x.end.saturating_duration_since(x.start)))
        .collect();
    let mut after_202_ms: Vec<f64> = submitted
        .iter()
        .zip(&frame_at)
        .map(|(x, f)| ms(f.expect("all frames").saturating_duration_since(x.end)))
        .collect();
    let mut read_ms = seen.read_log.latencies_ms;
    Figures {
        accepted_per_s: n / secs(last_ack - first_start),
        sagas_per_s: n / secs(last_frame - first_start),
        submit_p50_ms: percentile(&mut submit_ms, 0.50),
        submit_p99_ms: percentile(&mut submit_ms, 0.99),
        read_p50_ms: percentile(&mut read_ms, 0.50),
        read_p99_ms: percentile(&mut read_ms, 0.99),
        reads: read_ms.len(),
        frame_after_202_p50_ms: percentile(&mut after_202_ms, 0.50),
        frame_after_202_p99_ms: percentile(&mut after_202_ms, 0.99),
        reconnects: seen.logs_by_terminal.iter().map(|l| l.reconnects).sum(),
        // One submission: no interval, so no rate.
        sent_per_s: if sessions.len() > 1 {
            (n - 1.0) / secs(last_start - first_start)
        } else {
            f64::NAN
        },
        behind_schedule_ms,
        per_saga,
    }
}

/// Prints, every second, how many submissions were accepted and how many
/// frames arrived, so a user sees the run is alive.
async fn report_progress(
    label: String,
    n: usize,
    accepted: Arc<AtomicUsize>,
    arrived: Arc<AtomicUsize>,
    reads: Option<Arc<AtomicUsize>>,
) {
    let start = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let reads = match &reads {
            Some(r) => format!(", {} unrelated reads", r.load(Ordering::Relaxed)),
            None => String::new(),
        };
        eprintln!(
            "  {label}: {}/{n} accepted, {}/{n} frames{reads} after {:.0}s",
            accepted.load(Ordering::Relaxed),
            arrived.load(Ordering::Relaxed),
            start.elapsed().as_secs_f64()
        );
    }
}
