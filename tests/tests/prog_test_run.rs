//! The egress classifier on synthetic frames, through `BPF_PROG_TEST_RUN`:
//! verdicts, class counters, pacing timestamps and horizon drops, before any
//! real traffic.
//!
//! Each test loads a fresh copy of the embedded object, so its maps start at
//! zero and no test sees another's state. Counter checks are exact: a run
//! must raise the named counters by the named amounts and leave every other
//! counter alone.
//!
//! Needs root (CAP_BPF and CAP_NET_ADMIN) and a kernel >= 5.18; otherwise
//! each test prints `skipped: <reason>` and passes. A missing BPF object is a
//! build mistake, not a skip: the tests panic and say how to build it.
//!
//! Run: `cargo test -p shaper-tests --test prog_test_run -- --test-threads=1`

use std::{collections::BTreeMap, ops::Range, os::fd::AsFd};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData, PerCpuArray},
    programs::{ProgramFd, SchedClassifier, TestRun, TestRunOptions},
    util::KernelVersion,
};
use shaper::bpf::test_run::{MIN_PACKET_LEN, SkBuff, TestRunOutput, run_skb};
use shaper_common::{
    EGRESS_PROGRAM,
    config::{AggregateState, DEFAULT_HORIZON_NS, PacerConfig},
    counters::Counter,
    maps,
    rate::ScaledRate,
};
use shaper_tests::packets::{
    ETH_HLEN, ExtHeader, Frame, Ipv4, Ipv6, Packet, Tpid, Transport, ipproto,
};

/// `TC_ACT_UNSPEC`: pass on to the next program / the qdisc.
const PASS: i32 = -1;
/// `TC_ACT_SHOT`: drop.
const DROP: i32 = 2;

/// Oldest kernel these tests are written for: the 192-byte `__sk_buff` that
/// `SkBuff` mirrors (with `tstamp_type`).
const MIN_KERNEL: KernelVersion = KernelVersion::new(5, 18, 0);

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// Why this machine cannot run the tests, if it cannot.
fn skip_reason() -> Option<String> {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_BPF: u32 = 39;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| cap_eff & (1 << cap) != 0;
    let bpf = has(CAP_BPF) || has(CAP_SYS_ADMIN);
    let net_admin = has(CAP_NET_ADMIN) || has(CAP_SYS_ADMIN);
    if !(bpf && net_admin) {
        return Some(format!(
            "loading a SCHED_CLS program needs root, or CAP_BPF and CAP_NET_ADMIN \
             (effective capabilities: {cap_eff:#x})"
        ));
    }
    match KernelVersion::current() {
        Ok(v) if v < MIN_KERNEL => Some(format!("kernel {v} is older than {MIN_KERNEL}")),
        Ok(_) => None,
        Err(e) => Some(format!("cannot read the kernel version: {e}")),
    }
}

/// A fresh copy of the classifier and its maps.
struct Harness {
    ebpf: Ebpf,
    prog: ProgramFd,
    config: Array<MapData, PacerConfig>,
    counters: PerCpuArray<MapData, u64>,
    agg: Array<MapData, AggregateState>,
}

/// Counter values summed over CPUs, indexed by `Counter`.
type Counts = [u64; Counter::COUNT as usize];

impl Harness {
    /// Loads the classifier, or returns None after printing why the machine
    /// cannot run it. The config starts disabled (all zero).
    fn load() -> Option<Self> {
        if let Some(reason) = skip_reason() {
            eprintln!("skipped: {reason}");
            return None;
        }
        let object = shaper::bpf::object().unwrap_or_else(|e| {
            panic!(
                "{e}. For this test: build the object (RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
                 cargo build -p shaper-ebpf --release --target bpfel-unknown-none \
                 -Z build-std=core --target-dir target/bpf), then rerun"
            )
        });
        let mut ebpf = EbpfLoader::new().load(object).expect("load the BPF object");
        let prog: &mut SchedClassifier = ebpf
            .program_mut(EGRESS_PROGRAM)
            .unwrap_or_else(|| panic!("no program {EGRESS_PROGRAM} in the object"))
            .try_into()
            .expect("shaper_egress is a classifier");
        prog.load()
            .unwrap_or_else(|e| panic!("loading {EGRESS_PROGRAM} (verifier log inside): {e:#?}"));
        let prog = prog
            .fd()
            .expect("loaded")
            .try_clone()
            .expect("dup program fd");
        let take = |ebpf: &mut Ebpf, name: &str| {
            ebpf.take_map(name)
                .unwrap_or_else(|| panic!("no map {name} in the object"))
        };
        let config = Array::try_from(take(&mut ebpf, maps::CONFIG)).expect("config map type");
        let counters =
            PerCpuArray::try_from(take(&mut ebpf, maps::COUNTERS)).expect("counters map type");
        let agg = Array::try_from(take(&mut ebpf, maps::AGGREGATE)).expect("agg map type");
        Some(Self {
            ebpf,
            prog,
            config,
            counters,
            agg,
        })
    }

    fn set_config(&mut self, config: PacerConfig) {
        self.config.set(0, config, 0).expect("write SHAPER_CONFIG");
    }

    /// The aggregate clock, `t_next_free_ns`.
    fn clock(&self) -> u64 {
        self.agg.get(&0, 0).expect("read SHAPER_AGG").t_next_free_ns
    }

    fn set_clock(&mut self, t_next_free_ns: u64) {
        let state = AggregateState {
            t_next_free_ns,
            ..AggregateState::default()
        };
        self.agg.set(0, state, 0).expect("write SHAPER_AGG");
    }

    fn counts(&self) -> Counts {
        let mut out = [0; Counter::COUNT as usize];
        for c in Counter::ALL {
            let per_cpu = self
                .counters
                .get(&(c as u32), 0)
                .expect("read SHAPER_COUNTERS");
            out[c as usize] = per_cpu.iter().sum();
        }
        out
    }

    /// Runs one frame, panicking if the kernel refuses it.
    fn run(&self, frame: &[u8], ctx: Option<&SkBuff>) -> TestRunOutput {
        run_skb(self.prog.as_fd(), frame, ctx, 1)
            .unwrap_or_else(|e| panic!("test run of a {}-byte frame: {e}", frame.len()))
    }

    /// Runs one frame and checks the verdict and that the counters moved by
    /// exactly `expected` (each other counter by zero). `what` names the case.
    fn run_expect(
        &self,
        what: &str,
        frame: &[u8],
        ctx: Option<&SkBuff>,
        verdict: i32,
        expected: &[(Counter, u64)],
    ) -> TestRunOutput {
        let before = self.counts();
        let out = self.run(frame, ctx);
        assert_eq!(out.retval, verdict, "{what}: verdict");
        assert_counts_moved(what, &before, &self.counts(), expected);
        out
    }
}

