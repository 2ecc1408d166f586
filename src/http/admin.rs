//! The operators' console API (bearer operator token): the saga list, retry
//! and cancel of one saga, the booths' presence, the AI provider's circuit
//! breaker, and the live `stats` socket `GET /ws/operators?token=`.
//!
//! Retry and cancel are fenced in the store (a retry only moves an ABORTED
//! saga, a cancel only a runnable one; of two at once exactly one applies)
//! and idempotent: with an `Idempotency-Key` the first answer is replayed,
//! and without one a second cancel of a cancelled saga is still 200. A saga
//! whose state does not allow the action answers 409 `conflict` saying why.

use actix::Actor;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::auth::{operator_by_token, signed_in};
use super::body::{parse_json, read_body};
use super::error::ApiError;
use super::idempotency::{operator_write, Reply};
use super::AppState;
use crate::actors::operator_socket::OperatorSocket;
use crate::actors::persistence::WriteAlone;
use crate::clock::rfc3339;
use crate::domain::audit::{AuditAction, AuditEntry};
use crate::domain::breaker::{Opener, COOL_DOWN_MS};
use crate::domain::presence::PRESENCE_STALE_MS;
use crate::domain::saga::{AbortReason, Step};
use crate::store::breaker::DEFAULT_PROVIDER;
use crate::store::operators::{SagaCursor, SagaFilter, SagaView, MAX_PAGE, MAX_QUERY_CHARS};
use crate::store::transitions::SagaWrite;

/// Sagas per page when `limit` is not given.
const DEFAULT_PAGE: u64 = 50;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SagaListQuery {
    step: Option<String>,
    reason: Option<String>,
    experience: Option<String>,
    q: Option<String>,
    limit: Option<u64>,
    cursor: Option<String>,
}

/// A step named in a query or a filter (empty: none).
pub(super) fn step_named(text: Option<&str>) -> Result<Option<Step>, ApiError> {
    match text.filter(|s| !s.is_empty()) {
        Some(text) => Ok(Some(text.parse::<Step>().map_err(|_| {
            ApiError::Validation(format!(
                "step {text:?} is not a saga step (e.g. AI_PENDING, IN_REVIEW, ABORTED)"
            ))
        })?)),
        None => Ok(None),
    }
}

/// An abort reason named in a query or a filter (empty: none).
pub(super) fn reason_named(text: Option<&str>) -> Result<Option<AbortReason>, ApiError> {
    match text.filter(|s| !s.is_empty()) {
        Some(text) => Ok(Some(text.parse::<AbortReason>().map_err(|_| {
            ApiError::Validation(format!(
                "reason {text:?} is not an abort reason (e.g. AI_FAILED, CANCELLED)"
            ))
        })?)),
        None => Ok(None),
    }
}

/// A search text: part of a nickname, or the start of a session id.
pub(super) fn search_text(q: Option<&str>) -> Result<Option<String>, ApiError> {
    match q.map(str::trim).filter(|q| !q.is_empty()) {
        Some(q) if q.chars().count() > MAX_QUERY_CHARS => Err(ApiError::Validation(format!(
            "q must be at most {MAX_QUERY_CHARS} characters"
        ))),
        Some(q) => Ok(Some(q.to_owned())),
        None => Ok(None),
    }
}

fn saga_filter(q: &SagaListQuery) -> Result<(SagaFilter, u64), ApiError> {
    let step = step_named(q.step.as_deref())?;
    let reason = reason_named(q.reason.as_deref())?;
    let after = match q.cursor.as_deref().filter(|s| !s.is_empty()) {
        Some(text) => Some(SagaCursor::decode(text).ok_or_else(|| {
            ApiError::Validation("cursor is not one this server handed out".into())
        })?),
        None => None,
    };
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::Validation(format!(
            "limit must be 1 to {MAX_PAGE}"
        )));
    }
    Ok((
        SagaFilter {
            step,
            reason,
            experience: q.experience.clone().filter(|s| !s.is_empty()),
            q: search_text(q.q.as_deref())?,
            after,
            ..SagaFilter::default()
        },
        limit,
    ))
}

