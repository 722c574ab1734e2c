//! `shaper lab`: one method run for every state on the lab's testbed, so
//! the states are compared on the same traffic.
//!
//! Per state, with the state applied once on the router's WAN egress:
//! 1. 15 idle pings (0.2 s apart);
//! 2. upload: iperf3, 4 TCP streams client → server, the warm-up omitted,
//!    with ping every 50 ms, a 1 Mbit/s UDP probe from the second client,
//!    and `shaper trace` on `wan0` for the kernel's queueing delay; what
//!    each TX queue and each tin carried, from the qdisc tree's and the
//!    shaper's counters before and after;
//! 3. download: the same reversed (`-R`), shaped by the states that shape
//!    the WAN ingress too (CAKE on an IFB, `shaper-police`, `shaper-ifb`);
//! 4. the staircase: a stream added every 5 s, pinging;
//! 5. with `--hosts`, host A's 8 TCP flows beside host B's 1, upload then
//!    download (`super::hosts`);
//! 6. 15 idle pings again.
//!
//! With `--queues N` the WAN device has N TX queues and each flow takes
//! the one its hash picks. With `--diffserv`, the states that have tins
//! run them, and the pings and the UDP probe carry DSCP EF.
//!
//! A CPU sampler reads /proc/stat every second throughout. The namespaces
//! share one kernel, so "router CPU" is the whole machine's: what the
//! forwarding, the state and the traffic generators cost together.
//!
//! Invariants: bad input is refused before the testbed exists
//! ([`LabConfig::from_args`]); the testbed's namespaces are removed on every
//! exit path, including SIGINT/SIGTERM: a handler sets a flag, the run stops
//! at the next step, and the owned values drop (children in the terminal's
//! process group get the SIGINT themselves and end their step early).
//!
//! Units: ms for RTTs and kernel delays, Mbit/s in the report, bit/s in
//! [`IperfReport`].

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{JoinHandle, sleep},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{
    cli::{LabArgs, LabConfig, LabUsageError, StateKind},
    cpu::CpuTimes,
    measured::{CpuSample, KernelDelay, LabRun, LoadPhase, StairStep, StateRun},
    ping::Ping,
    readings::{QdiscStats, TinStats},
    report,
    state::AppliedState,
    topology::{Host, Testbed, TestbedOptions},
    traffic::{FlowSpec, IperfClient, IperfReport, IperfServer, Timing},
};
use crate::rate::Rate;

/// Set by the SIGINT/SIGTERM handler.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// `shaper lab`.
pub fn run(args: LabArgs) -> Result<()> {
    let path = std::env::var("PATH").unwrap_or_default();
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let config = LabConfig::from_args(args, &path, root)?;
    // The probe adds the qdisc to `lo` in a private namespace of its own.
    if let Some((kind, needed_by)) =
        crate::tc::first_missing_qdisc(config.needed_qdiscs(), |(kind, _)| kind)
    {
        let fix = if kind == "netem" {
            "give --rtt 0ms"
        } else if kind == "tbf" {
            "give --link-buffer 0ms"
        } else {
            "leave that state out of --states"
        };
        return Err(LabUsageError::MissingQdisc {
            kind,
            needed_by,
            fix,
        }
        .into());
    }
    // Without TCX, shaper and shaper-ifb feed their IFB with tc's matchall
    // + mirred.
    if config
        .states
        .iter()
        .any(|k| matches!(k, StateKind::Shaper | StateKind::ShaperIfb))
        && !crate::checks::kernel_has_tcx()
        && !crate::tc::probe_mirred().unwrap_or(false)
    {
        return Err(LabUsageError::Invalid {
            flag: "--states",
            detail: "states shaper and shaper-ifb need, on a kernel without TCX, tc's matchall \
                     filter and mirred action (`modprobe cls_matchall act_mirred`): load them, \
                     leave the states out (shaper-police shapes the download without them), or \
                     run the lab in the VM (`cargo xtask lab`)"
                .to_owned(),
        }
        .into());
    }
    if let Some(dir) = &config.report {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the report directory {}", dir.display()))?;
    }
    install_interrupt_handler()?;
    let lab = run_lab(config)?;
    let json = report::to_json(&lab);
    if let Some(file) = &lab.config.json {
        write(file, &serde_json::to_string_pretty(&json)?)?;
        progress(&format!("JSON written to {}", file.display()));
    }
    let md = report::markdown(&lab);
    if let Some(dir) = &lab.config.report {
        write(&dir.join("report.md"), &md)?;
        for (name, svg) in super::plot::all(&lab)? {
            write(&dir.join(name), &svg)?;
        }
        progress(&format!("report written to {}", dir.display()));
    }
    println!("{md}");
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A progress line on stderr.
fn progress(line: &str) {
    eprintln!("lab: {line}");
}

/// Stops the run at the next step on SIGINT or SIGTERM (the default action
/// would skip the destructors that remove the namespaces).
fn install_interrupt_handler() -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal runtime")?;
    let (mut int, mut term) = rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        anyhow::Ok((
            signal(SignalKind::interrupt()).context("SIGINT handler")?,
            signal(SignalKind::terminate()).context("SIGTERM handler")?,
        ))
    })?;
    std::thread::spawn(move || {
        rt.block_on(async {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        });
        INTERRUPTED.store(true, Ordering::SeqCst);
        progress("interrupted: stopping after this step and removing the namespaces");
    });
    Ok(())
}

