//! Bulk traffic for the lab: iperf3 servers and clients with their `-J`
//! reports parsed. (Latency probes are in [`ping`](super::ping).)
//!
//! - An [`IperfServer`] is `iperf3 -s -J -i 1 -p PORT -B ADDR`, one per flow
//!   spec (an iperf3 server runs one test at a time), stopped on drop.
//! - An [`IperfClient`] runs one [`FlowSpec`]: `iperf3 -c ADDR -p PORT -t T
//!   -O OMIT -i 1 -J --get-server-output -P N [-C CC] [-b BPS] [-u]`. `-O`
//!   comes before `-t`: the run takes OMIT + T seconds, and the results cover
//!   the last T only. `-b` is per stream.
//! - Its [`IperfReport`] takes goodput from the receiver side (bits the
//!   server got, after omit), retransmits from the sender, and the interval
//!   series (one-second intervals) from the server's own JSON report
//!   (`server_output_json`), so intervals count received bits too, not
//!   bytes written into a socket buffer.
//!
//! Units: bit/s as `f64`, seconds as `f64` in interval series (iperf3's
//! own).
//!
//! Non-goals: reverse or bidirectional tests, SCTP, IPv6.

use std::{net::Ipv4Addr, time::Duration};

use serde_json::Value;
use tracing::debug;

use super::{
    LabError,
    exec::Daemon,
    topology::{Host, Testbed},
};
use crate::rate::Rate;

/// How long an iperf3 run lasts and how it reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Measured time (`-t`), after the omitted start.
    pub duration: Duration,
    /// Warm-up excluded from the results (`-O`).
    pub omit: Duration,
}

impl Timing {
    /// `duration` measured after `omit`.
    pub fn new(duration: Duration, omit: Duration) -> Self {
        Self { duration, omit }
    }

    /// Omit plus measured time: how long the clients run.
    pub fn total(&self) -> Duration {
        self.omit + self.duration
    }
}

/// One iperf3 client: who sends, how many streams, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowSpec {
    /// The sending host (a client; the receiver is always the server).
    pub from: Host,
    /// Parallel streams (`-P`).
    pub streams: u32,
    /// TCP congestion control (`-C`), e.g. `cubic` or `bbr`; `None` for the
    /// namespace's default (cubic).
    pub cc: Option<String>,
    /// Per-stream target bitrate (`-b`): TCP paced by iperf3 itself, or the
    /// UDP send rate; `None` for unlimited TCP.
    pub bitrate: Option<Rate>,
    /// UDP (`-u`) instead of TCP; needs `bitrate`.
    pub udp: bool,
    /// Reverse (`-R`): the server sends toward `from` (a download).
    pub reverse: bool,
    /// UDP payload bytes per datagram (`-l`); `None` for iperf3's default
    /// (the path MTU's worth).
    pub datagram_len: Option<u32>,
    /// The IP TOS byte (`-S`), DSCP and ECN bits: `0xb8` is EF.
    pub tos: Option<u8>,
    /// To the server's second address ([`super::topology::SERVER_SECOND`]):
    /// another destination host, as far as isolation can tell.
    pub second_server: bool,
}

impl FlowSpec {
    /// `streams` bulk TCP streams from `from` with the default congestion
    /// control.
    pub fn tcp(from: Host, streams: u32) -> Self {
        Self {
            from,
            streams,
            cc: None,
            bitrate: None,
            udp: false,
            reverse: false,
            datagram_len: None,
            tos: None,
            second_server: false,
        }
    }

    /// One unresponsive UDP stream from `from` at `rate`.
    pub fn udp(from: Host, rate: Rate) -> Self {
        Self {
            from,
            streams: 1,
            cc: None,
            bitrate: Some(rate),
            udp: true,
            reverse: false,
            datagram_len: None,
            tos: None,
            second_server: false,
        }
    }

