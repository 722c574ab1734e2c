//! Helper-call counting for the benchmark (`shaper_common::calls`): one
//! fentry program per helper the classifiers call, each adding one to the
//! helper's per-CPU slot. The product never loads these; the benchmark
//! attaches them around an untimed pass.
//!
//! Invariant: program `i` below counts `HELPERS[i]` into slot `i`; the
//! benchmark loads each program by the name `HELPERS[i].program` gives and
//! attaches it to `HELPERS[i].function`, so a name out of step fails the
//! load instead of miscounting.

use aya_ebpf::{
    macros::{fentry, map},
    maps::PerCpuArray,
    programs::FEntryContext,
};
use shaper_common::calls::HELPERS;

/// Calls per helper, per CPU, in the order of `HELPERS`.
#[map(name = "SHAPER_HELPER_CALLS")]
static HELPER_CALLS: PerCpuArray<u64> = PerCpuArray::with_max_entries(HELPERS.len() as u32, 0);

#[inline(always)]
fn bump(slot: u32) -> i32 {
    if let Some(n) = HELPER_CALLS.get_ptr_mut(slot) {
        // SAFETY: the pointer comes from the map lookup of this run; the
        // slot is this CPU's and fentry programs run with migration off.
        unsafe { *n += 1 };
    }
    0
}

#[fentry(function = "bpf_skb_load_bytes")]
pub fn calls_load(_ctx: FEntryContext) -> i32 {
    bump(0)
}

#[fentry(function = "bpf_ktime_get_ns")]
pub fn calls_ktime(_ctx: FEntryContext) -> i32 {
    bump(1)
}

#[fentry(function = "bpf_skb_set_tstamp")]
pub fn calls_tstamp(_ctx: FEntryContext) -> i32 {
    bump(2)
}

#[fentry(function = "bpf_skb_store_bytes")]
pub fn calls_store(_ctx: FEntryContext) -> i32 {
    bump(3)
}

#[fentry(function = "bpf_user_rnd_u32")]
pub fn calls_prandom(_ctx: FEntryContext) -> i32 {
    bump(4)
}

#[fentry(function = "bpf_ringbuf_output")]
pub fn calls_ringbuf(_ctx: FEntryContext) -> i32 {
    bump(5)
}

#[fentry(function = "bpf_redirect")]
pub fn calls_redirect(_ctx: FEntryContext) -> i32 {
    bump(6)
}
