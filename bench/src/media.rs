//! The media figures of `stagehand bench` (`--media`): one server on SQLite
//! with the simulator, as a user runs them, and photo uploads through HTTP.
//! - CPU-ms of the server per upload of a 1.5 MP and of a 12 MP JPEG
//!   (photo-like pictures made here), and 1.5 MP uploads per second;
//! - peak RSS (VmHWM) during 50 concurrent 12 MP uploads, against the
//!   resident set before them, with the photo pool's size;
//! - the keep stage per result (the server's `stagehand_keep_seconds`
//!   histogram, download and store);
//! - the bytes a display downloads for 1,000 results (the thumbnail where
//!   one is kept) against the full files;
//! - the 202's p99 of prompt-only submissions alone and during a burst of
//!   12 MP uploads, and their ratio.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::load::{self, Builds, Session, Stack};
use super::sockets::status_kib;

/// How much the media figures do.
#[derive(Debug, Clone, Copy)]
pub struct MediaCounts {
    /// Uploads of the 1.5 MP photo timed for CPU and rate.
    pub small_uploads: usize,
    /// Uploads of the 12 MP photo timed for CPU.
    pub large_uploads: usize,
    /// Concurrent 12 MP uploads in the burst whose peak RSS is read.
    pub burst: usize,
    /// Prompt-only submissions timed for the 202's p99, alone and in a
    /// burst: flat out (8 at a time), then paced at [`PACED_RATE`].
    pub prompts: usize,
    pub paced_prompts: usize,
    /// Photo results whose display bytes are summed.
    pub results: usize,
    /// Results in the export measured (`bench::export`).
    pub export_results: usize,
}

impl MediaCounts {
    /// What the figures are measured with.
    pub const FULL: MediaCounts = MediaCounts {
        small_uploads: 200,
        large_uploads: 20,
        burst: 50,
        prompts: 4000,
        paced_prompts: 2000,
        results: 40,
        export_results: 10_000,
    };
    /// A tenth, to see that every figure works (`--media-quick`).
    pub const QUICK: MediaCounts = MediaCounts {
        small_uploads: 8,
        large_uploads: 2,
        burst: 6,
        prompts: 40,
        paced_prompts: 40,
        results: 4,
        export_results: 500,
    };
}

/// What the measurement gave.
#[derive(Debug, Clone, Default)]
pub struct MediaFigures {
    pub photo_workers: usize,
    pub cpu_ms_small: f64,
    pub cpu_ms_large: f64,
    pub small_per_s: f64,
    pub rss_before_kib: u64,
    pub rss_peak_kib: u64,
    /// Of the burst: stored, and refused 503 (the pool was full).
    pub burst_stored: usize,
    pub burst_refused: usize,
    pub keep_ms_mean: f64,
    pub keep_results: u64,
    pub display_bytes_per_1000: u64,
    pub full_bytes_per_1000: u64,
    pub p99_alone_ms: f64,
    pub p99_burst_ms: f64,
    /// The same at [`PACED_RATE`]: the 202 a guest waits for at an event,
    /// where submissions come at a rate, not as fast as the server answers.
    pub p99_paced_alone_ms: f64,
    pub p99_paced_burst_ms: f64,
    /// The server's SQLite commits during each of the four timed sets
    /// (flat out alone, in a burst, paced alone, in a burst), from a
    /// scrape before the set to one 1.1 s after it (the sagas it started
    /// go on meanwhile): a commit that waits long for the disk holds up
    /// every 202 queued behind it, so a p99 moved by a disk's stall says
    /// so here.
    pub commits: [CommitFigures; 4],
    /// The export's figures (measured on a server of its own).
    pub export: Option<super::export::ExportFigures>,
}

/// The server's SQLite group commits during one timed set, from its
/// `stagehand_sqlite_commit_seconds` histogram.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommitFigures {
    pub commits: u64,
    /// Those that took more than [`SLOW_COMMIT_LE`] seconds.
    pub slow: u64,
}

