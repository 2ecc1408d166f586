//! Submissions, group-committed: what admission needs of the requests
//! that arrive together (their sessions, and their experiences' settings,
//! AI queue and recent AI durations, in one statement) is read first, then
//! they are decided and written together:
//!
//! 1. their sessions that take a submission (OPEN or ABORTED) are locked,
//!    in id order (`FOR UPDATE` on PostgreSQL; SQLite has one writer);
//! 2. the experiences that count credits are locked the same way, after
//!    the sessions (the order every transaction that touches both keeps:
//!    an abort locks its saga, its session, then refunds);
//! 3. each request, in arrival order, is admitted or refused: the first
//!    request of a session takes it (the others find it already
//!    submitted), an experience that has closed, or whose estimated wait
//!    ends after it closes, refuses it (409 `closing`), and one with fewer
//!    credits left than `ai_calls` refuses it (402 `budget_exhausted`);
//! 4. one conditional UPDATE moves the admitted sessions OPEN/ABORTED ->
//!    SUBMITTING, one UPDATE per experience takes their credits (with
//!    `credits >= n` in its WHERE), their sagas are inserted holding what
//!    they were charged, and each request's answer is stored with its key,
//!    so the stored answer commits with exactly what it reports. Answers
//!    about the moment (402, 409 `closing`) release their keys instead.
//!    These writes go together: one statement, one round trip, on
//!    PostgreSQL ([`execute_together`]).
//!
//! Before step 1 the Idempotency-Keys are claimed in one statement, so a
//! key that is held, or answered already, decides its request without the
//! transaction.
//!
//! On PostgreSQL the common case skips both the key claim and the
//! transaction: when the keys are distinct and every request is admitted
//! on the rows as they were read, the writes of step 4 and the keys'
//! completed records go as one statement that writes all or nothing
//! ([`execute_all_or_nothing`]), each write re-checking its rows (a key
//! whose record exists, a session or credit that moved) under their
//! locks. One round trip instead of five (the key claim, `BEGIN`, the
//! locks, the writes, `COMMIT`); when anything moved since it was read, or
//! a request would be refused, nothing is written and the claim and the
//! locked transaction above decide.
//!
//! On SQLite the common case skips the key claim the same way: the
//! transaction's writes record each key with its answer, and a key that
//! already has a record (the insert's count falls short) or an answer
//! that would release its key rolls it back to be decided with claims.
//! One write transaction per batch instead of two (each a wait for the
//! write gate and a commit).
//!
//! The queue position and the estimate ([`crate::domain::admission`]) come
//! from the experience's AI queue and the median AI duration of its last
//! completed sagas, read with the sessions before anything is written
//! (none of it needs the locks).

use std::collections::{BTreeSet, HashMap, HashSet};

use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseTransaction, DbBackend, EntityTrait,
    IdenStatic, Iterable, QueryFilter, QueryOrder, QuerySelect, Statement, Value,
};
use uuid::Uuid;

use super::entities::{experiences, sagas, sessions};
use super::idempotency::{KeyClaim, KeyRequest, StoredAnswer};
use super::rows::{column_in, execute_all_or_nothing, execute_together, in_list, insert_statement};
use super::{Store, StoreError, StoreResult};
use crate::domain::admission::{
    admit, median_ms, refused_by_closing, submission_cost, Admission, Capacity, QueueLoad,
    RECENT_AI_DURATIONS,
};
use crate::domain::policy::EpochMs;
use crate::domain::saga::Step;
use crate::domain::session::SessionStatus;
use crate::domain::sharing::share_of;

/// What the participant submitted.
#[derive(Debug, Clone)]
pub struct Submission {
    pub prompt: String,
    pub score: Option<f64>,
    /// The uploaded photo it names (checked to be its session's by the
    /// caller).
    pub photo_id: Option<String>,
    /// False when the guest opted out of the gallery.
    pub in_gallery: bool,
    /// The guest ticked the experience's consent box.
    pub consent: bool,
}

/// One submission request, checked as far as it can be without the
/// database.
#[derive(Debug, Clone)]
pub struct SubmissionOrder {
    pub session: sessions::Model,
    /// None: no Idempotency-Key rules (store tests and tools).
    pub key: Option<KeyRequest>,
    pub action: SubmissionAction,
}

#[derive(Debug, Clone)]
pub enum SubmissionAction {
    /// Start a saga with id `saga_id`, if the session, the experience's
    /// closing time and its credits allow it.
    Submit {
        submission: Submission,
        saga_id: String,
        deadline_ms: i64,
        /// The W3C `traceparent` of the request, stored with the saga so
        /// its runs join the request's trace (None: traces are off).
        trace_context: Option<String>,
    },
    /// A client error found before the database (an invalid body): only
    /// stored with the key, so a repeat gets it again.
    Refuse(StoredAnswer),
}

/// What became of one submission request.
#[derive(Debug, Clone, PartialEq)]
pub enum SubmissionOutcome {
    /// The saga was created; where it stands in the queue.
    Accepted(Admission),
    /// The session takes no submission now.
    AlreadySubmitted,
    /// The experience has fewer credits left than the submission costs.
    BudgetExhausted,
    /// The experience has closed, or closes before the estimated wait ends.
    Closing,
    /// The `Refuse` answer was stored.
    Refused,
    /// The key was used before: by this same request (answer it again),
    /// by one still running, or with another body.
    Key(KeyClaim),
}

