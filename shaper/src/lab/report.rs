//! The lab's results: the per-state summary, the JSON with every raw
//! sample, the Markdown tables (a row per state: goodput, loaded latency,
//! CPU), the bufferbloat
//! grade and the verdict lines.
//!
//! Invariants: every figure of the Markdown report comes from
//! [`Summary`], and [`Summary`] only from the raw samples that the JSON
//! carries too, so the report can be recomputed from the JSON.
//!
//! Units: Mbit/s (receiver goodput unless named sender), ms, percent.
//!
//! Non-goals: statistics across repeated runs.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::{
    hosts::{A_FLOWS, HostsRun},
    measured::{CpuSample, LabRun, LoadPhase, StateRun, busy_within},
    stats::{mean, percentile},
};
use crate::lab::traffic::IperfReport;

/// The bufferbloat grade of a latency increase under load, in ms, on the
/// scale of the Waveform bufferbloat test
/// (<https://www.waveform.com/tools/bufferbloat>, its "grading" notes):
/// A+ below 5 ms, A below 30, B below 60, C below 200, D below 400, F
/// from 400 on.
pub fn grade(increase_ms: f64) -> &'static str {
    match increase_ms {
        x if x < 5.0 => "A+",
        x if x < 30.0 => "A",
        x if x < 60.0 => "B",
        x if x < 200.0 => "C",
        x if x < 400.0 => "D",
        _ => "F",
    }
}

/// One state's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// `--states` name.
    pub name: String,
    /// Upload receiver goodput.
    pub up_mbps: f64,
    /// Upload sender rate.
    pub up_sender_mbps: f64,
    /// Download receiver goodput.
    pub down_mbps: f64,
    /// Download sender rate.
    pub down_sender_mbps: f64,
    /// Upload retransmits.
    pub up_retransmits: u64,
    /// Download retransmits.
    pub down_retransmits: u64,
    /// Median of the idle pings before and after.
    pub ping_idle_ms: f64,
    /// Mean idle ping before.
    pub ping_idle_before_avg_ms: f64,
    /// Mean idle ping after.
    pub ping_idle_after_avg_ms: f64,
    /// Median ping during upload (the shaped direction).
    pub ping_loaded_p50_ms: f64,
    /// 99th percentile during upload.
    pub ping_loaded_p99_ms: f64,
    /// Mean ping during upload.
    pub ping_up_avg_ms: f64,
    /// Median ping during download.
    pub ping_down_p50_ms: f64,
    /// Mean ping during download.
    pub ping_down_avg_ms: f64,
    /// UDP probe loss during upload, percent.
    pub udp_up_loss_pct: Option<f64>,
    /// Highest CPU busy sample.
    pub cpu_busy_max_pct: f64,
    /// The CPU busy samples' quartiles (p25, p50, p75), percent: what the
    /// CPU verdict compares, so that one state wins only where the states'
    /// samples separate.
    pub cpu_busy_quartiles_pct: (f64, f64, f64),
    /// Highest softirq sample.
    pub cpu_softirq_max_pct: f64,
    /// Samples with no idle time.
    pub zero_idle_samples: u64,
    /// Mean CPU busy share while the upload and the download were measured,
    /// percent ([`busy_within`] their windows).
    pub cpu_busy_loaded_pct: (Option<f64>, Option<f64>),
    /// Kernel queueing delay on wan0 during upload, p50 and p99 (ms).
    pub kernel_delay_ms: Option<(f64, f64)>,
    /// Why there is no kernel delay, if there is none.
    pub kernel_delay_missing: Option<String>,
    /// Latency increase under load: the worse direction's median minus the
    /// idle median.
    pub bloat_ms: f64,
    /// [`grade`] of `bloat_ms`.
    pub grade: &'static str,
    /// Latency increase under upload load only: what every state acts on
    /// (some do not shape the download).
    pub upload_bloat_ms: f64,
    /// The state shapes the download too.
    pub download_shaped: bool,
    /// [`grade`] of `upload_bloat_ms`.
    pub upload_grade: &'static str,
}

