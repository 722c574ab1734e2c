//! What the VM tests that hold the shaper against CAKE share: the measured
//! time, logged runs on one lab testbed, and the round that is measured
//! once more when it misses.
//!
//! Rules:
//! - A binary builds its testbed once and runs every case on it; a case
//!   changes the testbed (offloads, ECN, delays) through the testbed's own
//!   namespaces and leaves it as the next case expects.
//! - A case's verdict is a line naming both states' figures, `Ok` or
//!   `Err`; [`report`] prints every verdict and fails on any `Err`, so one
//!   run shows every case.
//! - A missed round is measured again once, after [`note_retry`] says so;
//!   two misses in a row fail ([`twice`]).
//!
//! Environment: `SHAPER_VM_TEST_SECS`, the measured seconds of a run
//! (default [`MEASURED_SECS`]).

use std::time::{Duration, Instant};

use shaper::lab::{RunResult, Scenario, Testbed, TestbedOptions, Timing, run_scenario};

use crate::skip::{Need, note_retry};

/// What every comparison against CAKE needs: the qdiscs of both states and
/// of the lab's path, and iperf3.
pub const NEEDS: &[Need<'static>] = &[
    Need::Root,
    Need::Sch("fq"),
    Need::Sch("cake"),
    Need::Sch("netem"),
    Need::Tool("iperf3", "--version"),
];

/// Measured seconds of a run: long enough for a TCP flow at 20 ms RTT to
/// average out its sawtooth, short enough for the whole comparison suite to
/// fit its CI budget under emulation.
pub const MEASURED_SECS: u64 = 5;

/// The warm-up iperf3 leaves out (`--omit`) at 20 ms RTT: slow start and
/// its first losses.
pub const OMIT: Duration = Duration::from_secs(2);

/// One case's verdict: a line with the figures, `Err` when it missed.
pub type Verdict = Result<String, String>;

/// The measured time (`SHAPER_VM_TEST_SECS`, default [`MEASURED_SECS`]).
pub fn measured() -> Duration {
    let secs = std::env::var("SHAPER_VM_TEST_SECS")
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .expect("SHAPER_VM_TEST_SECS must be whole seconds")
        })
        .unwrap_or(MEASURED_SECS);
    Duration::from_secs(secs)
}

/// [`measured`] seconds after `omit`.
pub fn timing(omit: Duration) -> Timing {
    Timing::new(measured(), omit)
}

/// Builds the binary's one testbed, printing how long that took.
pub fn testbed(options: TestbedOptions) -> Testbed {
    let t = Instant::now();
    let tb = Testbed::new(options).expect("build the testbed");
    eprintln!("(testbed built in {:.1} s)", t.elapsed().as_secs_f64());
    tb
}

/// Runs `scenario` on `tb`, printing its summary line; panics naming the
/// state when the run itself fails.
pub fn run(tb: &Testbed, scenario: &Scenario) -> RunResult {
    let name = scenario.state.name();
    let t = Instant::now();
    let r = run_scenario(tb, scenario).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    eprintln!("    {} ({:.1} s)", r.summary(), t.elapsed().as_secs_f64());
    r
}

/// The ping interval of a comparison that judges latency percentiles:
/// enough samples in one measured time that the 99th percentile is not the
/// maximum, which TCG's coarse timers make meaningless.
pub const PING_EVERY: Duration = Duration::from_millis(20);

/// Measures and judges a round with `round` (whose verdict line names the
/// case); when it misses, says so through [`note_retry`] and measures once
/// more. `Err` names both misses.
pub fn twice(mut round: impl FnMut() -> Verdict) -> Verdict {
    round().or_else(|first| {
        note_retry(&first);
        round().map_err(|second| format!("{first}; again: {second}"))
    })
}

/// `Ok(line)` when `pass`, else `Err(line)`.
pub fn verdict(pass: bool, line: String) -> Verdict {
    if pass { Ok(line) } else { Err(line) }
}

/// Prints every verdict and fails when any missed.
pub fn report(results: &[Verdict]) {
    eprintln!("summary:");
    let mut failed = Vec::new();
    for r in results {
        match r {
            Ok(line) => eprintln!("  ok    {line}"),
            Err(line) => {
                eprintln!("  FAIL  {line}");
                failed.push(line.as_str());
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} case(s) failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
