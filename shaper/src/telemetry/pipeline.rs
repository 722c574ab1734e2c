//! The reader → SPSC ring → aggregator pipeline (see the module header of
//! `telemetry`), and its shutdown, which drains both rings before the last
//! summary.
//!
//! Units: the interval is wall time; event times are CLOCK_MONOTONIC ns.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use aya::maps::{MapData, RingBuf};
use ringbuf::{
    HeapCons, HeapProd, HeapRb,
    traits::{Consumer, Producer, Split},
};
use shaper_common::event::Event;
use tokio::{
    io::unix::AsyncFd,
    sync::{Notify, watch},
    task::JoinHandle,
};
use tracing::warn;

use super::{FlowTable, FlowTableOptions, TelemetryError, metrics, view};
use crate::counters::CounterError;

/// How the aggregator shows each interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// A table redrawn in place (a terminal).
    Live,
    /// One plain line per interval (a pipe or file).
    Plain,
    /// NDJSON records.
    Json,
    /// Nothing per interval (the summary is still returned).
    Quiet,
}

impl Output {
    /// `Live` on a terminal, else `Plain`; `Json` when asked.
    pub fn detect(json: bool) -> Self {
        use std::io::IsTerminal;
        if json {
            Output::Json
        } else if std::io::stdout().is_terminal() {
            Output::Live
        } else {
            Output::Plain
        }
    }
}

