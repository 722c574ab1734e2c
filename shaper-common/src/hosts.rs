//! Host isolation: hosts share the rate first, then the flows of a host
//! share what their host gets, with the isolation modes of CAKE (sch_cake.c,
//! `tc-cake(8)`: `flows`, `srchost`, `dsthost`, `hosts`, `dual-srchost`,
//! `dual-dsthost`, `triple-isolate`).
//!
//! Method: weighted fair pacing, the weights set by the hosts.
//! - Each flow is paced at the multiplier `m` times its host's *bulk*
//!   flows `n` ([`flow_mult`]): those paced in the last or the current
//!   activity window, as CAKE weighs a flow by its host's bulk flow count.
//!   A flow below its share is never paced, so it does not dilute its host
//!   (a phone's idle connections do not shrink its call). `n` is a count:
//!   the step is one more multiplication, never a division.
//! - The water level ([`crate::fair`]) is kept over hosts: a host counts
//!   active once per window (the multiplier's cap is the active hosts plus
//!   one) and backlogged once per epoch (the join rule acts when a host
//!   joins). A committed flow counts with the weight `1/n`, from a table
//!   ([`crate::committed`]), so the floor is the committed hosts' share of
//!   the link, in hosts. With every flow of a host backlogged, `m` settles
//!   where `sum over hosts of min(r_h, C/m) = C`; when some leave part of
//!   their host's share unused, `m` falls below 1.0 and the host's other
//!   flows take it up ([`crate::fair::Level::HOSTS`]).
//! - With few units, a TCP flow returning from a reduction while `m` was
//!   lowered for it is unpaced until it reaches its share, and the others
//!   fill theirs meanwhile: the floor then counts the unpaced traffic too
//!   ([`crate::fair::unpaced_floor`]).
//! - `triple-isolate` weighs a flow by the larger of its source's and its
//!   destination's counts (CAKE's `max(srchost load, dsthost load)`), and
//!   counts the *unit* side's hosts in the water level: the sources on
//!   egress (upload, the LAN's devices), the destinations on ingress
//!   (download).
//! - `srchost`, `dsthost` and `hosts` have no second level: a flow *is* its
//!   host (or host pair), so they only narrow the flow key
//!   ([`Isolation::flow_key`]).
//!
//! Invariants: a host's count is within [1, [`HOST_FLOWS_MAX`]]; a lone
//! flow of a lone host is paced as without isolation; no flow is paced
//! faster than the rate (its multiplier is at least 1.0); a flow leaves the
//! committed count with the weight it joined with.
//!
//! Units: nanoseconds of CLOCK_MONOTONIC, epochs, Q16 multipliers and
//! weights.
//!
//! The policer ([`crate::police`]) has the same host level
//! ([`police_flow_of_host`]): a flow's eligibility clock runs at its least
//! share within its host, so the link's signals land on the flows of the
//! hosts above their share.
//!
//! Non-goals: weights per host; the NAT lookup that gives a packet its host
//! (the caller's).

use crate::{
    committed::WEIGHT_ONE,
    fair::{
        ACTIVE_WINDOW_SHIFT, CodelClock, FairParams, MULT_MAX, MULT_ONE, Packet, Verdict, decide,
        mark_once, period_mark, reciprocals_q16,
    },
    flow::{FlowEntry, FlowHasher, counted_flows, with_counted_flows},
    police::{Action, LinkState, Policed, n_active, police_link_at},
    shared::{Field, Shared, join, move_clock},
};

/// The most bulk flows a host's count holds: beyond, its flows are paced
/// as if it had this many (a share below 1/1024 of the host's matters
/// little, and the product with the multiplier stays in range).
pub const HOST_FLOWS_MAX: u64 = 1024;

const _: () = assert!(MULT_ONE / HOST_FLOWS_MAX == crate::fair::Level::HOSTS.mult_min_q16);

/// `1/n` in Q16 for `n` in 1..=[`HOST_FLOWS_MAX`] (index 0 holds 1.0): the
/// weight of a flow of a host with `n` bulk flows, by table, so the packet
/// path never divides.
const WEIGHT_Q16: [u32; HOST_FLOWS_MAX as usize + 1] = reciprocals_q16(1 << 16);

