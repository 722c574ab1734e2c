//! `cargo xtask vm`: boots a stock Debian kernel in QEMU and runs one command
//! inside it, as if it ran on the host.
//!
//! What it does:
//! - On first use per kernel line, fetches the newest Debian kernel of that
//!   line with apt (bookworm's `linux-image` for 6.12 and 6.1, the split
//!   packages of trixie-backports for 7.x, see [`backports`]), unpacks it, indexes its modules and builds a small
//!   busybox initramfs, all under `<workspace>/target/vm/<line>/`
//!   ([`kernel`], [`initramfs`]).
//! - Per run, writes a job script and an init configuration into a fresh run
//!   directory `<workspace>/target/vm/run-<pid>-<n>/` ([`job`]), boots QEMU
//!   under TCG ([`qemu`]) and returns the job's exit code.
//! - In the guest, `init.sh` mounts the host root read-only over virtio-9p,
//!   the usual pseudo file systems and tmpfs on /tmp, /run, /var/tmp and
//!   /root, then the workspace read-write at its host path, and runs the job
//!   chrooted into the host root.
//!
//! Invariants:
//! - The host's /boot and /lib/modules are never touched; every kernel file
//!   lives in the cache.
//! - A cache directory either is complete or does not exist: it is prepared
//!   under a temporary name and renamed into place ([`cache`]). A warm run
//!   makes no apt calls.
//! - The job's stdout and stderr travel on their own virtio-serial ports;
//!   the kernel console (ttyS0) goes to a log file that is shown only when
//!   the guest dies without reporting an exit code. The exit code comes
//!   back through a file in the run directory, never through QEMU's status.
//! - The guest has no network device: its traffic stays in its own loopback
//!   and namespaces.
//!
//! An arm64 guest (`--arch arm64`) boots Debian's generic arm64 kernel under
//! `qemu-system-aarch64` the same way, with two differences: its root is an
//! arm64 Debian root unpacked for it ([`rootfs`]) instead of the host's, and
//! the project's programs in the workspace must be the static aarch64
//! builds ([`crate::cross`]).
//!
//! Non-goals: stdin for the job (it gets /dev/null), interactive shells,
//! persistent guest state between runs, kernels other than Debian's generic
//! amd64 and arm64 flavours.

mod backports;
mod cache;
mod debs;
pub(crate) mod elf;
mod guard;
mod initramfs;
mod job;
mod kernel;
mod qemu;
mod rootfs;
pub(crate) use guard::hold_tcx_key;
pub use qemu::GuestCrash;

use std::ffi::OsStr;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Debian packages the VM needs on the host: QEMU, a static busybox for the
/// initramfs, kmod (depmod on the host, modprobe in the guest), cpio, xz
/// (6.12's `.ko.xz` modules, 6.1's kernel image) and zstd (6.12's kernel
/// image).
pub const HOST_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "qemu-system-arm",
    "mmdebstrap",
    "busybox-static",
    "kmod",
    "cpio",
    "xz-utils",
    "zstd",
];

/// Every host program the VM uses and the Debian package that provides it.
/// apt and dpkg come with Debian itself; the rest are in [`HOST_PACKAGES`].
const TOOL_PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("qemu-system-aarch64", "qemu-system-arm"),
    ("mmdebstrap", "mmdebstrap"),
    ("busybox", "busybox-static"),
    ("cpio", "cpio"),
    ("depmod", "kmod"),
    ("modprobe", "kmod"),
    ("xz", "xz-utils"),
    ("zstd", "zstd"),
    ("apt-cache", "apt"),
    ("apt-get", "apt"),
    ("dpkg", "dpkg"),
];

/// Overall limit for one run, overridable with `SHAPER_VM_TIMEOUT_S`. The
/// test stage's run is the longest: about 25 minutes per kernel on a quiet
/// 2-core machine, 30 and more when the host is busy.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3000);

