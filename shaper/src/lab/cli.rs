//! `shaper lab`: its arguments, and their validation into a [`LabConfig`]
//! before anything is created.
//!
//! Invariants: every check here runs before the first namespace exists, so
//! a refused request (unknown state, bad rate, missing tool, not root)
//! changes nothing and exits 2 ([`LabUsageError`]).
//!
//! Units: `--rate` in tc syntax (bit/s), `--rtt` a duration (`20ms`),
//! `--duration` seconds of measured load per direction.
//!
//! Non-goals: choosing the topology beyond the WAN device's TX queues (the
//! lab's [`Testbed`](super::Testbed) is fixed), states other than those
//! [`StateKind`] lists.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use clap::Args;

use shaper_common::{hosts::Isolation, tins::Diffserv};

use super::shaping::Shaping;
pub use super::shaping::StateKind;
use crate::{
    pacer::{DiffservArg, FramingArgs},
    rate::Rate,
};

/// The most TX queues `--queues` gives the WAN device.
pub const MAX_QUEUES: u32 = 16;

/// What the lab's pings and UDP probe carry when the states run tins, as
/// voice would.
pub use super::diffserv::EF_TOS;

/// Arguments of `shaper lab`.
#[derive(Debug, Args)]
#[command(after_help = crate::duration::DURATION_HELP)]
pub struct LabArgs {
    /// Shaping rate of every state that shapes (tc syntax, e.g. 50mbit).
    #[arg(long, value_name = "RATE", default_value = "50mbit")]
    pub rate: Rate,
    /// Extra round-trip delay of the WAN path, emulated with netem on the
    /// server side of the router.
    #[arg(long, value_name = "DURATION", default_value = "20ms", value_parser = crate::duration::parse_duration)]
    pub rtt: Duration,
    /// The emulated access link's rate beyond the router, both directions
    /// (default: the shaping rate / 0.9, as sqm-scripts shapes at 85–95%).
    #[arg(long, value_name = "RATE")]
    pub link_rate: Option<Rate>,
    /// The access link's buffer, as drain time at its rate: the bloat the
    /// states are there to cure. 0ms leaves the path without a bottleneck.
    #[arg(long, value_name = "DURATION", default_value = "200ms", value_parser = crate::duration::parse_duration)]
    pub link_buffer: Duration,
    /// Measured load per direction (default 30s, or 5s with --quick).
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_run_duration)]
    pub duration: Option<Duration>,
    /// States to compare, in order, comma-separated: none, cake (egress
    /// and, on an IFB, ingress), fq_codel (egress), shaper (egress, and
    /// ingress in the default mode, the pacer on an IFB: both directions,
    /// as cake), shaper-egress (egress only), shaper-police (egress, and
    /// the AQM policer at ingress), shaper-ifb (the same as shaper, by its
    /// mode's name); with --queues of 2 or more, cake_mq (upstream's CAKE
    /// per TX queue sharing the rate, Linux 7.0 and later; ingress as cake)
    /// and cake_split (mq with a CAKE per queue at rate / queues; ingress
    /// as cake).
    #[arg(long, value_name = "LIST", default_value = "none,cake,fq_codel,shaper,shaper-police", value_parser = parse_states)]
    pub states: StateList,
    /// Write every raw sample and the per-state summary here as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the Markdown report and the SVG plots into this directory.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// Short phases (5 s of load, a 3-step staircase): a few minutes.
    #[arg(long)]
    pub quick: bool,
    /// Copy the shaper state's own output (`shaper run`'s per-second view)
    /// to stderr while it runs.
    #[arg(long)]
    pub show_shaper: bool,
    /// TX queues of the router's WAN device (1 to 16). With more than one,
    /// the shaper puts an mq root with an sch_fq per queue on it, as on a
    /// multi-queue NIC, flows take the queue their hash picks, and the
    /// report shows what each queue carried.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub queues: u32,
    /// DiffServ tins for the shaper (`--diffserv`) and CAKE, both
    /// directions. With tins, the pings and the UDP probe carry DSCP EF, as
    /// voice does, and the report shows what each tin carried.
    #[arg(long, value_enum, value_name = "MODE", default_value = "besteffort")]
    pub diffserv: DiffservArg,
    /// The link's framing for the shaper and every CAKE, both directions
    /// (`--framing`, `--overhead`, `--mpu`, as `shaper run` takes them).
    #[command(flatten)]
    pub framing: FramingArgs,
    /// Host isolation for the shaper (`--isolate`) and every CAKE (its
    /// keyword of the same name), both directions; fq_codel has none.
    #[arg(long, value_enum, value_name = "MODE")]
    pub isolate: Option<crate::pacer::IsolateArg>,
    /// Isolate by the LAN host through the router's masquerading: the
    /// shaper's `--nat` with the testbed's LAN interfaces, CAKE's `nat`.
    #[arg(long, requires = "isolate")]
    pub nat: bool,
    /// Add the hosts phase to every state: host A with 8 TCP flows beside
    /// host B with 1, upload then download, and the table of host B's
    /// share.
    #[arg(long)]
    pub hosts: bool,
}

