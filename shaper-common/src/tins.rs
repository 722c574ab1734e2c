//! DiffServ tins: which tin a packet's DSCP selects, the share of the rate
//! each tin holds with priority, and what a tin's fair share weighs itself
//! against.
//!
//! Semantics follow CAKE's tins (net/sched/sch_cake.c in Linux 6.12: the
//! `cake_config_besteffort`, `_diffserv3`, `_diffserv4` and `_diffserv8`
//! setups, their DSCP tables, and the tin choice in `cake_dequeue`):
//! - A mode has 1, 3, 4 or 8 tins. Each has a threshold, a fraction of the
//!   rate: besteffort 1; diffserv3 1, 1/16, 1/4; diffserv4 1, 1/16, 1/2,
//!   1/4; diffserv8 (7/8)^i for tin i.
//! - Priority rises with the tin's index. A tin's traffic up to its
//!   threshold goes before that of lower tins; above its threshold a tin
//!   takes only what the others leave (CAKE serves the highest tin whose
//!   own shaper, at the threshold, has a packet due, and otherwise the tin
//!   due soonest).
//!
//! How the pacer expresses it. sch_fq sends every flow whose time has come,
//! so priority lies wholly in the rates the stamps give. Each tin keeps its
//! own fair state ([`crate::fair::FairState`]: multiplier, epoch ring,
//! counts), and its feedback reads, in place of its own accepted time
//! `own` alone, [`tin_input`]: the larger of `own + H` and
//! - `own * C/R` for a tin held to its threshold `R`,
//! - `own + O` for the one tin that takes what the others leave: the busy
//!   tin (one with paced flows) of the largest threshold, or any tin while
//!   no other is busy;
//!
//! where `H` is what the higher tins accepted, each counted up to its
//! threshold, and `O` what every other tin accepted (all as transmission
//! time at the aggregate rate `C` per epoch). The feedback drives its input
//! to one epoch. The first term holds a tin to what the higher tins leave
//! within their thresholds; the second to its threshold, or, for the tin
//! that takes the rest, to the rest. Elastic tins then settle where CAKE's
//! do: a tin alone takes the whole rate; a diffserv4 voice tin beside busy
//! best effort takes a quarter and best effort the rest; a bulk tin beside
//! it a sixteenth. Only one tin follows the others' swings (TCP's
//! sawtooth), so the loops do not chase each other: with every tin free to
//! take what the others left, the voice tin's share swung from 0.04 to
//! 0.42 of the rate and the link carried up to 1.08 of it (the
//! simulator). With one tin (besteffort) `H = O = 0` and the input is
//! `own`: the pacer without tins, step for step.
//!
//! The tins publish their averaged accepted time once per epoch
//! ([`TinState::usage_ns`]); a tin that stops sending stops publishing, and
//! what it last published fades by half every two epochs ([`aged_usage`]).
//!
//! Invariants: at most [`MAX_TINS`] tins; thresholds in (0, 1] of the rate;
//! every loop runs [`MAX_TINS`] times. Units: ns of transmission time at
//! the aggregate rate per epoch; fractions and ratios in Q16.
//!
//! Non-goals: CAKE's per-tin CoDel parameters (every tin uses the
//! configured target and interval) and its exact split of what the lower
//! tins leave among several busy tins: CAKE shares it by the tins' own
//! shapers (roughly in proportion to their thresholds), here the busy tin
//! of the largest threshold takes all of it (diffserv4's voice and video
//! both busy: 1/4 and 3/4 here, about 1/3 and 2/3 in CAKE).

use crate::fair::{EPOCH_NS, EPOCH_SHIFT, MULT_MAX};

/// The steps a tin's capacity is taken in, per epoch ([`TinView::scale_factors`]).
const CAPACITY_STEPS: u64 = 64;
const _: () = assert!(CAPACITY_STEPS.is_power_of_two());

/// The most tins a mode has (diffserv8).
pub const MAX_TINS: usize = 8;

/// `1.0` in Q16.
const ONE_Q16: u64 = 1 << 16;

/// A DiffServ mode, as CAKE names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Diffserv {
    /// One tin for everything.
    #[default]
    Besteffort,
    /// Bulk, best effort, voice.
    Diffserv3,
    /// Bulk, best effort, video, voice.
    Diffserv4,
    /// Eight tins by precedence of use.
    Diffserv8,
}

