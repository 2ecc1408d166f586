//! Memory per idle display socket: a server on SQLite (simulator, its
//! defaults), a few terminals, its resident set with no display connected
//! then with N display WebSockets open and idle (each having read its hello
//! frame, each still read by a task of its own so pings are answered), and
//! the difference divided by N.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use super::load::{self, LogSummary, Stack, Ws};

/// Terminals the sockets are spread over.
const TERMINALS: usize = 4;
/// Displays connecting at the same time.
pub const CONNECTING: usize = 32;
/// Reads of VmRSS per measurement; their median is the figure.
const RSS_READS: usize = 5;
/// Between two reads of VmRSS.
pub const RSS_EVERY: Duration = Duration::from_millis(200);
/// Pause before the first measurement (server just started and set up) and
/// after the last socket connected.
pub const SETTLE: Duration = Duration::from_secs(2);
/// File descriptors a process needs besides the sockets (listeners, the
/// database, the HTTP client's pool, the runtime, logs).
pub(super) const FD_MARGIN: u64 = 256;

/// What the measurement gave.
#[derive(Debug, Clone)]
pub struct SocketMemory {
    pub sockets: usize,
    pub terminals: usize,
    /// Server VmRSS (KiB), median of [`RSS_READS`], with no display.
    pub rss_idle_kib: u64,
    /// The same with every socket open.
    pub rss_sockets_kib: u64,
    /// Every single read, in order, for the record.
    pub reads_idle_kib: Vec<u64>,
    pub reads_sockets_kib: Vec<u64>,
    /// How long connecting all the sockets took.
    pub connect_s: f64,
}

impl SocketMemory {
    /// `(RSS with the sockets - RSS without) / sockets`, KiB.
    pub fn per_socket_kib(&self) -> f64 {
        (self.rss_sockets_kib as f64 - self.rss_idle_kib as f64) / self.sockets as f64
    }
}

pub struct SocketMemoryResult {
    pub outcome: Result<SocketMemory, String>,
    pub server_log: PathBuf,
    pub log: Option<LogSummary>,
}

/// Runs the measurement with `sockets` idle displays on a server of
/// `builds.server`.
pub(super) async fn run(
    builds: load::Builds<'_>,
    dir: &Path,
    server_args: &[String],
    sockets: usize,
) -> SocketMemoryResult {
    let logs = super::logs_dir(dir);
    let server_log = logs.join("sockets-server.log");
    let outcome = measure(builds, dir, server_args, sockets)
        .await
        .map_err(|e| {
            if server_log.exists() {
                format!("{e}\n  server log: {}", server_log.display())
            } else {
                e
            }
        });
    SocketMemoryResult {
        outcome,
        log: load::summarize_log(&server_log),
        server_log,
    }
}

/// The measurement: the server's VmRSS with no display, then with
/// `sockets` idle display sockets open; then the sockets closed and the
/// processes stopped.
async fn measure(
    builds: load::Builds<'_>,
    dir: &Path,
    server_args: &[String],
    sockets: usize,
) -> Result<SocketMemory, String> {
    // Both this process and the server (which inherits the limit) hold one
    // descriptor per socket.
    let need = sockets as u64 + FD_MARGIN;
    ensure_open_files(need, "or skip this measurement with --no-socket-memory")?;
    let Stack {
        client,
        sim,
        mut server,
        base,
        operator,
        ..
    } = load::sqlite_stack(builds, dir, server_args, "sockets", 8).await?;
    let pid = server.child.id();
    check_server_files(pid, sockets, need)?;
    let (_slug, terminals) = load::create_terminals(
        &client,
        &base,
        &operator,
        load::bench_experience(),
        TERMINALS,
    )
    .await?;
    drop(client);
    let reads_idle_kib = rss_without_displays(pid, sockets).await?;
    let held = Held::new();
    let urls = terminals
        .iter()
        .map(|t| load::display_url(&base, t))
        .collect();
    let (connected, connect_s) = held.connect(urls, sockets).await;
    let outcome = rss_with_displays(pid, sockets, &held, &connected, connect_s)
        .await
        .map(|reads_sockets_kib| SocketMemory {
            sockets,
            terminals: TERMINALS,
            rss_idle_kib: median(&reads_idle_kib),
            rss_sockets_kib: median(&reads_sockets_kib),
            reads_idle_kib,
            reads_sockets_kib,
            connect_s,
        });
    if let Ok(Some(status)) = server.child.try_wait() {
        return Err(format!("the server exited ({status})"));
    }
    held.close().await;
    drop(server);
    drop(sim);
    outcome
}

/// Err when the server `pid` may open fewer than the `need` files its
/// `sockets` idle sockets take.
fn check_server_files(pid: u32, sockets: usize, need: u64) -> Result<(), String> {
    let server_files = open_files_limit(&format!("/proc/{pid}/limits"))?.0;
    if server_files < need {
        return Err(format!(
            "the server may open only {server_files} files; {sockets} sockets need about \
             {need}: raise the limit (ulimit -n {need}) or skip this with --no-socket-memory"
        ));
    }
    Ok(())
}

