//! The decision of a rehearsal: GO or NO-GO against the targets, and, when
//! the AI slots cannot keep up with the arrivals, the cap that would (by
//! Little's law). Pure functions of the measured figures, so they are
//! tested without a server.

use std::time::Duration;

use serde_json::{json, Value};

/// Share of the AI slots busy that the recommended cap aims at: near 100 %
/// a queue builds up at the least burst, so the advice leaves 15 % spare.
pub const AIM_BUSY: f64 = 0.85;

/// What the rehearsal must meet for a GO.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Targets {
    /// 95th percentile of 202 to terminal frame.
    pub p95: Duration,
    /// 99th percentile of the same, when set.
    pub p99: Option<Duration>,
    /// Most share of participants whose session did not complete for
    /// another reason than moderation (0.02 = 2 %).
    pub abort_rate: f64,
}

/// The figures the verdict is taken on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// 202 to terminal frame (ms); NaN when no frame came.
    pub p95_ms: f64,
    pub p99_ms: f64,
    /// See [`abort_rate`].
    pub abort_rate: f64,
    /// Lost sessions and display gaps or repeats (the violations).
    pub delivery_problems: usize,
}

/// The share of participants that did not get their result for another
/// reason than moderation rejecting their prompt: aborted for any other
/// reason, lost (no frame by the deadline), or their submission refused
/// (not answered 202). 0 with no participant.
pub fn abort_rate(participants: usize, other_aborts: usize, lost: usize, refused: usize) -> f64 {
    if participants == 0 {
        return 0.0;
    }
    (other_aborts + lost + refused) as f64 / participants as f64
}

/// One target checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// `p95`, `p99`, `abort rate`, `delivery problems`.
    pub name: &'static str,
    pub measured: String,
    pub target: String,
    pub met: bool,
}

impl Check {
    fn said(&self) -> String {
        let sign = if self.met { "<=" } else { ">" };
        format!(
            "{} {} {sign} target {}",
            self.name, self.measured, self.target
        )
    }
}

/// GO when every check is met.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub checks: Vec<Check>,
}

impl Verdict {
    pub fn go(&self) -> bool {
        self.checks.iter().all(|c| c.met)
    }

    /// `GO: p95 1.2 s <= target 30 s; abort rate 0 % <= target 2 %`, or
    /// `NO-GO: ` and the checks that failed only.
    pub fn line(&self) -> String {
        if self.go() {
            let all: Vec<String> = self.checks.iter().map(Check::said).collect();
            format!("GO: {}", all.join("; "))
        } else {
            let failed: Vec<String> = self
                .checks
                .iter()
                .filter(|c| !c.met)
                .map(Check::said)
                .collect();
            format!("NO-GO: {}", failed.join("; "))
        }
    }

    pub fn to_json(&self) -> Value {
        let checks: Vec<Value> = self
            .checks
            .iter()
            .map(|c| {
                json!({"name": c.name, "measured": c.measured, "target": c.target, "met": c.met})
            })
            .collect();
        json!({"go": self.go(), "line": self.line(), "checks": checks})
    }
}

/// The checks of `measured` against `targets`: p95 (and p99 when a target
/// is set) at most the target, the abort rate at most its target, and no
/// delivery problem. A percentile with no sample fails.
pub fn verdict(measured: &Measured, targets: &Targets) -> Verdict {
    let latency = |name: &'static str, ms: f64, target: Duration| {
        let target_ms = target.as_secs_f64() * 1000.0;
        Check {
            name,
            measured: if ms.is_nan() {
                "n/a (no frame)".into()
            } else {
                seconds(ms)
            },
            target: seconds(target_ms),
            met: !ms.is_nan() && ms <= target_ms,
        }
    };
    let mut checks = vec![latency("p95", measured.p95_ms, targets.p95)];
    if let Some(p99) = targets.p99 {
        checks.push(latency("p99", measured.p99_ms, p99));
    }
    checks.push(Check {
        name: "abort rate",
        measured: percent(measured.abort_rate),
        target: percent(targets.abort_rate),
        // Compared at the precision printed: 2.0004 % is not above 2 %.
        met: measured.abort_rate <= targets.abort_rate + 1e-9,
    });
    checks.push(Check {
        name: "delivery problems",
        measured: measured.delivery_problems.to_string(),
        target: "0".into(),
        met: measured.delivery_problems == 0,
    });
    Verdict { checks }
}

