//! SQLite's one writer, committing in groups.
//!
//! SQLite takes one write transaction at a time, and with
//! `synchronous=FULL` every commit waits for the disk. Write transactions
//! of a process therefore queue here (a FIFO mutex) instead of failing with
//! `database is locked`, and those that queue together share one commit,
//! the way PostgreSQL's group commit shares a WAL flush:
//!
//! - The first writer to find no group open begins the transaction and
//!   works in it directly. Each writer that comes while it is open works
//!   in a savepoint of it, so its rollback undoes its own writes only.
//! - A writer that is done (its savepoint released) joins the group's
//!   pending members. If nobody is queued for the gate, it commits the
//!   group at once: an idle system commits every write on its own. If
//!   somebody is queued, it hands the gate on and queues behind them; by
//!   the time it holds the gate again, whoever went before it has
//!   committed the group, or it commits it itself. So a batch is whatever
//!   was queued when the previous writer finished, and no member waits for
//!   more than one pass of the queue.
//! - A member's `commit` returns only once the group's `COMMIT` did, with
//!   its outcome: nothing is reported written before it is on disk, and a
//!   failed group commit fails every member of the group.
//!
//! A writer that fails inside a savepoint rolls back to it and the group
//! goes on. A writer whose task is cancelled while it queues for the
//! group's commit leaves its part pending: whoever commits the group
//! commits it. Should every pending writer be cancelled so, the group
//! stays open until the next writer of the process joins it and commits
//! (their callers got no answer either way, as with a cancelled commit). A writer whose savepoint cannot be released (the connection or
//! the transaction broke) closes the group: what the members before it
//! wrote is committed if SQLite still can, and each learns the outcome.
//!
//! PostgreSQL needs none of this: its transactions run side by side and
//! its commits are grouped by the server.
//!
//! Each wait for the gate and each group's `COMMIT` is timed
//! (`stagehand_sqlite_gate_wait_seconds`, `stagehand_sqlite_commit_seconds`):
//! a disk that stalls a commit holds up every write queued behind it, and
//! those two histograms tell that apart from slow writes.

use std::future::Future;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, QueryResult, Statement,
    TransactionTrait,
};
use tokio::sync::{watch, Mutex, OwnedMutexGuard};

/// Histogram: how long a writer waited for the gate (`crate::metrics`
/// describes it and gives it its buckets).
pub const SQLITE_GATE_WAIT: &str = "stagehand_sqlite_gate_wait_seconds";
/// Histogram: one group's `COMMIT`.
pub const SQLITE_COMMIT: &str = "stagehand_sqlite_commit_seconds";

/// The gate of one SQLite file, shared by every pool of the process on it.
#[derive(Default)]
pub(crate) struct WriteGate {
    group: Arc<Mutex<Group>>,
    /// Tasks waiting for the gate; a member commits at once when none is.
    queued: AtomicUsize,
    /// Group commits, and the writers they committed (tests and metrics).
    commits: AtomicU64,
    members: AtomicU64,
}

/// The open group, if any (held with the gate).
#[derive(Default)]
pub(crate) struct Group {
    open: Option<Open>,
}

struct Open {
    txn: DatabaseTransaction,
    /// Members done with their part, waiting for the group's commit.
    pending: u64,
    /// The group's commit outcome, for the members that wait for it.
    outcome: watch::Sender<Option<Result<(), DbErr>>>,
}

/// A write statement run through the gate outside a transaction, and
/// what it answers.
pub(crate) trait GateWrite: Send {
    type Answer: Send;
    fn run<C: ConnectionTrait>(
        self,
        conn: &C,
    ) -> impl Future<Output = Result<Self::Answer, DbErr>> + Send;
}

/// Answers the rows it affected.
pub(crate) struct Execute(pub Statement);

/// Answers the rows of its `RETURNING` clause.
pub(crate) struct Query(pub Statement);

impl GateWrite for Execute {
    type Answer = u64;
    async fn run<C: ConnectionTrait>(self, conn: &C) -> Result<u64, DbErr> {
        Ok(conn.execute_raw(self.0).await?.rows_affected())
    }
}

impl GateWrite for Query {
    type Answer = Vec<QueryResult>;
    async fn run<C: ConnectionTrait>(self, conn: &C) -> Result<Vec<QueryResult>, DbErr> {
        conn.query_all_raw(self.0).await
    }
}

/// One writer's part of the open group, holding the gate.
pub(crate) struct Member {
    gate: Arc<WriteGate>,
    guard: Option<OwnedMutexGuard<Group>>,
    /// None: this writer opened the group and works in it directly.
    savepoint: Option<DatabaseTransaction>,
}

impl WriteGate {
    /// Commits counted since the start, and the writers they committed.
    pub(crate) fn commits(&self) -> (u64, u64) {
        (
            self.commits.load(Ordering::Relaxed),
            self.members.load(Ordering::Relaxed),
        )
    }

