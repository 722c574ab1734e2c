//! `shaper run --config FILE --section NAME` and `shaper config` with the
//! real binary on a veth between two namespaces.
//!
//! Checks: each bad file (UCI and `[section]` form) exits 2 naming the file,
//! the line and the key, with the interface's tc state unchanged and no
//! state record; a section shapes as the same flags do (`status --json`
//! compared), `config apply-rates` changes the running rate live, and
//! SIGTERM restores the interface. The download case uses the policer,
//! which needs no sch_fq, so it runs on this machine's kernel; the upload
//! case needs sch_fq (the VM).
//!
//! Run: `cargo test -p shaper-tests --test config_file -- --test-threads=1`

use std::{
    path::{Path, PathBuf},
    process::Output,
};

use serde_json::{Value, json};
use shaper_tests::{
    shaper_proc::{ShaperProc, Status, expect_usage_error, status_json},
    skip::{Need, require},
    topo::{NamedNs, Pair, text},
};

/// A config file in a directory of its own, removed on drop.
struct ConfigFile {
    dir: PathBuf,
    path: PathBuf,
}

impl ConfigFile {
    fn new(name: &str, contents: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("shaper-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, contents).expect("write config");
        Self { dir, path }
    }

    fn write(&self, contents: &str) {
        std::fs::write(&self.path, contents).expect("rewrite config");
    }

    fn path(&self) -> &str {
        self.path.to_str().expect("utf-8 temp path")
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `shaper ARGS` in `ns`.
fn shaper(ns: &NamedNs, args: &[&str]) -> Output {
    ns.shaper().args(args).output().expect("spawn shaper")
}

/// A valid section on `left0` (4 lines), which the bad cases extend.
const GOOD: &str = "config interface 'wan'
\toption iface 'left0'
\toption ingress_rate '20mbit'
\toption ingress_mode 'police'
";

/// A second section, `lan`, after GOOD and a blank line (lines 6 to 9).
const LAN: &str = "
config interface 'lan'
\toption iface 'lo'
\toption ingress_rate '1mbit'
\toption ingress_mode police
";

#[test]
fn bad_config_files_exit_2_naming_the_line_and_key() {
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("cfgbad", 1);
    // (file name, contents, needles after the file's path)
    let table: &[(&str, &str, &[&str])] = &[
        (
            "unknown.uci",
            &format!("{GOOD}\toption ratee '1mbit'\n"),
            &[":5: unknown option 'ratee'", "did you mean 'rate'"],
        ),
        (
            "dash.uci",
            &format!("{GOOD}\toption no-ecn 1\n"),
            &[":5: unknown option 'no-ecn'", "write 'no_ecn'"],
        ),
        (
            "bool.uci",
            &format!("{GOOD}\toption no_ecn 'sometimes'\n"),
            &[":5: option 'no_ecn' takes 1 or 0"],
        ),
        (
            "twice.uci",
            &format!("{GOOD}\toption ingress_rate '10mbit'\n"),
            &[":5: option 'ingress_rate' is given twice (first at line 3)"],
        ),
        (
            "noiface.uci",
            "config interface 'wan'\n\toption ingress_rate '20mbit'\n",
            &[
                ":1: section 'wan' lacks option 'iface'",
                "option iface 'IF'",
            ],
        ),
        (
            "rate.uci",
            &format!("{GOOD}\toption rate '85O mbit'\n"),
            &[":5: option 'rate'", "unknown unit"],
        ),
        (
            "type.uci",
            "config queue 'wan'\n\toption iface 'left0'\n",
            &[":1: section type 'queue'"],
        ),
        (
            "second.uci",
            &format!(
                "{GOOD}\nconfig interface 'lan'\n\toption enabled 0\n\toption iface x\n\toption rate fast\n"
            ),
            &[":9: option 'rate': invalid value 'fast'"],
        ),
        (
            "unknown.conf",
            "[wan]\niface = left0\ningress_rate = 20mbit\ningress_mode = police\nhorizon = 20s\n",
            &[":5: option 'horizon'", "10ms to 10s"],
        ),
        (
            "list.conf",
            "[wan]\niface = left0\niface = left1\n",
            &[":3: option 'iface' is given twice"],
        ),
        (
            "syntax.conf",
            "[wan]\niface left0\n",
            &[":2: expected `[NAME]` or `KEY = VALUE`"],
        ),
    ];
    for (name, contents, needles) in table {
        let f = ConfigFile::new(name, contents);
        let with_path: Vec<String> = needles
            .iter()
            .map(|n| format!("{}{n}", if n.starts_with(':') { f.path() } else { "" }))
            .collect();
        let needles: Vec<&str> = with_path.iter().map(String::as_str).collect();
        expect_usage_error(
            &pair,
            &["run", "--config", f.path(), "--section", "wan"],
            &needles,
        );
        expect_usage_error(&pair, &["config", "check", f.path()], &needles);
    }
    // The file is fine; the choice of section is not.
    let two = ConfigFile::new("two.uci", &format!("{GOOD}{LAN}\toption enabled 0\n"));
    expect_usage_error(
        &pair,
        &["run", "--config", two.path(), "--section", "nosuch"],
        &["no section 'nosuch'", "wan, lan"],
    );
    expect_usage_error(
        &pair,
        &["run", "--config", two.path(), "--section", "lan"],
        &[":10: section 'lan' is disabled"],
    );
    two.write(&format!("{GOOD}{LAN}"));
    expect_usage_error(
        &pair,
        &["run", "--config", two.path()],
        &["choose one with --section (wan, lan)"],
    );
    // --config takes no other run flag; a missing file is a usage error.
    expect_usage_error(
        &pair,
        &["run", "--config", two.path(), "--ingress-rate", "1mbit"],
        &["--config <FILE>", "cannot be used with"],
    );
    expect_usage_error(
        &pair,
        &["run", "--config", "/nonexistent/shaper"],
        &["cannot read config file /nonexistent/shaper"],
    );
    // A valid file whose interface does not exist: run's own check.
    let gone = ConfigFile::new(
        "gone.conf",
        "[wan]\niface = nosuch0\ningress_rate = 20mbit\ningress_mode = police\n",
    );
    expect_usage_error(
        &pair,
        &["run", "--config", gone.path()],
        &["no interface named 'nosuch0'"],
    );
    // apply-rates needs a running shaper on the interface.
    let good = ConfigFile::new("good.uci", GOOD);
    expect_usage_error(
        &pair,
        &["config", "apply-rates", good.path(), "--section", "wan"],
        &["'left0' is not shaped"],
    );
}

/// What a status says about how the interface is shaped, without what
/// differs between two runs of the same settings (pid, counters, programs,
/// the generation of the configuration).
fn shape(st: &Status) -> Value {
    let mut pacer = st.pacer.clone().unwrap_or(Value::Null);
    if let Some(p) = pacer.as_object_mut() {
        p.remove("generation");
    }
    json!({
        "rate_bits_per_s": st.rate_bits_per_s,
        "root_qdisc": st.root_qdisc,
        "classifier": st.classifier,
        "ingress": st.ingress.as_ref().map(|i| json!({
            "mode": i.mode,
            "ifb": i.ifb,
            "rate_bits_per_s": i.rate_bits_per_s,
            "classifier": i.classifier,
        })),
        "pacer": pacer,
    })
}

/// Runs `flags` with ShaperProc, then `file`'s section `wan` with
/// `run --config`, on `iface` in `ns`; asserts both shape it alike and
/// that the config run's SIGTERM restores it. Returns the config run,
/// still running, for more checks.
fn same_as_flags<'a>(
    ns: &'a NamedNs,
    iface: &str,
    file: &ConfigFile,
    flags: &[&str],
) -> ShaperProc<'a> {
    let before = ns.tc_state(iface);
    let egress = flags.contains(&"--rate");
    let ingress = flags.contains(&"--ingress-rate");
    let mut by_flags = ShaperProc::start(Some(ns), iface, flags);
    let expected = shape(&by_flags.status());
    let exit = by_flags.sigterm();
    assert_eq!(exit.code(), Some(0), "{}", exit.text());
    assert_eq!(ns.tc_state(iface), before, "the flags' run restored");
    // What the service compares across reloads: the flags in the file's
    // order, one per line.
    let out = shaper(ns, &["config", "args", file.path(), "--section", "wan"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        printed.lines().any(|l| l == format!("--iface={iface}")),
        "{printed}"
    );
    let run = ShaperProc::start_config(Some(ns), iface, file.path(), "wan", (egress, ingress));
    let st = status_json(Some(ns), iface).expect("shaped");
    assert_eq!(shape(&st), expected, "config file vs flags:\n{st}");
    run
}

#[test]
fn config_section_shapes_the_download_as_its_flags_do() {
    if !require(&[Need::Root]) {
        return;
    }
    let pair = Pair::new("cfgin", 1);
    let ns = &pair.right;
    let before = ns.tc_state("right0");
    let file = ConfigFile::new(
        "download.uci",
        "# the download of right0, policed\n\
         config interface 'wan'\n\
         \toption iface 'right0'\n\
         \toption ingress_rate '20mbit'\n\
         \toption ingress_mode 'police'\n\
         \toption no_ecn '1'\n\
         \toption horizon '200ms'\n\
         \toption framing 'ethernet'\n\
         \n\
         config interface 'spare'\n\
         \toption enabled '0'\n\
         \toption iface 'lo'\n\
         \toption rate '1mbit'\n",
    );
    let check = shaper(ns, &["config", "check", file.path()]);
    assert_eq!(check.status.code(), Some(0), "{}", text(&check));
    assert_eq!(String::from_utf8_lossy(&check.stdout), "wan right0\n");
    let mut run = same_as_flags(
        ns,
        "right0",
        &file,
        &[
            "--ingress-rate",
            "20mbit",
            "--ingress-mode",
            "police",
            "--no-ecn",
            "--horizon",
            "200ms",
            "--framing",
            "ethernet",
        ],
    );
    // A rate-only change applies live, and leaves the other settings'
    // lines as they were.
    let settings = |f: &ConfigFile| {
        text(&shaper(
            ns,
            &["config", "args", f.path(), "--section", "wan", "--no-rates"],
        ))
    };
    let old = settings(&file);
    file.write(
        &std::fs::read_to_string(&file.path)
            .expect("read")
            .replace("'20mbit'", "'10mbit'"),
    );
    assert_eq!(settings(&file), old);
    assert!(!old.contains("rate="), "{old}");
    let out = shaper(
        ns,
        &["config", "apply-rates", file.path(), "--section", "wan"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("ingress rate 20Mbit -> 10Mbit"),
        "{}",
        text(&out)
    );
    let st = status_json(Some(ns), "right0").expect("still shaped");
    assert_eq!(st.ingress().rate_bits_per_s, 10_000_000, "{st}");
    assert!(st.running, "{st}");
    // A rate the download is not shaped in is refused before anything
    // changes.
    file.write(
        "config interface 'wan'\n\toption iface 'right0'\n\toption rate '5mbit'\n\
         \toption ingress_rate '5mbit'\n\toption ingress_mode 'police'\n",
    );
    let out = shaper(
        ns,
        &["config", "apply-rates", file.path(), "--section", "wan"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(
        status_json(Some(ns), "right0")
            .expect("shaped")
            .ingress()
            .rate_bits_per_s,
        10_000_000
    );
    assert_eq!(run.sigterm().code(), Some(0));
    assert_eq!(ns.tc_state("right0"), before, "SIGTERM restored right0");
    assert!(status_json(Some(ns), "right0").is_none(), "no record left");
}

#[test]
fn config_section_shapes_the_upload_as_its_flags_do() {
    if !require(&[Need::Root, Need::Sch("fq")]) {
        return;
    }
    let pair = Pair::new("cfgout", 1);
    let ns = &pair.left;
    let before = ns.tc_state("left0");
    let file = ConfigFile::new(
        "upload.conf",
        "# the upload of left0\n\
         [wan]\n\
         iface = left0\n\
         rate = 20mbit\n\
         pacer = fair\n\
         isolate = dual-srchost\n\
         rtt = regional\n\
         diffserv = diffserv4\n\
         framing = pppoe-ptm\n\
         framing = ether-vlan\n\
         mpu = 72\n\
         no_telemetry = yes\n",
    );
    let mut run = same_as_flags(
        ns,
        "left0",
        &file,
        &[
            "--rate",
            "20mbit",
            "--pacer",
            "fair",
            "--isolate",
            "dual-srchost",
            "--rtt",
            "regional",
            "--diffserv",
            "diffserv4",
            "--framing",
            "pppoe-ptm,ether-vlan",
            "--mpu",
            "72",
            "--no-telemetry",
        ],
    );
    file.write(
        &std::fs::read_to_string(Path::new(file.path()))
            .expect("read")
            .replace("20mbit", "30mbit"),
    );
    let out = shaper(ns, &["config", "apply-rates", file.path()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let st = status_json(Some(ns), "left0").expect("still shaped");
    assert_eq!(st.rate_bits_per_s, 30_000_000, "{st}");
    assert_eq!(run.sigterm().code(), Some(0));
    assert_eq!(ns.tc_state("left0"), before, "SIGTERM restored left0");
    assert!(status_json(Some(ns), "left0").is_none(), "no record left");
}