impl Summary {
    /// CPU percent per Mbit/s of goodput while the upload and the download
    /// were measured, where both are known.
    fn cpu_pct_per_mbps(&self) -> (Option<f64>, Option<f64>) {
        let per =
            |busy_pct: Option<f64>, mbps: f64| busy_pct.filter(|_| mbps > 0.0).map(|b| b / mbps);
        (
            per(self.cpu_busy_loaded_pct.0, self.up_mbps),
            per(self.cpu_busy_loaded_pct.1, self.down_mbps),
        )
    }
}

fn median(v: &[f64]) -> f64 {
    percentile(v, 50.0).unwrap_or(f64::NAN)
}

fn avg(v: &[f64]) -> f64 {
    mean(v).unwrap_or(f64::NAN)
}

impl Summary {
    /// Computes the figures of `s`.
    pub fn of(s: &StateRun) -> Self {
        let idle: Vec<f64> = s
            .idle_before_ms
            .iter()
            .chain(&s.idle_after_ms)
            .copied()
            .collect();
        let ping_idle_ms = median(&idle);
        let up_p50 = median(&s.up.ping_ms);
        let down_p50 = median(&s.down.ping_ms);
        let bloat_ms = (up_p50.max(down_p50) - ping_idle_ms).max(0.0);
        let upload_bloat_ms = (up_p50 - ping_idle_ms).max(0.0);
        let max = |f: fn(&CpuSample) -> f64| s.cpu.iter().map(f).fold(0.0, f64::max);
        let (kernel_delay_ms, kernel_delay_missing) = match &s.up.kernel_delay {
            Ok(d) => (Some((d.p50_ms, d.p99_ms)), None),
            Err(e) => (None, Some(e.clone())),
        };
        Self {
            name: s.name.to_owned(),
            up_mbps: s.up.tcp.receiver_bps / 1e6,
            up_sender_mbps: s.up.tcp.sender_bps / 1e6,
            down_mbps: s.down.tcp.receiver_bps / 1e6,
            down_sender_mbps: s.down.tcp.sender_bps / 1e6,
            up_retransmits: s.up.tcp.retransmits,
            down_retransmits: s.down.tcp.retransmits,
            ping_idle_ms,
            ping_idle_before_avg_ms: avg(&s.idle_before_ms),
            ping_idle_after_avg_ms: avg(&s.idle_after_ms),
            ping_loaded_p50_ms: up_p50,
            ping_loaded_p99_ms: percentile(&s.up.ping_ms, 99.0).unwrap_or(f64::NAN),
            ping_up_avg_ms: avg(&s.up.ping_ms),
            ping_down_p50_ms: down_p50,
            ping_down_avg_ms: avg(&s.down.ping_ms),
            udp_up_loss_pct: s.up.udp.as_ref().map(|u| u.lost_percent),
            cpu_busy_max_pct: max(|c| c.busy_pct),
            cpu_busy_quartiles_pct: {
                let busy: Vec<f64> = s.cpu.iter().map(|c| c.busy_pct).collect();
                let q = |p| percentile(&busy, p).unwrap_or(f64::NAN);
                (q(25.0), q(50.0), q(75.0))
            },
            cpu_softirq_max_pct: max(|c| c.softirq_pct),
            zero_idle_samples: s.cpu.iter().filter(|c| c.zero_idle).count() as u64,
            cpu_busy_loaded_pct: (
                busy_within(&s.cpu, s.up.window_s),
                busy_within(&s.cpu, s.down.window_s),
            ),
            kernel_delay_ms,
            kernel_delay_missing,
            bloat_ms,
            grade: grade(bloat_ms),
            upload_bloat_ms,
            upload_grade: grade(upload_bloat_ms),
            download_shaped: s.download_shaped,
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "up_mbps": self.up_mbps,
            "up_sender_mbps": self.up_sender_mbps,
            "down_mbps": self.down_mbps,
            "down_sender_mbps": self.down_sender_mbps,
            "down_shaped": false,
            "ping_idle_ms": self.ping_idle_ms,
            "ping_loaded_p50_ms": self.ping_loaded_p50_ms,
            "ping_loaded_p99_ms": self.ping_loaded_p99_ms,
            "ping_down_loaded_p50_ms": self.ping_down_p50_ms,
            "udp_up_loss_pct": self.udp_up_loss_pct,
            "cpu_busy_max_pct": self.cpu_busy_max_pct,
            "cpu_busy_p25_pct": self.cpu_busy_quartiles_pct.0,
            "cpu_busy_p50_pct": self.cpu_busy_quartiles_pct.1,
            "cpu_busy_p75_pct": self.cpu_busy_quartiles_pct.2,
            "cpu_softirq_max_pct": self.cpu_softirq_max_pct,
            "zero_idle_samples": self.zero_idle_samples,
            "cpu_busy_up_pct": self.cpu_busy_loaded_pct.0,
            "cpu_busy_down_pct": self.cpu_busy_loaded_pct.1,
            "cpu_pct_per_mbps_up": self.cpu_pct_per_mbps().0,
            "cpu_pct_per_mbps_down": self.cpu_pct_per_mbps().1,
            "retransmits": self.up_retransmits + self.down_retransmits,
            "up_retransmits": self.up_retransmits,
            "down_retransmits": self.down_retransmits,
            "kernel_delay_p50_ms": self.kernel_delay_ms.map(|d| d.0),
            "kernel_delay_p99_ms": self.kernel_delay_ms.map(|d| d.1),
            "kernel_delay_missing": self.kernel_delay_missing,
            "bloat_ms": self.bloat_ms,
            "grade": self.grade,
            "upload_bloat_ms": self.upload_bloat_ms,
            "download_shaped": self.download_shaped,
            "upload_grade": self.upload_grade,
        })
    }
}

