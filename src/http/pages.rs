//! The pages in `static/`, embedded in the binary so the server serves them
//! from any working directory and nothing is fetched from elsewhere at run
//! time: `/` (experiences), `/p/{slug}` (the participant's phone page),
//! `/terminal/{id}` (a booth's big screen), `/ops` (the operators'
//! dashboard), their scripts and style under `/static/`, and the texts of
//! each language under `/i18n/`.
//!
//! Every answer here carries the pages' security headers ([`secured`]): a
//! Content-Security-Policy that runs scripts and styles from this server
//! only (no inline script, style element or attribute, no `eval`), lets
//! results' pictures, video and sound come from any http(s) origin (the
//! provider's) or a `data:` URL (an adapter's inline picture), lets the
//! pages talk to this server only (their requests and WebSockets), and
//! forbids framing them (`frame-ancestors 'none'`, and `X-Frame-Options`
//! for older browsers); `X-Content-Type-Options: nosniff`; and
//! `Referrer-Policy: no-referrer` (a result's picture is fetched without
//! telling its host which page asked).

use actix_web::{web, HttpResponse, HttpResponseBuilder};

use super::error::ApiError;

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JSON: &str = "application/json";

/// The pages' Content-Security-Policy (module doc). `connect-src 'self'`
/// covers the pages' WebSockets to this server too (`ws:`/`wss:` of the
/// same host, CSP Level 3).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' https: http: data:; \
     media-src 'self' https: http: data:; connect-src 'self'; font-src 'self'; \
     object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Adds the security headers of every page and asset (module doc).
fn secured(mut answer: HttpResponseBuilder) -> HttpResponseBuilder {
    answer
        .insert_header(("Content-Security-Policy", CONTENT_SECURITY_POLICY))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .insert_header(("X-Frame-Options", "DENY"))
        .insert_header(("Referrer-Policy", "no-referrer"));
    answer
}

/// Every embedded asset: its name under `/static/` or `/i18n/`, type, text.
const ASSETS: [(&str, &str, &str); 27] = [
    ("app.css", CSS, include_str!("../../static/app.css")),
    ("app.js", JS, include_str!("../../static/app.js")),
    ("index.js", JS, include_str!("../../static/index.js")),
    (
        "participant.js",
        JS,
        include_str!("../../static/participant.js"),
    ),
    ("terminal.js", JS, include_str!("../../static/terminal.js")),
    ("ops-main.js", JS, include_str!("../../static/ops-main.js")),
    (
        "ops-state.js",
        JS,
        include_str!("../../static/ops-state.js"),
    ),
    ("ops-api.js", JS, include_str!("../../static/ops-api.js")),
    (
        "ops-roles.js",
        JS,
        include_str!("../../static/ops-roles.js"),
    ),
    (
        "ops-socket.js",
        JS,
        include_str!("../../static/ops-socket.js"),
    ),
    (
        "ops-figures.js",
        JS,
        include_str!("../../static/ops-figures.js"),
    ),
    (
        "ops-review.js",
        JS,
        include_str!("../../static/ops-review.js"),
    ),
    (
        "ops-providers.js",
        JS,
        include_str!("../../static/ops-providers.js"),
    ),
    (
        "ops-print.js",
        JS,
        include_str!("../../static/ops-print.js"),
    ),
    (
        "ops-webhooks.js",
        JS,
        include_str!("../../static/ops-webhooks.js"),
    ),
    ("ops-mail.js", JS, include_str!("../../static/ops-mail.js")),
    (
        "ops-terminals.js",
        JS,
        include_str!("../../static/ops-terminals.js"),
    ),
    (
        "ops-sagas.js",
        JS,
        include_str!("../../static/ops-sagas.js"),
    ),
    (
        "ops-guests.js",
        JS,
        include_str!("../../static/ops-guests.js"),
    ),
    (
        "ops-experiences.js",
        JS,
        include_str!("../../static/ops-experiences.js"),
    ),
    (
        "ops-settings.js",
        JS,
        include_str!("../../static/ops-settings.js"),
    ),
    (
        "ops-operators.js",
        JS,
        include_str!("../../static/ops-operators.js"),
    ),
    (
        "ops-audit.js",
        JS,
        include_str!("../../static/ops-audit.js"),
    ),
    ("result.js", JS, include_str!("../../static/result.js")),
    ("gallery.js", JS, include_str!("../../static/gallery.js")),
    ("en.json", JSON, include_str!("../../static/i18n/en.json")),
    ("ko.json", JSON, include_str!("../../static/i18n/ko.json")),
];

fn page(text: &'static str) -> HttpResponse {
    secured(HttpResponse::Ok())
        .content_type(HTML)
        .insert_header(("Cache-Control", "no-cache"))
        .body(text)
}

