//! `cargo xtask dist`: what an operator installs, written to `target/dist/`.
//!
//! For one target architecture:
//! - `shaper-<version>-<arch>`: the static binary, BPF object embedded,
//!   symbols stripped;
//! - `shaper_<version>-<release>_<openwrt arch>.ipk`: the OpenWrt package
//!   that opkg (OpenWrt 24.10) installs ([`package`]);
//! - `shaper-<version>-openwrt-<openwrt arch>.tar.gz`: the same files as a
//!   tree with install steps, for apk-based OpenWrt (25.12), whose package
//!   format this project does not build;
//! - `shaper-<version>-linux-<arch>.tar.gz`: the binary, a systemd unit and
//!   an example config, for Debian-like routers;
//! - beside each, `<artifact>.sha256` in `sha256sum` format.
//!
//! Invariants: artifacts are reproducible from one commit (owner root,
//! files in name order, times from the last commit, gzip without names or
//! times); every artifact is checked after it is written (the binary's
//! machine and static linking, each archive's member list), so a broken
//! package never leaves this command.
//!
//! Non-goals: signing, package feeds, the OpenWrt SDK.

mod package;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::cross::Target;
use crate::vm::elf;
use crate::{cross, ebpf, toolchain};

/// Options of `cargo xtask dist`.
#[derive(clap::Args)]
pub struct DistArgs {
    /// The router's architecture.
    #[arg(long, value_enum, default_value = "aarch64")]
    target: Target,
}

/// What `dist` wrote.
pub struct Artifacts {
    pub binary: PathBuf,
    pub ipk: PathBuf,
    pub openwrt_tarball: PathBuf,
    pub linux_tarball: PathBuf,
}

impl Artifacts {
    fn all(&self) -> [&Path; 4] {
        [
            &self.binary,
            &self.ipk,
            &self.openwrt_tarball,
            &self.linux_tarball,
        ]
    }
}

/// `cargo xtask dist`: builds, packages and prints the artifacts with their
/// sizes.
pub fn run(root: &Path, args: &DistArgs) -> Result<i32> {
    let artifacts = build(root, args.target)?;
    for path in artifacts.all() {
        let size = std::fs::metadata(path)
            .with_context(|| format!("cannot stat {}", path.display()))?
            .len();
        println!("{:>10}  {}", size, path.display());
    }
    if let Ok(out) = Command::new("file")
        .arg("-b")
        .arg(&artifacts.binary)
        .output()
    {
        println!("file: {}", String::from_utf8_lossy(&out.stdout).trim());
    }
    Ok(0)
}

/// Builds everything for `target` and writes the artifacts.
pub fn build(root: &Path, target: Target) -> Result<Artifacts> {
    let tc = toolchain::setup(&[])?;
    cross::ensure_tools(target)?;
    let object = ebpf::build_ebpf(root, &tc)?;
    let release = cross::build_release(root, &object, target, &["shaper"])?;
    let dist = root.join("target/dist");
    std::fs::create_dir_all(&dist).with_context(|| format!("cannot create {}", dist.display()))?;
    let version = package::VERSION;
    let epoch = source_date_epoch(root);

    let binary = dist.join(format!("shaper-{version}-{}", target.name()));
    strip_into(target, &release.join("shaper"), &binary)?;
    check_binary(&binary, target)?;

    let staging = dist.join(format!(".staging-{}", target.name()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging)
            .with_context(|| format!("cannot clear {}", staging.display()))?;
    }
    let files = package::Files::read(root)?;
    let package = package::Package {
        staging: &staging,
        dist: &dist,
        binary: &binary,
        files: &files,
        target,
        epoch,
    };
    let ipk = package.ipk()?;
    let openwrt_tarball = package.openwrt_tarball()?;
    let linux_tarball = package.linux_tarball()?;
    std::fs::remove_dir_all(&staging)
        .with_context(|| format!("cannot remove {}", staging.display()))?;

    let artifacts = Artifacts {
        binary,
        ipk,
        openwrt_tarball,
        linux_tarball,
    };
    for path in artifacts.all() {
        write_checksum(path)?;
    }
    Ok(artifacts)
}

/// The last commit's time, so that two builds of one commit are equal; 0
/// outside a git checkout.
fn source_date_epoch(root: &Path) -> u64 {
    Command::new("git")
        .current_dir(root)
        .args(["log", "-1", "--format=%ct"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0)
}

fn strip_into(target: Target, from: &Path, to: &Path) -> Result<()> {
    let status = Command::new(target.strip())
        .arg("--strip-all")
        .arg("-o")
        .arg(to)
        .arg(from)
        .status()
        .with_context(|| format!("cannot start {}", target.strip()))?;
    ensure!(
        status.success(),
        "{} {} failed",
        target.strip(),
        from.display()
    );
    Ok(())
}

/// The binary is an ELF executable for `target` with no dynamic loader.
pub fn check_binary(path: &Path, target: Target) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let want = match target {
        Target::Aarch64 => elf::EM_AARCH64,
        Target::X86_64 => elf::EM_X86_64,
    };
    let machine = elf::machine(&bytes).with_context(|| format!("{}", path.display()))?;
    if machine != want {
        bail!(
            "{} is for ELF machine {machine}, not {} ({want})",
            path.display(),
            target.file_machine()
        );
    }
    if elf::has_interpreter(&bytes)? {
        bail!(
            "{} needs a dynamic loader: the build was not static",
            path.display()
        );
    }
    Ok(())
}

/// Writes `<path>.sha256` as `sha256sum` does, with the bare file name, so
/// that `sha256sum -c` works in the artifact's own directory.
fn write_checksum(path: &Path) -> Result<()> {
    let dir = path.parent().context("an artifact without a directory")?;
    let name = path
        .file_name()
        .context("an artifact without a name")?
        .to_string_lossy()
        .into_owned();
    let out = Command::new("sha256sum")
        .current_dir(dir)
        .arg("--")
        .arg(&name)
        .output()
        .context("cannot start sha256sum")?;
    ensure!(out.status.success(), "sha256sum {name} failed");
    let sum = dir.join(format!("{name}.sha256"));
    std::fs::write(&sum, &out.stdout).with_context(|| format!("cannot write {}", sum.display()))
}
