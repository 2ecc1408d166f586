//! The operators' review and bulk actions (bearer operator token):
//! - `GET /api/admin/review`: the results waiting for a decision, oldest
//!   first;
//! - `POST /api/admin/sagas/{id}/approve` and `.../reject`: one decision,
//!   fenced and idempotent (the same decision again is 200, the other one
//!   after it 409);
//! - `POST /api/admin/sagas/bulk`: retry, cancel, approve or reject every
//!   saga a filter matches, a page at a time, each under the same fence as
//!   the single action (a page of aborts or approvals in one short
//!   transaction); `dry_run` only counts.
//!
//! Every decision goes through [`crate::actors::review::decide`], and every
//! retry and cancel through the single actions' functions in
//! [`super::admin`], so a bulk action is exactly many single ones.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;

use super::admin::{cancel_one, reason_named, retry_one, saga_action, search_text, step_named};
use super::auth::{caller_token, require_role, signed_in};
use super::body::{parse_json, read_body, rfc3339_ms};
use super::error::ApiError;
use super::idempotency::{key_of, operator_scope, respond, run_idempotent, Reply};
use super::AppState;
use crate::actors::persistence::WritePageAlone;
use crate::actors::review::decide;
use crate::domain::audit::{AuditAction, AuditEntry};
use crate::domain::review::Decision;
use crate::domain::roles::Role;
use crate::store::operators::SagaFilter;
use crate::store::transitions::SagaWrite;
use crate::store::StoreError;

/// Items per review page when `limit` is not given, and at most.
const DEFAULT_REVIEW_PAGE: u64 = 50;
const MAX_REVIEW_PAGE: u64 = 500;
/// Sagas a bulk action reads per page (each page is one short read; each
/// saga is then acted on in its own short transaction).
pub const BULK_PAGE: u64 = 200;
/// Sagas of a page acted on at once.
const BULK_CONCURRENCY: usize = 8;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReviewQuery {
    experience: Option<String>,
    limit: Option<u64>,
}

/// `GET /api/admin/review?experience=&limit=` -> `{"items": [...]}`.
#[utoipa::path(
    get,
    path = "/api/admin/review",
    tag = "admin",
    summary = "The AI results waiting for an operator's decision, oldest first.",
    security(("operator" = [])),
    params(
        ("experience" = Option<String>, Query, description = "Only this experience's items (slug)."),
        ("limit" = Option<u64>, Query, minimum = 1, maximum = 500, description = "Items, 1 to 500; default 50."),
    ),
    responses(
        (status = 200, description = "The waiting items.", body = super::schema::ReviewList),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: a limit out of range or an unknown query parameter.", body = super::schema::ErrorBody),
    )
)]
pub async fn list_review(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<ReviewQuery>,
) -> Result<HttpResponse, ApiError> {
    signed_in(&req)?;
    let limit = query.limit.unwrap_or(DEFAULT_REVIEW_PAGE);
    if !(1..=MAX_REVIEW_PAGE).contains(&limit) {
        return Err(ApiError::Validation(format!(
            "limit must be 1 to {MAX_REVIEW_PAGE}"
        )));
    }
    let experience = query.experience.as_deref().filter(|s| !s.is_empty());
    let items = state.store.review_items(experience, limit).await?;
    Ok(HttpResponse::Ok().json(json!({ "items": items })))
}

/// The `abort_detail` of an operator's rejection.
const REJECTED_BY_OPERATOR: &str = "rejected by an operator";

async fn decide_one(
    state: &AppState,
    id: &str,
    decision: Decision,
    audit: AuditEntry,
) -> Result<(), ApiError> {
    decide(
        &state.store,
        &state.persistence,
        &state.wakeups,
        id,
        decision,
        state.clock.now_ms(),
        REJECTED_BY_OPERATOR,
        Some(audit),
    )
    .await?;
    tracing::info!(saga_id = %id, %decision, "operator review decision");
    Ok(())
}

/// `POST /api/admin/sagas/{id}/approve`
#[utoipa::path(
    post,
    path = "/api/admin/sagas/{id}/approve",
    tag = "admin",
    summary = "Approve a result in review: the saga goes on to ranking and completion.",
    description = "The display then gets `session.completed` as usual. Approving again answers 200; after a rejection it is 409. Any request body is ignored (it only takes part in the Idempotency-Key comparison).",
    security(("operator" = [])),
    params(
        ("id" = String, Path, description = "The saga's id."),
        super::schema::OperatorKey,
    ),
    responses(
        (status = 200, description = "The saga after the decision (or the replay of an earlier answer).", body = super::schema::SagaOne, headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with the same Idempotency-Key."))),
        (status = 400, description = "`idempotency_key_required`: the Idempotency-Key is malformed.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such saga.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: the result was rejected, or the saga is not in review; `request_in_progress`: the same Idempotency-Key is still running.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the path could not be read; `idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
    )
)]
pub async fn approve_saga(
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
        AuditAction::SagaApprove,
        |audit| decide_one(&state, &id, Decision::Approve, audit),
    )
    .await
}

