//! The figures of one rehearsal: the [`Report`], its printed table (what
//! each figure measures, under it) and its JSON for machines.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::super::load::percentile;
use super::super::table::{markdown, millis};
use super::verdict::{self, BurstCapacity, Capacity, Measured, Targets, Verdict};

/// p50 / p95 / p99 (ms) of some latencies, and how many there were; NaN
/// (null in JSON) when there were none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub count: usize,
}

impl Latency {
    /// Nearest-rank percentiles of `values` (sorted in place).
    pub fn of(values: &mut [f64]) -> Latency {
        Latency {
            p50: percentile(values, 0.50),
            p95: percentile(values, 0.95),
            p99: percentile(values, 0.99),
            count: values.len(),
        }
    }

    fn to_json(self) -> Value {
        json!({"p50": self.p50, "p95": self.p95, "p99": self.p99, "count": self.count})
    }
}

/// How the participants' sessions ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcomes {
    pub participants: usize,
    /// Submissions answered 202.
    pub accepted: usize,
    /// Submissions answered otherwise, by status (`no answer` when none).
    pub refused_by_status: BTreeMap<String, usize>,
    /// `session.completed` frames.
    pub completed: usize,
    /// `session.rejected` (INPUT_REJECTED) frames.
    pub rejected: usize,
    /// Prompts sent with the reject word.
    pub injected_rejections: usize,
    /// Every frame that was not a completion, by reason (INPUT_REJECTED
    /// included).
    pub aborted_by_reason: BTreeMap<String, usize>,
    /// Accepted, but no frame by the deadline.
    pub lost: usize,
}

impl Outcomes {
    /// Submissions not answered 202.
    pub fn refused(&self) -> usize {
        self.refused_by_status.values().sum()
    }

    /// Frames that were neither a completion nor a moderation rejection.
    pub fn other_aborts(&self) -> usize {
        self.aborted_by_reason
            .iter()
            .filter(|(r, _)| r.as_str() != "INPUT_REJECTED")
            .map(|(_, n)| n)
            .sum()
    }
}

/// The unrelated reader's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Reads {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub count: usize,
    pub failed: usize,
    pub every_ms: u64,
}

/// `pg_stat_activity` while the day ran.
#[derive(Debug, Clone, PartialEq)]
pub enum PgActivity {
    Sampled {
        samples: usize,
        /// Most connections of the database in state `idle in
        /// transaction` at one sample.
        idle_in_transaction_peak: i64,
        /// Longest time one of them had been in that state when sampled.
        idle_in_transaction_longest_ms: i64,
        /// Most of them at one sample that had been so for 100 ms or more
        /// (a transaction held open, not one between two statements).
        idle_in_transaction_100ms_peak: i64,
        connections_peak: i64,
        every_ms: u64,
    },
    /// Why not: `n/a (SQLite)`, ...
    NotSampled(String),
}

/// The embedded server's resident set.
#[derive(Debug, Clone, PartialEq)]
pub struct Memory {
    /// VmRSS (KiB) after setup, before the displays connected.
    pub rss_before_kib: u64,
    /// VmRSS (KiB) with every display connected, before the day.
    pub rss_after_kib: u64,
    pub sockets: usize,
    /// VmHWM (KiB) at the end.
    pub peak_kib: Option<u64>,
}

impl Memory {
    pub fn per_socket_kib(&self) -> f64 {
        (self.rss_after_kib as f64 - self.rss_before_kib as f64) / self.sockets.max(1) as f64
    }
}

