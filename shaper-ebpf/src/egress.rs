//! The egress classifier: counts every packet by class, then stamps its
//! earliest departure time, which sch_fq enforces. Two pacers:
//! - the fair pacer (`shaper_common::fair`, the default): a clock per flow in
//!   a set-associative flow table, paced at a shared fair share, with CoDel
//!   on each flow's scheduled delay (CE mark or drop);
//! - the aggregate pacer (`shaper_common::edt`): one clock for all traffic,
//!   Cilium's design, kept for comparison.
//!
//! A GSO super-packet is charged its wire length: every segment repeats the
//! headers.
//!
//! Verdicts: `TC_ACT_UNSPEC` (-1, "next") lets later programs on the hook
//! run and then passes the packet, under both TCX and legacy tc;
//! `TC_ACT_SHOT` (2) drops. The shaper never redirects.
//!
//! Concurrency: see `shaper_common::fair` (flow state without locks; the
//! epoch ring, the committed count and the multiplier with atomics, one CPU
//! per epoch change won by compare-and-swap; `shaper_common::committed`
//! says what a race on the count costs). The aggregate clock is read and
//! written without a lock, as Cilium's is; a race costs at most one packet
//! of burst.

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_skb_set_tstamp},
    macros::classifier,
    programs::TcContext,
};
use shaper_common::{
    config::{FLAG_DELIVERY_MONO, FLAG_TELEMETRY, PacerConfig},
    counters::Counter,
    edt::{EdtDecision, aggregate_edt},
    event::{VERDICT_AQM_DROP, VERDICT_CE, VERDICT_HORIZON_DROP, VERDICT_PACED, VERDICT_PASS},
    fair::{Packet, Verdict},
    rate::wire_len_bytes,
    shared::{account, pace},
};

use crate::{
    ce::mark_ce,
    fair_state::{AtomicFair, Rolled, roll},
    hook::{TC_ACT_SHOT, TC_ACT_UNSPEC, count_and_classify, flow_entry},
    maps::{AGGREGATE, CONFIG, count},
    parse::Class,
    telemetry::{Outcome, report, stash},
    veil::Veil,
};

