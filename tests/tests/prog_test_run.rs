//! The egress classifier on synthetic frames, through `BPF_PROG_TEST_RUN`:
//! verdicts, class counters, pacing timestamps and horizon drops, before any
//! real traffic.
//!
//! Each test gets the embedded object as a fresh load leaves it (the
//! harness shares one load per process and resets every map between
//! tests; the last test here checks that reset), so its maps start at zero
//! and no test sees another's state. Counter checks are exact: a run
//! must raise the named counters by the named amounts and leave every other
//! counter alone.
//!
//! Needs root (CAP_BPF and CAP_NET_ADMIN) and a kernel >= 5.18 (`Need::Bpf`:
//! a skip with the reason on the host, a failure in the VM). A missing BPF
//! object is a build mistake, not a skip: the tests panic and say how to
//! build it.
//!
//! Run: `cargo test -p shaper-tests --test prog_test_run -- --test-threads=1`
//! (pacing: `--test prog_test_run_pacing`).

use std::{ops::Range, os::fd::AsFd};

use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use shaper::bpf::test_run::{MIN_PACKET_LEN, SkBuff, run_skb};
use shaper_common::{
    EGRESS_PROGRAM,
    config::{FLAG_TELEMETRY, sample_threshold},
    counters::Counter,
    police::LinkState,
};
use shaper_tests::bpf_harness::*;
use shaper_tests::packets::{
    ETH_HLEN, ExtHeader, Frame, Ipv4, Ipv6, Packet, Tpid, Transport, ipproto, udp4_ecn,
};
use shaper_tests::skip::{Need, require};

// ---------------------------------------------------------------------------
// Classification
// ---------------------------------------------------------------------------

/// One classification case: a frame and the class counters it must raise.
struct Case {
    name: &'static str,
    frame: Vec<u8>,
    classes: &'static [Counter],
}

fn case(name: &'static str, frame: Vec<u8>, classes: &'static [Counter]) -> Case {
    Case {
        name,
        frame,
        classes,
    }
}

/// IPv4 over Ethernet carrying `t`.
fn v4(t: Transport) -> Frame {
    Frame::ipv4(Ipv4::new(t))
}

/// IPv6 over Ethernet carrying `t`.
fn v6(t: Transport) -> Frame {
    Frame::ipv6(Ipv6::new(t))
}

fn l4(p: &Packet) -> Range<usize> {
    p.layout.l4.clone().expect("frame has a transport header")
}

