//! The TC hooks: attaching a classifier at a device's egress or ingress
//! and detaching it again, and the clsact qdisc the shaper may create for
//! them. On kernels with TCX (6.6 and later) a classifier is a TCX link
//! pinned in bpffs, so it outlives the process; elsewhere it is a cls_bpf
//! filter on clsact, named by priority and handle. Either way the state
//! record names it before anything else can fail, so an undo after any
//! kill finds it.
//!
//! Also the error every attach and undo step reports ([`AttachError`]).
//!
//! Invariants: detaching tolerates what is already gone (a deleted device,
//! a clsact removed by hand, a missing pin). Non-goals: ordering among
//! other tools' classifiers (the shaper's goes where the kernel puts it).

use std::{io, path::Path};

use aya::{
    programs::{
        ProgramError, SchedClassifier, TcAttachType,
        links::{FdLink, Link as _, LinkError, PinnedLink},
        tc::{NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle},
    },
    sys::SyscallError,
};

use crate::{
    bpf,
    checks::{CheckError, kernel_has_tcx},
    link::Link,
    state::{AttachMode, Paths, Record},
    tc,
};

/// Failures while attaching or undoing. Each says which step failed.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// A command for a running pacer found none on this interface.
    #[error(
        "'{iface}' is not shaped by a running shaper in this network namespace: start one with \
         `shaper run --iface {iface} --rate RATE`"
    )]
    NotShaped {
        /// The interface named.
        iface: String,
    },
    /// `set-rate --ingress` for an interface whose run shapes no download.
    #[error(
        "'{iface}' is shaped, but not its download: `shaper set-rate --ingress` changes the rate \
         of a run started with --ingress-rate; leave out --ingress to change the upload's rate"
    )]
    NoIngress {
        /// The interface named.
        iface: String,
    },
    /// A pre-change check failed (usage error; nothing changed).
    #[error(transparent)]
    Check(#[from] CheckError),
    /// The embedded object is missing.
    #[error(transparent)]
    Object(#[from] bpf::ObjectError),
    /// Loading the object or the program failed.
    #[error("loading the BPF program failed: {detail}")]
    Load {
        /// What aya said, with the verifier log if any.
        detail: String,
    },
    /// A traffic-control change failed.
    #[error("{step} on '{iface}' failed")]
    Tc {
        /// The step.
        step: &'static str,
        /// The interface.
        iface: String,
        /// The cause.
        #[source]
        source: tc::TcError,
    },
    /// Attaching or detaching the classifier failed.
    #[error("{step} on '{iface}' failed: {detail}")]
    Classifier {
        /// The step.
        step: &'static str,
        /// The interface.
        iface: String,
        /// What aya said.
        detail: String,
    },
    /// State files or pins.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// Lowering or restoring the device's GSO size.
    #[error("on '{iface}'")]
    Gso {
        /// The interface.
        iface: String,
        /// The cause.
        #[source]
        source: crate::gso::GsoError,
    },
    /// Reading a counter array.
    #[error(transparent)]
    Counters(#[from] crate::counters::CounterError),
    /// Pinning or reading pinned objects.
    #[error("{op} {path}: {detail}")]
    Pin {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: String,
        /// What went wrong.
        detail: String,
    },
}

impl From<bpf::load::LoadError> for AttachError {
    /// A missing object stays the usage error it is; any other step failed.
    fn from(e: bpf::load::LoadError) -> Self {
        match e {
            bpf::load::LoadError::Object(o) => AttachError::Object(o),
            other => AttachError::Load {
                detail: other.to_string(),
            },
        }
    }
}

pub(crate) fn tc_err(step: &'static str, iface: &str) -> impl FnOnce(tc::TcError) -> AttachError {
    let iface = iface.to_owned();
    move |source| AttachError::Tc {
        step,
        iface,
        source,
    }
}

pub(crate) fn pin_err(
    op: &'static str,
    path: &Path,
    detail: impl std::fmt::Display,
) -> AttachError {
    AttachError::Pin {
        op,
        path: path.display().to_string(),
        detail: detail.to_string(),
    }
}

/// Creates the clsact qdisc on `link` unless it has one, recording first
/// that the shaper made it (so `undo` removes it).
pub(crate) fn ensure_clsact(
    link: &Link,
    paths: &Paths,
    record: &mut Record,
) -> Result<(), AttachError> {
    if record.created_clsact {
        return Ok(());
    }
    ensure_clsact_noting(link, || {
        record.created_clsact = true;
        record.store(&paths.record).map_err(AttachError::from)
    })
}

/// Creates the clsact qdisc on `link` unless it has one, calling `note`
/// first to record that the shaper made it.
pub(crate) fn ensure_clsact_noting(
    link: &Link,
    note: impl FnOnce() -> Result<(), AttachError>,
) -> Result<(), AttachError> {
    let iface = link.name.as_str();
    if tc::has_clsact(link.ifindex).map_err(tc_err("looking for clsact", iface))? {
        return Ok(());
    }
    note()?;
    tc::add_clsact(link.ifindex).map_err(tc_err("adding the clsact qdisc", iface))
}

/// Removes the clsact qdisc of `iface` when the shaper `created` it and it
/// is still there on the `present` device.
pub(crate) fn remove_created_clsact(
    iface: &str,
    ifindex: u32,
    created: bool,
    present: bool,
) -> Result<(), AttachError> {
    if created && present && !clsact_gone(iface) {
        tc::delete_clsact(ifindex).map_err(tc_err("removing the clsact qdisc", iface))
    } else {
        Ok(())
    }
}

/// Attaches `program` at `link`'s hook `ty`: a TCX link pinned at
/// `link_pin` on kernels with TCX, else a cls_bpf filter on clsact (which
/// must exist). `recorded` is called with the mode once attached and before
/// the link is pinned, so the state record names it first.
pub(crate) fn attach_classifier(
    program: &mut SchedClassifier,
    link: &Link,
    ty: TcAttachType,
    link_pin: &Path,
    mut recorded: impl FnMut(AttachMode) -> Result<(), AttachError>,
) -> Result<(), AttachError> {
    let iface = link.name.as_str();
    let classifier_err = |step: &'static str| {
        move |e: aya::programs::ProgramError| AttachError::Classifier {
            step,
            iface: iface.to_owned(),
            detail: format!("{e:#}"),
        }
    };
    if kernel_has_tcx() {
        let id = program
            .attach_with_options(
                iface,
                ty,
                TcAttachOptions::TcxOrder(aya::programs::LinkOrder::default()),
            )
            .map_err(classifier_err("attaching the classifier by TCX"))?;
        let tc_link = program
            .take_link(id)
            .map_err(classifier_err("taking the TCX link"))?;
        let fd_link: FdLink =
            tc_link
                .try_into()
                .map_err(|e: LinkError| AttachError::Classifier {
                    step: "converting the TCX link",
                    iface: iface.to_owned(),
                    detail: e.to_string(),
                })?;
        recorded(AttachMode::Tcx)?;
        // Dropping the returned PinnedLink closes our fd; the pin keeps the
        // link (and so the program) attached until `undo` removes it.
        fd_link
            .pin(link_pin)
            .map_err(|e| pin_err("pin the TCX link at", link_pin, e))?;
    } else {
        let id = program
            .attach_with_options(iface, ty, TcAttachOptions::Netlink(NlOptions::default()))
            .map_err(classifier_err("attaching the classifier to clsact"))?;
        let tc_link = program
            .take_link(id)
            .map_err(classifier_err("taking the tc link"))?;
        let priority = tc_link
            .priority()
            .map_err(classifier_err("reading the filter priority"))?;
        let handle = tc_link
            .handle()
            .map_err(classifier_err("reading the filter handle"))?;
        recorded(AttachMode::Netlink {
            priority,
            handle: u32::from(handle),
        })?;
        // Forget the link object: the filter stays until `undo` deletes it.
        std::mem::forget(tc_link);
    }
    Ok(())
}

/// Detaches what [`attach_classifier`] attached at hook `ty`, as `mode`
/// says; anything already gone is fine.
pub(crate) fn detach_classifier(
    iface: &str,
    ty: TcAttachType,
    mode: Option<AttachMode>,
    link_pin: &Path,
    present: bool,
) -> Result<(), AttachError> {
    match mode {
        Some(AttachMode::Tcx) => match PinnedLink::from_pin(link_pin) {
            Ok(pinned) => pinned
                .unpin()
                .map(drop)
                .map_err(|e| pin_err("unpin the TCX link at", link_pin, e)),
            Err(LinkError::SyscallError(SyscallError { io_error, .. }))
                if io_error.kind() == io::ErrorKind::NotFound =>
            {
                Ok(())
            }
            Err(e) => Err(pin_err("open the TCX link at", link_pin, e)),
        },
        // Filters live on the clsact qdisc and go with it: an undo cut
        // short after deleting it leaves nothing to detach.
        Some(AttachMode::Netlink { .. } | AttachMode::Mirred { .. })
            if present && clsact_gone(iface) =>
        {
            Ok(())
        }
        Some(AttachMode::Netlink { priority, handle }) if present => {
            SchedClassifierLink::attached(iface, ty, priority, TcHandle::from(handle), None)
                .map_err(|e| e.to_string())
                .and_then(|l| match l.detach() {
                    // Already gone (e.g. clsact deleted by hand) is fine.
                    Err(ProgramError::NetlinkError(e))
                        if e.raw_os_error() == Some(libc::ENOENT) =>
                    {
                        Ok(())
                    }
                    other => other.map_err(|e| format!("{e:#}")),
                })
                .map_err(|detail| AttachError::Classifier {
                    step: "detaching the classifier",
                    iface: iface.to_owned(),
                    detail,
                })
        }
        Some(AttachMode::Mirred { priority, handle }) if present => {
            let ifindex = crate::link::link_by_name(iface)
                .map_err(|e| e.to_string())
                .map(|l| l.ifindex);
            ifindex
                .and_then(|i| {
                    tc::delete_ingress_redirect(i, tc::FilterId { priority, handle })
                        .map_err(|e| e.to_string())
                })
                .map_err(|detail| AttachError::Classifier {
                    step: "deleting the ingress redirect filter",
                    iface: iface.to_owned(),
                    detail,
                })
        }
        _ => Ok(()),
    }
}

/// True when `iface` is there and has no clsact qdisc. A failed lookup
/// answers false, so the step that needs clsact runs and reports it.
pub(crate) fn clsact_gone(iface: &str) -> bool {
    crate::link::link_by_name(iface)
        .ok()
        .and_then(|l| tc::has_clsact(l.ifindex).ok())
        .is_some_and(|has| !has)
}
