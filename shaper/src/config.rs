//! Validated configuration of `shaper run`, built from the raw CLI arguments.
//! Everything here is checked before anything on the system changes.

use std::time::Duration;

use shaper_common::config::{
    FLAG_ECN, FLAG_FAIR, FLAG_TELEMETRY, FLAG_WASH, PacerConfig, sample_threshold,
};

use crate::{
    pacer::{PacerArgs, PacerError, PacerKind, PacerSettings},
    rate::Rate,
    tc::FqParams,
};

/// Shortest accepted horizon: below a few packet times at the slowest rate
/// the pacer would drop nearly everything.
pub const MIN_HORIZON: Duration = Duration::from_millis(10);
/// Longest accepted horizon: sch_fq's own default horizon (10 s), beyond which
/// it would drop or cap the packet itself.
pub const MAX_HORIZON: Duration = Duration::from_secs(10);

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// Horizon out of range.
    #[error("--horizon {given_ms} ms is out of range: give 10ms to 10s (default 500ms)")]
    Horizon {
        /// What was given, in ms.
        given_ms: u128,
    },
    /// Pacer settings refused.
    #[error(transparent)]
    Pacer(#[from] PacerError),
    /// `--nat` without the LAN interfaces it records on.
    #[error(
        "--nat reads each connection's LAN host on the LAN side, before masquerading: name the \
         LAN interfaces with --lan IF (e.g. --lan br-lan; repeat it for each)"
    )]
    NatWithoutLan,
    /// `--nat` where no direction isolates hosts, so nothing would use it.
    #[error(
        "--nat changes which host a packet counts for, and host isolation is off: add --isolate \
         with a mode that has hosts (dual-srchost for the upload, dual-dsthost or triple-isolate \
         for both directions)"
    )]
    NatWithoutHosts,
}

/// What `shaper run` shapes and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunConfig {
    /// Interface to shape (egress).
    pub iface: String,
    /// Shaping rate.
    pub rate: Rate,
    /// Packets that would leave later than this are dropped by the pacer.
    pub horizon: Duration,
    /// Which pacer, with its AQM and flow table settings.
    pub pacer: PacerSettings,
    /// Telemetry sampling (1 packet in N, besides every drop and mark; 0:
    /// those only); `None`: no telemetry records at all.
    pub sample_every: Option<u32>,
    /// The interface is an IFB fed from another's ingress (`ifb` mode):
    /// the pacer sets `FLAG_DELIVERY_MONO`.
    pub from_ingress: bool,
    /// `--nat`: where the run's map of LAN hosts is pinned (`crate::nat`);
    /// the pacer sets `FLAG_NAT`.
    pub nat_map: Option<std::path::PathBuf>,
}

/// sch_fq's own timer slack, the least the shaper sets.
pub const FQ_TIMER_SLACK_MIN_NS: u32 = 10_000;
/// The most timer slack the shaper sets, whatever the CoDel target.
pub const FQ_TIMER_SLACK_MAX_NS: u32 = 1_000_000;

/// sch_fq's timer slack for a CoDel target of `target_ns`: a tenth of it,
/// within [`FQ_TIMER_SLACK_MIN_NS`]..=[`FQ_TIMER_SLACK_MAX_NS`].
pub fn fq_timer_slack_ns(target_ns: u64) -> u32 {
    let slack_ns = (target_ns / 10).clamp(
        u64::from(FQ_TIMER_SLACK_MIN_NS),
        u64::from(FQ_TIMER_SLACK_MAX_NS),
    );
    u32::try_from(slack_ns).unwrap_or(FQ_TIMER_SLACK_MAX_NS)
}

impl RunConfig {
    /// Validates the parts the types do not already guarantee; the fair
    /// pacer with its defaults.
    pub fn new(iface: String, rate: Rate, horizon: Duration) -> Result<Self, ConfigError> {
        Self::with_pacer(iface, rate, horizon, &PacerArgs::default())
    }

