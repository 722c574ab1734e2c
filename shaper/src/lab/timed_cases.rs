//! Timed cases held against CAKE: flows that come and go, on the
//! receiver's one clock of [`timed`](super::timed), each run under CAKE and
//! under the shaper. The VM test asserts on them and the benchmark reports
//! them, so both run these definitions and read these figures.
//!
//! - [`leave`]: four flows, then three stop; the one left is UDP above the
//!   rate. Figure: [`leave_reach`].
//! - [`join`]: one flow, then three more, with a ping. Figure:
//!   [`join_spread`].
//! - [`churn`]: one bulk flow beside back-to-back short transfers. Figures:
//!   [`churn_bulk_ratio`], [`median_transfer_ms`], [`transfers_per_s`].
//!
//! Units: ratios of the configured rate; times as [`Duration`] on the
//! plan's clock.
//!
//! Non-goals: pass or fail. The callers set their own thresholds.

use std::{path::Path, time::Duration};

use super::{
    Host, PingWindow, State, TimedRun, TimedScenario,
    cases::shaper,
    stats,
    timed::{BIN, BulkFlow, ShortTransfers, TimedPlan, bin_of},
};
use crate::rate::Rate;

/// One timed case: the same plan under CAKE and under the shaper.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimedCase {
    /// The name the benchmark's JSON and the tests use.
    pub name: String,
    /// CAKE on the router's WAN egress.
    pub cake: State,
    /// The shaper there.
    pub shaper: State,
    /// The flows and what runs beside them.
    pub scenario: TimedScenario,
}

/// [`leave`]: when three of the four flows stop.
pub const LEAVE_AT: Duration = Duration::from_millis(2500);
/// [`leave`]: when the last one stops.
pub const LEAVE_END: Duration = Duration::from_millis(3500);
/// [`join`]: when three flows join the first.
pub const JOIN_AT: Duration = Duration::from_secs(2);
/// [`join`]: when all stop.
pub const JOIN_END: Duration = Duration::from_secs(5);
/// [`churn`]: when the short transfers start.
pub const CHURN_FROM: Duration = Duration::from_secs(1);
/// [`churn`]: when everything stops.
pub const CHURN_END: Duration = Duration::from_secs(5);
/// The payload of one short transfer (a small web object).
pub const SHORT_BYTES: u64 = 100_000;
/// The ping beside [`join`]: every 20 ms, so its 99th percentile over the
/// measured seconds is not its maximum.
pub const JOIN_PING_EVERY: Duration = Duration::from_millis(20);

fn bulk(start: Duration, stop: Duration) -> BulkFlow {
    BulkFlow {
        from: Host::Client,
        udp: None,
        start,
        stop,
    }
}

fn timed_case(name: &str, bin: &Path, rate: Rate, plan: TimedPlan) -> TimedCase {
    TimedCase {
        name: name.to_owned(),
        cake: State::Cake { rate },
        shaper: shaper(bin, rate, &[]),
        scenario: TimedScenario {
            plan,
            ping: None,
            rate_change: None,
        },
    }
}

/// Four uploads from the client: UDP offered at 1.2 × the rate until
/// [`LEAVE_END`], and three TCP flows that stop at [`LEAVE_AT`]. The flow
/// left is UDP because it takes a larger share the moment the shaper gives
/// it one, where a TCP flow's window grows for a second or two under any
/// shaper (docs/pacer.md): what is measured is the shaper's reaction.
pub fn leave(bin: &Path, rate: Rate) -> TimedCase {
    let offered = Rate::from_bits_per_s(rate.bits_per_s() / 5 * 6).unwrap_or(rate);
    let mut flows = vec![BulkFlow {
        udp: Some(offered),
        ..bulk(Duration::ZERO, LEAVE_END)
    }];
    flows.extend([bulk(Duration::ZERO, LEAVE_AT); 3]);
    timed_case(
        "leave",
        bin,
        rate,
        TimedPlan {
            bulk: flows,
            short: None,
        },
    )
}

/// One TCP upload from the client; three more join at [`JOIN_AT`], all
/// stop at [`JOIN_END`]; a ping from the client from the join on.
pub fn join(bin: &Path, rate: Rate) -> TimedCase {
    let mut flows = vec![bulk(Duration::ZERO, JOIN_END)];
    flows.extend([bulk(JOIN_AT, JOIN_END); 3]);
    let mut case = timed_case(
        "join",
        bin,
        rate,
        TimedPlan {
            bulk: flows,
            short: None,
        },
    );
    case.scenario.ping = Some(PingWindow {
        from: Host::Client,
        interval: JOIN_PING_EVERY,
        start: JOIN_AT,
        stop: JOIN_END,
    });
    case
}

/// One TCP upload from the client until [`CHURN_END`], beside
/// back-to-back transfers of [`SHORT_BYTES`] from the second client from
/// [`CHURN_FROM`] on.
pub fn churn(bin: &Path, rate: Rate) -> TimedCase {
    timed_case(
        "churn",
        bin,
        rate,
        TimedPlan {
            bulk: vec![bulk(Duration::ZERO, CHURN_END)],
            short: Some(ShortTransfers {
                from: Host::Client2,
                bytes: SHORT_BYTES,
                start: CHURN_FROM,
                stop: CHURN_END,
            }),
        },
    )
}

/// The share of the rate the flow left by [`leave`] must carry over a bin
/// to count as having taken the link.
pub const LEAVE_SHARE: f64 = 0.9;
/// After [`join`], shares are read from this long after the join...
pub const SETTLE: Duration = Duration::from_secs(1);
/// ...over windows of this length.
pub const SHARE_WINDOW: Duration = Duration::from_millis(500);

