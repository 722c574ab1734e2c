//! Bounded header parsing for the classifier.
//!
//! Each read takes its bytes straight from the skb's linear area when they
//! lie there (direct packet access, bounds-checked against `data_end`, no
//! helper call). Only a read past the linear area, in a non-linear skb or a
//! short frame, goes through `bpf_skb_load_bytes` (`TcContext::load`), which
//! reads paged data too and fails cleanly past the end, so a short frame is
//! classified as truncated instead of being misread. The choice is made per
//! read, in [`Frame::read`], so the parse exists once; a second whole pass
//! for the helper would double the states the verifier walks.
//!
//! Handles: Ethernet with up to two 802.1Q/802.1ad tags, or no L2 header at
//! all (PPP, WireGuard, tun: the config says which); IPv4 with options and
//! fragments; IPv6 with up to four extension headers; TCP, UDP, ICMP, ICMPv6.
//!
//! While parsing it hashes the flow key (`shaper_common::flow`): the outer
//! VLAN id, the ethertype, the addresses and protocol, and for TCP and UDP
//! (first fragments) the ports. It also notes where the ECN bits are, for
//! CE marking.
//!
//! Non-goals: tunnels (GRE, VXLAN) are classified by their outer header.

use core::mem::size_of;

use aya_ebpf::programs::TcContext;
use shaper_common::{counters::Counter, flow::FlowHasher};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;
const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
const MAX_VLAN_TAGS: usize = 2;
const MAX_IPV6_EXT_HEADERS: usize = 4;

const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_ICMPV6: u8 = 58;
const IPPROTO_DSTOPTS: u8 = 60;

/// The class a frame falls into, as counted.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Class {
    /// `Ipv4`, `Ipv6` or `NonIp`.
    pub l3: Counter,
    /// `Tcp`, `Udp`, `Icmp` or `OtherIp`, when `l3` is IP.
    pub l4: Option<Counter>,
    /// At least one VLAN tag was stripped.
    pub vlan: bool,
    /// Bytes of headers before a TCP or UDP payload (link layer included);
    /// 0 when there is no whole TCP/UDP header. Each GSO segment repeats them.
    pub headers_len: u32,
    /// The flow key's hash.
    pub flow_hash: u64,
    /// Where the ECN bits are; `Ecn::NONE` for non-IP frames.
    pub ecn: Ecn,
    /// The transport protocol of an IP packet; 0 otherwise.
    pub l4_proto: u8,
    /// TCP flags byte (FIN 0x01, RST 0x04); 0 for other packets.
    pub tcp_flags: u8,
    /// The ethertype after any VLAN tags (host order).
    pub ethertype: u16,
    /// Offset of the TCP or UDP ports; 0 when there are none (other
    /// protocols, non-first fragments). For telemetry's flow key, read
    /// only for sampled packets.
    pub ports_off: u32,
}

/// The key of frames that could not be parsed: flow 0, nothing to mark.
/// A plain value, not an `Option<Class>`: LLVM stores a `None`'s undefined
/// payload to the stack, which the verifier rejects (`!read_ok`).
pub const TRUNCATED: Class = Class {
    l3: Counter::Truncated,
    l4: None,
    vlan: false,
    headers_len: 0,
    flow_hash: 0,
    ecn: Ecn::NONE,
    l4_proto: 0,
    tcp_flags: 0,
    ethertype: 0,
    ports_off: 0,
};

/// What the transport-header step found.
pub struct L4 {
    /// `Tcp`, `Udp`, `Icmp` or `OtherIp`.
    class: Counter,
    /// Where a TCP or UDP payload starts; 0 for others.
    end: usize,
    /// Where the ports are; 0 when there are none.
    ports_off: usize,
    /// The IP protocol number.
    proto: u8,
    /// The TCP flags byte; 0 for others.
    tcp_flags: u8,
}

