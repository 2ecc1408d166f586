//! PersistenceActor: the short transactions of the sagas, each write fenced
//! by its saga's lock token. Writes are group-committed: those that arrive
//! while a batch is being written go together in the next one
//! ([`BatchQueue`]), so a busy instance pays one transaction for many
//! sagas' steps. After a batch commits it sends the wake-ups it owes: a
//! freed AI slot (a saga left AI_PENDING, aborted, or released its lease)
//! wakes the dispatchers, an appended outbox event wakes the relay.
//!
//! Lease renewals are single-row statements outside the batches: a
//! renewal may meet a step write of the same saga, and keeping it out of
//! multi-row transactions means no two transactions can ever wait on each
//! other's rows.

use actix::prelude::*;

use super::batching::{batch_failed, BatchLimits, BatchQueue};
use super::wakeups::Wakeups;
use crate::clock::SharedClock;
use crate::store::ai_calls::{CallRow, CallSlot};
use crate::store::ledger::Wanted;
use crate::store::transitions::{SagaWrite, Written};
use crate::store::{Store, StoreResult};

/// Extend the lease of a saga we hold.
#[derive(Message)]
#[rtype(result = "StoreResult<()>")]
pub struct RenewLease {
    pub saga_id: String,
    pub token: String,
}

/// Apply one saga write (see [`SagaWrite`]); answered once its batch
/// committed.
#[derive(Message)]
#[rtype(result = "StoreResult<Written>")]
pub struct Write(pub SagaWrite);

/// Apply one saga write in a transaction of its own, outside the batches,
/// with the same wake-ups: for the writes of someone other than the saga's
/// supervisor (an operator's cancel, the cleanup actor's aborts), which may
/// meet a batch on the same saga; alone, they never make two batches wait
/// on each other's rows (a deadlock on PostgreSQL).
#[derive(Message)]
#[rtype(result = "StoreResult<Written>")]
pub struct WriteAlone(pub SagaWrite);

/// A page of an operator's bulk action: aborts of many sagas (each under
/// its own fence, in a savepoint of its own) in one short transaction of
/// their own, outside the batches, so a page pays one commit. Such a
/// transaction may meet a batch on PostgreSQL and lose a deadlock; the
/// caller then writes the page's sagas one by one ([`WriteAlone`]).
#[derive(Message)]
#[rtype(result = "Vec<StoreResult<Written>>")]
pub struct WritePageAlone(pub Vec<SagaWrite>);

/// Write one call of a fan-out saga and change its slot (see
/// [`Store::write_ai_call`]), taking free slots for the calls in `want`;
/// answers the calls that got one. A freed slot wakes the dispatchers; a
/// detached one the slot adopter.
#[derive(Message)]
#[rtype(result = "StoreResult<Vec<i32>>")]
pub struct WriteCall {
    pub saga_id: String,
    pub token: String,
    pub row: CallRow,
    pub slot: CallSlot,
    pub want: Wanted,
}

/// Take free slots for calls of a saga that holds none for them (see
/// [`Store::take_slots`]); answers the calls that got one.
#[derive(Message)]
#[rtype(result = "StoreResult<Vec<i32>>")]
pub struct TakeSlots {
    pub saga_id: String,
    pub token: String,
    pub want: Wanted,
}

/// Copy the session's earlier successful calls into a fan-out saga that
/// has none yet (see [`Store::seed_ai_calls`]).
#[derive(Message)]
#[rtype(result = "StoreResult<()>")]
pub struct SeedCalls {
    pub saga_id: String,
    pub session_id: String,
    pub token: String,
}

/// Writes queued at most before senders wait; writes per transaction;
/// transactions at once.
const LIMITS: BatchLimits = BatchLimits {
    capacity: 4_096,
    max_batch: 256,
    concurrent: 2,
    linger: std::time::Duration::ZERO,
};

pub struct PersistenceActor {
    store: Store,
    clock: SharedClock,
    lease_ms: i64,
    writes: BatchQueue<SagaWrite, StoreResult<Written>>,
    wakeups: Wakeups,
}

impl PersistenceActor {
    pub fn new(store: Store, clock: SharedClock, lease_ms: i64, wakeups: Wakeups) -> Self {
        let writes = {
            let (store, clock, wakeups) = (store.clone(), clock.clone(), wakeups.clone());
            BatchQueue::start("saga writes", LIMITS, move |batch: Vec<SagaWrite>| {
                let (store, now, wakeups) = (store.clone(), clock.now_ms(), wakeups.clone());
                async move { write_batch(&store, batch, now, lease_ms, &wakeups).await }
            })
        };
        PersistenceActor {
            store,
            clock,
            lease_ms,
            writes,
            wakeups,
        }
    }
}

