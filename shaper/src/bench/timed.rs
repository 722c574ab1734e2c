//! The lab part's timed cases ([`crate::lab::timed_cases`]): flows that
//! leave, join and churn, under CAKE and under the shaper, `reps` times,
//! the two states interleaved (each applied once per repetition for all
//! three cases), reported as medians with their min and max.
//!
//! JSON (under `vm`): `churn.<shaper|cake>` with `bulk_goodput_ratio`,
//! `short_transfers_per_s` and `median_transfer_ms`; `leave.<shaper|cake>`
//! with `reach_ms` (the flow left at 0.9 of the rate, after the others'
//! last byte; null in a run where it never got there, which the spread's
//! `never` counts); `join.<shaper|cake>` with `share_spread` (the largest
//! deviation from an equal share) and `ping_p99_ms`.
//!
//! Units: ratios of the configured rate, ms, transfers per second.
//!
//! Non-goals: pass or fail (the VM test asserts).

use std::path::Path;

use serde::Serialize;
use tracing::info;

use super::cases::Spread;
use crate::{
    lab::{
        LabError, Testbed, TimedRun, TimedScenario, run_timed_scenarios,
        timed_cases::{self, LEAVE_SHARE, SETTLE, SHARE_WINDOW},
    },
    rate::Rate,
};

/// The churn's figures for one state.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ChurnState {
    /// The bulk flow's goodput / rate, median.
    pub bulk_goodput_ratio: f64,
    /// Its spread.
    pub bulk_goodput: Spread,
    /// Short transfers completed per second, median.
    pub short_transfers_per_s: f64,
    /// Their median time, ms, median over runs.
    pub median_transfer_ms: f64,
}

/// The leave case's figures for one state.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LeaveState {
    /// ms until the flow left carried 0.9 of the rate, median of the runs
    /// where it did.
    pub reach_ms: Option<f64>,
    /// Its spread over those runs.
    pub reach: Spread,
    /// Runs where it never did.
    pub never: u32,
}

/// The join case's figures for one state.
#[derive(Clone, Debug, Default, Serialize)]
pub struct JoinState {
    /// The largest deviation of a flow's share from equal, median.
    pub share_spread: f64,
    /// Its spread.
    pub spread: Spread,
    /// The ping's p99 over the join, ms, median.
    pub ping_p99_ms: Option<f64>,
}

/// Both states of one case.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Pair<T> {
    /// The shaper.
    pub shaper: T,
    /// CAKE.
    pub cake: T,
}

/// Everything this part measures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TimedReport {
    /// One bulk flow beside back-to-back short transfers.
    pub churn: Pair<ChurnState>,
    /// Four flows, then three stop.
    pub leave: Pair<LeaveState>,
    /// One flow, then three more.
    pub join: Pair<JoinState>,
}

fn median(v: Vec<f64>) -> f64 {
    Spread::of(v).median
}

fn churn(runs: &[&TimedRun], rate: Rate) -> ChurnState {
    let bulk = Spread::of(
        runs.iter()
            .map(|r| timed_cases::churn_bulk_ratio(r, rate))
            .collect(),
    );
    ChurnState {
        bulk_goodput_ratio: bulk.median,
        bulk_goodput: bulk,
        short_transfers_per_s: median(
            runs.iter()
                .map(|r| timed_cases::transfers_per_s(r))
                .collect(),
        ),
        median_transfer_ms: median(
            runs.iter()
                .map(|r| timed_cases::median_transfer_ms(r))
                .collect(),
        ),
    }
}

fn leave(runs: &[&TimedRun], rate: Rate) -> LeaveState {
    let reach: Vec<Option<f64>> = runs
        .iter()
        .map(|r| timed_cases::leave_reach(r, rate, LEAVE_SHARE).map(|d| d.as_secs_f64() * 1e3))
        .collect();
    let got: Vec<f64> = reach.iter().flatten().copied().collect();
    let spread = Spread::of(got.clone());
    LeaveState {
        reach_ms: (!got.is_empty()).then_some(spread.median),
        reach: spread,
        never: u32::try_from(reach.iter().filter(|r| r.is_none()).count()).unwrap_or(u32::MAX),
    }
}

