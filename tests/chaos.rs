//! Chaos suite (bounded, runs in CI as its own step): three `stagehand
//! serve` processes on one PostgreSQL cluster that belongs to this test, the
//! AI simulator in this process (so it outlives every kill), 300 sessions
//! over two experiences (one single-call, one fan-out of two calls) with a
//! small `max_in_flight`, a 300 ms AI and every tenth prompt refused by
//! moderation. Meanwhile an instance is killed with SIGKILL and restarted
//! every few seconds, PostgreSQL is restarted once, and during a slow AI
//! spell (jobs longer than the grace) one instance gets a SIGTERM (graceful
//! shutdown, short `STAGEHAND_SHUTDOWN_GRACE`). Booth
//! displays follow their terminals' streams, move to another instance when
//! theirs dies or says "going away", resume from the last `seq` they saw
//! and acknowledge what they got. Clients create sessions and submit with
//! `Idempotency-Key`s and retry a failed request on another instance with
//! the same key, as a phone would.
//!
//! Then it asserts, and prints as a table: every session COMPLETED, or
//! ABORTED with INPUT_REJECTED exactly for the rejected prompts; provider
//! jobs = completed sessions x calls (a refused submit creates no job);
//! one ranking row per completed session; one final outbox event per
//! session; every display received each of its terminal's events exactly
//! once, `seq` 1..=N without gap, and its acks reached the database; the
//! provider never ran more jobs at once than the caps allow; the SIGTERMed
//! instance closed its displays with 1001, exited 0 in time, left no saga
//! to expire, and what it handed over was claimed again at once without
//! using up a recovery.
//!
//! PostgreSQL: the test never touches the shared cluster at 127.0.0.1:5432.
//! It runs `initdb` into a temporary directory (as the `postgres` user when
//! it runs as root), starts that cluster on a free port, restarts it
//! mid-run and stops it at the end. Without the PostgreSQL server binaries
//! (or as root without a `postgres` user) it says so loudly and passes,
//! unless `STAGEHAND_CHAOS_REQUIRED=1` (CI), where it fails.
//!
//! It is `#[ignore]`d so the main `cargo test` run stays short; run it with
//! `cargo test --test chaos -- --ignored --nocapture`. `STAGEHAND_CHAOS_SEED`
//! replays a run's choices (which instance dies when). On failure it prints
//! the figures, the sessions that are stuck and where, the log lines of
//! stuck sagas and the tails of the instance logs, and keeps the log
//! directory (`STAGEHAND_CHAOS_KEEP_LOGS=1` keeps it after a pass too).

mod support;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::{SinkExt, StreamExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, QueryResult, Statement};
use serde_json::{json, Value};
use stagehand::ai::simulator::{SimConfig, SimControl};
use tokio_tungstenite::tungstenite::Message;

/// Participants (sessions), spread over the experiences below.
const SESSIONS: usize = 300;
/// One participant starts every this often (300 in 15 s).
const SUBMIT_EVERY: Duration = Duration::from_millis(50);
/// Every job at the simulator takes this long.
const AI_LATENCY: Duration = Duration::from_millis(300);
/// A prompt with this word is refused by the simulator's moderation.
const REJECT_WORD: &str = "forbidden";
/// Instances on the one database.
const INSTANCES: usize = 3;
/// Chaos goes on at least this long after the load started.
const CHAOS_WINDOW: Duration = Duration::from_secs(24);
/// The SIGTERMed instance's grace (`STAGEHAND_SHUTDOWN_GRACE`).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// The AI's latency during the slow spell around the SIGTERM: longer than
/// the grace, so the terminated instance has sagas to hand over.
const SLOW_AI: Duration = Duration::from_secs(4);
/// The whole test, from the first instance's start to the verdict.
const WALL_LIMIT: Duration = Duration::from_secs(170);

/// An experience of the run.
struct ExpSpec {
    name: &'static str,
    ai_calls: i32,
    max_in_flight: i32,
}

const EXPERIENCES: [ExpSpec; 2] = [
    ExpSpec {
        name: "solo",
        ai_calls: 1,
        max_in_flight: 4,
    },
    ExpSpec {
        name: "fan",
        ai_calls: 2,
        max_in_flight: 4,
    },
];
/// Terminals (booths) per experience; each has one display, terminal 0 two.
const TERMINALS_PER_EXPERIENCE: usize = 2;

/// Participant `i`'s experience: every third one is the fan-out.
fn experience_of(i: usize) -> usize {
    usize::from(i % 3 == 2)
}

/// Participant `i`'s terminal, as an index into all terminals.
fn terminal_of(i: usize) -> usize {
    experience_of(i) * TERMINALS_PER_EXPERIENCE + (i / 3) % TERMINALS_PER_EXPERIENCE
}

/// Participant `i`'s prompt is refused by moderation (deterministic).
fn rejected(i: usize) -> bool {
    i % 10 == 7
}

fn required() -> bool {
    std::env::var("STAGEHAND_CHAOS_REQUIRED").is_ok_and(|v| v == "1")
}

/// The last `lines` lines of a text file.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("<cannot read: {e}>"));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------
// The test's own PostgreSQL cluster.
// ---------------------------------------------------------------------------

/// A PostgreSQL cluster in a temporary directory on a free port, owned by
/// this test: started, restarted and stopped by it (immediate stop on drop).
struct PgCluster {
    bin: PathBuf,
    /// `Some((uid, gid))` of `postgres` when this process is root: every
    /// PostgreSQL command runs as that user (`runuser`).
    run_as: Option<(u32, u32)>,
    dir: tempfile::TempDir,
    port: u16,
}

