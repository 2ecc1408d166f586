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
//! - **Slots: the ledger.** A call submits only in a slot of the ledger
//!   that it holds (`crate::store::ledger`): the claim wrote the saga's
//!   first slots before its worker started; a resumed worker reads the
//!   slots it holds; calls waiting for one take free ones at each call
//!   write, or, when nothing of the saga runs, by asking alone
//!   ([`TakeSlots`]; none free: the saga goes back to the queue). A slot
//!   goes only with evidence that no job runs in it: the job's final
//!   status, or a submit refused outright ([`evidence_of_refusal`]: after an
//!   unclear submit, only a refusal the provider examined). A call that
//!   ends while its job may run detaches its slot instead, and so does an
//!   abort for every call without evidence: the slot counts until the job
//!   ends (`crate::actors::adopter`).
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

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use uuid::Uuid;

use super::media_step::{input_photo, keep_result, PhotoRead, SagaPhoto};
use super::{final_outcome, write, ExperienceOf, SagaDeps, Stop};
use crate::actors::ai::{PollJob, SubmitJob};
use crate::actors::persistence::{SeedCalls, TakeSlots, WriteCall};
use crate::ai::{JobOrder, MaybeMade};
use crate::domain::failure::{AiFailure, AiResult, ContentItem};
use crate::domain::keys::ai_call_key;
use crate::domain::ledger::{evidence_of_refusal, Evidence};
use crate::domain::policy::{poll_wait_ms, AfterFailure, AttemptState, EpochMs};
use crate::domain::saga::AbortReason;
use crate::media::keep::KeepError;
use crate::store::ai_calls::{CallRow, CallSlot, FAILED, RUNNING, SUCCEEDED};
use crate::store::entities::{ai_calls, sagas};
use crate::store::ledger::Wanted;
use crate::store::sagas::Holds;
use crate::store::transitions::SagaWrite;
use crate::store::StoreError;
use crate::telemetry;

/// Slots freed with their evidence, by call index.
pub(super) type Freed = Vec<(i32, Evidence)>;

/// How the AI step ended for this worker.
pub(super) enum StepOutcome {
    /// Enough calls succeeded: the merged result (contents in call order),
    /// and the job of a single call.
    Done {
        result: AiResult,
        job_id: Option<String>,
    },
    /// End the saga with this reason. `free_calls`: the slots it held in
    /// which no job runs; its other slots are detached (their jobs may
    /// still run).
    Abort {
        reason: AbortReason,
        detail: String,
        free_calls: Freed,
    },
    /// No job of the saga may be running and a call must wait: release
    /// the lease until `next_attempt_at`, freeing the saga's slots.
    Release {
        state: AttemptState,
        next_attempt_at: EpochMs,
        attempt_counted: bool,
        failure: AiFailure,
        free_calls: Freed,
    },
    /// The saga holds no slot for the calls it has left and none is free:
    /// back to the queue, where the claim grants it slots in its turn.
    WaitForSlot { state: AttemptState },
}

/// How one call ended.
enum CallEnd {
    Succeeded(AiResult, Option<String>),
    /// Out of attempts (or of time before the deadline); whether its job
    /// may still run is in [`Shared::jobs`].
    Failed {
        reason: AbortReason,
        detail: String,
    },
    /// Moderation refused the input.
    Rejected(String),
    /// The photo the submission named is gone (`INPUT_MISSING`).
    InputMissing(String),
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
#[derive(Default)]
struct Shared {
    /// Calls that may have a job at the provider: a submit was sent and no
    /// evidence has come since that no job runs.
    jobs: Mutex<BTreeSet<i32>>,
    /// The last evidence each call had that no job of it runs.
    evidence: Mutex<HashMap<i32, Evidence>>,
    /// Calls waiting for a slot (`(call, key attempt)`), for the call
    /// writes to ask for.
    wanted: Mutex<Vec<(i32, i32)>>,
    /// Calls a call write got a slot for, not started yet.
    granted: Mutex<Vec<i32>>,
}

impl Shared {
    fn sent(&self, call: i32) {
        lock(&self.jobs).insert(call);
    }

    fn settled(&self, call: i32, evidence: Evidence) {
        lock(&self.jobs).remove(&call);
        lock(&self.evidence).insert(call, evidence);
    }

