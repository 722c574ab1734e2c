//! One rate across TX queues: the router's WAN device has [`QUEUES`] TX
//! queues, and `shaper run` puts an `mq` root with one sch_fq per queue on
//! it, as on a multi-queue NIC. The classifier stamps every packet against
//! one shared fair share, whichever queue it leaves by, so the queues must
//! share one rate and their flows one fairness. Lab testbed (clients →
//! router → server, 20 ms RTT), uploads, 50 Mbit/s.
//!
//! Flows are steered onto queues at `wan0`'s egress by tc, or left to the
//! veth's hash, and RPS spreads the router's receive work over the CPUs,
//! as [`shaper::lab::multiqueue`] describes.
//!
//! Cases, each a bar on the shaper:
//! - **(a)** one flow, alone, on queue 2: goodput at least that of one
//!   CAKE at the device's root less [`LONE_SLACK`]: the queues must cost a
//!   lone flow nothing of what a single queue carries, which under
//!   emulation is below the rate by TCP's headers and more
//!   (`docs/pacer.md`, "Across TX queues");
//! - **(b)** 8 flows from one client on the queues their hashes pick (all
//!   on one queue has probability 4^-7): after the first second no 1 s
//!   interval carries more than [`SUM_BOUND`] × the rate, and every flow
//!   gets at least [`FLOW_SHARE`] of an equal share of what they carried;
//! - **(c)** one flow from the client on queue 0, 8 from the second client
//!   on queue 1: Jain's index over the 9 flows at least [`JAIN_BAR`]. A
//!   rate split per queue would give the lone flow its queue's part and
//!   the eight theirs;
//! - **(d)** RPS on at the router and nothing steered: (a) to (c) again
//!   with their flows on the queues their hashes pick, each held to its
//!   bar, the RPS hand-offs counted (none would mean RPS did not act); and
//!   (c) with RPS off and nothing steered;
//! - **(e)** one TCP flow marked EF from the client on queue 2, 16
//!   best-effort flows from the second client on the queues their hashes
//!   pick, diffserv4: the EF flow's share at least [`EF_SHARE_OF_CAKES`]
//!   of its share under one CAKE diffserv4 at the root: the voice tin's
//!   quarter must hold across queues.
//!
//! Beside each, in the same testbed, the anchors: `mq` with one CAKE per
//! queue at rate / queues (`State::CakeSplit`), the split that one shaper
//! per queue makes, and one CAKE at the root (sqm-scripts' setup: one
//! qdisc lock for every queue, besteffort, its default triple-isolate);
//! their figures are printed, and CAKE's lone flow sets case (a)'s bar. A
//! case that misses is measured once more; two misses fail.
//!
//! Needs sch_fq, sch_cake and sch_netem (the VM's kernels); elsewhere it
//! skips with a reason, and under `SHAPER_REQUIRE_FULL_KERNEL=1` a skip
//! fails. The steering needs cls_flower and act_skbedit as well, which
//! every kernel with those qdiscs here has; without them the test fails
//! with tc's message.
//!
//! On Linux ≥ 7.0 upstream cake_mq at the same rate runs beside them
//! (`State::CakeMq`, with diffserv4 in case (e)), printed likewise.
//!
//! Senders are never pinned to CPUs. Not covered: more vCPUs than the
//! VM's two.

use shaper::{
    lab::{
        FlowSpec, Host, RunResult, State, Testbed, TestbedOptions,
        multiqueue::{self as mq, MqCase, Rule, most},
    },
    rate::Rate,
};
use shaper_tests::{
    skip::require,
    topo::shaper_bin,
    vs_cake::{self, OMIT, Verdict, again_if_missed, report, verdict},
};

const RATE: &str = "50mbit";
/// TX queues of the WAN device.
const QUEUES: u32 = 4;
/// Case (a): how far a lone flow's goodput ratio may trail one CAKE's at
/// the root.
const LONE_SLACK: f64 = 0.02;
/// Case (b): the most any 1 s interval may carry, of the rate.
const SUM_BOUND: f64 = 1.02;
/// Case (b): the least any flow may get, of an equal share.
const FLOW_SHARE: f64 = 0.8;
/// Case (c): Jain's index over the 9 flows.
const JAIN_BAR: f64 = 0.95;

fn rate() -> Rate {
    RATE.parse().expect("a valid rate")
}

/// Runs `flows` under `state` with the clients steered by `rules`.
fn run(tb: &Testbed, state: State, flows: Vec<FlowSpec>, rules: &[Rule]) -> RunResult {
    let name = state.name();
    let t = std::time::Instant::now();
    let r = mq::run_steered(tb, state, flows, rules, vs_cake::timing(OMIT))
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    eprintln!("    {} ({:.1} s)", r.summary(), t.elapsed().as_secs_f64());
    r
}

fn shaper() -> State {
    State::Shaper {
        bin: shaper_bin(),
        rate: rate(),
        extra_args: Vec::new(),
    }
}

fn cake() -> State {
    State::Cake { rate: rate() }
}

