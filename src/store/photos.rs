//! Uploaded photos and the values every instance shares: the `photos`
//! rows (where a photo's bytes are in the media store, whose it is), how
//! many one session may hold, the orphans the cleanup sweep gives up, and
//! `server_keys` (the secret result keys are derived under, the
//! fingerprint of the server's own secret).

use std::collections::HashMap;

use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter,
    QuerySelect,
};

use super::entities::{photos, sagas, sessions};
use super::{Store, StoreError, StoreResult};
use crate::domain::policy::EpochMs;

/// A photo as the upload stored it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewPhoto {
    pub id: String,
    pub session_id: String,
    pub object_key: String,
    pub content_type: String,
    pub width: u32,
    pub height: u32,
    pub bytes: u64,
    /// The SHA-256 (hex) of the stored bytes: how the slot ledger knows
    /// the photo a job was sent without keeping the photo.
    pub sha256: String,
}

/// How many photos one session may hold, and the one a new upload
/// replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhotoBound {
    /// The experience's `max_photos_per_session`.
    pub max_per_session: i32,
    /// The session's unsubmitted photo this upload replaces: given up in
    /// the same transaction (a submitted one stays, and counts).
    pub replaces: Option<String>,
}

/// How long after the sweep marked a photo it is given up: longer than a
/// submission can take from reading the photo to committing the saga
/// that names it (a request runs at most `KEY_LEASE_MS`), so by then such
/// a saga is committed, or never will be.
pub const SWEEP_GRACE_MS: i64 = 2 * super::idempotency::KEY_LEASE_MS;

/// No saga names the photo `p`.
const UNNAMED: &str = "NOT EXISTS (SELECT 1 FROM sagas g WHERE g.photo_id = p.id)";

/// The name of the secret result object keys are derived under (made once
/// by the first instance, shared by all). Its name is historical: it signs
/// nothing since the server's own secret signs media URLs
/// (`media::secret`), and keeping it in the database gives nothing away
/// (the database holds every result's URL anyway).
pub const RESULT_KEYS: &str = "media_signing";

impl Store {
    /// The photos `session_id` holds now (not given up), the one
    /// `replaces` names not counted if it is unsubmitted: what an upload
    /// checks before it reads its body.
    pub async fn photos_held(&self, session_id: &str, replaces: Option<&str>) -> StoreResult<u64> {
        Ok(held_photos(self.db(), session_id, replaces).await?)
    }

    /// Records an uploaded photo within `bound` (its object is put after
    /// the row, so a photo past the bound stores nothing), in one
    /// transaction that holds the session's row: the photo it replaces is
    /// given up, and past the limit nothing is recorded
    /// (`StoreError::PhotoLimit`).
    pub async fn insert_photo(
        &self,
        new: NewPhoto,
        bound: &PhotoBound,
        now: EpochMs,
    ) -> StoreResult<photos::Model> {
        let tx = self.write_tx().await?;
        // Two uploads of one session wait for each other here, so both
        // cannot count the same room (SQLite's writes are one at a time).
        sessions::Entity::update_many()
            .col_expr(
                sessions::Column::UpdatedAtMs,
                Expr::col(sessions::Column::UpdatedAtMs),
            )
            .filter(sessions::Column::Id.eq(new.session_id.as_str()))
            .exec(&*tx)
            .await?;
        if let Some(replaced) = &bound.replaces {
            give_up_unsubmitted(&*tx, &new.session_id, replaced, now).await?;
        }
        let held = held_photos(&*tx, &new.session_id, None).await?;
        if held >= u64::try_from(bound.max_per_session).unwrap_or(0) {
            return Err(StoreError::PhotoLimit(bound.max_per_session));
        }
        let model = photos::ActiveModel {
            id: Set(new.id),
            session_id: Set(new.session_id),
            object_key: Set(new.object_key),
            content_type: Set(new.content_type),
            width: Set(new.width as i32),
            height: Set(new.height as i32),
            bytes: Set(new.bytes as i64),
            created_at_ms: Set(now),
            deleted_at_ms: Set(None),
            object_gone: Set(false),
            purge_claim_until_ms: Set(None),
            swept_at_ms: Set(None),
            sha256: Set(Some(new.sha256)),
        }
        .insert(&*tx)
        .await?;
        tx.commit().await?;
        Ok(model)
    }

