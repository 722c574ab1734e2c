//! Runs QEMU (TCG) for one job and turns what it leaves behind into the
//! job's exit code.
//!
//! Output: the serial port ttyS0 is the kernel console, written to a log
//! file. Two virtio-serial ports named `shaper.stdout` and `shaper.stderr`
//! carry the job's stdout and stderr to QEMU's own stdout and stderr
//! (through /proc/self/fd), which are pipes that this module copies to the
//! caller's. virtio-serial moves whole buffers per notification; an
//! emulated 8250 UART managed only about 180 KB/s under TCG. QEMU reads nothing from stdin, so the caller's stdin may
//! be closed.
//!
//! Invariants: QEMU never outlives the timeout; the guest gets no network
//! device (`-nodefaults`); `/dev/kvm` is not used (it is a PVM variant here
//! that fails stock kernels with "emulation failure").
//!
//! Non-goals: snapshots, interactive consoles, a QEMU monitor.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::Arch;

/// Console lines shown when the guest dies without an exit code.
const CONSOLE_TAIL_LINES: usize = 40;

/// Kernel command line after the console. `quiet` keeps the console log
/// short (only warnings and worse); `panic=-1` reboots at once on a panic,
/// and `-no-reboot` turns that into QEMU exiting; `mitigations=off` spares
/// TCG the page-table switches of PTI (or arm64's KPTI) on every syscall (a
/// test VM has nothing to protect).
const KERNEL_CMDLINE: &str = "quiet panic=-1 mitigations=off";

/// What one VM needs: the kernel, this run's initramfs, the two 9p shares
/// and where the console goes.
pub(crate) struct Machine<'a> {
    pub arch: Arch,
    /// A bzImage, or an uncompressed ELF kernel with a PVH entry point
    /// (x86); an Image, compressed or not (arm64).
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    /// Shared read-only with mount tag `hostroot`.
    pub root_share: &'a Path,
    /// Shared read-write with mount tag `workspace`.
    pub workspace: &'a Path,
    pub console_log: &'a Path,
}

/// How QEMU ended.
pub(crate) enum Outcome {
    Exited(ExitStatus),
    /// Killed at the overall deadline.
    TimedOut,
    /// Killed because the guest had not started the job by the boot
    /// deadline.
    BootTimedOut,
}

impl Outcome {
    /// Whether the guest failed before starting the job in a way another
    /// boot may not repeat: its kernel died (with `-no-reboot` QEMU exits
    /// with success when the guest resets, which `panic=-1` does on a panic)
    /// or it hung while booting. A QEMU error is not one: it would repeat.
    pub(crate) fn is_boot_failure(&self, started: &Path) -> bool {
        let retryable = match self {
            Outcome::Exited(status) => status.success(),
            Outcome::BootTimedOut => true,
            Outcome::TimedOut => false,
        };
        retryable && !started.exists()
    }
}

/// Escapes a value for QEMU's `key=value,...` option syntax, where a literal
/// comma is written as two.
fn opt_escape(path: &Path) -> Result<String> {
    let s = path
        .to_str()
        .with_context(|| format!("path {} is not UTF-8", path.display()))?;
    Ok(s.replace(',', ",,"))
}

