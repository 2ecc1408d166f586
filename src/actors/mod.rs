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
//! - [`terminal_hub::TerminalHub`] and [`terminal_socket::TerminalSocket`]:
//!   live pushes to booth displays.

pub mod ai;
pub mod cleanup;
pub mod dispatcher;
pub mod persistence;
pub mod ranking;
pub mod saga_supervisor;
pub mod terminal_hub;
pub mod terminal_socket;