/// `POST /api/admin/sagas/{id}/reject`
#[utoipa::path(
    post,
    path = "/api/admin/sagas/{id}/reject",
    tag = "admin",
    summary = "Reject a result in review: the saga ends ABORTED REVIEW_REJECTED.",
    description = "Its credits are given back; the display gets `session.aborted` with a neutral message and none of the content. Rejecting again answers 200; after an approval it is 409. Any request body is ignored (it only takes part in the Idempotency-Key comparison).",
    security(("operator" = [])),
    params(
        ("id" = String, Path, description = "The saga's id."),
        super::schema::OperatorKey,
    ),
    responses(
        (status = 200, description = "The saga after the decision (or the replay of an earlier answer).", body = super::schema::SagaOne, headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with the same Idempotency-Key."))),
        (status = 400, description = "`idempotency_key_required`: the Idempotency-Key is malformed.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such saga.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: the result was approved, or the saga is not in review; `request_in_progress`: the same Idempotency-Key is still running.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the path could not be read; `idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
    )
)]
pub async fn reject_saga(
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
        AuditAction::SagaReject,
        |audit| decide_one(&state, &id, Decision::Reject, audit),
    )
    .await
}

/// What a bulk action does to each saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BulkAction {
    Retry,
    Cancel,
    Approve,
    Reject,
}

/// Which sagas a bulk action touches: every term given must hold.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkFilter {
    /// An experience's slug.
    #[serde(default)]
    experience: Option<String>,
    /// A saga step (e.g. `ABORTED`, `IN_REVIEW`).
    #[serde(default)]
    #[schema(value_type = Option<crate::domain::saga::Step>)]
    step: Option<String>,
    /// An abort reason (e.g. `AI_FAILED`).
    #[serde(default)]
    #[schema(value_type = Option<crate::domain::saga::AbortReason>)]
    reason: Option<String>,
    /// RFC 3339: last changed at or after this time.
    #[serde(default)]
    #[schema(format = DateTime)]
    updated_after: Option<String>,
    /// RFC 3339: last changed before this time.
    #[serde(default)]
    #[schema(format = DateTime)]
    updated_before: Option<String>,
    /// Part of the nickname (any case), or the start of the session id.
    #[serde(default)]
    #[schema(max_length = 100)]
    q: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkBody {
    action: BulkAction,
    #[serde(default)]
    filter: BulkFilter,
    /// Only count the sagas the action would touch; change nothing.
    /// Default false.
    #[serde(default)]
    dry_run: bool,
}

/// A filter's time (empty: none).
fn time_named(field: &str, text: Option<&str>) -> Result<Option<i64>, ApiError> {
    text.filter(|s| !s.is_empty())
        .map(|text| rfc3339_ms(field, text))
        .transpose()
}

impl BulkFilter {
    fn to_filter(&self) -> Result<SagaFilter, ApiError> {
        Ok(SagaFilter {
            step: step_named(self.step.as_deref())?,
            reason: reason_named(self.reason.as_deref())?,
            experience: self.experience.clone().filter(|s| !s.is_empty()),
            updated_after: time_named("updated_after", self.updated_after.as_deref())?,
            updated_before: time_named("updated_before", self.updated_before.as_deref())?,
            q: search_text(self.q.as_deref())?,
            after: None,
        })
    }

    /// The filter as an audit record says it (`experience=x
    /// step=ABORTED`); a search text is said to be there, not what it is
    /// (it may be part of a guest's nickname).
    fn describe(&self) -> String {
        let terms: Vec<String> = [
            ("experience", &self.experience),
            ("step", &self.step),
            ("reason", &self.reason),
            ("updated_after", &self.updated_after),
            ("updated_before", &self.updated_before),
        ]
        .into_iter()
        .filter_map(|(name, value)| {
            let value = value.as_deref().filter(|v| !v.is_empty())?;
            Some(format!(
                "{name}={}",
                value.chars().take(80).collect::<String>()
            ))
        })
        .chain(
            self.q
                .as_deref()
                .filter(|q| !q.is_empty())
                .map(|_| "q=(a search text)".to_owned()),
        )
        .collect();
        if terms.is_empty() {
            "(every saga)".to_owned()
        } else {
            terms.join(" ")
        }
    }
}

