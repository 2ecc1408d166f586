//! The guests' side of their data over HTTP: the result link (`/r/{id}`,
//! its JSON, its download and its QR code), the gallery's API (public or
//! behind a PIN), erasure by the guest and by an operator, hiding a result,
//! finding a guest's session by nickname, and what an experience holds.
//! The export is `http::export`; the rules and the SQL are
//! `domain::guests` and `store::guests`.

use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::auth::{require_session, signed_in};
use super::error::ApiError;
use super::idempotency::{operator_write, Reply};
use super::AppState;
use crate::clock::rfc3339;
use crate::domain::audit::{AuditAction, AuditEntry};
use crate::domain::guests::{self, ForgottenBy, Gallery};
use crate::domain::media::KeptType;
use crate::domain::roles::Operator;
use crate::domain::saga::Step;
use crate::store::entities::experiences;
use crate::store::guests::{Forget, ResultCursor, ShareLookup, SharedResult};

/// Why a link answers 410.
const ERASED: &str = "this result was deleted at its owner's request";
const EXPIRED: &str = "this result is no longer kept: the organiser's retention period has ended";

/// A result item as the link, the gallery and the export show it.
fn result_json(result: &SharedResult) -> serde_json::Value {
    json!({
        "session_id": result.session_id,
        "nickname": result.nickname,
        "content": result.content,
        "completed_at": rfc3339(result.completed_at_ms),
    })
}

/// The result link `share_id`'s live result, or why there is none
/// (404, or 410 `gone`).
async fn live_share(
    state: &AppState,
    share_id: &str,
) -> Result<(SharedResult, experiences::Model), ApiError> {
    if !guests::is_share_id(share_id) {
        return Err(ApiError::NotFound("result"));
    }
    match state.store.shared_result(share_id).await? {
        ShareLookup::Live { result, experience } => Ok((result, *experience)),
        ShareLookup::Gone(by) if by.is_erasure() => Err(ApiError::Gone(ERASED)),
        ShareLookup::Gone(_) => Err(ApiError::Gone(EXPIRED)),
        ShareLookup::Unknown => Err(ApiError::NotFound("result")),
    }
}

/// The kept file a download gives: the first item whose full file is
/// kept by this server.
fn download_key(result: &SharedResult) -> Option<String> {
    result.content.as_array()?.iter().find_map(|item| {
        item["url"]
            .as_str()?
            .strip_prefix("/media/")
            .filter(|key| key.starts_with("r/"))
            .map(str::to_owned)
    })
}

/// `GET /r/{share_id}`: the result page, or, once the result is erased or
/// expired, 410: a plain page for a browser (`Accept: text/html`), the
/// JSON error otherwise.
#[utoipa::path(
    get,
    path = "/r/{share_id}",
    tag = "pages",
    summary = "A result's own page (its link): the result, Download and Share; 410 once erased or expired.",
    params(("share_id" = String, Path, description = "The result link's id (32 hex digits).")),
    responses(
        (status = 200, description = "The page.", content_type = "text/html", body = String),
        (status = 404, description = "`not_found`: no such result.", body = super::schema::ErrorBody),
        (status = 410, description = "`gone`: the result was erased or its retention ended; a browser gets a plain page saying which.", content(
            (super::schema::ErrorBody = "application/json"),
            (String = "text/html"),
        )),
    )
)]
pub async fn result_page(
    state: web::Data<AppState>,
    req: HttpRequest,
    share_id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    match live_share(&state, &share_id).await {
        Ok(_) => Ok(super::pages::result_page()),
        Err(ApiError::Gone(why)) if wants_html(&req) => Ok(super::pages::gone_page(why == ERASED)),
        Err(e) => Err(e),
    }
}

