//! The fair pacer's unit tests: each step alone, and the epoch roll over
//! the steps together.

use super::*;
use crate::committed::WEIGHT_ONE;

/// The epoch roll on a private copy, the pacer's (committed count kept).
fn roll_epoch(s: &mut FairState, epoch: u64) {
    crate::shared::roll_epoch::<_, _, true>(
        s,
        &mut crate::tins::TinState::default(),
        0,
        epoch,
        Level::FLOWS,
    );
}

const P: FairParams = FairParams {
    codel: CodelParams {
        target_ns: 5_000_000,
        interval_ns: 100_000_000,
    },
    horizon_ns: 500_000_000,
    ecn: true,
};

fn pkt(now_ns: u64, tx_ns: u64) -> Packet {
    Packet {
        now_ns,
        skb_tstamp_ns: 0,
        tx_ns,
        ect: false,
        link_ns: 0,
    }
}

/// [`decide`] as the pacer calls it: CoDel on the departure clock.
fn paced(f: &mut FlowEntry, p: &Packet, mult_q16: u64) -> Verdict {
    decide(f, p, mult_q16, &P, CodelClock::Departure)
}

#[test]
fn idle_flow_passes_and_its_clock_runs_at_the_fair_share() {
    let mut f = FlowEntry::fresh(1, 0);
    // m = 4: a 1000 ns packet occupies the flow for 4000 ns.
    let v = paced(&mut f, &pkt(10_000, 1_000), 4 * MULT_ONE);
    assert_eq!(v, Verdict::Pass);
    assert_eq!(f.t_next_ns, 14_000);
    // The next packet 1 us later is paced to the flow's clock.
    let v = paced(&mut f, &pkt(11_000, 1_000), 4 * MULT_ONE);
    assert_eq!(v, Verdict::Pace { tstamp_ns: 14_000 });
    assert_eq!(f.t_next_ns, 18_000);
}

#[test]
fn sparse_flow_is_never_delayed() {
    let mut f = FlowEntry::fresh(1, 0);
    // 10 pps of 100 ns packets at m = 64 (a crowded link): always idle.
    for i in 1..1_000u64 {
        let v = paced(&mut f, &pkt(i * 100_000_000, 100), 64 * MULT_ONE);
        assert_eq!(v, Verdict::Pass, "packet {i}");
    }
}

#[test]
fn socket_departure_time_is_never_pulled_earlier() {
    let mut f = FlowEntry::fresh(1, 0);
    let p = Packet {
        skb_tstamp_ns: 50_000,
        ..pkt(10_000, 1_000)
    };
    assert_eq!(paced(&mut f, &p, MULT_ONE), Verdict::Pass);
    assert_eq!(f.t_next_ns, 51_000);
}

#[test]
fn beyond_horizon_drops_without_using_a_slot() {
    let mut f = FlowEntry::fresh(1, 0);
    f.t_next_ns = 1_000 + P.horizon_ns + 1;
    let before = f.t_next_ns;
    assert_eq!(
        paced(&mut f, &pkt(1_000, 10), MULT_ONE),
        Verdict::HorizonDrop
    );
    assert_eq!(f.t_next_ns, before);
}

