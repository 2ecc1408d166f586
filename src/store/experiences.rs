//! Experiences (a booth's AI activity and its limits) and terminals (the booth
//! displays that receive pushes).

use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter,
    QueryOrder,
};

use super::audit::record;
use super::entities::{experiences, terminals};
use super::{new_id, DbFailure, Store, StoreError, StoreResult};
use crate::domain::audit::AuditEntry;
use crate::domain::brand::{AppliesTo, BrandFit, BrandPart};
use crate::domain::guests::{Gallery, DEFAULT_PHOTO_RETENTION_MS, DEFAULT_RETENTION_MS};
use crate::domain::keys::token_hash;
use crate::domain::locale::Locale;
use crate::domain::media::InputKind;
use crate::domain::policy::EpochMs;
use crate::domain::review::{Decision, ReviewMode};

/// The settings that change how a brand draws: changing one raises the
/// brand's version.
const BRAND_SETTINGS: [experiences::Column; 3] = [
    experiences::Column::BrandFit,
    experiences::Column::BrandCaption,
    experiences::Column::BrandAppliesTo,
];

/// What an operator sends to create an experience.
#[derive(Debug, Clone)]
pub struct NewExperience {
    pub slug: String,
    pub title: String,
    pub kind: String,
    pub ai_calls: i32,
    pub min_success: Option<i32>,
    pub max_in_flight: i32,
    pub credits: Option<i64>,
    pub closes_at_ms: Option<EpochMs>,
    /// `en` or `ko`.
    pub locale: String,
    /// The provider's name (checked to exist by the caller).
    pub provider: String,
    /// 1 to 100.
    pub weight: i32,
    pub review: ReviewMode,
    pub review_timeout_ms: Option<i64>,
    /// Set exactly when `review_timeout_ms` is.
    pub review_timeout_action: Option<Decision>,
    /// What a participant sends.
    pub input: InputKind,
    /// The long side a photo is downscaled to.
    pub photo_max_px: i32,
    /// The photos one session may have at once.
    pub max_photos_per_session: i32,
    /// Its gallery, retention, notice and consent.
    pub guests: GuestSettings,
    /// Its brand's placement and caption, and its prints.
    pub outputs: OutputSettings,
}

/// What an experience puts out besides the result: how its brand is
/// drawn and where, and what its guests may print.
#[derive(Debug, Clone)]
pub struct OutputSettings {
    pub brand_fit: BrandFit,
    pub brand_caption: Option<String>,
    pub brand_applies_to: AppliesTo,
    pub prints_per_guest: i32,
    pub print_review: bool,
    pub mails_per_guest: i32,
    pub mail_attach: bool,
    /// JSON of locale to text; None: the built-in consent text.
    pub mail_consent: Option<String>,
    /// JSON of locale to text; None: no marketing opt-in.
    pub mail_marketing: Option<String>,
}

impl Default for OutputSettings {
    /// No caption, the overlay covering, on every surface; one print per
    /// guest, no review; three mails per guest, the file not attached,
    /// the built-in consent text and no marketing opt-in.
    fn default() -> Self {
        OutputSettings {
            brand_fit: BrandFit::default(),
            brand_caption: None,
            brand_applies_to: AppliesTo::default(),
            prints_per_guest: 1,
            print_review: false,
            mails_per_guest: 3,
            mail_attach: false,
            mail_consent: None,
            mail_marketing: None,
        }
    }
}

/// What an experience promises its guests: where their results are
/// shown, how long their data is kept, and what they are told first.
#[derive(Debug, Clone)]
pub struct GuestSettings {
    pub gallery: Gallery,
    /// PBKDF2 of the PIN (set exactly for `Gallery::Pin`).
    pub gallery_pin_hash: Option<String>,
    pub photo_retention_ms: i64,
    pub retention_ms: i64,
    /// JSON: locale to text.
    pub notice: Option<String>,
    pub consent_required: bool,
    pub share_qr_ms: i64,
}

impl Default for GuestSettings {
    fn default() -> Self {
        GuestSettings {
            gallery: Gallery::Off,
            gallery_pin_hash: None,
            photo_retention_ms: DEFAULT_PHOTO_RETENTION_MS,
            retention_ms: DEFAULT_RETENTION_MS,
            notice: None,
            consent_required: false,
            share_qr_ms: 0,
        }
    }
}

/// The language of an experience (English when it is gone).
pub(crate) async fn locale_of<C: ConnectionTrait>(
    conn: &C,
    experience_id: &str,
) -> StoreResult<Locale> {
    Ok(experiences::Entity::find_by_id(experience_id.to_owned())
        .one(conn)
        .await?
        .map(|e| Locale::of(&e.locale))
        .unwrap_or_default())
}

