//! Synthetic frames for `BPF_PROG_TEST_RUN`: Ethernet with 0, 1 or 2 VLAN
//! tags (802.1Q or 802.1ad), then ARP, a raw ethertype (LLDP, ...), IPv4
//! (options, fragments) or IPv6 (extension headers), then TCP (options), UDP,
//! ICMP or ICMPv6.
//!
//! Every built frame comes with its [`Layout`] (where each header starts and
//! ends), so a test can cut it inside exactly the header it means with
//! [`Packet::truncated`].
//!
//! Invariants: length fields (IPv4 total length and IHL, IPv6 payload length,
//! extension header lengths, TCP data offset, UDP length) are consistent with
//! the bytes; the IPv4 header checksum is correct; transport checksums are
//! zero. Addresses come from the documentation ranges (RFC 5737, RFC 3849).
//!
//! Non-goals: parsing, valid transport checksums, tunnels, and Ethernet
//! padding to 60 bytes unless asked for ([`Frame::pad_to`]).

use std::ops::Range;

/// Ethertype of IPv4.
pub const ETH_P_IP: u16 = 0x0800;
/// Ethertype of ARP.
pub const ETH_P_ARP: u16 = 0x0806;
/// Ethertype of IPv6.
pub const ETH_P_IPV6: u16 = 0x86dd;
/// Ethertype of LLDP, a non-IP protocol.
pub const ETH_P_LLDP: u16 = 0x88cc;
/// Length of an Ethernet header without tags.
pub const ETH_HLEN: usize = 14;
/// Length of one VLAN tag.
pub const VLAN_HLEN: usize = 4;

/// IP protocol numbers used here.
pub mod ipproto {
    /// IPv6 hop-by-hop options.
    pub const HOPOPTS: u8 = 0;
    /// ICMP.
    pub const ICMP: u8 = 1;
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// IPv6 routing header.
    pub const ROUTING: u8 = 43;
    /// IPv6 fragment header.
    pub const FRAGMENT: u8 = 44;
    /// GRE (an IP protocol the classifier counts as "other").
    pub const GRE: u8 = 47;
    /// ICMPv6.
    pub const ICMPV6: u8 = 58;
    /// IPv6 destination options.
    pub const DSTOPTS: u8 = 60;
}

/// The tag protocol identifier of a VLAN tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tpid {
    /// 802.1Q customer tag, 0x8100.
    Dot1Q,
    /// 802.1ad service tag (QinQ outer tag), 0x88a8.
    Dot1Ad,
}

impl Tpid {
    /// The ethertype value announcing this tag.
    pub fn ethertype(self) -> u16 {
        match self {
            Tpid::Dot1Q => 0x8100,
            Tpid::Dot1Ad => 0x88a8,
        }
    }
}

/// A transport header and its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// TCP with raw option bytes (padded with NOPs to a multiple of 4).
    Tcp {
        /// Option bytes before padding.
        options: Vec<u8>,
        /// Payload bytes after the header.
        payload_len: usize,
    },
    /// UDP.
    Udp {
        /// Payload bytes after the 8-byte header.
        payload_len: usize,
    },
    /// ICMP echo request (IP protocol 1).
    Icmp {
        /// Payload bytes after the 8-byte echo header.
        payload_len: usize,
    },
    /// ICMPv6 echo request (IP protocol 58).
    Icmpv6 {
        /// Payload bytes after the 8-byte echo header.
        payload_len: usize,
    },
    /// Another protocol: `payload_len` opaque bytes.
    Other {
        /// IP protocol number.
        protocol: u8,
        /// Bytes after the IP header.
        payload_len: usize,
    },
}

impl Transport {
    /// TCP without options, 32 bytes of payload.
    pub fn tcp() -> Self {
        Transport::Tcp {
            options: Vec::new(),
            payload_len: 32,
        }
    }

    /// TCP with the options of a typical SYN: MSS 1460, SACK permitted,
    /// timestamps, window scale 7 (20 bytes, data offset 10).
    pub fn tcp_syn_options() -> Self {
        let options = vec![
            2, 4, 0x05, 0xb4, // MSS 1460
            4, 2, // SACK permitted
            8, 10, 0, 0, 0, 1, 0, 0, 0, 0, // timestamps
            1, // NOP
            3, 3, 7, // window scale 7
        ];
        Transport::Tcp {
            options,
            payload_len: 0,
        }
    }

