//! Link-layer framing against CAKE's in the same run, on the links and
//! traffic of [`shaper::lab::overhead`]: the emulated access link counts
//! each packet as a DSL or Ethernet line does (a size table on its TBFs),
//! with a deep FIFO, the router shapes at [`SHAPE_OF_LINE`] of the line's
//! rate, and 4 bulk TCP uploads run beside [`SMALL_STREAMS`] streams of
//! 64-byte UDP datagrams at [`SMALL_BITS_PER_S`] each, with ping every
//! 20 ms.
//!
//! Cases, each a link and the options that match it:
//! - **ATM** (ADSL): the link counts `overhead 40 mpu 64 linklayer atm`
//!   from the frame; the shaper `--overhead 54 --mpu 64 --atm` (the same
//!   from the IP packet: the frame's 14 bytes of Ethernet header plus 40),
//!   CAKE `overhead 54 mpu 64 atm`;
//! - **PTM** (VDSL2 with PPPoE): the link runs at 64/65 of the line's
//!   rate and counts 16 bytes more than the frame (`pppoe-ptm`'s 30 from
//!   the IP packet); the shaper `--framing pppoe-ptm`, CAKE `pppoe-ptm`;
//! - **Ethernet** with a VLAN tag: the link counts 28 bytes more than the
//!   frame, at least 84 (tag, preamble, gap and FCS); the shaper
//!   `--framing ethernet,ether-vlan`, CAKE `ethernet ether-vlan`.
//!
//! Bars: where the framing adds more than the router's margin to the
//! traffic ([`BLOAT_HELD`]: ATM, Ethernet), the shaper with no framing
//! must bloat the link, its ping p99 at least [`BLOAT_FACTOR`] × the
//! matched run's, so a framing that did nothing fails; and on ATM, where
//! framing matters most, the matched shaper's goodput (every flow's
//! together) must reach what equal shares of the rate carry
//! ([`overhead::fair_goodput`]) less [`GOODPUT_SLACK`]. It missed CAKE's
//! by 0.02–0.04 while the pacer's join step could take its multiplier past
//! the flows' number, which put it as far below the equal shares' figure.
//! A case that misses is measured once more; two misses fail.
//!
//! The rest is printed, not held:
//! - the bloat on PTM. At the unframed shaper's fair shares the links
//!   would carry 1.50 (ATM), 1.08 (Ethernet) and 1.04 (PTM) of what they
//!   can, but the bulk flows run 4–10% below their shares. That absorbs
//!   most of PTM's excess, so its queue is whatever the bulk flows'
//!   windows leave: 63–185 ms over runs, against 22–38 matched. PTM's
//!   charge per packet is held by the classifier's tests instead;
//! - the matched shaper's goodput on PTM and Ethernet, and CAKE's on
//!   every link. CAKE's moves by more than the slack from run to run (on
//!   PTM 0.712–0.793 over five runs; on ATM 0.552–0.597, above the equal
//!   shares' 0.565), so it is no bar to hold the shaper to;
//! - its p99 against [`P99_OF_CAKES`] × CAKE's, which it missed on PTM
//!   once and on Ethernet once in five runs (`docs/pacer.md`, "Link-layer
//!   framing").
//!
//! Needs sch_fq, sch_cake, sch_netem and sch_tbf (the VM's kernels);
//! elsewhere it skips with a reason, and under
//! `SHAPER_REQUIRE_FULL_KERNEL=1` a skip fails.

use shaper::lab::{
    RunResult, State, Testbed,
    overhead::{
        self, CASES, LINE_BITS_PER_S, LinkCase, SHAPE_OF_LINE, SMALL_BITS_PER_S, SMALL_STREAMS,
    },
};
use shaper_tests::{
    skip::{Need, require},
    topo::shaper_bin,
    vs_cake::{self, OMIT, PING_EVERY, Verdict, again_if_missed, report, verdict},
};

/// The matched shaper's ping p99 may be this multiple of CAKE's.
const P99_OF_CAKES: f64 = 1.2;
/// The matched shaper's goodput may trail the equal shares' by this much.
const GOODPUT_SLACK: f64 = 0.02;
/// Without framing, the p99 must be at least this multiple of the matched
/// run's.
const BLOAT_FACTOR: f64 = 3.0;

/// The links whose goodput bar holds (see the module header).
const GOODPUT_HELD: [&str; 1] = ["atm"];
/// The links whose bloat bar holds (see the module header).
const BLOAT_HELD: [&str; 2] = ["atm", "ethernet"];

/// Runs the traffic under `state`: the ping p99 (ms) and every flow's
/// goodput together as a part of the shaping rate.
fn run(tb: &Testbed, state: State) -> (f64, f64, RunResult) {
    let r = vs_cake::run(
        tb,
        &overhead::scenario(state, vs_cake::timing(OMIT), PING_EVERY),
    );
    let (p99, goodput) = overhead::figures(&r);
    (p99, goodput, r)
}

fn case(c: &LinkCase) -> Verdict {
    let tb = vs_cake::testbed(overhead::testbed_options(c));
    let hold = GOODPUT_HELD.contains(&c.name);
    let hold_bloat = BLOAT_HELD.contains(&c.name);
    let fair = overhead::fair_goodput(c).expect("the case's framing is valid");
    let round = || {
        let [(_, cake), (_, matched), (_, raw)] = overhead::states(c, &shaper_bin());
        let (cp99, cgood, _) = run(&tb, cake);
        let (p99, good, _) = run(&tb, matched);
        let (raw_p99, raw_good, _) = run(&tb, raw);
        let held = |h: bool| if h { "needs" } else { "not held:" };
        let (p99_bar, good_bar, bloat_bar) = (
            P99_OF_CAKES * cp99,
            fair - GOODPUT_SLACK,
            BLOAT_FACTOR * p99,
        );
        verdict(
            (!hold_bloat || raw_p99 >= bloat_bar) && (!hold || good >= good_bar),
            format!(
                "{}: shaper {} ping p99 {p99:.1} ms (not held: ≤ {p99_bar:.1}), goodput {good:.3} \
                 ({} ≥ {good_bar:.3}, equal shares' {fair:.3} less {GOODPUT_SLACK}); CAKE {} p99 {cp99:.1} ms, goodput {cgood:.3}; shaper \
                 without framing p99 {raw_p99:.1} ms ({} ≥ {bloat_bar:.1}), goodput \
                 {raw_good:.3}",
                c.name,
                c.framing_args().shaper_args().join(" "),
                held(hold),
                c.framing_args().cake_options().join(" "),
                held(hold_bloat),
            ),
        )
    };
    again_if_missed(round(), round)
}

#[test]
fn framing_keeps_the_links_fifo_short_as_cakes_does() {
    let needs: Vec<Need> = vs_cake::NEEDS
        .iter()
        .cloned()
        .chain([Need::Sch("tbf")])
        .collect();
    if !require(&needs) {
        return;
    }
    eprintln!(
        "uploads: 4 TCP streams, {SMALL_STREAMS} of 64-byte UDP at {SMALL_BITS_PER_S} bit/s, ping; the line at \
         {LINE_BITS_PER_S} bit/s, shaped at {SHAPE_OF_LINE} of it"
    );
    let results: Vec<Verdict> = CASES.iter().map(case).collect();
    report(&results);
}
