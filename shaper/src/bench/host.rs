//! Per-packet cost of the egress classifier on this machine's kernel,
//! measured by the kernel itself with `BPF_PROG_TEST_RUN`.
//!
//! What: nanoseconds per packet of `shaper_egress` (the fair pacer) on each
//! of its paths, and of `shaper_passthrough` (returns -1, touches nothing)
//! on the same frames with the same call pattern, so the difference is the
//! pacer's own cost.
//!
//! Method.
//! - The embedded object is loaded once; the flow table gets `sets` sets
//!   (`EbpfLoader::map_max_entries("SHAPER_FLOWS")`, `flow_sets_mask =
//!   sets - 1`), the configuration is the fair pacer's defaults
//!   (`PacerConfig::new`) at a rate chosen per path, with a fixed
//!   `hash_seed` so runs are comparable.
//! - Timing is the kernel's `duration` of each call: its mean wall time per
//!   repetition (`ktime_get_ns` around the loop, total / `repeat`,
//!   truncated to whole ns). A call's total is taken as `duration *
//!   repeat`; a sample is the mean over one call (single-flow paths) or one
//!   round over every flow (flow mixes); the figure is the median sample,
//!   with min and max alongside. Each call's window holds one clock read
//!   besides the runs, amortised over `repeat`; the passthrough measured with
//!   the same pattern carries the same overhead, so differences are clean.
//! - The fair share is frozen at 1.0: `SHAPER_FAIR` is written with its
//!   epoch far in the future, so no packet ever rolls the epoch. Otherwise
//!   the benchmark's overload would drive the multiplier up within a few
//!   epochs and move every flow towards the horizon. The roll itself (one
//!   compare-and-swap winner per 8.4 ms, machine-wide) costs well under
//!   0.1 ns per packet at any real packet rate; the per-packet atomic add
//!   into the epoch ring still runs.
//! - `repeat` replays the *same* skb: a single flow's clock advances by one
//!   transmission time per repetition while the wall clock advances by the
//!   run time, so each path is primed on purpose and the counters
//!   (`SHAPER_COUNTERS`, read before and after the measured calls only)
//!   report which verdicts the measured packets really got:
//!   - `unpaced`: one flow at 1 Tbit/s: a 128-byte frame takes ~1 ns, far
//!     less than a run, so the flow's clock is always idle (`passed_unpaced`).
//!   - `paced`: one flow whose frame takes 4 runs' time (at least 200 ns) at
//!     the rate, so the clock runs ahead by ~3 runs per packet and stays far
//!     below CoDel's 5 ms target over a call; between calls the process
//!     sleeps until the clock is idle again (the first packet of each call
//!     passes).
//!   - `aqm_drop`: one flow at a rate where a frame takes 50 ms, CoDel
//!     interval 1 ns. Nine ECT(0) frames drive the clock 450 ms ahead (paced,
//!     then CE-marked once CoDel enters its dropping state); the measured
//!     frames are Not-ECT with the same tuple, so every one is dropped. The
//!     1 ns interval makes the control law space signals 0 ns apart; the code
//!     path is the one a 100 ms interval takes at a signal.
//!   - `horizon_drop`: one flow at 50 ms per frame, ECT(0), no priming:
//!     after ten kept frames (paced, then CE-marked: a mark keeps the packet
//!     and advances the clock) every replay lies beyond the 500 ms horizon.
//!     Not-ECT frames never get there: the overload rule drops them once
//!     the flow is an interval behind.
//!   - `flow_mix_10k` (the headline `classifier_ns_per_packet`): `flows`
//!     distinct tuples (source port, then source address) at 1 ms per frame
//!     (`repeat` = 4). Flows are taken in chunks of W: each flow of the chunk
//!     gets one priming packet (passes, clock 1 ms ahead), then each gets
//!     `repeat` measured packets, which are paced with scheduled delays below
//!     4 ms (under CoDel's target). W is calibrated so a flow's priming and
//!     measured calls are less than a third of a millisecond apart. A round
//!     covers every flow; rounds are tens of ms apart per flow, so its clock
//!     is idle again at the next priming. The measured call finds the flow's
//!     set touched W calls earlier (L2-warm, not L1-hot); repetitions after
//!     the first are L1-hot.
//!   - `flow_mix_10k_unpaced`: the same tuples at 1 Tbit/s, no priming.
//!   - `flow_mix_10k_telemetry`: `flow_mix_10k` with telemetry on at the
//!     default sampling (1 in 64, plus every flow start): the cost of the
//!     draw, and of the tail-called record writer when one is due.
//!   - `flow_mix_10k_framed`: `flow_mix_10k` with the link's framing on
//!     (`pppoe-llcsnap`: 40 bytes, ATM cells), at the rate that gives the
//!     framed frame the same transmission time: the cost of the framing.
//!   - `hosts_flow_mix_10k`, `hosts_nat_flow_mix_10k`: `flow_mix_10k`
//!     through the pacer over hosts (`dual-srchost`), each flow from a host
//!     of its own (so each is paced as on the flow pacer), and through its
//!     NAT program, whose lookups all miss: the cost of the host level and
//!     of the lookup.
//!   - `aggregate_flow_mix_10k`, the anchor: the same tuples through the
//!     aggregate pacer (one clock for every flow, Cilium's design), `repeat`
//!     per call, each round starting with the clock at now. A frame takes
//!     [`AGGREGATE_TX_NS`]: long beside a call, so the clock runs ahead and
//!     every packet after a round's first is paced, and short enough that
//!     a round's packets stay within the horizon.
//!   - Both pacers' own costs (`pacer_own_ns`, `aggregate_own_ns`: the
//!     path less the passthrough), their ratio and `clock_read_ns` come
//!     from rounds that run both pacers side by side (`anchor`).
//!     `clock_read_ns` is `shaper_clock` (one `bpf_ktime_get_ns` and a
//!     return) less the passthrough, on the same mix. Every pacer reads
//!     the clock once a packet, so this part of both own costs is the
//!     machine's clock source, not the pacer's work; under a hypervisor
//!     it can be a large part.
//!
//! Units: nanoseconds per packet (f64), fractions of measured packets
//! (0..=1), rates in bytes per second, frame lengths in bytes.
//!
//! The same paced mix from two CPUs at once is `concurrency`'s (the
//! module's header has its method).
//!
//! Non-goals: throughput under concurrency (each figure is CPU time per
//! packet), the cost of sch_fq or the rest of the stack, IPv6 and VLAN parsing costs
//! (one IPv4/TCP frame shape), and absolute comparability across machines.

