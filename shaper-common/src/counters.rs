//! Counters the classifier keeps: one per outcome and one per packet class,
//! in a per-CPU array indexed by [`Counter`]. The controller sums the CPUs.
//!
//! Invariant: indices are dense from 0 to [`Counter::COUNT`] - 1 and never
//! reused for another meaning; new counters are appended.

/// Index into the `SHAPER_COUNTERS` per-CPU array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Counter {
    /// Every packet the hook saw.
    Packets = 0,
    /// Bytes (`skb->len`) of every packet the hook saw.
    Bytes,
    /// Sent on without a departure time (the pacer was idle or disabled).
    PassedUnpaced,
    /// Given a departure time in the future.
    Paced,
    /// Dropped: the departure time would exceed the horizon.
    HorizonDrop,
    /// IPv4 packets.
    Ipv4,
    /// IPv6 packets.
    Ipv6,
    /// TCP segments (over either IP version).
    Tcp,
    /// UDP datagrams.
    Udp,
    /// ICMP and ICMPv6 messages.
    Icmp,
    /// IP packets of another protocol.
    OtherIp,
    /// Frames whose ethertype is not IP (ARP, LLDP, ...).
    NonIp,
    /// Frames with at least one 802.1Q / 802.1ad tag.
    Vlan,
    /// Frames cut short inside a header they announce.
    Truncated,
    /// Bytes on the wire: `Bytes`, plus the headers each GSO segment after
    /// the first repeats. What the pacer charges.
    WireBytes,
    /// CE-marked by the AQM (ECN-capable packets, kept).
    CeMarked,
    /// Dropped by the AQM (packets that are not ECN-capable), for either
    /// reason: `CodelDrop` plus `OverloadDrop`.
    AqmDrop,
    /// A new flow found every way of its set backlogged and shares one.
    FlowTableFull,
    /// A flow took over a table slot (new, or replacing an idle flow).
    FlowNew,
    /// Telemetry records written to the ring buffer.
    EventsSent,
    /// Telemetry records lost: the ring buffer was full (the controller
    /// fell behind); the packet itself was unaffected.
    EventsLost,
    /// Dropped by the ingress policer (a congestion signal to a flow that
    /// is not ECN-capable; see `police`).
    PoliceDrop,
    /// A flow's or the link's virtual clock at ingress had run past the
    /// horizon and was pulled back (an unresponsive sender).
    PoliceClamped,
    /// The policer owed a flow a signal but the one-in-four cap held it
    /// back; the packet passed.
    PoliceWithheld,
    /// The AQM chose a CE mark but the header could not be rewritten; the
    /// packet was dropped instead, as CoDel drops what it cannot mark, and
    /// its header was left whole.
    CeMarkFailed,
    /// Dropped by CoDel's spaced signal (part of `AqmDrop`).
    CodelDrop,
    /// Dropped by the overload rule: the flow was more than an interval
    /// behind (part of `AqmDrop`).
    OverloadDrop,
    /// Dropped by the policer on the link's CoDel (part of `PoliceDrop`).
    PoliceCodelDrop,
    /// Dropped by the policer as a flow's early signal, its first since it
    /// started sending (part of `PoliceDrop`).
    PoliceEarlyDrop,
    /// Dropped by the policer's overload rule: the flow was more than an
    /// interval behind its share (part of `PoliceDrop`).
    PoliceOverloadDrop,
    /// Packets whose DSCP `--wash` cleared.
    Washed,
    /// Under `--nat`, TCP or UDP packets over IPv4 whose LAN host was
    /// found in the record of the LAN side (`crate::nat`).
    NatFound,
    /// Under `--nat`, TCP or UDP packets over IPv4 whose connection the
    /// LAN side has not recorded: weighed by their own addresses.
    NatMissed,
}

impl Counter {
    /// Number of counters; the array's size.
    pub const COUNT: u32 = Counter::NatMissed as u32 + 1;

    /// All counters in index order.
    pub const ALL: [Counter; Counter::COUNT as usize] = [
        Counter::Packets,
        Counter::Bytes,
        Counter::PassedUnpaced,
        Counter::Paced,
        Counter::HorizonDrop,
        Counter::Ipv4,
        Counter::Ipv6,
        Counter::Tcp,
        Counter::Udp,
        Counter::Icmp,
        Counter::OtherIp,
        Counter::NonIp,
        Counter::Vlan,
        Counter::Truncated,
        Counter::WireBytes,
        Counter::CeMarked,
        Counter::AqmDrop,
        Counter::FlowTableFull,
        Counter::FlowNew,
        Counter::EventsSent,
        Counter::EventsLost,
        Counter::PoliceDrop,
        Counter::PoliceClamped,
        Counter::PoliceWithheld,
        Counter::CeMarkFailed,
        Counter::CodelDrop,
        Counter::OverloadDrop,
        Counter::PoliceCodelDrop,
        Counter::PoliceEarlyDrop,
        Counter::PoliceOverloadDrop,
        Counter::Washed,
        Counter::NatFound,
        Counter::NatMissed,
    ];

    /// Stable snake_case name, used by `shaper status` and exporters.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::Packets => "packets",
            Counter::Bytes => "bytes",
            Counter::PassedUnpaced => "passed_unpaced",
            Counter::Paced => "paced",
            Counter::HorizonDrop => "horizon_drop",
            Counter::Ipv4 => "ipv4",
            Counter::Ipv6 => "ipv6",
            Counter::Tcp => "tcp",
            Counter::Udp => "udp",
            Counter::Icmp => "icmp",
            Counter::OtherIp => "other_ip",
            Counter::NonIp => "non_ip",
            Counter::Vlan => "vlan",
            Counter::Truncated => "truncated",
            Counter::WireBytes => "wire_bytes",
            Counter::CeMarked => "ce_marked",
            Counter::AqmDrop => "aqm_drop",
            Counter::FlowTableFull => "flow_table_full",
            Counter::FlowNew => "flow_new",
            Counter::EventsSent => "events_sent",
            Counter::EventsLost => "events_lost",
            Counter::PoliceDrop => "police_drop",
            Counter::PoliceClamped => "police_clamped",
            Counter::PoliceWithheld => "police_withheld",
            Counter::CeMarkFailed => "ce_mark_failed",
            Counter::CodelDrop => "codel_drop",
            Counter::OverloadDrop => "overload_drop",
            Counter::PoliceCodelDrop => "police_codel_drop",
            Counter::PoliceEarlyDrop => "police_early_drop",
            Counter::PoliceOverloadDrop => "police_overload_drop",
            Counter::Washed => "washed",
            Counter::NatFound => "nat_found",
            Counter::NatMissed => "nat_missed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_dense_and_in_order() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{c:?}");
        }
    }

    #[test]
    fn names_are_unique() {
        for a in Counter::ALL {
            for b in Counter::ALL {
                assert!(a == b || a.name() != b.name(), "{a:?} {b:?}");
            }
        }
    }
}
