//! The end of `cargo xtask test`: each stage's time, skips by reason,
//! retries, the slowest tests, the time budget, and `target/test-times.json`
//! holding all of it per stage and per test.
//!
//! Units: seconds everywhere. The budget is printed, not enforced: a run
//! over it still passes or fails on its tests alone, and the message says by
//! how much it is over.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::exec::{Outcome, TestRecord};

/// How many of the slowest tests the summary lists.
const SLOWEST: usize = 15;

/// One stage of the run.
#[derive(Debug, Serialize)]
pub struct StageReport {
    pub name: String,
    pub seconds: f64,
    pub ok: bool,
    /// Why the stage failed beyond its tests (a build error, a guest crash).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub tests: Vec<TestRecord>,
}

/// What the budget line adds after the budget: nothing within it; over the
/// warm budget but within the cold one (a fresh clone's run, whose setup
/// and first build count too), both said; else how much over.
fn over_budget(total_s: f64, warm_s: f64, cold_s: Option<f64>) -> String {
    let over = total_s - warm_s;
    match cold_s {
        _ if over <= 0.0 => String::new(),
        Some(cold) if total_s <= cold => format!(
            " warm: over it by {:.1} min, within the {:.0} min of a fresh clone's run \
             (setup and first build included)",
            over / 60.0,
            cold / 60.0
        ),
        _ => format!(": OVER by {:.1} min", over / 60.0),
    }
}

#[derive(Serialize)]
struct TimesFile<'a> {
    total_seconds: f64,
    budget_seconds: f64,
    ok: bool,
    skips_by_reason: BTreeMap<String, usize>,
    retries: usize,
    stages: &'a [StageReport],
}

/// Prints the summary and writes `target/test-times.json`; returns whether
/// every stage passed.
pub fn finish(
    root: &Path,
    stages: &[StageReport],
    total_seconds: f64,
    budget_seconds: f64,
    cold_budget_seconds: Option<f64>,
) -> Result<bool> {
    let ok = stages.iter().all(|s| s.ok);
    eprintln!("\n==== xtask test summary");
    for s in stages {
        let counts = count(&s.tests);
        eprintln!(
            "  {:<28} {:>7.1} s  {:<6}  {}",
            s.name,
            s.seconds,
            if s.ok { "ok" } else { "FAILED" },
            counts
        );
        if let Some(e) = &s.error {
            eprintln!("      {e}");
        }
    }
    let skips = skips_by_reason(stages);
    if !skips.is_empty() {
        eprintln!("  skips by reason:");
        for (reason, n) in &skips {
            eprintln!("    {n:>3}  {reason}");
        }
    }
    let retried: Vec<(&str, &TestRecord)> = stages
        .iter()
        .flat_map(|s| s.tests.iter().map(move |t| (s.name.as_str(), t)))
        .filter(|(_, t)| !t.retries.is_empty())
        .collect();
    let retries: usize = retried.iter().map(|(_, t)| t.retries.len()).sum();
    eprintln!("  retried rounds: {retries}");
    for (stage, t) in &retried {
        for r in &t.retries {
            eprintln!("    {stage}: {}::{}: {r}", t.binary, t.test);
        }
    }
    eprintln!("  {SLOWEST} slowest tests:");
    for (stage, t) in slowest(stages, SLOWEST) {
        eprintln!(
            "    {:>7.1} s  {stage:<28} {}::{}",
            t.seconds, t.binary, t.test
        );
    }
    eprintln!(
        "  total {:.1} min against a budget of {:.0} min{}",
        total_seconds / 60.0,
        budget_seconds / 60.0,
        over_budget(total_seconds, budget_seconds, cold_budget_seconds)
    );
    let file = TimesFile {
        total_seconds,
        budget_seconds,
        ok,
        skips_by_reason: skips,
        retries,
        stages,
    };
    let path = root.join("target/test-times.json");
    let json = serde_json::to_string_pretty(&file).context("cannot encode the test times")?;
    std::fs::write(&path, json).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("  per-test times: {}", path.display());
    Ok(ok)
}

