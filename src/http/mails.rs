//! Mail to guests.
//!
//! - `POST /api/sessions/{id}/email` (the guest's token, an
//!   Idempotency-Key): 202 with the mail, queued for the mail sender
//!   (`crate::actors::mail_sender`). The address is checked (422
//!   `invalid_email`, a line break included), the consent must be given
//!   (422 `consent_required`), and the session's `mails_per_guest` (409
//!   `mail_limit`), the address's mails of the last hour (429
//!   `address_limit`) and the client's rate (429 `rate_limited`) bound it.
//!   The address is never logged; the answer does not repeat it.
//! - `GET /api/admin/mails` (viewers) lists the newest mails, the
//!   addresses masked; `POST /api/admin/mails/retry` (moderators) queues
//!   failed ones again.
//! - `GET /api/admin/mail/templates` and `PUT`/`DELETE
//!   /api/admin/mail/templates/{locale}` (admins write): the subject and
//!   body of the mail in each language.
//!
//! What an experience offers (the consent texts, their version) is in its
//! public view ([`mail_offer`]).

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::{bearer, require_session, signed_in};
use super::body::{parse_json, read_body};
use super::error::ApiError;
use super::idempotency::{key_of, respond, run_idempotent, Reply};
use super::AppState;
use crate::domain::audit::{AuditAction, AuditEntry};
use crate::domain::locale::{stored_texts, Locale};
use crate::domain::mail::{address_key, check_address, notice_version, MailStatus, Template};
use crate::domain::session::SessionStatus;
use crate::store::entities::experiences;
use crate::store::mails::{mail_json, MailAsk, MailRefused};

/// The most mails the log lists.
const LOG_LIMIT: u64 = 200;

/// The texts a guest is shown with the field, as the API shows them:
/// the consent (the organiser's, or the built-in one), the marketing
/// opt-in's (null: none is offered), and their version.
struct ConsentTexts {
    consent: Value,
    marketing: Value,
    version: String,
}

impl ConsentTexts {
    fn of(e: &experiences::Model) -> ConsentTexts {
        let consent = match stored_texts(e.mail_consent.as_deref()) {
            Value::Null => Value::Object(
                Locale::ALL
                    .iter()
                    .map(|l| (l.as_str().to_owned(), json!(l.text("mail.consent"))))
                    .collect(),
            ),
            texts => texts,
        };
        let marketing = stored_texts(e.mail_marketing.as_deref());
        let marketing_text = if marketing.is_null() {
            String::new()
        } else {
            marketing.to_string()
        };
        ConsentTexts {
            version: notice_version(&consent.to_string(), &marketing_text),
            consent,
            marketing,
        }
    }
}

