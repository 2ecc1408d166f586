//! Saga rows: the claim, the fenced transitions and the final transactions.
//!
//! Every write that a worker makes is one conditional UPDATE on id + expected
//! step + lock token that also renews the lease (rule 2). When it touches no
//! row, [`judge_unapplied`] tells an idempotent repeat (success) from a lost
//! lease or a conflict (rule 3).

use sea_orm::sea_query::{Expr, SimpleExpr};
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, ExprTrait, FromQueryResult, QueryFilter, QueryOrder,
    QuerySelect,
};
use serde_json::json;

use super::entities::{results, sagas, sessions};
use super::outbox::aborted_payload;
use super::sessions::set_session_status;
use super::{new_id, Store, StoreError, StoreResult, WriteTx};
use crate::domain::failure::AiResult;
use crate::domain::policy::{lease_until, AttemptState, EpochMs};
use crate::domain::saga::{judge_unapplied, AbortReason, RowNow, Step, TransitionError};
use crate::domain::session::SessionStatus;

/// Settings the claim needs, from configuration.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRules {
    pub lease_ms: i64,
    pub max_recoveries: u32,
}

/// Who may end a saga: its lease holder, or (for the cleanup actor) nobody,
/// meaning the saga must be unowned at that moment.
#[derive(Debug, Clone, Copy)]
pub enum Fence<'a> {
    Token(&'a str),
    Unowned,
}

/// The SQL condition "a worker may claim this saga now", the mirror of
/// `domain::policy::recovery` returning `Claim`, with `now` and
/// `max_recoveries` bound at placeholders `$now` and `$max`.
fn claimable(now: usize, max: usize) -> String {
    format!(
        "step IN ('AI_PENDING', 'AI_DONE', 'RANKING_DONE') \
         AND next_attempt_at_ms <= ${now} AND deadline_at_ms >= ${now} \
         AND (lock_token IS NULL OR (locked_until_ms < ${now} AND recoveries < ${max}))"
    )
}

impl Store {
    pub async fn saga(&self, id: &str) -> StoreResult<Option<sagas::Model>> {
        Ok(sagas::Entity::find_by_id(id.to_owned())
            .one(self.db())
            .await?)
    }

