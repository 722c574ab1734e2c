//! `shaper status`: what is attached where, at what rate, with the counters
//! and the kernel's run figures of the programs (`bpf::stats`). Reads the
//! state records and the pinned maps; needs no cooperation from the
//! `shaper run` process, which may be gone.

use std::fmt::Write as _;

use aya::maps::{Array, PerCpuArray};
use shaper_common::{
    config::PacerConfig,
    counters::Counter,
    fair::{FairState, MULT_ONE},
    hosts::Isolation,
    tins::Diffserv,
};

use crate::{
    bpf::stats::{self, ProgramRuns},
    counters::CounterSnapshot,
    hook::{AttachError, pin_err},
    link::link_by_name,
    pins,
    rate::Rate,
    state::{AttachMode, Record, Roots, recorded_ifaces},
    tc,
};

/// How the line `shaper run` prints once every hook it was asked for is
/// attached begins (on stdout, or stderr with `--json`). Whoever starts a
/// run (the lab, the tests) waits for it before asking `shaper status`,
/// instead of starting a status process per poll while the programs load.
pub const READY_PREFIX: &str = "shaper: shaping ";

/// The state of one shaped interface.
#[derive(Debug)]
pub struct IfaceStatus {
    /// The record `shaper run` wrote.
    pub record: Record,
    /// The `shaper run` process still exists.
    pub pid_alive: bool,
    /// The interface still exists with the recorded index.
    pub present: bool,
    /// The root qdisc now, e.g. `fq 5348:`.
    pub root_qdisc: Option<String>,
    /// The pacer's configuration, if the pins are visible here.
    pub config: Option<PacerConfig>,
    /// Counters summed over CPUs, if the pins are visible here.
    pub counters: Option<CounterSnapshot>,
    /// The fair pacer's shared state, if the pins are visible here.
    pub fair: Option<FairState>,
    /// Each tin, when the pacer runs more than one and the pins are
    /// visible here.
    pub tins: Option<Vec<crate::tin_status::TinStatus>>,
    /// The ingress policer's counters, when ingress is shaped and its pins
    /// are visible here.
    pub ingress_counters: Option<CounterSnapshot>,
    /// The ingress program's configuration, likewise.
    pub ingress_config: Option<PacerConfig>,
    /// The egress object's programs with the kernel's run figures, if the
    /// pins are visible here; the reason when they could not be read.
    pub programs: Result<Option<Vec<ProgramRuns>>, String>,
    /// The same for the ingress policer's object.
    pub ingress_programs: Result<Option<Vec<ProgramRuns>>, String>,
}

impl IfaceStatus {
    /// Egress is shaped (an ingress-only record has no egress rate).
    pub fn egress(&self) -> bool {
        self.record.rate_bits_per_s != 0 || self.record.attach.is_some()
    }
}