    /// Gives up `photo` (an upload whose object could not be stored):
    /// no saga gets it, and the purge deletes whatever of its object the
    /// store kept.
    pub async fn give_up_photo(&self, photo: &photos::Model, now: EpochMs) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        give_up_unsubmitted(&*tx, &photo.session_id, &photo.id, now).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The photo `photo_id`, unless it was given up (retention or
    /// erasure): no saga and no reader gets a given-up photo, even while
    /// its object still waits for the purge.
    pub async fn photo(&self, photo_id: &str) -> StoreResult<Option<photos::Model>> {
        Ok(photos::Entity::find_by_id(photo_id.to_owned())
            .filter(photos::Column::DeletedAtMs.is_null())
            .one(self.db())
            .await?)
    }

    /// How the database finds the sagas that name `photo_id`
    /// ([`named_by_a_saga`]; PostgreSQL `EXPLAIN`, SQLite `EXPLAIN QUERY
    /// PLAN`), one line per plan node. For tests and diagnostics: it must
    /// read `sagas_by_photo`, not every saga.
    pub async fn photo_question_plan(&self, photo_id: &str) -> StoreResult<String> {
        let question = self.backend().build(&named_by_a_saga(photo_id));
        self.plan_of(false, |prefix| {
            sea_orm::Statement::from_sql_and_values(
                self.backend(),
                format!("{prefix} {}", question.sql),
                question.values.map(|v| v.0).unwrap_or_default(),
            )
        })
        .await
    }

    /// The photo stored at `object_key`, unless it was given up.
    pub async fn photo_by_key(&self, object_key: &str) -> StoreResult<Option<photos::Model>> {
        Ok(photos::Entity::find()
            .filter(photos::Column::ObjectKey.eq(object_key))
            .filter(photos::Column::DeletedAtMs.is_null())
            .one(self.db())
            .await?)
    }

    /// The session of each named photo that exists, was not given up and
    /// was not swept as an orphan (a submission never names a swept photo:
    /// see [`Self::sweep_orphan_photos`]).
    pub async fn photo_sessions(
        &self,
        photo_ids: &[String],
    ) -> StoreResult<HashMap<String, String>> {
        if photo_ids.is_empty() {
            return Ok(HashMap::new());
        }
        let rows: Vec<(String, String)> = photos::Entity::find()
            .select_only()
            .column(photos::Column::Id)
            .column(photos::Column::SessionId)
            .filter(photos::Column::Id.is_in(photo_ids.iter().cloned()))
            .filter(photos::Column::DeletedAtMs.is_null())
            .filter(photos::Column::SweptAtMs.is_null())
            .into_tuple()
            .all(self.db())
            .await?;
        Ok(rows.into_iter().collect())
    }

    /// The orphan sweep's first step: marks up to `limit` photos uploaded
    /// before `before_ms` that no saga names as swept at `now`, oldest
    /// first. From then on no new submission names them
    /// ([`Self::photo_sessions`]). Returns how many.
    pub async fn sweep_orphan_photos(
        &self,
        before_ms: EpochMs,
        now: EpochMs,
        limit: u64,
    ) -> StoreResult<u64> {
        self.write_one(self.sql(
            &format!(
                "UPDATE photos SET swept_at_ms = $2 WHERE id IN \
                 (SELECT p.id FROM photos p WHERE p.created_at_ms < $1 \
                  AND p.swept_at_ms IS NULL AND {UNNAMED} \
                  ORDER BY p.created_at_ms LIMIT $3)"
            ),
            vec![before_ms.into(), now.into(), (limit as i64).into()],
        ))
        .await
    }

    /// The sweep's second step, [`SWEEP_GRACE_MS`] after the first: a
    /// swept photo that a saga names by now stays (a submission that read
    /// it before the sweep committed since: it is no orphan); up to
    /// `limit` others are given up, so the purge deletes their objects.
    /// One transaction. Returns (given up, kept).
    pub async fn give_up_swept_photos(&self, now: EpochMs, limit: u64) -> StoreResult<(u64, u64)> {
        let tx = self.write_tx().await?;
        let kept = tx
            .execute_raw(self.sql(
                "UPDATE photos SET swept_at_ms = NULL WHERE swept_at_ms IS NOT NULL \
                 AND deleted_at_ms IS NULL \
                 AND EXISTS (SELECT 1 FROM sagas g WHERE g.photo_id = photos.id)",
                vec![],
            ))
            .await?
            .rows_affected();
        let given = tx
            .execute_raw(self.sql(
                &format!(
                    "UPDATE photos SET deleted_at_ms = $1 WHERE id IN \
                     (SELECT p.id FROM photos p WHERE p.swept_at_ms <= $2 \
                      AND p.deleted_at_ms IS NULL AND {UNNAMED} \
                      ORDER BY p.swept_at_ms LIMIT $3)"
                ),
                vec![
                    now.into(),
                    (now - SWEEP_GRACE_MS).into(),
                    (limit as i64).into(),
                ],
            ))
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok((given, kept))
    }

    /// The sweep's last step: forgets the rows of up to `limit` swept
    /// photos whose objects the purge deleted. Returns how many.
    pub async fn drop_swept_photos(&self, limit: u64) -> StoreResult<u64> {
        self.write_one(self.sql(
            &format!(
                "DELETE FROM photos WHERE id IN \
                 (SELECT p.id FROM photos p WHERE p.swept_at_ms IS NOT NULL \
                  AND p.object_gone = $1 AND {UNNAMED} LIMIT $2)"
            ),
            vec![true.into(), (limit as i64).into()],
        ))
        .await
    }

    /// The shared secret `name`: the one stored, or `fresh` stored now by
    /// this instance when none is yet (the first instance to start wins a
    /// race; every instance reads the winner's).
    pub async fn server_key(&self, name: &str, fresh: &str) -> StoreResult<String> {
        let insert =
            "INSERT INTO server_keys (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING";
        let tx = self.write_tx().await?;
        tx.execute_raw(self.sql(insert, vec![name.into(), fresh.into()]))
            .await?;
        tx.commit().await?;
        let select = "SELECT value FROM server_keys WHERE name = $1";
        let row = self
            .db()
            .query_one_raw(self.sql(select, vec![name.into()]))
            .await?
            .ok_or_else(|| {
                super::StoreError::Corrupt(format!("server key {name} was not stored"))
            })?;
        Ok(row.try_get("", "value")?)
    }

    /// Sets the shared value `name` to `value`, whatever it was.
    pub async fn replace_server_key(&self, name: &str, value: &str) -> StoreResult<()> {
        self.write_one(self.sql(
            "INSERT INTO server_keys (name, value) VALUES ($1, $2) \
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            vec![name.into(), value.into()],
        ))
        .await?;
        Ok(())
    }
}

/// The photos `session_id` holds (not given up), without `except` when it
/// is unsubmitted.
async fn held_photos<C: ConnectionTrait>(
    conn: &C,
    session_id: &str,
    except: Option<&str>,
) -> Result<u64, sea_orm::DbErr> {
    use sea_orm::PaginatorTrait;
    let mut held = photos::Entity::find()
        .filter(photos::Column::SessionId.eq(session_id))
        .filter(photos::Column::DeletedAtMs.is_null());
    if let Some(except) = except {
        held = held.filter(
            Expr::col(photos::Column::Id)
                .ne(except)
                .or(photos::Column::Id.in_subquery(named_by_a_saga(except))),
        );
    }
    held.count(conn).await
}

/// Gives up `photo_id` of `session_id` unless a saga names it.
async fn give_up_unsubmitted<C: ConnectionTrait>(
    conn: &C,
    session_id: &str,
    photo_id: &str,
    now: EpochMs,
) -> Result<(), sea_orm::DbErr> {
    photos::Entity::update_many()
        .col_expr(photos::Column::DeletedAtMs, Expr::value(now))
        .filter(photos::Column::Id.eq(photo_id))
        .filter(photos::Column::SessionId.eq(session_id))
        .filter(photos::Column::DeletedAtMs.is_null())
        .filter(photos::Column::Id.not_in_subquery(named_by_a_saga(photo_id)))
        .exec(conn)
        .await?;
    Ok(())
}

/// `SELECT photo_id FROM sagas WHERE photo_id = $photo_id`.
fn named_by_a_saga(photo_id: &str) -> sea_orm::sea_query::SelectStatement {
    Query::select()
        .column(sagas::Column::PhotoId)
        .from(sagas::Entity)
        .and_where(Expr::col(sagas::Column::PhotoId).eq(photo_id))
        .to_owned()
}