/// The position and value of an IP packet's ECN field.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Ecn {
    /// The packet is IP and the field is at `l3_off`.
    pub present: bool,
    /// Offset of the IP header.
    pub l3_off: u32,
    /// IPv4 (TOS byte 1, checksummed) or IPv6 (traffic class in bytes 0-1).
    pub ipv4: bool,
    /// The two ECN bits: 0 not-ECT, 1 ECT(1), 2 ECT(0), 3 CE.
    pub bits: u8,
    /// The DSCP, the traffic class's upper six bits (RFC 2474).
    pub dscp: u8,
}

impl Ecn {
    /// No ECN field (not IP).
    pub const NONE: Ecn = Ecn {
        present: false,
        l3_off: 0,
        ipv4: false,
        bits: 0,
        dscp: 0,
    };

    /// ECT(0), ECT(1) or already CE: the sender understands marks.
    #[inline(always)]
    pub fn capable(&self) -> bool {
        self.present && self.bits != 0
    }
}

/// Why a frame could not be classified.
pub struct Truncated;

/// How the parser reads bytes of the frame at an offset from its start.
trait Frame {
    /// `size_of::<T>()` bytes at `off`, or `Truncated` when the frame is
    /// shorter.
    fn read<T: Copy>(&self, off: usize) -> Result<T, Truncated>;

    /// `4 × N` bytes at `off` as `N` words, each holding its four bytes in
    /// memory order (`u32::to_ne_bytes` gives them back), or `Truncated`
    /// when the frame is shorter.
    fn words<const N: usize>(&self, off: usize) -> Result<[u32; N], Truncated>;
}

/// The skb: bytes in its linear area are read in place, others are copied
/// out by the helper.
struct Skb<'a>(&'a TcContext);

impl Frame for Skb<'_> {
    #[inline(always)]
    fn read<T: Copy>(&self, off: usize) -> Result<T, Truncated> {
        let at = self.0.data() + off;
        if at + size_of::<T>() <= self.0.data_end() {
            // SAFETY: the bytes lie in the linear area, checked against
            // `data_end` just above (the verifier checks the same bound);
            // the read is unaligned as headers are only 2-byte aligned.
            return Ok(unsafe { (at as *const T).read_unaligned() });
        }
        self.0.load(off).map_err(|_| Truncated)
    }

    #[inline(always)]
    fn words<const N: usize>(&self, off: usize) -> Result<[u32; N], Truncated> {
        let at = self.0.data() + off;
        if at + 4 * N <= self.0.data_end() {
            let mut w = [0u32; N];
            for (i, word) in w.iter_mut().enumerate() {
                // SAFETY: the word lies in the linear area, checked against
                // `data_end` just above, as the verifier checks it.
                *word = unsafe { load_word(at + 4 * i) };
            }
            return Ok(w);
        }
        self.0.load(off).map_err(|_| Truncated)
    }
}

