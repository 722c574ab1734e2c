//! The fair EDT pacer: a departure clock per flow, paced at one fair-share
//! rate that a feedback loop keeps at the water level, with CoDel on each
//! flow's scheduled delay.
//!
//! Method.
//! - Each flow keeps a VirtualClock (L. Zhang, SIGCOMM 1990): `t_next`, the
//!   earliest departure of its next packet. A packet arriving when the clock
//!   is idle (`t_next <= now`) leaves at once, unstamped: a flow sending below
//!   its share is never delayed (the sparse-flow rule of RFC 8290, 4.4, with
//!   no separate queue). Otherwise it is stamped `t_next` (written to
//!   `skb->tstamp`, enforced by sch_fq, as in Carousel, Saeed et al.,
//!   SIGCOMM 2017). Either way the clock advances by the packet's
//!   transmission time at the *fair share*.
//! - The fair share is the aggregate rate divided by a multiplier `m` (Q16):
//!   a packet's fair transmission time is `tx_at_rate * m >> 16`. `m` is the
//!   inverse water level of Core-Stateless Fair Queueing (Stoica, Shenker,
//!   Zhang, SIGCOMM 1998): the rate alpha with sum(min(r_i, alpha)) = C.
//!   CSFQ corrects alpha each window by the ratio of capacity to accepted
//!   traffic; here the accepted traffic of an epoch is the transmission time
//!   (at the aggregate rate) of every packet *kept* during it (counting it
//!   in its departure epoch instead feeds back up to the horizon late, and
//!   the loop oscillates), so the ratio needs no division: `m' = m * scheduled_ns >> EPOCH_SHIFT`.
//!   The accepted time is first averaged over epochs (weight 1/4), and the
//!   step is a quarter step in the log domain (`m' = m * exp((ratio - 1) / 4)`)
//!   with the ratio clamped to [1/2, 2], against oscillation (packets
//!   stamped earlier feed the measurement) and against the bias a plain
//!   multiplicative step has under lumpy input. Backlogged flows thus get equal shares whatever their RTT
//!   or congestion control, and whatever flows leave unused (a flow that
//!   dips after a drop, a sparse flow) is handed to the others within a few
//!   epochs: the pacer is work conserving.
//! - The water level bounds `m` by the number of active flows (each takes
//!   at most `C/m`); the feedback does not know that while slow-start
//!   bursts are accepted faster than they can leave, so `m` is capped at
//!   the count of flows that sent in the last or the current window of 32
//!   epochs, plus one ([`mult_cap`]).
//! - Its floor is the count of committed flows, those whose clock runs ahead
//!   of now ([`crate::committed`]): each departs at `C/m` until its clock is
//!   reached, so `m` below their number commits the link beyond `C`. The
//!   feedback alone lets that happen when many TCP flows back off together
//!   and their queues then drain at the raised share ([`bound_mult`]).
//! - A raise of `m` stands only where it does not idle the link: while the
//!   committed flows at `C/m` and the traffic passed unpaced fall short of
//!   the rate, more of `m` only lengthens the queues that traffic accepted
//!   faster than it departs has built (flows joining) ([`raise_would_idle`]).
//! - AQM: CoDel's control law (RFC 8289, see [`crate::codel`]) on each
//!   packet's scheduled delay. ECN-capable packets are CE-marked and kept;
//!   others are dropped. A flow more than an interval behind is signalled on
//!   every packet (overload, as COBALT's BLUE reacts to a full queue where
//!   CoDel's spacing is too slow), except the Not-ECT packets of a flow
//!   that has sent ECT ones (its retransmissions, RFC 3168 6.1.5). A packet whose departure would lie beyond
//!   the horizon is dropped, which bounds what sch_fq holds per flow and, since
//!   the flows' shares sum to the rate, in total (rate × horizon).
//!
//! Invariants.
//! - `m >= 1.0` (no flow is paced faster than the aggregate rate; under
//!   host isolation `m` counts hosts, may go lower, and each flow's own
//!   multiplier is at least 1.0, [`crate::hosts`]), `m <= recent active
//!   flows + 1`, and `m < 2^32`; after each epoch change `m >=` the
//!   committed flows' weight, where that is below the cap.
//! - A packet never departs before `max(now, its own tstamp)`: a socket that
//!   paces itself is never pulled earlier.
//! - Aggregate bound: in steady state the stamped departures of every epoch
//!   sum to the rate. After a change in demand the feedback settles within a
//!   few epochs; the simulator checks that every window of 10 ms or more
//!   carries at most rate × window plus one burst quantum. Where the share
//!   runs low all the same (hundreds of flows backing off together), the
//!   link's clock ([`crate::link`]) holds the sum to the rate: `decide`
//!   lifts the flow's clock to the packet's `link_ns` first.
//!
//! Units: nanoseconds of CLOCK_MONOTONIC; transmission times are at the
//! aggregate rate unless named `fair`; `m` is Q16.
//!
//! Concurrency (BPF side): flow state is updated without locks. A flow's
//! packets normally arrive on one CPU (RSS, RPS and XPS steer a flow to one
//! queue); a race costs at most a packet of burst or one CoDel step. The
//! epoch state is shared by all CPUs: scheduled time is added atomically,
//! and exactly one CPU (the one that wins a compare-and-swap on the epoch
//! number) runs the update.
//!
//! DiffServ tins each run this pacer on their own state, the feedback
//! weighing each tin against the others ([`crate::tins`]).
//!
//! Host isolation runs this pacer over hosts ([`crate::hosts`]).
//!
//! Non-goals: weights set by the operator; exact fairness within an epoch
//! (the share adapts per epoch, fairness is over several).

