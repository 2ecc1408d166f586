//! The submission desk: `POST /api/sessions/{id}/submission`, group-committed.
//! Requests that arrive together are checked and written as one batch:
//! their sessions and what admission needs are read side by side
//! ([`Store::read_submissions`]), then [`Store::submit_batch`] starts their
//! sagas (taking the experience's credits) and stores each answer with its
//! Idempotency-Key, all at once. Each request
//! still gets the answer the contract gives it alone, with checks in the
//! contract's order: authentication, the submission rate limit (per
//! session and token, so only a request whose token opened its session
//! takes a bucket), the Idempotency-Key rules, the body,
//! the session's state, then the experience's closing time (409 `closing`)
//! and credits (402 `budget_exhausted`). The 202 tells where the saga
//! stands: `queue_position` (1 = next to start) and `eta_seconds`.
//!
//! The queue is bounded ([`BatchQueue`]): when it is full, requests wait
//! for room. One batch is written at a time, so two batches never wait on
//! each other's rows.

use std::collections::HashMap;
use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::auth::{bearer, same_secret};
use super::body::{parse_json, read_body};
use super::error::ApiError;
use super::idempotency::{answer_taken, key_of, key_request, respond, Reply, KEY_TTL_MS};
use super::participants::{check_input, validate_submission};
use super::rate_limit::RateLimits;
use super::AppState;
use crate::actors::batching::{BatchLimits, BatchQueue};
use crate::clock::SharedClock;
use crate::domain::keys::token_hash;
use crate::domain::media::InputKind;
use crate::domain::saga::Step;
use crate::domain::session::SessionStatus;
use crate::store::idempotency::StoredAnswer;
use crate::store::submissions::{SubmissionAction, SubmissionOrder, SubmissionOutcome};
use crate::store::{new_id, DbFailure, Store};

/// One submission request as it came in.
pub struct SubmitRequest {
    session_id: String,
    token: String,
    /// None: missing or malformed (both answered 400 after authentication).
    key: Option<String>,
    /// The body, or why it could not be read (413, answered after the key).
    body: Result<web::Bytes, ApiError>,
    /// The request's `traceparent`, stored with its saga (traces on).
    trace_context: Option<String>,
}

/// What a request is answered: the reply and whether it is a replay, or
/// an error.
pub type SubmitAnswer = Result<(Reply, bool), ApiError>;

pub type SubmissionQueue = BatchQueue<SubmitRequest, SubmitAnswer>;

/// Starts the desk's queue on the requests' pool.
pub fn submission_queue(
    store: Store,
    clock: SharedClock,
    deadline_ms: i64,
    limits: Arc<RateLimits>,
    instance: Option<String>,
) -> SubmissionQueue {
    const LIMITS: BatchLimits = BatchLimits {
        capacity: 4_096,
        max_batch: 256,
        concurrent: 1,
        linger: std::time::Duration::ZERO,
    };
    BatchQueue::start(
        "submissions",
        LIMITS,
        move |requests: Vec<SubmitRequest>| {
            let (store, now, limits) = (store.clone(), clock.now_ms(), limits.clone());
            let instance = instance.clone();
            async move {
                answer_batch(
                    &store,
                    &limits,
                    instance.as_deref(),
                    requests,
                    now,
                    deadline_ms,
                )
                .await
            }
        },
    )
}

