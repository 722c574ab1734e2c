//! `cargo xtask vm`: boots a stock Debian kernel in QEMU (placeholder; being written).

use std::path::Path;

use anyhow::{Result, bail};

/// Which stock Debian kernel to boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kernel {
    /// Debian 12's 6.12 from bookworm's security updates (has TCX).
    #[value(name = "6.12")]
    V6_12,
    /// Debian 12's 6.1 LTS (no TCX: netlink attach).
    #[value(name = "6.1")]
    V6_1,
}

/// Boots `kernel`, runs `cmd` (argv) in the guest with the host root shared
/// read-only and `workspace` shared read-write at the same path, streams its
/// output and returns its exit code.
pub fn run(workspace: &Path, kernel: Kernel, cmd: &[String]) -> Result<i32> {
    let _ = (workspace, kernel, cmd);
    bail!("not written yet")
}
