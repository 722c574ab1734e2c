//! The helpers the classifiers call, modelled on the kernel's
//! (`net/core/filter.c`, `kernel/bpf/helpers.c`): arguments in r1 to r5,
//! the result in r0. Map lookups return pointers into the map's region;
//! the clock is [`Vm::now_ns`]; a ring buffer output succeeds and is
//! counted; a tail call to a filled slot continues in its program.
//!
//! Non-goals: error paths the measured packets do not take (a lookup past
//! an array's end returns null, as the kernel's does, but hash maps are
//! modelled only as far as lookup, update and delete).

use super::{Region, Store, Vm, VmError, skb};

/// A helper's outcome.
pub(super) enum Call {
    /// The value for r0.
    Return(u64),
    /// Continue in this program (a tail call that found its slot filled).
    TailCall(String),
}

/// Helper ids (`include/uapi/linux/bpf.h`, `__BPF_FUNC_MAPPER`).
mod id {
    pub(super) const MAP_LOOKUP_ELEM: i32 = 1;
    pub(super) const MAP_UPDATE_ELEM: i32 = 2;
    pub(super) const MAP_DELETE_ELEM: i32 = 3;
    pub(super) const KTIME_GET_NS: i32 = 5;
    pub(super) const GET_PRANDOM_U32: i32 = 7;
    pub(super) const GET_SMP_PROCESSOR_ID: i32 = 8;
    pub(super) const SKB_STORE_BYTES: i32 = 9;
    pub(super) const TAIL_CALL: i32 = 12;
    pub(super) const SKB_LOAD_BYTES: i32 = 26;
    pub(super) const RINGBUF_OUTPUT: i32 = 130;
    pub(super) const SKB_SET_TSTAMP: i32 = 192;
}

/// Helper `id`'s name without its `bpf_` prefix; "other" for a helper the
/// model does not know.
pub(crate) fn helper_name(id: i32) -> &'static str {
    match id {
        id::MAP_LOOKUP_ELEM => "map_lookup_elem",
        id::MAP_UPDATE_ELEM => "map_update_elem",
        id::MAP_DELETE_ELEM => "map_delete_elem",
        id::KTIME_GET_NS => "ktime_get_ns",
        id::GET_PRANDOM_U32 => "get_prandom_u32",
        id::GET_SMP_PROCESSOR_ID => "get_smp_processor_id",
        id::SKB_STORE_BYTES => "skb_store_bytes",
        id::TAIL_CALL => "tail_call",
        id::SKB_LOAD_BYTES => "skb_load_bytes",
        id::RINGBUF_OUTPUT => "ringbuf_output",
        id::SKB_SET_TSTAMP => "skb_set_tstamp",
        _ => "other",
    }
}

/// `-EFAULT` and `-ENOENT` as a helper returns them.
const EFAULT: u64 = (-14i64) as u64;
const ENOENT: u64 = (-2i64) as u64;

impl Vm {
    /// Calls helper `helper` with the registers `r`.
    pub(super) fn helper(
        &mut self,
        prog: &str,
        pc: usize,
        helper: i32,
        r: &[u64; 11],
    ) -> Result<Call, VmError> {
        let v = match helper {
            id::MAP_LOOKUP_ELEM => self.lookup(prog, pc, r[1], r[2])?,
            id::MAP_UPDATE_ELEM => self.update(prog, pc, r[1], r[2], r[3])?,
            id::MAP_DELETE_ELEM => self.delete(prog, pc, r[1], r[2])?,
            id::KTIME_GET_NS => self.now_ns,
            id::GET_PRANDOM_U32 => {
                // xorshift64: a fixed sequence, so runs repeat exactly.
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                self.rng >> 32
            }
            id::GET_SMP_PROCESSOR_ID => 0,
            id::SKB_LOAD_BYTES => {
                let (off, len) = (r[2] as usize, r[4] as usize);
                match self.packet.get(off..off.saturating_add(len)) {
                    Some(bytes) => {
                        let bytes = bytes.to_vec();
                        self.copy_in(prog, pc, r[3], &bytes)?;
                        0
                    }
                    None => EFAULT,
                }
            }
            id::SKB_STORE_BYTES => {
                let (off, len) = (r[2] as usize, r[4] as usize);
                let bytes = self.copy_out(prog, pc, r[3], len)?;
                match self.packet.get_mut(off..off.saturating_add(len)) {
                    Some(dst) => {
                        dst.copy_from_slice(&bytes);
                        0
                    }
                    None => EFAULT,
                }
            }
            id::SKB_SET_TSTAMP => {
                let at = Region::CTX.base() + skb::TSTAMP as u64;
                self.store(prog, pc, at, 8, r[2])?;
                0
            }
            id::RINGBUF_OUTPUT => {
                self.copy_out(prog, pc, r[2], r[3] as usize)?;
                0
            }
            id::TAIL_CALL => {
                let target = self
                    .map(prog, pc, r[2])
                    .ok()
                    .and_then(|(_, m)| match &m.store {
                        Store::Programs(slots) => {
                            slots.get(r[3] as u32 as usize).cloned().flatten()
                        }
                        _ => None,
                    });
                match target {
                    Some(t) => return Ok(Call::TailCall(t)),
                    None => ENOENT,
                }
            }
            id => {
                return Err(VmError::Helper {
                    prog: prog.to_owned(),
                    pc,
                    id,
                });
            }
        };
        Ok(Call::Return(v))
    }