use std::{
    collections::BTreeMap,
    thread::sleep,
    time::{Duration, Instant},
};

use serde::Serialize;
use shaper_common::{
    config::{DEFAULT_SAMPLE_EVERY, FLAG_FAIR, FLAG_NAT, FLAG_TELEMETRY, sample_threshold},
    counters::Counter,
    framing::Framing,
    hosts::Isolation,
    rate::{MAX_RATE_BYTES_PER_S, ScaledRate},
};
use tracing::{info, warn};

pub use super::loaded::BenchError;

pub use super::measure::{HostOptions, PathResult};
use super::{
    anchor::{self, AnchorReport},
    concurrency::{self, ConcurrencyReport},
    frames::{Ecn, host_frame, tcp_frame},
    loaded::{Bench, Prog, ProgramSize},
    measure::{
        AGGREGATE_TX_NS, AQM_PRIME_REPEAT, MIX_DELAY_BUDGET_NS, Measured, PathSpec, SLOW_TX_NS,
        mix_chunk, rate_for, result, single_calls, spread, warm_up,
    },
};
use crate::checks::{self, Capabilities};

/// Everything the host part measures.
#[derive(Clone, Debug, Serialize)]
pub struct HostReport {
    /// `uname -r`.
    pub kernel_release: String,
    /// The CPU model from /proc/cpuinfo.
    pub cpu_model: String,
    /// Frame length, bytes.
    pub frame_len_bytes: usize,
    /// Flow-table sets (flows = sets × 8).
    pub flow_table_sets: u32,
    /// Fair pacer, paced path, 10k-flow mix: the headline figure.
    pub classifier_ns_per_packet: f64,
    /// Passthrough on the same frames and pattern.
    pub passthrough_ns_per_packet: f64,
    /// The ingress policer on the same mix, overloaded (the virtual link
    /// behind, signals due): `police_flow_mix_10k`.
    pub police_ns_per_packet: f64,
    /// What pacing adds: the same figure as `pacer_own_ns`.
    pub pacer_ns_per_packet: f64,
    /// The paced mix from one CPU and from two at once (`concurrency`);
    /// `None` on a machine with one CPU.
    pub concurrency: Option<ConcurrencyReport>,
    /// The aggregate pacer on the same tuples, paced: the anchor
    /// (`aggregate_flow_mix_10k`).
    pub aggregate_ns_per_packet: f64,
    /// The fair pacer's own cost on the paced mix: the classifier less the
    /// passthrough, the median round of `own_costs`.
    pub pacer_own_ns: f64,
    /// The aggregate pacer's own cost on the same tuples, likewise.
    pub aggregate_own_ns: f64,
    /// The median round's `pacer_own_ns / aggregate_own_ns`, each round's
    /// ratio from its own passthrough.
    pub own_cost_ratio: f64,
    /// One read of the clock (`bpf_ktime_get_ns`) on the same mix: the
    /// clock program less the passthrough, the median round. Both pacers
    /// read it once a packet, so it is part of both own costs.
    pub clock_read_ns: f64,
    /// The passthrough, the clock read and both pacers, round by round
    /// ([`anchor`]), with each figure's spread.
    pub own_costs: AnchorReport,
    /// Passthrough on one frame replayed `repeat` times per call.
    pub passthrough_hot_ns_per_packet: f64,
    /// Verdict shares of the headline measurement.
    pub verdict_fractions: BTreeMap<&'static str, f64>,
    /// Helper calls per packet, counted in untimed passes of their own.
    #[serde(flatten)]
    pub helpers: HelperCalls,
    /// BPF instructions and helper calls per packet on each path, counted
    /// by the interpreter ([`super::insns`]).
    pub bpf_insns: super::insns::InsnsReport,
    /// Each classifier's size, after the verifier's rewrites and as the
    /// verifier processed it (against its million-instruction limit).
    pub programs: BTreeMap<&'static str, ProgramSize>,
    /// Per path.
    pub paths: BTreeMap<&'static str, PathResult>,
    /// Wall time of the host part, s.
    pub wall_s: f64,
    /// /proc/loadavg's 1-minute figure when the part started: other work
    /// on the machine inflates every figure, the passthrough's too.
    pub load_average_1m: Option<f64>,
}

