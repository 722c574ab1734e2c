//! The instruction loop: the eBPF instruction set (RFC 9669) over the
//! model's memory, counting each instruction executed.
//!
//! Invariants: registers are 64-bit; a 32-bit ALU or JMP32 operation reads
//! the low halves and an ALU32 result is zero-extended, as RFC 9669 says;
//! division by zero gives 0 and modulo by zero leaves the dividend, as the
//! kernel's interpreter does. Non-goals: the instructions no classifier
//! uses (legacy packet loads, kfuncs), which stop the run with an error.

use std::rc::Rc;

use aya_obj::generated::bpf_insn;

use super::{FRAME_STACK, MAX_FRAMES, MAX_RUN_INSNS, Region, RunCount, Vm, VmError, skb};

/// Instruction classes (the low three bits of the opcode).
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const ST: u8 = 0x02;
const STX: u8 = 0x03;
const ALU: u8 = 0x04;
const JMP: u8 = 0x05;
const JMP32: u8 = 0x06;
const ALU64: u8 = 0x07;

/// Load and store modes.
const MODE_MEM: u8 = 0x60;
const MODE_MEMSX: u8 = 0x80;
const MODE_ATOMIC: u8 = 0xc0;

/// Atomic operations (the immediate), and the fetch flag.
const FETCH: i32 = 0x01;
const XCHG: i32 = 0xe0 | FETCH;
const CMPXCHG: i32 = 0xf0 | FETCH;

/// `ld_imm64` source kinds: a map by fd, a map value by fd and offset.
const PSEUDO_MAP_FD: u8 = 1;
const PSEUDO_MAP_VALUE: u8 = 2;
/// A call's source kind for a bpf-to-bpf call.
const PSEUDO_CALL: u8 = 1;

/// The access size in bytes of a load or store opcode.
fn size_of(code: u8) -> usize {
    match code & 0x18 {
        0x00 => 4,
        0x08 => 2,
        0x10 => 1,
        _ => 8,
    }
}

/// A caller's state, restored at the callee's exit.
struct Frame {
    ret_pc: usize,
    saved: [u64; 4],
}

