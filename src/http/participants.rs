//! Participant endpoints: open a session, submit (202 at once; the saga does
//! the rest), read the session, read the public ranking.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::auth::{new_secret, require_session};
use super::body::{parse_json, read_body};
use super::error::ApiError;
use super::idempotency::{
    answer_taken, key_of, key_request, respond, run_idempotent, Reply, KEY_TTL_MS,
};
use super::AppState;
use crate::actors::batching::{batch_failed, BatchLimits, BatchQueue};
use crate::clock::{rfc3339, SharedClock};
use crate::domain::saga::{AbortReason, Step};
use crate::domain::session::SessionStatus;
use crate::store::submissions::{Submission, SubmissionAction, SubmissionOrder, SubmissionOutcome};
use crate::store::{new_id, Store, StoreResult};

const NICKNAME_MAX: usize = 40;
const PROMPT_MAX: usize = 2_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSession {
    nickname: String,
    #[serde(default)]
    terminal_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmissionBody {
    prompt: String,
    #[serde(default)]
    score: Option<f64>,
}

fn validate_nickname(nickname: &str) -> Result<String, ApiError> {
    let nickname = nickname.trim();
    let chars = nickname.chars().count();
    if chars == 0 || chars > NICKNAME_MAX {
        return Err(ApiError::Validation(format!(
            "nickname must be 1 to {NICKNAME_MAX} characters"
        )));
    }
    if nickname.chars().any(char::is_control) {
        return Err(ApiError::Validation(
            "nickname must not contain control characters".into(),
        ));
    }
    Ok(nickname.to_owned())
}

fn validate_submission(body: SubmissionBody) -> Result<Submission, ApiError> {
    let chars = body.prompt.chars().count();
    if chars == 0 || body.prompt.trim().is_empty() || chars > PROMPT_MAX {
        return Err(ApiError::Validation(format!(
            "prompt must be 1 to {PROMPT_MAX} characters"
        )));
    }
    if let Some(score) = body.score {
        if !score.is_finite() {
            return Err(ApiError::Validation("score must be a finite number".into()));
        }
    }
    Ok(Submission {
        prompt: body.prompt,
        score: body.score,
    })
}

/// `POST /api/experiences/{slug}/sessions`
pub async fn create_session(
    state: web::Data<AppState>,
    slug: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let key = key_of(&req)?;
    let body = read_body(payload).await?;
    let scope = format!("sessions:{slug}");
    let (reply, replayed) = run_idempotent(&state, &scope, key, &body, || async {
        let new: NewSession = parse_json(&body)?;
        let nickname = validate_nickname(&new.nickname)?;
        let experience = state
            .store
            .experience_by_slug(&slug)
            .await?
            .ok_or(ApiError::NotFound("experience"))?;
        if let Some(terminal_id) = &new.terminal_id {
            let terminal = state.store.terminal(terminal_id).await?;
            if terminal.is_none_or(|t| t.experience_id != experience.id) {
                return Err(ApiError::Validation(
                    "terminal_id is not a terminal of this experience".into(),
                ));
            }
        }
        let token = new_secret();
        let session = state
            .store
            .create_session(
                &experience.id,
                new.terminal_id,
                &nickname,
                &token,
                state.clock.now_ms(),
            )
            .await?;
        Ok(Reply {
            status: StatusCode::CREATED,
            body: json!({
                "session_id": session.id,
                "participant_token": token,
                "status": session.status,
            }),
        })
    })
    .await?;
    let location = reply.body["session_id"]
        .as_str()
        .map(|id| format!("/api/sessions/{id}"));
    Ok(respond(reply, replayed, location))
}

/// The queue that group-commits submissions ([`Store::submit_batch`]).
/// Bounded: when it is full, requests wait for room. One batch is written
/// at a time, so two batches never wait on each other's rows.
pub type SubmissionQueue = BatchQueue<SubmissionOrder, StoreResult<SubmissionOutcome>>;

/// Starts the submission queue on the requests' pool.
pub fn submission_queue(store: Store, clock: SharedClock) -> SubmissionQueue {
    const LIMITS: BatchLimits = BatchLimits {
        capacity: 4_096,
        max_batch: 256,
        concurrent: 1,
    };
    BatchQueue::start(
        "submissions",
        LIMITS,
        move |orders: Vec<SubmissionOrder>| {
            let (store, now) = (store.clone(), clock.now_ms());
            async move {
                match store.submit_batch(&orders, now, KEY_TTL_MS).await {
                    Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
                    Err(e) => {
                        tracing::error!(error = %e, requests = orders.len(), "a batch of submissions failed; their keys were released");
                        batch_failed(orders.len(), &e)
                    }
                }
            }
        },
    )
}

/// `POST /api/sessions/{id}/submission`. Checks in order: authentication,
/// the Idempotency-Key rules, the body, the session's state. The key rules
/// and the session's state are decided in the submission batch, where the
/// answer is stored with the key in the transaction that creates the saga.
pub async fn submit(
    state: web::Data<AppState>,
    id: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let session = require_session(&state, &req, &id, false).await?;
    let key = key_of(&req)?.ok_or(ApiError::IdempotencyKeyRequired)?;
    let body = read_body(payload).await?;
    let key = key_request(&format!("session:{}", session.id), &key, &body);
    let saga_id = new_id();
    let accepted = Reply {
        status: StatusCode::ACCEPTED,
        body: json!({
            "session_id": session.id,
            "saga_id": saga_id,
            "status": SessionStatus::Submitting.as_str(),
            "step": Step::AiPending.as_str(),
        }),
    };
    let checked = parse_json(&body).and_then(validate_submission);
    let action = match &checked {
        Ok(submission) => SubmissionAction::Submit {
            submission: submission.clone(),
            saga_id: saga_id.clone(),
            deadline_ms: state.saga_deadline_ms,
            accepted: accepted.stored(),
            refused: ApiError::AlreadySubmitted.stored(),
        },
        Err(e) => SubmissionAction::Refuse(e.stored()),
    };
    let location = Some(format!("/api/sessions/{}", session.id));
    let order = SubmissionOrder {
        session: session.clone(),
        key: Some(key),
        action,
    };
    match state.submissions.write(order).await? {
        SubmissionOutcome::Accepted => {
            tracing::info!(session_id = %session.id, %saga_id, "submission accepted");
            state.wakeups.saga_work();
            Ok(respond(accepted, false, location))
        }
        SubmissionOutcome::AlreadySubmitted => Err(ApiError::AlreadySubmitted),
        SubmissionOutcome::Refused => Err(checked
            .err()
            .unwrap_or(ApiError::Internal("a valid submission was refused".into()))),
        SubmissionOutcome::Key(claim) => {
            let (reply, replayed) = answer_taken(claim).unwrap_or(Err(ApiError::Internal(
                "a fresh key was not written".into(),
            )))?;
            Ok(respond(reply, replayed, location))
        }
    }
}

/// `GET /api/sessions/{id}` (participant or operator token).
pub async fn get_session(
    state: web::Data<AppState>,
    id: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let session = require_session(&state, &req, &id, true).await?;
    let experience = state
        .store
        .experience_by_id(&session.experience_id)
        .await?
        .ok_or(ApiError::NotFound("experience"))?;
    let saga = state.store.latest_saga_of_session(&session.id).await?;
    let reason = session
        .abort_reason
        .as_deref()
        .and_then(|r| r.parse::<AbortReason>().ok());
    let message = match (session.status.as_str(), reason) {
        (_, Some(reason)) if session.status == SessionStatus::Aborted.as_str() => {
            reason.human_message()
        }
        ("OPEN", _) => "Waiting for your submission.",
        ("SUBMITTING", _) => "Your request is being processed.",
        ("COMPLETED", _) => "Done!",
        _ => "",
    };
    let result = match &saga {
        Some(saga) if saga.step == Step::Completed.as_str() => {
            let content: serde_json::Value = saga
                .content
                .as_deref()
                .and_then(|c| serde_json::from_str(c).ok())
                .unwrap_or_else(|| json!([]));
            // The rank is computed at read time.
            let rank = match state.store.score_of_session(&session.id).await? {
                Some(entry) => Some(state.store.rank_of(&experience.id, entry.score).await?),
                None => None,
            };
            json!({"content": content, "score": saga.score.or(saga.ai_score), "rank": rank})
        }
        _ => serde_json::Value::Null,
    };
    Ok(HttpResponse::Ok().json(json!({
        "session_id": session.id,
        "experience": experience.slug,
        "nickname": session.nickname,
        "status": session.status,
        "step": saga.as_ref().map(|s| s.step.clone()),
        "abort_reason": session.abort_reason,
        "message": message,
        "result": result,
        "updated_at": rfc3339(session.updated_at_ms),
    })))
}

#[derive(Deserialize)]
pub struct RankingQuery {
    limit: Option<u64>,
}

/// `GET /api/experiences/{slug}/ranking?limit=N` (public; 1..=100, default 10).
pub async fn ranking(
    state: web::Data<AppState>,
    slug: web::Path<String>,
    query: web::Query<RankingQuery>,
) -> Result<HttpResponse, ApiError> {
    let experience = state
        .store
        .experience_by_slug(&slug)
        .await?
        .ok_or(ApiError::NotFound("experience"))?;
    let limit = query.limit.unwrap_or(10).clamp(1, 100);
    let entries: Vec<_> = state
        .store
        .ranking(&experience.id, limit)
        .await?
        .into_iter()
        .map(|row| json!({"rank": row.rank, "nickname": row.nickname, "score": row.score, "session_id": row.session_id}))
        .collect();
    Ok(HttpResponse::Ok().json(json!({"entries": entries})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nickname_rules() {
        assert!(validate_nickname("alice").is_ok());
        assert!(validate_nickname("").is_err());
        assert!(validate_nickname(&"x".repeat(41)).is_err());
        assert!(validate_nickname(&"é".repeat(40)).is_ok());
        assert!(validate_nickname("a\u{7}b").is_err());
    }

    #[test]
    fn prompt_rules() {
        let ok = |p: &str| {
            validate_submission(SubmissionBody {
                prompt: p.into(),
                score: None,
            })
            .is_ok()
        };
        assert!(ok("a cat"));
        assert!(!ok(""));
        assert!(!ok("   "));
        assert!(ok(&"x".repeat(2_000)));
        assert!(!ok(&"x".repeat(2_001)));
        assert!(validate_submission(SubmissionBody {
            prompt: "a".into(),
            score: Some(f64::NAN)
        })
        .is_err());
    }
}
