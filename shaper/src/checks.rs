//! Checks made before `shaper run` changes anything. Each failure is a
//! [`CheckError`] whose message names the problem and the fix; the CLI maps
//! all of them to exit code 2 (usage), and by construction nothing has been
//! changed on the system when one is returned.
//!
//! Order: privileges, the interface, an existing shaper on it, then the
//! kernel's features (which need privileges to probe).

use std::{fs, io, path::PathBuf};

use aya::util::KernelVersion;

use crate::{config::RunConfig, link::Link, tc};

/// Capability numbers (include/uapi/linux/capability.h).
pub const CAP_NET_ADMIN: u32 = 12;
/// See [`CAP_NET_ADMIN`].
pub const CAP_SYS_ADMIN: u32 = 21;
/// See [`CAP_NET_ADMIN`].
pub const CAP_BPF: u32 = 39;

/// A check that failed. Every message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The process lacks capabilities.
    #[error(
        "shaper needs CAP_BPF and CAP_NET_ADMIN (missing: {missing}): run it as root, \
         e.g. `sudo shaper ...`"
    )]
    Privileges {
        /// Names of the missing capabilities.
        missing: String,
    },
    /// The interface is administratively down.
    #[error("interface '{iface}' is down: bring it up first with `ip link set {iface} up`")]
    InterfaceDown {
        /// The interface.
        iface: String,
    },
    /// A shaper record already exists for the interface.
    #[error(
        "interface '{iface}' is already shaped by shaper (pid {pid}, {state}): stop that process \
         with Ctrl-C or `kill {pid}`, or if it is gone, restore the interface with \
         `shaper cleanup --iface {iface}`"
    )]
    AlreadyShaped {
        /// The interface.
        iface: String,
        /// The process that shaped it.
        pid: u32,
        /// "running" or "no longer running".
        state: &'static str,
    },
    /// The shaper's qdisc is on the interface but no record says so.
    #[error(
        "interface '{iface}' already has the shaper's qdisc as root but no state record: \
         another mount or PID namespace may own it; remove it with \
         `tc qdisc del dev {iface} root` if it is stale"
    )]
    ForeignShaperRoot {
        /// The interface.
        iface: String,
    },
    /// `--lan` names the interface being shaped.
    #[error(
        "--lan {lan} is the interface being shaped: --lan names the LAN side, the interfaces the \
         masqueraded hosts are on (e.g. br-lan), and --iface the WAN"
    )]
    LanIsShaped {
        /// The interface.
        lan: String,
    },
    /// `--lan` names one interface twice.
    #[error("--lan {lan} is given twice: name each LAN interface once")]
    LanTwice {
        /// The interface.
        lan: String,
    },
    /// The kernel lacks sch_fq.
    #[error(
        "this kernel ({release}) has no sch_fq, the qdisc that holds packets until the departure \
         time the shaper stamps (CONFIG_NET_SCH_FQ, module sch_fq). Load it with \
         `modprobe sch_fq`; on OpenWrt install the package kmod-sched. Nothing was changed. \
         To try the shaper on a machine without it, run it in the project's VM, which boots a \
         stock Debian kernel: `cargo xtask vm -- target/release/shaper run --iface {iface} \
         --rate {rate}` (with {iface} created in the VM, e.g. a veth in a namespace). \
         Download shaping with `--ingress-mode police` needs no sch_fq"
    )]
    NoSchFq {
        /// `uname -r`.
        release: String,
        /// The interface asked for.
        iface: String,
        /// The rate asked for, as given.
        rate: String,
    },
    /// `--ingress-mode ifb` on a kernel without TCX that cannot redirect
    /// with tc's matchall filter and mirred action either. Below TCX the
    /// shaper feeds the IFB with mirred, because `bpf_redirect` there does
    /// not mark packets as redirected and the IFB drops them (see
    /// `tc::mirred`).
    #[error(
        "--ingress-mode ifb on this kernel ({release}, no TCX) redirects to the IFB with tc's \
         matchall filter and mirred action, and the kernel has neither: load them with \
         `modprobe cls_matchall act_mirred` (OpenWrt: kmod-sched), or use --ingress-mode \
         police, which needs no IFB. Nothing was changed"
    )]
    IfbNeedsMirred {
        /// `uname -r`.
        release: String,
    },
    /// `--ingress-mode ifb` on a kernel that cannot create IFB devices.
    #[error(
        "--ingress-mode ifb (the default download mode) shapes the download on an IFB device, \
         and this kernel ({release}) cannot create one (CONFIG_IFB, module ifb): load it with \
         `modprobe ifb` (OpenWrt: install kmod-ifb), or use --ingress-mode police, which needs \
         no IFB. Nothing was changed"
    )]
    NoIfb {
        /// `uname -r`.
        release: String,
    },
    /// The kernel lacks clsact (needed below 6.6, where TCX is missing).
    #[error(
        "this kernel ({release}) has neither TCX (Linux >= 6.6) nor the clsact qdisc \
         (CONFIG_NET_SCH_INGRESS, module sch_ingress) to attach the classifier to: load it with \
         `modprobe sch_ingress` (OpenWrt: kmod-sched-core). Nothing was changed"
    )]
    NoClsact {
        /// `uname -r`.
        release: String,
    },
    /// The kernel cannot load TC BPF programs.
    #[error(
        "this kernel ({release}) cannot load TC BPF programs (CONFIG_BPF_SYSCALL, \
         CONFIG_NET_CLS_BPF): {detail}. Nothing was changed"
    )]
    NoBpf {
        /// `uname -r`.
        release: String,
        /// What the probe said.
        detail: String,
    },
    /// The current qdisc tree cannot be saved faithfully.
    #[error(
        "cannot save interface '{iface}''s current qdiscs exactly, so it could not be restored \
         afterwards: {reason}. Nothing was changed; remove or simplify that configuration first"
    )]
    Unrestorable {
        /// The interface.
        iface: String,
        /// Why.
        reason: String,
    },
    /// Reading process or kernel facts failed.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// The effective capability set of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    effective: u64,
}