impl Vm {
    /// Runs `name` from its first instruction with the context in r1.
    pub(super) fn exec(&mut self, name: &str, count: &mut RunCount) -> Result<i32, VmError> {
        let mut prog_name = name.to_owned();
        let mut prog = self.program(&prog_name)?;
        let mut r = [0u64; 11];
        r[1] = Region::CTX.base();
        r[10] = Region::STACK.base() + FRAME_STACK as u64;
        let mut frames: Vec<Frame> = Vec::new();
        let mut pc = 0usize;
        loop {
            count.insns += 1;
            if count.insns > MAX_RUN_INSNS {
                return Err(VmError::Runaway {
                    prog: prog_name,
                    what: "ran past the instruction limit",
                });
            }
            let Some(insn) = prog.get(pc).copied() else {
                return Err(opcode(&prog_name, pc, 0));
            };
            let (code, dst, src) = (insn.code, insn.dst_reg() as usize, insn.src_reg());
            let (dst, srcr) = (dst.min(10), (src as usize).min(10));
            let off = i64::from(insn.off);
            let imm = i64::from(insn.imm);
            match code & 0x07 {
                LD if code == 0x18 => {
                    let next = prog.get(pc + 1).map_or(0, |n| n.imm);
                    r[dst] = match src {
                        0 => (insn.imm as u32 as u64) | ((next as u32 as u64) << 32),
                        PSEUDO_MAP_FD => Region::HANDLES.base() + insn.imm as u64,
                        PSEUDO_MAP_VALUE => {
                            Region(Region::MAPS + insn.imm as u64).base() + next as u32 as u64
                        }
                        _ => return Err(opcode(&prog_name, pc, code)),
                    };
                    pc += 2;
                    continue;
                }
                LDX if code & 0xe0 == MODE_MEM || code & 0xe0 == MODE_MEMSX => {
                    let len = size_of(code);
                    let addr = r[srcr].wrapping_add(off as u64);
                    let v = self.load(&prog_name, pc, addr, len)?;
                    r[dst] = if code & 0xe0 == MODE_MEMSX {
                        sign_extend(v, len * 8)
                    } else {
                        v
                    };
                }
                ST if code & 0xe0 == MODE_MEM => {
                    let addr = r[dst].wrapping_add(off as u64);
                    self.store(&prog_name, pc, addr, size_of(code), imm as u64)?;
                }
                STX if code & 0xe0 == MODE_MEM => {
                    let addr = r[dst].wrapping_add(off as u64);
                    self.store(&prog_name, pc, addr, size_of(code), r[srcr])?;
                }
                STX if code & 0xe0 == MODE_ATOMIC => {
                    let len = size_of(code);
                    let addr = r[dst].wrapping_add(off as u64);
                    let old = self.load(&prog_name, pc, addr, len)?;
                    let operand = r[srcr];
                    let new = match insn.imm {
                        XCHG => operand,
                        CMPXCHG => {
                            let mask = if len == 8 {
                                u64::MAX
                            } else {
                                u64::from(u32::MAX)
                            };
                            if old & mask == r[0] & mask {
                                operand
                            } else {
                                old
                            }
                        }
                        op => match op & !FETCH {
                            0x00 => old.wrapping_add(operand),
                            0x40 => old | operand,
                            0x50 => old & operand,
                            0xa0 => old ^ operand,
                            _ => return Err(opcode(&prog_name, pc, code)),
                        },
                    };
                    self.store(&prog_name, pc, addr, len, new)?;
                    if insn.imm == CMPXCHG {
                        r[0] = old;
                    } else if insn.imm & FETCH != 0 {
                        r[srcr] = old;
                    }
                }
                ALU | ALU64 => {
                    let wide = code & 0x07 == ALU64;
                    let operand = if code & 0x08 != 0 {
                        r[srcr]
                    } else {
                        imm as u64
                    };
                    r[dst] = alu(code, wide, insn.off, r[dst], operand, insn.imm)
                        .ok_or_else(|| opcode(&prog_name, pc, code))?;
                }
                JMP | JMP32 => {
                    let op = code & 0xf0;
                    match op {
                        0x00 => {
                            let by = if code & 0x07 == JMP32 { imm } else { off };
                            pc = jump(pc, by);
                            continue;
                        }
                        0x80 if code & 0x07 == JMP && src == PSEUDO_CALL => {
                            if frames.len() + 1 >= MAX_FRAMES {
                                return Err(VmError::Runaway {
                                    prog: prog_name,
                                    what: "calls nested past the frame limit",
                                });
                            }
                            frames.push(Frame {
                                ret_pc: pc + 1,
                                saved: [r[6], r[7], r[8], r[9]],
                            });
                            r[10] += FRAME_STACK as u64;
                            pc = jump(pc, imm);
                            continue;
                        }
                        0x80 if code & 0x07 == JMP && src == 0 => {
                            *count.helpers.entry(insn.imm).or_insert(0) += 1;
                            match self.helper(&prog_name, pc, insn.imm, &r)? {
                                super::helpers::Call::Return(v) => r[0] = v,
                                super::helpers::Call::TailCall(target) => {
                                    prog_name = target;
                                    prog = self.program(&prog_name)?;
                                    frames.clear();
                                    r[10] = Region::STACK.base() + FRAME_STACK as u64;
                                    pc = 0;
                                    continue;
                                }
                            }
                        }
                        0x90 if code & 0x07 == JMP => match frames.pop() {
                            // A classifier's verdict is an int: the low half of r0.
                            None => return Ok(r[0] as u32 as i32),
                            Some(f) => {
                                [r[6], r[7], r[8], r[9]] = f.saved;
                                r[10] -= FRAME_STACK as u64;
                                pc = f.ret_pc;
                                continue;
                            }
                        },
                        _ => {
                            let (a, b) = (
                                r[dst],
                                if code & 0x08 != 0 {
                                    r[srcr]
                                } else {
                                    imm as u64
                                },
                            );
                            let taken = if code & 0x07 == JMP32 {
                                compare(op, u64::from(a as u32), u64::from(b as u32), 32)
                            } else {
                                compare(op, a, b, 64)
                            }
                            .ok_or_else(|| opcode(&prog_name, pc, code))?;
                            if taken {
                                pc = jump(pc, off);
                                continue;
                            }
                        }
                    }
                }
                _ => return Err(opcode(&prog_name, pc, code)),
            }
            pc += 1;
        }
    }

