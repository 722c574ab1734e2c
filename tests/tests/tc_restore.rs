//! `shaper::tc` against the host kernel: record a qdisc tree, replace it
//! with the shaper's root, put it back, and compare everything `tc -d`
//! shows (qdiscs, classes, filters and chains of every handle, clsact hooks)
//! before and after. Also: what snapshot refuses, and the feature probes.
//!
//! This kernel has htb, tbf, pfifo, mq, clsact, u32 and cls_bpf but no
//! sch_fq, so the install path is exercised through `install_root` with
//! those kinds; `install_fq_root` runs the same code with "fq".
//!
//! Each test builds its own veth pair (or ifb device) in a fresh network
//! namespace, with IPv6 off so that no stray packets pass the qdiscs.
//! Needs root and `tc`: see [`shaper_tests::skip`] for what a missing need
//! means.
//!
//! Run: `cargo test -p shaper-tests --test tc_restore -- --test-threads=1`

use shaper::tc::{self, Attr, TC_H_INGRESS, TCA_KIND, TcError};
use shaper_tests::{
    netns::{sh, veth_pair},
    skip::require,
    tc_util::{
        NEEDS, assert_same_view, expect_refusal, ifindex, install_htb, kernel_config, round_trip,
        run, setup, tc_batch, tc_view,
    },
};

#[test]
fn default_noqueue_root_comes_back_after_htb_install() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    let snap = round_trip("va", install_htb);
    assert_eq!(snap.describe(), "default root noqueue 0:");
    let root = tc::root_qdisc(ifindex("va"))
        .expect("root")
        .expect("a root");
    assert_eq!((root.kind.as_str(), root.handle), ("noqueue", 0));
}

#[test]
fn a_device_that_was_never_up_gets_no_qdisc_back() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    // Never up: the device has only the built-in noop qdisc, which dumps
    // do not list, until dev_activate attaches the default on first up.
    sh("ip link add va type veth peer name vb");
    let snap = round_trip("va", install_htb);
    assert_eq!(
        snap.describe(),
        "no root qdisc (the device has never been up)"
    );
    sh("ip link set va up");
    assert!(run("tc qdisc show dev va").starts_with("qdisc noqueue 0: root"));
}

/// Installs the mq root with one pfifo per queue and checks there are
/// `queues` of them while installed.
fn install_mq_pfifo(dev: &str, queues: u32) -> impl FnOnce(u32) + '_ {
    move |index| {
        tc::install_root(index, queues, "pfifo", None).expect("install mq root");
        let view = run(&format!("tc qdisc show dev {dev}"));
        assert!(view.contains("qdisc mq 5348: root"), "{view}");
        for q in 1..=queues {
            let line = format!("parent 5348:{q:x} limit");
            assert_eq!(
                view.matches(&line).count(),
                1,
                "no pfifo on queue {q}:\n{view}"
            );
        }
        assert_eq!(
            view.matches("qdisc pfifo ").count() as u32,
            queues,
            "{view}"
        );
        // Installing again with the same arguments changes nothing.
        tc::install_root(index, queues, "pfifo", None).expect("install again");
        assert_eq!(run(&format!("tc qdisc show dev {dev}")), view);
    }
}

#[test]
fn default_mq_root_of_a_multiqueue_device_comes_back() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    // veth has IFF_NO_QUEUE (default root noqueue even with 4 queues); ifb
    // gets the kernel's default mq with a pfifo_fast per queue.
    sh("ip link add name ifb0 numtxqueues 4 numrxqueues 4 type ifb && ip link set ifb0 up");
    let before = run("tc qdisc show dev ifb0");
    assert!(before.starts_with("qdisc mq 0: root"), "{before}");
    let snap = round_trip("ifb0", install_mq_pfifo("ifb0", 4));
    assert_eq!(
        snap.describe(),
        "default root mq 0: with 4 classes, 4 child qdiscs"
    );
}

#[test]
fn multiqueue_veth_gets_mq_with_children_and_noqueue_back() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    sh(
        "ip link add sa0 numtxqueues 4 numrxqueues 4 type veth peer name sb0 && ip link set sa0 up && ip link set sb0 up",
    );
    round_trip("sa0", install_mq_pfifo("sa0", 4));
}

