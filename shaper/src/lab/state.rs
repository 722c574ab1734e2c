//! The state under test on the router's WAN egress (`wan0`): nothing, CAKE,
//! or the real `shaper` binary.
//!
//! - [`State::None`] leaves the veth's default qdisc (noqueue): the WAN link
//!   runs at whatever the machine can carry.
//! - [`State::Cake`] is `tc qdisc replace dev wan0 root cake bandwidth R
//!   besteffort`: one tin, so every flow competes in the same class as with
//!   the shaper; everything else is CAKE's default (triple-isolate flow
//!   fairness, 100 ms RTT, no overhead compensation, ECN on, no ack
//!   filter). CAKE counts `skb->len` plus nothing, like the shaper does by
//!   default, so the two meet the same rate on the same traffic.
//! - [`State::FqCodel`] is an HTB root class at R with an fq_codel leaf
//!   (fq_codel's defaults: 5 ms target, 100 ms interval, ECN on).
//! - [`State::Shaper`] runs `shaper run --iface wan0 --rate R <extra args>`
//!   in the router namespace, and is ready when `shaper status --iface wan0`
//!   lists a classifier. It is stopped with SIGTERM, and must exit 0 (which
//!   means it restored the qdisc tree).
//!
//! Invariants: an [`AppliedState`] borrows its [`Testbed`], so it cannot
//! outlive the namespaces; dropping it without [`AppliedState::stop`] still
//! tears the state down (best effort, logged).
//!
//! Units: rates are [`Rate`]; they reach `tc` and `shaper` as exact `<n>bit`.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use serde_json::Value;
use tracing::{info, warn};

use super::{
    LabError,
    exec::Daemon,
    topology::{Host, Testbed},
};
use crate::rate::Rate;

/// How long `shaper run` may take to attach (BPF load under emulation is
/// slow: on 6.1 under TCG on a busy 2-core host, more than 60 s was seen).
const ATTACH_LIMIT: Duration = Duration::from_secs(150);
/// How long `shaper run` may take to restore and exit after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// What shapes the router's WAN egress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// No shaping at all.
    None,
    /// CAKE at `rate`, besteffort.
    Cake {
        /// Its bandwidth.
        rate: Rate,
    },
    /// HTB at `rate` with fq_codel as its only leaf (what sqm-scripts'
    /// `simple.qos` builds, without its priority classes).
    FqCodel {
        /// The HTB class rate.
        rate: Rate,
    },
    /// The shaper binary at `bin`, run at `rate` with `extra_args` appended.
    Shaper {
        /// Path of the `shaper` binary.
        bin: PathBuf,
        /// `--rate`.
        rate: Rate,
        /// Appended to `shaper run`, e.g. `["--pacer", "aggregate"]`.
        extra_args: Vec<String>,
    },
}

impl State {
    /// A short description for logs, e.g. `cake 50Mbit`.
    pub fn name(&self) -> String {
        match self {
            State::None => "none".to_owned(),
            State::Cake { rate } => format!("cake {rate}"),
            State::FqCodel { rate } => format!("fq_codel {rate}"),
            State::Shaper {
                rate, extra_args, ..
            } if extra_args.is_empty() => format!("shaper {rate}"),
            State::Shaper {
                rate, extra_args, ..
            } => format!("shaper {rate} {}", extra_args.join(" ")),
        }
    }

    /// The configured rate, if any.
    pub fn rate(&self) -> Option<Rate> {
        match self {
            State::None => None,
            State::Cake { rate } | State::FqCodel { rate } | State::Shaper { rate, .. } => {
                Some(*rate)
            }
        }
    }

    /// Installs the state on `tb`'s WAN egress; returns once it is in effect.
    pub fn apply<'a>(&self, tb: &'a Testbed) -> Result<AppliedState<'a>, LabError> {
        let dev = tb.wan_dev();
        let mut shaper = None;
        match self {
            State::None => {}
            State::Cake { rate } => {
                tb.ns(Host::Router).tc(&[
                    "qdisc",
                    "replace",
                    "dev",
                    dev,
                    "root",
                    "cake",
                    "bandwidth",
                    &tc_rate(*rate),
                    "besteffort",
                ])?;
            }
            State::FqCodel { rate } => {
                let router = tb.ns(Host::Router);
                let r = tc_rate(*rate);
                router.tc(&[
                    "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1",
                ])?;
                router.tc(&[
                    "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate",
                    &r, "ceil", &r,
                ])?;
                router.tc(&[
                    "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "fq_codel",
                ])?;
            }
            State::Shaper {
                bin,
                rate,
                extra_args,
            } => {
                let mut cmd = tb.command(Host::Router, &bin.display().to_string());
                cmd.args(["run", "--iface", dev, "--rate", &tc_rate(*rate)])
                    .args(extra_args);
                let mut d = Daemon::spawn(&mut cmd, "shaper")?;
                let status_cmd = |d: &Daemon| -> Result<bool, LabError> {
                    // Not attached yet may be an error exit; only the text counts.
                    let out = tb
                        .command(Host::Router, &bin.display().to_string())
                        .args(["status", "--iface", dev])
                        .output()
                        .map_err(|source| LabError::Spawn {
                            command: format!("{} status", d.command()),
                            source,
                        })?;
                    Ok(String::from_utf8_lossy(&out.stdout).contains("classifier:"))
                };
                d.wait_until("attach", ATTACH_LIMIT, status_cmd)?;
                shaper = Some(d);
            }
        }
        info!(state = %self.name(), "applied");
        Ok(AppliedState {
            tb,
            state: self.clone(),
            shaper,
            stopped: false,
        })
    }
}

