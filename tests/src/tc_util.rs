//! Helpers for the qdisc save/restore tests: the complete `tc -d` view of an
//! interface, the running kernel's configuration, and what the tests need
//! from the machine.
//!
//! Also the round trip every restore test runs (snapshot through the file
//! format, install, restore twice, compare views) and its building blocks.
//!
//! The view is what the restore promise is about: `tc -d qdisc/class/filter
//! show dev X`, plus the filters and chains of every qdisc and class handle
//! and of clsact's ingress and egress hooks. Nothing is normalised except
//! one counter `tc -d` prints without `-s`: htb's `direct_packets_stat`.

use std::{
    ffi::CString,
    io::{Read, Write},
    process::{Command, Stdio},
};

use shaper::tc::{self, Attr, Snapshot, TcError};

use crate::{netns::NetNsGuard, skip::Need};

/// A finished command as part of a view: stdout, stderr, and the exit
/// status when it failed.
fn as_view(out: &std::process::Output) -> String {
    format!(
        "{}{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        if out.status.success() {
            String::new()
        } else {
            format!("[{}]\n", out.status)
        }
    )
}

/// Runs a shell command and returns its exit status, stdout and stderr as
/// one string: a command that fails is part of the view, not a test error.
pub fn run(cmd: &str) -> String {
    match Command::new("sh").arg("-c").arg(cmd).output() {
        Ok(out) => as_view(&out),
        Err(e) => format!("[cannot run sh: {e}]\n"),
    }
}

/// Runs `tc -d -force -batch -` over `cmds` (one tc command each, without
/// the `tc`): one process where one per command would cost a tenth of a
/// second each under emulation. Returns stdout, then stderr and the exit
/// status when it failed: a failing command is part of the view.
fn tc_show_batch(cmds: &[String]) -> String {
    match run_tc_batch(&["-d", "-force"], cmds) {
        Ok(out) => as_view(&out),
        Err(e) => format!("[cannot run tc: {e}]\n"),
    }
}

/// `tc OPTS -batch -` with `cmds`, one per line, on its stdin.
fn run_tc_batch<S: AsRef<str>>(opts: &[&str], cmds: &[S]) -> std::io::Result<std::process::Output> {
    let mut child = Command::new("tc")
        .args(opts)
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let script: String = cmds.iter().map(|c| format!("{}\n", c.as_ref())).collect();
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    child.wait_with_output()
}

/// Runs the tc commands `cmds` (each without the `tc`) in one `tc -batch`,
/// panicking with tc's message when one fails: how a test builds a tree of
/// many objects without a process per object.
pub fn tc_batch<S: AsRef<str>>(cmds: &[S]) {
    let out = run_tc_batch(&[], cmds).expect("run tc -batch");
    let script: Vec<&str> = cmds.iter().map(AsRef::as_ref).collect();
    assert!(
        out.status.success(),
        "tc -batch failed: {}{}\n--- script ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        script.join("\n")
    );
}

/// Splits `text` into `prefixes.len() + 1` sections: a line beginning
/// with `prefixes[j]` (j at or after the section in progress) starts
/// section `j + 1`, leaving the sections between empty. Used on one batch's
/// output whose commands print lines of distinct first words (`qdisc`,
/// `class`, `filter`, `chain`; continuation lines are indented), so each
/// cut is where a command's output began.
fn split_sections(text: &str, prefixes: &[&str]) -> Vec<String> {
    let mut sections = vec![String::new()];
    for line in text.lines() {
        let done = sections.len() - 1;
        if let Some(j) = prefixes[done..].iter().position(|p| line.starts_with(p)) {
            sections.resize(done + j + 2, String::new());
        }
        let last = sections.last_mut().expect("one section at least");
        last.push_str(line);
        last.push('\n');
    }
    sections.resize(prefixes.len() + 1, String::new());
    sections
}

