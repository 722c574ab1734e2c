//! The real `shaper` binary under test: a `shaper run` process
//! ([`ShaperProc`]), what `shaper status --json` says about an interface
//! ([`Status`]), and `shaper cleanup`.
//!
//! Rules:
//! - Every command runs in one place: a [`NamedNs`] (through `nsenter`, see
//!   [`crate::topo`]) or, with `None`, the test thread's own namespace (a
//!   [`crate::netns::NetNsGuard`]'s, inherited by the child).
//! - Whether a run is shaping is read from `status --json`, never from the
//!   human report: [`ShaperProc::start`] returns once every direction it
//!   was asked to shape has its classifier attached. (The run's ready line
//!   only tells it when to ask: a status process per poll would compete
//!   with the attach for the emulated CPUs.)
//! - A `ShaperProc` owns its child. Its stdout and stderr are read from the
//!   start by threads of their own, so a chatty run never blocks on a full
//!   pipe, and both are handed back when it exits ([`Exit`]).
//! - Dropped while the child still runs (a failed assertion), it sends
//!   SIGTERM, which restores the interface, and SIGKILL after a grace
//!   period.
//!
//! Also the bad-input check the CLI tests share: [`expect_usage_error`].
//!
//! Non-goals: checking the report's wording (the few tests about a message
//! read [`status_text`]); starting anything but `shaper run`.

use std::{
    collections::BTreeMap,
    fmt,
    io::Read,
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle, sleep},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::topo::{NamedNs, Pair, shaper_bin, text};

/// How long [`ShaperProc::start`] waits for the classifiers: loading and
/// verifying the programs takes tens of seconds in the emulated VM.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(150);
/// How long a dropped [`ShaperProc`] waits after SIGTERM before SIGKILL.
const DROP_GRACE: Duration = Duration::from_secs(10);

/// A `shaper` command in `ns`, or in the calling thread's namespace.
pub fn shaper_command(ns: Option<&NamedNs>) -> Command {
    match ns {
        Some(ns) => ns.shaper(),
        None => Command::new(shaper_bin()),
    }
}

/// One interface as `shaper status --json` reports it (`shaper::status`'s
/// `to_json`). Only what the tests read is typed; the pacer and fair-share
/// objects stay JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub iface: String,
    pub ifindex: u32,
    /// The `shaper run` that wrote the record.
    pub pid: u32,
    /// That process still exists.
    pub running: bool,
    /// The interface still exists with the recorded index.
    pub present: bool,
    /// The egress rate; 0 for an ingress-only run.
    pub rate_bits_per_s: u64,
    pub root_qdisc: Option<String>,
    /// The egress hook: `tcx`, `tc clsact` or `none`.
    pub classifier: String,
    #[serde(default)]
    pub ingress: Option<IngressStatus>,
    #[serde(default)]
    pub pacer: Option<Value>,
    #[serde(default)]
    pub fair: Option<Value>,
    /// The egress counters by name, when the pins are visible.
    #[serde(default)]
    pub counters: Option<BTreeMap<String, u64>>,
    /// The egress object's programs with the kernel's run figures.
    #[serde(default)]
    pub programs: Option<Vec<Value>>,
}

/// The `ingress` object of [`Status`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IngressStatus {
    /// `police` or `ifb`.
    pub mode: String,
    /// The IFB's name in `ifb` mode.
    pub ifb: Option<String>,
    pub rate_bits_per_s: u64,
    /// `tcx`, `tc clsact`, `tc clsact mirred` or `none`.
    pub classifier: String,
    #[serde(default)]
    pub counters: Option<BTreeMap<String, u64>>,
    /// The policer's host isolation mode, when its pins are visible.
    #[serde(default)]
    pub isolation: Option<String>,
}

impl Status {
    /// The egress counter `name`; panics (with the status) when absent.
    pub fn counter(&self, name: &str) -> u64 {
        self.counters
            .as_ref()
            .and_then(|c| c.get(name).copied())
            .unwrap_or_else(|| panic!("no counter {name} in {self}"))
    }