/// Acts on one saga; whether the action applied (a saga the action's
/// fence refuses, such as a retry of a saga that is not ABORTED, is
/// counted as matched but not done).
async fn act_on(state: &AppState, bulk: &Bulk, id: &str) -> Result<bool, ApiError> {
    let audit = bulk.item(id);
    let done = match bulk.action {
        BulkAction::Retry => retry_one(state, id, &audit).await,
        BulkAction::Cancel => cancel_one(state, id, Some(audit)).await,
        BulkAction::Approve => decide_one(state, id, Decision::Approve, audit).await,
        BulkAction::Reject => decide_one(state, id, Decision::Reject, audit).await,
    };
    counted(done)
}

/// A bulk action under way: what it does, and who asked (each saga it
/// acts on is recorded like the single action, with `bulk` as detail).
struct Bulk {
    action: BulkAction,
    operator: crate::domain::roles::Operator,
}

impl Bulk {
    /// The audit record of the single action on saga `id`.
    fn item(&self, id: &str) -> AuditEntry {
        let kind = match self.action {
            BulkAction::Retry => AuditAction::SagaRetry,
            BulkAction::Cancel => AuditAction::SagaCancel,
            BulkAction::Approve => AuditAction::SagaApprove,
            BulkAction::Reject => AuditAction::SagaReject,
        };
        AuditEntry::new(&self.operator, kind, format!("saga:{id}")).detail("bulk")
    }
}

impl BulkAction {
    fn as_str(self) -> &'static str {
        match self {
            BulkAction::Retry => "retry",
            BulkAction::Cancel => "cancel",
            BulkAction::Approve => "approve",
            BulkAction::Reject => "reject",
        }
    }

    /// The role it needs: a moderator decides what the public sees
    /// (approve, reject); retry and cancel are an admin's.
    fn needs(self) -> Role {
        match self {
            BulkAction::Approve | BulkAction::Reject => Role::Moderator,
            BulkAction::Retry | BulkAction::Cancel => Role::Admin,
        }
    }
}

