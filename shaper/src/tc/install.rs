//! Installing the shaper's root: sch_fq directly on a single-queue device,
//! or `mq` with one sch_fq per TX queue on a multi-queue device (as Cilium's
//! bandwidth manager does), so queues keep their own locks.
//!
//! Invariants: the root gets [`SHAPER_HANDLE`] so it can be recognised
//! later; per-queue children get kernel-chosen handles (`8001:`, ...).
//! Requests use `NLM_F_CREATE | NLM_F_REPLACE`, like `tc qdisc replace`:
//! the old root tree (classes, filters) is dropped, which is why a
//! [`snapshot`](super::snapshot) must be taken first. Running it again with
//! the same arguments changes nothing (the kernel then updates the options
//! in place, `tc_modify_qdisc` in net/sched/sch_api.c).
//!
//! On error the tree may be half-installed (mq root without all children);
//! the caller restores its snapshot.

use super::message::{
    Attr, Handle, RTM_NEWQDISC, TC_H_ROOT, TCA_KIND, TCA_OPTIONS, TcMessage, TcMsg,
};
use super::netlink::{NLM_F_CREATE, NLM_F_REPLACE};
use super::{FqParams, SHAPER_HANDLE, TcError, iface, open};

/// Installs sch_fq with `fq` as the root of `ifindex`: directly if
/// `tx_queues` is 1, below an `mq` root otherwise. See [`install_root`].
pub fn install_fq_root(ifindex: u32, tx_queues: u32, fq: &FqParams) -> Result<(), TcError> {
    fq.validate()?;
    install_root(ifindex, tx_queues, "fq", Some(&fq.options()))
}

/// Installs a qdisc of `kind` as the shaper's root of `ifindex`.
///
/// - `tx_queues == 1`: `kind` is the root, handle [`SHAPER_HANDLE`].
/// - `tx_queues > 1`: `mq` is the root with [`SHAPER_HANDLE`], and a `kind`
///   qdisc replaces the default child of each of its classes
///   `5348:1 ..= 5348:tx_queues` (class `n` feeds TX queue `n - 1`). The
///   device must have that many TX queues (`mq_init` refuses a single-queue
///   device with `EOPNOTSUPP`).
///
/// `options` is the payload of `TCA_OPTIONS` (`None`: no such attribute,
/// which some kinds such as pfifo need to pick their defaults).
pub fn install_root(
    ifindex: u32,
    tx_queues: u32,
    kind: &str,
    options: Option<&[u8]>,
) -> Result<(), TcError> {
    if tx_queues == 0 {
        return Err(TcError::InvalidArgument {
            what: "TX queue count",
            reason: "it must be at least 1".into(),
        });
    }
    let name = iface(ifindex);
    let mut nl = open()?;
    let mut replace = |handle: u32, parent: u32, kind: &str, options: Option<&[u8]>| {
        replace_qdisc(&mut nl, &name, ifindex, handle, parent, kind, options)
    };
    if tx_queues == 1 {
        return replace(SHAPER_HANDLE, TC_H_ROOT, kind, options);
    }
    replace(SHAPER_HANDLE, TC_H_ROOT, "mq", None)?;
    for queue in 1..=tx_queues {
        replace(0, SHAPER_HANDLE | queue, kind, options)?;
    }
    Ok(())
}

/// Installs a qdisc of `kind` at the root of `ifindex` with a handle the
/// kernel chooses (not the shaper's: the shaper does not own it), as `tc
/// qdisc replace dev IF root KIND` with `options` as its `TCA_OPTIONS`. For
/// the lab's anchors that this system's `tc` cannot configure.
pub fn install_plain_root(ifindex: u32, kind: &str, options: Option<&[u8]>) -> Result<(), TcError> {
    let name = iface(ifindex);
    let mut nl = open()?;
    replace_qdisc(&mut nl, &name, ifindex, 0, TC_H_ROOT, kind, options)
}

/// One `RTM_NEWQDISC` with `NLM_F_CREATE | NLM_F_REPLACE`.
fn replace_qdisc(
    nl: &mut super::netlink::Netlink,
    name: &str,
    ifindex: u32,
    handle: u32,
    parent: u32,
    kind: &str,
    options: Option<&[u8]>,
) -> Result<(), TcError> {
    let mut attrs = vec![Attr::string(TCA_KIND, kind)];
    if let Some(o) = options {
        attrs.push(Attr {
            ty: TCA_OPTIONS,
            value: o.to_vec(),
        });
    }
    let body = TcMessage::encode(
        TcMsg {
            ifindex,
            handle,
            parent,
            info: 0,
        },
        &attrs,
    );
    let where_ = if parent == TC_H_ROOT {
        "root".to_owned()
    } else {
        format!("parent {}", Handle(parent))
    };
    let what = format!("{kind} qdisc at {where_} of {name}");
    nl.request(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE, &body)
        .map(|_| ())
        .map_err(TcError::request("install", what))
}
