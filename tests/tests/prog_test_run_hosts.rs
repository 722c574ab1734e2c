//! The egress classifier with host isolation (`shaper_egress_hosts`,
//! `shaper_common::hosts`), run through `BPF_PROG_TEST_RUN`: it loads on
//! this kernel, keeps one state per host, paces each flow of a busy host at
//! the share split between its bulk flows, and leaves a lone host's flow at
//! the whole share. The library's step is the same function
//! (`pace_hosts`); the simulator checks the allocations. Through NAT, the
//! pacer and the policer over hosts (`shaper_police_hosts_nat`) find each
//! connection's LAN host.

use std::os::fd::AsFd;

use aya::maps::{HashMap, MapData};
use shaper::bpf::test_run::run_skb;
use shaper_common::{
    EGRESS_HOSTS_NAT_PROGRAM, EGRESS_HOSTS_PROGRAM, NAT_LAN_PROGRAM, POLICE_HOSTS_NAT_PROGRAM,
    POLICE_HOSTS_PROGRAM,
    config::{FLAG_DELIVERY_MONO, FLAG_NAT},
    counters::Counter,
    fair::{EPOCH_SHIFT, fair_tx_ns},
    flow::{FlowSet, counted_flows},
    hosts::{Isolation, flow_mult},
    maps,
    nat::NatKey,
};
use shaper_tests::{
    bpf_harness::*,
    packets::{Packet, internet_checksum, udp4_ecn},
    skip::{Need, require},
};

/// A UDP packet from source address `10.9.0.<host>`, port `sport`, with
/// its header checksum fixed.
fn from_host(host: u8, sport: u16) -> Packet {
    between([10, 9, 0, host], sport, SERVER, SERVER_PORT)
}

