//! The event's outputs in `stagehand bench` (`--no-outputs` skips them):
//! - the CPU-ms of drawing the brand on a 1024² and a 2048² result, and of
//!   preparing a print (4×6 in at 300 dpi), from the server's own
//!   measurement (`stagehand output-cost`);
//! - [`PRINTS`] prints queued at once over two real printers (CUPS's
//!   `ippeveprinter` on 127.0.0.1, each job taking `--print-pace`), each
//!   printed exactly once: the time the queue took from the first press
//!   to the last print, against the printers' own pace (prints × pace ÷
//!   printers).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::load::{self, Builds, Session, Stack};

/// Prints queued at once (`--prints`).
pub const PRINTS: usize = 100;

/// How much of it runs: the prints queued, the CPU rounds, each print's
/// time at the printer.
#[derive(Debug, Clone, Copy)]
pub struct OutputCounts {
    pub prints: usize,
    pub rounds: usize,
    pub pace: Duration,
}
/// Printers they share.
pub const PRINTERS: usize = 2;

#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct OutputCost {
    pub brand_1024_ms: Vec<f64>,
    pub brand_2048_ms: Vec<f64>,
    pub print_prepare_ms: Vec<f64>,
}

#[derive(Debug, Clone, Default)]
pub struct OutputFigures {
    pub cost: OutputCost,
    pub prints: usize,
    pub printed: usize,
    pub twice: usize,
    pub pace: Duration,
    pub queue_took: Duration,
}

impl OutputFigures {
    /// The printers' own pace: what the queue would take if a printer never
    /// waited for the next print.
    pub fn ideal(&self) -> Duration {
        self.pace * (self.prints as u32) / PRINTERS as u32
    }
}

pub(super) async fn run(
    builds: Builds<'_>,
    dir: &Path,
    server_args: &[String],
    counts: OutputCounts,
) -> Result<OutputFigures, String> {
    let (pace, prints) = (counts.pace, counts.prints.max(1));
    let cost = output_cost(builds.server, counts.rounds.max(1)).await?;
    let printers = (0..PRINTERS)
        .map(|i| BenchPrinter::start(dir, i, pace))
        .collect::<Result<Vec<_>, String>>()?;
    let stack = load::sqlite_stack(builds, dir, server_args, "outputs", 64).await?;
    let (slug, terminal) = booth(&stack, &printers).await?;
    let sessions = completed_sessions(&stack, &slug, terminal, prints).await?;
    eprintln!(
        "  outputs: {prints} prints over {PRINTERS} printers ({} ms a print)",
        pace.as_millis()
    );
    let started = Instant::now();
    for session in &sessions {
        press_print(&stack, session).await?;
    }
    wait_all_printed(&stack, &sessions).await?;
    let queue_took = started.elapsed();
    let names: Vec<String> = printers.iter().flat_map(|p| p.documents()).collect();
    let unique: std::collections::BTreeSet<&String> = names.iter().collect();
    Ok(OutputFigures {
        cost,
        prints,
        printed: names.len(),
        twice: names.len() - unique.len(),
        pace,
        queue_took,
    })
}

/// The server's own measurement of the brand and the print preparation.
async fn output_cost(exe: &Path, rounds: usize) -> Result<OutputCost, String> {
    let out = tokio::process::Command::new(exe)
        .args(["output-cost", "--rounds", &rounds.to_string()])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .map_err(|e| format!("run stagehand output-cost: {e}"))?;
    if !out.status.success() {
        return Err(format!("stagehand output-cost exited with {}", out.status));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("the figures of stagehand output-cost: {e}"))
}

