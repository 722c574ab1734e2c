//! Every program in the embedded object, on the running kernel and
//! architecture: each passes the verifier and the JIT, and attaches where
//! it runs: the classifiers to both TC hooks of a veth in a fresh namespace
//! (through TCX where the kernel has it, a cls_bpf filter on clsact
//! otherwise, as the product attaches), and the tracer's raw tracepoints to
//! their tracepoints. The benchmark's fentry counters are only named here:
//! whether a kernel lets a helper be traced is its own policy (6.18 refuses
//! `bpf_ktime_get_ns` with EPERM), and the benchmark reports a refusal.
//!
//! This is the first check on a new kernel or architecture: the other
//! suites exercise a few programs each, this one all of them, and it fails
//! when the object gains a program the list below does not name (so a new
//! program cannot go untested here).
//!
//! Needs root and a kernel with BPF.

use std::collections::BTreeSet;

use aya::programs::{Program, SchedClassifier, TcAttachType};
use shaper_common::{
    CLOCK_PROGRAM, EGRESS_HOSTS_NAT_PROGRAM, EGRESS_HOSTS_PROGRAM, EGRESS_PROGRAM, NAT_LAN_PROGRAM,
    PASSTHROUGH_PROGRAM, POLICE_HOSTS_NAT_PROGRAM, POLICE_HOSTS_PROGRAM, POLICE_PROGRAM,
    REDIRECT_PROGRAM, TELEMETRY_PROGRAM,
    calls::HELPERS,
    observe::{OBSERVE_EGRESS_PROGRAM, OBSERVE_INGRESS_PROGRAM},
};
use shaper_tests::{
    netns::{NetNsGuard, sh, veth_pair},
    skip::{Need, require},
};

/// The classifiers the product and the observer attach.
const CLASSIFIERS: &[&str] = &[
    EGRESS_PROGRAM,
    EGRESS_HOSTS_PROGRAM,
    EGRESS_HOSTS_NAT_PROGRAM,
    POLICE_PROGRAM,
    POLICE_HOSTS_PROGRAM,
    POLICE_HOSTS_NAT_PROGRAM,
    REDIRECT_PROGRAM,
    NAT_LAN_PROGRAM,
    PASSTHROUGH_PROGRAM,
    CLOCK_PROGRAM,
    TELEMETRY_PROGRAM,
    OBSERVE_EGRESS_PROGRAM,
    OBSERVE_INGRESS_PROGRAM,
];

/// The tracer's programs, by the tracepoint each attaches to.
const RAW_TRACEPOINTS: &[(&str, &str)] = &[
    ("trace_qdisc_enqueue", "qdisc_enqueue"),
    ("trace_net_dev_start_xmit", "net_dev_start_xmit"),
];

/// The verifier's limit on the instructions it walks for one program.
const VERIFIER_LIMIT: u32 = 1_000_000;

/// Loads, attaches and detaches the classifier `name`; a load the
/// verifier refuses comes back as its message, so that every program's
/// figure reaches the log before the test fails.
fn attach_classifier(prog: &mut SchedClassifier, name: &str) -> Result<(), String> {
    if let Err(e) = prog.load() {
        let e = format!("{e:#}");
        // The verifier's summary is its log's last lines.
        let tail: Vec<&str> = e.lines().rev().take(4).collect();
        eprintln!("{name} failed to load: {}", tail.join(" / "));
        return Err(format!("{name} failed to load: {e}"));
    }
    // The headroom each kernel leaves, in the tier's log: the verifier's
    // walk is the limit the packet path's changes run into first.
    match prog.info().map(|i| i.verified_instruction_count()) {
        Ok(Some(n)) => eprintln!(
            "{name}: {n} verified instructions, {:.1}% of the verifier's limit",
            f64::from(n) * 100.0 / f64::from(VERIFIER_LIMIT)
        ),
        Ok(None) => eprintln!("{name}: the kernel does not report verified instructions"),
        Err(e) => eprintln!("{name}: reading its info failed: {e}"),
    }
    for hook in [TcAttachType::Egress, TcAttachType::Ingress] {
        let link = prog
            .attach("pl0", hook)
            .unwrap_or_else(|e| panic!("{name} failed to attach to {hook:?}: {e:#}"));
        prog.detach(link)
            .unwrap_or_else(|e| panic!("{name} failed to detach from {hook:?}: {e:#}"));
    }
    Ok(())
}

#[test]
fn every_program_in_the_object_loads_and_attaches() {
    if !require(&[Need::Root, Need::Bpf]) {
        return;
    }
    let _ns = NetNsGuard::new();
    veth_pair("pl0", "pl1");
    // cls_bpf filters need the clsact qdisc; TCX ignores it.
    sh("tc qdisc add dev pl0 clsact");

    let mut ebpf = shaper::bpf::load::open(64, &[]).expect("open the embedded object");
    let mut seen = BTreeSet::new();
    let mut refused = Vec::new();
    for (name, program) in ebpf.programs_mut() {
        match program {
            Program::SchedClassifier(prog) => {
                assert!(
                    CLASSIFIERS.contains(&name),
                    "the object has the classifier {name}, which this test does not name"
                );
                if let Err(e) = attach_classifier(prog, name) {
                    refused.push(e);
                }
            }
            Program::RawTracePoint(prog) => {
                let (_, tracepoint) = RAW_TRACEPOINTS
                    .iter()
                    .find(|(p, _)| *p == name)
                    .unwrap_or_else(|| panic!("unknown raw tracepoint program {name}"));
                prog.load()
                    .unwrap_or_else(|e| panic!("{name} failed to load: {e:#}"));
                let link = prog
                    .attach(tracepoint)
                    .unwrap_or_else(|e| panic!("{name} failed to attach: {e:#}"));
                prog.detach(link).expect("detach the raw tracepoint");
            }
            Program::FEntry(_) => assert!(
                HELPERS.iter().any(|h| h.program == name),
                "unknown fentry program {name}"
            ),
            other => panic!("the object has {name} of an unexpected type: {other:?}"),
        }
        seen.insert(name.to_owned());
    }

    assert!(refused.is_empty(), "{}", refused.join("\n\n"));
    let expected: BTreeSet<String> = CLASSIFIERS
        .iter()
        .copied()
        .chain(RAW_TRACEPOINTS.iter().map(|(p, _)| *p))
        .chain(HELPERS.iter().map(|h| h.program))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        seen, expected,
        "the object's programs differ from the ones this test names"
    );
    // Detaching left nothing behind: no filter on either clsact hook.
    for hook in ["egress", "ingress"] {
        let left = sh(&format!("tc filter show dev pl0 {hook}"));
        assert!(left.trim().is_empty(), "a {hook} filter was left: {left}");
    }
}