/// A commit slower than this (one of the histogram's bucket bounds) is
/// counted as slow: at 200 submissions/s a 50 ms stall holds up ten.
pub const SLOW_COMMIT_LE: &str = "0.05";

/// Runs the measurement; Err says what failed.
pub(super) async fn run(
    builds: Builds<'_>,
    dir: &Path,
    server_args: &[String],
    counts: MediaCounts,
) -> Result<MediaFigures, String> {
    let stack = load::sqlite_stack(builds, dir, server_args, "media", 64).await?;
    let small = Arc::new(photo_jpeg(1500, 1000));
    let large = Arc::new(photo_jpeg(4000, 3000));
    let mut figures = MediaFigures {
        photo_workers: photo_workers(server_args),
        ..MediaFigures::default()
    };
    let pid = stack.server.child.id();
    let photo_booth = experience(&stack, "photo").await?;
    eprintln!(
        "  media: {} uploads of a 1.5 MP JPEG ({} KB)",
        counts.small_uploads,
        small.len() / 1024
    );
    let (cpu_ms, per_s) =
        timed_uploads(&stack, &photo_booth, small.clone(), counts.small_uploads, 4).await?;
    (figures.cpu_ms_small, figures.small_per_s) = (cpu_ms, per_s);
    eprintln!(
        "  media: {} uploads of a 12 MP JPEG ({} KB)",
        counts.large_uploads,
        large.len() / 1024
    );
    figures.cpu_ms_large =
        timed_uploads(&stack, &photo_booth, large.clone(), counts.large_uploads, 2)
            .await?
            .0;
    figures.rss_before_kib = status_kib(pid, "VmRSS")?;
    let burst_sessions = sessions(&stack, &photo_booth, counts.burst).await?;
    let burst = uploads(&stack, burst_sessions, large.clone(), counts.burst).await?;
    figures.rss_peak_kib = status_kib(pid, "VmHWM")?;
    figures.burst_stored = burst.iter().filter(|s| **s == StatusCode::CREATED).count();
    figures.burst_refused = burst
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    display_bytes(&stack, &photo_booth, &small, counts.results, &mut figures).await?;
    let prompt_booth = experience(&stack, "prompt").await?;
    let flat_out = Prompts::FlatOut(counts.prompts);
    let paced = Prompts::Paced(counts.paced_prompts);
    let burst = Some((&photo_booth, large));
    (figures.p99_alone_ms, figures.commits[0]) =
        prompt_p99(&stack, &prompt_booth, flat_out, None).await?;
    (figures.p99_burst_ms, figures.commits[1]) =
        prompt_p99(&stack, &prompt_booth, flat_out, burst.clone()).await?;
    (figures.p99_paced_alone_ms, figures.commits[2]) =
        prompt_p99(&stack, &prompt_booth, paced, None).await?;
    (figures.p99_paced_burst_ms, figures.commits[3]) =
        prompt_p99(&stack, &prompt_booth, paced, burst).await?;
    Ok(figures)
}

/// The server's photo workers: `--photo-workers N` among the server's
/// flags, else its default (one fewer than the cores, at least one).
fn photo_workers(server_args: &[String]) -> usize {
    let flags: Vec<&str> = server_args
        .iter()
        .flat_map(|a| a.split_whitespace())
        .collect();
    flags
        .windows(2)
        .find(|pair| pair[0] == "--photo-workers")
        .and_then(|pair| pair[1].parse().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |cores| cores.get().saturating_sub(1).max(1))
        })
}

/// Prompt-only submissions per second in the paced figures.
pub const PACED_RATE: f64 = 200.0;

/// How the timed prompt-only submissions come.
#[derive(Debug, Clone, Copy)]
enum Prompts {
    /// This many, 8 at a time, each as soon as the last is answered.
    FlatOut(usize),
    /// This many, submission `i` due `i / PACED_RATE` s after the first.
    Paced(usize),
}

