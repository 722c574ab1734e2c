//! The ingress policer (`shaper_police`) in the kernel, through
//! `BPF_PROG_TEST_RUN`: packets pass at once and `skb->tstamp` is never
//! written; when the virtual link is overloaded its CoDel's signal goes to a
//! flow above its share (CE with a valid checksum when ECT, a drop
//! otherwise, each counted); a sparse flow is never touched; no flow gets
//! more than one signal in four packets; a clock past the horizon is pulled
//! back and counted; a flow's first signal comes as soon as it is a target
//! behind its share.
//!
//! Runs on this machine's kernel (no sch_fq needed) and in the VM; needs
//! `Need::Bpf` (see [`shaper_tests::skip`]).
//! Run: `cargo test -p shaper-tests --test prog_test_run_police -- --test-threads=1`

use shaper::bpf::test_run::SkBuff;
use shaper_common::{
    POLICE_PROGRAM,
    codel::CodelState,
    counters::Counter,
    fair::{FairState, MULT_ONE},
    flow::FlowSet,
    police::{FLOW_EARLY_DONE, LinkState, MIN_PASSED_BETWEEN_SIGNALS, SINCE_SHIFT},
};
use shaper_tests::{
    bpf_harness::*,
    packets::{Packet, internet_checksum, udp4_ecn},
    skip::{Need, require},
};

const MS: u64 = 1_000_000;

/// The policer at 10 kB/s (100 us per byte) with one flow-table set.
/// The longest the early-signal test's four packets may take: a fifth of
/// the 73 ms they put on the link, so that the link stays far more than a
/// target behind.
const STALL_NS: u64 = 15 * MS;

fn police_harness() -> Harness {
    let mut h = Harness::load_program(POLICE_PROGRAM);
    let (mut config, _) = fair_at(10_000);
    config.flow_sets_mask = 0;
    h.set_config(config);
    h
}

fn set0(h: &Harness) -> FlowSet {
    h.flows.get(&0, 0).expect("read SHAPER_FLOWS")
}

fn counted(before: &Counts, after: &Counts, c: Counter) -> u64 {
    after.delta(before)[c]
}

/// The virtual link `ahead_ns` behind, above target for longer than an
/// interval: its CoDel's next signal is due at once.
fn overload_link(h: &mut Harness, ahead_ns: u64) {
    let link = LinkState {
        t_link_ns: monotonic_ns() + ahead_ns,
        codel: CodelState {
            first_above_ns: 1,
            ..CodelState::default()
        },
    };
    h.police_link
        .set(0, link, 0)
        .expect("write SHAPER_POLICE_LINK");
}

/// Makes way `way` of set 0 a flow above `C / n` (its eligibility clock
/// `elig_ahead_ns` ahead of now) that may take a signal now (three packets
/// passed since its last).
fn make_eligible(h: &mut Harness, way: usize, elig_ahead_ns: u64) {
    let mut set = set0(h);
    let f = &mut set.ways[way];
    f.codel.first_above_ns = monotonic_ns() + elig_ahead_ns;
    f.flags |= MIN_PASSED_BETWEEN_SIGNALS << SINCE_SHIFT;
    h.flows.set(0, set, 0).expect("write SHAPER_FLOWS");
}

fn way_of(h: &Harness, p: &Packet) -> usize {
    h.run(&p.bytes, None);
    let set = set0(h);
    (0..set.ways.len())
        .find(|&i| set.ways[i].tag != 0 && set.ways[i].last_seen_ns != 0)
        .expect("the flow took a way")
}

#[test]
fn packets_pass_at_once_and_the_timestamp_is_left_alone() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let h = police_harness();
    let p = udp4_ecn(1000, 0);
    let ctx = SkBuff {
        tstamp: 123_456_789,
        ..SkBuff::default()
    };
    let before = h.counts();
    // 3 packets of 242 bytes back to back at 10 kB/s: 73 ms of virtual
    // queue, above target, but a new flow's first three packets pass
    // whatever its clocks say (the one-in-four cap).
    for i in 0..3 {
        let out = h.run(&p.bytes, Some(&ctx));
        assert_eq!(out.retval, PASS, "packet {i} passes");
        assert_eq!(out.ctx.tstamp, 123_456_789, "packet {i}: tstamp untouched");
        assert_eq!(out.data, p.bytes, "packet {i}: bytes untouched");
    }
    let after = h.counts();
    assert_eq!(counted(&before, &after, Counter::Packets), 3);
    assert_eq!(counted(&before, &after, Counter::FlowNew), 1);
    assert_eq!(counted(&before, &after, Counter::PoliceDrop), 0);
    assert_eq!(counted(&before, &after, Counter::CeMarked), 0);
    assert_eq!(
        counted(&before, &after, Counter::Paced) + counted(&before, &after, Counter::PassedUnpaced),
        3,
        "every packet counted as passed, behind its clock or not"
    );
    assert_eq!(
        counted(&before, &after, Counter::Paced),
        2,
        "after the first, each packet runs behind the flow's virtual clock"
    );
    let link = h.police_link.get(&0, 0).expect("read link");
    let now = monotonic_ns();
    assert!(
        link.t_link_ns > now + 40 * MS,
        "the virtual link holds about 73 ms of the 3 packets (at {} ns ahead)",
        link.t_link_ns.saturating_sub(now)
    );
}

