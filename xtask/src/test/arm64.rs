//! The arm64 stage's builds: the package (whose binary is the shaper under
//! test, so the tier checks what an operator installs), xtask's test runner
//! and the integration tests, all static for aarch64.
//!
//! The tests' names come from the host build's listing: both builds are of
//! the same sources, so a test binary's name finds its aarch64 twin.
//!
//! Non-goals: listing tests by running aarch64 binaries on the host.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::exec::{self, PlannedTest};
use crate::cross::{self, Target};
use crate::dist;

/// What the arm64 stage runs in the guest.
pub(super) struct Built {
    /// The packaged shaper.
    pub shaper: PathBuf,
    /// xtask, for `exec-tests` in the guest.
    pub runner: PathBuf,
    /// The aarch64 test binaries.
    pub tests: Vec<PathBuf>,
}

/// Builds the package, the runner and the tests.
pub(super) fn build(root: &Path, object: &Path) -> Result<Built> {
    let artifacts = dist::build(root, Target::Aarch64)?;
    eprintln!(
        "xtask test: packaged {} and {}",
        artifacts.binary.display(),
        artifacts.ipk.display()
    );
    let release = cross::build_release(root, object, Target::Aarch64, &["xtask"])?;
    let runner = release.join("xtask");
    dist::check_binary(&runner, Target::Aarch64)?;
    let tests = cross::build_tests(root, object, Target::Aarch64)?;
    Ok(Built {
        shaper: artifacts.binary,
        runner,
        tests,
    })
}

/// The host plan's tests with each binary replaced by its aarch64 build.
pub(super) fn retarget(planned: &[PlannedTest], built: &[PathBuf]) -> Result<Vec<PlannedTest>> {
    planned
        .iter()
        .map(|t| {
            let name = exec::binary_name(&t.binary);
            let binary = built
                .iter()
                .find(|b| exec::binary_name(b) == name)
                .with_context(|| format!("the aarch64 build has no test binary {name}"))?;
            Ok(PlannedTest {
                binary: binary.clone(),
                test: t.test.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_keep_their_names_and_take_the_aarch64_binary() -> Result<()> {
        let planned = vec![PlannedTest {
            binary: PathBuf::from("/w/target/debug/deps/shaping-0123456789abcdef"),
            test: "sigterm_restores_the_default_root".into(),
        }];
        let built = vec![
            PathBuf::from("/w/target/aarch64-unknown-linux-gnu/debug/deps/tc_restore-aa"),
            PathBuf::from(
                "/w/target/aarch64-unknown-linux-gnu/debug/deps/shaping-fedcba9876543210",
            ),
        ];
        let got = retarget(&planned, &built)?;
        assert_eq!(got[0].binary, built[1]);
        assert_eq!(got[0].test, planned[0].test);
        assert!(retarget(&planned, &built[..1]).is_err());
        Ok(())
    }
}
