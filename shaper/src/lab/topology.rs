//! The testbed: two LAN hosts behind a router, and a server beyond its WAN
//! side, each in a named network namespace.
//!
//! ```text
//!  client  cl0 10.71.1.2 ── lan1 10.71.1.1 ┐
//!                                          router  wan0 10.71.3.1 ── sv0 10.71.3.2  server
//!  client2 cl0 10.71.2.2 ── lan2 10.71.2.1 ┘                        10.71.3.3  (second address)
//! ```
//!
//! The state under test sits on the router's `wan0` egress: uploads from the
//! clients queue there. Path delay comes in two forms, each a netem qdisc
//! kept off `wan0` so that device stays free for the state under test:
//! - per client, on the router's LAN-side egress toward it (`lan1`, `lan2`),
//!   for tests that give the clients different RTTs;
//! - on the WAN side, on the server's `sv0` egress (`wan_delay`), as the lab
//!   does: the path beyond the router.
//!
//! A delay of `D` adds `D` to the round-trip time.
//!
//! With `wan_link`, the server's side also plays the ISP's access link: a
//! bottleneck at the link rate with a deep buffer in each direction, the
//! bufferbloat a shaper on the router exists to cure (the router's states
//! shape a little below it, as sqm-scripts advises). Download queues in a
//! TBF on `sv0`'s egress (under the WAN delay's netem); upload is redirected
//! from `sv0`'s ingress to an IFB (`svifb0`) in the server's namespace and
//! queues in a TBF there. Both TBFs hold `buffer` worth of bytes at the link
//! rate, and TBF segments GSO packets bigger than its burst, so the buffer is
//! the same in time whatever the offloads.
//!
//! With `nat`, the router
//! masquerades the LAN behind its `wan0` address (nftables), as a home router
//! does, so the server sees every flow from 10.71.3.1 and the router tracks
//! each connection.
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
//! Cost: every exec is slow in the VM (binaries come over 9p, under
//! emulation: 0.3 to 0.7 s each when the host is busy), so setup runs one
//! `ip -batch` for the namespaces and veths, then one `sysctl` and one `ip
//! -n NS -batch` per namespace, and one `tc` per delay.
//!
//! Non-goals: IPv6, more hosts, real NICs.

