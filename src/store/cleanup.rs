//! The cleanup actor's read of the sagas nobody will finish (rule 8): the
//! orphans, found with exactly the condition under which
//! `domain::policy::recovery` says `Orphan`, so that a round's batch holds
//! nothing else. A free saga waiting out a backoff is no orphan, even with
//! its recoveries used up; neither is one whose instance handed it over on
//! shutdown (`handed_over`), unless its deadline passed.
//!
//! The query runs every `CLEANUP_INTERVAL` against a table that keeps every
//! finished saga, so it only walks the claim's partial indexes (non-final
//! sagas): `idx_sagas_leased` for the sagas whose worker held a lease, and
//! `idx_sagas_unowned` for those nobody holds. Its cost follows the number
//! of running and queued sagas, never the history.

use sea_orm::{ConnectionTrait, FromQueryResult};

use super::entities::sagas;
use super::sagas::RUNNABLE;
use super::{Store, StoreResult};
use crate::domain::policy::EpochMs;

/// The orphan condition for sagas a worker held (`lock_token` set): the
/// lease ran out (`domain::policy::Ownership::Expired`), and the deadline
/// passed or, without a handover, the recoveries are used up. The
/// partial-index terms are spelled out as in the index, so that SQLite
/// uses it. `$1` is now, `$2` `max_recoveries`.
const EXPIRED_ORPHAN: &str =
    "lock_token IS NOT NULL AND (locked_until_ms IS NULL OR locked_until_ms < $1) \
     AND (deadline_at_ms < $1 OR (recoveries >= $2 AND NOT handed_over))";

/// The orphan condition for sagas nobody holds (`Ownership::Free`: never
/// claimed, or released for a backoff or a handover): only the deadline
/// makes them orphans; the dispatcher claims them otherwise.
const FREE_ORPHAN: &str = "lock_token IS NULL AND deadline_at_ms < $1";

impl Store {
    /// At most `limit` orphans: non-final sagas that nobody holds (no
    /// lease, or one that ran out) and that are past their deadline, or
    /// whose worker's lease ran out with `max_recoveries` used up and
    /// that were not handed over. This is `domain::policy::recovery`
    /// returning `Recovery::Orphan`, in SQL; the caller still checks each
    /// row with it, and aborts each only if it is still unowned then.
    ///
    /// No order: every round aborts what it read, so the next round's
    /// batch holds the next orphans, and an order would make the database
    /// read every orphan to sort them.
    pub async fn orphans(
        &self,
        now: EpochMs,
        max_recoveries: u32,
        limit: u64,
    ) -> StoreResult<Vec<sagas::Model>> {
        let rows = self
            .db()
            .query_all_raw(self.orphans_statement("", now, max_recoveries, limit))
            .await?;
        rows.iter()
            .map(|row| sagas::Model::from_query_result(row, ""))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Into::into)
    }

    /// How the database runs [`Self::orphans`] (PostgreSQL `EXPLAIN`, SQLite
    /// `EXPLAIN QUERY PLAN`), one line per plan node. For tests and
    /// diagnostics: the query must walk the partial indexes, not the table.
    pub async fn orphans_plan(&self, now: EpochMs, max_recoveries: u32) -> StoreResult<String> {
        self.plan_of(false, |prefix| {
            self.orphans_statement(prefix, now, max_recoveries, 500)
        })
        .await
    }

    /// The orphan query after `prefix` (empty, or an `EXPLAIN`): one
    /// branch per partial index, each limited on its own, so a branch
    /// stops at `limit` rows of its index.
    fn orphans_statement(
        &self,
        prefix: &str,
        now: EpochMs,
        max_recoveries: u32,
        limit: u64,
    ) -> sea_orm::Statement {
        self.sql(
            &format!(
                "{prefix} SELECT * FROM (SELECT * FROM sagas WHERE {RUNNABLE} AND {EXPIRED_ORPHAN} LIMIT $3) expired \
                 UNION ALL \
                 SELECT * FROM (SELECT * FROM sagas WHERE {RUNNABLE} AND {FREE_ORPHAN} LIMIT $3) free \
                 LIMIT $3"
            ),
            vec![
                now.into(),
                (max_recoveries as i32).into(),
                (limit as i64).into(),
            ],
        )
    }
}
