//! Wiring: connect and migrate the database, start the AI simulator when no
//! provider is configured, start the actors, and bind the HTTP server. Tests
//! build the same [`Application`] on port 0 with a fresh database.
//!
//! A SQLite database is one instance's: [`Application::build`] takes an
//! exclusive lock on the file (released by the OS when the process ends,
//! even by kill -9) and refuses to start when another process holds it.
//! [`Shutdown`] is the graceful stop.

use std::fs::File;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr};
use actix_web::dev::{Server, ServerHandle};
use actix_web::{web, App, HttpServer};

use crate::actors::adopter::SlotAdopter;
use crate::actors::ai::AiActor;
use crate::actors::breaker::{ProviderBreaker, ProviderRate};
use crate::actors::cleanup::CleanupActor;
use crate::actors::cluster::ClusterBridge;
use crate::actors::dispatcher::{Dispatcher, Drain, Drained};
use crate::actors::liveness::LivenessActor;
use crate::actors::operator_hub::OperatorHub;
use crate::actors::outbox_relay::OutboxRelay;
use crate::actors::persistence::PersistenceActor;
use crate::actors::providers::{ProviderHandle, Providers};
use crate::actors::ranking::RankingActor;
use crate::actors::ranking_board::RankingBoard;
use crate::actors::review::ReviewActor;
use crate::actors::saga_supervisor::{SagaDeps, SagaMedia, SagaSettings};
use crate::actors::shutdown::ShutdownSignal;
use crate::actors::terminal_hub::TerminalHub;
use crate::actors::wakeups::{ClusterMailbox, Wakeups};
use crate::ai::providers::{ProviderSpec, ProvidersFileError};
use crate::ai::simulator::{self, RunningSim, SimConfig, SimControl};
use crate::ai::{AiClient, AiProvider, ApiKey, OpenAiClient, OpenAiSettings, ProviderKind};
use crate::clock::{SharedClock, SystemClock};
use crate::config::Config;
use crate::http::auth::new_secret;
use crate::http::rate_limit::RateLimits;
use crate::http::{routes, AppState};
use crate::store::providers::ProviderRow;
use crate::store::sagas::ClaimRules;
use crate::store::{Store, StoreError};
use crate::units::RateLimit;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("database: {0}")]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("STAGEHAND_PUBLIC_URL must be an http:// or https:// URL, not {0:?}")]
    PublicUrl(String),
    #[error("cannot start the AI simulator: {0}")]
    Simulator(std::io::Error),
    #[error("cannot start the photo workers: {0}")]
    PhotoWorkers(std::io::Error),
    #[error("{0}")]
    ProvidersFile(#[from] ProvidersFileError),
    #[error("{0}")]
    Provider(String),
    #[error("{0}")]
    Media(#[from] crate::media::MediaError),
    #[error("{0}")]
    Secret(#[from] crate::media::secret::SecretError),
    #[error("{0}")]
    Mail(#[from] crate::mail::MailSetupError),
    #[error(
        "the SQLite database {path} is in use by another stagehand process; SQLite mode is \
         single-instance (stop the other `serve`, or use PostgreSQL to run several instances)"
    )]
    SqliteInUse { path: String },
    #[error("cannot lock the SQLite database {path}: {source}")]
    SqliteLock {
        path: String,
        source: std::io::Error,
    },
}

/// A built server, not yet awaited.
pub struct Application {
    port: u16,
    server: Server,
    state: AppState,
    cleanup: Addr<CleanupActor>,
    simulator: Option<RunningSim>,
    shutdown: Shutdown,
}

/// The graceful stop, in this order: the signal is set (`/readyz` answers
/// 503, display and operator sockets close with 1001 "going away"); the
/// HTTP server stops accepting connections (it still answers the ones it
/// has); the dispatcher claims nothing more, gives running sagas `grace`,
/// then hands over the rest so another instance resumes them at once
/// without using up a recovery; only then does the HTTP server stop. Its
/// workers' runtimes must outlive the hand-over: pooled connections opened
/// on them (by request handlers and display streams) die with them.
#[derive(Clone)]
pub struct Shutdown {
    signal: ShutdownSignal,
    dispatcher: Addr<Dispatcher>,
    grace: Duration,
    /// This instance's liveness row, deleted once everything is handed
    /// over: its Idempotency-Keys still in progress are free at once.
    liveness: Option<(Store, String)>,
    /// The `--metrics-bind` server, stopped last.
    metrics_server: Option<ServerHandle>,
}

impl Shutdown {
    pub async fn run(&self, server: ServerHandle) -> Drained {
        tracing::info!(
            grace_ms = self.grace.as_millis() as u64,
            "shutting down: not ready; sockets closing (1001 going away); claiming nothing more"
        );
        self.signal.trigger();
        server.pause().await;
        let drained = self
            .dispatcher
            .send(Drain { grace: self.grace })
            .await
            .unwrap_or_default();
        server.stop(true).await;
        if let Some((store, instance_id)) = &self.liveness {
            if let Err(e) = store.instance_gone(instance_id).await {
                tracing::warn!(error = %e, "could not say this instance is gone; its row goes stale in seconds");
            }
        }
        if let Some(metrics) = &self.metrics_server {
            metrics.stop(true).await;
        }
        tracing::info!(
            running = drained.running,
            handed_over = drained.handed_over,
            left_to_expire = drained.left_to_expire,
            "shut down"
        );
        drained
    }
}

impl Application {
    pub async fn build(config: Config) -> Result<Application, StartupError> {
        Self::build_with_clock(config, Arc::new(SystemClock)).await
    }

    pub async fn build_with_clock(
        config: Config,
        clock: SharedClock,
    ) -> Result<Application, StartupError> {
        check_public_url(&config)?;
        let db = open_database(&config).await?;
        let media = open_media(&config, db.store.is_postgres())?;
        let specs = config.provider_specs()?;
        let simulator = start_simulator(&specs).await?;
        let rows: Vec<ProviderRow> = specs.iter().map(provider_row).collect();
        db.store.register_providers(&rows, clock.now_ms()).await?;
        let operator_token = operator_token(&config);
        let rules = ClaimRules {
            lease_ms: config.lease_ms(),
            max_recoveries: config.max_recoveries,
        };
        let instance_id = crate::store::new_id();
        let secret = server_secret(&config, &db.store, &instance_id, clock.now_ms()).await?;
        let signing_key: Arc<[u8]> = Arc::from(&secret.media_signing_key()[..]);
        let core = start_core_actors(&db.work, &clock, &instance_id, rules.lease_ms);
        let (listener, port) = bind_listener(&config.bind)?;
        let bases = PhotoBases::of(&config, port);
        let (providers, provider_models, provider_media) = start_providers(
            &config,
            &specs,
            &db.work,
            &clock,
            &core.wakeups,
            simulator.as_ref(),
            &bases,
        )
        .await?;
        let (saga_media, photo_pool) =
            media_for_sagas(&config, &db.store, &media, provider_media, signing_key).await?;
        let dispatcher = start_saga_actors(
            &config,
            &db.work,
            &clock,
            &core,
            &providers,
            rules,
            saga_media.clone(),
        );
        let shutdown = Shutdown {
            signal: ShutdownSignal::default(),
            dispatcher,
            grace: config.shutdown_grace,
            metrics_server: None,
            liveness: db
                .work
                .is_postgres()
                .then(|| (db.work.clone(), instance_id.clone())),
        };
        let operators =
            OperatorHub::new(db.work.clone(), clock.clone(), core.wakeups.clone()).start();
        let cleanup = start_cleanup(&config, &db.work, &clock, &core, rules, &media);
        crate::actors::print_queue::PrintQueue::new(crate::actors::print_queue::PrintDeps {
            store: db.work.clone(),
            clock: clock.clone(),
            media: media.clone(),
            pool: photo_pool.clone(),
            wakeups: core.wakeups.clone(),
            hub: core.hub.clone(),
            instance_id: instance_id.clone(),
            lease_ms: config.lease_ms(),
        })
        .start();
        let hooks = start_webhooks(
            &config,
            &db.work,
            &clock,
            &core,
            &instance_id,
            &secret,
            port,
        )
        .await?;
        let mail = start_mail(
            &config,
            &db.work,
            &clock,
            &core,
            &media,
            &instance_id,
            &secret,
        )?;
        let limits = Arc::new(RateLimits::from_config(&config));
        start_liveness(&db.work, &clock, &instance_id, &limits).await?;
        let state = AppState {
            submissions: crate::http::submissions::submission_queue(
                db.store.clone(),
                clock.clone(),
                config.saga_deadline.as_millis() as i64,
                limits.clone(),
                db.store.is_postgres().then(|| instance_id.clone()),
            ),
            store: db.store,
            work_store: db.work,
            clock,
            wakeups: core.wakeups,
            hub: core.hub,
            operator_token,
            saga_deadline_ms: config.saga_deadline.as_millis() as i64,
            instance_id,
            display_heartbeat: config.display_heartbeat,
            persistence: core.persistence,
            operators,
            public_url: config.public_base_url(port),
            limits,
            shutdown: shutdown.signal.clone(),
            metrics_token: config.metrics_token.clone(),
            scrape_cache: Arc::default(),
            sqlite_lock: db.sqlite_lock.map(Arc::new),
            provider_models: Arc::new(provider_models),
            media,
            photos: crate::http::PhotoDesk {
                pool: photo_pool,
                max_bytes: config.max_photo_bytes,
                pace: crate::http::media::UploadPace {
                    timeout: config.upload_timeout,
                    min_rate: config.upload_min_rate,
                    grace: config.upload_grace,
                },
                secret: saga_media.secret.clone(),
            },
            gallery_pins: Arc::new(crate::http::gallery_pin::GalleryPins::new(
                config.gallery_pin_guesses,
            )),
            lease_ms: config.lease_ms(),
            hooks,
            mail,
        };
        let server = serve_http(listener, &state, &config.bind)?;
        let shutdown = Shutdown {
            metrics_server: serve_metrics(&config, &state)?,
            ..shutdown
        };
        log_listening(&config, port);
        Ok(Application {
            port,
            server,
            state,
            cleanup,
            simulator,
            shutdown,
        })
    }

    /// The graceful stop of this application.
    pub fn shutdown(&self) -> Shutdown {
        self.shutdown.clone()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    pub fn cleanup(&self) -> Addr<CleanupActor> {
        self.cleanup.clone()
    }

    /// The in-process simulator, when one was started.
    pub fn simulator(&self) -> Option<&SimControl> {
        self.simulator.as_ref().map(|s| &s.control)
    }

    /// Hands the server to the caller: the future runs until it stops.
    pub fn into_server(self) -> (Server, Option<RunningSim>) {
        (self.server, self.simulator)
    }
}

/// Refuses a `STAGEHAND_PUBLIC_URL` that is not an http:// or https:// URL.
fn check_public_url(config: &Config) -> Result<(), StartupError> {
    if let Some(url) = &config.public_url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(StartupError::PublicUrl(url.clone()));
        }
    }
    Ok(())
}

