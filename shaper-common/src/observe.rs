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
//! Invariant: indices are dense and never reused; new ones are appended.
//! Non-goals: per-flow or per-protocol counts (the pacer's own counters and
//! conntrack's give those).

/// Name of the observer's per-CPU counter map in the object file.
pub const OBSERVE_COUNTERS_MAP: &str = "OBSERVE_COUNTERS";

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
}

/// Number of entries in [`OBSERVE_COUNTERS_MAP`].
pub const OBSERVE_COUNTERS: u32 = 4;

/// The array index of `(direction, kind)`: `direction * 2 + kind`.
#[inline(always)]
pub const fn slot(direction: Direction, kind: Kind) -> u32 {
    (direction as u32) * 2 + kind as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_dense_and_distinct() {
        let all = [
            slot(Direction::Egress, Kind::Packets),
            slot(Direction::Egress, Kind::Bytes),
            slot(Direction::Ingress, Kind::Packets),
            slot(Direction::Ingress, Kind::Bytes),
        ];
        assert_eq!(all, [0, 1, 2, 3]);
        assert!(all.iter().all(|s| *s < OBSERVE_COUNTERS));
    }
}