/// Boots per run. QEMU 7.2's multi-threaded TCG occasionally crashes a
/// guest kernel while it patches its own code (seen once in about a hundred
/// boots, as an oops in a just-patched static branch); a boot that dies
/// before the job starts is safe to repeat. Failures after the job started
/// are never retried: the job may have had effects.
const BOOT_ATTEMPTS: u32 = 3;

/// How long a boot may take to reach the job (normally 5 to 8 s) before it
/// counts as hung and is retried.
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

/// Set (to anything) to keep the run directory for debugging.
const KEEP_RUN_DIR_VAR: &str = "SHAPER_VM_KEEP_RUN_DIR";

/// Which stock Debian kernel to boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kernel {
    /// Debian 12's 6.12 from bookworm's security updates (has TCX).
    #[value(name = "6.12")]
    V6_12,
    /// Debian 12's 6.1 LTS (no TCX: netlink attach).
    #[value(name = "6.1")]
    V6_1,
    /// The newest Linux 7.x in Debian's trixie-backports (7.3 when this was
    /// written): cake_mq, struct_ops qdiscs (`CONFIG_NET_SCH_BPF`), BTF.
    #[value(name = "7", alias = "7.3")]
    V7,
}

/// The guest's architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    /// x86-64, sharing the host's root.
    #[value(name = "x86_64", alias = "amd64")]
    X86_64,
    /// 64-bit Arm under qemu-system-aarch64, with an arm64 root of its own.
    #[value(name = "arm64", alias = "aarch64")]
    Arm64,
}

impl Arch {
    /// Debian's name for it.
    pub fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }
}

/// Which machine to boot: an architecture and a kernel line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guest {
    pub arch: Arch,
    pub kernel: Kernel,
}

impl From<Kernel> for Guest {
    fn from(kernel: Kernel) -> Guest {
        Guest {
            arch: Arch::X86_64,
            kernel,
        }
    }
}

impl Guest {
    /// The cache directory's name and the name in messages: the line for
    /// x86 ("6.12"), prefixed by the architecture otherwise ("arm64-6.12").
    pub fn name(self) -> String {
        match self.arch {
            Arch::X86_64 => self.kernel.line().to_owned(),
            Arch::Arm64 => format!("arm64-{}", self.kernel.line()),
        }
    }
}

impl Kernel {
    /// The kernel line as the user writes it ("6.12"); also the x86 cache
    /// directory's name.
    pub fn line(self) -> &'static str {
        match self {
            Kernel::V6_12 => "6.12",
            Kernel::V6_1 => "6.1",
            Kernel::V7 => "7",
        }
    }
}

/// The cached kernel's config file (fetching the kernel first if needed).
pub fn kernel_config(workspace: &Path, guest: impl Into<Guest>) -> Result<PathBuf> {
    let guest = guest.into();
    let workspace = canonical_workspace(workspace)?;
    let tools = Tools::find(guest.arch)?;
    prepare_guest(&workspace, guest, &tools)?;
    let cache = kernel::vm_dir(&workspace).join(guest.name());
    let release = std::fs::read_to_string(cache.join("release"))
        .with_context(|| format!("reading the cached {} kernel's release", guest.name()))?;
    kernel::config_file(&cache.join("tree"), release.trim()).with_context(|| {
        format!(
            "the cached {} kernel has no config: remove {} and run again",
            guest.name(),
            cache.display()
        )
    })
}

/// The guest's root and its kernel, each fetched and cached first if
/// needed: the host's root on x86 (with the host's static busybox for the
/// initramfs), the cached arm64 root on arm64 (with its own busybox).
fn prepare_guest(
    workspace: &Path,
    guest: Guest,
    tools: &Tools,
) -> Result<(PathBuf, kernel::Cached)> {
    let (root, busybox) = match guest.arch {
        Arch::X86_64 => (PathBuf::from("/"), tools.busybox.clone()),
        Arch::Arm64 => {
            let mmdebstrap = tools
                .mmdebstrap
                .as_deref()
                .context("mmdebstrap not found: install the Debian package mmdebstrap")?;
            let root = rootfs::prepare_arm64(&kernel::vm_dir(workspace), mmdebstrap)?;
            rootfs::add_mount_point(&root, workspace)?;
            let busybox = rootfs::busybox(&root);
            (root, busybox)
        }
    };
    let cached = kernel::prepare(workspace, guest, tools, &busybox)?;
    Ok((root, cached))
}

