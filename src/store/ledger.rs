//! The slot ledger (`ai_slots`): one row per AI call that may have a job at
//! a provider. It is the only place that says an AI slot is in use:
//! [`slots_in_use`] (and, inside statements that must count in place,
//! [`slots_sql`]) is how the claim, the 202's queue position and estimate,
//! the operators' views, the providers view and the metrics count them.
//!
//! - **Granted before the submit.** A row is written in the short
//!   transaction that grants its slot: the claim ([`reserve_first_calls`],
//!   [`reserve_calls`]) or a fan-out saga taking free slots
//!   ([`take_free_slots`]), before any submit is sent under it. Its
//!   `base_key` and `key_attempt` name the key a submit under it uses, so a
//!   row whose job id was never recorded is found again by re-sending that
//!   key.
//! - **Freed only on evidence** ([`Evidence`]): the provider reported the
//!   job final, a cancel was confirmed, or the submit surely created
//!   nothing. Every function here that deletes a row takes the evidence.
//!   Nothing else frees a slot: not the saga's end, a lease running out, a
//!   deadline or a crash.
//! - **Detached, then adopted.** A row whose call is over for its saga
//!   while its job may still run (the saga ended, or the call gave up on
//!   the job) is detached ([`detach_calls`]); so is, when an instance takes
//!   it ([`Store::adopt_slots`]), a row whose saga can no longer resume it
//!   (past its deadline, or out of recoveries). The taker finds the job (by
//!   its id, or by re-sending the same key) and polls or cancels it to its
//!   end; the row counts until then. A row of a saga that will resume
//!   (its lease ran out before its deadline, or it released its lease
//!   while its job may run) stays attached: the next worker of the saga
//!   takes it back ([`Store::slots_of_saga`]).

use std::collections::HashMap;

use sea_orm::{ConnectionTrait, DbBackend, Value};

use super::rows::{in_list, SqlType, ValueRows};
use super::{sql_for, Store, StoreResult, WriteTx};
use crate::domain::ledger::Evidence;
use crate::domain::policy::EpochMs;

/// Calls of a fan-out saga waiting for a slot (`(call index, key
/// attempt)`, in the order they should start), on the provider the
/// saga's worker submits to: its slots are taken there, whatever provider
/// the experience names now (an operator may have moved it meanwhile).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    pub provider: String,
    pub calls: Vec<(i32, i32)>,
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

/// The SQL that counts the rows of the ledger matching `condition` on
/// `ai_slots l` (a scalar subquery), for statements that must count slots
/// in place (the 202's admission read).
pub(crate) fn slots_sql(condition: &str) -> String {
    format!("(SELECT COUNT(*) FROM ai_slots l WHERE {condition})")
}

/// The SQL condition "the saga `saga_id` (a column) holds a slot" (an
/// attached row), for the claim of sagas that resume in their slots.
pub(crate) fn holds_slots_sql(saga_id: &str) -> String {
    format!("EXISTS (SELECT 1 FROM ai_slots l WHERE l.saga_id = {saga_id} AND NOT l.detached)")
}

/// The slots of one experience on one provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotUse {
    /// Rows: calls that may have a job at the provider, or are about to
    /// submit one.
    pub in_use: i64,
    /// Of those, rows of AI_PENDING sagas that nobody holds now (their lease
    /// ran out, or was given up while a job may run): the claim resumes
    /// those sagas in their slots.
    pub awaiting_resume: i64,
}

/// Slots in use, by provider and experience.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotCounts {
    by: HashMap<(String, String), SlotUse>,
}

impl SlotCounts {
    /// An experience's slots on `provider`.
    pub fn of(&self, provider: &str, experience_id: &str) -> SlotUse {
        self.by
            .get(&(provider.to_owned(), experience_id.to_owned()))
            .copied()
            .unwrap_or_default()
    }

    /// Every slot of `provider`.
    pub fn provider_total(&self, provider: &str) -> i64 {
        self.by
            .iter()
            .filter(|((p, _), _)| p == provider)
            .map(|(_, u)| u.in_use)
            .sum()
    }

