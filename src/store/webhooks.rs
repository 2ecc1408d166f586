//! Webhooks: the organiser's endpoints, and the outbox of deliveries to
//! them.
//!
//! - **Written with the event.** A delivery row is inserted in the
//!   transaction that makes its event (a completion, an abort, an erasure,
//!   a print's end), one statement for a whole batch of events and every
//!   endpoint that takes them ([`enqueue_statement`]), so an event is
//!   never lost between its commit and its delivery, and nothing is sent
//!   for an event that rolled back. It is added only while some endpoint
//!   takes that event ([`HookBook`], this process's view of the enabled
//!   endpoints, read again every [`LISTENERS_REFRESH`] and at once on the
//!   instance that changed them): with no endpoint, the saga's path pays
//!   nothing.
//! - **Sent by a lease.** The sender claims due deliveries
//!   ([`Store::claim_deliveries`]; a lease under its token, so two
//!   instances never have one in flight at once) and writes each outcome
//!   fenced on that token ([`Store::delivery_answered`]).
//! - **The `webhook-id`** is the row's id, derived from the event's id and
//!   the endpoint's: the same on every attempt, and one per event and
//!   endpoint.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, DbBackend, EntityTrait,
    QueryFilter, QueryOrder, QuerySelect, Statement, Value,
};
use serde_json::{json, Value as Json};

use super::entities::{experiences, webhook_deliveries, webhooks};
use super::rows::{SqlType, ValueRows};
use super::{new_id, sql_for, Store, StoreError, StoreResult, WriteTx};
use crate::domain::policy::EpochMs;
use crate::domain::webhook::WebhookEvent;

/// How often an instance reads again which events the enabled endpoints
/// take: an endpoint added on another instance gets events from at most
/// this long after.
pub const LISTENERS_REFRESH: Duration = Duration::from_secs(2);

/// What this process knows of the endpoints: the events some enabled
/// endpoint takes, as it last read them (a bit per [`WebhookEvent`]), and
/// the public base URL the links in a body are made with.
#[derive(Debug, Default)]
pub struct HookBook {
    events: AtomicU8,
    base_url: std::sync::RwLock<String>,
}

impl HookBook {
    fn bit(event: WebhookEvent) -> u8 {
        let index = WebhookEvent::ALL
            .iter()
            .position(|e| *e == event)
            .expect("every event is in ALL");
        1 << index
    }

    /// Whether some enabled endpoint takes `event`.
    pub fn take(&self, event: WebhookEvent) -> bool {
        self.events.load(Ordering::Acquire) & Self::bit(event) != 0
    }

    /// The public base URL (`https://booth.example.com`, no trailing
    /// slash) the bodies' links start with.
    pub fn set_base_url(&self, base: &str) {
        if let Ok(mut url) = self.base_url.write() {
            *url = base.trim_end_matches('/').to_owned();
        }
    }

    /// `path` (`/r/…`, `/media/r/…`) as an absolute link.
    pub fn link(&self, path: &str) -> String {
        let base = self.base_url.read().map(|b| b.clone()).unwrap_or_default();
        format!("{base}{path}")
    }

    fn set(&self, endpoints: &[webhooks::Model]) {
        let mut bits = 0;
        for endpoint in endpoints.iter().filter(|e| e.enabled) {
            for event in endpoint.events.split(',').filter_map(WebhookEvent::parse) {
                bits |= Self::bit(event);
            }
        }
        self.events.store(bits, Ordering::Release);
    }
}

/// One event for the endpoints that take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookEvent {
    pub event: WebhookEvent,
    /// The guest's session it is about.
    pub session_id: String,
    /// Its experience (the body names it by slug).
    pub experience_id: String,
    /// The rest of the body's `data` (an object): the links, the score, …
    pub data: Json,
}