/// Everything one rehearsal measured.
#[derive(Debug, Clone)]
pub struct Report {
    pub started: String,
    pub cpus: usize,
    /// 1-minute load average at the start and the end.
    pub load_average: [Option<f64>; 2],
    /// `embedded` or the URL.
    pub target: String,
    pub backend: String,
    pub arrivals: String,
    pub ai: String,
    pub fail_rate: f64,
    pub reject_rate: f64,
    pub terminals: usize,
    pub ai_calls: u32,
    pub max_in_flight: u32,
    pub db_pool: Option<u32>,
    pub outcomes: Outcomes,
    pub accepted_per_s: f64,
    pub completed_per_s: f64,
    pub submit_ms: Latency,
    pub submit_to_frame_ms: Latency,
    pub push_ms: Latency,
    /// From the operators' stats frames (None: no frame came).
    pub queue_depth_peak: Option<i64>,
    pub ai_in_flight_peak: Option<i64>,
    /// The embedded simulator's `max_concurrent_jobs`.
    pub simulator_max_concurrent_jobs: Option<u64>,
    pub stats_frames: usize,
    pub pg: PgActivity,
    pub unrelated_reads: Reads,
    pub memory: Option<Memory>,
    pub notes: Vec<String>,
    pub violations: Vec<String>,
    /// `(seconds from the first arrival, depth)` of the operators' stats
    /// frames, one a second at most.
    pub queue_depth_over_time: Vec<(f64, i64)>,
    /// Least-squares slope of the queue depth while participants arrived
    /// (steady arrivals only).
    pub queue_depth_growth_per_s: Option<f64>,
    /// What the AI slots need (steady arrivals, AI job times measured).
    pub capacity: Option<Capacity>,
    /// What the AI slots need for a burst to meet the p95 target.
    pub burst_capacity: Option<BurstCapacity>,
    pub targets: Targets,
}

/// What push latency measures, in the table and the JSON.
pub const PUSH_MEANS: &str = "from the session's updated_at (written in the transaction that \
    ended the saga, server clock, ms) to this process reading the frame (its wall clock)";

impl Report {
    /// The figures the verdict is taken on.
    pub fn measured(&self) -> Measured {
        let o = &self.outcomes;
        Measured {
            p95_ms: self.submit_to_frame_ms.p95,
            p99_ms: self.submit_to_frame_ms.p99,
            abort_rate: verdict::abort_rate(o.participants, o.other_aborts(), o.lost, o.refused()),
            delivery_problems: self.violations.len(),
        }
    }

    /// GO or NO-GO against the targets.
    pub fn verdict(&self) -> Verdict {
        verdict::verdict(&self.measured(), &self.targets)
    }

    /// The last lines: the capacity advice, when the AI slots are short,
    /// and the verdict line.
    pub fn decision(&self) -> Vec<String> {
        let mut out: Vec<String> = self.capacity.iter().filter_map(Capacity::advice).collect();
        out.extend(self.burst_capacity.iter().filter_map(BurstCapacity::advice));
        out.push(self.verdict().line());
        out
    }

