//! The OpenAPI 3.1 document of the HTTP API, served at
//! `GET /api/openapi.json`.
//!
//! Operations come from the `#[utoipa::path]` attributes on the handlers;
//! request bodies from `ToSchema` derives on the handlers' body types. The
//! answers the handlers build with `json!` are described by the schema-only
//! types of [`super::schema`] (never built, only documented). This module
//! only gathers them into the document: [`CommonAnswers`] adds what
//! every operation can answer (500, 503 with `Retry-After`, and 413/415 where
//! there is a body), and the description ([`DESCRIPTION`], `openapi.md`)
//! holds the rules that belong to no single operation: the error codes, the
//! Idempotency-Key semantics, the limits and the WebSockets.
//!
//! `scripts/fuzz` runs schemathesis against this document: a response whose
//! status is not listed here, or whose body does not match its schema, fails
//! CI. `tests/openapi.rs` checks that every route of [`super::routes`] is
//! here.

use std::sync::LazyLock;

use actix_web::HttpResponse;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, Ref, RefOr, ResponseBuilder, Schema};
use utoipa::{Modify, OpenApi, ToSchema};

use super::schema::{ErrorBody, ErrorCode, PublicExperience};
use super::{
    admin, brand, export, guests, mails, media, metrics, operators, pages, participants, prints,
    review, service, settings, staff, submissions, terminals, webhooks,
};

/// The API's description: errors, Idempotency-Key, limits, WebSockets.
pub const DESCRIPTION: &str = include_str!("openapi.md");

#[derive(OpenApi)]
#[openapi(
    info(title = "stagehand", description = DESCRIPTION),
    paths(
        service::healthz,
        service::readyz,
        metrics::metrics,
        openapi_json,
        operators::create_experience,
        operators::list_experiences,
        operators::get_experience,
        settings::update_experience,
        brand::put_brand_image,
        brand::delete_brand_image,
        brand::preview_brand,
        operators::qr_svg,
        operators::create_terminal,
        admin::list_terminals,
        admin::list_sagas,
        admin::get_saga,
        admin::retry_saga,
        admin::cancel_saga,
        review::list_review,
        review::approve_saga,
        review::reject_saga,
        review::bulk_sagas,
        admin::get_breaker,
        admin::list_providers,
        admin::open_breaker,
        admin::close_breaker,
        staff::me,
        staff::list_operators,
        staff::create_operator,
        staff::revoke_operator,
        staff::audit,
        prints::add_printer,
        prints::list_printers,
        prints::remove_printer,
        prints::guest_print,
        prints::operator_print,
        prints::cancel_print,
        prints::approve_print,
        webhooks::add_webhook,
        webhooks::list_webhooks,
        webhooks::remove_webhook,
        webhooks::enable_webhook,
        webhooks::webhook_deliveries,
        webhooks::redeliver,
        mails::guest_email,
        mails::list_mails,
        mails::retry_mails,
        mails::list_templates,
        mails::put_template,
        mails::reset_template,
        participants::create_session,
        participants::ranking,
        participants::get_session,
        guests::erase_own,
        guests::share_json,
        guests::result_page,
        guests::download,
        guests::share_qr,
        guests::gallery,
        guests::search_sessions,
        guests::erase_by_operator,
        guests::hide,
        guests::unhide,
        guests::held,
        export::export,
        submissions::submit,
        media::upload_photo,
        media::serve_result,
        media::serve_photo,
        admin::operator_socket,
        terminals::terminal_socket,
        pages::index,
        pages::participant,
        pages::terminal,
        pages::ops,
        pages::gallery,
        pages::static_file,
        pages::i18n,
    ),
    components(schemas(ErrorBody, ErrorCode)),
    modifiers(&SecuritySchemes, &CommonAnswers, &ClosedSchemas),
    tags(
        (name = "participants", description = "Anonymous participants: sessions, the submission, the ranking."),
        (name = "operators", description = "Experiences and terminals (operator token)."),
        (name = "admin", description = "The operators' console: sagas and booth presence (operator token)."),
        (name = "service", description = "Liveness, readiness, the Prometheus metrics and this document."),
        (name = "websockets", description = "The sockets' handshakes; their frames are in the description."),
        (name = "pages", description = "The embedded web pages and their assets."),
    )
)]
pub struct ApiDoc;

/// The document as served, built once.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    ApiDoc::openapi()
        .to_json()
        .expect("the OpenAPI document serializes")
});

/// The OpenAPI document.
pub fn document() -> &'static str {
    &DOCUMENT
}