    /// The ingress counter `name`; panics (with the status) when absent.
    pub fn ingress_counter(&self, name: &str) -> u64 {
        self.ingress
            .as_ref()
            .and_then(|i| i.counters.as_ref())
            .and_then(|c| c.get(name).copied())
            .unwrap_or_else(|| panic!("no ingress counter {name} in {self}"))
    }

    /// Egress is shaped (the report's "egress shaped at").
    pub fn egress_shaped(&self) -> bool {
        self.rate_bits_per_s != 0 || self.classifier != "none"
    }

    /// The ingress record, which must be there.
    pub fn ingress(&self) -> &IngressStatus {
        self.ingress
            .as_ref()
            .unwrap_or_else(|| panic!("no ingress in {self}"))
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match serde_json::to_string(self) {
            Ok(s) => f.write_str(&s),
            Err(_) => write!(f, "{self:?}"),
        }
    }
}

/// `shaper status --json [--iface IFACE]` in `ns`: one [`Status`] per
/// shaped interface (none when nothing is shaped). Panics if the command
/// fails or prints anything but status objects.
pub fn status_all(ns: Option<&NamedNs>, iface: Option<&str>) -> Vec<Status> {
    try_status(ns, iface).unwrap_or_else(|e| panic!("{e}"))
}

/// The status of `iface`, `None` when it is not shaped.
pub fn status_json(ns: Option<&NamedNs>, iface: &str) -> Option<Status> {
    let mut all = status_all(ns, Some(iface));
    assert!(all.len() <= 1, "two records for {iface}");
    all.pop()
}

/// `shaper status --iface IFACE` as a person reads it, for the tests of its
/// wording. Panics if the command fails.
pub fn status_text(ns: Option<&NamedNs>, iface: &str) -> String {
    let out = shaper_command(ns)
        .args(["status", "--iface", iface])
        .output()
        .expect("spawn shaper status");
    assert!(out.status.success(), "status failed: {}", text(&out));
    text(&out)
}

fn try_status(ns: Option<&NamedNs>, iface: Option<&str>) -> Result<Vec<Status>, String> {
    let mut cmd = shaper_command(ns);
    cmd.args(["status", "--json"]);
    if let Some(i) = iface {
        cmd.args(["--iface", i]);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("spawn shaper status: {e}"))?;
    if !out.status.success() {
        return Err(format!("shaper status failed: {}", text(&out)));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| format!("status --json line {l:?}: {e}")))
        .collect()
}

/// `shaper cleanup [--iface IFACE]` in `ns`: asserts success and returns
/// stdout then stderr.
pub fn cleanup(ns: Option<&NamedNs>, iface: Option<&str>) -> String {
    let mut cmd = shaper_command(ns);
    cmd.arg("cleanup");
    if let Some(i) = iface {
        cmd.args(["--iface", i]);
    }
    let out = cmd.output().expect("spawn shaper cleanup");
    assert!(
        out.status.success(),
        "shaper cleanup failed: {}",
        text(&out)
    );
    text(&out)
}

/// Runs `shaper ARGS` in the pair's left namespace, where it would shape
/// `left0`; asserts exit 2, that the message has every needle, and that
/// nothing changed (the same tc state, no state record). Returns the
/// output.
pub fn expect_usage_error(pair: &Pair, args: &[&str], needles: &[&str]) -> Output {
    let before = pair.left.tc_state("left0");
    let out = pair
        .left
        .shaper()
        .args(args)
        .output()
        .expect("spawn shaper");
    let msg = text(&out);
    assert_eq!(out.status.code(), Some(2), "args {args:?}: {msg}");
    for n in needles {
        assert!(msg.contains(n), "args {args:?}: message lacks {n:?}: {msg}");
    }
    assert_eq!(
        pair.left.tc_state("left0"),
        before,
        "args {args:?} changed the interface"
    );
    if let Some(st) = status_json(Some(&pair.left), "left0") {
        panic!("args {args:?} left a record: {st}");
    }
    out
}