/// Runs the host benchmark.
pub fn run(opts: &HostOptions) -> Result<HostReport, BenchError> {
    if opts.flows == 0
        || opts.rounds == 0
        || opts.anchor_rounds == 0
        || opts.calls == 0
        || opts.repeat == 0
    {
        return Err(BenchError::Invalid(
            "flows, rounds, calls and repeat must be positive".to_owned(),
        ));
    }
    if opts.mix_repeat == 0 || opts.mix_repeat > 16 {
        return Err(BenchError::Invalid(format!(
            "--mix-repeat {} must be 1 to 16 (the flow's clock must stay below CoDel's target)",
            opts.mix_repeat
        )));
    }
    if !opts.sets.is_power_of_two() {
        return Err(BenchError::Invalid(format!(
            "flow-table sets {} is not a power of two",
            opts.sets
        )));
    }
    Capabilities::current()?.check()?;
    let load_average_1m = load_average();
    let started = Instant::now();
    let mut b = Bench::load(opts.sets)?;
    let len = opts.frame_len;
    let frame = tcp_frame(0, len, Ecn::NotEct);
    let mut paths = BTreeMap::new();

    // Passthrough, one frame replayed: the floor.
    let mut hot = single_calls(
        &b,
        Prog::Pass,
        &frame,
        opts.calls,
        opts.repeat,
        Duration::ZERO,
    )?;
    let (passthrough_hot, _, _) = spread(&mut hot.samples);
    info!(passthrough_hot, "passthrough, one frame");

    // Unpaced: at 1 Tbit/s the clock is always idle.
    let rate = MAX_RATE_BYTES_PER_S;
    b.prepare(rate, |_| {})?;
    b.call(Prog::Egress, &frame, 1)?; // claims the flow
    let m = single_calls(
        &b,
        Prog::Egress,
        &frame,
        opts.calls,
        opts.repeat,
        Duration::ZERO,
    )?;
    let spec = PathSpec::one_flow(
        opts.repeat,
        rate,
        ScaledRate::from_bytes_per_s(rate).map_or(0, |r| r.tx_time_ns(len as u32)),
        Counter::PassedUnpaced,
    );
    let unpaced = result(&spec, m, passthrough_hot);
    info!(ns = unpaced.ns_per_packet, "unpaced");
    let run_ns = unpaced.ns_per_packet.max(1.0) as u64;
    paths.insert("unpaced", unpaced);

    // Paced: a frame takes four runs' time, so the clock runs ahead.
    let tx_ns = (4 * run_ns).max(200);
    let rate = rate_for(len, tx_ns);
    b.prepare(rate, |_| {})?;
    let drain = Duration::from_nanos(tx_ns * u64::from(opts.repeat) + 100_000);
    b.call(Prog::Egress, &frame, 1)?;
    sleep(drain);
    let m = single_calls(&b, Prog::Egress, &frame, opts.calls, opts.repeat, drain)?;
    let spec = PathSpec::one_flow(opts.repeat, rate, tx_ns, Counter::Paced);
    let paced = result(&spec, m, passthrough_hot);
    info!(ns = paced.ns_per_packet, "paced");
    paths.insert("paced", paced);

    // AQM drop: ECT(0) frames drive the clock 450 ms ahead and CoDel into
    // its dropping state; Not-ECT frames of the same flow are then dropped.
    let rate = rate_for(len, SLOW_TX_NS);
    b.prepare(rate, |c| c.interval_ns = 1)?;
    let ect = tcp_frame(0, len, Ecn::Ect0);
    b.call(Prog::Egress, &ect, AQM_PRIME_REPEAT)?;
    let m = single_calls(
        &b,
        Prog::Egress,
        &frame,
        opts.calls,
        opts.repeat,
        Duration::ZERO,
    )?;
    let spec = PathSpec::one_flow(opts.repeat, rate, SLOW_TX_NS, Counter::AqmDrop);
    let aqm = result(&spec, m, passthrough_hot);
    info!(ns = aqm.ns_per_packet, "aqm drop");
    paths.insert("aqm_drop", aqm);

    // Horizon drop: a slow rate and one ECT(0) frame replayed (a Not-ECT
    // one would be dropped by the overload rule before the horizon).
    b.prepare(rate, |_| {})?;
    let m = single_calls(
        &b,
        Prog::Egress,
        &ect,
        opts.calls,
        opts.repeat,
        Duration::ZERO,
    )?;
    let spec = PathSpec {
        intended: Counter::HorizonDrop,
        ..spec
    };
    let horizon = result(&spec, m, passthrough_hot);
    info!(ns = horizon.ns_per_packet, "horizon drop");
    paths.insert("horizon_drop", horizon);

    // Flow mixes.
    let frames: Vec<Vec<u8>> = (0..opts.flows)
        .map(|i| tcp_frame(i, len, Ecn::NotEct))
        .collect();
    let mix_pass = mix_baseline(&b, Prog::Pass, &frames, opts)?;
    info!(ns = mix_pass, "passthrough, flow mix");

    let rate = MAX_RATE_BYTES_PER_S;
    b.prepare(rate, |_| {})?;
    let unpaced_mix = flow_mix(&b, Prog::Egress, &frames, opts, rate, None, mix_pass)?;
    info!(ns = unpaced_mix.ns_per_packet, "flow mix, unpaced");
    paths.insert("flow_mix_10k_unpaced", unpaced_mix);

    let tx_ns = MIX_DELAY_BUDGET_NS / u64::from(opts.mix_repeat);
    let rate = rate_for(len, tx_ns);
    b.prepare(rate, |_| {})?;
    let mix = flow_mix(&b, Prog::Egress, &frames, opts, rate, Some(tx_ns), mix_pass)?;
    info!(ns = mix.ns_per_packet, "flow mix, paced");
    // The same mix from two CPUs at once, against one alone.
    b.prepare(rate, |_| {})?;
    let concurrency = concurrency::run(&b, &frames, opts.rounds, opts.mix_repeat, tx_ns)?;
    match &concurrency {
        Some(c) => info!(
            one = c.ns_per_packet_1cpu,
            two = c.ns_per_packet_2cpu,
            "flow mix, paced, one CPU and two at once"
        ),
        None => warn!("one CPU: the mix from two CPUs at once is not measured"),
    }
    // The same with telemetry at its default sampling (`shaper run`'s
    // default): the records fit the ring, so each costs its full write.
    b.prepare(rate, |c| {
        c.flags |= FLAG_TELEMETRY;
        c.sample_threshold = sample_threshold(DEFAULT_SAMPLE_EVERY);
    })?;
    let tel = flow_mix(&b, Prog::Egress, &frames, opts, rate, Some(tx_ns), mix_pass)?;
    info!(ns = tel.ns_per_packet, "flow mix, paced, with telemetry");
    paths.insert("flow_mix_10k_telemetry", tel);
    // The same with the link's framing (ATM cells counted per packet).
    let framing = Framing {
        overhead_bytes: 40,
        from_l3: 1,
        atm: 1,
        ..Framing::RAW
    };
    // The frames' network header follows 14 bytes of Ethernet header.
    let framed_len = framing.frame_len(u32::try_from(len).unwrap_or(u32::MAX), 14);
    let framed_rate = rate_for(framed_len as usize, tx_ns);
    b.prepare(framed_rate, |c| c.framing = framing)?;
    let framed = flow_mix(
        &b,
        Prog::Egress,
        &frames,
        opts,
        framed_rate,
        Some(tx_ns),
        mix_pass,
    )?;
    info!(ns = framed.ns_per_packet, "flow mix, paced, framed");
    paths.insert("flow_mix_10k_framed", framed);
    // The pacer over hosts (dual-srchost), each flow from a host of its
    // own so that it is paced as on the flow pacer's mix, then with the NAT
    // lookup, which misses here: no LAN side recorded the flows.
    let host_frames: Vec<Vec<u8>> = (0..opts.flows)
        .map(|i| host_frame(i, len, Ecn::NotEct))
        .collect();
    for (prog, name, nat) in [
        (Prog::Hosts, "hosts_flow_mix_10k", 0),
        (Prog::HostsNat, "hosts_nat_flow_mix_10k", FLAG_NAT),
    ] {
        b.prepare(rate, |c| {
            c.set_isolation(Isolation::DualSrcHost);
            c.flags |= nat;
        })?;
        let r = flow_mix(&b, prog, &host_frames, opts, rate, Some(tx_ns), mix_pass)?;
        info!(
            ns = r.ns_per_packet,
            path = name,
            "flow mix, paced, over hosts"
        );
        paths.insert(name, r);
    }
    // The ingress policer on the same mix: at 1 Tbit/s (every flow and the
    // virtual link idle: the pass path), and at the paced mix's rate, where
    // the virtual link runs behind and its CoDel signals flows (drops, and
    // the one-in-four cap holding signals back).
    b.prepare(MAX_RATE_BYTES_PER_S, |_| {})?;
    let police_idle = flow_mix(
        &b,
        Prog::Police,
        &frames,
        opts,
        MAX_RATE_BYTES_PER_S,
        None,
        mix_pass,
    )?;
    info!(ns = police_idle.ns_per_packet, "flow mix, policer, idle");
    paths.insert("police_flow_mix_10k_unpaced", police_idle);
    b.prepare(rate, |_| {})?;
    let police = flow_mix(&b, Prog::Police, &frames, opts, rate, Some(tx_ns), mix_pass)?;
    info!(ns = police.ns_per_packet, "flow mix, policer, overloaded");
    let police_ns = police.ns_per_packet;
    paths.insert("police_flow_mix_10k", police);
    // The anchor: the aggregate pacer on the same tuples.
    let agg_tx_ns = aggregate_tx_ns(frames.len(), opts.mix_repeat);
    let agg_rate = rate_for(len, agg_tx_ns);
    b.prepare(agg_rate, |c| c.flags &= !FLAG_FAIR)?;
    let agg = aggregate_mix(&mut b, &frames, opts, agg_rate, agg_tx_ns, mix_pass)?;
    info!(ns = agg.ns_per_packet, "flow mix, aggregate pacer");
    let aggregate_ns = agg.ns_per_packet;
    paths.insert("aggregate_flow_mix_10k", agg);
    // The own costs and their ratio, round by round.
    let own_costs = anchor::run(
        &mut b,
        &frames,
        opts.anchor_rounds,
        opts.mix_repeat,
        anchor::Mixes {
            fair_rate_bytes_per_s: rate,
            fair_tx_ns: tx_ns,
            aggregate_rate_bytes_per_s: agg_rate,
        },
    )?;
    info!(
        pacer = own_costs.pacer_own_ns.median,
        aggregate = own_costs.aggregate_own_ns.median,
        ratio = own_costs.own_cost_ratio.median,
        "own costs, round by round"
    );
    let pacer_own_ns = own_costs.pacer_own_ns.median;
    let aggregate_own_ns = own_costs.aggregate_own_ns.median;
    // Last, so no timed call runs with the counters attached.
    let helpers = HelperCalls::of(counted_passes(&mut b, &frames, opts, rate, tx_ns, mix_pass));
    let programs = b.program_sizes();
    let object = crate::bpf::object().map_err(crate::bpf::load::LoadError::from)?;
    let bpf_insns = super::insns::run(object, len)?;
    info!(
        pacer = bpf_insns.pacer_insns_per_packet,
        aggregate = bpf_insns.aggregate_insns_per_packet,
        "BPF instructions per packet, paced mix"
    );
    let report = HostReport {
        kernel_release: checks::kernel_release(),
        cpu_model: cpu_model(),
        frame_len_bytes: len,
        flow_table_sets: opts.sets,
        classifier_ns_per_packet: mix.ns_per_packet,
        passthrough_ns_per_packet: mix_pass,
        pacer_ns_per_packet: pacer_own_ns,
        aggregate_ns_per_packet: aggregate_ns,
        pacer_own_ns,
        aggregate_own_ns,
        own_cost_ratio: own_costs.own_cost_ratio.median,
        clock_read_ns: own_costs.clock_read_ns.median,
        own_costs,
        police_ns_per_packet: police_ns,
        concurrency,
        passthrough_hot_ns_per_packet: passthrough_hot,
        verdict_fractions: mix.verdicts.clone(),
        helpers,
        bpf_insns,
        programs,
        paths: {
            paths.insert("flow_mix_10k", mix);
            paths
        },
        wall_s: 0.0,
        load_average_1m,
    };
    Ok(HostReport {
        wall_s: started.elapsed().as_secs_f64(),
        ..report
    })
}

