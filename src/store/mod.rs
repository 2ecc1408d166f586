//! The store: the database is the only source of truth. This module owns the
//! connection pool, the schema entities and every SQL statement; each function
//! is one short transaction (or one statement) and none does outside I/O.
//!
//! SQLite allows one writer at a time: write transactions there go through a
//! process-wide gate so they queue in the process instead of failing with
//! `database is locked`. PostgreSQL needs no gate.

pub mod entities;
pub mod experiences;
pub mod idempotency;
pub mod notify;
pub mod operators;
pub mod outbox;
pub mod presence;
pub mod ranking;
pub mod sagas;
pub mod sessions;
pub mod submissions;
pub mod transitions;

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use migration::{Migrator, MigratorTrait};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, DbBackend,
    DbErr, QueryResult, Statement, TransactionTrait, Value,
};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::domain::saga::TransitionError;

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
    /// The session is not OPEN or ABORTED, so it takes no submission.
    #[error("this session has already submitted")]
    AlreadySubmitted,
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The LISTEN connection could not be made or was lost.
    #[error("notification listener: {0}")]
    Listener(String),
}

impl StoreError {
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, StoreError::Transition(TransitionError::LeaseLost))
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A connection pool plus the SQLite write gate. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: DatabaseConnection,
    /// Shared by every pool on the same SQLite file.
    write_gate: Option<Arc<Mutex<()>>>,
    url: Arc<str>,
}

/// A write transaction; holds the SQLite gate until it is committed or
/// dropped (dropping rolls back).
pub struct WriteTx {
    txn: DatabaseTransaction,
    _gate: Option<OwnedMutexGuard<()>>,
}

impl Deref for WriteTx {
    type Target = DatabaseTransaction;
    fn deref(&self) -> &DatabaseTransaction {
        &self.txn
    }
}

impl WriteTx {
    pub async fn commit(self) -> Result<(), DbErr> {
        let WriteTx { txn, _gate } = self;
        txn.commit().await
    }
}

impl Store {
    /// Connects (creating the SQLite file when the URL says `mode=rwc`) and
    /// sets SQLite to WAL so readers never wait for the writer.
    pub async fn connect(url: &str, pool: u32) -> StoreResult<Store> {
        let db = Self::pool(url, pool).await?;
        let write_gate = match db.get_database_backend() {
            DbBackend::Sqlite => {
                db.execute_unprepared("PRAGMA journal_mode=WAL").await?;
                Some(Arc::new(Mutex::new(())))
            }
            _ => None,
        };
        Ok(Store {
            db,
            write_gate,
            url: url.into(),
        })
    }

    /// The same database through a pool of its own (sharing the SQLite
    /// write gate), so one kind of work cannot take every connection of
    /// another: saga work never starves the HTTP requests.
    pub async fn with_own_pool(&self, pool: u32) -> StoreResult<Store> {
        Ok(Store {
            db: Self::pool(&self.url, pool).await?,
            write_gate: self.write_gate.clone(),
            url: self.url.clone(),
        })
    }

    async fn pool(url: &str, pool: u32) -> StoreResult<DatabaseConnection> {
        let mut opts = ConnectOptions::new(url.to_owned());
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

    /// Whether every migration is applied (for `/readyz`).
    pub async fn is_ready(&self) -> bool {
        match Migrator::get_pending_migrations(&self.db).await {
            Ok(pending) => pending.is_empty(),
            Err(_) => false,
        }
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

    /// Begins a write transaction (behind the gate on SQLite).
    pub async fn write_tx(&self) -> StoreResult<WriteTx> {
        let gate = match &self.write_gate {
            Some(gate) => Some(gate.clone().lock_owned().await),
            None => None,
        };
        let txn = self.db.begin().await?;
        Ok(WriteTx { txn, _gate: gate })
    }

    /// Runs one write statement outside a transaction (behind the gate on
    /// SQLite) and returns the rows it affected.
    pub async fn write_one(&self, stmt: Statement) -> StoreResult<u64> {
        let _gate = match &self.write_gate {
            Some(gate) => Some(gate.clone().lock_owned().await),
            None => None,
        };
        Ok(self.db.execute_raw(stmt).await?.rows_affected())
    }

    /// Runs one write statement with a `RETURNING` clause outside a
    /// transaction (behind the gate on SQLite) and returns its rows.
    pub async fn write_returning(&self, stmt: Statement) -> StoreResult<Vec<QueryResult>> {
        let _gate = match &self.write_gate {
            Some(gate) => Some(gate.clone().lock_owned().await),
            None => None,
        };
        Ok(self.db.query_all_raw(stmt).await?)
    }

    /// A raw statement written with `$1, $2, ...` placeholders, rendered for
    /// this backend (SQLite spells them `?1, ?2, ...`).
    pub fn sql(&self, text: &str, values: Vec<Value>) -> Statement {
        sql_for(self.backend(), text, values)
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
