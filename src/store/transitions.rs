//! Saga transitions, written in batches: the writes of many sagas in one
//! short transaction, one multi-row statement per kind of write, so a busy
//! instance pays one commit and a handful of round trips for hundreds of
//! steps. The single-saga functions ([`Store::record_ai_done`] and the rest)
//! are batches of one.
//!
//! Every write is still fenced on id + expected step + lock token (rule 2)
//! and, while the saga goes on, renews the lease. A write that touches no
//! row is judged on its own with [`judge_unapplied`] (rule 3): an idempotent
//! repeat is success, anything else a lost lease or a conflict. Ending a
//! saga writes the result, the session status and the outbox event in the
//! same transaction; an abort that is not the participant's fault gives the
//! saga's credits back in it too, once ([`refund_credits`]).
//!
//! Each saga has one supervisor, which waits for each write before sending
//! the next, so its own writes never meet in two batches. An abort by
//! someone else (an operator's cancel, the cleanup actor) may touch the
//! same saga as a batch at the same time: those are written alone, in
//! their own transaction (`WriteAlone`), not in the batches, so two
//! batches never wait on each other's rows; and inside a batch each abort
//! runs in a savepoint of its own, so one that fails fails alone.

use std::collections::HashSet;

use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, ExprTrait, QueryFilter, QueryTrait, UpdateMany,
    Value,
};
use serde_json::json;

use super::entities::{results, sagas, score_attempts, sessions};
use super::experiences::locale_of;
use super::ledger;
use super::outbox::aborted_payload;
use super::rows::{column_in, execute_together, in_list, insert_statement, SqlType, ValueRows};
use super::sagas::{load, Fence, RankedEntry};
use super::sessions::set_session_status;
use super::webhooks::HookEvent;
use super::{new_id, Store, StoreError, StoreResult, WriteTx};
use crate::domain::admission::refunds_credits;
use crate::domain::audit::AuditEntry;
use crate::domain::failure::AiResult;
use crate::domain::ledger::Evidence;
use crate::domain::policy::{lease_until, AttemptState, EpochMs};
use crate::domain::review::Decision;
use crate::domain::saga::{judge_unapplied, AbortReason, RowNow, Step, TransitionError};
use crate::domain::session::SessionStatus;
use crate::domain::webhook::WebhookEvent;

/// One write of one saga.
#[derive(Debug, Clone)]
pub enum SagaWrite {
    /// The provider accepted the current attempt's job (AI_PENDING stays);
    /// the attempt timeout counts from the first submit, even across a crash.
    AiSubmitted {
        saga_id: String,
        token: String,
        job_id: String,
    },
    /// An attempt ran out of `AI_TIMEOUT` while its job may still run (rule
    /// 10): AI_PENDING stays with `attempts` counted, and the next attempt
    /// adopts the same job, its timeout counting from now. The job id and
    /// the lease stay, so the job keeps its AI slot: no second job starts
    /// beside it.
    AiAttemptTimedOut {
        saga_id: String,
        token: String,
        attempts: u32,
    },
    /// AI_PENDING -> AI_DONE with the result (and the job, when known).
    AiDone {
        saga_id: String,
        token: String,
        result: AiResult,
        job_id: Option<String>,
    },
    /// AI_DONE -> IN_REVIEW: the result waits for an operator. The lease
    /// is given up (a review holds no lease and no AI slot); the review
    /// actor adopts the saga again once it is approved.
    EnterReview { saga_id: String, token: String },
    /// AI_DONE (or IN_REVIEW, once approved: `after_review`) ->
    /// RANKING_DONE with the ranked entry (None: nothing to rank).
    RankingDone {
        saga_id: String,
        token: String,
        entry: Option<RankedEntry>,
        after_review: bool,
    },
    /// AI_PENDING stays for a later try at `next_attempt_at`; the lease is
    /// released, the slots of `free_calls` are freed (each with its
    /// evidence that no job runs in it), and the job is forgotten when the
    /// attempt was counted (the next attempt has a new key). A slot with no
    /// evidence stays the saga's: the claim resumes the saga in it.
    ReleaseForRetry {
        saga_id: String,
        token: String,
        state: AttemptState,
        next_attempt_at: EpochMs,
        attempt_counted: bool,
        free_calls: Vec<(i32, Evidence)>,
    },
    /// RANKING_DONE -> COMPLETED with result, session status and event.
    Complete { saga_id: String, token: String },
    /// The objects a keep of the saga is about to write (`kept_objects`),
    /// listed before they are written, while AI_PENDING, under the saga's
    /// lease: a worker that lost it lists nothing (and must write
    /// nothing). The fence holds the saga's row until the commit without
    /// writing it (the supervisor's renewals keep the lease), so an abort
    /// (so an erasure) that comes later sees the list. Listing a key twice
    /// is harmless.
    ListKept {
        saga_id: String,
        token: String,
        keys: Vec<String>,
    },
    /// Any non-final step -> ABORTED with session status and event, by the
    /// saga's holder, the cleanup actor (the saga must be unowned) or an
    /// operator (see [`Fence`]).
    Abort {
        saga_id: String,
        fence: Fence,
        reason: AbortReason,
        detail: String,
        /// The calls whose slots are free (each with its evidence that no
        /// job runs in it). The saga's other slots are detached: they
        /// count until an instance that adopts them sees their jobs end
        /// (see [`super::ledger`]).
        free_calls: Vec<(i32, Evidence)>,
        /// An operator's action: its audit record, written with the abort
        /// when the abort applies.
        audit: Option<Box<AuditEntry>>,
    },
}

impl SagaWrite {
    pub fn saga_id(&self) -> &str {
        match self {
            SagaWrite::AiSubmitted { saga_id, .. }
            | SagaWrite::AiAttemptTimedOut { saga_id, .. }
            | SagaWrite::AiDone { saga_id, .. }
            | SagaWrite::EnterReview { saga_id, .. }
            | SagaWrite::RankingDone { saga_id, .. }
            | SagaWrite::ReleaseForRetry { saga_id, .. }
            | SagaWrite::Complete { saga_id, .. }
            | SagaWrite::ListKept { saga_id, .. }
            | SagaWrite::Abort { saga_id, .. } => saga_id,
        }
    }

