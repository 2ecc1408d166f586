//! The organiser's webhook endpoints (admin adds and removes; viewers read
//! the list and the logs).
//!
//! - `POST /api/admin/webhooks` `{"url", "events": [...]}`: the URL is
//!   judged (no private or loopback address unless
//!   `STAGEHAND_WEBHOOK_ALLOW_PRIVATE=1`) and a `whsec_…` secret made; 201
//!   with the secret, shown this once (it is stored sealed with the
//!   server's key).
//! - `GET /api/admin/webhooks`, `DELETE /api/admin/webhooks/{id}`,
//!   `POST /api/admin/webhooks/{id}/enable` (after it was disabled).
//! - `GET /api/admin/webhooks/{id}/deliveries`: the endpoint's log, newest
//!   first; `POST …/deliveries/{delivery_id}/redeliver` sends one again
//!   with the same `webhook-id`.
//!
//! The sending is the webhook sender's (`crate::actors::webhook_sender`).

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::auth::signed_in;
use super::body::{parse_json, read_body};
use super::error::ApiError;
use super::AppState;
use crate::domain::audit::{AuditAction, AuditEntry};
use crate::domain::webhook::{new_secret, WebhookEvent};
use crate::store::webhooks::{delivery_json, webhook_json};

/// Endpoints at most.
const MAX_WEBHOOKS: usize = 20;
/// Deliveries a log shows at most.
const LOG_LIMIT: u64 = 200;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct WebhookBody {
    /// `https://…` (or `http://`): where the events are POSTed.
    #[schema(example = "https://crm.example.com/hooks/stagehand")]
    url: String,
    /// The events it takes: `session.completed`, `session.rejected`,
    /// `session.removed`, `print.completed`, `email.sent`, `email.failed`.
    #[schema(example = json!(["session.completed"]))]
    events: Vec<String>,
}

/// `POST /api/admin/webhooks`
#[utoipa::path(
    post,
    path = "/api/admin/webhooks",
    tag = "admin",
    summary = "Add a webhook endpoint: its secret (whsec_…) is in the answer, this once.",
    security(("operator" = [])),
    request_body = WebhookBody,
    responses(
        (status = 201, description = "Added: `webhook_id`, `secret` and the endpoint.", body = Object),
        (status = 400, description = "`invalid_json`: the body is not JSON for this request.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin adds endpoints.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: there are 20 endpoints already.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the URL is not http(s), is on a private or loopback address, or does not resolve; an event is unknown; no event.", body = super::schema::ErrorBody),
    )
)]
pub async fn add_webhook(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let body: WebhookBody = parse_json(&read_body(payload).await?)?;
    let events = events_of(&body.events)?;
    let url = state
        .hooks
        .sender
        .judge_url(body.url.trim())
        .await
        .map_err(ApiError::Validation)?;
    if state.store.webhooks().await?.len() >= MAX_WEBHOOKS {
        return Err(ApiError::Conflict(format!(
            "there are {MAX_WEBHOOKS} webhook endpoints already: remove one first"
        )));
    }
    let mut random = [0u8; 24];
    rand::fill(&mut random);
    let secret = new_secret(&random);
    let now = state.clock.now_ms();
    let endpoint = state
        .store
        .create_webhook(url.as_str(), &events, &state.hooks.seal.seal(&secret), now)
        .await?;
    let audit = AuditEntry::new(
        &operator,
        AuditAction::WebhookAdd,
        format!("webhook:{}", endpoint.id),
    )
    .detail(format!("{} for {}", endpoint.url, endpoint.events));
    state.store.record_audit(&audit, now).await?;
    state.wakeups.stats.ring();
    tracing::info!(webhook_id = %endpoint.id, url = %endpoint.url, events = %endpoint.events, "webhook endpoint added");
    let mut shown = webhook_json(&endpoint);
    shown["secret"] = json!(secret);
    Ok(HttpResponse::Created().json(shown))
}

/// The events named, each known, at least one, without repeats.
fn events_of(names: &[String]) -> Result<Vec<WebhookEvent>, ApiError> {
    let mut events: Vec<WebhookEvent> = Vec::new();
    for name in names {
        let event = WebhookEvent::parse(name).ok_or_else(|| {
            let known: Vec<&str> = WebhookEvent::ALL.iter().map(|e| e.as_str()).collect();
            ApiError::Validation(format!(
                "events: {name:?} is not an event; they are {}",
                known.join(", ")
            ))
        })?;
        if !events.contains(&event) {
            events.push(event);
        }
    }
    if events.is_empty() {
        return Err(ApiError::Validation(
            "events: name at least one event".into(),
        ));
    }
    Ok(events)
}

