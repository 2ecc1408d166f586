//! What a scenario cost the machine, per saga: CPU time of the server, of
//! PostgreSQL (every `postgres` process: the bench is the cluster's only
//! user while it runs) and of this client, from `/proc` before and after
//! the timed part; the server's context switches (its wake-ups); and on
//! PostgreSQL the transactions and, when `pg_stat_statements` is loaded,
//! the statements of the scenario's database, and who waited for a lock
//! (sampled). With several instances the server figures are their sums.
//! Linux only: elsewhere the figures are absent.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use tokio::sync::watch;

/// Counters read at one moment.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// CPU time (user + system) in clock ticks.
    server_ticks: u64,
    postgres_ticks: u64,
    client_ticks: u64,
    /// The AI simulator's: it does the provider's work (answering the
    /// jobs, serving their files) on the same cores.
    simulator_ticks: u64,
    /// Voluntary + involuntary context switches of every server thread.
    server_switches: u64,
    /// PostgreSQL: commits + rollbacks, and statements, of the database.
    transactions: Option<i64>,
    statements: Option<i64>,
    /// The server's own counters from `/metrics` (absent when it could
    /// not be read): actor messages, by actor; tasks spawned; frames
    /// encoded.
    actor_messages: Option<HashMap<String, f64>>,
    tasks_spawned: Option<f64>,
    frames_encoded: Option<f64>,
}

/// Per saga, between two [`Counters`].
#[derive(Debug, Clone, Default)]
pub struct PerSaga {
    pub server_cpu_ms: f64,
    /// None on SQLite.
    pub postgres_cpu_ms: Option<f64>,
    pub client_cpu_ms: f64,
    /// The AI simulator's CPU: the provider's side of each job (its
    /// answers and the result file the keep stage fetches), on the same
    /// cores as everything else here.
    pub simulator_cpu_ms: f64,
    pub server_switches: f64,
    pub transactions: Option<f64>,
    pub statements: Option<f64>,
    /// Messages handled by the server's actors (wake-ups and hand-offs).
    pub actor_messages: Option<f64>,
    /// The same by actor, most first.
    pub actor_messages_by_actor: Vec<(String, f64)>,
    pub tasks_spawned: Option<f64>,
    /// Socket frames encoded to JSON text.
    pub frames_encoded: Option<f64>,
    /// PostgreSQL: lock waits seen by [`sample_lock_waits`].
    pub lock_waits: Option<LockWaitsPerSaga>,
}

/// How often [`sample_lock_waits`] looks: a wait shorter than this is
/// seen only sometimes, so the counts are a lower bound and the time an
/// estimate.
pub const LOCK_SAMPLE_EVERY: Duration = Duration::from_millis(5);

/// `GET /metrics` renders its text at most once a second and serves that
/// text to every scrape meanwhile (the server's scrape cache, as its API
/// documents): two readings of the server's counters must be at least this
/// far apart, or the second repeats the first.
pub const SCRAPE_REFRESH: Duration = Duration::from_millis(1_100);

/// What [`sample_lock_waits`] saw over a scenario.
#[derive(Debug, Clone, Default)]
pub struct LockWaits {
    /// Waits seen: a backend found waiting for a heavyweight lock that was
    /// not waiting at the sample before.
    pub waits: u64,
    /// Backends waiting, summed over samples, times the time between them.
    pub waiting_ms: f64,
    /// Samples whose query failed (a lost connection, a statement
    /// timeout): the sampler goes on, and these samples count no waits,
    /// so the figures are a lower bound by this much more.
    pub failed_samples: u64,
    /// The waits seen by what they waited for (`wait_event`: transactionid,
    /// tuple, relation...) and the start of the waiting statement, most
    /// first.
    pub by_statement: Vec<(String, u64)>,
    /// CPU ticks of the sampler's own PostgreSQL backend, over its whole
    /// life (it starts after the first counters and stops after the last):
    /// taken off PostgreSQL's CPU, so the sampling does not count as the
    /// scenario's cost.
    pub sampler_ticks: u64,
}

/// [`LockWaits`] per saga.
#[derive(Debug, Clone, Copy, Default)]
pub struct LockWaitsPerSaga {
    pub waits: f64,
    pub waiting_ms: f64,
}

impl LockWaits {
    /// The sampler's own backend's CPU, in CPU-ms per saga.
    pub fn sampler_cpu_ms(&self, sagas: usize) -> f64 {
        self.sampler_ticks as f64 * 1000.0 / TICKS_PER_S / sagas.max(1) as f64
    }

    pub fn per_saga(&self, sagas: usize) -> LockWaitsPerSaga {
        let n = sagas.max(1) as f64;
        LockWaitsPerSaga {
            waits: self.waits as f64 / n,
            waiting_ms: self.waiting_ms / n,
        }
    }
}

