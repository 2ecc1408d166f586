//! Submissions, group-committed: the requests that arrive together take
//! their Idempotency-Keys in one statement, then one short transaction
//! moves their sessions OPEN/ABORTED -> SUBMITTING (a conditional UPDATE,
//! so racing submissions of one session cannot both pass), inserts their
//! runnable sagas and stores each request's answer with its key, so the
//! stored answer commits with exactly what it reports.

use std::collections::HashSet;

use sea_orm::{ActiveValue::Set, ConnectionTrait, EntityTrait, Value};
use uuid::Uuid;

use super::entities::{sagas, sessions};
use super::idempotency::{KeyClaim, KeyRequest, StoredAnswer};
use super::{Store, StoreError, StoreResult};
use crate::domain::policy::EpochMs;
use crate::domain::saga::Step;
use crate::domain::session::SessionStatus;

/// What the participant submitted.
#[derive(Debug, Clone)]
pub struct Submission {
    pub prompt: String,
    pub score: Option<f64>,
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
    /// Start a saga with id `saga_id`. The answer stored with the key is
    /// `accepted` when the session took the submission, `refused` (409
    /// already_submitted) when it did not.
    Submit {
        submission: Submission,
        saga_id: String,
        deadline_ms: i64,
        accepted: StoredAnswer,
        refused: StoredAnswer,
    },
    /// A client error found before the database (an invalid body): only
    /// stored with the key, so a repeat gets it again.
    Refuse(StoredAnswer),
}

/// What became of one submission request.
#[derive(Debug, Clone, PartialEq)]
pub enum SubmissionOutcome {
    /// The saga was created (the `accepted` answer was stored).
    Accepted,
    /// The session takes no submission now (the `refused` answer was
    /// stored).
    AlreadySubmitted,
    /// The `Refuse` answer was stored.
    Refused,
    /// The key was used before: by this same request (answer it again),
    /// by one still running, or with another body.
    Key(KeyClaim),
}

impl Store {
    /// Submits a batch of requests: keys in one statement, then one
    /// transaction for every request whose key is fresh (or that has none).
    /// The outer error means that transaction failed: nothing was written
    /// and the fresh keys were released.
    pub async fn submit_batch(
        &self,
        orders: &[SubmissionOrder],
        now: EpochMs,
        key_ttl_ms: i64,
    ) -> StoreResult<Vec<SubmissionOutcome>> {
        let keyed: Vec<(usize, KeyRequest)> = orders
            .iter()
            .enumerate()
            .filter_map(|(i, o)| o.key.clone().map(|k| (i, k)))
            .collect();
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
        match self.write_fresh(orders, &fresh, now).await {
            Ok(written) => {
                for (i, outcome) in fresh.into_iter().zip(written) {
                    outcomes[i] = Some(outcome);
                }
                Ok(outcomes.into_iter().flatten().collect())
            }
            Err(e) => {
                let taken: Vec<&KeyRequest> = fresh
                    .iter()
                    .filter_map(|&i| orders[i].key.as_ref())
                    .collect();
                if let Err(release) = self.release_keys(&taken).await {
                    tracing::error!(error = %release, "could not release idempotency keys");
                }
                Err(e)
            }
        }
    }

