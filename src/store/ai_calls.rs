//! The calls of a fan-out saga (`ai_calls`, one row per call): written the
//! moment a call's job is known and again the moment it is final, each
//! write fenced on the saga's lock token in the same short transaction
//! (rule 2), which also renews the lease and may lower the saga's `slots`
//! to the calls it still has to finish, so the AI slots it no longer needs
//! go back to the experience's other sagas, or raise them with the
//! experience's free slots while it has calls waiting for one.

use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder};

use super::entities::ai_calls;
use super::{Store, StoreResult};
use crate::domain::policy::{lease_until, EpochMs};
use crate::domain::saga::TransitionError;

/// A call's status.
pub const RUNNING: &str = "RUNNING";
pub const SUCCEEDED: &str = "SUCCEEDED";
pub const FAILED: &str = "FAILED";

/// What one call's row holds after a write.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRow {
    pub call_index: i32,
    pub attempts: i32,
    /// [`RUNNING`], [`SUCCEEDED`] or [`FAILED`].
    pub status: &'static str,
    pub job_id: Option<String>,
    pub submitted_at_ms: Option<i64>,
    /// The call's content list, JSON (SUCCEEDED).
    pub content: Option<String>,
    pub score: Option<f64>,
    pub error: Option<String>,
}

impl Store {
    /// The calls of a saga, in call order.
    pub async fn ai_calls_of(&self, saga_id: &str) -> StoreResult<Vec<ai_calls::Model>> {
        Ok(ai_calls::Entity::find()
            .filter(ai_calls::Column::SagaId.eq(saga_id))
            .order_by_asc(ai_calls::Column::CallIndex)
            .all(self.db())
            .await?)
    }

