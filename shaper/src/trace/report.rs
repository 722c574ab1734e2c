//! What `shaper trace` prints, on top of the project's telemetry
//! aggregator (`crate::telemetry`: the `FlowTable` keeps per-flow and
//! per-interface packets, bytes and delay histograms; `view` writes the
//! NDJSON interval and flow records).
//!
//! Added here, and only here: the tracer's own kernel counters at the top
//! level of the summary record (`no_enqueue_record`, `events_lost`, ...),
//! the closing per-flow records, and the plain text lines.
//!
//! JSON, one record per line: `interval` (plus `flow` records of its top
//! flows) each second, `flow` for every flow at the end (busiest first),
//! and last `summary`.
//!
//! Units: ns and bytes in JSON, ms in text. Quantiles are cumulative since
//! the start (the aggregator's histograms are not reset per interval); the
//! per-interval line counts the packets of that interval.

use serde_json::{Value, json};

use crate::telemetry::{FlowRow, FlowTable, Summary, flow_label, view};

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

impl Counters {
    /// By stable name, as the telemetry summary carries counters.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("enqueued", self.enqueued),
            ("measured", self.measured),
            ("no_enqueue_record", self.no_enqueue_record),
            ("stale_discarded", self.stale_discarded),
            ("events_lost", self.events_lost),
            ("parse_failures", self.parse_failures),
        ]
    }
}

fn ms(ns: u64) -> String {
    format!("{:.3}ms", ns as f64 / 1e6)
}

fn quantile(row: &FlowRow<'_>, q: f64) -> String {
    row.stats
        .delay_quantile_ns(q)
        .map_or_else(|| "-".to_owned(), ms)
}

/// Every flow still in the table, busiest (bytes) first.
fn flows_by_bytes(table: &FlowTable) -> Vec<FlowRow<'_>> {
    let mut rows: Vec<FlowRow<'_>> = table.iter().collect();
    rows.sort_by(|a, b| (b.stats.bytes, b.key).cmp(&(a.stats.bytes, a.key)));
    rows
}

/// Mean sojourn over every packet, ns (0 when none).
fn mean_ns(table: &FlowTable) -> u64 {
    let d = &table.iface.delay;
    if d.is_empty() {
        0
    } else {
        d.mean().round() as u64
    }
}

/// The summary record: the telemetry summary with the tracer's counters
/// also at the top level, and the mean sojourn (what CAKE's av_delay
/// averages).
pub fn summary_json(s: &Summary, c: &Counters, elapsed_s: f64, mean_ns: u64) -> Value {
    let mut v = view::summary_json(s);
    if let Value::Object(m) = &mut v {
        m.insert("delay_mean_ns".into(), json!(mean_ns));
        for (name, value) in c.named() {
            m.insert(name.into(), json!(value));
        }
        m.insert(
            "duration_s".into(),
            json!((elapsed_s * 1000.0).round() / 1000.0),
        );
    }
    v
}

/// The closing lines: one per flow, then the summary, always last.
pub fn finish(
    table: &FlowTable,
    s: &Summary,
    c: &Counters,
    elapsed_s: f64,
    json: bool,
) -> Vec<String> {
    let rows = flows_by_bytes(table);
    let mut out = Vec::new();
    if json {
        for row in &rows {
            out.push(view::flow_json(&s.iface, row).to_string());
        }
        out.push(summary_json(s, c, elapsed_s, mean_ns(table)).to_string());
        return out;
    }
    for row in &rows {
        out.push(format!(
            "flow {}: {} packets, {} bytes, sojourn p50 {} p99 {} max {}",
            flow_label(row.key),
            row.stats.packets,
            row.stats.bytes,
            quantile(row, 0.5),
            quantile(row, 0.99),
            ms(row.stats.delay_max_ns)
        ));
    }
    out.push(format!(
        "summary {} over {elapsed_s:.1}s: {} packets, {} bytes, {} flows, sojourn p50 {} p99 {} \
         max {}; enqueued {}, no enqueue record {} (qdisc bypass or noqueue: not measured), \
         stale discarded {}, events lost {} (kernel) {} (controller), parse failures {}",
        s.iface,
        s.packets,
        s.bytes,
        s.flows,
        ms(s.delay_p50_ns),
        ms(s.delay_p99_ns),
        ms(s.delay_max_ns),
        c.enqueued,
        c.no_enqueue_record,
        c.stale_discarded,
        c.events_lost,
        s.events_dropped_user,
        c.parse_failures
    ));
    out
}

