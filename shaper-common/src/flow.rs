//! The flow table: what a flow is, how it is hashed, and where its state
//! lives.
//!
//! What counts as a flow: TCP and UDP by 5-tuple (addresses, protocol,
//! ports), over IPv4 and IPv6, behind up to two VLAN tags (the outer VLAN id
//! is part of the key); ICMP, other IP protocols and non-first fragments by
//! address pair and protocol; each non-IP ethertype is one flow.
//!
//! Data structure: a set-associative table, as CAKE's flow hash is
//! (sch_cake.c, 8 ways), held in a BPF *array* map of [`FlowSet`]s: one map
//! lookup finds the set, a bounded scan of [`WAYS`] tags finds the way. No
//! hash-map lookups, no allocation on the packet path. A 64-bit hash of the
//! key gives the set (low bits, masked) and a 32-bit tag (high bits, never
//! zero, since 0 marks an empty way). Two keys with the same set and tag
//! share state, with probability about 2^-32 per lookup.
//!
//! Ageing: a way whose flow has no scheduled departure left and has been
//! idle longer than `idle_ns` is free for a new flow. When every way of a
//! set is busy, the least recently seen way whose clock is idle is taken
//! over (an idle clock means the flow holds nothing in sch_fq, so only its
//! CoDel history is lost). If all are backlogged, the new flow shares a way
//! with an existing one, as colliding flows do in CAKE, and the
//! `flow_table_full` counter says so.
//!
//! Units: nanoseconds of CLOCK_MONOTONIC. Non-goals: exact keys (the tag is a
//! hash); hosts, whose state is apart ([`crate::hosts`]).

use crate::codel::CodelState;

/// Ways per set.
pub const WAYS: usize = 8;

/// Default number of flows the table holds (sets × ways).
pub const DEFAULT_FLOWS: u32 = 65_536;

/// Default time after which an idle flow's way may be reused.
pub const DEFAULT_FLOW_IDLE_NS: u64 = 2_000_000_000;

/// [`FlowEntry::flags`]: the flow has sent ECN-capable packets, so its
/// Not-ECT packets are retransmissions or control (RFC 3168, 6.1.5).
pub const FLOW_ECN: u32 = 1;

/// [`FlowEntry::flags`]: the bits above this hold the host count a flow
/// joined the committed count with, under host isolation
/// ([`crate::hosts`]); 0 without.
pub const FLOW_COUNTED_SHIFT: u32 = 16;

/// The host count in `flags` ([`FLOW_COUNTED_SHIFT`]).
#[inline(always)]
pub fn counted_flows(flags: u32) -> u32 {
    flags >> FLOW_COUNTED_SHIFT
}

/// `flags` with the host count `n` ([`FLOW_COUNTED_SHIFT`]; `n` below
/// 2^16).
#[inline(always)]
pub fn with_counted_flows(flags: u32, n: u32) -> u32 {
    (flags & ((1 << FLOW_COUNTED_SHIFT) - 1)) | (n << FLOW_COUNTED_SHIFT)
}

/// One flow's state: 64 bytes, one cache line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowEntry {
    /// High bits of the key's hash, never 0; 0 marks an empty way.
    pub tag: u32,
    /// [`FLOW_ECN`] once the flow sent an ECN-capable packet; above
    /// [`FLOW_COUNTED_SHIFT`], its host count in the committed count.
    pub flags: u32,
    /// The flow's virtual clock: the earliest departure time of its next
    /// packet.
    pub t_next_ns: u64,
    /// When the flow's last packet arrived.
    pub last_seen_ns: u64,
    /// AQM state on the flow's scheduled delay.
    pub codel: CodelState,
    /// Marks the epoch in which the flow was last counted as backlogged
    /// (`crate::fair::count_backlogged`); 0 for never.
    pub backlog_epoch: u32,
    /// Marks the window in which the flow was last counted as active
    /// (`crate::fair::count_active`); under host isolation, as one of its
    /// host's bulk flows (`crate::hosts::pace_hosts`). 0 for never.
    pub active_epoch: u32,
}

const _: () = assert!(core::mem::size_of::<FlowEntry>() == 64);

/// One set of the flow table: the map value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowSet {
    /// The ways, scanned in order.
    pub ways: [FlowEntry; WAYS],
}

const _: () = assert!(core::mem::size_of::<FlowSet>() == 64 * WAYS);

/// Where a packet's flow state is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// The flow is already in this way.
    Hit(usize),
    /// The flow is new: reset this way and take it.
    Claim(usize),
    /// Every way is busy with a backlogged flow: share this one.
    Shared(usize),
}

/// Chooses the way for the flow with `tag` in `set` at `now_ns`. Pure: the
/// caller resets a claimed way with [`FlowEntry::fresh`].
#[inline(always)]
pub fn choose_way(set: &FlowSet, tag: u32, now_ns: u64, idle_ns: u64) -> Way {
    // Sentinels instead of `Option`s: the BPF verifier rejects code that
    // reads an `Option`'s payload register before it is ever written, which
    // LLVM emits for a `None` compared speculatively.
    let mut free = WAYS;
    let mut oldest = WAYS;
    let mut oldest_seen = u64::MAX;
    for i in 0..WAYS {
        let w = &set.ways[i];
        if w.tag == tag {
            return Way::Hit(i);
        }
        if free < WAYS {
            continue;
        }
        let clock_idle = w.t_next_ns <= now_ns;
        if w.tag == 0 || (clock_idle && now_ns.saturating_sub(w.last_seen_ns) > idle_ns) {
            free = i;
        } else if clock_idle && w.last_seen_ns < oldest_seen {
            oldest = i;
            oldest_seen = w.last_seen_ns;
        }
    }
    if free < WAYS {
        return Way::Claim(free);
    }
    if oldest < WAYS {
        return Way::Claim(oldest);
    }
    Way::Shared((tag as usize) % WAYS)
}

