//! DiffServ traffic cases, shared by the VM tests and the benchmark: EF
//! traffic beside best-effort bulk flows, and what it got.
//!
//! - **EF bulk** ([`ef_bulk_flows`]): one bulk TCP flow marked EF from the
//!   client beside best-effort bulk flows from the second client. Under
//!   diffserv4 the voice tin holds a quarter of the rate with priority, so
//!   the EF flow's share ([`RunResult::part`] 0) is near a quarter, where
//!   one fair share of 17 flows is under 6%.
//! - **EF voice** ([`voice_scenario`]): a 1 Mbit/s UDP flow of 200-byte
//!   datagrams and pings, both marked EF, from the client, beside the same
//!   best-effort flows; [`voice_figures`] gives the pings' p99 and the UDP
//!   flow's loss.
//!
//! Units: TOS bytes (DSCP << 2); ms for ping; percent for loss.

use std::time::Duration;

use super::{FlowSpec, RunResult, Scenario, State, Timing, stats, topology::Host};
use crate::rate::Rate;

/// The TOS byte of DSCP EF (46 << 2).
pub const EF_TOS: u8 = 0xb8;

/// Best-effort bulk streams beside the EF traffic.
pub const BEST_EFFORT_STREAMS: u32 = 16;

/// The voice flow's rate.
const VOICE_RATE: Rate = match Rate::from_bits_per_s(1_000_000) {
    Some(r) => r,
    None => panic!("1 Mbit/s is a valid rate"),
};

/// The voice flow's datagram payload, bytes.
const VOICE_DATAGRAM_BYTES: u32 = 200;

/// One EF bulk TCP flow from the client, then [`BEST_EFFORT_STREAMS`]
/// best-effort streams from the second client.
pub fn ef_bulk_flows() -> Vec<FlowSpec> {
    vec![
        FlowSpec::tcp(Host::Client, 1).with_tos(EF_TOS),
        FlowSpec::tcp(Host::Client2, BEST_EFFORT_STREAMS),
    ]
}

/// The EF voice case under `state`: the voice flow first, pings from the
/// client every `ping_every`, both marked EF.
pub fn voice_scenario(state: State, timing: Timing, ping_every: Duration) -> Scenario {
    let voice = FlowSpec::udp(Host::Client, VOICE_RATE)
        .with_datagram_len(VOICE_DATAGRAM_BYTES)
        .with_tos(EF_TOS);
    let flows = vec![voice, FlowSpec::tcp(Host::Client2, BEST_EFFORT_STREAMS)];
    let mut s = Scenario::new(state, flows, timing).with_ping(Host::Client);
    s.ping_interval = ping_every;
    s.ping_tos = Some(EF_TOS);
    s
}

/// The voice case's EF ping p99 (ms; infinite without samples) and its UDP
/// flow's loss (percent; 100 without a report).
pub fn voice_figures(r: &RunResult) -> (f64, f64) {
    let p99 = stats::percentile(&r.ping_ms, 99.0).unwrap_or(f64::INFINITY);
    let loss = r.flows.first().map_or(100.0, |f| f.report.lost_percent);
    (p99, loss)
}
