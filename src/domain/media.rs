//! Media rules with no I/O: what a participant sends an experience
//! ([`InputKind`]), which result files are kept and under which extension
//! ([`KeptType`]), the object keys of photos and kept results, and the
//! signed, expiring URLs that let a provider read a photo.
//!
//! **Why keys are what they are.** A kept result's key is derived from the
//! saga, the call and the output index under a secret every instance
//! shares ([`result_object_key`]): a worker that re-runs the keep after a
//! crash writes the same object again, never a second one, and nobody can
//! guess a key from a saga id a display has seen. A photo's key is random
//! ([`photo_object_key`]): an upload that is retried with its
//! Idempotency-Key gets the stored answer, so it never needs the same key
//! twice. Nothing lists keys; a photo is served only to its owner, an
//! operator, or a signed URL ([`sign_media_url`]).
//!
//! **Why a copy of the database signs nothing.** A signed URL's key is
//! derived from the server's own secret ([`ServerSecret`]: configured, or
//! a file beside the database), which the database never holds; it keeps
//! only a fingerprint that tells whether two instances have the same one.
//! A signature is good for [`SIGNED_URL_MAX_MS`] at most: one that claims
//! longer is refused, so even a leaked URL opens a photo for minutes. The
//! secret result keys are derived under is another one, kept in the
//! database (`server_keys.media_signing`): it names objects, it signs
//! nothing, and the database holds every result's URL anyway.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use ring::hmac;
use sha2::{Digest, Sha256};

/// What a participant sends an experience.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InputKind {
    /// A prompt only (as before photos).
    #[default]
    Prompt,
    /// A photo; the prompt is optional.
    Photo,
    /// A photo and a prompt.
    PhotoAndPrompt,
}

impl InputKind {
    pub const ALL: [InputKind; 3] = [
        InputKind::Prompt,
        InputKind::Photo,
        InputKind::PhotoAndPrompt,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            InputKind::Prompt => "prompt",
            InputKind::Photo => "photo",
            InputKind::PhotoAndPrompt => "photo+prompt",
        }
    }

    /// Whether a submission must name a photo.
    pub fn takes_photo(self) -> bool {
        self != InputKind::Prompt
    }

    /// Whether a submission must carry a prompt.
    pub fn needs_prompt(self) -> bool {
        self != InputKind::Photo
    }

    /// Reads a stored value; anything unknown is a prompt experience.
    pub fn of(text: &str) -> InputKind {
        text.parse().unwrap_or_default()
    }
}

impl fmt::Display for InputKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for InputKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        InputKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| "input must be \"prompt\", \"photo\" or \"photo+prompt\"".to_owned())
    }
}

/// A result file type stagehand keeps, with the extension its key gets and
/// whether the displays get a thumbnail of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptType {
    pub content_type: &'static str,
    pub extension: &'static str,
    /// A raster image the thumbnailer reads (PNG, JPEG, WebP).
    pub thumbnailed: bool,
}

/// The types kept: images, video and audio. SVG is kept (the built-in
/// simulator draws prompt-only results as SVG) and served under a
/// Content-Security-Policy that runs nothing.
const KEPT_TYPES: [KeptType; 12] = [
    KeptType {
        content_type: "image/png",
        extension: "png",
        thumbnailed: true,
    },
    KeptType {
        content_type: "image/jpeg",
        extension: "jpg",
        thumbnailed: true,
    },
    KeptType {
        content_type: "image/webp",
        extension: "webp",
        thumbnailed: true,
    },
    KeptType {
        content_type: "image/gif",
        extension: "gif",
        thumbnailed: false,
    },
    KeptType {
        content_type: "image/avif",
        extension: "avif",
        thumbnailed: false,
    },
    KeptType {
        content_type: "image/svg+xml",
        extension: "svg",
        thumbnailed: false,
    },
    KeptType {
        content_type: "video/mp4",
        extension: "mp4",
        thumbnailed: false,
    },
    KeptType {
        content_type: "video/webm",
        extension: "webm",
        thumbnailed: false,
    },
    KeptType {
        content_type: "audio/mpeg",
        extension: "mp3",
        thumbnailed: false,
    },
    KeptType {
        content_type: "audio/wav",
        extension: "wav",
        thumbnailed: false,
    },
    KeptType {
        content_type: "audio/ogg",
        extension: "ogg",
        thumbnailed: false,
    },
    KeptType {
        content_type: "audio/mp4",
        extension: "m4a",
        thumbnailed: false,
    },
];