/// The body every endpoint gets for `event` of experience `slug`, made at
/// `at`: `{"type", "timestamp", "data": {"session_id", "experience",
/// ...}}`.
pub fn hook_body(event: &HookEvent, slug: &str, at: EpochMs) -> String {
    let mut data = json!({"session_id": event.session_id, "experience": slug});
    if let (Some(all), Some(more)) = (data.as_object_mut(), event.data.as_object()) {
        for (k, v) in more {
            all.insert(k.clone(), v.clone());
        }
    }
    json!({
        "type": event.event.as_str(),
        "timestamp": crate::clock::rfc3339(at),
        "data": data,
    })
    .to_string()
}

/// The insert of one delivery per event (with its experience's slug) and
/// enabled endpoint that takes it, for a transaction; None when there is
/// no event.
pub(crate) fn enqueue_statement(
    backend: DbBackend,
    events: &[(HookEvent, String)],
    now: EpochMs,
) -> Option<Statement> {
    if events.is_empty() {
        return None;
    }
    let mut rows = ValueRows::new(&[SqlType::Text, SqlType::Text, SqlType::Text, SqlType::Text]);
    for (event, slug) in events {
        rows.push([
            Value::from(uuid::Uuid::new_v4().simple().to_string()),
            Value::from(event.event.as_str()),
            Value::from(event.session_id.clone()),
            Value::from(hook_body(event, slug, now)),
        ]);
    }
    let mut values = vec![Value::from(now)];
    let source = rows.source(backend, 2, &mut values);
    Some(sql_for(
        backend,
        &format!(
            "INSERT INTO webhook_deliveries (id, webhook_id, event_id, event, session_id, payload, \
             status, attempts, next_attempt_at_ms, created_at_ms, updated_at_ms) \
             WITH v(event_id, event, session_id, payload) AS ({source}) \
             SELECT 'msg_' || v.event_id || '_' || w.id, w.id, v.event_id, v.event, v.session_id, \
             v.payload, 'PENDING', 0, $1, $1, $1 \
             FROM v JOIN webhooks w ON w.enabled = TRUE \
             AND (',' || w.events || ',') LIKE ('%,' || v.event || ',%')"
        ),
        values,
    ))
}

/// A delivery's attempt, as the sender saw it.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The status it was answered with (None: no answer).
    pub status: Option<u16>,
    /// Why it failed, when it did.
    pub error: Option<String>,
    pub latency_ms: i32,
    /// When to try again (None: delivered, or failed for good).
    pub retry_at_ms: Option<EpochMs>,
}

impl Store {
    /// This process's view of the endpoints.
    pub fn hooks(&self) -> &HookBook {
        &self.hooks
    }

    /// Reads the endpoints again into [`Store::hooks`]: them all.
    pub async fn refresh_listeners(&self) -> StoreResult<Vec<webhooks::Model>> {
        let endpoints = self.webhooks().await?;
        self.hooks.set(&endpoints);
        Ok(endpoints)
    }

    /// Inserts the deliveries of `events` in `tx`, for those some endpoint
    /// takes (as far as this process knows).
    pub(crate) async fn enqueue_hooks(
        &self,
        tx: &WriteTx,
        events: Vec<HookEvent>,
        now: EpochMs,
    ) -> StoreResult<()> {
        let taken: Vec<HookEvent> = events
            .into_iter()
            .filter(|e| self.hooks.take(e.event))
            .collect();
        if taken.is_empty() {
            return Ok(());
        }
        let mut ids: Vec<String> = taken.iter().map(|e| e.experience_id.clone()).collect();
        ids.sort_unstable();
        ids.dedup();
        let slugs: std::collections::HashMap<String, String> = experiences::Entity::find()
            .filter(experiences::Column::Id.is_in(ids))
            .all(&**tx)
            .await?
            .into_iter()
            .map(|e| (e.id, e.slug))
            .collect();
        let named: Vec<(HookEvent, String)> = taken
            .into_iter()
            .map(|mut e| {
                self.absolute_links(&mut e.data);
                let slug = slugs.get(&e.experience_id).cloned().unwrap_or_default();
                (e, slug)
            })
            .collect();
        if let Some(insert) = enqueue_statement(self.backend(), &named, now) {
            tx.execute_raw(insert).await?;
        }
        Ok(())
    }

