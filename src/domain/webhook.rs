//! Webhooks: the events an organiser's endpoint may take, the Standard
//! Webhooks 1.0 signature of a delivery, and when a delivery that failed
//! is tried again.
//!
//! - **Signature.** `webhook-signature: v1,<base64 of HMAC-SHA256 over
//!   "{webhook-id}.{webhook-timestamp}.{body}">`, keyed with the base64
//!   part of the endpoint's `whsec_…` secret ([`signature`]).
//! - **Retries.** A delivery that failed is tried again after 5 s, 5 min,
//!   30 min, 2 h, 5 h, 10 h and 10 h (Standard Webhooks' own schedule:
//!   about 28 hours in all), then it has failed ([`retry_after_ms`]).

use base64::Engine as _;
use ring::hmac;

/// An event an endpoint may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WebhookEvent {
    /// A guest's result is ready.
    SessionCompleted,
    /// The AI refused the guest's input.
    SessionRejected,
    /// A result was erased or hidden.
    SessionRemoved,
    /// A print reached the paper.
    PrintCompleted,
    /// A mail was sent.
    EmailSent,
    /// A mail could not be sent.
    EmailFailed,
}

impl WebhookEvent {
    pub const ALL: [WebhookEvent; 6] = [
        WebhookEvent::SessionCompleted,
        WebhookEvent::SessionRejected,
        WebhookEvent::SessionRemoved,
        WebhookEvent::PrintCompleted,
        WebhookEvent::EmailSent,
        WebhookEvent::EmailFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WebhookEvent::SessionCompleted => "session.completed",
            WebhookEvent::SessionRejected => "session.rejected",
            WebhookEvent::SessionRemoved => "session.removed",
            WebhookEvent::PrintCompleted => "print.completed",
            WebhookEvent::EmailSent => "email.sent",
            WebhookEvent::EmailFailed => "email.failed",
        }
    }

    pub fn parse(text: &str) -> Option<WebhookEvent> {
        WebhookEvent::ALL.into_iter().find(|e| e.as_str() == text)
    }
}

/// The prefix of an endpoint's secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// A new endpoint secret from 24 random bytes: `whsec_` and their base64.
pub fn new_secret(random: &[u8; 24]) -> String {
    format!(
        "{SECRET_PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(random)
    )
}

/// The HMAC key of a `whsec_…` secret (its base64 part decoded); None when
/// it is not one.
pub fn secret_key(secret: &str) -> Option<Vec<u8>> {
    let encoded = secret.strip_prefix(SECRET_PREFIX)?;
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
        .filter(|key| !key.is_empty())
}

/// The `webhook-signature` header of one attempt: `v1,` and the base64
/// HMAC-SHA256 of `{id}.{timestamp}.{body}` with `key`.
pub fn signature(key: &[u8], id: &str, timestamp_s: i64, body: &str) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    let signed = format!("{id}.{timestamp_s}.{body}");
    let tag = hmac::sign(&key, signed.as_bytes());
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(tag.as_ref())
    )
}

/// How long after its `attempts`-th failed attempt a delivery is tried
/// again; None: it has failed for good.
pub fn retry_after_ms(attempts: i32) -> Option<i64> {
    const SCHEDULE_S: [i64; 7] = [5, 300, 1_800, 7_200, 18_000, 36_000, 36_000];
    let index = usize::try_from(attempts.checked_sub(1)?).ok()?;
    SCHEDULE_S.get(index).map(|s| s * 1_000)
}

/// Whether an answer's status means the endpoint took the delivery.
pub fn delivered(status: u16) -> bool {
    (200..300).contains(&status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_back() {
        for event in WebhookEvent::ALL {
            assert_eq!(WebhookEvent::parse(event.as_str()), Some(event));
        }
        assert_eq!(WebhookEvent::parse("session.started"), None);
    }

    /// The example of the Standard Webhooks specification: its secret, id,
    /// timestamp and body give its signature.
    #[test]
    fn the_specification_example_signs_the_same() {
        let key = secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            signature(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn a_secret_round_trips() {
        let secret = new_secret(&[7; 24]);
        assert!(secret.starts_with("whsec_"));
        assert_eq!(secret_key(&secret), Some(vec![7; 24]));
        assert_eq!(secret_key("nope"), None);
        assert_eq!(secret_key("whsec_"), None);
    }

    #[test]
    fn retries_spread_over_about_a_day_then_stop() {
        assert_eq!(retry_after_ms(0), None);
        assert_eq!(retry_after_ms(1), Some(5_000));
        let total: i64 = (1..=7).map(|n| retry_after_ms(n).unwrap()).sum();
        assert!(
            (24 * 3_600_000..=30 * 3_600_000).contains(&total),
            "{total}"
        );
        assert_eq!(retry_after_ms(8), None);
    }
}