/// DSCP code points by name (RFC 2474, 2597, 3246, 5865, 8622).
mod dscp {
    pub const LE: u8 = 1;
    pub const TOS2: u8 = 2;
    pub const TOS4: u8 = 4;
    pub const CS1: u8 = 8;
    pub const AF1X: [u8; 3] = [10, 12, 14];
    pub const CS2: u8 = 16;
    pub const AF2X: [u8; 3] = [18, 20, 22];
    pub const CS3: u8 = 24;
    pub const AF3X: [u8; 3] = [26, 28, 30];
    pub const CS4: u8 = 32;
    pub const AF4X: [u8; 3] = [34, 36, 38];
    pub const CS5: u8 = 40;
    pub const VA: u8 = 44;
    pub const EF: u8 = 46;
    pub const CS6: u8 = 48;
    pub const CS7: u8 = 56;
}

impl Diffserv {
    /// Every mode, in the order the command line lists them.
    pub const ALL: [Diffserv; 4] = [
        Diffserv::Besteffort,
        Diffserv::Diffserv3,
        Diffserv::Diffserv4,
        Diffserv::Diffserv8,
    ];

    /// The mode's number in [`crate::config::PacerConfig::diffserv`].
    pub const fn index(self) -> u32 {
        match self {
            Diffserv::Besteffort => 0,
            Diffserv::Diffserv3 => 1,
            Diffserv::Diffserv4 => 2,
            Diffserv::Diffserv8 => 3,
        }
    }

    /// The mode numbered `i`; besteffort for a number it does not know.
    pub const fn from_index(i: u32) -> Self {
        match i {
            1 => Diffserv::Diffserv3,
            2 => Diffserv::Diffserv4,
            3 => Diffserv::Diffserv8,
            _ => Diffserv::Besteffort,
        }
    }

    /// The mode's name on the command line and in CAKE.
    pub const fn name(self) -> &'static str {
        match self {
            Diffserv::Besteffort => "besteffort",
            Diffserv::Diffserv3 => "diffserv3",
            Diffserv::Diffserv4 => "diffserv4",
            Diffserv::Diffserv8 => "diffserv8",
        }
    }

    /// How many tins the mode has.
    pub const fn tins(self) -> usize {
        match self {
            Diffserv::Besteffort => 1,
            Diffserv::Diffserv3 => 3,
            Diffserv::Diffserv4 => 4,
            Diffserv::Diffserv8 => 8,
        }
    }

    /// Tin `tin`'s name, as `tc -s qdisc` names CAKE's tins.
    pub const fn tin_name(self, tin: usize) -> &'static str {
        const D3: [&str; 3] = ["Best Effort", "Bulk", "Voice"];
        const D4: [&str; 4] = ["Best Effort", "Bulk", "Video", "Voice"];
        const D8: [&str; 8] = [
            "Tin 0", "Tin 1", "Tin 2", "Tin 3", "Tin 4", "Tin 5", "Tin 6", "Tin 7",
        ];
        match self {
            Diffserv::Besteffort => "Best Effort",
            Diffserv::Diffserv3 if tin < 3 => D3[tin],
            Diffserv::Diffserv4 if tin < 4 => D4[tin],
            Diffserv::Diffserv8 if tin < 8 => D8[tin],
            _ => "-",
        }
    }

    /// Tin `tin`'s threshold as a fraction of the rate, Q16.
    pub const fn threshold_q16(self, tin: usize) -> u64 {
        match (self, tin) {
            (Diffserv::Besteffort, 0) => ONE_Q16,
            (Diffserv::Diffserv3, 0) => ONE_Q16,
            (Diffserv::Diffserv3, 1) => ONE_Q16 >> 4,
            (Diffserv::Diffserv3, 2) => ONE_Q16 >> 2,
            (Diffserv::Diffserv4, 0) => ONE_Q16,
            (Diffserv::Diffserv4, 1) => ONE_Q16 >> 4,
            (Diffserv::Diffserv4, 2) => ONE_Q16 >> 1,
            (Diffserv::Diffserv4, 3) => ONE_Q16 >> 2,
            (Diffserv::Diffserv8, i) if i < 8 => {
                // (7/8)^i, each step rounded down as the kernel's integer
                // steps are.
                let mut f = ONE_Q16;
                let mut k = 0;
                while k < i {
                    f = (f * 7) >> 3;
                    k += 1;
                }
                f
            }
            _ => 0,
        }
    }

    /// The tin DSCP `dscp` (0..64) selects.
    pub const fn tin_of(self, dscp: u8) -> usize {
        use dscp::*;
        let d = dscp & 0x3f;
        match self {
            Diffserv::Besteffort => 0,
            Diffserv::Diffserv3 => match d {
                LE | CS1 => 1,
                TOS4 | VA | EF | CS6 | CS7 => 2,
                _ => 0,
            },
            Diffserv::Diffserv4 => match d {
                LE | CS1 => 1,
                TOS4 | CS2 | CS3 => 2,
                CS4 | CS5 | VA | EF | CS6 | CS7 => 3,
                _ if in3(AF2X, d) || in3(AF3X, d) || in3(AF4X, d) => 2,
                _ => 0,
            },
            Diffserv::Diffserv8 => match d {
                LE => 0,
                TOS2 | CS1 => 1,
                CS3 => 3,
                TOS4 => 4,
                CS2 => 5,
                CS4 | CS5 | VA | EF => 6,
                CS6 | CS7 => 7,
                _ if in3(AF1X, d) => 1,
                _ if in3(AF3X, d) || in3(AF4X, d) => 3,
                _ if in3(AF2X, d) => 4,
                _ => 2,
            },
        }
    }

    /// The DSCP to tin map as three bit planes, what the classifier reads
    /// ([`tin_from_planes`]): bit `d` of plane `k` is bit `k` of DSCP `d`'s
    /// tin.
    pub const fn planes(self) -> [u64; 3] {
        let mut p = [0u64; 3];
        let mut d = 0u8;
        while d < 64 {
            let t = self.tin_of(d) as u64;
            p[0] |= (t & 1) << d;
            p[1] |= ((t >> 1) & 1) << d;
            p[2] |= ((t >> 2) & 1) << d;
            d += 1;
        }
        p
    }
}

