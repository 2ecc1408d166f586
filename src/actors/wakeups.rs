//! Wake-ups: how actors learn that the database holds something new for
//! them. A wake-up carries no data: whoever wakes re-reads the tables, so a
//! doubled wake-up costs one read and a late one costs time, never an event.
//! Not an actor; the handles here are shared by the actors and the HTTP
//! layer.
//!
//! - [`Doorbell`]: the one primitive. Ringing never blocks and never queues
//!   more than one ring: rings while nobody listens collapse into one that
//!   the next listener sees at once. A storm of commits is one wake-up, and
//!   the last ring is never lost.
//! - [`Wakeups`]: what committers call after their transaction commits. It
//!   rings this instance's actors at once and, on PostgreSQL, hands the same
//!   news to the [`ClusterBridge`](super::cluster::ClusterBridge), which
//!   tells the other instances with a coalesced NOTIFY.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// A coalescing wake-up: see the module doc.
#[derive(Clone, Default)]
pub struct Doorbell(Arc<Notify>);

impl Doorbell {
    pub fn ring(&self) {
        self.0.notify_one();
    }

    /// Completes at the next ring, or at once when a ring came while nobody
    /// was waiting.
    pub async fn rung(&self) {
        self.0.notified().await
    }

    /// Sends `message()` to `actor` at each ring, one at a time (a ring
    /// during a send is kept for the next), until the actor stops.
    pub fn forward_to<A, M>(&self, actor: actix::Addr<A>, message: fn() -> M)
    where
        A: actix::Actor + actix::Handler<M>,
        A::Context: actix::dev::ToEnvelope<A, M>,
        M: actix::Message + Send + 'static,
        M::Result: Send,
    {
        let bell = self.clone();
        crate::metrics::task_spawned("doorbell.loop");
        actix::spawn(async move {
            loop {
                bell.rung().await;
                if actor.send(message()).await.is_err() {
                    break; // the actor stopped
                }
            }
        });
    }
}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Doorbell")
    }
}

/// Past this many distinct names (terminals, experiences), news says "all of
/// them" instead (a NOTIFY payload is limited to 8,000 bytes; a UUID takes
/// 37 with its separator).
pub const MAX_NAMED: usize = 150;

/// Some names, or all of them: bounded, it never holds more than
/// [`MAX_NAMED`] names before it becomes "all".
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Names {
    pub names: BTreeSet<String>,
    pub all: bool,
}

impl Names {
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && !self.all
    }

    pub fn add<'a>(&mut self, names: impl IntoIterator<Item = &'a String>) {
        if self.all {
            return;
        }
        for name in names {
            self.names.insert(name.clone());
            if self.names.len() > MAX_NAMED {
                self.names.clear();
                self.all = true;
                return;
            }
        }
    }

    /// The names, or None for "all".
    pub fn named(&self) -> Option<Vec<&str>> {
        (!self.all).then(|| self.names.iter().map(String::as_str).collect())
    }
}

/// What the other instances have not been told yet. Bounded (see [`Names`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ClusterNews {
    /// Saga work became runnable or an AI slot freed.
    pub dispatch: bool,
    /// The review queue changed.
    pub review: bool,
    /// An operator was revoked.
    pub operators: bool,
    /// Terminals with newly numbered events.
    pub terminals: Names,
    /// Experiences whose visible ranking changed.
    pub rankings: Names,
}

impl ClusterNews {
    pub fn is_empty(&self) -> bool {
        !self.dispatch
            && !self.review
            && !self.operators
            && self.terminals.is_empty()
            && self.rankings.is_empty()
    }
}

/// Some news behind a lock, and the bell that says there is some. Cheap to
/// clone.
#[derive(Default)]
pub struct Mailbox<T> {
    news: Arc<Mutex<T>>,
    pub bell: Doorbell,
}

impl<T> Clone for Mailbox<T> {
    fn clone(&self) -> Self {
        Mailbox {
            news: self.news.clone(),
            bell: self.bell.clone(),
        }
    }
}

impl<T: Default> Mailbox<T> {
    pub fn update(&self, change: impl FnOnce(&mut T)) {
        change(&mut self.news.lock().unwrap_or_else(PoisonError::into_inner));
        self.bell.ring();
    }