/// The parsed `--states` list: non-empty, no repeats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateList(pub Vec<StateKind>);

/// Parses `--states`.
pub fn parse_states(s: &str) -> Result<StateList, String> {
    let known = || {
        StateKind::ALL
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        let Some(kind) = StateKind::ALL.iter().find(|k| k.name() == part) else {
            return Err(format!(
                "unknown state '{part}': give a comma-separated list of {}",
                known()
            ));
        };
        if out.contains(kind) {
            return Err(format!("state '{part}' is listed twice"));
        }
        out.push(*kind);
    }
    Ok(StateList(out))
}

/// Refused requests (exit 2; nothing was created).
#[derive(Debug, thiserror::Error)]
pub enum LabUsageError {
    /// A program the lab runs is not on PATH.
    #[error(
        "`{program}` is not installed (not found on PATH): the lab needs it for {why}; install \
         it (Debian: apt-get install {package})"
    )]
    MissingTool {
        /// The program.
        program: &'static str,
        /// What the lab uses it for.
        why: &'static str,
        /// The Debian package that provides it.
        package: &'static str,
    },
    /// The kernel cannot create a qdisc a requested state (or --rtt) needs.
    #[error(
        "this kernel has no '{kind}' qdisc, which {needed_by} needs: {fix}, or run the lab in \
         the VM (`cargo xtask lab`)"
    )]
    MissingQdisc {
        /// The qdisc kind.
        kind: &'static str,
        /// The state or option that needs it.
        needed_by: String,
        /// How to do without it.
        fix: &'static str,
    },
    /// The lab creates namespaces and qdiscs.
    #[error("the lab needs root (it creates network namespaces): run it with sudo")]
    NotRoot,
    /// An option is out of range.
    #[error("invalid {flag}: {detail}")]
    Invalid {
        /// The flag.
        flag: &'static str,
        /// What is wrong and how to fix it.
        detail: String,
    },
}

/// Validated settings of one lab run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabConfig {
    /// The shaping rate.
    pub rate: Rate,
    /// Extra RTT of the WAN path.
    pub rtt: Duration,
    /// The emulated access link, unless `--link-buffer 0ms`.
    pub link: Option<super::topology::WanLink>,
    /// Measured load per direction.
    pub duration: Duration,
    /// iperf3's omitted warm-up.
    pub omit: Duration,
    /// Streams of the load phases.
    pub streams: u32,
    /// Steps of the staircase (one stream added per step).
    pub stair_steps: u32,
    /// Length of a staircase step.
    pub stair_step: Duration,
    /// The states, in order.
    pub states: Vec<StateKind>,
    /// JSON output file.
    pub json: Option<PathBuf>,
    /// Report directory.
    pub report: Option<PathBuf>,
    /// The `shaper` binary the shaper state runs.
    pub shaper_bin: PathBuf,
    /// `--quick`.
    pub quick: bool,
    /// `--show-shaper`.
    pub show_shaper: bool,
    /// TX queues of the WAN device.
    pub queues: u32,
    /// The tins of the states that have them.
    pub diffserv: Diffserv,
    /// The link's framing, for the shaper and CAKE.
    pub framing: FramingArgs,
    /// Host isolation, for the shaper and CAKE.
    pub isolation: Isolation,
    /// Isolation through the router's NAT.
    pub nat: bool,
    /// `--hosts`: the hosts phase runs.
    pub hosts: bool,
}