    fn program(&self, name: &str) -> Result<Rc<[bpf_insn]>, VmError> {
        self.programs
            .get(name)
            .map(Rc::clone)
            .ok_or_else(|| VmError::Missing {
                kind: "program",
                name: name.to_owned(),
            })
    }

    /// Loads `len` bytes (1, 2, 4 or 8) at `addr`, little-endian. The
    /// context's packet pointers read as the verifier's rewrite makes them.
    pub(super) fn load(
        &self,
        prog: &str,
        pc: usize,
        addr: u64,
        len: usize,
    ) -> Result<u64, VmError> {
        let (region, off) = Region::of(addr);
        if region == Region::CTX {
            match off {
                skb::DATA | skb::DATA_META => return Ok(Region::PACKET.base()),
                skb::DATA_END => return Ok(Region::PACKET.base() + self.packet.len() as u64),
                _ => {}
            }
        }
        let bytes = self.slice(addr, len).ok_or_else(|| VmError::Fault {
            prog: prog.to_owned(),
            pc,
            what: "load",
            addr,
            len,
        })?;
        let mut b = [0u8; 8];
        b[..len].copy_from_slice(bytes);
        Ok(u64::from_le_bytes(b))
    }

    /// Stores the low `len` bytes of `v` at `addr`, little-endian.
    pub(super) fn store(
        &mut self,
        prog: &str,
        pc: usize,
        addr: u64,
        len: usize,
        v: u64,
    ) -> Result<(), VmError> {
        let bytes = self.slice_mut(addr, len).ok_or_else(|| VmError::Fault {
            prog: prog.to_owned(),
            pc,
            what: "store",
            addr,
            len,
        })?;
        bytes.copy_from_slice(&v.to_le_bytes()[..len]);
        Ok(())
    }
}

fn opcode(prog: &str, pc: usize, code: u8) -> VmError {
    VmError::Opcode {
        prog: prog.to_owned(),
        pc,
        code,
    }
}

/// The instruction after `pc` moved by `by`.
fn jump(pc: usize, by: i64) -> usize {
    (pc as i64 + 1 + by) as usize
}

/// `v`'s low `bits` bits, sign-extended.
fn sign_extend(v: u64, bits: usize) -> u64 {
    let shift = 64 - bits as u32;
    (((v << shift) as i64) >> shift) as u64
}

