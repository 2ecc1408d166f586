//! The AI step of a fan-out saga (`ai_calls` = N > 1): N calls, each with
//! its own attempts, timeout and key ([`ai_call_key`]: the saga's base key,
//! the call index, the attempt), run at most `slots` at a time (the AI
//! slots the saga holds: the claim gives it as many free ones as it has
//! calls, see `Store::claim_runnable`; while calls wait for a slot, each
//! call write takes the experience's free ones too, and once none waits,
//! each final call gives its slot back), each stored the moment it is
//! known ([`WriteCall`], one `ai_calls` row per call, fenced on the lock
//! token).
//!
//! Failures are values: a call that runs out of attempts is stored FAILED
//! and the others go on. When every call is final the saga goes on to
//! ranking with the contents of the calls that succeeded, in call order,
//! if at least `min_success` (default N) succeeded, and aborts `AI_FAILED`
//! otherwise, keeping the rows; a new submission of the session copies
//! the SUCCEEDED rows ([`SeedCalls`]) and runs only the others. A resumed
//! saga never re-runs a final call and adopts the job of a RUNNING one.
//!
//! Unlike a single call, a fan-out saga keeps its lease (and its slots)
//! through unavailability, waiting with backoff in place: its other calls
//! may be running. Slots it no longer needs (fewer calls left than slots)
//! are given back as calls end. A call rejected by moderation aborts the
//! saga with `INPUT_REJECTED` at once (every call has the same prompt).

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use uuid::Uuid;

use super::{final_outcome, SagaDeps, Stop};
use crate::actors::ai::{PollJob, SubmitJob};
use crate::actors::persistence::{SeedCalls, WriteCall};
use crate::ai::JobOrder;
use crate::domain::failure::{AiFailure, AiResult, ContentItem};
use crate::domain::keys::ai_call_key;
use crate::domain::saga::AbortReason;
use crate::store::ai_calls::{CallRow, Slots, FAILED, RUNNING, SUCCEEDED};
use crate::store::entities::{ai_calls, sagas};
use crate::store::StoreError;

/// How the fan-out ended for this worker.
pub(super) enum FanOutcome {
    /// Enough calls succeeded: the merged result (contents in call order).
    Done(AiResult),
    /// End the saga with this reason (the call rows stay).
    Abort(AbortReason, String),
}

/// How one call ended.
enum CallEnd {
    Succeeded,
    Failed,
    /// Moderation refused the input.
    Rejected(String),
    /// The saga's deadline passed while the call waited.
    OutOfTime,
}

/// What the calls of one saga share.
struct Shared {
    /// Calls not final yet.
    left: AtomicI32,
    /// Calls not started yet (waiting for a slot).
    unstarted: AtomicI32,
    /// The saga's slots, as the last call write returned them.
    limit: AtomicI32,
}

/// A call to run: its index and where it stands.
struct CallState {
    index: i32,
    attempts: i32,
    /// The job of the current attempt, if one was made, and when it was
    /// submitted (the attempt's timeout counts from then).
    job: Option<(String, i64)>,
}

