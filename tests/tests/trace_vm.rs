//! Truth checks for `shaper trace`, the qdisc sojourn tracer: its numbers
//! against qdiscs whose delay is known (netem's fixed delay, TBF's latency
//! bound) or reported by the qdisc itself (CAKE's `tc -s` delays) and by
//! ping (loaded RTT − idle RTT).
//!
//! The netem and CAKE tests need modules the host kernel lacks: they skip
//! with a reason there and run in the VM (where a skip is a failure). The
//! TBF, noqueue and bad-input tests run everywhere.
//!
//! Traffic always leaves through `left0`'s root qdisc: netem, CAKE and TBF
//! do not set TCQ_F_CAN_BYPASS, so no packet skips the enqueue.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use serde_json::Value;
use shaper_tests::{
    skip::{Need, require, require_full_kernel},
    topo::{NamedNs, Pair, text},
    traffic::{IPERF3_PORT, Iperf3Server},
};

/// A running `shaper trace --json` in `ns`.
struct Trace {
    child: Child,
    stderr: thread::JoinHandle<String>,
}

/// Starts `shaper trace --iface IF --duration S --json` in `ns` and waits
/// until it says it is attached.
fn start_trace(ns: &NamedNs, iface: &str, secs: u64) -> Trace {
    let mut child = ns
        .shaper()
        .args(["trace", "--iface", iface, "--json", "--duration"])
        .arg(format!("{secs}s"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shaper trace");
    let err = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    let stderr = thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("tracer attached") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = child.kill();
        let out = child.wait_with_output().expect("wait");
        panic!(
            "the tracer did not attach: {}\n{}",
            text(&out),
            stderr.join().unwrap_or_default()
        );
    }
    Trace { child, stderr }
}

impl Trace {
    /// Waits for the end; returns every JSON record, the summary last.
    fn finish(self) -> Vec<Value> {
        let out = self.child.wait_with_output().expect("wait for the tracer");
        let err = self.stderr.join().unwrap_or_default();
        assert!(
            out.status.success(),
            "shaper trace failed: {}{err}",
            text(&out)
        );
        let records: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}")))
            .collect();
        let last = records.last().expect("some output");
        assert_eq!(
            last["kind"], "summary",
            "the last record must be the summary"
        );
        records
    }
}

fn summary(records: &[Value]) -> &Value {
    records.last().expect("summary")
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// A pair with the neighbour resolved, so the traced packets are the test's.
fn resolved_pair(tag: &str) -> Pair {
    let pair = Pair::new(tag, 1);
    pair.left
        .sh("ping -n -c 1 -W 2 10.77.0.2 >/dev/null || true");
    pair
}

/// Installs `qdisc` as the root of left0; panics if tc refuses.
fn root_qdisc(pair: &Pair, qdisc: &str) {
    pair.left
        .sh(&format!("tc qdisc replace dev left0 root {qdisc}"));
}

/// Round-trip times from ping's output ("time=1.23 ms"), in ms.
fn ping_rtts(ns: &NamedNs, args: &str) -> Vec<f64> {
    let out = ns.sh(&format!("ping -n {args} 10.77.0.2 || true"));
    out.lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse().ok())
        .collect()
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    assert!(!s.is_empty(), "no samples");
    s[s.len() / 2]
}

#[test]
fn netem_delay_20ms_is_measured_as_20ms() {
    if !require(&[Need::Root, Need::Sch("netem")]) {
        return;
    }
    let pair = resolved_pair("trnetem");
    root_qdisc(&pair, "netem delay 20ms limit 1000");
    let trace = start_trace(&pair.left, "left0", 6);
    let rtts = ping_rtts(&pair.left, "-i 0.05 -c 80");
    eprintln!(
        "ping RTT median {:.3} ms over {} replies",
        median(&rtts),
        rtts.len()
    );
    let records = trace.finish();
    let s = summary(&records);
    eprintln!("netem 20ms: {s}");
    let (p50, p99) = (ms(u(s, "delay_p50_ns")), ms(u(s, "delay_p99_ns")));
    eprintln!(
        "tracer p50 {p50:.3} ms, p99 {p99:.3} ms, max {:.3} ms",
        ms(u(s, "delay_max_ns"))
    );
    assert!(u(s, "packets") >= 60, "too few packets measured: {s}");
    assert!(
        (19.0..=21.0).contains(&p50),
        "p50 {p50:.3} ms is not 20 ms ± 1 ms"
    );
    // netem holds every packet exactly 20 ms; what the tail adds is timer
    // lateness (up to 64 ms seen in the emulated VM with other VMs busy on
    // the host), so only its order is checked.
    assert!(p99 >= p50, "p99 {p99:.3} ms below p50 {p50:.3} ms");
    assert_eq!(u(s, "no_enqueue_record"), 0, "netem never bypasses: {s}");
    assert_eq!(u(s, "events_lost"), 0, "{s}");
}

