//! `cargo xtask test`: every test the project has, in one command.
//!
//! Stages, in order (each prints its duration; any failure fails the run but
//! later stages still run, so one report shows everything):
//! 1. setup: toolchain and tools (idempotent), the BPF object;
//! 2. lint: `cargo fmt --check`, `cargo clippy -D warnings`;
//! 3. unit: the default members' tests (no privileges needed);
//! 4. host: the privileged integration tests (`tests/`) on this machine's
//!    kernel, one thread, each test in its own network namespace; tests that
//!    need a feature this kernel lacks skip with a printed reason;
//! 5. vm: the same test binaries (but the host-only ones, see [`HOST_ONLY`])
//!    inside the VM on each chosen stock kernel, with
//!    `SHAPER_REQUIRE_FULL_KERNEL=1`, so a feature-gated test that would skip
//!    fails instead, and `SHAPER_KERNEL_CONFIG` naming the guest's config;
//!    the comparisons in [`MAIN_KERNEL_ONLY`] run on 6.12 alone.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail, ensure};

use crate::{ebpf, toolchain, vm};

/// Options of `cargo xtask test`.
#[derive(clap::Args)]
pub struct TestArgs {
    /// Skip the VM stage.
    #[arg(long)]
    no_vm: bool,
    /// Skip `cargo fmt --check` and clippy.
    #[arg(long)]
    no_lint: bool,
    /// Kernels for the VM stage.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["6.12", "6.1"])]
    kernels: Vec<vm::Kernel>,
    /// Only run tests whose name contains this (passed to the test binaries).
    #[arg(long)]
    filter: Option<String>,
}

/// Test binaries that run on the host kernel only: what they check does not
/// depend on the kernel (argument and privilege errors happen before any
/// kernel feature is touched; the one sch_fq case needs a kernel without it),
/// and under emulation they cost minutes.
const HOST_ONLY: &[&str] = &["cli_bad_input"];

/// Test binaries that run in the VM on the main kernel (6.12, the series
/// OpenWrt 25.12 runs) only: comparisons against CAKE whose traffic does
/// not depend on the kernel's interface, minutes under emulation each.
const MAIN_KERNEL_ONLY: &[&str] = &["lone_flow_vm"];

/// The test's name of `bin` (a cargo test executable, `name-<hash>`).
fn test_name(bin: &Path) -> Option<&str> {
    bin.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.rsplit_once('-'))
        .map(|(name, _)| name)
}

/// True when `bin` is host-only.
fn host_only(bin: &Path) -> bool {
    test_name(bin).is_some_and(|name| HOST_ONLY.contains(&name))
}

/// True when `bin` runs in the VM on `kernel`.
fn runs_on(bin: &Path, kernel: vm::Kernel) -> bool {
    !host_only(bin)
        && (kernel == vm::Kernel::V6_12
            || !test_name(bin).is_some_and(|name| MAIN_KERNEL_ONLY.contains(&name)))
}

