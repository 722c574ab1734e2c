//! `shaper run --ingress-rate R` (the AQM policer, `police` mode) with the
//! real binary on a veth between two namespaces. The policer needs no
//! sch_fq, so these run on this machine's kernel (TCX) as well as in the VM
//! (6.1: a cls_bpf filter on clsact).
//!
//! Checks: it attaches at ingress and `shaper status` says so; under a UDP
//! flood at 4x the rate it drops (counted) while a ping beside it loses
//! nothing and is never marked; SIGTERM and SIGKILL + `shaper cleanup`
//! leave the interface's tc state exactly as before; `--ingress-mode ifb`
//! creates and removes its IFB and its ingress redirect (VM), or exits 2
//! without sch_fq (here).
//!
//! Run: `cargo test -p shaper-tests --test ingress_police -- --test-threads=1`

use std::{
    process::{Child, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use shaper_tests::topo::{Pair, is_root, text};

fn skip() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root");
        return true;
    }
    false
}

/// Starts `shaper run --iface right0 --ingress-rate RATE` on the receiving
/// side and waits until `shaper status` lists the ingress hook.
#[allow(
    clippy::zombie_processes,
    reason = "the child is returned to the caller, which waits on it"
)]
fn start(pair: &Pair, rate: &str) -> Child {
    let child = pair
        .right
        .shaper()
        .args(["run", "--iface", "right0", "--ingress-rate", rate])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shaper run");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let st = status(pair);
        if st.contains("ingress:    police at") && !st.contains("not attached") {
            return child;
        }
        if Instant::now() >= deadline {
            let mut child = child;
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait shaper");
            panic!("shaper did not attach in 90 s: {st}\n{}", text(&out));
        }
        sleep(Duration::from_millis(200));
    }
}

fn status(pair: &Pair) -> String {
    shaper_ok(pair, &["status", "--iface", "right0"])
}

/// `shaper ARGS` on the receiving side; its output, which must be a
/// success.
fn shaper_ok(pair: &Pair, args: &[&str]) -> String {
    let out = pair
        .right
        .shaper()
        .args(args)
        .output()
        .expect("shaper runs");
    assert!(
        out.status.success(),
        "shaper {args:?} failed: {}",
        text(&out)
    );
    text(&out)
}

fn stop(child: Child, sig: i32) -> (Option<i32>, String) {
    let pid = i32::try_from(child.id()).expect("pid fits");
    // SAFETY: kill has no memory-safety preconditions; the pid is our child.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    let out = child.wait_with_output().expect("wait shaper");
    (out.status.code(), text(&out))
}

/// The ingress counter `name` from `shaper status --json`.
fn ingress_counter(pair: &Pair, name: &str) -> u64 {
    let out = shaper_ok(pair, &["status", "--iface", "right0", "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}): {out}"));
    v["ingress"]["counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no ingress counter {name} in {v}"))
}

#[test]
fn sigterm_restores_and_status_shows_the_ingress_hook() {
    if skip() {
        return;
    }
    let pair = Pair::new("ipt", 1);
    let before = pair.right.tc_state("right0");
    let child = start(&pair, "20mbit");
    let st = status(&pair);
    assert!(st.contains("egress not shaped"), "{st}");
    assert!(st.contains("ingress:    police at 20Mbit"), "{st}");
    let (code, out) = stop(child, libc::SIGTERM);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("right0 restored"), "{out}");
    assert!(out.contains("shaper: ingress police:"), "{out}");
    assert_eq!(pair.right.tc_state("right0"), before);
    assert!(status(&pair).contains("not shaped by shaper"));
}

