//! Work conservation beside CAKE: the traffic users have, not a few equal
//! bulk streams. Cases of `shaper::lab::cases` on one lab testbed (client →
//! router → server, 50 Mbit/s, 20 ms RTT), each under CAKE and under the
//! shaper (each state applied once for every case that runs under it,
//! `vs_cake::run_cases`), the shaper held against CAKE's figure of the
//! same round:
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
//! A case that misses is measured once more, its states applied for it
//! alone, and two misses fail. Needs
//! sch_fq, sch_cake and sch_netem (the VM's kernels); elsewhere it skips
//! with a reason, and under `SHAPER_REQUIRE_FULL_KERNEL=1` a skip fails.
//!
//! Environment: `SHAPER_BIN` (the shaper binary), `SHAPER_VM_TEST_SECS`
//! (see `shaper_tests::vs_cake`).

use std::{rc::Rc, time::Duration};

use shaper::{
    lab::{
        RunResult, State, Testbed, TestbedOptions, Timing,
        cases::{self, Case},
    },
    rate::Rate,
};
use shaper_tests::{
    skip::require,
    topo::shaper_bin,
    vs_cake::{self, OMIT, Verdict, again_if_missed, report, verdict},
};

/// Slack of a lone flow's goodput ratio below CAKE's.
const LONE_SLACK: f64 = 0.15;
/// The same for the download through the policer, which carries a lone
/// flow's sawtooth without a queue, and so less than CAKE's queue carries
/// (docs/ingress.md, "What a policer can give one flow").
const POLICE_SLACK: f64 = 0.25;
/// The lone-flow cases held here, one per code path, each with its slack.
const LONE_CASES: [(&str, f64); 4] = [
    ("tcp_fwd", LONE_SLACK),
    ("tcp_local", LONE_SLACK),
    ("down_police", POLICE_SLACK),
    ("down_ifb", LONE_SLACK),
];
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
/// The warm-up left out of the lone-flow cases: at 20 ms RTT a lone flow's
/// slow start and the recovery from its first losses end within it, under
/// CAKE and the shaper alike. The many-flow cases keep [`OMIT`]: hundreds
/// of streams take seconds to connect, and their wire rate needs the
/// longer busy span.
const LONE_OMIT: Duration = Duration::from_secs(1);
/// Flows of the many-flow cases.
const MANY: [u32; 2] = [64, 256];

fn rate() -> Rate {
    "50mbit".parse().expect("a valid rate")
}

/// What a case is held to.
#[derive(Clone, Copy, Debug)]
enum Check {
    /// A lone flow: its goodput ratio at most this far below CAKE's.
    Lone(f64),
    /// The bulk flow beside sparse ones.
    BesideSparse,
    /// Many flows: the wire rate, and the goodput where one client measured
    /// it.
    Many,
}

impl Check {
    /// The case's timing: [`OMIT`] for many flows, [`LONE_OMIT`] else.
    fn timing(self) -> Timing {
        vs_cake::timing(match self {
            Check::Many => OMIT,
            Check::Lone(_) | Check::BesideSparse => LONE_OMIT,
        })
    }
}

/// Judges `case`'s first round with `verdict_of`; when that misses, runs
/// CAKE then the shaper on it once more at `check`'s timing, each applied
/// for that round alone.
fn judge(
    tb: &Testbed,
    case: &Case,
    check: Check,
    first: &(Rc<RunResult>, Rc<RunResult>),
    verdict_of: impl Fn(&RunResult, &RunResult) -> Verdict,
) -> Verdict {
    let timing = check.timing();
    let run = |state: &State| vs_cake::run(tb, &case.scenario(state.clone(), timing));
    again_if_missed(verdict_of(&first.0, &first.1), || {
        eprintln!("{} again:", case.name);
        verdict_of(&run(&case.cake), &run(&case.shaper))
    })
}

fn lone_flow(
    tb: &Testbed,
    case: &Case,
    slack: f64,
    first: &(Rc<RunResult>, Rc<RunResult>),
    r: Rate,
) -> Verdict {
    judge(tb, case, Check::Lone(slack), first, |cake, ours| {
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

fn bulk_beside_sparse(
    tb: &Testbed,
    case: &Case,
    first: &(Rc<RunResult>, Rc<RunResult>),
    r: Rate,
) -> Verdict {
    judge(tb, case, Check::BesideSparse, first, |cake, ours| {
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

fn many_flows(
    tb: &Testbed,
    case: &Case,
    first: &(Rc<RunResult>, Rc<RunResult>),
    r: Rate,
) -> Verdict {
    // The goodput is judged where one iperf3 client measured it all.
    let judged = case.flows.len() == 1;
    judge(tb, case, Check::Many, first, |cake, ours| {
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
    let lone = LONE_CASES.iter().map(|&(name, slack)| {
        let case = all
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no lone-flow case {name} in shaper::lab::cases"));
        (case, Check::Lone(slack))
    });
    let sparse = cases::bulk_beside_sparse(&bin, r);
    let many: Vec<Case> = MANY
        .iter()
        .map(|&n| cases::many_flows(&bin, r, n))
        .collect();
    let every: Vec<(&Case, Check)> = lone
        .chain([(&sparse, Check::BesideSparse)])
        .chain(many.iter().map(|c| (c, Check::Many)))
        .collect();
    let timed: Vec<(&Case, Timing)> = every.iter().map(|&(c, k)| (c, k.timing())).collect();
    let firsts = vs_cake::run_cases(&tb, &timed);
    let results: Vec<Verdict> = every
        .iter()
        .zip(&firsts)
        .map(|(&(case, check), first)| match check {
            Check::Lone(slack) => lone_flow(&tb, case, slack, first, r),
            Check::BesideSparse => bulk_beside_sparse(&tb, case, first, r),
            Check::Many => many_flows(&tb, case, first, r),
        })
        .collect();
    report(&results);
}
