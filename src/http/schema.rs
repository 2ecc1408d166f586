//! The schema-only types the handlers name in their `#[utoipa::path]`
//! attributes: the answers they build with `json!`, the Idempotency-Key
//! headers, and the error body. They are documented, never built; the
//! document that gathers them is `openapi.rs`. The handlers depend on
//! this module; it depends on no handler.

#![allow(dead_code)] // the schema types are documented, never built

use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
use utoipa::openapi::{Ref, RefOr, Schema};
use utoipa::{IntoParams, PartialSchema, ToSchema};

use crate::domain::locale::Locale;
use crate::domain::saga::{AbortReason, Step};
use crate::domain::session::SessionStatus;

// ---- headers ----------------------------------------------------------------

/// The optional Idempotency-Key of an operator's POST.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct OperatorKey {
    /// Makes the POST safe to retry: the same key and body replay the first
    /// answer (`Idempotent-Replayed: true`); the same key still running
    /// answers 409 `request_in_progress`; another body 422
    /// `idempotency_key_reused`. Scoped to the operator token and this
    /// endpoint (path); kept 24 h. Malformed (empty, over 255 characters,
    /// not visible ASCII): 400 `idempotency_key_required`.
    #[param(rename = "Idempotency-Key", min_length = 1, max_length = 255)]
    idempotency_key: Option<String>,
}

/// The optional Idempotency-Key of the anonymous session creation.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct SessionKey {
    /// Makes session creation safe to retry, with the same rules as every
    /// POST. There is no caller token, so whoever knows the key would get
    /// the replayed `participant_token`: the key must carry at least 122
    /// random bits, a UUID (make it a random, v4 one) or 32 to 255 hex
    /// digits, or the answer is 400 `idempotency_key_too_weak`. Scoped to
    /// the endpoint (the experience); kept 24 h.
    #[param(
        rename = "Idempotency-Key",
        pattern = "^([0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}|[0-9A-Fa-f]{32,255})$",
        example = "0b5f3c2e-6a51-4d0e-9d5c-4f0b8b7f6a21"
    )]
    idempotency_key: Option<String>,
}

/// A stored photo (`POST /api/sessions/{id}/photo`).
#[derive(ToSchema)]
pub struct PhotoStored {
    /// What the submission names as `photo_id`.
    #[schema(format = Uuid)]
    photo_id: String,
    /// The stored copy's size, upright, after the downscale.
    width: u32,
    height: u32,
    /// The stored JPEG's size in bytes.
    bytes: u64,
}

/// The Idempotency-Key the submission requires.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct SubmissionKey {
    /// Required (400 `idempotency_key_required` without it): the same key
    /// and body after completion replay the 202 (`Idempotent-Replayed:
    /// true`), even after the session moved on; the same key still running
    /// answers 409 `request_in_progress`; another body 422
    /// `idempotency_key_reused`. Scoped to the participant token; kept 24 h.
    #[param(rename = "Idempotency-Key", min_length = 1, max_length = 255)]
    idempotency_key: String,
}

// ---- errors -------------------------------------------------------------------

/// Every `error` code an answer can carry: [`super::error::ApiError::code`]
/// and the few answers built elsewhere (`not_ready`).
pub const ERROR_CODES: &[&str] = &[
    "invalid_json",
    "validation_failed",
    "payload_too_large",
    "unsupported_media_type",
    "method_not_allowed",
    "upgrade_required",
    "photo_unreadable",
    "photo_pool_full",
    "photo_not_taken",
    "photo_limit",
    "print_limit",
    "invalid_email",
    "consent_required",
    "mail_limit",
    "address_limit",
    "mail_unavailable",
    "upload_too_slow",
    "media_unavailable",
    "gone",
    "gallery_pin_required",
    "gallery_pin_wrong",
    "gallery_pin_outdated",
    "gallery_locked",
    "idempotency_key_required",
    "idempotency_key_too_weak",
    "idempotency_key_reused",
    "request_in_progress",
    "already_submitted",
    "closing",
    "budget_exhausted",
    "rate_limited",
    "unauthorized",
    "forbidden",
    "not_found",
    "conflict",
    "unsupported",
    "unavailable",
    "busy",
    "not_ready",
    "internal",
];

