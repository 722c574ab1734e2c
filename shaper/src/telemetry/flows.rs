//! The aggregator: per-flow and per-interface state built from ring-buffer
//! [`Event`]s, for the live view, `--json` and `--metrics`.
//!
//! What it keeps per flow: estimated bytes, packets and rate (sampled
//! packets stand for `sample_every` each, see `EVENT_F_SAMPLED`), exact
//! drop and mark counts (the kernel sends every drop and mark), the largest
//! delay seen, and a delay histogram (`hdrhistogram`, microseconds, one
//! significant digit: each bucket spans at most 1/16 of its value, so a
//! quantile is within about 6%, or 16 µs below 256 µs).
//!
//! Memory bound: a flow costs about 150 bytes without a histogram and
//! 1.2 KB with one (16 µs resolution up to 16.7 s), so histograms are
//! handed out only to flows with a non-zero delay sample, and at most
//! `max_histograms` (8192, about 10 MB) at a time, taken back from flows
//! that end or idle out. A flow without one still reports its exact
//! maximum; its quantiles read as unknown. The per-interface histogram is
//! exact to three digits. The scale benchmark measures the whole
//! controller with 100k flows.
//!
//! Units: nanoseconds of CLOCK_MONOTONIC (the events' clock), bytes.
//! Non-goals: exact per-packet accounting (the pinned counters are exact),
//! persistence.

use std::collections::HashMap;

use hdrhistogram::Histogram;
use shaper_common::event::{
    EVENT_F_SAMPLED, EVENT_FLOW_END, EVENT_FLOW_START, EVENT_PACKET, EVENT_SOJOURN, Event, FlowKey,
    VERDICT_AQM_DROP, VERDICT_CE, VERDICT_HORIZON_DROP,
};

use super::TelemetryError;

/// Largest delay a flow histogram holds (16.7 s); larger ones are clamped.
const FLOW_HIST_MAX_US: u64 = 1 << 24;
/// A flow histogram's resolution: 16 µs (finer would cost memory for
/// delays no one acts on).
const FLOW_HIST_LOW_US: u64 = 16;
/// Largest delay the interface histogram holds (60 s), in ns.
const IFACE_HIST_MAX_NS: u64 = 60_000_000_000;

/// Aggregator settings.
#[derive(Clone, Copy, Debug)]
pub struct FlowTableOptions {
    /// The kernel's 1-in-N sampling; 1 when every packet is an event.
    pub sample_every: u32,
    /// Flows idle this long are dropped from the table. Long, because
    /// with 1-in-N sampling a steady flow may send no record for a while:
    /// a flow at 1,000 packets/s and N = 64 sends one every 64 ms, one at
    /// 10 packets/s one every 6.4 s.
    pub idle_ns: u64,
    /// Histograms handed out at most (memory bound, module header).
    pub max_histograms: usize,
}

impl Default for FlowTableOptions {
    fn default() -> Self {
        Self {
            sample_every: 1,
            idle_ns: 30_000_000_000,
            max_histograms: 8_192,
        }
    }
}

/// One flow's aggregate.
#[derive(Debug)]
pub struct FlowStats {
    /// First event.
    pub first_ns: u64,
    /// Last event.
    pub last_ns: u64,
    /// Estimated packets (sampled ones × `sample_every`).
    pub packets: u64,
    /// Estimated bytes, likewise.
    pub bytes: u64,
    /// Packet events received (sampled or not).
    pub events: u64,
    /// AQM drops (exact).
    pub aqm_drops: u64,
    /// Horizon drops (exact).
    pub horizon_drops: u64,
    /// CE marks (exact).
    pub marks: u64,
    /// Largest delay of any event.
    pub delay_max_ns: u64,
    /// Rate over the last tick, bytes/s.
    pub rate_bytes_per_s: u64,
    /// The flow sent FIN or RST.
    pub ended: bool,
    bytes_at_tick: u64,
    hist: Option<Box<Histogram<u32>>>,
    /// A delayed sample found the histogram budget spent.
    hist_denied: bool,
}