    fn may_run(&self) -> bool {
        !lock(&self.jobs).is_empty()
    }

    /// Of `held`, the slots with evidence that no job runs in them (a slot
    /// never submitted in: [`Evidence::NeverSubmitted`]).
    fn freeable(&self, held: &BTreeSet<i32>) -> Freed {
        let (jobs, evidence) = (lock(&self.jobs), lock(&self.evidence));
        held.iter()
            .filter(|c| !jobs.contains(c))
            .map(|&c| {
                (
                    c,
                    evidence
                        .get(&c)
                        .copied()
                        .unwrap_or(Evidence::NeverSubmitted),
                )
            })
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
    /// The key a submit sends: `ai_call_key(base, index, key_attempt)` (the
    /// saga's base key, or the one of the slot it took back).
    base: Uuid,
    key_attempt: i32,
    /// A submit with this key had an unclear outcome: the job may exist
    /// until the provider answers the key or examines and refuses it.
    unclear: bool,
    /// When this key was first sent (or its slot took it): a job it made
    /// was made no earlier. None until the first send of a key.
    first_sent_ms: Option<i64>,
    /// When this key was last sent (None: not by this worker).
    last_sent_ms: Option<i64>,
}

/// Everything a call needs of its saga.
struct Ctx<'a> {
    saga: &'a sagas::Model,
    experience: &'a ExperienceOf,
    token: &'a str,
    deps: &'a SagaDeps,
    book: Book,
    shared: Arc<Shared>,
    /// The saga's photo once read (every call sends the same one).
    photo: Mutex<Option<Option<SagaPhoto>>>,
}

/// Runs the saga's calls that are not final yet, each in a slot of the
/// ledger that it holds. `holds`: what the claim says the worker holds;
/// read from the ledger on a second run of the step.
pub(super) async fn run_ai_step(
    saga: &sagas::Model,
    experience: &ExperienceOf,
    token: &str,
    deps: &SagaDeps,
    holds: &mut Holds,
) -> Result<StepOutcome, Stop> {
    let (calls, min_success) = experience.fan_out.unwrap_or((1, 1));
    let book = if calls > 1 {
        Book::CallRows
    } else {
        Book::SagaRow
    };
    let base = uuid_of(&saga.ai_base_key, &saga.id)?;
    let mut todo = calls_to_run(saga, token, deps, book, calls, base).await?;
    let held = slots_held(saga, deps, std::mem::replace(holds, Holds::Read), &mut todo).await?;
    let shared = Arc::new(Shared::default());
    for call in todo.iter().filter(|c| c.job.is_some() || c.unclear) {
        shared.sent(call.index);
    }
    let ctx = Ctx {
        saga,
        experience,
        token,
        deps,
        book,
        shared,
        photo: Mutex::new(None),
    };
    let ended = run_calls(&ctx, todo, held).await?;
    let (single, failures) = match ended {
        Ran::Out(outcome) => return Ok(outcome),
        Ran::AllFinal { single, failures } => (single, failures),
    };
    if let Some((result, job_id)) = single {
        return Ok(StepOutcome::Done { result, job_id });
    }
    merge_calls(saga, deps, calls, min_success, &failures).await
}

/// The calls of the saga that are not final, where each stands. A fan-out
/// first copies its session's earlier results ([`SeedCalls`]).
async fn calls_to_run(
    saga: &sagas::Model,
    token: &str,
    deps: &SagaDeps,
    book: Book,
    calls: i32,
    base: Uuid,
) -> Result<Vec<CallState>, Stop> {
    let offset = saga.attempt_offset.max(0);
    let call = |index: i32, attempts: u32, job: Option<(String, i64)>| CallState {
        index,
        attempts,
        streak: saga.unavailable_streak.max(0) as u32,
        job,
        base,
        key_attempt: offset + attempts as i32,
        unclear: false,
        first_sent_ms: None,
        last_sent_ms: None,
    };
    if book == Book::SagaRow {
        let job = saga.ai_job_id.clone().zip(saga.ai_submitted_at_ms);
        return Ok(vec![call(0, saga.attempts.max(0) as u32, job)]);
    }
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
            found => todo.push(call(
                index,
                found.map_or(0, |r| r.attempts.max(0) as u32),
                found.and_then(|r| r.job_id.clone().zip(r.submitted_at_ms)),
            )),
        }
    }
    tracing::info!(saga_id = %saga.id, calls, left = todo.len(), "AI step: running calls");
    Ok(todo)
}

