//! The terminal outbox. The transaction that ends a saga appends its event
//! unnumbered (`seq` NULL), so ending a saga takes no lock that the sagas of
//! one terminal share. The outbox relay then numbers committed events in
//! batches ([`Store::number_events`]), and displays read numbered events by
//! `seq` ([`Store::events_after`]).
//!
//! Why the numbering is safe: numbering transactions never overlap (an
//! advisory transaction lock on PostgreSQL, taken before the statement
//! that reads and numbers; the write gate on SQLite), each
//! numbers only events that were already committed when it read them, and it
//! continues each terminal's `last_seq`. The numbers a batch hands out become
//! visible together at its commit, after every lower number (an earlier
//! batch committed before this one could start). So a reader that sees `seq`
//! N has every lower `seq` visible too, and a display that has seen N never
//! later receives N or lower.

use std::collections::HashMap;

use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde_json::Value;

use super::entities::{sessions, terminal_events};
use super::rows::{SqlType, ValueRows};
use super::{Store, StoreError, StoreResult, WriteTx};
use crate::domain::locale::Locale;
use crate::domain::policy::EpochMs;
use crate::domain::saga::AbortReason;

/// Key of the PostgreSQL advisory lock that serialises numbering batches
/// across instances ("stagehand outbox relay").
const RELAY_LOCK: i64 = 0x5354_4147_4548_5201;

/// One numbered event of one terminal; `payload` carries `type` and `seq`.
#[derive(Debug, Clone, PartialEq)]
pub struct TerminalEvent {
    pub terminal_id: String,
    pub seq: i64,
    pub payload: Value,
}

/// What one numbering batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NumberedBatch {
    /// Events numbered.
    pub events: usize,
    /// Terminals that got new events, each once.
    pub terminals: Vec<String>,
}

impl Store {
    /// An unnumbered outbox row, to append with [`Store::append_events`].
    pub(crate) fn event_row(
        terminal_id: &str,
        session_id: &str,
        saga_id: &str,
        payload: Value,
        now: EpochMs,
    ) -> terminal_events::ActiveModel {
        let event_type = payload["type"]
            .as_str()
            .unwrap_or("session.event")
            .to_owned();
        terminal_events::ActiveModel {
            id: sea_orm::ActiveValue::NotSet,
            terminal_id: sea_orm::ActiveValue::Set(terminal_id.to_owned()),
            seq: sea_orm::ActiveValue::Set(None),
            session_id: sea_orm::ActiveValue::Set(session_id.to_owned()),
            saga_id: sea_orm::ActiveValue::Set(saga_id.to_owned()),
            event_type: sea_orm::ActiveValue::Set(event_type),
            payload: sea_orm::ActiveValue::Set(payload.to_string()),
            created_at_ms: sea_orm::ActiveValue::Set(now),
        }
    }

    /// Appends unnumbered events inside the caller's transaction, in one
    /// statement.
    pub(crate) async fn append_events(
        tx: &WriteTx,
        rows: Vec<terminal_events::ActiveModel>,
    ) -> StoreResult<()> {
        if !rows.is_empty() {
            super::rows::insert_models(&**tx, rows).await?;
        }
        Ok(())
    }