fn iperf_json(r: &IperfReport) -> Value {
    json!({
        "receiver_bps": r.receiver_bps,
        "sender_bps": r.sender_bps,
        "stream_bps": r.stream_bps,
        "retransmits": r.retransmits,
        "lost_percent": r.lost_percent,
        "intervals": r.intervals.iter().map(|i| json!({
            "start_s": i.start, "end_s": i.end, "bps": i.bps, "omitted": i.omitted,
        })).collect::<Vec<_>>(),
    })
}

fn phase_json(mode: shaper_common::tins::Diffserv, p: &LoadPhase) -> Value {
    let (queues, tins) = super::breakdown::phase_json(mode, p);
    json!({
        "queues": queues,
        "tins": tins,
        "tcp": iperf_json(&p.tcp),
        "udp_probe": p.udp.as_ref().map(iperf_json),
        "ping_ms": p.ping_ms,
        "window_s": [p.window_s.0, p.window_s.1],
        "kernel_delay": match &p.kernel_delay {
            Ok(d) => d.raw.clone(),
            Err(e) => json!({ "missing": e }),
        },
    })
}

/// The JSON document: `config`, `states` (per name: the summary) and `raw`
/// (per name: every sample).
pub fn to_json(lab: &LabRun) -> Value {
    let c = &lab.config;
    let mut states = serde_json::Map::new();
    let mut raw = serde_json::Map::new();
    for s in &lab.states {
        let mut summary = Summary::of(s).to_json();
        if let Some(h) = &s.hosts {
            summary["hosts"] = hosts_json(h);
        }
        states.insert(s.name.to_owned(), summary);
        raw.insert(
            s.name.to_owned(),
            json!({
                "label": s.label,
                "elapsed_s": s.elapsed_s,
                "ping_idle_before_ms": s.idle_before_ms,
                "ping_idle_after_ms": s.idle_after_ms,
                "upload": phase_json(c.diffserv, &s.up),
                "download": phase_json(c.diffserv, &s.down),
                "staircase": s.staircase.iter().map(|st| json!({
                    "streams": st.streams, "ping_ms": st.ping_ms,
                })).collect::<Vec<_>>(),
                "staircase_flows": s.staircase_flows.iter().map(iperf_json).collect::<Vec<_>>(),
                "hosts": s.hosts.as_ref().map(|h| json!({
                    "up": { "a": iperf_json(&h.up.a), "b": iperf_json(&h.up.b) },
                    "down": { "a": iperf_json(&h.down.a), "b": iperf_json(&h.down.b) },
                })),
                "cpu": s.cpu.iter().map(|x| json!({
                    "t_s": x.t_s, "busy_pct": x.busy_pct,
                    "softirq_pct": x.softirq_pct, "zero_idle": x.zero_idle,
                })).collect::<Vec<_>>(),
            }),
        );
    }
    json!({
        "config": {
            "rate_bps": c.rate.bits_per_s(),
            "rtt_ms": c.rtt.as_secs_f64() * 1e3,
            "link_rate_bps": c.link.map(|l| l.rate_bits_per_s),
            "link_buffer_ms": c.link.map(|l| l.buffer.as_secs_f64() * 1e3),
            "duration_s": c.duration.as_secs_f64(),
            "omit_s": c.omit.as_secs_f64(),
            "streams": c.streams,
            "staircase_steps": c.stair_steps,
            "staircase_step_s": c.stair_step.as_secs_f64(),
            "quick": c.quick,
            "states": c.states.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "queues": c.queues,
            "diffserv": c.diffserv.name(),
            "isolate": c.isolation.keyword(),
            "nat": c.nat,
            "hosts": c.hosts,
        },
        "kernel": lab.kernel,
        "elapsed_s": lab.elapsed_s,
        "download_shaped": lab.states.iter().any(|s| s.download_shaped),
        "states": states,
        "raw": raw,
    })
}