    /// The figures for machines (`--json`). NaN figures are null.
    pub fn to_json(&self) -> Value {
        let o = &self.outcomes;
        let abort_rate: BTreeMap<&String, f64> = o
            .aborted_by_reason
            .iter()
            .map(|(reason, n)| (reason, *n as f64 / o.accepted.max(1) as f64))
            .collect();
        let pg = match &self.pg {
            PgActivity::Sampled {
                samples,
                idle_in_transaction_peak,
                idle_in_transaction_longest_ms,
                idle_in_transaction_100ms_peak,
                connections_peak,
                every_ms,
            } => json!({
                "idle_in_transaction_peak": idle_in_transaction_peak,
                "idle_in_transaction_100ms_peak": idle_in_transaction_100ms_peak,
                "idle_in_transaction_longest_ms": idle_in_transaction_longest_ms,
                "connections_peak": connections_peak,
                "samples": samples,
                "every_ms": every_ms,
            }),
            PgActivity::NotSampled(why) => json!({"not_sampled": why}),
        };
        let memory = self.memory.as_ref().map(|m| {
            json!({
                "rss_before_displays_kib": m.rss_before_kib,
                "rss_with_displays_kib": m.rss_after_kib,
                "sockets": m.sockets,
                "per_socket_kib": m.per_socket_kib(),
                "peak_rss_kib": m.peak_kib,
            })
        });
        json!({
            "started": self.started,
            "machine": {
                "cpus": self.cpus,
                "load_average": {"start": self.load_average[0], "end": self.load_average[1]},
            },
            "target": self.target,
            "backend": self.backend,
            "inputs": {
                "arrivals": self.arrivals,
                "ai": self.ai,
                "fail_rate": self.fail_rate,
                "reject_rate": self.reject_rate,
                "terminals": self.terminals,
                "ai_calls": self.ai_calls,
                "max_in_flight": self.max_in_flight,
                "db_pool": self.db_pool,
            },
            "sessions": {
                "participants": o.participants,
                "accepted": o.accepted,
                "refused_by_status": o.refused_by_status,
                "completed": o.completed,
                "rejected": o.rejected,
                "injected_rejections": o.injected_rejections,
                "aborted_by_reason": o.aborted_by_reason,
                "lost": o.lost,
            },
            "abort_rate_by_reason": abort_rate,
            "accepted_per_s": self.accepted_per_s,
            "completed_per_s": self.completed_per_s,
            "submit_ms": self.submit_ms.to_json(),
            "submit_to_frame_ms": self.submit_to_frame_ms.to_json(),
            "push_ms": self.push_ms.to_json(),
            "push_measures": PUSH_MEANS,
            "queue_depth_peak": self.queue_depth_peak,
            "ai_concurrency": {
                "cap": self.max_in_flight,
                "peak_in_flight": self.ai_in_flight_peak,
                "simulator_max_concurrent_jobs": self.simulator_max_concurrent_jobs,
                "stats_frames": self.stats_frames,
            },
            "postgres": pg,
            "unrelated_read_ms": {
                "p50": self.unrelated_reads.p50_ms,
                "p99": self.unrelated_reads.p99_ms,
                "count": self.unrelated_reads.count,
                "failed": self.unrelated_reads.failed,
                "every_ms": self.unrelated_reads.every_ms,
            },
            "memory": memory,
            "queue_depth_over_time": self.queue_depth_over_time,
            "queue_depth_growth_per_s": self.queue_depth_growth_per_s,
            "capacity": self.capacity.as_ref().map(Capacity::to_json),
            "burst_capacity": self.burst_capacity.as_ref().map(BurstCapacity::to_json),
            "targets": {
                "p95_ms": self.targets.p95.as_secs_f64() * 1000.0,
                "p99_ms": self.targets.p99.map(|d| d.as_secs_f64() * 1000.0),
                "abort_rate": self.targets.abort_rate,
            },
            "abort_rate": self.measured().abort_rate,
            "verdict": self.verdict().to_json(),
            "notes": self.notes,
            "violations": self.violations,
        })
    }

    /// The printed table, a header above it and what the figures mean
    /// under it.
    pub fn render(&self) -> String {
        let mut out = self.header();
        out.push(markdown(&["figure".into(), "value".into()], &self.rows()));
        out.push(String::new());
        out.extend(self.explanations());
        out.extend(self.notes.iter().map(|note| format!("note: {note}")));
        out.push(String::new());
        out.extend(self.decision());
        out.join("\n")
    }

    /// The two lines above the table (machine, target, inputs) and a blank one.
    fn header(&self) -> Vec<String> {
        let load = match self.load_average {
            [Some(a), Some(b)] => format!(", load average {a:.2} at start, {b:.2} at end"),
            _ => String::new(),
        };
        let pool = self
            .db_pool
            .map_or("the server's".to_owned(), |p| p.to_string());
        vec![
            format!(
                "stagehand rehearse, {}, {} CPU(s){load}",
                self.started, self.cpus
            ),
            format!(
                "{} ({}): {}; AI: {}, fail rate {}, reject rate {}; {} terminal(s); ai_calls {}, \
                 max_in_flight {}; db pool {pool}",
                self.target,
                self.backend,
                self.arrivals,
                self.ai,
                self.fail_rate,
                self.reject_rate,
                self.terminals,
                self.ai_calls,
                self.max_in_flight
            ),
            String::new(),
        ]
    }