fn classification_cases() -> Vec<Case> {
    use Counter::{Icmp, Ipv4 as V4, Ipv6 as V6, NonIp, OtherIp, Tcp, Udp, Vlan};
    use Tpid::{Dot1Ad, Dot1Q};
    let gre = || Transport::other(ipproto::GRE, 24);
    let hbh = |len_8| ExtHeader::HopByHop { len_8 };
    let dst = |len_8| ExtHeader::DestOpts { len_8 };
    let tcp_bare = Transport::Tcp {
        options: vec![],
        payload_len: 0,
    };
    let icmp = v4(Transport::icmp()).build();
    let icmp_4_bytes = icmp.truncated(l4(&icmp).start + 4);
    // A non-first fragment carries no transport header: the few bytes after
    // the IP header must not count as a truncated TCP or UDP header.
    let frag4_tcp = Ipv4::new(Transport::other(ipproto::TCP, 4)).fragment(185, false);
    let frag4_udp = Ipv4::new(Transport::other(ipproto::UDP, 2))
        .options(&[0x94, 4, 0, 0])
        .fragment(1, true);
    let frag6_udp =
        Ipv6::new(Transport::other(ipproto::UDP, 3)).ext(ExtHeader::fragment(100, false));
    let four_ext = Ipv6::new(Transport::tcp_syn_options())
        .ext(hbh(0))
        .ext(dst(1))
        .ext(ExtHeader::Routing)
        .ext(ExtHeader::fragment(0, true));
    // The parser follows at most four extension headers: the fifth header's
    // number is taken as the transport protocol (the documented limit).
    let five_ext = Ipv6::new(Transport::tcp())
        .ext(hbh(0))
        .ext(dst(0))
        .ext(ExtHeader::Routing)
        .ext(dst(0))
        .ext(ExtHeader::fragment(0, false));
    // Only two tags are stripped: a third tag's TPID is taken as the ethertype.
    let three_tags = v4(Transport::tcp())
        .vlan(Dot1Ad, 1)
        .vlan(Dot1Q, 2)
        .vlan(Dot1Q, 3);
    let c = |name, frame: Frame, classes| case(name, frame.build().bytes, classes);
    vec![
        c("ipv4 tcp", v4(Transport::tcp()), &[V4, Tcp]),
        c(
            "ipv4 tcp options",
            v4(Transport::tcp_syn_options()),
            &[V4, Tcp],
        ),
        c("ipv4 udp", v4(Transport::udp()), &[V4, Udp]),
        c("ipv4 icmp", v4(Transport::icmp()), &[V4, Icmp]),
        c("ipv4 gre", v4(gre()), &[V4, OtherIp]),
        c("ipv6 tcp", v6(Transport::tcp()), &[V6, Tcp]),
        c(
            "ipv6 tcp options",
            v6(Transport::tcp_syn_options()),
            &[V6, Tcp],
        ),
        c("ipv6 udp", v6(Transport::udp()), &[V6, Udp]),
        c("ipv6 icmpv6", v6(Transport::icmpv6()), &[V6, Icmp]),
        c("ipv6 gre", v6(gre()), &[V6, OtherIp]),
        c("arp", Frame::arp(), &[NonIp]),
        c("arp padded to 60", Frame::arp().pad_to(60), &[NonIp]),
        c("lldp", Frame::lldp(), &[NonIp]),
        c(
            "802.1Q ipv4 tcp",
            v4(Transport::tcp()).vlan(Dot1Q, 10),
            &[Vlan, V4, Tcp],
        ),
        c(
            "802.1ad ipv6 udp",
            v6(Transport::udp()).vlan(Dot1Ad, 20),
            &[Vlan, V6, Udp],
        ),
        c(
            "802.1ad+802.1Q ipv4 udp",
            v4(Transport::udp()).vlan(Dot1Ad, 100).vlan(Dot1Q, 200),
            &[Vlan, V4, Udp],
        ),
        c(
            "802.1Q+802.1Q ipv6 icmpv6",
            v6(Transport::icmpv6()).vlan(Dot1Q, 1).vlan(Dot1Q, 2),
            &[Vlan, V6, Icmp],
        ),
        c("802.1Q arp", Frame::arp().vlan(Dot1Q, 5), &[Vlan, NonIp]),
        c("three tags: non-ip", three_tags, &[Vlan, NonIp]),
        c(
            "ipv4 router-alert option, tcp",
            Frame::ipv4(Ipv4::new(Transport::tcp()).options(&[0x94, 4, 0, 0])),
            &[V4, Tcp],
        ),
        c(
            "ipv4 40 bytes of options, udp",
            Frame::ipv4(Ipv4::new(Transport::udp()).options(&[1; 40])),
            &[V4, Udp],
        ),
        c(
            "ipv4 first fragment (MF), tcp",
            Frame::ipv4(Ipv4::new(Transport::tcp()).fragment(0, true)),
            &[V4, Tcp],
        ),
        c(
            "ipv4 non-first fragment, tcp",
            Frame::ipv4(frag4_tcp),
            &[V4, Tcp],
        ),
        c(
            "ipv4 non-first fragment + options, udp",
            Frame::ipv4(frag4_udp),
            &[V4, Udp],
        ),
        c(
            "ipv6 hop-by-hop, tcp",
            Frame::ipv6(Ipv6::new(Transport::tcp()).ext(hbh(0))),
            &[V6, Tcp],
        ),
        c(
            "ipv6 dest opts (24 bytes) + routing, udp",
            Frame::ipv6(
                Ipv6::new(Transport::udp())
                    .ext(dst(2))
                    .ext(ExtHeader::Routing),
            ),
            &[V6, Udp],
        ),
        c(
            "ipv6 first fragment, udp",
            Frame::ipv6(Ipv6::new(Transport::udp()).ext(ExtHeader::fragment(0, true))),
            &[V6, Udp],
        ),
        c(
            "ipv6 non-first fragment, udp",
            Frame::ipv6(frag6_udp),
            &[V6, Udp],
        ),
        c(
            "ipv6 four ext headers, tcp",
            Frame::ipv6(four_ext),
            &[V6, Tcp],
        ),
        c(
            "ipv6 five ext headers: other ip",
            Frame::ipv6(five_ext),
            &[V6, OtherIp],
        ),
        // Boundaries: a header ending exactly at the end of the frame is whole.
        c("ipv4 tcp header, no payload", v4(tcp_bare), &[V4, Tcp]),
        case("ipv4 icmp, first 4 bytes only", icmp_4_bytes, &[V4, Icmp]),
    ]
}

