//! The lab part of the benchmark: goodput, latency under load and CPU cost of
//! the shaper against CAKE on a full kernel (in practice the project's VM,
//! since it needs sch_fq, CAKE and netem).
//!
//! Method: the lab's client → router → server testbed ([`crate::lab`]) with
//! netem delay on the return path (`--delay`, 20 ms unless given); each
//! state shapes the router's WAN egress at 50 Mbit/s while 4 TCP streams
//! upload from the client for
//! `duration` (after a 2 s omitted warm-up) and ping runs alongside from the
//! client every 50 ms. States: the shaper (fair pacer, defaults), CAKE
//! (besteffort), and the shaper's aggregate pacer (`--pacer aggregate`).
//!
//! CPU cost: the guest-wide system + softirq + irq share of all CPU time
//! over a state's run, minus the same share over an *unshaped* run whose 4
//! streams iperf3 paces itself (`-b` per stream) to the goodput that state
//! achieved, so the TCP stacks and iperf3 do the same work in both. Then
//! `softirq_cpu_per_mbit = (shaped - baseline) × CPUs × 100 / goodput in
//! Mbit/s`, in percent of one CPU per Mbit/s of goodput. Under emulation
//! (TCG) absolute figures mean little: compare states of the same run.
//!
//! Units: goodput ratios are receiver goodput / configured rate; ping in
//! milliseconds; CPU shares as fractions (0..=1 of all CPUs) unless named
//! `per_mbit`.
//!
//! Download (`ingress`): the same 4 streams from the server to the client,
//! with the router shaping its WAN *ingress* at the rate: the shaper's AQM
//! policer (`shaper run --ingress-rate`, `police` mode) and CAKE in
//! `ingress` mode on an IFB (sqm-scripts' setup), and the shaper's pacer on
//! an IFB (`--ingress-mode ifb`). The baseline is the same download paced
//! by iperf3 to the state's goodput. Beside them the IFB alone
//! (`ifb_alone`): the download redirected to an IFB with a FIFO, nothing
//! shaped, paced by iperf3 at the rate, so that the part of the IFB
//! states' CPU the redirect and the IFB cost is measured apart.
//!
//! Traffic cases ([`super::cases`], [`super::timed`]): a lone flow on each
//! path, a bulk flow beside sparse flows, many flows, unequal flows (Jain's
//! index), and flows that leave, join and churn, under CAKE and the shaper,
//! repeated and reported as medians.
//!
//! Link-layer framing ([`super::overhead`]): three emulated links (ATM,
//! PTM, Ethernet) under CAKE and the shaper with the link's options and
//! the shaper without, `case_reps` rounds, as medians.
//!
//! Host isolation ([`super::isolation`]): host A's 8 flows beside host B's
//! one behind the testbed's NAT, CAKE's `nat` modes against the shaper's
//! `--nat` both ways and the shaper without it, `case_reps` rounds.
//!
//! CPU-bound rate ([`super::cpu_bound`]): none, CAKE and the shaper, each
//! shaping both directions, at a rate meant to be more than the guest can
//! shape at full speed (400 Mbit/s by default), an upload and a download
//! per run with ping, `state_reps` times interleaved. It runs last, with
//! the kernel's BPF run-time statistics off.
//!
//! Repetitions: each state runs `state_reps` times, the states interleaved
//! (shaper, CAKE, aggregate, police, ifb, CAKE-ingress, the IFB alone,
//! then again) so that
//! a slow stretch of the host hits every state alike. A state's figures are
//! the medians over its runs, with the spread of goodput, ping p99 and CPU
//! beside them and every run's figures under `runs`.
//!
//! Non-goals: GSO-off runs.

use std::{collections::BTreeMap, path::PathBuf, time::Duration, time::Instant};

use serde::Serialize;
use tracing::info;