    /// The body's links (`share_url`, `media_url`: paths of this server)
    /// made absolute with the public URL.
    fn absolute_links(&self, data: &mut Json) {
        for key in ["share_url", "media_url"] {
            if let Some(path) = data[key].as_str().filter(|p| p.starts_with('/')) {
                data[key] = json!(self.hooks.link(path));
            }
        }
    }

    /// Adds an endpoint; `secret` is stored as given (sealed by the caller).
    pub async fn create_webhook(
        &self,
        url: &str,
        events: &[WebhookEvent],
        sealed_secret: &str,
        now: EpochMs,
    ) -> StoreResult<webhooks::Model> {
        let list: Vec<&str> = events.iter().map(|e| e.as_str()).collect();
        let model = webhooks::ActiveModel {
            id: Set(new_id()),
            url: Set(url.to_owned()),
            events: Set(list.join(",")),
            secret: Set(sealed_secret.to_owned()),
            enabled: Set(true),
            disabled_reason: Set(None),
            failing_since_ms: Set(None),
            created_at_ms: Set(now),
        }
        .insert(self.db())
        .await?;
        self.refresh_listeners().await?;
        Ok(model)
    }

    /// Every endpoint, oldest first.
    pub async fn webhooks(&self) -> StoreResult<Vec<webhooks::Model>> {
        Ok(webhooks::Entity::find()
            .order_by_asc(webhooks::Column::CreatedAtMs)
            .order_by_asc(webhooks::Column::Id)
            .all(self.db())
            .await?)
    }

    pub async fn webhook(&self, id: &str) -> StoreResult<Option<webhooks::Model>> {
        Ok(webhooks::Entity::find_by_id(id.to_owned())
            .one(self.db())
            .await?)
    }

    /// Removes an endpoint and its deliveries; `NotFound` when there is
    /// none.
    pub async fn delete_webhook(&self, id: &str) -> StoreResult<()> {
        let tx = self.write_tx().await?;
        tx.execute_raw(self.sql(
            "DELETE FROM webhook_deliveries WHERE webhook_id = $1",
            vec![id.into()],
        ))
        .await?;
        let removed = tx
            .execute_raw(self.sql("DELETE FROM webhooks WHERE id = $1", vec![id.into()]))
            .await?
            .rows_affected();
        tx.commit().await?;
        if removed == 0 {
            return Err(StoreError::NotFound("webhook"));
        }
        self.refresh_listeners().await.map(drop)
    }

    /// Turns an endpoint on again (after it was disabled): its deliveries
    /// still pending are due now.
    pub async fn enable_webhook(&self, id: &str, now: EpochMs) -> StoreResult<webhooks::Model> {
        let tx = self.write_tx().await?;
        let changed = tx
            .execute_raw(self.sql(
                "UPDATE webhooks SET enabled = TRUE, disabled_reason = NULL, failing_since_ms = NULL \
                 WHERE id = $1",
                vec![id.into()],
            ))
            .await?
            .rows_affected();
        if changed == 0 {
            return Err(StoreError::NotFound("webhook"));
        }
        tx.execute_raw(self.sql(
            "UPDATE webhook_deliveries SET next_attempt_at_ms = $2 \
             WHERE webhook_id = $1 AND status = 'PENDING' AND next_attempt_at_ms > $2",
            vec![id.into(), now.into()],
        ))
        .await?;
        tx.commit().await?;
        self.refresh_listeners().await?;
        self.webhook(id)
            .await?
            .ok_or(StoreError::NotFound("webhook"))
    }

