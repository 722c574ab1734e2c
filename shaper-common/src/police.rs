//! The AQM policer's per-packet rules (`police` mode): the fair pacer's per-flow virtual clocks and CoDel, run at TC
//! ingress where nothing can be queued. Every packet leaves at once; virtual
//! delays only decide whether a flow gets a congestion signal.
//!
//! Two rules, both over [`crate::fair::decide`]:
//! - [`police_link`], **the link's CoDel** (the one to use). A virtual FIFO
//!   of the whole link at the policed rate ([`LinkState`]) tells when the
//!   arrivals exceed the rate; CoDel on its virtual delay says when a signal
//!   is due and spaces them. The due signal goes to the first packet of a
//!   flow sending above `C / n_active` (its eligibility clock is ahead of
//!   now), so signals land on flows in proportion to their packet rate, one
//!   flow at a time, and never on a flow below the least fair share. The
//!   flow's own CoDel is off; the overload rule (a flow more than an
//!   interval behind its CSFQ share) stays for unresponsive senders. A
//!   flow's first signal after it starts sending (the early signal,
//!   [`FLOW_EARLY_DONE`]) comes as soon as it is a target behind its
//!   share, without CoDel's wait of an interval: nothing queues here, so
//!   only a signal ends a slow start, and a late one comes when the sender
//!   runs at several times the rate.
//!   Why: with each flow's own CoDel ([`police`]), equal flows cross
//!   target together and halve together, and the CSFQ multiplier lags (at
//!   m = 1 no flow is above its share), so the upstream FIFO fills and
//!   tail-drops everyone (`docs/ingress.md` has the simulator's figures).
//! - [`police`], **each flow's own CoDel**, the first design, kept as the
//!   simulator's baseline.
//!
//! Common to both:
//! - **At most one signal in four packets of a flow.** A policer's signal
//!   reaches the sender a round trip later, so a burst of drops would halve
//!   the window many times over. A small saturating count of the packets
//!   passed since the flow's last signal lives in [`FlowEntry::flags`]
//!   (bits [`SINCE_SHIFT`]..; the entry stays 64 bytes). A signal asked for
//!   before three packets have passed is withheld, and CoDel's state is left
//!   as it was before the packet, so the signal stays due and the next
//!   allowed packet takes it.
//! - **Bounded virtual clocks.** On egress a dropped packet takes no slot
//!   and sch_fq's queue bounds the clock. Here three packets in four of an
//!   unresponsive flow pass and advance it, so a clock more than the horizon
//!   ahead is pulled back to `now + horizon` ([`Policed::clamped`]) instead
//!   of the egress pacer's horizon drop; the link's clock likewise.
//! - Sparse flows (below their share) pass untouched.
//!
//! Invariants: the caller passes `skb_tstamp_ns = 0` (at ingress
//! `skb->tstamp` is the receive time, CLOCK_REALTIME, not a departure).
//! Under [`police_link`] a flow's `codel` fields are not CoDel state: its
//! `first_above_ns` is the eligibility clock. Units: nanoseconds of
//! CLOCK_MONOTONIC. Non-goals: queueing; shaping unresponsive flows below
//! three quarters of their rate (the cap forbids it); exact link accounting
//! across CPUs (on the BPF side [`LinkState`] is shared and updated without
//! locks, so concurrent packets may lose an advance of the link's clock,
//! which only delays a signal).

use crate::{
    codel::{CodelParams, CodelState, codel_signal},
    fair::{CodelClock, FairParams, Packet, Verdict, decide, fair_tx_ns},
    flow::FlowEntry,
};

/// First bit of the "packets since the last signal" count in
/// [`FlowEntry::flags`].
pub const SINCE_SHIFT: u32 = 8;

/// The count's bits (two: it saturates at [`MIN_PASSED_BETWEEN_SIGNALS`]).
pub const SINCE_MASK: u32 = 0b11 << SINCE_SHIFT;

/// Packets that must pass between two signals of one flow: one in four.
pub const MIN_PASSED_BETWEEN_SIGNALS: u32 = 3;

/// [`FlowEntry::flags`] under [`police_link`]: the flow has had its early
/// signal since it last started sending (see "the early signal" there).
pub const FLOW_EARLY_DONE: u32 = 1 << 1;

