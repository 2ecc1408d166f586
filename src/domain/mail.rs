//! Mail to the guest: what an address must be to be taken, the consent a
//! mail is asked with, the template it is written from, its `Message-ID`,
//! and when a mail that could not be sent is tried again.
//!
//! - **Addresses** ([`check_address`]): RFC 5321's limits (a local part
//!   of at most 64 octets, a domain of at most 255, a path of at most
//!   254), a dot-atom local part and a domain of labels, and never a CR or
//!   LF anywhere (a header injection is refused as such, not trimmed).
//! - **Consent** ([`notice_version`]): each mail records the version of
//!   the texts the guest was shown (the consent and the marketing opt-in),
//!   so the record says what was agreed to, and when.
//! - **Retries** ([`retry_after_ms`]): a temporary SMTP answer (4xx) or no
//!   answer is tried again after 30 s, 2 min, 10 min, 30 min, 1 h and 3 h
//!   (about 5 hours in all), then the mail has failed; a permanent answer
//!   (5xx) fails it at once.
//! - **Message-ID** ([`message_id`]): derived from the mail's row, so a
//!   mail sent again after a crash is the same message to the receiver.

use sha2::{Digest, Sha256};

use super::locale::Locale;
use super::markup::xml_text;

/// Where a mail is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MailStatus {
    /// Waiting to be sent (or being sent, under a lease).
    Queued,
    Sent,
    /// The server refused it for good, or every retry failed.
    Failed,
    /// The session was forgotten before it was sent.
    Canceled,
}

impl MailStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            MailStatus::Queued => "QUEUED",
            MailStatus::Sent => "SENT",
            MailStatus::Failed => "FAILED",
            MailStatus::Canceled => "CANCELED",
        }
    }
}

/// Why an address is not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("email must not contain a line break (CR or LF)")]
    LineBreak,
    #[error("email is empty")]
    Empty,
    #[error("email is longer than 254 characters")]
    TooLong,
    #[error("email's part before @ is longer than 64 characters")]
    LocalTooLong,
    #[error("email is not an address (name@example.com)")]
    NotAnAddress,
}

/// The longest path RFC 5321 allows (`<` and `>` taken off its 256).
pub const MAX_ADDRESS: usize = 254;
const MAX_LOCAL: usize = 64;
const MAX_DOMAIN: usize = 255;
const MAX_LABEL: usize = 63;

/// The address as it is kept (surrounding spaces taken off, the domain in
/// lower case), or why it is not one.
pub fn check_address(text: &str) -> Result<String, AddressError> {
    if text.contains(['\r', '\n']) {
        return Err(AddressError::LineBreak);
    }
    let text = text.trim();
    if text.is_empty() {
        return Err(AddressError::Empty);
    }
    if text.len() > MAX_ADDRESS {
        return Err(AddressError::TooLong);
    }
    let (local, domain) = text.rsplit_once('@').ok_or(AddressError::NotAnAddress)?;
    if local.len() > MAX_LOCAL {
        return Err(AddressError::LocalTooLong);
    }
    if !dot_atom(local) || !domain_name(domain) {
        return Err(AddressError::NotAnAddress);
    }
    Ok(format!("{local}@{}", domain.to_ascii_lowercase()))
}

/// RFC 5322's dot-atom: atext runs joined by single dots.
fn dot_atom(local: &str) -> bool {
    const SPECIALS: &str = "!#$%&'*+/=?^_`{|}~-";
    !local.is_empty()
        && local.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || SPECIALS.contains(c))
        })
}