/// What the pages offer of mail for `e`: null when this server has no
/// SMTP server or guests of `e` cannot ask; else the consent texts, the
/// marketing opt-in's (null: none), their version and the bound.
pub fn mail_offer(state: &AppState, e: &experiences::Model) -> Value {
    if state.mail.is_none() || e.mails_per_guest == 0 {
        return Value::Null;
    }
    let texts = ConsentTexts::of(e);
    json!({
        "consent": texts.consent,
        "marketing": texts.marketing,
        "notice_version": texts.version,
        "per_guest": e.mails_per_guest,
        "attach": e.mail_attach,
    })
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct EmailBody {
    /// The guest's address (RFC 5321 limits; no line breaks).
    #[schema(example = "guest@example.com", max_length = 254)]
    #[serde(default)]
    email: Option<String>,
    /// The guest agreed to the consent text shown with the field.
    #[serde(default)]
    consent: Option<bool>,
    /// The separate, unticked marketing opt-in (default false).
    #[serde(default)]
    marketing: Option<bool>,
    /// The `notice_version` of the texts the page showed: 409 when they
    /// changed since.
    #[serde(default)]
    notice_version: Option<String>,
    /// The language of the mail (`en`, `ko`); default the experience's.
    #[serde(default)]
    locale: Option<String>,
}

/// `POST /api/sessions/{id}/email`
#[utoipa::path(
    post,
    path = "/api/sessions/{id}/email",
    tag = "participants",
    summary = "The guest asks for their result by mail (Idempotency-Key): an address and their consent.",
    security(("participant" = [])),
    params(("id" = String, Path)),
    request_body = EmailBody,
    responses(
        (status = 202, description = "Queued: `{\"email_id\", \"status\": \"QUEUED\"}` (or the replay of an earlier answer to the same Idempotency-Key).", body = Object),
        (status = 400, description = "`invalid_json`; `idempotency_key_required`.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 404, description = "`not_found`.", body = super::schema::ErrorBody),
        (status = 409, description = "`mail_limit`: the session asked for its `mails_per_guest` mails (or guests cannot ask for mail); `conflict`: no finished result yet, or the consent text changed since the page showed it; `request_in_progress`.", body = super::schema::ErrorBody),
        (status = 410, description = "`gone`: the session's data was erased.", body = super::schema::ErrorBody),
        (status = 422, description = "`invalid_email` (`field`: `email`): not an address, too long, or with a line break; `consent_required` (`field`: `consent`): consent is not true; `idempotency_key_reused`.", body = super::schema::ErrorBody),
        (status = 429, description = "`rate_limited`: this client asked too often (`Retry-After`); `address_limit`: the address got its mails of the last hour.", body = super::schema::ErrorBody),
        (status = 503, description = "`mail_unavailable`: this server has no SMTP server set up.", body = super::schema::ErrorBody),
    )
)]
pub async fn guest_email(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let session = require_session(&state, &req, &id, false).await?;
    let desk = state.mail.clone().ok_or(ApiError::MailUnavailable)?;
    state
        .limits
        .check_mail(&req)
        .map_err(|retry_after| ApiError::RateLimited { retry_after })?;
    let key = key_of(&req)?.ok_or(ApiError::IdempotencyKeyRequired)?;
    let body = read_body(payload).await?;
    let token = bearer(&req).unwrap_or_default().to_owned();
    let scope = format!("email:{}", session.id);
    let (reply, replayed) = run_idempotent(&state, &scope, &token, Some(key), &body, || async {
        let asked: EmailBody = parse_json(&body)?;
        let address = asked
            .email
            .as_deref()
            .ok_or_else(|| ApiError::InvalidEmail("email is required".into()))
            .and_then(|text| check_address(text).map_err(|e| ApiError::InvalidEmail(e.to_string())))?;
        if !crate::mail::Mailer::takes(&address) {
            return Err(ApiError::InvalidEmail(
                "email is not an address this server can send to".into(),
            ));
        }
        if asked.consent != Some(true) {
            return Err(ApiError::ConsentRequired);
        }
        let experience = state
            .store
            .experience_by_id(&session.experience_id)
            .await?
            .ok_or(ApiError::NotFound("experience"))?;
        if experience.mails_per_guest == 0 {
            return Err(ApiError::MailLimit(0));
        }
        let version = ConsentTexts::of(&experience).version;
        if asked.notice_version.as_ref().is_some_and(|v| *v != version) {
            return Err(ApiError::Conflict(
                "the consent text changed since the page showed it; read it again".into(),
            ));
        }
        ensure_result(&session)?;
        let locale = match asked.locale.as_deref() {
            Some(text) => text.parse::<Locale>().map_err(ApiError::Validation)?,
            None => Locale::of(&experience.locale),
        };
        let ask = MailAsk {
            session_id: session.id.clone(),
            experience_id: experience.id.clone(),
            address_key: address_key(desk.address_key.as_ref(), &address),
            address,
            locale: locale.as_str().to_owned(),
            consent_notice: version,
            marketing: asked.marketing.unwrap_or(false),
            per_session: experience.mails_per_guest,
            per_address: desk.per_address,
        };
        let mail = match state.store.request_mail(ask, state.clock.now_ms()).await? {
            Ok(mail) => mail,
            Err(MailRefused::SessionBound(n)) => return Err(ApiError::MailLimit(n)),
            Err(MailRefused::AddressBound) => return Err(ApiError::AddressLimit(desk.per_address)),
        };
        tracing::info!(session_id = %session.id, email_id = %mail.id, marketing = mail.marketing, "guest asked for mail");
        state.wakeups.mail.ring();
        state.wakeups.stats.ring();
        Ok(Reply {
            status: StatusCode::ACCEPTED,
            body: json!({"email_id": mail.id, "status": mail.status}),
        })
    })
    .await?;
    Ok(respond(reply, replayed, None))
}