/// The database, migrated: the lock of a SQLite file, the pool of request
/// handlers and the pool of saga work and display streams.
struct Database {
    sqlite_lock: Option<File>,
    store: Store,
    work: Store,
}

/// A configured provider as the store keeps it (operators read it back).
fn provider_row(spec: &ProviderSpec) -> ProviderRow {
    ProviderRow {
        name: spec.name.clone(),
        kind: spec.kind_name().into(),
        max_in_flight: spec.max_in_flight,
        rate_limit: spec.rate_limit_text(),
    }
}

/// Locks a SQLite file, connects, migrates, and opens the work pool.
async fn open_database(config: &Config) -> Result<Database, StartupError> {
    let sqlite_lock = lock_sqlite_file(&config.database_url)?;
    let store = Store::connect_with(
        &config.database_url,
        config.db_pool,
        Some(config.db_lock_timeout),
    )
    .await?;
    store.migrate().await?;
    // Saga work and display streams get their own connections.
    let work = store.with_own_pool(config.worker_db_pool).await?;
    tracing::info!(database = %redact(&config.database_url), "database ready (migrations applied)");
    Ok(Database {
        sqlite_lock,
        store,
        work,
    })
}

/// Starts the built-in simulator when a job API has no URL (one, shared
/// by every such provider).
async fn start_simulator(specs: &[ProviderSpec]) -> Result<Option<RunningSim>, StartupError> {
    if !specs
        .iter()
        .any(|p| p.kind == ProviderKind::Jobs && p.url.is_none())
    {
        return Ok(None);
    }
    let sim = simulator::start("127.0.0.1:0", SimControl::new(SimConfig::default()))
        .await
        .map_err(StartupError::Simulator)?;
    tracing::info!(url = %sim.url(), "no STAGEHAND_AI_URL set: started the built-in AI simulator in-process");
    Ok(Some(sim))
}

