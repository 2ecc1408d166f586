//! Experiences and terminals: creating them (bearer operator token), and
//! what the public pages read of an experience, with its booth QR codes.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::auth::{new_secret, operator_of, signed_in};
use super::body::{parse_json, rfc3339_ms};
use super::error::ApiError;
use super::idempotency::{operator_write, Reply};
use super::AppState;
use crate::clock::rfc3339;
use crate::domain::audit::{AuditAction, AuditEntry};
use crate::domain::brand::{checked_caption, AppliesTo, BrandFit};
use crate::domain::guests::{self, Gallery};
use crate::domain::locale::Locale;
use crate::domain::media::InputKind;
use crate::domain::review::{Decision, ReviewMode};
use crate::store::entities::experiences;
use crate::store::experiences::{GuestSettings, NewExperience, OutputSettings};

const KINDS: [&str; 5] = ["comic", "image", "video", "music", "score"];
/// The long side a photo is downscaled to unless the experience says.
pub const DEFAULT_PHOTO_MAX_PX: i32 = 1536;
/// The photos one session may have at once unless the experience says.
pub const DEFAULT_MAX_PHOTOS_PER_SESSION: i32 = 5;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ExperienceBody {
    /// 1 to 64 of `a-z`, `0-9` and `-`; unique.
    #[schema(pattern = "^[a-z0-9-]{1,64}$")]
    slug: String,
    /// 1 to 200 characters (after trimming).
    #[schema(min_length = 1, max_length = 200, example = "Four-panel comics")]
    title: String,
    #[schema(value_type = crate::http::schema::Kind)]
    kind: String,
    /// AI calls per submission (fan-out), 1 to 1,000; default 1. Each call
    /// counts one against `max_in_flight`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000)]
    ai_calls: Option<i32>,
    /// Calls that must succeed, 1 to `ai_calls`; default all.
    #[serde(default)]
    #[schema(minimum = 1)]
    min_success: Option<i32>,
    /// AI jobs in flight at most for this experience, 1 to 10,000; default 5.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 10000)]
    max_in_flight: Option<i32>,
    /// Credits for submissions (each deducts `ai_calls`); null: unlimited.
    #[serde(default)]
    #[schema(minimum = 0)]
    credits: Option<i64>,
    /// RFC 3339 time after which submissions are refused (409 `closing`).
    #[serde(default)]
    #[schema(format = DateTime)]
    closes_at: Option<String>,
    /// Language of the human messages and page texts; default `en`.
    #[serde(default)]
    #[schema(value_type = Option<crate::domain::locale::Locale>)]
    locale: Option<String>,
    /// The AI provider (account) its jobs run on: a name from the
    /// providers file; default `default`. An unknown name is 422.
    #[serde(default)]
    #[schema(example = "default", max_length = 40)]
    provider: Option<String>,
    /// Its share of the provider's slots among the experiences with work,
    /// 1 to 100; default 1. `max_in_flight` stays its own ceiling.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100)]
    weight: Option<i32>,
    /// `before_display`: each AI result waits in the operators' review
    /// (IN_REVIEW) and reaches the public screen only once approved;
    /// default `off`.
    #[serde(default)]
    #[schema(value_type = Option<crate::http::schema::ReviewMode>)]
    review: Option<String>,
    /// How long a result may wait in review (`"90s"`, `"2m"`) before
    /// `review_timeout_action` decides it; default none (it waits for a
    /// person).
    #[serde(default)]
    #[schema(example = "90s", max_length = 40)]
    review_timeout: Option<String>,
    /// `approve` or `reject`; default `reject`.
    #[serde(default)]
    #[schema(value_type = Option<crate::http::schema::ReviewAction>)]
    review_timeout_action: Option<String>,
    /// What a participant sends: `prompt` (default), `photo` (a photo,
    /// the prompt optional) or `photo+prompt`. A photo is uploaded with
    /// `POST /api/sessions/{id}/photo` and named by the submission's
    /// `photo_id`.
    #[serde(default)]
    #[schema(example = "photo+prompt", pattern = "^(prompt|photo|photo\\+prompt)$")]
    input: Option<String>,
    /// The long side, in pixels, a photo is downscaled to (on the phone
    /// before the upload, and again by the server), 256 to 4096; default
    /// 1536.
    #[serde(default)]
    #[schema(minimum = 256, maximum = 4096)]
    photo_max_px: Option<i32>,
    /// The photos one session may have at once, 1 to 50; default 5. Past
    /// it an upload is 409 `photo_limit`, unless it replaces the
    /// session's unsubmitted photo (`?replaces=`).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 50)]
    max_photos_per_session: Option<i32>,
    /// Whether its completed results appear at `/g/{slug}`: `off`
    /// (default), `public`, or `pin` (only with `gallery_pin`).
    #[serde(default)]
    #[schema(example = "public", pattern = "^(off|public|pin)$")]
    gallery: Option<String>,
    /// The gallery's PIN, 6 to 12 digits; required for `gallery: "pin"`.
    /// Stored only as a slow hash, never returned.
    #[serde(default)]
    #[schema(example = "246810", pattern = "^[0-9]{6,12}$")]
    gallery_pin: Option<String>,
    /// How long an input photo is kept after its saga ends (`"1h"`,
    /// `"30m"`), 1 s to 90 days; default `"1h"`.
    #[serde(default)]
    #[schema(example = "1h", max_length = 40)]
    photo_retention: Option<String>,
    /// How long results, nicknames and prompts are kept after
    /// `closes_at` (or after the session ended, without one), 1 s to 3
    /// years; default `"30d"`.
    #[serde(default)]
    #[schema(example = "30d", max_length = 40)]
    retention: Option<String>,
    /// What is kept, for how long and where it is shown, in the
    /// organiser's words: a text, or one per locale (`{"en": "…", "ko":
    /// "…"}`), each at most 2,000 characters. Shown on the phone page
    /// before the camera opens.
    #[serde(default)]
    #[schema(value_type = Option<Object>, example = json!({"en": "Your photo is deleted an hour after your comic is made; the comic is kept 30 days.", "ko": "사진은 만화가 완성되고 한 시간 뒤 삭제되며, 만화는 30일 동안 보관됩니다."}))]
    notice: Option<serde_json::Value>,
    /// A submission must carry `"consent": true` (the guest ticked the
    /// box under the notice); default false.
    #[serde(default)]
    consent_required: Option<bool>,
    /// How long a display shows the newest result's QR code (its result
    /// link), 0 s to 60 s; default 0 (never).
    #[serde(default)]
    #[schema(example = "8s", max_length = 40)]
    display_share_qr: Option<String>,
    /// How the brand's overlay is placed on a result: `cover` (default:
    /// scaled to cover it, centred) or `fit` (scaled to fit inside it).
    #[serde(default)]
    #[schema(example = "cover", pattern = "^(cover|fit)$")]
    brand_fit: Option<String>,
    /// A line drawn along each branded result's foot (the event's name,
    /// date, hashtag), 0 to 80 characters; empty or null: none.
    #[serde(default)]
    #[schema(example = "서울 디자인 위크 2026 #stagehand", max_length = 80)]
    brand_caption: Option<String>,
    /// Where the branded rendition is shown: any of `display`, `share`
    /// (the phone, the share page, the download, the gallery, the
    /// export) and `print`; default all three. Elsewhere the original is
    /// shown.
    #[serde(default)]
    #[schema(example = json!(["display", "share", "print"]))]
    brand_applies_to: Option<Vec<String>>,
    /// The prints one guest may ask for, 0 to 20; default 1; 0: guests
    /// cannot print (operators still can).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 20)]
    prints_per_guest: Option<i32>,
    /// Guests' prints wait for an operator's approval; default false.
    #[serde(default)]
    print_review: Option<bool>,
    /// The addresses one guest may have their result mailed to, 0 to 10;
    /// default 3; 0: guests cannot ask for mail.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 10)]
    mails_per_guest: Option<i32>,
    /// The mail carries the full file as an attachment (besides the
    /// picture shown in it and the link); default false.
    #[serde(default)]
    mail_attach: Option<bool>,
    /// The consent text shown with the mail field, in the organiser's
    /// words: a text, or one per locale, each at most 2,000 characters;
    /// null: the built-in one.
    #[serde(default)]
    #[schema(value_type = Option<Object>, example = json!({"en": "Mail my picture to this address; it is deleted with my picture after 30 days.", "ko": "사진을 이 주소로 보내 주세요. 주소는 30일 뒤 사진과 함께 삭제됩니다."}))]
    mail_consent: Option<serde_json::Value>,
    /// A separate marketing opt-in under the mail field (never ticked in
    /// advance): its text, or one per locale; null: none is offered.
    #[serde(default)]
    #[schema(value_type = Option<Object>, example = json!({"en": "Send me news of the sponsor's events.", "ko": "후원사 행사 소식을 받겠습니다."}))]
    mail_marketing: Option<serde_json::Value>,
}

