//! The AI step of a saga: its experience's `ai_calls` calls (1 for most
//! experiences, N for a fan-out), each with its own attempts, timeout and
//! key ([`ai_call_key`]: the saga's base key, the call index, the attempt;
//! call 0 has exactly the keys of rule 5), run at most `slots` at a time
//! (the AI slots the saga holds: the claim gives it what its provider's
//! share allows, see `Store::claim_for_provider`). One path for every N,
//! with one set of rules:
//!
//! - **Submit.** A refused submit (unavailable, 429) made no job: the call
//!   waits the retry policy's backoff (at least the provider's
//!   `Retry-After`) and sends the same key again. An unclear one (the
//!   connection dropped after sending) may have made the job: same, and
//!   the call counts as running meanwhile.
//! - **Poll.** A poll that fails (unavailable, 429, even a 4xx) leaves the
//!   job running: the call waits (at least `Retry-After`) and polls the same
//!   job again, until the attempt runs out of time.
//! - **Attempts.** A job that ends `failed`, or a request the provider
//!   refuses, counts an attempt; the next one waits the policy's backoff.
//!   An attempt that runs out of `AI_TIMEOUT` counts too, and the next
//!   attempt adopts the same job, which may still run (rule 10). Out of
//!   attempts, the call is FAILED (`AI_FAILED`, or `AI_TIMEOUT` when its
//!   time ran out). Moderation aborts the saga with `INPUT_REJECTED` at
//!   once (every call has the same prompt).
//! - **Waiting.** A call that must wait while no job of the saga may be
//!   running releases the saga's lease until the wait ends
//!   ([`StepOutcome::Release`]), so its slots serve other sagas meanwhile;
//!   while another call's job may run, it waits in place and the saga keeps
//!   its slots.
//! - **Slots.** While calls wait for a slot, each call write takes the free
//!   ones of the experience and its provider; once none waits, each final
//!   call gives back the slot it no longer needs.
//!
//! Where the calls are recorded is the one difference: a fan-out keeps one
//! `ai_calls` row per call ([`WriteCall`], fenced on the lock token), and
//! a new submission of the session copies its SUCCEEDED rows
//! ([`SeedCalls`]) and runs only the others; a saga of one call keeps its
//! call on the saga row (`attempts`, `ai_job_id`, `ai_submitted_at_ms`,
//! batched writes), which costs no extra transaction per saga. When the
//! calls are final the saga goes on with the contents of those that
//! succeeded, in call order, if at least `min_success` (default all)
//! succeeded, and aborts otherwise. A resumed saga never re-runs a final
//! call and adopts the job of a running one.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use uuid::Uuid;

use super::{final_outcome, write, ExperienceOf, SagaDeps, Stop};
use crate::actors::ai::{PollJob, SubmitJob};
use crate::actors::persistence::{SeedCalls, WriteCall};
use crate::ai::JobOrder;
use crate::domain::failure::{AiFailure, AiResult, ContentItem};
use crate::domain::keys::ai_call_key;
use crate::domain::policy::{poll_wait_ms, AfterFailure, AttemptState, EpochMs};
use crate::domain::saga::AbortReason;
use crate::store::ai_calls::{CallRow, Slots, FAILED, RUNNING, SUCCEEDED};
use crate::store::entities::{ai_calls, sagas};
use crate::store::transitions::SagaWrite;
use crate::store::StoreError;
use crate::telemetry;

/// How the AI step ended for this worker.
pub(super) enum StepOutcome {
    /// Enough calls succeeded: the merged result (contents in call order),
    /// and the job of a single call.
    Done {
        result: AiResult,
        job_id: Option<String>,
    },
    /// End the saga with this reason. `linger`: a job of the saga may
    /// still run (it keeps its slot until the provider says it is final).
    Abort {
        reason: AbortReason,
        detail: String,
        linger: bool,
    },
    /// No job of the saga may be running and a call must wait: release
    /// the lease until `next_attempt_at`.
    Release {
        state: AttemptState,
        next_attempt_at: EpochMs,
        attempt_counted: bool,
        failure: AiFailure,
    },
}

