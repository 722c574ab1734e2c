//! The DiffServ tins in the egress classifier, through `BPF_PROG_TEST_RUN`:
//! a packet's DSCP picks its tin's fair state (rolled in its own entry of
//! `SHAPER_FAIR`) and its tin's counters, `--wash` clears the DSCP and
//! keeps the ECN bits with the IPv4 checksum right, and a DSCP the mode
//! does not name is best effort. The simulator (`shaper/tests/sim_tins.rs`)
//! checks the shares the tins settle at; this checks that the kernel side
//! takes the same steps on the same state.

use shaper_common::{
    config::FLAG_WASH,
    counters::Counter,
    fair::EPOCH_SHIFT,
    tins::{Diffserv, TinState},
};
use shaper_tests::{
    bpf_harness::*,
    packets::{internet_checksum, udp4_ecn},
    skip::{Need, require},
};

/// diffserv4's tins.
const BEST_EFFORT: usize = 0;
const VIDEO: usize = 2;
const VOICE: usize = 3;

/// A UDP frame with TOS byte `tos` (DSCP and ECN), its checksum fixed.
fn udp4_tos(sport: u16, tos: u8) -> (Vec<u8>, usize) {
    let mut p = udp4_ecn(sport, tos & 3);
    let l3 = p.layout.l3.start;
    p.bytes[l3 + 1] = tos;
    p.bytes[l3 + 10] = 0;
    p.bytes[l3 + 11] = 0;
    let sum = internet_checksum(&p.bytes[l3..l3 + 20]);
    p.bytes[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
    (p.bytes, l3)
}

fn diffserv4(h: &mut Harness, wash: bool) {
    let (mut config, _) = fair_at(1_000_000);
    let mode = Diffserv::Diffserv4;
    config.diffserv = mode.index();
    config.tin_planes = mode.planes();
    if wash {
        config.flags |= FLAG_WASH;
    }
    h.set_config(config);
    h.tins
        .set(0, TinState::new(mode), 0)
        .expect("write SHAPER_TINS");
}

fn counts(h: &Harness, tin: usize) -> [u64; 2] {
    let c = h.tin_counts(tin as u32);
    [c.packets, c.bytes]
}

#[test]
fn a_packets_dscp_picks_its_tins_state_and_counters() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    diffserv4(&mut h, false);
    let (ef, _) = udp4_tos(1000, 0xb8);
    let (af41, _) = udp4_tos(1001, 34 << 2);
    let (plain, _) = udp4_tos(1002, 0);
    let (unnamed, _) = udp4_tos(1003, 63 << 2);
    let t0 = monotonic_ns();
    for frame in [&ef, &ef, &af41, &plain, &unnamed] {
        assert_eq!(h.run(frame, None).retval, PASS);
    }
    assert_eq!(counts(&h, VOICE)[0], 2);
    assert_eq!(counts(&h, VIDEO)[0], 1);
    assert_eq!(
        counts(&h, BEST_EFFORT)[0],
        2,
        "DSCP 0 and 63 are best effort"
    );
    assert_eq!(counts(&h, 1)[0], 0);
    assert!(counts(&h, VOICE)[1] >= 2 * ef.len() as u64);
    // Each tin rolled its own state to this epoch; the bulk tin, which saw
    // no packet, did not.
    let epoch = t0 >> EPOCH_SHIFT;
    for tin in [BEST_EFFORT, VIDEO, VOICE] {
        let st = h.fair.get(&(tin as u32), 0).expect("read SHAPER_FAIR");
        assert!(st.epoch >= epoch, "tin {tin} not rolled: {}", st.epoch);
    }
    assert_eq!(h.fair.get(&1, 0).expect("read SHAPER_FAIR").epoch, 0);
    // Each roll published its usage in the tins' table.
    let table = h.tins.get(&0, 0).expect("read SHAPER_TINS");
    assert!(table.usage_epoch[VOICE] >= epoch);
    assert_eq!(table.usage_epoch[1], 0);
}

#[test]
fn wash_clears_the_dscp_and_keeps_ecn_with_a_valid_checksum() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    diffserv4(&mut h, true);
    let before = h.counts();
    let (ef, l3) = udp4_tos(1000, 0xb8 | 0b10);
    let out = h.run(&ef, None);
    assert_eq!(out.retval, PASS);
    assert_eq!(out.data[l3 + 1], 0b10, "DSCP cleared, ECT(0) kept");
    let mut header = out.data[l3..l3 + 20].to_vec();
    let check = u16::from_be_bytes([header[10], header[11]]);
    header[10] = 0;
    header[11] = 0;
    assert_eq!(check, internet_checksum(&header));
    // Chosen before the wash: the voice tin.
    assert_eq!(counts(&h, VOICE)[0], 1);
    assert_eq!(h.counts().delta(&before)[Counter::Washed], 1);
    // A packet without a DSCP is left as it is and not counted.
    let (plain, _) = udp4_tos(1001, 0b01);
    let out = h.run(&plain, None);
    assert_eq!(out.data, plain);
    assert_eq!(h.counts().delta(&before)[Counter::Washed], 1);
}

#[test]
fn without_tins_every_dscp_is_the_one_tin() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let (config, _) = fair_at(1_000_000);
    h.set_config(config);
    let (ef, _) = udp4_tos(1000, 0xb8);
    let out = h.run(&ef, None);
    assert_eq!(out.retval, PASS);
    assert_eq!(out.data, ef, "no wash without --wash");
    assert_eq!(counts(&h, BEST_EFFORT)[0], 1);
    assert_eq!(counts(&h, VOICE)[0], 0);
}