/// Helper calls per packet on the paced mixes, or why they were not
/// counted.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HelperCalls {
    /// The paced mix's helper calls per packet, all helpers; `None` when
    /// the counters could not be attached.
    pub helper_calls_per_packet: Option<f64>,
    /// Per path, by helper.
    pub helper_calls: BTreeMap<&'static str, BTreeMap<&'static str, f64>>,
    /// Why nothing was counted.
    pub helper_calls_error: Option<String>,
}

impl HelperCalls {
    /// The counted passes' outcome ([`counted_passes`]); a refusal becomes
    /// the error text.
    fn of(passes: Result<BTreeMap<&'static str, BTreeMap<&'static str, f64>>, BenchError>) -> Self {
        match passes {
            Ok(helper_calls) => Self {
                helper_calls_per_packet: helper_calls.get("flow_mix_10k").map(|h| h.values().sum()),
                helper_calls,
                helper_calls_error: None,
            },
            Err(e) => {
                let error = format!("{:#}", anyhow::Error::from(e));
                tracing::warn!(%error, "helper calls not counted");
                Self {
                    helper_calls_error: Some(error),
                    ..Self::default()
                }
            }
        }
    }
}

/// Helper calls counted on their own, with the kernel they are from: what
/// the lab part adds on a kernel that allows tracing programs, for a host
/// part that could not.
#[derive(Clone, Debug, Serialize)]
pub struct HelperCount {
    /// The kernel the count is from.
    pub kernel_release: String,
    /// The count.
    #[serde(flatten)]
    pub helpers: HelperCalls,
}

