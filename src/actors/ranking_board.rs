//! RankingBoard: turns "the ranking of these experiences may have changed"
//! into ranking frames for the displays. Woken through
//! [`Wakeups::rankings_changed`] by the ranking actor after each batch, by
//! the persistence actor when an aborted saga's entry was hidden, by an
//! operator's retry, and by the cluster bridge for changes made on other
//! instances. For each experience that has a display connected here, it
//! reads the top 10 and, when it differs from the last frame it made, hands
//! the new frame to the [`TerminalHub`]. Rounds are at least
//! [`THROTTLE`] apart, so a busy ranking makes a few frames a second, and
//! the last one always reflects the last change.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use serde_json::json;

use super::run_on_runtime;
use super::terminal_hub::{RankingChanged, TerminalHub, WatchedExperiences};
use super::wakeups::Wakeups;
use crate::store::Store;

/// The least time between two rounds of ranking frames.
pub const THROTTLE: Duration = Duration::from_millis(300);
/// Entries in a ranking frame.
const TOP: u64 = 10;

pub struct RankingBoard {
    store: Store,
    hub: Addr<TerminalHub>,
    wakeups: Wakeups,
    running: Option<tokio::task::AbortHandle>,
}

impl RankingBoard {
    pub fn new(store: Store, hub: Addr<TerminalHub>, wakeups: Wakeups) -> Self {
        RankingBoard {
            store,
            hub,
            wakeups,
            running: None,
        }
    }
}

/// The `ranking` frame of an experience: its top 10 now.
pub async fn ranking_frame(
    store: &Store,
    experience_id: &str,
) -> crate::store::StoreResult<String> {
    let entries: Vec<_> = store
        .ranking(experience_id, TOP)
        .await?
        .into_iter()
        .map(|row| {
            json!({"rank": row.rank, "nickname": row.nickname, "score": row.score, "session_id": row.session_id})
        })
        .collect();
    crate::metrics::frame_encoded("ranking");
    Ok(json!({"type": "ranking", "entries": entries}).to_string())
}

async fn publish(store: Store, hub: Addr<TerminalHub>, wakeups: Wakeups) {
    let mut last: HashMap<String, Arc<str>> = HashMap::new();
    loop {
        wakeups.rankings.bell.rung().await;
        let changed = wakeups.rankings.take();
        let Ok(watched) = hub.send(WatchedExperiences).await else {
            return;
        };
        last.retain(|experience, _| watched.contains(experience));
        for experience_id in watched {
            if !changed.all && !changed.names.contains(&experience_id) {
                continue;
            }
            let frame = match ranking_frame(&store, &experience_id).await {
                Ok(frame) => frame,
                Err(e) => {
                    tracing::warn!(%experience_id, error = %e, "could not read the ranking; the next change retries");
                    continue;
                }
            };
            if last.get(&experience_id).is_some_and(|f| **f == *frame) {
                continue;
            }
            let frame: Arc<str> = frame.into();
            last.insert(experience_id.clone(), frame.clone());
            let _ = hub
                .send(RankingChanged {
                    experience_id,
                    frame,
                })
                .await;
        }
        tokio::time::sleep(THROTTLE).await;
    }
}

impl Actor for RankingBoard {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let work = publish(self.store.clone(), self.hub.clone(), self.wakeups.clone());
        self.running = Some(run_on_runtime(ctx, work));
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(running) = self.running.take() {
            running.abort();
        }
    }
}
