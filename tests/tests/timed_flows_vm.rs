//! Flows that come and go, beside CAKE: the cases of
//! `shaper::lab::timed_cases` on one lab testbed (client → router → server,
//! 50 Mbit/s, 20 ms RTT), counted in 100 ms bins on the receiver's one
//! clock. Each state is applied once and runs the three cases in turn:
//! - leave: 4 flows, then 3 stop. The one left (UDP above the rate, so its
//!   own window does not set its pace) carries at least 0.9 of the rate in
//!   a bin that starts within [`LEAVE_WITHIN`] of the last byte of the
//!   others;
//! - join: 1 flow, then 3 more. From a second after the join, every flow's
//!   goodput over each half second is within [`SHARE_TOLERANCE`] of the
//!   four flows' mean, and the ping's p99 over the join is within
//!   [`PING_P99_SLACK_MS`] of CAKE's;
//! - churn: one bulk flow beside back-to-back 100 KB transfers. The bulk
//!   flow's goodput ratio is at least CAKE's less [`CHURN_SLACK`], and the
//!   transfers' median time at most CAKE's times [`TRANSFER_FACTOR`].
//!
//! A pacer whose share reacts to flows by epochs shows here: a share that
//! stays divided after flows leave idles the link, one that lags a join
//! lets the first flow crowd out the others.
//!
//! A case that misses is measured once more (CAKE and the shaper, that case
//! alone), and two misses fail. Needs sch_fq, sch_cake and sch_netem (the
//! VM's kernels); elsewhere it skips with a reason, and under
//! `SHAPER_REQUIRE_FULL_KERNEL=1` a skip fails.
//!
//! Environment: `SHAPER_BIN` (the shaper binary).

use std::time::Duration;

use shaper::{
    lab::{
        Testbed, TestbedOptions, TimedRun, TimedScenario, run_timed_scenarios,
        timed::{BIN, bin_of},
        timed_cases::{
            self, JOIN_AT, JOIN_END, LEAVE_AT, LEAVE_END, LEAVE_SHARE, SETTLE, SHARE_WINDOW,
            TimedCase,
        },
    },
    rate::Rate,
};
use shaper_tests::{
    skip::{note_retry, require},
    topo::shaper_bin,
    vs_cake::{self, Verdict, report, verdict},
};

/// The bin showing that the flow left took the link (at
/// [`LEAVE_SHARE`] of the rate) starts at most this long after
/// the others' last byte.
const LEAVE_WITHIN: Duration = Duration::from_millis(300);
/// Each flow's goodput over a window is within this fraction of the mean.
const SHARE_TOLERANCE: f64 = 0.2;
/// The join's ping p99 may exceed CAKE's by this much (ms).
const PING_P99_SLACK_MS: f64 = 5.0;
/// The churn's bulk goodput ratio may trail CAKE's by this much.
const CHURN_SLACK: f64 = 0.05;
/// The short transfers' median time may be this multiple of CAKE's. Under
/// both, a transfer takes the path's floor (the handshake and the
/// slow-start rounds of the RTT, each round's data at the flow's share),
/// and CAKE's own median moves by a few percent from run to run around it.
/// A queue in front of the transfers costs up to a CoDel target in every
/// round, several times this margin.
const TRANSFER_FACTOR: f64 = 1.05;

fn rate() -> Rate {
    "50mbit".parse().expect("a valid rate")
}

