//! The audit trail (`audit_log`): [`record`] writes an operator action's
//! record inside the action's own transaction, so an action is never
//! without its record nor a record without its action. Reads page newest
//! first by `(at_ms, id)`; the cleanup drops records past
//! `AUDIT_RETENTION`.

use sea_orm::{ConnectionTrait, Value};

use super::{new_id, Store, StoreResult};
use crate::domain::audit::AuditEntry;
use crate::domain::policy::EpochMs;

/// One record as the trail shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditRecord {
    pub id: String,
    pub at_ms: EpochMs,
    pub operator_id: Option<String>,
    pub operator_name: String,
    pub action: String,
    pub target: String,
    pub experience_id: Option<String>,
    pub detail: String,
}

/// Where a page of the trail starts: after this record (newest first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditCursor {
    pub at_ms: EpochMs,
    pub id: String,
}

impl AuditCursor {
    /// The opaque text handed to clients: `<at_ms>.<id>`.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.at_ms, self.id)
    }

    pub fn decode(text: &str) -> Option<AuditCursor> {
        let (ms, id) = text.split_once('.')?;
        let at_ms = ms.parse().ok()?;
        (!id.is_empty() && id.len() <= 64).then(|| AuditCursor {
            at_ms,
            id: id.to_owned(),
        })
    }

    fn of(record: &AuditRecord) -> AuditCursor {
        AuditCursor {
            at_ms: record.at_ms,
            id: record.id.clone(),
        }
    }
}

/// Which records a page holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// An operator's name or id (`bootstrap` for the bootstrap admin).
    pub operator: Option<String>,
    pub action: Option<String>,
    /// Only the records of this experience (its id).
    pub experience_id: Option<String>,
}

const FIELDS: &str = "id, at_ms, operator_id, operator_name, action, target, experience_id, detail";

/// Writes `entry` at `now` on `conn`: call it inside the transaction of
/// the action it records.
pub(crate) async fn record<C: ConnectionTrait>(
    conn: &C,
    entry: &AuditEntry,
    now: EpochMs,
) -> StoreResult<()> {
    let values: Vec<Value> = vec![
        new_id().into(),
        now.into(),
        entry.operator.id.clone().into(),
        entry.operator.name.clone().into(),
        entry.action.as_str().into(),
        entry.target.clone().into(),
        entry.experience_id.clone().into(),
        entry.detail.clone().into(),
    ];
    conn.execute_raw(super::sql_for(
        conn.get_database_backend(),
        &format!("INSERT INTO audit_log ({FIELDS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"),
        values,
    ))
    .await?;
    Ok(())
}

impl Store {
    /// Writes a record on its own, for an action that changes nothing in
    /// the database (an export: the record is the action's only write).
    pub async fn record_audit(&self, entry: &AuditEntry, now: EpochMs) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        record(&*tx, entry, now).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Runs one write statement and, when given, writes `audit` in the
    /// same transaction; the rows the statement affected. A statement
    /// that changed nothing records nothing (the action did not happen).
    pub async fn write_one_audited(
        &self,
        stmt: sea_orm::Statement,
        audit: Option<&AuditEntry>,
        now: EpochMs,
    ) -> StoreResult<u64> {
        let Some(audit) = audit else {
            return self.write_one(stmt).await;
        };
        let tx = self.write_tx().await?;
        let changed = tx.execute_raw(stmt).await?.rows_affected();
        if changed > 0 {
            record(&*tx, audit, now).await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// One page of the trail, newest first, after `after`; with the
    /// cursor of the next page when this one is full.
    pub async fn audit_page(
        &self,
        filter: &AuditFilter,
        after: Option<&AuditCursor>,
        limit: u64,
    ) -> StoreResult<(Vec<AuditRecord>, Option<AuditCursor>)> {
        let mut values: Vec<Value> = vec![(limit as i64).into()];
        let mut conditions: Vec<String> = Vec::new();
        let bind = |value: Value, values: &mut Vec<Value>| {
            values.push(value);
            values.len()
        };
        if let Some(operator) = &filter.operator {
            let at = bind(operator.clone().into(), &mut values);
            conditions.push(format!("(operator_name = ${at} OR operator_id = ${at})"));
        }
        if let Some(action) = &filter.action {
            let at = bind(action.clone().into(), &mut values);
            conditions.push(format!("action = ${at}"));
        }
        if let Some(experience_id) = &filter.experience_id {
            let at = bind(experience_id.clone().into(), &mut values);
            conditions.push(format!("experience_id = ${at}"));
        }
        if let Some(cursor) = after {
            let at = bind(cursor.at_ms.into(), &mut values);
            let id = bind(cursor.id.clone().into(), &mut values);
            conditions.push(format!("(at_ms < ${at} OR (at_ms = ${at} AND id < ${id}))"));
        }
        let filter = if conditions.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conditions.join(" AND "))
        };
        let rows = self
            .db()
            .query_all_raw(self.sql(
                &format!(
                    "SELECT {FIELDS} FROM audit_log{filter} \
                     ORDER BY at_ms DESC, id DESC LIMIT $1"
                ),
                values,
            ))
            .await?;
        let records = rows
            .iter()
            .map(|r| {
                Ok(AuditRecord {
                    id: r.try_get_by_index(0)?,
                    at_ms: r.try_get_by_index(1)?,
                    operator_id: r.try_get_by_index(2)?,
                    operator_name: r.try_get_by_index(3)?,
                    action: r.try_get_by_index(4)?,
                    target: r.try_get_by_index(5)?,
                    experience_id: r.try_get_by_index(6)?,
                    detail: r.try_get_by_index(7)?,
                })
            })
            .collect::<Result<Vec<_>, sea_orm::DbErr>>()?;
        let next = (records.len() as u64 == limit)
            .then(|| records.last().map(AuditCursor::of))
            .flatten();
        Ok((records, next))
    }

    /// Deletes the records older than `before`, at most `limit`; how many.
    pub async fn drop_old_audit(&self, before: EpochMs, limit: u64) -> StoreResult<u64> {
        self.write_one(self.sql(
            "DELETE FROM audit_log WHERE id IN \
             (SELECT id FROM audit_log WHERE at_ms < $1 ORDER BY at_ms LIMIT $2)",
            vec![before.into(), (limit as i64).into()],
        ))
        .await
    }
}
