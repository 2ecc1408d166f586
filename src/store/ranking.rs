//! The ranking: at most one entry (score attempt) per session, so a replayed
//! step never adds a second; a rank is computed when asked for (from the
//! scores this process keeps sorted, [`RankCache`]), never stored as truth.
//! Registering is batched: a busy instance ranks many sagas in one
//! transaction.

use std::collections::HashMap;

use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    QuerySelect, Value,
};

use super::entities::score_attempts;
use super::rows::{column_in, in_list, SqlType, ValueRows};
use super::sagas::RankedEntry;
use super::{new_id, Store, StoreError, StoreResult, WriteTx};
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

/// The visible scores of each experience, sorted, as this process last
/// read or wrote them: a batch's ranks are binary searches in it instead of
/// a walk of the ranking index (which costs every entry above the batch's
/// lowest score: 83-123x slower at 100,000 entries than at 1,000).
///
/// Kept exact for this process: it is read whole from the table when
/// missing; each registration commits and applies its own change under its
/// lock (so a reader never counts an entry twice); an abort that hides
/// entries, and an operator's retry that shows them again, drop the
/// experience (after their commit). News from another instance that its
/// ranking changed marks the experience stale: the next rank reads it
/// again, but not sooner than [`RANK_REFRESH`] after the last read, so
/// instances that rank all the time do not each re-read every entry per
/// batch (an O(entries) read each time the other's news arrived, every
/// 50 ms). An entry another instance added is counted within that bound
/// (plus the cluster bridge's coalescing window); until then the rank is
/// what this instance knew, a snapshot, like every rank. A lost LISTEN
/// connection drops every experience.
///
/// Bound: one `f64` per visible entry of each ranked experience (800 KB at
/// 100,000 entries); an experience unused for [`RANK_CACHE_IDLE`] is
/// dropped at the next registration.
#[derive(Default)]
pub struct RankCache(tokio::sync::Mutex<HashMap<String, CachedScores>>);

/// How long an experience's scores stay cached without a registration.
const RANK_CACHE_IDLE: std::time::Duration = std::time::Duration::from_secs(600);

/// The least time between two reads of an experience's scores made for
/// other instances' news (the default of [`Store::with_rank_refresh`]).
pub const RANK_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

pub struct CachedScores {
    /// Ascending.
    sorted: Vec<f64>,
    used: std::time::Instant,
    /// When `sorted` was last read whole from the table.
    read_at: std::time::Instant,
    /// Another instance changed this ranking since `read_at`.
    stale: bool,
}

impl CachedScores {
    /// Scores just read whole from the table, ascending.
    fn read(sorted: Vec<f64>) -> CachedScores {
        let now = std::time::Instant::now();
        CachedScores {
            sorted,
            used: now,
            read_at: now,
            stale: false,
        }
    }

    fn insert(&mut self, score: f64) {
        let at = self.sorted.partition_point(|s| *s < score);
        self.sorted.insert(at, score);
    }

    fn remove(&mut self, score: f64) {
        let at = self.sorted.partition_point(|s| *s < score);
        if self.sorted.get(at) == Some(&score) {
            self.sorted.remove(at);
        }
    }

    /// 1 + the number of scores above `score`.
    fn rank(&self, score: f64) -> i64 {
        (self.sorted.len() - self.sorted.partition_point(|s| *s <= score)) as i64 + 1
    }
}

impl Store {
    /// Forgets the cached scores of these experiences (None: of all), after
    /// a commit that hid or showed entries here, or when news from other
    /// instances may have been missed.
    pub async fn invalidate_ranks(&self, experiences: Option<&[String]>) {
        let mut cache = self.rank_cache.0.lock().await;
        match experiences {
            Some(ids) => ids.iter().for_each(|id| {
                cache.remove(id);
            }),
            None => cache.clear(),
        }
    }

    /// News from another instance that the ranking of these experiences
    /// (None: of all) changed: their cached scores are read again at a
    /// rank, at most once per [`Self::with_rank_refresh`].
    pub async fn ranks_changed_elsewhere(&self, experiences: Option<&[String]>) {
        let mut cache = self.rank_cache.0.lock().await;
        match experiences {
            Some(ids) => ids.iter().for_each(|id| {
                if let Some(scores) = cache.get_mut(id) {
                    scores.stale = true;
                }
            }),
            None => cache.values_mut().for_each(|scores| scores.stale = true),
        }
    }

