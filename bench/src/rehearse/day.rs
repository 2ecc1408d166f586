//! The day of `stagehand rehearse`, stage by stage: the setup (an
//! experience, its terminals, the participants' sessions), the displays,
//! the samplers, the timed submissions, the wait for every frame, the
//! delivery check and the figures of the [`Day`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use indicatif::ProgressBar;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::report::{Latency, Memory, Outcomes, PgActivity, Reads};
use super::verdict::{self, BurstCapacity, Capacity};
use super::{
    ai_job_totals, ended_at_ms, is_rejected, progress_bar, sample_pg, score, show_progress,
    watch_operators, Day, JobTotals, Live, RehearseArgs, Target, CONNECTING,
};
use crate::load::{self, DisplayLog, ReadLog, Session, Terminal};
use crate::sockets;

/// What the day's stages share: the server, the experience the day is
/// played on and the participants' sessions.
struct Venue {
    client: reqwest::Client,
    base: String,
    operator: String,
    slug: String,
    sessions: Arc<Vec<Session>>,
}

/// The embedded server's pid and its RSS (KiB) before and with the
/// displays connected.
type RssReads = (u32, u64, u64);

/// One submission as sent.
struct Sent {
    start: Instant,
    end: Instant,
    outcome: Result<(), load::Refused>,
}

/// The samplers running through the day, and the progress bar.
struct Samplers {
    operators: Option<JoinHandle<Vec<String>>>,
    pg: Option<JoinHandle<PgActivity>>,
    reader: JoinHandle<ReadLog>,
    bar: ProgressBar,
    progress: JoinHandle<()>,
}

/// What the displays, the unrelated reader and `pg_stat_activity` showed.
struct Watched {
    logs: Vec<DisplayLog>,
    read_log: ReadLog,
    pg: PgActivity,
}

/// Replays the day against `target`: setup, displays, samplers, the
/// submissions on `schedule`, every frame (or the deadline), the delivery
/// check, then the figures.
pub(super) async fn day(
    args: &RehearseArgs,
    target: &mut Target,
    schedule: &[Duration],
    postgres: Option<&str>,
) -> Result<Day, String> {
    let n = schedule.len();
    let mut notes = Vec::new();
    let (venue, terminals) = set_up(args, target, n).await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let live = Arc::new(Live::default());
    let (displays, rss) =
        connect_displays(&venue, &terminals, target.server_pid(), &live, &stop_rx).await?;
    let samplers = start_samplers(args, &venue, n, postgres, &live, &stop_rx)?;

    // The server's AI job totals before the day (a remote server may have
    // run jobs before).
    let jobs_before = ai_job_totals(&venue.client, &venue.base, &venue.operator).await;
    let anchor = (Instant::now(), SystemTime::now());
    let sent = submit_all(args, &venue, schedule, &live).await;
    let accepted_n = live.accepted.load(Ordering::Relaxed);
    let timed_out = await_frames(target, &live, accepted_n, args.deadline, &mut notes).await;
    let jobs_after = ai_job_totals(&venue.client, &venue.base, &venue.operator).await;
    let _ = stop_tx.send(true);
    let watched = samplers.collect(args, displays, &mut notes).await?;
    let sim_max_concurrent = simulator_peak(target, &venue.client).await?;
    let memory = rss.map(|(pid, before, after)| Memory {
        rss_before_kib: before,
        rss_after_kib: after,
        sockets: args.terminals,
        peak_kib: sockets::status_kib(pid, "VmHWM").ok(),
    });
    let (accepted, violations) =
        check_delivery(args, &venue, &sent, &watched.logs, timed_out).await;
    if !watched.read_log.failures.is_empty() {
        let what = format!("GET /api/experiences/{}", venue.slug);
        notes.extend(watched.read_log.problems(&what));
    }
    // When each session's end was recorded, for the push latency.
    let ended_at = ended_at_ms(&venue.client, &venue.base, &accepted).await;

    // Figures.
    let mut tally = tally(&venue.sessions, &sent, &watched.logs, &ended_at, anchor);
    let outcomes = Outcomes {
        participants: n,
        accepted: accepted_n,
        injected_rejections: (0..n).filter(|&i| is_rejected(i, args.reject_rate)).count(),
        ..tally.outcomes
    };
    let span = Span::of(&sent);
    let arrival_per_s = span.arrival_per_s(args.burst, n);
    let jobs = ai_jobs(args, jobs_before, jobs_after, &mut notes);
    let (capacity, burst_capacity) = capacities(args, arrival_per_s, jobs, accepted_n);
    let (depth_over_time, depth_growth_per_s) = queue_depths(&live, &span, arrival_per_s);
    let reconnects: usize = watched.logs.iter().map(|l| l.reconnects).sum();
    if reconnects > 0 {
        notes.push(format!("display reconnects: {reconnects}"));
    }
    let live_peak = |v: &AtomicI64| {
        let x = v.load(Ordering::Relaxed);
        (live.stats_frames.load(Ordering::Relaxed) > 0).then_some(x)
    };
    Ok(Day {
        accepted_per_s: span.rate(accepted_n, span.last_accepted),
        completed_per_s: span.rate(outcomes.completed, tally.last_completion),
        outcomes,
        submit_ms: Latency::of(&mut tally.submit_ms),
        submit_to_frame_ms: Latency::of(&mut tally.to_frame_ms),
        push_ms: Latency::of(&mut tally.push_ms),
        queue_depth_peak: live_peak(&live.queue_depth_peak),
        ai_in_flight_peak: live_peak(&live.in_flight_peak),
        sim_max_concurrent,
        stats_frames: live.stats_frames.load(Ordering::Relaxed),
        pg: watched.pg,
        reads: reads_of(&watched.read_log),
        memory,
        notes,
        violations,
        depth_over_time,
        depth_growth_per_s,
        capacity,
        burst_capacity,
    })
}