impl KeptType {
    /// The kept type of a `Content-Type` header value (its parameters and
    /// case ignored; `image/jpg` and `audio/x-wav` read as their standard
    /// names); None for a type that is not kept.
    pub fn of_content_type(value: &str) -> Option<KeptType> {
        let essence = value.split(';').next()?.trim().to_ascii_lowercase();
        let essence = match essence.as_str() {
            "image/jpg" | "image/pjpeg" => "image/jpeg",
            "audio/x-wav" | "audio/wave" => "audio/wav",
            "audio/mp3" => "audio/mpeg",
            other => other,
        }
        .to_owned();
        KEPT_TYPES.into_iter().find(|t| t.content_type == essence)
    }

    /// The kept type of a stored object, by its key's extension.
    pub fn of_key(key: &str) -> Option<KeptType> {
        let extension = key.rsplit_once('.')?.1;
        KEPT_TYPES.into_iter().find(|t| t.extension == extension)
    }

    /// The type by the file's first bytes, for a server that sends none or
    /// a generic one (`application/octet-stream`).
    pub fn sniff(bytes: &[u8]) -> Option<KeptType> {
        let by = |ct: &str| KeptType::of_content_type(ct);
        match bytes {
            [0x89, b'P', b'N', b'G', ..] => by("image/png"),
            [0xFF, 0xD8, 0xFF, ..] => by("image/jpeg"),
            [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => by("image/webp"),
            [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'A', b'V', b'E', ..] => by("audio/wav"),
            [b'G', b'I', b'F', b'8', ..] => by("image/gif"),
            [0x1A, 0x45, 0xDF, 0xA3, ..] => by("video/webm"),
            [_, _, _, _, b'f', b't', b'y', b'p', b'a', b'v', b'i', b'f', ..] => by("image/avif"),
            [_, _, _, _, b'f', b't', b'y', b'p', b'M', b'4', b'A', ..] => by("audio/mp4"),
            [_, _, _, _, b'f', b't', b'y', b'p', ..] => by("video/mp4"),
            [b'I', b'D', b'3', ..] | [0xFF, 0xFB | 0xF3 | 0xF2, ..] => by("audio/mpeg"),
            [b'O', b'g', b'g', b'S', ..] => by("audio/ogg"),
            _ => None,
        }
    }
}

/// Whether a stored object is a participant's photo (never public).
pub fn is_photo_key(key: &str) -> bool {
    key.starts_with("p/")
}

/// The key of a new photo: random (128 bits), never derived from the
/// session.
pub fn photo_object_key(random: u128) -> String {
    format!("p/{random:032x}.jpg")
}

/// The key of output `index` of call `call` of saga `saga_id`, of `kept`
/// type, under the shared secret: the same every time the keep runs for
/// that output, unguessable without the secret.
pub fn result_object_key(
    secret: &[u8],
    saga_id: &str,
    call: u32,
    index: u32,
    kept: KeptType,
) -> String {
    format!(
        "r/{}.{}",
        result_stem(secret, saga_id, call, index),
        kept.extension
    )
}

/// The key of the display-size rendition of the result kept at `key`.
pub fn thumbnail_key(key: &str) -> String {
    let stem = key.rsplit_once('.').map_or(key, |(stem, _)| stem);
    format!("{stem}.t.jpg")
}

fn result_stem(secret: &[u8], saga_id: &str, call: u32, index: u32) -> String {
    let digest = Sha256::new()
        .chain_update(b"stagehand kept result\0")
        .chain_update(secret)
        .chain_update([0])
        .chain_update(saga_id.as_bytes())
        .chain_update([0])
        .chain_update(call.to_be_bytes())
        .chain_update(index.to_be_bytes())
        .finalize();
    hex::encode(&digest[..16])
}

/// The longest a signed media URL is good for: a signature whose expiry
/// lies further ahead than this is refused, whoever made it.
pub const SIGNED_URL_MAX_MS: i64 = 15 * 60_000;

/// A photo URL a provider gets is good until the end of the
/// [`PHOTO_URL_WINDOW_MS`] window that follows [`PHOTO_URL_AT_LEAST_MS`]
/// from its making: 9 to 14 minutes, leaving a minute of the 15 for
/// instances whose clocks differ.
const PHOTO_URL_AT_LEAST_MS: i64 = 9 * 60_000;
const PHOTO_URL_WINDOW_MS: i64 = 5 * 60_000;
/// A key sent again goes on with its first send's URL while that URL has
/// this long left.
const PHOTO_URL_LEFT_MS: i64 = 5 * 60_000;

/// The expiry of the photo URL an order carries when its key, first sent
/// at `first_sent_ms`, is sent at `now_ms`. Every send of one key within a
/// few minutes carries the same URL (a provider that compares inputs, such
/// as Replicate's list, finds the job an unclear send made), and a worker
/// that resumes the key from the time its slot took it gets that URL too
/// unless the window turned in between; a key sent again much later gets
/// a fresh one, so a URL never outlives [`SIGNED_URL_MAX_MS`].
pub fn photo_url_expiry(first_sent_ms: i64, now_ms: i64) -> i64 {
    let good_until = |made_ms: i64| {
        ((made_ms + PHOTO_URL_AT_LEAST_MS).div_euclid(PHOTO_URL_WINDOW_MS) + 1)
            * PHOTO_URL_WINDOW_MS
    };
    let first = good_until(first_sent_ms.min(now_ms));
    if first - now_ms >= PHOTO_URL_LEFT_MS {
        first
    } else {
        good_until(now_ms)
    }
}

/// The SHA-256 (hex) of a stored photo's bytes: how the photo a job was
/// sent is known again (a data URI or an uploaded file of the same bytes)
/// without keeping the photo.
pub fn photo_sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The query of a signed URL for `key` that is good until `expires_ms`:
/// `exp=<ms>&sig=<hex HMAC-SHA256 of the key and the expiry>`.
pub fn sign_media_url(secret: &[u8], key: &str, expires_ms: i64) -> String {
    let tag = hmac::sign(&signing_key(secret), &signed_text(key, expires_ms));
    format!("exp={expires_ms}&sig={}", hex::encode(tag.as_ref()))
}

/// Whether `sig` signs `key` until `expires_ms`, that time has not passed
/// at `now_ms`, and it is no further ahead than [`SIGNED_URL_MAX_MS`].
pub fn signature_holds(secret: &[u8], key: &str, expires_ms: i64, sig: &str, now_ms: i64) -> bool {
    let Ok(tag) = hex::decode(sig) else {
        return false;
    };
    now_ms <= expires_ms
        && expires_ms.saturating_sub(now_ms) <= SIGNED_URL_MAX_MS
        && hmac::verify(&signing_key(secret), &signed_text(key, expires_ms), &tag).is_ok()
}

/// The server's own secret: `STAGEHAND_SECRET`, or the secret file
/// (docs/OPERATIONS.md). The database never holds it, so a copy of the
/// database cannot sign a media URL. `Debug` shows nothing of it, and
/// there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerSecret(Arc<str>);

impl ServerSecret {
    /// The fewest characters a secret may have (a short one could be
    /// guessed from one signed URL).
    pub const MIN_CHARS: usize = 32;

