//! Retry, backoff, lease and recovery policy (rules 6, 8 and 10). Pure: every
//! decision is given `now` (milliseconds since the epoch) and, where chance is
//! involved, the random jitter, so tests pin both.

use super::failure::AiFailure;
use super::saga::{AbortReason, Step, OUT_OF_CREDIT};

/// Milliseconds since the Unix epoch; the database stores times this way.
pub type EpochMs = i64;

/// Settings of the retry policy, from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Counted AI attempts before the saga aborts (`MAX_ATTEMPTS`).
    pub max_attempts: u32,
    /// First backoff delay; doubled per consecutive failure.
    pub backoff_base_ms: i64,
    /// Cap of the backoff delay.
    pub backoff_max_ms: i64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            backoff_base_ms: 1_000,
            backoff_max_ms: 60_000,
        }
    }
}

/// The AI bookkeeping of a saga before a failure is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptState {
    /// Counted attempts so far (the next attempt's number).
    pub attempts: u32,
    /// Consecutive `Unavailable` answers, for the backoff exponent.
    pub unavailable_streak: u32,
}

/// What to do after a failed AI call.
#[derive(Debug, Clone, PartialEq)]
pub enum AfterFailure {
    /// End the saga now.
    Abort { reason: AbortReason, detail: String },
    /// Stay in AI_PENDING, release the lease, and try again at
    /// `next_attempt_at` with the given counters.
    RetryLater {
        state: AttemptState,
        next_attempt_at: EpochMs,
    },
}

impl RetryPolicy {
    /// Exponential backoff with "equal jitter": half the delay is fixed, half
    /// is random (`jitter` in `0.0..=1.0`).
    pub fn backoff_ms(&self, exponent: u32, jitter: f64) -> i64 {
        let exp = exponent.min(30);
        let full = self
            .backoff_base_ms
            .saturating_mul(1_i64 << exp)
            .min(self.backoff_max_ms);
        let jitter = jitter.clamp(0.0, 1.0);
        full / 2 + ((full - full / 2) as f64 * jitter) as i64
    }

    /// Rule 6 and 10: decide what a failure means for the saga.
    pub fn after_failure(
        &self,
        failure: &AiFailure,
        before: AttemptState,
        now: EpochMs,
        deadline: EpochMs,
        jitter: f64,
    ) -> AfterFailure {
        let (state, exponent) = match failure {
            AiFailure::ContentRejected(detail) => {
                return AfterFailure::Abort {
                    reason: AbortReason::InputRejected,
                    detail: detail.clone(),
                }
            }
            AiFailure::Unavailable(_)
            | AiFailure::Unclear(_)
            | AiFailure::Throttled { .. }
            | AiFailure::OutOfQuota(_) => (
                AttemptState {
                    attempts: before.attempts,
                    unavailable_streak: before.unavailable_streak + 1,
                },
                before.unavailable_streak,
            ),
            AiFailure::RequestRejected(_) | AiFailure::JobFailed(_) | AiFailure::Timeout => {
                let attempts = before.attempts + 1;
                if attempts >= self.max_attempts {
                    let reason = if *failure == AiFailure::Timeout {
                        AbortReason::AiTimeout
                    } else {
                        AbortReason::AiFailed
                    };
                    return AfterFailure::Abort {
                        reason,
                        detail: format!("{failure} (attempt {attempts} of {})", self.max_attempts),
                    };
                }
                (
                    AttemptState {
                        attempts,
                        unavailable_streak: 0,
                    },
                    attempts - 1,
                )
            }
        };
        // A wait the provider asked for is the least one.
        let wait = self
            .backoff_ms(exponent, jitter)
            .max(failure.retry_after_ms().unwrap_or(0));
        let next_attempt_at = now + wait;
        if next_attempt_at > deadline {
            // The time ran out waiting for the AI (it was not there, or too
            // slow): AI_TIMEOUT. After a job that failed or a refused
            // request, the AI failed and there is no time to ask again.
            // An account out of quota: the AI could not work at all, and
            // the guest is told so (`OUT_OF_CREDIT`).
            let (reason, detail) = match failure {
                AiFailure::RequestRejected(_) | AiFailure::JobFailed(_) => (
                    AbortReason::AiFailed,
                    format!("{failure}; no time left before the saga deadline"),
                ),
                AiFailure::OutOfQuota(_) => (
                    AbortReason::AiFailed,
                    format!("{OUT_OF_CREDIT}: {failure}; no time left before the saga deadline"),
                ),
                _ => (
                    AbortReason::AiTimeout,
                    format!("{failure}; no time left before the saga deadline"),
                ),
            };
            return AfterFailure::Abort { reason, detail };
        }
        AfterFailure::RetryLater {
            state,
            next_attempt_at,
        }
    }
}

