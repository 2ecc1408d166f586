//! Keeping a result: every output file of a succeeded AI job is copied
//! into the media store before anything reaches a display or the review
//! queue, and the result's URLs become this server's own (`/media/r/…`),
//! with a display-size thumbnail beside each raster image. Providers
//! delete their outputs (Replicate after an hour, OpenAI's image URLs
//! after 60 minutes); kept copies stay.
//!
//! The rules:
//! - **No transaction.** The caller holds the saga's lease and nothing of
//!   the database while files download.
//! - **Crash-safe keys.** Each output's key comes from the saga, the call
//!   and the output index ([`result_object_key`]): a keep that runs again
//!   after a crash overwrites the same objects, never adds a second.
//! - **Listed before written.** Each key (and its thumbnail's) is listed
//!   for the saga in the database ([`KeptFor`], under the saga's lease)
//!   before its object is written, so erasure and retention delete every
//!   file a keep wrote, also those of a keep cut short that no result
//!   names.
//! - **Bounded.** At most `max_bytes` per file, `timeout` per download,
//!   `max_redirects` hops, and only image, video and audio types
//!   ([`KeptType`]).
//! - **No SSRF.** A file is fetched only from the provider's own origin
//!   (the scheme, host and port of its URL) and the origins its
//!   configuration lists ([`ResultOrigins`]); every redirect hop is judged
//!   the same way. A listed origin is reached only through a resolver that
//!   refuses every address that is not public (loopback, private, shared,
//!   link-local and metadata, reserved, and the IPv6 forms that lead to
//!   one: [`is_internal`]), so a name cannot be pointed inside later; the
//!   provider's own origin may be loopback (the built-in simulator). No
//!   client takes a proxy from the environment
//!   ([`crate::ai::client::outside_client`]): a proxy would resolve the
//!   name itself, past that resolver.
//! - **What a failure is.** A reset or a 5xx is [`KeepError::Transient`]
//!   (the caller retries with backoff, no new AI job); a 404 after
//!   success, a file too large, a type not kept, a refused origin is
//!   [`KeepError::Permanent`] (a failed attempt, never a success with a
//!   broken picture).
//!
//! Inline results (`data:` URLs, which is how OpenAI's `b64_json` arrives)
//! are decoded into the store the same way: no row and no frame carries
//! file bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use reqwest::{StatusCode, Url};

use super::brand::{brand_result, BrandArt};
use super::photo::{thumbnail, PhotoLimits};
use super::pool::PhotoPool;
use super::{MediaError, MediaStore};
use crate::domain::brand::{branded_key, branded_thumbnail_key, Surface};
use crate::domain::failure::ContentItem;
use crate::domain::media::{result_object_key, thumbnail_key, KeptType};
use crate::store::{Store, StoreError};

/// The long side of a display thumbnail.
pub const THUMBNAIL_PX: u32 = 640;

/// Why a result could not be kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeepError {
    /// Try again later (with backoff): the file may come next time.
    #[error("{0}")]
    Transient(String),
    /// It will never come: the attempt failed.
    #[error("{0}")]
    Permanent(String),
}

/// How much a keep may fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepLimits {
    /// Bytes of one file (`max_result_bytes`).
    pub max_bytes: u64,
    /// One download, redirects included.
    pub timeout: Duration,
    pub max_redirects: usize,
}

impl Default for KeepLimits {
    fn default() -> Self {
        KeepLimits {
            max_bytes: 50 * 1024 * 1024,
            timeout: Duration::from_secs(60),
            max_redirects: 3,
        }
    }
}

/// One origin, or every subdomain of a host (`https://*.example.com`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct OriginPattern {
    scheme: String,
    /// The host, or with `subdomains` the parent domain.
    host: String,
    port: Option<u16>,
    subdomains: bool,
}

