//! Print stations and prints.
//!
//! - `POST/GET/DELETE /api/admin/printers` (admin adds and removes;
//!   viewers list): a printer is asked for its attributes when it is
//!   added, and refused with the reason when it cannot take what this
//!   server sends (no JPEG, not the media named, no colour).
//! - `POST /api/sessions/{id}/print` (the guest's token, an
//!   Idempotency-Key): 202 with the print; the experience's
//!   `prints_per_guest` bounds it (409 `print_limit`), counted in the
//!   statement that takes it. With `print_review` it waits for an
//!   operator.
//! - `POST /api/admin/sessions/{id}/print` (moderators): a print or a
//!   reprint, no bound; `POST /api/admin/prints/{id}/cancel` and
//!   `/approve`.
//!
//! The printer is asked only when it is added; the print queue
//! (`crate::actors::print_queue`) does everything else.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::Value;

use super::auth::{bearer, caller_token, require_session, signed_in};
use super::body::{parse_json, read_body};
use super::error::ApiError;
use super::idempotency::{key_of, respond, run_idempotent, Reply};
use super::AppState;
use crate::domain::audit::{AuditAction, AuditEntry};
use crate::domain::locale::Locale;
use crate::domain::saga::Step;
use crate::print::ipp::IppPrinter;
use crate::print::prepare::{choose_format, media_size};
use crate::store::entities::{prints, sessions};
use crate::store::prints::{print_json, printer_json};
use crate::store::prints::{NewPrinter, PrintAsk};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PrinterBody {
    /// 1 to 80 characters.
    #[schema(example = "Booth A printer", min_length = 1, max_length = 80)]
    name: String,
    /// `ipp://host:port/path` or `ipps://…`.
    #[schema(example = "ipp://192.168.1.40:631/ipp/print")]
    uri: String,
    /// The PWG media name it prints on.
    #[schema(example = "na_index-4x6_4x6in")]
    media: String,
    /// The experiences (slugs) that print on it; empty: all.
    #[serde(default)]
    experiences: Vec<String>,
    /// Print in colour (default true): refused when the printer has none.
    #[serde(default)]
    colour: Option<bool>,
}

/// `POST /api/admin/printers`
#[utoipa::path(
    post,
    path = "/api/admin/printers",
    tag = "admin",
    summary = "Add a print station: the printer is asked what it takes, and refused with the reason when it cannot print what this server sends.",
    security(("operator" = [])),
    request_body = PrinterBody,
    responses(
        (status = 201, description = "Added.", body = Object),
        (status = 400, description = "`invalid_json`: the body is not JSON for this request.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin adds printers.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: a field breaks its rule, an experience is unknown, or the printer does not answer or cannot take JPEG, the media or colour (the message says which).", body = super::schema::ErrorBody),
    )
)]
pub async fn add_printer(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let body: PrinterBody = parse_json(&read_body(payload).await?)?;
    let (experience_ids, slugs) = experiences_of(&state, &body.experiences).await?;
    let new = checked_printer(body, experience_ids).await?;
    let name = new.name.clone();
    let printer = state
        .store
        .create_printer(new, state.clock.now_ms())
        .await?;
    let audit = AuditEntry::new(
        &operator,
        AuditAction::PrinterAdd,
        format!("printer:{}", printer.id),
    )
    .detail(format!(
        "{} at {}, {}",
        printer.name, printer.uri, printer.media
    ));
    state
        .store
        .record_audit(&audit, state.clock.now_ms())
        .await?;
    state.wakeups.prints.ring();
    state.wakeups.stats.ring();
    tracing::info!(printer = %name, uri = %printer.uri, media = %printer.media, state = %printer.state, "printer added");
    Ok(HttpResponse::Created().json(printer_json(&printer, &slugs, 0)))
}

/// The experiences' ids and slugs (422 for an unknown slug).
async fn experiences_of(
    state: &AppState,
    slugs: &[String],
) -> Result<(Vec<String>, Vec<String>), ApiError> {
    let mut ids = Vec::new();
    for slug in slugs {
        let experience =
            state.store.experience_by_slug(slug).await?.ok_or_else(|| {
                ApiError::Validation(format!("experiences: no experience {slug:?}"))
            })?;
        ids.push(experience.id);
    }
    Ok((ids, slugs.to_vec()))
}