/// The four bytes at `at` as one load. Headers are 2-byte aligned at best
/// and the target has no misaligned loads, so a plain read of a `u32`
/// there compiles to four byte loads and three shifts and ORs. The
/// verifier refuses a misaligned load from packet data only under strict
/// alignment: a program loaded with `BPF_F_STRICT_ALIGNMENT`, or a kernel
/// for an architecture without cheap misaligned access
/// (`CONFIG_HAVE_EFFICIENT_UNALIGNED_ACCESS`), which x86-64 and arm64,
/// the shaper's targets, both have.
///
/// # Safety
/// `at` must be a packet address whose four bytes lie before `data_end`,
/// checked on the same value.
#[inline(always)]
unsafe fn load_word(at: usize) -> u32 {
    let v: u64;
    // SAFETY: the caller's contract; one load, no other effect.
    unsafe {
        core::arch::asm!(
            "{0} = *(u32 *)({1} + 0)",
            lateout(reg) v,
            in(reg) at,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    v as u32
}

/// Classifies the frame. `has_l2` is false on devices without a link-layer
/// header, where `skb->protocol` gives the network protocol.
#[inline(always)]
pub fn classify(ctx: &TcContext, has_l2: bool, seed: u64) -> Result<Class, Truncated> {
    parse(&Skb(ctx), ctx, has_l2, seed)
}

/// The frame's DSCP (RFC 2474), read ahead of [`classify`] so that the
/// tin, and with it the fair state to roll, is known before the parse:
/// the roll then runs while one verifier state reaches it, not one per
/// header shape. The link and VLAN headers as [`classify`] walks them; 0
/// for a frame that is not IP or is cut short.
#[inline(always)]
pub fn dscp(ctx: &TcContext, has_l2: bool) -> u8 {
    dscp_of(&Skb(ctx), ctx, has_l2).unwrap_or(0)
}

#[inline(always)]
fn dscp_of<F: Frame>(f: &F, ctx: &TcContext, has_l2: bool) -> Result<u8, Truncated> {
    let (proto, off, _) = link_header(f, ctx, has_l2, None)?;
    // The traffic class: IPv4's second byte; IPv6's four bits after the
    // version and the next four.
    let word = load_be16(f, off)?;
    Ok(match proto {
        ETH_P_IP => (word as u8) >> 2,
        ETH_P_IPV6 => ((word >> 4) as u8) >> 2,
        _ => 0,
    })
}

/// An IPv4 TCP or UDP packet as the NAT record keys it
/// (`shaper_common::nat`): address words, ports' word and protocol, each
/// as loaded (network byte order).
#[derive(Clone, Copy)]
pub struct Ipv4Ports {
    /// The source address.
    pub src: u32,
    /// The destination address.
    pub dst: u32,
    /// The source port in the first two bytes, the destination's in the
    /// last two.
    pub ports: u32,
    /// The IP protocol.
    pub proto: u8,
}

/// The frame's [`Ipv4Ports`], through the link and VLAN headers as
/// [`classify`] walks them; `None` for other frames, non-first fragments,
/// protocols without ports and frames cut short. The LAN side's parse,
/// which needs no flow key.
#[inline(always)]
pub fn ipv4_ports(ctx: &TcContext, has_l2: bool) -> Option<Ipv4Ports> {
    ipv4_ports_of(&Skb(ctx), ctx, has_l2).ok().flatten()
}

#[inline(always)]
fn ipv4_ports_of<F: Frame>(
    f: &F,
    ctx: &TcContext,
    has_l2: bool,
) -> Result<Option<Ipv4Ports>, Truncated> {
    let (proto, off, _) = link_header(f, ctx, has_l2, None)?;
    if proto != ETH_P_IP {
        return Ok(None);
    }
    let [w0, w1, w2, src, dst] = f.words::<5>(off)?;
    let [ver_ihl, _, _, _] = w0.to_ne_bytes();
    let [_, _, frag_hi, frag_lo] = w1.to_ne_bytes();
    let [_, proto, _, _] = w2.to_ne_bytes();
    let ihl = usize::from(ver_ihl & 0x0f) * 4;
    let frag = u16::from_be_bytes([frag_hi, frag_lo]);
    if ihl < 20 || frag & 0x1fff != 0 || !shaper_common::nat::has_ports(proto) {
        return Ok(None);
    }
    let [ports] = f.words::<1>(off + ihl)?;
    Ok(Some(Ipv4Ports {
        src,
        dst,
        ports,
        proto,
    }))
}

/// The link header and its VLAN tags: the network protocol, where its
/// header starts, and whether a tag was there. With `h`, the outer tag's
/// VLAN id goes into the flow key. On a device without a link-layer
/// header, `skb->protocol` names the protocol.
#[inline(always)]
fn link_header<F: Frame>(
    f: &F,
    ctx: &TcContext,
    has_l2: bool,
    mut h: Option<&mut FlowHasher>,
) -> Result<(u16, usize, bool), Truncated> {
    if !has_l2 {
        // SAFETY: reading a field of the __sk_buff the kernel passed in.
        let proto = u16::from_be(unsafe { (*ctx.skb.skb).protocol } as u16);
        return Ok((proto, 0, false));
    }
    let mut proto = load_be16(f, 12)?;
    let mut off = ETH_HLEN;
    let mut vlan = false;
    for _ in 0..MAX_VLAN_TAGS {
        if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
            break;
        }
        if !vlan && let Some(h) = h.as_deref_mut() {
            // The outer tag's VLAN id is part of the key.
            h.word(u32::from(load_be16(f, off)? & 0x0fff));
        }
        vlan = true;
        proto = load_be16(f, off + 2)?;
        off += VLAN_HLEN;
    }
    Ok((proto, off, vlan))
}

/// One parse of the frame through `f`.
#[inline(always)]
fn parse<F: Frame>(f: &F, ctx: &TcContext, has_l2: bool, seed: u64) -> Result<Class, Truncated> {
    let mut h = FlowHasher::new(seed);
    let (proto, off, vlan) = link_header(f, ctx, has_l2, Some(&mut h))?;
    h.word(u32::from(proto));
    let mut ecn = Ecn::NONE;
    let l4 = match proto {
        ETH_P_IP => {
            let (l4, tos) = ipv4(f, off, &mut h)?;
            ecn = Ecn {
                present: true,
                l3_off: off as u32,
                ipv4: true,
                bits: tos & 0x03,
                dscp: tos >> 2,
            };
            Some(l4)
        }
        ETH_P_IPV6 => {
            let (l4, tclass) = ipv6(f, off, &mut h)?;
            ecn = Ecn {
                present: true,
                l3_off: off as u32,
                ipv4: false,
                bits: tclass & 0x03,
                dscp: tclass >> 2,
            };
            Some(l4)
        }
        _ => None,
    };
    let l3 = match proto {
        ETH_P_IP => Counter::Ipv4,
        ETH_P_IPV6 => Counter::Ipv6,
        _ => Counter::NonIp,
    };
    // Headers are a few hundred bytes at most, so the casts cannot truncate.
    let (l4_class, headers_len, ports_off, l4_proto, tcp_flags) = match l4 {
        Some(x) => (
            Some(x.class),
            x.end as u32,
            x.ports_off as u32,
            x.proto,
            x.tcp_flags,
        ),
        None => (None, 0, 0, 0, 0),
    };
    Ok(Class {
        l3,
        l4: l4_class,
        vlan,
        headers_len,
        flow_hash: h.finish(),
        ecn,
        l4_proto,
        tcp_flags,
        ethertype: proto,
        ports_off,
    })
}

/// IPv4 at `off`: checks the header is whole, then the transport header
/// unless this is a non-first fragment.
/// Also returns the TOS byte and hashes addresses, protocol and ports.
#[inline(always)]
fn ipv4<F: Frame>(f: &F, off: usize, h: &mut FlowHasher) -> Result<(L4, u8), Truncated> {
    let [w0, w1, w2, src, dst] = f.words::<5>(off)?;
    let [ver_ihl, tos, _, _] = w0.to_ne_bytes();
    let [_, _, frag_hi, frag_lo] = w1.to_ne_bytes();
    let [_, proto, _, _] = w2.to_ne_bytes();
    let ihl = usize::from(ver_ihl & 0x0f) * 4;
    if ihl < 20 {
        return Err(Truncated);
    }
    // Last byte of the header, options included, must be present.
    if ihl > 20 {
        load_u8(f, off + ihl - 1)?;
    }
    let frag = u16::from_be_bytes([frag_hi, frag_lo]);
    h.word(src);
    h.word(dst);
    let first_fragment = frag & 0x1fff == 0;
    let l4 = transport(f, off + ihl, proto, first_fragment, h)?;
    Ok((l4, tos))
}

/// IPv6 at `off`: skips extension headers to the transport header.
/// Also returns the traffic class and hashes addresses, protocol and ports.
#[inline(always)]
fn ipv6<F: Frame>(f: &F, off: usize, h: &mut FlowHasher) -> Result<(L4, u8), Truncated> {
    let hdr = f.words::<10>(off)?;
    for w in &hdr[2..10] {
        h.word(*w);
    }
    let first = u32::from_be(hdr[0]);
    let tclass = ((first >> 20) & 0xff) as u8;
    let mut next = ((u32::from_be(hdr[1]) >> 8) & 0xff) as u8;
    let mut l4 = off + 40;
    let mut first_fragment = true;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                // Next header, then length in 8-octet units less one.
                let [n, hdr_len] = f.read::<[u8; 2]>(l4)?;
                next = n;
                l4 += (usize::from(hdr_len) + 1) * 8;
            }
            IPPROTO_FRAGMENT => {
                // Next header, reserved, offset and flags.
                let [n, _, off_hi, off_lo] = f.read::<[u8; 4]>(l4)?;
                first_fragment = u16::from_be_bytes([off_hi, off_lo]) & 0xfff8 == 0;
                next = n;
                l4 += 8;
                if !first_fragment {
                    // `next` names the first header of the fragmentable part,
                    // which only the first fragment carries (RFC 8200, 4.5):
                    // the rest is payload, not headers to walk.
                    break;
                }
            }
            _ => break,
        }
    }
    let l4 = transport(f, l4, next, first_fragment, h)?;
    Ok((l4, tclass))
}