impl Capabilities {
    /// Reads `CapEff` from `/proc/self/status`.
    pub fn current() -> Result<Self, CheckError> {
        let path = PathBuf::from("/proc/self/status");
        let text = fs::read_to_string(&path).map_err(|source| CheckError::Read {
            path: path.clone(),
            source,
        })?;
        Self::parse_status(&text).ok_or_else(|| CheckError::Read {
            path,
            source: io::Error::new(io::ErrorKind::InvalidData, "no CapEff line"),
        })
    }

    /// Parses the `CapEff:` line of a `/proc/<pid>/status` text.
    pub fn parse_status(text: &str) -> Option<Self> {
        let hex = text.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
        u64::from_str_radix(hex, 16)
            .ok()
            .map(|effective| Self { effective })
    }

    /// True if capability number `cap` is in the effective set.
    pub fn has(self, cap: u32) -> bool {
        self.effective & (1u64 << cap) != 0
    }

    /// Checks for what attaching needs: CAP_NET_ADMIN, and CAP_BPF (or
    /// CAP_SYS_ADMIN, which implies it).
    pub fn check(self) -> Result<(), CheckError> {
        let mut missing = Vec::new();
        if !self.has(CAP_BPF) && !self.has(CAP_SYS_ADMIN) {
            missing.push("CAP_BPF");
        }
        if !self.has(CAP_NET_ADMIN) {
            missing.push("CAP_NET_ADMIN");
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(CheckError::Privileges {
                missing: missing.join(", "),
            })
        }
    }
}

/// Checks the interface can be shaped: it must be administratively up.
pub fn check_link(link: &Link) -> Result<(), CheckError> {
    if !link.admin_up {
        return Err(CheckError::InterfaceDown {
            iface: link.name.clone(),
        });
    }
    Ok(())
}

/// The running kernel's release string.
pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// True when the kernel has TCX (Linux 6.6, commit e420bed02507).
pub fn kernel_has_tcx() -> bool {
    KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0))
}

