//! The pacer's configuration map value, written by the controller and read by
//! the classifier on every packet.
//!
//! Invariants: `#[repr(C)]`, 128 bytes, no implicit padding (asserted below).
//! Booleans are `u32` flags.
//!
//! Units are in the field names. `rate` is already converted for the packet
//! path (see [`crate::rate`]).

use crate::{framing::Framing, rate::ScaledRate};

/// Flag: the pacer is enabled. When clear the classifier only counts.
pub const FLAG_ENABLED: u32 = 1 << 0;
/// Flag: the device has no link-layer header (PPP, WireGuard, tun), so
/// packets start at the network header and `skb->protocol` names it.
pub const FLAG_NO_L2: u32 = 1 << 1;

/// Flag: the fair per-flow pacer (`crate::fair`); clear: the aggregate
/// pacer (`crate::edt`), kept for comparison.
pub const FLAG_FAIR: u32 = 1 << 2;
/// Flag: CE-mark ECN-capable packets instead of dropping them.
pub const FLAG_ECN: u32 = 1 << 3;
/// Flag: send telemetry events (`crate::event`): every drop, mark, flow
/// start and end, plus the packets the 1-in-N draw picks.
pub const FLAG_TELEMETRY: u32 = 1 << 4;
/// Flag: the pacer runs on an IFB fed from an interface's ingress
/// (`--ingress-mode ifb`). `skb->tstamp` is then never read as a departure
/// time (at ingress it may hold the receive time, CLOCK_REALTIME), and
/// stamps are written with `bpf_skb_set_tstamp(.., BPF_SKB_TSTAMP_DELIVERY_MONO)`
/// so the stack knows them for delivery times when the packet goes on to
/// be forwarded or delivered locally (Linux 5.18, Martin KaFai Lau's
/// "Preserve mono delivery time (EDT) in skb->tstamp" series).
pub const FLAG_DELIVERY_MONO: u32 = 1 << 5;
/// Flag: clear each packet's DSCP after its tin is chosen, keeping the ECN
/// bits (CAKE's `wash`), so that the next network sees none of ours.
pub const FLAG_WASH: u32 = 1 << 6;
/// Flag: under host isolation, the LAN side's host of a TCP or UDP packet
/// is the one recorded before masquerading (`crate::nat`), when recorded:
/// the controller then loads the program that looks it up.
pub const FLAG_NAT: u32 = 1 << 7;
/// The host isolation mode ([`crate::hosts::Isolation`]) sits in the
/// three bits of `flags` from here.
pub const FLAG_ISOLATION_SHIFT: u32 = 8;

/// Default telemetry sampling: 1 packet in this many, besides every drop
/// and mark. At 1 Gbit/s of full-size frames that is about 1,300 events a
/// second.
pub const DEFAULT_SAMPLE_EVERY: u32 = 64;

/// The draw threshold for sampling 1 packet in `n`: a packet is picked
/// when a uniform 32-bit random number is below it (so the packet path
/// compares instead of dividing). 0 picks none; 1 picks all.
pub const fn sample_threshold(n: u32) -> u64 {
    if n == 0 { 0 } else { (1u64 << 32) / n as u64 }
}

/// Default horizon: a packet that would leave more than this far in the
/// future is dropped instead of handed to sch_fq. Cilium's EDT uses 2 s and
/// sch_fq 10 s (commit 39d010504e6b); with CoDel keeping each flow's delay
/// near target, only unresponsive flows reach it, and 500 ms bounds what
/// sch_fq holds to half a second of the rate.
pub const DEFAULT_HORIZON_NS: u64 = 500_000_000;

/// CoDel's default target (RFC 8289).
pub const DEFAULT_TARGET_NS: u64 = 5_000_000;
/// CoDel's default interval (RFC 8289).
pub const DEFAULT_INTERVAL_NS: u64 = 100_000_000;

/// Configuration of the egress pacer. Exactly one entry, at index 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacerConfig {
    /// Transmission time per byte, fixed point (see [`ScaledRate`]).
    pub ns_per_byte_scaled: u64,
    /// The configured rate, for display; the packet path uses the scaled form.
    pub rate_bytes_per_s: u64,
    /// Drop packets whose departure time would lie further ahead than this.
    pub horizon_ns: u64,
    /// Shift of `ns_per_byte_scaled`.
    pub rate_shift: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Bumped by the controller on every change, so readers can tell.
    pub generation: u64,
    /// CoDel target on each flow's scheduled delay.
    pub target_ns: u64,
    /// CoDel interval; below 2^32 (see `crate::codel`).
    pub interval_ns: u64,
    /// A flow idle this long may give its table slot to another.
    pub flow_idle_ns: u64,
    /// Flow table sets minus one (the set count is a power of two).
    pub flow_sets_mask: u32,
    /// The DiffServ mode ([`crate::tins::Diffserv::index`]) whose tins
    /// `tin_planes` maps to; 0, besteffort, for one tin.
    pub diffserv: u32,
    /// Seed of the flow hash, chosen at load time.
    pub hash_seed: u64,
    /// Telemetry draw threshold ([`sample_threshold`]); read only when
    /// [`FLAG_TELEMETRY`] is set.
    pub sample_threshold: u64,
    /// The DSCP to tin map as bit planes ([`crate::tins::Diffserv::planes`]);
    /// all zero: one tin.
    pub tin_planes: [u64; 3],
    /// How the link frames packets ([`Framing::RAW`]: as Linux sees them).
    pub framing: Framing,
}

