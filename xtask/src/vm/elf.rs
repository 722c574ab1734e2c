//! Just enough ELF64 (little-endian) reading for the VM and the packages:
//! is a program statically linked and for which machine, and is an
//! extracted kernel image complete.
//!
//! Layout from the System V gABI: `e_phoff` at 0x20, `e_phentsize` at 0x36,
//! `e_phnum` at 0x38; in each program header `p_type` at 0, `p_offset` at 8
//! and `p_filesz` at 32.
//!
//! Non-goals: 32-bit or big-endian files, section headers, relocation.

use anyhow::{Context, Result, bail};

const PT_LOAD: u32 = 1;
const PT_INTERP: u32 = 3;

/// One program header's fields that matter here.
struct ProgramHeader {
    p_type: u32,
    /// Offset of the segment's bytes in the file.
    offset: u64,
    /// Number of the segment's bytes in the file.
    file_size: u64,
}

fn bytes<const N: usize>(elf: &[u8], off: usize) -> Result<[u8; N]> {
    let end = off.checked_add(N).context("ELF offset overflow")?;
    let slice = elf.get(off..end).context("truncated ELF file")?;
    let mut out = [0u8; N];
    out.copy_from_slice(slice);
    Ok(out)
}

fn program_headers(elf: &[u8]) -> Result<Vec<ProgramHeader>> {
    if elf.get(..4) != Some(b"\x7fELF".as_slice())
        || elf.get(4) != Some(&2)
        || elf.get(5) != Some(&1)
    {
        bail!("not a 64-bit little-endian ELF file");
    }
    let phoff =
        usize::try_from(u64::from_le_bytes(bytes(elf, 0x20)?)).context("e_phoff out of range")?;
    let phentsize = usize::from(u16::from_le_bytes(bytes(elf, 0x36)?));
    let phnum = usize::from(u16::from_le_bytes(bytes(elf, 0x38)?));
    (0..phnum)
        .map(|i| {
            let at = phoff + i * phentsize;
            Ok(ProgramHeader {
                p_type: u32::from_le_bytes(bytes(elf, at)?),
                offset: u64::from_le_bytes(bytes(elf, at + 8)?),
                file_size: u64::from_le_bytes(bytes(elf, at + 32)?),
            })
        })
        .collect()
}

/// Whether the ELF image needs a dynamic loader (has PT_INTERP).
pub(crate) fn has_interpreter(elf: &[u8]) -> Result<bool> {
    Ok(program_headers(elf)?.iter().any(|p| p.p_type == PT_INTERP))
}

/// `e_machine` of x86-64 (System V gABI's list of machines).
pub(crate) const EM_X86_64: u16 = 62;
/// `e_machine` of AArch64.
pub(crate) const EM_AARCH64: u16 = 183;

/// The ELF header's `e_machine` (at 0x12): [`EM_X86_64`], [`EM_AARCH64`].
pub(crate) fn machine(elf: &[u8]) -> Result<u16> {
    program_headers(elf)?;
    Ok(u16::from_le_bytes(bytes(elf, 0x12)?))
}

/// Whether `elf` is an ELF image whose loadable segments all lie within the
/// file: a decompressed kernel that was not cut short.
pub(crate) fn is_complete_executable(elf: &[u8]) -> bool {
    let Ok(headers) = program_headers(elf) else {
        return false;
    };
    let len = elf.len() as u64;
    let loads: Vec<&ProgramHeader> = headers.iter().filter(|p| p.p_type == PT_LOAD).collect();
    !loads.is_empty()
        && loads.iter().all(|p| {
            p.offset
                .checked_add(p.file_size)
                .is_some_and(|end| end <= len)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 image with the given (type, offset, file size)
    /// program headers, padded to `len` bytes.
    fn elf_with(headers: &[(u32, u64, u64)], len: usize) -> Vec<u8> {
        let mut elf = vec![0u8; len.max(64 + 56 * headers.len())];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&u16::try_from(headers.len()).unwrap_or(0).to_le_bytes());
        for (i, (t, off, size)) in headers.iter().enumerate() {
            let at = 64 + 56 * i;
            elf[at..at + 4].copy_from_slice(&t.to_le_bytes());
            elf[at + 8..at + 16].copy_from_slice(&off.to_le_bytes());
            elf[at + 32..at + 40].copy_from_slice(&size.to_le_bytes());
        }
        elf
    }

    #[test]
    fn interpreter_detection() -> Result<()> {
        assert!(!has_interpreter(&elf_with(&[(1, 0, 0), (4, 0, 0)], 0))?);
        assert!(has_interpreter(&elf_with(&[(6, 0, 0), (3, 0, 0)], 0))?);
        assert!(has_interpreter(b"#!/bin/sh\n").is_err());
        assert!(has_interpreter(&elf_with(&[(1, 0, 0)], 0)[..66]).is_err());
        let mut arm = elf_with(&[(1, 0, 0)], 0);
        arm[0x12..0x14].copy_from_slice(&EM_AARCH64.to_le_bytes());
        assert_eq!(machine(&arm)?, EM_AARCH64);
        Ok(())
    }

    #[test]
    fn completeness_needs_every_load_segment_in_the_file() {
        assert!(is_complete_executable(&elf_with(
            &[(1, 0, 200), (1, 200, 56)],
            256
        )));
        assert!(!is_complete_executable(&elf_with(
            &[(1, 0, 200), (1, 200, 57)],
            256
        )));
        assert!(!is_complete_executable(&elf_with(&[(4, 0, 10)], 256)));
        assert!(!is_complete_executable(&elf_with(&[(1, u64::MAX, 2)], 256)));
        assert!(!is_complete_executable(b"\x7fELF"));
    }
}
