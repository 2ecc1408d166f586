//! The store: the database is the only source of truth. This module owns the
//! connection pool, the schema entities and every SQL statement; each function
//! is one short transaction (or one statement) and none does outside I/O.
//!
//! SQLite allows one writer at a time: write transactions there go through a
//! process-wide gate so they queue in the process instead of failing with
//! `database is locked`, and those that queue together share one commit
//! ([`write_gate`]). PostgreSQL needs no gate.

pub mod ai_calls;
pub mod audit;
pub mod breaker;
pub mod claim_cost;
pub mod cleanup;
pub mod entities;
pub mod experiences;
pub mod gallery_guards;
pub mod guests;
pub mod idempotency;
pub mod ledger;
pub mod mails;
pub mod notify;
pub mod operators;
pub mod outbox;
pub mod photos;
pub mod presence;
pub mod prints;
pub mod providers;
pub mod ranking;
pub mod review;
pub(crate) mod rows;
pub mod sagas;
pub mod sessions;
pub mod staff;
pub mod submissions;
pub mod transitions;
pub mod webhooks;
mod write_gate;

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use migration::{Migrator, MigratorTrait};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, DbBackend,
    DbErr, QueryResult, Statement, TransactionTrait, Value,
};

use crate::domain::saga::TransitionError;
use write_gate::{Execute, Member, Query, WriteGate};
pub use write_gate::{SQLITE_COMMIT, SQLITE_GATE_WAIT};

/// Errors of the store, typed so the HTTP layer and the actors can tell a lost
/// lease from a broken database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Db(#[from] DbErr),
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{0}")]
    Conflict(String),
    /// An operator's review decision that cannot apply (the other one was
    /// taken, or the saga is not in review).
    #[error(transparent)]
    Review(#[from] crate::domain::review::DecisionRefused),
    /// The session is not OPEN or ABORTED, so it takes no submission.
    #[error("this session has already submitted")]
    AlreadySubmitted,
    /// The experience has fewer credits left than the submission costs.
    #[error("this experience has no credits left for a submission")]
    BudgetExhausted,
    /// The experience has closed, or closes before the submission could
    /// finish.
    #[error("this experience is closing and takes no more submissions")]
    Closing,
    /// The session holds its experience's `max_photos_per_session` photos
    /// already.
    #[error("this session has its {0} photos already")]
    PhotoLimit(i32),
    /// The shared transaction of a batch of writes failed (each write of
    /// the batch gets this), with what the database error meant.
    #[error("the batch of writes failed: {message}")]
    BatchFailed { failure: DbFailure, message: String },
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The LISTEN connection could not be made or was lost.
    #[error("notification listener: {0}")]
    Listener(String),
}

/// What a database error means for the caller, decided here once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbFailure {
    /// A unique constraint: the row exists (a duplicate); what is stored
    /// decides the answer.
    Duplicate,
    /// Lock timeout, deadlock, serialization failure (PostgreSQL), or
    /// SQLite BUSY / LOCKED: nothing was changed, and the same work may
    /// simply run again in a moment.
    Transient,
    /// No connection: the pool timed out, the database is not reachable,
    /// or it dropped the connection (a restart). A write may or may not
    /// have committed: only idempotent work may simply run again.
    Unavailable,
    /// Anything else: a bug or a broken database.
    Other,
}

/// PostgreSQL SQLSTATEs of [`DbFailure::Transient`]: lock_not_available
/// (lock_timeout), deadlock_detected, serialization_failure.
const PG_TRANSIENT: [&str; 3] = ["55P03", "40P01", "40001"];
/// SQLite primary result codes of [`DbFailure::Transient`]: SQLITE_BUSY,
/// SQLITE_LOCKED (extended codes carry them in their low byte).
const SQLITE_TRANSIENT: [i64; 2] = [5, 6];

