//! A counting interpreter for the object's BPF byte code: how many BPF
//! instructions and helper calls a packet costs on each path, exactly and
//! on any machine, where the kernel offers no instruction count (no PMU in
//! a guest) and may refuse the fentry counters (`calls`).
//!
//! What it runs: the object's instructions as the loader links them
//! (`aya_obj`: map references and calls relocated, the `.text` functions
//! appended), before the verifier's rewrites. Those rewrites inline array
//! lookups and widen context reads, so the kernel's translated program is
//! somewhat longer; the count is the program's own work, the figure to
//! compare between builds and paths.
//!
//! Model:
//! - memory is a set of regions (the stack frames, the `__sk_buff`, the
//!   packet, one per map), each addressed as `(region + 1) << REGION_SHIFT`
//!   plus an offset; every access is bounds-checked, and an access outside
//!   a region is an error, as the verifier would have refused it;
//! - the context's `data`, `data_end` and `data_meta` read as pointers into
//!   the packet region, as the verifier's rewrite makes them;
//! - one CPU: a per-CPU map is an array;
//! - the clock is the caller's ([`Vm::now_ns`]), the random numbers a fixed
//!   xorshift sequence, so a run is reproducible;
//! - a tail call continues in the target program and its instructions count
//!   towards the packet, as they run on the packet's CPU time.
//!
//! Units: instructions (a 16-byte `ld_imm64` is one), calls.
//!
//! Non-goals: timing, the verifier's checks (the programs are the ones the
//! kernel accepts), helpers the classifiers do not call on the measured
//! paths (an error names the helper), and any program type but `sched_cls`.

mod exec;
mod helpers;

pub(crate) use helpers::helper_name;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    rc::Rc,
};

use aya_obj::{Object, generated::bpf_insn};

/// A region's address bits: 2^36 bytes per region.
const REGION_SHIFT: u32 = 36;
/// Stack bytes per frame (the kernel's `MAX_BPF_STACK`).
const FRAME_STACK: usize = 512;
/// Nested bpf-to-bpf calls (the kernel's `MAX_CALL_FRAMES`).
const MAX_FRAMES: usize = 8;
/// Instructions one run may execute before it is stopped as a runaway.
const MAX_RUN_INSNS: u64 = 1_000_000;
/// `sizeof(struct __sk_buff)`.
const SKB_SIZE: usize = 192;

/// `__sk_buff` offsets the model reads or writes (`include/uapi/linux/bpf.h`).
mod skb {
    pub(super) const LEN: usize = 0;
    pub(super) const PROTOCOL: usize = 16;
    pub(super) const IFINDEX: usize = 40;
    pub(super) const DATA: usize = 76;
    pub(super) const DATA_END: usize = 80;
    pub(super) const DATA_META: usize = 140;
    pub(super) const TSTAMP: usize = 152;
}

/// The fixed regions; maps follow from [`Region::MAPS`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Region(u64);

impl Region {
    const STACK: Region = Region(0);
    const CTX: Region = Region(1);
    const PACKET: Region = Region(2);
    const MAPS: u64 = 3;
    /// Map handles (what an `ld_imm64` of a map gives): never dereferenced.
    const HANDLES: Region = Region((1 << (64 - REGION_SHIFT)) - 2);

    fn base(self) -> u64 {
        (self.0 + 1) << REGION_SHIFT
    }

    fn of(addr: u64) -> (Region, usize) {
        let region = (addr >> REGION_SHIFT).wrapping_sub(1);
        (Region(region), (addr & ((1 << REGION_SHIFT) - 1)) as usize)
    }
}