/// Samples, every [`LOCK_SAMPLE_EVERY`] until `stop` turns true, the
/// backends of `database_url`'s database that wait for a heavyweight lock
/// (`pg_stat_activity.wait_event_type = 'Lock'`: a row, a transaction id, a
/// relation; what `pg_locks` shows as not granted). None when it could not
/// connect; a sample whose query fails is counted in
/// [`LockWaits::failed_samples`] and the sampling goes on.
pub async fn sample_lock_waits(
    database_url: String,
    mut stop: watch::Receiver<bool>,
) -> Option<LockWaits> {
    let db = super::admin_connect(&database_url).await.ok()?;
    let backend = one_number(&db, "SELECT pg_backend_pid()::bigint").await?;
    let query = Statement::from_string(
        DbBackend::Postgres,
        "SELECT pid, wait_event || ': ' || regexp_replace(left(query, 70), '\\s+', ' ', 'g') \
         FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    );
    let mut seen = LockWaits::default();
    let mut by_statement: HashMap<String, u64> = HashMap::new();
    let mut waiting: HashSet<i32> = HashSet::new();
    let mut last = Instant::now();
    let mut ticker = tokio::time::interval(LOCK_SAMPLE_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let rows = match db.query_all_raw(query.clone()).await {
            Ok(rows) => rows,
            Err(_) => {
                // Nothing known of this interval: no waits counted for it.
                seen.failed_samples += 1;
                last = Instant::now();
                continue;
            }
        };
        let mut now: HashSet<i32> = HashSet::new();
        for row in &rows {
            let Ok(pid) = row.try_get_by_index::<i32>(0) else {
                continue;
            };
            now.insert(pid);
            if !waiting.contains(&pid) {
                seen.waits += 1;
                let what = row.try_get_by_index::<String>(1).unwrap_or_default();
                *by_statement.entry(what).or_default() += 1;
            }
        }
        let at = Instant::now();
        seen.waiting_ms += now.len() as f64 * (at - last).as_secs_f64() * 1000.0;
        (waiting, last) = (now, at);
    }
    seen.sampler_ticks = process_ticks(&backend.to_string());
    db.close().await.ok();
    seen.by_statement = by_statement.into_iter().collect();
    seen.by_statement
        .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Some(seen)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
const TICKS_PER_S: f64 = 100.0;

/// utime + stime of a process, in ticks (fields 14 and 15 of
/// `/proc/<pid>/stat`, counted after the command name's parenthesis).
fn ticks_of(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state): utime is field 14, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

pub(super) fn process_ticks(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| ticks_of(&s))
        .unwrap_or(0)
}

/// The CPU ticks of every process named `postgres`.
fn postgres_ticks() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .map(|pid| process_ticks(&pid))
        .sum()
}

/// Context switches of every thread of `pid`.
fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

async fn one_number(db: &DatabaseConnection, sql: &str) -> Option<i64> {
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql.to_owned()))
        .await
        .ok()??;
    row.try_get_by_index::<i64>(0).ok()
}

/// The server's `GET /metrics` text (the operator token opens it); Err
/// says why it could not be read.
pub(super) async fn metrics_text(
    client: &reqwest::Client,
    base: &str,
    operator: &str,
) -> Result<String, String> {
    let answer = client
        .get(format!("{base}/metrics"))
        .bearer_auth(operator)
        .send()
        .await
        .map_err(|e| format!("GET /metrics: {e}"))?;
    if !answer.status().is_success() {
        return Err(format!("GET /metrics answered {}", answer.status()));
    }
    answer
        .text()
        .await
        .map_err(|e| format!("GET /metrics: {e}"))
}

/// The server's `/metrics` (read with the operator token), summed by
/// counter: actor messages by actor, tasks spawned, frames encoded.
async fn scrape(
    client: &reqwest::Client,
    base: &str,
    operator: &str,
) -> Option<(HashMap<String, f64>, f64, f64)> {
    let text = metrics_text(client, base, operator).await.ok()?;
    Some(sums_of(&text))
}

/// [`scrape`]'s sums out of the Prometheus text.
fn sums_of(text: &str) -> (HashMap<String, f64>, f64, f64) {
    let (mut by_actor, mut tasks, mut frames) = (HashMap::new(), 0.0, 0.0);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        if series.starts_with(crate::metric_names::ACTOR_MESSAGES) {
            let actor = series
                .split("actor=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("?");
            *by_actor.entry(actor.to_owned()).or_default() += value;
        } else if series.starts_with(crate::metric_names::TASKS_SPAWNED) {
            tasks += value;
        } else if series.starts_with(crate::metric_names::FRAMES_ENCODED) {
            frames += value;
        }
    }
    (by_actor, tasks, frames)
}