/// Collects the status of `iface`, or of every recorded interface in this
/// network namespace.
pub fn collect(
    roots: &Roots,
    netns: Option<u64>,
    iface: Option<&str>,
) -> Result<Vec<IfaceStatus>, AttachError> {
    let names = match iface {
        Some(i) => vec![i.to_owned()],
        None => recorded_ifaces(roots, netns)?,
    };
    let mut out = Vec::new();
    for name in names {
        let paths = roots.paths(&name, netns);
        let Some(record) = Record::load(&paths.record)? else {
            continue;
        };
        let present = link_by_name(&name).is_ok_and(|l| l.ifindex == record.ifindex);
        let root_qdisc = if present {
            tc::root_qdisc(record.ifindex)
                .ok()
                .flatten()
                .map(|q| q.to_string())
        } else {
            None
        };
        let config = read_config(&paths.pin_dir)?;
        let counters = read_counters(&paths.pin_dir.join(pins::COUNTERS))?;
        let fair = pins::open(&paths.pin_dir.join(pins::FAIR))?
            .and_then(|m| Array::<_, FairState>::try_from(m).ok())
            .and_then(|a| a.get(&0, 0).ok());
        let tins = match &config {
            Some(c) => crate::tin_status::read(&paths.pin_dir, c)?,
            None => None,
        };
        let (ingress_counters, ingress_config) = match record.ingress {
            Some(_) => (
                read_counters(&pins::ingress_dir(&paths).join(pins::COUNTERS))?,
                read_config(&pins::ingress_dir(&paths))?,
            ),
            None => (None, None),
        };
        // Read after the counters, so a program's runs are never fewer than
        // the packets its counters show.
        let runs = |pin: &std::path::Path| {
            stats::programs_using(pin).map_err(|e| format!("{:#}", anyhow::Error::from(e)))
        };
        let programs = runs(&paths.pin_dir.join(pins::COUNTERS));
        let ingress_programs = match record.ingress {
            Some(_) => runs(&pins::ingress_dir(&paths).join(pins::COUNTERS)),
            None => Ok(None),
        };
        out.push(IfaceStatus {
            programs,
            ingress_programs,
            ingress_counters,
            ingress_config,
            fair,
            tins,
            pid_alive: crate::state::pid_alive(record.pid),
            present,
            root_qdisc,
            config,
            counters,
            record,
        });
    }
    Ok(out)
}

/// The counters pinned at `path`; `None` when the pin is not visible here.
fn read_counters(path: &std::path::Path) -> Result<Option<CounterSnapshot>, AttachError> {
    let Some(map) = pins::open(path)? else {
        return Ok(None);
    };
    let array = PerCpuArray::<_, u64>::try_from(map).map_err(|e| pin_err("use", path, e))?;
    Ok(Some(CounterSnapshot::read(&array)?))
}

/// The configuration pinned in `dir`, if visible here.
fn read_config(dir: &std::path::Path) -> Result<Option<PacerConfig>, AttachError> {
    Ok(pins::open(&dir.join(pins::CONFIG))?
        .and_then(|m| Array::<_, PacerConfig>::try_from(m).ok())
        .and_then(|a| a.get(&0, 0).ok()))
}

/// One JSON object for `shaper status --json`: the record's essentials, the
/// pacer's configuration and every counter by name.
pub fn to_json(st: &IfaceStatus) -> String {
    let r = &st.record;
    let mut v = serde_json::json!({
        "iface": r.iface,
        "ifindex": r.ifindex,
        "pid": r.pid,
        "running": st.pid_alive,
        "present": st.present,
        "rate_bits_per_s": r.rate_bits_per_s,
        "root_qdisc": st.root_qdisc,
        "classifier": attach_name(r.attach),
    });
    if let Some(i) = &r.ingress {
        v["ingress"] = serde_json::json!({
            "mode": if i.ifb.is_some() { "ifb" } else { "police" },
            "ifb": i.ifb.as_ref().map(|f| f.name.clone()),
            "rate_bits_per_s": i.rate_bits_per_s,
            "classifier": attach_name(i.attach),
        });
        if let Some(counters) = &st.ingress_counters {
            v["ingress"]["counters"] = counters_json(counters);
        }
        if let (None, Some(c)) = (&i.ifb, &st.ingress_config) {
            v["ingress"]["isolation"] = c.isolation().keyword().into();
        }
        programs_json(&mut v["ingress"], &st.ingress_programs);
    }
    if let Some(c) = &st.config {
        v["pacer"] = serde_json::json!({
            "kind": if c.fair() { "fair" } else { "aggregate" },
            "rate_bytes_per_s": c.rate_bytes_per_s,
            "horizon_ns": c.horizon_ns,
            "target_ns": c.target_ns,
            "interval_ns": c.interval_ns,
            "flows": (u64::from(c.flow_sets_mask) + 1) * shaper_common::flow::WAYS as u64,
            "ecn": c.flags & shaper_common::config::FLAG_ECN != 0,
            "diffserv": Diffserv::from_index(c.diffserv).name(),
            "wash": c.flags & shaper_common::config::FLAG_WASH != 0,
            "isolation": c.isolation().keyword(),
            "nat_lans": st.record.lans.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
            "framing": {
                "overhead_bytes": c.framing.overhead_bytes,
                "mpu_bytes": c.framing.mpu_bytes,
                "from_network_header": c.framing.from_l3 != 0,
                "cells": c.framing.cells_name(),
            },
            "generation": c.generation,
        });
    }
    if let (Some(f), Some(c)) = (&st.fair, &st.config)
        && c.fair()
    {
        v["fair"] = serde_json::json!({
            "multiplier_q16": f.mult_q16,
            "share_bytes_per_s": f.share_bytes_per_s(c.rate_bytes_per_s),
            "active_flows": f.active_flows(),
            "backlogged_flows": f.backlogged_flows(),
            "committed_flows": f.committed_flows(),
            "epoch_updates": f.updates,
        });
    }
    if let Some(tins) = &st.tins {
        v["tins"] = crate::tin_status::json(tins);
    }
    if let Some(counters) = &st.counters {
        v["counters"] = counters_json(counters);
    }
    programs_json(&mut v, &st.programs);
    v.to_string()
}

