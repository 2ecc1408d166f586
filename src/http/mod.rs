//! HTTP and WebSocket: routes, extractors, the idempotency rules and the one
//! error mapping. Handlers validate, call the store, and wake actors; they
//! never talk to the AI provider.

pub mod admin;
pub mod auth;
pub mod body;
pub mod brand;
pub mod error;
pub mod export;
pub mod gallery_pin;
pub mod guests;
pub mod idempotency;
pub mod mails;
pub mod media;
pub mod metrics;
pub mod openapi;
pub mod operators;
pub mod pages;
pub mod participants;
pub mod prints;
pub mod rate_limit;
pub mod request_log;
pub mod review;
pub mod schema;
pub mod service;
pub mod settings;
pub mod staff;
pub mod submissions;
pub mod terminals;
pub mod webhooks;

use actix::Addr;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::middleware::{from_fn, Next};
use actix_web::{guard, web, HttpResponse, Resource, Route};

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
    /// Session creation and submission rate limits.
    pub limits: std::sync::Arc<rate_limit::RateLimits>,
    /// Set when the instance shuts down: not ready, sockets close.
    pub shutdown: crate::actors::shutdown::ShutdownSignal,
    /// Opens `GET /metrics` besides the operator token.
    pub metrics_token: Option<String>,
    /// The database gauges of the last scrape (a second at most).
    pub scrape_cache: std::sync::Arc<crate::metrics::ScrapeCache>,
    /// The SQLite file's exclusive lock (SQLite mode is single-instance),
    /// held as long as the application runs.
    pub sqlite_lock: Option<std::sync::Arc<std::fs::File>>,
    /// Each provider's models as its vendor listed them at start (an
    /// announced shutdown date), for the providers view and /ops.
    pub provider_models:
        std::sync::Arc<std::collections::BTreeMap<String, Vec<crate::ai::ModelNotice>>>,
    /// Where uploaded photos and kept results live.
    pub media: crate::media::MediaStore,
    /// The upload desk's pool, limit and signing secret.
    pub photos: PhotoDesk,
    /// `--lease` in milliseconds: how long an erasure's purge claim lasts.
    pub lease_ms: i64,
    /// The PIN galleries' door: their last opening PINs (digests), the
    /// slow hash's places, the ceiling of guesses.
    pub gallery_pins: std::sync::Arc<gallery_pin::GalleryPins>,
    /// Webhook endpoints: their URLs judged, their secrets sealed.
    pub hooks: Hooks,
    /// Mail to guests; None when no SMTP server is set up.
    pub mail: Option<MailDesk>,
}

/// What the mail routes need: the key of the address digests and the
/// per-address bound.
#[derive(Clone)]
pub struct MailDesk {
    pub address_key: std::sync::Arc<[u8; 32]>,
    /// Mails to one address in an hour.
    pub per_address: u32,
}

/// What the webhook routes need: the judge of endpoint URLs (the same
/// client rules as the sender's) and the seal of the endpoints' secrets.
#[derive(Clone)]
pub struct Hooks {
    pub sender: crate::webhooks::HookSender,
    pub seal: crate::store::idempotency::Seal,
}

/// What photo uploads and photo reads need.
#[derive(Clone)]
pub struct PhotoDesk {
    pub pool: crate::media::pool::PhotoPool,
    /// `max_photo_bytes`.
    pub max_bytes: u64,
    /// How slowly a photo's body may arrive.
    pub pace: media::UploadPace,
    /// The key signed photo URLs are checked with (derived from the
    /// server's own secret, which the database never holds).
    pub secret: std::sync::Arc<[u8]>,
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

    /// Where the request comes from, as `--trusted-proxies` says: the one
    /// address the rate limits key on, the audit trail records and the
    /// logs name ([`rate_limit::ClientAddress`]).
    pub fn client_address(&self, req: &actix_web::HttpRequest) -> std::net::IpAddr {
        self.limits.client_address(req)
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
            shutdown: self.shutdown.clone(),
        }
    }
}

/// Every route. Each path is one [`Endpoint`]: a method it does not
/// answer gets 405 `method_not_allowed` with `Allow`; an unknown path gets
/// the JSON 404. Operator endpoints check the operator's token and role
/// before anything else (the role each needs is the middleware named where
/// it is listed: `admin_only`, `moderator_only`, `viewer_only`); endpoints
/// with a JSON body refuse other media types (415); session creation and
/// submission are rate limited (429). The routes are listed in four groups,
/// in this order (a literal path before the pattern that would take it).
pub fn routes(cfg: &mut web::ServiceConfig) {
    // Malformed query strings and paths answer in the same JSON shape.
    cfg.app_data(
        web::QueryConfig::default()
            .error_handler(|e, _| ApiError::Validation(e.to_string()).into()),
    )
    .app_data(
        web::PathConfig::default().error_handler(|e, _| ApiError::Validation(e.to_string()).into()),
    )
    .configure(service_and_experience_routes)
    .configure(admin_routes)
    .configure(output_routes)
    .configure(participant_and_guest_routes)
    .configure(page_routes)
    .default_service(web::to(service::not_found));
}