/// Words the outcome of a `Submit` order as the answer stored with its
/// key. None: the answer is about the moment, not the request (the key is
/// released, so a retry runs again).
pub type AnswerFn = dyn Fn(&SubmissionOrder, &SubmissionOutcome) -> Option<StoredAnswer> + Sync;

/// What admission reads for a batch, by experience id
/// ([`Store::admission_reads`]).
#[derive(Debug, Default, PartialEq)]
pub struct AdmissionReads {
    experiences: HashMap<String, experiences::Model>,
    /// The experience's share of its provider's cap (absent: no provider).
    shares: HashMap<String, i64>,
    /// The median AI duration of its last completed sagas.
    medians: HashMap<String, Option<i64>>,
    loads: HashMap<String, QueueLoad>,
}

/// The prefix of the experience's columns in an admission read's row.
const EXPERIENCE_PREFIX: &str = "e_";

impl AdmissionReads {
    /// The experience read with a session's row (None: not read).
    pub fn experience(&self, experience_id: &str) -> Option<&experiences::Model> {
        self.experiences.get(experience_id)
    }

    /// Takes in one row of [`Store::admission_statement`] (an experience
    /// already taken in, from another session's row, is skipped).
    fn add_row(&mut self, r: &sea_orm::QueryResult) -> StoreResult<()> {
        let id: String = r.try_get(EXPERIENCE_PREFIX, "id")?;
        if self.experiences.contains_key(&id) {
            return Ok(());
        }
        let experience = <experiences::Model as sea_orm::FromQueryResult>::from_query_result(
            r,
            EXPERIENCE_PREFIX,
        )?;
        let cap: Option<i32> = r.try_get("", "provider_cap")?;
        let others: i64 = r.try_get("", "others_weight")?;
        let share = share_of(
            cap.map(i64::from),
            i64::from(experience.weight),
            others,
            i64::from(experience.max_in_flight),
        );
        self.shares.insert(id.clone(), share);
        self.loads.insert(
            id.clone(),
            QueueLoad {
                running: r.try_get("", "ai_running")?,
                waiting: r.try_get("", "ai_waiting")?,
            },
        );
        let recent: Option<String> = r.try_get("", "recent_ai_ms")?;
        self.medians
            .insert(id.clone(), median_ms(&durations(recent)?));
        self.experiences.insert(id, experience);
        Ok(())
    }
}

/// How a batch's writes store each answer with its key.
#[derive(Debug, Clone, Copy)]
enum KeyWrites {
    /// The keys were claimed (IN_PROGRESS): finish those still owned.
    Claimed,
    /// No key was claimed: record each with its answer, every one or the
    /// batch is not written (only [`execute_all_or_nothing`] can say so).
    Unclaimed { key_ttl_ms: i64 },
}

/// What the transaction of a batch decided: an outcome per fresh request,
/// and the keys to release after it committed.
struct Decided {
    outcomes: Vec<SubmissionOutcome>,
    release: Vec<usize>,
}

impl Store {
    /// The sessions of a batch of submissions (to `session_ids`) and what
    /// admission reads for them, in one statement: the admission read of
    /// [`Self::admission_reads`] (once per experience, materialised), and
    /// each session found with its experience's row of it. A session id
    /// that does not exist has no row.
    pub async fn read_submissions(
        &self,
        session_ids: &[String],
        now: EpochMs,
    ) -> StoreResult<(Vec<sessions::Model>, AdmissionReads)> {
        if session_ids.is_empty() {
            return Ok((Vec::new(), AdmissionReads::default()));
        }
        let (admission, ids, values) = self.admission_statement(session_ids, now);
        let rows = self
            .db()
            .query_all_raw(self.sql(
                &format!(
                    "WITH a AS MATERIALIZED ({admission}) \
                     SELECT s.*, a.* FROM sessions s JOIN a ON a.{EXPERIENCE_PREFIX}id = s.experience_id \
                     WHERE s.id {ids}"
                ),
                values,
            ))
            .await?;
        let mut found = Vec::with_capacity(rows.len());
        let mut reads = AdmissionReads::default();
        for r in &rows {
            found.push(<sessions::Model as sea_orm::FromQueryResult>::from_query_result(r, "")?);
            reads.add_row(r)?;
        }
        Ok((found, reads))
    }