impl OriginPattern {
    fn parse(text: &str) -> Result<OriginPattern, String> {
        let wildcard = text.contains("://*.");
        let url = Url::parse(&text.replacen("://*.", "://", 1))
            .map_err(|e| format!("result origin {text:?}: {e}"))?;
        let host = url
            .host_str()
            .ok_or_else(|| format!("result origin {text:?} names no host"))?;
        if !matches!(url.scheme(), "http" | "https") || url.path().len() > 1 {
            return Err(format!(
                "result origin {text:?}: give an http(s) origin, such as https://files.example.com"
            ));
        }
        Ok(OriginPattern {
            scheme: url.scheme().to_owned(),
            host: host.to_ascii_lowercase(),
            port: url.port_or_known_default(),
            subdomains: wildcard,
        })
    }

    fn matches(&self, url: &Url) -> bool {
        let Some(host) = url.host_str().map(str::to_ascii_lowercase) else {
            return false;
        };
        let host_fits = if self.subdomains {
            host.ends_with(&format!(".{}", self.host))
        } else {
            host == self.host
        };
        url.scheme() == self.scheme && url.port_or_known_default() == self.port && host_fits
    }
}

/// Where one provider's result files may come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultOrigins {
    own: OriginPattern,
    listed: Vec<OriginPattern>,
}

/// What the saga needs of media for one provider.
#[derive(Debug, Clone)]
pub struct ProviderMedia {
    pub origins: ResultOrigins,
    /// Where the provider reaches this server (`STAGEHAND_PUBLIC_URL`, or
    /// the loopback address for a provider on this machine); None: it
    /// cannot, and gets a photo inline where its API allows.
    pub photo_base: Option<String>,
}

/// How far a URL is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trust {
    /// The provider's own origin: fetched as the provider is called.
    Own,
    /// A listed origin: fetched only at a public address.
    Listed,
}

impl ResultOrigins {
    /// The provider at `base_url`, the origins its vendor documents, and
    /// those its configuration lists (`result_origins`).
    pub fn new(base_url: &str, documented: &[&str], listed: &[String]) -> Result<Self, String> {
        let own = OriginPattern::parse(&origin_of(base_url)?)?;
        let listed = documented
            .iter()
            .map(|o| o.to_string())
            .chain(listed.iter().cloned())
            .map(|o| OriginPattern::parse(&o))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ResultOrigins { own, listed })
    }

    fn trust(&self, url: &Url) -> Option<Trust> {
        if self.own.matches(url) {
            Some(Trust::Own)
        } else if self.listed.iter().any(|o| o.matches(url)) {
            Some(Trust::Listed)
        } else {
            None
        }
    }
}

/// The scheme, host and port of `url`, as an origin.
fn origin_of(url: &str) -> Result<String, String> {
    let parsed = Url::parse(url).map_err(|e| format!("provider URL {url:?}: {e}"))?;
    Ok(parsed.origin().ascii_serialization())
}

/// The IPv4 ranges no result file is fetched from: every range IANA's
/// special-purpose registry marks not globally reachable, and multicast.
const INTERNAL_V4: [(Ipv4Addr, u8); 15] = [
    (Ipv4Addr::new(0, 0, 0, 0), 8),       // "this network"
    (Ipv4Addr::new(10, 0, 0, 0), 8),      // private
    (Ipv4Addr::new(100, 64, 0, 0), 10),   // shared (carrier-grade NAT)
    (Ipv4Addr::new(127, 0, 0, 0), 8),     // loopback
    (Ipv4Addr::new(169, 254, 0, 0), 16),  // link-local, the cloud metadata address
    (Ipv4Addr::new(172, 16, 0, 0), 12),   // private
    (Ipv4Addr::new(192, 0, 0, 0), 24),    // IETF protocol assignments
    (Ipv4Addr::new(192, 0, 2, 0), 24),    // documentation
    (Ipv4Addr::new(192, 88, 99, 0), 24),  // the 6to4 relay (deprecated)
    (Ipv4Addr::new(192, 168, 0, 0), 16),  // private
    (Ipv4Addr::new(198, 18, 0, 0), 15),   // benchmarking
    (Ipv4Addr::new(198, 51, 100, 0), 24), // documentation
    (Ipv4Addr::new(203, 0, 113, 0), 24),  // documentation
    (Ipv4Addr::new(224, 0, 0, 0), 4),     // multicast
    (Ipv4Addr::new(240, 0, 0, 0), 4),     // reserved, and the broadcast address
];

