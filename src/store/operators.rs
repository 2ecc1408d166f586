//! What operators read and do: the counts of the live dashboard, the list
//! of sagas (filtered, newest first, by cursor), and the retry of an
//! aborted saga (charged again when its abort gave its credits back). The
//! operator's cancel is an ordinary fenced abort
//! ([`super::sagas::Fence::Operator`]).

use std::collections::BTreeMap;

use sea_orm::{ConnectionTrait, EntityTrait, QueryResult, Value};

use super::entities::{experiences, sagas};
use super::ledger;
use super::presence::TerminalView;
use super::review::{ReviewItem, ReviewQueue};
use super::sagas::load;
use super::sessions::set_session_status;
use super::submissions::take_credits;
use super::{Store, StoreError, StoreResult, WriteTx};
use crate::domain::admission::submission_cost;
use crate::domain::audit::AuditEntry;
use crate::domain::policy::{is_stuck, ownership, EpochMs};
use crate::domain::saga::{retry_from, AbortReason, Step, TransitionError};
use crate::domain::session::SessionStatus;

/// How far back "aborted by reason" counts.
pub const ABORTED_WINDOW_MS: i64 = 3_600_000;
/// Saga rows in the dashboard's "recent" list.
const RECENT: u64 = 20;
/// The most sagas one page of the admin list holds.
pub const MAX_PAGE: u64 = 500;

/// One experience's AI load.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ExperienceLoad {
    pub slug: String,
    pub title: String,
    /// AI slots in use now: the ledger's rows (one per call that may have
    /// a job at the provider, of ended sagas too).
    pub in_flight: i64,
    pub max_in_flight: i32,
    /// AI_PENDING sagas nobody holds, waiting for a slot or for their
    /// retry time (not past their deadline).
    pub queued: i64,
    /// Its PIN gallery is locked until then: someone guessed its PIN past
    /// the ceiling of wrong guesses (null when it is not).
    #[serde(serialize_with = "crate::clock::serialize_rfc3339_opt")]
    pub gallery_locked_until: Option<EpochMs>,
    /// Its gallery's PIN has fewer than 6 digits (set before they were
    /// required; it was given right once): it no longer opens the
    /// gallery, and a new PIN is needed.
    pub gallery_pin_outdated: bool,
}

/// A saga as operators see it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct SagaView {
    #[schema(format = Uuid)]
    pub saga_id: String,
    #[schema(format = Uuid)]
    pub session_id: String,
    /// The experience's slug.
    pub experience: String,
    pub nickname: String,
    #[schema(value_type = Step)]
    pub step: String,
    #[schema(value_type = Option<AbortReason>, required = true)]
    pub abort_reason: Option<String>,
    #[schema(required = true)]
    pub abort_detail: Option<String>,
    pub attempts: i32,
    pub recoveries: i32,
    /// Not ended, and its lease ran out or its deadline passed
    /// ([`is_stuck`]).
    pub stuck: bool,
    #[serde(
        rename = "created_at",
        serialize_with = "crate::clock::serialize_rfc3339"
    )]
    #[schema(value_type = String, format = DateTime)]
    pub created_at_ms: EpochMs,
    #[serde(
        rename = "updated_at",
        serialize_with = "crate::clock::serialize_rfc3339"
    )]
    #[schema(value_type = String, format = DateTime)]
    pub updated_at_ms: EpochMs,
    /// Who forgot its session's data: `retention`, `participant` or
    /// `operator` (the saga row stays for the statistics); null while kept.
    #[schema(required = true, example = "participant")]
    pub forgotten: Option<String>,
}

/// Everything the operators' `stats` frame counts.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorStats {
    /// Sagas per step, every step present.
    pub steps: BTreeMap<String, i64>,
    pub experiences: Vec<ExperienceLoad>,
    /// Runnable sagas that nobody holds: queued for an AI slot, waiting
    /// for a retry, or to be resumed.
    pub queue_depth: i64,
    /// Sagas aborted in the last [`ABORTED_WINDOW_MS`], per reason.
    pub aborted_by_reason: BTreeMap<String, i64>,
    pub terminals: Vec<TerminalView>,
    /// The sagas that changed last, newest first.
    pub recent: Vec<SagaView>,
    /// How many results wait in review, and since when the oldest.
    pub review_queue: ReviewQueue,
    /// The oldest [`REVIEW_SHOWN`] of them, oldest first.
    pub review: Vec<ReviewItem>,
}