#[test]
fn user_mq_root_with_replaced_children_comes_back() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    sh(
        "ip link add sa0 numtxqueues 4 numrxqueues 4 type veth peer name sb0 && ip link set sa0 up && ip link set sb0 up",
    );
    sh("tc qdisc replace dev sa0 root handle 1: mq");
    sh("tc qdisc replace dev sa0 parent 1:2 pfifo limit 10");
    sh("tc qdisc replace dev sa0 parent 1:3 handle 30: tbf rate 1mbit burst 10k latency 10ms");
    let snap = round_trip("sa0", install_mq_pfifo("sa0", 4));
    assert_eq!(snap.describe(), "root mq 1: with 5 classes, 4 child qdiscs");
}

/// The HTB tree of the brief, with u32 filters at two priorities on the
/// qdisc, one on a class (same priority: shared u32 table numbering), an
/// action, and a classic-BPF filter with two elements.
fn build_htb_tree(dev: &str, peer: &str) {
    let cmds = [
        "qdisc add dev DEV root handle 1: htb default 30 r2q 20",
        "class add dev DEV parent 1: classid 1:1 htb rate 100mbit ceil 100mbit",
        "class add dev DEV parent 1:1 classid 1:10 htb rate 30mbit ceil 100mbit prio 1 quantum 3000 burst 20k cburst 10k",
        "class add dev DEV parent 1:1 classid 1:20 htb rate 20mbit ceil 50mbit prio 2 quantum 6000",
        "class add dev DEV parent 1:1 classid 1:30 htb rate 5mbit ceil 20mbit prio 7 burst 4k",
        "qdisc add dev DEV parent 1:10 handle 10: tbf rate 30mbit burst 32k latency 50ms",
        "qdisc add dev DEV parent 1:20 pfifo limit 50",
        "qdisc add dev DEV parent 1:30 handle 30: bfifo limit 30000",
        "filter add dev DEV parent 1: protocol ip prio 1 u32 match ip dport 22 0xffff flowid 1:10",
        "filter add dev DEV parent 1: protocol ip prio 2 u32 match ip src 10.0.0.0/8 flowid 1:20",
        "filter add dev DEV parent 1: protocol ip prio 2 u32 match ip src 192.168.0.0/16 match ip tos 0x10 0xff flowid 1:10",
        "filter add dev DEV parent 1:1 protocol ip prio 1 u32 match ip dport 23 0xffff flowid 1:20",
        "filter add dev DEV parent 1: protocol ip prio 5 u32 match ip dst 192.0.2.1/32 action mirred egress mirror dev PEER",
        "filter add dev DEV parent 1: protocol all prio 9 bpf bytecode '1,6 0 0 0' flowid 1:30",
        // A second element in the same bpf filter: the list must keep its order.
        "filter add dev DEV parent 1: protocol all prio 9 handle 7 bpf bytecode '1,6 0 0 5' flowid 1:20",
    ];
    let cmds: Vec<String> = cmds
        .iter()
        .map(|c| c.replace("DEV", dev).replace("PEER", peer))
        .collect();
    tc_batch(&cmds);
}

#[test]
fn htb_tree_with_leaves_and_filters_comes_back() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    build_htb_tree("va", "vb");
    let filters = run("tc filter show dev va");
    assert!(
        filters.contains("flowid 1:10") && filters.contains("bpf"),
        "{filters}"
    );
    let snap = round_trip("va", install_htb);
    assert_eq!(
        snap.describe(),
        "root htb 1: with 5 classes, 3 child qdiscs, 7 filters"
    );
    assert_eq!(snap.u32_roots.len(), 4);
}

#[test]
fn many_classes_and_leaves_are_listed_in_the_recorded_order() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    let mut cmds = vec!["qdisc add dev va root handle 1: htb default 99".to_owned()];
    // Scrambled creation order: the class hash grows twice (4 → 8 → 16
    // buckets) and the listing depends on the order of insertion.
    for (id, parent) in [
        ("50", "1:"),
        ("3", "1:"),
        ("21", "1:3"),
        ("7", "1:"),
        ("99", "1:"),
        ("12", "1:"),
        ("40", "1:"),
        ("33", "1:3"),
        ("5", "1:"),
        ("8", "1:"),
        ("61", "1:"),
        ("2", "1:"),
    ] {
        cmds.push(format!(
            "class add dev va parent {parent} classid 1:{id} htb rate 1mbit"
        ));
    }
    // Leaves with explicit and kernel-chosen handles share qdisc hash buckets.
    for leaf in [
        "parent 1:50 handle 50: pfifo",
        "parent 1:7 pfifo",
        "parent 1:99 handle 9: bfifo limit 9000",
        "parent 1:12 pfifo limit 12",
        "parent 1:40 handle 400: pfifo limit 5",
        "parent 1:5 pfifo",
        "parent 1:61 handle 61: pfifo",
        "parent 1:21 handle 21: tbf rate 1mbit burst 5k latency 5ms",
        "parent 21:1 pfifo limit 3",
    ] {
        cmds.push(format!("qdisc add dev va {leaf}"));
    }
    tc_batch(&cmds);
    round_trip("va", install_htb);
}

