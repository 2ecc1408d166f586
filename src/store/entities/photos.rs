//! An uploaded photo: where its bytes are in the media store and whose it
//! is. The bytes themselves never enter the database.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "photos")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub session_id: String,
    /// Its key in the media store (`p/<random>.jpg`).
    pub object_key: String,
    pub content_type: String,
    pub width: i32,
    pub height: i32,
    pub bytes: i64,
    pub created_at_ms: i64,
    /// When it was given up (retention or erasure): no saga reads it after.
    pub deleted_at_ms: Option<i64>,
    /// Its object is deleted from the media store.
    pub object_gone: bool,
    /// The lease of the instance deleting it.
    pub purge_claim_until_ms: Option<i64>,
    /// When the orphan sweep found it named by no saga: no submission may
    /// name it from then on (`store::photos::sweep_orphan_photos`).
    pub swept_at_ms: Option<i64>,
    /// The SHA-256 (hex) of the stored bytes (None for photos stored
    /// before it was recorded): the slot ledger copies it with a slot.
    pub sha256: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
