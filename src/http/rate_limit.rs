//! Rate limits (governor's GCRA, in memory, per instance): session creation
//! and photo uploads per client address, submission per session and
//! token. A refused request
//! is answered 429 `rate_limited` with `Retry-After`: session creation by a
//! middleware on its route, before the handler runs; a submission by the
//! submission desk right after its token opened the session
//! ([`RateLimits::check_submission`]), before its Idempotency-Key is taken.
//! Neither touches an Idempotency-Key, so a retry after the wait runs
//! normally.
//!
//! Keys are bounded. A key is forgotten once its bucket is full again (it is
//! then no different from a new key): `retain_recent` runs on the request
//! path at most every [`SWEEP_EVERY`], and at most every
//! [`SWEEP_WHEN_FULL`] while the store holds `max_keys`. When it is still
//! full, requests of keys it does not hold share one overflow bucket with
//! the same quota ([`BoundedStore`]): a flood of addresses neither grows
//! memory nor gets through unlimited, and keys already held keep their own
//! bucket.
//!
//! The client address is the peer address; `X-Forwarded-For` (or
//! `Forwarded`) counts only with `--trusted-proxies N`
//! ([`ClientAddress`], which the audit trail and the logs ask too). IPv6
//! clients are keyed by their /64, the block one subscriber is given.

use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, Error, HttpRequest};
use governor::clock::{Clock, DefaultClock, Reference};
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::{DashMapStateStore, ShrinkableKeyedStateStore};
use governor::state::{InMemoryState, NotKeyed, StateStore};
use governor::{Quota, RateLimiter};
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::AppState;
use crate::config::{Config, ProxyHeader, RateLimit};

/// Period of the sweep of forgotten keys.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Period of the sweep while the store is full.
pub const SWEEP_WHEN_FULL: Duration = Duration::from_secs(1);

/// The limits of this server, built from the configuration.
pub struct RateLimits {
    sessions: Option<KeyedLimiter<IpAddr>>,
    submissions: Option<KeyedLimiter<u128>>,
    /// Photo uploads per client address, asked by the upload before it
    /// reads a byte of its body ([`RateLimits::check_upload`]).
    uploads: Option<KeyedLimiter<IpAddr>>,
    /// Mail requests per client address ([`RateLimits::check_mail`]).
    mails: Option<KeyedLimiter<IpAddr>>,
    /// Requests to a PIN gallery, one bucket per client and gallery
    /// ([`GALLERY_PIN_LIMIT`]): a wrong guess costs as much as a right
    /// one, so once the bucket is empty every answer is 429, the right
    /// PIN's too, and guessing learns nothing faster than the limit.
    gallery_pins: KeyedLimiter<(IpAddr, String)>,
    client: ClientAddress,
    /// Live instances sharing the database (PostgreSQL; 1 on SQLite): each
    /// allows its share of every limit (see `actors::liveness`).
    pub live_instances: std::sync::Arc<AtomicUsize>,
}

impl RateLimits {
    /// The submission limit, one bucket per session and bearer token,
    /// asked by the submission desk only once the token opened the session
    /// (so random tokens never take a key, and nobody who only knows a
    /// session id, which rankings show, can use up its participant's
    /// bucket). `Err(seconds)`: wait that long.
    pub fn check_submission(&self, session: &str, token: &str) -> Result<(), u64> {
        match &self.submissions {
            None => Ok(()),
            Some(limiter) => limiter
                .check_shared(&session_key(session, token), self.instances())
                .map_err(retry_after_secs),
        }
    }

