//! SagaSupervisor: one per running saga. Drives it step by step by sending
//! one message per step to the AI, Ranking and Persistence actors, renews its
//! lease while it waits, and ends with a terminal event. It holds no
//! transaction across a step: every step is read -> outside I/O with no
//! transaction -> one short fenced write. On `LeaseLost` it stops quietly.
//! A step that fails because the database is briefly gone (a restart, a
//! lock timeout) is run again with backoff for up to one lease: every step
//! is idempotent (rule 3), and fenced, so a worker that lost the saga
//! meanwhile is refused. Everything it logs is inside a `saga` span with
//! `saga_id`, `session_id` and `experience`.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::Instrument;

use super::ai::AiActor;
use super::persistence::{PersistenceActor, RenewLease, Write};
use super::ranking::{RankingActor, RegisterScore};
use super::wakeups::Wakeups;
use crate::ai::{JobStatus, JobView};
use crate::clock::SharedClock;
use crate::domain::failure::{AiFailure, AiResult};
use crate::domain::policy::{EpochMs, RetryPolicy};
use crate::domain::review::ReviewMode;
use crate::domain::saga::{AbortReason, Step, TransitionError};
use crate::metrics;
use crate::store::entities::{experiences, sagas};
use crate::store::sagas::{fan_out_of, step_of, ClaimableExperience, Fence, Holds};
use crate::store::transitions::{SagaWrite, Written};
use crate::store::{transient_backoff, DbFailure, Store, StoreError};

mod ai_step;
mod media_step;

/// Sent to the supervisor's starter: claim again at this time (a backoff
/// ends then).
#[derive(Message)]
#[rtype(result = "()")]
pub struct WakeAt(pub EpochMs);

/// Sent to the supervisor's starter when it stops: its place is free.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SagaStopped {
    pub saga_id: String,
}

/// Who started a supervisor (the dispatcher), as the two messages it
/// hears from it; the supervisor knows nothing else of it.
#[derive(Clone)]
pub struct Starter {
    pub wake_at: Recipient<WakeAt>,
    pub stopped: Recipient<SagaStopped>,
}

/// What every supervisor needs; cloned into each.
#[derive(Clone)]
pub struct SagaDeps {
    pub store: Store,
    pub clock: SharedClock,
    pub ranking: Addr<RankingActor>,
    pub persistence: Addr<PersistenceActor>,
    /// To tell the review actors and the operators that a result entered
    /// review.
    pub wakeups: Wakeups,
    pub settings: Arc<SagaSettings>,
    pub media: SagaMedia,
}

/// What sagas need of media: the keeper of results, and for each
/// provider where its result files may come from and where it fetches a
/// photo.
#[derive(Clone)]
pub struct SagaMedia {
    pub keeper: crate::media::keep::Keeper,
    /// The key photo URLs are signed with (derived from the server's own
    /// secret, which the database never holds).
    pub secret: Arc<[u8]>,
    pub providers: Arc<std::collections::HashMap<String, crate::media::keep::ProviderMedia>>,
    /// Each experience's brand, read once per change.
    pub brands: Arc<crate::media::brand::BrandBook>,
}

impl SagaMedia {
    pub fn origins(&self, provider: &str) -> Option<&crate::media::keep::ResultOrigins> {
        self.providers.get(provider).map(|p| &p.origins)
    }

    /// The base URL `provider` reaches this server at, if any.
    pub fn photo_base(&self, provider: &str) -> Option<&str> {
        self.providers.get(provider)?.photo_base.as_deref()
    }
}

/// Timing and policy of a saga, from configuration.
#[derive(Debug, Clone)]
pub struct SagaSettings {
    pub lease: Duration,
    pub ai_timeout: Duration,
    pub ai_poll_interval: Duration,
    pub retry: RetryPolicy,
}

/// Why a supervisor stopped before the saga ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Stop {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("actor mailbox: {0}")]
    Mailbox(#[from] MailboxError),
}

/// Stop now (the instance shuts down and hands the saga over); whatever
/// step is in flight is dropped with the actor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopSupervisor;

