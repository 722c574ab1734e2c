//! `shaper lab --quick` end to end: none and the shaper (egress pacer and
//! ingress policer) on the lab's testbed, then the report, the plots and the
//! JSON are checked (VM: the host lacks sch_fq and netem; elsewhere this
//! skips with the reason, and under `SHAPER_REQUIRE_FULL_KERNEL=1` a skip
//! fails). CAKE beside the shaper is the other VM tests' comparison and the
//! benchmark's; here `none` shows the bloat the shaper must cure.
//!
//! What must hold: the report and the three plots exist; the JSON's
//! `states` has every requested state with non-zero upload and download
//! goodput, idle and loaded latency samples, and every raw sample list is
//! non-empty; the shaped states keep the upload at or below about their
//! rate (only the upper bound: under emulation even `none` may not exceed
//! it); under `none` the access link's buffer shows as at least 50 ms more
//! upload and download latency, and the shaper cuts both to a quarter or
//! less; teardown warns about nothing.
//!
//! Also: bad input (an unknown state, a bad rate, out-of-range queues, a
//! per-queue state on one queue, an unknown tin mode) exits 2 with a
//! message naming the problem and the fix before the testbed is built, and
//! leaves no lab namespace; SIGINT stops a run and
//! its namespaces are gone when it exits.

use std::process::Command;

use serde_json::Value;
use shaper_tests::{
    skip::{Need, require},
    topo::{shaper_bin, text},
};