/// What the AI slots need for the arrivals, by Little's law: the jobs in
/// flight on average are the jobs arriving per second times the time one
/// takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    /// Participants arriving per second (measured).
    pub arrival_per_s: f64,
    /// AI jobs per participant (measured: retries and fan-out included).
    pub jobs_per_participant: f64,
    /// Mean time of one AI job, submit to final status (measured, s).
    pub mean_job_s: f64,
    /// The experience's max_in_flight.
    pub cap: u32,
    /// Jobs in flight on average to keep up: L = lambda x W.
    pub needed: f64,
    /// needed / cap: at 1 or more the queue grows without bound.
    pub busy: f64,
    /// The smallest cap at which the slots are at most [`AIM_BUSY`] busy.
    pub recommended: u32,
}

/// The capacity the arrivals need; None when a figure is missing or not
/// positive (no steady rate, no AI job measured, no cap).
pub fn capacity(
    arrival_per_s: f64,
    jobs_per_participant: f64,
    mean_job_s: f64,
    cap: u32,
) -> Option<Capacity> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(arrival_per_s)
        || !positive(jobs_per_participant)
        || !positive(mean_job_s)
        || cap == 0
    {
        return None;
    }
    let needed = arrival_per_s * jobs_per_participant * mean_job_s;
    // The rounding guards against 0.1 x 3 x ... landing a hair above an
    // integer: 25.500000001 / 0.85 is 30, not 31.
    let recommended = ((needed / AIM_BUSY) * 1e6).round() / 1e6;
    Some(Capacity {
        arrival_per_s,
        jobs_per_participant,
        mean_job_s,
        cap,
        needed,
        busy: needed / f64::from(cap),
        recommended: recommended.ceil().max(1.0) as u32,
    })
}

impl Capacity {
    /// The arrivals bring more AI work than the slots can do.
    pub fn grows_without_bound(&self) -> bool {
        self.busy >= 1.0
    }

    /// What would hold, when the cap is short of [`Capacity::recommended`];
    /// None when it is not.
    pub fn advice(&self) -> Option<String> {
        if self.recommended <= self.cap {
            return None;
        }
        let per_participant = if (self.jobs_per_participant - 1.0).abs() < 0.005 {
            String::new()
        } else {
            format!(" x {:.2} jobs per participant", self.jobs_per_participant)
        };
        let state = if self.grows_without_bound() {
            format!(
                "with max_in_flight {} the AI queue grows without bound ({:.0} % of the slots \
                 needed)",
                self.cap,
                100.0 * self.busy
            )
        } else {
            format!(
                "with max_in_flight {} the AI slots are {:.0} % busy and a queue builds up at \
                 the least burst",
                self.cap,
                100.0 * self.busy
            )
        };
        Some(format!(
            "capacity: at {:.0}/min with a {:.2} s mean AI job{per_participant}, {:.1} jobs are \
             in flight on average (Little's law); {state}: you need max_in_flight >= {} (PATCH \
             /api/experiences/{{slug}} changes it while the event runs, with the same QR codes; \
             or a second provider account, if one account cannot run that many jobs at once)",
            self.arrival_per_s * 60.0,
            self.mean_job_s,
            self.needed,
            self.recommended
        ))
    }

    pub fn to_json(&self) -> Value {
        json!({
            "arrival_per_s": self.arrival_per_s,
            "jobs_per_participant": self.jobs_per_participant,
            "mean_ai_job_s": self.mean_job_s,
            "max_in_flight": self.cap,
            "needed_in_flight": self.needed,
            "busy": self.busy,
            "grows_without_bound": self.grows_without_bound(),
            "recommended_max_in_flight": self.recommended,
            "advice": self.advice(),
        })
    }
}

/// What the AI slots need for a burst to meet the p95 target: with `cap`
/// slots the jobs run in rounds of `cap`, each a mean AI job long, so the
/// 95th percentile participant's jobs end after `ceil(0.95 x N x jobs /
/// cap)` rounds; the target allows `floor(target / mean job)` of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BurstCapacity {
    pub participants: usize,
    pub jobs_per_participant: f64,
    pub mean_job_s: f64,
    pub cap: u32,
    pub target_p95: Duration,
    /// Rounds of AI jobs the target leaves time for.
    pub rounds: u64,
    /// The smallest cap that fits the rounds; None when not one round
    /// fits (the AI job alone takes longer than the target).
    pub recommended: Option<u32>,
}

