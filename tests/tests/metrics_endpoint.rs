//! The metrics endpoint under careless and hostile clients: thousands of
//! connections that never send a request, and clients that send their
//! request one byte a second, against a `shaper trace --metrics` whose
//! descriptors are capped at 256 (`prlimit`), as on a small router.
//!
//! What must hold while they are connected: `/metrics` answers within a
//! second, the process stays far from a spinning core, and afterwards its
//! descriptors and threads are back where they started.
//!
//! Runs on the host (a namespace of its own, its loopback only): nothing here
//! depends on the kernel beyond `shaper trace` attaching.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use shaper_tests::netns::NetNsGuard;
use shaper_tests::skip::{Need, require};
use shaper_tests::topo::shaper_bin;

/// Connections opened and held without a request.
const IDLE_CLIENTS: usize = 10_000;
/// Clients that send their request one byte a second.
const SLOW_CLIENTS: usize = 100;
/// How long both kinds are held.
const HOLD: Duration = Duration::from_secs(60);
/// Opening the idle clients must finish within this (it takes seconds when
/// the server keeps accepting).
const OPEN_WITHIN: Duration = Duration::from_secs(60);
/// A connect on loopback completes at once unless its SYN was dropped (the
/// listen queue was full), so one not done within this is retried, as a
/// client's kernel would retransmit the SYN, but without its second's wait.
const CONNECT_RETRY_AFTER: Duration = Duration::from_millis(100);
/// The shaper's descriptor limit, as on a small router.
const SHAPER_NOFILE: u32 = 256;
/// `/metrics` must answer within this while the clients are held.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);
/// A scrape's connect may take this long: right after the burst of idle
/// clients the listen queue can still be full, and the kernel drops the
/// scraper's SYN, which TCP resends after its initial timeout of 1 s
/// (RFC 6298), as any client's kernel does. Within the hold, with no burst,
/// the whole scrape must still take at most [`ANSWER_WITHIN`].
const CONNECT_WITHIN: Duration = Duration::from_secs(3);
/// CPU the shaper may use while the clients are held, as a fraction of one
/// core. A loop that spins on failed accepts uses all of it.
const CPU_FRACTION_MAX: f64 = 0.05;

const ADDR: &str = "127.0.0.1:9477";

#[test]
fn idle_and_slow_clients_cannot_stall_the_endpoint() {
    if !require(&[Need::Root, Need::Tool("prlimit", "--version")]) {
        return;
    }
    let want_fds = (IDLE_CLIENTS + SLOW_CLIENTS + 256) as u64;
    let nofile = format!("a descriptor limit this process can raise to {want_fds}");
    if !require(&[Need::Probed(raise_nofile(want_fds), &nofile)]) {
        return;
    }
    let _ns = NetNsGuard::new();
    let addr: SocketAddr = ADDR.parse().expect("address");
    let mut trace = Trace::start();
    let pid = trace.child.id();
    let (fds_before, threads_before) = (fd_count(pid), thread_count(pid));
    let first = scrape(addr).expect("a scrape before any client");
    assert!(first.contains("shaper_"), "{first}");

    // The idle clients: connect, never send. A client opens faster than
    // the server accepts, so a burst overflows the listen queue now and then
    // and that connect is retried. A server that has stopped accepting
    // leaves every connect hanging, so opening them has a deadline.
    let opening = Instant::now();
    let mut idle = Vec::with_capacity(IDLE_CLIENTS);
    let mut failed = 0usize;
    while idle.len() < IDLE_CLIENTS && opening.elapsed() < OPEN_WITHIN {
        match TcpStream::connect_timeout(&addr, CONNECT_RETRY_AFTER) {
            Ok(s) => idle.push(s),
            Err(_) => failed += 1,
        }
    }
    let opened_in = opening.elapsed();
    if let Err(e) = scrape(addr) {
        panic!(
            "/metrics failed with {} idle clients connected ({failed} connects failed): {e}; \
             listen queue: {}",
            idle.len(),
            listen_overflows()
        );
    }
    assert_eq!(
        idle.len(),
        IDLE_CLIENTS,
        "only {} idle clients connected within {OPEN_WITHIN:?} ({failed} connects failed)",
        idle.len()
    );

    // The slow clients: a request, one byte a second.
    let stop = Arc::new(AtomicBool::new(false));
    let slow = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut socks: Vec<TcpStream> = (0..SLOW_CLIENTS)
                .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok())
                .collect();
            let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let byte = &request[i % request.len()..][..1];
                socks.retain_mut(|s| s.write_all(byte).is_ok());
                i += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
            socks.len()
        })
    };

    // While both are held: scrape every 2 s, and measure the CPU used.
    let cpu_start = cpu_seconds(pid);
    let held_from = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut scrapes = 0;
    while held_from.elapsed() < HOLD {
        std::thread::sleep(Duration::from_secs(2));
        let t = Instant::now();
        let body = scrape(addr).unwrap_or_else(|e| {
            panic!(
                "/metrics failed after {:.1} s with {} idle clients held: {e}",
                held_from.elapsed().as_secs_f64(),
                idle.len()
            )
        });
        let took = t.elapsed();
        assert!(body.contains("shaper_"), "{body}");
        assert!(
            took <= ANSWER_WITHIN,
            "/metrics took {took:?} with {} idle and {SLOW_CLIENTS} slow clients held",
            idle.len()
        );
        slowest = slowest.max(took);
        scrapes += 1;
    }
    let cpu = (cpu_seconds(pid) - cpu_start) / held_from.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let slow_left = slow.join().expect("slow clients");
    eprintln!(
        "{} idle clients opened in {opened_in:.1?} ({failed} connects retried); they and {SLOW_CLIENTS} slow clients held \
         {HOLD:?}: {scrapes} scrapes, slowest {slowest:?}, cpu {:.1}% of a core; slow clients \
         still connected at the end: {slow_left}",
        idle.len(),
        cpu * 100.0
    );
    assert!(
        cpu <= CPU_FRACTION_MAX,
        "the shaper used {:.1}% of a core while the clients were held (at most {:.0}%)",
        cpu * 100.0,
        CPU_FRACTION_MAX * 100.0
    );
    assert_eq!(
        slow_left, 0,
        "a client sending one byte a second kept its connection"
    );

    // Afterwards: nothing left behind.
    drop(idle);
    std::thread::sleep(Duration::from_secs(3));
    scrape(addr).expect("a scrape after the clients left");
    let (fds_after, threads_after) = (fd_count(pid), thread_count(pid));
    assert!(
        fds_after <= fds_before + 1,
        "descriptors {fds_before} before, {fds_after} after"
    );
    assert!(
        threads_after <= threads_before,
        "threads {threads_before} before, {threads_after} after"
    );
    trace.stop();
}

