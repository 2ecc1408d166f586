//! TerminalSocket: one actor per connected booth display, owning its
//! `actix_ws::Session`. It sends `hello`, replays the outbox after the
//! display's last seen `seq`, then forwards live events, each `seq` once and
//! in order. A display that cannot keep up is disconnected and resumes from
//! its last `seq`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_ws::{Message, ProtocolError, Session};
use serde_json::json;
use tokio::sync::mpsc;

use super::terminal_hub::{Connect, Deliver, Disconnect, TerminalHub};
use crate::store::Store;

const HEARTBEAT: Duration = Duration::from_secs(10);
const PONG_WINDOW: Duration = Duration::from_secs(30);
/// Frames queued for one display before it counts as too slow.
const OUTBOUND_QUEUE: usize = 256;
/// Events replayed per connection at most; older ones need a newer `after`.
const REPLAY_LIMIT: u64 = 1_000;

static NEXT_SOCKET_ID: AtomicU64 = AtomicU64::new(1);

pub struct TerminalSocket {
    id: u64,
    terminal_id: String,
    /// The terminal's newest `seq` when the display connected.
    last_seq_at_connect: i64,
    /// Highest `seq` sent so far; the display asked for everything after
    /// `after`, so this starts there.
    last_sent: i64,
    store: Store,
    hub: Addr<TerminalHub>,
    session: Session,
    outbound: Option<mpsc::Sender<String>>,
    last_heard: Instant,
}

impl TerminalSocket {
    pub fn new(
        terminal_id: String,
        last_seq_at_connect: i64,
        after: i64,
        store: Store,
        hub: Addr<TerminalHub>,
        session: Session,
    ) -> Self {
        TerminalSocket {
            id: NEXT_SOCKET_ID.fetch_add(1, Ordering::Relaxed),
            terminal_id,
            last_seq_at_connect,
            last_sent: after,
            store,
            hub,
            session,
            outbound: None,
            last_heard: Instant::now(),
        }
    }

    /// Queues a frame; a full queue means the display is too slow.
    fn send_frame(&mut self, text: String, ctx: &mut ws::Ctx) {
        let sent = match &self.outbound {
            Some(tx) => tx.try_send(text).is_ok(),
            None => false,
        };
        if !sent {
            tracing::info!(terminal_id = %self.terminal_id, "display too slow or gone; closing its socket");
            ctx.stop();
        }
    }

    fn send_event(&mut self, seq: i64, payload: &serde_json::Value, ctx: &mut ws::Ctx) {
        if seq > self.last_sent {
            self.last_sent = seq;
            self.send_frame(payload.to_string(), ctx);
        }
    }
}

mod ws {
    pub type Ctx = actix::Context<super::TerminalSocket>;
}

impl Actor for TerminalSocket {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // One writer task keeps frames in order on the session.
        let (tx, mut rx) = mpsc::channel::<String>(OUTBOUND_QUEUE);
        self.outbound = Some(tx);
        let mut session = self.session.clone();
        actix::spawn(async move {
            while let Some(text) = rx.recv().await {
                if session.text(text).await.is_err() {
                    break;
                }
            }
        });
        let hello = json!({
            "type": "hello",
            "terminal_id": self.terminal_id,
            "last_seq": self.last_seq_at_connect,
        });
        self.send_frame(hello.to_string(), ctx);

        // Register with the hub first, then read the outbox: an event that
        // commits in between arrives both ways and is sent once (by `seq`).
        let hub = self.hub.clone();
        let store = self.store.clone();
        let connect = Connect {
            terminal_id: self.terminal_id.clone(),
            socket_id: self.id,
            recipient: ctx.address().recipient(),
        };
        let (terminal_id, after) = (self.terminal_id.clone(), self.last_sent);
        let replay = async move {
            hub.send(connect).await.ok();
            store.events_after(&terminal_id, after, REPLAY_LIMIT).await
        };
        // `wait`: no live event is handled before the replay is sent.
        ctx.wait(replay.into_actor(self).map(|events, act, ctx| match events {
            Ok(events) => {
                for event in events {
                    act.send_event(event.seq, &event.payload, ctx);
                }
            }
            Err(e) => {
                tracing::error!(terminal_id = %act.terminal_id, error = %e, "outbox replay failed");
                ctx.stop();
            }
        }));

        ctx.run_interval(HEARTBEAT, |act, ctx| {
            if act.last_heard.elapsed() > PONG_WINDOW {
                tracing::info!(terminal_id = %act.terminal_id, "display missed its pongs; closing");
                ctx.stop();
                return;
            }
            let mut session = act.session.clone();
            actix::spawn(async move {
                let _ = session.ping(b"").await;
            });
        });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.hub.do_send(Disconnect {
            terminal_id: self.terminal_id.clone(),
            socket_id: self.id,
        });
        self.outbound = None;
        let session = self.session.clone();
        actix::spawn(async move {
            let _ = session.close(None).await;
        });
    }
}

impl Handler<Deliver> for TerminalSocket {
    type Result = ();
    fn handle(&mut self, m: Deliver, ctx: &mut Self::Context) {
        self.send_event(m.0.seq, &m.0.payload, ctx);
    }
}

impl StreamHandler<Result<Message, ProtocolError>> for TerminalSocket {
    fn handle(&mut self, msg: Result<Message, ProtocolError>, ctx: &mut Self::Context) {
        self.last_heard = Instant::now();
        match msg {
            Ok(Message::Ping(bytes)) => {
                let mut session = self.session.clone();
                actix::spawn(async move {
                    let _ = session.pong(&bytes).await;
                });
            }
            Ok(Message::Close(_)) | Err(_) => ctx.stop(),
            // Acknowledgements (`{"type": "ack", "seq"}`) are read by the
            // presence feature; nothing else is expected from a display.
            Ok(_) => {}
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
