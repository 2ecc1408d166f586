//! A participant's session; its token is their key.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "sessions")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub experience_id: String,
    pub terminal_id: Option<String>,
    pub nickname: String,
    /// SHA-256 of the participant's token (`domain::keys::token_hash`).
    #[sea_orm(unique)]
    pub participant_token_hash: String,
    pub status: String,
    pub abort_reason: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