    /// The table's rows, `[figure, value]`, in the printed order.
    fn rows(&self) -> Vec<Vec<String>> {
        let mut rows = self.session_rows();
        rows.extend(self.abort_rows());
        rows.extend(self.queue_rows());
        rows.extend(self.database_rows());
        rows.extend(self.read_and_memory_rows());
        rows
    }

    /// Rows of how the sessions ended, their rates and latencies.
    fn session_rows(&self) -> Vec<Vec<String>> {
        let o = &self.outcomes;
        let refused = o.refused();
        let refused_detail = if refused == 0 {
            String::new()
        } else {
            let parts: Vec<String> = o
                .refused_by_status
                .iter()
                .map(|(status, n)| format!("{status}: {n}"))
                .collect();
            format!(" ({})", parts.join(", "))
        };
        let other_aborts = o.other_aborts();
        vec![
            vec![
                "participants / accepted (202) / refused".into(),
                format!(
                    "{} / {} / {refused}{refused_detail}",
                    o.participants, o.accepted
                ),
            ],
            vec![
                "completed / rejected (prompts sent to be rejected) / other aborts / lost".into(),
                format!(
                    "{} / {} ({}) / {other_aborts} / {}",
                    o.completed, o.rejected, o.injected_rejections, o.lost
                ),
            ],
            vec![
                "submissions accepted per second".into(),
                format!("{:.1}", self.accepted_per_s),
            ],
            vec![
                "sagas completed per second".into(),
                format!("{:.1}", self.completed_per_s),
            ],
            vec![
                "submit latency, POST to 202, p50 / p95 / p99 (ms)".into(),
                triple(&self.submit_ms),
            ],
            vec![
                "202 to terminal frame, p50 / p95 / p99 (ms)".into(),
                triple(&self.submit_to_frame_ms),
            ],
            vec![
                "push latency, saga ended to frame, p50 / p95 / p99 (ms)".into(),
                triple(&self.push_ms),
            ],
        ]
    }

    /// Rows of the abort rate by reason, then the verdict's abort rate.
    fn abort_rows(&self) -> Vec<Vec<String>> {
        let o = &self.outcomes;
        let mut rows: Vec<Vec<String>> = Vec::new();
        if o.aborted_by_reason.is_empty() {
            rows.push(vec!["abort rate".into(), "0 %".into()]);
        }
        for (reason, n) in &o.aborted_by_reason {
            rows.push(vec![
                format!("abort rate, {reason}"),
                format!(
                    "{:.1} % ({n})",
                    100.0 * *n as f64 / o.accepted.max(1) as f64
                ),
            ]);
        }
        rows.push(vec![
            "abort rate of the verdict (not moderation: other aborts, lost, refused)".into(),
            verdict::percent(self.measured().abort_rate),
        ]);
        rows
    }

    /// Rows of the queue, the capacity figures and the AI concurrency.
    fn queue_rows(&self) -> Vec<Vec<String>> {
        let opt = |x: Option<i64>| x.map_or("n/a".to_owned(), |x| x.to_string());
        let mut rows = vec![vec![
            "peak queue depth (operators' stats)".into(),
            opt(self.queue_depth_peak),
        ]];
        if let Some(g) = self.queue_depth_growth_per_s {
            rows.push(vec![
                "queue depth growth while participants arrived (per s)".into(),
                format!("{g:+.1}"),
            ]);
        }
        if let Some(c) = &self.capacity {
            rows.push(vec![
                "arrivals per second / mean AI job (s) / AI jobs per participant".into(),
                format!(
                    "{:.2} / {:.3} / {:.2}",
                    c.arrival_per_s, c.mean_job_s, c.jobs_per_participant
                ),
            ]);
            rows.push(vec![
                "AI jobs in flight needed (Little's law) / cap".into(),
                format!("{:.1} / {}", c.needed, c.cap),
            ]);
        }
        if let Some(b) = &self.burst_capacity {
            rows.push(vec![
                "mean AI job (s) / AI jobs per participant".into(),
                format!("{:.3} / {:.2}", b.mean_job_s, b.jobs_per_participant),
            ]);
        }
        rows.push(vec![
            "peak AI concurrency / cap (operators' stats)".into(),
            format!("{} / {}", opt(self.ai_in_flight_peak), self.max_in_flight),
        ]);
        if let Some(sim) = self.simulator_max_concurrent_jobs {
            rows.push(vec![
                "peak AI concurrency / cap (simulator)".into(),
                format!("{sim} / {}", self.max_in_flight),
            ]);
        }
        rows
    }

