//! Rates in tc(8) syntax: a decimal number and a unit, e.g. `850mbit`,
//! `0.5gbit`, `12.5mbps`.
//!
//! Units (case-insensitive, as tc's `get_rate64` in iproute2's tc_util.c):
//! bits per second `bit`, `kbit`, `mbit`, `gbit`, `tbit` (powers of 1000),
//! `kibit`, `mibit`, `gibit`, `tibit` (powers of 1024); bytes per second
//! `bps`, `kbps`, `mbps`, `gbps`, `tbps`, `kibps`, `mibps`, `gibps`, `tibps`.
//! Unlike tc, a bare number is refused: `--rate 850` would mean 850 bit/s to
//! tc, which is never what a router operator means.
//!
//! Invariant: a [`Rate`] lies within 1 kbit/s ..= 1 Tbit/s. Parsing is exact
//! (integer arithmetic on the decimal digits, no floating point); a result that
//! is not a whole number of bits per second is rounded to the nearest bit.

use std::{fmt, str::FromStr};

use shaper_common::rate::{MAX_RATE_BYTES_PER_S, MIN_RATE_BYTES_PER_S, ScaledRate};

/// A validated shaping rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rate {
    bits_per_s: u64,
}

/// Why a rate string was refused. Each message names the fix.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RateError {
    /// Empty input.
    #[error("the rate is empty: give a number and a unit, e.g. 850mbit")]
    Empty,
    /// A leading minus sign.
    #[error("'{input}' is negative: a rate must be positive, e.g. 850mbit")]
    Negative {
        /// What was given.
        input: String,
    },
    /// Not a decimal number followed by a unit.
    #[error(
        "'{input}' is not a rate: expected a decimal number followed by a unit \
         (bit, kbit, mbit, gbit, tbit, or bps, kbps, mbps, gbps, tbps), e.g. 850mbit"
    )]
    Unparsable {
        /// What was given.
        input: String,
    },
    /// A number with no unit.
    #[error(
        "'{input}' has no unit: write e.g. {input}mbit or {input}kbit (tc would read it as bit/s)"
    )]
    MissingUnit {
        /// What was given.
        input: String,
    },
    /// A unit tc does not know.
    #[error(
        "'{input}' has an unknown unit '{unit}': use bit, kbit, mbit, gbit, tbit, \
         or bps, kbps, mbps, gbps, tbps"
    )]
    UnknownUnit {
        /// What was given.
        input: String,
        /// The unit part.
        unit: String,
    },
    /// Zero, or below 1 kbit/s.
    #[error("'{input}' is too slow: the shaper accepts 1kbit to 1tbit")]
    TooSlow {
        /// What was given.
        input: String,
    },
    /// Above 1 Tbit/s.
    #[error("'{input}' is too fast: the shaper accepts 1kbit to 1tbit")]
    TooFast {
        /// What was given.
        input: String,
    },
}

/// Bits per second per unit. Matched case-insensitively, longest first is not
/// needed: the whole suffix must match one entry.
const UNITS: &[(&str, u128)] = &[
    ("bit", 1),
    ("kbit", 1_000),
    ("mbit", 1_000_000),
    ("gbit", 1_000_000_000),
    ("tbit", 1_000_000_000_000),
    ("kibit", 1 << 10),
    ("mibit", 1 << 20),
    ("gibit", 1 << 30),
    ("tibit", 1 << 40),
    ("bps", 8),
    ("kbps", 8_000),
    ("mbps", 8_000_000),
    ("gbps", 8_000_000_000),
    ("tbps", 8_000_000_000_000),
    ("kibps", 8 << 10),
    ("mibps", 8 << 20),
    ("gibps", 8 << 30),
    ("tibps", 8 << 40),
];

/// Most fractional digits kept; more cannot change the result by a bit at
/// any unit up to Tibit (2^40 < 10^13) once rounded.
const MAX_FRACTION_DIGITS: u32 = 18;

impl Rate {
    /// The slowest accepted rate.
    pub const MIN: Rate = Rate {
        bits_per_s: MIN_RATE_BYTES_PER_S * 8,
    };
    /// The fastest accepted rate.
    pub const MAX: Rate = Rate {
        bits_per_s: MAX_RATE_BYTES_PER_S * 8,
    };

    /// A rate from bits per second, if within range.
    pub const fn from_bits_per_s(bits_per_s: u64) -> Option<Rate> {
        if bits_per_s >= Self::MIN.bits_per_s && bits_per_s <= Self::MAX.bits_per_s {
            Some(Rate { bits_per_s })
        } else {
            None
        }
    }

    /// Bits per second.
    pub fn bits_per_s(self) -> u64 {
        self.bits_per_s
    }

