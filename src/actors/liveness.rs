//! Liveness (PostgreSQL, several instances on one database): this
//! instance's row in `instances`, renewed every second, and the number of
//! live instances, which the participants' rate limits divide their quota
//! by (so N instances together allow about the limit, not N times it). A
//! request's Idempotency-Key names its instance, so a key whose instance
//! is known dead (its row gone stale, or deleted at shutdown) is taken over
//! at once. A renewal that fails is logged and tried again next second; the
//! count then stays as it was. No mailbox: a timer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use crate::clock::SharedClock;
use crate::store::Store;

/// How often the row is renewed.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

pub struct LivenessActor {
    store: Store,
    clock: SharedClock,
    instance_id: String,
    /// Live instances, as last counted.
    live: Arc<AtomicUsize>,
}

impl LivenessActor {
    pub fn new(
        store: Store,
        clock: SharedClock,
        instance_id: String,
        live: Arc<AtomicUsize>,
    ) -> Self {
        LivenessActor {
            store,
            clock,
            instance_id,
            live,
        }
    }
}

impl Actor for LivenessActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(HEARTBEAT, |act, _| {
            let (store, id, now, live) = (
                act.store.clone(),
                act.instance_id.clone(),
                act.clock.now_ms(),
                act.live.clone(),
            );
            crate::metrics::task_spawned("liveness.heartbeat");
            tokio::spawn(async move {
                match store.instance_alive(&id, now).await {
                    Ok(n) => live.store(n, Ordering::Relaxed),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not renew this instance's liveness")
                    }
                }
            });
        });
    }
}