    /// Submits a batch of requests, decided on `reads` (what admission read
    /// for their sessions). On PostgreSQL, when every request is admitted
    /// on the rows as they were read and no key of the batch has a record
    /// yet, the batch is written at once, the keys recorded with their
    /// answers in the same statement ([`write_fresh_at_once`]
    /// (Self::write_fresh_at_once)); on SQLite its transaction records
    /// them the same way
    /// ([`write_fresh_locked`](Self::write_fresh_locked)). Otherwise the keys are taken in one
    /// statement, then the fresh requests (and those with no key) are
    /// decided and written (a transient failure runs that again). The
    /// outer error means nothing was written and the keys taken were
    /// released. `answer` words each decided outcome for its key.
    pub async fn submit_batch(
        &self,
        orders: &[SubmissionOrder],
        reads: &AdmissionReads,
        now: EpochMs,
        key_ttl_ms: i64,
        answer: &AnswerFn,
    ) -> StoreResult<Vec<SubmissionOutcome>> {
        let keyed: Vec<(usize, KeyRequest)> = orders
            .iter()
            .enumerate()
            .filter_map(|(i, o)| o.key.clone().map(|k| (i, k)))
            .collect();
        let keys_distinct = keyed
            .iter()
            .map(|(_, k)| (&k.scope, &k.key))
            .collect::<HashSet<_>>()
            .len()
            == keyed.len();
        if keys_distinct {
            let all: Vec<usize> = (0..orders.len()).collect();
            let unclaimed = KeyWrites::Unclaimed { key_ttl_ms };
            if let Some(decided) = super::retry_transient(|| {
                self.write_fresh(orders, &all, reads, now, answer, unclaimed)
            })
            .await?
            {
                return Ok(decided.outcomes);
            }
        }
        let keys: Vec<KeyRequest> = keyed.iter().map(|(_, k)| k.clone()).collect();
        let claims = self.claim_keys(&keys, now, key_ttl_ms).await?;
        let mut outcomes: Vec<Option<SubmissionOutcome>> = vec![None; orders.len()];
        for ((i, _), claim) in keyed.iter().zip(claims) {
            if claim != KeyClaim::Fresh {
                outcomes[*i] = Some(SubmissionOutcome::Key(claim));
            }
        }
        let fresh: Vec<usize> = (0..orders.len())
            .filter(|&i| outcomes[i].is_none())
            .collect();
        if fresh.is_empty() {
            return Ok(outcomes.into_iter().flatten().collect());
        }
        let written = super::retry_transient(|| async {
            self.write_fresh(orders, &fresh, reads, now, answer, KeyWrites::Claimed)
                .await?
                .ok_or_else(|| StoreError::Corrupt("claimed keys were not written".to_owned()))
        })
        .await;
        let (release, result): (Vec<usize>, _) = match written {
            Ok(decided) => {
                for (&i, outcome) in fresh.iter().zip(decided.outcomes) {
                    outcomes[i] = Some(outcome);
                }
                (
                    decided.release,
                    Ok(outcomes.into_iter().flatten().collect()),
                )
            }
            Err(e) => (fresh, Err(e)),
        };
        let taken: Vec<&KeyRequest> = release
            .iter()
            .filter_map(|&i| orders[i].key.as_ref())
            .collect();
        if let Err(e) = self.release_keys(&taken).await {
            tracing::error!(error = %e, "could not release idempotency keys");
        }
        result
    }

    /// What admission reads for submissions to `session_ids`, in one
    /// statement: their experiences with what their share of a provider's
    /// cap needs, their AI queues (sagas holding an AI slot, and those
    /// waiting for one: queued or backing off, and those whose lease ran
    /// out, which are resumed first) and the AI durations of their last
    /// [`RECENT_AI_DURATIONS`] completed sagas. None of it needs a lock:
    /// the settings change rarely, the estimate need not be exact, and a
    /// queue read under locks would see no more (never another batch's
    /// uncommitted sagas).
    pub async fn admission_reads(
        &self,
        session_ids: &[String],
        now: EpochMs,
    ) -> StoreResult<AdmissionReads> {
        if session_ids.is_empty() {
            return Ok(AdmissionReads::default());
        }
        let (admission, _, values) = self.admission_statement(session_ids, now);
        let rows = self
            .db()
            .query_all_raw(self.sql(&admission, values))
            .await?;
        let mut reads = AdmissionReads::default();
        for r in &rows {
            reads.add_row(r)?;
        }
        Ok(reads)
    }

    /// The statement of [`Self::admission_reads`] (its text, not yet made
    /// for the backend), the condition on session ids it binds (`IN ...`,
    /// for [`Self::read_submissions`] to use again), and its values: one row
    /// per experience of the sessions, its columns named with
    /// [`EXPERIENCE_PREFIX`] so the row can stand beside a session's.
    fn admission_statement(
        &self,
        session_ids: &[String],
        now: EpochMs,
    ) -> (String, String, Vec<Value>) {
        let runnable = super::sagas::RUNNABLE;
        let mut values: Vec<Value> = vec![now.into(), (RECENT_AI_DURATIONS as i64).into()];
        let ids = in_list(self.backend(), 3, session_ids.iter().cloned(), &mut values);
        // Waiting: sagas, not slots (a fan-out saga takes several, see
        // `Capacity`); running: the slots of the ledger.
        let pending = format!("{runnable} AND s.step = 'AI_PENDING' AND s.experience_id");
        let running = super::ledger::slots_sql("l.experience_id = e.id");
        let recent = recent_ai_durations("e.id", "$2");
        let columns: Vec<String> = experiences::Column::iter()
            .map(|c| format!("e.{0} AS {EXPERIENCE_PREFIX}{0}", c.as_str()))
            .collect();
        let text = format!(
            "SELECT {columns}, p.max_in_flight AS provider_cap, \
             CASE WHEN p.max_in_flight IS NULL THEN 0 ELSE \
             (SELECT COALESCE(SUM(x.weight), 0) FROM experiences x \
             WHERE x.provider = p.name AND x.id <> e.id AND EXISTS \
             (SELECT 1 FROM sagas s WHERE {pending} = x.id)) END AS others_weight, \
             {running} AS ai_running, \
             (SELECT COUNT(*) FROM sagas s WHERE {pending} = e.id \
             AND s.lock_token IS NULL AND s.deadline_at_ms >= $1) AS ai_waiting, \
             {recent} AS recent_ai_ms \
             FROM experiences e LEFT JOIN providers p ON p.name = e.provider \
             WHERE e.id IN (SELECT experience_id FROM sessions WHERE id {ids})",
            columns = columns.join(", "),
        );
        (text, ids, values)
    }

