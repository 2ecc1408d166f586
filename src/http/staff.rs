//! The operators themselves: who is signed in (`GET /api/admin/me`), the
//! operator accounts an admin creates and revokes
//! (`/api/admin/operators`), and the audit trail of what every operator
//! did (`GET /api/admin/audit`).

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::auth::{new_secret, signed_in};
use super::body::parse_json;
use super::error::ApiError;
use super::idempotency::{operator_write, Reply};
use super::AppState;
use crate::clock::rfc3339;
use crate::domain::audit::{AuditAction, AuditEntry};
use crate::domain::roles::{operator_name, Operator, Role, BOOTSTRAP_NAME};
use crate::store::audit::{AuditCursor, AuditFilter, AuditRecord};
use crate::store::staff::OperatorAccount;

/// Records per audit page when `limit` is not given, and at most.
const DEFAULT_AUDIT_PAGE: u64 = 50;
const MAX_AUDIT_PAGE: u64 = 200;

fn operator_json(operator: &Operator) -> serde_json::Value {
    json!({"operator_id": operator.id, "name": operator.name, "role": operator.role.as_str()})
}

fn account_json(account: &OperatorAccount) -> serde_json::Value {
    json!({
        "operator_id": account.id,
        "name": account.name,
        "role": account.role.as_str(),
        "created_at": rfc3339(account.created_at_ms),
        "created_by": account.created_by,
        "revoked_at": account.revoked_at_ms.map(rfc3339),
    })
}

/// `GET /api/admin/me`
#[utoipa::path(
    get,
    path = "/api/admin/me",
    tag = "admin",
    summary = "Who the token belongs to: name and role (any operator).",
    security(("operator" = [])),
    responses(
        (status = 200, description = "The signed-in operator (`operator_id` null for the bootstrap token).", body = super::schema::OperatorMe),
        (status = 401, description = "`unauthorized`: the operator token is missing, wrong or revoked.", body = super::schema::ErrorBody),
    )
)]
pub async fn me(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(operator_json(&signed_in(&req)?)))
}