/// Why a program could not be set up or run.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// The embedded object does not parse.
    #[error("parsing the BPF object")]
    Parse(#[source] aya_obj::ParseError),
    /// Its relocations fail.
    #[error("linking the BPF object")]
    Link(#[source] aya_obj::relocation::EbpfRelocationError),
    /// No such program or map.
    #[error("the BPF object has no {kind} {name}")]
    Missing {
        /// "program" or "map".
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// A map value of the wrong size.
    #[error("map {map}: a value of {got} bytes where the map holds {want}")]
    ValueSize {
        /// The map.
        map: String,
        /// Bytes given.
        got: usize,
        /// The map's value size.
        want: usize,
    },
    /// An index past an array's end.
    #[error("map {map}: index {index} is past its {entries} entries")]
    Index {
        /// The map.
        map: String,
        /// The index.
        index: u32,
        /// The map's entries.
        entries: usize,
    },
    /// An access outside every region.
    #[error("{prog}, instruction {pc}: {what} of {len} bytes at {addr:#x} is outside memory")]
    Fault {
        /// The running program.
        prog: String,
        /// Its instruction index.
        pc: usize,
        /// "load" or "store".
        what: &'static str,
        /// The address.
        addr: u64,
        /// The access's size.
        len: usize,
    },
    /// An instruction the model does not know.
    #[error("{prog}, instruction {pc}: unsupported opcode {code:#04x}")]
    Opcode {
        /// The running program.
        prog: String,
        /// Its instruction index.
        pc: usize,
        /// The opcode.
        code: u8,
    },
    /// A helper the model does not implement.
    #[error("{prog}, instruction {pc}: helper {id} is not modelled")]
    Helper {
        /// The running program.
        prog: String,
        /// Its instruction index.
        pc: usize,
        /// The helper's id.
        id: i32,
    },
    /// A run past [`MAX_RUN_INSNS`], or calls nested past [`MAX_FRAMES`].
    #[error("{prog}: {what}")]
    Runaway {
        /// The running program.
        prog: String,
        /// What ran away.
        what: &'static str,
    },
}

/// What a map holds in the model.
#[derive(Debug)]
enum Store {
    /// An array (per-CPU ones too): `max_entries` values back to back.
    Array,
    /// A hash map: keys to value slots.
    Hash(HashMap<Vec<u8>, usize>),
    /// A program array: slots to program names.
    Programs(Vec<Option<String>>),
    /// A ring buffer: output is counted, not kept.
    Ring,
}

/// One map's memory.
#[derive(Debug)]
struct MapMem {
    name: String,
    key_size: usize,
    value_size: usize,
    max_entries: usize,
    store: Store,
    values: Vec<u8>,
}

/// What one program run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunCount {
    /// BPF instructions executed, tail-called programs included.
    pub insns: u64,
    /// Helper calls by helper id.
    pub helpers: BTreeMap<i32, u64>,
    /// The program's return value (an `int`, the low half of r0).
    pub ret: i32,
}

/// The object's programs and maps, ready to run packets.
pub struct Vm {
    /// Shared, so that a run holds its program while it changes the maps.
    programs: HashMap<String, Rc<[bpf_insn]>>,
    maps: Vec<MapMem>,
    /// The clock `bpf_ktime_get_ns` reads.
    pub now_ns: u64,
    rng: u64,
    stack: Vec<u8>,
    ctx: Vec<u8>,
    packet: Vec<u8>,
}

impl Vm {
    /// Links `object` with the map sizes in `sizes` (name, max entries)
    /// overriding the object's; every map starts zeroed.
    pub fn new(object: &[u8], sizes: &[(&str, u32)]) -> Result<Self, VmError> {
        let mut obj = Object::parse(object).map_err(VmError::Parse)?;
        // The maps in name order; a map's position is its fd in the
        // relocated code and its region.
        let mut defs: Vec<(String, aya_obj::Map)> = obj
            .maps
            .iter()
            .map(|(n, m)| (n.clone(), m.clone()))
            .collect();
        defs.sort_by(|a, b| a.0.cmp(&b.0));
        let maps = defs
            .iter()
            .map(|(name, m)| {
                let max_entries = sizes
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or(m.max_entries(), |(_, e)| *e)
                    as usize;
                let value_size = m.value_size() as usize;
                let store = match m.map_type() {
                    1 | 5 | 9 | 10 => Store::Hash(HashMap::new()),
                    3 => Store::Programs(vec![None; max_entries]),
                    27 => Store::Ring,
                    _ => Store::Array,
                };
                let values = match store {
                    Store::Array | Store::Hash(_) => vec![0; value_size * max_entries],
                    Store::Programs(_) | Store::Ring => Vec::new(),
                };
                MapMem {
                    name: name.clone(),
                    key_size: m.key_size() as usize,
                    value_size,
                    max_entries,
                    store,
                    values,
                }
            })
            .collect();
        let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
        obj.relocate_maps(
            defs.iter()
                .enumerate()
                .map(|(fd, (n, m))| (n.as_str(), fd as i32, m)),
            &text_sections,
        )
        .map_err(VmError::Link)?;
        obj.relocate_calls(&text_sections).map_err(VmError::Link)?;
        let programs = obj
            .programs
            .iter()
            .filter_map(|(name, p)| {
                obj.functions
                    .get(&p.function_key())
                    .map(|f| (name.clone(), Rc::from(f.instructions.as_slice())))
            })
            .collect();
        Ok(Self {
            programs,
            maps,
            now_ns: 0,
            rng: 0x2545_F491_4F6C_DD1D,
            stack: vec![0; FRAME_STACK * MAX_FRAMES],
            ctx: vec![0; SKB_SIZE],
            packet: Vec::new(),
        })
    }

    fn map_index(&self, name: &str) -> Result<usize, VmError> {
        self.maps
            .iter()
            .position(|m| m.name == name)
            .ok_or_else(|| VmError::Missing {
                kind: "map",
                name: name.to_owned(),
            })
    }

    /// Writes `value` at array index `index` of map `name`.
    pub fn set(&mut self, name: &str, index: u32, value: &[u8]) -> Result<(), VmError> {
        let i = self.map_index(name)?;
        let m = &mut self.maps[i];
        if value.len() != m.value_size {
            return Err(VmError::ValueSize {
                map: name.to_owned(),
                got: value.len(),
                want: m.value_size,
            });
        }
        if index as usize >= m.max_entries {
            return Err(VmError::Index {
                map: name.to_owned(),
                index,
                entries: m.max_entries,
            });
        }
        let at = index as usize * m.value_size;
        m.values[at..at + value.len()].copy_from_slice(value);
        Ok(())
    }

    /// The value at array index `index` of map `name`.
    pub fn get(&self, name: &str, index: u32) -> Result<&[u8], VmError> {
        let m = &self.maps[self.map_index(name)?];
        let at = index as usize * m.value_size;
        m.values
            .get(at..at + m.value_size)
            .ok_or_else(|| VmError::Index {
                map: name.to_owned(),
                index,
                entries: m.max_entries,
            })
    }

    /// Points slot `index` of program array `name` at program `prog`.
    pub fn set_program(&mut self, name: &str, index: u32, prog: &str) -> Result<(), VmError> {
        if !self.programs.contains_key(prog) {
            return Err(VmError::Missing {
                kind: "program",
                name: prog.to_owned(),
            });
        }
        let i = self.map_index(name)?;
        match &mut self.maps[i].store {
            Store::Programs(slots) if (index as usize) < slots.len() => {
                slots[index as usize] = Some(prog.to_owned());
                Ok(())
            }
            _ => Err(VmError::Missing {
                kind: "program array",
                name: name.to_owned(),
            }),
        }
    }

    /// Runs `prog` on the Ethernet frame `frame` as `BPF_PROG_TEST_RUN`
    /// does with no context given (`len`, `protocol`, `ifindex` 1, the rest
    /// zero), and returns what it executed.
    pub fn run(&mut self, prog: &str, frame: &[u8]) -> Result<RunCount, VmError> {
        self.packet = frame.to_vec();
        self.ctx.fill(0);
        let put =
            |ctx: &mut [u8], at: usize, v: u32| ctx[at..at + 4].copy_from_slice(&v.to_le_bytes());
        put(&mut self.ctx, skb::LEN, frame.len() as u32);
        // The ethertype as the kernel stores it: network order in memory.
        let proto = frame
            .get(12..14)
            .map_or(0, |b| u32::from(u16::from_ne_bytes([b[0], b[1]])));
        put(&mut self.ctx, skb::PROTOCOL, proto);
        put(&mut self.ctx, skb::IFINDEX, 1);
        let mut count = RunCount::default();
        count.ret = self.exec(prog, &mut count)?;
        Ok(count)
    }

    /// The `__sk_buff`'s `tstamp` after the last run.
    #[cfg(test)]
    pub fn tstamp(&self) -> u64 {
        let at = Region::CTX.base() + skb::TSTAMP as u64;
        self.load("", 0, at, 8).unwrap_or(0)
    }

    /// The bytes at `addr` (`len` of them), for reading.
    fn slice(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let (region, off) = Region::of(addr);
        let mem: &[u8] = match region {
            Region::STACK => &self.stack,
            Region::CTX => &self.ctx,
            Region::PACKET => &self.packet,
            Region(r) => {
                &self
                    .maps
                    .get((r.checked_sub(Region::MAPS)?) as usize)?
                    .values
            }
        };
        mem.get(off..off.checked_add(len)?)
    }

    /// The bytes at `addr` (`len` of them), for writing.
    fn slice_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let (region, off) = Region::of(addr);
        let mem: &mut [u8] = match region {
            Region::STACK => &mut self.stack,
            Region::CTX => &mut self.ctx,
            Region::PACKET => &mut self.packet,
            Region(r) => {
                &mut self
                    .maps
                    .get_mut((r.checked_sub(Region::MAPS)?) as usize)?
                    .values
            }
        };
        mem.get_mut(off..off.checked_add(len)?)
    }
}

/// A map value's bytes, as the map syscall hands them to the kernel.
pub fn pod_bytes<T: aya::Pod>(value: &T) -> Vec<u8> {
    // SAFETY: `Pod` types are plain `repr(C)` data without padding, whose
    // bytes are exactly what a map write copies into the kernel; the slice
    // covers the value and lives no longer than the borrow.
    unsafe {
        std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>())
    }
    .to_vec()
}
