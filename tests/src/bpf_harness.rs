//! The harness for the `BPF_PROG_TEST_RUN` tests of the egress classifier:
//! gives each test the embedded object as a fresh load leaves it (loaded
//! once per process and reset between tests), reads and writes its
//! maps, and checks that a run moved the counters by exactly what was
//! expected (every other counter by zero).
//!
//! Needs root (CAP_BPF and CAP_NET_ADMIN) and a kernel >= 5.18: a test
//! checks that with `require(&[Need::Bpf])` first (see [`crate::skip`]), and
//! [`Harness::load`] then panics when it cannot load, with the reason.

use std::{
    collections::BTreeMap,
    os::fd::AsFd,
    sync::Mutex,
    thread::sleep,
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    maps::{Array, MapData, PerCpuArray},
    programs::ProgramFd,
    util::KernelVersion,
};
use shaper::{
    bpf::test_run::{SkBuff, TestRunOutput, run_skb},
    checks::{CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN, Capabilities},
};
use shaper_common::{
    EGRESS_PROGRAM,
    config::{AggregateState, PacerConfig},
    counters::Counter,
    fair::FairState,
    flow::FlowSet,
    maps,
    police::LinkState,
    rate::ScaledRate,
    tins::{MAX_TINS, TinCounters, TinState},
};

use crate::{
    bpf_reset::ResetPlan,
    packets::{ETH_HLEN, Frame, Ipv4, Transport},
};

/// `TC_ACT_UNSPEC`: pass on to the next program / the qdisc.
pub const PASS: i32 = -1;
/// `TC_ACT_SHOT`: drop.
pub const DROP: i32 = 2;

/// Oldest kernel these tests are written for: the 192-byte `__sk_buff` that
/// `SkBuff` mirrors (with `tstamp_type`).
pub const MIN_KERNEL: KernelVersion = KernelVersion::new(5, 18, 0);

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// Why this machine cannot run the tests, if it cannot.
pub fn skip_reason() -> Option<String> {
    let caps = Capabilities::current().expect("read /proc/self/status");
    let bpf = caps.has(CAP_BPF) || caps.has(CAP_SYS_ADMIN);
    let net_admin = caps.has(CAP_NET_ADMIN) || caps.has(CAP_SYS_ADMIN);
    if !(bpf && net_admin) {
        return Some(format!(
            "loading a SCHED_CLS program needs root, or CAP_BPF and CAP_NET_ADMIN ({caps:?})"
        ));
    }
    match KernelVersion::current() {
        Ok(v) if v < MIN_KERNEL => Some(format!("kernel {v} is older than {MIN_KERNEL}")),
        Ok(_) => None,
        Err(e) => Some(format!("cannot read the kernel version: {e}")),
    }
}

/// The classifier and its maps, as a fresh load leaves them. Dereferences
/// to [`Loaded`].
///
/// Loads are shared: dropping a harness returns its object to a
/// per-process pool, and the next [`Harness::load_program`] of the same
/// program takes it from there and resets every map (see
/// [`crate::bpf_reset`]), so a test sees exactly what a new load gives
/// without paying the verifier again (seconds under emulation).
pub struct Harness {
    loaded: Option<Loaded>,
}

/// One loaded object: the program under test, its typed maps, and how to
/// reset them.
pub struct Loaded {
    pub ebpf: Ebpf,
    pub prog: ProgramFd,
    pub config: Array<MapData, PacerConfig>,
    pub counters: PerCpuArray<MapData, u64>,
    pub agg: Array<MapData, AggregateState>,
    pub fair: Array<MapData, FairState>,
    pub flows: Array<MapData, FlowSet>,
    /// The ingress policer's virtual link (`SHAPER_POLICE_LINK`).
    pub police_link: Array<MapData, LinkState>,
    /// The tins' table (`SHAPER_TINS`).
    pub tins: Array<MapData, TinState>,
    /// The per-tin counters (`SHAPER_TIN_COUNTERS`).
    pub tin_counters: PerCpuArray<MapData, TinCounters>,
    program: &'static str,
    reset: ResetPlan,
}

/// Objects no harness holds now, ready for reuse.
static POOL: Mutex<Vec<Loaded>> = Mutex::new(Vec::new());

impl std::ops::Deref for Harness {
    type Target = Loaded;
    fn deref(&self) -> &Loaded {
        self.loaded
            .as_ref()
            .expect("a harness holds its object until dropped")
    }
}