#[test]
fn u32_hash_tables_and_links_come_back() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    tc_batch(&[
        "qdisc add dev va root handle 1: htb default 10",
        "class add dev va parent 1: classid 1:10 htb rate 10mbit",
        "class add dev va parent 1: classid 1:20 htb rate 10mbit",
        // The first u32 filter of the qdisc: root table 800:, plus table 2:.
        "filter add dev va parent 1: prio 3 handle 2: protocol ip u32 divisor 256",
        "filter add dev va parent 1: prio 3 protocol ip u32 ht 2:7: match ip dst 10.0.0.7 flowid 1:20",
        "filter add dev va parent 1: prio 3 protocol ip u32 ht 800:: match ip protocol 6 0xff link 2: hashkey mask 0x000000ff at 16",
        "filter add dev va parent 1: prio 4 protocol ip u32 match u8 0x05 0x0f at 0 flowid 1:10",
    ]);
    round_trip("va", install_htb);
}

#[test]
fn filter_chains_and_empty_chains_come_back() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    tc_batch(&[
        "qdisc add dev va root handle 1: htb default 10",
        "class add dev va parent 1: classid 1:10 htb rate 10mbit",
        "filter add dev va parent 1: chain 0 prio 1 protocol ip u32 match ip dport 80 0xffff flowid 1:10",
        // Same priority in another chain: the u32 tables share one namespace.
        "filter add dev va parent 1: chain 3 prio 1 protocol ip u32 match ip dport 443 0xffff flowid 1:10",
        "chain add dev va parent 1: chain 7",
        "chain add dev va parent 1:10 chain 2",
    ]);
    let chains = run("tc chain show dev va parent 1:");
    assert!(
        chains.contains("chain 7") && chains.contains("chain 3"),
        "{chains}"
    );
    let snap = round_trip("va", install_htb);
    let recorded: Vec<u32> = snap.chains.iter().map(|c| c.chain()).collect();
    assert_eq!(
        recorded,
        vec![0, 3, 7, 2],
        "chains in creation order, per parent"
    );
}

#[test]
fn tbf_root_with_parameters_comes_back() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    sh(
        "tc qdisc add dev va root handle 7: tbf rate 10mbit burst 20kb limit 30000 peakrate 12mbit minburst 1600",
    );
    let snap = round_trip("va", |index| {
        tc::install_root(index, 1, "pfifo", None).expect("install pfifo root");
    });
    assert_eq!(snap.describe(), "root tbf 7: with 1 class");
}

#[test]
fn size_table_without_data_comes_back() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    // Overhead only (linklayer ethernet, no mpu): iproute2 sends no table.
    sh("tc qdisc add dev va root handle 1: stab overhead 24 htb default 1");
    let view = run("tc -d qdisc show dev va");
    assert!(view.contains("overhead 24"), "{view}");
    round_trip("va", install_htb);
}

#[test]
fn clsact_and_its_filters_are_never_touched() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    sh("tc qdisc add dev va clsact");
    sh("tc filter add dev va egress prio 1 bpf bytecode '1,6 0 0 0'");
    sh(
        "tc filter add dev va ingress prio 2 protocol ip u32 match ip dport 53 0xffff action mirred egress mirror dev vb",
    );
    build_htb_tree("va", "vb");
    let hooks = || {
        run(
            "tc -d qdisc show dev va | grep clsact; tc -d filter show dev va egress; tc -d filter show dev va ingress",
        )
    };
    let clsact = hooks();
    assert!(
        clsact.contains("bpf") && clsact.contains("mirred"),
        "{clsact}"
    );
    let snap = round_trip("va", |index| {
        install_htb(index);
        assert_eq!(hooks(), clsact, "install touched clsact");
    });
    assert!(
        snap.qdiscs
            .iter()
            .all(|q| q.parent != TC_H_INGRESS && q.kind() != "clsact")
    );
    assert!(
        snap.filters.iter().all(|f| f.parent >> 16 != 0xffff),
        "clsact filters in the snapshot"
    );
    assert_eq!(hooks(), clsact);
    // clsact alone beside a default root.
    sh("tc qdisc del dev va root");
    round_trip("va", install_htb);
    assert_eq!(hooks(), clsact);
}

