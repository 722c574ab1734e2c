//! A discrete-event simulator of one shaped link, driving the fair pacer's
//! own pure functions ([`shaper_common::fair`]) with synthetic traffic, so
//! that properties of the algorithm (aggregate bound, fairness, work
//! conservation, AQM) can be checked on the host, deterministically, before
//! and besides any kernel.
//!
//! What it models.
//! - The pacer, through the classifier's own steps on a private copy of the
//!   shared state ([`shaper_common::shared`], which the classifier runs
//!   with atomics): [`roll_epoch`](shaper_common::shared::roll_epoch) when
//!   `now >> EPOCH_SHIFT` advanced, [`pace`](shaper_common::shared::pace)
//!   on the flow's [`FlowEntry`](shaper_common::flow::FlowEntry) with the
//!   multiplier, then [`account`](shaper_common::shared::account) for a
//!   kept packet: its transmission time at the aggregate rate in the epoch
//!   of the decision (`Accounting::Departure`, the epoch it departs in, is
//!   kept only to show why that rule was dropped). The policer likewise
//!   ([`police_step`](shaper_common::shared::police_step)). Transmission
//!   times come from
//!   [`ScaledRate::tx_time_ns`](shaper_common::rate::ScaledRate::tx_time_ns).
//!   Every simulated flow has its own `FlowEntry`. Under host isolation
//!   ([`Scenario::isolation`]) the step is
//!   [`pace_hosts`](shaper_common::hosts::pace_hosts), each tin keeping
//!   its hosts by number, as sources and as destinations, and the roll
//!   keeps the water level over hosts.
//! - sch_fq after the pacer: a kept packet leaves at its stamped time (or at
//!   once when passed), at line rate, which is far above the shaped rate;
//!   a flow's packets leave in order (a packet never leaves before an earlier
//!   packet of its flow). The stamped departures *are* the link schedule the
//!   conformance checks look at.
//! - The path: a fixed one-way delay per flow (half its RTT) to the
//!   receiver; ACKs reach the sender one RTT after the departure.
//! - Sources ([`Source`]): window-limited AIMD bulk flows (Reno-like:
//!   slow start to the first congestion signal, +1 packet per RTT after it,
//!   halving on a loss or on an echoed CE mark at most once per window of
//!   data: signals about packets sent before the last halving are ignored),
//!   periodic sparse flows (a ping) and unresponsive constant-rate flows
//!   (UDP), each active between a start and an optional stop time.
//! - A drop is noticed by the AIMD sender one RTT after the flow's next
//!   departure (about when three duplicate ACKs would arrive); the lost
//!   packet is not resent as such, the window simply sends new data.
//!
//! Units: nanoseconds of simulated time starting at 0, bytes on the wire
//! (1514 per bulk packet), rates in bytes per second.
//!
//! Non-goals: the flow table's hashing and collisions (each flow owns its
//! entry), CPU concurrency (the BPF side's races), TCP details beyond AIMD
//! (no SACK, timeouts, delayed ACKs, TSO, the socket's own pacing or HyStart),
//! the receiver's link, and the real clock granularity of sch_fq.
//!
//! Layout: [`rng`] (SplitMix64), [`engine`] (event queue, sources, pacer
//! step), [`report`] (per-run outputs and the measures the tests use).

pub mod engine;
pub mod report;
pub mod rng;

pub use engine::run;
pub use report::{Departure, Excess, FlowReport, SimReport, VerdictCounts, jain_index, percentile};

use shaper_common::codel::CodelParams;
use shaper_common::config::{DEFAULT_HORIZON_NS, DEFAULT_INTERVAL_NS, DEFAULT_TARGET_NS};
use shaper_common::fair::FairParams;
use shaper_common::hosts::Isolation;
use shaper_common::tins::Diffserv;

/// One nanosecond-denominated millisecond.
pub const MS: u64 = 1_000_000;
/// One second in nanoseconds.
pub const SEC: u64 = 1_000_000_000;

/// Wire bytes of one bulk (MTU-sized Ethernet) packet.
pub const BULK_PACKET_BYTES: u32 = 1514;

