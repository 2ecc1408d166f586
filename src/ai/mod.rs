//! The AI side of stagehand: clients for the AI provider's job API (submit a
//! job, poll it) and the built-in simulator of that same API, which
//! `stagehand sim-ai` serves, `stagehand serve` starts in-process when no AI URL
//! is configured, and tests use as the fake provider.
//!
//! Every outside error of a provider becomes a
//! [`AiFailure`](crate::domain::failure::AiFailure) in `client`, and nowhere else.

pub mod client;
pub mod simulator;

pub use client::{AiClient, JobOrder, JobStatus, JobView};
pub use simulator::{RunningSim, SimConfig, SimControl, SimStats};
