//! Who is asking: bearer tokens of operators (the bootstrap token and the
//! operator accounts, each with a role), participants (their session
//! token) and terminals; and the role each operator route needs.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, Error, HttpMessage, HttpRequest};

use super::error::ApiError;
use super::AppState;
use crate::domain::keys::token_hash;
use crate::domain::roles::{Operator, Role};
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

/// The caller an Idempotency-Key is scoped to: the request's bearer token
/// (empty without one).
pub fn caller_token(req: &HttpRequest) -> &str {
    bearer(req).unwrap_or("")
}

/// Compares secrets without an early exit on the first differing byte.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The operator whose token `token` is: the bootstrap admin, or an
/// operator account that is not revoked (read from the database on every
/// request, so a revocation holds at once on every instance).
pub async fn operator_by_token(
    state: &AppState,
    token: &str,
) -> Result<Option<Operator>, ApiError> {
    if same_secret(token, &state.operator_token) {
        return Ok(Some(Operator::bootstrap()));
    }
    Ok(state.store.operator_by_token(token).await?)
}

/// The operator the request's bearer token names, if any.
pub async fn operator_of(
    state: &AppState,
    req: &HttpRequest,
) -> Result<Option<Operator>, ApiError> {
    match bearer(req) {
        Some(token) => operator_by_token(state, token).await,
        None => Ok(None),
    }
}

/// The signed-in operator of a request that went through one of the
/// role middlewares ([`admin_only`], [`moderator_only`], [`viewer_only`]).
pub fn signed_in(req: &HttpRequest) -> Result<Operator, ApiError> {
    req.extensions()
        .get::<Operator>()
        .cloned()
        .ok_or_else(|| ApiError::Internal("an operator route without its role check".into()))
}

/// 403 `forbidden` unless `operator` may take an action that `needs`
/// that role.
pub fn require_role(operator: &Operator, needs: Role) -> Result<(), ApiError> {
    match operator.refusal(needs) {
        Some(message) => Err(ApiError::Forbidden { needs, message }),
        None => Ok(()),
    }
}

/// The middleware of operator routes: 401 without a valid operator token,
/// 403 when its role may not take the route's action, both before any
/// other check (path, query, body), so that nothing else is answered to
/// a caller who may not. The operator goes into the request's extensions
/// for the handler ([`signed_in`]). Which role each route needs is said
/// where the routes are listed ([`super::routes`]).
async fn with_role<B: MessageBody>(
    needs: Role,
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, Error> {
    let Some(state) = req.app_data::<web::Data<AppState>>().cloned() else {
        let e = ApiError::Internal("the application state is missing".into());
        return Ok(req.error_response(e).map_into_right_body());
    };
    let allowed = match operator_of(&state, req.request()).await {
        Ok(Some(operator)) => require_role(&operator, needs).map(|()| operator),
        Ok(None) => Err(ApiError::Unauthorized(
            "an operator bearer token is required",
        )),
        Err(e) => Err(e),
    };
    match allowed {
        Ok(operator) => {
            req.extensions_mut().insert(operator);
            Ok(next.call(req).await?.map_into_left_body())
        }
        Err(e) => Ok(req.error_response(e).map_into_right_body()),
    }
}

/// Routes only an admin may take.
pub async fn admin_only<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, Error> {
    with_role(Role::Admin, req, next).await
}

/// Routes a moderator (or an admin) may take: review decisions, hiding.
pub async fn moderator_only<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, Error> {
    with_role(Role::Moderator, req, next).await
}

/// Routes every operator may take: reads.
pub async fn viewer_only<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, Error> {
    with_role(Role::Viewer, req, next).await
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
    // The participant's own token first: a phone's poll costs no operator
    // lookup.
    if same_secret(&token_hash(token), &session.participant_token_hash)
        || (operator_allowed && operator_by_token(state, token).await?.is_some())
    {
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