impl FlowStats {
    fn new(now_ns: u64) -> Self {
        Self {
            first_ns: now_ns,
            last_ns: now_ns,
            packets: 0,
            bytes: 0,
            events: 0,
            aqm_drops: 0,
            horizon_drops: 0,
            marks: 0,
            delay_max_ns: 0,
            rate_bytes_per_s: 0,
            ended: false,
            bytes_at_tick: 0,
            hist: None,
            hist_denied: false,
        }
    }

    /// Delay at quantile `q` (0..=1) of the sampled packets, in ns: 0 when
    /// every sample was 0 (drops and marks, sent unsampled, count only in
    /// the maximum), `None` when the flow had delayed samples but the
    /// histogram budget was spent (module header).
    pub fn delay_quantile_ns(&self, q: f64) -> Option<u64> {
        match &self.hist {
            Some(h) => Some(h.value_at_quantile(q).saturating_mul(1000)),
            None if self.hist_denied => None,
            None => Some(0),
        }
    }
}

/// Interface-wide aggregate.
#[derive(Debug)]
pub struct IfaceStats {
    /// Records taken in, of every kind.
    pub records: u64,
    /// Estimated packets.
    pub packets: u64,
    /// Estimated bytes.
    pub bytes: u64,
    /// Packet events received.
    pub events: u64,
    /// AQM drops seen as events.
    pub aqm_drops: u64,
    /// Horizon drops seen as events.
    pub horizon_drops: u64,
    /// CE marks seen as events.
    pub marks: u64,
    /// Flow starts and ends seen.
    pub flow_starts: u64,
    /// Flow ends seen (TCP FIN or RST).
    pub flow_ends: u64,
    /// Events shorter than a record (never expected).
    pub malformed: u64,
    /// Delay histogram of sampled packets, ns.
    pub delay: Histogram<u64>,
}

/// Sampled delay over one interval (see [`FlowTable::take_window`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// Samples in the interval.
    pub samples: u64,
    /// Median delay, ns (0 without samples).
    pub p50_ns: u64,
    /// 99th percentile, ns.
    pub p99_ns: u64,
    /// Largest, ns.
    pub max_ns: u64,
}

/// A flow as shown: key and stats.
#[derive(Debug)]
pub struct FlowRow<'a> {
    /// The flow.
    pub key: &'a FlowKey,
    /// Its aggregate.
    pub stats: &'a FlowStats,
}

/// The aggregator (module header).
#[derive(Debug)]
pub struct FlowTable {
    opts: FlowTableOptions,
    flows: HashMap<FlowKey, FlowStats>,
    hists_out: usize,
    last_tick_ns: Option<u64>,
    window: Histogram<u64>,
    /// Interface-wide aggregate.
    pub iface: IfaceStats,
}

impl FlowTable {
    /// An empty table.
    pub fn new(opts: FlowTableOptions) -> Result<Self, TelemetryError> {
        let delay = Histogram::new_with_bounds(1, IFACE_HIST_MAX_NS, 3)
            .map_err(|e| TelemetryError::Histogram(e.to_string()))?;
        let window = delay.clone();
        Ok(Self {
            window,
            opts: FlowTableOptions {
                sample_every: opts.sample_every.max(1),
                ..opts
            },
            flows: HashMap::new(),
            hists_out: 0,
            last_tick_ns: None,
            iface: IfaceStats {
                records: 0,
                packets: 0,
                bytes: 0,
                events: 0,
                aqm_drops: 0,
                horizon_drops: 0,
                marks: 0,
                flow_starts: 0,
                flow_ends: 0,
                malformed: 0,
                delay,
            },
        })
    }

    /// Flows in the table.
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// True when no flow is tracked.
    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    /// Flows that hold a histogram now.
    pub fn histograms(&self) -> usize {
        self.hists_out
    }

    /// One flow's stats.
    pub fn get(&self, key: &FlowKey) -> Option<&FlowStats> {
        self.flows.get(key)
    }