/// A rate as tc and shaper both read it, exactly: `<n>bit`.
pub(crate) fn tc_rate(rate: Rate) -> String {
    format!("{}bit", rate.bits_per_s())
}

/// Statistics of the root qdisc of the WAN device, from `tc -s -j`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QdiscStats {
    /// Its kind, e.g. `cake`, `fq`, `mq`, `noqueue`.
    pub kind: String,
    /// Bytes sent.
    pub bytes: u64,
    /// Packets sent.
    pub packets: u64,
    /// Packets dropped.
    pub drops: u64,
    /// ECN CE marks, summed over tins (CAKE only).
    pub ecn_marks: Option<u64>,
}

impl QdiscStats {
    /// Parses `tc -s -j qdisc show dev X` output: the root qdisc's figures.
    pub fn parse(json: &str) -> Result<Self, LabError> {
        let err = |detail: String| LabError::Parse {
            command: "tc -s -j qdisc show".to_owned(),
            detail,
        };
        let v: Value = serde_json::from_str(json).map_err(|e| err(e.to_string()))?;
        let list = v
            .as_array()
            .ok_or_else(|| err("not a JSON array".to_owned()))?;
        let root = list
            .iter()
            .find(|q| q.get("root").and_then(Value::as_bool) == Some(true))
            .or_else(|| list.first())
            .ok_or_else(|| err("no qdisc listed".to_owned()))?;
        let num = |k: &str| root.get(k).and_then(Value::as_u64).unwrap_or(0);
        let ecn_marks = root.get("tins").and_then(Value::as_array).map(|tins| {
            tins.iter()
                .filter_map(|t| t.get("ecn_mark").and_then(Value::as_u64))
                .sum()
        });
        Ok(Self {
            kind: root
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            bytes: num("bytes"),
            packets: num("packets"),
            drops: num("drops"),
            ecn_marks,
        })
    }
}

/// A state in effect on a testbed; torn down by [`AppliedState::stop`] or on
/// drop.
pub struct AppliedState<'a> {
    tb: &'a Testbed,
    state: State,
    shaper: Option<Daemon>,
    stopped: bool,
}

