//! The AI providers as the database knows them, and the jobs that linger
//! after their saga.
//!
//! - `providers`: each instance writes its providers at start
//!   ([`Store::register_providers`]); the claim reads a provider's
//!   `max_in_flight` with its experiences, and experience creation checks
//!   that a named provider exists. Every instance must be given the same
//!   providers file: the last one to start wins.
//! - `lingering_jobs`: a job that may still run at the provider after its
//!   saga ended without it (rule 10). It is written in the transaction
//!   that ends the saga (or fails the call), so no crash can lose it; it
//!   counts as one slot of its experience and provider (see
//!   `Store::in_flight`) until the lingering-jobs actor hears from the
//!   provider that it is final (or cancelled it), and at the longest until
//!   `until_ms`: the saga's deadline or `AI_TIMEOUT` from the end,
//!   whichever is later. Any instance takes a row with a short lease to
//!   cancel or poll it, so a crash of the one that holds it delays it by
//!   one lease.

use sea_orm::ConnectionTrait;

use super::entities::sagas;
use super::{new_id, Store, StoreResult};
use crate::ai::providers::ProviderSpec;
use crate::domain::policy::EpochMs;

/// A provider as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderRow {
    pub name: String,
    pub kind: String,
    pub max_in_flight: Option<i32>,
    pub rate_limit: Option<String>,
}

/// A lingering job taken to be cancelled or polled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LingeringJob {
    pub provider: String,
    pub job_id: String,
    pub saga_id: String,
    pub until_ms: EpochMs,
    pub cancel_tried: bool,
    /// The lease this taker holds it under.
    pub token: String,
}

/// One experience's part of a provider, for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExperienceShare {
    pub slug: String,
    pub weight: i32,
    pub max_in_flight: i32,
    /// Slots in use: held, expired and lingering (see `InFlight`).
    pub in_flight: i64,
    /// AI_PENDING sagas waiting for a slot (queued, backing off, or whose
    /// lease ran out).
    pub queued: i64,
}