impl PgCluster {
    /// The directory with `initdb` and `pg_ctl`: `STAGEHAND_CHAOS_PG_BIN`,
    /// else `pg_config --bindir`, else the newest `/usr/lib/postgresql/*/bin`.
    fn find_bin() -> Option<PathBuf> {
        let usable = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
        if let Some(dir) = std::env::var_os("STAGEHAND_CHAOS_PG_BIN").map(PathBuf::from) {
            return usable(&dir).then_some(dir);
        }
        if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if out.status.success() && usable(&dir) {
                return Some(dir);
            }
        }
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                Some((v, e.path().join("bin")))
            })
            .filter(|(_, dir)| usable(dir))
            .collect();
        versions.sort();
        versions.pop().map(|(_, dir)| dir)
    }

    /// What the cluster needs, or why it cannot be made here.
    fn prerequisites() -> Result<(PathBuf, Option<(u32, u32)>), String> {
        let bin = Self::find_bin().ok_or(
            "no PostgreSQL server binaries (initdb, pg_ctl): install the `postgresql` package \
             or set STAGEHAND_CHAOS_PG_BIN",
        )?;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Ok((bin, None));
        }
        // initdb refuses to run as root: the cluster belongs to `postgres`.
        let name = std::ffi::CString::new("postgres").unwrap();
        // SAFETY: a valid C string; the result is read at once, before any
        // other getpw* call.
        let pw = unsafe { libc::getpwnam(name.as_ptr()) };
        if pw.is_null() {
            return Err(
                "running as root and there is no `postgres` user to own the cluster".into(),
            );
        }
        // SAFETY: pw is a valid passwd entry (checked non-null above).
        let ids = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
        let runuser = Command::new("runuser")
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !runuser.is_ok_and(|s| s.success()) {
            return Err("running as root without `runuser` to run initdb as `postgres`".into());
        }
        Ok((bin, Some(ids)))
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log(&self) -> PathBuf {
        self.dir.path().join("postgresql.log")
    }

    /// A PostgreSQL program, as `postgres` when this process is root.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut cmd = match self.run_as {
            Some(_) => {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(path);
                c
            }
            None => Command::new(path),
        };
        cmd.current_dir(self.dir.path()).stdin(Stdio::null());
        cmd
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let out = self
            .command(program)
            .args(args)
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} {args:?} failed ({}):\n{}{}\n--- postgresql.log ---\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                tail(&self.log(), 20)
            ))
        }
    }

    /// initdb (trust auth, no fsync) and start.
    fn create(bin: PathBuf, run_as: Option<(u32, u32)>) -> Result<PgCluster, String> {
        let dir = tempfile::Builder::new()
            .prefix("stagehand-chaos-pg-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", dir.path().display()))?;
        }
        let cluster = PgCluster {
            bin,
            run_as,
            dir,
            port: support::free_port(),
        };
        let data = cluster.data();
        cluster.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
        )?;
        cluster.start()?;
        Ok(cluster)
    }

    fn start(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off \
             -c synchronous_commit=off -c full_page_writes=off",
            self.port,
            self.dir.path().display()
        );
        let data = self.data();
        let log = self.log();
        self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "60",
                "-o",
                &options,
                "start",
            ],
        )
    }

    /// Starts `pg_ctl restart -m fast`: every connection is closed, the
    /// server is down for a moment and comes back on the same port. The
    /// caller waits for the child (it exits once the server is back). Its
    /// output goes to a file: the new postmaster must not hold a pipe of
    /// ours (`-l` sends the server's own output to its log).
    fn spawn_restart(&self) -> std::io::Result<Child> {
        let data = self.data();
        let log = self.log();
        let out = File::create(self.dir.path().join("pg_ctl-restart.out"))?;
        self.command("pg_ctl")
            .args(["-D", data.to_str().unwrap(), "-l", log.to_str().unwrap()])
            .args(["-w", "-t", "60", "-m", "fast", "restart"])
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
    }

    fn restart_output(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pg_ctl-restart.out")).unwrap_or_default()
    }

    fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self
            .command("pg_ctl")
            .args([
                "-D",
                data.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

// ---------------------------------------------------------------------------
// The instances.
// ---------------------------------------------------------------------------

/// One instance slot: a fixed port and the `stagehand serve` process running
/// there now (a new one, with a new log file, after every kill).
struct Node {
    idx: usize,
    port: u16,
    db_url: String,
    ai_url: String,
    log_dir: PathBuf,
    child: Option<Child>,
    logs: Vec<PathBuf>,
    /// Exits nobody asked for (seen by [`Node::exited_on_its_own`]).
    unexpected_exits: Vec<String>,
}

impl Node {
    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> Option<&PathBuf> {
        self.logs.last()
    }

    fn spawn(&mut self) {
        let path = self
            .log_dir
            .join(format!("node{}-{}.log", self.idx, self.logs.len() + 1));
        let out = File::create(&path).expect("log file");
        let err = out.try_clone().expect("log file");
        self.logs.push(path);
        let child = Command::new(env!("CARGO_BIN_EXE_stagehand"))
            .arg("serve")
            .env("STAGEHAND_DATABASE_URL", &self.db_url)
            .env(
                "STAGEHAND_MEDIA_URL",
                support::media_folder_of(&self.db_url),
            )
            .env("STAGEHAND_BIND", format!("127.0.0.1:{}", self.port))
            .env("STAGEHAND_AI_URL", &self.ai_url)
            .env("STAGEHAND_OPERATOR_TOKEN", support::OPERATOR)
            .env("STAGEHAND_POLL_INTERVAL", "500ms")
            .env("STAGEHAND_LEASE", "2s")
            .env("STAGEHAND_CLEANUP_INTERVAL", "1s")
            .env("STAGEHAND_AI_POLL_INTERVAL", "100ms")
            .env("STAGEHAND_BACKOFF_BASE", "100ms")
            .env("STAGEHAND_BACKOFF_MAX", "1s")
            .env("STAGEHAND_SAGA_DEADLINE", "150s")
            .env("STAGEHAND_DISPLAY_HEARTBEAT", "1s")
            .env(
                "STAGEHAND_SHUTDOWN_GRACE",
                format!("{}s", SHUTDOWN_GRACE.as_secs()),
            )
            .env("STAGEHAND_SESSION_RATE_LIMIT", "off")
            .env("STAGEHAND_SUBMISSION_RATE_LIMIT", "off")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start stagehand serve");
        self.child = Some(child);
    }

    /// Lines of the current log that contain any of `needles`.
    fn count_in_log(&self, needles: &[&str]) -> usize {
        self.log()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map_or(0, |text| {
                text.lines()
                    .filter(|l| needles.iter().any(|n| l.contains(n)))
                    .count()
            })
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The process ended although nobody stopped it: recorded, and the slot
    /// is empty again.
    fn exited_on_its_own(&mut self) -> Option<String> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        let what = format!(
            "instance {} exited on its own ({status}); log {}",
            self.idx,
            self.log()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
        self.unexpected_exits.push(what.clone());
        Some(what)
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn sigterm(&self) -> bool {
        match self.pid() {
            // SAFETY: kill(2) with a pid of our own child and a valid signal.
            Some(pid) => unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) == 0 },
            None => false,
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

type Nodes = Rc<RefCell<Vec<Node>>>;

/// Starts the process of slot `idx` and waits until it answers /healthz; a
/// process that exits before that (e.g. PostgreSQL was not back yet) is
/// started again, until `within` has passed.
async fn start_node(
    nodes: &Nodes,
    idx: usize,
    http: &reqwest::Client,
    within: Duration,
) -> Result<Duration, String> {
    let t = Instant::now();
    let deadline = t + within;
    nodes.borrow_mut()[idx].spawn();
    let url = format!("{}/healthz", nodes.borrow()[idx].base());
    loop {
        if let Ok(resp) = http.get(&url).send().await {
            if resp.status() == 200 {
                return Ok(t.elapsed());
            }
        }
        {
            let mut all = nodes.borrow_mut();
            let node = &mut all[idx];
            if let Some(status) = node
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                node.child = None;
                eprintln!(
                    "[chaos] instance {idx} exited while starting ({status}); starting it again"
                );
                if Instant::now() < deadline {
                    node.spawn();
                }
            }
        }
        if Instant::now() >= deadline {
            let node = &nodes.borrow()[idx];
            return Err(format!(
                "instance {idx} did not answer /healthz within {within:?}; log tail:\n{}",
                node.log().map(|p| tail(p, 30)).unwrap_or_default()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------
// The clients: requests with an Idempotency-Key, retried on another instance.
// ---------------------------------------------------------------------------

#[derive(Default)]
struct ClientFigures {
    requests: usize,
    retries: usize,
    connection_errors: usize,
    in_progress_409: usize,
    replayed: usize,
    /// Status -> count of 429/5xx answers (retried).
    retried_statuses: BTreeMap<u16, usize>,
    /// A few of those answers' bodies.
    retried_samples: Vec<String>,
    /// Requests that failed for good.
    failures: Vec<String>,
}

struct Client {
    http: reqwest::Client,
    ports: Vec<u16>,
    figures: RefCell<ClientFigures>,
}

impl Client {
    /// POSTs `body` with `key` to instance `first`, and on a connection
    /// error, a 409 `request_in_progress`, a 429 or a 5xx, again to the next
    /// instance with the same key, backing off, until `want` or `within`.
    #[allow(clippy::too_many_arguments)]
    async fn post(
        &self,
        first: usize,
        path: &str,
        bearer: Option<&str>,
        key: &str,
        body: &Value,
        want: u16,
        within: Duration,
    ) -> Result<Value, String> {
        let deadline = Instant::now() + within;
        let mut n = first;
        let mut pause = Duration::from_millis(50);
        self.figures.borrow_mut().requests += 1;
        loop {
            let port = self.ports[n % self.ports.len()];
            let mut req = self
                .http
                .post(format!("http://127.0.0.1:{port}{path}"))
                .header("Idempotency-Key", key)
                .json(body);
            if let Some(token) = bearer {
                req = req.bearer_auth(token);
            }
            let last = match req.send().await {
                Err(e) => {
                    self.figures.borrow_mut().connection_errors += 1;
                    format!("instance {}: {e}", n % self.ports.len())
                }
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let replayed = resp.headers().get("Idempotent-Replayed").is_some();
                    match resp.text().await {
                        Err(e) => {
                            self.figures.borrow_mut().connection_errors += 1;
                            format!("instance {}: body: {e}", n % self.ports.len())
                        }
                        Ok(text) if status == want => {
                            if replayed {
                                self.figures.borrow_mut().replayed += 1;
                            }
                            return serde_json::from_str(&text)
                                .map_err(|e| format!("{path}: {status} not JSON ({e}): {text}"));
                        }
                        Ok(text) if status == 409 && text.contains("request_in_progress") => {
                            self.figures.borrow_mut().in_progress_409 += 1;
                            format!("409 {text}")
                        }
                        Ok(text) if status == 429 || status >= 500 => {
                            let mut f = self.figures.borrow_mut();
                            *f.retried_statuses.entry(status).or_default() += 1;
                            if f.retried_samples.len() < 6 {
                                f.retried_samples.push(format!(
                                    "{status} from instance {} on {path}: {text}",
                                    n % self.ports.len()
                                ));
                            }
                            format!("{status} {text}")
                        }
                        Ok(text) => return Err(format!("{path}: {status} {text}")),
                    }
                }
            };
            if Instant::now() >= deadline {
                return Err(format!("{path}: gave up after {within:?}; last: {last}"));
            }
            self.figures.borrow_mut().retries += 1;
            n += 1;
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(800));
        }
    }
}

/// A participant of the run, once its session exists.
#[derive(Debug, Clone)]
struct Participant {
    i: usize,
    session_id: String,
    /// The submission was answered 202.
    submitted: bool,
}

async fn participant(
    client: &Client,
    i: usize,
    slugs: &[String],
    terminals: &[(String, String)],
) -> Result<Participant, String> {
    tokio::time::sleep(SUBMIT_EVERY * i as u32).await;
    let exp = experience_of(i);
    let first = i % INSTANCES;
    let created = client
        .post(
            first,
            &format!("/api/experiences/{}/sessions", slugs[exp]),
            None,
            &uuid::Uuid::new_v4().to_string(),
            &json!({"nickname": format!("p{i}"), "terminal_id": terminals[terminal_of(i)].0}),
            201,
            Duration::from_secs(60),
        )
        .await
        .map_err(|e| format!("participant {i}: create session: {e}"))?;
    let session_id = created["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let token = created["participant_token"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let prompt = if rejected(i) {
        format!("chaos {i}: something {REJECT_WORD} on stage")
    } else {
        format!("chaos {i}: a juggler on stage")
    };
    let mut p = Participant {
        i,
        session_id: session_id.clone(),
        submitted: false,
    };
    let submitted = client
        .post(
            first + 1,
            &format!("/api/sessions/{session_id}/submission"),
            Some(&token),
            &uuid::Uuid::new_v4().to_string(),
            &json!({"prompt": prompt, "score": i as f64}),
            202,
            Duration::from_secs(60),
        )
        .await;
    match submitted {
        Ok(_) => {
            p.submitted = true;
            Ok(p)
        }
        Err(e) => {
            client.figures.borrow_mut().failures.push(format!(
                "participant {i} (session {session_id}): submit: {e}"
            ));
            Ok(p)
        }
    }
}

// ---------------------------------------------------------------------------
// The displays.
// ---------------------------------------------------------------------------

#[derive(Default)]
struct DisplayLog {
    name: String,
    terminal: usize,
    /// (seq, session_id, type) of every `session.*` frame, in order.
    events: Vec<(i64, String, String)>,
    last_seq: i64,
    connects: u32,
    /// Instance of each connection.
    instances: Vec<usize>,
    /// Why each connection ended.
    closes: Vec<String>,
    /// Connections the server closed with 1001 "going away".
    going_away: u32,
    /// The instance the display is connected to now.
    current: Option<usize>,
    /// Set when the display has as many events as it should (the main
    /// task sets the target once every session is final).
    target: Option<usize>,
}

/// A booth display: connects to instance `start`, streams, acks every event,
/// and when its socket ends (instance killed, going away, refused) moves on
/// to the next instance with `after` = the last `seq` it received. Stops
/// when `stop` is set.
async fn run_display(
    log: Rc<RefCell<DisplayLog>>,
    ports: Vec<u16>,
    start: usize,
    terminal_id: String,
    token: String,
    stop: Rc<Cell<bool>>,
) {
    let mut n = start;
    while !stop.get() {
        let port = ports[n % ports.len()];
        let after = log.borrow().last_seq;
        let url =
            format!("ws://127.0.0.1:{port}/ws/terminals/{terminal_id}?token={token}&after={after}");
        let connected = tokio::time::timeout(
            Duration::from_secs(2),
            tokio_tungstenite::connect_async(url),
        )
        .await;
        let mut ws = match connected {
            Ok(Ok((ws, _))) => ws,
            _ => {
                n += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        {
            let mut l = log.borrow_mut();
            l.connects += 1;
            l.instances.push(n % ports.len());
            l.current = Some(n % ports.len());
        }
        let why = loop {
            if stop.get() {
                let _ = ws.close(None).await;
                break "stopped by the test".to_owned();
            }
            let frame = match tokio::time::timeout(Duration::from_millis(250), ws.next()).await {
                Err(_) => continue,
                Ok(None) => break "end of stream".to_owned(),
                Ok(Some(Err(e))) => break format!("error: {e}"),
                Ok(Some(Ok(frame))) => frame,
            };
            match frame {
                Message::Text(text) => {
                    let Ok(v) = serde_json::from_str::<Value>(&text) else {
                        break format!("not JSON: {text}");
                    };
                    let kind = v["type"].as_str().unwrap_or_default().to_owned();
                    let ack = if kind == "hello" {
                        // Re-acknowledge what was shown before a reconnect, in
                        // case the last instance died before recording it.
                        let last = log.borrow().last_seq;
                        (last > 0).then_some(last)
                    } else if kind.starts_with("session.") {
                        let seq = v["seq"].as_i64().unwrap_or(-1);
                        let sid = v["session_id"].as_str().unwrap_or("?").to_owned();
                        let mut l = log.borrow_mut();
                        l.events.push((seq, sid, kind));
                        l.last_seq = l.last_seq.max(seq);
                        Some(seq)
                    } else {
                        None
                    };
                    if let Some(seq) = ack {
                        let frame = json!({"type": "ack", "seq": seq}).to_string();
                        if let Err(e) = ws.send(Message::Text(frame.into())).await {
                            break format!("ack failed: {e}");
                        }
                    }
                }
                Message::Close(frame) => {
                    let code = frame.as_ref().map(|f| u16::from(f.code));
                    if code == Some(1001) {
                        log.borrow_mut().going_away += 1;
                    }
                    break format!(
                        "close {:?} {}",
                        code,
                        frame.map(|f| f.reason.to_string()).unwrap_or_default()
                    );
                }
                _ => {}
            }
        };
        {
            let mut l = log.borrow_mut();
            l.current = None;
            l.closes
                .push(format!("instance {}: {why}", n % ports.len()));
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------
// The chaos.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Kill,
    RestartPostgres,
    Terminate,
}

#[derive(Default)]
struct ChaosLog {
    /// What happened, with the time since the load started.
    timeline: Vec<String>,
    kills: usize,
    pg_restarts: usize,
    pg_restart_took: Option<Duration>,
    /// The SIGTERMed process: exit status and time from signal to exit.
    terminated: Option<(usize, Option<ExitStatus>, Duration)>,
    /// Displays connected to the SIGTERMed instance when it got the signal.
    displays_on_terminated: usize,
    /// Its own last words (`shut down running=.. handed_over=..`).
    shutdown_line: Option<String>,
    /// Its log file.
    terminated_log: Option<PathBuf>,
    /// Sagas found `handed_over` right after the SIGTERMed process exited.
    handed_over: usize,
    /// How long until every one of them was claimed again, and how many of
    /// them used up a recovery on that claim.
    handover_resumed: Option<(Duration, usize)>,
    restart_took: Vec<Duration>,
    failures: Vec<String>,
}

/// What the chaos works on.
struct Stage<'a> {
    nodes: &'a Nodes,
    pg: &'a PgCluster,
    db: &'a DatabaseConnection,
    http: &'a reqwest::Client,
    sim: &'a SimControl,
    displays: &'a [Rc<RefCell<DisplayLog>>],
}

/// Kills, restarts and a SIGTERM, one at a time, until `load_done` and the
/// chaos window has passed and every planned action has happened. Ends with
/// all instances running.
async fn run_chaos(
    stage: &Stage<'_>,
    seed: u64,
    started: Instant,
    load_done: &Cell<bool>,
    log: &RefCell<ChaosLog>,
) {
    let Stage {
        nodes, pg, http, ..
    } = *stage;
    let mut rng = StdRng::seed_from_u64(seed);
    // The SIGTERM comes while participants still arrive (about 10 s in).
    let plan = [
        Action::Kill,
        Action::RestartPostgres,
        Action::Terminate,
        Action::Kill,
        Action::Kill,
    ];
    let mut step = 0;
    let note = |what: String| {
        let line = format!("{:6.2}s {what}", started.elapsed().as_secs_f64());
        eprintln!("[chaos] {line}");
        log.borrow_mut().timeline.push(line);
    };
    loop {
        let pause = Duration::from_millis(rng.random_range(2_500..4_500));
        tokio::time::sleep(pause).await;
        // Instances that died by themselves (e.g. on the database restart)
        // are a finding; they are started again so the run goes on.
        for idx in 0..INSTANCES {
            let exited = nodes.borrow_mut()[idx].exited_on_its_own();
            if let Some(what) = exited {
                note(what.clone());
                log.borrow_mut().failures.push(what);
                if let Err(e) = start_node(nodes, idx, http, Duration::from_secs(30)).await {
                    log.borrow_mut().failures.push(e);
                }
            }
        }
        let action = match plan.get(step) {
            Some(a) => *a,
            None if started.elapsed() < CHAOS_WINDOW || !load_done.get() => Action::Kill,
            None => break,
        };
        step += 1;
        let target = rng.random_range(0..INSTANCES);
        match action {
            Action::Kill => {
                let pid = nodes.borrow().get(target).and_then(Node::pid);
                nodes.borrow_mut()[target].kill9();
                note(format!("kill -9 instance {target} (pid {pid:?})"));
                log.borrow_mut().kills += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
                match start_node(nodes, target, http, Duration::from_secs(30)).await {
                    Ok(took) => {
                        note(format!(
                            "instance {target} back after {:.2}s",
                            took.as_secs_f64()
                        ));
                        log.borrow_mut().restart_took.push(took);
                    }
                    Err(e) => log.borrow_mut().failures.push(e),
                }
            }
            Action::RestartPostgres => {
                note("PostgreSQL restart (fast)".into());
                let t = Instant::now();
                // pg_ctl returns once the server is back; its child is
                // polled, so the simulator and the displays in this process
                // keep running meanwhile.
                let restarted = match pg.spawn_restart() {
                    Err(e) => Err(format!("pg_ctl restart: {e}")),
                    Ok(mut child) => loop {
                        match child.try_wait() {
                            Ok(Some(status)) if status.success() => break Ok(()),
                            Ok(Some(status)) => {
                                break Err(format!(
                                    "pg_ctl restart {status}: {}",
                                    pg.restart_output()
                                ))
                            }
                            Ok(None) if t.elapsed() < Duration::from_secs(60) => {
                                tokio::time::sleep(Duration::from_millis(50)).await
                            }
                            other => {
                                let _ = child.kill();
                                let _ = child.wait();
                                break Err(format!("pg_ctl restart: {other:?} after 60 s"));
                            }
                        }
                    },
                };
                match restarted {
                    Ok(()) => {
                        note(format!(
                            "PostgreSQL back after {:.2}s",
                            t.elapsed().as_secs_f64()
                        ));
                        let mut l = log.borrow_mut();
                        l.pg_restarts += 1;
                        l.pg_restart_took = Some(t.elapsed());
                    }
                    Err(e) => log.borrow_mut().failures.push(e),
                }
            }
            Action::Terminate => {
                terminate(stage, &note, log).await;
            }
        }
    }
    note("chaos over".into());
}

/// A deploy during a slow AI spell: jobs take [`SLOW_AI`] (longer than the
/// grace) for a moment, then the instance with the most displays gets a
/// SIGTERM. It should close its displays with 1001, let what it runs go on
/// for the grace, hand over the rest and exit 0; another instance should
/// claim what was handed over at once, without using up a recovery.
async fn terminate(stage: &Stage<'_>, note: &dyn Fn(String), log: &RefCell<ChaosLog>) {
    let Stage {
        nodes,
        db,
        http,
        sim,
        displays,
        ..
    } = *stage;
    const STARTED_WORK: [&str; 2] = ["AI job submitted", "fan-out: running calls"];
    let work_before: Vec<usize> = (0..INSTANCES)
        .map(|i| nodes.borrow()[i].count_in_log(&STARTED_WORK))
        .collect();
    sim.set_latency(SLOW_AI);
    note(format!("AI latency {SLOW_AI:?} (slow spell)"));
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let mut on = [0usize; INSTANCES];
    for d in displays {
        if let Some(i) = d.borrow().current {
            on[i] += 1;
        }
    }
    // The instance that started the most slow AI work (its log says so),
    // then the one with the most displays.
    let slow_work: Vec<usize> = (0..INSTANCES)
        .map(|i| {
            nodes.borrow()[i]
                .count_in_log(&STARTED_WORK)
                .saturating_sub(work_before[i])
        })
        .collect();
    let target = (0..INSTANCES)
        .max_by_key(|i| (slow_work[*i], on[*i]))
        .unwrap_or(0);
    note(format!(
        "slow AI work started per instance: {slow_work:?}; displays per instance: {on:?}"
    ));
    let sent = nodes.borrow()[target].sigterm();
    log.borrow_mut().displays_on_terminated = on[target];
    note(format!(
        "SIGTERM instance {target} (sent: {sent}; displays on it: {})",
        on[target]
    ));
    let t = Instant::now();
    let limit = SHUTDOWN_GRACE + Duration::from_secs(15);
    let status = loop {
        let s = {
            let mut all = nodes.borrow_mut();
            all[target]
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
        };
        if s.is_some() || t.elapsed() >= limit {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let took = t.elapsed();
    // Only what is handed over right now: snapshot before anything claims.
    let handed = rows(db, "SELECT id, recoveries FROM sagas WHERE handed_over").await;
    sim.set_latency(AI_LATENCY);
    note(format!(
        "instance {target} after SIGTERM: {} after {:.2}s; {} sagas handed over; AI latency back to {AI_LATENCY:?}",
        status.map_or("still running".to_owned(), |s| s.to_string()),
        took.as_secs_f64(),
        handed.len()
    ));
    log.borrow_mut().terminated = Some((target, status, took));
    log.borrow_mut().handed_over = handed.len();
    if status.is_none() {
        nodes.borrow_mut()[target].kill9();
    } else {
        let mut all = nodes.borrow_mut();
        all[target].child = None;
        log.borrow_mut().terminated_log = all[target].log().cloned();
        let last_words = all[target]
            .log()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|text| {
                text.lines()
                    .rev()
                    .find(|l| l.contains("shut down"))
                    .map(str::to_owned)
            });
        if let Some(line) = &last_words {
            note(format!("its last words: {}", line.trim()));
        }
        log.borrow_mut().shutdown_line = last_words;
    }
    // Every handed-over saga claimed again, and with its recoveries unchanged.
    if !handed.is_empty() {
        let before: HashMap<String, i64> = handed
            .iter()
            .map(|r| (text(r, "id"), int(r, "recoveries")))
            .collect();
        let ids = before
            .keys()
            .map(|id| format!("'{id}'"))
            .collect::<Vec<_>>()
            .join(",");
        let sql = format!(
            "SELECT id, recoveries, handed_over::text AS handed_over FROM sagas WHERE id IN ({ids})"
        );
        let t = Instant::now();
        loop {
            let now = rows(db, &sql).await;
            if now.iter().all(|r| text(r, "handed_over") == "false") {
                let used = now
                    .iter()
                    .filter(|r| int(r, "recoveries") != before[&text(r, "id")])
                    .count();
                note(format!(
                    "all {} handed-over sagas claimed again within {} ms; recoveries used: {used}",
                    before.len(),
                    t.elapsed().as_millis()
                ));
                log.borrow_mut().handover_resumed = Some((t.elapsed(), used));
                break;
            }
            if t.elapsed() > Duration::from_secs(5) {
                note(format!(
                    "handed-over sagas still unclaimed after 5 s: {}",
                    now.iter()
                        .filter(|r| text(r, "handed_over") != "false")
                        .count()
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    match start_node(nodes, target, http, Duration::from_secs(30)).await {
        Ok(took) => note(format!(
            "instance {target} back after {:.2}s",
            took.as_secs_f64()
        )),
        Err(e) => log.borrow_mut().failures.push(e),
    }
}

/// What the provider-side watch saw: the simulator's running jobs sampled
/// every few ms, and, the first time they exceeded the caps, the AI_PENDING
/// sagas that may have a job at the provider.
#[derive(Default)]
struct CapWatch {
    samples: usize,
    peak: u64,
    first_exceed: Option<(Duration, u64)>,
    snapshot: Vec<String>,
}

async fn watch_cap(
    sim: SimControl,
    db: DatabaseConnection,
    cap: u64,
    started: Instant,
    stop: Rc<Cell<bool>>,
    out: Rc<RefCell<CapWatch>>,
) {
    while !stop.get() {
        let running = sim.stats().running;
        let first = {
            let mut w = out.borrow_mut();
            w.samples += 1;
            w.peak = w.peak.max(running);
            let first = running > cap && w.first_exceed.is_none();
            if first {
                w.first_exceed = Some((started.elapsed(), running));
            }
            first
        };
        if first {
            let snapshot = pending_jobs(&db).await;
            out.borrow_mut().snapshot = snapshot;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// AI_PENDING sagas that have (or had) a job at the provider, per line.
async fn pending_jobs(db: &DatabaseConnection) -> Vec<String> {
    let now_ms = chrono::Utc::now().timestamp_millis();
    let sql = "SELECT g.id, e.slug, \
               (SELECT count(*) FROM ai_slots l WHERE l.saga_id = g.id) AS slots, g.lock_token, g.locked_until_ms, \
               g.handed_over::text AS handed_over, g.recoveries, g.ai_job_id, g.updated_at_ms, \
               (SELECT count(*) FROM ai_calls c WHERE c.saga_id = g.id AND c.status = 'RUNNING' \
                AND c.job_id IS NOT NULL) AS running_calls \
               FROM sagas g JOIN experiences e ON e.id = g.experience_id \
               WHERE g.step = 'AI_PENDING' AND (g.ai_job_id IS NOT NULL OR g.lock_token IS NOT NULL \
               OR EXISTS (SELECT 1 FROM ai_calls c WHERE c.saga_id = g.id AND c.job_id IS NOT NULL \
               AND c.status = 'RUNNING')) ORDER BY e.slug, g.created_at_ms";
    match db
        .query_all_raw(Statement::from_string(DbBackend::Postgres, sql.to_owned()))
        .await
    {
        Err(e) => vec![format!("<snapshot failed: {e}>")],
        Ok(found) => found
            .iter()
            .map(|r| {
                let locked = int(r, "locked_until_ms");
                format!(
                    "{} saga {} slots {} leased {} (lease {}) handed_over {} recoveries {} \
                     job {} running calls {} updated {} ms ago",
                    text(r, "slug"),
                    text(r, "id"),
                    int(r, "slots"),
                    !text(r, "lock_token").is_empty(),
                    if locked < 0 {
                        "none".to_owned()
                    } else {
                        format!("{:+} ms", locked - now_ms)
                    },
                    text(r, "handed_over"),
                    int(r, "recoveries"),
                    if text(r, "ai_job_id").is_empty() {
                        "-"
                    } else {
                        "yes"
                    },
                    int(r, "running_calls"),
                    now_ms - int(r, "updated_at_ms"),
                )
            })
            .collect(),
    }
}

// ---------------------------------------------------------------------------
// Reading the database.
// ---------------------------------------------------------------------------

async fn rows(db: &DatabaseConnection, sql: &str) -> Vec<QueryResult> {
    db.query_all_raw(Statement::from_string(DbBackend::Postgres, sql.to_owned()))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// `SELECT count(*) AS n ...`; -1 when the query fails (e.g. PostgreSQL is
/// restarting).
async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
    match db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql.to_owned()))
        .await
    {
        Ok(Some(row)) => row.try_get::<i64>("", "n").unwrap_or(-1),
        _ => -1,
    }
}

fn text(row: &QueryResult, col: &str) -> String {
    row.try_get::<Option<String>>("", col)
        .ok()
        .flatten()
        .unwrap_or_default()
}

fn int(row: &QueryResult, col: &str) -> i64 {
    row.try_get::<Option<i64>>("", col)
        .ok()
        .flatten()
        .or_else(|| {
            row.try_get::<Option<i32>>("", col)
                .ok()
                .flatten()
                .map(i64::from)
        })
        .unwrap_or(-1)
}

/// The sessions that are not final, with their saga's state, one per line.
async fn stuck_report(db: &DatabaseConnection, limit: usize) -> (Vec<String>, Vec<String>) {
    let now_ms = chrono::Utc::now().timestamp_millis();
    let stuck = rows(
        db,
        "SELECT s.id AS session_id, s.status, g.id AS saga_id, g.step, g.recoveries, g.attempts, \
         g.handed_over::text AS handed_over, g.lock_token, g.locked_until_ms, g.next_attempt_at_ms, \
         g.unavailable_streak, g.abort_reason, g.updated_at_ms \
         FROM sessions s LEFT JOIN sagas g ON g.session_id = s.id \
         WHERE s.status NOT IN ('COMPLETED', 'ABORTED') ORDER BY s.created_at_ms",
    )
    .await;
    let mut lines = Vec::new();
    let mut saga_ids = Vec::new();
    for r in stuck.iter().take(limit) {
        let locked = int(r, "locked_until_ms");
        saga_ids.push(text(r, "saga_id"));
        lines.push(format!(
            "session {} {} saga {} step {} recoveries {} attempts {} handed_over {} leased {} \
             (lease {}) next_attempt {} ms unavailable_streak {} updated {} ms ago",
            text(r, "session_id"),
            text(r, "status"),
            text(r, "saga_id"),
            text(r, "step"),
            int(r, "recoveries"),
            int(r, "attempts"),
            text(r, "handed_over"),
            !text(r, "lock_token").is_empty(),
            if locked < 0 {
                "none".to_owned()
            } else {
                format!("{:+} ms", locked - now_ms)
            },
            int(r, "next_attempt_at_ms") - now_ms,
            int(r, "unavailable_streak"),
            now_ms - int(r, "updated_at_ms"),
        ));
    }
    if stuck.len() > limit {
        lines.push(format!("... and {} more", stuck.len() - limit));
    }
    (lines, saga_ids)
}

/// Log lines (across all instance logs) that mention `needle`.
fn grep_logs(nodes: &Nodes, needle: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    for node in nodes.borrow().iter() {
        for path in &node.logs {
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            for line in text.lines().filter(|l| l.contains(needle)) {
                if out.len() >= max {
                    return out;
                }
                out.push(format!("{name}: {line}"));
            }
        }
    }
    out
}

/// WARN/ERROR lines per log file, and the first few ERROR lines.
fn log_summary(nodes: &Nodes) -> (String, Vec<String>) {
    let mut summary = String::new();
    let mut errors = Vec::new();
    for node in nodes.borrow().iter() {
        for path in &node.logs {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let warn = text.lines().filter(|l| l.contains(" WARN ")).count();
            let error_lines: Vec<&str> = text.lines().filter(|l| l.contains(" ERROR ")).collect();
            let _ = write!(
                summary,
                "{}: {} WARN, {} ERROR; ",
                path.file_name().unwrap().to_string_lossy(),
                warn,
                error_lines.len()
            );
            for l in error_lines.iter().take(3) {
                if errors.len() < 12 {
                    errors.push(format!(
                        "{}: {l}",
                        path.file_name().unwrap().to_string_lossy()
                    ));
                }
            }
        }
    }
    (summary, errors)
}

// ---------------------------------------------------------------------------
// The test.
// ---------------------------------------------------------------------------

#[actix_web::test]
#[ignore = "the chaos suite: run it with --ignored (CI runs it as its own step)"]
async fn chaos_three_instances_one_postgres() {
    // A last guard over every deadline inside: dropping the run kills the
    // instances and stops the cluster.
    let limit = WALL_LIMIT + Duration::from_secs(30);
    if tokio::time::timeout(limit, chaos_run()).await.is_err() {
        panic!("the chaos suite did not finish within {limit:?}");
    }
}

async fn chaos_run() {
    let (bin, run_as) = match PgCluster::prerequisites() {
        Ok(p) => p,
        Err(why) if required() => {
            panic!("chaos suite required (STAGEHAND_CHAOS_REQUIRED=1) but: {why}")
        }
        Err(why) => {
            eprintln!(
                "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
                 !!! CHAOS SUITE SKIPPED: {why}\n\
                 !!! (set STAGEHAND_CHAOS_REQUIRED=1 to make this a failure)\n\
                 !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
            );
            return;
        }
    };
    let seed: u64 = std::env::var("STAGEHAND_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("[chaos] seed {seed} (STAGEHAND_CHAOS_SEED={seed} replays the choices)");
    let grace_flag = Command::new(env!("CARGO_BIN_EXE_stagehand"))
        .args(["serve", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("--shutdown-grace"))
        .unwrap_or(false);
    if !grace_flag {
        eprintln!(
            "[chaos] NOTE: `stagehand serve --help` has no --shutdown-grace yet: \
             STAGEHAND_SHUTDOWN_GRACE is set but ignored, and the 1001 check is reported, not asserted"
        );
    }

    let t0 = Instant::now();
    let pg = Rc::new(
        tokio::task::spawn_blocking(move || PgCluster::create(bin, run_as))
            .await
            .expect("initdb task")
            .unwrap_or_else(|e| panic!("the chaos PostgreSQL cluster: {e}")),
    );
    eprintln!(
        "[chaos] own PostgreSQL cluster on 127.0.0.1:{} in {} ({:.1}s)",
        pg.port,
        pg.dir.path().display(),
        t0.elapsed().as_secs_f64()
    );
    {
        let admin = Database::connect(pg.url("postgres"))
            .await
            .expect("connect to the chaos cluster");
        admin
            .execute_unprepared("CREATE DATABASE stagehand")
            .await
            .expect("create database");
        admin.close().await.ok();
    }
    let db_url = pg.url("stagehand");

    stagehand::ai::client::ensure_crypto_provider();
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(5))
        .build()
        .expect("HTTP client");
    let sim = support::start_sim(SimConfig {
        latency: AI_LATENCY,
        reject_word: Some(REJECT_WORD.into()),
        fail_rate: 0.0,
        unavailable_rate: 0.0,
        refuse_cancel: false,
        delete_outputs_after: None,
    })
    .await;

    let log_dir = tempfile::Builder::new()
        .prefix("stagehand-chaos-logs-")
        .tempdir()
        .expect("log dir");
    let nodes: Nodes = Rc::new(RefCell::new(
        (0..INSTANCES)
            .map(|idx| Node {
                idx,
                port: support::free_port(),
                db_url: db_url.clone(),
                ai_url: sim.url(),
                log_dir: log_dir.path().to_owned(),
                child: None,
                logs: Vec::new(),
                unexpected_exits: Vec::new(),
            })
            .collect(),
    ));
    let ports: Vec<u16> = nodes.borrow().iter().map(|n| n.port).collect();
    // The first one migrates the database; then the others.
    start_node(&nodes, 0, &http, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for idx in 1..INSTANCES {
        start_node(&nodes, idx, &http, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let base = nodes.borrow()[0].base();
    let db = Database::connect(&db_url)
        .await
        .expect("the test's own connection");

    // Experiences, terminals, displays.
    let mut slugs = Vec::new();
    for spec in &EXPERIENCES {
        let slug = format!(
            "chaos-{}-{}",
            spec.name,
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        );
        let resp = http
            .post(format!("{base}/api/experiences"))
            .bearer_auth(support::OPERATOR)
            .json(&json!({"slug": slug, "title": spec.name, "kind": "comic",
                          "ai_calls": spec.ai_calls, "max_in_flight": spec.max_in_flight}))
            .send()
            .await
            .expect("POST /api/experiences");
        assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
        slugs.push(slug);
    }
    let mut terminals = Vec::new();
    for slug in &slugs {
        for _ in 0..TERMINALS_PER_EXPERIENCE {
            terminals.push(support::create_terminal(&http, &base, slug).await);
        }
    }
    let stop_displays = Rc::new(Cell::new(false));
    let cap_total: i32 = EXPERIENCES.iter().map(|e| e.max_in_flight).sum();
    let mut displays = Vec::new();
    let mut display_tasks = Vec::new();
    // One display per terminal, and a second one on terminal 0.
    for (d, t) in (0..terminals.len()).chain([0]).enumerate() {
        let log = Rc::new(RefCell::new(DisplayLog {
            name: format!("display {d} (terminal {t})"),
            terminal: t,
            ..Default::default()
        }));
        display_tasks.push(actix_web::rt::spawn(run_display(
            log.clone(),
            ports.clone(),
            d % INSTANCES,
            terminals[t].0.clone(),
            terminals[t].1.clone(),
            stop_displays.clone(),
        )));
        displays.push(log);
    }

    // The load and the chaos, together.
    let client = Client {
        http: http.clone(),
        ports: ports.clone(),
        figures: RefCell::new(ClientFigures::default()),
    };
    let stage = Stage {
        nodes: &nodes,
        pg: &pg,
        db: &db,
        http: &http,
        sim: &sim.control,
        displays: &displays,
    };
    let load_done = Cell::new(false);
    let chaos = RefCell::new(ChaosLog::default());
    let started = Instant::now();
    let cap_watch = Rc::new(RefCell::new(CapWatch::default()));
    let cap_task = actix_web::rt::spawn(watch_cap(
        sim.control.clone(),
        Database::connect(&db_url)
            .await
            .expect("the watch's connection"),
        cap_total as u64,
        started,
        stop_displays.clone(),
        cap_watch.clone(),
    ));
    let load = async {
        let out =
            join_all((0..SESSIONS).map(|i| participant(&client, i, &slugs, &terminals))).await;
        load_done.set(true);
        eprintln!(
            "[chaos] {:6.2}s all {SESSIONS} participants answered",
            started.elapsed().as_secs_f64()
        );
        out
    };
    let (outcomes, ()) =
        futures_util::join!(load, run_chaos(&stage, seed, started, &load_done, &chaos));
    let mut participants = Vec::new();
    for o in outcomes {
        match o {
            Ok(p) => participants.push(p),
            Err(e) => client.figures.borrow_mut().failures.push(e),
        }
    }
    let chaos_over = started.elapsed();

    // Every session final (the database says), within the wall limit.
    let final_deadline = t0 + WALL_LIMIT - Duration::from_secs(25);
    let mut not_final = -1;
    while Instant::now() < final_deadline {
        not_final = count(
            &db,
            "SELECT count(*) AS n FROM sessions WHERE status NOT IN ('COMPLETED', 'ABORTED')",
        )
        .await;
        if not_final == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let all_final_at = started.elapsed();

    // The displays: each should get one event per session of its terminal.
    let per_terminal: HashMap<usize, Vec<String>> = {
        let mut m: HashMap<usize, Vec<String>> = HashMap::new();
        for p in &participants {
            m.entry(terminal_of(p.i))
                .or_default()
                .push(p.session_id.clone());
        }
        m
    };
    for d in &displays {
        let t = d.borrow().terminal;
        d.borrow_mut().target = Some(per_terminal.get(&t).map_or(0, Vec::len));
    }
    let display_deadline = Instant::now()
        + Duration::from_secs(15).min(
            (t0 + WALL_LIMIT - Duration::from_secs(8)).saturating_duration_since(Instant::now()),
        );
    while Instant::now() < display_deadline {
        if displays.iter().all(|d| {
            let d = d.borrow();
            d.events.len() >= d.target.unwrap_or(usize::MAX)
        }) {
            // A moment more, to see anything received twice.
            tokio::time::sleep(Duration::from_millis(500)).await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Acks reach the database (each instance writes progress at most once a
    // second; a display re-acks after every reconnect).
    let ack_deadline = Instant::now() + Duration::from_secs(5);
    let mut acks_ok = false;
    while Instant::now() < ack_deadline && !acks_ok {
        let t_rows = rows(&db, "SELECT id, last_seq, acked_seq FROM terminals").await;
        acks_ok = t_rows
            .iter()
            .all(|r| int(r, "acked_seq") == int(r, "last_seq"));
        if !acks_ok {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    stop_displays.set(true);
    let _ = tokio::time::timeout(Duration::from_secs(2), cap_task).await;
    for task in display_tasks {
        let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
    }

    // ---- The verdict. ----
    let mut failures: Vec<String> = Vec::new();
    failures.extend(chaos.borrow().failures.iter().cloned());
    failures.extend(client.figures.borrow().failures.iter().cloned());
    for node in nodes.borrow().iter() {
        failures.extend(node.unexpected_exits.iter().cloned());
    }

    let session_rows = rows(
        &db,
        "SELECT s.id, s.status, s.abort_reason, g.abort_detail, g.recoveries, g.handed_over::text AS handed_over \
         FROM sessions s LEFT JOIN sagas g ON g.session_id = s.id",
    )
    .await;
    let by_session: HashMap<String, &QueryResult> =
        session_rows.iter().map(|r| (text(r, "id"), r)).collect();
    let mut completed = 0usize;
    let mut rejected_ok = 0usize;
    let mut aborted_other = Vec::new();
    let mut wrongly = Vec::new();
    let mut jobs_expected = 0u64;
    let mut completed_ids = HashSet::new();
    for p in &participants {
        let Some(r) = by_session.get(&p.session_id) else {
            failures.push(format!(
                "participant {}: session {} not in the database",
                p.i, p.session_id
            ));
            continue;
        };
        let status = text(r, "status");
        let reason = text(r, "abort_reason");
        match (status.as_str(), rejected(p.i)) {
            ("COMPLETED", false) => {
                completed += 1;
                completed_ids.insert(p.session_id.clone());
                jobs_expected += EXPERIENCES[experience_of(p.i)].ai_calls as u64;
            }
            ("ABORTED", true) if reason == "INPUT_REJECTED" => rejected_ok += 1,
            ("ABORTED", _) => aborted_other.push(format!(
                "participant {} session {}: ABORTED {reason} ({})",
                p.i,
                p.session_id,
                text(r, "abort_detail")
            )),
            ("COMPLETED", true) => wrongly.push(format!(
                "participant {} session {}: COMPLETED although its prompt has the reject word",
                p.i, p.session_id
            )),
            _ => {}
        }
    }
    let expected_rejected = participants.iter().filter(|p| rejected(p.i)).count();
    let recoveries: Vec<i64> = session_rows.iter().map(|r| int(r, "recoveries")).collect();
    let recoveries_sum: i64 = recoveries.iter().filter(|r| **r > 0).sum();
    let recoveries_max = recoveries.iter().copied().max().unwrap_or(0);

    let ranking_rows = count(&db, "SELECT count(*) AS n FROM score_attempts").await;
    let ranking_dupes = count(
        &db,
        "SELECT count(*) AS n FROM (SELECT session_id FROM score_attempts GROUP BY session_id HAVING count(*) > 1) d",
    )
    .await;
    let ranking_of_uncompleted = count(
        &db,
        "SELECT count(*) AS n FROM score_attempts a JOIN sessions s ON s.id = a.session_id WHERE s.status <> 'COMPLETED'",
    )
    .await;
    let outbox = rows(
        &db,
        "SELECT session_id, event_type, seq FROM terminal_events",
    )
    .await;
    let mut outbox_per_session: HashMap<String, Vec<String>> = HashMap::new();
    for r in &outbox {
        outbox_per_session
            .entry(text(r, "session_id"))
            .or_default()
            .push(text(r, "event_type"));
    }
    let mut outbox_bad = Vec::new();
    for p in &participants {
        let events = outbox_per_session
            .get(&p.session_id)
            .cloned()
            .unwrap_or_default();
        let want = if rejected(p.i) {
            "session.rejected"
        } else {
            "session.completed"
        };
        if events.len() != 1 || events[0] != want {
            outbox_bad.push(format!(
                "session {} (participant {}): {events:?}, want [{want}]",
                p.session_id, p.i
            ));
        }
    }
    let unnumbered = outbox.iter().filter(|r| int(r, "seq") < 0).count();

    let stats = sim.control.stats();

    // Displays.
    let terminal_rows = rows(&db, "SELECT id, last_seq, acked_seq FROM terminals").await;
    let last_seq_of: HashMap<String, (i64, i64)> = terminal_rows
        .iter()
        .map(|r| (text(r, "id"), (int(r, "last_seq"), int(r, "acked_seq"))))
        .collect();
    let mut display_lines = Vec::new();
    let mut displays_ok = 0;
    let mut going_away_total = 0;
    let mut reconnects_total = 0;
    for d in &displays {
        let d = d.borrow();
        going_away_total += d.going_away;
        reconnects_total += d.connects.saturating_sub(1);
        let expected: HashSet<&str> = per_terminal
            .get(&d.terminal)
            .map(|v| v.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let (last_seq, acked) = last_seq_of
            .get(&terminals[d.terminal].0)
            .copied()
            .unwrap_or((-1, -1));
        let mut problems = Vec::new();
        let seqs: Vec<i64> = d.events.iter().map(|e| e.0).collect();
        if let Some(k) = seqs
            .iter()
            .enumerate()
            .position(|(k, s)| *s != k as i64 + 1)
        {
            problems.push(format!(
                "seq #{k} is {} (want {}; around it: {:?})",
                seqs[k],
                k + 1,
                &seqs[k.saturating_sub(2)..(k + 3).min(seqs.len())]
            ));
        }
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for e in &d.events {
            *seen.entry(e.1.as_str()).or_default() += 1;
        }
        let dupes = seen.values().filter(|n| **n > 1).count();
        let missing = expected.iter().filter(|s| !seen.contains_key(**s)).count();
        let unexpected = seen.keys().filter(|s| !expected.contains(**s)).count();
        if dupes + missing + unexpected > 0 {
            problems.push(format!("{missing} sessions missing, {dupes} received more than once, {unexpected} not of this terminal"));
        }
        if seqs.last().copied().unwrap_or(0) != last_seq {
            problems.push(format!(
                "last seq {:?}, terminal's last_seq {last_seq}",
                seqs.last()
            ));
        }
        if acked != last_seq {
            problems.push(format!(
                "terminal's acked_seq {acked} != last_seq {last_seq}"
            ));
        }
        let wrong_type = d
            .events
            .iter()
            .filter(|e| {
                let want = if completed_ids.contains(&e.1) {
                    "session.completed"
                } else {
                    "session.rejected"
                };
                e.2 != want
            })
            .count();
        if wrong_type > 0 {
            problems.push(format!("{wrong_type} events of the wrong type"));
        }
        display_lines.push(format!(
            "{}: {} events (want {}), {} connections on instances {:?}, {} closed 1001{}",
            d.name,
            d.events.len(),
            expected.len(),
            d.connects,
            d.instances,
            d.going_away,
            if problems.is_empty() {
                String::new()
            } else {
                format!(" -- {}", problems.join("; "))
            }
        ));
        if problems.is_empty() {
            displays_ok += 1;
        } else {
            failures.push(format!(
                "{}: {} (its connections ended: {:?})",
                d.name,
                problems.join("; "),
                d.closes
            ));
        }
    }

    if not_final != 0 {
        failures.push(format!(
            "{not_final} sessions not final {:.0}s after the load started",
            all_final_at.as_secs_f64()
        ));
    }
    if !aborted_other.is_empty() {
        failures.push(format!(
            "{} sessions ABORTED for another reason than the injected moderation: {}",
            aborted_other.len(),
            aborted_other
                .iter()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    failures.extend(wrongly.iter().cloned());
    if rejected_ok != expected_rejected {
        failures.push(format!("{rejected_ok} sessions ABORTED INPUT_REJECTED, {expected_rejected} prompts carried the reject word"));
    }
    if participants.len() != SESSIONS {
        failures.push(format!(
            "{} of {SESSIONS} sessions were created",
            participants.len()
        ));
    }
    if stats.jobs_created != jobs_expected {
        failures.push(format!(
            "provider jobs: {} created, {jobs_expected} expected (completed sessions x calls; a refused submit creates none)",
            stats.jobs_created
        ));
    }
    if stats.missing_key != 0 {
        failures.push(format!(
            "{} submits without an Idempotency-Key",
            stats.missing_key
        ));
    }
    if ranking_rows != completed as i64 || ranking_dupes != 0 || ranking_of_uncompleted != 0 {
        failures.push(format!(
            "ranking rows: {ranking_rows} for {completed} completed sessions ({ranking_dupes} sessions with more than one, {ranking_of_uncompleted} of sessions not COMPLETED)"
        ));
    }
    if !outbox_bad.is_empty() {
        failures.push(format!(
            "{} sessions without exactly one final outbox event of the right type, e.g. {}",
            outbox_bad.len(),
            outbox_bad
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if unnumbered > 0 {
        failures.push(format!("{unnumbered} outbox events never numbered"));
    }
    let watch = std::mem::take(&mut *cap_watch.borrow_mut());
    if stats.max_concurrent_jobs > cap_total as u64 {
        failures.push(format!(
            "the provider ran {} jobs at once (first over the caps at {}); the caps allow {cap_total} ({})",
            stats.max_concurrent_jobs,
            watch.first_exceed.map_or("? (between samples)".to_owned(), |(t, n)| format!("{:.2}s, {n} running", t.as_secs_f64())),
            EXPERIENCES
                .iter()
                .map(|e| format!("{} {}", e.name, e.max_in_flight))
                .collect::<Vec<_>>()
                .join(" + ")
        ));
    }
    let c = chaos.take();
    if c.pg_restarts != 1 {
        failures.push(format!(
            "PostgreSQL was restarted {} times, planned once",
            c.pg_restarts
        ));
    }
    match c.terminated {
        None => failures.push("no instance was SIGTERMed".into()),
        Some((idx, status, took)) => {
            let limit = SHUTDOWN_GRACE + Duration::from_secs(5);
            match status {
                None => failures.push(format!(
                    "instance {idx} did not exit within {:?} of SIGTERM",
                    SHUTDOWN_GRACE + Duration::from_secs(15)
                )),
                Some(s) if !s.success() => {
                    failures.push(format!("instance {idx} exited {s} after SIGTERM"))
                }
                Some(_) if took > limit => failures.push(format!(
                    "instance {idx} took {:.1}s to exit after SIGTERM (grace {:?})",
                    took.as_secs_f64(),
                    SHUTDOWN_GRACE
                )),
                Some(_) => {}
            }
        }
    }
    if grace_flag && going_away_total < c.displays_on_terminated as u32 {
        failures.push(format!(
            "{} displays were on the SIGTERMed instance, {going_away_total} were closed with 1001 \"going away\"",
            c.displays_on_terminated
        ));
    }
    // Handed over by the instance's own count (its last log line), which
    // includes any claimed before this test's snapshot.
    let handed_by_log: Option<usize> = c.shutdown_line.as_deref().and_then(|l| {
        let rest = &l[l.find("handed_over=")? + "handed_over=".len()..];
        rest.split(|ch: char| !ch.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    });
    // The instance's own last words: what it ran at the end of the grace,
    // handed over, and left to expire (a saga left to expire waits for its
    // lease and uses up a recovery: a graceful stop should leave none).
    let last_words_field = |name: &str| -> Option<usize> {
        let l = c.shutdown_line.as_deref()?;
        let key = format!("{name}=");
        let rest = &l[l.find(&key)? + key.len()..];
        rest.split(|ch: char| !ch.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let left_to_expire = last_words_field("left_to_expire");
    if grace_flag {
        if let Some((idx, Some(_), _)) = c.terminated {
            match left_to_expire {
                None => failures.push(format!(
                    "the SIGTERMed instance {idx} logged no \"shut down ... left_to_expire=N\" line"
                )),
                Some(0) => {}
                Some(n) => {
                    let why = c
                        .terminated_log
                        .as_ref()
                        .and_then(|p| std::fs::read_to_string(p).ok())
                        .and_then(|t| {
                            t.lines()
                                .find(|l| l.contains("could not hand over"))
                                .map(str::to_owned)
                        })
                        .unwrap_or_default();
                    failures.push(format!(
                        "the SIGTERMed instance {idx} left {n} sagas to expire instead of handing them over \
                         (they wait for their lease and use up a recovery): {}; {why}",
                        c.shutdown_line.as_deref().unwrap_or_default().trim()
                    ))
                }
            }
        }
        match (c.handed_over, c.handover_resumed) {
            (0, _) => {}
            (n, None) => failures.push(format!(
                "{n} handed-over sagas were not all claimed again within 5 s"
            )),
            (n, Some((took, used))) => {
                if used > 0 {
                    failures.push(format!(
                        "{used} of {n} handed-over sagas used up a recovery when claimed again"
                    ));
                }
                if took > Duration::from_millis(1_500) {
                    failures.push(format!(
                        "handed-over sagas took {} ms to be claimed again (poll 500 ms; \"at once\")",
                        took.as_millis()
                    ));
                }
            }
        }
        if handed_by_log.unwrap_or(0) == 0 && c.handed_over == 0 {
            eprintln!(
                "[chaos] NOTE: the SIGTERMed instance handed nothing over this run ({:?}); \
                 the handover path was not exercised",
                c.shutdown_line
            );
        }
    }

    // ---- The figures. ----
    let f = client.figures.take();
    let mut table = String::new();
    let mut row = |k: &str, v: String| {
        let _ = writeln!(table, "  {k:<34} {v}");
    };
    row("seed", seed.to_string());
    row(
        "wall time (cluster to verdict)",
        format!("{:.1} s", t0.elapsed().as_secs_f64()),
    );
    row(
        "load + chaos / all final at",
        format!(
            "{:.1} s / {:.1} s",
            chaos_over.as_secs_f64(),
            all_final_at.as_secs_f64()
        ),
    );
    row(
        "sessions created / submitted",
        format!(
            "{} / {} of {SESSIONS}",
            participants.len(),
            participants.iter().filter(|p| p.submitted).count()
        ),
    );
    row("COMPLETED", completed.to_string());
    row(
        "ABORTED INPUT_REJECTED",
        format!("{rejected_ok} (injected {expected_rejected})"),
    );
    row("ABORTED otherwise", aborted_other.len().to_string());
    row("not final", not_final.to_string());
    row(
        "provider jobs created",
        format!(
            "{} (expected {jobs_expected}: completed x calls)",
            stats.jobs_created
        ),
    );
    row(
        "provider submits / polls / refused",
        format!("{} / {} / {}", stats.submits, stats.polls, stats.refused),
    );
    row(
        "max concurrent provider jobs",
        format!(
            "{} (caps {cap_total} in all; the simulator counts all experiences together)",
            stats.max_concurrent_jobs
        ),
    );
    row(
        "  sampled peak (samples)",
        format!("{} ({})", watch.peak, watch.samples),
    );
    row(
        "ranking rows",
        format!("{ranking_rows} (completed {completed})"),
    );
    row(
        "outbox events / bad sessions",
        format!("{} / {}", outbox.len(), outbox_bad.len()),
    );
    row(
        "displays exactly-once",
        format!("{displays_ok} of {}", displays.len()),
    );
    row(
        "display reconnects / 1001 closes",
        format!("{reconnects_total} / {going_away_total}"),
    );
    row(
        "kills -9 / instance restarts",
        format!("{} / {}", c.kills, c.restart_took.len()),
    );
    row(
        "restart to healthy (max)",
        format!(
            "{:.2} s",
            c.restart_took
                .iter()
                .max()
                .copied()
                .unwrap_or_default()
                .as_secs_f64()
        ),
    );
    row(
        "PostgreSQL restarts (took)",
        format!(
            "{} ({:.2} s)",
            c.pg_restarts,
            c.pg_restart_took.unwrap_or_default().as_secs_f64()
        ),
    );
    row(
        "SIGTERM: exit, time",
        match c.terminated {
            Some((idx, s, took)) => format!(
                "instance {idx}: {} after {:.2} s",
                s.map_or("no exit".into(), |s| s.to_string()),
                took.as_secs_f64()
            ),
            None => "-".into(),
        },
    );
    row(
        "SIGTERM: displays on it / 1001",
        format!("{} / {going_away_total}", c.displays_on_terminated),
    );
    row(
        "handed over (its log / seen in db)",
        format!(
            "{} / {}",
            handed_by_log.map_or("-".into(), |n| n.to_string()),
            c.handed_over
        ),
    );
    row(
        "  claimed again within / recoveries",
        c.handover_resumed.map_or("-".into(), |(t, used)| {
            format!("{} ms / {used} used", t.as_millis())
        }),
    );
    row(
        "saga recoveries (sum / max)",
        format!("{recoveries_sum} / {recoveries_max}"),
    );
    row(
        "client requests / retries",
        format!("{} / {}", f.requests, f.retries),
    );
    row(
        "  connection errors / 409 in progress",
        format!("{} / {}", f.connection_errors, f.in_progress_409),
    );
    row(
        "  429/5xx answers (retried)",
        format!("{:?}", f.retried_statuses),
    );
    row("  replayed answers", f.replayed.to_string());
    eprintln!("\n==== chaos figures ====\n{table}");
    eprintln!("timeline:\n  {}", c.timeline.join("\n  "));
    eprintln!("displays:\n  {}", display_lines.join("\n  "));
    if !f.retried_samples.is_empty() {
        eprintln!(
            "retried answers (samples):\n  {}",
            f.retried_samples.join("\n  ")
        );
    }
    let (summary, errors) = log_summary(&nodes);
    eprintln!("instance logs: {summary}");
    if !errors.is_empty() {
        eprintln!("first ERROR lines:\n  {}", errors.join("\n  "));
    }

    if !watch.snapshot.is_empty() {
        eprintln!(
            "AI_PENDING sagas when the provider first ran more than {cap_total} jobs ({:?}):\n  {}",
            watch.first_exceed,
            watch.snapshot.join("\n  ")
        );
    }
    if failures.is_empty() {
        if std::env::var_os("STAGEHAND_CHAOS_KEEP_LOGS").is_some() {
            eprintln!("instance logs kept in {}", log_dir.keep().display());
        }
        eprintln!("==== chaos: PASS ====");
    } else {
        let (stuck, saga_ids) = stuck_report(&db, 20).await;
        if !stuck.is_empty() {
            eprintln!("stuck sessions:\n  {}", stuck.join("\n  "));
            for saga in saga_ids.iter().filter(|s| !s.is_empty()).take(3) {
                eprintln!(
                    "log lines of saga {saga}:\n  {}",
                    grep_logs(&nodes, saga, 25).join("\n  ")
                );
            }
        }
        for node in nodes.borrow().iter() {
            for path in node.logs.iter().rev().take(2) {
                eprintln!("----- tail of {} -----\n{}", path.display(), tail(path, 40));
            }
        }
        eprintln!(
            "----- tail of {} -----\n{}",
            pg.log().display(),
            tail(&pg.log(), 30)
        );
        let kept = log_dir.keep();
        eprintln!("instance logs kept in {}", kept.display());
        panic!(
            "chaos: {} failures:\n  {}",
            failures.len(),
            failures.join("\n  ")
        );
    }
    db.close().await.ok();
    drop(nodes);
    sim.stop().await;
}