/// Checks and writes one batch; one answer per request, in order.
async fn answer_batch(
    store: &Store,
    limits: &RateLimits,
    instance: Option<&str>,
    requests: Vec<SubmitRequest>,
    now: i64,
    deadline_ms: i64,
) -> Vec<SubmitAnswer> {
    let ids: Vec<String> = requests.iter().map(|r| r.session_id.clone()).collect();
    // The sessions, and what admission reads for them, in one wait.
    let (sessions, reads) = match store.read_submissions(&ids, now).await {
        Ok((found, reads)) => (
            found
                .into_iter()
                .map(|s| (s.id.clone(), s))
                .collect::<HashMap<String, _>>(),
            reads,
        ),
        Err(e) => {
            return requests.iter().map(|_| Err(store_error(&e))).collect();
        }
    };
    let mut answers: Vec<Option<SubmitAnswer>> = Vec::with_capacity(requests.len());
    let mut orders = Vec::new();
    // For each order: its request's index and the body's validation error
    // (answered when the order is refused).
    let mut pending: Vec<(usize, Option<ApiError>)> = Vec::new();
    for (i, mut request) in requests.into_iter().enumerate() {
        let trace_context = request.trace_context.take();
        let checked = (|| {
            let session = sessions
                .get(&request.session_id)
                .ok_or(ApiError::NotFound("session"))?;
            if !same_secret(&token_hash(&request.token), &session.participant_token_hash) {
                return Err(ApiError::Unauthorized(
                    "this token does not open that session",
                ));
            }
            // Only now, authenticated, does the request take a bucket.
            limits
                .check_submission(&session.id, &request.token)
                .map_err(|retry_after| ApiError::RateLimited { retry_after })?;
            let key = request.key.ok_or(ApiError::IdempotencyKeyRequired)?;
            let body = request.body?;
            Ok((session.clone(), key, body, request.token))
        })();
        let (session, key, body, request_token) = match checked {
            Ok(checked) => checked,
            Err(e) => {
                answers.push(Some(Err(e)));
                continue;
            }
        };
        answers.push(None);
        let key = key_request(
            &format!("session:{}", session.id),
            &key,
            &request_token,
            &body,
        )
        .on_instance(instance);
        let (action, invalid) = match parse_json(&body).and_then(validate_submission) {
            Ok(submission) => (
                SubmissionAction::Submit {
                    submission,
                    saga_id: new_id(),
                    deadline_ms,
                    trace_context,
                },
                None,
            ),
            Err(e) => (SubmissionAction::Refuse(e.stored()), Some(e)),
        };
        orders.push(SubmissionOrder {
            session,
            key: Some(key),
            action,
        });
        pending.push((i, invalid));
    }
    if let Err(e) = refuse_unfit_inputs(store, &reads, &mut orders, &mut pending).await {
        return answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(store_error(&e))))
            .collect();
    }
    if !orders.is_empty() {
        match store
            .submit_batch(&orders, &reads, now, KEY_TTL_MS, &stored_answer)
            .await
        {
            Ok(outcomes) => {
                for (((i, invalid), order), outcome) in
                    pending.into_iter().zip(&orders).zip(outcomes)
                {
                    answers[i] = Some(match outcome {
                        SubmissionOutcome::Refused => Err(invalid.unwrap_or(ApiError::Internal(
                            "a valid submission was refused".into(),
                        ))),
                        SubmissionOutcome::Key(claim) => answer_taken(claim).unwrap_or(Err(
                            ApiError::Internal("a fresh key was not written".into()),
                        )),
                        decided => decided_reply(order, &decided).map(|reply| (reply, false)),
                    });
                }
            }
            Err(e) => {
                tracing::error!(error = %e, requests = pending.len(), "a batch of submissions failed; their keys were released");
                for (i, _) in pending {
                    answers[i] = Some(Err(store_error(&e)));
                }
            }
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or(Err(ApiError::Internal("a request got no answer".into()))))
        .collect()
}

/// Turns each submission that does not fit its experience's `input` (a
/// photo missing, refused, or not its session's; a prompt missing) or
/// lacks the consent it asks for into a
/// refusal stored with its key, like any invalid body. The photos named
/// in the batch are read in one query, and only when some are named.
async fn refuse_unfit_inputs(
    store: &Store,
    reads: &crate::store::submissions::AdmissionReads,
    orders: &mut [SubmissionOrder],
    pending: &mut [(usize, Option<ApiError>)],
) -> Result<(), crate::store::StoreError> {
    let named: Vec<String> = orders
        .iter()
        .filter_map(|o| match &o.action {
            SubmissionAction::Submit { submission, .. } => submission.photo_id.clone(),
            SubmissionAction::Refuse(_) => None,
        })
        .collect();
    let photo_sessions = store.photo_sessions(&named).await?;
    for (order, (_, invalid)) in orders.iter_mut().zip(pending.iter_mut()) {
        let SubmissionAction::Submit { submission, .. } = &order.action else {
            continue;
        };
        let experience = reads.experience(&order.session.experience_id);
        let input = experience
            .map(|e| InputKind::of(&e.input))
            .unwrap_or_default();
        let consent_required = experience.is_some_and(|e| e.consent_required);
        let photo_session = submission
            .photo_id
            .as_ref()
            .and_then(|id| photo_sessions.get(id))
            .map(String::as_str);
        if let Err(e) = check_input(
            submission,
            input,
            consent_required,
            &order.session.id,
            photo_session,
        ) {
            order.action = SubmissionAction::Refuse(e.stored());
            *invalid = Some(e);
        }
    }
    Ok(())
}