/// True when `d` is one of the three.
const fn in3(set: [u8; 3], d: u8) -> bool {
    set[0] == d || set[1] == d || set[2] == d
}

/// The tin of DSCP `dscp` from [`Diffserv::planes`]: three shifts, no table.
#[inline(always)]
pub fn tin_from_planes(planes: &[u64; 3], dscp: u8) -> usize {
    let d = u32::from(dscp & 0x3f);
    (((planes[0] >> d) & 1) | (((planes[1] >> d) & 1) << 1) | (((planes[2] >> d) & 1) << 2))
        as usize
}

/// The tins' configuration and what each last accepted: the `SHAPER_TINS`
/// map's one value. The controller writes the configuration words; each
/// tin's epoch roll writes its own usage slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TinState {
    /// Tins in use, 1..=[`MAX_TINS`].
    pub tins: u64,
    /// Each tin's threshold as transmission time per epoch at the
    /// aggregate rate, ns: `EPOCH_NS * fraction`.
    pub threshold_ns: [u64; MAX_TINS],
    /// Each tin's rate over its threshold, `1 / fraction`, Q16.
    pub ratio_q16: [u64; MAX_TINS],
    /// For each tin, the tins above it (bit `u` for tin `u`).
    pub higher_mask: [u8; MAX_TINS],
    /// For each tin, every other tin in use.
    pub others_mask: [u8; MAX_TINS],
    /// For each tin, the tins that, while busy, hold it to its threshold:
    /// those of a larger threshold, or an equal one and a lower index.
    pub holder_mask: [u8; MAX_TINS],
    /// Unused: keeps the written words below off the configuration's
    /// cache lines.
    pub _apart: [u64; 8],
    /// Each tin's averaged accepted time per epoch when it last rolled, ns.
    pub usage_ns: [u64; MAX_TINS],
    /// The epoch of that roll.
    pub usage_epoch: [u64; MAX_TINS],
    /// The last epoch whose roll found flows of the tin paced (committed
    /// flows, [`crate::committed`]).
    pub busy_epoch: [u64; MAX_TINS],
}

const _: () = assert!(core::mem::size_of::<TinState>() == 416);

