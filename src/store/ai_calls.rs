//! The calls of a fan-out saga (`ai_calls`, one row per call): written the
//! moment a call's job is known and again the moment it is final, each
//! write fenced on the saga's lock token in the same short transaction
//! (rule 2), which also renews the lease and changes the call's slot in
//! the ledger ([`CallSlot`]: its job bound, its next key, freed on
//! evidence, or detached while its job may still run), and may take free
//! slots for the saga's calls that wait for one (see
//! [`super::ledger::take_free_slots`]).

use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder};

use super::entities::{ai_calls, sagas};
use super::ledger::{self, Wanted};
use super::{Store, StoreResult, WriteTx};
use crate::domain::ledger::Evidence;
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
        fence(&*tx, saga_id, token, now, lease_ms).await?;
        // The AI step's duration (`ai_duration_ms`, for the 202's estimate)
        // counts from the first run of its calls.
        tx.execute_raw(self.sql(
            "UPDATE sagas SET ai_submitted_at_ms = $2 WHERE id = $1 AND ai_submitted_at_ms IS NULL",
            vec![saga_id.into(), now.into()],
        ))
        .await?;
        seed_calls(&*tx, saga_id, session_id, now).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Writes one call's row under the saga's fence, with what it does to
    /// the call's slot in the ledger (`slot`), and takes free slots for
    /// the calls in `want` (`(call index, key attempt)`: calls waiting for
    /// a slot, in the order they should start). A SUCCEEDED row is never
    /// overwritten. Returns the calls of `want` that got a slot.
    #[allow(clippy::too_many_arguments)]
    pub async fn write_ai_call(
        &self,
        saga_id: &str,
        token: &str,
        row: &CallRow,
        slot: CallSlot,
        want: &Wanted,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<Vec<i32>> {
        let tx = self.write_tx().await?;
        fence(&*tx, saga_id, token, now, lease_ms).await?;
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
        let call = row.call_index;
        match slot {
            CallSlot::Keep => {}
            CallSlot::BindJob(job_id) => {
                ledger::bind_job(&*tx, saga_id, call, &job_id, now).await?
            }
            CallSlot::Rekey(key_attempt, evidence) => {
                ledger::rekey(&*tx, saga_id, call, key_attempt, evidence, now).await?
            }
            CallSlot::Free(evidence) => {
                ledger::free_calls(&*tx, saga_id, &[call], evidence).await?;
            }
            CallSlot::Detach => {
                ledger::detach_calls(&*tx, saga_id, Some(&[call]), now).await?;
            }
        }
        let granted = ledger::take_free_slots(self, &tx, saga_id, want, now).await?;
        tx.commit().await?;
        Ok(granted)
    }

    /// Takes free slots for the calls in `want` (see [`Self::write_ai_call`])
    /// under the saga's fence, with no call to write: a worker that holds
    /// no slot for the calls it has to run.
    pub async fn take_slots(
        &self,
        saga_id: &str,
        token: &str,
        want: &Wanted,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<Vec<i32>> {
        let tx = self.write_tx().await?;
        fence(&*tx, saga_id, token, now, lease_ms).await?;
        let granted = ledger::take_free_slots(self, &tx, saga_id, want, now).await?;
        tx.commit().await?;
        Ok(granted)
    }

    /// In the claim's transaction, for a fan-out saga just claimed: its
    /// session's earlier results are copied first (see
    /// [`Self::seed_ai_calls`]), then the first `slots` of its calls that
    /// have no result, each with the key attempt its next submit uses.
    pub(super) async fn calls_to_reserve(
        &self,
        tx: &WriteTx,
        saga: &sagas::Model,
        ai_calls: i32,
        slots: i32,
        now: EpochMs,
    ) -> StoreResult<Vec<(i32, i32)>> {
        seed_calls(&**tx, &saga.id, &saga.session_id, now).await?;
        let rows = tx
            .query_all_raw(self.sql(
                "SELECT call_index, attempts, status FROM ai_calls WHERE saga_id = $1",
                vec![saga.id.clone().into()],
            ))
            .await?;
        let mut attempts = std::collections::HashMap::new();
        for r in rows {
            let index: i32 = r.try_get_by_index(0)?;
            let tries: i32 = r.try_get_by_index(1)?;
            let status: String = r.try_get_by_index(2)?;
            attempts.insert(index, (tries, status == RUNNING));
        }
        Ok((0..ai_calls)
            .filter_map(|i| match attempts.get(&i) {
                None => Some((i, saga.attempt_offset)),
                Some(&(tries, true)) => Some((i, saga.attempt_offset + tries)),
                Some(_) => None,
            })
            .take(slots.max(0) as usize)
            .collect())
    }
}

/// What a call write does to the call's slot in the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallSlot {
    /// Nothing (the call goes on with the same job and key).
    Keep,
    /// Its job is known: this id.
    BindJob(String),
    /// Its job is final (the evidence) and its next attempt's submit uses
    /// the key of this attempt, in the same slot.
    Rekey(i32, Evidence),
    /// The call is done with its slot and no job runs in it.
    Free(Evidence),
    /// The call is done for the saga but its job may still run: the slot
    /// stays, detached, until an instance that adopts it sees the job end.
    Detach,
}

/// Copies the SUCCEEDED calls of the session's latest earlier saga that has
/// calls into `saga_id`, unless it has calls already.
async fn seed_calls<C: ConnectionTrait>(
    conn: &C,
    saga_id: &str,
    session_id: &str,
    now: EpochMs,
) -> StoreResult<()> {
    conn.execute_raw(super::sql_for(
        conn.get_database_backend(),
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
    Ok(())
}

/// The fence of a call write: the saga is AI_PENDING and we hold its lock
/// token. Renews the lease.
async fn fence<C: ConnectionTrait>(
    conn: &C,
    saga_id: &str,
    token: &str,
    now: EpochMs,
    lease_ms: i64,
) -> StoreResult<()> {
    let updated = conn
        .execute_raw(super::sql_for(
            conn.get_database_backend(),
            "UPDATE sagas SET locked_until_ms = $3, updated_at_ms = $4 \
             WHERE id = $1 AND lock_token = $2 AND step = 'AI_PENDING'",
            vec![
                saga_id.into(),
                token.into(),
                lease_until(now, lease_ms).into(),
                now.into(),
            ],
        ))
        .await?
        .rows_affected();
    if updated == 1 {
        Ok(())
    } else {
        Err(TransitionError::LeaseLost.into())
    }
}
