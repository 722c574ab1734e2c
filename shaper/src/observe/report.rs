//! The observer's arithmetic and output: deltas between two samples, the
//! bypass and hook-only figures per direction, and their text and JSON forms.
//!
//! Definitions, per direction, over a span between two samples (an interval,
//! or start to now for the cumulative figures):
//! - `hook`: packets and `skb->len` bytes the TC hook counted;
//! - `iface`: the interface's own IFLA_STATS64 packets and bytes;
//! - `hook_wire`: the same packets as segments on the wire (a GSO packet as
//!   `gso_segs` packets, each repeating the headers): what the interface
//!   counts if it segments after the hook or counts before GRO;
//! - `bypass = iface - hook_wire` when positive: traffic the interface
//!   carried that never passed the hook (flow offload, `PACKET_QDISC_BYPASS`,
//!   XDP), beyond anything segmentation could explain;
//! - `hook_only = hook - iface` when positive: traffic the hook saw that the
//!   interface did not carry (yet): dropped by a qdisc or by a later TC
//!   program, or still queued when the span ended. Kept apart so it never
//!   shows as a negative bypass.
//!
//! An interface count between `hook` and `hook_wire` is fully explained, so
//! both figures are lower bounds: segmentation can hide up to
//! `hook_wire - hook` of bypass or of drops.
//!
//! On egress, the packets the driver counted in `tx_dropped` passed the hook
//! but not `tx_packets`, so the packet figures add them to the interface's
//! side first (`tx_dropped` has no byte count, so the byte figures cannot).
//! Ingress drops (`rx_dropped`) are mostly counted after the hook (no
//! protocol handler, for instance), so they are reported, not subtracted.
//!
//! Both figures are net: a span with both bypass and drops shows only the
//! larger. Counters are monotonic `u64`s that cannot wrap in practice; a
//! counter that went backwards (the interface was recreated) gives a zero
//! delta, never a huge one. Units: bytes and packets; percent of the
//! interface's bytes (`None` when the interface carried nothing).

use std::fmt::Write as _;

use serde_json::{Map, Value, json};

/// Packets and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

impl Counts {
    /// `self - earlier`, each field floored at zero.
    pub fn since(self, earlier: Counts) -> Counts {
        Counts {
            packets: self.packets.saturating_sub(earlier.packets),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }
}

/// One direction's counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirSample {
    /// What the hook counted.
    pub hook: Counts,
    /// What the hook counted, as segments on the wire.
    pub hook_wire: Counts,
    /// What the interface counted.
    pub iface: Counts,
    /// The interface's dropped packets (`tx_dropped` or `rx_dropped`).
    pub iface_dropped_packets: u64,
}

/// Both directions at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Egress: the TC egress hook against `tx_*`.
    pub tx: DirSample,
    /// Ingress: the TC ingress hook against `rx_*`.
    pub rx: DirSample,
}

/// Which direction, for the arithmetic that differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Egress (`tx_*`).
    Tx,
    /// Ingress (`rx_*`).
    Rx,
}

impl Dir {
    fn prefix(self) -> &'static str {
        match self {
            Dir::Tx => "tx",
            Dir::Rx => "rx",
        }
    }
}

/// One direction's comparison over a span.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Comparison {
    /// Hook delta.
    pub hook: Counts,
    /// Hook delta as segments on the wire.
    pub hook_wire: Counts,
    /// Interface delta.
    pub iface: Counts,
    /// Interface-dropped packets in the span.
    pub iface_dropped_packets: u64,
    /// Carried by the interface, unseen by the hook.
    pub bypass: Counts,
    /// Seen by the hook, not carried (dropped after it, or still queued).
    pub hook_only: Counts,
    /// `bypass.bytes` as a percentage of `iface.bytes`; `None` if zero.
    pub bypass_pct: Option<f64>,
}