struct Stage {
    name: String,
    seconds: f64,
    ok: bool,
}

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
    let mut stages = Vec::new();
    let mut stage = |name: &str, f: &mut dyn FnMut() -> Result<bool>| -> Result<()> {
        eprintln!("\n==== xtask test: {name}");
        let t = Instant::now();
        let ok = f()?;
        let seconds = t.elapsed().as_secs_f64();
        eprintln!(
            "==== {name}: {} in {seconds:.1} s",
            if ok { "ok" } else { "FAILED" }
        );
        stages.push(Stage {
            name: name.to_owned(),
            seconds,
            ok,
        });
        Ok(())
    };

    let mut object = PathBuf::new();
    stage("setup", &mut || {
        let tc = toolchain::setup(vm::HOST_PACKAGES)?;
        eprintln!("xtask: BPF toolchain: {}", tc.route);
        object = ebpf::build_ebpf(root, &tc)?;
        Ok(true)
    })?;

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
            Ok(fmt_ok && status_ok(clippy, "cargo clippy")?)
        })?;
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
        status_ok(c, "cargo test")
    })?;

    let shaper_bin = ebpf::build_host(root, &object, false)?;
    let bins = test_binaries(root, &object)?;

    stage("host kernel", &mut || {
        let mut ok = true;
        for bin in &bins {
            let mut c = Command::new(bin);
            c.current_dir(root.join("tests"))
                .env("SHAPER_BIN", &shaper_bin)
                .arg("--test-threads=1")
                .args(&filter);
            ok &= status_ok(c, &bin.display().to_string())?;
        }
        Ok(ok)
    })?;

    if !args.no_vm {
        for &kernel in &args.kernels {
            let name = format!("vm {}", kernel_name(kernel));
            stage(&name, &mut || {
                vm::prepare(root, kernel)?;
                let line = kernel_name(kernel);
                let cache = root.join("target/vm").join(line);
                let release = std::fs::read_to_string(cache.join("release"))
                    .with_context(|| format!("reading the cached {line} kernel's release"))?;
                let config = cache
                    .join("tree/boot")
                    .join(format!("config-{}", release.trim()));
                let mut cmd: Vec<String> = vec![
                    "env".into(),
                    format!("SHAPER_KERNEL_CONFIG={}", config.display()),
                    format!("SHAPER_BIN={}", shaper_bin.display()),
                    format!("SHAPER_VM_KERNEL={}", kernel_name(kernel)),
                    "SHAPER_REQUIRE_FULL_KERNEL=1".into(),
                    "sh".into(),
                    "-c".into(),
                ];
                // One boot runs every binary; the script's status is the worst.
                let mut script = String::from("cd tests || exit 1; rc=0; ");
                for bin in bins.iter().filter(|b| runs_on(b, kernel)) {
                    script.push_str(&format!(
                        "{} --test-threads=1 {} || rc=1; ",
                        sh_quote(&bin.display().to_string()),
                        filter
                            .iter()
                            .map(|f| sh_quote(f))
                            .collect::<Vec<_>>()
                            .join(" ")
                    ));
                }
                script.push_str("exit $rc");
                cmd.push(script);
                Ok(vm::run(root, kernel, &cmd)? == 0)
            })?;
        }
    }

    eprintln!("\n==== xtask test summary");
    let mut all_ok = true;
    for s in &stages {
        eprintln!(
            "  {:<14} {:>7.1} s  {}",
            s.name,
            s.seconds,
            if s.ok { "ok" } else { "FAILED" }
        );
        all_ok &= s.ok;
    }
    Ok(if all_ok { 0 } else { 1 })
}

/// The kernel's name as `--kernel` spells it.
fn kernel_name(kernel: vm::Kernel) -> &'static str {
    match kernel {
        vm::Kernel::V6_12 => "6.12",
        vm::Kernel::V6_1 => "6.1",
    }
}

/// Quotes a word for `sh`.
pub fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
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

    #[test]
    fn main_kernel_only_binaries_skip_the_other_kernels() {
        let lone = Path::new("/t/debug/deps/lone_flow_vm-0123abcd");
        assert!(runs_on(lone, vm::Kernel::V6_12));
        assert!(!runs_on(lone, vm::Kernel::V6_1));
        let shaping = Path::new("/t/debug/deps/shaping-0123abcd");
        assert!(runs_on(shaping, vm::Kernel::V6_1));
        assert!(!runs_on(
            Path::new("/t/debug/deps/cli_bad_input-0123abcd"),
            vm::Kernel::V6_12
        ));
    }

    #[test]
    fn host_only_binaries_are_recognised() {
        assert!(host_only(Path::new("/t/debug/deps/cli_bad_input-0123abcd")));
        assert!(!host_only(Path::new("/t/debug/deps/shaping-0123abcd")));
        assert!(!host_only(Path::new(
            "/t/debug/deps/cli_bad_input_more-0123abcd"
        )));
    }

    #[test]
    fn quotes_for_sh() {
        assert_eq!(sh_quote("abc/d-e.f"), "abc/d-e.f");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), "'it'\\''s'");
        assert_eq!(sh_quote(""), "''");
    }
}
