//! CoDel (RFC 8289) applied to one flow's *scheduled* delay.
//!
//! Method: the EDT pacer knows, when it stamps a packet, how long the packet
//! will wait in sch_fq: its departure time minus now. That is the sojourn
//! time CoDel would measure at dequeue, known one queue earlier, so the
//! control law runs at enqueue on that value (as PIE does at enqueue,
//! RFC 8033). The state machine is RFC 8289's: a flow whose delay has stayed
//! at or above `target_ns` for a whole `interval_ns` enters the dropping
//! state; signals are then spaced `interval / sqrt(count)` apart, and a flow
//! that re-enters soon after leaving resumes near its previous count.
//!
//! The clock: the caller passes each packet's *departure* time as the
//! state machine's time, not the time of the decision. A signal can only go
//! to the packet being enqueued, at the queue's tail, and the sender learns
//! of it when that packet would have left. With the departure clock, the
//! packet signalled is the one that would stand at the head when a
//! dequeue-time CoDel signals (RFC 8289 drops at the head because that
//! tells the sender soonest), so the signal reaches the sender when CoDel's
//! would. On the decision's clock it arrives one queue later, and while a
//! queue grows (a slow start, a share that just fell) that is the growth of
//! the queue over the interval: more round trips of a window growing into
//! a queue that is already being signalled.
//!
//! No division on the packet path: `1/sqrt(count)` is kept in Q0.32 fixed
//! point, exact from a table for counts below 16 and otherwise refined by
//! one Newton step per count change,
//! y' = y * (3 - count * y^2) / 2 (the approach of Linux's codel, include/net/
//! codel_impl.h, commit 76e3cc126bb2). Starting at or below 1/sqrt(count)
//! the iteration stays below it and converges, so no step can overflow.
//!
//! Invariants: `interval_ns < 2^32` (about 4.29 s; the controller validates),
//! so `interval * y` fits a `u64`. Units: nanoseconds of CLOCK_MONOTONIC.
//! Non-goals: BLUE (COBALT's second half); overload is bounded by the
//! pacer's horizon drop instead.

/// `1/sqrt(1)` in Q0.32, saturated to fit a `u32`.
pub const REC_INV_SQRT_ONE: u32 = u32::MAX;

/// The largest interval the control law accepts (exclusive), in ns.
pub const MAX_INTERVAL_NS: u64 = 1 << 32;

/// CoDel's parameters, fixed at configuration time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodelParams {
    /// Acceptable standing delay (RFC 8289 default 5 ms).
    pub target_ns: u64,
    /// Time the delay must stay above target before signalling, and the
    /// base spacing of signals (RFC 8289 default 100 ms). Below 2^32.
    pub interval_ns: u64,
}

/// One flow's CoDel state. 32 bytes, no implicit padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodelState {
    /// When the delay first went above target, plus one interval; 0 when
    /// it is below target.
    pub first_above_ns: u64,
    /// When the next signal is due while dropping.
    pub drop_next_ns: u64,
    /// Signals in the current dropping episode.
    pub count: u32,
    /// `count` when the previous episode ended.
    pub last_count: u32,
    /// `1/sqrt(count)` in Q0.32.
    pub rec_inv_sqrt: u32,
    /// 1 while in the dropping state.
    pub dropping: u32,
}

const _: () = assert!(core::mem::size_of::<CodelState>() == 32);
const _: () = assert!(INV_SQRT_TABLE.len().is_power_of_two());

/// `1/sqrt(count)` in Q0.32 for counts below 16, where one Newton step from
/// the previous value is still coarse (COBALT caches the same range,
/// sch_cake.c `cobalt_cache_init`). Index 0 is unused.
const INV_SQRT_TABLE: [u32; 16] = [
    u32::MAX,
    4_294_967_295,
    3_037_000_500,
    2_479_700_525,
    2_147_483_648,
    1_920_767_767,
    1_753_413_056,
    1_623_345_051,
    1_518_500_250,
    1_431_655_765,
    1_358_187_913,
    1_294_981_364,
    1_239_850_262,
    1_191_209_601,
    1_147_878_294,
    1_108_955_787,
];