use crate::codel::{CodelParams, codel_signal};
use crate::committed::{self, CLOCK_SLOT_SHIFT, CLOCK_SLOTS};
use crate::flow::{FLOW_ECN, FlowEntry};

/// `1.0` in the Q16 fixed point of the fair-share multiplier.
pub const MULT_ONE: u64 = 1 << 16;
/// The largest multiplier (exclusive): shares below rate / 65536 are not
/// represented.
pub const MULT_MAX: u64 = 1 << 32;

/// log2 of the epoch length in ns: 2^23 ns = 8.39 ms, the fair share's
/// update period (CSFQ's window: long enough to hold several packets of
/// each flow, short beside an RTT).
pub const EPOCH_SHIFT: u32 = 23;
/// The epoch length in ns.
pub const EPOCH_NS: u64 = 1 << EPOCH_SHIFT;
/// Epochs ahead whose scheduled departures are counted separately; later
/// departures count in the last of them, which keeps the long-run average
/// right for flows with deep queues.
pub const EPOCH_RING: usize = 16;

/// State shared by all CPUs. One entry per tin; 4392 bytes. First the words every
/// packet reads and only an epoch change (or a join) writes, then
/// [`FairState::_apart`], then the words packets write (the epoch ring, the
/// counts, the committed flows' ring). A cache line that one CPU writes is
/// taken from every other CPU's cache, so were the read words on a line
/// that packets write, each CPU would miss them on nearly every packet
/// while another CPU sends (the benchmark's `concurrency`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FairState {
    /// The epoch in progress (`now >> EPOCH_SHIFT`); 0 before the first
    /// packet.
    pub epoch: u64,
    /// The fair-share multiplier `m`, Q16; read on every packet.
    pub mult_q16: u64,
    /// The feedback's own multiplier, Q16: what the CSFQ update and the cap
    /// give, before the committed flows' floor. `mult_q16` is the larger of
    /// the two, so the floor lifts the share only while it holds.
    pub mult_feedback_q16: u64,
    /// Epoch updates run, for the controller's view.
    pub updates: u64,
    /// Moving average of the finished epochs' accepted time (weight 1/4
    /// per epoch), what the multiplier update uses.
    pub scheduled_avg_ns: u64,
    /// A slowly forgetting maximum of the past epochs' counts, in Q8: the
    /// larger of the last count and this value less 1/16, per epoch. A flow
    /// that dips for a few epochs and returns is no join.
    pub backlogged_ref_q8: u64,
    /// Flows that sent a packet in the last finished activity window (0
    /// when that window saw no packet); with `active_now` it caps the
    /// multiplier ([`mult_cap`]).
    pub active_last: u64,
    /// The clock slot up to which the committed count is expired
    /// ([`crate::committed`]).
    pub clock_slot: u64,
    /// The factor that scales the multiplier's cap from flows to this
    /// tin's capacity, Q16 ([`crate::tins::TinView::scale_factors`]); 1.0
    /// for a tin alone (0 reads as 1.0).
    pub cap_scale_q16: u64,
    /// Unused: 64 bytes between the words above and those below, so no
    /// cache line holds both, wherever the map places the value (8-byte
    /// aligned).
    pub _apart: [u64; 8],
    /// Transmission time (at the aggregate rate) of the packets scheduled
    /// to depart in each epoch of the ring, indexed by `epoch % EPOCH_RING`.
    pub scheduled_ns: [u64; EPOCH_RING],
    /// Flows paced at least once in the epoch in progress.
    pub backlogged_now: u64,
    /// Flows that sent a packet in the activity window in progress
    /// ([`ACTIVE_WINDOW_SHIFT`]).
    pub active_now: u64,
    /// The weight of the flows whose clock lies beyond `clock_slot`, Q16
    /// ([`crate::committed`]): the multiplier's floor.
    pub committed: u64,
    /// Transmission time (at the aggregate rate) of the packets passed
    /// unpaced since the last epoch change: the traffic of flows below
    /// their share, which with the committed flows tells whether the link
    /// is full at the current share ([`raise_would_idle`]).
    pub unpaced_ns: u64,
    /// The weight of the flows in each clock slot, indexed by `slot %
    /// CLOCK_SLOTS`.
    pub clock_counts: [u64; CLOCK_SLOTS],
}

