//! OperatorHub: makes the operators' `stats` frame and hands the newest to
//! every operator socket of this instance. Woken by [`Wakeups::stats`]
//! (a submission, a saga's end, a display that came, went or acked, and,
//! on PostgreSQL, the same news from other instances), and at least every
//! [`REFRESH`] (the last hour's window and presence age with time alone).
//! Rounds are at least [`THROTTLE`] apart, so a busy event makes a few
//! frames a second, and the last frame always reflects the last change.
//! Nothing is read while no operator watches. It also passes on the news
//! that an operator was revoked ([`WatchRevocations`]), so that
//! operator's dashboards close on every instance.
//!
//! The frame is a snapshot in a `watch` channel: an operator socket that is
//! slow skips to the newest frame, never a queue. Nothing is lost by that:
//! each frame carries all the counts and the latest sagas, and the admin API
//! lists every saga. With it come `saga` frames of the recent sagas, which
//! each socket sends when a saga is new or changed since it last looked,
//! and the review queue's items, which each socket announces as they
//! arrive (`review.added`) and leave (`review.removed`).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use serde_json::json;
use tokio::sync::watch;

use super::run_on_runtime;
use super::wakeups::Wakeups;
use crate::clock::{rfc3339, SharedClock};
use crate::domain::presence::PRESENCE_STALE_MS;
use crate::store::operators::OperatorStats;
use crate::store::Store;

/// The least time between two stats frames.
pub const THROTTLE: Duration = Duration::from_millis(250);
/// A frame is made at least this often while an operator watches.
pub const REFRESH: Duration = Duration::from_secs(5);

/// What the hub hands to operator sockets: the `stats` frame, and a `saga`
/// frame for each of its recent sagas.
#[derive(Debug)]
pub struct Snapshot {
    pub stats: String,
    /// `(saga id, updated_at_ms, its "saga" frame)`, newest first.
    pub sagas: Vec<(String, i64, String)>,
    /// `(saga id, its "review.added" frame)` of the oldest items waiting
    /// in review, oldest first.
    pub review: Vec<(String, String)>,
    /// The `print.printers` frame: each printer's state and reasons, and
    /// the open prints (sent when it changed).
    pub printers: String,
}

/// The newest snapshot (None until one was made).
pub type StatsFrame = Option<Arc<Snapshot>>;

/// An operator socket wants the frames. Answered with the channel; its
/// current frame is the newest, and a fresh one is made at once.
#[derive(Message)]
#[rtype(result = "watch::Receiver<StatsFrame>")]
pub struct Subscribe;

/// An operator socket of an operator account wants to learn of
/// revocations: answered with a channel whose value changes whenever an
/// operator was revoked, here or on another instance (the socket then
/// checks its own operator).
#[derive(Message)]
#[rtype(result = "watch::Receiver<u64>")]
pub struct WatchRevocations;

pub struct OperatorHub {
    store: Store,
    clock: SharedClock,
    wakeups: Wakeups,
    frames: watch::Sender<StatsFrame>,
    /// Counts the revocations heard (see [`WatchRevocations`]).
    revocations: watch::Sender<u64>,
    running: Vec<tokio::task::AbortHandle>,
}

impl OperatorHub {
    pub fn new(store: Store, clock: SharedClock, wakeups: Wakeups) -> Self {
        OperatorHub {
            store,
            clock,
            wakeups,
            frames: watch::Sender::new(None),
            revocations: watch::Sender::new(0),
            running: Vec::new(),
        }
    }
}

/// The `stats` frame of these counts, read at `now`.
pub fn stats_frame(stats: &OperatorStats, now: i64) -> String {
    let in_flight: serde_json::Map<_, _> = stats
        .experiences
        .iter()
        .map(|e| (e.slug.clone(), json!(e.in_flight)))
        .collect();
    json!({
        "type": "stats",
        "at": rfc3339(now),
        "steps": stats.steps,
        "in_flight": in_flight,
        "experiences": stats.experiences,
        "queue_depth": stats.queue_depth,
        "aborted_by_reason": stats.aborted_by_reason,
        "terminals": stats.terminals,
        "recent": stats.recent,
        "review": {
            "waiting": stats.review_queue.waiting,
            "oldest_waiting_since": stats.review_queue.oldest_since_ms.map(rfc3339),
        },
    })
    .to_string()
}

/// The frames of these counts: the `stats` frame and, per recent saga,
/// `{"type": "saga", ...the saga as the admin list shows it}`.
pub fn snapshot(stats: &OperatorStats, printers: &serde_json::Value, now: i64) -> Snapshot {
    let sagas = stats
        .recent
        .iter()
        .map(|view| {
            let mut frame = serde_json::to_value(view).unwrap_or_default();
            frame["type"] = json!("saga");
            (view.saga_id.clone(), view.updated_at_ms, frame.to_string())
        })
        .collect();
    let review = stats
        .review
        .iter()
        .map(|item| {
            let frame = json!({"type": "review.added", "item": item});
            (item.saga_id.clone(), frame.to_string())
        })
        .collect();
    let mut printers = printers.clone();
    printers["type"] = json!("print.printers");
    Snapshot {
        stats: stats_frame(stats, now),
        sagas,
        review,
        printers: printers.to_string(),
    }
}

async fn publish(
    store: Store,
    clock: SharedClock,
    wakeups: Wakeups,
    frames: watch::Sender<StatsFrame>,
) {
    let mut last: Option<(OperatorStats, serde_json::Value)> = None;
    loop {
        // Woken by news or by the refresh period, whichever comes first.
        let _ = tokio::time::timeout(REFRESH, wakeups.stats.rung()).await;
        if frames.receiver_count() == 0 {
            continue;
        }
        let now = clock.now_ms();
        let read = async {
            let stats = store.operator_stats(now, now - PRESENCE_STALE_MS).await?;
            Ok::<_, crate::store::StoreError>((stats, store.printers_view().await?))
        };
        match read.await {
            Ok(read) if last.as_ref() == Some(&read) => {}
            Ok(read) => {
                frames.send_replace(Some(Arc::new(snapshot(&read.0, &read.1, now))));
                last = Some(read);
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not read the operators' stats; the next round retries")
            }
        }
        tokio::time::sleep(THROTTLE).await;
    }
}

impl Actor for OperatorHub {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let work = publish(
            self.store.clone(),
            self.clock.clone(),
            self.wakeups.clone(),
            self.frames.clone(),
        );
        let (bell, revocations) = (self.wakeups.operators.clone(), self.revocations.clone());
        let revoked = async move {
            loop {
                bell.rung().await;
                revocations.send_modify(|heard| *heard += 1);
            }
        };
        self.running = vec![run_on_runtime(ctx, work), run_on_runtime(ctx, revoked)];
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        for running in self.running.drain(..) {
            running.abort();
        }
    }
}

impl Handler<WatchRevocations> for OperatorHub {
    type Result = MessageResult<WatchRevocations>;
    fn handle(&mut self, _: WatchRevocations, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("OperatorHub");
        MessageResult(self.revocations.subscribe())
    }
}

impl Handler<Subscribe> for OperatorHub {
    type Result = MessageResult<Subscribe>;
    fn handle(&mut self, _: Subscribe, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("OperatorHub");
        let mut frames = self.frames.subscribe();
        // The newcomer gets the newest frame now and a fresh one shortly.
        frames.mark_changed();
        self.wakeups.stats.ring();
        MessageResult(frames)
    }
}
