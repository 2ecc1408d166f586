//! Webhooks in `stagehand bench` (`--no-webhooks` skips them): a server on
//! SQLite, and a webhook endpoint that answers each delivery after
//! `--hook-delay` (the tests' receiver, `tests/support/webhook_receiver.py`,
//! which verifies every signature with the reference library of Standard
//! Webhooks, `standardwebhooks` from PyPI). Three timed sets of `--hooks`
//! prompt submissions, 8 at a time, side by side in one run: with no
//! endpoint, with the endpoint (its deliveries sent while the booth goes
//! on), and with none again. Each set's 202 p99 (POST to 202); then every
//! delivery of the middle set, verified, and each `webhook-id` once after
//! deduplication, and the time until the last was taken.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::load::{self, Builds, Session, Stack};

/// Completions with the endpoint (`--hooks`).
pub const HOOKS: usize = 1_000;

/// What the webhook figures are.
#[derive(Debug, Clone)]
pub struct HookFigures {
    pub submissions: usize,
    pub delay: Duration,
    /// 202 p99 (ms): no endpoint, with the endpoint, no endpoint again.
    pub p99_ms: [f64; 3],
    pub received: usize,
    pub verified: usize,
    pub unique_ids: usize,
    /// From the first submission with the endpoint to the last delivery.
    pub delivered_in: Duration,
}

