//! The egress classifier's pacing through `BPF_PROG_TEST_RUN`: departure
//! times back to back, the horizon, socket timestamps, GSO wire length.
//! Each test gets the object as a fresh load leaves it; counter checks are
//! exact.
//!
//! Run: `cargo test -p shaper-tests --test prog_test_run_pacing -- --test-threads=1`

use shaper::bpf::test_run::SkBuff;
use shaper_common::{config::DEFAULT_HORIZON_NS, counters::Counter};
use shaper_tests::{
    bpf_harness::*,
    packets::{ETH_HLEN, Frame, Ipv4, Transport},
    skip::{Need, require},
};

// ---------------------------------------------------------------------------
// Pacing
// ---------------------------------------------------------------------------

#[test]
fn pacing_disabled_leaves_tstamp_and_clock_alone() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let (mut config, _) = pacing_at(10_000);
    config.flags = 0;
    h.set_config(config);
    let frame = udp_frame(200);
    for tstamp in [0, 123_456_789, monotonic_ns() + 1_000_000_000] {
        let ctx = SkBuff {
            tstamp,
            ..SkBuff::default()
        };
        let out = h.run_expect(
            "pacing off",
            &frame,
            Some(&ctx),
            PASS,
            &unpaced(frame.len(), &[Counter::Ipv4, Counter::Udp]),
        );
        assert_eq!(out.ctx.tstamp, tstamp, "pacing off must not touch tstamp");
        assert_eq!(out.data, frame, "the classifier never rewrites the packet");
    }
    assert_eq!(h.clock(), 0, "pacing off must not touch the clock");
}

#[test]
fn enabled_flag_with_zero_rate_shift_counts_as_disabled() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let (mut config, _) = pacing_at(10_000);
    config.rate_shift = 0;
    h.set_config(config);
    let frame = udp_frame(100);
    let out = h.run_expect(
        "rate_shift 0",
        &frame,
        None,
        PASS,
        &unpaced(frame.len(), &[Counter::Ipv4, Counter::Udp]),
    );
    assert_eq!(out.ctx.tstamp, 0);
    assert_eq!(h.clock(), 0);
}

#[test]
fn back_to_back_packets_depart_one_transmission_time_apart() {
    if !require(&[Need::Bpf]) {
        return;
    }
    until_judged(
        SLOW_ATTEMPTS,
        "took longer between two runs than a packet's transmission time",
        back_to_back_attempt,
    );
}

/// How many times the back-to-back test tries before it fails: an attempt
/// misses only when the machine stalls between two syscalls for longer than
/// the clock runs ahead (150 ms and more), as a loaded emulated guest can.
const SLOW_ATTEMPTS: u32 = 3;

