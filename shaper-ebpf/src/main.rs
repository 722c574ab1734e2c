//! The shaper's kernel programs. Entry points are thin: each calls a `try_*`
//! function and maps its result to a verdict. Parsing lives in `parse`, maps
//! in `maps`, the pacing arithmetic in `shaper-common` (shared with the host
//! tests).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// The atomic intrinsics (see `atomic`); the BPF build runs with
// RUSTC_BOOTSTRAP=1 already, for build-std.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
// The veil's XOR is one instruction of inline assembly (see `veil`).
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod atomic;
#[cfg(target_arch = "bpf")]
mod calls;
#[cfg(target_arch = "bpf")]
mod ce;
#[cfg(target_arch = "bpf")]
mod egress;
#[cfg(target_arch = "bpf")]
mod fair_state;
#[cfg(target_arch = "bpf")]
mod hook;
#[cfg(target_arch = "bpf")]
mod hosts;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod nat;
#[cfg(target_arch = "bpf")]
mod observe;
#[cfg(target_arch = "bpf")]
mod parse;
#[cfg(target_arch = "bpf")]
mod police;
#[cfg(target_arch = "bpf")]
mod redirect;
#[cfg(target_arch = "bpf")]
mod telemetry;
#[cfg(target_arch = "bpf")]
mod trace;
#[cfg(target_arch = "bpf")]
mod veil;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any path that could reach this; it only exists to
    // satisfy `no_std`.
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

/// Host builds (clippy, `cargo check --workspace`) see an empty binary.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
