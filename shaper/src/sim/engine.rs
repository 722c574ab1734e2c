//! The event loop: a time-ordered queue of source and ACK events, the
//! sources' behaviour, and the pacer step that every packet goes through.
//!
//! The pacer step is the BPF classifier's sequence on a private copy of the
//! shared state (see the module header of [`super`]): roll the epoch, decide,
//! under the link's clock (`shaper_common::link`), move the flow's clock in
//! the committed count, count the kept packet's
//! transmission time in its slot. Events
//! at the same instant run in the order they were queued, so a run is a
//! function of the scenario alone.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};

use shaper_common::fair::{
    EPOCH_SHIFT, FairParams, FairState, Level, Packet, Verdict, departure_slot,
};
use shaper_common::flow::FlowEntry;
use shaper_common::hosts::{HostEntry, HostLevels, Side, pace_hosts};
use shaper_common::link::{LinkState, on_link};
use shaper_common::rate::ScaledRate;
use shaper_common::shared::{account, pace, roll_epoch};
use shaper_common::tins::{MAX_TINS, TinState};

use super::report::{Departure, FlowReport, SimReport, VerdictCounts};
use super::rng::SplitMix64;
use super::{Accounting, BULK_PACKET_BYTES, Mode, PoliceRule, Scenario, SimError, Source};

mod police;

/// Initial window of an AIMD sender, packets (RFC 6928).
const INITIAL_WINDOW: f64 = 10.0;
/// Smallest window after a reduction, packets.
const MIN_WINDOW: f64 = 2.0;
/// Random delay of each flow's first packet: up to 1 ms.
const START_JITTER_NS: u64 = 1_000_000;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Start,
    Stop,
    /// The next packet of a sparse or unresponsive source.
    Emit,
    /// An ACK of packet `seq`, echoing a CE mark or not.
    Ack {
        ce: bool,
        seq: u64,
    },
    /// The sender notices that packet `seq` was lost.
    Loss {
        seq: u64,
    },
    /// Police mode: packet `seq` leaves the upstream FIFO and reaches the
    /// policer.
    Arrive {
        seq: u64,
        len: u32,
        ect: bool,
        /// When it entered the FIFO.
        sent_ns: u64,
    },
}

#[derive(Clone, Copy, Debug)]
struct Event {
    t_ns: u64,
    seq: u64,
    flow: usize,
    kind: Kind,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        (self.t_ns, self.seq) == (o.t_ns, o.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    /// Reversed: `BinaryHeap` is a max-heap and the earliest event must pop
    /// first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.t_ns, o.seq).cmp(&(self.t_ns, self.seq))
    }
}

/// An AIMD sender's window state, in packets.
#[derive(Clone, Copy, Debug)]
struct Aimd {
    cwnd: f64,
    ssthresh: f64,
    inflight: u64,
    /// No growth and no second reduction for signals about packets sent
    /// before this one (the first packet sent after a reduction): one
    /// reduction per window of data, as NewReno's recovery point and TCP's
    /// CWR state (RFC 3168, 6.1.2) have it. (A fixed base RTT instead halved
    /// a window every RTT for as long as its queue lasted.)
    recover_seq: u64,
}

/// One flow during the run.
struct FlowRt {
    source: Source,
    active: bool,
    stop_ns: u64,
    entry: FlowEntry,
    /// The tin its packets are in.
    tin: usize,
    /// Its source and destination hosts.
    hosts: (u32, u32),
    aimd: Aimd,
    /// Packets sent so far (the next packet's number).
    sent: u64,
    /// When the flow's previous packet leaves, for sch_fq's FIFO.
    last_depart_ns: u64,
    /// Start of the periodic emission schedule and packets emitted on it.
    emit_base_ns: u64,
    report: FlowReport,
}

/// The run in progress.
struct Sim<'a> {
    sc: &'a Scenario,
    rate: ScaledRate,
    /// Each tin's shared state; the policer uses the first.
    fairs: Vec<FairState>,
    /// The tins' table.
    tins: TinState,
    flows: Vec<FlowRt>,
    queue: BinaryHeap<Event>,
    next_seq: u64,
    rng: SplitMix64,
    link: Vec<Departure>,
    mult_trace: Vec<(u64, u64)>,
    /// Police mode: when the upstream FIFO is next free, ns.
    upstream_free_ns: u64,
    /// Police mode: the policer's link state.
    police_link: shaper_common::police::LinkState,
    /// Each tin's host states, when the scenario isolates hosts.
    hosts: Vec<Hosts>,
    /// The link's clock ([`shaper_common::link`]), shared by every tin.
    link_state: LinkState,
}

