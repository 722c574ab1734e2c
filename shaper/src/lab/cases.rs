//! Traffic cases held against CAKE: the shapes of traffic users have, each
//! run under CAKE and under the shaper on the same testbed and compared in
//! the same run. The VM tests assert on them and the benchmark reports them,
//! so both run exactly these definitions.
//!
//! - [`lone_flow`]: one flow alone beside a 10 pps ping, for each path a
//!   lone flow can take through the router: forwarded TCP (cubic, bbr),
//!   forwarded UDP above the rate, TCP sent by the router itself, and a
//!   download through each ingress mode.
//! - [`bulk_beside_sparse`]: one bulk TCP flow beside 20 UDP flows of one
//!   datagram a second, and the ping.
//! - [`many_flows`]: `n` TCP uploads, no ping; split over both clients
//!   above 128 (iperf3's most streams per client).
//! - [`unequal`]: the two clients' flows differ, by congestion control
//!   (cubic beside bbr) or by RTT (two streams each over 10 and 80 ms, on
//!   a testbed of [`unequal_rtt_testbed`]). Figure: Jain's index over the
//!   clients ([`RunResult::jain`]).
//!
//! Flows that start and stop at set times are [`timed_cases`](super::timed_cases).
//!
//! Figures: [`first_ratio`] (the first flow spec's goodput over the rate)
//! and [`wire_ratio`] (what left the WAN port, from the root qdisc's bytes
//! read during the run). Units: ratios of the configured rate.
//!
//! Non-goals: pass or fail. The callers set their own thresholds.

use std::{path::Path, time::Duration};

use super::{FlowSpec, Host, RunResult, Scenario, State, TestbedOptions, Timing};
use crate::rate::Rate;

/// The ping beside a case: 10 packets a second.
pub const PING_INTERVAL: Duration = Duration::from_millis(100);

/// How often a case's run reads the shaper's counters and the WAN qdisc.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// One case: the same flows under CAKE and under the shaper.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Case {
    /// The name the benchmark's JSON and the tests use.
    pub name: String,
    /// CAKE on the path the flows take.
    pub cake: State,
    /// The shaper on the same path.
    pub shaper: State,
    /// The traffic, all started together.
    pub flows: Vec<FlowSpec>,
    /// A 10 pps ping from the client beside the flows.
    pub ping: bool,
}

impl Case {
    /// The scenario that runs this case under `state` for `timing`.
    pub fn scenario(&self, state: State, timing: Timing) -> Scenario {
        let mut s =
            Scenario::new(state, self.flows.clone(), timing).with_counter_samples(SAMPLE_EVERY);
        if self.ping {
            s = s.with_ping(Host::Client);
            s.ping_interval = PING_INTERVAL;
        }
        s
    }
}

pub(super) fn rate_of(s: &str) -> Rate {
    // Constant strings of this module, each a valid rate.
    s.parse().unwrap_or(Rate::MIN)
}

pub(super) fn shaper(bin: &Path, rate: Rate, extra: &[&str]) -> State {
    State::Shaper {
        bin: bin.to_path_buf(),
        rate,
        extra_args: extra.iter().map(|s| (*s).to_owned()).collect(),
    }
}

fn shaper_ingress(bin: &Path, rate: Rate, mode: &str) -> State {
    State::ShaperIngress {
        bin: bin.to_path_buf(),
        rate,
        extra_args: vec!["--ingress-mode".to_owned(), mode.to_owned()],
    }
}

/// The lone-flow cases at `rate`, each beside the ping: `tcp_fwd`,
/// `tcp_bbr_fwd`, `udp_fwd` (offered at 1.4 × the rate), `tcp_local`,
/// `down_police` and `down_ifb`.
pub fn lone_flow(bin: &Path, rate: Rate) -> Vec<Case> {
    let up = |name: &str, flow: FlowSpec| Case {
        name: name.to_owned(),
        cake: State::Cake { rate },
        shaper: shaper(bin, rate, &[]),
        flows: vec![flow],
        ping: true,
    };
    let down = |name: &str, mode: &str| Case {
        name: name.to_owned(),
        cake: State::cake_ingress(rate),
        shaper: shaper_ingress(bin, rate, mode),
        flows: vec![FlowSpec::tcp(Host::Client, 1).reversed()],
        ping: true,
    };
    let flood = Rate::from_bits_per_s(rate.bits_per_s() / 5 * 7).unwrap_or(rate);
    vec![
        up("tcp_fwd", FlowSpec::tcp(Host::Client, 1)),
        up("tcp_bbr_fwd", FlowSpec::tcp(Host::Client, 1).with_cc("bbr")),
        up("udp_fwd", FlowSpec::udp(Host::Client, flood)),
        up("tcp_local", FlowSpec::tcp(Host::Router, 1)),
        down("down_police", "police"),
        down("down_ifb", "ifb"),
    ]
}

