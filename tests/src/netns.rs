//! A guard that moves the calling thread into a fresh network namespace and
//! back on drop. Child processes spawned from the thread inherit it, so `ip`,
//! `tc` and the `shaper` binary run inside it. Tests run with one thread
//! (`--test-threads=1`), so nothing else shares the thread.

use std::{fs::File, os::fd::AsRawFd, process::Command};

/// While alive, the current thread is in a new network namespace with `lo` up.
pub struct NetNsGuard {
    previous: File,
}

impl NetNsGuard {
    /// Enters a new network namespace. Panics (with the reason) on failure:
    /// tests want the stack trace.
    pub fn new() -> Self {
        let previous = File::open("/proc/thread-self/ns/net").expect("open current netns");
        // SAFETY: unshare has no memory-safety preconditions; it affects only
        // the calling thread's network namespace.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        );
        sh("ip link set lo up");
        Self { previous }
    }
}

impl Default for NetNsGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NetNsGuard {
    fn drop(&mut self) {
        // SAFETY: the fd is an open network-namespace file we own.
        let rc = unsafe { libc::setns(self.previous.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            eprintln!("setns back failed: {}", std::io::Error::last_os_error());
        }
    }
}

/// Runs a shell command, panicking with its output when it fails.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("spawn sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Creates a veth pair `a`/`b` in the current namespace, both up.
pub fn veth_pair(a: &str, b: &str) {
    sh(&format!("ip link add name {a} type veth peer name {b}"));
    sh(&format!("ip link set dev {a} up && ip link set dev {b} up"));
}