    /// An experience's slots, on every provider, of AI_PENDING sagas that
    /// nobody holds now (see [`SlotUse::awaiting_resume`]).
    pub fn experience_awaiting_resume(&self, experience_id: &str) -> i64 {
        self.by
            .iter()
            .filter(|((_, e), _)| e == experience_id)
            .map(|(_, u)| u.awaiting_resume)
            .sum()
    }

    /// Every slot of an experience, whatever provider its jobs run on.
    pub fn experience_total(&self, experience_id: &str) -> i64 {
        self.by
            .iter()
            .filter(|((_, e), _)| e == experience_id)
            .map(|(_, u)| u.in_use)
            .sum()
    }
}

/// The slots in use now, of `provider` (or of every provider), and, with
/// a provider, those its experiences hold on other providers (jobs still
/// running where an operator moved an experience from: they count against
/// the experience's own ceiling, never against this provider's cap). The
/// one count of "in flight": read inside the claim's transaction, it is
/// exact.
pub async fn slots_in_use<C: ConnectionTrait>(
    conn: &C,
    provider: Option<&str>,
    now: EpochMs,
) -> StoreResult<SlotCounts> {
    let rows = conn
        .query_all_raw(slot_count_statement(
            conn.get_database_backend(),
            "",
            provider,
            now,
        ))
        .await?;
    let mut counts = SlotCounts::default();
    for r in rows {
        counts.by.insert(
            (r.try_get_by_index(0)?, r.try_get_by_index(1)?),
            SlotUse {
                in_use: r.try_get_by_index(2)?,
                awaiting_resume: r.try_get_by_index(3)?,
            },
        );
    }
    Ok(counts)
}

/// The statement of [`slots_in_use`], after `prefix` (`EXPLAIN`, or
/// nothing).
fn slot_count_statement(
    backend: DbBackend,
    prefix: &str,
    provider: Option<&str>,
    now: EpochMs,
) -> sea_orm::Statement {
    let mut values: Vec<Value> = vec![now.into()];
    let filter = match provider {
        Some(p) => {
            values.push(p.into());
            "WHERE l.provider = $2 \
             OR l.experience_id IN (SELECT id FROM experiences WHERE provider = $2)"
        }
        None => "",
    };
    sql_for(
        backend,
        &format!(
            "{prefix} SELECT l.provider, l.experience_id, COUNT(*), \
             COALESCE(SUM(CASE WHEN NOT l.detached AND s.step = 'AI_PENDING' \
             AND (s.lock_token IS NULL OR s.locked_until_ms < $1) THEN 1 ELSE 0 END), 0) \
             FROM ai_slots l {} {filter} \
             GROUP BY l.provider, l.experience_id",
            saga_of_each_slot(backend)
        ),
        values,
    )
}

impl Store {
    /// The database's plan for counting `provider`'s slots (the count
    /// every claim round makes), for tests and the bench to check it.
    pub async fn slot_count_plan(&self, provider: &str, now: EpochMs) -> StoreResult<String> {
        let backend = self.backend();
        self.plan_of(false, |prefix| {
            slot_count_statement(backend, prefix, Some(provider), now)
        })
        .await
    }
}

/// The saga of each slot row `l`, as `s` (none: its columns are NULL),
/// found by its key one row at a time; every statement that reads slots
/// with their sagas joins this way, so it costs what the slots cost,
/// whatever the number of sagas. On PostgreSQL a plain join let the
/// planner, misled by the ledger's churn (thousands of dead rows in a
/// table of a few hundred), hash every saga of the database: 11 ms at
/// 14,000 sagas for the count each claim round makes, growing with the
/// table (docs/BENCHMARKS.md §29). A lateral lookup with `LIMIT 1` is
/// always an index probe per slot. SQLite has no `LATERAL`, and its
/// planner probes the saga's key for a join anyway.
fn saga_of_each_slot(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => {
            "LEFT JOIN LATERAL (SELECT g.* FROM sagas g WHERE g.id = l.saga_id LIMIT 1) s ON true"
        }
        _ => "LEFT JOIN sagas s ON s.id = l.saga_id",
    }
}

