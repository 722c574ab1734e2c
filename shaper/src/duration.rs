//! Durations on the command line: one syntax for every command and flag,
//! a number and a unit (`ns`, `us`, `ms`, `s`, `m`, `h`), and the help text
//! that says so under every `--help`.
//!
//! Invariant: a bare number is refused rather than guessed (tc reads one as
//! microseconds, people as seconds). Each flag checks its own range after
//! [`parse_duration`]; the ranges shared by several commands live here.
//! Non-goals: calendar units, sums such as `1m30s`.

use std::time::Duration;

/// The one duration rule, printed under every `--help`.
pub const DURATION_HELP: &str = "Every DURATION is a number and a unit: h, m, s, ms, us or ns \
     (10s, 500ms, 1.5s, 10m). A bare number is refused.";

/// The one duration syntax of every command and flag (`--help` says it
/// too): a number and a unit, `ns`, `us`, `ms`, `s`, `m` or `h` (`2s`,
/// `500ms`, `1.5s`, `10m`). A bare number is refused rather than guessed:
/// tc reads one as microseconds, people as seconds. Each flag checks its own
/// range after this.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration: write e.g. 2s, 500ms or 10m"))?;
    let scale_ns = match unit {
        "h" => 3600e9,
        "m" => 60e9,
        "s" => 1e9,
        "ms" => 1e6,
        "us" => 1e3,
        "ns" => 1.0,
        "" => return Err(format!("'{s}' has no unit: write e.g. {s}s or {s}ms")),
        _ => {
            return Err(format!(
                "'{s}' has an unknown unit '{unit}': use h, m, s, ms, us or ns"
            ));
        }
    };
    let ns = value * scale_ns;
    if !ns.is_finite() || !(0.0..=1e18).contains(&ns) {
        return Err(format!("'{s}' is out of range"));
    }
    // Bounded above, so the cast is exact enough and cannot wrap.
    Ok(Duration::from_nanos(ns.round() as u64))
}

/// A command's `--duration` (how long `trace` or the lab runs) in the one
/// syntax: 1 ms to one year.
pub fn parse_run_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(1) || d > Duration::from_secs(366 * 86_400) {
        return Err(format!(
            "'{s}' is out of range: give 1ms to 1 year, e.g. --duration 10s"
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        let bare = parse_duration("10").expect_err("a bare number");
        assert!(bare.contains("no unit") && bare.contains("10s"), "{bare}");
        for bad in ["", "2", "s", "2 s", "2d", "-1s", "1e3s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn run_durations_are_bounded() {
        assert_eq!(parse_run_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_run_duration("500ms"), Ok(Duration::from_millis(500)));
        for bad in ["0", "0s", "10", "-1", "abc", "10 parsecs", "2000y"] {
            let e = parse_run_duration(bad).expect_err(bad);
            assert!(e.contains(bad.trim()) || e.contains("unit"), "{bad}: {e}");
        }
    }
}

/// The parsers under arbitrary input: no panic, and every error names what
/// it was given.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::parse_duration;

    proptest! {
        #[test]
        fn durations_never_panic_and_errors_name_the_input(s in "\\PC{0,40}") {
            if let Err(e) = parse_duration(&s) {
                prop_assert!(e.contains(s.trim()), "{e:?} does not name {s:?}");
            }
        }

        #[test]
        fn near_miss_durations_never_panic(n in "[0-9.]{0,25}", u in "(h|m|s|ms|us|ns|x|)") {
            let s = format!("{n}{u}");
            if let Err(e) = parse_duration(&s) {
                prop_assert!(e.contains(s.trim()), "{e:?} does not name {s:?}");
            }
        }
    }
}