/// `GET /api/admin/sagas?step=&reason=&experience=&q=&limit=&cursor=` ->
/// `{"sagas": [...], "next_cursor"}`, newest change first.
#[utoipa::path(
    get,
    path = "/api/admin/sagas",
    tag = "admin",
    summary = "List sagas, newest change first, a page at a time.",
    security(("operator" = [])),
    params(
        ("step" = Option<crate::domain::saga::Step>, Query, description = "Only sagas at this step."),
        ("reason" = Option<crate::domain::saga::AbortReason>, Query, description = "Only sagas aborted for this reason."),
        ("experience" = Option<String>, Query, description = "Only sagas of this experience (slug)."),
        ("q" = Option<String>, Query, max_length = 100, description = "Search: part of the participant's nickname (any case), or the start of the session id."),
        ("limit" = Option<u64>, Query, minimum = 1, maximum = 500, description = "Sagas per page, 1 to 500; default 50."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page."),
    ),
    responses(
        (status = 200, description = "One page of sagas.", body = super::schema::SagaList),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: an unknown step, reason, cursor or query parameter, or a limit out of range.", body = super::schema::ErrorBody),
    )
)]
pub async fn list_sagas(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<SagaListQuery>,
) -> Result<HttpResponse, ApiError> {
    signed_in(&req)?;
    let (filter, limit) = saga_filter(&query)?;
    let (sagas, next) = state
        .store
        .saga_views(&filter, limit, state.clock.now_ms())
        .await?;
    Ok(HttpResponse::Ok().json(json!({
        "sagas": sagas,
        "next_cursor": next.map(|c| c.encode()),
    })))
}

/// `GET /api/admin/sagas/{id}` -> the saga as the list shows it.
#[utoipa::path(
    get,
    path = "/api/admin/sagas/{id}",
    tag = "admin",
    summary = "One saga, as the list shows it.",
    security(("operator" = [])),
    params(("id" = String, Path, description = "The saga's id.")),
    responses(
        (status = 200, description = "The saga.", body = super::schema::SagaOne),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such saga.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the path could not be read.", body = super::schema::ErrorBody),
    )
)]
pub async fn get_saga(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    signed_in(&req)?;
    let view = saga_or_404(&state, &id).await?;
    Ok(HttpResponse::Ok().json(json!({"saga": view})))
}

/// Saga `id` as operators see it, or 404.
async fn saga_or_404(state: &AppState, id: &str) -> Result<SagaView, ApiError> {
    state
        .store
        .saga_view(id, state.clock.now_ms())
        .await?
        .ok_or(ApiError::NotFound("saga"))
}

/// An operator's action on saga `id` under the Idempotency-Key rules
/// (scoped to the operator and the endpoint), answered with the saga as it
/// stands after the action. `action` gets the audit record to write with
/// its change.
pub(super) async fn saga_action<F, Fut>(
    state: &AppState,
    req: &HttpRequest,
    id: &str,
    payload: web::Payload,
    kind: AuditAction,
    action: F,
) -> Result<HttpResponse, ApiError>
where
    F: Fn(AuditEntry) -> Fut,
    Fut: std::future::Future<Output = Result<(), ApiError>>,
{
    let operator = signed_in(req)?;
    let audit = AuditEntry::new(&operator, kind, format!("saga:{id}"));
    let (action, audit) = (&action, &audit);
    operator_write(state, req, payload, |_| async move {
        action(audit.clone()).await?;
        let view = saga_or_404(state, id).await?;
        Ok(Reply {
            status: StatusCode::OK,
            body: json!({"saga": view}),
        })
    })
    .await
}

/// `POST /api/admin/sagas/{id}/retry`: an ABORTED saga runs again from the
/// step it aborted at, with fresh attempts, keeping its AI result and
/// ranking entry. 409 unless it is ABORTED and its session's latest.
#[utoipa::path(
    post,
    path = "/api/admin/sagas/{id}/retry",
    tag = "admin",
    summary = "Run an ABORTED saga again.",
    description = "The saga runs again from the step it aborted at, with fresh attempts, keeping its AI result and ranking entry. Any request body is ignored (it only takes part in the Idempotency-Key comparison).",
    security(("operator" = [])),
    params(
        ("id" = String, Path, description = "The saga's id."),
        super::schema::OperatorKey,
    ),
    responses(
        (status = 200, description = "The saga after the action (or the replay of an earlier answer).", body = super::schema::SagaOne, headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with the same Idempotency-Key."))),
        (status = 400, description = "`idempotency_key_required`: the Idempotency-Key is malformed.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 402, description = "`budget_exhausted`: the saga gave its credits back when it aborted, and the experience has not enough left to charge it again.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such saga.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: the saga is not ABORTED, or not its session's latest, or the session took a new submission; `request_in_progress`: the same Idempotency-Key is still running.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the path could not be read; `idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
    )
)]
pub async fn retry_saga(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    saga_action(
        &state,
        &req,
        &id,
        payload,
        AuditAction::SagaRetry,
        |audit| {
            let state = state.clone();
            let id = id.clone();
            async move { retry_one(&state, &id, &audit).await }
        },
    )
    .await
}