/// The brand, print and mail settings.
fn output_settings(b: &ExperienceBody, locale: Locale) -> Result<OutputSettings, ApiError> {
    let brand_fit = match b.brand_fit.as_deref() {
        Some(text) => text.parse::<BrandFit>().map_err(ApiError::Validation)?,
        None => BrandFit::default(),
    };
    let brand_applies_to = match &b.brand_applies_to {
        Some(names) => {
            AppliesTo::from_names(names.iter().map(String::as_str)).map_err(ApiError::Validation)?
        }
        None => AppliesTo::default(),
    };
    let prints_per_guest = b.prints_per_guest.unwrap_or(1);
    if !(0..=20).contains(&prints_per_guest) {
        return Err(ApiError::Validation(
            "prints_per_guest must be 0 to 20 (0: guests cannot print)".into(),
        ));
    }
    let mails_per_guest = b.mails_per_guest.unwrap_or(3);
    if !(0..=10).contains(&mails_per_guest) {
        return Err(ApiError::Validation(
            "mails_per_guest must be 0 to 10 (0: guests cannot ask for mail)".into(),
        ));
    }
    Ok(OutputSettings {
        brand_fit,
        brand_caption: checked_caption(b.brand_caption.as_deref()).map_err(ApiError::Validation)?,
        brand_applies_to,
        prints_per_guest,
        print_review: b.print_review.unwrap_or(false),
        mails_per_guest,
        mail_attach: b.mail_attach.unwrap_or(false),
        mail_consent: locale_texts("mail_consent", b.mail_consent.as_ref(), locale)?,
        mail_marketing: locale_texts("mail_marketing", b.mail_marketing.as_ref(), locale)?,
    })
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct TerminalBody {
    /// The experience's slug.
    #[schema(example = "comic-booth")]
    experience: String,
    /// 1 to 80 characters (after trimming).
    #[schema(min_length = 1, max_length = 80, example = "Booth A")]
    name: String,
}

/// The stored form of the gallery PIN a body sets (checked by
/// [`validate_experience`], which leaves `gallery_pin_hash` unset): the
/// slow hash runs off the HTTP workers.
pub(super) async fn stored_pin(
    state: &AppState,
    pin: Option<&str>,
) -> Result<Option<String>, ApiError> {
    match pin {
        Some(pin) => Ok(Some(state.gallery_pins.hash_new(pin).await?)),
        None => Ok(None),
    }
}

pub(super) fn validate_experience(
    b: ExperienceBody,
    providers: &[crate::store::providers::ProviderRow],
) -> Result<NewExperience, ApiError> {
    check_identity(&b)?;
    let Capacity {
        ai_calls,
        max_in_flight,
    } = capacity_settings(&b)?;
    let closes_at_ms = match &b.closes_at {
        Some(text) => Some(rfc3339_ms("closes_at", text)?),
        None => None,
    };
    let locale = match b.locale.as_deref() {
        Some(text) => text.parse::<Locale>().map_err(ApiError::Validation)?,
        None => Locale::default(),
    };
    let guests = guest_settings(&b, locale)?;
    let (weight, provider) = provider_settings(&b, providers)?;
    let Review {
        review,
        review_timeout_ms,
        review_timeout_action,
    } = review_settings(&b)?;
    let PhotoSettings {
        input,
        photo_max_px,
        max_photos_per_session,
    } = media_settings(&b)?;
    let outputs = output_settings(&b, locale)?;
    Ok(NewExperience {
        guests,
        outputs,
        input,
        photo_max_px,
        max_photos_per_session,
        review,
        review_timeout_ms,
        review_timeout_action,
        provider,
        weight,
        locale: locale.as_str().to_owned(),
        slug: b.slug,
        title: b.title.trim().to_owned(),
        kind: b.kind,
        ai_calls,
        min_success: b.min_success,
        max_in_flight,
        credits: b.credits,
        closes_at_ms,
    })
}

/// Checks the slug, the title and the kind.
fn check_identity(b: &ExperienceBody) -> Result<(), ApiError> {
    let slug_ok = !b.slug.is_empty()
        && b.slug.len() <= 64
        && b.slug
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
    if !slug_ok {
        return Err(ApiError::Validation(
            "slug must be 1 to 64 of a-z, 0-9 and -".into(),
        ));
    }
    let title_len = b.title.trim().chars().count();
    if title_len == 0 || title_len > 200 {
        return Err(ApiError::Validation(
            "title must be 1 to 200 characters".into(),
        ));
    }
    if !KINDS.contains(&b.kind.as_str()) {
        return Err(ApiError::Validation(format!(
            "kind must be one of {}",
            KINDS.join(", ")
        )));
    }
    Ok(())
}

/// The AI calls and jobs in flight of an experience, with its defaults.
struct Capacity {
    ai_calls: i32,
    max_in_flight: i32,
}

/// The capacity settings: `ai_calls`, `max_in_flight`, `min_success`,
/// `credits`.
fn capacity_settings(b: &ExperienceBody) -> Result<Capacity, ApiError> {
    let ai_calls = b.ai_calls.unwrap_or(1);
    if !(1..=1_000).contains(&ai_calls) {
        return Err(ApiError::Validation("ai_calls must be 1 to 1000".into()));
    }
    let max_in_flight = b.max_in_flight.unwrap_or(5);
    if !(1..=10_000).contains(&max_in_flight) {
        return Err(ApiError::Validation(
            "max_in_flight must be 1 to 10000".into(),
        ));
    }
    if b.min_success.is_some_and(|m| m < 1 || m > ai_calls) {
        return Err(ApiError::Validation(
            "min_success must be between 1 and ai_calls".into(),
        ));
    }
    if b.credits.is_some_and(|c| c < 0) {
        return Err(ApiError::Validation("credits must not be negative".into()));
    }
    Ok(Capacity {
        ai_calls,
        max_in_flight,
    })
}

/// The weight and the provider, which must be one of `providers`.
fn provider_settings(
    b: &ExperienceBody,
    providers: &[crate::store::providers::ProviderRow],
) -> Result<(i32, String), ApiError> {
    let weight = b.weight.unwrap_or(1);
    if !(1..=100).contains(&weight) {
        return Err(ApiError::Validation("weight must be 1 to 100".into()));
    }
    let provider = b
        .provider
        .clone()
        .unwrap_or_else(|| crate::ai::providers::DEFAULT_PROVIDER.to_owned());
    if !providers.iter().any(|p| p.name == provider) {
        let mut names: Vec<&str> = providers.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        return Err(ApiError::Validation(format!(
            "provider {:?} is not configured; the providers are: {}",
            provider.chars().take(40).collect::<String>(),
            names.join(", ")
        )));
    }
    Ok((weight, provider))
}

/// The review settings as stored: the action defaults to reject when a
/// timeout is set, and is none without one.
struct Review {
    review: ReviewMode,
    review_timeout_ms: Option<i64>,
    review_timeout_action: Option<Decision>,
}

/// The review settings: `review`, `review_timeout`,
/// `review_timeout_action` (the last two only with review).
fn review_settings(b: &ExperienceBody) -> Result<Review, ApiError> {
    let review = match b.review.as_deref() {
        Some(text) => text.parse::<ReviewMode>().map_err(|_| {
            ApiError::Validation("review must be \"off\" or \"before_display\"".into())
        })?,
        None => ReviewMode::Off,
    };
    let review_timeout_ms = review_timeout_ms(b.review_timeout.as_deref())?;
    let review_timeout_action = match b.review_timeout_action.as_deref() {
        Some(text) => Some(text.parse::<Decision>().map_err(|_| {
            ApiError::Validation("review_timeout_action must be \"approve\" or \"reject\"".into())
        })?),
        None => None,
    };
    if review == ReviewMode::Off && (review_timeout_ms.is_some() || review_timeout_action.is_some())
    {
        return Err(ApiError::Validation(
            "review_timeout and review_timeout_action need review \"before_display\"".into(),
        ));
    }
    Ok(Review {
        review,
        review_timeout_ms,
        review_timeout_action: review_timeout_ms
            .map(|_| review_timeout_action.unwrap_or(Decision::Reject)),
    })
}

/// `review_timeout` in ms: more than 0 and at most 7 days.
fn review_timeout_ms(text: Option<&str>) -> Result<Option<i64>, ApiError> {
    let Some(text) = text else {
        return Ok(None);
    };
    let timeout = crate::config::parse_duration(text).map_err(|_| {
        ApiError::Validation("review_timeout must be a duration such as \"90s\" or \"2m\"".into())
    })?;
    if timeout.is_zero() || timeout > std::time::Duration::from_secs(7 * 24 * 3600) {
        return Err(ApiError::Validation(
            "review_timeout must be more than 0 and at most 7 days".into(),
        ));
    }
    Ok(Some(timeout.as_millis() as i64))
}

/// What an experience takes of photos.
struct PhotoSettings {
    input: InputKind,
    photo_max_px: i32,
    max_photos_per_session: i32,
}

/// The media settings: what a participant sends (`input`),
/// `photo_max_px` and `max_photos_per_session`.
fn media_settings(b: &ExperienceBody) -> Result<PhotoSettings, ApiError> {
    let input = match b.input.as_deref() {
        Some(text) => text.parse::<InputKind>().map_err(ApiError::Validation)?,
        None => InputKind::Prompt,
    };
    let photo_max_px = b.photo_max_px.unwrap_or(DEFAULT_PHOTO_MAX_PX);
    if !(256..=4096).contains(&photo_max_px) {
        return Err(ApiError::Validation(
            "photo_max_px must be 256 to 4096".into(),
        ));
    }
    let max_photos_per_session = b
        .max_photos_per_session
        .unwrap_or(DEFAULT_MAX_PHOTOS_PER_SESSION);
    if !(1..=50).contains(&max_photos_per_session) {
        return Err(ApiError::Validation(
            "max_photos_per_session must be 1 to 50".into(),
        ));
    }
    Ok(PhotoSettings {
        input,
        photo_max_px,
        max_photos_per_session,
    })
}

/// A duration setting between `min` and `max`, in ms; `default` without
/// one.
fn duration_setting(
    name: &str,
    text: Option<&str>,
    default: i64,
    (min, max): (std::time::Duration, std::time::Duration),
) -> Result<i64, ApiError> {
    let Some(text) = text else {
        return Ok(default);
    };
    let range = || {
        format!(
            "{name} must be a duration from {} to {}, such as \"1h\" or \"30d\"",
            humantime::format_duration(min),
            humantime::format_duration(max)
        )
    };
    let value = crate::config::parse_duration(text).map_err(|_| ApiError::Validation(range()))?;
    if value < min || value > max {
        return Err(ApiError::Validation(range()));
    }
    Ok(value.as_millis() as i64)
}

/// The gallery, retention, notice and consent settings.
fn guest_settings(b: &ExperienceBody, locale: Locale) -> Result<GuestSettings, ApiError> {
    use std::time::Duration;
    const DAY: u64 = 24 * 3600;
    let gallery = match b.gallery.as_deref() {
        Some(text) => text.parse::<Gallery>().map_err(ApiError::Validation)?,
        None => Gallery::Off,
    };
    // The PIN is checked here, and hashed by the caller off the HTTP
    // workers ([`stored_pin`]).
    match (gallery, b.gallery_pin.as_deref()) {
        (Gallery::Pin, Some(pin)) if guests::pin_is_valid(pin) => {}
        (Gallery::Pin, Some(_)) => {
            return Err(ApiError::Validation(format!(
                "gallery_pin must be {} to {} digits: a shorter PIN can be guessed during an event",
                guests::MIN_PIN_DIGITS,
                guests::MAX_PIN_DIGITS
            )))
        }
        (Gallery::Pin, None) => {
            return Err(ApiError::Validation(format!(
                "gallery \"pin\" needs gallery_pin: {} to {} digits",
                guests::MIN_PIN_DIGITS,
                guests::MAX_PIN_DIGITS
            )))
        }
        (_, Some(_)) => {
            return Err(ApiError::Validation(
                "gallery_pin is only for gallery \"pin\"".into(),
            ))
        }
        (_, None) => {}
    }
    let photo_retention_ms = duration_setting(
        "photo_retention",
        b.photo_retention.as_deref(),
        guests::DEFAULT_PHOTO_RETENTION_MS,
        (Duration::from_secs(1), Duration::from_secs(90 * DAY)),
    )?;
    let retention_ms = duration_setting(
        "retention",
        b.retention.as_deref(),
        guests::DEFAULT_RETENTION_MS,
        (Duration::from_secs(1), Duration::from_secs(3 * 366 * DAY)),
    )?;
    let share_qr_ms = duration_setting(
        "display_share_qr",
        b.display_share_qr.as_deref(),
        0,
        (Duration::ZERO, Duration::from_secs(60)),
    )?;
    Ok(GuestSettings {
        gallery,
        gallery_pin_hash: None,
        photo_retention_ms,
        retention_ms,
        notice: locale_texts("notice", b.notice.as_ref(), locale)?,
        consent_required: b.consent_required.unwrap_or(false),
        share_qr_ms,
    })
}

/// Texts per locale as stored (the notice, the mail's consent and
/// marketing texts): a JSON object of locale to text (a plain text is the
/// experience's own locale's).
fn locale_texts(
    field: &str,
    notice: Option<&serde_json::Value>,
    locale: Locale,
) -> Result<Option<String>, ApiError> {
    let bad = || {
        ApiError::Validation(format!(
            "{field} must be a text or {{\"en\": text, \"ko\": text}}, each 1 to 2000 characters"
        ))
    };
    let texts = match notice {
        None | Some(serde_json::Value::Null) => return Ok(None),
        Some(serde_json::Value::String(text)) => json!({ locale.as_str(): text }),
        Some(serde_json::Value::Object(map)) if !map.is_empty() => json!(map),
        Some(_) => return Err(bad()),
    };
    for (code, text) in texts.as_object().into_iter().flatten() {
        let ok = code.parse::<Locale>().is_ok()
            && text
                .as_str()
                .is_some_and(|t| (1..=2000).contains(&t.trim().chars().count()));
        if !ok {
            return Err(bad());
        }
    }
    Ok(Some(texts.to_string()))
}

/// The notice as the API shows it (an object of locale to text).
fn notice_json(e: &experiences::Model) -> serde_json::Value {
    crate::domain::locale::stored_texts(e.notice.as_deref())
}

fn ms_text(ms: i64) -> String {
    humantime::format_duration(std::time::Duration::from_millis(ms.max(0) as u64)).to_string()
}

pub(super) fn experience_json(e: &experiences::Model) -> serde_json::Value {
    json!({
        "id": e.id,
        "slug": e.slug,
        "title": e.title,
        "kind": e.kind,
        "ai_calls": e.ai_calls,
        "min_success": e.min_success,
        "max_in_flight": e.max_in_flight,
        "credits": e.credits,
        "closes_at": e.closes_at_ms.map(rfc3339),
        "locale": e.locale,
        "provider": e.provider,
        "weight": e.weight,
        "review": e.review,
        "review_timeout": e.review_timeout_ms.map(|ms| humantime::format_duration(std::time::Duration::from_millis(ms as u64)).to_string()),
        "review_timeout_action": e.review_timeout_action,
        "input": e.input,
        "photo_max_px": e.photo_max_px,
        "max_photos_per_session": e.max_photos_per_session,
        "gallery": e.gallery,
        "photo_retention": ms_text(e.photo_retention_ms),
        "retention": ms_text(e.retention_ms),
        "notice": notice_json(e),
        "consent_required": e.consent_required,
        "display_share_qr": ms_text(e.share_qr_ms),
        "brand_fit": e.brand_fit,
        "brand_caption": e.brand_caption,
        "brand_applies_to": AppliesTo::from_column(&e.brand_applies_to).names(),
        "brand_overlay": e.brand_overlay_width.zip(e.brand_overlay_height).map(|(w, h)| json!({"width": w, "height": h})),
        "brand_logo": e.brand_logo_key.is_some(),
        "prints_per_guest": e.prints_per_guest,
        "print_review": e.print_review,
        "mails_per_guest": e.mails_per_guest,
        "mail_attach": e.mail_attach,
        "mail_consent": crate::domain::locale::stored_texts(e.mail_consent.as_deref()),
        "mail_marketing": crate::domain::locale::stored_texts(e.mail_marketing.as_deref()),
        "created_at": rfc3339(e.created_at_ms),
    })
}

/// `POST /api/experiences`
#[utoipa::path(
    post,
    path = "/api/experiences",
    tag = "operators",
    summary = "Create an experience.",
    security(("operator" = [])),
    params(super::schema::OperatorKey),
    request_body = ExperienceBody,
    responses(
        (status = 201, description = "Created (or the replay of an earlier creation).", body = super::schema::Experience, headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with the same Idempotency-Key."))),
        (status = 400, description = "`invalid_json`: the body is not JSON for this request; `idempotency_key_required`: the Idempotency-Key is malformed.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: the slug is taken; `request_in_progress`: the same Idempotency-Key is still running.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: a field breaks its rule (a `gallery_pin` of fewer than 6 digits among them); `idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
        (status = 503, description = "`busy`: every place for hashing a gallery PIN is taken; try again (`Retry-After`).", body = super::schema::ErrorBody),
    )
)]
pub async fn create_experience(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let (state, operator) = (&state, &operator);
    operator_write(state, &req, payload, |body| async move {
        let providers = state.store.providers().await?;
        let body: ExperienceBody = parse_json(&body)?;
        let pin = body.gallery_pin.clone();
        let mut new = validate_experience(body, &providers)?;
        new.guests.gallery_pin_hash = stored_pin(state, pin.as_deref()).await?;
        let audit = AuditEntry::new(
            operator,
            AuditAction::ExperienceCreate,
            format!("experience:{}", new.slug),
        )
        .detail(format!(
            "kind {}, max_in_flight {}, provider {}",
            new.kind, new.max_in_flight, new.provider
        ));
        let created = state
            .store
            .create_experience(new, Some(&audit), state.clock.now_ms())
            .await?;
        tracing::info!(slug = %created.slug, "experience created");
        Ok(Reply {
            status: StatusCode::CREATED,
            body: experience_json(&created),
        })
    })
    .await
}

/// What anyone may read of an experience: what the pages show.
fn public_experience_json(e: &experiences::Model) -> serde_json::Value {
    json!({
        "slug": e.slug,
        "title": e.title,
        "kind": e.kind,
        "locale": e.locale,
        "closes_at": e.closes_at_ms.map(rfc3339),
        "input": e.input,
        "photo_max_px": e.photo_max_px,
        "gallery": e.gallery,
        "notice": notice_json(e),
        "consent_required": e.consent_required,
        "display_share_qr": ms_text(e.share_qr_ms),
        "prints_per_guest": e.prints_per_guest,
    })
}

/// `GET /api/experiences`: every field with the operator token; without
/// it, what the public pages show (slug, title, kind, locale, closes_at,
/// input, photo_max_px).
#[utoipa::path(
    get,
    path = "/api/experiences",
    tag = "operators",
    summary = "List the experiences: every field with the operator token, the public ones without.",
    security((), ("operator" = [])),
    responses(
        (status = 200, description = "The experiences.", body = super::schema::ExperienceList),
    )
)]
pub async fn list_experiences(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let render = if operator_of(&state, &req).await?.is_some() {
        experience_json
    } else {
        public_experience_json
    };
    let list: Vec<_> = state
        .store
        .list_experiences()
        .await?
        .iter()
        .map(render)
        .collect();
    Ok(HttpResponse::Ok().json(json!({"experiences": list})))
}