/// What a supervisor needs of its saga's experience, read with the claim
/// (so no saga reads its experience again).
#[derive(Debug, Clone)]
pub struct ExperienceOf {
    /// The experience's kind, as the AI job's `kind`.
    pub kind: String,
    /// `Some((ai_calls, min_success))` when it fans out.
    pub fan_out: Option<(i32, i32)>,
    /// The AiActor of its provider.
    pub ai: Addr<AiActor>,
    /// Its results wait in the operators' review (IN_REVIEW) after AI_DONE.
    pub review: bool,
    /// Its provider's name (for traces).
    pub provider: String,
    /// Its brand's version (0: none): the keep draws the brand it holds
    /// at this version or later, and reads it only when it has none.
    pub brand_version: i64,
}

impl ExperienceOf {
    pub fn of(experience: &ClaimableExperience, ai: Addr<AiActor>) -> ExperienceOf {
        ExperienceOf {
            kind: experience.kind.clone(),
            fan_out: experience.fan_out(),
            ai,
            review: experience.review == ReviewMode::BeforeDisplay,
            provider: experience.provider.clone(),
            brand_version: experience.brand_version,
        }
    }

    /// The same, from the experience's row (a saga adopted after review).
    pub fn of_model(experience: &experiences::Model, ai: Addr<AiActor>) -> ExperienceOf {
        ExperienceOf {
            kind: experience.kind.clone(),
            fan_out: fan_out_of(experience.ai_calls, experience.min_success),
            ai,
            review: experience.review.parse::<ReviewMode>().unwrap_or_default()
                == ReviewMode::BeforeDisplay,
            provider: experience.provider.clone(),
            brand_version: experience.brand_version,
        }
    }
}

pub struct SagaSupervisor {
    saga_id: String,
    saga: Option<sagas::Model>,
    experience: ExperienceOf,
    /// The AI slots the claim says the worker holds.
    holds: Holds,
    token: String,
    deps: SagaDeps,
    starter: Starter,
}

impl SagaSupervisor {
    /// `saga` must be a row just claimed (it carries our lock token).
    pub fn new(
        saga: sagas::Model,
        experience: ExperienceOf,
        holds: Holds,
        deps: SagaDeps,
        starter: Starter,
    ) -> Option<Self> {
        let token = saga.lock_token.clone()?;
        Some(SagaSupervisor {
            saga_id: saga.id.clone(),
            saga: Some(saga),
            experience,
            holds,
            token,
            deps,
            starter,
        })
    }
}

impl Actor for SagaSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let Some(saga) = self.saga.take() else {
            ctx.stop();
            return;
        };
        let renew_every = (self.deps.settings.lease / 3).max(Duration::from_millis(50));
        let saga_id = saga.id.clone();
        ctx.run_interval(renew_every, move |act, ctx| {
            let renew = act.deps.persistence.send(RenewLease {
                saga_id: saga_id.clone(),
                token: act.token.clone(),
            });
            let saga_id = saga_id.clone();
            crate::metrics::task_spawned("saga_supervisor.renew");
            ctx.spawn(renew.into_actor(act).map(move |res, _, ctx| match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.is_lease_lost() => {
                    // Someone else owns the saga now; whatever step is in
                    // flight is dropped with this actor.
                    tracing::info!(%saga_id, "lease lost while waiting; stopping");
                    ctx.stop();
                }
                Ok(Err(e)) => {
                    tracing::warn!(%saga_id, error = %e, "lease renewal failed; retrying")
                }
                Err(e) => tracing::warn!(%saga_id, error = %e, "persistence actor unreachable"),
            }));
        });
        let drive = drive(
            saga,
            self.experience.clone(),
            std::mem::replace(&mut self.holds, Holds::Read),
            self.token.clone(),
            self.deps.clone(),
            self.starter.wake_at.clone(),
        );
        crate::metrics::task_spawned("saga_supervisor.drive");
        ctx.spawn(drive.into_actor(self).map(|_, _, ctx| ctx.stop()));
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.starter.stopped.do_send(SagaStopped {
            saga_id: self.saga_id.clone(),
        });
    }
}

impl Handler<StopSupervisor> for SagaSupervisor {
    type Result = ();
    fn handle(&mut self, _: StopSupervisor, ctx: &mut Context<Self>) {
        crate::metrics::actor_message("SagaSupervisor");
        ctx.stop();
    }
}