/// One tin's hosts, by number, as sources and as destinations.
#[derive(Default)]
struct Hosts {
    src: BTreeMap<u32, HostEntry>,
    dst: BTreeMap<u32, HostEntry>,
}

impl Hosts {
    /// The unit host of a flow between `src` and `dst` under `levels`, and
    /// its other host with whether that one weighs the flow (the step's
    /// `peer`).
    fn pick(
        &mut self,
        (src, dst): (u32, u32),
        levels: HostLevels,
    ) -> (&mut HostEntry, (&mut HostEntry, u64)) {
        let src = self.src.entry(src).or_default();
        let dst = self.dst.entry(dst).or_default();
        let (unit, other) = match levels.unit {
            Side::Src => (src, dst),
            Side::Dst => (dst, src),
        };
        (unit, (other, u64::from(levels.peer.is_some())))
    }
}

/// Runs `sc` to its end and returns what happened. Deterministic: the same
/// scenario (seed included) gives the same report.
pub fn run(sc: &Scenario) -> Result<SimReport, SimError> {
    let rate = ScaledRate::from_bytes_per_s(sc.rate_bytes_per_s).ok_or(SimError::Rate {
        rate_bytes_per_s: sc.rate_bytes_per_s,
    })?;
    for (i, f) in sc.flows.iter().enumerate() {
        validate(i, &f.source)?;
    }
    let per_flow_rule = matches!(
        sc.mode,
        Mode::Police {
            rule: PoliceRule::PerFlow,
            ..
        }
    );
    if sc.isolation.levels(true).is_some() && per_flow_rule {
        return Err(SimError::IsolationPoliced(sc.isolation.keyword()));
    }
    let mut sim = Sim {
        sc,
        rate,
        fairs: vec![FairState::default(); MAX_TINS],
        tins: TinState::new(sc.diffserv),
        flows: Vec::with_capacity(sc.flows.len()),
        queue: BinaryHeap::new(),
        next_seq: 0,
        rng: SplitMix64::new(sc.seed),
        link: Vec::new(),
        mult_trace: Vec::new(),
        upstream_free_ns: 0,
        police_link: Default::default(),
        hosts: (0..MAX_TINS).map(|_| Hosts::default()).collect(),
        link_state: LinkState::default(),
    };
    for (i, f) in sc.flows.iter().enumerate() {
        sim.flows.push(FlowRt {
            source: f.source,
            active: false,
            stop_ns: f.stop_ns.unwrap_or(u64::MAX),
            entry: FlowEntry::fresh(i as u32 + 1, 0),
            tin: f.tin.min(sc.diffserv.tins() - 1),
            hosts: f.hosts,
            aimd: Aimd {
                cwnd: INITIAL_WINDOW,
                ssthresh: f64::INFINITY,
                inflight: 0,
                recover_seq: 0,
            },
            sent: 0,
            last_depart_ns: 0,
            emit_base_ns: 0,
            report: FlowReport {
                source: f.source,
                verdicts: VerdictCounts::default(),
                delivered: Vec::new(),
                delays: Vec::new(),
                reordered: 0,
                reductions: 0,
                upstream_delays: Vec::new(),
                upstream_drops: 0,
            },
        });
        let jitter = sim.rng.below(START_JITTER_NS);
        sim.push(f.start_ns + jitter, i, Kind::Start);
        if let Some(stop) = f.stop_ns {
            sim.push(stop, i, Kind::Stop);
        }
    }
    while let Some(ev) = sim.queue.pop() {
        if ev.t_ns >= sc.duration_ns {
            break;
        }
        sim.handle(ev);
    }
    Ok(sim.finish())
}

/// The pacer's step over hosts for one packet ([`pace_hosts`]).
struct HostStep<'a> {
    pkt: &'a Packet,
    epoch: u64,
    mult_q16: u64,
    params: &'a FairParams,
    committed: bool,
}

impl HostStep<'_> {
    fn run(
        &self,
        fair: &mut FairState,
        flow: &mut FlowEntry,
        hosts: &mut Hosts,
        (src, dst): (u32, u32),
        levels: HostLevels,
    ) -> Verdict {
        let (unit, peer) = hosts.pick((src, dst), levels);
        let (pkt, e, m, p) = (self.pkt, self.epoch, self.mult_q16, self.params);
        if self.committed {
            pace_hosts::<_, true>(fair, flow, unit, peer, pkt, e, m, p)
        } else {
            pace_hosts::<_, false>(fair, flow, unit, peer, pkt, e, m, p)
        }
    }
}

