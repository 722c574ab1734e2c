//! What people see each interval: a table redrawn in place on a terminal,
//! one plain line when piped, or NDJSON records; and the final summary.
//!
//! JSON records (one object per line, `kind` first):
//! - `interval`: `t_s`, `flows`, `packets`, `bytes`, `delay_p50_ns`,
//!   `delay_p99_ns`, `delay_max_ns` (since the start), `window_samples`,
//!   `window_delay_p50_ns`, `window_delay_p99_ns`, `window_delay_max_ns`
//!   (this interval), drops, marks, lost events, the kernel's counters
//!   and, with more than one tin, `tins` (as `shaper status --json` shows
//!   them);
//! - `flow`: one per top flow per interval: `flow`, `rate_bytes_per_s`,
//!   `bytes`, `packets`, `delay_p50_ns`, `delay_p99_ns` (null when the
//!   flow has no histogram), `delay_max_ns`, drops, marks;
//! - `summary`: the last line of a run (see [`summary_json`]).
//!
//! Units: ns and bytes in JSON; ms and Mbit/s in text.

use std::{io::Write, time::Duration};

use serde_json::{Value, json};

use super::{FlowRow, FlowTable, Output, Summary, Window, flow_label};

/// Writes each interval in the chosen form.
pub struct Emitter {
    output: Output,
    iface: String,
    source: &'static str,
    top: usize,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn mbit(bytes_per_s: u64) -> f64 {
    bytes_per_s as f64 * 8.0 / 1e6
}

fn counters_json(c: &[(&'static str, u64)]) -> Value {
    Value::Object(c.iter().map(|(n, v)| ((*n).to_owned(), json!(v))).collect())
}

fn gauges_json(g: &[(&'static str, f64)]) -> Value {
    Value::Object(g.iter().map(|(n, v)| ((*n).to_owned(), json!(v))).collect())
}

/// The fair share as text, e.g. ` share=1/1.00 (active 2, backlogged 1,
/// committed 1)`,
/// or nothing without the fair pacer's gauges.
fn share_text(s: &Summary) -> String {
    let g = |name: &str| s.gauges.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    match (
        g("fair_multiplier"),
        g("fair_active_flows"),
        g("fair_backlogged_flows"),
        g("fair_committed_flows"),
    ) {
        (Some(m), Some(a), Some(b), Some(c)) => {
            format!(" share=1/{m:.2} (active {a:.0}, backlogged {b:.0}, committed {c:.0})")
        }
        _ => String::new(),
    }
}

/// One flow as a JSON record.
pub fn flow_json(iface: &str, row: &FlowRow<'_>) -> Value {
    let s = row.stats;
    json!({
        "kind": "flow",
        "iface": iface,
        "flow": flow_label(row.key),
        "rate_bytes_per_s": s.rate_bytes_per_s,
        "bytes": s.bytes,
        "packets": s.packets,
        "delay_p50_ns": s.delay_quantile_ns(0.5),
        "delay_p99_ns": s.delay_quantile_ns(0.99),
        "delay_max_ns": s.delay_max_ns,
        "aqm_drops": s.aqm_drops,
        "horizon_drops": s.horizon_drops,
        "marks": s.marks,
        "ended": s.ended,
    })
}

/// The summary record: the last line of `--json` output.
pub fn summary_json(s: &Summary) -> Value {
    json!({
        "kind": "summary",
        "iface": s.iface,
        "records": s.records,
        "events": s.events,
        "packets": s.packets,
        "bytes": s.bytes,
        "flows": s.flows,
        "flow_starts": s.flow_starts,
        "flow_ends": s.flow_ends,
        "delay_p50_ns": s.delay_p50_ns,
        "delay_p99_ns": s.delay_p99_ns,
        "delay_max_ns": s.delay_max_ns,
        "aqm_drops": s.aqm_drops,
        "horizon_drops": s.horizon_drops,
        "marks": s.marks,
        "events_lost": s.events_lost(),
        "events_dropped_user": s.events_dropped_user,
        "counters": counters_json(&s.counters),
        "gauges": gauges_json(&s.gauges),
        "tins": crate::tin_status::json(&s.tins),
    })
}

/// Each tin on a line, highest priority first: what its flows get now,
/// its threshold, its counters and its mean scheduled delay; nothing with
/// one tin.
fn tins_text(s: &Summary) -> String {
    if s.tins.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "{:<12} {:>12} {:>14} {:>10} {:>7} {:>7} {:>10}\n",
        "tin", "share Mbit/s", "threshold Mbit/s", "packets", "drops", "marks", "delay ms"
    );
    for t in s.tins.iter().rev() {
        out.push_str(&format!(
            "{:<12} {:>12.3} {:>14.3} {:>10} {:>7} {:>7} {:>10.2}\n",
            t.name,
            mbit(t.share_bytes_per_s),
            mbit(t.threshold_bytes_per_s),
            t.packets,
            t.drops,
            t.marks,
            t.mean_delay_us() / 1e3
        ));
    }
    out.push('\n');
    out
}

/// The summary as text lines.
pub fn summary_text(s: &Summary) -> String {
    format!(
        "{}: {} packets sampled as {} events, {} flows at the end; delay p50 {:.2} ms, p99 \
         {:.2} ms, max {:.2} ms; {} AQM drops, {} horizon drops, {} CE marks; events lost: \
         kernel {}, controller {}\n",
        s.iface,
        s.packets,
        s.events,
        s.flows,
        ms(s.delay_p50_ns),
        ms(s.delay_p99_ns),
        ms(s.delay_max_ns),
        s.aqm_drops,
        s.horizon_drops,
        s.marks,
        s.events_lost()
            .map_or_else(|| "n/a".to_owned(), |v| v.to_string()),
        s.events_dropped_user,
    )
}

/// The top-flows table (terminal form).
pub fn table_text(t: &FlowTable, top: usize) -> String {
    let mut out = format!(
        "{:<52} {:>10} {:>10} {:>10} {:>7} {:>7}\n",
        "flow", "Mbit/s", "p99 ms", "max ms", "drops", "marks"
    );
    for row in t.top(top) {
        let s = row.stats;
        let p99 = s
            .delay_quantile_ns(0.99)
            .map_or_else(|| "-".to_owned(), |v| format!("{:.2}", ms(v)));
        out.push_str(&format!(
            "{:<52} {:>10.3} {:>10} {:>10.2} {:>7} {:>7}\n",
            flow_label(row.key),
            mbit(s.rate_bytes_per_s),
            p99,
            ms(s.delay_max_ns),
            s.aqm_drops + s.horizon_drops,
            s.marks
        ));
    }
    out
}

impl Emitter {
    /// An emitter for `iface`.
    pub fn new(output: Output, iface: &str, source: &'static str, top: usize) -> Self {
        Self {
            output,
            iface: iface.to_owned(),
            source,
            top,
        }
    }

    /// Shows one interval. Write errors (a closed pipe) are ignored: the
    /// shaper keeps shaping when nobody reads.
    pub fn interval(&mut self, elapsed: Duration, t: &FlowTable, s: &Summary, w: &Window) {
        let text = match self.output {
            Output::Quiet => return,
            Output::Json => {
                let mut lines = json!({
                    "kind": "interval",
                    "iface": self.iface,
                    "t_s": elapsed.as_secs_f64(),
                    "flows": s.flows,
                    "events": s.events,
                    "packets": s.packets,
                    "bytes": s.bytes,
                    "delay_p50_ns": s.delay_p50_ns,
                    "delay_p99_ns": s.delay_p99_ns,
                    "delay_max_ns": s.delay_max_ns,
                    "window_samples": w.samples,
                    "window_delay_p50_ns": w.p50_ns,
                    "window_delay_p99_ns": w.p99_ns,
                    "window_delay_max_ns": w.max_ns,
                    "aqm_drops": s.aqm_drops,
                    "horizon_drops": s.horizon_drops,
                    "marks": s.marks,
                    "events_lost": s.events_lost(),
                    "events_dropped_user": s.events_dropped_user,
                    "counters": counters_json(&s.counters),
                    "gauges": gauges_json(&s.gauges),
                    "tins": crate::tin_status::json(&s.tins),
                })
                .to_string();
                lines.push('\n');
                for row in t.top(self.top) {
                    lines.push_str(&flow_json(&self.iface, &row).to_string());
                    lines.push('\n');
                }
                lines
            }
            Output::Plain => {
                let top = t.top(1);
                let busiest = top.first().map_or_else(String::new, |r| {
                    format!(
                        "; top {} {:.3} Mbit/s",
                        flow_label(r.key),
                        mbit(r.stats.rate_bytes_per_s)
                    )
                });
                format!(
                    "{} {} t={:.0}s flows={} delay p50={:.2}ms p99={:.2}ms ({} samples this interval) \
                     drops={} marks={} lost={}{}{}\n",
                    self.source,
                    self.iface,
                    elapsed.as_secs_f64(),
                    s.flows,
                    ms(w.p50_ns),
                    ms(w.p99_ns),
                    w.samples,
                    s.aqm_drops + s.horizon_drops,
                    s.marks,
                    s.events_lost().unwrap_or(0) + s.events_dropped_user,
                    share_text(s),
                    busiest
                )
            }
            Output::Live => format!(
                "\x1b[H\x1b[2J{} {}: {:.0} s, {} flows, delay over the last second p50 {:.2} \
                 ms p99 {:.2} ms, drops {}, marks {}, lost events {}{}\n\n{}{}",
                self.source,
                self.iface,
                elapsed.as_secs_f64(),
                s.flows,
                ms(w.p50_ns),
                ms(w.p99_ns),
                s.aqm_drops + s.horizon_drops,
                s.marks,
                s.events_lost().unwrap_or(0) + s.events_dropped_user,
                share_text(s),
                tins_text(s),
                table_text(t, self.top)
            ),
        };
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use shaper_common::event::{EVENT_F_SAMPLED, EVENT_PACKET, Event, VERDICT_CE};

    use super::*;
    use crate::telemetry::FlowTableOptions;

    #[test]
    fn summary_and_flow_records_carry_the_fields() {
        let mut t = FlowTable::new(FlowTableOptions::default()).expect("table");
        let mut e = Event {
            ts_ns: 5,
            delay_ns: 3_000_000,
            len_bytes: 1500,
            kind: EVENT_PACKET,
            verdict: VERDICT_CE,
            flags: EVENT_F_SAMPLED,
            ..Event::default()
        };
        e.key.family = 4;
        e.key.proto = 17;
        t.record(&e);
        let s = Summary::from_table("veth0", &t, 2, vec![("events_lost", 7)]);
        let v = summary_json(&s);
        assert_eq!(v["kind"], "summary");
        assert_eq!(v["iface"], "veth0");
        assert_eq!(v["marks"], 1);
        assert_eq!(v["events_lost"], 7);
        assert_eq!(v["events_dropped_user"], 2);
        let p50 = v["delay_p50_ns"].as_u64().expect("number");
        assert!((2_990_000..=3_010_000).contains(&p50), "{p50}");
        let rows = t.top(5);
        let f = flow_json("veth0", &rows[0]);
        assert_eq!(f["flow"], "0.0.0.0 > 0.0.0.0 udp");
        assert_eq!(f["bytes"], 1500);
        assert!(table_text(&t, 5).contains("0.0.0.0 > 0.0.0.0 udp"));
        assert!(
            summary_text(&s).contains("p99 3.00 ms"),
            "{}",
            summary_text(&s)
        );
    }
}