/// Setup, not timed: the experience (a new one, or `--experience`), its
/// terminals and one session per participant.
async fn set_up(
    args: &RehearseArgs,
    target: &Target,
    n: usize,
) -> Result<(Venue, Vec<Terminal>), String> {
    let client = target.client().clone();
    let base = target.base().to_owned();
    let operator = target.operator().to_owned();
    eprintln!(
        "rehearse: setup: an experience (max_in_flight {}, ai_calls {}), {} terminal(s), {n} \
         session(s)",
        args.max_in_flight, args.ai_calls, args.terminals
    );
    let (slug, terminals) = match &args.experience {
        Some(slug) => {
            let terminals =
                load::terminals_of(&client, &base, &operator, slug, args.terminals).await?;
            (slug.clone(), terminals)
        }
        None => {
            let experience = json!({
                "title": "Rehearsal",
                "kind": "image",
                "max_in_flight": args.max_in_flight,
                "ai_calls": args.ai_calls,
            });
            load::create_terminals(&client, &base, &operator, experience, args.terminals).await?
        }
    };
    let sessions = load::create_sessions(
        &client,
        &base,
        &slug,
        terminals.iter().map(|t| t.id.clone()).collect(),
        n,
        args.concurrency,
        Arc::default(),
    )
    .await
    .map_err(|e| {
        if e.contains("429") {
            format!(
                "{e}\n  (the server limits session creations per address: --session-rate-limit)"
            )
        } else {
            e
        }
    })?;
    let venue = Venue {
        client,
        base,
        operator,
        slug,
        sessions: Arc::new(sessions),
    };
    Ok((venue, terminals))
}