/// A fresh row id, made by the database (rows are inserted from selects).
fn random_id(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "gen_random_uuid()::text",
        _ => "lower(hex(randomblob(16)))",
    }
}

/// What a granted slot keeps of its call's order (copied from the saga
/// `s` and its photo `p`): the prompt, and the photo's key and SHA-256.
/// The slot adopter looks for the job with exactly that, whatever
/// erasure or retention did to the saga's rows since; it goes with the
/// row when the slot is freed on evidence.
const ORDER_COLUMNS: &str = "prompt, photo_key, photo_sha256";
const ORDER_VALUES: &str = "s.prompt, p.object_key, p.sha256";
const PHOTO_JOIN: &str = "LEFT JOIN photos p ON p.id = s.photo_id";

/// In the claim's transaction: the slot of call 0 of each of these
/// single-call sagas (AI_PENDING, just claimed), with the key of its
/// current attempt. A saga that already has its row keeps it. Returns the
/// sagas whose row was written now (their worker holds call 0's slot and
/// no submit was sent under it yet).
pub(super) async fn reserve_first_calls(
    tx: &WriteTx,
    provider: &str,
    saga_ids: &[String],
    now: EpochMs,
) -> StoreResult<Vec<String>> {
    if saga_ids.is_empty() {
        return Ok(Vec::new());
    }
    let backend = tx.get_database_backend();
    let mut values: Vec<Value> = vec![provider.into(), now.into()];
    let ids = in_list(backend, 3, saga_ids.iter().cloned(), &mut values);
    let rows = tx
        .query_all_raw(sql_for(
            backend,
            &format!(
                "INSERT INTO ai_slots (id, provider, experience_id, saga_id, call_index, \
                 base_key, key_attempt, job_id, detached, created_at_ms, updated_at_ms, \
                 keyed_at_ms, {order_columns}) \
                 SELECT {id}, $1, s.experience_id, s.id, 0, s.ai_base_key, \
                 s.attempt_offset + s.attempts, NULL, false, $2, $2, $2, {order_values} \
                 FROM sagas s {photo_join} WHERE s.id {ids} \
                 ON CONFLICT (saga_id, call_index) WHERE NOT detached DO NOTHING \
                 RETURNING saga_id",
                order_columns = ORDER_COLUMNS,
                order_values = ORDER_VALUES,
                photo_join = PHOTO_JOIN,
                id = random_id(backend),
            ),
            values,
        ))
        .await?;
    rows.iter()
        .map(|r| r.try_get_by_index::<String>(0))
        .collect::<Result<_, _>>()
        .map_err(Into::into)
}

/// The slots of these calls of one saga (`(call index, key attempt)`, keys
/// under `base_key`), each unless it has one already. Returns the calls
/// whose row was written.
pub(super) async fn reserve_calls<C: ConnectionTrait>(
    conn: &C,
    provider: &str,
    experience_id: &str,
    (saga_id, base_key): (&str, &str),
    calls: &[(i32, i32)],
    now: EpochMs,
) -> StoreResult<Vec<i32>> {
    let mut granted = Vec::with_capacity(calls.len());
    let backend = conn.get_database_backend();
    for &(call_index, key_attempt) in calls {
        let row = conn
            .query_one_raw(sql_for(
                backend,
                &format!(
                    "INSERT INTO ai_slots (id, provider, experience_id, saga_id, call_index, \
                     base_key, key_attempt, job_id, detached, created_at_ms, updated_at_ms, \
                     keyed_at_ms, {order_columns}) \
                     SELECT {id}, $1, $2, $3, $4, $7, $5, NULL, false, $6, $6, $6, \
                     {order_values} FROM sagas s {photo_join} WHERE s.id = $3 \
                     ON CONFLICT (saga_id, call_index) WHERE NOT detached DO NOTHING \
                     RETURNING call_index",
                    id = random_id(backend),
                    order_columns = ORDER_COLUMNS,
                    order_values = ORDER_VALUES,
                    photo_join = PHOTO_JOIN,
                ),
                vec![
                    provider.into(),
                    experience_id.into(),
                    saga_id.into(),
                    call_index.into(),
                    key_attempt.into(),
                    now.into(),
                    base_key.into(),
                ],
            ))
            .await?;
        if row.is_some() {
            granted.push(call_index);
        }
    }
    Ok(granted)
}