/// The operator's retry of one saga (the endpoint's, and each of a bulk
/// retry's), recorded with `audit`.
pub(super) async fn retry_one(
    state: &AppState,
    id: &str,
    audit: &AuditEntry,
) -> Result<(), ApiError> {
    let retried = state
        .store
        .retry_saga(
            id,
            Some(audit),
            state.clock.now_ms(),
            state.saga_deadline_ms,
        )
        .await?;
    state.wakeups.saga_work();
    if retried.back_in_review {
        state.wakeups.review_changed();
    }
    if let Some(experience) = retried.ranking_changed {
        state.wakeups.rankings_changed(&[experience], false);
    }
    Ok(())
}

/// `POST /api/admin/sagas/{id}/cancel`: a running saga aborts with
/// CANCELLED, whoever holds it (the holder's next fenced write finds it
/// ended), and its terminal is told like for any abort. 409 when it already
/// ended otherwise.
#[utoipa::path(
    post,
    path = "/api/admin/sagas/{id}/cancel",
    tag = "admin",
    summary = "Cancel a running saga (it aborts with CANCELLED).",
    description = "Whoever holds the saga, it aborts with CANCELLED and its terminal is told like for any abort. Cancelling a saga already CANCELLED answers 200 again. Any request body is ignored (it only takes part in the Idempotency-Key comparison).",
    security(("operator" = [])),
    params(
        ("id" = String, Path, description = "The saga's id."),
        super::schema::OperatorKey,
    ),
    responses(
        (status = 200, description = "The saga after the action (or the replay of an earlier answer).", body = super::schema::SagaOne, headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with the same Idempotency-Key."))),
        (status = 400, description = "`idempotency_key_required`: the Idempotency-Key is malformed.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such saga.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: the saga already ended otherwise; `request_in_progress`: the same Idempotency-Key is still running.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the path could not be read; `idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
    )
)]
pub async fn cancel_saga(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    saga_action(
        &state,
        &req,
        &id,
        payload,
        AuditAction::SagaCancel,
        |audit| {
            let state = state.clone();
            let id = id.clone();
            async move {
                saga_or_404(&state, &id).await?;
                cancel_one(&state, &id, Some(audit)).await
            }
        },
    )
    .await
}

/// The operator's cancel of one saga (the endpoint's, each of a bulk
/// cancel's, and an erasure's), recorded with `audit`.
pub(super) async fn cancel_one(
    state: &AppState,
    id: &str,
    audit: Option<AuditEntry>,
) -> Result<(), ApiError> {
    let write = SagaWrite::operator_cancel(id, audit);
    // Its wake-ups (the dispatchers, the operators' hubs: a saga
    // cancelled in review leaves the queue) follow the write.
    state
        .persistence
        .send(WriteAlone(write))
        .await
        .map_err(|e| ApiError::Internal(format!("the persistence actor is gone: {e}")))??;
    tracing::info!(saga_id = %id, "operator cancel: saga aborted with CANCELLED");
    Ok(())
}

#[derive(Deserialize)]
pub struct TerminalsQuery {
    experience: Option<String>,
}