/// Review items the live dashboard holds at most (the admin API lists
/// them all).
pub const REVIEW_SHOWN: u64 = 100;

/// Which sagas the admin list shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SagaFilter {
    pub step: Option<Step>,
    pub reason: Option<AbortReason>,
    /// An experience's slug.
    pub experience: Option<String>,
    /// Last changed at or after this time.
    pub updated_after: Option<EpochMs>,
    /// Last changed before this time.
    pub updated_before: Option<EpochMs>,
    /// Part of the nickname (any case), or the start of the session id.
    pub q: Option<String>,
    /// Sagas after this one in the list's order (newest first).
    pub after: Option<SagaCursor>,
}

/// The longest `q` a search takes.
pub const MAX_QUERY_CHARS: usize = 100;

impl SagaFilter {
    /// The filter's terms (without the list's cursor) as SQL conditions
    /// over `sagas s`, `experiences e` and `sessions se`, binding their
    /// values after those already in `values`.
    fn conditions(&self, values: &mut Vec<Value>) -> Vec<String> {
        let mut conditions = Vec::new();
        let mut bind = |v: Value| {
            values.push(v);
            format!("${}", values.len())
        };
        if let Some(step) = self.step {
            conditions.push(format!("s.step = {}", bind(step.as_str().into())));
        }
        if let Some(reason) = self.reason {
            conditions.push(format!("s.abort_reason = {}", bind(reason.as_str().into())));
        }
        if let Some(slug) = &self.experience {
            conditions.push(format!("e.slug = {}", bind(slug.clone().into())));
        }
        if let Some(ms) = self.updated_after {
            conditions.push(format!("s.updated_at_ms >= {}", bind(ms.into())));
        }
        if let Some(ms) = self.updated_before {
            conditions.push(format!("s.updated_at_ms < {}", bind(ms.into())));
        }
        if let Some(q) = self.q.as_deref().map(str::trim).filter(|q| !q.is_empty()) {
            let q: String = q.chars().take(MAX_QUERY_CHARS).collect();
            // LIKE's wildcards in the text are matched as themselves.
            let escaped = q
                .to_lowercase()
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_");
            let part = bind(format!("%{escaped}%").into());
            let start = bind(format!("{escaped}%").into());
            conditions.push(format!(
                "(LOWER(se.nickname) LIKE {part} ESCAPE '\\' \
                 OR s.session_id LIKE {start} ESCAPE '\\')"
            ));
        }
        conditions
    }
}

/// A place in the admin list: the last saga of the page before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SagaCursor {
    pub updated_at_ms: EpochMs,
    pub saga_id: String,
}

impl SagaCursor {
    /// The opaque text handed to clients: `<updated_at_ms>.<saga_id>`.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.updated_at_ms, self.saga_id)
    }

    pub fn decode(text: &str) -> Option<SagaCursor> {
        let (ms, id) = text.split_once('.')?;
        let updated_at_ms = ms.parse().ok()?;
        (!id.is_empty() && id.len() <= 64).then(|| SagaCursor {
            updated_at_ms,
            saga_id: id.to_owned(),
        })
    }
}

/// What a retry did.
#[derive(Debug, Clone)]
pub struct Retried {
    pub saga: sagas::Model,
    /// The experience whose ranking shows the saga's entry again.
    pub ranking_changed: Option<String>,
    /// It aborted in review (rejected, or cancelled there), and waits in
    /// the review queue again.
    pub back_in_review: bool,
}

