//! Reading the per-CPU counter arrays the BPF programs keep, as totals by
//! [`Counter`]. Each CPU's slot wraps on its own, so the sum wraps too:
//! deltas of totals stay exact across a wrap.

use aya::maps::{MapData, PerCpuArray};
use shaper_common::counters::Counter;

/// Every counter of `a`, summed over the CPUs (0 for one the kernel does not
/// answer for).
pub fn sum_per_cpu<T: std::borrow::Borrow<MapData>>(
    a: &PerCpuArray<T, u64>,
) -> Vec<(Counter, u64)> {
    Counter::ALL
        .iter()
        .map(|&c| {
            let sum = a
                .get(&(c as u32), 0)
                .map(|v| v.iter().copied().fold(0u64, u64::wrapping_add))
                .unwrap_or(0);
            (c, sum)
        })
        .collect()
}

/// Counter `c` in `counts` (0 when absent).
pub fn get(counts: &[(Counter, u64)], c: Counter) -> u64 {
    counts.iter().find(|(k, _)| *k == c).map_or(0, |(_, n)| *n)
}
