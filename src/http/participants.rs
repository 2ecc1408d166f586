//! Participant endpoints: open a session, read the session, read the public
//! ranking, and the rules of a submission's body (the submission itself is
//! taken by [`super::submissions`]).

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::auth::{new_secret, require_session};
use super::body::{parse_json, read_body};
use super::error::ApiError;
use super::idempotency::{key_of, respond, run_idempotent, strong_anonymous_key, Reply};
use super::AppState;
use crate::clock::rfc3339;
use crate::domain::locale::Locale;
use crate::domain::media::InputKind;
use crate::domain::saga::{AbortReason, Step};
use crate::domain::session::SessionStatus;
use crate::store::submissions::Submission;

const NICKNAME_MAX: usize = 40;
const PROMPT_MAX: usize = 2_000;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewSession {
    /// 1 to 40 characters (after trimming), no control characters.
    #[schema(min_length = 1, max_length = 40, example = "alice")]
    nickname: String,
    /// The booth the participant scanned; a terminal of this experience.
    #[serde(default)]
    #[schema(format = Uuid)]
    terminal_id: Option<String>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SubmissionBody {
    /// 1 to 2,000 characters, not only whitespace; may be left out (or
    /// empty) only for an experience whose `input` is `photo`.
    #[serde(default)]
    #[schema(max_length = 2000, example = "a cat surfing at sunset")]
    prompt: String,
    /// The photo uploaded with `POST /api/sessions/{id}/photo`: required by
    /// an experience whose `input` takes a photo, refused by one that
    /// takes none.
    #[serde(default)]
    #[schema(format = Uuid)]
    photo_id: Option<String>,
    /// The participant's own score (a finite number); ranked instead of
    /// the AI result's score when given.
    #[serde(default)]
    score: Option<f64>,
    /// False: the guest ticked "don't show mine in the gallery"; default
    /// true.
    #[serde(default)]
    in_gallery: Option<bool>,
    /// True: the guest ticked the consent box under the experience's
    /// notice; required (422 without it) by an experience with
    /// `consent_required`.
    #[serde(default)]
    consent: Option<bool>,
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

pub(super) fn validate_submission(body: SubmissionBody) -> Result<Submission, ApiError> {
    let chars = body.prompt.chars().count();
    // Without a photo a prompt is needed; with one, the experience decides
    // (`check_input`).
    let blank = chars == 0 || body.prompt.trim().is_empty();
    if (blank && body.photo_id.is_none()) || chars > PROMPT_MAX {
        return Err(prompt_rule());
    }
    if let Some(score) = body.score {
        if !score.is_finite() {
            return Err(ApiError::Validation("score must be a finite number".into()));
        }
    }
    Ok(Submission {
        prompt: body.prompt,
        score: body.score,
        photo_id: body.photo_id,
        in_gallery: body.in_gallery.unwrap_or(true),
        consent: body.consent.unwrap_or(false),
    })
}

fn prompt_rule() -> ApiError {
    ApiError::Validation(format!("prompt must be 1 to {PROMPT_MAX} characters"))
}

/// Whether a valid submission fits its experience's `input`: a photo where
/// one is taken (and only there), a prompt where one is needed, and a
/// photo of this very session (`photo_session`: the session of the named
/// photo, None when no such photo exists).
pub(super) fn check_input(
    submission: &Submission,
    input: InputKind,
    consent_required: bool,
    session_id: &str,
    photo_session: Option<&str>,
) -> Result<(), ApiError> {
    match (&submission.photo_id, input.takes_photo()) {
        (None, true) => {
            return Err(ApiError::Validation(format!(
                "photo_id is required: this experience takes a photo (upload it first with POST /api/sessions/{session_id}/photo)"
            )))
        }
        (Some(_), false) => {
            return Err(ApiError::Validation(
                "photo_id must be left out: this experience takes no photo".into(),
            ))
        }
        (Some(photo_id), true) if photo_session != Some(session_id) => {
            return Err(ApiError::Validation(format!(
                "photo_id {:?} is not a photo uploaded to this session",
                photo_id.chars().take(40).collect::<String>()
            )))
        }
        _ => {}
    }
    if input.needs_prompt() && submission.prompt.trim().is_empty() {
        return Err(prompt_rule());
    }
    if consent_required && !submission.consent {
        return Err(ApiError::Validation(
            "consent is required: this experience asks the guest to tick the box under its notice (\"consent\": true)".into(),
        ));
    }
    Ok(())
}

/// `POST /api/experiences/{slug}/sessions`
#[utoipa::path(
    post,
    path = "/api/experiences/{slug}/sessions",
    tag = "participants",
    summary = "Open a session (anonymous): returns the participant token, once.",
    params(
        ("slug" = String, Path, description = "The experience's slug."),
        super::schema::SessionKey,
    ),
    request_body = NewSession,
    responses(
        (status = 201, description = "Opened (or the replay of an earlier creation with the same key and body).", body = super::schema::SessionCreated, headers(("Location" = String, description = "`/api/sessions/{session_id}`."), ("Idempotent-Replayed" = String, description = "`true` when this is the stored answer of an earlier request with the same Idempotency-Key."))),
        (status = 400, description = "`invalid_json`: the body is not JSON for this request; `idempotency_key_required`: the Idempotency-Key is malformed; `idempotency_key_too_weak`: it carries fewer than 122 random bits.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such experience.", body = super::schema::ErrorBody),
        (status = 409, description = "`request_in_progress`: the same Idempotency-Key is still running.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the nickname breaks its rule, or `terminal_id` is not a terminal of this experience; `idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
        (status = 429, description = "`rate_limited`: too many sessions from this client address.", body = super::schema::ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
pub async fn create_session(
    state: web::Data<AppState>,
    slug: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let key = key_of(&req)?;
    // No caller token here: the key alone keeps one phone's answer (its
    // participant token) from another, so it must be unguessable.
    if key.as_deref().is_some_and(|k| !strong_anonymous_key(k)) {
        return Err(ApiError::IdempotencyKeyTooWeak);
    }
    let body = read_body(payload).await?;
    let scope = format!("anonymous {}", req.path());
    let (reply, replayed) = run_idempotent(&state, &scope, "", key, &body, || async {
        let new: NewSession = parse_json(&body)?;
        let nickname = validate_nickname(&new.nickname)?;
        let experience = state.experience(&slug).await?;
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

/// `GET /api/sessions/{id}` (participant or operator token).
#[utoipa::path(
    get,
    path = "/api/sessions/{id}",
    tag = "participants",
    summary = "A session's status, and its result once COMPLETED.",
    security(("participant" = []), ("operator" = [])),
    params(("id" = String, Path, description = "The session's id.")),
    responses(
        (status = 200, description = "The session.", body = super::schema::SessionView),
        (status = 401, description = "`unauthorized`: no bearer token, or one that does not open this session.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such session.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the path could not be read.", body = super::schema::ErrorBody),
    )
)]
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
    let locale = Locale::of(&experience.locale);
    let message = match reason {
        Some(reason) if session.status == SessionStatus::Aborted.as_str() => reason.message_for(
            saga.as_ref().and_then(|s| s.abort_detail.as_deref()),
            locale,
        ),
        _ => locale.text(&format!("session.{}", session.status)),
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
    let progress = match &saga {
        Some(saga) if experience.ai_calls > 1 && saga.step == Step::AiPending.as_str() => {
            let done = state.store.ai_calls_done(&saga.id).await?;
            json!({"done": done, "total": experience.ai_calls})
        }
        _ => serde_json::Value::Null,
    };
    // Waiting for the AI: its place in the experience's queue, and
    // whether the provider is paused (its breaker open).
    let now = state.clock.now_ms();
    let (queue_position, ai_paused, out_of_credit) = match &saga {
        Some(saga) if saga.step == Step::AiPending.as_str() => {
            let breaker = state.store.breaker_row(&experience.provider).await?;
            let paused = breaker.breaker.state(now) != crate::domain::breaker::BreakerState::Closed;
            let out_of_credit = breaker.opener == Some(crate::domain::breaker::Opener::OutOfQuota);
            (
                state.store.queue_position(saga, now).await?,
                paused,
                out_of_credit,
            )
        }
        _ => (None, false, false),
    };
    let message = if out_of_credit {
        // Not a pause that ends by itself: staff must act.
        locale.text("session.ai_out_of_credit")
    } else if ai_paused {
        locale.text("session.ai_paused")
    } else if saga
        .as_ref()
        .is_some_and(|s| s.step == Step::InReview.as_str())
    {
        // The result waits for a person before the public screen.
        locale.text("session.IN_REVIEW")
    } else {
        message
    };
    // Only a completed session has a picture to print or mail: a phone
    // polling while its saga runs costs no read of prints or mails.
    let (prints, emails): (Vec<serde_json::Value>, Vec<serde_json::Value>) =
        if session.status == SessionStatus::Completed.as_str() {
            let prints = state.store.prints_of_session(&session.id).await?;
            let emails = state.store.mails_of_session(&session.id).await?;
            (
                prints
                    .iter()
                    .map(|p| crate::store::prints::print_json(p, locale))
                    .collect(),
                emails
                    .iter()
                    .map(crate::store::mails::guest_mail_json)
                    .collect(),
            )
        } else {
            (Vec::new(), Vec::new())
        };
    Ok(HttpResponse::Ok().json(json!({
        "prints": prints,
        "emails": emails,
        "session_id": session.id,
        "experience": experience.slug,
        "nickname": session.nickname,
        "status": session.status,
        "step": saga.as_ref().map(|s| s.step.clone()),
        "abort_reason": session.abort_reason,
        "message": message,
        "result": result,
        "progress": progress,
        "queue_position": queue_position,
        "ai_paused": ai_paused,
        "share_url": share_url(&session),
        "in_gallery": session.in_gallery,
        "erased": session.forgotten_at_ms.is_some(),
        "updated_at": rfc3339(session.updated_at_ms),
    })))
}

/// The result link of a completed session whose data is kept.
fn share_url(session: &crate::store::entities::sessions::Model) -> Option<String> {
    match &session.share_id {
        Some(id)
            if session.status == SessionStatus::Completed.as_str()
                && session.forgotten_at_ms.is_none() =>
        {
            Some(crate::domain::guests::share_path(id))
        }
        _ => None,
    }
}

#[derive(Deserialize)]
pub struct RankingQuery {
    limit: Option<u64>,
}

/// `GET /api/experiences/{slug}/ranking?limit=N` (public; 1..=100, default 10).
#[utoipa::path(
    get,
    path = "/api/experiences/{slug}/ranking",
    tag = "participants",
    summary = "The experience's ranking, best first (public).",
    params(
        ("slug" = String, Path, description = "The experience's slug."),
        ("limit" = Option<u64>, Query, description = "Entries, default 10; values outside 1 to 100 are clamped."),
    ),
    responses(
        (status = 200, description = "The ranking.", body = super::schema::Ranking),
        (status = 404, description = "`not_found`: no such experience.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the path or query could not be read (e.g. a limit that is not a non-negative integer).", body = super::schema::ErrorBody),
    )
)]
pub async fn ranking(
    state: web::Data<AppState>,
    slug: web::Path<String>,
    query: web::Query<RankingQuery>,
) -> Result<HttpResponse, ApiError> {
    let experience = state.experience(&slug).await?;
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
                photo_id: None,
                in_gallery: None,
                consent: None,
            })
            .is_ok()
        };
        assert!(ok("a cat"));
        assert!(!ok(""));
        assert!(!ok("   "));
        assert!(ok(&"x".repeat(2_000)));
        assert!(!ok(&"x".repeat(2_001)));
        // With a photo an empty prompt passes here; the experience decides.
        let with_photo = |p: &str| SubmissionBody {
            prompt: p.into(),
            score: None,
            photo_id: Some("a-photo".into()),
            in_gallery: None,
            consent: None,
        };
        let photo_only = validate_submission(with_photo("")).expect("valid without a prompt");
        assert!(check_input(&photo_only, InputKind::Photo, false, "s1", Some("s1")).is_ok());
        assert!(check_input(
            &photo_only,
            InputKind::PhotoAndPrompt,
            false,
            "s1",
            Some("s1")
        )
        .is_err());
        assert!(
            check_input(&photo_only, InputKind::Photo, false, "s1", Some("s2")).is_err(),
            "another session's photo"
        );
        assert!(
            check_input(&photo_only, InputKind::Photo, false, "s1", None).is_err(),
            "no such photo"
        );
        assert!(
            check_input(&photo_only, InputKind::Prompt, false, "s1", Some("s1")).is_err(),
            "a prompt experience"
        );
        let prompt_only = validate_submission(SubmissionBody {
            prompt: "a cat".into(),
            score: None,
            photo_id: None,
            in_gallery: None,
            consent: None,
        })
        .expect("valid");
        assert!(
            check_input(&prompt_only, InputKind::Photo, false, "s1", None).is_err(),
            "a photo experience needs one"
        );
        assert!(check_input(&prompt_only, InputKind::Prompt, false, "s1", None).is_ok());
        assert!(
            check_input(&prompt_only, InputKind::Prompt, true, "s1", None).is_err(),
            "consent asked for and not given"
        );
        let consented = validate_submission(SubmissionBody {
            prompt: "a cat".into(),
            score: None,
            photo_id: None,
            in_gallery: Some(false),
            consent: Some(true),
        })
        .expect("valid");
        assert!(!consented.in_gallery);
        assert!(check_input(&consented, InputKind::Prompt, true, "s1", None).is_ok());
        assert!(validate_submission(SubmissionBody {
            prompt: "a".into(),
            score: Some(f64::NAN),
            photo_id: None,
            in_gallery: None,
            consent: None,
        })
        .is_err());
    }
}
