//! The guests' data in the database: the result link's lookup, the
//! gallery's pages, hiding, forgetting a session (erasure and retention),
//! giving up input photos, the purge queue of objects still to delete, the
//! export's pages and what /ops shows as held.
//!
//! Forgetting is two steps, each its own short transaction, so a crash at
//! any point leaves nothing half-done:
//! 1. [`Store::forget_session`] blanks the nickname and prompts, what the
//!    AI made and what its failures said (the contents of the sagas, their
//!    calls and the result, the calls' errors, the abort's detail), takes
//!    the ranking entry out, gives up the session's photos, queues every
//!    object those contents named in `kept_objects` (where each keep also
//!    listed its files before writing them: [`Store::record_kept_objects`])
//!    and marks the session `objects_left`, fenced: only while no saga of
//!    the session runs (status not SUBMITTING, every saga COMPLETED or
//!    ABORTED). A forgotten session takes no submission and no retry after.
//! 2. Whoever claims it ([`Store::claim_purges`], a lease like the
//!    sagas') deletes its objects from the media store (every file listed
//!    for any of its sagas: a fan-out's calls, a keep cut short,
//!    thumbnails; and its photos), then [`Store::purged`] drops the list.
//!    Deleting an object twice is harmless, so a crash between the two
//!    only repeats the deletes.
//!
//! Photos (kept a shorter time) go the same way: [`Store::give_up_photos`]
//! marks them `deleted_at_ms` once their saga ended (no saga reads a
//! given-up photo), then the purge deletes the object and marks it gone.

use std::collections::HashSet;

use sea_orm::{ConnectionTrait, QueryResult, Statement, Value};
use serde_json::Value as Json;

use super::entities::{experiences, sessions};
use super::rows::{SqlType, ValueRows};
use super::webhooks::HookEvent;
use super::{new_id, Store, StoreError, StoreResult, WriteTx};
use crate::domain::audit::AuditEntry;
use crate::domain::guests::{kept_keys, ForgottenBy};
use crate::domain::policy::EpochMs;
use crate::domain::saga::{Step, TransitionError};
use crate::domain::webhook::WebhookEvent;

/// A completed result as its link, the gallery and the export show it.
#[derive(Debug, Clone)]
pub struct SharedResult {
    pub session_id: String,
    pub nickname: String,
    pub content: Json,
    pub score: Option<f64>,
    pub rank: Option<i32>,
    pub completed_at_ms: EpochMs,
}

/// What a result link leads to.
#[derive(Debug)]
pub enum ShareLookup {
    Live {
        result: SharedResult,
        experience: Box<experiences::Model>,
    },
    /// Its data was forgotten (erased, or its retention ended).
    Gone(ForgottenBy),
    /// No such link, or its session has no result (yet).
    Unknown,
}

/// Where a gallery page or an export page starts: after this result
/// (newest first for the gallery, oldest first for the export).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultCursor {
    pub completed_at_ms: EpochMs,
    pub session_id: String,
}

/// Which results a page holds, and in which order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResultOrder {
    /// Opted in and not hidden, newest first.
    GalleryNewestFirst,
    /// Every one, oldest first.
    ExportOldestFirst,
}

/// What [`Store::forget_session`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forget {
    /// Forgotten now; `displays` terminals were told (`session.removed`).
    Forgotten { displays: usize },
    /// It was already (a repeated erasure).
    Already,
    /// A saga of the session still runs (cancel it first).
    Running,
}

/// Objects one purge claim deletes, and what to mark after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeItem {
    /// A forgotten session's kept results and photos.
    Session { id: String, keys: Vec<String> },
    /// A given-up photo.
    Photo { id: String, key: String },
}

/// What an experience holds now, for /ops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// Photos not given up, and their bytes.
    pub photos: i64,
    pub photo_bytes: i64,
    /// Completed results not forgotten.
    pub results: i64,
    /// Sessions forgotten (by retention or erasure).
    pub forgotten: i64,
    /// When the next session's data is due (None: nothing due).
    pub next_due_ms: Option<EpochMs>,
    /// When the next photo is due.
    pub next_photo_due_ms: Option<EpochMs>,
}

/// The sessions whose kept files wait to be deleted: the literal term of
/// the partial index `sessions_with_objects_left` (SQLite uses a partial
/// index only for a query that carries its WHERE term; a bound `$n`
/// would not).
const OBJECTS_LEFT: &str = "objects_left = TRUE";

/// The sessions that are not running: no submission under way, and no
/// saga of theirs between its start and its end.
const AT_REST: &str = "s.status <> 'SUBMITTING' AND NOT EXISTS (SELECT 1 FROM sagas g \
     WHERE g.session_id = s.id AND g.step NOT IN ('COMPLETED', 'ABORTED'))";