/// Whether a database error at `step` may be retried: within one lease of
/// the first error at that step (a step that got further starts over, with
/// `retry` back at 0).
fn within_retries(
    failing: &mut Option<(Instant, String)>,
    retry: &mut u32,
    step: &str,
    lease: Duration,
) -> bool {
    match failing {
        Some((since, at)) if at == step => since.elapsed() < lease,
        _ => {
            *failing = Some((Instant::now(), step.to_owned()));
            *retry = 0;
            true
        }
    }
}

/// Sends one write to the persistence actor and waits until it committed.
pub(super) async fn write(
    deps: &SagaDeps,
    write: SagaWrite,
) -> Result<Result<Written, StoreError>, Stop> {
    Ok(deps.persistence.send(Write(write)).await?)
}

/// Runs the saga from its recorded step to its end, or until it must wait
/// (backoff) or the lease is lost.
async fn drive(
    saga: sagas::Model,
    experience: ExperienceOf,
    mut holds: Holds,
    token: String,
    deps: SagaDeps,
    wake_at: Recipient<WakeAt>,
) {
    let span = tracing::info_span!(
        parent: None,
        "saga",
        saga_id = %saga.id,
        session_id = %saga.session_id,
        experience = %saga.experience_id,
    );
    let new_trace = crate::telemetry::join_saga_trace(&span, &saga);
    async move {
        crate::telemetry::remember_saga_trace(&deps.store, &saga.id, &token, new_trace).await;
        let mut saga = saga;
        // The current run of database errors: when it began and at which
        // step. A step that got further starts a new run, so each failing
        // write gets its own retries for up to one lease, however long the
        // steps before it took (an AI step of minutes).
        let mut failing: Option<(Instant, String)> = None;
        let mut retry = 0;
        loop {
            match run(&mut saga, &experience, &mut holds, &token, &deps, &wake_at).await {
                Ok(()) => {}
                Err(Stop::Store(e)) if e.is_lease_lost() => {
                    tracing::info!("lease lost; another worker owns this saga now");
                }
                // The saga ended without this worker while it held the
                // lease (an operator's cancel): its write is refused, and
                // nothing is left to resume.
                Err(Stop::Store(StoreError::Transition(TransitionError::Conflict {
                    detail, ..
                }))) => {
                    tracing::info!(%detail, "the saga ended without this worker (an operator cancelled it); stopping");
                }
                Err(Stop::Store(e))
                    if matches!(e.failure(), DbFailure::Transient | DbFailure::Unavailable)
                        && within_retries(&mut failing, &mut retry, &saga.step, deps.settings.lease) =>
                {
                    let wait = transient_backoff(retry, rand::random::<f64>())
                        .min(Duration::from_secs(2));
                    tracing::warn!(
                        error = %e, retry, wait_ms = wait.as_millis() as u64, step = %saga.step,
                        "database error in a saga step; running the step again (steps are idempotent and fenced)"
                    );
                    tokio::time::sleep(wait).await;
                    retry += 1;
                    continue;
                }
                Err(e) => {
                    // The lease will expire and the dispatcher resumes the saga.
                    tracing::error!(error = %e, "saga step failed; it will be resumed after its lease expires");
                }
            }
            return;
        }
    }
    .instrument(span)
    .await
}

/// Runs the saga's steps in turn until one ends this worker's part: the
/// saga ended, waits (for a slot, a retry or a review), or must stop.
async fn run(
    saga: &mut sagas::Model,
    experience: &ExperienceOf,
    holds: &mut Holds,
    token: &str,
    deps: &SagaDeps,
    wake_at: &Recipient<WakeAt>,
) -> Result<(), Stop> {
    loop {
        let step_started = Instant::now();
        let step = step_of(saga)?;
        let step_span = crate::telemetry::step_span(saga, step, &experience.provider);
        let next = match step {
            Step::AiPending => {
                let outcome = ai_step::run_ai_step(saga, experience, token, deps, holds)
                    .instrument(step_span.clone())
                    .await?;
                record_ai_outcome(saga, outcome, token, deps, wake_at, step_started).await?
            }
            Step::AiDone if experience.review => {
                enter_review(saga, token, deps, step_started).await?;
                ControlFlow::Break(())
            }
            Step::AiDone | Step::InReview => {
                register_ranking(saga, step, token, deps, step_started).await?
            }
            Step::RankingDone => {
                complete(saga, token, deps, step_started).await?;
                ControlFlow::Break(())
            }
            Step::Completed | Step::Aborted => ControlFlow::Break(()),
        };
        if next.is_break() {
            return Ok(());
        }
    }
}