/// Connects one display per terminal, each watching for its sessions'
/// frames until `stop`, with the embedded server's RSS read before and
/// after.
async fn connect_displays(
    venue: &Venue,
    terminals: &[Terminal],
    pid: Option<u32>,
    live: &Live,
    stop: &watch::Receiver<bool>,
) -> Result<(Vec<JoinHandle<DisplayLog>>, Option<RssReads>), String> {
    let rss_before = match pid {
        Some(pid) => Some(sockets::median(&sockets::rss_reads(pid).await?)),
        None => None,
    };
    eprintln!("rehearse: connecting {} display(s)", terminals.len());
    let urls: Arc<Vec<String>> = Arc::new(
        terminals
            .iter()
            .map(|t| load::display_url(&venue.base, t))
            .collect(),
    );
    let connected = {
        let urls = urls.clone();
        load::in_workers(terminals.len(), CONNECTING, move |t| {
            let url = urls[t].clone();
            async move {
                load::connect_display(&url, 0)
                    .await
                    .map_err(|e| format!("display {t}: {e}"))
            }
        })
        .await
    };
    let mut displays = Vec::new();
    for (t, ws) in connected.into_iter().enumerate() {
        let expected: HashSet<String> = venue
            .sessions
            .iter()
            .filter(|s| s.terminal == t)
            .map(|s| s.id.clone())
            .collect();
        displays.push(tokio::spawn(load::display(
            urls[t].clone(),
            ws?,
            expected,
            live.finished.clone(),
            stop.clone(),
        )));
    }
    let rss = match (pid, rss_before) {
        (Some(pid), Some(before)) => {
            let after = sockets::median(&sockets::rss_reads(pid).await?);
            Some((pid, before, after))
        }
        _ => None,
    };
    Ok((displays, rss))
}

/// Starts the samplers until `stop`: the operators' stats socket (unless
/// `--no-operator-stats`), `pg_stat_activity` (PostgreSQL), the unrelated
/// reader, and the progress bar.
fn start_samplers(
    args: &RehearseArgs,
    venue: &Venue,
    n: usize,
    postgres: Option<&str>,
    live: &Arc<Live>,
    stop: &watch::Receiver<bool>,
) -> Result<Samplers, String> {
    let (base, slug) = (&venue.base, &venue.slug);
    let operators = (!args.no_operator_stats).then(|| {
        tokio::spawn(watch_operators(
            format!(
                "{}/ws/operators?token={}",
                load::ws_base(base),
                venue.operator
            ),
            slug.clone(),
            live.clone(),
            stop.clone(),
        ))
    });
    let pg = postgres.map(|url| tokio::spawn(sample_pg(url.to_owned(), stop.clone())));
    let reader = tokio::spawn(load::unrelated_reads(
        load::read_client()?,
        format!("{base}/api/experiences/{slug}"),
        |v| v["slug"].is_string(),
        usize::MAX,
        Arc::default(),
        Arc::default(),
        stop.clone(),
    ));
    let bar = progress_bar(n);
    let progress = tokio::spawn(show_progress(
        bar.clone(),
        n,
        args.max_in_flight,
        live.clone(),
    ));
    Ok(Samplers {
        operators,
        pg,
        reader,
        bar,
        progress,
    })
}

/// The timed day: participant `i` submits at `schedule[i]` (from 20 ms
/// from now), `--concurrency` at a time, with the reject word when
/// [`is_rejected`]; counted in `live`.
async fn submit_all(
    args: &RehearseArgs,
    venue: &Venue,
    schedule: &[Duration],
    live: &Arc<Live>,
) -> Vec<Sent> {
    let t0 = Instant::now() + Duration::from_millis(20);
    let (client, base, sessions, live) = (
        venue.client.clone(),
        venue.base.clone(),
        venue.sessions.clone(),
        live.clone(),
    );
    let schedule: Arc<Vec<Duration>> = Arc::new(schedule.to_vec());
    let word = args.reject_word.clone();
    let reject_rate = args.reject_rate;
    load::in_workers(schedule.len(), args.concurrency, move |i| {
        let (client, base, sessions, live, schedule, word) = (
            client.clone(),
            base.clone(),
            sessions.clone(),
            live.clone(),
            schedule.clone(),
            word.clone(),
        );
        async move {
            tokio::time::sleep_until((t0 + schedule[i]).into()).await;
            let prompt = if is_rejected(i, reject_rate) {
                format!("rehearsal prompt {i}, {word}")
            } else {
                format!("rehearsal prompt {i}")
            };
            let body = json!({"prompt": prompt, "score": score(i)});
            let start = Instant::now();
            let outcome = load::submit(&client, &base, &sessions[i], &body).await;
            let end = Instant::now();
            live.submitted.fetch_add(1, Ordering::Relaxed);
            if outcome.is_ok() {
                live.accepted.fetch_add(1, Ordering::Relaxed);
            }
            Sent {
                start,
                end,
                outcome,
            }
        }
    })
    .await
}