impl Counters {
    /// Reads them now. `server_pids`: every instance; `db`: the scenario's
    /// PostgreSQL database; `servers`: a client, the instances' base URLs
    /// and the operator token, for `/metrics`.
    pub async fn read(
        server_pids: &[u32],
        simulator_pid: Option<u32>,
        db: Option<&DatabaseConnection>,
        servers: (&reqwest::Client, &[String], &str),
    ) -> Counters {
        // Summed over the instances; absent when any could not be read.
        let mut scraped: Option<(HashMap<String, f64>, f64, f64)> = Some(Default::default());
        for base in servers.1 {
            let one = scrape(servers.0, base, servers.2).await;
            scraped = scraped
                .zip(one)
                .map(|(mut sum, (by_actor, tasks, frames))| {
                    for (actor, n) in by_actor {
                        *sum.0.entry(actor).or_default() += n;
                    }
                    (sum.0, sum.1 + tasks, sum.2 + frames)
                });
        }
        let (transactions, statements) = match db {
            Some(db) => (
                one_number(
                    db,
                    "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
                     WHERE datname = current_database()",
                )
                .await,
                one_number(
                    db,
                    "SELECT COALESCE(SUM(calls), 0)::bigint FROM pg_stat_statements \
                     WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
                )
                .await,
            ),
            None => (None, None),
        };
        Counters {
            server_ticks: server_pids
                .iter()
                .map(|pid| process_ticks(&pid.to_string()))
                .sum(),
            postgres_ticks: if db.is_some() { postgres_ticks() } else { 0 },
            client_ticks: process_ticks("self"),
            simulator_ticks: simulator_pid.map_or(0, |pid| process_ticks(&pid.to_string())),
            server_switches: server_pids.iter().map(|&pid| switches(pid)).sum(),
            transactions,
            statements,
            actor_messages: scraped.as_ref().map(|s| s.0.clone()),
            tasks_spawned: scraped.as_ref().map(|s| s.1),
            frames_encoded: scraped.as_ref().map(|s| s.2),
        }
    }

    /// What happened from `self` to `later`, per saga of `sagas`.
    pub fn per_saga(&self, later: &Counters, sagas: usize, postgres: bool) -> PerSaga {
        let n = sagas.max(1) as f64;
        let ms = |a: u64, b: u64| (b.saturating_sub(a)) as f64 * 1000.0 / TICKS_PER_S / n;
        let each = |a: Option<i64>, b: Option<i64>| Some((b? - a?) as f64 / n);
        let counted = |a: Option<f64>, b: Option<f64>| Some((b? - a?) / n);
        PerSaga {
            server_cpu_ms: ms(self.server_ticks, later.server_ticks),
            postgres_cpu_ms: postgres.then(|| ms(self.postgres_ticks, later.postgres_ticks)),
            client_cpu_ms: ms(self.client_ticks, later.client_ticks),
            simulator_cpu_ms: ms(self.simulator_ticks, later.simulator_ticks),
            server_switches: later.server_switches.saturating_sub(self.server_switches) as f64 / n,
            transactions: each(self.transactions, later.transactions),
            statements: each(self.statements, later.statements),
            actor_messages: match (&self.actor_messages, &later.actor_messages) {
                (Some(a), Some(b)) => Some((b.values().sum::<f64>() - a.values().sum::<f64>()) / n),
                _ => None,
            },
            actor_messages_by_actor: match (&self.actor_messages, &later.actor_messages) {
                (Some(a), Some(b)) => {
                    let mut by: Vec<(String, f64)> = b
                        .iter()
                        .map(|(k, v)| (k.clone(), (v - a.get(k).copied().unwrap_or(0.0)) / n))
                        .filter(|(_, v)| *v > 0.0)
                        .collect();
                    by.sort_by(|x, y| y.1.total_cmp(&x.1));
                    by
                }
                _ => Vec::new(),
            },
            tasks_spawned: counted(self.tasks_spawned, later.tasks_spawned),
            frames_encoded: counted(self.frames_encoded, later.frames_encoded),
            lock_waits: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_servers_counters_by_name_and_actor() {
        let text = "# TYPE stagehand_actor_messages_total counter\n\
            stagehand_actor_messages_total{actor=\"Dispatcher\"} 3\n\
            stagehand_actor_messages_total{actor=\"AiActor\"} 4\n\
            stagehand_tasks_spawned_total{task=\"batch.write\"} 5\n\
            stagehand_tasks_spawned_total{task=\"dispatcher.round\"} 1\n\
            stagehand_frames_encoded_total{kind=\"ranking\"} 2\n\
            stagehand_claim_batch_size_sum 9\n";
        let (by_actor, tasks, frames) = sums_of(text);
        assert_eq!(by_actor["Dispatcher"], 3.0);
        assert_eq!(by_actor["AiActor"], 4.0);
        assert_eq!((tasks, frames), (6.0, 2.0));
    }

    #[test]
    fn lock_waits_are_divided_by_the_sagas() {
        let seen = LockWaits {
            waits: 46,
            waiting_ms: 780.0,
            failed_samples: 0,
            by_statement: Vec::new(),
            sampler_ticks: 150,
        };
        let per = seen.per_saga(1000);
        assert_eq!((per.waits, per.waiting_ms), (0.046, 0.78));
        // 150 ticks of 10 ms over 1,000 sagas.
        assert_eq!(seen.sampler_cpu_ms(1000), 1.5);
    }

    #[test]
    fn reads_utime_and_stime_past_a_command_name_with_spaces() {
        let stat =
            "1234 (tokio (rt) 1) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1 2 3";
        assert_eq!(ticks_of(stat), Some(300));
    }
}
