//! The lab part's CPU-bound case: a rate meant to be more than the guest
//! can shape at full speed (400 Mbit/s by default, for the 2-vCPU guest),
//! so the CPU, not the configured rate, decides how much passes, and what a
//! state costs shows as goodput it does not deliver and latency it adds.
//! The `none` state shows what the guest forwards unshaped, and so whether
//! the rate was out of reach.
//!
//! States, each shaping both directions as the lab's states of the same
//! name do ([`crate::lab::cli::StateKind::state`]): `none` (no shaping:
//! what the guest forwards at all), `cake` (CAKE on the router's WAN egress
//! and CAKE in `ingress` mode on an IFB) and `shaper` (the fair pacer on
//! egress, and on ingress the default mode: the pacer on an IFB).
//!
//! Method: per state, applied once, an upload (client → server through the
//! router) and then a download (server → client), each with the lab part's
//! streams and measured time after the same warm-up, ping from the client
//! every 50 ms alongside. The states run interleaved (none, CAKE, shaper,
//! then again) `reps` times so a slow stretch of the host hits each alike;
//! a state's figures are the medians over its runs with min and max
//! ([`Spread`]) and every run. The kernel's BPF run-time statistics are off
//! during this case: their clock reads would cost the shaper alone.
//!
//! JSON (under `vm.cpu_bound`): `rate_mbit`, `state_reps`; per state
//! (`none`, `cake`, `shaper`) the medians `up_goodput_mbit`,
//! `down_goodput_mbit`, `up_ping_p99_ms`, `down_ping_p99_ms`,
//! `up_cpu_busy_frac`, `down_cpu_busy_frac`, their spreads `up_goodput`,
//! `down_goodput`, `up_ping_p99`, `down_ping_p99`, and `runs` (each run's
//! `up` and `down`); and the shaper against the rate and against CAKE:
//! `shaper_up_goodput_ratio`, `shaper_down_goodput_ratio` (median goodput /
//! rate) and `shaper_up_ping_p99_vs_cake`, `shaper_down_ping_p99_vs_cake`
//! (median ping p99 of the shaper / CAKE's).
//!
//! Units: receiver goodput in Mbit/s, RTT in ms, CPU as the busy share of
//! all the guest's CPUs (0..=1), ratios as plain fractions.
//!
//! Non-goals: a CPU cost per Mbit/s (the lab part's states measure that
//! against a paced baseline), the IFB ingress mode, pass or fail.

use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;
use tracing::info;

use super::cases::Spread;
use crate::{
    lab::{
        FlowSpec, Host, LabError, RunResult, Scenario, State, Testbed, Timing, cli::StateKind,
        run_scenarios,
    },
    rate::Rate,
};

/// The states of the case, in run order.
const KINDS: [StateKind; 3] = [StateKind::None, StateKind::Cake, StateKind::Shaper];

/// What the case runs.
#[derive(Clone, Debug)]
pub struct CpuBoundOptions {
    /// Path of the shaper binary the shaper state runs.
    pub bin: PathBuf,
    /// The rate each direction is shaped at.
    pub rate: Rate,
    /// TCP streams per direction.
    pub streams: u32,
    /// Warm-up and measured time of each direction's run.
    pub timing: Timing,
    /// Runs of each state (at least 1), interleaved.
    pub reps: u32,
}

/// One direction of one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DirectionRun {
    /// Receiver goodput of all streams, Mbit/s.
    pub goodput_mbit: f64,
    /// 99th percentile RTT under load, ms; `None` without samples.
    pub ping_p99_ms: Option<f64>,
    /// Ping samples.
    pub ping_samples: usize,
    /// TCP retransmissions.
    pub retransmits: u64,
    /// Busy share (user, system, softirq, irq) of all CPUs over the run.
    pub cpu_busy_frac: f64,
}