impl std::ops::DerefMut for Harness {
    fn deref_mut(&mut self) -> &mut Loaded {
        self.loaded
            .as_mut()
            .expect("a harness holds its object until dropped")
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(loaded) = self.loaded.take()
            && let Ok(mut pool) = POOL.lock()
        {
            pool.push(loaded);
        }
    }
}

/// Counter values summed over CPUs, indexed by `Counter`.
pub type Counts = shaper::counters::CounterSnapshot;

impl Harness {
    /// Loads the egress classifier; panics when it cannot (the test checked
    /// `Need::Bpf` before). The config starts disabled (all zero).
    pub fn load() -> Self {
        Self::load_program(EGRESS_PROGRAM)
    }

    /// As [`Harness::load`], for the object's program `name` (the egress
    /// classifier or the ingress policer: they share the maps). Reuses a
    /// pooled object of the same program, reset, when there is one.
    pub fn load_program(name: &'static str) -> Self {
        let pooled = POOL.lock().ok().and_then(|mut pool| {
            let at = pool.iter().position(|l| l.program == name)?;
            Some(pool.swap_remove(at))
        });
        let mut loaded = match pooled {
            Some(loaded) => {
                loaded.reset.reset();
                loaded
            }
            None => Loaded::new(name),
        };
        loaded.init();
        Self {
            loaded: Some(loaded),
        }
    }

    /// A new load of `name` that no pooled object stands in for, for the
    /// test that compares a reset object with a fresh one.
    pub fn load_fresh(name: &'static str) -> Self {
        let mut loaded = Loaded::new(name);
        loaded.init();
        Self {
            loaded: Some(loaded),
        }
    }
}