/// When a session's data is due: `retention` after the event closes, or
/// after the session last changed when that is later
/// (`domain::guests::results_due_at` in SQL).
const DUE_AT: &str = "(CASE WHEN e.closes_at_ms IS NOT NULL AND e.closes_at_ms > s.updated_at_ms \
     THEN e.closes_at_ms ELSE s.updated_at_ms END) + e.retention_ms";

/// When a photo is due: `photo_retention` after its saga ended.
const PHOTO_DUE_AT: &str = "g.updated_at_ms + e.photo_retention_ms";

/// The completed results shown anywhere public: not forgotten.
const RESULT_FIELDS: &str = "s.id, s.nickname, r.content, r.score, r.rank, r.created_at_ms";

fn result_of(row: &QueryResult) -> StoreResult<SharedResult> {
    let content: String = row.try_get_by_index(2)?;
    Ok(SharedResult {
        session_id: row.try_get_by_index(0)?,
        nickname: row.try_get_by_index(1)?,
        content: serde_json::from_str(&content).unwrap_or(Json::Null),
        score: row.try_get_by_index(3)?,
        rank: row.try_get_by_index(4)?,
        completed_at_ms: row.try_get_by_index(5)?,
    })
}

impl Store {
    /// What the result link `share_id` leads to.
    pub async fn shared_result(&self, share_id: &str) -> StoreResult<ShareLookup> {
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
        let Some(session) = sessions::Entity::find()
            .filter(sessions::Column::ShareId.eq(share_id))
            .one(self.db())
            .await?
        else {
            return Ok(ShareLookup::Unknown);
        };
        if let Some(by) = session.forgotten_by.as_deref().and_then(ForgottenBy::of) {
            return Ok(ShareLookup::Gone(by));
        }
        let row = self
            .db()
            .query_one_raw(self.sql(
                &format!(
                    "SELECT {RESULT_FIELDS} FROM results r JOIN sessions s ON s.id = r.session_id \
                     WHERE s.id = $1 AND s.status = 'COMPLETED' \
                     ORDER BY r.created_at_ms DESC LIMIT 1"
                ),
                vec![session.id.clone().into()],
            ))
            .await?;
        let Some(row) = row else {
            return Ok(ShareLookup::Unknown);
        };
        let experience = experiences::Entity::find_by_id(session.experience_id.clone())
            .one(self.db())
            .await?
            .ok_or(StoreError::NotFound("experience"))?;
        Ok(ShareLookup::Live {
            result: result_of(&row)?,
            experience: Box::new(experience),
        })
    }

    /// Up to `limit` results of the experience's gallery, newest first,
    /// after `before`: completed, not opted out, not hidden, not
    /// forgotten (a rejected one is ABORTED, one in review is not yet
    /// COMPLETED).
    pub async fn gallery_page(
        &self,
        experience_id: &str,
        limit: u64,
        before: Option<&ResultCursor>,
    ) -> StoreResult<Vec<SharedResult>> {
        self.results_page(
            experience_id,
            limit,
            before,
            ResultOrder::GalleryNewestFirst,
        )
        .await
    }

    /// Up to `limit` results of the experience for its export, oldest
    /// first, after `after`: every completed result not forgotten (an
    /// operator's export includes hidden and opted-out ones: they are the
    /// organiser's to keep until the retention ends).
    pub async fn export_page(
        &self,
        experience_id: &str,
        limit: u64,
        after: Option<&ResultCursor>,
    ) -> StoreResult<Vec<SharedResult>> {
        self.results_page(experience_id, limit, after, ResultOrder::ExportOldestFirst)
            .await
    }

    /// One keyset page of the experience's completed, not forgotten
    /// results, in `order`, past `cursor`.
    async fn results_page(
        &self,
        experience_id: &str,
        limit: u64,
        cursor: Option<&ResultCursor>,
        order: ResultOrder,
    ) -> StoreResult<Vec<SharedResult>> {
        let mut values: Vec<Value> = vec![experience_id.into(), (limit as i64).into()];
        let (visible, past, direction) = match order {
            ResultOrder::GalleryNewestFirst => {
                values.extend([true.into(), false.into()]);
                (" AND s.in_gallery = $3 AND s.hidden = $4", "<", "DESC")
            }
            ResultOrder::ExportOldestFirst => ("", ">", "ASC"),
        };
        let past = match cursor {
            Some(cursor) => {
                let at = values.len() + 1;
                values.push(cursor.completed_at_ms.into());
                values.push(cursor.session_id.clone().into());
                format!(
                    " AND (r.created_at_ms {past} ${at} OR (r.created_at_ms = ${at} \
                     AND r.session_id {past} ${}))",
                    at + 1
                )
            }
            None => String::new(),
        };
        let rows = self
            .db()
            .query_all_raw(self.sql(
                &format!(
                    "SELECT {RESULT_FIELDS} FROM results r JOIN sessions s ON s.id = r.session_id \
                     WHERE s.experience_id = $1 AND s.status = 'COMPLETED' \
                     AND s.forgotten_at_ms IS NULL{visible}{past} \
                     ORDER BY r.created_at_ms {direction}, r.session_id {direction} LIMIT $2"
                ),
                values,
            ))
            .await?;
        rows.iter().map(result_of).collect()
    }

