//! The printed result: a few header lines (what ran, on what machine), one
//! markdown-style table of the load scenarios (a column per backend, and
//! next to PostgreSQL its ratio to pgbench), what 202-to-frame means, a
//! small table of the memory per idle display socket, and notes on the
//! server logs.

use super::claim::{ClaimCostResult, SizeTiming, SIZES};
use super::load::{Backend, Figures, Load, ScenarioResult};
use super::pgbench::{Pgbench, DESCRIPTION};
use super::sockets::SocketMemoryResult;
use super::PUSH_TERMINALS;

/// What the header says.
pub struct Header<'a> {
    /// When the run started (local time, as printed).
    pub started: String,
    /// `/proc/loadavg`'s 1-minute figure at the start and at the end: other
    /// work on the machine shows in the latencies.
    pub load_start: Option<f64>,
    pub load_end: Option<f64>,
    pub sessions: usize,
    pub concurrency: usize,
    /// Push latency scenarios: sagas and rate.
    pub push: Option<(usize, f64)>,
    /// Flat-out scenarios ran.
    pub flat: bool,
    /// Their terminal counts (`--terminals`).
    pub terminals: &'a [usize],
    pub sync_commit: Option<&'a str>,
    pub pgbench: Option<&'a Pgbench>,
    pub server_args: &'a [String],
    /// `--server-binary`, when the servers were another build.
    pub server_binary: Option<&'a std::path::Path>,
}

/// The lines above the table.
pub fn header(h: &Header) -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = match (h.load_start, h.load_end) {
        (Some(a), Some(b)) => format!(", load average {a:.2} at start, {b:.2} at end"),
        _ => String::new(),
    };
    let mut lines = vec![format!(
        "stagehand bench, {}, {cpus} CPU(s){load}",
        h.started
    )];
    if h.flat {
        lines.push(format!(
            "throughput: {} sagas per scenario, on {} terminal(s), {} submitters flat \
             out, one display WebSocket per terminal, AI simulator at 0 ms",
            h.sessions,
            h.terminals
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(" and on "),
            h.concurrency
        ));
    }
    if let Some((sagas, rate)) = h.push {
        lines.push(format!(
            "push latency: {sagas} sagas paced at {rate}/s on {PUSH_TERMINALS} terminals, one \
             display WebSocket each, AI simulator at 0 ms"
        ));
    }
    let mut pg = Vec::new();
    if let Some(sc) = h.sync_commit {
        pg.push(format!("synchronous_commit={sc}"));
    }
    match h.pgbench {
        Some(Pgbench::Tps(tps)) => pg.push(format!("pgbench ({DESCRIPTION}): {tps:.0} tps")),
        Some(Pgbench::NotInstalled) => pg.push("pgbench not on PATH, so no ratios".into()),
        Some(Pgbench::Failed(e)) => pg.push(format!("pgbench FAILED ({e})")),
        None => {}
    }
    if !pg.is_empty() {
        lines.push(format!("PostgreSQL: {}", pg.join("; ")));
    }
    let env: Vec<String> = super::load::server_env()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    if !env.is_empty() || !h.server_args.is_empty() {
        let mut serve = env.clone();
        serve.push("stagehand serve ...".into());
        serve.extend(h.server_args.iter().cloned());
        let why = if env.is_empty() {
            ""
        } else {
            " (the simulated crowd is one address)"
        };
        lines.push(format!("every server: {}{why}", serve.join(" ")));
    }
    if let Some(path) = h.server_binary {
        lines.push(format!("servers run by: {}", path.display()));
    }
    lines.push(String::new());
    lines.join("\n")
}

/// One row: its label, which scenario (terminal count, paced or not), how
/// to show it, whether a ratio to pgbench makes sense.
struct Row {
    label: String,
    terminals: usize,
    paced: bool,
    instances: usize,
    show: fn(&Figures) -> String,
    rate: Option<fn(&Figures) -> f64>,
}

impl Row {
    fn of(&self, r: &ScenarioResult) -> bool {
        r.terminals == self.terminals
            && r.load.is_paced() == self.paced
            && r.instances == self.instances
    }
}

