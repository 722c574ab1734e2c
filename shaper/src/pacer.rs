//! The pacer's settings as the user gives them (`--pacer`, `--target`,
//! `--interval`, `--rtt`, `--flows`, `--no-ecn`), validated and resolved into
//! what the classifier and sch_fq need.
//!
//! AQM timing follows CAKE's rules (sch_cake.c, `cake_set_rate` and the
//! `rtt` presets of tc-cake(8)): `--rtt R` sets interval R and target R/20;
//! at low rates the target is raised to 1.5 transmission times of a
//! full-size frame, and the interval by the same amount (at least twice the
//! target), so a single packet in flight is never treated as a standing
//! queue.
//!
//! Units are in names. Non-goals: per-tin settings, weights.

use std::time::Duration;

use shaper_common::{
    codel::MAX_INTERVAL_NS,
    config::{DEFAULT_INTERVAL_NS, DEFAULT_TARGET_NS},
    flow::{DEFAULT_FLOWS, WAYS},
    framing::{Framing, FramingError},
    hosts::Isolation,
    tins::Diffserv,
};

use crate::rate::Rate;

/// Which pacer the classifier runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PacerKind {
    /// Per-flow departure clocks at a fair share, CoDel on each flow.
    Fair,
    /// One clock for all traffic (Cilium's Bandwidth Manager design); kept
    /// for comparison, it has no flow isolation and no AQM.
    Aggregate,
}

/// The DiffServ tins, as CAKE's keywords name them
/// (`shaper_common::tins`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DiffservArg {
    /// One tin for everything.
    #[default]
    Besteffort,
    /// Bulk (LE, CS1) at 1/16, best effort, voice (EF, VA, CS6, CS7,
    /// TOS4) at 1/4 of the rate.
    Diffserv3,
    /// Bulk (LE, CS1) at 1/16, best effort, video (AF2x-AF4x, CS2, CS3,
    /// TOS4) at 1/2, voice (EF, VA, CS4-CS7) at 1/4 of the rate.
    Diffserv4,
    /// Eight tins, thresholds falling by 7/8 from tin to tin.
    Diffserv8,
}

/// How hosts are isolated, as CAKE's keywords name the modes
/// (`shaper_common::hosts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum IsolateArg {
    /// Flows share equally, whatever their hosts.
    #[default]
    Flows,
    /// A flow is its source address.
    Srchost,
    /// A flow is its destination address.
    Dsthost,
    /// A flow is its address pair.
    Hosts,
    /// Source hosts share first, then their flows.
    #[value(name = "dual-srchost")]
    DualSrchost,
    /// Destination hosts share first, then their flows.
    #[value(name = "dual-dsthost")]
    DualDsthost,
    /// The link's own side's hosts share first (sources on upload,
    /// destinations on download), then flows, each weighed by the busier of
    /// its two hosts.
    #[value(name = "triple-isolate")]
    TripleIsolate,
}

impl From<IsolateArg> for Isolation {
    fn from(a: IsolateArg) -> Self {
        match a {
            IsolateArg::Flows => Isolation::Flows,
            IsolateArg::Srchost => Isolation::SrcHost,
            IsolateArg::Dsthost => Isolation::DstHost,
            IsolateArg::Hosts => Isolation::Hosts,
            IsolateArg::DualSrchost => Isolation::DualSrcHost,
            IsolateArg::DualDsthost => Isolation::DualDstHost,
            IsolateArg::TripleIsolate => Isolation::TripleIsolate,
        }
    }
}

impl From<DiffservArg> for Diffserv {
    fn from(d: DiffservArg) -> Self {
        match d {
            DiffservArg::Besteffort => Diffserv::Besteffort,
            DiffservArg::Diffserv3 => Diffserv::Diffserv3,
            DiffservArg::Diffserv4 => Diffserv::Diffserv4,
            DiffservArg::Diffserv8 => Diffserv::Diffserv8,
        }
    }
}