/// Writes how the AI step ended: its result (the saga goes on to AI_DONE),
/// an abort, or a release of the lease (back to the queue for a slot, or
/// until a retry is due).
async fn record_ai_outcome(
    saga: &mut sagas::Model,
    outcome: ai_step::StepOutcome,
    token: &str,
    deps: &SagaDeps,
    wake_at: &Recipient<WakeAt>,
    step_started: Instant,
) -> Result<ControlFlow<()>, Stop> {
    match outcome {
        ai_step::StepOutcome::Done { result, job_id } => {
            let done = SagaWrite::AiDone {
                saga_id: saga.id.clone(),
                token: token.to_owned(),
                result: result.clone(),
                job_id,
            };
            write(deps, done).await??;
            metrics::step_finished(Step::AiPending, step_started.elapsed());
            tracing::info!(saga_id = %saga.id, attempt = saga.attempts, "AI result recorded");
            saga.content = Some(serde_json::to_string(&result.content).unwrap_or_default());
            saga.ai_score = result.score;
            saga.step = Step::AiDone.as_str().to_owned();
            Ok(ControlFlow::Continue(()))
        }
        ai_step::StepOutcome::Abort {
            reason,
            detail,
            free_calls,
        } => {
            abort_with(saga, token, reason, detail, free_calls, deps).await?;
            Ok(ControlFlow::Break(()))
        }
        ai_step::StepOutcome::WaitForSlot { state } => {
            let now = deps.clock.now_ms();
            tracing::info!(
                saga_id = %saga.id,
                "no AI slot held and none free; back to the queue until one frees"
            );
            let release = SagaWrite::ReleaseForRetry {
                saga_id: saga.id.clone(),
                token: token.to_owned(),
                state,
                next_attempt_at: now,
                attempt_counted: false,
                free_calls: Vec::new(),
            };
            write(deps, release).await??;
            Ok(ControlFlow::Break(()))
        }
        ai_step::StepOutcome::Release {
            state,
            next_attempt_at,
            attempt_counted,
            failure,
            free_calls,
        } => {
            let now = deps.clock.now_ms();
            tracing::warn!(
                saga_id = %saga.id, %failure, attempts = state.attempts, in_ms = next_attempt_at - now,
                "AI attempt failed; retrying later (the saga's AI slots are free meanwhile)"
            );
            let release = SagaWrite::ReleaseForRetry {
                saga_id: saga.id.clone(),
                token: token.to_owned(),
                state,
                next_attempt_at,
                attempt_counted,
                free_calls,
            };
            write(deps, release).await??;
            wake_at.do_send(WakeAt(next_attempt_at));
            Ok(ControlFlow::Break(()))
        }
    }
}

/// Puts the AI result in the operators' review (IN_REVIEW).
async fn enter_review(
    saga: &sagas::Model,
    token: &str,
    deps: &SagaDeps,
    step_started: Instant,
) -> Result<(), Stop> {
    // The result waits for a person, holding no lease and no AI
    // slot; the review actor hands it back to a worker once it
    // is approved.
    let enter = SagaWrite::EnterReview {
        saga_id: saga.id.clone(),
        token: token.to_owned(),
    };
    write(deps, enter).await??;
    deps.wakeups.review_changed();
    metrics::step_finished(Step::AiDone, step_started.elapsed());
    tracing::info!(saga_id = %saga.id, "AI result waits in the operators' review (IN_REVIEW)");
    Ok(())
}

