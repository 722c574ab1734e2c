//! Aggregating sojourn events per interval, per flow and per interface, and
//! printing them as plain text lines or newline-delimited JSON.
//!
//! Delays go into a log-linear histogram (128 sub-buckets per power of two:
//! a value is reported within 0.8% of the truth; the maximum is exact), so
//! memory grows with the number of distinct buckets, not packets.
//!
//! JSON records, one per line: `{"kind":"interval",...}` each second,
//! `{"kind":"flow",...}` per flow at the end, and last
//! `{"kind":"summary",...}`.
//!
//! Non-goals: rates and top-N beyond what `shaper trace` prints; the
//! project's telemetry aggregator (`shaper/src/telemetry/`) is meant to
//! replace [`Stats`] once it lands.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    net::{Ipv4Addr, Ipv6Addr},
};

use serde_json::{Value, json};
use shaper_common::event::{EVENT_SOJOURN, Event, FAMILY_IPV4, FAMILY_IPV6, FlowKey};

/// Sub-bucket bits of the histogram: 2^7 buckets per octave.
const SUB_BITS: u32 = 7;

/// Delay distribution, packets and bytes of a set of packets.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    buckets: BTreeMap<u32, u64>,
    /// Packets counted.
    pub packets: u64,
    /// Bytes (`skb->len`) counted.
    pub bytes: u64,
    /// Largest delay seen, exact.
    pub max_ns: u64,
}

fn bucket_of(v: u64) -> u32 {
    if v < 1 << SUB_BITS {
        return v as u32;
    }
    let e = 63 - v.leading_zeros();
    let m = (v >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    (e - SUB_BITS + 1) * (1 << SUB_BITS) + m as u32
}

/// The middle of bucket `b`'s value range.
fn bucket_mid(b: u32) -> u64 {
    let octave = b >> SUB_BITS;
    if octave == 0 {
        return u64::from(b);
    }
    let m = u64::from(b & ((1 << SUB_BITS) - 1));
    let shift = octave - 1;
    let low = ((1u64 << SUB_BITS) + m) << shift;
    low + ((1u64 << shift) >> 1)
}

impl Stats {
    /// Counts one packet of `len` bytes that waited `delay_ns`.
    pub fn add(&mut self, delay_ns: u64, len: u64) {
        *self.buckets.entry(bucket_of(delay_ns)).or_default() += 1;
        self.packets += 1;
        self.bytes += len;
        self.max_ns = self.max_ns.max(delay_ns);
    }

    /// The `p`-th percentile (nearest rank, 0 < p <= 100) of the delays; 0
    /// when empty.
    pub fn percentile_ns(&self, p: f64) -> u64 {
        if self.packets == 0 {
            return 0;
        }
        let rank = ((p / 100.0) * self.packets as f64).ceil().max(1.0) as u64;
        if rank >= self.packets {
            // The top rank is the maximum, which is kept exactly.
            return self.max_ns;
        }
        let mut seen = 0;
        for (&b, &n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return bucket_mid(b).min(self.max_ns);
            }
        }
        self.max_ns
    }

    fn json_fields(&self, v: &mut serde_json::Map<String, Value>) {
        v.insert("packets".into(), json!(self.packets));
        v.insert("bytes".into(), json!(self.bytes));
        v.insert("delay_p50_ns".into(), json!(self.percentile_ns(50.0)));
        v.insert("delay_p99_ns".into(), json!(self.percentile_ns(99.0)));
        v.insert("delay_max_ns".into(), json!(self.max_ns));
    }
}

/// The tracer's kernel counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Successful enqueues on the interface.
    pub enqueued: u64,
    /// Sojourns measured.
    pub measured: u64,
    /// Hand-offs with no enqueue record (bypass, noqueue).
    pub no_enqueue_record: u64,
    /// Stale stamps discarded.
    pub stale_discarded: u64,
    /// Events lost to a full ring buffer.
    pub events_lost: u64,
    /// Headers that could not be parsed.
    pub parse_failures: u64,
}

