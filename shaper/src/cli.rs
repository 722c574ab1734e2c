//! The command line, as raw arguments, and `run`'s validation of them into
//! a `RunPlan` (`RunArgs::plan`); `commands` acts on it.
//!
//! Exit codes: 0 ok, 1 failure, 2 usage (bad input, missing privileges or
//! kernel features: nothing was changed).

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use shaper_common::hosts::Isolation;

use crate::{
    config::{ConfigError, RunConfig, RunPlan},
    duration::{DURATION_HELP, parse_duration},
    pacer::{PacerArgs, PacerKind, parse_rtt},
    rate::Rate,
};

/// eBPF EDT traffic shaper: paces an interface's egress at a set rate with
/// sch_fq enforcing the departure times.
#[derive(Debug, Parser)]
#[command(
    name = "shaper",
    version,
    propagate_version = true,
    after_help = DURATION_HELP
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Shape an interface's egress until SIGINT or SIGTERM, then restore it.
    Run(RunCommand),
    /// Show what is attached where, at what rate, with the counters.
    Status {
        /// Only this interface.
        #[arg(long)]
        iface: Option<String>,
        /// One JSON object per interface, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Change the rate of a running `shaper run`, live, without re-attaching.
    SetRate {
        /// The shaped interface.
        #[arg(long, value_name = "IF")]
        iface: String,
        /// Change the download's rate (the run's --ingress-rate), in either
        /// ingress mode, instead of the upload's.
        #[arg(long)]
        ingress: bool,
        /// The new rate in tc syntax (1kbit to 1tbit).
        #[arg(value_name = "RATE", allow_hyphen_values = true)]
        rate: Rate,
    },
    /// Restore interfaces that a killed `shaper run` left shaped.
    Cleanup {
        /// Only this interface (default: every one with a state record).
        #[arg(long)]
        iface: Option<String>,
        /// Clean up even if the recorded process still seems to run.
        #[arg(long)]
        force: bool,
    },
    /// Measure the classifier's cost per packet (BPF_PROG_TEST_RUN), or with
    /// --vm-part goodput, latency and CPU against CAKE in a lab.
    Bench(crate::bench::BenchArgs),
    /// Measure each packet's time from qdisc enqueue to the driver on an
    /// interface (any root qdisc), per second and per flow.
    Trace(crate::trace::TraceArgs),
    /// Count what passes the interface's TC hooks against its own counters,
    /// to show traffic that bypasses them (flow offload), and list
    /// offloaded conntrack flows. Attaches only counting hooks; leaves the
    /// interface as found.
    Observe(ObserveArgs),
    /// Compare none, CAKE, fq_codel and the shaper on the same traffic in a
    /// namespace testbed: throughput, idle and loaded ping, CPU, kernel
    /// queueing delay; Markdown tables, SVG plots, JSON.
    Lab(crate::lab::cli::LabArgs),
    /// Check a config file, or give one of its sections as `run`'s flags
    /// or as live rates: what the OpenWrt and systemd services call.
    #[command(subcommand)]
    Config(ConfigCommand),
}

/// `shaper run`: the flags, or one section of a config file.
#[derive(Debug, Args)]
#[command(
    mut_arg("iface", |a| a.required(false).required_unless_present("config")),
    mut_arg("rate", |a| a.required_unless_present("config")),
    mut_group("RunArgs", |g| g.args(run_arg_ids())),
    mut_arg("config", |a| a.conflicts_with_all(run_arg_ids())),
    mut_arg("section", |a| a.conflicts_with_all(run_arg_ids()))
)]
pub struct RunCommand {
    /// Take every option from a section of this file instead of flags:
    /// OpenWrt's UCI (`config interface 'wan'`, `option rate '850mbit'`)
    /// or `[wan]` headers with `rate = 850mbit` lines. The keys are the
    /// long flags with `_` for `-`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The section of --config to run; needed when more than one is
    /// enabled.
    #[arg(long, value_name = "NAME", requires = "config")]
    pub section: Option<String>,
    /// The options as flags.
    #[command(flatten)]
    pub args: Option<RunArgs>,
}

