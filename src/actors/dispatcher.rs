//! Dispatcher: the queue. Woken right after a submission commits, when a
//! backoff ends, and on a poll timer as a safety net. Each round claims, per
//! experience, the oldest runnable sagas that fit under its `max_in_flight`
//! (the store makes the claim atomic) and starts one [`SagaSupervisor`] per
//! claimed saga.

use std::time::Duration;

use actix::prelude::*;

use super::saga_supervisor::{SagaDeps, SagaSupervisor};
use crate::domain::policy::EpochMs;
use crate::store::sagas::ClaimRules;

/// Claim now (sent after a submission commits).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wake;

/// Claim again at this time (a backoff ends then).
#[derive(Message)]
#[rtype(result = "()")]
pub struct WakeAt(pub EpochMs);

pub struct Dispatcher {
    deps: SagaDeps,
    rules: ClaimRules,
    poll_interval: Duration,
    /// A round is running; a wake-up meanwhile sets `again`.
    busy: bool,
    again: bool,
}

impl Dispatcher {
    pub fn new(deps: SagaDeps, rules: ClaimRules, poll_interval: Duration) -> Self {
        Dispatcher {
            deps,
            rules,
            poll_interval,
            busy: false,
            again: false,
        }
    }

    fn round(&mut self, ctx: &mut Context<Self>) {
        if self.busy {
            self.again = true;
            return;
        }
        self.busy = true;
        let store = self.deps.store.clone();
        let clock = self.deps.clock.clone();
        let rules = self.rules;
        let claim = async move {
            let now = clock.now_ms();
            let mut claimed = Vec::new();
            for (experience_id, max_in_flight) in
                store.experiences_with_claimable(now, rules).await?
            {
                claimed.extend(
                    store
                        .claim_runnable(&experience_id, max_in_flight, now, rules)
                        .await?,
                );
            }
            Ok::<_, crate::store::StoreError>(claimed)
        };
        ctx.spawn(claim.into_actor(self).map(|claimed, act, ctx| {
            act.busy = false;
            match claimed {
                Ok(sagas) => {
                    for saga in sagas {
                        tracing::info!(
                            saga_id = %saga.id, step = %saga.step, recoveries = saga.recoveries,
                            "claimed saga"
                        );
                        if let Some(supervisor) =
                            SagaSupervisor::new(saga, act.deps.clone(), ctx.address())
                        {
                            supervisor.start();
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "claim round failed; retrying on the next wake-up")
                }
            }
            if std::mem::take(&mut act.again) {
                act.round(ctx);
            }
        }));
    }
}

impl Actor for Dispatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.round(ctx);
        ctx.run_interval(self.poll_interval, |act, ctx| act.round(ctx));
    }
}

impl Handler<Wake> for Dispatcher {
    type Result = ();
    fn handle(&mut self, _: Wake, ctx: &mut Context<Self>) {
        self.round(ctx);
    }
}

impl Handler<WakeAt> for Dispatcher {
    type Result = ();
    fn handle(&mut self, m: WakeAt, ctx: &mut Context<Self>) {
        let delay_ms = (m.0 - self.deps.clock.now_ms()).max(0) as u64;
        ctx.run_later(Duration::from_millis(delay_ms), |act, ctx| act.round(ctx));
    }
}