/// The rows of one flat-out scenario.
fn flat_rows(terminals: usize, instances: usize) -> Vec<Row> {
    let mut on = if terminals == 1 {
        "1 terminal".to_owned()
    } else {
        format!("{terminals} terminals")
    };
    if instances > 1 {
        on.push_str(&format!(", {instances} instances"));
    }
    let row = |label: &str, show: fn(&Figures) -> String, rate: Option<fn(&Figures) -> f64>| Row {
        label: format!("{label}, {on}"),
        terminals,
        paced: false,
        instances,
        show,
        rate,
    };
    vec![
        row(
            "accepted submissions/s (202s per second)",
            |f| per_s(f.accepted_per_s),
            Some(|f| f.accepted_per_s),
        ),
        row(
            "end-to-end sagas/s (first POST to last frame)",
            |f| per_s(f.sagas_per_s),
            Some(|f| f.sagas_per_s),
        ),
        row(
            "submit latency, POST to 202, p50 / p99 (ms)",
            |f| pair(f.submit_p50_ms, f.submit_p99_ms),
            None,
        ),
        row(
            "unrelated read latency under load, p50 / p99 (ms)",
            |f| pair(f.read_p50_ms, f.read_p99_ms),
            None,
        ),
        row(
            "202-to-frame, p50 / p99 (ms)",
            |f| pair(f.frame_after_202_p50_ms, f.frame_after_202_p99_ms),
            None,
        ),
        row(
            "CPU-ms per saga: server / PostgreSQL / client / AI simulator",
            |f| cpu_cells(&f.per_saga),
            None,
        ),
        row(
            "per saga: server context switches / transactions / statements",
            |f| counts_cells(&f.per_saga),
            None,
        ),
        row(
            "per saga: actor messages / tasks spawned / frames encoded",
            |f| work_cells(&f.per_saga),
            None,
        ),
        row(
            "per saga: lock waits seen / waiting ms (PostgreSQL, sampled)",
            |f| lock_cells(&f.per_saga),
            None,
        ),
    ]
}

/// `waits / waiting ms` per saga (`-` on SQLite, or when not sampled).
fn lock_cells(p: &super::cpu::PerSaga) -> String {
    match p.lock_waits {
        Some(w) => format!("{:.3} / {:.3}", w.waits, w.waiting_ms),
        None => "-".into(),
    }
}

/// `server / PostgreSQL / client / AI simulator` CPU-ms per saga (`-` for
/// PostgreSQL on SQLite).
fn cpu_cells(p: &super::cpu::PerSaga) -> String {
    let pg = p
        .postgres_cpu_ms
        .map(|x| format!("{x:.2}"))
        .unwrap_or_else(|| "-".into());
    format!(
        "{:.2} / {pg} / {:.2} / {:.2}",
        p.server_cpu_ms, p.client_cpu_ms, p.simulator_cpu_ms
    )
}

/// `switches / transactions / statements` per saga (`-` where not known:
/// SQLite, or no pg_stat_statements).
fn counts_cells(p: &super::cpu::PerSaga) -> String {
    let opt = |x: Option<f64>| x.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into());
    format!(
        "{:.1} / {} / {}",
        p.server_switches,
        opt(p.transactions),
        opt(p.statements)
    )
}

/// `actor messages / tasks spawned / frames encoded` per saga, from the
/// server's `/metrics` (`-` where it could not be read).
fn work_cells(p: &super::cpu::PerSaga) -> String {
    let opt = |x: Option<f64>| x.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into());
    format!(
        "{} / {} / {}",
        opt(p.actor_messages),
        opt(p.tasks_spawned),
        opt(p.frames_encoded)
    )
}

/// The table of the load scenarios, and what its terms mean.
pub fn render(results: &[ScenarioResult], pgbench: Option<&Pgbench>) -> String {
    let paced = paced_rate(results);
    let rows = scenario_rows(results, paced);
    let columns = Columns::of(results, pgbench);
    let body: Vec<Vec<String>> = rows.iter().map(|row| columns.cells(results, row)).collect();
    let mut out = vec![markdown(&columns.head(), &body), String::new()];
    out.extend(legend(results, paced));
    out.join("\n")
}

