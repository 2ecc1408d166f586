//! The units people type in flags and files: durations (`250ms`, `10s`,
//! `7m`) and rate limits (`30/min`, `off`). The lowest floor above the
//! domain: the configuration, the providers file and the HTTP limits read
//! them, and it reads none of them.

use std::num::NonZeroU32;
use std::time::Duration;

/// Parses `250ms`, `10s`, `7m`, `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration like 250ms, 10s or 7m: {e}"))
}

/// A rate limit: at most `count` requests per `per` for one key, in one
/// burst or spread out (GCRA: one request comes back every `per / count`),
/// or no limit at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimit {
    Off,
    Every { count: NonZeroU32, per: Duration },
}

/// Parses `30/min`, `10/s`, `1000/h`, `5/90s`, or `off`.
pub fn parse_rate_limit(s: &str) -> Result<RateLimit, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") {
        return Ok(RateLimit::Off);
    }
    let bad = || format!("{s:?} is not a rate limit like 30/min, 10/s, 5/90s or off");
    let (count, per) = s.split_once('/').ok_or_else(bad)?;
    let count: u32 = count.trim().parse().map_err(|_| bad())?;
    let count = NonZeroU32::new(count)
        .ok_or_else(|| format!("{s:?}: a limit of 0 refuses everything; use off for no limit"))?;
    let per = per.trim();
    // `min` means `1min`.
    let per = if per.starts_with(|c: char| c.is_ascii_digit()) {
        parse_duration(per)
    } else {
        parse_duration(&format!("1{per}"))
    }
    .map_err(|_| bad())?;
    if (per / count.get()).is_zero() {
        return Err(format!("{s:?} allows more than one request per nanosecond"));
    }
    Ok(RateLimit::Every { count, per })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_human_form() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("7m"), Ok(Duration::from_secs(420)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn rate_limits_in_human_form() {
        let every = |count: u32, secs: u64| RateLimit::Every {
            count: NonZeroU32::new(count).unwrap(),
            per: Duration::from_secs(secs),
        };
        assert_eq!(parse_rate_limit("30/min"), Ok(every(30, 60)));
        assert_eq!(parse_rate_limit(" 10/s "), Ok(every(10, 1)));
        assert_eq!(parse_rate_limit("1000/h"), Ok(every(1000, 3600)));
        assert_eq!(parse_rate_limit("5/90s"), Ok(every(5, 90)));
        assert_eq!(parse_rate_limit("OFF"), Ok(RateLimit::Off));
        for bad in [
            "",
            "30",
            "0/min",
            "-1/min",
            "x/min",
            "30/fortnight",
            "30/0s",
        ] {
            assert!(parse_rate_limit(bad).is_err(), "{bad}");
        }
    }
}