/// Runs the calls of `saga` that are not final yet, `slots` at a time.
pub(super) async fn run_fan_out(
    saga: &sagas::Model,
    kind: &str,
    token: &str,
    deps: &SagaDeps,
    calls: i32,
    min_success: i32,
) -> Result<FanOutcome, Stop> {
    deps.persistence
        .send(SeedCalls {
            saga_id: saga.id.clone(),
            session_id: saga.session_id.clone(),
            token: token.to_owned(),
        })
        .await??;
    let rows = deps.store.ai_calls_of(&saga.id).await?;
    let is_final = |r: &ai_calls::Model| r.status == SUCCEEDED || r.status == FAILED;
    let mut todo = Vec::new();
    for index in 0..calls {
        match rows.iter().find(|r| r.call_index == index) {
            Some(r) if is_final(r) => {}
            Some(r) => todo.push(CallState {
                index,
                attempts: r.attempts,
                job: r.job_id.clone().zip(r.submitted_at_ms),
            }),
            None => todo.push(CallState {
                index,
                attempts: 0,
                job: None,
            }),
        }
    }
    let base = Uuid::parse_str(&saga.ai_base_key)
        .map_err(|e| StoreError::Corrupt(format!("ai_base_key of saga {}: {e}", saga.id)))?;
    tracing::info!(saga_id = %saga.id, calls, left = todo.len(), slots = saga.slots, "fan-out: running calls");
    let shared = Arc::new(Shared {
        left: AtomicI32::new(todo.len() as i32),
        unstarted: AtomicI32::new(todo.len() as i32),
        limit: AtomicI32::new(saga.slots),
    });
    let mut waiting = todo.into_iter();
    let mut running = FuturesUnordered::new();
    loop {
        // As many calls as the saga holds slots (never fewer than one, so
        // it always moves); the slots change with each call write.
        let limit = shared.limit.load(Ordering::SeqCst).max(1) as usize;
        while running.len() < limit {
            let Some(call) = waiting.next() else { break };
            shared.unstarted.fetch_sub(1, Ordering::SeqCst);
            running.push(run_call(
                saga,
                kind,
                token,
                deps,
                base,
                call,
                shared.clone(),
            ));
        }
        let Some(end) = running.next().await else {
            break;
        };
        match end? {
            CallEnd::Succeeded | CallEnd::Failed => {}
            CallEnd::Rejected(detail) => {
                return Ok(FanOutcome::Abort(AbortReason::InputRejected, detail));
            }
            CallEnd::OutOfTime => {
                return Ok(FanOutcome::Abort(
                    AbortReason::AiTimeout,
                    "the saga deadline passed while waiting for the AI".to_owned(),
                ));
            }
        }
    }
    drop(running);
    let rows = deps.store.ai_calls_of(&saga.id).await?;
    let succeeded: Vec<&ai_calls::Model> = rows.iter().filter(|r| r.status == SUCCEEDED).collect();
    if (succeeded.len() as i32) < min_success {
        let first_error = rows
            .iter()
            .find_map(|r| r.error.clone())
            .unwrap_or_else(|| "no reason given".to_owned());
        return Ok(FanOutcome::Abort(
            AbortReason::AiFailed,
            format!(
                "{} of {calls} AI calls succeeded, {min_success} needed; first error: {first_error}",
                succeeded.len()
            ),
        ));
    }
    Ok(FanOutcome::Done(merge(&succeeded)?))
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

/// One call, from where it stands to a final status.
async fn run_call(
    saga: &sagas::Model,
    kind: &str,
    token: &str,
    deps: &SagaDeps,
    base: Uuid,
    mut call: CallState,
    shared: Arc<Shared>,
) -> Result<CallEnd, Stop> {
    let settings = &deps.settings;
    let timeout_ms = settings.ai_timeout.as_millis() as i64;
    let max_attempts = settings.retry.max_attempts.max(1) as i32;
    let row = |call: &CallState, status: &'static str| CallRow {
        call_index: call.index,
        attempts: call.attempts,
        status,
        job_id: call.job.as_ref().map(|(id, _)| id.clone()),
        submitted_at_ms: call.job.as_ref().map(|(_, at)| *at),
        content: None,
        score: None,
        error: None,
    };
    // Stores the row; `last`: the call is final. While calls wait for a
    // slot, every write asks for more slots (up to the calls left); once
    // none waits, a final call gives back the slot it no longer needs.
    let store_row = |row: CallRow, last: bool| {
        let shared = shared.clone();
        let left = if last {
            shared.left.fetch_sub(1, Ordering::SeqCst) - 1
        } else {
            shared.left.load(Ordering::SeqCst)
        };
        let slots = if shared.unstarted.load(Ordering::SeqCst) > 0 {
            Slots::GrowTo(left)
        } else if last {
            Slots::AtMost(left)
        } else {
            Slots::Keep
        };
        let sent = deps.persistence.send(WriteCall {
            saga_id: saga.id.clone(),
            token: token.to_owned(),
            row,
            slots,
        });
        async move {
            let held = sent.await?;
            if let Ok(held) = &held {
                shared.limit.store(*held, Ordering::SeqCst);
            }
            Ok::<_, actix::MailboxError>(held.map(drop))
        }
    };
    // A counted failure: the next attempt (a new key, no job), or FAILED.
    macro_rules! counted {
        ($failure:expr) => {{
            let failure: AiFailure = $failure;
            call.attempts += 1;
            call.job = None;
            if call.attempts >= max_attempts {
                let mut failed = row(&call, FAILED);
                failed.error = Some(failure.to_string());
                store_row(failed, true).await??;
                tracing::warn!(saga_id = %saga.id, call = call.index, %failure, "AI call failed for good");
                return Ok(CallEnd::Failed);
            }
            store_row(row(&call, RUNNING), false).await??;
            tracing::warn!(saga_id = %saga.id, call = call.index, %failure, attempts = call.attempts, "AI call attempt failed; trying again");
            continue;
        }};
    }
    let mut streak: u32 = 0;
    // Polls of the call's job so far, and the provider's hint of when to
    // ask next (see `poll_wait_ms`).
    let (mut polls, mut hint): (u32, Option<i64>) = (0, None);
    loop {
        if deps.clock.now_ms() > saga.deadline_at_ms {
            return Ok(CallEnd::OutOfTime);
        }
        // The job of this attempt: adopted, or submitted now.
        let (job_id, submitted_at) = match call.job.clone() {
            Some(job) => job,
            None => {
                let order = JobOrder {
                    kind: kind.to_owned(),
                    prompt: saga.prompt.clone(),
                    params: serde_json::json!({"session_id": saga.session_id, "call": call.index}),
                    idempotency_key: ai_call_key(base, call.index as u32, call.attempts as u32),
                };
                let submitted_at = deps.clock.now_ms();
                match deps.ai.send(SubmitJob(order)).await? {
                    Ok(view) => {
                        streak = 0;
                        if let Some(outcome) = final_outcome(&view) {
                            call.job = Some((view.job_id.clone(), submitted_at));
                            match outcome {
                                Ok(result) => return succeeded(&call, result, store_row).await,
                                Err(AiFailure::ContentRejected(d)) => {
                                    return Ok(CallEnd::Rejected(d))
                                }
                                Err(failure) => counted!(failure),
                            }
                        }
                        call.job = Some((view.job_id.clone(), submitted_at));
                        store_row(row(&call, RUNNING), false).await??;
                        (view.job_id, submitted_at)
                    }
                    Err(AiFailure::ContentRejected(d)) => return Ok(CallEnd::Rejected(d)),
                    Err(failure) if failure.is_unavailable() => {
                        // No job, or one the same key finds again: wait, same attempt.
                        streak += 1;
                        pause(saga, streak, failure.retry_after_ms(), deps).await;
                        continue;
                    }
                    Err(failure) => counted!(failure),
                }
            }
        };
        // Poll the job until it is final or its attempt runs out of time.
        let base = settings.ai_poll_interval.as_millis() as i64;
        let wait = crate::domain::policy::poll_wait_ms(base, polls, hint) as u64;
        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        polls += 1;
        match deps.ai.send(PollJob(job_id.clone())).await? {
            Ok(view) => {
                streak = 0;
                hint = view.poll_after_ms;
                match final_outcome(&view) {
                    Some(Ok(result)) => return succeeded(&call, result, store_row).await,
                    Some(Err(AiFailure::ContentRejected(d))) => return Ok(CallEnd::Rejected(d)),
                    Some(Err(failure)) => counted!(failure),
                    None => {}
                }
            }
            Err(failure) if failure.is_unavailable() => {
                // The job may still run: keep its slot, ask again later.
                streak += 1;
                pause(saga, streak, failure.retry_after_ms(), deps).await;
            }
            Err(failure) => counted!(failure),
        }
        if deps.clock.now_ms() - submitted_at > timeout_ms {
            // The attempt counts; the next one adopts the same job (rule 10).
            call.attempts += 1;
            if call.attempts >= max_attempts {
                let mut failed = row(&call, FAILED);
                failed.error = Some(AiFailure::Timeout.to_string());
                store_row(failed, true).await??;
                return Ok(CallEnd::Failed);
            }
            call.job = Some((job_id, deps.clock.now_ms()));
            store_row(row(&call, RUNNING), false).await??;
        }
    }
}

