//! The terminal outbox, numbered per terminal by `seq` once the relay has
//! seen the event committed.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "terminal_events")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub terminal_id: String,
    /// None from the saga's final transaction until the outbox relay numbers
    /// the event; then gapless and increasing per terminal.
    pub seq: Option<i64>,
    pub session_id: String,
    pub saga_id: String,
    pub event_type: String,
    #[sea_orm(column_type = "Text")]
    pub payload: String,
    pub created_at_ms: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
