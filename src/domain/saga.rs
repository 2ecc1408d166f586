//! The saga state machine: steps, the one-way transitions between them, the
//! abort reasons with their human messages, and the judgement of a fenced
//! write that touched no row (rules 2, 3 and 7 of DESIGN.md).

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::locale::Locale;

/// Where a saga stands. Steps only move forward:
/// `AI_PENDING -> AI_DONE [-> IN_REVIEW] -> RANKING_DONE -> COMPLETED`, and
/// `ABORTED` from any non-final step. `IN_REVIEW` is taken only when the
/// experience has its results reviewed before the public screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Step {
    AiPending,
    AiDone,
    /// Waits for an operator's approve or reject, holding no lease and no
    /// AI slot.
    InReview,
    RankingDone,
    Completed,
    Aborted,
}

impl Step {
    pub const ALL: [Step; 6] = [
        Step::AiPending,
        Step::AiDone,
        Step::InReview,
        Step::RankingDone,
        Step::Completed,
        Step::Aborted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Step::AiPending => "AI_PENDING",
            Step::AiDone => "AI_DONE",
            Step::InReview => "IN_REVIEW",
            Step::RankingDone => "RANKING_DONE",
            Step::Completed => "COMPLETED",
            Step::Aborted => "ABORTED",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, Step::Completed | Step::Aborted)
    }

    /// The step that follows this one on the happy path.
    pub fn next(self) -> Option<Step> {
        match self {
            Step::AiPending => Some(Step::AiDone),
            Step::AiDone | Step::InReview => Some(Step::RankingDone),
            Step::RankingDone => Some(Step::Completed),
            Step::Completed | Step::Aborted => None,
        }
    }

    /// Whether `from -> to` is a legal move.
    pub fn can_move(from: Step, to: Step) -> bool {
        (to == Step::Aborted && !from.is_final())
            || from.next() == Some(to)
            || (from, to) == (Step::AiDone, Step::InReview)
    }

    /// The steps a worker claims and holds a lease on. (IN_REVIEW is not
    /// one: it waits for a person, and an approved saga is adopted from it
    /// by the review actor.)
    pub fn runnable() -> [Step; 3] {
        [Step::AiPending, Step::AiDone, Step::RankingDone]
    }

    /// The non-final steps: those an abort may end.
    pub fn unfinished() -> [Step; 4] {
        [
            Step::AiPending,
            Step::AiDone,
            Step::InReview,
            Step::RankingDone,
        ]
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown value {0:?}")]
pub struct UnknownValue(pub String);

impl FromStr for Step {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Step::ALL
            .into_iter()
            .find(|step| step.as_str() == s)
            .ok_or_else(|| UnknownValue(s.to_owned()))
    }
}

/// How the detail of an `AI_FAILED` abort starts when the provider's
/// account was out of quota or credit ([`AbortReason::message_for`]).
pub const OUT_OF_CREDIT: &str = "the AI account is out of quota or credit";

/// Why a saga ended ABORTED (rule 7). Each has a message a booth display can
/// show as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AbortReason {
    InputRejected,
    AiFailed,
    AiTimeout,
    RankingFailed,
    PersistFailed,
    Orphaned,
    Cancelled,
    /// An operator (or the review timeout) rejected the AI result before
    /// the public screen showed it.
    ReviewRejected,
    /// The photo the submission named was gone from the media store when
    /// the saga needed it: a permanent failure, no retry and no AI job.
    InputMissing,
}

