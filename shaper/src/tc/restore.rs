//! Putting a recorded tree back, and checking that it is back.
//!
//! Order (each step needs the previous one):
//! 1. delete the current root qdisc unless it is a default (handle 0). This
//!    drops its whole tree with its filters; the kernel attaches its default
//!    root again (`qdisc_graft` → `dev_activate` → `attach_default_qdiscs`,
//!    net/sched/sch_generic.c) if the device is up;
//! 2. create the recorded root, unless it was a default (then step 1 made it);
//! 3. classes and child qdiscs, parents first, in an order inferred so that
//!    the kernel lists them as recorded (`order`). Classes the kernel
//!    creates by itself with their qdisc (mq's per-queue classes, tbf's
//!    `1:1`, hfsc's root class) answer `EEXIST` and count as there;
//! 4. filters, and chains that need a request of their own, in the order
//!    `filters::plan` gives, once the actions of the deleted filters are
//!    released (`actions`).
//!
//! Every object is created with `NLM_F_CREATE | NLM_F_EXCL` on a fresh tree,
//! so nothing half-matching is silently changed. Because step 1 starts from
//! scratch, restoring twice gives the same result (idempotent). Afterwards
//! the tree is dumped again and compared with the snapshot: qdisc kinds,
//! handles and parents; classes with their options; filter identities
//! (parent, chain, priority, protocol, kind, handle); chains. Qdisc options
//! are not compared because some carry counters (htb's `direct_pkts`).
//!
//! Non-goals: restoring statistics; keeping traffic flowing through the old
//! tree during the swap (packets meet the default qdisc for a moment).

use std::collections::BTreeSet;

use super::fixups::qdisc_attrs;
use super::message::{
    Attr, Handle, RTM_DELQDISC, RTM_NEWCHAIN, RTM_NEWQDISC, RTM_NEWTCLASS, RTM_NEWTFILTER,
    TC_H_ROOT, TcMessage, TcMsg,
};
use super::netlink::{NLM_F_CREATE, NLM_F_EXCL, Netlink};
use super::step::Request;
use super::{Snapshot, TcError, TcObject, actions, dump, dump_qdiscs, filters, iface, open, order};

/// Puts `snapshot`'s tree back on its interface, replacing whatever root
/// tree is there now (the ingress/clsact qdisc is not touched), then checks
/// the result.
///
/// Errors: [`TcError::Unrestorable`] before anything changed if the plan
/// cannot work; a request error naming the object the kernel refused (the
/// tree is then partial: fix the cause and call again);
/// [`TcError::RestoreMismatch`] if the final dump differs.
pub fn restore(snapshot: &Snapshot) -> Result<(), TcError> {
    let ifindex = snapshot.ifindex;
    let name = iface(ifindex);
    // No root at all: the device has never been up; deleting ours returns
    // it to that state, as for a default root.
    let root = snapshot.root().filter(|r| r.handle != 0);
    let steps = filters::plan(snapshot)?;
    let mut nl = open()?;

    let current = dump_qdiscs(&mut nl, ifindex)?
        .into_iter()
        .find(|m| m.header.parent == TC_H_ROOT);
    if let Some(cur) = current.filter(|c| c.header.handle != 0) {
        let what = format!("root qdisc {} on {name}", Handle(cur.header.handle));
        let tcm = TcMsg {
            ifindex,
            handle: cur.header.handle,
            parent: TC_H_ROOT,
            info: 0,
        };
        nl.request(RTM_DELQDISC, 0, &TcMessage::encode(tcm, &[]))
            .map_err(TcError::request("delete", what))?;
    }
    if let Some(root) = root {
        create(
            &mut nl,
            RTM_NEWQDISC,
            ifindex,
            root,
            &qdisc_attrs(root),
            &format!("root qdisc {} {}", root.kind(), Handle(root.handle)),
        )?;
    }

    build_tree(&mut nl, snapshot, &name)?;

    // Old filters are freed late; let their actions go first (see actions).
    actions::wait_until_unbound(&mut nl, &actions::recorded_actions(&snapshot.filters));
    for step in &steps {
        let tcm = TcMsg {
            ifindex,
            handle: step.handle,
            parent: step.parent,
            info: step.info,
        };
        let ty = match step.what {
            Request::Filter => RTM_NEWTFILTER,
            Request::Chain => RTM_NEWCHAIN,
        };
        nl.request(
            ty,
            NLM_F_CREATE | NLM_F_EXCL,
            &TcMessage::encode(tcm, &step.attrs),
        )
        .map_err(TcError::request(
            "create",
            format!("{} of {name}", step.describe()),
        ))?;
    }

    let (now, _) = dump::dump_tree(&mut nl, ifindex)?;
    match first_difference(snapshot, &now) {
        None => Ok(()),
        Some(detail) => Err(TcError::RestoreMismatch {
            iface: name,
            detail,
        }),
    }
}