pub(super) async fn run(
    builds: Builds<'_>,
    dir: &Path,
    server_args: &[String],
    submissions: usize,
    delay: Duration,
) -> Result<HookFigures, String> {
    let receiver = Receiver::start()?;
    let mut args = server_args.to_vec();
    args.extend(["--webhook-allow-private".to_owned(), "true".to_owned()]);
    let stack = load::sqlite_stack(builds, dir, &args, "webhooks", 16).await?;
    let booth = booth(&stack).await?;
    eprintln!(
        "  webhooks: 3 sets of {submissions} submissions; the endpoint answers after {} ms",
        delay.as_millis()
    );
    let alone = timed_set(&stack, &booth, submissions).await?;
    let webhook_id = add_endpoint(&stack, &receiver, delay).await?;
    let started = Instant::now();
    let with = timed_set(&stack, &booth, submissions).await?;
    let received = receiver.wait_for(&stack.client, submissions).await?;
    let delivered_in = started.elapsed();
    remove_endpoint(&stack, &webhook_id).await?;
    let again = timed_set(&stack, &booth, submissions).await?;
    let mut ids: Vec<&str> = received.iter().filter_map(|d| d["id"].as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    Ok(HookFigures {
        submissions,
        delay,
        p99_ms: [alone, with, again],
        received: received.len(),
        verified: received.iter().filter(|d| d["verified"] == true).count(),
        unique_ids: ids.len(),
        delivered_in,
    })
}

/// A prompt booth with one terminal: its slug and terminal.
async fn booth(stack: &Stack) -> Result<(String, String), String> {
    let body = json!({"title": "Webhook bench", "kind": "image", "max_in_flight": 1000});
    let (slug, terminals) =
        load::create_terminals(&stack.client, &stack.base, &stack.operator, body, 1).await?;
    let terminal = terminals
        .into_iter()
        .next()
        .map(|t| t.id)
        .ok_or("no terminal was made")?;
    Ok((slug, terminal))
}

/// `n` prompt submissions at the booth, 8 at a time: the 202's p99 (ms),
/// once every one of them completed (so no completion of one set falls
/// into the next).
async fn timed_set(stack: &Stack, booth: &(String, String), n: usize) -> Result<f64, String> {
    let made = Arc::new(AtomicUsize::new(0));
    let (slug, terminal) = booth;
    let sessions: Arc<Vec<Session>> = Arc::new(
        load::create_sessions(
            &stack.client,
            &stack.base,
            slug,
            vec![terminal.clone()],
            n,
            16,
            made,
        )
        .await?,
    );
    let (client, base, all) = (stack.client.clone(), stack.base.clone(), sessions.clone());
    let timings = load::in_workers(n, 8, move |i| {
        let (client, base, sessions) = (client.clone(), base.clone(), sessions.clone());
        async move {
            let started = Instant::now();
            load::submit(
                &client,
                &base,
                &sessions[i],
                &json!({"prompt": format!("hook {i}")}),
            )
            .await
            .map_err(|e| e.to_string())?;
            Ok::<f64, String>(load::ms(started.elapsed()))
        }
    })
    .await;
    let mut timings = timings.into_iter().collect::<Result<Vec<f64>, String>>()?;
    for session in all.iter() {
        super::media::completed_content(stack, session).await?;
    }
    Ok(load::percentile(&mut timings, 0.99))
}

async fn add_endpoint(
    stack: &Stack,
    receiver: &Receiver,
    delay: Duration,
) -> Result<String, String> {
    let resp = stack
        .client
        .post(format!("{}/api/admin/webhooks", stack.base))
        .bearer_auth(&stack.operator)
        .json(&json!({"url": receiver.hook_url(), "events": ["session.completed"]}))
        .send()
        .await
        .map_err(|e| format!("add webhook: {e}"))?;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if status != 201 {
        return Err(format!("add webhook: {status} {body}"));
    }
    receiver
        .control(
            &stack.client,
            json!({"secret": body["secret"], "status": 204, "delay_ms": delay.as_millis() as u64}),
        )
        .await?;
    body["webhook_id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("add webhook: no id in {body}"))
}

async fn remove_endpoint(stack: &Stack, webhook_id: &str) -> Result<(), String> {
    let resp = stack
        .client
        .delete(format!("{}/api/admin/webhooks/{webhook_id}", stack.base))
        .bearer_auth(&stack.operator)
        .send()
        .await
        .map_err(|e| format!("remove webhook: {e}"))?;
    if resp.status() != 204 {
        return Err(format!("remove webhook: {}", resp.status()));
    }
    Ok(())
}

/// The tests' webhook receiver, as a process of its own; killed on drop.
struct Receiver {
    child: Child,
    base: String,
}

impl Receiver {
    fn start() -> Result<Receiver, String> {
        let script: PathBuf =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/support/webhook_receiver.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("run {}: {e}", script.display()))?;
        let mut first = String::new();
        let read = std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().ok_or("the receiver's stdout")?),
            &mut first,
        );
        match (read, first.trim().parse::<u16>()) {
            (Ok(_), Ok(port)) => Ok(Receiver {
                child,
                base: format!("http://127.0.0.1:{port}"),
            }),
            _ => {
                let _ = child.kill();
                Err(format!(
                    "the webhook receiver did not start (python3 -m pip install standardwebhooks==1.1.0): {first:?}"
                ))
            }
        }
    }

    fn hook_url(&self) -> String {
        format!("{}/hook", self.base)
    }

    async fn control(&self, client: &reqwest::Client, settings: Value) -> Result<(), String> {
        let resp = client
            .post(format!("{}/control", self.base))
            .json(&settings)
            .send()
            .await
            .map_err(|e| format!("the receiver's control: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("the receiver's control: {}", resp.status()));
        }
        Ok(())
    }

    /// Waits (10 minutes at most) until `n` deliveries came: them all.
    async fn wait_for(&self, client: &reqwest::Client, n: usize) -> Result<Vec<Value>, String> {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let got: Vec<Value> = client
                .get(format!("{}/received", self.base))
                .send()
                .await
                .map_err(|e| format!("the receiver's log: {e}"))?
                .json()
                .await
                .map_err(|e| format!("the receiver's log: {e}"))?;
            if got.len() >= n {
                return Ok(got);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} of {n} deliveries came in 10 minutes",
                    got.len()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn print_table(figures: &Result<HookFigures, String>) {
    println!();
    println!("## Webhooks");
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
        "| 202 p99 (ms), {} submissions each: no endpoint / an endpoint of {} ms / no endpoint again | {:.1} / {:.1} / {:.1} |",
        f.submissions,
        f.delay.as_millis(),
        f.p99_ms[0],
        f.p99_ms[1],
        f.p99_ms[2]
    );
    println!(
        "| deliveries received / verified by the reference library / webhook-ids once deduplicated | {} / {} / {} |",
        f.received, f.verified, f.unique_ids
    );
    println!(
        "| from the first submission to the last delivery (s) | {:.1} |",
        f.delivered_in.as_secs_f64()
    );
}