    /// `text` (trimmed) as the secret, or why it cannot be one.
    pub fn new(text: &str) -> Result<ServerSecret, String> {
        let text = text.trim();
        if text.chars().count() < Self::MIN_CHARS {
            return Err(format!(
                "the server secret must have at least {} characters (make one with `openssl rand -hex 32`)",
                Self::MIN_CHARS
            ));
        }
        Ok(ServerSecret(Arc::from(text)))
    }

    /// A new secret from 256 random bits, as 64 hex digits.
    pub fn from_random(bytes: [u8; 32]) -> ServerSecret {
        ServerSecret(Arc::from(hex::encode(bytes)))
    }

    /// The secret's text, to write it to its file.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The key signed media URLs are made and checked with.
    pub fn media_signing_key(&self) -> [u8; 32] {
        self.derive(b"stagehand media url signing key")
    }

    /// The key webhook endpoints' secrets are sealed with in the database.
    pub fn webhook_seal_key(&self) -> [u8; 32] {
        self.derive(b"stagehand webhook secret seal")
    }

    /// The key of the digests that bound how often one mail address is
    /// mailed ([`crate::domain::mail::address_key`]).
    pub fn mail_address_key(&self) -> [u8; 32] {
        self.derive(b"stagehand mail address key")
    }

    /// What the database keeps to tell whether two instances have the
    /// same secret: it reveals nothing of the secret, nor of the signing
    /// key.
    pub fn fingerprint(&self) -> String {
        hex::encode(&self.derive(b"stagehand server secret fingerprint")[..16])
    }