/// A UDP packet from `src`:`sport` to `dst`:`dport`, its header checksum
/// fixed.
fn between(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Packet {
    let mut p = udp4_ecn(sport, 0);
    let l3 = p.layout.l3.start;
    let l4 = p.layout.l4.clone().expect("udp header").start;
    p.bytes[l3 + 12..l3 + 16].copy_from_slice(&src);
    p.bytes[l3 + 16..l3 + 20].copy_from_slice(&dst);
    p.bytes[l4 + 2..l4 + 4].copy_from_slice(&dport.to_be_bytes());
    p.bytes[l3 + 10] = 0;
    p.bytes[l3 + 11] = 0;
    let sum = internet_checksum(&p.bytes[l3..l3 + 20]);
    p.bytes[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
    p
}

const SERVER: [u8; 4] = [192, 0, 2, 80];
const SERVER_PORT: u16 = 5201;
/// The router's WAN address, every upload's source after masquerading.
const WAN: [u8; 4] = [198, 51, 100, 1];

fn set0(h: &Harness) -> FlowSet {
    h.flows.get(&0, 0).expect("read SHAPER_FLOWS")
}

#[test]
fn a_busy_hosts_flows_split_its_share_and_a_lone_hosts_flow_keeps_it() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let (a1, a2, b) = (from_host(1, 1000), from_host(1, 2000), from_host(2, 3000));
    let tx = a1.len() as u64 * 50_000;
    let (moved_a, moved_b, m, after, active) = in_one_epoch(|| {
        let mut h = Harness::load_fresh(EGRESS_HOSTS_PROGRAM);
        // 20 kB/s (50 us per byte): the ten packets' work stays within the
        // link's lead (CoDel's interval, `shaper_common::link`), so its
        // clock holds none of them back. One flow-table set so the test
        // sees every flow, source hosts first.
        let (mut config, _) = fair_at(20_000);
        config.flow_sets_mask = 0;
        config.set_isolation(Isolation::DualSrcHost);
        h.set_config(config);
        // Every packet below must fall in this epoch: a roll between them
        // would start the hosts' counts of bulk flows afresh.
        let started = monotonic_ns() >> EPOCH_SHIFT;
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
        (end.epoch == started && end.mult_q16 == fair.mult_q16).then(|| {
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

/// The number of hosts the pacer keeps state for.
fn hosts_known(h: &Harness) -> usize {
    let map = h
        .ebpf
        .map(maps::HOSTS)
        .expect("the object has SHAPER_HOSTS");
    let hosts: HashMap<&MapData, u64, shaper_common::hosts::HostEntry> =
        HashMap::try_from(map).expect("SHAPER_HOSTS is a hash map");
    hosts.keys().count()
}

#[test]
fn masqueraded_hosts_count_apart_through_the_lan_record() {
    if !require(&[Need::Bpf]) {
        return;
    }
    // Two LAN hosts, one connection each to the server, as the LAN side
    // sees them and as the WAN side does after SNAT (ports kept).
    let lan = [
        between([10, 9, 0, 1], 40_001, SERVER, SERVER_PORT),
        between([10, 9, 0, 2], 40_002, SERVER, SERVER_PORT),
    ];
    let up = [
        between(WAN, 40_001, SERVER, SERVER_PORT),
        between(WAN, 40_002, SERVER, SERVER_PORT),
    ];
    let down = [
        between(SERVER, SERVER_PORT, WAN, 40_001),
        between(SERVER, SERVER_PORT, WAN, 40_002),
    ];
    // A connection the LAN side never saw.
    let unseen = between(WAN, 40_003, SERVER, SERVER_PORT);
    // Each direction without and with the flag: the LAN hosts are one
    // host (the WAN address) without it, two with it, so the pacer keeps
    // state for one host more.
    let known = |(plain, through): (&'static str, &'static str),
                 mode: Isolation,
                 flags: u32,
                 wan: &[Packet; 2]| {
        let nat = flags & FLAG_NAT != 0;
        let mut h = Harness::load_program(if nat { through } else { plain });
        let (mut config, _) = fair_at(10_000);
        config.set_isolation(mode);
        config.flags |= flags;
        h.set_config(config);
        // A pooled object may have loaded it for an earlier case.
        let recorder = shaper::bpf::load::classifier(&mut h.ebpf, NAT_LAN_PROGRAM)
            .expect("the object has the LAN classifier");
        if recorder.fd().is_err() {
            recorder.load().expect("the LAN classifier loads");
        }
        let recorder = recorder.fd().expect("loaded").as_fd().try_clone_to_owned();
        let recorder = recorder.expect("duplicating its descriptor");
        for p in &lan {
            let out = run_skb(recorder.as_fd(), &p.bytes, None, 1).expect("test run");
            assert_eq!(out.retval, PASS, "the LAN classifier passes every packet");
        }
        let recorded: HashMap<&MapData, NatKey, u32> =
            HashMap::try_from(h.ebpf.map(maps::NAT).expect("the object has SHAPER_NAT"))
                .expect("SHAPER_NAT is a hash map");
        assert_eq!(recorded.keys().count(), 2, "one entry per connection");
        let before = h.counts();
        for p in wan {
            assert_eq!(h.run(&p.bytes, None).retval, PASS);
        }
        let moved = h.counts().delta(&before);
        let found = if nat { 2 } else { 0 };
        assert_eq!(
            (moved[Counter::NatFound], moved[Counter::NatMissed]),
            (found, 0),
            "lookups found and missed, flags {flags:#x}"
        );
        let hosts = hosts_known(&h);
        if nat {
            let before = h.counts();
            h.run(&unseen.bytes, None);
            let moved = h.counts().delta(&before);
            assert_eq!(
                (moved[Counter::NatFound], moved[Counter::NatMissed]),
                (0, 1)
            );
        }
        hosts
    };
    let mono = FLAG_DELIVERY_MONO;
    let pacer = (EGRESS_HOSTS_PROGRAM, EGRESS_HOSTS_NAT_PROGRAM);
    // The policer shapes the download whatever its flags say.
    let policer = (POLICE_HOSTS_PROGRAM, POLICE_HOSTS_NAT_PROGRAM);
    for (what, programs, mode, flags, wan) in [
        ("upload", pacer, Isolation::DualSrcHost, 0, &up),
        ("download", pacer, Isolation::DualDstHost, mono, &down),
        (
            "policed download",
            policer,
            Isolation::DualDstHost,
            0,
            &down,
        ),
    ] {
        let plain = known(programs, mode, flags, wan);
        let through = known(programs, mode, flags | FLAG_NAT, wan);
        assert_eq!(
            through,
            plain + 1,
            "{what}: hosts without --nat {plain}, with {through}"
        );
    }
}
