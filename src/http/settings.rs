//! `PATCH /api/experiences/{slug}` (admin): changing an experience while
//! the event runs. Any subset of its settings; the rest stay.
//!
//! The patch is laid over the experience as it stands and the whole is
//! checked by the same rules as a new experience
//! ([`super::operators::validate_experience`]), so a setting means the
//! same whether given at creation or later. Only the columns the patch
//! names are written (two operators changing different settings at once
//! both keep theirs), with the audit record of the change (each setting
//! before and after) in the same transaction. `credits_add` tops up
//! what is left at that moment.
//!
//! The instances act on it at once: the dispatchers here and on every
//! other instance are woken (a raised `max_in_flight` starts queued work
//! in the same round; a lowered one starts nothing until the running jobs
//! are below it, and cancels none), and so are the review actors (a
//! changed review timeout). Every other setting is read where it is used.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Map, Value};

use super::auth::signed_in;
use super::body::parse_json;
use super::error::ApiError;
use super::idempotency::{operator_write, Reply};
use super::operators::{experience_json, stored_pin, validate_experience, ExperienceBody};
use super::AppState;
use crate::domain::audit::{changes_detail, AuditAction, AuditEntry};
use crate::domain::guests::MIN_PIN_DIGITS;
use crate::store::entities::experiences;

/// Settings fixed at creation: changing them is 409 with the reason.
const FIXED: [(&str, &str); 4] = [
    ("slug", "the slug is in every printed QR code and link; create a new experience for a new slug"),
    ("kind", "the kind decides what every saga of the experience asks the AI; create a new experience for another kind"),
    ("ai_calls", "running sagas were planned with this number of AI calls; create a new experience to change it"),
    ("min_success", "running sagas were planned with this number of AI calls; create a new experience to change it"),
];

/// What a patch may name (besides `credits_add`), each with the columns
/// it writes.
const SETTINGS: [(&str, &[experiences::Column]); 29] = {
    use experiences::Column as C;
    [
        ("title", &[C::Title]),
        ("max_in_flight", &[C::MaxInFlight]),
        ("provider", &[C::Provider]),
        ("weight", &[C::Weight]),
        ("credits", &[C::Credits]),
        ("closes_at", &[C::ClosesAtMs]),
        ("locale", &[C::Locale]),
        (
            "review",
            &[C::Review, C::ReviewTimeoutMs, C::ReviewTimeoutAction],
        ),
        (
            "review_timeout",
            &[C::ReviewTimeoutMs, C::ReviewTimeoutAction],
        ),
        ("review_timeout_action", &[C::ReviewTimeoutAction]),
        ("input", &[C::Input]),
        ("photo_max_px", &[C::PhotoMaxPx]),
        ("max_photos_per_session", &[C::MaxPhotosPerSession]),
        ("gallery", &[C::Gallery, C::GalleryPinHash]),
        ("gallery_pin", &[C::GalleryPinHash]),
        ("photo_retention", &[C::PhotoRetentionMs]),
        ("retention", &[C::RetentionMs]),
        ("notice", &[C::Notice]),
        ("consent_required", &[C::ConsentRequired]),
        ("display_share_qr", &[C::ShareQrMs]),
        ("brand_fit", &[C::BrandFit]),
        ("brand_caption", &[C::BrandCaption]),
        ("brand_applies_to", &[C::BrandAppliesTo]),
        ("prints_per_guest", &[C::PrintsPerGuest]),
        ("print_review", &[C::PrintReview]),
        ("mails_per_guest", &[C::MailsPerGuest]),
        ("mail_attach", &[C::MailAttach]),
        ("mail_consent", &[C::MailConsent]),
        ("mail_marketing", &[C::MailMarketing]),
    ]
};

/// A top-up: added to the credits left when the change commits.
const CREDITS_ADD: &str = "credits_add";

/// The patch, read and checked against the experience: the columns to
/// write, and the top-up.
struct Change {
    columns: experiences::ActiveModel,
    credits_add: Option<i64>,
}