/// The configured operator token, or a new one printed once.
fn operator_token(config: &Config) -> String {
    match &config.operator_token {
        Some(token) => token.clone(),
        None => {
            let token = new_secret();
            println!(
                "No STAGEHAND_OPERATOR_TOKEN set; generated operator token (shown once): {token}"
            );
            token
        }
    }
}

/// The actors the saga machinery and the HTTP state share.
struct CoreActors {
    hub: Addr<TerminalHub>,
    wakeups: Wakeups,
    persistence: Addr<PersistenceActor>,
}

/// Starts the terminal hub, the cluster bridge (PostgreSQL), the outbox
/// relay, the ranking board and the persistence actor, in that order.
fn start_core_actors(
    work: &Store,
    clock: &SharedClock,
    instance_id: &str,
    lease_ms: i64,
) -> CoreActors {
    let hub = TerminalHub::new(work.clone(), clock.clone(), instance_id.to_owned()).start();
    // On PostgreSQL other instances may share the database: wake-ups
    // cross over with LISTEN/NOTIFY. SQLite is one process.
    let cluster = work.is_postgres().then(ClusterMailbox::default);
    let wakeups = Wakeups {
        cluster: cluster.clone(),
        ..Wakeups::default()
    };
    if let Some(mailbox) = cluster {
        tracing::info!(%instance_id, "PostgreSQL: wake-ups cross instances with LISTEN/NOTIFY");
        ClusterBridge::new(
            work.clone(),
            instance_id.to_owned(),
            mailbox,
            wakeups.clone(),
            hub.clone(),
        )
        .start();
    }
    OutboxRelay::new(work.clone(), hub.clone(), wakeups.clone()).start();
    RankingBoard::new(work.clone(), hub.clone(), wakeups.clone()).start();
    let persistence =
        PersistenceActor::new(work.clone(), clock.clone(), lease_ms, wakeups.clone()).start();
    CoreActors {
        hub,
        wakeups,
        persistence,
    }
}

