//! How recorded filters are created again: in which order, through which
//! filter.
//!
//! Options are repaired as `fixups` describes. What needs planning here:
//!
//! - **u32 hash-table numbers.** u32 keeps one table namespace per qdisc
//!   (`tc_u_common`, shared by the qdisc's and its classes' filter blocks,
//!   see `tc_u_common_ptr` in net/sched/cls_u32.c). Each u32 filter
//!   (priority) gets a root table the kernel numbers itself: the first one
//!   `800:`, later ones through `gen_new_htid()`, i.e. `801:`, `802:`, ... in
//!   creation order. A dump lists every table of that priority under every
//!   filter of that priority, so ownership comes from the snapshot's
//!   [`U32Root`] records (asked with `u32_get(tp, TC_U32_ROOT)`). Replay
//!   creates the filters in the order of their root numbers, which reproduces
//!   the numbering only if it is `800:`, `801:`, ... without gaps; anything
//!   else is refused at snapshot time. User tables and keys are then created
//!   with their explicit handles, tables first (keys may link to them).
//!
//! - **Element order.** bpf and basic list their elements newest first;
//!   they are created in reverse dump order so the list reads the same.
//! - **Chain order.** See `chains`; each creation is a `step::Step`.
//!
//! Non-goals: eBPF classifiers (refused in `check`), shared blocks.

use std::collections::BTreeSet;

use super::fixups::filter_attrs as replay_attrs;
use super::message::{Attr, TCA_CHAIN, TCA_KIND};
use super::step::Step;
use super::{Snapshot, TcError, TcObject, U32Root, chains};

/// `TC_U32_ROOT`: as a handle in a u32 request, "this filter's root table".
pub(crate) const U32_ROOT_ALIAS: u32 = 0xfff0_0000;
/// `TC_U32_HTID` mask: the table part of a u32 handle.
const U32_HTID_MASK: u32 = 0xfff0_0000;
/// The number of the first root table of a qdisc (`u32_init`: 0x80000000).
const U32_FIRST_ROOT_HTID: u32 = 0x800;

/// True for a u32 hash-table handle (`htid:`, no bucket, no key).
pub(crate) fn is_u32_table(handle: u32) -> bool {
    handle != 0 && handle & !U32_HTID_MASK == 0
}

/// One filter (`struct tcf_proto`): parent, chain and `tcm_info`.
type ProtoKey = (u32, u32, u32);

/// Classifiers that add new elements at the head of their list, so a dump
/// lists them newest first (`list_add_rcu` in `cls_bpf_change`,
/// `basic_change`); their elements are replayed in reverse dump order.
const NEWEST_FIRST: [&str; 2] = ["bpf", "basic"];

/// The filter and chain creations that rebuild `s.filters` and `s.chains`,
/// in a working order. Errors with [`TcError::Unrestorable`] when u32
/// numbering or chain order cannot be reproduced; this runs at snapshot
/// time and again before a restore.
pub(crate) fn plan(s: &Snapshot) -> Result<Vec<Step>, TcError> {
    let mut steps = Vec::new();
    let mut majors: Vec<u32> = Vec::new();
    for f in s.filters.iter().filter(|f| f.kind() == "u32") {
        if !majors.contains(&(f.parent >> 16)) {
            majors.push(f.parent >> 16);
        }
    }
    for major in majors {
        plan_u32(s, major, &mut steps)?;
    }
    // Other classifiers: per filter (parent, chain, priority, protocol).
    let mut groups: Vec<(ProtoKey, Vec<&TcObject>)> = Vec::new();
    for f in s
        .filters
        .iter()
        .filter(|f| f.kind() != "u32" && f.handle != 0)
    {
        let key = (f.parent, f.chain(), f.info);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(f),
            None => groups.push((key, vec![f])),
        }
    }
    for (_, mut members) in groups {
        if members
            .first()
            .is_some_and(|f| NEWEST_FIRST.contains(&f.kind()))
        {
            members.reverse();
        }
        steps.extend(
            members
                .into_iter()
                .map(|f| Step::filter(f.parent, f.handle, f.info, replay_attrs(f))),
        );
    }
    chains::place(s, steps)
}