/// What the kernel reports each interval, by stable name: exact counters
/// (`events_lost` among them when the program has it) and gauges, values
/// of the moment in the unit their name ends in (the fair pacer's
/// multiplier and flow counts, so an operator sees the share move).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Readings {
    /// Monotonic counters.
    pub counters: Vec<(&'static str, u64)>,
    /// Gauges.
    pub gauges: Vec<(&'static str, f64)>,
    /// Each tin's share and counters, when the pacer runs more than one.
    pub tins: Vec<crate::tin_status::TinStatus>,
}

impl From<Vec<(&'static str, u64)>> for Readings {
    /// Counters alone, no gauges.
    fn from(counters: Vec<(&'static str, u64)>) -> Self {
        Self {
            counters,
            gauges: Vec::new(),
            tins: Vec::new(),
        }
    }
}

/// Reads the kernel's [`Readings`] once per interval.
pub type CounterSource = Box<dyn FnMut() -> Result<Readings, CounterError> + Send>;

/// One reading; a failed one is logged and leaves the interval without
/// counters, rather than with zeros that read as "nothing happened".
fn read_readings(counters: &mut CounterSource) -> Readings {
    counters().unwrap_or_else(|e| {
        warn!(error = %e, "the kernel's counters could not be read; this interval has none");
        Readings::default()
    })
}

/// Pipeline settings.
#[derive(Debug)]
pub struct PipelineOptions {
    /// The interface, for labels.
    pub iface: String,
    /// What the records are (`"run"` or `"trace"`), for the view's title.
    pub source: &'static str,
    /// Display and ageing interval.
    pub interval: Duration,
    /// How to show each interval.
    pub output: Output,
    /// Flows shown (and exported per flow).
    pub top: usize,
    /// Where to serve Prometheus text, if anywhere: a listener the command
    /// bound before it changed anything ([`super::metrics::bind`]).
    pub metrics: Option<std::net::TcpListener>,
    /// Aggregator settings.
    pub table: FlowTableOptions,
    /// Capacity of the SPSC ring between reader and aggregator, in events
    /// (72 bytes each, all resident from the start).
    pub spsc_events: usize,
}

impl PipelineOptions {
    /// Defaults for `iface`: 1 s interval, top 10, 64k-event ring.
    pub fn new(iface: &str, source: &'static str, output: Output) -> Self {
        Self {
            iface: iface.to_owned(),
            source,
            interval: Duration::from_secs(1),
            output,
            top: 10,
            metrics: None,
            table: FlowTableOptions::default(),
            spsc_events: 65_536,
        }
    }
}

/// What a whole run saw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// The interface.
    pub iface: String,
    /// Records taken in, of every kind.
    pub records: u64,
    /// Flows holding a delay histogram at the end.
    pub flow_histograms: u64,
    /// Events taken in (packets and sojourns; not flow starts/ends).
    pub events: u64,
    /// Estimated packets.
    pub packets: u64,
    /// Estimated bytes.
    pub bytes: u64,
    /// Flows in the table at the end.
    pub flows: u64,
    /// Flow starts and ends the kernel reported.
    pub flow_starts: u64,
    /// Flow ends the kernel reported.
    pub flow_ends: u64,
    /// Delay quantiles and maximum over every sampled packet, ns.
    pub delay_p50_ns: u64,
    /// 99th percentile.
    pub delay_p99_ns: u64,
    /// Maximum.
    pub delay_max_ns: u64,
    /// Drops and marks seen as events.
    pub aqm_drops: u64,
    /// Horizon drops seen as events.
    pub horizon_drops: u64,
    /// CE marks seen as events.
    pub marks: u64,
    /// Events the SPSC ring had no room for.
    pub events_dropped_user: u64,
    /// The kernel's exact counters at the end.
    pub counters: Vec<(&'static str, u64)>,
    /// The kernel's gauges at the end ([`Readings::gauges`]).
    pub gauges: Vec<(&'static str, f64)>,
    /// The tins at the end ([`Readings::tins`]).
    pub tins: Vec<crate::tin_status::TinStatus>,
}

impl Summary {
    /// Events lost in the kernel (ring buffer full), when counted.
    pub fn events_lost(&self) -> Option<u64> {
        self.counters
            .iter()
            .find(|(n, _)| *n == "events_lost")
            .map(|(_, v)| *v)
    }

    pub(crate) fn from_table(
        iface: &str,
        t: &FlowTable,
        dropped_user: u64,
        readings: impl Into<Readings>,
    ) -> Self {
        let Readings {
            counters,
            gauges,
            tins,
        } = readings.into();
        let d = &t.iface.delay;
        let q = |x: f64| {
            if d.is_empty() {
                0
            } else {
                d.value_at_quantile(x)
            }
        };
        Self {
            iface: iface.to_owned(),
            records: t.iface.records,
            flow_histograms: t.histograms() as u64,
            events: t.iface.events,
            packets: t.iface.packets,
            bytes: t.iface.bytes,
            flows: t.len() as u64,
            flow_starts: t.iface.flow_starts,
            flow_ends: t.iface.flow_ends,
            delay_p50_ns: q(0.5),
            delay_p99_ns: q(0.99),
            delay_max_ns: if d.is_empty() { 0 } else { d.max() },
            aqm_drops: t.iface.aqm_drops,
            horizon_drops: t.iface.horizon_drops,
            marks: t.iface.marks,
            events_dropped_user: dropped_user,
            counters,
            gauges,
            tins,
        }
    }
}

struct Shared {
    wake: Notify,
    stop_reader: Notify,
    stop_aggregator: Notify,
    dropped_user: AtomicU64,
}

/// A running pipeline; [`Pipeline::stop`] ends it.
pub struct Pipeline {
    shared: Arc<Shared>,
    reader: JoinHandle<()>,
    aggregator: JoinHandle<(Summary, FlowTable)>,
    server: Option<JoinHandle<()>>,
    /// Where metrics are served (the bound address, port 0 resolved).
    pub metrics_addr: Option<SocketAddr>,
}

impl Pipeline {
    /// Starts reading `ring`. Needs a tokio runtime with IO enabled.
    pub async fn start(
        ring: RingBuf<MapData>,
        counters: CounterSource,
        mut opts: PipelineOptions,
    ) -> Result<Self, TelemetryError> {
        let table = FlowTable::new(opts.table)?;
        // SAFETY: the AsyncFd owns the RingBuf, which owns the fd, so the
        // fd stays open for as long as it is registered.
        let fd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
            .map_err(|e| TelemetryError::Ring {
                map: "events".into(),
                detail: e.to_string(),
            })?;
        let (listener, metrics_addr) = match opts.metrics.take() {
            Some(l) => {
                let bound = l.local_addr().map_err(TelemetryError::Serve)?;
                let l = tokio::net::TcpListener::from_std(l).map_err(TelemetryError::Serve)?;
                (Some(l), Some(bound))
            }
            None => (None, None),
        };
        let (prod, cons) = spsc(opts.spsc_events.max(1024));
        let shared = Arc::new(Shared {
            wake: Notify::new(),
            stop_reader: Notify::new(),
            stop_aggregator: Notify::new(),
            dropped_user: AtomicU64::new(0),
        });
        let (text_tx, text_rx) = watch::channel(String::new());
        let server = listener.map(|l| tokio::spawn(metrics::serve(l, text_rx)));
        let reader = tokio::spawn(read(fd, prod, Arc::clone(&shared)));
        let aggregator = tokio::spawn(aggregate(
            cons,
            table,
            Arc::clone(&shared),
            opts,
            counters,
            text_tx,
        ));
        Ok(Self {
            shared,
            reader,
            aggregator,
            server,
            metrics_addr,
        })
    }

    /// Drains both rings, stops every task, and returns the summary.
    pub async fn stop(self) -> Summary {
        self.stop_with_table().await.0
    }

    /// As [`Pipeline::stop`], also returning the final flow table (`None`
    /// if the aggregator failed).
    pub async fn stop_with_table(self) -> (Summary, Option<FlowTable>) {
        self.shared.stop_reader.notify_one();
        if let Err(e) = self.reader.await {
            warn!(error = %e, "the telemetry reader ended badly");
        }
        self.shared.stop_aggregator.notify_one();
        let result = match self.aggregator.await {
            Ok((s, t)) => (s, Some(t)),
            Err(e) => {
                warn!(error = %e, "the telemetry aggregator ended badly");
                (Summary::default(), None)
            }
        };
        if let Some(s) = self.server {
            s.abort();
        }
        result
    }
}

/// The SPSC ring between reader and aggregator, `capacity` events, with
/// every slot written once before the reader starts. An allocation's pages
/// enter memory only when first written, so a ring left untouched grows the
/// resident set by one record's size with each record until its index
/// first wraps (minutes at a few dozen records a second). That reads as a
/// leak. Written up front, the ring is at its working size from the start.
fn spsc(capacity: usize) -> (HeapProd<Event>, HeapCons<Event>) {
    let (mut prod, mut cons) = HeapRb::<Event>::new(capacity).split();
    prod.push_iter(std::iter::repeat_n(Event::default(), capacity));
    cons.clear();
    (prod, cons)
}

/// Copies every available record into the SPSC ring.
fn drain_kernel(ring: &mut RingBuf<MapData>, prod: &mut HeapProd<Event>, shared: &Shared) -> bool {
    let mut any = false;
    while let Some(item) = ring.next() {
        any = true;
        // A short record is passed on as a zeroed event of kind 0, which
        // the aggregator counts as malformed.
        let e = Event::from_bytes(&item).unwrap_or_default();
        if prod.try_push(e).is_err() {
            shared.dropped_user.fetch_add(1, Ordering::Relaxed);
        }
    }
    any
}

async fn read(mut fd: AsyncFd<RingBuf<MapData>>, mut prod: HeapProd<Event>, shared: Arc<Shared>) {
    loop {
        tokio::select! {
            guard = fd.readable_mut() => {
                let mut guard = match guard {
                    Ok(g) => g,
                    Err(e) => {
                        warn!(error = %e, "polling the ring buffer failed; telemetry stops");
                        return;
                    }
                };
                // Clear first, then drain: a record committed after the
                // last read sets readiness again. (Draining first lost that
                // wakeup, and the kernel only notifies when the reader has
                // caught up, so the ring then filled unread.)
                guard.clear_ready();
                if drain_kernel(guard.get_inner_mut(), &mut prod, &shared) {
                    shared.wake.notify_one();
                }
            }
            () = shared.stop_reader.notified() => {
                drain_kernel(fd.get_mut(), &mut prod, &shared);
                shared.wake.notify_one();
                return;
            }
        }
    }
}

fn drain_spsc(cons: &mut HeapCons<Event>, table: &mut FlowTable) {
    while let Some(e) = cons.try_pop() {
        table.record(&e);
    }
}

async fn aggregate(
    mut cons: HeapCons<Event>,
    mut table: FlowTable,
    shared: Arc<Shared>,
    opts: PipelineOptions,
    mut counters: CounterSource,
    text_tx: watch::Sender<String>,
) -> (Summary, FlowTable) {
    let mut tick = tokio::time::interval(opts.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = std::time::Instant::now();
    let mut out = view::Emitter::new(opts.output, &opts.iface, opts.source, opts.top);
    loop {
        tokio::select! {
            () = shared.wake.notified() => drain_spsc(&mut cons, &mut table),
            _ = tick.tick() => {
                drain_spsc(&mut cons, &mut table);
                let window = table.take_window();
                table.tick(monotonic_ns());
                let c = read_readings(&mut counters);
                let dropped = shared.dropped_user.load(Ordering::Relaxed);
                let summary = Summary::from_table(&opts.iface, &table, dropped, c);
                out.interval(started.elapsed(), &table, &summary, &window);
                // The endpoint holds the only receiver: no server, no text.
                if !text_tx.is_closed() {
                    let text = metrics::render(&opts.iface, &table, &summary, &window, opts.top);
                    let _ = text_tx.send(text);
                }
            }
            () = shared.stop_aggregator.notified() => break,
        }
    }
    drain_spsc(&mut cons, &mut table);
    let dropped = shared.dropped_user.load(Ordering::Relaxed);
    let summary = Summary::from_table(&opts.iface, &table, dropped, read_readings(&mut counters));
    (summary, table)
}

/// CLOCK_MONOTONIC now, in ns: the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always
    // exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

#[cfg(test)]
mod tests;