impl Loaded {
    fn new(name: &'static str) -> Self {
        if let Some(reason) = skip_reason() {
            panic!("cannot load {name}: {reason} (a test checks require(&[Need::Bpf]) first)");
        }
        shaper::bpf::object().unwrap_or_else(|e| {
            panic!(
                "{e}. For this test: build the object (RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
                 cargo build -p shaper-ebpf --release --target bpfel-unknown-none \
                 -Z build-std=core --target-dir target/bpf), then rerun"
            )
        });
        let sets = shaper_common::flow::DEFAULT_FLOWS / shaper_common::flow::WAYS as u32;
        let mut ebpf = shaper::bpf::load::open(sets, &[]).expect("load the BPF object");
        let prog = shaper::bpf::load::program_fd(&mut ebpf, name)
            .unwrap_or_else(|e| panic!("loading {name} (verifier log inside): {e}"));
        shaper::bpf::load::load_telemetry(&mut ebpf)
            .unwrap_or_else(|e| panic!("loading the telemetry program: {e}"));
        let reset = ResetPlan::of(&ebpf);
        let take = |ebpf: &mut Ebpf, name: &str| {
            ebpf.take_map(name)
                .unwrap_or_else(|| panic!("no map {name} in the object"))
        };
        let config = Array::try_from(take(&mut ebpf, maps::CONFIG)).expect("config map type");
        let counters =
            PerCpuArray::try_from(take(&mut ebpf, maps::COUNTERS)).expect("counters map type");
        let agg = Array::try_from(take(&mut ebpf, maps::AGGREGATE)).expect("agg map type");
        let fair = Array::try_from(take(&mut ebpf, maps::FAIR)).expect("fair map type");
        let flows = Array::try_from(take(&mut ebpf, maps::FLOWS)).expect("flows map type");
        let police_link =
            Array::try_from(take(&mut ebpf, maps::POLICE_LINK)).expect("police link map type");
        let tins = Array::try_from(take(&mut ebpf, maps::TINS)).expect("tins map type");
        let tin_counters =
            PerCpuArray::try_from(take(&mut ebpf, maps::TIN_COUNTERS)).expect("tin counters type");
        Self {
            ebpf,
            prog,
            config,
            counters,
            agg,
            fair,
            flows,
            police_link,
            tins,
            tin_counters,
            program: name,
            reset,
        }
    }

    /// What the loader writes after a load, on a new or a reset object:
    /// every tin's fair state at a multiplier of 1.0, one tin.
    fn init(&mut self) {
        for t in 0..MAX_TINS as u32 {
            self.fair
                .set(t, FairState::default(), 0)
                .expect("write SHAPER_FAIR");
        }
        self.tins
            .set(0, TinState::default(), 0)
            .expect("write SHAPER_TINS");
    }

    /// Tin `tin`'s counters, summed over CPUs.
    pub fn tin_counts(&self, tin: u32) -> TinCounters {
        self.tin_counters
            .get(&tin, 0)
            .expect("read SHAPER_TIN_COUNTERS")
            .iter()
            .fold(TinCounters::default(), |a, c| a.add(c))
    }

    /// Every map's contents, by name (see [`ResetPlan::contents`]).
    pub fn map_contents(&self) -> Vec<(String, Vec<u8>)> {
        self.reset.contents()
    }

    /// The kernel's id of the config map: equal for two harnesses only when
    /// they share one loaded object.
    pub fn config_map_id(&self) -> u32 {
        self.reset.map_id(maps::CONFIG)
    }

    /// A consumer of the telemetry ring buffer.
    pub fn events(&mut self) -> aya::maps::RingBuf<MapData> {
        crate::bpf_reset::ring_by_id(self.reset.map_id(maps::EVENTS))
    }

    /// Writes `state` into SHAPER_FAIR as the state of the epoch in
    /// progress (its `epoch` set to now's) and returns that epoch.
    pub fn set_fair_in_this_epoch(&mut self, state: FairState) -> u64 {
        let epoch = monotonic_ns() >> shaper_common::fair::EPOCH_SHIFT;
        let state = FairState { epoch, ..state };
        self.fair.set(0, state, 0).expect("write SHAPER_FAIR");
        epoch
    }

    /// SHAPER_FAIR's entry while the epoch is still `epoch`; `None` once the
    /// test has crossed into another (its checks of per-epoch counts then
    /// do not apply). Run the attempt under [`in_one_epoch`].
    pub fn fair_in_epoch(&self, epoch: u64) -> Option<FairState> {
        let s = self.fair.get(&0, 0).expect("read SHAPER_FAIR");
        (s.epoch == epoch).then_some(s)
    }

    pub fn set_config(&mut self, config: PacerConfig) {
        self.config.set(0, config, 0).expect("write SHAPER_CONFIG");
    }

    /// The aggregate clock, `t_next_free_ns`.
    pub fn clock(&self) -> u64 {
        self.agg.get(&0, 0).expect("read SHAPER_AGG").t_next_free_ns
    }

    pub fn set_clock(&mut self, t_next_free_ns: u64) {
        let state = AggregateState {
            t_next_free_ns,
            ..AggregateState::default()
        };
        self.agg.set(0, state, 0).expect("write SHAPER_AGG");
    }

    pub fn counts(&self) -> Counts {
        Counts::read(&self.counters).expect("read SHAPER_COUNTERS")
    }

    /// Runs one frame, panicking if the kernel refuses it.
    pub fn run(&self, frame: &[u8], ctx: Option<&SkBuff>) -> TestRunOutput {
        self.run_n(frame, ctx, 1)
    }

    /// Runs one frame `repeat` times on one skb (`BPF_PROG_TEST_RUN`'s
    /// repeat: what the program leaves in the skb, the next run sees),
    /// panicking if the kernel refuses it; the verdict is the last run's.
    pub fn run_repeated(&self, frame: &[u8], repeat: u32) -> TestRunOutput {
        self.run_n(frame, None, repeat)
    }

    fn run_n(&self, frame: &[u8], ctx: Option<&SkBuff>, repeat: u32) -> TestRunOutput {
        run_skb(self.prog.as_fd(), frame, ctx, repeat)
            .unwrap_or_else(|e| panic!("test run of a {}-byte frame: {e}", frame.len()))
    }

    /// Runs one frame and checks the verdict and that the counters moved by
    /// exactly `expected` (each other counter by zero). `what` names the case.
    pub fn run_expect(
        &self,
        what: &str,
        frame: &[u8],
        ctx: Option<&SkBuff>,
        verdict: i32,
        expected: &[(Counter, u64)],
    ) -> TestRunOutput {
        let before = self.counts();
        let out = self.run(frame, ctx);
        assert_eq!(out.retval, verdict, "{what}: verdict");
        assert_counts_moved(what, &before, &self.counts(), expected);
        out
    }
}

/// How many times [`in_one_epoch`] tries back to back before it waits
/// ([`until_judged`]).
pub const EPOCH_ATTEMPTS: u32 = 10;

