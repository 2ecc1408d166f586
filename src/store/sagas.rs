//! Saga rows: the claim, the lease and its hand-over, and the stats'
//! reads. The cleanup actor's read is in [`super::cleanup`]. The fenced transitions and the final transactions are in
//! [`super::transitions`].

use std::collections::HashMap;

use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, FromQueryResult, QueryFilter};

use super::entities::sagas;
use super::{new_id, Store, StoreError, StoreResult, WriteTx};
use crate::domain::breaker::Breaker;
use crate::domain::policy::{lease_until, EpochMs};
use crate::domain::review::ReviewMode;
use crate::domain::saga::{Step, TransitionError};
use crate::domain::sharing::{next_grant, Claimant};

/// Settings the claim needs, from configuration.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRules {
    pub lease_ms: i64,
    pub max_recoveries: u32,
}

/// `slots` of a claim that keeps each saga's own slots (a resumed
/// AI_PENDING saga takes back the slots its jobs may still run in).
const KEEP_SLOTS: i32 = -1;

/// AI slots of an experience's AI_PENDING sagas, as [`Store::in_flight`]
/// counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlight {
    /// Of sagas whose worker holds the lease.
    pub held: i64,
    /// Of sagas whose lease ran out (the worker died, or its instance
    /// handed them over) before their deadline: their jobs may still run.
    pub expired: i64,
    /// Jobs that may still run after their saga ended without them
    /// (`lingering_jobs`): one slot each until the provider says they are
    /// final.
    pub lingering: i64,
}

impl ClaimableExperience {
    /// `Some((ai_calls, min_success))` when the experience fans out
    /// (`ai_calls` > 1); `min_success` defaults to all calls.
    pub fn fan_out(&self) -> Option<(i32, i32)> {
        fan_out_of(self.ai_calls, self.min_success)
    }
}

/// `Some((ai_calls, min_success))` for an experience that fans out
/// (`ai_calls` > 1); `min_success` defaults to all calls.
pub fn fan_out_of(ai_calls: i32, min_success: Option<i32>) -> Option<(i32, i32)> {
    (ai_calls > 1).then(|| (ai_calls, min_success.unwrap_or(ai_calls).clamp(1, ai_calls)))
}

impl InFlight {
    pub fn total(&self) -> i64 {
        self.held + self.expired + self.lingering
    }
}

/// An experience with work to claim, and what the claim and the sagas
/// need to know of it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClaimableExperience {
    pub id: String,
    /// Its own ceiling of AI jobs in flight.
    pub max_in_flight: i32,
    /// The provider (account) its jobs run on.
    pub provider: String,
    /// Its share of the provider's slots (1 to 100).
    pub weight: i32,
    /// The provider's cap across every experience and instance (None: no
    /// shared cap).
    pub provider_max_in_flight: Option<i32>,
    pub kind: String,
    /// AI calls per submission (> 1: fan-out).
    pub ai_calls: i32,
    /// Calls that must succeed (None: all).
    pub min_success: Option<i32>,
    /// Sagas past the AI step wait to be resumed (unowned, or their
    /// lease ran out).
    pub has_resumed: bool,
    /// AI_PENDING sagas whose lease ran out wait to be resumed.
    pub has_expired_ai: bool,
    /// AI_PENDING sagas nobody holds wait for an AI slot.
    pub has_queued_ai: bool,
    /// Whether its results wait in the operators' review.
    pub review: ReviewMode,
    /// Its provider's circuit breaker, read with the list (closed when
    /// the provider has no row), so a claim round needs no read of its own.
    pub breaker: Breaker,
}

/// Who may end a saga: its lease holder, or (for the cleanup actor) nobody,
/// meaning the saga must be unowned at that moment, or an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    Token(String),
    Unowned,
    /// An operator: whoever holds the lease (the holder's next fenced write
    /// then finds the saga ended, and stops quietly).
    Operator,
    /// An operator's (or the review timeout's) reject: only a saga in
    /// IN_REVIEW with no decision taken.
    Review,
}

