//! `shaper run`'s telemetry as a user sees it, on a kernel with sch_fq (the
//! VM's; elsewhere it skips with a reason): NDJSON records with `--json`,
//! the Prometheus endpoint with `--metrics`, and plain lines when stdout is
//! a pipe. Two TCP uploads and a ping run through a veth shaped at 20 mbit;
//! the records must name those flows, give the TCP flows the queueing delay
//! and the ping none, add up to about the rate, and lose nothing.

use std::{
    process::{Child, Stdio},
    thread::sleep,
    time::Duration,
};

use serde_json::Value;
use shaper_tests::{
    shaper_proc::ShaperProc,
    skip::{Need, require},
    topo::{Pair, text},
    traffic::{IPERF3_PORT, Iperf3Server},
};

/// What every test here needs: root, sch_fq and the traffic tools.
const NEEDS: &[Need<'static>] = &[
    Need::Root,
    Need::Sch("fq"),
    Need::Tool("iperf3", "--version"),
    Need::Tool("bash", "--version"),
];

/// Starts `shaper run` on left0 at 20 mbit with `args`; returns once it
/// shapes.
fn start<'a>(pair: &'a Pair, args: &[&str]) -> ShaperProc<'a> {
    let mut all = vec!["--rate", "20mbit"];
    all.extend_from_slice(args);
    ShaperProc::start(Some(&pair.left), "left0", &all)
}

/// Stops the run with SIGTERM, which must succeed; its stdout and stderr.
fn stop(mut run: ShaperProc<'_>) -> (String, String) {
    let exit = run.sigterm();
    assert!(exit.status.success(), "shaper run failed: {}", exit.text());
    (exit.stdout, exit.stderr)
}