const _: () = assert!(core::mem::size_of::<PacerConfig>() == 128);

impl PacerConfig {
    /// A configuration of the fair pacer at `rate` with every default.
    pub fn new(rate_bytes_per_s: u64, rate: ScaledRate) -> Self {
        Self {
            ns_per_byte_scaled: rate.ns_per_byte_scaled,
            rate_bytes_per_s,
            horizon_ns: DEFAULT_HORIZON_NS,
            rate_shift: rate.shift,
            flags: FLAG_ENABLED | FLAG_FAIR | FLAG_ECN,
            generation: 1,
            target_ns: DEFAULT_TARGET_NS,
            interval_ns: DEFAULT_INTERVAL_NS,
            flow_idle_ns: crate::flow::DEFAULT_FLOW_IDLE_NS,
            flow_sets_mask: crate::flow::DEFAULT_FLOWS / crate::flow::WAYS as u32 - 1,
            diffserv: 0,
            hash_seed: 0,
            sample_threshold: sample_threshold(DEFAULT_SAMPLE_EVERY),
            tin_planes: [0; 3],
            framing: Framing::RAW,
        }
    }

    /// The per-flow decision's parameters.
    #[inline(always)]
    pub fn fair_params(&self) -> crate::fair::FairParams {
        crate::fair::FairParams {
            codel: crate::codel::CodelParams {
                target_ns: self.target_ns,
                interval_ns: self.interval_ns,
            },
            horizon_ns: self.horizon_ns,
            ecn: self.flags & FLAG_ECN != 0,
        }
    }

    /// True when the fair pacer runs (else the aggregate one).
    #[inline(always)]
    pub fn fair(&self) -> bool {
        self.flags & FLAG_FAIR != 0
    }

    /// The host isolation mode ([`FLAG_ISOLATION_SHIFT`]); `flows` for a
    /// value no mode has.
    #[inline(always)]
    pub fn isolation(&self) -> crate::hosts::Isolation {
        crate::hosts::Isolation::from_u32((self.flags >> FLAG_ISOLATION_SHIFT) & 7)
            .unwrap_or(crate::hosts::Isolation::Flows)
    }

    /// Sets the host isolation mode.
    pub fn set_isolation(&mut self, mode: crate::hosts::Isolation) {
        self.flags =
            (self.flags & !(7 << FLAG_ISOLATION_SHIFT)) | ((mode as u32) << FLAG_ISOLATION_SHIFT);
    }

    /// The rate in the form [`ScaledRate::tx_time_ns`] needs.
    #[inline(always)]
    pub fn scaled_rate(&self) -> ScaledRate {
        ScaledRate {
            ns_per_byte_scaled: self.ns_per_byte_scaled,
            shift: self.rate_shift,
        }
    }

    /// The tin of a packet with DSCP `dscp`.
    #[inline(always)]
    pub fn tin_of(&self, dscp: u8) -> usize {
        crate::tins::tin_from_planes(&self.tin_planes, dscp)
    }

    /// True when the classifier should pace, not just count.
    #[inline(always)]
    pub fn enabled(&self) -> bool {
        self.flags & FLAG_ENABLED != 0 && self.rate_shift > 0
    }
}

/// The link-wide clocks: the aggregate pacer's, and the fair pacer's bound
/// on the aggregate ([`crate::link`]). One entry, at index 0, alone on its
/// cache line; every packet writes it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AggregateState {
    /// The aggregate pacer: monotonic time (ns) before which the next
    /// packet may not leave.
    pub t_next_free_ns: u64,
    /// The fair pacer: the link's clock, ns ([`crate::link`]).
    pub link_clock_ns: u64,
    /// The fair pacer: the latest departure it has given, ns
    /// ([`crate::link`]).
    pub link_front_ns: u64,
    /// Pads to a cache line so no other data shares it.
    pub reserved: [u64; 5],
}

const _: () = assert!(core::mem::size_of::<AggregateState>() == 64);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: both are repr(C), made only of integers, with no padding (sizes
    // asserted above), so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::PacerConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AggregateState {}
    // SAFETY: as above (size asserted in `crate::fair`).
    unsafe impl aya::Pod for crate::fair::FairState {}
    // SAFETY: as above (size asserted in `crate::flow`).
    unsafe impl aya::Pod for crate::flow::FlowSet {}
    // SAFETY: as above (sizes asserted in `crate::event`).
    unsafe impl aya::Pod for crate::event::Event {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::event::Scratch {}
    // SAFETY: as above (size asserted in `crate::police`).
    unsafe impl aya::Pod for crate::police::LinkState {}
    // SAFETY: as above (size asserted in `crate::hosts`).
    unsafe impl aya::Pod for crate::hosts::HostEntry {}
    // SAFETY: as above (size asserted in `crate::nat`).
    unsafe impl aya::Pod for crate::nat::NatKey {}
    // SAFETY: as above (size asserted in `crate::tins`).
    unsafe impl aya::Pod for crate::tins::TinState {}
    // SAFETY: as above (size asserted in `crate::tins`).
    unsafe impl aya::Pod for crate::tins::TinCounters {}
}
