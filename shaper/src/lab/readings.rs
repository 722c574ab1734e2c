//! What the lab reads back from a state while it runs: the WAN device's
//! qdisc tree from `tc -s -j qdisc show` and the shaper's counters from
//! `shaper status --json`.
//!
//! - [`QdiscStats`]: the root qdisc's totals; under a multi-queue root
//!   (`mq`, cake_mq) one [`QueueStats`] per TX queue's child; and CAKE's
//!   tins as [`TinStats`], summed by tin over the per-queue CAKEs when the
//!   root has none of its own (cake_mq, the split under `mq`).
//! - [`parse_counters`]: the shaper's counters as a flat map, its tins as
//!   `tin.<i>.<name>`, which [`TinStats::from_counters`] reads back.
//!
//! Invariants: counts are cumulative from when the qdisc or the shaper
//! started; [`QdiscStats::since`] turns two readings into the counts
//! between them, while gauges (CAKE's average delay) keep the later value.
//!
//! Units: bytes and packets; CAKE's delays in µs as tc prints them; the
//! shaper's summed scheduled delay in ns.

use std::collections::BTreeMap;

use serde_json::Value;

use super::LabError;

/// One TX queue's child qdisc under a multi-queue root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue, numbered from 1 as the child's parent minor is.
    pub queue: u32,
    /// The child's kind (`fq`, `cake`, ...).
    pub kind: String,
    /// Bytes sent.
    pub bytes: u64,
    /// Packets sent.
    pub packets: u64,
    /// Packets dropped.
    pub drops: u64,
}

/// One priority tin: CAKE's, or the shaper's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TinStats {
    /// Its index; priority rises with it in the shaper, and CAKE lists its
    /// tins in its own order (for diffserv4: bulk, best effort, video,
    /// voice, the same).
    pub tin: usize,
    /// Bytes sent.
    pub bytes: u64,
    /// Packets sent.
    pub packets: u64,
    /// Packets dropped.
    pub drops: u64,
    /// CE marks.
    pub marks: u64,
    /// The shaper's scheduled delay of the tin's packets, summed, ns.
    pub delay_sum_ns: Option<u64>,
    /// CAKE's moving average of the tin's queueing delay, µs (a gauge; the
    /// largest over per-queue CAKEs).
    pub avg_delay_us: Option<u64>,
}

impl TinStats {
    /// The mean delay of the tin's packets, ms: the shaper's summed delay
    /// over its packets, or CAKE's average.
    pub fn delay_ms(&self) -> Option<f64> {
        match (self.delay_sum_ns, self.avg_delay_us) {
            (Some(_), _) if self.packets == 0 => Some(0.0),
            (Some(sum), _) => Some(sum as f64 / self.packets as f64 / 1e6),
            (None, Some(us)) => Some(us as f64 / 1e3),
            (None, None) => None,
        }
    }

    /// The shaper's tins in `counters` ([`parse_counters`]'s map: keys
    /// `tin.<i>.<name>`), in tin order; empty when it runs one tin.
    pub fn from_counters(counters: &BTreeMap<String, u64>) -> Vec<TinStats> {
        let mut tins: BTreeMap<usize, TinStats> = BTreeMap::new();
        for (key, v) in counters {
            let Some((i, name)) = key
                .strip_prefix("tin.")
                .and_then(|rest| rest.split_once('.'))
            else {
                continue;
            };
            let Ok(tin) = i.parse::<usize>() else {
                continue;
            };
            let t = tins.entry(tin).or_insert_with(|| TinStats {
                tin,
                delay_sum_ns: Some(0),
                ..TinStats::default()
            });
            match name {
                "bytes" => t.bytes = *v,
                "packets" => t.packets = *v,
                "drops" => t.drops = *v,
                "marks" => t.marks = *v,
                "delay_ns" => t.delay_sum_ns = Some(*v),
                _ => {}
            }
        }
        tins.into_values().collect()
    }

