//! One event for one webhook endpoint: its body, fixed when the event
//! happened, its `webhook-id` (the row's id) on every attempt, and how its
//! attempts went.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_deliveries")]
pub struct Model {
    /// The `webhook-id` header: the same on every attempt.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub webhook_id: String,
    /// The event's own id (the same for every endpoint).
    pub event_id: String,
    /// `session.completed`, `print.completed`, …
    pub event: String,
    /// The guest's session it is about (erasure removes its deliveries).
    pub session_id: Option<String>,
    /// The JSON body sent.
    pub payload: String,
    /// `PENDING`, `DELIVERED`, `FAILED`.
    pub status: String,
    pub attempts: i32,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub last_latency_ms: Option<i32>,
    pub lease_token: Option<String>,
    pub lease_until_ms: Option<i64>,
    pub next_attempt_at_ms: i64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub delivered_at_ms: Option<i64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