    /// Registers many scores at once, one entry per session, each fenced
    /// like every saga step: it is written only while its saga is at
    /// AI_DONE (or IN_REVIEW, approved and adopted) under the writer's lock
    /// token, so a worker whose lease was
    /// lost writes nothing and gets `LeaseLost`. A repeat by the same saga
    /// returns the entry as it is; a later saga of the same session (a new
    /// submission after ABORTED) replaces the old entry with its score. The
    /// entries take their session's nickname. One transaction writes them
    /// all and reads them back; the kept scores then rank
    /// them all. Each score has its own outcome (a score that is not a
    /// finite number is a `Conflict`).
    pub async fn register_scores(
        &self,
        entries: &[ScoreEntry],
        now: EpochMs,
    ) -> StoreResult<Vec<StoreResult<RankedEntry>>> {
        let valid: Vec<&ScoreEntry> = entries.iter().filter(|e| e.score.is_finite()).collect();
        let ranked: HashMap<String, RankedEntry> = if valid.is_empty() {
            HashMap::new()
        } else {
            self.write_and_rank(&valid, now).await?
        };
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

    /// Writes the (finite) scores in one transaction, then ranks the
    /// entries written from the kept scores. Returns them by saga.
    async fn write_and_rank(
        &self,
        valid: &[&ScoreEntry],
        now: EpochMs,
    ) -> StoreResult<HashMap<String, RankedEntry>> {
        // Held from before the transaction to the ranks: the commit and
        // the cache's update are one step for every reader of it.
        let mut cache = self.rank_cache.0.lock().await;
        let tx = self.write_tx().await?;
        if self.is_postgres() {
            self.share_lock_sagas(&tx, valid).await?;
        }
        let before = self.entries_before(&tx, &cache, valid).await?;
        self.insert_entries(&tx, valid, now).await?;
        let rows = self.read_back_entries(&tx, valid).await?;
        tx.commit().await?;

        // An experience unused for a while leaves the cache.
        let idle = std::time::Instant::now() - RANK_CACHE_IDLE;
        cache.retain(|_, c| c.used > idle);
        learn_changes(&mut cache, &before, &rows);
        let ranks = self.ranks_of_rows(&mut cache, &rows).await?;
        drop(cache);
        let mut ranked = HashMap::new();
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
        Ok(ranked)
    }

    /// PostgreSQL: takes the entries' sagas' rows FOR SHARE, in id order.
    async fn share_lock_sagas(&self, tx: &WriteTx, valid: &[&ScoreEntry]) -> StoreResult<()> {
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
        let mut values = Vec::new();
        let ids = in_list(
            self.backend(),
            1,
            ids.into_iter().map(str::to_owned),
            &mut values,
        );
        tx.execute_raw(self.sql(
            &format!("SELECT id FROM sagas WHERE id {ids} ORDER BY id FOR SHARE"),
            values,
        ))
        .await?;
        Ok(())
    }

    /// The entries of the entries' sessions before the write, by session,
    /// for the cached experiences only.
    async fn entries_before(
        &self,
        tx: &WriteTx,
        cache: &HashMap<String, CachedScores>,
        valid: &[&ScoreEntry],
    ) -> StoreResult<HashMap<String, score_attempts::Model>> {
        // What the entries of these sessions were before (a replaced
        // or shown-again entry leaves its old score), for the cached
        // experiences only: one not cached is read whole after the
        // commit, under the same lock.
        let cached: Vec<String> = valid
            .iter()
            .filter(|e| cache.contains_key(&e.experience_id))
            .map(|e| e.session_id.clone())
            .collect();
        Ok(if cached.is_empty() {
            HashMap::new()
        } else {
            score_attempts::Entity::find()
                .filter(column_in(
                    self.backend(),
                    score_attempts::Column::SessionId,
                    cached,
                ))
                .all(&**tx)
                .await?
                .into_iter()
                .map(|row| (row.session_id.clone(), row))
                .collect()
        })
    }

    /// Inserts (or replaces) the sessions' entries, one statement, each
    /// fenced on its saga's step and lock token.
    async fn insert_entries(
        &self,
        tx: &WriteTx,
        valid: &[&ScoreEntry],
        now: EpochMs,
    ) -> StoreResult<()> {
        let mut entries = ValueRows::new(&[
            SqlType::Text,
            SqlType::Text,
            SqlType::Text,
            SqlType::Text,
            SqlType::Text,
            SqlType::Double,
        ]);
        for e in valid {
            entries.push([
                new_id().into(),
                e.experience_id.clone().into(),
                e.session_id.clone().into(),
                e.saga_id.clone().into(),
                e.token.clone().into(),
                e.score.into(),
            ]);
        }
        let mut values: Vec<Value> = vec![now.into()];
        let entries = entries.source(self.backend(), 2, &mut values);
        // `WHERE true`: without a WHERE, PostgreSQL's parser could take
        // `ON CONFLICT` for one more join condition.
        tx.execute_raw(self.sql(
            &format!(
                "WITH v(id, experience_id, session_id, saga_id, token, score) AS ({entries}) \
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
            ),
            values,
        ))
        .await?;
        Ok(())
    }

    /// The entries of the sessions as they now are, those of the writing
    /// sagas only (a saga with none found its fence gone).
    async fn read_back_entries(
        &self,
        tx: &WriteTx,
        valid: &[&ScoreEntry],
    ) -> StoreResult<Vec<score_attempts::Model>> {
        let sessions: Vec<String> = valid.iter().map(|e| e.session_id.clone()).collect();
        let ours: std::collections::HashSet<&str> =
            valid.iter().map(|e| e.saga_id.as_str()).collect();
        Ok(score_attempts::Entity::find()
            .filter(column_in(
                self.backend(),
                score_attempts::Column::SessionId,
                sessions,
            ))
            .all(&**tx)
            .await?
            .into_iter()
            .filter(|row| ours.contains(row.saga_id.as_str()))
            .collect())
    }

    /// The ranks of the entries written, by session, an experience at a
    /// time ([`Self::cached_ranks`]).
    async fn ranks_of_rows(
        &self,
        cache: &mut HashMap<String, CachedScores>,
        rows: &[score_attempts::Model],
    ) -> StoreResult<HashMap<String, i64>> {
        let mut ranks: HashMap<String, i64> = HashMap::new();
        let mut experiences: HashMap<&str, Vec<&score_attempts::Model>> = HashMap::new();
        for row in rows {
            experiences.entry(&row.experience_id).or_default().push(row);
        }
        for (experience_id, entries) in experiences {
            ranks.extend(self.cached_ranks(cache, experience_id, &entries).await?);
        }
        Ok(ranks)
    }

    /// The ranks of some entries of one experience, by session (1 + the
    /// number of visible entries with a higher score), from the cached
    /// scores (read whole when not cached).
    pub async fn ranks_of(
        &self,
        experience_id: &str,
        entries: &[&score_attempts::Model],
    ) -> StoreResult<HashMap<String, i64>> {
        let mut cache = self.rank_cache.0.lock().await;
        self.cached_ranks(&mut cache, experience_id, entries).await
    }

    async fn cached_ranks(
        &self,
        cache: &mut HashMap<String, CachedScores>,
        experience_id: &str,
        entries: &[&score_attempts::Model],
    ) -> StoreResult<HashMap<String, i64>> {
        let read = match cache.get(experience_id) {
            None => true,
            Some(scores) => scores.stale && scores.read_at.elapsed() >= self.rank_refresh,
        };
        if read {
            let rows = self
                .db()
                .query_all_raw(self.sql(
                    "SELECT score FROM score_attempts WHERE experience_id = $1 AND hidden = FALSE",
                    vec![experience_id.into()],
                ))
                .await?;
            let mut sorted = rows
                .iter()
                .map(|r| r.try_get_by_index::<f64>(0))
                .collect::<Result<Vec<f64>, _>>()?;
            sorted.sort_by(f64::total_cmp);
            cache.insert(experience_id.to_owned(), CachedScores::read(sorted));
        }
        let scores = cache.get_mut(experience_id).expect("just cached");
        scores.used = std::time::Instant::now();
        Ok(entries
            .iter()
            .map(|e| (e.session_id.clone(), scores.rank(e.score)))
            .collect())
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

/// The cache learns what the registration changed: a new visible entry,
/// less the visible one it replaced (a repeat by the same saga changes
/// nothing). An experience not cached is read whole when ranked.
fn learn_changes(
    cache: &mut HashMap<String, CachedScores>,
    before: &HashMap<String, score_attempts::Model>,
    rows: &[score_attempts::Model],
) {
    for row in rows {
        let Some(scores) = cache.get_mut(&row.experience_id) else {
            continue;
        };
        match before.get(&row.session_id) {
            Some(old) if old.saga_id == row.saga_id && !old.hidden => {}
            Some(old) => {
                if !old.hidden {
                    scores.remove(old.score);
                }
                scores.insert(row.score);
            }
            None => scores.insert(row.score),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CachedScores;

    fn cached(scores: &[f64]) -> CachedScores {
        let mut c = CachedScores::read(Vec::new());
        scores.iter().for_each(|s| c.insert(*s));
        c
    }

    #[test]
    fn ranks_count_the_higher_scores_and_ties_share_a_rank() {
        let c = cached(&[10.0, 30.0, 20.0, 30.0]);
        assert_eq!(c.sorted, vec![10.0, 20.0, 30.0, 30.0]);
        assert_eq!(c.rank(30.0), 1);
        assert_eq!(c.rank(20.0), 3);
        assert_eq!(c.rank(10.0), 4);
        assert_eq!(c.rank(99.0), 1);
        assert_eq!(c.rank(0.0), 5);
    }

    #[test]
    fn a_removed_score_leaves_once_and_an_absent_one_changes_nothing() {
        let mut c = cached(&[30.0, 30.0, 20.0]);
        c.remove(30.0);
        assert_eq!(c.sorted, vec![20.0, 30.0]);
        c.remove(25.0);
        assert_eq!(c.sorted, vec![20.0, 30.0]);
        assert_eq!(c.rank(20.0), 2);
    }
}