/// Every argument of [`RunArgs`], flattened ones included: `--config` and
/// `--section` conflict with each, and `Option<RunArgs>` is `Some` when
/// one is given (clap's derived group is empty for a struct that flattens
/// another).
fn run_arg_ids() -> Vec<clap::Id> {
    RunArgs::augment_args(clap::Command::new("run"))
        .get_arguments()
        .map(|a| a.get_id().clone())
        .collect()
}

/// `shaper config`: the service scripts' view of a config file. Every
/// subcommand validates every section first, as `run --config` does.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate every section; print `NAME IFACE` for each enabled one.
    Check {
        /// The config file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Print a section's `run` flags, one argument per line, in a fixed
    /// order: equal settings print equal lines.
    Args {
        /// The config file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The section; needed when more than one is enabled.
        #[arg(long, value_name = "NAME")]
        section: Option<String>,
        /// Leave out --rate and --ingress-rate, which `apply-rates`
        /// changes live.
        #[arg(long)]
        no_rates: bool,
    },
    /// Set the running `shaper run` of a section's interface to the
    /// section's rate and ingress_rate, live (as set-rate).
    ApplyRates {
        /// The config file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The section; needed when more than one is enabled.
        #[arg(long, value_name = "NAME")]
        section: Option<String>,
    },
}

/// Arguments of `shaper observe`.
#[derive(Debug, Args)]
#[command(after_help = DURATION_HELP)]
pub struct ObserveArgs {
    /// Interface to observe.
    #[arg(long, value_name = "IF")]
    pub iface: String,
    /// Stop after this long (e.g. 30s); default: until SIGINT or SIGTERM.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Time between interval lines (100ms to 3600s).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Newline-delimited JSON records; the last one is the summary.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `shaper run`.
#[derive(Clone, Debug, Args)]
#[command(after_help = DURATION_HELP)]
pub struct RunArgs {
    /// Interface to shape.
    #[arg(long, value_name = "IF")]
    pub iface: String,
    /// Egress (upload) rate in tc syntax: 850mbit, 0.5gbit, 20mbit,
    /// 12.5mbps (1kbit to 1tbit). Needs sch_fq.
    #[arg(
        long,
        value_name = "RATE",
        allow_hyphen_values = true,
        required_unless_present = "ingress_rate"
    )]
    pub rate: Option<Rate>,
    /// Ingress (download) rate, in the same syntax; with or without --rate.
    #[arg(long, value_name = "RATE", allow_hyphen_values = true)]
    pub ingress_rate: Option<Rate>,
    /// How to shape ingress: `ifb` (redirect to the IFB `ifb4<IF>`, shaped
    /// by sch_fq and the fair pacer; needs sch_fq and the ifb module; a lone
    /// download gets the rate) or `police` (the AQM policer at the ingress
    /// hook: no queue, no IFB, no sch_fq; less CPU, but a lone download gets
    /// less of the rate).
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        default_value = "ifb",
        requires = "ingress_rate"
    )]
    pub ingress_mode: crate::ingress::IngressMode,
    /// Drop packets the pacer would hold longer than this (10ms to 10s).
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = parse_duration)]
    pub horizon: Duration,
    /// Which pacer: per-flow fair (default) or one aggregate clock.
    #[arg(long, value_enum, value_name = "KIND")]
    pub pacer: Option<PacerKind>,
    /// CoDel target on each flow's scheduled delay (default 5ms).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "rtt")]
    pub target: Option<Duration>,
    /// CoDel interval (default 100ms; 1ms to 4s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "rtt")]
    pub interval: Option<Duration>,
    /// Path RTT the AQM is tuned for, as CAKE's presets (datacentre, lan,
    /// metro, regional, internet, oceanic, satellite) or a duration:
    /// interval = RTT, target = RTT/20.
    #[arg(long, value_name = "RTT", value_parser = parse_rtt)]
    pub rtt: Option<Duration>,
    /// Flows the flow table holds (64 to 1048576, rounded up to a power of
    /// two; default 65536).
    #[arg(long, value_name = "N")]
    pub flows: Option<u64>,
    /// Drop instead of CE-marking ECN-capable packets.
    #[arg(long)]
    pub no_ecn: bool,
    /// DiffServ tins, as CAKE's (fair pacer): each tin's traffic up to its
    /// share of the rate goes before lower tins'. Upload and the IFB's
    /// download; the policer has one tin.
    #[arg(long, value_enum, value_name = "MODE")]
    pub diffserv: Option<crate::pacer::DiffservArg>,
    /// Clear each packet's DSCP once its tin is chosen (CAKE's `wash`).
    #[arg(long)]
    pub wash: bool,
    /// Host isolation, as CAKE's modes (fair pacer): hosts share the rate
    /// first, then their flows. Upload and download, in both ingress
    /// modes.
    #[arg(long, value_enum, value_name = "MODE")]
    pub isolate: Option<crate::pacer::IsolateArg>,
    /// Host isolation of the download alone, in place of --isolate's (as
    /// sqm-scripts' `dual-srchost` up and `dual-dsthost` down).
    #[arg(long, value_enum, value_name = "MODE", requires = "ingress_rate")]
    pub ingress_isolate: Option<crate::pacer::IsolateArg>,
    /// Host isolation through masquerading (CAKE's `nat`): a connection's
    /// LAN host, recorded on the LAN side before the router's SNAT, is its
    /// host on the upload and the download. Needs --lan and an --isolate
    /// mode with hosts.
    #[arg(long)]
    pub nat: bool,
    /// A LAN interface whose hosts the router masquerades; repeat for
    /// each (with --nat).
    #[arg(long = "lan", value_name = "IF", requires = "nat")]
    pub lans: Vec<String>,
    /// The link's framing: `--framing`, `--overhead`, `--mpu`.
    #[command(flatten)]
    pub framing: crate::pacer::FramingArgs,
    /// The link carries ATM cells (53 bytes for every 48 or part): ADSL.
    #[arg(long, conflicts_with = "ptm")]
    pub atm: bool,
    /// The link codes 64 bytes in 65 (PTM): VDSL2.
    #[arg(long)]
    pub ptm: bool,
    /// Telemetry: sample 1 packet in N besides every drop, mark, flow
    /// start and end (0: only those).
    #[arg(long, value_name = "N", default_value_t = shaper_common::config::DEFAULT_SAMPLE_EVERY)]
    pub sample: u32,
    /// No telemetry records, live view or metrics: only the counters.
    #[arg(long, conflicts_with_all = ["json", "metrics"])]
    pub no_telemetry: bool,
    /// Print newline-delimited JSON records instead of the live view.
    #[arg(long)]
    pub json: bool,
    /// Serve Prometheus metrics over HTTP (default 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:9464")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Flows shown in the live view and exported per flow.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
}