/// The weight in the committed count of a flow whose host has `n` bulk
/// flows: `1/n` in Q16 ([`WEIGHT_ONE`] for `n` 0 or 1, the least for `n`
/// beyond [`HOST_FLOWS_MAX`]).
#[inline(always)]
pub fn flow_weight(n: u64) -> u64 {
    let n = if n > HOST_FLOWS_MAX {
        HOST_FLOWS_MAX
    } else {
        n
    };
    // `get` rather than indexing: no panic path for the verifier to reject.
    WEIGHT_Q16
        .get(n as usize)
        .map_or(WEIGHT_ONE, |&w| u64::from(w))
}

/// How flows are isolated: CAKE's modes, by their keywords.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u32)]
pub enum Isolation {
    /// Flows share equally, whatever their hosts.
    Flows = 0,
    /// A flow is its source address.
    SrcHost = 1,
    /// A flow is its destination address.
    DstHost = 2,
    /// A flow is its address pair.
    Hosts = 3,
    /// Source hosts share first, then their flows.
    DualSrcHost = 4,
    /// Destination hosts share first, then their flows.
    DualDstHost = 5,
    /// Hosts of the link's own side share first (sources on egress,
    /// destinations on ingress), then flows, each weighed by the busier of
    /// its two hosts.
    #[default]
    TripleIsolate = 6,
}

/// Which address of a packet names a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Side {
    /// The source address.
    Src = 1,
    /// The destination address.
    Dst = 2,
}

/// What identifies a flow in the flow table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowKey {
    /// The 5-tuple (addresses, protocol, ports).
    FiveTuple,
    /// The source address alone.
    Src,
    /// The destination address alone.
    Dst,
    /// The address pair.
    Pair,
}

/// The hosts a packet's flow is weighed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostLevels {
    /// The host whose share the flow splits; the water level counts it.
    pub unit: Side,
    /// Another host whose bulk flows also weigh the flow (triple-isolate).
    pub peer: Option<Side>,
}

impl Isolation {
    /// Every mode with its keyword, in CAKE's order.
    pub const KEYWORDS: [(&'static str, Isolation); 7] = [
        ("flows", Isolation::Flows),
        ("srchost", Isolation::SrcHost),
        ("dsthost", Isolation::DstHost),
        ("hosts", Isolation::Hosts),
        ("dual-srchost", Isolation::DualSrcHost),
        ("dual-dsthost", Isolation::DualDstHost),
        ("triple-isolate", Isolation::TripleIsolate),
    ];

    /// The mode named `word`, as `tc-cake(8)` spells it.
    pub fn from_keyword(word: &str) -> Option<Self> {
        Self::KEYWORDS
            .iter()
            .find(|(k, _)| *k == word)
            .map(|&(_, mode)| mode)
    }

    /// The mode's keyword.
    pub fn keyword(self) -> &'static str {
        // Every mode is in the table.
        Self::KEYWORDS
            .iter()
            .find(|(_, mode)| *mode == self)
            .map_or("flows", |&(k, _)| k)
    }

    /// The mode stored as `v` (a configuration word); `None` for a value
    /// no mode has.
    #[inline(always)]
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Isolation::Flows,
            1 => Isolation::SrcHost,
            2 => Isolation::DstHost,
            3 => Isolation::Hosts,
            4 => Isolation::DualSrcHost,
            5 => Isolation::DualDstHost,
            6 => Isolation::TripleIsolate,
            _ => return None,
        })
    }

    /// What identifies a flow under this mode.
    pub fn flow_key(self) -> FlowKey {
        match self {
            Isolation::SrcHost => FlowKey::Src,
            Isolation::DstHost => FlowKey::Dst,
            Isolation::Hosts => FlowKey::Pair,
            Isolation::Flows
            | Isolation::DualSrcHost
            | Isolation::DualDstHost
            | Isolation::TripleIsolate => FlowKey::FiveTuple,
        }
    }

    /// The hosts a flow is weighed by, on egress (`upload`: the LAN's
    /// devices are the sources) or on ingress; `None` without a host
    /// level.
    pub fn levels(self, upload: bool) -> Option<HostLevels> {
        let (own, other) = if upload {
            (Side::Src, Side::Dst)
        } else {
            (Side::Dst, Side::Src)
        };
        match self {
            Isolation::DualSrcHost => Some(HostLevels {
                unit: Side::Src,
                peer: None,
            }),
            Isolation::DualDstHost => Some(HostLevels {
                unit: Side::Dst,
                peer: None,
            }),
            Isolation::TripleIsolate => Some(HostLevels {
                unit: own,
                peer: Some(other),
            }),
            Isolation::Flows | Isolation::SrcHost | Isolation::DstHost | Isolation::Hosts => None,
        }
    }
}