    /// Bytes per second, rounded to nearest.
    pub fn bytes_per_s(self) -> u64 {
        (self.bits_per_s + 4) / 8
    }

    /// The rate in the packet path's fixed-point form.
    pub fn scaled(self) -> ScaledRate {
        // In range by construction, so the conversion cannot fail; fall back
        // to the bound rather than panic.
        ScaledRate::from_bytes_per_s(
            self.bytes_per_s()
                .clamp(MIN_RATE_BYTES_PER_S, MAX_RATE_BYTES_PER_S),
        )
        .unwrap_or(ScaledRate {
            ns_per_byte_scaled: 1,
            shift: 31,
        })
    }
}

impl FromStr for Rate {
    type Err = RateError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let s = input.trim();
        if s.is_empty() {
            return Err(RateError::Empty);
        }
        if s.starts_with('-') {
            return Err(RateError::Negative {
                input: input.to_owned(),
            });
        }
        let s = s.strip_prefix('+').unwrap_or(s);
        let num_end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, unit) = s.split_at(num_end);
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let digits_ok = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
        if (int_part.is_empty() && frac_part.is_empty())
            || !digits_ok(int_part)
            || !digits_ok(frac_part)
        {
            return Err(RateError::Unparsable {
                input: input.to_owned(),
            });
        }
        if unit.is_empty() {
            return Err(RateError::MissingUnit {
                input: input.to_owned(),
            });
        }
        let Some(&(_, scale)) = UNITS.iter().find(|(u, _)| u.eq_ignore_ascii_case(unit)) else {
            return Err(RateError::UnknownUnit {
                input: input.to_owned(),
                unit: unit.to_owned(),
            });
        };
        let too_fast = || RateError::TooFast {
            input: input.to_owned(),
        };
        // Integer part: anything beyond 20 significant digits is far too fast.
        let int_digits = int_part.trim_start_matches('0');
        if int_digits.len() > 20 {
            return Err(too_fast());
        }
        let int_value: u128 = if int_digits.is_empty() {
            0
        } else {
            int_digits.parse().map_err(|_| too_fast())?
        };
        let frac = &frac_part[..frac_part.len().min(MAX_FRACTION_DIGITS as usize)];
        let frac_value: u128 = if frac.is_empty() {
            0
        } else {
            frac.parse().map_err(|_| RateError::Unparsable {
                input: input.to_owned(),
            })?
        };
        let denom = 10u128.pow(frac.len() as u32);
        let whole = int_value.checked_mul(scale).ok_or_else(too_fast)?;
        // frac_value < 10^18 and scale < 2^44, so the product fits in u128.
        let fraction_bits = (frac_value * scale + denom / 2) / denom;
        let bits = whole.checked_add(fraction_bits).ok_or_else(too_fast)?;
        if bits < u128::from(Self::MIN.bits_per_s) {
            return Err(RateError::TooSlow {
                input: input.to_owned(),
            });
        }
        if bits > u128::from(Self::MAX.bits_per_s) {
            return Err(too_fast());
        }
        // In range, so it fits in u64.
        u64::try_from(bits)
            .ok()
            .and_then(Rate::from_bits_per_s)
            .ok_or_else(too_fast)
    }
}

impl fmt::Display for Rate {
    /// Formats exactly, in the largest decimal unit that needs at most three
    /// decimals (`850Mbit`, `1.5Gbit`, `1234.567Kbit`), so it parses back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bits_per_s;
        let units = [
            ("Tbit", 1_000_000_000_000u64),
            ("Gbit", 1_000_000_000),
            ("Mbit", 1_000_000),
            ("Kbit", 1_000),
        ];
        for (unit, scale) in units {
            let milli_unit = scale / 1000;
            if b >= scale && b.is_multiple_of(milli_unit) {
                let milli = b / milli_unit;
                let text = format!("{}.{:03}", milli / 1000, milli % 1000);
                let text = text.trim_end_matches('0').trim_end_matches('.');
                return write!(f, "{text}{unit}");
            }
        }
        write!(f, "{b}bit")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_inputs() {
        let table: &[(&str, u64)] = &[
            ("850mbit", 850_000_000),
            ("850Mbit", 850_000_000),
            ("850MBIT", 850_000_000),
            ("0.5gbit", 500_000_000),
            (".5gbit", 500_000_000),
            ("1kbit", 1_000),
            ("1000bit", 1_000),
            ("1tbit", 1_000_000_000_000),
            ("20mbit", 20_000_000),
            ("12.5mbps", 100_000_000),
            ("125bps", 1_000),
            ("1kbps", 8_000),
            ("1gbps", 8_000_000_000),
            ("1mibit", 1_048_576),
            ("1kibps", 8_192),
            ("1.25gbit", 1_250_000_000),
            ("0.000001tbit", 1_000_000),
            ("  20mbit ", 20_000_000),
            ("+20mbit", 20_000_000),
            ("1.0000000000000000001gbit", 1_000_000_000),
            ("007mbit", 7_000_000),
        ];
        for &(input, bits) in table {
            let r: Rate = input.parse().unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(r.bits_per_s(), bits, "{input}");
        }
    }