/// Whether the client asked for a page (a browser's navigation).
fn wants_html(req: &HttpRequest) -> bool {
    req.headers()
        .get(actix_web::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"))
}

/// `GET /api/share/{share_id}`: what the result page shows.
#[utoipa::path(
    get,
    path = "/api/share/{share_id}",
    tag = "participants",
    summary = "A result by its link (public: the link is the key).",
    params(("share_id" = String, Path, description = "The result link's id.")),
    responses(
        (status = 200, description = "The result.", body = super::schema::SharedResultView),
        (status = 404, description = "`not_found`: no such result (or not completed).", body = super::schema::ErrorBody),
        (status = 410, description = "`gone`: erased, or its retention ended.", body = super::schema::ErrorBody),
    )
)]
pub async fn share_json(
    state: web::Data<AppState>,
    share_id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (result, experience) = live_share(&state, &share_id).await?;
    let mut body = result_json(&result);
    body["share_id"] = json!(share_id.as_str());
    body["experience"] = json!(experience.slug);
    body["title"] = json!(experience.title);
    body["locale"] = json!(experience.locale);
    body["score"] = json!(result.score);
    body["download_url"] = json!(download_key(&result).map(|_| format!("/r/{share_id}/download")));
    Ok(HttpResponse::Ok()
        .insert_header(("Cache-Control", "no-store"))
        .json(body))
}

/// `GET /r/{share_id}/download`: the kept full-size file, as an
/// attachment.
#[utoipa::path(
    get,
    path = "/r/{share_id}/download",
    tag = "participants",
    summary = "Download a result's kept full-size file.",
    params(("share_id" = String, Path, description = "The result link's id.")),
    responses(
        (status = 200, description = "The file (`Content-Disposition: attachment`).", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404, description = "`not_found`: no such result, or no file of it is kept here.", body = super::schema::ErrorBody),
        (status = 410, description = "`gone`: erased, or its retention ended.", body = super::schema::ErrorBody),
        (status = 503, description = "`media_unavailable`: the media store does not answer.", body = super::schema::ErrorBody),
    )
)]
pub async fn download(
    state: web::Data<AppState>,
    share_id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (result, experience) = live_share(&state, &share_id).await?;
    let key = download_key(&result).ok_or(ApiError::NotFound("kept file"))?;
    // Streamed: a 50 MB video is never held whole per download.
    let file = state.media.read(&key, None).await?;
    let kept = KeptType::of_key(&key);
    let extension = key.rsplit_once('.').map_or("bin", |(_, ext)| ext);
    let name = format!("{}-{}.{extension}", experience.slug, &share_id[..8]);
    Ok(HttpResponse::Ok()
        .content_type(kept.map_or("application/octet-stream", |k| k.content_type))
        .insert_header((
            "Content-Disposition",
            format!("attachment; filename=\"{name}\""),
        ))
        .insert_header(("Cache-Control", "private, no-store"))
        .body(actix_web::body::SizedStream::new(file.length, file.body)))
}

