//! The egress classifier: counts every packet by class, then stamps its
//! earliest departure time, which sch_fq enforces. Two pacers:
//! - the fair pacer (`shaper_common::fair`, the default): a clock per flow in
//!   a set-associative flow table, paced at a shared fair share, with CoDel
//!   on each flow's scheduled delay (CE mark or drop); with DiffServ tins
//!   (`shaper_common::tins`) the packet's DSCP, read ahead of the parse,
//!   picks the tin whose fair state paces it, and `--wash` then clears the
//!   DSCP; one clock for the whole link bounds what all flows and tins
//!   together are given (`shaper_common::link`);
//! - the aggregate pacer (`shaper_common::edt`): one clock for all traffic,
//!   Cilium's design, kept for comparison.
//!
//! `shaper_egress_hosts` is the same classifier with host isolation: the
//! fair pacer over hosts (`shaper_common::hosts`, the hosts' state in
//! `crate::hosts`). A program of its own, so that the verifier walks the
//! host lookups only where they are used; likewise
//! `shaper_egress_hosts_nat`, which finds the LAN host through masquerading
//! (`crate::nat`).
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
    config::{FLAG_DELIVERY_MONO, FLAG_NO_L2, FLAG_TELEMETRY, FLAG_WASH, PacerConfig},
    counters::Counter,
    ecn,
    edt::{EdtDecision, aggregate_edt},
    event::{VERDICT_AQM_DROP, VERDICT_CE, VERDICT_HORIZON_DROP, VERDICT_PACED, VERDICT_PASS},
    fair::{Level, Packet, Verdict},
    hosts::pace_flow_of_host,
    link::on_link,
    shared::{account, pace},
    tins::MAX_TINS,
};

use crate::{
    ce::mark_ce,
    fair_state::{AtomicFair, AtomicLink, AtomicTins, Rolled, roll},
    hook::{Direction, TC_ACT_SHOT, TC_ACT_UNSPEC, count_and_classify, flow_entry, wire_len},
    hosts::flow_hosts,
    maps::{AGGREGATE, CONFIG, count, count_tin},
    parse::{self, Class, Ecn},
    telemetry::{Outcome, report, stash},
    veil::Veil,
};