    /// Takes in one ring-buffer record.
    pub fn record_bytes(&mut self, b: &[u8]) {
        match Event::from_bytes(b) {
            Some(e) => self.record(&e),
            None => self.iface.malformed += 1,
        }
    }

    /// Takes in one event.
    pub fn record(&mut self, e: &Event) {
        self.iface.records += 1;
        let opts = self.opts;
        let stats = self
            .flows
            .entry(e.key)
            .or_insert_with(|| FlowStats::new(e.ts_ns));
        stats.last_ns = stats.last_ns.max(e.ts_ns);
        match e.kind {
            EVENT_FLOW_START => {
                self.iface.flow_starts += 1;
                stats.ended = false;
            }
            EVENT_FLOW_END => {
                self.iface.flow_ends += 1;
                stats.ended = true;
            }
            EVENT_PACKET | EVENT_SOJOURN => {}
            _ => {
                self.iface.malformed += 1;
                return;
            }
        }
        // A flow start or end record stands for its packet only when it was
        // drawn as a sample or is a drop or mark (which are always sent).
        let is_packet = matches!(e.kind, EVENT_PACKET | EVENT_SOJOURN);
        if !is_packet && e.flags & EVENT_F_SAMPLED == 0 && e.verdict < VERDICT_CE {
            return;
        }
        stats.events += 1;
        self.iface.events += 1;
        let sampled = e.kind == EVENT_SOJOURN || e.flags & EVENT_F_SAMPLED != 0;
        match e.verdict {
            VERDICT_AQM_DROP => {
                stats.aqm_drops += 1;
                self.iface.aqm_drops += 1;
            }
            VERDICT_HORIZON_DROP => {
                stats.horizon_drops += 1;
                self.iface.horizon_drops += 1;
            }
            VERDICT_CE => {
                stats.marks += 1;
                self.iface.marks += 1;
            }
            _ => {}
        }
        stats.delay_max_ns = stats.delay_max_ns.max(e.delay_ns);
        if !sampled {
            return;
        }
        let weight = u64::from(opts.sample_every);
        stats.packets += weight;
        stats.bytes += weight * u64::from(e.len_bytes);
        self.iface.packets += weight;
        self.iface.bytes += weight * u64::from(e.len_bytes);
        self.iface.delay.saturating_record(e.delay_ns.max(1));
        self.window.saturating_record(e.delay_ns.max(1));
        if e.delay_ns > 0
            && stats.hist.is_none()
            && self.hists_out < opts.max_histograms
            && let Ok(mut h) =
                Histogram::<u32>::new_with_bounds(FLOW_HIST_LOW_US, FLOW_HIST_MAX_US, 1)
        {
            // Earlier zero-delay samples of this flow, so its quantiles
            // still count them (estimated: events so far, minus this one).
            let zeros = u32::try_from(stats.events.saturating_sub(1)).unwrap_or(u32::MAX);
            if zeros > 0 {
                let _ = h.record_n(0, zeros);
            }
            stats.hist = Some(Box::new(h));
            self.hists_out += 1;
        }
        if e.delay_ns > 0 && stats.hist.is_none() {
            stats.hist_denied = true;
        }
        if let Some(h) = stats.hist.as_mut() {
            h.saturating_record((e.delay_ns / 1000).min(FLOW_HIST_MAX_US));
        }
    }

    /// Once per display interval: updates each flow's rate and removes
    /// flows idle longer than the idle time (or ended and quiet for a
    /// second). Returns how many were removed.
    pub fn tick(&mut self, now_ns: u64) -> usize {
        let dt_ns = self.last_tick_ns.map_or(0, |t| now_ns.saturating_sub(t));
        self.last_tick_ns = Some(now_ns);
        let idle_ns = self.opts.idle_ns;
        let before = self.flows.len();
        let mut freed = 0;
        self.flows.retain(|_, s| {
            let quiet_ns = now_ns.saturating_sub(s.last_ns);
            let keep = quiet_ns < idle_ns && !(s.ended && quiet_ns >= 1_000_000_000);
            if !keep {
                freed += usize::from(s.hist.is_some());
                return false;
            }
            if dt_ns > 0 {
                let delta = s.bytes - s.bytes_at_tick;
                s.rate_bytes_per_s =
                    u64::try_from(u128::from(delta) * 1_000_000_000 / u128::from(dt_ns))
                        .unwrap_or(u64::MAX);
            }
            s.bytes_at_tick = s.bytes;
            true
        });
        self.hists_out -= freed;
        before - self.flows.len()
    }