/// Frames cut inside each header the parser reads. Cuts inside the IPv4 or
/// IPv6 base header go behind a VLAN tag: this kernel refuses untagged IP
/// frames too short for their base header before the program runs (see
/// `kernel_refuses_untagged_ip_frames_shorter_than_the_ip_header`), while a
/// tag makes `skb->protocol` 0x8100 and the frame reaches the same parser code.
fn truncation_cases() -> Vec<Case> {
    let tcp4 = v4(Transport::tcp()).build();
    let tcp4_opts = v4(Transport::tcp_syn_options()).build();
    let udp4 = v4(Transport::udp()).build();
    let icmp4 = v4(Transport::icmp()).build();
    let opts4 = Frame::ipv4(Ipv4::new(Transport::tcp()).options(&[1, 1, 1, 1, 0x94, 4, 0, 0]));
    let opts4 = opts4.build();
    let tcp6 = v6(Transport::tcp()).build();
    let udp6 = v6(Transport::udp()).build();
    let icmp6 = v6(Transport::icmpv6()).build();
    let hbh6 = Frame::ipv6(Ipv6::new(Transport::tcp()).ext(ExtHeader::HopByHop { len_8: 1 }));
    let hbh6 = hbh6.build();
    let frag6 = Frame::ipv6(Ipv6::new(Transport::udp()).ext(ExtHeader::fragment(0, true)));
    let frag6 = frag6.build();
    let tagged4 = v4(Transport::tcp()).vlan(Tpid::Dot1Q, 7).build();
    let tagged6 = v6(Transport::tcp()).vlan(Tpid::Dot1Ad, 9).build();
    let qinq6 = v6(Transport::udp())
        .vlan(Tpid::Dot1Ad, 7)
        .vlan(Tpid::Dot1Q, 8)
        .build();
    let l3 = |p: &Packet| p.layout.l3.clone();
    let ext = |p: &Packet| p.layout.ext_headers[0].clone();
    let ip_opt = |p: &Packet| p.layout.ip_options.clone().expect("ip options");
    let tcp_opt = |p: &Packet| p.layout.l4_options.clone().expect("tcp options");
    // (name, frame, cut at)
    let cuts = [
        ("802.1Q ipv4: no header byte", &tagged4, l3(&tagged4).start),
        (
            "802.1Q ipv4 header: 10 of 20",
            &tagged4,
            l3(&tagged4).start + 10,
        ),
        (
            "802.1Q ipv4 header: 19 of 20",
            &tagged4,
            l3(&tagged4).end - 1,
        ),
        ("ipv4 options: 4 of 8", &opts4, ip_opt(&opts4).start + 4),
        ("ipv4 options: 7 of 8", &opts4, ip_opt(&opts4).end - 1),
        ("ipv4 tcp: no header byte", &tcp4, l4(&tcp4).start),
        ("ipv4 tcp header: 10 of 20", &tcp4, l4(&tcp4).start + 10),
        ("ipv4 tcp header: 19 of 20", &tcp4, l4(&tcp4).start + 19),
        (
            "ipv4 tcp options: 10 of 20",
            &tcp4_opts,
            tcp_opt(&tcp4_opts).start + 10,
        ),
        (
            "ipv4 tcp options: 19 of 20",
            &tcp4_opts,
            tcp_opt(&tcp4_opts).end - 1,
        ),
        ("ipv4 udp header: 4 of 8", &udp4, l4(&udp4).start + 4),
        ("ipv4 udp header: 7 of 8", &udp4, l4(&udp4).start + 7),
        ("ipv4 icmp header: 2 of 4", &icmp4, l4(&icmp4).start + 2),
        ("ipv4 icmp header: 3 of 4", &icmp4, l4(&icmp4).start + 3),
        ("802.1ad ipv6: no header byte", &tagged6, l3(&tagged6).start),
        (
            "802.1ad ipv6 header: 20 of 40",
            &tagged6,
            l3(&tagged6).start + 20,
        ),
        (
            "802.1ad ipv6 header: 39 of 40",
            &tagged6,
            l3(&tagged6).end - 1,
        ),
        ("ipv6 tcp: no header byte", &tcp6, l4(&tcp6).start),
        ("ipv6 tcp header: 19 of 20", &tcp6, l4(&tcp6).start + 19),
        ("ipv6 udp header: 7 of 8", &udp6, l4(&udp6).start + 7),
        ("ipv6 icmpv6 header: 3 of 4", &icmp6, l4(&icmp6).start + 3),
        (
            "ipv6 ext header: next-header byte only",
            &hbh6,
            ext(&hbh6).start + 1,
        ),
        ("ipv6 ext header: 8 of 16", &hbh6, ext(&hbh6).start + 8),
        ("ipv6 ext header: 15 of 16", &hbh6, ext(&hbh6).end - 1),
        (
            "ipv6 fragment header: 3 of 8",
            &frag6,
            ext(&frag6).start + 3,
        ),
        ("vlan tag: TPID only", &tagged4, ETH_HLEN),
        ("vlan tag: no inner ethertype", &tagged4, ETH_HLEN + 2),
        ("vlan tag: half an inner ethertype", &tagged4, ETH_HLEN + 3),
        ("second vlan tag: no inner ethertype", &qinq6, ETH_HLEN + 6),
    ];
    cuts.into_iter()
        .map(|(name, p, at)| case(name, p.truncated(at), &[Counter::Truncated]))
        .collect()
}

