//! Host isolation through masquerading (`shaper_common::nat`): the map of
//! LAN hosts by connection, the LAN-side classifier that fills it, and the
//! lookup the pacer over hosts makes in it.
//!
//! `shaper_nat_lan` runs at the ingress of each LAN interface, before the
//! router's SNAT, and never changes a packet or its verdict. It writes an
//! entry only when the connection is new or its LAN host changed, so a
//! busy connection costs a lookup per packet, not a write.
//!
//! One map serves one `--nat` run: the controller pins it and every object
//! of the run (the WAN's pacer, the IFB's pacer, each LAN's classifier)
//! loads with it. A connection not found is weighed by its own addresses.

use aya_ebpf::{macros::classifier, macros::map, maps::LruHashMap, programs::TcContext};
use shaper_common::{
    config::{FLAG_NO_L2, PacerConfig},
    counters::Counter,
    hosts::Side,
    nat::{NAT_ENTRIES, NatKey, lan_key, lan_side, wan_key},
};

use crate::{
    hook::Direction,
    hook::TC_ACT_UNSPEC,
    maps::{CONFIG, count},
    parse::{Class, ipv4_ports},
};

/// The LAN host's IPv4 address word by connection.
#[map(name = "SHAPER_NAT")]
pub static NAT: LruHashMap<NatKey, u32> = LruHashMap::with_max_entries(NAT_ENTRIES, 0);

#[classifier]
pub fn shaper_nat_lan(ctx: TcContext) -> i32 {
    record(&ctx);
    TC_ACT_UNSPEC
}

/// Records the LAN host of the packet's connection, when it has ports.
#[inline(always)]
fn record(ctx: &TcContext) {
    let has_l2 = CONFIG.get(0).is_none_or(|c| c.flags & FLAG_NO_L2 == 0);
    let Some(p) = ipv4_ports(ctx, has_l2) else {
        return;
    };
    let key = lan_key(p.dst, p.ports, p.proto);
    // SAFETY: the pointer comes from the map lookup and stays valid for
    // this program run; a racing writer stores a whole u32.
    let known = NAT.get_ptr(&key).map(|v| unsafe { v.read_volatile() });
    if known != Some(p.src) {
        // A full map forgets its least recently used connection.
        let _ = NAT.insert(&key, &p.src, 0);
    }
}

/// The packet's address words `(src, dst)` with the LAN side's replaced
/// by the recorded LAN host: on the upload (egress) the source, on the
/// download (an IFB fed from ingress, or the policer) the destination, as
/// `dir` says.
/// `words` are the source's, the destination's and the word after a
/// 20-byte IPv4 header (the ports); packets with options or without ports
/// (`class.ports_off`) are not looked up.
#[inline(always)]
pub(crate) fn through_nat(
    (config, dir): (&PacerConfig, Direction),
    class: &Class,
    words: (u32, u32, u32),
) -> (u32, u32) {
    let (src, dst, ports) = words;
    // The parse sets `ports_off` for whole TCP and UDP headers only.
    if class.ports_off != class.ecn.l3_off + 20 {
        return (src, dst);
    }
    let upload = dir.upload(config);
    let key = wan_key(upload, src, dst, ports, class.l4_proto);
    let found = NAT.get_ptr(&key);
    count(
        if found.is_some() {
            Counter::NatFound
        } else {
            Counter::NatMissed
        },
        1,
    );
    let Some(lan) = found else {
        return (src, dst);
    };
    // SAFETY: as in `record`.
    let lan = unsafe { lan.read_volatile() };
    match lan_side(upload) {
        Side::Src => (lan, dst),
        Side::Dst => (src, lan),
    }
}
