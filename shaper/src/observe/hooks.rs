//! Loading and attaching the observer's two counting classifiers, and taking
//! them off again, leaving the interface as it was found.
//!
//! Load: the shaper's one BPF object, with the pacer's flow table shrunk to a
//! single set (the observer never uses it) and only `observe_egress` and
//! `observe_ingress` given to the verifier.
//!
//! Attach, per hook (egress, ingress):
//! - kernels with TCX (>= 6.6, commit e420bed02507): a TCX link placed
//!   *first*, so the hook counts a packet before a pacer on the same hook can
//!   drop it (a drop then shows as hook-only, never hides as "not seen"). The
//!   link lives in this process: it goes away when we detach, exit or die;
//! - older kernels: a direct-action cls_bpf filter on clsact at a priority
//!   the kernel picks (one below the lowest in use, so it also runs first).
//!   clsact is created only if absent, and deleted on detach only if we
//!   created it *and* no other filter is left on it (a pacer started while
//!   we ran may have put its own there).
//!
//! The programs return `TC_ACT_UNSPEC`, so neither mode changes any verdict.
//! Nothing is pinned and no state record is written: a killed observer under
//! TCX leaves nothing behind; under clsact a SIGKILL leaves its filters (and
//! clsact if it made it), which `tc filter del` removes (named
//! `observe_egress`/`observe_ingress` in `tc filter show`).

use aya::{
    Ebpf,
    maps::PerCpuArray,
    programs::{
        LinkOrder, ProgramError, SchedClassifier, TcAttachType,
        tc::{NlOptions, SchedClassifierLinkId, TcAttachOptions},
    },
};
use shaper_common::{
    config::FLAG_NO_L2,
    observe::{
        Direction, Kind, OBSERVE_COUNTERS_MAP, OBSERVE_EGRESS_PROGRAM, OBSERVE_FLAGS_MAP,
        OBSERVE_INGRESS_PROGRAM, slot,
    },
};
use tracing::{info, warn};

use super::{ObserveError, report::Counts};
use crate::{
    bpf,
    checks::kernel_has_tcx,
    counters::read_total,
    link::Link,
    tc::{
        self,
        message::{RTM_GETTFILTER, RTM_NEWTFILTER, TcMessage, TcMsg},
    },
};

/// How the hooks were attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// TCX links.
    Tcx,
    /// cls_bpf filters on clsact.
    Clsact,
}

impl Mode {
    /// "tcx" or "clsact", for output.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Tcx => "tcx",
            Mode::Clsact => "clsact",
        }
    }
}

