//! The provider's circuit breaker, as a value: after a run of
//! unavailability the provider is *open* for a cool-down and no AI work is
//! claimed for it; when the cool-down is over one *probe* is let through
//! (half-open), and its outcome closes the breaker or opens it again.
//! Operators may open it (for a time) or close it by hand. The state lives
//! in the database (`provider_breakers`), so every instance sees it; this
//! module only decides.
//!
//! Who may close it: an operator, at any time; otherwise only the answer
//! to the probe the breaker let through ([`Breaker::closed_by_answer`]).
//! The probe is named by the `probe_until_ms` its taker wrote
//! ([`Probe`]), so nothing else the provider answers closes it: not a job
//! that was already running when it opened (its poll succeeding says
//! nothing about new work), not a probe of an earlier opening that an
//! operator's opening replaced. An opening therefore lasts its whole
//! time, an operator's ("Pause AI") like the automatic cool-down, and only
//! then does a probe go out.

use super::policy::EpochMs;

/// Unavailable outcomes in a row (on one instance) that open the breaker.
pub const OPEN_AFTER: u32 = 5;
/// How long an operator's opening lasts when they name no time (the
/// automatic one is `STAGEHAND_BREAKER_COOL_DOWN`, 30 s by default).
pub const COOL_DOWN_MS: i64 = 30_000;
/// How long a probe may take before another instance may probe instead.
pub const PROBE_MS: i64 = 60_000;
/// The longest wait a provider may name for the whole provider (a 429's
/// `Retry-After`, a daily limit's reset hours away): past it one request
/// asks again, and a provider still over its limit names its wait again.
pub const MAX_NAMED_WAIT_MS: i64 = 10 * 60_000;
/// How long an account out of quota keeps the breaker open before one
/// probe asks again (an operator who added credit closes it at once).
/// Retrying sooner cannot help: the provider refuses every request until
/// someone changes the account.
pub const OUT_OF_QUOTA_MS: i64 = 5 * 60_000;

/// The breaker as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Breaker {
    /// Open until then (None: closed).
    pub open_until_ms: Option<EpochMs>,
    /// A probe is out until then. The value names the probe: only the
    /// dispatcher that wrote it holds the [`Probe`] whose answer closes
    /// the breaker.
    pub probe_until_ms: Option<EpochMs>,
    /// The provider named a wait (a 429's `Retry-After` and the like): no
    /// request goes out before then. Not an opening: when it is over,
    /// work goes on without a probe.
    pub paused_until_ms: Option<EpochMs>,
}

/// Who opened the breaker (`provider_breakers.opened_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opener {
    /// A run of unavailable answers, or a failed probe: the cool-down.
    Unavailable,
    /// An operator (`POST /api/admin/breaker/open`, "Pause AI" on /ops).
    Operator,
    /// The provider said the account is out of quota or credit: nothing it
    /// is asked can succeed until someone changes the account. Open for
    /// [`OUT_OF_QUOTA_MS`], then one probe; an operator closes it at once.
    OutOfQuota,
}

impl Opener {
    pub fn as_str(self) -> &'static str {
        match self {
            Opener::Unavailable => "unavailable",
            Opener::Operator => "operator",
            Opener::OutOfQuota => "out_of_quota",
        }
    }

    /// The stored name; None for anything else.
    pub fn parse(name: &str) -> Option<Opener> {
        match name {
            "unavailable" => Some(Opener::Unavailable),
            "operator" => Some(Opener::Operator),
            "out_of_quota" => Some(Opener::OutOfQuota),
            _ => None,
        }
    }

    /// Whether this opening may shorten one already in force: an
    /// operator's sets the time as said; an automatic one never shortens
    /// a longer opening (an operator's for an hour stays an hour, and
    /// stays the operator's).
    pub fn may_shorten(self) -> bool {
        self == Opener::Operator
    }

    /// The words operators read first, before the provider's own.
    pub fn headline(self) -> &'static str {
        match self {
            Opener::Unavailable => "the provider did not answer",
            Opener::Operator => "paused by an operator",
            Opener::OutOfQuota => "the account is out of quota or credit",
        }
    }
}