    /// Takes everything not yet handled.
    pub fn take(&self) -> T {
        std::mem::take(&mut *self.news.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The news waiting for the cluster bridge.
pub type ClusterMailbox = Mailbox<ClusterNews>;

/// The wake-ups committers send. Cheap to clone.
#[derive(Clone, Default)]
pub struct Wakeups {
    /// This instance's dispatcher.
    pub dispatcher: Doorbell,
    /// This instance's outbox relay.
    pub relay: Doorbell,
    /// Experiences whose visible ranking may have changed, for this
    /// instance's ranking board.
    pub rankings: Mailbox<Names>,
    /// Something operators count changed, for this instance's operator hub.
    pub stats: Doorbell,
    /// A slot of the ledger was detached (its saga ended, or gave up a call,
    /// while its job may still run), for this instance's slot adopter (it
    /// finds the job and sees it end at once; the others' safety tick
    /// covers an instance that died).
    pub slots_detached: Doorbell,
    /// The review queue changed (an item arrived, or was decided), for
    /// this instance's review actor (it adopts approved sagas at once).
    pub review: Doorbell,
    /// An operator was revoked, for this instance's operator hub (it
    /// closes that operator's dashboards).
    pub operators: Doorbell,
    /// A print was asked for or approved, or a printer added, for this
    /// instance's print queue (the other instances' queues look every
    /// second on their own).
    pub prints: Doorbell,
    /// A guest asked for mail, or an operator retried one, for this
    /// instance's mail sender (the other instances' senders look every
    /// second on their own).
    pub mail: Doorbell,
    /// The other instances (PostgreSQL only).
    pub cluster: Option<ClusterMailbox>,
}

impl Wakeups {
    /// Saga work became runnable or an AI slot freed: a submission
    /// committed, or a saga left AI_PENDING, aborted or released its lease.
    /// Wakes every instance's dispatcher.
    pub fn saga_work(&self) {
        self.dispatcher.ring();
        self.stats.ring();
        if let Some(cluster) = &self.cluster {
            cluster.update(|news| news.dispatch = true);
        }
    }

    /// The review queue changed: a result entered review, or an operator
    /// decided one. Wakes this instance's review actor and operator hub,
    /// and the other instances', whose operators watch the same queue.
    /// Not the dispatchers: the AI slot was freed before the result
    /// entered review ([`Self::saga_work`]), and an approved saga is
    /// adopted by a review actor.
    pub fn review_changed(&self) {
        self.review.ring();
        self.stats.ring();
        if let Some(cluster) = &self.cluster {
            cluster.update(|news| news.review = true);
        }
    }

    /// An operator was revoked: every instance's operator hub closes that
    /// operator's dashboards.
    pub fn operators_changed(&self) {
        self.operators.ring();
        if let Some(cluster) = &self.cluster {
            cluster.update(|news| news.operators = true);
        }
    }

    /// A committed transaction appended an unnumbered outbox event. Only
    /// this instance's relay needs to know: the others' relays would wait
    /// on its lock, and their safety tick covers a relay that died.
    pub fn event_appended(&self) {
        self.relay.ring();
        self.stats.ring();
    }

    /// The relay numbered events of these terminals: the other instances'
    /// displays of them may read on. (This instance's displays are rung by
    /// the relay through its hub.)
    pub fn events_numbered(&self, terminals: &[String]) {
        if let Some(cluster) = &self.cluster {
            cluster.update(|news| news.terminals.add(terminals));
        }
    }

    /// The visible ranking of these experiences may have changed, here or
    /// (`from_cluster`) on another instance, which told the others itself.
    pub fn rankings_changed(&self, experiences: &[String], from_cluster: bool) {
        self.rankings.update(|names| names.add(experiences));
        if let (false, Some(cluster)) = (from_cluster, &self.cluster) {
            cluster.update(|news| news.rankings.add(experiences));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rings_while_nobody_listens_collapse_into_one() {
        let bell = Doorbell::default();
        bell.ring();
        bell.ring();
        bell.ring();
        // The stored ring completes at once...
        tokio::time::timeout(std::time::Duration::from_secs(1), bell.rung())
            .await
            .expect("a ring made before waiting is kept");
        // ...and there was only one.
        let second = tokio::time::timeout(std::time::Duration::from_millis(50), bell.rung()).await;
        assert!(second.is_err(), "three rings were kept as more than one");
    }

    #[test]
    fn news_names_terminals_until_there_are_too_many() {
        let mailbox = ClusterMailbox::default();
        let wakeups = Wakeups {
            cluster: Some(mailbox.clone()),
            ..Wakeups::default()
        };
        wakeups.events_numbered(&["a".to_owned(), "b".to_owned()]);
        wakeups.saga_work();
        let news = mailbox.take();
        assert!(news.dispatch);
        assert_eq!(news.terminals.names.len(), 2);
        assert!(mailbox.take().is_empty(), "take empties the mailbox");

        let many: Vec<String> = (0..=MAX_NAMED).map(|i| i.to_string()).collect();
        wakeups.events_numbered(&many);
        wakeups.events_numbered(&["late".to_owned()]);
        let news = mailbox.take();
        assert!(news.terminals.all);
        assert!(news.terminals.names.is_empty(), "the set stays bounded");
    }

    #[test]
    fn ranking_news_from_another_instance_is_not_sent_back() {
        let mailbox = ClusterMailbox::default();
        let wakeups = Wakeups {
            cluster: Some(mailbox.clone()),
            ..Wakeups::default()
        };
        wakeups.rankings_changed(&["x".to_owned()], true);
        assert!(mailbox.take().is_empty());
        assert_eq!(wakeups.rankings.take().named(), Some(vec!["x"]));
        wakeups.rankings_changed(&["y".to_owned()], false);
        assert_eq!(mailbox.take().rankings.named(), Some(vec!["y"]));
    }
}
