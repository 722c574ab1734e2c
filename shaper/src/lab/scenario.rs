//! One lab run: apply a state, start the flows (and ping) together, optionally
//! change the rate midway, collect everything, tear the state down. Several
//! runs may share one applied state ([`run_scenarios`]); each then reports
//! the counts of its own traffic.
//!
//! Order, so each figure covers the same time: state applied → iperf3
//! servers listening → CPU sampled → clients started together, ping started
//! after the omitted warm-up for the measured time → clients done → CPU
//! sampled → counters and qdisc statistics read → state stopped (a shaper
//! that does not exit 0 fails the run).
//!
//! Invariants: every process and the state are torn down even when a step
//! fails (each is owned by a value that stops it on drop).
//!
//! Non-goals: repetitions and aggregation over runs (callers loop), traffic
//! toward the clients.

use std::{
    collections::BTreeMap,
    thread::sleep,
    time::{Duration, Instant},
};

use tracing::info;

use super::{
    LabError,
    cpu::{CpuTimes, CpuUsage},
    ping::Ping,
    readings::QdiscStats,
    state::{AppliedState, State},
    stats::{self, Percentiles},
    timed::{self, TimedPlan, TimedResult},
    topology::{Host, Testbed},
    traffic::{CLIENT_GRACE, FlowSpec, IperfClient, IperfReport, IperfServer, Timing},
};
use crate::rate::Rate;

/// The first iperf3 port; flow `i` uses `BASE_PORT + i`.
const BASE_PORT: u16 = 5201;

/// A rate change during the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateChange {
    /// When, after the clients started.
    pub after: Duration,
    /// The new rate.
    pub rate: Rate,
}

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scenario {
    /// The state on the router's WAN egress.
    pub state: State,
    /// The flows, all toward the server, started together.
    pub flows: Vec<FlowSpec>,
    /// Ping the server from this host during the measured time.
    pub ping_from: Option<Host>,
    /// Ping interval (root may go below 0.2 s).
    pub ping_interval: Duration,
    /// The ping probes' TOS byte (`ping -Q`), if set.
    pub ping_tos: Option<u8>,
    /// Durations.
    pub timing: Timing,
    /// A live rate change, if any.
    pub rate_change: Option<RateChange>,
    /// Read the shaper's counters (and, for every state, the WAN root
    /// qdisc's statistics) this often during the run (`None`: only after
    /// it). Each read runs `shaper status` and `tc`, which costs CPU: leave
    /// it off where CPU is measured.
    pub counter_every: Option<Duration>,
}

impl Scenario {
    /// `flows` under `state` for `timing`, no ping, no rate change.
    pub fn new(state: State, flows: Vec<FlowSpec>, timing: Timing) -> Self {
        Self {
            state,
            flows,
            ping_from: None,
            ping_interval: Duration::from_millis(50),
            ping_tos: None,
            timing,
            rate_change: None,
            counter_every: None,
        }
    }

    /// The same with ping from `host` every 50 ms during the measured time.
    pub fn with_ping(mut self, host: Host) -> Self {
        self.ping_from = Some(host);
        self
    }

    /// The same with the shaper's counters read every `every` during the
    /// run ([`RunResult::counter_series`]).
    pub fn with_counter_samples(mut self, every: Duration) -> Self {
        self.counter_every = Some(every);
        self
    }

    /// The same with a live rate change.
    pub fn with_rate_change(mut self, after: Duration, rate: Rate) -> Self {
        self.rate_change = Some(RateChange { after, rate });
        self
    }
}

/// One flow spec's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowResult {
    /// What ran.
    pub spec: FlowSpec,
    /// What iperf3 measured.
    pub report: IperfReport,
}

