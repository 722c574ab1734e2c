//! The fair share's state that every CPU shares (`shaper_common::fair::FairState`
//! in the `SHAPER_FAIR` map), under atomics: the epoch roll both
//! classifiers take, and the committed count the pacer keeps. The steps are
//! those of `shaper_common::fair::roll_epoch` and
//! `shaper_common::committed`, written with atomic loads, stores, adds and
//! one compare-and-swap, so one CPU per epoch change does the roll and the
//! others keep adding meanwhile.
//!
//! Invariants: loops have constant lengths (the verifier walks them once
//! per state), and every ring index is reduced below its ring's length.
//! Non-goals: exact counts under races; `shaper_common::committed` and
//! `shaper_common::fair` say what a race costs.

use shaper_common::{
    committed::{self, CLOCK_SLOT_SHIFT, CLOCK_SLOTS, SLOTS_PER_EPOCH},
    fair::{
        EPOCH_RING, EPOCH_SHIFT, average_scheduled, backlogged_reference, bound_mult, mult_cap,
        roll_active, slots_to_clear, update_mult, window_ends,
    },
};

use crate::atomic;

/// Moves a flow whose clock went from `old_ns` to `new_ns` in the
/// committed count (`shaper_common::committed::clock_move`), with atomic
/// adds (a decrement adds `u64::MAX`).
///
/// # Safety
/// `state` must come from the map lookup of this program run.
#[inline(always)]
pub(crate) unsafe fn move_clock(
    state: *mut shaper_common::fair::FairState,
    old_ns: u64,
    new_ns: u64,
) {
    // SAFETY (all blocks below): the caller's contract; every shared field
    // is accessed atomically, and the ring indices are below CLOCK_SLOTS.
    let rolled = unsafe { atomic::load(&raw const (*state).clock_slot) };
    let mv = committed::clock_move(old_ns, new_ns, rolled);
    if mv.leave < CLOCK_SLOTS {
        let c = unsafe { &raw mut (*state).clock_counts[mv.leave & (CLOCK_SLOTS - 1)] };
        unsafe { atomic::add(c, u64::MAX) };
    }
    if mv.join < CLOCK_SLOTS {
        let c = unsafe { &raw mut (*state).clock_counts[mv.join & (CLOCK_SLOTS - 1)] };
        unsafe { atomic::add(c, 1) };
    }
    if mv.delta != 0 {
        unsafe { atomic::add(&raw mut (*state).committed, mv.delta) };
    }
}

/// Expires the committed count to `now_slot` and, when an activity window
/// ends, recomputes it from the ring; returns it as the floor reads it
/// (`shaper_common::committed::{expire, recount}`, with atomics: what the
/// expiry removes is subtracted, so that other CPUs' moves meanwhile stay
/// counted). Loops of a constant length without branches, which the
/// verifier walks once.
///
/// # Safety
/// As for [`move_clock`].
#[inline(always)]
unsafe fn roll_committed(
    state: *mut shaper_common::fair::FairState,
    now_slot: u64,
    recount: bool,
) -> u64 {
    // SAFETY (all blocks below): as for `move_clock`; every index is
    // reduced below CLOCK_SLOTS.
    let slot_p = unsafe { &raw mut (*state).clock_slot };
    let count_p = unsafe { &raw mut (*state).committed };
    let counts = unsafe { &raw mut (*state).clock_counts };
    let rolled = unsafe { atomic::load(slot_p) };
    unsafe { atomic::store(slot_p, now_slot) };
    if now_slot.wrapping_sub(rolled) == SLOTS_PER_EPOCH {
        let mut gone = 0u64;
        for i in 0..SLOTS_PER_EPOCH {
            let idx = committed::slot_index(rolled + 1 + i) & (CLOCK_SLOTS - 1);
            let c = unsafe { &raw mut (*counts)[idx] };
            gone = gone.wrapping_add(unsafe { atomic::load(c) });
            unsafe { atomic::store(c, 0) };
        }
        unsafe { atomic::add(count_p, gone.wrapping_neg()) };
    } else {
        for i in 0..CLOCK_SLOTS {
            unsafe { atomic::store(&raw mut (*counts)[i], 0) };
        }
        unsafe { atomic::store(count_p, 0) };
    }
    if recount {
        let mut sum = 0u64;
        for i in 0..CLOCK_SLOTS {
            sum = sum.wrapping_add(unsafe { atomic::load(&raw const (*counts)[i]) });
        }
        unsafe { atomic::store(count_p, sum) };
    }
    committed::count_or_zero(unsafe { atomic::load(count_p) })
}