/// Binds the HTTP address; the port it got (for `:0`).
fn bind_listener(addr: &str) -> Result<(TcpListener, u16), StartupError> {
    let listener = TcpListener::bind(addr).map_err(|source| StartupError::Bind {
        addr: addr.to_owned(),
        source,
    })?;
    let port = listener
        .local_addr()
        .map_err(|source| StartupError::Bind {
            addr: addr.to_owned(),
            source,
        })?
        .port();
    Ok((listener, port))
}

/// Starts the slot adopter, the ranking actor, the dispatcher and the
/// review actor, in that order; the dispatcher.
fn start_saga_actors(
    config: &Config,
    work: &Store,
    clock: &SharedClock,
    core: &CoreActors,
    providers: &Providers,
    rules: ClaimRules,
    saga_media: SagaMedia,
) -> Addr<Dispatcher> {
    SlotAdopter::new(
        work.clone(),
        clock.clone(),
        providers.clone(),
        core.wakeups.clone(),
        config.ai_poll_interval,
        config.max_recoveries,
    )
    .start();
    let deps = SagaDeps {
        store: work.clone(),
        clock: clock.clone(),
        ranking: RankingActor::new(work.clone(), clock.clone(), core.wakeups.clone()).start(),
        persistence: core.persistence.clone(),
        wakeups: core.wakeups.clone(),
        settings: Arc::new(SagaSettings {
            lease: config.lease,
            ai_timeout: config.ai_timeout,
            ai_poll_interval: config.ai_poll_interval,
            retry: config.retry_policy(),
        }),
        media: saga_media,
    };
    let dispatcher = Dispatcher::new(
        deps,
        providers.clone(),
        rules,
        config.poll_interval,
        core.wakeups.dispatcher.clone(),
        config.max_running as usize,
    )
    .start();
    ReviewActor::new(
        work.clone(),
        clock.clone(),
        core.wakeups.clone(),
        dispatcher.clone(),
        core.persistence.clone(),
        rules.lease_ms,
        config.saga_deadline.as_millis() as i64,
    )
    .start();
    dispatcher
}

/// Starts the cleanup actor, with photo orphans and audit retention.
fn start_cleanup(
    config: &Config,
    work: &Store,
    clock: &SharedClock,
    core: &CoreActors,
    rules: ClaimRules,
    media: &crate::media::MediaStore,
) -> Addr<CleanupActor> {
    CleanupActor::new(
        work.clone(),
        clock.clone(),
        core.persistence.clone(),
        core.wakeups.clone(),
        rules,
        config.cleanup_interval,
    )
    .with_photo_orphans(media.clone(), config.photo_orphan_ttl)
    .with_audit_retention(config.audit_retention)
    .start()
}

/// On PostgreSQL: says this instance is alive, counts the live instances
/// into `limits`, and starts the liveness actor. Nothing on SQLite.
async fn start_liveness(
    work: &Store,
    clock: &SharedClock,
    instance_id: &str,
    limits: &RateLimits,
) -> Result<(), StartupError> {
    if work.is_postgres() {
        // Alive before the first request, so keys it takes are never
        // taken for a dead instance's.
        let live = work.instance_alive(instance_id, clock.now_ms()).await?;
        limits
            .live_instances
            .store(live, std::sync::atomic::Ordering::Relaxed);
        LivenessActor::new(
            work.clone(),
            clock.clone(),
            instance_id.to_owned(),
            limits.live_instances.clone(),
        )
        .start();
    }
    Ok(())
}

/// The HTTP server on `listener`, not yet awaited.
fn serve_http(listener: TcpListener, state: &AppState, addr: &str) -> Result<Server, StartupError> {
    let data = web::Data::new(state.clone());
    let server = HttpServer::new(move || {
        App::new()
            .wrap(tracing_actix_web::TracingLogger::<
                crate::http::request_log::RedactedRootSpan,
            >::new())
            .app_data(data.clone())
            .configure(routes)
    })
    .listen(listener)
    .map_err(|source| StartupError::Bind {
        addr: addr.to_owned(),
        source,
    })?
    .disable_signals()
    .shutdown_timeout(5)
    .run();
    Ok(server)
}