/// What a run measured.
#[derive(Debug)]
pub struct RunResult {
    /// The state's name, e.g. `cake 50Mbit`.
    pub state: String,
    /// Per flow spec, in the scenario's order.
    pub flows: Vec<FlowResult>,
    /// Receiver goodput of all flows together, bit/s.
    pub total_bps: f64,
    /// TCP retransmissions of all flows.
    pub retransmits: u64,
    /// RTT samples in ms (empty without ping).
    pub ping_ms: Vec<f64>,
    /// Whole-machine CPU over the clients' run (omit included).
    pub cpu: CpuUsage,
    /// The shaper's counters after the run ([`LabError::Unsupported`] for
    /// other states; an error if the binary cannot report them).
    pub counters: Result<BTreeMap<String, u64>, LabError>,
    /// The WAN root qdisc's statistics after the run.
    pub qdisc: Result<QdiscStats, LabError>,
    /// Counters read during the run (seconds after the clients started,
    /// counters), when the scenario asked for them and the state has them.
    pub counter_series: Vec<(f64, BTreeMap<String, u64>)>,
    /// The WAN root qdisc's statistics read at the same times, for every
    /// state (what left the router, whatever shaped it).
    pub qdisc_series: Vec<(f64, QdiscStats)>,
    /// When the rate change was issued and when its command returned, after
    /// the clients were spawned (iperf3's intervals count from its own
    /// start, which comes later by the process start and the connection
    /// set-up).
    pub rate_changed_at: Option<(Duration, Duration)>,
    /// Wall time of each phase.
    pub phases: Phases,
}

/// Wall time of a run's phases: where the time beyond the traffic goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phases {
    /// Applying the state (for the shaper: until it reports attached).
    pub apply: Duration,
    /// Starting the iperf3 servers.
    pub servers: Duration,
    /// From starting the clients until all reported.
    pub traffic: Duration,
    /// Reading statistics and tearing the state down.
    pub teardown: Duration,
}

impl RunResult {
    /// Total goodput as a fraction of `rate`.
    pub fn ratio(&self, rate: Rate) -> f64 {
        self.total_bps / rate.bits_per_s() as f64
    }

    /// Flow spec `i`'s part of the total goodput; 0 when nothing was
    /// carried or there is no such spec.
    pub fn part(&self, i: usize) -> f64 {
        let bps = self.flows.get(i).map_or(0.0, |f| f.report.receiver_bps);
        if self.total_bps > 0.0 {
            bps / self.total_bps
        } else {
            0.0
        }
    }

    /// Jain's index over the flow specs' goodputs (one share per spec, so a
    /// spec with several streams counts as one user).
    pub fn jain(&self) -> Option<f64> {
        let shares: Vec<f64> = self.flows.iter().map(|f| f.report.receiver_bps).collect();
        stats::jain(&shares)
    }

    /// p50/p90/p99 of the RTT samples, in ms.
    pub fn ping(&self) -> Option<Percentiles> {
        Percentiles::of(&self.ping_ms)
    }

    /// Kernel CPU share (system + softirq + irq) per Mbit/s of goodput.
    pub fn cpu_per_mbit(&self) -> Option<f64> {
        (self.total_bps > 0.0).then(|| self.cpu.kernel() / (self.total_bps / 1e6))
    }

    /// A named shaper counter, if counters were read and have it.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters.as_ref().ok()?.get(name).copied()
    }

    /// One line for logs.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{}: total {:.2} Mbit/s, retrans {}",
            self.state,
            self.total_bps / 1e6,
            self.retransmits
        );
        for f in &self.flows {
            s.push_str(&format!(
                "; {} {:.2}",
                f.spec.label(),
                f.report.receiver_bps / 1e6
            ));
        }
        if let Some(p) = self.ping() {
            s.push_str(&format!(
                "; ping p50/p90/p99 {:.1}/{:.1}/{:.1} ms (n={})",
                p.p50,
                p.p90,
                p.p99,
                self.ping_ms.len()
            ));
        }
        s.push_str(&format!("; cpu kernel {:.1}%", self.cpu.kernel() * 100.0));
        if let Ok(q) = &self.qdisc
            && !q.queues.is_empty()
        {
            // What each TX queue sent: where the flows went.
            let all: u64 = q.queues.iter().map(|q| q.bytes).sum::<u64>().max(1);
            let parts: Vec<String> = q
                .queues
                .iter()
                .map(|q| format!("{:.0}", q.bytes as f64 * 100.0 / all as f64))
                .collect();
            s.push_str(&format!("; queues % {}", parts.join("/")));
        }
        let p = &self.phases;
        s.push_str(&format!(
            "; s apply/servers/traffic/teardown {:.1}/{:.1}/{:.1}/{:.1}",
            p.apply.as_secs_f64(),
            p.servers.as_secs_f64(),
            p.traffic.as_secs_f64(),
            p.teardown.as_secs_f64()
        ));
        s
    }
}