/// The lab namespaces present whose names start with `prefix` (`shl-`:
/// every lab process's; `shl-<pid>-`: one's).
fn lab_namespaces(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn bad_input_exits_2_before_any_namespace() {
    if !require(&[Need::Root]) {
        return;
    }
    let before = lab_namespaces("shl-").len();
    for (args, wants) in [
        (&["--states", "none,cak"][..], &["unknown state 'cak'"][..]),
        (&["--rate", "fast"], &["--rate"]),
        (&["--queues", "0"], &["--queues", "1 to 16"]),
        (&["--queues", "17"], &["--queues 4"]),
        (&["--states", "cake_split"], &["--queues 2 or more"]),
        (&["--diffserv", "diffserv5"], &["diffserv4"]),
    ] {
        let out = Command::new(shaper_bin())
            .arg("lab")
            .args(args)
            .output()
            .expect("shaper runs");
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {t}");
        for want in wants {
            assert!(t.contains(want), "{args:?}: {want:?} in {t}");
        }
        assert!(!t.contains("building the testbed"), "{args:?}: {t}");
    }
    assert_eq!(
        lab_namespaces("shl-").len(),
        before,
        "a refused lab run created namespaces"
    );
}

#[test]
fn sigint_stops_the_lab_and_removes_its_namespaces() {
    if !require(&[Need::Root, Need::Tool("iperf3", "--version")]) {
        return;
    }
    // State none without netem: nothing the kernel may lack.
    let child = Command::new(shaper_bin())
        .args(["lab", "--quick", "--states", "none", "--rtt", "0ms"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("shaper lab starts");
    let pid = child.id();
    let ours = format!("shl-{pid}-");
    let t = std::time::Instant::now();
    while lab_namespaces(&ours).is_empty() && t.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        !lab_namespaces(&ours).is_empty(),
        "the lab never built its testbed"
    );
    // SAFETY: kill with a valid signal on our own child's pid.
    let rc = unsafe { libc::kill(i32::try_from(pid).expect("pid fits"), libc::SIGINT) };
    assert_eq!(rc, 0);
    let out = child.wait_with_output().expect("shaper lab exits");
    let t_out = text(&out);
    assert!(!out.status.success(), "{t_out}");
    assert!(t_out.contains("interrupted"), "{t_out}");
    assert!(
        lab_namespaces(&ours).is_empty(),
        "{:?}",
        lab_namespaces(&ours)
    );
}

#[test]
fn quick_lab_reports_every_state() {
    if !require(&[
        Need::Root,
        Need::Sch("fq"),
        Need::Sch("netem"),
        Need::Tool("iperf3", "--version"),
    ]) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("shaper-lab-{}", std::process::id()));
    let json = dir.join("lab.json");
    let report = dir.join("report");
    let t = std::time::Instant::now();
    let out = Command::new(shaper_bin())
        .args([
            "lab",
            "--quick",
            "--states",
            "none,shaper-police",
            "--report",
        ])
        .arg(&report)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("shaper lab runs");
    let elapsed = t.elapsed().as_secs_f64();
    let t_out = text(&out);
    eprintln!("{t_out}");
    eprintln!("shaper lab --quick took {elapsed:.0} s");
    assert!(out.status.success(), "shaper lab failed: {t_out}");
    assert!(t_out.contains("lab: [1/2] none"), "progress lines: {t_out}");
    assert!(
        !t_out.contains("WARN"),
        "teardown warnings (a namespace or state left?): {t_out}"
    );

    let md = std::fs::read_to_string(report.join("report.md")).expect("report.md");
    for part in [
        "## Throughput",
        "## Bufferbloat grade",
        "## UDP probe during upload",
        "## Verdict",
        "the download rows say which are shaped",
        "download (server to client, shaped)",
        "download (server to client, not shaped)",
    ] {
        assert!(md.contains(part), "report lacks {part}: {md}");
    }
    for svg in ["throughput.svg", "latency_cdf.svg", "staircase.svg"] {
        let s = std::fs::read_to_string(report.join(svg)).expect(svg);
        assert!(s.contains("<svg") && s.contains("polyline"), "{svg}: {s}");
    }
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("valid JSON");
    let rate_mbps = 50.0;
    for name in ["none", "shaper-police"] {
        let s = &v["states"][name];
        let num = |k: &str| {
            s[k].as_f64()
                .unwrap_or_else(|| panic!("states.{name}.{k} missing: {s}"))
        };
        for k in [
            "up_mbps",
            "down_mbps",
            "ping_idle_ms",
            "ping_loaded_p50_ms",
            "ping_loaded_p99_ms",
        ] {
            assert!(num(k) > 0.0, "states.{name}.{k} = {}", num(k));
        }
        for k in ["cpu_busy_max_pct", "zero_idle_samples", "retransmits"] {
            assert!(num(k) >= 0.0, "states.{name}.{k}");
        }
        assert!(num("ping_loaded_p99_ms") >= num("ping_loaded_p50_ms"));
        // The path has 20 ms of netem delay: every RTT includes it.
        assert!(
            num("ping_idle_ms") >= 19.0,
            "{name}: idle {}",
            num("ping_idle_ms")
        );
        if name != "none" {
            assert!(
                num("up_mbps") < rate_mbps * 1.1,
                "{name} carried {} Mbit/s at a 50 Mbit/s rate",
                num("up_mbps")
            );
        }
        let raw = &v["raw"][name];
        for path in [
            "/ping_idle_before_ms",
            "/ping_idle_after_ms",
            "/upload/ping_ms",
            "/download/ping_ms",
            "/upload/tcp/intervals",
            "/staircase",
            "/cpu",
        ] {
            let a = raw.pointer(path).and_then(Value::as_array);
            assert!(a.is_some_and(|a| !a.is_empty()), "raw.{name}{path} empty");
        }
    }
    // The access link's buffer fills under none; a shaper below the link's
    // rate keeps it empty, upload and (the policer shapes ingress) download.
    let up_bloat = |name: &str| {
        v["states"][name]["upload_bloat_ms"]
            .as_f64()
            .unwrap_or_else(|| panic!("states.{name}.upload_bloat_ms missing"))
    };
    assert!(
        up_bloat("none") >= 50.0,
        "the link's buffer did not show under none: +{} ms",
        up_bloat("none")
    );
    let down_bloat = |name: &str| {
        let s = &v["states"][name];
        let f = |k: &str| {
            s[k].as_f64()
                .unwrap_or_else(|| panic!("states.{name}.{k} missing"))
        };
        (f("ping_down_loaded_p50_ms") - f("ping_idle_ms")).max(0.0)
    };
    assert!(
        down_bloat("none") >= 50.0,
        "the link's download buffer did not show under none: +{} ms",
        down_bloat("none")
    );
    {
        let name = "shaper-police";
        assert!(
            up_bloat(name) <= up_bloat("none") / 4.0,
            "{name}: upload latency +{} ms vs none's +{} ms",
            up_bloat(name),
            up_bloat("none")
        );
        assert!(
            down_bloat(name) <= down_bloat("none") / 4.0,
            "{name}: download latency +{} ms vs none's +{} ms",
            down_bloat(name),
            down_bloat("none")
        );
        assert_eq!(
            v["states"][name]["download_shaped"],
            Value::Bool(true),
            "{name}"
        );
    }
    assert_eq!(v["states"]["none"]["download_shaped"], Value::Bool(false));
    let _ = std::fs::remove_dir_all(&dir);
}
