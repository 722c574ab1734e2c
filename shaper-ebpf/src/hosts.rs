//! The egress pacer's host level (`shaper_common::hosts`): each packet's
//! source and destination hosts, keyed from its IP header, and the hosts'
//! state in an LRU hash map, which forgets the hosts longest unseen when
//! full. Only the programs over hosts (`shaper_egress_hosts` and
//! `shaper_police_hosts`, and their `_nat` twins, which find the LAN host
//! through `crate::nat`) use it; the flow pacer's and the policer's
//! programs have no host lookups. The policer's hosts are its own (it
//! loads as an object of its own).
//!
//! A frame without an IP header, or too short to hold 40 bytes from it, is
//! one host on each side. Keys are hashes
//! (`shaper_common::hosts::host_key`): two hosts with the same hash share
//! state, with probability about 2^-64 per pair.

use aya_ebpf::{macros::map, maps::LruHashMap, programs::TcContext};
use shaper_common::{
    config::PacerConfig,
    hosts::{HostEntry, Selectors, Side, host_count, host_key},
    shared::Shared,
};

use crate::{hook::Direction, nat::through_nat, parse::Class, veil::Veil};

/// Hosts whose state is kept at once, per tin and side.
pub(crate) const HOST_ENTRIES: u32 = 16_384;

/// The hosts' state by [`host_key`].
#[map(name = "SHAPER_HOSTS")]
pub static HOSTS: LruHashMap<u64, HostEntry> = LruHashMap::with_max_entries(HOST_ENTRIES, 0);

/// A packet's hosts' keys.
#[derive(Clone, Copy)]
struct HostKeys {
    /// The source's.
    src: u64,
    /// The destination's.
    dst: u64,
}

/// The keys of the packet's hosts in tin `tin`, veiled: every header shape
/// ends in one verifier state. With `NAT` the LAN side's IPv4 host is the
/// one recorded before masquerading (`crate::nat`), in the direction
/// `dir` shapes.
#[inline(always)]
fn host_keys<const NAT: bool>(
    ctx: &TcContext,
    class: &Class,
    (config, dir): (&PacerConfig, Direction),
    tin: usize,
    veil: Veil,
) -> HostKeys {
    let (ecn, seed) = (&class.ecn, config.hash_seed);
    // One load of the same size for both versions, so that the paths differ
    // only in which words they hash: IPv4's addresses are words 3 and 4 (and
    // its ports word 5 after a header without options), IPv6's words 2 to 5
    // and 6 to 9. A frame too short for it is one host.
    let (src, dst) = match ctx.load::<[u32; 10]>(ecn.l3_off as usize) {
        Ok(w) if ecn.present && ecn.ipv4 => {
            let (s, d) = if NAT {
                through_nat((config, dir), class, (w[3], w[4], w[5]))
            } else {
                (w[3], w[4])
            };
            (
                host_key(seed, Side::Src, tin, &[s]),
                host_key(seed, Side::Dst, tin, &[d]),
            )
        }
        Ok(w) if ecn.present => (
            host_key(seed, Side::Src, tin, &w[2..6]),
            host_key(seed, Side::Dst, tin, &w[6..10]),
        ),
        _ => (
            host_key(seed, Side::Src, tin, &[]),
            host_key(seed, Side::Dst, tin, &[]),
        ),
    };
    HostKeys {
        src: veil.u64(src),
        dst: veil.u64(dst),
    }
}

/// The state of the host `key`; `None` on its first packet, which creates
/// it empty (the packet then passes unpaced: one path for the verifier
/// after the lookup, not two).
#[inline(always)]
fn host_entry(key: u64) -> Option<&'static mut HostEntry> {
    match HOSTS.get_ptr_mut(&key) {
        // SAFETY: the pointer comes from the map lookup and stays valid for
        // this program run; concurrent writers to one host are tolerated
        // as for a flow (see `shaper_common::fair`).
        Some(p) => Some(unsafe { &mut *p }),
        None => {
            // A full map forgets its least recently used host.
            let _ = HOSTS.insert(&key, &HostEntry::default(), 0);
            None
        }
    }
}

/// The configured mode's selectors ([`Selectors`]) in the direction `dir`
/// shapes, veiled: the mode's branches end in one verifier state.
#[inline(always)]
fn selectors(config: &PacerConfig, dir: Direction, veil: Veil) -> Selectors {
    let s = Selectors::of(config.isolation(), dir.upload(config));
    Selectors {
        flow: [
            veil.u64(s.flow[0]),
            veil.u64(s.flow[1]),
            veil.u64(s.flow[2]),
            veil.u64(s.flow[3]),
        ],
        unit: [
            veil.u64(s.unit[0]),
            veil.u64(s.unit[1]),
            veil.u64(s.unit[2]),
        ],
        peer: veil.u64(s.peer),
    }
}

/// A packet's hosts for the step over hosts: the unit host's state, the
/// peer's, and the count the flow is weighed by (`host_count`).
pub(crate) type Hosts = (&'static mut HostEntry, &'static mut HostEntry, u64);

/// The flow key and, with `HOSTS`, the hosts of a packet in tin `tin`, in
/// the direction `dir` shapes, as the programs over hosts take them before
/// the flow table's scan, so that the hosts' branches end first. Without
/// `HOSTS` the parse's flow key and no hosts. `None` on a host's first
/// packet, which creates its state: the caller passes it unpaced.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flow_hosts<const HOSTS: bool, const NAT: bool, S: Shared>(
    ctx: &TcContext,
    class: &Class,
    (config, dir): (&PacerConfig, Direction),
    tin: usize,
    veil: Veil,
    shared: &mut S,
    epoch: u64,
) -> Option<(u64, Option<Hosts>)> {
    if !HOSTS {
        return Some((class.flow_hash, None));
    }
    let sel = selectors(config, dir, veil);
    let keys = host_keys::<NAT>(ctx, class, (config, dir), tin, veil);
    let flow_hash = veil.u64(sel.flow_hash(class.flow_hash, keys.src, keys.dst));
    let (unit, peer) = sel.keys(flow_hash, keys.src, keys.dst);
    let (Some(host), Some(peer)) = (host_entry(veil.u64(unit)), host_entry(veil.u64(peer))) else {
        return None;
    };
    let n = host_count(shared, host, peer, sel.peer, epoch);
    Some((flow_hash, Some((host, peer, n))))
}