/// The calls that hold a slot: those the claim reserved now, or, for a
/// resumed saga, those the ledger says it holds. A held slot whose job id
/// was never recorded is the call's: its next submit sends that slot's key
/// again (the provider returns the job the first submit made).
async fn slots_held(
    saga: &sagas::Model,
    deps: &SagaDeps,
    holds: Holds,
    todo: &mut [CallState],
) -> Result<BTreeSet<i32>, Stop> {
    if let Holds::Fresh(calls) = holds {
        return Ok(calls.into_iter().collect());
    }
    let mut held = BTreeSet::new();
    for slot in deps.store.slots_of_saga(&saga.id).await? {
        let Some(call) = todo.iter_mut().find(|c| c.index == slot.call_index) else {
            tracing::warn!(saga_id = %saga.id, call = slot.call_index, "a slot is held for a call that is final; it stays in use until the saga ends");
            continue;
        };
        held.insert(call.index);
        match (&call.job, slot.job_id) {
            (None, Some(job_id)) => call.job = Some((job_id, deps.clock.now_ms())),
            (None, None) => {
                call.base = uuid_of(&slot.base_key, &saga.id)?;
                call.key_attempt = slot.key_attempt;
                call.unclear = true;
                call.first_sent_ms = Some(slot.keyed_at_ms);
            }
            (Some(_), _) => {}
        }
    }
    Ok(held)
}

/// A stored base key, read.
fn uuid_of(text: &str, saga_id: &str) -> Result<Uuid, StoreError> {
    Uuid::parse_str(text)
        .map_err(|e| StoreError::Corrupt(format!("AI base key of saga {saga_id}: {e}")))
}

/// How the calls ended.
enum Ran {
    /// The step ends here (an abort, a release, no slot).
    Out(StepOutcome),
    /// Every call is final: a single call's result, or the failures of a
    /// fan-out's calls.
    AllFinal {
        single: Option<(AiResult, Option<String>)>,
        failures: Vec<(AbortReason, String)>,
    },
}