/// PostgreSQL SQLSTATEs that say the server went away or is not taking
/// connections (a restart): class 08 (connection exception) and 57P01-03
/// (admin shutdown, crash shutdown, cannot connect now).
fn pg_connection_lost(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
}

impl StoreError {
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, StoreError::Transition(TransitionError::LeaseLost))
    }

    /// What this error means (see [`DbFailure`]).
    pub fn failure(&self) -> DbFailure {
        let db = match self {
            StoreError::Db(db) => db,
            StoreError::BatchFailed { failure, .. } => return *failure,
            _ => return DbFailure::Other,
        };
        if matches!(db, DbErr::ConnectionAcquire(_) | DbErr::Conn(_)) {
            return DbFailure::Unavailable;
        }
        if matches!(
            db.sql_err(),
            Some(sea_orm::SqlErr::UniqueConstraintViolation(_))
        ) {
            return DbFailure::Duplicate;
        }
        let (DbErr::Exec(sea_orm::RuntimeErr::SqlxError(e))
        | DbErr::Query(sea_orm::RuntimeErr::SqlxError(e))) = db
        else {
            return DbFailure::Other;
        };
        match &**e {
            sea_orm::sqlx::Error::Database(e) => {
                let code = e.code().unwrap_or_default();
                let transient = if e
                    .try_downcast_ref::<sea_orm::sqlx::sqlite::SqliteError>()
                    .is_some()
                {
                    // Extended result codes carry the primary one in
                    // their low byte.
                    code.parse::<i64>()
                        .is_ok_and(|c| SQLITE_TRANSIENT.contains(&(c & 0xff)))
                } else {
                    PG_TRANSIENT.contains(&code.as_ref())
                };
                if transient {
                    DbFailure::Transient
                } else if pg_connection_lost(&code) {
                    DbFailure::Unavailable
                } else {
                    DbFailure::Other
                }
            }
            sea_orm::sqlx::Error::PoolTimedOut
            | sea_orm::sqlx::Error::PoolClosed
            | sea_orm::sqlx::Error::Io(_) => DbFailure::Unavailable,
            _ => DbFailure::Other,
        }
    }
}

/// Transient failures retried by [`retry_transient`] before giving up.
pub const TRANSIENT_RETRIES: u32 = 3;

/// Runs `op` again after a [`DbFailure::Transient`] error, up to
/// [`TRANSIENT_RETRIES`] times, waiting [`transient_backoff`] between
/// tries. `op` must be safe to repeat: a transient error rolled its
/// transaction back.
pub async fn retry_transient<T, F, Fut>(mut op: F) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = StoreResult<T>>,
{
    let mut retry = 0;
    loop {
        match op().await {
            Err(e) if e.failure() == DbFailure::Transient && retry < TRANSIENT_RETRIES => {
                let wait = transient_backoff(retry, rand::random::<f64>());
                tracing::warn!(error = %e, retry, ?wait, "transient database error; trying again");
                tokio::time::sleep(wait).await;
                retry += 1;
            }
            other => return other,
        }
    }
}

/// The wait before retry `retry` (0-based) of a transient failure: 20 ms
/// doubling, with full jitter (`jitter` in 0..1) so that requests that
/// collided do not collide again in step.
pub fn transient_backoff(retry: u32, jitter: f64) -> Duration {
    let ceiling = 20.0 * f64::from(1u32 << retry.min(10));
    Duration::from_millis((ceiling * (0.5 + jitter.clamp(0.0, 1.0) / 2.0)) as u64)
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A connection pool plus the SQLite write gate. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: DatabaseConnection,
    /// Shared by every pool on the same SQLite file.
    write_gate: Option<Arc<WriteGate>>,
    url: Arc<str>,
    /// Shared by every pool of this process (see [`ranking::RankCache`]).
    rank_cache: Arc<ranking::RankCache>,
    /// How stale cached scores may get once another instance has changed
    /// its ranking: at most one re-read of an experience's scores per this
    /// long (see [`ranking::RankCache`]).
    rank_refresh: Duration,
    /// Shared by every pool of this process (see [`webhooks::HookBook`]).
    hooks: Arc<webhooks::HookBook>,
}

