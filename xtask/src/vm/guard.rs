//! Holds the TCX static key on inside the guest for the whole job
//! (`cargo xtask vm-guest-guard`, started by the job script).
//!
//! Why: the first TCX attachment in the system turns `tcx_needed_key` on and
//! the last detachment turns it off (kernel/bpf/tcx.c, tcx_skeys_inc and
//! tcx_skeys_dec). Each flip rewrites the key's branch sites in
//! sch_handle_ingress and sch_handle_egress by text_poke_bp. Under
//! multi-threaded TCG a vCPU can still run a stale copy of such a site and
//! oops on the transient int3, as the netstamp and tracepoint sites did (see
//! init.sh). A kprobe on arch_jump_label_transform_queue counted 6 site
//! rewrites from tcx_link_attach and tcx_link_release per `shaper run` on
//! 6.12. One pinned TCX link on the spare veth `vmkeys0` (created by init)
//! keeps the key on, so tests attach and detach without rewriting code.
//!
//! What it attaches: a two-instruction SCHED_CLS program that returns
//! TCX_NEXT (-1), so it changes nothing for the veth's traffic (there is
//! none). The link is pinned in the guest's bpffs, so no process is needed.
//!
//! Non-goals: kernels without TCX (6.1): there the shaper attaches through
//! cls_bpf, whose keys init's clsact already holds; the guard says so and
//! succeeds. Never run on the host: the command refuses outside the VM
//! (it checks for init's marker device).

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use anyhow::{Context, Result, bail};

/// The spare veth init creates for the key guards.
const GUARD_DEV: &str = "vmkeys0";
/// Where the link is pinned (the guest's own bpffs).
const PIN_PATH: &str = "/sys/fs/bpf/vm-guard-tcx-egress";

// bpf(2) commands and constants (include/uapi/linux/bpf.h).
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_EGRESS: u32 = 47;

/// One eBPF instruction (struct bpf_insn): opcode, dst/src registers in one
/// byte, offset, immediate.
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

/// The leading fields of union bpf_attr for BPF_PROG_LOAD.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
}

/// The leading fields of union bpf_attr for BPF_LINK_CREATE (tcx variant:
/// relative_fd and expected_revision zero, so "append, any revision").
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    relative_fd: u32,
    pad: u32,
    expected_revision: u64,
}

/// The leading fields of union bpf_attr for BPF_OBJ_PIN.
#[repr(C)]
#[derive(Default)]
struct ObjPinAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

const _: () = assert!(std::mem::size_of::<Insn>() == 8);
const _: () = assert!(std::mem::size_of::<ProgLoadAttr>() == 48);
const _: () = assert!(std::mem::size_of::<LinkCreateAttr>() == 32);
const _: () = assert!(std::mem::size_of::<ObjPinAttr>() == 16);

/// bpf(2) for a command whose result is a new file descriptor.
fn bpf_fd<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    let size = std::mem::size_of::<T>();
    // SAFETY: attr points to a live, initialised #[repr(C)] prefix of union
    // bpf_attr of `size` bytes; the kernel reads at most `size` bytes and
    // zero-extends the rest.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, size) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(ret).map_err(|_| io::Error::other("bpf(2) returned no fd"))?;
    // SAFETY: the kernel just returned this descriptor to us and nothing else
    // owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Attaches and pins the guard link. Ok(false): this kernel has no TCX.
pub(crate) fn hold_tcx_key() -> Result<bool> {
    let dev = CString::new(GUARD_DEV).context("device name")?;
    // SAFETY: dev is a valid NUL-terminated string for the call's duration.
    let ifindex = unsafe { libc::if_nametoindex(dev.as_ptr()) };
    if ifindex == 0 {
        bail!(
            "no {GUARD_DEV} device: this command runs only inside `cargo xtask vm`, \
             whose init creates it"
        );
    }
    if std::path::Path::new(PIN_PATH).exists() {
        return Ok(true);
    }

    // r0 = -1 (TCX_NEXT); exit
    let insns = [
        Insn {
            code: 0xb7,
            regs: 0,
            off: 0,
            imm: -1,
        },
        Insn {
            code: 0x95,
            regs: 0,
            off: 0,
            imm: 0,
        },
    ];
    let license = c"GPL";
    let mut load = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_SCHED_CLS,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        ..Default::default()
    };
    let prog = bpf_fd(BPF_PROG_LOAD, &mut load).context("cannot load the guard program")?;

    let mut link = LinkCreateAttr {
        prog_fd: raw(&prog),
        target_ifindex: ifindex,
        attach_type: BPF_TCX_EGRESS,
        ..Default::default()
    };
    let link = match bpf_fd(BPF_LINK_CREATE, &mut link) {
        Ok(fd) => fd,
        // No TCX attach type: 6.1 and older.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(false),
        Err(e) => return Err(e).context("cannot attach the guard link to vmkeys0"),
    };

    let path = CString::new(PIN_PATH).context("pin path")?;
    let mut pin = ObjPinAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: raw(&link),
        ..Default::default()
    };
    // BPF_OBJ_PIN returns 0, not a descriptor.
    let size = std::mem::size_of::<ObjPinAttr>();
    // SAFETY: as in bpf_fd; `path` outlives the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_PIN,
            &mut pin as *mut ObjPinAttr,
            size,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("cannot pin the guard link at {PIN_PATH}"));
    }
    Ok(true)
}

fn raw(fd: &OwnedFd) -> u32 {
    use std::os::fd::AsRawFd;
    fd.as_raw_fd() as u32
}