    /// The same with congestion control `cc`.
    pub fn with_cc(mut self, cc: &str) -> Self {
        self.cc = Some(cc.to_owned());
        self
    }

    /// The same with each stream limited to `rate` by iperf3.
    pub fn with_bitrate(mut self, rate: Rate) -> Self {
        self.bitrate = Some(rate);
        self
    }

    /// The same with UDP datagrams of `len` payload bytes: with `bitrate`
    /// this sets the packet rate (a sparse flow of 1 packet per second is
    /// `len` 1000 at 8 kbit/s).
    pub fn with_datagram_len(mut self, len: u32) -> Self {
        self.datagram_len = Some(len);
        self
    }

    /// With TOS byte `tos` (`-S`): `0xb8` marks EF.
    pub fn with_tos(mut self, tos: u8) -> Self {
        self.tos = Some(tos);
        self
    }

    /// The same in reverse: the server sends, `from` receives.
    pub fn reversed(mut self) -> Self {
        self.reverse = true;
        self
    }

    /// The same to (or, reversed, from) the server's second address.
    pub fn to_second_server(mut self) -> Self {
        self.second_server = true;
        self
    }

    /// The address of the server this flow talks to.
    pub fn server_addr(&self) -> Ipv4Addr {
        if self.second_server {
            super::topology::SERVER_SECOND
        } else {
            Host::Server.addr()
        }
    }

    /// A short description, e.g. `client 4×tcp bbr`.
    pub fn label(&self) -> String {
        let mut s = format!(
            "{} {}×{}",
            self.from.name(),
            self.streams,
            if self.udp { "udp" } else { "tcp" }
        );
        if let Some(cc) = &self.cc {
            s.push(' ');
            s.push_str(cc);
        }
        if let Some(b) = self.bitrate {
            s.push_str(&format!(" @{b}"));
        }
        if self.reverse {
            s.push_str(" reverse");
        }
        if self.second_server {
            s.push_str(" to the second server");
        }
        s
    }
}

/// An iperf3 server on `host`, listening on `port`; stopped on drop.
pub struct IperfServer {
    daemon: Daemon,
    port: u16,
    addr: Ipv4Addr,
}

impl IperfServer {
    /// Starts it and waits until the port listens.
    pub fn start(tb: &Testbed, host: Host, port: u16) -> Result<Self, LabError> {
        Self::start_at(tb, host, host.addr(), port)
    }

