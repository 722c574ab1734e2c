//! Host isolation in the simulator (`shaper::sim`), which runs the
//! classifier's own step over hosts (`shaper_common::hosts::pace_hosts`).
//! The allocations asserted are CAKE's: hosts share the link first, then
//! each host's flows share what it gets. Every test prints what it measured
//! (`--nocapture` shows it).
//!
//! Run: `cargo test -p shaper --test sim_hosts --release -- --nocapture`.

use shaper::sim::{FlowSpec, MS, SEC, Scenario, SimReport, Source, jain_index, run};
use shaper_common::hosts::Isolation;

/// 50 Mbit/s.
const C50: u64 = 50_000_000;
/// Shares are read from here on, after slow start.
const FROM_NS: u64 = 4 * SEC;
const SECS: u64 = 16;
/// The least share of the host with one flow beside a host with eight,
/// where a half is fair among two hosts.
const LONE_HOST_SHARE: f64 = 0.45;
/// The least share of each of three hosts, where a third is fair.
const THIRD_LEAST: f64 = 0.28;
/// The most the link may carry, of the rate, over the measured span.
const LINK_MOST: f64 = 1.02;
/// The least, so the isolation does not idle the link.
const LINK_LEAST: f64 = 0.93;

/// Host A (1) and host B (2) behind the link.
const A: u32 = 1;
const B: u32 = 2;

fn sim(sc: &Scenario) -> SimReport {
    run(sc).expect("a valid scenario")
}

fn share(r: &SimReport, flows: impl IntoIterator<Item = usize>) -> f64 {
    flows
        .into_iter()
        .map(|i| r.share(i, FROM_NS, SECS * SEC))
        .sum()
}

/// Host A's 8 bulk flows (to `a_dsts` in turn) and host B's one (to
/// `b_dst`, listed last), all at 20 ms, under `isolation`.
fn eight_beside_one(isolation: Isolation, a_dsts: &[u32], b_dst: u32) -> Scenario {
    let mut sc = Scenario::new(C50, SECS * SEC);
    sc.isolation = isolation;
    for i in 0..8 {
        let dst = a_dsts[i % a_dsts.len()];
        sc = sc.with(FlowSpec::always(Source::aimd_ms(20)).between(A, dst));
    }
    sc.with(FlowSpec::always(Source::aimd_ms(20)).between(B, b_dst))
}

/// What a host-isolation run shows: B's share, A's flows' Jain index and
/// the link's load.
struct Split {
    b: f64,
    a_jain: f64,
    link: f64,
}

fn split(r: &SimReport) -> Split {
    let a: Vec<f64> = (0..8).map(|i| r.share(i, FROM_NS, SECS * SEC)).collect();
    Split {
        b: share(r, [8]),
        a_jain: jain_index(&a),
        link: share(r, 0..9),
    }
}

fn check(name: &str, s: &Split) -> Vec<String> {
    println!(
        "{name}: host B {:.3}, host A's flows Jain {:.3}, link {:.3}",
        s.b, s.a_jain, s.link
    );
    let mut bad = Vec::new();
    if s.b < LONE_HOST_SHARE {
        bad.push(format!("{name}: host B {:.3} < {LONE_HOST_SHARE}", s.b));
    }
    if s.a_jain < 0.95 {
        bad.push(format!("{name}: A's flows Jain {:.3} < 0.95", s.a_jain));
    }
    if !(LINK_LEAST..=LINK_MOST).contains(&s.link) {
        bad.push(format!(
            "{name}: link {:.3} outside [{LINK_LEAST}, {LINK_MOST}]",
            s.link
        ));
    }
    bad
}

/// dual-srchost: the host with one flow takes about half beside the host
/// with eight; without isolation, the same traffic leaves it a ninth, so
/// the check can fail.
#[test]
fn dual_srchost_gives_a_lone_flows_host_half_beside_eight_flows() {
    let flows = split(&sim(&eight_beside_one(Isolation::Flows, &[10], 10)));
    println!("flows: host B {:.3} (a ninth is {:.3})", flows.b, 1.0 / 9.0);
    assert!(
        flows.b < 0.2,
        "without isolation host B took {:.3}",
        flows.b
    );
    let dual = split(&sim(&eight_beside_one(Isolation::DualSrcHost, &[10], 10)));
    let bad = check("dual-srchost", &dual);
    assert!(bad.is_empty(), "{bad:#?}");
}