    /// Experiences that have a saga a worker could claim now, with their
    /// `max_in_flight`, oldest experience first.
    pub async fn experiences_with_claimable(
        &self,
        now: EpochMs,
        rules: ClaimRules,
    ) -> StoreResult<Vec<(String, i32)>> {
        let stmt = self.sql(
            &format!(
                "SELECT e.id, e.max_in_flight FROM experiences e WHERE EXISTS \
                 (SELECT 1 FROM sagas WHERE experience_id = e.id AND {}) \
                 ORDER BY e.created_at_ms, e.id",
                claimable(1, 2)
            ),
            vec![now.into(), (rules.max_recoveries as i32).into()],
        );
        let rows = self.db().query_all_raw(stmt).await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get_by_index::<String>(0)?,
                    r.try_get_by_index::<i32>(1)?,
                ))
            })
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(Into::into)
    }

    /// AI jobs in flight for an experience: sagas in AI_PENDING whose lease is
    /// held.
    pub async fn in_flight<C: ConnectionTrait>(
        conn: &C,
        experience_id: &str,
        now: EpochMs,
    ) -> StoreResult<i64> {
        let stmt = super::sql_for(
            conn.get_database_backend(),
            "SELECT COUNT(*) FROM sagas WHERE experience_id = $1 AND step = 'AI_PENDING' \
             AND lock_token IS NOT NULL AND locked_until_ms >= $2",
            vec![experience_id.into(), now.into()],
        );
        let row = conn.query_one_raw(stmt).await?;
        Ok(row
            .map(|r| r.try_get_by_index::<i64>(0))
            .transpose()?
            .unwrap_or(0))
    }

    /// Claims, for one experience, at most `limit` of the oldest claimable
    /// sagas: first those resumed past the AI step (they need no AI slot, so
    /// a long AI queue never starves them), then AI_PENDING ones up to the
    /// experience's free AI capacity. The claimed sagas share one fresh lock
    /// token and get a lease; one resumed after a lost lease counts a
    /// recovery. On PostgreSQL the count and the claim run under a
    /// transaction-scoped advisory lock per experience, so the cap is exact
    /// across instances, and rows locked by someone else are skipped, never
    /// waited for. Each step's claim is one statement that walks
    /// `idx_sagas_claim` in age order, so it costs the same however long the
    /// queue is.
    pub async fn claim_runnable(
        &self,
        experience_id: &str,
        max_in_flight: i32,
        limit: usize,
        now: EpochMs,
        rules: ClaimRules,
    ) -> StoreResult<Vec<sagas::Model>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let tx = self.write_tx().await?;
        if self.is_postgres() {
            tx.execute_raw(self.sql(
                "SELECT pg_advisory_xact_lock(hashtext($1))",
                vec![experience_id.into()],
            ))
            .await?;
        }
        let token = new_id();
        let mut claimed = Vec::new();
        for step in [Step::RankingDone, Step::AiDone] {
            let room = limit - claimed.len();
            claimed.extend(
                self.claim_step(&tx, experience_id, step, room, &token, now, rules)
                    .await?,
            );
        }
        let room = limit - claimed.len();
        if room > 0 {
            let in_flight = Self::in_flight(&*tx, experience_id, now).await?;
            let free = (max_in_flight as i64 - in_flight).clamp(0, room as i64) as usize;
            claimed.extend(
                self.claim_step(
                    &tx,
                    experience_id,
                    Step::AiPending,
                    free,
                    &token,
                    now,
                    rules,
                )
                .await?,
            );
        }
        tx.commit().await?;
        Ok(claimed)
    }

    /// One claim statement: the oldest `n` claimable sagas of the experience
    /// at `step` get `token` and a lease.
    #[allow(clippy::too_many_arguments)]
    async fn claim_step(
        &self,
        tx: &WriteTx,
        experience_id: &str,
        step: Step,
        n: usize,
        token: &str,
        now: EpochMs,
        rules: ClaimRules,
    ) -> StoreResult<Vec<sagas::Model>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let stmt = self.claim_statement("", experience_id, step, n, token, now, rules);
        let rows = tx.query_all_raw(stmt).await?;
        let mut sagas = rows
            .iter()
            .map(|row| sagas::Model::from_query_result(row, ""))
            .collect::<Result<Vec<_>, _>>()?;
        sagas.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        Ok(sagas)
    }

    /// The claim statement, after `prefix` (empty, or `EXPLAIN`). The step
    /// is spelled in the SQL, not bound, so PostgreSQL proves that the
    /// partial index `idx_sagas_claim` applies even in a generic plan.
    #[allow(clippy::too_many_arguments)]
    fn claim_statement(
        &self,
        prefix: &str,
        experience_id: &str,
        step: Step,
        n: usize,
        token: &str,
        now: EpochMs,
        rules: ClaimRules,
    ) -> sea_orm::Statement {
        let lock = if self.is_postgres() {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        self.sql(
            &format!(
                // The picked ids are materialised first: a LIMIT subquery
                // with SKIP LOCKED inside `IN (...)` may be run again by the
                // planner and pick more rows than the limit.
                "{prefix} WITH picked AS MATERIALIZED (SELECT id FROM sagas \
                 WHERE experience_id = $1 AND step = '{step}' AND {claimable} \
                 ORDER BY created_at_ms, id LIMIT $6{lock}) \
                 UPDATE sagas SET lock_token = $4, locked_until_ms = $5, updated_at_ms = $2, \
                 recoveries = recoveries + (CASE WHEN lock_token IS NULL THEN 0 ELSE 1 END) \
                 WHERE id IN (SELECT id FROM picked) AND {claimable} RETURNING *",
                step = step.as_str(),
                claimable = claimable(2, 3),
            ),
            vec![
                experience_id.into(),
                now.into(),
                (rules.max_recoveries as i32).into(),
                token.into(),
                lease_until(now, rules.lease_ms).into(),
                (n as i64).into(),
            ],
        )
    }

    /// How the database would run the claim of `step` for an experience
    /// (PostgreSQL `EXPLAIN`, SQLite `EXPLAIN QUERY PLAN`), one line per plan
    /// node. Nothing is claimed. For tests and diagnostics: the claim must
    /// walk `idx_sagas_claim` whatever the queue length.
    pub async fn claim_plan(
        &self,
        experience_id: &str,
        step: Step,
        now: EpochMs,
        rules: ClaimRules,
    ) -> StoreResult<String> {
        let (prefix, column) = if self.is_postgres() {
            ("EXPLAIN", 0)
        } else {
            ("EXPLAIN QUERY PLAN", 3)
        };
        let stmt = self.claim_statement(prefix, experience_id, step, 10, "plan", now, rules);
        let rows = self.db().query_all_raw(stmt).await?;
        let lines = rows
            .iter()
            .map(|row| row.try_get_by_index::<String>(column))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(lines.join("\n"))
    }

    /// Extends the lease of a saga we hold; `LeaseLost` when we do not.
    pub async fn renew_lease(
        &self,
        saga_id: &str,
        token: &str,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<()> {
        let stmt = sagas::Entity::update_many()
            .col_expr(
                sagas::Column::LockedUntilMs,
                Expr::value(lease_until(now, lease_ms)),
            )
            .filter(sagas::Column::Id.eq(saga_id))
            .filter(sagas::Column::LockToken.eq(token))
            .filter(sagas::Column::Step.is_in(Step::runnable().map(Step::as_str)));
        let tx = self.write_tx().await?;
        let rows = stmt.exec(&*tx).await?.rows_affected;
        tx.commit().await?;
        if rows == 1 {
            Ok(())
        } else {
            Err(TransitionError::LeaseLost.into())
        }
    }

    /// Records the provider's job id of the current attempt (AI_PENDING stays),
    /// so the attempt timeout counts from the first submit even across a crash.
    pub async fn record_ai_submitted(
        &self,
        saga_id: &str,
        token: &str,
        job_id: &str,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        let rows = fenced_update(
            &tx,
            saga_id,
            Step::AiPending,
            token,
            now,
            Some(lease_ms),
            vec![
                (sagas::Column::AiJobId, Expr::value(job_id)),
                (
                    sagas::Column::AiSubmittedAtMs,
                    Expr::cust_with_values("COALESCE(ai_submitted_at_ms, $1)", [now]),
                ),
                (sagas::Column::UnavailableStreak, Expr::value(0)),
            ],
        )
        .await?;
        // The update does not depend on data: touching no row can only mean
        // the saga is no longer ours at AI_PENDING.
        if rows == 0 {
            return Err(TransitionError::LeaseLost.into());
        }
        tx.commit().await?;
        Ok(())
    }

    /// AI_PENDING -> AI_DONE with the AI result.
    pub async fn record_ai_done(
        &self,
        saga_id: &str,
        token: &str,
        result: &AiResult,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<()> {
        let content = serde_json::to_string(&result.content)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let tx = self.write_tx().await?;
        let rows = fenced_update(
            &tx,
            saga_id,
            Step::AiPending,
            token,
            now,
            Some(lease_ms),
            vec![
                (sagas::Column::Step, Expr::value(Step::AiDone.as_str())),
                (sagas::Column::Content, Expr::value(content.clone())),
                (sagas::Column::AiScore, Expr::value(result.score)),
            ],
        )
        .await?;
        if rows == 0 {
            let saga = load(&*tx, saga_id).await?;
            let offered = (Some(content), result.score);
            let recorded = (saga.content.clone(), saga.ai_score);
            judge_unapplied(
                Step::AiPending,
                Step::AiDone,
                token,
                &offered,
                row_now(&saga, &recorded)?,
            )?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// AI_DONE -> RANKING_DONE with the ranked score and its entry (all
    /// `None` when there was nothing to rank).
    pub async fn record_ranking_done(
        &self,
        saga_id: &str,
        token: &str,
        entry: Option<RankedEntry>,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<()> {
        let (score, entry_id, rank) = match &entry {
            Some(e) => (
                Some(e.score),
                Some(e.score_attempt_id.clone()),
                Some(e.rank),
            ),
            None => (None, None, None),
        };
        let tx = self.write_tx().await?;
        let rows = fenced_update(
            &tx,
            saga_id,
            Step::AiDone,
            token,
            now,
            Some(lease_ms),
            vec![
                (sagas::Column::Step, Expr::value(Step::RankingDone.as_str())),
                (sagas::Column::Score, Expr::value(score)),
                (sagas::Column::ScoreAttemptId, Expr::value(entry_id.clone())),
                (sagas::Column::Rank, Expr::value(rank)),
            ],
        )
        .await?;
        if rows == 0 {
            let saga = load(&*tx, saga_id).await?;
            // The rank is a snapshot and may differ on a replay; the entry is
            // what identifies the step's data.
            let recorded = (saga.score, saga.score_attempt_id.clone());
            judge_unapplied(
                Step::AiDone,
                Step::RankingDone,
                token,
                &(score, entry_id),
                row_now(&saga, &recorded)?,
            )?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Keeps the saga in AI_PENDING for a later try: stores the new counters
    /// and `next_attempt_at`, forgets the job when the attempt was counted
    /// (the next attempt has a new key), and releases the lease so the AI
    /// slot is free meanwhile.
    pub async fn release_for_retry(
        &self,
        saga_id: &str,
        token: &str,
        state: AttemptState,
        next_attempt_at: EpochMs,
        attempt_counted: bool,
        now: EpochMs,
    ) -> StoreResult<()> {
        let mut sets = vec![
            (sagas::Column::Attempts, Expr::value(state.attempts as i32)),
            (
                sagas::Column::UnavailableStreak,
                Expr::value(state.unavailable_streak as i32),
            ),
            (sagas::Column::NextAttemptAtMs, Expr::value(next_attempt_at)),
            (
                sagas::Column::LockToken,
                Expr::value(Option::<String>::None),
            ),
            (
                sagas::Column::LockedUntilMs,
                Expr::value(Option::<i64>::None),
            ),
        ];
        if attempt_counted {
            sets.push((sagas::Column::AiJobId, Expr::value(Option::<String>::None)));
            sets.push((
                sagas::Column::AiSubmittedAtMs,
                Expr::value(Option::<i64>::None),
            ));
        }
        let tx = self.write_tx().await?;
        let rows = fenced_update(&tx, saga_id, Step::AiPending, token, now, None, sets).await?;
        if rows == 0 {
            return Err(TransitionError::LeaseLost.into());
        }
        tx.commit().await?;
        Ok(())
    }

    /// RANKING_DONE -> COMPLETED in one transaction with the result row, the
    /// session status and the terminal's outbox event. True when an outbox
    /// event was appended (false when the session has no terminal, or on an
    /// idempotent repeat).
    pub async fn complete(&self, saga_id: &str, token: &str, now: EpochMs) -> StoreResult<bool> {
        let tx = self.write_tx().await?;
        let rows = fenced_update(
            &tx,
            saga_id,
            Step::RankingDone,
            token,
            now,
            None,
            vec![(sagas::Column::Step, Expr::value(Step::Completed.as_str()))],
        )
        .await?;
        if rows == 0 {
            let saga = load(&*tx, saga_id).await?;
            judge_unapplied(
                Step::RankingDone,
                Step::Completed,
                token,
                &(),
                row_now(&saga, &())?,
            )?;
            return Ok(false);
        }
        let saga = load(&*tx, saga_id).await?;
        let session = load_session(&*tx, &saga.session_id).await?;
        let content: serde_json::Value = match &saga.content {
            Some(text) => {
                serde_json::from_str(text).map_err(|e| StoreError::Corrupt(e.to_string()))?
            }
            None => json!([]),
        };
        results::Entity::insert(results::ActiveModel {
            id: sea_orm::ActiveValue::Set(new_id()),
            saga_id: sea_orm::ActiveValue::Set(saga.id.clone()),
            session_id: sea_orm::ActiveValue::Set(saga.session_id.clone()),
            content: sea_orm::ActiveValue::Set(content.to_string()),
            score: sea_orm::ActiveValue::Set(saga.score.or(saga.ai_score)),
            rank: sea_orm::ActiveValue::Set(saga.rank),
            created_at_ms: sea_orm::ActiveValue::Set(now),
        })
        .exec(&*tx)
        .await?;
        set_session_status(
            &tx,
            &saga.session_id,
            SessionStatus::Completed,
            None,
            None,
            now,
        )
        .await?;
        let payload = json!({
            "type": "session.completed",
            "session_id": saga.session_id,
            "nickname": session.nickname,
            "result": {"content": content, "score": saga.score.or(saga.ai_score), "rank": saga.rank},
            "score": saga.score,
            "rank": saga.rank,
        });
        let appended = Self::announce(&tx, &session, &saga.id, payload, now).await?;
        tx.commit().await?;
        Ok(appended)
    }

    /// Any non-final step -> ABORTED in one transaction with the session
    /// status and the outbox event (true when one was appended). With
    /// `Fence::Unowned` (the cleanup actor) it only applies while nobody holds
    /// the lease.
    pub async fn abort(
        &self,
        saga_id: &str,
        fence: Fence<'_>,
        reason: AbortReason,
        detail: &str,
        now: EpochMs,
    ) -> StoreResult<bool> {
        let tx = self.write_tx().await?;
        let mut update = sagas::Entity::update_many()
            .col_expr(sagas::Column::Step, Expr::value(Step::Aborted.as_str()))
            .col_expr(sagas::Column::AbortReason, Expr::value(reason.as_str()))
            .col_expr(
                sagas::Column::AbortDetail,
                Expr::value(truncate(detail, 2_000)),
            )
            .col_expr(sagas::Column::UpdatedAtMs, Expr::value(now))
            .filter(sagas::Column::Id.eq(saga_id))
            .filter(sagas::Column::Step.is_in(Step::runnable().map(Step::as_str)));
        update = match fence {
            Fence::Token(token) => update.filter(sagas::Column::LockToken.eq(token)),
            Fence::Unowned => update.filter(
                sagas::Column::LockToken
                    .is_null()
                    .or(sagas::Column::LockedUntilMs.lt(now)),
            ),
        };
        if update.exec(&*tx).await?.rows_affected == 0 {
            let saga = load(&*tx, saga_id).await?;
            return match fence {
                Fence::Token(token) => {
                    let recorded = saga.abort_reason.clone();
                    judge_unapplied(
                        Step::AiPending, // any runnable step may abort; only legality is checked here
                        Step::Aborted,
                        token,
                        &Some(reason.as_str().to_owned()),
                        row_now(&saga, &recorded)?,
                    )?;
                    Ok(false)
                }
                Fence::Unowned => Err(TransitionError::LeaseLost.into()),
            };
        }
        let saga = load(&*tx, saga_id).await?;
        let session = load_session(&*tx, &saga.session_id).await?;
        set_session_status(
            &tx,
            &saga.session_id,
            SessionStatus::Aborted,
            Some(reason),
            None,
            now,
        )
        .await?;
        let appended = Self::announce(
            &tx,
            &session,
            &saga.id,
            aborted_payload(&session, reason),
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(appended)
    }

    /// Non-final sagas that nobody holds and that may be orphans: lease
    /// expired or never taken, and past the deadline or out of recoveries.
    /// The caller decides with `domain::policy::recovery`.
    pub async fn unowned_candidates(
        &self,
        now: EpochMs,
        rules: ClaimRules,
        limit: u64,
    ) -> StoreResult<Vec<sagas::Model>> {
        Ok(sagas::Entity::find()
            .filter(sagas::Column::Step.is_in(Step::runnable().map(Step::as_str)))
            .filter(
                sagas::Column::LockToken
                    .is_null()
                    .or(sagas::Column::LockedUntilMs.lt(now)),
            )
            .filter(
                sagas::Column::DeadlineAtMs
                    .lt(now)
                    .or(sagas::Column::Recoveries.gte(rules.max_recoveries as i32)),
            )
            .order_by_asc(sagas::Column::CreatedAtMs)
            .limit(limit)
            .all(self.db())
            .await?)
    }

    /// Counts of sagas per step (for stats and tests).
    pub async fn count_by_step(&self) -> StoreResult<Vec<(String, i64)>> {
        let rows = self
            .db()
            .query_all_raw(self.sql("SELECT step, COUNT(*) FROM sagas GROUP BY step", vec![]))
            .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get_by_index::<String>(0)?,
                    r.try_get_by_index::<i64>(1)?,
                ))
            })
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(Into::into)
    }
}

/// A ranking entry as the saga records it.
#[derive(Debug, Clone, PartialEq)]
pub struct RankedEntry {
    pub score_attempt_id: String,
    pub score: f64,
    pub rank: i32,
}

/// One conditional UPDATE fenced on id + expected step + lock token; renews
/// the lease when `lease_ms` is given. Returns the rows affected (0 or 1).
async fn fenced_update(
    tx: &WriteTx,
    saga_id: &str,
    expected: Step,
    token: &str,
    now: EpochMs,
    lease_ms: Option<i64>,
    sets: Vec<(sagas::Column, SimpleExpr)>,
) -> StoreResult<u64> {
    let mut update =
        sagas::Entity::update_many().col_expr(sagas::Column::UpdatedAtMs, Expr::value(now));
    if let Some(lease_ms) = lease_ms {
        update = update.col_expr(
            sagas::Column::LockedUntilMs,
            Expr::value(lease_until(now, lease_ms)),
        );
    }
    for (column, value) in sets {
        update = update.col_expr(column, value);
    }
    let result = update
        .filter(sagas::Column::Id.eq(saga_id))
        .filter(sagas::Column::Step.eq(expected.as_str()))
        .filter(sagas::Column::LockToken.eq(token))
        .exec(&**tx)
        .await?;
    Ok(result.rows_affected)
}

async fn load<C: ConnectionTrait>(conn: &C, saga_id: &str) -> StoreResult<sagas::Model> {
    sagas::Entity::find_by_id(saga_id.to_owned())
        .one(conn)
        .await?
        .ok_or(StoreError::NotFound("saga"))
}

async fn load_session<C: ConnectionTrait>(
    conn: &C,
    session_id: &str,
) -> StoreResult<sessions::Model> {
    sessions::Entity::find_by_id(session_id.to_owned())
        .one(conn)
        .await?
        .ok_or(StoreError::NotFound("session"))
}

pub(crate) fn step_of(saga: &sagas::Model) -> StoreResult<Step> {
    saga.step
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("saga {}: {e}", saga.id)))
}

fn row_now<'a, D: PartialEq>(saga: &'a sagas::Model, data: &'a D) -> StoreResult<RowNow<'a, D>> {
    Ok(RowNow {
        step: step_of(saga)?,
        lock_token: saga.lock_token.as_deref(),
        data,
    })
}

fn truncate(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}
