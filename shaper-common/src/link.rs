//! The link's clock: a bound on what all flows together are given, whatever
//! the fair share's estimate.
//!
//! The fair pacer ([`crate::fair`]) divides the rate by a multiplier that a
//! feedback loop, a cap and a floor keep near the water level. The estimate
//! can run low: when hundreds of flows back off together their clocks run
//! out, the feedback lowers the multiplier for the traffic it no longer
//! sees, and when they return each flow's clock drains at the raised share
//! until the next epoch's floor. Their clocks then commit the link beyond
//! its rate, and the queue moves into the modem (the simulator carried 1.17
//! of the rate with 256 flows and 1.4 with 384 on some seeds, the 6.12
//! guest up to 1.07 with 256; `docs/pacer.md`, "Many flows").
//!
//! Method: one VirtualClock (L. Zhang, SIGCOMM 1990) for the whole link, as
//! the aggregate pacer keeps ([`crate::edt`]), but as a bound, not a
//! schedule. Each packet is charged its transmission time at the aggregate
//! rate ([`charge_ns`]); the clock, restarted at now when it has fallen
//! behind, then leads now by the work the link has been given and not yet
//! done. A packet's earliest departure is the clock before its charge less
//! a lead the link may carry ([`on_link`]: the front's lead over now, or
//! CoDel's interval if longer; the front is the latest departure a flow's
//! own clock has given, not one this clock set); the fair step
//! lifts its flow's clock to that time ([`crate::fair::decide`]), so CoDel
//! sees the wait, the committed count sees the commitment, and the flow's
//! next packets follow from there. A packet the step drops is refunded
//! ([`on_link`]).
//!
//! Why a lead. The flows' queues in sch_fq are work already charged, so
//! the clock leads now by their sum even when the shares are right. A
//! floor at the clock itself puts every flow with less than the average
//! backlog behind all the others, a FIFO: four simulated AIMD flows lost
//! 7% of the link to it. While the shares sum to the rate, the work queued
//! is at most the largest flow's scheduled delay, which CoDel holds below
//! an interval (the overload rule signals beyond one), so a lead of an
//! interval binds only where the shares together exceed the rate.
//!
//! The charge is the transmission time less 1/64 of it
//! ([`LINK_MARGIN_SHIFT`]). Charged in full, the clock's lead is a random
//! walk while the feedback holds the accepted traffic at the rate on
//! average, and reaches the lead in time whatever the shares; with the
//! margin it drifts back towards now unless the flows together exceed the
//! rate by more than 1/64.
//!
//! Invariants: over any span, the packets kept total at most
//! `rate × span × 64/63` plus the lead at the rate plus one packet, the
//! lead at most the horizon (no flow's own departure lies beyond it); a
//! flow's packets keep their order (the floor only grows). Units:
//! nanoseconds of CLOCK_MONOTONIC, transmission times at the aggregate rate.
//!
//! Concurrency: one word that every CPU and every tin shares, only
//! fetch-added and compared-and-swapped. A restart that loses its
//! compare-and-swap to another CPU's charge leaves the clock behind, and
//! the next packet restarts it; a refund racing a restart gives back a
//! charge the restart already forgave: a packet of lead. The front is
//! loaded and stored: of two CPUs' departures the earlier may be stored
//! last, which shortens the lead until a later one comes.
//!
//! Non-goals: fairness and the order among flows (the share's); the
//! policer, which queues nothing and bounds its link itself
//! ([`crate::police`]).

use crate::fair::{FairParams, Packet, Verdict};

/// The charge is the transmission time less its `2^-LINK_MARGIN_SHIFT`:
/// the clock leads only while the flows exceed the rate by more than that.
pub const LINK_MARGIN_SHIFT: u32 = 6;

/// The link's clock and front, as the classifier (atomics over the map
/// value) and the simulator ([`LinkState`]) hold them.
pub trait LinkWords {
    /// Adds `v` to the clock, wrapping, and returns what it held before.
    fn fetch_add(&mut self, v: u64) -> u64;
    /// Sets the clock to `new` if it still holds `old`; true if it did.
    fn compare_exchange(&mut self, old: u64, new: u64) -> bool;
    /// The front: the latest departure the fair step has given.
    fn front(&self) -> u64;
    /// Sets the front.
    fn set_front(&mut self, v: u64);
}

/// The link's state on a private copy (one thread): the simulator's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkState {
    /// The clock, ns.
    pub clock_ns: u64,
    /// The front, ns.
    pub front_ns: u64,
}