/// A photo booth with a caption, its prints on both printers.
async fn booth(stack: &Stack, printers: &[BenchPrinter]) -> Result<(String, String), String> {
    let body = json!({"title": "Print bench", "kind": "image", "input": "photo", "max_in_flight": 1000,
        "brand_caption": "stagehand bench · 2026", "prints_per_guest": 1});
    let (slug, terminals) =
        load::create_terminals(&stack.client, &stack.base, &stack.operator, body, 1).await?;
    let terminal = terminals
        .into_iter()
        .next()
        .map(|t| t.id)
        .ok_or("no terminal was made")?;
    for (i, printer) in printers.iter().enumerate() {
        let resp = stack
            .client
            .post(format!("{}/api/admin/printers", stack.base))
            .bearer_auth(&stack.operator)
            .json(&json!({"name": format!("bench {i}"), "uri": printer.uri(), "media": "na_index-4x6_4x6in", "experiences": [slug]}))
            .send()
            .await
            .map_err(|e| format!("add printer: {e}"))?;
        if resp.status() != 201 {
            return Err(format!(
                "add printer: {} {}",
                resp.status(),
                resp.text().await.unwrap_or_default()
            ));
        }
    }
    Ok((slug, terminal))
}

async fn completed_sessions(
    stack: &Stack,
    slug: &str,
    terminal: String,
    n: usize,
) -> Result<Vec<Session>, String> {
    let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sessions = load::create_sessions(
        &stack.client,
        &stack.base,
        slug,
        vec![terminal],
        n,
        16,
        made,
    )
    .await?;
    let photo = super::media::photo_jpeg(1200, 900);
    for session in &sessions {
        let (status, body) =
            super::media::upload(&stack.client, &stack.base, session, photo.clone()).await?;
        if status != reqwest::StatusCode::CREATED {
            return Err(format!("upload: {status} {body}"));
        }
        load::submit(
            &stack.client,
            &stack.base,
            session,
            &json!({"photo_id": body["photo_id"]}),
        )
        .await
        .map_err(|e| format!("submission: {e}"))?;
    }
    for session in &sessions {
        super::media::completed_content(stack, session).await?;
    }
    Ok(sessions)
}

