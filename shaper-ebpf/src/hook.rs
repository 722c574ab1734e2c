//! What the egress pacer and the ingress policer do alike on every packet:
//! count it by class, parse its flow key, and find its entry in the flow
//! table, and which direction a program shapes ([`Direction`]). Both
//! programs load the same maps (each attachment loads its own
//! copy of the object, so an interface's egress and ingress never share a
//! flow table or a fair share).
//!
//! The clock is read and the epoch rolled before any of this
//! (`fair_state::roll`). The wire length is one `u32` from [`wire_len`]:
//! the pricing that follows stays written out in each program, since
//! returned from here in a struct it once pushed the policer past the
//! verifier's million-instruction limit.

use shaper_common::{
    config::{FLAG_DELIVERY_MONO, FLAG_NO_L2, PacerConfig},
    counters::Counter,
    flow::{FlowEntry, WAYS, Way, choose_way, set_and_tag},
};

use crate::{
    maps::{FLOWS, count},
    parse::{Class, Ecn, TRUNCATED, classify},
    veil::Veil,
};
use aya_ebpf::programs::TcContext;

/// `TC_ACT_UNSPEC`: "next", which lets later programs on the hook run and
/// then passes the packet, under TCX and under a direct-action cls_bpf.
pub(crate) const TC_ACT_UNSPEC: i32 = -1;
/// `TC_ACT_SHOT`: drop.
pub(crate) const TC_ACT_SHOT: i32 = 2;

/// What the packet costs on the link: its segments framed as the
/// configuration's [`Framing`](shaper_common::framing::Framing) says,
/// veiled, so the framing's branches end in one verifier state.
#[inline(always)]
pub fn wire_len(ctx: &TcContext, config: &PacerConfig, class: &Class, veil: Veil) -> u32 {
    // SAFETY: reading fields of the __sk_buff the kernel passed in.
    let (gso_segs, gso_size) = unsafe { ((*ctx.skb.skb).gso_segs, (*ctx.skb.skb).gso_size) };
    veil.u32(config.framing.wire_len(
        ctx.len(),
        gso_segs,
        gso_size,
        class.headers_len,
        class.ecn.l3_off,
    ))
}

/// Parses `ctx`'s frame and counts it by class; a frame cut short inside a
/// header it announces counts as truncated and gets flow 0. The fields the
/// rest of the program reads come back veiled ([`Veil`]): every header
/// shape the parse can take (each VLAN depth, IP version, transport,
/// option length, and whether a header was read in place or copied out)
/// then reaches the rest of the program in one verifier state instead of
/// one each, which keeps both programs under the verifier's
/// million-instruction limit.
#[inline(always)]
pub fn count_and_classify(ctx: &TcContext, config: &PacerConfig) -> Class {
    let class = match classify(ctx, config.flags & FLAG_NO_L2 == 0, config.hash_seed) {
        Ok(class) => {
            count(class.l3, 1);
            if let Some(l4) = class.l4 {
                count(l4, 1);
            }
            if class.vlan {
                count(Counter::Vlan, 1);
            }
            class
        }
        Err(_) => {
            count(Counter::Truncated, 1);
            TRUNCATED
        }
    };
    let v = Veil::new(config);
    Class {
        headers_len: v.u32(class.headers_len),
        flow_hash: v.u64(class.flow_hash),
        ecn: Ecn {
            present: v.bool(class.ecn.present),
            l3_off: v.u32(class.ecn.l3_off),
            ipv4: v.bool(class.ecn.ipv4),
            bits: v.u8(class.ecn.bits) & 0x03,
            dscp: v.u8(class.ecn.dscp) & 0x3f,
        },
        l4_proto: v.u8(class.l4_proto),
        tcp_flags: v.u8(class.tcp_flags),
        ethertype: v.u16(class.ethertype),
        ports_off: v.u32(class.ports_off),
        ..class
    }
}