impl TinState {
    /// The configuration of `mode`, no usage yet.
    pub const fn new(mode: Diffserv) -> Self {
        let mut s = Self {
            tins: mode.tins() as u64,
            threshold_ns: [0; MAX_TINS],
            ratio_q16: [0; MAX_TINS],
            higher_mask: [0; MAX_TINS],
            others_mask: [0; MAX_TINS],
            holder_mask: [0; MAX_TINS],
            _apart: [0; 8],
            usage_ns: [0; MAX_TINS],
            usage_epoch: [0; MAX_TINS],
            busy_epoch: [0; MAX_TINS],
        };
        let n = mode.tins();
        let mut t = 0;
        while t < n {
            let f = mode.threshold_q16(t);
            s.threshold_ns[t] = (EPOCH_NS * f) >> 16;
            // Configuration time, not the packet path.
            s.ratio_q16[t] = (ONE_Q16 << 16) / f;
            let mut u = 0;
            while u < n {
                let fu = mode.threshold_q16(u);
                if u != t {
                    s.others_mask[t] |= 1 << u;
                }
                if u > t {
                    s.higher_mask[t] |= 1 << u;
                }
                if u != t && (fu > f || (fu == f && u < t)) {
                    s.holder_mask[t] |= 1 << u;
                }
                u += 1;
            }
            t += 1;
        }
        s
    }
}

impl Default for TinState {
    fn default() -> Self {
        Self::new(Diffserv::Besteffort)
    }
}

/// Access to the tins' table that other CPUs may use at the same time.
pub trait TinTable {
    /// False for a table that is never more than one tin ([`SoleTin`]):
    /// the roll then skips the tins' steps altogether, and the verifier
    /// never walks them.
    const ENABLED: bool = true;
    /// Tin `t`'s masks: the higher tins, the others, its holders
    /// ([`TinState`]).
    fn masks(&self, t: usize) -> (u64, u64, u64);
    /// Tin `t`'s threshold and ratio ([`TinState`]).
    fn threshold(&self, t: usize) -> (u64, u64);
    /// Tin `t`'s published usage, the epoch it was published in, and the
    /// last epoch it was busy.
    fn usage(&self, t: usize) -> (u64, u64, u64);
    /// Publishes tin `t`'s usage in `epoch`, and that it is busy.
    fn publish(&mut self, t: usize, epoch: u64, usage_ns: u64, busy: bool);
    /// `v` itself, at a point the compiler keeps in place, with its value
    /// hidden from the BPF verifier where the implementation can
    /// ([`tin_view`] passes what its loop carries through it). The
    /// identity by default.
    #[inline(always)]
    fn settle(&self, v: u64) -> u64 {
        v
    }
}

/// One tin, always: the policer's, which has no tins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoleTin;

impl TinTable for SoleTin {
    const ENABLED: bool = false;
    #[inline(always)]
    fn masks(&self, _t: usize) -> (u64, u64, u64) {
        (0, 0, 0)
    }
    #[inline(always)]
    fn threshold(&self, _t: usize) -> (u64, u64) {
        (EPOCH_NS, ONE_Q16)
    }
    #[inline(always)]
    fn usage(&self, _t: usize) -> (u64, u64, u64) {
        (0, 0, 0)
    }
    #[inline(always)]
    fn publish(&mut self, _t: usize, _epoch: u64, _usage_ns: u64, _busy: bool) {}
}

/// The plain implementation, on a private copy (the simulator, the tests).
impl TinTable for TinState {
    #[inline(always)]
    fn masks(&self, t: usize) -> (u64, u64, u64) {
        let t = t % MAX_TINS;
        (
            u64::from(self.higher_mask[t]),
            u64::from(self.others_mask[t]),
            u64::from(self.holder_mask[t]),
        )
    }
    #[inline(always)]
    fn threshold(&self, t: usize) -> (u64, u64) {
        let t = t % MAX_TINS;
        (self.threshold_ns[t], self.ratio_q16[t])
    }
    #[inline(always)]
    fn usage(&self, t: usize) -> (u64, u64, u64) {
        let t = t % MAX_TINS;
        (self.usage_ns[t], self.usage_epoch[t], self.busy_epoch[t])
    }
    #[inline(always)]
    fn publish(&mut self, t: usize, epoch: u64, usage_ns: u64, busy: bool) {
        let t = t % MAX_TINS;
        self.usage_ns[t] = usage_ns;
        self.usage_epoch[t] = epoch;
        if busy {
            self.busy_epoch[t] = epoch;
        }
    }
}