    /// Hides (or shows again) a session's result in the gallery and on the
    /// displays. Hiding tells every display of the experience
    /// (`session.removed`, through the outbox). None: no such session;
    /// else the displays told.
    pub async fn set_hidden(
        &self,
        session_id: &str,
        hidden: bool,
        audit: Option<&AuditEntry>,
        now: EpochMs,
    ) -> StoreResult<Option<usize>> {
        let tx = self.write_tx().await?;
        let Some(row) = tx
            .query_one_raw(self.sql(
                "SELECT experience_id FROM sessions WHERE id = $1",
                vec![session_id.into()],
            ))
            .await?
        else {
            return Ok(None);
        };
        let experience_id: String = row.try_get_by_index(0)?;
        let changed = tx
            .execute_raw(self.sql(
                "UPDATE sessions SET hidden = $2 WHERE id = $1 AND hidden = $3",
                vec![session_id.into(), hidden.into(), (!hidden).into()],
            ))
            .await?
            .rows_affected()
            > 0;
        let displays = if hidden && changed {
            tell_displays_removed(self, &tx, &experience_id, session_id, now).await?
        } else {
            0
        };
        if let (true, Some(audit)) = (changed, audit) {
            let audit = audit.clone().of_experience(Some(experience_id.clone()));
            super::audit::record(&*tx, &audit, now).await?;
        }
        tx.commit().await?;
        Ok(Some(displays))
    }

    /// Forgets a session's personal data: nickname and prompts blanked,
    /// the ranking entry taken out (an erasure) or made anonymous
    /// (retention), its photos given up, its objects queued for deletion,
    /// and, for an erasure, every display of the experience told
    /// (`session.removed`). Fenced: nothing changes while a saga of the
    /// session runs ([`Forget::Running`]).
    pub async fn forget_session(
        &self,
        session_id: &str,
        by: ForgottenBy,
        audit: Option<&AuditEntry>,
        now: EpochMs,
    ) -> StoreResult<Forget> {
        let tx = self.write_tx().await?;
        let row = tx
            .query_one_raw(self.sql(
                &format!(
                    "UPDATE sessions SET nickname = '', forgotten_at_ms = $2, forgotten_by = $3, \
                     objects_left = $4, purge_claim_until_ms = NULL \
                     WHERE id = $1 AND forgotten_at_ms IS NULL AND id IN \
                     (SELECT s.id FROM sessions s WHERE s.id = $1 AND {AT_REST}) \
                     RETURNING experience_id"
                ),
                vec![
                    session_id.into(),
                    now.into(),
                    by.as_str().into(),
                    true.into(),
                ],
            ))
            .await?;
        let Some(row) = row else {
            let state = tx
                .query_one_raw(self.sql(
                    "SELECT forgotten_at_ms FROM sessions WHERE id = $1",
                    vec![session_id.into()],
                ))
                .await?;
            return match state {
                None => Err(StoreError::NotFound("session")),
                Some(r) if r.try_get_by_index::<Option<i64>>(0)?.is_some() => Ok(Forget::Already),
                Some(_) => Ok(Forget::Running),
            };
        };
        let experience_id: String = row.try_get_by_index(0)?;
        queue_named_objects(self, &tx, session_id).await?;
        // The saga moves to the top of the operators' recent activity,
        // marked forgotten (its row stays for the statistics).
        tx.execute_raw(self.sql(
            "UPDATE sagas SET prompt = '', abort_detail = NULL, \
             content = CASE WHEN content IS NULL THEN NULL ELSE '[]' END, updated_at_ms = $2 \
             WHERE session_id = $1",
            vec![session_id.into(), now.into()],
        ))
        .await?;
        for statement in [
            "UPDATE ai_calls SET error = NULL, \
             content = CASE WHEN content IS NULL THEN NULL ELSE '[]' END \
             WHERE saga_id IN (SELECT id FROM sagas WHERE session_id = $1)",
            "UPDATE results SET content = '[]' WHERE session_id = $1",
            // Deliveries about the session, sent or not (an erasure's
            // `session.removed` is written after this).
            "DELETE FROM webhook_deliveries WHERE session_id = $1",
            super::mails::FORGET_MAILS[0],
            super::mails::FORGET_MAILS[1],
        ] {
            tx.execute_raw(self.sql(statement, vec![session_id.into()]))
                .await?;
        }
        let ranking = if by.is_erasure() {
            "DELETE FROM score_attempts WHERE session_id = $1"
        } else {
            "UPDATE score_attempts SET nickname = '' WHERE session_id = $1"
        };
        tx.execute_raw(self.sql(ranking, vec![session_id.into()]))
            .await?;
        tx.execute_raw(self.sql(
            "UPDATE photos SET deleted_at_ms = $2 WHERE session_id = $1 AND deleted_at_ms IS NULL",
            vec![session_id.into(), now.into()],
        ))
        .await?;
        // The outbox keeps a display's past frames for a week: those of
        // this session say only that it was removed from now on (a display
        // that reads them again drops it; `seq` stays, so nothing skips).
        tx.execute_raw(self.sql(
            "UPDATE terminal_events SET payload = $2, event_type = 'session.removed' \
             WHERE session_id = $1 AND event_type <> 'session.removed'",
            vec![
                session_id.into(),
                removed_payload(session_id).to_string().into(),
            ],
        ))
        .await?;
        let displays = if by.is_erasure() {
            tell_displays_removed(self, &tx, &experience_id, session_id, now).await?
        } else {
            0
        };
        if let Some(audit) = audit {
            let audit = audit.clone().of_experience(Some(experience_id.clone()));
            super::audit::record(&*tx, &audit, now).await?;
        }
        tx.commit().await?;
        if by.is_erasure() {
            self.wipe_log().await;
        }
        // The ranking changed under the cache.
        self.invalidate_ranks(Some(std::slice::from_ref(&experience_id)))
            .await;
        Ok(Forget::Forgotten { displays })
    }

