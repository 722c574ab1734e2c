//! Runs a loaded `SCHED_CLS` program on a synthetic packet with the kernel's
//! `BPF_PROG_TEST_RUN` (bpf(2) command 10), for the integration tests and for
//! the per-packet cost that `cargo xtask bench` reports.
//!
//! What the kernel does (net/bpf/test_run.c, `bpf_prog_test_run_skb`): it
//! copies the packet into a fresh linear skb on the loopback device of the
//! caller's network namespace (or on `ctx.ifindex`), sets `skb->protocol` with
//! `eth_type_trans`, pushes the Ethernet header back (so a `SCHED_CLS` program
//! sees the frame from its first byte, as on egress), copies the allowed
//! `__sk_buff` fields from `ctx_in`, runs the program `repeat` times on the
//! same skb, and copies the packet and the `__sk_buff` back out. Map side
//! effects are real: every run updates the program's maps.
//!
//! Invariants:
//! - [`SkBuff`] mirrors `struct __sk_buff` (include/uapi/linux/bpf.h) byte for
//!   byte: 192 bytes with `hwtstamp` last, as on 6.x kernels (size and offsets
//!   asserted below; checked against this machine's BTF,
//!   `bpftool btf dump file /sys/kernel/btf/vmlinux`). Older kernels with a
//!   shorter `__sk_buff` accept it as long as the fields they lack are zero,
//!   and copy back only their own prefix.
//! - Every pointer handed to the kernel comes with the length of the buffer
//!   behind it, and the output buffers are sized so the kernel clamps its
//!   copies to them; the one `unsafe` block is the syscall itself.
//!
//! Units: `duration_ns` is the kernel's mean wall time per run in nanoseconds
//! of CLOCK_MONOTONIC (total / `repeat`, saturated at `u32::MAX`); packet
//! lengths are bytes; `SkBuff::tstamp` is nanoseconds (CLOCK_MONOTONIC for an
//! EDT departure time set at egress).
//!
//! Non-goals: XDP, flow-dissector and tracing programs (their context types
//! differ), `BPF_F_TEST_RUN_ON_CPU` and live frames. aya 0.14 also has
//! `aya::programs::TestRun`, tied to aya's program objects and raw byte
//! contexts; this module works on any program fd (a pinned one too) and gives
//! the context a type and the errors an explanation.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
};

/// bpf(2) command number of `BPF_PROG_TEST_RUN` (enum bpf_cmd).
const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// The kernel's `ENOTSUPP` (include/linux/errno.h): not in libc because it is
/// meant to stay inside the kernel, but `BPF_PROG_TEST_RUN` returns it for
/// program types without a test-run handler.
const ENOTSUPP: i32 = 524;

/// Room the output packet buffer keeps beyond the input length, for programs
/// that grow the packet (`bpf_skb_change_tail`, `bpf_skb_adjust_room`). A
/// program that grows it more gets [`TestRunError::DataOutTooSmall`].
pub const DATA_OUT_SLACK: usize = 4096;

/// Smallest packet the kernel accepts: one Ethernet header (`ETH_HLEN`;
/// `bpf_test_init` returns `EINVAL` below it). Observed on 6.18: an untagged
/// IPv4 frame also needs its 20-byte and an IPv6 frame its 40-byte base
/// header (`EINVAL` otherwise); behind a VLAN tag any length from 14 runs.
pub const MIN_PACKET_LEN: usize = 14;