use crate::{
    checks,
    lab::{
        FlowSpec, Host, LabError, RunResult, Scenario, State, Testbed, TestbedOptions, Timing,
        run_scenario,
    },
    rate::Rate,
};

use super::{cases::Spread, loaded::BenchError};

/// Warm-up excluded from every run.
const OMIT: Duration = Duration::from_secs(2);

/// What the lab part runs.
#[derive(Clone, Debug)]
pub struct VmOptions {
    /// Path of the shaper binary to run (normally this one).
    pub bin: PathBuf,
    /// The shaping rate.
    pub rate: Rate,
    /// Extra round-trip delay of the client's path.
    pub delay: Duration,
    /// TCP streams.
    pub streams: u32,
    /// Measured time per run.
    pub duration: Duration,
    /// Also run the aggregate pacer.
    pub aggregate: bool,
    /// Also run the download states (ingress shaping).
    pub ingress: bool,
    /// Repetitions of each traffic case ([`super::cases`] and
    /// [`super::timed`]); 0 skips them.
    pub case_reps: u32,
    /// Measured time of each traffic case's run.
    pub case_duration: Duration,
    /// Also run the matrix ([`super::matrix`]), `case_reps` times.
    pub matrix: bool,
    /// Runs of each state (at least 1), interleaved.
    pub state_reps: u32,
    /// The CPU-bound case's rate ([`super::cpu_bound`]); `None` skips it.
    pub cpu_bound: Option<Rate>,
}

/// One state's figures over its runs: medians, the spread of the figures
/// that decide a comparison, and every run.
#[derive(Clone, Debug, Serialize)]
pub struct StateResult {
    /// Receiver goodput / configured rate, median.
    pub goodput_ratio: f64,
    /// Receiver goodput, Mbit/s, median.
    pub goodput_mbit: f64,
    /// Median RTT under load, ms, median over the runs.
    pub ping_p50_ms: Option<f64>,
    /// 99th percentile RTT under load, ms, median over the runs.
    pub ping_p99_ms: Option<f64>,
    /// Percent of one CPU per Mbit/s (see [`RunFigures`]), median.
    pub softirq_cpu_per_mbit: Option<f64>,
    /// The kernel's own ns per program run, median.
    pub bpf_run_ns_per_packet: Option<f64>,
    /// Goodput ratio over the runs.
    pub goodput: Spread,
    /// Ping p99 over the runs, ms.
    pub ping_p99: Option<Spread>,
    /// CPU per Mbit/s over the runs.
    pub cpu: Option<Spread>,
    /// Each run's figures, in run order.
    pub runs: Vec<RunFigures>,
}

impl StateResult {
    /// The medians and spreads of `runs` (at least one).
    fn of(runs: Vec<RunFigures>) -> Self {
        let all = |f: fn(&RunFigures) -> f64| Spread::of(runs.iter().map(f).collect());
        let some = |f: fn(&RunFigures) -> Option<f64>| {
            let v: Vec<f64> = runs.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| Spread::of(v))
        };
        let goodput = all(|r| r.goodput_ratio);
        let ping_p99 = some(|r| r.ping_p99_ms);
        let cpu = some(|r| r.softirq_cpu_per_mbit);
        Self {
            goodput_ratio: goodput.median,
            goodput_mbit: all(|r| r.goodput_mbit).median,
            ping_p50_ms: some(|r| r.ping_p50_ms).map(|s| s.median),
            ping_p99_ms: ping_p99.as_ref().map(|s| s.median),
            softirq_cpu_per_mbit: cpu.as_ref().map(|s| s.median),
            bpf_run_ns_per_packet: some(|r| r.bpf_run_ns_per_packet).map(|s| s.median),
            goodput,
            ping_p99,
            cpu,
            runs,
        }
    }
}