/// The IPv6 ranges no result file is fetched from, beside those that
/// carry an IPv4 address ([`embedded_ipv4`]).
const INTERNAL_V6: [(Ipv6Addr, u8); 8] = [
    (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64), // discard-only
    (Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48), // local-use NAT64
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 32), // Teredo
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32), // documentation
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7), // unique local
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10), // link-local
    (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10), // site-local (deprecated)
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8), // multicast
];

/// Whether `ip` is inside: loopback, private, shared, link-local (the
/// cloud metadata address 169.254.169.254 among them), reserved,
/// documentation, benchmarking, unspecified or multicast
/// ([`INTERNAL_V4`], [`INTERNAL_V6`]). An IPv6 address that carries an
/// IPv4 address (IPv4-mapped, -compatible or -translated, NAT64, 6to4)
/// is judged by the IPv4 address it leads to.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => INTERNAL_V4.iter().any(|&(net, len)| {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(v4) & mask == u32::from(net) & mask
        }),
        IpAddr::V6(v6) => match embedded_ipv4(v6) {
            Some(v4) => is_internal(IpAddr::V4(v4)),
            None => INTERNAL_V6.iter().any(|&(net, len)| {
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                u128::from(v6) & mask == u128::from(net) & mask
            }),
        },
    }
}

/// The IPv4 address an IPv6 address leads to: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`, `::` and `::1`
/// among them), IPv4-translated (`::ffff:0:a.b.c.d`), NAT64
/// (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::/48`).
fn embedded_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let last = || Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7]));
    match s {
        [0, 0, 0, 0, 0, 0 | 0xffff, _, _] => Some(last()),
        [0, 0, 0, 0, 0xffff, 0, _, _] => Some(last()),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(last()),
        [0x2002, high, low, ..] => Some(Ipv4Addr::from((u32::from(high) << 16) | u32::from(low))),
        _ => None,
    }
}

/// A resolver that gives only public addresses: a listed origin whose name
/// points inside is refused at connection time, whatever it resolved to
/// when it was configured.
pub struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0))
                .await?
                .filter(|addr| !is_internal(addr.ip()))
                .collect();
            if found.is_empty() {
                return Err(
                    format!("{} resolves only to internal addresses", name.as_str()).into(),
                );
            }
            Ok(Box::new(found.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Whose result a keep stores: the saga its keys are derived from and
/// listed for, the lock token that lists them (a worker that lost the
/// saga's lease writes nothing), and where the list is written.
#[derive(Clone, Copy)]
pub struct KeptFor<'a> {
    pub lists: &'a dyn ListsKept,
    pub saga_id: &'a str,
    pub token: &'a str,
}

/// Where a keep lists the objects it is about to write for its saga
/// (`kept_objects`), fenced on the saga's lease: `Err` with a lost lease
/// ([`StoreError::is_lease_lost`]) when the worker no longer holds it.
/// A saga's worker lists through its group-committed writes; the store
/// itself lists in a transaction of its own.
pub trait ListsKept {
    fn list<'a>(
        &'a self,
        saga_id: &'a str,
        token: &'a str,
        keys: Vec<String>,
    ) -> futures_util::future::LocalBoxFuture<'a, Result<(), StoreError>>;
}

impl ListsKept for Store {
    fn list<'a>(
        &'a self,
        saga_id: &'a str,
        token: &'a str,
        keys: Vec<String>,
    ) -> futures_util::future::LocalBoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { self.record_kept_objects(saga_id, token, &keys).await })
    }
}

