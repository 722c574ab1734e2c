//! The fair pacer's per-packet cost when two CPUs run it at once, against
//! one CPU alone, measured by the kernel with `BPF_PROG_TEST_RUN`.
//!
//! What is shared: every packet on every CPU reads the fair share and adds
//! its transmission time to the epoch ring's slot (`SHAPER_FAIR`, updated
//! with atomics), and counts into per-CPU counters. Flow entries belong to
//! one flow each, so two CPUs with distinct flows never write the same one.
//! A cache line that both CPUs write moves between their caches on every
//! packet; this part measures what that costs.
//!
//! Method.
//! - The paced 10k-flow mix of the host part (`host`'s header): the flows
//!   in chunks, one priming packet per flow of a chunk, then `repeat`
//!   measured packets each, paced below CoDel's target; the fair share
//!   frozen at 1.0 as there.
//! - The tuples split in two halves of distinct flows. Thread *k* is pinned
//!   to CPU *k* and runs half *k*. Each round measures half 0 alone on CPU
//!   0 (`1cpu`), then both halves at once (`2cpu`, each thread's own ns per
//!   packet, averaged over the two), so the two figures alternate and
//!   share the machine's state of the moment.
//! - The figure is the median round, with min and max; `ratio` is
//!   `2cpu / 1cpu` of the medians.
//! - The counters, read before and after, give the share of measured
//!   packets that were paced: a figure for another path is not this one.
//!
//! Units: nanoseconds per packet (f64), fractions (0..=1).
//!
//! Non-goals: wall-clock throughput (each figure is CPU time per packet, so
//! two CPUs that do not slow each other show a ratio of 1), more than two
//! CPUs, the epoch roll (frozen, as in the host part).

use std::{
    os::fd::BorrowedFd,
    thread::{self, sleep},
    time::Duration,
};

use serde::Serialize;
use shaper_common::counters::Counter;

use super::{
    loaded::{Bench, BenchError, Prog, call_on},
    measure::{mix_chunk, spread, warm_up},
};

/// The two CPUs' figures.
#[derive(Clone, Debug, Serialize)]
pub struct ConcurrencyReport {
    /// The CPUs the two threads ran on.
    pub cpus: [usize; 2],
    /// Distinct flows per thread.
    pub flows_per_cpu: usize,
    /// Rounds, each one `1cpu` and one `2cpu` measurement.
    pub rounds: u32,
    /// Median ns per packet of half 0 alone on its CPU.
    pub ns_per_packet_1cpu: f64,
    /// Smallest and largest round of `1cpu`.
    pub ns_per_packet_1cpu_min: f64,
    /// Largest round of `1cpu`.
    pub ns_per_packet_1cpu_max: f64,
    /// Median ns per packet of both halves at once, each on its CPU.
    pub ns_per_packet_2cpu: f64,
    /// Smallest round of `2cpu`.
    pub ns_per_packet_2cpu_min: f64,
    /// Largest round of `2cpu`.
    pub ns_per_packet_2cpu_max: f64,
    /// `ns_per_packet_2cpu / ns_per_packet_1cpu`.
    pub ratio: f64,
    /// Of the measured packets, the share that was paced.
    pub paced_fraction: f64,
}

/// Measures the paced mix over `frames` on CPUs 0 and 1; `None` on a
/// machine with one CPU. The caller has prepared the maps at the paced
/// mix's rate, where a frame takes `tx_ns`.
pub(super) fn run(
    b: &Bench,
    frames: &[Vec<u8>],
    rounds: u32,
    repeat: u32,
    tx_ns: u64,
) -> Result<Option<ConcurrencyReport>, BenchError> {
    let cpus = thread::available_parallelism().map_or(1, usize::from);
    if cpus < 2 || frames.len() < 2 {
        return Ok(None);
    }
    let fd = b.fd(Prog::Egress);
    let (half0, half1) = frames.split_at(frames.len() / 2);
    let call_ns = warm_up(frames, |f| call_on(fd, Prog::Egress, f, 1))?;
    let chunk = mix_chunk(tx_ns, call_ns);
    let before = b.counts()?;
    let (mut one, mut two) = (Vec::new(), Vec::new());
    let mut measured = 0u64;
    for _ in 0..rounds {
        // Every clock idle again before each measurement.
        sleep(Duration::from_millis(10));
        let (ns, n) =
            thread::scope(|s| join(s.spawn(|| pinned(0, || pass(fd, half0, chunk, repeat)))))?;
        one.push(ns / n as f64);
        measured += n;
        sleep(Duration::from_millis(10));
        let (a, b2) = thread::scope(|s| {
            let t0 = s.spawn(|| pinned(0, || pass(fd, half0, chunk, repeat)));
            let t1 = s.spawn(|| pinned(1, || pass(fd, half1, chunk, repeat)));
            (join(t0), join(t1))
        });
        let ((ns0, n0), (ns1, n1)) = (a?, b2?);
        two.push((ns0 / n0 as f64 + ns1 / n1 as f64) / 2.0);
        measured += n0 + n1;
    }
    let after = b.counts()?;
    let paced = after[Counter::Paced].saturating_sub(before[Counter::Paced]);
    let (m1, lo1, hi1) = spread(&mut one);
    let (m2, lo2, hi2) = spread(&mut two);
    Ok(Some(ConcurrencyReport {
        cpus: [0, 1],
        flows_per_cpu: half0.len(),
        rounds,
        ns_per_packet_1cpu: m1,
        ns_per_packet_1cpu_min: lo1,
        ns_per_packet_1cpu_max: hi1,
        ns_per_packet_2cpu: m2,
        ns_per_packet_2cpu_min: lo2,
        ns_per_packet_2cpu_max: hi2,
        ratio: if m1 > 0.0 { m2 / m1 } else { f64::NAN },
        paced_fraction: paced as f64 / measured.max(1) as f64,
    }))
}

/// One pass over `frames`: per chunk, one priming call per flow, then
/// `repeat` measured packets per flow. The measured calls' total ns and
/// packets.
pub(super) fn pass(
    fd: BorrowedFd<'_>,
    frames: &[Vec<u8>],
    chunk: usize,
    repeat: u32,
) -> Result<(f64, u64), BenchError> {
    let (mut ns, mut packets) = (0.0, 0u64);
    for group in frames.chunks(chunk) {
        for f in group {
            call_on(fd, Prog::Egress, f, 1)?;
        }
        for f in group {
            ns += call_on(fd, Prog::Egress, f, repeat)?;
        }
        packets += group.len() as u64 * u64::from(repeat);
    }
    Ok((ns, packets))
}

/// Runs `f` on this thread pinned to `cpu` (the kernel runs a
/// `BPF_PROG_TEST_RUN` call on the caller's CPU).
fn pinned<T>(cpu: usize, f: impl FnOnce() -> Result<T, BenchError>) -> Result<T, BenchError> {
    // SAFETY: `set` is a plain bitmask the libc macros initialise and fill;
    // the syscall reads `size_of::<cpu_set_t>()` bytes of it and changes
    // only this thread's affinity (pid 0).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(BenchError::Pin {
            cpu,
            source: std::io::Error::last_os_error(),
        });
    }
    f()
}

/// A scoped thread's result; a panic in it becomes an error.
fn join<T>(h: thread::ScopedJoinHandle<'_, Result<T, BenchError>>) -> Result<T, BenchError> {
    h.join().map_err(|_| BenchError::ThreadPanicked)?
}