/// What the policer does with one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Let it through untouched.
    Pass,
    /// Set CE, then let it through.
    Mark,
    /// Drop it.
    Drop,
}

/// Which rule dropped a packet; each has its own counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// CoDel: the link's under [`police_link`], the flow's own under
    /// [`police`].
    Codel,
    /// The early signal of [`police_link`]: the flow's first since it
    /// started sending.
    Early,
    /// The overload rule: the flow was more than an interval behind its
    /// share.
    Overload,
}

/// One decision, with what the caller counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policed {
    /// The packet's fate.
    pub action: Action,
    /// The rule behind a drop; `None` unless the packet is dropped.
    pub drop_reason: Option<DropReason>,
    /// The flow's virtual delay when the packet arrived (after any clamp).
    pub virtual_delay_ns: u64,
    /// The flow's clock had run past the horizon and was pulled back.
    pub clamped: bool,
    /// CoDel or the overload rule asked for a signal and the one-in-four
    /// cap withheld it.
    pub withheld: bool,
    /// The flow's eligibility clock was ahead of now at all: it sends at
    /// its least share or above, over the gap since its last packet;
    /// always false under [`police`].
    pub ahead: bool,
}

/// Packets passed since `flow`'s last signal, saturated.
#[inline(always)]
pub fn passed_since_signal(flow: &FlowEntry) -> u32 {
    (flow.flags & SINCE_MASK) >> SINCE_SHIFT
}

#[inline(always)]
fn set_passed(flow: &mut FlowEntry, n: u32) {
    flow.flags = (flow.flags & !SINCE_MASK) | (n.min(MIN_PASSED_BETWEEN_SIGNALS) << SINCE_SHIFT);
}

/// Decides one packet of `flow` at ingress; see the module header.
#[inline(always)]
pub fn police(flow: &mut FlowEntry, pkt: &Packet, mult_q16: u64, p: &FairParams) -> Policed {
    let limit = pkt.now_ns.saturating_add(p.horizon_ns);
    let clamped = flow.t_next_ns > limit;
    if clamped {
        flow.t_next_ns = limit;
    }
    let virtual_delay_ns = flow.t_next_ns.saturating_sub(pkt.now_ns);
    let codel_before = flow.codel;
    let passed = passed_since_signal(flow);
    let verdict = decide(flow, pkt, mult_q16, p, CodelClock::Decision);
    let signal = match verdict {
        // decide's mark does not say which rule asked for it.
        Verdict::Mark { .. } => Some((Action::Mark, None)),
        Verdict::CodelDrop => Some((Action::Drop, Some(DropReason::Codel))),
        Verdict::OverloadDrop => Some((Action::Drop, Some(DropReason::Overload))),
        // Not reached after the clamp; were it, the packet still passes.
        Verdict::Pass | Verdict::Pace { .. } | Verdict::HorizonDrop => None,
    };
    let Some((action, drop_reason)) = signal else {
        set_passed(flow, passed + 1);
        return Policed {
            action: Action::Pass,
            drop_reason: None,
            virtual_delay_ns,
            clamped,
            withheld: false,
            ahead: false,
        };
    };
    if passed >= MIN_PASSED_BETWEEN_SIGNALS {
        set_passed(flow, 0);
        return Policed {
            action,
            drop_reason,
            virtual_delay_ns,
            clamped,
            withheld: false,
            ahead: false,
        };
    }
    // Withheld: CoDel as before this packet, which passes and takes its
    // slot on the clock (a drop verdict had left the clock unmoved).
    flow.codel = codel_before;
    if action == Action::Drop {
        flow.t_next_ns = flow
            .t_next_ns
            .saturating_add(fair_tx_ns(pkt.tx_ns, mult_q16));
    }
    set_passed(flow, passed + 1);
    Policed {
        action: Action::Pass,
        drop_reason: None,
        virtual_delay_ns,
        clamped,
        withheld: true,
        ahead: false,
    }
}

/// The policer's state for the whole link: a virtual FIFO at the policed
/// rate (every passed packet takes its transmission time at the aggregate
/// rate) and CoDel on that FIFO's virtual delay. 40 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkState {
    /// When the virtual link would have sent everything passed so far.
    pub t_link_ns: u64,
    /// CoDel on the link's virtual delay.
    pub codel: CodelState,
}

const _: () = assert!(core::mem::size_of::<LinkState>() == 40);

