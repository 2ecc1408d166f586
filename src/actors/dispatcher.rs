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
//! round goes on with the others, starting everything it did claim; a
//! round that failed anywhere is followed by another one second later, so
//! claims resume soon after a database restart. Rounds
//! never overlap: a wake-up during a round asks for one more round, which
//! starts [`ROUND_GAP`] after it.
//!
//! Experiences are claimed provider by provider, sharing a provider's
//! slots by weight (see `domain::sharing`). While a provider's circuit
//! breaker is open (`ProviderBreaker`), rounds claim no AI work for its
//! experiences, only sagas past the AI step; after its cool-down one round,
//! on one instance, claims a single AI saga of it: the probe.
//!
//! Shutting down ([`Drain`]): rounds stop claiming at once; running sagas
//! go on for a bounded grace; what is still running then is stopped and
//! handed over in one transaction ([`Store::hand_over`]), so another
//! instance resumes it at once without using up a recovery.
//!
//! Mailbox: the doorbell loop awaits each `Wake` it sends, so rings collapse
//! instead of queueing; `SagaStopped` comes once per running saga (at most
//! `max_running`); `WakeAt` once per backoff; `Drain` once.

use std::collections::HashMap;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::watch;

use super::providers::Providers;
use super::saga_supervisor::{
    ExperienceOf, SagaDeps, SagaStopped, SagaSupervisor, Starter, StopSupervisor, WakeAt,
};
use super::wakeups::Doorbell;
use crate::domain::breaker::Admission;
use crate::domain::policy::EpochMs;
use crate::metrics;
use crate::store::entities::{experiences, sagas};
use crate::store::sagas::{ClaimRules, ClaimableExperience, Holds};
use crate::store::{retry_transient, Store, StoreResult};

/// The least time between the end of a round and the start of the next
/// when wake-ups keep coming. A freed slot still starts the next saga
/// within milliseconds.
const ROUND_GAP: Duration = Duration::from_millis(5);

/// After a round that failed (the database is restarting, say), the next
/// one starts this soon, whatever the poll interval.
const RETRY_FAILED_ROUND: Duration = Duration::from_secs(1);

/// Claim now.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wake;

/// Shut down: claim nothing more, give running sagas up to `grace` to
/// end, then stop and hand over the rest. Answered when done.
/// Start supervisors for these sagas, already given a token and a lease
/// by the review actor (approved results, adopted out of IN_REVIEW).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Adopt(pub Vec<sagas::Model>);

#[derive(Message)]
#[rtype(result = "Drained")]
pub struct Drain {
    pub grace: Duration,
}

/// What [`Drain`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Drained {
    /// Sagas running when the drain began.
    pub running: usize,
    /// Of those, still running at the end of the grace and handed over.
    pub handed_over: u64,
    /// Still running at the end of the grace and NOT handed over (the
    /// database refused): their leases run out and they are recovered.
    pub left_to_expire: usize,
}

/// A running supervisor: its lock token, and how to stop it.
struct Running {
    token: String,
    supervisor: Addr<SagaSupervisor>,
}

pub struct Dispatcher {
    deps: SagaDeps,
    /// The providers, each with its circuit breaker (which says whether
    /// its AI work may be claimed).
    providers: Providers,
    rules: ClaimRules,
    poll_interval: Duration,
    bell: Doorbell,
    /// Supervisors this instance runs at most.
    max_running: usize,
    /// Supervisors running now, by saga id.
    running: HashMap<String, Running>,
    /// How many are running, for [`Drain`] to wait on.
    running_count: watch::Sender<usize>,
    /// Shutting down: claim nothing more.
    draining: bool,
    /// A round is running; a wake-up meanwhile sets `again`.
    busy: bool,
    again: bool,
    /// A wake-up found no room; the next stopping supervisor claims.
    starved: bool,
}

impl Dispatcher {
    pub fn new(
        deps: SagaDeps,
        providers: Providers,
        rules: ClaimRules,
        poll_interval: Duration,
        bell: Doorbell,
        max_running: usize,
    ) -> Self {
        Dispatcher {
            deps,
            providers,
            rules,
            poll_interval,
            bell,
            max_running: max_running.max(1),
            running: HashMap::new(),
            running_count: watch::channel(0).0,
            draining: false,
            busy: false,
            again: false,
            starved: false,
        }
    }