/// The rate of the push latency scenario, when it ran.
fn paced_rate(results: &[ScenarioResult]) -> Option<f64> {
    results.iter().find_map(|r| match r.load {
        Load::Paced(rate) => Some(rate),
        Load::FlatOut => None,
    })
}

/// The rows: those of each flat-out scenario that ran (by terminals, then
/// instances), then the push latency rows when that scenario ran, at
/// `paced` per second.
fn scenario_rows(results: &[ScenarioResult], paced: Option<f64>) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut flat: Vec<(usize, usize)> = results
        .iter()
        .filter(|r| !r.load.is_paced())
        .map(|r| (r.terminals, r.instances))
        .collect();
    flat.sort();
    flat.dedup();
    for (terminals, instances) in flat {
        rows.extend(flat_rows(terminals, instances));
    }
    if let Some(rate) = paced {
        rows.extend(paced_rows(rate));
    }
    rows
}

/// The rows of the push latency scenario, paced at `rate` per second.
fn paced_rows(rate: f64) -> Vec<Row> {
    let on = format!("{PUSH_TERMINALS} terminals paced at {rate}/s");
    let row = |label: &str, show: fn(&Figures) -> String| Row {
        label: format!("{label}, {on}"),
        terminals: PUSH_TERMINALS,
        paced: true,
        instances: 1,
        show,
        rate: None,
    };
    vec![
        row("push latency: 202-to-frame, p50 / p99 (ms)", |f| {
            pair(f.frame_after_202_p50_ms, f.frame_after_202_p99_ms)
        }),
        row("submit latency, POST to 202, p50 / p99 (ms)", |f| {
            pair(f.submit_p50_ms, f.submit_p99_ms)
        }),
        row(
            "CPU-ms per saga: server / PostgreSQL / client / AI simulator",
            |f| cpu_cells(&f.per_saga),
        ),
    ]
}

/// The table's columns after the figure's name: PostgreSQL (and its ratio
/// to pgbench, when pgbench gave a rate) and SQLite, each when a scenario
/// of that backend ran.
struct Columns {
    postgres: bool,
    /// pgbench's transactions per second, for the ratio column.
    tps: Option<f64>,
    sqlite: bool,
}

impl Columns {
    /// The columns `results` fill.
    fn of(results: &[ScenarioResult], pgbench: Option<&Pgbench>) -> Columns {
        let has = |b: Backend| results.iter().any(|r| r.backend == b);
        let postgres = has(Backend::Postgres);
        Columns {
            postgres,
            tps: match pgbench {
                Some(Pgbench::Tps(t)) if postgres => Some(*t),
                _ => None,
            },
            sqlite: has(Backend::Sqlite),
        }
    }

    /// The header row.
    fn head(&self) -> Vec<String> {
        let mut head = vec!["figure".to_owned()];
        if self.postgres {
            head.push("PostgreSQL".into());
            if self.tps.is_some() {
                head.push("PostgreSQL / pgbench tps".into());
            }
        }
        if self.sqlite {
            head.push("SQLite".into());
        }
        head
    }

    /// The cells of `row`: its label, then a figure (or ratio) per column.
    fn cells(&self, results: &[ScenarioResult], row: &Row) -> Vec<String> {
        let mut cells = vec![row.label.clone()];
        if self.postgres {
            cells.push(cell(results, Backend::Postgres, row));
            if let Some(tps) = self.tps {
                cells.push(pgbench_ratio(results, row, tps));
            }
        }
        if self.sqlite {
            cells.push(cell(results, Backend::Sqlite, row));
        }
        cells
    }
}

/// `row`'s figure for `backend`: `FAILED` when its scenario failed, `-`
/// when it did not run.
fn cell(results: &[ScenarioResult], backend: Backend, row: &Row) -> String {
    match results.iter().find(|r| r.backend == backend && row.of(r)) {
        Some(r) => match &r.outcome {
            Ok(f) => (row.show)(f),
            Err(_) => "FAILED".into(),
        },
        None => "-".into(),
    }
}

