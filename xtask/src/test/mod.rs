//! `cargo xtask test`: every test the project has, in one command.
//!
//! Stages, in order (each prints its duration; any failure fails the run but
//! later stages still run, so one report shows everything):
//! 1. setup: toolchain and tools (idempotent), the BPF object;
//! 2. lint: `cargo fmt --check`, `cargo clippy -D warnings`;
//! 3. unit: the default members' tests (no privileges needed);
//! 4. host: the privileged integration tests (`tests/`) on this machine's
//!    kernel, one test per process, each in its own network namespace; tests
//!    that need a feature this kernel lacks skip with a printed reason;
//! 5. vm: the integration tests of each kernel's tier ([`tiers`]) inside the
//!    VM, with `SHAPER_REQUIRE_FULL_KERNEL=1`, so a test that would skip
//!    fails instead, and `SHAPER_KERNEL_CONFIG` naming the guest's config.
//!    The default kernels are 6.12 (every test), 7 (the kernel interface)
//!    and 6.1 (compatibility); `--quick` runs the compatibility tier, but
//!    its kill sweep, on 6.12 alone. A guest whose kernel dies part-way
//!    gets one more boot for what it did not report ([`vm_stage`]).
//! 6. arm64 (in `--kernels` by default): the architecture tier in an arm64
//!    guest, after building the aarch64 package, runner and tests
//!    ([`arm64`]); skipped without a build when `--filter` leaves it no
//!    test.
//!
//! The run ends with [`report::finish`]: stage times, skips by reason,
//! retried rounds, the slowest tests, the time budget, and
//! `target/test-times.json`. Each test's output is kept under
//! `target/test-runs/<stage>/logs/`.

mod arm64;
mod exec;
mod report;
mod tiers;
mod vm_stage;

pub use exec::exec_tests;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail, ensure};

use crate::{ebpf, toolchain, vm};
use exec::{Outcome, TestRecord};
use report::StageReport;

/// A VM stage: an x86 kernel line, or the arm64 guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum VmStage {
    #[value(name = "6.12")]
    V6_12,
    #[value(name = "7", alias = "7.3")]
    V7,
    #[value(name = "6.1")]
    V6_1,
    Arm64,
}

/// Options of `cargo xtask test`.
#[derive(clap::Args)]
pub struct TestArgs {
    /// Skip the VM stage.
    #[arg(long)]
    no_vm: bool,
    /// Skip `cargo fmt --check` and clippy.
    #[arg(long)]
    no_lint: bool,
    /// VM stages, each with its tier (6.12: every test; 7: the kernel
    /// interface; 6.1: compatibility; arm64: the architecture, on
    /// `--arm64-kernel`).
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["6.12", "7", "6.1", "arm64"])]
    kernels: Vec<VmStage>,
    /// The edit loop: lint, unit, host, and the compatibility tier on 6.12.
    #[arg(long, conflicts_with = "kernels")]
    quick: bool,
    /// The arm64 stage's kernel.
    #[arg(long, value_enum, default_value = "6.12")]
    arm64_kernel: vm::Kernel,
    /// Only run tests whose name contains this: a unit test's path, or an
    /// integration test's `FILE::TEST` as the runner prints it (e.g.
    /// `ingress_vm` or `lone_flows`).
    #[arg(long)]
    filter: Option<String>,
}

/// The budget for a full run, warm, the x86 kernels and arm64; the same run from a
/// fresh clone (`.ci/run`, setup and the first build included); and for
/// `--quick`.
const BUDGET_FULL_S: f64 = 45.0 * 60.0;
const BUDGET_COLD_S: f64 = 55.0 * 60.0;
const BUDGET_QUICK_S: f64 = 10.0 * 60.0;

fn cargo(root: &Path, object: &Path) -> Command {
    let mut c = Command::new("cargo");
    c.current_dir(root).env("SHAPER_BPF_OBJECT", object);
    c
}

fn status_ok(mut cmd: Command, what: &str) -> Result<bool> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {what}"))?;
    Ok(status.success())
}

/// Test executables from `cargo test --no-run --message-format=json` output.
pub fn executables(json_lines: &str) -> Vec<PathBuf> {
    let key = "\"executable\":\"";
    json_lines
        .lines()
        .filter(|l| l.contains("\"profile\":") && l.contains("\"test\":true"))
        .filter_map(|l| {
            let start = l.find(key)? + key.len();
            let end = l[start..].find('"')? + start;
            Some(PathBuf::from(&l[start..end]))
        })
        .collect()
}

