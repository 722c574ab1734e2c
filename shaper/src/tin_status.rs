//! The tins' part of `shaper status` and of `run`'s telemetry: each tin's
//! threshold, the share its flows get now, and its counters (packets,
//! bytes, drops, marks, mean scheduled delay), read from the pinned maps
//! ([`read`]) or from the loaded object's ([`collect`]). Shown when the
//! pacer runs more than one tin.

use std::fmt::Write as _;
use std::path::Path;

use std::borrow::Borrow;

use aya::maps::{Array, MapData, MapError, PerCpuArray};
use shaper_common::{
    config::PacerConfig,
    fair::FairState,
    tins::{Diffserv, TinCounters},
};

use crate::{
    hook::{AttachError, pin_err},
    pins,
};

/// One tin as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TinStatus {
    /// Its index (priority rises with it).
    pub tin: usize,
    /// CAKE's name for it.
    pub name: &'static str,
    /// The rate it holds with priority, bytes per second.
    pub threshold_bytes_per_s: u64,
    /// What each of its backlogged flows gets now, bytes per second.
    pub share_bytes_per_s: u64,
    /// Packets, wire bytes, drops and marks, summed over CPUs.
    pub packets: u64,
    /// See `packets`.
    pub bytes: u64,
    /// See `packets`.
    pub drops: u64,
    /// See `packets`.
    pub marks: u64,
    /// The scheduled delay of its packets, summed, ns.
    pub delay_ns: u64,
}

impl TinStatus {
    /// Mean scheduled delay per packet, µs.
    pub fn mean_delay_us(&self) -> f64 {
        if self.packets == 0 {
            0.0
        } else {
            self.delay_ns as f64 / self.packets as f64 / 1000.0
        }
    }
}

/// The tins of the pacer pinned in `pin_dir` with configuration `c`;
/// `None` for one tin, or when the pins are not visible here.
pub fn read(pin_dir: &Path, c: &PacerConfig) -> Result<Option<Vec<TinStatus>>, AttachError> {
    let mode = Diffserv::from_index(c.diffserv);
    if mode.tins() < 2 || !c.fair() {
        return Ok(None);
    }
    let counters_path = pin_dir.join(pins::TIN_COUNTERS);
    let (Some(fair), Some(counters)) = (
        pins::open(&pin_dir.join(pins::FAIR))?,
        pins::open(&counters_path)?,
    ) else {
        return Ok(None);
    };
    let fair_path = pin_dir.join(pins::FAIR);
    let fair = Array::<_, FairState>::try_from(fair).map_err(|e| pin_err("use", &fair_path, e))?;
    let counters = PerCpuArray::<_, TinCounters>::try_from(counters)
        .map_err(|e| pin_err("use", &counters_path, e))?;
    collect(&fair, &counters, c).map(Some).map_err(|(map, e)| {
        let path = if map == pins::FAIR {
            &fair_path
        } else {
            &counters_path
        };
        pin_err("read", path, e)
    })
}

/// The tins of the pacer with configuration `c`, from its fair state and
/// tin counters (one entry per tin; the counters summed over CPUs). On a
/// failed read, the pin name of the map that failed and why.
pub fn collect<F: Borrow<MapData>, C: Borrow<MapData>>(
    fair: &Array<F, FairState>,
    counters: &PerCpuArray<C, TinCounters>,
    c: &PacerConfig,
) -> Result<Vec<TinStatus>, (&'static str, MapError)> {
    let mode = Diffserv::from_index(c.diffserv);
    let mut out = Vec::with_capacity(mode.tins());
    for tin in 0..mode.tins() {
        let state = fair.get(&(tin as u32), 0).map_err(|e| (pins::FAIR, e))?;
        let sum = counters
            .get(&(tin as u32), 0)
            .map_err(|e| (pins::TIN_COUNTERS, e))?
            .iter()
            .fold(TinCounters::default(), |a, c| a.add(c));
        let threshold =
            (u128::from(c.rate_bytes_per_s) * u128::from(mode.threshold_q16(tin))) >> 16;
        out.push(TinStatus {
            tin,
            name: mode.tin_name(tin),
            threshold_bytes_per_s: u64::try_from(threshold).unwrap_or(u64::MAX),
            share_bytes_per_s: state.share_bytes_per_s(c.rate_bytes_per_s),
            packets: sum.packets,
            bytes: sum.bytes,
            drops: sum.drops,
            marks: sum.marks,
            delay_ns: sum.delay_ns,
        });
    }
    Ok(out)
}

/// The tins as JSON, an array in tin order.
pub fn json(tins: &[TinStatus]) -> serde_json::Value {
    serde_json::Value::Array(
        tins.iter()
            .map(|t| {
                serde_json::json!({
                    "tin": t.tin,
                    "name": t.name,
                    "threshold_bytes_per_s": t.threshold_bytes_per_s,
                    "share_bytes_per_s": t.share_bytes_per_s,
                    "packets": t.packets,
                    "bytes": t.bytes,
                    "drops": t.drops,
                    "marks": t.marks,
                    "delay_ns": t.delay_ns,
                })
            })
            .collect(),
    )
}

/// The tins as a table under `status`'s pacer lines, highest priority
/// first.
pub fn render(s: &mut String, mode: Diffserv, tins: &[TinStatus]) {
    let _ = writeln!(
        s,
        "  tins ({}):  {:<12} {:>14} {:>14} {:>10} {:>12} {:>7} {:>7} {:>10}",
        mode.name(),
        "tin",
        "threshold B/s",
        "share B/s",
        "packets",
        "bytes",
        "drops",
        "marks",
        "delay us"
    );
    for t in tins.iter().rev() {
        let _ = writeln!(
            s,
            "              {:<12} {:>14} {:>14} {:>10} {:>12} {:>7} {:>7} {:>10.1}",
            t.name,
            t.threshold_bytes_per_s,
            t.share_bytes_per_s,
            t.packets,
            t.bytes,
            t.drops,
            t.marks,
            t.mean_delay_us()
        );
    }
}