/// How long after the leaving flows' last byte (flows 1 and on) flow 0
/// carried `share` of `rate` over a whole bin: the bin's start, at least 0;
/// `None` if it never did.
pub fn leave_reach(run: &TimedRun, rate: Rate, share: f64) -> Option<Duration> {
    let stop = run
        .timed
        .last_byte
        .get(1..)?
        .iter()
        .flatten()
        .max()
        .copied()?;
    let floor = share * rate.bits_per_s() as f64;
    (bin_of(stop)..run.timed.bins.first()?.len())
        .map(bin_start)
        .find(|&t| run.timed.flow_bps(0, t, t + BIN) >= floor)
        .map(|t| t.saturating_sub(stop))
}

/// When bin `b` starts.
pub fn bin_start(b: usize) -> Duration {
    BIN * u32::try_from(b).unwrap_or(u32::MAX)
}

/// The largest deviation of a flow's goodput from all flows' mean, as a
/// fraction, over any `window` from `settle` after [`JOIN_AT`] to
/// [`JOIN_END`].
pub fn join_spread(run: &TimedRun, settle: Duration, window: Duration) -> f64 {
    let flows = run.timed.bins.len();
    let mut worst: f64 = 0.0;
    let mut t = JOIN_AT + settle;
    while t + window <= JOIN_END && !window.is_zero() {
        let bps: Vec<f64> = (0..flows)
            .map(|i| run.timed.flow_bps(i, t, t + window))
            .collect();
        let mean = stats::mean(&bps).unwrap_or(0.0);
        for b in bps {
            worst = worst.max(if mean > 0.0 {
                (b / mean - 1.0).abs()
            } else {
                1.0
            });
        }
        t += window;
    }
    worst
}

/// The churn's bulk goodput over the short transfers' time, as a ratio of
/// `rate`.
pub fn churn_bulk_ratio(run: &TimedRun, rate: Rate) -> f64 {
    run.timed.flow_bps(0, CHURN_FROM, CHURN_END) / rate.bits_per_s() as f64
}

/// The short transfers' median time in ms (infinite with none).
pub fn median_transfer_ms(run: &TimedRun) -> f64 {
    let ms: Vec<f64> = run
        .timed
        .transfers
        .iter()
        .map(|t| t.took.as_secs_f64() * 1e3)
        .collect();
    stats::percentile(&ms, 50.0).unwrap_or(f64::INFINITY)
}

/// Short transfers completed per second of the churn.
pub fn transfers_per_s(run: &TimedRun) -> f64 {
    run.timed.transfers.len() as f64 / (CHURN_END - CHURN_FROM).as_secs_f64()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::lab::{
        cases::rate_of,
        timed::{TimedResult, Transfer},
    };

    fn run(timed: TimedResult) -> TimedRun {
        TimedRun {
            state: "test".to_owned(),
            timed,
            ping_ms: Vec::new(),
            counters: Ok(BTreeMap::new()),
            rate_changed_at: None,
        }
    }

    #[test]
    fn cases_are_shaped_as_documented() {
        let (bin, rate) = (Path::new("/bin/shaper"), rate_of("50mbit"));
        let leaving = leave(bin, rate).scenario.plan.bulk;
        assert_eq!(leaving.iter().filter(|f| f.stop == LEAVE_AT).count(), 3);
        assert_eq!(leaving[0].udp, Some(rate_of("60mbit")));
        let joining = join(bin, rate);
        let joined = joining.scenario.plan.bulk.iter();
        assert_eq!(joined.filter(|f| f.start == JOIN_AT).count(), 3);
        assert!(joining.scenario.ping.is_some());
        assert_eq!(churn(bin, rate).scenario.plan.end(), CHURN_END);
    }

    #[test]
    fn leave_reach_counts_from_the_last_byte_of_the_others() {
        // 50 Mbit/s is 625 000 bytes per 100 ms bin; 0.9 of it is 562 500.
        let mut bins = vec![150_000; 35];
        bins.extend([300_000, 600_000, 600_000]);
        let r = run(TimedResult {
            bins: vec![bins, vec![150_000; 31]],
            last_byte: vec![None, Some(Duration::from_millis(3050))],
            ..TimedResult::default()
        });
        let rate = rate_of("50mbit");
        assert_eq!(leave_reach(&r, rate, 0.9), Some(Duration::from_millis(550)));
        assert_eq!(leave_reach(&r, rate, 0.99), None);
    }

    #[test]
    fn join_spread_is_the_worst_window_and_churn_counts_transfers() {
        let n = bin_of(JOIN_END);
        let mut uneven = vec![100; n];
        uneven[bin_of(JOIN_END) - 1] = 200;
        let r = run(TimedResult {
            bins: vec![vec![100; n], uneven],
            last_byte: vec![None; 2],
            transfers: vec![
                Transfer {
                    started: Duration::from_secs(1),
                    took: Duration::from_millis(100),
                },
                Transfer {
                    started: Duration::from_secs(2),
                    took: Duration::from_millis(300),
                },
            ],
            ..TimedResult::default()
        });
        let window = Duration::from_millis(500);
        // The last window: 500 and 600 bytes, mean 550.
        let spread = join_spread(&r, Duration::from_secs(1), window);
        assert!((spread - 50.0 / 550.0).abs() < 1e-9, "{spread}");
        assert_eq!(median_transfer_ms(&r), 100.0);
        assert_eq!(transfers_per_s(&r), 2.0 / 4.0);
    }
}