/// The key of a host's state: a hash of which side it is on, the tin and
/// its address (`addr`, the address's 32-bit words in network order, an
/// IPv4 address as one word; none for a frame without an IP header), with
/// the flow table's seed.
#[inline(always)]
pub fn host_key(seed: u64, side: Side, tin: usize, addr: &[u32]) -> u64 {
    let mut h = FlowHasher::new(seed);
    h.word(((tin as u32) << 8) | side as u32);
    for w in addr {
        h.word(*w);
    }
    h.finish()
}

/// What a mode selects, as 0/1 factors for a step without branches (the
/// BPF verifier walks each branch's outcome apart): the flow table's hash
///  and the unit and peer keys as
/// sums of the candidates times these factors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selectors {
    /// Factors of the 5-tuple's, the source's, the destination's and the
    /// pair's hash in the flow table's hash.
    pub flow: [u64; 4],
    /// Factors of the flow table's hash, the source's and the
    /// destination's key in the unit key.
    pub unit: [u64; 3],
    /// The peer weighs the flow (triple-isolate); its key is then the side
    /// the unit is not.
    pub peer: u64,
}

impl Selectors {
    /// The factors for `mode` on egress (`upload`) or ingress.
    pub fn of(mode: Isolation, upload: bool) -> Self {
        let flow = match mode.flow_key() {
            FlowKey::FiveTuple => [1, 0, 0, 0],
            FlowKey::Src => [0, 1, 0, 0],
            FlowKey::Dst => [0, 0, 1, 0],
            FlowKey::Pair => [0, 0, 0, 1],
        };
        let (unit, peer) = match mode.levels(upload) {
            Some(l) => (
                match l.unit {
                    Side::Src => [0, 1, 0],
                    Side::Dst => [0, 0, 1],
                },
                u64::from(l.peer.is_some()),
            ),
            None => ([1, 0, 0], 0),
        };
        Self { flow, unit, peer }
    }

    /// The flow table's hash: the 5-tuple's, or the narrowed key's ([`Isolation::flow_key`]).
    #[inline(always)]
    pub fn flow_hash(&self, flow_hash: u64, src_key: u64, dst_key: u64) -> u64 {
        let pair = src_key ^ dst_key.rotate_left(17);
        flow_hash
            .wrapping_mul(self.flow[0])
            .wrapping_add(src_key.wrapping_mul(self.flow[1]))
            .wrapping_add(dst_key.wrapping_mul(self.flow[2]))
            .wrapping_add(pair.wrapping_mul(self.flow[3]))
    }

    /// The unit's and the peer's keys: the unit side's key ([`Isolation::levels`]), or the flow's own without a host level; the
    /// peer's key is the other side's whether or not it weighs.
    #[inline(always)]
    pub fn keys(&self, flow_hash: u64, src_key: u64, dst_key: u64) -> (u64, u64) {
        let unit = flow_hash
            .wrapping_mul(self.unit[0])
            .wrapping_add(src_key.wrapping_mul(self.unit[1]))
            .wrapping_add(dst_key.wrapping_mul(self.unit[2]));
        // The other side: the source's when the unit is the destination.
        let peer = src_key
            .wrapping_mul(self.unit[2])
            .wrapping_add(dst_key.wrapping_mul(1 - self.unit[2]));
        (unit, peer)
    }
}

/// One host's state: 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostEntry {
    /// The mark of the activity window `bulk_now` counts in
    /// ([`crate::fair::period_mark`]); 0 for never.
    pub window: u32,
    /// The host's flows paced in that window.
    pub bulk_now: u32,
    /// Its flows paced in the window before (0 if the host sent nothing
    /// then).
    pub bulk_last: u32,
    /// Marks the epoch in which the host was last counted as backlogged;
    /// 0 for never.
    pub backlog_epoch: u32,
}

const _: () = assert!(core::mem::size_of::<HostEntry>() == 16);

/// Moves `host` to the activity window of `epoch`; true the first time per
/// window, when the caller counts the host active. The count in progress
/// becomes the last when the window is the next one, and both restart
/// after a longer gap.
#[inline(always)]
pub fn host_window(host: &mut HostEntry, epoch: u64) -> bool {
    let window = epoch >> ACTIVE_WINDOW_SHIFT;
    let next = host.window != 0 && host.window == period_mark(window.wrapping_sub(1));
    if !mark_once(&mut host.window, window) {
        return false;
    }
    host.bulk_last = if next { host.bulk_now } else { 0 };
    host.bulk_now = 0;
    true
}

