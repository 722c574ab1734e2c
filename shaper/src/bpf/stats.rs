//! The kernel's own accounting of the shaper's programs: run count and run
//! time per program (`bpf_prog_info.run_cnt`, `run_time_ns`), for `status`
//! and the benchmark's lab part.
//!
//! The programs of one `shaper run` are found by the maps they use: each run
//! loads its own object, so the programs that hold a pinned map's id are that
//! run's. The kernel counts only while statistics are on: the sysctl
//! `kernel.bpf_stats_enabled`, or a `BPF_ENABLE_STATS` descriptor held open
//! ([`enable`]). Run time includes the tail-called telemetry program, which
//! runs inside its caller.
//!
//! Units: nanoseconds, program runs (one per skb, a GSO packet being one).
//! Non-goals: per-CPU figures (the kernel sums them).

use std::{os::fd::OwnedFd, path::Path};

use aya::{
    maps::{MapError, MapInfo},
    programs::{ProgramError, loaded_programs},
    sys::{Stats, SyscallError, enable_stats},
};

/// Why the programs' figures could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// The pinned map could not be opened.
    #[error("reading the map pinned at {path}")]
    Map {
        path: String,
        #[source]
        source: MapError,
    },
    /// The kernel's program list could not be read.
    #[error("listing the loaded BPF programs")]
    Programs(#[source] ProgramError),
    /// `BPF_ENABLE_STATS` was refused.
    #[error("turning on the kernel's BPF run-time statistics (BPF_ENABLE_STATS)")]
    Enable(#[source] SyscallError),
}

/// One program's figures.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProgramRuns {
    /// The program's name, e.g. `shaper_egress`.
    pub name: String,
    /// The kernel's program id.
    pub id: u32,
    /// Runs counted while statistics were on.
    pub run_cnt: u64,
    /// Time in the program over those runs, ns.
    pub run_time_ns: u64,
}

impl ProgramRuns {
    /// Mean ns per run; `None` before any run was counted.
    pub fn ns_per_run(&self) -> Option<f64> {
        (self.run_cnt > 0).then(|| self.run_time_ns as f64 / self.run_cnt as f64)
    }
}

/// The programs that use the map pinned at `pin`, by name; `None` when the
/// pin does not exist.
pub fn programs_using(pin: &Path) -> Result<Option<Vec<ProgramRuns>>, StatsError> {
    let map_id = match MapInfo::from_pin(pin) {
        Ok(info) => info.id(),
        Err(MapError::SyscallError(SyscallError { io_error, .. }))
            if io_error.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(None);
        }
        Err(source) => {
            return Err(StatsError::Map {
                path: pin.display().to_string(),
                source,
            });
        }
    };
    let mut out = Vec::new();
    for info in loaded_programs() {
        let info = info.map_err(StatsError::Programs)?;
        let uses = info
            .map_ids()
            .map_err(StatsError::Programs)?
            .is_some_and(|ids| ids.contains(&map_id));
        if uses {
            out.push(ProgramRuns {
                name: info.name_as_str().unwrap_or("?").to_owned(),
                id: info.id(),
                run_cnt: info.run_count(),
                run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Some(out))
}

/// Turns the kernel's run-time statistics on until the descriptor is
/// dropped, whatever the sysctl says.
pub fn enable() -> Result<OwnedFd, StatsError> {
    enable_stats(Stats::RunTime).map_err(StatsError::Enable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ns_per_run_needs_a_run() {
        let mut p = ProgramRuns {
            name: "shaper_egress".into(),
            id: 1,
            run_cnt: 0,
            run_time_ns: 0,
        };
        assert_eq!(p.ns_per_run(), None);
        p.run_cnt = 4;
        p.run_time_ns = 1000;
        assert_eq!(p.ns_per_run(), Some(250.0));
    }

    #[test]
    fn a_missing_pin_is_none() {
        let got = programs_using(Path::new("/sys/fs/bpf/no-such-shaper-pin"));
        // Without bpffs access the open fails otherwise; either way no
        // programs are invented.
        assert!(!matches!(got, Ok(Some(_))), "{got:?}");
    }
}
