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
    responses((status = 200, description = "Up.", body = super::schema::Health))
)]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Ready when the instance is not shutting down, the database answers,
/// every migration is applied and the media store takes a write and gives
/// it back.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "service",
    summary = "Readiness: the database answers, every migration is applied, the media store works.",
    responses(
        (status = 200, description = "Ready.", body = super::schema::Ready),
        (status = 503, description = "`not_ready`: the instance is shutting down, the database does not answer within 2 s, migrations are pending, or the media store does not take a probe write and read within 2 s (the message says which).", body = super::schema::ErrorBody),
    )
)]
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let not_ready = |message: &str| {
        HttpResponse::ServiceUnavailable().json(json!({"error": "not_ready", "message": message}))
    };
    if state.shutdown.is_set() {
        return not_ready("the instance is shutting down");
    }
    // A database that is down makes the pool wait for its acquire timeout:
    // a load balancer's probe wants its answer sooner.
    match tokio::time::timeout(READY_CHECK, state.store.is_ready()).await {
        Ok(true) => {}
        Ok(false) => return not_ready("the database is not reachable or migrations are pending"),
        Err(_) => return not_ready("the database did not answer within 2 s"),
    }
    let probe = state.media.probe(&state.instance_id);
    match tokio::time::timeout(READY_CHECK, probe).await {
        Ok(Ok(())) => HttpResponse::Ok().json(json!({"status": "ready"})),
        Ok(Err(e)) => not_ready(&format!(
            "the media store ({}) is down: {e}",
            state.media.describe()
        )),
        Err(_) => not_ready(&format!(
            "the media store ({}) did not answer within 2 s",
            state.media.describe()
        )),
    }
}

/// How long `/readyz` waits for the database, then for the media store.
const READY_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound("route"))
}