/// A write transaction. On SQLite it holds the write gate, as a part of
/// the gate's open group (see [`write_gate`]); dropping it uncommitted
/// rolls back its writes.
pub struct WriteTx(Tx);

enum Tx {
    /// PostgreSQL's transaction, or a savepoint.
    Own(DatabaseTransaction),
    /// SQLite: a part of the write gate's group.
    Member(Member),
}

impl Deref for WriteTx {
    type Target = DatabaseTransaction;
    fn deref(&self) -> &DatabaseTransaction {
        match &self.0 {
            Tx::Own(txn) => txn,
            Tx::Member(member) => member,
        }
    }
}

impl WriteTx {
    /// Commits; on SQLite, returns once the group it is part of has
    /// committed, with the group's outcome.
    pub async fn commit(self) -> Result<(), DbErr> {
        match self.0 {
            Tx::Own(txn) => txn.commit().await,
            Tx::Member(member) => member.commit().await,
        }
    }

    /// A savepoint inside this transaction: its `commit` releases it, its
    /// `rollback` undoes what was done since, and the outer transaction
    /// goes on either way (one item of a batch failing alone).
    pub async fn savepoint(&self) -> Result<WriteTx, DbErr> {
        Ok(WriteTx(Tx::Own(self.begin().await?)))
    }

    pub async fn rollback(self) -> Result<(), DbErr> {
        match self.0 {
            Tx::Own(txn) => txn.rollback().await,
            Tx::Member(member) => member.rollback().await,
        }
    }
}

impl Store {
    /// Connects (creating the SQLite file when the URL says `mode=rwc`) and
    /// sets SQLite to WAL so readers never wait for the writer.
    pub async fn connect(url: &str, pool: u32) -> StoreResult<Store> {
        Self::connect_with(url, pool, None).await
    }

    /// Like [`Store::connect`], with statements that wait on a lock at most
    /// `lock_wait` (PostgreSQL `lock_timeout`, SQLite `busy_timeout`) and
    /// then fail as [`DbFailure::Transient`]: the requests' pool, so that
    /// no HTTP request waits long on a lock that another process holds.
    pub async fn connect_with(
        url: &str,
        pool: u32,
        lock_wait: Option<Duration>,
    ) -> StoreResult<Store> {
        let db = Self::pool(url, pool, lock_wait).await?;
        let write_gate = match db.get_database_backend() {
            DbBackend::Sqlite => {
                db.execute_unprepared("PRAGMA journal_mode=WAL").await?;
                Some(Arc::default())
            }
            _ => None,
        };
        Ok(Store {
            db,
            write_gate,
            url: url.into(),
            rank_cache: Arc::default(),
            rank_refresh: ranking::RANK_REFRESH,
            hooks: Arc::default(),
        })
    }

    /// The same database through a pool of its own (sharing the SQLite
    /// write gate), so one kind of work cannot take every connection of
    /// another: saga work never starves the HTTP requests.
    pub async fn with_own_pool(&self, pool: u32) -> StoreResult<Store> {
        Ok(Store {
            db: Self::pool(&self.url, pool, None).await?,
            write_gate: self.write_gate.clone(),
            url: self.url.clone(),
            rank_cache: self.rank_cache.clone(),
            rank_refresh: self.rank_refresh,
            hooks: self.hooks.clone(),
        })
    }

    /// This store with `refresh` as the least time between two re-reads
    /// of an experience's cached scores after other instances' news
    /// (default [`ranking::RANK_REFRESH`]). Zero re-reads at the next rank
    /// after each piece of news.
    pub fn with_rank_refresh(mut self, refresh: Duration) -> Store {
        self.rank_refresh = refresh;
        self
    }

