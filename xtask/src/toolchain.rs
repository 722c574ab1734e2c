//! Installs and locates the toolchain that builds the BPF object, on a fresh
//! machine, idempotently (seconds when everything is there).
//!
//! Two routes (see shared notes, toolchain.md):
//! 1. rustup's nightly with the `rust-src` component, the standard aya route,
//!    used when that component is present and its LLVM major matches
//!    bpf-linker's;
//! 2. otherwise Debian's `rustc-web` compiler with its matching library
//!    source `rust-web-src`, driven by rustup's cargo with
//!    `RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1` (rustup's nightly here has no
//!    `rust-src` and cannot download it).
//!
//! Either way `-Z build-std=core --target bpfel-unknown-none` builds `core`
//! from source, and bpf-linker (built from crates.io against Debian's
//! llvm-22-dev) links the object. The compiler's LLVM major must equal
//! bpf-linker's, or bpf-linker cannot read the compiler's bitcode.
//!
//! Invariants checked: the Debian compiler's version equals the version of the
//! library source under /usr/lib/rustlib/src; LLVM majors match.

use std::{
    env,
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};

/// The LLVM major bpf-linker is built against, and so the compiler must use.
pub const LLVM_MAJOR: u32 = 22;
/// bpf-linker's version (0.13 is the line with the llvm-22 feature).
pub const BPF_LINKER_VERSION: &str = "0.13.0";
/// Debian's compiler packages, pinned together: they are published as a set.
/// When Debian supersedes this version, `setup` takes the candidate version of
/// all three instead, and the version checks below still hold.
pub const DEBIAN_RUST_VERSION: &str = "1.96.0+dfsg1-1~deb12u2";
const DEBIAN_RUST_PACKAGES: [&str; 3] = ["rustc-web", "libstd-rust-web-dev", "rust-web-src"];
/// What building bpf-linker needs.
const LINKER_BUILD_PACKAGES: [&str; 3] = ["llvm-22-dev", "libzstd-dev", "zlib1g-dev"];
/// Tools the tests and the lab drive, on the host and (shared) in the VM.
/// nftables and conntrack: the observer's flowtable test (`nft`) and
/// inspecting its conntrack entries by hand (`conntrack -L`).
pub const TEST_PACKAGES: [&str; 7] = [
    "iproute2",
    "iperf3",
    "iputils-ping",
    "bpftool",
    "procps",
    "nftables",
    "conntrack",
];

/// How to invoke cargo for the BPF build.
#[derive(Clone, Debug)]
pub struct BpfToolchain {
    /// Which route was chosen, for messages.
    pub route: &'static str,
    /// Arguments placed before `build` (e.g. `+nightly`).
    pub cargo_prefix: Vec<String>,
    /// Environment for the cargo invocation.
    pub env: Vec<(String, OsString)>,
}

fn cargo_home() -> PathBuf {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
}

/// PATH with cargo's bin directory first (where bpf-linker is installed).
pub fn path_with_cargo_bin() -> OsString {
    let mut paths = vec![cargo_home().join("bin")];
    if let Some(p) = env::var_os("PATH") {
        paths.extend(env::split_paths(&p));
    }
    env::join_paths(paths).unwrap_or_else(|_| OsString::from("/usr/bin:/bin"))
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Parses `LLVM version: 22.1.4` out of `rustc -vV`.
pub fn llvm_major(rustc_vv: &str) -> Option<u32> {
    rustc_vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version:"))
        .and_then(|v| v.trim().split('.').next())
        .and_then(|m| m.parse().ok())
}

/// Parses `release: 1.96.0` out of `rustc -vV`.
pub fn rustc_release(rustc_vv: &str) -> Option<String> {
    rustc_vv
        .lines()
        .find_map(|l| l.strip_prefix("release:"))
        .map(|v| v.trim().to_owned())
}

/// Packages of `wanted` that dpkg does not list as installed, given
/// `dpkg-query -W -f '${Package} ${db:Status-Abbrev}\n'` output.
pub fn missing_packages<'a>(wanted: &[&'a str], dpkg_out: &str) -> Vec<&'a str> {
    wanted
        .iter()
        .copied()
        .filter(|p| {
            !dpkg_out.lines().any(|l| {
                let mut it = l.split_whitespace();
                let name = it.next().unwrap_or("");
                let name = name.split(':').next().unwrap_or(name);
                name == *p && it.next().is_some_and(|s| s.starts_with("ii"))
            })
        })
        .collect()
}

