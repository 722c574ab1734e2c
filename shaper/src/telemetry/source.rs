//! Where the pacer's records and readings come from: the loaded object's
//! `SHAPER_EVENTS` ring buffer, its `SHAPER_COUNTERS` per-CPU array, and for
//! the fair pacer the gauges of its shared state (`SHAPER_FAIR`, with the
//! rate from `SHAPER_CONFIG`, which `set-rate` changes) and, with more than
//! one tin, each tin's share and counters (`SHAPER_TIN_COUNTERS`), taken
//! out of the `Ebpf` (the pins, made before, keep their own references).

use aya::{
    Ebpf,
    maps::{Array, MapData, PerCpuArray, RingBuf},
};
use shaper_common::{
    config::PacerConfig,
    fair::{FairState, MULT_ONE},
    maps,
    tins::{Diffserv, TinCounters},
};

use super::{
    TelemetryError,
    pipeline::{CounterSource, Readings},
};
use crate::counters::CounterSnapshot;

fn ring_err(map: &str, detail: impl std::fmt::Display) -> TelemetryError {
    TelemetryError::Ring {
        map: map.to_owned(),
        detail: detail.to_string(),
    }
}

fn take<T: TryFrom<aya::maps::Map>>(ebpf: &mut Ebpf, map: &str) -> Result<T, TelemetryError>
where
    T::Error: std::fmt::Display,
{
    let m = ebpf
        .take_map(map)
        .ok_or_else(|| ring_err(map, "the BPF object has no such map"))?;
    T::try_from(m).map_err(|e| ring_err(map, e))
}

/// The fair pacer's gauges from its shared state and configuration: the
/// multiplier `m`, the share each backlogged flow gets (the rate over
/// `m`), and the active, backlogged and committed flow counts as `shaper
/// status` reports them. Empty when a map cannot be read.
pub fn fair_gauges(state: &FairState, config: &PacerConfig) -> Vec<(&'static str, f64)> {
    let m = state.mult_q16.max(MULT_ONE);
    vec![
        ("fair_multiplier", m as f64 / MULT_ONE as f64),
        (
            "fair_share_bytes_per_second",
            state.share_bytes_per_s(config.rate_bytes_per_s) as f64,
        ),
        ("fair_active_flows", state.active_flows() as f64),
        ("fair_backlogged_flows", state.backlogged_flows() as f64),
        ("fair_committed_flows", state.committed_flows() as f64),
    ]
}

/// The pacer's ring buffer and a reader of its counters and, when `fair`,
/// of the fair pacer's gauges ([`fair_gauges`]).
pub fn pacer(
    ebpf: &mut Ebpf,
    fair: bool,
) -> Result<(RingBuf<MapData>, CounterSource), TelemetryError> {
    let shared = if fair {
        let state: Array<MapData, FairState> = take(ebpf, maps::FAIR)?;
        let config: Array<MapData, PacerConfig> = take(ebpf, maps::CONFIG)?;
        let tins: PerCpuArray<MapData, TinCounters> = take(ebpf, maps::TIN_COUNTERS)?;
        Some((state, config, tins))
    } else {
        None
    };
    let ring: RingBuf<MapData> = take(ebpf, maps::EVENTS)?;
    let counters: PerCpuArray<MapData, u64> = take(ebpf, maps::COUNTERS)?;
    let read: CounterSource = Box::new(move || {
        let counters = CounterSnapshot::read(&counters)?.named();
        let mut readings = Readings {
            counters,
            ..Readings::default()
        };
        let Some((state, config, tins)) = &shared else {
            return Ok(readings);
        };
        let Ok(c) = config.get(&0, 0) else {
            return Ok(readings);
        };
        if let Ok(s) = state.get(&0, 0) {
            readings.gauges = fair_gauges(&s, &c);
        }
        if Diffserv::from_index(c.diffserv).tins() > 1 {
            readings.tins = crate::tin_status::collect(state, tins, &c).unwrap_or_default();
        }
        Ok(readings)
    });
    Ok((ring, read))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_gauges_show_the_share_and_the_counts() {
        let state = FairState {
            mult_q16: 2 * MULT_ONE,
            mult_feedback_q16: 2 * MULT_ONE,
            active_now: 3,
            active_last: 2,
            backlogged_ref_q8: 300,
            committed: 4 * shaper_common::committed::WEIGHT_ONE,
            ..FairState::default()
        };
        let rate = shaper_common::rate::ScaledRate::from_bytes_per_s(1_000_000).expect("rate");
        let config = PacerConfig::new(1_000_000, rate);
        let g = fair_gauges(&state, &config);
        assert_eq!(
            g,
            vec![
                ("fair_multiplier", 2.0),
                ("fair_share_bytes_per_second", 500_000.0),
                ("fair_active_flows", 3.0),
                ("fair_backlogged_flows", 2.0),
                ("fair_committed_flows", 4.0),
            ]
        );
    }
}
