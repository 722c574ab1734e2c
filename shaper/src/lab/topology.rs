//! The testbed: two LAN hosts behind a router, and a server beyond its WAN
//! side, each in a named network namespace.
//!
//! ```text
//!  client  cl0 10.71.1.2 ── lan1 10.71.1.1 ┐
//!                                          router  wan0 10.71.3.1 ── sv0 10.71.3.2  server
//!  client2 cl0 10.71.2.2 ── lan2 10.71.2.1 ┘
//! ```
//!
//! The state under test sits on the router's `wan0` egress: uploads from the
//! clients queue there. Each client's extra path delay is a netem qdisc on
//! the router's LAN-side egress toward it (`lan1`, `lan2`), so it delays the
//! return path (ACKs, echo replies) and leaves `wan0` free for the state
//! under test. A delay of `D` adds `D` to the round-trip time.
//!
//! Invariants:
//! - Namespace names are `shl-<pid>-<n>-<role>`, unique per process and
//!   testbed; all of them are deleted on drop (also while unwinding from a
//!   panic), which deletes their veths with them.
//! - IPv6 is off on every lab device, so no router solicitations or DAD
//!   packets mix into the measurements.
//! - Device names are never single letters (`ip link add a` reads `a` as
//!   `address`), and always follow `name`.
//!
//! Non-goals: IPv6, NAT, more hosts, real NICs.

use std::{
    net::Ipv4Addr,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use tracing::{info, warn};

use super::{LabError, exec};

/// A host of the testbed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// The first LAN host.
    Client,
    /// The second LAN host.
    Client2,
    /// The router; its `wan0` egress carries the state under test.
    Router,
    /// The server on the WAN side.
    Server,
}

impl Host {
    /// All hosts, in creation order.
    pub const ALL: [Host; 4] = [Host::Client, Host::Client2, Host::Router, Host::Server];

    /// A short name, used in namespace names and messages.
    pub fn name(self) -> &'static str {
        match self {
            Host::Client => "client",
            Host::Client2 => "client2",
            Host::Router => "router",
            Host::Server => "server",
        }
    }

    /// The host's own address: the one traffic to or from it uses.
    pub fn addr(self) -> Ipv4Addr {
        match self {
            Host::Client => Ipv4Addr::new(10, 71, 1, 2),
            Host::Client2 => Ipv4Addr::new(10, 71, 2, 2),
            Host::Router => Ipv4Addr::new(10, 71, 3, 1),
            Host::Server => Ipv4Addr::new(10, 71, 3, 2),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The router's WAN-side device, where the state under test goes.
pub const WAN_DEV: &str = "wan0";

/// A named network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates the namespace `name` with `lo` up.
    pub fn create(name: String) -> Result<Self, LabError> {
        exec::run(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Self { name };
        ns.run("ip", &["link", "set", "dev", "lo", "up"])?;
        Ok(ns)
    }

    /// Its name under /run/netns.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs `program` inside (network namespace only).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.name))
            .arg("--")
            .arg(program);
        c
    }

    /// Runs `program args` inside; its stdout, or the failure with output.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String, LabError> {
        exec::run(self.command(program).args(args))
    }

    /// Sets a sysctl inside, e.g. `("net.ipv4.ip_forward", "1")`.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<(), LabError> {
        self.run("sysctl", &["-qw", &format!("{key}={value}")])
            .map(drop)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = exec::run(Command::new("ip").args(["netns", "del", &self.name])) {
            warn!("deleting namespace {}: {e}", self.name);
        }
    }
}

/// How to build a [`Testbed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestbedOptions {
    /// Extra round-trip delay of the client's path (netem on the router's
    /// `lan1` egress); zero for none.
    pub client_delay: Duration,
    /// Extra round-trip delay of client2's path (netem on `lan2`).
    pub client2_delay: Duration,
    /// False turns segmentation offload off on the clients' `cl0`
    /// (`gso_max_segs 1`), so the router sees MTU-sized packets; true leaves
    /// the veth's default (64 KB GSO super-packets).
    pub gso: bool,
    /// Sets `net.ipv4.tcp_ecn=1` on the clients and the server, so TCP
    /// negotiates ECN (the kernel default 2 only accepts it).
    pub ecn: bool,
}

impl Default for TestbedOptions {
    /// 20 ms extra RTT on both clients, GSO on, ECN at the kernel default.
    fn default() -> Self {
        Self {
            client_delay: Duration::from_millis(20),
            client2_delay: Duration::from_millis(20),
            gso: true,
            ecn: false,
        }
    }
}