/// Runs `attempt` until it returns `Some`: `None` means the attempt crossed
/// a fair-pacer epoch boundary (8.4 ms, short under emulation), so its
/// per-epoch checks had nothing to check. Each attempt gets its own
/// [`Harness`] as a fresh load leaves it, so none sees another's state.
pub fn in_one_epoch<T>(attempt: impl FnMut() -> Option<T>) -> T {
    until_judged(
        EPOCH_ATTEMPTS,
        "crossed an epoch boundary during the test",
        attempt,
    )
}

/// How long [`until_judged`] keeps trying once its attempts are spent. An
/// emulated guest has slow phases, about a minute long, in which every
/// syscall takes milliseconds and no attempt fits its window; a retry
/// after the phase fits again.
pub const PATIENCE: Duration = Duration::from_secs(150);

/// The pause between attempts once the count is spent.
const PAUSE: Duration = Duration::from_secs(2);

/// Runs `attempt` until it returns `Some`; `None` means the attempt
/// `missed` (its timing left nothing to judge). It tries `attempts` times
/// back to back, then on, a pause apart, until [`PATIENCE`] has passed
/// since the first. Each retry is reported through
/// [`crate::skip::note_retry`]; after the last miss the test fails.
pub fn until_judged<T>(attempts: u32, missed: &str, mut attempt: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    let mut n = 0;
    loop {
        n += 1;
        if let Some(v) = attempt() {
            return v;
        }
        crate::skip::note_retry(&format!("attempt {n} {missed}"));
        if n >= attempts {
            if started.elapsed() >= PATIENCE {
                break;
            }
            sleep(PAUSE);
        }
    }
    panic!(
        "every one of {n} attempts over {:.0} s {missed}",
        started.elapsed().as_secs_f64()
    );
}

/// Asserts `after - before` equals `expected` exactly (unlisted counters: 0).
pub fn assert_counts_moved(
    what: &str,
    before: &Counts,
    after: &Counts,
    expected: &[(Counter, u64)],
) {
    let mut want = BTreeMap::new();
    for &(c, n) in expected {
        *want.entry(c).or_insert(0u64) += n;
    }
    let mut wrong = Vec::new();
    for c in Counter::ALL {
        let got = after.delta(before)[c];
        let exp = want.get(&c).copied().unwrap_or(0);
        if got != exp {
            wrong.push(format!("{}: +{got}, expected +{exp}", c.name()));
        }
    }
    assert!(
        wrong.is_empty(),
        "{what}: counters moved wrongly: {}",
        wrong.join("; ")
    );
}

/// The counters every packet moves when pacing is off: packets, bytes and
/// passed_unpaced, plus `classes`.
pub fn unpaced(len: usize, classes: &[Counter]) -> Vec<(Counter, u64)> {
    let mut v = vec![
        (Counter::Packets, 1),
        (Counter::Bytes, len as u64),
        (Counter::WireBytes, len as u64),
        (Counter::PassedUnpaced, 1),
    ];
    v.extend(classes.iter().map(|&c| (c, 1)));
    v
}

/// CLOCK_MONOTONIC in ns, the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime: {}", std::io::Error::last_os_error());
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A config of the *aggregate* pacer at `rate_bytes_per_s` with the
/// default horizon.
pub fn pacing_at(rate_bytes_per_s: u64) -> (PacerConfig, ScaledRate) {
    let rate = ScaledRate::from_bytes_per_s(rate_bytes_per_s).expect("rate in range");
    let mut c = PacerConfig::new(rate_bytes_per_s, rate);
    c.flags &= !shaper_common::config::FLAG_FAIR;
    (c, rate)
}

/// A config of the fair pacer at `rate_bytes_per_s`, every default.
pub fn fair_at(rate_bytes_per_s: u64) -> (PacerConfig, ScaledRate) {
    let rate = ScaledRate::from_bytes_per_s(rate_bytes_per_s).expect("rate in range");
    (PacerConfig::new(rate_bytes_per_s, rate), rate)
}

/// An IPv4/UDP frame of exactly `len` bytes.
pub fn udp_frame(len: usize) -> Vec<u8> {
    let headers = ETH_HLEN + 20 + 8;
    assert!(len >= headers);
    let p = Frame::ipv4(Ipv4::new(Transport::Udp {
        payload_len: len - headers,
    }))
    .build();
    assert_eq!(p.len(), len);
    p.bytes
}
