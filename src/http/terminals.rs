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
    let (response, session, stream) = actix_ws::handle(&req, body)?;
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
