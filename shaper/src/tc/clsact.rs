//! The clsact qdisc, where the shaper's classifier attaches when the kernel
//! has no TCX. It lives beside the root tree (parent `TC_H_CLSACT`, handle
//! `ffff:`), is never part of a [`Snapshot`](super::Snapshot), and is only
//! touched through these three calls.

use super::message::{Attr, RTM_DELQDISC, RTM_NEWQDISC, TC_H_INGRESS, TCA_KIND, TcMessage, TcMsg};
use super::netlink::{NLM_F_CREATE, NLM_F_EXCL};
use super::{TcError, dump_qdiscs, iface, open};

/// `TC_H_CLSACT` equals `TC_H_INGRESS`; clsact's handle is always `ffff:`.
const CLSACT_HANDLE: u32 = 0xffff_0000;

/// True if `ifindex` has a clsact qdisc (an `ingress` qdisc does not count).
pub fn has_clsact(ifindex: u32) -> Result<bool, TcError> {
    let mut nl = open()?;
    let qdiscs = dump_qdiscs(&mut nl, ifindex)?;
    Ok(qdiscs.iter().any(|m| {
        m.header.parent == TC_H_INGRESS
            && super::message::find(&m.attrs, TCA_KIND).and_then(Attr::as_str) == Some("clsact")
    }))
}

/// Adds a clsact qdisc to `ifindex`. Fails with `EEXIST` if there is one
/// (or an ingress qdisc) already.
pub fn add_clsact(ifindex: u32) -> Result<(), TcError> {
    let mut nl = open()?;
    let tcm = TcMsg {
        ifindex,
        handle: CLSACT_HANDLE,
        parent: TC_H_INGRESS,
        info: 0,
    };
    let body = TcMessage::encode(tcm, &[Attr::string(TCA_KIND, "clsact")]);
    nl.request(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL, &body)
        .map(|_| ())
        .map_err(TcError::request(
            "add",
            format!("clsact qdisc on {}", iface(ifindex)),
        ))
}

/// Deletes the clsact qdisc of `ifindex` with all its filters. Succeeds if
/// there is none (`ENOENT`), so that cleanup can be repeated.
pub fn delete_clsact(ifindex: u32) -> Result<(), TcError> {
    let mut nl = open()?;
    let tcm = TcMsg {
        ifindex,
        handle: CLSACT_HANDLE,
        parent: TC_H_INGRESS,
        info: 0,
    };
    let body = TcMessage::encode(tcm, &[Attr::string(TCA_KIND, "clsact")]);
    match nl.request(RTM_DELQDISC, 0, &body) {
        Err(e) if e.errno() == Some(libc::ENOENT) => Ok(()),
        other => other.map(|_| ()).map_err(TcError::request(
            "delete",
            format!("clsact qdisc on {}", iface(ifindex)),
        )),
    }
}