/// The fewest and most flows the table may hold.
pub const MIN_FLOWS: u32 = 64;
/// See [`MIN_FLOWS`]; 1M flows take 64 MiB of map memory.
pub const MAX_FLOWS: u32 = 1 << 20;
/// Bytes of the full-size frame the AQM timing is derived from.
const MTU_FRAME_BYTES: u32 = 1514;

/// The `--rtt` presets, CAKE's names and values.
pub const RTT_PRESETS: [(&str, Duration); 7] = [
    ("datacentre", Duration::from_micros(100)),
    ("lan", Duration::from_millis(1)),
    ("metro", Duration::from_millis(10)),
    ("regional", Duration::from_millis(30)),
    ("internet", Duration::from_millis(100)),
    ("oceanic", Duration::from_millis(300)),
    ("satellite", Duration::from_millis(1000)),
];

/// Why pacer settings were refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PacerError {
    /// The interval does not fit the control law's fixed point.
    #[error("--interval (or --rtt) {given_ms} ms is out of range: give 1ms to 4s (default 100ms)")]
    Interval {
        /// What resulted, in ms.
        given_ms: u128,
    },
    /// The target is out of range or not below the interval.
    #[error(
        "--target {target_us} us must be at least 10us and below the interval ({interval_us} us); \
         the default is 5ms with a 100ms interval"
    )]
    Target {
        /// Target in µs.
        target_us: u128,
        /// Interval in µs.
        interval_us: u128,
    },
    /// Flow table size out of range.
    #[error("--flows {given} is out of range: give 64 to 1048576 (default 65536)")]
    Flows {
        /// What was given.
        given: u64,
    },
    /// A framing keyword CAKE does not name.
    #[error(
        "--framing {given:?} is not one of CAKE's keywords: give {known} (comma-separated, \
         e.g. --framing pppoe-ptm,ether-vlan), or --overhead N"
    )]
    FramingKeyword {
        /// What was given.
        given: String,
        /// The keywords there are.
        known: String,
    },
    /// The overhead, given or added up, is out of CAKE's range.
    #[error("the overhead comes to {bytes} bytes, outside -64 to 256: give --overhead within it")]
    Overhead {
        /// What it came to.
        bytes: i64,
    },
    /// The mpu is out of CAKE's range.
    #[error("--mpu {bytes} is out of range: give 0 to 256")]
    Mpu {
        /// What was given.
        bytes: u32,
    },
    /// AQM settings given to the aggregate pacer, which has no AQM.
    #[error("--{flag} applies to the fair pacer only: drop it, or drop --pacer aggregate")]
    NotForAggregate {
        /// The flag's name.
        flag: &'static str,
    },
}

/// The pacer settings as given on the command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PacerArgs {
    /// `--pacer`; fair when absent.
    pub kind: Option<PacerKind>,
    /// `--target`.
    pub target: Option<Duration>,
    /// `--interval`.
    pub interval: Option<Duration>,
    /// `--rtt`.
    pub rtt: Option<Duration>,
    /// `--flows`.
    pub flows: Option<u64>,
    /// `--no-ecn`.
    pub no_ecn: bool,
    /// `--diffserv`; besteffort when absent.
    pub diffserv: Option<DiffservArg>,
    /// `--wash`.
    pub wash: bool,
    /// `--isolate`; flows when absent.
    pub isolate: Option<IsolateArg>,
    /// `--framing`, `--overhead`, `--mpu`; the keywords end with `atm`
    /// or `ptm` for `--atm`, `--ptm`.
    pub framing: FramingArgs,
}

