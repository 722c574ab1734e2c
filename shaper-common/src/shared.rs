//! The fair share's state as the CPUs share it: the epoch roll and the
//! committed count's moves, written once over [`Shared`], a word-level view
//! of [`FairState`]. The classifiers implement it with atomics over the map
//! value (one CPU per epoch change wins the compare-and-swap and rolls,
//! while the others go on adding); the simulator and the tests use the
//! plain implementation on a private copy, [`FairState`] itself. So the
//! kernel and the simulator take the same steps in the same order.
//!
//! The roll, on the CPU that wins the epoch: the committed count first
//! (expire the clock slots time has passed, recount once per activity
//! window), then one CSFQ update per finished epoch from its ring slot,
//! which is then cleared, then the check that a raise of the multiplier
//! does not only idle the link (against the committed flows and the
//! traffic passed unpaced, which the pacer's step counts), then the
//! activity windows, the cap and the floor, then the backlogged reference
//! ([`crate::fair`] has each step). Over hosts ([`Level::HOSTS`],
//! [`crate::hosts`]) the multiplier's least value is lower and the floor
//! counts the traffic passed unpaced too.
//!
//! Invariants: every loop has a constant length and at most one branch in
//! its body, and what it carries from pass to pass goes through
//! [`Shared::opaque`], so the BPF verifier walks it once per state; every ring index
//! is reduced below its ring's length by the implementation. Shared words
//! are only loaded, stored, added to (wrapping) and compared-and-swapped;
//! what a race between CPUs costs is said in [`crate::fair`] and
//! [`crate::committed`]. Units: nanoseconds of CLOCK_MONOTONIC, epochs,
//! clock slots, Q16 multipliers and weights.
//! Non-goals: the per-flow state, which one CPU at a time owns.

use crate::{
    committed::{self, CLOCK_SLOT_SHIFT, CLOCK_SLOTS, SLOTS_PER_EPOCH},
    fair::{
        CodelClock, EPOCH_RING, EPOCH_SHIFT, FairParams, FairState, Level, MULT_ONE, Packet,
        Verdict, average_scheduled, backlogged_reference, bound_mult, count_active,
        count_backlogged, decay_reference, decide, hold_feedback, join_mult, min_flat, mult_cap,
        raise_would_idle, roll_active, slots_to_clear, unpaced_floor, update_mult, window_ends,
    },
    flow::FlowEntry,
    police::{LinkState, Policed, n_active, police_link},
    tins::{TinTable, TinView, scale_mult, tin_input, tin_view},
};

/// A shared word of [`FairState`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// `epoch`.
    Epoch,
    /// `mult_q16`, the multiplier packets use.
    Mult,
    /// `mult_feedback_q16`, the feedback's own.
    MultFeedback,
    /// `scheduled_avg_ns`.
    ScheduledAvg,
    /// `active_last`.
    ActiveLast,
    /// `active_now`.
    ActiveNow,
    /// `backlogged_now`.
    BackloggedNow,
    /// `backlogged_ref_q8`.
    BackloggedRef,
    /// `updates`.
    Updates,
    /// `committed`.
    Committed,
    /// `clock_slot`.
    ClockSlot,
    /// `scheduled_ns[i % EPOCH_RING]`.
    Scheduled(usize),
    /// `clock_counts[i % CLOCK_SLOTS]`.
    ClockCount(usize),
    /// `unpaced_ns`.
    Unpaced,
    /// `cap_scale_q16`.
    CapScale,
}

/// Word access to a [`FairState`] that other CPUs may use at the same time.
pub trait Shared {
    /// The word's value.
    fn load(&self, f: Field) -> u64;
    /// Sets the word.
    fn store(&mut self, f: Field, v: u64);
    /// Adds `v` to the word, wrapping (a decrement adds `u64::MAX`).
    fn add(&mut self, f: Field, v: u64);
    /// Adds `v` to the word, wrapping, and returns what it held before.
    fn fetch_add(&mut self, f: Field, v: u64) -> u64;
    /// Sets the word to `new` if it still holds `old`; true if it did.
    fn compare_exchange(&mut self, f: Field, old: u64, new: u64) -> bool;
    /// `v` itself, with its value hidden from the BPF verifier where the
    /// implementation can: the roll passes the values its loop carries
    /// through it, so the verifier's states after each pass merge instead
    /// of multiplying (each pass can clamp or not, and a clamped value is a
    /// constant the verifier tracks). The identity by default.
    #[inline(always)]
    fn opaque(&self, v: u64) -> u64 {
        v
    }
}