/// Keeps results: downloads (or decodes) each output and stores it.
#[derive(Clone)]
pub struct Keeper {
    store: MediaStore,
    pool: PhotoPool,
    /// The shared secret result keys are derived under.
    secret: Arc<[u8]>,
    limits: KeepLimits,
    /// For the provider's own origin.
    own: reqwest::Client,
    /// For listed origins: public addresses only.
    listed: reqwest::Client,
}

impl Keeper {
    pub fn new(store: MediaStore, pool: PhotoPool, secret: &[u8], limits: KeepLimits) -> Keeper {
        let build = |public_only: bool| {
            let builder = crate::ai::client::outside_client()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(limits.timeout)
                .connect_timeout(Duration::from_secs(10));
            let builder = if public_only {
                builder.dns_resolver(Arc::new(PublicOnly))
            } else {
                builder
            };
            builder.build().unwrap_or_default()
        };
        Keeper {
            store,
            pool,
            secret: Arc::from(secret),
            limits,
            own: build(false),
            listed: build(true),
        }
    }

    pub fn store(&self) -> &MediaStore {
        &self.store
    }

    pub fn pool(&self) -> &PhotoPool {
        &self.pool
    }

    /// Keeps every file of call `call`'s `items` (for the saga of `owner`):
    /// the items come back with this server's URLs. Items already kept (a
    /// re-run) and text items are left as they are.
    pub async fn keep(
        &self,
        origins: &ResultOrigins,
        owner: KeptFor<'_>,
        call: u32,
        items: Vec<ContentItem>,
        brand: Option<&Arc<BrandArt>>,
    ) -> Result<Vec<ContentItem>, KeepError> {
        let mut kept = Vec::with_capacity(items.len());
        for (index, item) in items.into_iter().enumerate() {
            let Some(url) = item.url.clone().filter(|u| !u.starts_with("/media/")) else {
                kept.push(item);
                continue;
            };
            let (bytes, header_type) = self.fetch(origins, &url).await?;
            let file = self
                .store_file(owner, call, index as u32, bytes, header_type, brand)
                .await?;
            kept.push(file.shown(item, brand));
        }
        Ok(kept)
    }

    /// The file's bytes and the type its server gave.
    async fn fetch(
        &self,
        origins: &ResultOrigins,
        url: &str,
    ) -> Result<(Bytes, Option<String>), KeepError> {
        if url
            .get(..5)
            .is_some_and(|p| p.eq_ignore_ascii_case("data:"))
        {
            return decode_data_url(url, self.limits.max_bytes);
        }
        let mut at = Url::parse(url)
            .map_err(|e| KeepError::Permanent(format!("the result URL is not a URL: {e}")))?;
        for _hop in 0..=self.limits.max_redirects {
            let trust = origins.trust(&at).ok_or_else(|| refused_origin(&at))?;
            let client = match trust {
                Trust::Own => &self.own,
                Trust::Listed => {
                    refuse_internal_literal(&at)?;
                    &self.listed
                }
            };
            let answer = client.get(at.clone()).send().await.map_err(|e| {
                KeepError::Transient(format!(
                    "the result file could not be fetched from {}: {e}",
                    at.origin().ascii_serialization()
                ))
            })?;
            if answer.status().is_redirection() {
                at = next_hop(&at, &answer)?;
                continue;
            }
            return self.read_answer(answer).await;
        }
        Err(KeepError::Permanent(format!(
            "the result URL redirected more than {} times",
            self.limits.max_redirects
        )))
    }