/// The columns of [`SagaView`], in the order [`saga_view_of`] reads them.
const SAGA_VIEW_COLUMNS: &str = "s.id, s.session_id, e.slug, se.nickname, s.step, \
     s.abort_reason, s.abort_detail, s.attempts, s.recoveries, s.lock_token, \
     s.locked_until_ms, s.deadline_at_ms, s.created_at_ms, s.updated_at_ms, s.handed_over, \
     se.forgotten_by";
const SAGA_VIEW_FROM: &str = "FROM sagas s JOIN experiences e ON e.id = s.experience_id \
     JOIN sessions se ON se.id = s.session_id";

fn saga_view_of(row: &QueryResult, now: EpochMs) -> StoreResult<SagaView> {
    let step: String = row.try_get_by_index(4)?;
    let ended = step
        .parse::<Step>()
        .map_err(|e| StoreError::Corrupt(e.to_string()))?
        .is_final();
    let lock_token: Option<String> = row.try_get_by_index(9)?;
    let locked_until: Option<i64> = row.try_get_by_index(10)?;
    let deadline: i64 = row.try_get_by_index(11)?;
    Ok(SagaView {
        saga_id: row.try_get_by_index(0)?,
        session_id: row.try_get_by_index(1)?,
        experience: row.try_get_by_index(2)?,
        nickname: row.try_get_by_index(3)?,
        stuck: is_stuck(
            ended,
            ownership(
                lock_token.as_deref(),
                locked_until,
                row.try_get_by_index(14)?,
                now,
            ),
            deadline,
            now,
        ),
        step,
        abort_reason: row.try_get_by_index(5)?,
        abort_detail: row.try_get_by_index(6)?,
        attempts: row.try_get_by_index(7)?,
        recoveries: row.try_get_by_index(8)?,
        created_at_ms: row.try_get_by_index(12)?,
        updated_at_ms: row.try_get_by_index(13)?,
        forgotten: row.try_get_by_index(15)?,
    })
}

impl Store {
    /// The dashboard's counts, read at `now`; displays count as online when
    /// their instance saw them since `presence_since`.
    pub async fn operator_stats(
        &self,
        now: EpochMs,
        presence_since: EpochMs,
    ) -> StoreResult<OperatorStats> {
        let mut steps: BTreeMap<String, i64> = Step::ALL
            .iter()
            .map(|s| (s.as_str().to_owned(), 0))
            .collect();
        steps.extend(self.count_by_step().await?);

        let rows = self
            .db()
            .query_all_raw(self.sql(
                "SELECT e.id, e.slug, e.title, e.max_in_flight, \
                 COALESCE(SUM(CASE WHEN s.id IS NOT NULL AND s.lock_token IS NULL \
                   AND s.deadline_at_ms >= $1 THEN 1 ELSE 0 END), 0) \
                 FROM experiences e LEFT JOIN sagas s \
                   ON s.experience_id = e.id AND s.step = 'AI_PENDING' \
                 GROUP BY e.id, e.slug, e.title, e.max_in_flight, e.created_at_ms \
                 ORDER BY e.created_at_ms, e.slug",
                vec![now.into()],
            ))
            .await?;
        // Slots in use: the ledger's, every job that may run (of ended
        // sagas too), on whatever provider it runs.
        let slots = super::ledger::slots_in_use(self.db(), None, now).await?;
        let guards = self.gallery_guards().await?;
        let experiences = rows
            .iter()
            .map(|r| {
                let id: String = r.try_get_by_index(0)?;
                let guard = guards.get(&id).copied().unwrap_or_default();
                Ok(ExperienceLoad {
                    slug: r.try_get_by_index(1)?,
                    title: r.try_get_by_index(2)?,
                    max_in_flight: r.try_get_by_index(3)?,
                    in_flight: slots.experience_total(&id),
                    queued: r.try_get_by_index(4)?,
                    gallery_locked_until: guard.locked_at(now),
                    gallery_pin_outdated: guard.outdated_pin,
                })
            })
            .collect::<Result<Vec<_>, sea_orm::DbErr>>()?;

        let queue_depth = self
            .db()
            .query_one_raw(self.sql(
                "SELECT COUNT(*) FROM sagas WHERE step IN ('AI_PENDING', 'AI_DONE', 'RANKING_DONE') \
                 AND (lock_token IS NULL OR locked_until_ms < $1)",
                vec![now.into()],
            ))
            .await?
            .map(|r| r.try_get_by_index::<i64>(0))
            .transpose()?
            .unwrap_or(0);

        let rows = self
            .db()
            .query_all_raw(self.sql(
                "SELECT abort_reason, COUNT(*) FROM sagas \
                 WHERE step = 'ABORTED' AND updated_at_ms >= $1 GROUP BY abort_reason",
                vec![(now - ABORTED_WINDOW_MS).into()],
            ))
            .await?;
        let mut aborted_by_reason = BTreeMap::new();
        for r in &rows {
            let reason: Option<String> = r.try_get_by_index(0)?;
            let n: i64 = r.try_get_by_index(1)?;
            *aborted_by_reason
                .entry(reason.unwrap_or_else(|| "UNKNOWN".to_owned()))
                .or_insert(0) += n;
        }

        let (recent, _) = self.saga_views(&SagaFilter::default(), RECENT, now).await?;
        Ok(OperatorStats {
            steps,
            experiences,
            queue_depth,
            aborted_by_reason,
            terminals: self.terminal_views(None, presence_since).await?,
            recent,
            review_queue: self.review_queue().await?,
            review: self.review_items(None, REVIEW_SHOWN).await?,
        })
    }

