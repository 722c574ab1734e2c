//! Asking the running kernel whether it has a qdisc kind, without changing
//! anything anyone can see.
//!
//! How: a short-lived thread moves itself into a new, private network
//! namespace (`unshare(CLONE_NEWNET)`; the network namespace is a
//! per-thread attribute), tries to attach the qdisc to that namespace's
//! `lo` (always ifindex 1 there: `loopback_net_init` registers it first),
//! and ends. With the thread and its socket gone, the namespace has no
//! references left and the kernel frees it; the caller's thread never
//! leaves its own namespace.
//!
//! Side effect: on a modular kernel, asking for an unknown kind makes the
//! kernel try `modprobe sch_<kind>` (`qdisc_create` in net/sched/sch_api.c),
//! exactly as installing it would.
//!
//! Needs CAP_SYS_ADMIN (for `unshare`) like everything else in the shaper.

use std::io;

use super::message::{Attr, RTM_NEWQDISC, TC_H_INGRESS, TC_H_ROOT, TCA_KIND, TcMessage, TcMsg};
use super::netlink::{NLM_F_CREATE, NLM_F_EXCL};
use super::{TcError, open};

/// `lo` in a fresh network namespace.
const LOOPBACK_IFINDEX: u32 = 1;
/// The handle clsact and ingress always have.
const INGRESS_HANDLE: u32 = 0xffff_0000;

/// True if the kernel can create a qdisc of `kind` (e.g. "fq").
///
/// The probe adds `kind` without options as root of `lo` in a private
/// namespace. Success, or a complaint about the (missing) options such as
/// `EINVAL` from htb or tbf, means the kind exists. `ENOENT` ("Specified
/// qdisc kind is unknown") and `EOPNOTSUPP` mean it does not, or it cannot
/// be a root on a plain single-queue device (`mq`, for example).
pub fn probe_qdisc_kind(kind: &str) -> Result<bool, TcError> {
    let kind = kind.to_owned();
    in_private_netns(move || try_add(TC_H_ROOT, 0x0001_0000, &kind))
}

/// The first of `needs` whose qdisc kind (`kind_of`) the kernel lacks,
/// each probed with [`probe_qdisc_kind`] in turn. A probe that cannot
/// answer counts the kind as present: the caller goes on and fails where
/// the qdisc is first used, with the kernel's own message.
pub fn first_missing_qdisc<T>(
    needs: impl IntoIterator<Item = T>,
    kind_of: impl Fn(&T) -> &str,
) -> Option<T> {
    needs
        .into_iter()
        .find(|need| !probe_qdisc_kind(kind_of(need)).unwrap_or(true))
}

/// True if the kernel has the clsact qdisc (the shaper attaches its
/// classifier there). Probed like [`probe_qdisc_kind`], at `TC_H_CLSACT`.
pub fn probe_clsact() -> Result<bool, TcError> {
    in_private_netns(|| try_add(TC_H_INGRESS, INGRESS_HANDLE, "clsact"))
}

/// True if the kernel can redirect a device's ingress with a `matchall`
/// filter and a `mirred` action (`ifb` mode without TCX; see `mirred`).
/// Probed like [`probe_clsact`]: clsact on `lo`, then the filter, which
/// redirects `lo` to itself in a namespace nothing ever sends to.
/// `ENOENT` (unknown filter or action kind) and `EOPNOTSUPP` mean no.
pub fn probe_mirred() -> Result<bool, TcError> {
    in_private_netns(|| {
        if !try_add(TC_H_INGRESS, INGRESS_HANDLE, "clsact")? {
            return Ok(false);
        }
        let mut nl = open()?;
        match super::mirred::add_with(&mut nl, LOOPBACK_IFINDEX, LOOPBACK_IFINDEX) {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.errno(), Some(libc::ENOENT | libc::EOPNOTSUPP)) => Ok(false),
            Err(e) => Err(e),
        }
    })
}

/// Adds `kind` at `parent` of `lo`; maps "unknown/unsupported" to false.
fn try_add(parent: u32, handle: u32, kind: &str) -> Result<bool, TcError> {
    let mut nl = open()?;
    let tcm = TcMsg {
        ifindex: LOOPBACK_IFINDEX,
        handle,
        parent,
        info: 0,
    };
    let body = TcMessage::encode(tcm, &[Attr::string(TCA_KIND, kind)]);
    match nl.request(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL, &body) {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.errno(), Some(libc::ENOENT | libc::EOPNOTSUPP)) => Ok(false),
        // The kind exists but wants options (htb, tbf): still supported.
        Err(e) if e.errno() == Some(libc::EINVAL) => Ok(true),
        Err(e) => Err(TcError::request("probe", format!("qdisc kind {kind:?}"))(e)),
    }
}

/// Runs `f` on a new thread inside a new network namespace.
pub fn in_private_netns<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, TcError> + Send + 'static,
) -> Result<T, TcError> {
    let thread = std::thread::Builder::new()
        .name("tc-probe".into())
        .spawn(move || {
            // SAFETY: unshare has no memory-safety preconditions; it moves
            // only this thread, which nothing else uses, to a new namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(TcError::Probe {
                    step: "create a private network namespace",
                    source: io::Error::last_os_error(),
                });
            }
            f()
        })
        .map_err(|source| TcError::Probe {
            step: "start a thread",
            source,
        })?;
    thread.join().map_err(|_| TcError::Probe {
        step: "finish the probe thread",
        source: io::Error::other("it panicked"),
    })?
}