/// What a flow sends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Source {
    /// A window-limited AIMD bulk transfer of [`BULK_PACKET_BYTES`] packets.
    Aimd {
        /// Round-trip time without queueing, ns.
        rtt_ns: u64,
        /// Its packets are ECN-capable (a CE mark halves the window instead
        /// of a drop).
        ecn: bool,
    },
    /// One packet every `interval_ns` (a ping), not ECN-capable.
    Sparse {
        /// Time between packets, ns.
        interval_ns: u64,
        /// Wire bytes per packet.
        len: u32,
        /// Round-trip time, ns (only the delivery time depends on it).
        rtt_ns: u64,
    },
    /// Constant-rate traffic that ignores every signal (UDP), not
    /// ECN-capable.
    Unresponsive {
        /// Offered rate, bytes per second.
        rate_bytes_per_s: u64,
        /// Wire bytes per packet.
        len: u32,
        /// Round-trip time, ns (only the delivery time depends on it).
        rtt_ns: u64,
    },
}

impl Source {
    /// The flow's round-trip time, ns.
    pub fn rtt_ns(&self) -> u64 {
        match *self {
            Source::Aimd { rtt_ns, .. }
            | Source::Sparse { rtt_ns, .. }
            | Source::Unresponsive { rtt_ns, .. } => rtt_ns,
        }
    }

    /// An ECN-capable AIMD flow with this RTT in ms.
    pub fn aimd_ms(rtt_ms: u64) -> Self {
        Source::Aimd {
            rtt_ns: rtt_ms * MS,
            ecn: true,
        }
    }

    /// A 10 packets-per-second flow of 100-byte packets (a ping) with a
    /// 20 ms RTT.
    pub fn ping() -> Self {
        Source::Sparse {
            interval_ns: 100 * MS,
            len: 100,
            rtt_ns: 20 * MS,
        }
    }
}

/// One flow of a scenario.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlowSpec {
    /// What it sends.
    pub source: Source,
    /// When it starts sending, ns.
    pub start_ns: u64,
    /// When it stops sending new packets, ns; `None`: at the end of the run.
    pub stop_ns: Option<u64>,
    /// The tin its packets are in ([`Scenario::diffserv`]'s; 0, best
    /// effort, for a scenario without tins).
    pub tin: usize,
    /// The hosts it runs between, by number: `(source, destination)`;
    /// only [`Scenario::isolation`] reads them.
    pub hosts: (u32, u32),
}

impl FlowSpec {
    /// A flow active for the whole run, from host 0 to host 0.
    pub fn always(source: Source) -> Self {
        Self {
            source,
            start_ns: 0,
            stop_ns: None,
            tin: 0,
            hosts: (0, 0),
        }
    }

    /// This flow in tin `tin`.
    pub fn in_tin(self, tin: usize) -> Self {
        Self { tin, ..self }
    }

    /// This flow from host `src` to host `dst`.
    pub fn between(self, src: u32, dst: u32) -> Self {
        Self {
            hosts: (src, dst),
            ..self
        }
    }
}

/// What to simulate: the link, the pacer's parameters and the flows.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// The shaped rate C, bytes per second.
    pub rate_bytes_per_s: u64,
    /// The pacer's parameters.
    pub params: FairParams,
    /// Simulated time, ns.
    pub duration_ns: u64,
    /// Seed of every random choice of the run.
    pub seed: u64,
    /// The flows, numbered by position.
    pub flows: Vec<FlowSpec>,
    /// Which epoch a kept packet's transmission time counts in.
    pub accounting: Accounting,
    /// Pacing (egress with sch_fq, the default) or policing at ingress.
    pub mode: Mode,
    /// The committed flows floor the multiplier
    /// (`shaper_common::committed`), as in the classifier; off, for
    /// comparison, the accepted-traffic feedback and the cap alone set it.
    pub committed_floor: bool,
    /// The link's clock bounds what the flows together are given
    /// (`shaper_common::link`), as in the classifier; off, for comparison,
    /// the share alone does.
    pub link_clock: bool,
    /// The DiffServ mode whose tins the flows are in.
    pub diffserv: Diffserv,
    /// How hosts are isolated on this (upload) link
    /// ([`shaper_common::hosts`]); the modes without a host level, which
    /// only narrow the flow key, run as `flows` (every simulated flow owns
    /// its entry). Pace mode only.
    pub isolation: Isolation,
}