#[test]
fn each_class_gets_its_verdict_and_exactly_its_counters() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let h = Harness::load();
    // Pacing off (config all zero): every frame passes unpaced.
    let cases = classification_cases();
    for c in &cases {
        h.run_expect(
            c.name,
            &c.frame,
            None,
            PASS,
            &unpaced(c.frame.len(), c.classes),
        );
    }
    eprintln!("checked {} classification cases", cases.len());
}

#[test]
fn frames_cut_inside_each_header_count_as_truncated() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let h = Harness::load();
    let cases = truncation_cases();
    for c in &cases {
        assert!(
            c.frame.len() >= MIN_PACKET_LEN,
            "{}: shorter than the kernel accepts",
            c.name
        );
        h.run_expect(
            c.name,
            &c.frame,
            None,
            PASS,
            &unpaced(c.frame.len(), c.classes),
        );
    }
    eprintln!("checked {} truncation cases", cases.len());
}

#[test]
fn kernel_refuses_frames_shorter_than_an_ethernet_header() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let h = Harness::load();
    let frame = Frame::lldp().build();
    for len in 0..MIN_PACKET_LEN {
        let before = h.counts();
        let err = run_skb(h.prog.as_fd(), &frame.truncated(len), None, 1)
            .expect_err("the kernel must refuse a frame without a whole Ethernet header");
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{len} bytes: {err}");
        // The program never ran.
        assert_counts_moved(&format!("{len}-byte frame"), &before, &h.counts(), &[]);
    }
    // Exactly an Ethernet header is accepted, and classified by its ethertype.
    h.run_expect(
        "14-byte lldp frame",
        &frame.truncated(MIN_PACKET_LEN),
        None,
        PASS,
        &unpaced(MIN_PACKET_LEN, &[Counter::NonIp]),
    );
}

