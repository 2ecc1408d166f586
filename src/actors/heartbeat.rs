//! Heartbeat of a WebSocket actor: a ping every period, and the verdict
//! "dead" when the peer has sent nothing (not a pong, not a frame) for
//! [`MISSED`] periods. Used by the display and operator sockets, which close
//! a dead peer so its presence goes away.

use std::time::{Duration, Instant};

use actix_ws::Session;

/// Periods without a word from the peer after which it counts as gone.
pub const MISSED: u32 = 3;

pub struct Heartbeat {
    period: Duration,
    last_heard: Instant,
}

impl Heartbeat {
    pub fn new(period: Duration) -> Self {
        Heartbeat {
            period,
            last_heard: Instant::now(),
        }
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// The peer sent something.
    pub fn heard(&mut self) {
        self.last_heard = Instant::now();
    }

    /// Once per period: false when the peer is gone (close it), otherwise
    /// sends the next ping.
    pub fn beat(&self, session: &Session) -> bool {
        if self.last_heard.elapsed() > self.period * MISSED {
            return false;
        }
        let mut session = session.clone();
        crate::metrics::task_spawned("heartbeat.ping");
        actix::spawn(async move {
            let _ = session.ping(b"").await;
        });
        true
    }

    /// Answers the peer's ping.
    pub fn pong(session: &Session, bytes: &[u8]) {
        let (mut session, bytes) = (session.clone(), bytes.to_vec());
        crate::metrics::task_spawned("heartbeat.close");
        actix::spawn(async move {
            let _ = session.pong(&bytes).await;
        });
    }
}