/// The printer as stored, once its fields pass and it said it can take
/// what this server sends.
async fn checked_printer(
    body: PrinterBody,
    experiences: Vec<String>,
) -> Result<NewPrinter, ApiError> {
    let name = body.name.trim().to_owned();
    if !(1..=80).contains(&name.chars().count()) {
        return Err(ApiError::Validation(
            "name must be 1 to 80 characters".into(),
        ));
    }
    if media_size(&body.media).is_none() {
        return Err(ApiError::Validation(format!(
            "media {:?} is not a PWG media name with a size, such as na_index-4x6_4x6in or iso_a6_105x148mm",
            body.media
        )));
    }
    let ipp = IppPrinter::new(&body.uri).map_err(|e| ApiError::Validation(format!("uri: {e}")))?;
    let capabilities = ipp.capabilities().await.map_err(|e| {
        ApiError::Validation(format!(
            "the printer at {} did not answer Get-Printer-Attributes: {e}",
            body.uri
        ))
    })?;
    if choose_format(&capabilities.formats).is_none() {
        return Err(ApiError::Validation(format!(
            "the printer takes none of the formats this server sends (image/jpeg, image/pwg-raster); it takes {}",
            capabilities.formats.join(", ")
        )));
    }
    if !capabilities
        .media_supported
        .iter()
        .any(|m| m == &body.media)
    {
        return Err(ApiError::Validation(format!(
            "the printer does not take media {}; it takes {}",
            body.media,
            capabilities.media_supported.join(", ")
        )));
    }
    let colour = body.colour.unwrap_or(true);
    if colour && !capabilities.color {
        return Err(ApiError::Validation(
            "the printer prints in black and white only: add it with \"colour\": false".into(),
        ));
    }
    let said = crate::actors::print_queue::printer_said(&body.media, capabilities);
    Ok(NewPrinter {
        name,
        uri: body.uri,
        media: body.media,
        colour,
        experiences,
        state: said.state,
        state_reasons: said.state_reasons,
        formats: said.formats,
        dpi: said.dpi,
    })
}

/// `GET /api/admin/printers`
#[utoipa::path(
    get,
    path = "/api/admin/printers",
    tag = "admin",
    summary = "The print stations, each with its state, the reasons that hold its queue, and what waits.",
    security(("operator" = [])),
    responses(
        (status = 200, description = "The printers and the open prints.", body = Object),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
    )
)]
pub async fn list_printers(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(state.store.printers_view().await?))
}

/// `DELETE /api/admin/printers/{id}`
#[utoipa::path(
    delete,
    path = "/api/admin/printers/{id}",
    tag = "admin",
    summary = "Remove a print station; prints waiting for it go to another printer of their experience.",
    security(("operator" = [])),
    params(("id" = String, Path)),
    responses(
        (status = 204, description = "Removed."),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin removes printers.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`.", body = super::schema::ErrorBody),
    )
)]
pub async fn remove_printer(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    state.store.delete_printer(&id).await?;
    let audit = AuditEntry::new(
        &operator,
        AuditAction::PrinterRemove,
        format!("printer:{id}"),
    );
    state
        .store
        .record_audit(&audit, state.clock.now_ms())
        .await?;
    state.wakeups.prints.ring();
    state.wakeups.stats.ring();
    Ok(HttpResponse::NoContent().finish())
}

/// The kept file a session's result prints (`r/…`): the branded
/// rendition when the brand applies to print, else the original. 409
/// while the session has no completed result.
async fn printable(state: &AppState, session: &sessions::Model) -> Result<String, ApiError> {
    let no_result =
        || ApiError::Conflict("this session has no finished picture to print yet".into());
    if session.forgotten_at_ms.is_some() {
        return Err(ApiError::Gone("this session's data was erased"));
    }
    let saga = state
        .store
        .latest_saga_of_session(&session.id)
        .await?
        .filter(|s| s.step == Step::Completed.as_str())
        .ok_or_else(no_result)?;
    let content: Value = saga
        .content
        .as_deref()
        .and_then(|c| serde_json::from_str(c).ok())
        .unwrap_or(Value::Null);
    content
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["type"] == "image")
        .find_map(|item| {
            ["print_url", "original_url", "url"]
                .iter()
                .find_map(|f| item[*f].as_str())
                .and_then(|url| url.strip_prefix("/media/"))
                .filter(|key| key.starts_with("r/"))
                .map(str::to_owned)
        })
        .ok_or_else(no_result)
}

/// `POST /api/sessions/{id}/print`
#[utoipa::path(
    post,
    path = "/api/sessions/{id}/print",
    tag = "participants",
    summary = "The guest asks for a print of their result (Idempotency-Key); prints_per_guest bounds it.",
    security(("participant" = [])),
    params(("id" = String, Path)),
    responses(
        (status = 202, description = "Queued (or the replay of an earlier answer to the same Idempotency-Key).", body = super::schema::PrintView),
        (status = 400, description = "`idempotency_key_required`: the Idempotency-Key is missing or malformed.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`.", body = super::schema::ErrorBody),
        (status = 409, description = "`print_limit`: the session asked for its `prints_per_guest` prints already (or guests cannot print); `conflict`: no finished picture yet; `request_in_progress`.", body = super::schema::ErrorBody),
        (status = 410, description = "`gone`: the session's data was erased.", body = super::schema::ErrorBody),
        (status = 422, description = "`idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
    )
)]
pub async fn guest_print(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let session = require_session(&state, &req, &id, false).await?;
    let key = key_of(&req)?.ok_or(ApiError::IdempotencyKeyRequired)?;
    let body = read_body(payload).await?;
    let token = bearer(&req).unwrap_or_default().to_owned();
    let scope = format!("print:{}", session.id);
    let (reply, replayed) = run_idempotent(&state, &scope, &token, Some(key), &body, || async {
        let experience = state
            .store
            .experience_by_id(&session.experience_id)
            .await?
            .ok_or(ApiError::NotFound("experience"))?;
        if experience.prints_per_guest == 0 {
            return Err(ApiError::PrintLimit(0));
        }
        let ask = PrintAsk {
            session_id: session.id.clone(),
            experience_id: experience.id.clone(),
            source_key: printable(&state, &session).await?,
            requested_by: "guest".into(),
            guest_bound: Some(experience.prints_per_guest),
            awaiting_review: experience.print_review,
        };
        let print = state
            .store
            .request_print(ask, state.clock.now_ms())
            .await?
            .ok_or(ApiError::PrintLimit(experience.prints_per_guest))?;
        tracing::info!(session_id = %session.id, print_id = %print.id, review = print.awaiting_review, "guest asked for a print");
        Ok(queued(&state, &print, Locale::of(&experience.locale)))
    })
    .await?;
    Ok(respond(reply, replayed, None))
}