impl DirectionRun {
    /// The figures of `run`.
    fn of(run: &RunResult) -> Self {
        Self {
            goodput_mbit: run.total_bps / 1e6,
            ping_p99_ms: run.ping().map(|p| p.p99),
            ping_samples: run.ping_ms.len(),
            retransmits: run.retransmits,
            cpu_busy_frac: run.cpu.kernel() + run.cpu.user,
        }
    }
}

/// One run of a state: the upload, then the download.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpuBoundRun {
    /// Client → server.
    pub up: DirectionRun,
    /// Server → client.
    pub down: DirectionRun,
}

/// One state's figures over its runs.
#[derive(Clone, Debug, Serialize)]
pub struct CpuBoundState {
    /// Upload goodput, Mbit/s, median.
    pub up_goodput_mbit: f64,
    /// Download goodput, Mbit/s, median.
    pub down_goodput_mbit: f64,
    /// Upload ping p99, ms, median over the runs that have one.
    pub up_ping_p99_ms: Option<f64>,
    /// Download ping p99, ms, median over the runs that have one.
    pub down_ping_p99_ms: Option<f64>,
    /// Upload CPU busy share, median.
    pub up_cpu_busy_frac: f64,
    /// Download CPU busy share, median.
    pub down_cpu_busy_frac: f64,
    /// Upload goodput over the runs, Mbit/s.
    pub up_goodput: Spread,
    /// Download goodput over the runs, Mbit/s.
    pub down_goodput: Spread,
    /// Upload ping p99 over the runs that have one, ms.
    pub up_ping_p99: Option<Spread>,
    /// Download ping p99 over the runs that have one, ms.
    pub down_ping_p99: Option<Spread>,
    /// Each run's figures, in run order.
    pub runs: Vec<CpuBoundRun>,
}

impl CpuBoundState {
    /// The medians and spreads of `runs` (at least one).
    pub fn of(runs: Vec<CpuBoundRun>) -> Self {
        let all = |f: fn(&CpuBoundRun) -> f64| Spread::of(runs.iter().map(f).collect());
        let some = |f: fn(&CpuBoundRun) -> Option<f64>| {
            let v: Vec<f64> = runs.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| Spread::of(v))
        };
        let up_goodput = all(|r| r.up.goodput_mbit);
        let down_goodput = all(|r| r.down.goodput_mbit);
        let up_ping_p99 = some(|r| r.up.ping_p99_ms);
        let down_ping_p99 = some(|r| r.down.ping_p99_ms);
        Self {
            up_goodput_mbit: up_goodput.median,
            down_goodput_mbit: down_goodput.median,
            up_ping_p99_ms: up_ping_p99.as_ref().map(|s| s.median),
            down_ping_p99_ms: down_ping_p99.as_ref().map(|s| s.median),
            up_cpu_busy_frac: all(|r| r.up.cpu_busy_frac).median,
            down_cpu_busy_frac: all(|r| r.down.cpu_busy_frac).median,
            up_goodput,
            down_goodput,
            up_ping_p99,
            down_ping_p99,
            runs,
        }
    }
}

/// Everything the case measures.
#[derive(Clone, Debug, Serialize)]
pub struct CpuBoundReport {
    /// The rate of both directions, Mbit/s.
    pub rate_mbit: f64,
    /// Runs per state.
    pub state_reps: u32,
    /// No shaping.
    pub none: CpuBoundState,
    /// CAKE on egress and on an IFB for ingress.
    pub cake: CpuBoundState,
    /// The shaper in its default modes both ways.
    pub shaper: CpuBoundState,
    /// The shaper's median upload goodput / rate.
    pub shaper_up_goodput_ratio: f64,
    /// The shaper's median download goodput / rate.
    pub shaper_down_goodput_ratio: f64,
    /// The shaper's median upload ping p99 / CAKE's.
    pub shaper_up_ping_p99_vs_cake: Option<f64>,
    /// The shaper's median download ping p99 / CAKE's.
    pub shaper_down_ping_p99_vs_cake: Option<f64>,
}

