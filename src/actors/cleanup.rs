//! CleanupActor: every `CLEANUP_INTERVAL` ends what nobody owns any more.
//! Sagas whose lease is gone and that are past their deadline or out of
//! recoveries are aborted, each in its own transaction (and only if still
//! unowned at that moment): AI_TIMEOUT when the deadline passed while the
//! saga waited for the AI, ORPHANED otherwise
//! (`domain::policy::orphan_reason`); sessions stuck in SUBMITTING without a saga
//! are aborted; expired idempotency records (in batches of
//! [`PURGE_BATCH`], at most [`PURGE_ROUNDS`] a round) and old outbox events
//! are deleted, and so are the presence rows of displays whose instance
//! died.

use std::time::Duration;

use actix::prelude::*;

use super::persistence::{PersistenceActor, Write};
use super::terminal_hub::PRESENCE_STALE_MS;
use super::wakeups::Wakeups;
use crate::clock::SharedClock;
use crate::domain::policy::{orphan_reason, ownership, recovery, Recovery, RecoveryLimits};
use crate::domain::saga::AbortReason;
use crate::store::idempotency::PURGE_BATCH;
use crate::store::sagas::{ClaimRules, Fence};
use crate::store::transitions::SagaWrite;
use crate::store::Store;

/// Outbox events are kept this long for displays that reconnect.
const OUTBOX_RETENTION_MS: i64 = 7 * 24 * 3_600_000;
/// Rows handled per round at most, so a round stays short.
const BATCH: u64 = 500;

/// Run one round now (tests and operators).
#[derive(Message)]
#[rtype(result = "CleanupReport")]
pub struct RunCleanup;

/// Batches of expired idempotency records deleted per round at most.
const PURGE_ROUNDS: u32 = 20;

/// What one round did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CleanupReport {
    pub orphaned_sagas: u64,
    pub stuck_sessions: u64,
    pub expired_keys: u64,
    pub old_events: u64,
    pub stale_displays: u64,
}

pub struct CleanupActor {
    store: Store,
    clock: SharedClock,
    persistence: Addr<PersistenceActor>,
    wakeups: Wakeups,
    rules: ClaimRules,
    interval: Duration,
    /// How long a session may sit in SUBMITTING without a saga.
    stuck_after_ms: i64,
}

impl CleanupActor {
    pub fn new(
        store: Store,
        clock: SharedClock,
        persistence: Addr<PersistenceActor>,
        wakeups: Wakeups,
        rules: ClaimRules,
        interval: Duration,
    ) -> Self {
        CleanupActor {
            store,
            clock,
            persistence,
            wakeups,
            rules,
            interval,
            stuck_after_ms: rules.lease_ms,
        }
    }

    fn round(&self) -> impl std::future::Future<Output = CleanupReport> + 'static {
        let (store, clock, persistence, wakeups, rules) = (
            self.store.clone(),
            self.clock.clone(),
            self.persistence.clone(),
            self.wakeups.clone(),
            self.rules,
        );
        let stuck_after_ms = self.stuck_after_ms;
        async move {
            let mut report = CleanupReport::default();
            let now = clock.now_ms();
            let limits = RecoveryLimits {
                max_recoveries: rules.max_recoveries,
            };
            match store.unowned_candidates(now, rules, BATCH).await {
                Ok(candidates) => {
                    for saga in candidates {
                        let owner =
                            ownership(saga.lock_token.as_deref(), saga.locked_until_ms, now);
                        let decision = recovery(
                            owner,
                            saga.recoveries as u32,
                            saga.next_attempt_at_ms,
                            saga.deadline_at_ms,
                            now,
                            limits,
                        );
                        if decision != Recovery::Orphan {
                            continue;
                        }
                        let deadline_passed = saga.deadline_at_ms < now;
                        // Waiting for the AI when its time ran out: AI_TIMEOUT.
                        let asked_ai = saga.ai_job_id.is_some()
                            || saga.attempts > 0
                            || saga.unavailable_streak > 0;
                        let reason = match saga.step.parse() {
                            Ok(step) => orphan_reason(step, deadline_passed, asked_ai),
                            Err(_) => AbortReason::Orphaned,
                        };
                        let detail = if reason == AbortReason::AiTimeout {
                            "the saga deadline passed while waiting for the AI".to_owned()
                        } else if deadline_passed {
                            "nobody finished it before its deadline".to_owned()
                        } else {
                            format!("lease lost {} times; giving up", saga.recoveries)
                        };
                        let aborted = persistence
                            .send(Write(SagaWrite::Abort {
                                saga_id: saga.id.clone(),
                                fence: Fence::Unowned,
                                reason,
                                detail: detail.clone(),
                            }))
                            .await;
                        match aborted {
                            Ok(Ok(_)) => {
                                report.orphaned_sagas += 1;
                                tracing::warn!(saga_id = %saga.id, step = %saga.step, %reason, %detail, "saga nobody will finish ABORTED");
                            }
                            Ok(Err(e)) if e.is_lease_lost() => {} // someone took it meanwhile
                            Ok(Err(e)) => {
                                tracing::error!(saga_id = %saga.id, error = %e, "could not abort orphan")
                            }
                            Err(e) => tracing::error!(error = %e, "persistence actor unreachable"),
                        }
                    }
                }
                Err(e) => tracing::error!(error = %e, "cleanup: reading orphans failed"),
            }
            match store
                .submitting_without_saga(now - stuck_after_ms, BATCH as i64)
                .await
            {
                Ok(ids) => {
                    for id in ids {
                        match store.abort_stuck_session(&id, now).await {
                            Ok(appended) => {
                                report.stuck_sessions += 1;
                                tracing::warn!(session_id = %id, "session stuck in SUBMITTING without a saga: ABORTED");
                                if appended {
                                    wakeups.event_appended();
                                }
                            }
                            Err(e) => {
                                tracing::error!(session_id = %id, error = %e, "could not abort stuck session")
                            }
                        }
                    }
                }
                Err(e) => tracing::error!(error = %e, "cleanup: reading stuck sessions failed"),
            }
            // Bounded batches, at most PURGE_ROUNDS of them a round: what
            // is left waits for the next round.
            for _ in 0..PURGE_ROUNDS {
                match store.purge_expired_keys(now, PURGE_BATCH).await {
                    Ok(n) => {
                        report.expired_keys += n;
                        if n < PURGE_BATCH {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cleanup: purging idempotency keys failed");
                        break;
                    }
                }
            }
            match store.purge_events_before(now - OUTBOX_RETENTION_MS).await {
                Ok(n) => report.old_events = n,
                Err(e) => tracing::error!(error = %e, "cleanup: purging outbox failed"),
            }
            match store.purge_stale_presence(now - PRESENCE_STALE_MS).await {
                Ok(n) => report.stale_displays = n,
                Err(e) => tracing::error!(error = %e, "cleanup: purging stale presence failed"),
            }
            if report != CleanupReport::default() {
                tracing::info!(?report, "cleanup round");
            }
            report
        }
    }
}

impl Actor for CleanupActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.interval, |act, ctx| {
            let round = act.round();
            ctx.spawn(actix::fut::wrap_future(async move {
                round.await;
            }));
        });
    }
}

impl Handler<RunCleanup> for CleanupActor {
    type Result = ResponseFuture<CleanupReport>;
    fn handle(&mut self, _: RunCleanup, _: &mut Context<Self>) -> Self::Result {
        Box::pin(self.round())
    }
}
