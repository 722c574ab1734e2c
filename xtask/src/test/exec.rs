//! Runs integration-test binaries and records, per test, its seconds,
//! result, skip reason and retries.
//!
//! Each binary runs once for all its planned tests, in libtest's JSON
//! format (`-Z unstable-options --format json --report-time
//! --show-output`, allowed on a stable toolchain by `RUSTC_BOOTSTRAP=1` in
//! the test's environment), so a test's time is libtest's own and its
//! captured output comes with its result: starting a binary under emulation
//! costs seconds, which one process per test would pay for every test.
//!
//! The same code runs on the host (the host stage) and inside the VM (the
//! job of a VM stage runs `xtask exec-tests`), reading a [`Plan`] and writing
//! [`TestRecord`]s as JSON, so both report the same way.
//!
//! Rules:
//! - Each test's captured output goes to its own log file under the plan's
//!   log folder, and what the binary printed outside any test (its
//!   children's output, say) to `<binary>.log` beside them. A passing test
//!   prints one line; a failing test's whole output is printed.
//! - Skips and retries are read from the fixed lines the tests' skip helper
//!   prints (`skipped: <test>: <reason>`, `retried: <test>: <reason>`).
//! - Under `strict`, a skipped test counts as failed (the VM stages).
//! - A planned test the binary never reported (it crashed) is a failure.
//! - While a test runs, [`RUNNING_FILE`] in the log folder names it.
//!
//! Non-goals: running tests in parallel, timeouts per test (the VM has its
//! own overall limit).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

/// What one stage runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
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

/// The file in a plan's log folder that names the test running now
/// (`binary::test`), so that a guest which dies mid-test leaves its name.
pub const RUNNING_FILE: &str = "running";

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
    let mut records: Vec<TestRecord> = Vec::with_capacity(total);
    let mut rest = plan.tests.as_slice();
    while let Some(first) = rest.first() {
        let n = rest.iter().take_while(|t| t.binary == first.binary).count();
        let (group, tail) = rest.split_at(n);
        rest = tail;
        for record in run_binary(plan, group)? {
            let mark = match record.result {
                Outcome::Ok => "ok",
                Outcome::Failed => "FAILED",
                Outcome::Skipped => "skipped",
                Outcome::Ignored => "ignored",
            };
            eprintln!(
                "[{:>3}/{total}] {}::{} ... {mark} ({:.1} s){}{}",
                records.len() + 1,
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
        }
        if let Some(out) = out {
            write_records(out, &records)?;
        }
    }
    Ok(records)
}

/// Runs the tests `group` (all of one binary) in one process.
fn run_binary(plan: &Plan, group: &[PlannedTest]) -> Result<Vec<TestRecord>> {
    let Some(first) = group.first() else {
        return Ok(Vec::new());
    };
    let binary = binary_name(&first.binary);
    let log = plan.log_dir.join(format!("{binary}.log"));
    let err = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut child = Command::new(&first.binary)
        .args([
            "--test-threads=1",
            "-Z",
            "unstable-options",
            "--format",
            "json",
        ])
        .args(["--report-time", "--show-output", "--exact"])
        .args(group.iter().map(|t| t.test.as_str()))
        .current_dir(&plan.cwd)
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .env("RUSTC_BOOTSTRAP", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .with_context(|| format!("cannot start {}", first.binary.display()))?;
    let running = plan.log_dir.join(RUNNING_FILE);
    let mut events = std::collections::HashMap::new();
    let mut other = String::new();
    if let Some(stdout) = child.stdout.take() {
        // Split on bytes: a test may print output that is not UTF-8.
        for line in BufReader::new(stdout).split(b'\n') {
            let line = line.with_context(|| format!("cannot read {binary}'s output"))?;
            let line = String::from_utf8_lossy(&line);
            match serde_json::from_str::<Event>(&line) {
                Ok(e) if e.kind == "test" && e.event == "started" => {
                    std::fs::write(&running, format!("{binary}::{}\n", e.name))
                        .with_context(|| format!("cannot write {}", running.display()))?;
                }
                Ok(e) if e.kind == "test" => {
                    events.insert(e.name.clone(), e);
                }
                Ok(_) => {}
                Err(_) => {
                    other.push_str(&line);
                    other.push('\n');
                }
            }
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("cannot wait for {}", first.binary.display()))?;
    let _ = std::fs::remove_file(&running);
    if !other.is_empty() {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        std::io::Write::write_all(&mut f, other.as_bytes())
            .with_context(|| format!("cannot write {}", log.display()))?;
    }
    let mut records = Vec::with_capacity(group.len());
    for t in group {
        let test_log = plan
            .log_dir
            .join(format!("{binary}.{}.log", t.test.replace("::", ".")));
        let record = match events.get(&t.test) {
            Some(e) => {
                let text = e.stdout.clone().unwrap_or_default();
                std::fs::write(&test_log, &text)
                    .with_context(|| format!("cannot write {}", test_log.display()))?;
                let read = read_output(&text, &t.test);
                let mut result = match e.event.as_str() {
                    "ok" if read.skip_reason.is_some() => Outcome::Skipped,
                    "ok" => Outcome::Ok,
                    "ignored" => Outcome::Ignored,
                    _ => Outcome::Failed,
                };
                if result == Outcome::Skipped && plan.strict {
                    result = Outcome::Failed;
                }
                if result == Outcome::Failed {
                    eprintln!("---- {binary}::{} ({}) output:\n{text}", t.test, e.event);
                }
                TestRecord {
                    binary: binary.clone(),
                    test: t.test.clone(),
                    seconds: e.exec_time.unwrap_or(0.0),
                    result,
                    skip_reason: read.skip_reason,
                    retries: read.retries,
                }
            }
            None => {
                eprintln!(
                    "---- {binary}::{}: the binary ended ({}) without reporting it; its output \
                     is in {}",
                    t.test,
                    status,
                    log.display()
                );
                TestRecord {
                    binary: binary.clone(),
                    test: t.test.clone(),
                    seconds: 0.0,
                    result: Outcome::Failed,
                    skip_reason: None,
                    retries: Vec::new(),
                }
            }
        };
        records.push(record);
    }
    Ok(records)
}

/// One line of libtest's JSON output.
#[derive(Debug, Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    event: String,
    #[serde(default)]
    name: String,
    exec_time: Option<f64>,
    /// The test's captured output (stdout and stderr), with `--show-output`.
    stdout: Option<String>,
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