impl CpuBoundReport {
    /// The report of the three states at `rate` over `reps` runs each.
    pub fn new(
        rate: Rate,
        reps: u32,
        none: CpuBoundState,
        cake: CpuBoundState,
        shaper: CpuBoundState,
    ) -> Self {
        let rate_mbit = rate.bits_per_s() as f64 / 1e6;
        Self {
            rate_mbit,
            state_reps: reps,
            shaper_up_goodput_ratio: shaper.up_goodput_mbit / rate_mbit,
            shaper_down_goodput_ratio: shaper.down_goodput_mbit / rate_mbit,
            shaper_up_ping_p99_vs_cake: ratio(shaper.up_ping_p99_ms, cake.up_ping_p99_ms),
            shaper_down_ping_p99_vs_cake: ratio(shaper.down_ping_p99_ms, cake.down_ping_p99_ms),
            none,
            cake,
            shaper,
        }
    }
}

/// `ours / theirs` where both exist and `theirs` is above zero.
fn ratio(ours: Option<f64>, theirs: Option<f64>) -> Option<f64> {
    match (ours, theirs) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// Runs the case on `tb` (the lab part's testbed).
pub fn run(tb: &Testbed, opts: &CpuBoundOptions) -> Result<CpuBoundReport, LabError> {
    let mut runs: [Vec<CpuBoundRun>; 3] = Default::default();
    for rep in 0..opts.reps.max(1) {
        for (kind, runs) in KINDS.iter().zip(runs.iter_mut()) {
            info!(state = kind.name(), rate = %opts.rate, rep, "CPU-bound run");
            runs.push(both_ways(tb, opts, kind.state(&opts.bin, opts.rate))?);
        }
    }
    let [none, cake, shaper] = runs.map(CpuBoundState::of);
    let report = CpuBoundReport::new(opts.rate, opts.reps.max(1), none, cake, shaper);
    info!(
        shaper_up = report.shaper_up_goodput_ratio,
        shaper_down = report.shaper_down_goodput_ratio,
        "CPU-bound case measured"
    );
    Ok(report)
}

/// `state` applied once for an upload and then a download, each with ping.
fn both_ways(tb: &Testbed, opts: &CpuBoundOptions, state: State) -> Result<CpuBoundRun, LabError> {
    let up = FlowSpec::tcp(Host::Client, opts.streams);
    let scenarios = [up.clone(), up.reversed()]
        .map(|f| Scenario::new(state.clone(), vec![f], opts.timing).with_ping(Host::Client));
    let results = run_scenarios(tb, &scenarios)?;
    match results.as_slice() {
        [up, down] => Ok(CpuBoundRun {
            up: DirectionRun::of(up),
            down: DirectionRun::of(down),
        }),
        other => Err(LabError::Invalid {
            detail: format!(
                "the CPU-bound case ran two directions and got {} results",
                other.len()
            ),
        }),
    }
}

/// The case as table rows: each state's median goodput and ping p99 per
/// direction with their range, then the shaper against the rate and CAKE.
pub fn table(cb: &Value) -> String {
    let mbit = |x: f64| format!("{x:.1}");
    let mut s = format!(
        "  CPU-bound rate, {} Mbit/s each way (medians [min–max] over {} runs):\n",
        super::num(cb, "rate_mbit"),
        cb.get("state_reps").and_then(Value::as_u64).unwrap_or(0),
    );
    s.push_str(&format!(
        "  {:<8} {:>22} {:>22} {:>20} {:>20}\n",
        "state", "up Mbit/s", "down Mbit/s", "up ping p99 ms", "down ping p99 ms"
    ));
    for name in ["none", "cake", "shaper"] {
        let Some(st) = cb.get(name).filter(|v| !v.is_null()) else {
            continue;
        };
        s.push_str(&format!(
            "  {:<8} {:>22} {:>22} {:>20} {:>20}\n",
            name,
            super::with_range(st, "up_goodput_mbit", "up_goodput", mbit),
            super::with_range(st, "down_goodput_mbit", "down_goodput", mbit),
            super::with_range(st, "up_ping_p99_ms", "up_ping_p99", mbit),
            super::with_range(st, "down_ping_p99_ms", "down_ping_p99", mbit),
        ));
    }
    let times = |k: &str| {
        cb.get(k)
            .and_then(Value::as_f64)
            .map_or("-".to_owned(), |x| format!("{x:.2}×"))
    };
    s.push_str(&format!(
        "  shaper: goodput {} of the rate up, {} down; ping p99 {} CAKE's up, {} down\n",
        super::frac(cb, "shaper_up_goodput_ratio"),
        super::frac(cb, "shaper_down_goodput_ratio"),
        times("shaper_up_ping_p99_vs_cake"),
        times("shaper_down_ping_p99_vs_cake"),
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn way(goodput_mbit: f64, p99: Option<f64>) -> DirectionRun {
        DirectionRun {
            goodput_mbit,
            ping_p99_ms: p99,
            ping_samples: if p99.is_some() { 200 } else { 0 },
            retransmits: 0,
            cpu_busy_frac: goodput_mbit / 400.0,
        }
    }

    fn run_of(up: f64, up_p99: Option<f64>, down: f64, down_p99: Option<f64>) -> CpuBoundRun {
        CpuBoundRun {
            up: way(up, up_p99),
            down: way(down, down_p99),
        }
    }

    fn rate() -> Rate {
        "400mbit".parse().expect("a valid rate")
    }

    #[test]
    fn a_state_is_the_median_of_its_runs_per_direction_with_their_spread() {
        let st = CpuBoundState::of(vec![
            run_of(300.0, Some(40.0), 200.0, None),
            run_of(280.0, Some(30.0), 260.0, Some(55.0)),
            run_of(320.0, Some(35.0), 240.0, Some(45.0)),
        ]);
        assert_eq!(st.up_goodput_mbit, 300.0);
        assert_eq!((st.up_goodput.min, st.up_goodput.max), (280.0, 320.0));
        assert_eq!(st.down_goodput_mbit, 240.0);
        assert_eq!((st.down_goodput.min, st.down_goodput.max), (200.0, 260.0));
        assert_eq!(st.up_ping_p99_ms, Some(35.0));
        // Download ping over the two runs that have samples.
        let down = st.down_ping_p99.as_ref().expect("two runs with ping");
        assert_eq!((down.min, down.max, down.runs.len()), (45.0, 55.0, 2));
        assert_eq!(st.up_cpu_busy_frac, 0.75);
        assert_eq!(st.runs.len(), 3);
        // The goodput spread keeps run order, not sorted order.
        assert_eq!(st.up_goodput.runs, [300.0, 280.0, 320.0]);
    }

    #[test]
    fn a_state_without_ping_has_no_p99() {
        let st = CpuBoundState::of(vec![run_of(300.0, None, 200.0, None)]);
        assert_eq!((st.up_ping_p99_ms, st.down_ping_p99_ms), (None, None));
        assert!(st.up_ping_p99.is_none() && st.down_ping_p99.is_none());
    }

    #[test]
    fn the_ratios_set_the_shaper_against_the_rate_and_against_cake() {
        let one = |up, up_p99, down, down_p99| {
            CpuBoundState::of(vec![run_of(up, up_p99, down, down_p99)])
        };
        let report = CpuBoundReport::new(
            rate(),
            1,
            one(390.0, Some(60.0), 380.0, Some(70.0)),
            one(300.0, Some(20.0), 320.0, None),
            one(200.0, Some(30.0), 360.0, Some(35.0)),
        );
        assert_eq!(report.rate_mbit, 400.0);
        assert_eq!(report.shaper_up_goodput_ratio, 0.5);
        assert_eq!(report.shaper_down_goodput_ratio, 0.9);
        assert_eq!(report.shaper_up_ping_p99_vs_cake, Some(1.5));
        // CAKE had no download ping: no ratio rather than a guess.
        assert_eq!(report.shaper_down_ping_p99_vs_cake, None);
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
    }

    #[test]
    fn the_json_has_the_documented_keys_and_the_table_reads_them() {
        let state = |up: f64| {
            CpuBoundState::of(vec![
                run_of(up, Some(20.0), 250.0, Some(30.0)),
                run_of(up + 10.0, Some(24.0), 260.0, Some(33.0)),
                run_of(up - 10.0, Some(22.0), 270.0, Some(36.0)),
            ])
        };
        let report = CpuBoundReport::new(rate(), 3, state(380.0), state(300.0), state(340.0));
        let v = serde_json::to_value(&report).expect("serialises");
        assert_eq!(v["rate_mbit"], 400.0);
        assert_eq!(v["state_reps"], 3);
        for name in ["none", "cake", "shaper"] {
            let st = &v[name];
            for key in [
                "up_goodput_mbit",
                "down_goodput_mbit",
                "up_ping_p99_ms",
                "down_ping_p99_ms",
            ] {
                assert!(st[key].is_f64(), "{name}.{key}: {st}");
            }
            for key in ["up_goodput", "down_goodput", "up_ping_p99", "down_ping_p99"] {
                for bound in ["median", "min", "max"] {
                    assert!(st[key][bound].is_f64(), "{name}.{key}.{bound}: {st}");
                }
            }
            assert_eq!(st["runs"].as_array().map(Vec::len), Some(3), "{name}");
            assert!(st["runs"][0]["down"]["goodput_mbit"].is_f64(), "{name}");
        }
        assert_eq!(v["shaper"]["up_goodput_mbit"], 340.0);
        assert_eq!(v["cake"]["down_ping_p99"]["max"], 36.0);
        assert_eq!(v["shaper_up_goodput_ratio"], 0.85);
        assert_eq!(v["shaper_down_goodput_ratio"], 0.65);
        assert_eq!(v["shaper_up_ping_p99_vs_cake"], 1.0);
        assert_eq!(v["shaper_down_ping_p99_vs_cake"], 1.0);

        let t = table(&v);
        assert!(
            t.contains("400.0 Mbit/s each way") && t.contains("3 runs"),
            "{t}"
        );
        assert!(t.contains("340.0 [330.0–350.0]"), "{t}");
        assert!(t.contains("33.0 [30.0–36.0]"), "{t}");
        assert!(
            t.contains("goodput 85.0% of the rate up, 65.0% down"),
            "{t}"
        );
        assert!(t.contains("1.00× CAKE's up"), "{t}");
        assert_eq!(t.lines().count(), 6, "{t}");
    }

    #[test]
    fn the_states_are_the_labs_both_way_states() {
        let bin = Path::new("/usr/sbin/shaper");
        assert_eq!(StateKind::None.state(bin, rate()), State::None);
        assert_eq!(
            StateKind::Cake.state(bin, rate()),
            State::Stack(vec![
                State::Cake { rate: rate() },
                State::cake_ingress(rate()),
            ])
        );
        match StateKind::Shaper.state(bin, rate()) {
            State::Shaper {
                bin: b,
                rate: r,
                extra_args,
            } => {
                assert_eq!((b.as_path(), r), (bin, rate()));
                // The default pacer on egress, and ingress in the default
                // mode at the same rate.
                assert!(!extra_args.iter().any(|a| a == "--pacer"), "{extra_args:?}");
                let ingress = extra_args.iter().position(|a| a == "--ingress-rate");
                assert_eq!(
                    ingress
                        .and_then(|i| extra_args.get(i + 1))
                        .map(String::as_str),
                    Some("400000000bit"),
                    "{extra_args:?}"
                );
                let default =
                    clap::ValueEnum::to_possible_value(&crate::ingress::IngressMode::default())
                        .expect("a named mode");
                let mode = extra_args.iter().position(|a| a == "--ingress-mode");
                assert!(
                    mode.and_then(|i| extra_args.get(i + 1))
                        .is_none_or(|m| m == default.get_name()),
                    "{extra_args:?}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
