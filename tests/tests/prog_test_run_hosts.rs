//! The egress classifier with host isolation (`shaper_egress_hosts`,
//! `shaper_common::hosts`), run through `BPF_PROG_TEST_RUN`: it loads on
//! this kernel, keeps one state per host, paces each flow of a busy host at
//! the share split between its bulk flows, and leaves a lone host's flow at
//! the whole share. The library's step is the same function
//! (`pace_hosts`); the simulator checks the allocations.

use shaper_common::{
    EGRESS_HOSTS_PROGRAM,
    fair::fair_tx_ns,
    flow::{FlowSet, counted_flows},
    hosts::{Isolation, flow_mult},
};
use shaper_tests::{
    bpf_harness::*,
    packets::{Packet, internet_checksum, udp4_ecn},
    skip::{Need, require},
};

/// A UDP packet from source address `10.9.0.<host>`, port `sport`, with
/// its header checksum fixed.
fn from_host(host: u8, sport: u16) -> Packet {
    let mut p = udp4_ecn(sport, 0);
    let l3 = p.layout.l3.start;
    p.bytes[l3 + 12..l3 + 16].copy_from_slice(&[10, 9, 0, host]);
    p.bytes[l3 + 10] = 0;
    p.bytes[l3 + 11] = 0;
    let sum = internet_checksum(&p.bytes[l3..l3 + 20]);
    p.bytes[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
    p
}

fn set0(h: &Harness) -> FlowSet {
    h.flows.get(&0, 0).expect("read SHAPER_FLOWS")
}

#[test]
fn a_busy_hosts_flows_split_its_share_and_a_lone_hosts_flow_keeps_it() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let (a1, a2, b) = (from_host(1, 1000), from_host(1, 2000), from_host(2, 3000));
    let tx = a1.len() as u64 * 100_000;
    let (moved_a, moved_b, m, after, active) = in_one_epoch(|| {
        let mut h = Harness::load_fresh(EGRESS_HOSTS_PROGRAM);
        // 10 kB/s (100 us per byte), one flow-table set so the test sees
        // every flow, source hosts first.
        let (mut config, _) = fair_at(10_000);
        config.flow_sets_mask = 0;
        config.set_isolation(Isolation::DualSrcHost);
        h.set_config(config);
        // Each host's first packet creates its state and passes, before
        // any flow entry is taken.
        for p in [&a1, &b] {
            assert_eq!(h.run(&p.bytes, None).retval, PASS);
        }
        // Two packets of each flow: the second of each is paced, which
        // counts the flow among its host's bulk flows (and lets each host
        // join, which moves the multiplier).
        for p in [&a1, &a1, &a2, &a2, &b, &b] {
            assert_eq!(h.run(&p.bytes, None).retval, PASS);
        }
        // The ways in the order the flows came: a1, a2, b.
        let ways = set0(&h).ways;
        assert!(
            ways[..3].iter().all(|w| w.tag != 0) && ways[3].tag == 0,
            "{ways:?}"
        );
        let fair = h.fair.get(&0, 0).expect("read SHAPER_FAIR");
        h.run(&a1.bytes, None);
        h.run(&b.bytes, None);
        let after = set0(&h).ways;
        let end = h.fair.get(&0, 0).expect("read SHAPER_FAIR");
        (end.epoch == fair.epoch && end.mult_q16 == fair.mult_q16).then(|| {
            (
                after[0].t_next_ns - ways[0].t_next_ns,
                after[2].t_next_ns - ways[2].t_next_ns,
                fair.mult_q16,
                after,
                end.active_now,
            )
        })
    });
    // Host A has two bulk flows: its flow's clock moves at the multiplier
    // times two, host B's at the multiplier.
    assert_eq!(moved_a, fair_tx_ns(tx, flow_mult(m, 2)), "m {m}");
    assert_eq!(moved_b, fair_tx_ns(tx, flow_mult(m, 1)), "m {m}");
    assert!(moved_a > moved_b, "{moved_a} {moved_b}");
    // The committed count holds A's flow at half a flow's weight.
    assert_eq!(counted_flows(after[0].flags), 2);
    assert_eq!(counted_flows(after[2].flags), 1);
    assert_eq!(active, 2, "the water level counts two hosts");
}
