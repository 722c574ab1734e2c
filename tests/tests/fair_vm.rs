//! The fair pacer against CAKE on a client → router → server testbed
//! (`shaper::lab`), on a kernel with sch_fq, sch_cake and sch_netem (the
//! VM's; elsewhere each test skips with a reason, and under
//! `SHAPER_REQUIRE_FULL_KERNEL=1` a skip is a failure).
//!
//! Every comparison runs CAKE at the same rate, on the same testbed and
//! traffic, in the same test, and asserts the shaper against it with a
//! tolerance: absolute figures under emulation mean little. Both states'
//! figures are printed (run with `--nocapture` to see them).
//!
//! Environment:
//! - `SHAPER_BIN`: the shaper binary (default: the workspace's debug build).
//! - `SHAPER_PACER_ARGS`: extra `shaper run` arguments, whitespace-split
//!   (e.g. `--pacer aggregate`, which these tests should fail).
//! - `SHAPER_VM_TEST_SECS`: measured seconds of the short runs (default 8,
//!   after 2 s omitted: 10 s runs); the fairness runs measure twice that
//!   after 5 s. The defaults keep the file near 6 minutes in the VM.
//!
//! The base path RTT is 20 ms (netem on the router's return path), except
//! where a test sets its own.

use std::time::{Duration, Instant};

use shaper::{
    lab::{
        FlowSpec, Host, Interval, RunResult, Scenario, State, Testbed, TestbedOptions, Timing,
        run_scenario, stats,
    },
    rate::Rate,
};
use shaper_tests::topo::{shaper_bin, skip_without_lab_qdiscs};

fn rate(s: &str) -> Rate {
    s.parse().expect("a valid rate")
}

/// Measured seconds of a short run (`SHAPER_VM_TEST_SECS`, default 8).
fn secs() -> u64 {
    std::env::var("SHAPER_VM_TEST_SECS")
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .expect("SHAPER_VM_TEST_SECS must be whole seconds")
        })
        .unwrap_or(8)
}

/// A short run: `secs()` measured after 2 s.
fn short() -> Timing {
    Timing::new(Duration::from_secs(secs()), Duration::from_secs(2))
}

/// A fairness run: long enough for unequal flows to converge.
fn long() -> Timing {
    Timing::new(Duration::from_secs(2 * secs()), Duration::from_secs(5))
}

fn pacer_args() -> Vec<String> {
    std::env::var("SHAPER_PACER_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn shaper(rate: Rate) -> State {
    State::Shaper {
        bin: shaper_bin(),
        rate,
        extra_args: pacer_args(),
    }
}

fn testbed(options: TestbedOptions) -> Testbed {
    let t = Instant::now();
    let tb = Testbed::new(options).expect("build the testbed");
    eprintln!("(testbed built in {:.1} s)", t.elapsed().as_secs_f64());
    tb
}

fn run(tb: &Testbed, scenario: Scenario) -> RunResult {
    let name = scenario.state.name();
    let t = Instant::now();
    let r = run_scenario(tb, &scenario).unwrap_or_else(|e| panic!("{name}: {e}"));
    eprintln!("  {} ({:.1} s)", r.summary(), t.elapsed().as_secs_f64());
    r
}

/// The same traffic under CAKE, then under the shaper, at `rate`.
fn cake_then_shaper(
    tb: &Testbed,
    rate: Rate,
    flows: &[FlowSpec],
    timing: Timing,
    ping: Option<Host>,
) -> (RunResult, RunResult) {
    let scenario = |state| {
        let s = Scenario::new(state, flows.to_vec(), timing);
        match ping {
            Some(h) => s.with_ping(h),
            None => s,
        }
    };
    let cake = run(tb, scenario(State::Cake { rate }));
    let ours = run(tb, scenario(shaper(rate)));
    (cake, ours)
}

fn gso_name(gso: bool) -> &'static str {
    if gso { "on" } else { "off" }
}

