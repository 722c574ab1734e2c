//! Runs integration-test binaries one test at a time and records, per test,
//! its seconds, result, skip reason and retries.
//!
//! One process per test (`BIN --exact NAME --nocapture --test-threads=1`)
//! is what makes a test's time, output and skip line its own: the privileged
//! tests run single-threaded anyway, and starting a binary costs a fraction
//! of a second against tests of seconds to minutes.
//!
//! The same code runs on the host (the host stage) and inside the VM (the
//! job of a VM stage runs `xtask exec-tests`), reading a [`Plan`] and writing
//! [`TestRecord`]s as JSON, so both report the same way.
//!
//! Rules:
//! - A test's output goes to its own log file under the plan's log folder.
//!   A passing test prints one line; a failing test's whole log is printed.
//! - Skips and retries are read from the fixed lines the tests' skip helper
//!   prints (`skipped: <test>: <reason>`, `retried: <test>: <reason>`).
//! - Under `strict`, a skipped test counts as failed (the VM stages).
//!
//! Non-goals: running tests in parallel, timeouts per test (the VM has its
//! own overall limit).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

/// What one stage runs.
#[derive(Debug, Serialize, Deserialize)]
pub struct Plan {
    /// Tests, in order.
    pub tests: Vec<PlannedTest>,
    /// Folder for the per-test logs.
    pub log_dir: PathBuf,
    /// The working directory of every test.
    pub cwd: PathBuf,
    /// A skip is a failure.
    pub strict: bool,
    /// Environment every test gets, beside the inherited one.
    pub env: Vec<(String, String)>,
}

/// One test of one binary.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlannedTest {
    pub binary: PathBuf,
    pub test: String,
}

/// How a test ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ok,
    Failed,
    Skipped,
    Ignored,
}

/// What one test did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestRecord {
    /// The binary's test name (`tc_restore`, without cargo's hash).
    pub binary: String,
    pub test: String,
    pub seconds: f64,
    pub result: Outcome,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub skip_reason: Option<String>,
    /// Rounds the test re-measured, with what missed.
    #[serde(default)]
    pub retries: Vec<String>,
}

/// The test names `bin` holds (`--list --format terse`), ignored ones
/// included: running an ignored test by name reports it as ignored.
pub fn list_tests(bin: &Path, cwd: &Path) -> Result<Vec<String>> {
    let out = Command::new(bin)
        .args(["--list", "--format", "terse"])
        .current_dir(cwd)
        .output()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    ensure!(
        out.status.success(),
        "{} --list failed: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(parse_list(&String::from_utf8_lossy(&out.stdout)))
}

/// Test names from `--list --format terse` output (`name: test` lines).
fn parse_list(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect()
}

/// The binary's test name of a cargo test executable (`name-<hash>`).
pub fn binary_name(bin: &Path) -> String {
    let file = bin.file_name().and_then(|n| n.to_str()).unwrap_or("?");
    match file.rsplit_once('-') {
        Some((name, hash)) if hash.bytes().all(|b| b.is_ascii_hexdigit()) => name.to_owned(),
        _ => file.to_owned(),
    }
}

/// `xtask exec-tests --plan P --out O`: runs the plan at `plan_path`,
/// writing the records to `out_path` after every test (so a guest that dies
/// part-way still reports what it ran). Exit code 0 when no test failed.
pub fn exec_tests(plan_path: &Path, out_path: &Path) -> Result<i32> {
    let text = std::fs::read_to_string(plan_path)
        .with_context(|| format!("cannot read the plan {}", plan_path.display()))?;
    let plan: Plan = serde_json::from_str(&text)
        .with_context(|| format!("cannot parse the plan {}", plan_path.display()))?;
    let records = run_plan(&plan, Some(out_path))?;
    let failed = records.iter().any(|r| r.result == Outcome::Failed);
    Ok(i32::from(failed))
}

/// The records an `exec-tests` run wrote.
pub fn read_records(path: &Path) -> Result<Vec<TestRecord>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the test records {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("cannot parse the test records {}", path.display()))
}

