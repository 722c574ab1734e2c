//! Undoing what the state record says was done, in reverse order, from
//! any point: after a failed attach step, on SIGINT or SIGTERM, or from
//! `shaper cleanup` after a kill. The egress classifier, the ingress
//! program and its IFB (whose own shaping is undone the same way), the
//! LAN classifiers of `--nat` with the run's map of LAN hosts, the
//! clsact qdisc if the shaper made it, the root qdisc if it is still the
//! shaper's, the GSO sizes, then the pins and the record.
//!
//! Invariants: every step is tried and tolerates its part already gone (a
//! vanished bpffs, a deleted or recreated interface, a dead process); the
//! first error is returned after all have run. A root another tool put in
//! place is left alone ([`root_is_ours`]). A restore under way is recorded
//! before its first step, so a kill during it leaves a root the next undo
//! restores again.

use std::fs;

use aya::programs::TcAttachType;
use tracing::{info, warn};

use crate::{
    gso,
    hook::{AttachError, detach_classifier, remove_created_clsact, tc_err},
    ifb,
    link::link_by_name,
    pins,
    state::{IfbRecord, IngressRecord, Paths, Record, remove_record},
    tc,
};

/// Undoes what `record` says was done, in reverse order, then removes the
/// pins and the record. Tolerates parts already gone. Every step is tried; the
/// first error is returned after all have run.
pub fn undo(record: &Record, paths: &Paths) -> Result<(), AttachError> {
    let iface = record.iface.as_str();
    let mut first_err: Option<AttachError> = None;
    let mut keep = |r: Result<(), AttachError>| {
        if let Err(e) = r {
            warn!(iface, error = %e, "undo step failed");
            first_err.get_or_insert(e);
        }
    };

    // The same interface still there? A deleted (or deleted and recreated)
    // interface took its qdiscs and filters with it.
    let present = match link_by_name(iface) {
        Ok(l) => l.ifindex == record.ifindex,
        Err(crate::link::LinkError::NotFound { .. }) => false,
        Err(e) => {
            keep(Err(AttachError::Classifier {
                step: "looking up the interface",
                iface: iface.to_owned(),
                detail: e.to_string(),
            }));
            false
        }
    };
    if !present {
        info!(
            iface,
            "interface is gone; only removing the shaper's own state"
        );
    }

    // Classifier.
    keep(detach_classifier(
        iface,
        TcAttachType::Egress,
        record.attach,
        &paths.pin_dir.join(pins::LINK),
        present,
    ));
    if let Some(ingress) = &record.ingress {
        keep(detach_ingress(record, ingress, paths, present));
    }
    keep(crate::nat::detach(record, paths));
    keep(remove_created_clsact(
        iface,
        record.ifindex,
        record.created_clsact,
        present,
    ));

    // Root qdisc: only if it is still ours; someone may have replaced it.
    if record.replaced_root && present {
        let snapshot =
            tc::Snapshot::decode(&record.snapshot).map_err(tc_err("reading the record", iface));
        let current =
            tc::root_qdisc(record.ifindex).map_err(tc_err("reading the root qdisc", iface));
        match (snapshot, current) {
            (Ok(snap), Ok(current))
                if root_is_ours(current.as_ref(), &snap, record.restoring_root) =>
            {
                // Said before the first step: a kill from here on leaves a
                // root that the next undo restores again.
                if !record.restoring_root {
                    let mut r = record.clone();
                    r.restoring_root = true;
                    keep(r.store(&paths.record).map_err(AttachError::from));
                }
                keep(tc::restore(&snap).map_err(tc_err("restoring the saved qdiscs", iface)));
            }
            (Ok(_), Ok(_)) => warn!(
                iface,
                "the root qdisc is no longer the shaper's; leaving it as it is"
            ),
            (Err(e), _) | (_, Err(e)) => keep(Err(e)),
        }
    }

    // GSO sizes.
    if let (Some(before), true) = (record.gso_before, present) {
        keep(
            gso::set(record.ifindex, before).map_err(|source| AttachError::Gso {
                iface: iface.to_owned(),
                source,
            }),
        );
    }

    // Pins and record.
    pins::clear(&paths.pin_dir);
    let _ = fs::remove_dir(&paths.pin_dir);
    keep(remove_record(&paths.record).map_err(AttachError::from));
    match first_err {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// Whether the root qdisc `current` is the shaper's to restore: its own
/// root, or, once a restore of `snapshot` has begun, what that restore
/// leaves part-way (the kernel's default after its first step, or the
/// snapshot's own root kind and handle with the tree under it unfinished).
/// Anything else another tool put there, and it is left alone.
fn root_is_ours(current: Option<&tc::QdiscInfo>, snapshot: &tc::Snapshot, restoring: bool) -> bool {
    let Some(current) = current else {
        // No root at all: a device that was never up; nothing to restore.
        return false;
    };
    if current.handle == tc::SHAPER_HANDLE {
        return true;
    }
    restoring
        && (current.handle == 0
            || snapshot
                .root()
                .is_some_and(|r| r.handle == current.handle && r.kind() == current.kind))
}

/// Detaches the ingress program `ingress` names and removes its pins,
/// then the IFB if there is one. Runs before clsact is removed, and the
/// redirect goes first, so no packet is sent to an IFB being dismantled.
/// Anything already gone is fine.
fn detach_ingress(
    record: &Record,
    ingress: &IngressRecord,
    paths: &Paths,
    present: bool,
) -> Result<(), AttachError> {
    let dir = pins::ingress_dir(paths);
    let detached = detach_classifier(
        &record.iface,
        TcAttachType::Ingress,
        ingress.attach,
        &dir.join(pins::LINK),
        present,
    );
    pins::clear(&dir);
    let _ = fs::remove_dir(&dir);
    let ifb = match &ingress.ifb {
        Some(f) => remove_ifb(f, paths),
        None => Ok(()),
    };
    detached.and(ifb)
}

/// Undoes the IFB's own shaping (its record, if any) and deletes the IFB.
fn remove_ifb(f: &IfbRecord, paths: &Paths) -> Result<(), AttachError> {
    let ifb_paths = paths.sibling(&f.name);
    let shaping = match Record::load(&ifb_paths.record) {
        Ok(Some(r)) => undo(&r, &ifb_paths),
        Ok(None) => Ok(()),
        Err(e) => Err(e.into()),
    };
    let removed = if f.ifindex == 0 {
        ifb::remove_unrecorded(&f.name)
    } else {
        ifb::remove(&f.name, f.ifindex)
    }
    .map_err(|e| AttachError::Classifier {
        step: "removing the IFB",
        iface: f.name.clone(),
        detail: e.to_string(),
    });
    shaping.and(removed)
}

#[cfg(test)]
mod root_tests {
    use super::*;
    use crate::tc::{Attr, QdiscInfo, Snapshot, TC_H_ROOT, TCA_KIND, TcObject};

    fn snapshot_with_root(kind: &str, handle: u32) -> Snapshot {
        Snapshot {
            ifindex: 7,
            qdiscs: vec![TcObject {
                handle,
                parent: TC_H_ROOT,
                info: 0,
                attrs: vec![Attr::string(TCA_KIND, kind)],
            }],
            classes: Vec::new(),
            chains: Vec::new(),
            filters: Vec::new(),
            u32_roots: Vec::new(),
        }
    }

    fn root(kind: &str, handle: u32) -> QdiscInfo {
        QdiscInfo {
            kind: kind.to_owned(),
            handle,
            parent: TC_H_ROOT,
        }
    }

    #[test]
    fn a_partly_restored_root_is_ours_only_while_a_restore_is_under_way() {
        let snap = snapshot_with_root("htb", 0x0001_0000);
        let shaper = root("fq", tc::SHAPER_HANDLE);
        let htb = root("htb", 0x0001_0000);
        let default = root("noqueue", 0);
        let other = root("htb", 0x0002_0000);
        // The shaper's own root is always ours.
        assert!(root_is_ours(Some(&shaper), &snap, false));
        // Before a restore began, anything else is another tool's.
        for r in [&htb, &default, &other] {
            assert!(!root_is_ours(Some(r), &snap, false), "{r}");
        }
        // Once begun: the restore's own steps are ours, another root is not.
        assert!(root_is_ours(Some(&htb), &snap, true));
        assert!(root_is_ours(Some(&default), &snap, true));
        assert!(!root_is_ours(Some(&other), &snap, true));
        assert!(!root_is_ours(Some(&root("tbf", 0x0001_0000)), &snap, true));
        assert!(!root_is_ours(None, &snap, true));
    }
}