fn check_interrupt() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted; the lab's namespaces were removed");
    }
    Ok(())
}

/// Builds the testbed and measures every state.
pub fn run_lab(config: LabConfig) -> Result<LabRun> {
    let start = Instant::now();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    progress(&format!(
        "building the testbed (client, NAT router, server; +{} ms RTT on the WAN side)",
        config.rtt.as_millis()
    ));
    let tb = Testbed::new(TestbedOptions {
        client_delay: Duration::ZERO,
        client2_delay: Duration::ZERO,
        wan_delay: config.rtt,
        nat: true,
        wan_link: config.link,
        wan_queues: config.queues,
        ..TestbedOptions::default()
    })
    .context("building the lab testbed")?;
    let mut states = Vec::new();
    let n = config.states.len();
    for (i, kind) in config.states.iter().enumerate() {
        check_interrupt()?;
        let t = Instant::now();
        let r = run_state(
            &tb,
            &config,
            *kind,
            &format!("[{}/{n}] {}", i + 1, kind.name()),
        )
        .with_context(|| format!("state {}", kind.name()))?;
        progress(&format!(
            "[{}/{n}] {} done in {:.0} s: up {:.1} Mbit/s, down {:.1} Mbit/s, loaded ping p50 {:.1} ms",
            i + 1,
            kind.name(),
            t.elapsed().as_secs_f64(),
            r.up.tcp.receiver_bps / 1e6,
            r.down.tcp.receiver_bps / 1e6,
            super::stats::percentile(&r.up.ping_ms, 50.0).unwrap_or(f64::NAN),
        ));
        states.push(r);
    }
    drop(tb);
    Ok(LabRun {
        config,
        states,
        kernel,
        elapsed_s: start.elapsed().as_secs_f64(),
    })
}

fn idle_pings(tb: &Testbed) -> Result<Vec<f64>> {
    // 15 pings 0.2 s apart: ping -w 3 sends at 0, 0.2, ..., 2.8 s.
    Ok(Ping::spawn(
        tb,
        Host::Client,
        Host::Server.addr(),
        Duration::from_millis(200),
        Duration::ZERO,
        Duration::from_secs(3),
    )
    .wait()?)
}

