//! `shaper run --ingress-rate R --ingress-mode police` (the AQM policer)
//! with the real binary on a veth between two namespaces. The policer
//! needs no sch_fq, so these run on this machine's kernel (TCX) as well as
//! in the VM (6.1: a cls_bpf filter on clsact).
//!
//! Checks: it attaches at ingress and `shaper status` says so (over hosts
//! too, with the mode); under a UDP
//! flood at 4x the rate it drops (counted) while a ping beside it loses
//! nothing and is never marked; SIGTERM and SIGKILL + `shaper cleanup`
//! leave the interface's tc state exactly as before; the default mode,
//! `ifb`, creates and removes its IFB and its ingress redirect (VM), or
//! exits 2 without sch_fq (here), naming the policer as the way without it.
//!
//! Run: `cargo test -p shaper-tests --test ingress_police -- --test-threads=1`

use shaper_tests::{
    shaper_proc::{ShaperProc, status_all, status_json},
    skip::{Need, require},
    topo::{Pair, text},
    traffic::{Iperf3Server, iperf3_report},
};

/// Starts `shaper run --iface right0 --ingress-rate RATE --ingress-mode
/// police ARGS` on the receiving side; returns once its ingress hook is
/// attached.
fn start<'a>(pair: &'a Pair, rate: &str, args: &[&str]) -> ShaperProc<'a> {
    let mut all = vec!["--ingress-rate", rate, "--ingress-mode", "police"];
    all.extend_from_slice(args);
    ShaperProc::start(Some(&pair.right), "right0", &all)
}

/// Runs `shaper set-rate --iface right0 ARGS` on the receiving side.
fn set_rate(pair: &Pair, args: &[&str]) -> std::process::Output {
    pair.right
        .shaper()
        .args(["set-rate", "--iface", "right0"])
        .args(args)
        .output()
        .expect("shaper set-rate")
}

/// Asserts nothing is shaped in the receiving namespace any more.
fn nothing_shaped(pair: &Pair) {
    let left = status_all(Some(&pair.right), None);
    assert!(left.is_empty(), "records left: {left:?}");
}