/// u32 filters of the qdisc `major:`: roots in number order, then tables,
/// then keys, each once.
fn plan_u32(s: &Snapshot, major: u32, steps: &mut Vec<Step>) -> Result<(), TcError> {
    let entries: Vec<&TcObject> = s
        .filters
        .iter()
        .filter(|f| f.kind() == "u32" && f.parent >> 16 == major)
        .collect();
    let mut roots: Vec<&U32Root> = s
        .u32_roots
        .iter()
        .filter(|r| r.parent >> 16 == major)
        .collect();
    roots.sort_by_key(|r| r.handle);
    let headers = entries.iter().filter(|f| f.handle == 0).count();
    if headers != roots.len() {
        return Err(TcError::Unrestorable {
            what: format!("the u32 filters of qdisc {major:x}:"),
            reason: format!(
                "{headers} u32 filters but {} recorded root tables",
                roots.len()
            ),
        });
    }
    let expected: Vec<u32> = (0..roots.len())
        .map(|i| (U32_FIRST_ROOT_HTID + i as u32) << 20)
        .collect();
    let actual: Vec<u32> = roots.iter().map(|r| r.handle).collect();
    if actual != expected {
        let list = |v: &[u32]| {
            v.iter()
                .map(|h| format!("{:x}:", h >> 20))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(TcError::Unrestorable {
            what: format!("the u32 filters of qdisc {major:x}:"),
            reason: format!(
                "their root hash tables are {}, but created again the kernel would number them {} \
                 (it numbers them itself in creation order, gen_new_htid in net/sched/cls_u32.c; \
                 a filter priority was deleted, or a table was added without a handle)",
                list(&actual),
                list(&expected)
            ),
        });
    }
    for r in &roots {
        let attrs = vec![Attr::string(TCA_KIND, "u32"), Attr::u32(TCA_CHAIN, r.chain)];
        steps.push(Step::filter(r.parent, 0, r.info, attrs));
    }
    let mut done: BTreeSet<u32> = actual.iter().copied().collect();
    for f in entries.iter().filter(|f| is_u32_table(f.handle)) {
        if done.insert(f.handle) {
            steps.push(Step::filter(f.parent, f.handle, f.info, replay_attrs(f)));
        }
    }
    for f in entries
        .iter()
        .filter(|f| f.handle != 0 && !is_u32_table(f.handle))
    {
        if !done.insert(f.handle) {
            continue;
        }
        // Create a key through the filter that owns its table, if a root.
        let owner = roots.iter().find(|r| r.handle == f.handle & U32_HTID_MASK);
        let (parent, info, chain) = owner.map_or((f.parent, f.info, f.chain()), |r| {
            (r.parent, r.info, r.chain)
        });
        let mut attrs = replay_attrs(f);
        attrs.retain(|a| a.number() != TCA_CHAIN);
        attrs.push(Attr::u32(TCA_CHAIN, chain));
        steps.push(Step::filter(parent, f.handle, info, attrs));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tc::message::{TC_H_ROOT, TCA_OPTIONS};

    const PRIO1_IP: u32 = (1 << 16) | 0x0008; // pref 1, ETH_P_IP in network byte order (LE host)

    fn u32_entry(parent: u32, info: u32, handle: u32, options: Option<Vec<Attr>>) -> TcObject {
        let mut attrs = vec![Attr::string(TCA_KIND, "u32"), Attr::u32(TCA_CHAIN, 0)];
        if let Some(o) = options {
            attrs.push(Attr::nested(TCA_OPTIONS, &o));
        }
        TcObject {
            handle,
            parent,
            info,
            attrs,
        }
    }

    fn snap(filters: Vec<TcObject>, roots: Vec<U32Root>) -> Snapshot {
        let root = TcObject {
            handle: 0x10000,
            parent: TC_H_ROOT,
            info: 0,
            attrs: vec![Attr::string(TCA_KIND, "htb")],
        };
        Snapshot {
            ifindex: 1,
            qdiscs: vec![root],
            classes: vec![],
            chains: vec![],
            filters,
            u32_roots: roots,
        }
    }

    #[test]
    fn u32_roots_are_created_in_number_order_and_keys_through_their_owner() {
        let class_parent = 0x10001;
        let filters = vec![
            u32_entry(0x10000, PRIO1_IP, 0, None),
            u32_entry(0x10000, PRIO1_IP, 0x8010_0000, Some(vec![Attr::u32(4, 1)])),
            u32_entry(0x10000, PRIO1_IP, 0x8010_0800, Some(vec![])),
            u32_entry(0x10000, PRIO1_IP, 0x8000_0000, Some(vec![Attr::u32(4, 1)])),
            u32_entry(0x10000, PRIO1_IP, 0x8000_0800, Some(vec![])),
            u32_entry(class_parent, PRIO1_IP, 0, None),
            u32_entry(
                class_parent,
                PRIO1_IP,
                0x8010_0000,
                Some(vec![Attr::u32(4, 1)]),
            ),
            u32_entry(class_parent, PRIO1_IP, 0x8010_0800, Some(vec![])),
            u32_entry(
                class_parent,
                PRIO1_IP,
                0x8000_0000,
                Some(vec![Attr::u32(4, 1)]),
            ),
            u32_entry(class_parent, PRIO1_IP, 0x8000_0800, Some(vec![])),
        ];
        let roots = vec![
            U32Root {
                parent: 0x10000,
                chain: 0,
                info: PRIO1_IP,
                handle: 0x8000_0000,
            },
            U32Root {
                parent: class_parent,
                chain: 0,
                info: PRIO1_IP,
                handle: 0x8010_0000,
            },
        ];
        let steps = plan(&snap(filters, roots)).expect("must succeed");
        let got: Vec<(u32, u32)> = steps.iter().map(|s| (s.parent, s.handle)).collect();
        assert_eq!(
            got,
            vec![
                (0x10000, 0),
                (class_parent, 0),
                (class_parent, 0x8010_0800),
                (0x10000, 0x8000_0800)
            ]
        );
    }

    #[test]
    fn u32_numbering_gap_is_refused() {
        let filters = vec![
            u32_entry(0x10000, PRIO1_IP, 0, None),
            u32_entry(0x10000, 2 << 16 | 8, 0, None),
        ];
        let roots = vec![
            U32Root {
                parent: 0x10000,
                chain: 0,
                info: PRIO1_IP,
                handle: 0x8000_0000,
            },
            U32Root {
                parent: 0x10000,
                chain: 0,
                info: 2 << 16 | 8,
                handle: 0x8020_0000,
            },
        ];
        let e = plan(&snap(filters, roots)).expect_err("must fail");
        assert!(e.to_string().contains("800:, 802:"), "{e}");
    }

    #[test]
    fn table_handles() {
        assert!(is_u32_table(0x8000_0000));
        assert!(is_u32_table(0x0010_0000));
        assert!(!is_u32_table(0x8000_0800));
        assert!(!is_u32_table(0));
    }
}
