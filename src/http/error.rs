//! The one error type of the HTTP layer and its mapping to status codes and
//! the JSON shape `{"error": "<code>", "message": "<human text>"}`.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::domain::saga::TransitionError;
use crate::store::StoreError;

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
    #[error("this Idempotency-Key was used with a different request body")]
    IdempotencyKeyReused,
    #[error("a request with this Idempotency-Key is still in progress")]
    RequestInProgress,
    #[error("this session has already submitted")]
    AlreadySubmitted,
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("the database is not reachable right now")]
    Unavailable,
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidJson(_) => "invalid_json",
            ApiError::Validation(_) => "validation_failed",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::IdempotencyKeyRequired => "idempotency_key_required",
            ApiError::IdempotencyKeyReused => "idempotency_key_reused",
            ApiError::RequestInProgress => "request_in_progress",
            ApiError::AlreadySubmitted => "already_submitted",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict(_) => "conflict",
            ApiError::Unsupported(_) => "unsupported",
            ApiError::Unavailable => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }

    /// The JSON body of this error.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": self.code(), "message": self.to_string()})
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::InvalidJson(_) | ApiError::IdempotencyKeyRequired => StatusCode::BAD_REQUEST,
            ApiError::Validation(_) | ApiError::IdempotencyKeyReused | ApiError::Unsupported(_) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestInProgress | ApiError::AlreadySubmitted | ApiError::Conflict(_) => {
                StatusCode::CONFLICT
            }
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let ApiError::Internal(detail) = self {
            tracing::error!(%detail, "request failed");
        }
        HttpResponse::build(self.status_code()).json(self.body())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(what) => ApiError::NotFound(what),
            StoreError::AlreadySubmitted => ApiError::AlreadySubmitted,
            StoreError::Conflict(message) => ApiError::Conflict(message),
            // An operator's action on a saga that moved on (the workers'
            // own writes never reach HTTP).
            StoreError::Transition(TransitionError::Conflict { detail, .. }) => {
                ApiError::Conflict(detail)
            }
            StoreError::Transition(e) => ApiError::Conflict(e.to_string()),
            StoreError::Db(sea_orm::DbErr::ConnectionAcquire(_))
            | StoreError::Db(sea_orm::DbErr::Conn(_)) => ApiError::Unavailable,
            other => ApiError::Internal(other.to_string()),
        }
    }
}
