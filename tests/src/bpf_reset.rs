//! Puts a loaded object's maps back into the state a fresh load gives, so
//! the `BPF_PROG_TEST_RUN` tests can share one verified copy of a program
//! per test process. Under emulation the verifier takes seconds per load,
//! and the programs keep every piece of their state in maps, so a reset
//! object is indistinguishable from a new one to a test.
//!
//! What a fresh load gives, per map type, and so what a reset restores:
//! - arrays and per-CPU arrays: every byte zero;
//! - hash maps, plain or LRU: no entries;
//! - ring buffers: nothing unread;
//! - program arrays: what the loader put there (no program can write one),
//!   so they are left alone;
//! - `.rodata`: its constants, frozen at load, so left alone.
//!
//! Any other map type, and a writable data section (`.data`, `.bss`, whose
//! initial contents are not all zero), stops the test with the map's name:
//! such a map needs a rule of its own here before the harness can share
//! the object.
//!
//! The maps are reached by id (`BPF_MAP_GET_FD_BY_ID`, which needs
//! CAP_SYS_ADMIN), so the plan stays valid after the harness has taken the
//! typed maps out of the object. Arrays are zeroed with one
//! `BPF_MAP_UPDATE_BATCH` each (Linux >= 5.6).

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
};

use aya::{
    Ebpf,
    maps::{Map, MapData, RingBuf},
};

/// `enum bpf_cmd` (include/uapi/linux/bpf.h).
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// The element commands' part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    /// `value` or `next_key`.
    value: u64,
    flags: u64,
}

/// The batch commands' part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Issues `bpf(cmd, attr)`.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<()> {
    // SAFETY: `attr` is a valid, writable `repr(C)` prefix of `union
    // bpf_attr` for `cmd`, of the size passed; every pointer inside it
    // points to a live buffer of the size the command reads or writes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// How one map is reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// Every entry zero; `stride` bytes per entry in a batch buffer.
    Zero { stride: usize },
    /// Every key deleted.
    Empty,
    /// Every record read.
    Drain,
    /// Nothing to do: no program writes it.
    Keep,
}

/// One map of the object.
#[derive(Debug, Clone)]
struct MapPlan {
    name: String,
    id: u32,
    key_size: usize,
    value_size: usize,
    max_entries: u32,
    rule: Rule,
}

/// How to reset every map of one loaded object.
#[derive(Debug, Clone)]
pub struct ResetPlan {
    maps: Vec<MapPlan>,
}

/// `value_size` rounded up to 8 bytes, once per possible CPU: the layout
/// per-CPU maps use for a value in user space.
fn per_cpu_stride(value_size: usize) -> usize {
    let cpus = aya::util::nr_cpus().unwrap_or_else(|(what, e)| panic!("{what}: {e}"));
    value_size.div_ceil(8) * 8 * cpus
}

impl ResetPlan {
    /// The plan for every map `ebpf` holds now. Call it before any map is
    /// taken out of the object. Panics on a map it has no rule for.
    pub fn of(ebpf: &Ebpf) -> Self {
        let maps = ebpf
            .maps()
            .map(|(name, map)| {
                let data = match map {
                    Map::Array(d)
                    | Map::PerCpuArray(d)
                    | Map::HashMap(d)
                    | Map::LruHashMap(d)
                    | Map::RingBuf(d)
                    | Map::ProgramArray(d) => d,
                    _ => panic!("the map {name} has a type bpf_reset has no rule for"),
                };
                let info = data
                    .info()
                    .unwrap_or_else(|e| panic!("reading the info of map {name}: {e}"));
                let value_size = info.value_size() as usize;
                let rule = match map {
                    Map::Array(_) if name.starts_with(".rodata") => Rule::Keep,
                    Map::Array(_) if name.starts_with('.') => panic!(
                        "the data section {name} starts with contents a reset cannot know; \
                         give it a rule in bpf_reset"
                    ),
                    Map::Array(_) => Rule::Zero { stride: value_size },
                    Map::PerCpuArray(_) => Rule::Zero {
                        stride: per_cpu_stride(value_size),
                    },
                    Map::HashMap(_) | Map::LruHashMap(_) => Rule::Empty,
                    Map::RingBuf(_) => Rule::Drain,
                    _ => Rule::Keep,
                };
                MapPlan {
                    name: name.to_owned(),
                    id: info.id(),
                    key_size: info.key_size() as usize,
                    value_size,
                    max_entries: info.max_entries(),
                    rule,
                }
            })
            .collect();
        Self { maps }
    }

    /// The id of the map `name`.
    pub fn map_id(&self, name: &str) -> u32 {
        self.maps
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no map {name} in the object"))
            .id
    }

    /// Resets every map by its rule. Panics (naming the map) on failure.
    pub fn reset(&self) {
        for m in &self.maps {
            match m.rule {
                Rule::Zero { stride } => zero_array(m, stride),
                Rule::Empty => empty_hash(m),
                Rule::Drain => drop(drain(&mut ring_by_id(m.id))),
                Rule::Keep => {}
            }
        }
    }

