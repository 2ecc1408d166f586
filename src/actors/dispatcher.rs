//! Dispatcher: the queue. Woken through its [`Doorbell`] right after a
//! submission commits and whenever an AI slot frees (a saga leaves
//! AI_PENDING, aborts, or releases its lease), on this instance or, through
//! the cluster bridge, on another; when a backoff ends ([`WakeAt`]); when one
//! of its own supervisors stops ([`SagaStopped`]); and on the poll timer only
//! as a safety net.
//!
//! Each round claims, per experience, the oldest runnable sagas that fit
//! under its `max_in_flight` and under this instance's `max_running` (the
//! store makes the claim atomic), and starts one [`SagaSupervisor`] per
//! claimed saga. A claim that fails for one experience is logged and the
//! round goes on with the others, starting everything it did claim. Rounds
//! never overlap: a wake-up during a round asks for one more round, which
//! starts [`ROUND_GAP`] after it.
//!
//! While the AI provider's circuit breaker is open ([`ProviderBreaker`]),
//! rounds claim no AI work, only sagas past the AI step; after its
//! cool-down one round, on one instance, claims a single AI saga: the
//! probe.
//!
//! Mailbox: the doorbell loop awaits each `Wake` it sends, so rings collapse
//! instead of queueing; `SagaStopped` comes once per running saga (at most
//! `max_running`); `WakeAt` once per backoff.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use super::breaker::ProviderBreaker;
use super::saga_supervisor::{SagaDeps, SagaSupervisor};
use super::wakeups::Doorbell;
use crate::domain::breaker::Admission;
use crate::domain::policy::EpochMs;
use crate::store::entities::sagas;
use crate::store::sagas::ClaimRules;
use crate::store::sagas::ClaimableExperience;
use crate::store::{Store, StoreResult};

/// The least time between the end of a round and the start of the next
/// when wake-ups keep coming. A freed slot still starts the next saga
/// within milliseconds.
const ROUND_GAP: Duration = Duration::from_millis(5);

/// Claim now.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wake;

/// Claim again at this time (a backoff ends then).
#[derive(Message)]
#[rtype(result = "()")]
pub struct WakeAt(pub EpochMs);

/// One of this instance's supervisors stopped: its place is free.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SagaStopped;

pub struct Dispatcher {
    deps: SagaDeps,
    /// Says whether AI work may be claimed (the provider's circuit breaker).
    breaker: Arc<ProviderBreaker>,
    rules: ClaimRules,
    poll_interval: Duration,
    bell: Doorbell,
    /// Supervisors this instance runs at most.
    max_running: usize,
    /// Supervisors running now.
    running: usize,
    /// A round is running; a wake-up meanwhile sets `again`.
    busy: bool,
    again: bool,
    /// A wake-up found no room; the next stopping supervisor claims.
    starved: bool,
}

impl Dispatcher {
    pub fn new(
        deps: SagaDeps,
        breaker: Arc<ProviderBreaker>,
        rules: ClaimRules,
        poll_interval: Duration,
        bell: Doorbell,
        max_running: usize,
    ) -> Self {
        Dispatcher {
            deps,
            breaker,
            rules,
            poll_interval,
            bell,
            max_running: max_running.max(1),
            running: 0,
            busy: false,
            again: false,
            starved: false,
        }
    }

    fn round(&mut self, ctx: &mut Context<Self>) {
        if self.busy {
            self.again = true;
            return;
        }
        let room = self.max_running.saturating_sub(self.running);
        if room == 0 {
            self.starved = true;
            return;
        }
        self.busy = true;
        // This round serves every wake-up so far (those during the gap too).
        self.again = false;
        let claim = claim_round(
            self.deps.store.clone(),
            self.breaker.clone(),
            self.deps.clock.now_ms(),
            self.rules,
            room,
        );
        ctx.spawn(claim.into_actor(self).map(move |claimed, act, ctx| {
            if claimed.len() == room {
                // More may be waiting than we had room for.
                act.starved = true;
            }
            for (saga, kind) in claimed {
                tracing::debug!(
                    saga_id = %saga.id, step = %saga.step, recoveries = saga.recoveries,
                    "claimed saga"
                );
                if let Some(supervisor) =
                    SagaSupervisor::new(saga, kind, act.deps.clone(), ctx.address())
                {
                    supervisor.start();
                    act.running += 1;
                }
            }
            if std::mem::take(&mut act.again) {
                // Woken during the round: one more round, after a short
                // gap in which more work gathers, so a busy queue is
                // claimed in batches rather than in one round per commit.
                ctx.run_later(ROUND_GAP, |act, ctx| {
                    act.busy = false;
                    act.round(ctx);
                });
            } else {
                act.busy = false;
            }
        }));
    }
}