impl FlowEntry {
    /// A new flow's state: clock idle, CoDel reset.
    #[inline(always)]
    pub fn fresh(tag: u32, now_ns: u64) -> Self {
        Self {
            tag,
            flags: 0,
            t_next_ns: 0,
            last_seen_ns: now_ns,
            codel: CodelState::default(),
            backlog_epoch: 0,
            active_epoch: 0,
        }
    }
}

/// Hashes a flow key word by word: multiply-xorshift mixing in 64 bits
/// (no division). Not cryptographic: flows are chosen by senders, so a
/// deliberate collision only makes two of the sender's own flows share.
#[derive(Clone, Copy, Debug)]
pub struct FlowHasher {
    h: u64,
}

const MUL: u64 = 0x9E37_79B9_7F4A_7C15;

impl FlowHasher {
    /// Starts a hash; `seed` is chosen at load time.
    #[inline(always)]
    pub fn new(seed: u64) -> Self {
        Self { h: seed ^ MUL }
    }

    /// Mixes in one 32-bit word.
    #[inline(always)]
    pub fn word(&mut self, w: u32) {
        self.h = (self.h ^ u64::from(w)).wrapping_mul(MUL);
        self.h ^= self.h >> 29;
    }

    /// The finished 64-bit hash.
    #[inline(always)]
    pub fn finish(self) -> u64 {
        let mut h = self.h;
        h ^= h >> 32;
        h = h.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        h ^ (h >> 32)
    }
}

/// The set index (`hash & sets_mask`) and tag (high bits, never 0).
#[inline(always)]
pub fn set_and_tag(hash: u64, sets_mask: u32) -> (u32, u32) {
    ((hash as u32) & sets_mask, ((hash >> 32) as u32) | 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: u64 = 1_000_000_000;

    fn busy(tag: u32, seen: u64, t_next: u64) -> FlowEntry {
        FlowEntry {
            tag,
            last_seen_ns: seen,
            t_next_ns: t_next,
            ..FlowEntry::default()
        }
    }

    #[test]
    fn hit_beats_everything() {
        let mut set = FlowSet::default();
        set.ways[5] = busy(77, 10, 0);
        assert_eq!(choose_way(&set, 77, 100, IDLE), Way::Hit(5));
    }

    #[test]
    fn empty_way_is_claimed_first() {
        let mut set = FlowSet::default();
        set.ways[0] = busy(3, 0, 0);
        assert_eq!(choose_way(&set, 9, 10, IDLE), Way::Claim(1));
    }

    #[test]
    fn expired_flow_is_reused_but_not_one_with_queued_packets() {
        let now = 10 * IDLE;
        let mut set = FlowSet::default();
        for i in 0..WAYS {
            // Recently seen and backlogged: not reusable.
            set.ways[i] = busy(100 + i as u32, now - 1, now + 1_000);
        }
        // Way 6 idle for long but still has a scheduled departure.
        set.ways[6] = busy(106, 0, now + 5);
        // Way 3 idle for long and its clock is idle: reusable.
        set.ways[3] = busy(103, 0, 0);
        assert_eq!(choose_way(&set, 1, now, IDLE), Way::Claim(3));
    }

    #[test]
    fn least_recent_idle_clock_is_taken_over_when_nothing_expired() {
        let now = 10 * IDLE;
        let mut set = FlowSet::default();
        for i in 0..WAYS {
            set.ways[i] = busy(100 + i as u32, now - 10, now + 1_000);
        }
        set.ways[2] = busy(102, now - 500, now - 1);
        set.ways[4] = busy(104, now - 900, now - 1);
        assert_eq!(choose_way(&set, 1, now, IDLE), Way::Claim(4));
    }

    #[test]
    fn all_backlogged_means_shared() {
        let now = 10 * IDLE;
        let mut set = FlowSet::default();
        for i in 0..WAYS {
            set.ways[i] = busy(100 + i as u32, 0, now + 1);
        }
        assert_eq!(choose_way(&set, 13, now, IDLE), Way::Shared(13 % WAYS));
    }

    #[test]
    fn hash_spreads_sets_and_tags_are_never_zero() {
        let mask = 8191u32;
        let mut hits = [0u32; 8192];
        for port in 0..65_536u32 {
            let mut h = FlowHasher::new(42);
            h.word(0x0a00_0001);
            h.word(0x0a00_0002);
            h.word((port << 16) | 5201);
            h.word(6);
            let (set, tag) = set_and_tag(h.finish(), mask);
            assert_ne!(tag, 0);
            hits[set as usize] += 1;
        }
        // 8 per set on average; a fair hash keeps the fullest set small.
        let max = hits.iter().max().copied().unwrap_or(0);
        assert!(max <= 24, "fullest set has {max}");
    }
}