/// Inside a transaction fenced on the saga's lock token: takes free slots
/// of the saga's experience and provider for the calls in `want` (`(call
/// index, key attempt)`, in the order they should start), as many as the
/// experience's ceiling (its slots on every provider) and the provider's
/// cap leave free, on the provider the saga's worker submits to
/// ([`Wanted`]): its jobs run there, even after an
/// operator moved the experience. On PostgreSQL
/// the count and the rows are under the provider's advisory lock, as the
/// claim's, so the cap stays exact across instances. Returns the calls
/// that got a slot.
pub(super) async fn take_free_slots(
    store: &Store,
    tx: &WriteTx,
    saga_id: &str,
    want: &Wanted,
    now: EpochMs,
) -> StoreResult<Vec<i32>> {
    if want.calls.is_empty() {
        return Ok(Vec::new());
    }
    let provider = want.provider.as_str();
    let Some(row) = tx
        .query_one_raw(store.sql(
            "SELECT s.experience_id, e.max_in_flight, p.max_in_flight, s.ai_base_key \
             FROM sagas s JOIN experiences e ON e.id = s.experience_id \
             LEFT JOIN providers p ON p.name = $2 WHERE s.id = $1",
            vec![saga_id.into(), provider.into()],
        ))
        .await?
    else {
        return Ok(Vec::new());
    };
    let experience_id: String = row.try_get_by_index(0)?;
    let ceiling: i32 = row.try_get_by_index(1)?;
    let cap: Option<i32> = row.try_get_by_index(2)?;
    let base_key: String = row.try_get_by_index(3)?;
    if store.is_postgres() {
        lock_provider(store, tx, provider).await?;
    }
    let counts = slots_in_use(&**tx, Some(provider), now).await?;
    let mine = counts.experience_total(&experience_id);
    let mut free = i64::from(ceiling) - mine;
    if let Some(cap) = cap {
        free = free.min(i64::from(cap) - counts.provider_total(provider));
    }
    let n = free.clamp(0, want.calls.len() as i64) as usize;
    let saga = (saga_id, base_key.as_str());
    reserve_calls(&**tx, provider, &experience_id, saga, &want.calls[..n], now).await
}

/// The jobs of single-call sagas are known (`(saga id, job id)`): each
/// binds to the slot of its call 0. One statement for a batch.
pub(super) async fn bind_first_jobs(
    tx: &WriteTx,
    jobs: &[(String, String)],
    now: EpochMs,
) -> StoreResult<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    let backend = tx.get_database_backend();
    let mut rows = ValueRows::new(&[SqlType::Text, SqlType::Text]);
    for (saga_id, job_id) in jobs {
        rows.push([saga_id.clone().into(), job_id.clone().into()]);
    }
    let mut values: Vec<Value> = vec![now.into()];
    let source = rows.source(backend, 2, &mut values);
    tx.execute_raw(sql_for(
        backend,
        &format!(
            "WITH v(id, job) AS ({source}) UPDATE ai_slots SET job_id = v.job, \
             updated_at_ms = $1 FROM v WHERE ai_slots.saga_id = v.id \
             AND ai_slots.call_index = 0 AND NOT ai_slots.detached"
        ),
        values,
    ))
    .await?;
    Ok(())
}

/// The jobs of these single-call sagas are final: the slots of their call
/// 0 are free. One statement for a batch.
pub(super) async fn free_first_calls(
    tx: &WriteTx,
    saga_ids: &[String],
    evidence: Evidence,
) -> StoreResult<u64> {
    if saga_ids.is_empty() {
        return Ok(0);
    }
    let backend = tx.get_database_backend();
    let mut values = Vec::new();
    let ids = in_list(backend, 1, saga_ids.iter().cloned(), &mut values);
    let freed = tx
        .execute_raw(sql_for(
            backend,
            &format!(
                "DELETE FROM ai_slots WHERE saga_id {ids} AND call_index = 0 AND NOT detached"
            ),
            values,
        ))
        .await?
        .rows_affected();
    tracing::trace!(freed, evidence = evidence.as_str(), "AI slots freed");
    Ok(freed)
}

