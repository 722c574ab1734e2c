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

use tracing::{info, warn};

use super::{
    LabError,
    exec::Daemon,
    readings::{QdiscStats, parse_counters},
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
    /// CAKE at `rate` with more of tc-cake(8)'s options (tins such as
    /// `diffserv4`, `overhead 54 mpu 64 atm`, a framing keyword),
    /// besteffort unless they say otherwise ([`State::cake_tins`]).
    CakeWith {
        /// Its bandwidth.
        rate: Rate,
        /// Appended to `cake bandwidth R besteffort`.
        options: Vec<String>,
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
    /// The split that one CAKE per TX queue makes: `mq` at `wan0`'s root,
    /// and under it on each of `queues` queues a CAKE at `rate / queues`
    /// with `tins` (otherwise as [`State::Cake`]).
    CakeSplit {
        /// The rate of all queues together.
        rate: Rate,
        /// TX queues of `wan0`.
        queues: u32,
        /// CAKE's keyword for the tins (`besteffort`, `diffserv4`, ...).
        tins: &'static str,
    },
    /// Upstream cake_mq (Linux ≥ 7.0) at `wan0`'s root: one CAKE per TX
    /// queue sharing `rate` among the active queues ([`super::cake_mq`]).
    CakeMq {
        /// The shared rate.
        rate: Rate,
        /// CAKE's keyword for the tins (`besteffort`, `diffserv4`, ...).
        tins: &'static str,
    },
    /// Download shaping as sqm-scripts does it: `wan0`'s ingress redirected
    /// to an IFB (`ifb4wan0`) with CAKE at `rate` in `ingress` mode,
    /// besteffort unless `options` (more of tc-cake(8)'s: tins, framing)
    /// say otherwise.
    CakeIngress {
        /// Its bandwidth.
        rate: Rate,
        /// Appended to `cake bandwidth R besteffort ingress`.
        options: Vec<String>,
    },
    /// `wan0`'s ingress redirected to the IFB of [`State::CakeIngress`]
    /// with a plain FIFO at its root: the path every download shaper on an
    /// IFB pays, with nothing shaped. The benchmark's measure of that
    /// path's own cost.
    IfbAlone,
    /// A plain token-bucket policer on `wan0`'s ingress at `rate` (burst:
    /// [`POLICER_BURST`] at the rate, at least 64 KiB so a GSO packet fits):
    /// the baseline, which handles varying RTTs badly: it drops whatever
    /// exceeds a fixed bucket, and how much TCP loses to that depends on
    /// how the bucket compares with each flow's window.
    Policer {
        /// The policed rate.
        rate: Rate,
    },
    /// `shaper run --iface wan0 --ingress-rate R` (download only, in the
    /// default ingress mode unless `extra_args` name one) with `extra_args`
    /// appended.
    ShaperIngress {
        /// Path of the `shaper` binary.
        bin: PathBuf,
        /// `--ingress-rate`.
        rate: Rate,
        /// Appended to `shaper run`.
        extra_args: Vec<String>,
    },
    /// Several states at once (e.g. CAKE on egress and on ingress), applied
    /// in order and torn down in reverse.
    Stack(Vec<State>),
}

/// The IFB device that holds the download queue of [`State::CakeIngress`]
/// (sqm-scripts' name for it).
pub const INGRESS_IFB: &str = "ifb4wan0";

/// The plain policer's burst, in time at its rate.
pub const POLICER_BURST: Duration = Duration::from_millis(10);

impl State {
    /// CAKE at `rate` with the tins CAKE names `diffserv` (`diffserv3`,
    /// `diffserv4`, `diffserv8`), as a [`State::CakeWith`].
    pub fn cake_tins(rate: Rate, diffserv: &str) -> State {
        State::CakeWith {
            rate,
            options: vec![diffserv.to_owned()],
        }
    }

    /// CAKE on an IFB at `rate`, besteffort, nothing else
    /// ([`State::CakeIngress`]).
    pub fn cake_ingress(rate: Rate) -> State {
        State::CakeIngress {
            rate,
            options: Vec::new(),
        }
    }

    /// Whether a shaper state shapes the download with the pacer on an IFB:
    /// it shapes the download (`ShaperIngress`, or `--ingress-rate` among a
    /// `Shaper`'s arguments) in the default mode or with `--ingress-mode
    /// ifb`.
    pub fn shapes_download_on_ifb(&self) -> bool {
        let (shapes_download, args) = match self {
            State::ShaperIngress { extra_args, .. } => (true, extra_args),
            State::Shaper { extra_args, .. } => {
                (extra_args.iter().any(|a| a == "--ingress-rate"), extra_args)
            }
            _ => return false,
        };
        let mode = args
            .iter()
            .position(|a| a == "--ingress-mode")
            .and_then(|i| args.get(i + 1));
        shapes_download && mode.is_none_or(|m| m == "ifb")
    }

    /// A short description for logs, e.g. `cake 50Mbit`.
    pub fn name(&self) -> String {
        match self {
            State::None => "none".to_owned(),
            State::Cake { rate } => format!("cake {rate}"),
            State::CakeWith { rate, options } => format!("cake {rate} {}", options.join(" ")),
            State::FqCodel { rate } => format!("fq_codel {rate}"),
            State::Shaper {
                rate, extra_args, ..
            } if extra_args.is_empty() => format!("shaper {rate}"),
            State::Shaper {
                rate, extra_args, ..
            } => format!("shaper {rate} {}", extra_args.join(" ")),
            State::CakeSplit { rate, queues, tins } => {
                format!(
                    "cake-split {rate} over {queues} queues{}",
                    tins_suffix(tins)
                )
            }
            State::CakeMq { rate, tins } => format!("cake_mq {rate} {tins}"),
            State::CakeIngress { rate, options } if options.is_empty() => {
                format!("cake-ingress {rate}")
            }
            State::CakeIngress { rate, options } => {
                format!("cake-ingress {rate} {}", options.join(" "))
            }
            State::IfbAlone => "ifb-alone".to_owned(),
            State::Policer { rate } => format!("policer {rate}"),
            State::ShaperIngress {
                rate, extra_args, ..
            } => format!("shaper-ingress {rate} {}", extra_args.join(" "))
                .trim_end()
                .to_owned(),
            State::Stack(parts) => parts
                .iter()
                .map(State::name)
                .collect::<Vec<_>>()
                .join(" + "),
        }
    }

    /// A `shaper run` process is part of this state.
    pub fn runs_shaper(&self) -> bool {
        match self {
            State::Shaper { .. } | State::ShaperIngress { .. } => true,
            State::Stack(parts) => parts.iter().any(State::runs_shaper),
            _ => false,
        }
    }

    /// The configured rate, if any.
    pub fn rate(&self) -> Option<Rate> {
        match self {
            State::None | State::IfbAlone => None,
            State::Cake { rate }
            | State::CakeWith { rate, .. }
            | State::FqCodel { rate }
            | State::Shaper { rate, .. }
            | State::CakeIngress { rate, .. }
            | State::CakeSplit { rate, .. }
            | State::CakeMq { rate, .. }
            | State::Policer { rate }
            | State::ShaperIngress { rate, .. } => Some(*rate),
            State::Stack(parts) => parts.iter().find_map(State::rate),
        }
    }

    /// Installs the state on `tb`'s WAN egress; returns once it is in effect.
    pub fn apply<'a>(&self, tb: &'a Testbed) -> Result<AppliedState<'a>, LabError> {
        let dev = tb.wan_dev();
        let mut shaper = None;
        match self {
            State::None => {}
            State::Cake { rate } => cake_root(tb, *rate, &["besteffort"])?,
            State::CakeWith { rate, options } => {
                let mut args = vec!["besteffort"];
                args.extend(options.iter().map(String::as_str));
                cake_root(tb, *rate, &args)?;
            }
            State::CakeSplit { rate, queues, tins } => {
                let router = tb.ns(Host::Router);
                let n = (*queues).max(1);
                let each = Rate::from_bits_per_s(rate.bits_per_s() / u64::from(n)).ok_or(
                    LabError::Unsupported {
                        operation: "a CAKE per queue at this rate",
                        state: self.name(),
                    },
                )?;
                router.tc(&["qdisc", "replace", "dev", dev, "root", "handle", "1:", "mq"])?;
                for q in 1..=n {
                    router.tc(&[
                        "qdisc",
                        "replace",
                        "dev",
                        dev,
                        "parent",
                        &format!("1:{q:x}"),
                        "cake",
                        "bandwidth",
                        &tc_rate(each),
                        tins,
                    ])?;
                }
            }
            State::CakeMq { rate, tins } => super::cake_mq::install(tb, *rate, tins)?,
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
                let args = ["--rate".to_owned(), tc_rate(*rate)];
                shaper = Some(spawn_shaper(tb, bin, &args, extra_args, "classifier:")?);
            }
            State::ShaperIngress {
                bin,
                rate,
                extra_args,
            } => {
                let args = ["--ingress-rate".to_owned(), tc_rate(*rate)];
                shaper = Some(spawn_shaper(tb, bin, &args, extra_args, "ingress:")?);
            }
            State::CakeIngress { rate, options } => {
                let rate = tc_rate(*rate);
                let mut root = vec!["cake", "bandwidth", &rate, "besteffort", "ingress"];
                root.extend(options.iter().map(String::as_str));
                ingress_to_ifb(tb, &root)?;
            }
            State::IfbAlone => ingress_to_ifb(tb, &["pfifo"])?,
            State::Policer { rate } => {
                let router = tb.ns(Host::Router);
                let burst = policer_burst_bytes(*rate).to_string();
                let rate = tc_rate(*rate);
                router.all_ingress_to(
                    dev,
                    &[
                        "police",
                        "rate",
                        &rate,
                        "burst",
                        &burst,
                        "mtu",
                        "65536",
                        "conform-exceed",
                        "drop",
                    ],
                )?;
            }
            State::Stack(states) => {
                let mut applied = Vec::new();
                for st in states {
                    applied.push(st.apply(tb)?);
                }
                info!(state = %self.name(), "applied");
                return Ok(AppliedState {
                    tb,
                    state: self.clone(),
                    shaper: None,
                    parts: applied,
                    stopped: false,
                });
            }
        }
        info!(state = %self.name(), "applied");
        Ok(AppliedState {
            tb,
            state: self.clone(),
            shaper,
            parts: Vec::new(),
            stopped: false,
        })
    }
}

