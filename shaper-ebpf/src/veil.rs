//! Values hidden from the verifier. The verifier walks a program once per
//! distinct state it can reach, and two states that differ in a value it
//! knows (a bound learnt at a branch, a constant) do not merge. Where a
//! value's bounds do not matter for safety but multiply the states that
//! follow (each header shape out of the parse, each way of a flow set,
//! each pass of the epoch roll's loop), XORing it with a zero the verifier
//! cannot see leaves it an unknown scalar, and the states merge.
//!
//! The XOR stays where it is written: it is one instruction of inline
//! assembly, which the compiler neither folds nor merges (LLVM never puts
//! an inline assembly operand behind a φ). A plain XOR would not stay: the
//! compiler may fold the XORs of two paths that meet into one after the
//! meeting point (`φ(a ^ z, b ^ z)` becomes `φ(a, b) ^ z`), so at the
//! meeting point, where the verifier compares states, the values would
//! still be the ones it knows apart. The veil costs that one instruction
//! and no verifier state; a `black_box` barrier around a plain XOR did the
//! same with a spill and a fill of the value besides.
//!
//! Invariant: the zero is the XOR of one map field read twice, a field
//! that never changes while the programs are attached, so a veiled value
//! is the value itself at run time.

use shaper_common::config::PacerConfig;

/// A zero the verifier cannot see (see the module header).
#[derive(Clone, Copy)]
pub(crate) struct Veil(u64);

impl Veil {
    /// The zero, from `config`'s hash seed.
    #[inline(always)]
    pub(crate) fn new(config: &PacerConfig) -> Self {
        // SAFETY: reads of a field of the map value the caller looked up.
        let (a, b) = unsafe {
            (
                core::ptr::read_volatile(&raw const config.hash_seed),
                core::ptr::read_volatile(&raw const config.hash_seed),
            )
        };
        Veil(a ^ b)
    }

    /// `x`, veiled; likewise for the narrower types below.
    #[inline(always)]
    pub(crate) fn u64(&self, x: u64) -> u64 {
        let mut v = x;
        // SAFETY: one XOR of two registers, written as assembly so that the
        // compiler can neither fold nor move it (see the module header); it
        // touches no memory and no other register.
        unsafe {
            core::arch::asm!("{0} ^= {1}", inout(reg) v, in(reg) self.0, options(nomem, nostack));
        }
        v
    }

    #[inline(always)]
    pub(crate) fn u32(&self, x: u32) -> u32 {
        self.u64(u64::from(x)) as u32
    }

    #[inline(always)]
    pub(crate) fn u16(&self, x: u16) -> u16 {
        self.u64(u64::from(x)) as u16
    }

    #[inline(always)]
    pub(crate) fn u8(&self, x: u8) -> u8 {
        self.u64(u64::from(x)) as u8
    }

    #[inline(always)]
    pub(crate) fn bool(&self, x: bool) -> bool {
        self.u64(u64::from(x)) & 1 != 0
    }
}
