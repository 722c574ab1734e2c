//! Work conservation beside CAKE: the traffic users have, not a few equal
//! bulk streams. Cases of `shaper::lab::cases` on one lab testbed (client →
//! router → server, 50 Mbit/s, 20 ms RTT), each under CAKE and then the
//! shaper, the shaper held against CAKE's figure of the same round:
//! - a lone flow beside a 10 pps ping, one case per code path a lone flow
//!   takes: forwarded TCP (the egress pacer), TCP sent by the router itself
//!   (the pacer beside the local stack's own timestamps), a download through
//!   the policer and one through the pacer on an IFB. Its goodput ratio is
//!   at least CAKE's less [`LONE_SLACK`] ([`POLICE_SLACK`] for the
//!   policer);
//! - one bulk flow beside 20 sparse UDP flows: the bulk flow likewise, and
//!   the sparse flows lose no datagram;
//! - 64 and 256 flows ([`MANY`]): the shaper's wire rate (the WAN root
//!   qdisc's bytes while the flows send, `cases::wire_ratio`) is at most
//!   [`WIRE_BOUND`] × the rate. With 64 flows its goodput is also at most
//!   [`MANY_SLACK`] above CAKE's or, when a starved VM holds CAKE below it,
//!   above [`TCP_MAX_GOODPUT`]. With 256 the goodput is printed, not
//!   judged: the flows come from two iperf3 clients (128 streams each at
//!   most), each measuring over its own window from its own start, which
//!   differ by seconds under emulation, so the sum of their goodputs can
//!   exceed what the link carried (docs/pacer.md, "Counting the wire").
//!
//! The lone-flow floors catch a share logic that divides the rate (the
//! defect this file was written for left every lone flow about a third of
//! the rate while CAKE carried nearly all of it). They are not the target,
//! CAKE's figure, which `cargo xtask bench` reports per case as medians
//! (`vm.lone_flow`), with the cases left out here (bbr and UDP above the
//! rate take the forwarded path that `tcp_fwd` holds): under emulation one
//! run varies by more than the target's margin.
//!
//! A case that misses is measured once more, and two misses fail. Needs
//! sch_fq, sch_cake and sch_netem (the VM's kernels); elsewhere it skips
//! with a reason, and under `SHAPER_REQUIRE_FULL_KERNEL=1` a skip fails.
//!
//! Environment: `SHAPER_BIN` (the shaper binary), `SHAPER_VM_TEST_SECS`
//! (see `shaper_tests::vs_cake`).

use shaper::{
    lab::{
        RunResult, State, Testbed, TestbedOptions,
        cases::{self, Case},
    },
    rate::Rate,
};
use shaper_tests::{
    skip::require,
    topo::shaper_bin,
    vs_cake::{self, OMIT, Verdict, report, twice, verdict},
};

/// The lone-flow cases held here, one per code path.
const LONE_CASES: [&str; 4] = ["tcp_fwd", "tcp_local", "down_police", "down_ifb"];
/// Slack of a lone flow's goodput ratio below CAKE's.
const LONE_SLACK: f64 = 0.15;
/// The same for the download through the policer, which trails CAKE's
/// goodput with four flows already (docs/ingress.md) and further with one
/// (docs/pacer.md).
const POLICE_SLACK: f64 = 0.25;
/// Slack of the many-flow goodput ratio above CAKE's.
const MANY_SLACK: f64 = 0.03;
/// The most TCP goodput a shaper at the rate can let through, as a ratio:
/// the payload of a full-sized segment with timestamps over the frame the
/// shaper counts. Goodput above it means more than the rate left the
/// router.
const TCP_MAX_GOODPUT: f64 = 1448.0 / 1514.0;
/// The wire rate's bound with many flows, as a multiple of the rate: a
/// shaper more than 2% over its rate moves the queue back into the modem.
const WIRE_BOUND: f64 = 1.02;
/// Flows of the many-flow cases.
const MANY: [u32; 2] = [64, 256];

fn rate() -> Rate {
    "50mbit".parse().expect("a valid rate")
}

