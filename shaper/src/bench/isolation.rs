//! The host-isolation part of the lab benchmark: the case of
//! [`crate::lab::hosts`] (host A with 8 TCP flows beside host B with 1)
//! behind the testbed's NAT, under CAKE with `nat dual-srchost` on the
//! upload and in ingress mode with `nat dual-dsthost` on the download,
//! and under the shaper with the same modes and `--nat` (the download on
//! its IFB), plus the shaper without `--nat` on the upload; `reps` rounds
//! with the states interleaved, each figure the median with its spread.
//!
//! Units: host B's share of what both hosts carried.

use std::{collections::BTreeMap, path::Path};

use serde::Serialize;
use shaper_common::hosts::Isolation;
use tracing::info;

use super::cases::Spread;
use crate::{
    lab::{
        LabError, Scenario, State, Testbed, TestbedOptions, Timing,
        hosts::{cake_options, flows, shaper_args},
        run_scenario,
    },
    rate::Rate,
};

/// One state's figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IsolationState {
    /// Median share of host B on the upload.
    pub up_host_b_share: Option<f64>,
    /// Median share of host B on the download.
    pub down_host_b_share: Option<f64>,
    /// Median share of host B on the upload without `--nat` (the
    /// shaper's only).
    pub up_host_b_share_no_nat: Option<f64>,
    /// Each figure over the rounds.
    pub spread: BTreeMap<&'static str, Spread>,
}

/// A run of the case: (state name, figure, state, downloads).
type Run = (&'static str, &'static str, State, bool);

fn runs(bin: &Path, rate: Rate) -> Vec<Run> {
    let shaper = |mode, nat| State::Shaper {
        bin: bin.to_owned(),
        rate,
        extra_args: shaper_args(mode, nat),
    };
    vec![
        (
            "cake",
            "up_host_b_share",
            State::CakeWith {
                rate,
                options: cake_options(Isolation::DualSrcHost, true),
            },
            false,
        ),
        (
            "cake",
            "down_host_b_share",
            State::CakeIngress {
                rate,
                options: cake_options(Isolation::DualDstHost, true),
            },
            true,
        ),
        (
            "shaper",
            "up_host_b_share",
            shaper(Isolation::DualSrcHost, true),
            false,
        ),
        (
            "shaper",
            "down_host_b_share",
            State::ShaperIngress {
                bin: bin.to_owned(),
                rate,
                extra_args: shaper_args(Isolation::DualDstHost, true),
            },
            true,
        ),
        (
            "shaper",
            "up_host_b_share_no_nat",
            shaper(Isolation::DualSrcHost, false),
            false,
        ),
    ]
}

/// Runs the case `reps` times at `rate`; per state (`cake`, `shaper`) its
/// figures.
pub fn run(
    bin: &Path,
    rate: Rate,
    timing: Timing,
    reps: u32,
) -> Result<BTreeMap<&'static str, IsolationState>, LabError> {
    let tb = Testbed::new(TestbedOptions {
        nat: true,
        ..TestbedOptions::default()
    })?;
    let mut shares: BTreeMap<(&'static str, &'static str), Vec<f64>> = BTreeMap::new();
    for rep in 0..reps.max(1) {
        for (state_name, figure, state, down) in runs(bin, rate) {
            info!(state = state_name, figure, rep, "host isolation case");
            let r = run_scenario(&tb, &Scenario::new(state, flows(down), timing))?;
            shares
                .entry((state_name, figure))
                .or_default()
                .push(r.part(1));
        }
    }
    let mut out: BTreeMap<&'static str, IsolationState> = BTreeMap::new();
    for ((state_name, figure), v) in shares {
        let s = Spread::of(v);
        let e = out.entry(state_name).or_default();
        let slot = match figure {
            "up_host_b_share" => &mut e.up_host_b_share,
            "down_host_b_share" => &mut e.down_host_b_share,
            _ => &mut e.up_host_b_share_no_nat,
        };
        *slot = Some(s.median);
        e.spread.insert(figure, s);
    }
    Ok(out)
}

/// The case as a table: per state, host B's median shares.
pub fn table(doc: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut t = String::from(
        "host isolation through NAT (A 8 flows, B 1): state, B's share up, down, up without --nat\n",
    );
    for (state, f) in doc.as_object().into_iter().flatten() {
        let num = |k: &str| {
            f.get(k)
                .and_then(serde_json::Value::as_f64)
                .map_or_else(|| "-".to_owned(), |x| format!("{x:.3}"))
        };
        let _ = writeln!(
            t,
            "  {state:<7} {} {} {}",
            num("up_host_b_share"),
            num("down_host_b_share"),
            num("up_host_b_share_no_nat")
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_figure_has_its_run_and_the_table_lists_them() {
        let r = runs(
            Path::new("/usr/sbin/shaper"),
            "50mbit".parse().expect("rate"),
        );
        let names: Vec<(&str, &str)> = r.iter().map(|(s, f, _, _)| (*s, *f)).collect();
        assert_eq!(names.len(), 5);
        for f in ["up_host_b_share", "down_host_b_share"] {
            assert!(names.contains(&("cake", f)) && names.contains(&("shaper", f)));
        }
        assert!(names.contains(&("shaper", "up_host_b_share_no_nat")));
        let doc = serde_json::json!({"cake": {"up_host_b_share": 0.462, "down_host_b_share": 0.489},
                                     "shaper": {"up_host_b_share": 0.479, "up_host_b_share_no_nat": 0.111}});
        let t = table(&doc);
        assert!(t.contains("cake    0.462 0.489 -"), "{t}");
        assert!(t.contains("shaper  0.479 - 0.111"), "{t}");
    }
}