const _: () = assert!(core::mem::size_of::<FairState>() == 4392);
const _: () = assert!(
    core::mem::offset_of!(FairState, scheduled_ns)
        - core::mem::offset_of!(FairState, cap_scale_q16)
        >= 64 + 8
);
const _: () = assert!(1 << (EPOCH_SHIFT - CLOCK_SLOT_SHIFT) == committed::SLOTS_PER_EPOCH);

impl FairState {
    /// The active flows the multiplier's cap counts: the larger of the last
    /// and the current activity window's counts.
    pub fn active_flows(&self) -> u64 {
        self.active_last.max(self.active_now)
    }

    /// The backlogged flows the join rule counts: the recent reference,
    /// rounded up to whole flows.
    pub fn backlogged_flows(&self) -> u64 {
        self.backlogged_ref_q8.div_ceil(256)
    }

    /// The committed flows the multiplier's floor counts, as of the last
    /// epoch change ([`crate::committed`]), to the nearest whole flow (under
    /// host isolation, a host's flows together count about one).
    pub fn committed_flows(&self) -> u64 {
        (committed::count_or_zero(self.committed) + committed::WEIGHT_ONE / 2) >> 16
    }

    /// The rate each backlogged flow gets, `rate / m`, for the controller's
    /// views (it divides, so it is not for the packet path).
    pub fn share_bytes_per_s(&self, rate_bytes_per_s: u64) -> u64 {
        let m = self.mult_q16.max(MULT_ONE);
        let share = u128::from(rate_bytes_per_s) * u128::from(MULT_ONE) / u128::from(m);
        u64::try_from(share).unwrap_or(u64::MAX)
    }
}

impl Default for FairState {
    fn default() -> Self {
        Self {
            epoch: 0,
            mult_q16: MULT_ONE,
            scheduled_ns: [0; EPOCH_RING],
            updates: 0,
            scheduled_avg_ns: EPOCH_NS,
            backlogged_now: 0,
            backlogged_ref_q8: 0,
            active_now: 0,
            active_last: 0,
            clock_slot: 0,
            cap_scale_q16: MULT_ONE,
            _apart: [0; 8],
            committed: 0,
            mult_feedback_q16: MULT_ONE,
            unpaced_ns: 0,
            clock_counts: [0; CLOCK_SLOTS],
        }
    }
}

/// The parameters of the per-flow decision, fixed at configuration time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FairParams {
    /// CoDel's target and interval.
    pub codel: CodelParams,
    /// Drop a packet whose departure lies further ahead than this.
    pub horizon_ns: u64,
    /// CE-mark ECN-capable packets instead of dropping them.
    pub ecn: bool,
}

/// What the classifier does with one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Leave now (or at the socket's own departure time): the flow's clock
    /// was idle.
    Pass,
    /// Leave no earlier than `tstamp_ns`.
    Pace {
        /// The departure time to write into `skb->tstamp`.
        tstamp_ns: u64,
    },
    /// CE-mark, then leave no earlier than `tstamp_ns`.
    Mark {
        /// The departure time to write into `skb->tstamp`.
        tstamp_ns: u64,
    },
    /// Drop: CoDel's spaced signal, for a packet that is not ECN-capable.
    CodelDrop,
    /// Drop: the overload rule's signal (the flow is more than an interval
    /// behind), for a packet that is not ECN-capable. Where both rules
    /// signal, the overload is the reason.
    OverloadDrop,
    /// Drop: the departure would lie beyond the horizon.
    HorizonDrop,
}

impl Verdict {
    /// The departure time this verdict schedules, if the packet is kept.
    /// `Pass` departs at `depart_now_ns`.
    #[inline(always)]
    pub fn departure_ns(self, depart_now_ns: u64) -> Option<u64> {
        match self {
            Verdict::Pass => Some(depart_now_ns),
            Verdict::Pace { tstamp_ns } | Verdict::Mark { tstamp_ns } => Some(tstamp_ns),
            Verdict::CodelDrop | Verdict::OverloadDrop | Verdict::HorizonDrop => None,
        }
    }

    /// A drop by the AQM, for either reason.
    #[inline(always)]
    pub fn is_aqm_drop(self) -> bool {
        matches!(self, Verdict::CodelDrop | Verdict::OverloadDrop)
    }
}

/// A packet as the decision sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    /// The time of the decision.
    pub now_ns: u64,
    /// The departure time a socket already asked for, or 0.
    pub skb_tstamp_ns: u64,
    /// Its transmission time at the aggregate rate (wire length).
    pub tx_ns: u64,
    /// The packet is ECN-capable (ECT(0) or ECT(1)), so it may be CE-marked.
    pub ect: bool,
    /// Its earliest departure by the link's clock ([`crate::link`]), or 0:
    /// the flow's clock is lifted to it first.
    pub link_ns: u64,
}