    /// The same, bound to `addr`, one of `host`'s addresses.
    pub fn start_at(tb: &Testbed, host: Host, addr: Ipv4Addr, port: u16) -> Result<Self, LabError> {
        let port_s = port.to_string();
        let mut cmd = tb.command(host, "iperf3");
        cmd.args([
            "-s",
            "-J",
            "-i",
            "1",
            "-p",
            &port_s,
            "-B",
            &addr.to_string(),
        ]);
        let mut daemon = Daemon::spawn(&mut cmd, "iperf3-server")?;
        // /proc/PID/net/tcp lists the sockets of PID's network namespace:
        // no process to spawn per poll.
        let pid = daemon.pid().unwrap_or(0);
        daemon.wait_until("listen", Duration::from_secs(20), |_| {
            Ok(["tcp", "tcp6"].iter().any(|t| {
                std::fs::read_to_string(format!("/proc/{pid}/net/{t}"))
                    .is_ok_and(|t| tcp_listens(&t, port))
            }))
        })?;
        Ok(Self { daemon, port, addr })
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its address.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// Whether it still runs (it should, until dropped).
    pub fn is_running(&mut self) -> bool {
        self.daemon.exited().is_none()
    }
}

/// True if a /proc/net/tcp table has a socket listening on `port`.
fn tcp_listens(table: &str, port: u16) -> bool {
    let local = format!(":{port:04X}");
    table.lines().skip(1).any(|l| {
        let mut f = l.split_whitespace();
        // sl local_address rem_address st ...; st 0A is TCP_LISTEN.
        let (Some(_), Some(addr), Some(_), Some(st)) = (f.next(), f.next(), f.next(), f.next())
        else {
            return false;
        };
        addr.ends_with(&local) && st == "0A"
    })
}

/// How long past its planned time a client may run before it counts as
/// hung.
pub(crate) const CLIENT_GRACE: Duration = Duration::from_secs(30);

/// A running iperf3 client.
pub struct IperfClient {
    daemon: Daemon,
    limit: Duration,
}

impl IperfClient {
    /// Starts `spec` against `server`.
    pub fn spawn(
        tb: &Testbed,
        spec: &FlowSpec,
        server: &IperfServer,
        timing: &Timing,
    ) -> Result<Self, LabError> {
        if spec.udp && spec.bitrate.is_none() {
            return Err(LabError::Invalid {
                detail: format!("UDP flow `{}` needs a bitrate", spec.label()),
            });
        }
        let secs = |d: Duration| format!("{:.3}", d.as_secs_f64());
        let mut cmd = tb.command(spec.from, "iperf3");
        cmd.args([
            "-c",
            &server.addr().to_string(),
            "-p",
            &server.port().to_string(),
        ])
        .args(["-t", &secs(timing.duration), "-O", &secs(timing.omit)])
        .args(["-i", &secs(REPORT_INTERVAL), "-J", "--get-server-output"])
        .args(["-P", &spec.streams.to_string()]);
        if let Some(cc) = &spec.cc {
            cmd.args(["-C", cc]);
        }
        if let Some(b) = spec.bitrate {
            cmd.args(["-b", &b.bits_per_s().to_string()]);
        }
        if spec.udp {
            cmd.arg("-u");
        }
        if let Some(len) = spec.datagram_len {
            cmd.args(["-l", &len.to_string()]);
        }
        if spec.reverse {
            cmd.arg("-R");
        }
        if let Some(tos) = spec.tos {
            cmd.args(["-S", &tos.to_string()]);
        }
        let daemon = Daemon::spawn(&mut cmd, "iperf3-client")?;
        Ok(Self {
            daemon,
            limit: timing.total() + CLIENT_GRACE,
        })
    }

    /// Whether the client is still sending (or setting up, or reporting).
    pub fn running(&mut self) -> bool {
        self.daemon.exited().is_none()
    }

    /// Waits for the end of the run and parses the report.
    pub fn wait(mut self) -> Result<IperfReport, LabError> {
        let (status, output) = self.daemon.wait(self.limit)?;
        let command = self.daemon.command().to_owned();
        let report = IperfReport::parse(&output).map_err(|detail| LabError::Parse {
            command: command.clone(),
            detail: format!("{detail}; output: {}", truncate(&output, 2000)),
        })?;
        if !status.success() {
            return Err(LabError::CommandFailed {
                command,
                status: status.to_string(),
                output: report.error.unwrap_or_else(|| truncate(&output, 2000)),
            });
        }
        debug!(%command, bps = report.receiver_bps, "iperf3 done");
        Ok(report)
    }
}

/// iperf3's reporting period (`-i`).
pub const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// One reporting interval, as the receiver saw it. iperf3 restarts the
/// clock when the omitted warm-up ends: `start` of the first measured
/// interval is 0 again.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    /// Start, seconds since the test began (omitted time included).
    pub start: f64,
    /// End, seconds.
    pub end: f64,
    /// Received bit/s over the interval.
    pub bps: f64,
    /// Inside the omitted warm-up.
    pub omitted: bool,
}

/// What one iperf3 client measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IperfReport {
    /// Goodput at the receiver over the measured time, all streams, bit/s.
    pub receiver_bps: f64,
    /// Sending rate over the measured time, bit/s.
    pub sender_bps: f64,
    /// Goodput per stream, bit/s: the receiver's for TCP; for UDP iperf3
    /// reports only the sending rate per stream.
    pub stream_bps: Vec<f64>,
    /// TCP retransmissions (0 for UDP).
    pub retransmits: u64,
    /// UDP datagrams lost, percent (0 for TCP).
    pub lost_percent: f64,
    /// The receiver's interval series (the sender's if the server sent none).
    pub intervals: Vec<Interval>,
    /// iperf3's own error message, if it reported one.
    pub error: Option<String>,
}