    fn derive(&self, label: &[u8]) -> [u8; 32] {
        let key = hmac::Key::new(hmac::HMAC_SHA256, self.0.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(hmac::sign(&key, label).as_ref());
        out
    }
}

impl fmt::Debug for ServerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServerSecret(***)")
    }
}

impl FromStr for ServerSecret {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ServerSecret::new(text)
    }
}

fn signing_key(secret: &[u8]) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, secret)
}

fn signed_text(key: &str, expires_ms: i64) -> Vec<u8> {
    format!("stagehand media url\0{key}\0{expires_ms}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"a secret every instance shares";

    #[test]
    fn a_result_key_is_the_same_for_the_same_output_and_differs_for_any_other() {
        let png = KeptType::of_content_type("image/png").expect("png is kept");
        let key = result_object_key(SECRET, "saga-1", 0, 0, png);
        assert_eq!(key, result_object_key(SECRET, "saga-1", 0, 0, png));
        assert!(key.starts_with("r/") && key.ends_with(".png"), "{key}");
        for other in [
            result_object_key(SECRET, "saga-2", 0, 0, png),
            result_object_key(SECRET, "saga-1", 1, 0, png),
            result_object_key(SECRET, "saga-1", 0, 1, png),
            result_object_key(b"another secret", "saga-1", 0, 0, png),
        ] {
            assert_ne!(key, other);
        }
        assert_eq!(thumbnail_key(&key), key.replace(".png", ".t.jpg"));
    }

    #[test]
    fn a_signed_url_holds_until_it_expires_and_only_for_its_key() {
        let query = sign_media_url(SECRET, "p/abc.jpg", 1_000);
        let sig = query.split("sig=").nth(1).expect("a signature");
        assert!(signature_holds(SECRET, "p/abc.jpg", 1_000, sig, 999));
        assert!(signature_holds(SECRET, "p/abc.jpg", 1_000, sig, 1_000));
        assert!(
            !signature_holds(SECRET, "p/abc.jpg", 1_000, sig, 1_001),
            "expired"
        );
        assert!(
            !signature_holds(SECRET, "p/abd.jpg", 1_000, sig, 0),
            "another key"
        );
        assert!(
            !signature_holds(SECRET, "p/abc.jpg", 2_000, sig, 0),
            "another expiry"
        );
        assert!(
            !signature_holds(b"other", "p/abc.jpg", 1_000, sig, 0),
            "another secret"
        );
        assert!(
            !signature_holds(SECRET, "p/abc.jpg", 1_000, "zz", 0),
            "not hex"
        );
    }

    #[test]
    fn a_signature_good_for_more_than_15_minutes_is_refused() {
        let now = 1_800_000_000_000;
        let within = now + SIGNED_URL_MAX_MS;
        let query = sign_media_url(SECRET, "p/abc.jpg", within);
        let sig = query.split("sig=").nth(1).expect("a signature");
        assert!(signature_holds(SECRET, "p/abc.jpg", within, sig, now));
        let beyond = within + 1;
        let query = sign_media_url(SECRET, "p/abc.jpg", beyond);
        let sig = query.split("sig=").nth(1).expect("a signature");
        assert!(!signature_holds(SECRET, "p/abc.jpg", beyond, sig, now));
        assert!(
            signature_holds(SECRET, "p/abc.jpg", beyond, sig, now + 1),
            "the same URL a moment later is within the bound"
        );
    }

    #[test]
    fn a_photo_url_is_the_same_for_every_send_of_a_key_and_never_good_for_15_minutes() {
        const MINUTE: i64 = 60_000;
        let first = 1_800_000_000_000 + 123_456;
        let expiry = photo_url_expiry(first, first);
        assert!(expiry > first + 9 * MINUTE && expiry <= first + 14 * MINUTE);
        for later in [1, MINUTE, 4 * MINUTE] {
            assert_eq!(photo_url_expiry(first, first + later), expiry, "{later}");
        }
        // A worker that resumes the key from its slot's time.
        assert_eq!(photo_url_expiry(first - 1_000, first + MINUTE), expiry);
        // Sent again long after: a fresh URL, still within the bound.
        for now in (first..first + 3_600_000).step_by(7_919) {
            let expiry = photo_url_expiry(first, now);
            assert!(expiry - now >= PHOTO_URL_LEFT_MS, "{now}");
            assert!(expiry - now < SIGNED_URL_MAX_MS - MINUTE + 1, "{now}");
        }
    }

    #[test]
    fn the_server_secret_signs_and_its_fingerprint_says_nothing_of_it() {
        assert!(ServerSecret::new("too short").is_err());
        let secret = ServerSecret::new(" 0123456789abcdef0123456789abcdef \n").expect("32 chars");
        assert_eq!(secret.expose(), "0123456789abcdef0123456789abcdef");
        assert_eq!(format!("{secret:?}"), "ServerSecret(***)");
        let other = ServerSecret::from_random([7; 32]);
        assert_eq!(other.expose().len(), 64);
        assert_ne!(secret.media_signing_key(), other.media_signing_key());
        assert_ne!(secret.fingerprint(), other.fingerprint());
        let key = secret.media_signing_key();
        assert_ne!(&key[..], secret.expose().as_bytes());
        assert!(!secret.fingerprint().contains(&hex::encode(&key[..4])));
        assert_eq!(secret.fingerprint(), secret.clone().fingerprint());
    }

    #[test]
    fn kept_types_come_from_the_header_or_the_bytes_and_nothing_else_is_kept() {
        assert_eq!(
            KeptType::of_content_type("IMAGE/JPG; q=1").map(|t| t.extension),
            Some("jpg")
        );
        assert_eq!(KeptType::of_content_type("text/html"), None);
        assert_eq!(KeptType::of_content_type("application/octet-stream"), None);
        assert_eq!(
            KeptType::sniff(b"\x89PNG\r\n\x1a\n....").map(|t| t.extension),
            Some("png")
        );
        assert_eq!(KeptType::sniff(b"<html>"), None);
        assert_eq!(
            KeptType::of_key("r/abc.t.jpg").map(|t| t.content_type),
            Some("image/jpeg")
        );
        assert_eq!(KeptType::of_key("r/abc"), None);
    }

    #[test]
    fn input_kinds_read_and_say_what_they_need() {
        assert_eq!(
            "photo+prompt".parse::<InputKind>(),
            Ok(InputKind::PhotoAndPrompt)
        );
        assert!("video".parse::<InputKind>().is_err());
        assert!(!InputKind::Prompt.takes_photo() && InputKind::Prompt.needs_prompt());
        assert!(InputKind::Photo.takes_photo() && !InputKind::Photo.needs_prompt());
        assert!(
            InputKind::PhotoAndPrompt.takes_photo() && InputKind::PhotoAndPrompt.needs_prompt()
        );
        assert_eq!(InputKind::of("nonsense"), InputKind::Prompt);
    }
}
