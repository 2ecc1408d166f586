//! Failure kinds: every outside error of the AI provider is translated into one
//! of these (in `crate::ai::client`), and the retry policy decides from the kind
//! alone what happens to the saga (DESIGN.md rule 6). And what a provider's
//! success is made of ([`AiResult`], [`ContentItem`]), with the one rule of
//! which result URLs the pages may show ([`ContentItem::url_is_shown`]).

use serde::{Deserialize, Serialize};

/// What went wrong with one AI call, in the project's own words.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AiFailure {
    /// Connect error, 5xx or 429: the provider is not there right now and
    /// made no job (a 500, 502 or 503 to a create is `Unclear`: the
    /// server had the request). Not an attempt; the saga waits with
    /// backoff.
    #[error("AI provider unavailable: {0}")]
    Unavailable(String),
    /// The request may have reached the provider but its outcome is unknown:
    /// the connection dropped after the request was sent, no answer came in
    /// time, a 2xx answer could not be read, or a create was answered 500,
    /// 502 or 503 (rule 6). A kind of
    /// unavailability: not an attempt, and the retry reuses the same key,
    /// which returns the job if the provider made one. Since that job may be
    /// running, the saga keeps its AI slot meanwhile (rule 10).
    #[error("AI provider outcome unclear: {0}")]
    Unclear(String),
    /// The provider (429 with `Retry-After`) or our own request rate limit
    /// says when to ask again. Like `Unavailable` (no job was made, not an
    /// attempt), but the next try waits at least `retry_after_ms`. Not an
    /// outage: the circuit breaker does not count it.
    #[error("AI provider asks to wait {retry_after_ms} ms: {detail}")]
    Throttled { retry_after_ms: i64, detail: String },
    /// The provider says the account is out of quota or credit (OpenAI's
    /// `insufficient_quota`, Replicate's 402): every request fails until
    /// someone changes the account, so asking again soon cannot help. Not
    /// an attempt and no job was made; the provider's breaker opens with
    /// this as its reason, and the saga waits with its place kept.
    #[error("AI account out of quota: {0}")]
    OutOfQuota(String),
    /// Any other 4xx on submit: our request was refused. Counts as an attempt.
    #[error("AI provider refused the request: {0}")]
    RequestRejected(String),
    /// Moderation refused the participant's input (422 `content_rejected` on
    /// submit, or a job that ends `rejected`). Aborts at once.
    #[error("input rejected by moderation: {0}")]
    ContentRejected(String),
    /// The job ended `failed`. Counts as an attempt.
    #[error("AI job failed: {0}")]
    JobFailed(String),
    /// One attempt took longer than `AI_TIMEOUT` from submit to a final status.
    /// Counts as an attempt.
    #[error("AI job did not finish within the attempt timeout")]
    Timeout,
}

impl AiFailure {
    /// Unavailable, unclear, throttled or out of quota: not an attempt,
    /// retried with the same key.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            AiFailure::Unavailable(_)
                | AiFailure::Unclear(_)
                | AiFailure::Throttled { .. }
                | AiFailure::OutOfQuota(_)
        )
    }

    /// The least wait the provider asked for, if any.
    pub fn retry_after_ms(&self) -> Option<i64> {
        match self {
            AiFailure::Throttled { retry_after_ms, .. } => Some(*retry_after_ms),
            _ => None,
        }
    }
}

/// One piece of generated content, as the provider returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentItem {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A display-size rendition of a kept image (`/media/….t.jpg`): what
    /// the booth displays and the ranking show; the phone gets `url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thumb_url: Option<String>,
    /// The kept original (`/media/….png`) when the event's brand drew a
    /// branded rendition: `url`, `thumb_url` and `print_url` then show
    /// the branded one where the brand applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_url: Option<String>,
    /// The branded rendition a print station prints, when the brand
    /// applies to print (otherwise the print takes `original_url`, or
    /// `url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub print_url: Option<String>,
}

/// The item kinds the pages show as media (an `<img>`, `<video>` or
/// `<audio>`, never a link): only they may carry a `data:` URL.
const MEDIA_KINDS: [&str; 4] = ["image", "video", "audio", "music"];