/// One back-to-back sequence on a fresh load. `None`: a packet reached the
/// program after its expected departure time had already passed, so the
/// attempt judged nothing; every other outcome is asserted.
fn back_to_back_attempt() -> Option<()> {
    let mut h = Harness::load();
    // 80 kbit/s: 100 us per byte. The largest frame goes first, so the clock
    // runs 150 ms ahead of the first syscall's return; the sum stays inside
    // the horizon.
    let (config, rate) = pacing_at(10_000);
    h.set_config(config);
    let lens = [1500usize, 1000, 200, 60, 64];
    let classes = [Counter::Ipv4, Counter::Udp];
    assert!(
        rate.tx_time_ns(lens.iter().sum::<usize>() as u32) < DEFAULT_HORIZON_NS,
        "the sequence fits the horizon"
    );

    // First packet: the clock is idle (0), so it passes unstamped and the
    // clock restarts at now + its transmission time.
    let first = udp_frame(lens[0]);
    let t0 = monotonic_ns();
    let out = h.run_expect(
        "first packet",
        &first,
        None,
        PASS,
        &unpaced(lens[0], &classes),
    );
    let t1 = monotonic_ns();
    assert_eq!(out.ctx.tstamp, 0, "an idle clock must not stamp");
    let tx0 = rate.tx_time_ns(lens[0] as u32);
    let mut clock = h.clock();
    assert!(
        (t0 + tx0..=t1 + tx0).contains(&clock),
        "clock {clock} must be now + {tx0} with now in [{t0}, {t1}]"
    );

    // Later packets: each departs when the previous one's transmission ends.
    for &len in &lens[1..] {
        let frame = udp_frame(len);
        let expected = [
            (Counter::Packets, 1),
            (Counter::Bytes, len as u64),
            (Counter::WireBytes, len as u64),
            (Counter::Paced, 1),
            (Counter::Ipv4, 1),
            (Counter::Udp, 1),
        ];
        let before = h.counts();
        let out = h.run(&frame, None);
        if monotonic_ns() >= clock {
            // The program may have run after the departure time it was to
            // meet: an idle clock then restarts, which is right, but not
            // what this attempt checks.
            return None;
        }
        assert_eq!(out.retval, PASS, "back-to-back packet: verdict");
        assert_counts_moved("back-to-back packet", &before, &h.counts(), &expected);
        assert_eq!(
            out.ctx.tstamp, clock,
            "{len}-byte packet departs at the clock"
        );
        let tx = rate.tx_time_ns(len as u32);
        assert_eq!(
            tx,
            len as u64 * 100_000,
            "10 kB/s is exactly 100 us per byte"
        );
        let next = h.clock();
        assert_eq!(
            next,
            clock + tx,
            "the clock advances by the {len}-byte transmission time"
        );
        clock = next;
    }
    assert!(
        clock - monotonic_ns() < DEFAULT_HORIZON_NS,
        "test stayed inside the horizon"
    );
    Some(())
}

#[test]
fn clock_beyond_horizon_drops_without_advancing() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let (mut config, _) = pacing_at(10_000);
    config.horizon_ns = 1_000_000_000;
    h.set_config(config);
    let frame = udp_frame(100);
    let classes = [
        (Counter::Packets, 1),
        (Counter::Bytes, 100),
        (Counter::WireBytes, 100),
        (Counter::Ipv4, 1),
        (Counter::Udp, 1),
    ];

    // 5 s ahead with a 1 s horizon: drop, clock unchanged, tstamp untouched.
    let far = monotonic_ns() + 5_000_000_000;
    h.set_clock(far);
    let mut expected = classes.to_vec();
    expected.push((Counter::HorizonDrop, 1));
    let out = h.run_expect("beyond horizon", &frame, None, DROP, &expected);
    assert_eq!(out.ctx.tstamp, 0);
    assert_eq!(h.clock(), far, "a drop must not advance the clock");

    // 0.5 s ahead is inside the horizon: paced at the clock.
    let near = monotonic_ns() + 500_000_000;
    h.set_clock(near);
    let mut expected = classes.to_vec();
    expected.push((Counter::Paced, 1));
    let out = h.run_expect("inside horizon", &frame, None, PASS, &expected);
    assert_eq!(out.ctx.tstamp, near);
}

