//! PostgreSQL LISTEN/NOTIFY: the statements that wake other instances.
//!
//! A notification is only a wake-up; its payload is a hint (who sent it,
//! which terminals) and the receiver re-reads the tables. NOTIFY is sent
//! after the business transaction committed, as its own statement: a
//! transaction with a pending notification takes a cluster-wide lock at
//! commit, so notifying inside business transactions would serialise them
//! all.

use sea_orm::sqlx::postgres::{PgListener, PgPoolOptions};
use sea_orm::ConnectionTrait;

use super::{Store, StoreError, StoreResult};

/// Saga work became runnable or an AI slot freed. Payload: the sender's
/// instance id.
pub const DISPATCH_CHANNEL: &str = "stagehand_dispatch";
/// The review queue changed: a result entered review, or an operator
/// decided one. Payload: the sender's instance id. Its own channel, so the
/// steady stream of dispatch news does not wake every review actor.
pub const REVIEW_CHANNEL: &str = "stagehand_review";
/// An operator was revoked: each instance closes that operator's
/// dashboards. Payload: the sender's instance id.
pub const OPERATORS_CHANNEL: &str = "stagehand_operators";
/// The relay numbered new outbox events. Payload: [`names_payload`] of the
/// terminals.
pub const OUTBOX_CHANNEL: &str = "stagehand_outbox";
/// The visible ranking of experiences changed. Payload: [`names_payload`] of
/// the experiences.
pub const RANKING_CHANNEL: &str = "stagehand_ranking";
/// `application_name` of every instance's LISTEN connection, so operators
/// (and tests) can find it in `pg_stat_activity`.
pub const LISTENER_APPLICATION_NAME: &str = "stagehand-listener";

impl Store {
    /// Sends one notification in its own statement (never call it inside a
    /// transaction).
    pub async fn notify(&self, channel: &str, payload: &str) -> StoreResult<()> {
        self.notify_all(&[(channel, payload.to_owned())]).await
    }

    /// Sends these notifications in one statement, one round trip (never
    /// call it inside a transaction). Nothing is sent for none.
    pub async fn notify_all(&self, notices: &[(&str, String)]) -> StoreResult<()> {
        if notices.is_empty() {
            return Ok(());
        }
        let calls: Vec<String> = (0..notices.len())
            .map(|i| format!("pg_notify(${}, ${})", 2 * i + 1, 2 * i + 2))
            .collect();
        let values = notices
            .iter()
            .flat_map(|(channel, payload)| [(*channel).into(), payload.as_str().into()])
            .collect();
        self.db()
            .execute_raw(self.sql(&format!("SELECT {}", calls.join(", ")), values))
            .await?;
        Ok(())
    }

    /// A LISTEN connection of its own (outside the pool), subscribed to
    /// `channels`. PostgreSQL only.
    pub async fn listen(&self, channels: &[&str]) -> StoreResult<PgListener> {
        if !self.is_postgres() {
            return Err(StoreError::Listener("LISTEN needs PostgreSQL".to_owned()));
        }
        let options = (*self.db().get_postgres_connection_pool().connect_options())
            .clone()
            .application_name(LISTENER_APPLICATION_NAME);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect_with(options)
            .await
            .map_err(|e| StoreError::Listener(e.to_string()))?;
        let mut listener = PgListener::connect_with(&pool)
            .await
            .map_err(|e| StoreError::Listener(e.to_string()))?;
        listener
            .listen_all(channels.iter().copied())
            .await
            .map_err(|e| StoreError::Listener(e.to_string()))?;
        Ok(listener)
    }
}

/// The payload naming some terminals or experiences: the sender's instance
/// id, a space, then the ids separated by commas, or `*` for all.
pub fn names_payload(instance: &str, names: Option<&[&str]>) -> String {
    match names {
        Some(ids) => format!("{instance} {}", ids.join(",")),
        None => format!("{instance} *"),
    }
}

/// Reads a [`names_payload`]: the sender and the names (None: all of them,
/// also for a payload that cannot be read).
pub fn parse_names_payload(payload: &str) -> (&str, Option<Vec<&str>>) {
    match payload.split_once(' ') {
        Some((sender, "*")) | Some((sender, "")) => (sender, None),
        Some((sender, ids)) => (sender, Some(ids.split(',').collect())),
        None => (payload, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_payload_round_trips() {
        let p = names_payload("me", Some(&["t1", "t2"]));
        assert_eq!(parse_names_payload(&p), ("me", Some(vec!["t1", "t2"])));
        let p = names_payload("me", None);
        assert_eq!(parse_names_payload(&p), ("me", None));
        assert_eq!(parse_names_payload("garbage"), ("garbage", None));
    }
}
