//! The multi-queue and DiffServ part of the lab benchmark (`shaper bench
//! --vm-part --multiqueue`), for a kernel with cake_mq: `cargo xtask bench`
//! runs it in the 7.x VM after the 6.12 part.
//!
//! - `multiqueue`: the WAN device with [`QUEUES`] TX queues, uploads at the
//!   rate, the cases of [`crate::lab::multiqueue`] ((a) one flow steered
//!   onto a queue, (b) 8 flows hashed, (c) one flow and eight steered
//!   onto two queues) under the shaper, cake_mq (where the kernel has it)
//!   and `mq` with a CAKE per queue at rate / queues: per state the
//!   medians of `single_flow_ratio`, `sum_ratio_max_1s`,
//!   `min_flow_share_ratio` and `jain_1v8`, each figure's spread under
//!   `spread`; under `rps`, the shaper's figures with RPS on at the router
//!   and nothing steered (case (d)).
//! - `diffserv`: diffserv4 on every state, 16 best-effort bulk flows beside
//!   EF traffic ([`crate::lab::diffserv`]): per state `ef_ping_p99_ms`,
//!   `ef_loss_pct` (the EF voice case) and `ef_bulk_share` (the EF bulk
//!   case), the shaper and one CAKE on a one-queue WAN, cake_mq on the
//!   multi-queue one; and the shaper's `ef_bulk_share_mq`, the EF flow
//!   steered onto a queue of the multi-queue WAN and the rest hashed.
//!
//! Repetitions: `reps` rounds, the states interleaved within each, so a
//! slow stretch of the host hits every state alike; medians with their
//! spread. Units: ratios of the rate, shares of what all flows carried,
//! ms, percent.
//!
//! Non-goals: pass/fail bars (the VM tests hold them).

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use serde::Serialize;
use tracing::info;

use crate::{
    lab::{
        LabError, Scenario, State, Testbed, TestbedOptions, Timing, cake_mq,
        diffserv::{ef_bulk_flows, voice_figures, voice_scenario},
        multiqueue::{self as mq, MqFigures},
        run_scenario,
    },
    rate::Rate,
};

use super::cases::Spread;

/// TX queues of the multi-queue WAN.
pub const QUEUES: u32 = 4;
/// The queue the lone and the EF flow are steered onto.
const STEERED_QUEUE: u32 = 2;
/// Warm-up excluded from every run.
const OMIT: Duration = Duration::from_secs(2);
/// The EF pings' interval.
const PING_EVERY: Duration = Duration::from_millis(20);
/// The tins every state of the DiffServ cases runs.
const DIFFSERV: &str = "diffserv4";

/// What the part runs.
#[derive(Clone, Debug)]
pub struct MqOptions {
    /// The shaper binary.
    pub bin: PathBuf,
    /// The shaping rate.
    pub rate: Rate,
    /// Measured time per run.
    pub duration: Duration,
    /// Rounds.
    pub reps: u32,
}

/// One state's multi-queue figures: the medians, and their spread.
#[derive(Clone, Debug, Serialize)]
pub struct MqState {
    /// (a): the lone flow's goodput, of the rate.
    pub single_flow_ratio: f64,
    /// (b): the most any 1 s interval carried, of the rate.
    pub sum_ratio_max_1s: f64,
    /// (b): the least flow, of an equal share.
    pub min_flow_share_ratio: f64,
    /// (c): Jain's index over the 9 flows.
    pub jain_1v8: f64,
    /// Each figure over the rounds.
    pub spread: BTreeMap<&'static str, Spread>,
}

impl MqState {
    fn of(runs: &[MqFigures]) -> Self {
        let spread = |f: fn(&MqFigures) -> f64| Spread::of(runs.iter().map(f).collect());
        let spread: BTreeMap<&'static str, Spread> = [
            ("single_flow_ratio", spread(|f| f.single_flow_ratio)),
            ("sum_ratio_max_1s", spread(|f| f.sum_ratio_max_1s)),
            ("min_flow_share_ratio", spread(|f| f.min_flow_share_ratio)),
            ("jain_1v8", spread(|f| f.jain_1v8)),
        ]
        .into_iter()
        .collect();
        let median = |k: &str| spread.get(k).map_or(f64::NAN, |s| s.median);
        Self {
            single_flow_ratio: median("single_flow_ratio"),
            sum_ratio_max_1s: median("sum_ratio_max_1s"),
            min_flow_share_ratio: median("min_flow_share_ratio"),
            jain_1v8: median("jain_1v8"),
            spread,
        }
    }
}