/// The SQL condition "a worker may claim this saga now", the mirror of
/// `domain::policy::recovery` returning `Claim`, with `now` and
/// `max_recoveries` bound at placeholders `$now` and `$max`. It re-checks
/// rows already picked by id, so its step term is written `step || ''`:
/// otherwise SQLite walks `idx_sagas_step_updated` through every runnable
/// saga instead of looking the picked ids up by key (10x slower at 100k
/// queued than at 1k, measured by `stagehand bench`'s claim cost).
fn claimable(now: usize, max: usize) -> String {
    format!(
        "step || '' IN ('AI_PENDING', 'AI_DONE', 'RANKING_DONE') \
         AND next_attempt_at_ms <= ${now} AND deadline_at_ms >= ${now} \
         AND (lock_token IS NULL OR (locked_until_ms < ${now} \
         AND (recoveries < ${max} OR handed_over)))"
    )
}

/// The SET term that marks a saga's stored trace context `link:` when
/// `condition` holds (a claim that resumes a lease that ran out or was
/// handed over, an operator's retry): its next run starts a new trace
/// linked to the earlier one (see `crate::telemetry`). A context already
/// marked, or none, is kept.
pub(super) fn link_trace(condition: &str) -> String {
    format!(
        "trace_context = CASE WHEN {condition} AND trace_context NOT LIKE '{link}%' \
         THEN '{link}' || trace_context ELSE trace_context END",
        link = crate::telemetry::LINK
    )
}

/// The predicate of the claim's partial indexes. Queries spell it out as
/// it is: SQLite uses a partial index only for a query whose WHERE clause
/// contains the index's terms.
pub(super) const RUNNABLE: &str = "step IN ('AI_PENDING', 'AI_DONE', 'RANKING_DONE')";

/// Where a claim looks for sagas of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimSource {
    /// Nobody holds them (queued, or released): oldest first, along
    /// `idx_sagas_unowned`, never passing a saga someone holds.
    Unowned,
    /// Their lease ran out (their worker died, or its instance shut down
    /// and handed them over): to resume, earliest expiry first, at the
    /// start of `idx_sagas_leased`.
    Expired,
}

impl ClaimSource {
    /// This source's part of [`claimable`], and its order. The step is
    /// spelled in the SQL, not bound, so PostgreSQL proves that the partial
    /// index applies even in a generic plan.
    fn condition(self, step: Step, now: usize, max: usize) -> (String, &'static str) {
        let step = step.as_str();
        match self {
            ClaimSource::Unowned => (
                format!(
                    "lock_token IS NULL AND {RUNNABLE} AND step = '{step}' \
                     AND next_attempt_at_ms <= ${now} AND deadline_at_ms >= ${now}"
                ),
                "created_at_ms, id",
            ),
            ClaimSource::Expired => (
                format!(
                    "lock_token IS NOT NULL AND {RUNNABLE} AND step = '{step}' \
                     AND locked_until_ms < ${now} \
                     AND (recoveries < ${max} OR handed_over) \
                     AND next_attempt_at_ms <= ${now} AND deadline_at_ms >= ${now}"
                ),
                "locked_until_ms, id",
            ),
        }
    }
}

impl Store {
    pub async fn saga(&self, id: &str) -> StoreResult<Option<sagas::Model>> {
        Ok(sagas::Entity::find_by_id(id.to_owned())
            .one(self.db())
            .await?)
    }

