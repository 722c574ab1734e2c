//! The one way a test leaves early: [`require`] checks what the test needs,
//! and when something is missing it either skips with a reason or fails.
//!
//! Rules:
//! - On the host a missing need prints one line,
//!   `skipped: <test>: <reason>`, on stderr and the test returns. The line's
//!   form is fixed: `cargo xtask test` counts skips by reason from it.
//! - Under `SHAPER_REQUIRE_FULL_KERNEL=1` (set by the VM stages, whose
//!   kernels have every feature the suite uses) a missing need fails the
//!   test instead, so a VM tier cannot pass by testing nothing.
//! - A test never returns early any other way: a harness that cannot load,
//!   a missing tool and a missing qdisc all go through here, in one form
//!   that a grep finds: `if !require(&[Need::...]) { return; }` before the
//!   test changes anything (a probe only the test can run is a
//!   `Need::Probed`). The harnesses behind a need then panic when they
//!   cannot load: by then the need was checked.
//!
//! - A comparison that re-measures a missed round says so through
//!   [`note_retry`], in the same fixed form (`retried: <test>: <reason>`).
//!
//! Non-goals: probing is the callers' business (`topo`, `shaper::tc`); this
//! module only decides what a missing need means.

use std::process::Command;

use shaper::checks::{CAP_NET_ADMIN, CAP_SYS_ADMIN, Capabilities};

use crate::topo::is_root;

/// What a test needs from the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need<'a> {
    /// Effective uid 0.
    Root,
    /// Loading and test-running a SCHED_CLS program: CAP_BPF and
    /// CAP_NET_ADMIN (or root) and a kernel the `__sk_buff` mirror fits
    /// ([`crate::bpf_harness::MIN_KERNEL`]).
    Bpf,
    /// CAP_NET_ADMIN and CAP_SYS_ADMIN: changing qdiscs in a network
    /// namespace of the test's own.
    NetAdmin,
    /// A qdisc kind the kernel can create (probed without changing anything).
    Sch(&'a str),
    /// A program on `PATH` that answers `<tool> <arg>` with success.
    Tool(&'a str, &'a str),
    /// A feature whose probe the caller ran: `(have, what)`.
    Probed(bool, &'a str),
}

impl Need<'_> {
    /// Why this need is not met, or `None` when it is.
    fn missing(&self) -> Option<String> {
        match *self {
            Need::Root => (!is_root()).then(|| "needs root".to_owned()),
            Need::Bpf => crate::bpf_harness::skip_reason(),
            Need::NetAdmin => {
                let caps = Capabilities::current().expect("read /proc/self/status");
                (!caps.has(CAP_NET_ADMIN) || !caps.has(CAP_SYS_ADMIN))
                    .then(|| "needs CAP_NET_ADMIN and CAP_SYS_ADMIN (run as root)".to_owned())
            }
            Need::Sch(kind) => (!shaper::tc::probe_qdisc_kind(kind).unwrap_or(false))
                .then(|| format!("this kernel lacks sch_{kind}")),
            Need::Tool(tool, arg) => (!Command::new(tool)
                .arg(arg)
                .output()
                .is_ok_and(|o| o.status.success()))
            .then(|| format!("needs the `{tool}` tool on PATH")),
            Need::Probed(have, what) => (!have).then(|| format!("needs {what}")),
        }
    }
}

/// True when the VM stage asked that every skip be a failure.
pub fn require_full_kernel() -> bool {
    std::env::var_os("SHAPER_REQUIRE_FULL_KERNEL").is_some_and(|v| v == "1")
}

/// The running test's name (libtest names each test's thread after it).
fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_owned()
}

/// True when every need is met. Otherwise skips (returns false, with the
/// reason printed) or, under `SHAPER_REQUIRE_FULL_KERNEL=1`, panics.
/// Needs are checked in order and the first missing one is the reason.
#[must_use = "a test whose needs are not met must return"]
pub fn require(needs: &[Need<'_>]) -> bool {
    match needs.iter().find_map(Need::missing) {
        None => true,
        Some(reason) => skip(&reason),
    }
}

/// Skips the running test for `reason`: prints the skip line and returns
/// false, or panics under `SHAPER_REQUIRE_FULL_KERNEL=1`.
#[must_use = "a skipped test must return"]
pub fn skip(reason: &str) -> bool {
    let test = test_name();
    assert!(
        !require_full_kernel(),
        "{test}: {reason}, but SHAPER_REQUIRE_FULL_KERNEL=1 says this machine must have it"
    );
    eprintln!("skipped: {test}: {reason}");
    false
}

/// Records that the running test re-measures a missed round: prints
/// `retried: <test>: <reason>` on stderr, which `cargo xtask test` counts
/// and writes to `target/test-times.json`. Retries are never silent.
pub fn note_retry(reason: &str) {
    eprintln!("retried: {}: {reason}", test_name());
}

/// The reason of a skip line, when `line` is one (`skipped: <test>: <reason>`).
pub fn parse_skip_line(line: &str) -> Option<(&str, &str)> {
    line.strip_prefix("skipped: ")?.split_once(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_met_need_does_not_skip() {
        assert!(require(&[Need::Probed(true, "x")]));
        assert!(require(&[]));
    }

    #[test]
    fn the_first_missing_need_is_the_reason() {
        let needs = [
            Need::Probed(true, "a met need"),
            Need::Probed(false, "a thing"),
            Need::Probed(false, "another"),
        ];
        assert_eq!(
            needs.iter().find_map(Need::missing).as_deref(),
            Some("needs a thing")
        );
    }

    #[test]
    fn a_missing_tool_is_found_missing() {
        assert_eq!(
            Need::Tool("no-such-tool-here", "-V").missing().as_deref(),
            Some("needs the `no-such-tool-here` tool on PATH")
        );
    }

    #[test]
    fn skip_lines_parse_into_test_and_reason() {
        assert_eq!(
            parse_skip_line("skipped: a_test: this kernel lacks sch_fq"),
            Some(("a_test", "this kernel lacks sch_fq"))
        );
        assert_eq!(parse_skip_line("test a_test ... ok"), None);
    }
}
