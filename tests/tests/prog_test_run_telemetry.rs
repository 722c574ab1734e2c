//! The classifier's telemetry records (`shaper_common::event`), through
//! BPF_PROG_TEST_RUN on this machine's kernel: what is sent (samples at the
//! configured rate, every drop, flow starts and ends), what a record says
//! (addresses, ports, verdict, delay), and that a full ring loses records,
//! counted, without touching the packet's verdict.

use aya::maps::{MapData, RingBuf};
use shaper_common::{
    config::{FLAG_TELEMETRY, PacerConfig, sample_threshold},
    counters::Counter,
    event::{
        EVENT_F_SAMPLED, EVENT_FLOW_END, EVENT_FLOW_START, EVENT_PACKET, Event, FAMILY_IPV4,
        FAMILY_IPV6, VERDICT_HORIZON_DROP, VERDICT_PACED, VERDICT_PASS,
    },
    rate::MAX_RATE_BYTES_PER_S,
};
use shaper_tests::{
    bpf_harness::*,
    packets::{Frame, Ipv4, Ipv6, Packet, Transport},
    skip::{Need, require},
};

const UNSPEC: i32 = -1;
const SHOT: i32 = 2;

fn drain(ring: &mut RingBuf<MapData>) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(item) = ring.next() {
        out.push(Event::from_bytes(&item).expect("a whole record"));
    }
    out
}

fn telemetry(rate_bytes_per_s: u64, every: u32) -> PacerConfig {
    let (mut c, _) = fair_at(rate_bytes_per_s);
    c.flags |= FLAG_TELEMETRY;
    c.sample_threshold = sample_threshold(every);
    c
}

fn tcp4(sport: u16, flags: u8) -> Packet {
    let mut p = Frame::ipv4(Ipv4::new(Transport::tcp())).build();
    let l4 = p.layout.l4.clone().expect("tcp").start;
    p.bytes[l4..l4 + 2].copy_from_slice(&sport.to_be_bytes());
    p.bytes[l4 + 2..l4 + 4].copy_from_slice(&443u16.to_be_bytes());
    p.bytes[l4 + 13] = flags;
    p
}

fn udp6(sport: u16) -> Packet {
    let mut p = Frame::ipv6(Ipv6::new(Transport::udp())).build();
    let l4 = p.layout.l4.clone().expect("udp").start;
    p.bytes[l4..l4 + 2].copy_from_slice(&sport.to_be_bytes());
    p.bytes[l4 + 2..l4 + 4].copy_from_slice(&53u16.to_be_bytes());
    p
}

#[test]
fn every_packet_sampled_carries_its_flow_and_verdict() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let mut ring = h.events();
    // 1 Gbit/s: nothing waits, every packet passes.
    h.set_config(telemetry(125_000_000, 1));
    let before = h.counts();
    for _ in 0..5 {
        assert_eq!(h.run(&tcp4(40_000, 0x10).bytes, None).retval, UNSPEC);
        assert_eq!(h.run(&udp6(5353).bytes, None).retval, UNSPEC);
    }
    let ev = drain(&mut ring);
    let after = h.counts();
    assert_eq!(ev.len(), 10, "{ev:?}");
    assert_eq!(after.delta(&before)[Counter::EventsSent], 10);
    let v4: Vec<&Event> = ev.iter().filter(|e| e.key.family == FAMILY_IPV4).collect();
    let v6: Vec<&Event> = ev.iter().filter(|e| e.key.family == FAMILY_IPV6).collect();
    assert_eq!((v4.len(), v6.len()), (5, 5));
    let k = v4[0].key;
    assert_eq!(&k.saddr[..4], &[192, 0, 2, 1]);
    assert_eq!(&k.daddr[..4], &[198, 51, 100, 1]);
    assert_eq!(k.saddr[4..], [0; 12]);
    assert_eq!(
        (u16::from_be(k.sport_be), u16::from_be(k.dport_be), k.proto),
        (40_000, 443, 6)
    );
    let k6 = v6[0].key;
    assert_eq!(k6.saddr[..4], [0x20, 0x01, 0x0d, 0xb8]);
    assert_eq!((k6.saddr[15], k6.daddr[15]), (1, 2));
    assert_eq!(
        (
            u16::from_be(k6.sport_be),
            u16::from_be(k6.dport_be),
            k6.proto
        ),
        (5353, 53, 17)
    );
    // Each flow's first packet is its start; the rest are plain packets.
    let lens = [tcp4(40_000, 0x10).len(), udp6(5353).len()];
    for (flow, len) in [&v4, &v6].into_iter().zip(lens) {
        assert_eq!(flow[0].kind, EVENT_FLOW_START);
        assert!(flow[1..].iter().all(|e| e.kind == EVENT_PACKET));
        assert!(flow.iter().all(|e| e.flags & EVENT_F_SAMPLED != 0));
        assert!(
            flow.iter()
                .all(|e| e.verdict == VERDICT_PASS && e.delay_ns == 0)
        );
        assert!(flow.iter().all(|e| e.len_bytes as usize == len), "{flow:?}");
    }
}

