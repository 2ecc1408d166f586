//! Admission of a submission, decided without I/O: what it costs in credits
//! and which aborts give them back, where it stands in the experience's AI
//! queue and how long it should take, and whether the experience's closing
//! time refuses it. The store gathers the figures (inside the transaction
//! that starts the session) and applies these rules.

use super::policy::EpochMs;
use super::saga::AbortReason;

/// How many recent AI durations the estimate takes the median of.
pub const RECENT_AI_DURATIONS: u64 = 20;

/// Whether a saga that aborted for `reason` gives its credits back: only
/// when the abort is not the participant's fault. Moderation refusing the
/// input (`INPUT_REJECTED`) is the one reason that keeps them.
pub fn refunds_credits(reason: AbortReason) -> bool {
    match reason {
        AbortReason::AiFailed
        | AbortReason::AiTimeout
        | AbortReason::Orphaned
        | AbortReason::PersistFailed
        | AbortReason::RankingFailed
        | AbortReason::Cancelled
        | AbortReason::ReviewRejected
        | AbortReason::InputMissing => true,
        AbortReason::InputRejected => false,
    }
}

/// The credits one submission costs: one per AI call when the experience
/// counts credits (`credits` is not NULL), nothing when it is unlimited.
pub fn submission_cost(ai_calls: i32, limited: bool) -> i64 {
    if limited {
        i64::from(ai_calls.max(1))
    } else {
        0
    }
}

/// An experience's AI queue as a new submission finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueLoad {
    /// AI slots in use now (the ledger's rows: a fan-out saga may hold
    /// several, a job that outlived its saga holds one).
    pub running: i64,
    /// Sagas waiting for an AI slot before the new one.
    pub waiting: i64,
}

/// What an experience allows at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub max_in_flight: i32,
    pub ai_calls: i32,
}

impl Capacity {
    /// Sagas whose AI calls can run side by side: a saga holds up to
    /// `ai_calls` slots (never more than `max_in_flight`).
    pub fn parallel_sagas(self) -> i64 {
        let max = i64::from(self.max_in_flight.max(1));
        (max / self.per_saga()).max(1)
    }

    /// Slots one saga takes at most.
    pub fn per_saga(self) -> i64 {
        let max = i64::from(self.max_in_flight.max(1));
        i64::from(self.ai_calls.max(1)).min(max)
    }
}

/// Where an accepted submission stands, as the 202 tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// 1 = the next saga of the experience to get an AI slot.
    pub queue_position: i64,
    /// The estimated time until its result, None while no recent AI
    /// duration is known.
    pub eta_ms: Option<i64>,
}

impl Admission {
    /// The estimate in whole seconds, rounded up.
    pub fn eta_seconds(self) -> Option<i64> {
        self.eta_ms.map(|ms| (ms.max(0) + 999) / 1000)
    }
}

/// The median of recent AI durations (ms); None when there are none.
pub fn median_ms(durations: &[i64]) -> Option<i64> {
    if durations.is_empty() {
        return None;
    }
    let mut sorted = durations.to_vec();
    sorted.sort_unstable();
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2
    })
}

/// Where a new saga stands behind `load` and what it should take: its
/// position counts the waiting sagas before it; its wait counts the
/// "waves" of sagas that get a slot before it (everything running or
/// waiting, `parallel_sagas` at a time), each taking the median AI
/// duration, plus its own. A conservative figure: running sagas are
/// counted as if they had just started.
pub fn admit(load: QueueLoad, capacity: Capacity, median_ai_ms: Option<i64>) -> Admission {
    let waiting = load.waiting.max(0);
    // The sagas the slots in use stand for, rounded up.
    let per_saga = capacity.per_saga();
    let running = (load.running.max(0) + per_saga - 1) / per_saga;
    let ahead = running + waiting;
    let waves = ahead / capacity.parallel_sagas();
    Admission {
        queue_position: waiting + 1,
        eta_ms: median_ai_ms.map(|d| d.max(0).saturating_mul(waves + 1)),
    }
}