/// 410 for an erased session, 409 while it has no finished result.
fn ensure_result(session: &crate::store::entities::sessions::Model) -> Result<(), ApiError> {
    if session.forgotten_at_ms.is_some() {
        return Err(ApiError::Gone("this session's data was erased"));
    }
    if session.status != SessionStatus::Completed.as_str() {
        return Err(ApiError::Conflict(
            "this session has no finished result to mail yet".into(),
        ));
    }
    Ok(())
}

#[derive(Deserialize)]
pub struct MailQuery {
    status: Option<String>,
}

/// `GET /api/admin/mails`
#[utoipa::path(
    get,
    path = "/api/admin/mails",
    tag = "admin",
    summary = "The newest mails to guests (200 at most), the addresses masked: status (QUEUED, SENDING, SENT, FAILED, CANCELED), attempts, the server's last answer.",
    security(("operator" = [])),
    params(("status" = Option<String>, Query, description = "Only mails of this status: QUEUED, SENT, FAILED or CANCELED.")),
    responses(
        (status = 200, description = "`{\"mails\": [...], \"available\"}`.", body = Object),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: an unknown status.", body = super::schema::ErrorBody),
    )
)]
pub async fn list_mails(
    state: web::Data<AppState>,
    query: web::Query<MailQuery>,
) -> Result<HttpResponse, ApiError> {
    let status = match query.status.as_deref() {
        None | Some("") => None,
        Some(text) => Some(
            [
                MailStatus::Queued,
                MailStatus::Sent,
                MailStatus::Failed,
                MailStatus::Canceled,
            ]
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| {
                ApiError::Validation(format!(
                    "status {text:?} is not one of QUEUED, SENT, FAILED, CANCELED"
                ))
            })?,
        ),
    };
    let now = state.clock.now_ms();
    let mails: Vec<Value> = state
        .store
        .mails_page(status, LOG_LIMIT)
        .await?
        .iter()
        .map(|(m, slug)| mail_json(m, slug, now))
        .collect();
    Ok(HttpResponse::Ok().json(json!({"mails": mails, "available": state.mail.is_some()})))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RetryBody {
    /// The failed mails to send again (at most 200).
    email_ids: Vec<String>,
}

/// `POST /api/admin/mails/retry`
#[utoipa::path(
    post,
    path = "/api/admin/mails/retry",
    tag = "admin",
    summary = "Send failed mails again (\"retry selected\"): those that failed and still have their address are queued, due now.",
    security(("operator" = [])),
    request_body = RetryBody,
    responses(
        (status = 202, description = "`{\"retried\": [ids]}`: the mails queued again.", body = Object),
        (status = 400, description = "`invalid_json`: the body is not `{\"email_ids\": [...]}`.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: a viewer cannot retry.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: no id, or more than 200.", body = super::schema::ErrorBody),
    )
)]
pub async fn retry_mails(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let body: RetryBody = parse_json(&read_body(payload).await?)?;
    if body.email_ids.is_empty() || body.email_ids.len() > LOG_LIMIT as usize {
        return Err(ApiError::Validation(format!(
            "email_ids must name 1 to {LOG_LIMIT} mails"
        )));
    }
    let now = state.clock.now_ms();
    let retried = state.store.retry_mails(&body.email_ids, now).await?;
    if !retried.is_empty() {
        let audit = AuditEntry::new(&operator, AuditAction::MailRetry, "mails".to_owned())
            .detail(retried.join(", "));
        state.store.record_audit(&audit, now).await?;
        state.wakeups.mail.ring();
        state.wakeups.stats.ring();
    }
    Ok(HttpResponse::Accepted().json(json!({ "retried": retried })))
}

/// The template of `locale` in use: the operators' or the built-in one.
async fn template_json(state: &AppState, locale: Locale) -> Result<Value, ApiError> {
    let saved = state.store.mail_template(locale.as_str()).await?;
    let built_in = Template::built_in(locale);
    Ok(match saved {
        Some(t) => {
            json!({"locale": locale.as_str(), "subject": t.subject, "body": t.body, "custom": true, "updated_at": crate::clock::rfc3339(t.updated_at_ms)})
        }
        None => {
            json!({"locale": locale.as_str(), "subject": built_in.subject, "body": built_in.body, "custom": false, "updated_at": null})
        }
    })
}

