//! TerminalSocket: one actor per connected booth display, owning its
//! `actix_ws::Session`. It sends `hello` and the experience's current top 10,
//! then streams the terminal's numbered outbox events from the display's own
//! position, in pages, each `seq` once and in order, and a new `ranking`
//! frame whenever the top 10 changes.
//!
//! Backpressure is the socket's own: every frame's send is awaited before
//! the next (the session's outbound queue is bounded), so a slow or stuck
//! display holds only its position in the outbox. It never slows the sagas
//! or other displays, and nothing about it grows: not a queue, not a
//! mailbox. A hub ring only says "there is more"; rings while the socket is
//! busy collapse into one, and a ranking is a snapshot (the newest wins).
//!
//! The display acknowledges what it showed with `{"type": "ack", "seq": N}`.
//! The socket keeps the highest and reports it with what it sent, at most
//! once per [`PROGRESS_EVERY`], to its presence row and the terminal's
//! `acked_seq` (neither ever goes down). A ping goes out every heartbeat; a
//! display that has not answered for three heartbeats is closed and its
//! presence row deleted; it resumes from its last `seq` when it reconnects.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_ws::{Message, ProtocolError, Session};
use serde_json::Value;

use super::heartbeat::Heartbeat;
use super::ranking_board::ranking_frame;
use super::shutdown::{GoesAway, ShutdownSignal};
use super::spawn_if_running;
use super::terminal_hub::{Connect, Disconnect, ExperienceFeeds, TerminalHub};
use super::wakeups::{Doorbell, Wakeups};
use crate::clock::SharedClock;
use crate::store::{new_id, Store, StoreError};

/// Events read from the outbox per query.
const PAGE: u64 = 200;
/// A display's progress (what it was sent, what it acknowledged) is written
/// at most this often.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

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

/// What a display socket needs besides its session.
#[derive(Clone)]
pub struct SocketDeps {
    pub store: Store,
    pub hub: Addr<TerminalHub>,
    pub wakeups: Wakeups,
    pub clock: SharedClock,
    pub instance_id: String,
    /// Ping period; three without an answer close the socket.
    pub heartbeat: Duration,
    /// Set when the instance shuts down: the socket closes with 1001.
    pub shutdown: ShutdownSignal,
}

/// Who the display is.
pub struct DisplayOf {
    pub terminal_id: String,
    pub experience_id: String,
    /// The first frame: `{"type": "hello", ...}`.
    pub hello: Value,
    /// The display has seen everything up to here.
    pub after: i64,
}

pub struct TerminalSocket {
    id: String,
    display: DisplayOf,
    deps: SocketDeps,
    session: Session,
    bell: Doorbell,
    heartbeat: Heartbeat,
    /// The highest `seq` sent, kept by the stream.
    sent: Arc<AtomicI64>,
    /// The highest `seq` the display acknowledged (never above `sent`).
    acked: i64,
    /// (sent, acked) as last written.
    reported: (i64, i64),
    /// The stream's task, stopped with the socket.
    streaming: Option<tokio::task::AbortHandle>,
    /// Why the server closes the socket, when it does ("going away").
    close_reason: Option<actix_ws::CloseReason>,
}

impl TerminalSocket {
    pub fn new(display: DisplayOf, deps: SocketDeps, session: Session) -> Self {
        let after = display.after;
        let heartbeat = Heartbeat::new(deps.heartbeat);
        TerminalSocket {
            id: new_id(),
            display,
            deps,
            session,
            bell: Doorbell::default(),
            heartbeat,
            sent: Arc::new(AtomicI64::new(after)),
            acked: after,
            reported: (after, after),
            streaming: None,
            close_reason: None,
        }
    }

    /// Writes what the display was sent and acknowledged, when it moved.
    fn report_progress(&mut self) {
        let progress = (self.sent.load(Ordering::Relaxed), self.acked);
        if progress == self.reported {
            return;
        }
        self.reported = progress;
        let (store, now) = (self.deps.store.clone(), self.deps.clock.now_ms());
        let (socket, terminal) = (self.id.clone(), self.display.terminal_id.clone());
        let stats = self.deps.wakeups.stats.clone();
        spawn_if_running(async move {
            match store
                .display_progress(&socket, &terminal, progress.0, progress.1, now)
                .await
            {
                Ok(()) => stats.ring(),
                Err(e) => {
                    tracing::warn!(terminal_id = %terminal, error = %e, "could not record a display's progress")
                }
            }
        });
    }
}