    /// Decides and writes the fresh requests (indexes into `orders`). On
    /// PostgreSQL the common case goes in one round trip
    /// ([`write_fresh_at_once`](Self::write_fresh_at_once)); with claimed
    /// keys, whatever it cannot settle the locked transaction decides.
    /// None only with [`KeyWrites::Unclaimed`]: nothing was written, and
    /// the keys must be claimed first.
    async fn write_fresh(
        &self,
        orders: &[SubmissionOrder],
        fresh: &[usize],
        reads: &AdmissionReads,
        now: EpochMs,
        answer: &AnswerFn,
        keys: KeyWrites,
    ) -> StoreResult<Option<Decided>> {
        if self.backend() == DbBackend::Postgres {
            let at_once = self
                .write_fresh_at_once(orders, fresh, reads, now, answer, keys)
                .await?;
            if at_once.is_some() || matches!(keys, KeyWrites::Unclaimed { .. }) {
                return Ok(at_once);
            }
        }
        self.write_fresh_locked(orders, fresh, reads, now, answer, keys)
            .await
    }

    /// PostgreSQL, when every request is admitted: decided on the sessions
    /// as the batch read them and the credits as admission read them,
    /// without taking a lock, and written as one statement that writes all
    /// or nothing ([`execute_all_or_nothing`]): no `BEGIN`, lock or
    /// `COMMIT` round trips. The sessions' update re-checks their status
    /// and the credits' update the credits left, on the rows as they are
    /// once it holds their locks, so a session submitted or credits taken
    /// since the reads make the statement write nothing; so does a key
    /// that turns out to have a record, when the keys were not claimed
    /// ([`KeyWrites::Unclaimed`]). None: a request would be refused on
    /// those reads (a refusal is decided under the locks, on rows that
    /// cannot move), or a row had moved; nothing was written.
    async fn write_fresh_at_once(
        &self,
        orders: &[SubmissionOrder],
        fresh: &[usize],
        reads: &AdmissionReads,
        now: EpochMs,
        answer: &AnswerFn,
        keys: KeyWrites,
    ) -> StoreResult<Option<Decided>> {
        let accepting: HashSet<String> = fresh
            .iter()
            .map(|&i| &orders[i].session)
            .filter(|s| {
                // An erased or expired session takes nothing more.
                s.forgotten_at_ms.is_none()
                    && SessionStatus::ALL
                        .into_iter()
                        .any(|status| status.as_str() == s.status && status.accepts_submission())
            })
            .map(|s| s.id.clone())
            .collect();
        let credits_left: HashMap<String, i64> = reads
            .experiences
            .values()
            .filter_map(|e| e.credits.map(|c| (e.id.clone(), c)))
            .collect();
        let plan = decide(
            self.backend(),
            orders,
            fresh,
            reads,
            &accepting,
            credits_left,
            now,
            answer,
            keys,
        )?;
        let all_admitted =
            fresh
                .iter()
                .zip(&plan.decided.outcomes)
                .all(|(&i, outcome)| match orders[i].action {
                    SubmissionAction::Refuse(_) => true,
                    SubmissionAction::Submit { .. } => {
                        matches!(outcome, SubmissionOutcome::Accepted(_))
                    }
                });
        if !all_admitted || plan.needs_claims(keys) {
            return Ok(None);
        }
        let writes = plan
            .writes
            .into_iter()
            .map(|(write, wanted)| (write, wanted.map(|(rows, _)| rows)))
            .collect();
        if execute_all_or_nothing(self.db(), writes).await? {
            Ok(Some(plan.decided))
        } else {
            tracing::debug!(
                requests = fresh.len(),
                "a session, the credits or a key moved since the batch read them"
            );
            Ok(None)
        }
    }

    /// The transaction of the fresh requests: their sessions and counted
    /// credits locked, decided on what the locks hold, written together.
    /// With [`KeyWrites::Unclaimed`] (SQLite) each key is recorded with
    /// its answer by the transaction's writes; None: a key already had a
    /// record, or a request's answer would release its key, so nothing
    /// was written and the keys must be claimed first.
    async fn write_fresh_locked(
        &self,
        orders: &[SubmissionOrder],
        fresh: &[usize],
        reads: &AdmissionReads,
        now: EpochMs,
        answer: &AnswerFn,
        keys: KeyWrites,
    ) -> StoreResult<Option<Decided>> {
        let submits: Vec<usize> = fresh
            .iter()
            .copied()
            .filter(|&i| matches!(orders[i].action, SubmissionAction::Submit { .. }))
            .collect();
        let tx = self.write_tx().await?;
        let accepting = self.lock_accepting_sessions(&tx, orders, &submits).await?;
        let credits_left = self
            .lock_credits_left(&tx, orders, &submits, &accepting, reads)
            .await?;
        let plan = decide(
            self.backend(),
            orders,
            fresh,
            reads,
            &accepting,
            credits_left,
            now,
            answer,
            keys,
        )?;
        if plan.needs_claims(keys) {
            tx.rollback().await?;
            return Ok(None);
        }
        if !execute_checked(&tx, plan.writes, keys).await? {
            tx.rollback().await?;
            return Ok(None);
        }
        tx.commit().await?;
        Ok(Some(plan.decided))
    }