impl Store {
    /// Creates an experience; a taken slug is a `Conflict`.
    pub async fn create_experience(
        &self,
        new: NewExperience,
        audit: Option<&AuditEntry>,
        now: EpochMs,
    ) -> StoreResult<experiences::Model> {
        let taken = StoreError::Conflict(format!("slug {:?} is taken", new.slug));
        let tx = self.write_tx().await?;
        let model = experiences::ActiveModel {
            id: Set(new_id()),
            slug: Set(new.slug),
            title: Set(new.title),
            kind: Set(new.kind),
            ai_calls: Set(new.ai_calls),
            min_success: Set(new.min_success),
            max_in_flight: Set(new.max_in_flight),
            credits: Set(new.credits),
            closes_at_ms: Set(new.closes_at_ms),
            locale: Set(new.locale),
            provider: Set(new.provider),
            weight: Set(new.weight),
            review: Set(new.review.as_str().to_owned()),
            review_timeout_ms: Set(new.review_timeout_ms),
            review_timeout_action: Set(new.review_timeout_action.map(|d| d.as_str().to_owned())),
            created_at_ms: Set(now),
            input: Set(new.input.as_str().to_owned()),
            photo_max_px: Set(new.photo_max_px),
            max_photos_per_session: Set(new.max_photos_per_session),
            gallery: Set(new.guests.gallery.as_str().to_owned()),
            gallery_pin_hash: Set(new.guests.gallery_pin_hash),
            photo_retention_ms: Set(new.guests.photo_retention_ms),
            retention_ms: Set(new.guests.retention_ms),
            notice: Set(new.guests.notice),
            consent_required: Set(new.guests.consent_required),
            share_qr_ms: Set(new.guests.share_qr_ms),
            brand_fit: Set(new.outputs.brand_fit.as_str().to_owned()),
            brand_version: Set(i64::from(new.outputs.brand_caption.is_some())),
            brand_caption: Set(new.outputs.brand_caption),
            brand_applies_to: Set(new.outputs.brand_applies_to.to_column()),
            brand_overlay_key: Set(None),
            brand_overlay_width: Set(None),
            brand_overlay_height: Set(None),
            brand_logo_key: Set(None),
            prints_per_guest: Set(new.outputs.prints_per_guest),
            print_review: Set(new.outputs.print_review),
            mails_per_guest: Set(new.outputs.mails_per_guest),
            mail_attach: Set(new.outputs.mail_attach),
            mail_consent: Set(new.outputs.mail_consent),
            mail_marketing: Set(new.outputs.mail_marketing),
        }
        .insert(&*tx)
        .await
        // The unique index decides, so two racing creates cannot both pass.
        .map_err(|e| match StoreError::from(e) {
            e if e.failure() == DbFailure::Duplicate => taken,
            e => e,
        })?;
        if let Some(audit) = audit {
            let audit = audit.clone().of_experience(Some(model.id.clone()));
            record(&*tx, &audit, now).await?;
        }
        tx.commit().await?;
        Ok(model)
    }

    /// An operator's change of experience `id`'s settings, in one
    /// transaction with its audit record: the columns set in `change`
    /// (the others stay, so two operators changing different settings at
    /// once both keep theirs), then `credits_add` added to what is left
    /// now (a top-up never overwrites what submissions took meanwhile).
    /// The record's detail is `describe(before, after)`. `Conflict` when
    /// credits are unlimited and a top-up was asked.
    pub async fn update_experience(
        &self,
        id: &str,
        change: experiences::ActiveModel,
        credits_add: Option<i64>,
        audit: &AuditEntry,
        describe: impl Fn(&experiences::Model, &experiences::Model) -> String,
        now: EpochMs,
    ) -> StoreResult<experiences::Model> {
        let tx = self.write_tx().await?;
        let find = || experiences::Entity::find_by_id(id.to_owned()).one(&*tx);
        let before = find().await?.ok_or(StoreError::NotFound("experience"))?;
        if change.is_changed() {
            let brand_changed = BRAND_SETTINGS.iter().any(|c| !change.is_not_set(*c));
            let mut change = change;
            change.id = sea_orm::ActiveValue::Unchanged(id.to_owned());
            change.update(&*tx).await?;
            if brand_changed {
                self.raise_brand_version(&*tx, id).await?;
            }
        }
        if let Some(add) = credits_add {
            let topped = tx
                .execute_raw(self.sql(
                    "UPDATE experiences SET credits = credits + $1 \
                     WHERE id = $2 AND credits IS NOT NULL",
                    vec![add.into(), id.into()],
                ))
                .await?
                .rows_affected();
            if topped == 0 {
                return Err(StoreError::Conflict(
                    "this experience's credits are unlimited: set credits to a number to count them"
                        .into(),
                ));
            }
        }
        let after = find().await?.ok_or(StoreError::NotFound("experience"))?;
        let audit = audit
            .clone()
            .of_experience(Some(id.to_owned()))
            .detail(describe(&before, &after));
        record(&*tx, &audit, now).await?;
        tx.commit().await?;
        Ok(after)
    }

