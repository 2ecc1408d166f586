//! The operators' review before the public screen: an experience's review
//! settings, and the rules of the two decisions. Approve and reject are
//! fenced on the saga being IN_REVIEW with no decision taken; asked again,
//! the same decision is success and the other one a conflict.

use std::fmt;
use std::str::FromStr;

use super::saga::{AbortReason, Step, UnknownValue};

/// Whether an experience's AI results wait for a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReviewMode {
    /// Results go to the screen as they come (the default).
    #[default]
    Off,
    /// Each result enters IN_REVIEW and is shown only once approved.
    BeforeDisplay,
}

impl ReviewMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewMode::Off => "off",
            ReviewMode::BeforeDisplay => "before_display",
        }
    }
}

impl FromStr for ReviewMode {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [ReviewMode::Off, ReviewMode::BeforeDisplay]
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownValue(s.to_owned()))
    }
}

/// An operator's decision on a result in review (also what the review
/// timeout does by itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    Approve,
    Reject,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::Reject => "reject",
        }
    }

    /// What `sagas.review_decision` records for an approval.
    pub const APPROVED: &'static str = "APPROVED";
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Decision {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Decision::Approve, Decision::Reject]
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| UnknownValue(s.to_owned()))
    }
}

/// What a saga's row says about its review, read after a decision's fenced
/// write touched no row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReviewRow<'a> {
    pub step: Step,
    /// `sagas.review_decision`.
    pub decision: Option<&'a str>,
    pub abort_reason: Option<&'a str>,
}

/// Why a decision could not apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecisionRefused {
    /// The other decision was taken first.
    #[error("the result was already {0}")]
    Decided(&'static str),
    /// The saga is not waiting for review (it never entered review, or it
    /// ended another way).
    #[error("the saga is not in review (it is {0})")]
    NotInReview(Step),
}

/// Judges a decision whose fenced write touched no row (the saga was not
/// IN_REVIEW without a decision): the same decision taken before is
/// success, anything else is refused.
pub fn judge_decision(decision: Decision, row: ReviewRow<'_>) -> Result<(), DecisionRefused> {
    let approved = row.decision == Some(Decision::APPROVED);
    let rejected = row.step == Step::Aborted
        && row.abort_reason == Some(AbortReason::ReviewRejected.as_str());
    match decision {
        Decision::Approve if approved => Ok(()),
        Decision::Reject if rejected => Ok(()),
        Decision::Approve if rejected => Err(DecisionRefused::Decided("rejected")),
        Decision::Reject if approved => Err(DecisionRefused::Decided("approved")),
        _ => Err(DecisionRefused::NotInReview(row.step)),
    }
}

/// Whether an item that entered review at `since` has waited out
/// `timeout_ms` at `now`.
pub fn timed_out(since: i64, timeout_ms: Option<i64>, now: i64) -> bool {
    timeout_ms.is_some_and(|t| now >= since.saturating_add(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: Step, decision: Option<&'static str>, reason: Option<AbortReason>) -> ReviewRow<'static> {
        ReviewRow {
            step,
            decision,
            abort_reason: reason.map(AbortReason::as_str),
        }
    }

    #[test]
    fn the_same_decision_again_is_success() {
        let approved = row(Step::RankingDone, Some(Decision::APPROVED), None);
        assert_eq!(judge_decision(Decision::Approve, approved), Ok(()));
        let completed = row(Step::Completed, Some(Decision::APPROVED), None);
        assert_eq!(judge_decision(Decision::Approve, completed), Ok(()));
        let rejected = row(Step::Aborted, None, Some(AbortReason::ReviewRejected));
        assert_eq!(judge_decision(Decision::Reject, rejected), Ok(()));
    }

    #[test]
    fn the_other_decision_after_one_is_refused() {
        let approved = row(Step::Completed, Some(Decision::APPROVED), None);
        assert_eq!(
            judge_decision(Decision::Reject, approved),
            Err(DecisionRefused::Decided("approved"))
        );
        let rejected = row(Step::Aborted, None, Some(AbortReason::ReviewRejected));
        assert_eq!(
            judge_decision(Decision::Approve, rejected),
            Err(DecisionRefused::Decided("rejected"))
        );
    }

    #[test]
    fn a_saga_that_never_waited_for_review_is_not_in_review() {
        for step in [Step::AiPending, Step::AiDone, Step::Completed] {
            for decision in [Decision::Approve, Decision::Reject] {
                assert_eq!(
                    judge_decision(decision, row(step, None, None)),
                    Err(DecisionRefused::NotInReview(step))
                );
            }
        }
        // Cancelled while in review: neither decision applies any more.
        let cancelled = row(Step::Aborted, None, Some(AbortReason::Cancelled));
        assert_eq!(
            judge_decision(Decision::Approve, cancelled),
            Err(DecisionRefused::NotInReview(Step::Aborted))
        );
    }

    #[test]
    fn the_timeout_counts_from_entering_review() {
        assert!(!timed_out(1_000, None, i64::MAX));
        assert!(!timed_out(1_000, Some(500), 1_499));
        assert!(timed_out(1_000, Some(500), 1_500));
    }

    #[test]
    fn names_round_trip() {
        for m in [ReviewMode::Off, ReviewMode::BeforeDisplay] {
            assert_eq!(m.as_str().parse::<ReviewMode>(), Ok(m));
        }
        for d in [Decision::Approve, Decision::Reject] {
            assert_eq!(d.as_str().parse::<Decision>(), Ok(d));
        }
        assert!("maybe".parse::<Decision>().is_err());
    }
}
