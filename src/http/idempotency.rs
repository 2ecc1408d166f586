//! The Idempotency-Key rules, in one place: same key and same body after
//! completion -> the stored answer again (`Idempotent-Replayed: true`); same
//! key still running -> 409 `request_in_progress` at once; same key, other
//! body -> 422 `idempotency_key_reused`. Keys are scoped (per session token,
//! per operator) and expire after 24 h.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use std::future::Future;

use super::body::request_hash;
use super::error::ApiError;
use super::AppState;
use crate::store::idempotency::KeyClaim;

pub const HEADER: &str = "Idempotency-Key";
pub const REPLAYED: &str = "Idempotent-Replayed";
pub const KEY_TTL_MS: i64 = 24 * 3_600_000;

/// The request's key: `Ok(None)` when absent, 400 when malformed.
pub fn key_of(req: &HttpRequest) -> Result<Option<String>, ApiError> {
    match req.headers().get(HEADER) {
        None => Ok(None),
        Some(value) => {
            let key = value
                .to_str()
                .map_err(|_| ApiError::IdempotencyKeyRequired)?;
            if key.is_empty() || key.len() > 255 {
                return Err(ApiError::IdempotencyKeyRequired);
            }
            Ok(Some(key.to_owned()))
        }
    }
}

/// A handler's answer, as stored for replays.
pub struct Reply {
    pub status: StatusCode,
    pub body: serde_json::Value,
}

/// Runs `handler` under the key rules (or plainly when `key` is None).
/// Client errors (4xx) are stored and replayed like successes; a server
/// error forgets the key so the client may retry.
pub async fn run_idempotent<F, Fut>(
    state: &AppState,
    scope: &str,
    key: Option<String>,
    body: &[u8],
    handler: F,
) -> Result<(Reply, bool), ApiError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Reply, ApiError>>,
{
    let Some(key) = key else {
        return handler().await.map(|r| (r, false));
    };
    let now = state.clock.now_ms();
    match state
        .store
        .claim_key(scope, &key, &request_hash(body), now, KEY_TTL_MS)
        .await?
    {
        KeyClaim::Replay { status, body } => {
            let body = serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            return Ok((Reply { status, body }, true));
        }
        KeyClaim::InProgress => return Err(ApiError::RequestInProgress),
        KeyClaim::Mismatch => return Err(ApiError::IdempotencyKeyReused),
        KeyClaim::Fresh => {}
    }
    match handler().await {
        Ok(reply) => {
            state
                .store
                .finish_key(scope, &key, reply.status.as_u16(), &reply.body.to_string())
                .await?;
            Ok((reply, false))
        }
        Err(e) if e.status_code().is_client_error() => {
            state
                .store
                .finish_key(scope, &key, e.status_code().as_u16(), &e.body().to_string())
                .await?;
            Err(e)
        }
        Err(e) => {
            if let Err(release) = state.store.release_key(scope, &key).await {
                tracing::error!(error = %release, "could not release an idempotency key");
            }
            Err(e)
        }
    }
}

/// Builds the HTTP answer for a reply, marking replays; `location` is added
/// to successful answers.
pub fn respond(reply: Reply, replayed: bool, location: Option<String>) -> HttpResponse {
    let mut builder = HttpResponse::build(reply.status);
    if replayed {
        builder.insert_header((REPLAYED, "true"));
    }
    if let Some(location) = location.filter(|_| reply.status.is_success()) {
        builder.insert_header((actix_web::http::header::LOCATION, location));
    }
    builder.json(reply.body)
}
