//! One measurement of the host part: what to measure ([`HostOptions`]), the
//! loop over `BPF_PROG_TEST_RUN` calls on one frame ([`single_calls`]), and
//! what a path's samples, counter deltas and helper calls become
//! ([`PathResult`]). The flow mixes and the report live in
//! [`super::host`], whose header gives the method.
//!
//! Units: nanoseconds per packet; rates in bytes per second.

use std::{
    collections::BTreeMap,
    thread::sleep,
    time::{Duration, Instant},
};

use serde::Serialize;
use shaper_common::{
    calls::HELPERS,
    counters::Counter,
    flow::WAYS,
    rate::{MAX_RATE_BYTES_PER_S, MIN_RATE_BYTES_PER_S},
};

use super::{
    calls::{self, Totals},
    loaded::{Bench, BenchError, Counts, Prog},
};

/// What to measure.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// Distinct tuples of the flow mixes.
    pub flows: u32,
    /// Rounds over all tuples (flow mixes).
    pub rounds: u32,
    /// Rounds of the own costs side by side (`anchor`).
    pub anchor_rounds: u32,
    /// Repetitions per call in the flow mixes.
    pub mix_repeat: u32,
    /// Calls on the single-flow paths.
    pub calls: u32,
    /// Repetitions per call on the single-flow paths.
    pub repeat: u32,
    /// Frame length in bytes (Ethernet header included).
    pub frame_len: usize,
    /// Flow-table sets (a power of two).
    pub sets: u32,
}

impl Default for HostOptions {
    fn default() -> Self {
        Self {
            flows: 10_000,
            rounds: 5,
            anchor_rounds: 11,
            mix_repeat: 4,
            calls: 200,
            repeat: 1000,
            frame_len: 128,
            sets: shaper_common::flow::DEFAULT_FLOWS / WAYS as u32,
        }
    }
}

/// One path's figures.
#[derive(Clone, Debug, Serialize)]
pub struct PathResult {
    /// Median over samples of the mean ns per packet.
    pub ns_per_packet: f64,
    /// Smallest sample.
    pub ns_per_packet_min: f64,
    /// Largest sample.
    pub ns_per_packet_max: f64,
    /// The passthrough classifier, same frames and call pattern.
    pub passthrough_ns_per_packet: f64,
    /// `ns_per_packet - passthrough_ns_per_packet`.
    pub pacer_ns_per_packet: f64,
    /// Packets measured.
    pub packets: u64,
    /// Samples (calls or rounds) the median is taken over.
    pub samples: usize,
    /// Distinct tuples.
    pub flows: u32,
    /// Repetitions per call.
    pub repeat: u32,
    /// Flow-mix chunk size (0 for single-flow paths).
    pub chunk: usize,
    /// The configured rate.
    pub rate_bytes_per_s: u64,
    /// One frame's transmission time at that rate, ns.
    pub tx_ns: u64,
    /// The counter this path is meant to move.
    pub intended: &'static str,
    /// Its share of the measured packets.
    pub intended_fraction: f64,
    /// Each outcome counter's share of the measured packets.
    pub verdicts: BTreeMap<&'static str, f64>,
    /// Helper calls per measured packet, all helpers; only for a pass run
    /// with the counters attached (whose time is not the path's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub helper_calls_per_packet: Option<f64>,
    /// The same, by helper (helpers never called left out).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub helper_calls: BTreeMap<&'static str, f64>,
}

/// Counters that say what happened to a packet.
pub(super) const OUTCOMES: [Counter; 10] = [
    Counter::PassedUnpaced,
    Counter::Paced,
    Counter::CeMarked,
    Counter::AqmDrop,
    Counter::HorizonDrop,
    Counter::FlowNew,
    Counter::FlowTableFull,
    Counter::PoliceDrop,
    Counter::PoliceWithheld,
    Counter::PoliceClamped,
];

/// Median, min and max of `samples` (empty: zeros).
pub(super) fn spread(samples: &mut [f64]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    samples.sort_by(f64::total_cmp);
    let mid = samples.len() / 2;
    let median = if samples.len().is_multiple_of(2) {
        (samples[mid - 1] + samples[mid]) / 2.0
    } else {
        samples[mid]
    };
    (median, samples[0], samples[samples.len() - 1])
}

/// Largest flow-mix chunk.
const MAX_CHUNK: usize = 256;

/// One call of every frame, the flow mixes' warm-up (it claims every
/// flow); the mean wall time of a call in ns, at least 1.
pub(super) fn warm_up(
    frames: &[Vec<u8>],
    mut call: impl FnMut(&[u8]) -> Result<f64, BenchError>,
) -> Result<u128, BenchError> {
    let t = Instant::now();
    for f in frames {
        call(f)?;
    }
    Ok((t.elapsed().as_nanos() / frames.len().max(1) as u128).max(1))
}

/// The paced flow mix's chunk: the flows primed before their measured
/// calls, so that a flow's priming and measured calls, about a chunk of
/// calls of `call_ns` apart, lie within a third of its transmission time.
pub(super) fn mix_chunk(tx_ns: u64, call_ns: u128) -> usize {
    usize::try_from(u128::from(tx_ns / 3) / call_ns.max(1))
        .unwrap_or(MAX_CHUNK)
        .clamp(1, MAX_CHUNK)
}

