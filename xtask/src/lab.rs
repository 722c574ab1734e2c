//! `cargo xtask lab`: builds, then runs `shaper lab ARGS` here, or in the
//! VM (6.12 unless `--kernel` names another, e.g. 7 for cake_mq) when this
//! kernel cannot create the qdiscs the lab compares (cake, fq, fq_codel,
//! netem) or `--vm` or `--kernel` asks for it.
//!
//! The probe adds each qdisc to `lo` inside `unshare --net`, a private
//! namespace that vanishes with the command: this machine's own
//! interfaces are never touched. Relative `--json`/`--report` paths are
//! made absolute first, and the default report goes to `target/lab/`. The
//! guest sees only the workspace read-write (its /tmp is a tmpfs), so in the
//! VM an output outside the workspace is written to a staging folder under
//! `target/vm-out/` and copied to where it was asked for after the run; its
//! destination folder is created before the run, and a destination that
//! cannot be created is refused before anything runs. No output vanishes.
//!
//! `--arch arm64` runs the lab in an arm64 guest with the packaged static
//! aarch64 binary (`cargo xtask dist`), to compare the shaper's CPU cost
//! against CAKE's on the router's architecture. Emulation scales both, so
//! the ratio between them is the figure to read, not either value.
//!
//! All measuring and reporting is `shaper lab`'s; this only orchestrates.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::{cross, dist, ebpf, toolchain, vm};

/// Options of `cargo xtask lab`.
#[derive(clap::Args)]
pub struct LabArgs {
    /// Run here even if this kernel lacks a qdisc (the lab then fails).
    #[arg(long, conflicts_with = "vm")]
    no_vm: bool,
    /// Run in the VM even if this kernel has every qdisc.
    #[arg(long)]
    vm: bool,
    /// The VM's kernel (6.12 by default; 7 has cake_mq); implies --vm.
    #[arg(long, value_enum, value_name = "KERNEL", conflicts_with = "no_vm")]
    kernel: Option<vm::Kernel>,
    /// The VM's architecture; arm64 implies --vm and runs the packaged
    /// aarch64 binary.
    #[arg(long, value_enum, default_value = "x86_64", conflicts_with = "no_vm")]
    arch: vm::Arch,
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
    let tc = toolchain::setup(if args.no_vm { &[] } else { vm::HOST_PACKAGES })?;
    let guest = vm::Guest {
        arch: args.arch,
        kernel: args.kernel.unwrap_or(vm::Kernel::V6_12),
    };
    let bin = match args.arch {
        vm::Arch::X86_64 => {
            let object = ebpf::build_ebpf(root, &tc)?;
            ebpf::build_host(root, &object, true)?
        }
        vm::Arch::Arm64 => dist::build(root, cross::Target::Aarch64)?.binary,
    };
    let force_vm = args.vm || args.kernel.is_some() || args.arch != vm::Arch::X86_64;
    run_built(
        root,
        &bin,
        force_vm.then_some(guest),
        args.no_vm,
        &args.args,
    )
}

/// Runs `shaper lab` from `bin`, in the VM when needed or when
/// `force_vm` names its guest.
pub fn run_built(
    root: &Path,
    bin: &Path,
    force_vm: Option<vm::Guest>,
    no_vm: bool,
    args: &[String],
) -> Result<i32> {
    let args = lab_args(root, args)?;
    let guest = force_vm.unwrap_or(vm::Kernel::V6_12.into());
    let in_vm = force_vm.is_some() || (!no_vm && !host_has_qdiscs());
    if in_vm {
        if force_vm.is_none() {
            eprintln!("xtask lab: this kernel lacks cake, fq, fq_codel or netem");
        }
        eprintln!("xtask lab: running in the {} VM", guest.name());
        let staging = root
            .join("target/vm-out")
            .join(format!("lab-{}", std::process::id()));
        let (args, outputs) = stage_outputs(root, &args, &staging)?;
        let mut cmd = vec![bin.display().to_string(), "lab".to_owned()];
        cmd.extend(args);
        // The lab changes nothing outside the disposable guest, so a guest
        // that crashed under emulation (multi-threaded TCG occasionally
        // oopses in code the kernel is patching) is booted once more.
        let code = match vm::run(root, guest, &cmd) {
            Err(e) if e.downcast_ref::<vm::GuestCrash>().is_some() => {
                eprintln!(
                    "xtask lab: warning: {e:#}\nxtask lab: running the lab again in a new guest"
                );
                vm::run(root, guest, &cmd)
            }
            other => other,
        }?;
        let copied = outputs.iter().try_for_each(|o| o.copy_back());
        let _ = std::fs::remove_dir_all(&staging);
        copied?;
        return Ok(code);
    }
    let status = Command::new(bin)
        .arg("lab")
        .args(&args)
        .status()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    Ok(status.code().unwrap_or(1))
}