/// `programs` (name, id, `run_cnt`, `run_time_ns`) in `v`, or
/// `programs_error`; nothing when the pins are not visible.
fn programs_json(v: &mut serde_json::Value, programs: &Result<Option<Vec<ProgramRuns>>, String>) {
    match programs {
        Ok(Some(p)) => v["programs"] = serde_json::json!(p),
        Ok(None) => {}
        Err(e) => v["programs_error"] = serde_json::json!(e),
    }
}

/// One line on the programs' kernel-measured run time.
fn render_programs(
    s: &mut String,
    indent: &str,
    programs: &Result<Option<Vec<ProgramRuns>>, String>,
) {
    let list = match programs {
        Ok(Some(p)) => p,
        Ok(None) => return,
        Err(e) => {
            let _ = writeln!(s, "{indent}programs:   not readable: {e}");
            return;
        }
    };
    let parts: Vec<String> = list
        .iter()
        .map(|p| match p.ns_per_run() {
            Some(ns) => format!("{} {ns:.0} ns/run over {} runs", p.name, p.run_cnt),
            None => format!("{} (no runs counted)", p.name),
        })
        .collect();
    let _ = writeln!(s, "{indent}programs:   {}", parts.join(", "));
    if list.iter().all(|p| p.run_cnt == 0) {
        let _ = writeln!(
            s,
            "{indent}            the kernel times programs only with `sysctl kernel.bpf_stats_enabled=1`"
        );
    }
}

fn counters_json(counters: &CounterSnapshot) -> serde_json::Value {
    serde_json::Value::Object(
        counters
            .iter()
            .map(|(c, n)| (c.name().to_owned(), serde_json::Value::from(n)))
            .collect(),
    )
}

fn attach_name(a: Option<AttachMode>) -> &'static str {
    match a {
        Some(AttachMode::Tcx) => "tcx",
        Some(AttachMode::Netlink { .. }) => "tc clsact",
        Some(AttachMode::Mirred { .. }) => "tc clsact mirred",
        None => "none",
    }
}

fn rate_text(bits_per_s: u64) -> String {
    Rate::from_bits_per_s(bits_per_s)
        .map(|r| r.to_string())
        .unwrap_or_else(|| format!("{bits_per_s}bit"))
}

