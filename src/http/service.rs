//! Service endpoints: liveness, readiness, and the JSON 404.

use actix_web::{web, HttpResponse};
use serde_json::json;

use super::error::ApiError;
use super::AppState;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Ready when the database answers and every migration is applied.
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