    /// SQLite: the write-ahead log copied into the file and cut to nothing,
    /// so the data a forgetting overwrote is not left in the log's older
    /// frames: after each erasure, and once after a cleanup round's
    /// forgettings (not once per session). A checkpoint that readers hold
    /// back is left for the next one (SQLite's own, or the next wipe).
    pub async fn wipe_log(&self) {
        if self.backend() != sea_orm::DbBackend::Sqlite {
            return;
        }
        if let Err(e) = self
            .db()
            .execute_unprepared("PRAGMA wal_checkpoint(TRUNCATE)")
            .await
        {
            tracing::warn!(error = %e, "the write-ahead log was not cut after a forgetting");
        }
    }

    /// Up to `limit` sessions whose retention ended by `now` and that are
    /// not running, oldest first.
    pub async fn sessions_due(&self, now: EpochMs, limit: u64) -> StoreResult<Vec<String>> {
        let rows = self
            .db()
            .query_all_raw(self.sql(
                &format!(
                    "SELECT s.id FROM sessions s JOIN experiences e ON e.id = s.experience_id \
                     WHERE s.forgotten_at_ms IS NULL AND {DUE_AT} <= $1 AND {AT_REST} \
                     ORDER BY s.updated_at_ms LIMIT $2"
                ),
                vec![now.into(), (limit as i64).into()],
            ))
            .await?;
        rows.iter()
            .map(|r| Ok(r.try_get_by_index::<String>(0)?))
            .collect()
    }

    /// Gives up to `limit` photos whose `photo_retention` ended by `now`
    /// (counted from when the saga that read them ended), in one fenced
    /// statement: a photo whose saga runs again (an operator's retry) is
    /// kept. Returns how many were given up.
    pub async fn give_up_photos(&self, now: EpochMs, limit: u64) -> StoreResult<u64> {
        let tx = self.write_tx().await?;
        let given = tx
            .execute_raw(self.sql(
                &format!(
                    "UPDATE photos SET deleted_at_ms = $1 WHERE deleted_at_ms IS NULL AND id IN \
                     (SELECT p.id FROM photos p JOIN sagas g ON g.photo_id = p.id \
                      JOIN experiences e ON e.id = g.experience_id \
                      WHERE p.deleted_at_ms IS NULL AND g.step IN ('COMPLETED', 'ABORTED') \
                      AND {PHOTO_DUE_AT} <= $1 \
                      AND NOT EXISTS (SELECT 1 FROM sagas h WHERE h.photo_id = p.id \
                          AND h.step NOT IN ('COMPLETED', 'ABORTED')) \
                      ORDER BY g.updated_at_ms LIMIT $2) \
                     AND NOT EXISTS (SELECT 1 FROM sagas h WHERE h.photo_id = photos.id \
                         AND h.step NOT IN ('COMPLETED', 'ABORTED'))"
                ),
                vec![now.into(), (limit as i64).into()],
            ))
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(given)
    }