/// What one tin's roll weighs its own accepted time against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TinView {
    /// `C / R` of this tin, Q16.
    pub ratio_q16: u64,
    /// The higher tins' usage, each up to its threshold, ns per epoch.
    pub higher_ns: u64,
    /// Every other tin's usage, ns per epoch.
    pub others_ns: u64,
    /// This tin takes what the others leave beyond its threshold: no other
    /// busy tin has a larger threshold (or an equal one and a lower index).
    pub swing: bool,
    /// This tin's threshold, ns per epoch.
    pub threshold_ns: u64,
}

impl TinView {
    /// A tin alone: the pacer without tins.
    pub const SOLE: TinView = TinView {
        ratio_q16: ONE_Q16,
        higher_ns: 0,
        others_ns: 0,
        swing: true,
        threshold_ns: EPOCH_NS,
    };

    /// The transmission time per epoch this tin's flows share, at least
    /// 1/256 of an epoch: what its cap and floor scale by. What the others
    /// leave, for the tin that takes the rest; otherwise its threshold, or
    /// what the higher tins leave where that is less.
    #[inline(always)]
    pub fn capacity_ns(&self) -> u64 {
        let least = EPOCH_NS >> 8;
        let taken = if self.swing {
            self.others_ns
        } else {
            let above = EPOCH_NS - self.threshold_ns.min(EPOCH_NS);
            if self.higher_ns > above {
                self.higher_ns
            } else {
                above
            }
        };
        if taken < EPOCH_NS - least {
            EPOCH_NS - taken
        } else {
            least
        }
    }

    /// The factors that scale the multiplier's cap (up) and floor (down)
    /// from whole-rate flow counts to this tin's capacity `X`, Q16: `E/X`
    /// taken in steps of 1/64 of an epoch, rounded so that the cap's is at
    /// least `E/X` and the floor's at most (a reciprocal table, no
    /// division). Both 1.0 for a tin alone.
    #[inline(always)]
    pub fn scale_factors(&self) -> (u64, u64) {
        self.scale_factors_veiled(|v| v)
    }

    /// [`TinView::scale_factors`], the table's indices passed through
    /// `veil` ([`crate::shared::Shared::opaque`]) and masked, never
    /// compared, so that the compiler keeps the bound the BPF verifier
    /// reads and the verifier learns nothing it would carry on.
    #[inline(always)]
    pub fn scale_factors_veiled(&self, veil: impl Fn(u64) -> u64) -> (u64, u64) {
        let c = self.capacity_ns();
        let steps = (c * CAPACITY_STEPS) >> EPOCH_SHIFT;
        let exact = (c * CAPACITY_STEPS) & (EPOCH_NS - 1) == 0;
        let high = if exact { steps } else { steps + 1 };
        let low = steps.clamp(1, CAPACITY_STEPS);
        let high = high.clamp(1, CAPACITY_STEPS);
        let at = |k: u64| {
            let i = (veil(k).wrapping_sub(1) as usize) & (CAPACITY_STEPS as usize - 1);
            veil(u64::from(STEP_FACTOR_Q16[i]))
        };
        (at(low), at(high))
    }
}

/// `64 / (i + 1)` in Q16 for `i` in 0..64: the scale for a capacity of
/// `i + 1` steps ([`TinView::scale_factors`]).
const STEP_FACTOR_Q16: [u32; CAPACITY_STEPS as usize] = {
    let mut t = [0u32; CAPACITY_STEPS as usize];
    let mut i = 0;
    while i < t.len() {
        t[i] = ((CAPACITY_STEPS << 16) / (i as u64 + 1)) as u32;
        i += 1;
    }
    t
};

/// Tin `t`'s usage as published, faded by half for every two epochs since
/// (the averaged time itself would fall by a quarter an epoch with no
/// packets).
#[inline(always)]
pub fn aged_usage(usage_ns: u64, published: u64, epoch: u64) -> u64 {
    let gap = epoch.saturating_sub(published);
    if gap <= 1 {
        usage_ns
    } else if gap >= 128 {
        0
    } else {
        usage_ns >> (gap >> 1)
    }
}

/// Epochs a tin stays busy after its last roll with paced flows: about
/// 67 ms, so that a flow whose clock runs out for a moment after a
/// congestion signal does not hand its tin's part to another tin.
pub const BUSY_EPOCHS: u64 = 8;