/// An output the lab writes in the guest's view of the workspace, and where
/// the user asked for it.
#[derive(Debug, PartialEq)]
struct StagedOutput {
    staged: PathBuf,
    dest: PathBuf,
}

impl StagedOutput {
    /// Copies the staged file or folder to its destination, if the lab
    /// wrote it.
    fn copy_back(&self) -> Result<()> {
        if !self.staged.exists() {
            return Ok(());
        }
        copy_tree(&self.staged, &self.dest)
            .with_context(|| format!("cannot copy the lab's output to {}", self.dest.display()))?;
        eprintln!("xtask lab: wrote {}", self.dest.display());
        Ok(())
    }
}

/// `args` with each `--json`/`--report` value outside `root` replaced by a
/// path under `staging`, and the list of outputs to copy back. Creates the
/// destinations' parent folders now, so a path that cannot be written is
/// refused before the run.
fn stage_outputs(
    root: &Path,
    args: &[String],
    staging: &Path,
) -> Result<(Vec<String>, Vec<StagedOutput>)> {
    let mut out = Vec::with_capacity(args.len());
    let mut outputs = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        out.push(a.clone());
        if a != "--json" && a != "--report" {
            continue;
        }
        let Some(value) = it.next() else {
            return Err(crate::UsageError(format!("{a} needs a value")).into());
        };
        let dest = PathBuf::from(value);
        if dest.starts_with(root) {
            out.push(value.clone());
            continue;
        }
        if let Some(parent) = dest.parent()
            && let Err(e) = std::fs::create_dir_all(parent)
        {
            return Err(crate::UsageError(format!(
                "{a} {value}: cannot create {} ({e}); give a folder you can write to",
                parent.display()
            ))
            .into());
        }
        let name = dest.file_name().map_or_else(
            || a.trim_start_matches('-').to_owned(),
            |n| n.to_string_lossy().into_owned(),
        );
        let staged = staging.join(a.trim_start_matches('-')).join(name);
        if let Some(parent) = staged.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        out.push(staged.display().to_string());
        outputs.push(StagedOutput { staged, dest });
    }
    Ok((out, outputs))
}

/// Copies a file, or a folder and everything in it, to `dest`.
fn copy_tree(src: &Path, dest: &Path) -> std::io::Result<()> {
    if src.is_dir() {
        std::fs::create_dir_all(dest)?;
        for entry in std::fs::read_dir(src)? {
            let entry = entry?;
            copy_tree(&entry.path(), &dest.join(entry.file_name()))?;
        }
        Ok(())
    } else {
        std::fs::copy(src, dest).map(|_| ())
    }
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

    #[test]
    fn outputs_outside_the_workspace_are_staged_and_copied_back() {
        let tmp = std::env::temp_dir().join(format!("xtask-lab-stage-{}", std::process::id()));
        let root = tmp.join("w");
        let staging = root.join("target/vm-out/lab-1");
        let dest_json = tmp.join("out/x/lab.json");
        let args: Vec<String> = [
            "--quick",
            "--json",
            &dest_json.display().to_string(),
            "--report",
            &root.join("target/lab").display().to_string(),
        ]
        .map(String::from)
        .into();
        let (staged, outputs) = stage_outputs(&root, &args, &staging).expect("staged");
        let staged_json = staging.join("json/lab.json");
        assert_eq!(staged[2], staged_json.display().to_string());
        assert_eq!(staged[4], root.join("target/lab").display().to_string());
        assert_eq!(outputs.len(), 1);
        assert!(
            dest_json.parent().is_some_and(Path::is_dir),
            "parent made up front"
        );
        assert!(
            staged_json.parent().is_some_and(Path::is_dir),
            "staging made up front"
        );
        std::fs::write(&staged_json, "{}").expect("write");
        outputs[0].copy_back().expect("copy back");
        assert_eq!(std::fs::read_to_string(&dest_json).expect("copied"), "{}");
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn a_destination_that_cannot_be_made_is_refused_before_the_run() {
        let args: Vec<String> = ["--json", "/proc/nope/lab.json"].map(String::from).into();
        let e = stage_outputs(Path::new("/w"), &args, Path::new("/w/s")).expect_err("refused");
        assert!(
            format!("{e:#}").contains("cannot create /proc/nope"),
            "{e:#}"
        );
    }
}
