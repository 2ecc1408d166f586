//! PersistenceActor: the short transactions of a saga, each fenced by the
//! lock token. After a transaction commits it sends the wake-ups it owes:
//! a freed AI slot (the saga left AI_PENDING, aborted, or released its
//! lease) wakes the dispatchers, and an appended outbox event wakes the
//! relay that numbers it for the displays.

use actix::prelude::*;

use super::wakeups::Wakeups;
use crate::clock::SharedClock;
use crate::domain::failure::AiResult;
use crate::domain::policy::{AttemptState, EpochMs};
use crate::domain::saga::AbortReason;
use crate::store::sagas::{Fence, RankedEntry};
use crate::store::{Store, StoreResult};

/// Extend the lease of a saga we hold.
#[derive(Message)]
#[rtype(result = "StoreResult<()>")]
pub struct RenewLease {
    pub saga_id: String,
    pub token: String,
}

/// The provider accepted the job of the current attempt.
#[derive(Message)]
#[rtype(result = "StoreResult<()>")]
pub struct RecordAiSubmitted {
    pub saga_id: String,
    pub token: String,
    pub job_id: String,
}

/// AI_PENDING -> AI_DONE.
#[derive(Message)]
#[rtype(result = "StoreResult<()>")]
pub struct RecordAiDone {
    pub saga_id: String,
    pub token: String,
    pub result: AiResult,
}

/// AI_DONE -> RANKING_DONE.
#[derive(Message)]
#[rtype(result = "StoreResult<()>")]
pub struct RecordRankingDone {
    pub saga_id: String,
    pub token: String,
    pub entry: Option<RankedEntry>,
}

/// Stay in AI_PENDING, release the lease, try again at `next_attempt_at`.
#[derive(Message)]
#[rtype(result = "StoreResult<()>")]
pub struct ReleaseForRetry {
    pub saga_id: String,
    pub token: String,
    pub state: AttemptState,
    pub next_attempt_at: EpochMs,
    pub attempt_counted: bool,
}

/// RANKING_DONE -> COMPLETED with result, session status and outbox event.
#[derive(Message)]
#[rtype(result = "StoreResult<()>")]
pub struct Complete {
    pub saga_id: String,
    pub token: String,
}

/// Any non-final step -> ABORTED with session status and outbox event.
/// `token: None` is the cleanup actor's abort of an unowned saga.
#[derive(Message)]
#[rtype(result = "StoreResult<()>")]
pub struct Abort {
    pub saga_id: String,
    pub token: Option<String>,
    pub reason: AbortReason,
    pub detail: String,
}

pub struct PersistenceActor {
    store: Store,
    clock: SharedClock,
    lease_ms: i64,
    wakeups: Wakeups,
}

impl PersistenceActor {
    pub fn new(store: Store, clock: SharedClock, lease_ms: i64, wakeups: Wakeups) -> Self {
        PersistenceActor {
            store,
            clock,
            lease_ms,
            wakeups,
        }
    }
}

impl Actor for PersistenceActor {
    type Context = Context<Self>;
}

type Reply<T> = ResponseFuture<StoreResult<T>>;

impl Handler<RenewLease> for PersistenceActor {
    type Result = Reply<()>;
    fn handle(&mut self, m: RenewLease, _: &mut Context<Self>) -> Self::Result {
        let (store, now, lease) = (self.store.clone(), self.clock.now_ms(), self.lease_ms);
        Box::pin(async move { store.renew_lease(&m.saga_id, &m.token, now, lease).await })
    }
}

impl Handler<RecordAiSubmitted> for PersistenceActor {
    type Result = Reply<()>;
    fn handle(&mut self, m: RecordAiSubmitted, _: &mut Context<Self>) -> Self::Result {
        let (store, now, lease) = (self.store.clone(), self.clock.now_ms(), self.lease_ms);
        Box::pin(async move {
            store
                .record_ai_submitted(&m.saga_id, &m.token, &m.job_id, now, lease)
                .await
        })
    }
}

impl Handler<RecordAiDone> for PersistenceActor {
    type Result = Reply<()>;
    fn handle(&mut self, m: RecordAiDone, _: &mut Context<Self>) -> Self::Result {
        let (store, now, lease) = (self.store.clone(), self.clock.now_ms(), self.lease_ms);
        let wakeups = self.wakeups.clone();
        Box::pin(async move {
            store
                .record_ai_done(&m.saga_id, &m.token, &m.result, now, lease)
                .await?;
            wakeups.saga_work(); // its AI slot is free
            Ok(())
        })
    }
}

impl Handler<RecordRankingDone> for PersistenceActor {
    type Result = Reply<()>;
    fn handle(&mut self, m: RecordRankingDone, _: &mut Context<Self>) -> Self::Result {
        let (store, now, lease) = (self.store.clone(), self.clock.now_ms(), self.lease_ms);
        Box::pin(async move {
            store
                .record_ranking_done(&m.saga_id, &m.token, m.entry, now, lease)
                .await
        })
    }
}

impl Handler<ReleaseForRetry> for PersistenceActor {
    type Result = Reply<()>;
    fn handle(&mut self, m: ReleaseForRetry, _: &mut Context<Self>) -> Self::Result {
        let (store, now) = (self.store.clone(), self.clock.now_ms());
        let wakeups = self.wakeups.clone();
        Box::pin(async move {
            store
                .release_for_retry(
                    &m.saga_id,
                    &m.token,
                    m.state,
                    m.next_attempt_at,
                    m.attempt_counted,
                    now,
                )
                .await?;
            wakeups.saga_work(); // its AI slot is free while it backs off
            Ok(())
        })
    }
}

impl Handler<Complete> for PersistenceActor {
    type Result = Reply<()>;
    fn handle(&mut self, m: Complete, _: &mut Context<Self>) -> Self::Result {
        let (store, now, wakeups) = (
            self.store.clone(),
            self.clock.now_ms(),
            self.wakeups.clone(),
        );
        Box::pin(async move {
            if store.complete(&m.saga_id, &m.token, now).await? {
                wakeups.event_appended();
            }
            Ok(())
        })
    }
}

impl Handler<Abort> for PersistenceActor {
    type Result = Reply<()>;
    fn handle(&mut self, m: Abort, _: &mut Context<Self>) -> Self::Result {
        let (store, now, wakeups) = (
            self.store.clone(),
            self.clock.now_ms(),
            self.wakeups.clone(),
        );
        Box::pin(async move {
            let fence = match &m.token {
                Some(token) => Fence::Token(token),
                None => Fence::Unowned,
            };
            let appended = store
                .abort(&m.saga_id, fence, m.reason, &m.detail, now)
                .await?;
            wakeups.saga_work(); // an aborted AI_PENDING saga frees its slot
            if appended {
                wakeups.event_appended();
            }
            Ok(())
        })
    }
}
