//! Bad input to `shaper run` on a veth in a fresh namespace: each case must
//! exit 2 with a message that names the problem and the fix, and leave the
//! interface exactly as it was (same tc state, no state record).
//!
//! Runs on any kernel; the sch_fq case runs `shaper run` only where the
//! kernel lacks sch_fq (this machine's), since elsewhere that is not bad
//! input, and there checks only the message.

use std::process::Output;

use shaper_tests::{
    shaper_proc,
    skip::{Need, require},
    topo::{Pair, kernel_has_fq, text},
};

/// `shaper run ARGS` must refuse: see [`shaper_proc::expect_usage_error`].
fn expect_usage_error(pair: &Pair, args: &[&str], needles: &[&str]) -> Output {
    let run: Vec<&str> = std::iter::once("run").chain(args.iter().copied()).collect();
    shaper_proc::expect_usage_error(pair, &run, needles)
}

#[test]
fn unknown_interface_exits_2() {
    if !require(&[Need::Root]) {
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
    if !require(&[Need::Root]) {
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
    if !require(&[Need::Root]) {
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
fn bad_tin_options_exit_2() {
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("tins", 1);
    let run = ["--iface", "left0", "--rate", "20mbit"];
    let with = |extra: &[&'static str]| [&run[..], extra].concat();
    expect_usage_error(&pair, &with(&["--diffserv", "diffserv5"]), &["diffserv4"]);
    expect_usage_error(
        &pair,
        &with(&["--diffserv", "diffserv4", "--pacer", "aggregate"]),
        &["--diffserv", "fair pacer only"],
    );
}

#[test]
fn bad_isolation_options_exit_2() {
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("isol", 1);
    let run = ["--iface", "left0", "--rate", "20mbit"];
    let with = |extra: &[&'static str]| [&run[..], extra].concat();
    expect_usage_error(&pair, &with(&["--isolate", "triple"]), &["triple-isolate"]);
    expect_usage_error(
        &pair,
        &with(&["--isolate", "dual-srchost", "--pacer", "aggregate"]),
        &["--isolate", "fair pacer only"],
    );
    // --nat: without the LAN side, without host isolation, with the WAN
    // or a missing interface for the LAN, or a LAN named twice.
    let nat =
        |extra: &[&'static str]| with(&[&["--isolate", "dual-srchost", "--nat"], extra].concat());
    expect_usage_error(&pair, &nat(&[]), &["--nat", "--lan IF"]);
    expect_usage_error(
        &pair,
        &with(&["--nat", "--lan", "lo"]),
        &["--nat", "--isolate"],
    );
    expect_usage_error(&pair, &with(&["--lan", "lo"]), &["--nat"]);
    expect_usage_error(
        &pair,
        &nat(&["--lan", "left0"]),
        &["--lan left0", "--iface"],
    );
    expect_usage_error(&pair, &nat(&["--lan", "lan9"]), &["lan9"]);
    expect_usage_error(
        &pair,
        &nat(&["--lan", "lo", "--lan", "lo"]),
        &["--lan lo", "twice"],
    );
    // The download's own mode needs a download.
    expect_usage_error(
        &pair,
        &with(&["--ingress-isolate", "dual-dsthost"]),
        &["--ingress-rate"],
    );
}

#[test]
fn a_bench_option_out_of_range_exits_2() {
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("bench", 1);
    for (args, want) in [
        (&["bench", "--rounds", "0"][..], "must be positive"),
        (
            &["bench", "--vm-part", "--duration", "0s"],
            "a measured time of a second or more",
        ),
    ] {
        shaper_proc::expect_usage_error(&pair, args, &[want]);
    }
}

/// What the bench's lab part must say on a kernel without netem.
const NO_NETEM_NEEDLES: &[&str] = &["no 'netem' qdisc", "lab part", "cargo xtask bench"];

/// The lab's namespaces (the bench's lab part makes them under this prefix).
fn lab_namespaces() -> usize {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("shl-"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn the_bench_lab_part_without_netem_exits_2_before_any_namespace() {
    if !require(&[Need::Root]) {
        return;
    }
    if shaper::tc::probe_qdisc_kind("netem").unwrap_or(true) {
        let msg = shaper::bench::host::BenchError::MissingQdisc { kind: "netem" }.to_string();
        for n in NO_NETEM_NEEDLES {
            assert!(msg.contains(n), "message lacks {n:?}: {msg}");
        }
        eprintln!("(this kernel has netem: checked the refusal's message only)");
        return;
    }
    let before = lab_namespaces();
    let out = std::process::Command::new(shaper_tests::topo::shaper_bin())
        .args(["bench", "--vm-part", "--duration", "1s"])
        .output()
        .expect("spawn shaper");
    let msg = text(&out);
    assert_eq!(out.status.code(), Some(2), "{msg}");
    for n in NO_NETEM_NEEDLES {
        assert!(msg.contains(n), "message lacks {n:?}: {msg}");
    }
    assert_eq!(
        lab_namespaces(),
        before,
        "a refused bench created namespaces"
    );
}

#[test]
fn no_privileges_exits_2() {
    if !require(&[Need::Root, Need::Tool("setpriv", "--version")]) {
        return;
    }
    let pair = Pair::new("priv", 1);
    let before = pair.left.tc_state("left0");
    let out = pair
        .left
        .unprivileged_shaper()
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

/// What the refusal without sch_fq must say.
const NO_FQ_NEEDLES: &[&str] = &[
    "no sch_fq",
    "CONFIG_NET_SCH_FQ",
    "kmod-sched",
    "cargo xtask vm -- target/release/shaper run --iface left0 --rate 20Mbit",
    "Nothing was changed",
];

/// Without sch_fq (this machine's kernel) `shaper run` itself is refused.
/// Where the kernel has it (the VM's) that is not bad input, so only the
/// refusal's message is checked, as the check would build it.
#[test]
fn kernel_without_sch_fq_exits_2_and_names_the_module() {
    if !require(&[Need::Root]) {
        return;
    }
    if kernel_has_fq() {
        let rate = shaper::rate::Rate::from_bits_per_s(20_000_000).expect("a rate");
        let msg = shaper::checks::CheckError::NoSchFq {
            release: "x".into(),
            iface: "left0".into(),
            rate: rate.to_string(),
        }
        .to_string();
        for n in NO_FQ_NEEDLES {
            assert!(msg.contains(n), "message lacks {n:?}: {msg}");
        }
        eprintln!("(this kernel has sch_fq: checked the refusal's message only)");
    } else {
        let pair = Pair::new("nofq", 1);
        expect_usage_error(
            &pair,
            &["--iface", "left0", "--rate", "20mbit"],
            NO_FQ_NEEDLES,
        );
    }
}

#[test]
fn status_of_a_missing_interface_exits_2_and_names_it() {
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("stn", 1);
    for json in [false, true] {
        let mut cmd = pair.left.shaper();
        cmd.args(["status", "--iface", "nosuch0"]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("spawn shaper");
        let msg = text(&out);
        assert_eq!(out.status.code(), Some(2), "json {json}: {msg}");
        assert!(
            msg.contains("no interface named 'nosuch0'"),
            "json {json}: {msg}"
        );
    }
    // An interface that exists but is not shaped is not an error.
    let out = pair
        .left
        .shaper()
        .args(["status", "--iface", "left0"])
        .output()
        .expect("spawn shaper");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("left0: not shaped by shaper"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_metrics_address_in_use_exits_2_before_the_tracer_attaches() {
    if !require(&[Need::Root, Need::Bpf]) {
        return;
    }
    let pair = Pair::new("mtu", 1);
    // Hold a port in the namespace, then ask trace to serve on it.
    let mut holder = pair
        .left
        .command("python3")
        .args([
            "-c",
            "import socket,sys,time\n\
             s=socket.socket(); s.bind(('127.0.0.1',9478)); s.listen()\n\
             print('ready', flush=True); time.sleep(60)",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 holds a port");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("read ready");
    assert_eq!(line.trim(), "ready");
    let out = pair
        .left
        .shaper()
        .args([
            "trace",
            "--iface",
            "left0",
            "--duration",
            "5s",
            "--metrics",
            "127.0.0.1:9478",
        ])
        .output()
        .expect("spawn shaper");
    let _ = holder.kill();
    let _ = holder.wait();
    let msg = text(&out);
    assert_eq!(out.status.code(), Some(2), "{msg}");
    assert!(
        msg.contains("cannot serve metrics on 127.0.0.1:9478") && msg.contains("pick a free port"),
        "{msg}"
    );
    assert!(
        !msg.contains("tracer attached"),
        "the tracer attached first: {msg}"
    );
}

#[test]
fn bad_framing_exits_2_and_names_the_fix() {
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("frame", 1);
    let run = ["--iface", "left0", "--rate", "20mbit"];
    let with = |extra: &[&'static str]| [&run[..], extra].concat();
    expect_usage_error(
        &pair,
        &with(&["--framing", "ethernet,adsl"]),
        &["\"adsl\"", "pppoe-ptm"],
    );
    expect_usage_error(&pair, &with(&["--overhead", "300"]), &["-64 to 256"]);
    expect_usage_error(&pair, &with(&["--mpu", "257"]), &["--mpu 257", "0 to 256"]);
    expect_usage_error(
        &pair,
        &with(&[
            "--framing",
            "pppoe-llcsnap,pppoe-llcsnap,pppoe-llcsnap,pppoe-llcsnap,pppoe-llcsnap,pppoe-llcsnap,pppoe-llcsnap",
        ]),
        &["280 bytes", "--overhead"],
    );
    expect_usage_error(&pair, &with(&["--atm", "--ptm"]), &["--ptm"]);
}