/// The verdict lines: the winner on throughput, loaded latency and CPU,
/// with the margin over the runner-up.
pub fn verdicts(sums: &[Summary]) -> Vec<String> {
    if sums.len() < 2 {
        return vec!["Only one state: nothing to compare.".to_owned()];
    }
    let mut out = Vec::new();
    let shaping: Vec<&Summary> = sums.iter().filter(|s| s.name != "none").collect();
    let all: Vec<&Summary> = sums.iter().collect();
    let mut best =
        |what: &str, among: &[&Summary], key: fn(&Summary) -> f64, higher: bool, unit: &str| {
            let mut v: Vec<&Summary> = among
                .iter()
                .copied()
                .filter(|s| key(s).is_finite())
                .collect();
            v.sort_by(|a, b| key(a).total_cmp(&key(b)));
            if higher {
                v.reverse();
            }
            if let [first, second, ..] = v.as_slice() {
                if key(first) == key(second) {
                    out.push(format!(
                        "- **{what}:** a tie between {} and {} at {:.1} {unit}.",
                        first.name,
                        second.name,
                        key(first)
                    ));
                    return;
                }
                out.push(format!(
                "- **{what}:** {} wins with {:.1} {unit}, {:.1} {unit} {} than {} ({:.1} {unit}).",
                first.name,
                key(first),
                (key(first) - key(second)).abs(),
                if higher { "more" } else { "less" },
                second.name,
                key(second),
            ));
            }
        };
    best("Upload throughput", &all, |s| s.up_mbps, true, "Mbit/s");
    // Unshaped always carries the most; what an operator picks between is
    // the states that shape.
    if shaping.len() >= 2 && shaping.len() < sums.len() {
        best(
            "Upload throughput among the shaping states",
            &shaping,
            |s| s.up_mbps,
            true,
            "Mbit/s",
        );
    }
    best(
        "Loaded latency (ping p50 during upload)",
        &all,
        |s| s.ping_loaded_p50_ms,
        false,
        "ms",
    );
    best(
        "Loaded latency (ping p99 during upload)",
        &all,
        |s| s.ping_loaded_p99_ms,
        false,
        "ms",
    );
    out.push(cpu_verdict(&all));
    out
}

