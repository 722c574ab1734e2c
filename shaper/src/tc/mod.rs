//! Traffic control over raw rtnetlink: record an interface's egress qdisc
//! tree exactly, install the shaper's sch_fq root, and put the recorded
//! tree back on exit.
//!
//! Principles:
//! - **Raw attributes.** A snapshot keeps every top-level attribute of every
//!   dumped qdisc, class and filter as `(type, bytes)`, minus the ones the
//!   kernel only ever sends (see [`message`]'s `OUTPUT_ONLY`). Replaying them
//!   works for any kind (htb, tbf, fq_codel, cake, fq, u32, ...) without this
//!   module understanding their options; the few known dump/create
//!   asymmetries are repaired by name (`fixups`).
//! - **Refuse rather than approximate.** Where a dump cannot be replayed as
//!   it was (a size table with data, a rate estimator, an eBPF classifier,
//!   red/choke/gred, u32 hash-table numbering or chain order the kernel would
//!   not reproduce), [`snapshot`] fails with [`TcError::Unrestorable`] and the
//!   shaper refuses to start, rather than leave the interface different.
//! - **Same listing.** Objects are re-created in an order that makes `tc`
//!   list them as before (`order`, `class_hash`, `chains`, `filters`).
//! - **Verify.** [`restore`] dumps the tree again and compares it with the
//!   snapshot (qdisc identities, classes with their options, filter and
//!   chain identities).
//!
//! Scope: the root (egress) tree of one interface. The ingress/clsact qdisc
//! and its filters are never recorded and never touched by restore. A device
//! that has never been up lists no qdisc at all; that, like a default root
//! with handle 0 (`noqueue 0:`, `pfifo_fast 0:`, `mq 0:`), is restored by
//! deleting whatever root is there. Handles are `u32` `major << 16 | minor`
//! (include/uapi/linux/pkt_sched.h).
//!
//! Files: `message` (tcmsg and rtattr wire format), `netlink` (socket,
//! ACKs, dumps), `dump` (reading the tree), `snapshot` (the recorded tree and
//! its file format), `check` (restorability), `fixups`, `filters`, `chains`,
//! `order`, `class_hash`, `actions` (how to replay), `restore`, `install`,
//! `fq` (sch_fq options), `probe` (kernel features), `clsact`, `mirred`
//! (the ingress redirect to an IFB on kernels without TCX).
//!
//! Non-goals: shared filter blocks, offloaded (hardware) state, statistics,
//! estimators (refused).

mod actions;
mod chains;
mod check;
mod class_hash;
mod clsact;
mod dump;
mod filters;
mod fixups;
mod fq;
mod install;
pub mod message;
mod mirred;
pub(crate) mod netlink;
mod order;
pub(crate) mod probe;
mod restore;
mod snapshot;
mod step;

use std::io;

pub use clsact::{add_clsact, delete_clsact, has_clsact};
pub use fq::FqParams;
pub use install::{install_fq_root, install_plain_root, install_root};
pub use message::{Attr, Handle, TC_H_INGRESS, TC_H_ROOT, TCA_KIND, TCA_OPTIONS, encode_attrs};
pub use mirred::{FilterId, add_ingress_redirect, delete_ingress_redirect};
pub use probe::{first_missing_qdisc, probe_clsact, probe_mirred, probe_qdisc_kind};
pub use restore::restore;
pub use snapshot::{Snapshot, TcObject, U32Root};

use message::{RTM_GETQDISC, RTM_NEWQDISC, TcMessage, TcMsg};
use netlink::{Netlink, NlError};

/// The handle of the shaper's root qdisc (`5348:`, "SH" in ASCII). A root
/// with this handle was installed by the shaper; [`snapshot`] refuses to
/// record it, and [`is_shaper_root`] recognises it.
pub const SHAPER_HANDLE: u32 = 0x5348_0000;

/// Errors of this module. Each says what failed on which interface.
#[derive(Debug, thiserror::Error)]
pub enum TcError {
    /// No NETLINK_ROUTE socket could be opened.
    #[error("cannot open a NETLINK_ROUTE socket")]
    Socket {
        #[source]
        source: io::Error,
    },
    /// The kernel rejected a request; `kernel` is its extended-ACK message.
    #[error("{op} {what} failed{}", kernel_says(.kernel))]
    Request {
        op: &'static str,
        what: String,
        kernel: Option<String>,
        #[source]
        source: io::Error,
    },
    /// The kernel's answer could not be parsed.
    #[error("malformed reply to {op} {what}: {detail}")]
    Malformed {
        op: &'static str,
        what: String,
        detail: String,
    },
    /// The root is already the shaper's: a previous run did not clean up.
    #[error(
        "the root qdisc of {iface} is already the shaper's ({handle}): a previous run did not \
         clean up; restore its saved snapshot (or delete the root qdisc) first"
    )]
    ShaperRootPresent { iface: String, handle: Handle },
    /// Part of the tree cannot be put back exactly; found at snapshot time.
    #[error("cannot restore {what} exactly: {reason}")]
    Unrestorable { what: String, reason: String },
    /// The restore ran, but a fresh dump differs from the snapshot.
    #[error("restored {iface}, but its tree now differs from the snapshot: {detail}")]
    RestoreMismatch { iface: String, detail: String },
    /// [`Snapshot::decode`] was given bytes that are not a valid snapshot.
    #[error("invalid snapshot: {reason}")]
    BadSnapshot { reason: String },
    /// An argument is out of range.
    #[error("invalid {what}: {reason}")]
    InvalidArgument { what: &'static str, reason: String },
    /// The private network namespace of a probe could not be set up.
    #[error("cannot {step} for a kernel feature probe")]
    Probe {
        step: &'static str,
        #[source]
        source: io::Error,
    },
}