/// `1/sqrt(count)` (Q0.32) after a change of `count`, from the previous
/// value `y`: exact from a table below 16, else one Newton step.
/// Multiplications and shifts only.
#[inline(always)]
pub fn newton_step(count: u32, y: u32) -> u32 {
    // The table is read by a masked index before the bound is tested: a
    // compiler may test a copy of the index and read with a spilled one,
    // whose bound an older BPF verifier (6.1) does not carry over.
    const MASK: usize = INV_SQRT_TABLE.len() - 1;
    let from_table = INV_SQRT_TABLE[count as usize & MASK];
    if (count as usize) < INV_SQRT_TABLE.len() {
        return from_table;
    }
    let y = u64::from(y);
    // y^2 in Q0.32: below 2^64 since y < 2^32.
    let y2 = (y * y) >> 32;
    // count * y^2 in Q.32: below 2^64 since both factors are below 2^32.
    let cy2 = u64::from(count) * y2;
    let three = 3u64 << 32;
    if cy2 >= three {
        // Only reachable from a value far above 1/sqrt(count); halve and let
        // later steps converge from below.
        return (y >> 1) as u32;
    }
    // y * (3 - c y^2) / 2, with the second factor pre-shifted by 2 so the
    // product stays below 2^64: (y * ((3 - cy2) >> 2)) >> (32 - 2 + 1).
    let next = (y * ((three - cy2) >> 2)) >> 31;
    if next > u64::from(u32::MAX) {
        u32::MAX
    } else {
        next as u32
    }
}

/// The next signal time: `t + interval / sqrt(count)`, from the cached
/// reciprocal square root. `interval_ns < 2^32`.
#[inline(always)]
pub fn control_law(t_ns: u64, interval_ns: u64, rec_inv_sqrt: u32) -> u64 {
    t_ns + ((interval_ns * u64::from(rec_inv_sqrt)) >> 32)
}

