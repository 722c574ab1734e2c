//! Where the shaper's pinned objects live, and opening and clearing them.
//! A shaped interface's pins sit in its pin directory (see `state::Paths`),
//! the ingress program's in `ingress/` under it; another process
//! (`shaper status`, `observe`) opens them by these names.
//!
//! Invariant: a missing pin is not an error to a reader (`None`), so a
//! status of an interface mid-attach or mid-undo shows what is there.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    maps::{Map, MapError},
    sys::SyscallError,
};

use crate::{
    hook::{AttachError, pin_err},
    state::Paths,
};

/// The pacer's configuration map (file names inside a pin directory
/// follow).
pub const CONFIG: &str = "config";
/// The per-CPU counters map.
pub const COUNTERS: &str = "counters";
/// The aggregate clock map.
pub const AGGREGATE: &str = "aggregate";
/// The fair pacer's shared state.
pub const FAIR: &str = "fair";
/// The flow table.
pub const FLOWS: &str = "flows";
/// The tins' thresholds and usage.
pub const TINS: &str = "tins";
/// The per-tin counters.
pub const TIN_COUNTERS: &str = "tin_counters";
/// The TCX link.
pub const LINK: &str = "link";
/// The policer's extra pin: its virtual link.
pub const POLICE_LINK: &str = "police_link";

/// The redirect target's pin (`ifb` mode).
pub const REDIRECT: &str = "redirect";

/// Where a `--nat` run's shared pins live: the map of LAN hosts
/// ([`nat_map`]) and the LAN classifiers' TCX links ([`lan_link`]). A
/// directory of its own, so that clearing the pin directory's files
/// leaves the map every object of the run shares.
pub fn nat_dir(paths: &Paths) -> PathBuf {
    paths.pin_dir.join("nat")
}

/// The map of LAN hosts of a `--nat` run.
pub fn nat_map(paths: &Paths) -> PathBuf {
    nat_dir(paths).join("map")
}

/// The TCX link of the LAN classifier on `lan`.
pub fn lan_link(paths: &Paths, lan: &str) -> PathBuf {
    nat_dir(paths).join(format!("lan-{lan}"))
}

/// Where the ingress program's pins live.
pub fn ingress_dir(paths: &Paths) -> PathBuf {
    paths.pin_dir.join("ingress")
}

/// Removes every pin in `dir` (not the directory); missing is fine.
pub fn clear(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Opens a pinned map; `None` when the pin is not visible.
pub fn open(path: &Path) -> Result<Option<Map>, AttachError> {
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
