//! The caches under `<workspace>/target/vm/` (kernels, the arm64 root):
//! each is complete or absent.
//!
//! A cache is built in `.prepare-<name>-<pid>/` beside its place and
//! renamed into place only when its builder succeeded, so an interrupted
//! build leaves no half cache; a stale one (incomplete, or of an older
//! layout, as the caller's check says) is removed first. When two
//! processes build the same cache, the later rename fails and its copy is
//! dropped if the earlier one's is complete.
//!
//! Non-goals: locking, eviction.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

/// `vm_dir/name`, built first by `build` (into an empty folder it is given)
/// unless `is_complete` accepts what is there; `what` names it in messages.
pub(crate) fn ensure(
    vm_dir: &Path,
    name: &str,
    what: &str,
    is_complete: impl Fn(&Path) -> bool,
    build: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let dir = vm_dir.join(name);
    if is_complete(&dir) {
        return Ok(dir);
    }
    if dir.exists() {
        eprintln!(
            "xtask vm: {} is incomplete or from an older layout; rebuilding it",
            dir.display()
        );
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("cannot remove the stale cache {}", dir.display()))?;
    }
    let started = Instant::now();
    let tmp = vm_dir.join(format!(".prepare-{name}-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("cannot clear {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    if let Err(e) = build(&tmp) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if let Err(e) = std::fs::rename(&tmp, &dir) {
        let _ = std::fs::remove_dir_all(&tmp);
        if !is_complete(&dir) {
            return Err(e)
                .with_context(|| format!("cannot move the prepared {what} to {}", dir.display()));
        }
    }
    eprintln!(
        "xtask vm: {what} prepared in {:.1} s (cached in {})",
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    Ok(dir)
}
