//! Work conservation beside CAKE: the traffic users have, not a few equal
//! bulk streams. The cases of `shaper::lab::cases` on the lab's client →
//! router → server testbed at 50 Mbit/s and 20 ms RTT: a lone flow beside a
//! 10 pps ping (forwarded TCP cubic and bbr, forwarded UDP above the rate,
//! a TCP sender on the router itself, a download through each ingress
//! mode), one bulk flow beside 20 sparse UDP flows, and 64 flows.
//! Each case runs CAKE, then the shaper, on one testbed, and the shaper is
//! held against CAKE's figure from the same run:
//! - a lone flow's goodput ratio ≥ CAKE's − 0.15 (the download in `police`
//!   mode: − 0.25);
//! - the bulk flow beside sparse flows likewise, and the sparse flows lose
//!   no datagram;
//! - with 64 flows the shaper's wire rate (the WAN root qdisc's bytes over
//!   the measured time) ≤ 1.05 × the rate, and its goodput ≤ CAKE's + 0.03.
//!
//! The lone-flow floors catch a share logic that divides the rate (the
//! defect this file was written for left a lone flow half the rate, 0.47
//! against CAKE's 0.93). They are not the target, CAKE's − 0.02, which
//! `cargo xtask bench` reports per case as medians (`vm.lone_flow`): under
//! emulation one run varies by more than that, and bbr, UDP and the
//! policer still trail CAKE by more (docs/pacer.md has the figures).
//!
//! A case that misses is measured once more, and two misses fail. Needs
//! sch_fq, sch_cake and sch_netem (the VM's kernels); elsewhere it skips
//! with a reason, and under `SHAPER_REQUIRE_FULL_KERNEL=1` a skip fails.
//!
//! Environment: `SHAPER_BIN` (the shaper binary), `SHAPER_VM_TEST_SECS`
//! (measured seconds, default 5, after 2 s omitted).

use std::time::{Duration, Instant};

use shaper::{
    lab::{
        RunResult, State, Testbed, TestbedOptions, Timing,
        cases::{self, Case},
        run_scenario,
    },
    rate::Rate,
};
use shaper_tests::topo::{shaper_bin, skip_without_lab_qdiscs};

/// Slack of a lone flow's goodput ratio below CAKE's.
const LONE_SLACK: f64 = 0.15;
/// The same for the download through the policer, which trails CAKE's
/// goodput with four flows already (docs/ingress.md) and by about 0.15
/// with one (docs/pacer.md).
const POLICE_SLACK: f64 = 0.25;
/// Slack of the many-flow goodput ratio above CAKE's.
const MANY_SLACK: f64 = 0.03;
/// The wire rate's bound with many flows, as a multiple of the rate. The
/// target is 1.02; the benchmark's median sits at it (docs/pacer.md), so
/// the test holds the bound that catches an overshoot of the kind the
/// broken join rule gave (goodput 1.006 of the rate, wire about 1.05).
const WIRE_BOUND: f64 = 1.05;

fn rate() -> Rate {
    "50mbit".parse().expect("a valid rate")
}

fn timing() -> Timing {
    let secs = std::env::var("SHAPER_VM_TEST_SECS")
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .expect("SHAPER_VM_TEST_SECS: whole seconds")
        })
        .unwrap_or(5);
    Timing::new(Duration::from_secs(secs), Duration::from_secs(2))
}

fn run(tb: &Testbed, case: &Case, state: &State) -> RunResult {
    let name = state.name();
    let t = Instant::now();
    let r = run_scenario(tb, &case.scenario(state.clone(), timing()))
        .unwrap_or_else(|e| panic!("{}, {name}: {e:#}", case.name));
    eprintln!("    {} ({:.1} s)", r.summary(), t.elapsed().as_secs_f64());
    r
}

/// One case's verdict: `Ok(line)` or `Err(line)`, the line naming both
/// states' figures.
type Verdict = Result<String, String>;

