//! Bad input to `shaper run` on a veth in a fresh namespace: each case must
//! exit 2 with a message that names the problem and the fix, and leave the
//! interface exactly as it was (same tc state, no state record).
//!
//! Runs on any kernel; the sch_fq case only where the kernel lacks sch_fq
//! (this machine's), since elsewhere that is not bad input.

use std::process::Output;

use shaper_tests::topo::{Pair, is_root, kernel_has_fq, shaper_bin, text};

fn skip_unprivileged() -> bool {
    if is_root() {
        return false;
    }
    eprintln!("skipped: needs root to create network namespaces");
    true
}

/// Runs `shaper run ARGS` in the pair's left namespace; asserts exit 2, that
/// the message contains every `needle`, and that nothing changed.
fn expect_usage_error(pair: &Pair, args: &[&str], needles: &[&str]) -> Output {
    let before = pair.left.tc_state("left0");
    let out = pair
        .left
        .shaper()
        .arg("run")
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
    let status = pair
        .left
        .shaper()
        .args(["status", "--iface", "left0"])
        .output()
        .expect("status");
    assert!(
        text(&status).contains("not shaped"),
        "a record was left: {}",
        text(&status)
    );
    out
}

#[test]
fn unknown_interface_exits_2() {
    if skip_unprivileged() {
        return;
    }
    let pair = Pair::new("unk", 1);
    expect_usage_error(
        &pair,
        &["--iface", "nosuch0", "--rate", "20mbit"],
        &["no interface named 'nosuch0'", "ip link"],
    );
    expect_usage_error(
        &pair,
        &["--iface", "a/b", "--rate", "20mbit"],
        &["not a valid interface name"],
    );
}

#[test]
fn interface_down_exits_2() {
    if skip_unprivileged() {
        return;
    }
    let pair = Pair::new("down", 1);
    pair.left.sh("ip link set left0 down");
    expect_usage_error(
        &pair,
        &["--iface", "left0", "--rate", "20mbit"],
        &["'left0' is down", "ip link set left0 up"],
    );
}

#[test]
fn bad_rates_exit_2() {
    if skip_unprivileged() {
        return;
    }
    let pair = Pair::new("rate", 1);
    let table: &[(&str, &str)] = &[
        ("0mbit", "too slow"),
        ("0", "no unit"),
        ("-5mbit", "negative"),
        ("fast", "not a rate"),
        ("850", "850mbit"),
        ("85O mbit", "unknown unit"),
        ("0.5kbit", "1kbit to 1tbit"),
        ("2tbit", "1kbit to 1tbit"),
        ("", "empty"),
    ];
    for (rate, needle) in table {
        expect_usage_error(
            &pair,
            &["--iface", "left0", "--rate", rate],
            &[needle, "--rate"],
        );
    }
    expect_usage_error(
        &pair,
        &["--iface", "left0", "--rate", "20mbit", "--horizon", "20s"],
        &["10ms to 10s"],
    );
}

#[test]
fn no_privileges_exits_2() {
    if skip_unprivileged() {
        return;
    }
    let pair = Pair::new("priv", 1);
    let before = pair.left.tc_state("left0");
    let out = pair
        .left
        .command("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(shaper_bin())
        .args(["run", "--iface", "left0", "--rate", "20mbit"])
        .output()
        .expect("spawn setpriv");
    let msg = text(&out);
    assert_eq!(out.status.code(), Some(2), "{msg}");
    assert!(
        msg.contains("CAP_BPF") && msg.contains("CAP_NET_ADMIN"),
        "{msg}"
    );
    assert!(msg.contains("run it as root"), "{msg}");
    assert_eq!(pair.left.tc_state("left0"), before);
}

#[test]
fn kernel_without_sch_fq_exits_2_and_names_the_module() {
    if skip_unprivileged() {
        return;
    }
    if kernel_has_fq() {
        eprintln!("skipped: this kernel has sch_fq, so this is not an error here");
        return;
    }
    let pair = Pair::new("nofq", 1);
    expect_usage_error(
        &pair,
        &["--iface", "left0", "--rate", "20mbit"],
        &[
            "no sch_fq",
            "CONFIG_NET_SCH_FQ",
            "kmod-sched",
            "cargo xtask vm -- target/release/shaper run --iface left0 --rate 20Mbit",
            "Nothing was changed",
        ],
    );
}