fn run_state(tb: &Testbed, c: &LabConfig, kind: StateKind, tag: &str) -> Result<StateRun> {
    let state = c.state(kind);
    let t0 = Instant::now();
    progress(&format!("{tag}: applying {}", state.name()));
    let applied = state.apply(tb)?;
    let tail = c
        .show_shaper
        .then(|| applied.shaper_log())
        .flatten()
        .map(LogTail::start);
    let sampler = CpuSampler::start();
    progress(&format!("{tag}: 15 idle pings"));
    let idle_before_ms = idle_pings(tb)?;
    check_interrupt()?;
    progress(&format!(
        "{tag}: upload, {} streams, {} s (+{} s warm-up), ping, UDP probe, kernel tracer",
        c.streams,
        c.duration.as_secs(),
        c.omit.as_secs()
    ));
    let up = load_phase(tb, c, &applied, false, sampler.t0)?;
    check_interrupt()?;
    progress(&format!(
        "{tag}: download ({}), {} streams, {} s",
        if kind.shapes_download() {
            "shaped at the WAN ingress"
        } else {
            "not shaped by this state"
        },
        c.streams,
        c.duration.as_secs()
    ));
    let down = load_phase(tb, c, &applied, true, sampler.t0)?;
    check_interrupt()?;
    progress(&format!(
        "{tag}: staircase, 1 to {} streams, one more every {} s",
        c.stair_steps,
        c.stair_step.as_secs()
    ));
    let (staircase, staircase_flows) = staircase(tb, c, tag)?;
    check_interrupt()?;
    let hosts = if c.hosts {
        let timing = Timing::new(c.duration, c.omit);
        progress(&format!(
            "{tag}: hosts, {} TCP flows from the client beside 1 from the second, upload",
            super::hosts::A_FLOWS
        ));
        let up = super::hosts::phase(tb, &timing, false)?;
        check_interrupt()?;
        progress(&format!("{tag}: hosts, download"));
        let down = super::hosts::phase(tb, &timing, true)?;
        check_interrupt()?;
        Some(super::hosts::HostsRun { up, down })
    } else {
        None
    };
    progress(&format!("{tag}: 15 idle pings"));
    let idle_after_ms = idle_pings(tb)?;
    let cpu = sampler.stop();
    if let Some(t) = tail {
        t.stop();
    }
    applied.stop()?;
    Ok(StateRun {
        name: kind.name(),
        label: state.name(),
        idle_before_ms,
        idle_after_ms,
        up,
        down,
        download_shaped: kind.shapes_download(),
        staircase,
        staircase_flows,
        hosts,
        cpu,
        elapsed_s: t0.elapsed().as_secs_f64(),
    })
}

/// Bulk streams one way with ping, a UDP probe and (upload) the tracer,
/// and (upload) what each queue and tin carried.
/// One direction under load; `clock` is the CPU sampler's start, the time
/// base of the phase's window.
fn load_phase(
    tb: &Testbed,
    c: &LabConfig,
    applied: &AppliedState<'_>,
    reverse: bool,
    clock: Instant,
) -> Result<LoadPhase> {
    let timing = Timing::new(c.duration, c.omit);
    let tcp_server = IperfServer::start(tb, Host::Server, 5201)?;
    let udp_server = IperfServer::start(tb, Host::Server, 5202)?;
    let mut tcp = FlowSpec::tcp(Host::Client, c.streams);
    let probe_rate = Rate::from_bits_per_s(1_000_000).context("the probe rate")?;
    let mut udp = FlowSpec::udp(Host::Client2, probe_rate);
    if let Some(tos) = c.probe_tos() {
        udp = udp.with_tos(tos);
    }
    if reverse {
        tcp = tcp.reversed();
        udp = udp.reversed();
    }
    let tracer = (!reverse).then(|| spawn_tracer(tb, c));
    let before = (!reverse).then(|| Readings::take(applied));
    let started_s = clock.elapsed().as_secs_f64();
    let window_s = (
        started_s + c.omit.as_secs_f64(),
        started_s + (c.omit + c.duration).as_secs_f64(),
    );
    let tcp_client = IperfClient::spawn(tb, &tcp, &tcp_server, &timing)?;
    let udp_client = IperfClient::spawn(tb, &udp, &udp_server, &timing)?;
    let ping = Ping::spawn_marked(
        tb,
        Host::Client,
        Host::Server.addr(),
        (Duration::from_millis(50), c.omit, c.duration),
        c.probe_tos(),
    );
    let tcp = tcp_client.wait()?;
    let (queues, tins) = before
        .map(|b| b.carried(&Readings::take(applied)))
        .unwrap_or_default();
    let udp = udp_client.wait().ok();
    let ping_ms = ping.wait()?;
    let kernel_delay = match tracer {
        Some(t) => t
            .join()
            .unwrap_or_else(|_| Err("the tracer thread panicked".to_owned())),
        None => Err("not traced (download is not shaped)".to_owned()),
    };
    Ok(LoadPhase {
        tcp,
        udp,
        ping_ms,
        kernel_delay,
        queues,
        tins,
        window_s,
    })
}