/// One run of a state.
#[derive(Clone, Debug, Serialize)]
pub struct RunFigures {
    /// Receiver goodput / configured rate.
    pub goodput_ratio: f64,
    /// Receiver goodput, Mbit/s.
    pub goodput_mbit: f64,
    /// Median RTT under load, ms.
    pub ping_p50_ms: Option<f64>,
    /// 99th percentile RTT under load, ms.
    pub ping_p99_ms: Option<f64>,
    /// Ping samples.
    pub ping_samples: usize,
    /// TCP retransmissions.
    pub retransmits: u64,
    /// (kernel share shaped − kernel share of the paced baseline) × CPUs ×
    /// 100 / goodput Mbit/s: percent of one CPU per Mbit/s.
    pub softirq_cpu_per_mbit: Option<f64>,
    /// system + softirq + irq share of all CPUs during the shaped run.
    pub cpu_kernel_frac: f64,
    /// The same during the paced, unshaped baseline.
    pub baseline_cpu_kernel_frac: f64,
    /// The baseline's goodput, Mbit/s (should match `goodput_mbit`).
    pub baseline_goodput_mbit: f64,
    /// The kernel's own time in the shaper's programs per program run (one
    /// run per skb), egress and ingress together, over the state's whole
    /// run; `None` for CAKE and where the kernel did not count.
    pub bpf_run_ns_per_packet: Option<f64>,
    /// The shaper's outcome counters (not for CAKE).
    pub counters: Option<BTreeMap<String, u64>>,
}

/// The download states.
#[derive(Clone, Debug, Serialize)]
pub struct IngressResult {
    /// The shaper's AQM policer (`--ingress-mode police`).
    pub police: StateResult,
    /// CAKE in `ingress` mode on an IFB.
    pub cake_ingress: StateResult,
    /// The shaper's pacer on an IFB (`--ingress-mode ifb`).
    pub ifb: StateResult,
    /// The IFB alone ([`State::IfbAlone`]): the download redirected to an
    /// IFB with a FIFO at its root, nothing shaped, paced by iperf3 at the
    /// rate. Its CPU per Mbit/s is what the redirect and the IFB cost,
    /// within `ifb`'s and `cake_ingress`'s figures alike.
    pub ifb_alone: StateResult,
}

/// Everything the lab part measures.
#[derive(Clone, Debug, Serialize)]
pub struct VmReport {
    /// The guest kernel.
    pub kernel_release: String,
    /// CPUs the guest has.
    pub cpus: usize,
    /// Configured rate, Mbit/s.
    pub rate_mbit: f64,
    /// Extra RTT, ms.
    pub delay_ms: f64,
    /// TCP streams.
    pub streams: u32,
    /// Measured seconds per run.
    pub duration_s: f64,
    /// What `softirq_cpu_per_mbit` is in.
    pub cpu_unit: &'static str,
    /// The fair pacer.
    pub shaper: StateResult,
    /// CAKE at the same rate.
    pub cake: StateResult,
    /// The aggregate pacer, if run.
    pub aggregate: Option<StateResult>,
    /// Download shaped at the WAN ingress, if run.
    pub ingress: Option<IngressResult>,
    /// The traffic cases, if run (their keys at this level).
    #[serde(flatten)]
    pub cases: Option<super::cases::CasesReport>,
    /// The timed cases, if the traffic cases ran (their keys at this
    /// level).
    #[serde(flatten)]
    pub timed: Option<super::timed::TimedReport>,
    /// The link-layer framing cases ([`super::overhead`]), if the traffic
    /// cases ran: per link, per state.
    pub overhead:
        Option<BTreeMap<&'static str, BTreeMap<&'static str, super::overhead::FramedState>>>,
    /// The host-isolation case through NAT ([`super::isolation`]), if the
    /// traffic cases ran: per state.
    pub isolation: Option<BTreeMap<&'static str, super::isolation::IsolationState>>,
    /// The matrix, if asked for.
    pub matrix: Option<BTreeMap<String, super::matrix::CellPair>>,
    /// The CPU-bound case, unless skipped.
    pub cpu_bound: Option<super::cpu_bound::CpuBoundReport>,
    /// Wall time of the lab part, s.
    pub wall_s: f64,
    /// Signs that the figures are not trustworthy (e.g. a CPU-starved guest).
    pub warnings: Vec<String>,
}

