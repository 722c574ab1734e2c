//! DiffServ tins against CAKE's in the same run: one bulk TCP flow marked
//! EF (TOS 0xb8) from the client beside 16 best-effort flows from the
//! second client, uploads at 50 Mbit/s over the lab testbed (20 ms RTT).
//! In `diffserv4` the EF flow is in the voice tin, which holds a quarter
//! of the rate before best effort: CAKE gives it about that, where one
//! fair share of 17 would be under 6%.
//!
//! The bar: the shaper's EF share (of what all flows carried) is at least
//! [`SHARE_OF_CAKES`] of CAKE `diffserv4`'s in the same run. The shaper
//! without tins runs beside them, printed, so the gap the tins close is
//! on record. A miss is measured once more; two misses fail.
//!
//! Needs sch_fq, sch_cake and sch_netem (the VM's kernels); elsewhere it
//! skips with a reason, and under `SHAPER_REQUIRE_FULL_KERNEL=1` a skip
//! fails.
//!
//! Not covered here: latency of an EF voice flow beside bulk, the tins
//! over several TX queues, and the policer (which has one tin).

use shaper::{
    lab::{FlowSpec, Host, RunResult, Scenario, State, TestbedOptions},
    rate::Rate,
};
use shaper_tests::{
    skip::require,
    topo::shaper_bin,
    vs_cake::{self, OMIT, again_if_missed, report, verdict},
};

const RATE: &str = "50mbit";
/// The TOS byte of DSCP EF (46 << 2).
const EF_TOS: u8 = 0xb8;
/// Best-effort streams beside the EF flow.
const BEST_EFFORT_STREAMS: u32 = 16;
/// The least share of CAKE's the shaper's EF flow may get.
const SHARE_OF_CAKES: f64 = 0.95;

fn rate() -> Rate {
    RATE.parse().expect("a valid rate")
}

fn flows() -> Vec<FlowSpec> {
    vec![
        FlowSpec::tcp(Host::Client, 1).with_tos(EF_TOS),
        FlowSpec::tcp(Host::Client2, BEST_EFFORT_STREAMS),
    ]
}

/// The EF flow's part of what every flow carried.
fn ef_share(r: &RunResult) -> f64 {
    let ef = r.flows.first().map_or(0.0, |f| f.report.receiver_bps);
    if r.total_bps > 0.0 {
        ef / r.total_bps
    } else {
        0.0
    }
}

fn shaper(args: &[&str]) -> State {
    State::Shaper {
        bin: shaper_bin(),
        rate: rate(),
        extra_args: args.iter().map(|a| (*a).to_owned()).collect(),
    }
}

#[test]
fn an_ef_bulk_flow_gets_its_tins_share_as_under_cake_diffserv4() {
    if !require(vs_cake::NEEDS) {
        return;
    }
    let tb = vs_cake::testbed(TestbedOptions::default());
    let run =
        |state: State| vs_cake::run(&tb, &Scenario::new(state, flows(), vs_cake::timing(OMIT)));
    let plain = run(shaper(&[]));
    let round = || {
        let cake = run(State::CakeTins {
            rate: rate(),
            diffserv: "diffserv4",
        });
        let ours = run(shaper(&["--diffserv", "diffserv4"]));
        let (s, c) = (ef_share(&ours), ef_share(&cake));
        let bar = SHARE_OF_CAKES * c;
        verdict(
            s >= bar,
            format!(
                "EF bulk beside {BEST_EFFORT_STREAMS} best-effort streams: shaper diffserv4 EF \
                 share {s:.3} (needs ≥ {bar:.3}), goodput {:.3}; CAKE diffserv4 {c:.3}, goodput \
                 {:.3}; shaper without tins {:.3}",
                ours.ratio(rate()),
                cake.ratio(rate()),
                ef_share(&plain)
            ),
        )
    };
    report(&[again_if_missed(round(), round)]);
}