fn run(tb: &Testbed, case: &Case, state: &State) -> RunResult {
    vs_cake::run(tb, &case.scenario(state.clone(), vs_cake::timing(OMIT)))
}

/// Runs CAKE then the shaper on `case` and judges them with `check`; once
/// more if that misses.
fn judge(tb: &Testbed, case: &Case, check: impl Fn(&RunResult, &RunResult) -> Verdict) -> Verdict {
    eprintln!("{}:", case.name);
    twice(|| check(&run(tb, case, &case.cake), &run(tb, case, &case.shaper)))
}

fn lone_flow(tb: &Testbed, case: &Case, r: Rate) -> Verdict {
    let slack = if case.name == "down_police" {
        POLICE_SLACK
    } else {
        LONE_SLACK
    };
    judge(tb, case, |cake, ours| {
        let (c, s) = (cases::first_ratio(cake, r), cases::first_ratio(ours, r));
        verdict(
            s >= c - slack,
            format!(
                "{}: shaper {s:.3} of the rate, CAKE {c:.3} (floor: CAKE's - {slack})",
                case.name
            ),
        )
    })
}

fn bulk_beside_sparse(tb: &Testbed, case: &Case, r: Rate) -> Verdict {
    judge(tb, case, |cake, ours| {
        let (cb, sb) = (cases::first_ratio(cake, r), cases::first_ratio(ours, r));
        let loss = |x: &RunResult| x.flows[1].report.lost_percent;
        let (cl, sl) = (loss(cake), loss(ours));
        verdict(
            sb >= cb - LONE_SLACK && sl == 0.0,
            format!(
                "{}: bulk shaper {sb:.3}, CAKE {cb:.3} (floor: CAKE's - {LONE_SLACK}); sparse \
                 loss shaper {sl:.2}%, CAKE {cl:.2}% (needs 0)",
                case.name
            ),
        )
    })
}

fn many_flows(tb: &Testbed, case: &Case, r: Rate) -> Verdict {
    // The goodput is judged where one iperf3 client measured it all.
    let judged = case.flows.len() == 1;
    judge(tb, case, |cake, ours| {
        let (c, s) = (cake.ratio(r), ours.ratio(r));
        let ceiling = c.max(TCP_MAX_GOODPUT) + MANY_SLACK;
        let wire = |x: &RunResult| cases::wire_ratio(x, r);
        let line = format!(
            "{}: shaper goodput {s:.3}, wire {}; CAKE goodput {c:.3}, wire {} (needs wire ≤ \
             {WIRE_BOUND}{})",
            case.name,
            wire(ours).map_or("unknown".to_owned(), |w| format!("{w:.3}")),
            wire(cake).map_or("unknown".to_owned(), |w| format!("{w:.3}")),
            if judged {
                format!(", goodput ≤ {ceiling:.3}")
            } else {
                "; goodput over two clients' windows, not judged".to_owned()
            },
        );
        verdict(
            wire(ours).is_some_and(|w| w <= WIRE_BOUND) && (!judged || s <= ceiling),
            line,
        )
    })
}

#[test]
fn lone_flows_get_the_rate_and_many_flows_keep_to_it() {
    if !require(vs_cake::NEEDS) {
        return;
    }
    let tb = vs_cake::testbed(TestbedOptions::default());
    let (bin, r) = (shaper_bin(), rate());
    let all = cases::lone_flow(&bin, r);
    let mut results: Vec<Verdict> = LONE_CASES
        .iter()
        .map(|name| {
            let case = all
                .iter()
                .find(|c| c.name == *name)
                .unwrap_or_else(|| panic!("no lone-flow case {name} in shaper::lab::cases"));
            lone_flow(&tb, case, r)
        })
        .collect();
    results.push(bulk_beside_sparse(
        &tb,
        &cases::bulk_beside_sparse(&bin, r),
        r,
    ));
    results.extend(
        MANY.iter()
            .map(|&n| many_flows(&tb, &cases::many_flows(&bin, r, n), r)),
    );
    report(&results);
}
