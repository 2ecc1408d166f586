//! Ranking entries: at most one per session (unique `session_id`).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "score_attempts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub experience_id: String,
    #[sea_orm(unique)]
    pub session_id: String,
    pub saga_id: String,
    pub nickname: String,
    pub score: f64,
    /// The session's saga ended ABORTED after the entry was written.
    pub hidden: bool,
    pub created_at_ms: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
