//! Records the kernel programs send to the controller over BPF ring buffers
//! (BPF_MAP_TYPE_RINGBUF, Linux 5.8, commit 457f44363a88): sampled packets
//! of the egress pacer, flow starts and ends, and the sojourn tracer's
//! per-packet queueing delays. One layout for all, so one userspace
//! aggregator serves `shaper run` and `shaper trace`.
//!
//! Invariants: `#[repr(C)]`, explicit padding, sizes asserted below. A
//! record is written whole with `bpf_ringbuf_output` or reserve/submit; the
//! datapath never waits for room: a full ring counts a lost event instead.
//!
//! Units: nanoseconds of CLOCK_MONOTONIC (`bpf_ktime_get_ns`), bytes of
//! `skb->len`. Addresses and ports are in network byte order as on the wire
//! (an IPv4 address fills the first 4 bytes of its field).
//!
//! Non-goals: exact per-packet accounting (the pacer samples; its counters
//! are exact), carrying payload.

/// [`FlowKey::family`] of an IPv4 flow.
pub const FAMILY_IPV4: u8 = 4;
/// [`FlowKey::family`] of an IPv6 flow.
pub const FAMILY_IPV6: u8 = 6;
/// [`FlowKey::family`] of a frame that is not IP (or could not be parsed).
pub const FAMILY_OTHER: u8 = 0;

/// A flow as the programs saw it: addresses, protocol and ports. For
/// protocols without ports (ICMP) and non-first fragments the ports are 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    /// Source address; IPv4 in bytes 0..4, the rest zero.
    pub saddr: [u8; 16],
    /// Destination address, as `saddr`.
    pub daddr: [u8; 16],
    /// Source port, network byte order.
    pub sport_be: u16,
    /// Destination port, network byte order.
    pub dport_be: u16,
    /// IP protocol number (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6); for a non-IP
    /// frame, 0.
    pub proto: u8,
    /// `FAMILY_*`.
    pub family: u8,
    /// For a non-IP frame, its ethertype (host order); else 0.
    pub ethertype: u16,
}

const _: () = assert!(core::mem::size_of::<FlowKey>() == 40);

/// [`Event::kind`]: a packet the egress pacer sampled.
pub const EVENT_PACKET: u8 = 1;
/// [`Event::kind`]: the pacer gave a flow a table slot (a new flow, or one
/// back after being idle longer than the flow idle time). The record also
/// describes that packet, like an `EVENT_PACKET` one.
pub const EVENT_FLOW_START: u8 = 2;
/// [`Event::kind`]: a TCP flow sent FIN or RST; the record also describes
/// that packet.
pub const EVENT_FLOW_END: u8 = 3;
/// [`Event::kind`]: the tracer measured a packet's time from qdisc enqueue
/// to the driver; `delay_ns` is that sojourn.
pub const EVENT_SOJOURN: u8 = 4;

/// [`Event::verdict`]: sent on at once (no departure time set).
pub const VERDICT_PASS: u8 = 0;
/// [`Event::verdict`]: given a departure time in the future.
pub const VERDICT_PACED: u8 = 1;
/// [`Event::verdict`]: paced and CE-marked by the AQM.
pub const VERDICT_CE: u8 = 2;
/// [`Event::verdict`]: dropped by the AQM (CoDel or the overload rule;
/// the counters tell them apart).
pub const VERDICT_AQM_DROP: u8 = 3;
/// [`Event::verdict`]: dropped, beyond the horizon.
pub const VERDICT_HORIZON_DROP: u8 = 4;

/// [`Event::flags`]: chosen by the 1-in-N random sample, so it stands for
/// N packets in rate estimates. Events sent because they are drops or marks
/// (always sent) lack it unless the draw chose them too.
pub const EVENT_F_SAMPLED: u8 = 1;
/// [`Event::flags`]: the packet was ECN-capable (ECT(0), ECT(1) or CE).
pub const EVENT_F_ECT: u8 = 2;

/// One ring-buffer record: 72 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// When the program ran.
    pub ts_ns: u64,
    /// `EVENT_PACKET`: scheduled delay (departure time − now, 0 if
    /// unpaced). `EVENT_SOJOURN`: measured enqueue-to-driver time.
    /// Otherwise 0.
    pub delay_ns: u64,
    /// The flow.
    pub key: FlowKey,
    /// `skb->len`.
    pub len_bytes: u32,
    /// The interface the packet went through.
    pub ifindex: u32,
    /// `EVENT_*`.
    pub kind: u8,
    /// `VERDICT_*` (packets only).
    pub verdict: u8,
    /// `EVENT_F_*` bits.
    pub flags: u8,
    /// Padding; zero.
    pub pad: [u8; 5],
}

const _: () = assert!(core::mem::size_of::<Event>() == 72);

impl Event {
    /// The record as bytes, as the ring buffer carries it.
    pub fn as_bytes(&self) -> &[u8; 72] {
        // SAFETY: `Event` is `repr(C)`, 72 bytes with no implicit padding
        // (asserted above), so every byte is initialised.
        unsafe { &*(self as *const Event as *const [u8; 72]) }
    }

    /// Reads a record from ring-buffer bytes; `None` when `b` is short.
    pub fn from_bytes(b: &[u8]) -> Option<Event> {
        if b.len() < core::mem::size_of::<Event>() {
            return None;
        }
        // SAFETY: `b` holds at least size_of::<Event>() bytes, every bit
        // pattern is a valid `Event` (integers and byte arrays only), and
        // `read_unaligned` needs no alignment.
        Some(unsafe { core::ptr::read_unaligned(b.as_ptr() as *const Event) })
    }
}

/// [`Scratch::l3`]: the frame is IP (the addresses can be read).
pub const SCRATCH_IP: u8 = 1;
/// [`Scratch::l3`]: IPv4 (else IPv6).
pub const SCRATCH_IPV4: u8 = 2;

/// The hand-over from the egress classifier to the telemetry program it
/// tail-calls (one per-CPU entry): the record as far as the classifier
/// knows it, where the telemetry program finds the addresses and ports,
/// and the verdict the hook must return. The telemetry program lives apart
/// so the verifier walks it once, not once per classifier path; and the
/// parser's findings are stashed here at once, so they are not carried
/// (in registers the verifier tracks) through the pacer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scratch {
    /// The record; the key's addresses and ports are still zero.
    pub event: Event,
    /// Offset of the IP header.
    pub l3_off: u32,
    /// Offset of the TCP/UDP ports; 0 when there are none.
    pub ports_off: u32,
    /// The classifier's verdict (`TC_ACT_*`), returned by the telemetry
    /// program in its place.
    pub action: i32,
    /// `SCRATCH_*` bits.
    pub l3: u8,
    /// The TCP flags byte; 0 for other packets.
    pub tcp_flags: u8,
    /// Padding; zero.
    pub pad: [u8; 2],
}

const _: () = assert!(core::mem::size_of::<Scratch>() == 88);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_bytes() {
        let mut e = Event {
            ts_ns: 1,
            delay_ns: 2,
            len_bytes: 1514,
            ifindex: 7,
            kind: EVENT_PACKET,
            verdict: VERDICT_CE,
            flags: EVENT_F_SAMPLED,
            ..Event::default()
        };
        e.key.saddr[..4].copy_from_slice(&[10, 0, 0, 1]);
        e.key.sport_be = 443u16.to_be();
        let back = Event::from_bytes(e.as_bytes()).expect("long enough");
        assert_eq!(back, e);
        assert!(Event::from_bytes(&e.as_bytes()[..71]).is_none());
    }
}
