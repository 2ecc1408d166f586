//! RankingActor: registers a saga's score in its experience's ranking,
//! idempotently per session, and answers with the entry and its rank.

use actix::prelude::*;

use crate::clock::SharedClock;
use crate::store::sagas::RankedEntry;
use crate::store::{Store, StoreResult};

/// Register `score` for the session (a repeat returns the existing entry).
#[derive(Message, Debug, Clone)]
#[rtype(result = "StoreResult<RankedEntry>")]
pub struct RegisterScore {
    pub experience_id: String,
    pub session_id: String,
    pub saga_id: String,
    pub nickname: String,
    pub score: f64,
}

pub struct RankingActor {
    store: Store,
    clock: SharedClock,
}

impl RankingActor {
    pub fn new(store: Store, clock: SharedClock) -> Self {
        RankingActor { store, clock }
    }
}

impl Actor for RankingActor {
    type Context = Context<Self>;
}

impl Handler<RegisterScore> for RankingActor {
    type Result = ResponseFuture<StoreResult<RankedEntry>>;

    fn handle(&mut self, msg: RegisterScore, _: &mut Context<Self>) -> Self::Result {
        let store = self.store.clone();
        let now = self.clock.now_ms();
        Box::pin(async move {
            store
                .register_score(
                    &msg.experience_id,
                    &msg.session_id,
                    &msg.saga_id,
                    &msg.nickname,
                    msg.score,
                    now,
                )
                .await
        })
    }
}