/// Registers the saga's score in the ranking (the saga goes on to
/// RANKING_DONE), or aborts it when the ranking refuses it.
async fn register_ranking(
    saga: &mut sagas::Model,
    step: Step,
    token: &str,
    deps: &SagaDeps,
    step_started: Instant,
) -> Result<ControlFlow<()>, Stop> {
    // IN_REVIEW here: approved, and adopted by this worker.
    let after_review = step == Step::InReview;
    let entry = match saga.participant_score.or(saga.ai_score) {
        Some(score) => {
            let registered = deps
                .ranking
                .send(RegisterScore {
                    experience_id: saga.experience_id.clone(),
                    session_id: saga.session_id.clone(),
                    saga_id: saga.id.clone(),
                    token: token.to_owned(),
                    score,
                })
                .await?;
            match registered {
                Ok(entry) => Some(entry),
                Err(StoreError::Conflict(detail)) => {
                    abort(saga, token, AbortReason::RankingFailed, detail, deps).await?;
                    return Ok(ControlFlow::Break(()));
                }
                Err(e) => return Err(e.into()),
            }
        }
        None => None,
    };
    let ranked = SagaWrite::RankingDone {
        saga_id: saga.id.clone(),
        token: token.to_owned(),
        entry,
        after_review,
    };
    write(deps, ranked).await??;
    metrics::step_finished(step, step_started.elapsed());
    saga.step = Step::RankingDone.as_str().to_owned();
    Ok(ControlFlow::Continue(()))
}

/// Completes the saga, or aborts it when the completion is refused.
async fn complete(
    saga: &sagas::Model,
    token: &str,
    deps: &SagaDeps,
    step_started: Instant,
) -> Result<(), Stop> {
    let complete = SagaWrite::Complete {
        saga_id: saga.id.clone(),
        token: token.to_owned(),
    };
    match write(deps, complete).await? {
        Ok(_) => {
            metrics::step_finished(Step::RankingDone, step_started.elapsed());
            metrics::saga_ended(None, age(saga, deps));
            tracing::info!(saga_id = %saga.id, "saga COMPLETED");
            Ok(())
        }
        Err(StoreError::Transition(crate::domain::saga::TransitionError::Conflict {
            detail,
            ..
        })) => abort(saga, token, AbortReason::PersistFailed, detail, deps).await,
        Err(e) => Err(e.into()),
    }
}

fn final_outcome(view: &JobView) -> Option<Result<AiResult, AiFailure>> {
    let error = || {
        view.error
            .clone()
            .unwrap_or_else(|| "no reason given".into())
    };
    match view.status {
        JobStatus::Succeeded => Some(Ok(view.result.clone().unwrap_or_default())),
        JobStatus::Failed => Some(Err(AiFailure::JobFailed(error()))),
        JobStatus::Rejected => Some(Err(AiFailure::ContentRejected(error()))),
        // Nobody but us cancels a job; one found cancelled failed.
        JobStatus::Cancelled => Some(Err(AiFailure::JobFailed(format!("cancelled: {}", error())))),
        JobStatus::Queued | JobStatus::Running => None,
    }
}

async fn abort(
    saga: &sagas::Model,
    token: &str,
    reason: AbortReason,
    detail: String,
    deps: &SagaDeps,
) -> Result<(), Stop> {
    abort_with(saga, token, reason, detail, Vec::new(), deps).await
}

/// Ends the saga; `free_calls`: the slots it holds in which no job runs
/// (the others are detached: a job may still run in them).
async fn abort_with(
    saga: &sagas::Model,
    token: &str,
    reason: AbortReason,
    detail: String,
    free_calls: ai_step::Freed,
    deps: &SagaDeps,
) -> Result<(), Stop> {
    if reason == AbortReason::InputRejected {
        tracing::warn!(saga_id = %saga.id, %reason, %detail, "saga ABORTED: input rejected by moderation");
    } else {
        tracing::error!(saga_id = %saga.id, %reason, %detail, "saga ABORTED");
    }
    let aborted = SagaWrite::Abort {
        saga_id: saga.id.clone(),
        fence: Fence::Token(token.to_owned()),
        reason,
        detail,
        free_calls,
        audit: None,
    };
    write(deps, aborted).await??;
    metrics::saga_ended(Some(reason), age(saga, deps));
    Ok(())
}

/// Time since the saga was submitted.
fn age(saga: &sagas::Model, deps: &SagaDeps) -> Duration {
    Duration::from_millis((deps.clock.now_ms() - saga.created_at_ms).max(0) as u64)
}