/// Runs every call that holds a slot; calls waiting for one start as the
/// call writes get them. When nothing runs and the calls left hold no slot,
/// asks for free ones alone, and without any goes back to the queue.
async fn run_calls(
    ctx: &Ctx<'_>,
    todo: Vec<CallState>,
    mut held: BTreeSet<i32>,
) -> Result<Ran, Stop> {
    let mut waiting = todo;
    let mut running = FuturesUnordered::new();
    let mut single: Option<(AiResult, Option<String>)> = None;
    let mut failures: Vec<(AbortReason, String)> = Vec::new();
    loop {
        held.extend(std::mem::take(&mut *lock(&ctx.shared.granted)));
        let (ready, rest): (Vec<CallState>, Vec<CallState>) =
            waiting.into_iter().partition(|c| held.contains(&c.index));
        waiting = rest;
        for call in ready {
            running.push(run_call(ctx, call));
        }
        *lock(&ctx.shared.wanted) = waiting.iter().map(|c| (c.index, c.key_attempt)).collect();
        if running.is_empty() {
            if waiting.is_empty() {
                break;
            }
            // Back to the queue as it stands: nothing counted.
            let state = AttemptState {
                attempts: ctx.saga.attempts.max(0) as u32,
                unavailable_streak: ctx.saga.unavailable_streak.max(0) as u32,
            };
            let want = Wanted {
                provider: ctx.experience.provider.clone(),
                calls: lock(&ctx.shared.wanted).clone(),
            };
            let granted = ctx
                .deps
                .persistence
                .send(TakeSlots {
                    saga_id: ctx.saga.id.clone(),
                    token: ctx.token.to_owned(),
                    want,
                })
                .await??;
            if granted.is_empty() {
                return Ok(Ran::Out(StepOutcome::WaitForSlot { state }));
            }
            held.extend(granted);
            continue;
        }
        let Some(ended) = running.next().await else {
            break;
        };
        let (index, end) = ended?;
        // Slots a call write got for waiting calls are the saga's from now
        // on: an outcome below frees those never submitted in.
        held.extend(std::mem::take(&mut *lock(&ctx.shared.granted)));
        let outcome = match end {
            CallEnd::Succeeded(result, job_id) => {
                held.remove(&index);
                if ctx.book == Book::SagaRow {
                    single = Some((result, job_id));
                }
                continue;
            }
            CallEnd::Failed { reason, detail } if ctx.book == Book::CallRows => {
                // Freed (or, while its job may run, detached) by its write.
                held.remove(&index);
                failures.push((reason, detail));
                continue;
            }
            CallEnd::Failed { reason, detail } => StepOutcome::Abort {
                reason,
                detail,
                free_calls: ctx.shared.freeable(&held),
            },
            CallEnd::Rejected(detail) => StepOutcome::Abort {
                reason: AbortReason::InputRejected,
                detail,
                free_calls: ctx.shared.freeable(&held),
            },
            CallEnd::InputMissing(detail) => StepOutcome::Abort {
                reason: AbortReason::InputMissing,
                detail,
                free_calls: ctx.shared.freeable(&held),
            },
            CallEnd::OutOfTime => StepOutcome::Abort {
                reason: AbortReason::AiTimeout,
                detail: "the saga deadline passed while waiting for the AI".to_owned(),
                free_calls: ctx.shared.freeable(&held),
            },
            CallEnd::Release {
                state,
                next_attempt_at,
                attempt_counted,
                failure,
            } => {
                // No job of the saga may be running: the other calls are
                // waiting too, and are dropped with their waits.
                let attempts = state.attempts.max(ctx.saga.attempts.max(0) as u32);
                StepOutcome::Release {
                    state: AttemptState { attempts, ..state },
                    next_attempt_at,
                    attempt_counted: attempt_counted && ctx.book == Book::SagaRow,
                    failure,
                    free_calls: ctx.shared.freeable(&held),
                }
            }
        };
        return Ok(Ran::Out(outcome));
    }
    Ok(Ran::AllFinal { single, failures })
}

/// A fan-out whose calls are all final: the merged result when at least
/// `min_success` succeeded, an abort otherwise.
async fn merge_calls(
    saga: &sagas::Model,
    deps: &SagaDeps,
    calls: i32,
    min_success: i32,
    failures: &[(AbortReason, String)],
) -> Result<StepOutcome, Stop> {
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
            // Every call freed or detached its slot as it ended.
            free_calls: Vec::new(),
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
    /// A counted failure whose job is final (the evidence); the next
    /// attempt has no job yet and a new key, in the same slot (RUNNING).
    NextAttempt(Evidence),
    /// Final: succeeded with this content list (JSON) and score.
    Succeeded(String, Option<f64>),
    /// Final: failed with this error; with evidence that no job of it
    /// runs, or none (its job may still run: its slot is detached).
    Failed(String, Option<Evidence>),
}

