//! Where the pacer's records and counters come from: the loaded object's
//! `SHAPER_EVENTS` ring buffer and `SHAPER_COUNTERS` per-CPU array, taken
//! out of the `Ebpf` (the pins, made before, keep their own references).

use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray, RingBuf},
};
use shaper_common::{counters::Counter, maps};

use super::{TelemetryError, pipeline::CounterSource};

fn ring_err(map: &str, detail: impl std::fmt::Display) -> TelemetryError {
    TelemetryError::Ring {
        map: map.to_owned(),
        detail: detail.to_string(),
    }
}

/// The pacer's ring buffer and a reader of its exact counters.
pub fn pacer(ebpf: &mut Ebpf) -> Result<(RingBuf<MapData>, CounterSource), TelemetryError> {
    let ring = ebpf
        .take_map(maps::EVENTS)
        .ok_or_else(|| ring_err(maps::EVENTS, "the BPF object has no such map"))?;
    let ring = RingBuf::try_from(ring).map_err(|e| ring_err(maps::EVENTS, e))?;
    let counters = ebpf
        .take_map(maps::COUNTERS)
        .ok_or_else(|| ring_err(maps::COUNTERS, "the BPF object has no such map"))?;
    let counters: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(counters).map_err(|e| ring_err(maps::COUNTERS, e))?;
    let read: CounterSource = Box::new(move || {
        Counter::ALL
            .iter()
            .map(|&c| {
                let sum = counters
                    .get(&(c as u32), 0)
                    .map(|v| v.iter().copied().fold(0u64, u64::wrapping_add))
                    .unwrap_or(0);
                (c.name(), sum)
            })
            .collect()
    });
    Ok((ring, read))
}
