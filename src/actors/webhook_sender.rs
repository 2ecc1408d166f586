//! WebhookSender: sends the deliveries of the webhook outbox to the
//! organiser's endpoints, signed, at least once, and says when an endpoint
//! keeps failing.
//!
//! Each round (at least every [`ROUND`]):
//! 1. Every [`LISTENERS_REFRESH`]: the endpoints are read again (which
//!    events the enabled ones take, for the transactions that enqueue;
//!    [`Store::refresh_listeners`]), and an endpoint that has been failing
//!    for longer than `disable_after` is disabled, with the reason on /ops
//!    and in the log.
//! 2. When a delivery is due: for each enabled endpoint, up to its free
//!    places ([`PER_ENDPOINT`] in flight at once) of its due deliveries
//!    are claimed ([`Store::claim_deliveries`], a lease under this actor's
//!    token: no other instance sends them meanwhile) and each is sent at
//!    once on a task of its own; its outcome is written fenced on the
//!    lease. A failure is tried again after Standard Webhooks' schedule
//!    ([`retry_after_ms`]), with the same `webhook-id` and body.
//!
//! Nothing here holds a database connection while an endpoint is asked, and
//! no saga waits for a delivery: a slow or dead endpoint costs only its
//! own places.
//!
//! When full: an endpoint has at most [`PER_ENDPOINT`] deliveries in
//! flight; the rest wait in the table, oldest due first (nothing is
//! dropped).

use std::collections::HashMap;
use std::time::Duration;

use actix::prelude::*;
use tokio::task::JoinSet;

use super::run_on_runtime;
use super::wakeups::Wakeups;
use crate::clock::SharedClock;
use crate::domain::webhook::{retry_after_ms, secret_key};
use crate::store::entities::{webhook_deliveries, webhooks};
use crate::store::idempotency::Seal;
use crate::store::webhooks::{Attempt, LISTENERS_REFRESH};
use crate::store::Store;
use crate::webhooks::HookSender;

/// The longest a round waits.
pub const ROUND: Duration = Duration::from_secs(1);
/// Deliveries in flight to one endpoint at once.
pub const PER_ENDPOINT: usize = 16;

/// What the sender needs.
#[derive(Clone)]
pub struct WebhookDeps {
    pub store: Store,
    pub clock: SharedClock,
    pub wakeups: Wakeups,
    pub sender: HookSender,
    /// Opens the endpoints' secrets.
    pub seal: Seal,
    pub instance_id: String,
    /// How long a claim holds a delivery: longer than one attempt.
    pub lease_ms: i64,
    /// How long an endpoint may keep failing before it is disabled.
    pub disable_after_ms: i64,
}

pub struct WebhookSender {
    deps: WebhookDeps,
    running: Option<tokio::task::AbortHandle>,
}

impl WebhookSender {
    pub fn new(deps: WebhookDeps) -> WebhookSender {
        WebhookSender {
            deps,
            running: None,
        }
    }
}

impl Actor for WebhookSender {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let deps = self.deps.clone();
        self.running = Some(run_on_runtime(ctx, rounds(deps)));
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(running) = self.running.take() {
            running.abort();
        }
    }
}

/// The enabled endpoints as last read, and how many of each one's
/// deliveries are in flight here.
struct Endpoints {
    enabled: Vec<webhooks::Model>,
    in_flight: HashMap<String, usize>,
    read_at: Option<tokio::time::Instant>,
}

async fn rounds(deps: WebhookDeps) {
    let token = format!("{}:{}", deps.instance_id, uuid::Uuid::new_v4().simple());
    let mut sending: JoinSet<String> = JoinSet::new();
    let mut endpoints = Endpoints {
        enabled: Vec::new(),
        in_flight: HashMap::new(),
        read_at: None,
    };
    loop {
        if endpoints
            .read_at
            .is_none_or(|at| at.elapsed() >= LISTENERS_REFRESH)
        {
            read_endpoints(&deps, &mut endpoints).await;
        }
        if let Err(e) = send_due(&deps, &token, &mut endpoints, &mut sending).await {
            tracing::warn!(error = %e, "webhook round failed; the next round tries again");
        }
        tokio::select! {
            Some(done) = sending.join_next() => {
                if let Ok(webhook_id) = done {
                    if let Some(count) = endpoints.in_flight.get_mut(&webhook_id) {
                        *count = count.saturating_sub(1);
                    }
                }
            }
            _ = tokio::time::sleep(ROUND) => {}
        }
    }
}