use std::{
    fs::File,
    net::Ipv4Addr,
    os::fd::AsRawFd,
    path::Path,
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

/// The server's second address on the same link: a second destination
/// host for isolation by destination (CAKE's dsthost and triple-isolate
/// count hosts by address).
pub const SERVER_SECOND: Ipv4Addr = Ipv4Addr::new(10, 71, 3, 3);

/// The router's WAN-side device, where the state under test goes.
pub const WAN_DEV: &str = "wan0";

/// The router's devices toward the two clients, the LAN side of its NAT.
pub const LAN_DEVS: [&str; 2] = ["lan1", "lan2"];

/// The veths: (far host, its device, the router's device). Link `i` is the
/// /24 `10.71.{i+1}.0`, the router `.1`, the far host `.2`.
const LINKS: [(Host, &str, &str); 3] = [
    (Host::Client, "cl0", LAN_DEVS[0]),
    (Host::Client2, "cl0", LAN_DEVS[1]),
    (Host::Server, "sv0", WAN_DEV),
];

/// A named network namespace, deleted on drop (unless a [`Testbed`] deleted
/// it already, with its siblings, in one batch).
#[derive(Debug)]
pub struct Netns {
    name: String,
    deleted: bool,
}

impl Netns {
    /// Creates the namespace `name` with `lo` up.
    pub fn create(name: String) -> Result<Self, LabError> {
        exec::run(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Self::adopt(name);
        ns.ip(&["link", "set", "dev", "lo", "up"])?;
        Ok(ns)
    }

    /// Takes ownership of the existing namespace `name`.
    fn adopt(name: String) -> Self {
        Self {
            name,
            deleted: false,
        }
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

    /// Runs `ip -n NAME args`: one exec instead of nsenter's two.
    pub fn ip(&self, args: &[&str]) -> Result<String, LabError> {
        exec::run(Command::new("ip").args(["-n", &self.name]).args(args))
    }

    /// Runs `tc -n NAME args`.
    pub fn tc(&self, args: &[&str]) -> Result<String, LabError> {
        exec::run(Command::new("tc").args(["-n", &self.name]).args(args))
    }

    /// Puts every packet arriving on `dev` through the tc action `action`
    /// (e.g. `mirred egress redirect dev X`, `police rate R ...`): an
    /// ingress qdisc and a filter matching all. u32 matching every packet,
    /// because cls_matchall is not in every kernel (this project's 6.18
    /// host has u32 and bpf only).
    pub fn all_ingress_to(&self, dev: &str, action: &[&str]) -> Result<(), LabError> {
        self.tc(&["qdisc", "replace", "dev", dev, "handle", "ffff:", "ingress"])?;
        let mut args = vec![
            "filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all", "u32", "match",
            "u32", "0", "0", "action",
        ];
        args.extend_from_slice(action);
        self.tc(&args).map(drop)
    }

    /// Runs `ip -n NAME -batch -` on `lines` (one `ip` command each, without
    /// the leading `ip`); stops at the first failure.
    pub fn ip_batch(&self, lines: &[String]) -> Result<(), LabError> {
        if lines.is_empty() {
            return Ok(());
        }
        let script = lines.join("\n") + "\n";
        exec::run_with_input(
            Command::new("ip").args(["-n", &self.name, "-batch", "-"]),
            Some(&script),
        )
        .map(drop)
    }

    /// Sets sysctls inside, e.g. `[("net.ipv4.ip_forward", "1")]`, in one
    /// `sysctl -w` call.
    pub fn sysctls(&self, settings: &[(&str, &str)]) -> Result<(), LabError> {
        let args: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut cmd = self.command("sysctl");
        cmd.arg("-qw").args(&args);
        exec::run(&mut cmd).map(drop)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
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
    /// Extra round-trip delay of the WAN path, for every client (netem on
    /// the server's `sv0` egress); zero for none.
    pub wan_delay: Duration,
    /// The router masquerades the LAN behind `wan0` (nftables NAT).
    pub nat: bool,
    /// The ISP's access link beyond `wan0`, if any.
    pub wan_link: Option<WanLink>,
    /// False turns segmentation offload off on the clients' `cl0`
    /// (`gso_max_segs 1`), so the router sees MTU-sized packets; true leaves
    /// the veth's default (64 KB GSO super-packets).
    pub gso: bool,
    /// Sets `net.ipv4.tcp_ecn=1` on the clients and the server, so TCP
    /// negotiates ECN (the kernel default 2 only accepts it).
    pub ecn: bool,
    /// TX (and RX) queues of the WAN veth, both ends: more than one makes
    /// `wan0` a multi-queue device, as a router's NIC is.
    pub wan_queues: u32,
}

impl Default for TestbedOptions {
    /// 20 ms extra RTT on both clients, none on the WAN side, no NAT, GSO
    /// on, ECN at the kernel default.
    fn default() -> Self {
        Self {
            client_delay: Duration::from_millis(20),
            client2_delay: Duration::from_millis(20),
            wan_delay: Duration::ZERO,
            nat: false,
            wan_link: None,
            gso: true,
            ecn: false,
            wan_queues: 1,
        }
    }
}

/// The emulated access link: a bottleneck with a deep FIFO each way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WanLink {
    /// The link's rate, both directions.
    pub rate_bits_per_s: u64,
    /// How long its full buffer takes to drain at `rate_bits_per_s`.
    pub buffer: Duration,
    /// How the link counts each packet, when not as Linux does: a size
    /// table on both TBFs (`tc ... stab`).
    pub stab: Option<LinkStab>,
}

/// A size table (tc-stab(8)): each packet counts `overhead_bytes` more
/// than its frame, at least `mpu_bytes`, in ATM cells when `atm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkStab {
    /// Added to the frame's length.
    pub overhead_bytes: i32,
    /// The least a packet counts.
    pub mpu_bytes: u32,
    /// Whole 53-byte cells of 48.
    pub atm: bool,
}

impl WanLink {
    /// `tc` arguments of a TBF for this link: the rate, a burst of 2 ms at
    /// the rate (at least two frames: the emulated guest's timers are
    /// coarse) and a byte limit of `buffer` at the rate.
    fn tbf_args(&self) -> Vec<String> {
        let burst_bytes = (self.rate_bits_per_s / 8 / 500).max(3028);
        vec![
            "tbf".into(),
            "rate".into(),
            format!("{}bit", self.rate_bits_per_s),
            "burst".into(),
            burst_bytes.to_string(),
            "latency".into(),
            format!("{}us", self.buffer.as_micros()),
        ]
    }

    /// `tc` arguments of the size table, for the root qdisc of each
    /// direction (the kernel takes one only at the root; the root's packet
    /// lengths reach its children); none without one.
    fn stab_args(&self) -> Vec<String> {
        let Some(s) = self.stab else {
            return Vec::new();
        };
        vec![
            "stab".into(),
            "overhead".into(),
            s.overhead_bytes.to_string(),
            "mpu".into(),
            s.mpu_bytes.to_string(),
            "linklayer".into(),
            if s.atm { "atm" } else { "ethernet" }.into(),
        ]
    }
}

/// The IFB in the server's namespace that holds the link's upload queue.
const UPLOAD_IFB: &str = "svifb0";

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
        let names: Vec<String> = Host::ALL
            .iter()
            .map(|h| format!("{prefix}-{}", h.name()))
            .collect();
        // One `ip -batch` for the namespaces and the veths between them.
        let mut script: Vec<String> = names.iter().map(|n| format!("netns add {n}")).collect();
        for (host, dev, rdev) in LINKS {
            let queues = match (host, options.wan_queues) {
                (Host::Server, n) if n > 1 => format!(" numtxqueues {n} numrxqueues {n}"),
                _ => String::new(),
            };
            script.push(format!(
                "link add name {dev} netns {}{queues} type veth peer name {rdev} netns {}{queues}",
                names[host.index()],
                names[Host::Router.index()]
            ));
        }
        let created = exec::run_with_input(
            Command::new("ip").args(["-batch", "-"]),
            Some(&(script.join("\n") + "\n")),
        );
        // Own every namespace that exists, whether or not the batch got
        // through, so that drop removes them.
        let ns: Vec<Netns> = names
            .into_iter()
            .filter(|n| Path::new("/run/netns").join(n).exists())
            .map(Netns::adopt)
            .collect();
        let tb = Self { ns, options };
        created?;
        if tb.ns.len() != Host::ALL.len() {
            return Err(LabError::Invalid {
                detail: format!("`ip netns add` did not create every {prefix}-* namespace"),
            });
        }
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

    /// Addresses, routes, forwarding, delays, offloads and ECN: one `ip
    /// -batch` and one `sysctl` per namespace, and one `tc` per delay.
    fn wire(&self) -> Result<(), LabError> {
        let mut router = vec!["link set dev lo up".to_owned()];
        let router_v6: Vec<String> = LINKS
            .iter()
            .map(|(_, _, rdev)| format!("net.ipv6.conf.{rdev}.disable_ipv6"))
            .collect();
        let mut router_sysctls = vec![("net.ipv4.ip_forward", "1")];
        router_sysctls.extend(router_v6.iter().map(|k| (k.as_str(), "1")));
        for (i, (host, dev, rdev)) in LINKS.into_iter().enumerate() {
            let net = i + 1;
            let gso = if host == Host::Server || self.options.gso {
                ""
            } else {
                // Segmentation offload off: the stack sends MTU-sized skbs.
                " gso_max_segs 1"
            };
            // IPv6 off before the link comes up: no DAD or solicitations.
            let v6 = format!("net.ipv6.conf.{dev}.disable_ipv6");
            let ecn = if self.options.ecn { "1" } else { "2" };
            self.ns(host)
                .sysctls(&[(v6.as_str(), "1"), ("net.ipv4.tcp_ecn", ecn)])?;
            let mut batch = vec![
                "link set dev lo up".to_owned(),
                format!("addr add 10.71.{net}.2/24 dev {dev}"),
            ];
            if host == Host::Server {
                batch.push(format!("addr add {SERVER_SECOND}/24 dev {dev}"));
            }
            batch.extend([
                format!("link set dev {dev} up{gso}"),
                format!("route add default via 10.71.{net}.1"),
            ]);
            self.ns(host).ip_batch(&batch)?;
            router.push(format!("addr add 10.71.{net}.1/24 dev {rdev}"));
            router.push(format!("link set dev {rdev} up"));
        }
        let r = self.ns(Host::Router);
        r.sysctls(&router_sysctls)?;
        r.ip_batch(&router)?;
        if self.options.nat {
            // Masquerade what leaves by wan0; conntrack follows every flow.
            exec::run_with_input(
                r.command("nft").args(["-f", "-"]),
                Some(&format!(
                    "table ip shaper_lab {{\n chain post {{\n  type nat hook postrouting \
                     priority srcnat; policy accept;\n  oifname \"{WAN_DEV}\" masquerade\n }}\n}}\n"
                )),
            )?;
        }
        for (host, dev, delay) in [
            (Host::Router, "lan1", self.options.client_delay),
            (Host::Router, "lan2", self.options.client2_delay),
        ] {
            if !delay.is_zero() {
                // A big limit: netem's default of 1000 packets would drop
                // ACKs of a fast flow and become the bottleneck itself.
                let us = format!("{}us", delay.as_micros());
                self.ns(host).tc(&[
                    "qdisc", "replace", "dev", dev, "root", "netem", "delay", &us, "limit",
                    "100000",
                ])?;
            }
        }
        self.wire_wan()
    }

    /// The WAN side, in the server's namespace: the delay's netem on `sv0`
    /// and, with `wan_link`, the link's two TBFs and the upload IFB.
    fn wire_wan(&self) -> Result<(), LabError> {
        let sv = self.ns(Host::Server);
        let delay = self.options.wan_delay;
        let netem_us = format!("{}us", delay.as_micros());
        // A big limit: netem's default of 1000 packets would drop ACKs of a
        // fast flow and become the bottleneck itself.
        let netem = ["netem", "delay", &netem_us, "limit", "100000"];
        let Some(link) = self.options.wan_link else {
            if !delay.is_zero() {
                let mut a = vec!["qdisc", "replace", "dev", "sv0", "root"];
                a.extend(netem);
                sv.tc(&a)?;
            }
            return Ok(());
        };
        let tbf = link.tbf_args();
        let tbf: Vec<&str> = tbf.iter().map(String::as_str).collect();
        let stab = link.stab_args();
        let stab: Vec<&str> = stab.iter().map(String::as_str).collect();
        // Download: the delay first, then the link's queue (netem's child).
        if delay.is_zero() {
            let mut a = vec!["qdisc", "replace", "dev", "sv0", "root"];
            a.extend(&stab);
            a.extend(&tbf);
            sv.tc(&a)?;
        } else {
            let mut a = vec!["qdisc", "replace", "dev", "sv0", "root", "handle", "1:"];
            a.extend(&stab);
            a.extend(netem);
            sv.tc(&a)?;
            let mut a = vec!["qdisc", "replace", "dev", "sv0", "parent", "1:1"];
            a.extend(&tbf);
            sv.tc(&a)?;
        }
        // Upload: everything arriving on sv0 goes through the IFB's queue.
        sv.ip_batch(&[
            format!("link add name {UPLOAD_IFB} type ifb"),
            format!("link set dev {UPLOAD_IFB} up"),
        ])?;
        let mut a = vec!["qdisc", "replace", "dev", UPLOAD_IFB, "root"];
        a.extend(&stab);
        a.extend(&tbf);
        sv.tc(&a)?;
        sv.all_ingress_to("sv0", &["mirred", "egress", "redirect", "dev", UPLOAD_IFB])
    }

    /// Sets `net.ipv4.tcp_ecn` on the clients and the server: 1 (request
    /// ECN) when `on`, else the kernel default 2 (accept only).
    pub fn set_ecn(&self, on: bool) -> Result<(), LabError> {
        for host in [Host::Client, Host::Client2, Host::Server] {
            self.ns(host)
                .sysctls(&[("net.ipv4.tcp_ecn", if on { "1" } else { "2" })])?;
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

    /// The namespace file of `host`, for a thread to enter ([`enter_netns`]).
    pub(crate) fn netns_file(&self, host: Host) -> Result<File, LabError> {
        let path = format!("/run/netns/{}", self.ns(host).name());
        File::open(&path).map_err(|source| LabError::Io {
            what: "opening",
            path,
            source,
        })
    }

    /// A command running `program` on `host`.
    pub fn command(&self, host: Host, program: &str) -> Command {
        self.ns(host).command(program)
    }

    /// Runs `program args` on `host`; its stdout.
    pub fn run(&self, host: Host, program: &str, args: &[&str]) -> Result<String, LabError> {
        self.ns(host).run(program, args)
    }

    /// The server's second address on the same link: a second destination
    /// host for isolation by destination (CAKE's dsthost and triple-isolate
    /// count hosts by address).
    pub const SERVER_SECOND: Ipv4Addr = Ipv4Addr::new(10, 71, 3, 3);

    /// The router's WAN-side device, where the state under test goes.
    pub fn wan_dev(&self) -> &'static str {
        WAN_DEV
    }
}

impl Drop for Testbed {
    /// Deletes every namespace in one `ip -batch` (each on its own if that
    /// fails), taking the veths and qdiscs with them.
    fn drop(&mut self) {
        let script: String = self
            .ns
            .iter()
            .map(|n| format!("netns del {}\n", n.name()))
            .collect();
        match exec::run_with_input(Command::new("ip").args(["-batch", "-"]), Some(&script)) {
            Ok(_) => self.ns.iter_mut().for_each(|n| n.deleted = true),
            Err(e) => warn!("deleting the testbed's namespaces in one batch: {e}"),
        }
    }
}

/// Moves the calling thread into the network namespace `ns`.
pub(crate) fn enter_netns(ns: &File) -> std::io::Result<()> {
    // SAFETY: setns takes an open namespace fd and a flag; it changes only
    // the calling thread's namespace and touches no memory of ours.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