/// The server's VmRSS reads with no display connected, once it settled
/// after the setup.
async fn rss_without_displays(pid: u32, sockets: usize) -> Result<Vec<u64>, String> {
    tokio::time::sleep(SETTLE).await;
    let reads_idle_kib = rss_reads(pid).await?;
    eprintln!(
        "  socket memory: server VmRSS with no display: {reads_idle_kib:?} KiB; \
         connecting {sockets} displays"
    );
    Ok(reads_idle_kib)
}

/// The idle display sockets, each held open by a task of its own until
/// told to stop, and what became of them.
struct Held {
    stop_tx: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
    /// Sockets connected (their hello read).
    open: Arc<AtomicUsize>,
    /// Sockets that closed while held.
    closed: Arc<AtomicUsize>,
    /// Why the first of those closed.
    first_close: Arc<Mutex<Option<String>>>,
    /// The tasks holding the sockets.
    holders: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Held {
    /// No socket yet.
    fn new() -> Held {
        let (stop_tx, stop_rx) = watch::channel(false);
        Held {
            stop_tx,
            stop_rx,
            open: Arc::default(),
            closed: Arc::default(),
            first_close: Arc::default(),
            holders: Arc::default(),
        }
    }

    /// Connects `sockets` displays, [`CONNECTING`] at a time, socket `i` to
    /// `urls[i % urls.len()]`: each reads its hello, then is handed to a
    /// task that keeps reading (answering pings) until told to stop. Each
    /// socket's outcome, and how long connecting them all took (s).
    async fn connect(&self, urls: Vec<String>, sockets: usize) -> (Vec<Result<(), String>>, f64) {
        let urls = Arc::new(urls);
        let connect_start = Instant::now();
        let (stop_rx, open, closed, first_close, holders) = (
            self.stop_rx.clone(),
            self.open.clone(),
            self.closed.clone(),
            self.first_close.clone(),
            self.holders.clone(),
        );
        let connected = load::in_workers(sockets, CONNECTING, move |i| {
            let url = urls[i % urls.len()].clone();
            let (open, closed, first_close, holders) = (
                open.clone(),
                closed.clone(),
                first_close.clone(),
                holders.clone(),
            );
            let stop = stop_rx.clone();
            async move {
                let ws = load::connect_display(&url, 0)
                    .await
                    .map_err(|e| format!("display socket {i}: {e}"))?;
                open.fetch_add(1, Ordering::Relaxed);
                let task = tokio::spawn(hold(ws, stop, closed, first_close));
                holders.lock().expect("holders").push(task);
                Ok::<_, String>(())
            }
        })
        .await;
        (connected, connect_start.elapsed().as_secs_f64())
    }

    /// Tells every socket to close, and waits (at most 10 s) until their
    /// tasks ended.
    async fn close(self) {
        let _ = self.stop_tx.send(true);
        let tasks: Vec<_> = std::mem::take(&mut *self.holders.lock().expect("holders"));
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            for t in tasks {
                let _ = t.await;
            }
        })
        .await;
    }
}

/// The server's VmRSS reads with every socket open, once they settled;
/// Err when a socket did not connect, or one closed before the reads were
/// done.
async fn rss_with_displays(
    pid: u32,
    sockets: usize,
    held: &Held,
    connected: &[Result<(), String>],
    connect_s: f64,
) -> Result<Vec<u64>, String> {
    let failed: Vec<&String> = connected.iter().filter_map(|r| r.as_ref().err()).collect();
    if !failed.is_empty() {
        let mut msg = format!(
            "{} of {sockets} display socket(s) did not connect:",
            failed.len()
        );
        for e in failed.iter().take(5) {
            msg.push_str(&format!("\n  {e}"));
        }
        return Err(msg);
    }
    eprintln!(
        "  socket memory: {} displays connected (hello read on each) in {connect_s:.1}s",
        held.open.load(Ordering::Relaxed)
    );
    tokio::time::sleep(SETTLE).await;
    let reads = rss_reads(pid).await;
    let lost = held.closed.load(Ordering::Relaxed);
    match reads {
        Err(e) => Err(e),
        Ok(_) if lost > 0 => Err(format!(
            "{lost} of {sockets} idle display socket(s) closed during the measurement; \
             first: {}",
            held.first_close
                .lock()
                .expect("first close")
                .clone()
                .unwrap_or_default()
        )),
        Ok(reads_sockets_kib) => {
            eprintln!(
                "  socket memory: server VmRSS with {sockets} idle displays: \
                 {reads_sockets_kib:?} KiB"
            );
            Ok(reads_sockets_kib)
        }
    }
}