/// CPU per Mbit/s while each direction was measured, with each state's
/// figure over CAKE's when the run has CAKE: the figure that survives
/// emulation, which slows every state alike.
fn cpu_per_mbps_table(m: &mut String, sums: &[Summary]) {
    m.push_str(
        "\n## CPU per Mbit/s under load\n\nMean busy share of all CPUs while each direction \
         was measured, over its goodput; traffic generators included. Under emulation read \
         the ratio to CAKE's, not the value.\n\n| State | Up_busy_percent | \
         Up_percent_per_Mbps | Up_vs_cake | Down_busy_percent | Down_percent_per_Mbps | \
         Down_vs_cake |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let ratio = |mine: Option<f64>, theirs: Option<f64>| match (mine, theirs) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let (cake_up, cake_down) = sums
        .iter()
        .find(|s| s.name == "cake")
        .map_or((None, None), Summary::cpu_pct_per_mbps);
    let fig =
        |v: Option<f64>, digits: usize| v.map_or("–".to_owned(), |x| format!("{x:.digits$}"));
    for s in sums {
        let (up, down) = s.cpu_pct_per_mbps();
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} | {} |",
            s.name,
            fig(s.cpu_busy_loaded_pct.0, 1),
            fig(up, 3),
            fig(ratio(up, cake_up), 2),
            fig(s.cpu_busy_loaded_pct.1, 1),
            fig(down, 3),
            fig(ratio(down, cake_down), 2),
        );
    }
}

/// The CPU verdict: the state with the lowest median busy sample wins only
/// when its samples separate from the runner-up's, its p75 below their p25.
/// Otherwise (under emulation every state pins the CPUs) there is no winner,
/// and the line says so with both ranges.
fn cpu_verdict(all: &[&Summary]) -> String {
    let mut v: Vec<&Summary> = all
        .iter()
        .copied()
        .filter(|s| s.cpu_busy_quartiles_pct.1.is_finite())
        .collect();
    v.sort_by(|a, b| {
        a.cpu_busy_quartiles_pct
            .1
            .total_cmp(&b.cpu_busy_quartiles_pct.1)
    });
    let [first, second, ..] = v.as_slice() else {
        return "- **CPU (busy):** too few samples to compare.".to_owned();
    };
    let (a, b) = (first.cpu_busy_quartiles_pct, second.cpu_busy_quartiles_pct);
    if a.2 < b.0 {
        format!(
            "- **CPU (busy):** {} wins with a median of {:.1} %, {:.1} % less than {} ({:.1} %); \
             their middle halves do not overlap ({:.1}–{:.1} % against {:.1}–{:.1} %).",
            first.name,
            a.1,
            b.1 - a.1,
            second.name,
            b.1,
            a.0,
            a.2,
            b.0,
            b.2
        )
    } else {
        format!(
            "- **CPU (busy):** no winner: the samples of {} ({:.1}–{:.1} %, p25–p75) and {} \
             ({:.1}–{:.1} %) overlap, so the difference is within the noise (under emulation \
             every state pins the CPUs). The bench's CPU per Mbit/s against a paced unshaped \
             run is the figure to compare.",
            first.name, a.0, a.2, second.name, b.0, b.2
        )
    }
}

fn f1(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.1}")
    } else {
        "–".to_owned()
    }
}

