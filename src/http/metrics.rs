//! `GET /metrics`: the Prometheus scrape, public like `/healthz` (no token,
//! as Prometheus expects; it shows counts and timings, never a token, a
//! prompt or a nickname). The text is made by [`crate::metrics::render`].

use actix_web::{web, HttpResponse};

use super::AppState;
use crate::metrics::{render, Scrape};

/// The content type of the Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "service",
    summary = "Prometheus metrics (text format 0.0.4); public, no token.",
    description = "Sagas per step, aborts per reason, queue depth, AI slots per experience, the breaker, outbox lag, sockets and database pools, read at scrape time; step, saga, AI request and AI job durations and claim batch sizes as histograms. Always 200 while the process runs: when the database cannot be read, `stagehand_metrics_database_up` is 0 and the figures read from it are missing.",
    responses(
        (status = 200, description = "The metrics, one `name{labels} value` per line, with `# HELP` and `# TYPE` lines.", body = String, content_type = "text/plain; version=0.0.4; charset=utf-8"),
    )
)]
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let text = render(Scrape {
        requests: &state.store,
        work: &state.work_store,
        clock: &state.clock,
        instance_id: &state.instance_id,
    })
    .await;
    HttpResponse::Ok()
        .content_type(CONTENT_TYPE)
        .insert_header(("Cache-Control", "no-cache"))
        .body(text)
}