/// `GET /api/experiences/{slug}`: like one item of the list.
#[utoipa::path(
    get,
    path = "/api/experiences/{slug}",
    tag = "operators",
    summary = "One experience, like one item of the list.",
    security((), ("operator" = [])),
    params(("slug" = String, Path, description = "The experience's slug.")),
    responses(
        (status = 200, description = "The experience.", body = super::schema::ExperienceView),
        (status = 404, description = "`not_found`: no such experience.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the path could not be read.", body = super::schema::ErrorBody),
    )
)]
pub async fn get_experience(
    state: web::Data<AppState>,
    req: HttpRequest,
    slug: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let experience = state.experience(&slug).await?;
    let mut body = if operator_of(&state, &req).await?.is_some() {
        experience_json(&experience)
    } else {
        public_experience_json(&experience)
    };
    // The booth display shows a calm banner while the AI is paused.
    body["mail"] = super::mails::mail_offer(&state, &experience);
    let breaker = state.store.breaker(&experience.provider).await?;
    body["ai_paused"] =
        json!(breaker.state(state.clock.now_ms()) != crate::domain::breaker::BreakerState::Closed);
    Ok(HttpResponse::Ok().json(body))
}

#[derive(Deserialize)]
pub struct QrQuery {
    terminal: Option<String>,
}

