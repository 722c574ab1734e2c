//! Fetches a stock Debian kernel and caches it, ready to boot, under
//! `<workspace>/target/vm/<line>/`.
//!
//! The cache directory holds `vmlinuz` (the package's bzImage), `vmlinux`
//! (the same kernel decompressed, when it supports PVH entry), `base.cpio`
//! (busybox and the 9p modules, see [`super::initramfs`]), `tree/` (the
//! unpacked package with a fresh module index: the guest's `modprobe -d`
//! root), `release` and `layout`.
//!
//! Why `vmlinux`: under TCG the bzImage's own decompressor is slow (6.1 is
//! XZ-compressed and spends about 6 s there, 6.12 uses zstd). QEMU boots an
//! uncompressed ELF kernel directly through its PVH entry point
//! (`CONFIG_PVH`), so the image is decompressed once here, the way the
//! kernel's scripts/extract-vmlinux does: find the compressed payload by its
//! magic bytes and decompress from there.
//!
//! Invariants: the cache is complete or absent ([`super::cache`]); a
//! complete cache is used without asking apt anything. The newest
//! patch release known to apt is chosen at preparation time; to move to a
//! newer one, delete the cache directory.
//!
//! Non-goals: verifying package signatures beyond what apt does, kernels from
//! anywhere but the configured apt sources.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::debs::{find_deb, run_captured, version_cmp};
use super::{Arch, Guest, Kernel, Tools, backports, cache, elf, initramfs};

/// Bumped whenever the cache's contents change shape, so that old caches are
/// rebuilt rather than misread.
const CACHE_LAYOUT: &str = "shaper-vm-cache 3\n";

/// A prepared kernel, ready to boot.
pub(crate) struct Cached {
    /// `vmlinux` if it was extracted, else `vmlinuz`.
    pub kernel: PathBuf,
    pub base_initrd: PathBuf,
    /// The `modprobe -d` root: holds `lib/modules/<release>/`.
    pub modules_root: PathBuf,
}

/// `<workspace>/target/vm`: parent of caches and run directories.
pub(crate) fn vm_dir(workspace: &Path) -> PathBuf {
    workspace.join("target").join("vm")
}

/// Returns the cached `guest` kernel, fetching and preparing it first if
/// needed; `busybox` (static, of the guest's architecture) goes into its
/// initramfs.
pub(crate) fn prepare(
    workspace: &Path,
    guest: Guest,
    tools: &Tools,
    busybox: &Path,
) -> Result<Cached> {
    let dir = cache::ensure(
        &vm_dir(workspace),
        &guest.name(),
        &format!("kernel {}", guest.name()),
        is_complete,
        |tmp| build_cache(tmp, guest, tools, busybox),
    )?;
    Ok(cached_in(&dir))
}

fn cached_in(dir: &Path) -> Cached {
    let vmlinux = dir.join("vmlinux");
    Cached {
        kernel: if vmlinux.is_file() {
            vmlinux
        } else {
            dir.join("vmlinuz")
        },
        base_initrd: dir.join("base.cpio"),
        modules_root: dir.join("tree"),
    }
}

fn is_complete(dir: &Path) -> bool {
    let layout_ok = std::fs::read_to_string(dir.join("layout")).is_ok_and(|s| s == CACHE_LAYOUT);
    let c = cached_in(dir);
    layout_ok && c.kernel.is_file() && c.base_initrd.is_file() && c.modules_root.is_dir()
}