/// Checks the transport header at `off` is whole and names its class.
/// Also returns where a TCP or UDP payload starts (0 for other protocols
/// and for non-first fragments, which carry no transport header).
#[inline(always)]
fn transport<F: Frame>(
    f: &F,
    off: usize,
    proto: u8,
    whole: bool,
    h: &mut FlowHasher,
) -> Result<L4, Truncated> {
    h.word(u32::from(proto));
    let none = |class| L4 {
        class,
        end: 0,
        ports_off: 0,
        proto,
        tcp_flags: 0,
    };
    let (class, min_len) = match proto {
        IPPROTO_TCP => (Counter::Tcp, 20),
        IPPROTO_UDP => (Counter::Udp, 8),
        IPPROTO_ICMP | IPPROTO_ICMPV6 => (Counter::Icmp, 4),
        _ => return Ok(none(Counter::OtherIp)),
    };
    if !whole {
        return Ok(none(class));
    }
    match class {
        Counter::Tcp => {
            let [ports, _, _, w3, _] = f.words::<5>(off)?;
            let [doff_byte, tcp_flags, _, _] = w3.to_ne_bytes();
            h.word(ports);
            let doff = usize::from(doff_byte >> 4) * 4;
            if doff < 20 {
                return Err(Truncated);
            }
            if doff > 20 {
                load_u8(f, off + doff - 1)?;
            }
            Ok(L4 {
                class,
                end: off + doff,
                ports_off: off,
                proto,
                tcp_flags,
            })
        }
        Counter::Udp => {
            let [ports, _] = f.words::<2>(off)?;
            h.word(ports);
            Ok(L4 {
                class,
                end: off + min_len,
                ports_off: off,
                proto,
                tcp_flags: 0,
            })
        }
        _ => {
            load_u8(f, off + min_len - 1)?;
            Ok(none(class))
        }
    }
}

#[inline(always)]
fn load_u8<F: Frame>(f: &F, off: usize) -> Result<u8, Truncated> {
    f.read::<u8>(off)
}

#[inline(always)]
fn load_be16<F: Frame>(f: &F, off: usize) -> Result<u16, Truncated> {
    f.read::<[u8; 2]>(off).map(u16::from_be_bytes)
}