/// Boots `kernel`, runs `cmd` (argv) in the guest with the host root shared
/// read-only and `workspace` shared read-write at the same path, streams its
/// output and returns its exit code.
pub fn run(workspace: &Path, guest: impl Into<Guest>, cmd: &[String]) -> Result<i32> {
    let guest = guest.into();
    if cmd.is_empty() {
        bail!(
            "no command given: usage is `cargo xtask vm [--arch x86_64|arm64] \
             [--kernel 6.12|6.1|7] -- CMD [ARGS...]`"
        );
    }
    let workspace = canonical_workspace(workspace)?;
    check_program_arch(guest.arch, &cmd[0], &workspace)?;
    let tools = Tools::find(guest.arch)?;
    let timeout = timeout_from_env()?;
    remove_stale_run_dirs(&kernel::vm_dir(&workspace));
    let (root, cached) = prepare_guest(&workspace, guest, &tools)?;

    let run_dir = RunDir::create(&workspace)?;
    let caller_cwd = std::env::current_dir().context("cannot read the current directory")?;
    let cwd = job::guest_cwd(&caller_cwd, &workspace);
    if cwd != caller_cwd {
        eprintln!(
            "xtask vm: warning: {} is hidden by a tmpfs in the guest; running in {}",
            caller_cwd.display(),
            cwd.display()
        );
    }
    let env = job::passthrough_env(std::env::vars_os(), std::io::stdout().is_terminal());
    // The TCX key guard guards against x86's text_poke_bp (see guard.rs);
    // arm64 rewrites a jump label's one instruction in a single store, so
    // it has no transient state to guard, and the host's xtask could not
    // run there anyway.
    let guard_exe = match guest.arch {
        Arch::X86_64 => {
            Some(std::env::current_exe().context("cannot find xtask's own executable")?)
        }
        Arch::Arm64 => None,
    };
    let script = job::job_script(&env, &cwd, guard_exe.as_deref(), cmd)?;
    let job_path = run_dir.path.join("job.sh");
    std::fs::write(&job_path, script)
        .with_context(|| format!("cannot write the job script {}", job_path.display()))?;

    let config = job::init_config(&workspace, &run_dir.path, &cached.modules_root)?;
    let initrd = run_dir.path.join("initrd.cpio");
    initramfs::write_run_initrd(&tools, &cached.base_initrd, &run_dir.path, &config, &initrd)?;

    let machine = qemu::Machine {
        arch: guest.arch,
        kernel: &cached.kernel,
        initrd: &initrd,
        root_share: &root,
        workspace: &workspace,
        console_log: &run_dir.path.join("console.log"),
    };
    let exit_file = run_dir.path.join("exit-code");
    let started = run_dir.path.join("started");
    let deadline = Instant::now() + timeout;
    let mut attempt = 1;
    loop {
        let boot_deadline = Instant::now() + BOOT_TIMEOUT;
        let outcome = qemu::boot(&tools.qemu, &machine, deadline, boot_deadline, &started)?;
        if attempt == BOOT_ATTEMPTS || !outcome.is_boot_failure(&started) {
            return qemu::job_exit_code(&outcome, &exit_file, machine.console_log, timeout);
        }
        let why = qemu::crash_summary(machine.console_log)
            .unwrap_or_else(|| "no crash message".to_owned());
        eprintln!(
            "xtask vm: warning: the guest died before starting the job ({why}); \
             booting again (attempt {} of {BOOT_ATTEMPTS})",
            attempt + 1
        );
        attempt += 1;
    }
}