/// The body of every error answer.
#[derive(ToSchema)]
#[schema(as = Error, example = json!({"error": "not_found", "message": "session not found"}))]
pub struct ErrorBody {
    #[schema(value_type = ErrorCode)]
    error: String,
    /// A human text, in English.
    message: String,
}

/// The machine-readable code of an error (see the table in the description).
pub struct ErrorCode;

impl PartialSchema for ErrorCode {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(ERROR_CODES.iter().copied()))
            .into()
    }
}

impl ToSchema for ErrorCode {}

// ---- service ------------------------------------------------------------------

#[derive(ToSchema)]
pub struct Health {
    #[schema(example = "ok")]
    status: String,
}

#[derive(ToSchema)]
pub struct Ready {
    #[schema(example = "ready")]
    status: String,
}

// ---- experiences and terminals ------------------------------------------------

/// What an experience produces.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum Kind {
    Comic,
    Image,
    Video,
    Music,
    Score,
}

/// Whether an experience's AI results wait for an operator's approval
/// before the public screen shows them.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum ReviewMode {
    Off,
    BeforeDisplay,
}

/// An operator's decision on a result in review, or what the review
/// timeout does by itself.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum ReviewAction {
    Approve,
    Reject,
}

/// An operator's role.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum RoleName {
    /// Everything: settings, cancel and retry, the breaker, operators,
    /// erasure, export and the audit trail.
    Admin,
    /// Reads, and decides what the public sees: approve, reject, hide.
    Moderator,
    /// Reads only.
    Viewer,
}

/// `GET /api/admin/me`.
#[derive(ToSchema)]
pub struct OperatorMe {
    /// Null for the bootstrap token.
    #[schema(format = Uuid, required = true)]
    operator_id: Option<String>,
    /// `bootstrap` for the bootstrap token.
    name: String,
    role: RoleName,
}

/// An operator account (never its token).
#[derive(ToSchema)]
pub struct OperatorAccount {
    #[schema(format = Uuid)]
    operator_id: String,
    name: String,
    role: RoleName,
    #[schema(format = DateTime)]
    created_at: String,
    /// The name of who created it.
    created_by: String,
    #[schema(format = DateTime, required = true)]
    revoked_at: Option<String>,
}

/// A new operator, with its token (shown this once).
#[derive(ToSchema)]
pub struct OperatorCreated {
    #[schema(format = Uuid)]
    operator_id: String,
    name: String,
    role: RoleName,
    #[schema(format = DateTime)]
    created_at: String,
    created_by: String,
    #[schema(required = true)]
    revoked_at: Option<String>,
    /// The bearer token; the server keeps only its digest.
    token: String,
}

/// `GET /api/admin/operators`.
#[derive(ToSchema)]
pub struct OperatorList {
    operators: Vec<OperatorAccount>,
}

/// One record of the audit trail.
#[derive(ToSchema)]
pub struct AuditItem {
    id: String,
    #[schema(format = DateTime)]
    at: String,
    /// The operator's name (`bootstrap` for the bootstrap token).
    operator: String,
    #[schema(format = Uuid, required = true)]
    operator_id: Option<String>,
    /// `experience.update`, `saga.approve`, `operator.revoke`, ...
    #[schema(example = "experience.update")]
    action: String,
    /// `kind:id`, e.g. `saga:<uuid>`, `experience:<slug>`.
    #[schema(example = "experience:comic-booth")]
    target: String,
    #[schema(example = "max_in_flight: 1 -> 4")]
    detail: String,
}

/// `GET /api/admin/audit`.
#[derive(ToSchema)]
pub struct AuditPage {
    items: Vec<AuditItem>,
    /// The `after` of the next page; null on the last.
    #[schema(required = true)]
    next: Option<String>,
}

