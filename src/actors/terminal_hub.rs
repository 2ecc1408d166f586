//! TerminalHub: knows which display sockets of which terminal are connected
//! on this instance, rings them when their terminal has new numbered
//! events, and hands each the latest top-10 ranking of its experience and
//! what its prints wait for. It carries no events: a ring only says "there
//! is more", and each socket reads the outbox from its own position, so
//! nothing is ever dropped for a full mailbox. A ranking, and the prints'
//! wait, are snapshots, each kept in a `watch` channel per experience: a
//! socket that is slow gets the newest one, never a queue.
//!
//! It also keeps this instance's display presence alive: every
//! [`PRESENCE_REFRESH`](crate::domain::presence::PRESENCE_REFRESH) it marks all of this instance's presence rows seen,
//! in one statement.
//!
//! Mailbox: rings and rankings come from the outbox relay, the ranking board
//! and the cluster bridge, each awaiting its `send`, so each has at most one
//! message here at a time; `Connect` is awaited by the socket, and
//! `Disconnect` comes once per socket, and counts off only a socket that
//! registered (one that closed before its `Connect` changes nothing).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::watch;

use super::wakeups::Doorbell;
use crate::clock::SharedClock;
use crate::domain::presence::PRESENCE_REFRESH;
use crate::store::Store;

/// How often the hub compares its terminals' newest `seq` with what it saw
/// last: a wake-up that never came (a NOTIFY from another instance that
/// was lost) costs a display at most about this long.
pub const CATCH_UP_TICK: Duration = Duration::from_secs(1);

/// The newest `seq` of some terminals, read by the catch-up tick.
#[derive(Message)]
#[rtype(result = "()")]
struct NewestSeqs(Vec<(String, i64)>);

/// The latest ranking frame of an experience (None until one was made).
pub type RankingFrame = Option<Arc<str>>;

/// What an experience's prints wait for, as a `print.waiting` frame (None:
/// no print waits for a printer that holds its queue).
pub type PrintingFrame = Option<Arc<str>>;

/// The snapshots a display socket follows for its experience.
pub struct ExperienceFeeds {
    pub ranking: watch::Receiver<RankingFrame>,
    pub printing: watch::Receiver<PrintingFrame>,
}

/// An experience's snapshot channels, and how many sockets follow them.
struct ExperienceWatch {
    ranking: watch::Sender<RankingFrame>,
    printing: watch::Sender<PrintingFrame>,
    watchers: usize,
}

/// A socket of `terminal_id` (of `experience_id`) wants rings and rankings.
/// Answered once registered, with the experience's snapshot channels, so
/// the socket can read the outbox after it without missing a ring.
#[derive(Message)]
#[rtype(result = "ExperienceFeeds")]
pub struct Connect {
    pub terminal_id: String,
    pub experience_id: String,
    pub socket_id: String,
    pub bell: Doorbell,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Disconnect {
    pub terminal_id: String,
    pub experience_id: String,
    pub socket_id: String,
}

/// These terminals have new numbered events.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Ring(pub Vec<String>);

/// Every terminal may have new events (after the listener reconnected).
#[derive(Message)]
#[rtype(result = "()")]
pub struct RingAll;

/// The experience's top 10 changed: this is its new ranking frame.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RankingChanged {
    pub experience_id: String,
    pub frame: Arc<str>,
}

/// What the experience's prints wait for now (sent every printer check
/// for each experience with a display here; a frame equal to the last
/// changes nothing).
#[derive(Message)]
#[rtype(result = "()")]
pub struct PrintingChanged {
    pub experience_id: String,
    pub frame: PrintingFrame,
}

/// The experiences that have a display connected here.
#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub struct WatchedExperiences;

/// How many display sockets are connected (for stats and tests).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct ConnectedCount;

pub struct TerminalHub {
    sockets: HashMap<String, HashMap<String, Doorbell>>,
    experiences: HashMap<String, ExperienceWatch>,
    store: Store,
    clock: SharedClock,
    instance_id: String,
    /// The newest `seq` the catch-up tick saw per terminal with a socket
    /// here.
    seen: HashMap<String, i64>,
}

impl TerminalHub {
    pub fn new(store: Store, clock: SharedClock, instance_id: String) -> Self {
        TerminalHub {
            sockets: HashMap::new(),
            experiences: HashMap::new(),
            store,
            clock,
            instance_id,
            seen: HashMap::new(),
        }
    }
}

impl Actor for TerminalHub {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // The catch-up: one statement a second for all the terminals with a
        // socket here; a terminal whose newest seq grew since is rung, in
        // case its ring was lost on the way (the sockets read the outbox
        // from where they are, so a ring too many costs one read).
        ctx.run_interval(CATCH_UP_TICK, |act, ctx| {
            if act.sockets.is_empty() {
                act.seen.clear();
                return;
            }
            let terminals: Vec<String> = act.sockets.keys().cloned().collect();
            let (store, me) = (act.store.clone(), ctx.address());
            crate::metrics::task_spawned("terminal_hub.catch_up");
            tokio::spawn(async move {
                match store.newest_seqs(&terminals).await {
                    Ok(seqs) => me.do_send(NewestSeqs(seqs)),
                    Err(e) => tracing::warn!(error = %e, "display catch-up: could not read the terminals' newest seq"),
                }
            });
        });
        ctx.run_interval(PRESENCE_REFRESH, |act, _| {
            if act.sockets.is_empty() {
                return;
            }
            let (store, instance, now) = (
                act.store.clone(),
                act.instance_id.clone(),
                act.clock.now_ms(),
            );
            crate::metrics::task_spawned("terminal_hub.presence");
            tokio::spawn(async move {
                if let Err(e) = store.refresh_presence(&instance, now).await {
                    tracing::warn!(error = %e, "could not refresh display presence");
                }
            });
        });
    }
}

