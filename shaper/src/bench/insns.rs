//! BPF instructions and helper calls per packet on each path the host part
//! times, counted by the interpreter (`bpfvm`) rather than timed: exact,
//! the same on every machine, and available where the kernel has no PMU
//! and refuses fentry.
//!
//! Method: each path starts from the state the timed path starts from
//! (`loaded::start_config`, the fair share frozen, every other map zeroed)
//! on a flow table of [`SETS`] sets. Its flows are primed as the timed
//! path primes them, then each measured packet runs once, the clock
//! advancing [`STEP_NS`] a packet; the counters say which verdict each got.
//! The clock starts at [`START_NS`], past every idle timeout.
//!
//! Units: instructions (an `ld_imm64` is one) and calls per measured
//! packet. Non-goals: time; the verifier's rewrites (see `bpfvm`).

use std::collections::BTreeMap;

use serde::Serialize;
use shaper_common::{
    CLOCK_PROGRAM, EGRESS_HOSTS_NAT_PROGRAM, EGRESS_HOSTS_PROGRAM, EGRESS_PROGRAM, JUMP_TELEMETRY,
    PASSTHROUGH_PROGRAM, POLICE_PROGRAM, TELEMETRY_PROGRAM,
    config::{
        DEFAULT_SAMPLE_EVERY, FLAG_FAIR, FLAG_NAT, FLAG_TELEMETRY, PacerConfig, sample_threshold,
    },
    counters::Counter,
    framing::Framing,
    hosts::Isolation,
    maps,
    rate::MAX_RATE_BYTES_PER_S,
};

use super::{
    bpfvm::{Vm, VmError, helper_name, pod_bytes},
    frames::{Ecn, host_frame, tcp_frame},
    loaded::{BenchError, frozen_fair, frozen_link, start_config},
    measure::{AGGREGATE_TX_NS, AQM_PRIME_REPEAT, MIX_DELAY_BUDGET_NS, SLOW_TX_NS, rate_for},
};
use crate::counters::CounterSnapshot;

/// Flow-table sets: every mix's flows fit without sharing a way.
const SETS: u32 = 1024;
/// Distinct flows in a mix: enough that 1-in-64 sampling draws records.
const MIX_FLOWS: u32 = 256;
/// Measured packets on a single-flow path.
const ONE_FLOW_PACKETS: u32 = 64;
/// The clock's start: 100 s, past every idle timeout.
const START_NS: u64 = 100_000_000_000;
/// The clock's advance per packet.
const STEP_NS: u64 = 100;
/// The clock's advance after the warm-up: every flow's clock idle again.
const IDLE_GAP_NS: u64 = 1_000_000_000;
/// A single paced flow's frame time: four packets' clock advance, so its
/// clock runs ahead by three steps a packet, far below CoDel's target.
const ONE_FLOW_TX_NS: u64 = 4 * STEP_NS;

/// One path's counts.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PathInsns {
    /// BPF instructions per measured packet.
    pub insns_per_packet: f64,
    /// Helper calls per measured packet, all helpers.
    pub helper_calls_per_packet: f64,
    /// Helper calls per measured packet, by helper.
    pub helpers: BTreeMap<&'static str, f64>,
    /// The verdict the path is meant to measure, if any.
    pub intended: Option<&'static str>,
    /// The share of measured packets that got it.
    pub intended_fraction: Option<f64>,
}

/// What the host part reports: the headline (the fair pacer on the paced
/// mix) and every path.
#[derive(Clone, Debug, Serialize)]
pub struct InsnsReport {
    /// The fair pacer on the paced mix, instructions per packet.
    pub pacer_insns_per_packet: f64,
    /// The aggregate pacer on the same mix.
    pub aggregate_insns_per_packet: f64,
    /// Per path, named as the timed paths are.
    pub paths: BTreeMap<&'static str, PathInsns>,
}

/// How a path's flows are primed before the measured packets.
#[derive(Clone, Copy)]
enum Prime<'a> {
    /// Not at all.
    None,
    /// `n` packets of each flow.
    Each(u32),
    /// `n` of each of these frames, one per flow, instead of the path's.
    With(&'a [Vec<u8>], u32),
}

/// One counted path.
struct Path<'a> {
    name: &'static str,
    prog: &'static str,
    frames: &'a [Vec<u8>],
    rate_bytes_per_s: u64,
    tweak: fn(&mut PacerConfig),
    prime: Prime<'a>,
    /// Measured packets per flow.
    repeat: u32,
    /// The verdict every measured packet must get; `None` for the
    /// baselines, which count nothing.
    intended: Option<Counter>,
}