/// Runs `scenario` on `tb`: applies its state, runs it, tears it down.
pub fn run_scenario(tb: &Testbed, scenario: &Scenario) -> Result<RunResult, LabError> {
    run_scenarios(tb, std::slice::from_ref(scenario))?
        .pop()
        .ok_or_else(|| LabError::Invalid {
            detail: "a scenario ran without a result".to_owned(),
        })
}

/// Runs `scenarios` in turn on `tb` under their one state, applied once
/// before the first and torn down after the last, as a shaper that stays
/// up meets traffic that changes. Each result's counters and qdisc
/// statistics cover its own run only; its series are the readings as
/// taken. The first result's `apply` phase is the state's, the others' 0.
pub fn run_scenarios(tb: &Testbed, scenarios: &[Scenario]) -> Result<Vec<RunResult>, LabError> {
    let Some(first) = scenarios.first() else {
        return Ok(Vec::new());
    };
    if let Some(other) = scenarios.iter().find(|s| s.state != first.state) {
        return Err(LabError::Invalid {
            detail: format!(
                "scenarios run under one state must share it: {} and {}",
                first.state.name(),
                other.state.name()
            ),
        });
    }
    if scenarios.iter().any(|s| s.flows.is_empty()) {
        return Err(LabError::Invalid {
            detail: "a scenario needs at least one flow".to_owned(),
        });
    }
    let t0 = Instant::now();
    let mut applied = first.state.apply(tb)?;
    let apply = t0.elapsed();
    let mut runs = Vec::with_capacity(scenarios.len());
    for (i, scenario) in scenarios.iter().enumerate() {
        let mut r = run_applied(tb, &mut applied, scenario, i > 0)?;
        if i == 0 {
            r.phases.apply = apply;
        }
        runs.push(r);
    }
    let t = Instant::now();
    applied.stop()?;
    if let Some(last) = runs.last_mut() {
        last.phases.teardown += t.elapsed();
    }
    for r in &runs {
        info!("{}", r.summary());
    }
    Ok(runs)
}

