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

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::Instrument;
use uuid::Uuid;

use super::ai::{AiActor, PollJob, SubmitJob};
use super::dispatcher::{Dispatcher, SagaStopped, WakeAt};
use super::persistence::{PersistenceActor, RenewLease, Write};
use super::ranking::{RankingActor, RegisterScore};
use crate::ai::{JobOrder, JobStatus, JobView};
use crate::clock::SharedClock;
use crate::domain::failure::{AiFailure, AiResult};
use crate::domain::keys::ai_attempt_key;
use crate::domain::policy::{poll_wait_ms, AfterFailure, AttemptState, RetryPolicy};
use crate::domain::saga::{AbortReason, Step, TransitionError};
use crate::metrics;
use crate::store::entities::sagas;
use crate::store::sagas::{step_of, ClaimableExperience, Fence};
use crate::store::transitions::{SagaWrite, Written};
use crate::store::{transient_backoff, DbFailure, Store, StoreError};

mod fan_out;

/// What every supervisor needs; cloned into each.
#[derive(Clone)]
pub struct SagaDeps {
    pub store: Store,
    pub clock: SharedClock,
    pub ai: Addr<AiActor>,
    pub ranking: Addr<RankingActor>,
    pub persistence: Addr<PersistenceActor>,
    pub settings: Arc<SagaSettings>,
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
}

impl ExperienceOf {
    pub fn of(experience: &ClaimableExperience) -> ExperienceOf {
        ExperienceOf {
            kind: experience.kind.clone(),
            fan_out: experience.fan_out(),
        }
    }
}

pub struct SagaSupervisor {
    saga_id: String,
    saga: Option<sagas::Model>,
    experience: ExperienceOf,
    token: String,
    deps: SagaDeps,
    dispatcher: Addr<Dispatcher>,
}