/// `GET /api/experiences/{slug}/qr.svg?terminal=ID`: the QR code a booth
/// shows, encoding `{STAGEHAND_PUBLIC_URL}/p/{slug}?terminal={ID}`. Public:
/// it encodes nothing secret, and the booth page shows it in an `<img>`.
#[utoipa::path(
    get,
    path = "/api/experiences/{slug}/qr.svg",
    tag = "operators",
    summary = "The QR code participants scan at a booth (public).",
    description = "An SVG encoding `{STAGEHAND_PUBLIC_URL}/p/{slug}?terminal={terminal}` (without `?terminal=` when no terminal is given). It encodes nothing secret.",
    params(
        ("slug" = String, Path, description = "The experience's slug."),
        ("terminal" = Option<String>, Query, description = "A terminal of this experience: the participant's page then names that booth."),
    ),
    responses(
        (status = 200, description = "The QR code.", content_type = "image/svg+xml", body = String),
        (status = 404, description = "`not_found`: no such experience, or the terminal is not one of its terminals.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the path or query could not be read.", body = super::schema::ErrorBody),
    )
)]
pub async fn qr_svg(
    state: web::Data<AppState>,
    slug: web::Path<String>,
    query: web::Query<QrQuery>,
) -> Result<HttpResponse, ApiError> {
    let experience = state.experience(&slug).await?;
    let mut url = format!("{}/p/{}", state.public_url, experience.slug);
    if let Some(terminal_id) = query.terminal.as_deref().filter(|t| !t.is_empty()) {
        let terminal = state
            .store
            .terminal(terminal_id)
            .await?
            .filter(|t| t.experience_id == experience.id)
            .ok_or(ApiError::NotFound("terminal of this experience"))?;
        url.push_str("?terminal=");
        url.push_str(&terminal.id);
    }
    qr_answer(&url)
}

