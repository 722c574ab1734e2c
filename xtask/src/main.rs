//! Project orchestration: `cargo xtask <command>`.
//!
//! Only orchestration lives here: installing the toolchain, building the BPF
//! object and the binaries, booting the VM, and thin wrappers that run the
//! `shaper` binary's own commands. Product logic lives in `shaper`.

mod vm;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Build, test and run the shaper")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Boot a stock Debian kernel in QEMU and run CMD inside.
    Vm {
        /// Kernel to boot.
        #[arg(long, value_enum, default_value = "6.12")]
        kernel: vm::Kernel,
        /// Command and arguments to run in the guest.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
}

fn workspace_root() -> Result<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().context("xtask has no parent directory")?;
    Ok(root.to_path_buf())
}

fn main() {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<i32> {
    let root = workspace_root()?;
    match cli.command {
        Command::Vm { kernel, cmd } => vm::run(&root, kernel, &cmd),
    }
}