/// Downloads the newest bookworm `linux-image` package of `kernel` into
/// `tmp`; returns its release and the file.
fn fetch_bookworm(tmp: &Path, guest: Guest, tools: &Tools) -> Result<(String, Vec<PathBuf>)> {
    // A fresh machine may have empty or stale package lists: refresh them
    // once when the search finds nothing or the download fails.
    let search = || {
        run_captured(
            Command::new(&tools.apt_cache).args([
                "search",
                "--names-only",
                guest.kernel.apt_search_pattern(),
            ]),
            "apt-cache search",
        )
    };
    let refresh = || {
        eprintln!("xtask vm: refreshing the package lists (apt-get update)");
        run_captured(
            Command::new(&tools.apt_get).args(["update", "-q"]),
            "apt-get update",
        )
    };
    // A foreign guest's kernel comes from its architecture's lists.
    crate::toolchain::add_dpkg_arch(guest.arch.debian())?;
    let mut chosen = None;
    for attempt in 0..2 {
        if attempt == 1 {
            refresh()?;
        }
        let Some(release) = newest_release(guest, &search()?) else {
            if attempt == 1 {
                bail!(
                    "apt knows no package {} even after apt-get update: Debian bookworm and \
                     bookworm-security must be in the apt sources",
                    guest.package_glob()
                );
            }
            continue;
        };
        let package = format!("linux-image-{release}");
        eprintln!(
            "xtask vm: first use of kernel {}: fetching {package}",
            guest.name()
        );
        // The architecture qualifier lets apt fetch a foreign one.
        let qualified = format!("{package}:{}", guest.arch.debian());
        let downloaded = run_captured(
            Command::new(&tools.apt_get)
                .args(["download", "-q", &qualified])
                .current_dir(tmp),
            "apt-get download",
        );
        match downloaded {
            Ok(_) => {
                chosen = Some((release, package));
                break;
            }
            Err(e) if attempt == 0 => eprintln!("xtask vm: {e:#}; retrying after apt-get update"),
            Err(e) => return Err(e),
        }
    }
    let (release, package) = chosen.context("no kernel package could be downloaded")?;
    Ok((release, vec![find_deb(tmp, &package)?]))
}

/// Fills the empty directory `tmp` with a complete cache for `kernel`.
fn build_cache(tmp: &Path, guest: Guest, tools: &Tools, busybox: &Path) -> Result<()> {
    let (release, debs) = match guest.kernel {
        Kernel::V7 => backports::fetch(tmp.parent().unwrap_or(tmp), tmp, guest.arch, tools)?,
        Kernel::V6_12 | Kernel::V6_1 => fetch_bookworm(tmp, guest, tools)?,
    };
    let tree = tmp.join("tree");
    for deb in &debs {
        run_captured(
            Command::new(&tools.dpkg).arg("-x").arg(deb).arg(&tree),
            "dpkg -x",
        )?;
        std::fs::remove_file(deb).with_context(|| format!("cannot remove {}", deb.display()))?;
    }
    let usr_modules = tree.join("usr/lib/modules").join(&release);
    if usr_modules.is_dir() && !tree.join("lib").exists() {
        // Newer packages install under usr/lib only; depmod -b and the
        // guest's modprobe -d look under lib/, so lib points there
        // (relatively, so the link resolves in the guest as well).
        std::os::unix::fs::symlink("usr/lib", tree.join("lib"))
            .context("cannot link tree/lib to usr/lib")?;
    }
    let modules = tree.join("lib/modules").join(&release);
    if !modules.is_dir() {
        bail!(
            "the {release} packages have no lib/modules/{release}: this is not a package layout \
             this tool knows"
        );
    }
    let image = boot_file(&tree, &release, "vmlinuz")
        .with_context(|| format!("the {release} packages have no kernel image"))?;
    std::fs::rename(&image, tmp.join("vmlinuz"))
        .with_context(|| format!("cannot move {}", image.display()))?;

    let config = config_file(&tree, &release)
        .with_context(|| format!("the {release} packages have no kernel config"))?;
    let config = std::fs::read_to_string(&config)
        .with_context(|| format!("cannot read {}", config.display()))?;
    // PVH is an x86 entry point; arm64's QEMU boots the Image as it is.
    if guest.arch == Arch::X86_64 && config.lines().any(|line| line == "CONFIG_PVH=y") {
        extract_vmlinux(tools, tmp)?;
    }

    // The package ships no modules.dep; the index is built here, inside the
    // cache, so the host's own /lib/modules is never involved.
    run_captured(
        Command::new(&tools.depmod)
            .arg("-b")
            .arg(&tree)
            .arg(&release),
        "depmod",
    )?;
    initramfs::write_base(
        tools,
        busybox,
        &modules,
        &tmp.join("initramfs"),
        &tmp.join("base.cpio"),
    )?;

    std::fs::write(tmp.join("release"), format!("{release}\n"))
        .context("cannot write the release file")?;
    std::fs::write(tmp.join("layout"), CACHE_LAYOUT).context("cannot write the layout file")?;
    Ok(())
}