/// The job of a call's slot is known (its submit answered).
pub(super) async fn bind_job<C: ConnectionTrait>(
    conn: &C,
    saga_id: &str,
    call_index: i32,
    job_id: &str,
    now: EpochMs,
) -> StoreResult<()> {
    conn.execute_raw(sql_for(
        conn.get_database_backend(),
        "UPDATE ai_slots SET job_id = $3, updated_at_ms = $4 \
         WHERE saga_id = $1 AND call_index = $2 AND NOT detached",
        vec![saga_id.into(), call_index.into(), job_id.into(), now.into()],
    ))
    .await?;
    Ok(())
}

/// The call's job is final and the call goes on to a next attempt in the
/// same slot: its next submit uses the key of `key_attempt`.
pub(super) async fn rekey<C: ConnectionTrait>(
    conn: &C,
    saga_id: &str,
    call_index: i32,
    key_attempt: i32,
    _evidence: Evidence,
    now: EpochMs,
) -> StoreResult<()> {
    conn.execute_raw(sql_for(
        conn.get_database_backend(),
        "UPDATE ai_slots SET key_attempt = $3, job_id = NULL, updated_at_ms = $4, \
         keyed_at_ms = $4 \
         WHERE saga_id = $1 AND call_index = $2 AND NOT detached",
        vec![
            saga_id.into(),
            call_index.into(),
            key_attempt.into(),
            now.into(),
        ],
    ))
    .await?;
    Ok(())
}

/// No job runs in the slots of these calls of the saga (`evidence` says
/// why): they are free. Returns how many rows went.
pub(super) async fn free_calls<C: ConnectionTrait>(
    conn: &C,
    saga_id: &str,
    calls: &[i32],
    evidence: Evidence,
) -> StoreResult<u64> {
    if calls.is_empty() {
        return Ok(0);
    }
    let list: Vec<String> = calls.iter().map(|c| c.to_string()).collect();
    let freed = conn
        .execute_raw(sql_for(
            conn.get_database_backend(),
            &format!(
                "DELETE FROM ai_slots WHERE saga_id = $1 AND NOT detached \
                 AND call_index IN ({})",
                list.join(", ")
            ),
            vec![saga_id.into()],
        ))
        .await?
        .rows_affected();
    if freed > 0 {
        tracing::debug!(
            saga_id,
            ?calls,
            evidence = evidence.as_str(),
            "AI slots freed"
        );
    }
    Ok(freed)
}

/// The saga no longer runs these calls (all of its calls with `None`)
/// while their jobs may still run: their rows stay, detached, for an
/// instance to adopt. Returns how many were detached.
pub(super) async fn detach_calls<C: ConnectionTrait>(
    conn: &C,
    saga_id: &str,
    calls: Option<&[i32]>,
    now: EpochMs,
) -> StoreResult<u64> {
    let only = match calls {
        Some([]) => return Ok(0),
        Some(calls) => {
            let list: Vec<String> = calls.iter().map(|c| c.to_string()).collect();
            format!(" AND call_index IN ({})", list.join(", "))
        }
        None => String::new(),
    };
    Ok(conn
        .execute_raw(sql_for(
            conn.get_database_backend(),
            &format!(
                "UPDATE ai_slots SET detached = true, updated_at_ms = $2 \
                 WHERE saga_id = $1 AND NOT detached{only}"
            ),
            vec![saga_id.into(), now.into()],
        ))
        .await?
        .rows_affected())
}