/// Regression: the IPv6 parser kept walking extension headers after a
/// non-first fragment header. In a non-first fragment the fragment header's
/// Next Header names the first header of the fragmentable part, which only
/// the first fragment carries (RFC 8200, 4.5); what follows is payload. The
/// parser read payload bytes as an extension header, so a short fragment
/// counted as truncated and a payload starting with 6 or 17 counted as TCP
/// or UDP.
#[test]
fn ipv6_non_first_fragment_is_not_parsed_into_its_payload() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let h = Harness::load();
    use Counter::{Ipv6 as V6, OtherIp};
    for (payload, what) in [
        (vec![0x00], "1 payload byte"),
        (
            vec![ipproto::TCP, 0, 0, 0, 0, 0, 0, 0],
            "payload starting like a TCP header",
        ),
        (
            vec![ipproto::UDP, 0, 0, 0, 0, 0, 0, 0],
            "payload starting like a UDP header",
        ),
    ] {
        let ip = Ipv6::new(Transport::other(ipproto::DSTOPTS, payload.len()))
            .ext(ExtHeader::fragment(100, false));
        let mut p = Frame::ipv6(ip).build();
        let at = p.layout.ext_headers[0].end;
        p.bytes[at..at + payload.len()].copy_from_slice(&payload);
        let name = format!("non-first fragment naming dest opts, {what}");
        h.run_expect(
            &name,
            &p.bytes,
            None,
            PASS,
            &unpaced(p.len(), &[V6, OtherIp]),
        );
    }
}

/// Header lengths below the minimum (IPv4 IHL < 5, TCP data offset < 5) make
/// the frame unparsable; the classifier counts it as truncated, not as a
/// class it cannot vouch for.
#[test]
fn header_lengths_below_the_minimum_count_as_truncated() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let h = Harness::load();
    let mut ihl4 = v4(Transport::tcp()).build();
    let l3 = ihl4.layout.l3.start;
    ihl4.bytes[l3] = 0x44;
    let mut doff4 = v4(Transport::tcp()).build();
    let l4_start = l4(&doff4).start;
    doff4.bytes[l4_start + 12] = 4 << 4;
    let mut doff0 = v6(Transport::tcp()).build();
    let l4_start = l4(&doff0).start;
    doff0.bytes[l4_start + 12] = 0;
    for (name, p) in [
        ("ipv4 ihl 4", ihl4),
        ("tcp doff 4", doff4),
        ("tcp doff 0", doff0),
    ] {
        let want = unpaced(p.len(), &[Counter::Truncated]);
        h.run_expect(name, &p.bytes, None, PASS, &want);
    }
}

/// Observed on 6.18: `BPF_PROG_TEST_RUN` refuses (EINVAL) an untagged IPv4
/// frame shorter than 14 + 20 bytes and an IPv6 frame shorter than 14 + 40,
/// so the classifier's checks for those cuts are reached behind a VLAN tag
/// (see `truncation_cases`). A kernel without that check must run the
/// program and count the frame as truncated; each length gets exactly one of
/// the two outcomes.
#[test]
fn kernel_refuses_untagged_ip_frames_shorter_than_the_ip_header() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let h = Harness::load();
    let mut refused = Vec::new();
    for (p, ip_end) in [
        (v4(Transport::tcp()).build(), ETH_HLEN + 20),
        (v6(Transport::tcp()).build(), ETH_HLEN + 40),
    ] {
        for len in ETH_HLEN..ip_end {
            let before = h.counts();
            match run_skb(h.prog.as_fd(), &p.truncated(len), None, 1) {
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{len} bytes: {e}");
                    assert_counts_moved(&format!("refused {len}"), &before, &h.counts(), &[]);
                    refused.push(len);
                }
                Ok(out) => {
                    assert_eq!(out.retval, PASS, "{len} bytes");
                    let want = unpaced(len, &[Counter::Truncated]);
                    assert_counts_moved(&format!("{len} bytes"), &before, &h.counts(), &want);
                }
            }
        }
        // A whole base header is accepted; the transport header is cut.
        let want = unpaced(ip_end, &[Counter::Truncated]);
        h.run_expect("whole ip header", &p.truncated(ip_end), None, PASS, &want);
    }
    eprintln!(
        "kernel refused {} of 60 short untagged ip frames: {refused:?}",
        refused.len()
    );
}