/// The host's weight: its bulk flows of the last or the current window,
/// within [1, [`HOST_FLOWS_MAX`]].
#[inline(always)]
pub fn host_flows(host: &HostEntry) -> u64 {
    let n = u64::from(if host.bulk_now > host.bulk_last {
        host.bulk_now
    } else {
        host.bulk_last
    });
    n.clamp(1, HOST_FLOWS_MAX)
}

/// The multiplier a flow of a host weighing `host_flows` is paced at:
/// `m × n`, within [1.0, [`MULT_MAX`]): `m` itself may lie below 1.0
/// under isolation, but no flow is paced faster than the rate.
#[inline(always)]
pub fn flow_mult(mult_q16: u64, host_flows: u64) -> u64 {
    // m < 2^32 and n <= 2^10: the product fits.
    let n = if host_flows > HOST_FLOWS_MAX {
        HOST_FLOWS_MAX
    } else {
        host_flows
    };
    let m = (mult_q16 & (MULT_MAX - 1)) * n;
    m.clamp(MULT_ONE, MULT_MAX - 1)
}

/// The pacer's step with a host level ([`crate::shared::pace`] over
/// hosts): `host` is the unit the water level counts, `peer` the other
/// side's host, whose bulk flows weigh the flow too when `peer_weighs` (1
/// under triple-isolate, else 0: a 0/1 factor, so the BPF verifier walks
/// one path). Counts the host active, decides the flow's packet at `m`
/// times its count ([`flow_mult`]), moves the flow's clock in the
/// committed count with its weight (`COMMITTED`; the flow keeps the count
/// it joined with, [`counted_flows`]), counts a paced flow in its hosts'
/// bulk flows once per window (`flow.active_epoch` marks that: the flow
/// itself is not counted active under a host level), and lets a host newly
/// backlogged in this epoch join. The caller then accounts a kept packet,
/// as without hosts.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn pace_hosts<S: Shared, const COMMITTED: bool>(
    s: &mut S,
    flow: &mut FlowEntry,
    host: &mut HostEntry,
    peer: (&mut HostEntry, u64),
    pkt: &Packet,
    epoch: u64,
    mult_q16: u64,
    p: &FairParams,
) -> Verdict {
    let n = host_count(s, host, peer.0, peer.1, epoch);
    pace_flow_of_host::<S, COMMITTED>(s, flow, (host, peer.0), n, pkt, epoch, mult_q16, p)
}

/// The first half of [`pace_hosts`], which needs no flow: moves both hosts
/// to the window of `epoch`, counts the unit host active, and returns the
/// count the flow is weighed by, veiled ([`Shared::opaque`]), so that the
/// BPF program can take it before the flow table's lookup and the
/// branches here end in one verifier state.
#[inline(always)]
pub fn host_count<S: Shared>(
    s: &mut S,
    host: &mut HostEntry,
    peer: &mut HostEntry,
    peer_weighs: u64,
    epoch: u64,
) -> u64 {
    if host_window(host, epoch) {
        s.add(Field::ActiveNow, 1);
    }
    host_window(peer, epoch);
    let n = host_flows(host);
    let m = host_flows(peer) * (peer_weighs & 1);
    s.opaque(if m > n { m } else { n })
}

/// The second half of [`pace_hosts`]: the flow's packet at `m` times the
/// count `n` ([`host_count`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn pace_flow_of_host<S: Shared, const COMMITTED: bool>(
    s: &mut S,
    flow: &mut FlowEntry,
    (host, peer): (&mut HostEntry, &mut HostEntry),
    n: u64,
    pkt: &Packet,
    epoch: u64,
    mult_q16: u64,
    p: &FairParams,
) -> Verdict {
    let clock_before = flow.t_next_ns;
    // Each value that comes out of a clamp or a table is veiled: its
    // branches then end in one verifier state.
    let m = s.opaque(flow_mult(mult_q16, n));
    let verdict = decide(flow, pkt, m, p, CodelClock::Departure);
    if COMMITTED && flow.t_next_ns != clock_before {
        let was = s.opaque(flow_weight(u64::from(counted_flows(flow.flags))));
        let weight = s.opaque(flow_weight(n));
        if move_clock(s, clock_before, flow.t_next_ns, was, weight) {
            flow.flags = with_counted_flows(flow.flags, n as u32);
        }
    }
    if COMMITTED && verdict == Verdict::Pass {
        s.add(Field::Unpaced, pkt.tx_ns);
    }
    if matches!(verdict, Verdict::Pace { .. } | Verdict::Mark { .. }) {
        if mark_once(&mut flow.active_epoch, epoch >> ACTIVE_WINDOW_SHIFT) {
            host.bulk_now = host.bulk_now.saturating_add(1);
            peer.bulk_now = peer.bulk_now.saturating_add(1);
        }
        if mark_once(&mut host.backlog_epoch, epoch) {
            join(s, mult_q16);
        }
    }
    verdict
}

