//! stagehand: the backstage server for AI-powered experiences at live events.
//!
//! A participant submits a prompt or a score; the server answers 202 at once
//! and runs a saga per session — external AI call, ranking, persistence —
//! and pushes the outcome to the booth's display. Every saga ends COMPLETED
//! or ABORTED even when processes die; no database connection or row lock is
//! held during external I/O; retries never create a second AI job, ranking
//! entry or terminal event.
//!
//! # Layout
//!
//! The data flow of one submission, with the module that owns each part:
//!
//! ```text
//! http::submissions::submit ── store::submissions (one tx per batch: session SUBMITTING + saga AI_PENDING)
//!        │ 202 + Wake
//!        ▼
//! actors::dispatcher ── store::sagas (claim_for_provider: lease + lock token, slots in store::ledger under the caps)
//!        ▼
//! actors::saga_supervisor (one per saga; renews its lease; domain::policy decides retries)
//!        ├─ actors::ai ── ai::client (job API) or ai::openai (OpenAI-compatible; outside
//!        │                errors -> domain::failure::AiFailure)
//!        ├─ actors::ranking ── store::ranking (one entry per session)
//!        └─ actors::persistence ── store::sagas (fenced transitions; the final tx writes
//!                                   result + session + store::outbox event)
//!                                        ▼
//!                         actors::terminal_hub -> actors::terminal_socket (replay by seq)
//! actors::cleanup ── aborts what nobody owns (ORPHANED), purges old keys and events
//! ```
//!
//! docs/ARCHITECTURE.md draws the whole way (media and review included)
//! and gives the rooms' import rules, which `tests/architecture.rs` checks.
//!
//! - [`domain`]: pure rules (steps, failure kinds, retry/lease/recovery
//!   policy, AI key derivation); given `now`, never reads a clock.
//! - [`store`]: the database, the only source of truth; every SQL statement.
//! - [`actors`]: how work moves; any actor may vanish.
//! - [`ai`]: the provider client and the built-in simulator.
//! - [`http`]: routes, auth, idempotency rules, the one error mapping.
//! - [`media`]: the media store (a folder or S3, over `object_store`).
//! - [`print`]: IPP printing and the print-ready image (the print queue
//!   actor is in `actors`).
//! - [`mail`]: the guest's mail, made and sent over SMTP (the sender
//!   actor is in `actors`, the outbox in `store`).
//! - [`webhooks`]: the organiser's endpoints, judged and sent to, signed
//!   (the sender actor is in `actors`, the outbox in `store`).
//! - [`config`], [`clock`], [`startup`]: flags, the injectable clock, wiring.
//! - [`telemetry`]: traces over OTLP (off unless configured).
//! - [`units`]: durations and rate limits as people type them.
//!
//! The load tools (`stagehand bench`, `stagehand rehearse`) are a crate of
//! their own, `bench/` (`stagehand-bench`), that drives the server only
//! through its command line, HTTP and WebSocket API and metrics.

pub mod actors;
pub mod ai;
pub mod clock;
pub mod config;
pub mod domain;
pub mod http;
pub mod mail;
pub mod media;
pub mod metrics;
pub mod print;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod units;
pub mod webhooks;
