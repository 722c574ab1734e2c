//! The object the host part measures, loaded once: the egress classifier
//! (the flow pacer, and the pacer over hosts without and with the NAT
//! lookup), the passthrough and the policer as program descriptors for
//! `BPF_PROG_TEST_RUN`, and the maps a path sets up before it runs (see
//! `host` for the method). `prepare` puts every map in the state a path
//! starts from: the fair pacer's defaults at a chosen rate with a fixed hash
//! seed, the fair share frozen at 1.0, the virtual link, the aggregate
//! clock and the flow table empty.
//!
//! Non-goals: measuring; `host` times the calls.

use std::{
    collections::BTreeMap,
    os::fd::{AsFd, BorrowedFd},
};

use aya::{
    Ebpf,
    maps::{Array, MapData, MapError, PerCpuArray},
    programs::ProgramFd,
};
use shaper_common::{
    CLOCK_PROGRAM, EGRESS_HOSTS_NAT_PROGRAM, EGRESS_HOSTS_PROGRAM, EGRESS_PROGRAM,
    PASSTHROUGH_PROGRAM, POLICE_PROGRAM, TELEMETRY_PROGRAM,
    config::{AggregateState, PacerConfig},
    fair::FairState,
    flow::FlowSet,
    maps,
    police::LinkState,
    rate::ScaledRate,
};

use super::calls::{CallsError, Counters, Totals};
use crate::{
    bpf::{
        self,
        test_run::{TestRunError, run_skb},
    },
    checks::CheckError,
    counters::CounterSnapshot,
};

/// Hash seed of every run, so flows land in the same sets each time.
const HASH_SEED: u64 = 0x5EED_BE4C_0000_0001;

/// An epoch the clock never reaches (`now >> 23` passes 2^32 only after
/// about a century of uptime): written into `SHAPER_FAIR` so no packet rolls
/// the epoch and the fair share stays at 1.0.
const FROZEN_EPOCH: u64 = 1 << 48;

