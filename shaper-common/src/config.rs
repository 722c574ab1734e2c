//! The pacer's configuration map value, written by the controller and read by
//! the classifier on every packet.
//!
//! Invariants: `#[repr(C)]`, 64 bytes, no implicit padding (asserted below);
//! `reserved` lets fields be added without changing the size, so a newer
//! controller can still read an older pinned map. Booleans are `u32` flags.
//!
//! Units are in the field names. `rate` is already converted for the packet
//! path (see [`crate::rate`]).

use crate::rate::ScaledRate;

/// Flag: the pacer is enabled. When clear the classifier only counts.
pub const FLAG_ENABLED: u32 = 1 << 0;
/// Flag: the device has no link-layer header (PPP, WireGuard, tun), so
/// packets start at the network header and `skb->protocol` names it.
pub const FLAG_NO_L2: u32 = 1 << 1;

/// Default horizon: a packet that would leave more than this far in the
/// future is dropped instead of handed to sch_fq (same default as Cilium's
/// EDT; sch_fq's own default horizon is 10 s, commit 39d010504e6b).
pub const DEFAULT_HORIZON_NS: u64 = 2_000_000_000;

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
    /// Room for later fields; always zero for now.
    pub reserved: [u64; 3],
}

const _: () = assert!(core::mem::size_of::<PacerConfig>() == 64);

impl PacerConfig {
    /// A configuration that paces at `rate` with the default horizon.
    pub fn new(rate_bytes_per_s: u64, rate: ScaledRate) -> Self {
        Self {
            ns_per_byte_scaled: rate.ns_per_byte_scaled,
            rate_bytes_per_s,
            horizon_ns: DEFAULT_HORIZON_NS,
            rate_shift: rate.shift,
            flags: FLAG_ENABLED,
            generation: 1,
            reserved: [0; 3],
        }
    }

    /// The rate in the form [`ScaledRate::tx_time_ns`] needs.
    #[inline(always)]
    pub fn scaled_rate(&self) -> ScaledRate {
        ScaledRate {
            ns_per_byte_scaled: self.ns_per_byte_scaled,
            shift: self.rate_shift,
        }
    }

    /// True when the classifier should pace, not just count.
    #[inline(always)]
    pub fn enabled(&self) -> bool {
        self.flags & FLAG_ENABLED != 0 && self.rate_shift > 0
    }
}

/// The aggregate pacer's state: the departure time of the last paced byte.
/// One entry, at index 0, alone on its cache line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AggregateState {
    /// Monotonic time (ns) before which the next packet may not leave.
    pub t_next_free_ns: u64,
    /// Pads to a cache line so no other data shares it.
    pub reserved: [u64; 7],
}

const _: () = assert!(core::mem::size_of::<AggregateState>() == 64);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: both are repr(C), made only of integers, with no padding (sizes
    // asserted above), so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::PacerConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AggregateState {}
}