    /// UDP with 32 bytes of payload.
    pub fn udp() -> Self {
        Transport::Udp { payload_len: 32 }
    }

    /// ICMP echo request with 32 bytes of payload.
    pub fn icmp() -> Self {
        Transport::Icmp { payload_len: 32 }
    }

    /// ICMPv6 echo request with 32 bytes of payload.
    pub fn icmpv6() -> Self {
        Transport::Icmpv6 { payload_len: 32 }
    }

    /// `payload_len` opaque bytes of IP protocol `protocol`, no header.
    pub fn other(protocol: u8, payload_len: usize) -> Self {
        Transport::Other {
            protocol,
            payload_len,
        }
    }

    /// The IP protocol number announcing this header.
    pub fn protocol(&self) -> u8 {
        match self {
            Transport::Tcp { .. } => ipproto::TCP,
            Transport::Udp { .. } => ipproto::UDP,
            Transport::Icmp { .. } => ipproto::ICMP,
            Transport::Icmpv6 { .. } => ipproto::ICMPV6,
            Transport::Other { protocol, .. } => *protocol,
        }
    }

    /// Appends the header and payload to `out`; returns (header range,
    /// options range) relative to `out`.
    fn encode(&self, out: &mut Vec<u8>) -> (Range<usize>, Option<Range<usize>>) {
        let start = out.len();
        match self {
            Transport::Tcp {
                options,
                payload_len,
            } => {
                let mut opts = options.clone();
                while !opts.len().is_multiple_of(4) {
                    opts.push(1); // NOP
                }
                let hlen = 20 + opts.len();
                assert!(hlen <= 60, "TCP options too long: {} bytes", opts.len());
                out.extend_from_slice(&40000u16.to_be_bytes()); // source port
                out.extend_from_slice(&443u16.to_be_bytes()); // destination port
                out.extend_from_slice(&1u32.to_be_bytes()); // sequence
                out.extend_from_slice(&0u32.to_be_bytes()); // acknowledgment
                out.push(((hlen / 4) as u8) << 4); // data offset
                out.push(0x02); // SYN
                out.extend_from_slice(&65535u16.to_be_bytes()); // window
                out.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
                let opt_start = out.len();
                out.extend_from_slice(&opts);
                let opt_range = (!opts.is_empty()).then_some(opt_start..out.len());
                let header = start..out.len();
                out.resize(out.len() + payload_len, 0x5a);
                (header, opt_range)
            }
            Transport::Udp { payload_len } => {
                out.extend_from_slice(&40000u16.to_be_bytes());
                out.extend_from_slice(&53u16.to_be_bytes());
                out.extend_from_slice(&((8 + payload_len) as u16).to_be_bytes());
                out.extend_from_slice(&[0, 0]); // checksum
                let header = start..out.len();
                out.resize(out.len() + payload_len, 0x5a);
                (header, None)
            }
            Transport::Icmp { payload_len } | Transport::Icmpv6 { payload_len } => {
                let echo_request = if matches!(self, Transport::Icmp { .. }) {
                    8
                } else {
                    128
                };
                out.extend_from_slice(&[echo_request, 0, 0, 0]); // type, code, checksum
                out.extend_from_slice(&[0x12, 0x34, 0, 1]); // identifier, sequence
                let header = start..out.len();
                out.resize(out.len() + payload_len, 0x5a);
                (header, None)
            }
            Transport::Other { payload_len, .. } => {
                out.resize(out.len() + payload_len, 0x5a);
                (start..start, None)
            }
        }
    }
}

/// An IPv4 packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv4 {
    options: Vec<u8>,
    fragment_offset_8: u16,
    more_fragments: bool,
    transport: Transport,
}

impl Ipv4 {
    /// An unfragmented IPv4 packet without options carrying `transport`.
    pub fn new(transport: Transport) -> Self {
        Self {
            options: Vec::new(),
            fragment_offset_8: 0,
            more_fragments: false,
            transport,
        }
    }

    /// Adds raw option bytes (padded with End-of-Options to a multiple of 4,
    /// at most 40).
    pub fn options(mut self, options: &[u8]) -> Self {
        self.options = options.to_vec();
        self
    }