impl AppliedState<'_> {
    /// What is in effect (with the current rate after [`Self::set_rate`]).
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Changes the rate live: `shaper set-rate --iface wan0 R`, or `tc qdisc
    /// change ... cake bandwidth R`. There is no rate to change with `None`.
    pub fn set_rate(&mut self, new: Rate) -> Result<(), LabError> {
        let dev = self.tb.wan_dev();
        match &mut self.state {
            State::None => {
                return Err(LabError::Unsupported {
                    operation: "set_rate",
                    state: "none".to_owned(),
                });
            }
            State::Cake { rate } => {
                self.tb.ns(Host::Router).tc(&[
                    "qdisc",
                    "change",
                    "dev",
                    dev,
                    "root",
                    "cake",
                    "bandwidth",
                    &tc_rate(new),
                ])?;
                *rate = new;
            }
            State::FqCodel { rate } => {
                let r = tc_rate(new);
                self.tb.ns(Host::Router).tc(&[
                    "class", "change", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate",
                    &r, "ceil", &r,
                ])?;
                *rate = new;
            }
            State::Shaper { bin, rate, .. } => {
                self.tb.run(
                    Host::Router,
                    &bin.display().to_string(),
                    &["set-rate", "--iface", dev, &tc_rate(new)],
                )?;
                *rate = new;
            }
        }
        info!(state = %self.state.name(), "rate changed");
        Ok(())
    }

    /// The shaper's counters by name (`paced`, `ce_marked`, `aqm_drop`, ...),
    /// from `shaper status --iface wan0 --json`: one JSON object whose
    /// `counters` member maps names to numbers.
    pub fn counters(&self) -> Result<BTreeMap<String, u64>, LabError> {
        let State::Shaper { bin, .. } = &self.state else {
            return Err(LabError::Unsupported {
                operation: "shaper counters",
                state: self.state.name(),
            });
        };
        let bin = bin.display().to_string();
        let dev = self.tb.wan_dev();
        let out = self
            .tb
            .run(Host::Router, &bin, &["status", "--iface", dev, "--json"])?;
        parse_counters(&out).map_err(|detail| LabError::Parse {
            command: format!("{bin} status --iface {dev} --json"),
            detail,
        })
    }

    /// The file `shaper run`'s output goes to (shaper state only).
    pub fn shaper_log(&self) -> Option<PathBuf> {
        self.shaper.as_ref().map(|d| d.log_path().to_path_buf())
    }

    /// The WAN device's root qdisc statistics.
    pub fn qdisc_stats(&self) -> Result<QdiscStats, LabError> {
        let out = self.tb.ns(Host::Router).tc(&[
            "-s",
            "-j",
            "qdisc",
            "show",
            "dev",
            self.tb.wan_dev(),
        ])?;
        QdiscStats::parse(&out)
    }

    /// Tears the state down. For the shaper: SIGTERM, and the exit must be 0.
    pub fn stop(mut self) -> Result<(), LabError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), LabError> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        match &self.state {
            State::None => Ok(()),
            State::Cake { .. } | State::FqCodel { .. } => {
                let dev = self.tb.wan_dev();
                let router = self.tb.ns(Host::Router);
                router.tc(&["qdisc", "del", "dev", dev, "root"]).map(drop)
            }
            State::Shaper { .. } => {
                let Some(mut d) = self.shaper.take() else {
                    return Ok(());
                };
                let (status, output) = d.stop(libc::SIGTERM, STOP_GRACE)?;
                if status.success() {
                    Ok(())
                } else {
                    Err(LabError::Exited {
                        command: d.command().to_owned(),
                        status: status.to_string(),
                        output,
                    })
                }
            }
        }
    }
}

impl Drop for AppliedState<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            warn!(state = %self.state.name(), "teardown: {e}");
        }
    }
}

/// The `counters` member of `shaper status --json` output (an object, or an
/// array whose first element is one).
fn parse_counters(json: &str) -> Result<BTreeMap<String, u64>, String> {
    let v: Value = serde_json::from_str(json.trim()).map_err(|e| e.to_string())?;
    let obj = match &v {
        Value::Array(a) => a.first().ok_or("an empty JSON array")?,
        other => other,
    };
    let counters = obj
        .get("counters")
        .and_then(Value::as_object)
        .ok_or("no \"counters\" object")?;
    let mut out = counters
        .iter()
        .map(|(k, v)| {
            v.as_u64()
                .map(|n| (k.clone(), n))
                .ok_or_else(|| format!("counter {k} is not an unsigned integer: {v}"))
        })
        .collect::<Result<BTreeMap<_, _>, _>>()?;
    // The fair pacer's state, when present, as `fair.<name>`.
    if let Some(fair) = obj.get("fair").and_then(Value::as_object) {
        for (k, v) in fair {
            if let Some(n) = v.as_u64() {
                out.insert(format!("fair.{k}"), n);
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
        assert_eq!(c.get("aqm_drop"), Some(&0));
        assert!(parse_counters(r#"{"iface":"wan0"}"#).is_err());
        assert!(parse_counters("classifier: tcx").is_err());
        assert!(parse_counters(r#"{"counters":{"x":-1}}"#).is_err());
    }

    #[test]
    fn cake_stats_sum_tins() {
        let json = r#"[{"kind":"cake","handle":"8001:","root":true,"bytes":1000,
            "packets":10,"drops":2,"max_network_size":1514,
            "tins":[{"ecn_mark":4},{"ecn_mark":1}]},
            {"kind":"fq","root":false,"bytes":1}]"#;
        let s = QdiscStats::parse(json).expect("parses");
        assert_eq!(
            s,
            QdiscStats {
                kind: "cake".to_owned(),
                bytes: 1000,
                packets: 10,
                drops: 2,
                ecn_marks: Some(5),
            }
        );
        let s = QdiscStats::parse(r#"[{"kind":"noqueue","root":true}]"#).expect("parses");
        assert_eq!(s.ecn_marks, None);
        assert!(QdiscStats::parse("[]").is_err());
    }

    #[test]
    fn rates_reach_tc_exactly() {
        let r: Rate = "12.5mbit".parse().expect("valid");
        assert_eq!(tc_rate(r), "12500000bit");
    }
}
