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
//!   refuses loopback, private, link-local and metadata addresses
//!   ([`is_internal`]), so a name cannot be pointed inside later; the
//!   provider's own origin may be loopback (the built-in simulator).
//! - **What a failure is.** A reset or a 5xx is [`KeepError::Transient`]
//!   (the caller retries with backoff, no new AI job); a 404 after
//!   success, a file too large, a type not kept, a refused origin is
//!   [`KeepError::Permanent`] (a failed attempt, never a success with a
//!   broken picture).
//!
//! Inline results (`data:` URLs, which is how OpenAI's `b64_json` arrives)
//! are decoded into the store the same way: no row and no frame carries
//! file bytes.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use reqwest::{StatusCode, Url};

use super::photo::{thumbnail, PhotoLimits};
use super::pool::PhotoPool;
use super::{MediaError, MediaStore};
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

/// Whether `ip` is inside: loopback, private, link-local (the cloud
/// metadata address 169.254.169.254 among them), shared, unspecified or
/// multicast; IPv4-mapped IPv6 addresses are judged as their IPv4.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_internal(IpAddr::V4(v4)),
            None => {
                let first = v6.segments()[0];
                v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || (first & 0xfe00) == 0xfc00
                    || (first & 0xffc0) == 0xfe80
            }
        },
    }
}

/// A resolver that gives only public addresses: a listed origin whose name
/// points inside is refused at connection time, whatever it resolved to
/// when it was configured.
struct PublicOnly;

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
/// listed for, and the lock token that lists them (a worker that lost
/// the saga's lease writes nothing).
#[derive(Clone, Copy)]
pub struct KeptFor<'a> {
    pub store: &'a Store,
    pub saga_id: &'a str,
    pub token: &'a str,
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
        crate::ai::client::ensure_crypto_provider();
        let build = |public_only: bool| {
            let builder = reqwest::Client::builder()
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

    /// Keeps every file of call `call`'s `items` (for the saga of `owner`):
    /// the items come back with this server's URLs. Items already kept (a
    /// re-run) and text items are left as they are.
    pub async fn keep(
        &self,
        origins: &ResultOrigins,
        owner: KeptFor<'_>,
        call: u32,
        items: Vec<ContentItem>,
    ) -> Result<Vec<ContentItem>, KeepError> {
        let mut kept = Vec::with_capacity(items.len());
        for (index, item) in items.into_iter().enumerate() {
            let Some(url) = item.url.clone().filter(|u| !u.starts_with("/media/")) else {
                kept.push(item);
                continue;
            };
            let (bytes, header_type) = self.fetch(origins, &url).await?;
            let (key, thumb) = self
                .store_file(owner, call, index as u32, bytes, header_type)
                .await?;
            kept.push(ContentItem {
                url: Some(format!("/media/{key}")),
                thumb_url: thumb.map(|t| format!("/media/{t}")),
                ..item
            });
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
    ) -> Result<(String, Option<String>), KeepError> {
        let kept = kept_type(&bytes, header_type.as_deref())?;
        let key = result_object_key(&self.secret, owner.saga_id, call, index, kept);
        let listed: Vec<String> = std::iter::once(key.clone())
            .chain(kept.thumbnailed.then(|| thumbnail_key(&key)))
            .collect();
        owner
            .store
            .record_kept_objects(owner.saga_id, owner.token, &listed)
            .await
            .map_err(listing_failure)?;
        let thumb = if kept.thumbnailed {
            Some(self.thumbnail_of(&key, bytes.clone()).await?)
        } else {
            None
        };
        self.store.put(&key, bytes).await.map_err(store_failure)?;
        Ok((key, thumb))
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

    #[test]
    fn internal_addresses_are_known() {
        for inside in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "::1",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "100.64.0.1",
        ] {
            assert!(is_internal(inside.parse().expect("an address")), "{inside}");
        }
        for outside in ["8.8.8.8", "172.32.0.1", "2606:4700::1111"] {
            assert!(
                !is_internal(outside.parse().expect("an address")),
                "{outside}"
            );
        }
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