/// The patch's fields, refused when one is unknown (400) or fixed (409).
fn patch_fields(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let patch: Map<String, Value> = parse_json(body)?;
    for name in patch.keys() {
        if let Some((_, why)) = FIXED.iter().find(|(fixed, _)| fixed == name) {
            return Err(ApiError::Conflict(format!("{name} cannot change: {why}")));
        }
        if name != CREDITS_ADD && !SETTINGS.iter().any(|(setting, _)| setting == name) {
            let names: Vec<&str> = SETTINGS.iter().map(|(n, _)| *n).collect();
            return Err(ApiError::InvalidJson(format!(
                "unknown field {:?}; an experience's settings are {} and {CREDITS_ADD}",
                name.chars().take(40).collect::<String>(),
                names.join(", ")
            )));
        }
    }
    if patch.is_empty() {
        return Err(ApiError::Validation(
            "the patch names no setting to change".into(),
        ));
    }
    Ok(patch)
}

/// The top-up, when the patch has one: a whole number from 1 to 10^9.
fn credits_add(patch: &Map<String, Value>) -> Result<Option<i64>, ApiError> {
    match patch.get(CREDITS_ADD) {
        None => Ok(None),
        Some(value) => value
            .as_i64()
            .filter(|n| (1..=1_000_000_000).contains(n))
            .map(Some)
            .ok_or_else(|| {
                ApiError::Validation(format!(
                    "{CREDITS_ADD} must be a whole number from 1 to 1000000000"
                ))
            }),
    }
}

/// Lays `patch` over `current` and checks the whole like a new
/// experience; the columns the patch names, set to their checked values.
fn change_of(
    current: &experiences::Model,
    patch: &Map<String, Value>,
    providers: &[crate::store::providers::ProviderRow],
) -> Result<Change, ApiError> {
    let mut merged = experience_json(current);
    let fields = merged
        .as_object_mut()
        .expect("an experience is a JSON object");
    // What the API shows but a patch does not set: the brand's files are
    // set by their own requests.
    for shown_only in ["id", "created_at", "brand_overlay", "brand_logo"] {
        fields.remove(shown_only);
    }
    // A review turned off drops its timeout unless the patch says more.
    if patch.get("review").and_then(Value::as_str) == Some("off") {
        fields.insert("review_timeout".into(), Value::Null);
        fields.insert("review_timeout_action".into(), Value::Null);
    }
    let keeps_pin = current.gallery_pin_hash.is_some() && !patch.contains_key("gallery_pin");
    for (name, value) in patch.iter().filter(|(name, _)| *name != CREDITS_ADD) {
        fields.insert(name.clone(), value.clone());
    }
    // The PIN is stored only as its hash: a PIN gallery that stays one
    // keeps it (a stand-in passes the check, and the hash is put back).
    // A new PIN is hashed by the caller ([`stored_pin`]).
    let stays_pin = fields.get("gallery").and_then(Value::as_str) == Some("pin");
    if stays_pin && keeps_pin {
        fields.insert("gallery_pin".into(), json!("0".repeat(MIN_PIN_DIGITS)));
    }
    let body: ExperienceBody = serde_json::from_value(merged.clone())
        .map_err(|e| wrong_type(&merged, current, patch, e))?;
    let mut new = validate_experience(body, providers)?;
    if stays_pin && keeps_pin {
        new.guests.gallery_pin_hash = current.gallery_pin_hash.clone();
    }
    let checked = experiences::ActiveModel {
        id: sea_orm::ActiveValue::Unchanged(current.id.clone()),
        slug: sea_orm::ActiveValue::NotSet,
        title: sea_orm::Set(new.title),
        kind: sea_orm::ActiveValue::NotSet,
        ai_calls: sea_orm::ActiveValue::NotSet,
        min_success: sea_orm::ActiveValue::NotSet,
        max_in_flight: sea_orm::Set(new.max_in_flight),
        credits: sea_orm::Set(new.credits),
        closes_at_ms: sea_orm::Set(new.closes_at_ms),
        locale: sea_orm::Set(new.locale),
        provider: sea_orm::Set(new.provider),
        weight: sea_orm::Set(new.weight),
        review: sea_orm::Set(new.review.as_str().to_owned()),
        review_timeout_ms: sea_orm::Set(new.review_timeout_ms),
        review_timeout_action: sea_orm::Set(
            new.review_timeout_action.map(|d| d.as_str().to_owned()),
        ),
        created_at_ms: sea_orm::ActiveValue::NotSet,
        input: sea_orm::Set(new.input.as_str().to_owned()),
        photo_max_px: sea_orm::Set(new.photo_max_px),
        max_photos_per_session: sea_orm::Set(new.max_photos_per_session),
        gallery: sea_orm::Set(new.guests.gallery.as_str().to_owned()),
        gallery_pin_hash: sea_orm::Set(new.guests.gallery_pin_hash),
        photo_retention_ms: sea_orm::Set(new.guests.photo_retention_ms),
        retention_ms: sea_orm::Set(new.guests.retention_ms),
        notice: sea_orm::Set(new.guests.notice),
        consent_required: sea_orm::Set(new.guests.consent_required),
        share_qr_ms: sea_orm::Set(new.guests.share_qr_ms),
        brand_fit: sea_orm::Set(new.outputs.brand_fit.as_str().to_owned()),
        brand_caption: sea_orm::Set(new.outputs.brand_caption),
        brand_applies_to: sea_orm::Set(new.outputs.brand_applies_to.to_column()),
        brand_overlay_key: sea_orm::ActiveValue::NotSet,
        brand_overlay_width: sea_orm::ActiveValue::NotSet,
        brand_overlay_height: sea_orm::ActiveValue::NotSet,
        brand_logo_key: sea_orm::ActiveValue::NotSet,
        brand_version: sea_orm::ActiveValue::NotSet,
        prints_per_guest: sea_orm::Set(new.outputs.prints_per_guest),
        print_review: sea_orm::Set(new.outputs.print_review),
        mails_per_guest: sea_orm::Set(new.outputs.mails_per_guest),
        mail_attach: sea_orm::Set(new.outputs.mail_attach),
        mail_consent: sea_orm::Set(new.outputs.mail_consent),
        mail_marketing: sea_orm::Set(new.outputs.mail_marketing),
    };
    Ok(Change {
        columns: only_named(checked, patch),
        credits_add: credits_add(patch)?,
    })
}