/// A packet's transmission time at the fair share: `tx_ns * m >> 16`,
/// saturating (only reached below about 3 kbit/s).
#[inline(always)]
pub fn fair_tx_ns(tx_ns: u64, mult_q16: u64) -> u64 {
    if tx_ns >> 32 != 0 || mult_q16 >> 32 != 0 {
        return u64::MAX >> 16;
    }
    (tx_ns * mult_q16) >> 16
}

/// Which time CoDel's state machine keeps ([`crate::codel`], the clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodelClock {
    /// Each packet's departure: the pacer, whose signal waits behind the
    /// flow's queue.
    Departure,
    /// The decision's time: the policer, which queues nothing, so its
    /// signal reaches the sender at once.
    Decision,
}

/// Decides one packet of `flow` and advances the flow's clock and CoDel
/// state. Pure apart from `flow`. `mult_q16` is the current fair-share
/// multiplier.
#[inline(always)]
pub fn decide(
    flow: &mut FlowEntry,
    pkt: &Packet,
    mult_q16: u64,
    p: &FairParams,
    clock: CodelClock,
) -> Verdict {
    let t = if pkt.skb_tstamp_ns > pkt.now_ns {
        pkt.skb_tstamp_ns
    } else {
        pkt.now_ns
    };
    let tx_fair = fair_tx_ns(pkt.tx_ns, mult_q16);
    flow.last_seen_ns = pkt.now_ns;
    // The link's clock ahead of the flow's: the flows together exceed the
    // rate, and this one waits its turn on the link too.
    if pkt.link_ns > flow.t_next_ns {
        flow.t_next_ns = pkt.link_ns;
    }
    if pkt.ect && flow.flags & FLOW_ECN == 0 {
        flow.flags |= FLOW_ECN;
    }
    if flow.t_next_ns <= t {
        // Below its share: leave now. CoDel sees no delay (and so leaves
        // any dropping state).
        flow.t_next_ns = t + tx_fair;
        codel_signal(&mut flow.codel, pkt.now_ns, 0, true, &p.codel);
        return Verdict::Pass;
    }
    let depart = flow.t_next_ns;
    let delay = depart - pkt.now_ns;
    if delay > p.horizon_ns {
        return Verdict::HorizonDrop;
    }
    // At most two packets ahead of it: RFC 8289's "queue below one MTU",
    // widened to two packets because TCP small queues
    // (`tcp_small_queue_check`) keep two packets of a local flow in the
    // qdisc whatever their size: with 64 KB GSO packets at a low share that
    // is already far above target, and signalling it only shrinks cwnd.
    let small_backlog = delay <= 2 * tx_fair;
    // Overload: a flow more than a whole interval behind (slow start
    // overshooting, an unresponsive sender) is signalled on every packet
    // instead of at CoDel's spacing, which needs several intervals to catch
    // up. Without it such flows ran into the horizon and lost whole
    // windows at once (86 horizon drops in the VM's ECN test). ECN-capable
    // senders that ignore the marks still meet the horizon.
    // Not for the Not-ECT packets of an ECN-capable flow (with ECN on):
    // those are retransmissions (RFC 3168, 6.1.5) or control, and dropping
    // each of them turned one mark per RTT into timeouts (aqm_drop 205
    // beside 472 marks in the VM's ECN test). CoDel still may.
    let ecn_flow = p.ecn && flow.flags & FLOW_ECN != 0;
    let overload = !small_backlog && delay > p.codel.interval_ns && (pkt.ect || !ecn_flow);
    let codel_now = match clock {
        CodelClock::Departure => depart,
        CodelClock::Decision => pkt.now_ns,
    };
    let codel = codel_signal(&mut flow.codel, codel_now, delay, small_backlog, &p.codel);
    if overload || codel {
        if !(p.ecn && pkt.ect) {
            // A dropped packet uses no departure slot.
            return if overload {
                Verdict::OverloadDrop
            } else {
                Verdict::CodelDrop
            };
        }
        flow.t_next_ns = depart + tx_fair;
        return Verdict::Mark { tstamp_ns: depart };
    }
    flow.t_next_ns = depart + tx_fair;
    Verdict::Pace { tstamp_ns: depart }
}

/// Folds one finished epoch's scheduled time into the moving average
/// (weight 1/4: at 1/2 the lumps still biased the closed loop 4% under the
/// rate; joining flows are handled by [`join_mult`] instead). Per-epoch totals are lumpy (a 64 KB GSO packet at 20 Mbit/s
/// is 26 ms, three epochs, counted in one), and a multiplicative update on
/// lumpy input is biased towards a smaller multiplier, i.e. a pacer that
/// overshoots the rate; the average removes the lumps first.
#[inline(always)]
pub fn average_scheduled(avg_ns: u64, scheduled_ns: u64) -> u64 {
    avg_ns - (avg_ns >> 2) + (scheduled_ns >> 2)
}

