//! Configuration: command-line flags with `STAGEHAND_*` environment
//! fallbacks and human durations (`250ms`, `10s`, `7m`), so tests run the same
//! code with short times.

use std::time::Duration;

use clap::Args;

use crate::ai::openai::{self, ApiKey, OpenAiSettings};
use crate::ai::providers::{self, ProviderSpec, ProvidersFileError};
use crate::ai::ProviderKind;
use crate::domain::media::ServerSecret;
use crate::domain::policy::{RecoveryLimits, RetryPolicy};
// The flags' units, used by their readers too.
pub use crate::units::{parse_duration, parse_rate_limit, RateLimit};

/// A Replicate setting from the environment, for `--ai-provider replicate`
/// without a providers file.
fn replicate_env(name: &str, kind: ProviderKind) -> Option<String> {
    (kind == ProviderKind::Replicate)
        .then(|| std::env::var(name).ok())
        .flatten()
        .filter(|v| !v.trim().is_empty())
}

/// The header trusted proxies write the client's address into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, ...`
    #[value(name = "x-forwarded-for")]
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1, ...` (RFC 7239).
    #[value(name = "forwarded")]
    Forwarded,
}

/// Everything `stagehand serve` needs.
#[derive(Debug, Clone, Args)]
pub struct Config {
    /// Database URL: `sqlite://FILE?mode=rwc` (embedded) or `postgres://...`.
    #[arg(
        long,
        env = "STAGEHAND_DATABASE_URL",
        default_value = "sqlite://stagehand.db?mode=rwc"
    )]
    pub database_url: String,
    /// Address the HTTP server listens on (port 0 picks a free one).
    #[arg(long, env = "STAGEHAND_BIND", default_value = "127.0.0.1:8080")]
    pub bind: String,
    /// Base URL of the AI job API. Unset: the built-in simulator is started
    /// in-process on a loopback port.
    #[arg(long, env = "STAGEHAND_AI_URL")]
    pub ai_url: Option<String>,
    /// The AI provider: `jobs` (the job API at `--ai-url`, or the built-in
    /// simulator) or `openai` (an OpenAI-compatible API at
    /// `--openai-base-url`, with `--openai-api-key`).
    #[arg(
        long,
        env = "STAGEHAND_AI_PROVIDER",
        value_enum,
        default_value = "jobs"
    )]
    pub ai_provider: ProviderKind,
    /// The providers file (TOML): several AI providers, one account each,
    /// with the account's `max_in_flight` shared by every experience on it
    /// (see `crate::ai::providers`). Unset: one provider `default` from
    /// `--ai-url` / `--ai-provider` and `--ai-rate-limit`.
    #[arg(long, env = "STAGEHAND_PROVIDERS")]
    pub providers: Option<std::path::PathBuf>,
    /// Base URL of the OpenAI-compatible API (a trailing `/v1` is dropped).
    #[arg(long, env = "STAGEHAND_OPENAI_BASE_URL", default_value = openai::DEFAULT_BASE_URL)]
    pub openai_base_url: String,
    /// Bearer key of the OpenAI-compatible API. Prefer the environment
    /// variable: a flag is visible to other users of the machine. Never
    /// logged, never shown by `--help` or `Debug`. Unset: no
    /// `Authorization` header (local compatible servers).
    #[arg(long, env = "STAGEHAND_OPENAI_API_KEY", hide_env_values = true, value_parser = parse_api_key)]
    pub openai_api_key: Option<ApiKey>,
    /// Chat model, for text kinds (`video`, `music`, ...) and `score`.
    #[arg(long, env = "STAGEHAND_OPENAI_CHAT_MODEL", default_value = openai::DEFAULT_CHAT_MODEL)]
    pub openai_chat_model: String,
    /// Image model, for `comic` and `image`.
    #[arg(long, env = "STAGEHAND_OPENAI_IMAGE_MODEL", default_value = openai::DEFAULT_IMAGE_MODEL)]
    pub openai_image_model: String,
    /// Size of generated images.
    #[arg(long, env = "STAGEHAND_OPENAI_IMAGE_SIZE", default_value = openai::DEFAULT_IMAGE_SIZE)]
    pub openai_image_size: String,
    /// Bound of one OpenAI-compatible call (capped by `--ai-timeout`);
    /// past it the outcome is unclear and the call is retried, not counted.
    #[arg(long, env = "STAGEHAND_OPENAI_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub openai_timeout: Duration,
    /// Bearer token of operators. Unset: one is generated and printed once.
    #[arg(long, env = "STAGEHAND_OPERATOR_TOKEN")]
    pub operator_token: Option<String>,
    /// Bearer token that opens `GET /metrics` (the operator token opens it
    /// too). Unset: only the operator token.
    #[arg(long, env = "STAGEHAND_METRICS_TOKEN")]
    pub metrics_token: Option<String>,
    /// A second address serving only `GET /metrics`, without a token (for
    /// a Prometheus on a private network). Unset: none.
    #[arg(long, env = "STAGEHAND_METRICS_BIND")]
    pub metrics_bind: Option<String>,
    /// Safety-net period of the dispatcher (it is also woken on submit).
    #[arg(long, env = "STAGEHAND_POLL_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub poll_interval: Duration,
    /// How long a claimed saga stays owned without renewal.
    #[arg(long, env = "STAGEHAND_LEASE", default_value = "60s", value_parser = parse_duration)]
    pub lease: Duration,
    /// Period of the cleanup actor.
    #[arg(long, env = "STAGEHAND_CLEANUP_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub cleanup_interval: Duration,
    /// On SIGTERM or SIGINT, how long running sagas may go on before
    /// what is left is handed over to another instance (which resumes it
    /// at once, without using up a recovery). Set the orchestrator's kill
    /// timeout above this plus a few seconds.
    #[arg(long, env = "STAGEHAND_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Bound of one AI attempt, from submit to a final job status.
    #[arg(long, env = "STAGEHAND_AI_TIMEOUT", default_value = "7m", value_parser = parse_duration)]
    pub ai_timeout: Duration,
    /// How often a running AI job is polled.
    #[arg(long, env = "STAGEHAND_AI_POLL_INTERVAL", default_value = "500ms", value_parser = parse_duration)]
    pub ai_poll_interval: Duration,
    /// Counted AI attempts before a saga aborts.
    #[arg(long, env = "STAGEHAND_MAX_ATTEMPTS", default_value_t = 3)]
    pub max_attempts: u32,
    /// Times a saga is resumed after a lost lease before it is ORPHANED.
    #[arg(long, env = "STAGEHAND_MAX_RECOVERIES", default_value_t = 2)]
    pub max_recoveries: u32,
    /// Time from submission after which an unowned saga is ORPHANED.
    #[arg(long, env = "STAGEHAND_SAGA_DEADLINE", default_value = "15m", value_parser = parse_duration)]
    pub saga_deadline: Duration,
    /// First retry delay after an AI failure (doubles, with jitter).
    #[arg(long, env = "STAGEHAND_BACKOFF_BASE", default_value = "1s", value_parser = parse_duration)]
    pub backoff_base: Duration,
    /// Cap of the retry delay.
    #[arg(long, env = "STAGEHAND_BACKOFF_MAX", default_value = "60s", value_parser = parse_duration)]
    pub backoff_max: Duration,
    /// Database connections for HTTP requests.
    #[arg(long, env = "STAGEHAND_DB_POOL", default_value_t = 10)]
    pub db_pool: u32,
    /// Database connections for saga work and display streams, a pool apart
    /// so that saga work never starves the HTTP requests.
    #[arg(long, env = "STAGEHAND_WORKER_DB_POOL", default_value_t = 10)]
    pub worker_db_pool: u32,
    /// Requests to the AI provider (submits and polls together), shared by
    /// every saga of every instance: `N/<period>` like `600/min`, or `off`.
    /// Set it to the AI account's quota so a burst of participants never
    /// exceeds it; a request over it is not sent and its saga waits.
    #[arg(long, env = "STAGEHAND_AI_RATE_LIMIT", default_value = "off", value_parser = parse_rate_limit)]
    pub ai_rate_limit: RateLimit,
    /// How long the AI provider's circuit breaker stays open after 5
    /// unavailable answers in a row, before one saga probes it.
    #[arg(long, env = "STAGEHAND_BREAKER_COOL_DOWN", default_value = "30s", value_parser = parse_duration)]
    pub breaker_cool_down: Duration,
    /// How long a request's statement waits on a lock held elsewhere
    /// (PostgreSQL `lock_timeout`, SQLite `busy_timeout`) before it is
    /// retried (3 times, with backoff) and then answered 503 `busy` with
    /// `Retry-After`.
    #[arg(long, env = "STAGEHAND_DB_LOCK_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub db_lock_timeout: Duration,
    /// Ping period of booth display sockets; a display silent for three
    /// periods is dropped and shown offline.
    #[arg(long, env = "STAGEHAND_DISPLAY_HEARTBEAT", default_value = "5s", value_parser = parse_duration)]
    pub display_heartbeat: Duration,
    /// Base URL participants' phones reach this server at, encoded in the
    /// booth QR codes (`{PUBLIC_URL}/p/{slug}?terminal={id}`). Unset:
    /// `http://` and the bind address, which only works on this machine or
    /// when the bind address is the LAN address.
    #[arg(long, env = "STAGEHAND_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Where media (uploaded photos, kept results) lives: `s3://bucket`
    /// (endpoint, region and credentials from the `AWS_*` environment),
    /// `file:///path` or a folder's path. Unset: a folder beside the SQLite
    /// file (`stagehand-media`). Several instances need one shared place.
    #[arg(long, env = "STAGEHAND_MEDIA_URL")]
    pub media_url: Option<String>,
    /// The server's own secret, which signs the media URLs providers get
    /// (at least 32 characters, such as `openssl rand -hex 32`). Never
    /// stored in the database, never logged. Prefer the environment or
    /// `--secret-file`: a flag is visible to other users of the machine.
    /// Every instance of one database needs the same one. Unset: read from
    /// `--secret-file`.
    #[arg(long, env = "STAGEHAND_SECRET", hide_env_values = true, value_parser = parse_server_secret)]
    pub secret: Option<ServerSecret>,
    /// The file that holds the server's secret (made with a new random
    /// one, readable by its owner only, when missing). Unset:
    /// `<name>.secret` beside the SQLite file, or `stagehand.secret` in
    /// the working folder. Keep it out of copies of the database.
    #[arg(long, env = "STAGEHAND_SECRET_FILE")]
    pub secret_file: Option<std::path::PathBuf>,
    /// The largest photo upload taken, in bytes; a bigger body is 413
    /// before it is read whole.
    #[arg(long, env = "STAGEHAND_MAX_PHOTO_BYTES", default_value_t = 10 * 1024 * 1024)]
    pub max_photo_bytes: u64,
    /// The largest result file kept, in bytes; a bigger one fails the
    /// attempt.
    #[arg(long, env = "STAGEHAND_MAX_RESULT_BYTES", default_value_t = 50 * 1024 * 1024)]
    pub max_result_bytes: u64,
    /// Photos decoded at once (uploads, thumbnails), off the HTTP workers
    /// and below their CPU priority. Each holds at most one decoded photo
    /// (about 200 MB for the largest taken); default: one fewer than the
    /// cores (at least one), so on two cores or more a burst of uploads
    /// never holds every core.
    #[arg(long, env = "STAGEHAND_PHOTO_WORKERS")]
    pub photo_workers: Option<usize>,
    /// Uploads that may wait for a photo worker; past them an upload is
    /// 503 with Retry-After.
    #[arg(long, env = "STAGEHAND_PHOTO_QUEUE", default_value_t = 16)]
    pub photo_queue: usize,
    /// Memory the photo pool's running jobs may hold at once, in bytes,
    /// whatever the number of workers: each job reserves its image's peak
    /// (decoded buffer at its bit depth, conversion, output) before it
    /// decodes, and waits while the others hold too much. Uploads may use
    /// three quarters; the last quarter is kept for the thumbnails of
    /// results. One image may take at most 512 MiB (and at most its
    /// lane's share).
    #[arg(long, env = "STAGEHAND_PHOTO_MEMORY", default_value_t = 1024 * 1024 * 1024)]
    pub photo_memory: u64,
    /// The longest a photo upload's body may take to arrive, from its
    /// first byte to its last; past it the upload is 408 `upload_too_slow`
    /// (the phone page gives up after 120 s too).
    #[arg(long, env = "STAGEHAND_UPLOAD_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub upload_timeout: Duration,
    /// The slowest a photo upload's body may arrive on average, in bytes a
    /// second, once `--upload-grace` has passed (408 `upload_too_slow`
    /// below it). 2 KiB/s is far below a phone on a crowded venue Wi-Fi,
    /// and far above a connection held open a byte at a time.
    #[arg(long, env = "STAGEHAND_UPLOAD_MIN_RATE", default_value_t = 2048)]
    pub upload_min_rate: u64,
    /// How long an upload's body may arrive at any pace before
    /// `--upload-min-rate` applies (a phone's radio waking up).
    #[arg(long, env = "STAGEHAND_UPLOAD_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub upload_grace: Duration,
    /// Photo uploads per client address, like `--session-rate-limit`: a
    /// venue's phones may share one address, so the default lets a crowd
    /// through and stops a script.
    #[arg(long, env = "STAGEHAND_UPLOAD_RATE_LIMIT", default_value = "600/min", value_parser = parse_rate_limit)]
    pub upload_rate_limit: RateLimit,
    /// A photo uploaded but never named by a submission is deleted after
    /// this long.
    #[arg(long, env = "STAGEHAND_PHOTO_ORPHAN_TTL", default_value = "1h", value_parser = parse_duration)]
    pub photo_orphan_ttl: Duration,
    /// How long the operators' audit trail is kept (longer than the
    /// guests' data, so the organiser can say who did what to it).
    #[arg(long, env = "STAGEHAND_AUDIT_RETENTION", default_value = "400d", value_parser = parse_duration)]
    pub audit_retention: Duration,
    /// Sagas this instance drives at once at most. When it is full, its
    /// dispatcher claims nothing more and other instances take the work.
    #[arg(long, env = "STAGEHAND_MAX_RUNNING", default_value_t = 1000)]
    pub max_running: u32,
    /// Session creations per client address (`POST
    /// /api/experiences/{slug}/sessions`): `N/<period>` (`600/min`, `10/s`,
    /// `5/90s`) or `off`. A whole venue's Wi-Fi, or a carrier's NAT, can be
    /// one address, so the default lets a crowd through and stops a script.
    #[arg(long, env = "STAGEHAND_SESSION_RATE_LIMIT", default_value = "600/min", value_parser = parse_rate_limit)]
    pub session_rate_limit: RateLimit,
    /// Submissions per session and token (`POST
    /// /api/sessions/{id}/submission`), like `--session-rate-limit`. A
    /// participant submits once, and again after an abort or a lost answer.
    #[arg(long, env = "STAGEHAND_SUBMISSION_RATE_LIMIT", default_value = "30/min", value_parser = parse_rate_limit)]
    pub submission_rate_limit: RateLimit,
    /// PINs checked against one PIN gallery, over every client address
    /// and instance (`N/<period>`): the N-th locks the gallery for the
    /// period, and until it ends every PIN answer is 429, the right PIN's
    /// too. `off`: no ceiling (only the per-address limit).
    #[arg(long, env = "STAGEHAND_GALLERY_PIN_GUESSES", default_value = "50/30m", value_parser = parse_rate_limit)]
    pub gallery_pin_guesses: RateLimit,
    /// Keys each rate limiter tracks at most (client addresses, sessions).
    /// When full, new keys share one bucket until old ones expire.
    #[arg(long, env = "STAGEHAND_RATE_LIMIT_KEYS", default_value_t = 100_000)]
    pub rate_limit_keys: usize,
    /// Reverse proxies in front of this server that append the client's
    /// address to `X-Forwarded-For`. 0 (the default): the header is
    /// ignored and the client is the peer address, because any client can
    /// write the header. N: the client is the N-th address from the right.
    #[arg(long, env = "STAGEHAND_TRUSTED_PROXIES", default_value_t = 0)]
    pub trusted_proxies: u8,
    /// The header the trusted proxies append the client's address to:
    /// `x-forwarded-for` (the default; nginx, most load balancers) or
    /// `forwarded` (RFC 7239, its `for=`). The other header is the
    /// client's own words and is never read.
    #[arg(
        long,
        env = "STAGEHAND_TRUSTED_PROXY_HEADER",
        value_enum,
        default_value = "x-forwarded-for"
    )]
    pub trusted_proxy_header: ProxyHeader,
    /// OpenTelemetry collector to send traces to, over OTLP/HTTP
    /// (protobuf): its base URL, like `http://collector:4318` (spans go to
    /// `/v1/traces` under it; a URL already ending in `/v1/traces` is used
    /// as it is). Unset: no traces, and nothing is spent on them.
    #[arg(long, env = "STAGEHAND_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// How long finished spans wait to be sent in one batch. Unset: the
    /// OpenTelemetry default (5s, or `OTEL_BSP_SCHEDULE_DELAY` in ms).
    #[arg(long, env = "STAGEHAND_OTLP_BATCH_DELAY", value_parser = parse_duration)]
    pub otlp_batch_delay: Option<Duration>,
    /// Let webhook endpoints be on loopback, private and link-local
    /// addresses (`1`, `true`): for tests and on-premise setups. Off, such
    /// an endpoint is refused and every delivery resolves through public
    /// addresses only.
    #[arg(
        long,
        env = "STAGEHAND_WEBHOOK_ALLOW_PRIVATE",
        default_value = "false",
        value_parser = clap::builder::BoolishValueParser::new(),
        action = clap::ArgAction::Set
    )]
    pub webhook_allow_private: bool,
    /// A webhook endpoint whose deliveries have failed, with no success,
    /// for this long is disabled (its deliveries wait; /ops shows it).
    #[arg(long, env = "STAGEHAND_WEBHOOK_DISABLE_AFTER", default_value = "24h", value_parser = parse_duration)]
    pub webhook_disable_after: Duration,
    /// The SMTP server mail to guests goes through: `smtp://host:port`
    /// (plain, for a relay on the venue's own network),
    /// `smtp://host:587?tls=required` (STARTTLS) or `smtps://host:465`
    /// (TLS). Unset: guests cannot ask for mail. Credentials come from
    /// `STAGEHAND_SMTP_USERNAME` and `STAGEHAND_SMTP_PASSWORD` (or the
    /// URL's user part); none of them is stored or logged.
    #[arg(long, env = "STAGEHAND_SMTP_URL", hide_env_values = true)]
    pub smtp_url: Option<String>,
    #[arg(long, env = "STAGEHAND_SMTP_USERNAME", hide_env_values = true)]
    pub smtp_username: Option<String>,
    #[arg(long, env = "STAGEHAND_SMTP_PASSWORD", hide_env_values = true)]
    pub smtp_password: Option<String>,
    /// The sender of mail to guests: `Booth <booth@example.com>` or an
    /// address. Needed with `--smtp-url`.
    #[arg(long, env = "STAGEHAND_MAIL_FROM")]
    pub mail_from: Option<String>,
    /// Mail requests per client address, like `--session-rate-limit`:
    /// guests behind one venue network share it.
    #[arg(long, env = "STAGEHAND_MAIL_RATE_LIMIT", default_value = "120/h", value_parser = parse_rate_limit)]
    pub mail_rate_limit: RateLimit,
    /// Mails to one address in an hour, across every session.
    #[arg(long, env = "STAGEHAND_MAILS_PER_ADDRESS", default_value = "5")]
    pub mails_per_address: u32,
}