/// `GET /api/terminals?experience=slug` -> `{"terminals": [...]}`: every
/// booth with its presence across the instances (connected displays, since
/// when, last acked `seq`, events not yet acked).
#[utoipa::path(
    get,
    path = "/api/terminals",
    tag = "admin",
    summary = "Every booth terminal with its displays' presence across the instances.",
    security(("operator" = [])),
    params(("experience" = Option<String>, Query, description = "Only the terminals of this experience (slug).")),
    responses(
        (status = 200, description = "The terminals.", body = super::schema::TerminalList),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such experience.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the query could not be read.", body = super::schema::ErrorBody),
    )
)]
pub async fn list_terminals(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<TerminalsQuery>,
) -> Result<HttpResponse, ApiError> {
    signed_in(&req)?;
    let now = state.clock.now_ms();
    let slug = query.experience.as_deref().filter(|s| !s.is_empty());
    if let Some(slug) = slug {
        state.experience(slug).await?;
    }
    let terminals = state
        .store
        .terminal_views(slug, now - PRESENCE_STALE_MS)
        .await?;
    Ok(HttpResponse::Ok().json(json!({"terminals": terminals})))
}

#[derive(Deserialize)]
pub struct OperatorSocketQuery {
    token: Option<String>,
}

/// `GET /ws/operators?token=`: the live `stats` frames. A wrong token is
/// answered 401 before the upgrade.
#[utoipa::path(
    get,
    path = "/ws/operators",
    tag = "websockets",
    summary = "The operators' live socket: `stats` and saga frames (see the description).",
    params(("token" = String, Query, description = "The operator token (browsers' WebSocket API sends no header).")),
    responses(
        (status = 101, description = "Switching Protocols: the socket is open (JSON text frames, see the description)."),
        (status = 401, description = "`unauthorized`: the token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the path or query could not be read.", body = super::schema::ErrorBody),
        (status = 426, description = "`upgrade_required`: the request is not a WebSocket handshake.", body = super::schema::ErrorBody, headers(("Upgrade" = String, description = "`websocket`"))),
    )
)]
pub async fn operator_socket(
    state: web::Data<AppState>,
    query: web::Query<OperatorSocketQuery>,
    req: HttpRequest,
    body: web::Payload,
) -> Result<HttpResponse, actix_web::Error> {
    let operator = match query.token.as_deref() {
        Some(token) => operator_by_token(&state, token).await?,
        None => None,
    };
    let Some(operator) = operator else {
        return Err(ApiError::Unauthorized("an operator token is required").into());
    };
    let (response, session, stream) =
        actix_ws::handle(&req, body).map_err(ApiError::not_a_handshake)?;
    let socket = OperatorSocket::new(
        state.operators.clone(),
        operator.id,
        state.store.clone(),
        session,
        state.display_heartbeat,
        state.shutdown.clone(),
    );
    OperatorSocket::create(|ctx| {
        use actix::AsyncContext;
        ctx.add_stream(stream);
        socket
    });
    Ok(response)
}

/// A provider's circuit breaker as operators see it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct BreakerView {
    /// The provider (`default` without a providers file).
    pub provider: String,
    /// `closed` (AI work is claimed), `open` (none is, until `open_until`),
    /// `probing` (open, its cool-down over: one saga is trying the
    /// provider).
    pub state: String,
    /// RFC 3339, while open.
    pub open_until: Option<String>,
    /// RFC 3339, while a probe is out.
    pub probe_until: Option<String>,
    /// Who opened it, while open: `operator` (by hand; only its time
    /// running out, then a successful probe, or an operator closes it),
    /// `unavailable` (the automatic cool-down, or a failed probe) or
    /// `out_of_quota` (the provider says the account is out of quota or
    /// credit: add credit, then close it; otherwise a probe every 5 min).
    pub opened_by: Option<String>,
    /// Why, while open, in words an operator acts on: "the account is out
    /// of quota or credit: …", "the provider did not answer: …", "paused by
    /// an operator".
    pub reason: Option<String>,
    /// RFC 3339, while the provider's own named wait (a 429's) holds every
    /// request back; not an opening.
    pub paused_until: Option<String>,
}