    /// How the database runs the claim of sessions to purge (PostgreSQL
    /// `EXPLAIN`, SQLite `EXPLAIN QUERY PLAN`), one line per plan node. For
    /// tests and diagnostics: it must read `sessions_with_objects_left`,
    /// not every session.
    pub async fn session_purges_plan(&self, now: EpochMs, limit: u64) -> StoreResult<String> {
        self.plan_of(false, |prefix| {
            self.session_purges_statement(prefix, now, 60_000, limit)
        })
        .await
    }

    /// The claim of up to `limit` sessions whose files wait, for
    /// `lease_ms`, oldest forgotten first, after `prefix` (empty, or an
    /// `EXPLAIN`).
    fn session_purges_statement(
        &self,
        prefix: &str,
        now: EpochMs,
        lease_ms: i64,
        limit: u64,
    ) -> Statement {
        let lock = if self.is_postgres() {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        self.sql(
            &format!(
                "{prefix} UPDATE sessions SET purge_claim_until_ms = $1 WHERE id IN \
                 (SELECT id FROM sessions WHERE {OBJECTS_LEFT} \
                  AND (purge_claim_until_ms IS NULL OR purge_claim_until_ms < $2) \
                  ORDER BY forgotten_at_ms LIMIT $3{lock}) RETURNING id"
            ),
            vec![(now + lease_ms).into(), now.into(), (limit as i64).into()],
        )
    }

    /// Claims up to `limit` purges for `lease_ms` (another instance takes
    /// none of them meanwhile; a claim of an instance that died runs out
    /// and is taken again): forgotten sessions with objects left, then
    /// given-up photos whose object is not yet gone.
    pub async fn claim_purges(
        &self,
        now: EpochMs,
        lease_ms: i64,
        limit: u64,
    ) -> StoreResult<Vec<PurgeItem>> {
        let lock = if self.is_postgres() {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        let tx = self.write_tx().await?;
        let session_ids: Vec<String> = tx
            .query_all_raw(self.session_purges_statement("", now, lease_ms, limit))
            .await?
            .iter()
            .map(|r| r.try_get_by_index::<String>(0))
            .collect::<Result<_, _>>()?;
        let mut items = Vec::new();
        for id in session_ids {
            let keys = session_object_keys(self, &tx, &id).await?;
            items.push(PurgeItem::Session { id, keys });
        }
        let room = limit.saturating_sub(items.len() as u64);
        if room > 0 {
            let photos = tx
                .query_all_raw(self.sql(
                    &format!(
                        "UPDATE photos SET purge_claim_until_ms = $1 WHERE id IN \
                         (SELECT id FROM photos WHERE deleted_at_ms IS NOT NULL \
                          AND object_gone = $2 \
                          AND (purge_claim_until_ms IS NULL OR purge_claim_until_ms < $3) \
                          ORDER BY deleted_at_ms LIMIT $4{lock}) RETURNING id, object_key"
                    ),
                    vec![
                        (now + lease_ms).into(),
                        false.into(),
                        now.into(),
                        (room as i64).into(),
                    ],
                ))
                .await?;
            for row in photos {
                items.push(PurgeItem::Photo {
                    id: row.try_get_by_index(0)?,
                    key: row.try_get_by_index(1)?,
                });
            }
        }
        tx.commit().await?;
        Ok(items)
    }

    /// Claims the purge of one forgotten session now (an erasure deletes
    /// its objects at once); None when it has none left or another
    /// instance holds it.
    pub async fn claim_session_purge(
        &self,
        session_id: &str,
        now: EpochMs,
        lease_ms: i64,
    ) -> StoreResult<Option<PurgeItem>> {
        let tx = self.write_tx().await?;
        let claimed = tx
            .execute_raw(self.sql(
                "UPDATE sessions SET purge_claim_until_ms = $1 WHERE id = $2 AND objects_left = $3 \
                 AND (purge_claim_until_ms IS NULL OR purge_claim_until_ms < $4)",
                vec![
                    (now + lease_ms).into(),
                    session_id.into(),
                    true.into(),
                    now.into(),
                ],
            ))
            .await?
            .rows_affected();
        let item = if claimed > 0 {
            Some(PurgeItem::Session {
                id: session_id.to_owned(),
                keys: session_object_keys(self, &tx, session_id).await?,
            })
        } else {
            None
        };
        tx.commit().await?;
        Ok(item)
    }

    /// Marks a purge done once its objects are deleted: a session's list
    /// of kept objects is dropped, its contents name none (`[]`; a session
    /// forgotten before the list existed kept them until now) and its
    /// photos are gone; a photo is gone.
    pub async fn purged(&self, item: &PurgeItem) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        match item {
            PurgeItem::Session { id, .. } => {
                for statement in [
                    "DELETE FROM kept_objects WHERE saga_id IN \
                     (SELECT id FROM sagas WHERE session_id = $1)",
                    "UPDATE sagas SET content = '[]' WHERE session_id = $1 AND content IS NOT NULL",
                    "UPDATE ai_calls SET content = '[]' WHERE content IS NOT NULL \
                     AND saga_id IN (SELECT id FROM sagas WHERE session_id = $1)",
                    "UPDATE results SET content = '[]' WHERE session_id = $1",
                ] {
                    tx.execute_raw(self.sql(statement, vec![id.clone().into()]))
                        .await?;
                }
                tx.execute_raw(self.sql(
                    "UPDATE photos SET object_gone = $2, deleted_at_ms = COALESCE(deleted_at_ms, $3) \
                     WHERE session_id = $1",
                    vec![id.clone().into(), true.into(), 0i64.into()],
                ))
                .await?;
                tx.execute_raw(self.sql(
                    "UPDATE sessions SET objects_left = $2, purge_claim_until_ms = NULL \
                     WHERE id = $1",
                    vec![id.clone().into(), false.into()],
                ))
                .await?;
            }
            PurgeItem::Photo { id, .. } => {
                tx.execute_raw(self.sql(
                    "UPDATE photos SET object_gone = $2, purge_claim_until_ms = NULL WHERE id = $1",
                    vec![id.clone().into(), true.into()],
                ))
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// What the experience holds now, and when its next data is due.
    pub async fn held(&self, experience_id: &str) -> StoreResult<Held> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                "SELECT \
                 (SELECT COUNT(*) FROM photos p JOIN sessions s ON s.id = p.session_id \
                  WHERE s.experience_id = $1 AND p.deleted_at_ms IS NULL), \
                 (SELECT CAST(COALESCE(SUM(p.bytes), 0) AS BIGINT) FROM photos p JOIN sessions s ON s.id = p.session_id \
                  WHERE s.experience_id = $1 AND p.deleted_at_ms IS NULL), \
                 (SELECT COUNT(*) FROM sessions s WHERE s.experience_id = $1 \
                  AND s.status = 'COMPLETED' AND s.forgotten_at_ms IS NULL), \
                 (SELECT COUNT(*) FROM sessions s WHERE s.experience_id = $1 \
                  AND s.forgotten_at_ms IS NOT NULL)",
                vec![experience_id.into()],
            ))
            .await?
            .ok_or(StoreError::NotFound("experience"))?;
        let next_due = self
            .db()
            .query_one_raw(self.sql(
                &format!(
                    "SELECT MIN({DUE_AT}) FROM sessions s JOIN experiences e \
                     ON e.id = s.experience_id WHERE s.experience_id = $1 \
                     AND s.forgotten_at_ms IS NULL"
                ),
                vec![experience_id.into()],
            ))
            .await?;
        let next_photo_due = self
            .db()
            .query_one_raw(self.sql(
                &format!(
                    "SELECT MIN({PHOTO_DUE_AT}) FROM photos p JOIN sagas g ON g.photo_id = p.id \
                     JOIN experiences e ON e.id = g.experience_id WHERE g.experience_id = $1 \
                     AND p.deleted_at_ms IS NULL AND g.step IN ('COMPLETED', 'ABORTED')"
                ),
                vec![experience_id.into()],
            ))
            .await?;
        let min_of = |row: Option<QueryResult>| -> StoreResult<Option<i64>> {
            Ok(match row {
                Some(r) => r.try_get_by_index::<Option<i64>>(0)?,
                None => None,
            })
        };
        Ok(Held {
            photos: row.try_get_by_index(0)?,
            photo_bytes: row.try_get_by_index(1)?,
            results: row.try_get_by_index(2)?,
            forgotten: row.try_get_by_index(3)?,
            next_due_ms: min_of(next_due)?,
            next_photo_due_ms: min_of(next_photo_due)?,
        })
    }

    /// Sessions of the experience whose nickname contains `text` (any
    /// case), newest first: how an operator finds the session an e-mailed
    /// erasure request names.
    pub async fn sessions_by_nickname(
        &self,
        experience_id: Option<&str>,
        text: &str,
        limit: u64,
    ) -> StoreResult<Vec<sessions::Model>> {
        use sea_orm::sea_query::{Expr, ExprTrait, Func};
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
        let pattern = format!(
            "%{}%",
            text.to_lowercase()
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_")
        );
        let mut query = sessions::Entity::find()
            .filter(
                Expr::expr(Func::lower(Expr::col(sessions::Column::Nickname)))
                    .like(sea_orm::sea_query::LikeExpr::new(pattern).escape('\\')),
            )
            .filter(sessions::Column::ForgottenAtMs.is_null());
        if let Some(id) = experience_id {
            query = query.filter(sessions::Column::ExperienceId.eq(id));
        }
        Ok(query
            .order_by_desc(sessions::Column::CreatedAtMs)
            .limit(limit)
            .all(self.db())
            .await?)
    }

    /// Lists `keys` as the objects a keep of saga `saga_id` is about to
    /// write (`kept_objects`), fenced on the saga's lock token while it is
    /// AI_PENDING: a worker that lost its lease lists nothing and must
    /// write nothing. The fence holds the saga's row until the commit,
    /// which an abort (and so an erasure) then waits for: the erasure's
    /// purge sees the list. Listing a key twice (a keep run again) is
    /// harmless.
    pub async fn record_kept_objects(
        &self,
        saga_id: &str,
        token: &str,
        keys: &[String],
    ) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        let wanted = [(saga_id.to_owned(), token.to_owned(), keys.to_vec())];
        if list_kept_under_lease(&tx, &wanted).await?.is_empty() {
            return Err(TransitionError::LeaseLost.into());
        }
        tx.commit().await?;
        Ok(())
    }
}

