//! The shutdown signal: set once, when the instance begins to shut down
//! (SIGTERM or SIGINT). From then on `/readyz` answers 503, and every
//! display and operator socket closes with 1001 "going away", so a display
//! reconnects to another instance and resumes from its last `seq`. Not an
//! actor: a `watch` flag that anyone may wait on. The shutdown's order is
//! in [`crate::startup::Shutdown`].

use std::sync::Arc;

use actix::prelude::*;
use actix_ws::{CloseCode, CloseReason};
use tokio::sync::watch;

/// A socket actor that closes with "going away" when the instance shuts
/// down.
pub trait GoesAway: Actor<Context = Context<Self>> {
    /// Remember why: the actor's `stopped` closes the socket with it.
    fn going_away(&mut self, reason: CloseReason);
}

#[derive(Clone)]
pub struct ShutdownSignal(Arc<watch::Sender<bool>>);

impl Default for ShutdownSignal {
    fn default() -> Self {
        ShutdownSignal(Arc::new(watch::channel(false).0))
    }
}

impl ShutdownSignal {
    /// Sets the signal (again is a no-op).
    pub fn trigger(&self) {
        self.0.send_replace(true);
    }

    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Returns once the signal is set (at once if it is).
    pub async fn wait(&self) {
        let mut set = self.0.subscribe();
        let _ = set.wait_for(|s| *s).await;
    }

    /// Stops `actor` with [`going_away`] once the signal is set.
    pub fn stop_on_shutdown<A: GoesAway>(&self, actor: &A, ctx: &mut Context<A>) {
        let signal = self.clone();
        crate::metrics::task_spawned("shutdown.watch");
        ctx.spawn(
            async move { signal.wait().await }
                .into_actor(actor)
                .map(|_, act, ctx| {
                    act.going_away(going_away());
                    ctx.stop();
                }),
        );
    }
}

/// How sockets are closed when the instance shuts down.
pub fn going_away() -> CloseReason {
    CloseReason {
        code: CloseCode::Away,
        description: Some("server shutting down; reconnect".to_owned()),
    }
}