    /// One page of sagas matching `filter`, newest change first, and the
    /// cursor of the next page when there is one.
    pub async fn saga_views(
        &self,
        filter: &SagaFilter,
        limit: u64,
        now: EpochMs,
    ) -> StoreResult<(Vec<SagaView>, Option<SagaCursor>)> {
        let limit = limit.clamp(1, MAX_PAGE);
        let mut values: Vec<Value> = Vec::new();
        let mut conditions = filter.conditions(&mut values);
        let bind = |values: &mut Vec<Value>, v: Value| {
            values.push(v);
            format!("${}", values.len())
        };
        if let Some(after) = &filter.after {
            let ms = bind(&mut values, after.updated_at_ms.into());
            let id = bind(&mut values, after.saga_id.clone().into());
            conditions.push(format!(
                "(s.updated_at_ms < {ms} OR (s.updated_at_ms = {ms} AND s.id < {id}))"
            ));
        }
        let page = bind(&mut values, ((limit + 1) as i64).into());
        let filter = where_all(&conditions);
        let rows = self
            .db()
            .query_all_raw(self.sql(
                &format!(
                    "SELECT {SAGA_VIEW_COLUMNS} {SAGA_VIEW_FROM} {filter} \
                     ORDER BY s.updated_at_ms DESC, s.id DESC LIMIT {page}"
                ),
                values,
            ))
            .await?;
        let mut views = rows
            .iter()
            .map(|r| saga_view_of(r, now))
            .collect::<StoreResult<Vec<_>>>()?;
        let next = if views.len() as u64 > limit {
            views.truncate(limit as usize);
            views.last().map(|v| SagaCursor {
                updated_at_ms: v.updated_at_ms,
                saga_id: v.saga_id.clone(),
            })
        } else {
            None
        };
        Ok((views, next))
    }

    /// How many sagas match `filter` (its cursor aside).
    pub async fn count_sagas(&self, filter: &SagaFilter) -> StoreResult<i64> {
        let mut values = Vec::new();
        let conditions = filter.conditions(&mut values);
        let row = self
            .db()
            .query_one_raw(self.sql(
                &format!(
                    "SELECT COUNT(*) {SAGA_VIEW_FROM} {}",
                    where_all(&conditions)
                ),
                values,
            ))
            .await?;
        Ok(match row {
            Some(r) => r.try_get_by_index(0)?,
            None => 0,
        })
    }

