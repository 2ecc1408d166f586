//! One connected display socket, on whichever instance holds it.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "terminal_presence")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub socket_id: String,
    pub terminal_id: String,
    pub instance_id: String,
    pub connected_at_ms: i64,
    /// Refreshed by the instance while the socket lives; an old value means
    /// the instance is gone.
    pub seen_at_ms: i64,
    /// The highest `seq` sent to this display.
    pub sent_seq: i64,
    /// The highest `seq` this display acknowledged.
    pub acked_seq: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
