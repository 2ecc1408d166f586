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

use std::path::Path;
use std::time::Instant;

use sea_orm::ConnectionTrait;

use super::load::{self, Backend};
use crate::domain::ledger::Evidence;
use crate::domain::saga::AbortReason;
use crate::domain::saga::Step;
use crate::store::experiences::NewExperience;
use crate::store::sagas::{ClaimRules, ClaimSource, Fence};
use crate::store::submissions::Submission;
use crate::store::Store;

/// The queue lengths timed, shortest first.
pub const SIZES: [i64; 2] = [1_000, 100_000];
/// The experience's AI cap: each round claims this many.
const CAP: i32 = 5;
const RULES: ClaimRules = ClaimRules {
    lease_ms: 60_000,
    max_recoveries: 2,
};

/// The rounds of one queue length.
#[derive(Debug, Clone)]
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
        measure(&url, dir, rounds).await
    }
    .await;
    if let (Some(admin), Some(name)) = (admin_url, &pg_name) {
        super::drop_database(admin, name).await;
    }
    ClaimCostResult { backend, outcome }
}

async fn measure(url: &str, dir: &Path, rounds: usize) -> Result<Vec<SizeTiming>, String> {
    migrate(url, dir)?;
    let store = Store::connect(url, 4)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let now = chrono::Utc::now().timestamp_millis();
    let experience = store
        .create_experience(
            NewExperience {
                slug: format!("claim-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
                title: "Claim cost".into(),
                kind: "image".into(),
                ai_calls: 1,
                min_success: None,
                max_in_flight: CAP,
                credits: None,
                closes_at_ms: None,
                locale: "en".into(),
                provider: "default".into(),
                weight: 1,
                review: Default::default(),
                review_timeout_ms: None,
                review_timeout_action: None,
                input: crate::domain::media::InputKind::Prompt,
                photo_max_px: 1536,
                guests: Default::default(),
            },
            None,
            now,
        )
        .await
        .map_err(|e| format!("create the experience: {e}"))?;
    let terminal = store
        .create_terminal(&experience.id, "booth", "claim-cost", None, now)
        .await
        .map_err(|e| format!("create a terminal: {e}"))?;
    let session = store
        .create_session(
            &experience.id,
            Some(terminal.id),
            "claim",
            &uuid::Uuid::new_v4().to_string(),
            now,
        )
        .await
        .map_err(|e| format!("create a session: {e}"))?;
    let template = store
        .submit(
            &session,
            Submission {
                photo_id: None,
                in_gallery: true,
                consent: false,
                prompt: "claim cost".into(),
                score: None,
            },
            900_000,
            now,
        )
        .await
        .map_err(|e| format!("submit: {e}"))?;

    let mut have = 1i64;
    let mut have_scores = 0i64;
    let mut out = Vec::new();
    for queued in SIZES {
        store
            .insert_bulk_sagas(&template, have, queued - have, "AI_PENDING", now)
            .await
            .map_err(|e| format!("insert {} AI_PENDING sagas: {e}", queued - have))?;
        store
            .insert_bulk_sagas(&template, queued, queued / 10, "COMPLETED", now)
            .await
            .map_err(|e| format!("insert {} COMPLETED sagas: {e}", queued / 10))?;
        have = queued + queued / 10;
        if store.is_postgres() {
            // What autovacuum does after such a load; the server never
            // analyzes a SQLite file, so neither does the bench.
            store
                .db()
                .execute_unprepared("ANALYZE")
                .await
                .map_err(|e| format!("ANALYZE: {e}"))?;
        }
        let plan = store
            .claim_plan(
                &experience.id,
                Step::AiPending,
                ClaimSource::Unowned,
                now + 1,
                RULES,
            )
            .await
            .map_err(|e| format!("plan of the claim: {e}"))?;
        eprintln!(
            "  claim cost: {queued} queued, plan of the claim of the AI queue:\n    {}",
            plan.replace('\n', "\n    ")
        );
        let mut rounds_ms = Vec::with_capacity(rounds);
        let mut list_ms = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let at = now + 1 + round as i64;
            let start = Instant::now();
            let listed = store
                .experiences_with_claimable(at, RULES)
                .await
                .map_err(|e| format!("list claimable: {e}"))?;
            list_ms.push(load::ms(start.elapsed()));
            let mut claimed = Vec::new();
            for e in &listed {
                claimed.extend(
                    store
                        .claim_runnable(e, 100, at, RULES)
                        .await
                        .map_err(|e| format!("claim: {e}"))?,
                );
            }
            rounds_ms.push(load::ms(start.elapsed()));
            if claimed.len() != CAP as usize {
                return Err(format!(
                    "a claim round with {queued} queued claimed {} sagas, not {CAP}",
                    claimed.len()
                ));
            }
            // Give the slots back for the next round (no submit was sent
            // in them).
            for s in claimed {
                let token = s.lock_token.clone().unwrap_or_default();
                store
                    .abort_freeing(
                        &s.id,
                        Fence::Token(token),
                        AbortReason::Cancelled,
                        "bench",
                        vec![(0, Evidence::NeverSubmitted)],
                        at,
                    )
                    .await
                    .map_err(|e| format!("give a slot back: {e}"))?;
            }
        }
        // The ranking at the same size: as many visible entries as sagas
        // queued, and a batch of them ranked per round.
        store
            .insert_bulk_scores(
                &experience.id,
                &template.id,
                have_scores,
                queued - have_scores,
                now,
            )
            .await
            .map_err(|e| format!("insert {} ranking entries: {e}", queued - have_scores))?;
        have_scores = queued;
        if store.is_postgres() {
            store
                .db()
                .execute_unprepared("ANALYZE score_attempts")
                .await
                .map_err(|e| format!("ANALYZE: {e}"))?;
        }
        let rank_ms = rank_rounds(&store, &experience.id, rounds, false).await?;
        let rank_after_news_ms = rank_rounds(&store, &experience.id, rounds, true).await?;
        let rereading = store.clone().with_rank_refresh(std::time::Duration::ZERO);
        let rank_reread_ms = rank_rounds(&rereading, &experience.id, rounds, true).await?;
        let shown: Vec<String> = rounds_ms.iter().map(|x| format!("{x:.1}")).collect();
        eprintln!(
            "  claim cost: {queued} queued, rounds (ms): {}",
            shown.join(" ")
        );
        out.push(SizeTiming {
            queued,
            rounds_ms,
            list_ms,
            rank_ms,
            rank_after_news_ms,
            rank_reread_ms,
        });
    }
    store.db().clone().close().await.ok();
    Ok(out)
}