    /// Every entry of every array, as bytes, and each hash map's keys and
    /// values, and each ring buffer's unread record count (reading them),
    /// by map name in name order: what a test compares to tell two loads
    /// apart.
    pub fn contents(&self) -> Vec<(String, Vec<u8>)> {
        let mut out: Vec<(String, Vec<u8>)> = self
            .maps
            .iter()
            .map(|m| {
                let bytes = match m.rule {
                    Rule::Zero { stride } => read_array(m, stride),
                    Rule::Empty => read_hash(m),
                    Rule::Drain => (drain(&mut ring_by_id(m.id)) as u64).to_ne_bytes().to_vec(),
                    Rule::Keep => Vec::new(),
                };
                (m.name.clone(), bytes)
            })
            .collect();
        out.sort();
        out
    }
}

fn open(m: &MapPlan) -> MapData {
    MapData::from_id(m.id).unwrap_or_else(|e| panic!("opening map {} by id: {e}", m.name))
}

/// A consumer of the ring buffer with map id `id`.
pub fn ring_by_id(id: u32) -> RingBuf<MapData> {
    let data = MapData::from_id(id).unwrap_or_else(|e| panic!("opening ring {id} by id: {e}"));
    let map = Map::from_map_data(data).unwrap_or_else(|e| panic!("ring {id}: {e}"));
    RingBuf::try_from(map).unwrap_or_else(|e| panic!("ring {id}: {e}"))
}

/// Reads every unread record; returns how many there were.
fn drain(ring: &mut RingBuf<MapData>) -> usize {
    let mut n = 0;
    while let Some(item) = ring.next() {
        drop(item);
        n += 1;
    }
    n
}

fn zero_array(m: &MapPlan, stride: usize) {
    let data = open(m);
    let keys: Vec<u32> = (0..m.max_entries).collect();
    let values = vec![0u8; stride * m.max_entries as usize];
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: m.max_entries,
        map_fd: fd_of(&data),
        ..BatchAttr::default()
    };
    bpf(BPF_MAP_UPDATE_BATCH, &mut attr).unwrap_or_else(|e| panic!("zeroing map {}: {e}", m.name));
    assert_eq!(attr.count, m.max_entries, "zeroing map {}: partial", m.name);
}

fn read_array(m: &MapPlan, stride: usize) -> Vec<u8> {
    let data = open(m);
    let mut out = vec![0u8; stride * m.max_entries as usize];
    for (key, value) in (0..m.max_entries).zip(out.chunks_mut(stride)) {
        let mut attr = ElemAttr {
            map_fd: fd_of(&data),
            key: &key as *const u32 as u64,
            value: value.as_mut_ptr() as u64,
            ..ElemAttr::default()
        };
        bpf(BPF_MAP_LOOKUP_ELEM, &mut attr)
            .unwrap_or_else(|e| panic!("reading map {} entry {key}: {e}", m.name));
    }
    out
}

/// The map's keys, in the kernel's iteration order.
fn hash_keys(m: &MapPlan, data: &MapData) -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut next = vec![0u8; m.key_size];
        let mut attr = ElemAttr {
            map_fd: fd_of(data),
            key: keys.last().map_or(0, |k| k.as_ptr() as u64),
            value: next.as_mut_ptr() as u64,
            ..ElemAttr::default()
        };
        match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
            Ok(()) => keys.push(next),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return keys,
            Err(e) => panic!("listing the keys of map {}: {e}", m.name),
        }
    }
}

fn empty_hash(m: &MapPlan) {
    let data = open(m);
    for key in hash_keys(m, &data) {
        let mut attr = ElemAttr {
            map_fd: fd_of(&data),
            key: key.as_ptr() as u64,
            ..ElemAttr::default()
        };
        match bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
            Ok(()) => {}
            // An LRU map may have evicted it meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => panic!("deleting from map {}: {e}", m.name),
        }
    }
}

fn read_hash(m: &MapPlan) -> Vec<u8> {
    let data = open(m);
    let mut out = Vec::new();
    for key in hash_keys(m, &data) {
        let mut value = vec![0u8; m.value_size];
        let mut attr = ElemAttr {
            map_fd: fd_of(&data),
            key: key.as_ptr() as u64,
            value: value.as_mut_ptr() as u64,
            ..ElemAttr::default()
        };
        bpf(BPF_MAP_LOOKUP_ELEM, &mut attr)
            .unwrap_or_else(|e| panic!("reading map {}: {e}", m.name));
        out.extend_from_slice(&key);
        out.extend_from_slice(&value);
    }
    out
}

/// The raw descriptor of `data`, for `union bpf_attr`.
fn fd_of(data: &MapData) -> u32 {
    data.fd().as_fd().as_raw_fd() as u32
}
