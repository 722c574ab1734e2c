//! `cargo xtask lab`: builds, then runs `shaper lab ARGS` here, or in the
//! 6.12 VM when this kernel cannot create the qdiscs the lab compares
//! (cake, fq, fq_codel, netem).
//!
//! The probe adds each qdisc to `lo` inside `unshare --net`, a private
//! namespace that vanishes with the command: this machine's own
//! interfaces are never touched. Relative `--json`/`--report` paths are
//! made absolute first; in the VM they must lie under the workspace (shared
//! read-write at the same path), so the default report goes to
//! `target/lab/`.
//!
//! All measuring and reporting is `shaper lab`'s; this only orchestrates.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::{ebpf, toolchain, vm};

/// Options of `cargo xtask lab`.
#[derive(clap::Args)]
pub struct LabArgs {
    /// Run here even if this kernel lacks a qdisc (the lab then fails).
    #[arg(long, conflicts_with = "vm")]
    no_vm: bool,
    /// Run in the VM even if this kernel has every qdisc.
    #[arg(long)]
    vm: bool,
    /// Arguments for `shaper lab`, e.g. `-- --quick --states none,cake,shaper`.
    #[arg(last = true)]
    args: Vec<String>,
}

/// True if this kernel can create every qdisc the lab uses.
fn host_has_qdiscs() -> bool {
    let script =
        "for q in cake fq fq_codel netem; do tc qdisc replace dev lo root $q || exit 1; done";
    Command::new("unshare")
        .args(["--net", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `args` with `--json`/`--report` values made absolute, and `--report
/// target/lab` added when none was given.
fn lab_args(root: &Path, args: &[String]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut it = args.iter();
    let mut has_report = false;
    while let Some(a) = it.next() {
        let flag = a.split_once('=').map_or(a.as_str(), |(f, _)| f);
        if flag == "--json" || flag == "--report" {
            has_report |= flag == "--report";
            let value = match a.split_once('=') {
                Some((_, v)) => v.to_owned(),
                None => it
                    .next()
                    .context("--json and --report need a value")?
                    .clone(),
            };
            let abs = std::path::absolute(PathBuf::from(&value))
                .with_context(|| format!("cannot resolve {value}"))?;
            out.push(flag.to_owned());
            out.push(abs.display().to_string());
        } else {
            out.push(a.clone());
        }
    }
    if !has_report {
        out.push("--report".to_owned());
        out.push(root.join("target/lab").display().to_string());
    }
    Ok(out)
}

/// Runs the lab; returns the exit code.
pub fn run(root: &Path, args: &LabArgs) -> Result<i32> {
    if !crate::is_root() {
        bail!(
            "the lab creates network namespaces and loads BPF programs, so it needs root: run \
             `sudo -E cargo xtask lab`"
        );
    }
    let tc = toolchain::setup(&[])?;
    let object = ebpf::build_ebpf(root, &tc)?;
    let bin = ebpf::build_host(root, &object, true)?;
    run_built(root, &bin, args.vm, args.no_vm, &args.args)
}

/// Runs `shaper lab` from `bin`, in the VM when needed (or forced).
pub fn run_built(
    root: &Path,
    bin: &Path,
    force_vm: bool,
    no_vm: bool,
    args: &[String],
) -> Result<i32> {
    let args = lab_args(root, args)?;
    let in_vm = force_vm || (!no_vm && !host_has_qdiscs());
    if in_vm {
        eprintln!(
            "xtask lab: this kernel lacks cake, fq, fq_codel or netem: running in the 6.12 VM"
        );
        let mut cmd = vec![bin.display().to_string(), "lab".to_owned()];
        cmd.extend(args);
        // The lab changes nothing outside the disposable guest, so a guest
        // that crashed under emulation (multi-threaded TCG occasionally
        // oopses in code the kernel is patching) is booted once more.
        return match vm::run(root, vm::Kernel::V6_12, &cmd) {
            Err(e) if e.downcast_ref::<vm::GuestCrash>().is_some() => {
                eprintln!(
                    "xtask lab: warning: {e:#}\nxtask lab: running the lab again in a new guest"
                );
                vm::run(root, vm::Kernel::V6_12, &cmd)
            }
            other => other,
        };
    }
    let status = Command::new(bin)
        .arg("lab")
        .args(&args)
        .status()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    Ok(status.code().unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_paths_become_absolute_and_default_to_target_lab() {
        let root = Path::new("/w");
        let a = lab_args(root, &["--quick".into()]).expect("ok");
        assert_eq!(a, ["--quick", "--report", "/w/target/lab"]);
        let a = lab_args(
            root,
            &["--report=/r".into(), "--json".into(), "/j.json".into()],
        )
        .expect("ok");
        assert_eq!(a, ["--report", "/r", "--json", "/j.json"]);
        assert!(lab_args(root, &["--json".into()]).is_err());
    }
}
