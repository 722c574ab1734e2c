//! Which integration tests run where: the tiers of `cargo xtask test`.
//!
//! - **host**: every binary but none of the VM's comparisons is special
//!   here; tests that need a feature this kernel lacks skip with a reason.
//! - **6.12**, the series OpenWrt 25.12 runs: every test, the comparisons
//!   against CAKE included, but the multi-queue test, which runs once, on
//!   7, where upstream cake_mq stands beside it and the split of one CAKE
//!   per queue as well (the shaper's code and bars are the same on both).
//! - **7** (the newest 7.x Debian has, 7.3 when this was written): what
//!   touches the kernel's interface, which is where a newer kernel breaks a
//!   BPF product: every program loads and attaches through TCX, restore,
//!   the `BPF_PROG_TEST_RUN` suites, the tracer's BTF offsets, observe, the
//!   telemetry ring buffer, a short shaping run, and the multi-queue test
//!   beside upstream cake_mq.
//! - **6.1**, which has no TCX: the compatibility subset: loading and
//!   attaching through clsact, restore (after SIGKILL and cleanup too, at
//!   kill points spread over attach, steady state and restore), both
//!   ingress paths (the policer, and the IFB through matchall + mirred) and
//!   `BPF_PROG_TEST_RUN`. The comparisons against CAKE measure traffic, not
//!   the kernel's interface, and are not repeated there.
//! - **arm64** (Debian's arm64 6.12 under qemu-system-aarch64, with the
//!   static aarch64 builds, the shaper from its package): what an
//!   architecture changes: the controller's netlink code and struct layouts
//!   (restore, status, the bad-input battery), the BPF object under the
//!   arm64 verifier and JIT (the `BPF_PROG_TEST_RUN` suites), a shaped veth
//!   with 4 TCP streams, the ingress policer, and restore after SIGTERM and
//!   after SIGKILL with cleanup. It is the one tier that runs the bad-input
//!   battery in a guest: on x86 it would repeat the host's.
//! - **quick** (`--quick`): the 6.1 subset but the kill sweep, run on 6.12,
//!   for the edit loop.
//!
//! Invariant: a test a tier names must exist; a renamed test fails the run
//! instead of silently leaving the tier.

use anyhow::{Result, bail};

/// Tests of one binary a tier runs.
#[derive(Debug, Clone, Copy)]
pub enum Pick {
    All,
    Only(&'static [&'static str]),
}

