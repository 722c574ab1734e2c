//! The link-layer framing part of the lab benchmark: the links and traffic
//! of [`crate::lab::overhead`], each under CAKE with the link's options,
//! the shaper with them and the shaper with none, `reps` rounds with the
//! states interleaved; per link and state the medians of `ping_p99_ms`
//! and `goodput_ratio`, each figure's spread under `spread`.
//!
//! Units: ms; goodput as a part of the shaping rate.

use std::{collections::BTreeMap, path::Path, time::Duration};

use serde::Serialize;
use tracing::info;

use crate::lab::{
    LabError, Testbed, Timing,
    overhead::{CASES, figures, scenario, states, testbed_options},
    run_scenario,
};

use super::cases::Spread;

/// The pings' interval.
const PING_EVERY: Duration = Duration::from_millis(20);

/// One state's figures on one link.
#[derive(Clone, Debug, Serialize)]
pub struct FramedState {
    /// Median ping p99, ms.
    pub ping_p99_ms: f64,
    /// Median goodput of every flow together, of the shaping rate.
    pub goodput_ratio: f64,
    /// Each figure over the rounds.
    pub spread: BTreeMap<&'static str, Spread>,
}

/// Runs every link's cases; per link (`atm`, `ptm`, `ethernet`) and
/// state (`cake`, `shaper`, `shaper_no_overhead`) the figures.
pub fn run(
    bin: &Path,
    timing: Timing,
    reps: u32,
) -> Result<BTreeMap<&'static str, BTreeMap<&'static str, FramedState>>, LabError> {
    let mut out = BTreeMap::new();
    for case in &CASES {
        let tb = Testbed::new(testbed_options(case))?;
        let mut runs: BTreeMap<&'static str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        for rep in 0..reps.max(1) {
            for (name, state) in states(case, bin) {
                info!(link = case.name, state = name, rep, "framing case");
                let r = run_scenario(&tb, &scenario(state, timing, PING_EVERY))?;
                let (p99, goodput) = figures(&r);
                let e = runs.entry(name).or_default();
                e.0.push(p99);
                e.1.push(goodput);
            }
        }
        let by_state = runs
            .into_iter()
            .map(|(name, (p99, goodput))| {
                let (p99, goodput) = (Spread::of(p99), Spread::of(goodput));
                (
                    name,
                    FramedState {
                        ping_p99_ms: p99.median,
                        goodput_ratio: goodput.median,
                        spread: BTreeMap::from([("ping_p99_ms", p99), ("goodput_ratio", goodput)]),
                    },
                )
            })
            .collect();
        out.insert(case.name, by_state);
    }
    Ok(out)
}

/// The framing cases as a table: per link, each state's median ping p99
/// and goodput.
pub fn table(doc: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut t = String::from("framing: link, state, ping p99 ms, goodput / rate\n");
    for (link, states) in doc.as_object().into_iter().flatten() {
        for (state, f) in states.as_object().into_iter().flatten() {
            let num = |k: &str| {
                f.get(k)
                    .and_then(serde_json::Value::as_f64)
                    .map_or_else(|| "-".to_owned(), |x| format!("{x:.3}"))
            };
            let _ = writeln!(
                t,
                "  {link:<9} {state:<19} {} {}",
                num("ping_p99_ms"),
                num("goodput_ratio")
            );
        }
    }
    t
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_lists_each_link_and_state() {
        let doc = serde_json::json!({"atm": {"cake": {"ping_p99_ms": 23.1, "goodput_ratio": 0.404},
                                             "shaper_no_overhead": {"ping_p99_ms": 222.0}}});
        let t = super::table(&doc);
        assert!(
            t.contains("atm       cake                23.100 0.404"),
            "{t}"
        );
        assert!(t.contains("shaper_no_overhead  222.000 -"), "{t}");
    }
}