/// QEMU's arguments for `machine`.
fn args(machine: &Machine) -> Result<Vec<OsString>> {
    let console = opt_escape(machine.console_log)?;
    let root = opt_escape(machine.root_share)?;
    let workspace = opt_escape(machine.workspace)?;
    // arm64: QEMU's generic `virt` board with the OpenWrt One's core, the
    // Cortex-A53 (ARMv8.0: none of `max`'s pointer authentication, whose
    // emulation is slow under TCG); its console is the PL011, ttyAMA0.
    let (board, cpu, console_dev) = match machine.arch {
        Arch::X86_64 => ("q35", "max", "ttyS0"),
        Arch::Arm64 => ("virt", "cortex-a53", "ttyAMA0"),
    };
    let cmdline = format!("console={console_dev} {KERNEL_CMDLINE}");
    let mut args: Vec<OsString> = [
        "-machine",
        board,
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        cpu,
        "-smp",
        "2",
        "-m",
        "2G",
        "-nographic",
        "-nodefaults",
        "-no-user-config",
        "-no-reboot",
        "-chardev",
        &format!("file,id=console,path={console}"),
        "-serial",
        "chardev:console",
        "-device",
        "virtio-serial-pci,id=vser",
        "-chardev",
        "file,id=out,path=/proc/self/fd/1",
        "-device",
        "virtserialport,bus=vser.0,chardev=out,name=shaper.stdout",
        "-chardev",
        "file,id=err,path=/proc/self/fd/2",
        "-device",
        "virtserialport,bus=vser.0,chardev=err,name=shaper.stderr",
        "-fsdev",
        &format!("local,id=hostroot,path={root},security_model=none,readonly=on,multidevs=remap"),
        "-device",
        "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
        "-fsdev",
        &format!("local,id=workspace,path={workspace},security_model=none,multidevs=remap"),
        "-device",
        "virtio-9p-pci,fsdev=workspace,mount_tag=workspace",
        "-append",
        &cmdline,
    ]
    .iter()
    .map(OsString::from)
    .collect();
    // -kernel and -initrd take the path as is, without option parsing.
    args.extend([
        "-kernel".into(),
        machine.kernel.into(),
        "-initrd".into(),
        machine.initrd.into(),
    ]);
    Ok(args)
}

/// Boots `machine` and waits for QEMU to exit, copying the job's output to
/// the caller's stdout and stderr meanwhile. QEMU is killed at `deadline`, or
/// at `boot_deadline` if the file `started` (written by the guest's init
/// just before the job) does not exist by then.
pub(crate) fn boot(
    qemu: &Path,
    machine: &Machine,
    deadline: Instant,
    boot_deadline: Instant,
    started: &Path,
) -> Result<Outcome> {
    let mut child = Command::new(qemu)
        .args(args(machine)?)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", qemu.display()))?;
    let out = child.stdout.take().context("QEMU has no stdout pipe")?;
    let err = child.stderr.take().context("QEMU has no stderr pipe")?;
    let copiers = [forward(out, std::io::stdout), forward(err, std::io::stderr)];

    let outcome = wait_or_kill(&mut child, deadline, boot_deadline, started);
    for copier in copiers {
        match copier.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("xtask vm: warning: lost some guest output: {e:#}"),
            Err(_) => eprintln!("xtask vm: warning: the output copier panicked"),
        }
    }
    outcome
}

/// Copies `from` to the writer `to()` returns until end of file, flushing
/// after every read so that output appears as the guest produces it.
fn forward<R, W, F>(mut from: R, to: F) -> JoinHandle<Result<()>>
where
    R: Read + Send + 'static,
    W: Write,
    F: FnOnce() -> W + Send + 'static,
{
    std::thread::spawn(move || {
        let mut to = to();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).context("cannot read QEMU's output"),
            };
            // Keep draining QEMU even if our own stdout is gone (a closed
            // pipe), so that it never blocks on a full pipe.
            if to.write_all(&buf[..n]).and_then(|()| to.flush()).is_err() {
                std::io::copy(&mut from, &mut std::io::sink())
                    .context("cannot drain QEMU's output")?;
                return Ok(());
            }
        }
    })
}

fn wait_or_kill(
    child: &mut Child,
    deadline: Instant,
    boot_deadline: Instant,
    started: &Path,
) -> Result<Outcome> {
    loop {
        if let Some(status) = child.try_wait().context("cannot wait for QEMU")? {
            return Ok(Outcome::Exited(status));
        }
        let now = Instant::now();
        let outcome = if now >= deadline {
            Outcome::TimedOut
        } else if now >= boot_deadline && !started.exists() {
            Outcome::BootTimedOut
        } else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        child.kill().context("cannot kill QEMU after the timeout")?;
        child.wait().context("cannot reap QEMU after killing it")?;
        return Ok(outcome);
    }
}

