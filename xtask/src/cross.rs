//! Static builds for a router's architecture: the `shaper` binary (BPF
//! object embedded), and for the arm64 VM tier also xtask's own test runner
//! and the integration tests.
//!
//! Route (toolchain notes, "Cross-building"): Debian's `rustc-web` with the
//! target's `libstd-rust-web-dev` at exactly the compiler's version, linked
//! by Debian's cross gcc, with `+crt-static`. OpenWrt's libc is musl and no
//! musl standard library is packaged here, so the binary carries glibc
//! statically and needs no libc on the router at all. Static glibc cannot
//! load NSS modules, which the shaper never needs: it resolves no names,
//! only interfaces and numeric addresses.
//!
//! Invariants: the target's flags go only to the target
//! (`CARGO_TARGET_<TRIPLE>_RUSTFLAGS`), so build scripts and proc macros stay
//! host programs; output lands in `target/<triple>/`, apart from the host's
//! builds.
//!
//! Non-goals: musl, 32-bit targets, other compilers than Debian's.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::toolchain;

/// A router architecture the project builds for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// 64-bit Arm (the OpenWrt One: MediaTek MT7981B, Cortex-A53).
    Aarch64,
    /// 64-bit x86 (x86 OpenWrt and Debian routers, and this machine).
    #[value(name = "x86_64")]
    X86_64,
}

impl Target {
    /// Rust's target triple.
    pub fn triple(self) -> &'static str {
        match self {
            Target::Aarch64 => "aarch64-unknown-linux-gnu",
            Target::X86_64 => "x86_64-unknown-linux-gnu",
        }
    }

    /// The name used in artifact names (`aarch64`, `x86_64`).
    pub fn name(self) -> &'static str {
        match self {
            Target::Aarch64 => "aarch64",
            Target::X86_64 => "x86_64",
        }
    }

    /// Debian's architecture name.
    pub fn debian_arch(self) -> &'static str {
        match self {
            Target::Aarch64 => "arm64",
            Target::X86_64 => "amd64",
        }
    }

    /// The OpenWrt package architecture a static binary of this target
    /// installs on: the OpenWrt One's for Arm (every Armv8-A core runs code
    /// built for the A53), x86's generic 64-bit one.
    pub fn openwrt_arch(self) -> &'static str {
        match self {
            Target::Aarch64 => "aarch64_cortex-a53",
            Target::X86_64 => "x86_64",
        }
    }

    /// What `file` prints for a binary of this target.
    pub fn file_machine(self) -> &'static str {
        match self {
            Target::Aarch64 => "ARM aarch64",
            Target::X86_64 => "x86-64",
        }
    }

    /// The cross linker, if the host (x86-64) needs one, and the Debian
    /// packages a static link needs: the compiler driver, and the target's
    /// C library with its start files (only recommended by the driver, so
    /// an install without recommends leaves it out).
    fn linker(self) -> Option<(&'static str, &'static [&'static str])> {
        match self {
            Target::Aarch64 => Some((
                "aarch64-linux-gnu-gcc",
                &["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"],
            )),
            Target::X86_64 => None,
        }
    }

    /// The `strip` that reads this target's binaries.
    pub fn strip(self) -> &'static str {
        match self {
            Target::Aarch64 => "aarch64-linux-gnu-strip",
            Target::X86_64 => "strip",
        }
    }

    fn env_triple(self) -> String {
        self.triple().to_uppercase().replace('-', "_")
    }
}

/// Installs what a static build for `target` needs: the target's standard
/// library at the compiler's exact version and its linker. Adds the
/// architecture to dpkg first when it is foreign.
pub fn ensure_tools(target: Target) -> Result<()> {
    // The BPF object may come from rustup's nightly instead; the cross
    // builds always use Debian's compiler.
    toolchain::debian_route()?;
    let version = installed_version("rustc-web")
        .context("Debian's rustc-web is not installed: run `cargo xtask setup`")?;
    let arch = target.debian_arch();
    let mut missing = Vec::new();
    if let Some((_, packages)) = target.linker() {
        toolchain::add_dpkg_arch(arch)?;
        missing.extend(
            toolchain::dpkg_missing(packages)
                .into_iter()
                .map(str::to_owned),
        );
    }
    let std = format!("libstd-rust-web-dev:{arch}");
    if installed_version(&std).as_deref() != Some(version.as_str()) {
        missing.push(format!("{std}={version}"));
    }
    toolchain::apt_install(&missing)
}

/// The installed version of `package`, `None` when it is not installed.
fn installed_version(package: &str) -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${db:Status-Abbrev} ${Version}\n", package])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next()?;
    line.starts_with("ii ")
        .then(|| line.split_whitespace().nth(1).map(str::to_owned))
        .flatten()
}

/// `cargo ARGS` for `target`, statically linked, with the BPF object.
fn cargo(root: &Path, object: &Path, target: Target) -> Command {
    let mut c = Command::new("cargo");
    let triple = target.env_triple();
    c.current_dir(root)
        .env("RUSTC", "/usr/bin/rustc")
        .env("SHAPER_BPF_OBJECT", object)
        .env(
            format!("CARGO_TARGET_{triple}_RUSTFLAGS"),
            "-C target-feature=+crt-static",
        )
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO_TARGET_DIR");
    if let Some((linker, _)) = target.linker() {
        c.env(format!("CARGO_TARGET_{triple}_LINKER"), linker);
    }
    c
}

/// Builds the release binaries of `packages` for `target`; returns
/// `target/<triple>/release/`.
pub fn build_release(
    root: &Path,
    object: &Path,
    target: Target,
    packages: &[&str],
) -> Result<PathBuf> {
    let mut c = cargo(root, object, target);
    c.args(["build", "--release", "--target", target.triple()]);
    for p in packages {
        c.args(["--package", p]);
    }
    let status = c.status().context("cannot start cargo build")?;
    ensure!(
        status.success(),
        "the static {} build of {} failed ({status})",
        target.name(),
        packages.join(", ")
    );
    Ok(root.join("target").join(target.triple()).join("release"))
}

/// Builds the integration tests for `target`; returns their executables.
pub fn build_tests(root: &Path, object: &Path, target: Target) -> Result<Vec<PathBuf>> {
    let out = cargo(root, object, target)
        .args(["test", "--package", "shaper-tests", "--no-run"])
        .args(["--message-format=json", "--target", target.triple()])
        .output()
        .context("cannot start cargo test --no-run")?;
    ensure!(
        out.status.success(),
        "building the {} integration tests failed:\n{}",
        target.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    let bins = crate::test::executables(&String::from_utf8_lossy(&out.stdout));
    ensure!(!bins.is_empty(), "cargo built no integration test binaries");
    Ok(bins)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_names_agree() {
        assert_eq!(Target::Aarch64.env_triple(), "AARCH64_UNKNOWN_LINUX_GNU");
        assert_eq!(Target::Aarch64.openwrt_arch(), "aarch64_cortex-a53");
        assert_eq!(Target::X86_64.debian_arch(), "amd64");
    }

    #[test]
    fn a_static_cross_link_gets_the_targets_c_library_and_start_files() {
        let (linker, packages) = Target::Aarch64.linker().expect("a cross linker");
        assert_eq!(linker, "aarch64-linux-gnu-gcc");
        // crt1.o, crti.o and libc.a come from the C library's package, which
        // the compiler's package only recommends.
        assert!(packages.contains(&"gcc-aarch64-linux-gnu"), "{packages:?}");
        assert!(packages.contains(&"libc6-dev-arm64-cross"), "{packages:?}");
        assert!(Target::X86_64.linker().is_none());
    }
}