/// Times `rounds` ranks of a batch of [`RANK_BATCH`] entries of
/// `experience`, each after news from another instance when `news`.
async fn rank_rounds(
    store: &Store,
    experience: &str,
    rounds: usize,
    news: bool,
) -> Result<Vec<f64>, String> {
    let mut rank_ms = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let batch = store
            .some_entries(experience, RANK_BATCH)
            .await
            .map_err(|e| format!("pick entries: {e}"))?;
        let refs: Vec<_> = batch.iter().collect();
        if news {
            store
                .ranks_changed_elsewhere(Some(&[experience.to_owned()]))
                .await;
        }
        let start = Instant::now();
        let ranks = store
            .ranks_of(experience, &refs)
            .await
            .map_err(|e| format!("rank a batch: {e}"))?;
        rank_ms.push(load::ms(start.elapsed()));
        if ranks.len() != batch.len() {
            return Err(format!(
                "ranked {} of a batch of {} entries",
                ranks.len(),
                batch.len()
            ));
        }
    }
    Ok(rank_ms)
}

/// `stagehand migrate` on `url`, its output in the logs dir (this process's
/// own log lines would land in the middle of the table).
fn migrate(url: &str, dir: &Path) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("current executable: {e}"))?;
    let log = super::logs_dir(dir).join("claim-migrate.log");
    let out = std::process::Command::new(exe)
        .args(["migrate", "--database-url", url])
        .output()
        .map_err(|e| format!("run stagehand migrate: {e}"))?;
    let _ = std::fs::write(
        &log,
        [out.stdout.as_slice(), out.stderr.as_slice()].concat(),
    );
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "stagehand migrate exited with {}; see {}",
            out.status,
            log.display()
        ))
    }
}