/// Two TCP streams for `secs` and a ping every 100 ms, left to right.
fn load(pair: &Pair, secs: u32) -> (Iperf3Server, Child, Child) {
    let server = Iperf3Server::start(&pair.right, IPERF3_PORT, &["-B", "10.77.0.2"]);
    let client = pair
        .left
        .command("iperf3")
        .args(["-c", "10.77.0.2", "-P", "2", "-t", &secs.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("iperf3 client");
    let ping = pair
        .left
        .command("ping")
        .args(["-i", "0.1", "-w", &secs.to_string(), "10.77.0.2"])
        .stdout(Stdio::null())
        .spawn()
        .expect("ping");
    (server, client, ping)
}

/// GET /metrics from inside the left namespace, with bash's /dev/tcp.
fn scrape(pair: &Pair, port: u16) -> String {
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port}; printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3"
    );
    let out = pair
        .left
        .command("bash")
        .args(["-c", &script])
        .output()
        .expect("run bash");
    assert!(out.status.success(), "scrape failed: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn json_records_and_metrics_describe_the_flows() {
    if !require(NEEDS) {
        return;
    }
    let pair = Pair::new("tel", 1);
    let run = start(
        &pair,
        &["--json", "--sample", "4", "--metrics", "127.0.0.1:9464"],
    );
    let (server, mut client, mut ping) = load(&pair, 8);
    sleep(Duration::from_secs(5));
    let metrics = scrape(&pair, 9464);
    let _ = client.wait();
    let _ = ping.wait();
    server.wait();
    let (stdout, stderr) = stop(run);

    // Metrics: exact counters, the delay summary, per-flow series.
    // The request is HTTP/1.0, and the server answers in the client's version.
    assert!(metrics.starts_with("HTTP/1.0 200 OK"), "{metrics}");
    let packets: f64 = metrics
        .lines()
        .find(|l| l.starts_with("shaper_packets_total{iface=\"left0\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no shaper_packets_total: {metrics}"));
    assert!(packets > 500.0, "{metrics}");
    assert!(metrics.contains("shaper_delay_seconds{iface=\"left0\",quantile=\"0.99\"}"));
    assert!(
        metrics.contains("shaper_flow_rate_bytes_per_second{iface=\"left0\",flow=\"10.77.0.1:"),
        "{metrics}"
    );

    // NDJSON: every line parses; the last is the summary.
    let records: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let summary = records.last().expect("records");
    eprintln!("summary: {summary}\nstderr: {stderr}");
    assert_eq!(summary["kind"], "summary");
    assert_eq!(summary["iface"], "left0");
    assert_eq!(summary["events_lost"], 0);
    assert_eq!(summary["events_dropped_user"], 0);
    assert!(
        summary["flow_starts"].as_u64().unwrap_or(0) >= 3,
        "{summary}"
    );
    let intervals = records.iter().filter(|r| r["kind"] == "interval").count();
    assert!(intervals >= 5, "{intervals} interval records");

    // The last interval's flows: the two uploads carry the queue, the ping
    // none; their estimated rates add up to about 20 Mbit/s.
    let flows: Vec<&Value> = records.iter().filter(|r| r["kind"] == "flow").collect();
    let uploads: Vec<&&Value> = flows
        .iter()
        .filter(|f| {
            f["flow"]
                .as_str()
                .is_some_and(|s| s.contains("> 10.77.0.2:5201 tcp"))
        })
        .collect();
    assert!(!uploads.is_empty(), "no upload flows in {flows:?}");
    let pings: Vec<&&Value> = flows
        .iter()
        .filter(|f| f["flow"].as_str().is_some_and(|s| s.ends_with("icmp")))
        .collect();
    assert!(!pings.is_empty(), "no ping flow in {flows:?}");
    let upload_rate = {
        // Per interval (flow records follow their interval record), the
        // sum of the uploads' rates; take the median interval.
        let mut sums = Vec::new();
        let mut cur = 0.0;
        for r in &records {
            if r["kind"] == "interval" {
                sums.push(cur);
                cur = 0.0;
            } else if r["kind"] == "flow"
                && r["flow"].as_str().is_some_and(|s| s.contains(":5201 tcp"))
            {
                cur += r["rate_bytes_per_s"].as_f64().unwrap_or(0.0) * 8.0;
            }
        }
        sums.push(cur);
        sums.retain(|s| *s > 0.0);
        sums.sort_by(f64::total_cmp);
        sums.get(sums.len() / 2).copied().unwrap_or(0.0)
    };
    eprintln!(
        "median interval upload rate estimate {:.2} Mbit/s",
        upload_rate / 1e6
    );
    assert!(
        (12e6..=26e6).contains(&upload_rate),
        "uploads estimated at {upload_rate} bit/s against a 20 mbit rate"
    );
    let p99 = |f: &Value| f["delay_p99_ns"].as_u64();
    let upload_p99 = uploads.iter().filter_map(|f| p99(f)).max().unwrap_or(0);
    let ping_p99 = pings
        .iter()
        .filter_map(|f| p99(f))
        .max()
        .unwrap_or(u64::MAX);
    eprintln!("upload p99 {upload_p99} ns, ping p99 {ping_p99} ns");
    assert!(
        upload_p99 > 1_000_000,
        "uploads were never queued: {upload_p99} ns"
    );
    assert!(
        ping_p99 < upload_p99 / 2,
        "the sparse ping waited like the bulk flows: {ping_p99} vs {upload_p99} ns"
    );
}

#[test]
fn piped_output_is_plain_lines_and_ends_with_a_summary() {
    if !require(NEEDS) {
        return;
    }
    let pair = Pair::new("telp", 1);
    let run = start(&pair, &[]);
    let (server, mut client, mut ping) = load(&pair, 3);
    let _ = client.wait();
    let _ = ping.wait();
    server.wait();
    let (stdout, stderr) = stop(run);
    let lines: Vec<&str> = stdout.lines().collect();
    let joined = lines.join("\n");
    eprintln!("{joined}\n{stderr}");
    assert!(
        lines
            .iter()
            .filter(|l| l.starts_with("shaper left0 t="))
            .count()
            >= 2,
        "{joined}"
    );
    assert!(!joined.contains('\x1b'), "escape codes in piped output");
    let last = lines.last().expect("output");
    assert!(
        last.contains("events lost: kernel 0, controller 0"),
        "{last}"
    );
}
