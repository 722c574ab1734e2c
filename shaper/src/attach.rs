//! Attaching the shaper to an interface and undoing it exactly.
//!
//! Attach, in order; nothing before step 4 changes the system, and every step
//! from 4 on is recorded before it is taken, so `undo` (on SIGINT/SIGTERM, on
//! a failed step, or from `shaper cleanup` after SIGKILL) knows what to undo:
//! 1. snapshot the root qdisc tree (refusing one that cannot be restored);
//! 2. load the BPF object and have the verifier accept the classifier;
//! 3. fill its configuration map;
//! 4. write the state record (see `state`);
//! 5. install sch_fq as root (mq with fq leaves on multiqueue devices);
//! 6. attach the egress classifier: a TCX link pinned in bpffs on kernels
//!    with TCX (>= 6.6), else a cls_bpf filter on clsact (created if absent);
//! 7. pin the maps so `shaper status` can read them from another process.
//!
//! `undo` reverses 7..5 and removes the record, tolerating any part already
//! gone (a vanished bpffs, a deleted interface, a dead process).
//!
//! Non-goals: sharing an interface with another egress shaper; this one owns
//! the root qdisc while it runs.

use std::{fs, io, path::Path};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, Map, MapError},
    programs::{
        ProgramError, SchedClassifier, TcAttachType,
        links::{FdLink, Link as _, LinkError, PinnedLink},
        tc::{NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle},
    },
    sys::SyscallError,
    util::KernelVersion,
};
use shaper_common::{EGRESS_PROGRAM, config::PacerConfig, fair::FairState, maps};
use tracing::{info, warn};

use crate::{
    bpf,
    checks::CheckError,
    config::RunConfig,
    gso,
    link::{Link, link_by_name},
    state::{AttachMode, Paths, Record, ensure_bpffs, remove_record},
    tc,
};

/// File names of the pinned objects inside the pin directory.
pub mod pins {
    /// The pacer's configuration map.
    pub const CONFIG: &str = "config";
    /// The per-CPU counters map.
    pub const COUNTERS: &str = "counters";
    /// The aggregate clock map.
    pub const AGGREGATE: &str = "aggregate";
    /// The fair pacer's shared state.
    pub const FAIR: &str = "fair";
    /// The flow table.
    pub const FLOWS: &str = "flows";
    /// The TCX link.
    pub const LINK: &str = "link";
}

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

/// A shaped interface, owned by the `shaper run` process.
pub struct Shaped {
    /// What was done, as recorded.
    pub record: Record,
    /// Where pins and the record are.
    pub paths: Paths,
    /// The loaded object; keeps the maps open for telemetry.
    pub ebpf: Ebpf,
}

/// True when the kernel has TCX (Linux 6.6, commit e420bed02507).
pub fn kernel_has_tcx() -> bool {
    KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0))
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

/// Loads the classifier and fills its configuration; the flow table gets
/// `config.flow_sets_mask + 1` sets. Changes nothing on any interface.
pub fn load(config: &PacerConfig) -> Result<Ebpf, AttachError> {
    let object = bpf::object()?;
    let mut ebpf = EbpfLoader::new()
        .map_max_entries(maps::FLOWS, config.flow_sets_mask.saturating_add(1))
        .load(object)
        .map_err(|e| AttachError::Load {
            detail: format!("{e:#}"),
        })?;
    classifier(&mut ebpf)?
        .load()
        .map_err(|e| AttachError::Load {
            detail: format!("{e:#}"),
        })?;
    load_telemetry(&mut ebpf)?;
    write_config(&mut ebpf, config)?;
    init_fair(&mut ebpf)?;
    Ok(ebpf)
}

/// Loads the telemetry program and puts it in the classifier's jump slot
/// (the classifier tail-calls it when a record is due).
pub fn load_telemetry(ebpf: &mut Ebpf) -> Result<(), AttachError> {
    let err = |detail: String| AttachError::Load { detail };
    let prog: &mut SchedClassifier = ebpf
        .program_mut(shaper_common::TELEMETRY_PROGRAM)
        .ok_or_else(|| {
            err(format!(
                "the object has no program {}",
                shaper_common::TELEMETRY_PROGRAM
            ))
        })?
        .try_into()
        .map_err(|e| err(format!("{}: {e}", shaper_common::TELEMETRY_PROGRAM)))?;
    prog.load()
        .map_err(|e| err(format!("{}: {e:#}", shaper_common::TELEMETRY_PROGRAM)))?;
    let fd = prog
        .fd()
        .map_err(|e| err(format!("{}: {e}", shaper_common::TELEMETRY_PROGRAM)))?
        .try_clone()
        .map_err(|e| err(format!("{}: {e}", shaper_common::TELEMETRY_PROGRAM)))?;
    let map = ebpf
        .map_mut(maps::JUMP)
        .ok_or_else(|| err(format!("the object has no map {}", maps::JUMP)))?;
    let mut jump =
        aya::maps::ProgramArray::try_from(map).map_err(|e| err(format!("{}: {e}", maps::JUMP)))?;
    jump.set(shaper_common::JUMP_TELEMETRY, &fd, 0)
        .map_err(|e| err(format!("filling {}: {e}", maps::JUMP)))
}