    pub fn from_config(config: &Config) -> RateLimits {
        let max_keys = config.rate_limit_keys;
        RateLimits {
            sessions: KeyedLimiter::of(config.session_rate_limit, max_keys),
            submissions: KeyedLimiter::of(config.submission_rate_limit, max_keys),
            uploads: KeyedLimiter::of(config.upload_rate_limit, max_keys),
            mails: KeyedLimiter::of(config.mail_rate_limit, max_keys),
            gallery_pins: KeyedLimiter::of(GALLERY_PIN_LIMIT, max_keys)
                .expect("the gallery PIN limit is on"),
            client: ClientAddress {
                trusted_proxies: config.trusted_proxies,
                header: config.trusted_proxy_header,
            },
            live_instances: std::sync::Arc::new(AtomicUsize::new(1)),
        }
    }

    /// The photo upload limit of the request's client. `Err(seconds)`:
    /// wait that long.
    pub fn check_upload(&self, req: &HttpRequest) -> Result<(), u64> {
        match &self.uploads {
            None => Ok(()),
            Some(limiter) => limiter
                .check_shared(&self.client.of(req), self.instances())
                .map_err(retry_after_secs),
        }
    }

    /// The mail request limit of the request's client. `Err(seconds)`:
    /// wait that long.
    pub fn check_mail(&self, req: &HttpRequest) -> Result<(), u64> {
        match &self.mails {
            None => Ok(()),
            Some(limiter) => limiter
                .check_shared(&self.client.of(req), self.instances())
                .map_err(retry_after_secs),
        }
    }

    /// The PIN gallery limit of the request's client for `slug`.
    /// `Err(seconds)`: wait that long.
    pub fn check_gallery_pin(&self, req: &HttpRequest, slug: &str) -> Result<(), u64> {
        let key = (self.client.of(req), slug.to_owned());
        self.gallery_pins
            .check_shared(&key, self.instances())
            .map_err(retry_after_secs)
    }

    /// Where the request comes from ([`ClientAddress::address`]).
    pub fn client_address(&self, req: &HttpRequest) -> IpAddr {
        self.client.address(req)
    }

    /// Live instances (at least 1).
    pub fn instances(&self) -> usize {
        self.live_instances.load(Ordering::Relaxed).max(1)
    }
}

/// Requests with a PIN to one PIN gallery, per client: the gallery page
/// polls every 5 s (12 a minute) with room to page; a guesser gets 30
/// tries a minute, so a 6-digit PIN holds for weeks.
pub const GALLERY_PIN_LIMIT: RateLimit = RateLimit::Every {
    count: NonZeroU32::new(30).expect("nonzero"),
    per: std::time::Duration::from_secs(60),
};

/// The governor quota of a limit; None when off (or when the limit allows
/// more than one request per nanosecond, which is no limit).
fn quota(limit: RateLimit) -> Option<Quota> {
    match limit {
        RateLimit::Off => None,
        RateLimit::Every { count, per } => {
            Quota::with_period(per / count.get()).map(|q| q.allow_burst(count))
        }
    }
}

/// Middleware of session creation: one bucket per client address.
pub async fn per_client(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, Error> {
    limited(req, next, |limits, req| {
        let limiter = limits.sessions.as_ref()?;
        Some(limiter.check_shared(&limits.client.of(req), limits.instances()))
    })
    .await
}

/// Runs the request unless `check` says how long it must wait (None: no
/// limit applies).
async fn limited(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
    check: impl FnOnce(&RateLimits, &HttpRequest) -> Option<Result<(), Duration>>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, Error> {
    let Some(state) = req.app_data::<web::Data<AppState>>() else {
        let e = ApiError::Internal("the rate limits are not configured".into());
        return Ok(req.error_response(e).map_into_right_body());
    };
    if let Some(Err(wait)) = check(&state.limits, req.request()) {
        let e = ApiError::RateLimited {
            retry_after: retry_after_secs(wait),
        };
        return Ok(req.error_response(e).map_into_right_body());
    }
    Ok(next.call(req).await?.map_into_left_body())
}

/// `Retry-After` in whole seconds, at least 1.
fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_millis().div_ceil(1000) as u64).max(1)
}

