//! The lab part's traffic cases ([`crate::lab::cases`]): each case under
//! CAKE and under the shaper, `reps` times, the two states interleaved
//! (CAKE, shaper, CAKE, ...) so that a slow stretch of the host hits both,
//! reported as medians with their min and max.
//!
//! JSON (under `vm`): `lone_flow.<case>.<shaper|cake>` and
//! `bulk_beside_sparse.<shaper|cake>` with `goodput_ratio` (the first flow
//! spec's), and `many_flows.<n>.<shaper|cake>` with `goodput_ratio` (all
//! flows) and `wire_rate_ratio` (the WAN root qdisc's bytes while the
//! flows send, [`crate::lab::cases::wire_ratio`]);
//! `unequal.<case>.<shaper|cake>` with `goodput_ratio` (all flows) and
//! `jain` (Jain's index over the two clients, median).
//!
//! Units: ratios of the configured rate; loss in percent.
//!
//! Non-goals: pass or fail (the VM tests assert), the wider matrix of rates,
//! RTTs and GSO settings.

use std::{collections::BTreeMap, path::Path};

use serde::Serialize;
use tracing::info;

use crate::{
    lab::{
        LabError, RunResult, Testbed, Timing,
        cases::{self, Case},
        run_scenario, stats,
    },
    rate::Rate,
};

/// Flow counts of the many-flow cases.
pub const MANY_FLOWS: [u32; 2] = [64, 256];

/// A figure over the repetitions.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Spread {
    /// The median.
    pub median: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
    /// Every run's figure, in run order.
    pub runs: Vec<f64>,
}

impl Spread {
    /// The median, min and max of `runs`.
    pub fn of(runs: Vec<f64>) -> Self {
        let min = runs.iter().copied().fold(f64::INFINITY, f64::min);
        let max = runs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Self {
            median: stats::percentile(&runs, 50.0).unwrap_or(f64::NAN),
            min,
            max,
            runs,
        }
    }
}

/// One state's figures in one case.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CaseState {
    /// Goodput / rate, median (the first flow spec's, or all flows' in the
    /// many-flow cases).
    pub goodput_ratio: f64,
    /// Its spread.
    pub goodput: Spread,
    /// Wire rate / rate, median (the many-flow cases).
    pub wire_rate_ratio: Option<f64>,
    /// The second flow spec's UDP loss, percent, worst run (the sparse
    /// flows of `bulk_beside_sparse`).
    pub sparse_loss_pct_max: Option<f64>,
    /// Jain's index over the flow specs, median (the cases of all flows
    /// with two specs or more: the unequal cases, 256 flows).
    pub jain: Option<f64>,
}

/// Both states of one case.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CasePair {
    /// The shaper.
    pub shaper: CaseState,
    /// CAKE.
    pub cake: CaseState,
}

/// Everything this part measures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CasesReport {
    /// Repetitions per state and case.
    pub case_reps: u32,
    /// Each lone-flow case.
    pub lone_flow: BTreeMap<String, CasePair>,
    /// The bulk flow beside sparse flows.
    pub bulk_beside_sparse: CasePair,
    /// By flow count.
    pub many_flows: BTreeMap<String, CasePair>,
    /// Unequal flows from the two clients, by case.
    pub unequal: BTreeMap<String, CasePair>,
}

fn state_of(runs: &[RunResult], rate: Rate, all_flows: bool) -> CaseState {
    let goodput = Spread::of(
        runs.iter()
            .map(|r| {
                if all_flows {
                    r.ratio(rate)
                } else {
                    cases::first_ratio(r, rate)
                }
            })
            .collect(),
    );
    // The WAN egress carries a case's traffic only for uploads: the wire
    // rate is read for the many-flow cases alone.
    let wires: Vec<f64> = runs
        .iter()
        .filter(|_| all_flows)
        .filter_map(|r| cases::wire_ratio(r, rate))
        .collect();
    let losses: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.flows.get(1).map(|f| f.report.lost_percent))
        .collect();
    // Jain's index over the flow specs means something with two or more.
    let jains: Vec<f64> = runs
        .iter()
        .filter(|r| all_flows && r.flows.len() >= 2)
        .filter_map(RunResult::jain)
        .collect();
    CaseState {
        goodput_ratio: goodput.median,
        goodput,
        wire_rate_ratio: (!wires.is_empty()).then(|| Spread::of(wires).median),
        sparse_loss_pct_max: losses.into_iter().reduce(f64::max),
        jain: (jains.len() == runs.len() && !jains.is_empty()).then(|| Spread::of(jains).median),
    }
}

fn pair(
    tb: &Testbed,
    case: &Case,
    timing: Timing,
    reps: u32,
    rate: Rate,
    all_flows: bool,
) -> Result<CasePair, LabError> {
    let (mut cake, mut ours) = (Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        cake.push(run_scenario(tb, &case.scenario(case.cake.clone(), timing))?);
        ours.push(run_scenario(
            tb,
            &case.scenario(case.shaper.clone(), timing),
        )?);
    }
    let p = CasePair {
        shaper: state_of(&ours, rate, all_flows),
        cake: state_of(&cake, rate, all_flows),
    };
    info!(
        case = %case.name,
        shaper = p.shaper.goodput_ratio,
        cake = p.cake.goodput_ratio,
        "measured"
    );
    Ok(p)
}