impl ContentItem {
    /// Whether `url` may be shown as this item: the pages make it an
    /// `<img>`/`<video>`/`<audio>` source or a link, so only
    /// `https://` and `http://` URLs, this server's own paths (`/…`, not
    /// `//…`), and for a media item a `data:` URL of image, video or audio
    /// (an adapter's inline picture). No `javascript:`, no other scheme, no
    /// control character or backslash a browser would read past.
    pub fn url_is_shown(&self, url: &str) -> bool {
        if url
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || c == '\\')
        {
            return false;
        }
        let lower = url.get(..11).unwrap_or(url).to_ascii_lowercase();
        if lower.starts_with("https://") || lower.starts_with("http://") {
            return true;
        }
        if let Some(path) = url.strip_prefix('/') {
            return !path.starts_with('/');
        }
        let media = ["data:image/", "data:video/", "data:audio/"];
        media.iter().any(|m| lower.starts_with(m)) && MEDIA_KINDS.contains(&self.kind.as_str())
    }
}

/// A successful AI result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct AiResult {
    #[serde(default)]
    pub content: Vec<ContentItem>,
    #[serde(default)]
    pub score: Option<f64>,
}

impl AiResult {
    /// Leaves out every URL [`ContentItem::url_is_shown`] refuses (after
    /// trimming the spaces around it) and then every item left with
    /// neither URL nor text; the rest of the result stands. Each adapter
    /// calls this where it turns the provider's answer into a result, so
    /// no such URL is stored, sent to a display or shown on /ops. The URLs
    /// left out, for the log.
    pub fn leave_out_unshown_urls(&mut self) -> Vec<String> {
        let mut left_out = Vec::new();
        for item in &mut self.content {
            let Some(url) = item.url.take() else {
                continue;
            };
            let trimmed = url.trim();
            if item.url_is_shown(trimmed) {
                item.url = Some(trimmed.to_owned());
            } else {
                left_out.push(url);
            }
        }
        self.content
            .retain(|item| item.url.is_some() || item.text.is_some());
        left_out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(kind: &str) -> ContentItem {
        ContentItem {
            thumb_url: None,
            original_url: None,
            print_url: None,
            kind: kind.into(),
            url: None,
            text: None,
        }
    }

    #[test]
    fn shown_urls_are_http_own_paths_and_media_data() {
        let image = item("image");
        for shown in [
            "https://cdn.example/a.png",
            "HTTP://127.0.0.1:9/v1/jobs/j/image.svg",
            "/media/a.png",
            "/",
            "data:image/png;base64,QUJD",
            "DATA:image/svg+xml,<svg/>",
        ] {
            assert!(image.url_is_shown(shown), "{shown}");
        }
        for refused in [
            "javascript:alert(1)",
            "JavaScript:alert(1)",
            " javascript:alert(1)",
            "java\tscript:alert(1)",
            "jav&#x09;ascript:alert(1)",
            "vbscript:x",
            "data:text/html,<script>alert(1)</script>",
            "data:application/javascript,alert(1)",
            "//evil.example/a.png",
            "/\\evil.example/a.png",
            "https://x/\nhttps://y",
            "file:///etc/passwd",
            "blob:https://x/1",
            "a.png",
            "",
        ] {
            assert!(!image.url_is_shown(refused), "{refused:?}");
        }
        assert!(
            !item("link").url_is_shown("data:image/png;base64,QUJD"),
            "a data: URL is never a link"
        );
        assert!(item("music").url_is_shown("data:audio/mpeg;base64,QUJD"));
    }

    #[test]
    fn unshown_urls_are_left_out_and_empty_items_dropped() {
        let mut result = AiResult {
            content: vec![
                ContentItem {
                    url: Some("javascript:alert(1)".into()),
                    text: Some("words".into()),
                    ..item("link")
                },
                ContentItem {
                    url: Some("javascript:alert(2)".into()),
                    ..item("image")
                },
                ContentItem {
                    url: Some("  https://cdn.example/a.png ".into()),
                    ..item("image")
                },
                ContentItem {
                    text: Some("only words".into()),
                    ..item("text")
                },
            ],
            score: Some(3.0),
        };
        assert_eq!(
            result.leave_out_unshown_urls(),
            ["javascript:alert(1)", "javascript:alert(2)"]
        );
        assert_eq!(
            result.content,
            [
                ContentItem {
                    text: Some("words".into()),
                    ..item("link")
                },
                ContentItem {
                    url: Some("https://cdn.example/a.png".into()),
                    ..item("image")
                },
                ContentItem {
                    text: Some("only words".into()),
                    ..item("text")
                },
            ]
        );
        assert_eq!(result.score, Some(3.0));
    }
}