/// Starts `shaper run --iface wan0 <args> <extra>` in the router and waits
/// until it prints its ready line and then `shaper status` prints `ready`
/// (the hook it attaches is listed) and no hook is "not attached".
fn spawn_shaper(
    tb: &Testbed,
    bin: &std::path::Path,
    args: &[String],
    extra: &[String],
    ready: &str,
) -> Result<Daemon, LabError> {
    let dev = tb.wan_dev();
    let mut cmd = tb.command(Host::Router, &bin.display().to_string());
    cmd.args(["run", "--iface", dev]).args(args).args(extra);
    let mut d = Daemon::spawn(&mut cmd, "shaper")?;
    let status_cmd = |d: &Daemon| -> Result<bool, LabError> {
        if !d.output().contains(crate::status::READY_PREFIX) {
            return Ok(false);
        }
        // Not attached yet may be an error exit; only the text counts.
        let out = tb
            .command(Host::Router, &bin.display().to_string())
            .args(["status", "--iface", dev])
            .output()
            .map_err(|source| LabError::Spawn {
                command: format!("{} status", d.command()),
                source,
            })?;
        // The record (and so the line) exists before the hook is attached.
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text.contains(ready) && !text.contains("not attached"))
    };
    d.wait_until("attach", ATTACH_LIMIT, status_cmd)?;
    Ok(d)
}