#[test]
fn cake_sojourn_agrees_with_cake_and_ping() {
    if !require(&[
        Need::Root,
        Need::Sch("cake"),
        Need::Tool("iperf3", "--version"),
    ]) {
        return;
    }
    let pair = resolved_pair("trcake");
    // MTU-sized packets: CAKE splits GSO super-packets into new skbs, which
    // the tracer cannot follow (they count as no enqueue record).
    pair.left.sh("ip link set dev left0 gso_max_segs 1");
    root_qdisc(&pair, "cake bandwidth 20mbit besteffort");
    let idle = ping_rtts(&pair.left, "-i 0.05 -c 40");
    let server = Iperf3Server::start(&pair.right, IPERF3_PORT, &[]);
    let trace = start_trace(&pair.left, "left0", 14);
    let client = pair
        .left
        .command("iperf3")
        .args(["-c", "10.77.0.2", "-P", "4", "-t", "12"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("iperf3 client");
    // Ping once the flows have filled the queue.
    thread::sleep(Duration::from_secs(3));
    let loaded = ping_rtts(&pair.left, "-i 0.1 -c 60");
    let client_out = client.wait_with_output().expect("iperf3 client");
    assert!(client_out.status.success(), "iperf3: {}", text(&client_out));
    server.wait();
    let records = trace.finish();
    let cake: Value =
        serde_json::from_str(&pair.left.sh("tc -s -j qdisc show dev left0")).expect("tc JSON");
    let tin = &cake[0]["tins"][0];
    eprintln!("cake tin: {tin}");
    let s = summary(&records);
    eprintln!("summary: {s}");
    let tracer_p50 = ms(u(s, "delay_p50_ns"));
    let tracer_p99 = ms(u(s, "delay_p99_ns"));
    let tracer_mean = ms(u(s, "delay_mean_ns"));
    let avg = tin["avg_delay_us"].as_f64().expect("avg_delay_us") / 1e3;
    let peak = tin["peak_delay_us"].as_f64().expect("peak_delay_us") / 1e3;
    // The ICMP echo flow as the tracer saw it, and as ping saw it.
    let icmp = records
        .iter()
        .rev()
        .find(|r| r["kind"] == "flow" && r["flow"] == "10.77.0.1 > 10.77.0.2 icmp")
        .expect("the tracer saw the ping flow");
    let icmp_p50 = ms(u(icmp, "delay_p50_ns"));
    let induced = median(&loaded) - median(&idle);
    eprintln!(
        "cake 20mbit, 4 TCP flows: tracer all packets p50 {tracer_p50:.3} ms mean \
         {tracer_mean:.3} ms p99 {tracer_p99:.3} ms; cake av_delay {avg:.3} ms pk_delay {peak:.3} ms; tracer ping \
         flow p50 {icmp_p50:.3} ms; ping median idle {:.3} ms loaded {:.3} ms, induced \
         {induced:.3} ms",
        median(&idle),
        median(&loaded)
    );
    assert!(u(s, "packets") > 5_000, "too few packets measured: {s}");
    // CAKE's av_delay is an EWMA of the same per-packet sojourn: the
    // tracer's median must be within a factor of 2 of it (or 2 ms, for
    // the small values CAKE's AQM keeps under light TCG load).
    // CAKE's av_delay is an EWMA (1/256 per packet) of the same sojourn,
    // taken at dequeue: it weighs the last few hundred packets, so it is
    // compared with the tracer's whole-run mean within a factor of 2 (or
    // 2 ms, for the small values CAKE's AQM keeps).
    let within = |a: f64, b: f64, abs: f64| (a - b).abs() <= abs || (a / b <= 2.0 && b / a <= 2.0);
    assert!(
        within(tracer_mean, avg, 2.0),
        "tracer mean {tracer_mean:.3} ms vs CAKE av_delay {avg:.3} ms"
    );
    // CAKE's peak EWMA stays below the tracer's maximum.
    assert!(
        ms(u(s, "delay_max_ns")) + 1.0 >= peak,
        "CAKE pk_delay {peak:.3} ms above the tracer's max {s}"
    );
    // Ping is a sparse flow under CAKE, so its own qdisc wait is small; it
    // is part of the RTT increase ping sees, which also holds the guest's
    // CPU contention (TCG) and the return path. So the tracer's ping-flow
    // sojourn must not exceed the induced latency (+1 ms of noise in the
    // idle baseline).
    assert!(
        icmp_p50 <= induced.max(0.0) + 1.0,
        "tracer ping-flow p50 {icmp_p50:.3} ms exceeds ping's induced {induced:.3} ms"
    );
    assert_eq!(u(s, "events_lost"), 0, "{s}");
}

#[test]
fn tbf_flood_delay_is_bounded_by_its_latency() {
    if !require(&[
        Need::Root,
        Need::Sch("tbf"),
        Need::Tool("iperf3", "--version"),
    ]) {
        return;
    }
    let pair = resolved_pair("trtbf");
    // limit = rate × latency + burst, so a full queue waits about
    // latency + burst / rate = 50 + 8 ms.
    root_qdisc(&pair, "tbf rate 10mbit burst 10kb latency 50ms");
    let server = Iperf3Server::start(&pair.right, IPERF3_PORT, &[]);
    let trace = start_trace(&pair.left, "left0", 7);
    let out = pair
        .left
        .command("iperf3")
        .args([
            "-c",
            "10.77.0.2",
            "-u",
            "-b",
            "40M",
            "-l",
            "1400",
            "-t",
            "5",
        ])
        .output()
        .expect("iperf3 client");
    assert!(out.status.success(), "iperf3: {}", text(&out));
    server.wait();
    let records = trace.finish();
    let s = summary(&records);
    let (p50, p99, max) = (
        ms(u(s, "delay_p50_ns")),
        ms(u(s, "delay_p99_ns")),
        ms(u(s, "delay_max_ns")),
    );
    eprintln!(
        "tbf 10mbit latency 50ms, UDP 40M: p50 {p50:.3} ms p99 {p99:.3} ms max {max:.3} ms; {s}"
    );
    assert!(u(s, "packets") > 2_000, "{s}");
    // The bound is in bytes (limit = rate × latency + burst), so a queue
    // drained late by coarse timers waits longer than latency + burst/rate.
    // The median is held to it everywhere; the tail only on the host (p99
    // 59-62 ms seen). In the emulated VM (SHAPER_REQUIRE_FULL_KERNEL=1) the
    // watchdog timer fires late when the host is busy (p99 74-222 ms seen),
    // so there the tail is only printed.
    let bound = 50.0 + 10.0 * 1024.0 * 8.0 / 10e6 * 1e3;
    assert!(
        p50 >= 25.0,
        "a flooded TBF queue must wait: p50 {p50:.3} ms"
    );
    assert!(
        p50 <= 1.15 * bound + 2.0,
        "beyond TBF's bound {bound:.1} ms: p50 {p50:.3} ms"
    );
    if !require_full_kernel() {
        let tail = 1.15 * bound + 2.0;
        assert!(
            p99 <= tail,
            "beyond {tail:.1} ms (TBF's bound {bound:.1} ms): p99 {p99:.3} ms"
        );
    }
    // About 10 Mbit/s of 1428-byte IP packets in the 5 s flood.
    let bytes = u(s, "bytes") as f64;
    assert!(bytes > 0.5 * 10e6 / 8.0 * 5.0, "{bytes} bytes");
    assert!(bytes < 1.5 * 10e6 / 8.0 * 5.0 + 20_000.0, "{bytes} bytes");
}

#[test]
fn noqueue_is_reported_as_unmeasured_and_silence_as_nothing() {
    if !require(&[Need::Root, Need::Sch("tbf")]) {
        return;
    }
    let pair = resolved_pair("trnoq");
    // A veth has no queue by default: every packet goes straight to the
    // driver and must count as "no enqueue record", never as a delay.
    let trace = start_trace(&pair.left, "left0", 3);
    pair.left.sh("ping -n -q -i 0.05 -c 20 10.77.0.2");
    let records = trace.finish();
    let s = summary(&records);
    eprintln!("noqueue: {s}");
    assert_eq!(u(s, "packets"), 0, "{s}");
    assert!(u(s, "no_enqueue_record") >= 20, "{s}");
    // A qdisc and no traffic: nothing at all.
    root_qdisc(&pair, "tbf rate 10mbit burst 10kb latency 50ms");
    let trace = start_trace(&pair.left, "left0", 2);
    let records = trace.finish();
    let s = summary(&records);
    eprintln!("idle tbf: {s}");
    // Only what the kernel sends by itself may appear (an ARP neighbour
    // probe, 42 bytes): no IP packet, and nothing unmeasured.
    let ip_packets: u64 = records
        .iter()
        .filter(|r| {
            r["kind"] == "flow" && !r["flow"].as_str().is_some_and(|f| f.starts_with("non-ip"))
        })
        .map(|r| u(r, "packets"))
        .sum();
    assert_eq!(ip_packets, 0, "{records:?}");
    assert!(u(s, "packets") <= 2, "{s}");
    assert_eq!(u(s, "no_enqueue_record"), 0, "{s}");
}

#[test]
fn bad_input_exits_2_and_attaches_nothing() {
    if !require(&[Need::Root, Need::Tool("bpftool", "version")]) {
        return;
    }
    let pair = Pair::new("trbad", 1);
    for (args, needle) in [
        (vec!["--iface", "nosuch0"], "no interface named 'nosuch0'"),
        (vec!["--iface", "left0", "--duration", "soon"], "--duration"),
        (vec!["--iface", "left0", "--duration", "0s"], "out of range"),
        (vec!["--iface", "left0", "--duration", "10"], "no unit"),
    ] {
        let out = pair
            .left
            .shaper()
            .arg("trace")
            .args(&args)
            .output()
            .expect("spawn shaper");
        let msg = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {msg}");
        assert!(msg.contains(needle), "{args:?}: {msg}");
    }
    // Nothing stayed attached: no raw tracepoint link of ours.
    let links = Command::new("bpftool")
        .args(["link", "show"])
        .output()
        .expect("bpftool link show");
    assert!(links.status.success(), "bpftool: {}", text(&links));
    let l = String::from_utf8_lossy(&links.stdout);
    assert!(
        !l.contains("trace_qdisc_enq"),
        "a tracer link was left: {l}"
    );
}
