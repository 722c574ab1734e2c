//! The maps the egress classifier uses. Names match `shaper_common::maps`, so
//! the controller finds and pins them by name.
//!
//! All but the event ring are arrays (no hashing, no allocation on the
//! packet path); the ring never blocks: a full ring loses the record. Counters are
//! per-CPU, so incrementing them needs no atomics.

use aya_ebpf::{
    macros::map,
    maps::{Array, PerCpuArray, ProgramArray, RingBuf},
};
use shaper_common::{
    config::{AggregateState, PacerConfig},
    counters::Counter,
    event::Scratch,
    fair::FairState,
    flow::{DEFAULT_FLOWS, FlowSet, WAYS},
    police::LinkState,
    tins::{MAX_TINS, TinCounters, TinState},
};

/// Pacer configuration, written by the controller. One entry.
#[map(name = "SHAPER_CONFIG")]
pub static CONFIG: Array<PacerConfig> = Array::with_max_entries(1, 0);

/// One counter per outcome and packet class, per CPU.
#[map(name = "SHAPER_COUNTERS")]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

/// The aggregate pacer's clock. One entry.
#[map(name = "SHAPER_AGG")]
pub static AGGREGATE: Array<AggregateState> = Array::with_max_entries(1, 0);

/// The fair pacer's shared state (fair-share multiplier, epoch ring). One
/// entry per tin, updated with atomics.
#[map(name = "SHAPER_FAIR")]
pub static FAIR: Array<FairState> = Array::with_max_entries(MAX_TINS as u32, 0);

/// The tins' thresholds (the controller's) and what each accepted (the
/// rolls'). One entry.
#[map(name = "SHAPER_TINS")]
pub static TINS: Array<TinState> = Array::with_max_entries(1, 0);

/// Packets, bytes, drops, marks and delay per tin, per CPU.
#[map(name = "SHAPER_TIN_COUNTERS")]
pub static TIN_COUNTERS: PerCpuArray<TinCounters> =
    PerCpuArray::with_max_entries(MAX_TINS as u32, 0);

/// The flow table: one entry per set. The controller sets the size at load
/// time (`--flows` / WAYS); this is the default.
#[map(name = "SHAPER_FLOWS")]
pub static FLOWS: Array<FlowSet> = Array::with_max_entries(DEFAULT_FLOWS / WAYS as u32, 0);

/// Telemetry records (`shaper_common::event::Event`) for the controller.
/// 4 MiB: about 52,000 records, half a second of a reader stalled at
/// 100,000 records/s (the scale benchmark's worst case).
#[map(name = "SHAPER_EVENTS")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

/// The classifier's hand-over to the telemetry program (one per CPU).
#[map(name = "SHAPER_SCRATCH")]
pub static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// The telemetry program, tail-called by the classifier; the controller
/// fills the slot after loading.
#[map(name = "SHAPER_JUMP")]
pub static JUMP: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// The ingress policer's virtual link. One entry.
#[map(name = "SHAPER_POLICE_LINK")]
pub static POLICE_LINK: Array<LinkState> = Array::with_max_entries(1, 0);

/// Where `shaper_redirect` sends packets (an ifindex; 0: nowhere). One
/// entry.
#[map(name = "SHAPER_REDIRECT")]
pub static REDIRECT: Array<u32> = Array::with_max_entries(1, 0);

/// Adds `n` to counter `c` on this CPU.
#[inline(always)]
pub fn count(c: Counter, n: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(c as u32) {
        // SAFETY: the pointer comes from the map lookup and is valid for this
        // program run; per-CPU storage means no other CPU writes it, and
        // preemption is disabled while a TC program runs.
        unsafe { *slot += n };
    }
}

/// Counts one packet of `wire_len` bytes in tin `tin` on this CPU, with
/// what its verdict adds: `drop`, `mark`, and `delay_ns` of scheduled
/// delay. One lookup.
#[inline(always)]
pub fn count_tin(tin: usize, wire_len: u32, drop: bool, mark: bool, delay_ns: u64) {
    if let Some(c) = TIN_COUNTERS.get_ptr_mut((tin & (MAX_TINS - 1)) as u32) {
        // SAFETY: as in `count`.
        let c = unsafe { &mut *c };
        c.packets += 1;
        c.bytes += u64::from(wire_len);
        c.drops += u64::from(drop);
        c.marks += u64::from(mark);
        c.delay_ns += delay_ns;
    }
}
