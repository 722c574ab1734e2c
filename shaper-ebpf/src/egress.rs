//! The egress classifier: counts every packet by class, then stamps its
//! earliest departure time with the aggregate EDT pacer
//! (`shaper_common::edt`), which sch_fq enforces. A GSO super-packet is
//! charged its wire length: every segment repeats the headers.
//!
//! Verdicts: `TC_ACT_UNSPEC` (-1, "next") lets later programs on the hook
//! run and then passes the packet, under both TCX and legacy tc;
//! `TC_ACT_SHOT` (2) drops. The shaper never redirects.
//!
//! Concurrency: the aggregate clock is one value shared by all CPUs and is
//! read and written without a lock, as Cilium's EDT does; two CPUs racing can
//! give two packets the same slot, which costs at most one packet of burst.
//! The fair pacer replaces this clock with per-flow state.

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::classifier, programs::TcContext};
use shaper_common::{
    config::FLAG_NO_L2,
    counters::Counter,
    edt::{EdtDecision, aggregate_edt},
    rate::wire_len_bytes,
};

use crate::{
    maps::{AGGREGATE, CONFIG, count},
    parse::classify,
};

const TC_ACT_UNSPEC: i32 = -1;
const TC_ACT_SHOT: i32 = 2;

#[classifier]
pub fn shaper_egress(ctx: TcContext) -> i32 {
    match try_shaper_egress(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

#[inline(always)]
fn try_shaper_egress(ctx: &TcContext) -> Result<i32, i32> {
    let len = ctx.len();
    count(Counter::Packets, 1);
    count(Counter::Bytes, u64::from(len));

    let Some(config) = CONFIG.get(0) else {
        return Ok(TC_ACT_UNSPEC);
    };
    let headers_len = match classify(ctx, config.flags & FLAG_NO_L2 == 0) {
        Ok(class) => {
            count(class.l3, 1);
            if let Some(l4) = class.l4 {
                count(l4, 1);
            }
            if class.vlan {
                count(Counter::Vlan, 1);
            }
            class.headers_len
        }
        Err(_) => {
            count(Counter::Truncated, 1);
            0
        }
    };
    // SAFETY: reading a field of the __sk_buff the kernel passed in.
    let gso_segs = unsafe { (*ctx.skb.skb).gso_segs };
    let wire_len = wire_len_bytes(len, gso_segs, headers_len);
    count(Counter::WireBytes, u64::from(wire_len));

    if !config.enabled() {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    }
    let Some(state) = AGGREGATE.get_ptr_mut(0) else {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    };
    let tx_time_ns = config.scaled_rate().tx_time_ns(wire_len);
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now_ns = unsafe { bpf_ktime_get_ns() };
    // SAFETY: reading a field of the __sk_buff the kernel passed in.
    let skb_tstamp_ns = unsafe { (*ctx.skb.skb).tstamp };
    // SAFETY: the pointer comes from the map lookup and stays valid for this
    // run; concurrent writers are tolerated (see the module header).
    let t_next_free_ns = unsafe { core::ptr::read_volatile(&(*state).t_next_free_ns) };
    let (decision, clock) = aggregate_edt(
        now_ns,
        skb_tstamp_ns,
        t_next_free_ns,
        tx_time_ns,
        config.horizon_ns,
    );
    match decision {
        EdtDecision::Pass => {
            // SAFETY: as for the read above.
            unsafe { core::ptr::write_volatile(&mut (*state).t_next_free_ns, clock) };
            count(Counter::PassedUnpaced, 1);
            Ok(TC_ACT_UNSPEC)
        }
        EdtDecision::Pace { tstamp_ns } => {
            // SAFETY: as for the read above; the skb is ours to stamp at egress.
            unsafe {
                core::ptr::write_volatile(&mut (*state).t_next_free_ns, clock);
                (*ctx.skb.skb).tstamp = tstamp_ns;
            }
            count(Counter::Paced, 1);
            Ok(TC_ACT_UNSPEC)
        }
        EdtDecision::HorizonDrop => {
            count(Counter::HorizonDrop, 1);
            Err(TC_ACT_SHOT)
        }
    }
}
