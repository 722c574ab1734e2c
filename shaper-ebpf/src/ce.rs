//! The CE mark (RFC 3168) both classifiers set on an ECN-capable packet
//! instead of dropping it.

use aya_ebpf::programs::TcContext;
use shaper_common::ecn;

use crate::parse::Ecn;

/// Sets the ECN field to CE (RFC 3168). True when the packet carries CE
/// afterwards. An IPv4 header's TOS byte and checksum are rewritten by one
/// store (`shaper_common::ecn`), so a failure leaves the header whole;
/// false then, and for a packet that is not ECN-capable, which the caller
/// drops instead, as CoDel drops what it cannot mark.
#[inline(always)]
pub(crate) fn mark_ce(ctx: &TcContext, e: Ecn) -> bool {
    if !e.present {
        return false;
    }
    if e.bits == ecn::CE {
        return true;
    }
    let off = e.l3_off as usize;
    if e.ipv4 {
        let Ok(mut h) = ctx.load::<[u8; ecn::IPV4_CE_SPAN]>(off) else {
            return false;
        };
        ecn::ipv4_set_ce(&mut h) && ctx.store(off, &h, 0).is_ok()
    } else {
        let Ok(mut b1) = ctx.load::<u8>(off + 1) else {
            return false;
        };
        ecn::ipv6_set_ce(&mut b1) && ctx.store(off + 1, &b1, 0).is_ok()
    }
}