    /// Writes `payload` to the outbox of the session's terminal, inside the
    /// caller's transaction. True when an event was written (false: the
    /// session has no terminal).
    pub(crate) async fn announce(
        tx: &WriteTx,
        session: &sessions::Model,
        saga_id: &str,
        payload: Value,
        now: EpochMs,
    ) -> StoreResult<bool> {
        match &session.terminal_id {
            Some(terminal_id) => {
                let row = Self::event_row(terminal_id, &session.id, saga_id, payload, now);
                Self::append_events(tx, vec![row]).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Numbers up to `limit` committed, unnumbered events, oldest first, in
    /// one short transaction: each terminal's events continue its `last_seq`
    /// without gaps. Returns what was numbered; fewer than `limit` events
    /// means the outbox was drained when the batch read it.
    pub async fn number_events(&self, limit: u64) -> StoreResult<NumberedBatch> {
        if self.is_postgres() {
            return self.number_events_at_once(limit).await;
        }
        let tx = self.write_tx().await?;
        let rows = tx
            .query_all_raw(self.sql(
                "SELECT id, terminal_id FROM terminal_events WHERE seq IS NULL ORDER BY id LIMIT $1",
                vec![(limit as i64).into()],
            ))
            .await?;
        if rows.is_empty() {
            return Ok(NumberedBatch::default());
        }
        // Event ids per terminal, in id order; terminals in first-seen order.
        let mut terminals: Vec<String> = Vec::new();
        let mut ids: HashMap<String, Vec<i64>> = HashMap::new();
        for row in &rows {
            let id: i64 = row.try_get_by_index(0)?;
            let terminal: String = row.try_get_by_index(1)?;
            ids.entry(terminal.clone())
                .or_insert_with(|| {
                    terminals.push(terminal);
                    Vec::new()
                })
                .push(id);
        }

        // Reserve each terminal's numbers: one UPDATE for the whole batch.
        let mut reserved = ValueRows::new(&[SqlType::Text, SqlType::BigInt]);
        for terminal in &terminals {
            reserved.push([terminal.clone().into(), (ids[terminal].len() as i64).into()]);
        }
        let mut values = Vec::new();
        let reserved = reserved.source(self.backend(), 1, &mut values);
        let bumped = tx
            .query_all_raw(self.sql(
                &format!(
                    "WITH v(id, n) AS ({reserved}) \
                     UPDATE terminals SET last_seq = last_seq + v.n FROM v \
                     WHERE terminals.id = v.id \
                     RETURNING terminals.id, terminals.last_seq"
                ),
                values,
            ))
            .await?;
        let mut last_seq: HashMap<String, i64> = HashMap::with_capacity(bumped.len());
        for row in &bumped {
            last_seq.insert(row.try_get_by_index(0)?, row.try_get_by_index(1)?);
        }

        // Hand the numbers out in id order: one UPDATE for the whole batch.
        let mut numbers = ValueRows::new(&[SqlType::BigInt, SqlType::BigInt]);
        for terminal in &terminals {
            let ids = &ids[terminal];
            let last = *last_seq.get(terminal).ok_or_else(|| {
                StoreError::Corrupt(format!("outbox event for unknown terminal {terminal}"))
            })?;
            let first = last - ids.len() as i64 + 1;
            for (offset, id) in ids.iter().enumerate() {
                numbers.push([(*id).into(), (first + offset as i64).into()]);
            }
        }
        let mut values = Vec::new();
        let numbers = numbers.source(self.backend(), 1, &mut values);
        tx.execute_raw(self.sql(
            &format!(
                "WITH v(id, seq) AS ({numbers}) \
                 UPDATE terminal_events SET seq = v.seq FROM v \
                 WHERE terminal_events.id = v.id"
            ),
            values,
        ))
        .await?;
        tx.commit().await?;
        Ok(NumberedBatch {
            events: rows.len(),
            terminals,
        })
    }

    /// [`Self::number_events`] on PostgreSQL: under the relay's advisory
    /// lock, one statement reads the batch, reserves each terminal's
    /// numbers and hands them out, so the lock is held for that statement
    /// and the `COMMIT` (two round trips, not four): another instance's
    /// relay waits for it that much less. The statement runs after the
    /// lock was granted, so its snapshot sees every batch committed before.
    async fn number_events_at_once(&self, limit: u64) -> StoreResult<NumberedBatch> {
        let tx = self.write_tx().await?;
        tx.execute_raw(self.sql("SELECT pg_advisory_xact_lock($1)", vec![RELAY_LOCK.into()]))
            .await?;
        // `k`: an event's place among its terminal's events of the batch
        // (id order); `n`: how many its terminal has in the batch.
        let rows = tx
            .query_all_raw(self.sql(
                "WITH picked AS MATERIALIZED (SELECT id, terminal_id, \
                 row_number() OVER (PARTITION BY terminal_id ORDER BY id) AS k, \
                 count(*) OVER (PARTITION BY terminal_id) AS n \
                 FROM (SELECT id, terminal_id FROM terminal_events WHERE seq IS NULL \
                 ORDER BY id LIMIT $1) batch), \
                 bumped AS (UPDATE terminals t SET last_seq = t.last_seq + c.n \
                 FROM (SELECT terminal_id, COUNT(*) AS n FROM picked GROUP BY terminal_id) c \
                 WHERE t.id = c.terminal_id RETURNING t.id, t.last_seq), \
                 numbered AS (UPDATE terminal_events e SET seq = b.last_seq - p.n + p.k \
                 FROM picked p JOIN bumped b ON b.id = p.terminal_id \
                 WHERE e.id = p.id RETURNING e.id, e.terminal_id) \
                 SELECT p.terminal_id, COUNT(*), COUNT(x.id) \
                 FROM picked p LEFT JOIN numbered x ON x.id = p.id \
                 GROUP BY p.terminal_id ORDER BY MIN(p.id)",
                vec![(limit as i64).into()],
            ))
            .await?;
        let mut batch = NumberedBatch::default();
        for row in &rows {
            let terminal: String = row.try_get_by_index(0)?;
            let (picked, numbered): (i64, i64) =
                (row.try_get_by_index(1)?, row.try_get_by_index(2)?);
            if numbered != picked {
                // The transaction rolls back on drop: nothing is numbered.
                return Err(StoreError::Corrupt(format!(
                    "outbox event for unknown terminal {terminal}"
                )));
            }
            batch.terminals.push(terminal);
            batch.events += picked as usize;
        }
        if batch.events > 0 {
            tx.commit().await?;
        }
        Ok(batch)
    }

    /// The newest `seq` of each of `terminals` (their `last_seq`), for the
    /// displays' catch-up; in statements of at most 500 terminals.
    pub async fn newest_seqs(&self, terminals: &[String]) -> StoreResult<Vec<(String, i64)>> {
        let mut seqs = Vec::with_capacity(terminals.len());
        for chunk in terminals.chunks(500) {
            let marks: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
            let rows = self
                .db()
                .query_all_raw(self.sql(
                    &format!(
                        "SELECT id, last_seq FROM terminals WHERE id IN ({})",
                        marks.join(", ")
                    ),
                    chunk.iter().map(|t| t.clone().into()).collect(),
                ))
                .await?;
            for row in rows {
                seqs.push((row.try_get_by_index(0)?, row.try_get_by_index(1)?));
            }
        }
        Ok(seqs)
    }

    /// Numbered events of a terminal with `seq > after`, oldest first, at
    /// most `limit`.
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
                let seq = row
                    .seq
                    .ok_or_else(|| StoreError::Corrupt(format!("event {} has no seq", row.id)))?;
                let mut payload: Value = serde_json::from_str(&row.payload)
                    .map_err(|e| StoreError::Corrupt(format!("event {}: {e}", row.id)))?;
                payload["seq"] = seq.into();
                Ok(TerminalEvent {
                    terminal_id: row.terminal_id,
                    seq,
                    payload,
                })
            })
            .collect()
    }