/// `row`'s PostgreSQL rate divided by pgbench's `tps` (empty when the row
/// is no rate, or its scenario failed or did not run).
fn pgbench_ratio(results: &[ScenarioResult], row: &Row, tps: f64) -> String {
    let ratio = results
        .iter()
        .find(|r| r.backend == Backend::Postgres && row.of(r))
        .and_then(|r| r.outcome.as_ref().ok())
        .and_then(|f| row.rate.map(|get| get(f) / tps));
    ratio.map(|x| format!("{x:.2}")).unwrap_or_default()
}

/// The lines under the table: what 202-to-frame, the unrelated read, the
/// per-saga figures, the lock waits and (when they ran) N instances mean.
fn legend(results: &[ScenarioResult], paced: Option<f64>) -> Vec<String> {
    let mut out = Vec::new();
    out.push(
        "202-to-frame: from this client holding a submission's 202 (the submission and its \
         saga committed)"
            .into(),
    );
    out.push(
        "  to the display of its terminal having read that session's session.completed frame: \
         the saga's"
            .into(),
    );
    out.push(
        "  run (one job on the simulator at 0 ms), the completion's commit and the push.".into(),
    );
    if results.iter().any(|r| !r.load.is_paced()) {
        out.push("  Flat out it includes queueing behind the other sagas.".into());
    }
    if let Some(rate) = paced {
        out.push(format!(
            "  Paced at {rate}/s, well under the ceiling, it is the push latency."
        ));
    }
    out.push(
        "unrelated read: GET /api/experiences/<slug>/ranking?limit=10 every 20 ms by one more \
         client, to its last byte."
            .into(),
    );
    out.push(
        "per saga: from the first submission to the last frame, divided by the sagas; CPU from \
         /proc (PostgreSQL: every postgres process; the AI simulator does the provider's work on the same cores),"
            .into(),
    );
    out.push(
        "  switches: the server's threads' context switches (its wake-ups); transactions from \
         pg_stat_database; statements from pg_stat_statements when loaded.\n  \
         actor messages, tasks spawned and frames encoded: the server's own counters \
         (stagehand_actor_messages_total, stagehand_tasks_spawned_total, stagehand_frames_encoded_total)."
            .into(),
    );
    out.push(format!(
        "lock waits: backends of the scenario's database waiting for a heavyweight lock \
         (pg_stat_activity.wait_event_type = 'Lock', the not-granted rows of pg_locks),\n  \
         sampled every {} ms: waits seen counts a backend newly waiting at a sample (shorter \
         waits are missed), waiting ms sums waiters times the interval.",
        super::cpu::LOCK_SAMPLE_EVERY.as_millis()
    ));
    if results.iter().any(|r| r.instances > 1) {
        out.push(
            "N instances: N servers on the one database, the submitters alternating between \
             them and the display on the first, so most frames cross instances; CPU and \
             counters are their sums."
                .into(),
        );
    }
    out
}

/// The memory per idle display socket: a small table and how it was
/// measured.
pub fn socket_memory(m: &SocketMemoryResult) -> Vec<String> {
    let mut out = Vec::new();
    match &m.outcome {
        Ok(x) => {
            out.push(format!(
                "memory per idle display WebSocket: a server on SQLite, {} displays on {} \
                 terminals, each has read its hello",
                x.sockets, x.terminals
            ));
            out.push(markdown(
                &["figure".into(), "SQLite".into()],
                &[
                    vec![
                        "server VmRSS, no display connected (KiB)".into(),
                        x.rss_idle_kib.to_string(),
                    ],
                    vec![
                        format!(
                            "server VmRSS, {} idle display WebSockets open (KiB)",
                            x.sockets
                        ),
                        x.rss_sockets_kib.to_string(),
                    ],
                    vec![
                        "memory per idle display WebSocket (KiB), the difference / sockets".into(),
                        format!("{:.1}", x.per_socket_kib()),
                    ],
                ],
            ));
            out.push(format!(
                "VmRSS: the median of {} reads {} ms apart, {} s after setup and {} s after the \
                 last socket connected",
                x.reads_idle_kib.len(),
                super::sockets::RSS_EVERY.as_millis(),
                super::sockets::SETTLE.as_secs(),
                super::sockets::SETTLE.as_secs(),
            ));
            out.push(format!(
                "  ({:.1} s to connect them all, {} at a time); each socket stays open, read by \
                 a task of its own.",
                x.connect_s,
                super::sockets::CONNECTING
            ));
        }
        Err(_) => out.push("memory per idle display WebSocket (SQLite): FAILED".into()),
    }
    if let Some(log) = &m.log {
        out.push(format!(
            "server log, memory per idle socket: {} ERROR, {} WARN line(s)",
            log.errors, log.warnings
        ));
        for sample in &log.samples {
            out.push(format!("    {sample}"));
        }
    }
    out
}