/// Asserts `after - before` equals `expected` exactly (unlisted counters: 0).
fn assert_counts_moved(what: &str, before: &Counts, after: &Counts, expected: &[(Counter, u64)]) {
    let mut want = BTreeMap::new();
    for &(c, n) in expected {
        *want.entry(c).or_insert(0u64) += n;
    }
    let mut wrong = Vec::new();
    for c in Counter::ALL {
        let got = after[c as usize].wrapping_sub(before[c as usize]);
        let exp = want.get(&c).copied().unwrap_or(0);
        if got != exp {
            wrong.push(format!("{}: +{got}, expected +{exp}", c.name()));
        }
    }
    assert!(
        wrong.is_empty(),
        "{what}: counters moved wrongly: {}",
        wrong.join("; ")
    );
}

/// The counters every packet moves when pacing is off: packets, bytes and
/// passed_unpaced, plus `classes`.
fn unpaced(len: usize, classes: &[Counter]) -> Vec<(Counter, u64)> {
    let mut v = vec![
        (Counter::Packets, 1),
        (Counter::Bytes, len as u64),
        (Counter::WireBytes, len as u64),
        (Counter::PassedUnpaced, 1),
    ];
    v.extend(classes.iter().map(|&c| (c, 1)));
    v
}

/// CLOCK_MONOTONIC in ns, the clock `bpf_ktime_get_ns` reads.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime: {}", std::io::Error::last_os_error());
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A config that paces at `rate_bytes_per_s` with the default horizon.
fn pacing_at(rate_bytes_per_s: u64) -> (PacerConfig, ScaledRate) {
    let rate = ScaledRate::from_bytes_per_s(rate_bytes_per_s).expect("rate in range");
    (PacerConfig::new(rate_bytes_per_s, rate), rate)
}

/// An IPv4/UDP frame of exactly `len` bytes.
fn udp_frame(len: usize) -> Vec<u8> {
    let headers = ETH_HLEN + 20 + 8;
    assert!(len >= headers);
    let p = Frame::ipv4(Ipv4::new(Transport::Udp {
        payload_len: len - headers,
    }))
    .build();
    assert_eq!(p.len(), len);
    p.bytes
}

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
    let Some(h) = Harness::load() else { return };
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
    let Some(h) = Harness::load() else { return };
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
    let Some(h) = Harness::load() else { return };
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
    let Some(h) = Harness::load() else { return };
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
    let Some(h) = Harness::load() else { return };
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
    let Some(h) = Harness::load() else { return };
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
// Pacing
// ---------------------------------------------------------------------------

#[test]
fn pacing_disabled_leaves_tstamp_and_clock_alone() {
    let Some(mut h) = Harness::load() else { return };
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
    let Some(mut h) = Harness::load() else { return };
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
    let Some(mut h) = Harness::load() else { return };
    // 80 kbit/s: 100 us per byte, so a 200-byte frame occupies 20 ms, far
    // longer than the few microseconds between two syscalls.
    let (config, rate) = pacing_at(10_000);
    h.set_config(config);
    let lens = [200usize, 1000, 60, 1500, 64];
    let classes = [Counter::Ipv4, Counter::Udp];

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
        let out = h.run_expect("back-to-back packet", &frame, None, PASS, &expected);
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
}

#[test]
fn clock_beyond_horizon_drops_without_advancing() {
    let Some(mut h) = Harness::load() else { return };
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
    let Some(mut h) = Harness::load() else { return };
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
    let Some(mut h) = Harness::load() else { return };
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
    let Some(mut h) = Harness::load() else { return };
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
    let Some(mut h) = Harness::load() else { return };
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
    let cut = v4(Transport::tcp()).build().truncated(44);
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

// ---------------------------------------------------------------------------
// The wrapper itself
// ---------------------------------------------------------------------------

#[test]
fn ctx_fields_round_trip_through_the_kernel() {
    let Some(h) = Harness::load() else { return };
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
    let Some(h) = Harness::load() else { return };
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
    let Some(h) = Harness::load() else { return };
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
    let Some(mut h) = Harness::load() else { return };
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
    let Some(mut h) = Harness::load() else { return };
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
        assert_eq!(
            after[Counter::Packets as usize] - before[Counter::Packets as usize],
            n
        );
        assert_eq!(
            after[Counter::Bytes as usize] - before[Counter::Bytes as usize],
            n * frame.len() as u64
        );
        assert!(out.duration_ns > 0, "the kernel measured nothing");
        report.push(format!("{label}: {} ns/packet", out.duration_ns));
    }
    eprintln!(
        "{}-byte ipv4/tcp frame, repeat {repeat}: {}",
        frame.len(),
        report.join(", ")
    );
}