    #[test]
    fn bad_inputs() {
        use RateError::*;
        let s = |x: &str| x.to_owned();
        let table: Vec<(&str, RateError)> = vec![
            ("", Empty),
            ("   ", Empty),
            ("0mbit", TooSlow { input: s("0mbit") }),
            ("0", MissingUnit { input: s("0") }),
            ("-5mbit", Negative { input: s("-5mbit") }),
            ("850", MissingUnit { input: s("850") }),
            ("mbit", Unparsable { input: s("mbit") }),
            (
                "85O mbit",
                UnknownUnit {
                    input: s("85O mbit"),
                    unit: s("O mbit"),
                },
            ),
            (
                "1.2.3mbit",
                Unparsable {
                    input: s("1.2.3mbit"),
                },
            ),
            (".mbit", Unparsable { input: s(".mbit") }),
            (
                "10 mbit",
                UnknownUnit {
                    input: s("10 mbit"),
                    unit: s(" mbit"),
                },
            ),
            (
                "10furlongs",
                UnknownUnit {
                    input: s("10furlongs"),
                    unit: s("furlongs"),
                },
            ),
            ("999bit", TooSlow { input: s("999bit") }),
            (
                "0.9kbit",
                TooSlow {
                    input: s("0.9kbit"),
                },
            ),
            (
                "1.000001tbit",
                TooFast {
                    input: s("1.000001tbit"),
                },
            ),
            ("2tbit", TooFast { input: s("2tbit") }),
            ("1tbps", TooFast { input: s("1tbps") }),
            (
                "99999999999999999999999999999gbit",
                TooFast {
                    input: s("99999999999999999999999999999gbit"),
                },
            ),
            (
                "1e6bit",
                UnknownUnit {
                    input: s("1e6bit"),
                    unit: s("e6bit"),
                },
            ),
            (
                "nanmbit",
                Unparsable {
                    input: s("nanmbit"),
                },
            ),
        ];
        for (input, want) in table {
            assert_eq!(input.parse::<Rate>(), Err(want), "{input:?}");
        }
    }

    #[test]
    fn errors_name_the_fix() {
        let e = "850".parse::<Rate>().expect_err("bare number");
        assert!(e.to_string().contains("850mbit"), "{e}");
        let e = "2tbit".parse::<Rate>().expect_err("too fast");
        assert!(e.to_string().contains("1kbit to 1tbit"), "{e}");
    }

    #[test]
    fn display_round_trips() {
        for input in [
            "850mbit",
            "1.5gbit",
            "64kbit",
            "1tbit",
            "1kbit",
            "1234567bit",
            "20mbit",
        ] {
            let r: Rate = input.parse().expect("good");
            let shown = r.to_string();
            let back: Rate = shown.parse().expect("display parses");
            assert_eq!(back, r, "{input} -> {shown}");
        }
        assert_eq!(
            "850mbit".parse::<Rate>().expect("good").to_string(),
            "850Mbit"
        );
        assert_eq!(
            "1.5gbit".parse::<Rate>().expect("good").to_string(),
            "1.5Gbit"
        );
    }

    #[test]
    fn bytes_and_scaled_agree() {
        let r: Rate = "20mbit".parse().expect("good");
        assert_eq!(r.bytes_per_s(), 2_500_000);
        assert_eq!(r.scaled().tx_time_ns(1500), 600_000);
    }
}

/// The rate parser under arbitrary input: no panic, and every error names
/// what it was given.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::Rate;

    proptest! {
        #[test]
        fn rates_never_panic_and_errors_name_the_input(s in "\\PC{0,40}") {
            if let Err(e) = s.parse::<Rate>() {
                let shown = e.to_string();
                prop_assert!(
                    s.trim().is_empty() || shown.contains(s.trim()),
                    "{shown:?} does not name {s:?}"
                );
            }
        }

        #[test]
        fn near_miss_rates_never_panic(n in "-?[0-9.]{0,30}", u in "(kbit|mbit|gbit|tbit|bit|mbps|kbps|bps|k|)") {
            let _ = format!("{n}{u}").parse::<Rate>();
        }
    }
}