/// Flow `i`'s goodput per bin from `from` to `to`, in Mbit/s, for the log.
fn series(run: &TimedRun, i: usize, from: Duration, to: Duration) -> String {
    (bin_of(from)..bin_of(to))
        .map(|b| {
            let t = timed_cases::bin_start(b);
            format!("{:.1}", run.timed.flow_bps(i, t, t + BIN) / 1e6)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn leave(cake: &TimedRun, ours: &TimedRun, r: Rate) -> Verdict {
    let show = |x: &TimedRun| {
        format!(
            "{} (Mbit/s per 100 ms from {:.1} s: {})",
            timed_cases::leave_reach(x, r, LEAVE_SHARE)
                .map_or("never".to_owned(), |d| format!("{} ms", d.as_millis())),
            (LEAVE_AT - SHARE_WINDOW).as_secs_f64(),
            series(x, 0, LEAVE_AT - SHARE_WINDOW, LEAVE_END)
        )
    };
    verdict(
        timed_cases::leave_reach(ours, r, LEAVE_SHARE).is_some_and(|d| d <= LEAVE_WITHIN),
        format!(
            "leave: the last flow at {LEAVE_SHARE} of the rate after, shaper {}; CAKE {} (needs \
             ≤ {} ms)",
            show(ours),
            show(cake),
            LEAVE_WITHIN.as_millis()
        ),
    )
}

fn join(cake: &TimedRun, ours: &TimedRun) -> Verdict {
    let spread = |x| timed_cases::join_spread(x, SETTLE, SHARE_WINDOW);
    let (cs, ss) = (spread(cake), spread(ours));
    let p99 = |x: &TimedRun| x.ping().map_or(f64::INFINITY, |p| p.p99);
    let (cp, sp) = (p99(cake), p99(ours));
    let from = JOIN_AT - SHARE_WINDOW;
    let each = |x: &TimedRun| {
        (0..x.timed.bins.len())
            .map(|i| format!("[{}]", series(x, i, from, JOIN_END)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    verdict(
        ss <= SHARE_TOLERANCE && sp <= cp + PING_P99_SLACK_MS,
        format!(
            "join: largest share deviation from {:.1} s, shaper {ss:.2}, CAKE {cs:.2} (needs ≤ \
             {SHARE_TOLERANCE}); ping p99 shaper {sp:.1}, CAKE {cp:.1} ms (needs ≤ CAKE's + \
             {PING_P99_SLACK_MS}); Mbit/s per 100 ms from {:.1} s, shaper {}; CAKE {}",
            (JOIN_AT + SETTLE).as_secs_f64(),
            from.as_secs_f64(),
            each(ours),
            each(cake)
        ),
    )
}

fn churn(cake: &TimedRun, ours: &TimedRun, r: Rate) -> Verdict {
    let bulk = |x| timed_cases::churn_bulk_ratio(x, r);
    let (cb, sb) = (bulk(cake), bulk(ours));
    let (ct, st) = (
        timed_cases::median_transfer_ms(cake),
        timed_cases::median_transfer_ms(ours),
    );
    verdict(
        sb >= cb - CHURN_SLACK && st <= TRANSFER_FACTOR * ct,
        format!(
            "churn: bulk shaper {sb:.3}, CAKE {cb:.3} of the rate (needs ≥ CAKE's - \
             {CHURN_SLACK}); short transfers shaper {} in a median {st:.0} ms, CAKE {} in \
             {ct:.0} ms (needs ≤ {TRANSFER_FACTOR} × CAKE's)",
            ours.timed.transfers.len(),
            cake.timed.transfers.len()
        ),
    )
}

/// Runs `scenarios` under CAKE and then under the shaper, one apply each.
fn both(
    tb: &Testbed,
    case: &TimedCase,
    scenarios: &[TimedScenario],
) -> (Vec<TimedRun>, Vec<TimedRun>) {
    let run = |state| {
        run_timed_scenarios(tb, state, scenarios)
            .unwrap_or_else(|e| panic!("{}: {e:#}", state.name()))
    };
    (run(&case.cake), run(&case.shaper))
}

#[test]
fn flows_that_leave_join_and_churn_keep_the_rate_and_the_shares() {
    if !require(vs_cake::NEEDS) {
        return;
    }
    let tb = vs_cake::testbed(TestbedOptions::default());
    let (bin, r) = (shaper_bin(), rate());
    let all = [
        timed_cases::leave(&bin, r),
        timed_cases::join(&bin, r),
        timed_cases::churn(&bin, r),
    ];
    let judge = |name: &str, cake: &TimedRun, ours: &TimedRun| match name {
        "leave" => leave(cake, ours, r),
        "join" => join(cake, ours),
        _ => churn(cake, ours, r),
    };
    let scenarios: Vec<TimedScenario> = all.iter().map(|c| c.scenario.clone()).collect();
    let (cake, ours) = both(&tb, &all[0], &scenarios);
    // The shaper's drops in each case: its counters count from the apply.
    let drops = |x: &TimedRun, k: &str| x.counters.as_ref().ok().and_then(|c| c.get(k)).copied();
    for (i, case) in all.iter().enumerate() {
        let during = |k: &str| {
            let before = i.checked_sub(1).map_or(Some(0), |p| drops(&ours[p], k));
            drops(&ours[i], k)
                .zip(before)
                .map_or("unknown".to_owned(), |(n, b)| {
                    n.saturating_sub(b).to_string()
                })
        };
        eprintln!(
            "  {}: shaper codel_drop {}, overload_drop {}, horizon_drop {}, ce_marked {}",
            case.name,
            during("codel_drop"),
            during("overload_drop"),
            during("horizon_drop"),
            during("ce_marked")
        );
    }
    let results: Vec<Verdict> = all
        .iter()
        .zip(cake.iter().zip(&ours))
        .map(|(case, (c, s))| {
            judge(&case.name, c, s).or_else(|first| {
                note_retry(&first);
                let (c, s) = both(&tb, case, std::slice::from_ref(&case.scenario));
                judge(&case.name, &c[0], &s[0])
                    .map_err(|second| format!("{first}; again: {second}"))
            })
        })
        .collect();
    report(&results);
}