#[test]
fn sigterm_restores_and_status_shows_the_ingress_hook() {
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("ipt", 1);
    let before = pair.right.tc_state("right0");
    let mut run = start(&pair, "20mbit", &[]);
    let st = run.status();
    assert!(!st.egress_shaped(), "{st}");
    let ingress = st.ingress();
    assert_eq!(
        (ingress.mode.as_str(), ingress.rate_bits_per_s),
        ("police", 20_000_000),
        "{st}"
    );
    assert_ne!(ingress.classifier, "none", "{st}");
    // The report a person reads says the same.
    let report = run.status_text();
    assert!(report.contains("egress not shaped"), "{report}");
    assert!(report.contains("ingress:    police at 20Mbit"), "{report}");
    // The download's rate changes live; the upload's cannot, as there is
    // none.
    let out = set_rate(&pair, &["--ingress", "10mbit"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("ingress rate 20Mbit -> 10Mbit"),
        "{}",
        text(&out)
    );
    assert_eq!(run.status().ingress().rate_bits_per_s, 10_000_000);
    let out = set_rate(&pair, &["10mbit"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let exit = run.sigterm();
    let out = exit.text();
    assert_eq!(exit.code(), Some(0), "{out}");
    assert!(out.contains("right0 restored"), "{out}");
    assert!(out.contains("shaper: ingress police:"), "{out}");
    assert_eq!(pair.right.tc_state("right0"), before);
    assert!(run.status_json().is_none(), "a record was left");
}

/// The policer over hosts: `status` names its mode, the program over
/// hosts is the one at the hook, and SIGTERM restores.
#[test]
fn the_policer_over_hosts_shows_its_mode_and_restores() {
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("iph", 1);
    let before = pair.right.tc_state("right0");
    let mut run = start(&pair, "20mbit", &["--ingress-isolate", "dual-dsthost"]);
    let st = run.status();
    assert_eq!(
        st.ingress().isolation.as_deref(),
        Some("dual-dsthost"),
        "{st}"
    );
    let report = run.status_text();
    assert!(report.contains("isolation:  dual-dsthost"), "{report}");
    // The kernel keeps a program's first 15 characters of name.
    assert!(report.contains("shaper_police_h"), "{report}");
    let exit = run.sigterm();
    assert_eq!(exit.code(), Some(0), "{}", exit.text());
    assert_eq!(pair.right.tc_state("right0"), before);
    nothing_shaped(&pair);
}

#[test]
fn a_flood_is_policed_while_a_ping_beside_it_is_untouched() {
    if !require(&[Need::Root, Need::Tool("iperf3", "--version")]) {
        return;
    }
    let pair = Pair::new("ipf", 1);
    let mut run = start(&pair, "10mbit", &[]);
    let server = Iperf3Server::start(&pair.right, 5299, &[]);
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
            "-J",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("iperf3 client");
    std::thread::sleep(std::time::Duration::from_secs(1));
    let ping = pair
        .left
        .command("ping")
        .args(["-c", "20", "-i", "0.2", "-W", "1", "10.77.0.2"])
        .output()
        .expect("ping");
    let flood = flood.wait_with_output().expect("iperf3 client ends");
    drop(server);
    let st = run.status();
    let drops = st.ingress_counter("police_drop");
    let marks = st.ingress_counter("ce_marked");
    let packets = st.ingress_counter("packets");
    let exit = run.sigterm();
    assert_eq!(exit.code(), Some(0), "{}", exit.text());
    eprintln!("flood: {}", iperf3_report(&flood)["end"]["sum"]);
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
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("ipk", 1);
    let before = pair.right.tc_state("right0");
    let mut run = start(&pair, "20mbit", &[]);
    let exit = run.sigkill();
    assert_eq!(exit.code(), None, "killed by a signal");
    let st = run.status();
    assert!(!st.running, "{st}");
    assert_eq!(
        (st.ingress().mode.as_str(), st.ingress().rate_bits_per_s),
        ("police", 20_000_000),
        "{st}"
    );
    // The report tells the user what to do.
    let report = run.status_text();
    assert!(report.contains("gone: run `shaper cleanup`"), "{report}");
    let out = run.cleanup();
    assert!(out.contains("right0: restored"), "{out}");
    assert_eq!(pair.right.tc_state("right0"), before);
    assert!(run.status_json().is_none(), "a record was left");
}

/// `ifb` mode, the default, needs sch_fq: without it (this machine's
/// kernel) it exits 2, names `police` as the mode that needs none, and
/// changes nothing; with it (6.12 and 6.1 in the VM) the IFB is
/// created, carries the download through sch_fq (fed by the BPF redirect
/// with TCX, by matchall + mirred on 6.1), and is gone again, its ingress
/// filter too, after SIGTERM, and after SIGKILL + `shaper cleanup`.
#[test]
fn the_default_ifb_mode_creates_its_ifb_and_removes_it_or_exits_2_without_sch_fq() {
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("ipi", 1);
    let before = pair.right.tc_state("right0");
    // No --ingress-mode: the default is ifb.
    let args = ["--ingress-rate", "20mbit"];
    if shaper_tests::topo::kernel_has_fq() {
        ifb_mode_round_trips(&pair, &before, &args);
    } else {
        let out = pair
            .right
            .shaper()
            .args(["run", "--iface", "right0"])
            .args(args)
            .output()
            .expect("shaper run");
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("sch_fq"), "{}", text(&out));
        assert!(
            text(&out).contains("--ingress-mode police"),
            "{}",
            text(&out)
        );
        assert_eq!(pair.right.tc_state("right0"), before);
        nothing_shaped(&pair);
        assert!(!pair.right.sh("ip -o link show").contains("ifb4right0"));
        eprintln!("(no sch_fq: checked the refusal only)");
    }
}

/// The sch_fq half of the test above: run `ifb` mode, check it, stop it
/// with SIGTERM, then again with SIGKILL + `shaper cleanup`.
fn ifb_mode_round_trips(pair: &Pair, before: &str, args: &[&str]) {
    for sig in [libc::SIGTERM, libc::SIGKILL] {
        let mut run = ShaperProc::start(Some(&pair.right), "right0", args);
        let st = run.status();
        let ingress = st.ingress();
        assert_eq!(
            (
                ingress.mode.as_str(),
                ingress.rate_bits_per_s,
                ingress.ifb.as_deref()
            ),
            ("ifb", 20_000_000, Some("ifb4right0")),
            "{st}"
        );
        let ifb = pair.right.sh("tc qdisc show dev ifb4right0");
        assert!(ifb.contains("qdisc fq 5348:"), "the IFB's root: {ifb}");
        if !shaper::checks::kernel_has_tcx() {
            // Below TCX the redirect is tc's matchall + mirred (tc::mirred).
            let filters = pair.right.sh("tc filter show dev right0 ingress");
            assert!(
                filters.contains("matchall") && filters.contains("Redirect to device ifb4right0"),
                "the ingress redirect: {filters}"
            );
            assert_eq!(ingress.classifier, "tc clsact mirred", "{st}");
        }
        let ping = pair
            .left
            .command("ping")
            .args(["-c", "5", "-i", "0.2", "-W", "1", "10.77.0.2"])
            .output()
            .expect("ping");
        assert!(text(&ping).contains(" 0% packet loss"), "{}", text(&ping));
        let ifb_status = status_json(Some(&pair.right), "ifb4right0").expect("the IFB is shaped");
        assert!(
            ifb_status.counter("packets") >= 5,
            "the IFB's pacer saw the pings: {ifb_status}"
        );
        // The download's rate changes live, on the IFB's pacer.
        let out = set_rate(pair, &["--ingress", "10mbit"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert_eq!(run.status().ingress().rate_bits_per_s, 10_000_000);
        let ifb_status = status_json(Some(&pair.right), "ifb4right0").expect("the IFB is shaped");
        assert_eq!(ifb_status.rate_bits_per_s, 10_000_000, "{ifb_status}");
        let exit = run.stop(sig);
        if sig == libc::SIGKILL {
            assert_eq!(exit.code(), None);
            run.cleanup();
        } else {
            assert_eq!(exit.code(), Some(0), "{}", exit.text());
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
        nothing_shaped(pair);
    }
}