/// A QR code of `url` as an SVG answer.
pub(super) fn qr_answer(url: &str) -> Result<HttpResponse, ApiError> {
    let code = qrcode::QrCode::new(url.as_bytes())
        .map_err(|e| ApiError::Internal(format!("cannot encode {url} as a QR code: {e}")))?;
    let svg = code
        .render::<qrcode::render::svg::Color>()
        .min_dimensions(256, 256)
        .quiet_zone(true)
        .build();
    Ok(HttpResponse::Ok()
        .content_type("image/svg+xml")
        .insert_header(("Cache-Control", "public, max-age=300"))
        .body(svg))
}

/// `POST /api/terminals` -> 201 `{"terminal_id", "token"}`
#[utoipa::path(
    post,
    path = "/api/terminals",
    tag = "operators",
    summary = "Create a terminal (a booth display) of an experience.",
    security(("operator" = [])),
    params(super::schema::OperatorKey),
    request_body = TerminalBody,
    responses(
        (status = 201, description = "Created (or the replay of an earlier creation); the token is shown this once.", body = super::schema::TerminalCreated, headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with the same Idempotency-Key."))),
        (status = 400, description = "`invalid_json`: the body is not JSON for this request; `idempotency_key_required`: the Idempotency-Key is malformed.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such experience.", body = super::schema::ErrorBody),
        (status = 409, description = "`request_in_progress`: the same Idempotency-Key is still running.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: a field breaks its rule; `idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
    )
)]
pub async fn create_terminal(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let (state, operator) = (&state, &operator);
    operator_write(state, &req, payload, |body| async move {
        let b: TerminalBody = parse_json(&body)?;
        let name_len = b.name.trim().chars().count();
        if name_len == 0 || name_len > 80 {
            return Err(ApiError::Validation(
                "name must be 1 to 80 characters".into(),
            ));
        }
        let experience = state.experience(&b.experience).await?;
        let token = new_secret();
        let audit = AuditEntry::new(operator, AuditAction::TerminalCreate, "terminal")
            .detail(format!("{:?} of {}", b.name.trim(), experience.slug));
        let terminal = state
            .store
            .create_terminal(
                &experience.id,
                b.name.trim(),
                &token,
                Some(&audit),
                state.clock.now_ms(),
            )
            .await?;
        Ok(Reply {
            status: StatusCode::CREATED,
            body: json!({
                "terminal_id": terminal.id,
                "token": token,
                "experience": experience.slug,
                "name": terminal.name,
            }),
        })
    })
    .await
}