impl RunArgs {
    /// Validates the arguments as `shaper run` takes them: the plan, or the
    /// first refusal.
    pub fn plan(&self) -> Result<RunPlan, ConfigError> {
        let args = self;
        let pacer = args.pacer_args();
        let egress = match args.rate {
            Some(rate) => {
                let mut c = RunConfig::with_pacer(args.iface.clone(), rate, args.horizon, &pacer)?;
                c.sample_every = (!args.no_telemetry).then_some(args.sample);
                Some(c)
            }
            None => None,
        };
        let ingress = match args.ingress_rate {
            Some(rate) => {
                let pacer = PacerArgs {
                    isolate: args.ingress_isolate.or(args.isolate),
                    ..pacer.clone()
                };
                Some(RunConfig::with_pacer(
                    args.iface.clone(),
                    rate,
                    args.horizon,
                    &pacer,
                )?)
            }
            None => None,
        };
        let isolates = [args.isolate, args.ingress_isolate]
            .into_iter()
            .flatten()
            .any(|i| Isolation::from(i) != Isolation::Flows);
        match (args.nat, args.lans.is_empty(), isolates) {
            (true, true, _) => Err(ConfigError::NatWithoutLan),
            (true, false, false) => Err(ConfigError::NatWithoutHosts),
            _ => Ok(RunPlan { egress, ingress }),
        }
    }

