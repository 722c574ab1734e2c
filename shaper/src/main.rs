//! `shaper`: the command-line entry point. Parses, dispatches, and maps
//! errors to exit codes: 0 ok, 1 failure, 2 usage (nothing was changed).

use std::io::IsTerminal;

use clap::Parser;
use shaper::{
    checks::CheckError, cli, commands, config::ConfigError, config_file::ConfigFileError,
    hook::AttachError, link::LinkError, rate::RateError,
};
use tracing_subscriber::EnvFilter;

fn exit_code(err: &anyhow::Error) -> i32 {
    for cause in err.chain() {
        if cause.is::<CheckError>()
            || cause.is::<RateError>()
            || cause.is::<ConfigError>()
            || cause.is::<ConfigFileError>()
            || cause.is::<commands::StillRunning>()
            || cause
                .downcast_ref::<shaper::observe::ObserveError>()
                .is_some_and(shaper::observe::is_usage_error)
            || cause.is::<shaper::trace::TraceError>()
            || cause
                .downcast_ref::<shaper::telemetry::TelemetryError>()
                .is_some_and(shaper::telemetry::TelemetryError::is_usage_error)
            || cause.is::<shaper::lab::cli::LabUsageError>()
            || cause.is::<shaper::nat::LanCheckError>()
            || matches!(
                cause.downcast_ref::<shaper::bench::host::BenchError>(),
                Some(
                    shaper::bench::host::BenchError::Invalid(_)
                        | shaper::bench::host::BenchError::MissingQdisc { .. }
                )
            )
            || cause.is::<shaper::bpf::ObjectError>()
            || matches!(
                cause.downcast_ref::<LinkError>(),
                Some(LinkError::NotFound { .. } | LinkError::InvalidName { .. })
            )
            || matches!(
                cause.downcast_ref::<AttachError>(),
                Some(
                    AttachError::Check(_)
                        | AttachError::Object(_)
                        | AttachError::NotShaped { .. }
                        | AttachError::NoIngress { .. }
                )
            )
        {
            return 2;
        }
    }
    1
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Run(cli::RunCommand {
            config: Some(file),
            section,
            ..
        }) => commands::run_from_file(&file, section.as_deref()),
        cli::Command::Run(cli::RunCommand {
            args: Some(args), ..
        }) => commands::run(args),
        cli::Command::Run(_) => {
            // clap requires --iface without --config.
            <cli::Cli as clap::CommandFactory>::command()
                .error(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "run needs --iface and a rate, or --config",
                )
                .exit()
        }
        cli::Command::Config(cmd) => commands::config(cmd),
        cli::Command::Status { iface, json } => commands::status(iface, json),
        cli::Command::SetRate {
            iface,
            ingress,
            rate,
        } => commands::set_rate(&iface, ingress, rate),
        cli::Command::Cleanup { iface, force } => commands::cleanup(iface, force),
        cli::Command::Bench(args) => shaper::bench::run(args),
        cli::Command::Observe(args) => commands::observe(args),
        cli::Command::Trace(args) => shaper::trace::run(args),
        cli::Command::Lab(args) => shaper::lab::run::run(args),
    };
    if let Err(e) = result {
        eprintln!("shaper: {e:#}");
        std::process::exit(exit_code(&e));
    }
}