    /// Locks the sessions of the `submits` (indexes into `orders`) that
    /// take a submission, in id order, and returns their ids.
    async fn lock_accepting_sessions(
        &self,
        tx: &DatabaseTransaction,
        orders: &[SubmissionOrder],
        submits: &[usize],
    ) -> StoreResult<HashSet<String>> {
        let session_ids: BTreeSet<String> = submits
            .iter()
            .map(|&i| orders[i].session.id.clone())
            .collect();
        Ok(if session_ids.is_empty() {
            HashSet::new()
        } else {
            sessions::Entity::find()
                .select_only()
                .column(sessions::Column::Id)
                .filter(column_in(
                    self.backend(),
                    sessions::Column::Id,
                    session_ids.iter().cloned(),
                ))
                .filter(
                    sessions::Column::Status.is_in(
                        SessionStatus::ALL
                            .into_iter()
                            .filter(|s| s.accepts_submission())
                            .map(SessionStatus::as_str),
                    ),
                )
                .filter(sessions::Column::ForgottenAtMs.is_null())
                .order_by_asc(sessions::Column::Id)
                .lock_exclusive()
                .into_tuple::<String>()
                .all(tx)
                .await?
                .into_iter()
                .collect()
        })
    }

    /// Credits left, for the experiences that count them, read under
    /// their row lock (in id order): those of the `submits` whose session
    /// is `accepting`.
    async fn lock_credits_left(
        &self,
        tx: &DatabaseTransaction,
        orders: &[SubmissionOrder],
        submits: &[usize],
        accepting: &HashSet<String>,
        reads: &AdmissionReads,
    ) -> StoreResult<HashMap<String, i64>> {
        let involved: BTreeSet<String> = submits
            .iter()
            .filter(|&&i| accepting.contains(&orders[i].session.id))
            .map(|&i| orders[i].session.experience_id.clone())
            .collect();
        let limited: Vec<String> = involved
            .iter()
            .filter(|id| {
                reads
                    .experiences
                    .get(*id)
                    .is_some_and(|e| e.credits.is_some())
            })
            .cloned()
            .collect();
        Ok(if limited.is_empty() {
            HashMap::new()
        } else {
            experiences::Entity::find()
                .select_only()
                .column(experiences::Column::Id)
                .column(experiences::Column::Credits)
                .filter(experiences::Column::Id.is_in(limited))
                .order_by_asc(experiences::Column::Id)
                .lock_exclusive()
                .into_tuple::<(String, Option<i64>)>()
                .all(tx)
                .await?
                .into_iter()
                .filter_map(|(id, credits)| credits.map(|c| (id, c)))
                .collect()
        })
    }

    /// One submission without an Idempotency-Key (a batch of one): the
    /// saga, or why the session or the experience refused it
    /// (`AlreadySubmitted`, `BudgetExhausted`, `Closing`).
    pub async fn submit(
        &self,
        session: &sessions::Model,
        submission: Submission,
        deadline_ms: i64,
        now: EpochMs,
    ) -> StoreResult<sagas::Model> {
        let saga_id = super::new_id();
        let order = SubmissionOrder {
            session: session.clone(),
            key: None,
            action: SubmissionAction::Submit {
                submission,
                saga_id: saga_id.clone(),
                deadline_ms,
                trace_context: None,
            },
        };
        let reads = self
            .admission_reads(std::slice::from_ref(&session.id), now)
            .await?;
        let outcome = self
            .submit_batch(&[order], &reads, now, 0, &|_, _| None)
            .await?;
        match outcome.first() {
            Some(SubmissionOutcome::Accepted(_)) => self
                .saga(&saga_id)
                .await?
                .ok_or(StoreError::NotFound("saga")),
            Some(SubmissionOutcome::BudgetExhausted) => Err(StoreError::BudgetExhausted),
            Some(SubmissionOutcome::Closing) => Err(StoreError::Closing),
            _ => Err(StoreError::AlreadySubmitted),
        }
    }

    /// The median AI duration of the experience's last
    /// [`RECENT_AI_DURATIONS`] completed sagas (None: none yet), along
    /// `idx_sagas_completed_ai`.
    pub async fn median_ai_ms(&self, experience_id: &str) -> StoreResult<Option<i64>> {
        let recent = recent_ai_durations("$1", "$2");
        let row = self
            .db()
            .query_one_raw(self.sql(
                &format!("SELECT {recent}"),
                vec![experience_id.into(), (RECENT_AI_DURATIONS as i64).into()],
            ))
            .await?;
        let recent = match row {
            Some(row) => row.try_get_by_index::<Option<String>>(0)?,
            None => None,
        };
        Ok(median_ms(&durations(recent)?))
    }
}

