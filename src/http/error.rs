//! The one error type of the HTTP layer and its mapping to status codes and
//! the JSON shape `{"error": "<code>", "message": "<human text>"}`.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::domain::saga::TransitionError;
use crate::store::{DbFailure, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidJson(String),
    #[error("{0}")]
    Validation(String),
    #[error("the request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("an Idempotency-Key header of 1 to 255 characters is required")]
    IdempotencyKeyRequired,
    #[error("an Idempotency-Key on a request without a caller token must carry at least 122 random bits: send a UUID, or 32 or more hex digits")]
    IdempotencyKeyTooWeak,
    #[error("this Idempotency-Key was used with a different request body")]
    IdempotencyKeyReused,
    #[error("a request with this Idempotency-Key is still in progress")]
    RequestInProgress,
    #[error("this session has already submitted")]
    AlreadySubmitted,
    #[error("this experience has no credits left for a submission")]
    BudgetExhausted,
    #[error("this experience is closing and takes no more submissions")]
    Closing,
    #[error("{0}")]
    Unauthorized(&'static str),
    /// An operator whose role may not take this action (the message
    /// names the role it needs and the one held).
    #[error("{message}")]
    Forbidden {
        needs: crate::domain::roles::Role,
        message: String,
    },
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("the database is not reachable right now")]
    Unavailable,
    #[error("the database is busy; try again in a moment")]
    Busy,
    #[error("internal error")]
    Internal(String),
    #[error("too many requests; retry after {retry_after} s")]
    RateLimited { retry_after: u64 },
    #[error("this path answers only {allow}")]
    MethodNotAllowed { allow: String },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("this is a WebSocket endpoint: {0}")]
    UpgradeRequired(String),
    /// The photo's bytes are not a picture that can be taken: truncated,
    /// corrupt, or past a decoding limit (the message names it).
    #[error("{0}")]
    PhotoUnreadable(String),
    /// Every photo worker is busy and the queue is full.
    #[error("too many photos are being processed right now; try again in a moment")]
    PhotoPoolFull,
    /// A photo upload to an experience whose input is only a prompt.
    #[error("this experience takes no photo (its input is \"prompt\")")]
    PhotoNotTaken,
    /// The session holds its experience's `max_photos_per_session`.
    #[error("this session has its {0} photos already; replace its unsubmitted photo (?replaces=<photo_id>) or start a new session")]
    PhotoLimit(i32),
    /// The guest asked for the experience's `prints_per_guest` prints
    /// already (0: guests cannot print).
    #[error("{}", print_limit_message(*.0))]
    PrintLimit(i32),
    /// A mail address that is not one, or that carries a line break (the
    /// message says which).
    #[error("{0}")]
    InvalidEmail(String),
    /// A mail asked for without `"consent": true`.
    #[error("consent must be true: a mail is sent only when the guest agrees to the text shown with the field")]
    ConsentRequired,
    /// The session asked for the experience's `mails_per_guest` mails
    /// already (0: guests cannot ask for mail).
    #[error("{}", mail_limit_message(*.0))]
    MailLimit(i32),
    /// One address was mailed its share in the last hour.
    #[error("this address was sent {0} mails in the last hour; try again later")]
    AddressLimit(u32),
    /// No SMTP server is set up (`STAGEHAND_SMTP_URL`).
    #[error("mail is not set up on this server (STAGEHAND_SMTP_URL and STAGEHAND_MAIL_FROM)")]
    MailUnavailable,
    /// A photo's body arrived too slowly, or not whole in time.
    #[error("{0}")]
    UploadTooSlow(String),
    /// The media store (folder or S3) does not answer.
    #[error("the media store is not reachable right now ({0}); try again in a moment")]
    MediaUnavailable(String),
    /// A result whose data was erased (by its guest or an operator) or
    /// whose retention ended.
    #[error("{0}")]
    Gone(&'static str),
    /// A PIN gallery asked without `X-Gallery-Pin`.
    #[error("this gallery needs its PIN in the X-Gallery-Pin header")]
    GalleryPinRequired,
    /// A PIN gallery asked with a wrong PIN.
    #[error("that is not this gallery's PIN")]
    GalleryPinWrong,
    /// A PIN gallery asked with its PIN of fewer than 6 digits, set before
    /// 6 were required: it no longer opens the gallery.
    #[error("this gallery's PIN has changed: a gallery PIN now has 6 to 12 digits; ask the staff for the new one")]
    GalleryPinOutdated,
    /// Too many PINs were tried on this gallery: every PIN answer is this,
    /// the right PIN's too, until the lock ends.
    #[error("too many wrong PINs were tried on this gallery; it opens again in {retry_after} s")]
    GalleryLocked { retry_after: u64 },
    /// Every place for checking a gallery PIN (the slow hash, off the HTTP
    /// workers) is taken.
    #[error("too many gallery PINs are being checked right now; try again in a moment")]
    PinChecksFull,
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidJson(_) => "invalid_json",
            ApiError::Validation(_) => "validation_failed",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::IdempotencyKeyRequired => "idempotency_key_required",
            ApiError::IdempotencyKeyTooWeak => "idempotency_key_too_weak",
            ApiError::IdempotencyKeyReused => "idempotency_key_reused",
            ApiError::RequestInProgress => "request_in_progress",
            ApiError::AlreadySubmitted => "already_submitted",
            ApiError::BudgetExhausted => "budget_exhausted",
            ApiError::Closing => "closing",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden { .. } => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict(_) => "conflict",
            ApiError::Unsupported(_) => "unsupported",
            ApiError::Unavailable => "unavailable",
            ApiError::Busy => "busy",
            ApiError::Internal(_) => "internal",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::UpgradeRequired(_) => "upgrade_required",
            ApiError::PhotoUnreadable(_) => "photo_unreadable",
            ApiError::PhotoPoolFull => "photo_pool_full",
            ApiError::PhotoNotTaken => "photo_not_taken",
            ApiError::PhotoLimit(_) => "photo_limit",
            ApiError::PrintLimit(_) => "print_limit",
            ApiError::InvalidEmail(_) => "invalid_email",
            ApiError::ConsentRequired => "consent_required",
            ApiError::MailLimit(_) => "mail_limit",
            ApiError::AddressLimit(_) => "address_limit",
            ApiError::MailUnavailable => "mail_unavailable",
            ApiError::UploadTooSlow(_) => "upload_too_slow",
            ApiError::MediaUnavailable(_) => "media_unavailable",
            ApiError::Gone(_) => "gone",
            ApiError::GalleryPinRequired => "gallery_pin_required",
            ApiError::GalleryPinWrong => "gallery_pin_wrong",
            ApiError::GalleryPinOutdated => "gallery_pin_outdated",
            ApiError::GalleryLocked { .. } => "gallery_locked",
            ApiError::PinChecksFull => "busy",
        }
    }

    /// Whether this answer is about the request itself, so the same request
    /// would get it again: only such answers are stored under an
    /// Idempotency-Key and replayed (with the successes). Answers about the
    /// moment (401, 402, 409 other than `already_submitted`, 429, 5xx)
    /// release the key, so a retry runs again.
    pub fn is_final_for_request(&self) -> bool {
        matches!(
            self,
            ApiError::InvalidJson(_)
                | ApiError::Validation(_)
                | ApiError::PayloadTooLarge(_)
                | ApiError::UnsupportedMediaType(_)
                | ApiError::PhotoUnreadable(_)
                | ApiError::InvalidEmail(_)
                | ApiError::ConsentRequired
                | ApiError::NotFound(_)
                | ApiError::AlreadySubmitted
                | ApiError::Unsupported(_)
        )
    }

    /// A request to a WebSocket endpoint that is no WebSocket handshake
    /// (`actix_ws::handle`'s error).
    pub fn not_a_handshake(e: impl std::fmt::Display) -> ApiError {
        ApiError::UpgradeRequired(e.to_string())
    }

    /// The JSON body of this error.
    pub fn body(&self) -> serde_json::Value {
        match self {
            ApiError::Forbidden { needs, .. } => {
                json!({"error": self.code(), "message": self.to_string(), "needs": needs.as_str()})
            }
            ApiError::InvalidEmail(_) => {
                json!({"error": self.code(), "message": self.to_string(), "field": "email"})
            }
            ApiError::ConsentRequired => {
                json!({"error": self.code(), "message": self.to_string(), "field": "consent"})
            }
            _ => json!({"error": self.code(), "message": self.to_string()}),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::InvalidJson(_)
            | ApiError::IdempotencyKeyRequired
            | ApiError::IdempotencyKeyTooWeak => StatusCode::BAD_REQUEST,
            ApiError::Validation(_)
            | ApiError::IdempotencyKeyReused
            | ApiError::Unsupported(_)
            | ApiError::PhotoUnreadable(_)
            | ApiError::InvalidEmail(_)
            | ApiError::ConsentRequired => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestInProgress
            | ApiError::AlreadySubmitted
            | ApiError::Conflict(_)
            | ApiError::PhotoNotTaken
            | ApiError::PhotoLimit(_)
            | ApiError::PrintLimit(_)
            | ApiError::MailLimit(_) => StatusCode::CONFLICT,
            ApiError::UploadTooSlow(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::BudgetExhausted => StatusCode::PAYMENT_REQUIRED,
            ApiError::Closing => StatusCode::CONFLICT,
            ApiError::Unauthorized(_)
            | ApiError::GalleryPinRequired
            | ApiError::GalleryPinWrong
            | ApiError::GalleryPinOutdated => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::Gone(_) => StatusCode::GONE,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unavailable
            | ApiError::Busy
            | ApiError::PhotoPoolFull
            | ApiError::PinChecksFull
            | ApiError::MailUnavailable
            | ApiError::MediaUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::RateLimited { .. }
            | ApiError::GalleryLocked { .. }
            | ApiError::AddressLimit(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::UpgradeRequired(_) => StatusCode::UPGRADE_REQUIRED,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let ApiError::Internal(detail) = self {
            tracing::error!(%detail, "request failed");
        }
        let mut response = HttpResponse::build(self.status_code());
        match self {
            ApiError::RateLimited { retry_after } | ApiError::GalleryLocked { retry_after } => {
                response.insert_header((header::RETRY_AFTER, retry_after.to_string()));
            }
            ApiError::MethodNotAllowed { allow } => {
                response.insert_header((header::ALLOW, allow.as_str()));
            }
            ApiError::UpgradeRequired(_) => {
                response.insert_header((header::UPGRADE, "websocket"));
            }
            ApiError::Unavailable
            | ApiError::Busy
            | ApiError::PhotoPoolFull
            | ApiError::PinChecksFull => {
                response.insert_header((header::RETRY_AFTER, "1"));
            }
            ApiError::MediaUnavailable(_) => {
                response.insert_header((header::RETRY_AFTER, "5"));
            }
            _ => {}
        }
        response.json(self.body())
    }
}

impl From<crate::actors::review::DecideError> for ApiError {
    fn from(e: crate::actors::review::DecideError) -> Self {
        match e {
            crate::actors::review::DecideError::Store(e) => e.into(),
            e => ApiError::Internal(e.to_string()),
        }
    }
}

impl From<crate::media::MediaError> for ApiError {
    fn from(e: crate::media::MediaError) -> Self {
        use crate::media::MediaError;
        match e {
            MediaError::NotFound(_) => ApiError::NotFound("media"),
            MediaError::Unavailable(detail) => ApiError::MediaUnavailable(detail),
            MediaError::Config { .. } => ApiError::Internal(e.to_string()),
        }
    }
}

impl From<crate::media::photo::PhotoError> for ApiError {
    fn from(e: crate::media::photo::PhotoError) -> Self {
        use crate::media::photo::PhotoError;
        match e {
            PhotoError::Unsupported { .. } => ApiError::UnsupportedMediaType(e.to_string()),
            PhotoError::TooLarge { .. } | PhotoError::Corrupt(_) => {
                ApiError::PhotoUnreadable(e.to_string())
            }
        }
    }
}

impl From<crate::media::pool::PoolFull> for ApiError {
    fn from(_: crate::media::pool::PoolFull) -> Self {
        ApiError::PhotoPoolFull
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(what) => ApiError::NotFound(what),
            StoreError::AlreadySubmitted => ApiError::AlreadySubmitted,
            StoreError::BudgetExhausted => ApiError::BudgetExhausted,
            StoreError::Closing => ApiError::Closing,
            StoreError::PhotoLimit(limit) => ApiError::PhotoLimit(limit),
            StoreError::Conflict(message) => ApiError::Conflict(message),
            StoreError::Review(refused) => ApiError::Conflict(refused.to_string()),
            // An operator's action on a saga that moved on (the workers'
            // own writes never reach HTTP).
            StoreError::Transition(TransitionError::Conflict { detail, .. }) => {
                ApiError::Conflict(detail)
            }
            StoreError::Transition(e) => ApiError::Conflict(e.to_string()),
            other => match other.failure() {
                DbFailure::Transient => ApiError::Busy,
                DbFailure::Unavailable => ApiError::Unavailable,
                DbFailure::Duplicate | DbFailure::Other => ApiError::Internal(other.to_string()),
            },
        }
    }
}

fn mail_limit_message(limit: i32) -> String {
    match limit {
        0 => "guests cannot ask for mail at this booth".to_owned(),
        n => format!("this session has asked for its {n} mails already"),
    }
}

fn print_limit_message(limit: i32) -> String {
    match limit {
        0 => "guests cannot print at this booth; ask the crew".to_owned(),
        1 => "this session has asked for its print already; ask the crew for another".to_owned(),
        n => format!("this session has asked for its {n} prints already; ask the crew for another"),
    }
}
