//! A minute of churn under the shaper: `shaper::lab::soak`, the bench's
//! soak (`cargo xtask bench --soak`, ten minutes) made short. Bulk TCP
//! flows start and end on a stagger beside back-to-back 100 KB transfers,
//! at 50 Mbit/s and 20 ms RTT, with `shaper run` sampled every second.
//! After [`WARM_UP`] (longer than the controller's 30 s idle timeout, so
//! its flow table has reached its working size):
//! - its resident set stays within [`RSS_DRIFT`] of its median;
//! - its descriptor count does not grow;
//! - the telemetry ring loses no record (`events_lost` stays 0);
//! - `shaper status` answers every time it is asked;
//!
//! and at least [`MIN_FLOWS`] flows came and went, so the run churned.
//!
//! A controller that keeps ended flows, leaks a descriptor per flow, or
//! falls behind the ring fails here.
//!
//! Needs sch_fq and sch_netem (the VM's kernels); elsewhere it skips with a
//! reason, and under `SHAPER_REQUIRE_FULL_KERNEL=1` a skip fails.
//!
//! Environment: `SHAPER_BIN` (the shaper binary).

use std::time::Duration;

use shaper::{
    lab::{
        TestbedOptions,
        soak::{SoakPlan, run_soak},
    },
    rate::Rate,
};
use shaper_tests::{
    skip::{Need, require},
    topo::shaper_bin,
    vs_cake,
};

const NEEDS: &[Need<'static>] = &[Need::Root, Need::Sch("fq"), Need::Sch("netem")];

/// How long the flows run.
const LENGTH: Duration = Duration::from_secs(60);
/// Samples before this are not judged.
const WARM_UP: Duration = Duration::from_secs(30);
/// The resident set's largest deviation from its median.
const RSS_DRIFT: f64 = 0.05;
/// Flows that must have started and ended.
const MIN_FLOWS: usize = 100;

#[test]
fn a_minute_of_churn_leaves_the_controller_flat() {
    if !require(NEEDS) {
        return;
    }
    let tb = vs_cake::testbed(TestbedOptions {
        client_delay: Duration::from_millis(20),
        ..TestbedOptions::default()
    });
    let rate: Rate = "50mbit".parse().expect("a valid rate");
    let plan = SoakPlan {
        length: LENGTH,
        bulk_slots: 4,
        bulk_life: Duration::from_secs(10),
        short_bytes: 100_000,
        every: Duration::from_secs(1),
        warm_up: WARM_UP,
    };
    let r = run_soak(&tb, &shaper_bin(), rate, &plan).expect("the soak runs");
    let series: Vec<String> = r
        .samples
        .iter()
        .map(|s| {
            format!(
                "{:.0}s {} KiB (anon {}, file {}) {} fds",
                s.at_s, s.rss_kib, s.rss_anon_kib, s.rss_file_kib, s.fds
            )
        })
        .collect();
    eprintln!(
        "{} flows, goodput {:.3} of the rate; RSS median {} KiB, drift {:.4}; descriptors \
         {:+}; events lost {:?}; status failures {}\n  {}",
        r.flows,
        r.goodput_ratio,
        r.rss_median_kib,
        r.rss_drift,
        r.fd_growth,
        r.events_lost,
        r.status_failures,
        series.join(", ")
    );
    assert!(r.flows >= MIN_FLOWS, "only {} flows came and went", r.flows);
    assert!(
        r.judged_samples >= 20,
        "{} samples after the warm-up",
        r.judged_samples
    );
    assert!(
        r.rss_drift <= RSS_DRIFT,
        "RSS drifted {:.3} from its median of {} KiB (allowed {RSS_DRIFT})",
        r.rss_drift,
        r.rss_median_kib
    );
    assert!(r.fd_growth <= 0, "descriptors grew by {}", r.fd_growth);
    assert_eq!(r.events_lost, Some(0), "telemetry records were lost");
    assert_eq!(r.status_failures, 0, "shaper status did not answer");
}