impl IperfReport {
    /// Parses `iperf3 -J` output (text before the first `{` and after the
    /// object, e.g. warnings on stderr, is ignored).
    pub fn parse(output: &str) -> Result<Self, String> {
        let start = output.find('{').ok_or("no JSON object in the output")?;
        let v: Value = serde_json::Deserializer::from_str(&output[start..])
            .into_iter::<Value>()
            .next()
            .ok_or("no JSON object in the output")?
            .map_err(|e| e.to_string())?;
        let error = v.get("error").and_then(Value::as_str).map(str::to_owned);
        let end = v.get("end");
        let f = |v: Option<&Value>, k: &str| v.and_then(|v| v.get(k)).and_then(Value::as_f64);
        let sum_received = end.and_then(|e| e.get("sum_received"));
        let sum_sent = end.and_then(|e| e.get("sum_sent"));
        let streams = end
            .and_then(|e| e.get("streams"))
            .and_then(Value::as_array)
            .map(|s| s.as_slice())
            .unwrap_or_default();
        let stream_bps: Vec<f64> = streams
            .iter()
            .map(|s| {
                f(s.get("receiver"), "bits_per_second")
                    .or_else(|| f(s.get("udp"), "bits_per_second"))
                    .unwrap_or(0.0)
            })
            .collect();
        let lost_percent = f(end.and_then(|e| e.get("sum")), "lost_percent").unwrap_or(0.0);
        // For UDP too, `sum_received` counts the bytes that arrived.
        let receiver_bps = match f(sum_received, "bits_per_second") {
            Some(b) => b,
            None if error.is_some() => 0.0,
            None => return Err("no end.sum_received in the report".to_owned()),
        };
        let series = v
            .get("server_output_json")
            .and_then(|s| s.get("intervals"))
            .or_else(|| v.get("intervals"))
            .and_then(Value::as_array)
            .map(|a| a.as_slice())
            .unwrap_or_default();
        let intervals = series
            .iter()
            .filter_map(|i| {
                let sum = i.get("sum")?;
                Some(Interval {
                    start: f(Some(sum), "start")?,
                    end: f(Some(sum), "end")?,
                    bps: f(Some(sum), "bits_per_second")?,
                    omitted: sum.get("omitted").and_then(Value::as_bool).unwrap_or(false),
                })
            })
            .collect();
        Ok(Self {
            receiver_bps,
            sender_bps: f(sum_sent, "bits_per_second").unwrap_or(0.0),
            stream_bps,
            retransmits: sum_sent
                .and_then(|s| s.get("retransmits"))
                .and_then(Value::as_u64)
                .unwrap_or(0),
            lost_percent,
            intervals,
            error,
        })
    }
}

impl Interval {
    /// Whether the interval spans a whole reporting period. The server
    /// closes its last interval when the client stops, tens of ms into
    /// the period; a rate over so short a span swings by tens of percent
    /// with the scheduling jitter of the moment it was cut.
    pub fn is_whole(&self) -> bool {
        // A tenth of the period covers the timer's slack on a busy host.
        self.end - self.start >= 0.9 * REPORT_INTERVAL.as_secs_f64()
    }
}

impl IperfReport {
    /// The measured intervals that show the steady rate: after the
    /// warm-up, without the first (it carries what was queued when the
    /// warm-up ended) and without any cut short.
    pub fn steady_intervals(&self) -> impl Iterator<Item = &Interval> {
        self.intervals
            .iter()
            .filter(|i| !i.omitted)
            .skip(1)
            .filter(|i| i.is_whole())
    }
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests;