impl SagaSupervisor {
    /// `saga` must be a row just claimed (it carries our lock token).
    pub fn new(
        saga: sagas::Model,
        experience: ExperienceOf,
        deps: SagaDeps,
        dispatcher: Addr<Dispatcher>,
    ) -> Option<Self> {
        let token = saga.lock_token.clone()?;
        Some(SagaSupervisor {
            saga_id: saga.id.clone(),
            saga: Some(saga),
            experience,
            token,
            deps,
            dispatcher,
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
            self.token.clone(),
            self.deps.clone(),
            self.dispatcher.clone(),
        );
        ctx.spawn(drive.into_actor(self).map(|_, _, ctx| ctx.stop()));
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.dispatcher.do_send(SagaStopped {
            saga_id: self.saga_id.clone(),
        });
    }
}

impl Handler<StopSupervisor> for SagaSupervisor {
    type Result = ();
    fn handle(&mut self, _: StopSupervisor, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// Sends one write to the persistence actor and waits until it committed.
async fn write(deps: &SagaDeps, write: SagaWrite) -> Result<Result<Written, StoreError>, Stop> {
    Ok(deps.persistence.send(Write(write)).await?)
}

/// Runs the saga from its recorded step to its end, or until it must wait
/// (backoff) or the lease is lost.
async fn drive(
    saga: sagas::Model,
    experience: ExperienceOf,
    token: String,
    deps: SagaDeps,
    dispatcher: Addr<Dispatcher>,
) {
    let span = tracing::info_span!(
        "saga",
        saga_id = %saga.id,
        session_id = %saga.session_id,
        experience = %saga.experience_id,
    );
    async move {
        let mut saga = saga;
        let since = Instant::now();
        let mut retry = 0;
        loop {
            match run(&mut saga, &experience, &token, &deps, &dispatcher).await {
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
                        && since.elapsed() < deps.settings.lease =>
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

async fn run(
    saga: &mut sagas::Model,
    experience: &ExperienceOf,
    token: &str,
    deps: &SagaDeps,
    dispatcher: &Addr<Dispatcher>,
) -> Result<(), Stop> {
    loop {
        let step_started = Instant::now();
        let step = step_of(saga)?;
        let kind = experience.kind.as_str();
        match step {
            Step::AiPending if experience.fan_out.is_some() => {
                let (calls, min_success) = experience.fan_out.unwrap_or((1, 1));
                match fan_out::run_fan_out(&saga, kind, token, deps, calls, min_success).await? {
                    fan_out::FanOutcome::Done(result) => {
                        let done = SagaWrite::AiDone {
                            saga_id: saga.id.clone(),
                            token: token.to_owned(),
                            result: result.clone(),
                            job_id: None,
                        };
                        write(deps, done).await??;
                        metrics::step_finished(Step::AiPending, step_started.elapsed());
                        tracing::info!(saga_id = %saga.id, calls, "fan-out results recorded");
                        saga.content =
                            Some(serde_json::to_string(&result.content).unwrap_or_default());
                        saga.ai_score = result.score;
                        saga.step = Step::AiDone.as_str().to_owned();
                    }
                    fan_out::FanOutcome::Abort(reason, detail) => {
                        return abort(&saga, token, reason, detail, deps).await;
                    }
                }
            }
            Step::AiPending => match ai_attempt(saga, kind, token, deps).await? {
                AiOutcome::Done(result, job_id) => {
                    let done = SagaWrite::AiDone {
                        saga_id: saga.id.clone(),
                        token: token.to_owned(),
                        result: result.clone(),
                        job_id: Some(job_id),
                    };
                    write(deps, done).await??;
                    metrics::step_finished(Step::AiPending, step_started.elapsed());
                    tracing::info!(saga_id = %saga.id, attempt = saga.attempts, "AI result recorded");
                    saga.content = Some(serde_json::to_string(&result.content).unwrap_or_default());
                    saga.ai_score = result.score;
                    saga.step = Step::AiDone.as_str().to_owned();
                }
                AiOutcome::Failed(failure) => {
                    return after_failure(&saga, token, failure, deps, dispatcher).await;
                }
                AiOutcome::Abort(reason, detail) => {
                    return abort(&saga, token, reason, detail, deps).await;
                }
            },
            Step::AiDone => {
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
                                return abort(
                                    &saga,
                                    token,
                                    AbortReason::RankingFailed,
                                    detail,
                                    deps,
                                )
                                .await;
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
                };
                write(deps, ranked).await??;
                metrics::step_finished(Step::AiDone, step_started.elapsed());
                saga.step = Step::RankingDone.as_str().to_owned();
            }
            Step::RankingDone => {
                let complete = SagaWrite::Complete {
                    saga_id: saga.id.clone(),
                    token: token.to_owned(),
                };
                return match write(deps, complete).await? {
                    Ok(_) => {
                        metrics::step_finished(Step::RankingDone, step_started.elapsed());
                        metrics::saga_ended(None, age(saga, deps));
                        tracing::info!(saga_id = %saga.id, "saga COMPLETED");
                        Ok(())
                    }
                    Err(StoreError::Transition(
                        crate::domain::saga::TransitionError::Conflict { detail, .. },
                    )) => abort(&saga, token, AbortReason::PersistFailed, detail, deps).await,
                    Err(e) => Err(e.into()),
                };
            }
            Step::Completed | Step::Aborted => return Ok(()),
        }
    }
}

/// How the AI step ended for this worker.
enum AiOutcome {
    /// The job succeeded: its result and id.
    Done(AiResult, String),
    /// The retry policy decides ([`after_failure`]).
    Failed(AiFailure),
    /// End the saga now (its deadline passed while it waited for the AI).
    Abort(AbortReason, String),
}

/// The AI step: submit with the attempt's key (or pick up the job a
/// previous worker already submitted), then poll until a final status.
///
/// How the provider is kept within `max_in_flight` (rule 10): the AI slot
/// of a saga is its lease while it is AI_PENDING (the claim counts held
/// leases, see `Store::in_flight`), so a worker that may have a job
/// running at the provider keeps its lease, renewed by the supervisor, and
/// waits here instead of releasing it:
/// - a submit whose outcome is unclear (the job may exist) is sent again
///   with the same key after a backoff: same attempt, same job;
/// - a poll that fails (unavailable or unclear) is retried after a backoff,
///   by the job's id;
/// - an attempt that runs out of `AI_TIMEOUT` counts, and the next attempt
///   adopts the same job ([`SagaWrite::AiAttemptTimedOut`]) rather than
///   starting a second one beside it.
///
/// Only a submit the provider refused outright (connect error, 5xx, 429:
/// no job) releases the lease for a backoff, as does a counted failure
/// once its job is final. `AI_TIMEOUT` bounds each attempt from its submit
/// whatever the polls answer, and the saga's deadline bounds the whole
/// wait (then `AI_TIMEOUT`: the time ran out waiting for the AI). A job
/// that is not final at once is recorded first, so the attempt timeout
/// counts from its submit even across a crash (one that is final at once
/// needs no such record: its result is written next, and a resubmission
/// with the same key finds the same job). Outer error: we must stop.
async fn ai_attempt(
    saga: &mut sagas::Model,
    kind: &str,
    token: &str,
    deps: &SagaDeps,
) -> Result<AiOutcome, Stop> {
    let settings = &deps.settings;
    let timeout_ms = settings.ai_timeout.as_millis() as i64;
    // Consecutive unavailable or unclear answers within this step, for the
    // backoff between tries.
    let mut streak: u32 = 0;
    let (job_id, mut submitted_at) = match (&saga.ai_job_id, saga.ai_submitted_at_ms) {
        (Some(job_id), Some(at)) => (job_id.clone(), at),
        _ => {
            let base = Uuid::parse_str(&saga.ai_base_key).map_err(|e| {
                StoreError::Corrupt(format!("ai_base_key of saga {}: {e}", saga.id))
            })?;
            let order = JobOrder {
                kind: kind.to_owned(),
                prompt: saga.prompt.clone(),
                params: serde_json::json!({"session_id": saga.session_id}),
                idempotency_key: ai_attempt_key(base, saga.attempts as u32),
            };
            let submitted_at = deps.clock.now_ms();
            let view = loop {
                match deps.ai.send(SubmitJob(order.clone())).await? {
                    Ok(view) => break view,
                    Err(AiFailure::Unclear(detail)) => {
                        // The provider may have made the job: it holds our
                        // slot, and the same key will find it.
                        streak += 1;
                        tracing::warn!(saga_id = %saga.id, attempt = saga.attempts, %detail, "AI submit outcome unclear; asking again with the same key");
                        if let Some(end) = out_of_time(saga, submitted_at, timeout_ms, deps) {
                            return Ok(end);
                        }
                        pause(saga, submitted_at, timeout_ms, streak, deps).await;
                    }
                    Err(failure) => return Ok(AiOutcome::Failed(failure)),
                }
            };
            if let Some(outcome) = final_outcome(&view) {
                return Ok(done_or_failed(outcome, view.job_id));
            }
            let submitted = SagaWrite::AiSubmitted {
                saga_id: saga.id.clone(),
                token: token.to_owned(),
                job_id: view.job_id.clone(),
            };
            write(deps, submitted).await??;
            tracing::info!(saga_id = %saga.id, job_id = %view.job_id, attempt = saga.attempts, "AI job submitted");
            saga.ai_job_id = Some(view.job_id.clone());
            saga.ai_submitted_at_ms = Some(submitted_at);
            (view.job_id, submitted_at)
        }
    };
    streak = 0;
    // Polls of this job so far, and the provider's hint of when to ask next.
    let (mut polls, mut hint): (u32, Option<i64>) = (0, None);
    loop {
        if streak == 0 {
            let base = settings.ai_poll_interval.as_millis() as i64;
            let wait = poll_wait_ms(base, polls, hint) as u64;
            tokio::time::sleep(Duration::from_millis(wait)).await;
            polls += 1;
        } else {
            pause(saga, submitted_at, timeout_ms, streak, deps).await;
        }
        match deps.ai.send(PollJob(job_id.clone())).await? {
            Ok(view) => {
                if let Some(outcome) = final_outcome(&view) {
                    return Ok(done_or_failed(outcome, job_id));
                }
                hint = view.poll_after_ms;
                streak = 0;
            }
            Err(failure) if failure.is_unavailable() => {
                // The job may still be running: keep its slot and ask again.
                streak += 1;
                tracing::warn!(saga_id = %saga.id, %job_id, %failure, "AI poll failed; polling the same job again");
            }
            Err(failure) => return Ok(AiOutcome::Failed(failure)),
        }
        match out_of_time(saga, submitted_at, timeout_ms, deps) {
            None => {}
            Some(AiOutcome::Failed(AiFailure::Timeout)) => {
                match settings.retry.after_timeout(saga.attempts as u32) {
                    None => return Ok(AiOutcome::Failed(AiFailure::Timeout)),
                    Some(attempts) => {
                        let timed_out = SagaWrite::AiAttemptTimedOut {
                            saga_id: saga.id.clone(),
                            token: token.to_owned(),
                            attempts,
                        };
                        write(deps, timed_out).await??;
                        tracing::warn!(saga_id = %saga.id, %job_id, attempts, "AI attempt timed out; the next attempt adopts its job, which may still be running");
                        saga.attempts = attempts as i32;
                        submitted_at = deps.clock.now_ms();
                        saga.ai_submitted_at_ms = Some(submitted_at);
                        streak = 0;
                    }
                }
            }
            Some(end) => return Ok(end),
        }
    }
}

/// The attempt's `AI_TIMEOUT` (counted from `submitted_at`) or the saga's
/// deadline has passed: `Failed(Timeout)` or `Abort(AI_TIMEOUT)`.
fn out_of_time(
    saga: &sagas::Model,
    submitted_at: i64,
    timeout_ms: i64,
    deps: &SagaDeps,
) -> Option<AiOutcome> {
    let now = deps.clock.now_ms();
    if now > saga.deadline_at_ms {
        return Some(AiOutcome::Abort(
            AbortReason::AiTimeout,
            "the saga deadline passed while waiting for the AI".to_owned(),
        ));
    }
    (now - submitted_at > timeout_ms).then_some(AiOutcome::Failed(AiFailure::Timeout))
}

/// Waits before the next try after `streak` unavailable or unclear
/// answers: the retry policy's backoff, cut short at the attempt timeout
/// or the saga deadline, whichever comes first (so both fire on time).
async fn pause(
    saga: &sagas::Model,
    submitted_at: i64,
    timeout_ms: i64,
    streak: u32,
    deps: &SagaDeps,
) {
    let backoff = deps
        .settings
        .retry
        .backoff_ms(streak.saturating_sub(1), rand::random());
    let now = deps.clock.now_ms();
    let until_end = (submitted_at + timeout_ms + 1 - now).min(saga.deadline_at_ms + 1 - now);
    let wait = backoff.min(until_end).max(1);
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
}

fn done_or_failed(outcome: Result<AiResult, AiFailure>, job_id: String) -> AiOutcome {
    match outcome {
        Ok(result) => AiOutcome::Done(result, job_id),
        Err(failure) => AiOutcome::Failed(failure),
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

/// Applies the retry policy to a failed attempt.
async fn after_failure(
    saga: &sagas::Model,
    token: &str,
    failure: AiFailure,
    deps: &SagaDeps,
    dispatcher: &Addr<Dispatcher>,
) -> Result<(), Stop> {
    let before = AttemptState {
        attempts: saga.attempts as u32,
        unavailable_streak: saga.unavailable_streak as u32,
    };
    let now = deps.clock.now_ms();
    let jitter: f64 = rand::random();
    match deps
        .settings
        .retry
        .after_failure(&failure, before, now, saga.deadline_at_ms, jitter)
    {
        AfterFailure::Abort { reason, detail } => abort(saga, token, reason, detail, deps).await,
        AfterFailure::RetryLater {
            state,
            next_attempt_at,
        } => {
            let attempt_counted = state.attempts > before.attempts;
            tracing::warn!(
                saga_id = %saga.id, %failure, attempts = state.attempts, in_ms = next_attempt_at - now,
                "AI attempt failed; retrying later"
            );
            let release = SagaWrite::ReleaseForRetry {
                saga_id: saga.id.clone(),
                token: token.to_owned(),
                state,
                next_attempt_at,
                attempt_counted,
            };
            write(deps, release).await??;
            dispatcher.do_send(WakeAt(next_attempt_at));
            Ok(())
        }
    }
}

async fn abort(
    saga: &sagas::Model,
    token: &str,
    reason: AbortReason,
    detail: String,
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
    };
    write(deps, aborted).await??;
    metrics::saga_ended(Some(reason), age(saga, deps));
    Ok(())
}

/// Time since the saga was submitted.
fn age(saga: &sagas::Model, deps: &SagaDeps) -> Duration {
    Duration::from_millis((deps.clock.now_ms() - saga.created_at_ms).max(0) as u64)
}
