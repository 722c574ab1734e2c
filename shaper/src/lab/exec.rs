//! Running external programs for the lab: one place that turns a
//! [`Command`] into output or a [`LabError`] naming the command line, and
//! that owns long-running children (stopped on drop) with their output in a
//! log file rather than a pipe nobody drains.
//!
//! Invariants: a [`Daemon`] is always reaped: [`Daemon::stop`] or its drop
//! signals and waits, escalating to SIGKILL after a grace period.

use std::{
    fs::File,
    io::Write as _,
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    thread::sleep,
    time::{Duration, Instant},
};

use tracing::{debug, warn};

use super::LabError;

/// The command line of `cmd`, for messages.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion; its stdout on success, else
/// [`LabError::CommandFailed`] with both streams.
pub(crate) fn run(cmd: &mut Command) -> Result<String, LabError> {
    run_with_input(cmd, None)
}

/// Runs `cmd` with `input` (if any) on its stdin, e.g. `ip -batch -`
/// commands: one process instead of one per command, which matters where
/// every exec is slow (the VM reads binaries over 9p under emulation).
pub(crate) fn run_with_input(cmd: &mut Command, input: Option<&str>) -> Result<String, LabError> {
    let command = match input {
        Some(i) => format!("{} <<< {:?}", describe(cmd), i),
        None => describe(cmd),
    };
    debug!(%command, "run");
    let spawn_err = |source| LabError::Spawn {
        command: command.clone(),
        source,
    };
    let out = match input {
        None => cmd.stdin(Stdio::null()).output().map_err(spawn_err)?,
        Some(text) => {
            let mut child = cmd
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(spawn_err)?;
            // A small script fits the pipe, so writing before reading cannot
            // deadlock; dropping the handle closes stdin.
            if let Some(mut stdin) = child.stdin.take() {
                stdin.write_all(text.as_bytes()).map_err(spawn_err)?;
            }
            child.wait_with_output().map_err(spawn_err)?
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        return Ok(stdout);
    }
    Err(LabError::CommandFailed {
        command,
        status: out.status.to_string(),
        output: format!("{stdout}{}", String::from_utf8_lossy(&out.stderr))
            .trim()
            .to_owned(),
    })
}

static LOG_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A long-running child whose stdout and stderr go to a log file; stopped
/// (SIGTERM, then SIGKILL after a grace period) and reaped on drop.
pub(crate) struct Daemon {
    child: Option<Child>,
    command: String,
    log: PathBuf,
}

impl Daemon {
    /// Spawns `cmd` with its output in a fresh log file under the temporary
    /// directory, named after `tag`.
    pub(crate) fn spawn(cmd: &mut Command, tag: &str) -> Result<Self, LabError> {
        let command = describe(cmd);
        let n = LOG_COUNTER.fetch_add(1, Ordering::Relaxed);
        let log = std::env::temp_dir().join(format!("shl-{}-{n}-{tag}.log", std::process::id()));
        let io_err = |source| LabError::Io {
            what: "creating the log file",
            path: log.display().to_string(),
            source,
        };
        let out = File::create(&log).map_err(io_err)?;
        let err = out.try_clone().map_err(io_err)?;
        debug!(%command, log = %log.display(), "spawn");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| LabError::Spawn {
                command: command.clone(),
                source,
            })?;
        Ok(Self {
            child: Some(child),
            command,
            log,
        })
    }

    /// The child's pid, while it runs. (nsenter execs the program in place,
    /// so this is the program's own pid.)
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The command line.
    pub(crate) fn command(&self) -> &str {
        &self.command
    }

    /// The file its stdout and stderr go to.
    pub(crate) fn log_path(&self) -> &std::path::Path {
        &self.log
    }

    /// Everything the child printed so far.
    pub(crate) fn output(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// `Some(status)` if the child has exited already.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Polls `ready` every 100 ms until it returns true; fails if the child
    /// exits first or `limit` passes.
    pub(crate) fn wait_until(
        &mut self,
        what: &str,
        limit: Duration,
        mut ready: impl FnMut(&Self) -> Result<bool, LabError>,
    ) -> Result<(), LabError> {
        let deadline = Instant::now() + limit;
        loop {
            if ready(self)? {
                return Ok(());
            }
            if let Some(status) = self.exited() {
                return Err(LabError::Exited {
                    command: self.command.clone(),
                    status: status.to_string(),
                    output: self.output(),
                });
            }
            if Instant::now() >= deadline {
                return Err(LabError::Timeout {
                    command: self.command.clone(),
                    what: what.to_owned(),
                    seconds: limit.as_secs(),
                    output: self.output(),
                });
            }
            sleep(Duration::from_millis(100));
        }
    }

    /// Waits up to `limit` for the child to exit on its own; returns its
    /// status and output. After `limit` it is killed and the result is
    /// [`LabError::Timeout`].
    pub(crate) fn wait(&mut self, limit: Duration) -> Result<(ExitStatus, String), LabError> {
        let deadline = Instant::now() + limit;
        while self.child.is_some() && self.exited().is_none() {
            if Instant::now() >= deadline {
                let (_, output) = self.stop(libc::SIGKILL, Duration::from_secs(5))?;
                return Err(LabError::Timeout {
                    command: self.command.clone(),
                    what: "finish".to_owned(),
                    seconds: limit.as_secs(),
                    output,
                });
            }
            sleep(Duration::from_millis(100));
        }
        self.stop(libc::SIGKILL, Duration::from_secs(5))
    }

    /// Sends `signal`, waits up to `grace` for the exit (then SIGKILLs), and
    /// returns the exit status with the output. Removes the log file.
    pub(crate) fn stop(
        &mut self,
        signal: i32,
        grace: Duration,
    ) -> Result<(ExitStatus, String), LabError> {
        let Some(mut child) = self.child.take() else {
            return Err(LabError::Invalid {
                detail: format!("`{}` was stopped already", self.command),
            });
        };
        let wait_err = |source| LabError::Io {
            what: "waiting for",
            path: self.command.clone(),
            source,
        };
        let status = match child.try_wait().map_err(wait_err)? {
            Some(status) => status,
            None => {
                signal_pid(child.id(), signal);
                let deadline = Instant::now() + grace;
                loop {
                    if let Some(status) = child.try_wait().map_err(wait_err)? {
                        break status;
                    }
                    if Instant::now() >= deadline {
                        warn!(command = %self.command, "no exit after {grace:?}; killing");
                        let _ = child.kill();
                        break child.wait().map_err(wait_err)?;
                    }
                    sleep(Duration::from_millis(50));
                }
            }
        };
        let output = self.output();
        let _ = std::fs::remove_file(&self.log);
        Ok((status, output))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some()
            && let Err(e) = self.stop(libc::SIGTERM, Duration::from_secs(10))
        {
            warn!("stopping a lab process: {e}");
        }
    }
}

/// Sends `signal` to `pid`; a vanished process is not an error.
fn signal_pid(pid: u32, signal: i32) {
    let Ok(pid) = i32::try_from(pid) else {
        return;
    };
    // SAFETY: kill has no memory-safety preconditions; the pid is our own
    // child, not yet reaped, so it cannot have been reused.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc != 0 {
        debug!("kill({pid}, {signal}): {}", std::io::Error::last_os_error());
    }
}
