//! An organiser's webhook endpoint: where events go, which ones, its
//! sealed signing secret, and whether it is still sent to.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhooks")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub url: String,
    /// The event types it takes, comma-separated.
    pub events: String,
    /// The `whsec_…` secret, sealed with the server's key.
    pub secret: String,
    pub enabled: bool,
    /// Why it was disabled (it kept failing).
    pub disabled_reason: Option<String>,
    /// Since when its deliveries have been failing (None: the last one
    /// succeeded).
    pub failing_since_ms: Option<i64>,
    pub created_at_ms: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
