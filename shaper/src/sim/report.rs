//! What one simulated run produces, and the measures the property tests
//! take of it: goodput in any window, the worst excess of the link over
//! the rate in sliding windows, scheduled-delay percentiles, Jain's index.
//!
//! Units: ns of simulated time, wire bytes, bytes per second.

use super::Source;

/// Verdict counts of one flow or of the whole link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerdictCounts {
    /// Passed unpaced (the flow's clock was idle).
    pub pass: u64,
    /// Paced (stamped with a later departure).
    pub paced: u64,
    /// CE-marked (and paced).
    pub mark: u64,
    /// Dropped by the AQM (not ECN-capable): by CoDel or the overload rule,
    /// or by the policer.
    pub aqm_drop: u64,
    /// Of `aqm_drop`, the drops by the overload rule (the fair pacer's or
    /// the policer's).
    pub overload_drop: u64,
    /// Dropped beyond the horizon.
    pub horizon_drop: u64,
}

impl VerdictCounts {
    /// Every packet decided.
    pub fn total(&self) -> u64 {
        self.pass + self.paced + self.mark + self.aqm_drop + self.horizon_drop
    }

    /// Adds `o` into `self`.
    pub fn add(&mut self, o: &VerdictCounts) {
        self.pass += o.pass;
        self.paced += o.paced;
        self.mark += o.mark;
        self.aqm_drop += o.aqm_drop;
        self.overload_drop += o.overload_drop;
        self.horizon_drop += o.horizon_drop;
    }
}

/// One packet leaving the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Departure {
    /// When it leaves (after sch_fq's per-flow order), ns.
    pub depart_ns: u64,
    /// The departure the pacer gave it (`now` when passed), ns.
    pub stamp_ns: u64,
    /// When it reached the pacer, ns.
    pub arrival_ns: u64,
    /// Its flow's index in the scenario.
    pub flow: u32,
    /// Wire bytes.
    pub wire_bytes: u32,
    /// The flow's packet number (counting dropped packets too).
    pub seq: u64,
}

/// What one flow saw.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowReport {
    /// What it sent.
    pub source: Source,
    /// The pacer's verdicts on its packets.
    pub verdicts: VerdictCounts,
    /// (time at the receiver, cumulative bytes received), in time order.
    pub delivered: Vec<(u64, u64)>,
    /// (arrival at the pacer, scheduled delay = departure − arrival) of each
    /// kept packet, ns.
    pub delays: Vec<(u64, u64)>,
    /// Packets the pacer stamped earlier than an earlier packet of the same
    /// flow (sch_fq's FIFO had to hold them back); 0 for a correct pacer.
    pub reordered: u64,
    /// Window reductions of an AIMD sender.
    pub reductions: u64,
    /// Police mode: (arrival at the upstream FIFO, its queueing delay) of
    /// each packet that got through it, ns. Empty when pacing.
    pub upstream_delays: Vec<(u64, u64)>,
    /// Police mode: packets lost to the upstream FIFO's tail drop.
    pub upstream_drops: u64,
}

impl FlowReport {
    /// Bytes received at or before `t_ns`.
    pub fn delivered_by(&self, t_ns: u64) -> u64 {
        let n = self.delivered.partition_point(|&(t, _)| t <= t_ns);
        if n == 0 { 0 } else { self.delivered[n - 1].1 }
    }

    /// Bytes received in `(t0_ns, t1_ns]`.
    pub fn delivered_between(&self, t0_ns: u64, t1_ns: u64) -> u64 {
        self.delivered_by(t1_ns)
            .saturating_sub(self.delivered_by(t0_ns))
    }

    /// Scheduled delays (ns) of the kept packets that arrived in
    /// `[t0_ns, t1_ns)`.
    pub fn delays_between(&self, t0_ns: u64, t1_ns: u64) -> Vec<u64> {
        self.delays
            .iter()
            .filter(|&&(a, _)| a >= t0_ns && a < t1_ns)
            .map(|&(_, d)| d)
            .collect()
    }
}

/// The link's worst excess over the rate in windows of one length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Excess {
    /// The window length, ns.
    pub window_ns: u64,
    /// Most bytes departed in any window minus rate × window (negative when
    /// every window stayed below the rate).
    pub bytes: i64,
    /// Where the worst window starts, ns.
    pub at_ns: u64,
}

impl Excess {
    /// The excess as time at the rate, ms.
    pub fn ms_at(&self, rate_bytes_per_s: u64) -> f64 {
        self.bytes as f64 * 1e3 / rate_bytes_per_s as f64
    }
}