/// `<tree>/boot/<name>-<release>` (bookworm's layout) or
/// `<tree>/usr/lib/modules/<release>/<name>` (the split packages of 7.x),
/// whichever exists.
fn boot_file(tree: &Path, release: &str, name: &str) -> Option<PathBuf> {
    [
        tree.join("boot").join(format!("{name}-{release}")),
        tree.join("usr/lib/modules").join(release).join(name),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// The kernel config in an unpacked tree, in either package layout.
pub(crate) fn config_file(tree: &Path, release: &str) -> Option<PathBuf> {
    boot_file(tree, release, "config")
}

/// Decompresses `tmp/vmlinuz` into `tmp/vmlinux`. Tries each xz or zstd
/// magic in the image in turn, keeping the first output that is a complete
/// ELF file (the decompressors complain about the bytes after the payload;
/// that is expected). Leaves no `vmlinux` if none works: the bzImage still
/// boots, only slower.
fn extract_vmlinux(tools: &Tools, tmp: &Path) -> Result<()> {
    let image_path = tmp.join("vmlinuz");
    let image = std::fs::read(&image_path)
        .with_context(|| format!("cannot read {}", image_path.display()))?;
    let mut candidates: Vec<(usize, &Path)> = find_all(&image, b"\xfd7zXZ\x00")
        .into_iter()
        .map(|at| (at, tools.xz.as_path()))
        .chain(
            find_all(&image, b"\x28\xb5\x2f\xfd")
                .into_iter()
                .map(|at| (at, tools.zstd.as_path())),
        )
        .collect();
    candidates.sort();
    let payload = tmp.join("payload");
    let vmlinux = tmp.join("vmlinux");
    for (at, tool) in candidates.into_iter().take(8) {
        std::fs::write(&payload, &image[at..])
            .with_context(|| format!("cannot write {}", payload.display()))?;
        let out = std::fs::File::create(&vmlinux)
            .with_context(|| format!("cannot create {}", vmlinux.display()))?;
        let ran = Command::new(tool)
            .arg("-dc")
            .arg(&payload)
            .stdout(out)
            .stderr(std::process::Stdio::null())
            .status();
        if ran.is_ok() && std::fs::read(&vmlinux).is_ok_and(|elf| elf::is_complete_executable(&elf))
        {
            std::fs::remove_file(&payload)
                .with_context(|| format!("cannot remove {}", payload.display()))?;
            return Ok(());
        }
    }
    let _ = std::fs::remove_file(&payload);
    let _ = std::fs::remove_file(&vmlinux);
    eprintln!(
        "xtask vm: note: no uncompressed kernel found in vmlinuz; booting the bzImage (slower under TCG)"
    );
    Ok(())
}

/// Every offset at which `needle` occurs in `haystack`.
fn find_all(haystack: &[u8], needle: &[u8]) -> Vec<usize> {
    haystack
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(at, _)| at)
        .collect()
}

impl Guest {
    /// The generic-flavour release names of this line look like
    /// `<prefix><number><suffix>`; anything else (cloud, rt, dbg, unsigned,
    /// 16k pages, meta-packages) is not bootable here or not a kernel image.
    fn release_shape(self) -> (&'static str, String) {
        let arch = self.arch.debian();
        match self.kernel {
            Kernel::V6_12 => ("6.12.", format!("+deb12-{arch}")),
            Kernel::V6_1 => ("6.1.0-", format!("-{arch}")),
            Kernel::V7 => ("7.", format!("+deb13-{arch}")),
        }
    }

    fn package_glob(self) -> String {
        let (prefix, suffix) = self.release_shape();
        format!("linux-image-{prefix}*{suffix}")
    }

    /// The release (`6.12.117+deb12-amd64`) if `package` is a generic-flavour
    /// image of this line and architecture.
    fn release_of(self, package: &str) -> Option<&str> {
        let release = package.strip_prefix("linux-image-")?;
        let (prefix, suffix) = self.release_shape();
        let number = release
            .strip_prefix(prefix)?
            .strip_suffix(suffix.as_str())?;
        let numeric = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit());
        numeric.then_some(release)
    }
}

impl Kernel {
    fn apt_search_pattern(self) -> &'static str {
        match self {
            Kernel::V6_12 => r"^linux-image-6\.12\.",
            Kernel::V6_1 => r"^linux-image-6\.1\.0-",
            Kernel::V7 => r"^linux-binary-7\.",
        }
    }
}

