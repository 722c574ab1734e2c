//! Options of sch_fq, the qdisc that enforces the departure times (EDT)
//! the shaper's BPF program writes into `skb->tstamp`.
//!
//! Every field is optional: `None` leaves the kernel's default, set in
//! `fq_init` (net/sched/sch_fq.c). Attribute numbers and units are those of
//! `TCA_FQ_*` in include/uapi/linux/pkt_sched.h; each is a `u32` except
//! `TCA_FQ_HORIZON_DROP`, a `u8`.
//!
//! Non-goals: `TCA_FQ_PRIOMAP`/`TCA_FQ_WEIGHTS` (band scheduling, 6.7+) and
//! the obsolete `TCA_FQ_FLOW_DEFAULT_RATE`.

use super::TcError;
use super::message::{Attr, encode_attrs};

const TCA_FQ_PLIMIT: u16 = 1;
const TCA_FQ_FLOW_PLIMIT: u16 = 2;
const TCA_FQ_QUANTUM: u16 = 3;
const TCA_FQ_INITIAL_QUANTUM: u16 = 4;
const TCA_FQ_RATE_ENABLE: u16 = 5;
const TCA_FQ_FLOW_MAX_RATE: u16 = 7;
const TCA_FQ_BUCKETS_LOG: u16 = 8;
const TCA_FQ_FLOW_REFILL_DELAY: u16 = 9;
const TCA_FQ_ORPHAN_MASK: u16 = 10;
const TCA_FQ_LOW_RATE_THRESHOLD: u16 = 11;
const TCA_FQ_CE_THRESHOLD: u16 = 12;
const TCA_FQ_TIMER_SLACK: u16 = 13;
const TCA_FQ_HORIZON: u16 = 14;
const TCA_FQ_HORIZON_DROP: u16 = 15;

/// `fq_change` accepts a quantum in `1..=1 << 20` bytes.
const MAX_QUANTUM: u32 = 1 << 20;
/// `fq_change` accepts `1..=ilog2(256 * 1024)` for the bucket count's log.
const MAX_BUCKETS_LOG: u32 = 18;

/// sch_fq parameters; `None` means the kernel default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FqParams {
    /// Packets queued in total before drops (`limit`, default 10000).
    pub limit_packets: Option<u32>,
    /// Packets queued per flow before drops (`flow_limit`, default 100).
    pub flow_limit_packets: Option<u32>,
    /// Bytes a flow may send per round (`quantum`, default 2 × MTU).
    pub quantum_bytes: Option<u32>,
    /// Bytes a new flow may send in its first round (`initial_quantum`,
    /// default 10 × MTU).
    pub initial_quantum_bytes: Option<u32>,
    /// Honour per-socket pacing rates (`pacing`/`nopacing`, default on).
    pub rate_enable: Option<bool>,
    /// Cap per flow in bytes per second (`maxrate`, default unlimited).
    pub flow_max_rate_bytes_per_sec: Option<u32>,
    /// log2 of the flow hash table size (`buckets`, default 10).
    pub buckets_log: Option<u32>,
    /// Microseconds before a flow's credit refills (`refill_delay`, 40 ms).
    pub flow_refill_delay_us: Option<u32>,
    /// Mask on hashes of packets without a socket (`orphanmask`, 1023).
    pub orphan_mask: Option<u32>,
    /// Flows below this many bytes per second are paced per packet
    /// (`low_rate_threshold`, default 550 kbit/s).
    pub low_rate_threshold_bytes_per_sec: Option<u32>,
    /// Mark CE when a packet waits longer than this, microseconds
    /// (`ce_threshold`, default off).
    pub ce_threshold_us: Option<u32>,
    /// Timer slack in nanoseconds (`timer_slack`, default 10 µs).
    pub timer_slack_ns: Option<u32>,
    /// Packets with a departure time further than this many microseconds
    /// ahead are beyond the horizon (`horizon`, default 10 s).
    pub horizon_us: Option<u32>,
    /// Drop packets beyond the horizon (true, default) or cap their
    /// departure time to it (false).
    pub horizon_drop: Option<bool>,
}