#[classifier]
pub fn shaper_egress(ctx: TcContext) -> i32 {
    match try_shaper_egress::<false, false>(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

/// The egress classifier with host isolation (`shaper_common::hosts`):
/// the fair pacer over hosts. A program of its own, so that the flow
/// pacer's carries no host lookups for the verifier to walk.
#[classifier]
pub fn shaper_egress_hosts(ctx: TcContext) -> i32 {
    match try_shaper_egress::<true, false>(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

/// The egress classifier with host isolation through masquerading
/// (`--nat`, `crate::nat`): the LAN side's host is the one the LAN
/// classifier recorded. A program of its own, so that the verifier walks
/// the lookup only where it is used.
#[classifier]
pub fn shaper_egress_hosts_nat(ctx: TcContext) -> i32 {
    match try_shaper_egress::<true, true>(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

/// A classifier that only passes packets: the benchmark's baseline.
#[classifier]
pub fn shaper_passthrough(_ctx: TcContext) -> i32 {
    TC_ACT_UNSPEC
}

/// A classifier that reads the clock and passes the packet: the
/// benchmark's measure of the clock read both pacers make once a packet.
#[classifier]
pub fn shaper_clock(_ctx: TcContext) -> i32 {
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now_ns = unsafe { bpf_ktime_get_ns() };
    // A helper's result is opaque to the compiler, so the call stays; the
    // comparison keeps its result live as well.
    if now_ns == 0 {
        TC_ACT_SHOT
    } else {
        TC_ACT_UNSPEC
    }
}

#[inline(always)]
fn try_shaper_egress<const HOSTS: bool, const NAT: bool>(ctx: &TcContext) -> Result<i32, i32> {
    let len = ctx.len();
    count(Counter::Packets, 1);
    count(Counter::Bytes, u64::from(len));

    let Some(config) = CONFIG.get(0) else {
        return Ok(TC_ACT_UNSPEC);
    };
    let veil = Veil::new(config);
    // The tin first, veiled, so that one verifier state walks the roll;
    // without tins the frame is not read for it.
    let dscp = if config.diffserv != 0 {
        parse::dscp(ctx, config.flags & FLAG_NO_L2 == 0)
    } else {
        0
    };
    let tin = (veil.u64(config.tin_of(dscp) as u64) as usize) & (MAX_TINS - 1);
    let tins = if config.fair() {
        AtomicTins::lookup(veil)
    } else {
        None
    };
    let rolled = match tins {
        Some(tins) => {
            let level = if HOSTS { Level::HOSTS } else { Level::FLOWS };
            roll::<_, true>(config, veil, tin, tins, level)
        }
        None => Rolled::NONE,
    };
    let class = count_and_classify(ctx, config);
    if config.flags & FLAG_WASH != 0 {
        wash(ctx, class.ecn);
    }
    if config.flags & FLAG_TELEMETRY != 0 {
        stash(&class);
    }
    let wire_len = wire_len(ctx, config, &class, veil);
    count(Counter::WireBytes, u64::from(wire_len));

    if !config.enabled() {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    }
    let tx_time_ns = config.scaled_rate().tx_time_ns(wire_len);
    let skb_tstamp_ns = departure_asked(ctx, config);
    if config.fair() {
        let priced = Priced {
            wire_len,
            tx_ns: tx_time_ns,
            skb_tstamp_ns,
        };
        return fair::<HOSTS, NAT>(ctx, config, class, &rolled, veil, priced);
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

/// The fair pacer, on the shared state `rolled` to this packet's epoch,
/// over hosts with `HOSTS`, through NAT with `NAT`. A truncated frame (no
/// key) is paced as flow 0.
#[inline(always)]
fn fair<const HOSTS: bool, const NAT: bool>(
    ctx: &TcContext,
    config: &PacerConfig,
    class: Class,
    rolled: &Rolled,
    veil: Veil,
    priced: Priced,
) -> Result<i32, i32> {
    let Priced {
        wire_len,
        tx_ns,
        skb_tstamp_ns,
    } = priced;
    let tin = rolled.tin;
    if rolled.state.is_null() {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    }
    let (now_ns, epoch, mult_q16) = (rolled.now_ns, rolled.epoch, rolled.mult_q16);
    // SAFETY: the pointer is non-null, so it comes from the map lookup of
    // this run and stays valid for it; the fields are only accessed
    // atomically.
    let mut shared = unsafe { AtomicFair::new(rolled.state, veil) };

    // The hosts first, so that their branches end before the flow table's
    // scan ([`host_count`]).
    let by_config = (config, Direction::ByConfig);
    let Some((flow_hash, hosts)) =
        flow_hosts::<HOSTS, NAT, _>(ctx, &class, by_config, tin, veil, &mut shared, epoch)
    else {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    };
    let Some((flow, flow_started)) = flow_entry(config, flow_hash, now_ns) else {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    };
    let ecn = class.ecn;
    let pkt = Packet {
        now_ns,
        skb_tstamp_ns,
        tx_ns,
        ect: ecn.capable(),
        link_ns: 0,
    };
    let params = config.fair_params();
    let Some(mut link) = AtomicLink::lookup() else {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    };
    let verdict = on_link(&mut link, &pkt, &params, |pkt| {
        if let Some((host, peer, n)) = hosts {
            pace_flow_of_host::<_, true>(
                &mut shared,
                flow,
                (host, peer),
                n,
                pkt,
                epoch,
                mult_q16,
                &params,
            )
        } else {
            pace::<_, true>(&mut shared, flow, pkt, epoch, mult_q16, &params)
        }
    });
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
    match code {
        VERDICT_PACED => count_tin(tin, wire_len, false, false, delay_ns),
        VERDICT_CE => count_tin(tin, wire_len, false, true, delay_ns),
        VERDICT_AQM_DROP | VERDICT_HORIZON_DROP => count_tin(tin, wire_len, true, false, 0),
        _ => count_tin(tin, wire_len, false, false, 0),
    }
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

/// A packet's cost and the departure its socket asked for.
#[derive(Clone, Copy)]
struct Priced {
    /// Bytes on the wire, every GSO segment's headers counted.
    wire_len: u32,
    /// Its transmission time at the aggregate rate.
    tx_ns: u64,
    /// `skb->tstamp` as a departure time, or 0 ([`departure_asked`]).
    skb_tstamp_ns: u64,
}

/// The departure time the socket asked for (`skb->tstamp`), or 0. On an
/// IFB fed from ingress the stamp is never a departure time.
#[inline(always)]
fn departure_asked(ctx: &TcContext, config: &PacerConfig) -> u64 {
    if config.flags & FLAG_DELIVERY_MONO != 0 {
        0
    } else {
        // SAFETY: reading a field of the __sk_buff the kernel passed in.
        unsafe { (*ctx.skb.skb).tstamp }
    }
}

/// Clears the packet's DSCP, keeping its ECN bits (`--wash`), once its
/// tin is chosen. A failed load or store leaves the header as it was.
#[inline(always)]
fn wash(ctx: &TcContext, e: Ecn) {
    if !e.present || e.dscp == 0 {
        return;
    }
    let off = e.l3_off as usize;
    if e.ipv4 {
        let Ok(mut h) = ctx.load::<[u8; ecn::IPV4_CE_SPAN]>(off) else {
            return;
        };
        if ecn::ipv4_clear_dscp(&mut h) && ctx.store(off, &h, 0).is_ok() {
            count(Counter::Washed, 1);
        }
    } else {
        let Ok(mut b) = ctx.load::<[u8; 2]>(off) else {
            return;
        };
        if ecn::ipv6_clear_dscp(&mut b) && ctx.store(off, &b, 0).is_ok() {
            count(Counter::Washed, 1);
        }
    }
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
