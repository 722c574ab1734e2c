//! Ingress (download) shaping: `shaper run --ingress-rate R2
//! [--ingress-mode police|ifb]`.
//!
//! `police` mode attaches the policer (`shaper_police`, see
//! `shaper_common::police`) at the interface's ingress hook: no queue, no
//! IFB, no sch_fq, so it also works on kernels without sch_fq. It is a
//! second copy of the BPF object with its own maps (flow table, fair share,
//! virtual link), so the egress pacer and the policer never share state.
//!
//! `ifb` mode creates the IFB `ifb4<iface>` ([`crate::ifb`]), shapes its
//! egress exactly as `shaper run` shapes an interface (sch_fq as root and
//! the fair pacer, through `attach::attach`, with a state record and pins
//! of the IFB's own) with `FLAG_DELIVERY_MONO` set, and attaches
//! `shaper_redirect` at the interface's ingress to send every packet there.
//!
//! Attach, after the egress steps (`attach::attach`) if any, each step
//! recorded before it is taken:
//! 1. load the object and the ingress program, fill its configuration
//!    (or take what [`preload`] loaded before the egress steps, the IFB's
//!    pacer included);
//! 2. record the ingress rate and mode (creating the state record when
//!    there is no egress shaping), and in `ifb` mode the IFB's name;
//! 3. `ifb` mode: create the IFB (its ifindex recorded), then shape it;
//! 4. on kernels without TCX, ensure clsact (recorded when created);
//! 5. attach the ingress program (TCX link pinned, or a cls_bpf filter);
//!    in `ifb` mode without TCX, a matchall filter with a mirred redirect
//!    to the IFB instead (`bpf_redirect` cannot feed an IFB there, see
//!    `tc::mirred`), and stop;
//! 6. pin its maps under `<pin dir>/ingress/`.
//!
//! `crate::undo` reverses 6 to 3 before it removes clsact: the redirect
//! goes first, so no packet is sent to an IFB that is being dismantled.
//! Invariants: nothing here touches the interface's root
//! qdisc. Non-goals: telemetry records from the ingress programs (counters
//! only).

use std::{fs, path::Path};

use aya::{
    Ebpf,
    maps::{Map, PerCpuArray},
    programs::TcAttachType,
};
use shaper_common::{
    POLICE_HOSTS_NAT_PROGRAM, POLICE_HOSTS_PROGRAM, POLICE_PROGRAM, REDIRECT_PROGRAM,
    config::{FLAG_NAT, PacerConfig},
    counters::Counter,
    fair::FairState,
    hosts::Isolation,
    maps,
};
use tracing::{info, warn};

use crate::{
    bpf,
    checks::kernel_has_tcx,
    config::RunConfig,
    counters::CounterSnapshot,
    hook::{AttachError, attach_classifier, ensure_clsact, pin_err},
    ifb,
    link::{Link, link_by_name},
    pins,
    state::{AttachMode, IfbRecord, IngressRecord, Paths, Record, ensure_bpffs},
    tc,
    undo::undo,
};

/// How download traffic is shaped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum IngressMode {
    /// The AQM policer at the ingress hook: no queue, no IFB; flows above
    /// their fair share get CE marks or drops at CoDel's spacing.
    Police,
    /// Redirect to an IFB device with sch_fq and the fair pacer on it (the
    /// default: a queue carries a lone download through its sender's cuts,
    /// docs/ingress.md).
    #[default]
    Ifb,
}

/// What `attach` keeps loaded while the shaper runs.
pub struct Ingress {
    /// The ingress program's object (its counters).
    pub ebpf: Ebpf,
    /// `ifb` mode: the pacer shaping the IFB.
    pub ifb: Option<crate::attach::Shaped>,
}