fn queued(state: &AppState, print: &prints::Model, locale: Locale) -> Reply {
    state.wakeups.prints.ring();
    state.wakeups.stats.ring();
    Reply {
        status: StatusCode::ACCEPTED,
        body: print_json(print, locale),
    }
}

/// `POST /api/admin/sessions/{id}/print`
#[utoipa::path(
    post,
    path = "/api/admin/sessions/{id}/print",
    tag = "admin",
    summary = "An operator prints (or reprints) a session's result; no bound, no review.",
    security(("operator" = [])),
    params(("id" = String, Path)),
    responses(
        (status = 202, description = "Queued.", body = super::schema::PrintView),
        (status = 400, description = "`idempotency_key_required`: the Idempotency-Key is malformed.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: a viewer cannot print.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: no finished picture yet; `request_in_progress`.", body = super::schema::ErrorBody),
        (status = 410, description = "`gone`: the session's data was erased.", body = super::schema::ErrorBody),
        (status = 422, description = "`idempotency_key_reused`: the key came with another body.", body = super::schema::ErrorBody),
    )
)]
pub async fn operator_print(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let key = key_of(&req)?;
    let body = read_body(payload).await?;
    let scope = format!("operator {}", req.path());
    let (reply, replayed) =
        run_idempotent(&state, &scope, caller_token(&req), key, &body, || async {
            let session = state
                .store
                .session(&id)
                .await?
                .ok_or(ApiError::NotFound("session"))?;
            let ask = PrintAsk {
                session_id: session.id.clone(),
                experience_id: session.experience_id.clone(),
                source_key: printable(&state, &session).await?,
                requested_by: format!("operator:{}", operator.name),
                guest_bound: None,
                awaiting_review: false,
            };
            let print = state
                .store
                .request_print(ask, state.clock.now_ms())
                .await?
                .ok_or_else(|| ApiError::Internal("an unbounded print was refused".into()))?;
            let audit = AuditEntry::new(
                &operator,
                AuditAction::PrintRequest,
                format!("session:{}", session.id),
            )
            .detail(format!("print {}", print.id));
            state
                .store
                .record_audit(&audit, state.clock.now_ms())
                .await?;
            Ok(queued(&state, &print, Locale::En))
        })
        .await?;
    Ok(respond(reply, replayed, None))
}

/// `POST /api/admin/prints/{id}/cancel` and `/approve`.
async fn decide(
    state: &AppState,
    req: &HttpRequest,
    id: &str,
    action: AuditAction,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(req)?;
    let now = state.clock.now_ms();
    let print = match action {
        AuditAction::PrintCancel => state.store.cancel_print(id, now).await?,
        _ => state.store.approve_print(id, now).await?,
    };
    let audit = AuditEntry::new(&operator, action, format!("print:{id}"));
    state.store.record_audit(&audit, now).await?;
    state.wakeups.prints.ring();
    state.wakeups.stats.ring();
    Ok(HttpResponse::Ok().json(print_json(&print, Locale::En)))
}

/// `POST /api/admin/prints/{id}/cancel`
#[utoipa::path(
    post,
    path = "/api/admin/prints/{id}/cancel",
    tag = "admin",
    summary = "Cancel a print no printer has yet.",
    security(("operator" = [])),
    params(("id" = String, Path)),
    responses(
        (status = 200, description = "Canceled.", body = super::schema::PrintView),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: a viewer cannot decide prints.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: it is at a printer already, or finished.", body = super::schema::ErrorBody),
    )
)]
pub async fn cancel_print(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    decide(&state, &req, &id, AuditAction::PrintCancel).await
}

/// `POST /api/admin/prints/{id}/approve`
#[utoipa::path(
    post,
    path = "/api/admin/prints/{id}/approve",
    tag = "admin",
    summary = "Approve a guest's print that waits for review.",
    security(("operator" = [])),
    params(("id" = String, Path)),
    responses(
        (status = 200, description = "Approved: it goes to a printer.", body = super::schema::PrintView),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: a viewer cannot decide prints.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`.", body = super::schema::ErrorBody),
        (status = 409, description = "`conflict`: it does not wait for approval.", body = super::schema::ErrorBody),
    )
)]
pub async fn approve_print(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    decide(&state, &req, &id, AuditAction::PrintApprove).await
}
