//! The slot ledger's rule, pure: an AI slot is a row of the ledger (one per
//! call that may have a job at a provider), and a row goes only on
//! [`Evidence`] that no job runs in it. Nothing else frees a slot: not a
//! saga's end, a lease running out, a deadline or a crash. Who may delete
//! a row names the evidence; the store's functions that delete take one.
//!
//! [`evidence_of_refusal`] decides, where a submit was answered with a
//! failure, whether that answer proves that no job exists under the key:
//! a refusal of a key that an earlier, unclear submit may have used proves
//! nothing unless the provider looked at the request and refused it (a
//! 4xx: it would have returned the job it had under that key).

use super::failure::AiFailure;

/// Why a ledger row may go: no job runs in its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// The provider reported the job final (succeeded, failed, rejected,
    /// cancelled).
    JobFinal,
    /// A cancel was confirmed: the job is final now.
    CancelConfirmed,
    /// The submit was refused and created nothing (see
    /// [`evidence_of_refusal`]).
    SubmitRefused,
    /// No submit was ever sent under the row (a reservation given back).
    NeverSubmitted,
    /// The provider ends every job of a key by a deadline of its own, and
    /// that deadline has passed since the last send could have been made
    /// (Replicate's `Cancel-After`; an OpenAI call is over with its
    /// request). Not finding a job is never evidence by itself.
    ProviderDeadline,
}

impl Evidence {
    pub fn as_str(self) -> &'static str {
        match self {
            Evidence::JobFinal => "job_final",
            Evidence::CancelConfirmed => "cancel_confirmed",
            Evidence::SubmitRefused => "submit_refused",
            Evidence::NeverSubmitted => "never_submitted",
            Evidence::ProviderDeadline => "provider_deadline",
        }
    }
}

/// Whether a submit answered with `failure` proves that no job exists under
/// its key, given whether an earlier submit with the same key had an
/// unclear outcome (`unclear_before`). A refusal that made nothing
/// (unavailable, throttled) says nothing of the earlier submit; a request
/// the provider examined and refused (any 4xx, moderation) does, since the
/// provider answers a key it knows with its job.
pub fn evidence_of_refusal(failure: &AiFailure, unclear_before: bool) -> Option<Evidence> {
    match failure {
        AiFailure::Unclear(_) | AiFailure::Timeout => None,
        AiFailure::Unavailable(_) | AiFailure::Throttled { .. } | AiFailure::OutOfQuota(_) => {
            (!unclear_before).then_some(Evidence::SubmitRefused)
        }
        AiFailure::RequestRejected(_) | AiFailure::ContentRejected(_) => {
            Some(Evidence::SubmitRefused)
        }
        // A job that ended failed: final.
        AiFailure::JobFailed(_) => Some(Evidence::JobFinal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_after_an_unclear_submit_proves_nothing_unless_the_provider_examined_it() {
        let unavailable = AiFailure::Unavailable("503".into());
        let throttled = AiFailure::Throttled {
            retry_after_ms: 1_000,
            detail: "429".into(),
        };
        assert_eq!(
            evidence_of_refusal(&unavailable, false),
            Some(Evidence::SubmitRefused)
        );
        assert_eq!(evidence_of_refusal(&unavailable, true), None);
        assert_eq!(evidence_of_refusal(&throttled, true), None);
        assert_eq!(
            evidence_of_refusal(&AiFailure::RequestRejected("400".into()), true),
            Some(Evidence::SubmitRefused)
        );
        assert_eq!(
            evidence_of_refusal(&AiFailure::Unclear("dropped".into()), false),
            None
        );
        assert_eq!(evidence_of_refusal(&AiFailure::Timeout, false), None);
        assert_eq!(
            evidence_of_refusal(&AiFailure::JobFailed("boom".into()), true),
            Some(Evidence::JobFinal)
        );
    }
}