/// The claim cost: per backend, one claim round's median and p90 at each
/// queue length, and the ratio of the medians (longest / shortest queue).
pub fn claim_cost(results: &[ClaimCostResult]) -> Vec<String> {
    let mut head = vec!["figure".to_owned()];
    head.extend(results.iter().map(|r| r.backend.name().to_owned()));
    let mut body = Vec::new();
    for (k, queued) in SIZES.iter().enumerate() {
        let mut row = vec![format!(
            "claim round, {} sagas queued, median / p90 (ms)",
            thousands(*queued)
        )];
        for r in results {
            row.push(match &r.outcome {
                Ok(sizes) => sizes.get(k).map_or("-".into(), |s| {
                    format!("{:.2} / {:.2}", s.median_ms(), s.p90_ms())
                }),
                Err(_) => "FAILED".into(),
            });
        }
        body.push(row);
        let mut row = vec![format!(
            "  of which listing the experiences with work, median (ms)"
        )];
        for r in results {
            row.push(match &r.outcome {
                Ok(sizes) => sizes
                    .get(k)
                    .map_or("-".into(), |s| format!("{:.2}", s.list_median_ms())),
                Err(_) => "FAILED".into(),
            });
        }
        body.push(row);
    }
    let mut ratio = vec![format!(
        "ratio of the medians, {} / {} queued",
        thousands(SIZES[SIZES.len() - 1]),
        thousands(SIZES[0])
    )];
    ratio.extend(
        results
            .iter()
            .map(|r| r.ratio().map_or("-".into(), |x| format!("{x:.2}"))),
    );
    body.push(ratio);
    for (k, entries) in SIZES.iter().enumerate() {
        let mut row = vec![format!(
            "rank of a batch of {}, {} ranking entries, median / p90 (ms)",
            super::claim::RANK_BATCH,
            thousands(*entries)
        )];
        for r in results {
            row.push(match &r.outcome {
                Ok(sizes) => sizes.get(k).map_or("-".into(), |s| {
                    format!("{:.2} / {:.2}", s.rank_median_ms(), s.rank_p90_ms())
                }),
                Err(_) => "FAILED".into(),
            });
        }
        body.push(row);
    }
    for (label, figure) in [
        (
            "after another instance's news, read again at most once a second",
            SizeTiming::rank_after_news_median_ms as fn(&SizeTiming) -> f64,
        ),
        (
            "after another instance's news, read again each time",
            SizeTiming::rank_reread_median_ms,
        ),
    ] {
        let entries = SIZES[SIZES.len() - 1];
        let mut row = vec![format!(
            "rank of a batch of {}, {} ranking entries, {label}, median (ms)",
            super::claim::RANK_BATCH,
            thousands(entries)
        )];
        for r in results {
            row.push(match &r.outcome {
                Ok(sizes) => sizes
                    .last()
                    .map_or("-".into(), |s| format!("{:.2}", figure(s))),
                Err(_) => "FAILED".into(),
            });
        }
        body.push(row);
    }
    let mut rank_ratio = vec![format!(
        "ratio of the rank medians, {} / {} entries",
        thousands(SIZES[SIZES.len() - 1]),
        thousands(SIZES[0])
    )];
    rank_ratio.extend(
        results
            .iter()
            .map(|r| r.rank_ratio().map_or("-".into(), |x| format!("{x:.2}"))),
    );
    body.push(rank_ratio);
    let rounds = results
        .iter()
        .find_map(|r| r.outcome.as_ref().ok()?.first().map(|s| s.rounds_ms.len()))
        .unwrap_or(0);
    vec![
        "claim cost against queue length: a fresh database, one experience at cap 5, its \
         AI_PENDING queue (and a tenth as many"
            .into(),
        format!(
            "  COMPLETED sagas beside it); a round = which experiences have work + the claim of \
             5, {rounds} rounds per length, slots given back between rounds;"
        ),
        "  PostgreSQL ANALYZEd after each load (as autovacuum would), SQLite not (the server \
         never analyzes it); the claim's plans are on stderr"
            .into(),
        markdown(&head, &body),
    ]
}