// ---------------------------------------------------------------------------
// The wrapper itself
// ---------------------------------------------------------------------------

#[test]
fn ctx_fields_round_trip_through_the_kernel() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let h = Harness::load();
    let frame = udp_frame(100);
    let ctx = SkBuff {
        mark: 0x5a,
        priority: 0x10002,
        cb: [1, 2, 3, 4, 5],
        tstamp: 77,
        ..SkBuff::default()
    };
    let out = h.run(&frame, Some(&ctx));
    assert_eq!(out.ctx.mark, 0x5a);
    assert_eq!(out.ctx.priority, 0x10002);
    assert_eq!(out.ctx.cb, [1, 2, 3, 4, 5]);
    assert_eq!(out.ctx.tstamp, 77);
    assert_eq!(out.ctx.ifindex, 1, "the test skb lives on loopback");
    assert_eq!(
        out.ctx.wire_len, 100,
        "wire_len defaults to the packet length"
    );
    assert_eq!(out.data, frame);
}

#[test]
fn ctx_with_output_only_fields_is_refused_and_named() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let h = Harness::load();
    let ctx = SkBuff {
        len: 100,
        protocol: 8,
        ..SkBuff::default()
    };
    let before = h.counts();
    let err = run_skb(h.prog.as_fd(), &udp_frame(100), Some(&ctx), 1).expect_err("EINVAL");
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    assert!(
        err.to_string().ends_with("this ctx sets len, protocol"),
        "{err}"
    );
    assert_counts_moved("refused ctx", &before, &h.counts(), &[]);
}

#[test]
fn ctx_ifindex_of_a_missing_device_is_enodev() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let h = Harness::load();
    let ctx = SkBuff {
        ifindex: 0x7fff_fff0,
        ..SkBuff::default()
    };
    let err = run_skb(h.prog.as_fd(), &udp_frame(100), Some(&ctx), 1).expect_err("ENODEV");
    assert_eq!(err.raw_os_error(), Some(libc::ENODEV), "{err}");
    assert!(err.to_string().contains("ifindex"), "{err}");
}

#[test]
fn wrapper_agrees_with_aya_test_run() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let (config, _) = pacing_at(10_000);
    h.set_config(config);
    let clock = monotonic_ns() + 100_000_000;
    let frame = udp_frame(100);
    let ctx_in = SkBuff {
        tstamp: 5,
        ..SkBuff::default()
    };

    h.set_clock(clock);
    let ours = h.run(&frame, Some(&ctx_in));

    h.set_clock(clock);
    let prog: &SchedClassifier = h
        .ebpf
        .program(EGRESS_PROGRAM)
        .expect("program")
        .try_into()
        .expect("classifier");
    // SAFETY (of the byte views): SkBuff is repr(C), integers only, with the
    // hole spelled out as a field, so every byte is initialised.
    let as_bytes = |s: &SkBuff| -> Vec<u8> {
        let p = s as *const SkBuff as *const u8;
        // SAFETY: see above; the slice covers exactly the struct.
        unsafe { std::slice::from_raw_parts(p, size_of::<SkBuff>()) }.to_vec()
    };
    let ctx_bytes = as_bytes(&ctx_in);
    let mut ctx_out = vec![0u8; size_of::<SkBuff>()];
    let mut data_out = vec![0u8; frame.len() + 64];
    let theirs = prog
        .test_run(TestRunOptions {
            data_in: Some(&frame),
            data_out: Some(&mut data_out),
            ctx_in: Some(&ctx_bytes),
            ctx_out: Some(&mut ctx_out),
            ..TestRunOptions::default()
        })
        .expect("aya test_run");
    assert_eq!(theirs.return_value as i32, ours.retval);
    assert_eq!(theirs.data_size_out as usize, ours.data.len());
    assert_eq!(&data_out[..ours.data.len()], &ours.data[..]);
    assert_eq!(ctx_out, as_bytes(&ours.ctx), "ctx_out differs");
    assert_eq!(ours.ctx.tstamp, clock);
}

