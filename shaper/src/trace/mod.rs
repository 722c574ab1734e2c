//! `shaper trace`: measures, in the kernel, the time each packet spends
//! between a successful qdisc enqueue and its hand-off to the driver on one
//! interface, for any root qdisc, with or without the pacer attached.
//!
//! Steps, in order; nothing is attached before every check passed:
//! 1. privileges, the interface, the kernel's BTF and its raw tracepoints
//!    `qdisc_enqueue` and `net_dev_start_xmit` (`btf_trace_*` typedefs);
//! 2. struct offsets resolved from the running kernel's BTF (`crate::btf`),
//!    or from the BTF file `--btf` names, into `TRACE_CONFIG`;
//! 3. load the object's two tracer programs only (the pacer's flow table
//!    and ring buffer shrunk to the minimum), attach both;
//! 4. read the ring buffer (`reader`), aggregate with the project's
//!    telemetry `FlowTable`, print (`report`) each second until
//!    `--duration` ends or SIGINT/SIGTERM, then every flow and the summary.
//!
//! Dropping the loaded object detaches the programs (aya's links are owned
//! by it), also on an error path.
//!
//! Units: ns inside, ms in text output.
//!
//! Non-goals: changing the interface in any way; tracing more than one
//! interface per process.

pub mod report;

use std::{
    io::Write,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::{ProgramError, RawTracePoint},
};
use clap::Args;
use shaper_common::trace::{TraceConfig, TraceCounter, names};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{debug, info, warn};

use crate::{
    btf::{Btf, BtfError},
    checks::Capabilities,
    counters::TraceSnapshot,
    link::link_by_name,
    telemetry::{
        FlowTable, FlowTableOptions, Output, Pipeline, PipelineOptions, pipeline::CounterSource,
    },
};
use report::Counters;

/// Stamps older than this are stale (an skb freed in the qdisc and its
/// address reused). Ten seconds is beyond any sane qdisc delay (sch_fq's
/// horizon defaults to 10 s).
pub const MAX_DELAY_NS: u64 = 10_000_000_000;
/// Enqueue stamps held at once: packets queued on the interface at a time.
const STAMP_ENTRIES: u32 = 65_536;
/// The smallest ring buffer, for the pacer's unused one (aya rounds a ring
/// buffer up to whole pages, a power of two of them).
const PAGE_BYTES: u32 = 4096;
/// Ring buffer size: about 50,000 records of 80 bytes.
const RING_BYTES: u32 = 4 << 20;

/// Arguments of `shaper trace`.
#[derive(Debug, Args)]
#[command(after_help = crate::duration::DURATION_HELP)]
pub struct TraceArgs {
    /// Interface whose qdisc sojourn to measure.
    #[arg(long, value_name = "IF")]
    pub iface: String,
    /// Stop after this long: seconds (`10`) or a duration (`10s`, `500ms`).
    /// Without it, run until SIGINT or SIGTERM.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_run_duration)]
    pub duration: Option<Duration>,
    /// Newline-delimited JSON records instead of text.
    #[arg(long)]
    pub json: bool,
    /// Serve Prometheus metrics over HTTP (default 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:9464")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Flows shown in the live view and exported per flow.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Read the kernel's struct offsets from this BTF file instead of
    /// /sys/kernel/btf/vmlinux: for a kernel built without
    /// CONFIG_DEBUG_INFO_BTF (OpenWrt's stock kernels), the BTF of that
    /// same build, e.g. from `pahole --btf_encode_detached FILE vmlinux`
    /// on its vmlinux with debug info. BTF of another build gives wrong
    /// offsets and wrong figures.
    #[arg(long, value_name = "FILE")]
    pub btf: Option<PathBuf>,
}

/// Usage errors of `shaper trace` (exit 2; nothing attached).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading or using the kernel's BTF failed.
    #[error("the tracer cannot resolve kernel struct offsets")]
    Btf(#[from] BtfError),
    /// The kernel lacks a tracepoint the tracer needs.
    #[error(
        "this kernel ({release}) has no raw tracepoint '{tracepoint}': the tracer needs \
         Linux 5.14 or later (qdisc_enqueue) with CONFIG_NET_SCHED and tracepoints enabled"
    )]
    NoTracepoint {
        /// The tracepoint.
        tracepoint: &'static str,
        /// `uname -r`.
        release: String,
    },
    /// A struct member has an unexpected size in BTF.
    #[error(
        "{what} is {got} bytes in this kernel's BTF, the tracer expects {want}: this kernel \
         is not supported by `shaper trace`"
    )]
    Layout {
        /// `struct.member`.
        what: String,
        /// Its size.
        got: u32,
        /// The size the programs read.
        want: u32,
    },
}

