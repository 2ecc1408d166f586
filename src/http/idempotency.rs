//! The Idempotency-Key rules, in one place: same key and same body after
//! completion -> the stored answer again (`Idempotent-Replayed: true`); same
//! key still running -> 409 `request_in_progress` at once; same key, other
//! body -> 422 `idempotency_key_reused`. Keys are scoped (per session token,
//! per operator) and expire after 24 h. Submissions apply the same rules
//! through their batch ([`answer_taken`]); the other endpoints through
//! [`run_idempotent`].

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use std::future::Future;

use super::body::request_hash;
use super::error::ApiError;
use super::AppState;
use crate::store::idempotency::{KeyClaim, KeyRequest, StoredAnswer};

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

impl Reply {
    pub fn stored(&self) -> StoredAnswer {
        StoredAnswer {
            status: self.status.as_u16(),
            body: self.body.to_string(),
        }
    }

    fn from_stored(answer: StoredAnswer) -> Reply {
        Reply {
            status: StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK),
            body: serde_json::from_str(&answer.body).unwrap_or(serde_json::Value::Null),
        }
    }
}

impl ApiError {
    /// This client error as stored for replays.
    pub fn stored(&self) -> StoredAnswer {
        StoredAnswer {
            status: self.status_code().as_u16(),
            body: self.body().to_string(),
        }
    }
}

/// The key of a request in its scope, with the hash of its body.
pub fn key_request(scope: &str, key: &str, body: &[u8]) -> KeyRequest {
    KeyRequest {
        scope: scope.to_owned(),
        key: key.to_owned(),
        request_hash: request_hash(body),
    }
}

/// The answer to a request whose key was taken before: the stored answer
/// again (replayed), or 409 while the first still runs, or 422 for another
/// body. None for a fresh key: the request runs.
pub fn answer_taken(claim: KeyClaim) -> Option<Result<(Reply, bool), ApiError>> {
    match claim {
        KeyClaim::Fresh => None,
        KeyClaim::Replay(answer) => Some(Ok((Reply::from_stored(answer), true))),
        KeyClaim::InProgress => Some(Err(ApiError::RequestInProgress)),
        KeyClaim::Mismatch => Some(Err(ApiError::IdempotencyKeyReused)),
    }
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
    let key = key_request(scope, &key, body);
    let now = state.clock.now_ms();
    let claim = state
        .store
        .claim_key(&key.scope, &key.key, &key.request_hash, now, KEY_TTL_MS)
        .await?;
    if let Some(answer) = answer_taken(claim) {
        return answer;
    }
    match handler().await {
        Ok(reply) => {
            state.store.finish_key(&key, &reply.stored()).await?;
            Ok((reply, false))
        }
        Err(e) if e.status_code().is_client_error() => {
            state.store.finish_key(&key, &e.stored()).await?;
            Err(e)
        }
        Err(e) => {
            if let Err(release) = state.store.release_keys(&[&key]).await {
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