impl RetryPolicy {
    /// Rule 10: an attempt ran out of `AI_TIMEOUT` while its job may still
    /// be running. The attempt counts; below the limit, the next attempt
    /// adopts that same job (polls it by id, with its own `AI_TIMEOUT` from
    /// now) instead of submitting a new one, so one call never has two jobs
    /// at the provider. `Some(attempts)` to go on with, `None` when the
    /// limit is reached (then `after_failure` with `Timeout` aborts
    /// `AI_TIMEOUT`).
    pub fn after_timeout(&self, attempts_before: u32) -> Option<u32> {
        let attempts = attempts_before + 1;
        (attempts < self.max_attempts).then_some(attempts)
    }
}

/// Why a saga that nobody will finish is ended (rule 8), by the cleanup
/// actor or by its own worker at the deadline: past its deadline while it
/// waited for the AI (AI_PENDING, and the AI was asked at least once: a
/// job, a counted attempt or an unavailable answer) it is `AI_TIMEOUT`;
/// otherwise (never asked, or past the AI step, or out of recoveries) it
/// is `ORPHANED`.
pub fn orphan_reason(step: Step, deadline_passed: bool, asked_ai: bool) -> AbortReason {
    if deadline_passed && step == Step::AiPending && asked_ai {
        AbortReason::AiTimeout
    } else {
        AbortReason::Orphaned
    }
}

/// How long to wait before the next poll of a running job: the provider's
/// hint when it gave one (a `Retry-After` on the poll's answer or its
/// `poll_after_ms`), kept within 10 ms..60 s; else the poll interval,
/// doubled every 20 polls up to 8 times, so a job of minutes is not asked
/// twice a second all along while a job of seconds is seen at once.
pub fn poll_wait_ms(base_ms: i64, polls: u32, hint_ms: Option<i64>) -> i64 {
    match hint_ms {
        Some(hint) => hint.clamp(10, 60_000),
        None => base_ms.saturating_mul(1_i64 << (polls / 20).min(3)),
    }
}

/// When a lease granted at `now` ends.
pub fn lease_until(now: EpochMs, lease_ms: i64) -> EpochMs {
    now + lease_ms
}

/// Who owns a non-final saga, as its lease columns say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// No token: never claimed, or released on purpose (backoff).
    Free,
    /// A worker holds an unexpired lease.
    Held,
    /// A worker held it and its lease ran out: it died or hangs.
    Expired,
    /// Its instance shut down gracefully and cut the lease short on
    /// purpose: resumed at once like an expired lease (it keeps its AI
    /// slot's priority), but no recovery is used up.
    HandedOver,
}

pub fn ownership(
    lock_token: Option<&str>,
    locked_until: Option<EpochMs>,
    handed_over: bool,
    now: EpochMs,
) -> Ownership {
    match (lock_token, locked_until) {
        (None, _) => Ownership::Free,
        (Some(_), Some(until)) if until >= now => Ownership::Held,
        (Some(_), _) if handed_over => Ownership::HandedOver,
        (Some(_), _) => Ownership::Expired,
    }
}