/// Keeps one idle display socket open: reads it (so pings are answered)
/// until `stop`, then closes it. A close by the server is counted.
async fn hold(
    mut ws: Ws,
    mut stop: watch::Receiver<bool>,
    closed: Arc<AtomicUsize>,
    first_close: Arc<Mutex<Option<String>>>,
) {
    loop {
        let msg = tokio::select! {
            biased;
            _ = stop.changed() => break,
            msg = ws.next() => msg,
        };
        let why = match msg {
            Some(Ok(Message::Close(frame))) => format!("closed by the server: {frame:?}"),
            Some(Err(e)) => format!("read error: {e}"),
            None => "connection ended".to_owned(),
            Some(Ok(_)) => continue, // ping (answered by tungstenite), pong, frames
        };
        closed.fetch_add(1, Ordering::Relaxed);
        first_close.lock().expect("first close").get_or_insert(why);
        return;
    }
    let _ = ws.close(None).await;
}

/// [`RSS_READS`] reads of the process's VmRSS, [`RSS_EVERY`] apart, KiB.
pub(super) async fn rss_reads(pid: u32) -> Result<Vec<u64>, String> {
    let mut out = Vec::with_capacity(RSS_READS);
    for i in 0..RSS_READS {
        if i > 0 {
            tokio::time::sleep(RSS_EVERY).await;
        }
        out.push(vm_rss_kib(pid)?);
    }
    Ok(out)
}

/// `VmRSS:` of `/proc/<pid>/status`, in KiB.
fn vm_rss_kib(pid: u32) -> Result<u64, String> {
    status_kib(pid, "VmRSS")
}

/// A `<name>:` line (`VmRSS`, `VmHWM`: the peak) of `/proc/<pid>/status`, in
/// KiB.
pub(super) fn status_kib(pid: u32, name: &str) -> Result<u64, String> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("read {path}: {e}"))?;
    parse_status_kib(&text, name).ok_or_else(|| format!("no {name} line in {path}"))
}

fn parse_status_kib(status: &str, name: &str) -> Option<u64> {
    let line = status.lines().find(|l| {
        l.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(':'))
    })?;
    let mut parts = line[name.len() + 1..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") | None => Some(value),
        Some(_) => None,
    }
}

pub(super) fn median(values: &[u64]) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    v[v.len() / 2]
}

/// Makes sure this process may open `need` files: reads its soft and hard
/// limits from `/proc/self/limits` and, when the soft limit is too low but
/// the hard one allows, raises it with `prlimit` (util-linux). The server,
/// started afterwards, inherits it. `otherwise` ends the advice of the
/// error ("or skip this measurement with --no-socket-memory").
pub(super) fn ensure_open_files(need: u64, otherwise: &str) -> Result<(), String> {
    let (soft, hard) = open_files_limit("/proc/self/limits")?;
    if soft >= need {
        return Ok(());
    }
    let advice = format!("raise it in the shell that runs this (ulimit -n {need}) {otherwise}");
    if hard < need {
        return Err(format!(
            "the open-file limit is {soft} (hard limit {hard}) and {} idle sockets need \
             about {need}: {advice}",
            need - FD_MARGIN
        ));
    }
    let pid = std::process::id();
    let raised = Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={need}:")])
        .output();
    match raised {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            return Err(format!(
                "the open-file limit is {soft}, {need} needed, and prlimit could not raise it \
                 ({}): {advice}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
        Err(e) => {
            return Err(format!(
                "the open-file limit is {soft}, {need} needed, and prlimit could not run \
                 ({e}): {advice}"
            ))
        }
    }
    let (now, _) = open_files_limit("/proc/self/limits")?;
    if now < need {
        return Err(format!(
            "the open-file limit is still {now} after prlimit, {need} needed: {advice}"
        ));
    }
    eprintln!("  socket memory: open-file limit raised from {soft} to {now}");
    Ok(())
}

/// The soft and hard "Max open files" of a `/proc/<pid>/limits` file.
fn open_files_limit(path: &str) -> Result<(u64, u64), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("read {path}: {e}"))?;
    parse_open_files(&text).ok_or_else(|| format!("no \"Max open files\" line in {path}"))
}

fn parse_open_files(limits: &str) -> Option<(u64, u64)> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut parts = line["Max open files".len()..].split_whitespace();
    let value = |s: Option<&str>| match s? {
        "unlimited" => Some(u64::MAX),
        n => n.parse().ok(),
    };
    Some((value(parts.next())?, value(parts.next())?))
}

#[cfg(test)]
mod tests {
    use super::{median, parse_open_files, parse_status_kib};

    #[test]
    fn reads_vm_rss() {
        let status = "Name:\tstagehand\nVmHWM:\t   30000 kB\nVmRSS:\t   21504 kB\nThreads:\t5\n";
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(21504));
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(30000));
        assert_eq!(parse_status_kib("Name:\tx\n", "VmRSS"), None);
    }

    #[test]
    fn reads_open_files() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             63704                63704                processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_open_files(limits), Some((1024, 524288)));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_open_files(unlimited), Some((u64::MAX, u64::MAX)));
    }

    #[test]
    fn median_of_reads() {
        assert_eq!(median(&[5, 1, 3, 4, 2]), 3);
        assert_eq!(median(&[7]), 7);
    }
}