/// The `--metrics-bind` server, running, when one is configured.
fn serve_metrics(config: &Config, state: &AppState) -> Result<Option<ServerHandle>, StartupError> {
    let Some(addr) = &config.metrics_bind else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr).map_err(|source| StartupError::Bind {
        addr: addr.clone(),
        source,
    })?;
    let shown = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| addr.clone());
    let data = web::Data::new(state.clone());
    let server = HttpServer::new(move || {
        App::new().app_data(data.clone()).route(
            "/metrics",
            web::get().to(crate::http::metrics::metrics_only),
        )
    })
    .listen(listener)
    .map_err(|source| StartupError::Bind {
        addr: addr.clone(),
        source,
    })?
    .disable_signals()
    .workers(1)
    .run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    tracing::info!(address = %shown, "GET /metrics served without a token on its own address");
    Ok(Some(handle))
}

/// Says the rate limits and where the server listens.
fn log_listening(config: &Config, port: u16) {
    tracing::info!(
        sessions = ?config.session_rate_limit,
        submissions = ?config.submission_rate_limit,
        trusted_proxies = config.trusted_proxies,
        "rate limits (per client address; per session and token)"
    );
    tracing::info!(
        port,
        "stagehand listening on http://{}",
        config.bind.replace(":0", &format!(":{port}"))
    );
}

/// Each provider of the providers file (or the one `default`): its client,
/// checked against the vendor's model list before serving, its breaker,
/// its rate limit and its AiActor; and the models each one uses, for the
/// providers view.
async fn start_providers(
    config: &Config,
    specs: &[ProviderSpec],
    work: &Store,
    clock: &SharedClock,
    wakeups: &Wakeups,
    simulator: Option<&RunningSim>,
    bases: &PhotoBases,
) -> Result<(Providers, ProviderModels, ProviderMediaMap), StartupError> {
    let mut handles = Vec::with_capacity(specs.len());
    let mut provider_models = std::collections::BTreeMap::new();
    let mut provider_media = ProviderMediaMap::new();
    for spec in specs {
        let breaker = ProviderBreaker::new(
            work.clone(),
            clock.clone(),
            wakeups.clone(),
            &spec.name,
            config.breaker_cool_down,
        );
        let client = provider_client(config, spec, simulator)?;
        let today = chrono::DateTime::from_timestamp_millis(clock.now_ms())
            .unwrap_or_default()
            .date_naive();
        let models = client.check_models(today).await.map_err(|refusal| {
            StartupError::Provider(format!("provider {}: {refusal}", spec.name))
        })?;
        provider_models.insert(spec.name.clone(), models);
        provider_media.insert(spec.name.clone(), provider_media_of(spec, &client, bases)?);
        let rate = match spec.rate_limit {
            RateLimit::Off => None,
            RateLimit::Every { count, per } => Some(ProviderRate::new(
                work.clone(),
                clock.clone(),
                &spec.name,
                count.get(),
                per,
            )),
        };
        tracing::info!(
            provider = %spec.name,
            kind = spec.kind_name(),
            max_in_flight = ?spec.max_in_flight,
            rate_limit = ?spec.rate_limit_text(),
            "AI provider ready"
        );
        handles.push(ProviderHandle {
            spec: spec.clone(),
            jobs_end_within_ms: client.jobs_end_within_ms(),
            can_look: client.can_look(),
            ai: AiActor::new(client)
                .with_breaker(breaker.clone())
                .with_rate_limit(rate)
                .start(),
            breaker,
        });
    }
    Ok((Providers::new(handles), provider_models, provider_media))
}

/// Photo workers unless configured: one fewer than the cores (at least
/// one). A burst of uploads then never holds every core, whatever the
/// scheduler does: with a decoder on both cores of a 2-core machine, a
/// lower priority (`media::pool::WORKER_NICE`) alone left the 202's p99
/// of prompt submissions at 200/s at 25-33 ms during a burst; one core
/// left free halves it (10-16 ms; docs/BENCHMARKS.md §27).
fn default_photo_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| cores.get().saturating_sub(1).max(1))
}

/// Where providers may reach this server: the public URL when one is set,
/// else the loopback address (good only for a provider on this machine,
/// such as the built-in simulator).
struct PhotoBases {
    public: Option<String>,
    local: String,
}

impl PhotoBases {
    fn of(config: &Config, port: u16) -> PhotoBases {
        PhotoBases {
            public: config
                .public_url
                .as_ref()
                .map(|u| u.trim_end_matches('/').to_owned()),
            local: format!("http://127.0.0.1:{port}"),
        }
    }
}

