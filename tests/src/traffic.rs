//! Traffic for the namespace tests: static neighbours on a [`Pair`], an
//! iperf3 server that is listening before the test goes on, and iperf3's
//! `--json` report read through serde.
//!
//! Non-goals: traffic generation of our own (the lab's `shaper::lab`
//! owns that); reading iperf3's human output.

use std::{
    process::{Child, Output, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::topo::{NamedNs, Pair, text};

/// iperf3's default port.
pub const IPERF3_PORT: u16 = 5201;

/// Permanent neighbour entries both ways on a [`Pair`], so no ARP runs
/// during a measurement.
pub fn static_neighbours(pair: &Pair) {
    let lm = pair.left.sh("cat /sys/class/net/left0/address");
    let rm = pair.right.sh("cat /sys/class/net/right0/address");
    pair.left.sh(&format!(
        "ip neigh replace 10.77.0.2 lladdr {} dev left0 nud permanent",
        rm.trim()
    ));
    pair.right.sh(&format!(
        "ip neigh replace 10.77.0.1 lladdr {} dev right0 nud permanent",
        lm.trim()
    ));
}

/// `iperf3 -s -1` (one test, then exit) in a namespace; killed on drop if
/// still running.
pub struct Iperf3Server {
    child: Option<Child>,
}

impl Iperf3Server {
    /// Starts `iperf3 -s -1 -p PORT ARGS` in `ns` and returns once it
    /// listens (iperf3 takes a while under emulation). Panics if it
    /// exits or does not listen within 30 s.
    pub fn start(ns: &NamedNs, port: u16, args: &[&str]) -> Self {
        let child = ns
            .command("iperf3")
            .args(["-s", "-1", "-p", &port.to_string()])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn iperf3 -s");
        let mut server = Self { child: Some(child) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ns
            .sh(&format!("ss -Hltn 'sport = :{port}'"))
            .contains(&format!(":{port}"))
        {
            let exited = server
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            assert!(exited.is_none(), "iperf3 -s exited: {exited:?}");
            assert!(
                Instant::now() < deadline,
                "iperf3 -s did not listen on {port} in 30 s"
            );
            sleep(Duration::from_millis(100));
        }
        server
    }

    /// Waits for the server to end (after its one test).
    pub fn wait(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

impl Drop for Iperf3Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The report of an `iperf3 --json` client run; panics (with its output)
/// if the run failed or printed no JSON.
pub fn iperf3_report(out: &Output) -> Value {
    assert!(out.status.success(), "iperf3 failed: {}", text(out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("iperf3 --json printed no JSON ({e}): {}", text(out)))
}

/// `end.sum_received.bits_per_second` of a TCP report.
pub fn received_bits_per_s(report: &Value) -> f64 {
    report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or_else(|| panic!("no end.sum_received.bits_per_second in {report}"))
}