    /// Waits for the gate (FIFO), counted in `queued` while waiting.
    async fn lock(&self) -> OwnedMutexGuard<Group> {
        struct Queued<'a>(&'a AtomicUsize);
        impl Drop for Queued<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.queued.fetch_add(1, Ordering::SeqCst);
        let _queued = Queued(&self.queued);
        let waiting = Instant::now();
        let guard = self.group.clone().lock_owned().await;
        ::metrics::histogram!(SQLITE_GATE_WAIT).record(waiting.elapsed().as_secs_f64());
        guard
    }

    fn nobody_queued(&self) -> bool {
        self.queued.load(Ordering::SeqCst) == 0
    }

    /// Takes the gate and a part in the open group (opening one on `db`
    /// if none is).
    pub(crate) async fn join(self: &Arc<Self>, db: &DatabaseConnection) -> Result<Member, DbErr> {
        let mut guard = self.lock().await;
        let savepoint = match &guard.open {
            None => {
                let txn = db.begin().await?;
                guard.open = Some(Open {
                    txn,
                    pending: 0,
                    outcome: watch::channel(None).0,
                });
                None
            }
            Some(open) => match open.txn.begin().await {
                Ok(savepoint) => Some(savepoint),
                Err(e) => {
                    self.close(&mut guard).await.ok();
                    return Err(e);
                }
            },
        };
        Ok(Member {
            gate: self.clone(),
            guard: Some(guard),
            savepoint,
        })
    }

    /// Runs one write statement: on its own (autocommit) when no group is
    /// open, else inside the open group as a member of it (one statement
    /// needs no savepoint: SQLite undoes a failed statement's writes).
    pub(crate) async fn write_statement<W: GateWrite>(
        self: &Arc<Self>,
        db: &DatabaseConnection,
        write: W,
    ) -> Result<W::Answer, DbErr> {
        let mut guard = self.lock().await;
        let Some(open) = &guard.open else {
            let written = write.run(db).await;
            self.commits.fetch_add(1, Ordering::Relaxed);
            self.members.fetch_add(1, Ordering::Relaxed);
            return written;
        };
        match write.run(&open.txn).await {
            Ok(written) => {
                self.wait_for_commit(guard).await?;
                Ok(written)
            }
            Err(e) => {
                self.close(&mut guard).await.ok();
                Err(e)
            }
        }
    }

    /// A member whose part is done: counted in the group, which commits
    /// now if nobody is queued, else after one pass of the queue.
    async fn wait_for_commit(&self, mut guard: OwnedMutexGuard<Group>) -> Result<(), DbErr> {
        let Some(open) = guard.open.as_mut() else {
            return Err(DbErr::Custom("a member's group is not open".into()));
        };
        open.pending += 1;
        let outcome = open.outcome.subscribe();
        if self.nobody_queued() {
            return self.close(&mut guard).await;
        }
        drop(guard);
        let mut guard = self.lock().await;
        if let Some(done) = outcome.borrow().clone() {
            return done;
        }
        if outcome.has_changed().is_err() {
            // The group ended with no outcome: its closer was cancelled
            // during the COMMIT. Whether it committed is not known, so
            // this writer is not told it did.
            return Err(DbErr::Custom(
                "the write group's commit was interrupted; its outcome is unknown".into(),
            ));
        }
        self.close(&mut guard).await
    }

    /// Commits the open group (if one is) and tells its members.
    async fn close(&self, guard: &mut OwnedMutexGuard<Group>) -> Result<(), DbErr> {
        let Some(open) = guard.open.take() else {
            return Ok(());
        };
        let committing = Instant::now();
        let done = open.txn.commit().await;
        ::metrics::histogram!(SQLITE_COMMIT).record(committing.elapsed().as_secs_f64());
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.members.fetch_add(open.pending, Ordering::Relaxed);
        open.outcome.send_replace(Some(done.clone()));
        done
    }
}

impl Deref for Member {
    type Target = DatabaseTransaction;
    fn deref(&self) -> &DatabaseTransaction {
        match &self.savepoint {
            Some(savepoint) => savepoint,
            None => {
                &self
                    .guard
                    .as_ref()
                    .and_then(|g| g.open.as_ref())
                    .expect("a member holds the gate and its open group")
                    .txn
            }
        }
    }
}

impl Member {
    /// Ends this writer's part (its savepoint released) and returns once
    /// the group is committed, with the group's outcome.
    pub(crate) async fn commit(mut self) -> Result<(), DbErr> {
        let mut guard = self.guard.take().expect("a member holds the gate");
        if let Some(savepoint) = self.savepoint.take() {
            if let Err(e) = savepoint.commit().await {
                self.gate.close(&mut guard).await.ok();
                return Err(e);
            }
        }
        self.gate.wait_for_commit(guard).await
    }

    /// Undoes this writer's part; the group's other members go on.
    pub(crate) async fn rollback(mut self) -> Result<(), DbErr> {
        let mut guard = self.guard.take().expect("a member holds the gate");
        match self.savepoint.take() {
            // It opened the group, so no member is pending in it.
            None => match guard.open.take() {
                Some(open) => open.txn.rollback().await,
                None => Ok(()),
            },
            Some(savepoint) => match savepoint.rollback().await {
                Ok(()) => {
                    let pending = guard.open.as_ref().is_some_and(|o| o.pending > 0);
                    if pending && self.gate.nobody_queued() {
                        // Members pending in the group queue for it; none
                        // is queued (one gave up waiting): commit for them.
                        self.gate.close(&mut guard).await.ok();
                    }
                    Ok(())
                }
                Err(e) => {
                    self.gate.close(&mut guard).await.ok();
                    Err(e)
                }
            },
        }
    }
}

impl Drop for Member {
    /// A part dropped without commit or rollback (an error returned early,
    /// a cancelled task) is undone: its savepoint's or its group's
    /// rollback is queued on the connection, ahead of any later statement.
    fn drop(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            match self.savepoint.take() {
                Some(savepoint) => drop(savepoint),
                None => drop(guard.open.take()),
            }
        }
    }
}
