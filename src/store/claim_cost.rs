//! `stagehand claim-cost`: the store's own cost of a dispatcher claim round
//! against queue length, measured on a database given by URL (what
//! `stagehand bench` prints as the claim cost; the load tools cannot reach
//! the store, so they run this command and read its JSON).
//!
//! For each queue length: that many sagas queued (and a tenth as many
//! finished beside them), then rounds of one claim round (which experiences
//! have work, then the claim of [`CAP`] sagas for the one that has), timed;
//! the slots a round takes are given back (untimed) before the next.
//! PostgreSQL is analyzed after each load (as autovacuum would); SQLite is
//! not (the server never analyzes its file). The plan of the claim of the
//! AI queue is printed on stderr at each size. With as many visible ranking
//! entries as sagas queued, the time to rank a batch of entries is measured
//! beside it.

use std::time::{Duration, Instant};

use sea_orm::ConnectionTrait;
use serde::Serialize;

use crate::domain::ledger::Evidence;
use crate::domain::media::InputKind;
use crate::domain::policy::EpochMs;
use crate::domain::saga::{AbortReason, Step};
use crate::store::entities::sagas;
use crate::store::experiences::NewExperience;
use crate::store::sagas::{ClaimRules, ClaimSource, Fence};
use crate::store::submissions::Submission;
use crate::store::Store;

/// The experience's AI cap: each round claims this many.
pub const CAP: i32 = 5;
const RULES: ClaimRules = ClaimRules {
    lease_ms: 60_000,
    max_recoveries: 2,
};

/// The rounds of one queue length, each list in round order, in ms.
#[derive(Debug, Clone, Serialize)]
pub struct SizeTiming {
    pub queued: i64,
    /// Each round's time.
    pub rounds_ms: Vec<f64>,
    /// Of each round, the part that lists the experiences with work.
    pub list_ms: Vec<f64>,
    /// With as many visible ranking entries as sagas queued: the time to
    /// rank a batch of them (what a ranking batch does after its commit).
    pub rank_ms: Vec<f64>,
    /// The same with another instance's ranking news before each batch:
    /// the default bound (scores read again at most once a second), and no
    /// bound (read again at each batch).
    pub rank_after_news_ms: Vec<f64>,
    pub rank_reread_ms: Vec<f64>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Times `rounds` claim rounds at each of `sizes` (ascending) on the
/// database at `url` (migrated first), and `rounds` ranks of `rank_batch`
/// entries.
pub async fn measure(
    url: &str,
    sizes: &[i64],
    rank_batch: u64,
    rounds: usize,
) -> Result<Vec<SizeTiming>, String> {
    let store = Store::connect(url, 4)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    store.migrate().await.map_err(|e| format!("migrate: {e}"))?;
    let now = chrono::Utc::now().timestamp_millis();
    let (experience, template) = one_waiting_saga(&store, now).await?;
    let mut have = 1i64;
    let mut have_scores = 0i64;
    let mut out = Vec::new();
    for &queued in sizes {
        queue_sagas(&store, &template, have, queued, now).await?;
        have = queued + queued / 10;
        analyze(&store, "ANALYZE").await?;
        print_plan(&store, &experience, queued, now).await?;
        let (rounds_ms, list_ms) = claim_rounds(&store, queued, rounds, now).await?;
        // The ranking at the same size: as many visible entries as sagas
        // queued, and a batch of them ranked per round.
        store
            .insert_bulk_scores(
                &experience,
                &template.id,
                have_scores,
                queued - have_scores,
                now,
            )
            .await
            .map_err(|e| format!("insert {} ranking entries: {e}", queued - have_scores))?;
        have_scores = queued;
        analyze(&store, "ANALYZE score_attempts").await?;
        let rank_ms = rank_rounds(&store, &experience, rank_batch, rounds, false).await?;
        let rank_after_news_ms = rank_rounds(&store, &experience, rank_batch, rounds, true).await?;
        let rereading = store.clone().with_rank_refresh(std::time::Duration::ZERO);
        let rank_reread_ms = rank_rounds(&rereading, &experience, rank_batch, rounds, true).await?;
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

/// An experience of cap [`CAP`] with one terminal, one session and its
/// submitted saga, the template of the sagas queued: the experience's id
/// and the saga.
async fn one_waiting_saga(store: &Store, now: EpochMs) -> Result<(String, sagas::Model), String> {
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
                input: InputKind::Prompt,
                photo_max_px: 1536,
                max_photos_per_session: 5,
                guests: Default::default(),
                outputs: Default::default(),
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
    Ok((experience.id, template))
}

/// Queues sagas up to `queued` AI_PENDING (there are `have` rows), and a
/// tenth as many COMPLETED beside them.
async fn queue_sagas(
    store: &Store,
    template: &sagas::Model,
    have: i64,
    queued: i64,
    now: EpochMs,
) -> Result<(), String> {
    store
        .insert_bulk_sagas(template, have, queued - have, "AI_PENDING", now)
        .await
        .map_err(|e| format!("insert {} AI_PENDING sagas: {e}", queued - have))?;
    store
        .insert_bulk_sagas(template, queued, queued / 10, "COMPLETED", now)
        .await
        .map_err(|e| format!("insert {} COMPLETED sagas: {e}", queued / 10))?;
    Ok(())
}

/// What autovacuum does after such a load, on PostgreSQL; the server never
/// analyzes a SQLite file, so neither does the measurement.
async fn analyze(store: &Store, statement: &str) -> Result<(), String> {
    if store.is_postgres() {
        store
            .db()
            .execute_unprepared(statement)
            .await
            .map_err(|e| format!("{statement}: {e}"))?;
    }
    Ok(())
}

/// Prints the plan of the claim of the AI queue at this size.
async fn print_plan(
    store: &Store,
    experience: &str,
    queued: i64,
    now: EpochMs,
) -> Result<(), String> {
    let plan = store
        .claim_plan(
            experience,
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
    Ok(())
}

/// Times `rounds` claim rounds, each giving its slots back (untimed)
/// before the next: each round's time and its listing part.
async fn claim_rounds(
    store: &Store,
    queued: i64,
    rounds: usize,
    now: EpochMs,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let mut rounds_ms = Vec::with_capacity(rounds);
    let mut list_ms = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let at = now + 1 + round as i64;
        let start = Instant::now();
        let listed = store
            .experiences_with_claimable(at, RULES)
            .await
            .map_err(|e| format!("list claimable: {e}"))?;
        list_ms.push(ms(start.elapsed()));
        let mut claimed = Vec::new();
        for e in &listed {
            claimed.extend(
                store
                    .claim_runnable(e, 100, at, RULES)
                    .await
                    .map_err(|e| format!("claim: {e}"))?,
            );
        }
        rounds_ms.push(ms(start.elapsed()));
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
    Ok((rounds_ms, list_ms))
}

/// Times `rounds` ranks of a batch of `batch` entries of `experience`,
/// each after news from another instance when `news`.
async fn rank_rounds(
    store: &Store,
    experience: &str,
    batch_size: u64,
    rounds: usize,
    news: bool,
) -> Result<Vec<f64>, String> {
    let mut rank_ms = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let batch = store
            .some_entries(experience, batch_size)
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
        rank_ms.push(ms(start.elapsed()));
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