    /// Calls of a saga that are final (succeeded or failed).
    pub async fn ai_calls_done(&self, saga_id: &str) -> StoreResult<i64> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                "SELECT COUNT(*) FROM ai_calls WHERE saga_id = $1 AND status IN ('SUCCEEDED', 'FAILED')",
                vec![saga_id.into()],
            ))
            .await?;
        Ok(row
            .map(|r| r.try_get_by_index::<i64>(0))
            .transpose()?
            .unwrap_or(0))
    }

    /// Before a fan-out saga runs its calls (each time it starts or
    /// resumes; it also marks when its AI step began): copies the
    /// SUCCEEDED calls of its session's latest earlier saga that has calls
    /// (that saga copied those of the one before it), so a new submission
    /// re-runs only the calls that have no result. Does nothing when the
    /// saga has calls already (a resumed saga). Fenced on the lock token.
    pub async fn seed_ai_calls(
        &self,
        saga_id: &str,
        session_id: &str,
        token: &str,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        fence(&*tx, saga_id, token, None, now, lease_ms).await?;
        // The AI step's duration (`ai_duration_ms`, for the 202's estimate)
        // counts from the first run of its calls.
        tx.execute_raw(self.sql(
            "UPDATE sagas SET ai_submitted_at_ms = $2 WHERE id = $1 AND ai_submitted_at_ms IS NULL",
            vec![saga_id.into(), now.into()],
        ))
        .await?;
        tx.execute_raw(self.sql(
            "INSERT INTO ai_calls (saga_id, call_index, attempts, status, job_id, \
             submitted_at_ms, content, score, error, created_at_ms, updated_at_ms) \
             SELECT $1, c.call_index, c.attempts, c.status, c.job_id, c.submitted_at_ms, \
             c.content, c.score, NULL, $3, $3 FROM ai_calls c \
             WHERE c.status = 'SUCCEEDED' \
             AND NOT EXISTS (SELECT 1 FROM ai_calls o WHERE o.saga_id = $1) \
             AND c.saga_id = (SELECT s.id FROM sagas s WHERE s.session_id = $2 AND s.id <> $1 \
                 AND EXISTS (SELECT 1 FROM ai_calls p WHERE p.saga_id = s.id) \
                 ORDER BY s.created_at_ms DESC, s.id DESC LIMIT 1) \
             ON CONFLICT (saga_id, call_index) DO NOTHING",
            vec![saga_id.into(), session_id.into(), now.into()],
        ))
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Writes one call's row under the saga's fence. A SUCCEEDED row is
    /// never overwritten. `slots`: what the saga's slots should become:
    /// [`Slots::AtMost`] lowers them to the calls it has left;
    /// [`Slots::GrowTo`] also takes free slots of its experience, up to
    /// that many (the count and the change under the experience's claim
    /// lock on PostgreSQL, as the claim does, so the cap stays exact).
    /// Returns the saga's slots after the write: its worker may run that
    /// many calls at once.
    pub async fn write_ai_call(
        &self,
        saga_id: &str,
        token: &str,
        row: &CallRow,
        slots: Slots,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<i32> {
        let tx = self.write_tx().await?;
        let grow_to = match slots {
            Slots::GrowTo(n) => Some(n),
            _ => None,
        };
        let slots_at_most = match slots {
            Slots::AtMost(n) | Slots::GrowTo(n) => Some(n),
            Slots::Keep => None,
        };
        let experience = match grow_to {
            Some(_) => {
                let experience = tx
                    .query_one_raw(self.sql(
                        "SELECT s.experience_id, e.max_in_flight, e.provider, p.max_in_flight \
                         FROM sagas s JOIN experiences e ON e.id = s.experience_id \
                         LEFT JOIN providers p ON p.name = e.provider WHERE s.id = $1",
                        vec![saga_id.into()],
                    ))
                    .await?
                    .map(|r| {
                        Ok::<_, sea_orm::DbErr>((
                            r.try_get_by_index::<String>(0)?,
                            r.try_get_by_index::<i32>(1)?,
                            r.try_get_by_index::<String>(2)?,
                            r.try_get_by_index::<Option<i32>>(3)?,
                        ))
                    })
                    .transpose()?;
                if let (Some((_, _, provider, _)), true) = (&experience, self.is_postgres()) {
                    super::sagas::lock_provider(self, &tx, provider).await?;
                }
                experience
            }
            None => None,
        };
        let mut held = fence(&*tx, saga_id, token, slots_at_most, now, lease_ms).await?;
        if let (Some(want), Some((experience_id, max_in_flight, provider, provider_max))) =
            (grow_to, experience)
        {
            if held < want {
                // Free slots: under the experience's ceiling and, when the
                // provider has a shared cap, under that too.
                let free = match provider_max {
                    None => {
                        i64::from(max_in_flight)
                            - Store::in_flight(&*tx, &experience_id, now).await?.total()
                    }
                    Some(cap) => {
                        let all = Store::provider_in_flight(&*tx, &provider, now).await?;
                        let mine = all.get(&experience_id).copied().unwrap_or_default();
                        let total: i64 = all.values().map(|f| f.total()).sum();
                        std::cmp::min(
                            i64::from(max_in_flight) - mine.total(),
                            i64::from(cap) - total,
                        )
                    }
                };
                if free > 0 {
                    let grown = std::cmp::min(i64::from(want), i64::from(held) + free) as i32;
                    tx.execute_raw(self.sql(
                        "UPDATE sagas SET slots = $2 WHERE id = $1",
                        vec![saga_id.into(), grown.into()],
                    ))
                    .await?;
                    held = grown;
                }
            }
        }
        tx.execute_raw(self.sql(
            "INSERT INTO ai_calls (saga_id, call_index, attempts, status, job_id, \
             submitted_at_ms, content, score, error, created_at_ms, updated_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10) \
             ON CONFLICT (saga_id, call_index) DO UPDATE SET \
             attempts = excluded.attempts, status = excluded.status, job_id = excluded.job_id, \
             submitted_at_ms = excluded.submitted_at_ms, content = excluded.content, \
             score = excluded.score, error = excluded.error, updated_at_ms = excluded.updated_at_ms \
             WHERE ai_calls.status <> 'SUCCEEDED'",
            vec![
                saga_id.into(),
                row.call_index.into(),
                row.attempts.into(),
                row.status.into(),
                row.job_id.clone().into(),
                row.submitted_at_ms.into(),
                row.content.clone().into(),
                row.score.into(),
                row.error.clone().into(),
                now.into(),
            ],
        ))
        .await?;
        if let (FAILED, Some(job_id)) = (row.status, &row.job_id) {
            // Failed by its time running out while its job may still run:
            // the job keeps a slot until the provider says it is final
            // (rule 10), even if the saga goes on without it.
            let saga = tx
                .query_one_raw(self.sql(
                    "SELECT experience_id, deadline_at_ms FROM sagas WHERE id = $1",
                    vec![saga_id.into()],
                ))
                .await?;
            if let Some(saga) = saga {
                let experience_id: String = saga.try_get_by_index(0)?;
                let deadline: i64 = saga.try_get_by_index(1)?;
                let until = deadline.max(now) + self.linger_ms();
                super::providers::linger_job(&*tx, saga_id, &experience_id, job_id, until, now)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(held)
    }
}

/// What a call write does to the saga's AI slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slots {
    Keep,
    /// Lower them to at most this (the calls the saga has left).
    AtMost(i32),
    /// Lower them to at most this, or raise them towards it with the
    /// experience's free slots (the saga has calls waiting for a slot).
    GrowTo(i32),
}

/// The fence of a call write: the saga is AI_PENDING and we hold its lock
/// token. Renews the lease, and lowers `slots` to `slots_at_most` if given.
/// Returns the saga's slots.
async fn fence<C: ConnectionTrait>(
    conn: &C,
    saga_id: &str,
    token: &str,
    slots_at_most: Option<i32>,
    now: EpochMs,
    lease_ms: i64,
) -> StoreResult<i32> {
    let cap = slots_at_most.unwrap_or(i32::MAX).max(0);
    let updated = conn
        .query_one_raw(super::sql_for(
            conn.get_database_backend(),
            "UPDATE sagas SET locked_until_ms = $3, updated_at_ms = $4, \
             slots = CASE WHEN slots > $5 THEN $5 ELSE slots END \
             WHERE id = $1 AND lock_token = $2 AND step = 'AI_PENDING' RETURNING slots",
            vec![
                saga_id.into(),
                token.into(),
                lease_until(now, lease_ms).into(),
                now.into(),
                cap.into(),
            ],
        ))
        .await?;
    match updated {
        Some(row) => Ok(row.try_get_by_index::<i32>(0)?),
        None => Err(TransitionError::LeaseLost.into()),
    }
}
