//! The ingress policer (`police` mode): at TC ingress, where
//! nothing can be queued, every packet passes at once, and the fair pacer's
//! virtual clocks only decide which flow gets a congestion signal (CE for
//! ECN-capable packets, else a drop). The rule is
//! `shaper_common::police::police_link`: CoDel on a virtual FIFO of the
//! whole link at the policed rate says when a signal is due, and it goes to
//! the next packet of a flow above `C / n_active`, at most one packet in four
//! of any flow. Sparse flows are never touched. Under host isolation
//! (`shaper_police_hosts`, `shaper_police_hosts_nat`) the download's hosts
//! share first (`shaper_common::hosts::police_flow_of_host`), each host's
//! state in `crate::hosts`.
//!
//! Units: nanoseconds of CLOCK_MONOTONIC (`bpf_ktime_get_ns`), bytes on the
//! wire. Invariants: `skb->tstamp` is never read or written (at ingress it
//! is the receive time, CLOCK_REALTIME). Concurrency: as the egress pacer
//! (flow entries without locks, shared state with atomics); the virtual
//! link's clock is read and written without a lock, so two CPUs may lose
//! one advance of it, which only delays a signal.
//! Non-goals: telemetry records (counters only, for now); queueing.

use aya_ebpf::{macros::classifier, programs::TcContext};
use shaper_common::{
    counters::Counter,
    fair::{Level, Packet},
    hosts::police_flow_of_host,
    police::{Action, DropReason},
    shared::{account, police_step},
    tins::SoleTin,
};

use crate::{
    ce::mark_ce,
    fair_state::{AtomicFair, roll},
    hook::{Direction, TC_ACT_SHOT, TC_ACT_UNSPEC, count_and_classify, flow_entry, wire_len},
    hosts::flow_hosts,
    maps::{CONFIG, POLICE_LINK, count},
    veil::Veil,
};

#[classifier]
pub fn shaper_police(ctx: TcContext) -> i32 {
    match try_shaper_police::<false, false>(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

/// The policer over hosts (`shaper_common::hosts::police_flow_of_host`),
/// the download's hosts the unit. A program of its own, as on egress, so
/// that the policer's carries no host lookups.
#[classifier]
pub fn shaper_police_hosts(ctx: TcContext) -> i32 {
    match try_shaper_police::<true, false>(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

/// The policer over hosts through masquerading (`--nat`, `crate::nat`):
/// a download's host is the LAN host the LAN classifier recorded.
#[classifier]
pub fn shaper_police_hosts_nat(ctx: TcContext) -> i32 {
    match try_shaper_police::<true, true>(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

#[inline(always)]
fn try_shaper_police<const HOSTS: bool, const NAT: bool>(ctx: &TcContext) -> Result<i32, i32> {
    let len = ctx.len();
    count(Counter::Packets, 1);
    count(Counter::Bytes, u64::from(len));
    let Some(config) = CONFIG.get(0) else {
        return Ok(TC_ACT_UNSPEC);
    };
    let veil = Veil::new(config);
    // The policer has one tin.
    let rolled = roll::<_, false>(config, veil, 0, SoleTin, Level::FLOWS);
    let class = count_and_classify(ctx, config);
    let wire_len = wire_len(ctx, config, &class, veil);
    count(Counter::WireBytes, u64::from(wire_len));
    if !config.enabled() {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    }
    let tx_ns = config.scaled_rate().tx_time_ns(wire_len);
    if rolled.state.is_null() {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    }
    let (now_ns, epoch, mult_q16) = (rolled.now_ns, rolled.epoch, rolled.mult_q16);
    // SAFETY: the pointer is non-null, so it comes from the map lookup of
    // this run.
    let mut shared = unsafe { AtomicFair::new(rolled.state, veil) };
    // The hosts first, before the flow table's scan, as on egress.
    let download = (config, Direction::Download);
    let Some((flow_hash, hosts)) =
        flow_hosts::<HOSTS, NAT, _>(ctx, &class, download, 0, veil, &mut shared, epoch)
    else {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    };
    let Some((flow, _started)) = flow_entry(config, flow_hash, now_ns) else {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    };
    let Some(link) = POLICE_LINK.get_ptr_mut(0) else {
        count(Counter::PassedUnpaced, 1);
        return Ok(TC_ACT_UNSPEC);
    };
    let pkt = Packet {
        now_ns,
        skb_tstamp_ns: 0,
        tx_ns,
        ect: class.ecn.capable(),
        link_ns: 0,
    };
    // SAFETY: the pointer comes from the map lookup of this run; a race with
    // another CPU costs one advance of the virtual link (module header).
    let link = unsafe { &mut *link };
    let params = config.fair_params();
    let r = if let Some((host, peer, n)) = hosts {
        police_flow_of_host(
            &mut shared,
            flow,
            (host, peer),
            n,
            link,
            &pkt,
            epoch,
            mult_q16,
            &params,
        )
    } else {
        police_step(&mut shared, flow, link, &pkt, epoch, mult_q16, &params)
    };
    if r.clamped {
        count(Counter::PoliceClamped, 1);
    }
    if r.withheld {
        count(Counter::PoliceWithheld, 1);
    }
    if r.action == Action::Drop {
        count(Counter::PoliceDrop, 1);
        count(
            match r.drop_reason {
                Some(DropReason::Early) => Counter::PoliceEarlyDrop,
                Some(DropReason::Overload) => Counter::PoliceOverloadDrop,
                Some(DropReason::Codel) | None => Counter::PoliceCodelDrop,
            },
            1,
        );
        return Ok(TC_ACT_SHOT);
    }
    // The accepted traffic of this epoch, as on egress.
    account(&mut shared, epoch, tx_ns);
    match r.action {
        Action::Mark => {
            if !mark_ce(ctx, class.ecn) {
                count(Counter::CeMarkFailed, 1);
                return Ok(TC_ACT_SHOT);
            }
            count(Counter::CeMarked, 1);
        }
        Action::Pass if r.virtual_delay_ns > 0 => count(Counter::Paced, 1),
        _ => count(Counter::PassedUnpaced, 1),
    }
    Ok(TC_ACT_UNSPEC)
}