    /// The shaper's tins between two readings of its counters.
    pub fn between(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> Vec<TinStats> {
        let before = Self::from_counters(before);
        Self::from_counters(after)
            .into_iter()
            .map(|t| {
                let was = before.iter().find(|b| b.tin == t.tin);
                t.since(was)
            })
            .collect()
    }

    fn since(self, before: Option<&TinStats>) -> Self {
        let Some(b) = before else {
            return self;
        };
        TinStats {
            bytes: self.bytes.saturating_sub(b.bytes),
            packets: self.packets.saturating_sub(b.packets),
            drops: self.drops.saturating_sub(b.drops),
            marks: self.marks.saturating_sub(b.marks),
            delay_sum_ns: self
                .delay_sum_ns
                .map(|d| d.saturating_sub(b.delay_sum_ns.unwrap_or(0))),
            ..self
        }
    }

    /// Adds another per-queue CAKE's figures for the same tin.
    fn add(&mut self, o: &TinStats) {
        self.bytes += o.bytes;
        self.packets += o.packets;
        self.drops += o.drops;
        self.marks += o.marks;
        self.avg_delay_us = self.avg_delay_us.max(o.avg_delay_us);
    }

    /// One entry of CAKE's `tins` array.
    fn of_cake(tin: usize, v: &Value) -> Self {
        let num = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        TinStats {
            tin,
            bytes: num("sent_bytes"),
            packets: num("sent_packets"),
            drops: num("drops"),
            marks: num("ecn_mark"),
            delay_sum_ns: None,
            avg_delay_us: v.get("avg_delay_us").and_then(Value::as_u64),
        }
    }
}

/// The tin CAKE lists at `position` of its `tins` statistics in `mode`:
/// sch_cake.c dumps tins in its `tin_order`, bulk first for diffserv3 and
/// diffserv4 (`bulk_order`, {1, 0, 2, 3}), in index order otherwise. The
/// index is the one [`shaper_common::tins::Diffserv::tin_name`] names.
pub fn cake_tin_at(mode: &str, position: usize) -> usize {
    const BULK_ORDER: [usize; 4] = [1, 0, 2, 3];
    match mode {
        "diffserv3" | "diffserv4" if position < BULK_ORDER.len() => BULK_ORDER[position],
        _ => position,
    }
}

/// Statistics of the WAN device's qdisc tree, from `tc -s -j`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QdiscStats {
    /// The root's kind, e.g. `cake`, `fq`, `mq`, `noqueue`.
    pub kind: String,
    /// Bytes sent.
    pub bytes: u64,
    /// Packets sent.
    pub packets: u64,
    /// Packets dropped.
    pub drops: u64,
    /// ECN CE marks, summed over tins (CAKE only).
    pub ecn_marks: Option<u64>,
    /// Each TX queue's child, in queue order, under `mq` or cake_mq; empty
    /// under any other root.
    pub queues: Vec<QueueStats>,
    /// CAKE's tins, in its order; empty without CAKE.
    pub tins: Vec<TinStats>,
}

/// `json` without the text tc prints, even in JSON mode, for the options
/// of a qdisc kind it cannot parse (`{[Unknown qdisc, optlen=140] }`, as
/// iproute2 releases older than cake_mq print for it), which leaves an
/// empty object.
fn without_unknown_options(json: &str) -> String {
    const MARK: &str = "[Unknown qdisc";
    let mut out = String::with_capacity(json.len());
    let mut rest = json;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let end = tail.find(']').map_or(tail.len(), |i| i + 1);
        rest = tail[end..].trim_start_matches(' ');
    }
    out.push_str(rest);
    out
}

/// Roots whose children are one per TX queue.
const MULTI_QUEUE_ROOTS: [&str; 2] = ["mq", "cake_mq"];

impl QdiscStats {
    /// The counts since `before` (a reading of the same qdisc tree), or
    /// these counts when there is none.
    pub fn since(self, before: Option<&QdiscStats>) -> Self {
        let Some(b) = before else {
            return self;
        };
        QdiscStats {
            bytes: self.bytes.saturating_sub(b.bytes),
            packets: self.packets.saturating_sub(b.packets),
            drops: self.drops.saturating_sub(b.drops),
            ecn_marks: self
                .ecn_marks
                .map(|m| m.saturating_sub(b.ecn_marks.unwrap_or(0))),
            queues: self
                .queues
                .into_iter()
                .map(|q| {
                    let was = b.queues.iter().find(|o| o.queue == q.queue);
                    QueueStats {
                        bytes: q.bytes.saturating_sub(was.map_or(0, |o| o.bytes)),
                        packets: q.packets.saturating_sub(was.map_or(0, |o| o.packets)),
                        drops: q.drops.saturating_sub(was.map_or(0, |o| o.drops)),
                        ..q
                    }
                })
                .collect(),
            tins: self
                .tins
                .into_iter()
                .map(|t| {
                    let was = b.tins.iter().find(|o| o.tin == t.tin);
                    t.since(was)
                })
                .collect(),
            kind: self.kind,
        }
    }

