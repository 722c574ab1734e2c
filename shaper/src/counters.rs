//! Reading the per-CPU counter arrays the BPF programs keep: one reader for
//! every caller (`status`, the telemetry sources, the tracer, the observer,
//! the benchmark and the tests), which sums a counter over the CPUs and
//! fails with the counter's name rather than answering 0.
//!
//! A [`Snapshot`] holds the totals of one counter set ([`Counter`] for the
//! pacer and the policer, [`TraceCounter`] for the tracer) at one moment,
//! indexed by the counter, with [`Snapshot::delta`] between two and
//! iteration by name.
//!
//! Invariant: each CPU's slot wraps on its own, so totals are wrapping sums
//! and deltas wrapping differences: a delta stays exact across a wrap.
//! Non-goals: consistency across counters (each is read on its own while
//! the programs run, so two totals may be a packet apart).

use std::{borrow::Borrow, marker::PhantomData, ops::Index};

use aya::maps::{MapData, PerCpuArray};
use shaper_common::{counters::Counter, trace::TraceCounter};

/// A counter set: an enum whose values index one per-CPU array.
pub trait CounterSet: Copy + Eq + std::fmt::Debug + 'static {
    /// Every counter, in index order.
    const ALL: &'static [Self];
    /// The array's map name, for errors.
    const MAP: &'static str;
    /// The counter's index in the array.
    fn index(self) -> u32;
    /// The counter's stable name (snake case).
    fn name(self) -> &'static str;
}

impl CounterSet for Counter {
    const ALL: &'static [Self] = &Counter::ALL;
    const MAP: &'static str = shaper_common::maps::COUNTERS;
    fn index(self) -> u32 {
        self as u32
    }
    fn name(self) -> &'static str {
        Counter::name(self)
    }
}

impl CounterSet for TraceCounter {
    const ALL: &'static [Self] = &TraceCounter::ALL;
    const MAP: &'static str = shaper_common::trace::names::COUNTERS;
    fn index(self) -> u32 {
        self as u32
    }
    fn name(self) -> &'static str {
        TraceCounter::name(self)
    }
}

/// A counter the kernel did not give.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("reading counter {name} ({index}) of {map}: {detail}")]
pub struct CounterError {
    /// The map.
    pub map: String,
    /// The counter's name.
    pub name: String,
    /// Its index in the map.
    pub index: u32,
    /// What aya said.
    pub detail: String,
}

/// The total over the CPUs of slot `index` of `array`: the one place a
/// per-CPU counter is summed.
pub fn read_total<T: Borrow<MapData>>(
    array: &PerCpuArray<T, u64>,
    map: &str,
    name: &str,
    index: u32,
) -> Result<u64, CounterError> {
    let per_cpu = array.get(&index, 0).map_err(|e| CounterError {
        map: map.to_owned(),
        name: name.to_owned(),
        index,
        detail: e.to_string(),
    })?;
    Ok(per_cpu.iter().copied().fold(0u64, u64::wrapping_add))
}

/// Totals of every counter of set `C` at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot<C: CounterSet> {
    totals: Vec<u64>,
    set: PhantomData<C>,
}

/// The pacer's and the policer's counters.
pub type CounterSnapshot = Snapshot<Counter>;
/// The tracer's counters.
pub type TraceSnapshot = Snapshot<TraceCounter>;

impl<C: CounterSet> Snapshot<C> {
    /// Reads every counter of `array`; the first that fails is the error.
    pub fn read<T: Borrow<MapData>>(array: &PerCpuArray<T, u64>) -> Result<Self, CounterError> {
        let totals = C::ALL
            .iter()
            .map(|&c| read_total(array, C::MAP, c.name(), c.index()))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            totals,
            set: PhantomData,
        })
    }

    /// A snapshot with `total(c)` for each counter (tests, and readers of
    /// totals that come from elsewhere).
    pub fn from_fn(mut total: impl FnMut(C) -> u64) -> Self {
        Self {
            totals: C::ALL.iter().map(|&c| total(c)).collect(),
            set: PhantomData,
        }
    }

    /// Counter `c`'s total.
    pub fn get(&self, c: C) -> u64 {
        self[c]
    }

    /// What each counter gained since `earlier`.
    pub fn delta(&self, earlier: &Self) -> Self {
        Self::from_fn(|c| self[c].wrapping_sub(earlier[c]))
    }

    /// Each counter's total plus `other`'s (deltas summed over runs).
    pub fn plus(&self, other: &Self) -> Self {
        Self::from_fn(|c| self[c].wrapping_add(other[c]))
    }

    /// Every counter with its total, in index order.
    pub fn iter(&self) -> impl Iterator<Item = (C, u64)> + '_ {
        C::ALL.iter().copied().zip(self.totals.iter().copied())
    }

    /// Every counter by its stable name, in index order.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        self.iter().map(|(c, n)| (c.name(), n)).collect()
    }
}

impl<C: CounterSet> Default for Snapshot<C> {
    /// Every counter at 0.
    fn default() -> Self {
        Self::from_fn(|_| 0)
    }
}

impl<C: CounterSet> Index<C> for Snapshot<C> {
    type Output = u64;
    fn index(&self, c: C) -> &u64 {
        const ZERO: u64 = 0;
        // `C::ALL` is in index order, so a counter's index is its position.
        self.totals.get(c.index() as usize).unwrap_or(&ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_is_there_by_index_and_by_name() {
        let s = CounterSnapshot::from_fn(|c| u64::from(c.index()) * 10);
        assert_eq!(s.get(Counter::Packets), 0);
        assert_eq!(s[Counter::NatMissed], u64::from(Counter::COUNT - 1) * 10);
        let named = s.named();
        assert_eq!(named.len(), Counter::COUNT as usize);
        assert_eq!(named[1], ("bytes", 10));
        let t = TraceSnapshot::from_fn(|_| 7);
        assert_eq!(t[TraceCounter::EventsLost], 7);
        assert_eq!(t.named().len(), TraceCounter::COUNT as usize);
    }

    #[test]
    fn deltas_are_exact_across_a_wrap() {
        let before = CounterSnapshot::from_fn(|c| u64::MAX - u64::from(c.index()));
        let after = CounterSnapshot::from_fn(|c| u64::from(c.index()) + 5);
        let d = after.delta(&before);
        for (c, n) in d.iter() {
            assert_eq!(n, 2 * u64::from(c.index()) + 6, "{c:?}");
        }
    }
}