/// Counts every path with `frame_len`-byte frames.
pub fn run(object: &[u8], frame_len: usize) -> Result<InsnsReport, BenchError> {
    let mix: Vec<Vec<u8>> = (0..MIX_FLOWS)
        .map(|i| tcp_frame(i, frame_len, Ecn::NotEct))
        .collect();
    let hosts: Vec<Vec<u8>> = (0..MIX_FLOWS)
        .map(|i| host_frame(i, frame_len, Ecn::NotEct))
        .collect();
    let one = vec![tcp_frame(0, frame_len, Ecn::NotEct)];
    let one_ect = vec![tcp_frame(0, frame_len, Ecn::Ect0)];
    let paced_rate = rate_for(frame_len, MIX_DELAY_BUDGET_NS);
    let slow_rate = rate_for(frame_len, SLOW_TX_NS);
    let agg_rate = rate_for(frame_len, AGGREGATE_TX_NS);
    let framing = |c: &mut PacerConfig| {
        c.framing = Framing {
            overhead_bytes: 40,
            from_l3: 1,
            atm: 1,
            ..Framing::RAW
        };
    };
    let none = |_: &mut PacerConfig| {};
    let paths = [
        Path::new(
            "passthrough",
            PASSTHROUGH_PROGRAM,
            &mix,
            MAX_RATE_BYTES_PER_S,
            none,
            Prime::None,
            None,
        ),
        Path::new(
            "clock",
            CLOCK_PROGRAM,
            &mix,
            MAX_RATE_BYTES_PER_S,
            none,
            Prime::None,
            None,
        ),
        Path {
            repeat: ONE_FLOW_PACKETS,
            ..Path::new(
                "unpaced",
                EGRESS_PROGRAM,
                &one,
                MAX_RATE_BYTES_PER_S,
                none,
                Prime::Each(1),
                Some(Counter::PassedUnpaced),
            )
        },
        Path {
            repeat: ONE_FLOW_PACKETS,
            ..Path::new(
                "paced",
                EGRESS_PROGRAM,
                &one,
                rate_for(frame_len, ONE_FLOW_TX_NS),
                none,
                Prime::Each(1),
                Some(Counter::Paced),
            )
        },
        Path {
            repeat: ONE_FLOW_PACKETS,
            ..Path::new(
                "aqm_drop",
                EGRESS_PROGRAM,
                &one,
                slow_rate,
                |c| c.interval_ns = 1,
                Prime::With(&one_ect, AQM_PRIME_REPEAT),
                Some(Counter::AqmDrop),
            )
        },
        Path {
            repeat: ONE_FLOW_PACKETS,
            ..Path::new(
                "horizon_drop",
                EGRESS_PROGRAM,
                &one_ect,
                slow_rate,
                none,
                Prime::Each(12),
                Some(Counter::HorizonDrop),
            )
        },
        Path::new(
            "flow_mix_10k",
            EGRESS_PROGRAM,
            &mix,
            paced_rate,
            none,
            Prime::Each(1),
            Some(Counter::Paced),
        ),
        Path::new(
            "flow_mix_10k_unpaced",
            EGRESS_PROGRAM,
            &mix,
            MAX_RATE_BYTES_PER_S,
            none,
            Prime::None,
            Some(Counter::PassedUnpaced),
        ),
        Path::new(
            "flow_mix_10k_telemetry",
            EGRESS_PROGRAM,
            &mix,
            paced_rate,
            telemetry,
            Prime::Each(1),
            Some(Counter::Paced),
        ),
        Path::new(
            "flow_mix_10k_framed",
            EGRESS_PROGRAM,
            &mix,
            paced_rate,
            framing,
            Prime::Each(1),
            Some(Counter::Paced),
        ),
        Path::new(
            "hosts_flow_mix_10k",
            EGRESS_HOSTS_PROGRAM,
            &hosts,
            paced_rate,
            |c| c.set_isolation(Isolation::DualSrcHost),
            Prime::Each(1),
            Some(Counter::Paced),
        ),
        Path::new(
            "hosts_nat_flow_mix_10k",
            EGRESS_HOSTS_NAT_PROGRAM,
            &hosts,
            paced_rate,
            |c| {
                c.set_isolation(Isolation::DualSrcHost);
                c.flags |= FLAG_NAT;
            },
            Prime::Each(1),
            Some(Counter::Paced),
        ),
        Path::new(
            "police_flow_mix_10k_unpaced",
            POLICE_PROGRAM,
            &mix,
            MAX_RATE_BYTES_PER_S,
            none,
            Prime::None,
            Some(Counter::PassedUnpaced),
        ),
        Path::new(
            "police_flow_mix_10k",
            POLICE_PROGRAM,
            &mix,
            paced_rate,
            none,
            Prime::Each(1),
            Some(Counter::Paced),
        ),
        Path::new(
            "aggregate_flow_mix_10k",
            EGRESS_PROGRAM,
            &mix,
            agg_rate,
            |c| c.flags &= !FLAG_FAIR,
            Prime::Each(1),
            Some(Counter::Paced),
        ),
    ];
    let mut out = BTreeMap::new();
    for p in &paths {
        out.insert(p.name, p.count(object)?);
    }
    let of = |name| {
        out.get(name)
            .map_or(f64::NAN, |p: &PathInsns| p.insns_per_packet)
    };
    Ok(InsnsReport {
        pacer_insns_per_packet: of("flow_mix_10k"),
        aggregate_insns_per_packet: of("aggregate_flow_mix_10k"),
        paths: out,
    })
}