impl Store {
    /// Writes this instance's providers (a provider no longer configured
    /// stays: its experiences' sagas wait, and the dispatcher says why).
    pub async fn register_providers(
        &self,
        specs: &[ProviderSpec],
        now: EpochMs,
    ) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        for spec in specs {
            tx.execute_raw(self.sql(
                "INSERT INTO providers (name, kind, max_in_flight, rate_limit, updated_at_ms) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO UPDATE SET \
                 kind = excluded.kind, max_in_flight = excluded.max_in_flight, \
                 rate_limit = excluded.rate_limit, updated_at_ms = excluded.updated_at_ms",
                vec![
                    spec.name.clone().into(),
                    spec.kind_name().into(),
                    spec.max_in_flight.into(),
                    spec.rate_limit_text().into(),
                    now.into(),
                ],
            ))
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Every provider, by name.
    pub async fn providers(&self) -> StoreResult<Vec<ProviderRow>> {
        let rows = self
            .db()
            .query_all_raw(self.sql(
                "SELECT name, kind, max_in_flight, rate_limit FROM providers ORDER BY name",
                vec![],
            ))
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ProviderRow {
                    name: r.try_get_by_index(0)?,
                    kind: r.try_get_by_index(1)?,
                    max_in_flight: r.try_get_by_index(2)?,
                    rate_limit: r.try_get_by_index(3)?,
                })
            })
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(Into::into)
    }

    /// The experiences on `provider`, oldest first, with their slots in use
    /// and their queues.
    pub async fn provider_shares(
        &self,
        provider: &str,
        now: EpochMs,
    ) -> StoreResult<Vec<(String, ExperienceShare)>> {
        let in_flight = Store::provider_in_flight(self.db(), provider, now).await?;
        let runnable = super::sagas::RUNNABLE;
        let rows = self
            .db()
            .query_all_raw(self.sql(
                &format!(
                    "SELECT e.id, e.slug, e.weight, e.max_in_flight, \
                     (SELECT COUNT(*) FROM sagas s WHERE s.experience_id = e.id \
                      AND {runnable} AND s.step = 'AI_PENDING' \
                      AND (s.lock_token IS NULL OR s.locked_until_ms < $2)) \
                     FROM experiences e WHERE e.provider = $1 ORDER BY e.created_at_ms, e.id"
                ),
                vec![provider.into(), now.into()],
            ))
            .await?;
        rows.iter()
            .map(|r| {
                let id: String = r.try_get_by_index(0)?;
                let used = in_flight.get(&id).map(|f| f.total()).unwrap_or(0);
                Ok((
                    id,
                    ExperienceShare {
                        slug: r.try_get_by_index(1)?,
                        weight: r.try_get_by_index(2)?,
                        max_in_flight: r.try_get_by_index(3)?,
                        in_flight: used,
                        queued: r.try_get_by_index(4)?,
                    },
                ))
            })
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(Into::into)
    }

    /// Takes up to `limit` lingering jobs nobody holds (or whose taker's
    /// lease ran out), each for `lease_ms`.
    pub async fn take_lingering(
        &self,
        limit: usize,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<Vec<LingeringJob>> {
        // Mostly there are none: a read says so without a write
        // transaction (SQLite's one writer is not taken every second).
        let due = self
            .db()
            .query_one_raw(self.sql(
                "SELECT 1 FROM lingering_jobs WHERE locked_until_ms < $1 LIMIT 1",
                vec![now.into()],
            ))
            .await?;
        if due.is_none() {
            return Ok(Vec::new());
        }
        let token = new_id();
        let lock = if self.is_postgres() {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        let tx = self.write_tx().await?;
        let rows = tx
            .query_all_raw(self.sql(
                &format!(
                    "WITH picked AS MATERIALIZED (SELECT provider, job_id FROM lingering_jobs \
                     WHERE locked_until_ms < $1 ORDER BY locked_until_ms, created_at_ms \
                     LIMIT $2{lock}) \
                     UPDATE lingering_jobs SET lock_token = $3, locked_until_ms = $4 \
                     WHERE (provider, job_id) IN (SELECT provider, job_id FROM picked) \
                     AND locked_until_ms < $1 \
                     RETURNING provider, job_id, saga_id, until_ms, cancel_tried"
                ),
                vec![
                    now.into(),
                    (limit as i64).into(),
                    token.clone().into(),
                    (now + lease_ms).into(),
                ],
            ))
            .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| {
                Ok(LingeringJob {
                    provider: r.try_get_by_index(0)?,
                    job_id: r.try_get_by_index(1)?,
                    saga_id: r.try_get_by_index(2)?,
                    until_ms: r.try_get_by_index(3)?,
                    cancel_tried: r.try_get_by_index(4)?,
                    token: token.clone(),
                })
            })
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(Into::into)
    }

    /// The job is final (or given up): its slot is free. Fenced on the
    /// taker's lease; true when it was still ours.
    pub async fn release_lingering(&self, job: &LingeringJob) -> StoreResult<bool> {
        let n = self
            .write_one(self.sql(
                "DELETE FROM lingering_jobs WHERE provider = $1 AND job_id = $2 AND lock_token = $3",
                vec![
                    job.provider.clone().into(),
                    job.job_id.clone().into(),
                    job.token.clone().into(),
                ],
            ))
            .await?;
        Ok(n == 1)
    }

    /// The job still runs: ask again at `next_ms` (its lease runs until
    /// then), and never cancel it twice.
    pub async fn lingering_later(
        &self,
        job: &LingeringJob,
        cancel_tried: bool,
        next_ms: EpochMs,
    ) -> StoreResult<()> {
        self.write_one(self.sql(
            "UPDATE lingering_jobs SET cancel_tried = $4, locked_until_ms = $5 \
             WHERE provider = $1 AND job_id = $2 AND lock_token = $3",
            vec![
                job.provider.clone().into(),
                job.job_id.clone().into(),
                job.token.clone().into(),
                cancel_tried.into(),
                next_ms.into(),
            ],
        ))
        .await?;
        Ok(())
    }

    /// Where an AI_PENDING saga waiting for a slot stands in its
    /// experience's queue (1: next); None while it holds a slot.
    pub async fn queue_position(
        &self,
        saga: &sagas::Model,
        now: EpochMs,
    ) -> StoreResult<Option<i64>> {
        let waiting = saga.lock_token.is_none() || saga.locked_until_ms.is_some_and(|t| t < now);
        if !waiting {
            return Ok(None);
        }
        let runnable = super::sagas::RUNNABLE;
        let row = self
            .db()
            .query_one_raw(self.sql(
                &format!(
                    "SELECT COUNT(*) FROM sagas WHERE experience_id = $1 AND {runnable} \
                     AND step = 'AI_PENDING' AND (lock_token IS NULL OR locked_until_ms < $2) \
                     AND (created_at_ms < $3 OR (created_at_ms = $3 AND id < $4))"
                ),
                vec![
                    saga.experience_id.clone().into(),
                    now.into(),
                    saga.created_at_ms.into(),
                    saga.id.clone().into(),
                ],
            ))
            .await?;
        let ahead = row
            .map(|r| r.try_get_by_index::<i64>(0))
            .transpose()?
            .unwrap_or(0);
        Ok(Some(ahead + 1))
    }

    /// Lingering jobs now (for tests and operators).
    pub async fn lingering_count(&self) -> StoreResult<i64> {
        let row = self
            .db()
            .query_one_raw(self.sql("SELECT COUNT(*) FROM lingering_jobs", vec![]))
            .await?;
        Ok(row
            .map(|r| r.try_get_by_index::<i64>(0))
            .transpose()?
            .unwrap_or(0))
    }
}

