//! The flow-offload observer's hooks: two classifiers that only count
//! packets and `skb->len` bytes per direction (see `shaper_common::observe`)
//! and always return `TC_ACT_UNSPEC` (-1), which under TCX and under a
//! direct-action cls_bpf filter means "no verdict, go on": they never drop,
//! redirect or change a packet, and a pacer on the same hook runs as before.
//!
//! Their own per-CPU map, so they neither touch nor need the pacer's maps.

use aya_ebpf::{
    macros::{classifier, map},
    maps::PerCpuArray,
    programs::TcContext,
};
use shaper_common::observe::{Direction, Kind, OBSERVE_COUNTERS, slot};

const TC_ACT_UNSPEC: i32 = -1;

/// Packets and bytes per direction, per CPU.
#[map(name = "OBSERVE_COUNTERS")]
static OBSERVE_COUNTERS_MAP: PerCpuArray<u64> = PerCpuArray::with_max_entries(OBSERVE_COUNTERS, 0);

#[classifier]
pub fn observe_egress(ctx: TcContext) -> i32 {
    count(&ctx, Direction::Egress);
    TC_ACT_UNSPEC
}

#[classifier]
pub fn observe_ingress(ctx: TcContext) -> i32 {
    count(&ctx, Direction::Ingress);
    TC_ACT_UNSPEC
}

#[inline(always)]
fn count(ctx: &TcContext, direction: Direction) {
    add(slot(direction, Kind::Packets), 1);
    add(slot(direction, Kind::Bytes), u64::from(ctx.len()));
}

#[inline(always)]
fn add(index: u32, n: u64) {
    if let Some(p) = OBSERVE_COUNTERS_MAP.get_ptr_mut(index) {
        // SAFETY: the pointer comes from the map lookup and is valid for this
        // program run; per-CPU storage and disabled preemption while a TC
        // program runs mean no one else writes it meanwhile.
        unsafe { *p += n };
    }
}
