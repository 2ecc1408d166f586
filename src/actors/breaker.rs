//! The AI provider's shared guards, as this process uses them: the request
//! rate limit ([`ProviderRate`], asked before every request) and the circuit
//! breaker. The breaker's two ends in this process: the AI actor reports
//! each call's outcome ([`ProviderBreaker::record`]) and the dispatcher asks
//! what it may claim ([`ProviderBreaker::admission`]). The state is shared
//! through the database (`src/store/breaker.rs`), written only when it
//! changes: when a run of unavailability opens it, when a probe fails, when
//! the provider answers while it may be open. A write runs in a task of its
//! own after the call, never during one; a failed write is logged and the
//! next outcome tries again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::wakeups::Wakeups;
use crate::clock::SharedClock;
use crate::domain::breaker::{Admission, Breaker, UnavailableRun, PROBE_MS};
use crate::domain::failure::AiFailure;
use crate::store::Store;

pub struct ProviderBreaker {
    store: Store,
    clock: SharedClock,
    wakeups: Wakeups,
    provider: String,
    /// How long a run of unavailability opens it for.
    cool_down_ms: i64,
    run: Mutex<UnavailableRun>,
    /// Seen open by this process (so an answer closes it). Only a hint:
    /// the row decides.
    maybe_open: AtomicBool,
}

impl ProviderBreaker {
    pub fn new(
        store: Store,
        clock: SharedClock,
        wakeups: Wakeups,
        provider: &str,
        cool_down: std::time::Duration,
    ) -> Arc<Self> {
        Arc::new(ProviderBreaker {
            store,
            clock,
            wakeups,
            provider: provider.to_owned(),
            cool_down_ms: cool_down.as_millis() as i64,
            run: Mutex::new(UnavailableRun::default()),
            maybe_open: AtomicBool::new(true),
        })
    }

    /// One call's outcome: unavailable or unclear, or the provider answered
    /// (anything else, success or refusal).
    pub fn record<T>(self: &Arc<Self>, outcome: &Result<T, AiFailure>) {
        // An unclear answer (a dropped connection, a cut-short body) is
        // trouble at the provider too.
        let unavailable = matches!(
            outcome,
            Err(failure) if failure.is_unavailable() && failure.retry_after_ms().is_none()
        );
        let opens = {
            let mut run = self.run.lock().unwrap_or_else(|e| e.into_inner());
            if unavailable {
                run.unavailable()
            } else {
                run.answered();
                false
            }
        };
        let now = self.clock.now_ms();
        let me = self.clone();
        if unavailable {
            if opens {
                self.maybe_open.store(true, Ordering::Release);
            } else if !self.maybe_open.load(Ordering::Acquire) {
                return;
            }
            crate::metrics::task_spawned("breaker.write");
            tokio::spawn(async move {
                let until = now + me.cool_down_ms;
                let written = if opens {
                    me.store
                        .open_breaker(&me.provider, until, "unavailable", now)
                        .await
                        .map(|()| 1)
                } else {
                    me.store.probe_failed(&me.provider, until, now).await
                };
                match written {
                    Ok(n) if n > 0 => tracing::warn!(
                        provider = %me.provider, cool_down_ms = me.cool_down_ms,
                        "AI provider unavailable: circuit breaker open, no AI work is claimed for it meanwhile"
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::error!(error = %e, "could not write the circuit breaker"),
                }
            });
        } else if self.maybe_open.swap(false, Ordering::AcqRel) {
            crate::metrics::task_spawned("breaker.write");
            tokio::spawn(async move {
                match me.store.close_breaker(&me.provider, now).await {
                    Ok(n) if n > 0 => {
                        tracing::info!(provider = %me.provider, "AI provider answered: circuit breaker closed");
                        me.wakeups.saga_work();
                    }
                    Ok(_) => {}
                    Err(e) => {
                        me.maybe_open.store(true, Ordering::Release);
                        tracing::error!(error = %e, "could not close the circuit breaker");
                    }
                }
            });
        }
    }

    /// What the dispatcher may claim now, by `breaker` as it read it with
    /// its list of claimable experiences. `Probe` is answered to exactly
    /// one caller among all instances per cool-down; the others get
    /// `NoAi`.
    pub async fn admission(&self, breaker: Breaker) -> Admission {
        let now = self.clock.now_ms();
        if breaker.is_open() {
            self.maybe_open.store(true, Ordering::Release);
        }
        match breaker.admission(now) {
            Admission::Probe => match self
                .store
                .take_probe(&self.provider, now + PROBE_MS, now)
                .await
            {
                Ok(true) => {
                    tracing::info!(provider = %self.provider, "circuit breaker cool-down over: one saga probes the AI provider");
                    Admission::Probe
                }
                Ok(false) => Admission::NoAi,
                Err(e) => {
                    tracing::error!(error = %e, "could not take the breaker's probe");
                    Admission::NoAi
                }
            },
            other => other,
        }
    }
}

/// The provider's request rate limit (`STAGEHAND_AI_RATE_LIMIT`), shared by
/// every saga of every instance through one row: every submit and poll
/// takes a request first. A refused request is not sent; the saga sees the
/// provider as unavailable (not an attempt) and waits with backoff. The
/// breaker does not count it: the provider was never asked.
pub struct ProviderRate {
    store: Store,
    clock: SharedClock,
    provider: String,
    emission_ms: i64,
    tolerance_ms: i64,
}

impl ProviderRate {
    /// `count` requests per `per`, paced one every `per / count` with no
    /// burst: a burst allowance of B lets up to `count + B` through in one
    /// window of `per` (measured: 19 of a 10/s limit with B = 9), and the
    /// account's quota is per window.
    pub fn new(
        store: Store,
        clock: SharedClock,
        provider: &str,
        count: u32,
        per: std::time::Duration,
    ) -> Arc<Self> {
        let emission_ms = (per.as_millis() as i64 / i64::from(count.max(1))).max(1);
        Arc::new(ProviderRate {
            store,
            clock,
            provider: provider.to_owned(),
            emission_ms,
            tolerance_ms: 0,
        })
    }

    /// Takes one request, or says why not (as the saga sees it). A limit
    /// that cannot be read lets the request through: the database being
    /// down stops the saga anyway.
    pub async fn take(&self) -> Result<(), AiFailure> {
        let now = self.clock.now_ms();
        match self
            .store
            .take_provider_request(&self.provider, now, self.emission_ms, self.tolerance_ms)
            .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(wait_ms)) => Err(AiFailure::Throttled {
                retry_after_ms: wait_ms,
                detail: "the AI provider's request rate limit (STAGEHAND_AI_RATE_LIMIT) is reached"
                    .to_owned(),
            }),
            Err(e) => {
                tracing::error!(error = %e, "could not read the AI rate limit; sending the request");
                Ok(())
            }
        }
    }
}