/// The 422 of a patch whose merge does not read as settings: it names the
/// first patched setting that alone breaks the reading.
fn wrong_type(
    merged: &Value,
    current: &experiences::Model,
    patch: &Map<String, Value>,
    e: serde_json::Error,
) -> ApiError {
    let base = experience_json(current);
    let culprit = patch.keys().find(|name| {
        let mut alone = merged.clone();
        for other in patch.keys().filter(|other| other != name) {
            alone[other.as_str()] = base.get(other.as_str()).cloned().unwrap_or(Value::Null);
        }
        alone.as_object_mut().map(|o| o.remove(CREDITS_ADD));
        serde_json::from_value::<ExperienceBody>(alone).is_err()
    });
    match culprit {
        Some(name) => ApiError::Validation(format!("{name} has the wrong type: {e}")),
        None => ApiError::Validation(format!("a setting has the wrong type: {e}")),
    }
}

/// `checked` with every column the patch does not name left unset.
fn only_named(
    checked: experiences::ActiveModel,
    patch: &Map<String, Value>,
) -> experiences::ActiveModel {
    use sea_orm::{ActiveModelTrait, IdenStatic, Iterable};
    let named: Vec<&str> = SETTINGS
        .iter()
        .filter(|(name, _)| patch.contains_key(*name))
        .flat_map(|(_, columns)| columns.iter().map(|c| c.as_str()))
        .collect();
    let mut change = checked;
    for column in experiences::Column::iter() {
        if column.as_str() != experiences::Column::Id.as_str() && !named.contains(&column.as_str())
        {
            change.not_set(column);
        }
    }
    change
}