/// The word `f` of the `FairState` `s`, borrowed as `$r` (`&` or
/// `&mut`): one match for both borrows.
macro_rules! word {
    ($s:expr, $f:expr, $($r:tt)+) => {
        match $f {
            Field::Epoch => $($r)+ $s.epoch,
            Field::Mult => $($r)+ $s.mult_q16,
            Field::MultFeedback => $($r)+ $s.mult_feedback_q16,
            Field::ScheduledAvg => $($r)+ $s.scheduled_avg_ns,
            Field::ActiveLast => $($r)+ $s.active_last,
            Field::ActiveNow => $($r)+ $s.active_now,
            Field::BackloggedNow => $($r)+ $s.backlogged_now,
            Field::BackloggedRef => $($r)+ $s.backlogged_ref_q8,
            Field::Updates => $($r)+ $s.updates,
            Field::Committed => $($r)+ $s.committed,
            Field::ClockSlot => $($r)+ $s.clock_slot,
            Field::Scheduled(i) => $($r)+ $s.scheduled_ns[i % EPOCH_RING],
            Field::ClockCount(i) => $($r)+ $s.clock_counts[i % CLOCK_SLOTS],
            Field::Unpaced => $($r)+ $s.unpaced_ns,
            Field::CapScale => $($r)+ $s.cap_scale_q16,
        }
    };
}

/// The plain implementation, on a private copy (one thread).
impl Shared for FairState {
    #[inline(always)]
    fn load(&self, f: Field) -> u64 {
        *word!(self, f, &)
    }
    #[inline(always)]
    fn store(&mut self, f: Field, v: u64) {
        *word!(self, f, &mut) = v;
    }
    #[inline(always)]
    fn add(&mut self, f: Field, v: u64) {
        let w = word!(self, f, &mut);
        *w = w.wrapping_add(v);
    }
    #[inline(always)]
    fn fetch_add(&mut self, f: Field, v: u64) -> u64 {
        let w = word!(self, f, &mut);
        let before = *w;
        *w = before.wrapping_add(v);
        before
    }
    #[inline(always)]
    fn compare_exchange(&mut self, f: Field, old: u64, new: u64) -> bool {
        let w = word!(self, f, &mut);
        if *w == old {
            *w = new;
            true
        } else {
            false
        }
    }
}

