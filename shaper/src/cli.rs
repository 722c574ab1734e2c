//! The command line, as raw arguments. `commands` validates them into a
//! `RunConfig` and acts.
//!
//! Exit codes: 0 ok, 1 failure, 2 usage (bad input, missing privileges or
//! kernel features: nothing was changed).

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::{config::parse_duration, rate::Rate};

/// eBPF EDT traffic shaper: paces an interface's egress at a set rate with
/// sch_fq enforcing the departure times.
#[derive(Debug, Parser)]
#[command(name = "shaper", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Shape an interface's egress until SIGINT or SIGTERM, then restore it.
    Run(RunArgs),
    /// Show what is attached where, at what rate, with the counters.
    Status {
        /// Only this interface.
        #[arg(long)]
        iface: Option<String>,
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
}

/// Arguments of `shaper run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Interface whose egress to shape.
    #[arg(long, value_name = "IF")]
    pub iface: String,
    /// Rate in tc syntax: 850mbit, 0.5gbit, 20mbit, 12.5mbps (1kbit to 1tbit).
    #[arg(long, value_name = "RATE", allow_hyphen_values = true)]
    pub rate: Rate,
    /// Drop packets the pacer would hold longer than this (10ms to 10s).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub horizon: Duration,
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
    fn run_parses_and_rejects() {
        let cli = Cli::try_parse_from(["shaper", "run", "--iface", "eth0", "--rate", "850mbit"])
            .expect("valid");
        match cli.command {
            Command::Run(a) => {
                assert_eq!(a.iface, "eth0");
                assert_eq!(a.rate.bits_per_s(), 850_000_000);
                assert_eq!(a.horizon, Duration::from_secs(2));
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
    }
}