/// How a `shaper run` ended, with everything it printed.
#[derive(Debug)]
pub struct Exit {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Exit {
    /// The exit code; `None` when a signal ended the process.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Stdout then stderr, for messages.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// A running `shaper run --iface IFACE ARGS` (see the module docs).
pub struct ShaperProc<'a> {
    ns: Option<&'a NamedNs>,
    iface: String,
    child: Option<Child>,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

/// Reads `pipe` to its end on a thread of its own.
fn drain(
    pipe: Option<impl Read + Send + 'static>,
    ready: Arc<AtomicBool>,
) -> Option<JoinHandle<String>> {
    let mut pipe = pipe?;
    Some(thread::spawn(move || {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    if !ready.load(Ordering::Relaxed)
                        && buf.windows(READY_LINE.len()).any(|w| w == READY_LINE)
                    {
                        ready.store(true, Ordering::Relaxed);
                    }
                }
            }
        }
        String::from_utf8_lossy(&buf).into_owned()
    }))
}

/// What `shaper run` prints once it has attached: the sign to look at
/// `status --json`.
const READY_LINE: &[u8] = shaper::status::READY_PREFIX.as_bytes();

/// How often the wait asks `status --json` before the ready line shows, in
/// case a run attached without printing it.
const STATUS_FALLBACK: Duration = Duration::from_secs(5);

impl<'a> ShaperProc<'a> {
    /// Starts `shaper run --iface IFACE ARGS` in `ns` and waits until
    /// `status --json` shows it shaping: egress attached when `args` has
    /// `--rate`, ingress attached when it has `--ingress-rate`. Panics, with
    /// the run's output, if it exits first or does not attach within
    /// [`ATTACH_TIMEOUT`].
    pub fn start(ns: Option<&'a NamedNs>, iface: &str, args: &[&str]) -> Self {
        Self::start_with_env(ns, iface, args, &[])
    }

    /// [`ShaperProc::start`] with `env` added to the run's environment.
    pub fn start_with_env(
        ns: Option<&'a NamedNs>,
        iface: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let run_args: Vec<&str> = ["--iface", iface]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        let egress = args.contains(&"--rate");
        let ingress = args.contains(&"--ingress-rate");
        Self::launch(ns, iface, &run_args, env, (egress, ingress))
    }

    /// `shaper run --config FILE --section SECTION` in `ns`, shaping
    /// `iface` in the directions `(egress, ingress)` the section sets;
    /// waits as [`ShaperProc::start`] does.
    pub fn start_config(
        ns: Option<&'a NamedNs>,
        iface: &str,
        file: &str,
        section: &str,
        directions: (bool, bool),
    ) -> Self {
        Self::launch(
            ns,
            iface,
            &["--config", file, "--section", section],
            &[],
            directions,
        )
    }

