//! A long run under churn: the shaper on the WAN for minutes while bulk
//! flows start and end on a stagger and short transfers follow each other
//! throughout, with the controller (`shaper run`) sampled meanwhile. What
//! it answers: does the controller's memory stay flat, do its descriptors
//! stay put, does the telemetry ring lose records, and does `shaper status`
//! keep answering, once thousands of flows have come and gone.
//!
//! - Bulk flows run in [`SoakPlan::bulk_slots`] slots. Each slot runs one
//!   TCP flow at a time for [`SoakPlan::bulk_life`], then the next after a
//!   [`BULK_GAP`]; slot `i` starts `i / slots` of a life late, so flows end
//!   and start all through the run. The slots alternate between the two
//!   clients.
//! - Back-to-back short transfers of [`SoakPlan::short_bytes`] run from the
//!   second client for the whole run: each one a flow of its own.
//! - Every [`SoakPlan::every`] the sampler reads the controller's resident
//!   set (`VmRSS` of `/proc/<pid>/status`) and open descriptors
//!   (`/proc/<pid>/fd`); every [`STATUS_EVERY`]th sample it also runs
//!   `shaper status --json` and reads `events_lost`.
//!
//! The controller runs with transparent huge pages off: the soak sets
//! `PR_SET_THP_DISABLE` on its own process first, and `shaper run`, its
//! child, inherits it. With THP on (Debian's default) one 2 MiB huge page
//! faulted in reads as a step of a tenth of a 20 MiB resident set, which
//! is the allocator's luck, not growth.
//!
//! Figures are taken after [`SoakPlan::warm_up`] (the flow table, the
//! telemetry maps and the allocator reach their working size first):
//! `rss_drift` is the largest deviation of a sample from their median, as
//! a fraction of it; `fd_growth` the last count less the first.
//!
//! Units: KiB, descriptors, seconds since the plan's start.
//!
//! Non-goals: pass or fail (the VM test and the bench read the figures),
//! CAKE beside it (CAKE has no controller to watch), fairness (the timed
//! cases measure it).

use std::{
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    thread::sleep,
    time::{Duration, Instant},
};

use serde::Serialize;
use tracing::info;

use super::{
    AppliedState, Host, LabError, State, Testbed,
    stats::percentile,
    timed::{self, BulkFlow, ShortTransfers, TimedPlan},
};
use crate::rate::Rate;

/// Pause between one flow of a slot and the next.
pub const BULK_GAP: Duration = Duration::from_millis(100);

/// Every this many samples the sampler also asks `shaper status`.
pub const STATUS_EVERY: u32 = 5;

/// What the soak runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoakPlan {
    /// How long the traffic runs.
    pub length: Duration,
    /// Bulk flows at once.
    pub bulk_slots: u32,
    /// How long each bulk flow lives.
    pub bulk_life: Duration,
    /// Payload of each short transfer.
    pub short_bytes: u64,
    /// Time between samples.
    pub every: Duration,
    /// Samples before this are not judged.
    pub warm_up: Duration,
}

impl SoakPlan {
    /// The bench's soak: ten minutes, with thousands of flows.
    pub fn bench(length: Duration) -> Self {
        Self {
            length,
            bulk_slots: 6,
            bulk_life: Duration::from_secs(20),
            short_bytes: 100_000,
            every: Duration::from_secs(1),
            warm_up: Duration::from_secs(60).min(length / 4),
        }
    }

    /// The flows of the run.
    pub fn timed_plan(&self) -> TimedPlan {
        let mut bulk = Vec::new();
        let life = self.bulk_life;
        for slot in 0..self.bulk_slots {
            let from = if slot % 2 == 0 {
                Host::Client
            } else {
                Host::Client2
            };
            let mut start = life * slot / self.bulk_slots.max(1);
            while start < self.length {
                let stop = (start + life).min(self.length);
                bulk.push(BulkFlow {
                    from,
                    udp: None,
                    start,
                    stop,
                });
                start = stop + BULK_GAP;
            }
        }
        TimedPlan {
            bulk,
            short: Some(ShortTransfers {
                from: Host::Client2,
                bytes: self.short_bytes,
                start: Duration::ZERO,
                stop: self.length,
            }),
        }
    }
}

/// One look at the controller.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the plan's start.
    pub at_s: f64,
    /// Resident set, KiB.
    pub rss_kib: u64,
    /// Its anonymous part (the heap, stacks), KiB.
    pub rss_anon_kib: u64,
    /// Its file-backed part (the binary, and the pages of the ring
    /// buffer's mapping as the consumer first reads them), KiB.
    pub rss_file_kib: u64,
    /// Open descriptors.
    pub fds: u64,
    /// `events_lost` from `shaper status --json`, when this sample asked;
    /// `None` also when status did not answer (see `status_ok`).
    pub events_lost: Option<u64>,
    /// False when this sample asked `shaper status` and it failed.
    pub status_ok: bool,
}

