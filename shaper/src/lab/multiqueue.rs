//! Traffic over a WAN device with several TX queues: which queue each flow
//! leaves by, where the router's receive work runs, and the figures that
//! say whether the queues share one rate and one fairness.
//!
//! - **Steering** ([`steer`]): a `clsact` filter per client address at
//!   `wan0`'s egress (`flower src_ip`, `skbedit queue_mapping`), which the
//!   kernel keeps when it picks the queue (Linux ≥ 5.19). Without a rule
//!   the veth picks a queue by the flow's hash, as a NIC without XPS does.
//! - **RPS** ([`set_rps`]): `rps_cpus` of the router's receive queues
//!   (`lan1`, `lan2`, `wan0`) set to every CPU, so each flow's forwarding,
//!   and with it the egress classifier, runs on the CPU its hash picks
//!   rather than the sender's. [`rps_handoffs`] counts the packets the
//!   kernel handed to another CPU that way (`received_rps` of
//!   /proc/net/softnet_stat), so a run can show that RPS took effect.
//! - **Cases** ([`MqCase`]): (a) one flow alone, (b) 8 flows from one
//!   client, (c) one flow from the client beside 8 from the second client,
//!   each with its steering ([`MqCase::steering`]).
//! - **Figures** ([`MqFigures`]): what `docs/pacer.md` ("Across TX queues")
//!   holds the shaper to, measured under any state.
//!
//! Invariants: steering and RPS change only the router's namespace, and
//! [`unsteer`] / `set_rps(.., false)` put back what a fresh testbed has (no
//! clsact on `wan0`, `rps_cpus` 0).
//!
//! Units: goodput as a ratio of the configured rate; a flow's share as a
//! ratio of an equal share of what all flows carried.
//!
//! Non-goals: XPS or IRQ affinity (veths have neither), more CPUs than the
//! machine's.

use serde::Serialize;

use super::{
    FlowSpec, LabError, RunResult, Scenario, State, Testbed, Timing, run_scenario, stats,
    topology::Host,
};
use crate::rate::Rate;

/// A client and the TX queue (from 0) its flows are steered onto.
pub type Rule = (Host, u32);

/// A multi-queue traffic case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MqCase {
    /// (a) One flow alone, from the client.
    Lone,
    /// (b) 8 flows from the client.
    Spread,
    /// (c) One flow from the client beside 8 from the second client.
    OneBeside8,
}

impl MqCase {
    /// Its letter.
    pub fn letter(self) -> char {
        match self {
            MqCase::Lone => 'a',
            MqCase::Spread => 'b',
            MqCase::OneBeside8 => 'c',
        }
    }

    /// Its flows.
    pub fn flows(self) -> Vec<FlowSpec> {
        match self {
            MqCase::Lone => vec![FlowSpec::tcp(Host::Client, 1)],
            MqCase::Spread => vec![FlowSpec::tcp(Host::Client, 8)],
            MqCase::OneBeside8 => vec![
                FlowSpec::tcp(Host::Client, 1),
                FlowSpec::tcp(Host::Client2, 8),
            ],
        }
    }

    /// Where its flows are steered when steered: (a) onto queue 2, (b)
    /// nowhere (the 8 flows hash over the queues; all on one has
    /// probability 4^-7 with 4 queues), (c) the lone flow onto queue 0 and
    /// the eight onto queue 1, where a rate split per queue would give the
    /// lone flow its queue's part.
    pub fn steering(self) -> Vec<Rule> {
        match self {
            MqCase::Lone => vec![(Host::Client, 2)],
            MqCase::Spread => Vec::new(),
            MqCase::OneBeside8 => vec![(Host::Client, 0), (Host::Client2, 1)],
        }
    }
}

/// Steers each client's flows onto its TX queue at `wan0`'s egress; no
/// rules: nothing to do.
pub fn steer(tb: &Testbed, rules: &[Rule]) -> Result<(), LabError> {
    if rules.is_empty() {
        return Ok(());
    }
    let router = tb.ns(Host::Router);
    let dev = tb.wan_dev();
    router.tc(&["qdisc", "add", "dev", dev, "clsact"])?;
    for (host, queue) in rules {
        let src = host.addr().to_string();
        let queue = queue.to_string();
        router.tc(&[
            "filter",
            "add",
            "dev",
            dev,
            "egress",
            "protocol",
            "ip",
            "prio",
            "1",
            "flower",
            "src_ip",
            &src,
            "action",
            "skbedit",
            "queue_mapping",
            &queue,
        ])?;
    }
    Ok(())
}

/// Removes what [`steer`] added.
pub fn unsteer(tb: &Testbed, rules: &[Rule]) -> Result<(), LabError> {
    if !rules.is_empty() {
        tb.ns(Host::Router)
            .tc(&["qdisc", "del", "dev", tb.wan_dev(), "clsact"])?;
    }
    Ok(())
}

/// The router's devices that receive the cases' traffic: the clients'
/// uploads and the server's ACKs.
const RPS_DEVICES: [&str; 3] = ["lan1", "lan2", "wan0"];