impl AbortReason {
    pub const ALL: [AbortReason; 9] = [
        AbortReason::InputRejected,
        AbortReason::AiFailed,
        AbortReason::AiTimeout,
        AbortReason::RankingFailed,
        AbortReason::PersistFailed,
        AbortReason::Orphaned,
        AbortReason::Cancelled,
        AbortReason::ReviewRejected,
        AbortReason::InputMissing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AbortReason::InputRejected => "INPUT_REJECTED",
            AbortReason::AiFailed => "AI_FAILED",
            AbortReason::AiTimeout => "AI_TIMEOUT",
            AbortReason::RankingFailed => "RANKING_FAILED",
            AbortReason::PersistFailed => "PERSIST_FAILED",
            AbortReason::Orphaned => "ORPHANED",
            AbortReason::Cancelled => "CANCELLED",
            AbortReason::ReviewRejected => "REVIEW_REJECTED",
            AbortReason::InputMissing => "INPUT_MISSING",
        }
    }

    /// The message a booth display and the participant see, in `locale`.
    pub fn human_message(self, locale: Locale) -> Cow<'static, str> {
        locale.text(&format!("abort.{}", self.as_str()))
    }

    /// The message of an abort with its recorded `detail`: an `AI_FAILED`
    /// because the provider's account ran out of quota says so (the guest
    /// learns that staff must act, not that the AI is slow); every other
    /// abort has its reason's message.
    pub fn message_for(self, detail: Option<&str>, locale: Locale) -> Cow<'static, str> {
        match detail {
            Some(detail) if self == AbortReason::AiFailed && detail.starts_with(OUT_OF_CREDIT) => {
                locale.text("abort.AI_FAILED.out_of_credit")
            }
            _ => self.human_message(locale),
        }
    }

    /// The terminal event type this reason is announced with.
    pub fn event_type(self) -> &'static str {
        match self {
            AbortReason::InputRejected => "session.rejected",
            _ => "session.aborted",
        }
    }
}

impl fmt::Display for AbortReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AbortReason {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AbortReason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownValue(s.to_owned()))
    }
}

/// Why a fenced write was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// Another worker holds the saga now (or it ended): stop quietly.
    #[error("lease lost: another worker owns this saga or it has ended")]
    LeaseLost,
    /// The step was reached already, but with other data: a real bug or a
    /// provider that answered differently; reported, never overwritten.
    #[error("conflicting transition to {step}: {detail}")]
    Conflict { step: Step, detail: String },
    /// The move is not one of the legal ones.
    #[error("illegal transition {from} -> {to}")]
    Illegal { from: Step, to: Step },
}

/// What a fenced write found when it touched no row, seen from the row as it
/// is now.
#[derive(Debug, Clone, PartialEq)]
pub struct RowNow<'a, D: PartialEq> {
    pub step: Step,
    pub lock_token: Option<&'a str>,
    /// The data the row holds for `step` (e.g. the AI content for AI_DONE).
    pub data: &'a D,
}

/// Rule 3: a fenced transition `expected -> target` with `data` touched no
/// row. Decide whether that is success (the step was already reached with the
/// same data under our token), a lost lease, or a conflict.
pub fn judge_unapplied<D: PartialEq + fmt::Debug>(
    expected: Step,
    target: Step,
    token: &str,
    data: &D,
    now: RowNow<'_, D>,
) -> Result<(), TransitionError> {
    if !Step::can_move(expected, target) {
        return Err(TransitionError::Illegal {
            from: expected,
            to: target,
        });
    }
    // Not ours any more, or ended by someone else (the cleanup actor): the
    // worker stops quietly.
    if now.lock_token != Some(token) || (now.step.is_final() && now.step != target) {
        return Err(TransitionError::LeaseLost);
    }
    if now.step != target {
        return Err(TransitionError::Conflict {
            step: target,
            detail: format!("saga is at {} where {} was expected", now.step, expected),
        });
    }
    if now.data == data {
        Ok(())
    } else {
        Err(TransitionError::Conflict {
            step: target,
            detail: format!("recorded {:?}, offered {:?}", now.data, data),
        })
    }
}