/// In the transaction that aborts `saga` (just read back, ABORTED from
/// AI_PENDING): its jobs that may still run linger, one slot each. A
/// fan-out's are its RUNNING calls with a job; a single call's is the
/// saga's `ai_job_id`.
pub(super) async fn linger_jobs_of<C: ConnectionTrait>(
    conn: &C,
    saga: &sagas::Model,
    now: EpochMs,
    linger_ms: i64,
) -> StoreResult<u64> {
    let until = saga.deadline_at_ms.max(now) + linger_ms;
    let backend = conn.get_database_backend();
    let from_calls = conn
        .execute_raw(super::sql_for(
            backend,
            "INSERT INTO lingering_jobs (provider, job_id, saga_id, experience_id, until_ms, \
             locked_until_ms, cancel_tried, created_at_ms) \
             SELECT e.provider, c.job_id, c.saga_id, e.id, $2, 0, false, $3 \
             FROM ai_calls c JOIN experiences e ON e.id = $4 \
             WHERE c.saga_id = $1 AND c.status = 'RUNNING' AND c.job_id IS NOT NULL \
             ON CONFLICT (provider, job_id) DO NOTHING",
            vec![
                saga.id.clone().into(),
                until.into(),
                now.into(),
                saga.experience_id.clone().into(),
            ],
        ))
        .await?
        .rows_affected();
    let Some(job_id) = &saga.ai_job_id else {
        return Ok(from_calls);
    };
    let single = linger_job(conn, &saga.id, &saga.experience_id, job_id, until, now).await?;
    Ok(from_calls + single)
}

/// One job lingers (see [`linger_jobs_of`]); `until`: its last moment.
pub(super) async fn linger_job<C: ConnectionTrait>(
    conn: &C,
    saga_id: &str,
    experience_id: &str,
    job_id: &str,
    until: EpochMs,
    now: EpochMs,
) -> StoreResult<u64> {
    Ok(conn
        .execute_raw(super::sql_for(
            conn.get_database_backend(),
            "INSERT INTO lingering_jobs (provider, job_id, saga_id, experience_id, until_ms, \
             locked_until_ms, cancel_tried, created_at_ms) \
             SELECT e.provider, $2, $1, e.id, $4, 0, false, $5 FROM experiences e WHERE e.id = $3 \
             ON CONFLICT (provider, job_id) DO NOTHING",
            vec![
                saga_id.into(),
                job_id.into(),
                experience_id.into(),
                until.into(),
                now.into(),
            ],
        ))
        .await?
        .rows_affected())
}
