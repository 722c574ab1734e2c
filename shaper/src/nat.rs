//! `--nat`, the LAN side: host isolation by the LAN address through the
//! router's masquerading (`shaper_common::nat` has the method). A
//! classifier (`shaper_nat_lan`) at the ingress of each `--lan` interface
//! records each connection's LAN host in the run's map of LAN hosts, which
//! the pacers over hosts of the run (the WAN's egress, the IFB's) read.
//!
//! The map is pinned in the run's NAT directory ([`pins::nat_dir`]) by the
//! first object of the run that loads it (`crate::attach`), and every later
//! object loads with it, so one map serves the run. Why this route and not
//! conntrack from BPF: it needs no BTF, no kfunc and no conntrack module,
//! so it runs on every kernel the pacer runs on; the price is the `--lan`
//! flag and the limits `shaper_common::nat` names.
//!
//! Attach, after the WAN's egress and ingress (each step recorded in the
//! WAN's state record before it is taken, so `crate::undo` and `shaper
//! cleanup` find it): per LAN, record it, ensure clsact on kernels without
//! TCX (recorded when created), attach the classifier at its ingress (a
//! TCX link pinned in the NAT directory, or a cls_bpf filter). [`detach`]
//! undoes that and removes the NAT directory, the map's pin with it.
//!
//! Invariants: nothing here touches a LAN's qdiscs but a clsact the shaper
//! created, and the classifier never changes a packet or its verdict.
//! Non-goals: finding the LAN interfaces by itself (the operator names
//! them); IPv6.

use std::fs;

use aya::{Ebpf, programs::TcAttachType};
use shaper_common::{
    NAT_LAN_PROGRAM,
    config::{FLAG_NO_L2, PacerConfig},
    maps,
    rate::ScaledRate,
};
use tracing::info;

use crate::{
    bpf,
    checks::{CheckError, kernel_has_tcx},
    hook::{
        AttachError, attach_classifier, detach_classifier, ensure_clsact_noting, pin_err,
        remove_created_clsact,
    },
    link::{Link, LinkError, link_by_name},
    pins,
    state::{LanRecord, Paths, Record},
};

/// Looks up the `--lan` interfaces before anything changes: each must
/// exist, be named once, and not be the shaped interface `wan`.
pub fn check_lans(names: &[String], wan: &str) -> Result<Vec<Link>, LanCheckError> {
    let mut links: Vec<Link> = Vec::with_capacity(names.len());
    for name in names {
        if name == wan {
            return Err(CheckError::LanIsShaped { lan: name.clone() }.into());
        }
        if links.iter().any(|l| &l.name == name) {
            return Err(CheckError::LanTwice { lan: name.clone() }.into());
        }
        links.push(link_by_name(name)?);
    }
    Ok(links)
}

/// Why the `--lan` interfaces were refused; both are usage errors.
#[derive(Debug, thiserror::Error)]
pub enum LanCheckError {
    /// Named wrongly.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// Not there.
    #[error(transparent)]
    Link(#[from] LinkError),
}

/// Attaches the LAN classifier to every link in `lans`, recording each
/// step in `record` (stored at `paths.record`) first. Returns the loaded
/// objects, which stay loaded while the run lasts. On failure the caller
/// undoes `record`, which names what was done.
pub fn attach(lans: &[Link], paths: &Paths, record: &mut Record) -> Result<Vec<Ebpf>, AttachError> {
    let map = pins::nat_map(paths);
    let dir = pins::nat_dir(paths);
    fs::create_dir_all(&dir).map_err(|e| pin_err("create", &dir, e))?;
    let mut objects = Vec::with_capacity(lans.len());
    for lan in lans {
        let mut ebpf = bpf::load::open_sharing(1, &[], &[(maps::NAT, &map)])?;
        let mut config = PacerConfig::new(
            0,
            ScaledRate {
                ns_per_byte_scaled: 0,
                shift: 0,
            },
        );
        config.flags = if lan.has_l2_header { 0 } else { FLAG_NO_L2 };
        bpf::load::set_entry0(&mut ebpf, maps::CONFIG, config)?;
        bpf::load::load_classifier(&mut ebpf, NAT_LAN_PROGRAM)?;

        let at = record.lans.len();
        record.lans.push(LanRecord {
            name: lan.name.clone(),
            ifindex: lan.ifindex,
            created_clsact: false,
            attach: None,
        });
        record.store(&paths.record)?;
        if !kernel_has_tcx() {
            ensure_clsact_noting(lan, || {
                record.lans[at].created_clsact = true;
                record.store(&paths.record).map_err(AttachError::from)
            })?;
        }
        let program = bpf::load::classifier(&mut ebpf, NAT_LAN_PROGRAM)?;
        attach_classifier(
            program,
            lan,
            TcAttachType::Ingress,
            &pins::lan_link(paths, &lan.name),
            |mode| {
                record.lans[at].attach = Some(mode);
                record.store(&paths.record).map_err(AttachError::from)
            },
        )?;
        info!(lan = %lan.name, "recording the LAN hosts of masqueraded connections");
        objects.push(ebpf);
    }
    Ok(objects)
}

/// Detaches the LAN classifiers `record` names and removes the ones'
/// clsact the shaper created, then the NAT directory with the map's pin.
/// Tolerates what is already gone; every LAN is tried, and the first error
/// is returned.
pub fn detach(record: &Record, paths: &Paths) -> Result<(), AttachError> {
    let mut first = Ok(());
    for lan in &record.lans {
        // A deleted (or deleted and recreated) LAN took its hooks along.
        let present = link_by_name(&lan.name).is_ok_and(|l| l.ifindex == lan.ifindex);
        let detached = detach_classifier(
            &lan.name,
            TcAttachType::Ingress,
            lan.attach,
            &pins::lan_link(paths, &lan.name),
            present,
        );
        let clsact = remove_created_clsact(&lan.name, lan.ifindex, lan.created_clsact, present);
        if first.is_ok() {
            first = detached.and(clsact);
        }
    }
    let dir = pins::nat_dir(paths);
    pins::clear(&dir);
    let _ = fs::remove_dir(&dir);
    first
}