    /// A final answer's body, bounded, or why not.
    async fn read_answer(
        &self,
        answer: reqwest::Response,
    ) -> Result<(Bytes, Option<String>), KeepError> {
        let status = answer.status();
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            return Err(KeepError::Transient(format!(
                "the result file's server answered {status}"
            )));
        }
        if !status.is_success() {
            return Err(KeepError::Permanent(format!(
                "the result file is gone: its server answered {status} after the job succeeded"
            )));
        }
        let too_large = || {
            KeepError::Permanent(format!(
                "the result file is larger than max_result_bytes ({} bytes)",
                self.limits.max_bytes
            ))
        };
        let declared = answer
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.limits.max_bytes) {
            return Err(too_large());
        }
        let header_type = answer
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut body = BytesMut::new();
        let mut answer = answer;
        while let Some(chunk) = answer.chunk().await.map_err(|e| {
            KeepError::Transient(format!("the result file's download broke off: {e}"))
        })? {
            if (body.len() + chunk.len()) as u64 > self.limits.max_bytes {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok((body.freeze(), header_type))
    }

    /// Stores one output (and its thumbnail) under its derived keys, once
    /// they are listed for the saga.
    async fn store_file(
        &self,
        owner: KeptFor<'_>,
        call: u32,
        index: u32,
        bytes: Bytes,
        header_type: Option<String>,
        brand: Option<&Arc<BrandArt>>,
    ) -> Result<KeptFile, KeepError> {
        let kept = kept_type(&bytes, header_type.as_deref())?;
        let key = result_object_key(&self.secret, owner.saga_id, call, index, kept);
        let branded = brand.filter(|_| kept.thumbnailed);
        let listed: Vec<String> = std::iter::once(key.clone())
            .chain(kept.thumbnailed.then(|| thumbnail_key(&key)))
            .chain(branded.map(|_| branded_key(&key)))
            .chain(branded.map(|_| branded_thumbnail_key(&key)))
            .collect();
        owner
            .lists
            .list(owner.saga_id, owner.token, listed)
            .await
            .map_err(listing_failure)?;
        let thumb = if kept.thumbnailed {
            Some(self.thumbnail_of(&key, bytes.clone()).await?)
        } else {
            None
        };
        let branded = match branded {
            Some(art) => Some(self.brand_of(&key, bytes.clone(), art).await?),
            None => None,
        };
        self.store.put(&key, bytes).await.map_err(store_failure)?;
        Ok(KeptFile {
            key,
            thumb,
            branded,
        })
    }

    /// Makes and stores the branded rendition of the result kept at `key`
    /// and its display-size copy (keys derived from `key`).
    async fn brand_of(
        &self,
        key: &str,
        bytes: Bytes,
        art: &Arc<BrandArt>,
    ) -> Result<(String, String), KeepError> {
        let art = Arc::clone(art);
        let made = self
            .pool
            .run_keep(move |memory| {
                brand_result(&bytes, &art, THUMBNAIL_PX, &PhotoLimits::default(), memory)
            })
            .await
            .map_err(|gone| {
                KeepError::Transient(format!("{gone}; the result is kept on the next try"))
            })?
            .map_err(|e| {
                KeepError::Permanent(format!("the result image cannot be branded: {e}"))
            })?;
        let (full, thumb) = (branded_key(key), branded_thumbnail_key(key));
        self.store
            .put(&full, Bytes::from(made.full.bytes))
            .await
            .map_err(store_failure)?;
        self.store
            .put(&thumb, Bytes::from(made.thumbnail.bytes))
            .await
            .map_err(store_failure)?;
        Ok((full, thumb))
    }

    /// Makes and stores the display rendition of the image kept at `key`.
    async fn thumbnail_of(&self, key: &str, bytes: Bytes) -> Result<String, KeepError> {
        // The keep lane: places of its own, ahead of queued uploads.
        let made = self
            .pool
            .run_keep(move |memory| {
                thumbnail(&bytes, THUMBNAIL_PX, &PhotoLimits::default(), memory)
            })
            .await
            .map_err(|gone| {
                KeepError::Transient(format!("{gone}; the result is kept on the next try"))
            })?
            .map_err(|e| KeepError::Permanent(format!("the result image cannot be read: {e}")))?;
        let thumb = thumbnail_key(key);
        self.store
            .put(&thumb, Bytes::from(made.bytes))
            .await
            .map_err(store_failure)?;
        Ok(thumb)
    }
}

