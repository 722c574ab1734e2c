//! Can this snapshot be put back exactly? Checked when the snapshot is
//! taken, so that the shaper refuses to start instead of leaving the
//! interface different from what it found.
//!
//! Refused (each with the kernel function that makes it so):
//! - a size table with data (`stab ... linklayer atm`, `tsize > 0`): the dump
//!   holds only `TCA_STAB_BASE`, not `TCA_STAB_DATA` (`qdisc_dump_stab`,
//!   net/sched/sch_api.c), and `qdisc_get_stab` requires the data;
//! - a rate estimator (found by `dump`): its parameters are not dumped;
//! - red, choke and gred qdiscs (see `fixups`);
//! - an eBPF classifier (`bpf` with `TCA_BPF_ID`): it is dumped by program
//!   id, created only from a file descriptor (`cls_bpf_prog_from_efd`), and
//!   the program is freed with the filter;
//! - a child qdisc below a default (handle 0) root: no request can address a
//!   parent with handle 0 (`qdisc_lookup` returns NULL for 0), so it could
//!   not be re-attached;
//! - objects whose parent is not in the snapshot (the tree changed while it
//!   was dumped);
//! - u32 hash-table numbering the kernel would not reproduce (`filters`).
//!
//! Known and accepted: tbf and htb report burst sizes in 64 ns scheduler
//! ticks (`PSCHED_NS2TICKS`); a tbf created from a byte `burst` keeps its
//! exact byte budget internally, and replay derives it from the rounded
//! ticks, which can differ by less than one tick's worth of bytes. The
//! values `tc` shows are identical.

use super::message::{Handle, TC_H_ROOT, TCA_STAB, find, parse_attrs};
use super::{Snapshot, TcError, filters, fixups, iface};

/// `TCA_STAB_BASE` in `include/uapi/linux/pkt_sched.h`.
const TCA_STAB_BASE: u16 = 1;
/// Offset of `tsize` in `struct tc_sizespec` (u8, u8, s16, s32, 4 × u32).
const SIZESPEC_TSIZE_OFFSET: usize = 20;
/// `TCA_BPF_ID` in `include/uapi/linux/pkt_cls.h`.
const TCA_BPF_ID: u16 = 11;

/// Ok if `s` can be restored exactly; otherwise the first reason why not.
/// `problems` are those the dump already found.
pub(crate) fn restorable(s: &Snapshot, problems: &[TcError]) -> Result<(), TcError> {
    if let Some(TcError::Unrestorable { what, reason }) = problems.first() {
        return Err(TcError::Unrestorable {
            what: what.clone(),
            reason: reason.clone(),
        });
    }
    let name = iface(s.ifindex);
    let unrestorable = |what: String, reason: String| Err(TcError::Unrestorable { what, reason });

    for q in &s.qdiscs {
        let what = || format!("qdisc {} {} on {name}", q.kind(), Handle(q.handle));
        if let Some(tsize) = stab_table_size(q)
            && tsize > 0
        {
            return unrestorable(
                what(),
                format!(
                    "its size table (stab) has {tsize} entries, and the kernel dumps only the \
                     table's parameters, not its data"
                ),
            );
        }
        if let Some(reason) = fixups::unreplayable_qdisc(q.kind()) {
            return unrestorable(what(), reason.to_owned());
        }
        if q.parent == TC_H_ROOT || q.handle == 0 {
            continue;
        }
        if s.has_default_root() {
            return unrestorable(
                what(),
                format!(
                    "it hangs below the kernel's default root {} 0:, which has no handle a request \
                     could name, so it could not be attached again",
                    s.qdiscs.first().map_or("", |r| r.kind())
                ),
            );
        }
        if !s.classes.iter().any(|c| c.handle == q.parent) {
            return unrestorable(
                what(),
                format!(
                    "its parent class {} is not in the snapshot",
                    Handle(q.parent)
                ),
            );
        }
    }

    for c in &s.classes {
        let own_qdisc = s.qdiscs.iter().any(|q| q.handle == c.handle & 0xffff_0000);
        let parent_ok = c.parent == TC_H_ROOT
            || s.qdiscs.iter().any(|q| q.handle == c.parent)
            || s.classes.iter().any(|p| p.handle == c.parent);
        if !own_qdisc || !parent_ok {
            return unrestorable(
                format!("class {} {} on {name}", c.kind(), Handle(c.handle)),
                format!(
                    "its qdisc or parent {} is not in the snapshot",
                    Handle(c.parent)
                ),
            );
        }
    }

    for f in s.filters.iter().filter(|f| f.kind() == "bpf") {
        let id = f
            .options()
            .and_then(|o| parse_attrs(&o.value).ok())
            .and_then(|o| find(&o, TCA_BPF_ID).and_then(|a| a.as_u32()));
        if let Some(id) = id {
            return unrestorable(
                format!(
                    "bpf filter {:#x} (pref {}) on {} of {name}",
                    f.handle,
                    f.prio(),
                    Handle(f.parent)
                ),
                format!(
                    "it runs eBPF program id {id}; a filter can only be created from a program file \
                     descriptor, and the program is freed together with the filter"
                ),
            );
        }
    }

    filters::plan(s).map(|_| ())
}