#[test]
fn a_flow_a_target_behind_its_share_takes_the_early_signal_at_once() {
    if !require(&[Need::Bpf]) {
        return;
    }
    until_judged(
        EPOCH_ATTEMPTS,
        "took longer over its four packets than the link's backlog allows",
        || {
            let h = police_harness();
            let p = udp4_ecn(1000, 0);
            let started = monotonic_ns();
            let way = way_of(&h, &p);
            for i in 1..3 {
                assert_eq!(h.run(&p.bytes, None).retval, PASS, "packet {i} passes");
            }
            // 73 ms behind, far less than an interval above target: neither the
            // link's CoDel nor the overload rule is due, the early signal is.
            let before = h.counts();
            let verdict = h.run(&p.bytes, None).retval;
            if monotonic_ns() - started > STALL_NS {
                // The link drained while the machine stalled: nothing to judge.
                return None;
            }
            assert_eq!(verdict, DROP, "the fourth packet");
            let after = h.counts();
            assert_eq!(counted(&before, &after, Counter::PoliceDrop), 1);
            assert_eq!(counted(&before, &after, Counter::PoliceEarlyDrop), 1);
            assert_ne!(
                set0(&h).ways[way].flags & FLOW_EARLY_DONE,
                0,
                "the early signal is spent"
            );
            let link = h.police_link.get(&0, 0).expect("read link");
            assert_eq!(link.codel.dropping, 0, "the link's CoDel gave no signal");
            Some(())
        },
    );
}

#[test]
fn an_overloaded_link_ce_marks_an_ect_flow_above_its_share_with_a_valid_checksum() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = police_harness();
    let p = udp4_ecn(1000, 0b10);
    let way = way_of(&h, &p);
    overload_link(&mut h, 60 * MS);
    make_eligible(&mut h, way, 1_000 * MS);
    let before = h.counts();
    let out = h.run(&p.bytes, None);
    let after = h.counts();
    assert_eq!(out.retval, PASS, "a marked packet passes");
    assert_eq!(counted(&before, &after, Counter::CeMarked), 1);
    assert_eq!(counted(&before, &after, Counter::PoliceDrop), 0);
    let l3 = p.layout.l3.clone();
    assert_eq!(out.data[l3.start + 1] & 3, 3, "ECN field is CE");
    assert_eq!(
        internet_checksum(&out.data[l3.start..l3.start + 20]),
        0,
        "the IPv4 header checksum still verifies"
    );
    let link = h.police_link.get(&0, 0).expect("read link");
    assert_eq!(
        link.codel.dropping, 1,
        "the link's CoDel is in its dropping state"
    );
    assert_eq!(
        set0(&h).ways[way].flags & (3 << SINCE_SHIFT),
        0,
        "the flow's count restarts"
    );
}

#[test]
fn an_overloaded_link_drops_a_non_ect_flow_above_its_share() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = police_harness();
    let p = udp4_ecn(1000, 0);
    let way = way_of(&h, &p);
    overload_link(&mut h, 60 * MS);
    make_eligible(&mut h, way, 1_000 * MS);
    let t_link_before = h.police_link.get(&0, 0).expect("read").t_link_ns;
    h.run_expect(
        "a not-ECT packet owed a signal",
        &p.bytes,
        None,
        DROP,
        &[
            (Counter::Packets, 1),
            (Counter::Bytes, p.len() as u64),
            (Counter::WireBytes, p.len() as u64),
            (Counter::Ipv4, 1),
            (Counter::Udp, 1),
            (Counter::PoliceDrop, 1),
            (Counter::PoliceCodelDrop, 1),
        ],
    );
    assert_eq!(
        h.police_link.get(&0, 0).expect("read").t_link_ns,
        t_link_before,
        "a dropped packet takes no time on the virtual link"
    );
}

