//! Links that count packets as DSL and Ethernet lines do, and the traffic
//! that shows whether a shaper counts them the same way; shared by the VM
//! test and the benchmark.
//!
//! The access link beyond the router has a size table on its TBFs
//! (tc-stab(8); [`super::topology::LinkStab`]) and a [`LINK_BUFFER`] FIFO;
//! the line runs at [`LINE_BITS_PER_S`] and the router shapes at
//! [`SHAPE_OF_LINE`] of it. Uploads: 4 bulk TCP streams from the client,
//! [`SMALL_STREAMS`] streams of [`SMALL_BYTES`]-byte UDP datagrams at
//! [`SMALL_BITS_PER_S`] each from the second client (small packets, whose
//! framing costs the most; each above its fair share, so each is paced to
//! it), and ping from the client. GSO is off, so the link's TBF sees each
//! packet whole.
//!
//! Cases ([`CASES`]), each a link and the options that match it: ATM
//! (ADSL), PTM (VDSL2 with PPPoE), Ethernet with a VLAN tag. The size
//! table counts from the frame, which carries 14 bytes of Ethernet header;
//! the shaper's and CAKE's overheads count from the IP packet, so they are
//! the table's plus 14.
//!
//! Units: bit/s for rates; ms for ping; goodput (every flow's together)
//! as a part of the shaping rate.

use std::time::Duration;

use super::{
    FlowSpec, RunResult, Scenario, State, TestbedOptions, Timing, WanLink, stats,
    topology::{Host, LinkStab},
};
use shaper_common::framing::Framing;

use crate::{
    pacer::{FramingArgs, PacerError},
    rate::Rate,
};

/// The line's rate.
pub const LINE_BITS_PER_S: u64 = 20_000_000;
/// The router shapes at this part of the line's rate.
pub const SHAPE_OF_LINE: f64 = 0.95;
/// Streams of small datagrams.
pub const SMALL_STREAMS: u32 = 4;
/// Each small-datagram stream's rate.
pub const SMALL_BITS_PER_S: u64 = 2_000_000;
/// The small datagrams' payload.
pub const SMALL_BYTES: u32 = 64;
/// Bulk TCP streams.
pub const BULK_STREAMS: u32 = 4;
/// A bulk segment's payload in a full frame: the 1500-byte MTU less the
/// IP and TCP headers and TCP's timestamp option (20 + 20 + 12).
pub const BULK_PAYLOAD_BYTES: u32 = 1448;
/// The Ethernet header every frame on the testbed carries.
const ETH_HEADER_BYTES: u32 = 14;
/// A full frame: the MTU and the Ethernet header.
const BULK_FRAME_BYTES: u32 = 1500 + ETH_HEADER_BYTES;
/// A small datagram's frame: its payload, UDP's 8, IPv4's 20, Ethernet's.
const SMALL_FRAME_BYTES: u32 = SMALL_BYTES + 8 + 20 + ETH_HEADER_BYTES;
/// The link's FIFO, in time at its rate.
pub const LINK_BUFFER: Duration = Duration::from_millis(200);

/// One link and the options that match it.
#[derive(Clone, Copy, Debug)]
pub struct LinkCase {
    /// Its name (`atm`, `ptm`, `ethernet`: the benchmark's keys).
    pub name: &'static str,
    /// The link's TBF rate.
    pub link_bits_per_s: u64,
    /// How the link counts.
    pub stab: LinkStab,
    /// The framing that matches it, by the keywords the shaper's
    /// `--framing` and CAKE share.
    pub keywords: &'static [&'static str],
    /// The overhead that matches it, where the keywords do not add it up.
    pub overhead_bytes: Option<i32>,
    /// The least a packet costs on it, where that is not 0.
    pub mpu_bytes: Option<u16>,
}