/// The qdiscs every run of the lab part builds on: netem for the paths'
/// delay, sch_fq under the shaper, and CAKE, the reference (which the soak
/// does not run).
fn lab_qdiscs(soak: bool) -> &'static [&'static str] {
    if soak {
        &["netem", "fq"]
    } else {
        &["netem", "fq", "cake"]
    }
}

/// Refuses a kernel that lacks a qdisc the lab part (the soak with
/// `soak`) builds on, before any namespace exists.
pub fn check_kernel(soak: bool) -> Result<(), BenchError> {
    match crate::tc::first_missing_qdisc(lab_qdiscs(soak).iter().copied(), |kind| kind) {
        Some(kind) => Err(BenchError::MissingQdisc { kind }),
        None => Ok(()),
    }
}

/// The soak's document: the guest kernel and the report.
#[derive(Clone, Debug, Serialize)]
pub struct SoakDoc {
    /// The guest kernel.
    pub kernel_release: String,
    /// CPUs the guest has.
    pub cpus: usize,
    /// Configured rate, Mbit/s.
    pub rate_mbit: f64,
    /// What the soak measured.
    pub soak: crate::lab::soak::SoakReport,
}

/// Runs only the soak: `length` of churn at `rate`, 20 ms RTT.
pub fn soak(bin: &std::path::Path, rate: Rate, length: Duration) -> Result<SoakDoc, LabError> {
    let tb = Testbed::new(TestbedOptions {
        client_delay: Duration::from_millis(20),
        ..TestbedOptions::default()
    })?;
    let plan = crate::lab::soak::SoakPlan::bench(length);
    let soak = crate::lab::soak::run_soak(&tb, bin, rate, &plan)?;
    Ok(SoakDoc {
        kernel_release: checks::kernel_release(),
        cpus: cpus(),
        rate_mbit: rate.bits_per_s() as f64 / 1e6,
        soak,
    })
}