    /// Makes this a fragment: `offset_8` in units of 8 bytes (0 = first
    /// fragment), `more` = the MF flag.
    pub fn fragment(mut self, offset_8: u16, more: bool) -> Self {
        assert!(
            offset_8 < 1 << 13,
            "fragment offset {offset_8} does not fit 13 bits"
        );
        self.fragment_offset_8 = offset_8;
        self.more_fragments = more;
        self
    }
}

/// One IPv6 extension header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtHeader {
    /// Hop-by-hop options, `(len_8 + 1) * 8` bytes of PadN.
    HopByHop {
        /// The Hdr Ext Len field: length in 8-byte units, not counting the first 8.
        len_8: u8,
    },
    /// Destination options, `(len_8 + 1) * 8` bytes of PadN.
    DestOpts {
        /// The Hdr Ext Len field.
        len_8: u8,
    },
    /// A type-4 (segment routing) style routing header with no segments left.
    Routing,
    /// Fragment header (8 bytes).
    Fragment {
        /// Offset in 8-byte units (0 = first fragment).
        offset_8: u16,
        /// The M (more fragments) flag.
        more: bool,
    },
}

impl ExtHeader {
    /// A fragment header: `offset_8` in 8-byte units, `more` = the M flag.
    pub fn fragment(offset_8: u16, more: bool) -> Self {
        ExtHeader::Fragment { offset_8, more }
    }

    fn protocol(self) -> u8 {
        match self {
            ExtHeader::HopByHop { .. } => ipproto::HOPOPTS,
            ExtHeader::DestOpts { .. } => ipproto::DSTOPTS,
            ExtHeader::Routing => ipproto::ROUTING,
            ExtHeader::Fragment { .. } => ipproto::FRAGMENT,
        }
    }

    /// Appends the header, announcing `next`.
    fn encode(self, next: u8, out: &mut Vec<u8>) {
        match self {
            ExtHeader::HopByHop { len_8 } | ExtHeader::DestOpts { len_8 } => {
                let len = (usize::from(len_8) + 1) * 8;
                out.extend_from_slice(&[next, len_8]);
                // One PadN option filling the remaining len - 2 bytes.
                out.extend_from_slice(&[1, (len - 4) as u8]);
                out.resize(out.len() + len - 4, 0);
            }
            ExtHeader::Routing => {
                // Next, Hdr Ext Len 0, routing type 4, segments left 0, 4 reserved.
                out.extend_from_slice(&[next, 0, 4, 0, 0, 0, 0, 0]);
            }
            ExtHeader::Fragment { offset_8, more } => {
                assert!(
                    offset_8 < 1 << 13,
                    "fragment offset {offset_8} does not fit 13 bits"
                );
                let field = (offset_8 << 3) | u16::from(more);
                out.extend_from_slice(&[next, 0]);
                out.extend_from_slice(&field.to_be_bytes());
                out.extend_from_slice(&0x0bad_cafeu32.to_be_bytes()); // identification
            }
        }
    }
}

/// An IPv6 packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv6 {
    ext: Vec<ExtHeader>,
    transport: Transport,
}

impl Ipv6 {
    /// An IPv6 packet without extension headers carrying `transport`.
    pub fn new(transport: Transport) -> Self {
        Self {
            ext: Vec::new(),
            transport,
        }
    }

    /// Appends an extension header (they appear in call order).
    pub fn ext(mut self, header: ExtHeader) -> Self {
        self.ext.push(header);
        self
    }
}

/// What follows the Ethernet header and tags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Network {
    /// IPv4.
    Ipv4(Ipv4),
    /// IPv6.
    Ipv6(Ipv6),
    /// An ARP request for IPv4 over Ethernet.
    Arp,
    /// Any ethertype with opaque payload.
    Raw {
        /// The ethertype.
        ethertype: u16,
        /// The bytes after it.
        payload: Vec<u8>,
    },
}

/// Builds one Ethernet frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    vlans: Vec<(Tpid, u16)>,
    network: Network,
    pad_to: usize,
}