/// Decides one packet at ingress with the link-driven rule; see the module
/// header ("the link's CoDel"). `n_active` is the count of active flows
/// (at least 1). Returns the decision.
///
/// The flow's CoDel state is not used by this rule (the link's CoDel
/// replaces it), so its `first_above_ns` holds the flow's eligibility
/// clock instead: a virtual clock at `C / n_active`, the least share
/// max-min fairness gives any flow. A flow whose eligibility clock is ahead
/// of now sends above that share; only such flows take the link's signals,
/// so a flow below `C / n` (ping, DNS, a game) is never touched.
#[inline(always)]
pub fn police_link(
    flow: &mut FlowEntry,
    link: &mut LinkState,
    pkt: &Packet,
    mult_q16: u64,
    n_active: u64,
    p: &FairParams,
) -> Policed {
    let n = if n_active == 0 { 1 } else { n_active };
    police_link_at(flow, link, pkt, mult_q16, n << 16, 0, p)
}

/// [`police_link`] with the least share given as the rate's divisor
/// `least_q16` (Q16: the eligibility clock runs at `C / least`), and the
/// eligibility clock allowed `slack_ns` ahead beyond one packet before the
/// flow is eligible. [`police_link`] is this with `least` the active flows
/// and no slack; the host level ([`crate::hosts::police_flow_of_host`])
/// gives its own.
#[inline(always)]
pub fn police_link_at(
    flow: &mut FlowEntry,
    link: &mut LinkState,
    pkt: &Packet,
    mult_q16: u64,
    least_q16: u64,
    slack_ns: u64,
    p: &FairParams,
) -> Policed {
    let limit = pkt.now_ns.saturating_add(p.horizon_ns);
    if link.t_link_ns > limit {
        link.t_link_ns = limit;
    }
    let link_delay_ns = link.t_link_ns.saturating_sub(pkt.now_ns);
    let clamped = flow.t_next_ns > limit;
    if clamped {
        flow.t_next_ns = limit;
    }
    let t_next_before = flow.t_next_ns;
    let virtual_delay_ns = flow.t_next_ns.saturating_sub(pkt.now_ns);
    let tx_fair = fair_tx_ns(pkt.tx_ns, mult_q16);
    // The eligibility clock, kept across decide (which resets the unused
    // CoDel fields).
    let tx_elig = fair_tx_ns(pkt.tx_ns, least_q16);
    let t_elig = flow.codel.first_above_ns;
    // Without a branch (the sign of the difference: clocks lie within
    // 2^63 ns of each other), so the verifier walks one state for both.
    let ahead = pkt.now_ns.wrapping_sub(t_elig) >> 63;
    // Both terms are far below 2^63 (a transmission time and a few
    // targets), so the sum cannot overflow.
    let eligible = t_elig > pkt.now_ns.saturating_add(tx_elig + slack_ns);
    // The flow's own CoDel is off (a target it never reaches): responsive
    // flows are signalled by the link's CoDel, one at a time. The overload
    // rule (a flow more than an interval behind its share) stays, for
    // unresponsive senders.
    let flow_params = FairParams {
        codel: CodelParams {
            target_ns: u64::MAX >> 1,
            interval_ns: p.codel.interval_ns,
        },
        ..*p
    };
    let passed = passed_since_signal(flow);
    // A flow that was silent for an interval starts again from a slow
    // start (RFC 5681, 4.1, restarts after an idle retransmission timeout)
    // and is owed a new early signal.
    if pkt.now_ns.saturating_sub(flow.last_seen_ns) > p.codel.interval_ns {
        flow.flags &= !FLOW_EARLY_DONE;
    }
    let verdict = decide(flow, pkt, mult_q16, &flow_params, CodelClock::Decision);
    // The early signal: the first time a flow is a target behind its share,
    // it is signalled at once rather than after CoDel's interval. Nothing
    // queues at the hook, so a sender in slow start never sees its round
    // trip grow and doubles its window every round trip until signalled;
    // one interval later it would run at several times the rate, and the
    // signals that follow collapse its window (docs/ingress.md). One
    // signal while the overshoot is still small ends slow start near the
    // share, as a growing queue ends it behind a real one.
    let early = flow.flags & FLOW_EARLY_DONE == 0
        && eligible
        && virtual_delay_ns >= p.codel.target_ns
        && virtual_delay_ns > 2 * tx_fair;
    let link_codel_before = link.codel;
    let small_backlog = link_delay_ns <= 2 * pkt.tx_ns;
    let link_due = codel_signal(
        &mut link.codel,
        pkt.now_ns,
        link_delay_ns,
        small_backlog,
        &p.codel,
    );
    let flow_due = matches!(verdict, Verdict::Mark { .. }) || verdict.is_aqm_drop();
    let wants = flow_due || early || (link_due && eligible);
    let allowed = passed >= MIN_PASSED_BETWEEN_SIGNALS;
    if link_due && !(eligible && allowed) {
        // Stays due for the next eligible packet.
        link.codel = link_codel_before;
    }
    let action = if wants && allowed {
        if p.ecn && pkt.ect {
            Action::Mark
        } else {
            Action::Drop
        }
    } else {
        Action::Pass
    };
    if action != Action::Pass {
        flow.flags |= FLOW_EARLY_DONE;
    }
    if action == Action::Drop {
        // A dropped packet takes no slot on any clock.
        flow.t_next_ns = t_next_before;
        flow.codel.first_above_ns = t_elig;
        set_passed(flow, 0);
    } else {
        if verdict.is_aqm_drop() {
            // decide dropped it, the cap let it pass: it takes its slot.
            flow.t_next_ns = t_next_before.saturating_add(tx_fair);
        }
        let elig_start = if t_elig > pkt.now_ns {
            t_elig
        } else {
            pkt.now_ns
        };
        let elig_next = elig_start.saturating_add(tx_elig);
        // Bounded like the other clocks, but never below two packets at
        // C / n: with many active flows one packet at C / n can take longer
        // than the horizon, and a clock clamped to the horizon could then
        // never be a packet ahead, so no flow would ever be eligible (seen
        // with 10,000 flows in the benchmark: not one signal).
        let two_ahead = pkt.now_ns.saturating_add(tx_elig.saturating_mul(2));
        let elig_limit = if two_ahead > limit { two_ahead } else { limit };
        flow.codel.first_above_ns = if elig_next > elig_limit {
            elig_limit
        } else {
            elig_next
        };
        let start = if link.t_link_ns > pkt.now_ns {
            link.t_link_ns
        } else {
            pkt.now_ns
        };
        link.t_link_ns = start.saturating_add(pkt.tx_ns);
        set_passed(
            flow,
            if action == Action::Mark {
                0
            } else {
                passed + 1
            },
        );
    }
    let drop_reason = if action != Action::Drop {
        None
    } else if flow_due {
        Some(DropReason::Overload)
    } else if early {
        Some(DropReason::Early)
    } else {
        Some(DropReason::Codel)
    };
    Policed {
        action,
        drop_reason,
        virtual_delay_ns,
        clamped,
        withheld: wants && !allowed,
        ahead: ahead != 0,
    }
}