/// The plain policer's burst in bytes: [`POLICER_BURST`] at `rate`, at
/// least 64 KiB (a GSO packet larger than the burst would never conform).
pub fn policer_burst_bytes(rate: Rate) -> u64 {
    let at_rate =
        u64::try_from(u128::from(rate.bytes_per_s()) * POLICER_BURST.as_nanos() / 1_000_000_000)
            .unwrap_or(u64::MAX);
    at_rate.max(64 * 1024)
}

/// One CAKE at `rate` as the WAN device's root, with `options` after the
/// bandwidth.
fn cake_root(tb: &Testbed, rate: Rate, options: &[&str]) -> Result<(), LabError> {
    let rate = tc_rate(rate);
    let mut args = vec![
        "qdisc",
        "replace",
        "dev",
        tb.wan_dev(),
        "root",
        "cake",
        "bandwidth",
        &rate,
    ];
    args.extend(options);
    tb.ns(Host::Router).tc(&args)?;
    Ok(())
}

/// Redirects `tb`'s WAN ingress to [`INGRESS_IFB`], created with `root`
/// (a qdisc and its parameters, as tc(8) takes them) at its root.
fn ingress_to_ifb(tb: &Testbed, root: &[&str]) -> Result<(), LabError> {
    let router = tb.ns(Host::Router);
    router.ip(&["link", "add", "name", INGRESS_IFB, "type", "ifb"])?;
    router.ip(&["link", "set", "dev", INGRESS_IFB, "up"])?;
    let mut args = vec!["qdisc", "replace", "dev", INGRESS_IFB, "root"];
    args.extend_from_slice(root);
    router.tc(&args)?;
    router.all_ingress_to(
        tb.wan_dev(),
        &["mirred", "egress", "redirect", "dev", INGRESS_IFB],
    )
}