    /// A supervisor for each saga (claimed or adopted: it holds our token).
    fn start_supervisors(
        &mut self,
        sagas: Vec<(sagas::Model, ExperienceOf, Holds)>,
        ctx: &mut Context<Self>,
    ) {
        for (saga, experience, holds) in sagas {
            tracing::debug!(
                saga_id = %saga.id, step = %saga.step, recoveries = saga.recoveries,
                "claimed saga"
            );
            let (saga_id, token) = (saga.id.clone(), saga.lock_token.clone());
            if let (Some(supervisor), Some(token)) = (
                SagaSupervisor::new(saga, experience, holds, self.deps.clone(), starter(ctx)),
                token,
            ) {
                let supervisor = supervisor.start();
                self.running.insert(saga_id, Running { token, supervisor });
            }
        }
        self.running_count.send_replace(self.running.len());
    }

    fn round(&mut self, ctx: &mut Context<Self>) {
        if self.draining {
            return;
        }
        if self.busy {
            self.again = true;
            return;
        }
        let room = self.max_running.saturating_sub(self.running.len());
        if room == 0 {
            self.starved = true;
            return;
        }
        self.busy = true;
        // This round serves every wake-up so far (those during the gap too).
        self.again = false;
        let claim = claim_round(
            self.deps.store.clone(),
            self.providers.clone(),
            self.deps.clock.now_ms(),
            self.rules,
            room,
        );
        crate::metrics::task_spawned("dispatcher.round");
        ctx.spawn(
            claim
                .into_actor(self)
                .map(move |(claimed, failed), act, ctx| {
                    metrics::claimed(claimed.len());
                    if failed {
                        // The database may be restarting: try again soon rather
                        // than at the next poll (10 s by default).
                        ctx.run_later(RETRY_FAILED_ROUND, |act, ctx| act.round(ctx));
                    }
                    if claimed.len() == room {
                        // More may be waiting than we had room for.
                        act.starved = true;
                    }
                    act.start_supervisors(claimed, ctx);
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
                }),
        );
    }
}