/// Everything one run produced.
#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    /// The shaped rate, bytes per second.
    pub rate_bytes_per_s: u64,
    /// Simulated time, ns.
    pub duration_ns: u64,
    /// One report per flow, in scenario order.
    pub flows: Vec<FlowReport>,
    /// Every departure, in time order (ties in decision order).
    pub link: Vec<Departure>,
    /// (time of the epoch change, multiplier after it, Q16).
    pub mult_trace: Vec<(u64, u64)>,
    /// Verdicts over all flows.
    pub totals: VerdictCounts,
}

impl SimReport {
    /// The worst excess of departed bytes over rate × `window_ns`, over
    /// windows `[t, t + window)` starting at each departure instant with
    /// `t` in `[from_ns, duration)`.
    pub fn worst_excess(&self, window_ns: u64, from_ns: u64) -> Excess {
        let cap = i64::try_from(
            u128::from(self.rate_bytes_per_s) * u128::from(window_ns) / 1_000_000_000,
        )
        .unwrap_or(i64::MAX);
        let mut worst = Excess {
            window_ns,
            bytes: -cap,
            at_ns: from_ns,
        };
        let link = &self.link;
        let mut end = 0usize;
        let mut sum = 0i64;
        for start in 0..link.len() {
            if end < start {
                end = start;
                sum = 0;
            }
            let t0 = link[start].depart_ns;
            while end < link.len() && link[end].depart_ns < t0 + window_ns {
                sum += i64::from(link[end].wire_bytes);
                end += 1;
            }
            if t0 >= from_ns && t0 < self.duration_ns && sum - cap > worst.bytes {
                worst.bytes = sum - cap;
                worst.at_ns = t0;
            }
            sum -= i64::from(link[start].wire_bytes);
        }
        worst
    }

    /// Fraction of the rate that flow `flow` received in `(t0_ns, t1_ns]`.
    pub fn share(&self, flow: usize, t0_ns: u64, t1_ns: u64) -> f64 {
        let bytes = self
            .flows
            .get(flow)
            .map_or(0, |f| f.delivered_between(t0_ns, t1_ns));
        let cap = self.rate_bytes_per_s as f64 * (t1_ns - t0_ns) as f64 / 1e9;
        bytes as f64 / cap
    }

    /// The multiplier (as a float) in force at `t_ns`.
    pub fn mult_at(&self, t_ns: u64) -> f64 {
        let n = self.mult_trace.partition_point(|&(t, _)| t <= t_ns);
        let m = if n == 0 {
            shaper_common::fair::MULT_ONE
        } else {
            self.mult_trace[n - 1].1
        };
        m as f64 / shaper_common::fair::MULT_ONE as f64
    }
}

/// Jain's fairness index of `xs`: (Σx)² / (n Σx²), 1 when all are equal,
/// 1/n when one takes everything; 1 for an empty or all-zero input.
pub fn jain_index(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if sq == 0.0 {
        return 1.0;
    }
    sum * sum / (xs.len() as f64 * sq)
}

/// The `p`-th percentile (0..=100, nearest rank) of `xs`, sorting it; 0 for
/// an empty input.
pub fn percentile(xs: &mut [u64], p: f64) -> u64 {
    if xs.is_empty() {
        return 0;
    }
    xs.sort_unstable();
    let rank = ((p / 100.0) * xs.len() as f64).ceil() as usize;
    xs[rank.clamp(1, xs.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep(t: u64, bytes: u32) -> Departure {
        Departure {
            depart_ns: t,
            stamp_ns: t,
            arrival_ns: t,
            flow: 0,
            wire_bytes: bytes,
            seq: 0,
        }
    }

    #[test]
    fn excess_of_a_perfect_schedule_is_at_most_one_packet() {
        // 1000 B every 1 ms at 1 MB/s: each 10 ms window holds 10 packets.
        let link: Vec<Departure> = (0..1_000).map(|i| dep(i * 1_000_000, 1_000)).collect();
        let r = SimReport {
            rate_bytes_per_s: 1_000_000,
            duration_ns: 1_000_000_000,
            flows: Vec::new(),
            link,
            mult_trace: Vec::new(),
            totals: VerdictCounts::default(),
        };
        let e = r.worst_excess(10_000_000, 0);
        assert_eq!(e.bytes, 0);
        // 10 extra bytes in one window show.
        let mut r = r;
        r.link[500].wire_bytes += 10;
        assert_eq!(r.worst_excess(10_000_000, 0).bytes, 10);
    }

    #[test]
    fn jain_and_percentile() {
        assert!((jain_index(&[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain_index(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        let mut v = vec![5, 1, 4, 2, 3];
        assert_eq!(percentile(&mut v, 50.0), 3);
        assert_eq!(percentile(&mut v, 100.0), 5);
        assert_eq!(percentile(&mut v, 0.0), 1);
    }
}