/// Where one output file was kept: the original, its display thumbnail,
/// and the branded rendition with its display copy when a brand drew.
struct KeptFile {
    key: String,
    thumb: Option<String>,
    branded: Option<(String, String)>,
}

impl KeptFile {
    /// `item` as the surfaces show it: the branded rendition where the
    /// brand applies (`url` for the phone, the share page, the download,
    /// the gallery and the export; `thumb_url` for the display;
    /// `print_url` for the print), the original everywhere else, and the
    /// original always in `original_url` when a branded rendition exists.
    fn shown(self, item: ContentItem, brand: Option<&Arc<BrandArt>>) -> ContentItem {
        let media = |key: &str| format!("/media/{key}");
        let original = media(&self.key);
        let thumb = self.thumb.as_deref().map(media);
        let Some(((full, small), art)) = self.branded.zip(brand) else {
            return ContentItem {
                url: Some(original),
                thumb_url: thumb,
                ..item
            };
        };
        let on = |surface| art.applies_to().contains(surface);
        ContentItem {
            url: Some(if on(Surface::Share) {
                media(&full)
            } else {
                original.clone()
            }),
            thumb_url: if on(Surface::Display) {
                Some(media(&small))
            } else {
                thumb
            },
            print_url: on(Surface::Print).then(|| media(&full)),
            original_url: Some(original),
            ..item
        }
    }
}

/// The kept type of a downloaded file: by its bytes where they say (the
/// stored extension decides the type it is served with), else by its
/// header (SVG, formats without a signature); refused when not image,
/// video or audio.
fn kept_type(bytes: &[u8], header_type: Option<&str>) -> Result<KeptType, KeepError> {
    KeptType::sniff(bytes)
        .or_else(|| header_type.and_then(KeptType::of_content_type))
        .ok_or_else(|| {
            KeepError::Permanent(format!(
                "the result file's type ({}) is not an image, video or audio type that is kept",
                header_type.unwrap_or("none given")
            ))
        })
}

fn refused_origin(url: &Url) -> KeepError {
    KeepError::Permanent(format!(
        "the result URL's origin {} is neither the provider's nor one its result_origins list; nothing was fetched",
        url.origin().ascii_serialization()
    ))
}

/// A listed origin given as an IP literal is judged here (the resolver is
/// not asked for one).
fn refuse_internal_literal(url: &Url) -> Result<(), KeepError> {
    let host = url.host_str().unwrap_or_default();
    let Ok(ip) = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    else {
        return Ok(());
    };
    if is_internal(ip) {
        return Err(KeepError::Permanent(format!(
            "the result URL points at an internal address ({ip}); nothing was fetched"
        )));
    }
    Ok(())
}

/// Where a redirect leads (judged by the caller like the first URL).
fn next_hop(from: &Url, answer: &reqwest::Response) -> Result<Url, KeepError> {
    let location = answer
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            KeepError::Permanent(format!(
                "the result URL answered {} without a Location",
                answer.status()
            ))
        })?;
    from.join(location)
        .map_err(|e| KeepError::Permanent(format!("the result URL redirected to a bad URL: {e}")))
}

/// The bytes and type of a `data:` URL (base64 only; that is how adapters
/// inline a file).
fn decode_data_url(url: &str, max_bytes: u64) -> Result<(Bytes, Option<String>), KeepError> {
    let (head, data) = url[5..]
        .split_once(',')
        .ok_or_else(|| KeepError::Permanent("the inline result is not a data: URL".into()))?;
    let Some(media_type) = head.strip_suffix(";base64") else {
        return Err(KeepError::Permanent(
            "the inline result is not base64".into(),
        ));
    };
    if data.len() as u64 / 4 * 3 > max_bytes {
        return Err(KeepError::Permanent(format!(
            "the inline result is larger than max_result_bytes ({max_bytes} bytes)"
        )));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| KeepError::Permanent(format!("the inline result is not valid base64: {e}")))?;
    Ok((Bytes::from(bytes), Some(media_type.to_owned())))
}