/// How one call ended.
enum CallEnd {
    Succeeded(AiResult, Option<String>),
    /// Out of attempts (or of time before the deadline). `job_final`: no
    /// job of this call runs any more.
    Failed {
        reason: AbortReason,
        detail: String,
        job_final: bool,
    },
    /// Moderation refused the input.
    Rejected(String),
    /// The saga's deadline passed while the call waited.
    OutOfTime,
    /// See [`StepOutcome::Release`].
    Release {
        state: AttemptState,
        next_attempt_at: EpochMs,
        attempt_counted: bool,
        failure: AiFailure,
    },
}

/// Where a saga's calls are recorded (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Book {
    /// One call, on the saga row.
    SagaRow,
    /// One `ai_calls` row per call.
    CallRows,
}

/// What the calls of one saga share.
struct Shared {
    /// Calls not final yet.
    left: AtomicI32,
    /// Calls not started yet (waiting for a slot).
    unstarted: AtomicI32,
    /// The saga's slots, as the last call write returned them.
    limit: AtomicI32,
    /// Calls that have a job, or a submit out, that may be running.
    maybe_running: AtomicI32,
}

/// A call to run: its index and where it stands.
struct CallState {
    index: i32,
    attempts: u32,
    /// Unavailable answers in a row (for the backoff).
    streak: u32,
    /// The job of the current attempt, if one was made, and when the
    /// attempt began (its timeout counts from then).
    job: Option<(String, i64)>,
}

/// Everything a call needs of its saga.
struct Ctx<'a> {
    saga: &'a sagas::Model,
    experience: &'a ExperienceOf,
    token: &'a str,
    deps: &'a SagaDeps,
    base: Uuid,
    book: Book,
    shared: Arc<Shared>,
}