/// Picks the newest release of `kernel` from `apt-cache search` output
/// (`<package> - <description>` per line).
fn newest_release(guest: Guest, listing: &str) -> Option<String> {
    listing
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|package| guest.release_of(package))
        .max_by(|a, b| version_cmp(a, b))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "\
linux-image-6.12.99+deb12-amd64 - Linux 6.12 for 64-bit PCs (signed)
linux-image-6.12.117+deb12-amd64 - Linux 6.12 for 64-bit PCs (signed)
linux-image-6.12.117+deb12-cloud-amd64 - Linux 6.12 for x86-64 cloud (signed)
linux-image-6.12.118+deb12-rt-amd64 - Linux 6.12 for 64-bit PCs (signed), PREEMPT_RT
linux-image-6.12.119+deb12-amd64-dbg - Debug symbols for Linux 6.12.119+deb12-amd64
linux-image-6.12.120+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.12-amd64 - Linux for 64-bit PCs (meta-package)
linux-image-6.12.115+deb12-amd64 - Linux 6.12 for 64-bit PCs (signed)
linux-image-6.1.0-9-amd64 - Linux 6.1 for 64-bit PCs (signed)
linux-image-6.1.0-57-amd64 - Linux 6.1 for 64-bit PCs (signed)
linux-image-6.1.0-57-cloud-amd64 - Linux 6.1 for x86-64 cloud (signed)
linux-image-6.1.0-60-rt-amd64 - Linux 6.1 for 64-bit PCs (signed), PREEMPT_RT
linux-image-6.1.0-56-amd64 - Linux 6.1 for 64-bit PCs (signed)
linux-image-6.12.118+deb12-arm64 - Linux 6.12 for 64-bit ARMv8 machines (signed)
linux-image-6.12.119+deb12-arm64-16k - Linux 6.12 for 64-bit ARMv8 machines with 16k pages
linux-image-6.12.119+deb12-cloud-arm64 - Linux 6.12 for arm64 cloud
";

    #[test]
    fn arm64_picks_its_own_generic_flavour() {
        let guest = Guest {
            arch: Arch::Arm64,
            kernel: Kernel::V6_12,
        };
        assert_eq!(
            newest_release(guest, LISTING).as_deref(),
            Some("6.12.118+deb12-arm64")
        );
        assert_eq!(guest.name(), "arm64-6.12");
    }

    #[test]
    fn picks_newest_generic_6_12() {
        assert_eq!(
            newest_release(Guest::from(Kernel::V6_12), LISTING).as_deref(),
            Some("6.12.117+deb12-amd64")
        );
    }

    #[test]
    fn picks_newest_generic_6_1_numerically() {
        assert_eq!(
            newest_release(Guest::from(Kernel::V6_1), LISTING).as_deref(),
            Some("6.1.0-57-amd64")
        );
    }

    #[test]
    fn no_candidate_gives_none() {
        let listing = "linux-image-6.12.117+deb12-cloud-amd64 - cloud only\n";
        assert_eq!(newest_release(Guest::from(Kernel::V6_12), listing), None);
        assert_eq!(newest_release(Guest::from(Kernel::V6_1), ""), None);
    }

    #[test]
    fn lines_do_not_cross() {
        assert_eq!(
            Guest::from(Kernel::V6_1).release_of("linux-image-6.12.117+deb12-amd64"),
            None
        );
        assert_eq!(
            Guest::from(Kernel::V6_12).release_of("linux-image-6.1.0-57-amd64"),
            None
        );
    }

    #[test]
    fn find_all_finds_overlapping_and_edge_matches() {
        assert_eq!(find_all(b"aaXZaXZ", b"XZ"), [2, 5]);
        assert_eq!(find_all(b"aaa", b"aa"), [0, 1]);
        assert!(find_all(b"a", b"aa").is_empty());
    }

    #[test]
    fn package_glob_names_the_shape() {
        assert_eq!(
            Guest::from(Kernel::V6_12).package_glob(),
            "linux-image-6.12.*+deb12-amd64"
        );
        assert_eq!(
            Guest::from(Kernel::V6_1).package_glob(),
            "linux-image-6.1.0-*-amd64"
        );
    }
}