fn split() -> State {
    State::CakeSplit {
        rate: rate(),
        queues: QUEUES,
        tins: "besteffort",
    }
}

/// Upstream cake_mq where the kernel has it (Linux ≥ 7.0; this Debian's
/// `tc` cannot configure it, the lab sends the request itself).
fn cake_mq(tins: &'static str) -> Option<State> {
    shaper::lab::cake_mq::kernel_has().then(|| State::CakeMq { rate: rate(), tins })
}

/// cake_mq's figures for a case, where the kernel has it: `describe` of
/// its run, or nothing.
fn with_cake_mq(
    tb: &Testbed,
    flows: Vec<FlowSpec>,
    rules: &[Rule],
    describe: impl Fn(&RunResult) -> String,
) -> String {
    cake_mq("besteffort")
        .map(|s| format!("; cake_mq {}", describe(&run(tb, s, flows, rules))))
        .unwrap_or_default()
}

fn streams(r: &RunResult) -> Vec<f64> {
    mq::stream_bps(r)
}

fn mbit(v: &[f64]) -> String {
    v.iter()
        .map(|b| format!("{:.1}", b / 1e6))
        .collect::<Vec<_>>()
        .join(" ")
}

fn case_a(tb: &Testbed) -> Verdict {
    let rules = MqCase::Lone.steering();
    let flows = || MqCase::Lone.flows();
    let anchor = run(tb, split(), flows(), &rules);
    let mq = with_cake_mq(tb, flows(), &rules, |r| format!("{:.3}", r.ratio(rate())));
    let round = || {
        let root = run(tb, cake(), flows(), &rules).ratio(rate());
        let ours = run(tb, shaper(), flows(), &rules);
        let g = ours.ratio(rate());
        let floor = root - LONE_SLACK;
        verdict(
            g >= floor,
            format!(
                "(a) one flow on queue 2: shaper goodput {g:.3} of the rate (needs ≥ {floor:.3}); \
                 one CAKE at the root {root:.3}; a CAKE per queue {:.3}{mq}",
                anchor.ratio(rate())
            ),
        )
    };
    again_if_missed(round(), round)
}

fn interval_ratios(r: &RunResult) -> Vec<f64> {
    mq::interval_ratios(r, rate())
}