/// Per-interval, per-flow and whole-run aggregates of one interface.
#[derive(Debug)]
pub struct Aggregator {
    iface: String,
    interval: Stats,
    interval_flows: HashMap<FlowKey, Stats>,
    total: Stats,
    flows: HashMap<FlowKey, Stats>,
    intervals: u64,
}

/// How many flows an interval line names.
const TOP_FLOWS: usize = 3;

impl Aggregator {
    /// An empty aggregate for interface `iface`.
    pub fn new(iface: &str) -> Self {
        Aggregator {
            iface: iface.to_string(),
            interval: Stats::default(),
            interval_flows: HashMap::new(),
            total: Stats::default(),
            flows: HashMap::new(),
            intervals: 0,
        }
    }

    /// Counts a sojourn event; other kinds are ignored.
    pub fn add(&mut self, e: &Event) {
        if e.kind != EVENT_SOJOURN {
            return;
        }
        let len = u64::from(e.len_bytes);
        self.interval.add(e.delay_ns, len);
        self.total.add(e.delay_ns, len);
        self.interval_flows
            .entry(e.key)
            .or_default()
            .add(e.delay_ns, len);
        self.flows.entry(e.key).or_default().add(e.delay_ns, len);
    }

    /// The whole run so far.
    pub fn total(&self) -> &Stats {
        &self.total
    }

    /// Closes the current interval: returns its line (text or JSON) and
    /// starts the next.
    pub fn end_interval(&mut self, json: bool) -> String {
        self.intervals += 1;
        let mut top: Vec<(&FlowKey, &Stats)> = self.interval_flows.iter().collect();
        top.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(b.0)));
        top.truncate(TOP_FLOWS);
        let line = if json {
            let mut v = serde_json::Map::new();
            v.insert("kind".into(), json!("interval"));
            v.insert("iface".into(), json!(self.iface));
            v.insert("t_s".into(), json!(self.intervals));
            self.interval.json_fields(&mut v);
            let flows: Vec<Value> = top.iter().map(|(k, s)| flow_json(None, k, s)).collect();
            v.insert("top_flows".into(), Value::Array(flows));
            Value::Object(v).to_string()
        } else {
            let s = &self.interval;
            let mut line = format!(
                "{:>4}s {}: {} packets, sojourn p50 {} p99 {} max {}",
                self.intervals,
                self.iface,
                s.packets,
                ms(s.percentile_ns(50.0)),
                ms(s.percentile_ns(99.0)),
                ms(s.max_ns)
            );
            if !top.is_empty() {
                line.push_str("; top:");
                for (k, s) in &top {
                    let _ = write!(
                        line,
                        " {} {}pk p99 {}",
                        flow_name(k),
                        s.packets,
                        ms(s.percentile_ns(99.0))
                    );
                }
            }
            line
        };
        self.interval = Stats::default();
        self.interval_flows.clear();
        line
    }

    /// The closing lines: per flow (busiest first) and the summary, which
    /// is always last.
    pub fn finish(&self, counters: &Counters, elapsed_s: f64, json: bool) -> Vec<String> {
        let mut flows: Vec<(&FlowKey, &Stats)> = self.flows.iter().collect();
        flows.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(b.0)));
        let mut out = Vec::new();
        let t = &self.total;
        if json {
            for (k, s) in &flows {
                out.push(flow_json(Some(&self.iface), k, s).to_string());
            }
            let mut v = serde_json::Map::new();
            v.insert("kind".into(), json!("summary"));
            v.insert("iface".into(), json!(self.iface));
            v.insert(
                "duration_s".into(),
                json!((elapsed_s * 1000.0).round() / 1000.0),
            );
            t.json_fields(&mut v);
            v.insert("flows".into(), json!(self.flows.len()));
            v.insert("enqueued".into(), json!(counters.enqueued));
            v.insert("measured".into(), json!(counters.measured));
            v.insert(
                "no_enqueue_record".into(),
                json!(counters.no_enqueue_record),
            );
            v.insert("stale_discarded".into(), json!(counters.stale_discarded));
            v.insert("events_lost".into(), json!(counters.events_lost));
            v.insert("parse_failures".into(), json!(counters.parse_failures));
            out.push(Value::Object(v).to_string());
        } else {
            for (k, s) in &flows {
                out.push(format!(
                    "flow {}: {} packets, {} bytes, sojourn p50 {} p99 {} max {}",
                    flow_name(k),
                    s.packets,
                    s.bytes,
                    ms(s.percentile_ns(50.0)),
                    ms(s.percentile_ns(99.0)),
                    ms(s.max_ns)
                ));
            }
            out.push(format!(
                "summary {} over {:.1}s: {} packets, {} bytes, {} flows, sojourn p50 {} p99 {} max {}; \
                 enqueued {}, no enqueue record {} (qdisc bypass or noqueue: not measured), \
                 stale discarded {}, events lost {}, parse failures {}",
                self.iface,
                elapsed_s,
                t.packets,
                t.bytes,
                self.flows.len(),
                ms(t.percentile_ns(50.0)),
                ms(t.percentile_ns(99.0)),
                ms(t.max_ns),
                counters.enqueued,
                counters.no_enqueue_record,
                counters.stale_discarded,
                counters.events_lost,
                counters.parse_failures
            ));
        }
        out
    }
}

