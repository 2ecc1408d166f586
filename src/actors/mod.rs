//! The runtime: actors move work, the database holds the truth. Any actor, or
//! the whole process, may vanish; the rows say where everything stands.
//!
//! One file per actor, its messages declared at the top of the file:
//! - [`dispatcher::Dispatcher`]: the queue; claims runnable sagas under each
//!   experience's AI capacity and starts a supervisor per saga.
//! - [`saga_supervisor::SagaSupervisor`]: drives one saga step by step and
//!   renews its lease while it waits.
//! - [`ai::AiActor`]: talks to the AI provider; no database access.
//! - [`ranking::RankingActor`]: registers scores, idempotently per session.
//! - [`persistence::PersistenceActor`]: the short fenced transactions; pushes
//!   terminal events after they commit.
//! - [`cleanup::CleanupActor`]: ends what nobody owns any more.
//! - [`outbox_relay::OutboxRelay`]: numbers committed outbox events in
//!   batches and rings the displays that have news.
//! - [`terminal_hub::TerminalHub`] and [`terminal_socket::TerminalSocket`]:
//!   each display streams its terminal's outbox at its own pace; the hub
//!   only rings.
//! - [`cluster::ClusterBridge`] (PostgreSQL): carries wake-ups between
//!   instances with LISTEN/NOTIFY.
//!
//! [`wakeups`] is not an actor: the doorbells committers ring after commit.

pub mod ai;
pub mod batching;
pub mod cleanup;
pub mod cluster;
pub mod dispatcher;
pub mod outbox_relay;
pub mod persistence;
pub mod ranking;
pub mod saga_supervisor;
pub mod terminal_hub;
pub mod terminal_socket;
pub mod wakeups;
