//! What a lab run measured, per state and per load phase: the results that
//! `shaper lab` fills and the report, the plots and the JSON read.
//!
//! Units: ms for RTTs and kernel delays, percent for CPU shares, seconds
//! for times since a state was applied; bit/s in [`IperfReport`].
//! Non-goals: judging; the report draws the verdicts.

use serde_json::Value;

use super::{
    cli::LabConfig,
    readings::{QueueStats, TinStats},
    traffic::IperfReport,
};

/// One CPU sample over the second before `t_s`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuSample {
    /// Seconds since the state's sampler started (just after the state was
    /// applied).
    pub t_s: f64,
    /// Non-idle share of all CPUs, percent.
    pub busy_pct: f64,
    /// Softirq share, percent.
    pub softirq_pct: f64,
    /// No idle time at all in the interval (every CPU busy).
    pub zero_idle: bool,
}

/// The kernel's view of the WAN egress queueing delay (`shaper trace`).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelDelay {
    /// Median sojourn, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Packets traced.
    pub packets: u64,
    /// The tracer's summary record as it printed it.
    pub raw: Value,
}

/// One direction under load.
#[derive(Debug)]
pub struct LoadPhase {
    /// The bulk TCP streams.
    pub tcp: IperfReport,
    /// The UDP probe.
    pub udp: Option<IperfReport>,
    /// RTT samples during the measured time, ms.
    pub ping_ms: Vec<f64>,
    /// The tracer's figures, or why there are none.
    pub kernel_delay: Result<KernelDelay, String>,
    /// What each TX queue of the WAN device carried over the phase: the
    /// upload under a multi-queue root (`mq`, cake_mq); else empty.
    pub queues: Vec<QueueStats>,
    /// What each tin carried over the phase: the upload under the shaper
    /// or CAKE with tins; else empty.
    pub tins: Vec<TinStats>,
    /// The measured time (after the warm-up), in seconds on the state's CPU
    /// sample clock ([`CpuSample::t_s`]).
    pub window_s: (f64, f64),
}

/// Mean busy share of the CPU samples that lie wholly inside `window_s`
/// (a sample covers the second before its `t_s`), percent; `None` when no
/// sample does.
pub fn busy_within(samples: &[CpuSample], window_s: (f64, f64)) -> Option<f64> {
    let inside: Vec<f64> = samples
        .iter()
        .filter(|c| c.t_s - 1.0 >= window_s.0 && c.t_s <= window_s.1)
        .map(|c| c.busy_pct)
        .collect();
    (!inside.is_empty()).then(|| inside.iter().sum::<f64>() / inside.len() as f64)
}

/// One staircase step.
#[derive(Clone, Debug, PartialEq)]
pub struct StairStep {
    /// Streams running during the step.
    pub streams: u32,
    /// RTT samples during the step, ms.
    pub ping_ms: Vec<f64>,
}

/// Everything measured for one state.
#[derive(Debug)]
pub struct StateRun {
    /// Its `--states` name.
    pub name: &'static str,
    /// Its description, e.g. `cake 50Mbit`.
    pub label: String,
    /// Idle pings before the load, ms.
    pub idle_before_ms: Vec<f64>,
    /// Idle pings after, ms.
    pub idle_after_ms: Vec<f64>,
    /// Upload.
    pub up: LoadPhase,
    /// Download (shaped only when `download_shaped`).
    pub down: LoadPhase,
    /// The state shapes the download too (at the WAN ingress).
    pub download_shaped: bool,
    /// The staircase.
    pub staircase: Vec<StairStep>,
    /// The staircase's streams' reports, the first stream first.
    pub staircase_flows: Vec<IperfReport>,
    /// The hosts phase (`--hosts`).
    pub hosts: Option<super::hosts::HostsRun>,
    /// CPU samples over the whole state.
    pub cpu: Vec<CpuSample>,
    /// Seconds the state took.
    pub elapsed_s: f64,
}

/// The whole lab run.
#[derive(Debug)]
pub struct LabRun {
    /// What was asked.
    pub config: LabConfig,
    /// Per state, in order.
    pub states: Vec<StateRun>,
    /// `uname -r`.
    pub kernel: String,
    /// Seconds for everything.
    pub elapsed_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t_s: f64, busy_pct: f64) -> CpuSample {
        CpuSample {
            t_s,
            busy_pct,
            softirq_pct: 0.0,
            zero_idle: false,
        }
    }

    #[test]
    fn only_samples_wholly_inside_the_window_count() {
        let samples = [at(1.0, 90.0), at(2.0, 10.0), at(3.0, 30.0), at(4.0, 99.0)];
        // (1.5, 3.5): only the sample over (2, 3] lies inside.
        assert_eq!(busy_within(&samples, (1.5, 3.5)), Some(30.0));
        assert_eq!(busy_within(&samples, (1.0, 3.0)), Some(20.0));
        assert_eq!(busy_within(&samples, (3.2, 3.9)), None);
    }
}
