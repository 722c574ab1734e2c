//! Timed traffic on one clock: bulk flows that start and stop at set
//! times, and back-to-back short transfers, for the cases iperf3 cannot
//! time (each iperf3 process counts its intervals from its own start, so
//! two clients' series cannot be lined up to a tenth of a second).
//!
//! - The receiver is a TCP listener and a UDP socket on the server (threads
//!   that entered the server's namespace). Each connection's first 4 bytes,
//!   and each datagram's, name its flow; every byte after a connection's
//!   first 4, and every datagram's whole payload, is counted in the flow's
//!   bin of [`BIN`] on the clock the plan started on.
//! - A bulk TCP sender connects at its start, writes until its stop, and
//!   closes with a reset (`SO_LINGER` 0), so what is left in its socket
//!   buffer is dropped and the flow ends when it stops, not seconds later.
//! - A bulk UDP sender sends [`UDP_PAYLOAD`]-byte datagrams at its rate
//!   (those due each millisecond together) from its start to its stop: an
//!   unresponsive flow that fills whatever share it gets at once, where a
//!   TCP flow's own window would set the pace.
//! - A short-transfer sender repeats, until its stop: connect, write
//!   `bytes`, shut down its side, wait for the receiver's close. A
//!   transfer's time runs from the connect to that close (the handshake,
//!   the data and the FIN, as a page load would see it).
//!
//! Invariants: senders and the receiver run on threads of their own (a
//! thread's namespace is its own); the receiver stops accepting once every
//! sender is done (counting datagrams [`UDP_DRAIN`] longer) and at the
//! plan's end plus [`TAIL_LIMIT`] at the latest; the listener is closed
//! when the run returns.
//!
//! Units: bytes per bin (`u64`), times as [`Duration`] since the plan's
//! start.
//!
//! Non-goals: other receivers than the server, sender-side statistics,
//! loss figures (a UDP flow's goodput is what it got through).

use std::{
    fs::File,
    io::{ErrorKind, Read, Write},
    net::{Ipv4Addr, Shutdown, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use super::{
    LabError,
    topology::{Host, Testbed, enter_netns},
};
use crate::rate::Rate;

/// The receiver's bin.
pub const BIN: Duration = Duration::from_millis(100);

/// The receiver's port.
const PORT: u16 = 5301;

/// How long a blocked read or write waits before it looks at the clock.
const IO_TIMEOUT: Duration = Duration::from_millis(50);

/// Bytes per write.
const CHUNK: usize = 64 * 1024;

/// The receiver stops this long after the plan's end at the latest.
const TAIL_LIMIT: Duration = Duration::from_secs(2);

/// After the senders are done, datagrams still queued on the path (a UDP
/// flow above its share waits up to the shaper's horizon) are counted for
/// this long.
const UDP_DRAIN: Duration = Duration::from_millis(600);

/// UDP payload bytes per datagram: a 1500-byte IPv4 packet.
pub const UDP_PAYLOAD: usize = 1472;

/// The server's receive buffer for UDP: a quarter second at 100 Mbit/s, so
/// a receiver thread descheduled under emulation loses nothing itself.
const UDP_RCVBUF_BYTES: libc::c_int = 3 << 20;

/// One bulk flow from `from` to the server, sending over `[start, stop)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BulkFlow {
    /// The sending host.
    pub from: Host,
    /// TCP (`None`), or UDP sent at this rate.
    pub udp: Option<Rate>,
    /// When it connects.
    pub start: Duration,
    /// When it stops writing and resets.
    pub stop: Duration,
}

/// Back-to-back transfers of `bytes` each from `from`, started over
/// `[start, stop)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortTransfers {
    /// The sending host.
    pub from: Host,
    /// Payload of each transfer.
    pub bytes: u64,
    /// When the first one starts.
    pub start: Duration,
    /// No transfer starts at or after this.
    pub stop: Duration,
}

/// What to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimedPlan {
    /// The bulk flows.
    pub bulk: Vec<BulkFlow>,
    /// The short transfers, if any.
    pub short: Option<ShortTransfers>,
}

impl TimedPlan {
    /// When the last sender stops.
    pub fn end(&self) -> Duration {
        self.bulk
            .iter()
            .map(|f| f.stop)
            .chain(self.short.map(|s| s.stop))
            .max()
            .unwrap_or_default()
    }
}

/// One finished short transfer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Transfer {
    /// When it connected, since the plan's start.
    pub started: Duration,
    /// Connect to the receiver's close.
    pub took: Duration,
}

