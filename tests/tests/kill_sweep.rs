//! Recovery is exact at any kill point: `shaper run --rate 20mbit
//! --ingress-rate 20mbit` (the download in the default mode, on an IFB) on
//! a veth holding an HTB tree with an fq_codel leaf, killed with SIGKILL at
//! points spread over its attach, its steady state and its restore, and
//! `shaper cleanup` after each kill. After every cleanup the device's
//! qdiscs, classes, filters and link settings are what they were before
//! the first run, the namespace has the same devices (no IFB left), and no
//! record is left.
//!
//! The points come from a first run measured here (how long attach and
//! restore take on this kernel, which under emulation is seconds): evenly
//! spread over the attach, two in the steady state, and evenly spread over
//! the restore that SIGTERM starts. The sweep stops at the first point
//! that leaves a difference (the next would start from a changed device)
//! and names it with the lines that changed.
//!
//! Needs sch_fq, sch_fq_codel and sch_htb (the VM's kernels); elsewhere it
//! skips with a reason, and under `SHAPER_REQUIRE_FULL_KERNEL=1` a skip
//! fails.

use std::{
    process::Stdio,
    thread::sleep,
    time::{Duration, Instant},
};

use shaper_tests::{
    shaper_proc::{ShaperProc, cleanup, shaper_command, status_all},
    skip::{Need, require},
    topo::Pair,
};

const NEEDS: &[Need<'static>] = &[
    Need::Root,
    Need::Sch("fq"),
    Need::Sch("fq_codel"),
    Need::Sch("htb"),
];

const ARGS: [&str; 4] = ["--rate", "20mbit", "--ingress-rate", "20mbit"];
/// Kill points spread over the attach.
const DURING_ATTACH: u32 = 12;
/// Kill points in the steady state, after the attach.
const STEADY: [Duration; 2] = [Duration::from_millis(300), Duration::from_secs(2)];
/// Kill points spread over the restore.
const DURING_RESTORE: u32 = 6;

/// Where a trial kills the run.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// This long after the spawn, attached or not.
    AfterSpawn(Duration),
    /// This long after the run is shaping.
    Steady(Duration),
    /// This long after SIGTERM started the restore.
    InRestore(Duration),
}

/// The device's traffic control and link settings and the namespace's
/// device names, for identity checks.
fn state(pair: &Pair) -> String {
    pair.left.tc_state("left0")
        + &pair.left.sh("ip -d link show dev left0")
        + &pair.left.sh("ip -o link show | cut -d: -f2 | sort")
}

/// The lines of `after` that differ from `before`, for the failure message.
fn difference(before: &str, after: &str) -> String {
    let (b, a): (Vec<&str>, Vec<&str>) = (before.lines().collect(), after.lines().collect());
    let gone: Vec<&str> = b.iter().filter(|l| !a.contains(l)).copied().collect();
    let new: Vec<&str> = a.iter().filter(|l| !b.contains(l)).copied().collect();
    format!("gone: {gone:?}; new: {new:?}")
}

fn trial(pair: &Pair, kill: Kill) {
    match kill {
        Kill::AfterSpawn(t) => {
            let mut child = shaper_command(Some(&pair.left))
                .args(["run", "--iface", "left0"])
                .args(ARGS)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn shaper run");
            sleep(t);
            // A run that already failed or exited is only reaped.
            let _ = child.kill();
            child.wait().expect("wait for shaper run");
        }
        Kill::Steady(t) => {
            let mut run = ShaperProc::start(Some(&pair.left), "left0", &ARGS);
            sleep(t);
            run.sigkill();
        }
        Kill::InRestore(t) => {
            let mut run = ShaperProc::start(Some(&pair.left), "left0", &ARGS);
            run.signal(libc::SIGTERM);
            sleep(t);
            run.sigkill();
        }
    }
}

#[test]
fn sigkill_at_any_point_then_cleanup_restores_exactly() {
    if !require(NEEDS) {
        return;
    }
    let pair = Pair::new("sweep", 1);
    pair.left.sh(concat!(
        "tc qdisc add dev left0 root handle 1: htb default 20 && ",
        "tc class add dev left0 parent 1: classid 1:1 htb rate 100mbit ceil 100mbit && ",
        "tc class add dev left0 parent 1:1 classid 1:10 htb rate 60mbit ceil 100mbit && ",
        "tc class add dev left0 parent 1:1 classid 1:20 htb rate 40mbit ceil 100mbit && ",
        "tc qdisc add dev left0 parent 1:10 handle 10: fq_codel target 5ms interval 100ms && ",
        "tc qdisc add dev left0 parent 1:20 handle 20: pfifo limit 100 && ",
        "tc filter add dev left0 parent 1: protocol ip prio 1 u32 match ip dport 22 0xffff \
         flowid 1:10"
    ));
    let before = state(&pair);
    assert!(
        before.contains("fq_codel") && before.contains("target 5ms"),
        "{before}"
    );

    // The measured run: how long attach and restore take here.
    let t = Instant::now();
    let mut run = ShaperProc::start(Some(&pair.left), "left0", &ARGS);
    let attach = t.elapsed();
    let t = Instant::now();
    let exit = run.sigterm();
    let restore = t.elapsed();
    assert_eq!(exit.code(), Some(0), "{}", exit.text());
    assert_eq!(state(&pair), before, "SIGTERM did not restore");
    eprintln!(
        "attach {:.2} s, restore {:.2} s",
        attach.as_secs_f64(),
        restore.as_secs_f64()
    );

    let mut points: Vec<Kill> = (0..DURING_ATTACH)
        .map(|i| Kill::AfterSpawn(attach * i / DURING_ATTACH))
        .collect();
    points.extend(STEADY.map(Kill::Steady));
    points.extend((0..DURING_RESTORE).map(|i| Kill::InRestore(restore * i / DURING_RESTORE)));
    let mut failed = Vec::new();
    for kill in &points {
        trial(&pair, *kill);
        let out = cleanup(Some(&pair.left), None);
        let after = state(&pair);
        let left = status_all(Some(&pair.left), None);
        let verdict = if after != before {
            format!("differs: {}", difference(&before, &after))
        } else if !left.is_empty() {
            format!(
                "a record is left: {:?}",
                left.iter().map(|s| &s.iface).collect::<Vec<_>>()
            )
        } else {
            "exact".to_owned()
        };
        eprintln!("  {kill:?}: {verdict} (cleanup: {})", out.trim());
        if verdict != "exact" {
            failed.push(format!("{kill:?}: {verdict}"));
            break;
        }
    }
    assert!(
        failed.is_empty(),
        "a kill point of {} left the device changed: {}",
        points.len(),
        failed.join("\n")
    );
}
