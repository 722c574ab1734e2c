//! Caps the shaped device's GSO size while the shaper runs, so that local
//! TCP senders build super-packets of about a millisecond at the shaped
//! rate, and puts the old sizes back afterwards.
//!
//! Why: TCP sizes its TSO/GSO bursts to about 1 ms at its own pacing rate
//! (`tcp_tso_autosize`, `sk_pacing_shift` 10), clamped by the device's
//! `gso_max_size`. A local sender on an unloaded veth paces far above the
//! shaped rate and sends 64 KB packets: at a 5 Mbit/s fair share one such
//! packet is 105 ms, so the flow lives in a handful of huge lumps that the
//! pacer can only stamp whole (the fair pacer's local 20 Mbit/s goodput
//! fell to 0.45–0.77 of the rate). CAKE splits GSO packets in the qdisc
//! below 1 Gbit/s; a TC classifier cannot, but the device limit makes the
//! sender build them small. Forwarded traffic is unaffected: the limit is
//! read by local sockets when they connect (`sk_setup_caps`).
//!
//! Invariants: the cap only ever lowers a size; the sizes before are in
//! the state record before the change, so `shaper cleanup` restores them
//! after a crash. `gso_ipv4_max_size` (Linux 6.3+, BIG TCP) is read and
//! restored when the kernel reports it, since IPv4 sockets read that one.
//!
//! Units: bytes. Non-goals: `gso_max_segs`, GRO sizes, changing the cap
//! with `set-rate` (sockets read it once, at connect).

use netlink_packet_core::Emitable;
use netlink_packet_route::link::{LinkAttribute, LinkMessage};

use crate::tc::netlink::Netlink;

/// `RTM_SETLINK` in `include/uapi/linux/rtnetlink.h`.
const RTM_SETLINK: u16 = 19;

/// The legacy GSO limit (`GSO_LEGACY_MAX_SIZE`): the cap never goes above.
pub const GSO_LEGACY_MAX_BYTES: u32 = 65_536;

/// An interface's GSO size limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GsoSizes {
    /// `IFLA_GSO_MAX_SIZE`.
    pub max_bytes: u32,
    /// `IFLA_GSO_IPV4_MAX_SIZE`, where the kernel has it (6.3+).
    pub ipv4_max_bytes: Option<u32>,
}

/// The GSO size for a shaped rate: one millisecond at the rate, at least
/// four frames of `mtu_bytes` plus link header, at most 64 KB.
///
/// Why four frames for a floor of two segments: the kernel keeps
/// `MAX_TCP_HEADER + 1` (about 320 B) of the limit for headers before it
/// divides by the MSS (`sk_setup_caps`, `tcp_xmit_size_goal`); a limit of
/// two frames (3028 B) gave one-segment packets on Linux 6.1, i.e. no GSO
/// at all. Four frames leave three segments on 6.1 and 6.12.
pub fn cap_bytes(rate_bytes_per_s: u64, mtu_bytes: u32) -> u32 {
    let one_ms = rate_bytes_per_s / 1_000;
    let floor = 4 * (u64::from(mtu_bytes) + 14);
    let cap = one_ms.max(floor).min(u64::from(GSO_LEGACY_MAX_BYTES));
    // At most 65536 after the min: fits.
    u32::try_from(cap).unwrap_or(GSO_LEGACY_MAX_BYTES)
}

/// The sizes to set on a device that has `now`, for a cap of `cap`, or
/// `None` when the device already sends packets no larger.
pub fn capped(now: GsoSizes, cap: u32) -> Option<GsoSizes> {
    let lower = |v: u32| v.min(cap);
    let next = GsoSizes {
        max_bytes: lower(now.max_bytes),
        ipv4_max_bytes: now.ipv4_max_bytes.map(lower),
    };
    (next != now).then_some(next)
}

/// Failures setting GSO sizes.
#[derive(Debug, thiserror::Error)]
pub enum GsoError {
    /// The kernel refused the change.
    #[error("setting the GSO size of ifindex {ifindex} to {sizes:?} failed: {detail}")]
    Set {
        /// The device.
        ifindex: u32,
        /// What was asked for.
        sizes: GsoSizes,
        /// The errno and the kernel's message.
        detail: String,
    },
}

/// Sets `sizes` on the device `ifindex` (one `RTM_SETLINK`). The kernel
/// applies `gso_max_size` first, which also sets the IPv4 size when at most
/// 64 KB, then the IPv4 size if given.
pub fn set(ifindex: u32, sizes: GsoSizes) -> Result<(), GsoError> {
    let err = |detail: String| GsoError::Set {
        ifindex,
        sizes,
        detail,
    };
    let mut msg = LinkMessage::default();
    msg.header.index = ifindex;
    msg.attributes
        .push(LinkAttribute::GsoMaxSize(sizes.max_bytes));
    if let Some(v4) = sizes.ipv4_max_bytes {
        msg.attributes.push(LinkAttribute::GsoIpv4MaxSize(v4));
    }
    let mut body = vec![0u8; msg.buffer_len()];
    msg.emit(&mut body);
    let mut nl = Netlink::open().map_err(|e| err(e.to_string()))?;
    nl.request(RTM_SETLINK, 0, &body).map(drop).map_err(|e| {
        err(match e.kernel {
            Some(k) => format!("{}: {k}", e.source),
            None => e.source.to_string(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_millisecond_at_the_rate_within_four_frames_and_64k() {
        // 20 Mbit/s: 2500 B, below four 1500-byte frames.
        assert_eq!(cap_bytes(2_500_000, 1500), 6056);
        // 200 Mbit/s: 25 KB.
        assert_eq!(cap_bytes(25_000_000, 1500), 25_000);
        // 1 Gbit/s and more: the legacy maximum.
        assert_eq!(cap_bytes(125_000_000, 1500), 65_536);
        // Jumbo frames raise the floor.
        assert_eq!(cap_bytes(2_500_000, 9000), 36_056);
    }

    #[test]
    fn only_ever_lowers() {
        let now = GsoSizes {
            max_bytes: 65_536,
            ipv4_max_bytes: Some(65_536),
        };
        assert_eq!(
            capped(now, 6056),
            Some(GsoSizes {
                max_bytes: 6056,
                ipv4_max_bytes: Some(6056)
            })
        );
        assert_eq!(capped(now, 65_536), None);
        let small = GsoSizes {
            max_bytes: 2000,
            ipv4_max_bytes: None,
        };
        assert_eq!(capped(small, 3028), None);
        // BIG TCP: only the IPv4 size is above the cap.
        let big = GsoSizes {
            max_bytes: 3000,
            ipv4_max_bytes: Some(185_000),
        };
        assert_eq!(
            capped(big, 3028),
            Some(GsoSizes {
                max_bytes: 3000,
                ipv4_max_bytes: Some(3028)
            })
        );
    }
}
