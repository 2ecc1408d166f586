//! The terminal WebSocket: `GET /ws/terminals/{id}?token=&after=`. A wrong
//! token is answered with HTTP 401 before the upgrade. The `hello` frame
//! names the terminal's experience (slug, title, kind, locale).

use actix::{Actor, AsyncContext};
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::auth::same_secret;
use super::error::ApiError;
use super::AppState;
use crate::actors::terminal_socket::{DisplayOf, TerminalSocket};
use crate::domain::keys::token_hash;
use serde_json::json;

#[derive(Deserialize)]
pub struct SocketQuery {
    token: Option<String>,
    after: Option<i64>,
}

#[utoipa::path(
    get,
    path = "/ws/terminals/{id}",
    tag = "websockets",
    summary = "A booth display's socket: `hello`, then the terminal's events in `seq` order (see the description).",
    params(
        ("id" = String, Path, description = "The terminal's id."),
        ("token" = String, Query, description = "The terminal's token, as returned by `POST /api/terminals`."),
        ("after" = Option<i64>, Query, description = "The last `seq` this display showed; the events after it are sent first. Default 0 (all)."),
    ),
    responses(
        (status = 101, description = "Switching Protocols: the socket is open (JSON text frames, see the description)."),
        (status = 401, description = "`unauthorized`: the token is missing or wrong.", body = super::schema::ErrorBody),
        (status = 422, description = "`validation_failed`: the path or query could not be read.", body = super::schema::ErrorBody),
        (status = 426, description = "`upgrade_required`: the request is not a WebSocket handshake.", body = super::schema::ErrorBody, headers(("Upgrade" = String, description = "`websocket`"))),
    )
)]
pub async fn terminal_socket(
    state: web::Data<AppState>,
    id: web::Path<String>,
    query: web::Query<SocketQuery>,
    req: HttpRequest,
    body: web::Payload,
) -> Result<HttpResponse, actix_web::Error> {
    let terminal = state
        .store
        .terminal(&id)
        .await
        .map_err(ApiError::from)?
        .ok_or(ApiError::Unauthorized("unknown terminal or wrong token"))?;
    let token_ok = query
        .token
        .as_deref()
        .is_some_and(|t| same_secret(&token_hash(t), &terminal.token_hash));
    if !token_ok {
        return Err(ApiError::Unauthorized("unknown terminal or wrong token").into());
    }
    let experience = state
        .store
        .experience_by_id(&terminal.experience_id)
        .await
        .map_err(ApiError::from)?
        .ok_or(ApiError::NotFound("experience"))?;
    let (response, session, stream) =
        actix_ws::handle(&req, body).map_err(ApiError::not_a_handshake)?;
    let display = DisplayOf {
        hello: json!({
            "type": "hello",
            "terminal_id": terminal.id,
            "last_seq": terminal.last_seq,
            "experience": {
                "slug": experience.slug,
                "title": experience.title,
                "kind": experience.kind,
                "locale": experience.locale,
            },
        }),
        terminal_id: terminal.id,
        experience_id: experience.id,
        after: query.after.unwrap_or(0).max(0),
    };
    let socket = TerminalSocket::new(display, state.socket_deps(), session);
    TerminalSocket::create(|ctx| {
        ctx.add_stream(stream);
        socket
    });
    Ok(response)
}
