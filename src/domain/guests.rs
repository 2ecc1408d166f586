//! The guests' data: who may see a result (the gallery's rule and its
//! PIN), when a guest's data is due to be forgotten (retention), which
//! stored objects a result names, and the result link's id. Pure: every
//! function is given `now` or the random bytes it needs.

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;

use ring::pbkdf2;

/// How long an input photo is kept after its saga ends, unless the
/// experience says.
pub const DEFAULT_PHOTO_RETENTION_MS: i64 = 3_600_000;
/// How long results and personal fields are kept after the event closes
/// (or after the session ended), unless the experience says.
pub const DEFAULT_RETENTION_MS: i64 = 30 * 24 * 3_600_000;

/// Whether the experience's results appear at `/g/{slug}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gallery {
    #[default]
    Off,
    Public,
    /// Only with the gallery's PIN (`X-Gallery-Pin`).
    Pin,
}

impl Gallery {
    pub fn as_str(self) -> &'static str {
        match self {
            Gallery::Off => "off",
            Gallery::Public => "public",
            Gallery::Pin => "pin",
        }
    }

    /// The stored text; anything unknown is `Off` (never shown by mistake).
    pub fn of(text: &str) -> Gallery {
        text.parse().unwrap_or_default()
    }
}

impl FromStr for Gallery {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "off" => Ok(Gallery::Off),
            "public" => Ok(Gallery::Public),
            "pin" => Ok(Gallery::Pin),
            _ => Err("gallery must be \"off\", \"public\" or \"pin\"".into()),
        }
    }
}

impl fmt::Display for Gallery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who forgot a session's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForgottenBy {
    /// The experience's `retention` ran out.
    Retention,
    /// The guest erased it (`DELETE /api/sessions/{id}`).
    Participant,
    /// An operator erased it (`DELETE /api/admin/sessions/{id}`).
    Operator,
}

impl ForgottenBy {
    pub fn as_str(self) -> &'static str {
        match self {
            ForgottenBy::Retention => "retention",
            ForgottenBy::Participant => "participant",
            ForgottenBy::Operator => "operator",
        }
    }

    /// Whether the guest or an operator asked (the link then answers 410
    /// "erased"; after retention it answers 410 "expired").
    pub fn is_erasure(self) -> bool {
        !matches!(self, ForgottenBy::Retention)
    }

    pub fn of(text: &str) -> Option<ForgottenBy> {
        match text {
            "retention" => Some(ForgottenBy::Retention),
            "participant" => Some(ForgottenBy::Participant),
            "operator" => Some(ForgottenBy::Operator),
            _ => None,
        }
    }
}

/// PBKDF2-HMAC-SHA256 rounds of a gallery PIN: slow enough that a stolen
/// hash of a 6-digit PIN is not read back in a blink, fast enough for a
/// page load (about 50 ms on one core, which is why it runs off the HTTP
/// workers and once per gallery and PIN).
const PIN_ROUNDS: u32 = 100_000;

/// The fewest digits a gallery PIN has (at most 12): guessed at a
/// gallery's ceiling of wrong guesses, 6 digits hold for months
/// (docs/PRIVACY.md has the arithmetic).
pub const MIN_PIN_DIGITS: usize = 6;
/// The most digits a gallery PIN has.
pub const MAX_PIN_DIGITS: usize = 12;
/// The fewest digits a PIN had before [`MIN_PIN_DIGITS`] (an older
/// server accepted 4).
const OLD_MIN_PIN_DIGITS: usize = 4;

/// What a PIN given to a gallery can be, before any hash is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinShape {
    /// 6 to 12 digits: a PIN an organiser may set now.
    Current,
    /// 4 or 5 digits: only a PIN set before 6 were required can be one.
    /// Such a gallery no longer opens with it (it is guessed too soon).
    Outdated,
    /// Anything else: no gallery's PIN, so no hash is run for it.
    Malformed,
}

/// The shape of `pin`.
pub fn pin_shape(pin: &str) -> PinShape {
    if !pin.bytes().all(|b| b.is_ascii_digit()) {
        return PinShape::Malformed;
    }
    match pin.len() {
        n if (MIN_PIN_DIGITS..=MAX_PIN_DIGITS).contains(&n) => PinShape::Current,
        n if (OLD_MIN_PIN_DIGITS..MIN_PIN_DIGITS).contains(&n) => PinShape::Outdated,
        _ => PinShape::Malformed,
    }
}