static TESTBEDS: AtomicU32 = AtomicU32::new(0);

/// The four namespaces, wired and addressed; removed on drop.
#[derive(Debug)]
pub struct Testbed {
    /// Indexed by [`Host::index`].
    ns: Vec<Netns>,
    options: TestbedOptions,
}

impl Testbed {
    /// Builds the testbed. On failure, whatever was created is removed.
    pub fn new(options: TestbedOptions) -> Result<Self, LabError> {
        let n = TESTBEDS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("shl-{}-{n}", std::process::id());
        let mut ns = Vec::with_capacity(Host::ALL.len());
        for host in Host::ALL {
            ns.push(Netns::create(format!("{prefix}-{}", host.name()))?);
        }
        let tb = Self { ns, options };
        tb.wire()?;
        info!(
            %prefix,
            client_delay = ?tb.options.client_delay,
            client2_delay = ?tb.options.client2_delay,
            gso = tb.options.gso,
            ecn = tb.options.ecn,
            "testbed up"
        );
        Ok(tb)
    }

    /// Veths, addresses, routes, forwarding, delays, offloads and ECN.
    fn wire(&self) -> Result<(), LabError> {
        // (near host, near dev, near addr, router dev, router addr, /24)
        let links = [
            (Host::Client, "cl0", "lan1", 1u8),
            (Host::Client2, "cl0", "lan2", 2),
            (Host::Server, "sv0", WAN_DEV, 3),
        ];
        let router = self.ns(Host::Router);
        for (host, dev, rdev, net) in links {
            let peer = self.ns(host);
            exec::run(Command::new("ip").args([
                "link",
                "add",
                "name",
                dev,
                "netns",
                peer.name(),
                "type",
                "veth",
                "peer",
                "name",
                rdev,
                "netns",
                router.name(),
            ]))?;
            let host_addr = if host == Host::Server {
                "10.71.3.2/24".to_owned()
            } else {
                format!("10.71.{net}.2/24")
            };
            let router_addr = format!("10.71.{net}.1/24");
            for (ns, d, a) in [
                (peer, dev, host_addr.as_str()),
                (router, rdev, router_addr.as_str()),
            ] {
                ns.sysctl(&format!("net.ipv6.conf.{d}.disable_ipv6"), "1")?;
                ns.run("ip", &["addr", "add", a, "dev", d])?;
                ns.run("ip", &["link", "set", "dev", d, "up"])?;
            }
            let gw = format!("10.71.{net}.1");
            peer.run("ip", &["route", "add", "default", "via", &gw])?;
        }
        router.sysctl("net.ipv4.ip_forward", "1")?;
        for (dev, delay) in [
            ("lan1", self.options.client_delay),
            ("lan2", self.options.client2_delay),
        ] {
            if !delay.is_zero() {
                // A big limit: netem's default of 1000 packets would drop
                // ACKs of a fast flow and become the bottleneck itself.
                let us = format!("{}us", delay.as_micros());
                router.run(
                    "tc",
                    &[
                        "qdisc", "replace", "dev", dev, "root", "netem", "delay", &us, "limit",
                        "100000",
                    ],
                )?;
            }
        }
        if !self.options.gso {
            for host in [Host::Client, Host::Client2] {
                self.ns(host)
                    .run("ip", &["link", "set", "dev", "cl0", "gso_max_segs", "1"])?;
            }
        }
        self.set_ecn(self.options.ecn)?;
        Ok(())
    }

    /// Sets `net.ipv4.tcp_ecn` on the clients and the server: 1 (request
    /// ECN) when `on`, else the kernel default 2 (accept only).
    pub fn set_ecn(&self, on: bool) -> Result<(), LabError> {
        for host in [Host::Client, Host::Client2, Host::Server] {
            self.ns(host)
                .sysctl("net.ipv4.tcp_ecn", if on { "1" } else { "2" })?;
        }
        Ok(())
    }

    /// The options it was built with.
    pub fn options(&self) -> &TestbedOptions {
        &self.options
    }

    /// The namespace of `host`.
    pub fn ns(&self, host: Host) -> &Netns {
        &self.ns[host.index()]
    }

    /// A command running `program` on `host`.
    pub fn command(&self, host: Host, program: &str) -> Command {
        self.ns(host).command(program)
    }

    /// Runs `program args` on `host`; its stdout.
    pub fn run(&self, host: Host, program: &str, args: &[&str]) -> Result<String, LabError> {
        self.ns(host).run(program, args)
    }

    /// The router's WAN-side device, where the state under test goes.
    pub fn wan_dev(&self) -> &'static str {
        WAN_DEV
    }
}
