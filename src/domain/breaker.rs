//! The provider's circuit breaker, as a value: after a run of
//! unavailability the provider is *open* for a cool-down and no AI work is
//! claimed for it; when the cool-down is over one *probe* is let through
//! (half-open), and its outcome closes the breaker or opens it again.
//! Operators may open it (for a time) or close it by hand. The state lives
//! in the database (`provider_breakers`), so every instance sees it; this
//! module only decides.

use super::policy::EpochMs;

/// Unavailable outcomes in a row (on one instance) that open the breaker.
pub const OPEN_AFTER: u32 = 5;
/// How long an operator's opening lasts when they name no time (the
/// automatic one is `STAGEHAND_BREAKER_COOL_DOWN`, 30 s by default).
pub const COOL_DOWN_MS: i64 = 30_000;
/// How long a probe may take before another instance may probe instead.
pub const PROBE_MS: i64 = 60_000;

/// The breaker as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Breaker {
    /// Open until then (None: closed).
    pub open_until_ms: Option<EpochMs>,
    /// A probe is out until then.
    pub probe_until_ms: Option<EpochMs>,
}

/// The breaker as operators see it (the admin API and `/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    /// Open: no AI work is claimed (also once the cool-down is over,
    /// until a probe is out).
    Open,
    /// Cool-down over and a probe is out: one saga tries the provider.
    Probing,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::Probing => "probing",
        }
    }

    /// `/metrics`: 0 closed, 1 open, 2 probing.
    pub fn gauge(self) -> u8 {
        self as u8
    }
}

/// What the dispatcher may claim for the provider's experiences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed: claim as usual.
    All,
    /// Open, cool-down over, no probe out: one AI saga may probe.
    Probe,
    /// Open (or a probe is out): no AI work; sagas past the AI step still
    /// run.
    NoAi,
}

impl Breaker {
    pub fn is_open(&self) -> bool {
        self.open_until_ms.is_some()
    }

    /// How operators see it at `now`.
    pub fn state(&self, now: EpochMs) -> BreakerState {
        match (self.open_until_ms, self.probe_until_ms) {
            (None, _) => BreakerState::Closed,
            (Some(until), Some(probe)) if until <= now && now < probe => BreakerState::Probing,
            (Some(_), _) => BreakerState::Open,
        }
    }

    /// What may be claimed at `now`.
    pub fn admission(&self, now: EpochMs) -> Admission {
        match self.open_until_ms {
            None => Admission::All,
            Some(until) if now < until => Admission::NoAi,
            Some(_) if self.probe_until_ms.is_some_and(|p| now < p) => Admission::NoAi,
            Some(_) => Admission::Probe,
        }
    }
}

/// Counts unavailable outcomes in a row; says when the run is long enough
/// to open the breaker.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnavailableRun(pub u32);

impl UnavailableRun {
    /// One more unavailable outcome: true when this one opens the breaker
    /// (the run starts again after it).
    pub fn unavailable(&mut self) -> bool {
        self.0 += 1;
        if self.0 >= OPEN_AFTER {
            self.0 = 0;
            true
        } else {
            false
        }
    }

    /// The provider answered: the run is over.
    pub fn answered(&mut self) {
        self.0 = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_as_operators_see_them() {
        let b = |open, probe| Breaker {
            open_until_ms: open,
            probe_until_ms: probe,
        };
        assert_eq!(b(None, None).state(10), BreakerState::Closed);
        assert_eq!(b(Some(20), None).state(10), BreakerState::Open);
        assert_eq!(
            b(Some(5), None).state(10),
            BreakerState::Open,
            "cool-down over, no probe yet"
        );
        assert_eq!(b(Some(5), Some(20)).state(10), BreakerState::Probing);
        assert_eq!(
            b(Some(5), Some(8)).state(10),
            BreakerState::Open,
            "the probe ran out"
        );
        assert_eq!(BreakerState::Probing.gauge(), 2);
    }

    #[test]
    fn closed_admits_all_open_none_then_one_probe() {
        let closed = Breaker::default();
        assert_eq!(closed.admission(0), Admission::All);
        let open = Breaker {
            open_until_ms: Some(1_000),
            probe_until_ms: None,
        };
        assert_eq!(open.admission(999), Admission::NoAi);
        assert_eq!(open.admission(1_000), Admission::Probe);
        let probing = Breaker {
            probe_until_ms: Some(2_000),
            ..open
        };
        assert_eq!(
            probing.admission(1_500),
            Admission::NoAi,
            "one probe at a time"
        );
        assert_eq!(
            probing.admission(2_000),
            Admission::Probe,
            "a lost probe is replaced"
        );
    }

    #[test]
    fn a_run_of_unavailability_opens_and_an_answer_resets_it() {
        let mut run = UnavailableRun::default();
        for _ in 1..OPEN_AFTER {
            assert!(!run.unavailable());
        }
        run.answered();
        for _ in 1..OPEN_AFTER {
            assert!(!run.unavailable());
        }
        assert!(run.unavailable(), "the fifth in a row opens it");
        assert_eq!(run, UnavailableRun(0));
    }
}