/// `GET /api/openapi.json`
#[utoipa::path(
    get,
    path = "/api/openapi.json",
    tag = "service",
    responses(
        (status = 200, description = "This document (OpenAPI 3.1).", body = Object, content_type = "application/json"),
    )
)]
pub async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .insert_header(("Cache-Control", "no-cache"))
        .body(document())
}

// ---- security ---------------------------------------------------------------

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer = |description: &str| {
            let mut http = Http::new(HttpAuthScheme::Bearer);
            http.description = Some(description.to_owned());
            SecurityScheme::Http(http)
        };
        components.add_security_scheme(
            "operator",
            bearer("An operator token: the bootstrap admin's (`STAGEHAND_OPERATOR_TOKEN`), or one made by `POST /api/admin/operators` with a role (`admin`, `moderator`, `viewer`). A role that may not take the action is 403 `forbidden`."),
        );
        components.add_security_scheme(
            "participant",
            bearer(
                "A session's `participant_token`, as returned once by session creation; it opens that session only.",
            ),
        );
    }
}

// ---- answers every operation can give ----------------------------------------

/// Adds to every operation the answers that do not depend on it: 500
/// `internal` and 503 `unavailable` (with `Retry-After`), and 413 and 415
/// where the operation takes a body.
struct CommonAnswers;

fn error_answer(description: &str, retry_after: bool) -> RefOr<utoipa::openapi::Response> {
    let mut answer = ResponseBuilder::new().description(description).content(
        "application/json",
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("Error")))
            .build(),
    );
    if retry_after {
        answer = answer.header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(Some(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(0)),
                ))
                .description(Some("Seconds to wait before trying again."))
                .build(),
        );
    }
    RefOr::T(answer.build())
}

fn add_answer(
    operation: &mut Operation,
    status: &str,
    answer: impl FnOnce() -> RefOr<utoipa::openapi::Response>,
) {
    operation
        .responses
        .responses
        .entry(status.to_owned())
        .or_insert_with(answer);
}

impl Modify for CommonAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ];
            for operation in operations.into_iter().flatten() {
                if operation.request_body.is_some() {
                    add_answer(operation, "413", || {
                        error_answer(
                            "`payload_too_large`: the body is larger than 64 KiB.",
                            false,
                        )
                    });
                    add_answer(operation, "415", || {
                        error_answer(
                            "`unsupported_media_type`: the body is declared as another media type than JSON.",
                            false,
                        )
                    });
                }
                add_answer(operation, "500", || {
                    error_answer("`internal`: a bug; the server log has the detail.", false)
                });
                add_answer(operation, "503", || {
                    error_answer(
                        "`unavailable`: the database is unreachable; `busy`: it is still busy (locked) after a few retries.",
                        true,
                    )
                });
            }
        }
    }
}

/// Schemas that allow no other property, so that `oneOf` tells them apart.
struct ClosedSchemas;

