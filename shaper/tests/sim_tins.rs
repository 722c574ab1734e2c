//! The DiffServ tins in the simulator (`shaper::sim`), which runs each
//! tin's fair state through the classifier's own roll and step
//! (`shaper_common::shared`, `shaper_common::tins`). The allocations
//! asserted are CAKE's in shaped mode: a tin up to its threshold before
//! lower tins, the whole link to a tin alone.
//!
//! Run: `cargo test -p shaper --test sim_tins --release -- --nocapture`.

use shaper::sim::{FlowSpec, MS, SEC, Scenario, SimReport, Source, run};
use shaper_common::tins::Diffserv;

/// 20 Mbit/s.
const C20: u64 = 20_000_000;
/// Shares are read from here on, after slow start.
const FROM_NS: u64 = 4 * SEC;
const SECS: u64 = 16;

/// diffserv4's tins.
const BEST_EFFORT: usize = 0;
const BULK: usize = 1;
const VOICE: usize = 3;

fn sim(sc: &Scenario) -> SimReport {
    run(sc).expect("a valid scenario")
}

/// `n` best-effort bulk flows at `rtt_ms` and the flows in `extra`, in
/// diffserv4.
fn beside_best_effort(n: usize, extra: &[FlowSpec]) -> Scenario {
    let mut sc = Scenario::new(C20, SECS * SEC);
    sc.diffserv = Diffserv::Diffserv4;
    for f in extra {
        sc = sc.with(*f);
    }
    for _ in 0..n {
        sc = sc.with(FlowSpec::always(Source::aimd_ms(20)).in_tin(BEST_EFFORT));
    }
    sc
}

fn total(r: &SimReport) -> f64 {
    (0..r.flows.len())
        .map(|i| r.share(i, FROM_NS, SECS * SEC))
        .sum()
}

/// CAKE gives a voice tin up to a quarter of the link before best
/// effort: one bulk flow marked EF beside 16 best-effort flows takes about
/// a quarter, where one fair share would be 1/17.
#[test]
fn an_ef_bulk_flow_takes_its_tins_threshold_beside_sixteen_best_effort_flows() {
    let ef = FlowSpec::always(Source::aimd_ms(20)).in_tin(VOICE);
    let r = sim(&beside_best_effort(16, &[ef]));
    let share = r.share(0, FROM_NS, SECS * SEC);
    let sum = total(&r);
    println!("EF bulk beside 16 BE: EF share {share:.3}, link {sum:.3}");
    assert!((0.235..=0.27).contains(&share), "EF share {share:.3}");
    assert!(sum <= 1.02, "link {sum:.3}");
}

/// Beside best effort a bulk (CS1) tin holds its sixteenth; best effort
/// keeps the rest.
#[test]
fn a_bulk_tin_holds_its_sixteenth_beside_best_effort() {
    let cs1 = FlowSpec::always(Source::aimd_ms(20)).in_tin(BULK);
    let r = sim(&beside_best_effort(4, &[cs1]));
    let share = r.share(0, FROM_NS, SECS * SEC);
    let sum = total(&r);
    println!("CS1 bulk beside 4 BE: CS1 share {share:.3}, link {sum:.3}");
    assert!((0.055..=0.075).contains(&share), "CS1 share {share:.3}");
    assert!((0.9..=1.02).contains(&sum), "link {sum:.3}");
}

/// A tin alone takes the whole link, whatever its threshold.
#[test]
fn a_voice_tin_alone_takes_the_whole_link() {
    let ef = FlowSpec::always(Source::aimd_ms(20)).in_tin(VOICE);
    let r = sim(&beside_best_effort(0, &[ef, ef]));
    let sum = total(&r);
    println!("two EF bulk flows alone: link {sum:.3}");
    assert!((0.9..=1.02).contains(&sum), "link {sum:.3}");
}

/// A voice-like EF flow (UDP at 1 Mbit/s) beside 16 best-effort bulk flows
/// is never paced: nothing drops it and it waits for nothing.
#[test]
fn an_ef_voice_flow_beside_bulk_passes_unpaced() {
    let voice = FlowSpec::always(Source::Unresponsive {
        rate_bytes_per_s: 1_000_000 / 8,
        len: 200,
        rtt_ns: 20 * MS,
    })
    .in_tin(VOICE);
    let r = sim(&beside_best_effort(16, &[voice]));
    let v = &r.flows[0].verdicts;
    let mut delays = r.flows[0].delays_between(FROM_NS, SECS * SEC);
    delays.sort_unstable();
    let p99_ms = delays[delays.len() * 99 / 100] as f64 / 1e6;
    println!(
        "EF 1 Mbit/s beside 16 BE: {v:?}, delay p99 {p99_ms:.2} ms, link {:.3}",
        total(&r)
    );
    assert_eq!(v.aqm_drop + v.horizon_drop, 0);
    assert!(p99_ms < 1.0, "delay p99 {p99_ms:.2} ms");
}

/// Without tins the same EF bulk flow is one flow of 17.
#[test]
fn without_tins_the_ef_flow_is_one_flow_among_seventeen() {
    let ef = FlowSpec::always(Source::aimd_ms(20)).in_tin(VOICE);
    let mut sc = beside_best_effort(16, &[ef]);
    sc.diffserv = Diffserv::Besteffort;
    let r = sim(&sc);
    let share = r.share(0, FROM_NS, SECS * SEC);
    println!("EF bulk beside 16 BE, besteffort: EF share {share:.3}");
    assert!(share < 0.1, "EF share {share:.3}");
}