/// The full `tc -d` view of `dev` (see the module docs). Outputs whose
/// lines could not be told apart (the two clsact hooks) come from batches
/// of their own.
pub fn tc_view(dev: &str) -> String {
    let top = tc_show_batch(&[
        format!("qdisc show dev {dev}"),
        format!("class show dev {dev}"),
        format!("filter show dev {dev}"),
    ]);
    let [qdiscs, classes, filters]: [String; 3] = split_sections(&top, &["class ", "filter "])
        .try_into()
        .expect("three sections");
    let mut out = format!("## qdiscs\n{qdiscs}## classes\n{classes}## filters\n{filters}");
    let mut parents: Vec<&str> = Vec::new();
    for line in qdiscs
        .lines()
        .filter(|l| l.starts_with("qdisc "))
        .chain(classes.lines().filter(|l| l.starts_with("class ")))
    {
        if let Some(handle) = line.split_whitespace().nth(2)
            && handle != "0:"
            && !handle.starts_with(':')
            && handle != "ffff:"
            && !parents.contains(&handle)
        {
            parents.push(handle);
        }
    }
    for p in parents {
        let both = tc_show_batch(&[
            format!("filter show dev {dev} parent {p}"),
            format!("chain show dev {dev} parent {p}"),
        ]);
        let [filters, chains]: [String; 2] = split_sections(&both, &["chain "])
            .try_into()
            .expect("two sections");
        out += &format!("## filters of {p}\n{filters}## chains of {p}\n{chains}");
    }
    for hook in ["ingress", "egress"] {
        out += &format!(
            "## {hook} filters\n{}",
            tc_show_batch(&[format!("filter show dev {dev} {hook}")])
        );
    }
    normalise_counters(&out)
}

/// Replaces the digits after each `direct_packets_stat ` with `N`.
fn normalise_counters(view: &str) -> String {
    const KEY: &str = "direct_packets_stat ";
    let mut out = String::with_capacity(view.len());
    let mut rest = view;
    while let Some(at) = rest.find(KEY) {
        let (head, tail) = rest.split_at(at + KEY.len());
        out += head;
        let digits = tail.len() - tail.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        out += if digits > 0 { "N" } else { "" };
        rest = &tail[digits..];
    }
    out + rest
}

/// The ifindex of `dev` in the current network namespace; panics if none.
pub fn ifindex(dev: &str) -> u32 {
    let name = CString::new(dev).expect("interface name without NUL");
    // SAFETY: `name` is a valid NUL-terminated string for the whole call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(
        index,
        0,
        "no interface {dev}: {}",
        std::io::Error::last_os_error()
    );
    index
}

/// Turns IPv6 off in the current network namespace, for devices created
/// afterwards: no router solicitations or MLD reports then cross the qdiscs
/// under test.
pub fn no_ipv6() {
    crate::netns::sh(
        "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1",
    );
}

/// The value of a kernel config option ("y", "m", ...), `None` if it is not
/// set. Reads `SHAPER_KERNEL_CONFIG` (a plain config file; the VM stage points
/// it at the guest kernel's), else /proc/config.gz, else
/// /boot/config-<release>. Panics if none can be read.
pub fn kernel_config(option: &str) -> Option<String> {
    let text = match std::env::var_os("SHAPER_KERNEL_CONFIG") {
        Some(path) => std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read SHAPER_KERNEL_CONFIG {path:?}: {e}")),
        None => {
            let out = Command::new("sh")
                .arg("-c")
                .arg("zcat /proc/config.gz 2>/dev/null || cat /boot/config-$(uname -r)")
                .output()
                .expect("run zcat");
            assert!(
                out.status.success(),
                "cannot read the kernel config: no /proc/config.gz, no /boot/config-$(uname -r), \
                 and SHAPER_KERNEL_CONFIG is not set"
            );
            let mut text = String::new();
            out.stdout
                .as_slice()
                .read_to_string(&mut text)
                .expect("config is text");
            text
        }
    };
    let prefix = format!("{option}=");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(str::to_owned)
}