/// The ring slot that counts a departure at `depart_ns` while `epoch` is in
/// progress: its own epoch's, or the last of the ring when it lies further
/// ahead. Departures are never before `now`, so never in a past epoch.
#[inline(always)]
pub fn departure_slot(epoch: u64, depart_ns: u64) -> usize {
    let e = depart_ns >> EPOCH_SHIFT;
    let last = epoch + (EPOCH_RING as u64 - 1);
    let e = if e > last { last } else { e };
    // Cannot truncate: the remainder is below EPOCH_RING.
    (e % EPOCH_RING as u64) as usize
}

/// The new multiplier after an epoch whose (averaged) scheduled departures
/// took `scheduled_ns` at the aggregate rate: a quarter of a CSFQ step
/// towards `m * scheduled / epoch`, taken in the log domain so that lumps
/// which average to a full link leave `m` where it was: `m' = m * exp(d/4)`
/// with `d = ratio - 1`, as `1 + d/4 + d^2/32` (a plain `(1 + ratio) / 2`
/// step shrinks `m` under zero-mean noise, by Jensen's inequality, and the
/// pacer then overshoots). The ratio is clamped to [1/2, 2], the result to
/// [`mult_min_q16`, MULT_MAX) ([`Level::mult_min_q16`]).
///
/// Why a quarter: TCP answers a new share about one RTT plus its queue
/// later (three or more epochs), and a half step per epoch makes the loop
/// oscillate; the cost is a slower take-up of a share that flows leave.
/// `docs/pacer.md` (method, step 2) has the measurements.
#[inline(always)]
pub fn update_mult(mult_q16: u64, scheduled_ns: u64, mult_min_q16: u64) -> u64 {
    // scheduled / epoch in Q16, clamped.
    let ratio = (scheduled_ns >> (EPOCH_SHIFT - 16)).clamp(MULT_ONE / 2, 2 * MULT_ONE);
    // d in [-1/2, 1] (Q16); d^2 below 2^32, so every product fits.
    let d = ratio as i64 - MULT_ONE as i64;
    let factor = MULT_ONE as i64 + d / 4 + ((d * d) >> 16) / 32;
    // factor in [0.88, 1.29] (Q16) and m < 2^32: the product fits.
    let next = (mult_q16 * factor as u64) >> 16;
    next.clamp(mult_min_q16, MULT_MAX - 1)
}

/// The most flows the join rule ([`join_mult`]) acts among: beyond, one
/// more changes the share by under 2%, and the feedback alone follows.
pub const JOIN_MAX_FLOWS: u64 = 64;

/// `1/n` in Q16, rounded, for `n` in `1..N`, with `at_zero` at index 0:
/// the tables through which the packet path never divides.
pub const fn reciprocals_q16<const N: usize>(at_zero: u32) -> [u32; N] {
    let mut t = [0u32; N];
    t[0] = at_zero;
    let mut n = 1;
    while n < N {
        t[n] = ((1u32 << 16) + n as u32 / 2) / n as u32;
        n += 1;
    }
    t
}

/// `1/n` in Q16 for `n` in 1..=[`JOIN_MAX_FLOWS`], for [`join_mult`] and
/// [`unpaced_floor`].
const RECIPROCAL_Q16: [u32; JOIN_MAX_FLOWS as usize + 1] = reciprocals_q16(0);

/// Epochs per activity window, as a shift: 2^5 epochs, about 268 ms. A
/// flow counts as active in a window when it sent a packet in it, so the
/// window must be longer than the gap between the packets of a flow at its
/// share: a 64 KB GSO packet at a 20 Mbit/s link shared by 8 flows is one
/// every 210 ms. A shorter window undercounts such flows, caps `m` below
/// the water level, and the pacer overshoots.
pub const ACTIVE_WINDOW_SHIFT: u32 = 5;

/// Counts `flow` as active in the window of `epoch` (it just sent a
/// packet, whatever the verdict). Returns true the first time per window,
/// when the caller adds it to [`FairState::active_now`]. The mark is the
/// window number's low 32 bits plus one (1 when that wraps to 0), so a fresh
/// entry (0) is never taken as counted.
#[inline(always)]
pub fn count_active(flow: &mut FlowEntry, epoch: u64) -> bool {
    mark_once(&mut flow.active_epoch, epoch >> ACTIVE_WINDOW_SHIFT)
}

/// Sets `mark` to period `period`'s mark, its low 32 bits plus one (1 when
/// that wraps to 0, so a fresh mark, 0, is never taken as set); true when
/// it held another period's, i.e. the first time per period.
#[inline(always)]
pub fn mark_once(mark: &mut u32, period: u64) -> bool {
    let m = period_mark(period);
    if *mark == m {
        return false;
    }
    *mark = m;
    true
}