/// Runs the saga's calls that are not final yet, `slots` at a time.
pub(super) async fn run_ai_step(
    saga: &sagas::Model,
    experience: &ExperienceOf,
    token: &str,
    deps: &SagaDeps,
) -> Result<StepOutcome, Stop> {
    let (calls, min_success) = experience.fan_out.unwrap_or((1, 1));
    let book = if calls > 1 {
        Book::CallRows
    } else {
        Book::SagaRow
    };
    let mut todo = Vec::new();
    match book {
        Book::SagaRow => todo.push(CallState {
            index: 0,
            attempts: saga.attempts.max(0) as u32,
            streak: saga.unavailable_streak.max(0) as u32,
            job: saga.ai_job_id.clone().zip(saga.ai_submitted_at_ms),
        }),
        Book::CallRows => {
            deps.persistence
                .send(SeedCalls {
                    saga_id: saga.id.clone(),
                    session_id: saga.session_id.clone(),
                    token: token.to_owned(),
                })
                .await??;
            let rows = deps.store.ai_calls_of(&saga.id).await?;
            let is_final = |r: &ai_calls::Model| r.status == SUCCEEDED || r.status == FAILED;
            for index in 0..calls {
                match rows.iter().find(|r| r.call_index == index) {
                    Some(r) if is_final(r) => {}
                    found => todo.push(CallState {
                        index,
                        attempts: found.map_or(0, |r| r.attempts.max(0) as u32),
                        streak: saga.unavailable_streak.max(0) as u32,
                        job: found.and_then(|r| r.job_id.clone().zip(r.submitted_at_ms)),
                    }),
                }
            }
            tracing::info!(saga_id = %saga.id, calls, left = todo.len(), slots = saga.slots, "AI step: running calls");
        }
    }
    let base = Uuid::parse_str(&saga.ai_base_key)
        .map_err(|e| StoreError::Corrupt(format!("ai_base_key of saga {}: {e}", saga.id)))?;
    let shared = Arc::new(Shared {
        left: AtomicI32::new(todo.len() as i32),
        unstarted: AtomicI32::new(todo.len() as i32),
        limit: AtomicI32::new(saga.slots),
        maybe_running: AtomicI32::new(todo.iter().filter(|c| c.job.is_some()).count() as i32),
    });
    let ctx = Ctx {
        saga,
        experience,
        token,
        deps,
        base,
        book,
        shared: shared.clone(),
    };
    let mut waiting = todo.into_iter();
    let mut running = FuturesUnordered::new();
    let mut single: Option<(AiResult, Option<String>)> = None;
    let mut failures: Vec<(AbortReason, String)> = Vec::new();
    loop {
        // As many calls as the saga holds slots (never fewer than one, so
        // it always moves); the slots change with each call write.
        let limit = shared.limit.load(Ordering::SeqCst).max(1) as usize;
        while running.len() < limit {
            let Some(call) = waiting.next() else { break };
            shared.unstarted.fetch_sub(1, Ordering::SeqCst);
            running.push(run_call(&ctx, call));
        }
        let Some(end) = running.next().await else {
            break;
        };
        match end? {
            CallEnd::Succeeded(result, job_id) => {
                if book == Book::SagaRow {
                    single = Some((result, job_id));
                }
            }
            CallEnd::Failed {
                reason,
                detail,
                job_final,
            } => {
                if book == Book::SagaRow {
                    return Ok(StepOutcome::Abort {
                        reason,
                        detail,
                        linger: !job_final,
                    });
                }
                failures.push((reason, detail));
            }
            CallEnd::Rejected(detail) => {
                // The rejected job is final; a fan-out's other calls may
                // still have jobs running.
                return Ok(StepOutcome::Abort {
                    reason: AbortReason::InputRejected,
                    detail,
                    linger: book == Book::CallRows,
                });
            }
            CallEnd::OutOfTime => {
                return Ok(StepOutcome::Abort {
                    reason: AbortReason::AiTimeout,
                    detail: "the saga deadline passed while waiting for the AI".to_owned(),
                    linger: true,
                });
            }
            CallEnd::Release {
                state,
                next_attempt_at,
                attempt_counted,
                failure,
            } => {
                // No job of the saga may be running: the other calls are
                // waiting too, and are dropped with their waits.
                let attempts = state.attempts.max(saga.attempts.max(0) as u32);
                return Ok(StepOutcome::Release {
                    state: AttemptState { attempts, ..state },
                    next_attempt_at,
                    attempt_counted: attempt_counted && book == Book::SagaRow,
                    failure,
                });
            }
        }
    }
    drop(running);
    if let Some((result, job_id)) = single {
        return Ok(StepOutcome::Done { result, job_id });
    }
    let rows = deps.store.ai_calls_of(&saga.id).await?;
    let succeeded: Vec<&ai_calls::Model> = rows.iter().filter(|r| r.status == SUCCEEDED).collect();
    if (succeeded.len() as i32) < min_success {
        let first_error = rows
            .iter()
            .find_map(|r| r.error.clone())
            .unwrap_or_else(|| "no reason given".to_owned());
        let timed_out =
            !failures.is_empty() && failures.iter().all(|(r, _)| *r == AbortReason::AiTimeout);
        return Ok(StepOutcome::Abort {
            reason: if timed_out {
                AbortReason::AiTimeout
            } else {
                AbortReason::AiFailed
            },
            detail: format!(
                "{} of {calls} AI calls succeeded, {min_success} needed; first error: {first_error}",
                succeeded.len()
            ),
            linger: true,
        });
    }
    Ok(StepOutcome::Done {
        result: merge(&succeeded)?,
        job_id: None,
    })
}

/// The saga's result from its successful calls: contents in call order,
/// the score the mean of the calls' scores (none when no call gave one).
fn merge(succeeded: &[&ai_calls::Model]) -> Result<AiResult, StoreError> {
    let mut content: Vec<ContentItem> = Vec::new();
    let scores: Vec<f64> = succeeded.iter().filter_map(|r| r.score).collect();
    for row in succeeded {
        if let Some(text) = &row.content {
            let items: Vec<ContentItem> = serde_json::from_str(text)
                .map_err(|e| StoreError::Corrupt(format!("ai_calls content: {e}")))?;
            content.extend(items);
        }
    }
    let score = (!scores.is_empty()).then(|| scores.iter().sum::<f64>() / scores.len() as f64);
    Ok(AiResult { content, score })
}

/// What a call write records.
enum Record {
    /// The attempt's job is known (RUNNING).
    Submitted,
    /// The attempt ran out of time; the next one adopts its job (RUNNING).
    TimedOut,
    /// A counted failure; the next attempt has no job yet (RUNNING).
    NextAttempt,
    /// Final: succeeded with this content list (JSON) and score.
    Succeeded(String, Option<f64>),
    /// Final: failed with this error.
    Failed(String),
}

