//! In which order to create child qdiscs and classes so that the kernel
//! lists them in the recorded order.
//!
//! Why order matters: `tc qdisc show` lists the root, then the device's
//! qdisc hash (`qdisc_hash_add`: 16 fixed buckets by handle, each bucket
//! newest first, net/sched/sch_api.c). `tc class show` for htb, hfsc, drr
//! and qfq walks their `Qdisc_class_hash` (`qdisc_class_hash_insert` puts a
//! class at the head of its bucket; `qdisc_class_hash_grow` doubles the
//! table, from 4 buckets, once it is more than 3/4 full, re-inserting bucket
//! by bucket). Creation order is not recorded, so it is inferred:
//!
//! - child qdiscs: reverse dump order, which reproduces each bucket's
//!   newest-first order, deferring a qdisc until its parent class exists;
//! - hashed classes: an order found by `class_hash`, which searches
//!   backwards through a model of the class hash. If it finds none (a
//!   history with deletions can make the listing unreachable), reverse dump
//!   order, parents first: the tree is the same, only the listing differs.
//!
//! Invariant: the order returned always creates a parent class before its
//! children (the kernel requires it).

use super::message::TC_H_ROOT;
use super::{TcObject, class_hash};

/// Qdisc kinds that keep classes in a `Qdisc_class_hash`.
const HASHED_CLASSES: [&str; 4] = ["htb", "hfsc", "drr", "qfq"];

/// The order in which to create `classes` (all of one qdisc `q`, in dump
/// order) so that they parent-first exist and are listed as recorded.
pub(crate) fn classes<'a>(q: &TcObject, classes: &[&'a TcObject]) -> Vec<&'a TcObject> {
    // hfsc's root class (classid = qdisc handle) is created with the qdisc.
    let preexisting: Vec<u32> = classes
        .iter()
        .map(|c| c.handle)
        .filter(|&h| h == q.handle)
        .collect();
    let todo: Vec<&TcObject> = classes
        .iter()
        .copied()
        .filter(|c| c.handle != q.handle)
        .collect();
    if !HASHED_CLASSES.contains(&q.kind()) {
        return parents_first(q, &todo, &preexisting);
    }
    let reversed: Vec<&TcObject> = todo.iter().rev().copied().collect();
    let fallback = parents_first(q, &reversed, &preexisting);
    let recorded: Vec<u32> = classes.iter().map(|c| c.handle).collect();
    let parent_of = |id: u32| {
        let parent = classes.iter().find(|c| c.handle == id).map(|c| c.parent)?;
        recorded.contains(&parent).then_some(parent)
    };
    let Some(order) = class_hash::insertion_order(&recorded, parent_of) else {
        tracing::debug!(qdisc = %q.kind(), "no class creation order reproduces the listing");
        return fallback;
    };
    // The preexisting root class must come first: the qdisc inserts it.
    let Some(rest) = order.strip_prefix(preexisting.as_slice()) else {
        return fallback;
    };
    rest.iter()
        .filter_map(|id| todo.iter().find(|c| c.handle == *id).copied())
        .collect()
}

/// `items` reordered as little as possible so that each class comes after
/// its parent class (if that is among `items`).
fn parents_first<'a>(
    q: &TcObject,
    items: &[&'a TcObject],
    preexisting: &[u32],
) -> Vec<&'a TcObject> {
    let mut done: Vec<u32> = preexisting.to_vec();
    let mut out: Vec<&TcObject> = Vec::with_capacity(items.len());
    let mut left: Vec<&TcObject> = items.to_vec();
    while !left.is_empty() {
        let ready = left.iter().position(|c| {
            c.parent == TC_H_ROOT
                || c.parent == q.handle
                || done.contains(&c.parent)
                || !items.iter().any(|p| p.handle == c.parent)
        });
        // A cycle cannot come from a kernel dump; keep the rest as it is.
        let i = ready.unwrap_or(0);
        let c = left.remove(i);
        done.push(c.handle);
        out.push(c);
    }
    out
}

/// Child qdiscs (not the root, not defaults) in creation order: reverse
/// dump order, each once its parent class exists (`exists`).
pub(crate) fn next_qdisc(pending: &[&TcObject], exists: impl Fn(u32) -> bool) -> Option<usize> {
    (0..pending.len())
        .rev()
        .find(|&i| exists(pending[i].parent))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tc::message::{Attr, TCA_KIND};

    fn obj(handle: u32, parent: u32, kind: &str) -> TcObject {
        TcObject {
            handle,
            parent,
            info: 0,
            attrs: vec![Attr::string(TCA_KIND, kind)],
        }
    }

    #[test]
    fn a_creation_order_is_found_that_lists_as_recorded() {
        let q = obj(0x10000, TC_H_ROOT, "htb");
        let created = [
            (0x10001, TC_H_ROOT),
            (0x10010, 0x10001),
            (0x10030, 0x10001),
            (0x10020, 0x10001),
            (0x10005, TC_H_ROOT),
        ];
        let all: Vec<TcObject> = created.iter().map(|&(h, p)| obj(h, p, "htb")).collect();
        let listing = class_hash::listing(&all.iter().map(|c| c.handle).collect::<Vec<_>>());
        let dumped: Vec<&TcObject> = listing
            .iter()
            .filter_map(|h| all.iter().find(|c| c.handle == *h))
            .collect();
        let order = classes(&q, &dumped);
        let ids: Vec<u32> = order.iter().map(|c| c.handle).collect();
        assert_eq!(class_hash::listing(&ids), listing);
        let pos = |h: u32| ids.iter().position(|&x| x == h);
        assert!(pos(0x10001) < pos(0x10010), "parent first: {ids:x?}");
    }

    #[test]
    fn qdiscs_go_in_reverse_dump_order_when_ready() {
        let a = obj(0x100000, 0x10010, "tbf");
        let b = obj(0x200000, 0x10020, "pfifo");
        let pending = [&a, &b];
        assert_eq!(next_qdisc(&pending, |_| true), Some(1));
        assert_eq!(next_qdisc(&pending, |p| p == 0x10010), Some(0));
        assert_eq!(next_qdisc(&pending, |_| false), None);
    }
}