/// `tsize` of the qdisc's size table, if it has one.
fn stab_table_size(q: &super::TcObject) -> Option<u32> {
    let stab = find(&q.attrs, TCA_STAB)?;
    let nested = parse_attrs(&stab.value).ok()?;
    let base = find(&nested, TCA_STAB_BASE)?;
    let b = base
        .value
        .get(SIZESPEC_TSIZE_OFFSET..SIZESPEC_TSIZE_OFFSET + 4)?;
    Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tc::message::{Attr, TCA_KIND, TCA_OPTIONS};
    use crate::tc::{TcObject, U32Root};

    fn q(handle: u32, parent: u32, kind: &str, extra: Vec<Attr>) -> TcObject {
        let mut attrs = vec![Attr::string(TCA_KIND, kind)];
        attrs.extend(extra);
        TcObject {
            handle,
            parent,
            info: 0,
            attrs,
        }
    }

    fn snap(qdiscs: Vec<TcObject>, classes: Vec<TcObject>, filters: Vec<TcObject>) -> Snapshot {
        Snapshot {
            ifindex: 1,
            qdiscs,
            classes,
            chains: vec![],
            filters,
            u32_roots: Vec::<U32Root>::new(),
        }
    }

    fn stab(tsize: u32) -> Attr {
        let mut spec = vec![0u8; 24];
        spec[20..24].copy_from_slice(&tsize.to_ne_bytes());
        Attr::nested(TCA_STAB, &[Attr::bytes(TCA_STAB_BASE, &spec)])
    }

    #[test]
    fn stab_with_table_is_refused_without_table_accepted() {
        let s = snap(
            vec![q(0x10000, TC_H_ROOT, "htb", vec![stab(512)])],
            vec![],
            vec![],
        );
        let e = restorable(&s, &[]).expect_err("must fail");
        assert!(e.to_string().contains("512 entries"), "{e}");
        let s = snap(
            vec![q(0x10000, TC_H_ROOT, "htb", vec![stab(0)])],
            vec![],
            vec![],
        );
        restorable(&s, &[]).expect("must succeed");
    }

    #[test]
    fn ebpf_filter_is_refused() {
        let opts = Attr::nested(TCA_OPTIONS, &[Attr::u32(TCA_BPF_ID, 42)]);
        let f = TcObject {
            handle: 1,
            parent: 0x10000,
            info: 0xc000_0300,
            attrs: vec![Attr::string(TCA_KIND, "bpf"), opts],
        };
        let s = snap(vec![q(0x10000, TC_H_ROOT, "htb", vec![])], vec![], vec![f]);
        let e = restorable(&s, &[]).expect_err("must fail");
        assert!(e.to_string().contains("eBPF program id 42"), "{e}");
    }

    #[test]
    fn child_of_default_root_and_orphans_are_refused() {
        let s = snap(
            vec![
                q(0, TC_H_ROOT, "mq", vec![]),
                q(0x80010000, 1, "pfifo", vec![]),
            ],
            vec![],
            vec![],
        );
        assert!(
            restorable(&s, &[])
                .expect_err("must fail")
                .to_string()
                .contains("default root mq 0:")
        );
        let s = snap(
            vec![
                q(0x10000, TC_H_ROOT, "htb", vec![]),
                q(0x100000, 0x10010, "tbf", vec![]),
            ],
            vec![],
            vec![],
        );
        assert!(
            restorable(&s, &[])
                .expect_err("must fail")
                .to_string()
                .contains("parent class 1:10")
        );
        let default_children = snap(
            vec![q(0, TC_H_ROOT, "mq", vec![]), q(0, 1, "pfifo_fast", vec![])],
            vec![],
            vec![],
        );
        restorable(&default_children, &[]).expect("must succeed");
    }
}