/// The key of a session and token: a digest, so a key has a fixed size
/// whatever the path and header hold.
fn session_key(session: &str, token: &str) -> u128 {
    let digest = Sha256::new()
        .chain_update(session.as_bytes())
        .chain_update([0])
        .chain_update(token.as_bytes())
        .finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    u128::from_be_bytes(first)
}

/// Where a request comes from: the one answer for the rate limits, the
/// audit trail and the logs ([`ClientAddress::address`]).
#[derive(Debug, Clone, Copy)]
pub struct ClientAddress {
    /// Proxies in front that append to `header`: 0 ignores every
    /// forwarding header (any client can write them).
    pub trusted_proxies: u8,
    /// The header those proxies append to; the other is never read.
    pub header: ProxyHeader,
}

impl ClientAddress {
    /// The client's address: the peer address, or with N trusted proxies
    /// the N-th address from the right of the proxies' header (each proxy
    /// appends the address it was reached from, so the entries left of it
    /// are the client's own words). A header too short, or no address
    /// there (`unknown`, an obfuscated node), falls back to the peer. No
    /// peer address at all (not over TCP) is `0.0.0.0`.
    pub fn address(&self, req: &HttpRequest) -> IpAddr {
        let peer = req.peer_addr().map(|a| a.ip());
        let forwarded = (self.trusted_proxies > 0)
            .then(|| forwarded_hop(req, self.header, self.trusted_proxies.into()))
            .flatten();
        forwarded
            .or(peer)
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
            .to_canonical()
    }

    /// The client's key for the limits: its address's block (IPv6 by its
    /// /64).
    pub fn of(&self, req: &HttpRequest) -> IpAddr {
        block(self.address(req))
    }
}

/// The `hops`-th address from the right of every `header` line of the
/// request, in order.
fn forwarded_hop(req: &HttpRequest, header: ProxyHeader, hops: usize) -> Option<IpAddr> {
    let name = match header {
        ProxyHeader::XForwardedFor => "x-forwarded-for",
        ProxyHeader::Forwarded => "forwarded",
    };
    let mut hops_seen: Vec<String> = Vec::new();
    for value in req.headers().get_all(name) {
        let Ok(value) = value.to_str() else {
            return None;
        };
        match header {
            ProxyHeader::XForwardedFor => {
                hops_seen.extend(value.split(',').map(|e| e.trim().to_owned()))
            }
            ProxyHeader::Forwarded => hops_seen.extend(forwarded_for(value)),
        }
    }
    let entry = hops_seen.len().checked_sub(hops).map(|i| &hops_seen[i])?;
    node_address(entry)
}

/// The `for=` node of each element of a `Forwarded` value (RFC 7239),
/// unquoted; an element without one gives an empty node, so it still
/// counts as a hop.
fn forwarded_for(value: &str) -> Vec<String> {
    split_unquoted(value, ',')
        .into_iter()
        .map(|element| {
            split_unquoted(&element, ';')
                .into_iter()
                .find_map(|pair| {
                    let (name, node) = pair.split_once('=')?;
                    name.trim()
                        .eq_ignore_ascii_case("for")
                        .then(|| node.trim().trim_matches('"').to_owned())
                })
                .unwrap_or_default()
        })
        .collect()
}

/// `text` split at each `separator` outside double quotes.
fn split_unquoted(text: &str, separator: char) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut quoted = false;
    let mut escaped = false;
    for c in text.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == separator && !quoted => {
                parts.push(String::new());
                continue;
            }
            _ => {}
        }
        parts.last_mut().expect("never empty").push(c);
    }
    parts
}

/// The address of a forwarded node: `192.0.2.1`, `192.0.2.1:80`,
/// `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:443`; anything else
/// (`unknown`, `_hidden`) is none.
fn node_address(node: &str) -> Option<IpAddr> {
    let node = node.trim();
    node.parse::<IpAddr>()
        .ok()
        .or_else(|| node.parse::<SocketAddr>().ok().map(|a| a.ip()))
        .or_else(|| {
            node.strip_prefix('[')
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|inner| inner.parse().ok())
        })
}