/// Why the host benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Missing privileges.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// Loading the object or a program failed, or the object is missing.
    #[error(transparent)]
    Bpf(#[from] bpf::load::LoadError),
    /// Reading the counters failed.
    #[error(transparent)]
    Counters(#[from] crate::counters::CounterError),
    /// A map operation failed.
    #[error("{op} {map} failed")]
    Map {
        /// The map's name.
        map: &'static str,
        /// What was done.
        op: &'static str,
        /// aya's error.
        #[source]
        source: MapError,
    },
    /// A test run failed.
    #[error("test run of {prog} failed")]
    TestRun {
        /// The program.
        prog: &'static str,
        /// Why.
        #[source]
        source: TestRunError,
    },
    /// An option is out of range.
    #[error("invalid benchmark option: {0}")]
    Invalid(String),
    /// The kernel cannot create a qdisc the lab part builds on.
    #[error(
        "this kernel has no '{kind}' qdisc, which the bench's lab part needs: run the lab part \
         in the VM (`cargo xtask bench` boots a kernel that has it)"
    )]
    MissingQdisc {
        /// The qdisc kind.
        kind: &'static str,
    },
    /// The interpreter could not count a path.
    #[error("counting instructions in the interpreter")]
    Interpreter(#[from] super::bpfvm::VmError),
    /// Counting helper calls failed.
    #[error("counting helper calls")]
    Calls(#[from] CallsError),
    /// A measuring thread could not be pinned to its CPU.
    #[error("pinning a measuring thread to CPU {cpu}")]
    Pin {
        /// The CPU.
        cpu: usize,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
    /// A measuring thread panicked.
    #[error("a measuring thread panicked")]
    ThreadPanicked,
}

/// Counter totals of one moment.
pub(super) type Counts = CounterSnapshot;

/// Which of the object's classifiers a call runs.
#[derive(Clone, Copy)]
pub(super) enum Prog {
    Egress,
    /// The pacer over hosts.
    Hosts,
    /// The pacer over hosts through NAT.
    HostsNat,
    Pass,
    /// The clock read alone.
    Clock,
    Police,
}

/// The configuration a path starts from: the fair pacer's defaults at
/// `rate_bytes_per_s` with a fixed hash seed, a flow table of `sets`
/// sets, then `tweak`.
pub(super) fn start_config(
    rate_bytes_per_s: u64,
    sets: u32,
    tweak: impl FnOnce(&mut PacerConfig),
) -> Result<PacerConfig, BenchError> {
    let rate = ScaledRate::from_bytes_per_s(rate_bytes_per_s).ok_or_else(|| {
        BenchError::Invalid(format!("rate {rate_bytes_per_s} B/s is out of range"))
    })?;
    let mut c = PacerConfig::new(rate_bytes_per_s, rate);
    c.hash_seed = HASH_SEED;
    c.flow_sets_mask = sets - 1;
    tweak(&mut c);
    Ok(c)
}

/// The fair share frozen at 1.0. The epoch lies in the future: no share
/// update runs. The join reference is out of reach: with no epoch change it
/// is never refreshed, and every real epoch would otherwise count each flow
/// as newly backlogged and shrink the share (`join_mult`). The counting
/// itself still runs, so its cost is measured.
pub(super) fn frozen_fair() -> FairState {
    FairState {
        epoch: FROZEN_EPOCH,
        backlogged_ref_q8: u64::MAX >> 9,
        ..FairState::default()
    }
}

/// The link-wide clocks: the aggregate pacer's at `t_next_free_ns`, and
/// the fair pacer's link clock (`shaper_common::link`) with its front out
/// of reach. Every path gives the link far more than its rate, the share
/// frozen at 1.0 among thousands of flows, and the link's clock would hold
/// most packets back; with the front's lead spanning every charge, the
/// measured path is that of a link within its rate (the charge and the
/// front's read run, the hold does not).
pub(super) fn frozen_link(t_next_free_ns: u64) -> AggregateState {
    AggregateState {
        t_next_free_ns,
        link_front_ns: u64::MAX >> 1,
        ..AggregateState::default()
    }
}

/// The loaded object and its maps.
pub(super) struct Bench {
    ebpf: Ebpf,
    /// The helper-call counters, while attached.
    calls: Option<Counters>,
    egress: ProgramFd,
    hosts: ProgramFd,
    hosts_nat: ProgramFd,
    pass: ProgramFd,
    clock: ProgramFd,
    police: ProgramFd,
    police_link: Array<MapData, LinkState>,
    aggregate: Array<MapData, AggregateState>,
    config: Array<MapData, PacerConfig>,
    counters: PerCpuArray<MapData, u64>,
    fair: Array<MapData, FairState>,
    flows: Array<MapData, FlowSet>,
    pub(super) sets: u32,
}

impl Bench {
    pub(super) fn load(sets: u32) -> Result<Self, BenchError> {
        let mut ebpf = bpf::load::open(sets, &[])?;
        let egress = bpf::load::program_fd(&mut ebpf, EGRESS_PROGRAM)?;
        let hosts = bpf::load::program_fd(&mut ebpf, EGRESS_HOSTS_PROGRAM)?;
        let hosts_nat = bpf::load::program_fd(&mut ebpf, EGRESS_HOSTS_NAT_PROGRAM)?;
        let pass = bpf::load::program_fd(&mut ebpf, PASSTHROUGH_PROGRAM)?;
        let clock = bpf::load::program_fd(&mut ebpf, CLOCK_PROGRAM)?;
        let police = bpf::load::program_fd(&mut ebpf, POLICE_PROGRAM)?;
        bpf::load::load_telemetry(&mut ebpf)?;
        Ok(Self {
            config: bpf::load::take(&mut ebpf, maps::CONFIG)?,
            counters: bpf::load::take(&mut ebpf, maps::COUNTERS)?,
            fair: bpf::load::take(&mut ebpf, maps::FAIR)?,
            flows: bpf::load::take(&mut ebpf, maps::FLOWS)?,
            police_link: bpf::load::take(&mut ebpf, maps::POLICE_LINK)?,
            aggregate: bpf::load::take(&mut ebpf, maps::AGGREGATE)?,
            ebpf,
            calls: None,
            egress,
            hosts,
            hosts_nat,
            pass,
            clock,
            police,
            sets,
        })
    }

    /// Configures the fair pacer at `rate` (defaults, then `tweak`), freezes
    /// the fair share at 1.0 and empties the flow table.
    pub(super) fn prepare(
        &mut self,
        rate_bytes_per_s: u64,
        tweak: impl FnOnce(&mut PacerConfig),
    ) -> Result<(), BenchError> {
        self.configure(rate_bytes_per_s, tweak)?;
        let fair = frozen_fair();
        write0(&mut self.fair, maps::FAIR, fair)?;
        self.set_aggregate_clock(0)?;
        write0(
            &mut self.police_link,
            maps::POLICE_LINK,
            LinkState::default(),
        )?;
        for i in 0..self.sets {
            self.flows
                .set(i, FlowSet::default(), 0)
                .map_err(|source| BenchError::Map {
                    map: maps::FLOWS,
                    op: "clearing",
                    source,
                })?;
        }
        Ok(())
    }

    /// Writes the configuration alone: the fair pacer's defaults at `rate`,
    /// then `tweak`. The flow table and the shared state stay as they are.
    pub(super) fn configure(
        &mut self,
        rate_bytes_per_s: u64,
        tweak: impl FnOnce(&mut PacerConfig),
    ) -> Result<(), BenchError> {
        let c = start_config(rate_bytes_per_s, self.sets, tweak)?;
        write0(&mut self.config, maps::CONFIG, c)
    }

    /// Sets the aggregate pacer's clock, and the link's as [`frozen_link`].
    pub(super) fn set_aggregate_clock(&mut self, t_next_free_ns: u64) -> Result<(), BenchError> {
        write0(
            &mut self.aggregate,
            maps::AGGREGATE,
            frozen_link(t_next_free_ns),
        )
    }

    pub(super) fn counts(&self) -> Result<Counts, BenchError> {
        Ok(CounterSnapshot::read(&self.counters)?)
    }

    /// Attaches the helper-call counters (`calls`); until
    /// [`Self::detach_calls`], calls are counted and their timing is not
    /// the classifier's alone.
    pub(super) fn attach_calls(&mut self) -> Result<(), BenchError> {
        if self.calls.is_none() {
            self.calls = Some(Counters::attach(&mut self.ebpf)?);
        }
        Ok(())
    }

    /// Detaches the helper-call counters.
    pub(super) fn detach_calls(&mut self) {
        if let Some(c) = self.calls.take() {
            c.detach(&mut self.ebpf);
        }
    }

    /// Helper calls so far, when the counters are attached.
    pub(super) fn helper_totals(&self) -> Result<Option<Totals>, BenchError> {
        match &self.calls {
            Some(c) => Ok(Some(c.totals()?)),
            None => Ok(None),
        }
    }

    /// Instructions of each classifier after the verifier's rewrites
    /// (`xlated`), and the instructions the verifier processed to accept it.
    pub(super) fn program_sizes(&mut self) -> BTreeMap<&'static str, ProgramSize> {
        let mut sizes = BTreeMap::new();
        for name in [
            EGRESS_PROGRAM,
            EGRESS_HOSTS_PROGRAM,
            EGRESS_HOSTS_NAT_PROGRAM,
            POLICE_PROGRAM,
            TELEMETRY_PROGRAM,
        ] {
            let Ok(prog) = bpf::load::classifier(&mut self.ebpf, name) else {
                continue;
            };
            match prog.info() {
                Ok(info) => {
                    sizes.insert(
                        name,
                        ProgramSize {
                            xlated_insns: info.size_translated().map(|b| b / 8),
                            verified_insns: info.verified_instruction_count(),
                        },
                    );
                }
                Err(e) => tracing::warn!(program = name, error = %e, "reading program info"),
            }
        }
        sizes
    }

    /// The descriptor `BPF_PROG_TEST_RUN` runs `prog` by, for threads of
    /// their own.
    pub(super) fn fd(&self, prog: Prog) -> BorrowedFd<'_> {
        match prog {
            Prog::Egress => self.egress.as_fd(),
            Prog::Hosts => self.hosts.as_fd(),
            Prog::HostsNat => self.hosts_nat.as_fd(),
            Prog::Pass => self.pass.as_fd(),
            Prog::Clock => self.clock.as_fd(),
            Prog::Police => self.police.as_fd(),
        }
    }

    /// Runs `frame` `repeat` times; the call's total kernel-measured ns.
    pub(super) fn call(&self, prog: Prog, frame: &[u8], repeat: u32) -> Result<f64, BenchError> {
        call_on(self.fd(prog), prog, frame, repeat)
    }
}