/// The ceiling of PINs checked against one gallery, over every client
/// address and instance: at most `guesses` in a window of `period_ms`;
/// the guess that reaches it locks the gallery for `period_ms`, during
/// which every PIN answer is "locked", the right PIN's too. So guessing
/// gets at most `guesses` answers per `period_ms`, however many addresses
/// it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuessCeiling {
    pub guesses: u32,
    pub period_ms: i64,
}

/// Which PIN a stored hash is of: its random salt (not secret; a new PIN,
/// even the same digits again, has a new one). The guess counts of a
/// gallery are kept per PIN, so a new PIN starts them afresh.
pub fn pin_salt(stored: &str) -> &str {
    stored.split('$').nth(2).unwrap_or_default()
}

/// The stored form of a gallery PIN:
/// `pbkdf2-sha256$<rounds>$<salt hex>$<hash hex>`. `salt` is random.
pub fn hash_pin(pin: &str, salt: [u8; 16]) -> String {
    let rounds = NonZeroU32::new(PIN_ROUNDS).expect("nonzero");
    let mut out = [0u8; 32];
    pbkdf2::derive(
        pbkdf2::PBKDF2_HMAC_SHA256,
        rounds,
        &salt,
        pin.as_bytes(),
        &mut out,
    );
    format!(
        "pbkdf2-sha256${PIN_ROUNDS}${}${}",
        hex::encode(salt),
        hex::encode(out)
    )
}

/// Whether `pin` is the one `stored` was made from (in constant time).
pub fn pin_matches(pin: &str, stored: &str) -> bool {
    let mut parts = stored.split('$');
    let (Some("pbkdf2-sha256"), Some(rounds), Some(salt), Some(hash), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return false;
    };
    let (Some(rounds), Ok(salt), Ok(hash)) = (
        rounds.parse::<u32>().ok().and_then(NonZeroU32::new),
        hex::decode(salt),
        hex::decode(hash),
    ) else {
        return false;
    };
    pbkdf2::verify(
        pbkdf2::PBKDF2_HMAC_SHA256,
        rounds,
        &salt,
        pin.as_bytes(),
        &hash,
    )
    .is_ok()
}

/// A gallery PIN an organiser may set: 6 to 12 digits.
pub fn pin_is_valid(pin: &str) -> bool {
    pin_shape(pin) == PinShape::Current
}

/// A result link's id: 128 random bits, as 32 hex digits.
pub fn share_id(random: u128) -> String {
    format!("{random:032x}")
}

/// The result link's path: `/r/{share_id}`.
pub fn share_path(share_id: &str) -> String {
    format!("/r/{share_id}")
}

/// Whether `text` has the shape of a share id (checked before any read).
pub fn is_share_id(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// When a session's results and personal fields are due to be
/// forgotten: `retention_ms` after the event closes, or after the
/// session ended when that was later or there is no closing time.
pub fn results_due_at(closes_at_ms: Option<i64>, ended_at_ms: i64, retention_ms: i64) -> i64 {
    closes_at_ms
        .map_or(ended_at_ms, |closes| closes.max(ended_at_ms))
        .saturating_add(retention_ms)
}

/// The media-store keys a result's content names: each item's `url`,
/// `thumb_url`, `original_url` and `print_url` that point at a kept file
/// (`/media/r/…`), each once. Provider URLs (never kept) are not ours to
/// delete.
pub fn kept_keys(content: &serde_json::Value) -> Vec<String> {
    keys_in(content, &["url", "thumb_url", "original_url", "print_url"])
}

/// The kept files a result shares (each item's `url`: the branded
/// rendition where the brand applies to sharing): what the export holds.
pub fn shared_keys(content: &serde_json::Value) -> Vec<String> {
    keys_in(content, &["url"])
}

fn keys_in(content: &serde_json::Value, fields: &[&str]) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for item in content.as_array().into_iter().flatten() {
        for field in fields {
            if let Some(key) = item[*field]
                .as_str()
                .and_then(|url| url.strip_prefix("/media/"))
                .filter(|key| key.starts_with("r/") && !key[2..].contains('/'))
            {
                if !keys.iter().any(|k| k == key) {
                    keys.push(key.to_owned());
                }
            }
        }
    }
    keys
}

/// The file name of a kept object inside an export (`r/abc.png` ->
/// `abc.png`).
pub fn export_name(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or(key)
}

