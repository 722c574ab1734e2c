//! The telemetry scale benchmark (`shaper bench --scale-part`): does the
//! controller keep up with 100k active flows, and in how much memory?
//!
//! Method: the egress classifier is loaded as `shaper run` loads it
//! (`attach::load`, telemetry on at the given sampling, a flow table big
//! enough for the flows), and the telemetry pipeline runs as `shaper run`
//! runs it, on a tokio worker thread. The main thread drives
//! `BPF_PROG_TEST_RUN` over synthetic frames of `flows` distinct 5-tuples,
//! `rounds` times round-robin, as fast as the kernel takes them (each
//! flow's first packet is a flow-start record, then 1 in N is sampled).
//! At the end: the pipeline is drained and stopped, and the process's
//! resident set (VmRSS, and its peak VmHWM) is read from /proc/self/status.
//! The process holds only what the controller holds plus the frames, so
//! this is the controller's footprint; run it in a process of its own
//! (the host part does) so no earlier allocation inflates it.
//!
//! Reports: records sent and received, records per second, records lost
//! (kernel ring full, and controller ring full), flows tracked, RSS.
//!
//! Units: bytes, seconds, records per second.

use std::{os::fd::AsFd, time::Instant};

use anyhow::{Context, Result, bail};
use aya::programs::SchedClassifier;
use serde::Serialize;
use shaper_common::{
    EGRESS_PROGRAM,
    config::{FLAG_TELEMETRY, PacerConfig, sample_threshold},
    rate::ScaledRate,
};

use crate::{
    attach,
    bench::frames::{Ecn, tcp_frame},
    bpf::test_run::run_skb,
    telemetry::{Output, Pipeline, PipelineOptions},
};

/// Options of the scale part.
#[derive(Clone, Copy, Debug)]
pub struct ScaleOptions {
    /// Distinct flows.
    pub flows: u32,
    /// Packets per flow.
    pub rounds: u32,
    /// Telemetry sampling, 1 in N.
    pub sample_every: u32,
    /// The pacer's rate, bytes/s.
    pub rate_bytes_per_s: u64,
}

impl Default for ScaleOptions {
    fn default() -> Self {
        Self {
            flows: 100_000,
            rounds: 10,
            sample_every: shaper_common::config::DEFAULT_SAMPLE_EVERY,
            rate_bytes_per_s: 1_000_000,
        }
    }
}

/// What the scale part measured.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleReport {
    /// Distinct flows driven.
    pub flows: u32,
    /// Packets run through the classifier.
    pub packets: u64,
    /// The sampling, 1 in N.
    pub sample_every: u32,
    /// Records the classifier wrote (its `events_sent` counter).
    pub records_sent: u64,
    /// Records the aggregator took in.
    pub records_received: u64,
    /// Records lost in the kernel (ring full).
    pub records_lost_kernel: u64,
    /// Records lost between reader and aggregator (SPSC ring full).
    pub records_lost_user: u64,
    /// Records received per second of driving.
    pub records_per_s: f64,
    /// Packets per second driven.
    pub packets_per_s: f64,
    /// Seconds spent driving packets.
    pub drive_s: f64,
    /// Flows in the aggregator's table at the end.
    pub flows_tracked: u64,
    /// Flows holding a delay histogram at the end.
    pub flow_histograms: u64,
    /// Resident set at the end, MiB.
    pub rss_mib: f64,
    /// Peak resident set, MiB.
    pub peak_rss_mib: f64,
    /// Resident set after loading and starting the pipeline, before any
    /// packet, MiB.
    pub rss_before_mib: f64,
}

/// Reads a `kB` field of /proc/self/status, in MiB.
fn status_mib(field: &str) -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Runs the scale part.
pub fn run(opts: &ScaleOptions) -> Result<ScaleReport> {
    let rate = ScaledRate::from_bytes_per_s(opts.rate_bytes_per_s)
        .context("the scale part's rate is out of range")?;
    let mut config = PacerConfig::new(opts.rate_bytes_per_s, rate);
    config.flags |= FLAG_TELEMETRY;
    config.sample_threshold = sample_threshold(opts.sample_every);
    // Two slots per flow, rounded up to a power of two, in sets of 8.
    let sets = (u64::from(opts.flows) * 2 / 8).next_power_of_two().max(1);
    config.flow_sets_mask = u32::try_from(sets - 1).context("too many flows")?;
    let mut ebpf = attach::load(&config).context("loading the classifier")?;
    let prog: &SchedClassifier = ebpf
        .program(EGRESS_PROGRAM)
        .context("the object has no egress classifier")?
        .try_into()
        .context("the egress program is not a classifier")?;
    let prog_fd = prog.fd()?.try_clone()?;
    let (ring, counters) = crate::telemetry::source::pacer(&mut ebpf, config.fair())?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let mut popts = PipelineOptions::new("bench", "bench", Output::Quiet);
    popts.table.sample_every = opts.sample_every.max(1);
    let pipeline = rt.block_on(Pipeline::start(ring, counters, popts))?;

    let rss_before_mib = status_mib("VmRSS:").unwrap_or(0.0);
    let started = Instant::now();
    let mut packets = 0u64;
    for _ in 0..opts.rounds {
        for i in 0..opts.flows {
            // Built per packet (about 100 ns) so the frames add nothing to
            // the resident set measured.
            let f = tcp_frame(i, 100, Ecn::Ect0);
            run_skb(prog_fd.as_fd(), &f, None, 1).context("BPF_PROG_TEST_RUN failed")?;
            packets += 1;
        }
    }
    let drive_s = started.elapsed().as_secs_f64();
    // Let the reader catch up, then drain both rings.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let summary = rt.block_on(pipeline.stop());
    let count = |name: &str| {
        summary
            .counters
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    };
    let (Some(rss_mib), Some(peak_rss_mib)) = (status_mib("VmRSS:"), status_mib("VmHWM:")) else {
        bail!("cannot read VmRSS/VmHWM from /proc/self/status");
    };
    let received = summary.records;
    Ok(ScaleReport {
        flows: opts.flows,
        packets,
        sample_every: opts.sample_every,
        records_sent: count("events_sent"),
        records_received: received,
        records_lost_kernel: count("events_lost"),
        records_lost_user: summary.events_dropped_user,
        records_per_s: received as f64 / drive_s.max(1e-9),
        packets_per_s: packets as f64 / drive_s.max(1e-9),
        drive_s,
        flows_tracked: summary.flows,
        flow_histograms: summary.flow_histograms,
        rss_mib,
        peak_rss_mib,
        rss_before_mib,
    })
}