    /// The sampled delay since the last call, and a fresh window: what the
    /// live view and the exporters show as "now" (the summary keeps the
    /// whole run).
    pub fn take_window(&mut self) -> Window {
        let h = &self.window;
        let w = if h.is_empty() {
            Window::default()
        } else {
            Window {
                samples: h.len(),
                p50_ns: h.value_at_quantile(0.5),
                p99_ns: h.value_at_quantile(0.99),
                max_ns: h.max(),
            }
        };
        self.window.reset();
        w
    }

    /// The `n` flows with the highest rate (then bytes), largest first.
    pub fn top(&self, n: usize) -> Vec<FlowRow<'_>> {
        let mut rows: Vec<FlowRow<'_>> = self
            .flows
            .iter()
            .map(|(key, stats)| FlowRow { key, stats })
            .collect();
        let cmp = |a: &FlowRow<'_>, b: &FlowRow<'_>| {
            (b.stats.rate_bytes_per_s, b.stats.bytes, b.key).cmp(&(
                a.stats.rate_bytes_per_s,
                a.stats.bytes,
                a.key,
            ))
        };
        if rows.len() > n {
            rows.select_nth_unstable_by(n, cmp);
            rows.truncate(n);
        }
        rows.sort_by(cmp);
        rows
    }

    /// Every flow, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = FlowRow<'_>> {
        self.flows.iter().map(|(key, stats)| FlowRow { key, stats })
    }
}

#[cfg(test)]
mod tests {
    use shaper_common::event::{VERDICT_PACED, VERDICT_PASS};

    use super::*;

    fn key(port: u16) -> FlowKey {
        FlowKey {
            sport_be: port.to_be(),
            proto: 6,
            family: 4,
            ..FlowKey::default()
        }
    }

    fn packet(port: u16, ts_ns: u64, delay_ns: u64, verdict: u8, sampled: bool) -> Event {
        Event {
            ts_ns,
            delay_ns,
            key: key(port),
            len_bytes: 1000,
            kind: EVENT_PACKET,
            verdict,
            flags: if sampled { EVENT_F_SAMPLED } else { 0 },
            ..Event::default()
        }
    }

    #[test]
    fn scales_samples_and_counts_drops_exactly() {
        let mut t = FlowTable::new(FlowTableOptions {
            sample_every: 8,
            ..FlowTableOptions::default()
        })
        .expect("table");
        for i in 0..10 {
            t.record(&packet(1, i, 2_000_000, VERDICT_PACED, true));
        }
        // Drops and marks that the draw did not pick: counted, not scaled.
        t.record(&packet(1, 11, 9_000_000, VERDICT_AQM_DROP, false));
        t.record(&packet(1, 12, 3_000_000, VERDICT_CE, false));
        let s = t.get(&key(1)).expect("flow");
        assert_eq!((s.packets, s.bytes), (80, 80_000));
        assert_eq!((s.aqm_drops, s.marks, s.horizon_drops), (1, 1, 0));
        assert_eq!(s.delay_max_ns, 9_000_000);
        let p50 = s.delay_quantile_ns(0.5).expect("has a histogram");
        assert!((1_875_000..=2_125_000).contains(&p50), "{p50}");
        assert_eq!(t.iface.packets, 80);
    }