fn thousands(n: i64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Lines under the tables: per scenario, the error and warning counts of
/// the server log, the display reconnects and the number of unrelated reads
/// (or, paced, the rate kept).
pub fn notes(results: &[ScenarioResult]) -> Vec<String> {
    let mut out = Vec::new();
    for r in results {
        if let Some(log) = &r.log {
            let more = match &r.outcome {
                Ok(f) if r.load.is_paced() => format!(
                    "; display reconnects: {}; sent {:.1}/s, at most {} ms behind schedule",
                    f.reconnects,
                    f.sent_per_s,
                    millis(f.behind_schedule_ms),
                ),
                Ok(f) => format!(
                    "; display reconnects: {}; unrelated reads under load: {}",
                    f.reconnects, f.reads
                ),
                Err(_) => String::new(),
            };
            out.push(format!(
                "server log, {}: {} ERROR, {} WARN line(s){more}",
                r.label, log.errors, log.warnings
            ));
            for sample in &log.samples {
                out.push(format!("    {sample}"));
            }
        }
    }
    out
}

/// Pipes, first column left-aligned, the others right-aligned.
pub(super) fn markdown(head: &[String], body: &[Vec<String>]) -> String {
    let width = |i: usize| {
        body.iter()
            .map(|r| r[i].chars().count())
            .chain([head[i].chars().count(), 3])
            .max()
            .unwrap_or(3)
    };
    let widths: Vec<usize> = (0..head.len()).map(width).collect();
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!(" {c:<w$} ", w = widths[i])
                } else {
                    format!(" {c:>w$} ", w = widths[i])
                }
            })
            .collect();
        format!("|{}|", parts.join("|"))
    };
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(i, w)| {
            if i == 0 {
                "-".repeat(w + 2)
            } else {
                format!("{}:", "-".repeat(w + 1))
            }
        })
        .collect();
    let mut out = vec![line(head), format!("|{}|", rule.join("|"))];
    out.extend(body.iter().map(|r| line(r)));
    out.join("\n")
}

fn per_s(x: f64) -> String {
    format!("{x:.0}")
}

fn pair(p50: f64, p99: f64) -> String {
    format!("{} / {}", millis(p50), millis(p99))
}

pub(super) fn millis(x: f64) -> String {
    if x < 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.0}")
    }
}