/// The mark [`mark_once`] sets for `period`.
#[inline(always)]
pub fn period_mark(period: u64) -> u32 {
    (period as u32).wrapping_add(1).max(1)
}

/// The activity counts after the epoch moves from `old` to `new` (`new >
/// old`): `(active_last, active_now)`. Unchanged within a window; at the
/// next window the count in progress becomes the last; after a longer gap
/// both are 0.
#[inline(always)]
pub fn roll_active(active_last: u64, active_now: u64, old: u64, new: u64) -> (u64, u64) {
    let (w_old, w_new) = (old >> ACTIVE_WINDOW_SHIFT, new >> ACTIVE_WINDOW_SHIFT);
    if w_new == w_old {
        (active_last, active_now)
    } else if w_new == w_old + 1 {
        (active_now, 0)
    } else {
        (0, 0)
    }
}

/// The largest multiplier the water level allows: the larger of the last
/// window's and this window's count of active flows, plus one, in Q16.
///
/// Why: with `n` active flows, `sum(min(r_i, C/m)) = C` has its solution at
/// `m <= n` (each flow takes at most `C/m`, so `n * C/m >= C`). The
/// accepted-traffic feedback alone does not know this: slow-start bursts
/// are accepted far faster than they can depart and would drive `m` far
/// above the flows' number, and their delays into the horizon. The slack
/// of one covers a flow whose packets are further apart than a window.
///
/// Known cost: the feedback swings around the water level with TCP flows
/// and the cap clips only the upper swings, so the mean share rises a
/// little above the rate; a looser cap lets the join case oscillate. The
/// cure is a better-damped share estimate, not a looser cap
/// (`docs/pacer.md`, method, step 4, has the measurements).
#[inline(always)]
pub fn mult_cap(active_last: u64, active_now: u64) -> u64 {
    let n = if active_now > active_last {
        active_now
    } else {
        active_last
    };
    // n is at most the flow table's size (far below 2^31): no overflow.
    let cap = (n + 1) << 16;
    cap.clamp(MULT_ONE, MULT_MAX - 1)
}

/// True when raising the multiplier `mult_q16` would only idle the link
/// further, among at most [`JOIN_MAX_FLOWS`] `active` flows: most of the
/// share's flows are committed (`2b >= m`, `b` their weight in Q16,
/// [`crate::committed`]: they are sending, not paused
/// together; `b` scaled by `floor_q16` to the tin's capacity,
/// [`crate::tins::TinView::scale_factors`]), and yet they, each departing at
/// `C/m`, and the traffic passed unpaced since the last epoch change
/// (`unpaced_ns` of transmission time at the aggregate rate) fall short of
/// the capacity the tin has (`capacity_ns` per epoch, the whole epoch for a
/// tin alone), `b/m + unpaced/epoch < capacity/epoch`, taken as
/// `b + m * unpaced/epoch < m * capacity/epoch` (multiplications only).
///
/// Why: the feedback reads the traffic *accepted* per epoch, and traffic
/// accepted faster than it can depart reads as demand. When flows join, the
/// window a shrinking share left in flight and the newcomers' slow-start
/// bursts are accepted within a round trip, the feedback took `m` past the
/// flows' number to the active-flow cap, and the link idled while the
/// queues behind the share grew (the simulator's join: `m` 6 for 150 ms
/// where 4 is fair). A raise blocked here leaves the departures below the
/// rate, so it cannot make the pacer overshoot. Not when fewer than half
/// are committed: after many flows back off together their clocks run out
/// and they are silent for a round trip, a raise then anticipates their
/// return, and holding `m` there let 256 simulated flows overshoot the rate.
/// Only among as many flows as the join rule acts among, where the hold
/// answers that rule's overshoot and was measured; beyond, the feedback
/// goes on as before. `docs/pacer.md` (method, step 5) has the
/// measurements.
#[inline(always)]
pub fn raise_would_idle(
    mult_q16: u64,
    committed_q16: u64,
    unpaced_ns: u64,
    active: u64,
    capacity_ns: u64,
    floor_q16: u64,
) -> bool {
    // At most two epochs' worth: m < 2^32 and 2^24, so the product fits.
    let unpaced = if unpaced_ns > 2 * EPOCH_NS {
        2 * EPOCH_NS
    } else {
        unpaced_ns
    };
    let capacity = if capacity_ns > EPOCH_NS {
        EPOCH_NS
    } else {
        capacity_ns
    };
    // committed is below 2^40 (the flow table's size in weights) and the
    // factor at most 64 (2^22): no overflow; m < 2^32 and capacity <= 2^23.
    let b = committed_q16;
    let b_scaled = (committed_q16 * floor_q16.min(1 << 22)) >> 32 << 16;
    active <= JOIN_MAX_FLOWS
        && 2 * b_scaled >= mult_q16
        && b + ((mult_q16 * unpaced) >> EPOCH_SHIFT) < (mult_q16 * capacity) >> EPOCH_SHIFT
}