/// Starts the fair pacer's shared state at a multiplier of 1.0.
pub(crate) fn init_fair(ebpf: &mut Ebpf) -> Result<(), AttachError> {
    set_entry0(ebpf, maps::FAIR, FairState::default())
}

/// Writes entry 0 of the one-entry array map `name` in the loaded object.
pub(crate) fn set_entry0<T: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &str,
    value: T,
) -> Result<(), AttachError> {
    let map = ebpf.map_mut(name).ok_or_else(|| AttachError::Load {
        detail: format!("the object has no map {name}"),
    })?;
    let mut array: Array<_, T> = Array::try_from(map).map_err(|e| AttachError::Load {
        detail: format!("{name}: {e}"),
    })?;
    array.set(0, value, 0).map_err(|e| AttachError::Load {
        detail: format!("writing {name}: {e}"),
    })
}

/// The egress classifier in the loaded object.
fn classifier(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, AttachError> {
    classifier_named(ebpf, EGRESS_PROGRAM)
}

/// The TC classifier `name` in the loaded object.
pub(crate) fn classifier_named<'a>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Result<&'a mut SchedClassifier, AttachError> {
    ebpf.program_mut(name)
        .ok_or_else(|| AttachError::Load {
            detail: format!("the object has no program {name}"),
        })?
        .try_into()
        .map_err(|e| AttachError::Load {
            detail: format!("{name} is not a TC classifier: {e}"),
        })
}

pub(crate) fn write_config(ebpf: &mut Ebpf, config: &PacerConfig) -> Result<(), AttachError> {
    set_entry0(ebpf, maps::CONFIG, *config)
}

/// Attaches to `link` as `config` says. On failure after the first change,
/// undoes what was done before returning the error.
pub fn attach(config: &RunConfig, link: &Link, paths: Paths) -> Result<Shaped, AttachError> {
    let iface = link.name.as_str();
    // 1. Snapshot. An unrestorable tree is the user's to fix: a check error.
    let snapshot = tc::snapshot(link.ifindex).map_err(|e| match e {
        tc::TcError::Unrestorable { reason, .. } => AttachError::Check(CheckError::Unrestorable {
            iface: iface.to_owned(),
            reason,
        }),
        other => AttachError::Tc {
            step: "reading the qdisc tree",
            iface: iface.to_owned(),
            source: other,
        },
    })?;
    info!(iface, saved = %snapshot.describe(), "saved the current qdiscs");
    // 2-3. Load and configure.
    let mut ebpf = load(&config.pacer_config(link.has_l2_header))?;

    // 4. From here on the system changes: record first.
    if ensure_bpffs(&paths.bpffs)? {
        info!(path = %paths.bpffs.display(), "mounted bpffs");
    }
    let mut record = Record {
        rate_bits_per_s: config.rate.bits_per_s(),
        snapshot: snapshot.encode(),
        ..Record::fresh(link)
    };
    record.store(&paths.record)?;

    let gso_cap = gso::cap_bytes(config.rate.bytes_per_s(), link.mtu_bytes);
    match attach_steps(
        &mut ebpf,
        link,
        &paths,
        &mut record,
        &config.fq_params(),
        gso_cap,
    ) {
        Ok(()) => Ok(Shaped {
            record,
            paths,
            ebpf,
        }),
        Err(e) => {
            warn!(iface, error = %e, "attach failed; undoing what was done");
            drop(ebpf);
            if let Err(undo_err) = undo(&record, &paths) {
                warn!(iface, error = %undo_err, "undo after a failed attach also failed");
            }
            Err(e)
        }
    }
}

fn attach_steps(
    ebpf: &mut Ebpf,
    link: &Link,
    paths: &Paths,
    record: &mut Record,
    fq: &tc::FqParams,
    gso_cap: u32,
) -> Result<(), AttachError> {
    let iface = link.name.as_str();
    // 4b. Local senders' GSO size ([`crate::gso`]). Recorded first; restoring
    // sizes that were never changed is harmless.
    if let Some((before, next)) = link
        .gso
        .and_then(|now| gso::capped(now, gso_cap).map(|next| (now, next)))
    {
        record.gso_before = Some(before);
        record.store(&paths.record)?;
        match gso::set(link.ifindex, next) {
            Ok(()) => info!(
                iface,
                from = before.max_bytes,
                to = next.max_bytes,
                "lowered the GSO size for local senders"
            ),
            // Not fatal: only local TSO senders pace worse without it.
            Err(e) => {
                warn!(iface, error = %format!("{e:#}"), "could not lower the GSO size; local TSO senders may exceed their share in lumps");
                record.gso_before = None;
                record.store(&paths.record)?;
            }
        }
    }
    // 5. sch_fq as root. Record first: a crash between the two leaves a
    // record that says "maybe replaced", and restore is idempotent.
    record.replaced_root = true;
    record.store(&paths.record)?;
    tc::install_fq_root(link.ifindex, link.tx_queues, fq)
        .map_err(tc_err("installing sch_fq as root", iface))?;

    // 6. The classifier.
    fs::create_dir_all(&paths.pin_dir).map_err(|e| pin_err("create", &paths.pin_dir, e))?;
    clear_pins(&paths.pin_dir);
    if !kernel_has_tcx() {
        ensure_clsact(link, paths, record)?;
    }
    let program = classifier(ebpf)?;
    let link_pin = paths.pin_dir.join(pins::LINK);
    attach_classifier(program, link, TcAttachType::Egress, &link_pin, |mode| {
        record.attach = Some(mode);
        record.store(&paths.record).map_err(AttachError::from)
    })?;

    // 7. Pin the maps.
    for (name, file) in [
        (maps::CONFIG, pins::CONFIG),
        (maps::COUNTERS, pins::COUNTERS),
        (maps::AGGREGATE, pins::AGGREGATE),
        (maps::FAIR, pins::FAIR),
        (maps::FLOWS, pins::FLOWS),
    ] {
        let path = paths.pin_dir.join(file);
        let map: &Map = ebpf
            .map(name)
            .ok_or_else(|| pin_err("find map for", &path, name))?;
        map.pin(&path).map_err(|e| pin_err("pin", &path, e))?;
    }
    info!(
        iface,
        mode = if record.attach == Some(AttachMode::Tcx) { "tcx" } else { "tc clsact" },
        pins = %paths.pin_dir.display(),
        "attached"
    );
    Ok(())
}

/// Creates the clsact qdisc on `link` unless it has one, recording first
/// that the shaper made it (so `undo` removes it).
pub(crate) fn ensure_clsact(
    link: &Link,
    paths: &Paths,
    record: &mut Record,
) -> Result<(), AttachError> {
    let iface = link.name.as_str();
    if record.created_clsact
        || tc::has_clsact(link.ifindex).map_err(tc_err("looking for clsact", iface))?
    {
        return Ok(());
    }
    record.created_clsact = true;
    record.store(&paths.record)?;
    tc::add_clsact(link.ifindex).map_err(tc_err("adding the clsact qdisc", iface))
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
fn clsact_gone(iface: &str) -> bool {
    crate::link::link_by_name(iface)
        .ok()
        .and_then(|l| tc::has_clsact(l.ifindex).ok())
        .is_some_and(|has| !has)
}

/// Removes every pin in `dir` (not the directory); missing is fine.
pub(crate) fn clear_pins(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let _ = fs::remove_file(e.path());
        }
    }
}

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
        keep(crate::ingress::detach(record, ingress, paths, present));
    }
    if record.created_clsact && present && !clsact_gone(iface) {
        keep(tc::delete_clsact(record.ifindex).map_err(tc_err("removing the clsact qdisc", iface)));
    }

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
    clear_pins(&paths.pin_dir);
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