/// Runs the lab part.
pub fn run(opts: &VmOptions) -> Result<VmReport, LabError> {
    let started = Instant::now();
    // The kernel times the shaper's programs while this is held; without
    // it `bpf_run_ns_per_packet` stays empty and the rest still runs.
    let stats = match crate::bpf::stats::enable() {
        Ok(fd) => Some(fd),
        Err(e) => {
            tracing::warn!("{:#}", anyhow::Error::from(e));
            None
        }
    };
    let tb = Testbed::new(TestbedOptions {
        client_delay: opts.delay,
        ..TestbedOptions::default()
    })?;
    let timing = Timing::new(opts.duration, OMIT);
    let mut states = states(opts);
    for rep in 0..opts.state_reps.max(1) {
        for (state, flow, runs) in &mut states {
            info!(state = %state.name(), rep, "state run");
            runs.push(measure(&tb, opts, state.clone(), timing, *flow)?);
        }
    }
    let mut results = states.into_iter().map(|(_, _, runs)| StateResult::of(runs));
    // `states` lists exactly the states read here, in this order.
    let mut next = || {
        results.next().ok_or_else(|| LabError::Invalid {
            detail: "the bench read more states than it planned".to_owned(),
        })
    };
    let shaper = next()?;
    let cake = next()?;
    let aggregate = if opts.aggregate { Some(next()?) } else { None };
    let ingress = if opts.ingress {
        Some(IngressResult {
            police: next()?,
            ifb: next()?,
            cake_ingress: next()?,
            ifb_alone: next()?,
        })
    } else {
        None
    };
    let cases = if opts.case_reps > 0 {
        let timing = Timing::new(opts.case_duration, OMIT);
        Some(super::cases::run(
            &tb,
            &opts.bin,
            opts.rate,
            timing,
            opts.case_reps,
        )?)
    } else {
        None
    };
    let timed = if opts.case_reps > 0 {
        Some(super::timed::run(
            &tb,
            &opts.bin,
            opts.rate,
            opts.case_reps,
        )?)
    } else {
        None
    };
    let (overhead, isolation) = if opts.case_reps > 0 {
        let timing = Timing::new(opts.case_duration, OMIT);
        (
            Some(super::overhead::run(&opts.bin, timing, opts.case_reps)?),
            Some(super::isolation::run(
                &opts.bin,
                opts.rate,
                timing,
                opts.case_reps,
            )?),
        )
    } else {
        (None, None)
    };
    let matrix = if opts.matrix {
        let timing = Timing::new(opts.case_duration, OMIT);
        Some(super::matrix::run(&opts.bin, timing, opts.case_reps)?)
    } else {
        None
    };
    // The statistics' clock reads cost the shaper's programs alone, which
    // a case limited by the CPU would count against it.
    drop(stats);
    let cpu_bound = match opts.cpu_bound {
        Some(rate) => Some(super::cpu_bound::run(
            &tb,
            &super::cpu_bound::CpuBoundOptions {
                bin: opts.bin.clone(),
                rate,
                streams: opts.streams,
                timing: Timing::new(opts.duration, OMIT),
                reps: opts.state_reps,
            },
        )?),
        None => None,
    };
    let warnings = warnings(&cake);
    for w in &warnings {
        tracing::warn!("{w}");
    }
    Ok(VmReport {
        kernel_release: checks::kernel_release(),
        cpus: cpus(),
        rate_mbit: opts.rate.bits_per_s() as f64 / 1e6,
        delay_ms: opts.delay.as_secs_f64() * 1e3,
        streams: opts.streams,
        duration_s: opts.duration.as_secs_f64(),
        cpu_unit: "percent of one CPU per Mbit/s of goodput (system+softirq+irq, guest-wide, \
                   minus an unshaped iperf3-paced run at the same goodput)",
        shaper,
        cake,
        aggregate,
        ingress,
        cases,
        timed,
        overhead,
        isolation,
        matrix,
        cpu_bound,
        wall_s: started.elapsed().as_secs_f64(),
        warnings,
    })
}

/// A state's measured flows, with its baseline's.
#[derive(Clone, Copy)]
struct Planned {
    /// The flows run from the server to the client.
    download: bool,
    /// Each stream paced by iperf3 at this rate, for a state that shapes
    /// nothing itself; `None` lets the state set the pace.
    paced: Option<Rate>,
}

/// The states in run order, each with whether it shapes the download, the
/// pace iperf3 sets for it, and its runs so far: the shaper, CAKE, the
/// aggregate pacer (if asked for), then the policer, the IFB pacer,
/// CAKE-ingress and the IFB alone, paced at the rate (if asked for).
fn states(opts: &VmOptions) -> Vec<(State, Planned, Vec<RunFigures>)> {
    let shaper = |extra: &[&str]| State::Shaper {
        bin: opts.bin.clone(),
        rate: opts.rate,
        extra_args: extra.iter().map(|a| (*a).to_owned()).collect(),
    };
    let ingress = |extra: &[&str]| State::ShaperIngress {
        bin: opts.bin.clone(),
        rate: opts.rate,
        extra_args: extra.iter().map(|a| (*a).to_owned()).collect(),
    };
    let per_stream = Rate::from_bits_per_s(opts.rate.bits_per_s() / u64::from(opts.streams.max(1)))
        .unwrap_or(Rate::MIN);
    let mut v = vec![
        (shaper(&[]), false, None),
        (State::Cake { rate: opts.rate }, false, None),
    ];
    if opts.aggregate {
        v.push((shaper(&["--pacer", "aggregate"]), false, None));
    }
    if opts.ingress {
        v.push((ingress(&["--ingress-mode", "police"]), true, None));
        v.push((ingress(&["--ingress-mode", "ifb"]), true, None));
        v.push((State::cake_ingress(opts.rate), true, None));
        v.push((State::IfbAlone, true, Some(per_stream)));
    }
    v.into_iter()
        .map(|(state, download, paced)| (state, Planned { download, paced }, Vec::new()))
        .collect()
}

