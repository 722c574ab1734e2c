//! Types and arithmetic shared by the BPF programs (`shaper-ebpf`) and the
//! controller (`shaper`).
//!
//! Everything here is `no_std`, allocation-free and free of runtime division on
//! the packet path, so the very same functions run in the kernel and in host
//! tests. Map value types are `#[repr(C)]` with explicit padding and a size
//! assertion, so the two sides cannot drift apart silently.
//!
//! Non-goals: parsing packets (that is `shaper-ebpf`'s job) and anything that
//! needs an allocator or floating point.
#![no_std]

pub mod calls;
pub mod codel;
pub mod committed;
pub mod config;
pub mod counters;
pub mod ecn;
pub mod edt;
pub mod event;
pub mod fair;
pub mod flow;
pub mod framing;
pub mod hosts;
pub mod link;
pub mod nat;
pub mod observe;
pub mod police;
pub mod rate;
pub mod shared;
pub mod tins;
pub mod trace;

/// Names of the maps the classifier exports; the controller pins them under
/// `/sys/fs/bpf/shaper/<iface>/` with the same names.
pub mod maps {
    /// `Array<PacerConfig>` with one entry.
    pub const CONFIG: &str = "SHAPER_CONFIG";
    /// `PerCpuArray<u64>` indexed by [`crate::counters::Counter`].
    pub const COUNTERS: &str = "SHAPER_COUNTERS";
    /// `Array<AggregateState>` with one entry.
    pub const AGGREGATE: &str = "SHAPER_AGG";
    /// `Array<FairState>` with one entry per tin ([`crate::tins::MAX_TINS`]).
    pub const FAIR: &str = "SHAPER_FAIR";
    /// `Array<TinState>` with one entry: the tins' thresholds and what
    /// each accepted ([`crate::tins::TinState`]).
    pub const TINS: &str = "SHAPER_TINS";
    /// `PerCpuArray<TinCounters>` with one entry per tin
    /// ([`crate::tins::TinCounters`]).
    pub const TIN_COUNTERS: &str = "SHAPER_TIN_COUNTERS";
    /// `Array<FlowSet>`, one entry per set of the flow table.
    pub const FLOWS: &str = "SHAPER_FLOWS";
    /// `LruHashMap<u64, HostEntry>`: the hosts' state under host isolation
    /// ([`crate::hosts`]).
    pub const HOSTS: &str = "SHAPER_HOSTS";
    /// `RingBuf` of [`crate::event::Event`]s: the pacer's sampled packets
    /// and flow starts and ends.
    pub const EVENTS: &str = "SHAPER_EVENTS";
    /// `PerCpuArray<Scratch>` with one entry: the classifier's hand-over to
    /// the telemetry program.
    pub const SCRATCH: &str = "SHAPER_SCRATCH";
    /// `ProgramArray` with one slot, [`crate::JUMP_TELEMETRY`].
    pub const JUMP: &str = "SHAPER_JUMP";
    /// `Array<LinkState>` with one entry: the ingress policer's virtual
    /// link ([`crate::police::LinkState`]).
    pub const POLICE_LINK: &str = "SHAPER_POLICE_LINK";
    /// `Array<u32>` with one entry: the ifindex `shaper_redirect` sends
    /// every packet to (the IFB of `--ingress-mode ifb`); 0 passes.
    pub const REDIRECT: &str = "SHAPER_REDIRECT";
    /// `LruHashMap<NatKey, u32>`: the LAN host behind each masqueraded
    /// connection ([`crate::nat`]), shared by the LAN classifiers and the
    /// pacers over hosts of one `--nat` run.
    pub const NAT: &str = "SHAPER_NAT";
    /// `PerCpuArray<u64>` indexed by position in
    /// [`crate::calls::HELPERS`]: the benchmark's helper-call counts.
    pub const HELPER_CALLS: &str = "SHAPER_HELPER_CALLS";
}

/// Name of the telemetry program the classifier tail-calls.
pub const TELEMETRY_PROGRAM: &str = "shaper_telemetry";

/// Slot of the telemetry program in the `SHAPER_JUMP` program array.
pub const JUMP_TELEMETRY: u32 = 0;

/// Name of the egress classifier program in the object file.
pub const EGRESS_PROGRAM: &str = "shaper_egress";

/// Name of the egress classifier with host isolation in the object file.
pub const EGRESS_HOSTS_PROGRAM: &str = "shaper_egress_hosts";

/// Name of the egress classifier with host isolation through masquerading
/// (`--nat`, [`nat`]) in the object file.
pub const EGRESS_HOSTS_NAT_PROGRAM: &str = "shaper_egress_hosts_nat";

/// Name of the ingress policer program (`police` mode) in the object file.
pub const POLICE_PROGRAM: &str = "shaper_police";

/// Name of the ingress policer with host isolation in the object file.
pub const POLICE_HOSTS_PROGRAM: &str = "shaper_police_hosts";

/// Name of the ingress policer with host isolation through masquerading
/// (`--nat`, [`nat`]) in the object file.
pub const POLICE_HOSTS_NAT_PROGRAM: &str = "shaper_police_hosts_nat";

/// Name of the ingress program that redirects to the IFB (`ifb` mode).
pub const REDIRECT_PROGRAM: &str = "shaper_redirect";

/// Name of the LAN-side classifier of `--nat` ([`nat`]) in the object file.
pub const NAT_LAN_PROGRAM: &str = "shaper_nat_lan";

/// Name of a classifier that only passes packets, the benchmark's baseline.
pub const PASSTHROUGH_PROGRAM: &str = "shaper_passthrough";

/// Name of a classifier that reads the clock once and passes the packet:
/// the benchmark's measure of the one clock read every pacer makes.
pub const CLOCK_PROGRAM: &str = "shaper_clock";
