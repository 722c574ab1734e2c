//! The fair share's state every CPU shares (the `SHAPER_FAIR` map's value
//! of each tin, the `SHAPER_TINS` table and the link's clock in
//! `SHAPER_AGG`), seen through `shaper_common::shared::Shared`,
//! `shaper_common::tins::TinTable` and `shaper_common::link::LinkWords`
//! with atomics: the
//! epoch roll and the committed count's moves are the library's own
//! (`shaper_common::shared`), so the classifiers and the simulator run the
//! same steps.
//!
//! Invariant: every word is accessed atomically, at an address inside the
//! map value (ring indices are reduced below their rings' lengths here).

use aya_ebpf::helpers::bpf_ktime_get_ns;
use shaper_common::{
    committed::CLOCK_SLOTS,
    config::{AggregateState, PacerConfig},
    fair::{EPOCH_RING, EPOCH_SHIFT, FairState, Level},
    link::LinkWords,
    shared::{Field, Shared, roll_epoch},
    tins::{MAX_TINS, TinState, TinTable},
};

use crate::{
    atomic,
    maps::{AGGREGATE, FAIR, TINS},
    veil::Veil,
};

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
    /// The tin whose state this is.
    pub(crate) tin: usize,
}

impl Rolled {
    /// No roll.
    pub(crate) const NONE: Rolled = Rolled {
        state: core::ptr::null_mut(),
        now_ns: 0,
        epoch: 0,
        mult_q16: 0,
        tin: 0,
    };
}

/// Reads the clock and rolls tin `tin`'s shared state to its epoch
/// (`shaper_common::shared::roll_epoch`; `COMMITTED` and `level` as there),
/// for a pacer that is enabled. The tin comes veiled from the parse, so one
/// verifier state walks the roll whatever the header shape, and the
/// multiplier leaves it veiled, so that the roll's outcomes merge after
/// it.
#[inline(always)]
pub(crate) fn roll<T: TinTable, const COMMITTED: bool>(
    config: &PacerConfig,
    veil: Veil,
    tin: usize,
    mut tins: T,
    level: Level,
) -> Rolled {
    if !config.enabled() {
        return Rolled::NONE;
    }
    let tin = tin & (MAX_TINS - 1);
    let Some(state) = FAIR.get_ptr_mut(tin as u32) else {
        return Rolled::NONE;
    };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now_ns = unsafe { bpf_ktime_get_ns() };
    let epoch = now_ns >> EPOCH_SHIFT;
    // SAFETY: the pointer comes from the map lookup of this run.
    let mut shared = unsafe { AtomicFair::new(state, veil) };
    let mult_q16 = veil.u64(roll_epoch::<_, _, COMMITTED>(
        &mut shared,
        &mut tins,
        tin,
        epoch,
        level,
    ));
    Rolled {
        state,
        now_ns,
        epoch,
        mult_q16,
        tin,
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
                Field::CapScale => &raw mut (*s).cap_scale_q16,
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

/// The `SHAPER_TINS` value of this program run, and the veil
/// [`TinTable::settle`] applies.
pub(crate) struct AtomicTins(*mut TinState, Veil);

impl AtomicTins {
    /// The map's value for this run; `None` when the lookup fails, which
    /// an array of one entry does only in a broken object (the caller then
    /// passes the packet unpaced, as when the fair state's lookup fails).
    /// Without a null pointer in its state, the verifier walks the roll
    /// once where it walked it again for a tin table that is not there.
    #[inline(always)]
    pub(crate) fn lookup(veil: Veil) -> Option<Self> {
        TINS.get_ptr_mut(0).map(|p| Self(p, veil))
    }
}

const _: () = assert!(MAX_TINS.is_power_of_two());

impl TinTable for AtomicTins {
    #[inline(always)]
    fn masks(&self, t: usize) -> (u64, u64, u64) {
        let t = t & (MAX_TINS - 1);
        // SAFETY: fields of the map value of this run, the index reduced;
        // written only by the controller.
        unsafe {
            (
                u64::from((*self.0).higher_mask[t]),
                u64::from((*self.0).others_mask[t]),
                u64::from((*self.0).holder_mask[t]),
            )
        }
    }
    #[inline(always)]
    fn threshold(&self, t: usize) -> (u64, u64) {
        let t = t & (MAX_TINS - 1);
        // SAFETY: fields of the map value of this run, the index reduced.
        unsafe {
            (
                atomic::load(&raw mut (*self.0).threshold_ns[t]),
                atomic::load(&raw mut (*self.0).ratio_q16[t]),
            )
        }
    }
    #[inline(always)]
    fn usage(&self, t: usize) -> (u64, u64, u64) {
        let t = t & (MAX_TINS - 1);
        // SAFETY: as for `threshold`.
        unsafe {
            (
                atomic::load(&raw mut (*self.0).usage_ns[t]),
                atomic::load(&raw mut (*self.0).usage_epoch[t]),
                atomic::load(&raw mut (*self.0).busy_epoch[t]),
            )
        }
    }
    /// Veiled, then stored to the stack and loaded back, both volatile: the
    /// compiler keeps the pair in place among the map's (volatile) loads,
    /// so one pass of the tins' loop ends before the next begins.
    #[inline(always)]
    fn settle(&self, v: u64) -> u64 {
        let mut slot = 0u64;
        // SAFETY: a local of this frame, aligned and live for both calls.
        unsafe {
            core::ptr::write_volatile(&mut slot, self.1.u64(v));
            core::ptr::read_volatile(&slot)
        }
    }
    #[inline(always)]
    fn publish(&mut self, t: usize, epoch: u64, usage_ns: u64, busy: bool) {
        let t = t & (MAX_TINS - 1);
        // SAFETY: as for `threshold`; only the CPU that won this tin's
        // epoch writes its slots.
        unsafe {
            atomic::store(&raw mut (*self.0).usage_ns[t], usage_ns);
            atomic::store(&raw mut (*self.0).usage_epoch[t], epoch);
            if busy {
                atomic::store(&raw mut (*self.0).busy_epoch[t], epoch);
            }
        }
    }
}

/// The link's clock and front (`shaper_common::link`) in the `SHAPER_AGG`
/// map's value, which every CPU and tin shares.
pub(crate) struct AtomicLink(*mut AggregateState);

impl AtomicLink {
    #[inline(always)]
    pub(crate) fn lookup() -> Option<Self> {
        AGGREGATE.get_ptr_mut(0).map(Self)
    }
}

impl LinkWords for AtomicLink {
    #[inline(always)]
    fn fetch_add(&mut self, v: u64) -> u64 {
        // SAFETY: the pointer comes from this run's map lookup and stays
        // valid for it; the word is 8-byte aligned inside the value.
        unsafe { atomic::fetch_add(&raw mut (*self.0).link_clock_ns, v) }
    }
    #[inline(always)]
    fn compare_exchange(&mut self, old: u64, new: u64) -> bool {
        // SAFETY: as in `fetch_add`.
        unsafe { atomic::compare_exchange(&raw mut (*self.0).link_clock_ns, old, new) }
    }
    #[inline(always)]
    fn front(&self) -> u64 {
        // SAFETY: as in `fetch_add`.
        unsafe { atomic::load(&raw const (*self.0).link_front_ns) }
    }
    #[inline(always)]
    fn set_front(&mut self, v: u64) {
        // SAFETY: as in `fetch_add`.
        unsafe { atomic::store(&raw mut (*self.0).link_front_ns, v) }
    }
}
