//! A booth display; `last_seq` numbers its outbox events.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "terminals")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub experience_id: String,
    pub name: String,
    /// SHA-256 of the terminal's token (`domain::keys::token_hash`).
    pub token_hash: String,
    pub last_seq: i64,
    /// The highest `seq` a display acknowledged; never goes down.
    pub acked_seq: i64,
    pub created_at_ms: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
