//! The operators' review queue: the sagas waiting in IN_REVIEW, an
//! operator's approval (fenced on "in review, no decision yet"), the items
//! whose `review_timeout` ran out, and the adoption of approved sagas by a
//! worker. A rejection is an abort with [`super::sagas::Fence::Review`]
//! (see [`super::transitions`]). Every query walks `idx_sagas_in_review`.

use sea_orm::{ConnectionTrait, FromQueryResult, QueryResult};

use super::entities::sagas;
use super::sagas::load;
use super::{new_id, Store, StoreError, StoreResult};
use crate::domain::audit::AuditEntry;
use crate::domain::policy::{lease_until, EpochMs};
use crate::domain::review::{judge_decision, Decision, ReviewRow};

/// One result waiting for an operator, as `GET /api/admin/review` and the
/// operators' socket show it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct ReviewItem {
    #[schema(format = Uuid)]
    pub saga_id: String,
    #[schema(format = Uuid)]
    pub session_id: String,
    /// The experience's slug.
    pub experience: String,
    pub nickname: String,
    /// The AI result's content, as the display would show it.
    pub content: serde_json::Value,
    #[schema(required = true)]
    pub score: Option<f64>,
    /// RFC 3339: when the result entered review.
    #[schema(format = DateTime)]
    pub waiting_since: String,
    #[serde(skip)]
    pub waiting_since_ms: EpochMs,
}

/// How many wait, and since when the oldest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReviewQueue {
    pub waiting: i64,
    pub oldest_since_ms: Option<EpochMs>,
}

/// "Waiting for a decision": the partial index's term and the fence.
const WAITING: &str = "s.step = 'IN_REVIEW' AND s.review_decision IS NULL";

fn item_of(row: &QueryResult) -> StoreResult<ReviewItem> {
    let content: Option<String> = row.try_get_by_index(4)?;
    let since: i64 = row.try_get_by_index(6)?;
    Ok(ReviewItem {
        saga_id: row.try_get_by_index(0)?,
        session_id: row.try_get_by_index(1)?,
        experience: row.try_get_by_index(2)?,
        nickname: row.try_get_by_index(3)?,
        content: content
            .as_deref()
            .and_then(|c| serde_json::from_str(c).ok())
            .unwrap_or(serde_json::Value::Null),
        score: row.try_get_by_index(5)?,
        waiting_since: crate::clock::rfc3339(since),
        waiting_since_ms: since,
    })
}

/// Judges a decision whose fenced write touched no row, against the saga
/// as it is now ([`judge_decision`]).
pub(super) fn judge_on_row(decision: Decision, saga: &sagas::Model) -> StoreResult<()> {
    let row = ReviewRow {
        step: super::sagas::step_of(saga)?,
        decision: saga.review_decision.as_deref(),
        abort_reason: saga.abort_reason.as_deref(),
    };
    Ok(judge_decision(decision, row)?)
}

impl Store {
    /// The results waiting for a decision, oldest first (of one experience
    /// when `experience` names its slug).
    pub async fn review_items(
        &self,
        experience: Option<&str>,
        limit: u64,
    ) -> StoreResult<Vec<ReviewItem>> {
        let mut values: Vec<sea_orm::Value> = vec![(limit as i64).into()];
        let only = match experience {
            Some(slug) => {
                values.push(slug.into());
                " AND e.slug = $2"
            }
            None => "",
        };
        let rows = self
            .db()
            .query_all_raw(self.sql(
                &format!(
                    "SELECT s.id, s.session_id, e.slug, se.nickname, s.content, \
                     COALESCE(s.participant_score, s.ai_score), s.review_since_ms \
                     FROM sagas s JOIN experiences e ON e.id = s.experience_id \
                     JOIN sessions se ON se.id = s.session_id \
                     WHERE {WAITING}{only} ORDER BY s.review_since_ms, s.id LIMIT $1"
                ),
                values,
            ))
            .await?;
        rows.iter().map(item_of).collect()
    }