/// Waits for every accepted session's frame, until `deadline` from now or
/// the embedded server's exit (a note); true when it stopped waiting
/// before every frame came.
async fn await_frames(
    target: &mut Target,
    live: &Live,
    accepted_n: usize,
    deadline: Duration,
    notes: &mut Vec<String>,
) -> bool {
    let deadline = Instant::now() + deadline;
    while live.finished.load(Ordering::Relaxed) < accepted_n {
        if Instant::now() > deadline {
            return true;
        }
        if let Err(e) = target.alive() {
            notes.push(e);
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

impl Samplers {
    /// Once the day is stopped: clears the progress bar and collects the
    /// displays' logs, the reader's, the operators' socket's problems
    /// (into `notes`) and `pg_stat_activity`'s peaks.
    async fn collect(
        self,
        args: &RehearseArgs,
        displays: Vec<JoinHandle<DisplayLog>>,
        notes: &mut Vec<String>,
    ) -> Result<Watched, String> {
        self.progress.abort();
        self.bar.finish_and_clear();
        let mut logs: Vec<DisplayLog> = Vec::new();
        for d in displays {
            logs.push(d.await.map_err(|e| format!("display task: {e}"))?);
        }
        let read_log = self.reader.await.map_err(|e| format!("reader task: {e}"))?;
        let operator_problems = match self.operators {
            Some(task) => task.await.map_err(|e| format!("operators task: {e}"))?,
            None => vec![
                "no operators' stats socket (--no-operator-stats): no queue depth or AI \
                 concurrency from it"
                    .to_owned(),
            ],
        };
        notes.extend(operator_problems);
        let pg = match self.pg {
            Some(task) => task
                .await
                .map_err(|e| format!("pg_stat_activity task: {e}"))?,
            None => PgActivity::NotSampled(if args.url.is_some() {
                "n/a (no PostgreSQL --database-url)".into()
            } else {
                "n/a (SQLite)".into()
            }),
        };
        Ok(Watched { logs, read_log, pg })
    }
}

/// The embedded simulator's own count of jobs at once (None: remote).
async fn simulator_peak(target: &Target, client: &reqwest::Client) -> Result<Option<u64>, String> {
    match target {
        Target::Embedded { stack, .. } => {
            let stats: Value = client
                .get(format!("{}/v1/stats", stack.sim_url))
                .send()
                .await
                .map_err(|e| format!("simulator stats: {e}"))?
                .json()
                .await
                .map_err(|e| format!("simulator stats: {e}"))?;
            Ok(stats["max_concurrent_jobs"].as_u64())
        }
        Target::Remote { .. } => Ok(None),
    }
}

/// Correctness: every accepted session exactly once, at its terminal, in
/// seq order, and the server's view of the missing ones. Returns the
/// accepted sessions and the violations.
async fn check_delivery(
    args: &RehearseArgs,
    venue: &Venue,
    sent: &[Sent],
    logs: &[DisplayLog],
    timed_out: bool,
) -> (Vec<Session>, Vec<String>) {
    let accepted: Vec<Session> = venue
        .sessions
        .iter()
        .zip(sent)
        .filter(|(_, s)| s.outcome.is_ok())
        .map(|(x, _)| x.clone())
        .collect();
    let index_of: HashMap<&str, usize> = accepted
        .iter()
        .enumerate()
        .map(|(i, s)| (s.id.as_str(), i))
        .collect();
    let mut violations = load::check(&accepted, &index_of, logs, false, timed_out, args.deadline);
    let missing = load::missing_sessions(&accepted, logs);
    if !missing.is_empty() {
        violations.push(format!(
            "  the server's view of {} missing session(s), status/step: {}",
            missing.len().min(200),
            load::lookup(&venue.client, &venue.base, &venue.operator, &missing).await
        ));
    }
    (accepted, violations)
}

/// The sessions' outcomes (besides the counts of participants, accepted
/// and injected rejections) and latencies (ms).
struct Tally {
    outcomes: Outcomes,
    submit_ms: Vec<f64>,
    to_frame_ms: Vec<f64>,
    push_ms: Vec<f64>,
    last_completion: Option<Instant>,
}

/// Each participant's outcome: refused (by status), lost (no frame), or
/// its first frame's kind and reason; its latencies, the push latency from
/// its recorded end (`ended_at`) to the frame on the wall clock of
/// `anchor`.
fn tally(
    sessions: &[Session],
    sent: &[Sent],
    logs: &[DisplayLog],
    ended_at: &HashMap<String, i64>,
    anchor: (Instant, SystemTime),
) -> Tally {
    let wall_ms = |at: Instant| -> f64 {
        let wall = anchor.1 + at.saturating_duration_since(anchor.0);
        wall.duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    let mut frame_of: HashMap<&str, &load::Frame> = HashMap::new();
    for log in logs {
        for f in &log.frames {
            frame_of.entry(f.session_id.as_str()).or_insert(f);
        }
    }
    let mut t = Tally {
        outcomes: Outcomes::default(),
        submit_ms: Vec::new(),
        to_frame_ms: Vec::new(),
        push_ms: Vec::new(),
        last_completion: None,
    };
    for (session, s) in sessions.iter().zip(sent) {
        if let Err(r) = &s.outcome {
            let key = r
                .status
                .map_or("no answer".to_owned(), |st| st.as_u16().to_string());
            *t.outcomes.refused_by_status.entry(key).or_default() += 1;
            continue;
        }
        t.submit_ms.push(load::ms(s.end - s.start));
        let Some(frame) = frame_of.get(session.id.as_str()) else {
            t.outcomes.lost += 1;
            continue;
        };
        t.to_frame_ms
            .push(load::ms(frame.at.saturating_duration_since(s.end)));
        if let Some(ended) = ended_at.get(session.id.as_str()) {
            t.push_ms.push((wall_ms(frame.at) - *ended as f64).max(0.0));
        }
        match frame.kind.as_str() {
            "session.completed" => {
                t.outcomes.completed += 1;
                t.last_completion = t.last_completion.max(Some(frame.at));
            }
            _ => {
                let reason = frame.reason.clone().unwrap_or_else(|| "UNKNOWN".into());
                if reason == "INPUT_REJECTED" {
                    t.outcomes.rejected += 1;
                }
                *t.outcomes.aborted_by_reason.entry(reason).or_default() += 1;
            }
        }
    }
    t
}

/// When the submissions went out.
struct Span {
    first_start: Instant,
    last_start: Instant,
    /// The last 202's arrival.
    last_accepted: Option<Instant>,
}

impl Span {
    /// The span of `sent` (not empty).
    fn of(sent: &[Sent]) -> Span {
        Span {
            first_start: sent.iter().map(|s| s.start).min().expect("n > 0"),
            last_start: sent.iter().map(|s| s.start).max().expect("n > 0"),
            last_accepted: sent
                .iter()
                .filter(|s| s.outcome.is_ok())
                .map(|s| s.end)
                .max(),
        }
    }

    /// `count` a second from the first start `until` (0 without either).
    fn rate(&self, count: usize, until: Option<Instant>) -> f64 {
        match until {
            Some(t) if count > 0 => count as f64 / load::secs(t - self.first_start),
            _ => 0.0,
        }
    }

    /// Seconds from the first start to `at`.
    fn since_first(&self, at: Instant) -> f64 {
        load::secs(at.saturating_duration_since(self.first_start))
    }

    /// The measured arrival rate of `n` steady arrivals (a burst has none).
    fn arrival_per_s(&self, burst: Option<usize>, n: usize) -> Option<f64> {
        match burst {
            None if n >= 2 && self.last_start > self.first_start => {
                Some((n - 1) as f64 / load::secs(self.last_start - self.first_start))
            }
            _ => None,
        }
    }
}

/// The AI jobs of the day (seconds and count) from the server's totals
/// before and after, with a note when they could not be read or may be
/// one instance's.
fn ai_jobs(
    args: &RehearseArgs,
    before: Result<JobTotals, String>,
    after: Result<JobTotals, String>,
    notes: &mut Vec<String>,
) -> Option<JobTotals> {
    let jobs = match (before, after) {
        (Ok(before), Ok(after)) => Some(after.since(before)),
        (Err(e), _) | (_, Err(e)) => {
            notes.push(format!("no AI job times ({e}): no capacity advice"));
            None
        }
    };
    if args.url.is_some() && jobs.is_some() {
        notes.push(
            "AI job times are those of the instance that answered GET /metrics: with several \
             instances behind --url, one instance's"
                .to_owned(),
        );
    }
    jobs
}

/// What the AI slots need, from what was measured: for steady arrivals
/// (their rate) or for a burst, with the AI jobs' time per participant
/// from the server's own histogram.
fn capacities(
    args: &RehearseArgs,
    arrival_per_s: Option<f64>,
    jobs: Option<JobTotals>,
    accepted_n: usize,
) -> (Option<Capacity>, Option<BurstCapacity>) {
    let capacity = match (arrival_per_s, jobs) {
        (Some(rate), Some(jobs)) if jobs.count > 0.0 && accepted_n > 0 => verdict::capacity(
            rate,
            jobs.count / accepted_n as f64,
            jobs.sum_s / jobs.count,
            args.max_in_flight,
        ),
        _ => None,
    };
    let burst_capacity = match (args.burst, jobs) {
        (Some(_), Some(jobs)) if jobs.count > 0.0 && accepted_n > 0 => verdict::burst_capacity(
            accepted_n,
            jobs.count / accepted_n as f64,
            jobs.sum_s / jobs.count,
            args.max_in_flight,
            args.target_p95,
        ),
        _ => None,
    };
    (capacity, burst_capacity)
}

/// The queue depth from the first arrival, one sample a second at most
/// (the last of each second), and its growth while steady arrivals came.
fn queue_depths(
    live: &Live,
    span: &Span,
    arrival_per_s: Option<f64>,
) -> (Vec<(f64, i64)>, Option<f64>) {
    let depth_samples: Vec<(f64, i64)> = live
        .depth_samples
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(at, _)| *at >= span.first_start)
        .map(|&(at, depth)| (span.since_first(at), depth))
        .collect();
    let depth_growth_per_s = arrival_per_s.and_then(|_| {
        let arriving: Vec<(f64, i64)> = depth_samples
            .iter()
            .copied()
            .filter(|(t, _)| *t <= span.since_first(span.last_start))
            .collect();
        verdict::growth_per_s(&arriving)
    });
    let mut depth_over_time: Vec<(f64, i64)> = Vec::new();
    for &(t, depth) in &depth_samples {
        match depth_over_time.last_mut() {
            Some(last) if last.0.floor() == t.floor() => *last = (t, depth),
            _ => depth_over_time.push((t, depth)),
        }
    }
    (depth_over_time, depth_growth_per_s)
}

/// The unrelated reader's figures.
fn reads_of(read_log: &ReadLog) -> Reads {
    Reads {
        p50_ms: load::percentile(&mut read_log.latencies_ms.clone(), 0.50),
        p99_ms: load::percentile(&mut read_log.latencies_ms.clone(), 0.99),
        count: read_log.count(),
        failed: read_log.failures.len(),
        every_ms: load::READ_EVERY.as_millis() as u64,
    }
}