/// `PATCH /api/experiences/{slug}`: any subset of these.
#[derive(ToSchema)]
pub struct ExperiencePatch {
    #[schema(min_length = 1, max_length = 200)]
    title: Option<String>,
    #[schema(minimum = 1, maximum = 10000)]
    max_in_flight: Option<i32>,
    /// A provider from the providers file.
    provider: Option<String>,
    #[schema(minimum = 1, maximum = 100)]
    weight: Option<i32>,
    /// Sets the credits left (null: unlimited).
    #[schema(minimum = 0)]
    credits: Option<i64>,
    /// Adds to the credits left when the change commits (a top-up).
    #[schema(minimum = 1, maximum = 1000000000)]
    credits_add: Option<i64>,
    /// RFC 3339; in the past closes it now; null reopens it.
    #[schema(format = DateTime)]
    closes_at: Option<String>,
    locale: Option<Locale>,
    review: Option<ReviewMode>,
    #[schema(example = "90s")]
    review_timeout: Option<String>,
    review_timeout_action: Option<ReviewAction>,
    #[schema(example = "photo+prompt")]
    input: Option<String>,
    #[schema(minimum = 256, maximum = 4096)]
    photo_max_px: Option<i32>,
    #[schema(minimum = 1, maximum = 50)]
    max_photos_per_session: Option<i32>,
    #[schema(example = "public")]
    gallery: Option<String>,
    #[schema(example = "246810", pattern = "^[0-9]{6,12}$")]
    gallery_pin: Option<String>,
    #[schema(example = "1h")]
    photo_retention: Option<String>,
    #[schema(example = "30d")]
    retention: Option<String>,
    #[schema(value_type = Option<Object>)]
    notice: Option<serde_json::Value>,
    consent_required: Option<bool>,
    #[schema(example = "8s")]
    display_share_qr: Option<String>,
    /// `cover` or `fit`: how the brand's overlay is placed.
    #[schema(pattern = "^(cover|fit)$")]
    brand_fit: Option<String>,
    /// The caption along a branded result's foot (0 to 80 characters;
    /// empty or null: none).
    #[schema(max_length = 80)]
    brand_caption: Option<String>,
    /// Any of `display`, `share`, `print`.
    brand_applies_to: Option<Vec<String>>,
    /// The prints one guest may ask for, 0 to 20 (0: none).
    #[schema(minimum = 0, maximum = 20)]
    prints_per_guest: Option<i32>,
    /// Guests' prints wait for an operator's approval.
    print_review: Option<bool>,
    /// The addresses one guest may have their result mailed to, 0 to 10
    /// (0: none).
    #[schema(minimum = 0, maximum = 10)]
    mails_per_guest: Option<i32>,
    /// The mail carries the full file as an attachment.
    mail_attach: Option<bool>,
    /// The consent text shown with the mail field, per locale; null: the
    /// built-in one.
    #[schema(value_type = Option<Object>)]
    mail_consent: Option<serde_json::Value>,
    /// The marketing opt-in's text, per locale; null: none is offered.
    #[schema(value_type = Option<Object>)]
    mail_marketing: Option<serde_json::Value>,
}