/// Where the pacer's decision acts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// The egress pacer: kept packets wait in sch_fq until their stamp.
    #[default]
    Pace,
    /// The AQM policer at the receiving router's ingress
    /// ([`shaper_common::police`]): every packet first crosses an upstream
    /// FIFO (the ISP's access link, faster than the policed rate and with a
    /// deep buffer), then the policer passes, marks or drops it at once.
    /// A packet finding the FIFO's delay above `link_buffer_ns` is lost
    /// there (tail drop), as in a bloated modem.
    Police {
        /// The upstream link's rate, bytes per second.
        link_rate_bytes_per_s: u64,
        /// The upstream FIFO's capacity, as drain time at that rate, ns.
        link_buffer_ns: u64,
        /// Which policing rule runs.
        rule: PoliceRule,
    },
}

/// The policer's rule in [`Mode::Police`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PoliceRule {
    /// Each flow's own CoDel on its virtual delay
    /// ([`shaper_common::police::police`]), the first design.
    PerFlow,
    /// CoDel on the link's virtual FIFO, its signals going to flows above
    /// their share ([`shaper_common::police::police_link`]).
    #[default]
    Link,
}

/// Which epoch's measurement a kept packet counts in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Accounting {
    /// Its departure's, through `departure_slot(epoch, departure)`: the
    /// first design, kept for comparison. Departures up to the horizon
    /// ahead feed back up to 16 epochs late, and the loop oscillates.
    Departure,
    /// The epoch of the decision (`departure_slot(epoch, now)`): CSFQ's
    /// accepted-traffic measurement, what the BPF side does.
    #[default]
    Decision,
}

/// The pacer's defaults (target 5 ms, interval 100 ms, horizon 500 ms,
/// ECN on), as the controller configures them.
pub fn default_params() -> FairParams {
    FairParams {
        codel: CodelParams {
            target_ns: DEFAULT_TARGET_NS,
            interval_ns: DEFAULT_INTERVAL_NS,
        },
        horizon_ns: DEFAULT_HORIZON_NS,
        ecn: true,
    }
}

impl Scenario {
    /// A scenario at `rate_bit_per_s` for `duration_ns` with the pacer's
    /// defaults, seed 1 and no flows yet.
    pub fn new(rate_bit_per_s: u64, duration_ns: u64) -> Self {
        Self {
            rate_bytes_per_s: rate_bit_per_s / 8,
            params: default_params(),
            duration_ns,
            seed: 1,
            flows: Vec::new(),
            accounting: Accounting::Decision,
            mode: Mode::Pace,
            committed_floor: true,
            link_clock: true,
            diffserv: Diffserv::Besteffort,
            isolation: Isolation::Flows,
        }
    }

    /// Adds a flow; returns the scenario for chaining.
    pub fn with(mut self, flow: FlowSpec) -> Self {
        self.flows.push(flow);
        self
    }
}

/// Why a scenario cannot run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SimError {
    /// Host isolation is simulated on the pacer and the policer's link
    /// rule, not on its first design.
    #[error("host isolation ({0}) is simulated on the pacer and the policer's link rule only")]
    IsolationPoliced(&'static str),
    /// The link rate is outside what the pacer accepts.
    #[error("link rate {rate_bytes_per_s} B/s is outside the pacer's range")]
    Rate {
        /// The rejected rate.
        rate_bytes_per_s: u64,
    },
    /// A flow's parameters make no sense (zero RTT, interval, length or rate).
    #[error("flow {flow}: {reason}")]
    Flow {
        /// Index of the flow in the scenario.
        flow: usize,
        /// What is wrong.
        reason: &'static str,
    },
}