/// What a soak measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SoakReport {
    /// Seconds of traffic.
    pub length_s: f64,
    /// Flows that started and ended: bulk flows plus completed short
    /// transfers.
    pub flows: usize,
    /// Everything the receiver counted / the rate.
    pub goodput_ratio: f64,
    /// Samples at or after the warm-up.
    pub judged_samples: usize,
    /// Largest deviation of the resident set from its median, as a
    /// fraction of it (after the warm-up).
    pub rss_drift: f64,
    /// Median resident set after the warm-up, KiB.
    pub rss_median_kib: u64,
    /// Last descriptor count less the first (after the warm-up).
    pub fd_growth: i64,
    /// The last answered `events_lost`.
    pub events_lost: Option<u64>,
    /// Times `shaper status` did not answer.
    pub status_failures: u32,
    /// Every sample, in order.
    pub samples: Vec<Sample>,
}

/// What one look at `/proc/<pid>` finds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Look {
    rss_kib: u64,
    rss_anon_kib: u64,
    rss_file_kib: u64,
    fds: u64,
}

/// The controller's resident set (all of it, its anonymous part and its
/// file-backed part, in KiB) and its descriptor count.
fn look(pid: u32) -> Result<Look, LabError> {
    let path = format!("/proc/{pid}/status");
    let io = |source| LabError::Io {
        what: "reading the controller's status",
        path: path.clone(),
        source,
    };
    let text = std::fs::read_to_string(&path).map_err(io)?;
    let kib = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| LabError::Parse {
                command: path.clone(),
                detail: format!("no {key} line"),
            })
    };
    let (rss_kib, rss_anon_kib, rss_file_kib) =
        (kib("VmRSS:")?, kib("RssAnon:")?, kib("RssFile:")?);
    let fd_dir = format!("/proc/{pid}/fd");
    let fds = std::fs::read_dir(&fd_dir)
        .map_err(|source| LabError::Io {
            what: "listing the controller's descriptors",
            path: fd_dir.clone(),
            source,
        })?
        .count() as u64;
    Ok(Look {
        rss_kib,
        rss_anon_kib,
        rss_file_kib,
        fds,
    })
}

/// Turns transparent huge pages off for this process and the children it
/// starts from now on (see the module docs).
fn no_huge_pages() -> Result<(), LabError> {
    // SAFETY: prctl with PR_SET_THP_DISABLE takes integers only and
    // changes only this process's memory policy.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(LabError::Io {
            what: "turning transparent huge pages off (prctl PR_SET_THP_DISABLE)",
            path: "-".to_owned(),
            source: std::io::Error::last_os_error(),
        })
    }
}

/// Samples `applied`'s controller every `every` until `done`.
fn sample(
    applied: &AppliedState<'_>,
    pid: u32,
    every: Duration,
    t0: Instant,
    done: &AtomicBool,
) -> Result<Vec<Sample>, LabError> {
    let mut out = Vec::new();
    let mut n = 0u32;
    while !done.load(Ordering::Relaxed) {
        let l = look(pid)?;
        let mut s = Sample {
            at_s: t0.elapsed().as_secs_f64(),
            rss_kib: l.rss_kib,
            rss_anon_kib: l.rss_anon_kib,
            rss_file_kib: l.rss_file_kib,
            fds: l.fds,
            events_lost: None,
            status_ok: true,
        };
        if n.is_multiple_of(STATUS_EVERY) {
            match applied.counters() {
                Ok(c) => s.events_lost = c.get("events_lost").copied(),
                Err(e) => {
                    tracing::warn!("shaper status during the soak: {e}");
                    s.status_ok = false;
                }
            }
        }
        out.push(s);
        n += 1;
        let next = t0 + every * n;
        while !done.load(Ordering::Relaxed) && Instant::now() < next {
            sleep(Duration::from_millis(50).min(next.saturating_duration_since(Instant::now())));
        }
    }
    Ok(out)
}