/// The active flow count [`police_link`] divides the link by: the larger of
/// the last and the current activity window's counts (as
/// [`crate::fair::mult_cap`] takes them), at least 1.
#[inline(always)]
pub fn n_active(active_last: u64, active_now: u64) -> u64 {
    let n = (crate::fair::mult_cap(active_last, active_now) >> 16).saturating_sub(1);
    if n == 0 { 1 } else { n }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::{codel::CodelParams, fair::MULT_ONE, flow::FLOW_ECN};

    const MS: u64 = 1_000_000;

    fn params(ecn: bool) -> FairParams {
        FairParams {
            codel: CodelParams {
                target_ns: 5 * MS,
                interval_ns: 100 * MS,
            },
            horizon_ns: 500 * MS,
            ecn,
        }
    }

    fn pkt(now_ns: u64, tx_ns: u64, ect: bool) -> Packet {
        Packet {
            now_ns,
            skb_tstamp_ns: 0,
            tx_ns,
            ect,
            link_ns: 0,
        }
    }

    /// A sender at `factor` times its share (1 ms of share per packet) for
    /// `secs`; the actions taken.
    fn flood(factor: u64, secs: u64, ect: bool, p: &FairParams) -> (FlowEntry, Vec<Policed>) {
        let mut f = FlowEntry {
            tag: 1,
            ..FlowEntry::default()
        };
        let gap = MS / factor;
        let out = (0..secs * 1000 * factor)
            .map(|i| police(&mut f, &pkt(1_000 * MS + i * gap, MS, ect), MULT_ONE, p))
            .collect();
        (f, out)
    }

    #[test]
    fn a_sparse_flow_is_never_touched() {
        let p = params(false);
        let mut f = FlowEntry::default();
        for i in 0..1000 {
            // One packet every 10 ms, each 1 ms at its share.
            let r = police(
                &mut f,
                &pkt(1_000 * MS + i * 10 * MS, MS, false),
                MULT_ONE,
                &p,
            );
            assert_eq!(r.action, Action::Pass);
            assert_eq!(r.virtual_delay_ns, 0);
            assert!(!r.withheld && !r.clamped);
        }
    }

    #[test]
    fn no_flow_is_hit_more_than_one_packet_in_four() {
        let p = params(false);
        let (_, out) = flood(8, 3, false, &p);
        let drops = out.iter().filter(|r| r.action == Action::Drop).count();
        assert!(drops > 0, "an 8x flood was never signalled");
        // Between two signals at least three packets pass.
        let mut since = u32::MAX;
        for r in &out {
            if r.action == Action::Pass {
                since = since.saturating_add(1);
            } else {
                assert!(since >= MIN_PASSED_BETWEEN_SIGNALS, "signal after {since}");
                since = 0;
            }
        }
        // The overload rule wants every packet; the cap gives one in four.
        let frac = drops as f64 / out.len() as f64;
        assert!((0.2..=0.25).contains(&frac), "{frac}");
        assert!(out.iter().any(|r| r.withheld));
    }

    #[test]
    fn an_unresponsive_flow_clock_is_clamped_at_the_horizon() {
        let p = params(false);
        let (f, out) = flood(4, 2, false, &p);
        assert!(out.iter().any(|r| r.clamped));
        let last_now = 1_000 * MS + (2 * 1000 * 4 - 1) * (MS / 4);
        // Never further ahead than the horizon plus one packet's share.
        assert!(
            f.t_next_ns <= last_now + p.horizon_ns + MS,
            "{}",
            f.t_next_ns
        );
        assert!(out.iter().all(|r| r.virtual_delay_ns <= p.horizon_ns));
    }

    #[test]
    fn ecn_flows_are_marked_not_dropped_and_capped_alike() {
        let p = params(true);
        let (f, out) = flood(8, 2, true, &p);
        assert_ne!(f.flags & FLOW_ECN, 0);
        assert!(out.iter().all(|r| r.action != Action::Drop));
        let marks = out.iter().filter(|r| r.action == Action::Mark).count();
        assert!(marks > 0);
        assert!(marks * 4 <= out.len());
    }

    #[test]
    fn a_flow_just_above_its_share_waits_for_codel() {
        // 10% above its share: the virtual delay grows 0.1 ms per packet,
        // past the 5 ms target after 50 packets; CoDel then needs a whole
        // interval above target before its first signal.
        let p = params(false);
        let mut f = FlowEntry::default();
        let gap = MS * 10 / 11;
        let mut first = None;
        for i in 0..400u64 {
            let r = police(&mut f, &pkt(1_000 * MS + i * gap, MS, false), MULT_ONE, &p);
            if r.action != Action::Pass {
                first = Some((i, r.virtual_delay_ns));
                break;
            }
        }
        let (i, delay) = first.expect("signalled within 400 packets");
        assert!(delay >= p.codel.target_ns, "signalled at {delay} ns");
        // 5 ms above target takes ~55 packets, then 100 ms is ~110 more.
        assert!((150..=200).contains(&i), "first signal at packet {i}");
    }

    /// Flows `rates` (packets per ms of share at `C`, one 1 ms packet
    /// each time) interleaved over `secs` through `police_link`, with
    /// `n_active` = the flow count; the actions per flow.
    fn link_run(periods_us: &[u64], secs: u64, ect: bool) -> Vec<Vec<Policed>> {
        let p = params(ect);
        let mut flows: Vec<FlowEntry> = (0..periods_us.len())
            .map(|i| FlowEntry {
                tag: i as u32 + 1,
                ..FlowEntry::default()
            })
            .collect();
        let mut link = LinkState::default();
        let mut next: Vec<u64> = periods_us.iter().map(|_| 1_000 * MS).collect();
        let mut out: Vec<Vec<Policed>> = periods_us.iter().map(|_| Vec::new()).collect();
        let end = 1_000 * MS + secs * 1000 * MS;
        loop {
            let (i, &t) = next
                .iter()
                .enumerate()
                .min_by_key(|&(_, t)| *t)
                .expect("flows");
            if t >= end {
                break;
            }
            // Every packet is 1 ms at the link's rate C; m = 1.
            let r = police_link(
                &mut flows[i],
                &mut link,
                &pkt(t, MS, ect),
                MULT_ONE,
                periods_us.len() as u64,
                &p,
            );
            out[i].push(r);
            next[i] = t + periods_us[i] * 1_000;
        }
        out
    }

    fn signals(v: &[Policed]) -> usize {
        v.iter().filter(|r| r.action != Action::Pass).count()
    }

    #[test]
    fn link_rule_leaves_a_link_below_its_rate_alone() {
        // Two flows at 0.45 C each: each above... no, below C/2; the link
        // at 0.9 C never builds a virtual queue.
        let out = link_run(&[2_222, 2_222], 3, false);
        assert!(out.iter().all(|v| signals(v) == 0));
    }

    #[test]
    fn link_rule_signals_the_flood_not_the_sparse_flow() {
        // A flood at 2 C beside a flow at 0.1 C (below C/2): the link is
        // over all the time; every signal goes to the flood.
        let out = link_run(&[500, 10_000], 3, false);
        assert_eq!(signals(&out[1]), 0, "the sparse flow was hit");
        assert!(out[1].iter().all(|r| r.action == Action::Pass));
        let s = signals(&out[0]);
        assert!(s > 0, "the flood was never signalled");
        assert!(s * 4 <= out[0].len() + 4, "more than one in four: {s}");
    }

    #[test]
    fn link_rule_hits_one_flow_at_a_time_at_codel_spacing() {
        // Four equal unresponsive flows at 0.275 C each (1.1 C in all):
        // each is above C/4, so each may be hit, but the link's CoDel spaces
        // the signals (the first after ~50 ms to pass target plus one
        // interval, then interval/sqrt(k)): k signals take about
        // 200 sqrt(k) ms, so ~86 in the remaining 1.85 s, where one in four
        // packets would be ~1,800.
        let out = link_run(&[3_636; 4], 2, false);
        let total: usize = out.iter().map(|v| signals(v)).sum();
        assert!(total > 0, "an over-subscribed link was never signalled");
        assert!((60..=120).contains(&total), "{total} signals in 2 s");
        let hit = out.iter().filter(|v| signals(v) > 0).count();
        assert!(hit >= 2, "only {hit} of 4 equal flows was ever signalled");
    }

    /// A lone flow at 1.5 C (a packet of 1 ms at C every 2/3 ms) from
    /// `start_ns` for `n` packets through `police_link`; the send times of
    /// the signalled packets.
    fn ramp(flow: &mut FlowEntry, link: &mut LinkState, start_ns: u64, n: u64) -> Vec<u64> {
        let p = params(false);
        (0..n)
            .map(|i| start_ns + i * MS * 2 / 3)
            .filter(|&t| {
                police_link(flow, link, &pkt(t, MS, false), MULT_ONE, 1, &p).action != Action::Pass
            })
            .collect()
    }

    #[test]
    fn link_rule_signals_a_ramping_flow_once_at_target_then_at_codel_spacing() {
        // Each packet puts the flow 1/3 ms further behind its share: the
        // target (5 ms) after 15 packets, 10 ms. CoDel alone would wait
        // one interval more.
        let (mut f, mut link) = (FlowEntry::default(), LinkState::default());
        let start = 1_000 * MS;
        let hits = ramp(&mut f, &mut link, start, 600);
        let first = hits.first().expect("a flow at 1.5 C was never signalled") - start;
        assert!(
            (9 * MS..=14 * MS).contains(&first),
            "first signal after {first} ns"
        );
        assert_ne!(f.flags & FLOW_EARLY_DONE, 0);
        // The next comes from the link's CoDel, an interval after the
        // link's delay passed target, not from a second early signal.
        let second = hits.get(1).expect("signalled only once in 400 ms") - start;
        assert!(second >= 100 * MS, "second signal after {second} ns");
    }

    #[test]
    fn link_rule_owes_a_flow_a_new_early_signal_after_a_silence() {
        let (mut f, mut link) = (FlowEntry::default(), LinkState::default());
        let start = 1_000 * MS;
        // 40 ms of ramp: the early signal, then the clocks 5 ms ahead.
        assert_eq!(ramp(&mut f, &mut link, start, 60).len(), 1);
        // Silent for two intervals: the clocks drain, the flow starts
        // again from a slow start.
        let again = start + 240 * MS;
        let hits = ramp(&mut f, &mut link, again, 60);
        assert_eq!(hits.len(), 1, "{hits:?}");
        assert!(hits[0] - again <= 14 * MS, "{} ns", hits[0] - again);
    }

    #[test]
    fn every_drop_names_its_rule_and_nothing_else_names_one() {
        // A lone flow at 1.5 C: the early signal at target, the link's
        // CoDel after an interval, and once the flow is an interval behind
        // its share (300 packets in) the overload rule.
        let p = params(false);
        let (mut f, mut link) = (FlowEntry::default(), LinkState::default());
        let reasons: Vec<Option<DropReason>> = (0..900u64)
            .map(|i| {
                police_link(
                    &mut f,
                    &mut link,
                    &pkt(1_000 * MS + i * MS * 2 / 3, MS, false),
                    MULT_ONE,
                    1,
                    &p,
                )
            })
            .inspect(|r| assert_eq!(r.drop_reason.is_some(), r.action == Action::Drop, "{r:?}"))
            .map(|r| r.drop_reason)
            .filter(Option::is_some)
            .collect();
        assert_eq!(
            reasons.first(),
            Some(&Some(DropReason::Early)),
            "{reasons:?}"
        );
        let count = |want| reasons.iter().filter(|&&r| r == Some(want)).count();
        assert_eq!(count(DropReason::Early), 1, "{reasons:?}");
        assert!(count(DropReason::Codel) > 0, "{reasons:?}");
        assert!(count(DropReason::Overload) > 0, "{reasons:?}");
        // Marks name no drop rule.
        let out = link_run(&[500, 10_000], 2, true);
        assert!(out.iter().flatten().all(|r| r.drop_reason.is_none()));
    }

    #[test]
    fn link_rule_marks_ect_packets() {
        let out = link_run(&[500, 10_000], 2, true);
        assert!(out[0].iter().any(|r| r.action == Action::Mark));
        assert!(out.iter().flatten().all(|r| r.action != Action::Drop));
    }

    #[test]
    fn the_count_lives_in_free_flag_bits() {
        assert_eq!(SINCE_MASK & FLOW_ECN, 0);
        assert_eq!(SINCE_MASK & FLOW_EARLY_DONE, 0);
        assert_eq!(FLOW_EARLY_DONE & FLOW_ECN, 0);
        let mut f = FlowEntry {
            flags: FLOW_ECN,
            ..FlowEntry::default()
        };
        set_passed(&mut f, 7);
        assert_eq!(passed_since_signal(&f), MIN_PASSED_BETWEEN_SIGNALS);
        assert_eq!(f.flags & FLOW_ECN, FLOW_ECN);
        set_passed(&mut f, 0);
        assert_eq!(f.flags, FLOW_ECN);
    }

    #[test]
    fn with_many_flows_a_flow_above_its_share_is_still_signalled() {
        // 10,000 active flows: one packet at C / n takes 10 s, far beyond
        // the 500 ms horizon. Two flows each at 0.6 of the link (never
        // behind their own clocks at m = 1, so only the link's CoDel can
        // signal them) overload it together, and must take its signals.
        let p = params(false);
        let mut flows = [1u32, 2].map(|tag| FlowEntry {
            tag,
            ..FlowEntry::default()
        });
        let mut link = LinkState::default();
        let mut drops = [0u32; 2];
        let gap = MS * 5 / 6; // each flow every 5/3 ms: 0.6 of the link
        for i in 0..6_000u64 {
            let k = (i % 2) as usize;
            let r = police_link(
                &mut flows[k],
                &mut link,
                &pkt(1_000 * MS + i * gap, MS, false),
                MULT_ONE,
                10_000,
                &p,
            );
            if r.action == Action::Drop {
                drops[k] += 1;
            }
        }
        assert!(
            drops[0] > 0 && drops[1] > 0,
            "the overloaded link never signalled a flow: {drops:?}"
        );
    }
}