/// The WAN qdisc tree's and the shaper's counters at one moment; either
/// may be missing (no shaper, or a read that failed, which leaves the
/// phase without the figures rather than failing it).
struct Readings {
    qdisc: Option<QdiscStats>,
    counters: Option<std::collections::BTreeMap<String, u64>>,
}

impl Readings {
    fn take(applied: &AppliedState<'_>) -> Self {
        Self {
            qdisc: applied.qdisc_stats().ok(),
            counters: applied.counters().ok(),
        }
    }

    /// What each queue and each tin carried from `self` to `after`: the
    /// shaper's tins where it runs them, else CAKE's.
    fn carried(self, after: &Readings) -> (Vec<super::QueueStats>, Vec<TinStats>) {
        let qdisc = after
            .qdisc
            .clone()
            .map(|q| q.since(self.qdisc.as_ref()))
            .unwrap_or_default();
        let shaper_tins = match (&self.counters, &after.counters) {
            (Some(b), Some(a)) => TinStats::between(b, a),
            _ => Vec::new(),
        };
        let tins = if shaper_tins.is_empty() {
            qdisc.tins
        } else {
            shaper_tins
        };
        (qdisc.queues, tins)
    }
}

/// `shaper trace --iface wan0 --json` in the router over the measured time,
/// on its own thread; its summary record's sojourn percentiles.
fn spawn_tracer(tb: &Testbed, c: &LabConfig) -> JoinHandle<Result<KernelDelay, String>> {
    let mut cmd = tb.command(Host::Router, &c.shaper_bin.display().to_string());
    cmd.args(["trace", "--iface", tb.wan_dev(), "--json", "--duration"])
        .arg(format!("{}ms", c.duration.as_millis()));
    let omit = c.omit;
    std::thread::spawn(move || {
        sleep(omit);
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run shaper trace: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "shaper trace failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        parse_trace_summary(&text)
    })
}

/// The last `"kind":"summary"` record of `shaper trace --json` output.
pub fn parse_trace_summary(text: &str) -> Result<KernelDelay, String> {
    let v = text
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("kind").and_then(Value::as_str) == Some("summary"))
        .ok_or("no summary record in shaper trace's output")?;
    let ns = |k: &str| {
        v.get(k)
            .and_then(Value::as_u64)
            .ok_or(format!("no {k} in the tracer's summary"))
    };
    let packets = v.get("packets").and_then(Value::as_u64).unwrap_or(0);
    if packets == 0 {
        // With noqueue (state none) nothing is enqueued to a qdisc.
        return Err("no packet was queued in a qdisc (noqueue)".to_owned());
    }
    Ok(KernelDelay {
        p50_ms: ns("delay_p50_ns")? as f64 / 1e6,
        p99_ms: ns("delay_p99_ns")? as f64 / 1e6,
        packets,
        raw: v,
    })
}

