//! Fetches the newest Linux 7.x from Debian's trixie-backports without
//! touching the host's apt configuration.
//!
//! Debian splits these kernels in three packages, `linux-binary-<release>`
//! (the image, at `usr/lib/modules/<release>/vmlinuz`), `linux-modules-…`
//! and `linux-base-…` (`config`, `System.map` and `modules.builtin*` beside
//! the image); `linux-image-<release>` only depends on them. A release is
//! usable when all three exist, which is the check that picks it: the newest
//! 7.x release of the generic amd64 flavour with a binary, a modules and a
//! base package. Some 7.0 releases ship a signed binary with no modules
//! package and are passed over by that check.
//!
//! Invariants: the private apt configuration lives in
//! `<workspace>/target/vm/apt-backports/` (its own source list, package
//! lists and archive cache), so the host's sources, lists and cache stay as
//! they are. The mirror is the one the host's sources already use for
//! Debian, so a machine behind its own mirror keeps using it.
//!
//! Non-goals: other suites or flavours; architectures other than amd64
//! and arm64.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::debs::{find_deb, run_captured, version_cmp};
use super::{Arch, Tools};

/// The suite that carries Linux 7.x for Debian 13.
const SUITE: &str = "trixie-backports";

/// The mirror used when the host's sources name none.
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// The three packages a release needs, by name prefix.
const PARTS: [&str; 3] = ["linux-binary-", "linux-modules-", "linux-base-"];

/// Downloads the newest usable 7.x release's packages into `dest`; returns
/// the release (`7.3.4+deb13-amd64`) and the downloaded files.
pub(crate) fn fetch(
    vm_dir: &Path,
    dest: &Path,
    arch: Arch,
    tools: &Tools,
) -> Result<(String, Vec<PathBuf>)> {
    let dir = match arch {
        Arch::X86_64 => vm_dir.join("apt-backports"),
        Arch::Arm64 => vm_dir.join("apt-backports-arm64"),
    };
    let apt = PrivateApt::create(&dir, arch)?;
    eprintln!(
        "xtask vm: first use of kernel 7: reading {SUITE} from {}",
        apt.mirror
    );
    run_captured(
        apt.command(&tools.apt_get).args(["update", "-q"]),
        "apt-get update (trixie-backports)",
    )?;
    let listing = run_captured(
        apt.command(&tools.apt_cache).args([
            "search",
            "--names-only",
            r"^linux-(binary|modules|base)-7\.",
        ]),
        "apt-cache search (trixie-backports)",
    )?;
    let Some(release) = newest_complete_release(&listing, arch) else {
        bail!(
            "{SUITE} at {} lists no Linux 7.x release with binary, modules and base packages \
             for {}",
            apt.mirror,
            arch.debian()
        );
    };
    let packages: Vec<String> = PARTS.iter().map(|p| format!("{p}{release}")).collect();
    eprintln!("xtask vm: fetching {}", packages.join(", "));
    run_captured(
        apt.command(&tools.apt_get)
            .args(["download", "-q"])
            .args(&packages)
            .current_dir(dest),
        "apt-get download (trixie-backports)",
    )?;
    let debs = packages
        .iter()
        .map(|p| find_deb(dest, p))
        .collect::<Result<Vec<_>>>()?;
    Ok((release, debs))
}

/// apt pointed at a source list, package lists and cache of its own.
struct PrivateApt {
    dir: PathBuf,
    mirror: String,
    arch: Arch,
}

impl PrivateApt {
    fn create(dir: &Path, arch: Arch) -> Result<PrivateApt> {
        for sub in ["lists/partial", "cache/archives/partial"] {
            let d = dir.join(sub);
            std::fs::create_dir_all(&d)
                .with_context(|| format!("cannot create {}", d.display()))?;
        }
        let mirror = host_mirror().unwrap_or_else(|| DEFAULT_MIRROR.to_owned());
        let list = format!(
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} {SUITE} main\n"
        );
        let path = dir.join("sources.list");
        std::fs::write(&path, list).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(PrivateApt {
            dir: dir.to_owned(),
            mirror,
            arch,
        })
    }

    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new(program);
        let d = self.dir.display();
        let arch = self.arch.debian();
        c.args([
            "-o",
            &format!("Dir::Etc::SourceList={d}/sources.list"),
            "-o",
            "Dir::Etc::SourceParts=/dev/null",
            "-o",
            &format!("Dir::State::Lists={d}/lists"),
            "-o",
            &format!("Dir::Cache={d}/cache"),
            "-o",
            &format!("APT::Architecture={arch}"),
            "-o",
            &format!("APT::Architectures={arch}"),
        ]);
        c
    }
}

/// The Debian mirror the host's own sources use, if any.
pub(crate) fn host_mirror() -> Option<String> {
    let mut texts = Vec::new();
    if let Ok(s) = std::fs::read_to_string("/etc/apt/sources.list") {
        texts.push(s);
    }
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            let enabled = p.extension().is_some_and(|e| e == "list" || e == "sources");
            if let (true, Ok(s)) = (enabled, std::fs::read_to_string(&p)) {
                texts.push(s);
            }
        }
    }
    texts.iter().find_map(|t| mirror_in(t))
}