    /// Deletes at most `limit` outbox events older than `before`, in one
    /// statement (its own short transaction); returns how many. The
    /// caller repeats it for more, so no statement holds many row locks
    /// or a long write. Kept whatever their age: events not numbered yet
    /// (the relay has not seen them), and events that a connected display
    /// (a `terminal_presence` row) of their terminal has not acknowledged,
    /// so a display that is behind never loses what it has still to read.
    pub async fn purge_events_before(&self, before: EpochMs, limit: u64) -> StoreResult<u64> {
        self.write_one(self.sql(
            "DELETE FROM terminal_events WHERE id IN (SELECT e.id FROM terminal_events e \
             WHERE e.created_at_ms < $1 AND e.seq IS NOT NULL \
             AND NOT EXISTS (SELECT 1 FROM terminal_presence p \
             WHERE p.terminal_id = e.terminal_id AND p.acked_seq < e.seq) \
             ORDER BY e.created_at_ms LIMIT $2)",
            vec![before.into(), (limit as i64).into()],
        ))
        .await
    }
}

/// The `session.rejected` / `session.aborted` event of a session, its
/// message in the experience's language.
pub(crate) fn aborted_payload(
    session: &sessions::Model,
    reason: AbortReason,
    detail: Option<&str>,
    locale: Locale,
) -> Value {
    serde_json::json!({
        "type": reason.event_type(),
        "session_id": session.id,
        "nickname": session.nickname,
        "reason": reason.as_str(),
        "message": reason.message_for(detail, locale),
    })
}