/// The two hooks, attached. Detach with [`Hooks::detach`]; dropping also
/// detaches (best effort, logged).
pub struct Hooks {
    ebpf: Option<Ebpf>,
    links: Vec<(&'static str, SchedClassifierLinkId)>,
    /// How they were attached.
    pub mode: Mode,
    created_clsact: bool,
    ifindex: u32,
    iface: String,
}

/// clsact's egress and ingress filter parents (`TC_H_MAKE(TC_H_CLSACT,
/// TC_H_MIN_EGRESS/INGRESS)`).
const CLSACT_EGRESS: u32 = 0xffff_fff3;
const CLSACT_INGRESS: u32 = 0xffff_fff2;

fn load_err(e: impl std::fmt::Display) -> ObserveError {
    ObserveError::Load {
        detail: format!("{e:#}"),
    }
}

/// Loads the object and the two programs, and sets their flags
/// (`has_l2`: frames start with a link-layer header). Changes nothing on
/// any interface.
pub fn load(has_l2: bool) -> Result<Ebpf, ObserveError> {
    let mut ebpf = bpf::load::open(1, &[]).map_err(load_failed)?;
    for name in [OBSERVE_EGRESS_PROGRAM, OBSERVE_INGRESS_PROGRAM] {
        bpf::load::load_classifier(&mut ebpf, name).map_err(load_failed)?;
    }
    let value: u32 = if has_l2 { 0 } else { FLAG_NO_L2 };
    bpf::load::set_entry0(&mut ebpf, OBSERVE_FLAGS_MAP, value).map_err(load_failed)?;
    Ok(ebpf)
}

/// A missing object stays the usage error it is; any other step failed.
fn load_failed(e: bpf::load::LoadError) -> ObserveError {
    match e {
        bpf::load::LoadError::Object(o) => ObserveError::Object(o),
        other => load_err(other),
    }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier, ObserveError> {
    bpf::load::classifier(ebpf, name).map_err(load_failed)
}

/// Loads and attaches both hooks to `link`. On failure, whatever was
/// attached is taken off again before the error is returned.
pub fn attach(link: &Link) -> Result<Hooks, ObserveError> {
    let ebpf = load(link.has_l2_header)?;
    let mode = if kernel_has_tcx() {
        Mode::Tcx
    } else {
        Mode::Clsact
    };
    let mut hooks = Hooks {
        ebpf: Some(ebpf),
        links: Vec::new(),
        mode,
        created_clsact: false,
        ifindex: link.ifindex,
        iface: link.name.clone(),
    };
    // On error `hooks` drops here, which detaches what was attached.
    hooks.attach_both()?;
    info!(iface = %link.name, mode = mode.name(), "observer hooks attached");
    Ok(hooks)
}

impl Hooks {
    fn attach_both(&mut self) -> Result<(), ObserveError> {
        let iface = self.iface.clone();
        if self.mode == Mode::Clsact {
            let has = tc::has_clsact(self.ifindex).map_err(|source| ObserveError::Tc {
                step: "looking for clsact",
                iface: iface.clone(),
                source,
            })?;
            if !has {
                tc::add_clsact(self.ifindex).map_err(|source| ObserveError::Tc {
                    step: "adding the clsact qdisc",
                    iface: iface.clone(),
                    source,
                })?;
                self.created_clsact = true;
            }
        }
        for (name, hook) in [
            (OBSERVE_EGRESS_PROGRAM, TcAttachType::Egress),
            (OBSERVE_INGRESS_PROGRAM, TcAttachType::Ingress),
        ] {
            let options = match self.mode {
                Mode::Tcx => TcAttachOptions::TcxOrder(LinkOrder::first()),
                Mode::Clsact => TcAttachOptions::Netlink(NlOptions::default()),
            };
            let ebpf = self
                .ebpf
                .as_mut()
                .ok_or_else(|| load_err("already detached"))?;
            let id = program(ebpf, name)?
                .attach_with_options(&iface, hook, options)
                .map_err(|e| ObserveError::Attach {
                    program: name,
                    iface: iface.clone(),
                    detail: format!("{e:#}"),
                })?;
            self.links.push((name, id));
        }
        Ok(())
    }

    /// The hooks' counters summed over CPUs: egress then ingress, each as
    /// (skbs, wire segments).
    pub fn counts(&self) -> Result<[(Counts, Counts); 2], ObserveError> {
        let ebpf = self
            .ebpf
            .as_ref()
            .ok_or_else(|| load_err("already detached"))?;
        let map = ebpf
            .map(OBSERVE_COUNTERS_MAP)
            .ok_or_else(|| load_err(format!("the object has no map {OBSERVE_COUNTERS_MAP}")))?;
        let array: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(load_err)?;
        let get = |d: Direction, k: Kind| -> Result<u64, ObserveError> {
            let name = format!("{d:?} {k:?}");
            read_total(&array, OBSERVE_COUNTERS_MAP, &name, slot(d, k)).map_err(load_err)
        };
        let both = |d: Direction| -> Result<(Counts, Counts), ObserveError> {
            Ok((
                Counts {
                    packets: get(d, Kind::Packets)?,
                    bytes: get(d, Kind::Bytes)?,
                },
                Counts {
                    packets: get(d, Kind::WirePackets)?,
                    bytes: get(d, Kind::WireBytes)?,
                },
            ))
        };
        Ok([both(Direction::Egress)?, both(Direction::Ingress)?])
    }

    /// Takes both hooks off and, under clsact, removes clsact if we added it
    /// and it holds no other filter. Every step is tried; the first error is
    /// returned. Idempotent.
    pub fn detach(&mut self) -> Result<(), ObserveError> {
        let mut first: Option<ObserveError> = None;
        if let Some(mut ebpf) = self.ebpf.take() {
            for (name, id) in self.links.drain(..) {
                let result = program(&mut ebpf, name).and_then(|p| {
                    match p.detach(id) {
                        Ok(()) => Ok(()),
                        // The filter is gone already (clsact deleted under us).
                        Err(ProgramError::NetlinkError(e))
                            if e.raw_os_error() == Some(libc::ENOENT) =>
                        {
                            Ok(())
                        }
                        Err(e) => Err(ObserveError::Attach {
                            program: name,
                            iface: self.iface.clone(),
                            detail: format!("detaching: {e:#}"),
                        }),
                    }
                });
                if let Err(e) = result {
                    warn!(iface = %self.iface, error = %e, "detaching an observer hook failed");
                    first.get_or_insert(e);
                }
            }
            // Dropping the object unloads the programs (and would detach any
            // link left, had one failed above).
            drop(ebpf);
        }
        if std::mem::take(&mut self.created_clsact) {
            match clsact_is_empty(self.ifindex) {
                Ok(true) => {
                    if let Err(source) = tc::delete_clsact(self.ifindex) {
                        first.get_or_insert(ObserveError::Tc {
                            step: "removing the clsact qdisc it added",
                            iface: self.iface.clone(),
                            source,
                        });
                    }
                }
                Ok(false) => info!(
                    iface = %self.iface,
                    "leaving clsact in place: another program's filter is on it now"
                ),
                Err(source) => {
                    first.get_or_insert(ObserveError::Tc {
                        step: "listing clsact filters",
                        iface: self.iface.clone(),
                        source,
                    });
                }
            }
        }
        match first {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

impl Drop for Hooks {
    fn drop(&mut self) {
        if let Err(e) = self.detach() {
            warn!(error = %e, "taking the observer hooks off failed");
        }
    }
}

/// True when clsact on `ifindex` has no filter on either hook (or is gone).
fn clsact_is_empty(ifindex: u32) -> Result<bool, tc::TcError> {
    let mut nl = tc::open()?;
    for parent in [CLSACT_EGRESS, CLSACT_INGRESS] {
        let body = TcMessage::encode(
            TcMsg {
                ifindex,
                handle: 0,
                parent,
                info: 0,
            },
            &[],
        );
        match nl.dump(RTM_GETTFILTER, RTM_NEWTFILTER, &body) {
            Ok(filters) if !filters.is_empty() => return Ok(false),
            Ok(_) => {}
            // No clsact (or no such device) any more: nothing to keep.
            Err(e) if matches!(e.errno(), Some(libc::EINVAL | libc::ENOENT | libc::ENODEV)) => {}
            Err(e) => {
                return Err(tc::TcError::request("dump", "clsact filters")(e));
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tc::TC_H_INGRESS;

    #[test]
    fn clsact_parents_match_the_kernel_encoding() {
        // TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS = 0xfff3 / INGRESS = 0xfff2).
        assert_eq!(CLSACT_EGRESS, (TC_H_INGRESS & 0xffff_0000) | 0xfff3);
        assert_eq!(CLSACT_INGRESS, (TC_H_INGRESS & 0xffff_0000) | 0xfff2);
    }
}