/// Moves the shared state to `epoch` if this CPU is the first to see it
/// (a CSFQ update per finished epoch, their ring slots cleared;
/// the same steps as `shaper_common::fair::roll_epoch`), and returns the
/// fair-share multiplier to use. `COMMITTED`: the pacer keeps the
/// committed count (`shaper_common::committed`) and floors the multiplier
/// with it; the policer, whose clocks are virtual, does not.
///
/// # Safety
/// `state` must come from the map lookup of this program run.
#[inline(always)]
pub(crate) unsafe fn roll_epoch<const COMMITTED: bool>(
    state: *mut shaper_common::fair::FairState,
    epoch: u64,
) -> u64 {
    // SAFETY (all blocks below): the caller's contract; every shared field
    // is accessed atomically.
    let (ep, mult) = unsafe { (&raw mut (*state).epoch, &raw mut (*state).mult_q16) };
    let old = unsafe { atomic::load(ep) };
    if epoch <= old || !unsafe { atomic::compare_exchange(ep, old, epoch) } {
        return unsafe { atomic::load(mult) };
    }
    // The committed count first, while few verifier states reach here: its
    // loops are walked once per state.
    let now_slot = epoch << (EPOCH_SHIFT - CLOCK_SLOT_SHIFT);
    let committed = if COMMITTED {
        unsafe { roll_committed(state, now_slot, window_ends(old, epoch)) }
    } else {
        0
    };
    // One update per finished epoch, each from its own slot, which is then
    // cleared for reuse (see `shaper_common::fair::roll_epoch`).
    let ring = EPOCH_RING as u64;
    let finished = slots_to_clear(old, epoch);
    let feedback = unsafe { &raw mut (*state).mult_feedback_q16 };
    let mut m = unsafe { atomic::load(feedback) };
    let avg_p = unsafe { &raw mut (*state).scheduled_avg_ns };
    let mut avg = unsafe { atomic::load(avg_p) };
    for j in 0..ring {
        if j < finished {
            let slot = unsafe { &raw mut (*state).scheduled_ns[((old + j) % ring) as usize] };
            avg = average_scheduled(avg, unsafe { atomic::load(slot) });
            m = update_mult(m, avg);
            unsafe { atomic::store(slot, 0) };
        }
    }
    // Activity windows (`shaper_common::fair::roll_active`). Stored only
    // when a window ends: storing back the loaded values every epoch lost
    // any count another CPU added between the load and the store. At a
    // window's end such an increment can still be lost: the cap is a bound
    // with one flow of slack, not a measurement.
    let last_p = unsafe { &raw mut (*state).active_last };
    let active_p = unsafe { &raw mut (*state).active_now };
    let (last0, active0) = unsafe { (atomic::load(last_p), atomic::load(active_p)) };
    let (last, active) = roll_active(last0, active0, old, epoch);
    let window_end = window_ends(old, epoch);
    if window_end {
        unsafe { atomic::store(last_p, last) };
        unsafe { atomic::store(active_p, active) };
    }
    let cap = mult_cap(last, active);
    unsafe { atomic::store(feedback, if m > cap { cap } else { m }) };
    let m = bound_mult(m, cap, committed);
    unsafe { atomic::store(avg_p, avg) };
    unsafe { atomic::store(mult, m) };
    let now_p = unsafe { &raw mut (*state).backlogged_now };
    let ref_p = unsafe { &raw mut (*state).backlogged_ref_q8 };
    let r = backlogged_reference(
        unsafe { atomic::load(ref_p) },
        unsafe { atomic::load(now_p) },
        finished,
    );
    unsafe { atomic::store(ref_p, r) };
    unsafe { atomic::store(now_p, 0) };
    unsafe { atomic::add(&raw mut (*state).updates, 1) };
    m
}