/// Moves tin `tin`'s shared state to `epoch` if this caller is the first
/// to see it (see the module header), and returns the fair-share
/// multiplier to use. `tins` holds what every tin accepted
/// ([`crate::tins`]): the roll weighs this tin's accepted time against the
/// others' ([`tin_input`]), scales the cap and the floor to the capacity
/// they leave it, and publishes its own. With one tin that is the pacer
/// without tins. `COMMITTED`: keep the committed count and floor the
/// multiplier with it (the pacer); the policer, whose clocks are virtual,
/// does not. `level`: over flows or over hosts ([`Level`]).
#[inline(always)]
pub fn roll_epoch<S: Shared, T: TinTable, const COMMITTED: bool>(
    s: &mut S,
    tins: &mut T,
    tin: usize,
    epoch: u64,
    level: Level,
) -> u64 {
    let old = s.load(Field::Epoch);
    if epoch <= old || !s.compare_exchange(Field::Epoch, old, epoch) {
        return s.load(Field::Mult);
    }
    // The committed count first, while few verifier states reach here: its
    // loops are walked once per state.
    let window_end = window_ends(old, epoch);
    let committed = if COMMITTED {
        roll_committed(s, epoch << (EPOCH_SHIFT - CLOCK_SLOT_SHIFT), window_end)
    } else {
        0
    };
    let view = if T::ENABLED {
        tin_view(tins, tin, epoch)
    } else {
        TinView::SOLE
    };
    // One update per finished epoch, each from its own slot, which is then
    // cleared for reuse.
    // The backlogged reference decays once per finished epoch in the same
    // loop.
    let ring = EPOCH_RING as u64;
    let finished = slots_to_clear(old, epoch);
    let one_epoch = finished == 1;
    let m_before = s.load(Field::MultFeedback);
    let mut m = m_before;
    let mut avg = s.load(Field::ScheduledAvg);
    let mut reference = s.load(Field::BackloggedRef);
    // A loop to the veiled count, not a loop over the whole ring that skips
    // the finished passes: the verifier then walks each pass once, where
    // it walked the ring once for every count it could not rule out.
    let passes = s.opaque(finished).min(ring);
    let mut j = 0;
    while j < passes {
        // Cannot truncate: the remainder is below EPOCH_RING.
        let slot = Field::Scheduled(((old + j) % ring) as usize);
        avg = s.opaque(average_scheduled(avg, s.load(slot)));
        m = s.opaque(update_mult(m, tin_input(avg, &view), level.mult_min_q16));
        reference = s.opaque(decay_reference(reference));
        s.store(slot, 0);
        j += 1;
    }
    // Activity windows, stored only when one ends: storing back the loaded
    // values every epoch would lose any count another CPU added between the
    // load and the store. At a window's end such an increment can still be
    // lost: the cap is a bound with one flow of slack, not a measurement.
    let (last, active) = roll_active(
        s.load(Field::ActiveLast),
        s.load(Field::ActiveNow),
        old,
        epoch,
    );
    if window_end {
        s.store(Field::ActiveLast, last);
        s.store(Field::ActiveNow, active);
    }
    let (cap_scale, floor_scale) = if T::ENABLED {
        view.scale_factors_veiled(|v| s.opaque(v))
    } else {
        (MULT_ONE, MULT_ONE)
    };
    // The traffic passed unpaced since the last roll, taken out by
    // subtraction so that what other CPUs add meanwhile counts in the next.
    // A raise of the feedback's multiplier that would only idle the link
    // further does not stand (`raise_would_idle`).
    let mut unpaced_ns = 0;
    if COMMITTED {
        let unpaced = s.load(Field::Unpaced);
        unpaced_ns = unpaced;
        s.add(Field::Unpaced, unpaced.wrapping_neg());
        let flows = if active > last { active } else { last };
        if m > m_before
            && raise_would_idle(
                m_before,
                committed,
                unpaced,
                flows,
                s.opaque(view.capacity_ns()),
                floor_scale,
            )
        {
            m = m_before;
        }
    }
    let cap = scale_mult(mult_cap(last, active), cap_scale);
    let fb = min_flat(m, cap);
    let floor = scale_mult(committed, floor_scale);
    let floor = if level.unpaced_floor {
        unpaced_floor(floor, unpaced_ns)
    } else {
        floor
    };
    let m = bound_mult(m, cap, floor);
    s.store(Field::MultFeedback, hold_feedback(fb, m));
    s.store(Field::ScheduledAvg, avg);
    s.store(Field::Mult, m);
    s.store(Field::CapScale, cap_scale);
    let r = backlogged_reference(reference, s.load(Field::BackloggedNow), one_epoch);
    s.store(Field::BackloggedRef, r);
    s.store(Field::BackloggedNow, 0);
    s.add(Field::Updates, 1);
    if T::ENABLED {
        tins.publish(tin, epoch, avg, committed > 0);
    }
    m
}

/// Expires the committed count to `now_slot` and, when an activity window
/// ends (`recount`), recomputes it from the ring; returns it as the floor
/// reads it ([`committed::count_or_zero`]). One epoch after the last roll,
/// the [`SLOTS_PER_EPOCH`] slots time passed are emptied and their flows
/// leave the count, by a subtraction, so that other CPUs' moves meanwhile
/// stay counted; after a longer gap, in which no packet arrived for a whole
/// epoch, the ring is emptied and the count is 0 (flows whose clocks still
/// run rejoin as they move).
#[inline(always)]
pub fn roll_committed<S: Shared>(s: &mut S, now_slot: u64, recount: bool) -> u64 {
    let rolled = s.load(Field::ClockSlot);
    s.store(Field::ClockSlot, now_slot);
    if now_slot.wrapping_sub(rolled) == SLOTS_PER_EPOCH {
        let mut gone = 0u64;
        for i in 0..SLOTS_PER_EPOCH {
            let slot = Field::ClockCount(committed::slot_index(rolled + 1 + i));
            gone = gone.wrapping_add(s.load(slot));
            s.store(slot, 0);
        }
        s.add(Field::Committed, gone.wrapping_neg());
    } else {
        for i in 0..CLOCK_SLOTS {
            s.store(Field::ClockCount(i), 0);
        }
        s.store(Field::Committed, 0);
    }
    if recount {
        // The wrapping sum, so a counter a race took below zero subtracts
        // what it lost.
        let mut sum = 0u64;
        for i in 0..CLOCK_SLOTS {
            sum = sum.wrapping_add(s.load(Field::ClockCount(i)));
        }
        s.store(Field::Committed, sum);
    }
    committed::count_or_zero(s.load(Field::Committed))
}