impl Config {
    /// The defaults, as `stagehand serve` with no flags and no environment.
    pub fn defaults() -> Config {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            config: Config,
        }
        <Wrapper as clap::Parser>::parse_from(["stagehand"]).config
    }

    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts.max(1),
            backoff_base_ms: self.backoff_base.as_millis() as i64,
            backoff_max_ms: self.backoff_max.as_millis() as i64,
        }
    }

    pub fn recovery_limits(&self) -> RecoveryLimits {
        RecoveryLimits {
            max_recoveries: self.max_recoveries,
        }
    }

    /// [`Config::public_url`] without a trailing slash, or the bind
    /// address with the port actually bound.
    pub fn public_base_url(&self, port: u16) -> String {
        match &self.public_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => {
                let host = self.bind.rsplit_once(':').map_or("127.0.0.1", |(h, _)| h);
                let host = if host == "0.0.0.0" || host == "[::]" {
                    "127.0.0.1"
                } else {
                    host
                };
                format!("http://{host}:{port}")
            }
        }
    }

    pub fn lease_ms(&self) -> i64 {
        self.lease.as_millis() as i64
    }

    /// The providers: the providers file's, or the one `default` provider
    /// of `--ai-url` / `--ai-provider` (no shared cap: each experience's own
    /// `max_in_flight` is its only limit, as before providers existed).
    pub fn provider_specs(&self) -> Result<Vec<ProviderSpec>, ProvidersFileError> {
        if let Some(path) = &self.providers {
            return providers::load(path);
        }
        Ok(vec![ProviderSpec {
            name: providers::DEFAULT_PROVIDER.to_owned(),
            kind: self.ai_provider,
            url: match self.ai_provider {
                ProviderKind::Openai => Some(self.openai_base_url.clone()),
                _ => self.ai_url.clone(),
            },
            max_in_flight: None,
            rate_limit: self.ai_rate_limit,
            // `--ai-provider replicate` without a providers file: the
            // adapter's usual variables.
            api_key_env: (self.ai_provider == ProviderKind::Replicate
                && std::env::var_os("REPLICATE_API_TOKEN").is_some())
            .then(|| "REPLICATE_API_TOKEN".to_owned()),
            model: replicate_env("REPLICATE_MODEL", self.ai_provider),
            version: replicate_env("REPLICATE_VERSION", self.ai_provider),
            chat_model: None,
            image_model: None,
            image_size: None,
            result_origins: Vec::new(),
            photo_input: None,
        }])
    }

    /// Where traces go, when they are on (`--otlp-endpoint`).
    pub fn otlp_settings(&self) -> Option<crate::telemetry::OtlpSettings> {
        let endpoint = self.otlp_endpoint.as_deref()?.trim();
        (!endpoint.is_empty()).then(|| crate::telemetry::OtlpSettings {
            endpoint: endpoint.to_owned(),
            batch_delay: self.otlp_batch_delay,
        })
    }

    /// The OpenAI-compatible adapter's settings (`--ai-provider openai`).
    pub fn openai_settings(&self) -> OpenAiSettings {
        OpenAiSettings {
            base_url: self.openai_base_url.clone(),
            api_key: self.openai_api_key.clone(),
            chat_model: self.openai_chat_model.clone(),
            image_model: self.openai_image_model.clone(),
            image_size: self.openai_image_size.clone(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: self.openai_timeout.min(self.ai_timeout),
        }
    }
}