/// A photo-like JPEG (smooth light, texture and edges, so it compresses
/// like a photo) of `width` × `height`.
pub fn photo_jpeg(width: u32, height: u32) -> Vec<u8> {
    let picture = image::RgbImage::from_fn(width, height, |x, y| {
        let noise = ((x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503)) >> 13) % 24;
        let r = (x * 255 / width) as u8;
        let g = (y * 255 / height) as u8;
        let b = (((x / 40 + y / 40) % 2) * 120) as u8;
        image::Rgb([
            r.saturating_add(noise as u8),
            g.saturating_add(noise as u8 / 2),
            b.saturating_add(noise as u8),
        ])
    });
    let mut out = Vec::new();
    let mut encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90);
    // A picture made here is always encodable.
    encoder.encode_image(&picture).ok();
    out
}

/// An experience with `input` (`photo` or `prompt`) and one terminal.
struct Booth {
    slug: String,
    terminal: String,
}

async fn experience(stack: &Stack, input: &str) -> Result<Booth, String> {
    let body =
        json!({"title": "Media bench", "kind": "image", "input": input, "max_in_flight": 1000});
    let (slug, terminals) =
        load::create_terminals(&stack.client, &stack.base, &stack.operator, body, 1).await?;
    let terminal = terminals
        .into_iter()
        .next()
        .map(|t| t.id)
        .ok_or("no terminal was made")?;
    Ok(Booth { slug, terminal })
}

async fn sessions(stack: &Stack, booth: &Booth, n: usize) -> Result<Vec<Session>, String> {
    let ids = vec![booth.terminal.clone()];
    let made = Arc::new(AtomicUsize::new(0));
    load::create_sessions(&stack.client, &stack.base, &booth.slug, ids, n, 16, made).await
}

/// Uploads `photo` once for each of `sessions`, `concurrency` at a time:
/// the status of each.
async fn uploads(
    stack: &Stack,
    sessions: Vec<Session>,
    photo: Arc<Vec<u8>>,
    concurrency: usize,
) -> Result<Vec<StatusCode>, String> {
    let n = sessions.len();
    let sessions = Arc::new(sessions);
    let (client, base) = (stack.client.clone(), stack.base.clone());
    let answers = load::in_workers(n, concurrency, move |i| {
        let (client, base, photo, sessions) = (
            client.clone(),
            base.clone(),
            photo.clone(),
            sessions.clone(),
        );
        async move {
            upload(&client, &base, &sessions[i], photo.to_vec())
                .await
                .map(|(status, _)| status)
        }
    })
    .await;
    answers.into_iter().collect()
}

pub(super) async fn upload(
    client: &reqwest::Client,
    base: &str,
    session: &Session,
    photo: Vec<u8>,
) -> Result<(StatusCode, Value), String> {
    let resp = client
        .post(format!("{base}/api/sessions/{}/photo", session.id))
        .bearer_auth(&session.token)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .body(photo)
        .send()
        .await
        .map_err(|e| format!("upload: {}", load::with_causes(&e)))?;
    let status = resp.status();
    Ok((status, resp.json().await.unwrap_or(Value::Null)))
}

/// The server's CPU-ms per upload and uploads per second, for `n` uploads
/// `concurrency` at a time (all must be stored).
async fn timed_uploads(
    stack: &Stack,
    booth: &Booth,
    photo: Arc<Vec<u8>>,
    n: usize,
    concurrency: usize,
) -> Result<(f64, f64), String> {
    let pid = stack.server.child.id();
    let sessions = sessions(stack, booth, n).await?;
    let before = super::cpu::process_ticks(&pid.to_string());
    let started = Instant::now();
    let answers = uploads(stack, sessions, photo, concurrency).await?;
    let took = started.elapsed();
    let ticks = super::cpu::process_ticks(&pid.to_string()) - before;
    let refused = answers
        .iter()
        .filter(|s| **s != StatusCode::CREATED)
        .count();
    if refused > 0 {
        return Err(format!(
            "{refused} of {n} uploads were not stored: {:?}",
            answers.iter().find(|s| **s != StatusCode::CREATED)
        ));
    }
    // The sessions were made before the timed span: only uploads count.
    Ok((
        ticks as f64 * 10.0 / n as f64,
        n as f64 / took.as_secs_f64(),
    ))
}