    async fn pool(
        url: &str,
        pool: u32,
        lock_wait: Option<Duration>,
    ) -> StoreResult<DatabaseConnection> {
        let mut opts = ConnectOptions::new(url.to_owned());
        if let Some(wait) = lock_wait {
            let ms = wait.as_millis().max(1).to_string();
            opts.map_sqlx_postgres_opts(move |o| o.options([("lock_timeout", ms.as_str())]));
        }
        // SQLite overwrites what it deletes (`secure_delete`): an erased
        // guest's data is gone from the file, not only unlinked from it.
        opts.map_sqlx_sqlite_opts(move |o| {
            let o = o.pragma("secure_delete", "ON");
            match lock_wait {
                Some(wait) => o.busy_timeout(wait),
                None => o,
            }
        });
        opts.max_connections(pool.max(2))
            .min_connections(1)
            .connect_timeout(Duration::from_secs(10))
            .acquire_timeout(Duration::from_secs(10))
            // A ping on every checkout is one more round trip per
            // statement; only a connection idle long enough to have been
            // dropped by the server or the network is tested first.
            .test_before_acquire_if_idle_for(Duration::from_secs(30))
            .sqlx_logging(false);
        Ok(Database::connect(opts).await?)
    }

    /// Applies every pending migration.
    pub async fn migrate(&self) -> StoreResult<()> {
        Migrator::up(&self.db, None).await?;
        Ok(())
    }

    /// Whether the database answers and every migration this binary knows
    /// is applied (for `/readyz`). Migrations newer than this binary do not
    /// make it unready: during a rolling deploy the new version migrates
    /// first, and the old instances (whose schema is a subset, since
    /// migrations only add) keep serving until they are replaced.
    pub async fn is_ready(&self) -> bool {
        let applied = match self
            .db
            .query_all_raw(self.sql("SELECT version FROM seaql_migrations", vec![]))
            .await
        {
            Ok(rows) => rows
                .iter()
                .filter_map(|r| r.try_get_by_index::<String>(0).ok())
                .collect::<std::collections::HashSet<_>>(),
            Err(_) => return false,
        };
        Migrator::migrations()
            .iter()
            .all(|m| applied.contains(m.name()))
    }

    pub fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    pub fn backend(&self) -> DbBackend {
        self.db.get_database_backend()
    }

    pub fn is_postgres(&self) -> bool {
        self.backend() == DbBackend::Postgres
    }

    /// Begins a write transaction (behind the gate on SQLite, as a part of
    /// its group).
    pub async fn write_tx(&self) -> StoreResult<WriteTx> {
        Ok(WriteTx(match &self.write_gate {
            Some(gate) => Tx::Member(gate.join(&self.db).await?),
            None => Tx::Own(self.db.begin().await?),
        }))
    }

    /// Runs one write statement outside a transaction (behind the gate on
    /// SQLite) and returns the rows it affected.
    pub async fn write_one(&self, stmt: Statement) -> StoreResult<u64> {
        match &self.write_gate {
            Some(gate) => Ok(gate.write_statement(&self.db, Execute(stmt)).await?),
            None => Ok(self.db.execute_raw(stmt).await?.rows_affected()),
        }
    }

    /// Runs one write statement with a `RETURNING` clause outside a
    /// transaction (behind the gate on SQLite) and returns its rows.
    pub async fn write_returning(&self, stmt: Statement) -> StoreResult<Vec<QueryResult>> {
        match &self.write_gate {
            Some(gate) => Ok(gate.write_statement(&self.db, Query(stmt)).await?),
            None => Ok(self.db.query_all_raw(stmt).await?),
        }
    }

    /// Writes that do not depend on each other's effects, all or none,
    /// in the fewest round trips: on PostgreSQL one statement and no
    /// transaction around it (a statement is atomic on its own), on SQLite
    /// one hop in a write transaction of the gate. The rows each touched,
    /// in order.
    pub async fn write_together(&self, writes: Vec<Statement>) -> StoreResult<Vec<u64>> {
        if self.write_gate.is_none() {
            return Ok(rows::execute_together(&self.db, writes).await?);
        }
        let tx = self.write_tx().await?;
        let touched = rows::execute_together(&*tx, writes).await?;
        tx.commit().await?;
        Ok(touched)
    }