#[test]
fn snapshot_refuses_a_size_table_with_data() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    sh("tc qdisc add dev va root handle 1: stab linklayer atm overhead 10 htb default 1");
    expect_refusal("va", "size table (stab) has");
}

#[test]
fn snapshot_refuses_a_rate_estimator() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    sh("tc qdisc add dev va root handle 1: estimator 1s 8s htb default 1");
    expect_refusal("va", "rate estimator");
}

#[test]
fn snapshot_refuses_u32_numbering_it_cannot_reproduce() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    sh("tc qdisc add dev va root handle 1: htb default 1");
    for prio in 1..=3 {
        sh(&format!(
            "tc filter add dev va parent 1: protocol ip prio {prio} u32 match ip dport {prio} 0xffff flowid 1:1"
        ));
    }
    sh("tc filter del dev va parent 1: protocol ip prio 2 u32");
    expect_refusal("va", "800:, 802:");
}

#[test]
fn snapshot_refuses_the_shaper_root_itself() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    install_htb(ifindex("va"));
    match tc::snapshot(ifindex("va")) {
        Err(e @ TcError::ShaperRootPresent { .. }) => {
            assert!(e.to_string().contains("5348:"), "{e}")
        }
        other => panic!("expected ShaperRootPresent, got {other:?}"),
    }
}

#[test]
fn a_refused_request_carries_the_kernel_message() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    build_htb_tree("va", "vb");
    let before = tc_view("va");
    let snap = tc::snapshot(ifindex("va")).expect("snapshot");
    let mut broken = snap.clone();
    for a in broken.qdiscs[0]
        .attrs
        .iter_mut()
        .filter(|a| a.number() == TCA_KIND)
    {
        *a = Attr::string(TCA_KIND, "nosuchqdisc");
    }
    let e = tc::restore(&broken).expect_err("restoring an unknown kind must fail");
    assert_eq!(e.errno(), Some(libc::ENOENT), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("root qdisc nosuchqdisc 1:") && text.contains("va (ifindex"),
        "{text}"
    );
    assert!(
        text.contains("kernel: Specified qdisc kind is unknown"),
        "{text}"
    );
    // The real snapshot still repairs the interface.
    tc::restore(&snap).expect("restore");
    assert_same_view(&before, &tc_view("va"), "after repairing a failed restore");
}

#[test]
fn install_fq_root_matches_what_the_kernel_has() {
    if !require(NEEDS) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    let index = ifindex("va");
    let before = tc_view("va");
    let snap = tc::snapshot(index).expect("snapshot");
    let params = tc::FqParams {
        horizon_us: Some(2_000_000),
        horizon_drop: Some(false),
        ..Default::default()
    };
    match (
        kernel_config("CONFIG_NET_SCH_FQ").is_some(),
        tc::install_fq_root(index, 1, &params),
    ) {
        (true, Ok(())) => {
            let view = run("tc -d qdisc show dev va");
            assert!(
                view.contains("qdisc fq 5348: root") && view.contains("horizon 2s"),
                "{view}"
            );
        }
        (false, Err(e)) => {
            assert!(
                e.to_string()
                    .contains("kernel: Specified qdisc kind is unknown"),
                "{e}"
            );
        }
        (has_fq, other) => panic!("CONFIG_NET_SCH_FQ set: {has_fq}, install gave {other:?}"),
    }
    tc::restore(&snap).expect("restore");
    assert_same_view(&before, &tc_view("va"), "after fq install and restore");
}