/// `GET /api/admin/webhooks`
#[utoipa::path(
    get,
    path = "/api/admin/webhooks",
    tag = "admin",
    summary = "The webhook endpoints (never their secrets), with whether each is enabled and since when it has been failing.",
    security(("operator" = [])),
    responses(
        (status = 200, description = "`{\"webhooks\": [...]}`.", body = Object),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
    )
)]
pub async fn list_webhooks(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let all: Vec<_> = state
        .store
        .webhooks()
        .await?
        .iter()
        .map(webhook_json)
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "webhooks": all })))
}

/// `DELETE /api/admin/webhooks/{id}`
#[utoipa::path(
    delete,
    path = "/api/admin/webhooks/{id}",
    tag = "admin",
    summary = "Remove a webhook endpoint and its deliveries (those not yet sent are not sent).",
    security(("operator" = [])),
    params(("id" = String, Path)),
    responses(
        (status = 204, description = "Removed."),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin removes endpoints.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`.", body = super::schema::ErrorBody),
    )
)]
pub async fn remove_webhook(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    state.store.delete_webhook(&id).await?;
    let audit = AuditEntry::new(
        &operator,
        AuditAction::WebhookRemove,
        format!("webhook:{id}"),
    );
    state
        .store
        .record_audit(&audit, state.clock.now_ms())
        .await?;
    state.wakeups.stats.ring();
    Ok(HttpResponse::NoContent().finish())
}

/// `POST /api/admin/webhooks/{id}/enable`
#[utoipa::path(
    post,
    path = "/api/admin/webhooks/{id}/enable",
    tag = "admin",
    summary = "Turn a disabled endpoint on again: its deliveries still pending are sent now.",
    security(("operator" = [])),
    params(("id" = String, Path)),
    responses(
        (status = 200, description = "The endpoint.", body = Object),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`.", body = super::schema::ErrorBody),
    )
)]
pub async fn enable_webhook(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let endpoint = state
        .store
        .enable_webhook(&id, state.clock.now_ms())
        .await?;
    let audit = AuditEntry::new(
        &operator,
        AuditAction::WebhookEnable,
        format!("webhook:{id}"),
    );
    state
        .store
        .record_audit(&audit, state.clock.now_ms())
        .await?;
    state.wakeups.stats.ring();
    Ok(HttpResponse::Ok().json(webhook_json(&endpoint)))
}

/// `GET /api/admin/webhooks/{id}/deliveries`
#[utoipa::path(
    get,
    path = "/api/admin/webhooks/{id}/deliveries",
    tag = "admin",
    summary = "An endpoint's delivery log, newest first (200 at most): each event's status, attempts, last answer and latency.",
    security(("operator" = [])),
    params(("id" = String, Path)),
    responses(
        (status = 200, description = "`{\"webhook\", \"deliveries\": [...]}`.", body = Object),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`.", body = super::schema::ErrorBody),
    )
)]
pub async fn webhook_deliveries(
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let endpoint = state
        .store
        .webhook(&id)
        .await?
        .ok_or(ApiError::NotFound("webhook"))?;
    let log: Vec<_> = state
        .store
        .deliveries_of(&id, LOG_LIMIT)
        .await?
        .iter()
        .map(delivery_json)
        .collect();
    Ok(HttpResponse::Ok().json(json!({"webhook": webhook_json(&endpoint), "deliveries": log})))
}

/// `POST /api/admin/webhooks/{id}/deliveries/{delivery_id}/redeliver`
#[utoipa::path(
    post,
    path = "/api/admin/webhooks/{id}/deliveries/{delivery_id}/redeliver",
    tag = "admin",
    summary = "Send a delivery again, with the same webhook-id and body.",
    security(("operator" = [])),
    params(("id" = String, Path), ("delivery_id" = String, Path)),
    responses(
        (status = 202, description = "Pending again: sent within a second.", body = Object),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: a viewer cannot redeliver.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: it is being sent right now.", body = super::schema::ErrorBody),
    )
)]
pub async fn redeliver(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let (webhook_id, delivery_id) = path.into_inner();
    let now = state.clock.now_ms();
    let delivery = state
        .store
        .redeliver(&webhook_id, &delivery_id, now)
        .await?;
    let audit = AuditEntry::new(
        &operator,
        AuditAction::WebhookRedeliver,
        format!("webhook:{webhook_id}"),
    )
    .detail(delivery_id.clone());
    state.store.record_audit(&audit, now).await?;
    Ok(HttpResponse::Accepted().json(delivery_json(&delivery)))
}