    /// SQLite's group commits since this process opened the file, and the
    /// writers they committed (None on PostgreSQL).
    pub fn group_commits(&self) -> Option<(u64, u64)> {
        self.write_gate.as_ref().map(|gate| gate.commits())
    }

    /// Leases to `token`, until `now + lease_ms`, the rows of `table` that
    /// `pick` names (a `SELECT` of ids, oldest due first, where `$2` is
    /// `now`, `$4` the `limit` and `$5...` the values of `more`) and that no
    /// live lease holds: their ids. One statement; the outbox tables'
    /// claims (prints, webhook deliveries) fence every later write on the
    /// token.
    pub(crate) async fn lease_rows(
        &self,
        table: &str,
        pick: &str,
        lease: (&str, crate::domain::policy::EpochMs, i64),
        limit: i64,
        more: Vec<Value>,
    ) -> StoreResult<Vec<String>> {
        let (token, now, lease_ms) = lease;
        let mut values: Vec<Value> = vec![
            token.into(),
            now.into(),
            (now + lease_ms).into(),
            limit.into(),
        ];
        values.extend(more);
        let rows = self
            .write_returning(self.sql(
                &format!(
                    "UPDATE {table} SET lease_token = $1, lease_until_ms = $3 \
                     WHERE id IN ({pick}) \
                     AND (lease_until_ms IS NULL OR lease_until_ms < $2) RETURNING id"
                ),
                values,
            ))
            .await?;
        Ok(rows
            .iter()
            .map(|r| r.try_get_by_index::<String>(0))
            .collect::<Result<_, _>>()?)
    }

    /// A raw statement written with `$1, $2, ...` placeholders, rendered for
    /// this backend (SQLite spells them `?1, ?2, ...`).
    pub fn sql(&self, text: &str, values: Vec<Value>) -> Statement {
        sql_for(self.backend(), text, values)
    }

    /// How the database runs the statement `statement` builds after the
    /// prefix it is given, one line per plan node: PostgreSQL's `EXPLAIN`
    /// (with `analyze`, `EXPLAIN ANALYZE`: the statement runs, and each
    /// node says the rows it actually read), SQLite's `EXPLAIN QUERY PLAN`
    /// (which never runs it). For tests and diagnostics.
    pub(super) async fn plan_of(
        &self,
        analyze: bool,
        statement: impl FnOnce(&str) -> Statement,
    ) -> StoreResult<String> {
        let (prefix, column) = match (self.is_postgres(), analyze) {
            (true, false) => ("EXPLAIN", 0),
            (true, true) => ("EXPLAIN ANALYZE", 0),
            (false, _) => ("EXPLAIN QUERY PLAN", 3),
        };
        let rows = self.db().query_all_raw(statement(prefix)).await?;
        let lines = rows
            .iter()
            .map(|row| row.try_get_by_index::<String>(column))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(lines.join("\n"))
    }
}

pub(crate) fn sql_for(backend: DbBackend, text: &str, values: Vec<Value>) -> Statement {
    let text = match backend {
        DbBackend::Sqlite => text.replace('$', "?"),
        _ => text.to_owned(),
    };
    Statement::from_sql_and_values(backend, text, values)
}

/// A fresh UUID as stored (text).
pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_follow_the_backend() {
        let pg = sql_for(
            DbBackend::Postgres,
            "SELECT $1, $2",
            vec![1.into(), 2.into()],
        );
        assert_eq!(pg.sql, "SELECT $1, $2");
        let lite = sql_for(DbBackend::Sqlite, "SELECT $1, $2", vec![1.into(), 2.into()]);
        assert_eq!(lite.sql, "SELECT ?1, ?2");
    }
}
