//! TerminalSocket: one actor per connected booth display, owning its
//! `actix_ws::Session`. It sends `hello`, then streams the terminal's
//! numbered outbox events from the display's own position, in pages, each
//! `seq` once and in order.
//!
//! Backpressure is the socket's own: every frame's send is awaited before
//! the next (the session's outbound queue is bounded), so a slow or stuck
//! display holds only its position in the outbox. It never slows the sagas
//! or other displays, and nothing about it grows: not a queue, not a
//! mailbox. A hub ring only says "there is more"; rings while the socket is
//! busy collapse into one. A display that stops answering pings is closed
//! and resumes from its last `seq` when it reconnects.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_ws::{Message, ProtocolError, Session};
use serde_json::json;

use super::terminal_hub::{Connect, Disconnect, TerminalHub};
use super::wakeups::Doorbell;
use crate::store::{Store, StoreError};

const HEARTBEAT: Duration = Duration::from_secs(10);
const PONG_WINDOW: Duration = Duration::from_secs(30);
/// Events read from the outbox per query.
const PAGE: u64 = 200;

static NEXT_SOCKET_ID: AtomicU64 = AtomicU64::new(1);

/// Why a display's stream ended.
#[derive(Debug, thiserror::Error)]
enum StreamEnd {
    #[error("display closed the connection")]
    Closed,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<actix_ws::Closed> for StreamEnd {
    fn from(_: actix_ws::Closed) -> Self {
        StreamEnd::Closed
    }
}

pub struct TerminalSocket {
    id: u64,
    terminal_id: String,
    /// The terminal's newest `seq` when the display connected.
    last_seq_at_connect: i64,
    /// The display has seen everything up to here.
    after: i64,
    store: Store,
    hub: Addr<TerminalHub>,
    session: Session,
    bell: Doorbell,
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
            after,
            store,
            hub,
            session,
            bell: Doorbell::default(),
            last_heard: Instant::now(),
        }
    }
}

/// Sends `hello`, registers for rings, then streams from `after` for as
/// long as the display takes frames. Registering before the first read
/// means an event numbered in between rings the bell: nothing falls between.
async fn stream(
    mut session: Session,
    store: Store,
    hub: Addr<TerminalHub>,
    connect: Connect,
    hello: String,
    mut after: i64,
) -> Result<(), StreamEnd> {
    session.text(hello).await?;
    let bell = connect.bell.clone();
    let terminal_id = connect.terminal_id.clone();
    hub.send(connect).await.ok();
    loop {
        let page = store.events_after(&terminal_id, after, PAGE).await?;
        for event in &page {
            session.text(event.payload.to_string()).await?;
            after = event.seq;
        }
        if (page.len() as u64) < PAGE {
            bell.rung().await;
        }
    }
}

impl Actor for TerminalSocket {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let hello = json!({
            "type": "hello",
            "terminal_id": self.terminal_id,
            "last_seq": self.last_seq_at_connect,
        });
        let connect = Connect {
            terminal_id: self.terminal_id.clone(),
            socket_id: self.id,
            bell: self.bell.clone(),
        };
        let streaming = stream(
            self.session.clone(),
            self.store.clone(),
            self.hub.clone(),
            connect,
            hello.to_string(),
            self.after,
        );
        ctx.spawn(streaming.into_actor(self).map(|ended, act, ctx| {
            match ended {
                Ok(()) | Err(StreamEnd::Closed) => {}
                Err(e) => {
                    tracing::error!(terminal_id = %act.terminal_id, error = %e, "display stream failed; closing it (it resumes from its last seq)")
                }
            }
            ctx.stop();
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
        let session = self.session.clone();
        actix::spawn(async move {
            let _ = session.close(None).await;
        });
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