impl Ctx<'_> {
    /// Records where `call` stands. A saga of one call records only what
    /// a resumed worker needs (its job, its attempts) on the saga row; a
    /// fan-out writes the call's row.
    async fn record(&self, call: &CallState, what: Record) -> Result<(), Stop> {
        match self.book {
            Book::SagaRow => {
                let saga_write = match what {
                    Record::Submitted => SagaWrite::AiSubmitted {
                        saga_id: self.saga.id.clone(),
                        token: self.token.to_owned(),
                        job_id: call
                            .job
                            .as_ref()
                            .map(|(id, _)| id.clone())
                            .unwrap_or_default(),
                    },
                    Record::TimedOut => SagaWrite::AiAttemptTimedOut {
                        saga_id: self.saga.id.clone(),
                        token: self.token.to_owned(),
                        attempts: call.attempts,
                    },
                    // A single call's result goes with AI_DONE, its failure
                    // with the abort, and a next attempt never waits in
                    // place (nothing else runs): nothing to write now.
                    Record::NextAttempt | Record::Succeeded(..) | Record::Failed(_) => {
                        return Ok(())
                    }
                };
                write(self.deps, saga_write).await??;
                Ok(())
            }
            Book::CallRows => {
                let (status, content, score, error, last) = match what {
                    Record::Submitted | Record::TimedOut | Record::NextAttempt => {
                        (RUNNING, None, None, None, false)
                    }
                    Record::Succeeded(content, score) => {
                        (SUCCEEDED, Some(content), score, None, true)
                    }
                    Record::Failed(error) => (FAILED, None, None, Some(error), true),
                };
                let row = CallRow {
                    call_index: call.index,
                    attempts: call.attempts as i32,
                    status,
                    job_id: call.job.as_ref().map(|(id, _)| id.clone()),
                    submitted_at_ms: call.job.as_ref().map(|(_, at)| *at),
                    content,
                    score,
                    error,
                };
                let shared = &self.shared;
                let left = if last {
                    shared.left.fetch_sub(1, Ordering::SeqCst) - 1
                } else {
                    shared.left.load(Ordering::SeqCst)
                };
                // While calls wait for a slot, every write asks for more
                // (up to the calls left); once none waits, a final call
                // gives back the slot it no longer needs.
                let slots = if shared.unstarted.load(Ordering::SeqCst) > 0 {
                    Slots::GrowTo(left)
                } else if last {
                    Slots::AtMost(left)
                } else {
                    Slots::Keep
                };
                let held = self
                    .deps
                    .persistence
                    .send(WriteCall {
                        saga_id: self.saga.id.clone(),
                        token: self.token.to_owned(),
                        row,
                        slots,
                    })
                    .await??;
                shared.limit.store(held, Ordering::SeqCst);
                Ok(())
            }
        }
    }

    /// Waits `wait_ms`, cut short at the saga's deadline and at `until`
    /// (the attempt's timeout), whichever comes first, so both fire on
    /// time.
    async fn pause(&self, wait_ms: i64, until: Option<i64>) {
        let now = self.deps.clock.now_ms();
        let mut end = self.saga.deadline_at_ms + 1 - now;
        if let Some(until) = until {
            end = end.min(until + 1 - now);
        }
        tokio::time::sleep(Duration::from_millis(wait_ms.min(end).max(1) as u64)).await;
    }

    /// The policy's wait after `streak` unavailable answers in a row, at
    /// least what the provider asked for.
    fn backoff_ms(&self, streak: u32, failure: &AiFailure) -> i64 {
        self.deps
            .settings
            .retry
            .backoff_ms(streak.saturating_sub(1), rand::random())
            .max(failure.retry_after_ms().unwrap_or(0))
    }

    fn running(&self, delta: i32) {
        self.shared.maybe_running.fetch_add(delta, Ordering::SeqCst);
    }

    /// A failure after which no job of this call runs (the job is final,
    /// or the provider made none, or refused to be asked about it), by the
    /// retry policy: the call ends, or
    /// waits for its next try, releasing the saga when nothing else of it
    /// may be running.
    async fn after_failure(
        &self,
        call: &mut CallState,
        failure: AiFailure,
    ) -> Result<Option<CallEnd>, Stop> {
        let now = self.deps.clock.now_ms();
        let before = AttemptState {
            attempts: call.attempts,
            unavailable_streak: call.streak,
        };
        let decided = self.deps.settings.retry.after_failure(
            &failure,
            before,
            now,
            self.saga.deadline_at_ms,
            rand::random(),
        );
        match decided {
            AfterFailure::Abort {
                reason: AbortReason::InputRejected,
                detail,
            } => {
                call.job = None;
                self.record(call, Record::Failed(detail.clone())).await?;
                Ok(Some(CallEnd::Rejected(detail)))
            }
            AfterFailure::Abort { reason, detail } => {
                call.job = None;
                self.record(call, Record::Failed(detail.clone())).await?;
                tracing::warn!(saga_id = %self.saga.id, call = call.index, %failure, %reason, "AI call failed for good");
                Ok(Some(CallEnd::Failed {
                    reason,
                    detail,
                    job_final: true,
                }))
            }
            AfterFailure::RetryLater {
                state,
                next_attempt_at,
            } => {
                let counted = state.attempts > call.attempts;
                call.attempts = state.attempts;
                call.streak = state.unavailable_streak;
                call.job = None;
                tracing::warn!(
                    saga_id = %self.saga.id, call = call.index, %failure, attempts = call.attempts,
                    in_ms = next_attempt_at - now, "AI call must wait before its next try"
                );
                if counted {
                    self.record(call, Record::NextAttempt).await?;
                }
                if self.shared.maybe_running.load(Ordering::SeqCst) <= 0 {
                    return Ok(Some(CallEnd::Release {
                        state,
                        next_attempt_at,
                        attempt_counted: counted,
                        failure,
                    }));
                }
                self.pause(next_attempt_at - now, None).await;
                Ok(None)
            }
        }
    }
}