/// Sparse flows beside the bulk flow of [`bulk_beside_sparse`].
pub const SPARSE_FLOWS: u32 = 20;

/// One bulk TCP upload beside [`SPARSE_FLOWS`] UDP flows of one 1000-byte
/// datagram a second (from the second client), and the ping.
pub fn bulk_beside_sparse(bin: &Path, rate: Rate) -> Case {
    let sparse = FlowSpec {
        streams: SPARSE_FLOWS,
        ..FlowSpec::udp(Host::Client2, rate_of("8kbit")).with_datagram_len(1000)
    };
    Case {
        name: "bulk_beside_sparse".to_owned(),
        cake: State::Cake { rate },
        shaper: shaper(bin, rate, &[]),
        flows: vec![FlowSpec::tcp(Host::Client, 1), sparse],
        ping: true,
    }
}

/// The most streams one iperf3 client runs.
const IPERF_MAX_STREAMS: u32 = 128;

/// `n` TCP uploads, from the client alone or, above 128, half from each
/// client; no ping.
pub fn many_flows(bin: &Path, rate: Rate, n: u32) -> Case {
    let flows = if n > IPERF_MAX_STREAMS {
        vec![
            FlowSpec::tcp(Host::Client, n / 2),
            FlowSpec::tcp(Host::Client2, n - n / 2),
        ]
    } else {
        vec![FlowSpec::tcp(Host::Client, n)]
    };
    Case {
        name: format!("many_flows_{n}"),
        cake: State::Cake { rate },
        shaper: shaper(bin, rate, &[]),
        flows,
        ping: false,
    }
}

/// The extra round-trip delays of the two clients in the RTT case of
/// [`unequal`].
pub const SHORT_RTT: Duration = Duration::from_millis(10);
/// See [`SHORT_RTT`].
pub const LONG_RTT: Duration = Duration::from_millis(80);

/// The testbed of `unequal_rtt`: the client over [`SHORT_RTT`], client2
/// over [`LONG_RTT`].
pub fn unequal_rtt_testbed() -> TestbedOptions {
    TestbedOptions {
        client_delay: SHORT_RTT,
        client2_delay: LONG_RTT,
        ..TestbedOptions::default()
    }
}

/// Unequal flows from the two clients: `cubic_beside_bbr` (one stream
/// each, on the default testbed) and `unequal_rtt` (two CUBIC streams
/// each, on [`unequal_rtt_testbed`]: one CUBIC flow over 80 ms spends long
/// stretches below its share after each congestion signal, which any
/// work-conserving scheduler hands to the other client, so two measure the
/// scheduler's fairness rather than one flow's recovery); no ping.
pub fn unequal(bin: &Path, rate: Rate) -> Vec<Case> {
    let case = |name: &str, flows: Vec<FlowSpec>| Case {
        name: name.to_owned(),
        cake: State::Cake { rate },
        shaper: shaper(bin, rate, &[]),
        flows,
        ping: false,
    };
    vec![
        case(
            "cubic_beside_bbr",
            vec![
                FlowSpec::tcp(Host::Client, 1).with_cc("cubic"),
                FlowSpec::tcp(Host::Client2, 1).with_cc("bbr"),
            ],
        ),
        case(
            "unequal_rtt",
            vec![
                FlowSpec::tcp(Host::Client, 2),
                FlowSpec::tcp(Host::Client2, 2),
            ],
        ),
    ]
}

/// The first flow spec's receiver goodput as a ratio of `rate`.
pub fn first_ratio(r: &RunResult, rate: Rate) -> f64 {
    r.flows
        .first()
        .map_or(0.0, |f| f.report.receiver_bps / rate.bits_per_s() as f64)
}

/// What left the router's WAN port while the flows sent (the root
/// qdisc's bytes, which count each GSO segment's headers under sch_fq and
/// CAKE alike), as a ratio of `rate`; `None` without a whole busy interval
/// to count. See [`busy_wire_ratio`] for the span.
pub fn wire_ratio(r: &RunResult, rate: Rate) -> Option<f64> {
    let series: Vec<(f64, u64)> = r.qdisc_series.iter().map(|(t, q)| (*t, q.bytes)).collect();
    busy_wire_ratio(&series, rate.bits_per_s() as f64)
}

/// Below this share of the rate, a sampling interval counts as idle.
const BUSY_SHARE: f64 = 0.5;