/// The feedback's multiplier `fb_q16` kept to at least half the one the
/// packets get, `m_q16` (after [`bound_mult`]).
///
/// Why: while the committed flows' floor holds `m` up, the link is full and
/// the feedback reads a ratio near 1 whatever its own value, so any fall it
/// took while the link was short (a TCP flow's reduction, a slow start)
/// stays. Over hosts it drifted to a sixth of the applied `m`, and when the
/// floor let go (a host's flows committed less together) every flow was
/// paced at six times its share for an epoch: the simulator's host join
/// carried 41 ms of excess in 100 ms windows. Over flows, once the join
/// step stopped at equal shares ([`join_mult`]) and no longer lifted the
/// feedback, the same fall took `m` from 8 to 1.7 in the VM and filled the
/// emulated DSL link's FIFO (ping p99 100 ms against CAKE's 29). Held
/// within half, a floor that lets go takes the share down
/// by at most half at once, and the feedback keeps the room below `m` that
/// it needs over hosts to hand a host's unused share to its other flows
/// (held within a quarter, hosts of 1, 4 and 16 flows left 7% of the link
/// idle). `docs/pacer.md` (method, step 5, and "Host isolation") has the
/// measurements.
#[inline(always)]
pub fn hold_feedback(fb_q16: u64, m_q16: u64) -> u64 {
    max_flat(fb_q16, m_q16 - (m_q16 >> 1))
}

/// The larger of `a` and `b`, both below 2^63, by arithmetic: no branch
/// for the BPF verifier to walk twice.
#[inline(always)]
pub fn max_flat(a: u64, b: u64) -> u64 {
    let d = b.wrapping_sub(a);
    // All ones where `b < a`.
    let b_less = ((d as i64) >> 63) as u64;
    a.wrapping_add(d & !b_less)
}

/// The smaller of `a` and `b`, both below 2^63, by arithmetic.
#[inline(always)]
pub fn min_flat(a: u64, b: u64) -> u64 {
    let d = b.wrapping_sub(a);
    let b_less = ((d as i64) >> 63) as u64;
    a.wrapping_add(d & b_less)
}

/// The multiplier within its bounds: at most `cap_q16` ([`mult_cap`]), and
/// at least `floor_q16`, the committed flows ([`crate::committed`]) scaled
/// to the tin's capacity, where that is below the cap: with `b` flows each
/// departing at `C/m`, `m < b` commits the link to more than its rate.
#[inline(always)]
pub fn bound_mult(m_q16: u64, cap_q16: u64, floor_q16: u64) -> u64 {
    let m = if m_q16 > cap_q16 { cap_q16 } else { m_q16 };
    let floor = floor_q16;
    let floor = if floor > cap_q16 { cap_q16 } else { floor };
    if m < floor { floor } else { m }
}

/// What the water level is kept over, for the epoch roll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Level {
    /// The least multiplier: 1.0 over flows (no flow is paced faster than
    /// the rate). Over hosts a flow is paced at `m` times its host's bulk
    /// flows ([`crate::hosts`]), and `m` goes below 1.0 when a host's
    /// flows leave part of its share unused.
    pub mult_min_q16: u64,
    /// Floor the multiplier by the committed flows *and* the traffic passed
    /// unpaced ([`unpaced_floor`]).
    pub unpaced_floor: bool,
}

impl Level {
    /// The water level over flows.
    pub const FLOWS: Level = Level {
        mult_min_q16: MULT_ONE,
        unpaced_floor: false,
    };
    /// The water level over hosts: `m` as low as 1/1024, where one flow
    /// of a host with the most bulk flows a host's count holds takes the
    /// rate alone (`crate::hosts` asserts that the two agree).
    pub const HOSTS: Level = Level {
        mult_min_q16: MULT_ONE >> 10,
        unpaced_floor: true,
    };
}

/// The most of an epoch the traffic passed unpaced is taken to fill in
/// [`unpaced_floor`], in 64ths: three quarters, so the floor at most
/// quadruples.
const UNPACED_MOST_64THS: u64 = 48;

/// The committed flows' floor `b` (Q16) raised to what they may take
/// beside the traffic passed unpaced since the last epoch change
/// (`unpaced_ns` of transmission time at the aggregate rate): with `u` the
/// fraction of the epoch that traffic filled, `b / (1 - u)`, by the
/// reciprocals' table (`u` rounded down to 64ths, at most
/// three quarters), so nothing divides.
///
/// Why: a flow below its share passes unpaced, and the committed flows fill
/// `C/m` each whatever it sends. With few units (two hosts), one TCP sender
/// returning from a reduction while the feedback had lowered `m` for it
/// takes the link over the rate until the feedback catches up
/// (`docs/pacer.md`, "Host isolation", has the measurements). Over flows
/// it is not applied ([`Level::FLOWS`]).
#[inline(always)]
pub fn unpaced_floor(floor_q16: u64, unpaced_ns: u64) -> u64 {
    // Cannot truncate below 64: the shift leaves at most 2 × 64.
    let u = (unpaced_ns >> (EPOCH_SHIFT - 6)).min(UNPACED_MOST_64THS);
    let Some(&recip) = RECIPROCAL_Q16.get((64 - u) as usize) else {
        return floor_q16;
    };
    // floor < 2^40 (weights) and 64 × 1/16 in Q16 < 2^17: the product fits.
    let floor = if floor_q16 > 1 << 40 {
        1 << 40
    } else {
        floor_q16
    };
    (floor * 64 * u64::from(recip)) >> 16
}