fn ms(ns: u64) -> String {
    format!("{:.3}ms", ns as f64 / 1e6)
}

fn addr(family: u8, a: &[u8; 16]) -> String {
    match family {
        FAMILY_IPV4 => Ipv4Addr::new(a[0], a[1], a[2], a[3]).to_string(),
        FAMILY_IPV6 => Ipv6Addr::from(*a).to_string(),
        _ => String::new(),
    }
}

fn proto_name(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        1 => "icmp".into(),
        58 => "icmpv6".into(),
        other => other.to_string(),
    }
}

/// `src:sport>dst:dport/proto`, or `ethertype 0x0806` for non-IP frames.
fn flow_name(k: &FlowKey) -> String {
    if k.family != FAMILY_IPV4 && k.family != FAMILY_IPV6 {
        return format!("ethertype {:#06x}", k.ethertype);
    }
    format!(
        "{}:{}>{}:{}/{}",
        addr(k.family, &k.saddr),
        u16::from_be(k.sport_be),
        addr(k.family, &k.daddr),
        u16::from_be(k.dport_be),
        proto_name(k.proto)
    )
}

fn flow_json(iface: Option<&str>, k: &FlowKey, s: &Stats) -> Value {
    let mut v = serde_json::Map::new();
    if let Some(iface) = iface {
        v.insert("kind".into(), json!("flow"));
        v.insert("iface".into(), json!(iface));
    }
    v.insert("src".into(), json!(addr(k.family, &k.saddr)));
    v.insert("dst".into(), json!(addr(k.family, &k.daddr)));
    v.insert("sport".into(), json!(u16::from_be(k.sport_be)));
    v.insert("dport".into(), json!(u16::from_be(k.dport_be)));
    v.insert("proto".into(), json!(k.proto));
    if k.family != FAMILY_IPV4 && k.family != FAMILY_IPV6 {
        v.insert("ethertype".into(), json!(k.ethertype));
    }
    s.json_fields(&mut v);
    Value::Object(v)
}

#[cfg(test)]
mod tests {
    use shaper_common::event::EVENT_PACKET;

    use super::*;

    fn event(port: u16, delay_ns: u64, len: u32) -> Event {
        let mut e = Event {
            delay_ns,
            len_bytes: len,
            kind: EVENT_SOJOURN,
            ..Event::default()
        };
        e.key.family = FAMILY_IPV4;
        e.key.proto = 17;
        e.key.saddr[..4].copy_from_slice(&[10, 0, 0, 1]);
        e.key.daddr[..4].copy_from_slice(&[10, 0, 0, 2]);
        e.key.sport_be = port.to_be();
        e.key.dport_be = 9u16.to_be();
        e
    }

