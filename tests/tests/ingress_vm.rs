//! Download shaping at the router's WAN ingress, in the lab topology (VM:
//! the host lacks cake and netem; elsewhere this skips with the reason).
//!
//! The server sends 4 TCP flows to the client through an emulated access
//! link (TBF at 22 Mbit/s with a 200 ms FIFO, the ISP's bloated buffer),
//! while the client pings the server. On the router's `wan0` ingress, in
//! turn: nothing, CAKE in `ingress` mode on an IFB at 20 Mbit/s
//! (sqm-scripts' setup), a plain token-bucket policer at 20 Mbit/s,
//! `shaper run --ingress-rate 20mbit` (the AQM policer), and the same with
//! `--ingress-mode ifb` (the fair pacer on an IFB). At 20 ms and at 80 ms
//! path RTT (netem on the server), each measured in the same run.
//!
//! Must hold at each RTT, in one of two rounds (TCG timing moves single
//! figures by a few percent): the policer's goodput is at least 85% of the
//! rate and its ping p99 at most twice CAKE-ingress's (as good as the anchor, with slack for TCG);
//! `ifb` mode (fed by the BPF redirect with TCX, by tc's matchall + mirred
//! on 6.1, see `tc::mirred`) keeps 85% of the rate and at least halves `none`'s ping p99 (a
//! looser bar: its p99 at 20 ms runs above CAKE's). The plain
//! policer is reported beside them, not judged.

use std::time::{Duration, Instant};

use shaper::{
    lab::{
        FlowSpec, Host, RunResult, Scenario, State, Testbed, TestbedOptions, Timing, WanLink,
        run_scenario,
    },
    rate::Rate,
};
use shaper_tests::topo::{is_root, shaper_bin, skip_unless};

const RATE: &str = "20mbit";
const LINK_BITS_PER_S: u64 = 22_000_000;

fn skip() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root");
        return true;
    }
    let has = |kind: &str| shaper::tc::probe_qdisc_kind(kind).unwrap_or(false);
    skip_unless(shaper_tests::topo::kernel_has_fq(), "sch_fq")
        || skip_unless(has("cake"), "sch_cake")
        || skip_unless(has("netem"), "sch_netem")
        || skip_unless(
            std::process::Command::new("iperf3")
                .arg("--version")
                .output()
                .is_ok(),
            "iperf3 (a tool, not a kernel feature)",
        )
}

fn rate() -> Rate {
    RATE.parse().expect("a valid rate")
}

fn timing() -> Timing {
    let secs = std::env::var("SHAPER_VM_TEST_SECS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(8u64);
    // Longer than the egress tests: at 80 ms TCP needs a few seconds more
    // to settle after slow start.
    Timing::new(Duration::from_secs(secs + 4), Duration::from_secs(4))
}

fn testbed(rtt: Duration) -> Testbed {
    let t = Instant::now();
    let tb = Testbed::new(TestbedOptions {
        client_delay: Duration::ZERO,
        client2_delay: Duration::ZERO,
        wan_delay: rtt,
        wan_link: Some(WanLink {
            rate_bits_per_s: LINK_BITS_PER_S,
            buffer: Duration::from_millis(200),
        }),
        ..TestbedOptions::default()
    })
    .expect("build the testbed");
    eprintln!("(testbed built in {:.1} s)", t.elapsed().as_secs_f64());
    tb
}

fn run(tb: &Testbed, state: State) -> RunResult {
    let name = state.name();
    let flows = vec![FlowSpec::tcp(Host::Client, 4).reversed()];
    let scenario = Scenario::new(state, flows, timing()).with_ping(Host::Client);
    let t = Instant::now();
    let r = run_scenario(tb, &scenario).unwrap_or_else(|e| panic!("{name}: {e}"));
    eprintln!("  {} ({:.1} s)", r.summary(), t.elapsed().as_secs_f64());
    r
}

fn p99(r: &RunResult) -> f64 {
    r.ping().map_or(f64::INFINITY, |p| p.p99)
}

fn shaper_ingress(mode: &str) -> State {
    State::ShaperIngress {
        bin: shaper_bin(),
        rate: rate(),
        extra_args: vec!["--ingress-mode".to_owned(), mode.to_owned()],
    }
}

/// One RTT: the baselines once, then CAKE-ingress and the shaper in up to
/// two rounds. Returns the failure, if both rounds missed.
fn at_rtt(rtt_ms: u64) -> Option<String> {
    let tb = testbed(Duration::from_millis(rtt_ms));
    let r = rate();
    eprintln!("download, 4 flows, {rtt_ms} ms RTT, access link 22 Mbit/s with 200 ms buffer:");
    let none = run(&tb, State::None);
    let policer = run(&tb, State::Policer { rate: r });
    eprintln!(
        "  baselines: none {:.3} of the rate, ping p99 {:.1} ms; plain policer {:.3}, p99 {:.1} ms",
        none.ratio(r),
        p99(&none),
        policer.ratio(r),
        p99(&policer)
    );
    let mut last = String::new();
    for round in 1..=2 {
        let cake = run(&tb, State::CakeIngress { rate: r });
        let police = run(&tb, shaper_ingress("police"));
        let ifb = run(&tb, shaper_ingress("ifb"));
        let (gc, pc) = (cake.ratio(r), p99(&cake));
        let counters = police.counters.as_ref().ok();
        let get = |k: &str| counters.and_then(|c| c.get(k)).copied().unwrap_or(0);
        eprintln!(
            "  {rtt_ms} ms, round {round}: cake-ingress goodput {gc:.3}, p99 {pc:.1} ms; \
             shaper-police {:.3}, {:.1} ms (drops {}, marks {}, withheld {}, retransmits {}); \
             shaper-ifb {:.3}, {:.1} ms (retransmits {})",
            police.ratio(r),
            p99(&police),
            get("ingress.police_drop"),
            get("ingress.ce_marked"),
            get("ingress.police_withheld"),
            police.retransmits,
            ifb.ratio(r),
            p99(&ifb),
            ifb.retransmits,
        );
        // police: p99 ≤ 2× CAKE-ingress. ifb: a looser bar; it must at least halve the bloat of
        // `none` (its p99 at 20 ms was 36.7 to 68.2 ms beside CAKE's 23;
        // see docs/ingress.md).
        let none_p99 = p99(&none);
        let mut misses = Vec::new();
        if !(police.ratio(r) >= 0.85 && p99(&police) <= 2.0 * pc) {
            misses.push(format!(
                "{rtt_ms} ms: shaper-police goodput {:.3} (needs ≥ 0.85), ping p99 {:.1} ms vs \
                 cake-ingress {pc:.1} ms (needs ≤ 2×)",
                police.ratio(r),
                p99(&police)
            ));
        }
        if !(ifb.ratio(r) >= 0.85 && p99(&ifb) <= none_p99 / 2.0) {
            misses.push(format!(
                "{rtt_ms} ms: shaper-ifb goodput {:.3} (needs ≥ 0.85), ping p99 {:.1} ms vs \
                 none's {none_p99:.1} ms (needs ≤ half)",
                ifb.ratio(r),
                p99(&ifb)
            ));
        }
        if misses.is_empty() {
            return None;
        }
        last = misses.join("\n");
    }
    Some(last)
}

#[test]
fn police_and_ifb_keep_goodput_and_latency_at_20_and_80_ms() {
    if skip() {
        return;
    }
    let failures: Vec<String> = [20, 80].into_iter().filter_map(at_rtt).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