/// An experience as operators see it (with the operator token).
#[derive(ToSchema)]
pub struct Experience {
    #[schema(format = Uuid)]
    id: String,
    slug: String,
    title: String,
    kind: Kind,
    #[schema(minimum = 1)]
    ai_calls: i32,
    #[schema(required = true)]
    min_success: Option<i32>,
    #[schema(minimum = 1)]
    max_in_flight: i32,
    /// Credits left; null: unlimited.
    #[schema(required = true)]
    credits: Option<i64>,
    #[schema(format = DateTime, required = true)]
    closes_at: Option<String>,
    locale: Locale,
    /// The AI provider its jobs run on.
    provider: String,
    /// Its share of the provider's slots, 1 to 100.
    #[schema(minimum = 1, maximum = 100)]
    weight: i32,
    review: ReviewMode,
    /// How long a result may wait in review before the timeout action
    /// decides it (`"1m 30s"`); null: no timeout.
    #[schema(required = true)]
    review_timeout: Option<String>,
    #[schema(required = true)]
    review_timeout_action: Option<ReviewAction>,
    /// One experience only (`GET /api/experiences/{slug}`): its provider's
    /// breaker is open, so the AI is paused and every place is kept.
    ai_paused: Option<bool>,
    /// `prompt`, `photo` or `photo+prompt`.
    #[schema(example = "photo+prompt")]
    input: String,
    #[schema(minimum = 256, maximum = 4096)]
    photo_max_px: i32,
    /// The photos one session may have at once.
    #[schema(minimum = 1, maximum = 50)]
    max_photos_per_session: i32,
    /// `off`, `public` or `pin`: whether `/g/{slug}` shows its results.
    #[schema(example = "public")]
    gallery: String,
    /// The organiser's notice, per locale (`{"en": "…"}`); null: none.
    #[schema(value_type = Option<Object>, required = true)]
    notice: Option<serde_json::Value>,
    /// A submission must carry `"consent": true`.
    consent_required: bool,
    /// How long a display shows the newest result's QR code (`"8s"`;
    /// `"0s"`: never).
    #[schema(example = "8s")]
    display_share_qr: String,
    /// How long an input photo is kept after its saga ends (`"1h"`).
    #[schema(example = "1h")]
    photo_retention: String,
    /// How long results and personal fields are kept after `closes_at`
    /// (or after the session ended) (`"30days"`).
    #[schema(example = "30days")]
    retention: String,
    /// `cover` or `fit`: how the brand's overlay is placed.
    #[schema(example = "cover")]
    brand_fit: String,
    /// The caption along a branded result's foot; null: none.
    #[schema(required = true)]
    brand_caption: Option<String>,
    /// Where the branded rendition is shown: any of `display`, `share`,
    /// `print`.
    brand_applies_to: Vec<String>,
    /// The overlay's size; null: none.
    #[schema(required = true)]
    brand_overlay: Option<BrandImage>,
    /// Whether a corner logo is set.
    brand_logo: bool,
    /// The prints one guest may ask for (0: none).
    prints_per_guest: i32,
    /// Guests' prints wait for an operator's approval.
    print_review: bool,
    /// The addresses one guest may have their result mailed to (0: none).
    mails_per_guest: i32,
    /// The mail carries the full file as an attachment.
    mail_attach: bool,
    /// The consent text shown with the mail field, per locale; null: the
    /// built-in one.
    #[schema(value_type = Option<Object>, required = true)]
    mail_consent: Option<serde_json::Value>,
    /// The marketing opt-in's text, per locale; null: none is offered.
    #[schema(value_type = Option<Object>, required = true)]
    mail_marketing: Option<serde_json::Value>,
    /// One experience only: what its pages offer of mail.
    #[schema(value_type = Option<MailOffer>)]
    mail: Option<serde_json::Value>,
    #[schema(format = DateTime)]
    created_at: String,
}

/// What a page offers of mail: null when this server has no SMTP server
/// or the experience's guests cannot ask for mail.
#[derive(ToSchema)]
pub struct MailOffer {
    /// The consent text shown with the field, per locale.
    #[schema(value_type = Object)]
    consent: serde_json::Value,
    /// The marketing opt-in's text, per locale; null: none is offered.
    #[schema(value_type = Option<Object>, required = true)]
    marketing: Option<serde_json::Value>,
    /// The version of both texts: the mail records it with the consent.
    #[schema(example = "3f2a9c0d5e7b41a2")]
    notice_version: String,
    /// The addresses one guest may ask for.
    per_guest: i32,
    /// The full file is attached.
    attach: bool,
}

/// A brand image's size, in pixels.
#[derive(ToSchema)]
pub struct BrandImage {
    width: u32,
    height: u32,
}