/// Moves a flow whose clock went from `old_ns` to `new_ns` in the
/// committed count ([`committed::clock_move`]): it leaves with the weight
/// it was counted with, `old_weight`, and joins with `new_weight` (both
/// [`committed::WEIGHT_ONE`] without host isolation). True when it joined
/// a slot, i.e. is now counted with `new_weight`.
#[inline(always)]
pub fn move_clock<S: Shared>(
    s: &mut S,
    old_ns: u64,
    new_ns: u64,
    old_weight: u64,
    new_weight: u64,
) -> bool {
    let mv = committed::clock_move(old_ns, new_ns, s.load(Field::ClockSlot));
    let mut delta = 0u64;
    if mv.leave < CLOCK_SLOTS {
        s.add(Field::ClockCount(mv.leave), old_weight.wrapping_neg());
        delta = delta.wrapping_sub(old_weight);
    }
    if mv.join < CLOCK_SLOTS {
        s.add(Field::ClockCount(mv.join), new_weight);
        delta = delta.wrapping_add(new_weight);
    }
    if delta != 0 {
        s.add(Field::Committed, delta);
    }
    mv.join < CLOCK_SLOTS
}

/// The fair pacer's step for one packet of `flow` once the epoch is rolled
/// ([`roll_epoch`] gave `mult_q16`): count the flow active, decide
/// ([`decide`]), move its clock in the committed count (`COMMITTED`), and
/// let a flow newly backlogged in this epoch join ([`join`]). The caller
/// then accounts a kept packet ([`account`]) and acts on the verdict.
#[inline(always)]
pub fn pace<S: Shared, const COMMITTED: bool>(
    s: &mut S,
    flow: &mut FlowEntry,
    pkt: &Packet,
    epoch: u64,
    mult_q16: u64,
    p: &FairParams,
) -> Verdict {
    if count_active(flow, epoch) {
        s.add(Field::ActiveNow, 1);
    }
    let clock_before = flow.t_next_ns;
    let verdict = decide(flow, pkt, mult_q16, p, CodelClock::Departure);
    if COMMITTED && flow.t_next_ns != clock_before {
        let w = committed::WEIGHT_ONE;
        move_clock(s, clock_before, flow.t_next_ns, w, w);
    }
    if COMMITTED && verdict == Verdict::Pass {
        s.add(Field::Unpaced, pkt.tx_ns);
    }
    if matches!(verdict, Verdict::Pace { .. } | Verdict::Mark { .. })
        && count_backlogged(flow, epoch)
    {
        join(s, mult_q16);
    }
    verdict
}

/// The policer's step for one packet of `flow` once the epoch is rolled:
/// count the flow active, police it against the virtual link
/// ([`police_link`], at the least share `C / n_active`), and let a flow
/// newly behind its clock join, as on egress. The caller accounts a packet
/// that passes ([`account`]) and acts on the decision.
#[inline(always)]
pub fn police_step<S: Shared>(
    s: &mut S,
    flow: &mut FlowEntry,
    link: &mut LinkState,
    pkt: &Packet,
    epoch: u64,
    mult_q16: u64,
    p: &FairParams,
) -> Policed {
    if count_active(flow, epoch) {
        s.add(Field::ActiveNow, 1);
    }
    let n = n_active(s.load(Field::ActiveLast), s.load(Field::ActiveNow));
    let r = police_link(flow, link, pkt, mult_q16, n, p);
    if r.action != crate::police::Action::Drop
        && r.virtual_delay_ns > 0
        && count_backlogged(flow, epoch)
    {
        join(s, mult_q16);
    }
    r
}

/// A flow newly backlogged in this epoch joins the count; if there are now
/// more than recently, the share shrinks at once ([`join_mult`]), for packets
/// and for the feedback alike.
#[inline(always)]
pub fn join<S: Shared>(s: &mut S, mult_q16: u64) {
    let n_now = s.fetch_add(Field::BackloggedNow, 1).wrapping_add(1);
    let n_ref = s.load(Field::BackloggedRef).div_ceil(256);
    // A state the controller wrote before tins (0) scales by 1.0.
    let scale = s.load(Field::CapScale);
    let scale = if scale == 0 { MULT_ONE } else { scale };
    let cap = scale_mult(
        mult_cap(s.load(Field::ActiveLast), s.load(Field::ActiveNow)),
        scale,
    );
    // Veiled: the step's clamps end in one verifier state.
    let m = s.opaque(join_mult(mult_q16, n_now, n_ref, cap));
    if m != mult_q16 {
        s.store(Field::Mult, m);
        s.store(Field::MultFeedback, m);
    }
}