/// Runs CAKE then the shaper on `case` and judges them with `check`; once
/// more if that misses.
fn judge(tb: &Testbed, case: &Case, check: impl Fn(&RunResult, &RunResult) -> Verdict) -> Verdict {
    let once = || check(&run(tb, case, &case.cake), &run(tb, case, &case.shaper));
    once().or_else(|first| {
        eprintln!("  {}: missed once ({first}); measuring again", case.name);
        once().map_err(|second| format!("{first}; again: {second}"))
    })
}

fn report(results: &[Verdict]) {
    eprintln!("summary:");
    let mut failed = Vec::new();
    for r in results {
        match r {
            Ok(line) => eprintln!("  ok    {line}"),
            Err(line) => {
                eprintln!("  FAIL  {line}");
                failed.push(line.clone());
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} case(s) failed: {failed:#?}",
        failed.len()
    );
}

/// Every lone-flow case beside a 10 pps ping, and the bulk flow beside 20
/// sparse UDP flows, on one testbed.
#[test]
fn a_lone_flow_gets_the_rate_cake_gets() {
    if skip_without_lab_qdiscs() {
        return;
    }
    let tb = Testbed::new(TestbedOptions::default()).expect("build the testbed");
    let (bin, r) = (shaper_bin(), rate());
    let mut results: Vec<Verdict> = cases::lone_flow(&bin, r)
        .iter()
        .map(|case| {
            judge(&tb, case, |cake, ours| {
                let (c, s) = (cases::first_ratio(cake, r), cases::first_ratio(ours, r));
                let slack = if case.name == "down_police" {
                    POLICE_SLACK
                } else {
                    LONE_SLACK
                };
                let line = format!(
                    "{}: shaper {s:.3} of the rate, CAKE {c:.3} (floor: CAKE's - {slack})",
                    case.name
                );
                if s >= c - slack { Ok(line) } else { Err(line) }
            })
        })
        .collect();
    let case = cases::bulk_beside_sparse(&bin, r);
    results.push(judge(&tb, &case, |cake, ours| {
        let (cb, sb) = (cases::first_ratio(cake, r), cases::first_ratio(ours, r));
        let loss = |x: &RunResult| x.flows[1].report.lost_percent;
        let (cl, sl) = (loss(cake), loss(ours));
        let line = format!(
            "{}: bulk shaper {sb:.3}, CAKE {cb:.3}; sparse loss shaper {sl:.2}%, CAKE {cl:.2}%",
            case.name
        );
        if sb >= cb - LONE_SLACK && sl == 0.0 {
            Ok(line)
        } else {
            Err(line)
        }
    }));
    report(&results);
}

/// 64 TCP flows: the shaper keeps to its rate on the wire.
#[test]
fn many_flows_stay_within_the_rate() {
    if skip_without_lab_qdiscs() {
        return;
    }
    let tb = Testbed::new(TestbedOptions::default()).expect("build the testbed");
    let (bin, r) = (shaper_bin(), rate());
    let omit = timing().omit;
    let results: Vec<Verdict> = [64]
        .into_iter()
        .map(|n| {
            let case = cases::many_flows(&bin, r, n);
            judge(&tb, &case, |cake, ours| {
                let (c, s) = (cake.ratio(r), ours.ratio(r));
                let wire = |x: &RunResult| cases::wire_ratio(x, omit, r);
                let (Some(w), Some(cw)) = (wire(ours), wire(cake)) else {
                    return Err(format!("{}: no qdisc samples in the measured time", case.name));
                };
                let line = format!(
                    "{}: shaper goodput {s:.3}, wire {w:.3} of the rate; CAKE goodput {c:.3}, wire {cw:.3}",
                    case.name
                );
                if w <= WIRE_BOUND && s <= c + MANY_SLACK { Ok(line) } else { Err(line) }
            })
        })
        .collect();
    report(&results);
}
