//! ReviewActor: the moving parts of the operators' review. A result in
//! review (IN_REVIEW) holds no lease, so no worker waits on it; this actor
//! - hands approved sagas to a worker: it adopts them (a fresh token and a
//!   lease, [`Store::adopt_approved`]) and sends them to the dispatcher,
//!   which starts their supervisors; they go on to ranking and completion.
//!   An adopter that dies leaves a lease that runs out, and the next round
//!   (here or on another instance) adopts the saga again;
//! - applies `review_timeout_action` to the items that waited out their
//!   experience's `review_timeout`, on time: it sleeps until the next
//!   timeout is due, never longer than [`TICK`].
//!
//! Woken by the [`Wakeups::review`] doorbell (an approval, a result that
//! entered review, the same news from another instance) and every [`TICK`]
//! as a safety net. Rounds never overlap; a ring during one makes one more.
//! The mailbox holds nothing: wake-ups are a doorbell, and the rows are the
//! queue. An idle instance only reads (one probe of the review index).

use std::time::Duration;

use actix::prelude::*;

use super::dispatcher::{Adopt, Dispatcher};
use super::persistence::{PersistenceActor, WriteAlone};
use super::wakeups::Wakeups;
use crate::clock::SharedClock;
use crate::domain::audit::AuditEntry;
use crate::domain::review::Decision;
use crate::store::transitions::SagaWrite;
use crate::store::{Store, StoreError};

/// Items decided or adopted per round (a full round goes on at once).
const BATCH: u64 = 100;
/// The safety net's period, and the longest a due timeout waits.
pub const TICK: Duration = Duration::from_secs(1);

/// Look at the review queue now.
#[derive(Message)]
#[rtype(result = "()")]
struct Round;

pub struct ReviewActor {
    store: Store,
    clock: SharedClock,
    wakeups: Wakeups,
    dispatcher: Addr<Dispatcher>,
    persistence: Addr<PersistenceActor>,
    lease_ms: i64,
    /// A fresh deadline for an approved saga (`SAGA_DEADLINE`).
    deadline_ms: i64,
    busy: bool,
    again: bool,
    /// The pending early round for the next timeout.
    timer: Option<SpawnHandle>,
}

impl ReviewActor {
    pub fn new(
        store: Store,
        clock: SharedClock,
        wakeups: Wakeups,
        dispatcher: Addr<Dispatcher>,
        persistence: Addr<PersistenceActor>,
        lease_ms: i64,
        deadline_ms: i64,
    ) -> Self {
        ReviewActor {
            store,
            clock,
            wakeups,
            dispatcher,
            persistence,
            lease_ms,
            deadline_ms,
            busy: false,
            again: false,
            timer: None,
        }
    }

    fn round(&mut self, ctx: &mut Context<Self>) {
        if self.busy {
            self.again = true;
            return;
        }
        self.busy = true;
        self.again = false;
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
        let (store, clock, wakeups, dispatcher, persistence) = (
            self.store.clone(),
            self.clock.clone(),
            self.wakeups.clone(),
            self.dispatcher.clone(),
            self.persistence.clone(),
        );
        let (lease_ms, deadline_ms) = (self.lease_ms, self.deadline_ms);
        let work = async move {
            let timed_out = apply_timeouts(&store, &clock, &wakeups, &persistence).await;
            let adopted = match store
                .adopt_approved(clock.now_ms(), lease_ms, deadline_ms, BATCH)
                .await
            {
                Ok(sagas) => sagas,
                Err(e) => {
                    tracing::warn!(error = %e, "could not adopt approved sagas; trying again");
                    Vec::new()
                }
            };
            let full = adopted.len() as u64 == BATCH || timed_out == BATCH;
            if !adopted.is_empty() {
                tracing::info!(
                    sagas = adopted.len(),
                    "approved sagas go on to ranking and completion"
                );
                if let Err(e) = dispatcher.send(Adopt(adopted)).await {
                    // Their leases run out and the next round adopts them.
                    tracing::warn!(error = %e, "the dispatcher is gone; approved sagas wait for their leases to run out");
                }
            }
            let next_timeout = store.next_review_timeout().await.ok().flatten();
            (full, next_timeout.map(|at| at - clock.now_ms()))
        };
        crate::metrics::task_spawned("review.round");
        ctx.spawn(work.into_actor(self).map(|(full, due_in_ms), act, ctx| {
            act.busy = false;
            if act.again || full {
                act.round(ctx);
            } else if let Some(ms) = due_in_ms.filter(|ms| (*ms as u128) < TICK.as_millis()) {
                // A timeout falls due before the next tick: be there.
                let wait = Duration::from_millis(ms.max(0) as u64);
                act.timer = Some(ctx.run_later(wait, |act, ctx| {
                    act.timer = None;
                    act.round(ctx);
                }));
            }
        }));
    }
}

/// Decides the items whose review timeout ran out; how many were due.
async fn apply_timeouts(
    store: &Store,
    clock: &SharedClock,
    wakeups: &Wakeups,
    persistence: &Addr<PersistenceActor>,
) -> u64 {
    let due = match store.review_timed_out(clock.now_ms(), BATCH).await {
        Ok(due) => due,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the review timeouts; trying again");
            return 0;
        }
    };
    for (saga_id, decision) in &due {
        let now = clock.now_ms();
        match decide(
            store,
            persistence,
            wakeups,
            saga_id,
            *decision,
            now,
            "the review timed out",
            None,
        )
        .await
        {
            Ok(()) => {
                tracing::info!(%saga_id, %decision, "review timed out: decided by the experience's review_timeout_action")
            }
            // An operator (or another instance) decided it meanwhile.
            Err(DecideError::Store(StoreError::Review(refused))) => {
                tracing::debug!(%saga_id, %refused, "review timeout: already decided")
            }
            Err(e) => {
                tracing::warn!(%saga_id, error = %e, "review timeout: could not decide; trying again")
            }
        }
    }
    due.len() as u64
}

/// Why a decision was not taken.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the persistence actor is gone: {0}")]
    PersistenceGone(#[from] MailboxError),
}

/// One decision on a saga in review, under the review's fence: approve
/// marks it approved (the review actor then adopts it); reject aborts it
/// `REVIEW_REJECTED` with its credits refunded and a neutral message to
/// the display. The one piece of code every path of a decision goes
/// through: the operators' endpoints, the bulk action and the timeout.
/// A decision taken wakes the review actors and the operators' hubs. An
/// operator's decision carries its audit record, written with it.
#[allow(clippy::too_many_arguments)]
pub async fn decide(
    store: &Store,
    persistence: &Addr<PersistenceActor>,
    wakeups: &Wakeups,
    saga_id: &str,
    decision: Decision,
    now: i64,
    detail: &str,
    audit: Option<AuditEntry>,
) -> Result<(), DecideError> {
    match decision {
        Decision::Approve => store.approve(saga_id, audit.as_ref(), now).await?,
        Decision::Reject => {
            let write = SagaWrite::review_reject(saga_id, detail, audit);
            persistence.send(WriteAlone(write)).await??;
        }
    }
    wakeups.review_changed();
    Ok(())
}

impl Actor for ReviewActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.round(ctx);
        ctx.run_interval(TICK, |act, ctx| act.round(ctx));
        self.wakeups.review.forward_to(ctx.address(), || Round);
    }
}

impl Handler<Round> for ReviewActor {
    type Result = ();
    fn handle(&mut self, _: Round, ctx: &mut Context<Self>) {
        crate::metrics::actor_message("ReviewActor");
        self.round(ctx);
    }
}
