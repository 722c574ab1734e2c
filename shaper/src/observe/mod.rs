//! `shaper observe`: how much of an interface's traffic skips its TC hooks
//! (flow offload, `PACKET_QDISC_BYPASS`, XDP), and which conntrack flows are
//! offloaded.
//!
//! Steps: validate (nothing attached on bad input) → attach two counting
//! classifiers ([`hooks`]) → sample the interface's IFLA_STATS64
//! ([`stats64`]) and the hooks' counters at start and every interval →
//! compare ([`report`]) → at the end (duration, SIGINT, SIGTERM) detach,
//! dump conntrack ([`conntrack`]) and print the summary last.
//!
//! Sampling order: the interface's counters first, then the hooks'. On
//! egress a packet passes the hook before the driver counts it, so a packet
//! in flight at the sampling instant shows as hook-only (queued), never as
//! bypass. On ingress the driver counts first; a packet in flight shows as
//! one packet of bypass or hook-only in that interval and is evened out by
//! the next one (the cumulative figures are exact once traffic stops).
//!
//! Non-goals: attributing bypass to flows (conntrack's own counters do that
//! for offloaded flows), and counting what the hardware does in a switch
//! chip without passing the CPU's interface counters at all.

pub mod conntrack;
pub mod hooks;
pub mod report;
pub mod stats64;

