//! Idempotency records: one row per (scope, key). Taking a key is a single
//! `INSERT ... ON CONFLICT DO NOTHING`, so a duplicate request learns at once
//! that the first is still in progress and never waits on a lock.

use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

use super::entities::idempotency_records as records;
use super::{Store, StoreResult};
use crate::domain::policy::EpochMs;

const IN_PROGRESS: &str = "in_progress";
const COMPLETED: &str = "completed";

/// What a request finds when it takes its key.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyClaim {
    /// First use: go ahead, then `finish_key` or `release_key`.
    Fresh,
    /// The same request finished before: answer this again.
    Replay { status: u16, body: String },
    /// The same request is still running.
    InProgress,
    /// The key was used with another body.
    Mismatch,
}

impl Store {
    pub async fn claim_key(
        &self,
        scope: &str,
        key: &str,
        request_hash: &str,
        now: EpochMs,
        ttl_ms: i64,
    ) -> StoreResult<KeyClaim> {
        // An expired record does not count: drop it first.
        self.write_one(self.sql(
            "DELETE FROM idempotency_records WHERE scope = $1 AND key = $2 AND expires_at_ms < $3",
            vec![scope.into(), key.into(), now.into()],
        ))
        .await?;
        let inserted = self
            .write_one(self.sql(
                "INSERT INTO idempotency_records \
                 (scope, key, request_hash, state, response_status, response_body, created_at_ms, expires_at_ms) \
                 VALUES ($1, $2, $3, $4, NULL, NULL, $5, $6) ON CONFLICT (scope, key) DO NOTHING",
                vec![
                    scope.into(),
                    key.into(),
                    request_hash.into(),
                    IN_PROGRESS.into(),
                    now.into(),
                    (now + ttl_ms).into(),
                ],
            ))
            .await?;
        if inserted == 1 {
            return Ok(KeyClaim::Fresh);
        }
        let Some(record) = records::Entity::find_by_id((scope.to_owned(), key.to_owned()))
            .one(self.db())
            .await?
        else {
            // Deleted between our insert and read (expired and purged): the
            // caller may simply try again.
            return Ok(KeyClaim::InProgress);
        };
        Ok(if record.request_hash != request_hash {
            KeyClaim::Mismatch
        } else if record.state == COMPLETED {
            KeyClaim::Replay {
                status: record.response_status.unwrap_or(200) as u16,
                body: record.response_body.unwrap_or_default(),
            }
        } else {
            KeyClaim::InProgress
        })
    }

    /// Stores the answer so a repeat gets it again.
    pub async fn finish_key(
        &self,
        scope: &str,
        key: &str,
        status: u16,
        body: &str,
    ) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        records::Entity::update_many()
            .col_expr(records::Column::State, Expr::value(COMPLETED))
            .col_expr(records::Column::ResponseStatus, Expr::value(status as i32))
            .col_expr(records::Column::ResponseBody, Expr::value(body))
            .filter(records::Column::Scope.eq(scope))
            .filter(records::Column::Key.eq(key))
            .exec(&*tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Forgets a key whose request failed in a way worth retrying (5xx).
    pub async fn release_key(&self, scope: &str, key: &str) -> StoreResult<()> {
        self.write_one(self.sql(
            "DELETE FROM idempotency_records WHERE scope = $1 AND key = $2 AND state = $3",
            vec![scope.into(), key.into(), IN_PROGRESS.into()],
        ))
        .await?;
        Ok(())
    }

    pub async fn purge_expired_keys(&self, now: EpochMs) -> StoreResult<u64> {
        self.write_one(self.sql(
            "DELETE FROM idempotency_records WHERE expires_at_ms < $1",
            vec![now.into()],
        ))
        .await
    }
}