/// What anyone may read of an experience: what the public pages show, and
/// no other field.
#[derive(ToSchema)]
pub struct PublicExperience {
    slug: String,
    title: String,
    kind: Kind,
    locale: Locale,
    #[schema(format = DateTime, required = true)]
    closes_at: Option<String>,
    /// One experience only (`GET /api/experiences/{slug}`): its provider's
    /// breaker is open, so the AI is paused and every place is kept.
    ai_paused: Option<bool>,
    /// `prompt`, `photo` or `photo+prompt`: what the phone page asks for.
    #[schema(example = "photo+prompt")]
    input: String,
    /// The long side the phone downscales a photo to before the upload.
    #[schema(minimum = 256, maximum = 4096)]
    photo_max_px: i32,
    /// `off`, `public` or `pin`: whether `/g/{slug}` shows its results.
    #[schema(example = "public")]
    gallery: String,
    /// The organiser's notice, per locale (`{"en": "…"}`); null: none.
    #[schema(value_type = Option<Object>, required = true)]
    notice: Option<serde_json::Value>,
    /// A submission must carry `"consent": true`.
    consent_required: bool,
    /// How long a display shows the newest result's QR code (`"8s"`;
    /// `"0s"`: never).
    #[schema(example = "8s")]
    display_share_qr: String,
    /// The prints a guest may ask for (0: guests cannot print).
    prints_per_guest: i32,
    /// One experience only (`GET /api/experiences/{slug}`): what the
    /// pages offer of mail; null: none.
    #[schema(value_type = Option<MailOffer>)]
    mail: Option<serde_json::Value>,
}

/// With the operator token, every field; without it, the public ones.
pub struct ExperienceView;

impl PartialSchema for ExperienceView {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(Ref::from_schema_name(Experience::name()))
            .item(Ref::from_schema_name(PublicExperience::name()))
            .into()
    }
}

impl ToSchema for ExperienceView {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((Experience::name().into(), Experience::schema()));
        schemas.push((PublicExperience::name().into(), PublicExperience::schema()));
        <Experience as ToSchema>::schemas(schemas);
        <PublicExperience as ToSchema>::schemas(schemas);
    }
}

#[derive(ToSchema)]
pub struct ExperienceList {
    experiences: Vec<ExperienceView>,
}

/// A new terminal: its token is shown this once.
#[derive(ToSchema)]
pub struct TerminalCreated {
    #[schema(format = Uuid)]
    terminal_id: String,
    /// The display's secret for `GET /ws/terminals/{terminal_id}?token=`.
    token: String,
    /// The experience's slug.
    experience: String,
    name: String,
}

#[derive(ToSchema)]
pub struct TerminalList {
    terminals: Vec<crate::store::presence::TerminalView>,
}

// ---- sagas ----------------------------------------------------------------------

#[derive(ToSchema)]
pub struct SagaList {
    /// Newest change first.
    sagas: Vec<crate::store::operators::SagaView>,
    /// Pass as `cursor` for the next page; null on the last page.
    #[schema(required = true)]
    next_cursor: Option<String>,
}

#[derive(ToSchema)]
pub struct SagaOne {
    saga: crate::store::operators::SagaView,
}

/// The results waiting for an operator's decision, oldest first.
#[derive(ToSchema)]
pub struct ReviewList {
    items: Vec<crate::store::review::ReviewItem>,
}

/// What a bulk action did.
#[derive(ToSchema)]
pub struct BulkResult {
    /// Sagas the filter matched.
    matched: i64,
    /// Sagas the action applied to (0 on a dry run; a saga whose state
    /// refuses the action is matched but not done).
    done: i64,
    dry_run: bool,
}

// ---- participants ------------------------------------------------------------

/// A new session: its `participant_token` is shown this once (and to a
/// replay of the same Idempotency-Key).
#[derive(ToSchema)]
pub struct SessionCreated {
    #[schema(format = Uuid)]
    session_id: String,
    participant_token: String,
    status: SessionStatus,
}

/// The submission was taken; the saga runs in the background.
#[derive(ToSchema)]
pub struct SubmissionAccepted {
    #[schema(format = Uuid)]
    session_id: String,
    #[schema(format = Uuid)]
    saga_id: String,
    status: SessionStatus,
    step: Step,
    /// Place in the experience's AI queue: 1 is the next to start.
    #[schema(minimum = 1)]
    queue_position: i64,
    /// Estimated seconds until the result, from recent AI durations and
    /// the free capacity; null while no estimate is known.
    #[schema(minimum = 0, required = true)]
    eta_seconds: Option<i64>,
}

