//! The Idempotency-Key rules, in one place: same key and same body after
//! completion -> the stored answer again (`Idempotent-Replayed: true`); same
//! key still running -> 409 `request_in_progress` at once; same key, other
//! body -> 422 `idempotency_key_reused`. Keys are scoped per caller and
//! endpoint (the session token for submissions, the operator token and path
//! for operators, the path alone where there is no caller token, and there
//! the key must carry 122 random bits: [`strong_anonymous_key`]) and expire
//! after 24 h. A request holds its key for its lease
//! ([`crate::store::idempotency::KEY_LEASE_MS`]), renewed while it runs
//! ([`KEY_RENEW_EVERY`]); a request that died leaves the key to the next
//! retry one lease later.
//!
//! What is stored and replayed: successes, and client errors that are about
//! the request itself ([`ApiError::is_final_for_request`]). Answers about
//! the moment (401, 402, a 409 conflict, 429, 503, 5xx) release the key.
//!
//! Submissions apply the same rules through their batch
//! ([`answer_taken`]); the other endpoints through [`run_idempotent`].

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use std::future::Future;

use super::body::request_hash;
use super::error::ApiError;
use super::AppState;
use crate::store::idempotency::{KeyClaim, KeyRequest, StoredAnswer};
use crate::store::{retry_transient, transient_backoff, TRANSIENT_RETRIES};

pub const HEADER: &str = "Idempotency-Key";
pub const REPLAYED: &str = "Idempotent-Replayed";
pub const KEY_TTL_MS: i64 = 24 * 3_600_000;
/// How often a running request renews its key's lease
/// ([`crate::store::idempotency::KEY_LEASE_MS`]): a third of it.
pub const KEY_RENEW_EVERY: std::time::Duration =
    std::time::Duration::from_millis(crate::store::idempotency::KEY_LEASE_MS as u64 / 3);

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

/// The key of a request of `caller` (its bearer token; empty when
/// anonymous) in its scope, with the hash of its body and a new owner id
/// for this request.
pub fn key_request(scope: &str, key: &str, caller: &str, body: &[u8]) -> KeyRequest {
    KeyRequest::new(scope, key, caller, request_hash(body))
}