    /// Claims up to `limit` due deliveries of endpoint `webhook_id` (while
    /// it is enabled) that no live lease holds, oldest due first, for
    /// `lease_ms` under `token`.
    pub async fn claim_deliveries(
        &self,
        webhook_id: &str,
        token: &str,
        now: EpochMs,
        lease_ms: i64,
        limit: i64,
    ) -> StoreResult<Vec<webhook_deliveries::Model>> {
        let ids = self
            .lease_rows(
                "webhook_deliveries",
                "SELECT d.id FROM webhook_deliveries d \
                 JOIN webhooks w ON w.id = d.webhook_id AND w.enabled = TRUE \
                 WHERE d.status = 'PENDING' AND d.next_attempt_at_ms <= $2 \
                 AND (d.lease_until_ms IS NULL OR d.lease_until_ms < $2) AND d.webhook_id = $5 \
                 ORDER BY d.next_attempt_at_ms, d.created_at_ms LIMIT $4",
                (token, now, lease_ms),
                limit,
                vec![webhook_id.into()],
            )
            .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        Ok(webhook_deliveries::Entity::find()
            .filter(webhook_deliveries::Column::Id.is_in(ids))
            .filter(webhook_deliveries::Column::LeaseToken.eq(token))
            .order_by_asc(webhook_deliveries::Column::NextAttemptAtMs)
            .order_by_asc(webhook_deliveries::Column::CreatedAtMs)
            .all(self.db())
            .await?)
    }

    /// When the next pending delivery of an enabled endpoint is due.
    pub async fn next_delivery_due(&self) -> StoreResult<Option<EpochMs>> {
        let row = self
            .db()
            .query_one_raw(self.sql(
                "SELECT MIN(d.next_attempt_at_ms) FROM webhook_deliveries d \
                 JOIN webhooks w ON w.id = d.webhook_id AND w.enabled = TRUE \
                 WHERE d.status = 'PENDING'",
                vec![],
            ))
            .await?;
        Ok(row.and_then(|r| r.try_get_by_index::<Option<i64>>(0).ok().flatten()))
    }