/// The multi-queue figures.
#[derive(Clone, Debug, Serialize)]
pub struct MqReport {
    /// The guest's kernel release.
    pub kernel: String,
    /// TX queues of the WAN device.
    pub queues: u32,
    /// `shaper`, `cake_mq` (where the kernel has it) and `cake_split`.
    pub states: BTreeMap<&'static str, MqState>,
    /// The shaper with RPS on and nothing steered.
    pub rps: BTreeMap<&'static str, MqState>,
}

/// One state's DiffServ figures (medians; `spread` holds each figure
/// over the rounds).
#[derive(Clone, Debug, Serialize)]
pub struct TinState {
    /// The EF pings' p99, ms.
    pub ef_ping_p99_ms: f64,
    /// The EF voice flow's loss, percent.
    pub ef_loss_pct: f64,
    /// The EF bulk flow's share of what all flows carried.
    pub ef_bulk_share: f64,
    /// The same across the multi-queue WAN (the shaper only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ef_bulk_share_mq: Option<f64>,
    /// Each figure over the rounds.
    pub spread: BTreeMap<&'static str, Spread>,
}

/// The part's document.
#[derive(Clone, Debug, Serialize)]
pub struct PartReport {
    /// Names the part, for the merge.
    pub part: &'static str,
    /// See [`MqReport`].
    pub multiqueue: MqReport,
    /// `shaper`, `cake` and `cake_mq` (where the kernel has it).
    pub diffserv: BTreeMap<&'static str, TinState>,
}

/// The name the merge recognises the part by.
pub const PART: &str = "multiqueue";

fn shaper(opts: &MqOptions, args: &[&str]) -> State {
    State::Shaper {
        bin: opts.bin.clone(),
        rate: opts.rate,
        extra_args: args.iter().map(|a| (*a).to_owned()).collect(),
    }
}

/// The states of the multi-queue cases, by their JSON names.
fn mq_states(opts: &MqOptions) -> Vec<(&'static str, State)> {
    let mut v = vec![
        ("shaper", shaper(opts, &[])),
        (
            "cake_split",
            State::CakeSplit {
                rate: opts.rate,
                queues: QUEUES,
                tins: "besteffort",
            },
        ),
    ];
    if cake_mq::kernel_has() {
        v.push((
            "cake_mq",
            State::CakeMq {
                rate: opts.rate,
                tins: "besteffort",
            },
        ));
    }
    v
}

/// Runs the part.
pub fn run(opts: &MqOptions) -> Result<PartReport, LabError> {
    let timing = Timing::new(opts.duration, OMIT);
    let many = Testbed::new(TestbedOptions {
        wan_queues: QUEUES,
        ..TestbedOptions::default()
    })?;
    let states = mq_states(opts);
    let mut runs: BTreeMap<&'static str, Vec<MqFigures>> = BTreeMap::new();
    let mut rps_runs = Vec::new();
    for rep in 0..opts.reps {
        for (name, state) in &states {
            info!(rep, state = name, "multi-queue cases");
            let f = mq::measure(&many, state, opts.rate, timing, true)?;
            runs.entry(*name).or_default().push(f);
        }
        mq::set_rps(&many, true)?;
        let f = mq::measure(&many, &shaper(opts, &[]), opts.rate, timing, false);
        mq::set_rps(&many, false)?;
        rps_runs.push(f?);
    }
    let diffserv = diffserv_cases(opts, &many, timing)?;
    Ok(PartReport {
        part: PART,
        multiqueue: MqReport {
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            queues: QUEUES,
            states: runs.iter().map(|(k, v)| (*k, MqState::of(v))).collect(),
            rps: BTreeMap::from([("shaper", MqState::of(&rps_runs))]),
        },
        diffserv,
    })
}

/// Per state and figure, every round's value.
type Figures = BTreeMap<&'static str, BTreeMap<&'static str, Vec<f64>>>;

