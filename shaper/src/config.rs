//! Validated configuration of `shaper run`, built from the raw CLI arguments.
//! Everything here is checked before anything on the system changes.

use std::time::Duration;

use shaper_common::config::PacerConfig;

use crate::rate::Rate;

/// Shortest accepted horizon: below a few packet times at the slowest rate
/// the pacer would drop nearly everything.
pub const MIN_HORIZON: Duration = Duration::from_millis(10);
/// Longest accepted horizon: sch_fq's own default horizon (10 s), beyond which
/// it would drop or cap the packet itself.
pub const MAX_HORIZON: Duration = Duration::from_secs(10);

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// Horizon out of range.
    #[error("--horizon {given_ms} ms is out of range: give 10ms to 10s (default 2s)")]
    Horizon {
        /// What was given, in ms.
        given_ms: u128,
    },
}

/// What `shaper run` shapes and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunConfig {
    /// Interface to shape (egress).
    pub iface: String,
    /// Shaping rate.
    pub rate: Rate,
    /// Packets that would leave later than this are dropped by the pacer.
    pub horizon: Duration,
}

impl RunConfig {
    /// Validates the parts the types do not already guarantee.
    pub fn new(iface: String, rate: Rate, horizon: Duration) -> Result<Self, ConfigError> {
        if !(MIN_HORIZON..=MAX_HORIZON).contains(&horizon) {
            return Err(ConfigError::Horizon {
                given_ms: horizon.as_millis(),
            });
        }
        Ok(Self {
            iface,
            rate,
            horizon,
        })
    }

    /// The classifier's configuration map value.
    pub fn pacer_config(&self, has_l2_header: bool) -> PacerConfig {
        let mut c = PacerConfig::new(self.rate.bytes_per_s(), self.rate.scaled());
        // In range by validation (<= 10 s), so it fits.
        c.horizon_ns = u64::try_from(self.horizon.as_nanos()).unwrap_or(u64::MAX);
        if !has_l2_header {
            c.flags |= shaper_common::config::FLAG_NO_L2;
        }
        c
    }
}

/// Parses a duration like `2s`, `500ms`, `100us`, `1.5s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration: write e.g. 2s, 500ms or 100us"))?;
    let scale_ns = match unit {
        "s" => 1e9,
        "ms" => 1e6,
        "us" => 1e3,
        "ns" => 1.0,
        "" => return Err(format!("'{s}' has no unit: write e.g. {s}ms or {s}s")),
        _ => {
            return Err(format!(
                "'{s}' has an unknown unit '{unit}': use s, ms, us or ns"
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> Rate {
        s.parse().expect("valid rate")
    }

    #[test]
    fn horizon_is_bounded() {
        let ok = RunConfig::new("veth0".into(), rate("20mbit"), Duration::from_secs(2));
        assert!(ok.is_ok());
        for bad in [
            Duration::from_millis(9),
            Duration::from_secs(11),
            Duration::ZERO,
        ] {
            let err =
                RunConfig::new("veth0".into(), rate("20mbit"), bad).expect_err("out of range");
            assert!(err.to_string().contains("10ms to 10s"), "{err}");
        }
    }

    #[test]
    fn pacer_config_carries_rate_horizon_and_l2() {
        let c =
            RunConfig::new("v".into(), rate("20mbit"), Duration::from_millis(500)).expect("valid");
        let p = c.pacer_config(true);
        assert_eq!(p.rate_bytes_per_s, 2_500_000);
        assert_eq!(p.horizon_ns, 500_000_000);
        assert!(p.enabled());
        assert_eq!(p.scaled_rate().tx_time_ns(1500), 600_000);
        assert_eq!(p.flags & shaper_common::config::FLAG_NO_L2, 0);
        let p = c.pacer_config(false);
        assert_ne!(p.flags & shaper_common::config::FLAG_NO_L2, 0);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
        for bad in ["", "2", "s", "2 s", "2h", "-1s", "1e3s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