/// Runs one scenario under `applied`; `used`: earlier runs left their
/// counts in the state, and this run's figures are taken from a baseline.
fn run_applied(
    tb: &Testbed,
    applied: &mut AppliedState<'_>,
    scenario: &Scenario,
    used: bool,
) -> Result<RunResult, LabError> {
    let t_applied = Instant::now();
    let baseline = used.then(|| (applied.counters().ok(), applied.qdisc_stats().ok()));
    let servers = scenario
        .flows
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let port = u16::try_from(i)
                .ok()
                .and_then(|i| BASE_PORT.checked_add(i))
                .ok_or_else(|| LabError::Invalid {
                    detail: format!("too many flows: {}", scenario.flows.len()),
                })?;
            IperfServer::start_at(tb, Host::Server, spec.server_addr(), port)
        })
        .collect::<Result<Vec<_>, _>>()?;

    let cpu_before = CpuTimes::now()?;
    let started = Instant::now();
    let t_servers = started;
    let mut clients = scenario
        .flows
        .iter()
        .zip(&servers)
        .map(|(spec, server)| IperfClient::spawn(tb, spec, server, &scenario.timing))
        .collect::<Result<Vec<_>, _>>()?;
    let ping = scenario.ping_from.map(|host| {
        Ping::spawn_marked(
            tb,
            host,
            Host::Server.addr(),
            (
                scenario.ping_interval,
                scenario.timing.omit,
                scenario.timing.duration,
            ),
            scenario.ping_tos,
        )
    });
    let mut rate_changed_at = None;
    let mut counter_series = Vec::new();
    let mut qdisc_series = Vec::new();
    let mut pending_change = scenario.rate_change;
    let sample_every = scenario.counter_every;
    let mut next_sample = sample_every;
    // Samples run until the last client exits, not only for the planned
    // time: with many streams or a slow state set-up, iperf3's traffic
    // starts seconds after its process, and ends as late.
    let end = scenario.timing.total();
    let last_sample = end + CLIENT_GRACE;
    loop {
        let due_change = pending_change.map(|c| c.after);
        let sending = clients.iter_mut().any(IperfClient::running);
        let due_sample = next_sample.filter(|&t| t < end || (sending && t < last_sample));
        let Some(due) = due_change.into_iter().chain(due_sample).min() else {
            break;
        };
        sleep(due.saturating_sub(started.elapsed()));
        if let Some(change) = pending_change.filter(|c| c.after <= due) {
            let issued = started.elapsed();
            applied.set_rate(change.rate)?;
            rate_changed_at = Some((issued, started.elapsed()));
            pending_change = None;
        }
        if let (Some(t), Some(every)) = (next_sample.filter(|&t| t <= due), sample_every) {
            // Each reading is dated at the middle of its read: a read
            // spawns a process, which takes tens of milliseconds and varies
            // under load, and its end would date the next reading too late.
            let read_at = |before: Duration| (before + started.elapsed()).as_secs_f64() / 2.0;
            if scenario.state.runs_shaper() {
                let before = started.elapsed();
                if let Ok(c) = applied.counters() {
                    counter_series.push((read_at(before), c));
                }
            }
            let before = started.elapsed();
            if let Ok(q) = applied.qdisc_stats() {
                qdisc_series.push((read_at(before), q));
            }
            next_sample = Some(t + every);
        }
    }
    let mut flows = Vec::with_capacity(clients.len());
    for (client, spec) in clients.into_iter().zip(&scenario.flows) {
        flows.push(FlowResult {
            spec: spec.clone(),
            report: client.wait()?,
        });
    }
    let ping_ms = match ping {
        Some(p) => p.wait()?,
        None => Vec::new(),
    };
    let cpu = CpuUsage::between(&cpu_before, &CpuTimes::now()?);
    let t_traffic = Instant::now();
    let (counters_before, qdisc_before) = baseline.unwrap_or_default();
    let counters = applied
        .counters()
        .map(|c| counters_since(c, counters_before.as_ref()));
    let qdisc = applied
        .qdisc_stats()
        .map(|q| q.since(qdisc_before.as_ref()));
    let state = applied.state().name();
    drop(servers);
    let phases = Phases {
        apply: Duration::ZERO,
        servers: t_servers - t_applied,
        traffic: t_traffic - started,
        teardown: t_traffic.elapsed(),
    };

    let result = RunResult {
        state,
        total_bps: flows.iter().map(|f| f.report.receiver_bps).sum(),
        retransmits: flows.iter().map(|f| f.report.retransmits).sum(),
        flows,
        ping_ms,
        cpu,
        counters,
        qdisc,
        counter_series,
        qdisc_series,
        rate_changed_at,
        phases,
    };
    Ok(result)
}

/// `now` less `before` counter by counter; the fair pacer's state
/// (`fair.*`) is a reading, not a count, and stays as it is.
fn counters_since(
    mut now: BTreeMap<String, u64>,
    before: Option<&BTreeMap<String, u64>>,
) -> BTreeMap<String, u64> {
    let Some(before) = before else {
        return now;
    };
    for (name, v) in now.iter_mut() {
        if !name.starts_with("fair.") {
            *v = v.saturating_sub(before.get(name).copied().unwrap_or(0));
        }
    }
    now
}

/// A ping beside a timed plan: from `from`, every `interval`, over
/// `[start, stop)` of the plan's clock (from its start as spawned: ping's
/// own start comes a moment later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PingWindow {
    /// The pinging host.
    pub from: Host,
    /// Time between echo requests.
    pub interval: Duration,
    /// When it starts, after the plan's start.
    pub start: Duration,
    /// When it stops.
    pub stop: Duration,
}