/// Refuses (exit 2) a program of the workspace that is an ELF file for the
/// other architecture: the guest could only say "Exec format error".
/// Only the workspace is the same files on both sides; on arm64 any other
/// path, and a command found on PATH, is the guest root's own.
fn check_program_arch(arch: Arch, program: &str, workspace: &Path) -> Result<()> {
    if !program.contains('/') {
        return Ok(());
    }
    let Ok(path) = std::path::absolute(program) else {
        return Ok(());
    };
    if !path.starts_with(workspace) {
        return Ok(());
    }
    let Ok(bytes) = std::fs::read(&path) else {
        return Ok(());
    };
    let (want, build) = match arch {
        Arch::X86_64 => (elf::EM_X86_64, "cargo xtask build"),
        Arch::Arm64 => (elf::EM_AARCH64, "cargo xtask dist --target aarch64"),
    };
    match elf::machine(&bytes) {
        Ok(machine) if machine != want => Err(crate::UsageError(format!(
            "{program} is built for another architecture (ELF machine {machine}): the {} guest \
             runs {} programs, e.g. from `{build}`",
            arch.debian(),
            arch.debian()
        ))
        .into()),
        _ => Ok(()),
    }
}

fn canonical_workspace(workspace: &Path) -> Result<PathBuf> {
    workspace
        .canonicalize()
        .with_context(|| format!("cannot resolve the workspace path {}", workspace.display()))
}

fn timeout_from_env() -> Result<Duration> {
    match std::env::var("SHAPER_VM_TIMEOUT_S") {
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_TIMEOUT),
        Err(std::env::VarError::NotUnicode(_)) => bail!("invalid SHAPER_VM_TIMEOUT_S: not UTF-8"),
        Ok(s) => match s.trim().parse::<u64>() {
            Ok(secs) if secs > 0 => Ok(Duration::from_secs(secs)),
            _ => bail!(
                "invalid SHAPER_VM_TIMEOUT_S '{s}': expected a whole number of seconds above 0"
            ),
        },
    }
}

/// Absolute paths of the host programs the VM needs.
pub(crate) struct Tools {
    /// QEMU for the guest's architecture.
    pub qemu: PathBuf,
    /// For the arm64 root only.
    pub mmdebstrap: Option<PathBuf>,
    pub busybox: PathBuf,
    pub cpio: PathBuf,
    pub depmod: PathBuf,
    pub xz: PathBuf,
    pub zstd: PathBuf,
    pub apt_cache: PathBuf,
    pub apt_get: PathBuf,
    pub dpkg: PathBuf,
}

impl Tools {
    /// Finds every tool a guest of `arch` needs, or fails naming the Debian
    /// package to install.
    fn find(arch: Arch) -> Result<Tools> {
        let tools = Tools {
            qemu: find_tool(match arch {
                Arch::X86_64 => "qemu-system-x86_64",
                Arch::Arm64 => "qemu-system-aarch64",
            })?,
            mmdebstrap: match arch {
                Arch::X86_64 => None,
                Arch::Arm64 => Some(find_tool("mmdebstrap")?),
            },
            busybox: find_tool("busybox")?,
            cpio: find_tool("cpio")?,
            depmod: find_tool("depmod")?,
            xz: find_tool("xz")?,
            zstd: find_tool("zstd")?,
            apt_cache: find_tool("apt-cache")?,
            apt_get: find_tool("apt-get")?,
            dpkg: find_tool("dpkg")?,
        };
        // The guest runs the host's modprobe (the root is shared), so it
        // must exist on the host too.
        find_tool("modprobe")?;
        initramfs::check_static(&tools.busybox)?;
        Ok(tools)
    }
}