    /// As [`RunConfig::new`], with the pacer settings given.
    pub fn with_pacer(
        iface: String,
        rate: Rate,
        horizon: Duration,
        pacer: &PacerArgs,
    ) -> Result<Self, ConfigError> {
        if !(MIN_HORIZON..=MAX_HORIZON).contains(&horizon) {
            return Err(ConfigError::Horizon {
                given_ms: horizon.as_millis(),
            });
        }
        let pacer = PacerSettings::resolve(pacer, rate)?;
        Ok(Self {
            iface,
            rate,
            horizon,
            pacer,
            sample_every: None,
            from_ingress: false,
            nat_map: None,
        })
    }

    /// The sch_fq settings that fit the pacer (the reasons are in
    /// `docs/pacer.md`, section "sch_fq settings"):
    /// - `horizon`: the pacer's plus 1 s, so sch_fq never drops or caps a
    ///   packet the pacer stamped, and `horizon_drop` stays on as a backstop;
    /// - `flow_limit` and `limit`: what the pacer can have scheduled, the
    ///   rate times its horizon in full-size frames, twice over, at least
    ///   sch_fq's defaults (100 and 10000); capped at 1M packets;
    /// - `orphan_mask`: all 32 bits, so forwarded flows (no socket) get a
    ///   queue each by skb hash: a sparse packet sharing a queue with a
    ///   paced flow would wait behind that flow's stamped packets;
    /// - `buckets`: 2^log2(flows/4), at least sch_fq's 2^10 and at most its
    ///   2^18, so flow lookup stays short with the flow table full;
    /// - timer slack: a tenth of the CoDel target, within
    ///   [`FQ_TIMER_SLACK_MIN_NS`]..=[`FQ_TIMER_SLACK_MAX_NS`]: sch_fq's
    ///   watchdog may fire that late, so the packets due within it leave in
    ///   one run of the queue instead of a timer each; what it adds to a
    ///   packet's delay stays a small part of the standing delay CoDel
    ///   accepts;
    /// - `quantum`, `initial_quantum`: sch_fq's defaults; they only order
    ///   packets that are already due.
    pub fn fq_params(&self) -> FqParams {
        let horizon_us = u32::try_from(self.horizon.as_micros() + 1_000_000).unwrap_or(u32::MAX);
        let frames = u128::from(self.rate.bytes_per_s()) * self.horizon.as_millis() / 1000 / 1514;
        let frames = u32::try_from((2 * frames).min(1 << 20)).unwrap_or(1 << 20);
        let flows = self.pacer.flows.max(4);
        let buckets_log = (flows / 4).ilog2().clamp(10, 18);
        FqParams {
            limit_packets: Some(frames.max(10_000)),
            flow_limit_packets: Some(frames.max(100)),
            orphan_mask: Some(u32::MAX),
            buckets_log: Some(buckets_log),
            horizon_us: Some(horizon_us),
            horizon_drop: Some(true),
            timer_slack_ns: Some(fq_timer_slack_ns(self.pacer.target_ns)),
            ..FqParams::default()
        }
    }

    /// The classifier's configuration map value.
    pub fn pacer_config(&self, has_l2_header: bool) -> PacerConfig {
        let mut c = PacerConfig::new(self.rate.bytes_per_s(), self.rate.scaled());
        // In range by validation (<= 10 s), so it fits.
        c.horizon_ns = u64::try_from(self.horizon.as_nanos()).unwrap_or(u64::MAX);
        if !has_l2_header {
            c.flags |= shaper_common::config::FLAG_NO_L2;
        }
        let p = &self.pacer;
        c.flags &= !(FLAG_FAIR | FLAG_ECN);
        if p.kind == PacerKind::Fair {
            c.flags |= FLAG_FAIR;
        }
        if p.ecn {
            c.flags |= FLAG_ECN;
        }
        c.target_ns = p.target_ns;
        c.interval_ns = p.interval_ns;
        c.diffserv = p.diffserv.index();
        c.tin_planes = p.diffserv.planes();
        if p.wash {
            c.flags |= FLAG_WASH;
        }
        c.framing = p.framing;
        c.set_isolation(p.isolation);
        c.flow_sets_mask = p.flow_sets() - 1;
        c.hash_seed = random_seed();
        c.flags &= !FLAG_TELEMETRY;
        c.sample_threshold = 0;
        if let Some(n) = self.sample_every {
            c.flags |= FLAG_TELEMETRY;
            c.sample_threshold = sample_threshold(n);
        }
        if self.from_ingress {
            c.flags |= shaper_common::config::FLAG_DELIVERY_MONO;
        }
        if self.nat_map.is_some() {
            c.flags |= shaper_common::config::FLAG_NAT;
        }
        c
    }
}