    /// How many results wait, and the oldest one's entry time.
    pub async fn review_queue(&self) -> StoreResult<ReviewQueue> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                &format!("SELECT COUNT(*), MIN(s.review_since_ms) FROM sagas s WHERE {WAITING}"),
                vec![],
            ))
            .await?;
        Ok(match row {
            Some(r) => ReviewQueue {
                waiting: r.try_get_by_index(0)?,
                oldest_since_ms: r.try_get_by_index(1)?,
            },
            None => ReviewQueue::default(),
        })
    }

    /// An operator's approval: the saga (IN_REVIEW, no decision yet) is
    /// marked approved and waits for a worker to adopt it
    /// ([`Store::adopt_approved`]). Approving again is success; after a
    /// rejection, or for a saga not in review, it is refused.
    pub async fn approve(
        &self,
        saga_id: &str,
        audit: Option<&AuditEntry>,
        now: EpochMs,
    ) -> StoreResult<()> {
        self.approve_page(&[saga_id.to_owned()], audit, now)
            .await?
            .pop()
            .unwrap_or_else(|| Err(StoreError::Corrupt("no outcome".into())))
    }

    /// [`Store::approve`] for a page of sagas in one short transaction
    /// (a bulk approve): one fenced UPDATE for them all, then each that it
    /// did not change is judged alone. One outcome per saga, in order.
    /// `audit` (its target set to each saga) is recorded for each saga
    /// approved now.
    pub async fn approve_page(
        &self,
        saga_ids: &[String],
        audit: Option<&AuditEntry>,
        now: EpochMs,
    ) -> StoreResult<Vec<StoreResult<()>>> {
        if saga_ids.is_empty() {
            return Ok(Vec::new());
        }
        let tx = self.write_tx().await?;
        let marks: Vec<String> = (3..saga_ids.len() + 3).map(|i| format!("${i}")).collect();
        let mut values: Vec<sea_orm::Value> = vec![Decision::APPROVED.into(), now.into()];
        values.extend(saga_ids.iter().map(|id| id.clone().into()));
        let applied: std::collections::HashMap<String, String> = tx
            .query_all_raw(self.sql(
                &format!(
                    "UPDATE sagas SET review_decision = $1, updated_at_ms = $2 \
                     WHERE id IN ({}) AND step = 'IN_REVIEW' AND review_decision IS NULL \
                     RETURNING id, experience_id",
                    marks.join(", ")
                ),
                values,
            ))
            .await?
            .iter()
            .map(|r| Ok((r.try_get_by_index(0)?, r.try_get_by_index(1)?)))
            .collect::<Result<_, sea_orm::DbErr>>()?;
        let mut outcomes = Vec::with_capacity(saga_ids.len());
        for id in saga_ids {
            if let Some(experience_id) = applied.get(id) {
                if let Some(audit) = audit {
                    let audit = AuditEntry {
                        target: format!("saga:{id}"),
                        ..audit.clone().of_experience(Some(experience_id.clone()))
                    };
                    super::audit::record(&*tx, &audit, now).await?;
                }
                outcomes.push(Ok(()));
                continue;
            }
            let saga = load(&*tx, id).await;
            outcomes.push(saga.and_then(|saga| judge_on_row(Decision::Approve, &saga)));
        }
        tx.commit().await?;
        Ok(outcomes)
    }

    /// Approved sagas that no worker holds (just approved, or their
    /// adopter died and its lease ran out), oldest first: each gets a
    /// fresh token and a lease, so one worker goes on with it, and a fresh
    /// deadline (`deadline_ms` from now) and recoveries: the time it spent
    /// in review is not held against it, so an adopter that dies after
    /// ranking leaves a saga the dispatcher resumes. The re-checked WHERE
    /// makes two adopters at once take each saga once.
    pub async fn adopt_approved(
        &self,
        now: EpochMs,
        lease_ms: i64,
        deadline_ms: i64,
        limit: u64,
    ) -> StoreResult<Vec<sagas::Model>> {
        let adoptable = "step = 'IN_REVIEW' AND review_decision = 'APPROVED' \
                         AND (lock_token IS NULL OR locked_until_ms < $1)";
        // A read first: an idle instance (nothing approved) takes no write
        // transaction, so it never holds SQLite's one writer each second.
        let any = self
            .db()
            .query_one_raw(self.sql(
                &format!("SELECT 1 FROM sagas WHERE {adoptable} LIMIT 1"),
                vec![now.into()],
            ))
            .await?;
        if any.is_none() {
            return Ok(Vec::new());
        }
        let tx = self.write_tx().await?;
        let rows = tx
            .query_all_raw(self.sql(
                &format!(
                    "UPDATE sagas SET lock_token = $2, locked_until_ms = $3, updated_at_ms = $1, \
                     deadline_at_ms = $5, recoveries = 0, {link_trace} \
                     WHERE id IN (SELECT id FROM sagas WHERE {adoptable} \
                     ORDER BY review_since_ms, id LIMIT $4) AND {adoptable} \
                     RETURNING *",
                    // Adopted again after a worker lost it: a new trace.
                    link_trace = super::sagas::link_trace("lock_token IS NOT NULL"),
                ),
                vec![
                    now.into(),
                    new_id().into(),
                    lease_until(now, lease_ms).into(),
                    (limit as i64).into(),
                    (now + deadline_ms).into(),
                ],
            ))
            .await?;
        let adopted = rows
            .iter()
            .map(|row| sagas::Model::from_query_result(row, ""))
            .collect::<Result<Vec<_>, _>>()
            .map_err(StoreError::from)?;
        tx.commit().await?;
        Ok(adopted)
    }

    /// Results whose experience's `review_timeout` ran out at `now`, with
    /// the decision its `review_timeout_action` takes, oldest first.
    pub async fn review_timed_out(
        &self,
        now: EpochMs,
        limit: u64,
    ) -> StoreResult<Vec<(String, Decision)>> {
        let rows = self
            .db()
            .query_all_raw(self.sql(
                &format!(
                    "SELECT s.id, e.review_timeout_action FROM sagas s \
                     JOIN experiences e ON e.id = s.experience_id \
                     WHERE {WAITING} AND e.review_timeout_ms IS NOT NULL \
                     AND s.review_since_ms + e.review_timeout_ms <= $1 \
                     ORDER BY s.review_since_ms, s.id LIMIT $2"
                ),
                vec![now.into(), (limit as i64).into()],
            ))
            .await?;
        rows.iter()
            .map(|r| {
                let id: String = r.try_get_by_index(0)?;
                let action: Option<String> = r.try_get_by_index(1)?;
                let decision = action
                    .as_deref()
                    .and_then(|a| a.parse().ok())
                    .unwrap_or(Decision::Reject);
                Ok((id, decision))
            })
            .collect()
    }

    /// The next time a review timeout runs out (None: none will).
    pub async fn next_review_timeout(&self) -> StoreResult<Option<EpochMs>> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                &format!(
                    "SELECT MIN(s.review_since_ms + e.review_timeout_ms) FROM sagas s \
                     JOIN experiences e ON e.id = s.experience_id \
                     WHERE {WAITING} AND e.review_timeout_ms IS NOT NULL"
                ),
                vec![],
            ))
            .await?;
        Ok(match row {
            Some(r) => r.try_get_by_index(0)?,
            None => None,
        })
    }
}
