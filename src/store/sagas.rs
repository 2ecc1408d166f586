//! Saga rows: the claim, the lease and its hand-over, and the stats'
//! reads. The cleanup actor's read is in [`super::cleanup`]. The fenced transitions and the final transactions are in
//! [`super::transitions`].

use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, FromQueryResult, QueryFilter};

use super::entities::sagas;
use super::ledger;
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

/// A saga just claimed, with the index of its experience in the claim's
/// list and the AI slots its worker holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    pub saga: sagas::Model,
    pub experience: usize,
    pub holds: Holds,
}

/// The slots of the ledger a claimed saga's worker holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holds {
    /// Slots the claim reserved for these calls now: no submit was sent
    /// under them yet. Empty for a saga past the AI step.
    Fresh(Vec<i32>),
    /// A resumed AI_PENDING saga: its worker reads the slots it holds (a
    /// job may run in them) from the ledger.
    Read,
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
    /// Its brand's version (0: it never had one), read with the list so
    /// a keep knows without a read whether the brand it holds is current.
    pub brand_version: i64,
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

/// The prefix of a stored trace context whose next run starts a new trace
/// linked to it (see migration 17; `crate::telemetry` reads it).
pub const TRACE_LINK: &str = "link:";

/// The SET term that marks a saga's stored trace context `link:` when
/// `condition` holds (a claim that resumes a lease that ran out or was
/// handed over, an operator's retry): its next run starts a new trace
/// linked to the earlier one (see `crate::telemetry`). A context already
/// marked, or none, is kept.
pub(super) fn link_trace(condition: &str) -> String {
    format!(
        "trace_context = CASE WHEN {condition} AND trace_context NOT LIKE '{link}%' \
         THEN '{link}' || trace_context ELSE trace_context END",
        link = TRACE_LINK
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
    /// Nobody holds them, but they hold slots of the ledger (they gave
    /// up their lease while a job of theirs may run): to resume in those
    /// slots, along `idx_sagas_unowned`.
    Holding,
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
            ClaimSource::Holding => (
                format!(
                    "lock_token IS NULL AND {RUNNABLE} AND step = '{step}' \
                     AND next_attempt_at_ms <= ${now} AND deadline_at_ms >= ${now} \
                     AND {}",
                    ledger::holds_slots_sql("sagas.id")
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
                        paused_until_ms: r.try_get_by_index(15)?,
                    },
                    brand_version: r.try_get_by_index(16)?,
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
                 b.probe_until_ms AS breaker_probe_until_ms, \
                 b.paused_until_ms AS breaker_paused_until_ms, e.brand_version \
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
        Ok(claimed.into_iter().map(|c| c.saga).collect())
    }

    /// Claims, for the experiences of one provider (all on
    /// `experiences[0].provider`), at most `limit` claimable sagas: first
    /// those past the AI step (they need no AI slot, so a long AI queue
    /// never starves them), then AI_PENDING ones that hold slots of the
    /// ledger or whose lease ran out (they resume in the slots they hold),
    /// then queued ones, one saga at a time to the experience that
    /// [`next_grant`] picks: slots shared by weight among the experiences
    /// with work, never above the provider's cap (counting every experience
    /// on it, and every row of the ledger: jobs of ended sagas too) nor an
    /// experience's own ceiling. A queued saga's slots are written to the
    /// ledger here, before its worker sends anything
    /// ([`ledger::reserve_first_calls`], [`ledger::reserve_calls`]). The
    /// claimed sagas share one fresh lock token and get a lease; one
    /// resumed after a lost lease counts a recovery. On PostgreSQL the
    /// count and the claim run under a transaction-scoped advisory lock per
    /// provider, so the caps are exact across instances, and rows locked
    /// by someone else are skipped, never waited for. A source an
    /// experience has nothing in (see [`ClaimableExperience`]) costs no
    /// statement.
    pub async fn claim_for_provider(
        &self,
        experiences: &[ClaimableExperience],
        limit: usize,
        now: EpochMs,
        rules: ClaimRules,
    ) -> StoreResult<Vec<Claimed>> {
        let Some(first) = experiences.first() else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let tx = self.write_tx().await?;
        if self.is_postgres() {
            super::ledger::lock_provider(self, &tx, &first.provider).await?;
        }
        let mut round = ClaimRound {
            store: self,
            tx: &tx,
            token: new_id(),
            now,
            rules,
            limit,
            claimed: Vec::new(),
        };
        round.past_the_ai_step(experiences).await?;
        let wants_ai = |e: &ClaimableExperience| e.has_expired_ai || e.has_queued_ai;
        if round.room() > 0 && experiences.iter().any(wants_ai) {
            // Slots in use on the provider, by experience, inside this
            // transaction (every experience on it, not only these).
            let slots = ledger::slots_in_use(&*tx, Some(&first.provider), now).await?;
            round.resumed_in_their_slots(experiences, &slots).await?;
            round.granted(experiences, &slots).await?;
        }
        let claimed = round.claimed;
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
            (false, ClaimSource::Unowned | ClaimSource::Holding) => " INDEXED BY idx_sagas_unowned",
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
            self.claim_statement(prefix, experience_id, step, source, 10, "plan", now, rules)
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

    /// Extends the lease of a saga we hold; `LeaseLost` when we do not. A
    /// saga in review is held only once approved and adopted (a review
    /// holds no lease), and its adopter renews it like any other.
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
            .filter(
                sagas::Column::Step.is_in(
                    Step::runnable()
                        .into_iter()
                        .chain([Step::InReview])
                        .map(Step::as_str),
                ),
            );
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

/// One claim transaction of [`Store::claim_for_provider`], stage by stage.
struct ClaimRound<'a> {
    store: &'a Store,
    tx: &'a WriteTx,
    token: String,
    now: EpochMs,
    rules: ClaimRules,
    limit: usize,
    claimed: Vec<Claimed>,
}

impl ClaimRound<'_> {
    fn room(&self) -> usize {
        self.limit - self.claimed.len()
    }

    /// Claims up to `n` sagas of `experience` at `step` from `source`.
    async fn claim(
        &self,
        experience: &ClaimableExperience,
        step: Step,
        source: ClaimSource,
        n: usize,
    ) -> StoreResult<Vec<sagas::Model>> {
        let stmt = self.store.claim_statement(
            "",
            &experience.id,
            step,
            source,
            n,
            &self.token,
            self.now,
            self.rules,
        );
        self.store.claim_with(self.tx, stmt, n).await
    }

    /// Sagas past the AI step: they need no slot.
    async fn past_the_ai_step(&mut self, experiences: &[ClaimableExperience]) -> StoreResult<()> {
        for (i, experience) in experiences.iter().enumerate() {
            if !experience.has_resumed {
                continue;
            }
            for step in [Step::RankingDone, Step::AiDone] {
                for source in [ClaimSource::Expired, ClaimSource::Unowned] {
                    let got = self.claim(experience, step, source, self.room()).await?;
                    self.keep(got, i, Holds::Fresh(Vec::new()));
                }
            }
        }
        Ok(())
    }

    /// AI_PENDING sagas whose lease ran out (their worker died, or their
    /// instance handed them over), and those nobody holds that still hold
    /// slots of the ledger (a job of theirs may run): they resume in the
    /// slots they hold, whatever the free slots, and their workers read
    /// which from the ledger. A lease that ran out since the probe before
    /// this transaction is found here too (its rows count as awaiting).
    async fn resumed_in_their_slots(
        &mut self,
        experiences: &[ClaimableExperience],
        slots: &ledger::SlotCounts,
    ) -> StoreResult<()> {
        for (i, experience) in experiences.iter().enumerate() {
            let awaiting = slots.experience_awaiting_resume(&experience.id) > 0;
            let sources = [
                (experience.has_expired_ai || awaiting, ClaimSource::Expired),
                (awaiting, ClaimSource::Holding),
            ];
            for (_, source) in sources.into_iter().filter(|(wanted, _)| *wanted) {
                let got = self
                    .claim(experience, Step::AiPending, source, self.room())
                    .await?;
                self.keep(got, i, Holds::Read);
            }
        }
        Ok(())
    }

    /// Queued sagas, in the slots the provider's share grants them: plan
    /// the grants, claim them and write their slots, and plan again with
    /// what an experience that ran out of queued sagas left over.
    async fn granted(
        &mut self,
        experiences: &[ClaimableExperience],
        slots: &ledger::SlotCounts,
    ) -> StoreResult<()> {
        let first = &experiences[0];
        // An experience's ceiling counts its slots on every provider (jobs
        // still running where it was moved from); the provider's cap only
        // its own.
        let of = |e: &ClaimableExperience| slots.experience_total(&e.id);
        let mut free = first
            .provider_max_in_flight
            .map(|cap| i64::from(cap) - slots.provider_total(&first.provider));
        let mut claimants: Vec<Claimant> = experiences
            .iter()
            .map(|e| Claimant {
                weight: i64::from(e.weight.max(1)),
                used: of(e),
                ceiling: i64::from(e.max_in_flight),
                per_saga: i64::from(e.ai_calls.max(1)),
                has_work: e.has_queued_ai,
            })
            .collect();
        loop {
            let mut plan: Vec<Vec<i32>> = vec![Vec::new(); experiences.len()];
            let mut planned = 0;
            while self.claimed.len() + planned < self.limit {
                let Some((i, slots)) = next_grant(&claimants, free) else {
                    break;
                };
                claimants[i].used += slots;
                free = free.map(|f| f - slots);
                plan[i].push(slots as i32);
                planned += 1;
            }
            if planned == 0 {
                return Ok(());
            }
            let mut short = false;
            for (i, grants) in plan.into_iter().enumerate() {
                if grants.is_empty() {
                    continue;
                }
                let missing = self.claim_grants(&experiences[i], i, &grants).await?;
                if missing > 0 {
                    claimants[i].used -= missing;
                    claimants[i].has_work = false;
                    free = free.map(|f| f + missing);
                    short = true;
                }
            }
            if !short {
                return Ok(());
            }
        }
    }

    /// Claims one queued saga per grant of `experience` (a grant: the
    /// slots it may use) and writes their slots to the ledger. Returns the
    /// slots granted that found no saga to take them.
    async fn claim_grants(
        &mut self,
        experience: &ClaimableExperience,
        i: usize,
        grants: &[i32],
    ) -> StoreResult<i64> {
        let (provider, now) = (&experience.provider, self.now);
        if experience.ai_calls <= 1 {
            let got = self
                .claim(
                    experience,
                    Step::AiPending,
                    ClaimSource::Unowned,
                    grants.len(),
                )
                .await?;
            let missing = (grants.len() - got.len()) as i64;
            let ids: Vec<String> = got.iter().map(|s| s.id.clone()).collect();
            let fresh = ledger::reserve_first_calls(self.tx, provider, &ids, now).await?;
            for saga in got {
                // A saga that had its slot already (a job of it may run)
                // reads it; the others hold the slot written now.
                let holds = if fresh.contains(&saga.id) {
                    Holds::Fresh(vec![0])
                } else {
                    Holds::Read
                };
                self.claimed.push(Claimed {
                    saga,
                    experience: i,
                    holds,
                });
            }
            return Ok(missing);
        }
        // Fan-out: one saga per grant, each taking the slots granted for
        // its first calls that have no result (a single saga may use them
        // all); its worker gives back those it no longer needs.
        for (g, &slots) in grants.iter().enumerate() {
            let got = self
                .claim(experience, Step::AiPending, ClaimSource::Unowned, 1)
                .await?;
            let Some(saga) = got.into_iter().next() else {
                return Ok(grants[g..].iter().map(|&s| i64::from(s)).sum());
            };
            let calls = self
                .store
                .calls_to_reserve(self.tx, &saga, experience.ai_calls, slots, now)
                .await?;
            let fresh = ledger::reserve_calls(
                &**self.tx,
                provider,
                &experience.id,
                (&saga.id, &saga.ai_base_key),
                &calls,
                now,
            )
            .await?;
            let holds = if fresh.len() == calls.len() {
                Holds::Fresh(fresh)
            } else {
                Holds::Read
            };
            self.claimed.push(Claimed {
                saga,
                experience: i,
                holds,
            });
        }
        Ok(0)
    }

    fn keep(&mut self, sagas: Vec<sagas::Model>, experience: usize, holds: Holds) {
        self.claimed.extend(sagas.into_iter().map(|saga| Claimed {
            saga,
            experience,
            holds: holds.clone(),
        }));
    }
}

/// A ranking entry as the saga records it.
#[derive(Debug, Clone, PartialEq)]
pub struct RankedEntry {
    pub score_attempt_id: String,
    pub score: f64,
    pub rank: i32,
}

/// The saga row `saga_id`, read on `conn` (inside a write's transaction
/// or not).
pub(crate) async fn load<C: ConnectionTrait>(conn: &C, saga_id: &str) -> StoreResult<sagas::Model> {
    sagas::Entity::find_by_id(saga_id.to_owned())
        .one(conn)
        .await?
        .ok_or(StoreError::NotFound("saga"))
}

pub(crate) fn step_of(saga: &sagas::Model) -> StoreResult<Step> {
    saga.step
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("saga {}: {e}", saga.id)))
}