/// The answer to a submission the store decided: 202 with where the saga
/// stands in the queue (`queue_position`, 1 = next to start, and
/// `eta_seconds`, null while no estimate is known), or why it was refused.
fn decided_reply(order: &SubmissionOrder, outcome: &SubmissionOutcome) -> Result<Reply, ApiError> {
    match (outcome, &order.action) {
        (SubmissionOutcome::Accepted(admission), SubmissionAction::Submit { saga_id, .. }) => {
            Ok(Reply {
                status: StatusCode::ACCEPTED,
                body: json!({
                    "session_id": order.session.id,
                    "saga_id": saga_id,
                    "status": SessionStatus::Submitting.as_str(),
                    "step": Step::AiPending.as_str(),
                    "queue_position": admission.queue_position,
                    "eta_seconds": admission.eta_seconds(),
                }),
            })
        }
        (SubmissionOutcome::AlreadySubmitted, _) => Err(ApiError::AlreadySubmitted),
        (SubmissionOutcome::BudgetExhausted, _) => Err(ApiError::BudgetExhausted),
        (SubmissionOutcome::Closing, _) => Err(ApiError::Closing),
        _ => Err(ApiError::Internal(format!(
            "no reply for the submission outcome {outcome:?}"
        ))),
    }
}

/// What is stored with the key of a decided submission: the 202 and the
/// answers about the request itself; None for an answer about the moment
/// (402 `budget_exhausted`, 409 `closing`), whose key is released so a
/// retry is decided again (see [`ApiError::is_final_for_request`]).
fn stored_answer(order: &SubmissionOrder, outcome: &SubmissionOutcome) -> Option<StoredAnswer> {
    match decided_reply(order, outcome) {
        Ok(reply) => Some(reply.stored()),
        Err(e) if e.is_final_for_request() => Some(e.stored()),
        Err(_) => None,
    }
}

/// The answer to each request of a batch that failed as a whole: 503
/// (with `Retry-After`) when the database was busy or unreachable, so the
/// phones retry; 500 otherwise.
fn store_error(e: &crate::store::StoreError) -> ApiError {
    match e.failure() {
        DbFailure::Transient => ApiError::Busy,
        DbFailure::Unavailable => ApiError::Unavailable,
        DbFailure::Duplicate | DbFailure::Other => ApiError::Internal(e.to_string()),
    }
}

/// `POST /api/sessions/{id}/submission`: 202 at once; the saga does the
/// rest.
#[utoipa::path(
    post,
    path = "/api/sessions/{id}/submission",
    tag = "participants",
    summary = "Submit the session's prompt (and score): 202 at once, the saga runs in the background.",
    description = "Checks, in this order: authentication, the Idempotency-Key rules, the body, the session's state. A session accepts a submission when OPEN or ABORTED (a new try). The experience's credits are deducted before the answer. Follow the progress with `GET /api/sessions/{id}`, or on the booth's terminal socket.",
    security(("participant" = [])),
    params(
        ("id" = String, Path, description = "The session's id."),
        super::schema::SubmissionKey,
    ),
    request_body = super::participants::SubmissionBody,
    responses(
        (status = 202, description = "Accepted (or the replay of an earlier acceptance with the same key and body).", body = super::schema::SubmissionAccepted, headers(("Location" = String, description = "`/api/sessions/{session_id}`."), ("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with the same Idempotency-Key."))),
        (status = 400, description = "`idempotency_key_required`: the Idempotency-Key is missing or malformed; `invalid_json`: the body is not JSON for this request.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: no bearer token, or one that does not open this session.", body = super::schema::ErrorBody),
        (status = 402, description = "`budget_exhausted`: the experience has not enough credits left.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such session.", body = super::schema::ErrorBody),
        (status = 409, description = "`already_submitted`: the session is not OPEN or ABORTED; `request_in_progress`: the same Idempotency-Key is still running; `closing`: the experience closes before this submission could finish.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the prompt or score breaks its rule; `idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
        (status = 429, description = "`rate_limited`: too many submissions for this session.", body = super::schema::ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
pub async fn submit(
    state: web::Data<AppState>,
    id: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let token = bearer(&req)
        .ok_or(ApiError::Unauthorized(
            "the session's bearer token is required",
        ))?
        .to_owned();
    let request = SubmitRequest {
        session_id: id.into_inner(),
        token,
        key: key_of(&req).ok().flatten(),
        body: read_body(payload).await,
        trace_context: crate::telemetry::traceparent_of(&tracing::Span::current()),
    };
    let session_id = request.session_id.clone();
    let (reply, replayed) = state
        .submissions
        .submit(request)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    if !replayed && reply.status == StatusCode::ACCEPTED {
        tracing::info!(%session_id, saga_id = %reply.body["saga_id"], "submission accepted");
        state.wakeups.saga_work();
    }
    Ok(respond(
        reply,
        replayed,
        Some(format!("/api/sessions/{session_id}")),
    ))
}