/// `shaper trace --iface lo --metrics ADDR` under a descriptor limit.
struct Trace {
    child: Child,
}

impl Trace {
    fn start() -> Self {
        let nofile = format!("--nofile={SHAPER_NOFILE}:{SHAPER_NOFILE}");
        let log = std::env::temp_dir().join(format!("metrics-endpoint-{}.log", std::process::id()));
        let child = Command::new("prlimit")
            .arg(nofile)
            .arg(shaper_bin())
            .args([
                "trace",
                "--iface",
                "lo",
                "--duration",
                "600s",
                "--metrics",
                ADDR,
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("trace log"))
            .spawn()
            .expect("start shaper trace");
        let addr: SocketAddr = ADDR.parse().expect("address");
        let started = Instant::now();
        while let Err(e) = scrape(addr) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "shaper trace served no metrics within 60 s: {e}; it said: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Self { child }
    }

    fn stop(&mut self) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our
        // child's, which has not been reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("wait for shaper trace");
        assert!(status.success(), "shaper trace ended with {status}");
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One `GET /metrics`; the body on a 200.
fn scrape(addr: SocketAddr) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&addr, CONNECT_WITHIN).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(ANSWER_WITHIN * 2))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).map_err(|e| e.to_string())?;
    match resp.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_owned()),
        _ => Err(format!("unexpected response: {resp:.200}")),
    }
}

/// This namespace's `ListenOverflows` and `ListenDrops`, for a failure's
/// message: SYNs the kernel dropped because a listen queue was full.
fn listen_overflows() -> String {
    let netstat = std::fs::read_to_string("/proc/thread-self/net/netstat").unwrap_or_default();
    let mut lines = netstat.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return "no TcpExt in /proc/thread-self/net/netstat".to_owned();
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .filter(|(n, _)| matches!(*n, "ListenOverflows" | "ListenDrops"))
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Raises the soft descriptor limit to `want` if the hard limit allows.
fn raise_nofile(want: u64) -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_max < want {
        return false;
    }
    lim.rlim_cur = lim.rlim_cur.max(want);
    // SAFETY: setrlimit reads the struct we own.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 }
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn thread_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// User plus system CPU seconds of `pid` (`/proc/<pid>/stat` fields 14, 15).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / hz
}
