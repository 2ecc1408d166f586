//! LingeringJobsActor: frees the slots of jobs that outlived their saga
//! (rule 10: a slot is free only when no job runs in it). A saga that
//! ended while a job of it may still run left a `lingering_jobs` row in
//! the same transaction (see `store::providers`); that row counts as a slot
//! of its provider and experience until this actor removes it. For each
//! row it takes (with a short lease, so two instances never work on one):
//! - first it asks the provider to cancel the job: a job now final frees
//!   its slot at once; a provider without cancel (404 or 405) is polled;
//! - then it polls the job, at the AI poll interval, until the provider
//!   says it is final;
//! - past the row's `until_ms` it gives up on the job (an ERROR: the
//!   provider kept it running longer than the saga itself could have
//!   waited) and frees the slot.
//!
//! Every freed slot wakes the dispatchers. Woken by its [`Wakeups`]
//! doorbell when a job starts lingering here, and every second as a safety
//! net (another instance's rows, a lease that ran out). The mailbox holds
//! nothing: wake-ups are a doorbell, and the rows are the queue.

use std::time::Duration;

use actix::prelude::*;

use super::ai::{CancelJob, PollJob};
use super::providers::Providers;
use super::wakeups::Wakeups;
use crate::ai::CancelOutcome;
use crate::clock::SharedClock;
use crate::domain::failure::AiFailure;
use crate::store::providers::LingeringJob;
use crate::store::Store;

/// Rows taken per round.
const BATCH: usize = 64;
/// How long a taken row is ours while we ask the provider about it.
const LEASE_MS: i64 = 5_000;
/// The safety net's period.
const TICK: Duration = Duration::from_secs(1);
/// After an unavailable provider, ask again this much later.
const RETRY_UNAVAILABLE_MS: i64 = 2_000;

/// Look at the lingering jobs now.
#[derive(Message)]
#[rtype(result = "()")]
struct Round;

pub struct LingeringJobsActor {
    store: Store,
    clock: SharedClock,
    providers: Providers,
    wakeups: Wakeups,
    poll_interval_ms: i64,
    busy: bool,
    again: bool,
}

impl LingeringJobsActor {
    pub fn new(
        store: Store,
        clock: SharedClock,
        providers: Providers,
        wakeups: Wakeups,
        poll_interval: Duration,
    ) -> Self {
        LingeringJobsActor {
            store,
            clock,
            providers,
            wakeups,
            poll_interval_ms: poll_interval.as_millis().max(10) as i64,
            busy: false,
            again: false,
        }
    }

    fn round(&mut self, ctx: &mut Context<Self>) {
        if self.busy {
            self.again = true;
            return;
        }
        self.busy = true;
        self.again = false;
        let (store, clock, providers, wakeups, poll_ms) = (
            self.store.clone(),
            self.clock.clone(),
            self.providers.clone(),
            self.wakeups.clone(),
            self.poll_interval_ms,
        );
        let work = async move {
            let jobs = match store.take_lingering(BATCH, clock.now_ms(), LEASE_MS).await {
                Ok(jobs) => jobs,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the lingering AI jobs; trying again");
                    return None;
                }
            };
            let handled = futures_util::future::join_all(
                jobs.into_iter()
                    .map(|job| settle(&store, &clock, &providers, poll_ms, job)),
            )
            .await;
            if handled.iter().any(|freed| *freed) {
                wakeups.saga_work();
            }
            Some(handled.len())
        };
        crate::metrics::task_spawned("lingering.round");
        ctx.spawn(work.into_actor(self).map(|taken, act, ctx| {
            act.busy = false;
            // A full batch may have left more; a poll is due soon.
            if act.again || taken == Some(BATCH) {
                act.round(ctx);
            } else if taken.is_some_and(|n| n > 0) {
                ctx.run_later(
                    Duration::from_millis(act.poll_interval_ms as u64),
                    |act, ctx| act.round(ctx),
                );
            }
        }));
    }
}

