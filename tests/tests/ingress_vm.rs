//! Download shaping at the router's WAN ingress, in the lab topology (VM:
//! the host lacks cake and netem; elsewhere this skips with the reason, and
//! under `SHAPER_REQUIRE_FULL_KERNEL=1` a skip fails).
//!
//! The server sends 4 TCP flows to the client through an emulated access
//! link (TBF at 22 Mbit/s with a 200 ms FIFO, the ISP's bloated buffer),
//! while the client pings the server. On the router's `wan0` ingress, in
//! turn: CAKE in `ingress` mode on an IFB at 20 Mbit/s (sqm-scripts'
//! setup), `shaper run --ingress-rate 20mbit --ingress-mode police` (the
//! AQM policer), and the same with `--ingress-mode ifb` (the fair pacer on
//! an IFB, the default mode). One testbed,
//! at 20 ms and then at 80 ms path RTT (netem on the server), each run
//! measured over at least [`MEASURED_RTTS`] round trips.
//!
//! Must hold at each RTT for each mode, in one of two rounds, each round
//! with a CAKE-ingress run of its own (TCG timing moves single figures by a
//! few percent; a mode that passed is not measured again):
//! - both modes' goodput is at least CAKE-ingress's of the same round less
//!   [`GOODPUT_SLACK`]: a floor that catches a policer or pacer that throws
//!   the rate away; how far each trails CAKE is the benchmark's figure;
//! - the policer's ping p99 is at most [`POLICE_P99_FACTOR`] × CAKE's;
//! - `ifb` mode (fed by the BPF redirect with TCX, by tc's matchall +
//!   mirred on 6.1, see `tc::mirred`) keeps the ping p99 at or below half
//!   of what the full access-link buffer gives (its p99 at 20 ms runs above
//!   CAKE's, so the bar is the bloat it must cure).

use std::time::Duration;

use shaper::{
    lab::{FlowSpec, Host, RunResult, Scenario, State, Testbed, TestbedOptions, WanLink},
    rate::Rate,
};
use shaper_tests::{
    skip::note_retry,
    skip::require,
    topo::shaper_bin,
    vs_cake::{self, OMIT, PING_EVERY, Verdict, report, verdict},
};

const RATE: &str = "20mbit";
/// The access link: a little faster than the shaping rate, as sqm-scripts
/// advises, so the states' queue forms at the router and not in its buffer.
const LINK_BITS_PER_S: u64 = 22_000_000;
/// The access link's buffer, in drain time at its rate.
const LINK_BUFFER: Duration = Duration::from_millis(200);
/// Both modes' goodput ratio may trail CAKE-ingress's by this much: the
/// policer trails CAKE more the longer the RTT (a TCP flow recovers from
/// each drop one round trip at a time, docs/ingress.md), and a broken one
/// loses far more.
const GOODPUT_SLACK: f64 = 0.12;
/// The policer's ping p99 may be this multiple of CAKE-ingress's.
const POLICE_P99_FACTOR: f64 = 2.0;
/// The warm-up left out, in round trips: slow start and its first drops
/// settle within a few dozen (at least [`OMIT`]).
const OMIT_RTTS: u32 = 50;
/// The measured time, in round trips, at least: cubic regrows its window
/// after a cut over a fixed number of round trips (docs/ingress.md, "What a
/// policer can give one flow"), so a window of seconds fit for 20 ms holds
/// a quarter of the cycles at 80 ms, and without a queue to absorb them
/// the policer's goodput over it then swings with where the cuts fall.
const MEASURED_RTTS: u32 = 180;

fn rate() -> Rate {
    RATE.parse().expect("a valid rate")
}

fn shaper_ingress(mode: &str) -> State {
    State::ShaperIngress {
        bin: shaper_bin(),
        rate: rate(),
        extra_args: vec!["--ingress-mode".to_owned(), mode.to_owned()],
    }
}

fn p99(r: &RunResult) -> f64 {
    r.ping().map_or(f64::INFINITY, |p| p.p99)
}

/// Sets the WAN path's delay: the netem at the root of the server's `sv0`,
/// above the access link's TBF (which stays as it is).
fn set_wan_delay(tb: &Testbed, rtt: Duration) {
    let us = format!("{}us", rtt.as_micros());
    tb.ns(Host::Server)
        .tc(&[
            "qdisc", "change", "dev", "sv0", "root", "handle", "1:", "netem", "delay", &us,
            "limit", "100000",
        ])
        .expect("change the WAN delay");
}

/// One mode's verdict against CAKE-ingress of the same round.
type Judge = fn(ms: u128, cake: &RunResult, ours: &RunResult, bloated_ms: f64) -> Verdict;