impl LinkWords for LinkState {
    #[inline(always)]
    fn fetch_add(&mut self, v: u64) -> u64 {
        let before = self.clock_ns;
        self.clock_ns = before.wrapping_add(v);
        before
    }
    #[inline(always)]
    fn compare_exchange(&mut self, old: u64, new: u64) -> bool {
        if self.clock_ns == old {
            self.clock_ns = new;
            true
        } else {
            false
        }
    }
    #[inline(always)]
    fn front(&self) -> u64 {
        self.front_ns
    }
    #[inline(always)]
    fn set_front(&mut self, v: u64) {
        self.front_ns = v;
    }
}

/// What a packet of transmission time `tx_ns` advances the clock by.
#[inline(always)]
pub fn charge_ns(tx_ns: u64) -> u64 {
    tx_ns - (tx_ns >> LINK_MARGIN_SHIFT)
}

/// Charges a packet of transmission time `tx_ns` decided at `now_ns`, and
/// returns its earliest departure: the clock before the charge less
/// `lead_ns`. A clock behind now restarts at now.
#[inline(always)]
pub fn link_start<L: LinkWords>(clock: &mut L, now_ns: u64, tx_ns: u64, lead_ns: u64) -> u64 {
    let charge = charge_ns(tx_ns);
    let before = clock.fetch_add(charge);
    if before >= now_ns {
        return before.saturating_sub(lead_ns);
    }
    // Lost to another CPU's charge: the clock stays behind until the next
    // packet restarts it.
    clock.compare_exchange(before.wrapping_add(charge), now_ns + charge);
    now_ns.saturating_sub(lead_ns)
}

