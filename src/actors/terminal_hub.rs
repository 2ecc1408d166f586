//! TerminalHub: knows which display sockets are connected for each terminal
//! and forwards committed outbox events to them. It keeps no events itself:
//! a socket that misses one catches up from the outbox by `seq`.

use std::collections::HashMap;

use actix::prelude::*;

use crate::store::outbox::TerminalEvent;

/// A socket of `terminal_id` wants live events. Answered once registered,
/// so the socket can read the outbox after it without a gap.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Connect {
    pub terminal_id: String,
    pub socket_id: u64,
    pub recipient: Recipient<Deliver>,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Disconnect {
    pub terminal_id: String,
    pub socket_id: u64,
}

/// A committed event to push.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Publish(pub TerminalEvent);

/// What a socket receives from the hub.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Deliver(pub TerminalEvent);

/// How many display sockets are connected (for stats and tests).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct ConnectedCount;

#[derive(Default)]
pub struct TerminalHub {
    sockets: HashMap<String, HashMap<u64, Recipient<Deliver>>>,
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
            .insert(m.socket_id, m.recipient);
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

impl Handler<Publish> for TerminalHub {
    type Result = ();
    fn handle(&mut self, m: Publish, _: &mut Context<Self>) {
        if let Some(sockets) = self.sockets.get(&m.0.terminal_id) {
            for recipient in sockets.values() {
                // A full or closed mailbox must not stall the hub; the
                // display catches up from the outbox when it reconnects.
                let _ = recipient.try_send(Deliver(m.0.clone()));
            }
        }
    }
}

impl Handler<ConnectedCount> for TerminalHub {
    type Result = usize;
    fn handle(&mut self, _: ConnectedCount, _: &mut Context<Self>) -> usize {
        self.sockets.values().map(HashMap::len).sum()
    }
}
