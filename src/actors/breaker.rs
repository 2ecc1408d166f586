//! The AI provider's shared guards, as this process uses them: the request
//! rate limit ([`ProviderRate`], asked before every request), the pause a
//! provider names (a 429's wait: [`ProviderBreaker::paused_for`], asked
//! before every request too, and learnt from every instance's claim
//! reads) and the circuit breaker. The breaker's two ends in this process: the AI actor reports
//! each call's outcome ([`ProviderBreaker::record`]) and the dispatcher asks
//! what it may claim ([`ProviderBreaker::admission`]). The state is shared
//! through the database (`src/store/breaker.rs`), written only when it
//! changes: when a run of unavailability opens it, when a probe fails, when
//! the provider answers the probe this process took. Nothing else the
//! provider answers closes it (see [`crate::domain::breaker`]): a job that
//! was already running when it opened succeeds without ending an
//! operator's pause or a cool-down. A write runs in a task of its own after
//! the call, never during one; a failed write is logged and the next
//! outcome tries again.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use super::wakeups::Wakeups;
use crate::clock::SharedClock;
use crate::domain::breaker::{
    Admission, Breaker, Opener, Probe, UnavailableRun, MAX_NAMED_WAIT_MS, OUT_OF_QUOTA_MS,
};
use crate::domain::failure::AiFailure;
use crate::domain::policy::EpochMs;
use crate::store::Store;

/// What the request whose outcome is recorded asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// A submit sent at `sent_ms`: a new job, which may be the probe.
    Submit { sent_ms: EpochMs },
    /// A poll or a cancel: about a job that exists already, never the
    /// probe's answer.
    OfAJob,
}

/// An unclear submit held back by an open breaker whose end is not known
/// (a probe is out, the row could not be read) asks again this much later.
const RESEND_RECHECK_MS: i64 = 1_000;