/// Where the headers of a built frame lie (byte offsets into the frame).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Start of each VLAN tag (its TPID), outermost first.
    pub vlan_tags: Vec<usize>,
    /// The network header: IPv4 (options included) or IPv6 (40 bytes), ARP,
    /// or the raw payload.
    pub l3: Range<usize>,
    /// The IPv4 options, if any.
    pub ip_options: Option<Range<usize>>,
    /// Each IPv6 extension header.
    pub ext_headers: Vec<Range<usize>>,
    /// The transport header (options included), if any.
    pub l4: Option<Range<usize>>,
    /// The TCP options, if any.
    pub l4_options: Option<Range<usize>>,
}

/// A built frame and its layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    /// The frame, from the destination MAC on.
    pub bytes: Vec<u8>,
    /// Where its headers are.
    pub layout: Layout,
}

impl Packet {
    /// Length of the frame in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True for an empty frame (never built by [`Frame`]).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The first `len` bytes of the frame (all of it when `len` is larger).
    pub fn truncated(&self, len: usize) -> Vec<u8> {
        self.bytes[..len.min(self.bytes.len())].to_vec()
    }
}

impl Frame {
    /// An Ethernet frame carrying `network`.
    pub fn new(network: Network) -> Self {
        Self {
            vlans: Vec::new(),
            network,
            pad_to: 0,
        }
    }

    /// IPv4 over Ethernet.
    pub fn ipv4(ip: Ipv4) -> Self {
        Self::new(Network::Ipv4(ip))
    }

    /// IPv6 over Ethernet.
    pub fn ipv6(ip: Ipv6) -> Self {
        Self::new(Network::Ipv6(ip))
    }

    /// An ARP request.
    pub fn arp() -> Self {
        Self::new(Network::Arp)
    }

    /// An LLDP frame (non-IP) with a minimal chassis-id, port-id, TTL and end TLV.
    pub fn lldp() -> Self {
        let payload = vec![
            0x02, 0x07, 0x04, 0x02, 0, 0, 0, 0, 1, // chassis id: MAC
            0x04, 0x02, 0x07, b'1', // port id: local "1"
            0x06, 0x02, 0, 120, // TTL 120 s
            0x00, 0x00, // end
        ];
        Self::new(Network::Raw {
            ethertype: ETH_P_LLDP,
            payload,
        })
    }

    /// Adds a VLAN tag with VLAN id `vid` inside the ones added before (the
    /// first call gives the outermost tag).
    pub fn vlan(mut self, tpid: Tpid, vid: u16) -> Self {
        assert!(vid < 4096, "VLAN id {vid} does not fit 12 bits");
        self.vlans.push((tpid, vid));
        self
    }

    /// Pads the frame with zeros to at least `len` bytes (60 for a minimum
    /// Ethernet frame without FCS). The padding is not part of any header.
    pub fn pad_to(mut self, len: usize) -> Self {
        self.pad_to = len;
        self
    }

    /// Encodes the frame.
    pub fn build(&self) -> Packet {
        let mut out = Vec::with_capacity(128);
        let mut layout = Layout::default();
        out.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]); // destination MAC
        out.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]); // source MAC
        for (tpid, vid) in &self.vlans {
            layout.vlan_tags.push(out.len());
            // TPID where an untagged frame has its ethertype, then the TCI
            // (priority 0, DEI 0, VLAN id).
            out.extend_from_slice(&tpid.ethertype().to_be_bytes());
            out.extend_from_slice(&vid.to_be_bytes());
        }
        let ethertype = match &self.network {
            Network::Ipv4(_) => ETH_P_IP,
            Network::Ipv6(_) => ETH_P_IPV6,
            Network::Arp => ETH_P_ARP,
            Network::Raw { ethertype, .. } => *ethertype,
        };
        out.extend_from_slice(&ethertype.to_be_bytes());
        let l3 = out.len();
        match &self.network {
            Network::Ipv4(ip) => encode_ipv4(ip, &mut out, &mut layout),
            Network::Ipv6(ip) => encode_ipv6(ip, &mut out, &mut layout),
            Network::Arp => {
                out.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]); // Ethernet/IPv4, request
                out.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01, 192, 0, 2, 1]); // sender
                out.extend_from_slice(&[0, 0, 0, 0, 0, 0, 192, 0, 2, 2]); // target
                layout.l3 = l3..out.len();
            }
            Network::Raw { payload, .. } => {
                out.extend_from_slice(payload);
                layout.l3 = l3..out.len();
            }
        }
        if out.len() < self.pad_to {
            out.resize(self.pad_to, 0);
        }
        Packet { bytes: out, layout }
    }
}

