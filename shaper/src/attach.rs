//! Attaching the shaper to an interface and undoing it exactly.
//!
//! Attach, in order; nothing before step 4 changes the system, and every step
//! from 4 on is recorded before it is taken, so `crate::undo` (on SIGINT/SIGTERM, on
//! a failed step, or from `shaper cleanup` after SIGKILL) knows what to undo:
//! 1. snapshot the root qdisc tree (refusing one that cannot be restored);
//! 2. load the BPF object and have the verifier accept the classifier
//!    (or take the object [`preload`] loaded, while the run loaded its
//!    ingress objects on another thread);
//! 3. fill its configuration map;
//! 4. write the state record (see `state`);
//! 5. install sch_fq as root (mq with fq leaves on multiqueue devices);
//! 6. attach the egress classifier: a TCX link pinned in bpffs on kernels
//!    with TCX (>= 6.6), else a cls_bpf filter on clsact (created if absent);
//! 7. pin the maps so `shaper status` can read them from another process,
//!    and under `--nat` the run's map of LAN hosts, unless another object
//!    of the run pinned it first (then this object was loaded with it).
//!
//! The undo reverses 7..5 and removes the record, tolerating any part already
//! gone (a vanished bpffs, a deleted interface, a dead process).
//!
//! Non-goals: sharing an interface with another egress shaper; this one owns
//! the root qdisc while it runs.

use std::{fs, path::Path};

use aya::{
    Ebpf,
    maps::{Array, Map},
    programs::TcAttachType,
};
use shaper_common::{
    EGRESS_HOSTS_NAT_PROGRAM, EGRESS_HOSTS_PROGRAM, EGRESS_PROGRAM,
    config::{FLAG_NAT, PacerConfig},
    fair::FairState,
    hosts::Isolation,
    maps,
    tins::{Diffserv, MAX_TINS, TinState},
};
use tracing::{info, warn};

use crate::{
    bpf,
    checks::CheckError,
    checks::kernel_has_tcx,
    config::RunConfig,
    gso,
    hook::{AttachError, attach_classifier, ensure_clsact, pin_err, tc_err},
    link::Link,
    pins,
    state::{AttachMode, Paths, Record, ensure_bpffs},
    tc,
    undo::undo,
};

/// A shaped interface, owned by the `shaper run` process.
pub struct Shaped {
    /// What was done, as recorded.
    pub record: Record,
    /// Where pins and the record are.
    pub paths: Paths,
    /// The loaded object; keeps the maps open for telemetry.
    pub ebpf: Ebpf,
}

/// Loads the classifier and fills its configuration; the flow table gets
/// `config.flow_sets_mask + 1` sets. Changes nothing on any interface.
pub fn load(config: &PacerConfig) -> Result<Ebpf, AttachError> {
    load_sharing(config, None)
}

/// As [`load`], with the map of LAN hosts of a `--nat` run taken from its
/// pin at `nat_map` when given ([`crate::nat`]).
pub fn load_sharing(config: &PacerConfig, nat_map: Option<&Path>) -> Result<Ebpf, AttachError> {
    let shared: Vec<(&str, &Path)> = nat_map.map(|p| (maps::NAT, p)).into_iter().collect();
    let mut ebpf = bpf::load::open_sharing(config.flow_sets_mask.saturating_add(1), &[], &shared)?;
    bpf::load::load_classifier(&mut ebpf, egress_program(config))?;
    bpf::load::load_telemetry(&mut ebpf)?;
    bpf::load::set_entry0(&mut ebpf, maps::CONFIG, *config)?;
    // Every tin's fair share starts at a multiplier of 1.0.
    bpf::load::set_entries(&mut ebpf, maps::FAIR, MAX_TINS as u32, FairState::default())?;
    let mode = Diffserv::from_index(config.diffserv);
    bpf::load::set_entry0(&mut ebpf, maps::TINS, TinState::new(mode))?;
    Ok(ebpf)
}