/// Rule 8: what the dispatcher and the cleanup actor may do with a non-final
/// saga. The claim SQL in `store::sagas` mirrors this function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Leave it alone (someone holds it, or it waits for its backoff).
    Wait,
    /// The dispatcher may claim it; `counts_as_recovery` when it resumes after
    /// a lost lease.
    Claim { counts_as_recovery: bool },
    /// Nobody will finish it: the cleanup actor aborts it as ORPHANED.
    Orphan,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryLimits {
    pub max_recoveries: u32,
}

pub fn recovery(
    ownership: Ownership,
    recoveries: u32,
    next_attempt_at: EpochMs,
    deadline: EpochMs,
    now: EpochMs,
    limits: RecoveryLimits,
) -> Recovery {
    match ownership {
        Ownership::Held => Recovery::Wait,
        _ if deadline < now => Recovery::Orphan,
        Ownership::Expired if recoveries >= limits.max_recoveries => Recovery::Orphan,
        _ if next_attempt_at > now => Recovery::Wait,
        Ownership::Expired => Recovery::Claim {
            counts_as_recovery: true,
        },
        Ownership::Free | Ownership::HandedOver => Recovery::Claim {
            counts_as_recovery: false,
        },
    }
}

/// Whether operators should look at a saga: it has not ended, and either
/// its worker's lease ran out (it died or hangs) or its deadline passed.
/// Such a saga is resumed or aborted ORPHANED by itself; "stuck" says it is
/// late, not lost.
pub fn is_stuck(ended: bool, ownership: Ownership, deadline: EpochMs, now: EpochMs) -> bool {
    !ended && (ownership == Ownership::Expired || deadline < now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saga_is_stuck_when_its_lease_ran_out_or_its_deadline_passed() {
        assert!(!is_stuck(false, Ownership::Held, DEADLINE, NOW));
        assert!(!is_stuck(false, Ownership::Free, DEADLINE, NOW));
        assert!(is_stuck(false, Ownership::Expired, DEADLINE, NOW));
        assert!(is_stuck(false, Ownership::Free, NOW - 1, NOW));
        assert!(
            !is_stuck(true, Ownership::Expired, NOW - 1, NOW),
            "ended sagas are never stuck"
        );
    }

    const NOW: EpochMs = 1_800_000_000_000;
    const DEADLINE: EpochMs = NOW + 900_000;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            backoff_base_ms: 1_000,
            backoff_max_ms: 30_000,
        }
    }

    fn st(attempts: u32, streak: u32) -> AttemptState {
        AttemptState {
            attempts,
            unavailable_streak: streak,
        }
    }

    #[test]
    fn backoff_doubles_caps_and_jitters_within_half() {
        let p = policy();
        assert_eq!(p.backoff_ms(0, 0.0), 500);
        assert_eq!(p.backoff_ms(0, 1.0), 1_000);
        assert_eq!(p.backoff_ms(1, 0.0), 1_000);
        assert_eq!(p.backoff_ms(3, 1.0), 8_000);
        assert_eq!(p.backoff_ms(10, 1.0), 30_000);
        assert_eq!(p.backoff_ms(60, 0.0), 15_000);
        let mid = p.backoff_ms(2, 0.5);
        assert!((2_000..=4_000).contains(&mid));
    }

    #[test]
    fn polls_back_off_slowly_and_follow_the_providers_hint() {
        assert_eq!(poll_wait_ms(500, 0, None), 500);
        assert_eq!(poll_wait_ms(500, 19, None), 500);
        assert_eq!(poll_wait_ms(500, 20, None), 1_000);
        assert_eq!(poll_wait_ms(500, 59, None), 2_000);
        assert_eq!(poll_wait_ms(500, 1_000, None), 4_000, "at most 8 times");
        assert_eq!(poll_wait_ms(500, 0, Some(3_000)), 3_000, "the hint wins");
        assert_eq!(poll_wait_ms(500, 0, Some(0)), 10);
        assert_eq!(poll_wait_ms(500, 0, Some(600_000)), 60_000);
    }

    #[test]
    fn a_throttled_answer_waits_at_least_what_the_provider_asked() {
        let throttled = AiFailure::Throttled {
            retry_after_ms: 20_000,
            detail: "429".into(),
        };
        match policy().after_failure(&throttled, st(1, 0), NOW, DEADLINE, 0.0) {
            AfterFailure::RetryLater {
                state,
                next_attempt_at,
            } => {
                assert_eq!(state.attempts, 1, "not an attempt");
                assert_eq!(
                    next_attempt_at,
                    NOW + 20_000,
                    "the provider's wait, not the 500 ms backoff"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unavailable_counts_no_attempt_and_backs_off() {
        let d = policy().after_failure(
            &AiFailure::Unavailable("503".into()),
            st(1, 2),
            NOW,
            DEADLINE,
            1.0,
        );
        assert_eq!(
            d,
            AfterFailure::RetryLater {
                state: st(1, 3),
                next_attempt_at: NOW + 4_000
            }
        );
    }

    #[test]
    fn unavailable_many_times_never_aborts_for_attempts() {
        let d = policy().after_failure(
            &AiFailure::Unavailable("x".into()),
            st(2, 50),
            NOW,
            DEADLINE,
            0.0,
        );
        assert!(matches!(d, AfterFailure::RetryLater { state, .. } if state.attempts == 2));
    }

    #[test]
    fn waiting_for_the_ai_past_the_deadline_aborts_ai_timeout() {
        for failure in [
            AiFailure::Unavailable("x".into()),
            AiFailure::Unclear("cut".into()),
            AiFailure::Timeout,
        ] {
            let d = policy().after_failure(&failure, st(0, 5), NOW, NOW + 100, 0.0);
            assert!(
                matches!(
                    d,
                    AfterFailure::Abort {
                        reason: AbortReason::AiTimeout,
                        ..
                    }
                ),
                "{failure:?}: {d:?}"
            );
        }
    }

    #[test]
    fn a_failed_job_past_the_deadline_aborts_ai_failed() {
        for failure in [
            AiFailure::JobFailed("x".into()),
            AiFailure::RequestRejected("400".into()),
        ] {
            let d = policy().after_failure(&failure, st(0, 0), NOW, NOW + 100, 0.0);
            assert!(
                matches!(
                    d,
                    AfterFailure::Abort {
                        reason: AbortReason::AiFailed,
                        ..
                    }
                ),
                "{failure:?}: {d:?}"
            );
        }
    }

    #[test]
    fn unclear_counts_no_attempt_like_unavailable() {
        let d = policy().after_failure(
            &AiFailure::Unclear("connection broken".into()),
            st(1, 0),
            NOW,
            DEADLINE,
            1.0,
        );
        assert_eq!(
            d,
            AfterFailure::RetryLater {
                state: st(1, 1),
                next_attempt_at: NOW + 1_000
            }
        );
    }

    #[test]
    fn a_timed_out_attempt_counts_and_the_next_adopts_its_job() {
        assert_eq!(policy().after_timeout(0), Some(1));
        assert_eq!(policy().after_timeout(1), Some(2));
        assert_eq!(policy().after_timeout(2), None);
    }

    #[test]
    fn the_deadline_says_ai_timeout_only_while_waiting_for_the_ai() {
        assert_eq!(
            orphan_reason(Step::AiPending, true, true),
            AbortReason::AiTimeout
        );
        assert_eq!(
            orphan_reason(Step::AiPending, true, false),
            AbortReason::Orphaned,
            "never asked the AI"
        );
        assert_eq!(
            orphan_reason(Step::AiPending, false, true),
            AbortReason::Orphaned,
            "out of recoveries"
        );
        assert_eq!(
            orphan_reason(Step::AiDone, true, true),
            AbortReason::Orphaned
        );
    }

    #[test]
    fn content_rejected_aborts_at_once() {
        let d = policy().after_failure(
            &AiFailure::ContentRejected("mod".into()),
            st(0, 0),
            NOW,
            DEADLINE,
            0.0,
        );
        assert_eq!(
            d,
            AfterFailure::Abort {
                reason: AbortReason::InputRejected,
                detail: "mod".into()
            }
        );
    }

    #[test]
    fn counted_failures_retry_until_the_limit() {
        for failure in [
            AiFailure::RequestRejected("400".into()),
            AiFailure::JobFailed("boom".into()),
            AiFailure::Timeout,
        ] {
            let d = policy().after_failure(&failure, st(0, 4), NOW, DEADLINE, 0.0);
            assert_eq!(
                d,
                AfterFailure::RetryLater {
                    state: st(1, 0),
                    next_attempt_at: NOW + 500
                },
                "{failure:?}"
            );
            let d = policy().after_failure(&failure, st(1, 0), NOW, DEADLINE, 0.0);
            assert!(matches!(d, AfterFailure::RetryLater { state, .. } if state.attempts == 2));
        }
    }

    #[test]
    fn reaching_the_limit_aborts_with_the_right_reason() {
        let d = policy().after_failure(&AiFailure::Timeout, st(2, 0), NOW, DEADLINE, 0.0);
        assert!(matches!(
            d,
            AfterFailure::Abort {
                reason: AbortReason::AiTimeout,
                ..
            }
        ));
        let d = policy().after_failure(
            &AiFailure::JobFailed("x".into()),
            st(2, 0),
            NOW,
            DEADLINE,
            0.0,
        );
        assert!(matches!(
            d,
            AfterFailure::Abort {
                reason: AbortReason::AiFailed,
                ..
            }
        ));
        let d = policy().after_failure(
            &AiFailure::RequestRejected("x".into()),
            st(2, 0),
            NOW,
            DEADLINE,
            0.0,
        );
        assert!(matches!(
            d,
            AfterFailure::Abort {
                reason: AbortReason::AiFailed,
                ..
            }
        ));
    }

    #[test]
    fn ownership_from_lease_columns() {
        assert_eq!(ownership(None, None, false, NOW), Ownership::Free);
        assert_eq!(ownership(None, Some(NOW - 1), false, NOW), Ownership::Free);
        assert_eq!(ownership(Some("t"), Some(NOW), false, NOW), Ownership::Held);
        assert_eq!(ownership(Some("t"), Some(NOW), true, NOW), Ownership::Held);
        assert_eq!(
            ownership(Some("t"), Some(NOW - 1), false, NOW),
            Ownership::Expired
        );
        assert_eq!(
            ownership(Some("t"), Some(NOW - 1), true, NOW),
            Ownership::HandedOver
        );
        assert_eq!(ownership(Some("t"), None, false, NOW), Ownership::Expired);
        assert_eq!(lease_until(NOW, 60_000), NOW + 60_000);
    }

    #[test]
    fn recovery_policy() {
        let lim = RecoveryLimits { max_recoveries: 2 };
        let r = |o, rec, next, dl| recovery(o, rec, next, dl, NOW, lim);
        assert_eq!(r(Ownership::Held, 0, NOW, NOW - 1), Recovery::Wait);
        assert_eq!(
            r(Ownership::Free, 0, NOW, DEADLINE),
            Recovery::Claim {
                counts_as_recovery: false
            }
        );
        assert_eq!(r(Ownership::Free, 0, NOW + 1, DEADLINE), Recovery::Wait);
        assert_eq!(
            r(Ownership::Expired, 1, NOW, DEADLINE),
            Recovery::Claim {
                counts_as_recovery: true
            }
        );
        assert_eq!(r(Ownership::Expired, 2, NOW, DEADLINE), Recovery::Orphan);
        assert_eq!(r(Ownership::Expired, 0, NOW, NOW - 1), Recovery::Orphan);
        assert_eq!(r(Ownership::Free, 0, NOW, NOW - 1), Recovery::Orphan);
        // A handed-over saga is resumed without using up a recovery, even
        // when it has none left, until its deadline.
        assert_eq!(
            r(Ownership::HandedOver, 2, NOW, DEADLINE),
            Recovery::Claim {
                counts_as_recovery: false
            }
        );
        assert_eq!(r(Ownership::HandedOver, 2, NOW, NOW - 1), Recovery::Orphan);
    }
}