/// The ingress lines of [`render`].
fn render_ingress(s: &mut String, st: &IfaceStatus) {
    let Some(i) = &st.record.ingress else {
        return;
    };
    let hook = match i.attach {
        Some(AttachMode::Tcx) => "tcx".to_owned(),
        Some(AttachMode::Netlink { priority, handle }) => {
            format!("tc clsact ingress pref {priority} handle {handle:#x}")
        }
        Some(AttachMode::Mirred { priority, handle }) => {
            format!("tc clsact ingress matchall+mirred pref {priority} handle {handle:#x}")
        }
        None => "not attached".to_owned(),
    };
    match &i.ifb {
        None => {
            let _ = writeln!(
                s,
                "  ingress:    police at {} ({hook})",
                rate_text(i.rate_bits_per_s)
            );
        }
        Some(f) => {
            let _ = writeln!(
                s,
                "  ingress:    ifb at {} (redirect to {} by {hook}; `shaper status --iface {}` \
                 shows its pacer)",
                rate_text(i.rate_bits_per_s),
                f.name,
                f.name
            );
        }
    }
    if let (Some(AttachMode::Mirred { .. }), Some(f)) = (i.attach, &i.ifb) {
        let _ = writeln!(
            s,
            "    no program at the hook: the IFB's pacer counts the packets (`shaper status \
             --iface {}`)",
            f.name
        );
        return;
    }
    match &st.ingress_counters {
        Some(counters) => {
            let get = |c: Counter| counters[c];
            let _ = writeln!(
                s,
                "    packets {}, ce_marked {}, police_drop {} (codel {}, early {}, overload {}), \
                 police_withheld {}, police_clamped {}",
                get(Counter::Packets),
                get(Counter::CeMarked),
                get(Counter::PoliceDrop),
                get(Counter::PoliceCodelDrop),
                get(Counter::PoliceEarlyDrop),
                get(Counter::PoliceOverloadDrop),
                get(Counter::PoliceWithheld),
                get(Counter::PoliceClamped)
            );
            render_police_hosts(s, st, counters);
        }
        None => {
            let _ = writeln!(
                s,
                "    counters not visible (pins in another mount namespace or gone)"
            );
        }
    }
    render_programs(s, "    ", &st.ingress_programs);
}

/// The policer's host level, when it has one: its mode, and through NAT
/// the LAN interfaces and how often a download's LAN host was found.
fn render_police_hosts(s: &mut String, st: &IfaceStatus, counters: &CounterSnapshot) {
    let Some(c) = st
        .ingress_config
        .filter(|c| c.isolation() != Isolation::Flows)
    else {
        return;
    };
    let nat = if st.record.lans.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = st.record.lans.iter().map(|l| l.name.as_str()).collect();
        format!(
            ", LAN hosts through NAT from {} (nat_found {}, nat_missed {})",
            names.join(", "),
            counters[Counter::NatFound],
            counters[Counter::NatMissed]
        )
    };
    let _ = writeln!(s, "    isolation:  {}{nat}", c.isolation().keyword());
}