/// An object loaded ahead of [`attach`], on another thread while the run
/// loads its other objects: the verifier's time is the most of a start on
/// a slow CPU, and each object's is its own.
pub struct Loaded {
    /// The link kind it was loaded for.
    has_l2_header: bool,
    /// The configuration written into it.
    pacer: PacerConfig,
    ebpf: Ebpf,
}

/// Loads the object [`attach`] would load for `config` on a link with (or
/// without) a link header. `None` for a `--nat` run, whose objects share
/// one map of LAN hosts that the first attach pins: those load in turn.
/// Changes nothing on any interface.
pub fn preload(config: &RunConfig, has_l2_header: bool) -> Option<Result<Loaded, AttachError>> {
    if config.nat_map.is_some() {
        return None;
    }
    let pacer = config.pacer_config(has_l2_header);
    Some(load(&pacer).map(|ebpf| Loaded {
        has_l2_header,
        pacer,
        ebpf,
    }))
}

/// The egress program for `config`: the pacer over hosts under host
/// isolation (with the NAT lookup under `--nat`), else the flow pacer
/// (which carries no host lookups).
pub fn egress_program(config: &PacerConfig) -> &'static str {
    match (
        config.fair() && config.isolation() != Isolation::Flows,
        config.flags & FLAG_NAT != 0,
    ) {
        (true, true) => EGRESS_HOSTS_NAT_PROGRAM,
        (true, false) => EGRESS_HOSTS_PROGRAM,
        (false, _) => EGRESS_PROGRAM,
    }
}

/// Attaches to `link` as `config` says, with the object `loaded` when it
/// was loaded for this link's kind, else with one loaded here. On failure
/// after the first change, undoes what was done before returning the
/// error.
pub fn attach(
    config: &RunConfig,
    link: &Link,
    paths: Paths,
    loaded: Option<Loaded>,
) -> Result<Shaped, AttachError> {
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
    // A `--nat` run's map of LAN hosts: the one another object of the run
    // pinned, or else this object's, pinned in step 7.
    let nat_map = config.nat_map.as_deref();
    let (shared_nat, pin_nat) = match nat_map {
        Some(p) if p.exists() => (Some(p), None),
        other => (None, other),
    };
    let (pacer, mut ebpf) = match loaded {
        Some(l) if l.has_l2_header == link.has_l2_header => (l.pacer, l.ebpf),
        _ => {
            let pacer = config.pacer_config(link.has_l2_header);
            (pacer, load_sharing(&pacer, shared_nat)?)
        }
    };
    let program = egress_program(&pacer);

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
        &Steps {
            fq: config.fq_params(),
            gso_cap,
            program,
            pin_nat,
        },
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

/// What [`attach_steps`] installs besides the link's own settings.
struct Steps<'a> {
    /// sch_fq's settings.
    fq: tc::FqParams,
    /// The GSO size for local senders ([`crate::gso`]).
    gso_cap: u32,
    /// The classifier.
    program: &'a str,
    /// Where to pin the map of LAN hosts, when this object's is the run's.
    pin_nat: Option<&'a Path>,
}

fn attach_steps(
    ebpf: &mut Ebpf,
    link: &Link,
    paths: &Paths,
    record: &mut Record,
    steps: &Steps<'_>,
) -> Result<(), AttachError> {
    let Steps {
        ref fq,
        gso_cap,
        program: program_name,
        pin_nat,
    } = *steps;
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
    pins::clear(&paths.pin_dir);
    if !kernel_has_tcx() {
        ensure_clsact(link, paths, record)?;
    }
    let program = bpf::load::classifier(ebpf, program_name)?;
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
        (maps::TINS, pins::TINS),
        (maps::TIN_COUNTERS, pins::TIN_COUNTERS),
    ] {
        let path = paths.pin_dir.join(file);
        let map: &Map = ebpf
            .map(name)
            .ok_or_else(|| pin_err("find map for", &path, name))?;
        map.pin(&path).map_err(|e| pin_err("pin", &path, e))?;
    }
    if let Some(path) = pin_nat {
        pin_nat_map(ebpf, path)?;
    }
    info!(
        iface,
        mode = if record.attach == Some(AttachMode::Tcx) { "tcx" } else { "tc clsact" },
        pins = %paths.pin_dir.display(),
        "attached"
    );
    Ok(())
}