/// Lists the keys each saga's keep is about to write (`(saga id, lock
/// token, keys)`), for the sagas still AI_PENDING under that token; the
/// others (their lease lost) list nothing. Returns the sagas listed.
///
/// The fence holds each saga's row until the commit without writing it:
/// `FOR SHARE` on PostgreSQL, so an abort (and the erasure or retention
/// purge after it) waits for the list and then sees it; on SQLite the
/// write transaction is the only writer while it runs. No new row version
/// is made for a listing; the lease is renewed by the supervisor's
/// renewals (docs/BENCHMARKS.md §30).
pub(super) async fn list_kept_under_lease(
    tx: &WriteTx,
    wanted: &[(String, String, Vec<String>)],
) -> StoreResult<HashSet<String>> {
    let held = hold_pending(tx, wanted).await?;
    let listed: Vec<(String, String)> = wanted
        .iter()
        .filter(|(saga_id, _, _)| held.contains(saga_id))
        .flat_map(|(saga_id, _, keys)| keys.iter().map(|k| (k.clone(), saga_id.clone())))
        .collect();
    list_kept_objects(tx, &listed).await?;
    Ok(held)
}

/// The sagas of `wanted` at AI_PENDING under the given token, held (see
/// [`list_kept_under_lease`]).
async fn hold_pending(
    tx: &WriteTx,
    wanted: &[(String, String, Vec<String>)],
) -> StoreResult<HashSet<String>> {
    if wanted.is_empty() {
        return Ok(HashSet::new());
    }
    let mut source = ValueRows::new(&[SqlType::Text, SqlType::Text]);
    for (saga_id, token, _) in wanted {
        source.push([saga_id.clone().into(), token.clone().into()]);
    }
    let backend = tx.get_database_backend();
    let mut values = Vec::new();
    let source = source.source(backend, 1, &mut values);
    let hold = if backend == sea_orm::DbBackend::Postgres {
        " FOR SHARE OF sagas"
    } else {
        ""
    };
    let found = tx
        .query_all_raw(super::sql_for(
            backend,
            &format!(
                "WITH v(id, token) AS ({source}) \
                 SELECT sagas.id FROM sagas JOIN v ON sagas.id = v.id \
                 WHERE sagas.step = '{pending}' AND sagas.lock_token = v.token{hold}",
                pending = Step::AiPending.as_str(),
            ),
            values,
        ))
        .await?;
    found
        .iter()
        .map(|r| r.try_get_by_index::<String>(0))
        .collect::<Result<_, _>>()
        .map_err(Into::into)
}

