//! The pure core: saga steps and transitions, lease checks, failure kinds,
//! retry and recovery policy, the provider's circuit breaker, AI key
//! derivation, the locale tables, and the admission of a submission
//! (credits, queue estimate, closing time), and how a provider's slots are
//! shared among its experiences, when a slot of the ledger may be freed,
//! and the operators' review decisions, roles and audit records, and the
//! event's brand (placement, surfaces, caption, rendition keys). No I/O, no clock: every
//! function is given `now`.
pub mod admission;
pub mod audit;
pub mod brand;
pub mod breaker;
pub mod failure;
pub mod guests;
pub mod keys;
pub mod ledger;
pub mod locale;
pub mod mail;
pub mod markup;
pub mod media;
pub mod policy;
pub mod presence;
pub mod print;
pub mod review;
pub mod roles;
pub mod saga;
pub mod session;
pub mod sharing;
pub mod webhook;
