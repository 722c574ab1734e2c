//! DiffServ tins against CAKE's in the same run, `diffserv4` on both,
//! uploads at 50 Mbit/s over the lab testbed (20 ms RTT), 16 best-effort
//! bulk flows from the second client in each case:
//! - **EF bulk:** one bulk TCP flow marked EF (TOS 0xb8) from the client.
//!   The voice tin holds a quarter of the rate before best effort: CAKE
//!   gives the flow about that, where one fair share of 17 would be under
//!   6%. The bar: the shaper's EF share (of what all flows carried) is at
//!   least [`SHARE_OF_CAKES`] of CAKE's. The shaper without tins runs
//!   beside them, printed, so the gap the tins close is on record. And
//!   `shaper status --json`, read after the run, must count at least
//!   [`VOICE_BYTES_SHARE`] of the bytes in the voice tin: the tins'
//!   counters, pins and status, end to end.
//! - **EF voice:** a 1 Mbit/s UDP flow of 200-byte datagrams and a ping
//!   every 20 ms, both marked EF, from the client. The bars: the pings'
//!   p99 at most [`VOICE_P99_FACTOR`] × CAKE's, and the UDP flow's loss at
//!   most CAKE's + [`VOICE_LOSS_SLACK_PCT`].
//!
//! A case that misses is measured once more; two misses fail.
//!
//! Needs sch_fq, sch_cake and sch_netem (the VM's kernels); elsewhere it
//! skips with a reason, and under `SHAPER_REQUIRE_FULL_KERNEL=1` a skip
//! fails.
//!
//! Not covered here: latency of an EF voice flow beside bulk, the tins
//! over several TX queues, and the policer (which has one tin).

use shaper::{
    lab::{
        RunResult, Scenario, State, Testbed, TestbedOptions, TinStats,
        diffserv::{BEST_EFFORT_STREAMS, ef_bulk_flows, voice_figures, voice_scenario},
    },
    rate::Rate,
};
use shaper_tests::{
    skip::require,
    topo::shaper_bin,
    vs_cake::{self, OMIT, PING_EVERY, Verdict, again_if_missed, report, verdict},
};

const RATE: &str = "50mbit";
/// The least share of CAKE's the shaper's EF flow may get.
const SHARE_OF_CAKES: f64 = 0.95;
/// The least part of the bytes `shaper status` counts in the voice tin
/// with the EF bulk flow: its traffic, seen through the pinned counters,
/// in the tin the flow's DSCP names (a quarter less the slack of TCP's
/// share over a run).
const VOICE_BYTES_SHARE: f64 = 0.2;
/// The EF pings' p99 may be this multiple of CAKE's.
const VOICE_P99_FACTOR: f64 = 1.2;
/// The EF UDP flow's loss may exceed CAKE's by this much, percent.
const VOICE_LOSS_SLACK_PCT: f64 = 0.5;

fn rate() -> Rate {
    RATE.parse().expect("a valid rate")
}

/// diffserv4's voice tin.
const VOICE: usize = 3;

/// The voice tin's part of the bytes every tin counted, as `shaper
/// status --json` reports them after the run; 0 when it has none.
fn voice_bytes_share(r: &RunResult) -> f64 {
    let tins = r
        .counters
        .as_ref()
        .map(TinStats::from_counters)
        .unwrap_or_default();
    let all: u64 = tins.iter().map(|t| t.bytes).sum();
    let voice = tins.iter().find(|t| t.tin == VOICE).map_or(0, |t| t.bytes);
    if all > 0 {
        voice as f64 / all as f64
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

fn cake() -> State {
    State::cake_tins(rate(), "diffserv4")
}

fn ef_bulk(tb: &Testbed) -> Verdict {
    let run = |state: State| {
        vs_cake::run(
            tb,
            &Scenario::new(state, ef_bulk_flows(), vs_cake::timing(OMIT)),
        )
    };
    let plain = run(shaper(&[]));
    let round = || {
        let cake = run(cake());
        let ours = run(shaper(&["--diffserv", "diffserv4"]));
        let (s, c) = (ours.part(0), cake.part(0));
        let bar = SHARE_OF_CAKES * c;
        let counted = voice_bytes_share(&ours);
        verdict(
            s >= bar && counted >= VOICE_BYTES_SHARE,
            format!(
                "EF bulk beside {BEST_EFFORT_STREAMS} best-effort streams: shaper diffserv4 EF \
                 share {s:.3} (needs ≥ {bar:.3}), goodput {:.3}, the voice tin's bytes in \
                 `shaper status` {counted:.3} of all (needs ≥ {VOICE_BYTES_SHARE}); CAKE \
                 diffserv4 {c:.3}, goodput {:.3}; shaper without tins {:.3}",
                ours.ratio(rate()),
                cake.ratio(rate()),
                plain.part(0)
            ),
        )
    };
    again_if_missed(round(), round)
}

/// The EF voice flow's ping p99 (ms) and UDP loss (percent).
fn voice(tb: &Testbed, state: State) -> (f64, f64, RunResult) {
    let r = vs_cake::run(
        tb,
        &voice_scenario(state, vs_cake::timing(OMIT), PING_EVERY),
    );
    let (p99, loss) = voice_figures(&r);
    (p99, loss, r)
}

fn ef_voice(tb: &Testbed) -> Verdict {
    let round = || {
        let (cp99, closs, _) = voice(tb, cake());
        let (p99, loss, ours) = voice(tb, shaper(&["--diffserv", "diffserv4"]));
        let (p99_bar, loss_bar) = (VOICE_P99_FACTOR * cp99, closs + VOICE_LOSS_SLACK_PCT);
        verdict(
            p99 <= p99_bar && loss <= loss_bar,
            format!(
                "EF voice beside {BEST_EFFORT_STREAMS} best-effort streams: shaper diffserv4 \
                 ping p99 {p99:.1} ms (needs ≤ {p99_bar:.1}), UDP loss {loss:.2}% (needs ≤ \
                 {loss_bar:.2}), goodput {:.3}; CAKE diffserv4 p99 {cp99:.1} ms, loss {closs:.2}%",
                ours.ratio(rate())
            ),
        )
    };
    again_if_missed(round(), round)
}

#[test]
fn ef_traffic_gets_its_tin_as_under_cake_diffserv4() {
    if !require(vs_cake::NEEDS) {
        return;
    }
    let tb = vs_cake::testbed(TestbedOptions::default());
    report(&[ef_bulk(&tb), ef_voice(&tb)]);
}