/// Mirror of the kernel's `struct __sk_buff`, the context a `SCHED_CLS`
/// program sees. Field names and order are the kernel's.
///
/// As `ctx_in`, the kernel (6.x, `convert___skb_to_skb`) only accepts
/// `mark`, `priority`, `ingress_ifindex`, `ifindex` (0, 1 or an existing
/// device), `cb`, `tstamp`, `wire_len` (0 or at least the packet length),
/// `gso_segs`, `gso_size` and `hwtstamp`; any other nonzero field makes the
/// run fail with `EINVAL`. As `ctx_out` it fills in `mark`, `priority`,
/// `ingress_ifindex`, `ifindex`, `tstamp`, `cb`, `wire_len`, `gso_segs` and
/// `hwtstamp`; the rest come back as they went in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SkBuff {
    /// Packet length in bytes, Ethernet header included. Not an input.
    pub len: u32,
    /// `PACKET_*` type (host, broadcast, outgoing, ...).
    pub pkt_type: u32,
    /// Firewall mark.
    pub mark: u32,
    /// Transmit queue index.
    pub queue_mapping: u32,
    /// Network protocol, big-endian `ETH_P_*` in the low 16 bits.
    pub protocol: u32,
    /// Nonzero when the skb carries an offloaded VLAN tag.
    pub vlan_present: u32,
    /// Offloaded VLAN tag control information.
    pub vlan_tci: u32,
    /// Offloaded VLAN protocol (big-endian TPID).
    pub vlan_proto: u32,
    /// Queueing priority (`skb->priority`, a tc class id at egress).
    pub priority: u32,
    /// Index of the device the packet arrived on, 0 if local.
    pub ingress_ifindex: u32,
    /// Index of the device the skb belongs to (loopback, 1, unless set).
    pub ifindex: u32,
    /// tc index (classic tc classifiers).
    pub tc_index: u32,
    /// Scratch space shared between programs on one hook.
    pub cb: [u32; 5],
    /// Flow hash.
    pub hash: u32,
    /// tc class id the program may set for `TC_ACT_OK` with direct action.
    pub tc_classid: u32,
    /// Packet start, as the program sees it (not an input).
    pub data: u32,
    /// Packet end, as the program sees it (not an input).
    pub data_end: u32,
    /// NAPI id of the receive queue.
    pub napi_id: u32,
    /// Socket address family (socket programs only).
    pub family: u32,
    /// Remote IPv4 address (socket programs only).
    pub remote_ip4: u32,
    /// Local IPv4 address (socket programs only).
    pub local_ip4: u32,
    /// Remote IPv6 address (socket programs only).
    pub remote_ip6: [u32; 4],
    /// Local IPv6 address (socket programs only).
    pub local_ip6: [u32; 4],
    /// Remote port (socket programs only).
    pub remote_port: u32,
    /// Local port, host byte order (socket programs only).
    pub local_port: u32,
    /// Start of the metadata area, as the program sees it (not an input).
    pub data_meta: u32,
    /// `struct bpf_flow_keys *` (flow dissector only); 64 bits on every arch.
    pub flow_keys: u64,
    /// Timestamp in ns: the earliest departure time at egress (EDT), the
    /// receive time at ingress. 0 means "none".
    pub tstamp: u64,
    /// Length on the wire in bytes (GSO packets: all segments).
    pub wire_len: u32,
    /// Number of GSO segments.
    pub gso_segs: u32,
    /// `struct bpf_sock *`; 64 bits on every arch.
    pub sk: u64,
    /// GSO segment size in bytes.
    pub gso_size: u32,
    /// `BPF_SKB_TSTAMP_*`: the clock `tstamp` is in (kernel >= 5.18).
    pub tstamp_type: u8,
    /// The uapi's `__u32 :24` hole; always zero.
    pub reserved: [u8; 3],
    /// Hardware receive timestamp in ns.
    pub hwtstamp: u64,
}

/// Size of `struct __sk_buff` on this kernel (BTF: `STRUCT '__sk_buff' size=192`).
pub const SK_BUFF_SIZE: usize = 192;

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<SkBuff>() == SK_BUFF_SIZE);
    // Offsets from the kernel's BTF (bits_offset / 8); a drift in any field
    // before them would move them.
    assert!(offset_of!(SkBuff, ifindex) == 40);
    assert!(offset_of!(SkBuff, cb) == 48);
    assert!(offset_of!(SkBuff, data_meta) == 140);
    assert!(offset_of!(SkBuff, flow_keys) == 144);
    assert!(offset_of!(SkBuff, tstamp) == 152);
    assert!(offset_of!(SkBuff, wire_len) == 160);
    assert!(offset_of!(SkBuff, sk) == 168);
    assert!(offset_of!(SkBuff, gso_size) == 176);
    assert!(offset_of!(SkBuff, tstamp_type) == 180);
    assert!(offset_of!(SkBuff, hwtstamp) == 184);
};