    /// Experiences that have a saga a worker could claim now, oldest
    /// experience first, with where their claimable sagas are. Each probe
    /// is an index walk of one experience that stops at the first
    /// claimable saga, and none passes a saga someone holds.
    pub async fn experiences_with_claimable(
        &self,
        now: EpochMs,
        rules: ClaimRules,
    ) -> StoreResult<Vec<ClaimableExperience>> {
        let stmt = self.claimable_experiences_statement("", now, rules);
        let rows = self.db().query_all_raw(stmt).await?;
        rows.iter()
            .map(|r| {
                Ok(ClaimableExperience {
                    id: r.try_get_by_index(0)?,
                    max_in_flight: r.try_get_by_index(1)?,
                    kind: r.try_get_by_index(2)?,
                    ai_calls: r.try_get_by_index(4)?,
                    min_success: r.try_get_by_index(5)?,
                    has_resumed: r.try_get_by_index(6)?,
                    has_expired_ai: r.try_get_by_index(7)?,
                    has_queued_ai: r.try_get_by_index(8)?,
                    provider: r.try_get_by_index(9)?,
                    weight: r.try_get_by_index(10)?,
                    provider_max_in_flight: r.try_get_by_index(11)?,
                    review: r
                        .try_get_by_index::<String>(12)?
                        .parse()
                        .unwrap_or_default(),
                    breaker: Breaker {
                        open_until_ms: r.try_get_by_index(13)?,
                        probe_until_ms: r.try_get_by_index(14)?,
                    },
                })
            })
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(Into::into)
    }

    /// The statement of [`Self::experiences_with_claimable`], after
    /// `prefix` (empty, or an `EXPLAIN`).
    fn claimable_experiences_statement(
        &self,
        prefix: &str,
        now: EpochMs,
        rules: ClaimRules,
    ) -> sea_orm::Statement {
        // A probe is a scalar subquery with LIMIT 1, not an EXISTS:
        // PostgreSQL may run an EXISTS as a hashed subplan, which reads
        // every saga of the step (all experiences, the whole queue) to
        // build its hash, and it picks that whenever its statistics
        // under-count the sagas, as they do while a rush outruns
        // autovacuum. A scalar subquery is always run per experience. The
        // flags are computed once, in a materialised CTE, so the filter
        // does not run the probes a second time.
        let probe = |steps: &[Step], source: ClaimSource| {
            let probes: Vec<String> = steps
                .iter()
                .map(|&step| {
                    format!(
                        "(SELECT 1 FROM sagas WHERE experience_id = e.id AND {} LIMIT 1) IS NOT NULL",
                        source.condition(step, 1, 2).0
                    )
                })
                .collect();
            format!("({})", probes.join(" OR "))
        };
        let resumed = [Step::RankingDone, Step::AiDone];
        self.sql(
            &format!(
                "{prefix} WITH x AS MATERIALIZED (SELECT e.id, e.max_in_flight, e.kind, \
                 e.created_at_ms, e.ai_calls, e.min_success, \
                 ({} OR {}) AS resumed, {} AS expired_ai, {} AS queued_ai, \
                 e.provider, e.weight, p.max_in_flight AS provider_max, e.review, \
                 b.open_until_ms AS breaker_open_until_ms, \
                 b.probe_until_ms AS breaker_probe_until_ms \
                 FROM experiences e LEFT JOIN providers p ON p.name = e.provider \
                 LEFT JOIN provider_breakers b ON b.provider = e.provider) \
                 SELECT * FROM x WHERE resumed OR expired_ai OR queued_ai \
                 ORDER BY created_at_ms, id",
                probe(&resumed, ClaimSource::Unowned),
                probe(&resumed, ClaimSource::Expired),
                probe(&[Step::AiPending], ClaimSource::Expired),
                probe(&[Step::AiPending], ClaimSource::Unowned),
            ),
            vec![now.into(), (rules.max_recoveries as i32).into()],
        )
    }

    /// How the database runs [`Self::experiences_with_claimable`]; on
    /// PostgreSQL it runs (`EXPLAIN ANALYZE`, it only reads), so each plan
    /// node says the rows it read. For tests and diagnostics: a probe must
    /// stop at the first claimable saga of its experience, whatever the
    /// queue length and the planner's statistics.
    pub async fn claimable_experiences_plan(
        &self,
        now: EpochMs,
        rules: ClaimRules,
    ) -> StoreResult<String> {
        self.plan_of(true, |prefix| {
            self.claimable_experiences_statement(prefix, now, rules)
        })
        .await
    }