/// CAKE's goodput below this share of its rate means the guest could not
/// keep up (it delivers 0.90 to 0.92 when it can; notes/vm.md).
const CAKE_STARVED_RATIO: f64 = 0.8;

/// Warnings about the run, judged from CAKE, the reference.
fn warnings(cake: &StateResult) -> Vec<String> {
    let mut w = Vec::new();
    if cake.goodput_ratio < CAKE_STARVED_RATIO {
        w.push(format!(
            "CAKE delivered {:.0}% of its rate (about 90% when the guest keeps up): the guest \
             was short of CPU (a loaded host under TCG), so goodput and CPU figures are \
             unreliable; rerun on a quiet host",
            cake.goodput_ratio * 100.0
        ));
    }
    w
}

/// Runs `state`, then the unshaped baseline paced to its goodput; upload,
/// or download, and paced, as `flow` says.
fn measure(
    tb: &Testbed,
    opts: &VmOptions,
    state: State,
    timing: Timing,
    flow: Planned,
) -> Result<RunFigures, LabError> {
    let dir = |f: FlowSpec| if flow.download { f.reversed() } else { f };
    let own = FlowSpec::tcp(Host::Client, opts.streams);
    let own = match flow.paced {
        Some(rate) => own.with_bitrate(rate),
        None => own,
    };
    let flows = vec![dir(own)];
    let shaped = run_scenario(
        tb,
        &Scenario::new(state, flows, timing).with_ping(Host::Client),
    )?;
    let per_stream = (shaped.total_bps / f64::from(opts.streams.max(1))) as u64;
    let per_stream = Rate::from_bits_per_s(per_stream).unwrap_or(Rate::MIN);
    let paced = vec![dir(
        FlowSpec::tcp(Host::Client, opts.streams).with_bitrate(per_stream)
    )];
    let baseline = run_scenario(
        tb,
        &Scenario::new(State::None, paced, timing).with_ping(Host::Client),
    )?;
    let result = state_result(&shaped, &baseline, opts.rate, cpus());
    info!(
        state = %shaped.state,
        goodput_ratio = result.goodput_ratio,
        cpu_per_mbit = ?result.softirq_cpu_per_mbit,
        "measured"
    );
    Ok(result)
}

/// The figures of one state from its run and its baseline.
fn state_result(shaped: &RunResult, baseline: &RunResult, rate: Rate, cpus: usize) -> RunFigures {
    let mbit = shaped.total_bps / 1e6;
    let ping = shaped.ping();
    let cpu = shaped.cpu.kernel();
    let base = baseline.cpu.kernel();
    RunFigures {
        goodput_ratio: shaped.ratio(rate),
        goodput_mbit: mbit,
        ping_p50_ms: ping.map(|p| p.p50),
        ping_p99_ms: ping.map(|p| p.p99),
        ping_samples: shaped.ping_ms.len(),
        retransmits: shaped.retransmits,
        softirq_cpu_per_mbit: (mbit > 0.0).then(|| (cpu - base) * cpus as f64 * 100.0 / mbit),
        cpu_kernel_frac: cpu,
        baseline_cpu_kernel_frac: base,
        baseline_goodput_mbit: baseline.total_bps / 1e6,
        bpf_run_ns_per_packet: shaped
            .counters
            .as_ref()
            .ok()
            .and_then(bpf_run_ns_per_packet),
        counters: shaped.counters.as_ref().ok().cloned(),
    }
}