#[test]
fn probes_answer_from_the_kernel_config_and_leave_no_trace() {
    if !require(NEEDS) {
        return;
    }
    let traces = || {
        run(
            "readlink /proc/$PPID/task/*/ns/net | sort | uniq -c; ip netns list; lsns -t net -n -o NS,TYPE | sort; tc qdisc show dev lo",
        )
    };
    let threads = || {
        std::fs::read_dir("/proc/self/task")
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let (before, threads_before) = (traces(), threads());
    let has = |opt: &str| kernel_config(opt).is_some();
    assert!(tc::probe_qdisc_kind("htb").expect("probe htb"));
    assert!(tc::probe_qdisc_kind("tbf").expect("probe tbf"));
    assert_eq!(
        tc::probe_qdisc_kind("fq").expect("probe fq"),
        has("CONFIG_NET_SCH_FQ")
    );
    assert_eq!(
        tc::probe_qdisc_kind("fq_codel").expect("probe fq_codel"),
        has("CONFIG_NET_SCH_FQ_CODEL")
    );
    assert!(!tc::probe_qdisc_kind("nosuchqdisc").expect("probe nosuchqdisc"));
    assert_eq!(
        tc::probe_clsact().expect("probe clsact"),
        has("CONFIG_NET_SCH_INGRESS")
    );
    assert_eq!(
        tc::probe_mirred().expect("probe matchall + mirred"),
        has("CONFIG_NET_SCH_INGRESS")
            && has("CONFIG_NET_CLS_MATCHALL")
            && has("CONFIG_NET_ACT_MIRRED")
    );
    assert_eq!(threads(), threads_before, "a probe thread is still running");
    assert_same_view(&before, &traces(), "after the probes");
}

/// codel keeps its times in units of 1.024 µs and dumps them rounded down:
/// replayed as dumped, an fq_codel leaf lost one unit per restore. Ten
/// runs' worth of snapshot, install and restore must leave its target,
/// interval and ce_threshold exactly as they were.
#[test]
fn fq_codel_times_stay_exact_over_repeated_restores() {
    if !require(NEEDS) || !require(&[shaper_tests::skip::Need::Sch("fq_codel")]) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    sh("tc qdisc add dev va root handle 1: htb default 10 && \
        tc class add dev va parent 1: classid 1:10 htb rate 10mbit && \
        tc qdisc add dev va parent 1:10 handle 10: fq_codel target 5ms interval 100ms \
        ce_threshold 2500us");
    restore_ten_times("va", codel_times);
}

/// A pie leaf and an fq_pie leaf whose targets (1003 us, 2003 us) are no
/// whole number of the kernel's 64 ns ticks per microsecond keep the target
/// `tc` shows over ten restores (each replay of the dumped value, unrepaired,
/// lost a microsecond).
#[test]
fn pie_targets_stay_exact_over_repeated_restores() {
    use shaper_tests::skip::Need;
    if !require(NEEDS) || !require(&[Need::Sch("pie"), Need::Sch("fq_pie")]) {
        return;
    }
    let _ns = setup();
    veth_pair("va", "vb");
    tc_batch(&[
        "qdisc add dev va root handle 1: htb default 30",
        "class add dev va parent 1: classid 1:30 htb rate 30mbit",
        "class add dev va parent 1: classid 1:40 htb rate 20mbit",
        "qdisc add dev va parent 1:30 handle 30: pie target 1003us",
        "qdisc add dev va parent 1:40 handle 40: fq_pie target 2003us",
    ]);
    restore_ten_times("va", pie_targets);
}

/// Snapshots `dev`, installs the shaper's root and restores, ten times;
/// after each round `read(dev)` is what it was first, and the whole view
/// is the same at the end.
fn restore_ten_times<T: PartialEq + std::fmt::Debug>(dev: &str, read: impl Fn(&str) -> T) {
    let index = ifindex(dev);
    let first = read(dev);
    let view = tc_view(dev);
    for round in 1..=10 {
        let snap = tc::snapshot(index).expect("snapshot");
        install_htb(index);
        tc::restore(&snap).expect("restore");
        assert_eq!(read(dev), first, "after restore {round}");
    }
    assert_same_view(&view, &tc_view(dev), "after ten restores");
}

/// The pie and fq_pie leaves' targets in microseconds, as `tc -j` reports
/// the kernel's dump.
fn pie_targets(dev: &str) -> (u64, u64) {
    let json = run(&format!("tc -j qdisc show dev {dev}"));
    let list: serde_json::Value = serde_json::from_str(&json).expect("tc -j output");
    let target = |kind: &str| {
        list.as_array()
            .and_then(|l| l.iter().find(|q| q["kind"] == kind))
            .and_then(|q| q["options"]["target"].as_u64())
            .unwrap_or_else(|| panic!("no {kind} target in {json}"))
    };
    (target("pie"), target("fq_pie"))
}

/// The fq_codel leaf's (target, interval, ce_threshold) in microseconds, as
/// `tc -j` reports the kernel's dump.
fn codel_times(dev: &str) -> (u64, u64, u64) {
    let json = run(&format!("tc -j qdisc show dev {dev}"));
    let list: serde_json::Value = serde_json::from_str(&json).expect("tc -j output");
    let q = list
        .as_array()
        .and_then(|l| l.iter().find(|q| q["kind"] == "fq_codel"))
        .unwrap_or_else(|| panic!("no fq_codel in {json}"));
    let field = |name: &str| {
        q["options"][name]
            .as_u64()
            .unwrap_or_else(|| panic!("no {name} in {q}"))
    };
    (field("target"), field("interval"), field("ce_threshold"))
}
