//! Atomic operations on map memory shared between CPUs.
//!
//! The `bpfel-unknown-none` target declares no compare-and-swap, so
//! `core::sync::atomic` offers no read-modify-write methods there; the
//! compiler intrinsics lower to the BPF ISA v3 atomics (`BPF_ADD`,
//! `BPF_CMPXCHG`, kernel 5.12 and later), which the build selects with
//! `-C target-cpu=v3`. The orderings are relaxed, since the values are
//! counters and an epoch number and no other memory is published through
//! them, except where a result is read: see [`fetch_add`].

use core::intrinsics::{
    AtomicOrdering::{Relaxed, SeqCst},
    atomic_cxchg, atomic_xadd,
};

/// Adds `v` to `*p`.
///
/// # Safety
/// `p` must point to a live, 8-byte aligned `u64` in map memory.
#[inline(always)]
pub unsafe fn add(p: *mut u64, v: u64) {
    // SAFETY: the caller's contract.
    unsafe { atomic_xadd::<u64, u64, { Relaxed }>(p, v) };
}

/// Adds `v` to `*p` and returns the previous value (`BPF_ADD | BPF_FETCH`).
///
/// Sequentially consistent, not relaxed: LLVM 22's BPF backend selects the
/// non-fetching `lock *(u64 *)(p) += v` for a relaxed `atomicrmw` even when
/// its result is used, so the "previous value" is the addend (reported to
/// LLVM as "[BPF] Live monotonic atomicrmw lowers to non-FETCH and returns
/// wrong value"). Any stronger ordering selects `atomic_fetch_add`, and on
/// BPF both are the same full barrier. `prog_test_run_fair` checks the
/// result through the join rule.
///
/// # Safety
/// As for [`add`].
#[inline(always)]
pub unsafe fn fetch_add(p: *mut u64, v: u64) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { atomic_xadd::<u64, u64, { SeqCst }>(p, v) }
}

/// Reads `*p`. An aligned 8-byte BPF load is single-copy atomic; LLVM's
/// BPF backend cannot select a relaxed atomic load below ISA v4, so this is
/// a volatile load.
///
/// # Safety
/// As for [`add`].
#[inline(always)]
pub unsafe fn load(p: *const u64) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { core::ptr::read_volatile(p) }
}

/// Writes `*p`, as a volatile (single-copy atomic) store; see [`load`].
///
/// # Safety
/// As for [`add`].
#[inline(always)]
pub unsafe fn store(p: *mut u64, v: u64) {
    // SAFETY: the caller's contract.
    unsafe { core::ptr::write_volatile(p, v) }
}

/// Replaces `*p` by `new` if it equals `old`; true if it did.
///
/// # Safety
/// As for [`add`].
#[inline(always)]
pub unsafe fn compare_exchange(p: *mut u64, old: u64, new: u64) -> bool {
    // SAFETY: the caller's contract.
    unsafe { atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(p, old, new) }.1
}