async fn press_print(stack: &Stack, session: &Session) -> Result<(), String> {
    let resp = stack
        .client
        .post(format!("{}/api/sessions/{}/print", stack.base, session.id))
        .bearer_auth(&session.token)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .send()
        .await
        .map_err(|e| format!("print: {e}"))?;
    if resp.status() != 202 {
        return Err(format!(
            "print: {} {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        ));
    }
    Ok(())
}

/// Waits (10 minutes at most) until every session's print is COMPLETED.
async fn wait_all_printed(stack: &Stack, sessions: &[Session]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(600);
    for session in sessions {
        loop {
            let body: Value = stack
                .client
                .get(format!("{}/api/sessions/{}", stack.base, session.id))
                .bearer_auth(&session.token)
                .send()
                .await
                .map_err(|e| format!("session: {e}"))?
                .json()
                .await
                .map_err(|e| format!("session: {e}"))?;
            match body["prints"][0]["status"].as_str() {
                Some("COMPLETED") => break,
                Some("ABORTED" | "CANCELED") => {
                    return Err(format!("a print ended without paper: {body}"))
                }
                _ if Instant::now() > deadline => {
                    return Err(format!("a print did not finish: {body}"))
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    Ok(())
}

/// One `ippeveprinter` whose every job takes `pace` (a script that
/// sleeps), keeping each document; killed on drop. Its DNS-SD needs
/// avahi-daemon on a system D-Bus: started here when they do not run (as
/// the tests do, tests/support/printer.rs).
struct BenchPrinter {
    port: u16,
    spool: PathBuf,
    child: Child,
}

impl BenchPrinter {
    fn start(dir: &Path, index: usize, pace: Duration) -> Result<BenchPrinter, String> {
        daemons()?;
        let home = dir.join(format!("printer-{index}"));
        let spool = home.join("spool");
        std::fs::create_dir_all(&spool).map_err(|e| format!("printer folder: {e}"))?;
        let script = home.join("job.sh");
        std::fs::write(
            &script,
            format!("#!/bin/sh\nsleep {:.3}\n", pace.as_secs_f64()),
        )
        .map_err(|e| format!("printer script: {e}"))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let child = Command::new("ippeveprinter")
            .args([
                "-n",
                "localhost",
                "-p",
                &port.to_string(),
                "-k",
                "-s",
                "10,10",
            ])
            .args(["-f", "image/jpeg,image/pwg-raster,image/urf"])
            .arg("-d")
            .arg(&spool)
            .arg("-c")
            .arg(&script)
            .arg(format!("Bench printer {index}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("ippeveprinter (apt-get install cups-ipp-utils avahi-daemon): {e}")
            })?;
        let printer = BenchPrinter { port, spool, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!("ippeveprinter did not listen on {port}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(printer)
    }

    fn uri(&self) -> String {
        format!("ipp://127.0.0.1:{}/ipp/print", self.port)
    }

    /// The documents it kept, by file name.
    fn documents(&self) -> Vec<String> {
        std::fs::read_dir(&self.spool)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".jpg") || name.ends_with(".jpeg"))
            // `<job-id>-<job-name>.jpg`: the name says which print it is.
            .map(|name| {
                name.split_once('-')
                    .map_or(name.clone(), |(_, rest)| rest.to_owned())
            })
            .collect()
    }
}

impl Drop for BenchPrinter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The system D-Bus and avahi-daemon (loopback only, nothing published),
/// unless they run.
fn daemons() -> Result<(), String> {
    const SOCKET: &str = "/run/dbus/system_bus_socket";
    if std::os::unix::net::UnixStream::connect(SOCKET).is_err() {
        std::fs::create_dir_all("/run/dbus").map_err(|e| format!("/run/dbus (needs root): {e}"))?;
        let _ = std::fs::remove_file(SOCKET);
        Command::new("dbus-daemon")
            .args(["--system", "--nofork", "--nopidfile"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("dbus-daemon: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(SOCKET).is_err() {
            if Instant::now() > deadline {
                return Err("the system D-Bus did not start".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let running = Command::new("avahi-daemon")
        .arg("--check")
        .status()
        .is_ok_and(|s| s.success());
    if !running {
        let conf = std::env::temp_dir().join("stagehand-bench-avahi-daemon.conf");
        std::fs::write(
            &conf,
            "[server]\nuse-ipv4=yes\nuse-ipv6=no\nallow-interfaces=lo\n[wide-area]\nenable-wide-area=no\n[publish]\ndisable-publishing=yes\n",
        )
        .map_err(|e| e.to_string())?;
        let started = Command::new("avahi-daemon")
            .args(["--daemonize", "--no-drop-root", "--no-chroot", "--file"])
            .arg(&conf)
            .status()
            .map_err(|e| format!("avahi-daemon: {e}"))?;
        if !started.success() {
            return Err(format!("avahi-daemon --daemonize: {started}"));
        }
    }
    Ok(())
}

fn median(values: &[f64]) -> f64 {
    load::percentile(&mut values.to_vec(), 0.50)
}

/// The outputs' table.
pub fn print_table(figures: &Result<OutputFigures, String>) {
    println!();
    println!("## The event's outputs (brand, print)");
    let f = match figures {
        Ok(f) => f,
        Err(e) => {
            println!("FAILED: {e}");
            return;
        }
    };
    println!("| figure | value |");
    println!("|---|---:|");
    println!(
        "| brand a 1024² result (CPU-ms, median of {}) | {:.1} |",
        f.cost.brand_1024_ms.len(),
        median(&f.cost.brand_1024_ms)
    );
    println!(
        "| brand a 2048² result (CPU-ms, median) | {:.1} |",
        median(&f.cost.brand_2048_ms)
    );
    println!(
        "| prepare a print, 2048² to 4×6 in at 300 dpi (CPU-ms, median) | {:.1} |",
        median(&f.cost.print_prepare_ms)
    );
    println!(
        "| prints queued / documents printed / printed twice | {} / {} / {} |",
        f.prints, f.printed, f.twice
    );
    println!(
        "| the queue took (s) / the printers' own pace (s) / ratio | {:.1} / {:.1} / {:.2} |",
        f.queue_took.as_secs_f64(),
        f.ideal().as_secs_f64(),
        f.queue_took.as_secs_f64() / f.ideal().as_secs_f64()
    );
}