impl LinkCase {
    /// The matching framing as the shaper's options take it, from which
    /// its flags, CAKE's options and the framing itself all come.
    pub fn framing_args(&self) -> FramingArgs {
        FramingArgs {
            keywords: self.keywords.iter().map(|k| (*k).to_owned()).collect(),
            overhead: self.overhead_bytes,
            mpu: self.mpu_bytes,
        }
    }
}

/// The cases.
pub const CASES: [LinkCase; 3] = [
    LinkCase {
        name: "atm",
        link_bits_per_s: LINE_BITS_PER_S,
        stab: LinkStab {
            overhead_bytes: 40,
            mpu_bytes: 64,
            atm: true,
        },
        keywords: &["atm"],
        overhead_bytes: Some(54),
        mpu_bytes: Some(64),
    },
    // PTM codes 64 bytes in 65: the link runs at 64/65 of the line.
    LinkCase {
        name: "ptm",
        link_bits_per_s: LINE_BITS_PER_S / 65 * 64,
        stab: LinkStab {
            overhead_bytes: 16,
            mpu_bytes: 0,
            atm: false,
        },
        keywords: &["pppoe-ptm"],
        overhead_bytes: None,
        mpu_bytes: None,
    },
    LinkCase {
        name: "ethernet",
        link_bits_per_s: LINE_BITS_PER_S,
        stab: LinkStab {
            overhead_bytes: 28,
            mpu_bytes: 84,
            atm: false,
        },
        keywords: &["ethernet", "ether-vlan"],
        overhead_bytes: None,
        mpu_bytes: None,
    },
];

/// The framing the case's options describe, as the shaper resolves them.
pub fn framing(case: &LinkCase) -> Result<Framing, PacerError> {
    case.framing_args().resolve()
}

/// The goodput, as a part of the shaping rate, of equal shares of the rate
/// as the case's matched framing charges it: each of the bulk and small
/// flows gets one share, a bulk flow carries [`BULK_PAYLOAD_BYTES`] per
/// full frame and a small one [`SMALL_BYTES`] per datagram, every frame at
/// its framed cost. A fair scheduler at exactly the rate carries this;
/// more means shares that favour the bulk flows or a rate overshot.
pub fn fair_goodput(case: &LinkCase) -> Result<f64, PacerError> {
    let f = framing(case)?;
    let efficiency = |payload: u32, frame: u32| {
        f64::from(payload) / f64::from(f.frame_len(frame, ETH_HEADER_BYTES))
    };
    let (bulk, small) = (f64::from(BULK_STREAMS), f64::from(SMALL_STREAMS));
    Ok((bulk * efficiency(BULK_PAYLOAD_BYTES, BULK_FRAME_BYTES)
        + small * efficiency(SMALL_BYTES, SMALL_FRAME_BYTES))
        / (bulk + small))
}

/// The router's shaping rate.
pub fn shaping_rate() -> Rate {
    Rate::from_bits_per_s((LINE_BITS_PER_S as f64 * SHAPE_OF_LINE) as u64).unwrap_or(Rate::MIN)
}

/// The testbed for `case`: 20 ms RTT on the WAN side, GSO off, the link.
pub fn testbed_options(case: &LinkCase) -> TestbedOptions {
    TestbedOptions {
        client_delay: Duration::ZERO,
        client2_delay: Duration::ZERO,
        wan_delay: Duration::from_millis(20),
        gso: false,
        wan_link: Some(WanLink {
            rate_bits_per_s: case.link_bits_per_s,
            buffer: LINK_BUFFER,
            stab: Some(case.stab),
        }),
        ..TestbedOptions::default()
    }
}

/// The traffic under `state`, pinging every `ping_every`.
pub fn scenario(state: State, timing: Timing, ping_every: Duration) -> Scenario {
    let small = Rate::from_bits_per_s(SMALL_BITS_PER_S).unwrap_or(Rate::MIN);
    let flows = vec![
        FlowSpec::tcp(Host::Client, BULK_STREAMS),
        FlowSpec {
            streams: SMALL_STREAMS,
            ..FlowSpec::udp(Host::Client2, small).with_datagram_len(SMALL_BYTES)
        },
    ];
    let mut s = Scenario::new(state, flows, timing).with_ping(Host::Client);
    s.ping_interval = ping_every;
    s
}