    /// The ids of the next `limit` sagas matching `filter` (its cursor
    /// aside) after `after_id`, in id order: the pages of a bulk action.
    /// The order does not move as the action changes the sagas, so each is
    /// visited once.
    pub async fn saga_ids_matching(
        &self,
        filter: &SagaFilter,
        after_id: Option<&str>,
        limit: u64,
    ) -> StoreResult<Vec<String>> {
        let mut values = Vec::new();
        let mut conditions = filter.conditions(&mut values);
        if let Some(after) = after_id {
            values.push(after.into());
            conditions.push(format!("s.id > ${}", values.len()));
        }
        values.push((limit as i64).into());
        let rows = self
            .db()
            .query_all_raw(self.sql(
                &format!(
                    "SELECT s.id {SAGA_VIEW_FROM} {} ORDER BY s.id LIMIT ${}",
                    where_all(&conditions),
                    values.len()
                ),
                values,
            ))
            .await?;
        rows.iter()
            .map(|r| r.try_get_by_index::<String>(0).map_err(Into::into))
            .collect()
    }

    /// One saga as operators see it.
    pub async fn saga_view(&self, saga_id: &str, now: EpochMs) -> StoreResult<Option<SagaView>> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                &format!("SELECT {SAGA_VIEW_COLUMNS} {SAGA_VIEW_FROM} WHERE s.id = $1"),
                vec![saga_id.into()],
            ))
            .await?;
        row.map(|r| saga_view_of(&r, now)).transpose()
    }

    /// An operator's retry: the ABORTED saga runs again from the step it
    /// aborted at ([`retry_from`]), keeping its AI result and its ranking
    /// entry (shown again), with fresh attempts, recoveries and deadline
    /// (`deadline_ms` from now), unowned so any worker claims it. A single
    /// run takes back the slots its abort detached whose jobs the slot
    /// adopter has not seen end yet ([`ledger::take_back_calls`]): the
    /// retried run goes on with those jobs, or sends their keys again (the
    /// provider returns the job a lost answer made; each slot keeps the
    /// key it was sent with), so a retry never runs a second job of a call
    /// beside the first. A single call otherwise keeps its base key and
    /// goes on from the key after every key it used (`attempt_offset`); a
    /// fan-out starts its other calls from a new base key. Its session
    /// goes ABORTED -> SUBMITTING.
    ///
    /// Refused (conflict) unless the saga is ABORTED, is its session's
    /// latest, and the session is still ABORTED; fenced on the ABORTED step,
    /// so of two retries at once exactly one runs.
    ///
    /// Credits: a saga whose abort gave its credits back (it holds none)
    /// is charged again, like a new submission (`ai_calls` credits, taken
    /// only if that many are left: `BudgetExhausted` otherwise, and nothing
    /// changes). One that still holds its credits (it aborted for the
    /// participant's input) runs on them. The operator's retry is not held
    /// to the experience's closing time.
    pub async fn retry_saga(
        &self,
        saga_id: &str,
        audit: Option<&AuditEntry>,
        now: EpochMs,
        deadline_ms: i64,
    ) -> StoreResult<Retried> {
        let tx = self.write_tx().await?;
        let saga = load(&*tx, saga_id).await?;
        let resume = resume_step(&saga)?;
        self.refuse_unless_latest(&tx, &saga).await?;
        let (experience, restart) = plan_restart(&tx, &saga, resume, now).await?;
        self.restart_saga(&tx, &saga, &restart, now, deadline_ms)
            .await?;
        restart_session(&tx, &saga, now).await?;
        // After the saga and its session, like every transaction that
        // touches credits; dropping the transaction undoes the rest.
        let charge = restart.charge;
        if charge > 0 && !take_credits(&*tx, &experience.id, charge).await? {
            return Err(StoreError::BudgetExhausted);
        }
        if resume == Step::AiPending {
            self.reset_ai_calls(&tx, &saga).await?;
        }
        let shown = self.show_score_attempts(&tx, &saga.id).await?;
        let saga = load(&*tx, saga_id).await?;
        if let Some(audit) = audit {
            let audit = audit
                .clone()
                .of_experience(Some(saga.experience_id.clone()));
            super::audit::record(&*tx, &audit, now).await?;
        }
        tx.commit().await?;
        if shown > 0 {
            self.invalidate_ranks(Some(std::slice::from_ref(&saga.experience_id)))
                .await;
        }
        tracing::info!(saga_id, step = %resume, "operator retry: saga runs again");
        Ok(Retried {
            ranking_changed: (shown > 0).then(|| saga.experience_id.clone()),
            back_in_review: resume == Step::InReview,
            saga,
        })
    }

    /// Refuses (conflict) the retry of a saga that is not its session's
    /// latest.
    async fn refuse_unless_latest(&self, tx: &WriteTx, saga: &sagas::Model) -> StoreResult<()> {
        let newer = tx
            .query_one_raw(self.sql(
                "SELECT COUNT(*) FROM sagas WHERE session_id = $1 AND id <> $2 \
                 AND created_at_ms >= $3",
                vec![
                    saga.session_id.clone().into(),
                    saga.id.clone().into(),
                    saga.created_at_ms.into(),
                ],
            ))
            .await?
            .map(|r| r.try_get_by_index::<i64>(0))
            .transpose()?
            .unwrap_or(0);
        if newer > 0 {
            return Err(conflict(
                "the session has a newer submission; retry that one instead",
            ));
        }
        Ok(())
    }

    /// The fenced update that makes the ABORTED saga run again from
    /// `restart.resume` (conflict when it is no longer ABORTED or its
    /// charged credits moved).
    async fn restart_saga(
        &self,
        tx: &WriteTx,
        saga: &sagas::Model,
        restart: &Restart,
        now: EpochMs,
        deadline_ms: i64,
    ) -> StoreResult<()> {
        let Restart {
            resume,
            charge,
            single,
            key_attempt,
            job_id,
        } = restart;
        let updated = tx
            .execute_raw(self.sql(
                &format!(
                    "UPDATE sagas SET step = $2, lock_token = NULL, locked_until_ms = NULL, \
                 attempts = 0, recoveries = 0, unavailable_streak = 0, \
                 next_attempt_at_ms = $3, deadline_at_ms = $4, \
                 ai_base_key = CASE WHEN $8 THEN ai_base_key ELSE $5 END, \
                 attempt_offset = CASE WHEN $9 >= 0 THEN $9 \
                     WHEN $8 THEN attempt_offset + attempts + 1 ELSE 0 END, \
                 ai_job_id = CASE WHEN $2 = 'AI_PENDING' THEN $10 ELSE ai_job_id END, \
                 ai_submitted_at_ms = CASE WHEN $2 <> 'AI_PENDING' THEN ai_submitted_at_ms \
                     WHEN $10 IS NULL THEN NULL ELSE $3 END, \
                 abort_reason = NULL, abort_detail = NULL, aborted_at_step = NULL, \
                 review_since_ms = CASE WHEN $2 = 'IN_REVIEW' THEN $3 ELSE review_since_ms END, \
                 review_decision = NULL, \
                 charged_credits = charged_credits + $6, updated_at_ms = $3, {link_trace} \
                 WHERE id = $1 AND step = 'ABORTED' AND charged_credits = $7",
                    link_trace = super::sagas::link_trace("true")
                ),
                vec![
                    saga.id.clone().into(),
                    resume.as_str().into(),
                    now.into(),
                    (now + deadline_ms).into(),
                    uuid::Uuid::new_v4().to_string().into(),
                    (*charge).into(),
                    saga.charged_credits.into(),
                    (*single).into(),
                    key_attempt.unwrap_or(-1).into(),
                    job_id.clone().into(),
                ],
            ))
            .await?
            .rows_affected();
        if updated == 0 {
            return Err(conflict("the saga changed meanwhile; reload it"));
        }
        Ok(())
    }

    /// A fan-out saga runs again the calls that have no result: its
    /// failed ones, and those whose job failed or timed out (like
    /// `ai_job_id` in [`Self::restart_saga`]); a job it was waiting on is
    /// polled again. Every call it runs has fresh attempts.
    async fn reset_ai_calls(&self, tx: &WriteTx, saga: &sagas::Model) -> StoreResult<()> {
        tx.execute_raw(self.sql(
            "DELETE FROM ai_calls WHERE saga_id = $1 AND (status = 'FAILED' \
             OR (status = 'RUNNING' AND $2 IN ('AI_FAILED', 'AI_TIMEOUT')))",
            vec![
                saga.id.clone().into(),
                saga.abort_reason.clone().unwrap_or_default().into(),
            ],
        ))
        .await?;
        tx.execute_raw(self.sql(
            "UPDATE ai_calls SET attempts = 0 WHERE saga_id = $1 AND status = 'RUNNING'",
            vec![saga.id.clone().into()],
        ))
        .await?;
        Ok(())
    }

    /// Shows the saga's ranking entry again (its score attempts hidden by
    /// the abort); how many were shown.
    async fn show_score_attempts(&self, tx: &WriteTx, saga_id: &str) -> StoreResult<u64> {
        Ok(tx
            .execute_raw(self.sql(
                "UPDATE score_attempts SET hidden = $2 WHERE saga_id = $1 AND hidden = $3",
                vec![saga_id.into(), false.into(), true.into()],
            ))
            .await?
            .rows_affected())
    }
}

