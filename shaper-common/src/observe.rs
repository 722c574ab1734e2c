//! The flow-offload observer's counters: what its two counting classifiers
//! (`observe_egress`, `observe_ingress` in shaper-ebpf) saw, per direction.
//!
//! Layout: one per-CPU array of `u64`, [`OBSERVE_COUNTERS`] entries, indexed
//! by [`slot`]`(direction, kind)`; the controller sums the CPUs. Units:
//! packets, and bytes of `skb->len` as the TC hook sees it. At both TC egress
//! and TC ingress (cls_bpf and TCX push the MAC header back before running
//! the program at ingress) that length includes the link-layer header, as the
//! interface's own `tx_bytes`/`rx_bytes` do on veth and most Ethernet drivers.
//!
//! A GSO super-packet may be cut into segments *after* the egress hook (when
//! the device refuses its size, e.g. below a lowered `gso_max_size`), and a
//! NIC counts the segments it receives before GRO merges them; each segment
//! repeats the headers. So the hook also counts what the packet is on the
//! wire: `gso_segs` packets and `skb->len` plus the headers every segment
//! after the first repeats (`crate::rate::wire_len_bytes`). The interface's
//! count then lies between the two for traffic that passed the hook.
//!
//! Configuration: [`OBSERVE_FLAGS_MAP`], one `u32` of flags
//! ([`crate::config::FLAG_NO_L2`] for devices without a link-layer header),
//! written before the programs are attached.
//!
//! Invariant: indices are dense and never reused; new ones are appended.
//! Non-goals: per-flow or per-protocol counts (the pacer's own counters and
//! conntrack's give those).

/// Name of the observer's per-CPU counter map in the object file.
pub const OBSERVE_COUNTERS_MAP: &str = "OBSERVE_COUNTERS";

/// Name of the observer's one-entry `Array<u32>` of flags.
pub const OBSERVE_FLAGS_MAP: &str = "OBSERVE_FLAGS";

/// Name of the counting classifier for the egress hook.
pub const OBSERVE_EGRESS_PROGRAM: &str = "observe_egress";

/// Name of the counting classifier for the ingress hook.
pub const OBSERVE_INGRESS_PROGRAM: &str = "observe_ingress";

/// Which hook counted.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// TC egress: what the interface is about to transmit.
    Egress = 0,
    /// TC ingress: what the interface received.
    Ingress = 1,
}

/// What a slot counts.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Packets (one per skb; a GSO super-packet counts once, as the
    /// interface's own packet counters count it on veth).
    Packets = 0,
    /// Bytes of `skb->len`.
    Bytes = 1,
    /// Segments on the wire: `gso_segs` for a GSO packet, else 1.
    WirePackets = 2,
    /// Bytes on the wire: `skb->len` plus the headers each GSO segment
    /// after the first repeats.
    WireBytes = 3,
}

/// Kinds per direction.
pub const KINDS: u32 = 4;

/// Number of entries in [`OBSERVE_COUNTERS_MAP`].
pub const OBSERVE_COUNTERS: u32 = 2 * KINDS;

/// The array index of `(direction, kind)`: `direction * KINDS + kind`.
#[inline(always)]
pub const fn slot(direction: Direction, kind: Kind) -> u32 {
    (direction as u32) * KINDS + kind as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_dense_and_distinct() {
        let mut all = [0u32; OBSERVE_COUNTERS as usize];
        let mut i = 0;
        for d in [Direction::Egress, Direction::Ingress] {
            for k in [
                Kind::Packets,
                Kind::Bytes,
                Kind::WirePackets,
                Kind::WireBytes,
            ] {
                all[i] = slot(d, k);
                i += 1;
            }
        }
        assert_eq!(all, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert!(all.iter().all(|s| *s < OBSERVE_COUNTERS));
    }
}