    /// AI jobs in flight for an experience: the slots of the sagas in
    /// AI_PENDING whose lease is held (1 for a single-call saga; a fan-out
    /// saga holds one per call it may run at once, see [`Self::claim_runnable`]).
    /// The lease is the AI slot, and it covers every job the provider
    /// may still be running (rule 10): a worker whose poll failed, whose
    /// submit had an unclear outcome, or whose attempt timed out keeps its
    /// lease and goes on with the same job (see the supervisor's AI step,
    /// `ai_step.rs`); it releases the lease only while no job of the saga
    /// may be running. When a worker dies (or its instance shuts down
    /// and hands the saga over), its lease runs out but its jobs may still
    /// run at the provider: such a saga keeps its slots ([`InFlight::expired`])
    /// until the next claim resumes it in them, so neither a queued saga
    /// nor a fan-out saga growing its slots takes them meanwhile. Only past
    /// its deadline does it stop counting (the cleanup actor ends it, and
    /// its jobs then linger). A job that outlived its saga counts one slot
    /// ([`InFlight::lingering`]) until the provider says it is final.
    pub async fn in_flight<C: ConnectionTrait>(
        conn: &C,
        experience_id: &str,
        now: EpochMs,
    ) -> StoreResult<InFlight> {
        let stmt = super::sql_for(
            conn.get_database_backend(),
            &format!(
                "SELECT COALESCE(SUM(CASE WHEN locked_until_ms >= $2 THEN slots ELSE 0 END), 0), \
                 COALESCE(SUM(CASE WHEN locked_until_ms < $2 AND deadline_at_ms >= $2 \
                 THEN slots ELSE 0 END), 0), \
                 (SELECT COUNT(*) FROM lingering_jobs l WHERE l.experience_id = $1 \
                 AND l.until_ms >= $2) \
                 FROM sagas WHERE experience_id = $1 AND lock_token IS NOT NULL \
                 AND {RUNNABLE} AND step = 'AI_PENDING'"
            ),
            vec![experience_id.into(), now.into()],
        );
        let row = conn.query_one_raw(stmt).await?;
        Ok(match row {
            Some(r) => InFlight {
                held: r.try_get_by_index::<i64>(0)?,
                expired: r.try_get_by_index::<i64>(1)?,
                lingering: r.try_get_by_index::<i64>(2)?,
            },
            None => InFlight::default(),
        })
    }

    /// [`Self::in_flight`] of every experience on `provider`, by
    /// experience id (experiences with nothing in flight are absent).
    pub async fn provider_in_flight<C: ConnectionTrait>(
        conn: &C,
        provider: &str,
        now: EpochMs,
    ) -> StoreResult<HashMap<String, InFlight>> {
        let backend = conn.get_database_backend();
        let sagas = conn
            .query_all_raw(super::sql_for(
                backend,
                &format!(
                    "SELECT s.experience_id, \
                     COALESCE(SUM(CASE WHEN s.locked_until_ms >= $2 THEN s.slots ELSE 0 END), 0), \
                     COALESCE(SUM(CASE WHEN s.locked_until_ms < $2 AND s.deadline_at_ms >= $2 \
                     THEN s.slots ELSE 0 END), 0) \
                     FROM sagas s WHERE s.experience_id IN \
                     (SELECT e.id FROM experiences e WHERE e.provider = $1) \
                     AND s.lock_token IS NOT NULL AND {RUNNABLE} AND s.step = 'AI_PENDING' \
                     GROUP BY s.experience_id"
                ),
                vec![provider.into(), now.into()],
            ))
            .await?;
        let mut by_experience: HashMap<String, InFlight> = HashMap::new();
        for row in sagas {
            let entry = by_experience
                .entry(row.try_get_by_index::<String>(0)?)
                .or_default();
            entry.held = row.try_get_by_index::<i64>(1)?;
            entry.expired = row.try_get_by_index::<i64>(2)?;
        }
        let lingering = conn
            .query_all_raw(super::sql_for(
                backend,
                "SELECT experience_id, COUNT(*) FROM lingering_jobs \
                 WHERE provider = $1 AND until_ms >= $2 GROUP BY experience_id",
                vec![provider.into(), now.into()],
            ))
            .await?;
        for row in lingering {
            by_experience
                .entry(row.try_get_by_index::<String>(0)?)
                .or_default()
                .lingering = row.try_get_by_index::<i64>(1)?;
        }
        Ok(by_experience)
    }