impl Modify for ClosedSchemas {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let Some(components) = openapi.components.as_mut() else {
            return;
        };
        if let Some(RefOr::T(Schema::Object(object))) = components
            .schemas
            .get_mut(PublicExperience::name().as_ref())
        {
            object.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(false)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::locale::Locale;
    use crate::domain::saga::{AbortReason, Step};
    use crate::domain::session::SessionStatus;
    use crate::http::error::ApiError;
    use crate::http::schema::ERROR_CODES;
    use utoipa::PartialSchema;

    fn enum_of<T: PartialSchema>() -> Vec<String> {
        let value = serde_json::to_value(T::schema()).unwrap();
        value["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("no enum in {value}"))
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn enums_match_the_domain() {
        let names = |all: &mut dyn Iterator<Item = &'static str>| -> Vec<String> {
            all.map(str::to_owned).collect()
        };
        assert_eq!(
            enum_of::<Step>(),
            names(&mut Step::ALL.iter().map(|s| s.as_str()))
        );
        assert_eq!(
            enum_of::<AbortReason>(),
            names(&mut AbortReason::ALL.iter().map(|r| r.as_str()))
        );
        assert_eq!(
            enum_of::<SessionStatus>(),
            names(&mut SessionStatus::ALL.iter().map(|s| s.as_str()))
        );
        assert_eq!(
            enum_of::<Locale>(),
            names(&mut Locale::ALL.iter().map(|l| l.as_str()))
        );
    }

    /// One of each variant. A new variant fails to compile here: add it,
    /// and its code to [`ERROR_CODES`] (and to the table in `openapi.md`).
    fn every_api_error() -> Vec<ApiError> {
        let all = vec![
            ApiError::InvalidJson(String::new()),
            ApiError::Validation(String::new()),
            ApiError::PayloadTooLarge(1),
            ApiError::IdempotencyKeyRequired,
            ApiError::IdempotencyKeyTooWeak,
            ApiError::IdempotencyKeyReused,
            ApiError::RequestInProgress,
            ApiError::AlreadySubmitted,
            ApiError::BudgetExhausted,
            ApiError::Closing,
            ApiError::Unauthorized(""),
            ApiError::NotFound(""),
            ApiError::Conflict(String::new()),
            ApiError::Unsupported(String::new()),
            ApiError::Unavailable,
            ApiError::Busy,
            ApiError::Internal(String::new()),
            ApiError::RateLimited { retry_after: 1 },
            ApiError::MethodNotAllowed {
                allow: String::new(),
            },
            ApiError::UnsupportedMediaType(String::new()),
            ApiError::UpgradeRequired(String::new()),
            ApiError::PhotoUnreadable(String::new()),
            ApiError::PhotoPoolFull,
            ApiError::PhotoNotTaken,
            ApiError::PhotoLimit(5),
            ApiError::PrintLimit(1),
            ApiError::InvalidEmail(String::new()),
            ApiError::ConsentRequired,
            ApiError::MailLimit(3),
            ApiError::AddressLimit(5),
            ApiError::MailUnavailable,
            ApiError::UploadTooSlow(String::new()),
            ApiError::MediaUnavailable(String::new()),
            ApiError::Gone(""),
            ApiError::GalleryPinRequired,
            ApiError::GalleryPinWrong,
            ApiError::GalleryPinOutdated,
            ApiError::GalleryLocked { retry_after: 1 },
            ApiError::PinChecksFull,
            ApiError::Forbidden {
                needs: crate::domain::roles::Role::Admin,
                message: String::new(),
            },
        ];
        for e in &all {
            match e {
                ApiError::InvalidJson(_)
                | ApiError::Validation(_)
                | ApiError::PayloadTooLarge(_)
                | ApiError::IdempotencyKeyRequired
                | ApiError::IdempotencyKeyTooWeak
                | ApiError::IdempotencyKeyReused
                | ApiError::RequestInProgress
                | ApiError::AlreadySubmitted
                | ApiError::BudgetExhausted
                | ApiError::Closing
                | ApiError::Unauthorized(_)
                | ApiError::NotFound(_)
                | ApiError::Conflict(_)
                | ApiError::Unsupported(_)
                | ApiError::Unavailable
                | ApiError::Busy
                | ApiError::Internal(_)
                | ApiError::RateLimited { .. }
                | ApiError::MethodNotAllowed { .. }
                | ApiError::UnsupportedMediaType(_)
                | ApiError::UpgradeRequired(_)
                | ApiError::PhotoUnreadable(_)
                | ApiError::PhotoPoolFull
                | ApiError::PhotoNotTaken
                | ApiError::PhotoLimit(_)
                | ApiError::PrintLimit(_)
                | ApiError::InvalidEmail(_)
                | ApiError::ConsentRequired
                | ApiError::MailLimit(_)
                | ApiError::AddressLimit(_)
                | ApiError::MailUnavailable
                | ApiError::UploadTooSlow(_)
                | ApiError::MediaUnavailable(_)
                | ApiError::Gone(_)
                | ApiError::GalleryPinRequired
                | ApiError::GalleryPinWrong
                | ApiError::GalleryPinOutdated
                | ApiError::GalleryLocked { .. }
                | ApiError::PinChecksFull
                | ApiError::Forbidden { .. } => {}
            }
        }
        all
    }

    #[test]
    fn every_error_code_is_documented() {
        let description = DESCRIPTION;
        for e in every_api_error() {
            let code = e.code();
            assert!(ERROR_CODES.contains(&code), "{code} is not in ERROR_CODES");
            assert!(
                description.contains(&format!("`{code}`")),
                "{code} is not in the status table of openapi.md"
            );
        }
        for code in ERROR_CODES {
            assert!(description.contains(&format!("`{code}`")), "{code}");
        }
    }

    #[test]
    fn document_is_openapi_3_1() {
        let doc: serde_json::Value = serde_json::from_str(document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        assert!(doc["components"]["securitySchemes"]["operator"].is_object());
        assert!(doc["components"]["schemas"]["Error"].is_object());
    }
}
