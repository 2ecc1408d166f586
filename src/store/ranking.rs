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
use super::outbox::value_rows_from;
use super::sagas::RankedEntry;
use super::{new_id, Store, StoreError, StoreResult};
use crate::domain::policy::EpochMs;
use crate::domain::saga::TransitionError;

/// A score to register for a session.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreEntry {
    pub experience_id: String,
    pub session_id: String,
    pub saga_id: String,
    /// The writer's lock token: the write is fenced on it.
    pub token: String,
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
    /// Registers many scores at once, one entry per session, each fenced
    /// like every saga step: it is written only while its saga is at
    /// AI_DONE (or IN_REVIEW, approved and adopted) under the writer's lock
    /// token, so a worker whose lease was
    /// lost writes nothing and gets `LeaseLost`. A repeat by the same saga
    /// returns the entry as it is; a later saga of the same session (a new
    /// submission after ABORTED) replaces the old entry with its score. The
    /// entries take their session's nickname. One transaction writes them
    /// all and reads them back; one walk of the ranking index then ranks
    /// them all. Each score has its own outcome (a score that is not a
    /// finite number is a `Conflict`).
    pub async fn register_scores(
        &self,
        entries: &[ScoreEntry],
        now: EpochMs,
    ) -> StoreResult<Vec<StoreResult<RankedEntry>>> {
        let valid: Vec<&ScoreEntry> = entries.iter().filter(|e| e.score.is_finite()).collect();
        let mut ranked: HashMap<String, RankedEntry> = HashMap::new();
        if !valid.is_empty() {
            let tx = self.write_tx().await?;
            if self.is_postgres() {
                // The fence holds until the commit: the sagas' rows are
                // taken FOR SHARE first (in id order), so an abort that
                // holds one (an operator's cancel) is waited for, and the
                // insert below, a new statement, sees it committed. Without
                // it the insert's snapshot could still see AI_DONE after
                // the abort had hidden the saga's entries, leaving an
                // ABORTED session ranked. (SQLite has one writer.)
                let mut ids: Vec<&str> = valid.iter().map(|e| e.saga_id.as_str()).collect();
                ids.sort_unstable();
                ids.dedup();
                let marks: Vec<String> = (1..=ids.len()).map(|i| format!("${i}")).collect();
                tx.execute_raw(self.sql(
                    &format!(
                        "SELECT id FROM sagas WHERE id IN ({}) ORDER BY id FOR SHARE",
                        marks.join(", ")
                    ),
                    ids.iter().map(|id| (*id).into()).collect(),
                ))
                .await?;
            }
            let mut values: Vec<Value> = vec![now.into()];
            for e in &valid {
                values.extend([
                    new_id().into(),
                    e.experience_id.clone().into(),
                    e.session_id.clone().into(),
                    e.saga_id.clone().into(),
                    e.token.clone().into(),
                    e.score.into(),
                ]);
            }
            tx.execute_raw(self.sql(
                &format!(
                    "WITH v(id, experience_id, session_id, saga_id, token, score) AS (VALUES {}) \
                     INSERT INTO score_attempts \
                     (id, experience_id, session_id, saga_id, nickname, score, hidden, created_at_ms) \
                     SELECT v.id, v.experience_id, v.session_id, v.saga_id, s.nickname, v.score, \
                     FALSE, $1 FROM v JOIN sessions s ON s.id = v.session_id \
                     JOIN sagas g ON g.id = v.saga_id AND g.lock_token = v.token \
                     AND g.step IN ('AI_DONE', 'IN_REVIEW') WHERE true \
                     ON CONFLICT (session_id) DO UPDATE SET saga_id = excluded.saga_id, \
                     score = excluded.score, nickname = excluded.nickname, hidden = FALSE, \
                     created_at_ms = excluded.created_at_ms \
                     WHERE score_attempts.saga_id <> excluded.saga_id OR score_attempts.hidden",
                    value_rows_from(2, valid.len(), 6)
                ),
                values,
            ))
            .await?;
            let sessions: Vec<String> = valid.iter().map(|e| e.session_id.clone()).collect();
            let ours: std::collections::HashSet<&str> =
                valid.iter().map(|e| e.saga_id.as_str()).collect();
            let rows: Vec<score_attempts::Model> = score_attempts::Entity::find()
                .filter(score_attempts::Column::SessionId.is_in(sessions))
                .all(&*tx)
                .await?
                .into_iter()
                .filter(|row| ours.contains(row.saga_id.as_str()))
                .collect();
            tx.commit().await?;

            let mut ranks: HashMap<String, i64> = HashMap::new();
            let mut experiences: HashMap<&str, Vec<&score_attempts::Model>> = HashMap::new();
            for row in &rows {
                experiences.entry(&row.experience_id).or_default().push(row);
            }
            for (experience_id, entries) in experiences {
                ranks.extend(self.ranks_of(experience_id, &entries).await?);
            }
            for row in rows {
                let rank = ranks.get(&row.session_id).copied().unwrap_or(1);
                ranked.insert(
                    row.saga_id.clone(),
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
                // No entry of this saga: its fenced write found the saga
                // no longer ours.
                ranked
                    .get(&e.saga_id)
                    .cloned()
                    .ok_or(TransitionError::LeaseLost.into())
            })
            .collect())
    }

    /// The ranks of some entries of one experience, by session: 1 + the
    /// number of entries with a higher score. One walk of the ranking index
    /// from the top down to the lowest of these scores, ranked by the
    /// database as it goes (`RANK()` gives equal scores equal ranks), so a
    /// batch costs one pass over the entries above it instead of one count
    /// per entry.
    pub async fn ranks_of(
        &self,
        experience_id: &str,
        entries: &[&score_attempts::Model],
    ) -> StoreResult<HashMap<String, i64>> {
        let lowest = entries
            .iter()
            .map(|e| e.score)
            .fold(f64::INFINITY, f64::min);
        let mut values: Vec<Value> = vec![experience_id.into(), lowest.into()];
        values.extend(entries.iter().map(|e| e.session_id.clone().into()));
        let sessions: Vec<String> = (0..entries.len()).map(|i| format!("${}", i + 3)).collect();
        let rows = self
            .db()
            .query_all_raw(self.sql(
                &format!(
                    "SELECT session_id, r FROM (SELECT session_id, \
                     RANK() OVER (ORDER BY score DESC) AS r FROM score_attempts \
                     WHERE experience_id = $1 AND hidden = FALSE AND score >= $2) ranked \
                     WHERE session_id IN ({})",
                    sessions.join(", ")
                ),
                values,
            ))
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get_by_index(0)?, r.try_get_by_index(1)?)))
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(Into::into)
    }

    /// The bench's ranking: `n` visible entries of `experience_id`, each
    /// with a session of its own, scores spread over 0 to 10,000 (ids and
    /// scores from the database's random source; `offset` keeps the
    /// sessions' tokens apart from an earlier call's). Returns nothing of
    /// them: [`Store::some_entries`] picks some to rank.
    pub async fn insert_bulk_scores(
        &self,
        experience_id: &str,
        saga_id: &str,
        offset: i64,
        n: i64,
        now: EpochMs,
    ) -> StoreResult<()> {
        if n <= 0 {
            return Ok(());
        }
        let (series, random) = if self.is_postgres() {
            ("SELECT g AS i FROM generate_series(1, $1) AS g", "random()")
        } else {
            (
                "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < $1) \
                 SELECT i FROM s",
                "((random() & 1073741823) / 1073741824.0)",
            )
        };
        let tx = self.write_tx().await?;
        for (table, sql) in [
            (
                "sessions",
                format!(
                    "INSERT INTO sessions (id, experience_id, nickname, participant_token_hash, \
                     status, created_at_ms, updated_at_ms) \
                     SELECT 'bench-s-' || ($3 + i), $2, 'bench', 'bench-t-' || ($3 + i), \
                     'COMPLETED', $4, $4 FROM ({series}) AS series"
                ),
            ),
            (
                "score_attempts",
                format!(
                    "INSERT INTO score_attempts (id, experience_id, session_id, saga_id, nickname, \
                     score, hidden, created_at_ms) \
                     SELECT 'bench-a-' || ($3 + i), $2, 'bench-s-' || ($3 + i), $5, 'bench', \
                     {random} * 10000, FALSE, $4 FROM ({series}) AS series"
                ),
            ),
        ] {
            tx.execute_raw(self.sql(
                &sql,
                vec![
                    n.into(),
                    experience_id.into(),
                    offset.into(),
                    now.into(),
                    saga_id.into(),
                ],
            ))
            .await
            .map_err(|e| StoreError::Corrupt(format!("bulk {table}: {e}")))?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// `n` visible entries of `experience_id` taken at random (the bench).
    pub async fn some_entries(
        &self,
        experience_id: &str,
        n: u64,
    ) -> StoreResult<Vec<score_attempts::Model>> {
        let stmt = self.sql(
            "SELECT * FROM score_attempts WHERE experience_id = $1 AND hidden = FALSE \
             ORDER BY random() LIMIT $2",
            vec![experience_id.into(), (n as i64).into()],
        );
        Ok(score_attempts::Entity::find()
            .from_raw_sql(stmt)
            .all(self.db())
            .await?)
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

    /// 1 + the number of visible entries of the experience with a higher
    /// score.
    pub async fn rank_of(&self, experience_id: &str, score: f64) -> StoreResult<i64> {
        let higher = score_attempts::Entity::find()
            .filter(score_attempts::Column::ExperienceId.eq(experience_id))
            .filter(score_attempts::Column::Hidden.eq(false))
            .filter(score_attempts::Column::Score.gt(score))
            .count(self.db())
            .await?;
        Ok(higher as i64 + 1)
    }

    /// The visible entry of a session, if it was ranked.
    pub async fn score_of_session(
        &self,
        session_id: &str,
    ) -> StoreResult<Option<score_attempts::Model>> {
        Ok(score_attempts::Entity::find()
            .filter(score_attempts::Column::SessionId.eq(session_id))
            .filter(score_attempts::Column::Hidden.eq(false))
            .one(self.db())
            .await?)
    }

    /// The top `limit` visible entries, best first (then the first to
    /// reach the score, then by session: the ranking index's own order);
    /// equal scores share a rank.
    pub async fn ranking(&self, experience_id: &str, limit: u64) -> StoreResult<Vec<RankingRow>> {
        let rows = score_attempts::Entity::find()
            .filter(score_attempts::Column::ExperienceId.eq(experience_id))
            .filter(score_attempts::Column::Hidden.eq(false))
            .order_by_desc(score_attempts::Column::Score)
            .order_by_asc(score_attempts::Column::CreatedAtMs)
            .order_by_asc(score_attempts::Column::SessionId)
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