async fn breaker_view(state: &AppState, provider: &str) -> Result<BreakerView, ApiError> {
    let row = state.store.breaker_row(provider).await?;
    let now = state.clock.now_ms();
    Ok(BreakerView {
        provider: provider.to_owned(),
        state: row.breaker.state(now).as_str().to_owned(),
        open_until: row.breaker.open_until_ms.map(rfc3339),
        probe_until: row.breaker.probe_until_ms.map(rfc3339),
        opened_by: row.opener.map(|o| o.as_str().to_owned()),
        reason: row.reason,
        paused_until: row
            .breaker
            .paused_until_ms
            .filter(|until| *until > now)
            .map(rfc3339),
    })
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenBreakerBody {
    /// How long to keep it open, 1 to 86,400 seconds (default: the
    /// automatic cool-down, 30 s). Nothing the provider answers meanwhile
    /// closes it (not a job that was already running); when the time is
    /// over a probe follows, unless it is closed by hand first.
    #[serde(default)]
    for_seconds: Option<i64>,
}

/// Which provider's breaker (`?provider=`; default `default`).
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ProviderQuery {
    /// A provider's name; default `default`.
    provider: Option<String>,
}

/// The provider a breaker request names; 404 when it is not configured.
async fn named_provider(state: &AppState, q: &ProviderQuery) -> Result<String, ApiError> {
    let name = q
        .provider
        .clone()
        .unwrap_or_else(|| DEFAULT_PROVIDER.to_owned());
    let known = state.store.providers().await?;
    if known.iter().any(|p| p.name == name) {
        Ok(name)
    } else {
        Err(ApiError::NotFound("provider"))
    }
}

/// `GET /api/admin/breaker`
#[utoipa::path(
    get,
    path = "/api/admin/breaker",
    tag = "admin",
    summary = "An AI provider's circuit breaker.",
    security(("operator" = [])),
    params(ProviderQuery),
    responses(
        (status = 200, description = "The breaker.", body = BreakerView),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such provider.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: a query parameter other than `provider`.", body = super::schema::ErrorBody),
    )
)]
pub async fn get_breaker(
    state: web::Data<AppState>,
    q: web::Query<ProviderQuery>,
) -> Result<HttpResponse, ApiError> {
    let provider = named_provider(&state, &q).await?;
    Ok(HttpResponse::Ok().json(breaker_view(&state, &provider).await?))
}

/// `POST /api/admin/breaker/open`: no AI work is claimed until it closes
/// (after `for_seconds` and a successful probe, or by hand); a running
/// job's success does not close it.
#[utoipa::path(
    post,
    path = "/api/admin/breaker/open",
    tag = "admin",
    summary = "Open an AI provider's circuit breaker by hand.",
    security(("operator" = [])),
    params(ProviderQuery),
    request_body(content = Option<OpenBreakerBody>, description = "Optional; empty means the default cool-down."),
    responses(
        (status = 200, description = "The breaker after the change.", body = BreakerView),
        (status = 400, description = "`invalid_json`: the body is not the documented JSON.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such provider.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: `for_seconds` out of range, or a query parameter other than `provider`.", body = super::schema::ErrorBody),
    )
)]
pub async fn open_breaker(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<ProviderQuery>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let provider = named_provider(&state, &q).await?;
    let body = read_body(payload).await?;
    let seconds = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        parse_json::<OpenBreakerBody>(&body)?.for_seconds
    };
    let ms = match seconds {
        Some(s) if (1..=86_400).contains(&s) => s * 1_000,
        Some(_) => {
            return Err(ApiError::Validation(
                "for_seconds must be 1 to 86400".into(),
            ))
        }
        None => COOL_DOWN_MS,
    };
    let now = state.clock.now_ms();
    state
        .store
        .open_breaker(
            &provider,
            now + ms,
            Opener::Operator,
            Opener::Operator.headline(),
            Some(
                &AuditEntry::new(
                    &operator,
                    AuditAction::BreakerOpen,
                    format!("provider:{provider}"),
                )
                .detail(format!("for {} s", ms / 1_000)),
            ),
            now,
        )
        .await?;
    tracing::warn!(
        %provider, for_ms = ms,
        "operator opened the AI provider's circuit breaker"
    );
    Ok(HttpResponse::Ok().json(breaker_view(&state, &provider).await?))
}

/// `POST /api/admin/breaker/close`: AI work is claimed again at once.
#[utoipa::path(
    post,
    path = "/api/admin/breaker/close",
    tag = "admin",
    summary = "Close an AI provider's circuit breaker by hand.",
    security(("operator" = [])),
    params(ProviderQuery),
    responses(
        (status = 200, description = "The breaker after the change.", body = BreakerView),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such provider.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: a query parameter other than `provider`.", body = super::schema::ErrorBody),
    )
)]
pub async fn close_breaker(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<ProviderQuery>,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let provider = named_provider(&state, &q).await?;
    let now = state.clock.now_ms();
    let audit = AuditEntry::new(
        &operator,
        AuditAction::BreakerClose,
        format!("provider:{provider}"),
    );
    state
        .store
        .close_breaker(&provider, Some(&audit), now)
        .await?;
    tracing::info!(%provider, "operator closed the AI provider's circuit breaker");
    state.wakeups.saga_work();
    Ok(HttpResponse::Ok().json(breaker_view(&state, &provider).await?))
}

