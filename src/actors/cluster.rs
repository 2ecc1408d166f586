//! ClusterBridge (PostgreSQL only): carries wake-ups between the instances
//! that share one database, with LISTEN/NOTIFY.
//!
//! Out: what [`Wakeups`] collected in the [`ClusterMailbox`] (saga work for
//! the dispatchers, review news, terminals with new numbered events,
//! rankings that changed) is sent after commit, one `pg_notify` per
//! channel, all in one statement, coalesced: at most one round of
//! notifications per [`COALESCE`] window, however many commits asked for
//! one.
//!
//! In: one LISTEN connection of its own (`application_name`
//! `stagehand-listener`). A notification from another instance rings this
//! instance's dispatcher, its review actor, its operator hub (an operator
//! was revoked), the hub for the terminals named,
//! or the ranking board for the experiences named, each only for its own
//! channel (and always the operator hub). Whenever the
//! listener (re)connects, notifications may have been missed meanwhile, so
//! it rings everything: dispatcher, relay and every display re-read the
//! tables.

use std::time::Duration;

use actix::prelude::*;

use super::run_on_runtime;
use super::terminal_hub::{Ring, RingAll, TerminalHub};
use super::wakeups::{ClusterMailbox, ClusterNews, Wakeups};
use crate::store::notify::{
    names_payload, parse_names_payload, DISPATCH_CHANNEL, OPERATORS_CHANNEL, OUTBOX_CHANNEL,
    RANKING_CHANNEL, REVIEW_CHANNEL,
};
use crate::store::Store;

/// Notifications go out at most once per this window (per instance).
pub const COALESCE: Duration = Duration::from_millis(50);
/// First wait before reconnecting a lost listener; doubles up to 5 s.
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

pub struct ClusterBridge {
    store: Store,
    /// Tells our own notifications apart from the others'.
    instance_id: String,
    mailbox: ClusterMailbox,
    wakeups: Wakeups,
    hub: Addr<TerminalHub>,
    running: Vec<tokio::task::AbortHandle>,
}

impl ClusterBridge {
    pub fn new(
        store: Store,
        instance_id: String,
        mailbox: ClusterMailbox,
        wakeups: Wakeups,
        hub: Addr<TerminalHub>,
    ) -> Self {
        ClusterBridge {
            store,
            instance_id,
            mailbox,
            wakeups,
            hub,
            running: Vec::new(),
        }
    }
}

/// Sends what the mailbox collected, then waits out the coalescing window.
async fn send_news(store: Store, instance_id: String, mailbox: ClusterMailbox) {
    loop {
        mailbox.bell.rung().await;
        let news: ClusterNews = mailbox.take();
        let mut notices = Vec::new();
        for (sent, channel) in [
            (news.dispatch, DISPATCH_CHANNEL),
            (news.review, REVIEW_CHANNEL),
            (news.operators, OPERATORS_CHANNEL),
        ] {
            if sent {
                notices.push((channel, instance_id.clone()));
            }
        }
        for (channel, names) in [
            (OUTBOX_CHANNEL, &news.terminals),
            (RANKING_CHANNEL, &news.rankings),
        ] {
            if !names.is_empty() {
                notices.push((
                    channel,
                    names_payload(&instance_id, names.named().as_deref()),
                ));
            }
        }
        if let Err(e) = store.notify_all(&notices).await {
            let channels: Vec<&str> = notices.iter().map(|(channel, _)| *channel).collect();
            tracing::warn!(error = %e, ?channels, "could not notify the other instances; they re-read at their next wake-up or poll");
        }
        tokio::time::sleep(COALESCE).await;
    }
}