/// Σ run time / Σ runs over the programs in a state's counters
/// (`[ingress.]program.<name>.run_time_ns` and `.run_cnt`).
fn bpf_run_ns_per_packet(counters: &BTreeMap<String, u64>) -> Option<f64> {
    let sum = |suffix: &str| -> u64 {
        counters
            .iter()
            .filter(|(k, _)| k.contains("program.") && k.ends_with(suffix))
            .map(|(_, v)| *v)
            .sum()
    };
    let runs = sum(".run_cnt");
    (runs > 0).then(|| sum(".run_time_ns") as f64 / runs as f64)
}

/// CPUs this machine has.
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(goodput_ratio: f64, p99: Option<f64>, cpu: Option<f64>) -> RunFigures {
        RunFigures {
            goodput_ratio,
            goodput_mbit: goodput_ratio * 50.0,
            ping_p50_ms: p99.map(|p| p - 2.0),
            ping_p99_ms: p99,
            ping_samples: 100,
            retransmits: 0,
            softirq_cpu_per_mbit: cpu,
            cpu_kernel_frac: 0.5,
            baseline_cpu_kernel_frac: 0.4,
            baseline_goodput_mbit: 47.0,
            bpf_run_ns_per_packet: None,
            counters: None,
        }
    }

    fn options(ingress: bool) -> VmOptions {
        VmOptions {
            bin: PathBuf::from("shaper"),
            rate: Rate::from_bits_per_s(50_000_000).expect("a rate"),
            delay: Duration::from_millis(20),
            streams: 4,
            duration: Duration::from_secs(8),
            aggregate: false,
            ingress,
            case_reps: 0,
            case_duration: Duration::from_secs(5),
            matrix: false,
            state_reps: 3,
            cpu_bound: None,
        }
    }

    #[test]
    fn the_ifb_alone_runs_last_paced_at_the_rate_and_the_shaped_states_set_their_own_pace() {
        let plan = states(&options(true));
        let names: Vec<String> = plan.iter().map(|(s, _, _)| s.name()).collect();
        assert_eq!(names.len(), 6, "{names:?}");
        assert_eq!(names[5], "ifb-alone", "{names:?}");
        for (state, flow, runs) in &plan {
            assert!(runs.is_empty());
            if matches!(state, State::IfbAlone) {
                assert!(flow.download);
                let per_stream = flow.paced.expect("the IFB alone is paced");
                assert_eq!(per_stream.bits_per_s(), 50_000_000 / 4);
            } else {
                assert_eq!(flow.paced, None, "{}", state.name());
            }
        }
        let upload_only = states(&options(false));
        assert_eq!(upload_only.len(), 2);
        assert!(
            upload_only
                .iter()
                .all(|(_, f, _)| !f.download && f.paced.is_none())
        );
    }

    #[test]
    fn a_state_is_the_median_of_its_runs_with_their_spread() {
        let st = StateResult::of(vec![
            run_of(0.95, Some(30.0), Some(0.9)),
            run_of(0.90, Some(22.0), None),
            run_of(0.93, Some(25.0), Some(1.1)),
        ]);
        assert_eq!(st.goodput_ratio, 0.93);
        assert_eq!((st.goodput.min, st.goodput.max), (0.90, 0.95));
        assert_eq!(st.ping_p99_ms, Some(25.0));
        assert_eq!(st.ping_p50_ms, Some(23.0));
        // CPU over the two runs that have it.
        let cpu = st.cpu.as_ref().expect("two runs with CPU");
        assert_eq!((cpu.min, cpu.max, cpu.runs.len()), (0.9, 1.1, 2));
        assert_eq!(st.bpf_run_ns_per_packet, None);
        assert_eq!(st.runs.len(), 3);
        let v = serde_json::to_value(&st).expect("serialises");
        assert_eq!(v["runs"][1]["goodput_ratio"], 0.90);
        assert_eq!(v["ping_p99"]["max"], 30.0);
    }
}
