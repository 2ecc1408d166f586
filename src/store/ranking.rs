//! The ranking: at most one entry (score attempt) per session, so a replayed
//! step never adds a second; the rank is computed at read time.

use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect};

use super::entities::score_attempts;
use super::sagas::RankedEntry;
use super::{new_id, Store, StoreError, StoreResult};
use crate::domain::policy::EpochMs;

/// A ranking row as the public ranking shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RankingRow {
    pub rank: i64,
    pub nickname: String,
    pub score: f64,
    pub session_id: String,
}

impl Store {
    /// Registers `score` for a session, idempotently: a second call for the
    /// same session returns the entry that exists and inserts nothing.
    pub async fn register_score(
        &self,
        experience_id: &str,
        session_id: &str,
        saga_id: &str,
        nickname: &str,
        score: f64,
        now: EpochMs,
    ) -> StoreResult<RankedEntry> {
        if !score.is_finite() {
            return Err(StoreError::Conflict(format!(
                "score {score} is not a finite number"
            )));
        }
        let tx = self.write_tx().await?;
        score_attempts::Entity::insert(score_attempts::ActiveModel {
            id: sea_orm::ActiveValue::Set(new_id()),
            experience_id: sea_orm::ActiveValue::Set(experience_id.to_owned()),
            session_id: sea_orm::ActiveValue::Set(session_id.to_owned()),
            saga_id: sea_orm::ActiveValue::Set(saga_id.to_owned()),
            nickname: sea_orm::ActiveValue::Set(nickname.to_owned()),
            score: sea_orm::ActiveValue::Set(score),
            created_at_ms: sea_orm::ActiveValue::Set(now),
        })
        .on_conflict_do_nothing_on([score_attempts::Column::SessionId])
        .exec(&*tx)
        .await?;
        let entry = score_attempts::Entity::find()
            .filter(score_attempts::Column::SessionId.eq(session_id))
            .one(&*tx)
            .await?
            .ok_or(StoreError::NotFound("score attempt"))?;
        tx.commit().await?;
        let rank = self.rank_of(experience_id, entry.score).await?;
        Ok(RankedEntry {
            score_attempt_id: entry.id,
            score: entry.score,
            rank: rank as i32,
        })
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
