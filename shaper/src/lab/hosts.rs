//! The host-isolation case, shared by the lab's `--hosts` phase, the VM
//! test and the benchmark: host A (the client) with [`A_FLOWS`] bulk TCP
//! flows beside host B (the second client) with one, both to the server,
//! and host B's share of what the two carried. Fair between hosts is a
//! half; fair between flows, `1 / (A_FLOWS + 1)`.
//!
//! Also what the shaper and CAKE are given for isolation: the same mode
//! keyword both ways, and through the router's NAT CAKE's `nat` and the
//! shaper's `--nat` with the testbed's LAN interfaces.
//!
//! Units: bit/s for rates; shares are fractions of the two hosts' total.
//! The report's table and JSON of the phase are `super::report`'s.

use shaper_common::hosts::Isolation;

use super::{
    FlowSpec, IperfReport, LabError, Testbed, Timing,
    topology::{Host, LAN_DEVS},
    traffic::{IperfClient, IperfServer},
};

/// Host A's bulk flows.
pub const A_FLOWS: u32 = 8;

/// Host A's flows, then host B's; downloads when `down`.
pub fn flows(down: bool) -> Vec<FlowSpec> {
    vec![
        flow(Host::Client, A_FLOWS, down),
        flow(Host::Client2, 1, down),
    ]
}

/// Host A's flows split between the server's two addresses, then host
/// B's one flow to the first: where isolation by destination (CAKE's
/// triple-isolate) weighs each flow by both its hosts.
pub fn flows_two_servers(down: bool) -> Vec<FlowSpec> {
    vec![
        flow(Host::Client, A_FLOWS / 2, down),
        flow(Host::Client, A_FLOWS - A_FLOWS / 2, down).to_second_server(),
        flow(Host::Client2, 1, down),
    ]
}

fn flow(host: Host, streams: u32, down: bool) -> FlowSpec {
    let f = FlowSpec::tcp(host, streams);
    if down { f.reversed() } else { f }
}

/// `shaper run`'s arguments for isolation `mode`, through the testbed's
/// NAT with `nat`.
pub fn shaper_args(mode: Isolation, nat: bool) -> Vec<String> {
    let mut a = vec!["--isolate".to_owned(), mode.keyword().to_owned()];
    if nat {
        a.push("--nat".to_owned());
        for lan in LAN_DEVS {
            a.extend(["--lan".to_owned(), lan.to_owned()]);
        }
    }
    a
}

/// CAKE's options for isolation `mode`, through NAT with `nat`.
pub fn cake_options(mode: Isolation, nat: bool) -> Vec<String> {
    let mut o = vec![mode.keyword().to_owned()];
    if nat {
        o.push("nat".to_owned());
    }
    o
}

/// What the two hosts carried in one direction.
#[derive(Clone, Debug)]
pub struct HostShare {
    /// Host A's flows.
    pub a: IperfReport,
    /// Host B's flow.
    pub b: IperfReport,
}

impl HostShare {
    /// Host B's share of what both carried (0 when nothing was carried).
    pub fn b_share(&self) -> f64 {
        share(self.a.receiver_bps, self.b.receiver_bps)
    }

    /// Both hosts' goodput, bit/s.
    pub fn total_bps(&self) -> f64 {
        self.a.receiver_bps + self.b.receiver_bps
    }
}

/// `b`'s share of `a + b` (0 when both are 0).
pub fn share(a: f64, b: f64) -> f64 {
    if a + b > 0.0 { b / (a + b) } else { 0.0 }
}

/// The lab's `--hosts` phase under the state already applied: both hosts'
/// flows in one direction for `timing`.
pub fn phase(tb: &Testbed, timing: &Timing, down: bool) -> Result<HostShare, LabError> {
    let (a, b) = (
        flow(Host::Client, A_FLOWS, down),
        flow(Host::Client2, 1, down),
    );
    let a_server = IperfServer::start(tb, Host::Server, 5211)?;
    let b_server = IperfServer::start(tb, Host::Server, 5212)?;
    let a_client = IperfClient::spawn(tb, &a, &a_server, timing)?;
    let b_client = IperfClient::spawn(tb, &b, &b_server, timing)?;
    Ok(HostShare {
        a: a_client.wait()?,
        b: b_client.wait()?,
    })
}

/// The `--hosts` phase of one state: the upload, and the download where
/// the state shapes it.
#[derive(Clone, Debug)]
pub struct HostsRun {
    /// The upload.
    pub up: HostShare,
    /// The download.
    pub down: HostShare,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_case_and_its_arguments() {
        let up = flows(false);
        assert_eq!(up.len(), 2);
        let two = flows_two_servers(true);
        assert_eq!(two.iter().map(|f| f.streams).sum::<u32>(), A_FLOWS + 1);
        assert!(two[1].second_server && !two[0].second_server && !two[2].second_server);
        assert!(two.iter().all(|f| f.reverse));
        assert_ne!(two[0].server_addr(), two[1].server_addr());
        assert_eq!(up[0].streams, A_FLOWS);
        assert_eq!(up[1].streams, 1);
        assert!(flows(true).iter().all(|f| f.reverse));
        assert_eq!(
            shaper_args(Isolation::DualSrcHost, true).join(" "),
            "--isolate dual-srchost --nat --lan lan1 --lan lan2"
        );
        assert_eq!(
            shaper_args(Isolation::TripleIsolate, false).join(" "),
            "--isolate triple-isolate"
        );
        assert_eq!(
            cake_options(Isolation::DualDstHost, true).join(" "),
            "dual-dsthost nat"
        );
        assert_eq!(share(3.0, 1.0), 0.25);
        assert_eq!(share(0.0, 0.0), 0.0);
    }
}
