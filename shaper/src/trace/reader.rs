//! Reading the tracer's ring buffer without blocking the runtime: aya's
//! `RingBuf` wrapped in tokio's `AsyncFd` (the map's fd polls readable when
//! records are waiting).
//!
//! Non-goals: ordering across CPUs (records come in commit order, which is
//! all the aggregates need).

use std::io;

use aya::maps::{MapData, RingBuf};
use shaper_common::event::Event;
use tokio::io::{Interest, unix::AsyncFd};

/// The ring buffer of sojourn events, readable from async code.
pub struct EventReader {
    fd: AsyncFd<RingBuf<MapData>>,
    /// Records shorter than an `Event` (never expected; counted).
    pub malformed: u64,
}

impl EventReader {
    /// Wraps `ring`; needs a tokio runtime with IO enabled.
    pub fn new(ring: RingBuf<MapData>) -> io::Result<Self> {
        // SAFETY: `RingBuf<MapData>` owns the map's fd: it stays open and
        // `as_raw_fd` returns the same fd for as long as the ring lives,
        // and the ring lives inside the `AsyncFd` until it is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| io::Error::other(format!("registering the ring buffer: {e}")))?;
        Ok(EventReader { fd, malformed: 0 })
    }

    /// Waits until records are ready, then hands each to `f`. Returns how
    /// many were read.
    pub async fn read(&mut self, mut f: impl FnMut(&Event)) -> io::Result<usize> {
        let mut guard = self.fd.readable_mut().await?;
        // Readiness is cleared before draining: a record committed during
        // the drain then wakes the next wait (the other order can lose that
        // wakeup, and the ring fills with nobody reading).
        guard.clear_ready();
        Ok(drain(guard.get_inner_mut(), &mut self.malformed, &mut f))
    }

    /// Hands every record waiting now to `f`, without waiting.
    pub fn drain_now(&mut self, mut f: impl FnMut(&Event)) -> usize {
        drain(self.fd.get_mut(), &mut self.malformed, &mut f)
    }
}

fn drain(ring: &mut RingBuf<MapData>, malformed: &mut u64, f: &mut impl FnMut(&Event)) -> usize {
    let mut n = 0;
    while let Some(item) = ring.next() {
        match Event::from_bytes(&item) {
            Some(e) => f(&e),
            None => *malformed += 1,
        }
        n += 1;
    }
    n
}