impl SkBuff {
    /// Names of the fields that are nonzero here but that the kernel refuses
    /// as input (see the type's doc). Empty when the context is acceptable.
    pub fn rejected_input_fields(&self) -> Vec<&'static str> {
        let checks = [
            ("len", self.len != 0),
            ("pkt_type", self.pkt_type != 0),
            ("queue_mapping", self.queue_mapping != 0),
            ("protocol", self.protocol != 0),
            ("vlan_present", self.vlan_present != 0),
            ("vlan_tci", self.vlan_tci != 0),
            ("vlan_proto", self.vlan_proto != 0),
            ("tc_index", self.tc_index != 0),
            ("hash", self.hash != 0),
            ("tc_classid", self.tc_classid != 0),
            ("data", self.data != 0),
            ("data_end", self.data_end != 0),
            ("napi_id", self.napi_id != 0),
            ("family", self.family != 0),
            ("remote_ip4", self.remote_ip4 != 0),
            ("local_ip4", self.local_ip4 != 0),
            ("remote_ip6", self.remote_ip6 != [0; 4]),
            ("local_ip6", self.local_ip6 != [0; 4]),
            ("remote_port", self.remote_port != 0),
            ("local_port", self.local_port != 0),
            ("data_meta", self.data_meta != 0),
            ("flow_keys", self.flow_keys != 0),
            ("sk", self.sk != 0),
            ("tstamp_type", self.tstamp_type != 0),
            ("reserved", self.reserved != [0; 3]),
        ];
        checks
            .into_iter()
            .filter(|(_, nonzero)| *nonzero)
            .map(|(name, _)| name)
            .collect()
    }
}

/// What one `BPF_PROG_TEST_RUN` call returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestRunOutput {
    /// The program's return value (for tc: -1 `TC_ACT_UNSPEC`, 0 `TC_ACT_OK`,
    /// 2 `TC_ACT_SHOT`, ...), of the last run when `repeat > 1`.
    pub retval: i32,
    /// Mean time per run in ns, as the kernel measured it (saturates at
    /// `u32::MAX`). Includes the kernel's per-run bookkeeping around the
    /// program (bottom-half disable and enable), not the syscall.
    pub duration_ns: u32,
    /// The packet after the last run.
    pub data: Vec<u8>,
    /// The `__sk_buff` after the last run (see [`SkBuff`] for which fields
    /// the kernel fills in).
    pub ctx: SkBuff,
}

/// Why a test run failed.
#[derive(Debug, thiserror::Error)]
pub enum TestRunError {
    /// The packet is longer than the attribute's 32-bit length field.
    #[error(
        "packet of {len} bytes is too long for BPF_PROG_TEST_RUN \
         (the kernel takes at most about one page, 4 KiB minus skb overhead)"
    )]
    PacketTooLong {
        /// Length of the packet passed in, in bytes.
        len: usize,
    },
    /// bpf(2) failed; `hint` says what to check for this errno.
    #[error("`bpf(BPF_PROG_TEST_RUN)` failed on a {len}-byte packet: {hint}")]
    Syscall {
        /// Length of the packet passed in, in bytes.
        len: usize,
        /// What to check, for this errno.
        hint: String,
        /// The errno.
        #[source]
        io_error: io::Error,
    },
    /// The program grew the packet beyond the output buffer.
    #[error(
        "`bpf(BPF_PROG_TEST_RUN)` returned a {needed}-byte packet but the output buffer holds \
         {capacity} bytes: the program grew the packet by more than DATA_OUT_SLACK \
         ({DATA_OUT_SLACK} bytes); raise it"
    )]
    DataOutTooSmall {
        /// Packet length the kernel reported, in bytes.
        needed: u32,
        /// Size of the buffer that was passed, in bytes.
        capacity: usize,
        /// The kernel's ENOSPC.
        #[source]
        io_error: io::Error,
    },
    /// The kernel's `__sk_buff` is larger than [`SkBuff`].
    #[error(
        "`bpf(BPF_PROG_TEST_RUN)` returned a {needed}-byte __sk_buff but SkBuff mirrors \
         {SK_BUFF_SIZE} bytes: this kernel added fields; update SkBuff from \
         include/uapi/linux/bpf.h"
    )]
    CtxOutTooSmall {
        /// Context size the kernel reported, in bytes.
        needed: u32,
        /// The kernel's ENOSPC.
        #[source]
        io_error: io::Error,
    },
}