/// What one `shaper run` shapes: each direction it was given a rate for,
/// validated. Built before anything on the system is looked at
/// (`RunArgs::plan` in `crate::cli`), so the flags and a config file's
/// sections are refused the same way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunPlan {
    /// The upload (`--rate`).
    pub egress: Option<RunConfig>,
    /// The download (`--ingress-rate`), in `args.ingress_mode`.
    pub ingress: Option<RunConfig>,
}

/// A per-run seed for the flow hash, from the standard library's per-process
/// random keys.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::from(std::process::id()));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> Rate {
        s.parse().expect("valid rate")
    }

    #[test]
    fn horizon_is_bounded() {
        let ok = RunConfig::new("veth0".into(), rate("20mbit"), Duration::from_secs(2));
        assert!(ok.is_ok());
        for bad in [
            Duration::from_millis(9),
            Duration::from_secs(11),
            Duration::ZERO,
        ] {
            let err =
                RunConfig::new("veth0".into(), rate("20mbit"), bad).expect_err("out of range");
            assert!(err.to_string().contains("10ms to 10s"), "{err}");
        }
    }

    #[test]
    fn pacer_config_carries_rate_horizon_and_l2() {
        let c =
            RunConfig::new("v".into(), rate("20mbit"), Duration::from_millis(500)).expect("valid");
        let p = c.pacer_config(true);
        assert_eq!(p.rate_bytes_per_s, 2_500_000);
        assert_eq!(p.horizon_ns, 500_000_000);
        assert!(p.enabled());
        assert_eq!(p.scaled_rate().tx_time_ns(1500), 600_000);
        assert_eq!(p.flags & shaper_common::config::FLAG_NO_L2, 0);
        let p = c.pacer_config(false);
        assert_ne!(p.flags & shaper_common::config::FLAG_NO_L2, 0);
        assert_eq!((p.flags & FLAG_TELEMETRY, p.sample_threshold), (0, 0));
        let mut c = c;
        c.sample_every = Some(64);
        let p = c.pacer_config(true);
        assert_ne!(p.flags & FLAG_TELEMETRY, 0);
        assert_eq!(p.sample_threshold, 1 << 26);
        c.sample_every = Some(0);
        assert_eq!(c.pacer_config(true).sample_threshold, 0);
    }

    #[test]
    fn fq_fits_the_pacer() {
        let c =
            RunConfig::new("v".into(), rate("50mbit"), Duration::from_millis(500)).expect("valid");
        let fq = c.fq_params();
        // 6.25 MB/s for 0.5 s is 2064 frames; twice that.
        assert_eq!(fq.flow_limit_packets, Some(4128));
        assert_eq!(fq.limit_packets, Some(10_000));
        assert_eq!(fq.horizon_us, Some(1_500_000));
        assert_eq!(fq.orphan_mask, Some(u32::MAX));
        assert_eq!(fq.buckets_log, Some(14));
        // A tenth of the default 5 ms target.
        assert_eq!(fq.timer_slack_ns, Some(500_000));
        fq.validate().expect("sch_fq accepts it");
        let p = c.pacer_config(true);
        assert_ne!(p.flags & FLAG_FAIR, 0);
        assert_eq!(p.flow_sets_mask, 8191);
        assert_eq!((p.target_ns, p.interval_ns), (5_000_000, 100_000_000));
    }

    #[test]
    fn the_timer_slack_is_a_tenth_of_the_target_within_its_bounds() {
        assert_eq!(fq_timer_slack_ns(5_000_000), 500_000);
        assert_eq!(fq_timer_slack_ns(1_000_000), 100_000);
        assert_eq!(fq_timer_slack_ns(20_000), FQ_TIMER_SLACK_MIN_NS);
        assert_eq!(fq_timer_slack_ns(50_000_000), FQ_TIMER_SLACK_MAX_NS);
        assert_eq!(fq_timer_slack_ns(u64::MAX), FQ_TIMER_SLACK_MAX_NS);
    }
}
