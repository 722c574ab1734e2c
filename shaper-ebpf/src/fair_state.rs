//! The fair share's state every CPU shares (the `SHAPER_FAIR` map's one
//! value), seen through `shaper_common::shared::Shared` with atomics: the
//! epoch roll and the committed count's moves are the library's own
//! (`shaper_common::shared`), so the classifiers and the simulator run the
//! same steps.
//!
//! Invariant: every word is accessed atomically, at an address inside the
//! map value (ring indices are reduced below their rings' lengths here).

use aya_ebpf::helpers::bpf_ktime_get_ns;
use shaper_common::{
    committed::CLOCK_SLOTS,
    config::PacerConfig,
    fair::{EPOCH_RING, EPOCH_SHIFT, FairState},
    shared::{Field, Shared, roll_epoch},
};

use crate::{atomic, maps::FAIR, veil::Veil};

/// The shared state moved to this packet's epoch; `state` is null when
/// the pacer is disabled or the map lookup failed (a plain value, not an
/// `Option`: carried across the parse, an `Option`'s undefined payload is
/// stored to the stack, which the verifier rejects as `!read_ok`).
pub(crate) struct Rolled {
    /// The map value, or null.
    pub(crate) state: *mut FairState,
    /// The clock read for the roll, the packet's time.
    pub(crate) now_ns: u64,
    /// `now_ns`'s epoch.
    pub(crate) epoch: u64,
    /// The fair-share multiplier, veiled.
    pub(crate) mult_q16: u64,
}

impl Rolled {
    /// No roll.
    pub(crate) const NONE: Rolled = Rolled {
        state: core::ptr::null_mut(),
        now_ns: 0,
        epoch: 0,
        mult_q16: 0,
    };
}

/// Reads the clock and rolls the shared state to its epoch
/// (`shaper_common::shared::roll_epoch`; `COMMITTED` as there), for a
/// pacer that is enabled. The programs call it before they parse the
/// frame, so that one verifier state walks the roll instead of one per
/// header shape, and the multiplier leaves it veiled, so that the roll's
/// outcomes merge after it.
#[inline(always)]
pub(crate) fn roll<const COMMITTED: bool>(config: &PacerConfig, veil: Veil) -> Rolled {
    if !config.enabled() {
        return Rolled::NONE;
    }
    let Some(state) = FAIR.get_ptr_mut(0) else {
        return Rolled::NONE;
    };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now_ns = unsafe { bpf_ktime_get_ns() };
    let epoch = now_ns >> EPOCH_SHIFT;
    // SAFETY: the pointer comes from the map lookup of this run.
    let mut shared = unsafe { AtomicFair::new(state, veil) };
    let mult_q16 = veil.u64(roll_epoch::<_, COMMITTED>(&mut shared, epoch));
    Rolled {
        state,
        now_ns,
        epoch,
        mult_q16,
    }
}

/// The map value of this program run, shared with the other CPUs, and the
/// veil [`Shared::opaque`] applies.
pub(crate) struct AtomicFair(*mut FairState, Veil);

impl AtomicFair {
    /// # Safety
    /// `state` must come from the map lookup of this program run.
    #[inline(always)]
    pub(crate) unsafe fn new(state: *mut FairState, veil: Veil) -> Self {
        Self(state, veil)
    }

    /// The word `f`'s address.
    #[inline(always)]
    fn word(&self, f: Field) -> *mut u64 {
        let s = self.0;
        // SAFETY: `s` points at the map value (the constructor's contract);
        // these only compute field addresses inside it, and every index is
        // reduced below its array's length.
        unsafe {
            match f {
                Field::Epoch => &raw mut (*s).epoch,
                Field::Mult => &raw mut (*s).mult_q16,
                Field::MultFeedback => &raw mut (*s).mult_feedback_q16,
                Field::ScheduledAvg => &raw mut (*s).scheduled_avg_ns,
                Field::ActiveLast => &raw mut (*s).active_last,
                Field::ActiveNow => &raw mut (*s).active_now,
                Field::BackloggedNow => &raw mut (*s).backlogged_now,
                Field::BackloggedRef => &raw mut (*s).backlogged_ref_q8,
                Field::Updates => &raw mut (*s).updates,
                Field::Committed => &raw mut (*s).committed,
                Field::ClockSlot => &raw mut (*s).clock_slot,
                Field::Scheduled(i) => &raw mut (*s).scheduled_ns[i & (EPOCH_RING - 1)],
                Field::ClockCount(i) => &raw mut (*s).clock_counts[i & (CLOCK_SLOTS - 1)],
                Field::Unpaced => &raw mut (*s).unpaced_ns,
            }
        }
    }
}

const _: () = assert!(EPOCH_RING.is_power_of_two() && CLOCK_SLOTS.is_power_of_two());

impl Shared for AtomicFair {
    #[inline(always)]
    fn load(&self, f: Field) -> u64 {
        // SAFETY: an address inside the map value (see `word`).
        unsafe { atomic::load(self.word(f)) }
    }
    #[inline(always)]
    fn store(&mut self, f: Field, v: u64) {
        // SAFETY: as for `load`.
        unsafe { atomic::store(self.word(f), v) }
    }
    #[inline(always)]
    fn add(&mut self, f: Field, v: u64) {
        // SAFETY: as for `load`.
        unsafe { atomic::add(self.word(f), v) }
    }
    #[inline(always)]
    fn fetch_add(&mut self, f: Field, v: u64) -> u64 {
        // SAFETY: as for `load`.
        unsafe { atomic::fetch_add(self.word(f), v) }
    }
    #[inline(always)]
    fn compare_exchange(&mut self, f: Field, old: u64, new: u64) -> bool {
        // SAFETY: as for `load`.
        unsafe { atomic::compare_exchange(self.word(f), old, new) }
    }
    #[inline(always)]
    fn opaque(&self, v: u64) -> u64 {
        self.1.u64(v)
    }
}