#[utoipa::path(
    get,
    path = "/",
    tag = "pages",
    summary = "The experiences (start page).",
    responses((status = 200, description = "The page.", content_type = "text/html", body = String))
)]
pub async fn index() -> HttpResponse {
    page(include_str!("../../static/index.html"))
}

/// `/p/{slug}`: the page checks the experience itself and says when it is
/// unknown.
#[utoipa::path(
    get,
    path = "/p/{slug}",
    tag = "pages",
    summary = "The participant's phone page (a QR code opens it).",
    params(("slug" = String, Path, description = "The experience's slug; the page says when it is unknown.")),
    responses((status = 200, description = "The page.", content_type = "text/html", body = String))
)]
pub async fn participant() -> HttpResponse {
    page(include_str!("../../static/participant.html"))
}

/// `/terminal/{id}`: the token comes in the URL fragment, never to us.
#[utoipa::path(
    get,
    path = "/terminal/{id}",
    tag = "pages",
    summary = "A booth display (its token comes in the URL fragment).",
    params(("id" = String, Path, description = "The terminal's id.")),
    responses((status = 200, description = "The page.", content_type = "text/html", body = String))
)]
pub async fn terminal() -> HttpResponse {
    page(include_str!("../../static/terminal.html"))
}

#[utoipa::path(
    get,
    path = "/ops",
    tag = "pages",
    summary = "The operators' dashboard.",
    responses((status = 200, description = "The page.", content_type = "text/html", body = String))
)]
pub async fn ops() -> HttpResponse {
    page(include_str!("../../static/ops.html"))
}

/// `/g/{slug}`: the page reads the gallery's API and says when it is off
/// or needs the PIN.
#[utoipa::path(
    get,
    path = "/g/{slug}",
    tag = "pages",
    operation_id = "gallery_page",
    summary = "An experience's gallery: its results, newest first (public or behind a PIN).",
    params(("slug" = String, Path, description = "The experience's slug; the page says when it has no gallery.")),
    responses((status = 200, description = "The page.", content_type = "text/html", body = String))
)]
pub async fn gallery() -> HttpResponse {
    page(include_str!("../../static/gallery.html"))
}

/// The result link's page (`/r/{share_id}`, answered by
/// `http::guests::result_page`).
pub(super) fn result_page() -> HttpResponse {
    page(include_str!("../../static/result.html"))
}

/// The plain page of a result link whose result is gone (410): erased by
/// the guest or an operator, or past the organiser's retention.
pub(super) fn gone_page(erased: bool) -> HttpResponse {
    let why = if erased {
        "This result was deleted at its owner's request. / 요청에 따라 삭제된 결과입니다."
    } else {
        "This result is no longer kept: the organiser's retention period has ended. / 보관 기간이 끝나 삭제된 결과입니다."
    };
    secured(HttpResponse::Gone())
        .content_type(HTML)
        .insert_header(("Cache-Control", "no-store"))
        .body(format!(
            "<!doctype html><html><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <title>Gone</title><link rel=\"stylesheet\" href=\"/static/app.css\"></head>\
             <body><main class=\"gone\"><h1>410</h1><p>{why}</p></main></body></html>"
        ))
}

fn asset(name: &str, dir_is_i18n: bool) -> Result<HttpResponse, ApiError> {
    let is_i18n = |n: &str| n.ends_with(".json");
    ASSETS
        .iter()
        .find(|(n, _, _)| *n == name && is_i18n(n) == dir_is_i18n)
        .map(|(_, kind, text)| {
            secured(HttpResponse::Ok())
                .content_type(*kind)
                .insert_header(("Cache-Control", "no-cache"))
                .body(*text)
        })
        .ok_or(ApiError::NotFound("file"))
}

/// `/static/{name}`
#[utoipa::path(
    get,
    path = "/static/{name}",
    tag = "pages",
    summary = "A script or the style sheet of the pages.",
    params(("name" = String, Path, description = "`app.css`, `app.js`, `index.js`, `participant.js`, `terminal.js`, `result.js`, `gallery.js`, or one of the /ops modules (`ops-main.js`, `ops-api.js`, …).")),
    responses(
        (status = 200, description = "The file.", content(("text/css"), ("text/javascript"))),
        (status = 404, description = "`not_found`: no such file.", body = super::schema::ErrorBody),
    )
)]
pub async fn static_file(name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    asset(&name, false)
}

/// `/i18n/{name}`: `en.json`, `ko.json`.
#[utoipa::path(
    get,
    path = "/i18n/{name}",
    tag = "pages",
    summary = "The texts of one language, as a JSON object of key to text.",
    params(("name" = String, Path, description = "`en.json` or `ko.json`.")),
    responses(
        (status = 200, description = "The table.", body = std::collections::BTreeMap<String, String>),
        (status = 404, description = "`not_found`: no such language.", body = super::schema::ErrorBody),
    )
)]
pub async fn i18n(name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    asset(&name, true)
}