/// Step 3: classes and child qdiscs, parents first, in the order `order`
/// infers from the dump.
fn build_tree(nl: &mut Netlink, s: &Snapshot, name: &str) -> Result<(), TcError> {
    // Classes with major 0 belong to a default root (mq 0:) and come with it.
    let mut there: BTreeSet<u32> = s
        .classes
        .iter()
        .filter(|c| c.handle >> 16 == 0)
        .map(|c| c.handle)
        .collect();
    if let Some(root) = s.root().filter(|r| r.handle != 0) {
        create_classes(nl, s, root, &mut there)?;
    }
    // Default children (handle 0) come with their parent; never created.
    let mut pending: Vec<&TcObject> = s
        .qdiscs
        .iter()
        .filter(|q| q.parent != TC_H_ROOT && q.handle != 0)
        .collect();
    while !pending.is_empty() {
        let Some(i) = order::next_qdisc(&pending, |parent| there.contains(&parent)) else {
            let stuck: Vec<String> = pending
                .iter()
                .map(|o| Handle(o.handle).to_string())
                .collect();
            return Err(TcError::Unrestorable {
                what: format!("qdiscs {} on {name}", stuck.join(", ")),
                reason: "their parent classes are not in the snapshot".into(),
            });
        };
        let q = pending.remove(i);
        let what = format!("qdisc {} {}", q.kind(), Handle(q.handle));
        create(nl, RTM_NEWQDISC, s.ifindex, q, &qdisc_attrs(q), &what)?;
        create_classes(nl, s, q, &mut there)?;
    }
    Ok(())
}

/// Creates the recorded classes of qdisc `q` and adds them to `there`.
fn create_classes(
    nl: &mut Netlink,
    s: &Snapshot,
    q: &TcObject,
    there: &mut BTreeSet<u32>,
) -> Result<(), TcError> {
    let mine: Vec<&TcObject> = s
        .classes
        .iter()
        .filter(|c| c.handle & 0xffff_0000 == q.handle)
        .collect();
    for c in order::classes(q, &mine) {
        let what = format!("class {} {}", c.kind(), Handle(c.handle));
        match create(nl, RTM_NEWTCLASS, s.ifindex, c, &c.attrs, &what) {
            Ok(()) => {}
            // Created by its qdisc already (mq, tbf, ...).
            Err(e) if e.errno() == Some(libc::EEXIST) => {}
            Err(e) => return Err(e),
        }
    }
    there.extend(mine.iter().map(|c| c.handle));
    Ok(())
}

/// Sends one create request for `o` with `attrs`.
fn create(
    nl: &mut Netlink,
    ty: u16,
    ifindex: u32,
    o: &TcObject,
    attrs: &[Attr],
    what: &str,
) -> Result<(), TcError> {
    let tcm = TcMsg {
        ifindex,
        handle: o.handle,
        parent: o.parent,
        info: o.info,
    };
    nl.request(
        ty,
        NLM_F_CREATE | NLM_F_EXCL,
        &TcMessage::encode(tcm, attrs),
    )
    .map(|_| ())
    .map_err(TcError::request(
        "create",
        format!("{what} on {}", iface(ifindex)),
    ))
}

/// The first way in which `now` differs from `want`, described for a human.
fn first_difference(want: &Snapshot, now: &Snapshot) -> Option<String> {
    let qdisc = |o: &TcObject| {
        format!(
            "qdisc {} {} parent {}",
            o.kind(),
            Handle(o.handle),
            Handle(o.parent)
        )
    };
    let class = |o: &TcObject| {
        let opts = o.options().map(|a| a.value.clone()).unwrap_or_default();
        (
            format!(
                "class {} {} parent {}",
                o.kind(),
                Handle(o.handle),
                Handle(o.parent)
            ),
            opts,
        )
    };
    let filter = |o: &TcObject| {
        format!(
            "{} filter {:#x} pref {} info {:#x} chain {} on {}",
            o.kind(),
            o.handle,
            o.prio(),
            o.info,
            o.chain(),
            Handle(o.parent)
        )
    };
    let chain = |o: &TcObject| format!("chain {} {} on {}", o.chain(), o.kind(), Handle(o.parent));
    diff("qdiscs", &want.qdiscs, &now.qdiscs, qdisc)
        .or_else(|| diff("classes", &want.classes, &now.classes, class))
        .or_else(|| diff("filters", &want.filters, &now.filters, filter))
        .or_else(|| diff("chains", &want.chains, &now.chains, chain))
}

/// Compares two lists as sorted multisets of keys.
fn diff<K: Ord + std::fmt::Debug>(
    what: &str,
    want: &[TcObject],
    now: &[TcObject],
    key: impl Fn(&TcObject) -> K,
) -> Option<String> {
    let mut a: Vec<K> = want.iter().map(&key).collect();
    let mut b: Vec<K> = now.iter().map(&key).collect();
    a.sort();
    b.sort();
    if a == b {
        return None;
    }
    let missing = a.iter().find(|k| !b.contains(k));
    let extra = b.iter().find(|k| !a.contains(k));
    Some(match (missing, extra) {
        (Some(m), _) => format!("{what}: {m:?} is missing"),
        (None, Some(e)) => format!("{what}: {e:?} is new"),
        (None, None) => format!("{what}: {} recorded, {} now", a.len(), b.len()),
    })
}