/// True when the epoch change from `old` to `new` ends an activity window
/// ([`ACTIVE_WINDOW_SHIFT`]).
#[inline(always)]
pub fn window_ends(old: u64, new: u64) -> bool {
    (old >> ACTIVE_WINDOW_SHIFT) != (new >> ACTIVE_WINDOW_SHIFT)
}

/// Counts `flow` as backlogged in `epoch` (it was just paced). Returns true
/// the first time per epoch, when the caller adds it to
/// [`FairState::backlogged_now`]. The mark is the epoch's low 32 bits plus
/// one (1 when that wraps to 0), so a fresh entry (0) is never taken as
/// counted.
#[inline(always)]
pub fn count_backlogged(flow: &mut FlowEntry, epoch: u64) -> bool {
    mark_once(&mut flow.backlog_epoch, epoch)
}

/// The reference count of backlogged flows (Q8) after one more finished
/// epoch, before that epoch's count is taken in: less 1/16.
#[inline(always)]
pub fn decay_reference(ref_q8: u64) -> u64 {
    ref_q8 - (ref_q8 >> 4)
}

/// The reference count of backlogged flows once the finished epochs have
/// decayed it to `decayed_q8` ([`decay_reference`] once per epoch, at most
/// [`EPOCH_RING`] times): the larger of that and `n_last`, the last epoch's
/// count, when only one epoch finished (after a longer gap the last count
/// is from an epoch without packets). Multiplications and shifts only.
#[inline(always)]
pub fn backlogged_reference(decayed_q8: u64, n_last: u64, one_epoch: bool) -> u64 {
    let last = if one_epoch { n_last << 8 } else { 0 };
    if last > decayed_q8 { last } else { decayed_q8 }
}

/// The immediate reaction to a flow becoming backlogged: when `n_now`
/// flows have been paced in this epoch and that is more than the reference
/// `n_prev` (the recent maximum, at least 1), the share shrinks at once by
/// `n_now / (n_now - 1)`, as it would with `n_now` equal shares. Without it
/// the feedback needed ~100 ms after a flow joined, while the newcomer's
/// slow start was stamped at the old share (the simulator's join case).
/// Not beyond [`JOIN_MAX_FLOWS`]. The result is at most `cap_q16`
/// ([`mult_cap`]), and at most `n_now` (equal shares) unless `m` was
/// already higher: a TCP flow that returns after a reduction long enough
/// for the reference to decay counts as a join, and with `m` already at the
/// flows' number the step took every share an eighth below the fair one
/// (in the VM, 4 TCP flows beside 4 UDP streams: `m` 8.0 to 9.4, 7% of
/// the link idle against CAKE's).
#[inline(always)]
pub fn join_mult(mult_q16: u64, n_now: u64, n_prev: u64, cap_q16: u64) -> u64 {
    let floor = if n_prev == 0 { 1 } else { n_prev };
    if n_now <= floor || n_now > JOIN_MAX_FLOWS {
        return mult_q16;
    }
    // m * n * (1/(n-1)): m < 2^32, n <= 64, 1/(n-1) <= 2^16.
    const _: () = assert!(JOIN_MAX_FLOWS <= 64);
    // `get` rather than indexing: no panic path for the verifier to reject.
    let Some(&recip) = RECIPROCAL_Q16.get((n_now - 1) as usize) else {
        return mult_q16;
    };
    let next = (mult_q16 * n_now * u64::from(recip)) >> 16;
    // Not past equal shares: where `m` already gives the `n_now` flows no
    // more than equal shares, the newcomer has its share.
    let next = max_flat(min_flat(next, n_now << 16), mult_q16);
    let next = if next > cap_q16 { cap_q16 } else { next };
    next.clamp(MULT_ONE, MULT_MAX - 1)
}

/// How many epochs an epoch change from `old` to `new` (`new > old`)
/// finishes and must measure and clear, oldest first: all of them, or the
/// whole ring after a longer gap.
#[inline(always)]
pub fn slots_to_clear(old: u64, new: u64) -> u64 {
    let gap = new - old;
    if gap > EPOCH_RING as u64 {
        EPOCH_RING as u64
    } else {
        gap
    }
}

#[cfg(test)]
mod tests;