/// The first line of the console that tells why the kernel died, if any.
pub(crate) fn crash_summary(console_log: &Path) -> Option<String> {
    const MARKERS: &[&str] = &[
        "Kernel panic",
        "BUG:",
        "Oops",
        "general protection fault",
        "invalid opcode",
    ];
    let text = printable(&String::from_utf8_lossy(&std::fs::read(console_log).ok()?));
    text.lines()
        .find(|line| MARKERS.iter().any(|m| line.contains(m)))
        .map(|line| line.trim().to_owned())
}

/// The job's exit code from `exit_file`, or an error explaining why there is
/// none, with the end of the console log.
/// The guest stopped after the job started without reporting its exit code:
/// a kernel panic or a broken init. Callers whose job has no effect outside
/// the disposable guest may run it again.
#[derive(Debug)]
pub struct GuestCrash {
    how: String,
    first_crash_line: Option<String>,
    tail: String,
}

impl std::fmt::Display for GuestCrash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} without reporting the job's exit code (kernel panic or failed guest init?)",
            self.how
        )?;
        if let Some(line) = &self.first_crash_line {
            write!(f, "\nfirst crash line on the console: {line}")?;
        }
        write!(f, "\n{}", self.tail)
    }
}

impl std::error::Error for GuestCrash {}

impl GuestCrash {
    /// The console's first line that marks a kernel crash, if it printed one.
    pub fn first_crash_line(&self) -> Option<&str> {
        self.first_crash_line.as_deref()
    }
}

pub(crate) fn job_exit_code(
    outcome: &Outcome,
    exit_file: &Path,
    console_log: &Path,
    timeout: Duration,
) -> Result<i32> {
    if let Outcome::BootTimedOut = outcome {
        bail!(
            "the guest did not start the job within the boot deadline and was killed\n{}",
            console_tail(console_log)
        );
    }
    if let Outcome::TimedOut = outcome {
        bail!(
            "the VM did not finish within {} s and was killed (raise SHAPER_VM_TIMEOUT_S if the job needs longer)\n{}",
            timeout.as_secs(),
            console_tail(console_log)
        );
    }
    match std::fs::read_to_string(exit_file) {
        Ok(text) => text.trim().parse::<i32>().with_context(|| {
            format!(
                "the guest wrote an unreadable exit code '{}' to {}",
                text.trim(),
                exit_file.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let how = match outcome {
                Outcome::Exited(status) if status.success() => "the guest stopped".to_owned(),
                Outcome::Exited(status) => {
                    format!("QEMU failed ({status}; its messages are above)")
                }
                Outcome::TimedOut | Outcome::BootTimedOut => "the VM timed out".to_owned(),
            };
            Err(GuestCrash {
                how,
                first_crash_line: crash_summary(console_log),
                tail: console_tail(console_log),
            }
            .into())
        }
        Err(e) => Err(e).with_context(|| {
            format!(
                "cannot read the job's exit code from {}",
                exit_file.display()
            )
        }),
    }
}

fn console_tail(console_log: &Path) -> String {
    match std::fs::read(console_log) {
        Ok(bytes) => {
            let text = printable(&String::from_utf8_lossy(&bytes));
            let tail = last_lines(&text, CONSOLE_TAIL_LINES);
            if tail.is_empty() {
                "the guest console is empty".to_owned()
            } else {
                format!("last lines of the guest console:\n{tail}")
            }
        }
        Err(e) => format!("no guest console log at {}: {e}", console_log.display()),
    }
}

/// `text` without terminal escape sequences (SeaBIOS clears the screen) and
/// control characters other than newline and tab.
fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC '[' parameters, then a final byte in '@'..='~'.
            // Otherwise a two-character escape such as ESC 'c'.
            if chars.next_if_eq(&'[').is_some() {
                while chars.next().is_some_and(|p| !('@'..='~').contains(&p)) {}
            } else {
                chars.next();
            }
        } else if c == '\n' || c == '\t' || !c.is_control() {
            out.push(c);
        }
    }
    out
}