/// The link's framing as given: `run`'s and `lab`'s flags alike.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct FramingArgs {
    /// The link's framing by CAKE's keywords, comma-separated, which add
    /// up as in tc: ethernet, ether-vlan, docsis, pppoe-ptm, bridged-ptm,
    /// pppoa-vcmux, pppoa-llc, pppoe-vcmux, pppoe-llcsnap, bridged-vcmux,
    /// bridged-llcsnap, ipoa-vcmux, ipoa-llcsnap, conservative, atm, ptm,
    /// noatm, raw. Every rate (egress, ingress) then counts packets as the
    /// link does.
    #[arg(long = "framing", value_name = "KEYWORDS", value_delimiter = ',')]
    pub keywords: Vec<String>,
    /// Bytes each packet costs on the link beyond its IP packet (-64 to
    /// 256, as CAKE's `overhead`); replaces what --framing adds up.
    #[arg(long, value_name = "BYTES", allow_hyphen_values = true)]
    pub overhead: Option<i32>,
    /// The least a packet costs on the link, overhead included (0 to 256,
    /// as CAKE's `mpu`).
    #[arg(long, value_name = "BYTES")]
    pub mpu: Option<u16>,
}

impl FramingArgs {
    /// No framing given.
    pub fn is_empty(&self) -> bool {
        self.keywords.is_empty() && self.overhead.is_none() && self.mpu.is_none()
    }

    /// The framing these describe ([`Framing::from_keywords`]), or why not.
    pub fn resolve(&self) -> Result<Framing, PacerError> {
        Framing::from_keywords(
            self.keywords.iter().map(String::as_str),
            self.overhead,
            self.mpu,
        )
        .map_err(|e| match e {
            FramingError::UnknownKeyword(at) => PacerError::FramingKeyword {
                given: self.keywords.get(at).cloned().unwrap_or_default(),
                known: Framing::keyword_names().collect::<Vec<_>>().join(", "),
            },
            FramingError::Overhead(bytes) => PacerError::Overhead { bytes },
            FramingError::Mpu(bytes) => PacerError::Mpu { bytes },
        })
    }

    /// The same flags for `shaper run`.
    pub fn shaper_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if !self.keywords.is_empty() {
            a.extend(["--framing".to_owned(), self.keywords.join(",")]);
        }
        if let Some(o) = self.overhead {
            a.extend(["--overhead".to_owned(), o.to_string()]);
        }
        if let Some(m) = self.mpu {
            a.extend(["--mpu".to_owned(), m.to_string()]);
        }
        a
    }

    /// The same as CAKE's options.
    pub fn cake_options(&self) -> Vec<String> {
        let mut a = self.keywords.clone();
        if let Some(o) = self.overhead {
            a.extend(["overhead".to_owned(), o.to_string()]);
        }
        if let Some(m) = self.mpu {
            a.extend(["mpu".to_owned(), m.to_string()]);
        }
        a
    }
}

/// Resolved pacer settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacerSettings {
    /// Which pacer.
    pub kind: PacerKind,
    /// CoDel target, after the low-rate adjustment.
    pub target_ns: u64,
    /// CoDel interval, after the low-rate adjustment.
    pub interval_ns: u64,
    /// Flows the table holds: a power of two, a multiple of the ways.
    pub flows: u32,
    /// CE-mark ECN-capable packets instead of dropping them.
    pub ecn: bool,
    /// The DiffServ tins.
    pub diffserv: Diffserv,
    /// Clear each packet's DSCP once its tin is chosen.
    pub wash: bool,
    /// How the link frames packets.
    pub framing: Framing,
    /// How hosts are isolated.
    pub isolation: Isolation,
}

