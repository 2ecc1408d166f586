//! The terminal outbox: events written in the same transaction that ends a
//! saga, numbered with a per-terminal `seq`, so a display that reconnects with
//! its last seen `seq` loses nothing.

use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, ExprTrait, QueryFilter, QueryOrder, QuerySelect};
use serde_json::Value;

use super::entities::{sessions, terminal_events, terminals};
use super::{Store, StoreError, StoreResult, WriteTx};
use crate::domain::policy::EpochMs;
use crate::domain::saga::AbortReason;

/// One event for one terminal; `payload` already carries `type` and `seq`.
#[derive(Debug, Clone, PartialEq)]
pub struct TerminalEvent {
    pub terminal_id: String,
    pub seq: i64,
    pub payload: Value,
}

impl Store {
    /// Appends an event inside the caller's transaction: takes the terminal's
    /// next `seq` (the row update also serialises concurrent appends for the
    /// same terminal) and stores the payload with `seq` set.
    pub(crate) async fn append_event(
        tx: &WriteTx,
        terminal_id: &str,
        session_id: &str,
        saga_id: &str,
        mut payload: Value,
        now: EpochMs,
    ) -> StoreResult<TerminalEvent> {
        terminals::Entity::update_many()
            .col_expr(
                terminals::Column::LastSeq,
                Expr::col(terminals::Column::LastSeq).add(1),
            )
            .filter(terminals::Column::Id.eq(terminal_id))
            .exec(&**tx)
            .await?;
        let terminal = terminals::Entity::find_by_id(terminal_id.to_owned())
            .one(&**tx)
            .await?
            .ok_or(StoreError::NotFound("terminal"))?;
        let seq = terminal.last_seq;
        payload["seq"] = seq.into();
        let event_type = payload["type"]
            .as_str()
            .unwrap_or("session.event")
            .to_owned();
        terminal_events::Entity::insert(terminal_events::ActiveModel {
            id: sea_orm::ActiveValue::NotSet,
            terminal_id: sea_orm::ActiveValue::Set(terminal_id.to_owned()),
            seq: sea_orm::ActiveValue::Set(seq),
            session_id: sea_orm::ActiveValue::Set(session_id.to_owned()),
            saga_id: sea_orm::ActiveValue::Set(saga_id.to_owned()),
            event_type: sea_orm::ActiveValue::Set(event_type),
            payload: sea_orm::ActiveValue::Set(payload.to_string()),
            created_at_ms: sea_orm::ActiveValue::Set(now),
        })
        .exec(&**tx)
        .await?;
        Ok(TerminalEvent {
            terminal_id: terminal_id.to_owned(),
            seq,
            payload,
        })
    }

    /// Writes `payload` to the outbox of the session's terminal, inside the
    /// caller's transaction; `None` when the session has no terminal.
    pub(crate) async fn announce(
        tx: &WriteTx,
        session: &sessions::Model,
        saga_id: &str,
        payload: Value,
        now: EpochMs,
    ) -> StoreResult<Option<TerminalEvent>> {
        match &session.terminal_id {
            Some(terminal_id) => Ok(Some(
                Self::append_event(tx, terminal_id, &session.id, saga_id, payload, now).await?,
            )),
            None => Ok(None),
        }
    }

    /// Events of a terminal with `seq > after`, oldest first.
    pub async fn events_after(
        &self,
        terminal_id: &str,
        after: i64,
        limit: u64,
    ) -> StoreResult<Vec<TerminalEvent>> {
        let rows = terminal_events::Entity::find()
            .filter(terminal_events::Column::TerminalId.eq(terminal_id))
            .filter(terminal_events::Column::Seq.gt(after))
            .order_by_asc(terminal_events::Column::Seq)
            .limit(limit)
            .all(self.db())
            .await?;
        rows.into_iter()
            .map(|row| {
                let payload = serde_json::from_str(&row.payload)
                    .map_err(|e| StoreError::Corrupt(format!("event {}: {e}", row.id)))?;
                Ok(TerminalEvent {
                    terminal_id: row.terminal_id,
                    seq: row.seq,
                    payload,
                })
            })
            .collect()
    }

    /// Deletes outbox events older than `before`; returns how many.
    pub async fn purge_events_before(&self, before: EpochMs) -> StoreResult<u64> {
        let tx = self.write_tx().await?;
        let n = terminal_events::Entity::delete_many()
            .filter(terminal_events::Column::CreatedAtMs.lt(before))
            .exec(&*tx)
            .await?
            .rows_affected;
        tx.commit().await?;
        Ok(n)
    }
}

/// The `session.rejected` / `session.aborted` event of a session.
pub(crate) fn aborted_payload(session: &sessions::Model, reason: AbortReason) -> Value {
    serde_json::json!({
        "type": reason.event_type(),
        "session_id": session.id,
        "nickname": session.nickname,
        "reason": reason.as_str(),
        "message": reason.human_message(),
    })
}
