//! HTTP and WebSocket: routes, extractors, the idempotency rules and the one
//! error mapping. Handlers validate, call the store, and wake actors; they
//! never talk to the AI provider.

pub mod auth;
pub mod body;
pub mod error;
pub mod idempotency;
pub mod operators;
pub mod pages;
pub mod participants;
pub mod service;
pub mod submissions;
pub mod terminals;

use actix::Addr;
use actix_web::web;

use crate::actors::terminal_hub::TerminalHub;
use crate::actors::terminal_socket::SocketDeps;
use crate::actors::wakeups::Wakeups;
use crate::clock::SharedClock;
use crate::store::Store;
use error::ApiError;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// The requests' pool.
    pub store: Store,
    /// The pool of saga work and display streams (sockets read from it).
    pub work_store: Store,
    pub clock: SharedClock,
    /// Rung after a submission commits.
    pub wakeups: Wakeups,
    /// Group-commits submissions.
    pub submissions: submissions::SubmissionQueue,
    pub hub: Addr<TerminalHub>,
    pub operator_token: String,
    /// `SAGA_DEADLINE` in milliseconds.
    pub saga_deadline_ms: i64,
    /// This process among the instances sharing the database.
    pub instance_id: String,
    /// Ping period of display sockets.
    pub display_heartbeat: std::time::Duration,
}

impl AppState {
    /// What a display socket needs.
    pub fn socket_deps(&self) -> SocketDeps {
        SocketDeps {
            store: self.work_store.clone(),
            hub: self.hub.clone(),
            wakeups: self.wakeups.clone(),
            clock: self.clock.clone(),
            instance_id: self.instance_id.clone(),
            heartbeat: self.display_heartbeat,
        }
    }
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    // Malformed query strings and paths answer in the same JSON shape.
    cfg.app_data(
        web::QueryConfig::default()
            .error_handler(|e, _| ApiError::Validation(e.to_string()).into()),
    )
    .app_data(
        web::PathConfig::default().error_handler(|e, _| ApiError::Validation(e.to_string()).into()),
    )
    .route("/healthz", web::get().to(service::healthz))
    .route("/readyz", web::get().to(service::readyz))
    .route(
        "/api/experiences",
        web::post().to(operators::create_experience),
    )
    .route(
        "/api/experiences",
        web::get().to(operators::list_experiences),
    )
    .route("/api/terminals", web::post().to(operators::create_terminal))
    .route(
        "/api/experiences/{slug}/sessions",
        web::post().to(participants::create_session),
    )
    .route(
        "/api/experiences/{slug}/ranking",
        web::get().to(participants::ranking),
    )
    .route(
        "/api/sessions/{id}/submission",
        web::post().to(submissions::submit),
    )
    .route(
        "/api/sessions/{id}",
        web::get().to(participants::get_session),
    )
    .route(
        "/ws/terminals/{id}",
        web::get().to(terminals::terminal_socket),
    )
    .route("/", web::get().to(pages::index))
    .default_service(web::to(service::not_found));
}