/// A domain of at least two labels of letters, digits and inner hyphens.
fn domain_name(domain: &str) -> bool {
    let labels: Vec<&str> = domain.split('.').collect();
    domain.len() <= MAX_DOMAIN
        && labels.len() >= 2
        && labels.iter().all(|label| {
            (1..=MAX_LABEL).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
        && labels
            .last()
            .is_some_and(|tld| tld.chars().any(|c| c.is_ascii_alphabetic()))
}

/// The address as /ops shows it: its first character, an ellipsis, and the
/// domain (`g…@example.com`).
pub fn masked(address: &str) -> String {
    match address.split_once('@') {
        Some((local, domain)) => {
            let first: String = local.chars().take(1).collect();
            format!("{first}…@{domain}")
        }
        None => "…".to_owned(),
    }
}

/// The version of the consent texts a guest is shown: the first 16 hex
/// digits of a SHA-256 over the consent text and the marketing opt-in's,
/// as stored (JSON of locale to text; empty when built in or absent).
pub fn notice_version(consent: &str, marketing: &str) -> String {
    let mut digest = Sha256::new();
    digest.update(b"consent\n");
    digest.update(consent.as_bytes());
    digest.update(b"\nmarketing\n");
    digest.update(marketing.as_bytes());
    hex::encode(&digest.finalize()[..8])
}

/// The digest one address is counted by (HMAC-SHA256 with the server's
/// key, over the address in lower case): the same address gives the same
/// digest, and the digest gives the address back to no one without the
/// key.
pub fn address_key(key: &[u8], address: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let tag = ring::hmac::sign(&key, address.to_lowercase().as_bytes());
    hex::encode(&tag.as_ref()[..16])
}

/// A mail's `Message-ID`: its id at the sender's domain.
pub fn message_id(mail_id: &str, domain: &str) -> String {
    format!("<{mail_id}@{domain}>")
}

/// How long after its `attempts`-th failed attempt a mail is tried again;
/// None: it has failed for good.
pub fn retry_after_ms(attempts: i32) -> Option<i64> {
    const SCHEDULE_S: [i64; 6] = [30, 120, 600, 1_800, 3_600, 10_800];
    let index = usize::try_from(attempts.checked_sub(1)?).ok()?;
    SCHEDULE_S.get(index).map(|s| s * 1_000)
}

/// A mail's words: a subject and a plain-text body with `{event}` and
/// `{link}` in them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub subject: String,
    pub body: String,
}

/// The placeholders a template may hold.
pub const PLACEHOLDERS: [&str; 2] = ["{event}", "{link}"];

impl Template {
    /// The built-in template of `locale`.
    pub fn built_in(locale: Locale) -> Template {
        Template {
            subject: locale.text("mail.subject").into_owned(),
            body: locale.text("mail.body").into_owned(),
        }
    }

    /// An operator's template, or why it cannot be used.
    pub fn checked(subject: &str, body: &str) -> Result<Template, String> {
        let subject = subject.trim();
        if subject.contains(['\r', '\n']) {
            return Err("subject must be one line (no CR or LF)".into());
        }
        if !(1..=200).contains(&subject.chars().count()) {
            return Err("subject must be 1 to 200 characters".into());
        }
        let body = body.replace("\r\n", "\n");
        if !(1..=5_000).contains(&body.trim().chars().count()) {
            return Err("body must be 1 to 5000 characters".into());
        }
        if !body.contains("{link}") {
            return Err("body must hold {link}: the mail carries the result's link".into());
        }
        for text in [subject, body.as_str()] {
            if let Some(unknown) = unknown_placeholder(text) {
                return Err(format!(
                    "{unknown} is not a placeholder; a template may hold {}",
                    PLACEHOLDERS.join(" and ")
                ));
            }
        }
        Ok(Template {
            subject: subject.to_owned(),
            body,
        })
    }

    /// The subject and the body with the event's name and the link put
    /// in. A name with a line break in it is put on one line.
    pub fn render(&self, event: &str, link: &str) -> (String, String) {
        let event_line = event.replace(['\r', '\n'], " ");
        let fill = |text: &str| text.replace("{event}", &event_line).replace("{link}", link);
        (fill(&self.subject), fill(&self.body))
    }
}

/// The first `{word}` in `text` that is not a placeholder.
fn unknown_placeholder(text: &str) -> Option<String> {
    let mut rest = text;
    while let Some(start) = rest.find('{') {
        let after = &rest[start..];
        let Some(end) = after.find('}') else {
            return None;
        };
        let word = &after[..=end];
        let inner = &word[1..word.len() - 1];
        if !inner.is_empty()
            && inner.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !PLACEHOLDERS.contains(&word)
        {
            return Some(word.to_owned());
        }
        rest = &after[1..];
    }
    None
}

/// The HTML part of a mail: the picture (`cid:{image_cid}`, when there is
/// one), linked to the result, then the body's paragraphs (the link made
/// a link).
pub fn html_body(
    body: &str,
    link: &str,
    image_cid: Option<&str>,
    alt: &str,
    locale: Locale,
) -> String {
    let link_html = xml_text(link);
    let paragraphs: String = body
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let lines: Vec<String> = p
                .lines()
                .map(|line| {
                    xml_text(line).replace(
                        &link_html,
                        &format!("<a href=\"{link_html}\">{link_html}</a>"),
                    )
                })
                .collect();
            format!("<p>{}</p>", lines.join("<br>"))
        })
        .collect();
    let picture = image_cid
        .map(|cid| {
            format!(
                "<p><a href=\"{link_html}\"><img src=\"cid:{cid}\" alt=\"{alt}\" \
                 style=\"max-width:100%;height:auto;border-radius:8px\"></a></p>",
                cid = xml_text(cid),
                alt = xml_text(alt),
            )
        })
        .unwrap_or_default();
    format!(
        "<!doctype html><html lang=\"{lang}\"><head><meta charset=\"utf-8\"></head>\
         <body style=\"font-family:sans-serif;line-height:1.5\">{picture}{paragraphs}</body></html>",
        lang = locale.as_str(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_follow_rfc_5321_limits() {
        assert_eq!(
            check_address(" Guest.Name+booth@Example.COM ").unwrap(),
            "Guest.Name+booth@example.com"
        );
        let local64 = "a".repeat(64);
        assert!(check_address(&format!("{local64}@example.com")).is_ok());
        assert_eq!(
            check_address(&format!("a{local64}@example.com")),
            Err(AddressError::LocalTooLong)
        );
        let long = format!("{}@{}.com", "a".repeat(60), "b.".repeat(100));
        assert_eq!(check_address(&long), Err(AddressError::TooLong));
        for bad in [
            "plain",
            "@example.com",
            "a@",
            "a@localhost",
            "a..b@example.com",
            ".a@example.com",
            "a b@example.com",
            "a@-x.com",
            "a@x-.com",
            "a@exa mple.com",
            "a@example.123",
            "\"quoted\"@example.com",
            "a@b@example.com",
        ] {
            assert_eq!(check_address(bad), Err(AddressError::NotAnAddress), "{bad}");
        }
        assert_eq!(check_address("   "), Err(AddressError::Empty));
    }

    #[test]
    fn a_line_break_anywhere_is_refused_as_such() {
        for bad in [
            "a@example.com\r\nBcc: victim@example.org",
            "a@example.com\n",
            "\ra@example.com",
        ] {
            assert_eq!(check_address(bad), Err(AddressError::LineBreak));
        }
    }

    #[test]
    fn masked_keeps_the_first_character_and_the_domain() {
        assert_eq!(masked("guest@example.com"), "g…@example.com");
        assert_eq!(masked("x"), "…");
    }

    #[test]
    fn the_notice_version_changes_with_either_text() {
        let v = notice_version(r#"{"en":"a"}"#, "");
        assert_eq!(v.len(), 16);
        assert_eq!(v, notice_version(r#"{"en":"a"}"#, ""));
        assert_ne!(v, notice_version(r#"{"en":"b"}"#, ""));
        assert_ne!(v, notice_version(r#"{"en":"a"}"#, r#"{"en":"news"}"#));
    }

    #[test]
    fn retries_end_after_about_five_hours() {
        assert_eq!(retry_after_ms(0), None);
        assert_eq!(retry_after_ms(1), Some(30_000));
        let total: i64 = (1..=6).map(|n| retry_after_ms(n).unwrap()).sum();
        assert!((4 * 3_600_000..=6 * 3_600_000).contains(&total), "{total}");
        assert_eq!(retry_after_ms(7), None);
    }

    #[test]
    fn templates_are_checked_and_rendered() {
        for locale in Locale::ALL {
            let t = Template::built_in(locale);
            assert!(Template::checked(&t.subject, &t.body).is_ok(), "{locale:?}");
        }
        assert!(Template::checked("Hi\r\nBcc: x", "{link}").is_err());
        assert!(Template::checked("Hi", "no link").is_err());
        assert!(Template::checked("Hi {name}", "{link}")
            .unwrap_err()
            .contains("{name}"));
        let t = Template::checked("From {event}", "See {link}\n\n{ not a placeholder }").unwrap();
        let (subject, body) = t.render("Show\r\nBcc: x", "https://e.example/r/1");
        assert_eq!(subject, "From Show  Bcc: x");
        assert!(body.starts_with("See https://e.example/r/1"));
    }

    #[test]
    fn the_html_part_escapes_and_links() {
        let html = html_body(
            "Hi <b>\n\nSee https://e.example/r/1?a=1&b=2",
            "https://e.example/r/1?a=1&b=2",
            Some("result"),
            "Your picture",
            Locale::Ko,
        );
        assert!(html.contains("lang=\"ko\""));
        assert!(html.contains("Hi &lt;b&gt;"));
        assert!(html.contains("<a href=\"https://e.example/r/1?a=1&amp;b=2\">"));
        assert!(html.contains("src=\"cid:result\""));
        let bare = html_body("See {link}", "https://e.example/r/1", None, "x", Locale::En);
        assert!(!bare.contains("<img"));
    }
}