    /// The map behind `handle`, with its index.
    fn map(&self, prog: &str, pc: usize, handle: u64) -> Result<(usize, &super::MapMem), VmError> {
        let (region, i) = Region::of(handle);
        match self.maps.get(i) {
            Some(m) if region == Region::HANDLES => Ok((i, m)),
            _ => Err(VmError::Fault {
                prog: prog.to_owned(),
                pc,
                what: "map handle",
                addr: handle,
                len: 0,
            }),
        }
    }

    /// The map behind `handle` (its index) and the key at `key`, read at
    /// the map's key size.
    fn map_and_key(
        &self,
        prog: &str,
        pc: usize,
        handle: u64,
        key: u64,
    ) -> Result<(usize, Vec<u8>), VmError> {
        let (i, m) = self.map(prog, pc, handle)?;
        Ok((i, self.copy_out(prog, pc, key, m.key_size)?))
    }

    fn lookup(&mut self, prog: &str, pc: usize, handle: u64, key: u64) -> Result<u64, VmError> {
        let (i, key) = self.map_and_key(prog, pc, handle, key)?;
        let m = &self.maps[i];
        let slot = match &m.store {
            Store::Array => array_slot(&key, m.max_entries),
            Store::Hash(slots) => slots.get(&key).copied(),
            Store::Programs(_) | Store::Ring => None,
        };
        let base = Region(Region::MAPS + i as u64).base();
        Ok(slot.map_or(0, |s| base + (s * m.value_size) as u64))
    }

    fn update(
        &mut self,
        prog: &str,
        pc: usize,
        handle: u64,
        key: u64,
        value: u64,
    ) -> Result<u64, VmError> {
        let (i, key) = self.map_and_key(prog, pc, handle, key)?;
        let value = self.copy_out(prog, pc, value, self.maps[i].value_size)?;
        let map = &mut self.maps[i];
        let slot = match &mut map.store {
            Store::Array => array_slot(&key, map.max_entries),
            Store::Hash(slots) => {
                let next = slots.len();
                match slots.get(&key) {
                    Some(s) => Some(*s),
                    None if next < map.max_entries => {
                        slots.insert(key, next);
                        Some(next)
                    }
                    None => None,
                }
            }
            Store::Programs(_) | Store::Ring => None,
        };
        let Some(s) = slot else {
            return Ok(EFAULT);
        };
        let at = s * map.value_size;
        map.values[at..at + value.len()].copy_from_slice(&value);
        Ok(0)
    }

    fn delete(&mut self, prog: &str, pc: usize, handle: u64, key: u64) -> Result<u64, VmError> {
        let (i, key) = self.map_and_key(prog, pc, handle, key)?;
        Ok(match &mut self.maps[i].store {
            // A slot is not reused: the model's maps outlive no run long
            // enough to fill up.
            Store::Hash(slots) => slots.remove(&key).map_or(ENOENT, |_| 0),
            _ => ENOENT,
        })
    }

    /// `len` bytes read from the program's memory at `addr`.
    fn copy_out(&self, prog: &str, pc: usize, addr: u64, len: usize) -> Result<Vec<u8>, VmError> {
        self.slice(addr, len)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| VmError::Fault {
                prog: prog.to_owned(),
                pc,
                what: "helper read",
                addr,
                len,
            })
    }

    /// Writes `bytes` into the program's memory at `addr`.
    fn copy_in(&mut self, prog: &str, pc: usize, addr: u64, bytes: &[u8]) -> Result<(), VmError> {
        let dst = self
            .slice_mut(addr, bytes.len())
            .ok_or_else(|| VmError::Fault {
                prog: prog.to_owned(),
                pc,
                what: "helper write",
                addr,
                len: bytes.len(),
            })?;
        dst.copy_from_slice(bytes);
        Ok(())
    }
}

/// An array's slot for `key` (a `u32` index), if below `entries`.
fn array_slot(key: &[u8], entries: usize) -> Option<usize> {
    let mut b = [0u8; 4];
    let n = key.len().min(4);
    b[..n].copy_from_slice(&key[..n]);
    Some(u32::from_le_bytes(b) as usize).filter(|s| *s < entries)
}