    #[test]
    fn quantiles_follow_the_distribution() {
        let mut t = FlowTable::new(FlowTableOptions::default()).expect("table");
        // 90 packets at 1 ms, 10 at 20 ms: p50 ≈ 1 ms, p99 ≈ 20 ms.
        for i in 0..100u64 {
            let d = if i % 10 == 9 { 20_000_000 } else { 1_000_000 };
            t.record(&packet(2, i, d, VERDICT_PACED, true));
        }
        let s = t.get(&key(2)).expect("flow");
        let p50 = s.delay_quantile_ns(0.5).expect("hist");
        let p99 = s.delay_quantile_ns(0.99).expect("hist");
        assert!((900_000..=1_100_000).contains(&p50), "{p50}");
        assert!((18_000_000..=21_500_000).contains(&p99), "{p99}");
        let ip99 = t.iface.delay.value_at_quantile(0.99);
        assert!((19_900_000..=20_100_000).contains(&ip99), "{ip99}");
    }

    #[test]
    fn zero_delay_flows_need_no_histogram_and_the_budget_holds() {
        let mut t = FlowTable::new(FlowTableOptions {
            max_histograms: 3,
            ..FlowTableOptions::default()
        })
        .expect("table");
        t.record(&packet(9, 0, 0, VERDICT_PASS, true));
        assert_eq!(t.histograms(), 0);
        assert_eq!(
            t.get(&key(9)).and_then(|s| s.delay_quantile_ns(0.99)),
            Some(0)
        );
        for p in 10..20 {
            t.record(&packet(p, 0, 5_000_000, VERDICT_PACED, true));
        }
        assert_eq!(t.histograms(), 3);
        // Over budget: the maximum is still exact, the quantile unknown.
        let s = t.get(&key(19)).expect("flow");
        assert_eq!(
            (s.delay_max_ns, s.delay_quantile_ns(0.5)),
            (5_000_000, None)
        );
    }

    #[test]
    fn tick_computes_rates_and_expires_idle_and_ended_flows() {
        let mut t = FlowTable::new(FlowTableOptions {
            idle_ns: 5_000_000_000,
            ..FlowTableOptions::default()
        })
        .expect("table");
        t.tick(0);
        for i in 0..100u64 {
            t.record(&packet(1, i * 10_000_000, 1_000, VERDICT_PACED, true));
        }
        t.record(&packet(2, 0, 1_000, VERDICT_PACED, true));
        t.tick(1_000_000_000);
        assert_eq!(t.get(&key(1)).map(|s| s.rate_bytes_per_s), Some(100_000));
        let top = t.top(1);
        assert_eq!(top.len(), 1);
        assert_eq!(*top[0].key, key(1));
        // Flow 1 ends; a second later it is gone; flow 2 idles out at 5 s.
        let mut end = packet(1, 1_000_000_000, 0, VERDICT_PASS, false);
        end.kind = EVENT_FLOW_END;
        t.record(&end);
        assert_eq!(t.tick(1_500_000_000), 0);
        assert_eq!(t.tick(2_100_000_000), 1);
        assert!(t.get(&key(1)).is_none());
        assert_eq!(t.histograms(), 1);
        assert_eq!(t.tick(5_000_000_000), 1);
        assert!(t.is_empty());
        assert_eq!(t.histograms(), 0);
        assert_eq!(t.iface.flow_ends, 1);
    }

    #[test]
    fn the_window_holds_one_interval_and_the_summary_all() {
        let mut t = FlowTable::new(FlowTableOptions::default()).expect("table");
        for i in 0..10 {
            t.record(&packet(1, i, 10_000_000, VERDICT_PACED, true));
        }
        let w = t.take_window();
        assert_eq!(w.samples, 10);
        assert!(w.p99_ns.abs_diff(10_000_000) < 10_000, "{w:?}");
        t.record(&packet(1, 20, 1_000_000, VERDICT_PACED, true));
        let w = t.take_window();
        assert_eq!(w.samples, 1);
        assert!(w.p99_ns.abs_diff(1_000_000) < 1_000, "{w:?}");
        assert_eq!(t.take_window(), Window::default());
        assert_eq!(t.iface.delay.len(), 11);
    }

    #[test]
    fn short_records_are_counted_not_misread() {
        let mut t = FlowTable::new(FlowTableOptions::default()).expect("table");
        t.record_bytes(&[0u8; 10]);
        assert_eq!(t.iface.malformed, 1);
        assert!(t.is_empty());
    }
}
