//! The AI providers of this instance, by name: for each, the AiActor that
//! talks to it, its circuit breaker and its configuration. Built once at
//! start from the providers file (or the one `default` provider) and
//! shared, read-only, by the dispatcher (admission per provider), the
//! supervisors (which provider a saga's calls go to) and the slot
//! adopter. Not an actor: a map of addresses.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::Addr;

use super::ai::AiActor;
use super::breaker::ProviderBreaker;
use crate::ai::providers::ProviderSpec;

/// One provider: its spec, its AiActor and its breaker.
#[derive(Clone)]
pub struct ProviderHandle {
    pub spec: ProviderSpec,
    /// How long after its last send no job of a key can run, when the
    /// provider promises it (`AiProvider::jobs_end_within_ms`).
    pub jobs_end_within_ms: Option<i64>,
    /// Whether a job can be looked for without making one
    /// (`AiProvider::can_look`).
    pub can_look: bool,
    pub ai: Addr<AiActor>,
    pub breaker: Arc<ProviderBreaker>,
}

/// Every provider of this instance, by name.
#[derive(Clone, Default)]
pub struct Providers(Arc<BTreeMap<String, ProviderHandle>>);

impl Providers {
    pub fn new(handles: impl IntoIterator<Item = ProviderHandle>) -> Providers {
        Providers(Arc::new(
            handles
                .into_iter()
                .map(|h| (h.spec.name.clone(), h))
                .collect(),
        ))
    }

    pub fn get(&self, name: &str) -> Option<&ProviderHandle> {
        self.0.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &ProviderHandle> {
        self.0.values()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}