/// One call, from where it stands to a final status (or a release).
async fn run_call(ctx: &Ctx<'_>, mut call: CallState) -> Result<CallEnd, Stop> {
    let deps = ctx.deps;
    let settings = &deps.settings;
    let timeout_ms = settings.ai_timeout.as_millis() as i64;
    // Polls of the call's job so far, and the provider's hint of when to
    // ask next (see `poll_wait_ms`).
    let (mut polls, mut hint): (u32, Option<i64>) = (0, None);
    // What a final job means for the call.
    macro_rules! judge_final {
        ($outcome:expr) => {{
            ctx.running(-1);
            match $outcome {
                Ok(result) => return succeeded(ctx, &call, result).await,
                Err(failure) => {
                    if let Some(end) = ctx.after_failure(&mut call, failure).await? {
                        return Ok(end);
                    }
                    continue;
                }
            }
        }};
    }
    loop {
        if deps.clock.now_ms() > ctx.saga.deadline_at_ms {
            return Ok(CallEnd::OutOfTime);
        }
        // The job of this attempt: adopted, or submitted now.
        let (job_id, submitted_at) = match call.job.clone() {
            Some(job) => job,
            None => {
                let order = JobOrder {
                    kind: ctx.experience.kind.clone(),
                    prompt: ctx.saga.prompt.clone(),
                    params: match ctx.book {
                        Book::SagaRow => serde_json::json!({"session_id": ctx.saga.session_id}),
                        Book::CallRows => serde_json::json!({
                            "session_id": ctx.saga.session_id, "call": call.index
                        }),
                    },
                    idempotency_key: ai_call_key(
                        ctx.base,
                        call.index as u32,
                        ctx.saga.attempt_offset.max(0) as u32 + call.attempts,
                    ),
                };
                let submitted_at = deps.clock.now_ms();
                ctx.running(1);
                let submit = ctx.experience.ai.send(SubmitJob(order));
                let provider = &ctx.experience.provider;
                let submitted = telemetry::provider_call(
                    "submit", ctx.saga, provider, call.index, None, submit,
                );
                match submitted.await? {
                    Ok(view) => {
                        if ctx.book == Book::SagaRow {
                            telemetry::record_job_id(&tracing::Span::current(), &view.job_id);
                        }
                        call.streak = 0;
                        call.job = Some((view.job_id.clone(), submitted_at));
                        if let Some(outcome) = final_outcome(&view) {
                            judge_final!(outcome);
                        }
                        ctx.record(&call, Record::Submitted).await?;
                        tracing::info!(saga_id = %ctx.saga.id, call = call.index, job_id = %view.job_id, attempt = call.attempts, "AI job submitted");
                        (view.job_id, submitted_at)
                    }
                    Err(AiFailure::Unclear(detail)) => {
                        // The provider may have made the job: it counts as
                        // running, and the same key will find it.
                        call.streak += 1;
                        tracing::warn!(saga_id = %ctx.saga.id, call = call.index, attempt = call.attempts, %detail, "AI submit outcome unclear; asking again with the same key");
                        let failure = AiFailure::Unclear(detail);
                        ctx.pause(ctx.backoff_ms(call.streak, &failure), None).await;
                        ctx.running(-1);
                        continue;
                    }
                    Err(failure) => {
                        // No job: refused outright, or a counted refusal.
                        ctx.running(-1);
                        if let Some(end) = ctx.after_failure(&mut call, failure).await? {
                            return Ok(end);
                        }
                        continue;
                    }
                }
            }
        };
        // Poll the job until it is final or its attempt runs out of time.
        let attempt_ends = submitted_at + timeout_ms;
        let wait = poll_wait_ms(settings.ai_poll_interval.as_millis() as i64, polls, hint);
        ctx.pause(wait, Some(attempt_ends)).await;
        polls += 1;
        let poll = ctx.experience.ai.send(PollJob(job_id.clone()));
        let (provider, job) = (&ctx.experience.provider, Some(job_id.as_str()));
        match telemetry::provider_call("poll", ctx.saga, provider, call.index, job, poll).await? {
            Ok(view) => {
                call.streak = 0;
                hint = view.poll_after_ms;
                if let Some(outcome) = final_outcome(&view) {
                    judge_final!(outcome);
                }
            }
            Err(failure) => {
                // Unavailable, or even a refused poll (a 4xx): the job may
                // still run at the provider, so it keeps its slot and is
                // asked about again, until its attempt runs out of time
                // (rule 10). Giving it up here would start a second job
                // beside one that still runs.
                call.streak += 1;
                tracing::warn!(saga_id = %ctx.saga.id, call = call.index, %job_id, %failure, "AI poll failed; polling the same job again");
                ctx.pause(ctx.backoff_ms(call.streak, &failure), Some(attempt_ends))
                    .await;
            }
        }
        if deps.clock.now_ms() > attempt_ends {
            // The attempt counts; the next one adopts the same job (rule 10).
            match settings.retry.after_timeout(call.attempts) {
                Some(attempts) => {
                    call.attempts = attempts;
                    call.job = Some((job_id.clone(), deps.clock.now_ms()));
                    ctx.record(&call, Record::TimedOut).await?;
                    tracing::warn!(saga_id = %ctx.saga.id, call = call.index, %job_id, attempts, "AI attempt timed out; the next attempt adopts its job, which may still be running");
                }
                None => {
                    // Out of attempts while the job may still run: it
                    // keeps its slot after the call ends (lingering).
                    let detail = format!(
                        "{} (attempt {} of {})",
                        AiFailure::Timeout,
                        call.attempts + 1,
                        settings.retry.max_attempts
                    );
                    call.attempts += 1;
                    ctx.record(&call, Record::Failed(detail.clone())).await?;
                    return Ok(CallEnd::Failed {
                        reason: AbortReason::AiTimeout,
                        detail,
                        job_final: false,
                    });
                }
            }
        }
    }
}

/// Records a successful call.
async fn succeeded(ctx: &Ctx<'_>, call: &CallState, result: AiResult) -> Result<CallEnd, Stop> {
    if ctx.book == Book::CallRows {
        let content = serde_json::to_string(&result.content)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        ctx.record(call, Record::Succeeded(content, result.score))
            .await?;
    }
    Ok(CallEnd::Succeeded(
        result,
        call.job.as_ref().map(|(id, _)| id.clone()),
    ))
}