fn validate(flow: usize, s: &Source) -> Result<(), SimError> {
    let bad = |reason| Err(SimError::Flow { flow, reason });
    match *s {
        Source::Aimd { rtt_ns: 0, .. } => bad("zero RTT"),
        Source::Sparse {
            interval_ns, len, ..
        } if interval_ns == 0 || len == 0 => bad("zero interval or length"),
        Source::Unresponsive {
            rate_bytes_per_s,
            len,
            ..
        } if rate_bytes_per_s == 0 || len == 0 => bad("zero rate or length"),
        _ => Ok(()),
    }
}

impl Sim<'_> {
    fn push(&mut self, t_ns: u64, flow: usize, kind: Kind) {
        self.queue.push(Event {
            t_ns,
            seq: self.next_seq,
            flow,
            kind,
        });
        self.next_seq += 1;
    }

    fn handle(&mut self, ev: Event) {
        let now = ev.t_ns;
        let i = ev.flow;
        match ev.kind {
            Kind::Start => {
                let f = &mut self.flows[i];
                if now >= f.stop_ns {
                    return;
                }
                f.active = true;
                f.emit_base_ns = now;
                match f.source {
                    Source::Aimd { .. } => self.fill_window(i, now),
                    _ => self.emit(i, now),
                }
            }
            Kind::Stop => self.flows[i].active = false,
            Kind::Emit => self.emit(i, now),
            Kind::Ack { ce, seq } => self.on_ack(i, now, ce, seq),
            Kind::Loss { seq } => self.on_loss(i, now, seq),
            Kind::Arrive {
                seq,
                len,
                ect,
                sent_ns,
            } => self.police_arrive(i, now, seq, len, ect, sent_ns),
        }
    }

    /// A periodic source sends its next packet and schedules the one after.
    fn emit(&mut self, i: usize, now: u64) {
        if !self.flows[i].active {
            return;
        }
        let (len, period_num, period_den) = match self.flows[i].source {
            Source::Sparse {
                interval_ns, len, ..
            } => (len, u128::from(interval_ns), 1u128),
            Source::Unresponsive {
                rate_bytes_per_s,
                len,
                ..
            } => (
                len,
                u128::from(len) * 1_000_000_000,
                u128::from(rate_bytes_per_s),
            ),
            Source::Aimd { .. } => return,
        };
        self.send(i, now, len, false);
        // The k-th packet is due at base + k * period, plus a jitter below
        // half a period, so the order of a flow's packets never changes.
        let f = &self.flows[i];
        let k = u128::from(f.sent);
        let due = f.emit_base_ns + u64::try_from(k * period_num / period_den).unwrap_or(u64::MAX);
        let period = u64::try_from(period_num / period_den).unwrap_or(u64::MAX);
        let jitter = self.rng.below(period / 2);
        self.push(due.saturating_add(jitter).max(now + 1), i, Kind::Emit);
    }

    /// An AIMD sender sends while its window allows.
    fn fill_window(&mut self, i: usize, now: u64) {
        let ecn = matches!(self.flows[i].source, Source::Aimd { ecn: true, .. });
        loop {
            let f = &self.flows[i];
            if !f.active || f.aimd.inflight as f64 >= f.aimd.cwnd.floor() {
                return;
            }
            self.flows[i].aimd.inflight += 1;
            self.send(i, now, BULK_PACKET_BYTES, ecn);
        }
    }

    fn on_ack(&mut self, i: usize, now: u64, ce: bool, seq: u64) {
        let a = &mut self.flows[i].aimd;
        a.inflight = a.inflight.saturating_sub(1);
        let recovering = seq < a.recover_seq;
        if !recovering && !ce {
            a.cwnd += if a.cwnd < a.ssthresh {
                1.0
            } else {
                1.0 / a.cwnd
            };
        }
        if !recovering && ce {
            self.reduce(i);
        }
        self.fill_window(i, now);
    }

    fn on_loss(&mut self, i: usize, now: u64, seq: u64) {
        let a = &mut self.flows[i].aimd;
        a.inflight = a.inflight.saturating_sub(1);
        if seq >= a.recover_seq {
            self.reduce(i);
        }
        self.fill_window(i, now);
    }

    /// Multiplicative decrease, once per window of data.
    fn reduce(&mut self, i: usize) {
        let f = &mut self.flows[i];
        f.aimd.cwnd = (f.aimd.cwnd / 2.0).max(MIN_WINDOW);
        f.aimd.ssthresh = f.aimd.cwnd;
        f.aimd.recover_seq = f.sent;
        f.report.reductions += 1;
    }

    /// One packet of flow `i` reaches the pacer at `now`: the classifier's
    /// steps, then sch_fq and the path.
    fn send(&mut self, i: usize, now: u64, len: u32, ect: bool) {
        if let Mode::Police { .. } = self.sc.mode {
            return self.police_send(i, now, len, ect);
        }
        let epoch = now >> EPOCH_SHIFT;
        let tin = self.flows[i].tin;
        let fair = &mut self.fairs[tin];
        if epoch > fair.epoch {
            let level = match self.sc.isolation.levels(true) {
                Some(_) => Level::HOSTS,
                None => Level::FLOWS,
            };
            if self.sc.committed_floor {
                roll_epoch::<_, _, true>(fair, &mut self.tins, tin, epoch, level);
            } else {
                roll_epoch::<_, _, false>(fair, &mut self.tins, tin, epoch, level);
            }
            if tin == 0 {
                self.mult_trace.push((now, fair.mult_q16));
            }
        }
        let tx_ns = self.rate.tx_time_ns(len);
        let pkt = Packet {
            now_ns: now,
            skb_tstamp_ns: 0,
            tx_ns,
            ect,
            link_ns: 0,
        };
        let mult = fair.mult_q16;
        let params = self.sc.params;
        let f = &mut self.flows[i];
        let seq = f.sent;
        f.sent += 1;
        let (isolation, committed) = (self.sc.isolation.levels(true), self.sc.committed_floor);
        let hosts = &mut self.hosts[tin];
        let mut step = |pkt: &Packet| match isolation {
            Some(levels) => {
                let step = HostStep {
                    pkt,
                    epoch,
                    mult_q16: mult,
                    params: &params,
                    committed,
                };
                step.run(fair, &mut f.entry, hosts, f.hosts, levels)
            }
            None if committed => pace::<_, true>(fair, &mut f.entry, pkt, epoch, mult, &params),
            None => pace::<_, false>(fair, &mut f.entry, pkt, epoch, mult, &params),
        };
        let verdict = if self.sc.link_clock {
            on_link(&mut self.link_state, &pkt, &params, step)
        } else {
            step(&pkt)
        };
        let v = &mut f.report.verdicts;
        match verdict {
            Verdict::Pass => v.pass += 1,
            Verdict::Pace { .. } => v.paced += 1,
            Verdict::Mark { .. } => v.mark += 1,
            Verdict::CodelDrop => v.aqm_drop += 1,
            Verdict::OverloadDrop => {
                v.aqm_drop += 1;
                v.overload_drop += 1;
            }
            Verdict::HorizonDrop => v.horizon_drop += 1,
        }
        let rtt = f.source.rtt_ns();
        let Some(stamp) = verdict.departure_ns(now) else {
            // Noticed about one RTT after the flow's next departure.
            if matches!(f.source, Source::Aimd { .. }) {
                let t = f.entry.t_next_ns.max(now) + rtt;
                self.push(t, i, Kind::Loss { seq });
            }
            return;
        };
        match self.sc.accounting {
            Accounting::Departure => {
                fair.scheduled_ns[departure_slot(epoch, stamp)] += tx_ns;
            }
            Accounting::Decision => account(fair, epoch, tx_ns),
        }
        // sch_fq: at the stamp, but never before the flow's previous packet.
        if stamp < f.last_depart_ns {
            f.report.reordered += 1;
        }
        let depart = stamp.max(f.last_depart_ns).max(now);
        f.last_depart_ns = depart;
        f.report.delays.push((now, stamp - now));
        let received = depart + rtt / 2;
        let total = f.report.delivered.last().map_or(0, |&(_, b)| b) + u64::from(len);
        f.report.delivered.push((received, total));
        self.link.push(Departure {
            depart_ns: depart,
            stamp_ns: stamp,
            arrival_ns: now,
            flow: i as u32,
            wire_bytes: len,
            seq,
        });
        if matches!(f.source, Source::Aimd { .. }) {
            let ce = matches!(verdict, Verdict::Mark { .. });
            self.push(depart + rtt, i, Kind::Ack { ce, seq });
        }
    }

    fn finish(mut self) -> SimReport {
        // Stable: equal departure times keep decision order.
        self.link.sort_by_key(|d| d.depart_ns);
        let mut totals = VerdictCounts::default();
        let flows: Vec<FlowReport> = self
            .flows
            .into_iter()
            .map(|f| {
                totals.add(&f.report.verdicts);
                f.report
            })
            .collect();
        SimReport {
            rate_bytes_per_s: self.sc.rate_bytes_per_s,
            duration_ns: self.sc.duration_ns,
            flows,
            link: self.link,
            mult_trace: self.mult_trace,
            totals,
        }
    }
}