/// Telemetry on at the default sampling, as `shaper run` sets it.
fn telemetry(c: &mut PacerConfig) {
    c.flags |= FLAG_TELEMETRY;
    c.sample_threshold = sample_threshold(DEFAULT_SAMPLE_EVERY);
}

impl<'a> Path<'a> {
    fn new(
        name: &'static str,
        prog: &'static str,
        frames: &'a [Vec<u8>],
        rate_bytes_per_s: u64,
        tweak: fn(&mut PacerConfig),
        prime: Prime<'a>,
        intended: Option<Counter>,
    ) -> Self {
        Self {
            name,
            prog,
            frames,
            rate_bytes_per_s,
            tweak,
            prime,
            repeat: 1,
            intended,
        }
    }

    /// Sets up a fresh interpreter, primes, and counts the measured packets.
    fn count(&self, object: &[u8]) -> Result<PathInsns, BenchError> {
        let mut vm = Vm::new(object, &[(maps::FLOWS, SETS)])?;
        let config = start_config(self.rate_bytes_per_s, SETS, self.tweak)?;
        vm.set(maps::CONFIG, 0, &pod_bytes(&config))?;
        vm.set(maps::FAIR, 0, &pod_bytes(&frozen_fair()))?;
        vm.set_program(maps::JUMP, JUMP_TELEMETRY, TELEMETRY_PROGRAM)?;
        vm.now_ns = START_NS;
        vm.set(maps::AGGREGATE, 0, &pod_bytes(&frozen_link(vm.now_ns)))?;
        // The warm-up: every flow once (its way claimed, its hosts
        // entered), then a second for every clock to go idle.
        for frame in self.frames {
            vm.run(self.prog, frame)?;
            vm.now_ns += STEP_NS;
        }
        vm.now_ns += IDLE_GAP_NS;
        vm.set(maps::AGGREGATE, 0, &pod_bytes(&frozen_link(vm.now_ns)))?;
        let (primes, n) = match self.prime {
            Prime::None => (self.frames, 0),
            Prime::Each(n) => (self.frames, n),
            Prime::With(frames, n) => (frames, n),
        };
        for frame in primes {
            for _ in 0..n {
                vm.run(self.prog, frame)?;
                vm.now_ns += STEP_NS;
            }
        }
        let before = counters(&vm)?;
        let mut insns = 0u64;
        let mut helpers: BTreeMap<i32, u64> = BTreeMap::new();
        let mut packets = 0u64;
        for _ in 0..self.repeat {
            for frame in self.frames {
                let c = vm.run(self.prog, frame)?;
                insns += c.insns;
                for (id, n) in c.helpers {
                    *helpers.entry(id).or_insert(0) += n;
                }
                packets += 1;
                vm.now_ns += STEP_NS;
            }
        }
        let after = counters(&vm)?;
        let per = |n: u64| n as f64 / packets.max(1) as f64;
        Ok(PathInsns {
            insns_per_packet: per(insns),
            helper_calls_per_packet: per(helpers.values().sum()),
            helpers: helpers
                .into_iter()
                .map(|(id, n)| (helper_name(id), per(n)))
                .collect(),
            intended: self.intended.map(Counter::name),
            intended_fraction: self.intended.map(|c| per(after.delta(&before)[c])),
        })
    }
}