/// Regression: GSO super-packets were charged `skb->len`, one set of
/// headers for many segments, so TCP with GSO got slightly more than the rate.
#[test]
fn gso_packet_is_charged_its_wire_length() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let (config, rate) = pacing_at(1_000_000);
    h.set_config(config);
    let segs = 4u32;
    // Test runs take at most about 3.7 KiB of packet.
    let mss = 800usize;
    // Ethernet + IPv4 + TCP with 12 bytes of options: 66 bytes of headers.
    let headers = ETH_HLEN + 20 + 20 + 12;
    let frame = Frame::ipv4(Ipv4::new(Transport::Tcp {
        options: vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2],
        payload_len: segs as usize * mss,
    }))
    .build()
    .bytes;
    let len = frame.len();
    assert_eq!(len, headers + segs as usize * mss);
    let wire = len as u64 + u64::from(segs - 1) * headers as u64;
    let ctx = SkBuff {
        gso_segs: segs,
        gso_size: mss as u32,
        ..SkBuff::default()
    };
    let near = monotonic_ns() + 100_000_000;
    h.set_clock(near);
    let expected = [
        (Counter::Packets, 1),
        (Counter::Bytes, len as u64),
        (Counter::WireBytes, wire),
        (Counter::Paced, 1),
        (Counter::Ipv4, 1),
        (Counter::Tcp, 1),
    ];
    let out = h.run_expect("gso tcp", &frame, Some(&ctx), PASS, &expected);
    assert_eq!(out.ctx.tstamp, near);
    assert_eq!(
        h.clock(),
        near + rate.tx_time_ns(wire as u32),
        "the clock advances by the wire length, not skb->len"
    );

    // Without GSO the same bytes are charged as they are.
    let plain = udp_frame(600);
    h.set_clock(near);
    let out = h.run_expect(
        "plain udp",
        &plain,
        None,
        PASS,
        &[
            (Counter::Packets, 1),
            (Counter::Bytes, 600),
            (Counter::WireBytes, 600),
            (Counter::Paced, 1),
            (Counter::Ipv4, 1),
            (Counter::Udp, 1),
        ],
    );
    assert_eq!(out.ctx.tstamp, near);
    assert_eq!(h.clock(), near + rate.tx_time_ns(600));
}

#[test]
fn socket_tstamp_later_than_clock_is_kept() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let (config, rate) = pacing_at(10_000);
    h.set_config(config);
    let frame = udp_frame(100);
    let tx = rate.tx_time_ns(100);
    let now = monotonic_ns();
    // The clock is busy 10 ms ahead, but the socket (TCP EDT) asks for 500 ms:
    // the packet keeps its own time and the clock restarts from it.
    h.set_clock(now + 10_000_000);
    let wanted = now + 500_000_000;
    let ctx = SkBuff {
        tstamp: wanted,
        ..SkBuff::default()
    };
    let out = h.run_expect(
        "socket tstamp later than clock",
        &frame,
        Some(&ctx),
        PASS,
        &unpaced(100, &[Counter::Ipv4, Counter::Udp]),
    );
    assert_eq!(
        out.ctx.tstamp, wanted,
        "a later socket timestamp must be kept"
    );
    assert_eq!(h.clock(), wanted + tx);
}

#[test]
fn socket_tstamp_earlier_than_clock_is_paced_to_clock() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let (config, rate) = pacing_at(10_000);
    h.set_config(config);
    let frame = udp_frame(100);
    let now = monotonic_ns();
    let clock = now + 100_000_000;
    h.set_clock(clock);
    let ctx = SkBuff {
        tstamp: now + 10_000_000,
        ..SkBuff::default()
    };
    let expected = [
        (Counter::Packets, 1),
        (Counter::Bytes, 100),
        (Counter::WireBytes, 100),
        (Counter::Paced, 1),
        (Counter::Ipv4, 1),
        (Counter::Udp, 1),
    ];
    let out = h.run_expect(
        "socket tstamp earlier than clock",
        &frame,
        Some(&ctx),
        PASS,
        &expected,
    );
    assert_eq!(
        out.ctx.tstamp, clock,
        "an earlier socket timestamp is pushed to the clock"
    );
    assert_eq!(h.clock(), clock + rate.tx_time_ns(100));
}

#[test]
fn truncated_and_non_ip_frames_are_paced_too() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let (config, rate) = pacing_at(10_000);
    h.set_config(config);
    let clock = monotonic_ns() + 100_000_000;
    h.set_clock(clock);
    let arp = Frame::arp().build();
    let out = h.run_expect(
        "arp while busy",
        &arp.bytes,
        None,
        PASS,
        &[
            (Counter::Packets, 1),
            (Counter::Bytes, 42),
            (Counter::WireBytes, 42),
            (Counter::Paced, 1),
            (Counter::NonIp, 1),
        ],
    );
    assert_eq!(out.ctx.tstamp, clock);
    // Cut inside the TCP header: 14 + 20 + 10 bytes.
    let cut = Frame::ipv4(Ipv4::new(Transport::tcp()))
        .build()
        .truncated(44);
    let out = h.run_expect(
        "truncated while busy",
        &cut,
        None,
        PASS,
        &[
            (Counter::Packets, 1),
            (Counter::Bytes, 44),
            (Counter::WireBytes, 44),
            (Counter::Paced, 1),
            (Counter::Truncated, 1),
        ],
    );
    assert_eq!(out.ctx.tstamp, clock + rate.tx_time_ns(42));
}