/// Sets `rps_cpus` of every receive queue of the router's devices to every
/// online CPU (`on`) or to none. Returns the mask written. The write goes
/// through `ip netns exec`, whose private /sys shows the router's devices.
pub fn set_rps(tb: &Testbed, on: bool) -> Result<u64, LabError> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get().min(63));
    let mask: u64 = if on { (1u64 << cpus) - 1 } else { 0 };
    let files: Vec<String> = RPS_DEVICES
        .iter()
        .map(|d| format!("/sys/class/net/{d}/queues/rx-*/rps_cpus"))
        .collect();
    let script = format!(
        "for f in {}; do echo {mask:x} > \"$f\" || exit 1; done",
        files.join(" ")
    );
    super::exec::run(std::process::Command::new("ip").args([
        "netns",
        "exec",
        tb.ns(Host::Router).name(),
        "sh",
        "-c",
        &script,
    ]))?;
    Ok(mask)
}

/// Packets handed to another CPU by RPS so far, summed over CPUs
/// (`received_rps`, the tenth column of /proc/net/softnet_stat, in hex).
pub fn rps_handoffs() -> Result<u64, LabError> {
    let path = "/proc/net/softnet_stat";
    let text = std::fs::read_to_string(path).map_err(|e| LabError::Parse {
        command: format!("reading {path}"),
        detail: e.to_string(),
    })?;
    text.lines()
        .map(|l| {
            l.split_whitespace()
                .nth(9)
                .and_then(|f| u64::from_str_radix(f, 16).ok())
                .ok_or_else(|| LabError::Parse {
                    command: format!("reading {path}"),
                    detail: format!("no received_rps column in {l:?}"),
                })
        })
        .sum()
}

/// Runs `flows` under `state` with the clients steered by `rules`.
pub fn run_steered(
    tb: &Testbed,
    state: State,
    flows: Vec<FlowSpec>,
    rules: &[Rule],
    timing: Timing,
) -> Result<RunResult, LabError> {
    steer(tb, rules)?;
    let r = run_scenario(tb, &Scenario::new(state, flows, timing));
    unsteer(tb, rules)?;
    r
}

/// Each stream's goodput, bit/s, over every flow spec of a run.
pub fn stream_bps(r: &RunResult) -> Vec<f64> {
    r.flows
        .iter()
        .flat_map(|f| f.report.stream_bps.iter().copied())
        .collect()
}

/// What each steady interval carried, of `rate` (the first flow spec's
/// streams together; `IperfReport::steady_intervals`).
pub fn interval_ratios(r: &RunResult, rate: Rate) -> Vec<f64> {
    let Some(first) = r.flows.first() else {
        return Vec::new();
    };
    first
        .report
        .steady_intervals()
        .map(|i| i.bps / rate.bits_per_s() as f64)
        .collect()
}

/// The least stream's goodput as a ratio of an equal share of the
/// streams' total; 0 without streams.
pub fn least_share(streams: &[f64]) -> f64 {
    let total: f64 = streams.iter().sum();
    if streams.is_empty() || total <= 0.0 {
        return 0.0;
    }
    let least = streams.iter().copied().fold(f64::INFINITY, f64::min);
    least / (total / streams.len() as f64)
}

/// The largest of `v`, 0 when empty.
pub fn most(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// One state's figures over cases (a) to (c).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MqFigures {
    /// (a): the lone flow's goodput, of the rate.
    pub single_flow_ratio: f64,
    /// (b): the most any 1 s interval after the first carried, of the rate.
    pub sum_ratio_max_1s: f64,
    /// (b): the least flow's goodput, of an equal share.
    pub min_flow_share_ratio: f64,
    /// (c): Jain's index over the 9 flows.
    pub jain_1v8: f64,
}

/// Runs cases (a) to (c) under `state` at `rate`, steered as
/// [`MqCase::steering`] says when `steered`, else hashed.
pub fn measure(
    tb: &Testbed,
    state: &State,
    rate: Rate,
    timing: Timing,
    steered: bool,
) -> Result<MqFigures, LabError> {
    let run = |case: MqCase| {
        let rules = if steered { case.steering() } else { Vec::new() };
        run_steered(tb, state.clone(), case.flows(), &rules, timing)
    };
    let lone = run(MqCase::Lone)?;
    let spread = run(MqCase::Spread)?;
    let one_beside_8 = run(MqCase::OneBeside8)?;
    Ok(MqFigures {
        single_flow_ratio: lone.ratio(rate),
        sum_ratio_max_1s: most(&interval_ratios(&spread, rate)),
        min_flow_share_ratio: least_share(&stream_bps(&spread)),
        jain_1v8: stats::jain(&stream_bps(&one_beside_8)).unwrap_or(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_share_is_of_an_equal_share_of_the_total() {
        assert_eq!(least_share(&[]), 0.0);
        assert_eq!(least_share(&[0.0, 0.0]), 0.0);
        assert!((least_share(&[1.0, 1.0, 2.0]) - 0.75).abs() < 1e-12);
        assert_eq!(most(&[0.5, 1.01, 0.9]), 1.01);
    }

    #[test]
    fn cases_carry_their_flows_and_steering() {
        let streams = |c: MqCase| c.flows().iter().map(|f| f.streams).sum::<u32>();
        assert_eq!(streams(MqCase::Lone), 1);
        assert_eq!(streams(MqCase::Spread), 8);
        assert_eq!(streams(MqCase::OneBeside8), 9);
        assert!(MqCase::Spread.steering().is_empty());
        assert_eq!(
            MqCase::OneBeside8.steering(),
            vec![(Host::Client, 0), (Host::Client2, 1)]
        );
    }
}