/// Compares `dir` between `earlier` and `later`.
pub fn compare(dir: Dir, earlier: &DirSample, later: &DirSample) -> Comparison {
    let hook = later.hook.since(earlier.hook);
    let hook_wire = later.hook_wire.since(earlier.hook_wire);
    let iface = later.iface.since(earlier.iface);
    let dropped = later
        .iface_dropped_packets
        .saturating_sub(earlier.iface_dropped_packets);
    // Egress: driver drops passed the hook; count them on the interface's
    // side for packets. Ingress: see the module header.
    let iface_packets_seen = match dir {
        Dir::Tx => iface.packets.saturating_add(dropped),
        Dir::Rx => iface.packets,
    };
    // The wire figures are never below the skb ones; `max` guards against
    // an object that did not count them.
    let bypass = Counts {
        packets: iface_packets_seen.saturating_sub(hook_wire.packets.max(hook.packets)),
        bytes: iface.bytes.saturating_sub(hook_wire.bytes.max(hook.bytes)),
    };
    let hook_only = Counts {
        packets: hook.packets.saturating_sub(iface_packets_seen),
        bytes: hook.bytes.saturating_sub(iface.bytes),
    };
    Comparison {
        hook,
        hook_wire,
        iface,
        iface_dropped_packets: dropped,
        bypass,
        hook_only,
        bypass_pct: percent(bypass.bytes, iface.bytes),
    }
}

/// `part / whole * 100`, `None` when `whole` is 0.
pub fn percent(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 * 100.0 / whole as f64)
}

/// Both directions' comparisons.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Both {
    /// Egress.
    pub tx: Comparison,
    /// Ingress.
    pub rx: Comparison,
}

impl Both {
    /// Compares `earlier` with `later` in both directions.
    pub fn between(earlier: &Sample, later: &Sample) -> Both {
        Both {
            tx: compare(Dir::Tx, &earlier.tx, &later.tx),
            rx: compare(Dir::Rx, &earlier.rx, &later.rx),
        }
    }

    /// The flat JSON fields (`tx_hook_bytes`, `rx_bypass_pct`, ...) into `m`.
    pub fn put_fields(&self, m: &mut Map<String, Value>) {
        for (dir, c) in [(Dir::Tx, &self.tx), (Dir::Rx, &self.rx)] {
            let p = dir.prefix();
            let mut put = |k: &str, v: Value| {
                m.insert(format!("{p}_{k}"), v);
            };
            put("hook_bytes", json!(c.hook.bytes));
            put("hook_packets", json!(c.hook.packets));
            put("hook_wire_bytes", json!(c.hook_wire.bytes));
            put("hook_wire_packets", json!(c.hook_wire.packets));
            put("iface_bytes", json!(c.iface.bytes));
            put("iface_packets", json!(c.iface.packets));
            put("iface_dropped_packets", json!(c.iface_dropped_packets));
            put("bypass_bytes", json!(c.bypass.bytes));
            put("bypass_packets", json!(c.bypass.packets));
            put("bypass_pct", json!(c.bypass_pct.map(round3)));
            put("hook_only_bytes", json!(c.hook_only.bytes));
            put("hook_only_packets", json!(c.hook_only.packets));
        }
    }

