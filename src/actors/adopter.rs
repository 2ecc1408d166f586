//! SlotAdopter: sees to its end every job of the slot ledger whose owner is
//! gone, so its slot is freed only when no job runs in it (rule 10). It
//! takes, with a short lease (two instances never work on one row), the
//! rows the store says nobody will resume ([`Store::adopt_slots`]): those a
//! saga detached when it ended or gave up a call while its job may still
//! run, and those of sagas that can no longer resume them (past their
//! deadline, or out of recoveries, with nobody holding them). For each:
//!
//! - **no job id** (the submit's answer never arrived, or its worker died
//!   before writing it): the job is looked for with exactly the order
//!   that was sent, as the ledger row keeps it (the prompt, and the
//!   photo's key and SHA-256; erasure and retention blank the saga's own
//!   copy, never the row's while its job may run). The job API is sent the
//!   same order with the same idempotency key, which returns the job the
//!   first submit made (and makes one only if the first made none: that
//!   one is then seen to its end like any other); a 4xx to it proves no
//!   job exists under that key: the slot is free. Replicate's list is
//!   read, never created in. OpenAI is never sent anything: a call sent
//!   again is a new, billed generation.
//! - **not found** is no evidence: the list may not show the job, or show
//!   it otherwise than it was sent. A provider that ends every job of a
//!   key by a deadline of its own (Replicate's `Cancel-After` on every
//!   create; an OpenAI call ends with its request) frees the slot once
//!   that deadline has passed since the first look that found nothing
//!   (which is after the last send: the row's worker is gone)
//!   ([`Evidence::ProviderDeadline`]); the job API's key always finds its
//!   job, so there the row waits for the provider's answer.
//! - **a job id**: the job is polled; a final job frees the slot. A job
//!   still running is asked once to cancel (never a final one); a
//!   confirmed cancel frees the slot, and without cancel (404, 405) it is
//!   polled at the AI poll interval until the provider says it is final.
//!
//! A provider that cannot be reached, or refuses to answer about a job,
//! keeps the slot in use: nothing but evidence frees it, however long that
//! takes. Every freed slot wakes the dispatchers. Woken by its doorbell
//! when a slot is detached here, and every second as a safety net (another
//! instance's rows, a lease that ran out, a deadline that passed). The
//! mailbox holds nothing: wake-ups are a doorbell, and the rows are the
//! queue.

use std::time::Duration;

use actix::prelude::*;
use uuid::Uuid;

use super::ai::{CancelJob, PollJob, SubmitJob};
use super::providers::{ProviderHandle, Providers};
use super::wakeups::Wakeups;
use crate::ai::{CancelOutcome, JobOrder, JobView, MaybeMade, PhotoPrint};
use crate::clock::SharedClock;
use crate::domain::failure::AiFailure;
use crate::domain::keys::ai_call_key;
use crate::domain::ledger::{evidence_of_refusal, Evidence};
use crate::store::ledger::AdoptedSlot;
use crate::store::Store;

/// Rows taken per round.
const BATCH: usize = 64;
/// How long a taken row is ours while we ask the provider about it.
const LEASE_MS: i64 = 5_000;
/// The safety net's period.
const TICK: Duration = Duration::from_secs(1);
/// After an unavailable provider, ask again this much later.
const RETRY_UNAVAILABLE_MS: i64 = 2_000;
/// A look that found no job: look again this much later (the list may
/// show it by then).
const UNFOUND_LOOK_AGAIN_MS: i64 = 10_000;
/// A provider this instance does not know: look again this much later
/// (another instance may know it).
const UNKNOWN_PROVIDER_MS: i64 = 60_000;

/// Look at the rows whose owner is gone now.
#[derive(Message)]
#[rtype(result = "()")]
struct Round;

pub struct SlotAdopter {
    store: Store,
    clock: SharedClock,
    providers: Providers,
    wakeups: Wakeups,
    poll_interval_ms: i64,
    max_recoveries: u32,
    busy: bool,
    again: bool,
}