/// The AI durations of the last `limit` completed sagas of `experience`
/// (SQL expressions), as one text, comma-separated (NULL: none), along
/// `idx_sagas_completed_ai`.
fn recent_ai_durations(experience: &str, limit: &str) -> String {
    format!(
        "(SELECT string_agg(CAST(recent.d AS text), ',') FROM \
         (SELECT ai_duration_ms AS d FROM sagas WHERE experience_id = {experience} \
         AND step = 'COMPLETED' AND ai_duration_ms IS NOT NULL \
         ORDER BY updated_at_ms DESC LIMIT {limit}) recent)"
    )
}

/// The durations of a [`recent_ai_durations`] text.
fn durations(recent: Option<String>) -> StoreResult<Vec<i64>> {
    recent
        .iter()
        .flat_map(|text| text.split(','))
        .map(|d| {
            d.parse::<i64>()
                .map_err(|_| StoreError::Corrupt(format!("an AI duration reads {d:?}")))
        })
        .collect()
}

/// One of a batch's writes ([`Plan::writes`]).
type Write = (Statement, Option<(u64, String)>);

/// A batch decided, and the writes that make it so.
struct Plan {
    decided: Decided,
    /// Each write, with the rows it must touch and what they are (None:
    /// any number).
    writes: Vec<Write>,
}

impl Plan {
    /// Whether an answer would release a key that was never claimed
    /// ([`KeyWrites::Unclaimed`]): there is nothing to release, so the
    /// batch must claim its keys and be decided again.
    fn needs_claims(&self, keys: KeyWrites) -> bool {
        matches!(keys, KeyWrites::Unclaimed { .. }) && !self.decided.release.is_empty()
    }
}

/// Decides each fresh request in arrival order, given the sessions that
/// take a submission (`accepting`) and the credits left of the experiences
/// that count them: the first request of an accepting session is admitted
/// unless the experience closes first or lacks the credits; the writes
/// are the sessions started, the credits taken, the sagas and the stored
/// answers.
#[allow(clippy::too_many_arguments)]
fn decide(
    backend: DbBackend,
    orders: &[SubmissionOrder],
    fresh: &[usize],
    reads: &AdmissionReads,
    accepting: &HashSet<String>,
    credits_left: HashMap<String, i64>,
    now: EpochMs,
    answer: &AnswerFn,
    keys: KeyWrites,
) -> StoreResult<Plan> {
    let admitted = admit_in_order(orders, fresh, reads, accepting, credits_left, now)?;
    let started = started_sagas(orders, fresh, &admitted, now);
    let (answers, release) = stored_answers(orders, fresh, &admitted.outcomes, answer);
    let answers: Vec<(&KeyRequest, &StoredAnswer)> = answers.iter().map(|(k, a)| (*k, a)).collect();
    let mut writes = started_writes(backend, started, now);
    writes.extend(answers_write(backend, &answers, keys, now));
    Ok(Plan {
        decided: Decided {
            outcomes: admitted.outcomes,
            release,
        },
        writes,
    })
}

/// What [`admit_in_order`] decided: an outcome per fresh request, the
/// sessions admitted, and what each admitted request (by index into the
/// orders) is charged.
struct Admitted<'a> {
    outcomes: Vec<SubmissionOutcome>,
    sessions: HashSet<&'a str>,
    charged: HashMap<usize, i64>,
}

/// Each fresh request in arrival order: refused, already submitted (its
/// session does not take one, or an earlier request took it), closing,
/// out of credits, or admitted (its credits and a place in the queue
/// taken).
fn admit_in_order<'a>(
    orders: &'a [SubmissionOrder],
    fresh: &[usize],
    reads: &AdmissionReads,
    accepting: &HashSet<String>,
    mut credits_left: HashMap<String, i64>,
    now: EpochMs,
) -> StoreResult<Admitted<'a>> {
    let AdmissionReads {
        experiences,
        shares,
        medians,
        loads,
    } = reads;
    let mut loads = loads.clone();
    let mut decided: Vec<SubmissionOutcome> = Vec::with_capacity(fresh.len());
    let mut taken: HashSet<&str> = HashSet::new();
    let mut charged: HashMap<usize, i64> = HashMap::new();
    for &i in fresh {
        let order = &orders[i];
        let outcome = match &order.action {
            SubmissionAction::Refuse(_) => SubmissionOutcome::Refused,
            SubmissionAction::Submit { .. } => {
                let session = &order.session;
                if !accepting.contains(&session.id) || taken.contains(session.id.as_str()) {
                    SubmissionOutcome::AlreadySubmitted
                } else {
                    let experience = experiences
                        .get(&session.experience_id)
                        .ok_or(StoreError::NotFound("experience"))?;
                    let load = loads.entry(experience.id.clone()).or_default();
                    let admission = admit(
                        *load,
                        Capacity {
                            max_in_flight: shares
                                .get(&experience.id)
                                .map_or(experience.max_in_flight, |&n| n as i32),
                            ai_calls: experience.ai_calls,
                        },
                        medians.get(&experience.id).copied().flatten(),
                    );
                    let cost = submission_cost(experience.ai_calls, experience.credits.is_some());
                    let left = credits_left.get_mut(&experience.id);
                    if refused_by_closing(now, experience.closes_at_ms, admission.eta_ms) {
                        SubmissionOutcome::Closing
                    } else if cost > 0 && left.as_deref().is_none_or(|&c| c < cost) {
                        SubmissionOutcome::BudgetExhausted
                    } else {
                        if let Some(left) = left {
                            *left -= cost;
                        }
                        load.waiting += 1;
                        taken.insert(&session.id);
                        charged.insert(i, cost);
                        SubmissionOutcome::Accepted(admission)
                    }
                }
            }
        };
        decided.push(outcome);
    }
    Ok(Admitted {
        outcomes: decided,
        sessions: taken,
        charged,
    })
}