/// CAKE's tins as a state's name shows them: nothing for besteffort.
fn tins_suffix(tins: &str) -> String {
    if tins == "besteffort" {
        String::new()
    } else {
        format!(" {tins}")
    }
}

/// A rate as tc and shaper both read it, exactly: `<n>bit`.
pub(crate) fn tc_rate(rate: Rate) -> String {
    format!("{}bit", rate.bits_per_s())
}

/// A state in effect on a testbed; torn down by [`AppliedState::stop`] or on
/// drop.
pub struct AppliedState<'a> {
    tb: &'a Testbed,
    state: State,
    shaper: Option<Daemon>,
    /// The parts of a [`State::Stack`], in the order applied.
    parts: Vec<AppliedState<'a>>,
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
            State::CakeIngress { rate, .. } => {
                self.tb.ns(Host::Router).tc(&[
                    "qdisc",
                    "change",
                    "dev",
                    INGRESS_IFB,
                    "root",
                    "cake",
                    "bandwidth",
                    &tc_rate(new),
                ])?;
                *rate = new;
            }
            State::Policer { .. }
            | State::IfbAlone
            | State::ShaperIngress { .. }
            | State::CakeSplit { .. }
            | State::CakeMq { .. }
            | State::CakeWith { .. }
            | State::Stack(_) => {
                return Err(LabError::Unsupported {
                    operation: "set_rate",
                    state: self.state.name(),
                });
            }
        }
        info!(state = %self.state.name(), "rate changed");
        Ok(())
    }

    /// The shaper's counters by name (`paced`, `ce_marked`, `aqm_drop`, ...),
    /// from `shaper status --iface wan0 --json`: one JSON object whose
    /// `counters` member maps names to numbers. Where the download is
    /// shaped on an IFB, the IFB's pacer's counters follow as `ifb.<name>`
    /// (`ifb.codel_drop`, `ifb.fair.multiplier_q16`, ...).
    pub fn counters(&self) -> Result<BTreeMap<String, u64>, LabError> {
        if let Some(part) = self.parts.iter().find(|p| p.shaper.is_some()) {
            return part.counters();
        }
        let (State::Shaper { bin, .. } | State::ShaperIngress { bin, .. }) = &self.state else {
            return Err(LabError::Unsupported {
                operation: "shaper counters",
                state: self.state.name(),
            });
        };
        let bin = bin.display().to_string();
        let wan = self.tb.wan_dev();
        let read = |dev: &str| {
            let out = self
                .tb
                .run(Host::Router, &bin, &["status", "--iface", dev, "--json"])?;
            parse_counters(&out).map_err(|detail| LabError::Parse {
                command: format!("{bin} status --iface {dev} --json"),
                detail,
            })
        };
        let mut counters = read(wan)?;
        if self.state.shapes_download_on_ifb() {
            let ifb = crate::ifb::name_for(wan);
            counters.extend(
                read(&ifb)?
                    .into_iter()
                    .map(|(k, v)| (format!("ifb.{k}"), v)),
            );
        }
        Ok(counters)
    }

    /// The pid of `shaper run` (shaper states only).
    pub fn shaper_pid(&self) -> Option<u32> {
        self.shaper
            .as_ref()
            .and_then(|d| d.pid())
            .or_else(|| self.parts.iter().find_map(AppliedState::shaper_pid))
    }

    /// The file `shaper run`'s output goes to (shaper state only).
    pub fn shaper_log(&self) -> Option<PathBuf> {
        self.shaper
            .as_ref()
            .map(|d| d.log_path().to_path_buf())
            .or_else(|| self.parts.iter().find_map(AppliedState::shaper_log))
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
        let dev = self.tb.wan_dev();
        let router = self.tb.ns(Host::Router);
        match &self.state {
            State::None => Ok(()),
            State::Cake { .. }
            | State::CakeWith { .. }
            | State::FqCodel { .. }
            | State::CakeSplit { .. }
            | State::CakeMq { .. } => router.tc(&["qdisc", "del", "dev", dev, "root"]).map(drop),
            State::Policer { .. } => router
                .tc(&["qdisc", "del", "dev", dev, "handle", "ffff:", "ingress"])
                .map(drop),
            State::CakeIngress { .. } | State::IfbAlone => {
                let q = router.tc(&["qdisc", "del", "dev", dev, "handle", "ffff:", "ingress"]);
                let l = router.ip(&["link", "del", "dev", INGRESS_IFB]);
                q.and(l).map(drop)
            }
            State::Stack(_) => {
                // Reverse order; every part is tried, the first error kept.
                let mut first = Ok(());
                while let Some(mut part) = self.parts.pop() {
                    let r = part.teardown();
                    if first.is_ok() {
                        first = r;
                    }
                }
                first
            }
            State::Shaper { .. } | State::ShaperIngress { .. } => {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_download_shaped_in_ifb_mode_has_ifb_counters() {
        let rate: Rate = "20mbit".parse().expect("rate");
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let ingress = |a: &[&str]| State::ShaperIngress {
            bin: PathBuf::from("shaper"),
            rate,
            extra_args: args(a),
        };
        let both = |a: &[&str]| State::Shaper {
            bin: PathBuf::from("shaper"),
            rate,
            extra_args: args(a),
        };
        assert!(ingress(&[]).shapes_download_on_ifb());
        assert!(ingress(&["--ingress-mode", "ifb"]).shapes_download_on_ifb());
        assert!(!ingress(&["--ingress-mode", "police"]).shapes_download_on_ifb());
        assert!(both(&["--ingress-rate", "20mbit"]).shapes_download_on_ifb());
        assert!(
            !both(&["--ingress-rate", "20mbit", "--ingress-mode", "police"])
                .shapes_download_on_ifb()
        );
        assert!(!both(&[]).shapes_download_on_ifb());
        assert!(!State::cake_ingress(rate).shapes_download_on_ifb());
    }

    #[test]
    fn policer_burst_is_ten_ms_but_fits_a_gso_packet() {
        let r: Rate = "100mbit".parse().expect("valid");
        assert_eq!(policer_burst_bytes(r), 125_000);
        let r: Rate = "20mbit".parse().expect("valid");
        assert_eq!(policer_burst_bytes(r), 65_536);
    }

    #[test]
    fn a_stack_is_named_by_its_parts() {
        let r: Rate = "20mbit".parse().expect("valid");
        let s = State::Stack(vec![State::Cake { rate: r }, State::cake_ingress(r)]);
        assert_eq!(s.name(), "cake 20Mbit + cake-ingress 20Mbit");
        assert_eq!(s.rate(), Some(r));
    }

    #[test]
    fn rates_reach_tc_exactly() {
        let r: Rate = "12.5mbit".parse().expect("valid");
        assert_eq!(tc_rate(r), "12500000bit");
    }
}