/// What a VM stage runs.
#[derive(Debug, Clone, Copy)]
pub struct Tier {
    pub name: &'static str,
    /// `None`: every test but [`SEVEN_ONLY`]'s; else the union of these
    /// lists.
    picks: Option<&'static [&'static [(&'static str, Pick)]]>,
    /// Whether the tier runs [`HOST_ONLY`] tests its picks name.
    host_only_too: bool,
}

/// Tests that run on the host kernel only: what they check does not
/// depend on the kernel (argument, privilege and config-file errors happen
/// before any kernel feature is touched, and the one sch_fq case needs a
/// kernel without it; the metrics endpoint's clients are plain sockets; the
/// service scripts only read a config file), and under emulation they cost
/// minutes. The arm64 tier runs them too ([`Tier::host_only_too`]).
pub const HOST_ONLY: &[(&str, Pick)] = &[
    ("cli_bad_input", Pick::All),
    ("metrics_endpoint", Pick::All),
    ("service_scripts", Pick::All),
    (
        "config_file",
        Pick::Only(&["bad_config_files_exit_2_naming_the_line_and_key"]),
    ),
];

/// Tests that only the kernel-interface tier runs: the multi-queue test
/// needs every anchor it compares against, and only 7.x has cake_mq.
const SEVEN_ONLY: &[(&str, Pick)] = &[("multiqueue_vm", Pick::All)];

/// What every subset runs: every program loading and attaching, the
/// `BPF_PROG_TEST_RUN` suites, the hook's attach and counters, and restore.
const SHARED: &[(&str, Pick)] = &[
    ("programs_load", Pick::All),
    ("prog_test_run", Pick::All),
    ("prog_test_run_fair", Pick::All),
    ("prog_test_run_hosts", Pick::All),
    ("prog_test_run_pacing", Pick::All),
    ("prog_test_run_police", Pick::All),
    ("prog_test_run_tins", Pick::All),
    ("prog_test_run_telemetry", Pick::All),
    ("netns_counters", Pick::All),
    ("tc_restore", Pick::All),
];

const INTERFACE: &[(&str, Pick)] = &[
    ("trace_vm", Pick::All),
    ("observe", Pick::All),
    (
        "ingress_police",
        Pick::Only(&[
            "sigterm_restores_and_status_shows_the_ingress_hook",
            "the_default_ifb_mode_creates_its_ifb_and_removes_it_or_exits_2_without_sch_fq",
        ]),
    ),
    (
        "telemetry_vm",
        Pick::Only(&["json_records_and_metrics_describe_the_flows"]),
    ),
    (
        "shaping",
        Pick::Only(&[
            "goodput_at_20mbit_with_4_streams_and_gso_is_85_to_100_percent",
            "sigterm_restores_the_default_root",
            "the_lan_side_of_nat_attaches_and_comes_off_after_sigterm_and_sigkill",
        ]),
    ),
];

const COMPAT: &[(&str, Pick)] = &[
    ("ingress_police", Pick::All),
    (
        "shaping",
        Pick::Only(&[
            "sigterm_restores_the_default_root",
            "sigkill_then_cleanup_restores",
            "the_lan_side_of_nat_attaches_and_comes_off_after_sigterm_and_sigkill",
        ]),
    ),
];

pub const MAIN: Tier = Tier {
    name: "every test",
    picks: None,
    host_only_too: false,
};
pub const KERNEL_INTERFACE: Tier = Tier {
    name: "kernel interface",
    picks: Some(&[SHARED, INTERFACE, SEVEN_ONLY]),
    host_only_too: false,
};

const ARCHITECTURE: &[(&str, Pick)] = &[
    ("cli_bad_input", Pick::All),
    ("ingress_police", Pick::All),
    (
        "shaping",
        Pick::Only(&[
            "goodput_at_20mbit_with_4_streams_and_gso_is_85_to_100_percent",
            "sigterm_restores_the_default_root",
            "sigkill_then_cleanup_restores",
        ]),
    ),
];

pub const ARM64: Tier = Tier {
    name: "architecture",
    picks: Some(&[SHARED, ARCHITECTURE]),
    host_only_too: true,
};
/// The kill sweep: restore after SIGKILL at many points, minutes under
/// emulation.
const SWEEP: &[(&str, Pick)] = &[("kill_sweep", Pick::All)];

pub const COMPATIBILITY: Tier = Tier {
    name: "compatibility",
    picks: Some(&[SHARED, COMPAT, SWEEP]),
    host_only_too: false,
};
/// The compatibility tier without the kill sweep, for `--quick`.
pub const QUICK: Tier = Tier {
    name: "compatibility, no kill sweep",
    picks: Some(&[SHARED, COMPAT]),
    host_only_too: false,
};

/// True when `list` picks `test` of `binary`.
fn named(list: &[(&str, Pick)], binary: &str, test: &str) -> bool {
    list.iter().any(|(b, pick)| {
        *b == binary
            && match pick {
                Pick::All => true,
                Pick::Only(names) => names.contains(&test),
            }
    })
}

impl Tier {
    /// True when this tier runs `test` of `binary`.
    pub fn selects(&self, binary: &str, test: &str) -> bool {
        if named(HOST_ONLY, binary, test) && !self.host_only_too {
            return false;
        }
        match self.picks {
            None => !named(SEVEN_ONLY, binary, test),
            Some(picks) => picks.iter().any(|list| named(list, binary, test)),
        }
    }

    /// Fails when the tier, or the lists every tier reads, name a binary
    /// or test that `available` (binary, its tests) lacks.
    pub fn check(&self, available: &[(String, Vec<String>)]) -> Result<()> {
        let picks = self.picks.unwrap_or(&[]);
        let lists = picks.iter().copied().chain([HOST_ONLY, SEVEN_ONLY]);
        for (binary, pick) in lists.flatten() {
            let Some((_, tests)) = available.iter().find(|(b, _)| b == binary) else {
                bail!(
                    "the {} tier names the test binary {binary}, which the build has not: \
                     update xtask/src/test/tiers.rs",
                    self.name
                );
            };
            if let Pick::Only(names) = pick {
                for name in *names {
                    if !tests.iter().any(|t| t == name) {
                        bail!(
                            "the {} tier names {binary}::{name}, which does not exist: \
                             update xtask/src/test/tiers.rs",
                            self.name
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_tier_runs_everything_but_host_only_and_seven_only_tests() {
        assert!(MAIN.selects("fair_vm", "anything"));
        assert!(!MAIN.selects("cli_bad_input", "bad_rates_exit_2"));
        assert!(!MAIN.selects(
            "config_file",
            "bad_config_files_exit_2_naming_the_line_and_key"
        ));
        assert!(MAIN.selects(
            "config_file",
            "config_section_shapes_the_upload_as_its_flags_do"
        ));
        assert!(!MAIN.selects(
            "multiqueue_vm",
            "one_rate_and_one_fairness_across_tx_queues"
        ));
    }

    #[test]
    fn the_multi_queue_test_runs_once_on_seven() {
        let name = "one_rate_and_one_fairness_across_tx_queues";
        assert!(KERNEL_INTERFACE.selects("multiqueue_vm", name));
        for tier in [MAIN, COMPATIBILITY, QUICK, ARM64] {
            assert!(!tier.selects("multiqueue_vm", name), "{}", tier.name);
        }
    }

    #[test]
    fn the_subsets_leave_the_comparisons_out() {
        for tier in [KERNEL_INTERFACE, COMPATIBILITY] {
            assert!(!tier.selects("fair_vm", "goodput_with_gso_matches_cake"));
            assert!(!tier.selects("lone_flow_vm", "a_lone_flow_gets_the_rate_cake_gets"));
            assert!(tier.selects("tc_restore", "htb_tree_with_leaves_and_filters_comes_back"));
            assert!(tier.selects("prog_test_run_police", "any"));
        }
        assert!(COMPATIBILITY.selects("shaping", "sigkill_then_cleanup_restores"));
        assert!(!COMPATIBILITY.selects("shaping", "htb_tree_comes_back_exactly"));
        assert!(COMPATIBILITY.selects("ingress_police", "a_flood_is_policed"));
        assert!(KERNEL_INTERFACE.selects("observe", "flowtable_offload_is_listed"));
        assert!(!COMPATIBILITY.selects("observe", "flowtable_offload_is_listed"));
        assert!(!ARM64.selects("fair_vm", "goodput_with_gso_matches_cake"));
        assert!(ARM64.selects("shaping", "sigkill_then_cleanup_restores"));
        assert!(!ARM64.selects("metrics_endpoint", "any"));
    }

    #[test]
    fn only_the_arm64_tier_runs_the_bad_input_battery() {
        assert!(ARM64.selects("cli_bad_input", "bad_rates_exit_2"));
        for tier in [MAIN, KERNEL_INTERFACE, COMPATIBILITY, QUICK] {
            assert!(!tier.selects("cli_bad_input", "bad_rates_exit_2"));
        }
    }

    #[test]
    fn a_missing_named_test_fails_the_check() {
        let available = vec![
            (
                "shaping".to_owned(),
                vec!["sigterm_restores_the_default_root".to_owned()],
            ),
            ("tc_restore".to_owned(), vec![]),
            ("programs_load".to_owned(), vec![]),
        ];
        let err = COMPATIBILITY
            .check(&available)
            .expect_err("prog_test_run is missing")
            .to_string();
        assert!(err.contains("prog_test_run"), "{err}");
        let mut available: Vec<(String, Vec<String>)> = [
            "cli_bad_input",
            "metrics_endpoint",
            "service_scripts",
            "multiqueue_vm",
        ]
        .map(|b| (b.to_owned(), vec![]))
        .into();
        assert!(MAIN.check(&available).is_err(), "config_file is missing");
        available.push(("config_file".to_owned(), vec!["renamed".to_owned()]));
        let err = MAIN
            .check(&available)
            .expect_err("a host-only test is missing")
            .to_string();
        assert!(err.contains("bad_config_files_exit_2"), "{err}");
    }
}
