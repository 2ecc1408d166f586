//! The ranking: at most one entry (score attempt) per session, so a replayed
//! step never adds a second; the rank is computed at read time.
//! Registering is batched: a busy instance ranks many sagas in one
//! transaction.

use std::collections::HashMap;

use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    QuerySelect, Value,
};

use super::entities::score_attempts;
use super::outbox::{value_rows, value_rows_from};
use super::sagas::RankedEntry;
use super::{new_id, Store, StoreError, StoreResult};
use crate::domain::policy::EpochMs;

/// A score to register for a session.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreEntry {
    pub experience_id: String,
    pub session_id: String,
    pub saga_id: String,
    pub score: f64,
}

/// A ranking row as the public ranking shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RankingRow {
    pub rank: i64,
    pub nickname: String,
    pub score: f64,
    pub session_id: String,
}

impl Store {
    /// Registers many scores at once, idempotently per session: an entry
    /// that exists is returned as it is and nothing is inserted for it. The
    /// entries take their session's nickname. One transaction inserts them
    /// all and reads them back; one statement then ranks them all. Each
    /// score has its own outcome (a score that is not a finite number is a
    /// `Conflict`).
    pub async fn register_scores(
        &self,
        entries: &[ScoreEntry],
        now: EpochMs,
    ) -> StoreResult<Vec<StoreResult<RankedEntry>>> {
        let valid: Vec<&ScoreEntry> = entries.iter().filter(|e| e.score.is_finite()).collect();
        let mut ranked: HashMap<String, RankedEntry> = HashMap::new();
        if !valid.is_empty() {
            let tx = self.write_tx().await?;
            let mut values: Vec<Value> = vec![now.into()];
            for e in &valid {
                values.extend([
                    new_id().into(),
                    e.experience_id.clone().into(),
                    e.session_id.clone().into(),
                    e.saga_id.clone().into(),
                    e.score.into(),
                ]);
            }
            tx.execute_raw(self.sql(
                &format!(
                    "WITH v(id, experience_id, session_id, saga_id, score) AS (VALUES {}) \
                     INSERT INTO score_attempts \
                     (id, experience_id, session_id, saga_id, nickname, score, created_at_ms) \
                     SELECT v.id, v.experience_id, v.session_id, v.saga_id, s.nickname, v.score, $1 \
                     FROM v JOIN sessions s ON s.id = v.session_id WHERE true \
                     ON CONFLICT (session_id) DO NOTHING",
                    value_rows_from(2, valid.len(), 5)
                ),
                values,
            ))
            .await?;
            let sessions: Vec<String> = valid.iter().map(|e| e.session_id.clone()).collect();
            let rows = score_attempts::Entity::find()
                .filter(score_attempts::Column::SessionId.is_in(sessions))
                .all(&*tx)
                .await?;
            tx.commit().await?;

            let mut values: Vec<Value> = Vec::new();
            for row in &rows {
                values.extend([
                    row.session_id.clone().into(),
                    row.experience_id.clone().into(),
                    row.score.into(),
                ]);
            }
            let ranks = self
                .db()
                .query_all_raw(self.sql(
                    &format!(
                        "WITH v(session_id, experience_id, score) AS (VALUES {}) \
                         SELECT v.session_id, (SELECT COUNT(*) FROM score_attempts a \
                         WHERE a.experience_id = v.experience_id AND a.score > v.score) FROM v",
                        value_rows(rows.len(), 3)
                    ),
                    values,
                ))
                .await?;
            let mut higher: HashMap<String, i64> = HashMap::new();
            for r in &ranks {
                higher.insert(r.try_get_by_index(0)?, r.try_get_by_index(1)?);
            }
            for row in rows {
                let rank = higher.get(&row.session_id).copied().unwrap_or(0) + 1;
                ranked.insert(
                    row.session_id.clone(),
                    RankedEntry {
                        score_attempt_id: row.id,
                        score: row.score,
                        rank: rank as i32,
                    },
                );
            }
        }
        Ok(entries
            .iter()
            .map(|e| {
                if !e.score.is_finite() {
                    return Err(StoreError::Conflict(format!(
                        "score {} is not a finite number",
                        e.score
                    )));
                }
                ranked
                    .get(&e.session_id)
                    .cloned()
                    .ok_or(StoreError::NotFound("session of the score"))
            })
            .collect())
    }

    /// Registers one score (a batch of one).
    pub async fn register_score(
        &self,
        entry: ScoreEntry,
        now: EpochMs,
    ) -> StoreResult<RankedEntry> {
        self.register_scores(std::slice::from_ref(&entry), now)
            .await?
            .pop()
            .unwrap_or(Err(StoreError::NotFound("score attempt")))
    }

    /// 1 + the number of entries of the experience with a higher score.
    pub async fn rank_of(&self, experience_id: &str, score: f64) -> StoreResult<i64> {
        let higher = score_attempts::Entity::find()
            .filter(score_attempts::Column::ExperienceId.eq(experience_id))
            .filter(score_attempts::Column::Score.gt(score))
            .count(self.db())
            .await?;
        Ok(higher as i64 + 1)
    }

    /// The entry of a session, if it was ranked.
    pub async fn score_of_session(
        &self,
        session_id: &str,
    ) -> StoreResult<Option<score_attempts::Model>> {
        Ok(score_attempts::Entity::find()
            .filter(score_attempts::Column::SessionId.eq(session_id))
            .one(self.db())
            .await?)
    }

    /// The top `limit` entries, best first; equal scores share a rank.
    pub async fn ranking(&self, experience_id: &str, limit: u64) -> StoreResult<Vec<RankingRow>> {
        let rows = score_attempts::Entity::find()
            .filter(score_attempts::Column::ExperienceId.eq(experience_id))
            .order_by_desc(score_attempts::Column::Score)
            .order_by_asc(score_attempts::Column::CreatedAtMs)
            .limit(limit)
            .all(self.db())
            .await?;
        let mut out: Vec<RankingRow> = Vec::with_capacity(rows.len());
        for (i, row) in rows.into_iter().enumerate() {
            let rank = match out.last() {
                Some(prev) if prev.score == row.score => prev.rank,
                _ => i as i64 + 1,
            };
            out.push(RankingRow {
                rank,
                nickname: row.nickname,
                score: row.score,
                session_id: row.session_id,
            });
        }
        Ok(out)
    }
}