#[test]
fn paced_packets_report_their_scheduled_delay_and_fin_ends_the_flow() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let mut ring = h.events();
    // 100 kB/s: a 86-byte frame takes 0.86 ms, so a burst is paced.
    h.set_config(telemetry(100_000, 1));
    let frame = tcp4(1000, 0x10);
    for _ in 0..20 {
        assert_eq!(h.run(&frame.bytes, None).retval, UNSPEC);
    }
    assert_eq!(h.run(&tcp4(1000, 0x11).bytes, None).retval, UNSPEC);
    let ev = drain(&mut ring);
    assert_eq!(ev.len(), 21);
    let paced: Vec<&Event> = ev.iter().filter(|e| e.verdict == VERDICT_PACED).collect();
    assert!(paced.len() >= 15, "{ev:?}");
    // Each record's delay is its departure less the time it was made, so
    // the departures follow one another by a frame time at the rate. The
    // delays themselves also shrink by whatever time passes between two
    // runs, which under emulation can exceed a frame time.
    let d: Vec<u64> = paced.iter().map(|e| e.ts_ns + e.delay_ns).collect();
    assert!(d.windows(2).all(|w| w[1] > w[0]), "{d:?}");
    let step = (d[d.len() - 1] - d[0]) / (d.len() as u64 - 1);
    let frame_ns = frame.len() as u64 * 1_000_000_000 / 100_000;
    assert!(
        step > frame_ns / 2 && step < frame_ns * 2,
        "step {step} ns vs frame {frame_ns} ns"
    );
    assert_eq!(ev.last().map(|e| e.kind), Some(EVENT_FLOW_END));
}

#[test]
fn default_sampling_sends_about_one_in_64_but_every_drop() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let mut ring = h.events();
    h.set_config(telemetry(125_000_000, 64));
    let n = 12_800u32;
    let mut sampled = 0usize;
    for i in 0..n {
        // Distinct flows so none is paced; starts go as records too.
        let p = tcp4(1024 + (i % 400) as u16, 0x10);
        h.run(&p.bytes, None);
        if i % 1000 == 999 {
            sampled += drain(&mut ring)
                .iter()
                .filter(|e| e.flags & EVENT_F_SAMPLED != 0)
                .count();
        }
    }
    sampled += drain(&mut ring)
        .iter()
        .filter(|e| e.flags & EVENT_F_SAMPLED != 0)
        .count();
    // Binomial(12800, 1/64): mean 200, sd 14; allow 5 sd.
    assert!((130..=270).contains(&sampled), "{sampled} sampled of {n}");

    // A horizon of 1 ms at 10 kB/s: after the first few packets every one
    // is dropped, and every drop is a record, sampled or not.
    let mut c = telemetry(10_000, 64);
    c.horizon_ns = 1_000_000;
    h.set_config(c);
    let before = h.counts();
    let p = tcp4(9, 0x10);
    let shot = (0..200)
        .filter(|_| h.run(&p.bytes, None).retval == SHOT)
        .count();
    let after = h.counts();
    let moved = after.delta(&before);
    let drops = moved[Counter::HorizonDrop] + moved[Counter::AqmDrop];
    assert_eq!(shot as u64, drops);
    assert!(shot > 150, "{shot}");
    let ev = drain(&mut ring);
    let drop_records = ev.iter().filter(|e| e.verdict >= 3).count();
    assert_eq!(drop_records, shot, "every drop is a record");
    assert!(
        ev.iter()
            .filter(|e| e.verdict == VERDICT_HORIZON_DROP)
            .all(|e| e.delay_ns > 1_000_000)
    );
}

#[test]
fn a_full_ring_loses_records_not_packets() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let _ring = h.events(); // never drained
    // At the highest rate every packet passes at once, so replaying one
    // skb (whose state a pass leaves as it was) gives the same record and
    // verdict each time.
    h.set_config(telemetry(MAX_RATE_BYTES_PER_S, 1));
    let before = h.counts();
    // 4 MiB holds 52,428 80-byte records; send 60,000, a thousand a call.
    let p = udp6(7);
    for _ in 0..60 {
        assert_eq!(h.run_repeated(&p.bytes, 1_000).retval, UNSPEC);
    }
    let d = h.counts().delta(&before);
    let (sent, lost) = (d[Counter::EventsSent], d[Counter::EventsLost]);
    assert_eq!(sent + lost, 60_000);
    assert_eq!(sent, (4 << 20) / 80, "sent {sent}");
    assert_eq!(d[Counter::Packets], 60_000);
    assert_eq!(d[Counter::PassedUnpaced], 60_000, "no packet is held back");
}