    /// An operator's cancel: ABORTED `CANCELLED` whoever holds the saga;
    /// a job it ran may still run, so its slots are detached, not freed.
    /// An operator's carries its audit record; a guest's erasure cancels
    /// with none.
    pub fn operator_cancel(saga_id: &str, audit: Option<AuditEntry>) -> SagaWrite {
        SagaWrite::Abort {
            saga_id: saga_id.to_owned(),
            fence: Fence::Operator,
            reason: AbortReason::Cancelled,
            detail: "cancelled by an operator".into(),
            free_calls: Vec::new(),
            audit: audit.map(Box::new),
        }
    }

    /// A rejection in review (an operator's, or the review timeout's):
    /// ABORTED `REVIEW_REJECTED`, only while in review with no decision.
    /// An operator's rejection carries its audit record; the timeout's
    /// none.
    pub fn review_reject(saga_id: &str, detail: &str, audit: Option<AuditEntry>) -> SagaWrite {
        SagaWrite::Abort {
            saga_id: saga_id.to_owned(),
            fence: Fence::Review,
            reason: AbortReason::ReviewRejected,
            detail: detail.to_owned(),
            free_calls: Vec::new(),
            audit: audit.map(Box::new),
        }
    }

    /// The slots the write, once applied, frees, by their evidence (a
    /// single call's at AI_DONE; those named by a release or an abort).
    pub fn slots_freed(&self) -> Vec<Evidence> {
        match self {
            SagaWrite::AiDone { .. } => vec![Evidence::JobFinal],
            SagaWrite::ReleaseForRetry { free_calls, .. } | SagaWrite::Abort { free_calls, .. } => {
                free_calls.iter().map(|(_, e)| *e).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Whether the write, once applied, frees the saga's AI slot.
    pub fn frees_ai_slot(&self) -> bool {
        matches!(
            self,
            SagaWrite::AiDone { .. } | SagaWrite::ReleaseForRetry { .. } | SagaWrite::Abort { .. }
        )
    }
}

/// What an applied write did beyond the saga row.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Written {
    /// An outbox event was appended (the saga ended and its session has a
    /// terminal).
    pub event_appended: bool,
    /// The visible ranking of this experience changed (an aborted saga's
    /// entry was hidden).
    pub ranking_changed: Option<String>,
    /// Slots of the aborted saga were detached (its jobs may still run):
    /// an instance adopts them and sees the jobs end.
    pub detached: bool,
    /// The webhook event this write makes (a refused input's
    /// `session.rejected`), written in the batch's transaction.
    pub hook: Option<HookEvent>,
}

/// The outcome of each write of a batch, in the batch's order.
pub type BatchOutcome = Vec<StoreResult<Written>>;

/// Rows of one kind of write: the index in the batch, the saga, the token
/// and the row's own values.
struct Rows {
    index: Vec<usize>,
    rows: Vec<(String, String, Vec<Value>)>,
}

impl Rows {
    fn new() -> Rows {
        Rows {
            index: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// The rows whose saga a statement changed (`applied`).
    fn applied<'a>(
        &'a self,
        applied: &'a HashSet<String>,
    ) -> impl Iterator<Item = &'a (String, String, Vec<Value>)> + 'a {
        self.rows
            .iter()
            .filter(|(saga_id, _, _)| applied.contains(saga_id))
    }

    fn push(&mut self, index: usize, saga_id: &str, token: &str, values: Vec<Value>) {
        self.index.push(index);
        self.rows
            .push((saga_id.to_owned(), token.to_owned(), values));
    }

    /// Each row's outcome where only a lost lease can leave it unapplied.
    fn record_lease_kept(&self, applied: &HashSet<String>, outcome: &mut Outcomes) {
        for (k, &i) in self.index.iter().enumerate() {
            outcome[i] = Some(lease_kept(applied.contains(&self.rows[k].0)));
        }
    }
}

/// The outcome of each write of a batch as it is written (None: not yet).
type Outcomes = [Option<StoreResult<Written>>];

/// The writes of a batch sorted by kind, the rows of one statement each,
/// and the credits its applied aborts give back.
struct BatchRows {
    submitted: Rows,
    timed_out: Rows,
    ai_done: Rows,
    reviewed: Rows,
    ranked: Rows,
    ranked_after_review: Rows,
    released: Rows,
    completed: Rows,
    kept: Rows,
    refunds: Vec<Refund>,
}

impl BatchRows {
    fn new() -> BatchRows {
        BatchRows {
            submitted: Rows::new(),
            timed_out: Rows::new(),
            ai_done: Rows::new(),
            reviewed: Rows::new(),
            ranked: Rows::new(),
            ranked_after_review: Rows::new(),
            released: Rows::new(),
            completed: Rows::new(),
            kept: Rows::new(),
            refunds: Vec::new(),
        }
    }

    /// Adds write `i` to the rows of its kind. An abort has none: it is
    /// written at once ([`sort_writes`]).
    fn push(&mut self, i: usize, write: &SagaWrite) -> StoreResult<()> {
        match write {
            SagaWrite::AiSubmitted {
                saga_id,
                token,
                job_id,
            } => self
                .submitted
                .push(i, saga_id, token, vec![job_id.clone().into()]),
            SagaWrite::AiAttemptTimedOut {
                saga_id,
                token,
                attempts,
            } => self
                .timed_out
                .push(i, saga_id, token, vec![(*attempts as i32).into()]),
            SagaWrite::AiDone {
                saga_id,
                token,
                result,
                job_id,
            } => self.ai_done.push(
                i,
                saga_id,
                token,
                vec![
                    content_text(result)?.into(),
                    result.score.into(),
                    job_id.clone().into(),
                ],
            ),
            SagaWrite::EnterReview { saga_id, token } => {
                self.reviewed.push(i, saga_id, token, vec![])
            }
            SagaWrite::RankingDone {
                saga_id,
                token,
                entry,
                after_review,
            } => if *after_review {
                &mut self.ranked_after_review
            } else {
                &mut self.ranked
            }
            .push(
                i,
                saga_id,
                token,
                vec![
                    entry.as_ref().map(|e| e.score).into(),
                    entry.as_ref().map(|e| e.score_attempt_id.clone()).into(),
                    entry.as_ref().map(|e| e.rank).into(),
                ],
            ),
            SagaWrite::ReleaseForRetry {
                saga_id,
                token,
                state,
                next_attempt_at,
                attempt_counted,
                ..
            } => self.released.push(
                i,
                saga_id,
                token,
                vec![
                    (state.attempts as i32).into(),
                    (state.unavailable_streak as i32).into(),
                    (*next_attempt_at).into(),
                    (*attempt_counted).into(),
                ],
            ),
            SagaWrite::Complete { saga_id, token } => {
                self.completed.push(i, saga_id, token, vec![])
            }
            SagaWrite::ListKept {
                saga_id,
                token,
                keys,
            } => self
                .kept
                .push(i, saga_id, token, vec![keys.join("\n").into()]),
            SagaWrite::Abort { .. } => {}
        }
        Ok(())
    }
}

impl Store {
    /// Applies a batch of writes in one transaction. The outer error means
    /// the transaction failed and nothing was written; otherwise each write
    /// has its own outcome. A batch must not hold two writes of one saga.
    pub async fn apply_saga_writes(
        &self,
        writes: &[SagaWrite],
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<BatchOutcome> {
        let mut outcome: Vec<Option<StoreResult<Written>>> = writes.iter().map(|_| None).collect();
        let tx = self.write_tx().await?;
        let lease = lease_until(now, lease_ms);

        let rows = sort_writes(&tx, writes, now, &mut outcome).await?;
        write_kept_lists(&tx, &rows.kept, &mut outcome).await?;
        write_ai_submitted(&tx, &rows.submitted, lease, now, &mut outcome).await?;
        write_attempt_timeouts(&tx, &rows.timed_out, lease, now, &mut outcome).await?;
        write_ai_done(&tx, &rows.ai_done, lease, now, &mut outcome).await?;
        write_review_entries(&tx, &rows.reviewed, now, &mut outcome).await?;
        for (from, ranked) in [
            (Step::AiDone, &rows.ranked),
            (Step::InReview, &rows.ranked_after_review),
        ] {
            write_rankings(&tx, from, ranked, lease, now, &mut outcome).await?;
        }
        write_releases(&tx, writes, &rows.released, now, &mut outcome).await?;
        let hooked = self.hooks().take(WebhookEvent::SessionCompleted);
        let mut hooks = write_completions(&tx, &rows.completed, now, &mut outcome, hooked).await?;
        hooks.extend(
            outcome
                .iter()
                .flatten()
                .filter_map(|o| o.as_ref().ok()?.hook.clone()),
        );
        self.enqueue_hooks(&tx, hooks, now).await?;

        // Last, so the experiences' rows are locked only until the commit.
        refund_credits(&tx, &rows.refunds).await?;
        tx.commit().await?;
        self.invalidate_hidden_ranks(&outcome).await;
        Ok(outcome
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Err(StoreError::Corrupt("write left unapplied".into()))))
            .collect())
    }

    /// Aborts that hid ranking entries: the cached scores of their
    /// experiences are read again (after the commit, never under it).
    async fn invalidate_hidden_ranks(&self, outcome: &Outcomes) {
        let hid: Vec<String> = outcome
            .iter()
            .flatten()
            .filter_map(|o| o.as_ref().ok()?.ranking_changed.clone())
            .collect();
        if !hid.is_empty() {
            self.invalidate_ranks(Some(&hid)).await;
        }
    }

    /// Applies one write (a batch of one).
    async fn apply_one(
        &self,
        write: SagaWrite,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<Written> {
        self.apply_saga_writes(std::slice::from_ref(&write), now, lease_ms)
            .await?
            .pop()
            .unwrap_or_else(|| Err(StoreError::Corrupt("empty batch outcome".into())))
    }

    /// See [`SagaWrite::AiSubmitted`].
    pub async fn record_ai_submitted(
        &self,
        saga_id: &str,
        token: &str,
        job_id: &str,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<()> {
        let write = SagaWrite::AiSubmitted {
            saga_id: saga_id.to_owned(),
            token: token.to_owned(),
            job_id: job_id.to_owned(),
        };
        self.apply_one(write, now, lease_ms).await.map(drop)
    }

    /// See [`SagaWrite::AiDone`].
    pub async fn record_ai_done(
        &self,
        saga_id: &str,
        token: &str,
        result: &AiResult,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<()> {
        let write = SagaWrite::AiDone {
            saga_id: saga_id.to_owned(),
            token: token.to_owned(),
            result: result.clone(),
            job_id: None,
        };
        self.apply_one(write, now, lease_ms).await.map(drop)
    }

    /// See [`SagaWrite::RankingDone`].
    pub async fn record_ranking_done(
        &self,
        saga_id: &str,
        token: &str,
        entry: Option<RankedEntry>,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<()> {
        let write = SagaWrite::RankingDone {
            saga_id: saga_id.to_owned(),
            token: token.to_owned(),
            entry,
            after_review: false,
        };
        self.apply_one(write, now, lease_ms).await.map(drop)
    }

    /// See [`SagaWrite::ReleaseForRetry`].
    #[allow(clippy::too_many_arguments)]
    pub async fn release_for_retry(
        &self,
        saga_id: &str,
        token: &str,
        state: AttemptState,
        next_attempt_at: EpochMs,
        attempt_counted: bool,
        free_calls: Vec<(i32, Evidence)>,
        now: EpochMs,
    ) -> StoreResult<()> {
        let write = SagaWrite::ReleaseForRetry {
            saga_id: saga_id.to_owned(),
            token: token.to_owned(),
            state,
            next_attempt_at,
            attempt_counted,
            free_calls,
        };
        self.apply_one(write, now, 0).await.map(drop)
    }

    /// See [`SagaWrite::Complete`]. True when an outbox event was appended
    /// (false when the session has no terminal, or on an idempotent repeat).
    pub async fn complete(&self, saga_id: &str, token: &str, now: EpochMs) -> StoreResult<bool> {
        let write = SagaWrite::Complete {
            saga_id: saga_id.to_owned(),
            token: token.to_owned(),
        };
        Ok(self.apply_one(write, now, 0).await?.event_appended)
    }

    /// See [`SagaWrite::Abort`]. With `Fence::Unowned` (the cleanup actor)
    /// it only applies while nobody holds the lease; with
    /// `Fence::Operator` whoever holds it, and asking again is success.
    /// The saga's slots are detached (a job may run in them).
    pub async fn abort(
        &self,
        saga_id: &str,
        fence: Fence,
        reason: AbortReason,
        detail: &str,
        now: EpochMs,
    ) -> StoreResult<Written> {
        self.abort_freeing(saga_id, fence, reason, detail, Vec::new(), now)
            .await
    }

    /// [`Self::abort`], freeing the slots of `free_calls` (each with its
    /// evidence that no job runs in it).
    pub async fn abort_freeing(
        &self,
        saga_id: &str,
        fence: Fence,
        reason: AbortReason,
        detail: &str,
        free_calls: Vec<(i32, Evidence)>,
        now: EpochMs,
    ) -> StoreResult<Written> {
        let write = SagaWrite::Abort {
            saga_id: saga_id.to_owned(),
            fence,
            reason,
            detail: detail.to_owned(),
            free_calls,
            audit: None,
        };
        self.apply_one(write, now, 0).await
    }
}

/// Sorts a batch's writes into the rows of their kinds; each abort is
/// written at once, its outcome set in `outcome`.
async fn sort_writes(
    tx: &WriteTx,
    writes: &[SagaWrite],
    now: EpochMs,
    outcome: &mut Outcomes,
) -> StoreResult<BatchRows> {
    let mut rows = BatchRows::new();
    for (i, write) in writes.iter().enumerate() {
        let SagaWrite::Abort {
            saga_id,
            fence,
            reason,
            detail,
            free_calls,
            audit,
        } = write
        else {
            rows.push(i, write)?;
            continue;
        };
        // Each abort in a savepoint of its own: one that fails
        // (a bad row, a lock timeout) fails alone, and the
        // batch's other writes go on.
        let item = tx.savepoint().await?;
        let mut its_refunds = Vec::new();
        let done = abort_one(
            &item,
            saga_id,
            fence,
            *reason,
            detail,
            free_calls,
            audit.as_deref(),
            now,
            &mut its_refunds,
        )
        .await;
        outcome[i] = Some(match done {
            Ok(result) => {
                item.commit().await?;
                rows.refunds.extend(its_refunds);
                result
            }
            Err(e) => {
                item.rollback().await?;
                tracing::warn!(%saga_id, error = %e, "an abort failed; the batch's other writes go on");
                Err(e)
            }
        });
    }
    Ok(rows)
}

/// The provider accepted these jobs (AI_PENDING stays): each saga records
/// its job, and the job binds to the saga's first slot.
async fn write_ai_submitted(
    tx: &WriteTx,
    submitted: &Rows,
    lease: EpochMs,
    now: EpochMs,
    outcome: &mut Outcomes,
) -> StoreResult<()> {
    // AI_PENDING stays: touching no row can only mean the lease is gone.
    let applied = fenced_update_many(
        tx,
        Step::AiPending,
        Some(lease),
        "ai_job_id = v.c1, ai_submitted_at_ms = COALESCE(ai_submitted_at_ms, $1), \
         unavailable_streak = 0",
        &submitted.rows,
        now,
    )
    .await?;
    let jobs: Vec<(String, String)> = submitted
        .applied(&applied)
        .filter_map(|(saga_id, _, values)| Some((saga_id.clone(), text_of(&values[0])?)))
        .collect();
    ledger::bind_first_jobs(tx, &jobs, now).await?;
    submitted.record_lease_kept(&applied, outcome);
    Ok(())
}

/// The objects keeps are about to write, listed for their sagas (see
/// [`SagaWrite::ListKept`]). Before the batch's other writes, so a keep's
/// list is in when an abort of a later batch purges (the fence:
/// [`super::guests::list_kept_under_lease`]).
async fn write_kept_lists(tx: &WriteTx, kept: &Rows, outcome: &mut Outcomes) -> StoreResult<()> {
    let wanted: Vec<(String, String, Vec<String>)> = kept
        .rows
        .iter()
        .map(|(saga_id, token, values)| {
            let keys = text_of(&values[0]).unwrap_or_default();
            let keys = keys
                .split('\n')
                .filter(|k| !k.is_empty())
                .map(str::to_owned);
            (saga_id.clone(), token.clone(), keys.collect())
        })
        .collect();
    // AI_PENDING stays: a saga not listed can only have lost its lease.
    let listed = super::guests::list_kept_under_lease(tx, &wanted).await?;
    kept.record_lease_kept(&listed, outcome);
    Ok(())
}

/// Attempts that ran out of time: AI_PENDING stays, with the attempt
/// counted.
async fn write_attempt_timeouts(
    tx: &WriteTx,
    timed_out: &Rows,
    lease: EpochMs,
    now: EpochMs,
    outcome: &mut Outcomes,
) -> StoreResult<()> {
    // The same job, a new attempt: its timeout counts from now.
    let applied = fenced_update_many(
        tx,
        Step::AiPending,
        Some(lease),
        "attempts = v.c1, unavailable_streak = 0, ai_submitted_at_ms = $1",
        &timed_out.rows,
        now,
    )
    .await?;
    timed_out.record_lease_kept(&applied, outcome);
    Ok(())
}

/// AI_PENDING -> AI_DONE with the results; the single calls' slots are
/// freed.
async fn write_ai_done(
    tx: &WriteTx,
    ai_done: &Rows,
    lease: EpochMs,
    now: EpochMs,
    outcome: &mut Outcomes,
) -> StoreResult<()> {
    let applied = fenced_update_many(
        tx,
        Step::AiPending,
        Some(lease),
        "step = 'AI_DONE', content = v.c1, ai_score = v.c2, \
         ai_job_id = COALESCE(v.c3, ai_job_id), \
         ai_duration_ms = $1 - COALESCE(ai_submitted_at_ms, $1)",
        &ai_done.rows,
        now,
    )
    .await?;
    // A single call's job is final: its slot is free. (A fan-out's
    // calls freed or detached theirs as each ended: none is attached.)
    let done: Vec<String> = ai_done.applied(&applied).map(|r| r.0.clone()).collect();
    ledger::free_first_calls(tx, &done, Evidence::JobFinal).await?;
    for (k, &i) in ai_done.index.iter().enumerate() {
        let (saga_id, token, values) = &ai_done.rows[k];
        outcome[i] = Some(if applied.contains(saga_id) {
            Ok(Written::default())
        } else {
            let offered = (text_of(&values[0]), double_of(&values[1]));
            judge(
                tx,
                saga_id,
                (Step::AiPending, Step::AiDone),
                token,
                &offered,
                |s| (s.content.clone(), s.ai_score),
            )
            .await
        });
    }
    Ok(())
}

/// AI_DONE -> IN_REVIEW, giving up the lease.
async fn write_review_entries(
    tx: &WriteTx,
    reviewed: &Rows,
    now: EpochMs,
    outcome: &mut Outcomes,
) -> StoreResult<()> {
    // The lease is given up with the step: nobody holds a saga in
    // review, so a write that touched no row can only mean the lease
    // was lost (or an earlier try of this write committed, and the
    // worker stops all the same).
    let applied = fenced_update_many(
        tx,
        Step::AiDone,
        None,
        "step = 'IN_REVIEW', lock_token = NULL, locked_until_ms = NULL, \
         review_since_ms = $1, review_decision = NULL",
        &reviewed.rows,
        now,
    )
    .await?;
    reviewed.record_lease_kept(&applied, outcome);
    Ok(())
}

/// `from` (AI_DONE or IN_REVIEW) -> RANKING_DONE with the ranked entries.
async fn write_rankings(
    tx: &WriteTx,
    from: Step,
    ranked: &Rows,
    lease: EpochMs,
    now: EpochMs,
    outcome: &mut Outcomes,
) -> StoreResult<()> {
    let applied = fenced_update_many(
        tx,
        from,
        Some(lease),
        "step = 'RANKING_DONE', score = v.c1, score_attempt_id = v.c2, rank = v.c3",
        &ranked.rows,
        now,
    )
    .await?;
    for (k, &i) in ranked.index.iter().enumerate() {
        let (saga_id, token, values) = &ranked.rows[k];
        outcome[i] = Some(if applied.contains(saga_id) {
            Ok(Written::default())
        } else {
            // The rank is a snapshot and may differ on a replay; the
            // entry is what identifies the step's data.
            let offered = (double_of(&values[0]), text_of(&values[1]));
            judge(
                tx,
                saga_id,
                (from, Step::RankingDone),
                token,
                &offered,
                |s| (s.score, s.score_attempt_id.clone()),
            )
            .await
        });
    }
    Ok(())
}

/// AI_PENDING stays for a later try: the lease is released and the named
/// slots freed.
async fn write_releases(
    tx: &WriteTx,
    writes: &[SagaWrite],
    released: &Rows,
    now: EpochMs,
    outcome: &mut Outcomes,
) -> StoreResult<()> {
    let applied = fenced_update_many(
        tx,
        Step::AiPending,
        None,
        "attempts = v.c1, unavailable_streak = v.c2, next_attempt_at_ms = v.c3, \
         lock_token = NULL, locked_until_ms = NULL, \
         ai_job_id = CASE WHEN v.c4 THEN NULL ELSE ai_job_id END, \
         ai_submitted_at_ms = CASE WHEN v.c4 THEN NULL ELSE ai_submitted_at_ms END",
        &released.rows,
        now,
    )
    .await?;
    free_released_slots(tx, writes, &applied).await?;
    released.record_lease_kept(&applied, outcome);
    Ok(())
}

/// RANKING_DONE -> COMPLETED with the results, the sessions' status and
/// the outbox events ([`finish_completed`]); with `hooked`, their
/// `session.completed` webhook events.
async fn write_completions(
    tx: &WriteTx,
    completed: &Rows,
    now: EpochMs,
    outcome: &mut Outcomes,
    hooked: bool,
) -> StoreResult<Vec<HookEvent>> {
    let applied = fenced_update_many(
        tx,
        Step::RankingDone,
        None,
        "step = 'COMPLETED'",
        &completed.rows,
        now,
    )
    .await?;
    let (appended, hooks) = finish_completed(tx, &applied, now, hooked).await?;
    for (k, &i) in completed.index.iter().enumerate() {
        let (saga_id, token, _) = &completed.rows[k];
        outcome[i] = Some(if applied.contains(saga_id) {
            Ok(Written {
                event_appended: appended.contains(saga_id),
                ..Written::default()
            })
        } else {
            judge(
                tx,
                saga_id,
                (Step::RankingDone, Step::Completed),
                token,
                &(),
                |_| (),
            )
            .await
        });
    }
    Ok(hooks)
}

/// The slots the applied releases of a batch name (each with its evidence)
/// are free.
async fn free_released_slots(
    tx: &WriteTx,
    writes: &[SagaWrite],
    applied: &HashSet<String>,
) -> StoreResult<()> {
    for write in writes {
        if let SagaWrite::ReleaseForRetry {
            saga_id,
            free_calls,
            ..
        } = write
        {
            if applied.contains(saga_id) {
                for (call, evidence) in free_calls {
                    ledger::free_calls(&**tx, saga_id, &[*call], *evidence).await?;
                }
            }
        }
    }
    Ok(())
}

/// One multi-row fenced UPDATE. Each row `(saga id, token, [c1, c2, ...])`
/// gets `sets` (SQL assignments that may read `v.c1`, `v.c2`, ... and `$1`,
/// the time) only where the saga is at `expected` and holds that token;
/// `lease` renews the lease to that time. Returns the sagas it changed.
async fn fenced_update_many(
    tx: &WriteTx,
    expected: Step,
    lease: Option<EpochMs>,
    sets: &str,
    rows: &[(String, String, Vec<Value>)],
    now: EpochMs,
) -> StoreResult<HashSet<String>> {
    let Some((_, _, first)) = rows.first() else {
        return Ok(HashSet::new());
    };
    let columns: Vec<String> = (1..=first.len()).map(|c| format!(", c{c}")).collect();
    let mut types = vec![SqlType::Text, SqlType::Text];
    types.extend(first.iter().map(SqlType::of));
    let mut source = ValueRows::new(&types);
    for (saga_id, token, row) in rows {
        source.push(
            [saga_id.clone().into(), token.clone().into()]
                .into_iter()
                .chain(row.iter().cloned()),
        );
    }
    let mut values: Vec<Value> = vec![now.into(), lease.unwrap_or(0).into()];
    let backend = tx.get_database_backend();
    let source = source.source(backend, 3, &mut values);
    let renew = if lease.is_some() {
        "locked_until_ms = $2, "
    } else {
        ""
    };
    let stmt = super::sql_for(
        backend,
        &format!(
            "WITH v(id, token{columns}) AS ({source}) \
             UPDATE sagas SET {renew}updated_at_ms = $1, {sets} FROM v \
             WHERE sagas.id = v.id \
             AND sagas.step = '{expected}' AND sagas.lock_token = v.token \
             RETURNING sagas.id",
            columns = columns.concat(),
            expected = expected.as_str(),
        ),
        values,
    );
    let returned = tx.query_all_raw(stmt).await?;
    returned
        .iter()
        .map(|r| r.try_get_by_index::<String>(0))
        .collect::<Result<_, _>>()
        .map_err(Into::into)
}

/// For the sagas just moved to COMPLETED: their result rows, their
/// sessions' status and their terminals' outbox events, a statement each.
/// Returns the sagas whose session has a terminal (an event was
/// appended), and with `hooked` their `session.completed` webhook events.
async fn finish_completed(
    tx: &WriteTx,
    completed: &HashSet<String>,
    now: EpochMs,
    hooked: bool,
) -> StoreResult<(HashSet<String>, Vec<HookEvent>)> {
    if completed.is_empty() {
        return Ok((HashSet::new(), Vec::new()));
    }
    let backend = tx.get_database_backend();
    let ids: Vec<String> = completed.iter().cloned().collect();
    // Each saga with its session, in one read.
    let sagas: Vec<(sagas::Model, Option<sessions::Model>)> = sagas::Entity::find()
        .find_also_related(sessions::Entity)
        .filter(column_in(backend, sagas::Column::Id, ids))
        .all(&**tx)
        .await?;
    let session_ids: Vec<String> = sagas.iter().map(|(s, _)| s.session_id.clone()).collect();

    let mut result_rows = Vec::with_capacity(sagas.len());
    let mut events = Vec::new();
    let mut appended = HashSet::new();
    let mut hooks = Vec::new();
    for (saga, session) in &sagas {
        let session = session.as_ref().ok_or(StoreError::NotFound("session"))?;
        let content: serde_json::Value = match &saga.content {
            Some(text) => {
                serde_json::from_str(text).map_err(|e| StoreError::Corrupt(e.to_string()))?
            }
            None => json!([]),
        };
        let score = saga.score.or(saga.ai_score);
        if hooked {
            hooks.push(completed_hook(session, &content, score));
        }
        result_rows.push(results::ActiveModel {
            id: sea_orm::ActiveValue::Set(new_id()),
            saga_id: sea_orm::ActiveValue::Set(saga.id.clone()),
            session_id: sea_orm::ActiveValue::Set(saga.session_id.clone()),
            content: sea_orm::ActiveValue::Set(content.to_string()),
            score: sea_orm::ActiveValue::Set(score),
            rank: sea_orm::ActiveValue::Set(saga.rank),
            created_at_ms: sea_orm::ActiveValue::Set(now),
        });
        if let Some(terminal_id) = &session.terminal_id {
            let payload = json!({
                "type": "session.completed",
                "session_id": saga.session_id,
                "nickname": session.nickname,
                "result": {"content": content, "score": score, "rank": saga.rank},
                "score": saga.score,
                "rank": saga.rank,
                // The result link, for a display that shows its QR code.
                "share_url": session.share_id.as_deref().map(crate::domain::guests::share_path),
            });
            events.push(Store::event_row(
                terminal_id,
                &session.id,
                &saga.id,
                payload,
                now,
            ));
            appended.insert(saga.id.clone());
        }
    }
    // The results, the sessions' status and the outbox events do not
    // depend on each other: one round trip (one hop on SQLite).
    let session_status = sessions::Entity::update_many()
        .col_expr(
            sessions::Column::Status,
            Expr::value(SessionStatus::Completed.as_str()),
        )
        .col_expr(
            sessions::Column::AbortReason,
            Expr::value(Option::<String>::None),
        )
        .col_expr(sessions::Column::UpdatedAtMs, Expr::value(now))
        .filter(column_in(backend, sessions::Column::Id, session_ids))
        .build(backend);
    let writes: Vec<_> = [
        insert_statement(backend, result_rows),
        Some(session_status),
        insert_statement(backend, events),
    ]
    .into_iter()
    .flatten()
    .collect();
    execute_together(&**tx, writes).await?;
    Ok((appended, hooks))
}

/// The `session.completed` webhook event of a session: its result's
/// links (made absolute when the body is written), its score, and its
/// nickname only where the guest consented to show it.
fn completed_hook(
    session: &sessions::Model,
    content: &serde_json::Value,
    score: Option<f64>,
) -> HookEvent {
    let media = content
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|item| item["url"].as_str().filter(|u| u.starts_with('/')));
    let mut data = json!({
        "share_url": session.share_id.as_deref().map(crate::domain::guests::share_path),
        "media_url": media,
        "score": score,
    });
    if session.consented {
        data["nickname"] = json!(session.nickname);
    }
    HookEvent {
        event: WebhookEvent::SessionCompleted,
        session_id: session.id.clone(),
        experience_id: session.experience_id.clone(),
        data,
    }
}

/// Credits an aborted saga gives back (see [`refund_credits`]).
struct Refund {
    saga_id: String,
    experience_id: String,
    credits: i64,
}

/// Gives back the credits of the sagas of this batch that aborted for a
/// reason that is not the participant's fault ([`refunds_credits`]). The
/// saga's `charged_credits` is the fence: it is set to 0 here, and only
/// the sagas it was still set for are refunded, so a saga is refunded once
/// per charge however many abort paths reach it (and its abort itself
/// applies once: the step moves to ABORTED). The experiences' rows are
/// updated in id order, one statement each, so two batches never wait on
/// each other's experiences.
async fn refund_credits(tx: &WriteTx, refunds: &[Refund]) -> StoreResult<()> {
    if refunds.is_empty() {
        return Ok(());
    }
    let backend = tx.get_database_backend();
    let mut values = Vec::new();
    let ids = in_list(
        backend,
        1,
        refunds.iter().map(|r| r.saga_id.clone()),
        &mut values,
    );
    let released: HashSet<String> = tx
        .query_all_raw(super::sql_for(
            backend,
            &format!(
                "UPDATE sagas SET charged_credits = 0 \
                 WHERE id {ids} AND charged_credits > 0 RETURNING id"
            ),
            values,
        ))
        .await?
        .iter()
        .map(|r| r.try_get_by_index::<String>(0))
        .collect::<Result<_, _>>()?;
    let mut per_experience: std::collections::BTreeMap<&str, i64> = Default::default();
    for refund in refunds.iter().filter(|r| released.contains(&r.saga_id)) {
        *per_experience.entry(&refund.experience_id).or_default() += refund.credits;
    }
    for (experience_id, credits) in per_experience {
        tx.execute_raw(super::sql_for(
            tx.get_database_backend(),
            "UPDATE experiences SET credits = credits + $2 \
             WHERE id = $1 AND credits IS NOT NULL",
            vec![experience_id.into(), credits.into()],
        ))
        .await?;
        tracing::info!(
            experience_id,
            credits,
            "credits given back for aborted sagas"
        );
    }
    Ok(())
}

/// Any non-final step -> ABORTED for one saga, with the session status, the
/// outbox event, and its ranking entry hidden; a saga that holds credits
/// and aborted for a refundable reason is added to `refunds`. Outer error:
/// the transaction must fail; inner: this write's own outcome.
#[allow(clippy::too_many_arguments)]
async fn abort_one(
    tx: &WriteTx,
    saga_id: &str,
    fence: &Fence,
    reason: AbortReason,
    detail: &str,
    free_calls: &[(i32, Evidence)],
    audit: Option<&AuditEntry>,
    now: EpochMs,
    refunds: &mut Vec<Refund>,
) -> StoreResult<StoreResult<Written>> {
    let update = fenced_abort(saga_id, fence, reason, detail, now);
    if update.exec(&**tx).await?.rows_affected == 0 {
        return judge_unapplied_abort(tx, saga_id, fence, reason).await;
    }
    let saga = load(&**tx, saga_id).await?;
    if let Some(audit) = audit {
        let audit = audit
            .clone()
            .of_experience(Some(saga.experience_id.clone()));
        super::audit::record(&**tx, &audit, now).await?;
    }
    if refunds_credits(reason) && saga.charged_credits > 0 {
        refunds.push(Refund {
            saga_id: saga.id.clone(),
            experience_id: saga.experience_id.clone(),
            credits: saga.charged_credits,
        });
    }
    let appended = end_session_aborted(tx, &saga, reason, now).await?;
    let hidden = hide_ranking_entries(tx, saga_id).await?;
    let detached = release_slots_of(tx, saga_id, free_calls, now).await?;
    Ok(Ok(Written {
        event_appended: appended,
        ranking_changed: (hidden > 0).then(|| saga.experience_id.clone()),
        detached,
        hook: (reason == AbortReason::InputRejected).then(|| HookEvent {
            event: WebhookEvent::SessionRejected,
            session_id: saga.session_id.clone(),
            experience_id: saga.experience_id.clone(),
            data: json!({"reason": reason.as_str()}),
        }),
    }))
}

/// The UPDATE that moves a saga to ABORTED, fenced as `fence` says.
fn fenced_abort(
    saga_id: &str,
    fence: &Fence,
    reason: AbortReason,
    detail: &str,
    now: EpochMs,
) -> UpdateMany<sagas::Entity> {
    let update = sagas::Entity::update_many()
        // Where it stood, read before the row changes: a retry resumes there.
        .col_expr(sagas::Column::AbortedAtStep, Expr::col(sagas::Column::Step))
        .col_expr(sagas::Column::Step, Expr::value(Step::Aborted.as_str()))
        .col_expr(sagas::Column::AbortReason, Expr::value(reason.as_str()))
        .col_expr(
            sagas::Column::AbortDetail,
            Expr::value(truncate(detail, 2_000)),
        )
        .col_expr(sagas::Column::UpdatedAtMs, Expr::value(now))
        .filter(sagas::Column::Id.eq(saga_id))
        .filter(sagas::Column::Step.is_in(Step::unfinished().map(Step::as_str)));
    match fence {
        Fence::Token(token) => update.filter(sagas::Column::LockToken.eq(token.clone())),
        Fence::Unowned => update.filter(
            sagas::Column::LockToken
                .is_null()
                .or(sagas::Column::LockedUntilMs.lt(now)),
        ),
        Fence::Operator => update,
        Fence::Review => update
            .filter(sagas::Column::Step.eq(Step::InReview.as_str()))
            .filter(sagas::Column::ReviewDecision.is_null()),
    }
}

/// Judges an abort that touched no row against the saga as it is (rule
/// 3), as its fence says. Outer error: the transaction must fail; inner:
/// the abort's own outcome.
async fn judge_unapplied_abort(
    tx: &WriteTx,
    saga_id: &str,
    fence: &Fence,
    reason: AbortReason,
) -> StoreResult<StoreResult<Written>> {
    let saga = load(&**tx, saga_id).await?;
    let recorded = saga.abort_reason.clone();
    Ok(match fence {
        Fence::Token(token) => {
            // Any runnable step may abort; only legality is checked here.
            judge_unapplied(
                Step::AiPending,
                Step::Aborted,
                token,
                &Some(reason.as_str().to_owned()),
                row_now(&saga, &recorded)?,
            )
            .map(|()| Written::default())
            .map_err(Into::into)
        }
        Fence::Unowned => Err(TransitionError::LeaseLost.into()),
        // Rejected twice is success; after an approval, or for a saga
        // not in review, it is refused.
        Fence::Review => {
            super::review::judge_on_row(Decision::Reject, &saga).map(|()| Written::default())
        }
        // Asked twice: the saga already ended that way.
        Fence::Operator
            if saga.step == Step::Aborted.as_str()
                && recorded.as_deref() == Some(reason.as_str()) =>
        {
            Ok(Written::default())
        }
        Fence::Operator => Err(TransitionError::Conflict {
            step: Step::Aborted,
            detail: match recorded {
                Some(r) => format!("the saga already ended {} ({r})", saga.step),
                None => format!("the saga already ended {}", saga.step),
            },
        }
        .into()),
    })
}

/// The aborted saga's session is ABORTED, and its terminal (if any) is
/// told. True when an outbox event was appended.
async fn end_session_aborted(
    tx: &WriteTx,
    saga: &sagas::Model,
    reason: AbortReason,
    now: EpochMs,
) -> StoreResult<bool> {
    let session = sessions::Entity::find_by_id(saga.session_id.clone())
        .one(&**tx)
        .await?
        .ok_or(StoreError::NotFound("session"))?;
    set_session_status(
        tx,
        &saga.session_id,
        SessionStatus::Aborted,
        Some(reason),
        None,
        now,
    )
    .await?;
    Store::announce(
        tx,
        &session,
        &saga.id,
        aborted_payload(
            &session,
            reason,
            saga.abort_detail.as_deref(),
            locale_of(&**tx, &session.experience_id).await?,
        ),
        now,
    )
    .await
}

/// Hides the saga's visible ranking entries; returns how many it hid.
async fn hide_ranking_entries(tx: &WriteTx, saga_id: &str) -> StoreResult<u64> {
    Ok(score_attempts::Entity::update_many()
        .col_expr(score_attempts::Column::Hidden, Expr::value(true))
        .filter(score_attempts::Column::SagaId.eq(saga_id))
        .filter(score_attempts::Column::Hidden.eq(false))
        .exec(&**tx)
        .await?
        .rows_affected)
}

/// Frees the aborted saga's slots of `free_calls` and detaches the others;
/// true when some were detached.
async fn release_slots_of(
    tx: &WriteTx,
    saga_id: &str,
    free_calls: &[(i32, Evidence)],
    now: EpochMs,
) -> StoreResult<bool> {
    // Slots with evidence are free; the others keep counting, detached,
    // until an instance that adopts them sees their jobs end (rule 10).
    for (call, evidence) in free_calls {
        ledger::free_calls(&**tx, saga_id, &[*call], *evidence).await?;
    }
    Ok(ledger::detach_calls(&**tx, saga_id, None, now).await? > 0)
}

/// Judges a write (`expected` -> `target`) that touched no row (rule 3)
/// against the row as it is: `recorded` reads what the row holds for the
/// target step, to compare with `offered`.
async fn judge<D: PartialEq + std::fmt::Debug>(
    tx: &WriteTx,
    saga_id: &str,
    (expected, target): (Step, Step),
    token: &str,
    offered: &D,
    recorded: impl FnOnce(&sagas::Model) -> D,
) -> StoreResult<Written> {
    let saga = load(&**tx, saga_id).await?;
    let recorded = recorded(&saga);
    judge_unapplied(expected, target, token, offered, row_now(&saga, &recorded)?)?;
    Ok(Written::default())
}

fn lease_kept(applied: bool) -> StoreResult<Written> {
    if applied {
        Ok(Written::default())
    } else {
        Err(TransitionError::LeaseLost.into())
    }
}

fn content_text(result: &AiResult) -> StoreResult<String> {
    serde_json::to_string(&result.content).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::String(Some(s)) => Some(s.to_string()),
        _ => None,
    }
}

fn double_of(value: &Value) -> Option<f64> {
    match value {
        Value::Double(d) => *d,
        _ => None,
    }
}

fn row_now<'a, D: PartialEq>(saga: &'a sagas::Model, data: &'a D) -> StoreResult<RowNow<'a, D>> {
    Ok(RowNow {
        step: super::sagas::step_of(saga)?,
        lock_token: saga.lock_token.as_deref(),
        data,
    })
}

fn truncate(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}