impl SlotAdopter {
    pub fn new(
        store: Store,
        clock: SharedClock,
        providers: Providers,
        wakeups: Wakeups,
        poll_interval: Duration,
        max_recoveries: u32,
    ) -> Self {
        SlotAdopter {
            store,
            clock,
            providers,
            wakeups,
            poll_interval_ms: poll_interval.as_millis().max(10) as i64,
            max_recoveries,
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
        let adopter = Adopter {
            store: self.store.clone(),
            clock: self.clock.clone(),
            providers: self.providers.clone(),
            poll_ms: self.poll_interval_ms,
        };
        let (wakeups, max_recoveries) = (self.wakeups.clone(), self.max_recoveries);
        let work = async move {
            let now = adopter.clock.now_ms();
            let slots = match adopter
                .store
                .adopt_slots(BATCH, now, LEASE_MS, max_recoveries)
                .await
            {
                Ok(slots) => slots,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the AI slots whose owner is gone; trying again");
                    return None;
                }
            };
            let freed =
                futures_util::future::join_all(slots.into_iter().map(|s| adopter.settle(s))).await;
            if freed.iter().any(|f| *f) {
                wakeups.saga_work();
            }
            Some(freed.len())
        };
        crate::metrics::task_spawned("adopter.round");
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

/// What one round needs to settle its rows.
struct Adopter {
    store: Store,
    clock: SharedClock,
    providers: Providers,
    poll_ms: i64,
}

/// Where a row stands after asking the provider.
enum Next {
    /// No job runs in its slot.
    Free(Evidence),
    /// Ask again at this time, with what was learnt.
    Later {
        job_id: Option<String>,
        cancel_tried: bool,
        at: i64,
    },
    /// No job of the row was found (or none can be asked for): look again
    /// at `at`, and count the provider's deadline from `since`.
    Unfound { since: i64, at: i64 },
}

impl Adopter {
    /// One row: find its job, see it end; true when its slot is free now.
    async fn settle(&self, slot: AdoptedSlot) -> bool {
        let now = self.clock.now_ms();
        let Some(provider) = self.providers.get(&slot.provider) else {
            tracing::error!(provider = %slot.provider, saga_id = %slot.saga_id, "an AI slot's provider is not configured on this instance; it stays in use until an instance that has it sees its job end");
            return self
                .later(&slot, None, slot.cancel_tried, now + UNKNOWN_PROVIDER_MS)
                .await;
        };
        let next = match &slot.job_id {
            Some(job_id) => self.watch(provider, &slot, job_id, now).await,
            None => self.find_by_key(provider, &slot, now).await,
        };
        match next {
            Next::Free(evidence) => self.free(&slot, evidence).await,
            Next::Later {
                job_id,
                cancel_tried,
                at,
            } => self.later(&slot, job_id.as_deref(), cancel_tried, at).await,
            Next::Unfound { since, at } => {
                let slot = AdoptedSlot {
                    unfound_since_ms: Some(since),
                    ..slot
                };
                self.later(&slot, None, slot.cancel_tried, at).await
            }
        }
    }

    /// A row whose job id was never recorded: the same order, with the
    /// same key, returns the job the first submit made. A provider without
    /// an idempotency key only looks for it (never makes one): a job it
    /// finds that way is not surely ours, so it is watched to its end,
    /// never cancelled.
    async fn find_by_key(&self, provider: &ProviderHandle, slot: &AdoptedSlot, now: i64) -> Next {
        let since = slot.unfound_since_ms.unwrap_or(now);
        if let Some(within) = provider.jobs_end_within_ms {
            if now >= since + within {
                tracing::info!(provider = %slot.provider, saga_id = %slot.saga_id, call = slot.call_index, "no job of an AI slot was found and the provider's own deadline for any has passed");
                return Next::Free(Evidence::ProviderDeadline);
            }
        }
        let unfound = |wait_ms: i64| Next::Unfound {
            since,
            at: match provider.jobs_end_within_ms {
                Some(within) => (now + wait_ms).min(since + within),
                None => now + wait_ms,
            },
        };
        if !provider.can_look {
            // Nothing to ask: the provider's deadline is the evidence.
            return unfound(i64::MAX / 4);
        }
        let Some(order) = self.order_of(provider, slot, now).await else {
            tracing::error!(saga_id = %slot.saga_id, call = slot.call_index, "an AI slot with no job id whose order cannot be made (its saga row is gone, or the ledger could not be read); it stays in use");
            return self.retry_later(None, slot.cancel_tried, UNKNOWN_PROVIDER_MS, now);
        };
        match provider.ai.send(SubmitJob(order)).await {
            Ok(Ok(view)) => {
                crate::metrics::slot_found_by_key("job");
                tracing::info!(provider = %slot.provider, saga_id = %slot.saga_id, call = slot.call_index, job_id = %view.job_id, "found the job of an AI slot by its key");
                let by_lookup = view.lookup.is_some();
                let slot = AdoptedSlot {
                    cancel_tried: slot.cancel_tried || by_lookup,
                    ..slot.clone()
                };
                self.judge(provider, &slot, view, now).await
            }
            Ok(Err(failure)) => match evidence_of_refusal(&failure, true) {
                Some(evidence) => {
                    crate::metrics::slot_found_by_key("none");
                    Next::Free(evidence)
                }
                None => {
                    tracing::info!(provider = %slot.provider, saga_id = %slot.saga_id, call = slot.call_index, %failure, "the look for an AI slot's job found none, or could not be made; that is no evidence, so the slot stays in use");
                    // A list may show the job later; a key is simply sent
                    // again as soon as the provider may be asked.
                    let wait = match provider.jobs_end_within_ms {
                        Some(_) => retry_ms(&failure).max(UNFOUND_LOOK_AGAIN_MS),
                        None => retry_ms(&failure),
                    };
                    unfound(wait)
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "AI actor unreachable");
                self.retry_later(None, slot.cancel_tried, RETRY_UNAVAILABLE_MS, now)
            }
        }
    }

    /// The order a row's key was sent with, marked as one that may have
    /// made a job since the row was made (looked for, never made again).
    async fn order_of(
        &self,
        provider: &ProviderHandle,
        slot: &AdoptedSlot,
        now: i64,
    ) -> Option<JobOrder> {
        let source = slot.order.as_ref()?;
        let base = Uuid::parse_str(&slot.base_key).ok()?;
        let key = ai_call_key(
            base,
            slot.call_index.max(0) as u32,
            slot.key_attempt.max(0) as u32,
        );
        let call = (source.ai_calls > 1).then_some(slot.call_index);
        let mut order =
            JobOrder::for_call(&source.kind, &source.prompt, &source.session_id, call, key);
        let photo = source.photo.as_ref().map(|(key, sha256)| PhotoPrint {
            key: Some(key.clone()),
            sha256: sha256.clone(),
        });
        let taken = match self.store.jobs_held(&provider.spec.name).await {
            Ok(taken) => taken,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the ledger's jobs; looking again later");
                return None;
            }
        };
        order.maybe_made = Some(MaybeMade {
            since_ms: slot.keyed_at_ms,
            // Its worker is gone: its last send, whenever it was, is not
            // this process's; the row's own time is the one known.
            last_sent_ms: slot.keyed_at_ms,
            now_ms: now,
            taken,
            look_only: true,
            photo,
        });
        Some(order)
    }

    /// A row with a job: poll it.
    async fn watch(
        &self,
        provider: &ProviderHandle,
        slot: &AdoptedSlot,
        job_id: &str,
        now: i64,
    ) -> Next {
        match provider.ai.send(PollJob(job_id.to_owned())).await {
            Ok(Ok(view)) => self.judge(provider, slot, view, now).await,
            // A refused poll (a 4xx) does not say the job ended: the slot
            // stays in use, as in the saga's own polls.
            Ok(Err(failure)) => {
                self.retry_later(Some(job_id), slot.cancel_tried, retry_ms(&failure), now)
            }
            Err(e) => {
                tracing::warn!(error = %e, "AI actor unreachable");
                self.retry_later(Some(job_id), slot.cancel_tried, RETRY_UNAVAILABLE_MS, now)
            }
        }
    }

    /// The job as the provider answered: final frees the slot; running is
    /// asked once to cancel, then polled.
    async fn judge(
        &self,
        provider: &ProviderHandle,
        slot: &AdoptedSlot,
        view: JobView,
        now: i64,
    ) -> Next {
        if view.status.is_final() {
            return Next::Free(Evidence::JobFinal);
        }
        let poll_wait = view.poll_after_ms.unwrap_or(self.poll_ms).clamp(10, 60_000);
        let job_id = Some(view.job_id.clone());
        if slot.cancel_tried {
            return Next::Later {
                job_id,
                cancel_tried: true,
                at: now + poll_wait,
            };
        }
        match provider.ai.send(CancelJob(view.job_id.clone())).await {
            Ok(Ok(CancelOutcome::Final(status))) => {
                tracing::info!(provider = %slot.provider, job_id = %view.job_id, ?status, "cancelled an AI job its saga no longer needs");
                Next::Free(Evidence::CancelConfirmed)
            }
            // Taken, not final yet; or no cancel: poll it until it ends.
            Ok(Ok(CancelOutcome::Pending | CancelOutcome::Unsupported)) => Next::Later {
                job_id,
                cancel_tried: true,
                at: now + poll_wait,
            },
            // A refused cancel is not the provider being down: poll.
            Ok(Err(failure)) if !failure.is_unavailable() => Next::Later {
                job_id,
                cancel_tried: true,
                at: now + poll_wait,
            },
            Ok(Err(failure)) => Next::Later {
                job_id,
                cancel_tried: false,
                at: now + retry_ms(&failure),
            },
            Err(e) => {
                tracing::warn!(error = %e, "AI actor unreachable");
                Next::Later {
                    job_id,
                    cancel_tried: false,
                    at: now + RETRY_UNAVAILABLE_MS,
                }
            }
        }
    }

    fn retry_later(
        &self,
        job_id: Option<&str>,
        cancel_tried: bool,
        wait_ms: i64,
        now: i64,
    ) -> Next {
        Next::Later {
            job_id: job_id.map(str::to_owned),
            cancel_tried,
            at: now + wait_ms,
        }
    }

    async fn free(&self, slot: &AdoptedSlot, evidence: Evidence) -> bool {
        match self.store.free_adopted(slot, evidence).await {
            Ok(true) => {
                crate::metrics::slots_freed(evidence.as_str(), 1);
                tracing::info!(provider = %slot.provider, saga_id = %slot.saga_id, call = slot.call_index, evidence = evidence.as_str(), "an adopted AI job ended: its slot is free");
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(error = %e, saga_id = %slot.saga_id, "could not free an adopted AI slot; trying again");
                false
            }
        }
    }

    async fn later(
        &self,
        slot: &AdoptedSlot,
        job_id: Option<&str>,
        cancel_tried: bool,
        at: i64,
    ) -> bool {
        if let Err(e) = self
            .store
            .adopted_later(slot, job_id, cancel_tried, at)
            .await
        {
            tracing::warn!(error = %e, saga_id = %slot.saga_id, "could not record an adopted AI slot's next look; its lease runs out and it is taken again");
        }
        false
    }
}

fn retry_ms(failure: &AiFailure) -> i64 {
    failure
        .retry_after_ms()
        .unwrap_or(RETRY_UNAVAILABLE_MS)
        .max(RETRY_UNAVAILABLE_MS)
}

impl Actor for SlotAdopter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.round(ctx);
        ctx.run_interval(TICK, |act, ctx| act.round(ctx));
        self.wakeups
            .slots_detached
            .forward_to(ctx.address(), || Round);
    }
}

impl Handler<Round> for SlotAdopter {
    type Result = ();
    fn handle(&mut self, _: Round, ctx: &mut Context<Self>) {
        crate::metrics::actor_message("SlotAdopter");
        self.round(ctx);
    }
}