/// Rows of [`list_kept_objects`] per statement: two cells each, well under
/// SQLite's limit on a statement's parameters.
const KEPT_PER_STATEMENT: usize = 500;

/// Lists each `(object_key, saga_id)` as an object of that saga (once per
/// key): one statement for up to [`KEPT_PER_STATEMENT`] of them, so a
/// batch of keeps lists all its files in one round trip.
async fn list_kept_objects(tx: &WriteTx, listed: &[(String, String)]) -> StoreResult<()> {
    let backend = tx.get_database_backend();
    for chunk in listed.chunks(KEPT_PER_STATEMENT) {
        let mut rows = ValueRows::new(&[SqlType::Text, SqlType::Text]);
        for (key, saga_id) in chunk {
            rows.push([key.clone().into(), saga_id.clone().into()]);
        }
        let mut values = Vec::new();
        let source = rows.source(backend, 1, &mut values);
        tx.execute_raw(super::sql_for(
            backend,
            &format!(
                "INSERT INTO kept_objects (object_key, saga_id) {source} \
                 ON CONFLICT (object_key) DO NOTHING"
            ),
            values,
        ))
        .await?;
    }
    Ok(())
}

/// The kept objects the contents of a session's rows name, each with the
/// saga whose row names it: its sagas', their calls' (a fan-out keeps
/// each call's files the moment it succeeds, also when the saga fails
/// after) and its result's.
async fn named_objects(
    store: &Store,
    tx: &WriteTx,
    session_id: &str,
) -> StoreResult<Vec<(String, String)>> {
    let mut named = Vec::new();
    for statement in [
        "SELECT id, content FROM sagas WHERE session_id = $1 AND content IS NOT NULL",
        "SELECT c.saga_id, c.content FROM ai_calls c JOIN sagas g ON g.id = c.saga_id \
         WHERE g.session_id = $1 AND c.content IS NOT NULL",
        "SELECT saga_id, content FROM results WHERE session_id = $1",
    ] {
        for row in tx
            .query_all_raw(store.sql(statement, vec![session_id.into()]))
            .await?
        {
            let saga_id: String = row.try_get_by_index(0)?;
            let text: String = row.try_get_by_index(1)?;
            if let Ok(content) = serde_json::from_str::<Json>(&text) {
                named.extend(
                    kept_keys(&content)
                        .into_iter()
                        .map(|k| (saga_id.clone(), k)),
                );
            }
        }
    }
    Ok(named)
}