/// What the receiver counted and the short-transfer sender timed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimedResult {
    /// Per bulk flow, in the plan's order: payload bytes received per
    /// [`BIN`] since the plan's start.
    pub bins: Vec<Vec<u64>>,
    /// Per bulk flow: when its last byte arrived.
    pub last_byte: Vec<Option<Duration>>,
    /// The short transfers that completed, in order.
    pub transfers: Vec<Transfer>,
    /// Payload bytes of the short transfers, received.
    pub short_bytes: u64,
}

impl TimedResult {
    /// Flow `i`'s goodput in bit/s over bins `[from, to)` (times rounded
    /// down to bins).
    pub fn flow_bps(&self, i: usize, from: Duration, to: Duration) -> f64 {
        let (a, b) = (bin_of(from), bin_of(to));
        let bytes: u64 = self
            .bins
            .get(i)
            .map(|v| v.iter().take(b).skip(a).sum())
            .unwrap_or(0);
        let secs = (b.saturating_sub(a)) as f64 * BIN.as_secs_f64();
        if secs == 0.0 {
            0.0
        } else {
            bytes as f64 * 8.0 / secs
        }
    }

    /// All bulk flows' goodput over `[from, to)`, bit/s.
    pub fn total_bps(&self, from: Duration, to: Duration) -> f64 {
        (0..self.bins.len())
            .map(|i| self.flow_bps(i, from, to))
            .sum()
    }
}

/// The bin a time falls in.
pub fn bin_of(t: Duration) -> usize {
    (t.as_nanos() / BIN.as_nanos()) as usize
}

/// Flow ids on the wire: bulk flows are their index, short transfers this.
const SHORT_ID: u32 = u32::MAX;

/// How long after [`run_timed`] is called its clock may start: time for
/// the receiver to listen and the senders to enter their namespaces.
pub const LEAD: Duration = Duration::from_millis(200);

/// Runs `plan` on `tb` with whatever shapes the router now, its clock
/// starting at `t0` (at least [`LEAD`] from now).
pub fn run_timed(tb: &Testbed, plan: &TimedPlan, t0: Instant) -> Result<TimedResult, LabError> {
    if plan.bulk.is_empty() && plan.short.is_none() {
        return Err(LabError::Invalid {
            detail: "a timed plan needs a flow".to_owned(),
        });
    }
    let end = plan.end();
    let server = SocketAddrV4::new(Host::Server.addr(), PORT);
    let (ready_tx, ready_rx) = mpsc::channel();
    let server_ns = tb.netns_file(Host::Server)?;
    let flows = plan.bulk.len();
    let senders_done = Arc::new(AtomicBool::new(false));
    let done = Arc::clone(&senders_done);
    let receiver =
        thread::spawn(move || receive(server_ns, server, flows, t0, end, done, ready_tx));
    ready_rx
        .recv()
        .map_err(|_| invalid("the receiver stopped before it listened"))?
        .map_err(|e| io_error("listening on", &server.to_string(), e))?;
    let mut senders: Vec<JoinHandle<Result<Vec<Transfer>, std::io::Error>>> = Vec::new();
    for (id, f) in plan.bulk.iter().enumerate() {
        let (ns, f) = (tb.netns_file(f.from)?, *f);
        let id = u32::try_from(id).map_err(|_| invalid("too many flows"))?;
        senders.push(thread::spawn(move || {
            enter_netns(&ns)?;
            let (start, stop) = (t0 + f.start, t0 + f.stop);
            match f.udp {
                None => send_bulk(server, id, start, stop),
                Some(rate) => send_udp(server, id, rate, start, stop),
            }
            .map(|()| Vec::new())
        }));
    }
    if let Some(s) = plan.short {
        let ns = tb.netns_file(s.from)?;
        senders.push(thread::spawn(move || {
            enter_netns(&ns)?;
            send_short(server, s, t0)
        }));
    }
    let mut transfers = Vec::new();
    let mut failed = None;
    for s in senders {
        match s.join() {
            Ok(Ok(t)) => transfers.extend(t),
            Ok(Err(e)) => failed = failed.or(Some(e.to_string())),
            Err(_) => failed = failed.or(Some("a sender panicked".to_owned())),
        }
    }
    senders_done.store(true, Ordering::Release);
    let result = receiver
        .join()
        .map_err(|_| invalid("the receiver panicked"))?
        .map_err(|e| io_error("receiving on", &server.to_string(), e))?;
    if let Some(detail) = failed {
        return Err(invalid(&format!("a timed sender failed: {detail}")));
    }
    Ok(TimedResult {
        transfers,
        ..result
    })
}

fn invalid(detail: &str) -> LabError {
    LabError::Invalid {
        detail: detail.to_owned(),
    }
}