/// One ALU operation; `None` for an opcode the set lacks. `off` selects
/// the signed division and modulo and the sign-extending moves.
fn alu(code: u8, wide: bool, off: i16, a: u64, b: u64, imm: i32) -> Option<u64> {
    let (a32, b32) = (a as u32, b as u32);
    let v = match (code & 0xf0, wide) {
        (0x00, true) => a.wrapping_add(b),
        (0x00, false) => u64::from(a32.wrapping_add(b32)),
        (0x10, true) => a.wrapping_sub(b),
        (0x10, false) => u64::from(a32.wrapping_sub(b32)),
        (0x20, true) => a.wrapping_mul(b),
        (0x20, false) => u64::from(a32.wrapping_mul(b32)),
        (0x30, true) if off == 0 => a.checked_div(b).unwrap_or(0),
        (0x30, true) => (a as i64).checked_div(b as i64).unwrap_or(0) as u64,
        (0x30, false) if off == 0 => u64::from(a32.checked_div(b32).unwrap_or(0)),
        (0x30, false) => u64::from((a32 as i32).checked_div(b32 as i32).unwrap_or(0) as u32),
        (0x40, true) => a | b,
        (0x40, false) => u64::from(a32 | b32),
        (0x50, true) => a & b,
        (0x50, false) => u64::from(a32 & b32),
        (0x60, true) => a << (b & 63),
        (0x60, false) => u64::from(a32 << (b32 & 31)),
        (0x70, true) => a >> (b & 63),
        (0x70, false) => u64::from(a32 >> (b32 & 31)),
        (0x80, true) => a.wrapping_neg(),
        (0x80, false) => u64::from(a32.wrapping_neg()),
        (0x90, true) if off == 0 => a.checked_rem(b).unwrap_or(a),
        (0x90, true) => (a as i64).checked_rem(b as i64).unwrap_or(a as i64) as u64,
        (0x90, false) if off == 0 => u64::from(a32.checked_rem(b32).unwrap_or(a32)),
        (0x90, false) => {
            u64::from((a32 as i32).checked_rem(b32 as i32).unwrap_or(a32 as i32) as u32)
        }
        (0xa0, true) => a ^ b,
        (0xa0, false) => u64::from(a32 ^ b32),
        (0xb0, true) if off == 0 => b,
        (0xb0, true) => sign_extend(b, off as usize),
        (0xb0, false) if off == 0 => u64::from(b32),
        (0xb0, false) => u64::from(sign_extend(b, off as usize) as u32),
        (0xc0, true) => ((a as i64) >> (b & 63)) as u64,
        (0xc0, false) => u64::from(((a32 as i32) >> (b32 & 31)) as u32),
        (0xd0, wide) => {
            let bits = imm as u32;
            let swap = wide || code & 0x08 != 0;
            match (bits, swap) {
                (16, false) => a & 0xffff,
                (32, false) => a & 0xffff_ffff,
                (64, false) => a,
                (16, true) => u64::from((a as u16).swap_bytes()),
                (32, true) => u64::from((a as u32).swap_bytes()),
                (64, true) => a.swap_bytes(),
                _ => return None,
            }
        }
        _ => return None,
    };
    Some(v)
}

/// A conditional jump's test on operands already narrowed to `bits`.
fn compare(op: u8, a: u64, b: u64, bits: usize) -> Option<bool> {
    let (sa, sb) = (sign_extend(a, bits) as i64, sign_extend(b, bits) as i64);
    Some(match op {
        0x10 => a == b,
        0x20 => a > b,
        0x30 => a >= b,
        0x40 => a & b != 0,
        0x50 => a != b,
        0x60 => sa > sb,
        0x70 => sa >= sb,
        0xa0 => a < b,
        0xb0 => a <= b,
        0xc0 => sa < sb,
        0xd0 => sa <= sb,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alu32_results_are_zero_extended_and_division_by_zero_is_defined() {
        // ALU32 add wrapping.
        assert_eq!(alu(0x04, false, 0, u64::MAX, 1, 1), Some(0));
        assert_eq!(alu(0x3c, true, 0, 7, 0, 0), Some(0));
        assert_eq!(alu(0x9c, true, 0, 7, 0, 0), Some(7));
        assert_eq!(alu(0x9c, false, 0, 0xffff_ffff_0000_0007, 0, 0), Some(7));
        // Arithmetic shift keeps the sign.
        assert_eq!(
            alu(0xc7, true, 0, (-8i64) as u64, 1, 1),
            Some((-4i64) as u64)
        );
        // Byte swaps: to big-endian swaps, to little-endian truncates.
        assert_eq!(alu(0xdc, false, 0, 0x1234, 0, 16), Some(0x3412));
        assert_eq!(alu(0xd4, false, 0, 0xabcd_1234, 0, 16), Some(0x1234));
        // Sign-extending move.
        assert_eq!(alu(0xbf, true, 8, 0, 0x80, 0), Some(u64::MAX - 0x7f));
    }

    #[test]
    fn jmp32_compares_the_low_halves_signed_and_unsigned() {
        assert_eq!(compare(0x60, 1, 0xffff_ffff, 32), Some(true));
        assert_eq!(compare(0x20, 1, 0xffff_ffff, 32), Some(false));
        assert_eq!(compare(0x40, 6, 2, 64), Some(true));
        assert_eq!(compare(0xe0, 0, 0, 64), None);
    }
}