/// Runs CoDel for one packet that will wait `delay_ns` (its scheduled
/// delay), on CoDel's clock `now_ns` (the packet's departure time for the
/// pacer, see the module header). `small_backlog` is true when the flow holds at most
/// this one packet (RFC 8289 never drops then). Returns true when this
/// packet must carry a congestion signal: a CE mark, or a drop when the
/// packet is not ECN-capable. Updates `s`.
#[inline(always)]
pub fn codel_signal(
    s: &mut CodelState,
    now_ns: u64,
    delay_ns: u64,
    small_backlog: bool,
    p: &CodelParams,
) -> bool {
    let ok_to_signal = if delay_ns < p.target_ns || small_backlog {
        s.first_above_ns = 0;
        false
    } else if s.first_above_ns == 0 {
        s.first_above_ns = now_ns + p.interval_ns;
        false
    } else {
        now_ns >= s.first_above_ns
    };

    if s.dropping != 0 {
        if !ok_to_signal {
            s.dropping = 0;
            return false;
        }
        if now_ns < s.drop_next_ns {
            return false;
        }
        s.count = s.count.saturating_add(1);
        s.rec_inv_sqrt = newton_step(s.count, s.rec_inv_sqrt);
        s.drop_next_ns = control_law(s.drop_next_ns, p.interval_ns, s.rec_inv_sqrt);
        return true;
    }
    if !ok_to_signal {
        return false;
    }
    s.dropping = 1;
    // Re-entering soon after an episode: resume near the rate that
    // controlled the queue last time (RFC 8289, 5.5).
    let delta = s.count.wrapping_sub(s.last_count);
    if delta > 1 && now_ns.saturating_sub(s.drop_next_ns) < 16 * p.interval_ns {
        s.count = delta;
        s.rec_inv_sqrt = newton_step(s.count, s.rec_inv_sqrt);
    } else {
        s.count = 1;
        s.rec_inv_sqrt = REC_INV_SQRT_ONE;
    }
    s.last_count = s.count;
    s.drop_next_ns = control_law(now_ns, p.interval_ns, s.rec_inv_sqrt);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: CodelParams = CodelParams {
        target_ns: 5_000_000,
        interval_ns: 100_000_000,
    };

    #[test]
    fn newton_converges_to_inverse_sqrt_as_count_grows() {
        let mut y = REC_INV_SQRT_ONE;
        for count in 2..20_000u32 {
            y = newton_step(count, y);
            let exact = 1.0 / f64::from(count).sqrt();
            let got = f64::from(y) / 4_294_967_296.0;
            // One step per increment tracks within a few percent early on
            // and far closer later.
            let tol = if count < 16 { 1e-9 } else { 0.01 };
            assert!(
                (got - exact).abs() <= tol * exact,
                "count {count}: {got} vs {exact}"
            );
        }
    }

    #[test]
    fn newton_from_far_above_does_not_overflow() {
        // A stale large value for a large count halves instead of wrapping.
        let y = newton_step(1_000_000, REC_INV_SQRT_ONE);
        assert_eq!(y, REC_INV_SQRT_ONE >> 1);
        let mut y = y;
        for _ in 0..64 {
            y = newton_step(1_000_000, y);
        }
        let got = f64::from(y) / 4_294_967_296.0;
        assert!((got - 0.001).abs() < 0.00002, "{got}");
    }

    #[test]
    fn control_law_spacing_shrinks_with_sqrt_count() {
        assert_eq!(control_law(0, P.interval_ns, REC_INV_SQRT_ONE), 99_999_999);
        let mut y = REC_INV_SQRT_ONE;
        for c in 2..=4 {
            y = newton_step(c, y);
        }
        let gap = control_law(0, P.interval_ns, y);
        assert!((49_000_000..=51_000_000).contains(&gap), "{gap}");
    }

    #[test]
    fn below_target_never_signals() {
        let mut s = CodelState::default();
        for i in 0..10_000u64 {
            assert!(!codel_signal(&mut s, i * 1_000_000, 4_999_999, false, &P));
        }
        assert_eq!(s.first_above_ns, 0);
    }

    #[test]
    fn a_small_backlog_never_signals() {
        let mut s = CodelState::default();
        for i in 0..1_000u64 {
            assert!(!codel_signal(&mut s, i * 1_000_000, 50_000_000, true, &P));
        }
    }

    #[test]
    fn signals_after_one_interval_then_faster_and_faster() {
        let mut s = CodelState::default();
        let mut signals = heapless_times();
        // 1 packet per ms, delay stuck at 20 ms.
        for ms in 0..1_000u64 {
            if codel_signal(&mut s, ms * 1_000_000, 20_000_000, false, &P) {
                signals.push(ms);
            }
        }
        // First signal exactly one interval after the delay went above.
        assert_eq!(signals.first(), Some(&100));
        // Then 100 ms, 70.7, 57.7, 50, ... apart (interval/sqrt(count)).
        let gaps: std::vec::Vec<u64> = signals.windows(2).map(|w| w[1] - w[0]).collect();
        assert!((99..=101).contains(&gaps[0]), "{gaps:?}");
        assert!((70..=72).contains(&gaps[1]), "{gaps:?}");
        assert!((57..=59).contains(&gaps[2]), "{gaps:?}");
        for w in gaps.windows(2) {
            assert!(w[1] <= w[0] + 1, "spacing must not grow: {gaps:?}");
        }
        assert_eq!(s.count as usize, signals.len());
    }

    #[test]
    fn leaving_and_reentering_soon_resumes_the_count() {
        let mut s = CodelState::default();
        let mut t = 0u64;
        while s.count < 6 {
            codel_signal(&mut s, t, 20_000_000, false, &P);
            t += 1_000_000;
        }
        let before = s.count;
        // Delay drops below target: leave the dropping state.
        assert!(!codel_signal(&mut s, t, 1_000_000, false, &P));
        assert_eq!(s.dropping, 0);
        // Back above for an interval, shortly after: the count resumes.
        t += 1_000_000;
        let mut resumed = None;
        for _ in 0..200 {
            if codel_signal(&mut s, t, 20_000_000, false, &P) {
                resumed = Some(s.count);
                break;
            }
            t += 1_000_000;
        }
        let resumed = resumed.expect("signals again");
        assert!(resumed > 1 && resumed <= before, "{resumed} vs {before}");
    }

    extern crate std;
    fn heapless_times() -> std::vec::Vec<u64> {
        std::vec::Vec::new()
    }
}
