//! `GET /metrics`: the Prometheus scrape. Not public: it needs a bearer
//! credential (`STAGEHAND_METRICS_TOKEN`, or the operator token); without
//! one it is served only on the separate `--metrics-bind` address
//! ([`metrics_only`]). A scrape is cheap: its text is made at most once a
//! second and shared by every scrape meanwhile
//! ([`crate::metrics::ScrapeCache`]); the database is read on the work
//! pool, never the pool the participants' requests use. The text is made by
//! [`crate::metrics::render`].

use actix_web::{web, HttpRequest, HttpResponse};

use super::auth::{bearer, same_secret};
use super::error::ApiError;
use super::AppState;
use crate::metrics::{render, Scrape};

/// The content type of the Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "service",
    summary = "Prometheus metrics (text format 0.0.4); bearer STAGEHAND_METRICS_TOKEN or the operator token.",
    security(("operator" = [])),
    description = "Sagas per step, aborts per reason, queue depth, AI slots per experience, the breaker, outbox lag, sockets and database pools, read at scrape time; step, saga, AI request and AI job durations and claim batch sizes as histograms. Always 200 while the process runs: when the database cannot be read, `stagehand_metrics_database_up` is 0 and the figures read from it are missing.",
    responses(
        (status = 200, description = "The metrics, one `name{labels} value` per line, with `# HELP` and `# TYPE` lines.", body = String, content_type = "text/plain; version=0.0.4; charset=utf-8"),
        (status = 401, description = "`unauthorized`: no metrics or operator token.", body = super::schema::ErrorBody),
    )
)]
pub async fn metrics(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let allowed = bearer(&req).is_some_and(|token| {
        same_secret(token, &state.operator_token)
            || state
                .metrics_token
                .as_deref()
                .is_some_and(|m| same_secret(token, m))
    });
    if !allowed {
        return Err(ApiError::Unauthorized(
            "/metrics needs STAGEHAND_METRICS_TOKEN or the operator token as a bearer token",
        ));
    }
    Ok(metrics_only(state).await)
}

/// The scrape without a credential: what `--metrics-bind` serves.
pub async fn metrics_only(state: web::Data<AppState>) -> HttpResponse {
    let text = render(Scrape {
        requests: &state.store,
        work: &state.work_store,
        clock: &state.clock,
        instance_id: &state.instance_id,
        cache: &state.scrape_cache,
    })
    .await;
    HttpResponse::Ok()
        .content_type(CONTENT_TYPE)
        .insert_header(("Cache-Control", "no-cache"))
        .body(text)
}
