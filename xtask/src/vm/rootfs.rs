//! The arm64 guest's root file system, cached under
//! `<workspace>/target/vm/arm64-root/`.
//!
//! The x86 guest shares the host's own root, so every host tool runs in it
//! unchanged. An arm64 guest cannot run the host's x86 programs, so it gets
//! a root of Debian 12's arm64 packages, unpacked by `mmdebstrap
//! --variant=extract` (no maintainer scripts, so no emulation of the target
//! is needed; about 5 s and 180 MB). It holds what the tests drive (ip, tc,
//! iperf3, ping, nft, bpftool, nsenter, prlimit, awk, python3, a shell) and
//! the static busybox that the initramfs runs as init. The project's own
//! programs come from the workspace share, built statically for aarch64.
//!
//! Invariants: the cache is complete or absent ([`super::cache`]); its
//! `layout` file names the package list, so a change of the list rebuilds
//! it. The host's apt configuration is not touched: mmdebstrap reads the
//! Debian mirror the host uses.
//!
//! Non-goals: package updates of a cached root (delete it to refresh).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::backports::host_mirror;
use super::cache;
use super::debs::run_captured;

/// Packages the root holds (their dependencies come along).
const PACKAGES: &[&str] = &[
    "busybox-static",
    "dash",
    "coreutils",
    "mawk",
    "python3-minimal",
    "util-linux",
    "iproute2",
    "iperf3",
    "iputils-ping",
    "kmod",
    "nftables",
    "procps",
    "bpftool",
];

/// The suite the root comes from: the host's own Debian release.
const SUITE: &str = "bookworm";

/// Links that Debian's maintainer scripts would make through
/// update-alternatives, which the extract variant does not run: (link,
/// target relative to the link's directory).
const ALTERNATIVES: &[(&str, &str)] = &[("usr/bin/awk", "mawk")];

/// Mount points init needs that an extracted root lacks.
const MOUNT_POINTS: &[&str] = &["proc", "sys", "dev", "tmp", "run", "var/tmp", "root"];

fn layout() -> String {
    format!("shaper-vm-root 3 {SUITE} {}\n", PACKAGES.join(","))
}

/// The cached arm64 root, built first if needed.
pub(crate) fn prepare_arm64(vm_dir: &Path, mmdebstrap: &Path) -> Result<PathBuf> {
    cache::ensure(
        vm_dir,
        "arm64-root",
        "arm64 root",
        |dir| std::fs::read_to_string(dir.join(".layout")).is_ok_and(|l| l == layout()),
        |tmp| {
            let mirror = host_mirror().unwrap_or_else(|| "http://deb.debian.org/debian".to_owned());
            eprintln!("xtask vm: first arm64 use: unpacking an arm64 root from {mirror}");
            run_captured(
                Command::new(mmdebstrap)
                    .args(["--variant=extract", "--arch=arm64", "--quiet"])
                    .arg(format!("--include={}", PACKAGES.join(",")))
                    .arg(SUITE)
                    .arg(tmp)
                    .arg(format!(
                        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} \
                         {SUITE} main"
                    )),
                "mmdebstrap",
            )?;
            finish(tmp)
        },
    )
}

/// Adds the mount points and checks the programs init and the tests call by
/// path; writes the layout file last.
fn finish(root: &Path) -> Result<()> {
    for dir in MOUNT_POINTS {
        let path = root.join(dir);
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
    }
    for (link, target) in ALTERNATIVES {
        let path = root.join(link);
        if std::fs::symlink_metadata(&path).is_err() {
            std::os::unix::fs::symlink(target, &path)
                .with_context(|| format!("cannot link {} to {target}", path.display()))?;
        }
    }
    for program in [
        "bin/busybox",
        "bin/sh",
        "sbin/ip",
        "sbin/tc",
        "sbin/modprobe",
        "usr/bin/awk",
        "usr/bin/python3",
    ] {
        // Links may be absolute (`sbin/ip -> /bin/ip`): resolve them inside
        // the root, not on the host.
        let mut path = root.join(program);
        for _ in 0..8 {
            match std::fs::read_link(&path) {
                Ok(target) if target.is_absolute() => {
                    path = root.join(target.strip_prefix("/").unwrap_or(&target));
                }
                Ok(target) => {
                    path = path.parent().unwrap_or(root).join(target);
                }
                Err(_) => break,
            }
        }
        if !path.is_file() {
            bail!("the arm64 root has no /{program}: mmdebstrap left out a package");
        }
    }
    std::fs::write(root.join(".layout"), layout()).context("cannot write the root's layout file")
}

/// Creates the mount point of the workspace share in the cached `root`: the
/// guest mounts it read-only, so init cannot. (A workspace under /tmp needs
/// none: init mounts a tmpfs there first.)
pub(crate) fn add_mount_point(root: &Path, workspace: &Path) -> Result<()> {
    let path = root.join(workspace.strip_prefix("/").unwrap_or(workspace));
    std::fs::create_dir_all(&path).with_context(|| format!("cannot create {}", path.display()))
}

/// The static busybox inside `root`, for the initramfs.
pub(crate) fn busybox(root: &Path) -> PathBuf {
    root.join("bin/busybox")
}