/// The capacity a burst of `participants` needs; None when a figure is
/// missing or not positive.
pub fn burst_capacity(
    participants: usize,
    jobs_per_participant: f64,
    mean_job_s: f64,
    cap: u32,
    target_p95: Duration,
) -> Option<BurstCapacity> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if participants == 0 || !positive(jobs_per_participant) || !positive(mean_job_s) || cap == 0 {
        return None;
    }
    // A hair under: a 30 s target holds 3 rounds of exactly 10 s.
    let rounds = (target_p95.as_secs_f64() / mean_job_s + 1e-9).floor() as u64;
    let jobs = (0.95 * participants as f64 * jobs_per_participant * 1e6).round() / 1e6;
    let recommended = (rounds > 0).then(|| (jobs / rounds as f64).ceil().max(1.0) as u32);
    Some(BurstCapacity {
        participants,
        jobs_per_participant,
        mean_job_s,
        cap,
        target_p95,
        rounds,
        recommended,
    })
}

impl BurstCapacity {
    /// What would hold, when the cap is short of it; None when it is not.
    pub fn advice(&self) -> Option<String> {
        let target = seconds(self.target_p95.as_secs_f64() * 1000.0);
        let head = format!(
            "capacity: {} at once with a {:.2} s mean AI job{}",
            self.participants,
            self.mean_job_s,
            if (self.jobs_per_participant - 1.0).abs() < 0.005 {
                String::new()
            } else {
                format!(" x {:.2} jobs per participant", self.jobs_per_participant)
            }
        );
        match self.recommended {
            None => Some(format!(
                "{head}: one AI job takes longer than the p95 target of {target}; no \
                 max_in_flight meets it (a faster model, or a longer target)"
            )),
            Some(r) if r > self.cap => Some(format!(
                "{head}: the target p95 of {target} leaves time for {} round(s) of AI jobs; \
                 95 % of the burst in that many rounds needs max_in_flight >= {r} (or a second \
                 provider account, if one account cannot run that many jobs at once)",
                self.rounds
            )),
            Some(_) => None,
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "participants": self.participants,
            "jobs_per_participant": self.jobs_per_participant,
            "mean_ai_job_s": self.mean_job_s,
            "max_in_flight": self.cap,
            "rounds_in_target_p95": self.rounds,
            "recommended_max_in_flight": self.recommended,
            "advice": self.advice(),
        })
    }
}

/// Slope (per second) of the queue depth over time, least squares, of
/// `(seconds, depth)` samples; None with fewer than 2 samples or all at
/// one time.
pub fn growth_per_s(samples: &[(f64, i64)]) -> Option<f64> {
    if samples.len() < 2 {
        return None;
    }
    let n = samples.len() as f64;
    let mean_t = samples.iter().map(|s| s.0).sum::<f64>() / n;
    let mean_d = samples.iter().map(|s| s.1 as f64).sum::<f64>() / n;
    let var: f64 = samples.iter().map(|s| (s.0 - mean_t).powi(2)).sum();
    if var <= 0.0 {
        return None;
    }
    let cov: f64 = samples
        .iter()
        .map(|s| (s.0 - mean_t) * (s.1 as f64 - mean_d))
        .sum();
    Some(cov / var)
}

/// `2%`, `2 %` or `0.02` -> 0.02; between 0 and 1.
pub fn parse_share(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let share = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|x| x / 100.0),
        None => t.parse::<f64>(),
    }
    .map_err(|_| format!("{s:?} is not a share like 2% or 0.02"))?;
    if !(0.0..=1.0).contains(&share) {
        return Err(format!("{s:?}: a share between 0 % and 100 % (0 and 1)"));
    }
    Ok(share)
}

/// `41.2 s`, `30 s`, `850 ms`.
pub fn seconds(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{} s", trimmed(ms / 1000.0))
    } else {
        format!("{} ms", trimmed(ms))
    }
}

/// `5 %`, `2.5 %`.
pub fn percent(share: f64) -> String {
    format!("{} %", trimmed(share * 100.0))
}

