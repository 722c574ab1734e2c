//! The qdisc sojourn tracer: the time each packet spends between a
//! successful qdisc enqueue and its hand-off to the driver, for any root
//! qdisc (sch_fq under the pacer, CAKE, fq_codel, netem, tbf, ...), with or
//! without the pacer attached.
//!
//! Two raw tracepoint programs:
//! - `qdisc_enqueue` (TP_PROTO(struct Qdisc *, const struct netdev_queue *,
//!   struct sk_buff *); added by kernel commit 70713dddf3d2, "net_sched:
//!   introduce tracepoint trace_qdisc_enqueue()", Linux 5.14). It fires in
//!   `dev_qdisc_enqueue()` only when `q->enqueue()` returned
//!   NET_XMIT_SUCCESS (net/core/dev.c in 6.1 and 6.12). We stamp the skb's
//!   address with the time, in an LRU hash.
//! - `net_dev_start_xmit` (TP_PROTO(const struct sk_buff *, const struct
//!   net_device *)): fires in `xmit_one()` for every skb handed to the
//!   driver, so also for each skb of a bulk dequeue (`qdisc_dequeue` reports
//!   only the first). We take the stamp, emit an `Event` of kind
//!   `EVENT_SOJOURN` to our ring buffer and delete the stamp.
//!
//! The traced device is matched by ifindex and network namespace inode
//! (`dev->nd_net.net->ns.inum`), so a same-numbered device in another
//! namespace is not measured.
//!
//! Invariants: kernel memory is read only with `bpf_probe_read_kernel`, at
//! byte offsets the controller resolved from the running kernel's BTF (see
//! `shaper/src/btf.rs`) and wrote into `TRACE_CONFIG`: no CO-RE, no
//! hard-coded layouts. A packet without a stamp (an empty TCQ_F_CAN_BYPASS
//! qdisc sends directly, a noqueue device has no qdisc, segments made after
//! dequeue are new skbs) is counted, never given an invented delay. A stamp
//! from another device, or older than `max_delay_ns` (the skb was freed in
//! the qdisc and its address reused), is discarded and counted. A full ring
//! buffer loses the event and counts it; the datapath never waits.
//!
//! Units: ns (`bpf_ktime_get_ns`, CLOCK_MONOTONIC), bytes of `skb->len`.
//!
//! Known gaps, all counted rather than guessed: on a lockless qdisc
//! (TCQ_F_NOLOCK, e.g. pfifo_fast) the tracepoint fires after
//! `q->enqueue()` returned, outside any lock, so another CPU can dequeue and
//! transmit the skb first (counted as no enqueue record; its late stamp is
//! evicted by the LRU); a driver that refuses an skb (NETDEV_TX_BUSY) sees
//! it again after a requeue, and that second hand-off has no stamp.
//!
//! Non-goals: per-qdisc-level times inside a hierarchy (only root enqueue to
//! driver); packets a qdisc splits itself (CAKE's GSO splitting enqueues new
//! segment skbs, which then count as having no stamp).

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{map, raw_tracepoint},
    maps::{Array, LruHashMap, PerCpuArray, RingBuf},
    programs::RawTracePointContext,
};
use shaper_common::{
    event::{EVENT_SOJOURN, Event, FAMILY_IPV4, FAMILY_IPV6, FAMILY_OTHER, FlowKey},
    trace::{Stamp, TraceConfig, TraceCounter},
};

/// The controller's settings and the resolved offsets. One entry.
#[map(name = "TRACE_CONFIG")]
static TRACE_CONFIG: Array<TraceConfig> = Array::with_max_entries(1, 0);

/// Enqueue stamps by skb address. Tiny here so that loading the object for
/// the pacer costs nothing; the tracer sets the real size at load time.
#[map(name = "TRACE_STAMPS")]
static TRACE_STAMPS: LruHashMap<u64, Stamp> = LruHashMap::with_max_entries(1, 0);

/// `TraceCounter`s, per CPU.
#[map(name = "TRACE_COUNTERS")]
static TRACE_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(TraceCounter::COUNT, 0);

/// Sojourn events. One page here; the tracer sets the real size at load.
#[map(name = "TRACE_EVENTS")]
static TRACE_EVENTS: RingBuf = RingBuf::with_byte_size(4096, 0);

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
/// `skb->transport_header` when unset: `(typeof(skb->transport_header))~0U`.
const HEADER_UNSET: u16 = 0xffff;

#[raw_tracepoint(tracepoint = "qdisc_enqueue")]
pub fn trace_qdisc_enqueue(ctx: RawTracePointContext) -> u32 {
    try_enqueue(&ctx);
    0
}

#[raw_tracepoint(tracepoint = "net_dev_start_xmit")]
pub fn trace_net_dev_start_xmit(ctx: RawTracePointContext) -> u32 {
    try_start_xmit(&ctx);
    0
}

#[inline(always)]
fn count(c: TraceCounter) {
    if let Some(slot) = TRACE_COUNTERS.get_ptr_mut(c as u32) {
        // SAFETY: the pointer comes from the map lookup and is valid for this
        // run; per-CPU storage and disabled preemption in tracepoint programs
        // mean no concurrent writer.
        unsafe { *slot += 1 };
    }
}

/// CLOCK_MONOTONIC in ns.
#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: a helper without arguments or side effects.
    unsafe { bpf_ktime_get_ns() }
}

