//! Uploaded photos and the secrets every instance shares: the `photos`
//! rows (where a photo's bytes are in the media store, whose it is), how
//! many one session may hold, the orphans the cleanup sweep may delete,
//! and `server_keys`.

use std::collections::HashMap;

use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect,
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

/// The name of the secret that signs photo URLs and derives result keys.
pub const MEDIA_SIGNING: &str = "media_signing";

impl Store {
    /// The photos `session_id` holds now (not given up), the one
    /// `replaces` names not counted if it is unsubmitted: what an upload
    /// checks before it reads its body.
    pub async fn photos_held(&self, session_id: &str, replaces: Option<&str>) -> StoreResult<u64> {
        Ok(held_photos(self.db(), session_id, replaces).await?)
    }

    /// Records an uploaded photo (its bytes are in the media store
    /// already) within `bound`, in one transaction that holds the
    /// session's row: the photo it replaces is given up, and past the
    /// limit nothing is recorded (`StoreError::PhotoLimit`; the caller
    /// deletes the object it put).
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
                Expr::col(sessions::Column::UpdatedAtMs).into(),
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

    /// The photo stored at `object_key`, unless it was given up.
    pub async fn photo_by_key(&self, object_key: &str) -> StoreResult<Option<photos::Model>> {
        Ok(photos::Entity::find()
            .filter(photos::Column::ObjectKey.eq(object_key))
            .filter(photos::Column::DeletedAtMs.is_null())
            .one(self.db())
            .await?)
    }

    /// The session of each named photo that exists (and was not given up).
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
            .into_tuple()
            .all(self.db())
            .await?;
        Ok(rows.into_iter().collect())
    }

    /// Up to `limit` photos uploaded before `before_ms` that no saga names,
    /// oldest first: what the orphan sweep deletes.
    pub async fn orphan_photos(
        &self,
        before_ms: EpochMs,
        limit: u64,
    ) -> StoreResult<Vec<photos::Model>> {
        Ok(photos::Entity::find()
            .filter(photos::Column::CreatedAtMs.lt(before_ms))
            .filter(
                photos::Column::Id.not_in_subquery(
                    Query::select()
                        .column(sagas::Column::PhotoId)
                        .from(sagas::Entity)
                        .and_where(Expr::col(sagas::Column::PhotoId).is_not_null())
                        .to_owned(),
                ),
            )
            .order_by_asc(photos::Column::CreatedAtMs)
            .limit(limit)
            .all(self.db())
            .await?)
    }

    /// Forgets an orphan photo's row, unless a saga names it by now (a
    /// submission that came while the sweep looked). True when it was
    /// forgotten: only then may its object go.
    pub async fn forget_orphan_photo(&self, photo_id: &str) -> StoreResult<bool> {
        let tx = self.write_tx().await?;
        let deleted = photos::Entity::delete_many()
            .filter(photos::Column::Id.eq(photo_id))
            .filter(
                photos::Column::Id.not_in_subquery(
                    Query::select()
                        .column(sagas::Column::PhotoId)
                        .from(sagas::Entity)
                        .and_where(Expr::col(sagas::Column::PhotoId).eq(photo_id))
                        .to_owned(),
                ),
            )
            .exec(&*tx)
            .await?;
        tx.commit().await?;
        Ok(deleted.rows_affected > 0)
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