fn test_binaries(root: &Path, object: &Path) -> Result<Vec<PathBuf>> {
    let out = cargo(root, object)
        .args([
            "test",
            "--package",
            "shaper-tests",
            "--no-run",
            "--message-format=json",
        ])
        .output()
        .context("cannot start cargo test --no-run")?;
    ensure!(
        out.status.success(),
        "building the integration tests failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bins = executables(&String::from_utf8_lossy(&out.stdout));
    ensure!(!bins.is_empty(), "cargo built no integration test binaries");
    Ok(bins)
}

/// Runs the whole suite; returns the exit code.
pub fn run(root: &Path, args: &TestArgs) -> Result<i32> {
    if !crate::is_root() {
        bail!(
            "the test suite creates network namespaces and loads BPF programs, so it needs root: \
             run `sudo -E cargo xtask test`"
        );
    }
    let run_started = Instant::now();
    let end = |stages: &[StageReport]| {
        report::finish(
            root,
            stages,
            run_started.elapsed().as_secs_f64(),
            budget(args),
            (!args.quick).then_some(BUDGET_COLD_S),
        )
    };
    let mut stages: Vec<StageReport> = Vec::new();
    let mut stage = |name: &str, f: &mut dyn FnMut() -> Result<(bool, Vec<TestRecord>)>| {
        eprintln!("\n==== xtask test: {name}");
        let t = Instant::now();
        let (ok, tests, error) = match f() {
            Ok((ok, tests)) => (ok, tests, None),
            Err(e) => (false, Vec::new(), Some(format!("{e:#}"))),
        };
        let seconds = t.elapsed().as_secs_f64();
        if let Some(e) = &error {
            eprintln!("xtask test: {name}: {e}");
        }
        eprintln!(
            "==== {name}: {} in {seconds:.1} s",
            if ok { "ok" } else { "FAILED" }
        );
        stages.push(StageReport {
            name: name.to_owned(),
            seconds,
            ok,
            error,
            tests,
        });
        ok
    };

    let mut object = PathBuf::new();
    let setup_ok = stage("setup", &mut || {
        let tc = toolchain::setup(vm::HOST_PACKAGES)?;
        eprintln!("xtask: BPF toolchain: {}", tc.route);
        object = ebpf::build_ebpf(root, &tc)?;
        Ok((true, Vec::new()))
    });
    if !setup_ok {
        end(&stages)?;
        return Ok(1);
    }

    if !args.no_lint {
        stage("lint", &mut || {
            let mut fmt = Command::new("cargo");
            fmt.current_dir(root)
                .args(["fmt", "--all", "--", "--check"]);
            let fmt_ok = status_ok(fmt, "cargo fmt")?;
            let mut clippy = cargo(root, &object);
            clippy.args([
                "clippy",
                "--workspace",
                "--exclude",
                "shaper-ebpf",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]);
            Ok((fmt_ok && status_ok(clippy, "cargo clippy")?, Vec::new()))
        });
    }

    let filter: Vec<String> = args.filter.iter().cloned().collect();
    stage("unit", &mut || {
        let mut c = cargo(root, &object);
        c.args([
            "test",
            "--workspace",
            "--exclude",
            "shaper-tests",
            "--exclude",
            "shaper-ebpf",
            "--",
        ])
        .args(&filter);
        Ok((status_ok(c, "cargo test")?, Vec::new()))
    });

    let mut built: Option<(PathBuf, Listed)> = None;
    let tests_dir = root.join("tests");
    stage("build tests", &mut || {
        // Release: under emulation a debug build spends seconds of every start
        // parsing and relocating the BPF object.
        let shaper_bin = ebpf::build_host(root, &object, true)?;
        let mut listed = Vec::new();
        for bin in test_binaries(root, &object)? {
            let names = exec::list_tests(&bin, &tests_dir)?;
            listed.push((bin, names));
        }
        built = Some((shaper_bin, listed));
        Ok((true, Vec::new()))
    });
    let Some((shaper_bin, listed)) = built else {
        end(&stages)?;
        return Ok(1);
    };
    let matches = |bin: &Path, test: &str| {
        args.filter
            .as_ref()
            .is_none_or(|f| format!("{}::{test}", exec::binary_name(bin)).contains(f.as_str()))
    };
    if let Some(f) = &args.filter
        && planned(&listed, matches).is_empty()
    {
        println!(
            "xtask test: no integration test matches --filter {f}; only the unit tests it \
             matched ran"
        );
    }
    let shaper_env = ("SHAPER_BIN".to_owned(), shaper_bin.display().to_string());

    stage("host kernel", &mut || {
        let plan = exec::Plan {
            tests: planned(&listed, matches),
            log_dir: root.join("target/test-runs/host/logs"),
            cwd: tests_dir.clone(),
            strict: false,
            env: vec![shaper_env.clone()],
        };
        let records = exec::run_plan(&plan, None)?;
        Ok((all_passed(&plan, &records), records))
    });

    let available: Vec<(String, Vec<String>)> = listed
        .iter()
        .map(|(b, t)| (exec::binary_name(b), t.clone()))
        .collect();
    if !args.no_vm {
        let runs: Vec<(vm::Kernel, tiers::Tier)> = if args.quick {
            vec![(vm::Kernel::V6_12, tiers::QUICK)]
        } else {
            args.kernels
                .iter()
                .filter_map(|stage| match stage {
                    VmStage::V6_12 => Some(vm::Kernel::V6_12),
                    VmStage::V7 => Some(vm::Kernel::V7),
                    VmStage::V6_1 => Some(vm::Kernel::V6_1),
                    VmStage::Arm64 => None,
                })
                .map(|k| (k, tier_of(k)))
                .collect()
        };
        for (kernel, tier) in runs {
            let name = format!("vm {} ({})", kernel.line(), tier.name);
            stage(&name, &mut || {
                tier.check(&available)?;
                let tests = planned(&listed, |b, t| {
                    tier.selects(&exec::binary_name(b), t) && matches(b, t)
                });
                let (dir, plan) = vm_plan(root, kernel.into(), tests, &shaper_bin, &tests_dir)?;
                let runner = std::env::current_exe().context("cannot find xtask's executable")?;
                vm_stage::run(root, kernel.into(), &runner, &dir, &plan)
            });
        }
    }

    if !args.no_vm && !args.quick && args.kernels.contains(&VmStage::Arm64) {
        let guest = vm::Guest {
            arch: vm::Arch::Arm64,
            kernel: args.arm64_kernel,
        };
        let tier = tiers::ARM64;
        stage(&format!("vm {} ({})", guest.name(), tier.name), &mut || {
            tier.check(&available)?;
            let wanted = planned(&listed, |b, t| {
                tier.selects(&exec::binary_name(b), t) && matches(b, t)
            });
            if wanted.is_empty() {
                println!("xtask test: --filter leaves the arm64 stage no test");
                return Ok((true, Vec::new()));
            }
            let built = arm64::build(root, &object)?;
            let tests = arm64::retarget(&wanted, &built.tests)?;
            let (dir, plan) = vm_plan(root, guest, tests, &built.shaper, &tests_dir)?;
            vm_stage::run(root, guest, &built.runner, &dir, &plan)
        });
    }

    let ok = end(&stages)?;
    Ok(if ok { 0 } else { 1 })
}

/// A VM stage's folder under `target/test-runs/`, emptied, and its plan:
/// `tests` run strictly (a skip fails) with `shaper_bin` as the shaper and
/// the guest's kernel config.
fn vm_plan(
    root: &Path,
    guest: vm::Guest,
    tests: Vec<exec::PlannedTest>,
    shaper_bin: &Path,
    cwd: &Path,
) -> Result<(PathBuf, exec::Plan)> {
    let config = vm::kernel_config(root, guest)?;
    let dir = root
        .join("target/test-runs")
        .join(format!("vm-{}", guest.name()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let plan = exec::Plan {
        tests,
        log_dir: dir.join("logs"),
        cwd: cwd.to_owned(),
        strict: true,
        env: vec![
            ("SHAPER_BIN".into(), shaper_bin.display().to_string()),
            ("SHAPER_KERNEL_CONFIG".into(), config.display().to_string()),
            ("SHAPER_VM_KERNEL".into(), guest.name()),
            ("SHAPER_REQUIRE_FULL_KERNEL".into(), "1".into()),
        ],
    };
    Ok((dir, plan))
}

/// Test binaries with their tests' names.
type Listed = Vec<(PathBuf, Vec<String>)>;

/// The tier each kernel runs.
fn tier_of(kernel: vm::Kernel) -> tiers::Tier {
    match kernel {
        vm::Kernel::V6_12 => tiers::MAIN,
        vm::Kernel::V7 => tiers::KERNEL_INTERFACE,
        vm::Kernel::V6_1 => tiers::COMPATIBILITY,
    }
}

fn budget(args: &TestArgs) -> f64 {
    if args.quick {
        BUDGET_QUICK_S
    } else {
        BUDGET_FULL_S
    }
}

/// The tests of `listed` that `keep(binary, test)` selects, in order.
fn planned(listed: &Listed, keep: impl Fn(&Path, &str) -> bool) -> Vec<exec::PlannedTest> {
    listed
        .iter()
        .flat_map(|(bin, names)| {
            names
                .iter()
                .filter(|t| keep(bin, t))
                .map(|t| exec::PlannedTest {
                    binary: bin.clone(),
                    test: t.clone(),
                })
        })
        .collect()
}

/// Every planned test reported, and none failed.
fn all_passed(plan: &exec::Plan, records: &[TestRecord]) -> bool {
    records.len() == plan.tests.len() && records.iter().all(|r| r.result != Outcome::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_test_executables() {
        let json = concat!(
            r#"{"reason":"compiler-artifact","profile":{"test":true},"executable":"/w/target/debug/deps/tc_restore-abc"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","profile":{"test":false},"executable":"/w/target/debug/shaper"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","profile":{"test":true},"executable":null}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        assert_eq!(
            executables(json),
            vec![PathBuf::from("/w/target/debug/deps/tc_restore-abc")]
        );
    }
}
