//! Debian packages as the VM's kernel fetchers use them: the `.deb` an
//! `apt-get download` left, versions ordered as `sort -V` orders them, and a
//! tool run with its output kept for the error.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The `.deb` of `package` in `dir`, as `apt-get download` names it.
pub(crate) fn find_deb(dir: &Path, package: &str) -> Result<PathBuf> {
    let prefix = format!("{package}_");
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // apt-get escapes '+' in file names as %2b.
        let name = name.replace("%2b", "+");
        if name.starts_with(&prefix) && name.ends_with(".deb") {
            return Ok(entry.path());
        }
    }
    bail!(
        "apt-get download reported success but left no {package}_*.deb in {}",
        dir.display()
    )
}

/// Runs `cmd`, returning its stdout; on failure the error shows its output.
pub(crate) fn run_captured(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {what} ({:?})", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Orders version strings the way `sort -V` does for these names: runs of
/// digits compare as numbers, everything else byte by byte.
pub(crate) fn version_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let (na, ra) = split_digits(a);
                let (nb, rb) = split_digits(b);
                let (na, nb) = (trim_zeros(na), trim_zeros(nb));
                let ord = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
                if ord != Ordering::Equal {
                    return ord;
                }
                (a, b) = (ra, rb);
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                (a, b) = (&a[1..], &b[1..]);
            }
        }
    }
}

fn split_digits(s: &[u8]) -> (&[u8], &[u8]) {
    let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
    s.split_at(n)
}

fn trim_zeros(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|&&b| b == b'0').count();
    &s[n..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_cmp_is_numeric_on_digit_runs() {
        assert_eq!(
            version_cmp("6.12.99+deb12", "6.12.117+deb12"),
            Ordering::Less
        );
        assert_eq!(version_cmp("6.1.0-9", "6.1.0-10"), Ordering::Less);
        assert_eq!(version_cmp("6.1.0-010", "6.1.0-10"), Ordering::Equal);
        assert_eq!(version_cmp("6.12.1", "6.12.1a"), Ordering::Less);
        assert_eq!(version_cmp("6.12", "6.1"), Ordering::Greater);
    }
}