/// The Markdown report.
pub fn markdown(lab: &LabRun) -> String {
    let c = &lab.config;
    let sums: Vec<Summary> = lab.states.iter().map(Summary::of).collect();
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# shaper lab: {} at {}, +{} ms RTT{}\n",
        c.states
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", "),
        c.rate,
        c.rtt.as_millis(),
        if c.quick { " (quick)" } else { "" }
    );
    let _ = writeln!(
        m,
        "Kernel {}; {} s of load per direction after {} s omitted, {} streams; {:.0} s in all. \
         {} Every state acts on the router's WAN egress; `cake` (CAKE in ingress mode on an \
         IFB, as sqm-scripts does), `shaper` and `shaper-ifb` (the pacer on an IFB) and \
         `shaper-police` (the AQM policer) also shape the download at the WAN ingress \
         (`shaper-egress` does not), and the download rows say which are shaped. \
         CPU is the whole machine's (the namespaces share it, traffic generators included).\n",
        lab.kernel,
        c.duration.as_secs(),
        c.omit.as_secs(),
        c.streams,
        lab.elapsed_s,
        match c.link {
            Some(l) => format!(
                "Beyond the NAT router, an emulated access link of {:.1} Mbit/s each way with \
                 a {} ms FIFO (TBF) is the bottleneck the states shape below.",
                l.rate_bits_per_s as f64 / 1e6,
                l.buffer.as_millis()
            ),
            None => "No access link is emulated (--link-buffer 0ms): the path has no \
                     bottleneck but the states themselves."
                .to_owned(),
        }
    );
    m.push_str("## Throughput\n\n| State | Direction | Receiver_Mbps | Sender_Mbps | Retransmits |\n|---|---|---:|---:|---:|\n");
    for s in &sums {
        let _ = writeln!(
            m,
            "| {} | upload (client to server) | {:.3} | {:.3} | {} |",
            s.name, s.up_mbps, s.up_sender_mbps, s.up_retransmits
        );
        let _ = writeln!(
            m,
            "| {} | download (server to client, {}) | {:.3} | {:.3} | {} |",
            s.name,
            if s.download_shaped {
                "shaped"
            } else {
                "not shaped"
            },
            s.down_mbps,
            s.down_sender_mbps,
            s.down_retransmits
        );
    }
    m.push_str("\n## Ping idle and loaded\n\n| State | Phase | Avg_ms | p50_ms | p99_ms |\n|---|---|---:|---:|---:|\n");
    for (s, r) in sums.iter().zip(&lab.states) {
        let row = |phase: &str, v: &[f64]| {
            format!(
                "| {} | {phase} | {} | {} | {} |\n",
                s.name,
                f1(avg(v)),
                f1(median(v)),
                f1(percentile(v, 99.0).unwrap_or(f64::NAN))
            )
        };
        m.push_str(&row("idle before", &r.idle_before_ms));
        m.push_str(&row("upload loaded", &r.up.ping_ms));
        m.push_str(&row("download loaded", &r.down.ping_ms));
        m.push_str(&row("idle after", &r.idle_after_ms));
    }
    m.push_str("\n## UDP probe during upload\n\nA 1 Mbit/s iperf3 UDP flow from the second client beside the bulk upload: what a call or a game would lose.\n\n| State | Loss_percent |\n|---|---:|\n");
    for s in &sums {
        let loss = s
            .udp_up_loss_pct
            .map_or_else(|| "–".to_owned(), |l| format!("{l:.2}"));
        let _ = writeln!(m, "| {} | {loss} |", s.name);
    }
    m.push_str("\n## Kernel queueing delay on the WAN egress (upload, `shaper trace`)\n\n| State | Sojourn_p50_ms | Sojourn_p99_ms | Ping_loaded_p50_ms |\n|---|---:|---:|---:|\n");
    for s in &sums {
        let (a, b) = match (s.kernel_delay_ms, &s.kernel_delay_missing) {
            (Some((p50, p99)), _) => (format!("{p50:.2}"), format!("{p99:.2}")),
            (None, Some(why)) => (format!("– ({why})"), "–".to_owned()),
            (None, None) => ("–".to_owned(), "–".to_owned()),
        };
        let _ = writeln!(
            m,
            "| {} | {a} | {b} | {} |",
            s.name,
            f1(s.ping_loaded_p50_ms)
        );
    }
    m.push_str("\n## Router CPU\n\n| State | Highest_sampled_busy_percent | Highest_softirq_percent | Zero_idle_samples |\n|---|---:|---:|---:|\n");
    for s in &sums {
        let _ = writeln!(
            m,
            "| {} | {:.0} | {:.0} | {} |",
            s.name, s.cpu_busy_max_pct, s.cpu_softirq_max_pct, s.zero_idle_samples
        );
    }
    cpu_per_mbps_table(&mut m, &sums);
    m.push_str("\n## Bufferbloat grade\n\nLatency increase = a loaded median minus the idle median; grades on the Waveform test's scale (A+ < 5 ms, A < 30, B < 60, C < 200, D < 400, F). The upload grade is what the state on the WAN egress earns; the overall grade takes the worse direction.\n\n| State | Idle_median_ms | Upload_loaded_median_ms | Download_loaded_median_ms | Upload_increase_ms | Upload_grade | Increase_ms | Grade |\n|---|---:|---:|---:|---:|---|---:|---|\n");
    for s in &sums {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            s.name,
            f1(s.ping_idle_ms),
            f1(s.ping_loaded_p50_ms),
            f1(s.ping_down_p50_ms),
            f1(s.upload_bloat_ms),
            s.upload_grade,
            f1(s.bloat_ms),
            s.grade
        );
    }
    m.push_str("\n## Staircase (one stream added every step)\n\n| State |");
    let steps = lab.states.first().map_or(0, |s| s.staircase.len());
    for k in 1..=steps {
        let _ = write!(m, " {k}_streams_p50_ms |");
    }
    m.push_str("\n|---|");
    m.push_str(&"---:|".repeat(steps));
    m.push('\n');
    for s in &lab.states {
        let _ = write!(m, "| {} |", s.name);
        for st in &s.staircase {
            let _ = write!(m, " {} |", f1(median(&st.ping_ms)));
        }
        m.push('\n');
    }
    m.push_str(&super::breakdown::markdown(lab));
    m.push_str(&hosts_markdown(lab));
    m.push_str("\n## Verdict\n\n");
    for v in verdicts(&sums) {
        m.push_str(&v);
        m.push('\n');
    }
    m.push_str("\nPlots (with --report): throughput.svg, latency_cdf.svg, staircase.svg.\n");
    m
}