fn count(tests: &[TestRecord]) -> String {
    if tests.is_empty() {
        return String::new();
    }
    let n = |o: Outcome| tests.iter().filter(|t| t.result == o).count();
    format!(
        "{} tests: {} ok, {} failed, {} skipped, {} ignored",
        tests.len(),
        n(Outcome::Ok),
        n(Outcome::Failed),
        n(Outcome::Skipped),
        n(Outcome::Ignored)
    )
}

/// Skipped tests (and, in strict stages, skips that failed) by reason.
fn skips_by_reason(stages: &[StageReport]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for t in stages.iter().flat_map(|s| &s.tests) {
        if let Some(r) = &t.skip_reason {
            *m.entry(r.clone()).or_insert(0) += 1;
        }
    }
    m
}

fn slowest(stages: &[StageReport], n: usize) -> Vec<(&str, &TestRecord)> {
    let mut all: Vec<(&str, &TestRecord)> = stages
        .iter()
        .flat_map(|s| s.tests.iter().map(move |t| (s.name.as_str(), t)))
        .collect();
    all.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds));
    all.truncate(n);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_line_tells_warm_from_cold() {
        assert_eq!(over_budget(30.0 * 60.0, 35.0 * 60.0, Some(45.0 * 60.0)), "");
        let cold = over_budget(36.6 * 60.0, 35.0 * 60.0, Some(45.0 * 60.0));
        assert!(
            cold.contains("over it by 1.6 min") && cold.contains("45 min"),
            "{cold}"
        );
        assert_eq!(
            over_budget(46.0 * 60.0, 35.0 * 60.0, Some(45.0 * 60.0)),
            ": OVER by 11.0 min"
        );
        assert_eq!(
            over_budget(11.0 * 60.0, 10.0 * 60.0, None),
            ": OVER by 1.0 min"
        );
    }

    fn rec(test: &str, seconds: f64, result: Outcome, skip: Option<&str>) -> TestRecord {
        TestRecord {
            binary: "b".into(),
            test: test.into(),
            seconds,
            result,
            skip_reason: skip.map(str::to_owned),
            retries: Vec::new(),
        }
    }

    #[test]
    fn slowest_tests_come_first_across_stages() {
        let stages = [
            StageReport {
                name: "host".into(),
                seconds: 3.0,
                ok: true,
                error: None,
                tests: vec![
                    rec("a", 1.0, Outcome::Ok, None),
                    rec("b", 5.0, Outcome::Ok, None),
                ],
            },
            StageReport {
                name: "vm 6.12".into(),
                seconds: 9.0,
                ok: true,
                error: None,
                tests: vec![rec("c", 3.0, Outcome::Ok, None)],
            },
        ];
        let s: Vec<&str> = slowest(&stages, 2)
            .iter()
            .map(|(_, t)| t.test.as_str())
            .collect();
        assert_eq!(s, ["b", "c"]);
    }

    #[test]
    fn skips_are_counted_by_reason() {
        let stages = [StageReport {
            name: "host".into(),
            seconds: 1.0,
            ok: true,
            error: None,
            tests: vec![
                rec("a", 0.1, Outcome::Skipped, Some("this kernel lacks sch_fq")),
                rec("b", 0.1, Outcome::Skipped, Some("this kernel lacks sch_fq")),
                rec("c", 0.1, Outcome::Skipped, Some("needs root")),
                rec("d", 0.1, Outcome::Ok, None),
            ],
        }];
        let m = skips_by_reason(&stages);
        assert_eq!(m.get("this kernel lacks sch_fq"), Some(&2));
        assert_eq!(m.get("needs root"), Some(&1));
        assert_eq!(m.len(), 2);
        assert_eq!(
            count(&stages[0].tests),
            "4 tests: 1 ok, 0 failed, 3 skipped, 0 ignored"
        );
    }
}