/// Claims for every experience with claimable work, at most `room` sagas
/// in all, each with what its supervisor needs of its experience, and
/// says whether anything failed. Experiences are claimed provider by
/// provider: on a provider with a shared cap, all its experiences in one
/// claim that shares the slots among them ([`Store::claim_for_provider`]);
/// on one without, each experience in its own claim, so a failure for one
/// does not stop the others. While a provider's breaker is open no AI work
/// is claimed for its experiences (sagas past the AI step still are), and
/// when its cool-down is over, one AI saga (the probe). An experience
/// whose provider this instance does not know (it is not in the providers
/// file) is skipped with an error.
async fn claim_round(
    store: Store,
    providers: Providers,
    now: EpochMs,
    rules: ClaimRules,
    room: usize,
) -> (Vec<(sagas::Model, ExperienceOf, Holds)>, bool) {
    let experiences: StoreResult<Vec<ClaimableExperience>> =
        store.experiences_with_claimable(now, rules).await;
    let experiences = match experiences {
        Ok(experiences) => experiences,
        Err(e) => {
            tracing::error!(error = %e, retry_in_ms = RETRY_FAILED_ROUND.as_millis() as u64, "claim round failed");
            return (Vec::new(), true);
        }
    };
    // By provider, each in the order of its experiences (oldest first).
    let mut groups: Vec<(String, Vec<ClaimableExperience>)> = Vec::new();
    for e in experiences {
        match groups.iter_mut().find(|(p, _)| *p == e.provider) {
            Some((_, group)) => group.push(e),
            None => groups.push((e.provider.clone(), vec![e])),
        }
    }
    let mut failed = false;
    let mut claimed = Vec::new();
    for (provider, mut experiences) in groups {
        let Some(handle) = providers.get(&provider) else {
            tracing::error!(
                %provider, experiences = experiences.len(),
                "experiences name a provider this instance does not have (not in its providers file): their sagas wait"
            );
            continue;
        };
        let wants_ai = |e: &ClaimableExperience| e.has_expired_ai || e.has_queued_ai;
        let admission = if experiences.iter().any(wants_ai) {
            // The breaker is the provider's: every experience of the
            // group read the same row.
            handle.breaker.admission(experiences[0].breaker).await
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
        let of = |e: &ClaimableExperience| ExperienceOf::of(e, handle.ai.clone());
        if let Some(experience) = probe {
            let probe = std::slice::from_ref(&experience);
            match store.claim_for_provider(probe, 1, now, rules).await {
                Ok(sagas) => claimed.extend(
                    sagas
                        .into_iter()
                        .map(|c| (c.saga, of(&experience), c.holds)),
                ),
                Err(e) => {
                    failed = true;
                    tracing::error!(%provider, error = %e, "the breaker's probe could not be claimed")
                }
            }
        }
        // One claim for a shared cap; one per experience without.
        let batches: Vec<Vec<ClaimableExperience>> = match experiences.first() {
            Some(first) if first.provider_max_in_flight.is_some() => vec![experiences],
            _ => experiences.into_iter().map(|e| vec![e]).collect(),
        };
        for batch in batches {
            let left = room.saturating_sub(claimed.len());
            if left == 0 {
                break;
            }
            match store.claim_for_provider(&batch, left, now, rules).await {
                Ok(sagas) => claimed.extend(
                    sagas
                        .into_iter()
                        .map(|c| (c.saga, of(&batch[c.experience]), c.holds)),
                ),
                Err(e) => {
                    failed = true;
                    tracing::error!(
                        %provider, experiences = batch.len(), error = %e,
                        retry_in_ms = RETRY_FAILED_ROUND.as_millis() as u64,
                        "claim failed; the other experiences go on"
                    )
                }
            }
        }
    }
    let claimed = on_the_account_of_their_jobs(&store, &providers, claimed).await;
    (claimed, failed)
}

/// Resumed sagas whose jobs run on another provider than their
/// experience's (an operator moved the experience while they ran) go on
/// with the provider their slots are on: their job is polled where it
/// runs, and counted there. Only resumed sagas (their holds are read)
/// can have one; a saga whose slots' provider is not configured here goes
/// on with its experience's, as before the move.
async fn on_the_account_of_their_jobs(
    store: &Store,
    providers: &Providers,
    claimed: Vec<(sagas::Model, ExperienceOf, Holds)>,
) -> Vec<(sagas::Model, ExperienceOf, Holds)> {
    let mut out = Vec::with_capacity(claimed.len());
    for (saga, mut experience, holds) in claimed {
        if holds == Holds::Read {
            match store.provider_of_slots(&saga.id).await {
                Ok(Some(provider)) if provider != experience.provider => {
                    if let Some(handle) = providers.get(&provider) {
                        tracing::info!(saga_id = %saga.id, %provider, moved_to = %experience.provider, "a resumed saga's job runs on the provider its experience moved from: it goes on there");
                        experience.ai = handle.ai.clone();
                        experience.provider = provider;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(saga_id = %saga.id, error = %e, "could not read the provider of a resumed saga's slots; it goes on with its experience's")
                }
            }
        }
        out.push((saga, experience, holds));
    }
    out
}

impl Actor for Dispatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.round(ctx);
        ctx.run_interval(self.poll_interval, |act, ctx| act.round(ctx));
        self.bell.forward_to(ctx.address(), || Wake);
    }
}

impl Handler<Wake> for Dispatcher {
    type Result = ();
    fn handle(&mut self, _: Wake, ctx: &mut Context<Self>) {
        crate::metrics::actor_message("Dispatcher");
        self.round(ctx);
    }
}

/// Where this dispatcher's supervisors report: a backoff's end and their
/// stop.
fn starter(ctx: &Context<Dispatcher>) -> Starter {
    let me = ctx.address();
    Starter {
        wake_at: me.clone().recipient(),
        stopped: me.recipient(),
    }
}

