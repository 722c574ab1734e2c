//! Helpers for the privileged integration tests: network-namespace guards,
//! kernel feature probes, skips with a reason, and the real `shaper` binary
//! under test.

pub mod bpf_harness;
pub mod bpf_reset;
pub mod netns;
pub mod packets;
pub mod shaper_proc;
pub mod skip;
pub mod tc_util;
pub mod topo;
pub mod traffic;
pub mod vs_cake;