/// Every counter's total on the interpreter's one CPU.
fn counters(vm: &Vm) -> Result<CounterSnapshot, VmError> {
    let totals = Counter::ALL
        .iter()
        .map(|&c| {
            let b = vm.get(maps::COUNTERS, c as u32)?;
            Ok(b.try_into().map_or(0, u64::from_le_bytes))
        })
        .collect::<Result<Vec<u64>, VmError>>()?;
    Ok(CounterSnapshot::from_fn(|c| totals[c as usize]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> InsnsReport {
        let object = crate::bpf::object()
            .expect("the BPF object is embedded (run the tests through `cargo xtask test`)");
        run(object, 128).expect("every path runs in the interpreter")
    }

    #[test]
    fn every_path_gets_its_verdict_and_a_pacer_costs_more_than_its_clock_read() {
        let r = report();
        assert_eq!(r.paths.len(), 15);
        let clock = r.paths["clock"].insns_per_packet;
        // The baselines are two and a handful of instructions: a return,
        // and a clock read, a compare and a return.
        assert_eq!(r.paths["passthrough"].insns_per_packet, 2.0);
        assert!((3.0..=8.0).contains(&clock), "clock {clock}");
        assert_eq!(r.paths["clock"].helpers.get("ktime_get_ns"), Some(&1.0));
        for (name, p) in &r.paths {
            if let Some(f) = p.intended_fraction {
                assert_eq!(f, 1.0, "{name}: {p:?}");
                assert!(p.insns_per_packet > 10.0 * clock, "{name}: {p:?}");
                // Every pacer reads the clock once a packet.
                assert_eq!(p.helpers.get("ktime_get_ns"), Some(&1.0), "{name}: {p:?}");
            }
        }
        // Host isolation adds its lookups to the flow pacer's path.
        assert!(
            r.paths["hosts_flow_mix_10k"].insns_per_packet > r.pacer_insns_per_packet,
            "{r:?}"
        );
        // Telemetry's records are tail calls at the sampling rate.
        let tel = &r.paths["flow_mix_10k_telemetry"];
        assert!(
            tel.helpers.get("tail_call").is_some_and(|n| *n > 0.0),
            "{tel:?}"
        );
    }

    #[test]
    fn a_map_value_of_the_wrong_size_or_index_is_refused_and_named() {
        let object = crate::bpf::object().expect("the BPF object is embedded");
        let mut vm = Vm::new(object, &[(maps::FLOWS, SETS)]).expect("links");
        let e = vm.set(maps::CONFIG, 0, &[0; 3]).expect_err("3 bytes");
        assert!(e.to_string().contains("SHAPER_CONFIG"), "{e}");
        let e = vm.get(maps::FLOWS, SETS).expect_err("past the end");
        assert_eq!(
            e.to_string(),
            format!("map SHAPER_FLOWS: index {SETS} is past its {SETS} entries")
        );
    }

    #[test]
    fn the_counts_repeat_exactly() {
        let (a, b) = (report(), report());
        for (name, p) in &a.paths {
            assert_eq!(p, &b.paths[name], "{name}");
        }
    }

    #[test]
    fn a_paced_packet_is_stamped_ahead_of_the_clock_and_an_idle_flow_is_not() {
        let object = crate::bpf::object().expect("the BPF object is embedded");
        let mut vm = Vm::new(object, &[(maps::FLOWS, SETS)]).expect("links");
        let config = start_config(rate_for(128, 10_000), SETS, |_| {}).expect("a valid rate");
        vm.set(maps::CONFIG, 0, &pod_bytes(&config))
            .expect("config");
        vm.set(maps::FAIR, 0, &pod_bytes(&frozen_fair()))
            .expect("fair state");
        vm.now_ns = START_NS;
        let frame = tcp_frame(0, 128, Ecn::NotEct);
        let first = vm.run(EGRESS_PROGRAM, &frame).expect("runs");
        assert_eq!(first.ret, -1);
        assert_eq!(vm.tstamp(), 0, "an idle flow leaves at once, unstamped");
        vm.now_ns += 1_000;
        vm.run(EGRESS_PROGRAM, &frame).expect("runs");
        // The second packet waits out the first one's 10 µs, less the 1 µs
        // that passed.
        assert_eq!(vm.tstamp(), START_NS + 10_000);
    }
}