/// Runs every case on `tb` (the lab's default testbed) at `rate`.
pub fn run(
    tb: &Testbed,
    bin: &Path,
    rate: Rate,
    timing: Timing,
    reps: u32,
) -> Result<CasesReport, LabError> {
    let mut lone_flow = BTreeMap::new();
    for case in cases::lone_flow(bin, rate) {
        lone_flow.insert(
            case.name.clone(),
            pair(tb, &case, timing, reps, rate, false)?,
        );
    }
    let sparse = cases::bulk_beside_sparse(bin, rate);
    let bulk_beside_sparse = pair(tb, &sparse, timing, reps, rate, false)?;
    let mut many_flows = BTreeMap::new();
    for n in MANY_FLOWS {
        let case = cases::many_flows(bin, rate, n);
        many_flows.insert(n.to_string(), pair(tb, &case, timing, reps, rate, true)?);
    }
    let mut unequal = BTreeMap::new();
    let rtt_tb = Testbed::new(cases::unequal_rtt_testbed())?;
    for case in cases::unequal(bin, rate) {
        let on = if case.name == "unequal_rtt" {
            &rtt_tb
        } else {
            tb
        };
        unequal.insert(
            case.name.clone(),
            pair(on, &case, timing, reps, rate, true)?,
        );
    }
    Ok(CasesReport {
        case_reps: reps,
        lone_flow,
        bulk_beside_sparse,
        many_flows,
        unequal,
    })
}

/// The cases as table rows: case, shaper's and CAKE's median goodput with
/// their spread, and the wire ratio where measured.
pub fn table(report: &serde_json::Value) -> String {
    use serde_json::Value;
    let mut s = String::from(
        "  traffic cases (median [min-max] goodput / rate; shaper beside CAKE in the same run):\n",
    );
    let fmt = |st: &Value| {
        let g = |k: &str| st.pointer(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
        let wire = st
            .get("wire_rate_ratio")
            .and_then(Value::as_f64)
            .map_or(String::new(), |w| format!(", wire {w:.3}"));
        let jain = st
            .get("jain")
            .and_then(Value::as_f64)
            .map_or(String::new(), |j| format!(", Jain {j:.3}"));
        format!(
            "{:.3} [{:.3}-{:.3}]{wire}{jain}",
            g("/goodput_ratio"),
            g("/goodput/min"),
            g("/goodput/max")
        )
    };
    let mut row = |name: &str, p: &Value| {
        s.push_str(&format!(
            "  {:<22} shaper {:<32} cake {}\n",
            name,
            fmt(&p["shaper"]),
            fmt(&p["cake"])
        ));
    };
    for group in ["lone_flow", "many_flows", "unequal"] {
        if let Some(m) = report.get(group).and_then(Value::as_object) {
            for (k, p) in m {
                row(&format!("{group}.{k}"), p);
            }
        }
    }
    if let Some(p) = report.get("bulk_beside_sparse") {
        row("bulk_beside_sparse", p);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_the_median_with_its_range() {
        let s = Spread::of(vec![0.9, 0.5, 0.7]);
        assert_eq!((s.median, s.min, s.max), (0.7, 0.5, 0.9));
        assert_eq!(s.runs, [0.9, 0.5, 0.7]);
    }

    #[test]
    fn the_json_has_the_documented_keys_and_the_table_reads_them() {
        let mut report = CasesReport {
            case_reps: 3,
            ..CasesReport::default()
        };
        let state = CaseState {
            goodput_ratio: 0.93,
            goodput: Spread::of(vec![0.92, 0.93, 0.95]),
            wire_rate_ratio: Some(0.99),
            sparse_loss_pct_max: None,
            jain: Some(0.98),
        };
        let p = CasePair {
            shaper: state.clone(),
            cake: state,
        };
        report.lone_flow.insert("tcp_fwd".to_owned(), p.clone());
        report.many_flows.insert("64".to_owned(), p.clone());
        report.unequal.insert("unequal_rtt".to_owned(), p);
        let v = serde_json::to_value(&report).expect("serialises");
        assert_eq!(v["lone_flow"]["tcp_fwd"]["shaper"]["goodput_ratio"], 0.93);
        assert_eq!(v["many_flows"]["64"]["cake"]["wire_rate_ratio"], 0.99);
        let t = table(&v);
        assert!(t.contains("lone_flow.tcp_fwd"), "{t}");
        assert!(
            t.contains("0.930 [0.920-0.950], wire 0.990, Jain 0.980"),
            "{t}"
        );
        assert_eq!(v["unequal"]["unequal_rtt"]["shaper"]["jain"], 0.98);
        assert!(t.contains("unequal.unequal_rtt"), "{t}");
        // A document without cases gives the header alone.
        assert_eq!(table(&serde_json::json!({})).lines().count(), 1);
    }
}