fn parse_api_key(s: &str) -> Result<ApiKey, String> {
    s.parse()
}

fn parse_server_secret(s: &str) -> Result<ServerSecret, String> {
    s.parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_rate_limits() {
        let every = |count: u32, secs: u64| RateLimit::Every {
            count: std::num::NonZeroU32::new(count).unwrap(),
            per: Duration::from_secs(secs),
        };
        let config = Config::defaults();
        assert_eq!(config.session_rate_limit, every(600, 60));
        assert_eq!(config.submission_rate_limit, every(30, 60));
        assert_eq!(config.trusted_proxies, 0);
        assert_eq!(config.trusted_proxy_header, ProxyHeader::XForwardedFor);
        assert_eq!(config.gallery_pin_guesses, every(50, 1800));
    }

    #[test]
    fn the_openai_key_is_never_shown() {
        let config = <Wrapper as clap::Parser>::parse_from([
            "stagehand",
            "--ai-provider",
            "openai",
            "--openai-api-key",
            "sk-config-SECRET-42",
        ])
        .config;
        assert_eq!(config.ai_provider, ProviderKind::Openai);
        let shown = format!("{config:?} {:?}", config.openai_settings());
        assert!(!shown.contains("sk-config-SECRET-42"), "{shown}");
        let command = <Wrapper as clap::CommandFactory>::command();
        let key = command
            .get_arguments()
            .find(|a| a.get_id() == "openai_api_key")
            .expect("the key flag");
        assert!(key.is_hide_env_values_set(), "--help would show the key");
        let defaults = Config::defaults();
        assert_eq!(defaults.ai_provider, ProviderKind::Jobs);
        assert_eq!(
            defaults.openai_settings().request_timeout,
            Duration::from_secs(120)
        );
    }

    #[derive(clap::Parser)]
    struct Wrapper {
        #[command(flatten)]
        config: Config,
    }

    #[test]
    fn public_url_defaults_to_the_bound_address() {
        let mut config = Config::defaults();
        config.bind = "0.0.0.0:0".into();
        assert_eq!(config.public_base_url(8123), "http://127.0.0.1:8123");
        config.public_url = Some("https://booth.example.org/".into());
        assert_eq!(config.public_base_url(8123), "https://booth.example.org");
    }
}
