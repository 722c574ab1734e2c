//! `shaper observe` against traffic whose path is known:
//! - frames sent through an AF_PACKET socket with `PACKET_QDISC_BYPASS` skip
//!   the TC egress hook (verified on 6.18, see docs): all of them must show
//!   as egress bypass, to the byte;
//! - ordinary UDP through a normal socket passes both hooks: 0 bypass both
//!   ways, and the hook's `skb->len` bytes equal the veth's own byte count
//!   (both include the Ethernet header);
//! - beside a running `shaper run` (sch_fq: VM kernels) the observer works
//!   and the interface's tc state is the same before and after;
//! - a router with an nftables flowtable (nf_flow_table: VM kernels) shows
//!   the forwarded iperf3 flow as offloaded, and what the hooks see of it.
//!
//! Every case uses veths in namespaces it creates, with IPv6 off and static
//! neighbours, so no unsolicited frame (ND, ARP) enters the figures.

use std::{
    fs::File,
    io::{BufRead, BufReader},
    net::UdpSocket,
    os::fd::AsRawFd,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;
use shaper_tests::{
    shaper_proc::ShaperProc,
    skip::{Need, require},
    topo::{NamedNs, Pair, text},
    traffic::{IPERF3_PORT, Iperf3Server, static_neighbours},
};

const FRAMES: usize = 2000;
const FRAME_LEN: usize = 100;
/// IEEE 802 local experimental ethertype: no protocol handler answers it.
const ETH_P_EXPERIMENTAL: u16 = 0x88b5;
const SOL_PACKET: libc::c_int = 263;
const PACKET_QDISC_BYPASS: libc::c_int = 20;

/// Runs `f` with the calling thread in the named namespace, then returns.
fn in_netns<T>(ns: &NamedNs, f: impl FnOnce() -> T) -> T {
    let previous = File::open("/proc/thread-self/ns/net").expect("open current netns");
    let target = File::open(format!("/run/netns/{}", ns.name)).expect("open target netns");
    // SAFETY: setns has no memory-safety preconditions; both fds are open
    // network-namespace files; it only moves this thread.
    let rc = unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
    let out = f();
    // SAFETY: as above, back to where we were.
    let rc = unsafe { libc::setns(previous.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns back: {}", std::io::Error::last_os_error());
    out
}

fn mac(ns: &NamedNs, dev: &str) -> [u8; 6] {
    let s = ns.sh(&format!("cat /sys/class/net/{dev}/address"));
    let v: Vec<u8> = s
        .trim()
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).expect("hex"))
        .collect();
    v.try_into().expect("6 bytes")
}

/// A running `shaper observe --json`, its lines arriving on a channel.
struct Observer {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Observer {
    /// Starts `shaper observe --json`; with no `duration`, it runs until
    /// [`Observer::interrupt`].
    fn start(ns: &NamedNs, iface: &str, duration: Option<&str>) -> Self {
        let mut cmd = ns.shaper();
        cmd.args(["observe", "--iface", iface, "--json", "--interval", "1s"]);
        if let Some(d) = duration {
            cmd.args(["--duration", d]);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn shaper observe");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Waits for the first interval record: the hooks are attached and the
    /// start snapshot taken.
    fn wait_attached(&mut self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
                let interval = l.contains("\"kind\":\"interval\"");
                seen.push(l);
                if interval {
                    return seen;
                }
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("shaper observe exited early ({st}): {seen:?}");
            }
        }
        panic!("no interval record from shaper observe within 60 s: {seen:?}");
    }

    /// Sends SIGINT, which must end it cleanly (summary, exit 0).
    fn interrupt(&self) {
        let pid = i32::try_from(self.child.id()).expect("pid fits");
        // SAFETY: kill has no memory-safety preconditions; the pid is our child.
        let rc = unsafe { libc::kill(pid, libc::SIGINT) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// Waits for the exit; returns every stdout line and stderr.
    fn finish(mut self, mut lines: Vec<String>) -> (Vec<String>, String) {
        let status = self.child.wait().expect("wait observe");
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            use std::io::Read as _;
            let _ = e.read_to_string(&mut stderr);
        }
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(500)) {
            lines.push(l);
        }
        assert!(
            status.success(),
            "shaper observe failed ({status}): {lines:?}\n{stderr}"
        );
        (lines, stderr)
    }
}

/// The summary record, which must be the last line.
fn summary(lines: &[String]) -> Value {
    let last = lines.last().expect("some output");
    let v: Value = serde_json::from_str(last).expect("last line is JSON");
    assert_eq!(v["kind"], "summary", "last line is not the summary: {last}");
    v
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

/// Sends `FRAMES` frames of `FRAME_LEN` bytes from `left0` through an
/// AF_PACKET socket with PACKET_QDISC_BYPASS; returns the bytes sent.
fn send_bypass_frames(pair: &Pair) -> u64 {
    let src = mac(&pair.left, "left0");
    let dst = mac(&pair.right, "right0");
    let ifindex = in_netns(&pair.left, || shaper_tests::tc_util::ifindex("left0"));
    in_netns(&pair.left, || {
        // SAFETY: plain socket(2) call; the fd is checked and closed below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let one: libc::c_int = 1;
        // SAFETY: the option value points at a live c_int of the size given.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                SOL_PACKET,
                PACKET_QDISC_BYPASS,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(
            rc,
            0,
            "PACKET_QDISC_BYPASS: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: sockaddr_ll is plain data; zero is a valid start.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETH_P_EXPERIMENTAL.to_be();
        addr.sll_ifindex = ifindex as i32;
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(&dst);
        let mut frame = [0u8; FRAME_LEN];
        frame[0..6].copy_from_slice(&dst);
        frame[6..12].copy_from_slice(&src);
        frame[12..14].copy_from_slice(&ETH_P_EXPERIMENTAL.to_be_bytes());
        let mut sent = 0u64;
        for i in 0..FRAMES {
            frame[14..18].copy_from_slice(&(i as u32).to_be_bytes());
            // SAFETY: frame and addr are live for the call, lengths match.
            let n = unsafe {
                libc::sendto(
                    fd,
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&addr as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            assert_eq!(
                n,
                FRAME_LEN as isize,
                "sendto: {}",
                std::io::Error::last_os_error()
            );
            sent += FRAME_LEN as u64;
            // Pace a little: the peer's backlog (netdev_max_backlog, 1000)
            // must not overflow, or veth counts drops instead of bytes.
            if i % 50 == 49 {
                sleep(Duration::from_millis(2));
            }
        }
        // SAFETY: fd is ours and open.
        unsafe { libc::close(fd) };
        sent
    })
}

/// Sends `FRAMES` UDP datagrams (72 payload bytes) from the left namespace
/// to 10.77.0.2:9 through an ordinary socket; returns how many.
fn send_udp(pair: &Pair) -> usize {
    in_netns(&pair.left, || {
        let sock = UdpSocket::bind("10.77.0.1:0").expect("bind");
        let payload = [0x5au8; 72];
        for i in 0..FRAMES {
            sock.send_to(&payload, "10.77.0.2:9").expect("send");
            if i % 50 == 49 {
                sleep(Duration::from_millis(2));
            }
        }
        FRAMES
    })
}

#[test]
fn qdisc_bypass_frames_are_egress_bypass() {
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("obyp", 1);
    static_neighbours(&pair);
    let before = pair.left.tc_state("left0");
    let mut obs = Observer::start(&pair.left, "left0", Some("6s"));
    let lines = obs.wait_attached();
    let sent = send_bypass_frames(&pair);
    let (lines, _) = obs.finish(lines);
    let s = summary(&lines);
    eprintln!("bypass frames: sent {sent} B in {FRAMES} frames; summary {s}");
    let bypass = u(&s, "tx_bypass_bytes");
    let diff = bypass.abs_diff(sent);
    assert!(
        diff * 100 <= sent,
        "tx_bypass_bytes {bypass} is not within 1% of the {sent} bytes sent past the hook"
    );
    let packets = u(&s, "tx_bypass_packets");
    assert!(
        packets.abs_diff(FRAMES as u64) * 100 <= FRAMES as u64,
        "tx_bypass_packets {packets}, sent {FRAMES}"
    );
    // The hook saw none of them; nothing else was sent.
    assert_eq!(u(&s, "tx_hook_packets"), 0, "{s}");
    let pct = s["tx_bypass_pct"].as_f64().expect("a percentage");
    assert!(pct > 99.0, "{pct}");
    assert_eq!(pair.left.tc_state("left0"), before, "tc state changed");
}

#[test]
fn ordinary_traffic_has_no_bypass() {
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("oudp", 1);
    static_neighbours(&pair);
    let before = pair.left.tc_state("left0");
    let mut obs = Observer::start(&pair.left, "left0", Some("6s"));
    let lines = obs.wait_attached();
    let n = send_udp(&pair);
    let (lines, _) = obs.finish(lines);
    let s = summary(&lines);
    eprintln!("ordinary UDP: {n} datagrams; summary {s}");
    assert!(u(&s, "tx_iface_packets") >= n as u64, "{s}");
    // Both count the frame with its Ethernet header: equal to the byte.
    assert_eq!(u(&s, "tx_hook_bytes"), u(&s, "tx_iface_bytes"), "{s}");
    assert_eq!(u(&s, "tx_bypass_bytes"), 0, "{s}");
    assert_eq!(u(&s, "tx_bypass_packets"), 0, "{s}");
    assert_eq!(u(&s, "tx_hook_only_packets"), 0, "{s}");
    assert_eq!(s["tx_bypass_pct"].as_f64(), Some(0.0), "{s}");
    // The port-unreachable answers come back through the ingress hook.
    assert_eq!(u(&s, "rx_bypass_bytes"), 0, "{s}");
    assert_eq!(u(&s, "rx_hook_bytes"), u(&s, "rx_iface_bytes"), "{s}");
    // Intervals came before the summary, one per second or so.
    let intervals = lines
        .iter()
        .filter(|l| l.contains("\"kind\":\"interval\""))
        .count();
    assert!((4..=8).contains(&intervals), "{intervals} interval records");
    assert_eq!(pair.left.tc_state("left0"), before, "tc state changed");
}

#[test]
fn bad_input_exits_2_and_attaches_nothing() {
    if !require(&[Need::Root, Need::Tool("setpriv", "--version")]) {
        return;
    }
    let pair = Pair::new("obad", 1);
    let before = pair.left.tc_state("left0");
    for (args, needle) in [
        (vec!["--iface", "nosuchif0"], "nosuchif0"),
        (vec!["--iface", "left0", "--duration", "0s"], "--duration"),
        (vec!["--iface", "left0", "--interval", "1ms"], "--interval"),
        (vec!["--iface", "left0", "--duration", "5"], "no unit"),
    ] {
        let out = pair
            .left
            .shaper()
            .arg("observe")
            .args(&args)
            .output()
            .expect("run observe");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(needle), "{args:?}: {}", text(&out));
    }
    // Without privileges: setpriv drops to nobody with no capabilities.
    let out = pair
        .left
        .unprivileged_shaper()
        .args(["observe", "--iface", "left0", "--duration", "1s"])
        .output()
        .expect("setpriv");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("CAP_"), "{}", text(&out));
    assert_eq!(pair.left.tc_state("left0"), before, "tc state changed");
}

/// Starts `shaper run --iface IFACE --rate 200mbit` in `ns`; returns once
/// it shapes.
fn start_pacer<'a>(ns: &'a NamedNs, iface: &str) -> ShaperProc<'a> {
    ShaperProc::start(Some(ns), iface, &["--rate", "200mbit"])
}

/// Stops a pacer with SIGTERM; it must exit 0 (restored).
fn stop_pacer(mut pacer: ShaperProc<'_>) {
    let exit = pacer.sigterm();
    assert_eq!(exit.code(), Some(0), "pacer exit: {}", exit.text());
}

#[test]
fn observe_beside_a_running_pacer() {
    if !require(&[Need::Root, Need::Sch("fq")]) {
        return;
    }
    let pair = Pair::new("opac", 1);
    static_neighbours(&pair);
    let pacer = start_pacer(&pair.left, "left0");
    let with_pacer = pair.left.tc_state("left0");
    let mut obs = Observer::start(&pair.left, "left0", Some("5s"));
    let lines = obs.wait_attached();
    let n = send_udp(&pair);
    let (lines, _) = obs.finish(lines);
    let s = summary(&lines);
    eprintln!("beside the pacer: {n} datagrams; summary {s}");
    assert!(u(&s, "tx_iface_packets") >= n as u64, "{s}");
    assert_eq!(u(&s, "tx_bypass_bytes"), 0, "{s}");
    assert_eq!(
        pair.left.tc_state("left0"),
        with_pacer,
        "observe changed the tc state beside the pacer"
    );
    // The pacer still runs and still counts.
    let st = pacer.status();
    assert!(st.running, "{st}");
    assert!(st.counter("packets") >= n as u64, "{st}");
    stop_pacer(pacer);
}

/// True when this kernel can run an nftables flowtable (probed with `nft`
/// in a throwaway namespace with a dummy veth pair; needs root).
fn kernel_has_flowtable() -> bool {
    let ns = NamedNs::new("oprb");
    let ok = Command::new("ip")
        .args(["netns", "exec", &ns.name, "sh", "-c"])
        .arg(
            "ip link add p0 type veth peer name p1 && \
             printf 'table inet probe {\\n flowtable f { hook ingress priority 0; devices = { p0, p1 }; }\\n}\\n' \
             | nft -f -",
        )
        .output()
        .is_ok_and(|o| o.status.success());
    drop(ns);
    ok
}

#[test]
fn flowtable_offload_is_listed() {
    // The probe needs root and nft, so it runs only once they are there.
    if !require(&[
        Need::Root,
        Need::Tool("nft", "--version"),
        Need::Tool("iperf3", "--version"),
    ]) || !require(&[Need::Probed(
        kernel_has_flowtable(),
        "nf_flow_table (nftables flowtable)",
    )]) {
        return;
    }
    // client c0 10.0.1.2 -- r0 10.0.1.1 [router] r1 10.0.2.1 -- s0 10.0.2.2
    let client = NamedNs::new("oc");
    let router = NamedNs::new("or");
    let server = NamedNs::new("os");
    shaper_tests::netns::sh(&format!(
        "ip link add c0 netns {c} type veth peer name r0 netns {r} && \
         ip link add s0 netns {s} type veth peer name r1 netns {r}",
        c = client.name,
        r = router.name,
        s = server.name
    ));
    for (ns, dev, addr, gw) in [
        (&client, "c0", "10.0.1.2/24", Some("10.0.1.1")),
        (&router, "r0", "10.0.1.1/24", None),
        (&router, "r1", "10.0.2.1/24", None),
        (&server, "s0", "10.0.2.2/24", Some("10.0.2.1")),
    ] {
        ns.sh(&format!(
            "sysctl -qw net.ipv6.conf.{dev}.disable_ipv6=1 && ip addr add {addr} dev {dev} && \
             ip link set {dev} up"
        ));
        if let Some(gw) = gw {
            ns.sh(&format!("ip route add default via {gw}"));
        }
    }
    router.sh("sysctl -qw net.ipv4.ip_forward=1");
    router.sh(
        "printf 'table inet obs {\\n flowtable ft { hook ingress priority 0; devices = { r0, r1 }; counter; }\\n \
         chain forward { type filter hook forward priority 0; policy accept; meta l4proto tcp flow add @ft; }\\n}\\n' \
         | nft -f -",
    );
    // Per-entry counters for the listing (conntrack is loaded by now).
    router.sh("sysctl -qw net.netfilter.nf_conntrack_acct=1");

    let server_proc = Iperf3Server::start(&server, IPERF3_PORT, &[]);
    // The pacer on the WAN side too, to match the flow in its table.
    let pacer = start_pacer(&router, "r1");
    let before = router.tc_state("r1");
    // Observe first (loading takes seconds under emulation), then start the
    // flow, and stop observing while it still runs: a finished TCP flow
    // leaves the flowtable, and its conntrack entry loses IPS_OFFLOAD.
    let mut obs = Observer::start(&router, "r1", None);
    let lines = obs.wait_attached();
    let client_proc = client
        .command("iperf3")
        .args(["-c", "10.0.2.2", "-t", "10", "-b", "50M"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iperf3 -c");
    sleep(Duration::from_secs(7));
    obs.interrupt();
    let (lines, _) = obs.finish(lines);
    let iperf = client_proc.wait_with_output().expect("iperf3 client");
    drop(server_proc);
    assert!(iperf.status.success(), "iperf3: {}", text(&iperf));
    for l in &lines {
        eprintln!("{l}");
    }
    let s = summary(&lines);
    let flows: Vec<Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "offloaded_flow")
        .collect();
    assert_eq!(
        u(&s, "offloaded_flows"),
        flows.len() as u64,
        "summary count vs records"
    );
    // iperf3 opens a control connection and a data connection to port
    // 5201; the data one carries the megabytes.
    let data = flows
        .iter()
        .filter(|f| f["dport"] == 5201 && f["src"] == "10.0.1.2" && f["dst"] == "10.0.2.2")
        .max_by_key(|f| f["orig_bytes"].as_u64().unwrap_or(0))
        .unwrap_or_else(|| panic!("the iperf3 flow is not listed as offloaded: {flows:?}"));
    assert_eq!(data["offload"], "software", "{data}");
    assert_eq!(data["proto"], "tcp", "{data}");
    // The flowtable adds to the conntrack counters only with its `counter`
    // flag (NF_FLOWTABLE_COUNTER); without it they stop at the handshake.
    assert!(
        data["orig_bytes"].as_u64().is_some_and(|b| b > 1_000_000),
        "conntrack counters with acct on: {data}"
    );
    // The pacer on r1 saw the flow's packets: its table holds the tag.
    assert_eq!(data["in_shaper_flow_table"], true, "{data}");
    // What the hooks see of a software-offloaded flow (measured on 6.12):
    // the flowtable's netfilter ingress hook runs after TC ingress, and it
    // transmits through dev_queue_xmit (neigh_xmit), so TC egress sees the
    // forwarded packets too: no bypass in either direction while megabytes
    // flow. Software offload skips routing and the forward chain, not TC.
    // (With the pacer's lowered gso_max_size the forwarded GRO packets are
    // segmented after the hook; the wire figures account for that.)
    let tx_iface = u(&s, "tx_iface_bytes");
    assert!(tx_iface > 1_000_000, "little traffic forwarded: {s}");
    let tx_pct = s["tx_bypass_pct"].as_f64().expect("pct");
    let rx_pct = s["rx_bypass_pct"].as_f64().expect("pct");
    eprintln!(
        "flowtable: tx iface {tx_iface} B, tx bypass {} B ({tx_pct:.3}%), rx bypass {} B ({rx_pct:.3}%)",
        u(&s, "tx_bypass_bytes"),
        u(&s, "rx_bypass_bytes")
    );
    assert!(tx_pct < 1.0, "egress bypass under software offload: {s}");
    assert!(rx_pct < 1.0, "ingress bypass under software offload: {s}");
    assert_eq!(router.tc_state("r1"), before, "tc state changed");
    stop_pacer(pacer);
}

#[test]
fn sigterm_ends_an_open_ended_run_cleanly() {
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("oterm", 1);
    let before = pair.left.tc_state("left0");
    let mut obs = Observer::start(&pair.left, "left0", None);
    let lines = obs.wait_attached();
    let pid = i32::try_from(obs.child.id()).expect("pid fits");
    // SAFETY: kill has no memory-safety preconditions; the pid is our child.
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    let (lines, _) = obs.finish(lines);
    let s = summary(&lines);
    assert!(s["duration_s"].as_f64().is_some_and(|d| d >= 1.0), "{s}");
    assert_eq!(pair.left.tc_state("left0"), before, "tc state changed");
}

/// Sums the observer's per-CPU counter `slot` over CPUs.
fn observer_counter(ebpf: &aya::Ebpf, slot: u32) -> u64 {
    let map = ebpf
        .map(shaper_common::observe::OBSERVE_COUNTERS_MAP)
        .expect("OBSERVE_COUNTERS in the object");
    let array: aya::maps::PerCpuArray<_, u64> =
        aya::maps::PerCpuArray::try_from(map).expect("per-CPU array");
    shaper::counters::read_total(&array, "OBSERVE_COUNTERS", "slot", slot).expect("read")
}

#[test]
fn prog_test_run_counts_skbs_and_wire_segments_and_passes() {
    use shaper::bpf::test_run::{SkBuff, run_skb};
    use shaper_common::observe::{
        Direction, Kind, OBSERVE_EGRESS_PROGRAM, OBSERVE_INGRESS_PROGRAM, slot,
    };
    use std::os::fd::AsFd;

    if !require(&[Need::Bpf]) {
        return;
    }
    let mut ebpf = shaper::observe::hooks::load(true).expect("load the observer programs");
    let frame = shaper_tests::bpf_harness::udp_frame(300);
    // A GSO packet of 4 segments: each segment after the first repeats the
    // 42 bytes of Ethernet, IPv4 and UDP headers on the wire.
    let gso = SkBuff {
        gso_segs: 4,
        gso_size: 64,
        ..SkBuff::default()
    };
    for (name, dir) in [
        (OBSERVE_EGRESS_PROGRAM, Direction::Egress),
        (OBSERVE_INGRESS_PROGRAM, Direction::Ingress),
    ] {
        let prog: &mut aya::programs::SchedClassifier = ebpf
            .program_mut(name)
            .expect("program")
            .try_into()
            .expect("classifier");
        let fd = prog.fd().expect("loaded").try_clone().expect("dup fd");
        let before: Vec<u64> = [
            Kind::Packets,
            Kind::Bytes,
            Kind::WirePackets,
            Kind::WireBytes,
        ]
        .iter()
        .map(|k| observer_counter(&ebpf, slot(dir, *k)))
        .collect();
        let plain = run_skb(fd.as_fd(), &frame, None, 1).expect("test run");
        assert_eq!(plain.retval, -1, "{name} must return TC_ACT_UNSPEC");
        assert_eq!(plain.data, frame, "{name} must not change the packet");
        let seg = run_skb(fd.as_fd(), &frame, Some(&gso), 1).expect("test run");
        assert_eq!(seg.retval, -1, "{name} must return TC_ACT_UNSPEC");
        let after: Vec<u64> = [
            Kind::Packets,
            Kind::Bytes,
            Kind::WirePackets,
            Kind::WireBytes,
        ]
        .iter()
        .map(|k| observer_counter(&ebpf, slot(dir, *k)))
        .collect();
        let moved: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(
            moved,
            vec![2, 600, 1 + 4, 300 + 300 + 3 * 42],
            "{name}: packets, bytes, wire packets, wire bytes"
        );
    }
}
