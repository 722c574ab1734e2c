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
//!   two misses in a row fail ([`twice`]). The first rounds of several
//!   cases may share their states ([`run_cases`]); a round measured again
//!   applies its states for itself.
//!
//! Environment: `SHAPER_VM_TEST_SECS`, the measured seconds of a run
//! (default [`MEASURED_SECS`]).

use std::{
    rc::Rc,
    time::{Duration, Instant},
};

use shaper::lab::{
    RunResult, Scenario, State, Testbed, TestbedOptions, Timing, cases::Case, run_scenario,
    run_scenarios,
};

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
    let first = round();
    again_if_missed(first, round)
}

/// [`twice`] for a round already measured: `first`, and `round` once more
/// if that missed.
pub fn again_if_missed(first: Verdict, mut round: impl FnMut() -> Verdict) -> Verdict {
    first.or_else(|first| {
        note_retry(&first);
        round().map_err(|second| format!("{first}; again: {second}"))
    })
}

/// Runs every case under CAKE and under the shaper for its timing, each
/// distinct state applied once for all the cases that use it, in the order
/// the cases first name them: a shaper start costs seconds under emulation,
/// and one shaper meeting case after case is what a router sees. Cases
/// whose runs under a state are the same scenario (the downloads under
/// CAKE, whichever ingress mode the shaper takes) share one run. Returns
/// each case's (CAKE, shaper) runs; panics naming the state when a run
/// fails.
pub fn run_cases(tb: &Testbed, cases: &[(&Case, Timing)]) -> Vec<(Rc<RunResult>, Rc<RunResult>)> {
    let mut states: Vec<&State> = Vec::new();
    for s in cases.iter().flat_map(|(c, _)| [&c.cake, &c.shaper]) {
        if !states.contains(&s) {
            states.push(s);
        }
    }
    let mut runs: Vec<[Option<Rc<RunResult>>; 2]> = cases.iter().map(|_| [None, None]).collect();
    for state in states {
        // (case, side, scenario) for every run under this state.
        let picks: Vec<(usize, usize, Scenario)> = cases
            .iter()
            .enumerate()
            .flat_map(|(i, (c, timing))| [(i, 0, &c.cake, timing), (i, 1, &c.shaper, timing)])
            .filter(|(_, _, s, _)| *s == state)
            .map(|(i, side, _, timing)| (i, side, cases[i].0.scenario(state.clone(), *timing)))
            .collect();
        // The distinct scenarios, and each pick's index among them: a
        // scenario several picks share runs once.
        let mut scenarios: Vec<Scenario> = Vec::new();
        let at: Vec<usize> = picks
            .iter()
            .map(|(_, _, sc)| {
                scenarios.iter().position(|s| s == sc).unwrap_or_else(|| {
                    scenarios.push(sc.clone());
                    scenarios.len() - 1
                })
            })
            .collect();
        let t = Instant::now();
        let results: Vec<Rc<RunResult>> = run_scenarios(tb, &scenarios)
            .unwrap_or_else(|e| panic!("{}: {e:#}", state.name()))
            .into_iter()
            .map(Rc::new)
            .collect();
        eprintln!(
            "{} for {} case(s) in {:.1} s:",
            state.name(),
            picks.len(),
            t.elapsed().as_secs_f64()
        );
        for ((i, side, _), &k) in picks.iter().zip(&at) {
            eprintln!("    {}: {}", cases[*i].0.name, results[k].summary());
            runs[*i][*side] = Some(Rc::clone(&results[k]));
        }
    }
    runs.into_iter()
        .zip(cases)
        .map(|(pair, (case, _))| match pair {
            [Some(cake), Some(ours)] => (cake, ours),
            _ => panic!("{}: a state ran without this case", case.name),
        })
        .collect()
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
