//! The OpenWrt init script (`shaper/dist/openwrt/shaper.init`) and the
//! shipped example configs against the real binary. The script runs with
//! procd's shell functions replaced by ones that record each call: which
//! sections become instances, the command each instance runs, and the
//! settings procd compares on a reload (a change of rate alone must leave
//! them equal, so the instance keeps running and takes the rate live; any
//! other change must alter them, so procd restarts it).
//!
//! Needs no privileges and no interface: `shaper config` only reads the
//! file. Runs on the host only; the kernel plays no part.

use std::path::{Path, PathBuf};
use std::process::Command;

use shaper_tests::topo::{shaper_bin, text};

/// Stubs for procd's functions, then the init script sourced (its first
/// line is a comment to sh) with the binary and config swapped in, then one
/// of its functions. Each stub appends a line to `$1`.
const HARNESS: &str = r#"
log=$1 script=$2 prog=$3 config=$4 action=$5
procd_open_instance() { echo "open $1" >>"$log"; }
procd_set_param() { echo "param $*" >>"$log"; }
procd_close_instance() { echo "close" >>"$log"; }
procd_add_reload_trigger() { echo "trigger $*" >>"$log"; }
logger() { echo "logger $*" >>"$log"; }
. "$script"
PROG=$prog
CONFIG=$config
"$action"
"#;

struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    /// A directory of the test's own: libtest may run them in parallel.
    fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("shaper-service-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Self { dir }
    }

    /// Runs the init script's `action` on `config`; its exit code and the
    /// recorded calls.
    fn run(&self, action: &str, config: &str) -> (Option<i32>, String) {
        let config_path = self.dir.join("shaper");
        std::fs::write(&config_path, config).expect("write config");
        let log = self.dir.join("calls");
        let _ = std::fs::remove_file(&log);
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaper/dist/openwrt/shaper.init");
        let out = Command::new("sh")
            .arg("-c")
            .arg(HARNESS)
            .arg("harness")
            .arg(&log)
            .arg(&script)
            .arg(shaper_bin())
            .arg(&config_path)
            .arg(action)
            .output()
            .expect("run sh");
        let calls = std::fs::read_to_string(&log).unwrap_or_default();
        (out.status.code(), format!("{calls}{}", text(&out)))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const TWO_SECTIONS: &str = "\
config interface 'wan'
\toption iface 'nosuch0'
\toption rate '20mbit'
\toption isolate 'dual-srchost'

config interface 'lte'
\toption enabled '0'
\toption iface 'nosuch1'
\toption rate '5mbit'
";

/// The `param data ...` line of the instance.
fn data_line(calls: &str) -> String {
    calls
        .lines()
        .find(|l| l.starts_with("param data "))
        .unwrap_or_else(|| panic!("no data parameter: {calls}"))
        .to_owned()
}

#[test]
fn each_enabled_section_is_an_instance_that_restores_before_it_runs() {
    let s = Scratch::new("instances");
    let (code, calls) = s.run("start_service", TWO_SECTIONS);
    assert_eq!(code, Some(0), "{calls}");
    assert!(calls.contains("open wan\n"), "{calls}");
    assert!(
        !calls.contains("open lte"),
        "a disabled section ran: {calls}"
    );
    let command = calls
        .lines()
        .find(|l| l.starts_with("param command "))
        .unwrap_or_else(|| panic!("no command: {calls}"));
    // The instance's command: cleanup of its interface, then the run of
    // its section, in one shell (procd has no pre-start hook).
    assert!(
        command.contains("cleanup --iface \"$1\"")
            && command.contains("exec \"$0\" run --config \"$2\" --section \"$3\"")
            && command.contains(" nosuch0 ")
            && command.trim_end().ends_with(" wan"),
        "{command}"
    );
    let data = data_line(&calls);
    assert!(
        data.contains("settings=--iface=nosuch0 --isolate=dual-srchost"),
        "{data}"
    );
    assert!(
        !data.contains("20mbit"),
        "the rate is in the settings: {data}"
    );
    assert!(calls.contains("param respawn"), "{calls}");
}

#[test]
fn a_rate_change_keeps_the_settings_and_any_other_change_alters_them() {
    let s = Scratch::new("settings");
    let (_, before) = s.run("start_service", TWO_SECTIONS);
    let (_, rate_only) = s.run(
        "start_service",
        &TWO_SECTIONS.replace("'20mbit'", "'30mbit'"),
    );
    assert_eq!(data_line(&before), data_line(&rate_only));
    let (_, isolation) = s.run(
        "start_service",
        &TWO_SECTIONS.replace("'dual-srchost'", "'triple-isolate'"),
    );
    assert_ne!(data_line(&before), data_line(&isolation));
    // Adding a direction restarts too: set-rate cannot add one live.
    let (_, download) = s.run(
        "start_service",
        &TWO_SECTIONS.replace(
            "\toption rate '20mbit'\n",
            "\toption rate '20mbit'\n\toption ingress_rate '80mbit'\n",
        ),
    );
    assert_ne!(data_line(&before), data_line(&download));
}

#[test]
fn a_bad_file_starts_nothing_and_says_why() {
    let s = Scratch::new("bad");
    let (code, calls) = s.run(
        "start_service",
        &TWO_SECTIONS.replace("'20mbit'", "'20mbits'"),
    );
    assert_eq!(code, Some(1), "{calls}");
    assert!(!calls.contains("open "), "an instance started: {calls}");
    assert!(
        calls.contains("logger ") && calls.contains(":3") && calls.contains("rate"),
        "the log does not name the line and key: {calls}"
    );
}

#[test]
fn the_shipped_example_configs_are_valid() {
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaper/dist");
    for example in ["openwrt/shaper.config", "systemd/shaper.conf"] {
        let out = Command::new(shaper_bin())
            .args(["config", "check"])
            .arg(dist.join(example))
            .output()
            .expect("run shaper config check");
        assert_eq!(out.status.code(), Some(0), "{example}: {}", text(&out));
    }
}