/// Lists every object the session's contents name in `kept_objects`,
/// before the contents are blanked.
async fn queue_named_objects(store: &Store, tx: &WriteTx, session_id: &str) -> StoreResult<()> {
    let listed: Vec<(String, String)> = named_objects(store, tx, session_id)
        .await?
        .into_iter()
        .map(|(saga_id, key)| (key, saga_id))
        .collect();
    list_kept_objects(tx, &listed).await
}

/// The media-store keys a forgotten session leaves: every object listed
/// for its sagas, what its contents still name (a session forgotten
/// before the list existed), and its photos not yet gone.
async fn session_object_keys(
    store: &Store,
    tx: &WriteTx,
    session_id: &str,
) -> StoreResult<Vec<String>> {
    let mut keys: Vec<String> = named_objects(store, tx, session_id)
        .await?
        .into_iter()
        .map(|(_, key)| key)
        .collect();
    for row in tx
        .query_all_raw(store.sql(
            "SELECT k.object_key FROM kept_objects k JOIN sagas g ON g.id = k.saga_id \
             WHERE g.session_id = $1",
            vec![session_id.into()],
        ))
        .await?
    {
        keys.push(row.try_get_by_index(0)?);
    }
    for row in tx
        .query_all_raw(store.sql(
            "SELECT object_key FROM photos WHERE session_id = $1 AND object_gone = $2",
            vec![session_id.into(), false.into()],
        ))
        .await?
    {
        keys.push(row.try_get_by_index(0)?);
    }
    keys.sort_unstable();
    keys.dedup();
    Ok(keys)
}

/// The `session.removed` frame of a session.
fn removed_payload(session_id: &str) -> Json {
    serde_json::json!({"type": "session.removed", "session_id": session_id})
}

/// Appends `session.removed` to the outbox of every display of the
/// experience, and for the webhook endpoints that take it, inside the
/// caller's transaction; returns how many displays.
async fn tell_displays_removed(
    store: &Store,
    tx: &WriteTx,
    experience_id: &str,
    session_id: &str,
    now: EpochMs,
) -> StoreResult<usize> {
    let terminals: Vec<String> = tx
        .query_all_raw(store.sql(
            "SELECT id FROM terminals WHERE experience_id = $1 ORDER BY id",
            vec![experience_id.into()],
        ))
        .await?
        .iter()
        .map(|r| r.try_get_by_index::<String>(0))
        .collect::<Result<_, _>>()?;
    let payload = removed_payload(session_id);
    let rows: Vec<_> = terminals
        .iter()
        // Each row its own id where the saga's would go: the event ends
        // no saga, and may repeat (hidden, shown, hidden again).
        .map(|terminal| Store::event_row(terminal, session_id, &new_id(), payload.clone(), now))
        .collect();
    Store::append_events(tx, rows).await?;
    let hook = HookEvent {
        event: WebhookEvent::SessionRemoved,
        session_id: session_id.to_owned(),
        experience_id: experience_id.to_owned(),
        data: serde_json::json!({}),
    };
    store.enqueue_hooks(tx, vec![hook], now).await?;
    Ok(terminals.len())
}