/// With a framing set, the classifier charges what the link carries: a
/// small packet its ATM cells, a GSO packet each segment's cells, and on
/// PTM a small and a full packet their overhead and the extra byte per 64.
/// Each differs from the raw length, so a program that ignored the framing
/// or one of its modes fails here.
#[test]
fn framing_charges_the_links_bytes_per_segment() {
    if !require(&[Need::Bpf]) {
        return;
    }
    use shaper_common::framing::Framing;
    let mut h = Harness::load();
    let (mut config, rate) = pacing_at(1_000_000);
    config.framing = Framing::from_keywords(["pppoe-llcsnap"], None, None).expect("framing");
    let framing = config.framing;
    h.set_config(config);

    // 100 bytes of frame: 86 of IP + 40 = 126, three cells.
    let small = udp_frame(100);
    let framed = framing.frame_len(small.len() as u32, ETH_HLEN as u32);
    assert_eq!(framed, 3 * 53);
    let near = monotonic_ns() + 100_000_000;
    h.set_clock(near);
    h.run_expect(
        "small udp, ATM cells",
        &small,
        None,
        PASS,
        &[
            (Counter::Packets, 1),
            (Counter::Bytes, small.len() as u64),
            (Counter::WireBytes, u64::from(framed)),
            (Counter::Paced, 1),
            (Counter::Ipv4, 1),
            (Counter::Udp, 1),
        ],
    );
    assert_eq!(h.clock(), near + rate.tx_time_ns(framed));

    let (segs, mss) = (4u32, 800usize);
    let headers = ETH_HLEN + 20 + 20 + 12;
    let frame = Frame::ipv4(Ipv4::new(Transport::Tcp {
        options: vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2],
        payload_len: segs as usize * mss,
    }))
    .build()
    .bytes;
    let per_segment = framing.frame_len((headers + mss) as u32, ETH_HLEN as u32);
    let wire = u64::from(segs * per_segment);
    assert!(
        wire > u64::from(framing.frame_len(frame.len() as u32, ETH_HLEN as u32)),
        "the segments' cells exceed the whole packet's"
    );
    let ctx = SkBuff {
        gso_segs: segs,
        gso_size: mss as u32,
        ..SkBuff::default()
    };
    h.set_clock(near);
    let before = h.counts();
    let out = h.run(&frame, Some(&ctx));
    assert_eq!(out.retval, PASS);
    assert_eq!(h.counts().delta(&before)[Counter::WireBytes], wire);
    assert_eq!(h.clock(), near + rate.tx_time_ns(wire as u32));

    // PTM with PPPoE: 30 bytes from the IP packet, then one byte per 64 or
    // part. 92 bytes of IP cost 122 + 2; 1500 cost 1530 + 24.
    config.framing = Framing::from_keywords(["pppoe-ptm"], None, None).expect("framing");
    let ptm = config.framing;
    h.set_config(config);
    for (frame, expected) in [(udp_frame(106), 124u32), (udp_frame(1514), 1554)] {
        let framed = ptm.frame_len(frame.len() as u32, ETH_HLEN as u32);
        assert_eq!(framed, expected, "a {}-byte frame on PTM", frame.len());
        h.set_clock(near);
        let before = h.counts();
        let out = h.run(&frame, None);
        assert_eq!(out.retval, PASS);
        assert_eq!(
            h.counts().delta(&before)[Counter::WireBytes],
            u64::from(framed),
            "a {}-byte frame on PTM",
            frame.len()
        );
        assert_eq!(h.clock(), near + rate.tx_time_ns(framed));
    }
}