/// What the admitted requests start: their sessions (in id order), their
/// sagas, the credits taken per experience (in id order, none of zero)
/// and the guests' choices.
struct Started<'a> {
    sessions: Vec<String>,
    sagas: Vec<sagas::ActiveModel>,
    charges: Vec<(&'a str, i64)>,
    choices: GuestChoices,
}

/// The admitted sessions' sagas, and the credits they take.
fn started_sagas<'a>(
    orders: &'a [SubmissionOrder],
    fresh: &[usize],
    admitted: &Admitted<'a>,
    now: EpochMs,
) -> Started<'a> {
    // In id order: the order the locked transaction locks them in, which
    // the update written without it keeps (no deadlock between the two).
    let mut sessions: Vec<String> = admitted.sessions.iter().map(|s| (*s).to_owned()).collect();
    sessions.sort();
    let mut new_sagas = Vec::new();
    let mut charges: HashMap<&str, i64> = HashMap::new();
    let mut choices = GuestChoices::default();
    for &i in fresh {
        let Some(&cost) = admitted.charged.get(&i) else {
            continue;
        };
        let order = &orders[i];
        if let SubmissionAction::Submit {
            submission,
            saga_id,
            deadline_ms,
            trace_context,
        } = &order.action
        {
            if !submission.in_gallery {
                choices.opted_out.push(order.session.id.clone());
            }
            if submission.consent {
                choices.consented.push(order.session.id.clone());
            }
            let mut saga = new_saga(&order.session, submission, saga_id, *deadline_ms, cost, now);
            saga.trace_context = Set(trace_context.clone());
            new_sagas.push(saga);
            *charges
                .entry(order.session.experience_id.as_str())
                .or_default() += cost;
        }
    }
    let mut charges: Vec<(&str, i64)> = charges.into_iter().filter(|(_, n)| *n > 0).collect();
    charges.sort();
    Started {
        sessions,
        sagas: new_sagas,
        charges,
        choices,
    }
}