impl FqParams {
    /// Checks the ranges `fq_change` enforces, so a bad value is reported
    /// by field name before anything is changed.
    pub fn validate(&self) -> Result<(), TcError> {
        let invalid = |reason: String| {
            Err(TcError::InvalidArgument {
                what: "fq parameters",
                reason,
            })
        };
        if let Some(q) = self.quantum_bytes
            && (q == 0 || q > MAX_QUANTUM)
        {
            return invalid(format!("quantum_bytes {q} is outside 1..={MAX_QUANTUM}"));
        }
        if let Some(b) = self.buckets_log
            && !(1..=MAX_BUCKETS_LOG).contains(&b)
        {
            return invalid(format!("buckets_log {b} is outside 1..={MAX_BUCKETS_LOG}"));
        }
        Ok(())
    }

    /// The `TCA_OPTIONS` attributes for these parameters, in attribute order.
    pub fn attrs(&self) -> Vec<Attr> {
        let u32s = [
            (TCA_FQ_PLIMIT, self.limit_packets),
            (TCA_FQ_FLOW_PLIMIT, self.flow_limit_packets),
            (TCA_FQ_QUANTUM, self.quantum_bytes),
            (TCA_FQ_INITIAL_QUANTUM, self.initial_quantum_bytes),
            (TCA_FQ_RATE_ENABLE, self.rate_enable.map(u32::from)),
            (TCA_FQ_FLOW_MAX_RATE, self.flow_max_rate_bytes_per_sec),
            (TCA_FQ_BUCKETS_LOG, self.buckets_log),
            (TCA_FQ_FLOW_REFILL_DELAY, self.flow_refill_delay_us),
            (TCA_FQ_ORPHAN_MASK, self.orphan_mask),
            (
                TCA_FQ_LOW_RATE_THRESHOLD,
                self.low_rate_threshold_bytes_per_sec,
            ),
            (TCA_FQ_CE_THRESHOLD, self.ce_threshold_us),
            (TCA_FQ_TIMER_SLACK, self.timer_slack_ns),
            (TCA_FQ_HORIZON, self.horizon_us),
        ];
        let mut attrs: Vec<Attr> = u32s
            .iter()
            .filter_map(|&(ty, v)| v.map(|v| Attr::u32(ty, v)))
            .collect();
        if let Some(drop) = self.horizon_drop {
            attrs.push(Attr::u8(TCA_FQ_HORIZON_DROP, u8::from(drop)));
        }
        attrs
    }

    /// The payload of `TCA_OPTIONS` (an attribute list, possibly empty).
    pub fn options(&self) -> Vec<u8> {
        encode_attrs(&self.attrs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_send_no_attributes() {
        assert!(FqParams::default().attrs().is_empty());
        assert!(FqParams::default().options().is_empty());
    }

    #[test]
    fn set_fields_map_to_their_attributes() {
        let p = FqParams {
            limit_packets: Some(500),
            horizon_us: Some(2_000_000),
            horizon_drop: Some(false),
            rate_enable: Some(true),
            ..FqParams::default()
        };
        assert_eq!(
            p.attrs(),
            vec![
                Attr::u32(TCA_FQ_PLIMIT, 500),
                Attr::u32(TCA_FQ_RATE_ENABLE, 1),
                Attr::u32(TCA_FQ_HORIZON, 2_000_000),
                Attr::u8(TCA_FQ_HORIZON_DROP, 0),
            ]
        );
        p.validate().expect("must succeed");
    }

    #[test]
    fn out_of_range_values_name_the_field() {
        let e = FqParams {
            quantum_bytes: Some(0),
            ..FqParams::default()
        }
        .validate()
        .expect_err("must fail");
        assert!(e.to_string().contains("quantum_bytes 0"), "{e}");
        let e = FqParams {
            buckets_log: Some(19),
            ..FqParams::default()
        }
        .validate()
        .expect_err("must fail");
        assert!(e.to_string().contains("buckets_log 19"), "{e}");
    }
}