/// The figures of `samples` judged from `warm_up` on.
pub fn judge(samples: &[Sample], warm_up: Duration) -> SoakReport {
    let judged: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at_s >= warm_up.as_secs_f64())
        .collect();
    let rss: Vec<f64> = judged.iter().map(|s| s.rss_kib as f64).collect();
    let rss_median = percentile(&rss, 50.0).unwrap_or(0.0);
    let rss_drift = if rss_median > 0.0 {
        rss.iter()
            .map(|r| (r - rss_median).abs() / rss_median)
            .fold(0.0, f64::max)
    } else {
        0.0
    };
    let fd_growth = match (judged.first(), judged.last()) {
        (Some(a), Some(b)) => b.fds as i64 - a.fds as i64,
        _ => 0,
    };
    SoakReport {
        judged_samples: judged.len(),
        rss_drift,
        rss_median_kib: rss_median as u64,
        fd_growth,
        events_lost: samples.iter().rev().find_map(|s| s.events_lost),
        status_failures: samples.iter().filter(|s| !s.status_ok).count() as u32,
        samples: samples.to_vec(),
        ..SoakReport::default()
    }
}

/// Runs the soak: the shaper at `rate` on `tb`'s WAN (`bin` is the
/// `shaper` binary), `plan`'s traffic, the controller sampled throughout.
pub fn run_soak(
    tb: &Testbed,
    bin: &Path,
    rate: Rate,
    plan: &SoakPlan,
) -> Result<SoakReport, LabError> {
    let state = State::Shaper {
        bin: bin.to_path_buf(),
        rate,
        extra_args: Vec::new(),
    };
    no_huge_pages()?;
    let applied = state.apply(tb)?;
    let pid = applied.shaper_pid().ok_or_else(|| LabError::Invalid {
        detail: "the shaper state has no controller process".to_owned(),
    })?;
    let flows = plan.timed_plan();
    let t0 = Instant::now() + timed::LEAD;
    let done = AtomicBool::new(false);
    let (timed, samples) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            sleep(t0.saturating_duration_since(Instant::now()));
            sample(&applied, pid, plan.every, t0, &done)
        });
        let timed = timed::run_timed(tb, &flows, t0);
        done.store(true, Ordering::Relaxed);
        let samples = sampler.join().map_err(|_| LabError::Invalid {
            detail: "the soak's sampler thread panicked".to_owned(),
        });
        (timed, samples)
    });
    let (timed, samples) = (timed?, samples??);
    applied.stop()?;
    let mut report = judge(&samples, plan.warm_up);
    let length = plan.length;
    let bytes: u64 = timed.bins.iter().flatten().sum::<u64>() + timed.short_bytes;
    report.length_s = length.as_secs_f64();
    report.flows = flows.bulk.len() + timed.transfers.len();
    report.goodput_ratio = bytes as f64 * 8.0 / length.as_secs_f64() / rate.bits_per_s() as f64;
    info!(
        "soak: {} flows in {:.0} s, RSS drift {:.3}, descriptors {:+}, events lost {:?}, \
         status failures {}",
        report.flows,
        report.length_s,
        report.rss_drift,
        report.fd_growth,
        report.events_lost,
        report.status_failures
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_stagger_and_cover_the_run() {
        let plan = SoakPlan {
            length: Duration::from_secs(60),
            bulk_slots: 4,
            bulk_life: Duration::from_secs(20),
            short_bytes: 1000,
            every: Duration::from_secs(1),
            warm_up: Duration::from_secs(10),
        };
        let p = plan.timed_plan();
        let starts: Vec<u64> = p
            .bulk
            .iter()
            .filter(|f| f.start < Duration::from_secs(20))
            .map(|f| f.start.as_secs())
            .collect();
        assert_eq!(starts, [0, 5, 10, 15]);
        assert!(
            p.bulk
                .iter()
                .all(|f| f.stop <= plan.length && f.start < f.stop)
        );
        // Each slot restarts after its gap, so some flow is always running
        // except during the gaps.
        assert!(p.bulk.len() >= 4 * 3 - 1, "{}", p.bulk.len());
        assert_eq!(p.end(), plan.length);
        assert_eq!(p.short.map(|s| s.stop), Some(plan.length));
    }

    #[test]
    fn judging_skips_the_warm_up() {
        let s = |at_s: f64, rss_kib: u64, fds: u64, lost: Option<u64>| Sample {
            at_s,
            rss_kib,
            fds,
            events_lost: lost,
            status_ok: true,
            ..Sample::default()
        };
        let samples = [
            s(0.0, 1000, 10, Some(0)),
            s(5.0, 2000, 14, None),
            s(10.0, 2000, 14, Some(3)),
            s(11.0, 2100, 15, None),
            s(12.0, 1900, 14, None),
        ];
        let r = judge(&samples, Duration::from_secs(10));
        assert_eq!(r.judged_samples, 3);
        assert_eq!(r.rss_median_kib, 2000);
        assert!((r.rss_drift - 0.05).abs() < 1e-9, "{}", r.rss_drift);
        assert_eq!(r.fd_growth, 0);
        assert_eq!(r.events_lost, Some(3));
        assert_eq!(r.status_failures, 0);
    }
}