/// Loads the object and runs only the counted passes, on the mix `opts`
/// describes at the paced mix's rate.
pub fn count_helpers(opts: &HostOptions) -> Result<HelperCount, BenchError> {
    let mut b = Bench::load(opts.sets)?;
    let frames: Vec<Vec<u8>> = (0..opts.flows)
        .map(|i| tcp_frame(i, opts.frame_len, Ecn::NotEct))
        .collect();
    let tx_ns = MIX_DELAY_BUDGET_NS / u64::from(opts.mix_repeat);
    let rate = rate_for(opts.frame_len, tx_ns);
    // No own cost is derived from these passes, so no passthrough figure.
    let helpers = HelperCalls::of(counted_passes(&mut b, &frames, opts, rate, tx_ns, 0.0));
    Ok(HelperCount {
        kernel_release: checks::kernel_release(),
        helpers,
    })
}

/// The paced mixes again, one round each with the helper-call counters
/// attached: per path, helper calls per measured packet by helper. The
/// counters are detached again whatever happens.
fn counted_passes(
    b: &mut Bench,
    frames: &[Vec<u8>],
    opts: &HostOptions,
    rate: u64,
    tx_ns: u64,
    mix_pass: f64,
) -> Result<BTreeMap<&'static str, BTreeMap<&'static str, f64>>, BenchError> {
    let one_round = HostOptions {
        rounds: 1,
        ..opts.clone()
    };
    b.attach_calls()?;
    let mut out = BTreeMap::new();
    let mut pass = |b: &mut Bench, name, prog, telemetry: bool| -> Result<(), BenchError> {
        b.prepare(rate, |c| {
            if telemetry {
                c.flags |= FLAG_TELEMETRY;
                c.sample_threshold = sample_threshold(DEFAULT_SAMPLE_EVERY);
            }
        })?;
        let r = flow_mix(b, prog, frames, &one_round, rate, Some(tx_ns), mix_pass)?;
        out.insert(name, r.helper_calls);
        Ok(())
    };
    let result = pass(b, "flow_mix_10k", Prog::Egress, false)
        .and_then(|()| pass(b, "flow_mix_10k_telemetry", Prog::Egress, true))
        .and_then(|()| pass(b, "police_flow_mix_10k", Prog::Police, false));
    b.detach_calls();
    result.map(|()| out)
}