impl TestRunError {
    /// The errno behind the error, if it came from the kernel.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            TestRunError::PacketTooLong { .. } => None,
            TestRunError::Syscall { io_error, .. }
            | TestRunError::DataOutTooSmall { io_error, .. }
            | TestRunError::CtxOutTooSmall { io_error, .. } => io_error.raw_os_error(),
        }
    }
}

/// The `test` member of `union bpf_attr` (include/uapi/linux/bpf.h), with
/// the tail padding spelled out: the kernel's `CHECK_ATTR` wants every byte
/// after the last field it knows to be zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    padding: u32,
}

const _: () = {
    assert!(core::mem::size_of::<TestRunAttr>() == 80);
    assert!(core::mem::offset_of!(TestRunAttr, batch_size) == 72);
};

/// Runs `prog` (a loaded `SCHED_CLS` or `SCHED_ACT` program) once per
/// `repeat` (0 counts as 1) on `packet`, a whole frame starting with its
/// Ethernet header, with `ctx` as the initial `__sk_buff` (None: all zero).
///
/// Returns the verdict and the packet and context after the last run. Fails
/// when the kernel refuses the run (the error says what to check); in
/// particular a packet shorter than [`MIN_PACKET_LEN`] gets `EINVAL`.
pub fn run_skb(
    prog: BorrowedFd<'_>,
    packet: &[u8],
    ctx: Option<&SkBuff>,
    repeat: u32,
) -> Result<TestRunOutput, TestRunError> {
    run_skb_with(prog, packet, ctx, repeat, sys_bpf_prog_test_run)
}

/// [`run_skb`] with the syscall as a parameter, so unit tests can stand in
/// for the kernel.
fn run_skb_with(
    prog: BorrowedFd<'_>,
    packet: &[u8],
    ctx: Option<&SkBuff>,
    repeat: u32,
    sys: impl FnOnce(&mut TestRunAttr) -> io::Result<()>,
) -> Result<TestRunOutput, TestRunError> {
    let len = packet.len();
    let too_long = || TestRunError::PacketTooLong { len };
    let data_size_in = u32::try_from(len).map_err(|_| too_long())?;
    let mut data = vec![0u8; len + DATA_OUT_SLACK];
    let data_size_out = u32::try_from(data.len()).map_err(|_| too_long())?;
    let mut ctx_out = ctx.copied().unwrap_or_default();

    let mut attr = TestRunAttr {
        // A valid fd is never negative.
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in,
        data_size_out,
        data_in: packet.as_ptr() as u64,
        data_out: data.as_mut_ptr() as u64,
        repeat,
        ctx_size_in: if ctx.is_some() {
            SK_BUFF_SIZE as u32
        } else {
            0
        },
        ctx_size_out: SK_BUFF_SIZE as u32,
        ctx_in: ctx.map_or(0, |c| c as *const SkBuff as u64),
        ctx_out: &mut ctx_out as *mut SkBuff as u64,
        ..TestRunAttr::default()
    };
    if let Err(io_error) = sys(&mut attr) {
        return Err(explain(&attr, len, ctx, io_error));
    }
    data.truncate(attr.data_size_out as usize);
    Ok(TestRunOutput {
        // The kernel passes the program's int return value through a u32.
        retval: attr.retval as i32,
        duration_ns: attr.duration,
        data,
        ctx: ctx_out,
    })
}

