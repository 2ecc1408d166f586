//! Service endpoints: liveness, readiness, and the JSON 404.

use actix_web::{web, HttpResponse};
use serde_json::json;

use super::error::ApiError;
use super::AppState;

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "service",
    summary = "Liveness: the process answers.",
    responses((status = 200, description = "Up.", body = super::openapi::Health))
)]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Ready when the database answers and every migration is applied.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "service",
    summary = "Readiness: the database answers and every migration is applied.",
    responses(
        (status = 200, description = "Ready.", body = super::openapi::Ready),
        (status = 503, description = "`not_ready`: the database is not reachable or migrations are pending.", body = super::openapi::ErrorBody),
    )
)]
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    if state.store.is_ready().await {
        HttpResponse::Ok().json(json!({"status": "ready"}))
    } else {
        HttpResponse::ServiceUnavailable().json(json!({
            "error": "not_ready",
            "message": "the database is not reachable or migrations are pending"
        }))
    }
}

pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound("route"))
}