/// `GET /r/{share_id}/qr.svg`: the link as a QR code, for a friend's
/// phone or the booth display.
#[utoipa::path(
    get,
    path = "/r/{share_id}/qr.svg",
    tag = "participants",
    summary = "The result link as a QR code.",
    params(("share_id" = String, Path, description = "The result link's id.")),
    responses(
        (status = 200, description = "An SVG.", content_type = "image/svg+xml", body = String),
        (status = 404, description = "`not_found`: no such result.", body = super::schema::ErrorBody),
        (status = 410, description = "`gone`: erased, or its retention ended.", body = super::schema::ErrorBody),
    )
)]
pub async fn share_qr(
    state: web::Data<AppState>,
    share_id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    live_share(&state, &share_id).await?;
    let url = format!("{}{}", state.public_url, guests::share_path(&share_id));
    super::operators::qr_answer(&url)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GalleryQuery {
    limit: Option<u64>,
    before: Option<String>,
}

/// A gallery or export cursor as the API shows it: `<ms>.<session id>`.
fn cursor_text(result: &SharedResult) -> String {
    format!("{}.{}", result.completed_at_ms, result.session_id)
}

fn parse_cursor(text: &str) -> Result<ResultCursor, ApiError> {
    text.split_once('.')
        .and_then(|(ms, id)| {
            Some(ResultCursor {
                completed_at_ms: ms.parse().ok()?,
                session_id: id.to_owned(),
            })
        })
        .filter(|c| !c.session_id.is_empty() && c.session_id.len() <= 64)
        .ok_or_else(|| ApiError::Validation("before must be a cursor this API gave (next)".into()))
}

/// Whether the request may see the experience's gallery: 404 when it has
/// none; a PIN gallery's door is `gallery_pin::open`.
async fn open_gallery(
    state: &AppState,
    req: &HttpRequest,
    experience: &experiences::Model,
) -> Result<(), ApiError> {
    match Gallery::of(&experience.gallery) {
        Gallery::Off => Err(ApiError::NotFound("gallery")),
        Gallery::Public => Ok(()),
        Gallery::Pin => super::gallery_pin::open(state, req, experience).await,
    }
}

/// `GET /api/experiences/{slug}/gallery?limit=&before=`
#[utoipa::path(
    get,
    path = "/api/experiences/{slug}/gallery",
    tag = "participants",
    summary = "The experience's gallery, newest first (public, or with X-Gallery-Pin).",
    params(
        ("slug" = String, Path, description = "The experience's slug."),
        ("limit" = Option<u64>, Query, description = "Items, default 24; values outside 1 to 100 are clamped."),
        ("before" = Option<String>, Query, description = "The `next` of the page before."),
        ("X-Gallery-Pin" = Option<String>, Header, description = "The gallery's PIN (a `pin` gallery)."),
    ),
    responses(
        (status = 200, description = "A page of results.", body = super::schema::GalleryPage),
        (status = 401, description = "`gallery_pin_required`, `gallery_pin_wrong`, or `gallery_pin_outdated`: the gallery's old PIN of fewer than 6 digits, which no longer opens it.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such experience, or its gallery is off.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the query could not be read.", body = super::schema::ErrorBody),
        (status = 429, description = "`rate_limited`: too many requests with a PIN from this client address; `gallery_locked`: too many wrong PINs from all addresses, every PIN answered so until the lock ends, the right one too (`Retry-After`).", body = super::schema::ErrorBody),
        (status = 503, description = "`busy`: every place for checking a PIN is taken; try again (`Retry-After`).", body = super::schema::ErrorBody),
    )
)]
pub async fn gallery(
    state: web::Data<AppState>,
    req: HttpRequest,
    slug: web::Path<String>,
    query: web::Query<GalleryQuery>,
) -> Result<HttpResponse, ApiError> {
    let experience = state.experience(&slug).await?;
    open_gallery(&state, &req, &experience).await?;
    let limit = query.limit.unwrap_or(24).clamp(1, 100);
    let before = query.before.as_deref().map(parse_cursor).transpose()?;
    let mut items = state
        .store
        .gallery_page(&experience.id, limit + 1, before.as_ref())
        .await?;
    let next = if items.len() as u64 > limit {
        items.truncate(limit as usize);
        items.last().map(cursor_text)
    } else {
        None
    };
    Ok(HttpResponse::Ok()
        .insert_header(("Cache-Control", "no-store"))
        .json(json!({
            "items": items.iter().map(result_json).collect::<Vec<_>>(),
            "next": next,
        })))
}

