//! The lab part's matrix (`--matrix`): bulk TCP uploads over every
//! combination of rate, RTT, segmentation offload and flow count, each
//! under CAKE and under the shaper back to back, `reps` times, reported as
//! median goodput ratios. It is where a share logic that holds for the
//! tests' few shapes of traffic and fails elsewhere shows.
//!
//! JSON (under `vm.matrix`): keys `<rate>/<rtt ms>ms/gso_<on|off>/<n>`,
//! e.g. `50Mbit/20ms/gso_on/1`, each with `shaper` and `cake`:
//! `goodput_ratio` (median) and its `goodput` spread.
//!
//! Each run is measured for the case timing after a warm-up of 50 RTTs
//! (at least the case's own): at 80 ms, slow start and its first losses
//! last seconds, and a shorter warm-up measures them instead of the
//! shaper.
//!
//! Cost: one testbed per RTT and offload setting, and per cell two runs
//! per repetition: 48 cells, a quarter of an hour or more per repetition
//! under emulation. It runs only when asked for, with
//! `--case-reps` repetitions.
//!
//! Non-goals: pass or fail, ping (the traffic cases measure latency).

use std::{collections::BTreeMap, path::Path, time::Duration};

use serde::Serialize;
use tracing::info;

use super::cases::Spread;
use crate::{
    lab::{
        FlowSpec, Host, LabError, Scenario, State, Testbed, TestbedOptions, Timing, run_scenario,
    },
    rate::Rate,
};

/// Rates of the matrix, bit/s.
pub const RATES_BITS_PER_S: [u64; 3] = [20_000_000, 50_000_000, 200_000_000];
/// Extra round-trip delays of the client's path.
pub const RTTS: [Duration; 2] = [Duration::from_millis(20), Duration::from_millis(80)];
/// TCP streams from the client.
pub const FLOWS: [u32; 4] = [1, 2, 4, 16];

/// One state's figures in one cell.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Cell {
    /// Goodput / rate, median.
    pub goodput_ratio: f64,
    /// Its spread.
    pub goodput: Spread,
}

/// Both states of one cell.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CellPair {
    /// The shaper.
    pub shaper: Cell,
    /// CAKE.
    pub cake: Cell,
}

/// A cell's key: `<rate>/<rtt ms>ms/gso_<on|off>/<n>`.
pub fn key(rate: Rate, rtt: Duration, gso: bool, flows: u32) -> String {
    format!(
        "{rate}/{}ms/gso_{}/{flows}",
        rtt.as_millis(),
        if gso { "on" } else { "off" }
    )
}

fn cell(runs: Vec<f64>) -> Cell {
    let goodput = Spread::of(runs);
    Cell {
        goodput_ratio: goodput.median,
        goodput,
    }
}

/// The warm-up left out of each run: 50 RTTs of slow start and its first
/// losses, and at least `least`.
fn warm_up(rtt: Duration, least: Duration) -> Duration {
    (rtt * 50).max(least)
}

/// Runs the whole matrix with the shaper binary `bin`, each run measured
/// `timing.duration` after a warm-up of 50 RTTs, at least `timing.omit`.
pub fn run(bin: &Path, timing: Timing, reps: u32) -> Result<BTreeMap<String, CellPair>, LabError> {
    let mut out = BTreeMap::new();
    for rtt in RTTS {
        for gso in [true, false] {
            let tb = Testbed::new(TestbedOptions {
                client_delay: rtt,
                gso,
                ..TestbedOptions::default()
            })?;
            let timing = Timing::new(timing.duration, warm_up(rtt, timing.omit));
            for bits in RATES_BITS_PER_S {
                let rate = Rate::from_bits_per_s(bits).ok_or_else(|| LabError::Invalid {
                    detail: format!("matrix rate {bits} bit/s out of range"),
                })?;
                for n in FLOWS {
                    let flows = vec![FlowSpec::tcp(Host::Client, n)];
                    let (mut cake, mut ours) = (Vec::new(), Vec::new());
                    for _ in 0..reps.max(1) {
                        let scenario = |state| Scenario::new(state, flows.clone(), timing);
                        cake.push(run_scenario(&tb, &scenario(State::Cake { rate }))?.ratio(rate));
                        let shaper = State::Shaper {
                            bin: bin.to_path_buf(),
                            rate,
                            extra_args: Vec::new(),
                        };
                        ours.push(run_scenario(&tb, &scenario(shaper))?.ratio(rate));
                    }
                    let k = key(rate, rtt, gso, n);
                    let pair = CellPair {
                        shaper: cell(ours),
                        cake: cell(cake),
                    };
                    info!(
                        cell = %k,
                        shaper = pair.shaper.goodput_ratio,
                        cake = pair.cake.goodput_ratio,
                        "matrix cell measured"
                    );
                    out.insert(k, pair);
                }
            }
        }
    }
    Ok(out)
}

/// The matrix as table rows: one per cell, shaper beside CAKE.
pub fn table(matrix: &serde_json::Value) -> String {
    use serde_json::Value;
    let mut s = String::from("  matrix (median goodput / rate; shaper beside CAKE):\n");
    let Some(cells) = matrix.as_object() else {
        return s;
    };
    let g = |v: &Value| {
        v.pointer("/goodput_ratio")
            .and_then(Value::as_f64)
            .map_or("-".to_owned(), |x| format!("{x:.3}"))
    };
    for (k, p) in cells {
        s.push_str(&format!(
            "  {k:<26} shaper {:<7} cake {}\n",
            g(&p["shaper"]),
            g(&p["cake"])
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_up_is_fifty_rtts_or_the_least() {
        let s = Duration::from_secs;
        assert_eq!(warm_up(Duration::from_millis(80), s(2)), s(4));
        assert_eq!(warm_up(Duration::from_millis(20), s(2)), s(2));
    }

    #[test]
    fn keys_name_every_dimension_and_the_table_reads_them() {
        let rate = Rate::from_bits_per_s(50_000_000).expect("in range");
        let k = key(rate, Duration::from_millis(80), false, 16);
        assert_eq!(k, "50Mbit/80ms/gso_off/16");
        let mut m = BTreeMap::new();
        m.insert(
            k,
            CellPair {
                shaper: cell(vec![0.9, 0.95, 0.93]),
                cake: cell(vec![0.94]),
            },
        );
        let v = serde_json::to_value(&m).expect("serialises");
        assert_eq!(v["50Mbit/80ms/gso_off/16"]["shaper"]["goodput_ratio"], 0.93);
        let t = table(&v);
        assert!(
            t.contains("50Mbit/80ms/gso_off/16") && t.contains("shaper 0.930"),
            "{t}"
        );
        assert!(t.contains("cake 0.940"), "{t}");
    }
}