/// The first URI in an apt source text (one-line or deb822 form) whose path
/// ends in `/debian`: the main archive, not debian-security or a third
/// party's.
fn mirror_in(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .flat_map(|l| {
            let words: Vec<&str> = if let Some(uris) = l.strip_prefix("URIs:") {
                uris.split_whitespace().collect()
            } else if l.starts_with("deb ") {
                l.split_whitespace()
                    .skip(1)
                    .skip_while(|w| w.starts_with('['))
                    .skip_while(|w| !w.contains("://") && w.ends_with(']'))
                    .take(1)
                    .collect()
            } else {
                Vec::new()
            };
            words.into_iter().map(str::to_owned).collect::<Vec<_>>()
        })
        .map(|uri| uri.trim_end_matches('/').to_owned())
        .find(|uri| uri.contains("://") && uri.ends_with("/debian"))
}

/// The release of `package` when it is one of the three parts of a generic
/// 7.x kernel of `arch` (`linux-modules-7.3.4+deb13-amd64` →
/// `7.3.4+deb13-amd64`).
fn release_of(package: &str, arch: Arch) -> Option<(usize, &str)> {
    let suffix = format!("+deb13-{}", arch.debian());
    PARTS.iter().enumerate().find_map(|(i, prefix)| {
        let release = package.strip_prefix(prefix)?;
        let number = release.strip_prefix("7.")?.strip_suffix(suffix.as_str())?;
        let numeric = !number.is_empty()
            && number.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            && !number.starts_with('.')
            && !number.ends_with('.');
        numeric.then_some((i, release))
    })
}

/// The newest release that has all three parts in `apt-cache search` output.
fn newest_complete_release(listing: &str, arch: Arch) -> Option<String> {
    let mut seen: Vec<(&str, [bool; 3])> = Vec::new();
    for (part, release) in listing
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|p| release_of(p, arch))
    {
        match seen.iter_mut().find(|(r, _)| *r == release) {
            Some((_, parts)) => parts[part] = true,
            None => {
                let mut parts = [false; 3];
                parts[part] = true;
                seen.push((release, parts));
            }
        }
    }
    seen.into_iter()
        .filter(|(_, parts)| parts.iter().all(|&p| p))
        .map(|(r, _)| r)
        .max_by(|a, b| version_cmp(a, b))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "\
linux-binary-7.0.13+deb13-amd64 - Binary for Linux 7.0.13 (signed)
linux-binary-7.2.12+deb13-amd64 - Linux 7.2.12 for 64-bit PCs (kernel image)
linux-modules-7.2.12+deb13-amd64 - Linux 7.2.12 for 64-bit PCs (modules)
linux-base-7.2.12+deb13-amd64 - Linux 7.2.12 for 64-bit PCs (base files)
linux-base-7.2.12+deb13-cloud-amd64 - Linux 7.2.12 for x86-64 cloud (base files)
linux-binary-7.3.4+deb13-amd64 - Linux 7.3.4 for 64-bit PCs (kernel image)
linux-modules-7.3.4+deb13-amd64 - Linux 7.3.4 for 64-bit PCs (modules)
linux-base-7.3.4+deb13-amd64 - Linux 7.3.4 for 64-bit PCs (base files)
linux-binary-7.4.1+deb13-amd64 - Linux 7.4.1 for 64-bit PCs (kernel image)
linux-base-7.4.1+deb13-rt-amd64 - Linux 7.4.1 for 64-bit PCs (base files)
linux-image-7.3.4+deb13-amd64-dbg - Linux 7.3.4 for 64-bit PCs (debug symbols)
";

    #[test]
    fn the_newest_release_with_all_three_parts_wins() {
        // 7.4.1 has a binary but no modules or base of the generic flavour.
        assert_eq!(
            newest_complete_release(LISTING, Arch::X86_64).as_deref(),
            Some("7.3.4+deb13-amd64")
        );
    }

    #[test]
    fn releases_compare_numerically() {
        let listing = LISTING.replace("7.3.4", "7.2.9");
        assert_eq!(
            newest_complete_release(&listing, Arch::X86_64).as_deref(),
            Some("7.2.12+deb13-amd64")
        );
        assert_eq!(
            newest_complete_release("linux-binary-7.3.4+deb13-amd64 - x\n", Arch::X86_64),
            None
        );
    }

    #[test]
    fn other_flavours_and_lines_are_not_releases() {
        assert_eq!(
            release_of("linux-base-7.3.4+deb13-cloud-amd64", Arch::X86_64),
            None
        );
        assert_eq!(
            release_of("linux-binary-6.19.2+deb13-amd64", Arch::X86_64),
            None
        );
        assert_eq!(
            release_of("linux-image-7.3.4+deb13-amd64", Arch::X86_64),
            None
        );
        assert_eq!(
            release_of("linux-base-7.3.4+deb13-amd64", Arch::Arm64),
            None
        );
        assert_eq!(
            release_of("linux-base-7.3.4+deb13-arm64", Arch::Arm64),
            Some((2, "7.3.4+deb13-arm64"))
        );
        assert_eq!(
            release_of("linux-modules-7.3.4+deb13-amd64", Arch::X86_64),
            Some((1, "7.3.4+deb13-amd64"))
        );
    }

    #[test]
    fn the_mirror_comes_from_either_source_format() {
        let deb822 = "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\n\
                      Suites: bookworm\n\nTypes: deb\nURIs: http://deb.debian.org/debian-security\n";
        assert_eq!(
            mirror_in(deb822).as_deref(),
            Some("http://mirror.example/debian")
        );
        let one_line = "deb http://deb.debian.org/debian-security bookworm-security main\n\
                        deb [signed-by=/k.gpg] http://ftp.example/debian bookworm main\n";
        assert_eq!(
            mirror_in(one_line).as_deref(),
            Some("http://ftp.example/debian")
        );
        assert_eq!(
            mirror_in("deb https://packages.example/apt stable main\n"),
            None
        );
    }
}