    /// Parses `tc -s -j qdisc show dev X` output.
    pub fn parse(json: &str) -> Result<Self, LabError> {
        let err = |detail: String| LabError::Parse {
            command: "tc -s -j qdisc show".to_owned(),
            detail,
        };
        let json = without_unknown_options(json);
        let v: Value = serde_json::from_str(&json).map_err(|e| err(e.to_string()))?;
        let list = v
            .as_array()
            .ok_or_else(|| err("not a JSON array".to_owned()))?;
        let root = list
            .iter()
            .find(|q| q.get("root").and_then(Value::as_bool) == Some(true))
            .or_else(|| list.first())
            .ok_or_else(|| err("no qdisc listed".to_owned()))?;
        let num = |q: &Value, k: &str| q.get(k).and_then(Value::as_u64).unwrap_or(0);
        let text = |q: &Value, k: &str| {
            q.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let kind = text(root, "kind");
        // The root's children, by the queue their parent's minor names.
        let major = text(root, "handle");
        let children: Vec<(u32, &Value)> = list
            .iter()
            .filter_map(|q| {
                let parent = q.get("parent").and_then(Value::as_str)?;
                let minor = parent.strip_prefix(major.as_str())?;
                Some((u32::from_str_radix(minor, 16).ok()?, q))
            })
            .filter(|_| !major.is_empty())
            .collect();
        let queues = if MULTI_QUEUE_ROOTS.contains(&kind.as_str()) {
            let mut q: Vec<QueueStats> = children
                .iter()
                .map(|(queue, c)| QueueStats {
                    queue: *queue,
                    kind: text(c, "kind"),
                    bytes: num(c, "bytes"),
                    packets: num(c, "packets"),
                    drops: num(c, "drops"),
                })
                .collect();
            q.sort_by_key(|q| q.queue);
            q
        } else {
            Vec::new()
        };
        let cake_tins = |q: &Value| -> Vec<TinStats> {
            let mode = q
                .get("options")
                .and_then(|o| o.get("diffserv"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            let mut tins: Vec<TinStats> = q
                .get("tins")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(i, t)| TinStats::of_cake(cake_tin_at(mode, i), t))
                .collect();
            tins.sort_by_key(|t| t.tin);
            tins
        };
        let mut tins = cake_tins(root);
        if tins.is_empty() {
            for (_, c) in &children {
                for t in cake_tins(c) {
                    match tins.iter_mut().find(|o| o.tin == t.tin) {
                        Some(o) => o.add(&t),
                        None => tins.push(t),
                    }
                }
            }
        }
        let ecn_marks = (!tins.is_empty()).then(|| tins.iter().map(|t| t.marks).sum());
        Ok(Self {
            kind,
            bytes: num(root, "bytes"),
            packets: num(root, "packets"),
            drops: num(root, "drops"),
            ecn_marks,
            queues,
            tins,
        })
    }
}

/// The `counters` member of `shaper status --json` output (an object, or an
/// array whose first element is one).
pub fn parse_counters(json: &str) -> Result<BTreeMap<String, u64>, String> {
    let v: Value = serde_json::from_str(json.trim()).map_err(|e| e.to_string())?;
    let obj = match &v {
        Value::Array(a) => a.first().ok_or("an empty JSON array")?,
        other => other,
    };
    let egress = obj.get("counters").and_then(Value::as_object);
    let ingress = obj
        .get("ingress")
        .and_then(|i| i.get("counters"))
        .and_then(Value::as_object);
    if egress.is_none() && ingress.is_none() {
        return Err("no \"counters\" object".to_owned());
    }
    let mut out = BTreeMap::new();
    for (prefix, counters) in [("", egress), ("ingress.", ingress)] {
        for (k, v) in counters.into_iter().flatten() {
            let n = v
                .as_u64()
                .ok_or_else(|| format!("counter {k} is not an unsigned integer: {v}"))?;
            out.insert(format!("{prefix}{k}"), n);
        }
    }
    // The fair pacer's state, when present, as `fair.<name>`.
    if let Some(fair) = obj.get("fair").and_then(Value::as_object) {
        for (k, v) in fair {
            if let Some(n) = v.as_u64() {
                out.insert(format!("fair.{k}"), n);
            }
        }
    }
    // Each tin's counters, when the pacer runs tins, as `tin.<i>.<name>`.
    for t in obj
        .get("tins")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(i) = t.get("tin").and_then(Value::as_u64) else {
            continue;
        };
        for (k, v) in t.as_object().into_iter().flatten() {
            if let (Some(n), true) = (v.as_u64(), k != "tin") {
                out.insert(format!("tin.{i}.{k}"), n);
            }
        }
    }
    // The kernel's run figures of each program, as
    // `program.<name>.run_cnt` and `.run_time_ns` (ingress prefixed).
    for (prefix, side) in [("", Some(obj)), ("ingress.", obj.get("ingress"))] {
        let programs = side
            .and_then(|o| o.get("programs"))
            .and_then(Value::as_array);
        for p in programs.into_iter().flatten() {
            let Some(name) = p.get("name").and_then(Value::as_str) else {
                continue;
            };
            for key in ["run_cnt", "run_time_ns"] {
                if let Some(n) = p.get(key).and_then(Value::as_u64) {
                    out.insert(format!("{prefix}program.{name}.{key}"), n);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_from_status_json() {
        let c = parse_counters(r#"{"iface":"wan0","counters":{"paced":10,"ce_marked":3}}"#)
            .expect("parses");
        assert_eq!(c.get("paced"), Some(&10));
        assert_eq!(c.get("ce_marked"), Some(&3));
        let c = parse_counters(r#"[{"counters":{"aqm_drop":0}}]"#).expect("array form");
        let f = parse_counters(r#"{"counters":{"paced":1},"fair":{"multiplier_q16":262144}}"#)
            .expect("with the fair state");
        assert_eq!(f.get("fair.multiplier_q16"), Some(&262_144));
        let t = parse_counters(
            r#"{"counters":{"paced":1},"tins":[{"tin":0,"name":"Best Effort","packets":5},
                {"tin":3,"name":"Voice","packets":2,"bytes":300}]}"#,
        )
        .expect("with tins");
        assert_eq!(t.get("tin.0.packets"), Some(&5));
        assert_eq!(t.get("tin.3.bytes"), Some(&300));
        assert_eq!(t.get("tin.3.tin"), None);
        assert_eq!(c.get("aqm_drop"), Some(&0));
        assert!(parse_counters(r#"{"iface":"wan0"}"#).is_err());
        assert!(parse_counters("classifier: tcx").is_err());
        assert!(parse_counters(r#"{"counters":{"x":-1}}"#).is_err());
        let i =
            parse_counters(r#"{"ingress":{"counters":{"police_drop":7}}}"#).expect("ingress only");
        assert_eq!(i.get("ingress.police_drop"), Some(&7));
        assert_eq!(i.get("police_drop"), None);
        let p = parse_counters(
            r#"{"counters":{"paced":1},
                "programs":[{"name":"shaper_egress","id":9,"run_cnt":5,"run_time_ns":900}],
                "ingress":{"counters":{"packets":2},
                  "programs":[{"name":"shaper_police","id":10,"run_cnt":2,"run_time_ns":300}]}}"#,
        )
        .expect("with programs");
        assert_eq!(p.get("program.shaper_egress.run_cnt"), Some(&5));
        assert_eq!(p.get("program.shaper_egress.run_time_ns"), Some(&900));
        assert_eq!(
            p.get("ingress.program.shaper_police.run_time_ns"),
            Some(&300)
        );
    }

    #[test]
    fn cake_stats_sum_tins() {
        let json = r#"[{"kind":"cake","handle":"8001:","root":true,"bytes":1000,
            "packets":10,"drops":2,"max_network_size":1514,
            "tins":[{"ecn_mark":4,"sent_bytes":600},{"ecn_mark":1,"sent_bytes":400}]},
            {"kind":"fq","root":false,"bytes":1}]"#;
        let s = QdiscStats::parse(json).expect("parses");
        assert_eq!(
            (s.kind.as_str(), s.bytes, s.packets, s.drops, s.ecn_marks),
            ("cake", 1000, 10, 2, Some(5))
        );
        assert!(s.queues.is_empty(), "one queue under cake");
        assert_eq!(
            s.tins.iter().map(|t| t.bytes).collect::<Vec<_>>(),
            [600, 400]
        );
        let s = QdiscStats::parse(r#"[{"kind":"noqueue","root":true}]"#).expect("parses");
        assert_eq!(s.ecn_marks, None);
        assert!(QdiscStats::parse("[]").is_err());
    }

    /// `mq` with a CAKE per queue (or cake_mq): a row per queue, and the
    /// tins summed by index over the queues' CAKEs; the clsact of the same
    /// device is no queue.
    #[test]
    fn a_multi_queue_root_has_a_row_per_queue_and_tins_summed_over_them() {
        let json = r#"[{"kind":"mq","handle":"8001:","root":true,"bytes":3000,"packets":3},
            {"kind":"cake","handle":"0:","parent":"8001:2","bytes":2000,"packets":2,"drops":1,
             "tins":[{"sent_bytes":1500,"sent_packets":1,"ecn_mark":1,"avg_delay_us":300},
                     {"sent_bytes":500,"sent_packets":1,"avg_delay_us":100}]},
            {"kind":"cake","handle":"0:","parent":"8001:1","bytes":1000,"packets":1,
             "tins":[{"sent_bytes":1000,"sent_packets":1,"drops":2,"avg_delay_us":900}]},
            {"kind":"clsact","handle":"ffff:","parent":"ffff:fff1"}]"#;
        let s = QdiscStats::parse(json).expect("parses");
        assert_eq!(
            s.queues
                .iter()
                .map(|q| (q.queue, q.bytes, q.drops))
                .collect::<Vec<_>>(),
            [(1, 1000, 0), (2, 2000, 1)]
        );
        assert_eq!(s.tins.len(), 2);
        assert_eq!(
            (
                s.tins[0].bytes,
                s.tins[0].packets,
                s.tins[0].drops,
                s.tins[0].marks
            ),
            (2500, 2, 2, 1)
        );
        assert_eq!(s.tins[0].avg_delay_us, Some(900), "the largest average");
        assert_eq!(s.ecn_marks, Some(1));
        let later = QdiscStats {
            queues: vec![QueueStats {
                queue: 1,
                bytes: 5000,
                ..s.queues[0].clone()
            }],
            ..s.clone()
        };
        let d = later.since(Some(&s));
        assert_eq!(d.queues[0].bytes, 4000);
        assert_eq!(d.tins[0].bytes, 0);
        assert_eq!(d.tins[0].avg_delay_us, Some(900), "a gauge keeps its value");
    }

    /// CAKE lists bulk first in diffserv4; the tins come back by index,
    /// best effort at 0 as the shaper numbers them.
    #[test]
    fn cakes_listing_order_is_mapped_to_tin_indices() {
        let json = r#"[{"kind":"cake","handle":"1:","root":true,
            "options":{"diffserv":"diffserv4"},
            "tins":[{"sent_bytes":1},{"sent_bytes":2},{"sent_bytes":3},{"sent_bytes":4}]}]"#;
        let s = QdiscStats::parse(json).expect("parses");
        assert_eq!(
            s.tins.iter().map(|t| (t.tin, t.bytes)).collect::<Vec<_>>(),
            [(0, 2), (1, 1), (2, 3), (3, 4)]
        );
        assert_eq!(cake_tin_at("diffserv8", 5), 5);
        assert_eq!(cake_tin_at("besteffort", 0), 0);
    }

    /// cake_mq's root as an older tc prints it: its options are not
    /// JSON; its children, CAKEs, are.
    #[test]
    fn a_root_tc_cannot_parse_still_reads() {
        let json = r#"[{"kind":"cake_mq","handle":"8003:","root":true,"options":{[Unknown qdisc, optlen=140] },"bytes":336},
            {"kind":"cake","handle":"0:","parent":"8003:4","options":{"diffserv":"diffserv4"},
             "bytes":336,"tins":[{"sent_bytes":0},{"sent_bytes":0},{"sent_bytes":0},{"sent_bytes":336}]}]"#;
        let s = QdiscStats::parse(json).expect("parses");
        assert_eq!((s.kind.as_str(), s.bytes), ("cake_mq", 336));
        assert_eq!(s.queues.len(), 1);
        assert_eq!((s.queues[0].queue, s.queues[0].bytes), (4, 336));
        assert_eq!(s.tins[3].bytes, 336, "voice");
        assert_eq!(without_unknown_options(r#"{"a":1}"#), r#"{"a":1}"#);
    }

    #[test]
    fn the_shapers_tins_come_back_from_its_counters() {
        let c = BTreeMap::from([
            ("tin.0.bytes".to_owned(), 100),
            ("tin.0.packets".to_owned(), 2),
            ("tin.0.delay_ns".to_owned(), 4_000_000),
            ("tin.3.bytes".to_owned(), 50),
            ("tin.3.drops".to_owned(), 1),
            ("paced".to_owned(), 9),
        ]);
        let t = TinStats::from_counters(&c);
        assert_eq!(t.iter().map(|t| t.tin).collect::<Vec<_>>(), [0, 3]);
        assert_eq!((t[0].bytes, t[0].packets), (100, 2));
        assert_eq!(t[0].delay_ms(), Some(2.0));
        assert_eq!((t[1].drops, t[1].delay_ms()), (1, Some(0.0)));
        assert!(TinStats::from_counters(&BTreeMap::new()).is_empty());
    }
}
