//! The kernel helpers the classifiers call, as the benchmark counts them.
//!
//! `shaper-ebpf` holds one fentry program per helper below (the program
//! named in [`Helper::program`], attached to the kernel function in
//! [`Helper::function`]); each adds one to its slot of
//! `SHAPER_HELPER_CALLS` (a `PerCpuArray<u64>` of [`HELPERS`]`.len()`
//! entries, indexed by position in [`HELPERS`]) every time the helper runs.
//! Only the benchmark loads and attaches them, around an untimed pass of
//! its own: the trampoline costs time on every call.
//!
//! The kernel functions are the helpers' implementations (the
//! `BPF_CALL_x` definitions in net/core/filter.c, kernel/bpf/helpers.c and
//! kernel/bpf/ringbuf.c); `bpf_get_prandom_u32` is `bpf_user_rnd_u32`
//! there. Map lookups the verifier inlines and tail calls the JIT turns
//! into jumps are not calls, so they are not counted.
//!
//! Non-goals: attributing a call to a program (an fentry program sees
//! every caller on the machine).

/// One counted helper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Helper {
    /// The helper as a BPF program names it.
    pub name: &'static str,
    /// The kernel function fentry attaches to.
    pub function: &'static str,
    /// The counting program in the object.
    pub program: &'static str,
}

/// Every helper the egress classifier, the policer, the redirect program
/// and the telemetry program call, in slot order.
pub const HELPERS: [Helper; 7] = [
    Helper {
        name: "bpf_skb_load_bytes",
        function: "bpf_skb_load_bytes",
        program: "calls_load",
    },
    Helper {
        name: "bpf_ktime_get_ns",
        function: "bpf_ktime_get_ns",
        program: "calls_ktime",
    },
    Helper {
        name: "bpf_skb_set_tstamp",
        function: "bpf_skb_set_tstamp",
        program: "calls_tstamp",
    },
    Helper {
        name: "bpf_skb_store_bytes",
        function: "bpf_skb_store_bytes",
        program: "calls_store",
    },
    Helper {
        name: "bpf_get_prandom_u32",
        function: "bpf_user_rnd_u32",
        program: "calls_prandom",
    },
    Helper {
        name: "bpf_ringbuf_output",
        function: "bpf_ringbuf_output",
        program: "calls_ringbuf",
    },
    Helper {
        name: "bpf_redirect",
        function: "bpf_redirect",
        program: "calls_redirect",
    },
];

#[cfg(test)]
mod tests {
    use super::HELPERS;

    #[test]
    fn every_helper_has_its_own_program_and_function() {
        for (i, a) in HELPERS.iter().enumerate() {
            for b in &HELPERS[i + 1..] {
                assert_ne!(a.program, b.program);
                assert_ne!(a.function, b.function);
            }
            // The kernel keeps 15 bytes of a program's name.
            assert!(a.program.len() <= 15, "{}", a.program);
        }
    }
}