/// One piece of AI content. A file the provider made is kept by this
/// server: `url` is then `/media/r/…` (served by `GET /media/{key}`, the
/// full file), never the provider's own URL, which it deletes after a while.
#[derive(ToSchema)]
pub struct ContentItem {
    /// e.g. `image`, `text`.
    #[schema(rename = "type")]
    kind: String,
    #[schema(example = "/media/r/3f2a9c0d5e7b41a28c6f0e1d2b3a4c5d.png")]
    url: Option<String>,
    text: Option<String>,
    /// A display-size JPEG of a kept raster image (PNG, JPEG, WebP), for
    /// displays and the ranking.
    #[schema(example = "/media/r/3f2a9c0d5e7b41a28c6f0e1d2b3a4c5d.t.jpg")]
    thumb_url: Option<String>,
    /// The kept original, when the event's brand drew a branded
    /// rendition (`url` and `thumb_url` then show the branded one where
    /// the brand applies).
    #[schema(example = "/media/r/3f2a9c0d5e7b41a28c6f0e1d2b3a4c5d.png")]
    original_url: Option<String>,
    /// The branded rendition the print station prints, when the brand
    /// applies to print.
    #[schema(example = "/media/r/3f2a9c0d5e7b41a28c6f0e1d2b3a4c5d.b.jpg")]
    print_url: Option<String>,
}

/// A print of a session's result.
#[derive(ToSchema)]
pub struct PrintView {
    #[schema(format = Uuid)]
    print_id: String,
    /// `QUEUED`, `SENDING`, `PRINTING`, `COMPLETED`, `CANCELED` or `ABORTED`.
    #[schema(example = "QUEUED")]
    status: String,
    /// Why it waits or why it ended, in the experience's language; null
    /// while nothing holds it.
    #[schema(required = true)]
    reason: Option<String>,
    /// The status in words, in the experience's language.
    status_text: String,
    /// A guest's print waiting for an operator's approval.
    awaiting_review: bool,
    #[schema(required = true)]
    printer_id: Option<String>,
    /// `guest` or `operator:<name>`.
    requested_by: String,
    #[schema(format = DateTime)]
    created_at: String,
}

/// The result of a COMPLETED session.
#[derive(ToSchema)]
pub struct SessionResult {
    content: Vec<ContentItem>,
    /// The ranked score: the participant's, else the AI result's.
    #[schema(required = true)]
    score: Option<f64>,
    /// Rank in the experience's ranking, computed at read time.
    #[schema(required = true, minimum = 1)]
    rank: Option<i64>,
}

/// A session as its participant (or an operator) sees it.
#[derive(ToSchema)]
pub struct SessionView {
    #[schema(format = Uuid)]
    session_id: String,
    /// The experience's slug.
    experience: String,
    nickname: String,
    status: SessionStatus,
    /// The latest saga's step; null before the first submission.
    #[schema(required = true)]
    step: Option<Step>,
    #[schema(required = true)]
    abort_reason: Option<AbortReason>,
    /// A human message in the experience's language.
    message: String,
    /// Set when the session is COMPLETED.
    #[schema(required = true)]
    result: Option<SessionResult>,
    /// A fan-out experience's calls (`ai_calls` > 1) while the saga waits
    /// for the AI ("7 of 30 done"); null otherwise.
    #[schema(required = true)]
    progress: Option<SessionProgress>,
    /// While the saga waits for an AI slot: its place in the experience's
    /// queue (1: next); null otherwise.
    #[schema(required = true, minimum = 1)]
    queue_position: Option<i64>,
    /// The experience's AI provider is paused (its breaker is open): the
    /// participant keeps their place. `message` then says why: a short
    /// pause, or the AI account out of credit (staff must act).
    ai_paused: bool,
    /// The result link (`/r/{share_id}`) once COMPLETED and while its data
    /// is kept; null otherwise.
    #[schema(required = true, example = "/r/3f2a9c0d5e7b41a28c6f0e1d2b3a4c5d")]
    share_url: Option<String>,
    /// False when the guest opted out of the gallery.
    in_gallery: bool,
    /// Its data was erased (or its retention ended): nickname, prompt and
    /// result are gone.
    erased: bool,
    /// Its prints, oldest first.
    prints: Vec<PrintView>,
    /// Its mails, oldest first (a completed session's).
    emails: Vec<MailView>,
    #[schema(format = DateTime)]
    updated_at: String,
}

