//! A print station: one IPP printer, the media it prints on, the
//! experiences it serves, and what it said when last asked.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "printers")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub name: String,
    /// `ipp://host:port/path` (or `ipps://`).
    pub uri: String,
    /// The PWG media name it prints on (`na_index-4x6_4x6in`).
    pub media: String,
    pub colour: bool,
    /// The ids of the experiences it prints for, comma separated.
    pub experiences: String,
    /// `idle`, `processing`, `stopped`, `unreachable` or `unknown`.
    pub state: String,
    /// `printer-state-reasons`, comma separated (`media-empty`, …).
    pub state_reasons: String,
    /// `document-format-supported`, comma separated.
    pub formats: String,
    /// The resolution it prints at.
    pub dpi: i32,
    pub checked_at_ms: Option<i64>,
    pub created_at_ms: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