#[test]
fn a_sparse_flow_is_never_touched_even_when_the_link_is_overloaded() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = police_harness();
    let p = udp4_ecn(1000, 0);
    h.run(&p.bytes, None);
    for i in 0..8 {
        // The link stays due; the flow's eligibility clock stays behind now
        // (a flow below C / n), as a ping's would.
        overload_link(&mut h, 60 * MS);
        let mut set = set0(&h);
        for w in set.ways.iter_mut() {
            w.codel.first_above_ns = 0;
            w.t_next_ns = 0;
        }
        h.flows.set(0, set, 0).expect("write");
        let out = h.run(&p.bytes, None);
        assert_eq!(out.retval, PASS, "sparse packet {i} passes");
        assert_eq!(out.data, p.bytes, "sparse packet {i} unmarked");
    }
    let c = h.counts();
    assert_eq!(c[Counter::PoliceDrop], 0);
    assert_eq!(c[Counter::CeMarked], 0);
    let link = h.police_link.get(&0, 0).expect("read");
    assert_eq!(
        link.codel.dropping, 0,
        "the due signal is kept for an eligible flow, not spent"
    );
}

#[test]
fn no_flow_gets_more_than_one_signal_in_four_packets() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = police_harness();
    let p = udp4_ecn(1000, 0b01);
    let way = way_of(&h, &p);
    let mut signalled = Vec::new();
    let before = h.counts();
    for _ in 0..40 {
        // Always overloaded and always eligible: only the cap holds it back.
        overload_link(&mut h, 60 * MS);
        let mut set = set0(&h);
        set.ways[way].codel.first_above_ns = monotonic_ns() + 1_000 * MS;
        h.flows.set(0, set, 0).expect("write");
        let out = h.run(&p.bytes, None);
        assert_eq!(out.retval, PASS);
        signalled.push(out.data[p.layout.l3.start + 1] & 3 == 3);
    }
    let after = h.counts();
    let marks = signalled.iter().filter(|&&s| s).count();
    for w in signalled.windows(4) {
        assert!(
            w.iter().filter(|&&s| s).count() <= 1,
            "two signals within four packets: {signalled:?}"
        );
    }
    assert_eq!(
        marks, 10,
        "exactly one in four when always due: {signalled:?}"
    );
    assert_eq!(counted(&before, &after, Counter::CeMarked), 10);
    assert_eq!(counted(&before, &after, Counter::PoliceWithheld), 30);
}

#[test]
fn a_clock_past_the_horizon_is_pulled_back_and_counted() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = police_harness();
    let p = udp4_ecn(1000, 0);
    let way = way_of(&h, &p);
    let mut set = set0(&h);
    set.ways[way].t_next_ns = monotonic_ns() + 10_000 * MS;
    h.flows.set(0, set, 0).expect("write");
    let before = h.counts();
    let out = h.run(&p.bytes, None);
    let after = h.counts();
    assert_eq!(out.retval, PASS, "a clamped flow's packet still passes");
    assert_eq!(counted(&before, &after, Counter::PoliceClamped), 1);
    let now = monotonic_ns();
    let t = set0(&h).ways[way].t_next_ns;
    assert!(
        t <= now + 600 * MS,
        "the clock is within the horizon (500 ms) plus one packet: {} ms ahead",
        t.saturating_sub(now) / MS
    );
}

/// A lone flow behind its clock is one backlogged flow, not a join: the
/// share stays whole (as on egress; see `prog_test_run_fair`).
#[test]
fn a_lone_flow_behind_its_clock_keeps_the_whole_rate() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let after = in_one_epoch(|| {
        let mut h = police_harness();
        let now_epoch = h.set_fair_in_this_epoch(FairState::default());
        let p = udp4_ecn(5200, 0);
        h.run(&p.bytes, None); // new flow: its clock was idle
        h.run(&p.bytes, None); // behind its clock: the first backlogged flow
        h.fair_in_epoch(now_epoch)
    });
    assert_eq!(after.backlogged_now, 1);
    assert_eq!(
        after.mult_q16, MULT_ONE,
        "one backlogged flow: the whole rate"
    );
}

/// The policer charges its virtual link the framed length: a packet's ATM
/// cells under `pppoe-llcsnap`, not its bytes.
#[test]
fn the_policer_charges_the_links_framing() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load_program(POLICE_PROGRAM);
    let (mut config, rate) = fair_at(10_000);
    config.flow_sets_mask = 0;
    config.framing = shaper_common::framing::Framing::from_keywords(["pppoe-llcsnap"], None, None)
        .expect("framing");
    let framing = config.framing;
    h.set_config(config);
    let p = udp4_ecn(100, 0);
    let framed = framing.frame_len(p.len() as u32, 14);
    assert_ne!(framed as usize, p.len());
    let before = h.counts();
    let link_before = monotonic_ns();
    let out = h.run(&p.bytes, None);
    assert_eq!(out.retval, PASS);
    assert_eq!(
        counted(&before, &h.counts(), Counter::WireBytes),
        u64::from(framed)
    );
    let ahead = h
        .police_link
        .get(&0, 0)
        .expect("read link")
        .t_link_ns
        .saturating_sub(link_before);
    let tx = rate.tx_time_ns(framed);
    assert!(
        ahead >= tx && ahead < tx + 10 * MS,
        "the virtual link holds the framed packet's time ({tx} ns), holds {ahead} ns"
    );
}
