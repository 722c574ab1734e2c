//! The AQM policer's per-packet rule (issue 6's `police` mode, seed 003's
//! "bobbie"): the fair pacer's per-flow virtual clocks and CoDel, run at TC
//! ingress where nothing can be queued. Every packet leaves at once; the
//! virtual delay (the flow's clock minus now) only decides whether the flow
//! gets a congestion signal.
//!
//! On top of [`crate::fair::decide`]:
//! - **At most one signal in four packets of a flow.** A policer's signal
//!   reaches the sender a round trip later, so a burst of drops would halve
//!   the window many times over. A small saturating count of the packets
//!   passed since the flow's last signal lives in [`FlowEntry::flags`]
//!   (bits [`SINCE_SHIFT`]..; the entry stays 64 bytes). A signal asked for
//!   before three packets have passed is withheld, and CoDel's state is left
//!   as it was before the packet, so the signal stays due and the next
//!   allowed packet takes it.
//! - **A bounded virtual clock.** On egress a dropped packet takes no slot
//!   and sch_fq's queue bounds the clock. Here three packets in four of an
//!   unresponsive flow pass and advance it, so a clock more than the horizon
//!   ahead is pulled back to `now + horizon` ([`Policed::clamped`]) instead
//!   of the egress pacer's horizon drop.
//! - Sparse flows (clock behind now) pass untouched, as on egress.
//!
//! Invariants: the caller passes `skb_tstamp_ns = 0` (at ingress
//! `skb->tstamp` is the receive time, CLOCK_REALTIME, not a departure).
//! Units: nanoseconds of CLOCK_MONOTONIC. Non-goals: queueing, shaping
//! unresponsive flows below three quarters of their rate (the cap forbids
//! it; the fair share is enforced on responsive senders only).

use crate::{
    fair::{FairParams, Packet, Verdict, decide, fair_tx_ns},
    flow::FlowEntry,
};

/// First bit of the "packets since the last signal" count in
/// [`FlowEntry::flags`].
pub const SINCE_SHIFT: u32 = 8;

/// The count's bits (two: it saturates at [`MIN_PASSED_BETWEEN_SIGNALS`]).
pub const SINCE_MASK: u32 = 0b11 << SINCE_SHIFT;

/// Packets that must pass between two signals of one flow: one in four.
pub const MIN_PASSED_BETWEEN_SIGNALS: u32 = 3;

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

/// One decision, with what the caller counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policed {
    /// The packet's fate.
    pub action: Action,
    /// The flow's virtual delay when the packet arrived (after any clamp).
    pub virtual_delay_ns: u64,
    /// The flow's clock had run past the horizon and was pulled back.
    pub clamped: bool,
    /// CoDel or the overload rule asked for a signal and the one-in-four
    /// cap withheld it.
    pub withheld: bool,
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
    let verdict = decide(flow, pkt, mult_q16, p);
    let signal = match verdict {
        Verdict::Mark { .. } => Some(Action::Mark),
        Verdict::AqmDrop => Some(Action::Drop),
        // Not reached after the clamp; were it, the packet still passes.
        Verdict::Pass | Verdict::Pace { .. } | Verdict::HorizonDrop => None,
    };
    let Some(action) = signal else {
        set_passed(flow, passed + 1);
        return Policed {
            action: Action::Pass,
            virtual_delay_ns,
            clamped,
            withheld: false,
        };
    };
    if passed >= MIN_PASSED_BETWEEN_SIGNALS {
        set_passed(flow, 0);
        return Policed {
            action,
            virtual_delay_ns,
            clamped,
            withheld: false,
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
        virtual_delay_ns,
        clamped,
        withheld: true,
    }
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

    #[test]
    fn the_count_lives_in_free_flag_bits() {
        assert_eq!(SINCE_MASK & FLOW_ECN, 0);
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
}
