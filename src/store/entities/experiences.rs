//! An experience: one booth activity, its AI kind and its limits.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "experiences")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    #[sea_orm(unique)]
    pub slug: String,
    pub title: String,
    pub kind: String,
    pub ai_calls: i32,
    pub min_success: Option<i32>,
    pub max_in_flight: i32,
    pub credits: Option<i64>,
    pub closes_at_ms: Option<i64>,
    /// `en` or `ko`: the language of its human messages and page texts.
    pub locale: String,
    /// The AI provider (account) its jobs run on: a name from the
    /// providers file, `default` without one.
    pub provider: String,
    /// Its share of the provider's slots among the experiences with work
    /// (1 to 100).
    pub weight: i32,
    /// `off` or `before_display`: whether a person approves each AI
    /// result before the public screen shows it.
    pub review: String,
    /// How long an item may wait in review before `review_timeout_action`
    /// decides it (none: it waits for a person).
    pub review_timeout_ms: Option<i64>,
    /// `approve` or `reject`.
    pub review_timeout_action: Option<String>,
    pub created_at_ms: i64,
    /// What a participant sends: `prompt`, `photo` or `photo+prompt`.
    pub input: String,
    /// The long side a photo is downscaled to (on the phone and again on
    /// upload).
    pub photo_max_px: i32,
    /// The photos one session may have at once (not given up).
    pub max_photos_per_session: i32,
    /// `off`, `public` or `pin`: whether `/g/{slug}` shows its results.
    pub gallery: String,
    /// PBKDF2 of the gallery's PIN (`domain::guests::hash_pin`); never
    /// the PIN.
    pub gallery_pin_hash: Option<String>,
    /// How long an input photo is kept after its saga ends.
    pub photo_retention_ms: i64,
    /// How long results and personal fields are kept after `closes_at`
    /// (or after the session ended, without one).
    pub retention_ms: i64,
    /// The organiser's notice (JSON: locale to text), shown before the
    /// camera opens.
    #[sea_orm(column_type = "Text")]
    pub notice: Option<String>,
    /// A submission must say the guest ticked the consent box.
    pub consent_required: bool,
    /// How long a display shows the newest result's QR code (0: never).
    pub share_qr_ms: i64,
    /// `cover` or `fit`: how the brand's overlay is placed on a result.
    pub brand_fit: String,
    /// The line drawn along a branded result's foot (0 to 80 characters).
    pub brand_caption: Option<String>,
    /// Where the branded rendition is shown: any of `display`, `share`,
    /// `print`, comma separated.
    pub brand_applies_to: String,
    /// The overlay PNG's key in the media store, and its size.
    pub brand_overlay_key: Option<String>,
    pub brand_overlay_width: Option<i32>,
    pub brand_overlay_height: Option<i32>,
    /// The corner logo PNG's key in the media store.
    pub brand_logo_key: Option<String>,
    /// Raised by every change of the brand: an instance whose brand in
    /// memory is older reads it again.
    pub brand_version: i64,
    /// The prints one guest may ask for (0: guests cannot print).
    pub prints_per_guest: i32,
    /// Guests' prints wait for an operator's approval.
    pub print_review: bool,
    /// The addresses one guest may have their result mailed to (0: guests
    /// cannot ask for mail).
    pub mails_per_guest: i32,
    /// The mail carries the full file as an attachment.
    pub mail_attach: bool,
    /// The consent text shown with the mail field (JSON: locale to text);
    /// None: the built-in one.
    pub mail_consent: Option<String>,
    /// The marketing opt-in's text (JSON: locale to text); None: no
    /// opt-in is offered.
    pub mail_marketing: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