/// A run's ping p99 (ms; infinite without samples) and the goodput of
/// every flow together as a part of the shaping rate: what the link
/// carried of use, whichever flows carried it (how the bulk and the small
/// datagrams split it varies from run to run).
pub fn figures(r: &RunResult) -> (f64, f64) {
    let p99 = stats::percentile(&r.ping_ms, 99.0).unwrap_or(f64::INFINITY);
    (p99, r.ratio(shaping_rate()))
}

/// CAKE with the case's options, the shaper with them, and the shaper with
/// no framing, by the benchmark's names.
pub fn states(case: &LinkCase, bin: &std::path::Path) -> [(&'static str, State); 3] {
    let shaper = |extra_args: Vec<String>| State::Shaper {
        bin: bin.to_owned(),
        rate: shaping_rate(),
        extra_args,
    };
    let matched = case.framing_args();
    [
        (
            "cake",
            State::CakeWith {
                rate: shaping_rate(),
                options: matched.cake_options(),
            },
        ),
        ("shaper", shaper(matched.shaper_args())),
        ("shaper_no_overhead", shaper(Vec::new())),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Equal shares give what the framing arithmetic says: on ATM a full
    /// frame takes 33 cells and a small one 4, on PTM 1554 and 124 bytes,
    /// on Ethernet with a VLAN tag 1542 and 134.
    #[test]
    fn fair_goodput_is_the_mean_of_the_flows_payload_per_framed_byte() {
        let expect = [
            ("atm", (1448.0 / 1749.0 + 64.0 / 212.0) / 2.0),
            ("ptm", (1448.0 / 1554.0 + 64.0 / 124.0) / 2.0),
            ("ethernet", (1448.0 / 1542.0 + 64.0 / 134.0) / 2.0),
        ];
        for (case, (name, want)) in CASES.iter().zip(expect) {
            assert_eq!(case.name, name);
            let got = fair_goodput(case).expect("valid framing");
            assert!((got - want).abs() < 1e-9, "{name}: {got} against {want}");
        }
    }

    /// The flags and CAKE's options come from the one framing value.
    #[test]
    fn the_shapers_flags_and_cakes_options_come_from_the_same_framing() {
        let atm = CASES[0].framing_args();
        assert_eq!(
            atm.shaper_args(),
            ["--framing", "atm", "--overhead", "54", "--mpu", "64"]
        );
        assert_eq!(atm.cake_options(), ["atm", "overhead", "54", "mpu", "64"]);
        let eth = CASES[2].framing_args();
        assert_eq!(eth.shaper_args(), ["--framing", "ethernet,ether-vlan"]);
        assert_eq!(eth.cake_options(), ["ethernet", "ether-vlan"]);
    }

    /// The shaper's options describe what the link's size table counts:
    /// a frame of every size costs the same either way.
    #[test]
    fn each_cases_options_match_its_link() {
        for case in CASES {
            let f = framing(&case).expect("valid framing");
            for frame in [60u32, 64, 106, 200, 576, 1514] {
                let s = case.stab;
                let counted = (i64::from(frame) + i64::from(s.overhead_bytes))
                    .max(i64::from(s.mpu_bytes)) as u64;
                let link = if s.atm {
                    counted.div_ceil(48) * 53
                } else {
                    counted
                };
                // PTM's coding is the link's slower rate: 65 for every 64,
                // which our count adds per 64 bytes or part (so up to 63
                // over, scaled by 64).
                let ours = u64::from(f.frame_len(frame, 14));
                let scale = if f.ptm == 1 { 64 } else { 65 };
                assert!(
                    (ours * scale).abs_diff(link * 65) <= 63 * 64,
                    "{}: a {frame}-byte frame costs {ours} by our count, {link} on the link",
                    case.name
                );
            }
        }
    }
}
