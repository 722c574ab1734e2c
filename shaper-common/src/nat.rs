//! Host isolation through masquerading (`--nat`): the LAN host behind each
//! connection, so that host isolation ([`crate::hosts`]) weighs the LAN's
//! devices and not the router's one WAN address.
//!
//! Route: a classifier at the ingress of each LAN interface sees every
//! connection before source NAT, and records its LAN address under a key
//! that the WAN side can form again after the translation: the remote
//! address, the two ports and the protocol. Upload packets at the WAN's
//! egress (after SNAT) and download packets at its ingress or on its IFB
//! (before DNAT) carry the same remote address and ports, so the pacer
//! looks the key up and takes the recorded address for the LAN side's
//! host ([`lan_side`]). It needs no conntrack access, no BTF and no kfunc,
//! so it runs wherever the pacer runs.
//!
//! Invariants: a key names a connection by what NAT keeps (remote address
//! and port, the LAN host's port); keys of the two directions of one
//! connection are equal ([`lan_key`], [`wan_key`]).
//!
//! Limits, by construction: masquerading that rewrites the source port (two
//! LAN hosts with the same port to the same remote endpoint) makes the
//! rewritten connection miss, and a miss weighs the packet by its own
//! addresses; ICMP and non-first fragments carry no ports and are never
//! looked up; IPv6 is not translated and is never looked up.
//!
//! Units: addresses and ports are the packet's own words, in network byte
//! order as loaded.
//!
//! Non-goals: other translations than masquerading of the LAN (DNAT to a
//! LAN server is recorded by its replies; 1:1 NAT and NPTv6 are not).

use crate::hosts::Side;

/// The connections whose LAN host is kept at once; the least recently
/// seen are forgotten when full.
pub const NAT_ENTRIES: u32 = 65_536;

/// IP protocol numbers whose first four bytes are the two ports.
pub const PROTO_TCP: u8 = 6;
/// See [`PROTO_TCP`].
pub const PROTO_UDP: u8 = 17;

/// A connection as both sides of the NAT see it: the key of the LAN-host
/// map ([`crate::maps::NAT`]), whose value is the LAN host's IPv4 address
/// word.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NatKey {
    /// The remote (WAN-side) host's IPv4 address word.
    pub remote_addr: u32,
    /// The two ports' word: the LAN host's port in its first two bytes,
    /// the remote's in the last two, as a packet from the LAN carries them.
    pub ports: u32,
    /// The IP protocol.
    pub proto: u32,
}

const _: () = assert!(core::mem::size_of::<NatKey>() == 12);

/// Whether packets of IP protocol `proto` are looked up: those with ports.
#[inline(always)]
pub const fn has_ports(proto: u8) -> bool {
    proto == PROTO_TCP || proto == PROTO_UDP
}

/// The key of a packet arriving from the LAN (before SNAT), from its
/// destination address word, its ports' word and its protocol.
#[inline(always)]
pub const fn lan_key(dst_addr: u32, ports: u32, proto: u8) -> NatKey {
    NatKey {
        remote_addr: dst_addr,
        ports,
        proto: proto as u32,
    }
}

/// The key of a packet at the WAN: an upload (leaving, after SNAT) or a
/// download (arriving, before DNAT), from its address words, its ports'
/// word and its protocol. A download's ports are in the reverse order, so
/// their halves swap.
#[inline(always)]
pub const fn wan_key(upload: bool, src_addr: u32, dst_addr: u32, ports: u32, proto: u8) -> NatKey {
    if upload {
        lan_key(dst_addr, ports, proto)
    } else {
        lan_key(src_addr, ports.rotate_left(16), proto)
    }
}

/// The side of a WAN packet that is the LAN host: the source of an upload,
/// the destination of a download.
#[inline(always)]
pub const fn lan_side(upload: bool) -> Side {
    if upload { Side::Src } else { Side::Dst }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packet's address or ports word as loaded from its bytes.
    fn word(bytes: [u8; 4]) -> u32 {
        u32::from_ne_bytes(bytes)
    }

    fn ports(src: u16, dst: u16) -> u32 {
        let (s, d) = (src.to_be_bytes(), dst.to_be_bytes());
        word([s[0], s[1], d[0], d[1]])
    }

    #[test]
    fn both_directions_of_a_masqueraded_connection_find_the_lan_host() {
        let wan = word([203, 0, 113, 7]);
        let server = word([198, 51, 100, 80]);
        // From the LAN: 192.168.1.23:40000 -> server:443; SNAT keeps the
        // port and rewrites the source to the WAN address.
        let recorded = lan_key(server, ports(40_000, 443), PROTO_TCP);
        let up = wan_key(true, wan, server, ports(40_000, 443), PROTO_TCP);
        let down = wan_key(false, server, wan, ports(443, 40_000), PROTO_TCP);
        assert_eq!(up, recorded);
        assert_eq!(down, recorded);
        // Another LAN port, remote port, remote host or protocol is another
        // connection.
        for other in [
            wan_key(true, wan, server, ports(40_001, 443), PROTO_TCP),
            wan_key(true, wan, server, ports(40_000, 80), PROTO_TCP),
            wan_key(
                true,
                wan,
                word([198, 51, 100, 81]),
                ports(40_000, 443),
                PROTO_TCP,
            ),
            wan_key(true, wan, server, ports(40_000, 443), PROTO_UDP),
            // A download whose ports were not swapped back.
            lan_key(server, ports(443, 40_000), PROTO_TCP),
        ] {
            assert_ne!(other, recorded, "{other:?}");
        }
    }

    #[test]
    fn the_lan_host_is_the_source_up_and_the_destination_down() {
        assert_eq!(lan_side(true), Side::Src);
        assert_eq!(lan_side(false), Side::Dst);
        assert!(has_ports(PROTO_TCP) && has_ports(PROTO_UDP));
        assert!(!has_ports(1) && !has_ports(58) && !has_ports(0));
    }
}