    /// One text fragment: "tx hook B/p iface B/p bypass B (x%) | rx ...".
    pub fn text(&self) -> String {
        let mut s = String::new();
        for (dir, c) in [(Dir::Tx, &self.tx), (Dir::Rx, &self.rx)] {
            if dir == Dir::Rx {
                s.push_str(" | ");
            }
            let _ = write!(
                s,
                "{} hook {} B/{} p iface {} B/{} p bypass {} B/{} p ({})",
                dir.prefix(),
                c.hook.bytes,
                c.hook.packets,
                c.iface.bytes,
                c.iface.packets,
                c.bypass.bytes,
                c.bypass.packets,
                pct_text(c.bypass_pct),
            );
            if c.hook_wire != c.hook {
                let _ = write!(
                    s,
                    " (hook as wire segments {} B/{} p)",
                    c.hook_wire.bytes, c.hook_wire.packets
                );
            }
            if c.hook_only.bytes > 0 || c.hook_only.packets > 0 {
                let _ = write!(
                    s,
                    " hook-only {} B/{} p",
                    c.hook_only.bytes, c.hook_only.packets
                );
            }
        }
        s
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn pct_text(p: Option<f64>) -> String {
    p.map_or_else(|| "-%".to_owned(), |p| format!("{p:.2}%"))
}

/// The `{"kind":"interval",...}` record: this interval's figures flat, the
/// cumulative ones under `cumulative`.
pub fn interval_json(iface: &str, t_s: f64, span_s: f64, interval: &Both, total: &Both) -> Value {
    let mut m = Map::new();
    m.insert("kind".into(), json!("interval"));
    m.insert("iface".into(), json!(iface));
    m.insert("t_s".into(), json!(round3(t_s)));
    m.insert("interval_s".into(), json!(round3(span_s)));
    interval.put_fields(&mut m);
    let mut cum = Map::new();
    total.put_fields(&mut cum);
    m.insert("cumulative".into(), Value::Object(cum));
    Value::Object(m)
}

/// What the summary says about conntrack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlowsStatus {
    /// The table was read; this many entries were offloaded.
    Listed(usize),
    /// No conntrack here (why).
    Unavailable(String),
}

/// The last record, `{"kind":"summary",...}`: cumulative figures flat.
pub fn summary_json(
    iface: &str,
    duration_s: f64,
    attach_mode: &str,
    total: &Both,
    flows: &FlowsStatus,
) -> Value {
    let mut m = Map::new();
    m.insert("kind".into(), json!("summary"));
    m.insert("iface".into(), json!(iface));
    m.insert("duration_s".into(), json!(round3(duration_s)));
    m.insert("attach".into(), json!(attach_mode));
    total.put_fields(&mut m);
    let (n, ct) = match flows {
        FlowsStatus::Listed(n) => (json!(n), json!("available")),
        FlowsStatus::Unavailable(why) => (Value::Null, json!(format!("not available: {why}"))),
    };
    m.insert("offloaded_flows".into(), n);
    m.insert("conntrack".into(), ct);
    Value::Object(m)
}

/// The text summary.
pub fn summary_text(iface: &str, duration_s: f64, attach_mode: &str, total: &Both) -> String {
    format!(
        "summary {iface} over {duration_s:.1} s (hooks attached by {attach_mode}): {}",
        total.text()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(hook: (u64, u64), iface: (u64, u64), dropped: u64) -> DirSample {
        DirSample {
            hook: Counts {
                packets: hook.0,
                bytes: hook.1,
            },
            hook_wire: Counts {
                packets: hook.0,
                bytes: hook.1,
            },
            iface: Counts {
                packets: iface.0,
                bytes: iface.1,
            },
            iface_dropped_packets: dropped,
        }
    }

    #[test]
    fn bypass_is_iface_minus_hook_over_the_span() {
        let a = dir((10, 1_000), (12, 1_500), 0);
        let b = dir((110, 11_000), (212, 31_500), 0);
        let c = compare(Dir::Tx, &a, &b);
        assert_eq!(
            c.hook,
            Counts {
                packets: 100,
                bytes: 10_000
            }
        );
        assert_eq!(
            c.iface,
            Counts {
                packets: 200,
                bytes: 30_000
            }
        );
        assert_eq!(
            c.bypass,
            Counts {
                packets: 100,
                bytes: 20_000
            }
        );
        assert_eq!(c.hook_only, Counts::default());
        let pct = c.bypass_pct.expect("iface carried bytes");
        assert!((pct - 66.666).abs() < 0.01, "{pct}");
    }

    #[test]
    fn drops_are_hook_only_never_negative_bypass() {
        let a = dir((0, 0), (0, 0), 0);
        let b = dir((100, 10_000), (90, 9_000), 0);
        let c = compare(Dir::Tx, &a, &b);
        assert_eq!(c.bypass, Counts::default());
        assert_eq!(
            c.hook_only,
            Counts {
                packets: 10,
                bytes: 1_000
            }
        );
        assert_eq!(c.bypass_pct, Some(0.0));
    }

    #[test]
    fn tx_dropped_packets_count_as_seen_by_the_interface() {
        // 100 through the hook, 90 sent, 10 dropped by the driver: nothing
        // is unexplained on packets; bytes cannot tell.
        let b = dir((100, 10_000), (90, 9_000), 10);
        let c = compare(Dir::Tx, &DirSample::default(), &b);
        assert_eq!(c.hook_only.packets, 0);
        assert_eq!(c.bypass.packets, 0);
        assert_eq!(c.iface_dropped_packets, 10);
        assert_eq!(c.hook_only.bytes, 1_000);
        // On ingress the drop is not added.
        let c = compare(Dir::Rx, &DirSample::default(), &b);
        assert_eq!(c.hook_only.packets, 10);
    }

    #[test]
    fn segmentation_after_the_hook_is_not_bypass() {
        // 10 GSO packets of 10 segments, 66 B of headers each: the
        // interface counts 100 packets and 9 * 66 B more per packet.
        let mut later = dir((10, 100_000), (100, 100_000 + 10 * 9 * 66), 0);
        later.hook_wire = Counts {
            packets: 100,
            bytes: 100_000 + 10 * 9 * 66,
        };
        let c = compare(Dir::Tx, &DirSample::default(), &later);
        assert_eq!(c.bypass, Counts::default());
        assert_eq!(c.hook_only, Counts::default());
        // Beyond the wire figures it is bypass again.
        later.iface.bytes += 5_000;
        later.iface.packets += 50;
        let c = compare(Dir::Tx, &DirSample::default(), &later);
        assert_eq!(
            c.bypass,
            Counts {
                packets: 50,
                bytes: 5_000
            }
        );
    }

    #[test]
    fn zero_traffic_has_no_percentage() {
        let a = dir((5, 500), (5, 500), 0);
        let c = compare(Dir::Rx, &a, &a);
        assert_eq!(c.bypass_pct, None);
        assert_eq!(percent(0, 0), None);
        assert_eq!(percent(1, 4), Some(25.0));
    }

    #[test]
    fn counters_going_backwards_give_zero_not_huge() {
        let a = dir((100, 10_000), (u64::MAX - 1, u64::MAX), 7);
        let b = dir((50, 5_000), (3, 300), 0);
        let c = compare(Dir::Tx, &a, &b);
        assert_eq!(c.hook, Counts::default());
        assert_eq!(c.iface, Counts::default());
        assert_eq!(c.bypass, Counts::default());
        // Large but valid u64 deltas do not overflow.
        let z = DirSample::default();
        let big = dir((0, 0), (u64::MAX, u64::MAX), u64::MAX);
        let c = compare(Dir::Tx, &z, &big);
        assert_eq!(c.bypass.packets, u64::MAX);
        assert_eq!(c.bypass_pct, Some(100.0));
    }

    #[test]
    fn summary_has_every_documented_field_and_is_one_line() {
        let start = Sample::default();
        let end = Sample {
            tx: dir((10, 1_000), (2_010, 201_000), 0),
            rx: dir((0, 0), (0, 0), 0),
        };
        let total = Both::between(&start, &end);
        let v = summary_json("veth0", 2.0, "tcx", &total, &FlowsStatus::Listed(3));
        let line = v.to_string();
        assert!(!line.contains('\n'));
        let m = v.as_object().expect("object");
        assert_eq!(m["kind"], "summary");
        assert_eq!(m["iface"], "veth0");
        assert_eq!(m["offloaded_flows"], 3);
        assert_eq!(m["tx_bypass_bytes"], 200_000);
        assert_eq!(m["tx_bypass_packets"], 2_000);
        assert_eq!(m["tx_hook_bytes"], 1_000);
        assert_eq!(m["tx_iface_bytes"], 201_000);
        assert!((m["tx_bypass_pct"].as_f64().expect("number") - 99.502).abs() < 0.001);
        assert!(m["rx_bypass_pct"].is_null());
        for d in ["tx", "rx"] {
            for k in [
                "hook_bytes",
                "hook_packets",
                "hook_wire_bytes",
                "hook_wire_packets",
                "iface_bytes",
                "iface_packets",
                "bypass_bytes",
                "bypass_packets",
                "bypass_pct",
                "hook_only_bytes",
                "hook_only_packets",
                "iface_dropped_packets",
            ] {
                assert!(m.contains_key(&format!("{d}_{k}")), "{d}_{k}");
            }
        }
        let v = summary_json(
            "veth0",
            2.0,
            "tcx",
            &total,
            &FlowsStatus::Unavailable("no conntrack".into()),
        );
        assert!(v["offloaded_flows"].is_null());
        assert_eq!(v["conntrack"], "not available: no conntrack");
    }

    #[test]
    fn interval_record_carries_both_spans() {
        let a = Sample::default();
        let b = Sample {
            tx: dir((1, 100), (2, 200), 0),
            rx: dir((3, 300), (3, 300), 0),
        };
        let both = Both::between(&a, &b);
        let v = interval_json("e", 1.0, 1.0, &both, &both);
        assert_eq!(v["kind"], "interval");
        assert_eq!(v["tx_bypass_bytes"], 100);
        assert_eq!(v["cumulative"]["rx_bypass_bytes"], 0);
        assert!(both.text().contains("bypass 100 B/1 p (50.00%)"));
    }
}
