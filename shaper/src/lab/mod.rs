//! The lab: a client → router → server testbed in network namespaces, the
//! states under test on the router's WAN egress (nothing, CAKE, the shaper),
//! traffic (iperf3, ping) and the statistics to compare them.
//!
//! What it is for: the VM tests that hold the fair pacer against CAKE, the
//! benchmarks, and the `shaper lab` command. All of them drive the same
//! real tools the way an operator would (`ip`, `tc`, `sysctl`, `iperf3`,
//! `ping` and the `shaper` binary itself), so what the lab measures is what a
//! router would do. The one exception is [`timed`]: plain TCP sockets of
//! the lab's own, for flows whose start and stop must line up on one clock.
//!
//! Layout, in the order a run uses it:
//! - [`topology`]: the namespaces, veths, addresses, routes and netem delays
//!   ([`Testbed`]), removed on drop.
//! - [`state`]: what shapes the router's WAN egress ([`State`]), applied and
//!   torn down ([`AppliedState`]).
//! - [`traffic`]: iperf3 servers and clients with parsed `-J` reports.
//! - [`timed`]: TCP flows that start and stop at set times, and short
//!   transfers, counted on one clock (what iperf3 cannot line up).
//! - [`ping`]: RTT samples under load.
//! - [`cpu`]: whole-machine CPU time from /proc/stat over a run.
//! - [`stats`]: percentiles, mean, Jain's fairness index.
//! - [`scenario`]: one run of all of the above, returning a [`RunResult`]
//!   (or timed plans under one state, each a [`TimedRun`]).
//! - [`cases`]: named traffic cases under CAKE and the shaper, which the
//!   VM tests and the benchmark share; [`timed_cases`] the same for flows
//!   that come and go.
//! - [`soak`]: minutes of churn under the shaper with its controller
//!   sampled (memory, descriptors, lost records, status).
//! - [`diffserv`]: EF traffic beside best-effort bulk, for the tins.
//! - [`hosts`]: a host of many flows beside a host of one, for host
//!   isolation (also the lab's `--hosts` phase and its table).
//! - [`overhead`]: links that count packets as DSL and Ethernet lines do.
//! - [`multiqueue`]: flows steered onto TX queues, RPS at the router, and
//!   the figures of one rate across queues.
//! - [`readings`]: what the qdisc tree and the shaper counted (per TX
//!   queue, per tin), read back while a state runs.
//! - [`cli`], [`run`], [`report`], [`breakdown`], [`plot`]: the `shaper lab`
//!   command (one method per state, the JSON, the Markdown tables, the
//!   per-queue and per-tin tables, the SVG plots).
//!
//! Invariants:
//! - The lab changes only namespaces it created (names start with
//!   `shl-<pid>-`); the caller's own namespace and devices are never touched.
//! - Every process the lab starts is owned by a value whose drop stops it, so
//!   a panicking test leaves neither processes nor namespaces behind.
//! - Processes run in a namespace through `nsenter --net=/run/netns/NAME`,
//!   which switches the network namespace only: the shaper's bpffs pins stay
//!   visible to a later `shaper status` (`ip netns exec` would give each
//!   command a private /sys).
//!
//! Units: rates are [`Rate`](crate::rate::Rate) (bit/s) or `f64` bit/s in
//! results; durations are [`Duration`](std::time::Duration); RTT samples are
//! milliseconds (`f64`), as ping prints them.
//!
//! Non-goals: IPv6, more than two LAN hosts, real NICs, and any attempt to
//! make absolute figures meaningful under emulation (compare states measured
//! in the same run instead).

pub mod breakdown;
pub mod cake_mq;
pub mod cases;
pub mod cli;
pub mod cpu;
pub mod diffserv;
pub mod hosts;
pub mod measured;
pub mod multiqueue;
pub mod overhead;
pub mod ping;
pub mod plot;
pub mod readings;
pub mod report;
pub mod run;
pub mod scenario;
pub mod shaping;
pub mod soak;
pub mod state;
pub mod stats;
pub mod timed;
pub mod timed_cases;
pub mod topology;
pub mod traffic;

mod exec;

pub use cpu::{CpuTimes, CpuUsage};
pub use ping::Ping;
pub use readings::{QdiscStats, QueueStats, TinStats};
pub use scenario::{
    FlowResult, Phases, PingWindow, RateChange, RunResult, Scenario, TimedRun, TimedScenario,
    run_scenario, run_scenarios, run_timed_scenarios,
};
pub use state::{AppliedState, State};
pub use topology::{Host, Netns, Testbed, TestbedOptions, WanLink};
pub use traffic::{FlowSpec, Interval, IperfReport, Timing};

/// Why a lab step failed. Each message names the command or file involved.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A program could not be started at all (missing, not executable).
    #[error("cannot start `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// What exec or fork said.
        #[source]
        source: std::io::Error,
    },
    /// A program ran and failed.
    #[error("`{command}` failed ({status}): {output}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status, as the OS describes it.
        status: String,
        /// Its stdout and stderr, trimmed.
        output: String,
    },
    /// A program's output could not be read as expected.
    #[error("cannot parse the output of `{command}`: {detail}")]
    Parse {
        /// The command line (or file) that produced it.
        command: String,
        /// What was wrong.
        detail: String,
    },
    /// A program did not reach a state (or exit) in time.
    #[error("`{command}` did not {what} within {seconds} s{}", if output.is_empty() { String::new() } else { format!(": {output}") })]
    Timeout {
        /// The command line.
        command: String,
        /// What it should have done, e.g. "attach".
        what: String,
        /// The limit.
        seconds: u64,
        /// What it printed so far.
        output: String,
    },
    /// A long-running program exited on its own, or with a failure code
    /// when it was stopped.
    #[error("`{command}` exited with {status}: {output}")]
    Exited {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed.
        output: String,
    },
    /// A file the lab reads or writes.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done, e.g. "reading".
        what: &'static str,
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The operation does not apply to this state, e.g. counters of CAKE.
    #[error("{operation} is not available with state {state}")]
    Unsupported {
        /// What was asked.
        operation: &'static str,
        /// The state's name.
        state: String,
    },
    /// A request the lab refuses before changing anything.
    #[error("invalid lab request: {detail}")]
    Invalid {
        /// What is wrong and how to fix it.
        detail: String,
    },
    /// A kernel request the lab sends itself (no tool says it) failed.
    #[error("{what}: {detail}")]
    Request {
        /// What was asked of the kernel.
        what: String,
        /// Why it failed.
        detail: String,
    },
}