/// The wire rate over the span the flows were sending, from `series`
/// (seconds, cumulative bytes), as a ratio of `rate_bps`.
///
/// The series comes from the lab's clock, and the flows' traffic does not:
/// iperf3 starts sending after its process starts and its streams connect
/// (seconds, with hundreds of streams), so the idle intervals on either
/// side would dilute the figure. The span runs from the end of the first
/// interval at or above [`BUSY_SHARE`] of the rate to the start of the
/// last one, leaving out those two, which the traffic may have begun or
/// ended partway through. Slow start stays in (an overshoot there reaches
/// the modem too), and so do idle intervals inside the span.
fn busy_wire_ratio(series: &[(f64, u64)], rate_bps: f64) -> Option<f64> {
    let busy = |w: &[(f64, u64)]| {
        let ((t0, b0), (t1, b1)) = (w[0], w[1]);
        t1 > t0 && b1.saturating_sub(b0) as f64 * 8.0 / (t1 - t0) >= BUSY_SHARE * rate_bps
    };
    let first = series.windows(2).position(busy)?;
    let last = series.windows(2).rposition(busy)?;
    let (t0, b0) = series[first + 1];
    let (t1, b1) = series[last];
    (t1 > t0).then(|| b1.saturating_sub(b0) as f64 * 8.0 / (t1 - t0) / rate_bps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_are_named_and_shaped_as_documented() {
        let rate = rate_of("50mbit");
        let bin = Path::new("/bin/shaper");
        let names: Vec<String> = lone_flow(bin, rate).into_iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "tcp_fwd",
                "tcp_bbr_fwd",
                "udp_fwd",
                "tcp_local",
                "down_police",
                "down_ifb"
            ]
        );
        let udp = &lone_flow(bin, rate)[2].flows[0];
        assert_eq!(udp.bitrate, Some(rate_of("70mbit")));
        let many = many_flows(bin, rate, 256);
        let streams: Vec<u32> = many.flows.iter().map(|f| f.streams).collect();
        assert_eq!(streams, [128, 128]);
        assert_eq!(many_flows(bin, rate, 64).flows.len(), 1);
        let sparse = bulk_beside_sparse(bin, rate);
        assert_eq!(sparse.flows[1].streams, SPARSE_FLOWS);
        assert_eq!(sparse.flows[1].datagram_len, Some(1000));
        let unequal: Vec<String> = unequal(bin, rate).into_iter().map(|c| c.name).collect();
        assert_eq!(unequal, ["cubic_beside_bbr", "unequal_rtt"]);
        assert_eq!(unequal_rtt_testbed().client2_delay, LONG_RTT);
    }

    /// A series sampled every second from cumulative per-second bytes.
    fn series(per_s: &[u64]) -> Vec<(f64, u64)> {
        let mut total = 0;
        let mut out = vec![(0.0, 0)];
        for (i, b) in per_s.iter().enumerate() {
            total += b;
            out.push(((i + 1) as f64, total));
        }
        out
    }

    const RATE_BPS: f64 = 8_000.0;

    #[test]
    fn the_wire_figure_leaves_out_the_idle_time_before_and_after_the_flows() {
        // Three idle seconds while the streams connect, a partial first
        // second, five seconds 10% above the rate, a partial last second,
        // then idle.
        let s = series(&[0, 2, 1, 600, 1100, 1100, 1100, 1100, 1100, 900, 0, 0]);
        let w = busy_wire_ratio(&s, RATE_BPS).expect("a busy span");
        assert!((w - 1.1).abs() < 1e-9, "wire {w}");
        // The whole series would have hidden the overshoot.
        let whole = (s[11].1 - s[1].1) as f64 * 8.0 / 10.0 / RATE_BPS;
        assert!(whole < 0.8, "{whole}");
    }

    #[test]
    fn the_wire_figure_keeps_an_idle_gap_inside_the_busy_span() {
        let s = series(&[1000, 1000, 1000, 0, 1000, 1000, 1000]);
        let w = busy_wire_ratio(&s, RATE_BPS).expect("a busy span");
        assert!((w - 0.8).abs() < 1e-9, "wire {w}");
    }

    #[test]
    fn the_wire_figure_needs_a_whole_busy_interval() {
        assert_eq!(busy_wire_ratio(&series(&[0, 0, 0]), RATE_BPS), None);
        assert_eq!(busy_wire_ratio(&series(&[0, 1000, 0]), RATE_BPS), None);
        assert_eq!(
            busy_wire_ratio(&series(&[0, 1000, 1000, 0]), RATE_BPS),
            None
        );
        assert!(busy_wire_ratio(&series(&[0, 1000, 1000, 1000, 0]), RATE_BPS).is_some());
    }
}