/// The packages of `wanted` that dpkg does not have installed.
pub fn dpkg_missing<'a>(wanted: &[&'a str]) -> Vec<&'a str> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${Package} ${db:Status-Abbrev}\n"])
        .args(wanted)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    missing_packages(wanted, &out)
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {what}"))?;
    ensure!(status.success(), "{what} failed ({status})");
    Ok(())
}

/// Lets dpkg and apt take packages of `arch` (`dpkg --add-architecture`
/// and a package list refresh), once: the native architecture and one
/// already added are left as they are.
pub fn add_dpkg_arch(arch: &str) -> Result<()> {
    let listed = |flag: &str| -> Result<bool> {
        let out = Command::new("dpkg")
            .arg(flag)
            .output()
            .with_context(|| format!("cannot run dpkg {flag}"))?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.trim() == arch))
    };
    if listed("--print-architecture")? || listed("--print-foreign-architectures")? {
        return Ok(());
    }
    eprintln!("xtask: adding the {arch} architecture to dpkg");
    run(
        Command::new("dpkg").args(["--add-architecture", arch]),
        "dpkg --add-architecture",
    )?;
    run(
        Command::new("apt-get").args(["update", "-q"]),
        "apt-get update",
    )
}

/// Installs Debian packages that are missing. Runs `apt-get update` first
/// only when needed (the first install attempt fails or a version is unknown).
pub fn apt_install(packages: &[String]) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing Debian packages: {}", packages.join(" "));
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if install() {
        return Ok(());
    }
    run(
        Command::new("apt-get").args(["update", "-q"]),
        "apt-get update",
    )?;
    ensure!(
        install(),
        "apt-get install {} failed: see the output above (are you root?)",
        packages.join(" ")
    );
    Ok(())
}

/// The version to pin the Debian compiler set at: ours if apt knows it, else
/// the candidate (a newer security update).
fn debian_rust_version() -> Result<String> {
    let policy = |refresh: bool| -> Option<String> {
        if refresh {
            let _ = Command::new("apt-get").args(["update", "-q"]).status();
        }
        output(Command::new("apt-cache").args(["policy", "rustc-web"]))
    };
    for refresh in [false, true] {
        if let Some(text) = policy(refresh) {
            if text.contains(DEBIAN_RUST_VERSION) {
                return Ok(DEBIAN_RUST_VERSION.to_owned());
            }
            if let Some(c) = text
                .lines()
                .find_map(|l| l.trim().strip_prefix("Candidate:"))
                .map(str::trim)
                .filter(|c| *c != "(none)")
            {
                eprintln!("xtask: Debian no longer has rustc-web {DEBIAN_RUST_VERSION}; using {c}");
                return Ok(c.to_owned());
            }
        }
    }
    bail!("apt knows no rustc-web package: is this Debian 12 with bookworm-security enabled?")
}

/// Nightly with rust-src and a matching LLVM, if this machine has it.
fn nightly_route() -> Option<BpfToolchain> {
    let sysroot =
        output(Command::new("rustup").args(["run", "nightly", "rustc", "--print", "sysroot"]))?;
    let src = Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library/core");
    if !src.exists() {
        return None;
    }
    let vv = output(Command::new("rustup").args(["run", "nightly", "rustc", "-vV"]))?;
    (llvm_major(&vv) == Some(LLVM_MAJOR)).then(|| BpfToolchain {
        route: "rustup nightly with rust-src",
        cargo_prefix: vec!["+nightly".to_owned()],
        env: Vec::new(),
    })
}