impl Handler<Connect> for TerminalHub {
    type Result = MessageResult<Connect>;
    fn handle(&mut self, m: Connect, _: &mut Context<Self>) -> Self::Result {
        crate::metrics::actor_message("TerminalHub");
        self.sockets
            .entry(m.terminal_id)
            .or_default()
            .insert(m.socket_id, m.bell);
        let feeds = self
            .experiences
            .entry(m.experience_id)
            .or_insert_with(|| ExperienceWatch {
                ranking: watch::channel(None).0,
                printing: watch::channel(None).0,
                watchers: 0,
            });
        feeds.watchers += 1;
        MessageResult(ExperienceFeeds {
            ranking: feeds.ranking.subscribe(),
            printing: feeds.printing.subscribe(),
        })
    }
}

impl Handler<Disconnect> for TerminalHub {
    type Result = ();
    fn handle(&mut self, m: Disconnect, _: &mut Context<Self>) {
        crate::metrics::actor_message("TerminalHub");
        // Only a socket that registered is counted off: one whose stream
        // ended before its `Connect` (or a second `Disconnect`) changes
        // nothing, so it never drops its neighbours' ranking channel.
        let Some(sockets) = self.sockets.get_mut(&m.terminal_id) else {
            return;
        };
        if sockets.remove(&m.socket_id).is_none() {
            return;
        }
        if sockets.is_empty() {
            self.sockets.remove(&m.terminal_id);
        }
        if let Some(feeds) = self.experiences.get_mut(&m.experience_id) {
            feeds.watchers -= 1;
            if feeds.watchers == 0 {
                self.experiences.remove(&m.experience_id);
            }
        }
    }
}

impl Handler<Ring> for TerminalHub {
    type Result = ();
    fn handle(&mut self, m: Ring, _: &mut Context<Self>) {
        crate::metrics::actor_message("TerminalHub");
        for terminal_id in &m.0 {
            for bell in self
                .sockets
                .get(terminal_id)
                .into_iter()
                .flat_map(|s| s.values())
            {
                bell.ring();
            }
        }
    }
}

impl Handler<NewestSeqs> for TerminalHub {
    type Result = ();
    fn handle(&mut self, m: NewestSeqs, _: &mut Context<Self>) {
        crate::metrics::actor_message("TerminalHub");
        self.seen
            .retain(|terminal, _| self.sockets.contains_key(terminal));
        for (terminal, seq) in m.0 {
            let grew = self.seen.get(&terminal).is_none_or(|&before| seq > before);
            self.seen.insert(terminal.clone(), seq);
            if grew {
                for bell in self
                    .sockets
                    .get(&terminal)
                    .into_iter()
                    .flat_map(|s| s.values())
                {
                    bell.ring();
                }
            }
        }
    }
}

impl Handler<RingAll> for TerminalHub {
    type Result = ();
    fn handle(&mut self, _: RingAll, _: &mut Context<Self>) {
        crate::metrics::actor_message("TerminalHub");
        for bell in self.sockets.values().flat_map(HashMap::values) {
            bell.ring();
        }
    }
}

impl Handler<RankingChanged> for TerminalHub {
    type Result = ();
    fn handle(&mut self, m: RankingChanged, _: &mut Context<Self>) {
        crate::metrics::actor_message("TerminalHub");
        if let Some(feeds) = self.experiences.get(&m.experience_id) {
            feeds.ranking.send_replace(Some(m.frame));
        }
    }
}

impl Handler<PrintingChanged> for TerminalHub {
    type Result = ();
    fn handle(&mut self, m: PrintingChanged, _: &mut Context<Self>) {
        crate::metrics::actor_message("TerminalHub");
        if let Some(feeds) = self.experiences.get(&m.experience_id) {
            feeds.printing.send_if_modified(|now| {
                let changed = *now != m.frame;
                if changed {
                    *now = m.frame;
                }
                changed
            });
        }
    }
}

impl Handler<WatchedExperiences> for TerminalHub {
    type Result = Vec<String>;
    fn handle(&mut self, _: WatchedExperiences, _: &mut Context<Self>) -> Vec<String> {
        crate::metrics::actor_message("TerminalHub");
        self.experiences.keys().cloned().collect()
    }
}

impl Handler<ConnectedCount> for TerminalHub {
    type Result = usize;
    fn handle(&mut self, _: ConnectedCount, _: &mut Context<Self>) -> usize {
        crate::metrics::actor_message("TerminalHub");
        self.sockets.values().map(HashMap::len).sum()
    }
}