/// The server's own secret (`--secret`, or its file), once the database
/// says that every live instance has the same secret: media URLs are
/// signed, and webhook secrets sealed, with keys derived from it.
async fn server_secret(
    config: &Config,
    store: &Store,
    instance_id: &str,
    now: i64,
) -> Result<crate::domain::media::ServerSecret, StartupError> {
    let secret = match &config.secret {
        Some(secret) => secret.clone(),
        None => {
            let file = config
                .secret_file
                .clone()
                .unwrap_or_else(|| default_secret_file(&config.database_url));
            crate::media::secret::read_or_make(&file)?
        }
    };
    crate::media::secret::check_agreement(store, &secret, instance_id, now).await?;
    Ok(secret)
}

/// The webhook sender, started, and what the HTTP side needs of webhooks:
/// the URL judge and the seal of the endpoints' secrets. The links in the
/// bodies start with the public URL.
async fn start_webhooks(
    config: &Config,
    store: &Store,
    clock: &SharedClock,
    core: &CoreActors,
    instance_id: &str,
    secret: &crate::domain::media::ServerSecret,
    port: u16,
) -> Result<crate::http::Hooks, StartupError> {
    let hooks = crate::http::Hooks {
        sender: crate::webhooks::HookSender::new(config.webhook_allow_private),
        seal: crate::store::idempotency::Seal::with_key(secret.webhook_seal_key()),
    };
    store.hooks().set_base_url(&config.public_base_url(port));
    store.refresh_listeners().await?;
    crate::actors::webhook_sender::WebhookSender::new(crate::actors::webhook_sender::WebhookDeps {
        store: store.clone(),
        clock: clock.clone(),
        wakeups: core.wakeups.clone(),
        sender: hooks.sender.clone(),
        seal: hooks.seal.clone(),
        instance_id: instance_id.to_owned(),
        lease_ms: config.lease_ms(),
        disable_after_ms: config.webhook_disable_after.as_millis() as i64,
    })
    .start();
    Ok(hooks)
}

/// The mail sender, started when an SMTP server is set up, and what the
/// HTTP side needs of mail; None when none is (guests are not offered
/// mail).
fn start_mail(
    config: &Config,
    store: &Store,
    clock: &SharedClock,
    core: &CoreActors,
    media: &crate::media::MediaStore,
    instance_id: &str,
    secret: &crate::domain::media::ServerSecret,
) -> Result<Option<crate::http::MailDesk>, StartupError> {
    let Some(url) = config.smtp_url.clone().filter(|u| !u.trim().is_empty()) else {
        tracing::info!("no SMTP server (STAGEHAND_SMTP_URL): guests are not offered mail");
        return Ok(None);
    };
    let mailer = crate::mail::Mailer::new(&crate::mail::MailSettings {
        url,
        username: config.smtp_username.clone(),
        password: config.smtp_password.clone(),
        from: config.mail_from.clone().unwrap_or_default(),
    })?;
    tracing::info!(server = %mailer.server(), "guests' mail goes through this SMTP server");
    crate::actors::mail_sender::MailSender::new(crate::actors::mail_sender::MailDeps {
        store: store.clone(),
        clock: clock.clone(),
        wakeups: core.wakeups.clone(),
        media: media.clone(),
        mailer,
        instance_id: instance_id.to_owned(),
        lease_ms: config.lease_ms(),
    })
    .start();
    Ok(Some(crate::http::MailDesk {
        address_key: Arc::new(secret.mail_address_key()),
        per_address: config.mails_per_address,
    }))
}

/// Where the server's secret is kept when no flag says: `<name>.secret`
/// beside the SQLite file, else `stagehand.secret` in the working folder.
fn default_secret_file(database_url: &str) -> PathBuf {
    match sqlite_file(database_url) {
        Some(db) => {
            let stem = db
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "stagehand".to_owned());
            db.with_file_name(format!("{stem}.secret"))
        }
        None => PathBuf::from("stagehand.secret"),
    }
}