/// What a timed run measured.
#[derive(Debug)]
pub struct TimedRun {
    /// The state's name, e.g. `cake 50Mbit`.
    pub state: String,
    /// The receiver's bins and the short transfers.
    pub timed: TimedResult,
    /// RTT samples in ms (empty without ping).
    pub ping_ms: Vec<f64>,
    /// The shaper's counters after the plan (as [`RunResult::counters`]:
    /// since the state was applied).
    pub counters: Result<BTreeMap<String, u64>, LabError>,
    /// When the rate change was issued and when it returned, on the plan's
    /// clock.
    pub rate_changed_at: Option<(Duration, Duration)>,
}

impl TimedRun {
    /// The RTT percentiles, if there were samples.
    pub fn ping(&self) -> Option<Percentiles> {
        Percentiles::of(&self.ping_ms)
    }
}

/// One timed plan with what runs beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimedScenario {
    /// The flows.
    pub plan: TimedPlan,
    /// A ping beside them, if any.
    pub ping: Option<PingWindow>,
    /// A live rate change, on the plan's clock, if any.
    pub rate_change: Option<RateChange>,
}

/// Runs each scenario in turn under `state` on `tb`, applied once for all
/// of them, and tears the state down after the last.
pub fn run_timed_scenarios(
    tb: &Testbed,
    state: &State,
    scenarios: &[TimedScenario],
) -> Result<Vec<TimedRun>, LabError> {
    let mut applied = state.apply(tb)?;
    let mut runs = Vec::with_capacity(scenarios.len());
    for sc in scenarios {
        let t0 = Instant::now() + timed::LEAD;
        let ping = sc.ping.map(|p| {
            Ping::spawn(
                tb,
                p.from,
                Host::Server.addr(),
                p.interval,
                (t0 + p.start).saturating_duration_since(Instant::now()),
                p.stop.saturating_sub(p.start),
            )
        });
        let (timed, rate_changed_at) = std::thread::scope(|scope| {
            let traffic = scope.spawn(|| timed::run_timed(tb, &sc.plan, t0));
            let mut changed = None;
            if let Some(c) = sc.rate_change {
                sleep((t0 + c.after).saturating_duration_since(Instant::now()));
                let issued = t0.elapsed();
                let r = applied.set_rate(c.rate);
                changed = Some(r.map(|()| (issued, t0.elapsed())));
            }
            let timed = traffic.join().map_err(|_| LabError::Invalid {
                detail: "the timed traffic thread panicked".to_owned(),
            });
            (timed, changed.transpose())
        });
        let (timed, rate_changed_at) = (timed??, rate_changed_at?);
        let ping_ms = match ping {
            Some(p) => p.wait()?,
            None => Vec::new(),
        };
        let run = TimedRun {
            state: applied.state().name(),
            timed,
            ping_ms,
            counters: applied.counters(),
            rate_changed_at,
        };
        info!(
            "{}: {} bulk flow(s), {} short transfer(s)",
            run.state,
            run.timed.bins.len(),
            run.timed.transfers.len()
        );
        runs.push(run);
    }
    applied.stop()?;
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_state_reports_each_runs_own_counts_and_the_fair_readings() {
        let before = BTreeMap::from([
            ("packets".to_owned(), 100),
            ("fair.multiplier_q16".to_owned(), 262_144),
        ]);
        let now = BTreeMap::from([
            ("packets".to_owned(), 250),
            ("fair.multiplier_q16".to_owned(), 65_536),
            ("codel_drop".to_owned(), 3),
        ]);
        let d = counters_since(now.clone(), Some(&before));
        assert_eq!(d["packets"], 150);
        assert_eq!(d["fair.multiplier_q16"], 65_536);
        assert_eq!(d["codel_drop"], 3);
        assert_eq!(counters_since(now.clone(), None), now);

        let q = |bytes, drops, marks| QdiscStats {
            kind: "cake".to_owned(),
            bytes,
            packets: bytes / 1000,
            drops,
            ecn_marks: marks,
            ..QdiscStats::default()
        };
        let d = q(9_000, 7, Some(5)).since(Some(&q(4_000, 2, Some(1))));
        assert_eq!(d, q(5_000, 5, Some(4)));
        assert_eq!(q(9_000, 7, None).since(None), q(9_000, 7, None));
    }
}
