//! The embedded BPF object and helpers to load it.

pub mod load;
pub mod stats;
pub mod test_run;

/// The BPF object built by `cargo xtask build-ebpf`, 8-byte aligned as the
/// ELF parser wants. Empty when the binary was built without it.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/shaper.bpf.o"));

/// Errors about the embedded object itself.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The binary was built before the BPF object existed.
    #[error(
        "this shaper binary has no BPF program embedded: build it with `cargo xtask build` \
         (which builds the BPF object first), not plain `cargo build`"
    )]
    Missing,
}

/// The embedded object, or an error that says how to get one.
pub fn object() -> Result<&'static [u8], ObjectError> {
    if OBJECT.is_empty() {
        Err(ObjectError::Missing)
    } else {
        Ok(OBJECT)
    }
}
