//! Helper calls per packet, counted rather than timed: the object's fentry
//! counters (`shaper_common::calls`) attached for an untimed pass, their
//! per-CPU slots summed before and after the measured calls.
//!
//! Invariant: counters are attached only between [`Counters::attach`] and
//! [`Counters::detach`]; no timed call runs in between, as the trampoline
//! adds its own cost to every helper call. Non-goals: instructions per
//! packet, which would need a PMU or an instruction-counting interpreter.

use aya::{
    Btf, Ebpf,
    maps::{MapData, PerCpuArray},
    programs::{FEntry, fentry::FEntryLinkId},
};
use shaper_common::{calls::HELPERS, maps};

use crate::bpf;

/// Calls per helper, in the order of [`HELPERS`].
pub(super) type Totals = [u64; HELPERS.len()];

/// Why the counters could not be set up or read.
#[derive(Debug, thiserror::Error)]
pub enum CallsError {
    /// fentry needs the kernel's BTF.
    #[error("reading the kernel's BTF from /sys/kernel/btf/vmlinux (fentry needs it)")]
    Btf(#[source] aya::BtfError),
    /// The object lacks a counting program or its map.
    #[error(transparent)]
    Load(#[from] bpf::load::LoadError),
    /// The kernel refused a program.
    #[error("loading or attaching {program} to {function}")]
    Program {
        /// The counting program.
        program: &'static str,
        /// The kernel function.
        function: &'static str,
        /// aya's error.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// Reading the slots failed.
    #[error("reading {}", maps::HELPER_CALLS)]
    Map(#[source] aya::maps::MapError),
}

/// The attached counters.
pub(super) struct Counters {
    slots: PerCpuArray<MapData, u64>,
    links: Vec<(&'static str, FEntryLinkId)>,
}

impl Counters {
    /// Loads and attaches every counting program of `ebpf`.
    pub(super) fn attach(ebpf: &mut Ebpf) -> Result<Self, CallsError> {
        let btf = Btf::from_sys_fs().map_err(CallsError::Btf)?;
        let slots = bpf::load::take(ebpf, maps::HELPER_CALLS)?;
        let mut counters = Self {
            slots,
            links: Vec::new(),
        };
        for h in &HELPERS {
            let failed = |source| CallsError::Program {
                program: h.program,
                function: h.function,
                source,
            };
            let prog: &mut FEntry = ebpf
                .program_mut(h.program)
                .ok_or_else(|| bpf::load::LoadError::Step {
                    what: h.program.to_owned(),
                    detail: "the object has no such program".to_owned(),
                })?
                .try_into()
                .map_err(failed)?;
            prog.load(h.function, &btf).map_err(failed)?;
            let link = prog.attach().map_err(failed)?;
            counters.links.push((h.program, link));
        }
        Ok(counters)
    }

    /// Each helper's calls so far, summed over CPUs.
    pub(super) fn totals(&self) -> Result<Totals, CallsError> {
        let mut t = [0u64; HELPERS.len()];
        for (i, slot) in t.iter_mut().enumerate() {
            let per_cpu = self.slots.get(&(i as u32), 0).map_err(CallsError::Map)?;
            *slot = per_cpu.iter().sum();
        }
        Ok(t)
    }

    /// Detaches every counting program (their trampolines go with them).
    pub(super) fn detach(self, ebpf: &mut Ebpf) {
        for (name, link) in self.links {
            if let Some(p) = ebpf.program_mut(name)
                && let Ok(p) = <&mut FEntry>::try_from(p)
                && let Err(e) = p.detach(link)
            {
                tracing::warn!(program = name, error = %e, "detaching a helper counter");
            }
        }
    }
}

/// `after - before`, per helper.
pub(super) fn delta(before: &Totals, after: &Totals) -> Totals {
    let mut d = [0u64; HELPERS.len()];
    for (i, x) in d.iter_mut().enumerate() {
        *x = after[i].saturating_sub(before[i]);
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_is_per_helper_and_never_negative() {
        let mut before = [0u64; HELPERS.len()];
        let mut after = [0u64; HELPERS.len()];
        before[0] = 5;
        after[0] = 12;
        after[1] = 3;
        before[2] = 4;
        let d = delta(&before, &after);
        assert_eq!(d[0], 7);
        assert_eq!(d[1], 3);
        assert_eq!(d[2], 0);
    }
}
