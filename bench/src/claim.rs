//! Claim cost against queue length: on a fresh database per backend, the
//! time of one dispatcher claim round (which experiences have work, then
//! the claim of 5 sagas for the one that has) with 1,000 and with 100,000
//! sagas queued (and a tenth as many finished beside them), each size
//! timed over many rounds, so the table can give the ratio of the medians
//! side by side. The slots a round takes are given back (the 5 sagas are
//! cancelled, untimed) before the next. PostgreSQL is analyzed after each
//! load (as autovacuum would); SQLite is not (the server never analyzes
//! its file). The plan of the claim of the AI queue is shown at each size.
//! The rank cost is measured beside it: with as many visible ranking
//! entries as sagas queued, the time to rank a batch of [`RANK_BATCH`]
//! entries (the ranking walk a busy ranking batch does after its commit).
//!
//! The server measures its store itself (`stagehand claim-cost`, which
//! prints the rounds as JSON); this module makes the database, runs it, and
//! gives the table its figures.

use std::path::Path;

use super::load::{self, Backend};

/// The queue lengths timed, shortest first.
pub const SIZES: [i64; 2] = [1_000, 100_000];
/// The rounds of one queue length.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct SizeTiming {
    pub queued: i64,
    /// Each round's time, ms, in order.
    pub rounds_ms: Vec<f64>,
    /// Of each round, the part that lists the experiences with work.
    pub list_ms: Vec<f64>,
    /// With as many visible ranking entries as sagas queued: the time to
    /// rank a batch of [`RANK_BATCH`] of them (what a ranking batch does
    /// after its commit), one per round.
    pub rank_ms: Vec<f64>,
    /// The same with another instance's ranking news before each batch,
    /// as when two instances rank all the time: the default bound (its
    /// scores are read again at most once a second), and no bound (read
    /// again at each batch, as every piece of news did before the bound).
    pub rank_after_news_ms: Vec<f64>,
    pub rank_reread_ms: Vec<f64>,
}

/// Entries ranked at once in the rank cost (a busy ranking batch).
pub const RANK_BATCH: u64 = 32;

impl SizeTiming {
    pub fn median_ms(&self) -> f64 {
        load::percentile(&mut self.rounds_ms.clone(), 0.50)
    }
    pub fn p90_ms(&self) -> f64 {
        load::percentile(&mut self.rounds_ms.clone(), 0.90)
    }
    pub fn list_median_ms(&self) -> f64 {
        load::percentile(&mut self.list_ms.clone(), 0.50)
    }
    pub fn rank_median_ms(&self) -> f64 {
        load::percentile(&mut self.rank_ms.clone(), 0.50)
    }
    pub fn rank_p90_ms(&self) -> f64 {
        load::percentile(&mut self.rank_ms.clone(), 0.90)
    }
    pub fn rank_after_news_median_ms(&self) -> f64 {
        load::percentile(&mut self.rank_after_news_ms.clone(), 0.50)
    }
    pub fn rank_reread_median_ms(&self) -> f64 {
        load::percentile(&mut self.rank_reread_ms.clone(), 0.50)
    }
}

pub struct ClaimCostResult {
    pub backend: Backend,
    pub outcome: Result<Vec<SizeTiming>, String>,
}

impl ClaimCostResult {
    /// Median at the longest queue / median at the shortest.
    pub fn ratio(&self) -> Option<f64> {
        let sizes = self.outcome.as_ref().ok()?;
        Some(sizes.last()?.median_ms() / sizes.first()?.median_ms())
    }

    /// The same for the rank of a batch (most entries / fewest).
    pub fn rank_ratio(&self) -> Option<f64> {
        let sizes = self.outcome.as_ref().ok()?;
        Some(sizes.last()?.rank_median_ms() / sizes.first()?.rank_median_ms())
    }
}

/// Times `rounds` claim rounds at each of [`SIZES`] on `backend` (a fresh
/// SQLite file under `dir`, or a fresh database through `admin_url`).
pub async fn run(
    backend: Backend,
    admin_url: Option<&str>,
    dir: &Path,
    rounds: usize,
) -> ClaimCostResult {
    let mut pg_name = None;
    let outcome = async {
        let url = match backend {
            Backend::Sqlite => {
                let db_dir = dir.join("db-claim");
                std::fs::create_dir_all(&db_dir)
                    .map_err(|e| format!("create {}: {e}", db_dir.display()))?;
                format!("sqlite://{}/claim.db?mode=rwc", db_dir.display())
            }
            Backend::Postgres => {
                let admin = admin_url.ok_or("no PostgreSQL admin URL")?;
                let (url, name) = super::create_database(admin).await?;
                pg_name = Some(name);
                url
            }
        };
        measure(&url, rounds).await
    }
    .await;
    if let (Some(admin), Some(name)) = (admin_url, &pg_name) {
        super::drop_database(admin, name).await;
    }
    ClaimCostResult { backend, outcome }
}

/// Runs `stagehand claim-cost` on `url` (the store's own measurement: this
/// crate cannot reach the store) and reads its figures from stdout; its
/// stderr (the plans, the rounds) comes through to the operator as it runs.
async fn measure(url: &str, rounds: usize) -> Result<Vec<SizeTiming>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current executable: {e}"))?;
    let sizes: Vec<String> = SIZES.iter().map(i64::to_string).collect();
    let out = tokio::process::Command::new(exe)
        .args(["claim-cost", "--database-url", url])
        .args(["--rounds", &rounds.to_string()])
        .args(["--sizes", &sizes.join(",")])
        .args(["--rank-batch", &RANK_BATCH.to_string()])
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .map_err(|e| format!("run stagehand claim-cost: {e}"))?;
    if !out.status.success() {
        return Err(format!("stagehand claim-cost exited with {}", out.status));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("the figures of stagehand claim-cost: {e}"))
}
