//! The sojourn tracer's map types: what the controller tells the raw
//! tracepoint programs (the traced interface and the kernel struct offsets
//! it resolved from the running kernel's BTF), the per-skb enqueue stamp,
//! and the counters.
//!
//! Invariants: `#[repr(C)]`, explicit padding, sizes asserted. Offsets are
//! byte offsets into `struct sk_buff` / `struct net_device` of the running
//! kernel; the programs only ever read through `bpf_probe_read_kernel`, so a
//! wrong offset yields wrong numbers, never a crash.
//!
//! Units: nanoseconds of CLOCK_MONOTONIC (`bpf_ktime_get_ns`), bytes.
//!
//! Non-goals: CO-RE relocations (the object is built without them; the
//! controller resolves offsets itself at load time).

/// Map and program names in the object.
pub mod names {
    /// `Array<TraceConfig>`, one entry.
    pub const CONFIG: &str = "TRACE_CONFIG";
    /// `LruHashMap<u64 /* skb address */, Stamp>`.
    pub const STAMPS: &str = "TRACE_STAMPS";
    /// `PerCpuArray<u64>` indexed by [`super::TraceCounter`].
    pub const COUNTERS: &str = "TRACE_COUNTERS";
    /// `RingBuf` of `event::Event`s with kind `EVENT_SOJOURN`.
    pub const EVENTS: &str = "TRACE_EVENTS";
    /// Raw tracepoint program on `qdisc_enqueue`.
    pub const PROG_ENQUEUE: &str = "trace_qdisc_enqueue";
    /// Raw tracepoint program on `net_dev_start_xmit`.
    pub const PROG_XMIT: &str = "trace_net_dev_start_xmit";
    /// The tracepoints, as `bpf_raw_tracepoint_open` names them.
    pub const TP_ENQUEUE: &str = "qdisc_enqueue";
    /// See [`TP_ENQUEUE`].
    pub const TP_XMIT: &str = "net_dev_start_xmit";
}

/// What the tracer programs need to know. One entry, written before attach.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceConfig {
    /// Sojourns longer than this are stale stamps (an skb freed in the
    /// qdisc and its address reused); discarded and counted.
    pub max_delay_ns: u64,
    /// The traced interface; 0 means the programs do nothing.
    pub ifindex: u32,
    /// Inode of the traced interface's network namespace (ifindexes repeat
    /// across namespaces, tracepoints are global); 0 skips the check.
    pub netns_ino: u32,
    /// `offsetof(struct sk_buff, len)` (u32).
    pub skb_len: u16,
    /// `offsetof(struct sk_buff, dev)` (pointer).
    pub skb_dev: u16,
    /// `offsetof(struct sk_buff, head)` (pointer).
    pub skb_head: u16,
    /// `offsetof(struct sk_buff, network_header)` (u16, offset from head).
    pub skb_network_header: u16,
    /// `offsetof(struct sk_buff, transport_header)` (u16, offset from head).
    pub skb_transport_header: u16,
    /// `offsetof(struct sk_buff, protocol)` (__be16).
    pub skb_protocol: u16,
    /// `offsetof(struct net_device, ifindex)` (int).
    pub dev_ifindex: u16,
    /// `offsetof(struct net_device, nd_net)`: a `struct net *` (in
    /// `possible_net_t`, at its start).
    pub dev_nd_net: u16,
    /// `offsetof(struct net, ns) + offsetof(struct ns_common, inum)`.
    pub net_inum: u16,
    /// Padding; zero.
    pub pad: [u8; 6],
}

const _: () = assert!(core::mem::size_of::<TraceConfig>() == 40);

/// When and where an skb was enqueued.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    /// `bpf_ktime_get_ns()` at `qdisc_enqueue`.
    pub enqueued_ns: u64,
    /// The device it was enqueued on.
    pub ifindex: u32,
    /// Padding; zero.
    pub pad: u32,
}

const _: () = assert!(core::mem::size_of::<Stamp>() == 16);

/// The tracer's counters (index into the per-CPU array).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceCounter {
    /// Successful enqueues on the traced interface.
    Enqueued = 0,
    /// Hand-offs to the driver with a stamp: sojourns measured.
    Measured = 1,
    /// Hand-offs with no stamp (qdisc bypass, noqueue, segments made after
    /// dequeue): not measured, not invented.
    NoEnqueueRecord = 2,
    /// Stamps from another device or older than `max_delay_ns`: discarded.
    StaleDiscarded = 3,
    /// Sojourns measured but not delivered: the ring buffer was full.
    EventsLost = 4,
    /// Packets whose headers could not be read (flow key left partial).
    ParseFailures = 5,
}

impl TraceCounter {
    /// Number of counters (the array's size).
    pub const COUNT: u32 = 6;
    /// All counters, in index order.
    pub const ALL: [TraceCounter; 6] = [
        TraceCounter::Enqueued,
        TraceCounter::Measured,
        TraceCounter::NoEnqueueRecord,
        TraceCounter::StaleDiscarded,
        TraceCounter::EventsLost,
        TraceCounter::ParseFailures,
    ];
    /// The counter's name in reports (snake case).
    pub const fn name(self) -> &'static str {
        match self {
            TraceCounter::Enqueued => "enqueued",
            TraceCounter::Measured => "measured",
            TraceCounter::NoEnqueueRecord => "no_enqueue_record",
            TraceCounter::StaleDiscarded => "stale_discarded",
            TraceCounter::EventsLost => "events_lost",
            TraceCounter::ParseFailures => "parse_failures",
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: both are `repr(C)` with explicit padding and asserted sizes;
    // every bit pattern is valid.
    unsafe impl aya::Pod for super::TraceConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Stamp {}
}
