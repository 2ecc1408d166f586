//! HTTP and WebSocket: routes, extractors, the idempotency rules and the one
//! error mapping. Handlers validate, call the store, and wake actors; they
//! never talk to the AI provider.

pub mod admin;
pub mod auth;
pub mod body;
pub mod error;
pub mod idempotency;
pub mod operators;
pub mod pages;
pub mod participants;
pub mod request_log;
pub mod service;
pub mod submissions;
pub mod terminals;

use actix::Addr;
use actix_web::web;

use crate::actors::operator_hub::OperatorHub;
use crate::actors::persistence::PersistenceActor;
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
    /// Ping period of display and operator sockets.
    pub display_heartbeat: std::time::Duration,
    /// Applies operators' cancels like every other fenced saga write.
    pub persistence: Addr<PersistenceActor>,
    /// Makes the operators' `stats` frames.
    pub operators: Addr<OperatorHub>,
    /// Base URL of the participant pages, encoded in QR codes.
    pub public_url: String,
}

impl AppState {
    /// The experience `slug`, or 404 `not_found`.
    pub async fn experience(
        &self,
        slug: &str,
    ) -> Result<crate::store::entities::experiences::Model, ApiError> {
        self.store
            .experience_by_slug(slug)
            .await?
            .ok_or(ApiError::NotFound("experience"))
    }

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
    .route(
        "/api/experiences/{slug}",
        web::get().to(operators::get_experience),
    )
    .route(
        "/api/experiences/{slug}/qr.svg",
        web::get().to(operators::qr_svg),
    )
    .route("/api/terminals", web::post().to(operators::create_terminal))
    .route("/api/terminals", web::get().to(admin::list_terminals))
    .route("/api/admin/sagas", web::get().to(admin::list_sagas))
    .route("/api/admin/sagas/{id}", web::get().to(admin::get_saga))
    .route(
        "/api/admin/sagas/{id}/retry",
        web::post().to(admin::retry_saga),
    )
    .route(
        "/api/admin/sagas/{id}/cancel",
        web::post().to(admin::cancel_saga),
    )
    .route("/ws/operators", web::get().to(admin::operator_socket))
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
    .route("/p/{slug}", web::get().to(pages::participant))
    .route("/terminal/{id}", web::get().to(pages::terminal))
    .route("/ops", web::get().to(pages::ops))
    .route("/static/{name}", web::get().to(pages::static_file))
    .route("/i18n/{name}", web::get().to(pages::i18n))
    .default_service(web::to(service::not_found));
}