/// Erases a session: a running saga is cancelled first, then its data
/// is forgotten and its objects deleted at once (what a crash leaves, the
/// cleanup's purge deletes). An operator's erasure (`operator`) is
/// recorded in the audit trail, with the cancel it needed.
pub(super) async fn erase(
    state: &AppState,
    session_id: &str,
    by: ForgottenBy,
    operator: Option<&Operator>,
) -> Result<(), ApiError> {
    let target = format!("session:{session_id}");
    let audit = operator.map(|o| AuditEntry::new(o, AuditAction::SessionErase, target));
    for _ in 0..3 {
        let now = state.clock.now_ms();
        let forgotten = state
            .store
            .forget_session(session_id, by, audit.as_ref(), now)
            .await?;
        match forgotten {
            Forget::Already => return Ok(()),
            Forget::Forgotten { displays } => {
                if displays > 0 {
                    state.wakeups.event_appended();
                }
                tracing::info!(session_id, by = by.as_str(), displays, "session erased");
                purge_now(state, session_id).await;
                return Ok(());
            }
            Forget::Running => {
                let saga = state.store.latest_saga_of_session(session_id).await?;
                if let Some(saga) = saga.filter(|s| {
                    s.step != Step::Completed.as_str() && s.step != Step::Aborted.as_str()
                }) {
                    let cancel = operator.map(|o| {
                        AuditEntry::new(o, AuditAction::SagaCancel, format!("saga:{}", saga.id))
                            .detail("to erase its session")
                    });
                    match super::admin::cancel_one(state, &saga.id, cancel).await {
                        Ok(()) | Err(ApiError::Conflict(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }
    Err(ApiError::Conflict(
        "the session is starting a submission right now; try the erasure again in a moment".into(),
    ))
}

/// Deletes a just-forgotten session's objects (best effort: the cleanup
/// actor's purge takes whatever is left).
async fn purge_now(state: &AppState, session_id: &str) {
    let now = state.clock.now_ms();
    let item = match state
        .store
        .claim_session_purge(session_id, now, state.lease_ms)
        .await
    {
        Ok(Some(item)) => item,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(session_id, error = %e, "erasure: the purge is left to the cleanup");
            return;
        }
    };
    match crate::media::purge::purge(&state.store, &state.media, &item).await {
        Ok(objects) => tracing::info!(session_id, objects, "erasure: objects deleted"),
        Err(e) => {
            tracing::warn!(session_id, error = %e, "erasure: the purge is left to the cleanup")
        }
    }
}

fn erased_answer(session_id: &str) -> HttpResponse {
    HttpResponse::Ok().json(json!({"session_id": session_id, "erased": true}))
}

/// `DELETE /api/sessions/{id}` with the participant's token.
#[utoipa::path(
    delete,
    path = "/api/sessions/{id}",
    tag = "participants",
    summary = "Erase my photo, my result and my nickname (200 again when repeated).",
    security(("participant" = [])),
    params(("id" = String, Path, description = "The session id.")),
    responses(
        (status = 200, description = "Erased.", body = super::schema::Erased),
        (status = 401, description = "`unauthorized`: no bearer token, or one that does not open this session.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such session.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: a submission is starting right now; try again.", body = super::schema::ErrorBody),
        (status = 503, description = "`unavailable` or `busy`: the database did not answer.", body = super::schema::ErrorBody),
    )
)]
pub async fn erase_own(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let session = require_session(&state, &req, &id, false).await?;
    erase(&state, &session.id, ForgottenBy::Participant, None).await?;
    Ok(erased_answer(&session.id))
}

/// `DELETE /api/admin/sessions/{id}`: an erasure an operator makes (a
/// request that came by e-mail).
#[utoipa::path(
    delete,
    path = "/api/admin/sessions/{id}",
    tag = "admin",
    summary = "Erase a guest's session on their request (200 again when repeated).",
    security(("operator" = [])),
    params(("id" = String, Path, description = "The session id.")),
    responses(
        (status = 200, description = "Erased.", body = super::schema::Erased),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such session.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: a submission is starting right now; try again.", body = super::schema::ErrorBody),
        (status = 503, description = "`unavailable` or `busy`: the database did not answer.", body = super::schema::ErrorBody),
    )
)]
pub async fn erase_by_operator(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    erase(&state, &id, ForgottenBy::Operator, Some(&operator)).await?;
    tracing::info!(session_id = %id, operator = %operator.name, "operator erasure");
    Ok(erased_answer(&id))
}

/// `POST /api/admin/sessions/{id}/hide` and `/unhide`.
async fn set_hidden(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
    hidden: bool,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let kind = if hidden {
        AuditAction::SessionHide
    } else {
        AuditAction::SessionUnhide
    };
    let audit = AuditEntry::new(&operator, kind, format!("session:{id}"));
    let (state, audit, id) = (&state, &audit, id.as_str());
    operator_write(state, &req, payload, |_| async move {
        let displays = state
            .store
            .set_hidden(id, hidden, Some(audit), state.clock.now_ms())
            .await?
            .ok_or(ApiError::NotFound("session"))?;
        if displays > 0 {
            state.wakeups.event_appended();
        }
        tracing::info!(session_id = %id, hidden, displays, "operator hid or showed a result");
        Ok(Reply {
            status: StatusCode::OK,
            body: json!({"session_id": id, "hidden": hidden}),
        })
    })
    .await
}

#[utoipa::path(
    post,
    path = "/api/admin/sessions/{id}/hide",
    tag = "admin",
    summary = "Hide a result from the gallery and the displays (they drop it at once).",
    security(("operator" = [])),
    params(("id" = String, Path, description = "The session id."), super::schema::OperatorKey),
    responses(
        (status = 200, description = "Hidden.", body = super::schema::HiddenView),
        (status = 400, description = "`idempotency_key_required`: the Idempotency-Key is malformed.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such session.", body = super::schema::ErrorBody),
        (status = 409, description = "`request_in_progress`: the same Idempotency-Key is still running.", body = super::schema::ErrorBody),
        (status = 422, description = "`idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
    )
)]
pub async fn hide(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    set_hidden(state, req, id, payload, true).await
}