fn io_error(what: &'static str, path: &str, source: std::io::Error) -> LabError {
    LabError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

fn send_bulk(to: SocketAddrV4, id: u32, start: Instant, stop: Instant) -> std::io::Result<()> {
    thread::sleep(start.saturating_duration_since(Instant::now()));
    let mut s = TcpStream::connect(to)?;
    s.write_all(&id.to_le_bytes())?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let chunk = vec![0u8; CHUNK];
    while Instant::now() < stop {
        match s.write(&chunk) {
            Ok(_) => {}
            Err(e) if timed_out(&e) => {}
            Err(e) => return Err(e),
        }
    }
    socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO))?;
    Ok(())
}

fn send_udp(
    to: SocketAddrV4,
    id: u32,
    rate: Rate,
    start: Instant,
    stop: Instant,
) -> std::io::Result<()> {
    let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))?;
    s.connect(to)?;
    let mut datagram = [0u8; UDP_PAYLOAD];
    datagram[..4].copy_from_slice(&id.to_le_bytes());
    let bits = (UDP_PAYLOAD * 8) as f64;
    let per_s = rate.bits_per_s() as f64 / bits;
    thread::sleep(start.saturating_duration_since(Instant::now()));
    let mut sent: u64 = 0;
    while Instant::now() < stop {
        let due = (start.elapsed().as_secs_f64() * per_s) as u64;
        while sent < due {
            // A full local queue refuses the datagram: it counts as sent
            // and lost, as an unresponsive sender would not resend it.
            match s.send(&datagram) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) || timed_out(&e) => {}
                Err(e) => return Err(e),
            }
            sent += 1;
        }
        thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

fn send_short(to: SocketAddrV4, s: ShortTransfers, t0: Instant) -> std::io::Result<Vec<Transfer>> {
    let stop = t0 + s.stop;
    thread::sleep((t0 + s.start).saturating_duration_since(Instant::now()));
    let payload = vec![0u8; usize::try_from(s.bytes).unwrap_or(usize::MAX)];
    let mut done = Vec::new();
    while Instant::now() < stop {
        let began = Instant::now();
        let mut c = TcpStream::connect(to)?;
        c.write_all(&SHORT_ID.to_le_bytes())?;
        c.write_all(&payload)?;
        c.shutdown(Shutdown::Write)?;
        let mut end = [0u8; 16];
        while c.read(&mut end)? > 0 {}
        done.push(Transfer {
            started: began - t0,
            took: began.elapsed(),
        });
    }
    Ok(done)
}

/// One connection's count.
struct Counted {
    id: u32,
    bins: Vec<u64>,
    last: Option<Duration>,
    bytes: u64,
}

fn receive(
    ns: File,
    at: SocketAddrV4,
    flows: usize,
    t0: Instant,
    end: Duration,
    senders_done: Arc<AtomicBool>,
    ready: mpsc::Sender<std::io::Result<()>>,
) -> std::io::Result<TimedResult> {
    let bound = enter_netns(&ns).and_then(|()| {
        let listener = TcpListener::bind(at)?;
        let udp = UdpSocket::bind(at)?;
        set_rcvbuf_force(&udp)?;
        Ok((listener, udp))
    });
    let (listener, udp) = match bound {
        Ok(both) => both,
        Err(e) => {
            let kind = e.kind();
            let _ = ready.send(Err(e));
            return Err(kind.into());
        }
    };
    listener.set_nonblocking(true)?;
    let deadline = t0 + end + TAIL_LIMIT;
    let done = Arc::clone(&senders_done);
    let datagrams = thread::spawn(move || count_udp(udp, flows, t0, deadline, &done));
    let _ = ready.send(Ok(()));
    let mut readers = Vec::new();
    while Instant::now() < deadline && !senders_done.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((c, _)) => readers.push(thread::spawn(move || count(c, t0, deadline))),
            Err(e) if timed_out(&e) => thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(e),
        }
    }
    let mut result = TimedResult {
        bins: vec![Vec::new(); flows],
        last_byte: vec![None; flows],
        ..TimedResult::default()
    };
    let udp = datagrams
        .join()
        .map_err(|_| std::io::Error::other("the UDP receiver panicked"))??;
    for r in readers
        .into_iter()
        .map(|r| r.join().ok())
        .chain(udp.into_iter().map(|c| Some(Ok(c))))
    {
        let Some(Ok(c)) = r else { continue };
        match usize::try_from(c.id).ok().filter(|&i| i < flows) {
            Some(i) => {
                let bins = &mut result.bins[i];
                if bins.len() < c.bins.len() {
                    bins.resize(c.bins.len(), 0);
                }
                for (b, n) in bins.iter_mut().zip(&c.bins) {
                    *b += n;
                }
                result.last_byte[i] = result.last_byte[i].max(c.last);
            }
            None => result.short_bytes += c.bytes,
        }
    }
    Ok(result)
}

