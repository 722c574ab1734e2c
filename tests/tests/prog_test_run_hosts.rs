//! The egress classifier with host isolation (`shaper_egress_hosts`,
//! `shaper_common::hosts`), run through `BPF_PROG_TEST_RUN`: it loads on
//! this kernel, keeps one state per host, paces each flow of a busy host at
//! the share split between its bulk flows, and leaves a lone host's flow at
//! the whole share. The library's step is the same function
//! (`pace_hosts`); the simulator checks the allocations.

use shaper_common::{
    EGRESS_HOSTS_PROGRAM,
    flow::{FlowSet, counted_flows},
    hosts::Isolation,
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
    let mut h = Harness::load_fresh(EGRESS_HOSTS_PROGRAM);
    // 10 kB/s (100 us per byte), one flow-table set so the test sees every
    // flow, source hosts first.
    let (mut config, _) = fair_at(10_000);
    config.flow_sets_mask = 0;
    config.set_isolation(Isolation::DualSrcHost);
    h.set_config(config);
    let (a1, a2, b) = (from_host(1, 1000), from_host(1, 2000), from_host(2, 3000));
    let tx = a1.len() as u64 * 100_000;
    // Each host's first packet creates its state and passes, before any
    // flow entry is taken.
    for p in [&a1, &b] {
        assert_eq!(h.run(&p.bytes, None).retval, PASS);
    }
    // Two packets of each flow: the second of each is paced, which counts
    // the flow among its host's bulk flows.
    for p in [&a1, &a1, &a2, &a2, &b, &b] {
        assert_eq!(h.run(&p.bytes, None).retval, PASS);
    }
    // The ways in the order the flows came: a1, a2, b.
    let ways = set0(&h).ways;
    let (w_a1, w_a2, w_b) = (ways[0], ways[1], ways[2]);
    assert_eq!(ways[3].tag, 0, "{ways:?}");
    assert!(w_a1.tag != 0 && w_a2.tag != 0 && w_b.tag != 0, "{ways:?}");
    // Host A has two bulk flows: each of its packets now moves its flow's
    // clock by twice the transmission time; host B's one by once.
    h.run(&a1.bytes, None);
    h.run(&b.bytes, None);
    let after = set0(&h).ways;
    assert_eq!(after[0].t_next_ns - w_a1.t_next_ns, 2 * tx);
    assert_eq!(after[2].t_next_ns - w_b.t_next_ns, tx);
    // The committed count holds A's flow at half a flow's weight.
    assert_eq!(counted_flows(after[0].flags), 2);
    assert_eq!(counted_flows(after[2].flags), 1);
    assert_eq!(after[1].t_next_ns, w_a2.t_next_ns);
    let fair = h.fair.get(&0, 0).expect("read SHAPER_FAIR");
    assert_eq!(fair.active_now, 2, "the water level counts two hosts");
}
