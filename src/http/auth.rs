//! Who is asking: bearer tokens of operators, participants (their session
//! token) and terminals.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, Error, HttpRequest};

use super::error::ApiError;
use super::AppState;
use crate::domain::keys::token_hash;
use crate::store::entities::sessions;

/// The bearer token of the request, if any.
pub fn bearer(req: &HttpRequest) -> Option<&str> {
    req.headers()
        .get(actix_web::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Compares secrets without an early exit on the first differing byte.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

pub fn is_operator(state: &AppState, req: &HttpRequest) -> bool {
    bearer(req).is_some_and(|t| same_secret(t, &state.operator_token))
}

pub fn require_operator(state: &AppState, req: &HttpRequest) -> Result<(), ApiError> {
    if is_operator(state, req) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized(
            "an operator bearer token is required",
        ))
    }
}

/// Middleware of the operator endpoints: 401 without the operator token,
/// before any other check (path, query, body), so that nothing else is
/// answered to a caller who is not an operator.
pub async fn operator_only(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, Error> {
    let allowed = req
        .app_data::<web::Data<AppState>>()
        .map(|state| require_operator(state, req.request()));
    match allowed {
        Some(Ok(())) => Ok(next.call(req).await?.map_into_left_body()),
        Some(Err(e)) => Ok(req.error_response(e).map_into_right_body()),
        None => {
            let e = ApiError::Internal("the application state is missing".into());
            Ok(req.error_response(e).map_into_right_body())
        }
    }
}

/// The session `id` if the request carries its participant token (or, when
/// `operator_allowed`, the operator token).
pub async fn require_session(
    state: &AppState,
    req: &HttpRequest,
    id: &str,
    operator_allowed: bool,
) -> Result<sessions::Model, ApiError> {
    let Some(token) = bearer(req) else {
        return Err(ApiError::Unauthorized(
            "the session's bearer token is required",
        ));
    };
    let session = state
        .store
        .session(id)
        .await?
        .ok_or(ApiError::NotFound("session"))?;
    let operator = operator_allowed && same_secret(token, &state.operator_token);
    if operator || same_secret(&token_hash(token), &session.participant_token_hash) {
        Ok(session)
    } else {
        Err(ApiError::Unauthorized(
            "this token does not open that session",
        ))
    }
}

/// A fresh random secret (two v4 UUIDs of hex: 244 random bits).
pub fn new_secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}