/// A baseline program (the passthrough, or the clock read alone) over
/// every frame, `mix_repeat` per call: median over rounds of ns per packet.
fn mix_baseline(
    b: &Bench,
    prog: Prog,
    frames: &[Vec<u8>],
    opts: &HostOptions,
) -> Result<f64, BenchError> {
    let mut samples = Vec::new();
    for _ in 0..opts.rounds {
        let mut ns = 0.0;
        for f in frames {
            ns += b.call(prog, f, opts.mix_repeat)?;
        }
        samples.push(ns / (frames.len() as f64 * f64::from(opts.mix_repeat)));
    }
    Ok(spread(&mut samples).0)
}

/// The flow mix: a warm-up round (claims every flow and times a call), then
/// `rounds` rounds. With `prime_tx_ns`, each chunk of flows is primed first
/// (see the module header); without, every call is measured.
fn flow_mix(
    b: &Bench,
    prog: Prog,
    frames: &[Vec<u8>],
    opts: &HostOptions,
    rate_bytes_per_s: u64,
    prime_tx_ns: Option<u64>,
    passthrough_ns: f64,
) -> Result<PathResult, BenchError> {
    let call_ns = warm_up(frames, |f| b.call(prog, f, 1))?;
    let chunk = prime_tx_ns.map_or(frames.len(), |tx| mix_chunk(tx, call_ns));
    // Let every clock go idle after the warm-up.
    sleep(Duration::from_millis(10));
    let mut m = Measured::new();
    let r = opts.mix_repeat;
    for _ in 0..opts.rounds {
        let mut ns = 0.0;
        let mut packets = 0u64;
        for group in frames.chunks(chunk) {
            if prime_tx_ns.is_some() {
                for f in group {
                    b.call(prog, f, 1)?;
                }
            }
            let before = b.counts()?;
            let helpers_before = b.helper_totals()?;
            for f in group {
                ns += b.call(prog, f, r)?;
            }
            let helpers_after = b.helper_totals()?;
            let after = b.counts()?;
            m.add_delta(&before, &after);
            m.add_helpers(helpers_before, helpers_after);
            packets += group.len() as u64 * u64::from(r);
        }
        m.samples.push(ns / packets.max(1) as f64);
        m.packets += packets;
    }
    let spec = PathSpec {
        flows: u32::try_from(frames.len()).unwrap_or(u32::MAX),
        repeat: r,
        chunk: if prime_tx_ns.is_some() { chunk } else { 0 },
        rate_bytes_per_s,
        tx_ns: prime_tx_ns.unwrap_or_else(|| {
            ScaledRate::from_bytes_per_s(rate_bytes_per_s).map_or(0, |s| {
                s.tx_time_ns(u32::try_from(opts.frame_len).unwrap_or(u32::MAX))
            })
        }),
        intended: if prime_tx_ns.is_some() {
            Counter::Paced
        } else {
            Counter::PassedUnpaced
        },
    };
    Ok(result(&spec, m, passthrough_ns))
}

