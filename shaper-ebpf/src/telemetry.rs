//! Telemetry from the egress classifier: sampled packets, every drop and
//! mark, and flow starts and ends, as `shaper_common::event::Event`
//! records in the `SHAPER_EVENTS` ring buffer (at most one per packet).
//!
//! Split in two. The classifier decides whether a record is due (one random
//! draw per packet), fills what it knows into a per-CPU [`Scratch`], and
//! tail-calls `shaper_telemetry`, which reads the addresses and ports,
//! writes the record and returns the classifier's verdict. Written inline,
//! the record's branches multiplied the paths the verifier walks for every
//! parse and pacer outcome before it past its one million instructions;
//! the tail-called program is verified once.
//!
//! A full ring (or a missing telemetry program) loses the record and
//! counts `events_lost`; the packet is never held.
//!
//! Non-goals: exact per-packet accounting (the counters are exact).

use aya_ebpf::{
    helpers::{bpf_get_prandom_u32, bpf_skb_load_bytes},
    macros::classifier,
    programs::TcContext,
};
use shaper_common::{
    JUMP_TELEMETRY,
    config::PacerConfig,
    counters::Counter,
    event::{
        EVENT_F_ECT, EVENT_F_SAMPLED, EVENT_FLOW_END, EVENT_FLOW_START, EVENT_PACKET, Event,
        FAMILY_IPV4, FAMILY_IPV6, SCRATCH_IP, SCRATCH_IPV4, Scratch, VERDICT_CE,
    },
};

use crate::{
    maps::{EVENTS, JUMP, SCRATCH, count},
    parse::Class,
};

/// TCP FIN and RST: the flow is ending.
const TCP_FIN_OR_RST: u8 = 0x01 | 0x04;

/// What the pacer decided for one packet, for its record.
pub struct Outcome {
    /// `VERDICT_*`.
    pub verdict: u8,
    /// Scheduled delay: departure time − now (for a drop, the flow's clock
    /// − now: the delay it would have had).
    pub delay_ns: u64,
    /// The pacer gave the flow a table slot on this packet.
    pub flow_started: bool,
    /// What the hook returns (`TC_ACT_*`).
    pub action: i32,
}

/// Notes what the parser found for this packet in the per-CPU scratch, so
/// the values need not stay live through the pacer (each distinct value
/// the verifier tracks there multiplies the states it walks: carried to the
/// end, they took loading on 6.1 under emulation past a minute).
#[inline(always)]
pub fn stash(class: &Class) {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: the pointer comes from the map lookup and is valid for this
    // run; per-CPU storage, and a TC program is not preempted on its CPU.
    let s = unsafe { &mut *s };
    s.l3_off = class.ecn.l3_off;
    s.ports_off = class.ports_off;
    s.l3 = (class.ecn.present as u8) * SCRATCH_IP | (class.ecn.ipv4 as u8) * SCRATCH_IPV4;
    s.tcp_flags = class.tcp_flags;
    s.event.key.proto = class.l4_proto;
    s.event.key.ethertype = if class.ecn.present {
        0
    } else {
        class.ethertype
    };
}

/// Hands the packet to the telemetry program if a record is due; returns
/// only when none is due or the tail call failed. [`stash`] ran for this
/// packet before.
#[inline(always)]
pub fn report(ctx: &TcContext, config: &PacerConfig, ect: bool, now_ns: u64, o: &Outcome) {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: as in `stash`.
    let s = unsafe { &mut *s };
    // SAFETY: bpf_get_prandom_u32 has no preconditions.
    let draw = u64::from(unsafe { bpf_get_prandom_u32() });
    let sampled = draw < config.sample_threshold;
    // Every mark and drop (VERDICT_CE and above) is sent.
    let always = o.verdict >= VERDICT_CE;
    let ended = s.tcp_flags & TCP_FIN_OR_RST != 0;
    if !(sampled | always | o.flow_started | ended) {
        return;
    }
    s.event.ts_ns = now_ns;
    s.event.delay_ns = o.delay_ns;
    s.event.key.saddr = [0; 16];
    s.event.key.daddr = [0; 16];
    s.event.key.sport_be = 0;
    s.event.key.dport_be = 0;
    s.event.key.family = 0;
    s.event.len_bytes = ctx.len();
    // SAFETY: reading a field of the __sk_buff the kernel passed in.
    s.event.ifindex = unsafe { (*ctx.skb.skb).ifindex };
    s.event.kind = if o.flow_started {
        EVENT_FLOW_START
    } else if ended {
        EVENT_FLOW_END
    } else {
        EVENT_PACKET
    };
    s.event.verdict = o.verdict;
    s.event.flags = (sampled as u8) * EVENT_F_SAMPLED | (ect as u8) * EVENT_F_ECT;
    s.event.pad = [0; 5];
    s.action = o.action;
    s.pad = [0; 2];
    // SAFETY: the tail call replaces this program; on success it does not
    // return, on failure (no program in the slot) it returns here.
    let _ = unsafe { JUMP.tail_call(ctx, JUMP_TELEMETRY) };
    count(Counter::EventsLost, 1);
}

/// The tail-called half: completes the record in [`Scratch`], writes it,
/// and returns the classifier's verdict.
#[classifier]
pub fn shaper_telemetry(ctx: TcContext) -> i32 {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        // Unreachable in practice (a one-entry array); pass the packet.
        return -1;
    };
    // SAFETY: as in `report`; the classifier that tail-called us filled it
    // on this CPU during this same hook run.
    let s = unsafe { &mut *s };
    if s.l3 & SCRATCH_IP != 0 {
        fill_ip_key(&ctx, s);
    }
    let sent = EVENTS.output::<Event>(&s.event, 0).is_ok();
    count(
        if sent {
            Counter::EventsSent
        } else {
            Counter::EventsLost
        },
        1,
    );
    s.action
}

/// The packet's addresses and ports, read from the frame at the offsets
/// the parser found. A failed read leaves zeros.
#[inline(always)]
fn fill_ip_key(ctx: &TcContext, s: &mut Scratch) {
    let k = &mut s.event.key;
    let l3 = s.l3_off as usize;
    if s.l3 & SCRATCH_IPV4 != 0 {
        k.family = FAMILY_IPV4;
        if let Ok(a) = ctx.load::<[u8; 8]>(l3 + 12) {
            k.saddr = [a[0], a[1], a[2], a[3], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            k.daddr = [a[4], a[5], a[6], a[7], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        }
    } else {
        k.family = FAMILY_IPV6;
        let skb = ctx.skb.skb as *const core::ffi::c_void;
        // SAFETY: the destinations are 16-byte fields; bpf_skb_load_bytes
        // checks the offsets against the frame and leaves them on failure.
        unsafe {
            bpf_skb_load_bytes(skb, (l3 + 8) as u32, k.saddr.as_mut_ptr().cast(), 16);
            bpf_skb_load_bytes(skb, (l3 + 24) as u32, k.daddr.as_mut_ptr().cast(), 16);
        }
    }
    if s.ports_off != 0
        && let Ok(p) = ctx.load::<[u8; 4]>(s.ports_off as usize)
    {
        k.sport_be = u16::from_ne_bytes([p[0], p[1]]);
        k.dport_be = u16::from_ne_bytes([p[2], p[3]]);
    }
}