/// The last `n` non-empty-trailing lines of `text`.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commas_are_doubled() -> Result<()> {
        assert_eq!(opt_escape(Path::new("/a,b/c"))?, "/a,,b/c");
        Ok(())
    }

    #[test]
    fn printable_drops_escapes_and_carriage_returns() {
        let raw = "\x1bc\x1b[?7l\x1b[2J\x1b[0mSeaBIOS\r\nBoot\x07ing\tok\n";
        assert_eq!(printable(raw), "SeaBIOS\nBooting\tok\n");
    }

    #[test]
    fn boot_failures_are_clean_exits_or_boot_timeouts_without_a_start() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("xtask-vm-boot-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let started = dir.join("started");
        let ok = Outcome::Exited(Command::new("true").status()?);
        let failed = Outcome::Exited(Command::new("false").status()?);
        assert!(ok.is_boot_failure(&started));
        assert!(Outcome::BootTimedOut.is_boot_failure(&started));
        assert!(!failed.is_boot_failure(&started));
        assert!(!Outcome::TimedOut.is_boot_failure(&started));
        std::fs::write(&started, "")?;
        assert!(!ok.is_boot_failure(&started));
        let log = dir.join("console.log");
        std::fs::write(
            &log,
            "a\r\n[    3.0] Oops: invalid opcode: 0000 [#1] SMP\r\n[ 3.1] Kernel panic\n",
        )?;
        assert_eq!(
            crash_summary(&log).as_deref(),
            Some("[    3.0] Oops: invalid opcode: 0000 [#1] SMP")
        );
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    #[test]
    fn last_lines_keeps_the_end() {
        assert_eq!(last_lines("a\nb\nc\n\n", 2), "b\nc");
        assert_eq!(last_lines("a\n", 5), "a");
        assert_eq!(last_lines("", 5), "");
    }

    #[test]
    fn args_use_tcg_and_share_both_trees() -> Result<()> {
        let machine = Machine {
            arch: Arch::X86_64,
            kernel: Path::new("/c/vmlinuz"),
            initrd: Path::new("/r/initrd.cpio"),
            root_share: Path::new("/"),
            workspace: Path::new("/w,x"),
            console_log: Path::new("/r/console.log"),
        };
        let args: Vec<String> = args(&machine)?
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let after = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .cloned()
        };
        assert_eq!(after("-accel").as_deref(), Some("tcg,thread=multi"));
        assert_eq!(after("-kernel").as_deref(), Some("/c/vmlinuz"));
        assert!(
            args.iter()
                .any(|a| a.contains("path=/,security_model=none,readonly=on,multidevs=remap"))
        );
        assert!(
            args.iter()
                .any(|a| a.starts_with("local,id=workspace,path=/w,,x,"))
        );
        assert!(!args.iter().any(|a| a.contains("kvm")));
        assert!(after("-append").is_some_and(|c| c.starts_with("console=ttyS0 ")));

        let arm = Machine {
            arch: Arch::Arm64,
            ..machine
        };
        let args: Vec<String> = super::args(&arm)?
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let pair = |flag: &str, value: &str| args.windows(2).any(|w| w[0] == flag && w[1] == value);
        assert!(
            pair("-machine", "virt") && pair("-cpu", "cortex-a53"),
            "{args:?}"
        );
        assert!(args.iter().any(|a| a.starts_with("console=ttyAMA0 ")));
        Ok(())
    }

    #[test]
    fn missing_exit_code_is_an_error_with_console() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("xtask-vm-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let log = dir.join("console.log");
        std::fs::write(&log, "boot\r\nKernel panic - not syncing: test\r\n")?;
        let ok = Outcome::Exited(Command::new("true").status()?);
        let err = job_exit_code(&ok, &dir.join("exit-code"), &log, Duration::from_secs(1)).err();
        assert!(err.is_some_and(|e| e.to_string().contains("Kernel panic - not syncing: test")));
        std::fs::write(dir.join("exit-code"), "7\n")?;
        assert_eq!(
            job_exit_code(&ok, &dir.join("exit-code"), &log, Duration::from_secs(1))?,
            7
        );
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