/// Checks the TC hooks the shaper attaches to exist: TCX, or else the
/// clsact qdisc (probed in a throwaway network namespace).
pub fn require_tc_hooks() -> Result<(), CheckError> {
    if kernel_has_tcx() {
        return Ok(());
    }
    let has_clsact = crate::tc::probe_clsact().map_err(|e| CheckError::NoBpf {
        release: kernel_release(),
        detail: format!("probing clsact failed: {e}"),
    })?;
    if has_clsact {
        Ok(())
    } else {
        Err(CheckError::NoClsact {
            release: kernel_release(),
        })
    }
}

/// Checks the kernel can do what `run` needs: sch_fq when `egress` is
/// shaped or an IFB is (`ifb`: it holds packets to their departure times),
/// for an IFB the ifb device itself and, without TCX, matchall and mirred (see
/// [`CheckError::IfbNeedsMirred`]), the TC hooks and BPF
/// always. Changes nothing visible (the qdisc probes run in a throwaway
/// network namespace).
pub fn check_kernel(egress: Option<&RunConfig>, ifb: Option<&RunConfig>) -> Result<(), CheckError> {
    let release = kernel_release();
    let probe_failed = |what: &str, e: tc::TcError| CheckError::NoBpf {
        release: release.clone(),
        detail: format!("probing {what} failed: {e}"),
    };
    if let Some(config) = egress.or(ifb)
        && !tc::probe_qdisc_kind("fq").map_err(|e| probe_failed("sch_fq", e))?
    {
        return Err(CheckError::NoSchFq {
            release,
            iface: config.iface.clone(),
            rate: config.rate.to_string(),
        });
    }
    if ifb.is_some() && !crate::ifb::probe().map_err(|e| probe_failed("the ifb device", e))? {
        return Err(CheckError::NoIfb { release });
    }
    if ifb.is_some()
        && !kernel_has_tcx()
        && !tc::probe_mirred().map_err(|e| probe_failed("matchall + mirred", e))?
    {
        return Err(CheckError::IfbNeedsMirred { release });
    }
    require_tc_hooks()?;
    match aya::sys::is_program_supported(aya::programs::ProgramType::SchedClassifier) {
        Ok(true) => Ok(()),
        Ok(false) => Err(CheckError::NoBpf {
            release,
            detail: "the kernel refused a trivial TC program".into(),
        }),
        Err(e) => Err(CheckError::NoBpf {
            release,
            detail: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_from_status() {
        let root = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        let caps = Capabilities::parse_status(root).expect("parses");
        assert!(caps.check().is_ok());

        let none = "CapEff:\t0000000000000000\n";
        let err = Capabilities::parse_status(none)
            .expect("parses")
            .check()
            .expect_err("no caps");
        let msg = err.to_string();
        assert!(msg.contains("CAP_BPF, CAP_NET_ADMIN"), "{msg}");
        assert!(msg.contains("run it as root"), "{msg}");

        // CAP_NET_ADMIN + CAP_SYS_ADMIN (pre-5.8 style) is enough.
        let sys_admin = format!("CapEff:\t{:016x}\n", (1u64 << 12) | (1u64 << 21));
        assert!(
            Capabilities::parse_status(&sys_admin)
                .expect("parses")
                .check()
                .is_ok()
        );

        // CAP_BPF alone is not.
        let bpf_only = format!("CapEff:\t{:016x}\n", 1u64 << 39);
        let err = Capabilities::parse_status(&bpf_only)
            .expect("parses")
            .check()
            .expect_err("no net admin");
        assert!(err.to_string().contains("missing: CAP_NET_ADMIN"), "{err}");

        assert_eq!(Capabilities::parse_status("Name: x\n"), None);
    }

    #[test]
    fn down_interface_is_refused_with_the_fix() {
        let link = Link {
            ifindex: 3,
            name: "veth9".into(),
            admin_up: false,
            oper_state: "down".into(),
            has_l2_header: true,
            tx_queues: 1,
            mtu_bytes: 1500,
            gso: None,
            is_ifb: false,
        };
        let err = check_link(&link).expect_err("down");
        assert!(err.to_string().contains("ip link set veth9 up"), "{err}");
        assert!(
            check_link(&Link {
                admin_up: true,
                ..link
            })
            .is_ok()
        );
    }
}