/// The address as a key: IPv4 (also when mapped into IPv6) as is, IPv6 as
/// its /64.
fn block(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(prefix))
        }
        v4 => v4,
    }
}

/// A keyed limiter that holds at most `max_keys` keys and sweeps the
/// forgotten ones.
pub struct KeyedLimiter<K: Hash + Eq + Clone, C: Clock = DefaultClock> {
    limiter: RateLimiter<K, BoundedStore<K>, C, NoOpMiddleware<C::Instant>>,
    /// Cells a bucket holds.
    burst: u32,
    max_keys: usize,
    clock: C,
    start: C::Instant,
    /// Nanoseconds from `start` to the last sweep.
    last_sweep: AtomicU64,
}

impl<K: Hash + Eq + Clone> KeyedLimiter<K> {
    /// The limiter of `limit` on the real clock; None when it is off.
    pub fn of(limit: RateLimit, max_keys: usize) -> Option<Self> {
        quota(limit).map(|q| KeyedLimiter::new(q, max_keys, DefaultClock::default()))
    }
}

impl<K: Hash + Eq + Clone, C: Clock + Clone> KeyedLimiter<K, C> {
    pub fn new(quota: Quota, max_keys: usize, clock: C) -> Self {
        let max_keys = max_keys.max(1);
        let store = BoundedStore {
            map: DashMapStateStore::default(),
            overflow: InMemoryState::default(),
            max_keys,
        };
        KeyedLimiter {
            limiter: RateLimiter::new(quota, store, clock.clone()),
            burst: quota.burst_size().get(),
            max_keys,
            start: clock.now(),
            clock,
            last_sweep: AtomicU64::new(0),
        }
    }

    /// Ok, or how long `key` must wait.
    pub fn check(&self, key: &K) -> Result<(), Duration> {
        self.check_shared(key, 1)
    }

    /// Like [`Self::check`] for a limit shared by `instances` live
    /// instances: each request takes that many cells of the key's bucket,
    /// so this instance allows its share of the quota (never more cells
    /// than the bucket holds, so one request always fits a full bucket).
    pub fn check_shared(&self, key: &K, instances: usize) -> Result<(), Duration> {
        let now = self.clock.now();
        self.sweep_if_due(now.duration_since(self.start));
        let burst = self.burst;
        let cells =
            NonZeroU32::new((instances.max(1) as u32).min(burst)).unwrap_or(NonZeroU32::MIN);
        match self.limiter.check_key_n(key, cells) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(not_until.wait_time_from(now)),
            // More cells than the bucket holds: cannot happen (capped).
            Err(_) => Err(Duration::from_secs(1)),
        }
    }

    /// Keys held (forgotten ones included until the next sweep).
    pub fn len(&self) -> usize {
        self.limiter.len()
    }

    pub fn is_empty(&self) -> bool {
        self.limiter.is_empty()
    }

    fn sweep_if_due(&self, now: Nanos) {
        let now = now.as_u64();
        let last = self.last_sweep.load(Ordering::Relaxed);
        let full = self.limiter.len() >= self.max_keys;
        let period = if full { SWEEP_WHEN_FULL } else { SWEEP_EVERY };
        if now.saturating_sub(last) < period.as_nanos() as u64 {
            return;
        }
        // One sweeper at a time; the others go on.
        if self
            .last_sweep
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
        }
    }
}

/// governor's DashMap store with a bound: when it holds `max_keys`, a key
/// it does not hold is measured against the one `overflow` state instead
/// of being added.
pub struct BoundedStore<K: Hash + Eq + Clone> {
    map: DashMapStateStore<K>,
    overflow: InMemoryState,
    max_keys: usize,
}