#[cfg(test)]
mod tests {
    use shaper_common::event::{EVENT_SOJOURN, Event, FAMILY_IPV4};

    use super::*;
    use crate::telemetry::FlowTableOptions;

    fn event(port: u16, delay_ns: u64, len: u32) -> Event {
        let mut e = Event {
            ts_ns: 1,
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

    fn table() -> FlowTable {
        let mut t = FlowTable::new(FlowTableOptions::default()).expect("table");
        // 98 packets at 20 ms, one at 30 ms, one at 100 ms, in two flows.
        for i in 0..98 {
            t.record(&event(1000 + (i % 2), 20_000_000, 1500));
        }
        t.record(&event(1000, 30_000_000, 1500));
        t.record(&event(1001, 100_000_000, 100));
        t
    }

    #[test]
    fn aggregation_gives_sojourn_quantiles_per_interface_and_flow() {
        let t = table();
        let s = Summary::from_table("veth0", &t, 0, Counters::default().named());
        assert_eq!(s.packets, 100);
        assert_eq!(s.bytes, 99 * 1500 + 100);
        assert_eq!(s.flows, 2);
        assert!(s.delay_p50_ns.abs_diff(20_000_000) < 20_000, "{s:?}");
        assert!(s.delay_p99_ns.abs_diff(30_000_000) < 30_000, "{s:?}");
        assert!(s.delay_max_ns.abs_diff(100_000_000) < 100_000, "{s:?}");
    }

    #[test]
    fn json_summary_is_last_and_carries_the_tracer_counters() {
        let t = table();
        let c = Counters {
            enqueued: 101,
            measured: 100,
            no_enqueue_record: 3,
            events_lost: 1,
            ..Counters::default()
        };
        let s = Summary::from_table("veth0", &t, 0, c.named());
        let lines = finish(&t, &s, &c, 2.0, true);
        assert_eq!(lines.len(), 3);
        let flows: Vec<Value> = lines[..2]
            .iter()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert!(flows.iter().all(|f| f["kind"] == "flow"));
        // Busiest first.
        assert_eq!(flows[0]["flow"], "10.0.0.1:1000 > 10.0.0.2:9 udp");
        assert_eq!(flows[0]["packets"], 50);
        let v: Value = serde_json::from_str(lines.last().expect("summary")).expect("json");
        assert_eq!(v["kind"], "summary");
        assert_eq!(v["iface"], "veth0");
        assert_eq!(v["packets"], 100);
        assert_eq!(v["no_enqueue_record"], 3);
        assert_eq!(v["events_lost"], 1);
        assert_eq!(v["enqueued"], 101);
        assert_eq!(v["duration_s"], 2.0);
        // (98 × 20 + 30 + 100) / 100 ms.
        let mean = v["delay_mean_ns"].as_u64().expect("mean");
        assert!(mean.abs_diff(20_900_000) < 50_000, "{mean}");
        for k in ["delay_p50_ns", "delay_p99_ns", "delay_max_ns"] {
            assert!(v[k].as_u64().is_some(), "{k} in {v}");
        }
        // Text mode ends with the summary too, and reports the packets it
        // could not measure rather than hiding them.
        let text = finish(&t, &s, &c, 2.0, false);
        let last = text.last().expect("summary");
        assert!(
            last.starts_with("summary veth0 over 2.0s: 100 packets"),
            "{last}"
        );
        assert!(last.contains("no enqueue record 3"), "{last}");
    }
}
