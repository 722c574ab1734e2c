//! Embeds the BPF object built by `cargo xtask build-ebpf`.
//!
//! The object is built by a different compiler (see xtask's toolchain
//! module), so cargo cannot build it as a normal dependency. This script only
//! locates it: `SHAPER_BPF_OBJECT` if set, else the default output path. When
//! it is missing the binary is still built, so `cargo clippy` and unit tests
//! work anywhere, but it embeds an empty object and every command that needs
//! the kernel program says to run `cargo xtask build` first.

use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=SHAPER_BPF_OBJECT");
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let object = env::var_os("SHAPER_BPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest_dir.join("../target/bpf/bpfel-unknown-none/release/shaper"));
    // Cargo reruns this script when the file appears, changes or disappears.
    println!("cargo:rerun-if-changed={}", object.display());
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default()).join("shaper.bpf.o");
    let bytes = fs::read(&object).unwrap_or_else(|_| {
        println!(
            "cargo:warning=no BPF object at {}: run `cargo xtask build` to embed it",
            object.display()
        );
        Vec::new()
    });
    if let Err(e) = fs::write(&out, bytes) {
        panic!("cannot write {}: {e}", out.display());
    }
}