/// Service routes, experiences and terminals.
fn service_and_experience_routes(cfg: &mut web::ServiceConfig) {
    use auth::{admin_only, viewer_only};
    use body::json_only;
    cfg.service(
        Endpoint::new("/healthz")
            .get(web::to(service::healthz))
            .build(),
    )
    .service(
        Endpoint::new("/readyz")
            .get(web::to(service::readyz))
            .build(),
    )
    .service(
        Endpoint::new("/metrics")
            .get(web::to(metrics::metrics))
            .build(),
    )
    .service(
        Endpoint::new("/api/openapi.json")
            .get(web::to(openapi::openapi_json))
            .build(),
    )
    .service(
        Endpoint::new("/api/experiences")
            .get(web::to(operators::list_experiences))
            .post(
                web::to(operators::create_experience)
                    .wrap(from_fn(json_only))
                    .wrap(from_fn(admin_only)),
            )
            .build(),
    )
    .service(
        Endpoint::new("/api/experiences/{slug}")
            .get(web::to(operators::get_experience))
            .patch(
                web::to(settings::update_experience)
                    .wrap(from_fn(json_only))
                    .wrap(from_fn(admin_only)),
            )
            .build(),
    )
    .service(
        Endpoint::new("/api/experiences/{slug}/qr.svg")
            .get(web::to(operators::qr_svg))
            .build(),
    )
    .service(
        Endpoint::new("/api/terminals")
            .get(web::to(admin::list_terminals).wrap(from_fn(viewer_only)))
            .post(
                web::to(operators::create_terminal)
                    .wrap(from_fn(json_only))
                    .wrap(from_fn(admin_only)),
            )
            .build(),
    );
}

/// The event's outputs: the brand, print stations and prints, webhooks,
/// mail.
fn output_routes(cfg: &mut web::ServiceConfig) {
    use auth::{admin_only, moderator_only, viewer_only};
    use body::json_only;
    cfg
        // Before `/api/admin/experiences/{slug}/brand/{part}`, which would
        // take "preview" for a part.
        .service(
            Endpoint::new("/api/admin/experiences/{slug}/brand/preview")
                .post(web::to(brand::preview_brand).wrap(from_fn(viewer_only)))
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/experiences/{slug}/brand/{part}")
                .put(web::to(brand::put_brand_image).wrap(from_fn(admin_only)))
                .delete(web::to(brand::delete_brand_image).wrap(from_fn(admin_only)))
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/printers")
                .get(web::to(prints::list_printers).wrap(from_fn(viewer_only)))
                .post(
                    web::to(prints::add_printer)
                        .wrap(from_fn(json_only))
                        .wrap(from_fn(admin_only)),
                )
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/printers/{id}")
                .delete(web::to(prints::remove_printer).wrap(from_fn(admin_only)))
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/sessions/{id}/print")
                .post(web::to(prints::operator_print).wrap(from_fn(moderator_only)))
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/prints/{id}/cancel")
                .post(web::to(prints::cancel_print).wrap(from_fn(moderator_only)))
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/prints/{id}/approve")
                .post(web::to(prints::approve_print).wrap(from_fn(moderator_only)))
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/webhooks")
                .get(web::to(webhooks::list_webhooks).wrap(from_fn(viewer_only)))
                .post(
                    web::to(webhooks::add_webhook)
                        .wrap(from_fn(json_only))
                        .wrap(from_fn(admin_only)),
                )
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/webhooks/{id}")
                .delete(web::to(webhooks::remove_webhook).wrap(from_fn(admin_only)))
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/webhooks/{id}/enable")
                .post(web::to(webhooks::enable_webhook).wrap(from_fn(admin_only)))
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/webhooks/{id}/deliveries")
                .get(web::to(webhooks::webhook_deliveries).wrap(from_fn(viewer_only)))
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/webhooks/{id}/deliveries/{delivery_id}/redeliver")
                .post(web::to(webhooks::redeliver).wrap(from_fn(moderator_only)))
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/mails")
                .get(web::to(mails::list_mails).wrap(from_fn(viewer_only)))
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/mails/retry")
                .post(
                    web::to(mails::retry_mails)
                        .wrap(from_fn(json_only))
                        .wrap(from_fn(moderator_only)),
                )
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/mail/templates")
                .get(web::to(mails::list_templates).wrap(from_fn(viewer_only)))
                .build(),
        )
        .service(
            Endpoint::new("/api/admin/mail/templates/{locale}")
                .put(
                    web::to(mails::put_template)
                        .wrap(from_fn(json_only))
                        .wrap(from_fn(admin_only)),
                )
                .delete(web::to(mails::reset_template).wrap(from_fn(admin_only)))
                .build(),
        );
}