/// The media figures, one line each.
pub fn media(m: &super::media::MediaFigures) -> Vec<String> {
    let mib = |kib: u64| kib as f64 / 1024.0;
    let mut lines = vec![
        format!(
            "Media (SQLite, photo workers: {}; each figure is the server's):",
            m.photo_workers
        ),
        format!("  CPU per upload, 1.5 MP / 12 MP JPEG (ms)      {:>8.1} / {:.1}", m.cpu_ms_small, m.cpu_ms_large),
        format!("  1.5 MP uploads per second (4 at a time)       {:>8.1}", m.small_per_s),
        format!(
            "  VmRSS before / peak during 50 x 12 MP (MiB)   {:>8.1} / {:.1} ({} stored, {} refused 503)",
            mib(m.rss_before_kib),
            mib(m.rss_peak_kib),
            m.burst_stored,
            m.burst_refused
        ),
        format!("  keep stage per result, mean (ms)              {:>8.2} ({} results)", m.keep_ms_mean, m.keep_results),
        format!(
            "  a display's bytes for 1,000 results (MB)      {:>8.1} (full files: {:.1})",
            m.display_bytes_per_1000 as f64 / 1e6,
            m.full_bytes_per_1000 as f64 / 1e6
        ),
        format!(
            "  202 p99, prompt-only, alone / in a burst (ms) {:>8.1} / {:.1} ({:.2}x)",
            m.p99_alone_ms,
            m.p99_burst_ms,
            m.p99_burst_ms / m.p99_alone_ms
        ),
        format!(
            "  the same, paced at {:.0}/s (ms)               {:>8.1} / {:.1} ({:.2}x)",
            super::media::PACED_RATE,
            m.p99_paced_alone_ms,
            m.p99_paced_burst_ms,
            m.p99_paced_burst_ms / m.p99_paced_alone_ms
        ),
        format!(
            "  SQLite commits over {} ms in those four sets   {}",
            super::media::SLOW_COMMIT_LE.parse::<f64>().map_or(0.0, |s| s * 1000.0),
            m.commits
                .iter()
                .map(|c| format!("{} of {}", c.slow, c.commits))
                .collect::<Vec<_>>()
                .join(" / ")
        ),
    ];
    if let Some(e) = &m.export {
        lines.push(format!(
            "  export of {} results: {:.1} MB in {:.1} s; VmRSS at its start -> peak (MiB):",
            e.results,
            e.zip_bytes as f64 / 1e6,
            e.seconds
        ));
        for (n, start, peak) in &e.runs {
            lines.push(format!(
                "    {n:>6} results                                {:>8.1} -> {:.1} (+{:.1})",
                mib(*start),
                mib(*peak),
                mib(peak.saturating_sub(*start))
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::super::load::{Backend, Figures, Load, ScenarioResult};
    use super::{markdown, render, thousands};

    fn result(instances: usize, sagas_per_s: f64) -> ScenarioResult {
        ScenarioResult {
            backend: Backend::Postgres,
            terminals: 1,
            load: Load::FlatOut,
            instances,
            label: String::new(),
            outcome: Ok(Figures {
                accepted_per_s: sagas_per_s,
                sagas_per_s,
                submit_p50_ms: 1.0,
                submit_p99_ms: 2.0,
                read_p50_ms: 1.0,
                read_p99_ms: 2.0,
                reads: 1,
                frame_after_202_p50_ms: 1.0,
                frame_after_202_p99_ms: 2.0,
                reconnects: 0,
                sent_per_s: sagas_per_s,
                behind_schedule_ms: 0.0,
                per_saga: Default::default(),
            }),
            log: None,
        }
    }

    #[test]
    fn more_instances_get_rows_of_their_own() {
        let table = render(&[result(1, 439.0), result(2, 301.0)], None);
        // The PostgreSQL cell of the row named `label`.
        let cell = |label: &str| {
            let line = table
                .lines()
                .find(|l| l.split('|').nth(1).map(str::trim) == Some(label))
                .unwrap_or_else(|| panic!("no row {label:?} in\n{table}"));
            line.split('|').nth(2).unwrap_or_default().trim().to_owned()
        };
        let e2e = "end-to-end sagas/s (first POST to last frame), 1 terminal";
        assert_eq!(cell(e2e), "439");
        assert_eq!(cell(&format!("{e2e}, 2 instances")), "301");
        assert!(table.contains("N instances:"));
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(100_000), "100,000");
        assert_eq!(thousands(999), "999");
    }

    #[test]
    fn aligned_pipes() {
        let t = markdown(
            &["figure".into(), "SQLite".into()],
            &[vec!["a".into(), "12".into()]],
        );
        assert_eq!(
            t,
            "| figure | SQLite |\n|--------|-------:|\n| a      |     12 |"
        );
    }
}