    /// Rows of `pg_stat_activity`: idle in a transaction, connections.
    fn database_rows(&self) -> Vec<Vec<String>> {
        let pg = match &self.pg {
            PgActivity::Sampled {
                idle_in_transaction_peak,
                idle_in_transaction_longest_ms,
                idle_in_transaction_100ms_peak,
                ..
            } => format!(
                "{idle_in_transaction_peak}; {idle_in_transaction_100ms_peak} for >= 100 ms \
                 (longest {idle_in_transaction_longest_ms} ms)"
            ),
            PgActivity::NotSampled(why) => why.clone(),
        };
        let mut rows = vec![vec!["most connections idle in a transaction".into(), pg]];
        if let PgActivity::Sampled {
            connections_peak, ..
        } = &self.pg
        {
            rows.push(vec![
                "most connections to the database".into(),
                connections_peak.to_string(),
            ]);
        }
        rows
    }

    /// Rows of the unrelated reader and the server's memory.
    fn read_and_memory_rows(&self) -> Vec<Vec<String>> {
        let r = &self.unrelated_reads;
        let failed = if r.failed > 0 {
            format!(", {} failed", r.failed)
        } else {
            String::new()
        };
        let mut rows = vec![vec![
            "unrelated read, p50 / p99 (ms)".into(),
            format!("{} / {}{failed}", millis(r.p50_ms), millis(r.p99_ms)),
        ]];
        match &self.memory {
            Some(m) => {
                rows.push(vec![
                    format!("server RSS before / with {} displays (KiB)", m.sockets),
                    format!("{} / {}", m.rss_before_kib, m.rss_after_kib),
                ]);
                rows.push(vec![
                    "memory per display socket (KiB)".into(),
                    format!("{:.1}", m.per_socket_kib()),
                ]);
                rows.push(vec![
                    "server peak RSS (KiB)".into(),
                    m.peak_kib.map_or("n/a".into(), |k| k.to_string()),
                ]);
            }
            None => rows.push(vec![
                "server RSS, memory per socket".into(),
                "n/a (remote server)".into(),
            ]),
        }
        rows
    }

    /// The lines under the table: what each figure measures.
    fn explanations(&self) -> Vec<String> {
        let mut out = vec![
            "202 to terminal frame: from this process holding the 202 to the display of the \
             session's terminal"
                .into(),
            "  reading its session.completed / rejected / aborted frame.".into(),
            format!("push latency: {PUSH_MEANS}."),
            format!(
                "queue depth and AI concurrency: the peaks of the operators' stats frames ({} \
                 received, at most 4 a second){}",
                self.stats_frames,
                if self.simulator_max_concurrent_jobs.is_some() {
                    ";\n  the simulator's figure is its own exact count of unfinished jobs."
                } else {
                    "."
                }
            ),
        ];
        if let PgActivity::Sampled {
            samples, every_ms, ..
        } = &self.pg
        {
            out.push(format!(
                "idle in a transaction: pg_stat_activity of the database every {every_ms} ms \
                 ({samples} samples), state 'idle in transaction%'; >= 100 ms: in that state \
                 for 100 ms or more when sampled"
            ));
            out.push(
                "  (a transaction held open across something slow, not one between two of its \
                 statements)."
                    .into(),
            );
        }
        let r = &self.unrelated_reads;
        out.push(format!(
            "unrelated read: GET /api/experiences/<slug> every {} ms by a client of its own, \
             {} reads.",
            r.every_ms, r.count
        ));
        if self.memory.is_some() {
            out.push(
                "memory per display socket: server VmRSS (median of 5 reads) with the displays \
                 connected minus before, / displays."
                    .into(),
            );
        }
        if self.capacity.is_some() {
            out.push(
                "AI jobs in flight needed: arrivals per second x AI jobs per participant x mean \
                 AI job (Little's law; the job times"
                    .into(),
            );
            out.push(
                "  from the server's stagehand_ai_job_duration_seconds, submit to final status, \
                 over the day)."
                    .into(),
            );
        }
        out
    }
}