/// Whether a key sent without a caller token is unguessable: a UUID, or 32
/// or more hex digits (at least 122 random bits when made at random). With
/// no caller token the key itself is what keeps one caller's answer (a new
/// participant token) from another: a guessable key such as `1` is refused.
pub fn strong_anonymous_key(key: &str) -> bool {
    let hex_digits = key.chars().filter(char::is_ascii_hexdigit).count();
    let all_hex = key.chars().all(|c| c.is_ascii_hexdigit());
    uuid::Uuid::try_parse(key).is_ok() || (all_hex && hex_digits >= 32)
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

/// Runs `handler`, again after a transient database error (up to
/// [`TRANSIENT_RETRIES`] times, with backoff and jitter), then answers
/// 503 `busy` with `Retry-After`. The handler must be safe to repeat after
/// such an error: its transaction was rolled back.
async fn with_transient_retry<F, Fut>(mut handler: F) -> Result<Reply, ApiError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Reply, ApiError>>,
{
    let mut retry = 0;
    loop {
        match handler().await {
            Err(ApiError::Busy) if retry < TRANSIENT_RETRIES => {
                tokio::time::sleep(transient_backoff(retry, rand::random::<f64>())).await;
                retry += 1;
            }
            other => return other,
        }
    }
}

/// Runs `handler` under the key rules (or plainly when `key` is None).
/// Successes and answers about the request itself are stored and
/// replayed; any other error releases the key so the client may retry.
/// When storing the answer fails after the handler's change committed, the
/// answer still tells what happened (the key is free again after its
/// lease).
pub async fn run_idempotent<F, Fut>(
    state: &AppState,
    scope: &str,
    caller: &str,
    key: Option<String>,
    body: &[u8],
    handler: F,
) -> Result<(Reply, bool), ApiError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Reply, ApiError>>,
{
    let key = key.map(|key| (key, request_hash(body)));
    run_keyed(state, scope, caller, key, handler).await
}

/// [`run_idempotent`] for a body hashed already with [`request_hash`]: a
/// photo's megabytes are hashed in the photo pool, so an HTTP worker
/// never stalls on them while other requests wait.
pub async fn run_idempotent_hashed<F, Fut>(
    state: &AppState,
    scope: &str,
    caller: &str,
    key: String,
    body_hash: String,
    handler: F,
) -> Result<(Reply, bool), ApiError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Reply, ApiError>>,
{
    run_keyed(state, scope, caller, Some((key, body_hash)), handler).await
}

/// The key rules of [`run_idempotent`], for a key and its body's hash.
async fn run_keyed<F, Fut>(
    state: &AppState,
    scope: &str,
    caller: &str,
    key: Option<(String, String)>,
    handler: F,
) -> Result<(Reply, bool), ApiError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Reply, ApiError>>,
{
    let Some((key, body_hash)) = key else {
        return with_transient_retry(handler).await.map(|r| (r, false));
    };
    let key = KeyRequest::new(scope, &key, caller, body_hash).on_instance(
        state
            .store
            .is_postgres()
            .then_some(state.instance_id.as_str()),
    );
    let now = state.clock.now_ms();
    let claim = retry_transient(|| state.store.claim_key(&key, now, KEY_TTL_MS)).await?;
    if let Some(answer) = answer_taken(claim) {
        return answer;
    }
    let outcome = keeping_the_key(state, &key, with_transient_retry(handler)).await;
    let stored = match &outcome {
        Ok(reply) => Some(reply.stored()),
        Err(e) if e.is_final_for_request() => Some(e.stored()),
        Err(_) => None,
    };
    let recorded = match &stored {
        Some(answer) => retry_transient(|| state.store.finish_key(&key, answer)).await,
        None => {
            let keys = [&key];
            retry_transient(|| state.store.release_keys(&keys)).await
        }
    };
    if let Err(e) = recorded {
        tracing::error!(
            error = %e,
            scope = %key.scope,
            "could not record the outcome of an Idempotency-Key; answering what happened, \
             the key is free again after its lease"
        );
    }
    outcome.map(|reply| (reply, false))
}

/// Runs `work` while renewing `key`'s lease every [`KEY_RENEW_EVERY`], so a
/// request that runs longer than one lease (a bulk action over thousands of
/// sagas) keeps its key: the same request sent again meanwhile is 409
/// `request_in_progress`, never run twice. A process that dies stops
/// renewing, and the key is taken over one lease later.
async fn keeping_the_key<T>(
    state: &AppState,
    key: &crate::store::idempotency::KeyRequest,
    work: impl Future<Output = T>,
) -> T {
    let renew = async {
        loop {
            tokio::time::sleep(KEY_RENEW_EVERY).await;
            match state.store.renew_key(key, state.clock.now_ms()).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(scope = %key.scope, "a running request lost its Idempotency-Key (it outlived its lease); it finishes, and its answer is not stored");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, scope = %key.scope, "could not renew a running request's Idempotency-Key; trying again")
                }
            }
        }
    };
    let (work, renew) = (std::pin::pin!(work), std::pin::pin!(renew));
    match futures_util::future::select(work, renew).await {
        futures_util::future::Either::Left((outcome, _)) => outcome,
        futures_util::future::Either::Right(((), work)) => work.await,
    }
}

/// The Idempotency-Key scope of an operator's POST: one per endpoint (the
/// path, which names the saga), so a key reused on another endpoint is a
/// new request there.
pub fn operator_scope(req: &HttpRequest) -> String {
    format!("operator {}", req.path())
}

/// An operator's write under the Idempotency-Key rules, scoped to the
/// operator's token and the path: the body is read, then `handler` runs
/// with it (or the stored answer of the same request is replayed), and
/// its reply is the answer.
pub async fn operator_write<F, Fut>(
    state: &AppState,
    req: &HttpRequest,
    payload: actix_web::web::Payload,
    mut handler: F,
) -> Result<HttpResponse, ApiError>
where
    F: FnMut(actix_web::web::Bytes) -> Fut,
    Fut: Future<Output = Result<Reply, ApiError>>,
{
    let key = key_of(req)?;
    let body = super::body::read_body(payload).await?;
    let scope = operator_scope(req);
    let caller = super::auth::caller_token(req);
    let (reply, replayed) =
        run_idempotent(state, &scope, caller, key, &body, || handler(body.clone())).await?;
    Ok(respond(reply, replayed, None))
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