/// Test 1: 4 TCP flows at 20, 50 and 200 mbit. The shaper's goodput as a
/// fraction of the rate is at least CAKE's − 0.02, and never above the rate.
fn goodput(gso: bool) {
    let tb = testbed(TestbedOptions {
        gso,
        ..TestbedOptions::default()
    });
    let flows = [FlowSpec::tcp(Host::Client, 4)];
    let mut failures = Vec::new();
    // Without GSO, 200 mbit is 16.5k packets/s, more than the emulated
    // guest forwards (unshaped it carried 111 Mbit/s): both states are then
    // CPU-bound (CAKE 0.495, shaper 0.426 of the rate) and the ratio
    // measures TCG, not the pacer. CPU per Mbit is the benchmark's figure.
    let rates: &[&str] = if gso {
        &["20mbit", "50mbit", "200mbit"]
    } else {
        &["20mbit", "50mbit"]
    };
    for &r in rates {
        let r = rate(r);
        eprintln!("goodput at {r}, 4 flows, GSO {}:", gso_name(gso));
        let (cake, ours) = cake_then_shaper(&tb, r, &flows, short(), None);
        let (c, s) = (cake.ratio(r), ours.ratio(r));
        eprintln!("  ratio: cake {c:.3}, shaper {s:.3}");
        // The testbed's own check: GSO off means MTU-sized packets at the
        // router's egress (the shaper counts skbs as they come).
        let size = ours
            .counter("bytes")
            .zip(ours.counter("packets"))
            .map(|(b, p)| b / p.max(1));
        eprintln!("  mean packet at the router's egress: {size:?} bytes");
        if !gso {
            assert!(size.is_some_and(|m| m <= 1514), "GSO was not off: {size:?}");
        }
        if s < c - 0.02 || s > 1.0 {
            failures.push(format!(
                "{r}: shaper ratio {s:.3} vs cake {c:.3} (needs ≥ cake − 0.02, ≤ 1)"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn goodput_with_gso_matches_cake() {
    if skip_without_lab_qdiscs() {
        return;
    }
    goodput(true);
}

#[test]
fn goodput_without_gso_matches_cake() {
    if skip_without_lab_qdiscs() {
        return;
    }
    goodput(false);
}

/// Test 2: ping from the sending client under 4 bulk flows at 50 mbit. The
/// shaper's p50 and p90 are within 2 ms of CAKE's, its p99 within 1.5×.
///
/// Under TCG a round's p90 moves by about a millisecond with the host's load
/// (the full suite's 6.1 stage once measured shaper p90 25.3 against CAKE's
/// 22.9 ms, 0.4 ms over the bound, with p50 and p99 well inside). So a failed
/// round is measured again, CAKE and shaper both, and the test fails only
/// when two rounds in a row do. A pacer that queued ping behind the bulk
/// flows (a virtual FIFO) adds tens of milliseconds and fails both.
fn loaded_ping(gso: bool) {
    let tb = testbed(TestbedOptions {
        gso,
        ..TestbedOptions::default()
    });
    let r = rate("50mbit");
    let mut failures = Vec::new();
    for round in 1..=2 {
        eprintln!(
            "ping under 4 flows at {r}, GSO {}, round {round}:",
            gso_name(gso)
        );
        let (cake, ours) = cake_then_shaper(
            &tb,
            r,
            &[FlowSpec::tcp(Host::Client, 4)],
            short(),
            Some(Host::Client),
        );
        let c = cake.ping().expect("ping samples under cake");
        let s = ours.ping().expect("ping samples under the shaper");
        eprintln!(
            "  p50/p90/p99 ms: cake {:.1}/{:.1}/{:.1}, shaper {:.1}/{:.1}/{:.1}",
            c.p50, c.p90, c.p99, s.p50, s.p90, s.p99
        );
        if s.p50 <= c.p50 + 2.0 && s.p90 <= c.p90 + 2.0 && s.p99 <= 1.5 * c.p99 {
            return;
        }
        failures.push(format!(
            "round {round}: shaper p50/p90/p99 {:.1}/{:.1}/{:.1} ms vs cake \
             {:.1}/{:.1}/{:.1} ms",
            s.p50, s.p90, s.p99, c.p50, c.p90, c.p99
        ));
    }
    panic!(
        "{} (needs p50, p90 ≤ cake + 2 ms, p99 ≤ 1.5 × cake in one of two rounds)",
        failures.join("; ")
    );
}

#[test]
fn loaded_ping_with_gso_matches_cake() {
    if skip_without_lab_qdiscs() {
        return;
    }
    loaded_ping(true);
}

#[test]
fn loaded_ping_without_gso_matches_cake() {
    if skip_without_lab_qdiscs() {
        return;
    }
    loaded_ping(false);
}

/// Test 3: two unequal flows at 50 mbit share the rate: Jain's index over
/// the two clients is at least 0.9 and at least CAKE's − 0.05.
fn fairness(what: &str, options: TestbedOptions, flows: &[FlowSpec]) {
    let tb = testbed(options);
    let r = rate("50mbit");
    eprintln!("fairness by {what} at {r}:");
    let (cake, ours) = cake_then_shaper(&tb, r, flows, long(), None);
    let c = cake.jain().expect("cake goodput");
    let s = ours.jain().expect("shaper goodput");
    eprintln!("  Jain: cake {c:.3}, shaper {s:.3}");
    assert!(
        s >= 0.9 && s >= c - 0.05,
        "shaper Jain {s:.3} vs cake {c:.3} (needs ≥ 0.9 and ≥ cake − 0.05): {}",
        ours.summary()
    );
}

#[test]
fn flows_with_10_and_80_ms_rtt_share_fairly() {
    if skip_without_lab_qdiscs() {
        return;
    }
    fairness(
        "RTT (10 vs 80 ms)",
        TestbedOptions {
            client_delay: Duration::from_millis(10),
            client2_delay: Duration::from_millis(80),
            ..TestbedOptions::default()
        },
        // Two streams per host: a single CUBIC flow over 80 ms spends long
        // stretches below its share after each congestion signal, which any
        // work-conserving scheduler hands to the other host (CAKE 0.918 and
        // 0.924, the shaper 0.953 and 0.879 with one stream each); with two
        // the test measures the scheduler's fairness, not one flow's
        // recovery.
        &[
            FlowSpec::tcp(Host::Client, 2),
            FlowSpec::tcp(Host::Client2, 2),
        ],
    );
}

#[test]
fn cubic_and_bbr_share_fairly() {
    if skip_without_lab_qdiscs() {
        return;
    }
    fairness(
        "congestion control (cubic vs bbr)",
        TestbedOptions::default(),
        &[
            FlowSpec::tcp(Host::Client, 1).with_cc("cubic"),
            FlowSpec::tcp(Host::Client2, 1).with_cc("bbr"),
        ],
    );
}

/// Test 4: an unresponsive UDP flood at twice the rate from client2 does not
/// starve one TCP flow from the client: TCP keeps at least 40% of the rate.
///
/// Under TCG one TCP flow's share moves by a few hundredths between rounds
/// with the host's load (shaper 0.399 to 0.467 over seven full-suite runs,
/// CAKE 0.344 to 0.474 beside it), so a failed round is measured again and
/// the test fails only when two rounds in a row do. A pacer that let the
/// flood take the link (an aggregate FIFO) leaves TCP a few percent and
/// fails both.
#[test]
fn tcp_keeps_40_percent_beside_a_udp_flood() {
    if skip_without_lab_qdiscs() {
        return;
    }
    let tb = testbed(TestbedOptions::default());
    let r = rate("50mbit");
    let flood = Rate::from_bits_per_s(2 * r.bits_per_s()).expect("in range");
    let share = |x: &RunResult| x.flows[0].report.receiver_bps / r.bits_per_s() as f64;
    let mut failures = Vec::new();
    for round in 1..=2 {
        eprintln!("1 TCP flow beside UDP at {flood}, rate {r}, round {round}:");
        let (cake, ours) = cake_then_shaper(
            &tb,
            r,
            &[
                FlowSpec::tcp(Host::Client, 1),
                FlowSpec::udp(Host::Client2, flood),
            ],
            short(),
            None,
        );
        let (c, s) = (share(&cake), share(&ours));
        eprintln!("  TCP share of the rate: cake {c:.3}, shaper {s:.3}");
        if s >= 0.4 {
            return;
        }
        failures.push(format!("round {round}: shaper {s:.3} (cake {c:.3})"));
    }
    panic!(
        "TCP's share of the rate beside the flood: {} (needs ≥ 0.4 in one of two rounds)",
        failures.join("; ")
    );
}

/// Test 5: with ECN negotiated, the shaper's AQM marks instead of dropping:
/// `ce_marked` > 0, and `aqm_drop` and `horizon_drop` each ≤ `ce_marked` / 10. CAKE's marks show the
/// testbed really negotiated ECN.
#[test]
fn ecn_flows_are_marked_not_dropped() {
    if skip_without_lab_qdiscs() {
        return;
    }
    let tb = testbed(TestbedOptions {
        ecn: true,
        ..TestbedOptions::default()
    });
    let r = rate("50mbit");
    eprintln!("ECN, 4 flows at {r}:");
    let flows = vec![FlowSpec::tcp(Host::Client, 4)];
    let cake = run(
        &tb,
        Scenario::new(State::Cake { rate: r }, flows.clone(), short()),
    );
    let ours = run(
        &tb,
        Scenario::new(shaper(r), flows, short()).with_counter_samples(Duration::from_millis(500)),
    );
    for (t, c) in &ours.counter_series {
        let get = |k: &str| c.get(k).copied().unwrap_or(0);
        eprintln!(
            "    {t:5.2} s: paced {} ce {} aqm_drop {} horizon_drop {}",
            get("paced"),
            get("ce_marked"),
            get("aqm_drop"),
            get("horizon_drop")
        );
    }
    let q = cake.qdisc.as_ref().expect("cake statistics");
    eprintln!(
        "  cake: ecn_mark {:?}, drops {}, retrans {}",
        q.ecn_marks, q.drops, cake.retransmits
    );
    let counters = ours.counters.as_ref().expect("the shaper's counters");
    eprintln!(
        "  shaper: retrans {}, counters {counters:?}",
        ours.retransmits
    );
    assert!(
        q.ecn_marks.unwrap_or(0) > 0,
        "cake marked nothing: ECN was not negotiated on the testbed"
    );
    let marked = counters
        .get("ce_marked")
        .copied()
        .expect("ce_marked counter");
    let dropped = counters.get("aqm_drop").copied().expect("aqm_drop counter");
    assert!(marked > 0, "the shaper marked no packet CE: {counters:?}");
    assert!(
        dropped <= marked / 10,
        "aqm_drop {dropped} is more than a tenth of ce_marked {marked}"
    );
    // Nor do the flows run into the horizon (slow start once did, when the
    // share fell to C/21: see `shaper_common::fair::mult_cap`).
    let horizon = counters
        .get("horizon_drop")
        .copied()
        .expect("horizon_drop counter");
    assert!(
        horizon <= marked / 10,
        "horizon_drop {horizon} is more than a tenth of ce_marked {marked}"
    );
}

/// The mean of the intervals that end before `at` (from 1 s on, after slow
/// start), and the intervals that start ≥ 1 s after `done` and last ≥ 0.5 s.
fn around_change(r: &RunResult, at: f64, done: f64) -> (Option<f64>, Vec<Interval>) {
    let series = &r.flows[0].report.intervals;
    for i in series {
        eprintln!(
            "    {:5.2}–{:5.2} s: {:6.2} Mbit/s",
            i.start,
            i.end,
            i.bps / 1e6
        );
    }
    eprintln!("    change issued at {at:.2} s, in effect at {done:.2} s");
    let before: Vec<f64> = series
        .iter()
        .filter(|i| i.start >= 1.0 && i.end <= at)
        .map(|i| i.bps)
        .collect();
    let after = series
        .iter()
        .filter(|i| i.start >= done + 1.0 && i.end - i.start >= 0.5)
        .copied()
        .collect();
    (stats::mean(&before), after)
}

/// Test 7: a live rate change from 50 to 20 mbit takes effect within a
/// second: every full interval starting ≥ 1 s after `shaper set-rate`
/// returned stays ≤ 1.05 × 20 mbit, and before the change the goodput is
/// near 50 mbit (≥ 0.85 of it, or ≥ CAKE's before its own change less 5%,
/// where a CPU-starved VM keeps both below the rate). CAKE, changed with
/// `tc qdisc change`, is printed for comparison.
#[test]
fn live_rate_change_takes_effect_within_a_second() {
    if skip_without_lab_qdiscs() {
        return;
    }
    let tb = testbed(TestbedOptions::default());
    let (from, to) = (rate("50mbit"), rate("20mbit"));
    // set-rate itself takes 1 to 3 s under emulation; the run must leave
    // full intervals after the one second of grace.
    let change = Duration::from_secs(3);
    let timing = Timing::new(Duration::from_secs(secs().max(10)), Duration::ZERO);
    let flows = vec![FlowSpec::tcp(Host::Client, 4)];
    eprintln!("live rate change {from} → {to} after {change:?}:");
    let mut before = Vec::new();
    let mut after = Vec::new();
    for state in [State::Cake { rate: from }, shaper(from)] {
        let r = run(
            &tb,
            Scenario::new(state, flows.clone(), timing).with_rate_change(change, to),
        );
        let (at, done) = r.rate_changed_at.expect("the rate was changed");
        let (b, a) = around_change(&r, at.as_secs_f64(), done.as_secs_f64());
        before.push(b.expect("intervals before the change"));
        after.push(a);
    }
    let (cake_before, ours_before) = (before[0], before[1]);
    eprintln!(
        "  before the change: cake {:.2}, shaper {:.2} Mbit/s",
        cake_before / 1e6,
        ours_before / 1e6
    );
    let near = (0.85 * from.bits_per_s() as f64).min(0.95 * cake_before);
    assert!(
        ours_before >= near,
        "before the change: {:.2} Mbit/s, not near {from} (cake: {:.2})",
        ours_before / 1e6,
        cake_before / 1e6
    );
    let limit = 1.05 * to.bits_per_s() as f64;
    let ours_after = &after[1];
    assert!(
        !ours_after.is_empty(),
        "no full interval ≥ 1 s after the change"
    );
    for i in ours_after {
        assert!(
            i.bps <= limit,
            "{:.2}–{:.2} s: {:.2} Mbit/s, above 1.05 × {to} a second after the change",
            i.start,
            i.end,
            i.bps / 1e6
        );
    }
}

/// Not a check: the testbed's figures with nothing on the WAN egress and
/// with CAKE, for the record (`--ignored`).
#[test]
#[ignore = "prints baseline figures only"]
fn baseline_figures() {
    if skip_without_lab_qdiscs() {
        return;
    }
    for gso in [true, false] {
        let tb = testbed(TestbedOptions {
            gso,
            ..TestbedOptions::default()
        });
        eprintln!("baseline, 4 flows, GSO {}:", gso_name(gso));
        for state in [
            State::None,
            State::Cake {
                rate: rate("50mbit"),
            },
        ] {
            let scenario = Scenario::new(state, vec![FlowSpec::tcp(Host::Client, 4)], short())
                .with_ping(Host::Client);
            let r = run(&tb, scenario);
            if let Some(c) = r.cpu_per_mbit() {
                eprintln!("    kernel CPU per Mbit/s: {:.4}%", c * 100.0);
            }
        }
    }
}
