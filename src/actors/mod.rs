//! The runtime: actors move work, the database holds the truth. Any actor, or
//! the whole process, may vanish; the rows say where everything stands.
//!
//! One file per actor, its messages declared at the top of the file:
//! - [`dispatcher::Dispatcher`]: the queue; claims runnable sagas under each
//!   provider's cap and each experience's ceiling, sharing a provider's
//!   slots by weight, and starts a supervisor per saga.
//! - [`saga_supervisor::SagaSupervisor`]: drives one saga step by step and
//!   renews its lease while it waits.
//! - [`ai::AiActor`]: talks to one AI provider (one per provider); its
//!   breaker and rate limit write their shared rows.
//! - [`adopter::SlotAdopter`]: sees to their end the jobs of the slot
//!   ledger whose owner is gone, and frees their slots when they end.
//! - [`review::ReviewActor`]: the operators' review: adopts approved
//!   sagas for a worker, and applies review timeouts on time.
//! - [`ranking::RankingActor`]: registers scores, idempotently per session.
//! - [`persistence::PersistenceActor`]: the short fenced transactions; pushes
//!   terminal events after they commit.
//! - [`cleanup::CleanupActor`]: ends what nobody owns any more.
//! - [`outbox_relay::OutboxRelay`]: numbers committed outbox events in
//!   batches and rings the displays that have news.
//! - [`terminal_hub::TerminalHub`] and [`terminal_socket::TerminalSocket`]:
//!   each display streams its terminal's outbox at its own pace; the hub
//!   only rings.
//! - [`ranking_board::RankingBoard`]: turns ranking changes into throttled
//!   top-10 frames for the displays.
//! - [`operator_hub::OperatorHub`] and [`operator_socket::OperatorSocket`]:
//!   the operators' live `stats` frames, a snapshot each.
//! - [`cluster::ClusterBridge`] (PostgreSQL): carries wake-ups between
//!   instances with LISTEN/NOTIFY.
//! - [`print_queue::PrintQueue`]: sends prints to the printers, never
//!   twice, and keeps each printer's state for /ops.
//!
//! [`wakeups`] is not an actor, nor is [`providers`], the map of the
//! providers' actors and breakers: the doorbells committers ring after commit;
//! nor is [`heartbeat`], the sockets' ping and pong bookkeeping, nor
//! [`shutdown`], the flag that closes sockets when the instance stops.

pub mod adopter;
pub mod ai;
pub mod batching;
pub mod breaker;
pub mod cleanup;
pub mod cluster;
pub mod dispatcher;
pub mod heartbeat;
pub mod liveness;
pub mod mail_sender;
pub mod operator_hub;
pub mod operator_socket;
pub mod outbox_relay;
pub mod persistence;
pub mod print_queue;
pub mod providers;
pub mod ranking;
pub mod ranking_board;
pub mod review;
pub mod saga_supervisor;
pub mod shutdown;
pub mod terminal_hub;
pub mod terminal_socket;
pub mod wakeups;
pub mod webhook_sender;

/// Runs an actor's endless loop that holds database connections as a task
/// of the runtime rather than of the actor's local set (sqlx must drop a
/// connection inside the runtime, and a local set may be dropped outside
/// it), while the actor stays alive for as long as the loop runs. Abort it
/// with the handle when the actor stops.
pub(crate) fn run_on_runtime<A, F>(ctx: &mut actix::Context<A>, work: F) -> tokio::task::AbortHandle
where
    A: actix::Actor<Context = actix::Context<A>>,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    use actix::AsyncContext;
    crate::metrics::task_spawned("actor.loop");
    let task = tokio::spawn(work);
    let abort = task.abort_handle();
    ctx.spawn(actix::fut::wrap_future(async move {
        let _ = task.await;
    }));
    abort
}

/// Spawns `work` on the runtime when one is running here; when the runtime
/// is already shutting down (an actor stopping with it), the work is
/// skipped: what it would have written (presence, progress) expires or is
/// rewritten by the next owner.
pub(crate) fn spawn_if_running<F>(work: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(work);
    }
}