/// Loads the ingress program of `mode` with `config`'s settings at its
/// rate; returns the object and the program's name. Changes nothing on any
/// interface.
pub fn load(
    config: &RunConfig,
    mode: IngressMode,
    has_l2_header: bool,
) -> Result<(Ebpf, &'static str), AttachError> {
    let mut pacer = config.pacer_config(has_l2_header);
    // No telemetry records from the policer (counters only).
    pacer.flags &= !shaper_common::config::FLAG_TELEMETRY;
    // The policer through NAT reads the run's map of LAN hosts: the one
    // an earlier object of the run pinned, or its own, pinned at attach.
    let shared: Vec<(&str, &Path)> = nat_map(config, mode)
        .filter(|p| p.exists())
        .map(|p| (maps::NAT, p))
        .into_iter()
        .collect();
    let mut ebpf = bpf::load::open_sharing(pacer.flow_sets_mask.saturating_add(1), &[], &shared)?;
    let program = program_name(mode, &pacer);
    bpf::load::load_classifier(&mut ebpf, program)?;
    bpf::load::set_entry0(&mut ebpf, maps::CONFIG, pacer)?;
    // The fair share starts at a multiplier of 1.0.
    bpf::load::set_entry0(&mut ebpf, maps::FAIR, FairState::default())?;
    Ok((ebpf, program))
}

/// The map of LAN hosts the policer of a `--nat` run reads; `None` in
/// `ifb` mode (the IFB's pacer reads it) and without `--nat`.
fn nat_map(config: &RunConfig, mode: IngressMode) -> Option<&Path> {
    config
        .nat_map
        .as_deref()
        .filter(|_| mode == IngressMode::Police)
}

/// The ingress program of `mode` for `pacer`: in `police` mode the
/// policer over hosts under host isolation (with the NAT lookup under
/// `--nat`), else the policer over flows.
fn program_name(mode: IngressMode, pacer: &PacerConfig) -> &'static str {
    match (
        mode,
        pacer.isolation() != Isolation::Flows,
        pacer.flags & FLAG_NAT != 0,
    ) {
        (IngressMode::Ifb, _, _) => REDIRECT_PROGRAM,
        (IngressMode::Police, true, true) => POLICE_HOSTS_NAT_PROGRAM,
        (IngressMode::Police, true, false) => POLICE_HOSTS_PROGRAM,
        (IngressMode::Police, false, _) => POLICE_PROGRAM,
    }
}

/// The configuration of `ifb` mode's pacer, on the IFB of `config.iface`.
pub fn ifb_config(config: &RunConfig) -> RunConfig {
    RunConfig {
        iface: ifb::name_for(&config.iface),
        from_ingress: true,
        ..config.clone()
    }
}

