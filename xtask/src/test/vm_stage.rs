//! One VM stage of `cargo xtask test`: a tier's tests in a guest running one
//! kernel, through `xtask exec-tests` inside it.
//!
//! The tests change nothing outside the disposable guest. So when the
//! guest's kernel dies part-way, the tests it has not reported run again in
//! one fresh boot, the one it died in first. Multi-threaded TCG occasionally
//! oopses a guest with registers no real CPU holds (reserved EFLAGS bits
//! set), and another boot does not repeat it. A product that crashes the
//! kernel does so again in the second boot, and a second crash fails the
//! stage.
//!
//! Invariants:
//! - every planned test is reported exactly once, from the boot that
//!   finished it;
//! - a crash is a retried round of the test it struck (the last one the
//!   guest's runner saw start, from [`exec::RUNNING_FILE`]), so the summary
//!   names both;
//! - each boot's console tail is kept as `guest-crash.<boot>.log` beside
//!   the stage's plan.
//!
//! Non-goals: retrying a failed test (the tests' own rounds do that), or a
//! guest that timed out (that repeats).

use std::path::Path;

use anyhow::{Context, Result, bail};

use super::exec::{self, Plan, TestRecord};
use crate::vm;

/// Boots a stage may take: the first, and one after a guest crash.
const BOOTS: u32 = 2;

/// Runs `plan` in `guest`, keeping plans, records and crash logs in `dir`,
/// through `runner`: an xtask executable the guest can run (this one on
/// x86, a static aarch64 build on arm64). Returns whether every test
/// passed, and the records.
pub(super) fn run(
    root: &Path,
    guest: vm::Guest,
    runner: &Path,
    dir: &Path,
    plan: &Plan,
) -> Result<(bool, Vec<TestRecord>)> {
    let mut records: Vec<TestRecord> = Vec::new();
    let mut pending = plan.clone();
    let mut crash: Option<Crash> = None;
    for boot in 1..=BOOTS {
        let suffix = if boot == 1 {
            String::new()
        } else {
            format!(".{boot}")
        };
        let plan_path = dir.join(format!("plan{suffix}.json"));
        let out_path = dir.join(format!("results{suffix}.json"));
        std::fs::write(&plan_path, serde_json::to_string(&pending)?)
            .with_context(|| format!("cannot write {}", plan_path.display()))?;
        let cmd: Vec<String> = vec![
            runner.display().to_string(),
            "exec-tests".into(),
            "--plan".into(),
            plan_path.display().to_string(),
            "--out".into(),
            out_path.display().to_string(),
        ];
        let code = vm::run(root, guest, &cmd);
        let mut got = exec::read_records(&out_path).unwrap_or_default();
        if let Some(c) = crash.take() {
            c.note_on(&mut got);
        }
        records.extend(got);
        match code {
            Ok(code) => {
                if records.len() < plan.tests.len() {
                    eprintln!(
                        "xtask test: the guest reported {} of {} tests (exit code {code})",
                        records.len(),
                        plan.tests.len()
                    );
                }
                return Ok((code == 0 && super::all_passed(plan, &records), records));
            }
            Err(e) if boot < BOOTS && e.downcast_ref::<vm::GuestCrash>().is_some() => {
                let running = plan.log_dir.join(exec::RUNNING_FILE);
                let struck = std::fs::read_to_string(&running)
                    .ok()
                    .map(|t| t.trim().to_owned());
                let _ = std::fs::remove_file(&running);
                let log = dir.join(format!("guest-crash.{boot}.log"));
                std::fs::write(&log, format!("{e:#}\n"))
                    .with_context(|| format!("cannot write {}", log.display()))?;
                let line = e
                    .downcast_ref::<vm::GuestCrash>()
                    .and_then(|g| g.first_crash_line())
                    .unwrap_or("no crash line on the console")
                    .to_owned();
                pending.tests = unreported(plan, &records);
                eprintln!(
                    "xtask test: warning: the guest's kernel died during {} ({line}); the \
                     console is in {}; running the {} tests it did not report in a new guest",
                    struck.as_deref().unwrap_or("no test"),
                    log.display(),
                    pending.tests.len()
                );
                crash = Some(Crash { boot, struck, line });
            }
            Err(e) => return Err(e),
        }
    }
    bail!("the stage used its {BOOTS} boots without an outcome")
}

/// A boot that ended in a kernel crash.
struct Crash {
    boot: u32,
    /// `binary::test` running when the guest died.
    struck: Option<String>,
    line: String,
}

impl Crash {
    /// Records the crash as a retried round of the test it struck, or of
    /// the next boot's first test when it struck between tests.
    fn note_on(self, records: &mut [TestRecord]) {
        let at = self
            .struck
            .as_deref()
            .and_then(|s| {
                records
                    .iter()
                    .position(|r| format!("{}::{}", r.binary, r.test) == s)
            })
            .unwrap_or(0);
        if let Some(r) = records.get_mut(at) {
            r.retries.insert(
                0,
                format!(
                    "boot {}: the guest's kernel died during {} ({}); it and the tests after it \
                     ran again in a new guest",
                    self.boot,
                    self.struck.as_deref().unwrap_or("no test"),
                    self.line
                ),
            );
        }
    }
}

/// The tests of `plan` that no record reports, in plan order.
fn unreported(plan: &Plan, records: &[TestRecord]) -> Vec<exec::PlannedTest> {
    plan.tests
        .iter()
        .filter(|t| {
            let binary = exec::binary_name(&t.binary);
            !records
                .iter()
                .any(|r| r.binary == binary && r.test == t.test)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn record(binary: &str, test: &str) -> TestRecord {
        TestRecord {
            binary: binary.into(),
            test: test.into(),
            seconds: 1.0,
            result: exec::Outcome::Ok,
            skip_reason: None,
            retries: Vec::new(),
        }
    }

    fn plan(tests: &[(&str, &str)]) -> Plan {
        Plan {
            tests: tests
                .iter()
                .map(|(b, t)| exec::PlannedTest {
                    binary: PathBuf::from(format!("/t/deps/{b}-0123abcd")),
                    test: (*t).into(),
                })
                .collect(),
            log_dir: PathBuf::from("/t/logs"),
            cwd: PathBuf::from("/t"),
            strict: true,
            env: Vec::new(),
        }
    }

    #[test]
    fn the_unreported_tests_keep_their_order() {
        let p = plan(&[("a", "x"), ("a", "y"), ("b", "x"), ("c", "z")]);
        let left = unreported(&p, &[record("a", "x"), record("a", "y")]);
        let names: Vec<_> = left
            .iter()
            .map(|t| (exec::binary_name(&t.binary), t.test.as_str()))
            .collect();
        assert_eq!(names, [("b".to_owned(), "x"), ("c".to_owned(), "z")]);
        assert!(unreported(&p, &[record("b", "x")]).len() == 3);
    }

    #[test]
    fn a_crash_is_a_retried_round_of_the_test_it_struck() {
        let mut got = vec![record("b", "x"), record("b", "y")];
        Crash {
            boot: 1,
            struck: Some("b::y".into()),
            line: "Oops: double fault".into(),
        }
        .note_on(&mut got);
        assert!(got[0].retries.is_empty());
        assert_eq!(got[1].retries.len(), 1);
        assert!(got[1].retries[0].contains("b::y (Oops: double fault)"));

        let mut got = vec![record("c", "z")];
        Crash {
            boot: 1,
            struck: None,
            line: "Kernel panic".into(),
        }
        .note_on(&mut got);
        assert!(got[0].retries[0].contains("during no test (Kernel panic)"));
    }
}
