//! OutboxRelay: numbers committed outbox events in batches and rings the
//! displays that have news. The transaction that ends a saga appends its
//! event unnumbered, so it never waits on a row shared by the sagas of one
//! terminal; the relay gives the numbers, one short transaction per batch
//! (see `store::outbox` for why that keeps `seq` gapless and in commit
//! order).
//!
//! Woken by [`Wakeups::event_appended`] right after such a commit, and on a
//! one-second safety tick that numbers what a dead instance committed but
//! did not number. After each batch it rings this instance's sockets of the
//! terminals concerned (through the [`TerminalHub`], awaiting the send, so
//! the hub's mailbox never holds more than one of its rings) and tells the
//! other instances through [`Wakeups::events_numbered`].

use std::time::Duration;

use actix::prelude::*;

use super::run_on_runtime;
use super::terminal_hub::{Ring, TerminalHub};
use super::wakeups::Wakeups;
use crate::store::Store;

/// Events numbered per transaction at most.
pub const BATCH: u64 = 500;
/// The relay looks for unnumbered events at least this often.
const SAFETY_TICK: Duration = Duration::from_secs(1);
/// After a failed batch (database down), wait this long before the next.
const RETRY_AFTER: Duration = Duration::from_millis(500);

pub struct OutboxRelay {
    store: Store,
    hub: Addr<TerminalHub>,
    wakeups: Wakeups,
    running: Option<tokio::task::AbortHandle>,
}

impl OutboxRelay {
    pub fn new(store: Store, hub: Addr<TerminalHub>, wakeups: Wakeups) -> Self {
        OutboxRelay {
            store,
            hub,
            wakeups,
            running: None,
        }
    }
}

async fn relay(store: Store, hub: Addr<TerminalHub>, wakeups: Wakeups) {
    loop {
        match store.number_events(BATCH).await {
            Ok(batch) => {
                if batch.events > 0 {
                    tracing::debug!(
                        events = batch.events,
                        terminals = batch.terminals.len(),
                        "outbox events numbered"
                    );
                    wakeups.events_numbered(&batch.terminals);
                    let _ = hub.send(Ring(batch.terminals)).await;
                }
                if batch.events as u64 == BATCH {
                    continue; // more may be waiting
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "outbox relay: numbering failed; trying again");
                tokio::time::sleep(RETRY_AFTER).await;
                continue;
            }
        }
        tokio::select! {
            _ = wakeups.relay.rung() => {}
            _ = tokio::time::sleep(SAFETY_TICK) => {}
        }
    }
}

impl Actor for OutboxRelay {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let work = relay(self.store.clone(), self.hub.clone(), self.wakeups.clone());
        self.running = Some(run_on_runtime(ctx, work));
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(running) = self.running.take() {
            running.abort();
        }
    }
}
