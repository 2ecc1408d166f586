//! One mail of a session's result to one address: the address (personal
//! data, blanked when the session is forgotten), the consent it was asked
//! with, and how sending it went.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "mails")]
pub struct Model {
    /// The `email_id`; the mail's `Message-ID` is derived from it.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub session_id: String,
    pub experience_id: String,
    /// The guest's address; None once the session is forgotten.
    pub address: Option<String>,
    /// A keyed digest of the address, for the per-address bound.
    pub address_key: Option<String>,
    /// `ko` or `en`: the language it is written in.
    pub locale: String,
    /// The version of the consent text the guest agreed to.
    pub consent_notice: String,
    pub consent_at_ms: i64,
    /// The separate marketing opt-in.
    pub marketing: bool,
    pub marketing_at_ms: Option<i64>,
    /// `QUEUED`, `SENT`, `FAILED` or `CANCELED`.
    pub status: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub lease_token: Option<String>,
    pub lease_until_ms: Option<i64>,
    pub next_attempt_at_ms: i64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub sent_at_ms: Option<i64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