/// The objects of [`attach`] loaded ahead, on a thread beside the egress
/// pacer's load ([`crate::attach::preload`]).
pub struct Loaded {
    /// The link kind the ingress program was loaded for.
    has_l2_header: bool,
    /// The ingress program's object, and its name.
    program: (Ebpf, &'static str),
    /// `ifb` mode's pacer, on the IFB (an Ethernet device).
    ifb_pacer: Option<crate::attach::Loaded>,
}

/// Loads what [`attach`] would load for `mode` on a link with (or without)
/// a link header. `None` for a `--nat` run, whose objects share one map of
/// LAN hosts that the first attach pins. Changes nothing on any interface.
pub fn preload(
    config: &RunConfig,
    mode: IngressMode,
    has_l2_header: bool,
) -> Option<Result<Loaded, AttachError>> {
    if config.nat_map.is_some() {
        return None;
    }
    let loaded = (|| {
        let program = load(config, mode, has_l2_header)?;
        let ifb_pacer = match mode {
            IngressMode::Ifb => crate::attach::preload(&ifb_config(config), true).transpose()?,
            IngressMode::Police => None,
        };
        Ok(Loaded {
            has_l2_header,
            program,
            ifb_pacer,
        })
    })();
    Some(loaded)
}

/// Attaches ingress shaping of `mode` to `link` at `config.rate`. `record`
/// is the egress attachment's record, or `None` when only ingress is
/// shaped; `loaded` is what [`preload`] loaded for this link's kind, if
/// anything (else it is loaded here). Returns what must stay loaded and the
/// updated record. On failure everything is undone, egress included, and
/// the record removed.
pub fn attach(
    config: &RunConfig,
    mode: IngressMode,
    link: &Link,
    paths: &Paths,
    record: Option<Record>,
    loaded: Option<Loaded>,
) -> Result<(Ingress, Record), AttachError> {
    let iface = link.name.as_str();
    let ((mut ebpf, program), mut loaded_ifb_pacer) = match loaded {
        Some(l) if l.has_l2_header == link.has_l2_header => (l.program, l.ifb_pacer),
        _ => (load(config, mode, link.has_l2_header)?, None),
    };
    let pin_nat = nat_map(config, mode).filter(|p| !p.exists());
    let mut record = match record {
        Some(r) => r,
        None => {
            if ensure_bpffs(&paths.bpffs)? {
                info!(path = %paths.bpffs.display(), "mounted bpffs");
            }
            Record::fresh(link)
        }
    };
    record.ingress = Some(IngressRecord {
        rate_bits_per_s: config.rate.bits_per_s(),
        attach: None,
        ifb: (mode == IngressMode::Ifb).then(|| IfbRecord {
            name: ifb::name_for(iface),
            ifindex: 0,
        }),
    });
    record.store(&paths.record)?;
    let mut ifb_pacer = None;
    let steps = (|| {
        if mode == IngressMode::Ifb {
            let loaded = loaded_ifb_pacer.take();
            ifb_pacer = Some(shape_ifb(config, paths, &mut record, &mut ebpf, loaded)?);
        }
        attach_steps(&mut ebpf, program, link, paths, &mut record)?;
        match pin_nat {
            Some(path) => crate::attach::pin_nat_map(&ebpf, path),
            None => Ok(()),
        }
    })();
    match steps {
        Ok(()) => Ok((
            Ingress {
                ebpf,
                ifb: ifb_pacer,
            },
            record,
        )),
        Err(e) => {
            warn!(iface, error = %e, "ingress attach failed; undoing what was done");
            drop(ebpf);
            drop(ifb_pacer);
            if let Err(undo_err) = undo(&record, paths) {
                warn!(iface, error = %undo_err, "undo after a failed attach also failed");
            }
            Err(e)
        }
    }
}

/// `ifb` mode's steps 3: creates the IFB (recorded), shapes its egress with
/// the pacer, and points the redirect map at it.
fn shape_ifb(
    config: &RunConfig,
    paths: &Paths,
    record: &mut Record,
    redirect: &mut Ebpf,
    loaded: Option<crate::attach::Loaded>,
) -> Result<crate::attach::Shaped, AttachError> {
    let Some(name) = record
        .ingress
        .as_ref()
        .and_then(|i| i.ifb.as_ref())
        .map(|f| f.name.clone())
    else {
        return Err(AttachError::Load {
            detail: "ifb mode without an IFB in the record".into(),
        });
    };
    let ifb_err = |source: ifb::IfbError| AttachError::Classifier {
        step: "creating the IFB",
        iface: record.iface.clone(),
        detail: source.to_string(),
    };
    let ifindex = ifb::create(&name).map_err(ifb_err)?;
    if let Some(f) = record.ingress.as_mut().and_then(|i| i.ifb.as_mut()) {
        f.ifindex = ifindex;
    }
    record.store(&paths.record)?;
    let ifb_link = link_by_name(&name).map_err(|e| AttachError::Classifier {
        step: "looking up the IFB",
        iface: name.clone(),
        detail: e.to_string(),
    })?;
    let shaped =
        crate::attach::attach(&ifb_config(config), &ifb_link, paths.sibling(&name), loaded)?;
    bpf::load::set_entry0(redirect, maps::REDIRECT, ifindex)?;
    info!(ifb = %name, ifindex, "shaping the download on the IFB");
    Ok(shaped)
}

fn attach_steps(
    ebpf: &mut Ebpf,
    program: &'static str,
    link: &Link,
    paths: &Paths,
    record: &mut Record,
) -> Result<(), AttachError> {
    if !kernel_has_tcx() {
        ensure_clsact(link, paths, record)?;
        if let Some(ifb_ifindex) = record.ingress.as_ref().and_then(|i| i.ifb.as_ref()) {
            return attach_mirred(link, ifb_ifindex.ifindex, paths, record);
        }
    }
    let dir = pins::ingress_dir(paths);
    fs::create_dir_all(&dir).map_err(|e| pin_err("create", &dir, e))?;
    pins::clear(&dir);
    let link_pin = dir.join(pins::LINK);
    attach_classifier(
        bpf::load::classifier(ebpf, program)?,
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
        (maps::POLICE_LINK, pins::POLICE_LINK),
        (maps::REDIRECT, pins::REDIRECT),
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
        program,
        "attached at ingress"
    );
    Ok(())
}

/// `ifb` mode without TCX: tc's matchall + mirred sends every packet to the
/// IFB instead of `shaper_redirect` (see `tc::mirred` for why), recorded
/// the moment the kernel names the filter. Nothing is pinned: no program
/// runs at the hook, and the IFB's pacer counts the packets.
fn attach_mirred(
    link: &Link,
    ifb_ifindex: u32,
    paths: &Paths,
    record: &mut Record,
) -> Result<(), AttachError> {
    let id = tc::add_ingress_redirect(link.ifindex, ifb_ifindex).map_err(|e| {
        AttachError::Classifier {
            step: "adding the ingress redirect (matchall + mirred) to the IFB",
            iface: link.name.clone(),
            detail: e.to_string(),
        }
    })?;
    if let Some(i) = record.ingress.as_mut() {
        i.attach = Some(AttachMode::Mirred {
            priority: id.priority,
            handle: id.handle,
        });
    }
    record.store(&paths.record)?;
    info!(
        iface = %link.name,
        priority = id.priority,
        "attached at ingress: tc clsact matchall, mirred redirect to the IFB"
    );
    Ok(())
}

/// The policer's counters, summed over the CPUs.
pub fn counters(ebpf: &Ebpf) -> Result<CounterSnapshot, AttachError> {
    let map = ebpf.map(maps::COUNTERS).ok_or_else(|| AttachError::Load {
        detail: format!("the object has no map {}", maps::COUNTERS),
    })?;
    let array: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(|e| AttachError::Load {
        detail: format!("{}: {e}", maps::COUNTERS),
    })?;
    Ok(CounterSnapshot::read(&array)?)
}

/// One line on what the policer did.
pub fn summary(counts: &CounterSnapshot) -> String {
    format!(
        "shaper: ingress police: {} packets, {} CE-marked, {} dropped ({} by the link's CoDel, \
         {} early signals, {} by the overload rule), {} signals withheld by the one-in-four \
         cap, {} clocks pulled back to the horizon",
        counts[Counter::Packets],
        counts[Counter::CeMarked],
        counts[Counter::PoliceDrop],
        counts[Counter::PoliceCodelDrop],
        counts[Counter::PoliceEarlyDrop],
        counts[Counter::PoliceOverloadDrop],
        counts[Counter::PoliceWithheld],
        counts[Counter::PoliceClamped],
    )
}

/// The policer's counters as one JSON object, `{"ingress_counters": {..}}`.
pub fn summary_json(counts: &CounterSnapshot) -> String {
    let map: serde_json::Map<String, serde_json::Value> = counts
        .iter()
        .map(|(c, n)| (c.name().to_owned(), serde_json::Value::from(n)))
        .collect();
    serde_json::json!({ "ingress_counters": map }).to_string()
}

#[cfg(test)]
mod tests {
    use std::{path::PathBuf, time::Duration};

    use super::*;
    use crate::rate::Rate;

    #[test]
    fn a_nat_run_loads_nothing_ahead() {
        let rate: Rate = "20mbit".parse().expect("rate");
        let mut config =
            RunConfig::new("wan0".into(), rate, Duration::from_secs(2)).expect("config");
        config.nat_map = Some(PathBuf::from("/sys/fs/bpf/shaper/nat"));
        // Each object would need the pin the first attach makes: none loads
        // ahead.
        assert!(crate::attach::preload(&config, true).is_none());
        for mode in [IngressMode::Police, IngressMode::Ifb] {
            assert!(preload(&config, mode, true).is_none());
        }
    }

    #[test]
    fn the_ifb_pacer_is_the_ingress_configuration_on_the_ifb() {
        let rate: Rate = "20mbit".parse().expect("rate");
        let config = RunConfig::new("wan0".into(), rate, Duration::from_secs(2)).expect("config");
        let ifb = ifb_config(&config);
        assert_eq!(ifb.iface, "ifb4wan0");
        assert!(ifb.from_ingress);
        assert_eq!(ifb.rate, config.rate);
    }
}