fn triple(l: &Latency) -> String {
    format!("{} / {} / {}", millis(l.p50), millis(l.p95), millis(l.p99))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let mut aborted = BTreeMap::new();
        aborted.insert("INPUT_REJECTED".to_owned(), 4);
        Report {
            started: "2026-12-01T02:00:00Z".into(),
            cpus: 2,
            load_average: [Some(1.5), None],
            target: "embedded".into(),
            backend: "SQLite".into(),
            arrivals: "a burst of 40 at once".into(),
            ai: "simulator, latency 50ms fixed".into(),
            fail_rate: 0.0,
            reject_rate: 0.1,
            terminals: 3,
            ai_calls: 1,
            max_in_flight: 5,
            db_pool: None,
            outcomes: Outcomes {
                participants: 40,
                accepted: 40,
                completed: 36,
                rejected: 4,
                injected_rejections: 4,
                aborted_by_reason: aborted,
                ..Outcomes::default()
            },
            accepted_per_s: 400.0,
            completed_per_s: 9.0,
            submit_ms: Latency::of(&mut [3.0, 1.0, 2.0]),
            submit_to_frame_ms: Latency::of(&mut []),
            push_ms: Latency::of(&mut [5.0]),
            queue_depth_peak: Some(35),
            ai_in_flight_peak: Some(5),
            simulator_max_concurrent_jobs: Some(5),
            stats_frames: 12,
            pg: PgActivity::NotSampled("n/a (SQLite)".into()),
            unrelated_reads: Reads {
                p50_ms: 1.0,
                p99_ms: 4.0,
                count: 100,
                failed: 0,
                every_ms: 20,
            },
            memory: Some(Memory {
                rss_before_kib: 1000,
                rss_after_kib: 1300,
                sockets: 3,
                peak_kib: None,
            }),
            notes: vec![],
            violations: vec![],
            queue_depth_over_time: vec![(0.0, 0), (1.2, 7)],
            queue_depth_growth_per_s: None,
            capacity: None,
            burst_capacity: None,
            targets: Targets {
                p95: std::time::Duration::from_secs(30),
                p99: None,
                abort_rate: 0.02,
            },
        }
    }

    #[test]
    fn latencies_are_nearest_rank() {
        let l = Latency::of(&mut (1..=100).map(f64::from).collect::<Vec<_>>());
        assert_eq!((l.p50, l.p95, l.p99, l.count), (50.0, 95.0, 99.0, 100));
        assert!(Latency::of(&mut []).p99.is_nan());
    }

    #[test]
    fn the_json_has_the_documented_shape() {
        let v = report().to_json();
        assert_eq!(v["sessions"]["participants"], 40);
        assert_eq!(v["sessions"]["completed"], 36);
        assert_eq!(v["sessions"]["rejected"], 4);
        assert_eq!(v["sessions"]["injected_rejections"], 4);
        assert_eq!(v["sessions"]["aborted_by_reason"]["INPUT_REJECTED"], 4);
        assert_eq!(v["abort_rate_by_reason"]["INPUT_REJECTED"], 0.1);
        assert_eq!(v["submit_ms"]["p50"], 2.0);
        assert_eq!(v["submit_ms"]["count"], 3);
        // No frame: null, not a number.
        assert!(v["submit_to_frame_ms"]["p99"].is_null());
        assert_eq!(v["ai_concurrency"]["cap"], 5);
        assert_eq!(v["ai_concurrency"]["peak_in_flight"], 5);
        assert_eq!(v["ai_concurrency"]["simulator_max_concurrent_jobs"], 5);
        assert_eq!(v["postgres"]["not_sampled"], "n/a (SQLite)");
        assert_eq!(v["memory"]["per_socket_kib"], 100.0);
        assert!(v["memory"]["peak_rss_kib"].is_null());
        assert_eq!(v["machine"]["load_average"]["start"], 1.5);
        assert!(v["machine"]["load_average"]["end"].is_null());
        assert_eq!(v["unrelated_read_ms"]["p99"], 4.0);
        assert!(v["violations"].as_array().unwrap().is_empty());
    }

    #[test]
    fn the_table_says_what_is_not_measured() {
        let mut r = report();
        let table = r.render();
        assert!(table.contains("| most connections idle in a transaction "));
        assert!(table.contains("n/a (SQLite)"));
        assert!(table.contains("| abort rate, INPUT_REJECTED "));
        assert!(table.contains("10.0 % (4)"));
        r.memory = None;
        assert!(r.render().contains("n/a (remote server)"));
    }

    #[test]
    fn the_table_ends_with_the_verdict() {
        let mut r = report();
        // No frame came: the p95 cannot meet its target.
        let table = r.render();
        assert_eq!(
            table.lines().last(),
            Some("NO-GO: p95 n/a (no frame) > target 30 s")
        );
        r.submit_to_frame_ms = Latency::of(&mut [100.0, 200.0, 300.0]);
        assert!(r.verdict().go());
        assert!(r.render().ends_with("delivery problems 0 <= target 0"));
        // Moderation rejections are not aborts for the verdict; lost and
        // refused sessions are.
        assert_eq!(r.measured().abort_rate, 0.0);
        r.outcomes.lost = 1;
        r.outcomes.refused_by_status.insert("429".into(), 1);
        assert_eq!(r.measured().abort_rate, 0.05);
        assert_eq!(r.verdict().line(), "NO-GO: abort rate 5 % > target 2 %");
    }

    #[test]
    fn a_short_cap_gets_advice_before_the_verdict() {
        let mut r = report();
        r.submit_to_frame_ms = Latency::of(&mut [100.0]);
        r.capacity = crate::rehearse::verdict::capacity(10.0, 1.0, 3.0, 5);
        r.queue_depth_growth_per_s = Some(8.04);
        let table = r.render();
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[lines.len() - 2].starts_with("capacity: at 600/min"),
            "{table}"
        );
        assert!(
            lines[lines.len() - 2].contains("max_in_flight >= 36"),
            "{table}"
        );
        assert!(
            table.contains("| AI jobs in flight needed (Little's law) / cap "),
            "{table}"
        );
        assert!(table.contains(" +8.0 |"), "{table}");
        let v = r.to_json();
        assert_eq!(v["capacity"]["recommended_max_in_flight"], 36);
        assert_eq!(v["capacity"]["grows_without_bound"], true);
        assert_eq!(v["verdict"]["go"], true);
        assert_eq!(v["targets"]["p95_ms"], 30000.0);
        assert!(v["targets"]["p99_ms"].is_null());
        assert_eq!(v["queue_depth_over_time"][1], serde_json::json!([1.2, 7]));
        assert!(v["burst_capacity"].is_null());
    }

    #[test]
    fn a_burst_gets_its_own_advice() {
        let mut r = report();
        r.submit_to_frame_ms = Latency::of(&mut [100.0]);
        r.burst_capacity = crate::rehearse::verdict::burst_capacity(
            40,
            1.0,
            8.0,
            5,
            std::time::Duration::from_secs(30),
        );
        let table = r.render();
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[lines.len() - 2].contains("max_in_flight >= 13"),
            "{table}"
        );
        assert_eq!(r.to_json()["burst_capacity"]["rounds_in_target_p95"], 3);
    }
}