/// An operator's retry takes back the slots of its calls that the saga's
/// end detached (the newest of each call), where the saga holds none for
/// that call: the retried run goes on with those jobs (or sends their keys
/// again), so it never runs a second job beside one of them. The slot
/// adopter that may hold one loses it (its writes are fenced on its own
/// token). Returns each slot taken back as `(call, key attempt, job id)`.
pub(super) async fn take_back_calls<C: ConnectionTrait>(
    conn: &C,
    saga_id: &str,
    now: EpochMs,
) -> StoreResult<Vec<(i32, i32, Option<String>)>> {
    let rows = conn
        .query_all_raw(sql_for(
            conn.get_database_backend(),
            "UPDATE ai_slots SET detached = false, adopt_token = NULL, adopted_until_ms = 0, \
             updated_at_ms = $2 WHERE id IN (SELECT a.id FROM ai_slots a \
             WHERE a.saga_id = $1 AND a.detached AND a.call_index >= 0 \
             AND a.id = (SELECT b.id FROM ai_slots b WHERE b.saga_id = a.saga_id \
             AND b.call_index = a.call_index AND b.detached \
             ORDER BY b.created_at_ms DESC, b.id DESC LIMIT 1) \
             AND NOT EXISTS (SELECT 1 FROM ai_slots c WHERE c.saga_id = a.saga_id \
             AND c.call_index = a.call_index AND NOT c.detached)) \
             RETURNING call_index, key_attempt, job_id",
            vec![saga_id.into(), now.into()],
        ))
        .await?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get_by_index(0)?,
                r.try_get_by_index(1)?,
                r.try_get_by_index(2)?,
            ))
        })
        .collect::<Result<_, sea_orm::DbErr>>()
        .map_err(Into::into)
}

/// A slot a saga's worker holds (an attached row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldSlot {
    pub call_index: i32,
    pub base_key: String,
    pub key_attempt: i32,
    pub job_id: Option<String>,
    /// When the row took its key (reserved, or re-keyed for the next
    /// attempt; a retry that takes it back keeps it): a job sent under that
    /// key was made no earlier.
    pub keyed_at_ms: i64,
}

/// A detached row taken by this instance, to find its job and see it end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptedSlot {
    pub id: String,
    pub provider: String,
    pub saga_id: String,
    pub call_index: i32,
    /// Its key: `ai_call_key(base_key, call_index, key_attempt)`.
    pub base_key: String,
    pub key_attempt: i32,
    pub job_id: Option<String>,
    pub cancel_tried: bool,
    /// When the row took its key: no job of it is older.
    pub keyed_at_ms: i64,
    /// The lease this taker holds it under.
    pub token: String,
    /// What a submit of its key sends again, from the row's own copy of
    /// the order and its saga and experience (None when the saga row is
    /// gone: the job can then be found only by its id).
    pub order: Option<OrderSource>,
    /// When a look first found no job of the row (None: not yet).
    pub unfound_since_ms: Option<i64>,
}

/// What a call's job order is made of (see `crate::ai::JobOrder`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderSource {
    pub kind: String,
    pub prompt: String,
    pub session_id: String,
    /// The experience's calls per submission (> 1: the order names its call).
    pub ai_calls: i32,
    /// The photo the order carried: its media key and SHA-256 (None: the
    /// order had no photo).
    pub photo: Option<(String, Option<String>)>,
}

impl Store {
    /// The slots the saga's worker holds (its attached rows), in call order.
    pub async fn slots_of_saga(&self, saga_id: &str) -> StoreResult<Vec<HeldSlot>> {
        let rows = self
            .db()
            .query_all_raw(self.sql(
                "SELECT call_index, base_key, key_attempt, job_id, \
                 COALESCE(keyed_at_ms, created_at_ms) FROM ai_slots \
                 WHERE saga_id = $1 AND NOT detached ORDER BY call_index",
                vec![saga_id.into()],
            ))
            .await?;
        rows.iter()
            .map(|r| {
                Ok(HeldSlot {
                    call_index: r.try_get_by_index(0)?,
                    base_key: r.try_get_by_index(1)?,
                    key_attempt: r.try_get_by_index(2)?,
                    job_id: r.try_get_by_index(3)?,
                    keyed_at_ms: r.try_get_by_index(4)?,
                })
            })
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(Into::into)
    }