/// Counts a kept packet's transmission time (at the aggregate rate) in the
/// epoch of its decision, CSFQ's measurement of the accepted traffic.
/// Counting it where it departs (up to the horizon ahead) fed back up to
/// [`EPOCH_RING`] epochs late and made the loop oscillate.
#[inline(always)]
pub fn account<S: Shared>(s: &mut S, epoch: u64, tx_ns: u64) {
    // Cannot truncate: the remainder is below EPOCH_RING.
    s.add(
        Field::Scheduled((epoch % EPOCH_RING as u64) as usize),
        tx_ns,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::committed::WEIGHT_ONE;
    use crate::tins::TinState;

    const S: u64 = 1 << CLOCK_SLOT_SHIFT;

    /// The count recomputed from the ring, as a roll at a window's end does.
    fn ring_sum(st: &FairState) -> u64 {
        st.clock_counts.iter().fold(0u64, |a, c| a.wrapping_add(*c))
    }

    fn at_slot(rolled: u64) -> FairState {
        FairState {
            clock_slot: rolled,
            ..FairState::default()
        }
    }

    #[test]
    fn a_flow_counts_once_while_its_clock_is_ahead_and_leaves_when_it_runs_out() {
        let rolled = 1_000;
        let mut st = at_slot(rolled);
        // A new flow's clock set 3 slots ahead.
        move_clock(&mut st, 0, (rolled + 3) * S + 5, WEIGHT_ONE, WEIGHT_ONE);
        assert_eq!(st.committed, WEIGHT_ONE);
        // It moves within the slot, then on: still one.
        move_clock(
            &mut st,
            (rolled + 3) * S + 5,
            (rolled + 3) * S + 9,
            WEIGHT_ONE,
            WEIGHT_ONE,
        );
        move_clock(
            &mut st,
            (rolled + 3) * S + 9,
            (rolled + 11) * S,
            WEIGHT_ONE,
            WEIGHT_ONE,
        );
        assert_eq!((st.committed, ring_sum(&st)), (WEIGHT_ONE, WEIGHT_ONE));
        // An epoch on, its slot is still ahead; the next epoch passes it.
        let e = SLOTS_PER_EPOCH;
        assert!(e < 11 && 11 <= 2 * e);
        assert_eq!(roll_committed(&mut st, rolled + e, false), WEIGHT_ONE);
        assert_eq!(roll_committed(&mut st, rolled + 2 * e, true), 0);
        assert_eq!(ring_sum(&st), 0);
        // A packet then sets the expired clock anew: it joins again.
        move_clock(
            &mut st,
            (rolled + 11) * S,
            (rolled + 2 * e + 2) * S,
            WEIGHT_ONE,
            WEIGHT_ONE,
        );
        assert_eq!(st.committed, WEIGHT_ONE);
    }

    #[test]
    fn a_race_below_zero_nets_out_in_the_recount() {
        let mut st = at_slot(0);
        // A move out of a slot an expiry had just emptied, into another.
        st.add(Field::ClockCount(3), u64::MAX);
        st.add(Field::ClockCount(4), 1);
        assert_eq!(st.clock_counts[3], u64::MAX);
        assert_eq!(roll_committed(&mut st, SLOTS_PER_EPOCH, true), 0);
        assert_eq!(committed::count_or_zero(0u64.wrapping_sub(1)), 0);
    }

    #[test]
    fn a_long_gap_empties_the_whole_ring() {
        let mut st = at_slot(10);
        for k in 1..=100 {
            move_clock(&mut st, 0, (10 + k * 5) * S, WEIGHT_ONE, WEIGHT_ONE);
        }
        assert_eq!(
            (st.committed, ring_sum(&st)),
            (100 * WEIGHT_ONE, 100 * WEIGHT_ONE)
        );
        assert_eq!(
            roll_committed(&mut st, 10 + 100 * CLOCK_SLOTS as u64, true),
            0
        );
        assert_eq!(ring_sum(&st), 0);
    }

    #[test]
    fn a_lost_compare_and_swap_leaves_the_roll_to_the_winner() {
        let mut st = FairState {
            epoch: 9,
            mult_q16: 3 << 16,
            ..FairState::default()
        };
        // An epoch this caller did not see first, or an older one.
        assert_eq!(
            roll_epoch::<_, _, true>(&mut st, &mut TinState::default(), 0, 9, Level::FLOWS),
            3 << 16
        );
        assert_eq!(
            roll_epoch::<_, _, true>(&mut st, &mut TinState::default(), 0, 4, Level::FLOWS),
            3 << 16
        );
        assert_eq!(st.updates, 0);
        roll_epoch::<_, _, true>(&mut st, &mut TinState::default(), 0, 10, Level::FLOWS);
        assert_eq!((st.epoch, st.updates), (10, 1));
    }
}
