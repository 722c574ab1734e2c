//! Telemetry: what the kernel programs report over BPF ring buffers, turned
//! into per-flow state and shown.
//!
//! Data path: a reader task waits on the ring buffer's fd with tokio's
//! `AsyncFd`, copies each record into a lock-free single-producer
//! single-consumer ring (`ringbuf`), and wakes the aggregator, which owns
//! the [`FlowTable`]. Once per interval the aggregator ages the table,
//! reads the kernel's exact counters, and emits: a refreshing table on a
//! terminal, a plain line when piped, or NDJSON records (`--json`); and it
//! publishes Prometheus text for `--metrics`.
//!
//! Invariants: the kernel never waits for the controller (a full kernel ring
//! counts `events_lost`; a full SPSC ring counts `events_dropped_user`), and
//! nothing here blocks the reader but the aggregator's own work.
//!
//! Non-goals: storing history; the exporters show the present.

pub mod flows;
pub mod metrics;
pub mod pipeline;
pub mod source;
pub mod view;

pub use flows::{FlowRow, FlowStats, FlowTable, FlowTableOptions, Window};
pub use pipeline::{Output, Pipeline, PipelineOptions, Summary};

/// Errors of the telemetry path.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The histogram crate refused its bounds (a bug here).
    #[error("cannot create a delay histogram: {0}")]
    Histogram(String),
    /// The ring buffer map could not be opened or polled.
    #[error("cannot read the {map} ring buffer: {detail}")]
    Ring {
        /// The map's name.
        map: String,
        /// What failed.
        detail: String,
    },
    /// The metrics endpoint could not listen.
    #[error("cannot serve metrics on {addr} (pick a free port, e.g. --metrics 127.0.0.1:9465)")]
    Listen {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A bound metrics listener could not be handed to the runtime.
    #[error("cannot serve metrics on the bound listener")]
    Serve(#[source] std::io::Error),
}

impl TelemetryError {
    /// True when the user can fix the error by changing the command line
    /// (the metrics address): a usage error, exit 2.
    pub fn is_usage_error(&self) -> bool {
        matches!(self, TelemetryError::Listen { .. })
    }
}

/// A 5-tuple as people write it: `10.0.0.1:443 > 10.0.0.2:5000 tcp`.
pub fn flow_label(key: &shaper_common::event::FlowKey) -> String {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use shaper_common::event::{FAMILY_IPV4, FAMILY_IPV6};
    let proto = match key.proto {
        6 => "tcp".to_owned(),
        17 => "udp".to_owned(),
        1 => "icmp".to_owned(),
        58 => "icmpv6".to_owned(),
        p => format!("proto{p}"),
    };
    let (sport, dport) = (u16::from_be(key.sport_be), u16::from_be(key.dport_be));
    let with_port = |a: String, p: u16, v6: bool| match (p, v6) {
        (0, _) => a,
        (p, true) => format!("[{a}]:{p}"),
        (p, false) => format!("{a}:{p}"),
    };
    match key.family {
        FAMILY_IPV4 => {
            let s = Ipv4Addr::new(key.saddr[0], key.saddr[1], key.saddr[2], key.saddr[3]);
            let d = Ipv4Addr::new(key.daddr[0], key.daddr[1], key.daddr[2], key.daddr[3]);
            format!(
                "{} > {} {proto}",
                with_port(s.to_string(), sport, false),
                with_port(d.to_string(), dport, false)
            )
        }
        FAMILY_IPV6 => {
            let s = Ipv6Addr::from(key.saddr);
            let d = Ipv6Addr::from(key.daddr);
            format!(
                "{} > {} {proto}",
                with_port(s.to_string(), sport, true),
                with_port(d.to_string(), dport, true)
            )
        }
        _ => format!("non-ip ethertype 0x{:04x}", key.ethertype),
    }
}

#[cfg(test)]
mod tests {
    use shaper_common::event::{FAMILY_IPV6, FlowKey};

    use super::*;

    #[test]
    fn labels_read_like_tcpdump() {
        let mut k = FlowKey {
            family: 4,
            proto: 6,
            sport_be: 443u16.to_be(),
            dport_be: 5000u16.to_be(),
            ..FlowKey::default()
        };
        k.saddr[..4].copy_from_slice(&[10, 0, 0, 1]);
        k.daddr[..4].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(flow_label(&k), "10.0.0.1:443 > 10.0.0.2:5000 tcp");
        k.proto = 1;
        k.sport_be = 0;
        k.dport_be = 0;
        assert_eq!(flow_label(&k), "10.0.0.1 > 10.0.0.2 icmp");
        let mut k6 = FlowKey {
            family: FAMILY_IPV6,
            proto: 17,
            sport_be: 53u16.to_be(),
            dport_be: 53u16.to_be(),
            ..FlowKey::default()
        };
        k6.saddr[15] = 1;
        k6.daddr[15] = 2;
        assert_eq!(flow_label(&k6), "[::1]:53 > [::2]:53 udp");
        let arp = FlowKey {
            ethertype: 0x0806,
            ..FlowKey::default()
        };
        assert_eq!(flow_label(&arp), "non-ip ethertype 0x0806");
    }
}
