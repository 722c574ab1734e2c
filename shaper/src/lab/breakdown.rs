//! The lab report's breakdown of the upload: what each TX queue of the WAN
//! device and each tin carried under each state, as Markdown tables and as
//! JSON.
//!
//! Invariants: a table appears only when some state has rows for it (a
//! multi-queue root, or more than one tin); shares are of what the state
//! carried in all over the same phase, so states compare on one scale
//! whatever their goodput.
//!
//! Units: percent of bytes; ms for delays (the shaper's mean scheduled
//! delay per packet, CAKE's moving average at the end of the phase).

use std::fmt::Write as _;

use serde_json::{Value, json};
use shaper_common::tins::Diffserv;

use super::{
    measured::{LabRun, LoadPhase},
    readings::{QueueStats, TinStats},
};

fn pct(part: u64, all: u64) -> String {
    if all == 0 {
        "–".to_owned()
    } else {
        format!("{:.1}", part as f64 * 100.0 / all as f64)
    }
}

/// The per-queue and per-tin tables for the upload, or nothing when no
/// state has either.
pub fn markdown(lab: &LabRun) -> String {
    let mut m = String::new();
    let queues = lab
        .states
        .iter()
        .map(|s| s.up.queues.len())
        .max()
        .unwrap_or(0);
    if queues > 0 {
        let _ = writeln!(
            m,
            "\n## Upload per TX queue\n\nThe WAN device has {} TX queues and each flow takes \
             the one its hash picks. Share of the bytes each queue's qdisc sent (drops in \
             brackets); a state that splits the rate per queue shows it as goodput lost when \
             the shares are uneven.\n",
            lab.config.queues
        );
        m.push_str("| State | Qdisc_per_queue |");
        for q in 1..=queues {
            let _ = write!(m, " Queue_{q}_percent |");
        }
        m.push_str("\n|---|---|");
        m.push_str(&"---:|".repeat(queues));
        m.push('\n');
        for s in lab.states.iter().filter(|s| !s.up.queues.is_empty()) {
            let all: u64 = s.up.queues.iter().map(|q| q.bytes).sum();
            let kind = s.up.queues.first().map_or("", |q| q.kind.as_str());
            let _ = write!(m, "| {} | {kind} |", s.name);
            for q in &s.up.queues {
                let _ = write!(m, " {} ({}) |", pct(q.bytes, all), q.drops);
            }
            m.push('\n');
        }
    }
    let mode = lab.config.diffserv;
    if lab.states.iter().any(|s| s.up.tins.len() > 1) {
        let _ = writeln!(
            m,
            "\n## Upload per tin ({})\n\nThe pings and the UDP probe carry DSCP EF (the voice \
             tin), the bulk streams none (best effort). Share of the bytes each tin sent; \
             delay is the shaper's mean scheduled delay per packet, or CAKE's moving average \
             at the end of the upload.\n\n| State | Tin | Bytes_percent | Packets | Drops | \
             Marks | Delay_ms |\n|---|---|---:|---:|---:|---:|---:|",
            mode.name()
        );
        for s in lab.states.iter().filter(|s| s.up.tins.len() > 1) {
            let all: u64 = s.up.tins.iter().map(|t| t.bytes).sum();
            for t in s.up.tins.iter().rev() {
                let delay = t
                    .delay_ms()
                    .map_or_else(|| "–".to_owned(), |d| format!("{d:.2}"));
                let _ = writeln!(
                    m,
                    "| {} | {} | {} | {} | {} | {} | {delay} |",
                    s.name,
                    mode.tin_name(t.tin),
                    pct(t.bytes, all),
                    t.packets,
                    t.drops,
                    t.marks
                );
            }
        }
    }
    m
}

fn queue_json(q: &QueueStats) -> Value {
    json!({
        "queue": q.queue, "kind": q.kind, "bytes": q.bytes, "packets": q.packets,
        "drops": q.drops,
    })
}

fn tin_json(mode: Diffserv, t: &TinStats) -> Value {
    json!({
        "tin": t.tin, "name": mode.tin_name(t.tin), "bytes": t.bytes, "packets": t.packets,
        "drops": t.drops, "marks": t.marks, "delay_ms": t.delay_ms(),
    })
}

/// A phase's `queues` and `tins` members for the JSON.
pub fn phase_json(mode: Diffserv, p: &LoadPhase) -> (Value, Value) {
    (
        Value::Array(p.queues.iter().map(queue_json).collect()),
        Value::Array(p.tins.iter().map(|t| tin_json(mode, t)).collect()),
    )
}