/// The policer: goodput floor and p99 against CAKE-ingress's.
fn judge_police(ms: u128, cake: &RunResult, police: &RunResult, _bloated_ms: f64) -> Verdict {
    let r = rate();
    let (gc, pc) = (cake.ratio(r), p99(cake));
    let (gp, pp) = (police.ratio(r), p99(police));
    let floor = gc - GOODPUT_SLACK;
    let get = |k: &str| police.counter(k).unwrap_or(0);
    verdict(
        gp >= floor && pp <= POLICE_P99_FACTOR * pc,
        format!(
            "{ms} ms police: cake-ingress goodput {gc:.3}, p99 {pc:.1} ms; shaper-police \
             {gp:.3}, {pp:.1} ms (drops {}: codel {}, early {}, overload {}; marks {}, withheld \
             {}) (needs goodput ≥ {floor:.3}, p99 ≤ {POLICE_P99_FACTOR} × cake's)",
            get("ingress.police_drop"),
            get("ingress.police_codel_drop"),
            get("ingress.police_early_drop"),
            get("ingress.police_overload_drop"),
            get("ingress.ce_marked"),
            get("ingress.police_withheld"),
        ),
    )
}

/// ifb mode: goodput floor, and p99 at most half the bloat.
fn judge_ifb(ms: u128, cake: &RunResult, ifb: &RunResult, bloated_ms: f64) -> Verdict {
    let r = rate();
    let (gc, pc) = (cake.ratio(r), p99(cake));
    let (gi, pi) = (ifb.ratio(r), p99(ifb));
    let floor = gc - GOODPUT_SLACK;
    let get = |k: &str| ifb.counter(k).unwrap_or(0);
    verdict(
        gi >= floor && pi <= bloated_ms / 2.0,
        format!(
            "{ms} ms ifb: cake-ingress goodput {gc:.3}, p99 {pc:.1} ms; shaper-ifb {gi:.3}, \
             {pi:.1} ms (IFB drops: codel {}, overload {}, horizon {}; marks {}) (needs goodput \
             ≥ {floor:.3}, p99 ≤ {:.1} ms)",
            get("ifb.codel_drop"),
            get("ifb.overload_drop"),
            get("ifb.horizon_drop"),
            get("ifb.ce_marked"),
            bloated_ms / 2.0,
        ),
    )
}

/// One RTT: CAKE-ingress, the policer and ifb mode. Each mode is its own
/// claim, judged against CAKE-ingress of its round: a mode that misses is
/// measured once more beside a new CAKE-ingress run, and two misses fail
/// it. Returns the policer's verdict and then ifb's.
fn at_rtt(tb: &Testbed, rtt: Duration) -> Vec<Verdict> {
    set_wan_delay(tb, rtt);
    let ms = rtt.as_millis();
    let mut timing = vs_cake::timing(OMIT.max(rtt * OMIT_RTTS));
    timing.duration = timing.duration.max(Duration::from_secs(
        (rtt * MEASURED_RTTS).as_secs_f64().ceil() as u64,
    ));
    // What a full access-link buffer gives a ping: the path's RTT and the
    // buffer's drain time.
    let bloated_ms = (rtt + LINK_BUFFER).as_secs_f64() * 1e3;
    eprintln!(
        "download, 4 flows, {ms} ms RTT, access link {LINK_BITS_PER_S} bit/s with \
         {LINK_BUFFER:?} buffer, {timing:?}:"
    );
    let run = |state| {
        let flows = vec![FlowSpec::tcp(Host::Client, 4).reversed()];
        let mut s = Scenario::new(state, flows, timing).with_ping(Host::Client);
        s.ping_interval = PING_EVERY;
        vs_cake::run(tb, &s)
    };
    let modes: [(&str, Judge); 2] = [("police", judge_police), ("ifb", judge_ifb)];
    let cake = run(State::cake_ingress(rate()));
    let first: Vec<Verdict> = modes
        .iter()
        .map(|(mode, judge)| judge(ms, &cake, &run(shaper_ingress(mode)), bloated_ms))
        .collect();
    if first.iter().all(Result::is_ok) {
        return first;
    }
    let cake = run(State::cake_ingress(rate()));
    modes
        .iter()
        .zip(first)
        .map(|((mode, judge), verdict)| {
            verdict.or_else(|missed| {
                note_retry(&missed);
                judge(ms, &cake, &run(shaper_ingress(mode)), bloated_ms)
                    .map_err(|again| format!("{missed}; again: {again}"))
            })
        })
        .collect()
}

#[test]
fn police_and_ifb_keep_goodput_and_latency_at_20_and_80_ms() {
    if !require(vs_cake::NEEDS) {
        return;
    }
    let tb = vs_cake::testbed(TestbedOptions {
        client_delay: Duration::ZERO,
        client2_delay: Duration::ZERO,
        wan_delay: Duration::from_millis(20),
        wan_link: Some(WanLink {
            rate_bits_per_s: LINK_BITS_PER_S,
            buffer: LINK_BUFFER,
            stab: None,
        }),
        ..TestbedOptions::default()
    });
    let results: Vec<Verdict> = [20, 80]
        .into_iter()
        .flat_map(|ms| at_rtt(&tb, Duration::from_millis(ms)))
        .collect();
    report(&results);
}