/// What the tc tests need: CAP_NET_ADMIN and CAP_SYS_ADMIN (for
/// namespaces) and the `tc` tool. A test checks `require(NEEDS)` first.
pub const NEEDS: &[Need<'static>] = &[Need::NetAdmin, Need::Tool("tc", "-V")];

// ---------------------------------------------------------------------------
// Round trips through shaper::tc
// ---------------------------------------------------------------------------

/// `TCA_HTB_INIT` and `struct tc_htb_glob` (include/uapi/linux/pkt_sched.h).
const TCA_HTB_INIT: u16 = 2;
const HTB_VERSION: u32 = 3;

/// Options for an htb root: default class 0, r2q 10.
pub fn htb_options() -> Vec<u8> {
    let glob: Vec<u8> = [HTB_VERSION, 10, 0, 0, 0]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    tc::encode_attrs(&[Attr::bytes(TCA_HTB_INIT, &glob)])
}

/// Enters a fresh namespace with IPv6 off and the action modules loaded.
/// The test checked [`NEEDS`] first.
pub fn setup() -> NetNsGuard {
    let guard = NetNsGuard::new();
    no_ipv6();
    preload_action_modules();
    guard
}

/// Makes sure the action modules the tests use are loaded. Where an action
/// is a module (Debian's kernels), its autoload makes the kernel replay the
/// whole filter request, and the aborted first attempt burns one u32 hash
/// table id (they are allocated cyclically, gen_new_htid in
/// net/sched/cls_u32.c), so the first tree built would have a numbering gap
/// that snapshot rightly refuses.
fn preload_action_modules() {
    crate::netns::sh(
        "tc actions add action mirred egress mirror dev lo index 4242 && \
         tc actions del action mirred index 4242",
    );
}

/// Asserts two views are equal, printing both in full when they are not.
pub fn assert_same_view(before: &str, after: &str, when: &str) {
    assert!(
        before == after,
        "{when}: the tc view changed\n--- before ---\n{before}\n--- after ---\n{after}"
    );
}

/// Snapshot (through the file format), install with `install`, check the
/// tree really changed, restore, compare; restore again, compare again.
pub fn round_trip(dev: &str, install: impl FnOnce(u32)) -> Snapshot {
    let before = tc_view(dev);
    let index = ifindex(dev);
    let taken = tc::snapshot(index).expect("snapshot");
    let snap = Snapshot::decode(&taken.encode()).expect("decode our own encoding");
    assert_eq!(snap, taken, "encode/decode changed the snapshot");
    install(index);
    assert!(
        tc::is_shaper_root(index).expect("read root"),
        "the shaper's root is not installed"
    );
    assert_ne!(tc_view(dev), before, "installing changed nothing visible");
    tc::restore(&snap).expect("restore");
    assert_same_view(&before, &tc_view(dev), "after restore");
    tc::restore(&snap).expect("second restore");
    assert_same_view(&before, &tc_view(dev), "after a second restore");
    snap
}

/// Installs an htb root as the shaper's root of `index`.
pub fn install_htb(index: u32) {
    tc::install_root(index, 1, "htb", Some(&htb_options())).expect("install htb root");
}

/// Expects `snapshot` to refuse `dev` with a reason containing `needle`,
/// and the tree to be untouched.
pub fn expect_refusal(dev: &str, needle: &str) {
    let before = tc_view(dev);
    match tc::snapshot(ifindex(dev)) {
        Err(e @ TcError::Unrestorable { .. }) => assert!(e.to_string().contains(needle), "{e}"),
        other => panic!("expected a refusal mentioning {needle:?}, got {other:?}"),
    }
    assert_same_view(&before, &tc_view(dev), "after a refused snapshot");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_start_at_each_prefix_in_turn() {
        let text = "qdisc a\n linklayer x\nclass b\nclass c\nfilter d\n  match e\n";
        assert_eq!(
            split_sections(text, &["class ", "filter "]),
            [
                "qdisc a\n linklayer x\n",
                "class b\nclass c\n",
                "filter d\n  match e\n"
            ]
        );
        // A command that printed nothing leaves its section empty.
        assert_eq!(
            split_sections("qdisc a\nfilter d\n", &["class ", "filter "]),
            ["qdisc a\n", "", "filter d\n"]
        );
        assert_eq!(split_sections("", &["chain "]), ["", ""]);
        assert_eq!(
            split_sections("filter x\nchain chain 0\n", &["chain "]),
            ["filter x\n", "chain chain 0\n"]
        );
    }

    #[test]
    fn only_direct_packets_stat_is_normalised() {
        let v =
            "qdisc htb 1: root refcnt 2 r2q 10 default 0x30 direct_packets_stat 7 ver 3.17\nx 5";
        assert_eq!(
            normalise_counters(v),
            "qdisc htb 1: root refcnt 2 r2q 10 default 0x30 direct_packets_stat N ver 3.17\nx 5"
        );
    }
}