impl<K: Hash + Eq + Clone> StateStore for BoundedStore<K> {
    type Key = K;

    fn measure_and_replace<T, F, E>(&self, key: &K, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        if self.map.len() >= self.max_keys && !self.map.contains_key(key) {
            return self.overflow.measure_and_replace(&NotKeyed::NonKey, f);
        }
        self.map.measure_and_replace(key, f)
    }
}

impl<K: Hash + Eq + Clone> ShrinkableKeyedStateStore<K> for BoundedStore<K> {
    fn retain_recent(&self, drop_below: Nanos) {
        self.map.retain_recent(drop_below);
    }

    fn shrink_to_fit(&self) {
        self.map.shrink_to_fit();
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use governor::clock::FakeRelativeClock;

    use super::*;

    fn limiter(
        count: u32,
        per: Duration,
        max_keys: usize,
    ) -> (KeyedLimiter<u32, FakeRelativeClock>, FakeRelativeClock) {
        let clock = FakeRelativeClock::default();
        let limit = RateLimit::Every {
            count: NonZeroU32::new(count).unwrap(),
            per,
        };
        let limiter = KeyedLimiter::new(quota(limit).unwrap(), max_keys, clock.clone());
        (limiter, clock)
    }

    #[test]
    fn a_burst_then_one_per_interval() {
        let (limiter, clock) = limiter(3, Duration::from_secs(60), 10);
        for _ in 0..3 {
            assert!(limiter.check(&1).is_ok());
        }
        let wait = limiter.check(&1).unwrap_err();
        assert_eq!(wait, Duration::from_secs(20));
        assert_eq!(retry_after_secs(wait), 20);
        assert!(limiter.check(&2).is_ok(), "another key has its own bucket");
        clock.advance(Duration::from_secs(20));
        assert!(limiter.check(&1).is_ok());
        assert!(limiter.check(&1).is_err());
    }

    #[test]
    fn retry_after_is_whole_seconds_at_least_one() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1_001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(60)), 60);
    }

    #[test]
    fn off_has_no_quota() {
        assert!(quota(RateLimit::Off).is_none());
    }

    #[test]
    fn a_full_store_shares_one_overflow_bucket_and_sweeps_forgotten_keys() {
        let (limiter, clock) = limiter(2, Duration::from_secs(10), 3);
        for key in 0..3 {
            assert!(limiter.check(&key).is_ok());
        }
        assert_eq!(limiter.len(), 3);
        // Full: new keys share the overflow bucket (burst 2) and are not
        // stored; held keys keep their own.
        assert!(limiter.check(&100).is_ok());
        assert!(limiter.check(&101).is_ok());
        assert!(limiter.check(&102).is_err());
        assert!(limiter.check(&0).is_ok());
        assert_eq!(limiter.len(), 3);
        // Once their buckets are full again, the held keys are forgotten
        // by the next sweep (due at once while full) and new keys get
        // their own buckets again.
        clock.advance(Duration::from_secs(30));
        assert!(limiter.check(&200).is_ok());
        assert!(limiter.check(&200).is_ok());
        assert!(limiter.check(&200).is_err());
        assert_eq!(limiter.len(), 1);
    }

    #[test]
    fn keys_are_swept_periodically() {
        let (limiter, clock) = limiter(5, Duration::from_secs(1), 1_000);
        for key in 0..100 {
            assert!(limiter.check(&key).is_ok());
        }
        assert_eq!(limiter.len(), 100);
        clock.advance(SWEEP_EVERY);
        assert!(limiter.check(&7).is_ok());
        assert_eq!(limiter.len(), 1, "only the key just used is held");
    }

    #[test]
    fn session_keys_depend_on_session_and_token() {
        assert_eq!(session_key("s", "t"), session_key("s", "t"));
        assert_ne!(session_key("s", "t"), session_key("s", "u"));
        assert_ne!(session_key("st", ""), session_key("s", "t"));
    }

    #[test]
    fn ipv6_is_keyed_by_its_64_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(block(a), block(b));
        assert_ne!(block(a), block(c));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(block(mapped), "192.0.2.7".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn forwarded_for_counts_only_trusted_hops() {
        let req = actix_web::test::TestRequest::default()
            .peer_addr("10.0.0.1:5000".parse().unwrap())
            .insert_header(("X-Forwarded-For", "6.6.6.6, 198.51.100.4"))
            .append_header(("X-Forwarded-For", "203.0.113.9:443"))
            .to_http_request();
        let of = |trusted_proxies| {
            ClientAddress {
                trusted_proxies,
                header: ProxyHeader::XForwardedFor,
            }
            .address(&req)
            .to_string()
        };
        assert_eq!(of(0), "10.0.0.1", "the header is ignored by default");
        assert_eq!(of(1), "203.0.113.9");
        assert_eq!(of(2), "198.51.100.4");
        assert_eq!(of(3), "6.6.6.6");
        assert_eq!(
            of(4),
            "10.0.0.1",
            "a header too short falls back to the peer"
        );
        let forwarded = ClientAddress {
            trusted_proxies: 1,
            header: ProxyHeader::Forwarded,
        };
        assert_eq!(
            forwarded.address(&req).to_string(),
            "10.0.0.1",
            "X-Forwarded-For is not the header the proxies write"
        );
    }

    #[test]
    fn forwarded_counts_its_for_nodes_from_the_right() {
        let req = actix_web::test::TestRequest::default()
            .peer_addr("10.0.0.1:5000".parse().unwrap())
            .insert_header((
                "Forwarded",
                "for=6.6.6.6;proto=http, for=\"[2001:db8::17]:4711\";by=x",
            ))
            .append_header(("Forwarded", "proto=https;For=\"198.51.100.4:80\""))
            .append_header(("X-Forwarded-For", "203.0.113.1"))
            .to_http_request();
        let of = |trusted_proxies, header| {
            ClientAddress {
                trusted_proxies,
                header,
            }
            .address(&req)
            .to_string()
        };
        assert_eq!(of(0, ProxyHeader::Forwarded), "10.0.0.1");
        assert_eq!(of(1, ProxyHeader::Forwarded), "198.51.100.4");
        assert_eq!(of(2, ProxyHeader::Forwarded), "2001:db8::17");
        assert_eq!(of(3, ProxyHeader::Forwarded), "6.6.6.6");
        assert_eq!(of(4, ProxyHeader::Forwarded), "10.0.0.1");
        assert_eq!(of(1, ProxyHeader::XForwardedFor), "203.0.113.1");
    }

    #[test]
    fn a_forwarded_node_is_an_address_or_nothing() {
        assert_eq!(
            forwarded_for("for=a, by=b, for=\"c,d\";x=1"),
            ["a", "", "c,d"]
        );
        for (node, address) in [
            ("192.0.2.1", Some("192.0.2.1")),
            ("192.0.2.1:80", Some("192.0.2.1")),
            ("2001:db8::1", Some("2001:db8::1")),
            ("[2001:db8::1]", Some("2001:db8::1")),
            ("[2001:db8::1]:443", Some("2001:db8::1")),
            ("::ffff:192.0.2.9", Some("::ffff:192.0.2.9")),
            ("unknown", None),
            ("_hidden", None),
            ("", None),
        ] {
            assert_eq!(
                node_address(node).map(|a| a.to_string()).as_deref(),
                address,
                "{node}"
            );
        }
        let mapped = actix_web::test::TestRequest::default()
            .peer_addr("[::ffff:192.0.2.9]:5000".parse().unwrap())
            .to_http_request();
        let client = ClientAddress {
            trusted_proxies: 0,
            header: ProxyHeader::XForwardedFor,
        };
        assert_eq!(client.address(&mapped).to_string(), "192.0.2.9");
    }
}