/// Sets the socket's receive buffer past `rmem_max` (the lab runs as root).
fn set_rcvbuf_force(u: &UdpSocket) -> std::io::Result<()> {
    let size = UDP_RCVBUF_BYTES;
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live
    // c_int on this stack frame; the fd is open for the call.
    let rc = unsafe {
        libc::setsockopt(
            u.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&raw const size).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Counts datagrams per flow id until `deadline`: one count per bulk flow
/// that sent any.
fn count_udp(
    u: UdpSocket,
    flows: usize,
    t0: Instant,
    deadline: Instant,
    senders_done: &AtomicBool,
) -> std::io::Result<Vec<Counted>> {
    u.set_read_timeout(Some(IO_TIMEOUT))?;
    let mut counted: Vec<Counted> = (0..flows)
        .map(|i| Counted {
            id: u32::try_from(i).unwrap_or(u32::MAX),
            bins: Vec::new(),
            last: None,
            bytes: 0,
        })
        .collect();
    let mut buf = [0u8; UDP_PAYLOAD];
    let mut drain_until: Option<Instant> = None;
    while Instant::now() < drain_until.unwrap_or(deadline).min(deadline) {
        if drain_until.is_none() && senders_done.load(Ordering::Acquire) {
            drain_until = Some(Instant::now() + UDP_DRAIN);
        }
        let n = match u.recv(&mut buf) {
            Ok(n) => n,
            Err(e) if timed_out(&e) => continue,
            Err(e) => return Err(e),
        };
        let Some(c) = buf
            .get(..4)
            .filter(|_| n >= 4)
            .and_then(|b| usize::try_from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok())
            .and_then(|i| counted.get_mut(i))
        else {
            continue;
        };
        c.add(n, Instant::now().saturating_duration_since(t0));
    }
    Ok(counted.into_iter().filter(|c| c.bytes > 0).collect())
}

impl Counted {
    fn add(&mut self, n: usize, at: Duration) {
        let bin = bin_of(at);
        if self.bins.len() <= bin {
            self.bins.resize(bin + 1, 0);
        }
        self.bins[bin] += n as u64;
        self.bytes += n as u64;
        self.last = Some(at);
    }
}

fn count(mut c: TcpStream, t0: Instant, deadline: Instant) -> std::io::Result<Counted> {
    c.set_nonblocking(false)?;
    c.set_read_timeout(Some(IO_TIMEOUT))?;
    let mut id = [0u8; 4];
    c.read_exact(&mut id)?;
    let mut counted = Counted {
        id: u32::from_le_bytes(id),
        bins: Vec::new(),
        last: None,
        bytes: 0,
    };
    let mut buf = vec![0u8; CHUNK];
    while Instant::now() < deadline {
        let n = match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if timed_out(&e) => continue,
            // A bulk sender ends with a reset.
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => return Err(e),
        };
        counted.add(n, Instant::now().saturating_duration_since(t0));
    }
    Ok(counted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(bins: Vec<Vec<u64>>) -> TimedResult {
        TimedResult {
            last_byte: vec![None; bins.len()],
            bins,
            ..TimedResult::default()
        }
    }

    #[test]
    fn goodput_covers_whole_bins_between_the_times() {
        // 125 000 bytes in a 100 ms bin is 10 Mbit/s.
        let r = result(vec![vec![125_000, 125_000, 250_000], vec![0, 125_000]]);
        let ms = Duration::from_millis;
        assert_eq!(r.flow_bps(0, ms(0), ms(200)), 10e6);
        assert_eq!(r.flow_bps(0, ms(200), ms(300)), 20e6);
        assert_eq!(r.flow_bps(0, ms(250), ms(250)), 0.0);
        assert!((r.flow_bps(1, ms(0), ms(300)) - 125_000.0 * 8.0 / 0.3).abs() < 1e-6);
        assert_eq!(r.total_bps(ms(100), ms(200)), 20e6);
        assert_eq!(r.flow_bps(2, ms(0), ms(100)), 0.0);
    }

    #[test]
    fn the_plan_ends_with_its_last_sender() {
        let s = Duration::from_secs;
        let plan = TimedPlan {
            bulk: vec![
                BulkFlow {
                    from: Host::Client,
                    udp: None,
                    start: s(0),
                    stop: s(4),
                },
                BulkFlow {
                    from: Host::Client,
                    udp: None,
                    start: s(1),
                    stop: s(3),
                },
            ],
            short: Some(ShortTransfers {
                from: Host::Client2,
                bytes: 100_000,
                start: s(0),
                stop: s(5),
            }),
        };
        assert_eq!(plan.end(), s(5));
        assert_eq!(bin_of(Duration::from_millis(199)), 1);
    }
}
