//! Aggregate earliest-departure-time (EDT) pacing: one virtual clock for all
//! traffic through the hook.
//!
//! Method (VirtualClock, L. Zhang, SIGCOMM 1990; EDT as in Carousel, Saeed et
//! al., SIGCOMM 2017): the state `t_next_free_ns` is the earliest time the next
//! packet may leave. A packet arriving at `t = max(now, its own tstamp)`:
//! - leaves at `t` unstamped when the clock is idle (`t_next_free_ns <= t`),
//!   and the clock restarts at `t + tx_time`: idle time earns no burst credit;
//! - otherwise leaves at `t_next_free_ns` (written to `skb->tstamp`, enforced by
//!   sch_fq), and the clock advances by its transmission time;
//! - is dropped when that departure lies more than `horizon_ns` ahead, so
//!   sch_fq never holds more than a horizon's worth of data.
//!
//! Invariant: in any window the departures total at most
//! `rate * window + one packet`.
//!
//! Non-goals: fairness. This is one virtual FIFO, as Cilium's Bandwidth
//! Manager is (cilium bpf/lib/edt.h); the fair, per-flow pacer replaces it.
//! Units: nanoseconds of CLOCK_MONOTONIC.

/// What the classifier does with one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EdtDecision {
    /// Send now, without a departure time.
    Pass,
    /// Send no earlier than `tstamp_ns`.
    Pace {
        /// The departure time to write into `skb->tstamp`.
        tstamp_ns: u64,
    },
    /// Drop: the departure time would be beyond the horizon.
    HorizonDrop,
}

/// Decides one packet. Returns the decision and the new value of the clock
/// (unchanged on a drop). Pure: the caller loads and stores the clock.
#[inline(always)]
pub fn aggregate_edt(
    now_ns: u64,
    skb_tstamp_ns: u64,
    t_next_free_ns: u64,
    tx_time_ns: u64,
    horizon_ns: u64,
) -> (EdtDecision, u64) {
    let t = if skb_tstamp_ns > now_ns {
        skb_tstamp_ns
    } else {
        now_ns
    };
    if t_next_free_ns <= t {
        return (EdtDecision::Pass, t + tx_time_ns);
    }
    if t_next_free_ns - now_ns > horizon_ns {
        return (EdtDecision::HorizonDrop, t_next_free_ns);
    }
    (
        EdtDecision::Pace {
            tstamp_ns: t_next_free_ns,
        },
        t_next_free_ns + tx_time_ns,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const HORIZON: u64 = 2_000_000_000;

    #[test]
    fn idle_clock_passes_and_restarts_at_now() {
        let (d, clock) = aggregate_edt(1_000, 0, 500, 100, HORIZON);
        assert_eq!(d, EdtDecision::Pass);
        assert_eq!(clock, 1_100);
    }

    #[test]
    fn busy_clock_paces_back_to_back() {
        let (d, clock) = aggregate_edt(1_000, 0, 1_100, 100, HORIZON);
        assert_eq!(d, EdtDecision::Pace { tstamp_ns: 1_100 });
        assert_eq!(clock, 1_200);
    }

    #[test]
    fn socket_tstamp_later_than_clock_is_kept() {
        // A socket that paces itself (TCP EDT) asks for 5_000: we do not pull it earlier.
        let (d, clock) = aggregate_edt(1_000, 5_000, 1_100, 100, HORIZON);
        assert_eq!(d, EdtDecision::Pass);
        assert_eq!(clock, 5_100);
    }

    #[test]
    fn beyond_horizon_drops_without_advancing() {
        let (d, clock) = aggregate_edt(0, 0, HORIZON + 1, 100, HORIZON);
        assert_eq!(d, EdtDecision::HorizonDrop);
        assert_eq!(clock, HORIZON + 1);
        let (d, _) = aggregate_edt(0, 0, HORIZON, 100, HORIZON);
        assert_eq!(d, EdtDecision::Pace { tstamp_ns: HORIZON });
    }

    /// A tiny deterministic generator, so the test needs no dependencies.
    fn lcg(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        *state >> 33
    }

    #[test]
    fn departures_conform_to_rate_in_every_window() {
        // 10 Mbit/s = 800 ns per byte; random bursts of random sizes.
        let ns_per_byte = 800u64;
        let mut seed = 7u64;
        let mut now = 0u64;
        let mut clock = 0u64;
        let mut departures: [(u64, u64); 4096] = [(0, 0); 4096];
        for slot in departures.iter_mut() {
            now += lcg(&mut seed) % 1_500_000;
            let len = 64 + lcg(&mut seed) % 1_450;
            let (d, c) = aggregate_edt(now, 0, clock, len * ns_per_byte, HORIZON);
            clock = c;
            let at = match d {
                EdtDecision::Pass => now,
                EdtDecision::Pace { tstamp_ns } => tstamp_ns,
                EdtDecision::HorizonDrop => panic!("horizon never reached here"),
            };
            *slot = (at, len);
        }
        // Departures are in order, and any window [a, b] holds at most
        // rate * (b - a) plus one packet.
        for i in 0..departures.len() {
            let mut bytes = 0u64;
            for j in i..departures.len() {
                let (start, _) = departures[i];
                let (at, len) = departures[j];
                assert!(at >= start);
                bytes += len;
                let allowed = (at - start) / ns_per_byte + len;
                assert!(bytes <= allowed, "window {i}..={j}: {bytes} > {allowed}");
                if at - start > 50_000_000 {
                    break;
                }
            }
        }
    }
}