/// Human-readable report.
pub fn render(statuses: &[IfaceStatus]) -> String {
    let mut s = String::new();
    for st in statuses {
        let r = &st.record;
        let rate = rate_text(r.rate_bits_per_s);
        let mode = match r.attach {
            Some(AttachMode::Tcx) => "tcx".to_owned(),
            Some(AttachMode::Netlink { priority, handle }) => {
                format!("tc clsact egress pref {priority} handle {handle:#x}")
            }
            // Only ever an ingress hook; listed for completeness.
            Some(AttachMode::Mirred { priority, handle }) => {
                format!("tc clsact matchall+mirred pref {priority} handle {handle:#x}")
            }
            None => "not attached".to_owned(),
        };
        let egress = if st.egress() {
            format!("egress shaped at {rate}")
        } else {
            "egress not shaped".to_owned()
        };
        let _ = writeln!(s, "{} (ifindex {}): {egress}", r.iface, r.ifindex);
        let _ = writeln!(
            s,
            "  process:    pid {} ({})",
            r.pid,
            if st.pid_alive {
                "running"
            } else {
                "gone: run `shaper cleanup` to restore the interface"
            }
        );
        render_ingress(&mut s, st);
        if !st.egress() {
            continue;
        }
        let _ = writeln!(s, "  classifier: {mode}");
        let _ = writeln!(
            s,
            "  root qdisc: {}",
            match (&st.root_qdisc, st.present) {
                (_, false) => "interface is gone".to_owned(),
                (Some(q), true) => q.clone(),
                (None, true) => "unknown".to_owned(),
            }
        );
        if let Some(c) = &st.config {
            let _ = writeln!(
                s,
                "  pacer:      {} ({} bytes/s), horizon {} ms, {}",
                if c.fair() { "fair" } else { "aggregate" },
                c.rate_bytes_per_s,
                c.horizon_ns / 1_000_000,
                if c.enabled() {
                    "pacing"
                } else {
                    "counting only"
                }
            );
            let _ = writeln!(s, "  framing:    {}", framing_text(&c.framing));
            if c.fair() {
                let nat = if st.record.lans.is_empty() {
                    String::new()
                } else {
                    let names: Vec<&str> = st.record.lans.iter().map(|l| l.name.as_str()).collect();
                    format!(", LAN hosts through NAT from {}", names.join(", "))
                };
                let _ = writeln!(s, "  isolation:  {}{nat}", c.isolation().keyword());
            }
            if c.fair() {
                let _ = writeln!(
                    s,
                    "  aqm:        CoDel target {} us, interval {} ms, ECN {}; flow table {} flows",
                    c.target_ns / 1_000,
                    c.interval_ns / 1_000_000,
                    if c.flags & shaper_common::config::FLAG_ECN != 0 {
                        "marks"
                    } else {
                        "off"
                    },
                    (u64::from(c.flow_sets_mask) + 1) * shaper_common::flow::WAYS as u64
                );
                if let Some(f) = &st.fair {
                    let _ = writeln!(
                        s,
                        "  fair share: {} bytes/s per backlogged flow (m = {:.2}); {} flows active, {} backlogged, {} committed",
                        f.share_bytes_per_s(c.rate_bytes_per_s),
                        f.mult_q16 as f64 / MULT_ONE as f64,
                        f.active_flows(),
                        f.backlogged_flows(),
                        f.committed_flows()
                    );
                }
                if let Some(tins) = &st.tins {
                    crate::tin_status::render(&mut s, Diffserv::from_index(c.diffserv), tins);
                }
            }
        }
        match &st.counters {
            Some(counters) => {
                let _ = writeln!(s, "  counters:");
                for (c, v) in counters.iter() {
                    let _ = writeln!(s, "    {:<16} {v}", c.name());
                }
            }
            None => {
                let _ = writeln!(
                    s,
                    "  counters:   not visible (the pins are in another mount namespace or gone)"
                );
            }
        }
        render_programs(&mut s, "  ", &st.programs);
    }
    s
}

/// The framing as `status` shows it.
fn framing_text(f: &shaper_common::framing::Framing) -> String {
    if f.is_raw() {
        return "none: packets count as Linux sees them".to_owned();
    }
    let from = if f.from_l3 != 0 {
        "the IP packet"
    } else {
        "the frame (raw)"
    };
    format!(
        "{from} + {} bytes, at least {} bytes, cells {}",
        f.overhead_bytes,
        f.mpu_bytes,
        f.cells_name()
    )
}

#[cfg(test)]
mod tests {
    use shaper_common::framing::Framing;

    #[test]
    fn the_framing_reads_as_the_link_counts() {
        assert_eq!(
            super::framing_text(&Framing::RAW),
            "none: packets count as Linux sees them"
        );
        let f = Framing::from_keywords(["ethernet", "ether-vlan"], None, None).expect("ok");
        assert_eq!(
            super::framing_text(&f),
            "the IP packet + 42 bytes, at least 84 bytes, cells none"
        );
        let f = Framing::from_keywords(["pppoe-llcsnap"], None, None).expect("ok");
        assert!(super::framing_text(&f).ends_with("cells atm"));
    }
}