/// One decimal, without a trailing `.0`.
fn trimmed(x: f64) -> String {
    let s = format!("{x:.1}");
    s.strip_suffix(".0").map(str::to_owned).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> Targets {
        Targets {
            p95: Duration::from_secs(30),
            p99: None,
            abort_rate: 0.02,
        }
    }

    fn measured() -> Measured {
        Measured {
            p95_ms: 1200.0,
            p99_ms: 1900.0,
            abort_rate: 0.0,
            delivery_problems: 0,
        }
    }

    #[test]
    fn within_every_target_is_go() {
        let v = verdict(&measured(), &targets());
        assert!(v.go());
        assert_eq!(
            v.line(),
            "GO: p95 1.2 s <= target 30 s; abort rate 0 % <= target 2 %; delivery problems 0 \
             <= target 0"
        );
    }

    #[test]
    fn a_slow_p95_is_no_go_and_says_so() {
        let m = Measured {
            p95_ms: 41_234.0,
            ..measured()
        };
        let v = verdict(&m, &targets());
        assert!(!v.go());
        assert_eq!(v.line(), "NO-GO: p95 41.2 s > target 30 s");
    }

    #[test]
    fn every_failed_target_is_named_and_only_those() {
        let m = Measured {
            p95_ms: 31_000.0,
            p99_ms: 90_000.0,
            abort_rate: 0.05,
            delivery_problems: 2,
        };
        let t = Targets {
            p99: Some(Duration::from_secs(60)),
            ..targets()
        };
        assert_eq!(
            verdict(&m, &t).line(),
            "NO-GO: p95 31 s > target 30 s; p99 90 s > target 60 s; abort rate 5 % > target \
             2 %; delivery problems 2 > target 0"
        );
        // Exactly at the target is within it.
        let at = Measured {
            p95_ms: 30_000.0,
            abort_rate: 0.02,
            ..measured()
        };
        assert!(verdict(&at, &targets()).go());
    }

    #[test]
    fn no_frame_at_all_is_no_go() {
        let m = Measured {
            p95_ms: f64::NAN,
            p99_ms: f64::NAN,
            ..measured()
        };
        assert_eq!(
            verdict(&m, &targets()).line(),
            "NO-GO: p95 n/a (no frame) > target 30 s"
        );
    }

    #[test]
    fn sub_second_figures_are_in_ms() {
        let m = Measured {
            p95_ms: 120.0,
            ..measured()
        };
        let t = Targets {
            p95: Duration::from_millis(50),
            ..targets()
        };
        assert_eq!(verdict(&m, &t).line(), "NO-GO: p95 120 ms > target 50 ms");
    }

    #[test]
    fn the_abort_rate_leaves_out_moderation_only() {
        assert_eq!(abort_rate(100, 1, 1, 1), 0.03);
        assert_eq!(abort_rate(40, 0, 0, 0), 0.0);
        assert_eq!(abort_rate(0, 0, 0, 0), 0.0);
    }

    #[test]
    fn littles_law_gives_the_cap() {
        // The example: 600/min, a 3 s AI, a cap of 5.
        let c = capacity(10.0, 1.0, 3.0, 5).expect("capacity");
        assert_eq!(c.needed, 30.0);
        assert_eq!(c.busy, 6.0);
        assert!(c.grows_without_bound());
        // 30 / 0.85 = 35.3: 36 keeps the slots at most 85 % busy.
        assert_eq!(c.recommended, 36);
        let advice = c.advice().expect("advice");
        assert!(
            advice.contains("at 600/min with a 3.00 s mean AI job,"),
            "{advice}"
        );
        assert!(
            advice.contains("30.0 jobs are in flight on average"),
            "{advice}"
        );
        assert!(advice.contains("grows without bound"), "{advice}");
        assert!(advice.contains("max_in_flight >= 36"), "{advice}");
        assert!(advice.contains("second provider account"), "{advice}");
    }

    #[test]
    fn fan_out_and_retries_count_as_jobs() {
        let c = capacity(2.0, 3.0, 1.5, 10).expect("capacity");
        assert_eq!(c.needed, 9.0);
        assert!(!c.grows_without_bound());
        // 9 / 0.85 = 10.6: the cap of 10 is short, though it keeps up.
        assert_eq!(c.recommended, 11);
        let advice = c.advice().expect("advice");
        assert!(advice.contains("x 3.00 jobs per participant"), "{advice}");
        assert!(advice.contains("90 % busy"), "{advice}");
    }

    #[test]
    fn enough_slots_need_no_advice() {
        let c = capacity(1.0, 1.0, 2.0, 5).expect("capacity");
        assert_eq!((c.needed, c.recommended), (2.0, 3));
        assert!(!c.grows_without_bound());
        assert_eq!(c.advice(), None);
        // Exactly at the aim is enough: no rounding up past it.
        assert_eq!(capacity(0.85, 1.0, 1.0, 1).expect("c").recommended, 1);
    }

    #[test]
    fn missing_figures_give_no_capacity() {
        assert_eq!(capacity(0.0, 1.0, 3.0, 5), None);
        assert_eq!(capacity(f64::INFINITY, 1.0, 3.0, 5), None);
        assert_eq!(capacity(10.0, 1.0, f64::NAN, 5), None);
        assert_eq!(capacity(10.0, 0.0, 3.0, 5), None);
        assert_eq!(capacity(10.0, 1.0, 3.0, 0), None);
    }

    #[test]
    fn a_burst_needs_the_rounds_the_target_allows() {
        // The stadium finale: 1,000 at once, an 8 s AI, p95 30 s: 3 rounds
        // of 8 s fit, 950 jobs in 3 rounds need 317 slots.
        let b = burst_capacity(1000, 1.0, 8.0, 100, Duration::from_secs(30)).expect("b");
        assert_eq!((b.rounds, b.recommended), (3, Some(317)));
        let advice = b.advice().expect("advice");
        assert!(
            advice.starts_with("capacity: 1000 at once with a 8.00 s mean AI job:"),
            "{advice}"
        );
        assert!(advice.contains("3 round(s)"), "{advice}");
        assert!(advice.contains("max_in_flight >= 317"), "{advice}");
        // Enough slots: no advice.
        let b = burst_capacity(1000, 1.0, 8.0, 1000, Duration::from_secs(30)).expect("b");
        assert_eq!(b.advice(), None);
        // Exactly 3 rounds of 10 s in 30 s.
        let b = burst_capacity(40, 2.0, 10.0, 5, Duration::from_secs(30)).expect("b");
        assert_eq!((b.rounds, b.recommended), (3, Some(26)));
        // The AI alone is slower than the target.
        let b = burst_capacity(40, 1.0, 0.1, 5, Duration::from_millis(50)).expect("b");
        assert_eq!((b.rounds, b.recommended), (0, None));
        assert!(b
            .advice()
            .expect("advice")
            .contains("no max_in_flight meets it"));
        assert_eq!(
            burst_capacity(0, 1.0, 8.0, 5, Duration::from_secs(30)),
            None
        );
        assert_eq!(
            burst_capacity(10, 1.0, f64::NAN, 5, Duration::from_secs(30)),
            None
        );
    }

    #[test]
    fn growth_is_the_least_squares_slope() {
        let rising: Vec<(f64, i64)> = (0..10).map(|i| (i as f64 * 0.5, i * 3)).collect();
        assert!((growth_per_s(&rising).expect("slope") - 6.0).abs() < 1e-9);
        let flat = [(0.0, 4), (1.0, 4), (2.0, 4)];
        assert_eq!(growth_per_s(&flat), Some(0.0));
        assert_eq!(growth_per_s(&[(1.0, 3)]), None);
        assert_eq!(growth_per_s(&[(1.0, 3), (1.0, 5)]), None);
    }

    #[test]
    fn shares_parse_as_percent_or_fraction() {
        assert_eq!(parse_share("2%"), Ok(0.02));
        assert_eq!(parse_share("2 %"), Ok(0.02));
        assert_eq!(parse_share("0.02"), Ok(0.02));
        assert_eq!(parse_share("0"), Ok(0.0));
        assert_eq!(parse_share("100%"), Ok(1.0));
        assert!(parse_share("150%").is_err());
        assert!(parse_share("-1%").is_err());
        assert!(parse_share("2").is_err());
        assert!(parse_share("lots").is_err());
    }

    #[test]
    fn figures_print_short() {
        assert_eq!(seconds(41_234.0), "41.2 s");
        assert_eq!(seconds(30_000.0), "30 s");
        assert_eq!(seconds(850.0), "850 ms");
        assert_eq!(percent(0.025), "2.5 %");
        assert_eq!(percent(0.02), "2 %");
    }
}