fn join(runs: &[&TimedRun]) -> JoinState {
    let spread = Spread::of(
        runs.iter()
            .map(|r| timed_cases::join_spread(r, SETTLE, SHARE_WINDOW))
            .collect(),
    );
    let p99: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.ping())
        .map(|p| p.p99)
        .collect();
    JoinState {
        share_spread: spread.median,
        spread,
        ping_p99_ms: (!p99.is_empty()).then(|| median(p99)),
    }
}

/// Case `i`'s run of each repetition.
fn nth(runs: &[Vec<TimedRun>], i: usize) -> Vec<&TimedRun> {
    runs.iter().filter_map(|r| r.get(i)).collect()
}

/// Runs the three timed cases on `tb` at `rate`, `reps` times per state.
pub fn run(tb: &Testbed, bin: &Path, rate: Rate, reps: u32) -> Result<TimedReport, LabError> {
    let cases = [
        timed_cases::leave(bin, rate),
        timed_cases::join(bin, rate),
        timed_cases::churn(bin, rate),
    ];
    let scenarios: Vec<TimedScenario> = cases.iter().map(|c| c.scenario.clone()).collect();
    // Per state, per repetition: the runs of leave, join and churn.
    let (mut cake, mut ours) = (Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        cake.push(run_timed_scenarios(tb, &cases[0].cake, &scenarios)?);
        ours.push(run_timed_scenarios(tb, &cases[0].shaper, &scenarios)?);
    }
    let report = TimedReport {
        leave: Pair {
            shaper: leave(&nth(&ours, 0), rate),
            cake: leave(&nth(&cake, 0), rate),
        },
        join: Pair {
            shaper: join(&nth(&ours, 1)),
            cake: join(&nth(&cake, 1)),
        },
        churn: Pair {
            shaper: churn(&nth(&ours, 2), rate),
            cake: churn(&nth(&cake, 2), rate),
        },
    };
    info!(
        shaper_bulk = report.churn.shaper.bulk_goodput_ratio,
        cake_bulk = report.churn.cake.bulk_goodput_ratio,
        "timed cases measured"
    );
    Ok(report)
}

/// The timed cases as table rows.
pub fn table(vm: &serde_json::Value) -> String {
    use serde_json::Value;
    let num = |v: &Value, k: &str, digits: usize| {
        v.pointer(k)
            .and_then(Value::as_f64)
            .map_or("-".to_owned(), |x| format!("{x:.digits$}"))
    };
    let mut s = String::from("  timed cases (medians; shaper beside CAKE in the same run):\n");
    for state in ["shaper", "cake"] {
        let st = |case: &str| {
            vm.pointer(&format!("/{case}/{state}"))
                .cloned()
                .unwrap_or_default()
        };
        let (c, l, j) = (st("churn"), st("leave"), st("join"));
        s.push_str(&format!(
            "  {state:<7} churn bulk {} of the rate, {} transfers/s, median {} ms; leave \
             reach {} ms; join share spread {}, ping p99 {} ms\n",
            num(&c, "/bulk_goodput_ratio", 3),
            num(&c, "/short_transfers_per_s", 1),
            num(&c, "/median_transfer_ms", 0),
            num(&l, "/reach_ms", 0),
            num(&j, "/share_spread", 2),
            num(&j, "/ping_p99_ms", 1),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_has_the_documented_keys_and_the_table_reads_them() {
        let mut report = TimedReport::default();
        report.churn.shaper.bulk_goodput_ratio = 0.78;
        report.churn.cake.short_transfers_per_s = 9.0;
        report.leave.shaper.reach_ms = Some(240.0);
        report.join.cake.ping_p99_ms = Some(26.5);
        let v = serde_json::to_value(&report).expect("serialises");
        assert_eq!(v["churn"]["shaper"]["bulk_goodput_ratio"], 0.78);
        assert_eq!(v["leave"]["shaper"]["reach_ms"], 240.0);
        assert!(v["leave"]["cake"]["reach_ms"].is_null());
        let t = table(&v);
        assert!(
            t.contains("churn bulk 0.780") && t.contains("reach 240 ms"),
            "{t}"
        );
        assert!(
            t.contains("9.0 transfers/s") && t.contains("ping p99 26.5"),
            "{t}"
        );
    }
}