/// One experience's part of a provider.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ProviderExperienceView {
    pub slug: String,
    /// 1 to 100.
    pub weight: i32,
    /// Slots it uses now (running jobs, and jobs that outlived their saga).
    pub in_flight: i64,
    /// Its AI_PENDING sagas waiting for a slot.
    pub queued: i64,
    /// The slots its weight entitles it to now, among the experiences with
    /// work (running or queued), at most its own `max_in_flight`; null
    /// without a shared cap.
    pub share: Option<f64>,
    /// Its own ceiling.
    pub max_in_flight: i32,
}

/// A provider (one AI account) as operators see it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ProviderView {
    pub name: String,
    /// `jobs`, `openai` or `replicate`.
    pub kind: String,
    /// The account's concurrent jobs across every experience and instance;
    /// null: no shared cap.
    pub max_in_flight: Option<i32>,
    /// Slots in use on it now.
    pub in_flight: i64,
    /// AI_PENDING sagas of its experiences waiting for a slot.
    pub queued: i64,
    /// `closed`, `open` or `probing`.
    pub breaker: String,
    /// Why the breaker is open (as in `GET /api/admin/breaker`), null while
    /// closed.
    pub reason: Option<String>,
    /// Its request rate limit (`20/1s`), null when off.
    pub rate_limit: Option<String>,
    /// The models it is configured to use, as the vendor listed them when
    /// this instance started: a `shutdown_date` is a shutdown the vendor
    /// has announced.
    pub models: Vec<crate::ai::ModelNotice>,
    pub experiences: Vec<ProviderExperienceView>,
}

/// `GET /api/admin/providers`
#[utoipa::path(
    get,
    path = "/api/admin/providers",
    tag = "admin",
    summary = "The AI providers: slots in use against the cap, queues, breaker, and each experience's share.",
    security(("operator" = [])),
    responses(
        (status = 200, description = "Every provider, by name.", body = inline(ProvidersBody)),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
    )
)]
pub async fn list_providers(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    signed_in(&req)?;
    let now = state.clock.now_ms();
    let mut providers = Vec::new();
    for p in state.store.providers().await? {
        let shares = state.store.provider_shares(&p.name, now).await?;
        let active_weight: i64 = shares
            .iter()
            .filter(|(_, s)| s.in_flight > 0 || s.queued > 0)
            .map(|(_, s)| i64::from(s.weight))
            .sum();
        let experiences = shares
            .into_iter()
            .map(|(_, s)| {
                let active = s.in_flight > 0 || s.queued > 0;
                let share = p
                    .max_in_flight
                    .filter(|_| active && active_weight > 0)
                    .map(|cap| {
                        let fair = f64::from(cap) * f64::from(s.weight) / active_weight as f64;
                        (fair.min(f64::from(s.max_in_flight)) * 10.0).round() / 10.0
                    });
                ProviderExperienceView {
                    slug: s.slug,
                    weight: s.weight,
                    in_flight: s.in_flight,
                    queued: s.queued,
                    share,
                    max_in_flight: s.max_in_flight,
                }
            })
            .collect::<Vec<_>>();
        let breaker = state.store.breaker_row(&p.name).await?;
        providers.push(ProviderView {
            in_flight: experiences.iter().map(|e| e.in_flight).sum(),
            queued: experiences.iter().map(|e| e.queued).sum(),
            models: state
                .provider_models
                .get(&p.name)
                .cloned()
                .unwrap_or_default(),
            name: p.name,
            kind: p.kind,
            max_in_flight: p.max_in_flight,
            breaker: breaker.breaker.state(now).as_str().to_owned(),
            reason: breaker.reason,
            rate_limit: p.rate_limit,
            experiences,
        });
    }
    Ok(HttpResponse::Ok().json(ProvidersBody { providers }))
}

/// The body of `GET /api/admin/providers`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ProvidersBody {
    pub providers: Vec<ProviderView>,
}