/// The flow table entry for `flow_hash`, claimed afresh when its way was
/// idle (second value true), shared when every way of its set is busy.
/// `None` only when the set index is out of the map (never, with the
/// controller's mask).
#[inline(always)]
pub fn flow_entry(
    config: &PacerConfig,
    flow_hash: u64,
    now_ns: u64,
) -> Option<(&'static mut FlowEntry, bool)> {
    let (set_idx, tag) = set_and_tag(flow_hash, config.flow_sets_mask);
    let set = FLOWS.get_ptr_mut(set_idx)?;
    // SAFETY: the pointer comes from the map lookup and stays valid for this
    // program run; concurrent writers to one flow are tolerated (see
    // `shaper_common::fair`).
    let set = unsafe { &mut *set };
    let mut started = false;
    let way = match choose_way(set, tag, now_ns, config.flow_idle_ns) {
        Way::Hit(i) => i,
        Way::Claim(i) => {
            claim(&mut set.ways[i % WAYS], tag, now_ns);
            count(Counter::FlowNew, 1);
            started = true;
            i
        }
        Way::Shared(i) => {
            count(Counter::FlowTableFull, 1);
            i
        }
    };
    let way = opaque_way(config, way);
    Some((&mut set.ways[way], started))
}

/// `way`, with its value hidden from the verifier (a value in 0..WAYS it
/// cannot narrow). Each way choose_way can return is a different pointer
/// offset into the set, and the verifier cannot merge states that differ in
/// one; without this it walked the rest of the program once per way and the
/// policer ran past the million-instruction limit. The mask keeps any value
/// in range.
#[inline(always)]
fn opaque_way(config: &PacerConfig, way: usize) -> usize {
    (Veil::new(config).u64(way as u64) as usize) & (WAYS - 1)
}

/// Writes `FlowEntry::fresh(tag, now_ns)` into `w` field by field. A whole
/// struct assignment compiles to a call of a byte-by-byte memset loop over
/// its 40 zero bytes, which the verifier walks on every path (the policer
/// ran past its million-instruction limit on it).
#[inline(always)]
fn claim(w: &mut FlowEntry, tag: u32, now_ns: u64) {
    let fresh = FlowEntry::fresh(tag, now_ns);
    // SAFETY (all): each pointer is a field of `w`, aligned and writable;
    // volatile keeps LLVM from merging the stores back into a memset.
    unsafe {
        core::ptr::write_volatile(&raw mut w.tag, fresh.tag);
        core::ptr::write_volatile(&raw mut w.flags, fresh.flags);
        core::ptr::write_volatile(&raw mut w.t_next_ns, fresh.t_next_ns);
        core::ptr::write_volatile(&raw mut w.last_seen_ns, fresh.last_seen_ns);
        core::ptr::write_volatile(&raw mut w.codel.first_above_ns, fresh.codel.first_above_ns);
        core::ptr::write_volatile(&raw mut w.codel.drop_next_ns, fresh.codel.drop_next_ns);
        core::ptr::write_volatile(&raw mut w.codel.count, fresh.codel.count);
        core::ptr::write_volatile(&raw mut w.codel.last_count, fresh.codel.last_count);
        core::ptr::write_volatile(&raw mut w.codel.rec_inv_sqrt, fresh.codel.rec_inv_sqrt);
        core::ptr::write_volatile(&raw mut w.codel.dropping, fresh.codel.dropping);
        core::ptr::write_volatile(&raw mut w.backlog_epoch, fresh.backlog_epoch);
        core::ptr::write_volatile(&raw mut w.active_epoch, fresh.active_epoch);
    }
}

/// Which direction a program shapes.
#[derive(Clone, Copy)]
pub(crate) enum Direction {
    /// The egress pacer's: the upload on the WAN's egress, the download on
    /// an IFB fed from ingress (`FLAG_DELIVERY_MONO`), read from the
    /// configuration where it is used, so that no value carries the
    /// choice from one use to the next for the verifier to walk twice.
    ByConfig,
    /// The policer's, at ingress: always the download.
    Download,
}

impl Direction {
    /// Whether it is the upload, under `config`.
    #[inline(always)]
    pub(crate) fn upload(self, config: &PacerConfig) -> bool {
        match self {
            Direction::ByConfig => config.flags & FLAG_DELIVERY_MONO == 0,
            Direction::Download => false,
        }
    }
}