/// Runs `frame` `repeat` times through `prog`, whose descriptor `fd` is
/// ([`Bench::fd`], on any thread); the call's total kernel-measured ns.
pub(super) fn call_on(
    fd: BorrowedFd<'_>,
    prog: Prog,
    frame: &[u8],
    repeat: u32,
) -> Result<f64, BenchError> {
    let name = match prog {
        Prog::Egress => EGRESS_PROGRAM,
        Prog::Hosts => EGRESS_HOSTS_PROGRAM,
        Prog::HostsNat => EGRESS_HOSTS_NAT_PROGRAM,
        Prog::Pass => PASSTHROUGH_PROGRAM,
        Prog::Clock => CLOCK_PROGRAM,
        Prog::Police => POLICE_PROGRAM,
    };
    let out = run_skb(fd, frame, None, repeat)
        .map_err(|source| BenchError::TestRun { prog: name, source })?;
    Ok(f64::from(out.duration_ns) * f64::from(repeat.max(1)))
}

/// A loaded program's size.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct ProgramSize {
    /// Instructions after the verifier's rewrites (inlined map lookups
    /// included); `None` where the kernel does not report it.
    pub xlated_insns: Option<u32>,
    /// Instructions the verifier processed, against its limit of one
    /// million; `None` before Linux 5.16.
    pub verified_insns: Option<u32>,
}

/// Writes entry 0 of the one-entry array `map`.
fn write0<T: aya::Pod>(
    array: &mut Array<MapData, T>,
    map: &'static str,
    value: T,
) -> Result<(), BenchError> {
    array.set(0, value, 0).map_err(|source| BenchError::Map {
        map,
        op: "writing",
        source,
    })
}