/// What sagas need of media (the keeper of results and the secret its
/// keys are derived under, the key photo URLs are signed with, each
/// provider's origins), and the photo pool the uploads share with the
/// keeper's thumbnails.
async fn media_for_sagas(
    config: &Config,
    store: &Store,
    media: &crate::media::MediaStore,
    provider_media: ProviderMediaMap,
    signing_key: Arc<[u8]>,
) -> Result<(SagaMedia, crate::media::pool::PhotoPool), StartupError> {
    let photo_pool = crate::media::pool::PhotoPool::new(crate::media::pool::PoolSizes {
        workers: config.photo_workers.unwrap_or_else(default_photo_workers),
        queue: config.photo_queue,
        memory: config.photo_memory,
    })
    .map_err(StartupError::PhotoWorkers)?;
    let sizes = photo_pool.sizes();
    tracing::info!(
        workers = sizes.workers,
        queue = sizes.queue,
        memory_bytes = sizes.memory,
        keep_reserve_bytes = sizes.keep_reserve(),
        nice = crate::media::pool::WORKER_NICE,
        "photo pool: uploads and thumbnails decode on these threads, below the server's CPU priority, within this memory"
    );
    let result_keys = store
        .server_key(crate::store::photos::RESULT_KEYS, &new_secret())
        .await?;
    let keeper = crate::media::keep::Keeper::new(
        media.clone(),
        photo_pool.clone(),
        result_keys.as_bytes(),
        crate::media::keep::KeepLimits {
            max_bytes: config.max_result_bytes,
            ..Default::default()
        },
    );
    let saga_media = SagaMedia {
        keeper,
        secret: signing_key,
        providers: Arc::new(provider_media),
        brands: Arc::default(),
    };
    Ok((saga_media, photo_pool))
}

type ProviderMediaMap = std::collections::HashMap<String, crate::media::keep::ProviderMedia>;

/// One provider's result origins (its own, its vendor's documented ones,
/// its `result_origins`) and where it fetches a photo from. A remote
/// provider without a public URL gets photos inline where its API allows
/// (said at start).
fn provider_media_of(
    spec: &ProviderSpec,
    client: &AiProvider,
    bases: &PhotoBases,
) -> Result<crate::media::keep::ProviderMedia, StartupError> {
    let origins = crate::media::keep::ResultOrigins::new(
        client.base_url(),
        client.documented_result_origins(),
        &spec.result_origins,
    )
    .map_err(|e| StartupError::Provider(format!("provider {}: {e}", spec.name)))?;
    let local = reqwest::Url::parse(client.base_url())
        .ok()
        .and_then(|u| {
            u.host_str()
                .map(|h| matches!(h, "127.0.0.1" | "localhost" | "[::1]"))
        })
        .unwrap_or(false);
    let photo_base = match (&bases.public, local) {
        (Some(public), _) => Some(public.clone()),
        (None, true) => Some(bases.local.clone()),
        (None, false) => {
            tracing::warn!(provider = %spec.name, "no STAGEHAND_PUBLIC_URL: this provider cannot fetch photos from this server, so photos are sent inline where its API allows (the job API cannot take one)");
            None
        }
    };
    Ok(crate::media::keep::ProviderMedia {
        origins,
        photo_base,
    })
}

/// The models of each provider, by name, as its vendor listed them at start.
type ProviderModels = std::collections::BTreeMap<String, Vec<crate::ai::ModelNotice>>;

/// The media store `--media-url` names (default: a folder beside the
/// SQLite file). Instances on PostgreSQL with a folder each cannot serve
/// each other's files: said at start, loudly.
fn open_media(
    config: &Config,
    several_instances: bool,
) -> Result<crate::media::MediaStore, StartupError> {
    use crate::media::{MediaPlace, MediaStore};
    let url = config
        .media_url
        .clone()
        .unwrap_or_else(|| MediaStore::default_url(&config.database_url));
    let media = MediaStore::open(&url)?;
    tracing::info!(media = %media.describe(), "media store ready");
    if several_instances && matches!(media.place(), MediaPlace::Folder(_)) {
        tracing::warn!(
            media = %media.describe(),
            "media is in a local folder while the database is PostgreSQL: other instances cannot serve the files this one keeps unless the folder is shared between them; set STAGEHAND_MEDIA_URL=s3://bucket for several instances"
        );
    }
    Ok(media)
}

/// The client of one provider. A key comes from the variable the spec
/// names (`api_key_env`); a named variable that is unset or empty stops the
/// start, saying which.
fn provider_client(
    config: &Config,
    spec: &ProviderSpec,
    simulator: Option<&RunningSim>,
) -> Result<AiProvider, StartupError> {
    let key = match &spec.api_key_env {
        None => None,
        Some(var) => match std::env::var(var) {
            Ok(value) if !value.trim().is_empty() => Some(ApiKey::new(value.trim())),
            _ => {
                return Err(StartupError::Provider(format!(
                    "provider {}: api_key_env names {var}, which is not set",
                    spec.name
                )))
            }
        },
    };
    Ok(match spec.kind {
        ProviderKind::Jobs => {
            let url = match (&spec.url, simulator) {
                (Some(url), _) => url.clone(),
                (None, Some(sim)) => sim.url(),
                (None, None) => String::new(),
            };
            AiProvider::from(AiClient::new(
                &url,
                Duration::from_secs(5),
                Duration::from_secs(30),
            ))
        }
        ProviderKind::Openai => {
            let mut settings = config.openai_settings();
            if let Some(url) = &spec.url {
                settings.base_url = url.clone();
            }
            if key.is_some() {
                settings.api_key = key;
            }
            if let Some(model) = &spec.chat_model {
                settings.chat_model = model.clone();
            }
            if let Some(model) = &spec.image_model {
                settings.image_model = model.clone();
            }
            if let Some(size) = &spec.image_size {
                settings.image_size = size.clone();
            }
            openai_provider(settings)
        }
        ProviderKind::Replicate => replicate_provider(spec, key, config.saga_deadline),
    })
}

