//! The terminal WebSocket: `GET /ws/terminals/{id}?token=&after=`. A wrong
//! token is answered with HTTP 401 before the upgrade.

use actix::{Actor, AsyncContext};
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::auth::same_secret;
use super::error::ApiError;
use super::AppState;
use crate::actors::terminal_socket::TerminalSocket;
use crate::domain::keys::token_hash;

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
    let (response, session, stream) = actix_ws::handle(&req, body)?;
    let socket = TerminalSocket::new(
        terminal.id,
        terminal.last_seq,
        query.after.unwrap_or(0).max(0),
        state.work_store.clone(),
        state.hub.clone(),
        session,
    );
    TerminalSocket::create(|ctx| {
        ctx.add_stream(stream);
        socket
    });
    Ok(response)
}