/// Reads the endpoints again (and this process's listeners with them),
/// and disables those that kept failing.
async fn read_endpoints(deps: &WebhookDeps, endpoints: &mut Endpoints) {
    let now = deps.clock.now_ms();
    match deps
        .store
        .disable_failing_webhooks(now - deps.disable_after_ms, "kept failing")
        .await
    {
        Ok(disabled) => {
            for endpoint in &disabled {
                tracing::warn!(webhook_id = %endpoint.id, url = %endpoint.url, "webhook endpoint disabled: it kept failing");
            }
            if !disabled.is_empty() {
                deps.wakeups.stats.ring();
            }
        }
        Err(e) => tracing::warn!(error = %e, "failing webhook endpoints could not be disabled"),
    }
    match deps.store.refresh_listeners().await {
        Ok(all) => {
            endpoints.enabled = all.into_iter().filter(|w| w.enabled).collect();
            endpoints.read_at = Some(tokio::time::Instant::now());
        }
        Err(e) => tracing::warn!(error = %e, "webhook endpoints not read"),
    }
}

/// Claims and starts the due deliveries of each endpoint with places free.
async fn send_due(
    deps: &WebhookDeps,
    token: &str,
    endpoints: &mut Endpoints,
    sending: &mut JoinSet<String>,
) -> Result<(), crate::store::StoreError> {
    if endpoints.enabled.is_empty() {
        return Ok(());
    }
    let now = deps.clock.now_ms();
    if deps
        .store
        .next_delivery_due()
        .await?
        .is_none_or(|at| at > now)
    {
        return Ok(());
    }
    for endpoint in &endpoints.enabled {
        let busy = endpoints.in_flight.get(&endpoint.id).copied().unwrap_or(0);
        let free = PER_ENDPOINT.saturating_sub(busy);
        if free == 0 {
            continue;
        }
        let claimed = deps
            .store
            .claim_deliveries(&endpoint.id, token, now, deps.lease_ms, free as i64)
            .await?;
        if claimed.is_empty() {
            continue;
        }
        let Some(key) = deps
            .seal
            .open(&endpoint.secret)
            .and_then(|secret| secret_key(&secret))
        else {
            tracing::error!(webhook_id = %endpoint.id, "the endpoint's secret cannot be opened with this server's secret; its deliveries wait");
            continue;
        };
        *endpoints.in_flight.entry(endpoint.id.clone()).or_default() += claimed.len();
        for delivery in claimed {
            let (deps, token, url, key) = (
                deps.clone(),
                token.to_owned(),
                endpoint.url.clone(),
                key.clone(),
            );
            crate::metrics::task_spawned("webhook_sender.deliver");
            sending.spawn(async move {
                deliver(&deps, &token, &url, &key, &delivery).await;
                delivery.webhook_id
            });
        }
    }
    Ok(())
}

/// One attempt of `delivery`, and its outcome written.
async fn deliver(
    deps: &WebhookDeps,
    token: &str,
    url: &str,
    key: &[u8],
    delivery: &webhook_deliveries::Model,
) {
    let at = deps.clock.now_ms();
    let sent = deps
        .sender
        .send(
            url,
            &delivery.id,
            key,
            &delivery.payload,
            at.div_euclid(1_000),
        )
        .await;
    let now = deps.clock.now_ms();
    let retry_at_ms = sent
        .error
        .as_ref()
        .and_then(|_| retry_after_ms(delivery.attempts + 1))
        .map(|after| now + after);
    let outcome = match (&sent.error, retry_at_ms) {
        (None, _) => "delivered",
        (Some(_), Some(_)) => "retry",
        (Some(_), None) => "failed",
    };
    metrics::counter!(crate::metrics::WEBHOOK_DELIVERIES, "outcome" => outcome).increment(1);
    match &sent.error {
        None => {
            tracing::debug!(delivery_id = %delivery.id, event = %delivery.event, latency_ms = sent.latency_ms, "webhook delivered")
        }
        Some(error) => {
            tracing::info!(delivery_id = %delivery.id, event = %delivery.event, %error, attempt = delivery.attempts + 1, outcome, "webhook delivery failed")
        }
    }
    let attempt = Attempt {
        status: sent.status,
        error: sent.error,
        latency_ms: sent.latency_ms,
        retry_at_ms,
    };
    if let Err(e) = deps
        .store
        .delivery_answered(delivery, token, &attempt, now)
        .await
    {
        tracing::warn!(delivery_id = %delivery.id, error = %e, "the delivery's outcome was not written; it is sent again after its lease");
    }
}
