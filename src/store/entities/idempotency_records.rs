//! Idempotency-Key records, keyed by (scope, key).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "idempotency_records")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub scope: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub key: String,
    pub request_hash: String,
    pub state: String,
    pub response_status: Option<i32>,
    #[sea_orm(column_type = "Text")]
    pub response_body: Option<String>,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    /// The request holding an IN_PROGRESS record.
    pub owner: Option<String>,
    /// Its instance (PostgreSQL): a key whose instance is known dead is
    /// taken over at once.
    pub instance_id: Option<String>,
    /// Until when it holds it (its request timeout).
    pub locked_until_ms: Option<i64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