fn kernel_says(kernel: &Option<String>) -> String {
    kernel
        .as_ref()
        .map(|m| format!(" (kernel: {m})"))
        .unwrap_or_default()
}

impl TcError {
    /// Wraps a netlink failure of `op` on `what`.
    pub(crate) fn request(
        op: &'static str,
        what: impl Into<String>,
    ) -> impl FnOnce(NlError) -> Self {
        let what = what.into();
        // Our own parse failures carry no errno; kernel and syscall ones do.
        move |e| match (e.source.raw_os_error(), e.source.kind()) {
            (None, io::ErrorKind::InvalidData) => Self::Malformed {
                op,
                what,
                detail: e.source.to_string(),
            },
            _ => Self::Request {
                op,
                what,
                kernel: e.kernel,
                source: e.source,
            },
        }
    }

    /// The errno of a rejected request, if that is what this is.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Request { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// Opens a socket in the calling thread's network namespace.
pub(crate) fn open() -> Result<Netlink, TcError> {
    Netlink::open().map_err(|source| TcError::Socket { source })
}

/// "veth0 (ifindex 5)", or "ifindex 5" if the index has no name here.
pub(crate) fn iface(ifindex: u32) -> String {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has the IF_NAMESIZE bytes if_indextoname may write; the
    // result is either NULL or a pointer into `buf`, NUL-terminated.
    let name = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if name.is_null() {
        return format!("ifindex {ifindex}");
    }
    // SAFETY: non-NULL means `buf` now holds a NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(name) };
    format!("{} (ifindex {ifindex})", name.to_string_lossy())
}

/// The identity of a qdisc: its kind, its handle and its parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QdiscInfo {
    pub kind: String,
    pub handle: u32,
    pub parent: u32,
}

impl std::fmt::Display for QdiscInfo {
    /// "htb 1:", like the start of a `tc qdisc show` line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind, Handle(self.handle))
    }
}

/// Dumps all qdiscs of `ifindex` (the kernel may include other devices'
/// qdiscs in the answer on some kernels, so they are filtered here, see
/// `tc_dump_qdisc` in net/sched/sch_api.c, which walks every device).
pub(crate) fn dump_qdiscs(nl: &mut Netlink, ifindex: u32) -> Result<Vec<TcMessage>, TcError> {
    let what = format!("qdiscs of {}", iface(ifindex));
    let body = TcMessage::encode(
        TcMsg {
            ifindex,
            ..TcMsg::default()
        },
        &[],
    );
    let bodies = nl
        .dump(RTM_GETQDISC, RTM_NEWQDISC, &body)
        .map_err(TcError::request("dump", what.clone()))?;
    let mut out = Vec::new();
    for b in bodies {
        let m = TcMessage::decode(&b).map_err(|detail| TcError::Malformed {
            op: "dump",
            what: what.clone(),
            detail,
        })?;
        if m.header.ifindex == ifindex {
            out.push(m);
        }
    }
    Ok(out)
}

/// The root (egress) qdisc of `ifindex`: `None` only if the kernel lists no
/// root at all. A device that never had a qdisc configured shows its default
/// root with handle 0 (`noqueue 0:`, `pfifo_fast 0:`, `mq 0:`).
pub fn root_qdisc(ifindex: u32) -> Result<Option<QdiscInfo>, TcError> {
    let mut nl = open()?;
    let root = dump_qdiscs(&mut nl, ifindex)?
        .into_iter()
        .find(|m| m.header.parent == TC_H_ROOT);
    Ok(root.map(|m| QdiscInfo {
        kind: message::find(&m.attrs, TCA_KIND)
            .and_then(Attr::as_str)
            .unwrap_or("")
            .to_owned(),
        handle: m.header.handle,
        parent: m.header.parent,
    }))
}

/// True if the root qdisc of `ifindex` carries [`SHAPER_HANDLE`], i.e. the
/// shaper's fq (one TX queue) or mq (several) is installed.
pub fn is_shaper_root(ifindex: u32) -> Result<bool, TcError> {
    Ok(root_qdisc(ifindex)?.is_some_and(|q| q.handle == SHAPER_HANDLE))
}

/// Records the root tree of `ifindex` and checks that it can be restored
/// exactly. See [`Snapshot`] for what is recorded and [`restore`] for how
/// it is put back.
///
/// Errors: [`TcError::ShaperRootPresent`] if the shaper's own root is
/// installed; [`TcError::Unrestorable`] naming the first object whose dump
/// is known not to be replayable as it was; request errors otherwise.
pub fn snapshot(ifindex: u32) -> Result<Snapshot, TcError> {
    let mut nl = open()?;
    let (snap, notes) = dump::dump_tree(&mut nl, ifindex)?;
    if let Some(root) = snap.root().filter(|r| r.handle == SHAPER_HANDLE) {
        return Err(TcError::ShaperRootPresent {
            iface: iface(ifindex),
            handle: Handle(root.handle),
        });
    }
    check::restorable(&snap, &notes)?;
    Ok(snap)
}
