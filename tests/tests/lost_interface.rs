//! A changing world under a running `shaper run`: the shaped interface
//! deleted, and its root qdisc replaced by another tool. Each time the run
//! must notice within [`NOTICE_WITHIN`], say what happened, remove its own
//! state (record, pins, IFB) without touching what is not its own, and exit 1.
//!
//! Needs sch_fq: runs in the VM.

use std::time::Duration;

use shaper_tests::{
    shaper_proc::{ShaperProc, status_all, status_json},
    skip::{Need, require},
    topo::Pair,
};

/// From the change to the run's exit, its undo included: the watch period
/// plus the undo, with room for emulation.
const NOTICE_WITHIN: Duration = Duration::from_secs(2);

#[test]
fn a_deleted_interface_ends_the_run_and_leaves_no_state() {
    if !require(&[Need::Root, Need::Sch("fq")]) {
        return;
    }
    let pair = Pair::new("lsd", 1);
    let mut run = ShaperProc::start(
        Some(&pair.left),
        "left0",
        &[
            "--rate",
            "20mbit",
            "--ingress-rate",
            "20mbit",
            "--ingress-mode",
            "ifb",
        ],
    );
    assert!(
        pair.left.sh("ip -o link show").contains("ifb4left0"),
        "the IFB is there while shaping"
    );
    pair.left.sh("ip link del left0");
    let out = ends_noticing(&mut run, "the delete", "left0 was deleted while shaped");
    assert!(
        !pair.left.sh("ip -o link show").contains("ifb4left0"),
        "the IFB is left behind: {out}"
    );
    // `status --iface left0` now says there is no such interface; the list
    // of every record must not name it.
    assert!(
        status_all(Some(&pair.left), None)
            .iter()
            .all(|st| st.iface != "left0"),
        "a record is left: {out}"
    );
    let pins = pair
        .left
        .sh("ls /sys/fs/bpf/shaper 2>/dev/null | grep netns || true");
    let ns_pins = pair
        .left
        .sh("ls /sys/fs/bpf/shaper/netns-$(stat -L -c %i /proc/self/ns/net) 2>/dev/null || true");
    assert!(ns_pins.trim().is_empty(), "pins are left: {pins} {ns_pins}");
}

#[test]
fn a_replaced_root_qdisc_is_left_alone_and_ends_the_run() {
    if !require(&[Need::Root, Need::Sch("fq"), Need::Sch("htb")]) {
        return;
    }
    let pair = Pair::new("lsr", 1);
    let mut run = ShaperProc::start(Some(&pair.left), "left0", &["--rate", "20mbit"]);
    pair.left
        .sh("tc qdisc replace dev left0 root handle 1: htb default 1");
    let out = ends_noticing(&mut run, "the replace", "was replaced by htb 1:");
    let root = pair.left.sh("tc qdisc show dev left0 root");
    assert!(
        root.starts_with("qdisc htb 1: root"),
        "the other tool's root was touched: {root}"
    );
    assert!(
        status_json(Some(&pair.left), "left0").is_none(),
        "a record is left: {out}"
    );
    let filters = pair.left.sh("tc filter show dev left0 egress");
    assert!(
        !filters.contains("shaper"),
        "the classifier is left on clsact: {filters}"
    );
}

/// Waits for `run` to end by itself after `change`: exit 1 within
/// [`NOTICE_WITHIN`], saying `message`. Returns its output.
fn ends_noticing(run: &mut ShaperProc<'_>, change: &str, message: &str) -> String {
    let (exit, took) = run
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the run did not end by itself after {change}"));
    let out = exit.text();
    eprintln!("noticed and exited {took:?} after {change}");
    assert_eq!(exit.code(), Some(1), "{out}");
    assert!(out.contains(message), "{out}");
    assert!(took <= NOTICE_WITHIN, "took {took:?}: {out}");
    out
}
