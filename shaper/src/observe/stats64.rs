//! The interface's own counters: `IFLA_STATS64` (`struct rtnl_link_stats64`)
//! from one RTM_GETLINK by index, over the project's rtnetlink socket
//! ([`crate::tc::netlink`]) and parsed with netlink-packet-route. Read-only.
//!
//! What they count: on veth, `tx_bytes`/`rx_bytes` are `skb->len` at
//! `veth_xmit`, where the data starts at the Ethernet header (header
//! included, no FCS), one packet per skb it is handed: a GSO packet once,
//! unless the core cut it into segments first (its length above the
//! device's `gso_max_size`, as under `shaper run`). Most Ethernet drivers
//! count frames with their header too, as segments. The hooks count both
//! ways (see `shaper_common::observe`); a device that adds framing of its own
//! (FCS, PPPoE, tunnel headers) differs by that much per packet. The tests
//! check veth on 6.18, 6.12 and 6.1.

use netlink_packet_core::{Emitable, Parseable};
use netlink_packet_route::link::{LinkAttribute, LinkMessage, Stats64};

use super::ObserveError;
use crate::tc;

/// `RTM_GETLINK` (include/uapi/linux/rtnetlink.h).
const RTM_GETLINK: u16 = 18;

/// The counters the observer compares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfaceCounters {
    /// `tx_packets`.
    pub tx_packets: u64,
    /// `tx_bytes`.
    pub tx_bytes: u64,
    /// `tx_dropped`.
    pub tx_dropped: u64,
    /// `rx_packets`.
    pub rx_packets: u64,
    /// `rx_bytes`.
    pub rx_bytes: u64,
    /// `rx_dropped`.
    pub rx_dropped: u64,
}

impl From<&Stats64> for IfaceCounters {
    fn from(s: &Stats64) -> Self {
        Self {
            tx_packets: s.tx_packets,
            tx_bytes: s.tx_bytes,
            tx_dropped: s.tx_dropped,
            rx_packets: s.rx_packets,
            rx_bytes: s.rx_bytes,
            rx_dropped: s.rx_dropped,
        }
    }
}

/// Reads `ifindex`'s counters.
pub fn read(ifindex: u32) -> Result<IfaceCounters, ObserveError> {
    let fail = |detail: String| ObserveError::Stats { ifindex, detail };
    let mut nl = tc::netlink::Netlink::open().map_err(|e| fail(format!("socket: {e}")))?;
    let mut msg = LinkMessage::default();
    msg.header.index = ifindex;
    let mut body = vec![0u8; msg.buffer_len()];
    msg.emit(&mut body);
    let replies = nl
        .request(RTM_GETLINK, 0, &body)
        .map_err(|e| fail(format!("RTM_GETLINK: {}", e.source)))?;
    let reply = replies
        .first()
        .ok_or_else(|| fail("RTM_GETLINK returned no link".into()))?;
    let link = LinkMessage::parse(reply.as_slice())
        .map_err(|e| fail(format!("parsing RTM_NEWLINK: {e}")))?;
    from_message(&link).ok_or_else(|| fail("the reply has no IFLA_STATS64".into()))
}

/// The counters in a parsed link message, if it has `IFLA_STATS64`.
fn from_message(link: &LinkMessage) -> Option<IfaceCounters> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Stats64(s) => Some(IfaceCounters::from(s)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_counters_are_readable_and_monotonic() {
        // Read-only; every namespace has lo at index 1.
        let a = read(1).expect("lo has stats");
        let b = read(1).expect("lo has stats");
        assert!(b.tx_bytes >= a.tx_bytes && b.rx_packets >= a.rx_packets);
    }

    #[test]
    fn message_without_stats_gives_none() {
        assert_eq!(from_message(&LinkMessage::default()), None);
    }
}