/// Listens for the other instances' news for as long as the actor lives,
/// reconnecting with backoff.
async fn listen(store: Store, instance_id: String, wakeups: Wakeups, hub: Addr<TerminalHub>) {
    let mut backoff = RECONNECT_FIRST;
    loop {
        let channels = [
            DISPATCH_CHANNEL,
            REVIEW_CHANNEL,
            OUTBOX_CHANNEL,
            RANKING_CHANNEL,
            OPERATORS_CHANNEL,
        ];
        let mut listener = match store.listen(&channels).await {
            Ok(listener) => listener,
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "cannot LISTEN for other instances");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RECONNECT_MAX);
                continue;
            }
        };
        backoff = RECONNECT_FIRST;
        tracing::info!(
            "listening for other instances (LISTEN {})",
            channels.join(", ")
        );
        // Whatever was sent while we were not listening is re-read.
        wakeups.dispatcher.ring();
        wakeups.relay.ring();
        wakeups.stats.ring();
        wakeups.review.ring();
        wakeups.operators.ring();
        wakeups.rankings.update(|names| names.all = true);
        store.invalidate_ranks(None).await;
        let _ = hub.send(RingAll).await;
        loop {
            let notification = match listener.try_recv().await {
                Ok(Some(notification)) => notification,
                Ok(None) => {
                    tracing::warn!("lost the LISTEN connection; reconnecting");
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "LISTEN connection failed; reconnecting");
                    break;
                }
            };
            let (sender, names) = match notification.channel() {
                DISPATCH_CHANNEL | REVIEW_CHANNEL | OPERATORS_CHANNEL => {
                    (notification.payload(), None)
                }
                _ => parse_names_payload(notification.payload()),
            };
            if sender == instance_id {
                continue;
            }
            ring_doorbells(&wakeups, notification.channel());
            match notification.channel() {
                OUTBOX_CHANNEL => {
                    let _ = match names {
                        Some(ids) => {
                            hub.send(Ring(ids.into_iter().map(str::to_owned).collect()))
                                .await
                        }
                        None => hub.send(RingAll).await,
                    };
                }
                RANKING_CHANNEL => match names {
                    Some(ids) => {
                        let ids: Vec<String> = ids.into_iter().map(str::to_owned).collect();
                        // Another instance's entries: this one's cached
                        // scores of them are read again (at most once a
                        // refresh bound, see `RankCache`).
                        store.ranks_changed_elsewhere(Some(&ids)).await;
                        wakeups.rankings_changed(&ids, true);
                    }
                    None => {
                        store.ranks_changed_elsewhere(None).await;
                        wakeups.rankings.update(|names| names.all = true)
                    }
                },
                _ => {}
            }
        }
    }
}

/// Rings the doorbells that another instance's notification on `channel`
/// wakes here: always the operators' stats; the dispatcher for saga work;
/// the review actor for review news (an approved saga may wait for
/// adoption here too). Each only for its own news, so a stream of dispatch
/// news never runs the review actor's reads.
fn ring_doorbells(wakeups: &Wakeups, channel: &str) {
    wakeups.stats.ring();
    match channel {
        DISPATCH_CHANNEL => wakeups.dispatcher.ring(),
        REVIEW_CHANNEL => wakeups.review.ring(),
        OPERATORS_CHANNEL => wakeups.operators.ring(),
        _ => {}
    }
}

impl Actor for ClusterBridge {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let sending = send_news(
            self.store.clone(),
            self.instance_id.clone(),
            self.mailbox.clone(),
        );
        let listening = listen(
            self.store.clone(),
            self.instance_id.clone(),
            self.wakeups.clone(),
            self.hub.clone(),
        );
        self.running = vec![run_on_runtime(ctx, sending), run_on_runtime(ctx, listening)];
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        for task in self.running.drain(..) {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;
    use crate::actors::wakeups::Doorbell;

    fn was_rung(bell: &Doorbell) -> bool {
        bell.rung().now_or_never().is_some()
    }

    #[test]
    fn each_kind_of_news_wakes_only_its_own_actor() {
        let wakeups = Wakeups::default();
        ring_doorbells(&wakeups, DISPATCH_CHANNEL);
        assert!(was_rung(&wakeups.dispatcher));
        assert!(was_rung(&wakeups.stats));
        assert!(
            !was_rung(&wakeups.review),
            "dispatch news ran the review actor"
        );

        ring_doorbells(&wakeups, REVIEW_CHANNEL);
        assert!(was_rung(&wakeups.review));
        assert!(was_rung(&wakeups.stats));
        assert!(
            !was_rung(&wakeups.dispatcher),
            "review news ran a claim round"
        );
    }

    #[test]
    fn review_news_goes_out_on_its_own_channel() {
        let mailbox = ClusterMailbox::default();
        let wakeups = Wakeups {
            cluster: Some(mailbox.clone()),
            ..Wakeups::default()
        };
        wakeups.review_changed();
        let news = mailbox.take();
        assert!(
            news.review && !news.dispatch,
            "review news sent as dispatch news"
        );
    }
}