/// Fills a `TraceConfig` for `ifindex` from `btf`.
pub fn resolve_config(btf: &Btf, ifindex: u32, netns_ino: u32) -> Result<TraceConfig, TraceError> {
    let off = |s: &str, m: &str, want: u32| -> Result<u16, TraceError> {
        let member = btf.member(s, m)?;
        if member.size_bytes != want {
            return Err(TraceError::Layout {
                what: format!("{s}.{m}"),
                got: member.size_bytes,
                want,
            });
        }
        u16::try_from(member.offset_bytes).map_err(|_| {
            TraceError::Btf(BtfError::Malformed {
                detail: format!("{s}.{m} at offset {} is beyond 64 KiB", member.offset_bytes),
            })
        })
    };
    // The netns guard is optional: a kernel without CONFIG_NET_NS has no
    // `struct net` member to read; then only the ifindex is matched.
    let netns = (|| -> Result<(u16, u16), TraceError> {
        let nd_net = off("net_device", "nd_net", 8)?;
        let ns = btf.member("net", "ns")?.offset_bytes;
        let inum = btf.member("ns_common", "inum")?.offset_bytes;
        let sum = u16::try_from(ns + inum).map_err(|_| {
            TraceError::Btf(BtfError::Malformed {
                detail: "net.ns.inum beyond 64 KiB".into(),
            })
        })?;
        Ok((nd_net, sum))
    })();
    let (dev_nd_net, net_inum, netns_ino) = match netns {
        Ok((a, b)) => (a, b, netns_ino),
        Err(e) => {
            warn!(error = %e, "no network-namespace guard: matching the ifindex only");
            (0, 0, 0)
        }
    };
    Ok(TraceConfig {
        max_delay_ns: MAX_DELAY_NS,
        ifindex,
        netns_ino,
        skb_len: off("sk_buff", "len", 4)?,
        skb_dev: off("sk_buff", "dev", 8)?,
        skb_head: off("sk_buff", "head", 8)?,
        skb_network_header: off("sk_buff", "network_header", 2)?,
        skb_transport_header: off("sk_buff", "transport_header", 2)?,
        skb_protocol: off("sk_buff", "protocol", 2)?,
        dev_ifindex: off("net_device", "ifindex", 4)?,
        dev_nd_net,
        net_inum,
        pad: [0; 6],
    })
}

/// The tracer, loaded and attached. Dropping it detaches.
pub struct Tracer {
    ebpf: Ebpf,
}

fn load_error(what: &str) -> impl Fn(String) -> anyhow::Error + '_ {
    move |detail| anyhow::anyhow!("loading the tracer failed: {what}: {detail}")
}

impl Tracer {
    /// Checks, resolves, loads and attaches (steps 1–3 of the module doc),
    /// with the offsets from `btf_file` if given, else from the running
    /// kernel's BTF.
    pub fn attach(iface: &str, btf_file: Option<&Path>) -> Result<Tracer> {
        Capabilities::current()?.check()?;
        let link = link_by_name(iface)?;
        let btf = match btf_file {
            Some(path) => Btf::from_file(path),
            None => Btf::from_sys(),
        }
        .map_err(TraceError::Btf)?;
        let release = crate::checks::kernel_release();
        for tp in [names::TP_ENQUEUE, names::TP_XMIT] {
            if !btf.has_typedef(&format!("btf_trace_{tp}")) {
                return Err(TraceError::NoTracepoint {
                    tracepoint: tp,
                    release,
                }
                .into());
            }
        }
        let netns_ino = std::fs::metadata("/proc/self/ns/net")
            .map(|m| m.ino() as u32)
            .unwrap_or(0);
        let config = resolve_config(&btf, link.ifindex, netns_ino)?;
        debug!(?config, "resolved kernel offsets");
        let mut ebpf = crate::bpf::load::open(
            1,
            &[
                (shaper_common::maps::EVENTS, PAGE_BYTES),
                (names::STAMPS, STAMP_ENTRIES),
                (names::EVENTS, RING_BYTES),
            ],
        )
        .map_err(|e| match e {
            crate::bpf::load::LoadError::Object(o) => anyhow::Error::from(o),
            other => load_error("the object")(other.to_string()),
        })?;
        {
            let map = ebpf
                .map_mut(names::CONFIG)
                .context("the object has no tracer config map")?;
            let mut array: Array<_, TraceConfig> =
                Array::try_from(map).map_err(|e| load_error(names::CONFIG)(e.to_string()))?;
            array
                .set(0, config, 0)
                .map_err(|e| load_error(names::CONFIG)(e.to_string()))?;
        }
        for (prog, tp) in [
            (names::PROG_ENQUEUE, names::TP_ENQUEUE),
            (names::PROG_XMIT, names::TP_XMIT),
        ] {
            let p: &mut RawTracePoint = ebpf
                .program_mut(prog)
                .with_context(|| format!("the object has no program {prog}"))?
                .try_into()
                .map_err(|e: ProgramError| load_error(prog)(e.to_string()))?;
            p.load().map_err(|e| load_error(prog)(format!("{e:#}")))?;
            if let Err(e) = p.attach(tp) {
                if is_enoent(&e) {
                    return Err(TraceError::NoTracepoint {
                        tracepoint: tp,
                        release: release.clone(),
                    }
                    .into());
                }
                return Err(load_error(tp)(format!("attaching: {e:#}")));
            }
        }
        Ok(Tracer { ebpf })
    }

