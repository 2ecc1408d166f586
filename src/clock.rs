//! The injectable wall clock. Everything that stamps or compares times in the
//! database asks a [`Clock`]; tests use [`ManualClock`] to move time by hand
//! instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use crate::domain::policy::EpochMs;

pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> EpochMs;
}

pub type SharedClock = Arc<dyn Clock>;

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> EpochMs {
        chrono::Utc::now().timestamp_millis()
    }
}

/// A clock that only moves when told to.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    pub fn new(start: EpochMs) -> Arc<Self> {
        Arc::new(ManualClock {
            now: AtomicI64::new(start),
        })
    }

    pub fn advance_ms(&self, ms: i64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    pub fn set(&self, now: EpochMs) {
        self.now.store(now, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> EpochMs {
        self.now.load(Ordering::SeqCst)
    }
}

/// RFC 3339 UTC text of a stored time, as the API shows it.
pub fn rfc3339(ms: EpochMs) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Serde: a stored time as RFC 3339 text (`#[serde(serialize_with)]`).
pub fn serialize_rfc3339<S: serde::Serializer>(ms: &EpochMs, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(*ms))
}

/// Serde: an optional stored time as RFC 3339 text or null.
pub fn serialize_rfc3339_opt<S: serde::Serializer>(
    ms: &Option<EpochMs>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match ms {
        Some(ms) => s.serialize_str(&rfc3339(*ms)),
        None => s.serialize_none(),
    }
}