    #[test]
    fn histogram_is_within_one_percent_and_max_exact() {
        let mut s = Stats::default();
        for v in [
            0u64,
            1,
            127,
            128,
            1000,
            20_000_000,
            20_123_456,
            u64::MAX / 2,
        ] {
            let mid = bucket_mid(bucket_of(v));
            let err = mid.abs_diff(v) as f64 / (v.max(1)) as f64;
            assert!(err <= 1.0 / 128.0, "{v} -> {mid}");
            s.add(v, 1);
        }
        assert_eq!(s.max_ns, u64::MAX / 2);
        assert_eq!(s.percentile_ns(100.0), u64::MAX / 2);
        assert_eq!(Stats::default().percentile_ns(50.0), 0);
    }

    #[test]
    fn percentiles_follow_nearest_rank() {
        let mut s = Stats::default();
        // 98 packets at 20 ms, one at 30 ms, one at 100 ms.
        for _ in 0..98 {
            s.add(20_000_000, 100);
        }
        s.add(30_000_000, 100);
        s.add(100_000_000, 100);
        let p50 = s.percentile_ns(50.0);
        assert!(p50.abs_diff(20_000_000) < 200_000, "{p50}");
        let p99 = s.percentile_ns(99.0);
        assert!(p99.abs_diff(30_000_000) < 300_000, "{p99}");
        assert_eq!(s.packets, 100);
        assert_eq!(s.bytes, 10_000);
    }

    #[test]
    fn aggregates_per_flow_and_interval_and_ignores_other_kinds() {
        let mut a = Aggregator::new("veth0");
        for i in 0..10 {
            a.add(&event(1000, 1_000_000 + i, 1500));
        }
        a.add(&event(2000, 5_000_000, 100));
        let mut other = event(3000, 9, 9);
        other.kind = EVENT_PACKET;
        a.add(&other);
        let line = a.end_interval(false);
        assert!(line.contains("11 packets"), "{line}");
        assert!(line.contains("10.0.0.1:1000>10.0.0.2:9/udp 10pk"), "{line}");
        // The next interval starts empty; the totals keep counting.
        a.add(&event(1000, 2_000_000, 1500));
        let v: Value = serde_json::from_str(&a.end_interval(true)).expect("json");
        assert_eq!(v["kind"], "interval");
        assert_eq!(v["packets"], 1);
        assert_eq!(v["t_s"], 2);
        assert_eq!(a.total().packets, 12);
        assert_eq!(a.total().bytes, 11 * 1500 + 100);
    }

    #[test]
    fn json_summary_is_last_and_complete() {
        let mut a = Aggregator::new("veth0");
        a.add(&event(1000, 20_000_000, 1500));
        a.add(&event(2000, 21_000_000, 1500));
        a.end_interval(true);
        let counters = Counters {
            enqueued: 2,
            measured: 2,
            no_enqueue_record: 3,
            events_lost: 1,
            ..Counters::default()
        };
        let lines = a.finish(&counters, 1.0, true);
        assert_eq!(lines.len(), 3);
        let flows: Vec<Value> = lines[..2]
            .iter()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert!(
            flows
                .iter()
                .all(|f| f["kind"] == "flow" && f["packets"] == 1)
        );
        let s: Value = serde_json::from_str(lines.last().expect("summary")).expect("json");
        assert_eq!(s["kind"], "summary");
        assert_eq!(s["iface"], "veth0");
        assert_eq!(s["packets"], 2);
        assert_eq!(s["no_enqueue_record"], 3);
        assert_eq!(s["events_lost"], 1);
        let p50 = s["delay_p50_ns"].as_u64().expect("p50");
        assert!(p50.abs_diff(20_000_000) < 200_000, "{p50}");
        assert_eq!(s["delay_max_ns"], 21_000_000);
        assert!(s["delay_p99_ns"].as_u64().expect("p99") >= p50);
        // Text mode ends with the summary too, and reports the bypassed
        // packets rather than hiding them.
        let text = a.finish(&counters, 1.0, false);
        let last = text.last().expect("summary");
        assert!(
            last.starts_with("summary veth0 over 1.0s: 2 packets"),
            "{last}"
        );
        assert!(last.contains("no enqueue record 3"), "{last}");
    }
}
