//! The flow-offload observer's hooks: two classifiers that only count
//! packets and bytes per direction, as the hook sees them and as they are on
//! the wire (see `shaper_common::observe`), and always return
//! `TC_ACT_UNSPEC` (-1), which under TCX and under a direct-action cls_bpf
//! filter means "no verdict, go on": they never drop, redirect or change a
//! packet, and a pacer on the same hook runs as before.
//!
//! Their own maps, so they neither touch nor need the pacer's. Headers are
//! parsed (for their length) only for GSO packets.

use aya_ebpf::{
    macros::{classifier, map},
    maps::{Array, PerCpuArray},
    programs::TcContext,
};
use shaper_common::{
    config::FLAG_NO_L2,
    observe::{Direction, Kind, OBSERVE_COUNTERS, slot},
    rate::wire_len_bytes,
};

use crate::{hook::TC_ACT_UNSPEC, parse::classify};

/// Packets and bytes per direction, per CPU.
#[map(name = "OBSERVE_COUNTERS")]
static OBSERVE_COUNTERS_MAP: PerCpuArray<u64> = PerCpuArray::with_max_entries(OBSERVE_COUNTERS, 0);

/// Flags written by the controller before attaching (`FLAG_NO_L2`).
#[map(name = "OBSERVE_FLAGS")]
static OBSERVE_FLAGS: Array<u32> = Array::with_max_entries(1, 0);

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
    let len = ctx.len();
    // SAFETY: reading a field of the __sk_buff the kernel passed in.
    let segs = unsafe { (*ctx.skb.skb).gso_segs }.max(1);
    let wire = if segs > 1 {
        let has_l2 = OBSERVE_FLAGS.get(0).is_none_or(|f| f & FLAG_NO_L2 == 0);
        // Unknown headers (truncated) charge the length alone.
        let headers = classify(ctx, has_l2, 0).map_or(0, |c| c.headers_len);
        wire_len_bytes(len, segs, headers)
    } else {
        len
    };
    add(slot(direction, Kind::Packets), 1);
    add(slot(direction, Kind::Bytes), u64::from(len));
    add(slot(direction, Kind::WirePackets), u64::from(segs));
    add(slot(direction, Kind::WireBytes), u64::from(wire));
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