impl PacerSettings {
    /// Validates `args` for `rate`.
    pub fn resolve(args: &PacerArgs, rate: Rate) -> Result<Self, PacerError> {
        let kind = args.kind.unwrap_or(PacerKind::Fair);
        let framing = args.framing.resolve()?;
        if kind == PacerKind::Aggregate {
            for (given, flag) in [
                (args.target.is_some(), "target"),
                (args.interval.is_some(), "interval"),
                (args.rtt.is_some(), "rtt"),
                (args.flows.is_some(), "flows"),
                (args.no_ecn, "no-ecn"),
                (
                    args.diffserv.is_some_and(|d| d != DiffservArg::Besteffort),
                    "diffserv",
                ),
                (
                    args.isolate.is_some_and(|i| i != IsolateArg::Flows),
                    "isolate",
                ),
            ] {
                if given {
                    return Err(PacerError::NotForAggregate { flag });
                }
            }
        }
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let (target_ns, interval_ns) = match args.rtt {
            Some(rtt) => (ns(rtt) / 20, ns(rtt)),
            None => (
                args.target.map_or(DEFAULT_TARGET_NS, ns),
                args.interval.map_or(DEFAULT_INTERVAL_NS, ns),
            ),
        };
        if !(1_000_000..=4_000_000_000).contains(&interval_ns) && args.rtt.is_none() {
            return Err(PacerError::Interval {
                given_ms: u128::from(interval_ns / 1_000_000),
            });
        }
        if target_ns < 10_000 && args.rtt.is_none() || target_ns >= interval_ns {
            return Err(PacerError::Target {
                target_us: u128::from(target_ns / 1_000),
                interval_us: u128::from(interval_ns / 1_000),
            });
        }
        // CAKE's low-rate rule: at least 1.5 frame times of target.
        let frame_ns = rate.scaled().tx_time_ns(MTU_FRAME_BYTES);
        let target_eff = target_ns.max(frame_ns * 3 / 2);
        let interval_eff = (interval_ns + (target_eff - target_ns)).max(2 * target_eff);
        if interval_eff >= MAX_INTERVAL_NS || interval_eff > 4_000_000_000 {
            return Err(PacerError::Interval {
                given_ms: u128::from(interval_eff / 1_000_000),
            });
        }
        let flows = args.flows.unwrap_or(u64::from(DEFAULT_FLOWS));
        if !(u64::from(MIN_FLOWS)..=u64::from(MAX_FLOWS)).contains(&flows) {
            return Err(PacerError::Flows { given: flows });
        }
        // In range, so it fits; rounded up to a power of two (>= WAYS).
        let flows = (flows as u32).next_power_of_two().max(WAYS as u32);
        Ok(Self {
            kind,
            target_ns: target_eff,
            interval_ns: interval_eff,
            flows,
            ecn: !args.no_ecn,
            diffserv: args.diffserv.unwrap_or_default().into(),
            wash: args.wash,
            framing,
            isolation: args.isolate.unwrap_or_default().into(),
        })
    }

    /// Sets of the flow table.
    pub fn flow_sets(&self) -> u32 {
        self.flows / WAYS as u32
    }
}

