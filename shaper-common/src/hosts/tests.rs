use super::*;
use crate::codel::CodelParams;
use crate::fair::{FairState, MULT_ONE};

const EPOCH: u64 = 1 << crate::fair::EPOCH_SHIFT;
const WINDOW: u64 = EPOCH << ACTIVE_WINDOW_SHIFT;

fn params() -> FairParams {
    FairParams {
        codel: CodelParams {
            target_ns: 5_000_000,
            interval_ns: 100_000_000,
        },
        horizon_ns: 10_000_000_000,
        ecn: true,
    }
}

fn packet(now_ns: u64) -> Packet {
    Packet {
        now_ns,
        skb_tstamp_ns: 0,
        tx_ns: 1_000_000,
        ect: true,
        link_ns: 0,
    }
}

#[test]
fn keywords_round_trip_and_levels_follow_the_direction() {
    for (word, mode) in Isolation::KEYWORDS {
        assert_eq!(Isolation::from_keyword(word), Some(mode));
        assert_eq!(mode.keyword(), word);
        assert_eq!(Isolation::from_u32(mode as u32), Some(mode));
    }
    assert_eq!(Isolation::from_keyword("triple"), None);
    assert_eq!(Isolation::from_u32(7), None);
    assert_eq!(Isolation::default(), Isolation::TripleIsolate);
    let triple = Isolation::TripleIsolate;
    assert_eq!(
        triple.levels(true),
        Some(HostLevels {
            unit: Side::Src,
            peer: Some(Side::Dst)
        })
    );
    assert_eq!(triple.levels(false).map(|l| l.unit), Some(Side::Dst));
    assert_eq!(
        Isolation::DualDstHost.levels(true).map(|l| l.unit),
        Some(Side::Dst)
    );
    assert_eq!(Isolation::SrcHost.levels(true), None);
    assert_eq!(Isolation::SrcHost.flow_key(), FlowKey::Src);
    assert_eq!(Isolation::Hosts.flow_key(), FlowKey::Pair);
    assert_eq!(triple.flow_key(), FlowKey::FiveTuple);
}

#[test]
fn a_hosts_count_rolls_with_its_windows() {
    let mut h = HostEntry::default();
    assert!(host_window(&mut h, 0));
    assert!(!host_window(&mut h, 1));
    h.bulk_now = 8;
    assert_eq!(host_flows(&h), 8);
    // The next window: the count becomes the last, and still weighs.
    let next = WINDOW / EPOCH;
    assert!(host_window(&mut h, next));
    assert_eq!((h.bulk_last, h.bulk_now, host_flows(&h)), (8, 0, 8));
    // A window with no packet between: both restart.
    h.bulk_now = 3;
    assert!(host_window(&mut h, 3 * next));
    assert_eq!((h.bulk_last, h.bulk_now, host_flows(&h)), (0, 0, 1));
}

#[test]
fn the_flow_multiplier_is_the_product_within_range_and_weights_are_reciprocals() {
    assert_eq!(flow_mult(MULT_ONE, 1), MULT_ONE);
    assert_eq!(flow_mult(3 * MULT_ONE, 8), 24 * MULT_ONE);
    // m below 1.0 under isolation; no flow faster than the rate.
    assert_eq!(flow_mult(MULT_ONE / 4, 2), MULT_ONE);
    assert_eq!(flow_mult(MULT_ONE / 4, 8), 2 * MULT_ONE);
    assert_eq!(flow_mult(MULT_MAX - 1, HOST_FLOWS_MAX), MULT_MAX - 1);
    assert_eq!(
        flow_mult(MULT_ONE, 10 * HOST_FLOWS_MAX),
        HOST_FLOWS_MAX << 16
    );
    assert_eq!(flow_weight(0), WEIGHT_ONE);
    assert_eq!(flow_weight(1), WEIGHT_ONE);
    assert_eq!(flow_weight(8), WEIGHT_ONE / 8);
    assert_eq!(flow_weight(3), 21_845);
    assert_eq!(flow_weight(5 * HOST_FLOWS_MAX), WEIGHT_ONE / HOST_FLOWS_MAX);
}