/// Writes one batch, then sends the wake-ups it owes.
async fn write_batch(
    store: &Store,
    batch: Vec<SagaWrite>,
    now: i64,
    lease_ms: i64,
    wakeups: &Wakeups,
) -> Vec<StoreResult<Written>> {
    match store.apply_saga_writes(&batch, now, lease_ms).await {
        Ok(outcomes) => {
            let applied = || batch.iter().zip(&outcomes).filter(|(_, o)| o.is_ok());
            if applied().any(|(write, _)| write.frees_ai_slot()) {
                wakeups.saga_work();
            }
            for (write, _) in applied() {
                for evidence in write.slots_freed() {
                    crate::metrics::slots_freed(evidence.as_str(), 1);
                }
            }
            if outcomes
                .iter()
                .any(|o| o.as_ref().is_ok_and(|w| w.event_appended))
            {
                wakeups.event_appended();
            }
            if outcomes
                .iter()
                .any(|o| o.as_ref().is_ok_and(|w| w.detached))
            {
                wakeups.slots_detached.ring();
            }
            let hidden: Vec<String> = outcomes
                .iter()
                .filter_map(|o| o.as_ref().ok()?.ranking_changed.clone())
                .collect();
            if !hidden.is_empty() {
                wakeups.rankings_changed(&hidden, false);
            }
            outcomes
        }
        Err(e) => {
            tracing::error!(error = %e, writes = batch.len(), "a batch of saga writes failed; each saga's worker decides (a database error: the step runs again)");
            batch_failed(batch.len(), &e)
        }
    }
}

impl Actor for PersistenceActor {
    type Context = Context<Self>;
}

impl Handler<RenewLease> for PersistenceActor {
    type Result = ResponseFuture<StoreResult<()>>;
    fn handle(&mut self, m: RenewLease, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("PersistenceActor");
        let (store, now, lease) = (self.store.clone(), self.clock.now_ms(), self.lease_ms);
        Box::pin(async move { store.renew_lease(&m.saga_id, &m.token, now, lease).await })
    }
}

impl Handler<Write> for PersistenceActor {
    type Result = ResponseFuture<StoreResult<Written>>;
    fn handle(&mut self, m: Write, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("PersistenceActor");
        let writes = self.writes.clone();
        Box::pin(async move { writes.write(m.0).await })
    }
}

impl Handler<WriteAlone> for PersistenceActor {
    type Result = ResponseFuture<StoreResult<Written>>;
    fn handle(&mut self, m: WriteAlone, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("PersistenceActor");
        let (store, now, lease) = (self.store.clone(), self.clock.now_ms(), self.lease_ms);
        let wakeups = self.wakeups.clone();
        Box::pin(async move {
            write_batch(&store, vec![m.0], now, lease, &wakeups)
                .await
                .pop()
                .unwrap_or_else(|| Err(crate::store::StoreError::Corrupt("no outcome".into())))
        })
    }
}

impl Handler<WritePageAlone> for PersistenceActor {
    type Result = ResponseFuture<Vec<StoreResult<Written>>>;
    fn handle(&mut self, m: WritePageAlone, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("PersistenceActor");
        let (store, now, lease) = (self.store.clone(), self.clock.now_ms(), self.lease_ms);
        let wakeups = self.wakeups.clone();
        Box::pin(async move { write_batch(&store, m.0, now, lease, &wakeups).await })
    }
}

impl Handler<WriteCall> for PersistenceActor {
    type Result = ResponseFuture<StoreResult<Vec<i32>>>;
    fn handle(&mut self, m: WriteCall, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("PersistenceActor");
        let (store, now, lease) = (self.store.clone(), self.clock.now_ms(), self.lease_ms);
        let wakeups = self.wakeups.clone();
        Box::pin(async move {
            let granted = store
                .write_ai_call(
                    &m.saga_id,
                    &m.token,
                    &m.row,
                    m.slot.clone(),
                    &m.want,
                    now,
                    lease,
                )
                .await?;
            match m.slot {
                CallSlot::Free(evidence) => {
                    crate::metrics::slots_freed(evidence.as_str(), 1);
                    wakeups.saga_work();
                }
                CallSlot::Detach => wakeups.slots_detached.ring(),
                _ => {}
            }
            Ok(granted)
        })
    }
}

impl Handler<TakeSlots> for PersistenceActor {
    type Result = ResponseFuture<StoreResult<Vec<i32>>>;
    fn handle(&mut self, m: TakeSlots, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("PersistenceActor");
        let (store, now, lease) = (self.store.clone(), self.clock.now_ms(), self.lease_ms);
        Box::pin(async move {
            store
                .take_slots(&m.saga_id, &m.token, &m.want, now, lease)
                .await
        })
    }
}

impl Handler<SeedCalls> for PersistenceActor {
    type Result = ResponseFuture<StoreResult<()>>;
    fn handle(&mut self, m: SeedCalls, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("PersistenceActor");
        let (store, now, lease) = (self.store.clone(), self.clock.now_ms(), self.lease_ms);
        Box::pin(async move {
            store
                .seed_ai_calls(&m.saga_id, &m.session_id, &m.token, now, lease)
                .await
        })
    }
}