fn fractions(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn case_b(tb: &Testbed) -> Verdict {
    let flows = || MqCase::Spread.flows();
    let anchor = run(tb, split(), flows(), &[]);
    let mq = with_cake_mq(tb, flows(), &[], |r| {
        format!(
            "{:.3}, each 1 s {}, Mbit/s {}",
            r.ratio(rate()),
            fractions(&interval_ratios(r)),
            mbit(&streams(r))
        )
    });
    let round = || {
        let root = interval_ratios(&run(tb, cake(), flows(), &[]));
        let ours = run(tb, shaper(), flows(), &[]);
        let s = streams(&ours);
        let least = mq::least_share(&s);
        let seconds = interval_ratios(&ours);
        verdict(
            s.len() == 8 && least >= FLOW_SHARE && most(&seconds) <= SUM_BOUND,
            format!(
                "(b) 8 flows hashed over {QUEUES} queues: shaper goodput {:.3}, each 1 s {} of \
                 the rate (needs ≤ {SUM_BOUND}), least flow {least:.2} of an equal share (needs \
                 ≥ {FLOW_SHARE}), Mbit/s {}; one CAKE at the root, each 1 s {}; a CAKE per queue \
                 {:.3}, Mbit/s {}{mq}",
                ours.ratio(rate()),
                fractions(&seconds),
                mbit(&s),
                fractions(&root),
                anchor.ratio(rate()),
                mbit(&streams(&anchor)),
            ),
        )
    };
    again_if_missed(round(), round)
}

fn case_c(tb: &Testbed) -> Verdict {
    let rules = MqCase::OneBeside8.steering();
    let flows = || MqCase::OneBeside8.flows();
    let anchor = run(tb, split(), flows(), &rules);
    let mq = with_cake_mq(tb, flows(), &rules, |r| {
        let s = streams(r);
        format!(
            "Jain {:.3}, goodput {:.3}, Mbit/s {}",
            jain(&s),
            r.ratio(rate()),
            mbit(&s)
        )
    });
    let round = || {
        let root = run(tb, cake(), flows(), &rules);
        let ours = run(tb, shaper(), flows(), &rules);
        let s = streams(&ours);
        let j = jain(&s);
        let a = streams(&anchor);
        verdict(
            s.len() == 9 && j >= JAIN_BAR,
            format!(
                "(c) 1 flow on queue 0, 8 on queue 1: shaper Jain {j:.3} over 9 flows (needs ≥ \
                 {JAIN_BAR}), goodput {:.3}, Mbit/s {}; one CAKE at the root Jain {:.3}, \
                 goodput {:.3}; a CAKE per queue Jain {:.3}, goodput {:.3}, Mbit/s {}{mq}",
                ours.ratio(rate()),
                mbit(&s),
                jain(&streams(&root)),
                root.ratio(rate()),
                jain(&a),
                anchor.ratio(rate()),
                mbit(&a),
            ),
        )
    };
    again_if_missed(round(), round)
}

/// Case (d): cases (a) to (c) with RPS on at the router and every flow on
/// the queue its hash picks, and (c) hashed with RPS off.
fn case_d(tb: &Testbed) -> Verdict {
    let rps = |on| mq::set_rps(tb, on).expect("set the router's rps_cpus");
    let hashed = |state: State, case: MqCase| run(tb, state, case.flows(), &[]);
    let mask = rps(true);
    let split_c = hashed(split(), MqCase::OneBeside8);
    let mq_c = cake_mq("besteffort")
        .map(|s| {
            format!(
                "; cake_mq Jain {:.3}",
                jain(&streams(&hashed(s, MqCase::OneBeside8)))
            )
        })
        .unwrap_or_default();
    rps(false);
    let round = || {
        rps(true);
        let handoffs = mq::rps_handoffs().expect("read softnet_stat");
        let root = hashed(cake(), MqCase::Lone).ratio(rate());
        let f = mq::measure(tb, &shaper(), rate(), vs_cake::timing(OMIT), false)
            .unwrap_or_else(|e| panic!("shaper: {e:#}"));
        let handoffs = mq::rps_handoffs().expect("read softnet_stat") - handoffs;
        rps(false);
        let off = jain(&streams(&hashed(shaper(), MqCase::OneBeside8)));
        let floor = root - LONE_SLACK;
        verdict(
            handoffs > 0
                && f.single_flow_ratio >= floor
                && f.sum_ratio_max_1s <= SUM_BOUND
                && f.min_flow_share_ratio >= FLOW_SHARE
                && f.jain_1v8 >= JAIN_BAR
                && off >= JAIN_BAR,
            format!(
                "(d) RPS on (rps_cpus {mask:x}, {handoffs} packets handed to another CPU, needs \
                 > 0), nothing steered: shaper (a) {:.3} (needs ≥ {floor:.3}; one CAKE at the \
                 root {root:.3}), (b) most 1 s {:.3} (needs ≤ {SUM_BOUND}) and least flow {:.2} \
                 (needs ≥ {FLOW_SHARE}), (c) Jain {:.3} (needs ≥ {JAIN_BAR}); RPS off, nothing \
                 steered, (c) Jain {off:.3} (needs ≥ {JAIN_BAR}); with RPS on, (c) under a CAKE \
                 per queue Jain {:.3}{mq_c}",
                f.single_flow_ratio,
                f.sum_ratio_max_1s,
                f.min_flow_share_ratio,
                f.jain_1v8,
                jain(&streams(&split_c)),
            ),
        )
    };
    again_if_missed(round(), round)
}

fn jain(v: &[f64]) -> f64 {
    shaper::lab::stats::jain(v).unwrap_or(0.0)
}

/// Case (e): the EF flow's share may trail one CAKE diffserv4's at the
/// root by this factor.
const EF_SHARE_OF_CAKES: f64 = 0.95;

fn case_e(tb: &Testbed) -> Verdict {
    let rules = [(Host::Client, 2)];
    let flows = shaper::lab::diffserv::ef_bulk_flows;
    let mq = cake_mq("diffserv4")
        .map(|s| {
            format!(
                "; cake_mq diffserv4 {:.3}",
                run(tb, s, flows(), &rules).part(0)
            )
        })
        .unwrap_or_default();
    let round = || {
        let root = run(tb, State::cake_tins(rate(), "diffserv4"), flows(), &rules);
        let ours = run(
            tb,
            State::Shaper {
                bin: shaper_bin(),
                rate: rate(),
                extra_args: vec!["--diffserv".to_owned(), "diffserv4".to_owned()],
            },
            flows(),
            &rules,
        );
        let (s, c) = (ours.part(0), root.part(0));
        let bar = EF_SHARE_OF_CAKES * c;
        verdict(
            s >= bar,
            format!(
                "(e) an EF bulk flow on queue 2, 16 best-effort flows hashed over {QUEUES} \
                 queues, diffserv4: shaper EF share {s:.3} (needs ≥ {bar:.3}), goodput {:.3}; \
                 one CAKE diffserv4 at the root {c:.3}{mq}",
                ours.ratio(rate())
            ),
        )
    };
    again_if_missed(round(), round)
}

#[test]
fn one_rate_and_one_fairness_across_tx_queues() {
    if !require(vs_cake::NEEDS) {
        return;
    }
    let tb = vs_cake::testbed(TestbedOptions {
        wan_queues: QUEUES,
        ..TestbedOptions::default()
    });
    eprintln!(
        "uploads at {RATE}, wan0 with {QUEUES} TX queues, {:?} measured:",
        vs_cake::timing(OMIT)
    );
    let started = std::time::Instant::now();
    let results = vec![
        case_a(&tb),
        case_b(&tb),
        case_c(&tb),
        case_d(&tb),
        case_e(&tb),
    ];
    eprintln!("({:.0} s)", started.elapsed().as_secs_f64());
    report(&results);
}