    /// The kernel counters, summed over CPUs.
    pub fn counters(&self) -> Result<Counters> {
        let map = self
            .ebpf
            .map(names::COUNTERS)
            .context("the object has no tracer counters map")?;
        let array: PerCpuArray<_, u64> = PerCpuArray::try_from(map)?;
        read_counters(&array)
    }

    /// Takes the counters map out of the object (for a reader that
    /// outlives borrows of the tracer, such as the telemetry pipeline's).
    pub fn take_counters(&mut self) -> Result<PerCpuArray<MapData, u64>> {
        let map = self
            .ebpf
            .take_map(names::COUNTERS)
            .context("the object has no tracer counters map")?;
        Ok(PerCpuArray::try_from(map)?)
    }

    /// Takes the ring buffer out of the object.
    pub fn take_ring(&mut self) -> Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map(names::EVENTS)
            .context("the object has no tracer ring buffer")?;
        Ok(RingBuf::try_from(map)?)
    }
}

/// The tracer's counters in `array`, summed over CPUs.
pub fn read_counters<T: std::borrow::Borrow<MapData>>(
    array: &PerCpuArray<T, u64>,
) -> Result<Counters> {
    let s = TraceSnapshot::read(array)?;
    Ok(Counters {
        enqueued: s[TraceCounter::Enqueued],
        measured: s[TraceCounter::Measured],
        no_enqueue_record: s[TraceCounter::NoEnqueueRecord],
        stale_discarded: s[TraceCounter::StaleDiscarded],
        events_lost: s[TraceCounter::EventsLost],
        parse_failures: s[TraceCounter::ParseFailures],
    })
}

fn is_enoent(e: &ProgramError) -> bool {
    match e {
        ProgramError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// `shaper trace`: attach, run the telemetry pipeline on the sojourn
/// records (live view, plain lines, or NDJSON; metrics if asked) until
/// the duration ends or a signal comes, print every flow and the summary,
/// detach.
pub fn run(args: TraceArgs) -> Result<()> {
    // Bound before the tracer attaches, so an address in use changes nothing.
    let mut metrics = args
        .metrics
        .map(crate::telemetry::metrics::bind)
        .transpose()?;
    let mut tracer = Tracer::attach(&args.iface, args.btf.as_deref())?;
    info!(iface = %args.iface, "tracer attached");
    let ring = tracer.take_ring()?;
    let counters = Arc::new(tracer.take_counters()?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let start = Instant::now();
    let (summary, table) = rt.block_on(async {
        let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let shared = Arc::clone(&counters);
        let source: CounterSource =
            Box::new(move || TraceSnapshot::read(shared.as_ref()).map(|s| s.named().into()));
        let mut opts = PipelineOptions::new(&args.iface, "trace", Output::detect(args.json));
        opts.metrics = metrics.take();
        opts.top = args.top;
        let pipeline = Pipeline::start(ring, source, opts).await?;
        if let Some(addr) = pipeline.metrics_addr {
            eprintln!("shaper: metrics at http://{addr}/metrics");
        }
        let until = async {
            match args.duration {
                Some(d) => {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(start + d)).await
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = until => {}
            _ = sigint.recv() => {}
            _ = sigterm.recv() => {}
        }
        anyhow::Ok(pipeline.stop_with_table().await)
    })?;
    let elapsed_s = start.elapsed().as_secs_f64();
    let c = read_counters(counters.as_ref())?;
    drop(tracer);
    let table = match table {
        Some(t) => t,
        None => FlowTable::new(FlowTableOptions::default())?,
    };
    let mut out = std::io::stdout().lock();
    for line in report::finish(&table, &summary, &c, elapsed_s, args.json) {
        // A closed pipe is no reason to fail after the measurement.
        let _ = writeln!(out, "{line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_offsets_of_the_host_kernel() {
        let Ok(btf) = Btf::from_sys() else {
            eprintln!("skipped: no kernel BTF");
            return;
        };
        let c = resolve_config(&btf, 7, 4026531840).expect("resolved");
        assert_eq!(c.ifindex, 7);
        assert_ne!(c.skb_head, c.skb_dev);
        assert!(c.net_inum != 0 && c.dev_nd_net != 0, "{c:?}");
        assert!(btf.has_typedef("btf_trace_qdisc_enqueue"));
        assert!(btf.has_typedef("btf_trace_net_dev_start_xmit"));
    }
}
