//! Ingress (download) shaping: `shaper run --ingress-rate R2
//! [--ingress-mode police|ifb]`.
//!
//! `police` mode attaches the policer (`shaper_police`, see
//! `shaper_common::police`) at the interface's ingress hook: no queue, no
//! IFB, no sch_fq, so it also works on kernels without sch_fq. It is a
//! second copy of the BPF object with its own maps (flow table, fair share,
//! virtual link), so the egress pacer and the policer never share state.
//!
//! Attach, after the egress steps (`attach::attach`) if any, each step
//! recorded before it is taken:
//! 1. load the object and the policer, fill its configuration;
//! 2. record the ingress rate (creating the state record when there is no
//!    egress shaping);
//! 3. on kernels without TCX, ensure clsact (recorded when created);
//! 4. attach the policer at ingress (TCX link pinned, or a cls_bpf filter);
//! 5. pin its maps under `<pin dir>/ingress/`.
//!
//! `detach` (called by `attach::undo`, before clsact is removed) reverses
//! 4 and 5. Invariants: nothing here touches the root qdisc.
//! Non-goals: `ifb` mode is not built yet; it is refused as a usage error.

use std::{fs, path::PathBuf};

use aya::maps::PerCpuArray;
use aya::{
    Ebpf, EbpfLoader,
    maps::Map,
    programs::{SchedClassifier, TcAttachType},
};
use shaper_common::{POLICE_PROGRAM, counters::Counter, maps};
use tracing::{info, warn};

use crate::{
    attach::{
        AttachError, attach_classifier, clear_pins, detach_classifier, ensure_clsact, init_fair,
        kernel_has_tcx, pin_err, pins, undo, write_config,
    },
    bpf,
    config::RunConfig,
    link::Link,
    state::{IngressRecord, Paths, Record, ensure_bpffs},
};

/// How download traffic is shaped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum IngressMode {
    /// The AQM policer at the ingress hook: no queue, no IFB; flows above
    /// their fair share get CE marks or drops at CoDel's spacing.
    #[default]
    Police,
    /// Redirect to an IFB device with sch_fq and the fair pacer on it (not
    /// built yet).
    Ifb,
}

/// The policer's extra pin: its virtual link.
pub const PIN_POLICE_LINK: &str = "police_link";

/// Where the ingress program's pins live.
pub fn pin_dir(paths: &Paths) -> PathBuf {
    paths.pin_dir.join("ingress")
}

/// Loads the policer with `config`'s settings at its rate. Changes nothing
/// on any interface.
pub fn load(config: &RunConfig, has_l2_header: bool) -> Result<Ebpf, AttachError> {
    let mut pacer = config.pacer_config(has_l2_header);
    // No telemetry records from the policer (counters only).
    pacer.flags &= !shaper_common::config::FLAG_TELEMETRY;
    let object = bpf::object()?;
    let mut ebpf = EbpfLoader::new()
        .map_max_entries(maps::FLOWS, pacer.flow_sets_mask.saturating_add(1))
        .load(object)
        .map_err(|e| AttachError::Load {
            detail: format!("{e:#}"),
        })?;
    policer(&mut ebpf)?.load().map_err(|e| AttachError::Load {
        detail: format!("{POLICE_PROGRAM}: {e:#}"),
    })?;
    write_config(&mut ebpf, &pacer)?;
    init_fair(&mut ebpf)?;
    Ok(ebpf)
}