/// A frame's transmission time on the aggregate mix: [`AGGREGATE_TX_NS`],
/// or less when a round of `flows × repeat` packets would carry the clock
/// past 400 ms (the horizon less a margin).
fn aggregate_tx_ns(flows: usize, repeat: u32) -> u64 {
    let packets = (flows as u64).saturating_mul(u64::from(repeat)).max(1);
    AGGREGATE_TX_NS.min(400_000_000 / packets).max(1)
}

/// The aggregate pacer over every frame, `mix_repeat` per call, each round
/// from a clock at now (see the module header).
fn aggregate_mix(
    b: &mut Bench,
    frames: &[Vec<u8>],
    opts: &HostOptions,
    rate_bytes_per_s: u64,
    tx_ns: u64,
    passthrough_ns: f64,
) -> Result<PathResult, BenchError> {
    let r = opts.mix_repeat;
    // Warm-up: every frame once, as the fair mixes do.
    b.set_aggregate_clock(crate::telemetry::pipeline::monotonic_ns())?;
    for f in frames {
        b.call(Prog::Egress, f, 1)?;
    }
    let mut m = Measured::new();
    for _ in 0..opts.rounds {
        b.set_aggregate_clock(crate::telemetry::pipeline::monotonic_ns())?;
        let before = b.counts()?;
        let mut ns = 0.0;
        for f in frames {
            ns += b.call(Prog::Egress, f, r)?;
        }
        let after = b.counts()?;
        m.add_delta(&before, &after);
        let packets = frames.len() as u64 * u64::from(r);
        m.samples.push(ns / packets.max(1) as f64);
        m.packets += packets;
    }
    let spec = PathSpec {
        flows: u32::try_from(frames.len()).unwrap_or(u32::MAX),
        repeat: r,
        chunk: 0,
        rate_bytes_per_s,
        tx_ns,
        intended: Counter::Paced,
    };
    Ok(result(&spec, m, passthrough_ns))
}

/// The 1-minute load average, if readable.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The CPU model name, or "unknown".
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}