    /// The pacer settings as given.
    pub fn pacer_args(&self) -> PacerArgs {
        PacerArgs {
            kind: self.pacer,
            target: self.target,
            interval: self.interval,
            rtt: self.rtt,
            flows: self.flows,
            no_ecn: self.no_ecn,
            diffserv: self.diffserv,
            wash: self.wash,
            isolate: self.isolate,
            framing: crate::pacer::FramingArgs {
                keywords: self
                    .framing
                    .keywords
                    .iter()
                    .cloned()
                    .chain(self.atm.then(|| "atm".to_owned()))
                    .chain(self.ptm.then(|| "ptm".to_owned()))
                    .collect(),
                ..self.framing.clone()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_flags_or_a_config_file() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["shaper", "run"], args].concat());
        let cli = parse(&["--config", "/etc/config/shaper", "--section", "wan"]).expect("file");
        match cli.command {
            Command::Run(RunCommand {
                config: Some(file),
                section: Some(section),
                args: None,
            }) => assert_eq!(
                (file.to_str(), section.as_str()),
                (Some("/etc/config/shaper"), "wan")
            ),
            other => panic!("{other:?}"),
        }
        // Every other flag conflicts, the framing ones included; --section
        // needs --config; without --config the flags are required as ever.
        for extra in [
            &["--rate", "1mbit"][..],
            &["--iface", "e"],
            &["--framing", "ethernet"],
            &["--no-ecn"],
            &["--horizon", "500ms"],
            &["--metrics"],
        ] {
            let err = parse(&[&["--config", "f"], extra].concat()).expect_err("conflict");
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{extra:?}"
            );
            assert_eq!(err.exit_code(), 2);
        }
        let err = parse(&["--section", "wan", "--iface", "e", "--rate", "1mbit"]).expect_err("x");
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
        let err = parse(&["--section", "wan"]).expect_err("no file");
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        let err = parse(&[]).expect_err("nothing");
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn run_parses_and_rejects() {
        let cli = Cli::try_parse_from(["shaper", "run", "--iface", "eth0", "--rate", "850mbit"])
            .expect("valid");
        match cli.command {
            Command::Run(RunCommand { args: Some(a), .. }) => {
                assert_eq!(a.iface, "eth0");
                assert_eq!(a.rate.map(|r| r.bits_per_s()), Some(850_000_000));
                assert_eq!(a.ingress_rate, None);
                assert_eq!(a.horizon, Duration::from_millis(500));
                assert_eq!(a.pacer_args(), PacerArgs::default());
            }
            other => panic!("{other:?}"),
        }
        // A negative rate reaches the rate parser (not "unknown flag").
        let err = Cli::try_parse_from(["shaper", "run", "--iface", "e", "--rate", "-5mbit"])
            .expect_err("negative");
        assert!(err.to_string().contains("negative"), "{err}");
        assert_eq!(err.exit_code(), 2);
        let err = Cli::try_parse_from(["shaper", "run", "--iface", "e"]).expect_err("no rate");
        assert_eq!(err.exit_code(), 2);
        // Download only.
        let cli =
            Cli::try_parse_from(["shaper", "run", "--iface", "e", "--ingress-rate", "100mbit"])
                .expect("ingress only");
        match cli.command {
            Command::Run(RunCommand { args: Some(a), .. }) => {
                assert_eq!(a.rate, None);
                assert_eq!(a.ingress_rate.map(|r| r.bits_per_s()), Some(100_000_000));
                assert_eq!(a.ingress_mode, crate::ingress::IngressMode::Ifb);
            }
            other => panic!("{other:?}"),
        }
        let err = Cli::try_parse_from([
            "shaper",
            "run",
            "--iface",
            "e",
            "--rate",
            "1mbit",
            "--ingress-mode",
            "police",
        ])
        .expect_err("a mode without an ingress rate");
        assert_eq!(err.exit_code(), 2);
        let err = Cli::try_parse_from([
            "shaper",
            "run",
            "--iface",
            "e",
            "--ingress-rate",
            "1mbit",
            "--ingress-mode",
            "queue",
        ])
        .expect_err("unknown mode");
        assert_eq!(err.exit_code(), 2);
        let err = Cli::try_parse_from([
            "shaper",
            "run",
            "--iface",
            "e",
            "--rate",
            "1mbit",
            "--horizon",
            "2",
        ])
        .expect_err("unitless horizon");
        assert!(err.to_string().contains("no unit"), "{err}");
        let err = Cli::try_parse_from([
            "shaper", "run", "--iface", "e", "--rate", "1mbit", "--rtt", "lan", "--target", "1ms",
        ])
        .expect_err("rtt with target");
        assert_eq!(err.exit_code(), 2);
        let cli = Cli::try_parse_from(["shaper", "set-rate", "--iface", "e", "20mbit"])
            .expect("set-rate");
        assert!(matches!(cli.command, Command::SetRate { .. }));
    }
}