impl Handler<WakeAt> for Dispatcher {
    type Result = ();
    fn handle(&mut self, m: WakeAt, ctx: &mut Context<Self>) {
        crate::metrics::actor_message("Dispatcher");
        let delay_ms = (m.0 - self.deps.clock.now_ms()).max(0) as u64;
        ctx.run_later(Duration::from_millis(delay_ms), |act, ctx| act.round(ctx));
    }
}

impl Handler<SagaStopped> for Dispatcher {
    type Result = ();
    fn handle(&mut self, m: SagaStopped, ctx: &mut Context<Self>) {
        crate::metrics::actor_message("Dispatcher");
        self.running.remove(&m.saga_id);
        self.running_count.send_replace(self.running.len());
        if std::mem::take(&mut self.starved) {
            self.round(ctx);
        }
    }
}

impl Handler<Adopt> for Dispatcher {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, m: Adopt, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("Dispatcher");
        let (store, providers) = (self.deps.store.clone(), self.providers.clone());
        let load = async move {
            let mut experiences: HashMap<String, Option<experiences::Model>> = HashMap::new();
            let mut ready = Vec::with_capacity(m.0.len());
            for saga in m.0 {
                if !experiences.contains_key(&saga.experience_id) {
                    let found = match store.experience_by_id(&saga.experience_id).await {
                        Ok(found) => found,
                        Err(e) => {
                            tracing::warn!(saga_id = %saga.id, error = %e, "could not read an adopted saga's experience; its lease runs out and it is adopted again");
                            continue;
                        }
                    };
                    experiences.insert(saga.experience_id.clone(), found);
                }
                let Some(Some(experience)) = experiences.get(&saga.experience_id) else {
                    continue;
                };
                let Some(handle) = providers.get(&experience.provider) else {
                    tracing::error!(saga_id = %saga.id, provider = %experience.provider, "an approved saga's provider is not configured on this instance; another instance adopts it when its lease runs out");
                    continue;
                };
                let of = ExperienceOf::of_model(experience, handle.ai.clone());
                // Past the AI step: it holds no AI slot.
                ready.push((saga, of, Holds::Fresh(Vec::new())));
            }
            ready
        };
        Box::pin(load.into_actor(self).map(|ready, act, ctx| {
            if act.draining {
                // Shutting down: their leases run out and another
                // instance adopts them.
                return;
            }
            act.start_supervisors(ready, ctx);
        }))
    }
}

impl Handler<Drain> for Dispatcher {
    type Result = ResponseActFuture<Self, Drained>;

    fn handle(&mut self, m: Drain, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("Dispatcher");
        self.draining = true;
        let running = self.running.len();
        tracing::info!(
            running,
            grace_ms = m.grace.as_millis() as u64,
            "shutting down: claiming nothing more; waiting for running sagas"
        );
        let mut count = self.running_count.subscribe();
        let wait = async move {
            let _ = tokio::time::timeout(m.grace, count.wait_for(|n| *n == 0)).await;
        };
        Box::pin(wait.into_actor(self).then(move |_, act, _| {
            // Stop what is left first, so no step of ours runs on while
            // another instance takes the saga.
            let held: Vec<(String, String)> = act
                .running
                .drain()
                .map(|(saga_id, r)| {
                    r.supervisor.do_send(StopSupervisor);
                    (saga_id, r.token)
                })
                .collect();
            act.running_count.send_replace(0);
            let (store, now) = (act.deps.store.clone(), act.deps.clock.now_ms());
            async move {
                let left = held.len();
                if left == 0 {
                    return Drained {
                        running,
                        ..Drained::default()
                    };
                }
                match retry_transient(|| store.hand_over(&held, now)).await {
                    Ok(handed_over) => {
                        tracing::info!(
                            handed_over,
                            "handed over the sagas still running; another instance resumes them now"
                        );
                        Drained {
                            running,
                            handed_over,
                            left_to_expire: left - handed_over as usize,
                        }
                    }
                    Err(e) => {
                        tracing::error!(
                            sagas = left, error = %e,
                            "could not hand over the sagas still running; they are resumed when their leases run out"
                        );
                        Drained {
                            running,
                            handed_over: 0,
                            left_to_expire: left,
                        }
                    }
                }
            }
            .into_actor(act)
        }))
    }
}