fn write_records(path: &Path, records: &[TestRecord]) -> Result<()> {
    let tmp = path.with_extension("json.part");
    std::fs::write(&tmp, serde_json::to_string(records)?)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// Runs every test of `plan`, printing progress; returns the records, and
/// writes them to `out` after each test when given.
pub fn run_plan(plan: &Plan, out: Option<&Path>) -> Result<Vec<TestRecord>> {
    std::fs::create_dir_all(&plan.log_dir)
        .with_context(|| format!("cannot create {}", plan.log_dir.display()))?;
    let total = plan.tests.len();
    let mut records = Vec::with_capacity(total);
    for (i, t) in plan.tests.iter().enumerate() {
        let record = run_one(plan, t)?;
        let mark = match record.result {
            Outcome::Ok => "ok",
            Outcome::Failed => "FAILED",
            Outcome::Skipped => "skipped",
            Outcome::Ignored => "ignored",
        };
        eprintln!(
            "[{:>3}/{total}] {}::{} ... {mark} ({:.1} s){}{}",
            i + 1,
            record.binary,
            record.test,
            record.seconds,
            record
                .skip_reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default(),
            if record.retries.is_empty() {
                String::new()
            } else {
                format!(", {} retried round(s)", record.retries.len())
            }
        );
        for r in &record.retries {
            eprintln!("        retried: {r}");
        }
        records.push(record);
        if let Some(out) = out {
            write_records(out, &records)?;
        }
    }
    Ok(records)
}

fn run_one(plan: &Plan, t: &PlannedTest) -> Result<TestRecord> {
    let binary = binary_name(&t.binary);
    let log = plan
        .log_dir
        .join(format!("{binary}.{}.log", t.test.replace("::", ".")));
    let out = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let err = out
        .try_clone()
        .with_context(|| format!("cannot reopen {}", log.display()))?;
    let started = Instant::now();
    let status = Command::new(&t.binary)
        .args(["--exact", &t.test, "--nocapture", "--test-threads=1"])
        .current_dir(&plan.cwd)
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .with_context(|| format!("cannot start {}", t.binary.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let read = read_output(&text, &t.test);
    let mut result = if !status.success() || !read.ran {
        Outcome::Failed
    } else if read.ignored {
        Outcome::Ignored
    } else if read.skip_reason.is_some() {
        Outcome::Skipped
    } else {
        Outcome::Ok
    };
    if result == Outcome::Skipped && plan.strict {
        result = Outcome::Failed;
    }
    if result == Outcome::Failed {
        eprintln!(
            "---- {binary}::{} ({}) output:\n{text}",
            t.test,
            if read.ran {
                status.to_string()
            } else {
                "the binary ran no test of that name".to_owned()
            }
        );
    }
    Ok(TestRecord {
        binary,
        test: t.test.clone(),
        seconds,
        result,
        skip_reason: read.skip_reason,
        retries: read.retries,
    })
}

/// What a test's log says beyond its exit status.
#[derive(Debug, Default, PartialEq)]
struct Read {
    /// libtest ran exactly one test.
    ran: bool,
    ignored: bool,
    skip_reason: Option<String>,
    retries: Vec<String>,
}

/// Reads a test's log. The skip and retry lines may follow libtest's own
/// `test <name> ... ` on the same line (its output is not captured), so
/// they are found by their `skipped: <name>: ` prefix anywhere in a line.
fn read_output(text: &str, test: &str) -> Read {
    let mut read = Read::default();
    let skipped = format!("skipped: {test}: ");
    let retried = format!("retried: {test}: ");
    let after = |line: &str, prefix: &str| {
        line.find(prefix)
            .map(|at| line[at + prefix.len()..].to_owned())
    };
    for line in text.lines() {
        if line == "running 1 test" {
            read.ran = true;
        }
        if line.starts_with(&format!("test {test} ... ignored")) {
            read.ignored = true;
        }
        if let Some(reason) = after(line, &skipped) {
            read.skip_reason.get_or_insert(reason);
        }
        if let Some(reason) = after(line, &retried) {
            read.retries.push(reason);
        }
    }
    read
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_tests_from_terse_output() {
        let text = "a_test: test\nmod_x::b: test\nsome_bench: benchmark\n\n";
        assert_eq!(parse_list(text), ["a_test", "mod_x::b"]);
    }

    #[test]
    fn binary_names_drop_the_hash_only() {
        assert_eq!(
            binary_name(Path::new("/t/deps/tc_restore-3c52026dcf57a388")),
            "tc_restore"
        );
        assert_eq!(
            binary_name(Path::new("/t/deps/lone_flow_vm")),
            "lone_flow_vm"
        );
    }

    #[test]
    fn reads_skips_retries_and_ignores() {
        let text = "\nrunning 1 test\ntest t ... skipped: t: this kernel lacks sch_fq\n\
                    retried: t: round 1 goodput 0.84\nretried: t: round 2 p99 93 ms\n\
                    skipped: other: not this test's\nok\n";
        let r = read_output(text, "t");
        assert!(r.ran && !r.ignored);
        assert_eq!(r.skip_reason.as_deref(), Some("this kernel lacks sch_fq"));
        assert_eq!(r.retries, ["round 1 goodput 0.84", "round 2 p99 93 ms"]);
        let r = read_output("running 1 test\ntest t ... ignored\n", "t");
        assert!(r.ignored);
        assert!(!read_output("running 0 tests\n", "t").ran);
    }
}