/// The probe one dispatcher took ([`Breaker::admission`] said
/// [`Admission::Probe`] and the shared row agreed): its answer, and no
/// other, may close the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// When it was taken: requests sent before are not the probe's.
    pub taken_at_ms: EpochMs,
    /// The `probe_until_ms` it wrote, which names it.
    pub until_ms: EpochMs,
}

impl Probe {
    /// The probe taken at `now`.
    pub fn taken_at(now: EpochMs) -> Probe {
        Probe {
            taken_at_ms: now,
            until_ms: now + PROBE_MS,
        }
    }
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

    /// Whether the provider's answer to a request sent at `sent_ms` closes
    /// the breaker, `probe` being the probe this process holds, if any.
    /// Only an answer to that probe does: a request sent once it was
    /// taken, while it is still the breaker's probe (no operator opened
    /// the breaker since, no failure opened it again, no newer probe
    /// replaced it; each of those rewrites `probe_until_ms`). Anything else
    /// the provider answers, a job that was running before, a closed
    /// breaker, an opening whose time is not over, closes nothing.
    pub fn closed_by_answer(&self, probe: Option<Probe>, sent_ms: EpochMs) -> bool {
        match (self.open_until_ms, probe) {
            (Some(open_until), Some(probe)) => {
                self.probe_until_ms == Some(probe.until_ms)
                    && open_until <= probe.taken_at_ms
                    && probe.taken_at_ms <= sent_ms
            }
            _ => false,
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
            paused_until_ms: None,
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
            paused_until_ms: None,
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
    fn only_the_answer_to_its_probe_closes_it() {
        // Opened (by anyone) until 1 000; a job was running before.
        let open = Breaker {
            open_until_ms: Some(1_000),
            probe_until_ms: None,
            paused_until_ms: None,
        };
        assert!(
            !open.closed_by_answer(None, 500),
            "a running job's answer during the opening"
        );
        assert!(
            !open.closed_by_answer(None, 1_500),
            "an answer after the opening's time, with no probe taken"
        );
        let probe = Probe::taken_at(1_200);
        assert_eq!(probe.until_ms, 1_200 + PROBE_MS);
        let probing = Breaker {
            probe_until_ms: Some(probe.until_ms),
            ..open
        };
        assert!(probing.closed_by_answer(Some(probe), 1_200));
        assert!(probing.closed_by_answer(Some(probe), 1_300));
        assert!(
            !probing.closed_by_answer(Some(probe), 1_100),
            "a request sent before the probe was taken is not the probe"
        );
        assert!(
            !probing.closed_by_answer(None, 1_300),
            "an instance that did not take the probe"
        );
        // An operator pauses while the probe is out: the row loses the
        // probe and gets the operator's time.
        let paused = Breaker {
            open_until_ms: Some(601_300),
            probe_until_ms: None,
            paused_until_ms: None,
        };
        assert!(
            !paused.closed_by_answer(Some(probe), 1_300),
            "a probe the operator did not ask for"
        );
        // The probe ran out and another dispatcher took a newer one.
        let newer = Probe::taken_at(probe.until_ms);
        let replaced = Breaker {
            probe_until_ms: Some(newer.until_ms),
            ..open
        };
        assert!(!replaced.closed_by_answer(Some(probe), 1_300));
        assert!(replaced.closed_by_answer(Some(newer), newer.taken_at_ms));
        assert!(
            !Breaker::default().closed_by_answer(Some(probe), 1_300),
            "closed already"
        );
    }

    #[test]
    fn openers_by_name_and_who_may_shorten() {
        for opener in [Opener::Unavailable, Opener::Operator, Opener::OutOfQuota] {
            assert_eq!(Opener::parse(opener.as_str()), Some(opener));
        }
        assert!(!Opener::OutOfQuota.may_shorten());
        assert_eq!(Opener::parse("someone"), None);
        assert!(Opener::Operator.may_shorten());
        assert!(!Opener::Unavailable.may_shorten());
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