/// Runs `results` photo sagas to their end and sums what a display
/// downloads (each result's thumbnail, else its file) against the full
/// files; reads the keep stage's mean from the server's metrics.
async fn display_bytes(
    stack: &Stack,
    booth: &Booth,
    photo: &[u8],
    results: usize,
    figures: &mut MediaFigures,
) -> Result<(), String> {
    let sessions = sessions(stack, booth, results).await?;
    for session in &sessions {
        let (status, body) = upload(&stack.client, &stack.base, session, photo.to_vec()).await?;
        if status != StatusCode::CREATED {
            return Err(format!("upload for the results: {status} {body}"));
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
    let (mut shown, mut full) = (0u64, 0u64);
    for session in &sessions {
        let content = completed_content(stack, session).await?;
        let url = content["url"].as_str().unwrap_or_default();
        let thumb = content["thumb_url"].as_str().unwrap_or(url);
        full += fetched_bytes(stack, url).await?;
        shown += fetched_bytes(stack, thumb).await?;
    }
    figures.display_bytes_per_1000 = shown * 1000 / results as u64;
    figures.full_bytes_per_1000 = full * 1000 / results as u64;
    let metrics = super::cpu::metrics_text(&stack.client, &stack.base, &stack.operator).await?;
    let keep = crate::metric_names::KEEP_DURATION;
    let (sum, count) = (
        metric(&metrics, &format!("{keep}_sum")),
        metric(&metrics, &format!("{keep}_count")),
    );
    figures.keep_results = count as u64;
    figures.keep_ms_mean = if count > 0.0 {
        sum * 1000.0 / count
    } else {
        f64::NAN
    };
    Ok(())
}

/// The value of the first sample whose line starts with `series` (a name,
/// with its labels when it has any); 0 when there is none.
fn metric(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// The commit histogram's count, and its count up to [`SLOW_COMMIT_LE`],
/// read after [`SCRAPE_REFRESH`](super::cpu::SCRAPE_REFRESH) so that the
/// server renders them anew rather than serving its last scrape's text.
/// A server without the histogram (a build before it) gives 0 of 0; one
/// whose buckets lack that bound is an error, not every commit "slow".
async fn commit_counts(stack: &Stack) -> Result<(f64, f64), String> {
    tokio::time::sleep(super::cpu::SCRAPE_REFRESH).await;
    let metrics = super::cpu::metrics_text(&stack.client, &stack.base, &stack.operator).await?;
    let commit = crate::metric_names::SQLITE_COMMIT;
    let bound = format!("{commit}_bucket{{le=\"{SLOW_COMMIT_LE}\"}}");
    let count = metric(&metrics, &format!("{commit}_count"));
    if count > 0.0 && !metrics.lines().any(|l| l.starts_with(&bound)) {
        return Err(format!("the server's metrics have no {bound}"));
    }
    Ok((count, metric(&metrics, &bound)))
}

/// The first content item of `session` once it completed (30 s at most).
pub(super) async fn completed_content(stack: &Stack, session: &Session) -> Result<Value, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
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
        match body["status"].as_str() {
            Some("COMPLETED") => return Ok(body["result"]["content"][0].clone()),
            Some("ABORTED") => return Err(format!("a photo saga aborted: {body}")),
            _ if Instant::now() > deadline => {
                return Err(format!("a photo saga did not complete: {body}"))
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn fetched_bytes(stack: &Stack, path: &str) -> Result<u64, String> {
    let bytes = stack
        .client
        .get(format!("{}{path}", stack.base))
        .send()
        .await
        .map_err(|e| format!("GET {path}: {e}"))?
        .bytes()
        .await
        .map_err(|e| format!("GET {path}: {e}"))?;
    Ok(bytes.len() as u64)
}

/// The 202's p99 (ms) of prompt-only submissions, from POST to 202; with
/// `burst`, while 12 MP uploads to that experience run 8 at a time. With
/// it, the server's SQLite commits during the set.
async fn prompt_p99(
    stack: &Stack,
    booth: &Booth,
    prompts: Prompts,
    burst: Option<(&Booth, Arc<Vec<u8>>)>,
) -> Result<(f64, CommitFigures), String> {
    let (prompts, concurrency, pace) = match prompts {
        Prompts::FlatOut(n) => (n, 8, None),
        // Enough senders that none is late while the others wait.
        Prompts::Paced(n) => (n, 64, Some(PACED_RATE)),
    };
    let sessions = Arc::new(sessions(stack, booth, prompts).await?);
    let uploader = match burst {
        Some((photo_booth, photo)) => {
            let upload_sessions = sessions_for_burst(stack, photo_booth).await?;
            Some(Burst::start(stack.base.clone(), upload_sessions, photo)?)
        }
        None => None,
    };
    let (client, base) = (stack.client.clone(), stack.base.clone());
    let commits_before = commit_counts(stack).await?;
    let t0 = Instant::now();
    let timings = load::in_workers(prompts, concurrency, move |i| {
        let (client, base, sessions) = (client.clone(), base.clone(), sessions.clone());
        async move {
            if let Some(rate) = pace {
                tokio::time::sleep_until((t0 + Duration::from_secs_f64(i as f64 / rate)).into())
                    .await;
            }
            let started = Instant::now();
            load::submit(
                &client,
                &base,
                &sessions[i],
                &json!({"prompt": format!("bench {i}")}),
            )
            .await
            .map_err(|e| e.to_string())?;
            Ok::<f64, String>(load::ms(started.elapsed()))
        }
    })
    .await;
    if let Some(burst) = uploader {
        burst.finish().await?;
    }
    let commits_after = commit_counts(stack).await?;
    let mut timings = timings.into_iter().collect::<Result<Vec<f64>, String>>()?;
    let commits = commits_after.0 - commits_before.0;
    let fast = commits_after.1 - commits_before.1;
    Ok((
        load::percentile(&mut timings, 0.99),
        CommitFigures {
            commits: commits as u64,
            slow: (commits - fast).max(0.0) as u64,
        },
    ))
}

/// 12 MP uploads, 8 at a time, until finished: on a thread of its own,
/// with its own runtime and connections. On the timed client's thread,
/// pushing eight 3 MB bodies into loopback (whose receiving side runs in
/// the sender's thread) held that thread up to 26 ms, and every 202
/// arriving meanwhile was timed that much late: the client's delay, not
/// the server's.
struct Burst {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<(), String>>,
}

impl Burst {
    fn start(base: String, sessions: Vec<Session>, photo: Arc<Vec<u8>>) -> Result<Burst, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("bench-burst".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("the burst's runtime: {e}"))?;
                runtime.block_on(async move {
                    let client = load::http_client(8)?;
                    let mut i = 0usize;
                    while !stopped.load(Ordering::Relaxed) {
                        let round = (0..8).map(|k| {
                            let session = &sessions[(i + k) % sessions.len()];
                            upload(&client, &base, session, photo.to_vec())
                        });
                        futures_util::future::join_all(round).await;
                        i += 8;
                    }
                    Ok(())
                })
            })
            .map_err(|e| format!("the burst's thread: {e}"))?;
        Ok(Burst { stop, thread })
    }

    /// Stops after the round under way.
    async fn finish(self) -> Result<(), String> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .map_err(|e| format!("the burst: {e}"))?
            .map_err(|_| "the burst's thread panicked".to_owned())?
    }
}

async fn sessions_for_burst(stack: &Stack, booth: &Booth) -> Result<Vec<Session>, String> {
    sessions(stack, booth, 64).await
}