/// How a retried saga runs again: the step it resumes at, the credits it
/// is charged again, whether it makes a single AI call, and that call's
/// key attempt and job when its slot was taken back.
struct Restart {
    resume: Step,
    charge: i64,
    single: bool,
    key_attempt: Option<i32>,
    job_id: Option<String>,
}

/// How the saga runs again, read in its transaction: its experience
/// (what a charge costs, whether it makes a single call) and, when it
/// resumes at AI_PENDING, the slots its abort detached, taken back
/// ([`ledger::take_back_calls`]).
async fn plan_restart(
    tx: &WriteTx,
    saga: &sagas::Model,
    resume: Step,
    now: EpochMs,
) -> StoreResult<(experiences::Model, Restart)> {
    let experience = experiences::Entity::find_by_id(saga.experience_id.clone())
        .one(&**tx)
        .await?
        .ok_or(StoreError::NotFound("experience"))?;
    let charge = if saga.charged_credits > 0 {
        0
    } else {
        submission_cost(experience.ai_calls, experience.credits.is_some())
    };
    let single = experience.ai_calls <= 1;
    let taken_back = if resume == Step::AiPending {
        ledger::take_back_calls(&**tx, &saga.id, now).await?
    } else {
        Vec::new()
    };
    // A single call's slot taken back: its key and job go on.
    let (key_attempt, job_id) = match taken_back.iter().find(|(call, ..)| *call == 0) {
        Some((_, key_attempt, job_id)) if single => (Some(*key_attempt), job_id.clone()),
        _ => (None, None),
    };
    let restart = Restart {
        resume,
        charge,
        single,
        key_attempt,
        job_id,
    };
    Ok((experience, restart))
}

