//! Test topologies built from named network namespaces (`ip netns add`), and
//! helpers to run the real `shaper` binary inside them.
//!
//! `shaper` runs under `nsenter --net=...`, which switches only the network
//! namespace: the process shares the test's mount namespace, so the bpffs
//! pins it makes are visible to a later `shaper status` or `shaper cleanup`,
//! as on a real router. (`ip netns exec` would give each run a private /sys.)
//!
//! Every namespace is deleted on drop, taking its veths with it.

use std::{
    path::PathBuf,
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
};

use crate::netns::sh;
pub use crate::skip::require_full_kernel;

/// A named network namespace, deleted on drop.
pub struct NamedNs {
    /// Its name under /run/netns.
    pub name: String,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl NamedNs {
    /// Creates `shp-<tag>-<pid>-<n>` with `lo` up.
    pub fn new(tag: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("shp-{tag}-{}-{n}", std::process::id());
        sh(&format!("ip netns add {name}"));
        let ns = Self { name };
        ns.sh("ip link set lo up");
        ns
    }

    /// Runs a shell command inside; panics with its output on failure.
    pub fn sh(&self, cmd: &str) -> String {
        sh(&format!(
            "ip netns exec {} sh -c '{}'",
            self.name,
            cmd.replace('\'', "'\\''")
        ))
    }

    /// A command that runs `program` in this namespace (network only).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.name))
            .arg("--")
            .arg(program);
        c
    }

    /// A `shaper` command in this namespace.
    pub fn shaper(&self) -> Command {
        self.command(&shaper_bin().display().to_string())
    }

    /// `shaper` run here as nobody with no capabilities (`setpriv`), for
    /// the privilege errors.
    pub fn unprivileged_shaper(&self) -> Command {
        let mut c = self.command("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(shaper_bin());
        c
    }

    /// The full traffic-control state of `dev`: qdiscs, classes and filters
    /// (details, no statistics), for before/after comparisons.
    pub fn tc_state(&self, dev: &str) -> String {
        // One shell for all four listings: spawning is slow under emulation.
        self.sh(&format!(
            "for what in qdisc class filter; do echo \"== tc -d $what show dev {dev}\"; \
             tc -d $what show dev {dev} || exit 1; done; echo \"== egress filters\"; \
             tc -d filter show dev {dev} egress 2>/dev/null; true"
        ))
    }
}

impl Drop for NamedNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Two namespaces joined by a veth pair: `left0` (10.77.0.1/24) in `left`, `right0`
/// (10.77.0.2/24) in `right`; IPv6 off so no unsolicited traffic appears.
pub struct Pair {
    /// The sending side.
    pub left: NamedNs,
    /// The receiving side.
    pub right: NamedNs,
}

impl Pair {
    /// Builds the pair; `txq` TX queues on `left0` (1 = single queue).
    pub fn new(tag: &str, txq: u32) -> Self {
        let left = NamedNs::new(&format!("{tag}l"));
        let right = NamedNs::new(&format!("{tag}r"));
        sh(&format!(
            "ip link add name left0 netns {} numtxqueues {txq} numrxqueues {txq} type veth peer name right0 netns {}",
            left.name, right.name
        ));
        for (ns, dev, addr) in [
            (&left, "left0", "10.77.0.1/24"),
            (&right, "right0", "10.77.0.2/24"),
        ] {
            ns.sh(&format!(
                "sysctl -qw net.ipv6.conf.{dev}.disable_ipv6=1 && ip addr add {addr} dev {dev} && ip link set {dev} up"
            ));
        }
        Self { left, right }
    }
}

/// Path of the `shaper` binary under test: `SHAPER_BIN`, or the workspace's
/// debug build.
pub fn shaper_bin() -> PathBuf {
    std::env::var_os("SHAPER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../target/debug/shaper"
            ))
        })
}

/// Output as text: stdout then stderr.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// True when the running kernel has sch_fq (probed without changing anything).
pub fn kernel_has_fq() -> bool {
    shaper::tc::probe_qdisc_kind("fq").unwrap_or(false)
}

/// True when running as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