/// Where an operator's retry of a saga resumes: an ABORTED saga goes back
/// to the step it stood at when it aborted (so the AI result and the ranking
/// entry it had are kept), or to AI_PENDING when that was not recorded (a
/// saga aborted before the step was kept). Any other saga is refused.
pub fn retry_from(step: Step, aborted_at: Option<Step>) -> Result<Step, TransitionError> {
    match (step, aborted_at) {
        (Step::Aborted, Some(at)) if !at.is_final() => Ok(at),
        (Step::Aborted, _) => Ok(Step::AiPending),
        (other, _) => Err(TransitionError::Conflict {
            step: Step::AiPending,
            detail: format!("only an ABORTED saga can be retried; this one is {other}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_resumes_where_the_saga_aborted() {
        assert_eq!(
            retry_from(Step::Aborted, Some(Step::AiDone)),
            Ok(Step::AiDone)
        );
        assert_eq!(
            retry_from(Step::Aborted, Some(Step::RankingDone)),
            Ok(Step::RankingDone)
        );
        assert_eq!(retry_from(Step::Aborted, None), Ok(Step::AiPending));
        for step in [
            Step::AiPending,
            Step::AiDone,
            Step::RankingDone,
            Step::Completed,
        ] {
            assert!(
                matches!(
                    retry_from(step, None),
                    Err(TransitionError::Conflict { .. })
                ),
                "{step} must not be retried"
            );
        }
    }

    #[test]
    fn steps_only_move_forward_or_abort() {
        use Step::*;
        let legal = [
            (AiPending, AiDone),
            (AiDone, RankingDone),
            (AiDone, InReview),
            (InReview, RankingDone),
            (RankingDone, Completed),
            (AiPending, Aborted),
            (AiDone, Aborted),
            (InReview, Aborted),
            (RankingDone, Aborted),
        ];
        for from in Step::ALL {
            for to in Step::ALL {
                assert_eq!(
                    Step::can_move(from, to),
                    legal.contains(&(from, to)),
                    "{from} -> {to}"
                );
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for s in Step::ALL {
            assert_eq!(s.as_str().parse::<Step>(), Ok(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for r in AbortReason::ALL {
            assert_eq!(r.as_str().parse::<AbortReason>(), Ok(r));
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
        assert!("NOPE".parse::<Step>().is_err());
    }

    #[test]
    fn only_input_rejected_is_a_rejection_event() {
        for r in AbortReason::ALL {
            let expected = if r == AbortReason::InputRejected {
                "session.rejected"
            } else {
                "session.aborted"
            };
            assert_eq!(r.event_type(), expected);
        }
        assert!(AbortReason::InputRejected
            .human_message(Locale::En)
            .starts_with("blocked: inappropriate input"));
    }

    fn row<'a>(step: Step, token: Option<&'a str>, data: &'a i32) -> RowNow<'a, i32> {
        RowNow {
            step,
            lock_token: token,
            data,
        }
    }

    #[test]
    fn same_step_same_data_same_token_is_success() {
        let r = judge_unapplied(
            Step::AiPending,
            Step::AiDone,
            "t1",
            &7,
            row(Step::AiDone, Some("t1"), &7),
        );
        assert_eq!(r, Ok(()));
    }

    #[test]
    fn same_step_other_data_is_conflict() {
        let r = judge_unapplied(
            Step::AiPending,
            Step::AiDone,
            "t1",
            &7,
            row(Step::AiDone, Some("t1"), &8),
        );
        assert!(matches!(
            r,
            Err(TransitionError::Conflict {
                step: Step::AiDone,
                ..
            })
        ));
    }

    #[test]
    fn other_token_is_lease_lost_even_if_step_reached() {
        let r = judge_unapplied(
            Step::AiPending,
            Step::AiDone,
            "old",
            &7,
            row(Step::AiDone, Some("new"), &7),
        );
        assert_eq!(r, Err(TransitionError::LeaseLost));
        let r = judge_unapplied(
            Step::AiPending,
            Step::AiDone,
            "old",
            &7,
            row(Step::Aborted, None, &7),
        );
        assert_eq!(r, Err(TransitionError::LeaseLost));
    }

    #[test]
    fn a_saga_ended_by_someone_else_is_lease_lost() {
        let r = judge_unapplied(
            Step::AiPending,
            Step::AiDone,
            "t",
            &1,
            row(Step::Aborted, Some("t"), &1),
        );
        assert_eq!(r, Err(TransitionError::LeaseLost));
    }

    #[test]
    fn our_token_but_step_elsewhere_is_conflict() {
        let r = judge_unapplied(
            Step::AiDone,
            Step::RankingDone,
            "t",
            &1,
            row(Step::AiPending, Some("t"), &1),
        );
        assert!(matches!(r, Err(TransitionError::Conflict { .. })));
    }

    #[test]
    fn illegal_moves_are_refused_before_anything_else() {
        let r = judge_unapplied(
            Step::Completed,
            Step::Aborted,
            "t",
            &1,
            row(Step::Completed, Some("t"), &1),
        );
        assert_eq!(
            r,
            Err(TransitionError::Illegal {
                from: Step::Completed,
                to: Step::Aborted
            })
        );
    }
}