/// Sends `hello`, registers for rings and rankings, records the display's
/// presence, sends the current top 10, then streams from `after` for as
/// long as the display takes frames. Registering before the first read
/// means an event numbered in between rings the bell: nothing falls
/// between.
async fn stream(
    mut session: Session,
    id: String,
    display: (String, String, String, i64),
    deps: SocketDeps,
    bell: Doorbell,
    sent: Arc<AtomicI64>,
) -> Result<(), StreamEnd> {
    let (terminal_id, experience_id, hello, mut after) = display;
    session.text(hello).await?;
    let connect = Connect {
        terminal_id: terminal_id.clone(),
        experience_id: experience_id.clone(),
        socket_id: id.clone(),
        bell: bell.clone(),
    };
    let Ok(ExperienceFeeds {
        ranking: mut rankings,
        mut printing,
    }) = deps.hub.send(connect).await
    else {
        return Err(StreamEnd::Closed);
    };
    if let Err(e) = deps
        .store
        .display_connected(
            &id,
            &terminal_id,
            &deps.instance_id,
            after,
            deps.clock.now_ms(),
        )
        .await
    {
        tracing::warn!(%terminal_id, error = %e, "could not record a display's presence");
    }
    deps.wakeups.stats.ring();
    rankings.borrow_and_update();
    session
        .text(ranking_frame(&deps.store, &experience_id).await?)
        .await?;
    // What the prints wait for: sent when there is something, and once
    // more (cleared) when it is over.
    let mut printing_shown = false;
    let waiting = printing.borrow_and_update().clone();
    if let Some(frame) = waiting {
        session.text(frame.to_string()).await?;
        printing_shown = true;
    }
    loop {
        crate::metrics::outbox_read();
        let page = deps.store.events_after(&terminal_id, after, PAGE).await?;
        for event in &page {
            crate::metrics::frame_encoded("session_event");
            session.text(event.payload.to_string()).await?;
            after = event.seq;
            sent.store(after, Ordering::Relaxed);
        }
        if (page.len() as u64) < PAGE {
            // Drained: wait for a ring. A ranking frame says nothing about
            // the outbox, so it is sent and the wait goes on (with 100
            // displays, reading again after each one was most of the
            // outbox reads). A ring that comes while a frame is sent is
            // kept by the bell.
            loop {
                tokio::select! {
                    _ = bell.rung() => break,
                    changed = rankings.changed() => {
                        if changed.is_err() {
                            return Err(StreamEnd::Closed); // the hub is gone
                        }
                        let frame = rankings.borrow_and_update().clone();
                        if let Some(frame) = frame {
                            session.text(frame.to_string()).await?;
                        }
                    }
                    changed = printing.changed() => {
                        if changed.is_err() {
                            return Err(StreamEnd::Closed);
                        }
                        let frame = printing.borrow_and_update().clone();
                        match frame {
                            Some(frame) => {
                                session.text(frame.to_string()).await?;
                                printing_shown = true;
                            }
                            None if printing_shown => {
                                session.text(crate::domain::print::PRINTS_GO_ON_FRAME).await?;
                                printing_shown = false;
                            }
                            None => {}
                        }
                    }
                }
            }
        }
    }
}

impl Actor for TerminalSocket {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let display = (
            self.display.terminal_id.clone(),
            self.display.experience_id.clone(),
            self.display.hello.to_string(),
            self.display.after,
        );
        let streaming = stream(
            self.session.clone(),
            self.id.clone(),
            display,
            self.deps.clone(),
            self.bell.clone(),
            self.sent.clone(),
        );
        // On the runtime, not the actor's local set: the stream holds
        // database connections, and sqlx must drop one inside the runtime.
        crate::metrics::task_spawned("terminal_socket.stream");
        let streaming = tokio::spawn(streaming);
        self.streaming = Some(streaming.abort_handle());
        ctx.spawn(streaming.into_actor(self).map(|ended, act, ctx| {
            match ended.unwrap_or(Err(StreamEnd::Closed)) {
                Ok(()) | Err(StreamEnd::Closed) => {}
                Err(e) => {
                    tracing::error!(terminal_id = %act.display.terminal_id, error = %e, "display stream failed; closing it (it resumes from its last seq)")
                }
            }
            ctx.stop();
        }));

        ctx.run_interval(self.heartbeat.period(), |act, ctx| {
            if !act.heartbeat.beat(&act.session) {
                tracing::info!(terminal_id = %act.display.terminal_id, "display missed its pongs; closing");
                ctx.stop();
            }
        });
        ctx.run_interval(PROGRESS_EVERY, |act, _| act.report_progress());
        self.deps.shutdown.clone().stop_on_shutdown(self, ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(streaming) = self.streaming.take() {
            streaming.abort();
        }
        self.report_progress();
        self.deps.hub.do_send(Disconnect {
            terminal_id: self.display.terminal_id.clone(),
            experience_id: self.display.experience_id.clone(),
            socket_id: self.id.clone(),
        });
        let (store, socket, stats) = (
            self.deps.store.clone(),
            self.id.clone(),
            self.deps.wakeups.stats.clone(),
        );
        spawn_if_running(async move {
            if let Err(e) = store.display_disconnected(&socket).await {
                tracing::warn!(error = %e, "could not remove a display's presence; it expires");
            }
            stats.ring();
        });
        let (session, reason) = (self.session.clone(), self.close_reason.take());
        crate::metrics::task_spawned("terminal_socket.close");
        actix::spawn(async move {
            let _ = session.close(reason).await;
        });
    }
}

/// What a display may send: only acknowledgements.
#[derive(serde::Deserialize)]
struct Ack {
    #[serde(rename = "type")]
    kind: String,
    seq: i64,
}

impl StreamHandler<Result<Message, ProtocolError>> for TerminalSocket {
    fn handle(&mut self, msg: Result<Message, ProtocolError>, ctx: &mut Self::Context) {
        crate::metrics::actor_message("TerminalSocket");
        self.heartbeat.heard();
        match msg {
            Ok(Message::Ping(bytes)) => Heartbeat::pong(&self.session, &bytes),
            Ok(Message::Text(text)) => match serde_json::from_str::<Ack>(&text) {
                // An ack never goes past what was sent, nor backwards.
                Ok(ack) if ack.kind == "ack" => {
                    let sent = self.sent.load(Ordering::Relaxed);
                    self.acked = self.acked.max(ack.seq.min(sent));
                }
                _ => {
                    tracing::debug!(terminal_id = %self.display.terminal_id, "ignored a frame that is not an ack")
                }
            },
            Ok(Message::Close(_)) | Err(_) => ctx.stop(),
            Ok(_) => {}
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl GoesAway for TerminalSocket {
    fn going_away(&mut self, reason: actix_ws::CloseReason) {
        self.close_reason = Some(reason);
    }
}
