//! The fair pacer's own cost beside the aggregate pacer's, the anchor,
//! measured round by round so that both share the machine's moment.
//!
//! Why rounds side by side: the host part measures its paths one after
//! another, seconds apart, and on a shared host the cost of everything
//! drifts over seconds, the passthrough's too. A ratio of two figures taken
//! apart carries that drift; a ratio within one round does not.
//!
//! Method.
//! - Each round runs, back to back over the same tuples and `repeat` per
//!   call: the passthrough, the clock read alone, the fair pacer's paced
//!   mix (`concurrency::pass`: per chunk of flows one priming packet per
//!   flow, then the measured ones), and the aggregate pacer's mix from a
//!   clock at now. `host`'s header has how each mix is paced.
//! - Between the two pacers only the configuration changes (the rate, and
//!   the fair pacer's flag). The flow table keeps its flows, which the
//!   aggregate pacer never touches, and the link's front stays out of reach
//!   (`loaded::frozen_link`).
//! - A round's own cost of a pacer is its ns per packet less that round's
//!   passthrough, and its ratio is the fair pacer's own cost over the
//!   aggregate pacer's. The figures are the medians over rounds, each with
//!   its smallest and largest round.
//! - The counters, read around each pacer's measured calls, give the share
//!   of its measured packets that were paced: a figure for another path is
//!   not this one.
//!
//! Units: nanoseconds per packet (f64), fractions (0..=1), rates in bytes
//! per second.
//!
//! Non-goals: the other paths and their verdicts (`host`), two CPUs at once
//! (`concurrency`).

use std::{thread::sleep, time::Duration};

use serde::Serialize;
use shaper_common::{config::FLAG_FAIR, counters::Counter};

use super::{
    concurrency,
    loaded::{Bench, BenchError, Prog},
    measure::{mix_chunk, spread, warm_up},
};
use crate::telemetry::pipeline::monotonic_ns;

/// A figure's median round, with the smallest and largest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Rounds {
    /// The median round.
    pub median: f64,
    /// The smallest round.
    pub min: f64,
    /// The largest round.
    pub max: f64,
}

impl Rounds {
    fn of(samples: &mut [f64]) -> Self {
        let (median, min, max) = spread(samples);
        Self { median, min, max }
    }
}

/// Both pacers' own costs, round by round.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AnchorReport {
    /// Rounds measured.
    pub rounds: u32,
    /// The passthrough, ns per packet.
    pub passthrough_ns: Rounds,
    /// The clock read alone less the passthrough.
    pub clock_read_ns: Rounds,
    /// The fair pacer's paced mix less the passthrough.
    pub pacer_own_ns: Rounds,
    /// The aggregate pacer's mix less the passthrough.
    pub aggregate_own_ns: Rounds,
    /// Each round's `pacer_own_ns / aggregate_own_ns`.
    pub own_cost_ratio: Rounds,
    /// Of the fair pacer's measured packets, the share paced.
    pub pacer_paced_fraction: f64,
    /// Of the aggregate pacer's measured packets, the share paced.
    pub aggregate_paced_fraction: f64,
}

/// The two pacers' mixes: the rate each runs at, and a frame's
/// transmission time at it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Mixes {
    /// The fair pacer's rate.
    pub fair_rate_bytes_per_s: u64,
    /// A frame's transmission time at the fair pacer's rate.
    pub fair_tx_ns: u64,
    /// The aggregate pacer's rate.
    pub aggregate_rate_bytes_per_s: u64,
}

/// Measures `rounds` rounds over `frames`, `repeat` packets per call.
pub(super) fn run(
    b: &mut Bench,
    frames: &[Vec<u8>],
    rounds: u32,
    repeat: u32,
    mixes: Mixes,
) -> Result<AnchorReport, BenchError> {
    let fair = |b: &mut Bench| b.configure(mixes.fair_rate_bytes_per_s, |_| {});
    let aggregate =
        |b: &mut Bench| b.configure(mixes.aggregate_rate_bytes_per_s, |c| c.flags &= !FLAG_FAIR);
    b.prepare(mixes.fair_rate_bytes_per_s, |_| {})?;
    let call_ns = warm_up(frames, |f| b.call(Prog::Egress, f, 1))?;
    let chunk = mix_chunk(mixes.fair_tx_ns, call_ns);
    let mut pass = Vec::new();
    let mut clock = Vec::new();
    let mut own = Vec::new();
    let mut agg_own = Vec::new();
    let mut ratio = Vec::new();
    let (mut paced, mut measured) = (0u64, 0u64);
    let (mut agg_paced, mut agg_measured) = (0u64, 0u64);
    for _ in 0..rounds {
        // Every flow's clock idle again before its priming packet.
        sleep(Duration::from_millis(10));
        let p = per_packet(every_frame(b, Prog::Pass, frames, repeat)?);
        let c = per_packet(every_frame(b, Prog::Clock, frames, repeat)?) - p;

        fair(b)?;
        let before = b.counts()?;
        let (ns, n) = concurrency::pass(b.fd(Prog::Egress), frames, chunk, repeat)?;
        let after = b.counts()?;
        paced += after[Counter::Paced].saturating_sub(before[Counter::Paced]);
        measured += n;
        let fair_own = per_packet((ns, n)) - p;

        aggregate(b)?;
        b.set_aggregate_clock(monotonic_ns())?;
        let before = b.counts()?;
        let (ns, n) = every_frame(b, Prog::Egress, frames, repeat)?;
        let after = b.counts()?;
        agg_paced += after[Counter::Paced].saturating_sub(before[Counter::Paced]);
        agg_measured += n;
        let aggregate_own = per_packet((ns, n)) - p;

        pass.push(p);
        clock.push(c);
        own.push(fair_own);
        agg_own.push(aggregate_own);
        ratio.push(if aggregate_own > 0.0 {
            fair_own / aggregate_own
        } else {
            f64::NAN
        });
    }
    fair(b)?;
    Ok(AnchorReport {
        rounds,
        passthrough_ns: Rounds::of(&mut pass),
        clock_read_ns: Rounds::of(&mut clock),
        pacer_own_ns: Rounds::of(&mut own),
        aggregate_own_ns: Rounds::of(&mut agg_own),
        own_cost_ratio: Rounds::of(&mut ratio),
        pacer_paced_fraction: paced as f64 / measured.max(1) as f64,
        aggregate_paced_fraction: agg_paced as f64 / agg_measured.max(1) as f64,
    })
}

/// `prog` over every frame, `repeat` per call: the calls' total ns and
/// packets.
fn every_frame(
    b: &Bench,
    prog: Prog,
    frames: &[Vec<u8>],
    repeat: u32,
) -> Result<(f64, u64), BenchError> {
    let mut ns = 0.0;
    for f in frames {
        ns += b.call(prog, f, repeat)?;
    }
    Ok((ns, frames.len() as u64 * u64::from(repeat)))
}

/// Total ns over packets.
fn per_packet((ns, packets): (f64, u64)) -> f64 {
    ns / packets.max(1) as f64
}