/// Whether an experience closing at `closes_at` refuses a submission at
/// `now` whose estimated time to its result is `eta_ms`: once it has
/// closed, and before that when the estimate (if known) ends after it.
pub fn refused_by_closing(now: EpochMs, closes_at: Option<EpochMs>, eta_ms: Option<i64>) -> bool {
    match closes_at {
        None => false,
        Some(closes) => now >= closes || eta_ms.is_some_and(|eta| now.saturating_add(eta) > closes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: EpochMs = 1_800_000_000_000;

    #[test]
    fn only_the_participants_own_fault_keeps_the_credits() {
        let kept: Vec<_> = AbortReason::ALL
            .into_iter()
            .filter(|r| !refunds_credits(*r))
            .collect();
        assert_eq!(kept, vec![AbortReason::InputRejected]);
    }

    #[test]
    fn a_submission_costs_its_ai_calls_when_credits_are_counted() {
        assert_eq!(submission_cost(4, true), 4);
        assert_eq!(submission_cost(1, true), 1);
        assert_eq!(submission_cost(4, false), 0);
    }

    #[test]
    fn median_of_odd_even_and_none() {
        assert_eq!(median_ms(&[]), None);
        assert_eq!(median_ms(&[30, 10, 20]), Some(20));
        assert_eq!(median_ms(&[40, 10, 20, 30]), Some(25));
        assert_eq!(median_ms(&[7]), Some(7));
    }

    #[test]
    fn parallel_sagas_follow_the_slots_a_saga_holds() {
        let cap = |max_in_flight, ai_calls| Capacity {
            max_in_flight,
            ai_calls,
        };
        assert_eq!(cap(5, 1).parallel_sagas(), 5);
        assert_eq!(cap(8, 4).parallel_sagas(), 2);
        assert_eq!(cap(3, 4).parallel_sagas(), 1);
        assert_eq!(cap(0, 0).parallel_sagas(), 1);
    }

    #[test]
    fn free_capacity_means_one_ai_duration() {
        let cap = Capacity {
            max_in_flight: 5,
            ai_calls: 1,
        };
        let free = QueueLoad {
            running: 4,
            waiting: 0,
        };
        assert_eq!(
            admit(free, cap, Some(2_000)),
            Admission {
                queue_position: 1,
                eta_ms: Some(2_000)
            }
        );
        // Full: one wave before it.
        let full = QueueLoad {
            running: 5,
            waiting: 0,
        };
        assert_eq!(admit(full, cap, Some(2_000)).eta_ms, Some(4_000));
        // Twelve waiting and five running: three waves before it.
        let busy = QueueLoad {
            running: 5,
            waiting: 12,
        };
        let a = admit(busy, cap, Some(2_000));
        assert_eq!(a.queue_position, 13);
        assert_eq!(a.eta_ms, Some(8_000));
        assert_eq!(a.eta_seconds(), Some(8));
    }

    #[test]
    fn unknown_durations_give_a_position_but_no_eta() {
        let a = admit(
            QueueLoad {
                running: 0,
                waiting: 3,
            },
            Capacity {
                max_in_flight: 2,
                ai_calls: 1,
            },
            None,
        );
        assert_eq!(a.queue_position, 4);
        assert_eq!(a.eta_ms, None);
        assert_eq!(a.eta_seconds(), None);
    }

    #[test]
    fn eta_seconds_round_up() {
        let a = |ms| Admission {
            queue_position: 1,
            eta_ms: Some(ms),
        };
        assert_eq!(a(0).eta_seconds(), Some(0));
        assert_eq!(a(1).eta_seconds(), Some(1));
        assert_eq!(a(1_000).eta_seconds(), Some(1));
        assert_eq!(a(1_001).eta_seconds(), Some(2));
    }

    #[test]
    fn closing_refuses_after_the_time_and_when_the_wait_runs_past_it() {
        assert!(!refused_by_closing(T0, None, Some(i64::MAX)));
        assert!(refused_by_closing(T0, Some(T0), None));
        assert!(refused_by_closing(T0, Some(T0 - 1), Some(0)));
        // Unknown estimate: open until the time itself.
        assert!(!refused_by_closing(T0, Some(T0 + 1), None));
        // Known estimate: it must end by the closing time.
        assert!(!refused_by_closing(T0, Some(T0 + 5_000), Some(5_000)));
        assert!(refused_by_closing(T0, Some(T0 + 5_000), Some(5_001)));
    }
}