/// The OpenAI-compatible adapter; says which models it uses and whether a
/// key is set, never the key.
fn openai_provider(settings: OpenAiSettings) -> AiProvider {
    let client = OpenAiClient::new(&settings);
    tracing::info!(
        base_url = %redact(client.base_url()),
        chat_model = %settings.chat_model,
        image_model = %settings.image_model,
        api_key = if client.has_key() { "set" } else { "unset" },
        "AI provider: OpenAI-compatible API (chat completions, image generation)"
    );
    AiProvider::from(client)
}

/// The Replicate adapter of a provider; says which model it runs and
/// whether a key is set, never the key.
fn replicate_provider(
    spec: &ProviderSpec,
    key: Option<ApiKey>,
    cancel_after: std::time::Duration,
) -> AiProvider {
    use crate::ai::{replicate, ReplicateClient, ReplicateSettings};
    let settings = ReplicateSettings {
        base_url: spec
            .url
            .clone()
            .unwrap_or_else(|| replicate::DEFAULT_BASE_URL.to_owned()),
        model: spec.model.clone(),
        version: spec.version.clone(),
        photo_input: spec
            .photo_input
            .clone()
            .unwrap_or_else(|| replicate::DEFAULT_PHOTO_INPUT.to_owned()),
        cancel_after,
        ..ReplicateSettings::new(key)
    };
    let client = ReplicateClient::new(&settings);
    tracing::info!(
        provider = %spec.name,
        base_url = %redact(client.base_url()),
        model = ?spec.model,
        version = ?spec.version,
        photo_input = %settings.photo_input,
        api_key = if client.has_key() { "set" } else { "unset" },
        "AI provider: Replicate predictions API"
    );
    AiProvider::from(client)
}

/// Takes the exclusive lock of a SQLite database file (an advisory
/// `flock`, which SQLite's own POSIX locks do not see), or says who holds
/// it. None for PostgreSQL and in-memory SQLite.
fn lock_sqlite_file(url: &str) -> Result<Option<File>, StartupError> {
    let Some(path) = sqlite_file(url) else {
        return Ok(None);
    };
    let shown = path.display().to_string();
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
    {
        Ok(file) => file,
        // Not there and not to be created (no `mode=rwc`): the database
        // connection says why.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StartupError::SqliteLock {
                path: shown,
                source,
            })
        }
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(StartupError::SqliteInUse { path: shown }),
        Err(std::fs::TryLockError::Error(source)) => Err(StartupError::SqliteLock {
            path: shown,
            source,
        }),
    }
}

/// The file of a `sqlite:` URL (`sqlite://stagehand.db?mode=rwc`,
/// `sqlite:/tmp/x.db`); None for other databases and in-memory ones.
fn sqlite_file(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() || path == ":memory:" || query.contains("mode=memory") {
        return None;
    }
    Some(PathBuf::from(path))
}

/// The URL without its password, for logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &creds[..colon],
                    &url[at..]
                ),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_file_of_urls() {
        let file = |url| sqlite_file(url).map(|p| p.display().to_string());
        assert_eq!(
            file("sqlite://stagehand.db?mode=rwc").as_deref(),
            Some("stagehand.db")
        );
        assert_eq!(
            file("sqlite:///tmp/x.db?mode=rwc").as_deref(),
            Some("/tmp/x.db")
        );
        assert_eq!(file("sqlite:/tmp/x.db").as_deref(), Some("/tmp/x.db"));
        assert_eq!(file("sqlite::memory:"), None);
        assert_eq!(file("sqlite://x.db?mode=memory"), None);
        assert_eq!(file("postgres://postgres@127.0.0.1/x"), None);
    }

    #[test]
    fn the_default_secret_file_sits_beside_the_sqlite_file() {
        let file = |url| default_secret_file(url).display().to_string();
        assert_eq!(
            file("sqlite:///var/lib/stagehand/stagehand.db?mode=rwc"),
            "/var/lib/stagehand/stagehand.secret"
        );
        assert_eq!(file("sqlite://booth.db?mode=rwc"), "booth.secret");
        assert_eq!(file("postgres://postgres@127.0.0.1/x"), "stagehand.secret");
    }
}