/// Pins the map of LAN hosts of `ebpf` at `path`, for the run's first
/// object that loads it (`crate::nat` removes the pin with the NAT
/// directory).
pub(crate) fn pin_nat_map(ebpf: &Ebpf, path: &Path) -> Result<(), AttachError> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| pin_err("create", dir, e))?;
    }
    let map: &Map = ebpf
        .map(maps::NAT)
        .ok_or_else(|| pin_err("find map for", path, maps::NAT))?;
    map.pin(path).map_err(|e| pin_err("pin", path, e))
}

/// Changes the rate in the pinned configuration of a running pacer, and in
/// its record. Returns the old rate in bytes/s. Fails with
/// [`AttachError::NotShaped`] when the interface has no visible pins.
pub fn set_rate(iface: &str, paths: &Paths, rate: crate::rate::Rate) -> Result<u64, AttachError> {
    let old = write_rate(iface, &paths.pin_dir.join(pins::CONFIG), rate)?;
    if let Some(mut record) = Record::load(&paths.record)? {
        record.rate_bits_per_s = rate.bits_per_s();
        record.store(&paths.record)?;
    }
    Ok(old)
}

/// Changes the download's rate of a running shaper: the IFB pacer's (its
/// pins and record, as [`set_rate`]) in `ifb` mode, the policer's pinned
/// configuration in `police` mode, and the ingress rate in the
/// interface's record. Returns the old rate in bytes/s. Fails with
/// [`AttachError::NotShaped`] without a record and with
/// [`AttachError::NoIngress`] when the run shapes no download.
pub fn set_ingress_rate(
    iface: &str,
    paths: &Paths,
    rate: crate::rate::Rate,
) -> Result<u64, AttachError> {
    let not_shaped = || AttachError::NotShaped {
        iface: iface.to_owned(),
    };
    let mut record = Record::load(&paths.record)?.ok_or_else(not_shaped)?;
    let Some(ingress) = record.ingress.as_mut() else {
        return Err(AttachError::NoIngress {
            iface: iface.to_owned(),
        });
    };
    let old = match &ingress.ifb {
        Some(f) => set_rate(&f.name, &paths.sibling(&f.name), rate)?,
        None => write_rate(iface, &pins::ingress_dir(paths).join(pins::CONFIG), rate)?,
    };
    ingress.rate_bits_per_s = rate.bits_per_s();
    record.store(&paths.record)?;
    Ok(old)
}

/// Writes `rate` into the pinned configuration at `path`; returns the old
/// rate in bytes/s.
fn write_rate(
    iface: &str,
    path: &std::path::Path,
    rate: crate::rate::Rate,
) -> Result<u64, AttachError> {
    let map = pins::open(path)?.ok_or_else(|| AttachError::NotShaped {
        iface: iface.to_owned(),
    })?;
    let mut array: Array<_, PacerConfig> =
        Array::try_from(map).map_err(|e| pin_err("use", path, e))?;
    let mut config = array.get(&0, 0).map_err(|e| pin_err("read", path, e))?;
    let old = config.rate_bytes_per_s;
    let scaled = rate.scaled();
    config.rate_bytes_per_s = rate.bytes_per_s();
    config.ns_per_byte_scaled = scaled.ns_per_byte_scaled;
    config.rate_shift = scaled.shift;
    config.generation = config.generation.wrapping_add(1);
    // One map update: the classifier sees the old or the new value whole.
    array
        .set(0, config, 0)
        .map_err(|e| pin_err("write", path, e))?;
    Ok(old)
}