/// A mail of a session's result, as its guest sees it.
#[derive(ToSchema)]
pub struct MailView {
    #[schema(format = Uuid)]
    email_id: String,
    /// `QUEUED`, `SENT`, `FAILED` or `CANCELED`.
    #[schema(example = "SENT")]
    status: String,
    /// The address, masked (`g…@example.com`); null once erased.
    #[schema(required = true, example = "g…@example.com")]
    address: Option<String>,
}

/// How far a fan-out saga's AI calls are.
#[derive(ToSchema)]
pub struct SessionProgress {
    /// Calls that are final (succeeded, or failed for good), including
    /// those kept from an earlier submission of the session.
    #[schema(minimum = 0)]
    done: i64,
    /// The experience's `ai_calls`.
    #[schema(minimum = 1)]
    total: i64,
}

#[derive(ToSchema)]
pub struct RankingEntry {
    #[schema(minimum = 1)]
    rank: i64,
    nickname: String,
    score: f64,
    #[schema(format = Uuid)]
    session_id: String,
}

/// A result by its link.
#[derive(ToSchema)]
pub struct SharedResultView {
    /// The link's id.
    share_id: String,
    #[schema(format = Uuid)]
    session_id: String,
    /// The experience's slug.
    experience: String,
    /// The experience's title.
    title: String,
    locale: Locale,
    nickname: String,
    content: Vec<ContentItem>,
    #[schema(required = true)]
    score: Option<f64>,
    #[schema(format = DateTime)]
    completed_at: String,
    /// `/r/{share_id}/download` when the full file is kept here; null
    /// otherwise.
    #[schema(required = true)]
    download_url: Option<String>,
}

/// One result in a gallery.
#[derive(ToSchema)]
pub struct GalleryItem {
    #[schema(format = Uuid)]
    session_id: String,
    nickname: String,
    content: Vec<ContentItem>,
    #[schema(format = DateTime)]
    completed_at: String,
}

/// A page of a gallery, newest first.
#[derive(ToSchema)]
pub struct GalleryPage {
    items: Vec<GalleryItem>,
    /// Pass it as `before` for the next page; null on the last one.
    #[schema(required = true)]
    next: Option<String>,
}

/// An erasure's answer (the same when repeated).
#[derive(ToSchema)]
pub struct Erased {
    #[schema(format = Uuid)]
    session_id: String,
    erased: bool,
}

/// A hide's or unhide's answer.
#[derive(ToSchema)]
pub struct HiddenView {
    #[schema(format = Uuid)]
    session_id: String,
    hidden: bool,
}

/// A session an operator's nickname search found.
#[derive(ToSchema)]
pub struct FoundSession {
    #[schema(format = Uuid)]
    session_id: String,
    /// The experience's slug.
    #[schema(required = true)]
    experience: Option<String>,
    nickname: String,
    status: SessionStatus,
    hidden: bool,
    /// The result link, when COMPLETED.
    #[schema(required = true)]
    share_url: Option<String>,
    #[schema(format = DateTime)]
    created_at: String,
}

/// The sessions whose nickname matched, newest first (at most 50).
#[derive(ToSchema)]
pub struct SessionSearchResult {
    sessions: Vec<FoundSession>,
}

/// What an experience holds of its guests' data.
#[derive(ToSchema)]
pub struct HeldView {
    /// Input photos kept, and their bytes.
    #[schema(minimum = 0)]
    photos: i64,
    #[schema(minimum = 0)]
    photo_bytes: i64,
    /// Completed results kept.
    #[schema(minimum = 0)]
    results: i64,
    /// Sessions whose data was forgotten (retention or erasure).
    #[schema(minimum = 0)]
    forgotten: i64,
    /// When the next session's data is due to be forgotten.
    #[schema(format = DateTime, required = true)]
    next_purge_at: Option<String>,
    /// When the next input photo is due to be deleted.
    #[schema(format = DateTime, required = true)]
    next_photo_purge_at: Option<String>,
    retention: String,
    photo_retention: String,
}

/// Best first.
#[derive(ToSchema)]
pub struct Ranking {
    entries: Vec<RankingEntry>,
}
