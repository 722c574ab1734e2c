//! Bounded header parsing for the classifier.
//!
//! Reads headers with `bpf_skb_load_bytes` (via `TcContext::load`), which
//! works on non-linear skbs and fails cleanly past the end, so a short frame
//! is classified as truncated instead of being misread.
//!
//! Handles: Ethernet with up to two 802.1Q/802.1ad tags, or no L2 header at
//! all (PPP, WireGuard, tun: the config says which); IPv4 with options and
//! fragments; IPv6 with up to four extension headers; TCP, UDP, ICMP, ICMPv6.
//! Non-goals: tunnels (GRE, VXLAN) are classified by their outer header.

use aya_ebpf::programs::TcContext;
use shaper_common::counters::Counter;

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
}

/// Why a frame could not be classified.
pub struct Truncated;

/// Classifies the frame. `has_l2` is false on devices without a link-layer
/// header, where `skb->protocol` gives the network protocol.
#[inline(always)]
pub fn classify(ctx: &TcContext, has_l2: bool) -> Result<Class, Truncated> {
    let mut off = 0usize;
    let mut proto;
    let mut vlan = false;
    if has_l2 {
        proto = load_be16(ctx, 12)?;
        off = ETH_HLEN;
        for _ in 0..MAX_VLAN_TAGS {
            if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
                break;
            }
            vlan = true;
            proto = load_be16(ctx, off + 2)?;
            off += VLAN_HLEN;
        }
    } else {
        // SAFETY: reading a field of the __sk_buff the kernel passed in.
        proto = u16::from_be(unsafe { (*ctx.skb.skb).protocol } as u16);
    }
    let (l4, headers_len) = match proto {
        ETH_P_IP => {
            let (c, end) = ipv4(ctx, off)?;
            (Some(c), end)
        }
        ETH_P_IPV6 => {
            let (c, end) = ipv6(ctx, off)?;
            (Some(c), end)
        }
        _ => (None, 0),
    };
    let l3 = match proto {
        ETH_P_IP => Counter::Ipv4,
        ETH_P_IPV6 => Counter::Ipv6,
        _ => Counter::NonIp,
    };
    Ok(Class {
        l3,
        l4,
        vlan,
        // Headers are a few hundred bytes at most, so this cannot truncate.
        headers_len: headers_len as u32,
    })
}

/// IPv4 at `off`: checks the header is whole, then the transport header
/// unless this is a non-first fragment.
#[inline(always)]
fn ipv4(ctx: &TcContext, off: usize) -> Result<(Counter, usize), Truncated> {
    let ver_ihl = load_u8(ctx, off)?;
    let ihl = usize::from(ver_ihl & 0x0f) * 4;
    if ihl < 20 {
        return Err(Truncated);
    }
    // Last byte of the header, options included, must be present.
    load_u8(ctx, off + ihl - 1)?;
    let frag = load_be16(ctx, off + 6)?;
    let proto = load_u8(ctx, off + 9)?;
    let first_fragment = frag & 0x1fff == 0;
    transport(ctx, off + ihl, proto, first_fragment)
}

/// IPv6 at `off`: skips extension headers to the transport header.
#[inline(always)]
fn ipv6(ctx: &TcContext, off: usize) -> Result<(Counter, usize), Truncated> {
    load_u8(ctx, off + 39)?;
    let mut next = load_u8(ctx, off + 6)?;
    let mut l4 = off + 40;
    let mut first_fragment = true;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let hdr_len = usize::from(load_u8(ctx, l4 + 1)?);
                next = load_u8(ctx, l4)?;
                l4 += (hdr_len + 1) * 8;
            }
            IPPROTO_FRAGMENT => {
                let frag = load_be16(ctx, l4 + 2)?;
                first_fragment = frag & 0xfff8 == 0;
                next = load_u8(ctx, l4)?;
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
    transport(ctx, l4, next, first_fragment)
}

/// Checks the transport header at `off` is whole and names its class.
/// Also returns where a TCP or UDP payload starts (0 for other protocols
/// and for non-first fragments, which carry no transport header).
#[inline(always)]
fn transport(
    ctx: &TcContext,
    off: usize,
    proto: u8,
    whole: bool,
) -> Result<(Counter, usize), Truncated> {
    let (class, min_len) = match proto {
        IPPROTO_TCP => (Counter::Tcp, 20),
        IPPROTO_UDP => (Counter::Udp, 8),
        IPPROTO_ICMP | IPPROTO_ICMPV6 => (Counter::Icmp, 4),
        _ => return Ok((Counter::OtherIp, 0)),
    };
    if !whole {
        return Ok((class, 0));
    }
    load_u8(ctx, off + min_len - 1)?;
    match class {
        Counter::Tcp => {
            let doff = usize::from(load_u8(ctx, off + 12)? >> 4) * 4;
            if doff < 20 {
                return Err(Truncated);
            }
            load_u8(ctx, off + doff - 1)?;
            Ok((class, off + doff))
        }
        Counter::Udp => Ok((class, off + min_len)),
        _ => Ok((class, 0)),
    }
}

#[inline(always)]
fn load_u8(ctx: &TcContext, off: usize) -> Result<u8, Truncated> {
    ctx.load::<u8>(off).map_err(|_| Truncated)
}

#[inline(always)]
fn load_be16(ctx: &TcContext, off: usize) -> Result<u16, Truncated> {
    ctx.load::<u16>(off)
        .map(u16::from_be)
        .map_err(|_| Truncated)
}