/// Reads a `T` at `base + off` in kernel memory.
#[inline(always)]
fn read_at<T>(base: u64, off: u16) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel copies through the kernel's fault-safe
    // accessor; a bad address returns an error, it never faults.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T).ok() }
}

/// True if `dev` (a `struct net_device *`) is the traced device: its
/// ifindex matches and, when the controller gave one, so does its network
/// namespace (ifindexes repeat across namespaces; tracepoints are global).
#[inline(always)]
fn is_traced(cfg: &TraceConfig, dev: u64) -> bool {
    if dev == 0 || read_at::<u32>(dev, cfg.dev_ifindex) != Some(cfg.ifindex) {
        return false;
    }
    if cfg.netns_ino == 0 {
        return true;
    }
    match read_at::<u64>(dev, cfg.dev_nd_net) {
        Some(net) if net != 0 => read_at::<u32>(net, cfg.net_inum) == Some(cfg.netns_ino),
        _ => false,
    }
}

#[inline(always)]
fn try_enqueue(ctx: &RawTracePointContext) -> Option<()> {
    let cfg = TRACE_CONFIG.get(0)?;
    if cfg.ifindex == 0 {
        return None;
    }
    let skb: u64 = ctx.arg(2);
    let dev: u64 = read_at(skb, cfg.skb_dev)?;
    if !is_traced(cfg, dev) {
        return None;
    }
    let stamp = Stamp {
        enqueued_ns: now_ns(),
        ifindex: cfg.ifindex,
        pad: 0,
    };
    TRACE_STAMPS.insert(&skb, &stamp, 0).ok()?;
    count(TraceCounter::Enqueued);
    Some(())
}

#[inline(always)]
fn try_start_xmit(ctx: &RawTracePointContext) -> Option<()> {
    let cfg = TRACE_CONFIG.get(0)?;
    if cfg.ifindex == 0 {
        return None;
    }
    let skb: u64 = ctx.arg(0);
    let dev: u64 = ctx.arg(1);
    if !is_traced(cfg, dev) {
        return None;
    }
    let now = now_ns();
    let Some(stamp) = TRACE_STAMPS.get_ptr(&skb) else {
        count(TraceCounter::NoEnqueueRecord);
        return None;
    };
    // SAFETY: the pointer comes from the map lookup and is valid until the
    // entry is removed below; Stamp is plain integers.
    let stamp = unsafe { *stamp };
    let _ = TRACE_STAMPS.remove(&skb);
    let delay_ns = now.wrapping_sub(stamp.enqueued_ns);
    if stamp.ifindex != cfg.ifindex || now < stamp.enqueued_ns || delay_ns > cfg.max_delay_ns {
        count(TraceCounter::StaleDiscarded);
        return None;
    }
    count(TraceCounter::Measured);
    let mut event = Event {
        ts_ns: now,
        delay_ns,
        len_bytes: read_at::<u32>(skb, cfg.skb_len).unwrap_or(0),
        ifindex: cfg.ifindex,
        kind: EVENT_SOJOURN,
        ..Event::default()
    };
    if flow_key(cfg, skb, &mut event.key).is_none() {
        count(TraceCounter::ParseFailures);
    }
    if TRACE_EVENTS.output::<Event>(&event, 0).is_err() {
        count(TraceCounter::EventsLost);
    }
    Some(())
}

/// Fills `key` from the skb's network and transport headers. `None` when a
/// header could not be read or is malformed (the key stays partial).
#[inline(always)]
fn flow_key(cfg: &TraceConfig, skb: u64, key: &mut FlowKey) -> Option<()> {
    let proto_be: u16 = read_at(skb, cfg.skb_protocol)?;
    let ethertype = u16::from_be(proto_be);
    let head: u64 = read_at(skb, cfg.skb_head)?;
    let nh: u16 = read_at(skb, cfg.skb_network_header)?;
    let th: u16 = read_at(skb, cfg.skb_transport_header)?;
    if head == 0 {
        return None;
    }
    let l4 = match ethertype {
        ETH_P_IP => {
            let ip: [u8; 20] = read_at(head, nh)?;
            if ip[0] >> 4 != 4 {
                return None;
            }
            key.family = FAMILY_IPV4;
            key.proto = ip[9];
            key.saddr[..4].copy_from_slice(&ip[12..16]);
            key.daddr[..4].copy_from_slice(&ip[16..20]);
            // Non-first fragments carry no ports.
            u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff == 0
        }
        ETH_P_IPV6 => {
            let ip: [u8; 40] = read_at(head, nh)?;
            if ip[0] >> 4 != 6 {
                return None;
            }
            key.family = FAMILY_IPV6;
            key.proto = ip[6];
            key.saddr.copy_from_slice(&ip[8..24]);
            key.daddr.copy_from_slice(&ip[24..40]);
            true
        }
        other => {
            key.family = FAMILY_OTHER;
            key.ethertype = other;
            return Some(());
        }
    };
    if l4 && (key.proto == IPPROTO_TCP || key.proto == IPPROTO_UDP) && th != HEADER_UNSET {
        let ports: [u8; 4] = read_at(head, th)?;
        key.sport_be = u16::from_ne_bytes([ports[0], ports[1]]);
        key.dport_be = u16::from_ne_bytes([ports[2], ports[3]]);
    }
    Some(())
}