/// The operators' console: sagas, review, providers, the breaker, operators and the audit trail.
fn admin_routes(cfg: &mut web::ServiceConfig) {
    use auth::{admin_only, moderator_only, viewer_only};
    use body::json_only;
    cfg.service(
        Endpoint::new("/api/admin/sagas")
            .get(web::to(admin::list_sagas).wrap(from_fn(viewer_only)))
            .build(),
    )
    // Before `/api/admin/sagas/{id}`, which would take "bulk" for an id.
    .service(
        Endpoint::new("/api/admin/sagas/bulk")
            .post(
                web::to(review::bulk_sagas)
                    .wrap(from_fn(json_only))
                    .wrap(from_fn(moderator_only)),
            )
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/sagas/{id}")
            .get(web::to(admin::get_saga).wrap(from_fn(viewer_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/sagas/{id}/approve")
            .post(web::to(review::approve_saga).wrap(from_fn(moderator_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/sagas/{id}/reject")
            .post(web::to(review::reject_saga).wrap(from_fn(moderator_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/review")
            .get(web::to(review::list_review).wrap(from_fn(viewer_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/sagas/{id}/retry")
            .post(web::to(admin::retry_saga).wrap(from_fn(admin_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/sagas/{id}/cancel")
            .post(web::to(admin::cancel_saga).wrap(from_fn(admin_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/providers")
            .get(web::to(admin::list_providers).wrap(from_fn(viewer_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/breaker")
            .get(web::to(admin::get_breaker).wrap(from_fn(viewer_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/breaker/open")
            .post(web::to(admin::open_breaker).wrap(from_fn(admin_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/breaker/close")
            .post(web::to(admin::close_breaker).wrap(from_fn(admin_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/me")
            .get(web::to(staff::me).wrap(from_fn(viewer_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/operators")
            .get(web::to(staff::list_operators).wrap(from_fn(admin_only)))
            .post(
                web::to(staff::create_operator)
                    .wrap(from_fn(json_only))
                    .wrap(from_fn(admin_only)),
            )
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/operators/{id}")
            .delete(web::to(staff::revoke_operator).wrap(from_fn(admin_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/audit")
            .get(web::to(staff::audit).wrap(from_fn(admin_only)))
            .build(),
    )
    // The token comes in the query (browsers' WebSocket API sends no
    // header); the handler checks it.
    .service(
        Endpoint::new("/ws/operators")
            .get(web::to(admin::operator_socket))
            .build(),
    );
}

/// The participants' routes, media, result links, galleries and the guests' data.
fn participant_and_guest_routes(cfg: &mut web::ServiceConfig) {
    use auth::{admin_only, moderator_only, viewer_only};
    use body::json_only;
    use rate_limit::per_client;
    cfg.service(
        Endpoint::new("/api/experiences/{slug}/sessions")
            .post(
                web::to(participants::create_session)
                    .wrap(from_fn(json_only))
                    .wrap(from_fn(per_client)),
            )
            .build(),
    )
    .service(
        Endpoint::new("/api/experiences/{slug}/ranking")
            .get(web::to(participants::ranking))
            .build(),
    )
    .service(
        Endpoint::new("/api/sessions/{id}/photo")
            .post(web::to(media::upload_photo))
            .build(),
    )
    .service(
        Endpoint::new("/media/r/{name}")
            .get(web::to(media::serve_result))
            .build(),
    )
    .service(
        Endpoint::new("/media/p/{name}")
            .get(web::to(media::serve_photo))
            .build(),
    )
    .service(
        Endpoint::new("/api/sessions/{id}/print")
            .post(web::to(prints::guest_print))
            .build(),
    )
    .service(
        Endpoint::new("/api/sessions/{id}/email")
            .post(web::to(mails::guest_email).wrap(from_fn(json_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/sessions/{id}/submission")
            .post(web::to(submissions::submit).wrap(from_fn(json_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/sessions/{id}")
            .get(web::to(participants::get_session))
            .delete(web::to(guests::erase_own))
            .build(),
    )
    .service(
        Endpoint::new("/api/share/{share_id}")
            .get(web::to(guests::share_json))
            .build(),
    )
    .service(
        Endpoint::new("/r/{share_id}")
            .get(web::to(guests::result_page))
            .build(),
    )
    .service(
        Endpoint::new("/r/{share_id}/download")
            .get(web::to(guests::download))
            .build(),
    )
    .service(
        Endpoint::new("/r/{share_id}/qr.svg")
            .get(web::to(guests::share_qr))
            .build(),
    )
    .service(
        Endpoint::new("/api/experiences/{slug}/gallery")
            .get(web::to(guests::gallery))
            .build(),
    )
    .service(
        Endpoint::new("/g/{slug}")
            .get(web::to(pages::gallery))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/sessions")
            .get(web::to(guests::search_sessions).wrap(from_fn(viewer_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/sessions/{id}")
            .delete(web::to(guests::erase_by_operator).wrap(from_fn(admin_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/sessions/{id}/hide")
            .post(web::to(guests::hide).wrap(from_fn(moderator_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/sessions/{id}/unhide")
            .post(web::to(guests::unhide).wrap(from_fn(moderator_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/experiences/{slug}/held")
            .get(web::to(guests::held).wrap(from_fn(viewer_only)))
            .build(),
    )
    .service(
        Endpoint::new("/api/admin/experiences/{slug}/export")
            .get(web::to(export::export).wrap(from_fn(admin_only)))
            .build(),
    )
    .service(
        Endpoint::new("/ws/terminals/{id}")
            .get(web::to(terminals::terminal_socket))
            .build(),
    );
}

/// The embedded pages and their assets.
fn page_routes(cfg: &mut web::ServiceConfig) {
    cfg.service(Endpoint::new("/").get(web::to(pages::index)).build())
        .service(
            Endpoint::new("/p/{slug}")
                .get(web::to(pages::participant))
                .build(),
        )
        .service(
            Endpoint::new("/terminal/{id}")
                .get(web::to(pages::terminal))
                .build(),
        )
        .service(Endpoint::new("/ops").get(web::to(pages::ops)).build())
        .service(
            Endpoint::new("/static/{name}")
                .get(web::to(pages::static_file))
                .build(),
        )
        .service(
            Endpoint::new("/i18n/{name}")
                .get(web::to(pages::i18n))
                .build(),
        );
}

/// Middleware of every route, outermost: an encoded NUL (`%00`) in the
/// path names nothing (404), in the query it is no valid value (422). No id,
/// slug or filter needs one, and PostgreSQL cannot compare text with it.
async fn refuse_nul(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let uri = req.uri();
    let refused = if uri.path().contains("%00") {
        Some(ApiError::NotFound("resource"))
    } else if uri.query().is_some_and(|q| q.contains("%00")) {
        Some(ApiError::Validation(
            "query parameters must not contain NUL characters".into(),
        ))
    } else {
        None
    };
    match refused {
        Some(e) => Ok(req.error_response(e).map_into_right_body()),
        None => Ok(next.call(req).await?.map_into_left_body()),
    }
}

/// One path and the methods it answers; any other method is answered 405
/// `method_not_allowed` with `Allow` listing these.
pub struct Endpoint {
    resource: Resource,
    allow: Vec<Method>,
}

impl Endpoint {
    pub fn new(path: &str) -> Endpoint {
        Endpoint {
            resource: web::resource(path),
            allow: Vec::new(),
        }
    }

    /// GET, and HEAD with it (the same answer without its body).
    pub fn get(self, route: Route) -> Endpoint {
        self.methods(&[Method::GET, Method::HEAD], route)
    }

    pub fn post(self, route: Route) -> Endpoint {
        self.methods(&[Method::POST], route)
    }

    pub fn delete(self, route: Route) -> Endpoint {
        self.methods(&[Method::DELETE], route)
    }

    pub fn patch(self, route: Route) -> Endpoint {
        self.methods(&[Method::PATCH], route)
    }

    pub fn put(self, route: Route) -> Endpoint {
        self.methods(&[Method::PUT], route)
    }

    fn methods(mut self, methods: &[Method], route: Route) -> Endpoint {
        let any = methods.iter().skip(1).fold(
            guard::Any(guard::Method(methods[0].clone())),
            |any, method| any.or(guard::Method(method.clone())),
        );
        self.resource = self
            .resource
            .route(route.wrap(from_fn(refuse_nul)).guard(any));
        self.allow.extend_from_slice(methods);
        self
    }

    pub fn build(self) -> Resource {
        let allow = self
            .allow
            .iter()
            .map(Method::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        self.resource.default_service(web::to(move || {
            let allow = allow.clone();
            async move { Err::<HttpResponse, _>(ApiError::MethodNotAllowed { allow }) }
        }))
    }
}