/// The audit detail of a change: each setting the API shows, before and
/// after, when it differs (a PIN is named, never shown).
fn describe(before: &experiences::Model, after: &experiences::Model) -> String {
    let (old, new) = (experience_json(before), experience_json(after));
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "none".to_owned(),
        other => other.to_string(),
    };
    let mut changes: Vec<(&str, String, String)> = SETTINGS
        .iter()
        .filter(|(name, _)| *name != "gallery_pin")
        .map(|(name, _)| (*name, text(&old[*name]), text(&new[*name])))
        .collect();
    changes.push((
        "gallery_pin",
        before.gallery_pin_hash.clone().unwrap_or_default(),
        after.gallery_pin_hash.clone().unwrap_or_default(),
    ));
    changes_detail(&changes).unwrap_or_else(|| "no change".to_owned())
}

/// `PATCH /api/experiences/{slug}`
#[utoipa::path(
    patch,
    path = "/api/experiences/{slug}",
    tag = "operators",
    summary = "Change an experience's settings while the event runs (admin).",
    description = "Any subset of the settings of `POST /api/experiences` except `slug`, `kind`, `ai_calls` and `min_success` (409: new QR codes, or running sagas planned with them), plus `credits_add` (a top-up added to what is left when the change commits). The whole is checked like a new experience; only the settings named are written, with an audit record of each before and after. Every instance acts on it within about a second: a raised `max_in_flight` starts queued work at once; a lowered one starts nothing until the running jobs are below it and cancels none; a moved `provider` applies to sagas not yet submitted to the AI (jobs already running stay counted on their account); `closes_at` in the past closes it now, `null` reopens it.",
    security(("operator" = [])),
    params(
        ("slug" = String, Path, description = "The experience's slug."),
        super::schema::OperatorKey,
    ),
    request_body = super::schema::ExperiencePatch,
    responses(
        (status = 200, description = "The whole experience after the change (or the replay of an earlier answer).", body = super::schema::Experience, headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with the same Idempotency-Key."))),
        (status = 400, description = "`invalid_json`: the body is not a JSON object, or names an unknown field; `idempotency_key_required`: the Idempotency-Key is malformed.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin changes settings.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such experience.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: `slug`, `kind`, `ai_calls` or `min_success` cannot change (the message says why), or a top-up of unlimited credits; `request_in_progress`: the same Idempotency-Key is still running.", body = super::schema::ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: a setting breaks its rule (the message names it: a `gallery_pin` of fewer than 6 digits among them); `idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
        (status = 503, description = "`busy`: every place for hashing a gallery PIN is taken; try again (`Retry-After`).", body = super::schema::ErrorBody),
    )
)]
pub async fn update_experience(
    state: web::Data<AppState>,
    req: HttpRequest,
    slug: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let (state, operator, slug) = (&state, &operator, slug.as_str());
    operator_write(state, &req, payload, |body| async move {
        let patch = patch_fields(&body)?;
        let current = state.experience(slug).await?;
        let providers = state.store.providers().await?;
        let mut change = change_of(&current, &patch, &providers)?;
        let new_pin = patch.get("gallery_pin").and_then(Value::as_str);
        if let Some(hash) = stored_pin(state, new_pin).await? {
            change.columns.gallery_pin_hash = sea_orm::Set(Some(hash));
        }
        let audit = AuditEntry::new(
            operator,
            AuditAction::ExperienceUpdate,
            format!("experience:{}", current.slug),
        );
        let updated = state
            .store
            .update_experience(
                &current.id,
                change.columns,
                change.credits_add,
                &audit,
                describe,
                state.clock.now_ms(),
            )
            .await?;
        // Every instance's dispatcher claims with the new settings now;
        // the review actors re-read their timeouts.
        state.wakeups.saga_work();
        state.wakeups.review_changed();
        tracing::info!(
            experience = %updated.slug, operator = %operator.name,
            detail = %describe(&current, &updated),
            "experience settings changed"
        );
        Ok(Reply {
            status: actix_web::http::StatusCode::OK,
            body: experience_json(&updated),
        })
    })
    .await
}