fn policer(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, AttachError> {
    ebpf.program_mut(POLICE_PROGRAM)
        .ok_or_else(|| AttachError::Load {
            detail: format!("the object has no program {POLICE_PROGRAM}"),
        })?
        .try_into()
        .map_err(|e| AttachError::Load {
            detail: format!("{POLICE_PROGRAM} is not a TC classifier: {e}"),
        })
}

/// Attaches the policer to `link` at `config.rate`. `record` is the egress
/// attachment's record, or `None` when only ingress is shaped. Returns the
/// loaded object (keep it for the counters) and the updated record. On
/// failure everything is undone, egress included, and the record removed.
pub fn attach(
    config: &RunConfig,
    link: &Link,
    paths: &Paths,
    record: Option<Record>,
) -> Result<(Ebpf, Record), AttachError> {
    let iface = link.name.as_str();
    let mut ebpf = load(config, link.has_l2_header)?;
    let mut record = match record {
        Some(r) => r,
        None => {
            if ensure_bpffs(&paths.bpffs)? {
                info!(path = %paths.bpffs.display(), "mounted bpffs");
            }
            Record {
                iface: iface.to_owned(),
                ifindex: link.ifindex,
                pid: std::process::id(),
                rate_bits_per_s: 0,
                attach: None,
                created_clsact: false,
                replaced_root: false,
                snapshot: Vec::new(),
                gso_before: None,
                ingress: None,
            }
        }
    };
    record.ingress = Some(IngressRecord {
        rate_bits_per_s: config.rate.bits_per_s(),
        attach: None,
    });
    record.store(&paths.record)?;
    match attach_steps(&mut ebpf, link, paths, &mut record) {
        Ok(()) => Ok((ebpf, record)),
        Err(e) => {
            warn!(iface, error = %e, "ingress attach failed; undoing what was done");
            drop(ebpf);
            if let Err(undo_err) = undo(&record, paths) {
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
) -> Result<(), AttachError> {
    if !kernel_has_tcx() {
        ensure_clsact(link, paths, record)?;
    }
    let dir = pin_dir(paths);
    fs::create_dir_all(&dir).map_err(|e| pin_err("create", &dir, e))?;
    clear_pins(&dir);
    let link_pin = dir.join(pins::LINK);
    attach_classifier(
        policer(ebpf)?,
        link,
        TcAttachType::Ingress,
        &link_pin,
        |mode| {
            if let Some(i) = record.ingress.as_mut() {
                i.attach = Some(mode);
            }
            record.store(&paths.record).map_err(AttachError::from)
        },
    )?;
    for (name, file) in [
        (maps::CONFIG, pins::CONFIG),
        (maps::COUNTERS, pins::COUNTERS),
        (maps::FAIR, pins::FAIR),
        (maps::FLOWS, pins::FLOWS),
        (maps::POLICE_LINK, PIN_POLICE_LINK),
    ] {
        let path = dir.join(file);
        let map: &Map = ebpf
            .map(name)
            .ok_or_else(|| pin_err("find map for", &path, name))?;
        map.pin(&path).map_err(|e| pin_err("pin", &path, e))?;
    }
    info!(
        iface = %link.name,
        mode = if kernel_has_tcx() { "tcx" } else { "tc clsact" },
        pins = %dir.display(),
        "policer attached at ingress"
    );
    Ok(())
}

/// Detaches the ingress program `ingress` names and removes its pins.
/// Anything already gone is fine.
pub fn detach(
    record: &Record,
    ingress: &IngressRecord,
    paths: &Paths,
    present: bool,
) -> Result<(), AttachError> {
    let dir = pin_dir(paths);
    let detached = detach_classifier(
        &record.iface,
        TcAttachType::Ingress,
        ingress.attach,
        &dir.join(pins::LINK),
        present,
    );
    clear_pins(&dir);
    let _ = fs::remove_dir(&dir);
    detached
}

/// The policer's counters, summed over the CPUs.
pub fn counters(ebpf: &Ebpf) -> Result<Vec<(Counter, u64)>, AttachError> {
    let map = ebpf.map(maps::COUNTERS).ok_or_else(|| AttachError::Load {
        detail: format!("the object has no map {}", maps::COUNTERS),
    })?;
    let array: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(|e| AttachError::Load {
        detail: format!("{}: {e}", maps::COUNTERS),
    })?;
    Ok(crate::status::sum_counters(&array))
}

fn get(counts: &[(Counter, u64)], c: Counter) -> u64 {
    counts.iter().find(|(k, _)| *k == c).map_or(0, |(_, n)| *n)
}

/// One line on what the policer did.
pub fn summary(counts: &[(Counter, u64)]) -> String {
    format!(
        "shaper: ingress police: {} packets, {} CE-marked, {} dropped, {} signals withheld by \
         the one-in-four cap, {} clocks pulled back to the horizon",
        get(counts, Counter::Packets),
        get(counts, Counter::CeMarked),
        get(counts, Counter::PoliceDrop),
        get(counts, Counter::PoliceWithheld),
        get(counts, Counter::PoliceClamped),
    )
}

/// The policer's counters as one JSON object, `{"ingress_counters": {..}}`.
pub fn summary_json(counts: &[(Counter, u64)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = counts
        .iter()
        .map(|(c, n)| (c.name().to_owned(), serde_json::Value::from(*n)))
        .collect();
    serde_json::json!({ "ingress_counters": map }).to_string()
}