#[utoipa::path(
    post,
    path = "/api/admin/sessions/{id}/unhide",
    tag = "admin",
    summary = "Show a hidden result in the gallery again.",
    security(("operator" = [])),
    params(("id" = String, Path, description = "The session id."), super::schema::OperatorKey),
    responses(
        (status = 200, description = "Shown again.", body = super::schema::HiddenView),
        (status = 400, description = "`idempotency_key_required`: the Idempotency-Key is malformed.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such session.", body = super::schema::ErrorBody),
        (status = 409, description = "`request_in_progress`: the same Idempotency-Key is still running.", body = super::schema::ErrorBody),
        (status = 422, description = "`idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
    )
)]
pub async fn unhide(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    set_hidden(state, req, id, payload, false).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSearch {
    nickname: String,
    experience: Option<String>,
}

/// `GET /api/admin/sessions?nickname=&experience=`: the sessions whose
/// nickname contains the text, newest first (at most 50).
#[utoipa::path(
    get,
    path = "/api/admin/sessions",
    tag = "admin",
    summary = "Find guests' sessions by nickname (for an erasure request).",
    security(("operator" = [])),
    params(
        ("nickname" = String, Query, description = "Text the nickname contains (any case), 1 to 40 characters."),
        ("experience" = Option<String>, Query, description = "Only this experience (slug)."),
    ),
    responses(
        (status = 200, description = "The sessions.", body = super::schema::SessionSearchResult),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such experience.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the query could not be read.", body = super::schema::ErrorBody),
    )
)]
pub async fn search_sessions(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<SessionSearch>,
) -> Result<HttpResponse, ApiError> {
    signed_in(&req)?;
    let text = query.nickname.trim();
    if text.is_empty() || text.chars().count() > 40 {
        return Err(ApiError::Validation(
            "nickname must be 1 to 40 characters".into(),
        ));
    }
    let experience = match query.experience.as_deref().filter(|s| !s.is_empty()) {
        Some(slug) => Some(state.experience(slug).await?),
        None => None,
    };
    let found = state
        .store
        .sessions_by_nickname(experience.as_ref().map(|e| e.id.as_str()), text, 50)
        .await?;
    let slugs: HashMap<String, String> = state
        .store
        .list_experiences()
        .await?
        .into_iter()
        .map(|e| (e.id, e.slug))
        .collect();
    let sessions: Vec<serde_json::Value> = found
        .iter()
        .map(|s| {
            json!({
                "session_id": s.id,
                "experience": slugs.get(&s.experience_id),
                "nickname": s.nickname,
                "status": s.status,
                "hidden": s.hidden,
                "share_url": (s.status == "COMPLETED")
                    .then(|| s.share_id.as_deref().map(guests::share_path))
                    .flatten(),
                "created_at": rfc3339(s.created_at_ms),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "sessions": sessions })))
}

/// `GET /api/admin/experiences/{slug}/held`: what the experience holds
/// and when its next data is due.
#[utoipa::path(
    get,
    path = "/api/admin/experiences/{slug}/held",
    tag = "admin",
    summary = "What an experience holds of its guests' data, and when the next purge is due.",
    security(("operator" = [])),
    params(("slug" = String, Path, description = "The experience's slug.")),
    responses(
        (status = 200, description = "The figures.", body = super::schema::HeldView),
        (status = 401, description = "`unauthorized`: the operator token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`: no such experience.", body = super::schema::ErrorBody),
    )
)]
pub async fn held(
    state: web::Data<AppState>,
    req: HttpRequest,
    slug: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    signed_in(&req)?;
    let experience = state.experience(&slug).await?;
    let held = state.store.held(&experience.id).await?;
    let text = |ms: i64| {
        humantime::format_duration(std::time::Duration::from_millis(ms.max(0) as u64)).to_string()
    };
    Ok(HttpResponse::Ok().json(json!({
        "photos": held.photos,
        "photo_bytes": held.photo_bytes,
        "results": held.results,
        "forgotten": held.forgotten,
        "next_purge_at": held.next_due_ms.map(rfc3339),
        "next_photo_purge_at": held.next_photo_due_ms.map(rfc3339),
        "retention": text(experience.retention_ms),
        "photo_retention": text(experience.photo_retention_ms),
    })))
}
