//! RankingActor: registers sagas' scores in their experiences' rankings,
//! idempotently per session, and answers with the entry and its rank; then
//! tells the ranking board which rankings may have changed.
//! Registrations are group-committed ([`BatchQueue`]): those that arrive
//! while a batch is written go together in the next.

use actix::prelude::*;

use super::batching::{batch_failed, BatchLimits, BatchQueue};
use super::wakeups::Wakeups;
use crate::clock::SharedClock;
use crate::store::ranking::ScoreEntry;
use crate::store::sagas::RankedEntry;
use crate::store::{Store, StoreResult};

/// Register `score` for the session (a repeat returns the existing entry).
#[derive(Message, Debug, Clone)]
#[rtype(result = "StoreResult<RankedEntry>")]
pub struct RegisterScore {
    pub experience_id: String,
    pub session_id: String,
    pub saga_id: String,
    /// The saga's lock token: only its holder may write the entry.
    pub token: String,
    pub score: f64,
}

/// Registrations queued at most before senders wait; per transaction;
/// transactions at once; how long a batch waits for company: one at a
/// time, each waiting 5 ms for more (measured: without the wait nothing
/// got faster, BENCHMARKS.md §8). A batch's ranks come from the scores the
/// store keeps sorted ([`crate::store::ranking::RankCache`]).
const LIMITS: BatchLimits = BatchLimits {
    capacity: 4_096,
    max_batch: 256,
    concurrent: 1,
    linger: std::time::Duration::from_millis(5),
};

pub struct RankingActor {
    entries: BatchQueue<ScoreEntry, StoreResult<RankedEntry>>,
}

impl RankingActor {
    pub fn new(store: Store, clock: SharedClock, wakeups: Wakeups) -> Self {
        let entries = BatchQueue::start("scores", LIMITS, move |batch: Vec<ScoreEntry>| {
            let (store, now, wakeups) = (store.clone(), clock.now_ms(), wakeups.clone());
            async move {
                match store.register_scores(&batch, now).await {
                    Ok(ranked) => {
                        let mut experiences: Vec<String> = batch
                            .iter()
                            .zip(&ranked)
                            .filter(|(_, r)| r.is_ok())
                            .map(|(e, _)| e.experience_id.clone())
                            .collect();
                        experiences.sort();
                        experiences.dedup();
                        wakeups.rankings_changed(&experiences, false);
                        ranked
                    }
                    Err(e) => {
                        tracing::error!(error = %e, scores = batch.len(), "registering a batch of scores failed");
                        batch_failed(batch.len(), &e)
                    }
                }
            }
        });
        RankingActor { entries }
    }
}

impl Actor for RankingActor {
    type Context = Context<Self>;
}

impl Handler<RegisterScore> for RankingActor {
    type Result = ResponseFuture<StoreResult<RankedEntry>>;

    fn handle(&mut self, msg: RegisterScore, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("RankingActor");
        let entries = self.entries.clone();
        let entry = ScoreEntry {
            experience_id: msg.experience_id,
            session_id: msg.session_id,
            saga_id: msg.saga_id,
            token: msg.token,
            score: msg.score,
        };
        Box::pin(async move { entries.write(entry).await })
    }
}