/// The organiser's notice or consent text for `locale`: the text of that
/// locale, else English, else any (a notice is `{"en": "...", "ko":
/// "..."}`).
pub fn text_for<'a>(texts: &'a serde_json::Value, locale: &str) -> Option<&'a str> {
    let map = texts.as_object()?;
    map.get(locale)
        .or_else(|| map.get("en"))
        .or_else(|| map.values().next())
        .and_then(|v| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pin_is_stored_salted_and_checked_back() {
        let stored = hash_pin("4321", [7; 16]);
        assert!(stored.starts_with("pbkdf2-sha256$100000$"), "{stored}");
        assert!(!stored.contains("4321"));
        assert!(pin_matches("4321", &stored));
        assert!(!pin_matches("4322", &stored));
        assert!(!pin_matches("", &stored));
        assert_ne!(stored, hash_pin("4321", [8; 16]), "the salt changes it");
        assert!(!pin_matches("4321", "plain"));
        assert!(!pin_matches("4321", "pbkdf2-sha256$0$00$00"));
    }

    #[test]
    fn a_pin_is_six_to_twelve_digits() {
        assert!(pin_is_valid("000000") && pin_is_valid("123456789012"));
        assert!(!pin_is_valid("12345") && !pin_is_valid("1234567890123"));
        assert!(!pin_is_valid("12a456") && !pin_is_valid("１２３４５６"));
        assert_eq!(pin_shape("2468"), PinShape::Outdated);
        assert_eq!(pin_shape("24680"), PinShape::Outdated);
        assert_eq!(pin_shape("246801"), PinShape::Current);
        for malformed in ["", "123", "1234567890123", "12 34", "abcd", "１２３４"] {
            assert_eq!(pin_shape(malformed), PinShape::Malformed, "{malformed:?}");
        }
    }

    #[test]
    fn a_stored_pin_is_named_by_its_salt() {
        let stored = hash_pin("246810", [7; 16]);
        assert_eq!(pin_salt(&stored), "07".repeat(16));
        assert_ne!(pin_salt(&stored), pin_salt(&hash_pin("246810", [8; 16])));
        assert_eq!(pin_salt(""), "");
        assert_eq!(pin_salt("plain"), "");
    }

    #[test]
    fn the_gallery_setting_reads_back_and_unknown_is_off() {
        for g in [Gallery::Off, Gallery::Public, Gallery::Pin] {
            assert_eq!(Gallery::of(g.as_str()), g);
        }
        assert_eq!(Gallery::of("everyone"), Gallery::Off);
        assert!("everyone".parse::<Gallery>().is_err());
    }

    #[test]
    fn share_ids_are_32_hex_digits() {
        let id = share_id(u128::MAX - 5);
        assert!(is_share_id(&id), "{id}");
        assert!(is_share_id(&share_id(1)));
        assert!(!is_share_id("../etc/passwd") && !is_share_id(&"g".repeat(32)));
    }

    #[test]
    fn results_are_due_after_closing_or_after_the_end_whichever_is_later() {
        assert_eq!(results_due_at(None, 1_000, 500), 1_500);
        assert_eq!(results_due_at(Some(5_000), 1_000, 500), 5_500);
        assert_eq!(results_due_at(Some(500), 1_000, 500), 1_500);
        assert_eq!(results_due_at(None, i64::MAX - 1, 500), i64::MAX);
    }

    #[test]
    fn only_kept_files_are_named_for_deletion() {
        let content = json!([
            {"type": "image", "url": "/media/r/abc.png", "thumb_url": "/media/r/abc.t.jpg"},
            {"type": "image", "url": "https://replicate.delivery/x.png"},
            {"type": "text", "text": "hello"},
            {"type": "image", "url": "/media/p/photo.jpg"},
            {"type": "image", "url": "/media/r/../p/x.jpg"},
        ]);
        assert_eq!(kept_keys(&content), vec!["r/abc.png", "r/abc.t.jpg"]);
        let branded = json!([{"type": "image", "url": "/media/r/abc.b.jpg", "thumb_url": "/media/r/abc.t.jpg",
            "original_url": "/media/r/abc.png", "print_url": "/media/r/abc.b.jpg"}]);
        assert_eq!(
            kept_keys(&branded),
            vec!["r/abc.b.jpg", "r/abc.t.jpg", "r/abc.png"]
        );
        assert_eq!(shared_keys(&branded), vec!["r/abc.b.jpg"]);
        assert!(kept_keys(&json!(null)).is_empty());
        assert_eq!(export_name("r/abc.png"), "abc.png");
    }

    #[test]
    fn a_notice_falls_back_to_english_then_to_any() {
        let both = json!({"en": "We keep it 30 days.", "ko": "30일 보관합니다."});
        assert_eq!(text_for(&both, "ko"), Some("30일 보관합니다."));
        assert_eq!(text_for(&both, "fr"), Some("We keep it 30 days."));
        assert_eq!(text_for(&json!({"ko": "한국어"}), "en"), Some("한국어"));
        assert_eq!(text_for(&json!("plain"), "en"), None);
    }
}
