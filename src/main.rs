//! The `stagehand` command: `serve`, `migrate`, `sim-ai`, `bench`,
//! `rehearse`, and the log format they share.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

use stagehand::ai::simulator::{self, SimConfig, SimControl};
use stagehand::config::Config;
use stagehand::startup::Application;
use stagehand::store::{claim_cost, Store};
use stagehand::telemetry::Tracing;
use stagehand::units::parse_duration;

/// mimalloc instead of glibc's malloc: flat out, glibc's malloc and free
/// took about a quarter of the server's CPU (its arenas and chunk
/// consolidation, under many threads allocating small buffers);
/// docs/BENCHMARKS.md has the figures side by side.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "stagehand",
    version,
    about = "Backstage server for AI-powered experiences at live events"
)]
struct Cli {
    /// How log lines are written: `text` for people, `json` (one object
    /// per line, with the span fields) for log collectors.
    #[arg(
        long,
        global = true,
        env = "STAGEHAND_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

// Parsed once at start: boxing the large `Config` would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the server (migrates the database first).
    Serve(Config),
    /// Apply pending database migrations and exit.
    Migrate {
        #[arg(
            long,
            env = "STAGEHAND_DATABASE_URL",
            default_value = "sqlite://stagehand.db?mode=rwc"
        )]
        database_url: String,
    },
    /// Run the AI provider simulator.
    SimAi {
        #[arg(long, default_value = "127.0.0.1:9090")]
        bind: String,
        /// Time from job creation until it finishes (the median, with
        /// `--latency-p99`).
        #[arg(long, default_value = "2s", value_parser = parse_duration)]
        latency: Duration,
        /// Spread job times: log-normal with `--latency` as the median and
        /// this as the 99th percentile.
        #[arg(long, value_parser = parse_duration)]
        latency_p99: Option<Duration>,
        /// Prompts containing this word are refused by "moderation".
        #[arg(long, default_value = "forbidden")]
        reject_word: String,
        /// Share of jobs that end `failed`.
        #[arg(long, default_value_t = 0.0)]
        fail_rate: f64,
        /// Share of requests answered 503.
        #[arg(long, default_value_t = 0.0)]
        unavailable_rate: f64,
        /// Play a provider without cancel: `POST /v1/jobs/{id}/cancel`
        /// answers 405.
        #[arg(long)]
        refuse_cancel: bool,
        /// Delete each output this long after its job ended (e.g. `1h`, as
        /// Replicate does): its image URL then answers 404 while the job
        /// still answers. Default: kept as long as the job.
        #[arg(long, value_parser = parse_duration)]
        delete_outputs_after: Option<Duration>,
    },
    /// The store's own claim cost against queue length on the database at
    /// `--database-url` (what `stagehand bench` runs for its claim-cost
    /// table): prints the timed rounds as JSON on stdout, the plans on
    /// stderr. Fills the database with test sagas: give it a scratch one.
    #[command(hide = true)]
    ClaimCost {
        #[arg(long)]
        database_url: String,
        /// Timed rounds per queue length.
        #[arg(long, default_value_t = 30)]
        rounds: usize,
        /// Queue lengths, ascending.
        #[arg(long, value_delimiter = ',', default_values_t = [1_000i64, 100_000])]
        sizes: Vec<i64>,
        /// Ranking entries ranked at once in the rank cost.
        #[arg(long, default_value_t = 32)]
        rank_batch: u64,
    },
    /// What the event's outputs cost in CPU (the brand on a 1024² and a
    /// 2048² result, a print's preparation): prints the rounds as JSON
    /// (what `stagehand bench` runs for its outputs table).
    #[command(hide = true)]
    OutputCost {
        #[arg(long, default_value_t = 20)]
        rounds: usize,
    },
    /// Measure the server as a user runs it (subprocesses on 127.0.0.1) and
    /// print one table.
    Bench(stagehand_bench::BenchArgs),
    /// Replay a synthetic event day against a server (a given URL, or an
    /// embedded one with the simulator) and print what an event team needs
    /// to know before doors open.
    Rehearse(stagehand_bench::rehearse::RehearseArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Traces (`serve` with --otlp-endpoint): the exporter is built here,
    // outside the runtime, and flushed after the runtime ends.
    let otlp = match &cli.command {
        Command::Serve(config) => config.otlp_settings(),
        _ => None,
    };
    let (tracing_export, otel_layer) = match otlp.map(|s| Tracing::start(&s)).transpose() {
        Ok(Some((tracing, layer))) => (Some(tracing), Some(layer)),
        Ok(None) => (None, None),
        Err(e) => {
            eprintln!("stagehand: {e}");
            return ExitCode::FAILURE;
        }
    };
    // RUST_LOG filters the log lines only: traces take stagehand's spans
    // at INFO whatever it says.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal, not in files or collectors.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let subscriber = tracing_subscriber::registry().with(otel_layer);
    match cli.log_format {
        LogFormat::Text => subscriber
            .with(fmt::layer().with_ansi(ansi).with_filter(filter))
            .init(),
        LogFormat::Json => subscriber
            .with(
                fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(true)
                    .with_filter(filter),
            )
            .init(),
    }
    if let Some(tracing_export) = &tracing_export {
        tracing::info!(endpoint = %tracing_export.url(), "traces are sent over OTLP/HTTP (protobuf)");
    }
    let command = match cli.command {
        Command::Rehearse(args) => {
            return actix_web::rt::System::new().block_on(async move {
                match stagehand_bench::rehearse::run(args).await {
                    Ok(verdict) if verdict.go() => ExitCode::SUCCESS,
                    Ok(_) => ExitCode::from(REHEARSAL_NO_GO),
                    Err(e) => {
                        eprintln!("stagehand: {e}");
                        ExitCode::from(REHEARSAL_FAILED)
                    }
                }
            })
        }
        command => command,
    };
    let outcome = actix_web::rt::System::new().block_on(async move {
        match command {
            Command::Serve(config) => serve(config).await,
            Command::Migrate { database_url } => {
                let store = Store::connect(&database_url, 2)
                    .await
                    .map_err(|e| e.to_string())?;
                store.migrate().await.map_err(|e| e.to_string())?;
                println!("migrations applied");
                Ok(())
            }
            Command::SimAi {
                bind,
                latency,
                latency_p99,
                reject_word,
                fail_rate,
                unavailable_rate,
                refuse_cancel,
                delete_outputs_after,
            } => {
                let config = SimConfig {
                    latency,
                    reject_word: Some(reject_word).filter(|w| !w.is_empty()),
                    fail_rate,
                    unavailable_rate,
                    refuse_cancel,
                    delete_outputs_after,
                };
                let control = SimControl::new(config);
                control.set_latency_p99(latency_p99);
                let sim = simulator::start(&bind, control)
                    .await
                    .map_err(|e| e.to_string())?;
                println!("AI simulator listening on {}", sim.url());
                wait_for_ctrl_c().await;
                sim.stop().await;
                Ok(())
            }
            Command::ClaimCost {
                database_url,
                rounds,
                sizes,
                rank_batch,
            } => {
                let timings =
                    claim_cost::measure(&database_url, &sizes, rank_batch, rounds).await?;
                let json = serde_json::to_string(&timings).map_err(|e| e.to_string())?;
                println!("{json}");
                Ok(())
            }
            Command::OutputCost { rounds } => {
                let cost = stagehand::print::cost::measure(rounds)?;
                println!(
                    "{}",
                    serde_json::to_string(&cost).map_err(|e| e.to_string())?
                );
                Ok(())
            }
            Command::Bench(args) => stagehand_bench::run(args).await,
            Command::Rehearse(_) => unreachable!("run above"),
        }
    });
    if let Some(tracing_export) = tracing_export {
        tracing_export.shutdown();
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stagehand: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `stagehand rehearse` ran and missed a target, lost a session or saw a
/// display gap (NO-GO), so a deploy script can gate on its exit code.
const REHEARSAL_NO_GO: u8 = 1;
/// `stagehand rehearse` could not run or measure (bad inputs, the server
/// did not start, setup failed): no verdict. Clap's usage errors (an
/// unknown flag, `--target-abort-rate 150%`) exit 2 as well.
const REHEARSAL_FAILED: u8 = 2;

async fn serve(config: Config) -> Result<(), String> {
    let app = Application::build(config)
        .await
        .map_err(|e| e.to_string())?;
    let shutdown = app.shutdown();
    let (server, _simulator) = app.into_server();
    let handle = server.handle();
    let run = actix_web::rt::spawn(server);
    wait_for_ctrl_c().await;
    shutdown.run(handle).await;
    let _ = run.await;
    Ok(())
}

/// Ctrl-C or SIGTERM: the graceful stop ([`stagehand::startup::Shutdown`]).
/// Stopping at any other point (kill -9) is safe too: the database says
/// where every saga stands, and leases expire.
async fn wait_for_ctrl_c() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