#[test]
fn per_packet_cost_with_repeat_1000() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let mut h = Harness::load();
    let frame = Frame::ipv4(Ipv4::new(Transport::tcp())).build().bytes;
    let repeat = 1000u32;
    let mut report = Vec::new();
    for (label, config) in [
        ("counting only", None),
        // 1 Tbit/s: the clock moves 0.5 ns per packet, never near the horizon.
        ("pacing at 1 Tbit/s", Some(pacing_at(125_000_000_000).0)),
    ] {
        if let Some(c) = config {
            h.set_config(c);
        }
        let before = h.counts();
        let out = run_skb(h.prog.as_fd(), &frame, None, repeat).expect("repeated run");
        assert_eq!(out.retval, PASS);
        let after = h.counts();
        let n = u64::from(repeat);
        assert_eq!(after.delta(&before)[Counter::Packets], n);
        assert_eq!(after.delta(&before)[Counter::Bytes], n * frame.len() as u64);
        assert!(out.duration_ns > 0, "the kernel measured nothing");
        report.push(format!("{label}: {} ns/packet", out.duration_ns));
    }
    eprintln!(
        "{}-byte ipv4/tcp frame, repeat {repeat}: {}",
        frame.len(),
        report.join(", ")
    );
}

// ---------------------------------------------------------------------------
// The harness itself
// ---------------------------------------------------------------------------

/// Runs fair-paced, sampled packets of `flows` flows through `h`.
fn dirty(h: &mut Harness, flows: u16) {
    let (mut config, _) = fair_at(10_000);
    config.flags |= FLAG_TELEMETRY;
    config.sample_threshold = sample_threshold(1);
    h.set_config(config);
    for port in 0..flows {
        let p = udp4_ecn(4000 + port, 0);
        for _ in 0..3 {
            h.run(&p.bytes, None);
        }
    }
}

#[test]
fn a_reused_object_is_as_fresh_as_a_new_load() {
    if !require(&[Need::Bpf]) {
        return;
    }
    let fresh = Harness::load_fresh(EGRESS_PROGRAM);
    let clean = fresh.map_contents();
    let mut h = Harness::load();
    let id = h.config_map_id();
    assert_ne!(id, fresh.config_map_id(), "load_fresh shared an object");
    dirty(&mut h, 8);
    // The fair pacer leaves the aggregate clock and the policer's link
    // alone; the test writes them itself.
    h.set_clock(1);
    h.police_link
        .set(
            0,
            LinkState {
                t_link_ns: 1,
                ..LinkState::default()
            },
            0,
        )
        .expect("write SHAPER_POLICE_LINK");
    // Every map a program or a test writes now differs from a new load's:
    // the comparison below can see a reset that missed one.
    let dirtied = h.map_contents();
    for (name, bytes) in &dirtied {
        let new = &clean.iter().find(|(n, _)| n == name).expect("same maps").1;
        let written = [
            "SHAPER_CONFIG",
            "SHAPER_COUNTERS",
            "SHAPER_AGG",
            "SHAPER_FAIR",
            "SHAPER_FLOWS",
            "SHAPER_EVENTS",
            "SHAPER_POLICE_LINK",
        ];
        if written.contains(&name.as_str()) {
            assert_ne!(bytes, new, "{name} was not written by the test");
        }
    }
    // Reading the ring drained it: fill it again for the reset to drain.
    dirty(&mut h, 4);
    drop(h);
    let again = Harness::load();
    assert_eq!(again.config_map_id(), id, "the object was not reused");
    let reused = again.map_contents();
    assert_eq!(
        reused.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        clean.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for ((name, got), (_, want)) in reused.iter().zip(&clean) {
        assert!(
            got == want,
            "{name} after a reset differs from a new load: {:?}",
            got.iter()
                .zip(want)
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .take(16)
                .collect::<Vec<_>>()
        );
    }
}