/// The answer each keyed request stores with its key, and the requests
/// (indexes into `orders`) whose answer is about the moment, so their
/// keys are released instead.
fn stored_answers<'a>(
    orders: &'a [SubmissionOrder],
    fresh: &[usize],
    outcomes: &[SubmissionOutcome],
    answer: &AnswerFn,
) -> (Vec<(&'a KeyRequest, StoredAnswer)>, Vec<usize>) {
    let mut answers: Vec<(&KeyRequest, StoredAnswer)> = Vec::new();
    let mut release = Vec::new();
    for (k, &i) in fresh.iter().enumerate() {
        let order = &orders[i];
        let Some(key) = &order.key else { continue };
        let stored = match (&order.action, &outcomes[k]) {
            (SubmissionAction::Refuse(stored), _) => Some(stored.clone()),
            (SubmissionAction::Submit { .. }, outcome) => answer(order, outcome),
        };
        match stored {
            Some(stored) => answers.push((key, stored)),
            None => release.push(i),
        }
    }
    (answers, release)
}

/// The writes of what the admitted requests start: the sessions'
/// update, one credits' update per experience, and the sagas' insert.
fn started_writes(backend: DbBackend, started: Started, now: EpochMs) -> Vec<Write> {
    let Started {
        sessions: admitted,
        sagas: new_sagas,
        charges,
        choices,
    } = started;
    let mut writes: Vec<Write> = Vec::new();
    if !admitted.is_empty() {
        writes.push((
            start_sessions_statement(backend, &admitted, &choices, now),
            Some((admitted.len() as u64, "sessions started".to_owned())),
        ));
    }
    for (experience_id, credits) in charges {
        writes.push((
            take_credits_statement(backend, experience_id, credits),
            Some((
                1,
                format!("experience {experience_id}: {credits} credits counted under its lock"),
            )),
        ));
    }
    let sagas_started = new_sagas.len() as u64;
    if let Some(insert) = insert_statement(backend, new_sagas) {
        writes.push((insert, Some((sagas_started, "sagas inserted".to_owned()))));
    }
    writes
}

/// The write that stores the answers with their keys: finishing the
/// claimed keys, or recording the unclaimed ones (None: no answer).
fn answers_write(
    backend: DbBackend,
    answers: &[(&KeyRequest, &StoredAnswer)],
    keys: KeyWrites,
    now: EpochMs,
) -> Option<Write> {
    match keys {
        // Answers whose key was taken over (its lease ran out) are not
        // stored: that is not an error.
        KeyWrites::Claimed => {
            Store::finish_keys_statement(backend, answers).map(|finish| (finish, None))
        }
        KeyWrites::Unclaimed { key_ttl_ms } => {
            let recorded = answers.len() as u64;
            Store::record_answers_statement(backend, answers, now, key_ttl_ms).map(|record| {
                (
                    record,
                    Some((recorded, "answers recorded with their keys".to_owned())),
                )
            })
        }
    }
}

/// Every write of a locked batch at once (one round trip on PostgreSQL).
/// None depends on another's effect: the sessions and the counted credits
/// are locked, so the update moves every admitted session and each
/// experience has the credits counted under its lock; a write that
/// touched fewer rows than that (it cannot happen) fails the batch. False:
/// with unclaimed keys, one already had a record, so the batch must be
/// rolled back and claim its keys instead.
async fn execute_checked(
    tx: &DatabaseTransaction,
    writes: Vec<Write>,
    keys: KeyWrites,
) -> StoreResult<bool> {
    let (statements, expected): (Vec<Statement>, Vec<_>) = writes.into_iter().unzip();
    let touched = execute_together(tx, statements).await?;
    for (rows, expected) in touched.into_iter().zip(expected) {
        if let Some((wanted, what)) = expected {
            if rows != wanted {
                if let KeyWrites::Unclaimed { .. } = keys {
                    return Ok(false);
                }
                return Err(StoreError::Corrupt(format!(
                    "{what}: {rows} rows written of {wanted}"
                )));
            }
        }
    }
    Ok(true)
}

/// What the admitted guests chose with their submission: the sessions
/// opted out of the gallery, and those whose guest gave consent.
#[derive(Debug, Default)]
struct GuestChoices {
    opted_out: Vec<String>,
    consented: Vec<String>,
}

/// OPEN/ABORTED -> SUBMITTING for `ids`, with the guests' choices, in one
/// conditional UPDATE.
fn start_sessions_statement(
    backend: DbBackend,
    ids: &[String],
    choices: &GuestChoices,
    now: EpochMs,
) -> Statement {
    let mut values: Vec<Value> = vec![now.into(), true.into(), false.into()];
    // An empty list matches nothing (`IN (NULL)`).
    let list_of = |list: &[String], values: &mut Vec<Value>| {
        if list.is_empty() {
            "IN (NULL)".to_owned()
        } else {
            in_list(backend, values.len() + 1, list.iter().cloned(), values)
        }
    };
    let opted_out = list_of(&choices.opted_out, &mut values);
    let consented = list_of(&choices.consented, &mut values);
    let ids = in_list(backend, values.len() + 1, ids.iter().cloned(), &mut values);
    super::sql_for(
        backend,
        &format!(
            "UPDATE sessions SET status = '{submitting}', abort_reason = NULL, \
             updated_at_ms = $1, \
             in_gallery = CASE WHEN id {opted_out} THEN $3 ELSE $2 END, \
             consented = CASE WHEN id {consented} THEN $2 ELSE consented END \
             WHERE id {ids} \
             AND status IN ('{open}', '{aborted}') AND forgotten_at_ms IS NULL",
            submitting = SessionStatus::Submitting.as_str(),
            open = SessionStatus::Open.as_str(),
            aborted = SessionStatus::Aborted.as_str(),
        ),
        values,
    )
}

/// Takes `credits` from an experience that counts them, only if it has
/// that many left; false when it has not (nothing changed).
pub(crate) async fn take_credits<C: ConnectionTrait>(
    conn: &C,
    experience_id: &str,
    credits: i64,
) -> StoreResult<bool> {
    let take = take_credits_statement(conn.get_database_backend(), experience_id, credits);
    Ok(conn.execute_raw(take).await?.rows_affected() == 1)
}

/// The statement [`take_credits`] runs: it touches one row, or none when
/// the experience has fewer than `credits` left.
fn take_credits_statement(backend: DbBackend, experience_id: &str, credits: i64) -> Statement {
    super::sql_for(
        backend,
        "UPDATE experiences SET credits = credits - $2 \
         WHERE id = $1 AND credits IS NOT NULL AND credits >= $2",
        vec![experience_id.into(), credits.into()],
    )
}

/// The runnable saga a submission starts, holding the credits it was
/// charged.
fn new_saga(
    session: &sessions::Model,
    submission: &Submission,
    saga_id: &str,
    deadline_ms: i64,
    charged_credits: i64,
    now: EpochMs,
) -> sagas::ActiveModel {
    sagas::ActiveModel {
        id: Set(saga_id.to_owned()),
        session_id: Set(session.id.clone()),
        experience_id: Set(session.experience_id.clone()),
        step: Set(Step::AiPending.as_str().to_owned()),
        prompt: Set(submission.prompt.clone()),
        participant_score: Set(submission.score),
        lock_token: Set(None),
        locked_until_ms: Set(None),
        attempts: Set(0),
        recoveries: Set(0),
        unavailable_streak: Set(0),
        next_attempt_at_ms: Set(now),
        ai_base_key: Set(Uuid::new_v4().to_string()),
        attempt_offset: Set(0),
        ai_job_id: Set(None),
        ai_submitted_at_ms: Set(None),
        handed_over: Set(false),
        review_since_ms: Set(None),
        review_decision: Set(None),
        trace_context: Set(None),
        content: Set(None),
        ai_score: Set(None),
        score: Set(None),
        score_attempt_id: Set(None),
        rank: Set(None),
        abort_reason: Set(None),
        aborted_at_step: Set(None),
        abort_detail: Set(None),
        deadline_at_ms: Set(now + deadline_ms),
        charged_credits: Set(charged_credits),
        ai_duration_ms: Set(None),
        created_at_ms: Set(now),
        updated_at_ms: Set(now),
        photo_id: Set(submission.photo_id.clone()),
    }
}