/// Stores a successful call.
async fn succeeded<F, R>(call: &CallState, result: AiResult, store_row: F) -> Result<CallEnd, Stop>
where
    F: Fn(CallRow, bool) -> R,
    R: std::future::Future<Output = Result<crate::store::StoreResult<()>, actix::MailboxError>>,
{
    let content =
        serde_json::to_string(&result.content).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let row = CallRow {
        call_index: call.index,
        attempts: call.attempts,
        status: SUCCEEDED,
        job_id: call.job.as_ref().map(|(id, _)| id.clone()),
        submitted_at_ms: call.job.as_ref().map(|(_, at)| *at),
        content: Some(content),
        score: result.score,
        error: None,
    };
    store_row(row, true).await??;
    Ok(CallEnd::Succeeded)
}

/// Waits after `streak` unavailable answers: the retry policy's backoff (at
/// least what the provider asked for), cut short at the saga deadline.
async fn pause(saga: &sagas::Model, streak: u32, retry_after: Option<i64>, deps: &SagaDeps) {
    let backoff = deps
        .settings
        .retry
        .backoff_ms(streak.saturating_sub(1), rand::random())
        .max(retry_after.unwrap_or(0));
    let until_end = saga.deadline_at_ms + 1 - deps.clock.now_ms();
    let wait = backoff.min(until_end).max(1);
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
}