/// `GET /api/admin/operators`
#[utoipa::path(
    get,
    path = "/api/admin/operators",
    tag = "admin",
    summary = "The operator accounts, oldest first, without their tokens (admin).",
    security(("operator" = [])),
    responses(
        (status = 200, description = "The operators.", body = super::schema::OperatorList),
        (status = 401, description = "`unauthorized`: the operator token is missing, wrong or revoked.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin manages operators.", body = super::schema::ErrorBody),
    )
)]
pub async fn list_operators(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    signed_in(&req)?;
    let accounts = state.store.operator_accounts().await?;
    let operators: Vec<_> = accounts.iter().map(account_json).collect();
    Ok(HttpResponse::Ok().json(json!({ "operators": operators })))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorBody {
    /// 1 to 80 characters (after trimming), the name the audit trail
    /// shows.
    #[schema(min_length = 1, max_length = 80, example = "Mina (review desk)")]
    name: String,
    #[schema(value_type = crate::http::schema::RoleName)]
    role: String,
}

/// `POST /api/admin/operators`
#[utoipa::path(
    post,
    path = "/api/admin/operators",
    tag = "admin",
    summary = "Create an operator with a role; its token is shown once (admin).",
    description = "The token is in this answer only (and in a replay of it to the same caller with the same Idempotency-Key); the server keeps its SHA-256 digest. Roles: `admin` does everything; `moderator` reads the dashboards and the review queue, approves, rejects and hides; `viewer` only reads.",
    security(("operator" = [])),
    params(super::schema::OperatorKey),
    request_body = OperatorBody,
    responses(
        (status = 201, description = "Created.", body = super::schema::OperatorCreated, headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with the same Idempotency-Key."))),
        (status = 400, description = "`invalid_json`: the body is not JSON for this request; `idempotency_key_required`: the Idempotency-Key is malformed.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the operator token is missing, wrong or revoked.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin manages operators.", body = super::schema::ErrorBody),
        (status = 409, description = "`request_in_progress`: the same Idempotency-Key is still running.", body = super::schema::ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: a bad name or role; `idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
    )
)]
pub async fn create_operator(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let (state, operator) = (&state, &operator);
    operator_write(state, &req, payload, |body| async move {
        let b: OperatorBody = parse_json(&body)?;
        let name = operator_name(&b.name).map_err(ApiError::Validation)?;
        if name == BOOTSTRAP_NAME {
            return Err(ApiError::Validation(format!(
                "{BOOTSTRAP_NAME:?} names the bootstrap token; pick another name"
            )));
        }
        let role: Role = b.role.parse().map_err(ApiError::Validation)?;
        let token = new_secret();
        let audit = AuditEntry::new(operator, AuditAction::OperatorCreate, "operator")
            .detail(format!("{name} ({role})"));
        let created = state
            .store
            .create_operator(&name, role, &token, audit, state.clock.now_ms())
            .await?;
        tracing::info!(operator = %created.name, %role, by = %operator.name, "operator created");
        let mut answer = account_json(&created);
        answer["token"] = json!(token);
        Ok(Reply {
            status: StatusCode::CREATED,
            body: answer,
        })
    })
    .await
}

/// `DELETE /api/admin/operators/{id}`
#[utoipa::path(
    delete,
    path = "/api/admin/operators/{id}",
    tag = "admin",
    summary = "Revoke an operator: its token is refused at once on every instance, and its dashboards close (admin).",
    description = "Revoking again answers 200 with the same account. The operator's open `/ws/operators` sockets close with code 4401.",
    security(("operator" = [])),
    params(("id" = String, Path, description = "The operator's id.")),
    responses(
        (status = 200, description = "The operator, revoked.", body = super::schema::OperatorAccount),
        (status = 401, description = "`unauthorized`: the operator token is missing, wrong or revoked.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin manages operators.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such operator.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the path could not be read.", body = super::schema::ErrorBody),
    )
)]
pub async fn revoke_operator(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let audit = AuditEntry::new(
        &operator,
        AuditAction::OperatorRevoke,
        format!("operator:{id}"),
    );
    let account = state
        .store
        .revoke_operator(&id, &audit, state.clock.now_ms())
        .await?
        .ok_or(ApiError::NotFound("operator"))?;
    // Its dashboards close, here and on the other instances.
    state.wakeups.operators_changed();
    tracing::info!(operator = %account.name, by = %operator.name, "operator revoked");
    Ok(HttpResponse::Ok().json(account_json(&account)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    after: Option<String>,
    limit: Option<u64>,
    operator: Option<String>,
    action: Option<String>,
}

fn record_json(r: &AuditRecord) -> serde_json::Value {
    json!({
        "id": r.id,
        "at": rfc3339(r.at_ms),
        "operator": r.operator_name,
        "operator_id": r.operator_id,
        "action": r.action,
        "target": r.target,
        "detail": r.detail,
    })
}

/// `GET /api/admin/audit?after=&limit=&operator=&action=`
#[utoipa::path(
    get,
    path = "/api/admin/audit",
    tag = "admin",
    summary = "The audit trail: every operator action, newest first (admin).",
    description = "Each record says when, who (`operator`: a name, `bootstrap` for the bootstrap token; `operator_id`), the action, its target and a short detail. It never holds a token, a photo or a guest's prompt. Pages with `next` as `after`.",
    security(("operator" = [])),
    params(
        ("after" = Option<String>, Query, description = "The `next` of the page before."),
        ("limit" = Option<u64>, Query, minimum = 1, maximum = 200, description = "Records, 1 to 200; default 50."),
        ("operator" = Option<String>, Query, description = "Only this operator's (a name or an id)."),
        ("action" = Option<String>, Query, description = "Only this action (e.g. `experience.update`)."),
    ),
    responses(
        (status = 200, description = "One page of the trail.", body = super::schema::AuditPage),
        (status = 401, description = "`unauthorized`: the operator token is missing, wrong or revoked.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin reads the trail.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: an unknown action, a bad cursor or limit, or an unknown query parameter.", body = super::schema::ErrorBody),
    )
)]
pub async fn audit(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<AuditQuery>,
) -> Result<HttpResponse, ApiError> {
    signed_in(&req)?;
    let limit = query.limit.unwrap_or(DEFAULT_AUDIT_PAGE);
    if !(1..=MAX_AUDIT_PAGE).contains(&limit) {
        return Err(ApiError::Validation(format!(
            "limit must be 1 to {MAX_AUDIT_PAGE}"
        )));
    }
    let after = match query.after.as_deref().filter(|a| !a.is_empty()) {
        Some(text) => Some(
            AuditCursor::decode(text)
                .ok_or_else(|| ApiError::Validation("after is not a cursor of this list".into()))?,
        ),
        None => None,
    };
    let action = match query.action.as_deref().filter(|a| !a.is_empty()) {
        Some(text) => Some(
            text.parse::<AuditAction>()
                .map_err(ApiError::Validation)?
                .as_str()
                .to_owned(),
        ),
        None => None,
    };
    let filter = AuditFilter {
        operator: query
            .operator
            .as_deref()
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .map(|o| o.chars().take(80).collect()),
        action,
        experience_id: None,
    };
    let (records, next) = state
        .store
        .audit_page(&filter, after.as_ref(), limit)
        .await?;
    Ok(HttpResponse::Ok().json(json!({
        "items": records.iter().map(record_json).collect::<Vec<_>>(),
        "next": next.map(|c| c.encode()),
    })))
}
