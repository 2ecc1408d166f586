//! The pure core: saga steps and transitions, lease checks, failure kinds,
//! retry and recovery policy, AI key derivation, the locale tables. No I/O, no clock: every
//! function is given `now`.
pub mod failure;
pub mod keys;
pub mod locale;
pub mod policy;
pub mod saga;
pub mod session;