/// The programs the lab runs, with what for and their Debian package.
const TOOLS: [(&str, &str, &str); 6] = [
    ("iperf3", "the bulk traffic", "iperf3"),
    ("nft", "the router's NAT", "nftables"),
    ("ping", "the latency samples", "iputils-ping"),
    ("ip", "the namespaces", "iproute2"),
    ("tc", "the qdiscs", "iproute2"),
    (
        "nsenter",
        "running programs in the namespaces",
        "util-linux",
    ),
];

/// True if `program` is an executable file in one of `path`'s directories.
fn on_path(program: &str, path: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path).any(|dir| {
        Path::new(&dir)
            .join(program)
            .metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

impl LabConfig {
    /// Validates `args`; `path` is the PATH to search for tools, `root`
    /// whether the process may create namespaces.
    pub fn from_args(args: LabArgs, path: &str, root: bool) -> Result<Self, LabUsageError> {
        if args.queues == 0 || args.queues > MAX_QUEUES {
            return Err(LabUsageError::Invalid {
                flag: "--queues",
                detail: format!(
                    "{} TX queues is outside 1 to {MAX_QUEUES}: give e.g. --queues 4",
                    args.queues
                ),
            });
        }
        if let Some(k) = args.states.0.iter().find(|k| k.needs_queues())
            && args.queues < 2
        {
            return Err(LabUsageError::Invalid {
                flag: "--states",
                detail: format!(
                    "state {} shapes a WAN device with several TX queues: give --queues 2 or \
                     more (e.g. --queues 4), or leave it out",
                    k.name()
                ),
            });
        }
        let framing = args.framing.clone();
        if let Err(e) = framing.resolve() {
            return Err(LabUsageError::Invalid {
                flag: "--framing",
                detail: e.to_string(),
            });
        }
        if let Some(k) = args.states.0.iter().find(|k| k.needs_queues())
            && !framing.is_empty()
        {
            return Err(LabUsageError::Invalid {
                flag: "--states",
                detail: format!(
                    "state {} takes no framing in the lab: leave it out, or drop --framing, \
                     --overhead and --mpu",
                    k.name()
                ),
            });
        }
        let isolation: Isolation = args.isolate.unwrap_or_default().into();
        if isolation != Isolation::Flows {
            let refused = args.states.0.iter().find(|k| k.needs_queues());
            if let Some(k) = refused {
                return Err(LabUsageError::Invalid {
                    flag: "--states",
                    detail: format!(
                        "state {} isolates flows only in the lab: leave it out, or drop \
                         --isolate",
                        k.name()
                    ),
                });
            }
        }
        if args.nat && isolation == Isolation::Flows {
            return Err(LabUsageError::Invalid {
                flag: "--nat",
                detail: "--nat changes which host a packet counts for, and --isolate flows has \
                         no hosts: give a mode with hosts, e.g. --isolate dual-srchost"
                    .to_owned(),
            });
        }
        if args.states.0.contains(&StateKind::CakeMq) && !super::cake_mq::kernel_has() {
            return Err(LabUsageError::Invalid {
                flag: "--states",
                detail: "state cake_mq needs Linux 7.0 or later, and this kernel is older: leave \
                         it out, or run the lab on a newer kernel"
                    .to_owned(),
            });
        }
        for (program, why, package) in TOOLS {
            if !on_path(program, path) {
                return Err(LabUsageError::MissingTool {
                    program,
                    why,
                    package,
                });
            }
        }
        if args.rtt > Duration::from_secs(5) {
            return Err(LabUsageError::Invalid {
                flag: "--rtt",
                detail: format!("{:?} is more than 5 s: give e.g. --rtt 20ms", args.rtt),
            });
        }
        let duration =
            args.duration
                .unwrap_or(Duration::from_secs(if args.quick { 5 } else { 30 }));
        if duration < Duration::from_secs(2) || duration > Duration::from_secs(3600) {
            return Err(LabUsageError::Invalid {
                flag: "--duration",
                detail: format!("{duration:?} is outside 2 s to 1 h: give e.g. --duration 30s"),
            });
        }
        let link_rate = match args.link_rate {
            Some(r) => r,
            None => Rate::from_bits_per_s(args.rate.bits_per_s() / 9 * 10).ok_or_else(|| {
                LabUsageError::Invalid {
                    flag: "--rate",
                    detail: format!(
                        "{} / 0.9 is out of range for the link: give a lower --rate or a --link-rate",
                        args.rate
                    ),
                }
            })?,
        };
        if link_rate.bits_per_s() <= args.rate.bits_per_s() && !args.link_buffer.is_zero() {
            return Err(LabUsageError::Invalid {
                flag: "--link-rate",
                detail: format!(
                    "the link ({link_rate}) must be faster than the shaping rate ({}), or the \
                     link's buffer fills before any state can act: give e.g. --link-rate {}",
                    args.rate,
                    Rate::from_bits_per_s(args.rate.bits_per_s() / 9 * 10).unwrap_or(args.rate)
                ),
            });
        }
        if args.link_buffer > Duration::from_secs(10) {
            return Err(LabUsageError::Invalid {
                flag: "--link-buffer",
                detail: format!(
                    "{:?} is more than 10 s: give e.g. --link-buffer 200ms",
                    args.link_buffer
                ),
            });
        }
        let link = (!args.link_buffer.is_zero()).then_some(super::topology::WanLink {
            rate_bits_per_s: link_rate.bits_per_s(),
            buffer: args.link_buffer,
            stab: None,
        });
        if !root {
            return Err(LabUsageError::NotRoot);
        }
        let shaper_bin = std::env::current_exe().map_err(|e| LabUsageError::Invalid {
            flag: "the shaper binary",
            detail: format!("cannot find this program's own path: {e}"),
        })?;
        Ok(Self {
            rate: args.rate,
            rtt: args.rtt,
            link,
            duration,
            omit: Duration::from_secs(if args.quick { 2 } else { 5 }),
            streams: 4,
            stair_steps: if args.quick { 3 } else { 8 },
            stair_step: Duration::from_secs(5),
            states: args.states.0,
            json: args.json,
            report: args.report,
            shaper_bin,
            quick: args.quick,
            show_shaper: args.show_shaper,
            queues: args.queues,
            diffserv: args.diffserv.into(),
            framing,
            isolation,
            nat: args.nat,
            hosts: args.hosts,
        })
    }

    /// The qdisc kinds this run needs, each with what needs it.
    pub fn needed_qdiscs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if !self.rtt.is_zero() {
            out.push(("netem", "--rtt".to_owned()));
        }
        if self.link.is_some() {
            out.push(("tbf", "the access link".to_owned()));
        }
        for k in &self.states {
            let kinds: &[&'static str] = match k {
                StateKind::None => &[],
                // `mq` cannot be probed on `lo` (one queue); every kernel
                // with CAKE here has it, and cake_mq is checked by version.
                StateKind::Cake | StateKind::CakeSplit | StateKind::CakeMq => &["cake"],
                StateKind::FqCodel => &["htb", "fq_codel"],
                StateKind::Shaper
                | StateKind::ShaperEgress
                | StateKind::ShaperPolice
                | StateKind::ShaperIfb => &["fq"],
            };
            for kind in kinds {
                out.push((*kind, format!("state {}", k.name())));
            }
        }
        out
    }

    /// The lab state for `kind`.
    pub fn state(&self, kind: StateKind) -> super::State {
        kind.shaping(
            &self.shaper_bin,
            self.rate,
            &Shaping {
                queues: self.queues,
                diffserv: self.diffserv,
                framing: self.framing.clone(),
                isolation: (self.isolation != Isolation::Flows).then_some(self.isolation),
                nat: self.nat,
            },
        )
    }

    /// The TOS byte of the pings and the UDP probe: EF with tins, else
    /// none.
    pub fn probe_tos(&self) -> Option<u8> {
        (self.diffserv.tins() > 1).then_some(EF_TOS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(flatten)]
        lab: LabArgs,
    }

    /// A fresh directory of do-nothing executables named as the lab's
    /// tools, so every tool is "found" on a PATH of it alone.
    fn fake_tools(tag: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("shaper-lab-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        for (p, _, _) in TOOLS {
            let f = dir.join(p);
            std::fs::write(&f, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        dir
    }

    fn parse(args: &[&str]) -> Result<LabArgs, clap::Error> {
        T::try_parse_from(std::iter::once("lab").chain(args.iter().copied())).map(|t| t.lab)
    }

    #[test]
    fn states_parse_in_order_and_refuse_unknown_or_repeated() {
        let s = parse_states("shaper, none,cake").expect("valid");
        assert_eq!(
            s.0,
            vec![StateKind::Shaper, StateKind::None, StateKind::Cake]
        );
        let e = parse_states("none,cak").expect_err("unknown");
        assert!(e.contains("'cak'") && e.contains("fq_codel"), "{e}");
        assert!(parse_states("none,none").is_err());
        assert!(parse_states("").is_err());
    }

    #[test]
    fn bad_input_is_a_usage_error_of_clap() {
        for bad in [
            &["--rate", "fast"][..],
            &["--states", "none,htb"],
            &["--rtt", "soon"],
            &["--duration", "0"],
        ] {
            let e = parse(bad).expect_err("refused");
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn missing_iperf3_is_refused_before_anything() {
        let dir = std::env::temp_dir().join(format!("shaper-lab-path-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let args = parse(&["--quick"]).expect("valid");
        let e = LabConfig::from_args(args, &dir.display().to_string(), true).expect_err("no tools");
        assert!(
            matches!(
                e,
                LabUsageError::MissingTool {
                    program: "iperf3",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("apt-get install iperf3"), "{e}");
        let _ = std::fs::remove_dir(&dir);
    }

    #[test]
    fn the_link_defaults_above_the_rate_and_must_stay_above_it() {
        let dir = fake_tools("link");
        let path = dir.display().to_string();
        let c = LabConfig::from_args(parse(&["--rate", "45mbit"]).expect("valid"), &path, true)
            .expect("valid");
        let link = c.link.expect("a link by default");
        assert_eq!(link.rate_bits_per_s, 50_000_000);
        assert_eq!(link.buffer, Duration::from_millis(200));
        let args = parse(&["--rate", "50mbit", "--link-rate", "50mbit"]).expect("parses");
        let e = LabConfig::from_args(args, &path, true).expect_err("link not above the rate");
        assert!(matches!(e, LabUsageError::Invalid { .. }), "{e}");
        assert!(e.to_string().contains("--link-rate"), "{e}");
        let args = parse(&["--link-buffer", "0ms"]).expect("parses");
        let c = LabConfig::from_args(args, &path, true).expect("valid");
        assert!(c.link.is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Queues and tins reach the states: a per-queue state needs queues,
    /// cake_mq a kernel that has it, and with tins CAKE and the shaper get
    /// the mode and the probes carry EF.
    #[test]
    fn queues_and_tins_reach_the_states() {
        let dir = fake_tools("mq");
        let path = dir.display().to_string();
        let config =
            |args: &[&str]| LabConfig::from_args(parse(args).expect("parses"), &path, true);
        for bad in [&["--queues", "0"][..], &["--queues", "17"]] {
            let e = config(bad).expect_err("out of range");
            assert!(e.to_string().contains("--queues"), "{e}");
        }
        let e = config(&["--states", "cake_split"]).expect_err("one queue");
        assert!(e.to_string().contains("--queues 2 or more"), "{e}");
        let mq = config(&["--states", "cake_mq", "--queues", "4"]);
        assert_eq!(mq.is_ok(), super::super::cake_mq::kernel_has(), "{mq:?}");

        let c = config(&[
            "--states",
            "cake,cake_split,shaper-egress",
            "--queues",
            "4",
            "--diffserv",
            "diffserv4",
        ])
        .expect("valid");
        assert_eq!((c.queues, c.diffserv), (4, Diffserv::Diffserv4));
        assert_eq!(c.probe_tos(), Some(EF_TOS));
        let name = |k| c.state(k).name();
        assert_eq!(
            name(StateKind::Cake),
            format!(
                "cake {r} diffserv4 + cake-ingress {r} diffserv4",
                r = c.rate
            )
        );
        assert!(
            name(StateKind::CakeSplit).contains("over 4 queues diffserv4"),
            "{}",
            name(StateKind::CakeSplit)
        );
        assert!(
            name(StateKind::ShaperEgress).ends_with("--diffserv diffserv4"),
            "{}",
            name(StateKind::ShaperEgress)
        );
        let framed = config(&[
            "--states",
            "cake,shaper",
            "--framing",
            "pppoe-ptm,ether-vlan",
            "--mpu",
            "68",
        ])
        .expect("valid");
        assert_eq!(
            framed.state(StateKind::Cake).name(),
            format!(
                "cake {r} pppoe-ptm ether-vlan mpu 68 + cake-ingress {r} pppoe-ptm ether-vlan mpu 68",
                r = framed.rate
            )
        );
        assert!(
            framed
                .state(StateKind::Shaper)
                .name()
                .ends_with("--framing pppoe-ptm,ether-vlan --mpu 68"),
            "{}",
            framed.state(StateKind::Shaper).name()
        );
        let e = config(&["--framing", "adsl"]).expect_err("unknown keyword");
        assert!(e.to_string().contains("--framing"), "{e}");
        let e = config(&["--overhead", "300"]).expect_err("out of range");
        assert!(e.to_string().contains("-64 to 256"), "{e}");
        let e = config(&["--states", "cake_split", "--queues", "4", "--overhead", "8"])
            .expect_err("no framing for a per-queue state");
        assert!(e.to_string().contains("takes no framing"), "{e}");
        let plain = config(&["--states", "cake"]).expect("valid");
        assert_eq!(plain.probe_tos(), None);
        assert_eq!(
            plain.state(StateKind::Cake).name(),
            format!("cake {r} + cake-ingress {r}", r = plain.rate)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn isolation_reaches_the_shaper_and_every_cake() {
        let dir = fake_tools("isolate");
        let path = dir.display().to_string();
        let config =
            |args: &[&str]| LabConfig::from_args(parse(args).expect("parses"), &path, true);
        let c = config(&[
            "--states",
            "cake,shaper",
            "--isolate",
            "dual-srchost",
            "--nat",
            "--hosts",
        ])
        .expect("valid");
        assert!(c.hosts);
        assert_eq!(
            c.state(StateKind::Cake).name(),
            format!(
                "cake {r} dual-srchost nat + cake-ingress {r} dual-srchost nat",
                r = c.rate
            )
        );
        let shaper = c.state(StateKind::Shaper).name();
        assert!(
            shaper.ends_with("--isolate dual-srchost --nat --lan lan1 --lan lan2"),
            "{shaper}"
        );
        // The policer isolates hosts as the pacer does.
        let police = config(&["--states", "shaper-police", "--isolate", "dual-dsthost"])
            .expect("the policer takes --isolate");
        let police = police.state(StateKind::ShaperPolice).name();
        assert!(
            police.contains("--ingress-mode police") && police.contains("--isolate dual-dsthost"),
            "{police}"
        );
        // A per-queue CAKE takes no options; --nat needs hosts.
        for (bad, says) in [
            (
                &[
                    "--states",
                    "cake_split",
                    "--queues",
                    "2",
                    "--isolate",
                    "hosts",
                ][..],
                "isolates flows only",
            ),
            (
                &["--states", "cake", "--isolate", "flows", "--nat"],
                "--nat",
            ),
        ] {
            let e = config(bad).expect_err("refused");
            assert!(e.to_string().contains(says), "{bad:?}: {e}");
        }
        let plain = config(&["--states", "shaper"]).expect("valid");
        assert!(!plain.state(StateKind::Shaper).name().contains("--isolate"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn quick_defaults() {
        let args = parse(&["--quick", "--states", "none,shaper"]).expect("valid");
        let dir = fake_tools("tools");
        let c = LabConfig::from_args(args, &dir.display().to_string(), true).expect("valid");
        assert_eq!(c.duration, Duration::from_secs(5));
        assert_eq!(c.rate.bits_per_s(), 50_000_000);
        assert_eq!(c.rtt, Duration::from_millis(20));
        assert_eq!(c.states, vec![StateKind::None, StateKind::Shaper]);
        let args = parse(&["--quick"]).expect("valid");
        assert!(matches!(
            LabConfig::from_args(args, &dir.display().to_string(), false),
            Err(LabUsageError::NotRoot)
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