/// Debian's compiler set, installed if missing and checked (also what the
/// static cross builds compile with).
pub fn debian_route() -> Result<BpfToolchain> {
    let missing = dpkg_missing(&DEBIAN_RUST_PACKAGES);
    if !missing.is_empty() {
        let version = debian_rust_version()?;
        let pkgs: Vec<String> = DEBIAN_RUST_PACKAGES
            .iter()
            .map(|p| format!("{p}={version}"))
            .collect();
        apt_install(&pkgs)?;
    }
    let rustc = PathBuf::from("/usr/bin/rustc");
    let vv = output(Command::new(&rustc).arg("-vV"))
        .context("/usr/bin/rustc -vV failed: is Debian's rustc-web installed?")?;
    let release = rustc_release(&vv).context("no release in /usr/bin/rustc -vV")?;
    let llvm = llvm_major(&vv).context("no LLVM version in /usr/bin/rustc -vV")?;
    ensure!(
        llvm == LLVM_MAJOR,
        "Debian's rustc {release} uses LLVM {llvm}, but bpf-linker is built for LLVM {LLVM_MAJOR}: \
         update LLVM_MAJOR and the llvm-N-dev package in xtask/src/toolchain.rs together"
    );
    // rust-web-src installs the library source under /usr/src/rustc-<release>
    // (with /usr/lib/rustlib/src/rust pointing at it), so the directory name
    // proves compiler and source match.
    let src_dir = PathBuf::from(format!("/usr/src/rustc-{release}/library/core"));
    ensure!(
        src_dir.exists(),
        "the library source for Debian's rustc {release} is missing ({}): install rust-web-src \
         at the same version as rustc-web",
        src_dir.display()
    );
    let dpkg_versions = output(
        Command::new("dpkg-query")
            .args(["-W", "-f", "${Version}\n"])
            .args(DEBIAN_RUST_PACKAGES),
    )
    .unwrap_or_default();
    let versions: std::collections::BTreeSet<&str> = dpkg_versions.lines().collect();
    ensure!(
        versions.len() == 1,
        "rustc-web, libstd-rust-web-dev and rust-web-src are at different versions ({}): \
         install all three at one version",
        versions.into_iter().collect::<Vec<_>>().join(", ")
    );
    Ok(BpfToolchain {
        route: "Debian rustc-web with rust-web-src",
        cargo_prefix: Vec::new(),
        env: vec![
            ("RUSTC".to_owned(), rustc.into_os_string()),
            ("RUSTC_BOOTSTRAP".to_owned(), OsString::from("1")),
        ],
    })
}

/// bpf-linker's version, if one is on PATH (cargo's bin first).
fn installed_bpf_linker() -> Option<String> {
    let out = output(
        Command::new("bpf-linker")
            .arg("--version")
            .env("PATH", path_with_cargo_bin()),
    )?;
    out.split_whitespace().nth(1).map(str::to_owned)
}

fn ensure_bpf_linker() -> Result<()> {
    if installed_bpf_linker().as_deref() == Some(BPF_LINKER_VERSION) {
        return Ok(());
    }
    apt_install(
        &dpkg_missing(&LINKER_BUILD_PACKAGES)
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
    )?;
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against LLVM {LLVM_MAJOR} (about 2 minutes)"
    );
    // bpf-linker's build finds LLVM through llvm-config, which must be
    // llvm-22's: put its directory first.
    let llvm_bin = PathBuf::from(format!("/usr/lib/llvm-{LLVM_MAJOR}/bin"));
    let mut paths = vec![llvm_bin];
    paths.extend(env::split_paths(&path_with_cargo_bin()));
    let path = env::join_paths(paths).context("PATH")?;
    run(
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--locked",
                "--version",
                BPF_LINKER_VERSION,
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{LLVM_MAJOR}"),
            ])
            .env("PATH", path),
        "cargo install bpf-linker",
    )?;
    ensure!(
        installed_bpf_linker().as_deref() == Some(BPF_LINKER_VERSION),
        "bpf-linker {BPF_LINKER_VERSION} is still not on PATH after installing it into {}",
        cargo_home().join("bin").display()
    );
    Ok(())
}

/// Installs everything the BPF build and the tests need; returns how to
/// build. `extra_packages` are other Debian packages to ensure (the VM's).
pub fn setup(extra_packages: &[&str]) -> Result<BpfToolchain> {
    let mut wanted: Vec<&str> = TEST_PACKAGES.to_vec();
    wanted.extend_from_slice(extra_packages);
    apt_install(
        &dpkg_missing(&wanted)
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
    )?;
    ensure_bpf_linker()?;
    let toolchain = match nightly_route() {
        Some(t) => t,
        None => debian_route()?,
    };
    Ok(toolchain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rustc_vv() {
        let vv = "rustc 1.96.0 (abc 2026-05-01) (built from a source tarball)\n\
                  binary: rustc\nrelease: 1.96.0\nLLVM version: 22.1.8\n";
        assert_eq!(llvm_major(vv), Some(22));
        assert_eq!(rustc_release(vv).as_deref(), Some("1.96.0"));
        assert_eq!(llvm_major("release: 1.0\n"), None);
    }

    #[test]
    fn finds_missing_packages() {
        let dpkg = "rustc-web ii \nllvm-22-dev:amd64 ii \nqemu-system-x86 rc \n";
        assert_eq!(
            missing_packages(
                &["rustc-web", "llvm-22-dev", "qemu-system-x86", "cpio"],
                dpkg
            ),
            vec!["qemu-system-x86", "cpio"]
        );
        assert!(missing_packages(&["rustc-web"], dpkg).is_empty());
    }
}
