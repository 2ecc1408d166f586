//! TerminalHub: knows which display sockets of which terminal are connected
//! on this instance, and rings them when their terminal has new numbered
//! events. It carries no events: a ring only says "there is more", and each
//! socket reads the outbox from its own position, so nothing is ever dropped
//! for a full mailbox.
//!
//! Mailbox: rings come from the outbox relay and the cluster bridge, each
//! awaiting its `send`, so each has at most one message here at a time;
//! `Connect` is awaited by the socket, and `Disconnect` comes once per socket.

use std::collections::HashMap;

use actix::prelude::*;

use super::wakeups::Doorbell;

/// A socket of `terminal_id` wants rings. Answered once registered, so the
/// socket can read the outbox after it without missing a ring.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Connect {
    pub terminal_id: String,
    pub socket_id: u64,
    pub bell: Doorbell,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Disconnect {
    pub terminal_id: String,
    pub socket_id: u64,
}

/// These terminals have new numbered events.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Ring(pub Vec<String>);

/// Every terminal may have new events (after the listener reconnected).
#[derive(Message)]
#[rtype(result = "()")]
pub struct RingAll;

/// How many display sockets are connected (for stats and tests).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct ConnectedCount;

#[derive(Default)]
pub struct TerminalHub {
    sockets: HashMap<String, HashMap<u64, Doorbell>>,
}

impl Actor for TerminalHub {
    type Context = Context<Self>;
}

impl Handler<Connect> for TerminalHub {
    type Result = ();
    fn handle(&mut self, m: Connect, _: &mut Context<Self>) {
        self.sockets
            .entry(m.terminal_id)
            .or_default()
            .insert(m.socket_id, m.bell);
    }
}

impl Handler<Disconnect> for TerminalHub {
    type Result = ();
    fn handle(&mut self, m: Disconnect, _: &mut Context<Self>) {
        if let Some(sockets) = self.sockets.get_mut(&m.terminal_id) {
            sockets.remove(&m.socket_id);
            if sockets.is_empty() {
                self.sockets.remove(&m.terminal_id);
            }
        }
    }
}

impl Handler<Ring> for TerminalHub {
    type Result = ();
    fn handle(&mut self, m: Ring, _: &mut Context<Self>) {
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

impl Handler<RingAll> for TerminalHub {
    type Result = ();
    fn handle(&mut self, _: RingAll, _: &mut Context<Self>) {
        for bell in self.sockets.values().flat_map(HashMap::values) {
            bell.ring();
        }
    }
}

impl Handler<ConnectedCount> for TerminalHub {
    type Result = usize;
    fn handle(&mut self, _: ConnectedCount, _: &mut Context<Self>) -> usize {
        self.sockets.values().map(HashMap::len).sum()
    }
}