/// `GET /api/admin/mail/templates`
#[utoipa::path(
    get,
    path = "/api/admin/mail/templates",
    tag = "admin",
    summary = "The mail's subject and body in each language (the operators' or the built-in ones), and the placeholders they may hold.",
    security(("operator" = [])),
    responses(
        (status = 200, description = "`{\"templates\": [{\"locale\", \"subject\", \"body\", \"custom\"}], \"placeholders\"}`.", body = Object),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
    )
)]
pub async fn list_templates(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let mut templates = Vec::new();
    for locale in Locale::ALL {
        templates.push(template_json(&state, locale).await?);
    }
    Ok(HttpResponse::Ok().json(json!({
        "templates": templates,
        "placeholders": crate::domain::mail::PLACEHOLDERS,
    })))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TemplateBody {
    /// One line, 1 to 200 characters; may hold `{event}`.
    #[schema(example = "Your picture from {event}")]
    subject: String,
    /// Plain text, 1 to 5,000 characters; must hold `{link}`, may hold
    /// `{event}`. The HTML part is made from it, with the picture above.
    #[schema(example = "Here is your picture from {event}: {link}")]
    body: String,
}

fn locale_of_path(text: &str) -> Result<Locale, ApiError> {
    text.parse::<Locale>().map_err(ApiError::Validation)
}

/// `PUT /api/admin/mail/templates/{locale}`
#[utoipa::path(
    put,
    path = "/api/admin/mail/templates/{locale}",
    tag = "admin",
    summary = "Set the mail's subject and body in one language.",
    security(("operator" = [])),
    params(("locale" = String, Path, description = "`en` or `ko`.")),
    request_body = TemplateBody,
    responses(
        (status = 200, description = "The template now in use.", body = Object),
        (status = 400, description = "`invalid_json`: the body is not `{\"subject\", \"body\"}`.", body = super::schema::ErrorBody),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin edits templates.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: an unknown locale, a subject with a line break or past 200 characters, a body without `{link}`, an unknown placeholder.", body = super::schema::ErrorBody),
    )
)]
pub async fn put_template(
    state: web::Data<AppState>,
    req: HttpRequest,
    locale: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let locale = locale_of_path(&locale)?;
    let body: TemplateBody = parse_json(&read_body(payload).await?)?;
    let template = Template::checked(&body.subject, &body.body).map_err(ApiError::Validation)?;
    let now = state.clock.now_ms();
    state
        .store
        .put_mail_template(locale.as_str(), &template.subject, &template.body, now)
        .await?;
    let audit = AuditEntry::new(
        &operator,
        AuditAction::MailTemplateEdit,
        format!("mail_template:{}", locale.as_str()),
    )
    .detail(template.subject.clone());
    state.store.record_audit(&audit, now).await?;
    Ok(HttpResponse::Ok().json(template_json(&state, locale).await?))
}

/// `DELETE /api/admin/mail/templates/{locale}`
#[utoipa::path(
    delete,
    path = "/api/admin/mail/templates/{locale}",
    tag = "admin",
    summary = "Go back to the built-in template of one language.",
    security(("operator" = [])),
    params(("locale" = String, Path, description = "`en` or `ko`.")),
    responses(
        (status = 200, description = "The template now in use (the built-in one).", body = Object),
        (status = 401, description = "`unauthorized`.", body = super::schema::ErrorBody),
        (status = 403, description = "`forbidden`: only an admin edits templates.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: an unknown locale.", body = super::schema::ErrorBody),
    )
)]
pub async fn reset_template(
    state: web::Data<AppState>,
    req: HttpRequest,
    locale: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let operator = signed_in(&req)?;
    let locale = locale_of_path(&locale)?;
    let now = state.clock.now_ms();
    state.store.delete_mail_template(locale.as_str()).await?;
    let audit = AuditEntry::new(
        &operator,
        AuditAction::MailTemplateEdit,
        format!("mail_template:{}", locale.as_str()),
    )
    .detail("built-in");
    state.store.record_audit(&audit, now).await?;
    Ok(HttpResponse::Ok().json(template_json(&state, locale).await?))
}