/// Claims for every experience with claimable work, at most `room` sagas
/// in all, each with its experience's kind. A failure for one experience
/// does not stop the others. While the provider's breaker is open no AI
/// work is claimed (sagas past the AI step still are), and when its
/// cool-down is over, one AI saga in all (the probe).
async fn claim_round(
    store: Store,
    breaker: Arc<ProviderBreaker>,
    now: EpochMs,
    rules: ClaimRules,
    room: usize,
) -> Vec<(sagas::Model, String)> {
    let experiences: StoreResult<Vec<ClaimableExperience>> =
        store.experiences_with_claimable(now, rules).await;
    let mut experiences = match experiences {
        Ok(experiences) => experiences,
        Err(e) => {
            tracing::error!(error = %e, "claim round failed; retrying on the next wake-up");
            return Vec::new();
        }
    };
    let wants_ai = |e: &ClaimableExperience| e.has_expired_ai || e.has_queued_ai;
    let admission = if experiences.iter().any(wants_ai) {
        breaker.admission().await
    } else {
        Admission::All
    };
    let mut probe = None;
    if admission != Admission::All {
        if admission == Admission::Probe {
            probe = experiences
                .iter()
                .find(|e| wants_ai(e))
                .map(|e| ClaimableExperience {
                    has_resumed: false,
                    ..e.clone()
                });
        }
        for e in &mut experiences {
            e.has_expired_ai = false;
            e.has_queued_ai = false;
        }
        experiences.retain(|e| e.has_resumed);
    }
    let mut claimed = Vec::new();
    if let Some(experience) = probe {
        match store.claim_runnable(&experience, 1, now, rules).await {
            Ok(sagas) => claimed.extend(sagas.into_iter().map(|s| (s, experience.kind.clone()))),
            Err(e) => tracing::error!(error = %e, "the breaker's probe could not be claimed"),
        }
    }
    for experience in experiences {
        let left = room - claimed.len();
        if left == 0 {
            break;
        }
        match store.claim_runnable(&experience, left, now, rules).await {
            Ok(sagas) => claimed.extend(sagas.into_iter().map(|s| (s, experience.kind.clone()))),
            Err(e) => tracing::error!(
                experience_id = %experience.id, error = %e,
                "claim failed for this experience; the others go on, it is retried on the next wake-up"
            ),
        }
    }
    claimed
}

impl Actor for Dispatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.round(ctx);
        ctx.run_interval(self.poll_interval, |act, ctx| act.round(ctx));
        let (bell, me) = (self.bell.clone(), ctx.address());
        actix::spawn(async move {
            loop {
                bell.rung().await;
                if me.send(Wake).await.is_err() {
                    break; // the dispatcher stopped
                }
            }
        });
    }
}

impl Handler<Wake> for Dispatcher {
    type Result = ();
    fn handle(&mut self, _: Wake, ctx: &mut Context<Self>) {
        self.round(ctx);
    }
}

impl Handler<WakeAt> for Dispatcher {
    type Result = ();
    fn handle(&mut self, m: WakeAt, ctx: &mut Context<Self>) {
        let delay_ms = (m.0 - self.deps.clock.now_ms()).max(0) as u64;
        ctx.run_later(Duration::from_millis(delay_ms), |act, ctx| act.round(ctx));
    }
}

impl Handler<SagaStopped> for Dispatcher {
    type Result = ();
    fn handle(&mut self, _: SagaStopped, ctx: &mut Context<Self>) {
        self.running = self.running.saturating_sub(1);
        if std::mem::take(&mut self.starved) {
            self.round(ctx);
        }
    }
}