/// How far, in CoDel targets as a power of two, a flow's eligibility
/// clock may run ahead of its least share before the policer over hosts
/// signals it: four targets (20 ms at the defaults).
///
/// Why: over flows every flow's least share is the same, and a burst that
/// makes one eligible makes any other so. Over hosts a lone flow's least
/// share is many times its neighbours', and a window's packets arriving
/// back to back put its clock a packet or two ahead at any rate: with no
/// slack the link's signals fell on it at a fifth of the rate where half
/// was its share. The slack also lets a lone flow's peak stand a little
/// above its share, where a lone flow's sawtooth must peak to average it
/// without a queue. Four targets brought a host's lone download closest
/// to its half: two left it shorter in the guest, and eight shorter in
/// the simulator (`docs/ingress.md`, "Hosts under the policer", has the
/// figures). It bounds what the flows together can run ahead of the rate
/// to about four targets of it.
pub const ELIGIBLE_SLACK_SHIFT: u32 = 2;

/// The policer's step over hosts ([`crate::shared::police_step`] with a
/// host level), after [`host_count`] gave the flow's weight `n`:
/// - the flow's eligibility clock runs at the least share of a flow of its
///   host, `C / (hosts × n)` with `hosts` the active hosts ([`n_active`]
///   over hosts), and the flow is eligible for the link's signals beyond
///   [`ELIGIBLE_SLACK_SHIFT`] ahead of it: they go to the flows of hosts
///   above their share, never to a flow below its host's least share;
/// - its fair clock (the overload rule's) runs at `m` times `n`
///   ([`flow_mult`]), `m` kept over hosts with the floor of 1.0 the
///   policer keeps over flows ([`crate::fair::Level::FLOWS`]);
/// - a flow counts in its hosts' bulk flows once per window when its
///   eligibility clock is ahead at all (it sends at its least share or
///   above): under the policer that is what a queue is behind a pacer.
///   Counting only the eligible flows shrank a host's count, which raised
///   its flows' least share, which made fewer eligible: in the simulator
///   the upstream FIFO then overflowed;
/// - its host joins once per epoch when the flow is behind its fair
///   clock, as a flow does over flows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn police_flow_of_host<S: Shared>(
    s: &mut S,
    flow: &mut FlowEntry,
    (host, peer): (&mut HostEntry, &mut HostEntry),
    n: u64,
    link: &mut LinkState,
    pkt: &Packet,
    epoch: u64,
    mult_q16: u64,
    p: &FairParams,
) -> Policed {
    let hosts = n_active(s.load(Field::ActiveLast), s.load(Field::ActiveNow));
    // Veiled, as in `pace_flow_of_host`: each comes out of a clamp.
    let m = s.opaque(flow_mult(mult_q16, n));
    // Both factors are bounded (the active count by the cap's range, `n`
    // by HOST_FLOWS_MAX), so the product fits.
    let least = s.opaque(hosts.saturating_mul(n.clamp(1, HOST_FLOWS_MAX)));
    // A shift, not a saturating product: one verifier state (targets are
    // at most seconds, far below the shift's overflow).
    let slack_ns = s.opaque(p.codel.target_ns << ELIGIBLE_SLACK_SHIFT);
    let r = police_link_at(flow, link, pkt, m, least << 16, slack_ns, p);
    if r.action != Action::Drop {
        if r.ahead && mark_once(&mut flow.active_epoch, epoch >> ACTIVE_WINDOW_SHIFT) {
            host.bulk_now = host.bulk_now.saturating_add(1);
            peer.bulk_now = peer.bulk_now.saturating_add(1);
        }
        if r.virtual_delay_ns > 0 && mark_once(&mut host.backlog_epoch, epoch) {
            join(s, mult_q16);
        }
    }
    r
}

#[cfg(test)]
mod tests;