/// `POST /api/admin/sagas/bulk` -> `{"matched", "done"}`.
#[utoipa::path(
    post,
    path = "/api/admin/sagas/bulk",
    tag = "admin",
    summary = "Retry, cancel, approve or reject every saga a filter matches.",
    description = "The sagas are read a page at a time (200) in id order. A page of cancels, rejects or approvals is one short transaction in which each saga is acted on under the same fence as the single action; a retry is one transaction per saga. No transaction is held across the run, and a saga whose state refuses the action (a retry of one that is not ABORTED) is counted in `matched` but not in `done`. With `dry_run` it only counts and changes nothing. An Idempotency-Key makes a retried bulk request act once (the first answer is replayed).",
    security(("operator" = [])),
    params(super::schema::OperatorKey),
    request_body = BulkBody,
    responses(
        (status = 200, description = "How many sagas matched, and on how many the action applied (or the replay of an earlier answer).", body = super::schema::BulkResult, headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with the same Idempotency-Key."))),
        (status = 400, description = "`invalid_json`: the body is not JSON for this request; `idempotency_key_required`: the Idempotency-Key is malformed.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 409, description = "`request_in_progress`: the same Idempotency-Key is still running.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: an unknown action, step, reason or field, or a time that is not RFC 3339; `idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
    )
)]
pub async fn bulk_sagas(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let key = key_of(&req)?;
    let body = read_body(payload).await?;
    let bulk: BulkBody = parse_json(&body)?;
    require_role(&operator, bulk.action.needs())?;
    let filter = bulk.filter.to_filter()?;
    let scope = operator_scope(&req);
    let run = Bulk {
        action: bulk.action,
        operator: operator.clone(),
    };
    let (reply, replayed) =
        run_idempotent(&state, &scope, caller_token(&req), key, &body, || async {
            let (matched, done) = if bulk.dry_run {
                (state.store.count_sagas(&filter).await?, 0)
            } else {
                let (matched, done) = run_bulk(&state, &run, &filter).await?;
                // Exported with its experience when the filter names one.
                let experience = match filter.experience.as_deref() {
                    Some(slug) => state.store.experience_by_slug(slug).await?,
                    None => None,
                };
                let summary = AuditEntry::new(&operator, AuditAction::SagasBulk, "sagas")
                    .of_experience(experience.map(|e| e.id))
                    .detail(format!(
                        "{} {}: matched {matched}, done {done}",
                        bulk.action.as_str(),
                        bulk.filter.describe()
                    ));
                state
                    .store
                    .record_audit(&summary, state.clock.now_ms())
                    .await?;
                (matched, done)
            };
            Ok(Reply {
                status: StatusCode::OK,
                body: json!({"matched": matched, "done": done, "dry_run": bulk.dry_run}),
            })
        })
        .await?;
    Ok(respond(reply, replayed, None))
}

/// The bulk action itself: page after page of matching ids. A page of
/// cancels or rejects is one short transaction of aborts, each under its
/// own fence in a savepoint ([`WritePageAlone`]); a page of approvals is
/// one fenced UPDATE ([`crate::store::Store::approve_page`]); retries go
/// one saga at a time (each is its own fenced transaction). Returns
/// (matched, done).
async fn run_bulk(
    state: &AppState,
    bulk: &Bulk,
    filter: &SagaFilter,
) -> Result<(i64, i64), ApiError> {
    let action = bulk.action;
    let (mut matched, mut done) = (0i64, 0i64);
    let mut after: Option<String> = None;
    loop {
        let ids = state
            .store
            .saga_ids_matching(filter, after.as_deref(), BULK_PAGE)
            .await?;
        let Some(last) = ids.last().cloned() else {
            break;
        };
        matched += ids.len() as i64;
        done += act_on_page(state, bulk, &ids).await?;
        tracing::info!(?action, matched, done, "bulk action: a page done");
        if (ids.len() as u64) < BULK_PAGE {
            break;
        }
        after = Some(last);
    }
    tracing::info!(?action, matched, done, "bulk action finished");
    Ok((matched, done))
}

/// Whether one saga's outcome counts as done; a refusal by the saga's own
/// state (a conflict, a saga gone, no credits to retry it) is matched but
/// not done, any other error ends the bulk request.
fn counted(outcome: Result<(), ApiError>) -> Result<bool, ApiError> {
    match outcome {
        Ok(()) => Ok(true),
        Err(ApiError::Conflict(_) | ApiError::NotFound(_) | ApiError::BudgetExhausted) => Ok(false),
        Err(e) => Err(e),
    }
}

/// One page of a bulk action; how many it was done on.
async fn act_on_page(state: &AppState, bulk: &Bulk, ids: &[String]) -> Result<i64, ApiError> {
    let action = bulk.action;
    // The single actions' own writes, a page at a time.
    let page = match action {
        BulkAction::Retry => None,
        BulkAction::Cancel => Some(
            ids.iter()
                .map(|id| SagaWrite::operator_cancel(id, Some(bulk.item(id))))
                .collect(),
        ),
        BulkAction::Reject => Some(
            ids.iter()
                .map(|id| SagaWrite::review_reject(id, REJECTED_BY_OPERATOR, Some(bulk.item(id))))
                .collect(),
        ),
        BulkAction::Approve => {
            // approve_page sets each record's target to its saga.
            let audit = bulk.item("");
            let outcomes = state
                .store
                .approve_page(ids, Some(&audit), state.clock.now_ms())
                .await?;
            let mut done = 0;
            for outcome in outcomes {
                done += counted(outcome.map_err(ApiError::from))? as i64;
            }
            if done > 0 {
                state.wakeups.review_changed();
            }
            return Ok(done);
        }
    };
    if let Some(writes) = page {
        let outcomes = state
            .persistence
            .send(WritePageAlone(writes))
            .await
            .map_err(|e| ApiError::Internal(format!("the persistence actor is gone: {e}")))?;
        let failed = outcomes
            .iter()
            .all(|o| matches!(o, Err(StoreError::BatchFailed { .. })));
        if !failed {
            if action == BulkAction::Reject {
                state.wakeups.review_changed();
            }
            let mut done = 0;
            for outcome in outcomes {
                done += counted(outcome.map(drop).map_err(ApiError::from))? as i64;
            }
            return Ok(done);
        }
        // The page's transaction failed (on PostgreSQL it may lose a
        // deadlock to a saga batch): each saga alone, as the single action.
        tracing::warn!(
            ?action,
            sagas = ids.len(),
            "a bulk page failed as one transaction; acting on its sagas one by one"
        );
    }
    let outcomes: Vec<Result<bool, ApiError>> = futures_util::stream::iter(ids.iter())
        .map(|id| act_on(state, bulk, id))
        .buffer_unordered(BULK_CONCURRENCY)
        .collect()
        .await;
    let mut done = 0;
    for outcome in outcomes {
        done += outcome? as i64;
    }
    Ok(done)
}
