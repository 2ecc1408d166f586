//! One AI call of a fan-out saga: its attempts, its job and its outcome.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "ai_calls")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub saga_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub call_index: i32,
    pub attempts: i32,
    /// RUNNING, SUCCEEDED or FAILED.
    pub status: String,
    pub job_id: Option<String>,
    pub submitted_at_ms: Option<i64>,
    /// The call's content list, JSON.
    #[sea_orm(column_type = "Text")]
    pub content: Option<String>,
    pub score: Option<f64>,
    #[sea_orm(column_type = "Text")]
    pub error: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