/// triple-isolate on an upload link: the sources share first, each flow
/// weighed by the busier of its hosts. B's flow goes to a server of its
/// own; A's go to two servers.
#[test]
fn triple_isolate_shares_by_source_host_with_two_servers() {
    let r = sim(&eight_beside_one(Isolation::TripleIsolate, &[10, 11], 12));
    let bad = check("triple-isolate", &split(&r));
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Three hosts with 1, 4 and 16 flows at different RTTs each take about a
/// third, where the flow pacer gives the first about a twentieth.
#[test]
fn three_hosts_share_the_link_whatever_their_flows() {
    let mut sc = Scenario::new(C50, SECS * SEC);
    sc.isolation = Isolation::DualSrcHost;
    let mut hosts = Vec::new();
    for (host, n, rtt_ms) in [(1u32, 1usize, 30u64), (2, 4, 40), (3, 16, 50)] {
        let first = sc.flows.len();
        for _ in 0..n {
            sc = sc.with(FlowSpec::always(Source::aimd_ms(rtt_ms)).between(host, 10 + host));
        }
        hosts.push(first..first + n);
    }
    let r = sim(&sc);
    let shares: Vec<f64> = hosts.into_iter().map(|h| share(&r, h)).collect();
    let link: f64 = shares.iter().sum();
    println!("dual-srchost, hosts of 1, 4, 16 flows: {shares:.3?}, link {link:.3}");
    for s in &shares {
        assert!(
            *s >= THIRD_LEAST,
            "a host took {s:.3} < {THIRD_LEAST}: {shares:.3?}"
        );
    }
    assert!((LINK_LEAST..=LINK_MOST).contains(&link), "link {link:.3}");
}

/// A lone flow keeps the whole rate under every mode with a host level,
/// and a host's pings do not dilute its bulk flow: the flows that count
/// are those paced.
#[test]
fn a_lone_flow_keeps_the_rate_and_sparse_flows_do_not_dilute_their_host() {
    let lone = |mode: Isolation| {
        let mut sc = Scenario::new(C50, SECS * SEC);
        sc.isolation = mode;
        share(
            &sim(&sc.with(FlowSpec::always(Source::aimd_ms(20)).between(A, 10))),
            [0],
        )
    };
    // One Reno flow's sawtooth leaves the simulated link part idle
    // whatever the pacer does: the bar is the flow pacer's own figure.
    let flows = lone(Isolation::Flows);
    for mode in [Isolation::TripleIsolate, Isolation::DualSrcHost] {
        let got = lone(mode);
        println!("{}: lone flow {got:.3} (flows: {flows:.3})", mode.keyword());
        assert!(
            got >= flows - 0.01,
            "{}: lone flow {got:.3}",
            mode.keyword()
        );
    }
    let mut sc = Scenario::new(C50, SECS * SEC);
    sc.isolation = Isolation::DualSrcHost;
    for _ in 0..4 {
        sc = sc.with(FlowSpec::always(Source::aimd_ms(20)).between(A, 10));
    }
    sc = sc.with(FlowSpec::always(Source::aimd_ms(20)).between(B, 10));
    for _ in 0..5 {
        let ping = Source::Sparse {
            interval_ns: 50 * MS,
            len: 100,
            rtt_ns: 20 * MS,
        };
        sc = sc.with(FlowSpec::always(ping).between(B, 11));
    }
    let r = sim(&sc);
    let b_bulk = share(&r, [4]);
    println!("dual-srchost: B's bulk flow beside its 5 pings and A's 4 flows {b_bulk:.3}");
    assert!(b_bulk >= LONE_HOST_SHARE, "B's bulk flow {b_bulk:.3}");
}
