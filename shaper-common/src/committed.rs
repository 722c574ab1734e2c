//! The count of committed flows: flows whose clock runs ahead of now, each
//! of which departs at its fair share until its clock is reached. It is the
//! fair share's floor: with `b` committed flows the share is at most `C/b`,
//! so `m >= b`. Under host isolation a flow departs at `C/(m n)`, `n` its
//! host's bulk flows, and counts with the weight `1/n`
//! ([`crate::hosts`]): the count is a sum of weights, [`WEIGHT_ONE`] per
//! flow without isolation.
//!
//! Why. The feedback that sets `m` measures the traffic *accepted* in each
//! epoch. When many TCP flows back off together it lowers `m` below their
//! number; when their windows have grown back, every flow's queue drains
//! at `C/m` and together they depart faster than `C`, while the traffic
//! accepted per epoch (their windows per RTT) barely moves. The committed
//! count sees that at once: `b / m` is the load the stamped clocks have
//! committed the link to, in the fluid view of each packet leaving over its
//! fair transmission time. A flow below its share adds `m × its rate / C`
//! on average, so flows below their shares lift the floor only when their
//! sum exceeds the rate; a backlogged flow counts one, whatever `m`, so
//! once every flow is backlogged the floor is their number. Flows that stop
//! leave the count as soon as their clocks run out, with no window's lag.
//!
//! Method. A ring of [`CLOCK_SLOTS`] counters, one per slot of
//! 2^[`CLOCK_SLOT_SHIFT`] ns of clock time (1.05 ms; 512 slots, 537 ms,
//! beyond the default horizon), holds the weight of the flows whose clock is in
//! each slot. A packet that moves its flow's clock from one slot to another
//! moves the flow between counters ([`clock_move`]). At each epoch change
//! the slots that time has passed are emptied and their flows leave the
//! count (`crate::shared::roll_committed`); the count is then the flows whose clock lies beyond
//! the slot of that instant. A flow whose clock lies beyond the ring (only
//! with a horizon longer than the ring) is not counted.
//!
//! After an epoch in which no packet arrived the ring is emptied instead
//! (a loop of constant length, which the BPF verifier walks once); flows
//! whose clocks still run are then uncounted until their clocks run out.
//!
//! Invariants. `committed` equals the (wrapping) sum of the counters, all
//! of which lie after the rolled slot, exactly on one CPU and between long
//! gaps. On the BPF side a race between a move and an expiry can lose or
//! double a flow, or take a counter below zero (it wraps, and the sums stay
//! net counts); the count is recomputed from the counters once per activity
//! window (`crate::shared::roll_committed`), a wrapped count reads as 0, and the floor never
//! exceeds the cap of `crate::fair::mult_cap`, so an error is bounded and
//! short-lived.
//!
//! Units: nanoseconds of CLOCK_MONOTONIC; weights in Q16 ([`WEIGHT_ONE`] a
//! flow). Non-goals: telling flows apart (a shared way of the flow table
//! counts once).

/// A flow's weight in the count without host isolation: 1.0 in Q16, so
/// that the count is a multiplier's floor as it stands.
pub const WEIGHT_ONE: u64 = 1 << 16;

/// log2 of a slot's length in ns: 2^20 ns, 1.05 ms. Finer than an epoch,
/// so that the count at an epoch change is that of the instant; a flow
/// whose clock is less than a slot ahead may be missed, which only lowers
/// the floor.
pub const CLOCK_SLOT_SHIFT: u32 = 20;
/// Slots in the ring: 512, 537 ms.
pub const CLOCK_SLOTS: usize = 512;

/// The ring index of clock slot `slot` (clock time `>> CLOCK_SLOT_SHIFT`).
#[inline(always)]
pub fn slot_index(slot: u64) -> usize {
    // Cannot truncate: the remainder is below CLOCK_SLOTS.
    (slot % CLOCK_SLOTS as u64) as usize
}

/// What a packet's clock move changes: the counter that loses the flow's
/// weight and the one that gains it, each `CLOCK_SLOTS` for none. The
/// count changes by the weight joined less the weight left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// Ring index whose counter loses the flow, or `CLOCK_SLOTS`.
    pub leave: usize,
    /// Ring index whose counter gains the flow, or `CLOCK_SLOTS`.
    pub join: usize,
}

/// The move of a flow whose clock goes from `old_ns` to `new_ns` while the
/// count holds the slots after `rolled_slot` (0 for a clock never set). A
/// clock that stays in its slot moves nothing.
#[inline(always)]
pub fn clock_move(old_ns: u64, new_ns: u64, rolled_slot: u64) -> Move {
    let last = rolled_slot + CLOCK_SLOTS as u64;
    let (old, new) = (old_ns >> CLOCK_SLOT_SHIFT, new_ns >> CLOCK_SLOT_SHIFT);
    let was = old_ns != 0 && old > rolled_slot && old <= last;
    let is = new > rolled_slot && new <= last;
    if was && is && old == new {
        return Move {
            leave: CLOCK_SLOTS,
            join: CLOCK_SLOTS,
        };
    }
    Move {
        leave: if was { slot_index(old) } else { CLOCK_SLOTS },
        join: if is { slot_index(new) } else { CLOCK_SLOTS },
    }
}

/// Clock slots per epoch of the fair share's update (2^23 ns): an epoch
/// change by one epoch expires this many. `crate::fair` asserts that the
/// two lengths agree.
pub const SLOTS_PER_EPOCH: u64 = 8;

/// A count at or above this has wrapped below zero (races on the BPF side)
/// and reads as 0 ([`count_or_zero`]): 2^32 flows' weights.
pub const WRAPPED: u64 = 1 << 48;

/// The count as the floor reads it: a wrapped count is 0.
#[inline(always)]
pub fn count_or_zero(committed: u64) -> u64 {
    if committed >= WRAPPED { 0 } else { committed }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1 << CLOCK_SLOT_SHIFT;

    #[test]
    fn a_clock_within_the_rolled_slot_is_not_counted() {
        let rolled = 50;
        let mv = clock_move(0, rolled * S + 100, rolled);
        assert_eq!((mv.leave, mv.join), (CLOCK_SLOTS, CLOCK_SLOTS));
    }

    #[test]
    fn a_clock_beyond_the_ring_is_not_counted() {
        let rolled = 7;
        let mv = clock_move(0, (rolled + 1 + CLOCK_SLOTS as u64) * S, rolled);
        assert_eq!((mv.leave, mv.join), (CLOCK_SLOTS, CLOCK_SLOTS));
        let mv = clock_move(0, (rolled + CLOCK_SLOTS as u64) * S, rolled);
        assert_eq!((mv.leave, mv.join), (CLOCK_SLOTS, slot_index(rolled)));
    }
}