impl Ctx<'_> {
    /// The saga's photo for its provider, read once.
    async fn photo(&self) -> Result<PhotoRead, Stop> {
        if let Some(photo) = lock(&self.photo).clone() {
            return Ok(PhotoRead::Ready(photo));
        }
        let read = input_photo(self.saga, &self.experience.provider, self.deps).await?;
        if let PhotoRead::Ready(photo) = &read {
            *lock(&self.photo) = Some(photo.clone());
        }
        Ok(read)
    }

    /// Records where `call` stands. A saga of one call records only what
    /// a resumed worker needs (its job, its attempts) on the saga row; a
    /// fan-out writes the call's row, changes the call's slot, and asks
    /// for slots for the calls waiting for one.
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
                    Record::NextAttempt(_) | Record::Succeeded(..) | Record::Failed(..) => {
                        return Ok(())
                    }
                };
                write(self.deps, saga_write).await??;
                Ok(())
            }
            Book::CallRows => self.record_call(call, what).await,
        }
    }

    /// A fan-out call's write (see [`Self::record`]).
    async fn record_call(&self, call: &CallState, what: Record) -> Result<(), Stop> {
        let job_id = call.job.as_ref().map(|(id, _)| id.clone());
        let (status, content, score, error, slot) = match what {
            Record::Submitted => (
                RUNNING,
                None,
                None,
                None,
                CallSlot::BindJob(job_id.clone().unwrap_or_default()),
            ),
            Record::TimedOut => (RUNNING, None, None, None, CallSlot::Keep),
            Record::NextAttempt(evidence) => (
                RUNNING,
                None,
                None,
                None,
                CallSlot::Rekey(call.key_attempt, evidence),
            ),
            Record::Succeeded(content, score) => (
                SUCCEEDED,
                Some(content),
                score,
                None,
                CallSlot::Free(Evidence::JobFinal),
            ),
            Record::Failed(error, evidence) => (
                FAILED,
                None,
                None,
                Some(error),
                evidence.map_or(CallSlot::Detach, CallSlot::Free),
            ),
        };
        let row = CallRow {
            call_index: call.index,
            attempts: call.attempts as i32,
            status,
            job_id,
            submitted_at_ms: call.job.as_ref().map(|(_, at)| *at),
            content,
            score,
            error,
        };
        let want = Wanted {
            provider: self.experience.provider.clone(),
            calls: lock(&self.shared.wanted).clone(),
        };
        let granted = self
            .deps
            .persistence
            .send(WriteCall {
                saga_id: self.saga.id.clone(),
                token: self.token.to_owned(),
                row,
                slot,
                want,
            })
            .await??;
        if !granted.is_empty() {
            lock(&self.shared.wanted).retain(|(c, _)| !granted.contains(c));
            lock(&self.shared.granted).extend(granted);
        }
        Ok(())
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

    /// The order of `call`'s submit, with the key of its slot. After an
    /// unclear submit of that key it says since when the job may exist and
    /// which jobs the ledger holds for other calls, so a provider without
    /// an idempotency key looks for it before making another.
    async fn order(&self, call: &CallState, now: i64) -> Result<JobOrder, Stop> {
        let fan_out_call = (self.book == Book::CallRows).then_some(call.index);
        let key = ai_call_key(call.base, call.index as u32, call.key_attempt.max(0) as u32);
        let mut order = JobOrder::for_call(
            &self.experience.kind,
            &self.saga.prompt,
            &self.saga.session_id,
            fan_out_call,
            key,
        );
        if call.unclear {
            let since_ms = call.first_sent_ms.unwrap_or(now);
            order.maybe_made = Some(MaybeMade {
                since_ms,
                last_sent_ms: call.last_sent_ms.unwrap_or(since_ms),
                now_ms: now,
                taken: self.deps.store.jobs_held(&self.experience.provider).await?,
                look_only: false,
                photo: None,
            });
        }
        Ok(order)
    }

    /// A failure after which no job of this call runs (`evidence` says
    /// why), by the retry policy: the call ends, or waits for its next
    /// try, releasing the saga when nothing else of it may be running.
    async fn after_failure(
        &self,
        call: &mut CallState,
        failure: AiFailure,
        evidence: Evidence,
    ) -> Result<Option<CallEnd>, Stop> {
        self.shared.settled(call.index, evidence);
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
                self.record(call, Record::Failed(detail.clone(), Some(evidence)))
                    .await?;
                Ok(Some(CallEnd::Rejected(detail)))
            }
            AfterFailure::Abort { reason, detail } => {
                call.job = None;
                self.record(call, Record::Failed(detail.clone(), Some(evidence)))
                    .await?;
                tracing::warn!(saga_id = %self.saga.id, call = call.index, %failure, %reason, "AI call failed for good");
                Ok(Some(CallEnd::Failed { reason, detail }))
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
                    call.key_attempt = self.saga.attempt_offset.max(0) + call.attempts as i32;
                    call.first_sent_ms = None;
                    call.last_sent_ms = None;
                    self.record(call, Record::NextAttempt(evidence)).await?;
                }
                if !self.shared.may_run() {
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

/// One call, from where it stands to a final status (or a release), in
/// the slot it holds.
async fn run_call(ctx: &Ctx<'_>, call: CallState) -> Result<(i32, CallEnd), Stop> {
    let index = call.index;
    Ok((index, drive_call(ctx, call).await?))
}

/// What a submit left the call with.
enum Submitted {
    /// The job to poll, and when its attempt began.
    Job(String, i64),
    /// Ask again (the same key, or the next attempt's).
    Again,
    /// The call ended.
    End(CallEnd),
}

/// Sends the call's submit with its slot's key and judges the answer.
async fn submit(ctx: &Ctx<'_>, call: &mut CallState) -> Result<Submitted, Stop> {
    let deps = ctx.deps;
    let photo = match ctx.photo().await? {
        PhotoRead::Ready(photo) => photo,
        PhotoRead::Missing(detail) => {
            tracing::warn!(saga_id = %ctx.saga.id, %detail, "the saga's photo is gone; aborting INPUT_MISSING");
            return Ok(Submitted::End(CallEnd::InputMissing(detail)));
        }
        PhotoRead::Unavailable(detail) => {
            call.streak += 1;
            tracing::warn!(saga_id = %ctx.saga.id, %detail, "the media store cannot give the saga's photo now; waiting");
            let wait = ctx.backoff_ms(call.streak, &AiFailure::Unavailable(detail));
            ctx.pause(wait, None).await;
            return Ok(Submitted::Again);
        }
    };
    let submitted_at = deps.clock.now_ms();
    let mut order = ctx.order(call, submitted_at).await?;
    let first_sent = *call.first_sent_ms.get_or_insert(submitted_at);
    order.input = photo.map(|p| p.for_send(&deps.media.secret, first_sent, submitted_at));
    call.last_sent_ms = Some(submitted_at);
    ctx.shared.sent(call.index);
    let submit = ctx.experience.ai.send(SubmitJob(order));
    let provider = &ctx.experience.provider;
    let answer = telemetry::provider_call("submit", ctx.saga, provider, call.index, None, submit);
    match answer.await? {
        Ok(view) => {
            if ctx.book == Book::SagaRow {
                telemetry::record_job_id(&tracing::Span::current(), &view.job_id);
            }
            call.streak = 0;
            call.unclear = false;
            call.job = Some((view.job_id.clone(), submitted_at));
            if let Some(outcome) = final_outcome(&view) {
                return judged(ctx, call, outcome).await;
            }
            ctx.record(call, Record::Submitted).await?;
            tracing::info!(saga_id = %ctx.saga.id, call = call.index, job_id = %view.job_id, attempt = call.attempts, "AI job submitted");
            Ok(Submitted::Job(view.job_id, submitted_at))
        }
        Err(failure) => match evidence_of_refusal(&failure, call.unclear) {
            Some(evidence) => {
                // No job under this key: refused outright, or a counted
                // refusal.
                call.unclear = false;
                match ctx.after_failure(call, failure, evidence).await? {
                    Some(end) => Ok(Submitted::End(end)),
                    None => Ok(Submitted::Again),
                }
            }
            None => {
                // The provider may have made the job (this submit's
                // outcome, or an earlier one's, is unclear): it counts as
                // running, its slot stays, and the same key will find it.
                call.unclear = true;
                call.streak += 1;
                tracing::warn!(saga_id = %ctx.saga.id, call = call.index, attempt = call.attempts, %failure, "AI submit outcome unclear; asking again with the same key");
                ctx.pause(ctx.backoff_ms(call.streak, &failure), None).await;
                Ok(Submitted::Again)
            }
        },
    }
}

/// A job's final outcome for the call.
async fn judged(
    ctx: &Ctx<'_>,
    call: &mut CallState,
    outcome: Result<AiResult, AiFailure>,
) -> Result<Submitted, Stop> {
    let outcome = match outcome {
        Ok(result) => kept(ctx, call, result).await,
        failed => failed,
    };
    match outcome {
        Ok(result) => {
            ctx.shared.settled(call.index, Evidence::JobFinal);
            Ok(Submitted::End(succeeded(ctx, call, result).await?))
        }
        Err(AiFailure::Timeout) if ctx.deps.clock.now_ms() > ctx.saga.deadline_at_ms => {
            ctx.shared.settled(call.index, Evidence::JobFinal);
            Ok(Submitted::End(CallEnd::OutOfTime))
        }
        Err(failure) => match ctx.after_failure(call, failure, Evidence::JobFinal).await? {
            Some(end) => Ok(Submitted::End(end)),
            None => Ok(Submitted::Again),
        },
    }
}

/// The call's loop: submit (or adopt the job), poll until final or the
/// attempt's time runs out.
async fn drive_call(ctx: &Ctx<'_>, mut call: CallState) -> Result<CallEnd, Stop> {
    let deps = ctx.deps;
    let settings = &deps.settings;
    let timeout_ms = settings.ai_timeout.as_millis() as i64;
    // Polls of the call's job so far, and the provider's hint of when to
    // ask next (see `poll_wait_ms`).
    let (mut polls, mut hint): (u32, Option<i64>) = (0, None);
    loop {
        if deps.clock.now_ms() > ctx.saga.deadline_at_ms {
            return Ok(CallEnd::OutOfTime);
        }
        // The job of this attempt: adopted, or submitted now.
        let (job_id, submitted_at) = match call.job.clone() {
            Some(job) => job,
            None => match submit(ctx, &mut call).await? {
                Submitted::Job(job_id, at) => (job_id, at),
                Submitted::Again => continue,
                Submitted::End(end) => return Ok(end),
            },
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
                    match judged(ctx, &mut call, outcome).await? {
                        Submitted::End(end) => return Ok(end),
                        _ => continue,
                    }
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
            if let Some(end) = attempt_timed_out(ctx, &mut call, &job_id).await? {
                return Ok(end);
            }
        }
    }
}

/// The attempt ran out of `AI_TIMEOUT`: it counts, and the next attempt
/// adopts the same job (rule 10); out of attempts, the call fails while
/// its job may still run, and its slot is detached.
async fn attempt_timed_out(
    ctx: &Ctx<'_>,
    call: &mut CallState,
    job_id: &str,
) -> Result<Option<CallEnd>, Stop> {
    let settings = &ctx.deps.settings;
    match settings.retry.after_timeout(call.attempts) {
        Some(attempts) => {
            call.attempts = attempts;
            call.job = Some((job_id.to_owned(), ctx.deps.clock.now_ms()));
            ctx.record(call, Record::TimedOut).await?;
            tracing::warn!(saga_id = %ctx.saga.id, call = call.index, %job_id, attempts, "AI attempt timed out; the next attempt adopts its job, which may still be running");
            Ok(None)
        }
        None => {
            let detail = format!(
                "{} (attempt {} of {})",
                AiFailure::Timeout,
                call.attempts + 1,
                settings.retry.max_attempts
            );
            call.attempts += 1;
            ctx.record(call, Record::Failed(detail.clone(), None))
                .await?;
            Ok(Some(CallEnd::Failed {
                reason: AbortReason::AiTimeout,
                detail,
            }))
        }
    }
}

/// The job succeeded: its files are kept before anything records the
/// result. A transient failure (the file's server or the media store not
/// answering) waits with backoff and tries again, with no new AI job,
/// until the saga's deadline (then `Timeout`, which ends the call out of
/// time); a permanent one (gone, too large, wrong type, a refused origin)
/// is the attempt's failure.
async fn kept(
    ctx: &Ctx<'_>,
    call: &mut CallState,
    result: AiResult,
) -> Result<AiResult, AiFailure> {
    let mut streak = 0;
    loop {
        match keep_result(
            ctx.saga,
            ctx.experience,
            call.index,
            result.clone(),
            ctx.deps,
        )
        .await
        {
            Ok(kept) => return Ok(kept),
            Err(KeepError::Permanent(detail)) => {
                tracing::warn!(saga_id = %ctx.saga.id, call = call.index, %detail, "the result could not be kept; the attempt failed");
                return Err(AiFailure::JobFailed(format!(
                    "its result could not be kept: {detail}"
                )));
            }
            Err(KeepError::Transient(detail)) => {
                if ctx.deps.clock.now_ms() > ctx.saga.deadline_at_ms {
                    return Err(AiFailure::Timeout);
                }
                streak += 1;
                tracing::warn!(saga_id = %ctx.saga.id, call = call.index, %detail, "keeping the result failed for now; trying again (no new AI job)");
                let wait = ctx.backoff_ms(streak, &AiFailure::Unavailable(detail));
                ctx.pause(wait, None).await;
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