fn encode_ipv4(ip: &Ipv4, out: &mut Vec<u8>, layout: &mut Layout) {
    let start = out.len();
    let mut options = ip.options.clone();
    while !options.len().is_multiple_of(4) {
        options.push(0); // End of Options list
    }
    assert!(
        options.len() <= 40,
        "IPv4 options too long: {} bytes",
        options.len()
    );
    let ihl = 20 + options.len();
    out.push(0x40 | (ihl / 4) as u8);
    out.push(0); // DSCP/ECN
    out.extend_from_slice(&[0, 0]); // total length, set below
    out.extend_from_slice(&0x1234u16.to_be_bytes()); // identification
    let flags_frag = (u16::from(ip.more_fragments) << 13) | ip.fragment_offset_8;
    out.extend_from_slice(&flags_frag.to_be_bytes());
    out.push(64); // TTL
    out.push(ip.transport.protocol());
    out.extend_from_slice(&[0, 0]); // header checksum, set below
    out.extend_from_slice(&[192, 0, 2, 1]);
    out.extend_from_slice(&[198, 51, 100, 1]);
    if !options.is_empty() {
        layout.ip_options = Some(out.len()..out.len() + options.len());
    }
    out.extend_from_slice(&options);
    layout.l3 = start..out.len();
    let (l4, l4_options) = ip.transport.encode(out);
    if !l4.is_empty() {
        layout.l4 = Some(l4);
    }
    layout.l4_options = l4_options;
    let total = (out.len() - start) as u16;
    out[start + 2..start + 4].copy_from_slice(&total.to_be_bytes());
    let csum = internet_checksum(&out[start..start + ihl]);
    out[start + 10..start + 12].copy_from_slice(&csum.to_be_bytes());
}

fn encode_ipv6(ip: &Ipv6, out: &mut Vec<u8>, layout: &mut Layout) {
    let start = out.len();
    let first_next = ip
        .ext
        .first()
        .map_or(ip.transport.protocol(), |h| h.protocol());
    out.extend_from_slice(&[0x60, 0, 0, 0]); // version, traffic class, flow label
    out.extend_from_slice(&[0, 0]); // payload length, set below
    out.push(first_next);
    out.push(64); // hop limit
    out.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    out.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    layout.l3 = start..out.len();
    for (i, header) in ip.ext.iter().enumerate() {
        let next = ip
            .ext
            .get(i + 1)
            .map_or(ip.transport.protocol(), |h| h.protocol());
        let h_start = out.len();
        header.encode(next, out);
        layout.ext_headers.push(h_start..out.len());
    }
    let (l4, l4_options) = ip.transport.encode(out);
    if !l4.is_empty() {
        layout.l4 = Some(l4);
    }
    layout.l4_options = l4_options;
    let payload = (out.len() - start - 40) as u16;
    out[start + 4..start + 6].copy_from_slice(&payload.to_be_bytes());
}