/// The one call into the kernel.
fn sys_bpf_prog_test_run(attr: &mut TestRunAttr) -> io::Result<()> {
    // SAFETY: `attr` is a valid, exclusively borrowed `bpf_attr.test` whose
    // size we pass, so the kernel reads and writes only inside it. Its
    // pointers (set by `run_skb_with`) point to live buffers that outlive the
    // call: `data_in`/`ctx_in` are read for `data_size_in`/`ctx_size_in`
    // bytes; the kernel writes at most `data_size_out` bytes to `data_out`
    // (it clamps to a nonzero size hint, bpf_test_finish) and at most
    // `ctx_size_out` bytes to `ctx_out` (bpf_ctx_finish), both the full
    // lengths of their buffers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            attr as *mut TestRunAttr,
            core::mem::size_of::<TestRunAttr>(),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Turns an errno into an error that says what to check.
fn explain(
    attr: &TestRunAttr,
    len: usize,
    ctx: Option<&SkBuff>,
    io_error: io::Error,
) -> TestRunError {
    let errno = io_error.raw_os_error().unwrap_or(0);
    if errno == libc::ENOSPC {
        if attr.data_size_out as usize > len + DATA_OUT_SLACK {
            return TestRunError::DataOutTooSmall {
                needed: attr.data_size_out,
                capacity: len + DATA_OUT_SLACK,
                io_error,
            };
        }
        return TestRunError::CtxOutTooSmall {
            needed: attr.ctx_size_out,
            io_error,
        };
    }
    let hint = match errno {
        libc::EPERM | libc::EACCES => {
            "permission denied: run as root, or with CAP_BPF and CAP_NET_ADMIN".to_owned()
        }
        libc::EBADF => "the program fd is not open".to_owned(),
        libc::EINVAL => {
            let mut hint = format!(
                "the kernel refused the arguments: the fd must be a loaded BPF program; the \
                 packet must hold at least an Ethernet header ({MIN_PACKET_LEN} bytes) and at \
                 most about 3.7 KiB (one page minus skb overhead; this one has {len}), and \
                 recent kernels (6.18) also want an untagged IPv4 or IPv6 frame to hold its \
                 whole base header (34 or 54 bytes); ctx may set only mark, priority, ingress_ifindex, ifindex, cb, tstamp, wire_len (0 or \
                 >= the packet length), gso_segs, gso_size and hwtstamp"
            );
            if let Some(c) = ctx {
                let rejected = c.rejected_input_fields();
                if !rejected.is_empty() {
                    hint.push_str(&format!("; this ctx sets {}", rejected.join(", ")));
                }
            }
            hint
        }
        libc::ENODEV => format!(
            "ctx.ifindex {} names no device in this network namespace",
            ctx.map_or(0, |c| c.ifindex)
        ),
        libc::EMSGSIZE => format!("the {len}-byte packet is larger than the kernel accepts"),
        libc::EINTR => "interrupted by a signal during the repeated runs; retry".to_owned(),
        libc::ENOMEM => "the kernel could not allocate the test skb".to_owned(),
        libc::EFAULT => "the kernel could not read or write a buffer".to_owned(),
        ENOTSUPP => "this program type has no BPF_PROG_TEST_RUN support on this kernel \
                     (needs a SCHED_CLS or SCHED_ACT program)"
            .to_owned(),
        _ => "unexpected errno from the kernel".to_owned(),
    };
    TestRunError::Syscall {
        len,
        hint,
        io_error,
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    /// Any open fd will do: the fake kernel never looks at it.
    fn some_fd() -> std::fs::File {
        std::fs::File::open("/dev/null").expect("open /dev/null")
    }

    #[test]
    fn attr_carries_sizes_and_output_maps_back() {
        let fd = some_fd();
        let packet = [0xaau8; 60];
        let ctx_in = SkBuff {
            tstamp: 1_000,
            ..SkBuff::default()
        };
        let out = run_skb_with(fd.as_fd(), &packet, Some(&ctx_in), 7, |attr| {
            assert_eq!(attr.prog_fd as i32, fd.as_raw_fd());
            assert_eq!(attr.data_size_in, 60);
            assert_eq!(attr.data_size_out as usize, 60 + DATA_OUT_SLACK);
            assert_eq!(attr.repeat, 7);
            assert_eq!(attr.ctx_size_in as usize, SK_BUFF_SIZE);
            assert_eq!(attr.ctx_size_out as usize, SK_BUFF_SIZE);
            assert_eq!(
                (attr.flags, attr.cpu, attr.batch_size, attr.padding),
                (0, 0, 0, 0)
            );
            // Play the kernel: return -1, a shorter packet and a stamped ctx.
            attr.retval = u32::MAX;
            attr.duration = 42;
            attr.data_size_out = 54;
            // SAFETY: ctx_out points to the SkBuff run_skb_with owns.
            unsafe { (*(attr.ctx_out as *mut SkBuff)).tstamp = 5_000 };
            Ok(())
        })
        .expect("fake run");
        assert_eq!(out.retval, -1);
        assert_eq!(out.duration_ns, 42);
        assert_eq!(out.data.len(), 54);
        assert_eq!(out.ctx.tstamp, 5_000);
    }

    #[test]
    fn no_ctx_passes_no_ctx_in_but_reads_ctx_out() {
        let fd = some_fd();
        run_skb_with(fd.as_fd(), &[0; 14], None, 1, |attr| {
            assert_eq!((attr.ctx_in, attr.ctx_size_in), (0, 0));
            assert_ne!(attr.ctx_out, 0);
            Ok(())
        })
        .expect("fake run");
    }

    #[test]
    fn eperm_says_which_capability() {
        let fd = some_fd();
        let err = run_skb_with(fd.as_fd(), &[0; 14], None, 1, |_| {
            Err(io::Error::from_raw_os_error(libc::EPERM))
        })
        .expect_err("EPERM");
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
        let msg = err.to_string();
        assert!(
            msg.contains("BPF_PROG_TEST_RUN") && msg.contains("CAP_BPF"),
            "{msg}"
        );
    }

    #[test]
    fn einval_names_the_rejected_ctx_fields() {
        let fd = some_fd();
        let ctx = SkBuff {
            len: 3,
            tstamp: 9,
            protocol: 8,
            ..SkBuff::default()
        };
        let err = run_skb_with(fd.as_fd(), &[0; 14], Some(&ctx), 1, |_| {
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        })
        .expect_err("EINVAL");
        let msg = err.to_string();
        // tstamp is a valid input, so only len and protocol are named.
        assert!(msg.ends_with("; this ctx sets len, protocol"), "{msg}");
    }

    #[test]
    fn enospc_on_data_reports_the_needed_size() {
        let fd = some_fd();
        let err = run_skb_with(fd.as_fd(), &[0; 20], None, 1, |attr| {
            attr.data_size_out = 9_000;
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        })
        .expect_err("ENOSPC");
        assert!(
            matches!(err, TestRunError::DataOutTooSmall { needed: 9_000, capacity, .. }
                if capacity == 20 + DATA_OUT_SLACK),
            "{err:?}"
        );
    }

    #[test]
    fn default_ctx_is_an_acceptable_input() {
        assert!(SkBuff::default().rejected_input_fields().is_empty());
        let allowed = SkBuff {
            mark: 1,
            priority: 2,
            ingress_ifindex: 3,
            ifindex: 4,
            cb: [5; 5],
            tstamp: 6,
            wire_len: 7,
            gso_segs: 8,
            gso_size: 9,
            hwtstamp: 10,
            ..SkBuff::default()
        };
        assert!(allowed.rejected_input_fields().is_empty());
    }
}