#[classifier]
pub fn shaper_egress(ctx: TcContext) -> i32 {
    match try_shaper_egress(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

/// A classifier that only passes packets: the benchmark's baseline.
#[classifier]
pub fn shaper_passthrough(_ctx: TcContext) -> i32 {
    TC_ACT_UNSPEC
}

#[inline(always)]
fn try_shaper_egress(ctx: &TcContext) -> Result<i32, i32> {
    let len = ctx.len();
    count(Counter::Packets, 1);
    count(Counter::Bytes, u64::from(len));

    let Some(config) = CONFIG.get(0) else {
        return Ok(TC_ACT_UNSPEC);
    };
    let veil = Veil::new(config);
    let rolled = if config.fair() {
        roll::<true>(config, veil)
    } else {
        Rolled::NONE
    };
    let class = count_and_classify(ctx, config);
    if config.flags & FLAG_TELEMETRY != 0 {
        stash(&class);
    }
    let headers_len = class.headers_len;
    // SAFETY: reading a field of the __sk_buff the kernel passed in.
    let gso_segs = unsafe { (*ctx.skb.skb).gso_segs };
    let wire_len = wire_len_bytes(len, gso_segs, headers_len);
    count(Counter::WireBytes, u64::from(wire_len));

    if !config.enabled() {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    }
    let tx_time_ns = config.scaled_rate().tx_time_ns(wire_len);
    // On an IFB fed from ingress the stamp is never a departure time.
    let skb_tstamp_ns = if config.flags & FLAG_DELIVERY_MONO != 0 {
        0
    } else {
        // SAFETY: reading a field of the __sk_buff the kernel passed in.
        unsafe { (*ctx.skb.skb).tstamp }
    };
    if config.fair() {
        return fair(ctx, config, class, &rolled, veil, skb_tstamp_ns, tx_time_ns);
    }
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now_ns = unsafe { bpf_ktime_get_ns() };
    aggregate(
        ctx,
        config,
        class.ecn.capable(),
        now_ns,
        skb_tstamp_ns,
        tx_time_ns,
    )
}

/// The fair pacer, on the shared state `rolled` to this packet's epoch. A
/// truncated frame (no key) is paced as flow 0.
#[inline(always)]
fn fair(
    ctx: &TcContext,
    config: &PacerConfig,
    class: Class,
    rolled: &Rolled,
    veil: Veil,
    skb_tstamp_ns: u64,
    tx_ns: u64,
) -> Result<i32, i32> {
    if rolled.state.is_null() {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    }
    let (now_ns, epoch, mult_q16) = (rolled.now_ns, rolled.epoch, rolled.mult_q16);
    // SAFETY: the pointer is non-null, so it comes from the map lookup of
    // this run and stays valid for it; the fields are only accessed
    // atomically.
    let mut shared = unsafe { AtomicFair::new(rolled.state, veil) };

    let Some((flow, flow_started)) = flow_entry(config, class.flow_hash, now_ns) else {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    };
    let ecn = class.ecn;
    let pkt = Packet {
        now_ns,
        skb_tstamp_ns,
        tx_ns,
        ect: ecn.capable(),
    };
    let verdict = pace::<_, true>(
        &mut shared,
        flow,
        &pkt,
        epoch,
        mult_q16,
        &config.fair_params(),
    );
    if matches!(
        verdict,
        Verdict::Pass | Verdict::Pace { .. } | Verdict::Mark { .. }
    ) {
        account(&mut shared, epoch, tx_ns);
    }
    let clock_delay_ns = flow.t_next_ns.saturating_sub(now_ns);
    let (code, delay_ns, action) = match verdict {
        Verdict::Pass => {
            stamp_now_if_mono(ctx, config, now_ns);
            count(Counter::PassedUnpaced, 1);
            (VERDICT_PASS, 0, TC_ACT_UNSPEC)
        }
        Verdict::Pace { tstamp_ns } => {
            set_tstamp(ctx, config, tstamp_ns);
            count(Counter::Paced, 1);
            (
                VERDICT_PACED,
                tstamp_ns.saturating_sub(now_ns),
                TC_ACT_UNSPEC,
            )
        }
        Verdict::Mark { tstamp_ns } => {
            if mark_ce(ctx, ecn) {
                set_tstamp(ctx, config, tstamp_ns);
                count(Counter::CeMarked, 1);
                count(Counter::Paced, 1);
                (VERDICT_CE, tstamp_ns.saturating_sub(now_ns), TC_ACT_UNSPEC)
            } else {
                count(Counter::CeMarkFailed, 1);
                (VERDICT_AQM_DROP, clock_delay_ns, TC_ACT_SHOT)
            }
        }
        Verdict::CodelDrop => {
            count(Counter::AqmDrop, 1);
            count(Counter::CodelDrop, 1);
            (VERDICT_AQM_DROP, clock_delay_ns, TC_ACT_SHOT)
        }
        Verdict::OverloadDrop => {
            count(Counter::AqmDrop, 1);
            count(Counter::OverloadDrop, 1);
            (VERDICT_AQM_DROP, clock_delay_ns, TC_ACT_SHOT)
        }
        Verdict::HorizonDrop => {
            count(Counter::HorizonDrop, 1);
            (VERDICT_HORIZON_DROP, clock_delay_ns, TC_ACT_SHOT)
        }
    };
    if config.flags & FLAG_TELEMETRY != 0 {
        let outcome = Outcome {
            verdict: code,
            delay_ns,
            flow_started,
            action,
        };
        // Returns only when no record is due (or the tail call failed).
        report(ctx, config, ecn.capable(), now_ns, &outcome);
    }
    Ok(action)
}

/// Writes the departure time (monotonic ns) sch_fq enforces; on an IFB
/// fed from ingress (`FLAG_DELIVERY_MONO`) through `bpf_skb_set_tstamp`,
/// which also marks it a mono delivery time.
#[inline(always)]
fn set_tstamp(ctx: &TcContext, config: &PacerConfig, tstamp_ns: u64) {
    if config.flags & FLAG_DELIVERY_MONO != 0 {
        // SAFETY: the helper takes the context the kernel passed in; a
        // failure (an old kernel) leaves the stamp unset and the packet
        // unpaced.
        unsafe {
            bpf_skb_set_tstamp(ctx.skb.skb, tstamp_ns, BPF_SKB_TSTAMP_DELIVERY_MONO);
        }
        return;
    }
    // SAFETY: the skb is ours to stamp at egress.
    unsafe { (*ctx.skb.skb).tstamp = tstamp_ns };
}

/// On an IFB fed from ingress, stamps a packet that leaves at once with
/// `now_ns`: should a receive time (CLOCK_REALTIME) have survived the
/// redirect, sch_fq would read it as a departure decades ahead and drop it.
#[inline(always)]
fn stamp_now_if_mono(ctx: &TcContext, config: &PacerConfig, now_ns: u64) {
    if config.flags & FLAG_DELIVERY_MONO != 0 {
        set_tstamp(ctx, config, now_ns);
    }
}

/// `BPF_SKB_TSTAMP_DELIVERY_MONO` in `include/uapi/linux/bpf.h`.
const BPF_SKB_TSTAMP_DELIVERY_MONO: u32 = 1;

/// The aggregate pacer (Cilium's design).
#[inline(always)]
fn aggregate(
    ctx: &TcContext,
    config: &PacerConfig,
    ect: bool,
    now_ns: u64,
    skb_tstamp_ns: u64,
    tx_time_ns: u64,
) -> Result<i32, i32> {
    let Some(state) = AGGREGATE.get_ptr_mut(0) else {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    };
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
    let (code, delay_ns, action) = match decision {
        EdtDecision::Pass => {
            stamp_now_if_mono(ctx, config, now_ns);
            // SAFETY: as for the read above.
            unsafe { core::ptr::write_volatile(&mut (*state).t_next_free_ns, clock) };
            count(Counter::PassedUnpaced, 1);
            (VERDICT_PASS, 0, TC_ACT_UNSPEC)
        }
        EdtDecision::Pace { tstamp_ns } => {
            // SAFETY: as for the read above.
            unsafe { core::ptr::write_volatile(&mut (*state).t_next_free_ns, clock) };
            set_tstamp(ctx, config, tstamp_ns);
            count(Counter::Paced, 1);
            (
                VERDICT_PACED,
                tstamp_ns.saturating_sub(now_ns),
                TC_ACT_UNSPEC,
            )
        }
        EdtDecision::HorizonDrop => {
            count(Counter::HorizonDrop, 1);
            (
                VERDICT_HORIZON_DROP,
                t_next_free_ns.saturating_sub(now_ns),
                TC_ACT_SHOT,
            )
        }
    };
    if config.flags & FLAG_TELEMETRY != 0 {
        let outcome = Outcome {
            verdict: code,
            delay_ns,
            flow_started: false,
            action,
        };
        report(ctx, config, ect, now_ns, &outcome);
    }
    Ok(action)
}