/// One job: cancel it once, or poll it; true when its slot is free now.
async fn settle(
    store: &Store,
    clock: &SharedClock,
    providers: &Providers,
    poll_ms: i64,
    job: LingeringJob,
) -> bool {
    let now = clock.now_ms();
    let job = &job;
    let free = |why: &'static str| async move {
        match store.release_lingering(job).await {
            Ok(freed) => {
                if freed {
                    tracing::info!(provider = %job.provider, job_id = %job.job_id, saga_id = %job.saga_id, why, "lingering AI job ended: its slot is free");
                }
                freed
            }
            Err(e) => {
                tracing::warn!(error = %e, job_id = %job.job_id, "could not free a lingering job's slot; trying again");
                false
            }
        }
    };
    if now > job.until_ms {
        tracing::error!(
            provider = %job.provider, job_id = %job.job_id, saga_id = %job.saga_id,
            "an AI job of an ended saga is still not final past its bound; giving up on it and freeing its slot"
        );
        return free("given up").await;
    }
    let Some(provider) = providers.get(&job.provider) else {
        tracing::error!(provider = %job.provider, job_id = %job.job_id, "a lingering job's provider is not configured on this instance; it keeps its slot until its bound");
        let _ = store
            .lingering_later(job, job.cancel_tried, now + 60_000)
            .await;
        return false;
    };
    let later = |cancel_tried: bool, at: i64| async move {
        if let Err(e) = store.lingering_later(job, cancel_tried, at).await {
            tracing::warn!(error = %e, job_id = %job.job_id, "could not record a lingering job's next poll");
        }
        false
    };
    if !job.cancel_tried {
        match provider.ai.send(CancelJob(job.job_id.clone())).await {
            Ok(Ok(CancelOutcome::Final(status))) => {
                tracing::info!(provider = %job.provider, job_id = %job.job_id, ?status, "cancelled an AI job its saga no longer needs");
                return free("cancelled").await;
            }
            Ok(Ok(CancelOutcome::Pending)) => return later(true, now + poll_ms).await,
            // No cancel: poll it until it ends.
            Ok(Ok(CancelOutcome::Unsupported)) => {}
            Ok(Err(failure)) if failure.is_unavailable() => {
                return later(false, now + retry_ms(&failure)).await
            }
            // A refused cancel: the job may still run; poll it.
            Ok(Err(_)) => {}
            Err(e) => {
                tracing::warn!(error = %e, "AI actor unreachable");
                return later(false, now + RETRY_UNAVAILABLE_MS).await;
            }
        }
    }
    match provider.ai.send(PollJob(job.job_id.clone())).await {
        Ok(Ok(view)) if view.status.is_final() => free("final").await,
        Ok(Ok(view)) => {
            let wait = view.poll_after_ms.unwrap_or(poll_ms).clamp(10, 60_000);
            later(true, now + wait).await
        }
        Ok(Err(failure)) if failure.is_unavailable() => later(true, now + retry_ms(&failure)).await,
        // A refused poll (a 4xx) does not say the job ended: it keeps its
        // slot, as in the saga's own polls, until its bound.
        Ok(Err(failure)) => later(true, now + retry_ms(&failure)).await,
        Err(e) => {
            tracing::warn!(error = %e, "AI actor unreachable");
            later(true, now + RETRY_UNAVAILABLE_MS).await
        }
    }
}

fn retry_ms(failure: &AiFailure) -> i64 {
    failure
        .retry_after_ms()
        .unwrap_or(RETRY_UNAVAILABLE_MS)
        .max(RETRY_UNAVAILABLE_MS)
}

impl Actor for LingeringJobsActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.round(ctx);
        ctx.run_interval(TICK, |act, ctx| act.round(ctx));
        self.wakeups.lingering.forward_to(ctx.address(), || Round);
    }
}

impl Handler<Round> for LingeringJobsActor {
    type Result = ();
    fn handle(&mut self, _: Round, ctx: &mut Context<Self>) {
        crate::metrics::actor_message("LingeringJobsActor");
        self.round(ctx);
    }
}
