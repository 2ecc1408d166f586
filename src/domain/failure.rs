//! Failure kinds: every outside error of the AI provider is translated into one
//! of these (in `crate::ai::client`), and the retry policy decides from the kind
//! alone what happens to the saga (DESIGN.md rule 6).

use serde::{Deserialize, Serialize};

/// What went wrong with one AI call, in the project's own words.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AiFailure {
    /// Connect error, 5xx or 429: the provider is not there right now and
    /// made no job. Not an attempt; the saga waits with backoff.
    #[error("AI provider unavailable: {0}")]
    Unavailable(String),
    /// The request may have reached the provider but its outcome is unknown:
    /// the connection dropped after the request was sent, no answer came in
    /// time, or a 2xx answer could not be read (rule 6). A kind of
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
    /// Unavailable, unclear or throttled: not an attempt, retried with the
    /// same key.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            AiFailure::Unavailable(_) | AiFailure::Unclear(_) | AiFailure::Throttled { .. }
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
}

/// A successful AI result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct AiResult {
    #[serde(default)]
    pub content: Vec<ContentItem>,
    #[serde(default)]
    pub score: Option<f64>,
}
