//! Police mode's packet path ([`Mode::Police`]): the sender, the upstream
//! FIFO (the ISP's access link: its rate and a tail-drop buffer), then the
//! policer ([`shaper_common::police::police`]) on the fair pacer's shared
//! state, which passes, marks or drops each packet at once. Under host
//! isolation the step is
//! [`police_flow_of_host`](shaper_common::hosts::police_flow_of_host), the
//! destinations the unit hosts, as at a WAN port's ingress.
//!
//! Timing: a packet enters the FIFO when sent, leaves it after the queue
//! ahead of it and its own transmission time at the link rate, and meets
//! the policer then. An ACK reaches the sender one RTT after that (the
//! FIFO's wait comes on top, as queueing does); a loss, at the FIFO or the
//! policer, is noticed one RTT after the packet would have passed.
//!
//! Non-goals: the receiving router's own queue (none: the policer keeps
//! nothing), GRO, the policer's CPU.

use shaper_common::fair::Level;
use shaper_common::fair::{EPOCH_SHIFT, Packet, count_active, count_backlogged};
use shaper_common::hosts::{host_count, police_flow_of_host};
use shaper_common::police::{Action, DropReason, police};
use shaper_common::shared::{account, join, police_step, roll_epoch};
use shaper_common::tins::SoleTin;

use super::super::PoliceRule;
use super::super::report::Departure;
use super::{Kind, Mode, Sim, Source};

impl Sim<'_> {
    /// Flow `i`'s packet enters the upstream FIFO at `now`.
    pub(super) fn police_send(&mut self, i: usize, now: u64, len: u32, ect: bool) {
        let Mode::Police {
            link_rate_bytes_per_s,
            link_buffer_ns,
            ..
        } = self.sc.mode
        else {
            return;
        };
        let f = &mut self.flows[i];
        let seq = f.sent;
        f.sent += 1;
        let rtt = f.source.rtt_ns();
        let wait = self.upstream_free_ns.saturating_sub(now);
        if wait > link_buffer_ns {
            f.report.upstream_drops += 1;
            if matches!(f.source, Source::Aimd { .. }) {
                self.push(now + wait + rtt, i, Kind::Loss { seq });
            }
            return;
        }
        let tx = u64::try_from(
            u128::from(len) * 1_000_000_000 / u128::from(link_rate_bytes_per_s.max(1)),
        )
        .unwrap_or(u64::MAX);
        let leave = now + wait + tx;
        self.upstream_free_ns = leave;
        f.report.upstream_delays.push((now, wait));
        self.push(
            leave,
            i,
            Kind::Arrive {
                seq,
                len,
                ect,
                sent_ns: now,
            },
        );
    }

    /// Packet `seq` of flow `i` leaves the FIFO and meets the policer.
    pub(super) fn police_arrive(
        &mut self,
        i: usize,
        now: u64,
        seq: u64,
        len: u32,
        ect: bool,
        sent_ns: u64,
    ) {
        let epoch = now >> EPOCH_SHIFT;
        // At ingress the download's hosts: the unit is the destination.
        let levels = self.sc.isolation.levels(false);
        if epoch > self.fairs[0].epoch {
            // Over hosts too: see `police_flow_of_host`.
            roll_epoch::<_, _, false>(&mut self.fairs[0], &mut SoleTin, 0, epoch, Level::FLOWS);
            self.mult_trace.push((now, self.fairs[0].mult_q16));
        }
        let tx_ns = self.rate.tx_time_ns(len);
        // At ingress skb->tstamp is the receive time, never a departure.
        let pkt = Packet {
            now_ns: now,
            skb_tstamp_ns: 0,
            tx_ns,
            ect,
            link_ns: 0,
        };
        let mult = self.fairs[0].mult_q16;
        let params = self.sc.params;
        let f = &mut self.flows[i];
        let r = match (self.sc.mode, levels) {
            (
                Mode::Police {
                    rule: PoliceRule::Link,
                    ..
                },
                Some(levels),
            ) => {
                let fair = &mut self.fairs[0];
                let (host, peer) = self.hosts[0].pick(f.hosts, levels);
                let n = host_count(fair, host, peer.0, peer.1, epoch);
                police_flow_of_host(
                    fair,
                    &mut f.entry,
                    (host, peer.0),
                    n,
                    &mut self.police_link,
                    &pkt,
                    epoch,
                    mult,
                    &params,
                )
            }
            (
                Mode::Police {
                    rule: PoliceRule::Link,
                    ..
                },
                None,
            ) => police_step(
                &mut self.fairs[0],
                &mut f.entry,
                &mut self.police_link,
                &pkt,
                epoch,
                mult,
                &params,
            ),
            // The first design, each flow's own CoDel, with the same steps
            // around it.
            _ => {
                if count_active(&mut f.entry, epoch) {
                    self.fairs[0].active_now += 1;
                }
                let r = police(&mut f.entry, &pkt, mult, &params);
                if r.action != Action::Drop
                    && r.virtual_delay_ns > 0
                    && count_backlogged(&mut f.entry, epoch)
                {
                    join(&mut self.fairs[0], mult);
                }
                r
            }
        };
        let v = &mut f.report.verdicts;
        match r.action {
            Action::Pass if r.virtual_delay_ns == 0 => v.pass += 1,
            Action::Pass => v.paced += 1,
            Action::Mark => v.mark += 1,
            Action::Drop => {
                v.aqm_drop += 1;
                if r.drop_reason == Some(DropReason::Overload) {
                    v.overload_drop += 1;
                }
            }
        }
        let rtt = f.source.rtt_ns();
        if r.action == Action::Drop {
            if matches!(f.source, Source::Aimd { .. }) {
                self.push(now + rtt, i, Kind::Loss { seq });
            }
            return;
        }
        account(&mut self.fairs[0], epoch, tx_ns);
        f.report.delays.push((now, r.virtual_delay_ns));
        let total = f.report.delivered.last().map_or(0, |&(_, b)| b) + u64::from(len);
        f.report.delivered.push((now + rtt / 2, total));
        self.link.push(Departure {
            depart_ns: now,
            stamp_ns: now,
            arrival_ns: sent_ns,
            flow: i as u32,
            wire_bytes: len,
            seq,
        });
        if matches!(f.source, Source::Aimd { .. }) {
            let ce = r.action == Action::Mark;
            self.push(now + rtt, i, Kind::Ack { ce, seq });
        }
    }
}