/// Parses `--rtt`: a preset name or a duration.
pub fn parse_rtt(s: &str) -> Result<Duration, String> {
    if let Some((_, d)) = RTT_PRESETS.iter().find(|(n, _)| *n == s) {
        return Ok(*d);
    }
    crate::duration::parse_duration(s).map_err(|e| {
        let names: Vec<&str> = RTT_PRESETS.iter().map(|(n, _)| *n).collect();
        format!("{e}, or a preset: {}", names.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> Rate {
        s.parse().expect("valid rate")
    }

    #[test]
    fn defaults_are_rfc_8289s_at_ordinary_rates() {
        let s = PacerSettings::resolve(&PacerArgs::default(), rate("50mbit")).expect("valid");
        assert_eq!(s.kind, PacerKind::Fair);
        assert_eq!((s.target_ns, s.interval_ns), (5_000_000, 100_000_000));
        assert_eq!(s.flows, 65_536);
        assert!(s.ecn);
    }

    #[test]
    fn low_rates_raise_target_and_interval_as_cake_does() {
        // 1 mbit: a 1514-byte frame takes 12.112 ms; target 18.168 ms.
        let s = PacerSettings::resolve(&PacerArgs::default(), rate("1mbit")).expect("valid");
        assert_eq!(s.target_ns, 18_168_000);
        assert_eq!(s.interval_ns, 100_000_000 + 13_168_000);
    }

    #[test]
    fn rtt_presets_and_durations() {
        let args = PacerArgs {
            rtt: Some(parse_rtt("metro").expect("preset")),
            ..PacerArgs::default()
        };
        let s = PacerSettings::resolve(&args, rate("1gbit")).expect("valid");
        assert_eq!((s.target_ns, s.interval_ns), (500_000, 10_000_000));
        assert_eq!(parse_rtt("20ms"), Ok(Duration::from_millis(20)));
        let err = parse_rtt("moon").expect_err("unknown");
        assert!(err.contains("satellite"), "{err}");
    }

    #[test]
    fn bad_settings_name_the_flag() {
        let bad = |args: PacerArgs| {
            PacerSettings::resolve(&args, rate("50mbit"))
                .expect_err("invalid")
                .to_string()
        };
        let e = bad(PacerArgs {
            interval: Some(Duration::from_secs(5)),
            ..PacerArgs::default()
        });
        assert!(e.contains("--interval"), "{e}");
        let e = bad(PacerArgs {
            target: Some(Duration::from_millis(200)),
            ..PacerArgs::default()
        });
        assert!(e.contains("--target"), "{e}");
        let e = bad(PacerArgs {
            flows: Some(10),
            ..PacerArgs::default()
        });
        assert!(e.contains("--flows"), "{e}");
        let e = bad(PacerArgs {
            kind: Some(PacerKind::Aggregate),
            target: Some(Duration::from_millis(5)),
            ..PacerArgs::default()
        });
        assert!(e.contains("fair pacer only"), "{e}");
        let e = bad(PacerArgs {
            kind: Some(PacerKind::Aggregate),
            diffserv: Some(DiffservArg::Diffserv4),
            ..PacerArgs::default()
        });
        assert!(
            e.contains("--diffserv") && e.contains("fair pacer only"),
            "{e}"
        );
    }

    /// Framing keywords resolve as CAKE's; a bad one, or an overhead or
    /// mpu out of CAKE's range, names the flag and the fix.
    #[test]
    fn framing_resolves_and_bad_framing_names_the_fix() {
        let args = |words: &[&str], overhead, mpu| PacerArgs {
            framing: FramingArgs {
                keywords: words.iter().map(|w| (*w).to_owned()).collect(),
                overhead,
                mpu,
            },
            ..PacerArgs::default()
        };
        let ok = |a: PacerArgs| PacerSettings::resolve(&a, rate("50mbit")).expect("valid");
        assert!(ok(PacerArgs::default()).framing.is_raw());
        let f = ok(args(&["pppoe-ptm", "ether-vlan"], None, None)).framing;
        assert_eq!((f.overhead_bytes, f.ptm, f.from_l3), (34, 1, 1));
        let f = ok(args(&["atm"], Some(40), Some(64))).framing;
        assert_eq!((f.overhead_bytes, f.mpu_bytes, f.atm), (40, 64, 1));
        let f = ok(PacerArgs {
            kind: Some(PacerKind::Aggregate),
            ..args(&["ethernet"], None, None)
        })
        .framing;
        assert_eq!((f.overhead_bytes, f.mpu_bytes), (38, 84), "both pacers");
        let bad = |a: PacerArgs| {
            PacerSettings::resolve(&a, rate("50mbit"))
                .expect_err("invalid")
                .to_string()
        };
        let e = bad(args(&["ethernet", "adsl"], None, None));
        assert!(e.contains("\"adsl\"") && e.contains("pppoe-ptm"), "{e}");
        let e = bad(args(&[], Some(300), None));
        assert!(e.contains("300") && e.contains("--overhead"), "{e}");
        let e = bad(args(&[], None, Some(257)));
        assert!(e.contains("--mpu 257"), "{e}");
    }

    #[test]
    fn flows_round_up_to_a_power_of_two() {
        let args = PacerArgs {
            flows: Some(1000),
            ..PacerArgs::default()
        };
        let s = PacerSettings::resolve(&args, rate("50mbit")).expect("valid");
        assert_eq!((s.flows, s.flow_sets()), (1024, 128));
    }
}