    /// The transaction of the fresh requests (indexes into `orders`).
    async fn write_fresh(
        &self,
        orders: &[SubmissionOrder],
        fresh: &[usize],
        now: EpochMs,
    ) -> StoreResult<Vec<SubmissionOutcome>> {
        let tx = self.write_tx().await?;
        let submitting: Vec<String> = fresh
            .iter()
            .filter(|&&i| matches!(orders[i].action, SubmissionAction::Submit { .. }))
            .map(|&i| orders[i].session.id.clone())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let mut moved: HashSet<String> = HashSet::new();
        if !submitting.is_empty() {
            let mut values: Vec<Value> = vec![now.into()];
            values.extend(submitting.iter().map(|id| id.clone().into()));
            let placeholders: Vec<String> = (0..submitting.len())
                .map(|k| format!("${}", k + 2))
                .collect();
            let rows = tx
                .query_all_raw(self.sql(
                    &format!(
                        "UPDATE sessions SET status = '{submitting}', abort_reason = NULL, \
                         updated_at_ms = $1 WHERE id IN ({ids}) \
                         AND status IN ('{open}', '{aborted}') RETURNING id",
                        submitting = SessionStatus::Submitting.as_str(),
                        open = SessionStatus::Open.as_str(),
                        aborted = SessionStatus::Aborted.as_str(),
                        ids = placeholders.join(", ")
                    ),
                    values,
                ))
                .await?;
            for row in &rows {
                moved.insert(row.try_get_by_index::<String>(0)?);
            }
        }

        let mut outcomes = Vec::with_capacity(fresh.len());
        let mut new_sagas = Vec::new();
        let mut answers: Vec<(&KeyRequest, &StoredAnswer)> = Vec::new();
        for &i in fresh {
            let order = &orders[i];
            let (outcome, answer) = match &order.action {
                SubmissionAction::Submit {
                    submission,
                    saga_id,
                    deadline_ms,
                    accepted,
                    refused,
                } => {
                    // Each session takes one submission, the first of the
                    // batch; the others find it already submitted.
                    if moved.remove(&order.session.id) {
                        new_sagas.push(new_saga(
                            &order.session,
                            submission,
                            saga_id,
                            *deadline_ms,
                            now,
                        ));
                        (SubmissionOutcome::Accepted, accepted)
                    } else {
                        (SubmissionOutcome::AlreadySubmitted, refused)
                    }
                }
                SubmissionAction::Refuse(answer) => (SubmissionOutcome::Refused, answer),
            };
            if let Some(key) = &order.key {
                answers.push((key, answer));
            }
            outcomes.push(outcome);
        }
        if !new_sagas.is_empty() {
            sagas::Entity::insert_many(new_sagas)
                .exec_without_returning(&*tx)
                .await?;
        }
        Self::finish_keys(&*tx, &answers).await?;
        tx.commit().await?;
        Ok(outcomes)
    }

    /// One submission without an Idempotency-Key (a batch of one): the
    /// saga, or `AlreadySubmitted` when the session takes no submission.
    pub async fn submit(
        &self,
        session: &sessions::Model,
        submission: Submission,
        deadline_ms: i64,
        now: EpochMs,
    ) -> StoreResult<sagas::Model> {
        let saga_id = super::new_id();
        let answer = StoredAnswer {
            status: 0,
            body: String::new(),
        };
        let order = SubmissionOrder {
            session: session.clone(),
            key: None,
            action: SubmissionAction::Submit {
                submission,
                saga_id: saga_id.clone(),
                deadline_ms,
                accepted: answer.clone(),
                refused: answer,
            },
        };
        let outcome = self.submit_batch(&[order], now, 0).await?;
        match outcome.first() {
            Some(SubmissionOutcome::Accepted) => self
                .saga(&saga_id)
                .await?
                .ok_or(StoreError::NotFound("saga")),
            _ => Err(StoreError::AlreadySubmitted),
        }
    }
}

/// The runnable saga a submission starts.
fn new_saga(
    session: &sessions::Model,
    submission: &Submission,
    saga_id: &str,
    deadline_ms: i64,
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
        ai_job_id: Set(None),
        ai_submitted_at_ms: Set(None),
        content: Set(None),
        ai_score: Set(None),
        score: Set(None),
        score_attempt_id: Set(None),
        rank: Set(None),
        abort_reason: Set(None),
        aborted_at_step: Set(None),
        abort_detail: Set(None),
        deadline_at_ms: Set(now + deadline_ms),
        created_at_ms: Set(now),
        updated_at_ms: Set(now),
    }
}