/// A key that could not be listed: nothing is written. A lost lease
/// stops the worker (its supervisor sees it); anything else is tried
/// again.
fn listing_failure(e: StoreError) -> KeepError {
    if e.is_lease_lost() {
        KeepError::Transient("the saga's lease was lost; nothing is kept by this worker".into())
    } else {
        KeepError::Transient(format!(
            "the database cannot list the result's files now: {e}"
        ))
    }
}

fn store_failure(e: MediaError) -> KeepError {
    match e {
        MediaError::Unavailable(_) | MediaError::NotFound(_) => {
            KeepError::Transient(format!("the media store cannot take the result now: {e}"))
        }
        MediaError::Config { .. } => KeepError::Permanent(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).expect("a URL")
    }

    #[test]
    fn only_the_providers_own_origin_and_listed_ones_are_trusted() {
        let origins = ResultOrigins::new(
            "http://127.0.0.1:9090/v1",
            &["https://*.replicate.delivery"],
            &["https://files.example.com".to_owned()],
        )
        .expect("valid origins");
        assert_eq!(
            origins.trust(&url("http://127.0.0.1:9090/x.png")),
            Some(Trust::Own)
        );
        assert_eq!(
            origins.trust(&url("http://127.0.0.1:9091/x.png")),
            None,
            "another port"
        );
        assert_eq!(
            origins.trust(&url("https://127.0.0.1:9090/x.png")),
            None,
            "another scheme"
        );
        assert_eq!(origins.trust(&url("http://169.254.169.254/latest")), None);
        assert_eq!(
            origins.trust(&url("https://pbxt.replicate.delivery/a.png")),
            Some(Trust::Listed)
        );
        assert_eq!(
            origins.trust(&url("https://replicate.delivery.evil.com/a.png")),
            None
        );
        assert_eq!(
            origins.trust(&url("https://files.example.com/a.png")),
            Some(Trust::Listed)
        );
        assert_eq!(
            origins.trust(&url("https://files.example.com:8443/a.png")),
            None
        );
    }

    /// Each range that must never be fetched, with an address at each
    /// end of it, and the public addresses just outside.
    #[test]
    fn internal_addresses_are_known() {
        let inside = [
            // IPv4: "this network", private, shared (carrier-grade NAT),
            // loopback, link-local (the cloud metadata address), the IETF
            // protocol assignments, documentation, benchmarking, the 6to4
            // relay, multicast, reserved and broadcast.
            ("0.0.0.0/8", ["0.0.0.0", "0.255.255.255"]),
            ("10.0.0.0/8", ["10.0.0.0", "10.255.255.255"]),
            ("100.64.0.0/10", ["100.64.0.0", "100.127.255.255"]),
            ("127.0.0.0/8", ["127.0.0.1", "127.255.255.255"]),
            ("169.254.0.0/16", ["169.254.0.0", "169.254.169.254"]),
            ("172.16.0.0/12", ["172.16.0.0", "172.31.255.255"]),
            ("192.0.0.0/24", ["192.0.0.0", "192.0.0.255"]),
            ("192.0.2.0/24", ["192.0.2.0", "192.0.2.255"]),
            ("192.88.99.0/24", ["192.88.99.0", "192.88.99.255"]),
            ("192.168.0.0/16", ["192.168.0.0", "192.168.255.255"]),
            ("198.18.0.0/15", ["198.18.0.0", "198.19.255.255"]),
            ("198.51.100.0/24", ["198.51.100.0", "198.51.100.255"]),
            ("203.0.113.0/24", ["203.0.113.0", "203.0.113.255"]),
            ("224.0.0.0/4", ["224.0.0.0", "239.255.255.255"]),
            ("240.0.0.0/4", ["240.0.0.0", "255.255.255.255"]),
            // IPv6 of its own: unspecified, loopback, discard-only, the
            // local-use NAT64 prefix, Teredo, documentation, unique local,
            // link-local, site-local, multicast.
            ("::/128", ["::", "::"]),
            ("::1/128", ["::1", "::1"]),
            ("100::/64", ["100::", "100::ffff:ffff:ffff:ffff"]),
            ("64:ff9b:1::/48", ["64:ff9b:1::", "64:ff9b:1:ffff::1"]),
            ("2001::/32", ["2001::", "2001:0:ffff:ffff::1"]),
            ("2001:db8::/32", ["2001:db8::", "2001:db8:ffff::1"]),
            ("fc00::/7", ["fc00::", "fdff:ffff::1"]),
            ("fe80::/10", ["fe80::", "febf:ffff::1"]),
            ("fec0::/10", ["fec0::", "feff:ffff::1"]),
            ("ff00::/8", ["ff00::", "ff02::1"]),
            // IPv6 forms that carry an IPv4 address inside: judged by it.
            (
                "::ffff:0:0/96 (mapped)",
                ["::ffff:127.0.0.1", "::ffff:169.254.169.254"],
            ),
            ("::/96 (compatible)", ["::127.0.0.1", "::10.1.2.3"]),
            (
                "::ffff:0:0:0/96 (translated)",
                ["::ffff:0:127.0.0.1", "::ffff:0:192.168.1.1"],
            ),
            (
                "64:ff9b::/96 (NAT64)",
                ["64:ff9b::127.0.0.1", "64:ff9b::a9fe:a9fe"],
            ),
            ("2002::/16 (6to4)", ["2002:7f00:1::", "2002:a9fe:a9fe:1::1"]),
            ("2002::/16 (6to4)", ["2002:c0a8:101::1", "2002:a00:1::"]),
            ("2002::/16 (6to4)", ["2002:6440:1::", "2002:f000::"]),
        ];
        let mut wrong = Vec::new();
        for (range, ends) in inside {
            for address in ends {
                let ip: IpAddr = address.parse().expect("an address");
                if !is_internal(ip) {
                    wrong.push(format!("{address} is in {range}"));
                }
            }
        }
        for outside in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "169.253.255.255",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.0",
            "192.167.255.255",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700::1111",
            "2a00:1450:4001::200e",
            "::ffff:8.8.8.8",
            "::8.8.8.8",
            "::ffff:0:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
            "2001:1::1",
        ] {
            let ip: IpAddr = outside.parse().expect("an address");
            if is_internal(ip) {
                wrong.push(format!("{outside} is public"));
            }
        }
        assert!(wrong.is_empty(), "misjudged:\n{}", wrong.join("\n"));
    }

    #[test]
    fn a_listed_origin_at_an_internal_literal_address_is_refused() {
        assert!(refuse_internal_literal(&url("http://169.254.169.254/x")).is_err());
        assert!(refuse_internal_literal(&url("http://[::1]:80/x")).is_err());
        assert!(refuse_internal_literal(&url("https://files.example.com/x")).is_ok());
    }

    #[test]
    fn data_urls_decode_and_are_bounded() {
        let (bytes, media_type) =
            decode_data_url("data:image/png;base64,QUJD", 10).expect("decoded");
        assert_eq!(&bytes[..], b"ABC");
        assert_eq!(media_type.as_deref(), Some("image/png"));
        assert!(matches!(
            decode_data_url("data:image/png;base64,QUJDQUJDQUJD", 4),
            Err(KeepError::Permanent(_))
        ));
        assert!(matches!(
            decode_data_url("data:text/plain,hello", 100),
            Err(KeepError::Permanent(_))
        ));
    }

    #[test]
    fn a_file_is_kept_only_as_image_video_or_audio() {
        assert_eq!(
            kept_type(b"\x89PNG\r\n\x1a\n", Some("application/octet-stream")).map(|k| k.extension),
            Ok("png")
        );
        assert_eq!(
            kept_type(b"<html>", Some("image/jpeg; charset=binary")).map(|k| k.extension),
            Ok("jpg")
        );
        assert!(matches!(
            kept_type(b"<html>", Some("text/html")),
            Err(KeepError::Permanent(_))
        ));
    }
}