fn diffserv_cases(
    opts: &MqOptions,
    many: &Testbed,
    timing: Timing,
) -> Result<BTreeMap<&'static str, TinState>, LabError> {
    let one = Testbed::new(TestbedOptions::default())?;
    let ours = shaper(opts, &["--diffserv", DIFFSERV]);
    let mut states: Vec<(&'static str, &Testbed, State)> = vec![
        ("shaper", &one, ours.clone()),
        ("cake", &one, State::cake_tins(opts.rate, DIFFSERV)),
    ];
    if cake_mq::kernel_has() {
        states.push((
            "cake_mq",
            many,
            State::CakeMq {
                rate: opts.rate,
                tins: DIFFSERV,
            },
        ));
    }
    let mut figures: Figures = BTreeMap::new();
    let mut put = |state, key, v| {
        figures
            .entry(state)
            .or_default()
            .entry(key)
            .or_default()
            .push(v);
    };
    for rep in 0..opts.reps {
        for (name, tb, state) in &states {
            info!(rep, state = name, "DiffServ cases");
            let bulk = run_scenario(tb, &Scenario::new(state.clone(), ef_bulk_flows(), timing))?;
            put(*name, "ef_bulk_share", bulk.part(0));
            let voice = run_scenario(tb, &voice_scenario(state.clone(), timing, PING_EVERY))?;
            let (p99, loss) = voice_figures(&voice);
            put(*name, "ef_ping_p99_ms", p99);
            put(*name, "ef_loss_pct", loss);
        }
        let rules = [(crate::lab::Host::Client, STEERED_QUEUE)];
        let r = mq::run_steered(many, ours.clone(), ef_bulk_flows(), &rules, timing)?;
        put("shaper", "ef_bulk_share_mq", r.part(0));
    }
    Ok(figures
        .into_iter()
        .map(|(name, f)| {
            let spread: BTreeMap<&'static str, Spread> =
                f.into_iter().map(|(k, v)| (k, Spread::of(v))).collect();
            let median = |k: &str| spread.get(k).map(|s| s.median);
            (
                name,
                TinState {
                    ef_ping_p99_ms: median("ef_ping_p99_ms").unwrap_or(f64::NAN),
                    ef_loss_pct: median("ef_loss_pct").unwrap_or(f64::NAN),
                    ef_bulk_share: median("ef_bulk_share").unwrap_or(f64::NAN),
                    ef_bulk_share_mq: median("ef_bulk_share_mq"),
                    spread,
                },
            )
        })
        .collect())
}

/// The part as a table.
pub fn table(doc: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let f = |v: &serde_json::Value, k: &str| {
        v.get(k)
            .and_then(serde_json::Value::as_f64)
            .map_or_else(|| "-".to_owned(), |x| format!("{x:.3}"))
    };
    if let Some(m) = doc.get("multiqueue") {
        let _ = writeln!(
            t,
            "multi-queue ({} TX queues, kernel {}): state, (a) lone flow, (b) most 1 s, (b) \
             least flow, (c) Jain 1 vs 8",
            m.get("queues")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0),
            m.get("kernel")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("?")
        );
        for (group, prefix) in [("states", ""), ("rps", "RPS on, hashed: ")] {
            for (name, s) in m
                .get(group)
                .and_then(serde_json::Value::as_object)
                .into_iter()
                .flatten()
            {
                let _ = writeln!(
                    t,
                    "  {prefix}{name:<12} {} {} {} {}",
                    f(s, "single_flow_ratio"),
                    f(s, "sum_ratio_max_1s"),
                    f(s, "min_flow_share_ratio"),
                    f(s, "jain_1v8")
                );
            }
        }
    }
    if let Some(d) = doc.get("diffserv").and_then(serde_json::Value::as_object) {
        let _ = writeln!(
            t,
            "diffserv4: state, EF ping p99 ms, EF loss %, EF bulk share, EF bulk share over {QUEUES} queues"
        );
        for (name, s) in d {
            let _ = writeln!(
                t,
                "  {name:<12} {} {} {} {}",
                f(s, "ef_ping_p99_ms"),
                f(s, "ef_loss_pct"),
                f(s, "ef_bulk_share"),
                f(s, "ef_bulk_share_mq")
            );
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_is_the_median_of_its_rounds() {
        let f = |a, j| MqFigures {
            single_flow_ratio: a,
            sum_ratio_max_1s: 1.0,
            min_flow_share_ratio: 0.9,
            jain_1v8: j,
        };
        let s = MqState::of(&[f(0.9, 0.99), f(0.95, 0.5), f(0.93, 1.0)]);
        assert_eq!(s.single_flow_ratio, 0.93);
        assert_eq!(s.jain_1v8, 0.99);
        assert_eq!(s.spread["jain_1v8"].min, 0.5);
        let doc = serde_json::json!({
            "multiqueue": serde_json::to_value(MqReport {
                kernel: "7.3".to_owned(),
                queues: 4,
                states: BTreeMap::from([("shaper", s)]),
                rps: BTreeMap::new(),
            }).expect("json"),
            "diffserv": {"cake": {"ef_bulk_share": 0.24}},
        });
        let t = table(&doc);
        assert!(t.contains("shaper       0.930"), "{t}");
        assert!(t.contains("cake         - - 0.240 -"), "{t}");
    }
}