    /// Writes a claimed delivery's attempt, fenced on its lease, and the
    /// endpoint's failing streak: cleared by a success, started by a
    /// failure (kept while it goes on). `Conflict` when the lease was
    /// lost.
    pub async fn delivery_answered(
        &self,
        delivery: &webhook_deliveries::Model,
        token: &str,
        attempt: &Attempt,
        now: EpochMs,
    ) -> StoreResult<()> {
        let delivered = attempt.error.is_none();
        let status = match (delivered, attempt.retry_at_ms) {
            (true, _) => "DELIVERED",
            (false, Some(_)) => "PENDING",
            (false, None) => "FAILED",
        };
        let tx = self.write_tx().await?;
        let written = tx
            .execute_raw(self.sql(
                "UPDATE webhook_deliveries SET status = $1, attempts = attempts + 1, \
                 last_status = $2, last_error = $3, last_latency_ms = $4, \
                 next_attempt_at_ms = $5, updated_at_ms = $6, \
                 delivered_at_ms = CASE WHEN $7 THEN $6 ELSE delivered_at_ms END, \
                 lease_token = NULL, lease_until_ms = NULL \
                 WHERE id = $8 AND lease_token = $9",
                vec![
                    status.into(),
                    attempt.status.map(i32::from).into(),
                    attempt.error.clone().into(),
                    attempt.latency_ms.into(),
                    attempt.retry_at_ms.unwrap_or(delivery.next_attempt_at_ms).into(),
                    now.into(),
                    delivered.into(),
                    delivery.id.clone().into(),
                    token.into(),
                ],
            ))
            .await?
            .rows_affected();
        if written == 0 {
            return Err(StoreError::Conflict(format!(
                "delivery {}: the lease was lost; nothing was written",
                delivery.id
            )));
        }
        let streak = if delivered {
            "UPDATE webhooks SET failing_since_ms = NULL WHERE id = $1 AND failing_since_ms IS NOT NULL"
        } else {
            "UPDATE webhooks SET failing_since_ms = $2 WHERE id = $1 AND failing_since_ms IS NULL"
        };
        let mut values: Vec<Value> = vec![delivery.webhook_id.clone().into()];
        if !delivered {
            values.push(now.into());
        }
        tx.execute_raw(self.sql(streak, values)).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Disables the enabled endpoints that have been failing since before
    /// `failing_before`; the ones disabled.
    pub async fn disable_failing_webhooks(
        &self,
        failing_before: EpochMs,
        reason: &str,
    ) -> StoreResult<Vec<webhooks::Model>> {
        let rows = self
            .write_returning(self.sql(
                "UPDATE webhooks SET enabled = FALSE, disabled_reason = $1 \
                 WHERE enabled = TRUE AND failing_since_ms IS NOT NULL AND failing_since_ms < $2 \
                 RETURNING id",
                vec![reason.into(), failing_before.into()],
            ))
            .await?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = rows
            .iter()
            .map(|r| r.try_get_by_index::<String>(0))
            .collect::<Result<_, _>>()?;
        self.refresh_listeners().await?;
        Ok(webhooks::Entity::find()
            .filter(webhooks::Column::Id.is_in(ids))
            .all(self.db())
            .await?)
    }

    /// An endpoint's deliveries, newest first (at most `limit`).
    pub async fn deliveries_of(
        &self,
        webhook_id: &str,
        limit: u64,
    ) -> StoreResult<Vec<webhook_deliveries::Model>> {
        Ok(webhook_deliveries::Entity::find()
            .filter(webhook_deliveries::Column::WebhookId.eq(webhook_id))
            .order_by_desc(webhook_deliveries::Column::CreatedAtMs)
            .order_by_desc(webhook_deliveries::Column::Id)
            .limit(limit)
            .all(self.db())
            .await?)
    }

    /// Sends a delivery again (an operator's "redeliver"): pending, due
    /// now, with the same `webhook-id` and body. `NotFound` when there is
    /// none; `Conflict` while it is being sent.
    pub async fn redeliver(
        &self,
        webhook_id: &str,
        delivery_id: &str,
        now: EpochMs,
    ) -> StoreResult<webhook_deliveries::Model> {
        let changed = self
            .write_one(self.sql(
                "UPDATE webhook_deliveries SET status = 'PENDING', next_attempt_at_ms = $1, \
                 updated_at_ms = $1 WHERE id = $2 AND webhook_id = $3 \
                 AND (lease_until_ms IS NULL OR lease_until_ms < $1)",
                vec![now.into(), delivery_id.into(), webhook_id.into()],
            ))
            .await?;
        let delivery = webhook_deliveries::Entity::find_by_id(delivery_id.to_owned())
            .filter(webhook_deliveries::Column::WebhookId.eq(webhook_id))
            .one(self.db())
            .await?
            .ok_or(StoreError::NotFound("delivery"))?;
        if changed == 0 {
            return Err(StoreError::Conflict(format!(
                "delivery {delivery_id} is being sent now"
            )));
        }
        Ok(delivery)
    }
}

/// An endpoint as the API shows it (never its secret).
pub fn webhook_json(w: &webhooks::Model) -> Json {
    json!({
        "webhook_id": w.id,
        "url": w.url,
        "events": w.events.split(',').filter(|e| !e.is_empty()).collect::<Vec<_>>(),
        "enabled": w.enabled,
        "disabled_reason": w.disabled_reason,
        "failing_since": w.failing_since_ms.map(crate::clock::rfc3339),
        "created_at": crate::clock::rfc3339(w.created_at_ms),
    })
}

/// A delivery as an endpoint's log shows it.
pub fn delivery_json(d: &webhook_deliveries::Model) -> Json {
    json!({
        "delivery_id": d.id,
        "event": d.event,
        "status": d.status,
        "attempts": d.attempts,
        "last_status": d.last_status,
        "last_error": d.last_error,
        "last_latency_ms": d.last_latency_ms,
        "next_attempt_at": (d.status == "PENDING").then(|| crate::clock::rfc3339(d.next_attempt_at_ms)),
        "created_at": crate::clock::rfc3339(d.created_at_ms),
        "delivered_at": d.delivered_at_ms.map(crate::clock::rfc3339),
    })
}