    /// Claims for one experience alone (see [`Self::claim_for_provider`]).
    pub async fn claim_runnable(
        &self,
        experience: &ClaimableExperience,
        limit: usize,
        now: EpochMs,
        rules: ClaimRules,
    ) -> StoreResult<Vec<sagas::Model>> {
        let claimed = self
            .claim_for_provider(std::slice::from_ref(experience), limit, now, rules)
            .await?;
        Ok(claimed.into_iter().map(|(saga, _)| saga).collect())
    }

    /// Claims, for the experiences of one provider (all on
    /// `experiences[0].provider`), at most `limit` claimable sagas, each
    /// with the index of its experience: first those past the AI step (they
    /// need no AI slot, so a long AI queue never starves them), then
    /// AI_PENDING ones whose lease ran out (they resume in the slots they
    /// still hold), then queued ones, one saga at a time to the experience
    /// that [`next_grant`] picks: slots shared by weight among the
    /// experiences with work, never above the provider's cap (counting
    /// every experience on it, and jobs that linger after their saga) nor
    /// an experience's own ceiling. The claimed sagas share one fresh lock
    /// token and get a lease; one resumed after a lost lease counts a
    /// recovery. On PostgreSQL the count and the claim run under a
    /// transaction-scoped advisory lock per provider, so the caps are exact
    /// across instances, and rows locked by someone else are skipped, never
    /// waited for. A source an experience has nothing in (see
    /// [`ClaimableExperience`]) costs no statement.
    pub async fn claim_for_provider(
        &self,
        experiences: &[ClaimableExperience],
        limit: usize,
        now: EpochMs,
        rules: ClaimRules,
    ) -> StoreResult<Vec<(sagas::Model, usize)>> {
        let Some(first) = experiences.first() else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let tx = self.write_tx().await?;
        if self.is_postgres() {
            lock_provider(self, &tx, &first.provider).await?;
        }
        let token = new_id();
        let mut claimed: Vec<(sagas::Model, usize)> = Vec::new();
        let claim = |experience: &ClaimableExperience, step, source, n, slots: i32| {
            let stmt = self.claim_statement(
                "",
                &experience.id,
                step,
                source,
                n,
                slots,
                &token,
                now,
                rules,
            );
            let tx = &tx;
            async move { self.claim_with(tx, stmt, n).await }
        };
        for (i, experience) in experiences.iter().enumerate() {
            if !experience.has_resumed {
                continue;
            }
            for step in [Step::RankingDone, Step::AiDone] {
                for source in [ClaimSource::Expired, ClaimSource::Unowned] {
                    let room = limit - claimed.len();
                    let got = claim(experience, step, source, room, 1).await?;
                    claimed.extend(got.into_iter().map(|s| (s, i)));
                }
            }
        }
        let wants_ai = |e: &ClaimableExperience| e.has_expired_ai || e.has_queued_ai;
        if claimed.len() < limit && experiences.iter().any(wants_ai) {
            // Slots in use on the provider, by experience, inside this
            // transaction (every experience on it, not only these).
            let in_flight = if experiences.len() == 1 && first.provider_max_in_flight.is_none() {
                let mut one = HashMap::new();
                one.insert(
                    first.id.clone(),
                    Self::in_flight(&*tx, &first.id, now).await?,
                );
                one
            } else {
                Self::provider_in_flight(&*tx, &first.provider, now).await?
            };
            let of = |id: &str| in_flight.get(id).copied().unwrap_or_default();
            // Sagas whose AI lease ran out resume in the slots they still
            // hold (counted above), whatever the probe before this
            // transaction saw: a lease that ran out, or was handed over,
            // since then is found here too (and when none is counted, the
            // statement is not sent).
            for (i, experience) in experiences.iter().enumerate() {
                if wants_ai(experience) && of(&experience.id).expired > 0 && claimed.len() < limit {
                    let room = limit - claimed.len();
                    let got = claim(
                        experience,
                        Step::AiPending,
                        ClaimSource::Expired,
                        room,
                        KEEP_SLOTS,
                    )
                    .await?;
                    claimed.extend(got.into_iter().map(|s| (s, i)));
                }
            }
            let mut free = first
                .provider_max_in_flight
                .map(|cap| i64::from(cap) - in_flight.values().map(InFlight::total).sum::<i64>());
            let mut claimants: Vec<Claimant> = experiences
                .iter()
                .map(|e| Claimant {
                    weight: i64::from(e.weight.max(1)),
                    used: of(&e.id).total(),
                    ceiling: i64::from(e.max_in_flight),
                    per_saga: i64::from(e.ai_calls.max(1)),
                    has_work: e.has_queued_ai,
                })
                .collect();
            // Plan the grants, claim them, and plan again with what an
            // experience that ran out of queued sagas left over.
            loop {
                let mut plan: Vec<Vec<i32>> = vec![Vec::new(); experiences.len()];
                let mut planned = 0;
                while claimed.len() + planned < limit {
                    let Some((i, slots)) = next_grant(&claimants, free) else {
                        break;
                    };
                    claimants[i].used += slots;
                    free = free.map(|f| f - slots);
                    plan[i].push(slots as i32);
                    planned += 1;
                }
                if planned == 0 {
                    break;
                }
                let mut short = false;
                for (i, grants) in plan.into_iter().enumerate() {
                    if grants.is_empty() {
                        continue;
                    }
                    let experience = &experiences[i];
                    let mut missing: Vec<i32> = Vec::new();
                    if experience.ai_calls <= 1 {
                        let got = claim(
                            experience,
                            Step::AiPending,
                            ClaimSource::Unowned,
                            grants.len(),
                            1,
                        )
                        .await?;
                        missing.extend(grants.iter().skip(got.len()));
                        claimed.extend(got.into_iter().map(|s| (s, i)));
                    } else {
                        // Fan-out: one saga per grant, each taking the
                        // slots granted (a single saga may use them all);
                        // its worker gives back those it no longer needs.
                        for (g, &slots) in grants.iter().enumerate() {
                            let got =
                                claim(experience, Step::AiPending, ClaimSource::Unowned, 1, slots)
                                    .await?;
                            if got.is_empty() {
                                missing.extend(&grants[g..]);
                                break;
                            }
                            claimed.extend(got.into_iter().map(|s| (s, i)));
                        }
                    }
                    if !missing.is_empty() {
                        let back: i64 = missing.iter().map(|&s| i64::from(s)).sum();
                        claimants[i].used -= back;
                        claimants[i].has_work = false;
                        free = free.map(|f| f + back);
                        short = true;
                    }
                }
                if !short {
                    break;
                }
            }
        }
        tx.commit().await?;
        Ok(claimed)
    }