/// Looks `name` up on PATH and in the sbin directories (depmod lives in
/// /usr/sbin, which a non-root PATH lacks).
fn find_tool(name: &str) -> Result<PathBuf> {
    let package = TOOL_PACKAGES
        .iter()
        .find(|(tool, _)| *tool == name)
        .map_or("?", |(_, package)| *package);
    let path = std::env::var_os("PATH").unwrap_or_default();
    let fixed = [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ];
    std::env::split_paths(&path)
        .chain(fixed.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .with_context(|| {
            format!("{name} not found: install the Debian package {package} (cargo xtask setup does this)")
        })
}

/// A per-run directory under `<workspace>/target/vm/`, visible read-write in
/// the guest. It is removed on drop unless `SHAPER_VM_KEEP_RUN_DIR` is set.
struct RunDir {
    path: PathBuf,
}

impl RunDir {
    fn create(workspace: &Path) -> Result<RunDir> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let base = kernel::vm_dir(workspace);
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = base.join(format!("run-{pid}-{n}"));
        if path.exists() {
            std::fs::remove_dir_all(&path).with_context(|| {
                format!("cannot clear the old run directory {}", path.display())
            })?;
        }
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create the run directory {}", path.display()))?;
        Ok(RunDir { path })
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if std::env::var_os(KEEP_RUN_DIR_VAR).is_some() {
            eprintln!("xtask vm: kept the run directory {}", self.path.display());
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!(
                "xtask vm: warning: cannot remove {}: {e}",
                self.path.display()
            );
        }
    }
}

/// Removes `run-<pid>-*` and `.prepare-*-<pid>` directories left behind by
/// processes that no longer exist (an interrupted run). Best effort.
fn remove_stale_run_dirs(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The pid in a run or preparation directory's name, if it is one.
fn owner_pid(name: &OsStr) -> Option<u32> {
    let name = name.to_str()?;
    if let Some(rest) = name.strip_prefix("run-") {
        return rest.split('-').next()?.parse().ok();
    }
    if name.starts_with(".prepare-") {
        return name.rsplit('-').next()?.parse().ok();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_workspace_programs_of_the_other_architecture_are_refused() -> Result<()> {
        // This test binary is an x86-64 program of the workspace.
        let exe = std::env::current_exe()?;
        let exe_s = exe.to_str().context("utf-8 path")?;
        let workspace = exe.parent().context("a directory")?;
        let refused = check_program_arch(Arch::Arm64, exe_s, workspace)
            .expect_err("an x86-64 program for the arm64 guest");
        assert!(refused.is::<crate::UsageError>(), "{refused:#}");
        check_program_arch(Arch::X86_64, exe_s, workspace)?;
        // Outside the workspace a path is the guest root's: not checked.
        check_program_arch(Arch::Arm64, exe_s, Path::new("/nonexistent-workspace"))?;
        check_program_arch(Arch::Arm64, "awk", workspace)?;
        Ok(())
    }

    #[test]
    fn owner_pid_reads_run_and_prepare_dirs() {
        assert_eq!(owner_pid(OsStr::new("run-1234-0")), Some(1234));
        assert_eq!(owner_pid(OsStr::new(".prepare-6.12-77")), Some(77));
        assert_eq!(owner_pid(OsStr::new("6.12")), None);
        assert_eq!(owner_pid(OsStr::new("run-x-0")), None);
    }

    #[test]
    fn every_tool_package_is_a_host_package() {
        for (tool, package) in TOOL_PACKAGES {
            let base = ["apt", "dpkg"].contains(package);
            assert!(
                base || HOST_PACKAGES.contains(package),
                "{tool}: {package} missing from HOST_PACKAGES"
            );
        }
    }

    #[test]
    fn kernel_lines_match_clap_names() {
        use clap::ValueEnum;
        for k in Kernel::value_variants() {
            let name = k.to_possible_value().map(|v| v.get_name().to_owned());
            assert_eq!(name.as_deref(), Some(k.line()));
        }
    }
}