/// Transmission time per frame on the aqm_drop and horizon_drop paths.
pub(super) const SLOW_TX_NS: u64 = 50_000_000;
/// ECT(0) frames that drive the aqm_drop flow's clock ahead (9 × 50 ms,
/// staying under the 500 ms horizon).
pub(super) const AQM_PRIME_REPEAT: u32 = 9;
/// Sum of the scheduled delays the flow-mix measured packets may reach:
/// below CoDel's 5 ms target.
pub(super) const MIX_DELAY_BUDGET_NS: u64 = 4_000_000;
/// Transmission time per frame on the aggregate pacer's mix, 10 µs: a
/// round of the default mix (10,000 flows × 4) advances the clock 400 ms,
/// inside the 500 ms horizon. Larger mixes are paced at a shorter time
/// (`host::aggregate_tx_ns`).
pub(super) const AGGREGATE_TX_NS: u64 = 10_000;

/// Rate at which a `len`-byte frame takes `tx_ns`, clamped to the range.
pub(super) fn rate_for(len: usize, tx_ns: u64) -> u64 {
    let rate = (len as u64).saturating_mul(1_000_000_000) / tx_ns.max(1);
    rate.clamp(MIN_RATE_BYTES_PER_S, MAX_RATE_BYTES_PER_S)
}

/// What a measurement loop produced, before the passthrough is added.
pub(super) struct Measured {
    pub(super) samples: Vec<f64>,
    pub(super) packets: u64,
    pub(super) delta: Counts,
    /// Helper calls of the measured packets, when counted.
    pub(super) helpers: Option<Totals>,
}

impl Measured {
    pub(super) fn new() -> Self {
        Self {
            samples: Vec::new(),
            packets: 0,
            delta: Counts::default(),
            helpers: None,
        }
    }

    pub(super) fn add_delta(&mut self, before: &Counts, after: &Counts) {
        self.delta = self.delta.plus(&after.delta(before));
    }

    pub(super) fn add_helpers(&mut self, before: Option<Totals>, after: Option<Totals>) {
        if let (Some(b), Some(a)) = (before, after) {
            let d = calls::delta(&b, &a);
            let sum = self.helpers.get_or_insert([0; HELPERS.len()]);
            for (s, x) in sum.iter_mut().zip(d) {
                *s += x;
            }
        }
    }
}

pub(super) struct PathSpec {
    pub(super) flows: u32,
    pub(super) repeat: u32,
    pub(super) chunk: usize,
    pub(super) rate_bytes_per_s: u64,
    pub(super) tx_ns: u64,
    pub(super) intended: Counter,
}

impl PathSpec {
    /// A single flow's path: no chunking.
    pub(super) fn one_flow(
        repeat: u32,
        rate_bytes_per_s: u64,
        tx_ns: u64,
        intended: Counter,
    ) -> Self {
        Self {
            flows: 1,
            repeat,
            chunk: 0,
            rate_bytes_per_s,
            tx_ns,
            intended,
        }
    }
}

pub(super) fn result(spec: &PathSpec, mut m: Measured, passthrough_ns: f64) -> PathResult {
    let (median, min, max) = spread(&mut m.samples);
    let packets = m.packets.max(1) as f64;
    let verdicts: BTreeMap<&'static str, f64> = OUTCOMES
        .iter()
        .map(|&c| (c.name(), m.delta[c] as f64 / packets))
        .collect();
    let seen = m.delta[Counter::Packets];
    if seen != m.packets {
        tracing::warn!(
            expected = m.packets,
            seen,
            "the packets counter moved by a different amount than the packets run"
        );
    }
    PathResult {
        ns_per_packet: median,
        ns_per_packet_min: min,
        ns_per_packet_max: max,
        passthrough_ns_per_packet: passthrough_ns,
        pacer_ns_per_packet: median - passthrough_ns,
        packets: m.packets,
        samples: m.samples.len(),
        flows: spec.flows,
        repeat: spec.repeat,
        chunk: spec.chunk,
        rate_bytes_per_s: spec.rate_bytes_per_s,
        tx_ns: spec.tx_ns,
        intended: spec.intended.name(),
        intended_fraction: m.delta[spec.intended] as f64 / packets,
        verdicts,
        helper_calls_per_packet: m.helpers.map(|h| h.iter().sum::<u64>() as f64 / packets),
        helper_calls: m
            .helpers
            .map(|h| {
                HELPERS
                    .iter()
                    .zip(h)
                    .filter(|(_, n)| *n > 0)
                    .map(|(helper, n)| (helper.name, n as f64 / packets))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// `calls` calls of `repeat` on one frame of one program; median per-packet ns.
pub(super) fn single_calls(
    b: &Bench,
    prog: Prog,
    frame: &[u8],
    calls: u32,
    repeat: u32,
    pause: Duration,
) -> Result<Measured, BenchError> {
    let mut m = Measured::new();
    for _ in 0..calls {
        let before = b.counts()?;
        let ns = b.call(prog, frame, repeat)?;
        let after = b.counts()?;
        m.add_delta(&before, &after);
        m.samples.push(ns / f64::from(repeat));
        m.packets += u64::from(repeat);
        if !pause.is_zero() {
            sleep(pause);
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shaper_common::rate::ScaledRate;

    #[test]
    fn spread_is_median_min_max() {
        assert_eq!(spread(&mut [3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(spread(&mut [4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
        assert_eq!(spread(&mut []), (0.0, 0.0, 0.0));
    }

    #[test]
    fn rates_give_the_intended_transmission_time() {
        let rate = rate_for(128, 1_000_000);
        assert_eq!(rate, 128_000);
        let tx = ScaledRate::from_bytes_per_s(rate)
            .expect("in range")
            .tx_time_ns(128);
        assert_eq!(tx, 1_000_000);
        assert_eq!(rate_for(128, 1), MAX_RATE_BYTES_PER_S);
        assert_eq!(rate_for(1, u64::MAX), MIN_RATE_BYTES_PER_S);
    }
}