pub struct ProviderBreaker {
    store: Store,
    clock: SharedClock,
    wakeups: Wakeups,
    provider: String,
    /// How long a run of unavailability opens it for.
    cool_down_ms: i64,
    run: Mutex<UnavailableRun>,
    /// Seen open by this process (so an unavailable answer may reopen it
    /// after a probe). Only a hint: the row decides.
    maybe_open: AtomicBool,
    /// The probe this process took, until the provider answers it.
    probe: Mutex<Option<Probe>>,
    /// No request goes out before then (epoch ms; 0: none): the longest
    /// wait the provider named, to this process or (read with the claim)
    /// to another instance.
    paused_until_ms: AtomicI64,
    /// The pause above is the shared row's (written there, or read from
    /// it): when the row has none any more (an operator closed the
    /// breaker), neither has this process.
    pause_shared: AtomicBool,
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
            probe: Mutex::new(None),
            paused_until_ms: AtomicI64::new(0),
            pause_shared: AtomicBool::new(false),
        })
    }

    /// The provider's name.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// How long every request to the provider must still wait, when it
    /// named a wait that is not over ([`Self::record`] learns it).
    pub fn paused_for(&self) -> Option<i64> {
        let left = self.paused_until_ms.load(Ordering::Acquire) - self.clock.now_ms();
        (left > 0).then_some(left)
    }

    /// The provider named a wait of `wait_ms` (at most
    /// [`MAX_NAMED_WAIT_MS`]): no request of this process goes out before
    /// it is over, and the shared row tells the other instances (in a task
    /// of its own, after the call).
    pub fn pause_for(self: &Arc<Self>, wait_ms: i64) {
        let now = self.clock.now_ms();
        let until = now.saturating_add(wait_ms.clamp(0, MAX_NAMED_WAIT_MS));
        let before = self.paused_until_ms.fetch_max(until, Ordering::AcqRel);
        if before >= until {
            return;
        }
        self.pause_shared.store(false, Ordering::Release);
        tracing::warn!(
            provider = %self.provider, wait_ms = until - now,
            "the AI provider asked to wait: no request to it goes out before then, from any saga"
        );
        let me = self.clone();
        crate::metrics::task_spawned("breaker.write");
        tokio::spawn(async move {
            match me.store.pause_provider(&me.provider, until, now).await {
                Ok(()) => me.pause_shared.store(true, Ordering::Release),
                Err(e) => {
                    tracing::error!(error = %e, "could not share the AI provider's pause; the other instances learn it from their own 429s")
                }
            }
        });
    }

    /// The account is out of quota: open at once for [`OUT_OF_QUOTA_MS`]
    /// with the provider's words as the reason.
    fn out_of_quota(self: &Arc<Self>, detail: &str, now: EpochMs) {
        self.maybe_open.store(true, Ordering::Release);
        let reason = format!("{}: {detail}", Opener::OutOfQuota.headline());
        let me = self.clone();
        crate::metrics::task_spawned("breaker.write");
        tokio::spawn(async move {
            let until = now + OUT_OF_QUOTA_MS;
            match me
                .store
                .open_breaker(&me.provider, until, Opener::OutOfQuota, &reason, None, now)
                .await
            {
                Ok(()) => tracing::error!(
                    provider = %me.provider, %reason,
                    "AI account out of quota: circuit breaker open, no AI work is claimed for it; add credit, then close the breaker (/ops or POST /api/admin/breaker/close)"
                ),
                Err(e) => tracing::error!(error = %e, "could not write the circuit breaker"),
            }
        });
    }

    /// A submit about to be sent now (its outcome goes to
    /// [`Self::record`]).
    pub fn submit_sent(&self) -> Request {
        Request::Submit {
            sent_ms: self.clock.now_ms(),
        }
    }

    /// One call's outcome: unavailable or unclear, or the provider answered
    /// (anything else, success or refusal). An answer closes the breaker
    /// only when it answers the submit of the probe this process took.
    pub fn record<T>(self: &Arc<Self>, request: Request, outcome: &Result<T, AiFailure>) {
        let now = self.clock.now_ms();
        match outcome {
            // It answered (a probe's answer closes the breaker), naming a
            // wait for everyone.
            Err(AiFailure::Throttled { retry_after_ms, .. }) => self.pause_for(*retry_after_ms),
            Err(AiFailure::OutOfQuota(detail)) => {
                self.out_of_quota(detail, now);
                return;
            }
            _ => {}
        }
        // An unclear answer (a dropped connection, a cut-short body) is
        // trouble at the provider too.
        let unavailable = matches!(
            outcome,
            Err(failure) if failure.is_unavailable() && failure.retry_after_ms().is_none()
        );
        let reason = match outcome {
            Err(failure) => format!("{}: {failure}", Opener::Unavailable.headline()),
            Ok(_) => String::new(),
        };
        let opens = {
            let mut run = self.run.lock().unwrap_or_else(|e| e.into_inner());
            if unavailable {
                run.unavailable()
            } else {
                run.answered();
                false
            }
        };
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
                        .open_breaker(&me.provider, until, Opener::Unavailable, &reason, None, now)
                        .await
                        .map(|()| 1)
                } else {
                    me.store
                        .probe_failed(&me.provider, until, &reason, now)
                        .await
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
            return;
        }
        let Request::Submit { sent_ms } = request else {
            return;
        };
        let probe = {
            let mut held = self.probe.lock().unwrap_or_else(|e| e.into_inner());
            match *held {
                Some(probe) if probe.taken_at_ms <= sent_ms => held.take(),
                _ => None,
            }
        };
        let Some(probe) = probe else {
            return;
        };
        crate::metrics::task_spawned("breaker.write");
        tokio::spawn(async move {
            match me
                .store
                .close_by_answer(&me.provider, probe, sent_ms, now)
                .await
            {
                Ok(true) => {
                    tracing::info!(provider = %me.provider, "AI provider answered the probe: circuit breaker closed");
                    me.maybe_open.store(false, Ordering::Release);
                    me.wakeups.saga_work();
                }
                Ok(false) => tracing::info!(
                    provider = %me.provider,
                    "AI provider answered a probe that is no longer the breaker's (opened again, by hand or not): it stays open"
                ),
                Err(e) => {
                    let mut held = me.probe.lock().unwrap_or_else(|e| e.into_inner());
                    held.get_or_insert(probe);
                    tracing::error!(error = %e, "could not close the circuit breaker");
                }
            }
        });
    }

    /// Whether a submit that sends again a key whose first send's outcome
    /// was unclear may go now. Such a saga waits in place holding its slot
    /// (its job may exist), so no claim passes it through the breaker: it
    /// asks here. Closed: go. Open and its cool-down not over: `Err(wait)`
    /// until it is. Over: it goes as the breaker's one probe when none is
    /// out (its answer closes the breaker, its failure opens it again),
    /// else `Err` a second. The row is read only while this process has
    /// seen the breaker open.
    pub async fn resend_admission(&self) -> Result<(), i64> {
        if !self.maybe_open.load(Ordering::Acquire) {
            return Ok(());
        }
        let breaker = match self.store.breaker(&self.provider).await {
            Ok(breaker) => breaker,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the circuit breaker; the unclear submit waits a second");
                return Err(RESEND_RECHECK_MS);
            }
        };
        let now = self.clock.now_ms();
        match breaker.admission(now) {
            Admission::All => {
                self.maybe_open.store(false, Ordering::Release);
                Ok(())
            }
            Admission::NoAi => Err(breaker
                .open_until_ms
                .map(|until| until - now)
                .filter(|wait| *wait > 0)
                .unwrap_or(RESEND_RECHECK_MS)),
            Admission::Probe => {
                let probe = Probe::taken_at(now);
                match self.store.take_probe(&self.provider, probe).await {
                    Ok(true) => {
                        *self.probe.lock().unwrap_or_else(|e| e.into_inner()) = Some(probe);
                        tracing::info!(provider = %self.provider, "circuit breaker's time over: an unclear submit, asked again with its key, probes the AI provider");
                        Ok(())
                    }
                    _ => Err(RESEND_RECHECK_MS),
                }
            }
        }
    }

    /// What the dispatcher may claim now, by `breaker` as it read it with
    /// its list of claimable experiences. `Probe` is answered to exactly
    /// one caller among all instances per cool-down (this process then
    /// holds the probe whose answer may close it); the others get `NoAi`.
    pub async fn admission(&self, breaker: Breaker) -> Admission {
        let now = self.clock.now_ms();
        self.maybe_open.store(breaker.is_open(), Ordering::Release);
        if let Some(until) = breaker.paused_until_ms {
            // Another instance was told to wait: so is this one.
            let before = self.paused_until_ms.fetch_max(until, Ordering::AcqRel);
            if before <= until {
                self.pause_shared.store(true, Ordering::Release);
            }
        } else if self.pause_shared.swap(false, Ordering::AcqRel) {
            // Cleared (an operator closed the breaker): a pause this
            // process had from the row is over too.
            self.paused_until_ms.store(0, Ordering::Release);
        }
        match breaker.admission(now) {
            Admission::Probe => {
                let probe = Probe::taken_at(now);
                match self.store.take_probe(&self.provider, probe).await {
                    Ok(true) => {
                        *self.probe.lock().unwrap_or_else(|e| e.into_inner()) = Some(probe);
                        tracing::info!(provider = %self.provider, "circuit breaker's time over: one saga probes the AI provider");
                        Admission::Probe
                    }
                    Ok(false) => Admission::NoAi,
                    Err(e) => {
                        tracing::error!(error = %e, "could not take the breaker's probe");
                        Admission::NoAi
                    }
                }
            }
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