/// Runs a flow whose queue starts 20 ms deep and grows by 0.1 ms a packet
/// (1 ms at the share, arrivals every 0.9 ms) until CoDel signals; returns
/// the signal's decision time and the signalled packet's departure.
fn first_signal(ect: bool, clock: CodelClock) -> (u64, u64) {
    let mut f = FlowEntry::fresh(1, 0);
    f.t_next_ns = 20_000_000;
    for i in 0..400u64 {
        let now = i * 900_000;
        let depart = f.t_next_ns;
        let p = Packet {
            ect,
            ..pkt(now, 1_000_000)
        };
        match decide(&mut f, &p, MULT_ONE, &P, clock) {
            Verdict::Mark { .. } | Verdict::CodelDrop => return (now, depart),
            Verdict::Pace { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    panic!("CoDel signals a standing delay ({})", decide_kind(ect));
}

#[test]
fn standing_delay_is_marked_when_ect_and_dropped_otherwise() {
    for ect in [true, false] {
        // On the decision's clock: one interval after the delay first
        // exceeded target (at 0).
        let (at, _) = first_signal(ect, CodelClock::Decision);
        assert!((99_000_000..=101_000_000).contains(&at), "{at}");
        // On the departure clock: the packet that departs one interval
        // after the first packet above target (at 20 ms), decided earlier
        // by the queue's growth, so the sender learns when a head drop
        // would have told it.
        let (at, depart) = first_signal(ect, CodelClock::Departure);
        assert!((120_000_000..=121_000_000).contains(&depart), "{depart}");
        assert!((89_000_000..=92_000_000).contains(&at), "{at}");
    }
}

fn decide_kind(ect: bool) -> &'static str {
    if ect { "mark" } else { "drop" }
}

#[test]
fn a_mark_keeps_the_packet_and_a_drop_does_not_advance_the_clock() {
    let mut f = FlowEntry::fresh(1, 0);
    f.t_next_ns = 30_000_000;
    f.codel.first_above_ns = 1; // above target for long already
    let v = paced(
        &mut f,
        &Packet {
            ect: true,
            ..pkt(10_000_000, 1_000)
        },
        MULT_ONE,
    );
    assert_eq!(
        v,
        Verdict::Mark {
            tstamp_ns: 30_000_000
        }
    );
    assert_eq!(f.t_next_ns, 30_001_000);

    let mut f = FlowEntry::fresh(1, 0);
    f.t_next_ns = 30_000_000;
    f.codel.first_above_ns = 1;
    let v = paced(&mut f, &pkt(10_000_000, 1_000), MULT_ONE);
    assert_eq!(v, Verdict::CodelDrop);
    assert_eq!(f.t_next_ns, 30_000_000);
}

#[test]
fn a_flow_an_interval_behind_is_signalled_on_every_packet() {
    let mut f = FlowEntry::fresh(1, 0);
    let now = 1_000_000_000;
    f.t_next_ns = now + 150_000_000;
    for i in 0..5u64 {
        let p = Packet {
            ect: true,
            ..pkt(now + i, 1_000)
        };
        assert!(matches!(paced(&mut f, &p, MULT_ONE), Verdict::Mark { .. }));
    }
    // A retransmission (Not-ECT) of this ECN-capable flow is not
    // signalled for the overload alone.
    assert!(matches!(
        paced(&mut f, &pkt(now + 9, 1_000), MULT_ONE),
        Verdict::Pace { .. }
    ));
    // A flow that never sent ECT: every packet dropped.
    let mut h = FlowEntry::fresh(3, 0);
    h.t_next_ns = now + 150_000_000;
    for i in 0..5u64 {
        let before = h.t_next_ns;
        assert_eq!(
            paced(&mut h, &pkt(now + i, 1_000), MULT_ONE),
            Verdict::OverloadDrop
        );
        assert_eq!(h.t_next_ns, before);
    }
    // Below an interval, CoDel alone decides: no signal yet.
    let mut g = FlowEntry::fresh(2, 0);
    g.t_next_ns = now + 90_000_000;
    assert!(matches!(
        paced(&mut g, &pkt(now, 1_000), MULT_ONE),
        Verdict::Pace { .. }
    ));
}

#[test]
fn mult_follows_the_ratio_of_scheduled_time_to_capacity() {
    // Exactly full: unchanged.
    assert_eq!(update_mult(4 * MULT_ONE, EPOCH_NS, MULT_ONE), 4 * MULT_ONE);
    // 25% over: x exp(1/16) ~ 1.0645 (1 + 1/16 + 1/512).
    let m = update_mult(4 * MULT_ONE, EPOCH_NS * 5 / 4, MULT_ONE) as f64 / MULT_ONE as f64;
    assert!((m - 4.0 * 1.064_453).abs() < 0.001, "{m}");
    // Half full: x exp(-1/8) ~ 0.8828 (1 - 1/8 + 1/128).
    let m = update_mult(4 * MULT_ONE, EPOCH_NS / 2, MULT_ONE) as f64 / MULT_ONE as f64;
    assert!((m - 4.0 * 0.882_812_5).abs() < 0.001, "{m}");
    // Idle: clamped ratio, then floored at 1.0.
    assert_eq!(update_mult(MULT_ONE, 0, MULT_ONE), MULT_ONE);
    // Ten times over: the ratio is clamped to 2: x (1 + 1/4 + 1/32).
    assert_eq!(
        update_mult(2 * MULT_ONE, 10 * EPOCH_NS, MULT_ONE),
        2 * MULT_ONE * 41 / 32
    );
    // Never reaches MULT_MAX.
    assert_eq!(
        update_mult(MULT_MAX - 1, 10 * EPOCH_NS, MULT_ONE),
        MULT_MAX - 1
    );
}

#[test]
fn closed_loop_with_lumpy_packets_settles_at_the_rate() {
    // Four backlogged flows, each sending at the share C/m in packets of
    // three epochs' transmission time (64 KB GSO at 20 Mbit/s), all
    // counted in the epoch they start in. The loop must settle with the
    // link full on average, not overshoot (the bias a plain
    // multiplicative step had).
    let mut s = FairState {
        epoch: 1,
        ..FairState::default()
    };
    let packet = 3 * EPOCH_NS;
    let mut credit = 0u64;
    let (mut sent, mut epochs) = (0u64, 0u64);
    for e in 1..20_000u64 {
        // Transmission time at C that four flows at C/m produce.
        credit += 4 * EPOCH_NS * MULT_ONE / s.mult_q16;
        let mut scheduled = 0;
        while credit >= packet {
            credit -= packet;
            scheduled += packet;
        }
        s.scheduled_ns[(e % EPOCH_RING as u64) as usize] = scheduled;
        s.active_now = 4;
        if e > 2_000 {
            sent += scheduled;
            epochs += 1;
        }
        roll_epoch(&mut s, e + 1);
    }
    let utilisation = sent as f64 / (epochs * EPOCH_NS) as f64;
    let m = s.mult_q16 as f64 / MULT_ONE as f64;
    assert!(
        (0.98..=1.02).contains(&utilisation),
        "link used {utilisation:.4} of the rate (m = {m:.3})"
    );
}

const NO_CAP: u64 = MULT_MAX - 1;

#[test]
fn the_multiplier_never_exceeds_the_active_flows_plus_one() {
    // Four active flows: at most 5, whatever the feedback asks.
    assert_eq!(mult_cap(4, 0), 5 * MULT_ONE);
    assert_eq!(mult_cap(3, 4), 5 * MULT_ONE);
    assert_eq!(mult_cap(0, 0), MULT_ONE);
    // The join rule stops at the cap.
    assert_eq!(join_mult(4 * MULT_ONE, 5, 4, 5 * MULT_ONE), 5 * MULT_ONE);
    assert_eq!(join_mult(4 * MULT_ONE, 5, 4, 4 * MULT_ONE), 4 * MULT_ONE);
    // An epoch roll (the last of a window) after bursts far above the
    // rate: capped at the window's four flows plus one.
    let last_of_window = (3 << ACTIVE_WINDOW_SHIFT) - 1;
    let mut st = FairState {
        epoch: last_of_window,
        active_now: 4,
        mult_q16: 4 * MULT_ONE,
        mult_feedback_q16: 4 * MULT_ONE,
        scheduled_avg_ns: 2 * EPOCH_NS,
        ..FairState::default()
    };
    st.scheduled_ns[(last_of_window % EPOCH_RING as u64) as usize] = 4 * EPOCH_NS;
    roll_epoch(&mut st, last_of_window + 1);
    assert_eq!((st.active_last, st.active_now), (4, 0));
    assert_eq!(st.mult_q16, 5 * MULT_ONE);
    // Windows: unchanged within one, shifted at the next, cleared after.
    let w = 1u64 << ACTIVE_WINDOW_SHIFT;
    assert_eq!(roll_active(2, 3, 5 * w, 5 * w + 1), (2, 3));
    assert_eq!(roll_active(2, 3, 5 * w + 7, 6 * w), (3, 0));
    assert_eq!(roll_active(2, 3, 5 * w, 7 * w), (0, 0));
    // Counting: once per flow per window, never confused by a fresh
    // entry.
    let mut f = FlowEntry::fresh(1, 0);
    assert!(count_active(&mut f, 7 * w));
    assert!(!count_active(&mut f, 7 * w + 5));
    assert!(count_active(&mut f, 8 * w));
    let mut g = FlowEntry::fresh(2, 0);
    assert!(count_active(
        &mut g,
        u64::from(u32::MAX) << ACTIVE_WINDOW_SHIFT
    ));
}

#[test]
fn a_joining_flow_shrinks_the_share_at_once() {
    // The reference forgets slowly: 4 flows, then epochs with fewer.
    let mut r = backlogged_reference(decay_reference(0), 4, true);
    assert_eq!(r, 4 << 8);
    r = backlogged_reference(decay_reference(r), 3, true);
    assert_eq!(r, (4 << 8) - (4 << 4));
    // After a long gap (the roll decays at most 16 times): no last count.
    let mut long = r;
    for _ in 0..EPOCH_RING {
        long = decay_reference(long);
    }
    assert_eq!(backlogged_reference(long, 5, false), 347);
    // Four flows last epoch at m = 4; the fifth this epoch: 4 * 5/4.
    let m = join_mult(4 * MULT_ONE, 5, 4, NO_CAP);
    assert!((m as f64 / MULT_ONE as f64 - 5.0).abs() < 0.001, "{m}");
    // Not more flows than last epoch: unchanged.
    assert_eq!(join_mult(4 * MULT_ONE, 4, 4, NO_CAP), 4 * MULT_ONE);
    assert_eq!(join_mult(4 * MULT_ONE, 2, 4, NO_CAP), 4 * MULT_ONE);
    // From idle: the second flow halves the share of the first.
    assert_eq!(join_mult(MULT_ONE, 1, 0, NO_CAP), MULT_ONE);
    assert_eq!(join_mult(MULT_ONE, 2, 0, NO_CAP), 2 * MULT_ONE);
    // A flow back from a reduction that the reference forgot, with m
    // already at the flows' number: no step past equal shares, and never
    // a fall.
    assert_eq!(join_mult(8 * MULT_ONE, 8, 7, NO_CAP), 8 * MULT_ONE);
    assert_eq!(join_mult(9 * MULT_ONE, 8, 7, NO_CAP), 9 * MULT_ONE);
    let below = join_mult(3 * MULT_ONE, 8, 7, NO_CAP);
    assert!(
        (below as f64 / MULT_ONE as f64 - 24.0 / 7.0).abs() < 0.001,
        "{below}"
    );
    // Beyond the table: the feedback alone.
    assert_eq!(join_mult(MULT_ONE, 65, 10, NO_CAP), MULT_ONE);
    // Counting: once per flow per epoch, never confused by a fresh entry.
    let mut f = FlowEntry::fresh(1, 0);
    assert!(count_backlogged(&mut f, 7));
    assert!(!count_backlogged(&mut f, 7));
    assert!(count_backlogged(&mut f, 8));
    let mut g = FlowEntry::fresh(2, 0);
    assert!(count_backlogged(&mut g, u64::from(u32::MAX)));
}

#[test]
fn the_views_read_the_share_and_the_counts() {
    let at = |mult_q16| FairState {
        mult_q16,
        ..FairState::default()
    };
    // m = 4: a quarter of 50 Mbit/s; m = 1.5 (Q16).
    assert_eq!(at(4 * MULT_ONE).share_bytes_per_s(6_250_000), 1_562_500);
    assert_eq!(at(MULT_ONE * 3 / 2).share_bytes_per_s(6_000_000), 4_000_000);
    // Below 1.0 (never written by the kernel) reads as 1.0.
    assert_eq!(at(0).share_bytes_per_s(6_000_000), 6_000_000);
    let s = FairState {
        active_last: 3,
        active_now: 2,
        backlogged_ref_q8: 257,
        ..FairState::default()
    };
    assert_eq!((s.active_flows(), s.backlogged_flows()), (3, 2));
}

#[test]
fn fair_tx_saturates_instead_of_wrapping() {
    assert_eq!(fair_tx_ns(1_000, 3 * MULT_ONE), 3_000);
    assert_eq!(fair_tx_ns(1 << 33, MULT_ONE), u64::MAX >> 16);
}

#[test]
fn departure_slots_wrap_and_clamp_far_departures() {
    let e = 1_000u64;
    let now = e << EPOCH_SHIFT;
    assert_eq!(departure_slot(e, now), (e % 16) as usize);
    assert_eq!(departure_slot(e, now + EPOCH_NS), ((e + 1) % 16) as usize);
    assert_eq!(
        departure_slot(e, now + 100 * EPOCH_NS),
        ((e + 15) % 16) as usize
    );
}

#[test]
fn roll_epoch_measures_the_finished_epoch_and_clears_past_slots() {
    let mut s = FairState {
        epoch: 10,
        mult_q16: 2 * MULT_ONE,
        mult_feedback_q16: 2 * MULT_ONE,
        ..FairState::default()
    };
    s.scheduled_ns[10] = EPOCH_NS * 3; // 200% over
    s.scheduled_ns[11] = 7; // a future epoch's, kept
    s.active_now = 3;
    roll_epoch(&mut s, 11);
    assert_eq!(s.epoch, 11);
    // The average moves a quarter of the way: 1.5 epochs; then
    // x (1 + 1/8 + 1/128).
    assert_eq!(s.scheduled_avg_ns, EPOCH_NS * 3 / 2);
    assert_eq!(s.mult_q16, 2 * MULT_ONE * 145 / 128);
    assert_eq!(s.scheduled_ns[10], 0);
    assert_eq!(s.scheduled_ns[11], 7);
    // A long idle gap: no measurement, everything past cleared.
    s.scheduled_ns[12] = 99;
    roll_epoch(&mut s, 100);
    assert!(
        s.scheduled_ns.iter().all(|&v| v == 0),
        "{:?}",
        s.scheduled_ns
    );
    assert!(s.mult_q16 < 2 * MULT_ONE + MULT_ONE / 2);
}

#[test]
fn a_raise_that_would_only_idle_the_link_does_not_stand() {
    let m = 4 * MULT_ONE + MULT_ONE / 2;
    // Four committed flows at m = 4 fill the link: a raise may stand.
    assert!(!raise_would_idle(
        4 * MULT_ONE,
        4 * WEIGHT_ONE,
        0,
        5,
        EPOCH_NS,
        MULT_ONE
    ));
    // At m = 4.5 they leave a ninth of it idle ...
    assert!(raise_would_idle(
        m,
        4 * WEIGHT_ONE,
        0,
        5,
        EPOCH_NS,
        MULT_ONE
    ));
    assert!(raise_would_idle(
        m,
        4 * WEIGHT_ONE,
        EPOCH_NS / 10,
        5,
        EPOCH_NS,
        MULT_ONE
    ));
    // ... unless the traffic passed unpaced fills it.
    assert!(!raise_would_idle(
        m,
        4 * WEIGHT_ONE,
        EPOCH_NS / 8,
        5,
        EPOCH_NS,
        MULT_ONE
    ));
    // Fewer than half of m committed: flows paused together, no hold.
    assert!(!raise_would_idle(
        m,
        2 * WEIGHT_ONE,
        0,
        5,
        EPOCH_NS,
        MULT_ONE
    ));
    assert!(!raise_would_idle(MULT_ONE, 0, 0, 5, EPOCH_NS, MULT_ONE));
    // Among more flows than the join rule acts among, the feedback alone
    // raises the share for newcomers: no hold.
    assert!(!raise_would_idle(
        m,
        4 * WEIGHT_ONE,
        0,
        JOIN_MAX_FLOWS + 1,
        EPOCH_NS,
        MULT_ONE
    ));
    assert!(raise_would_idle(
        m,
        4 * WEIGHT_ONE,
        0,
        JOIN_MAX_FLOWS,
        EPOCH_NS,
        MULT_ONE
    ));
    // The extremes neither overflow nor hold.
    assert!(!raise_would_idle(
        MULT_MAX - 1,
        1 << 47,
        u64::MAX,
        5,
        EPOCH_NS,
        MULT_ONE
    ));

    // In the roll, as flows join: four committed flows, m = 4.5 (the join
    // rule's step), the last epoch accepted twice the rate. The feedback
    // asks for more, and the raise does not stand.
    let e = 10u64;
    let slot = e << (EPOCH_SHIFT - CLOCK_SLOT_SHIFT);
    let mut st = FairState {
        epoch: e,
        mult_q16: m,
        mult_feedback_q16: m,
        scheduled_avg_ns: 2 * EPOCH_NS,
        clock_slot: slot,
        committed: 4 * WEIGHT_ONE,
        active_now: 5,
        ..FairState::default()
    };
    st.clock_counts[committed::slot_index(slot + 3 * committed::SLOTS_PER_EPOCH)] = 4 * WEIGHT_ONE;
    st.scheduled_ns[(e % EPOCH_RING as u64) as usize] = 2 * EPOCH_NS;
    let mut filled = st;
    roll_epoch(&mut st, e + 1);
    assert_eq!(st.committed, 4 * WEIGHT_ONE);
    assert_eq!((st.mult_feedback_q16, st.mult_q16), (m, m));
    // The same with an eighth of the epoch passed unpaced: the link is
    // full at 4.5, and the raise (x 1.28, under the cap of 6) stands; the
    // unpaced time is taken out.
    filled.unpaced_ns = EPOCH_NS / 8;
    roll_epoch(&mut filled, e + 1);
    assert_eq!(filled.mult_feedback_q16, m * 41 / 32);
    assert_eq!(filled.mult_q16, filled.mult_feedback_q16);
    assert_eq!(filled.unpaced_ns, 0);
}

#[test]
fn the_pacer_counts_the_time_it_passes_unpaced() {
    let mut st = FairState::default();
    let mut f = FlowEntry::fresh(1, 0);
    let step = |st: &mut FairState, f: &mut FlowEntry, now| {
        crate::shared::pace::<_, true>(st, f, &pkt(now, 1_000), 0, MULT_ONE, &P)
    };
    assert_eq!(step(&mut st, &mut f, 10_000), Verdict::Pass);
    assert_eq!(st.unpaced_ns, 1_000);
    // Paced: not counted.
    assert!(matches!(
        step(&mut st, &mut f, 10_001),
        Verdict::Pace { .. }
    ));
    assert_eq!(st.unpaced_ns, 1_000);
    // The policer's roll keeps no committed count and leaves it alone.
    crate::shared::roll_epoch::<_, _, false>(
        &mut st,
        &mut crate::tins::TinState::default(),
        0,
        1,
        Level::FLOWS,
    );
    assert_eq!(st.unpaced_ns, 1_000);
}

#[test]
fn the_unpaced_floor_leaves_the_committed_what_the_unpaced_traffic_leaves() {
    let w = crate::committed::WEIGHT_ONE;
    assert_eq!(unpaced_floor(4 * w, 0), 4 * w);
    // Half the epoch unpaced: twice the floor.
    assert_eq!(unpaced_floor(4 * w, EPOCH_NS / 2), 8 * w);
    // Three quarters or more: four times, at most.
    assert_eq!(unpaced_floor(4 * w, 3 * EPOCH_NS / 4), 16 * w);
    assert_eq!(unpaced_floor(4 * w, 10 * EPOCH_NS), 16 * w);
    // Rounded down to 64ths: a little unpaced time does not lift it.
    assert_eq!(unpaced_floor(w, EPOCH_NS / 100), w);
    // The extremes do not overflow.
    assert_eq!(unpaced_floor(u64::MAX, u64::MAX), 4 << 40);
}

#[test]
fn the_feedback_is_held_to_half_the_multiplier_the_floor_holds_up() {
    assert_eq!(hold_feedback(MULT_ONE, 6 * MULT_ONE), 3 * MULT_ONE);
    assert_eq!(hold_feedback(5 * MULT_ONE, 6 * MULT_ONE), 5 * MULT_ONE);
    // An odd multiplier rounds the half up: never below half.
    assert_eq!(hold_feedback(0, 7), 4);
    // In the roll: six committed flows hold m at 6 while the feedback sits
    // at 1 with the link full. The roll lifts the feedback to 3, so when the
    // floor lets go the share at most doubles.
    let e = 10u64;
    let slot = e << (EPOCH_SHIFT - CLOCK_SLOT_SHIFT);
    let mut st = FairState {
        epoch: e,
        mult_q16: 6 * MULT_ONE,
        mult_feedback_q16: MULT_ONE,
        scheduled_avg_ns: EPOCH_NS,
        clock_slot: slot,
        committed: 6 * WEIGHT_ONE,
        active_now: 8,
        ..FairState::default()
    };
    st.clock_counts[committed::slot_index(slot + 3 * committed::SLOTS_PER_EPOCH)] = 6 * WEIGHT_ONE;
    st.scheduled_ns[(e % EPOCH_RING as u64) as usize] = EPOCH_NS;
    roll_epoch(&mut st, e + 1);
    assert_eq!(st.mult_q16, 6 * MULT_ONE);
    assert_eq!(st.mult_feedback_q16, 3 * MULT_ONE);
}