/// An IPv4/UDP frame with a 200-byte payload, source port `sport` and ECN
/// bits `ecn`, its header checksum fixed.
pub fn udp4_ecn(sport: u16, ecn: u8) -> Packet {
    let mut p = Frame::ipv4(Ipv4::new(Transport::Udp { payload_len: 200 })).build();
    let l3 = p.layout.l3.start;
    p.bytes[l3 + 1] = (p.bytes[l3 + 1] & !3) | ecn;
    p.bytes[l3 + 10] = 0;
    p.bytes[l3 + 11] = 0;
    let ihl = usize::from(p.bytes[l3] & 0x0f) * 4;
    let sum = internet_checksum(&p.bytes[l3..l3 + ihl]);
    p.bytes[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
    let l4 = p.layout.l4.clone().expect("udp header").start;
    p.bytes[l4..l4 + 2].copy_from_slice(&sport.to_be_bytes());
    p
}

/// The RFC 1071 one's-complement checksum of `bytes`.
pub fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for pair in bytes.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn be16(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }

    #[test]
    fn ipv4_tcp_lengths_and_checksum() {
        let p = Frame::ipv4(Ipv4::new(Transport::tcp())).build();
        assert_eq!(p.len(), 14 + 20 + 20 + 32);
        assert_eq!(be16(&p.bytes, 12), ETH_P_IP);
        assert_eq!(p.layout.l3, 14..34);
        assert_eq!(p.bytes[14], 0x45);
        assert_eq!(usize::from(be16(&p.bytes, 16)), 20 + 20 + 32);
        assert_eq!(p.bytes[23], ipproto::TCP);
        // A correct header checksums to zero.
        assert_eq!(internet_checksum(&p.bytes[14..34]), 0);
        assert_eq!(p.layout.l4, Some(34..54));
        assert_eq!(p.bytes[34 + 12] >> 4, 5);
    }

    #[test]
    fn ipv4_options_and_fragment_fields() {
        let ip = Ipv4::new(Transport::udp())
            .options(&[0x94, 0x04, 0, 0])
            .fragment(185, true);
        let p = Frame::ipv4(ip).build();
        assert_eq!(p.bytes[14], 0x46);
        assert_eq!(p.layout.ip_options, Some(34..38));
        assert_eq!(be16(&p.bytes, 14 + 6), 0x2000 | 185);
        assert_eq!(internet_checksum(&p.bytes[14..38]), 0);
        assert_eq!(p.layout.l4, Some(38..46));
        assert_eq!(usize::from(be16(&p.bytes, 38 + 4)), 8 + 32);
    }

    #[test]
    fn tcp_options_are_padded_and_counted_in_data_offset() {
        let p = Frame::ipv4(Ipv4::new(Transport::tcp_syn_options())).build();
        let l4 = p.layout.l4.clone().expect("tcp");
        assert_eq!(l4.len(), 40);
        assert_eq!(p.bytes[l4.start + 12] >> 4, 10);
        assert_eq!(p.layout.l4_options, Some(l4.start + 20..l4.end));
        assert_eq!(p.len(), l4.end);
    }

    #[test]
    fn vlan_tags_in_order() {
        let p = Frame::ipv4(Ipv4::new(Transport::icmp()))
            .vlan(Tpid::Dot1Ad, 100)
            .vlan(Tpid::Dot1Q, 200)
            .build();
        assert_eq!(p.layout.vlan_tags, vec![12, 16]);
        assert_eq!(be16(&p.bytes, 12), 0x88a8);
        assert_eq!(be16(&p.bytes, 14), 100);
        assert_eq!(be16(&p.bytes, 16), 0x8100);
        assert_eq!(be16(&p.bytes, 18), 200);
        assert_eq!(be16(&p.bytes, 20), ETH_P_IP);
        assert_eq!(p.layout.l3.start, 22);
    }

    #[test]
    fn ipv6_extension_chain() {
        let ip = Ipv6::new(Transport::tcp())
            .ext(ExtHeader::HopByHop { len_8: 0 })
            .ext(ExtHeader::DestOpts { len_8: 1 })
            .ext(ExtHeader::Fragment {
                offset_8: 0,
                more: true,
            });
        let p = Frame::ipv6(ip).build();
        let b = &p.bytes;
        assert_eq!(b[14 + 6], ipproto::HOPOPTS);
        assert_eq!(p.layout.ext_headers, vec![54..62, 62..78, 78..86]);
        assert_eq!((b[54], b[55]), (ipproto::DSTOPTS, 0));
        assert_eq!((b[62], b[63]), (ipproto::FRAGMENT, 1));
        assert_eq!(b[78], ipproto::TCP);
        assert_eq!(be16(b, 80), 1); // M flag only
        assert_eq!(p.layout.l4, Some(86..106));
        assert_eq!(usize::from(be16(b, 18)), p.len() - 54);
    }

    #[test]
    fn arp_lldp_and_truncation() {
        let arp = Frame::arp().build();
        assert_eq!(be16(&arp.bytes, 12), ETH_P_ARP);
        assert_eq!(arp.len(), 42);
        let lldp = Frame::lldp().pad_to(60).build();
        assert_eq!(be16(&lldp.bytes, 12), ETH_P_LLDP);
        assert_eq!(lldp.len(), 60);
        assert_eq!(lldp.truncated(13).len(), 13);
        assert_eq!(lldp.truncated(1000).len(), 60);
    }
}