    /// Runs one claim statement (nothing when `n` is 0).
    async fn claim_with(
        &self,
        tx: &WriteTx,
        stmt: sea_orm::Statement,
        n: usize,
    ) -> StoreResult<Vec<sagas::Model>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let rows = tx.query_all_raw(stmt).await?;
        let mut sagas = rows
            .iter()
            .map(|row| sagas::Model::from_query_result(row, ""))
            .collect::<Result<Vec<_>, _>>()?;
        sagas.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        Ok(sagas)
    }

    /// The claim statement of `step` from `source`, after `prefix` (empty,
    /// or `EXPLAIN`): the first `n` of the source get `token` and a lease.
    #[allow(clippy::too_many_arguments)]
    fn claim_statement(
        &self,
        prefix: &str,
        experience_id: &str,
        step: Step,
        source: ClaimSource,
        n: usize,
        slots: i32,
        token: &str,
        now: EpochMs,
        rules: ClaimRules,
    ) -> sea_orm::Statement {
        let lock = if self.is_postgres() {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        // SQLite: the plan is pinned to the source's partial index, so
        // statistics (an `ANALYZE`) can never turn the walk of a long queue
        // into a scan of every saga.
        let indexed = match (self.is_postgres(), source) {
            (true, _) => "",
            (false, ClaimSource::Unowned) => " INDEXED BY idx_sagas_unowned",
            (false, ClaimSource::Expired) => " INDEXED BY idx_sagas_leased",
        };
        let (condition, order) = source.condition(step, 2, 3);
        self.sql(
            &format!(
                // The picked ids are materialised first: a LIMIT subquery
                // with SKIP LOCKED inside `IN (...)` may be run again by the
                // planner and pick more rows than the limit.
                "{prefix} WITH picked AS MATERIALIZED (SELECT id FROM sagas{indexed} \
                 WHERE experience_id = $1 AND {condition} \
                 ORDER BY {order} LIMIT $6{lock}) \
                 UPDATE sagas SET lock_token = $4, locked_until_ms = $5, updated_at_ms = $2, \
                 slots = CASE WHEN $7 < 0 THEN slots ELSE $7 END, \
                 recoveries = recoveries + \
                 (CASE WHEN lock_token IS NULL OR handed_over THEN 0 ELSE 1 END), \
                 handed_over = false, {link_trace} \
                 WHERE id IN (SELECT id FROM picked) AND {claimable} RETURNING *",
                claimable = claimable(2, 3),
                link_trace = link_trace("lock_token IS NOT NULL"),
            ),
            vec![
                experience_id.into(),
                now.into(),
                (rules.max_recoveries as i32).into(),
                token.into(),
                lease_until(now, rules.lease_ms).into(),
                (n as i64).into(),
                slots.into(),
            ],
        )
    }

    /// How the database would run the claim of `step` from `source` for
    /// an experience (PostgreSQL `EXPLAIN`, SQLite `EXPLAIN QUERY PLAN`),
    /// one line per plan node. Nothing is claimed. For tests and
    /// diagnostics: the claim must walk its partial index whatever the
    /// queue length.
    pub async fn claim_plan(
        &self,
        experience_id: &str,
        step: Step,
        source: ClaimSource,
        now: EpochMs,
        rules: ClaimRules,
    ) -> StoreResult<String> {
        self.plan_of(false, |prefix| {
            self.claim_statement(
                prefix,
                experience_id,
                step,
                source,
                10,
                1,
                "plan",
                now,
                rules,
            )
        })
        .await
    }

    /// Hands over sagas this instance holds (`(saga id, lock token)`) as
    /// it shuts down: each lease is cut short now and marked
    /// `handed_over`, so the next claim, on any instance, resumes it at
    /// once and counts no recovery. An AI_PENDING saga keeps its job and
    /// its place before queued sagas (it is claimed as an expired lease),
    /// so the in-flight cap holds. The lock token changes too: a step of
    /// ours still finishing after this is refused (`LeaseLost`). Sagas no
    /// longer ours, or whose lease already ran out (they were lost, not
    /// handed over: the cleanup actor may be ending them), are skipped. Returns how many were handed over; other
    /// instances are woken after the commit.
    pub async fn hand_over(&self, held: &[(String, String)], now: EpochMs) -> StoreResult<u64> {
        if held.is_empty() {
            return Ok(0);
        }
        let tx = self.write_tx().await?;
        let mut handed = 0;
        for (saga_id, token) in held {
            let stmt = self.sql(
                &format!(
                    "UPDATE sagas SET lock_token = $1, locked_until_ms = $2, \
                     handed_over = true, updated_at_ms = $3 \
                     WHERE id = $4 AND lock_token = $5 AND locked_until_ms >= $3 AND {RUNNABLE}"
                ),
                vec![
                    new_id().into(),
                    (now - 1).into(),
                    now.into(),
                    saga_id.clone().into(),
                    token.clone().into(),
                ],
            );
            handed += tx.execute_raw(stmt).await?.rows_affected();
        }
        tx.commit().await?;
        if handed > 0 && self.is_postgres() {
            self.notify(super::notify::DISPATCH_CHANNEL, "handover")
                .await?;
        }
        Ok(handed)
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

    /// Stores where the saga's next runs join the traces (the context of
    /// a run that started a new trace), fenced on the lease.
    pub async fn set_trace_context(
        &self,
        saga_id: &str,
        token: &str,
        trace_context: &str,
    ) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        tx.execute_raw(self.sql(
            "UPDATE sagas SET trace_context = $1 WHERE id = $2 AND lock_token = $3",
            vec![trace_context.into(), saga_id.into(), token.into()],
        ))
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// `n` copies of `template` in `step` (prompt `bulk`, no lease),
    /// created after it: the `offset`-th onwards, so the oldest queued stay
    /// the oldest. One statement. For benchmarks and tests that need long
    /// queues (`stagehand bench`'s claim cost, `tests/store.rs`).
    pub async fn insert_bulk_sagas(
        &self,
        template: &sagas::Model,
        offset: i64,
        n: i64,
        step: &str,
        now: EpochMs,
    ) -> StoreResult<()> {
        if n <= 0 {
            return Ok(());
        }
        let (series, id) = if self.is_postgres() {
            (
                "SELECT g AS i FROM generate_series(1, $1) AS g",
                "md5(random()::text || i::text)",
            )
        } else {
            (
                "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < $1) \
                 SELECT i FROM s",
                "lower(hex(randomblob(16)))",
            )
        };
        self.db()
            .execute_raw(self.sql(
                &format!(
                    "INSERT INTO sagas (id, session_id, experience_id, step, prompt, attempts, \
                     recoveries, unavailable_streak, next_attempt_at_ms, ai_base_key, \
                     deadline_at_ms, created_at_ms, updated_at_ms) \
                     SELECT {id}, $2, $3, $4, 'bulk', 0, 0, 0, $5, $6, $7, $5 + $8 + i, $5 \
                     FROM ({series}) AS series"
                ),
                vec![
                    n.into(),
                    template.session_id.clone().into(),
                    template.experience_id.clone().into(),
                    step.into(),
                    now.into(),
                    template.ai_base_key.clone().into(),
                    (now + 900_000).into(),
                    offset.into(),
                ],
            ))
            .await?;
        Ok(())
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

/// Takes the transaction-scoped advisory lock of `provider` (PostgreSQL):
/// everything that counts its slots and takes some (the claim, a fan-out
/// saga growing) runs under it, so its cap is exact across instances.
pub(super) async fn lock_provider(store: &Store, tx: &WriteTx, provider: &str) -> StoreResult<()> {
    tx.execute_raw(store.sql(
        "SELECT pg_advisory_xact_lock(hashtext($1))",
        vec![format!("provider:{provider}").into()],
    ))
    .await?;
    Ok(())
}

pub(crate) fn step_of(saga: &sagas::Model) -> StoreResult<Step> {
    saga.step
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("saga {}: {e}", saga.id)))
}
