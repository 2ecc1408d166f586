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
    /// The result link's id (`/r/{share_id}`): random, not the token.
    #[sea_orm(unique)]
    pub share_id: Option<String>,
    /// False when the guest opted out of the gallery.
    pub in_gallery: bool,
    /// An operator hid the result from the gallery and the displays.
    pub hidden: bool,
    /// The guest ticked the experience's consent box.
    pub consented: bool,
    /// When its nickname, prompt and result were blanked (retention or
    /// erasure); the row stays for the statistics.
    pub forgotten_at_ms: Option<i64>,
    /// `retention`, `participant` or `operator`.
    pub forgotten_by: Option<String>,
    /// Its kept files still wait to be deleted from the media store.
    pub objects_left: bool,
    /// The lease of the instance deleting them.
    pub purge_claim_until_ms: Option<i64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