/// The staircase: stream k starts at k steps and runs to the end;
/// ping runs during each step.
fn staircase(tb: &Testbed, c: &LabConfig, tag: &str) -> Result<(Vec<StairStep>, Vec<IperfReport>)> {
    let n = c.stair_steps;
    let servers = (0..n)
        .map(|k| {
            let port = 5301 + u16::try_from(k).context("too many staircase steps")?;
            Ok(IperfServer::start(tb, Host::Server, port)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut clients = Vec::new();
    let mut steps = Vec::new();
    let spec = FlowSpec::tcp(Host::Client, 1);
    for (k, server) in (0..n).zip(&servers) {
        check_interrupt()?;
        let timing = Timing::new(c.stair_step * (n - k), Duration::ZERO);
        clients.push(IperfClient::spawn(tb, &spec, server, &timing)?);
        let ping_ms = Ping::spawn(
            tb,
            Host::Client,
            Host::Server.addr(),
            Duration::from_millis(100),
            Duration::ZERO,
            c.stair_step,
        )
        .wait()?;
        progress(&format!(
            "{tag}: staircase {} stream(s): ping p50 {:.1} ms",
            k + 1,
            super::stats::percentile(&ping_ms, 50.0).unwrap_or(f64::NAN)
        ));
        steps.push(StairStep {
            streams: k + 1,
            ping_ms,
        });
    }
    let reports = clients
        .into_iter()
        .map(IperfClient::wait)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((steps, reports))
}

/// Samples /proc/stat every second on its own thread.
struct CpuSampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<CpuSample>>,
    /// The samples' time base.
    t0: Instant,
}

impl CpuSampler {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let t0 = Instant::now();
        let handle = std::thread::spawn(move || {
            let mut samples = Vec::new();
            let Ok(mut prev) = CpuTimes::now() else {
                return samples;
            };
            while !flag.load(Ordering::Relaxed) {
                sleep(Duration::from_secs(1));
                let Ok(now) = CpuTimes::now() else {
                    continue;
                };
                if let Some(s) = cpu_sample(&prev, &now, t0.elapsed().as_secs_f64()) {
                    samples.push(s);
                }
                prev = now;
            }
            samples
        });
        Self { stop, handle, t0 }
    }

    fn stop(self) -> Vec<CpuSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// Copies the lines a file gains to stderr, prefixed, every 0.5 s.
struct LogTail {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

impl LogTail {
    fn start(path: std::path::PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let mut shown = 0;
            loop {
                let done = flag.load(Ordering::Relaxed);
                let text = std::fs::read(&path).unwrap_or_default();
                // Only whole lines; the rest waits for the next round.
                if let Some(end) = text.iter().rposition(|&b| b == b'\n')
                    && end + 1 > shown
                {
                    for line in String::from_utf8_lossy(&text[shown..=end]).lines() {
                        eprintln!("  shaper | {line}");
                    }
                    shown = end + 1;
                }
                if done {
                    break;
                }
                sleep(Duration::from_millis(500));
            }
        });
        Self { stop, handle }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.handle.join();
    }
}

/// The sample between two /proc/stat readings (`None` if no time passed).
pub fn cpu_sample(before: &CpuTimes, after: &CpuTimes, t_s: f64) -> Option<CpuSample> {
    let total = after.total().saturating_sub(before.total());
    if total == 0 {
        return None;
    }
    let idle = (after.idle + after.iowait).saturating_sub(before.idle + before.iowait);
    let pct = |x: u64| 100.0 * x as f64 / total as f64;
    Some(CpuSample {
        t_s,
        busy_pct: 100.0 - pct(idle),
        softirq_pct: pct(after.softirq.saturating_sub(before.softirq)),
        zero_idle: idle == 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_summary_is_the_last_summary_record() {
        let out = r#"{"kind":"flow","delay_p50_ns":1}
{"kind":"summary","packets":42,"delay_p50_ns":2500000,"delay_p99_ns":9000000}
"#;
        let d = parse_trace_summary(out).expect("parses");
        assert_eq!((d.p50_ms, d.p99_ms, d.packets), (2.5, 9.0, 42));
        assert!(parse_trace_summary("summary wan0 over 2s").is_err());
        let none = r#"{"kind":"summary","packets":0,"delay_p50_ns":0,"delay_p99_ns":0}"#;
        assert!(
            parse_trace_summary(none)
                .expect_err("nothing queued")
                .contains("noqueue")
        );
    }

    #[test]
    fn cpu_samples_count_zero_idle() {
        let a = CpuTimes::parse("cpu 100 0 100 100 0 0 0 0\n").expect("parses");
        let b = CpuTimes::parse("cpu 150 0 130 100 0 0 20 0\n").expect("parses");
        let s = cpu_sample(&a, &b, 1.0).expect("time passed");
        assert!((s.busy_pct - 100.0).abs() < 1e-9 && s.zero_idle, "{s:?}");
        assert!((s.softirq_pct - 20.0).abs() < 1e-9, "{s:?}");
        let c = CpuTimes::parse("cpu 150 0 130 200 0 0 20 0\n").expect("parses");
        let s = cpu_sample(&b, &c, 2.0).expect("time passed");
        assert!(!s.zero_idle && s.busy_pct.abs() < 1e-9, "{s:?}");
        assert!(cpu_sample(&a, &a, 0.0).is_none());
    }
}