/// Changes the rate in the pinned configuration of a running pacer, and in
/// its record. Returns the old rate in bytes/s. Fails with
/// [`AttachError::NotShaped`] when the interface has no visible pins.
pub fn set_rate(iface: &str, paths: &Paths, rate: crate::rate::Rate) -> Result<u64, AttachError> {
    let path = paths.pin_dir.join(pins::CONFIG);
    let map = open_pinned(&path)?.ok_or_else(|| AttachError::NotShaped {
        iface: iface.to_owned(),
    })?;
    let mut array: Array<_, PacerConfig> =
        Array::try_from(map).map_err(|e| pin_err("use", &path, e))?;
    let mut config = array.get(&0, 0).map_err(|e| pin_err("read", &path, e))?;
    let old = config.rate_bytes_per_s;
    let scaled = rate.scaled();
    config.rate_bytes_per_s = rate.bytes_per_s();
    config.ns_per_byte_scaled = scaled.ns_per_byte_scaled;
    config.rate_shift = scaled.shift;
    config.generation = config.generation.wrapping_add(1);
    // One map update: the classifier sees the old or the new value whole.
    array
        .set(0, config, 0)
        .map_err(|e| pin_err("write", &path, e))?;
    if let Some(mut record) = Record::load(&paths.record)? {
        record.rate_bits_per_s = rate.bits_per_s();
        record.store(&paths.record)?;
    }
    Ok(old)
}

/// Opens a pinned map; `None` when the pin is not visible.
pub fn open_pinned(path: &Path) -> Result<Option<Map>, AttachError> {
    match aya::maps::MapData::from_pin(path) {
        Ok(data) => Map::from_map_data(data)
            .map(Some)
            .map_err(|e| pin_err("open", path, e)),
        Err(MapError::SyscallError(SyscallError { io_error, .. }))
            if io_error.kind() == io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        Err(e) => Err(pin_err("open", path, e)),
    }
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