    /// The provider the saga's attached slots are on (None: it holds none).
    pub async fn provider_of_slots(&self, saga_id: &str) -> StoreResult<Option<String>> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                "SELECT provider FROM ai_slots WHERE saga_id = $1 AND NOT detached LIMIT 1",
                vec![saga_id.into()],
            ))
            .await?;
        Ok(row.map(|r| r.try_get_by_index(0)).transpose()?)
    }

    /// The job ids the ledger holds for `provider`: jobs of other calls,
    /// which a look for an unclear create's job must never take.
    pub async fn jobs_held(
        &self,
        provider: &str,
    ) -> StoreResult<std::collections::HashSet<String>> {
        let rows = self
            .db()
            .query_all_raw(self.sql(
                "SELECT job_id FROM ai_slots WHERE provider = $1 AND job_id IS NOT NULL",
                vec![provider.into()],
            ))
            .await?;
        rows.iter()
            .map(|r| r.try_get_by_index::<String>(0))
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(Into::into)
    }

    /// Every row of the ledger now (for tests and operators).
    pub async fn ledger_rows(&self) -> StoreResult<i64> {
        let row = self
            .db()
            .query_one_raw(self.sql("SELECT COUNT(*) FROM ai_slots", vec![]))
            .await?;
        Ok(row
            .map(|r| r.try_get_by_index::<i64>(0))
            .transpose()?
            .unwrap_or(0))
    }

    /// Takes up to `limit` rows whose owner is gone, each for `lease_ms`:
    /// detached rows, and rows of sagas that can no longer resume them (the
    /// saga ended, or nobody holds it and it is past its deadline or out of
    /// recoveries). A taken row is detached for good: a saga that runs
    /// again later gets new slots.
    pub async fn adopt_slots(
        &self,
        limit: usize,
        now: EpochMs,
        lease_ms: i64,
        max_recoveries: u32,
    ) -> StoreResult<Vec<AdoptedSlot>> {
        let orphaned = "l.adopted_until_ms < $1 AND (l.detached OR s.id IS NULL \
             OR s.step <> 'AI_PENDING' \
             OR ((s.lock_token IS NULL OR s.locked_until_ms < $1) \
             AND (s.deadline_at_ms < $1 OR (s.lock_token IS NOT NULL \
             AND s.recoveries >= $2 AND NOT s.handed_over))))";
        // Mostly there are none: a read says so without a write
        // transaction (SQLite's one writer is not taken every second).
        let slot_sagas = saga_of_each_slot(self.backend());
        let due = self
            .db()
            .query_one_raw(self.sql(
                &format!("SELECT 1 FROM ai_slots l {slot_sagas} WHERE {orphaned} LIMIT 1"),
                vec![now.into(), (max_recoveries as i32).into()],
            ))
            .await?;
        if due.is_none() {
            return Ok(Vec::new());
        }
        let token = super::new_id();
        let lock = if self.is_postgres() {
            " FOR UPDATE OF l SKIP LOCKED"
        } else {
            ""
        };
        let tx = self.write_tx().await?;
        let taken = tx
            .query_all_raw(self.sql(
                &format!(
                    "WITH picked AS MATERIALIZED (SELECT l.id FROM ai_slots l \
                     {slot_sagas} WHERE {orphaned} \
                     ORDER BY l.adopted_until_ms, l.created_at_ms LIMIT $3{lock}) \
                     UPDATE ai_slots SET detached = true, adopt_token = $4, \
                     adopted_until_ms = $5, updated_at_ms = $1 \
                     WHERE id IN (SELECT id FROM picked) AND adopted_until_ms < $1 \
                     RETURNING id"
                ),
                vec![
                    now.into(),
                    (max_recoveries as i32).into(),
                    (limit as i64).into(),
                    token.clone().into(),
                    (now + lease_ms).into(),
                ],
            ))
            .await?;
        let ids: Vec<String> = taken
            .iter()
            .map(|r| r.try_get_by_index::<String>(0))
            .collect::<Result<_, _>>()?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let backend = self.backend();
        let mut values = Vec::new();
        let list = in_list(backend, 1, ids, &mut values);
        let rows = tx
            .query_all_raw(sql_for(
                backend,
                &format!(
                    "SELECT l.id, l.provider, l.saga_id, l.call_index, l.key_attempt, l.job_id, \
                     l.cancel_tried, e.kind, COALESCE(l.prompt, s.prompt), s.session_id, \
                     l.base_key, e.ai_calls, COALESCE(l.keyed_at_ms, l.created_at_ms), \
                     COALESCE(l.photo_key, p.object_key), COALESCE(l.photo_sha256, p.sha256), \
                     l.unfound_since_ms \
                     FROM ai_slots l {slot_sagas} \
                     LEFT JOIN experiences e ON e.id = s.experience_id \
                     LEFT JOIN photos p ON p.id = s.photo_id WHERE l.id {list}"
                ),
                values,
            ))
            .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| {
                let kind: Option<String> = r.try_get_by_index(7)?;
                let prompt: Option<String> = r.try_get_by_index(8)?;
                let session_id: Option<String> = r.try_get_by_index(9)?;
                let ai_calls: Option<i32> = r.try_get_by_index(11)?;
                let photo_key: Option<String> = r.try_get_by_index(13)?;
                let photo_sha256: Option<String> = r.try_get_by_index(14)?;
                let order = match (kind, prompt, session_id, ai_calls) {
                    (Some(kind), Some(prompt), Some(session_id), Some(n)) => Some(OrderSource {
                        kind,
                        prompt,
                        session_id,
                        ai_calls: n,
                        photo: photo_key.map(|key| (key, photo_sha256)),
                    }),
                    _ => None,
                };
                Ok(AdoptedSlot {
                    id: r.try_get_by_index(0)?,
                    provider: r.try_get_by_index(1)?,
                    saga_id: r.try_get_by_index(2)?,
                    call_index: r.try_get_by_index(3)?,
                    base_key: r.try_get_by_index(10)?,
                    key_attempt: r.try_get_by_index(4)?,
                    job_id: r.try_get_by_index(5)?,
                    cancel_tried: r.try_get_by_index(6)?,
                    keyed_at_ms: r.try_get_by_index(12)?,
                    token: token.clone(),
                    order,
                    unfound_since_ms: r.try_get_by_index(15)?,
                })
            })
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(Into::into)
    }

    /// The adopted row's job is final, or was never made (`evidence`): its
    /// slot is free. Fenced on the taker's lease; true when it was still ours.
    pub async fn free_adopted(&self, slot: &AdoptedSlot, evidence: Evidence) -> StoreResult<bool> {
        let n = self
            .write_one(self.sql(
                "DELETE FROM ai_slots WHERE id = $1 AND adopt_token = $2",
                vec![slot.id.clone().into(), slot.token.clone().into()],
            ))
            .await?;
        if n == 1 {
            tracing::debug!(slot = %slot.id, evidence = evidence.as_str(), "adopted AI slot freed");
        }
        Ok(n == 1)
    }

    /// The adopted row's job still runs (or the provider could not be
    /// asked): ask again at `next_ms` (its lease runs until then), with
    /// what was learnt: its job id, and whether a cancel was sent.
    pub async fn adopted_later(
        &self,
        slot: &AdoptedSlot,
        job_id: Option<&str>,
        cancel_tried: bool,
        next_ms: EpochMs,
    ) -> StoreResult<()> {
        self.write_one(self.sql(
            "UPDATE ai_slots SET job_id = COALESCE($3, job_id), cancel_tried = $4, \
             adopted_until_ms = $5, unfound_since_ms = $6 WHERE id = $1 AND adopt_token = $2",
            vec![
                slot.id.clone().into(),
                slot.token.clone().into(),
                job_id.map(str::to_owned).into(),
                cancel_tried.into(),
                next_ms.into(),
                slot.unfound_since_ms.into(),
            ],
        ))
        .await?;
        Ok(())
    }
}
