//! The export figure of `stagehand bench` (with the media figures): a
//! fresh server on SQLite with the simulator, an experience with `n`
//! completed results made through HTTP like any booth's, then `GET
//! /api/admin/experiences/{slug}/export` read to its end without keeping
//! it. The figure is the server's peak resident set during each export
//! (VmHWM, reset just before it through `/proc/<pid>/clear_refs`) against
//! the resident set when it started: a small export, the whole one, and
//! the whole one again (its caches then warm), so what grows with the
//! export's size shows apart from what a first read warms up.

use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

use super::load::{self, Builds, Stack};
use super::sockets::status_kib;

/// What the measurement gave.
#[derive(Debug, Clone, Default)]
pub struct ExportFigures {
    /// Results in the big export, and in the small one read first.
    pub results: usize,
    pub small_results: usize,
    /// The big export's size and time.
    pub zip_bytes: u64,
    pub seconds: f64,
    /// Each export: (results, resident set at its start, peak during it).
    pub runs: Vec<(usize, u64, u64)>,
}

/// Runs the measurement with `results` results (and a tenth for the small
/// export); Err says what failed.
pub(super) async fn run(
    builds: Builds<'_>,
    dir: &Path,
    server_args: &[String],
    results: usize,
) -> Result<ExportFigures, String> {
    let stack = load::sqlite_stack(builds, dir, server_args, "export", 64).await?;
    let small_results = (results / 10).max(1);
    eprintln!("  export: making {small_results} + {results} results");
    let small = booth_with_results(&stack, small_results).await?;
    let big = booth_with_results(&stack, results).await?;
    let pid = stack.server.child.id();
    let mut figures = ExportFigures {
        results,
        small_results,
        ..ExportFigures::default()
    };
    for (slug, n) in [(&small, small_results), (&big, results), (&big, results)] {
        let start = status_kib(pid, "VmRSS")?;
        reset_peak(pid)?;
        let started = Instant::now();
        let bytes = read_export(&stack, slug).await?;
        if n == results {
            (figures.zip_bytes, figures.seconds) = (bytes, started.elapsed().as_secs_f64());
        }
        figures.runs.push((n, start, status_kib(pid, "VmHWM")?));
    }
    Ok(figures)
}

/// Sets the process's peak resident set (VmHWM) back to its resident set
/// now (`5` to `/proc/<pid>/clear_refs`, Linux 4.0+), so the next read is
/// the peak since.
fn reset_peak(pid: u32) -> Result<(), String> {
    let path = format!("/proc/{pid}/clear_refs");
    std::fs::write(&path, "5").map_err(|e| format!("reset the peak RSS ({path}): {e}"))
}

/// A new experience with `n` completed results; its slug.
async fn booth_with_results(stack: &Stack, n: usize) -> Result<String, String> {
    let body = json!({"title": "Export bench", "kind": "comic", "max_in_flight": 1000});
    let (slug, terminals) =
        load::create_terminals(&stack.client, &stack.base, &stack.operator, body, 1).await?;
    let ids = terminals.into_iter().map(|t| t.id).collect();
    let made = Arc::new(AtomicUsize::new(0));
    let sessions =
        Arc::new(load::create_sessions(&stack.client, &stack.base, &slug, ids, n, 32, made).await?);
    let (client, base) = (stack.client.clone(), stack.base.clone());
    let sent = load::in_workers(n, 32, move |i| {
        let (client, base, sessions) = (client.clone(), base.clone(), sessions.clone());
        async move {
            let body = json!({"prompt": format!("an export bench comic {i}")});
            load::submit(&client, &base, &sessions[i], &body)
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await;
    sent.into_iter().collect::<Result<Vec<()>, String>>()?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let held = held(stack, &slug).await?;
        if held["results"].as_u64() == Some(n as u64) {
            return Ok(slug);
        }
        if Instant::now() > deadline {
            return Err(format!("{n} results were not made within 10 min: {held}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn held(stack: &Stack, slug: &str) -> Result<Value, String> {
    stack
        .client
        .get(format!("{}/api/admin/experiences/{slug}/held", stack.base))
        .bearer_auth(&stack.operator)
        .send()
        .await
        .map_err(|e| format!("held: {}", load::with_causes(&e)))?
        .json()
        .await
        .map_err(|e| format!("held: {e}"))
}

/// Reads the experience's export to its end, chunk by chunk; its size.
async fn read_export(stack: &Stack, slug: &str) -> Result<u64, String> {
    let resp = stack
        .client
        .get(format!(
            "{}/api/admin/experiences/{slug}/export",
            stack.base
        ))
        .bearer_auth(&stack.operator)
        .timeout(Duration::from_secs(1800))
        .send()
        .await
        .map_err(|e| format!("export: {}", load::with_causes(&e)))?;
    if !resp.status().is_success() {
        return Err(format!("export: {}", resp.status()));
    }
    let mut body = resp.bytes_stream();
    let mut bytes = 0u64;
    while let Some(chunk) = body.next().await {
        bytes += chunk.map_err(|e| format!("export body: {e}"))?.len() as u64;
    }
    Ok(bytes)
}