/// Tin `tin`'s view of the others in `epoch` ([`TinView`]). Which tins
/// count, and how, comes from the tin's masks, as 0 or 1 multiplied in,
/// never as a branch: a branch on a mask's bit, or on `tin`, would narrow
/// them for the rest of the program, and each narrowing is another state
/// for the BPF verifier to walk it in. What the loop carries from pass to
/// pass goes through [`TinTable::settle`] at the end of each pass, so that
/// no pass's work moves into the next and the states its branches leave
/// merge before the next begins.
#[inline(always)]
pub fn tin_view<T: TinTable>(table: &T, tin: usize, epoch: u64) -> TinView {
    let (higher_mask, others_mask, holder_mask) = table.masks(tin);
    let (own_threshold, ratio_q16) = table.threshold(tin);
    let mut higher = 0u64;
    let mut others = 0u64;
    let mut held = 0u64;
    for u in 0..MAX_TINS {
        let (usage, at, busy_at) = table.usage(u);
        let (threshold, _) = table.threshold(u);
        let used = aged_usage(usage, at, epoch);
        let within = if used < threshold { used } else { threshold };
        let busy = u64::from(busy_at != 0 && epoch.saturating_sub(busy_at) <= BUSY_EPOCHS);
        // Usage is at most a few epochs (the clamp of the update): the sums
        // of eight stay far below 2^64.
        others = table.settle(others + used * ((others_mask >> u) & 1));
        higher = table.settle(higher + within * ((higher_mask >> u) & 1));
        held = table.settle(held | (busy & (holder_mask >> u)));
    }
    TinView {
        ratio_q16: table.settle(if ratio_q16 == 0 { ONE_Q16 } else { ratio_q16 }),
        higher_ns: higher,
        others_ns: others,
        swing: held & 1 == 0,
        threshold_ns: table.settle(if own_threshold == 0 {
            EPOCH_NS
        } else {
            own_threshold
        }),
    }
}

/// The accepted time tin `v`'s feedback reads when the tin itself accepted
/// `own_ns` per epoch: `own + H` or, where larger, `own * C/R` for a tin
/// held to its threshold, `own + O` for the tin that takes what the others
/// leave (the module header). `own_ns` for a tin alone.
#[inline(always)]
pub fn tin_input(own_ns: u64, v: &TinView) -> u64 {
    // Far beyond the clamp of the multiplier's update (2 epochs), so the
    // product below fits.
    let own = if own_ns > 1 << 40 { 1 << 40 } else { own_ns };
    let behind_higher = own + v.higher_ns;
    let second = if v.swing {
        own + v.others_ns
    } else {
        (own * v.ratio_q16) >> 16
    };
    if behind_higher > second {
        behind_higher
    } else {
        second
    }
}

/// What the fair pacer counts for each tin, per CPU: the
/// `SHAPER_TIN_COUNTERS` map's value, one entry per tin.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TinCounters {
    /// Packets the tin's fair state decided.
    pub packets: u64,
    /// Their wire bytes.
    pub bytes: u64,
    /// Packets the AQM or the horizon dropped.
    pub drops: u64,
    /// Packets CE-marked.
    pub marks: u64,
    /// The scheduled delay of its paced and marked packets, summed, ns.
    pub delay_ns: u64,
}

const _: () = assert!(core::mem::size_of::<TinCounters>() == 40);

impl TinCounters {
    /// The sum of `self` and `o`, wrapping (a sum over CPUs).
    pub fn add(&self, o: &TinCounters) -> TinCounters {
        TinCounters {
            packets: self.packets.wrapping_add(o.packets),
            bytes: self.bytes.wrapping_add(o.bytes),
            drops: self.drops.wrapping_add(o.drops),
            marks: self.marks.wrapping_add(o.marks),
            delay_ns: self.delay_ns.wrapping_add(o.delay_ns),
        }
    }
}

/// `m_q16 * factor_q16 >> 16`, saturating below [`MULT_MAX`].
#[inline(always)]
pub fn scale_mult(m_q16: u64, factor_q16: u64) -> u64 {
    // The factor is at most 64 (2^22) and m below 2^32: the product fits.
    let f = if factor_q16 > 1 << 22 {
        1 << 22
    } else {
        factor_q16
    };
    let m = if m_q16 > MULT_MAX { MULT_MAX } else { m_q16 };
    let scaled = (m * f) >> 16;
    if scaled >= MULT_MAX {
        MULT_MAX - 1
    } else {
        scaled
    }
}

#[cfg(test)]
mod tests;