/// The report's section: host B's share per state, or nothing without the
/// phase.
fn hosts_markdown(lab: &LabRun) -> String {
    let mut m = String::new();
    if lab.states.iter().all(|s| s.hosts.is_none()) {
        return m;
    }
    let _ = writeln!(
        m,
        "\n## Hosts (host A with {A_FLOWS} TCP flows, host B with 1)\n\nHost B's share of what \
         both hosts carried: a half is fair between hosts, 1/{} between flows. The download \
         is shaped only by the states that shape it.\n\n| State | Upload_B_share | \
         Upload_Mbps | Download_B_share | Download_Mbps |\n|---|---:|---:|---:|---:|",
        A_FLOWS + 1
    );
    for s in &lab.states {
        if let Some(h) = &s.hosts {
            let _ = writeln!(
                m,
                "| {} | {:.3} | {:.1} | {:.3} | {:.1} |",
                s.name,
                h.up.b_share(),
                h.up.total_bps() / 1e6,
                h.down.b_share(),
                h.down.total_bps() / 1e6
            );
        }
    }
    m
}

/// The JSON of one state's phase.
fn hosts_json(h: &HostsRun) -> Value {
    json!({
        "up_host_b_share": h.up.b_share(),
        "up_mbps": h.up.total_bps() / 1e6,
        "down_host_b_share": h.down.b_share(),
        "down_mbps": h.down.total_bps() / 1e6,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grades_follow_the_waveform_scale() {
        let got: Vec<&str> = [
            0.0, 4.9, 5.0, 29.9, 30.0, 59.0, 60.0, 199.0, 200.0, 399.0, 400.0,
        ]
        .into_iter()
        .map(grade)
        .collect();
        assert_eq!(
            got,
            ["A+", "A+", "A", "A", "B", "B", "C", "C", "D", "D", "F"]
        );
    }

    fn sum(name: &str, up: f64, p50: f64, cpu: f64) -> Summary {
        Summary {
            name: name.to_owned(),
            up_mbps: up,
            up_sender_mbps: up,
            down_mbps: 0.0,
            down_sender_mbps: 0.0,
            up_retransmits: 0,
            down_retransmits: 0,
            ping_idle_ms: 20.0,
            ping_idle_before_avg_ms: 20.0,
            ping_idle_after_avg_ms: 20.0,
            ping_loaded_p50_ms: p50,
            ping_loaded_p99_ms: p50 * 2.0,
            ping_up_avg_ms: p50,
            ping_down_p50_ms: 20.0,
            ping_down_avg_ms: 20.0,
            udp_up_loss_pct: None,
            cpu_busy_max_pct: cpu,
            cpu_busy_quartiles_pct: (cpu - 2.0, cpu, cpu + 2.0),
            cpu_softirq_max_pct: 0.0,
            zero_idle_samples: 0,
            cpu_busy_loaded_pct: (Some(cpu), None),
            kernel_delay_ms: None,
            kernel_delay_missing: None,
            bloat_ms: p50 - 20.0,
            grade: grade(p50 - 20.0),
            upload_bloat_ms: p50 - 20.0,
            upload_grade: grade(p50 - 20.0),
            download_shaped: false,
        }
    }

    #[test]
    fn verdicts_name_the_winner_and_the_margin() {
        let v = verdicts(&[
            sum("none", 900.0, 300.0, 50.0),
            sum("cake", 47.0, 22.0, 60.0),
            sum("shaper", 48.0, 21.0, 40.0),
        ]);
        assert!(
            v[0].contains("none wins with 900.0 Mbit/s, 852.0 Mbit/s more than shaper"),
            "{v:?}"
        );
        assert!(
            v[1].contains("among the shaping states:** shaper wins with 48.0 Mbit/s, 1.0 Mbit/s more than cake"),
            "{v:?}"
        );
        assert!(
            v[2].contains("shaper wins with 21.0 ms, 1.0 ms less than cake"),
            "{v:?}"
        );
        assert!(
            v[4].contains("shaper wins with a median of 40.0 %, 10.0 % less than none"),
            "{v:?}"
        );
        let tie = verdicts(&[sum("none", 1.0, 1.0, 100.0), sum("cake", 1.0, 1.0, 100.0)]);
        assert!(tie[3].contains("no winner"), "{tie:?}");
        // Medians 3 points apart with spreads of 2 each way overlap: no winner.
        let close = verdicts(&[sum("cake", 1.0, 1.0, 97.0), sum("shaper", 1.0, 2.0, 100.0)]);
        assert!(
            close[3].contains("no winner") && close[3].contains("overlap"),
            "{close:?}"
        );
        assert_eq!(verdicts(&[sum("none", 1.0, 1.0, 1.0)]).len(), 1);
    }

    #[test]
    fn cpu_per_mbps_is_set_against_cakes() {
        let mut m = String::new();
        cpu_per_mbps_table(
            &mut m,
            &[
                sum("cake", 40.0, 22.0, 60.0),
                sum("shaper", 48.0, 21.0, 36.0),
            ],
        );
        // cake 60/40 = 1.5 %/Mbit/s; shaper 36/48 = 0.75, half of it. The
        // download had no loaded samples: a dash, not a figure.
        assert!(
            m.contains("| cake | 60.0 | 1.500 | 1.00 | – | – | – |"),
            "{m}"
        );
        assert!(
            m.contains("| shaper | 36.0 | 0.750 | 0.50 | – | – | – |"),
            "{m}"
        );
    }
}
