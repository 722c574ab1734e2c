//! Builds the BPF object and the binaries that embed it.
//!
//! The object goes to `target/bpf/bpfel-unknown-none/release/shaper` (its own
//! target directory, since it is built by another compiler), where
//! `shaper/build.rs` picks it up.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, ensure};

use crate::toolchain::{self, BpfToolchain};

/// Where the object lands, relative to the workspace.
pub const OBJECT: &str = "target/bpf/bpfel-unknown-none/release/shaper";

/// Builds `shaper-ebpf` for `bpfel-unknown-none`; returns the object's path.
pub fn build_ebpf(root: &Path, tc: &BpfToolchain) -> Result<PathBuf> {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root)
        .args(&tc.cargo_prefix)
        .args(["build", "--package", "shaper-ebpf", "--release"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .args(["--target-dir", "target/bpf"])
        .env("PATH", toolchain::path_with_cargo_bin())
        // BTF for the maps and programs; debuginfo feeds it. BPF ISA v3 for
        // atomic fetch-and-add and compare-and-swap (kernel 5.12 and later).
        .env(
            "CARGO_TARGET_BPFEL_UNKNOWN_NONE_RUSTFLAGS",
            "-C debuginfo=2 -C link-arg=--btf -C target-cpu=v3",
        )
        // The outer `cargo xtask` may have set these for its own toolchain.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO_TARGET_DIR");
    for (k, v) in &tc.env {
        cmd.env(k, v);
    }
    let status = cmd
        .status()
        .context("cannot start cargo to build the BPF object")?;
    ensure!(
        status.success(),
        "building the BPF object failed ({status}) using {}",
        tc.route
    );
    let object = root.join(OBJECT);
    ensure!(
        object.exists(),
        "the BPF build succeeded but {} is missing",
        object.display()
    );
    Ok(object)
}

/// `cargo build` of the host side, with the object's path passed explicitly.
pub fn build_host(root: &Path, object: &Path, release: bool) -> Result<PathBuf> {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root)
        .args(["build", "--package", "shaper"])
        .env("SHAPER_BPF_OBJECT", object);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().context("cannot start cargo build")?;
    ensure!(status.success(), "cargo build failed ({status})");
    let bin = root
        .join("target")
        .join(if release { "release" } else { "debug" })
        .join("shaper");
    ensure!(bin.exists(), "{} is missing after the build", bin.display());
    Ok(bin)
}