#[test]
fn a_flood_is_policed_while_a_ping_beside_it_is_untouched() {
    if skip() {
        return;
    }
    if std::process::Command::new("iperf3")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: iperf3 (a tool, not a kernel feature) is not installed");
        return;
    }
    let pair = Pair::new("ipf", 1);
    let child = start(&pair, "10mbit");
    let mut server = pair
        .right
        .command("iperf3")
        .args(["-s", "-1", "-p", "5299"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 server");
    sleep(Duration::from_millis(500));
    // Unresponsive and not ECN-capable: 40 Mbit/s of UDP for 6 s.
    let flood = pair
        .left
        .command("iperf3")
        .args([
            "-c",
            "10.77.0.2",
            "-p",
            "5299",
            "-u",
            "-b",
            "40M",
            "-t",
            "6",
            "-l",
            "1200",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iperf3 client");
    sleep(Duration::from_secs(1));
    let ping = pair
        .left
        .command("ping")
        .args(["-c", "20", "-i", "0.2", "-W", "1", "10.77.0.2"])
        .output()
        .expect("ping");
    let flood = flood.wait_with_output().expect("iperf3 client ends");
    let _ = server.kill();
    let _ = server.wait();
    let drops = ingress_counter(&pair, "police_drop");
    let marks = ingress_counter(&pair, "ce_marked");
    let packets = ingress_counter(&pair, "packets");
    let (code, out) = stop(child, libc::SIGTERM);
    assert_eq!(code, Some(0), "{out}");
    eprintln!(
        "flood: {}",
        text(&flood)
            .lines()
            .rev()
            .take(4)
            .collect::<Vec<_>>()
            .join(" | ")
    );
    eprintln!("policer: {packets} packets, {drops} dropped, {marks} marked");
    let ping_text = text(&ping);
    assert!(
        ping_text.contains(" 0% packet loss"),
        "the ping lost packets beside the flood: {ping_text}"
    );
    assert!(
        drops > 0,
        "a flood at 4x the rate was never dropped ({packets} packets)"
    );
    assert_eq!(marks, 0, "nothing in this traffic is ECN-capable");
    assert!(
        drops * 4 <= packets + 4,
        "more than one packet in four dropped: {drops} of {packets}"
    );
}

#[test]
fn sigkill_then_cleanup_removes_the_ingress_hook() {
    if skip() {
        return;
    }
    let pair = Pair::new("ipk", 1);
    let before = pair.right.tc_state("right0");
    let child = start(&pair, "20mbit");
    let (code, _) = stop(child, libc::SIGKILL);
    assert_eq!(code, None, "killed by a signal");
    let st = status(&pair);
    assert!(st.contains("gone: run `shaper cleanup`"), "{st}");
    assert!(st.contains("ingress:    police at 20Mbit"), "{st}");
    let out = shaper_ok(&pair, &["cleanup", "--iface", "right0"]);
    assert!(out.contains("right0: restored"), "{out}");
    assert_eq!(pair.right.tc_state("right0"), before);
    assert!(status(&pair).contains("not shaped by shaper"));
}

/// `ifb` mode needs sch_fq: without it (this machine's kernel) it exits 2
/// and changes nothing; with it (6.12 and 6.1 in the VM) the IFB is
/// created, carries the download through sch_fq (fed by the BPF redirect
/// with TCX, by matchall + mirred on 6.1), and is gone again, its ingress
/// filter too, after SIGTERM, and after SIGKILL + `shaper cleanup`.
#[test]
fn ifb_mode_creates_its_ifb_and_removes_it_or_exits_2_without_sch_fq() {
    if skip() {
        return;
    }
    let pair = Pair::new("ipi", 1);
    let before = pair.right.tc_state("right0");
    let args = [
        "run",
        "--iface",
        "right0",
        "--ingress-rate",
        "20mbit",
        "--ingress-mode",
        "ifb",
    ];
    if !shaper_tests::topo::kernel_has_fq() {
        let out = pair.right.shaper().args(args).output().expect("shaper run");
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("sch_fq"), "{}", text(&out));
        assert_eq!(pair.right.tc_state("right0"), before);
        assert!(status(&pair).contains("not shaped by shaper"));
        assert!(!pair.right.sh("ip -o link show").contains("ifb4right0"));
        eprintln!("(no sch_fq: checked the refusal only)");
        return;
    }
    for sig in [libc::SIGTERM, libc::SIGKILL] {
        let child = pair
            .right
            .shaper()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn shaper run");
        let deadline = Instant::now() + Duration::from_secs(150);
        let attached =
            |st: String| st.contains("ingress:    ifb at 20Mbit") && !st.contains("not attached");
        while !attached(status(&pair)) {
            assert!(Instant::now() < deadline, "not attached: {}", status(&pair));
            sleep(Duration::from_millis(300));
        }
        let ifb = pair.right.sh("tc qdisc show dev ifb4right0");
        assert!(ifb.contains("qdisc fq 5348:"), "the IFB's root: {ifb}");
        if !shaper::attach::kernel_has_tcx() {
            // Below TCX the redirect is tc's matchall + mirred (tc::mirred).
            let filters = pair.right.sh("tc filter show dev right0 ingress");
            assert!(
                filters.contains("matchall") && filters.contains("Redirect to device ifb4right0"),
                "the ingress redirect: {filters}"
            );
            assert!(
                status(&pair).contains("matchall+mirred"),
                "{}",
                status(&pair)
            );
        }
        let ping = pair
            .left
            .command("ping")
            .args(["-c", "5", "-i", "0.2", "-W", "1", "10.77.0.2"])
            .output()
            .expect("ping");
        assert!(text(&ping).contains(" 0% packet loss"), "{}", text(&ping));
        let ifb_status = shaper_ok(&pair, &["status", "--iface", "ifb4right0", "--json"]);
        let v: serde_json::Value = serde_json::from_str(ifb_status.trim()).expect("status JSON");
        assert!(
            v["counters"]["packets"].as_u64().unwrap_or(0) >= 5,
            "the IFB's pacer saw the pings: {v}"
        );
        let (code, out) = stop(child, sig);
        if sig == libc::SIGKILL {
            assert_eq!(code, None);
            shaper_ok(&pair, &["cleanup", "--iface", "right0"]);
        } else {
            assert_eq!(code, Some(0), "{out}");
        }
        assert!(
            !pair.right.sh("ip -o link show").contains("ifb4right0"),
            "the IFB is still there after {sig}"
        );
        assert_eq!(pair.right.tc_state("right0"), before);
        let filters = pair.right.sh("tc filter show dev right0 ingress");
        assert!(
            !filters.contains("matchall"),
            "left behind after {sig}: {filters}"
        );
        let st = shaper_ok(&pair, &["status"]);
        assert!(st.contains("no interface is shaped"), "{st}");
    }
}