    /// `shaper run RUN_ARGS`, waiting until `iface` is shaped in the
    /// directions `(egress, ingress)`.
    fn launch(
        ns: Option<&'a NamedNs>,
        iface: &str,
        run_args: &[&str],
        env: &[(&str, &str)],
        (egress, ingress): (bool, bool),
    ) -> Self {
        let child = shaper_command(ns)
            .envs(env.iter().copied())
            .arg("run")
            .args(run_args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn shaper run");
        let mut p = Self {
            ns,
            iface: iface.to_owned(),
            child: Some(child),
            stdout: None,
            stderr: None,
        };
        let child = p.child.as_mut().expect("just spawned");
        let ready = Arc::new(AtomicBool::new(false));
        p.stdout = drain(child.stdout.take(), ready.clone());
        p.stderr = drain(child.stderr.take(), ready.clone());
        p.wait_shaping(egress, ingress, &ready);
        p
    }

    /// Waits until the run printed its ready line (`ready`) and `status
    /// --json` shows the requested hooks attached, asking it once `ready`
    /// and every [`STATUS_FALLBACK`] before that. The ready line comes after
    /// every attach step, the LAN side of `--nat` included, which status
    /// alone cannot tell: a test that stopped the run on the egress hook
    /// alone found the LAN classifier not yet attached.
    fn wait_shaping(&mut self, egress: bool, ingress: bool, ready: &AtomicBool) {
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        let mut next_ask = Instant::now() + STATUS_FALLBACK;
        let mut last = "not asked yet".to_owned();
        let attached = |st: &Status| {
            st.running
                && (!egress || st.classifier != "none")
                && (!ingress || st.ingress.as_ref().is_some_and(|i| i.classifier != "none"))
        };
        loop {
            if ready.load(Ordering::Relaxed) || Instant::now() >= next_ask {
                next_ask = Instant::now() + STATUS_FALLBACK;
                let printed_ready = ready.load(Ordering::Relaxed);
                last = match try_status(self.ns, Some(&self.iface)) {
                    Ok(list) => match list.first() {
                        Some(st) if attached(st) && printed_ready => return,
                        Some(st) => st.to_string(),
                        None => "not shaped yet".to_owned(),
                    },
                    Err(e) => e,
                };
                sleep(Duration::from_millis(150));
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() >= deadline {
                let why = match exited {
                    Some(st) => format!("exited ({st}) before shaping"),
                    None => format!("did not attach in {} s", ATTACH_TIMEOUT.as_secs()),
                };
                let exit = self.stop(libc::SIGKILL);
                panic!(
                    "shaper run on {} {why}; last status: {last}\n{}",
                    self.iface,
                    exit.text()
                );
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// The interface this run shapes.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The process id of the run; panics once it has been stopped.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the run was stopped").id()
    }

    /// This run's interface in `status --json`; `None` when not shaped.
    pub fn status_json(&self) -> Option<Status> {
        status_json(self.ns, &self.iface)
    }

    /// As [`ShaperProc::status_json`], which must list the interface.
    pub fn status(&self) -> Status {
        self.status_json()
            .unwrap_or_else(|| panic!("{} is not shaped", self.iface))
    }

    /// The human report of this run's interface (see [`status_text`]).
    pub fn status_text(&self) -> String {
        status_text(self.ns, &self.iface)
    }

    /// `shaper cleanup --iface IFACE`; its output (see [`cleanup`]).
    pub fn cleanup(&self) -> String {
        cleanup(self.ns, Some(&self.iface))
    }

    /// Sends `sig`, waits for the exit and returns it with the output.
    /// Panics if the run was already stopped.
    pub fn stop(&mut self, sig: i32) -> Exit {
        self.signal(sig);
        let mut child = self.child.take().expect("the run was already stopped");
        let status = child.wait().expect("wait for shaper run");
        let join = |h: Option<JoinHandle<String>>| {
            h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
        };
        Exit {
            status,
            stdout: join(self.stdout.take()),
            stderr: join(self.stderr.take()),
        }
    }

    /// Sends `sig` without waiting (nothing when the run already exited).
    /// Panics if the run was already stopped.
    pub fn signal(&mut self, sig: i32) {
        let child = self.child.as_mut().expect("the run was already stopped");
        // A child that already exited has not been reaped: its pid is ours.
        if child.try_wait().ok().flatten().is_none() {
            let pid = i32::try_from(child.id()).expect("pid fits");
            // SAFETY: kill has no memory-safety preconditions; the pid is
            // our unreaped child, so it names no other process.
            let rc = unsafe { libc::kill(pid, sig) };
            assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
        }
    }

    /// SIGTERM: the run restores the interface and exits.
    pub fn sigterm(&mut self) -> Exit {
        self.stop(libc::SIGTERM)
    }

    /// SIGINT: as SIGTERM.
    pub fn sigint(&mut self) -> Exit {
        self.stop(libc::SIGINT)
    }

    /// SIGKILL: the run leaves its state behind for `shaper cleanup`.
    pub fn sigkill(&mut self) -> Exit {
        self.stop(libc::SIGKILL)
    }

    /// Waits up to `within` for the run to end by itself; its exit and how
    /// long it took, or `None` (the run still going) when it did not.
    pub fn wait_exit(&mut self, within: Duration) -> Option<(Exit, Duration)> {
        let started = Instant::now();
        while started.elapsed() < within {
            let done = self
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if done {
                let took = started.elapsed();
                // Already exited: stop only reaps it and collects the output.
                return Some((self.stop(libc::SIGTERM), took));
            }
            sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for ShaperProc<'_> {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: as in `stop`; the child is not reaped yet.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + DROP_GRACE;
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                return;
            }
            sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
