//! OperatorSocket: one actor per connected operator dashboard, owning its
//! `actix_ws::Session`. It sends the newest `stats` frame at once, then
//! each new one the [`OperatorHub`] makes (a few a second at most), each
//! after a `saga` frame per recent saga that changed since the last. A slow
//! dashboard skips to the newest frame; each frame is whole, so nothing it
//! needs is lost. The review queue comes as `review.added` (with the item)
//! for each item it does not hold yet and `review.removed` for each it
//! holds that left (decided, or cancelled). Operators send nothing but pings and pongs; the heartbeat
//! closes a dashboard that went away, and a revocation of its operator
//! closes it with 4401.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use actix::prelude::*;
use actix_ws::{Message, ProtocolError, Session};

use super::heartbeat::Heartbeat;
use super::operator_hub::{OperatorHub, Subscribe, WatchRevocations};
use super::shutdown::{GoesAway, ShutdownSignal};

/// The close code of a dashboard whose operator was revoked.
pub const REVOKED_CLOSE_CODE: u16 = 4401;

pub struct OperatorSocket {
    hub: Addr<OperatorHub>,
    /// The operator account it was opened with (None: the bootstrap
    /// token), and the store to check it is still valid.
    operator_id: Option<String>,
    store: crate::store::Store,
    session: Session,
    heartbeat: Heartbeat,
    streaming: Option<tokio::task::AbortHandle>,
    /// Set when the instance shuts down: the socket closes with 1001.
    shutdown: ShutdownSignal,
    /// Why the server closes the socket, when it does ("going away").
    close_reason: Option<actix_ws::CloseReason>,
    /// Counts this socket in `/metrics` while it lives.
    _gauge: crate::metrics::SocketGauge,
}

impl OperatorSocket {
    pub fn new(
        hub: Addr<OperatorHub>,
        operator_id: Option<String>,
        store: crate::store::Store,
        session: Session,
        heartbeat: Duration,
        shutdown: ShutdownSignal,
    ) -> Self {
        OperatorSocket {
            hub,
            operator_id,
            store,
            session,
            heartbeat: Heartbeat::new(heartbeat),
            streaming: None,
            shutdown,
            close_reason: None,
            _gauge: crate::metrics::operator_socket_connected(),
        }
    }
}

/// Sends each newest snapshot until the dashboard or the hub goes away: a
/// `saga` frame for each recent saga that changed since the last snapshot
/// sent (oldest first; none for the first, whose `stats.recent` has them
/// all), then the `stats` frame.
async fn stream(mut session: Session, hub: Addr<OperatorHub>) {
    let Ok(mut frames) = hub.send(Subscribe).await else {
        return;
    };
    // The `updated_at_ms` of each saga last sent.
    let mut sent: Option<HashMap<String, i64>> = None;
    // The review items this dashboard holds.
    let mut in_review: HashSet<String> = HashSet::new();
    // The printers frame last sent.
    let mut printers_sent: Option<String> = None;
    while frames.changed().await.is_ok() {
        let Some(snapshot) = frames.borrow_and_update().clone() else {
            continue;
        };
        let now_waiting: HashSet<&str> =
            snapshot.review.iter().map(|(id, _)| id.as_str()).collect();
        let gone: Vec<String> = in_review
            .iter()
            .filter(|id| !now_waiting.contains(id.as_str()))
            .cloned()
            .collect();
        for saga_id in gone {
            let frame = serde_json::json!({"type": "review.removed", "saga_id": saga_id});
            if session.text(frame.to_string()).await.is_err() {
                return;
            }
            in_review.remove(&saga_id);
        }
        for (saga_id, frame) in &snapshot.review {
            if !in_review.contains(saga_id) {
                if session.text(frame.clone()).await.is_err() {
                    return;
                }
                in_review.insert(saga_id.clone());
            }
        }
        if let Some(sent) = &sent {
            for (saga_id, updated_at, frame) in snapshot.sagas.iter().rev() {
                if sent.get(saga_id).is_none_or(|at| at < updated_at)
                    && session.text(frame.clone()).await.is_err()
                {
                    return;
                }
            }
        }
        sent = Some(
            snapshot
                .sagas
                .iter()
                .map(|(id, at, _)| (id.clone(), *at))
                .collect(),
        );
        if printers_sent.as_ref() != Some(&snapshot.printers) {
            if session.text(snapshot.printers.clone()).await.is_err() {
                return;
            }
            printers_sent = Some(snapshot.printers.clone());
        }
        if session.text(snapshot.stats.clone()).await.is_err() {
            return;
        }
    }
}

/// Completes once operator `id` is revoked: checked whenever the hub hears
/// of a revocation (here or on another instance). A check that fails is
/// tried again at the next news.
async fn until_revoked(hub: Addr<OperatorHub>, store: crate::store::Store, id: String) {
    let Ok(mut revocations) = hub.send(WatchRevocations).await else {
        return std::future::pending().await;
    };
    // A revocation between the token's check and this subscription is
    // seen by this first look.
    revocations.mark_changed();
    while revocations.changed().await.is_ok() {
        match store.operator_active(&id).await {
            Ok(false) => return,
            Ok(true) => {}
            Err(e) => {
                tracing::warn!(error = %e, "could not check an operator dashboard's operator; checking again at the next revocation")
            }
        }
    }
    std::future::pending().await
}

impl Actor for OperatorSocket {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::metrics::task_spawned("operator_socket.stream");
        let streaming = tokio::spawn(stream(self.session.clone(), self.hub.clone()));
        self.streaming = Some(streaming.abort_handle());
        ctx.spawn(streaming.into_actor(self).map(|_, _, ctx| ctx.stop()));
        ctx.run_interval(self.heartbeat.period(), |act, ctx| {
            if !act.heartbeat.beat(&act.session) {
                tracing::info!("operator dashboard missed its pongs; closing");
                ctx.stop();
            }
        });
        self.shutdown.clone().stop_on_shutdown(self, ctx);
        if let Some(id) = self.operator_id.clone() {
            let revoked = until_revoked(self.hub.clone(), self.store.clone(), id);
            ctx.spawn(revoked.into_actor(self).map(|(), act, ctx| {
                tracing::info!("operator revoked: closing its dashboard");
                act.close_reason = Some(actix_ws::CloseReason {
                    code: actix_ws::CloseCode::Other(REVOKED_CLOSE_CODE),
                    description: Some("this operator was revoked".into()),
                });
                ctx.stop();
            }));
        }
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(streaming) = self.streaming.take() {
            streaming.abort();
        }
        let (session, reason) = (self.session.clone(), self.close_reason.take());
        crate::metrics::task_spawned("operator_socket.close");
        actix::spawn(async move {
            let _ = session.close(reason).await;
        });
    }
}

impl StreamHandler<Result<Message, ProtocolError>> for OperatorSocket {
    fn handle(&mut self, msg: Result<Message, ProtocolError>, ctx: &mut Self::Context) {
        crate::metrics::actor_message("OperatorSocket");
        self.heartbeat.heard();
        match msg {
            Ok(Message::Ping(bytes)) => Heartbeat::pong(&self.session, &bytes),
            Ok(Message::Close(_)) | Err(_) => ctx.stop(),
            Ok(_) => {}
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl GoesAway for OperatorSocket {
    fn going_away(&mut self, reason: actix_ws::CloseReason) {
        self.close_reason = Some(reason);
    }
}