    /// Sets (Some) or removes (None) one of an experience's brand files:
    /// its key and, for the overlay, its size; the brand's version is
    /// raised in the same transaction, with the audit record.
    pub async fn set_brand_file(
        &self,
        id: &str,
        part: BrandPart,
        file: Option<(String, u32, u32)>,
        audit: &AuditEntry,
        now: EpochMs,
    ) -> StoreResult<experiences::Model> {
        let tx = self.write_tx().await?;
        let size = |pick: fn(&(String, u32, u32)) -> u32| {
            file.as_ref()
                .map(|f| i32::try_from(pick(f)).unwrap_or(i32::MAX))
        };
        let mut change = experiences::ActiveModel {
            id: sea_orm::ActiveValue::Unchanged(id.to_owned()),
            ..Default::default()
        };
        match part {
            BrandPart::Overlay => {
                change.brand_overlay_width = Set(size(|f| f.1));
                change.brand_overlay_height = Set(size(|f| f.2));
                change.brand_overlay_key = Set(file.map(|f| f.0));
            }
            BrandPart::Logo => change.brand_logo_key = Set(file.map(|f| f.0)),
        }
        let updated = experiences::Entity::update_many()
            .set(change)
            .filter(experiences::Column::Id.eq(id))
            .exec(&*tx)
            .await?;
        if updated.rows_affected == 0 {
            return Err(StoreError::NotFound("experience"));
        }
        self.raise_brand_version(&*tx, id).await?;
        record(&*tx, &audit.clone().of_experience(Some(id.to_owned())), now).await?;
        let after = experiences::Entity::find_by_id(id.to_owned())
            .one(&*tx)
            .await?
            .ok_or(StoreError::NotFound("experience"))?;
        tx.commit().await?;
        Ok(after)
    }

    /// Raises `id`'s brand version: every instance reads the brand again
    /// before its next branded result.
    async fn raise_brand_version<C: ConnectionTrait>(&self, conn: &C, id: &str) -> StoreResult<()> {
        conn.execute_raw(self.sql(
            "UPDATE experiences SET brand_version = brand_version + 1 WHERE id = $1",
            vec![id.into()],
        ))
        .await?;
        Ok(())
    }

    pub async fn experience_by_slug(&self, slug: &str) -> StoreResult<Option<experiences::Model>> {
        Ok(experiences::Entity::find()
            .filter(experiences::Column::Slug.eq(slug))
            .one(self.db())
            .await?)
    }

    pub async fn experience_by_id(&self, id: &str) -> StoreResult<Option<experiences::Model>> {
        Ok(experiences::Entity::find_by_id(id.to_owned())
            .one(self.db())
            .await?)
    }

    pub async fn list_experiences(&self) -> StoreResult<Vec<experiences::Model>> {
        Ok(experiences::Entity::find()
            .order_by_asc(experiences::Column::CreatedAtMs)
            .all(self.db())
            .await?)
    }

    pub async fn create_terminal(
        &self,
        experience_id: &str,
        name: &str,
        token: &str,
        audit: Option<&AuditEntry>,
        now: EpochMs,
    ) -> StoreResult<terminals::Model> {
        let tx = self.write_tx().await?;
        let model = terminals::ActiveModel {
            id: Set(new_id()),
            experience_id: Set(experience_id.to_owned()),
            name: Set(name.to_owned()),
            token_hash: Set(token_hash(token)),
            last_seq: Set(0),
            acked_seq: Set(0),
            created_at_ms: Set(now),
        }
        .insert(&*tx)
        .await?;
        if let Some(audit) = audit {
            let audit = AuditEntry {
                target: format!("terminal:{}", model.id),
                ..audit.clone().of_experience(Some(experience_id.to_owned()))
            };
            record(&*tx, &audit, now).await?;
        }
        tx.commit().await?;
        Ok(model)
    }

    pub async fn terminal(&self, id: &str) -> StoreResult<Option<terminals::Model>> {
        Ok(terminals::Entity::find_by_id(id.to_owned())
            .one(self.db())
            .await?)
    }
}
