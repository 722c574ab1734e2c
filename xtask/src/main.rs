//! Project orchestration: `cargo xtask <command>`.
//!
//! Only orchestration lives here: installing the toolchain, building the BPF
//! object and the binaries, booting the VM, and thin wrappers that run the
//! `shaper` binary's own commands. Product logic lives in `shaper`.
//!
//! Exit codes: 0 ok, 1 failure, 2 usage (clap), or the wrapped command's own.

mod bench;
mod cross;
mod dist;
mod ebpf;
mod lab;
mod test;
mod toolchain;
mod vm;

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Build, test and run the shaper")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the BPF toolchain, bpf-linker, the VM's and the tests' tools.
    Setup,
    /// Build the BPF object only.
    BuildEbpf,
    /// Build the BPF object and the shaper binary that embeds it.
    Build {
        /// Build the debug profile instead of release.
        #[arg(long)]
        debug: bool,
    },
    /// Build, then run `shaper run ARGS` as root. Without `--iface`: the
    /// lab's testbed with the shaper (`shaper lab --quick`), no real network.
    Run {
        /// Arguments for `shaper run`, e.g. `-- --iface eth0 --rate 850mbit`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Build the static binary and the packages for a router: an OpenWrt
    /// `.ipk`, an OpenWrt tree for apk-based releases, and a tarball with a
    /// systemd unit, each with its checksum, in `target/dist/`.
    Dist(dist::DistArgs),
    /// Run every test: unit, this kernel's privileged tests, and the VM's.
    Test(test::TestArgs),
    /// Benchmark: ns/packet here (BPF_PROG_TEST_RUN), goodput, latency and CPU
    /// against CAKE in the VM; JSON and a table.
    Bench(bench::BenchArgs),
    /// Compare none, CAKE, fq_codel and the shaper in a namespace lab
    /// (`shaper lab`), in the VM when this kernel lacks those qdiscs.
    Lab(lab::LabArgs),
    /// Boot a stock Debian kernel in QEMU and run CMD inside.
    Vm {
        /// The guest's architecture (arm64 runs only static aarch64 builds
        /// of the project's programs: `cargo xtask dist --target aarch64`).
        #[arg(long, value_enum, default_value = "x86_64")]
        arch: vm::Arch,
        /// Kernel to boot.
        #[arg(long, value_enum, default_value = "6.12")]
        kernel: vm::Kernel,
        /// Command and arguments to run in the guest.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Inside the VM only: holds the TCX static key on (run by the job
    /// script; see xtask/src/vm/guard.rs).
    #[command(hide = true)]
    VmGuestGuard,
    /// Runs a test plan one test per process and writes the records (run by
    /// `cargo xtask test` in the VM; see xtask/src/test/exec.rs).
    #[command(hide = true)]
    ExecTests {
        #[arg(long)]
        plan: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
}

fn workspace_root() -> Result<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().context("xtask has no parent directory")?;
    Ok(root.to_path_buf())
}

/// A request xtask refuses before doing anything: exit 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn main() {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            if e.chain().any(|c| c.is::<UsageError>()) {
                2
            } else {
                1
            }
        }
    };
    std::process::exit(code);
}

/// True when running as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

fn run(cli: Cli) -> Result<i32> {
    let root = workspace_root()?;
    match cli.command {
        Task::Setup => {
            let tc = toolchain::setup(vm::HOST_PACKAGES)?;
            eprintln!("xtask: toolchain ready ({})", tc.route);
            Ok(0)
        }
        Task::BuildEbpf => {
            let tc = toolchain::setup(&[])?;
            let obj = ebpf::build_ebpf(&root, &tc)?;
            eprintln!("xtask: {}", obj.display());
            Ok(0)
        }
        Task::Build { debug } => {
            let tc = toolchain::setup(&[])?;
            let obj = ebpf::build_ebpf(&root, &tc)?;
            let bin = ebpf::build_host(&root, &obj, !debug)?;
            eprintln!("xtask: built {}", bin.display());
            Ok(0)
        }
        Task::Run { args } => {
            // Without --iface the demo is the lab, which runs in the VM on a
            // kernel without the qdiscs it compares: install the VM's tools.
            let demo = !args
                .iter()
                .any(|a| a == "--iface" || a.starts_with("--iface="));
            let tc = toolchain::setup(if demo { vm::HOST_PACKAGES } else { &[] })?;
            let obj = ebpf::build_ebpf(&root, &tc)?;
            let bin = ebpf::build_host(&root, &obj, true)?;
            if demo {
                // No interface: the lab's testbed instead of a real network.
                eprintln!(
                    "xtask run: no --iface given: running the shaper in the lab's testbed \
                     (`shaper lab --quick --states none,cake,shaper --show-shaper`) instead"
                );
                if !is_root() {
                    anyhow::bail!("the lab needs root: run `sudo -E cargo xtask run`");
                }
                let mut lab_args: Vec<String> =
                    ["--quick", "--states", "none,cake,shaper", "--show-shaper"]
                        .map(String::from)
                        .into();
                lab_args.extend(args);
                return lab::run_built(&root, &bin, None, false, &lab_args);
            }
            let mut cmd = if is_root() {
                Command::new(&bin)
            } else {
                let mut c = Command::new("sudo");
                c.arg("--preserve-env=RUST_LOG").arg(&bin);
                c
            };
            let status = cmd
                .arg("run")
                .args(&args)
                .status()
                .with_context(|| format!("cannot start {}", bin.display()))?;
            Ok(status.code().unwrap_or(1))
        }
        Task::Dist(args) => dist::run(&root, &args),
        Task::Test(args) => test::run(&root, &args),
        Task::Bench(args) => bench::run(&root, &args),
        Task::Lab(args) => lab::run(&root, &args),
        Task::Vm { arch, kernel, cmd } => vm::run(&root, vm::Guest { arch, kernel }, &cmd),
        Task::ExecTests { plan, out } => test::exec_tests(&plan, &out),
        Task::VmGuestGuard => {
            if !vm::hold_tcx_key()? {
                eprintln!("xtask vm-guest-guard: this kernel has no TCX; nothing to hold");
            }
            Ok(0)
        }
    }
}
