//! Upstream cake_mq (Linux ≥ 7.0) as a lab state: one CAKE per TX queue
//! under one parent that shares the rate among the queues. Configured only
//! through the parent, with CAKE's own netlink options; iproute2 releases
//! before the qdisc cannot say `cake_mq`, so the lab sends the request
//! itself, from a thread inside the router's namespace.
//!
//! Options sent: the rate (`TCA_CAKE_BASE_RATE64`, bytes per second) and
//! the tins (`TCA_CAKE_DIFFSERV_MODE`: besteffort, diffserv3, diffserv4 or
//! diffserv8); everything else is CAKE's default, as the lab's one CAKE at
//! the root (`State::Cake`). Numbers from include/uapi/linux/pkt_sched.h.
//!
//! Non-goals: other CAKE options, changing the rate of a running cake_mq.

use std::thread;

use super::{
    LabError,
    topology::{Host, Testbed, enter_netns},
};
use crate::{
    rate::Rate,
    tc::{Attr, encode_attrs, install_plain_root},
};

/// `TCA_CAKE_BASE_RATE64`: the shaped rate, bytes per second (u64).
const TCA_CAKE_BASE_RATE64: u16 = 2;
/// `TCA_CAKE_DIFFSERV_MODE` (u32).
const TCA_CAKE_DIFFSERV_MODE: u16 = 3;
/// `CAKE_DIFFSERV_BESTEFFORT`: one tin.
const CAKE_DIFFSERV_BESTEFFORT: u32 = 3;

/// CAKE's number for the tins named `tins` (the `CAKE_DIFFSERV_*` enum:
/// diffserv3 0, diffserv4 1, diffserv8 2, besteffort 3).
fn diffserv_mode(tins: &str) -> Option<u32> {
    match tins {
        "diffserv3" => Some(0),
        "diffserv4" => Some(1),
        "diffserv8" => Some(2),
        "besteffort" => Some(CAKE_DIFFSERV_BESTEFFORT),
        _ => None,
    }
}

/// The qdisc's kind.
pub const KIND: &str = "cake_mq";

/// True when the running kernel is one that has cake_mq (Linux ≥ 7.0).
pub fn kernel_has() -> bool {
    use aya::util::KernelVersion;
    KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(7, 0, 0))
}

/// cake_mq's `TCA_OPTIONS` payload at `rate` with `tins`; `None` for
/// tins CAKE does not name.
pub fn options(rate: Rate, tins: &str) -> Option<Vec<u8>> {
    Some(encode_attrs(&[
        Attr::bytes(TCA_CAKE_BASE_RATE64, &rate.bytes_per_s().to_ne_bytes()),
        Attr::u32(TCA_CAKE_DIFFSERV_MODE, diffserv_mode(tins)?),
    ]))
}

/// Puts cake_mq at `rate` with `tins` at the root of `tb`'s WAN device.
pub fn install(tb: &Testbed, rate: Rate, tins: &str) -> Result<(), LabError> {
    let options = options(rate, tins).ok_or_else(|| LabError::Invalid {
        detail: format!("{KIND}: unknown tins `{tins}`"),
    })?;
    let ns = tb.netns_file(Host::Router)?;
    let dev = tb.wan_dev().to_owned();
    let failed = |detail: String| LabError::Request {
        what: format!("installing {KIND} at the root of {dev}"),
        detail,
    };
    let result = thread::scope(|s| {
        s.spawn(|| {
            enter_netns(&ns).map_err(|e| format!("entering the router's namespace: {e}"))?;
            let link = crate::link::link_by_name(&dev).map_err(|e| format!("{e:#}"))?;
            install_plain_root(link.ifindex, KIND, Some(&options))
                .map_err(|e| format!("{:#}", anyhow::Error::from(e)))
        })
        .join()
    });
    match result {
        Ok(r) => r.map_err(failed),
        Err(_) => Err(failed("the installing thread panicked".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_goes_in_bytes_per_second_with_besteffort() {
        let r: Rate = "50mbit".parse().expect("rate");
        let o = options(r, "besteffort").expect("known tins");
        // Two attributes: 4-byte header + 8 bytes, then 4 + 4.
        assert_eq!(o.len(), 12 + 8);
        assert_eq!(u16::from_ne_bytes([o[2], o[3]]), TCA_CAKE_BASE_RATE64);
        let rate = u64::from_ne_bytes(o[4..12].try_into().expect("8 bytes"));
        assert_eq!(rate, 6_250_000);
        assert_eq!(u16::from_ne_bytes([o[14], o[15]]), TCA_CAKE_DIFFSERV_MODE);
        assert_eq!(
            u32::from_ne_bytes(o[16..20].try_into().expect("4 bytes")),
            CAKE_DIFFSERV_BESTEFFORT
        );
        let d4 = options(r, "diffserv4").expect("known tins");
        assert_eq!(
            u32::from_ne_bytes(d4[16..20].try_into().expect("4 bytes")),
            1
        );
        assert!(options(r, "diffserv5").is_none());
    }
}
