//! Helpers for the privileged integration tests: network-namespace guards,
//! kernel feature probes, and skips with a reason.

pub mod bpf_harness;
pub mod netns;
pub mod packets;
pub mod skip;
pub mod tc_util;
pub mod topo;