/// The step an ABORTED saga's retry resumes at ([`retry_from`] the step
/// it aborted at).
fn resume_step(saga: &sagas::Model) -> StoreResult<Step> {
    let step = super::sagas::step_of(saga)?;
    let aborted_at = saga
        .aborted_at_step
        .as_deref()
        .map(str::parse::<Step>)
        .transpose()
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok(retry_from(step, aborted_at)?)
}

/// Its session goes ABORTED -> SUBMITTING (conflict when it is no longer
/// ABORTED).
async fn restart_session(tx: &WriteTx, saga: &sagas::Model, now: EpochMs) -> StoreResult<()> {
    let moved = set_session_status(
        tx,
        &saga.session_id,
        SessionStatus::Submitting,
        None,
        Some(SessionStatus::Aborted),
        now,
    )
    .await?;
    if moved == 0 {
        return Err(conflict(
            "the session is no longer ABORTED (it took a new submission, or its data was erased)",
        ));
    }
    Ok(())
}

fn conflict(detail: &str) -> StoreError {
    TransitionError::Conflict {
        step: Step::AiPending,
        detail: detail.to_owned(),
    }
    .into()
}

/// `WHERE a AND b ...`, or nothing.
fn where_all(conditions: &[String]) -> String {
    if conditions.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conditions.join(" AND "))
    }
}