#[test]
fn flows_of_a_busy_host_are_paced_at_its_share_split_and_weighed_by_it() {
    let mut s = FairState::default();
    let mut host = HostEntry::default();
    let mut flows = [FlowEntry::fresh(1, 0), FlowEntry::fresh(2, 0)];
    let m = 2 * MULT_ONE;
    let now = 5 * WINDOW;
    let epoch = now >> crate::fair::EPOCH_SHIFT;
    s.clock_slot = now >> crate::committed::CLOCK_SLOT_SHIFT;
    let step = |s: &mut FairState, f: &mut FlowEntry, h: &mut HostEntry| {
        pace_hosts::<_, true>(
            s,
            f,
            h,
            (&mut HostEntry::default(), 0),
            &packet(now),
            epoch,
            m,
            &params(),
        )
    };
    // Each flow's first packet passes and sets its clock at m × 1.
    for f in flows.iter_mut() {
        assert_eq!(step(&mut s, f, &mut host), Verdict::Pass);
        assert_eq!(f.t_next_ns, now + 2_000_000);
    }
    // The host counted active once; both flows committed at weight 1.
    assert_eq!(s.active_now, 1);
    assert_eq!(s.committed, 2 * WEIGHT_ONE);
    assert_eq!(s.unpaced_ns, 2_000_000);
    // The second packets are paced: each flow counts once in the host, and
    // the host joins once.
    for f in flows.iter_mut() {
        assert!(matches!(step(&mut s, f, &mut host), Verdict::Pace { .. }));
    }
    assert_eq!(host.bulk_now, 2);
    assert_eq!(s.backlogged_now, 1);
    // Now each flow advances at m × 2 and moves on with weight 1/2: the
    // first moved with weight 1 before its host counted two.
    let before = flows[0].t_next_ns;
    step(&mut s, &mut flows[0], &mut host);
    assert_eq!(flows[0].t_next_ns - before, 4_000_000);
    assert_eq!(counted_flows(flows[0].flags), 2);
    step(&mut s, &mut flows[1], &mut host);
    assert_eq!(s.committed, WEIGHT_ONE);
    assert_eq!(s.clock_counts.iter().sum::<u64>(), WEIGHT_ONE);
    assert_eq!(host.bulk_now, 2);
}

#[test]
fn triple_isolate_weighs_a_flow_by_the_busier_of_its_hosts() {
    let mut s = FairState::default();
    let mut src = HostEntry::default();
    let mut dst = HostEntry::default();
    let now = 5 * WINDOW;
    let epoch = now >> crate::fair::EPOCH_SHIFT;
    host_window(&mut dst, epoch);
    dst.bulk_now = 4;
    let mut f = FlowEntry::fresh(1, 0);
    let mut step = |f: &mut FlowEntry| {
        pace_hosts::<_, true>(
            &mut s,
            f,
            &mut src,
            (&mut dst, 1),
            &packet(now),
            epoch,
            MULT_ONE,
            &params(),
        )
    };
    step(&mut f);
    assert_eq!(f.t_next_ns, now + 4_000_000);
    assert!(matches!(step(&mut f), Verdict::Pace { .. }));
    assert_eq!((src.bulk_now, dst.bulk_now), (1, 5));
    // Only the unit side's host counts in the water level.
    assert_eq!(s.active_now, 1);
}

#[test]
fn selectors_pick_the_keys_each_mode_names() {
    let (flow, src, dst) = (0x1111, 0x2222, 0x4444);
    let pick = |mode: Isolation, upload: bool| {
        let s = Selectors::of(mode, upload);
        let f = s.flow_hash(flow, src, dst);
        let (unit, peer) = s.keys(f, src, dst);
        (f, unit, peer, s.peer)
    };
    assert_eq!(pick(Isolation::Flows, true), (flow, flow, dst, 0));
    assert_eq!(pick(Isolation::SrcHost, true), (src, src, dst, 0));
    assert_eq!(pick(Isolation::DstHost, true).0, dst);
    assert_eq!(pick(Isolation::Hosts, true).0, src ^ dst.rotate_left(17));
    assert_eq!(pick(Isolation::DualSrcHost, false), (flow, src, dst, 0));
    assert_eq!(pick(Isolation::DualDstHost, true), (flow, dst, src, 0));
    assert_eq!(pick(Isolation::TripleIsolate, true), (flow, src, dst, 1));
    assert_eq!(pick(Isolation::TripleIsolate, false), (flow, dst, src, 1));
    // Keys differ by side and tin.
    assert_ne!(
        host_key(7, Side::Src, 0, &[1]),
        host_key(7, Side::Dst, 0, &[1])
    );
    assert_ne!(
        host_key(7, Side::Src, 0, &[1]),
        host_key(7, Side::Src, 1, &[1])
    );
    let rate = crate::rate::ScaledRate::from_bytes_per_s(10_000).expect("a rate");
    let mut c = crate::config::PacerConfig::new(10_000, rate);
    for (_, mode) in Isolation::KEYWORDS {
        c.set_isolation(mode);
        assert_eq!(c.isolation(), mode);
    }
}