/// The fair step `step` for `pkt` under the link's clock: charges the
/// packet ([`link_start`]) with a lead of the front's lead over now or
/// CoDel's interval in `p`, whichever is longer, hands the step its
/// earliest departure in `Packet::link_ns`, refunds the charge when the
/// step drops the packet, and moves the front to a later departure that
/// the flow's own clock set.
#[inline(always)]
pub fn on_link<L: LinkWords>(
    link: &mut L,
    pkt: &Packet,
    p: &FairParams,
    step: impl FnOnce(&Packet) -> Verdict,
) -> Verdict {
    let front_lead = link.front().saturating_sub(pkt.now_ns);
    let lead = if front_lead > p.codel.interval_ns {
        front_lead
    } else {
        p.codel.interval_ns
    };
    let start = link_start(link, pkt.now_ns, pkt.tx_ns, lead);
    let verdict = step(&Packet {
        link_ns: start,
        ..*pkt
    });
    match verdict.departure_ns(pkt.now_ns) {
        None => {
            link.fetch_add(charge_ns(pkt.tx_ns).wrapping_neg());
        }
        // A departure the clock set is no flow's own: were it the front,
        // the lead would grow with every packet held, and the hold let
        // most of the excess through (each held 1 ms packet 0.17 ms after
        // the one before instead of a charge).
        Some(depart) if depart > start && depart > link.front() => link.set_front(depart),
        Some(_) => {}
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const LEAD: u64 = 100 * MS;

    fn pkt(now_ns: u64, tx_ns: u64) -> Packet {
        Packet {
            now_ns,
            skb_tstamp_ns: 0,
            tx_ns,
            ect: false,
            link_ns: 0,
        }
    }

    fn params() -> FairParams {
        FairParams {
            codel: crate::codel::CodelParams {
                target_ns: 5 * MS,
                interval_ns: LEAD,
            },
            horizon_ns: 500 * MS,
            ecn: true,
        }
    }

    #[test]
    fn an_idle_clock_restarts_at_now_and_then_advances_by_the_charge() {
        let mut clock = LinkState::default();
        let now = 1_000 * MS;
        assert_eq!(link_start(&mut clock, now, 64 * MS, LEAD), now - LEAD);
        assert_eq!(clock.clock_ns, now + 63 * MS);
        assert_eq!(
            link_start(&mut clock, now, 64 * MS, LEAD),
            now + 63 * MS - LEAD
        );
        assert_eq!(clock.clock_ns, now + 126 * MS);
    }

    #[test]
    fn packets_at_one_instant_are_held_to_the_rate_beyond_the_lead() {
        // 1 ms packets all decided at once: those within the lead pass,
        // then each starts a charge after the last.
        let mut clock = LinkState::default();
        let now = 1_000 * MS;
        let starts: [u64; 200] = core::array::from_fn(|_| link_start(&mut clock, now, MS, LEAD));
        let held = starts.iter().filter(|&&s| s > now).count();
        let within = (LEAD / charge_ns(MS)) as usize;
        assert_eq!(held, 200 - within - 1, "{starts:?}");
        for w in starts.windows(2) {
            assert_eq!(w[1] - w[0], charge_ns(MS));
        }
    }

    #[test]
    fn a_dropped_packet_is_refunded_and_a_kept_one_is_not() {
        let mut clock = LinkState::default();
        let now = 1_000 * MS;
        let p = pkt(now, 2 * MS);
        let mut seen = 0;
        on_link(&mut clock, &p, &params(), |q| {
            seen = q.link_ns;
            Verdict::CodelDrop
        });
        assert_eq!((seen, clock.clock_ns), (now - LEAD, now));
        on_link(&mut clock, &p, &params(), |_| Verdict::Pass);
        assert_eq!(clock.clock_ns, now + charge_ns(2 * MS));
        assert_eq!(clock.front_ns, now);
    }

    #[test]
    fn the_lead_is_the_fronts_where_that_is_longer_than_the_interval() {
        let now = 1_000 * MS;
        let pace = |link: &mut LinkState| {
            let mut seen = 0;
            on_link(link, &pkt(now, MS), &params(), |q| {
                seen = q.link_ns;
                Verdict::Pace {
                    tstamp_ns: now + MS,
                }
            });
            seen
        };
        // A flow 300 ms ahead: work queued up to that is no excess.
        let mut link = LinkState {
            clock_ns: now + 250 * MS,
            front_ns: now + 300 * MS,
        };
        assert!(pace(&mut link) < now);
        // Beyond it the packet waits for the excess.
        link.clock_ns = now + 350 * MS;
        assert_eq!(pace(&mut link), now + 50 * MS);
        // With the front near now, the interval is the lead.
        let mut link = LinkState {
            clock_ns: now + 150 * MS,
            front_ns: now + 10 * MS,
        };
        assert_eq!(pace(&mut link), now + 50 * MS);
        assert_eq!(link.front_ns, now + 10 * MS);
    }

    #[test]
    fn new_flows_beyond_the_lead_are_held_to_the_rate_by_the_fair_step() {
        // 300 flows' first 1 ms packets at one instant, every share at the
        // whole rate: each would pass at once. The link gives the first
        // an interval's worth; every later one departs a charge after the
        // one before, the held departures moving the lead no further (ECT,
        // so that those held beyond an interval are marked, not dropped).
        let now = 1_000 * MS;
        let mut link = LinkState::default();
        let p = params();
        let mut departs = [0u64; 300];
        for (i, d) in departs.iter_mut().enumerate() {
            let mut flow = crate::flow::FlowEntry::fresh(i as u32 + 1, now);
            let ect = Packet {
                ect: true,
                ..pkt(now, MS)
            };
            let v = on_link(&mut link, &ect, &p, |q| {
                crate::fair::decide(
                    &mut flow,
                    q,
                    crate::fair::MULT_ONE,
                    &p,
                    crate::fair::CodelClock::Departure,
                )
            });
            *d = v.departure_ns(now).unwrap_or(0);
        }
        let within = (LEAD / charge_ns(MS)) as usize + 1;
        assert!(departs[..within].iter().all(|&d| d == now), "{departs:?}");
        for w in departs[within..].windows(2) {
            assert_eq!(w[1] - w[0], charge_ns(MS), "{departs:?}");
        }
        assert_eq!(
            departs[299],
            now + 300 * charge_ns(MS) - LEAD - charge_ns(MS)
        );
    }

    #[test]
    fn a_lost_restart_leaves_the_clock_to_the_other_cpu() {
        // Another CPU charged between the fetch-add and the restart.
        struct Racy(LinkState);
        impl LinkWords for Racy {
            fn fetch_add(&mut self, v: u64) -> u64 {
                let b = self.0.fetch_add(v);
                self.0.clock_ns += 5;
                b
            }
            fn compare_exchange(&mut self, old: u64, new: u64) -> bool {
                self.0.compare_exchange(old, new)
            }
            fn front(&self) -> u64 {
                self.0.front_ns
            }
            fn set_front(&mut self, v: u64) {
                self.0.front_ns = v;
            }
        }
        let mut clock = Racy(LinkState::default());
        let now = 1_000 * MS;
        assert_eq!(link_start(&mut clock, now, MS, LEAD), now - LEAD);
        assert_eq!(clock.0.clock_ns, charge_ns(MS) + 5);
    }
}
