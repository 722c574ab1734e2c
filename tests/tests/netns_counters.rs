//! The classifier on a real veth in a fresh network namespace, on this
//! machine's kernel: the hook's packet and byte counters must equal what was
//! sent (and the interface's own TX counters), and detaching must leave the
//! interface as it was.
//!
//! The namespace is made quiet so the counts are exact: IPv6 off (no router
//! or neighbour solicitations), a permanent neighbour entry (no ARP).

use std::{fs, net::UdpSocket};

use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
    programs::{SchedClassifier, TcAttachType},
};
use shaper::counters::CounterSnapshot;
use shaper_common::{EGRESS_PROGRAM, config::PacerConfig, counters::Counter, maps};
use shaper_tests::{
    netns::{NetNsGuard, sh, veth_pair},
    skip::{Need, require},
    topo::NamedNs,
};

const DATAGRAMS: u64 = 200;
const PAYLOAD_BYTES: usize = 300;
/// Ethernet + IPv4 + UDP headers.
const HEADERS_BYTES: u64 = 14 + 20 + 8;

/// TX packets and bytes of `dev`, from this thread's namespace.
fn tx_stats(dev: &str) -> (u64, u64) {
    let text = fs::read_to_string("/proc/thread-self/net/dev").expect("read net/dev");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{dev}:")))
        .unwrap_or_else(|| panic!("{dev} not in net/dev: {text}"));
    let fields: Vec<u64> = line
        .split_once(':')
        .map(|(_, r)| {
            r.split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    // Receive: 8 fields, then transmit: bytes, packets, ...
    (fields[8], fields[9])
}

/// Loads the classifier with `config`; returns the object and its counters
/// (taken out of it, so the program can be borrowed alongside).
fn load_counting(config: &PacerConfig) -> (Ebpf, PerCpuArray<MapData, u64>) {
    let mut ebpf = shaper::attach::load(config).expect("load the classifier");
    let counters = PerCpuArray::try_from(ebpf.take_map(maps::COUNTERS).expect("counters map"))
        .expect("per-cpu array");
    (ebpf, counters)
}

/// The egress classifier in a loaded object.
fn classifier(ebpf: &mut Ebpf) -> &mut SchedClassifier {
    ebpf.program_mut(EGRESS_PROGRAM)
        .expect("program")
        .try_into()
        .expect("classifier")
}

fn tc_state(dev: &str) -> String {
    sh(&format!(
        "tc -d qdisc show dev {dev}; tc -d filter show dev {dev} egress 2>/dev/null; \
         tc -d filter show dev {dev} ingress 2>/dev/null; true"
    ))
}

#[test]
fn hook_counters_equal_what_was_sent_and_detach_leaves_no_trace() {
    if !require(&[Need::Root]) {
        return;
    }
    let _ns = NetNsGuard::new();
    veth_pair("va0", "vb0");
    // The peer lives in a namespace of its own, so traffic to it leaves
    // through va0 instead of being delivered locally.
    let peer = NamedNs::new("cnt");
    sh(&format!("ip link set dev vb0 netns {}", peer.name));
    peer.sh("sysctl -qw net.ipv6.conf.vb0.disable_ipv6=1 && ip addr add 10.78.0.2/24 dev vb0 && ip link set dev vb0 up");
    sh("sysctl -qw net.ipv6.conf.va0.disable_ipv6=1 && ip addr add 10.78.0.1/24 dev va0");
    let mac_b = peer.sh("cat /sys/class/net/vb0/address");
    let mac_b = mac_b.trim();
    sh(&format!(
        "ip neigh replace 10.78.0.2 lladdr {mac_b} dev va0 nud permanent"
    ));
    // The peer answers each datagram with ICMP port unreachable; without
    // this entry it would first ARP for us, and our reply would be counted.
    let mac_a = sh("ip -br link show dev va0 | awk '{print $3}'");
    peer.sh(&format!(
        "ip neigh replace 10.78.0.1 lladdr {} dev vb0 nud permanent",
        mac_a.trim()
    ));
    let before = tc_state("va0");

    // Counting only: no sch_fq here, so no pacing.
    let mut config = PacerConfig::new(
        2_500_000,
        shaper::rate::Rate::from_bits_per_s(20_000_000)
            .expect("rate")
            .scaled(),
    );
    config.flags = 0;
    let (mut ebpf, counters) = load_counting(&config);
    let program = classifier(&mut ebpf);
    // Below 6.6 (no TCX) the classifier goes on clsact, as `shaper run` does.
    let ifindex = shaper::link::link_by_name("va0").expect("va0").ifindex;
    let tcx = shaper::checks::kernel_has_tcx();
    if !tcx {
        shaper::tc::add_clsact(ifindex).expect("add clsact");
    }
    let link = program
        .attach("va0", TcAttachType::Egress)
        .expect("attach to va0");

    let (tx_bytes0, tx_packets0) = tx_stats("va0");
    let socket = UdpSocket::bind("10.78.0.1:0").expect("bind");
    let payload = [0x5au8; PAYLOAD_BYTES];
    for _ in 0..DATAGRAMS {
        socket.send_to(&payload, "10.78.0.2:9").expect("send");
    }
    let (tx_bytes1, tx_packets1) = tx_stats("va0");

    let totals = CounterSnapshot::read(&counters).expect("read SHAPER_COUNTERS");
    let get = |c: Counter| totals[c];
    let frame_bytes = HEADERS_BYTES + PAYLOAD_BYTES as u64;
    let all: Vec<(&str, u64)> = Counter::ALL.iter().map(|&c| (c.name(), get(c))).collect();
    eprintln!("counters: {all:?}");
    assert_eq!(get(Counter::Packets), DATAGRAMS);
    assert_eq!(get(Counter::Bytes), DATAGRAMS * frame_bytes);
    assert_eq!(get(Counter::Ipv4), DATAGRAMS);
    assert_eq!(get(Counter::Udp), DATAGRAMS);
    assert_eq!(get(Counter::PassedUnpaced), DATAGRAMS);
    for c in [
        Counter::Ipv6,
        Counter::Tcp,
        Counter::Icmp,
        Counter::NonIp,
        Counter::Truncated,
        Counter::Paced,
        Counter::HorizonDrop,
    ] {
        assert_eq!(get(c), 0, "{c:?}");
    }
    // The interface agrees with the hook.
    assert_eq!(tx_packets1 - tx_packets0, DATAGRAMS);
    assert_eq!(tx_bytes1 - tx_bytes0, DATAGRAMS * frame_bytes);

    program.detach(link).expect("detach");
    drop(ebpf);
    if !tcx {
        shaper::tc::delete_clsact(ifindex).expect("delete clsact");
    }
    assert_eq!(tc_state("va0"), before, "detaching left something behind");
}

/// True when /dev/net/tun opens. Without udev (the VM's minimal init) the
/// node may be missing: it is made first, and opening char 10:200
/// autoloads a modular tun.
fn tun_usable() -> bool {
    let tun = std::path::Path::new("/dev/net/tun");
    if !tun.exists() {
        let _ = std::process::Command::new("sh")
            .args(["-c", "mkdir -p /dev/net && mknod /dev/net/tun c 10 200"])
            .status();
    }
    std::fs::File::open(tun).is_ok()
}

/// Regression guard for devices without a link-layer header (PPP, WireGuard,
/// tun): `shaper run` sets `FLAG_NO_L2` for them, and the classifier must then
/// read the network header at offset 0, with `skb->protocol` naming it. Read
/// as Ethernet, bytes 12-13 (the IPv4 source address) would be taken for an
/// ethertype and every packet counted as non-IP.
#[test]
fn device_without_link_header_is_parsed_from_the_ip_header() {
    // The probe makes the device node, which needs root.
    if !require(&[Need::Root])
        || !require(&[Need::Probed(
            tun_usable(),
            "a usable /dev/net/tun (CONFIG_TUN)",
        )])
    {
        return;
    }
    let _ns = NetNsGuard::new();
    sh(
        "ip tuntap add dev tun0 mode tun && ip addr add 10.79.0.1/24 dev tun0 && ip link set dev tun0 up",
    );
    let link = shaper::link::link_by_name("tun0").expect("tun0");
    assert!(
        !link.has_l2_header,
        "tun has no link-layer header: {link:?}"
    );

    let rate = shaper::rate::Rate::from_bits_per_s(20_000_000).expect("rate");
    let config_for = |has_l2: bool| {
        let cfg =
            shaper::config::RunConfig::new("tun0".into(), rate, std::time::Duration::from_secs(2))
                .expect("config");
        let mut p = cfg.pacer_config(has_l2);
        p.flags &= !shaper_common::config::FLAG_ENABLED;
        p
    };
    // Once as `shaper run` configures it, once wrongly as if it were Ethernet.
    for (has_l2, want_ipv4) in [(link.has_l2_header, true), (true, false)] {
        let (mut ebpf, counters) = load_counting(&config_for(has_l2));
        let program = classifier(&mut ebpf);
        let tcx = shaper::checks::kernel_has_tcx();
        if !tcx {
            shaper::tc::add_clsact(link.ifindex).expect("add clsact");
        }
        let attached = program
            .attach("tun0", TcAttachType::Egress)
            .expect("attach");
        let socket = UdpSocket::bind("10.79.0.1:0").expect("bind");
        for _ in 0..50 {
            // With no reader on the tun device the kernel drops the packet
            // after the egress hook; send errors are irrelevant here.
            let _ = socket.send_to(&[7u8; 100], "10.79.0.2:9");
        }
        let totals = CounterSnapshot::read(&counters).expect("read SHAPER_COUNTERS");
        let get = |c: Counter| totals[c];
        let all: Vec<(&str, u64)> = Counter::ALL.iter().map(|&c| (c.name(), get(c))).collect();
        assert_eq!(get(Counter::Packets), 50, "has_l2 {has_l2}: {all:?}");
        assert_eq!(get(Counter::Bytes), 50 * (20 + 8 + 100), "{all:?}");
        if want_ipv4 {
            assert_eq!(get(Counter::Ipv4), 50, "{all:?}");
            assert_eq!(get(Counter::Udp), 50, "{all:?}");
            assert_eq!(get(Counter::NonIp) + get(Counter::Truncated), 0, "{all:?}");
        } else {
            assert_eq!(
                get(Counter::Ipv4),
                0,
                "misread as Ethernet yet IPv4: {all:?}"
            );
        }
        program.detach(attached).expect("detach");
        drop(ebpf);
        if !tcx {
            shaper::tc::delete_clsact(link.ifindex).expect("delete clsact");
        }
    }
}
