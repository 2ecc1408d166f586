//! Webhooks' way out: an endpoint's URL judged before it is stored, and
//! one signed delivery sent to it (Standard Webhooks 1.0: `webhook-id`,
//! `webhook-timestamp`, `webhook-signature`; [`crate::domain::webhook`]).
//!
//! - **No SSRF.** An endpoint is `http` or `https` on a public address: an
//!   address literal inside (loopback, private, link-local and metadata,
//!   …: [`is_internal`]) is refused, a name is resolved and refused when
//!   it leads only inside, and every send resolves through a resolver that
//!   gives only public addresses, so a name cannot be pointed inside
//!   later. `STAGEHAND_WEBHOOK_ALLOW_PRIVATE=1` lifts this for tests and
//!   on-premise setups. No redirect is followed (a 3xx is a failure), and
//!   no proxy is taken from the environment.
//! - **Bounded.** Each attempt has [`SEND_TIMEOUT`]; the answer's body is
//!   never read past its status.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Url;

use crate::domain::webhook::{delivered, signature};
use crate::media::keep::{is_internal, PublicOnly};

/// The longest one attempt may take, connection included.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(15);

/// What one attempt got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The answer's status (None: no answer).
    pub status: Option<u16>,
    /// Why it did not count as delivered (None: a 2xx).
    pub error: Option<String>,
    pub latency_ms: i32,
}

/// Sends deliveries; one per process.
#[derive(Clone)]
pub struct HookSender {
    client: reqwest::Client,
    allow_private: bool,
}

impl HookSender {
    pub fn new(allow_private: bool) -> HookSender {
        let builder = crate::ai::client::outside_client()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(SEND_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!("stagehand-webhooks/", env!("CARGO_PKG_VERSION")));
        let builder = if allow_private {
            builder
        } else {
            builder.dns_resolver(Arc::new(PublicOnly))
        };
        HookSender {
            client: builder.build().unwrap_or_default(),
            allow_private,
        }
    }

    /// The endpoint URL, if it may be sent to; else why not.
    pub async fn judge_url(&self, text: &str) -> Result<Url, String> {
        let url = Url::parse(text).map_err(|e| format!("url: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err("url: only http and https endpoints are sent to".into());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("url: credentials in the URL are not kept; put a token in the path".into());
        }
        let host = url
            .host_str()
            .ok_or_else(|| "url: it names no host".to_owned())?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if self.allow_private {
            return Ok(url);
        }
        let inside = format!(
            "url: {host} is not a public address (loopback, private, link-local, …); \
             STAGEHAND_WEBHOOK_ALLOW_PRIVATE=1 allows it"
        );
        if let Ok(ip) = host.parse::<IpAddr>() {
            return if is_internal(ip) {
                Err(inside)
            } else {
                Ok(url)
            };
        }
        let port = url.port_or_known_default().unwrap_or(443);
        let found: Vec<IpAddr> = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| format!("url: {host} does not resolve: {e}"))?
            .map(|a| a.ip())
            .collect();
        if found.iter().all(|ip| is_internal(*ip)) {
            return Err(inside);
        }
        Ok(url)
    }

    /// One attempt of delivery `id` (its body `body`) to `url`, signed
    /// with `key` at `now_s` (Unix seconds).
    pub async fn send(&self, url: &str, id: &str, key: &[u8], body: &str, now_s: i64) -> Sent {
        let started = Instant::now();
        let answer = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", now_s.to_string())
            .header("webhook-signature", signature(key, id, now_s, body))
            .body(body.to_owned())
            .send()
            .await;
        let latency_ms = i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX);
        match answer {
            Ok(resp) => {
                let status = resp.status().as_u16();
                Sent {
                    status: Some(status),
                    error: (!delivered(status)).then(|| format!("answered {status}")),
                    latency_ms,
                }
            }
            Err(e) => Sent {
                status: None,
                error: Some(if e.is_timeout() {
                    format!("no answer in {} s", SEND_TIMEOUT.as_secs())
                } else {
                    format!("not reached: {e}")
                }),
                latency_ms,
            },
        }
    }
}