use std::{
    io::Write,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

use crate::{
    checks::Capabilities,
    link::link_by_name,
    state::{self, Roots},
    tc,
};
use report::{Both, Counts, DirSample, FlowsStatus, Sample};

/// Bounds of `--interval`.
pub const INTERVAL_MIN: Duration = Duration::from_millis(100);
/// See [`INTERVAL_MIN`].
pub const INTERVAL_MAX: Duration = Duration::from_secs(3600);
/// Longest `--duration` (a week).
pub const DURATION_MAX: Duration = Duration::from_secs(7 * 24 * 3600);

/// Failures of the observer.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// A flag's value is out of range (usage: exit 2).
    #[error("invalid {flag} '{value}': {expected}")]
    BadArg {
        /// The flag.
        flag: &'static str,
        /// The value as given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// The embedded object is missing.
    #[error(transparent)]
    Object(#[from] crate::bpf::ObjectError),
    /// Loading the object or a program.
    #[error("loading the observer's BPF programs failed: {detail}")]
    Load {
        /// What aya or the verifier said.
        detail: String,
    },
    /// Attaching or detaching a hook.
    #[error("{program} on '{iface}': {detail}")]
    Attach {
        /// The program.
        program: &'static str,
        /// The interface.
        iface: String,
        /// What failed.
        detail: String,
    },
    /// A traffic-control step (clsact).
    #[error("{step} on '{iface}' failed")]
    Tc {
        /// The step.
        step: &'static str,
        /// The interface.
        iface: String,
        /// The cause.
        #[source]
        source: tc::TcError,
    },
    /// Reading the interface's counters.
    #[error("reading the counters of ifindex {ifindex}: {detail}")]
    Stats {
        /// The interface.
        ifindex: u32,
        /// What failed.
        detail: String,
    },
    /// Reading conntrack.
    #[error("reading conntrack through ctnetlink: {detail}")]
    Conntrack {
        /// What failed.
        detail: String,
    },
}

/// Validated `shaper observe` settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObserveConfig {
    /// The interface.
    pub iface: String,
    /// Stop after this long; `None` runs until SIGINT/SIGTERM.
    pub duration: Option<Duration>,
    /// Time between interval records.
    pub interval: Duration,
    /// Newline-delimited JSON instead of text.
    pub json: bool,
}

impl ObserveConfig {
    /// Checks the bounds of the parsed flags.
    pub fn new(
        iface: String,
        duration: Option<Duration>,
        interval: Duration,
        json: bool,
    ) -> Result<Self, ObserveError> {
        if !(INTERVAL_MIN..=INTERVAL_MAX).contains(&interval) {
            return Err(ObserveError::BadArg {
                flag: "--interval",
                value: format!("{interval:?}"),
                expected: "between 100ms and 3600s",
            });
        }
        if let Some(d) = duration
            && (d.is_zero() || d > DURATION_MAX)
        {
            return Err(ObserveError::BadArg {
                flag: "--duration",
                value: format!("{d:?}"),
                expected: "more than 0s and at most 604800s (a week); leave it out to run \
                           until Ctrl-C",
            });
        }
        Ok(Self {
            iface,
            duration,
            interval,
            json,
        })
    }
}

/// True for the errors that are the user's to fix (exit code 2).
pub fn is_usage_error(e: &ObserveError) -> bool {
    matches!(e, ObserveError::BadArg { .. } | ObserveError::Object(_))
}

fn sample(hooks: &hooks::Hooks, ifindex: u32) -> Result<Sample, ObserveError> {
    // Interface first, then hooks: see the module header.
    let iface = stats64::read(ifindex)?;
    let [(tx_hook, tx_wire), (rx_hook, rx_wire)] = hooks.counts()?;
    Ok(Sample {
        tx: DirSample {
            hook: tx_hook,
            hook_wire: tx_wire,
            iface: Counts {
                packets: iface.tx_packets,
                bytes: iface.tx_bytes,
            },
            iface_dropped_packets: iface.tx_dropped,
        },
        rx: DirSample {
            hook: rx_hook,
            hook_wire: rx_wire,
            iface: Counts {
                packets: iface.rx_packets,
                bytes: iface.rx_bytes,
            },
            iface_dropped_packets: iface.rx_dropped,
        },
    })
}

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    // A closed stdout (`| head`) must not stop the detach that follows.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// `shaper observe`.
pub fn run(config: ObserveConfig) -> Result<()> {
    Capabilities::current()?.check()?;
    let link = link_by_name(&config.iface)?;
    crate::checks::require_tc_hooks()?;
    // Where a pacer on this interface would have pinned its flow table.
    let netns = state::current_netns()?;
    let pin_dir = Roots::default().paths(&link.name, netns).pin_dir;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async {
        let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
        let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;

        let mut hooks = hooks::attach(&link)?;
        let mode = hooks.mode.name();
        let start = Instant::now();
        let first = sample(&hooks, link.ifindex)?;
        if !config.json {
            emit(&format!(
                "observing {} (hooks by {mode}); every {:.1} s: hook vs interface bytes/packets, \
                 bypass = interface - hook",
                link.name,
                config.interval.as_secs_f64()
            ));
        }
        let mut prev = first;
        let mut prev_t = start;
        let deadline = config.duration.map(|d| start + d);
        let mut stop = false;
        while !stop {
            let mut next = prev_t + config.interval;
            if let Some(d) = deadline
                && next >= d
            {
                next = d;
                stop = true;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = sigterm.recv() => { info!(signal = "SIGTERM", "stopping"); stop = true; }
                _ = sigint.recv() => { info!(signal = "SIGINT", "stopping"); stop = true; }
            }
            let now = Instant::now();
            let cur = sample(&hooks, link.ifindex)?;
            let interval = Both::between(&prev, &cur);
            let total = Both::between(&first, &cur);
            let t_s = now.duration_since(start).as_secs_f64();
            let span_s = now.duration_since(prev_t).as_secs_f64();
            if config.json {
                emit(
                    &report::interval_json(&link.name, t_s, span_s, &interval, &total).to_string(),
                );
            } else {
                emit(&format!("t={t_s:7.1}s {}", interval.text()));
            }
            prev = cur;
            prev_t = now;
        }
        hooks.detach()?;
        drop(hooks);
        let total = Both::between(&first, &prev);
        let duration_s = prev_t.duration_since(start).as_secs_f64();

        let mut flow_lines = Vec::new();
        let flows = match conntrack::dump()? {
            conntrack::Table::Unavailable(why) => FlowsStatus::Unavailable(why),
            conntrack::Table::Entries(all) => {
                let offloaded: Vec<_> = all
                    .into_iter()
                    .filter(|e| e.offload_kind().is_some())
                    .collect();
                let table = conntrack::open_shaper_table(&pin_dir);
                for e in &offloaded {
                    let m = match &table {
                        Ok(t) => t.lookup(e),
                        Err(why) => conntrack::Match::Unknown(why.clone()),
                    };
                    flow_lines.push(if config.json {
                        conntrack::flow_json(&link.name, e, &m).to_string()
                    } else {
                        conntrack::flow_text(e, &m)
                    });
                }
                FlowsStatus::Listed(offloaded.len())
            }
        };
        if config.json {
            // Flow records, then the summary as the last line.
            flow_lines.iter().for_each(|l| emit(l));
            emit(&report::summary_json(&link.name, duration_s, mode, &total, &flows).to_string());
        } else {
            emit(&report::summary_text(&link.name, duration_s, mode, &total));
            emit(&match &flows {
                FlowsStatus::Listed(n) => format!("offloaded conntrack flows: {n}"),
                FlowsStatus::Unavailable(why) => format!("conntrack not available: {why}"),
            });
            flow_lines.iter().for_each(|l| emit(l));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_bounds() {
        let ok = ObserveConfig::new(
            "e".into(),
            Some(Duration::from_secs(5)),
            Duration::from_secs(1),
            true,
        );
        assert!(ok.is_ok());
        assert!(ObserveConfig::new("e".into(), None, Duration::from_millis(10), false).is_err());
        let e = ObserveConfig::new(
            "e".into(),
            Some(Duration::ZERO),
            Duration::from_secs(1),
            false,
        )
        .expect_err("zero duration");
        assert!(e.to_string().contains("--duration"), "{e}");
        assert!(is_usage_error(&e));
        assert!(
            ObserveConfig::new(
                "e".into(),
                Some(DURATION_MAX * 2),
                Duration::from_secs(1),
                false
            )
            .is_err()
        );
    }
}
