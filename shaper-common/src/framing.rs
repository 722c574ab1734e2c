//! Link-layer framing: what a packet costs on the bottleneck link beyond
//! the bytes Linux counts, so that the rate holds at the link's own
//! accounting (DSL cells, PTM's coding, Ethernet's preamble and gap).
//!
//! The semantics are CAKE's (sch_cake.c, `cake_calc_overhead` and
//! `cake_overhead`, from "sch_cake: Add overhead compensation support to
//! the rate shaper", Toke Høiland-Jørgensen, Linux 4.19; the keywords as
//! iproute2's tc-cake(8) defines them):
//! - with an overhead set, a packet counts from its network header (the
//!   link header Linux sees is replaced by the one the overhead
//!   describes), plus `overhead_bytes` (-64 to 256); without one it counts
//!   whole, as Linux sees it (`raw`);
//! - then at least `mpu_bytes` (0 to 256);
//! - then ATM: whole 53-byte cells of 48 payload bytes; or PTM: one byte
//!   more per 64 or part of 64 (its 64b/65b coding, rounded up as CAKE
//!   does);
//! - a GSO packet counts as its segments: each full one of headers plus
//!   `gso_size` bytes, and the last of what remains, each framed.
//!
//! Invariants: [`Framing::RAW`] (all zero) leaves every length as
//! [`crate::rate::wire_len_bytes`] gives it; nothing here divides by a
//! runtime value: cells are counted by a multiply and a shift that equal
//! the division by 48 for every `u32`, and PTM's by a shift. The step is
//! branch-free in the framing's settings: each mode is a 0/1 factor.
//!
//! Units: bytes.
//!
//! Non-goals: the link's own rate (the rate given is the link's), VLAN tags
//! that the link adds (part of the overhead, as CAKE's `ether-vlan`).

/// How the link frames packets. `#[repr(C)]`, 16 bytes: part of
/// [`crate::config::PacerConfig`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Framing {
    /// Bytes added to each packet counted from its network header; may be
    /// negative (-64 to 256).
    pub overhead_bytes: i32,
    /// The least a packet counts, overhead included (0 to 256).
    pub mpu_bytes: u16,
    /// 1: count from the network header (an overhead is set); 0: count
    /// the packet as Linux sees it.
    pub from_l3: u16,
    /// 1: ATM cells.
    pub atm: u16,
    /// 1: PTM's 64b/65b coding.
    pub ptm: u16,
    /// Always zero.
    pub pad: u32,
}

const _: () = assert!(core::mem::size_of::<Framing>() == 16);

/// Bytes of an ATM cell, and of the payload it carries.
pub const ATM_CELL_BYTES: u64 = 53;
/// See [`ATM_CELL_BYTES`].
pub const ATM_PAYLOAD_BYTES: u64 = 48;
/// `ceil(2^37 / 48)`, which is `(2^37 + 16) / 48`: `(x * DIV48_MULT) >>
/// DIV48_SHIFT == x / 48` while the error `x * 16 / (48 * 2^37)` stays
/// below 1/48 (`x < 2^33`) and the product fits 64 bits (`x < 2^32.5`);
/// framed lengths stay below 2^32 + 512. The tests check the edges and a
/// sweep.
const DIV48_MULT: u64 = 2_863_311_531;
/// See [`DIV48_MULT`].
const DIV48_SHIFT: u32 = 37;
/// PTM adds one byte per this many or part.
pub const PTM_BLOCK_BYTES: u64 = 64;

/// The framing range CAKE accepts for `overhead`.
pub const OVERHEAD_RANGE: core::ops::RangeInclusive<i32> = -64..=256;
/// The framing range CAKE accepts for `mpu`.
pub const MPU_RANGE: core::ops::RangeInclusive<u16> = 0..=256;

impl Framing {
    /// No compensation: packets count as Linux sees them.
    pub const RAW: Framing = Framing {
        overhead_bytes: 0,
        mpu_bytes: 0,
        from_l3: 0,
        atm: 0,
        ptm: 0,
        pad: 0,
    };

    /// True when packets count as Linux sees them.
    pub fn is_raw(&self) -> bool {
        *self == Self::RAW
    }

    /// What one packet (or GSO segment) of `len` bytes, its network header
    /// at `l3_off`, costs on the link.
    #[inline(always)]
    pub fn frame_len(&self, len: u32, l3_off: u32) -> u32 {
        let strip = u64::from(self.from_l3) * u64::from(l3_off.min(len));
        let base = (u64::from(len) - strip) as i64 + i64::from(self.overhead_bytes);
        let x = base.max(0) as u64;
        let x = x.max(u64::from(self.mpu_bytes));
        let cells = ((x + ATM_PAYLOAD_BYTES - 1) * DIV48_MULT) >> DIV48_SHIFT;
        let atm = cells * ATM_CELL_BYTES;
        let ptm = x + ((x + PTM_BLOCK_BYTES - 1) >> 6);
        let framed = x + u64::from(self.atm) * (atm - x) + u64::from(self.ptm) * (ptm - x);
        if framed > u64::from(u32::MAX) {
            u32::MAX
        } else {
            framed as u32
        }
    }

    /// What a packet of `len` bytes costs on the link: as one packet, or,
    /// when it is a GSO packet (`gso_segs` > 1 with a known `gso_size`
    /// and `headers_len` repeated by every segment), as its segments.
    /// Without `gso_size` it counts as one packet of
    /// [`crate::rate::wire_len_bytes`]. Saturates at `u32::MAX`.
    #[inline(always)]
    pub fn wire_len(
        &self,
        len: u32,
        gso_segs: u32,
        gso_size: u32,
        headers_len: u32,
        l3_off: u32,
    ) -> u32 {
        let segs = u64::from(gso_segs);
        let payload = u64::from(gso_size);
        let full = u64::from(headers_len) + payload;
        let before_last = segs.saturating_sub(1) * payload;
        if segs <= 1
            || headers_len == 0
            || payload == 0
            || before_last + u64::from(headers_len) >= u64::from(len)
            || full > u64::from(u32::MAX)
        {
            let whole = crate::rate::wire_len_bytes(len, gso_segs, headers_len);
            return self.frame_len(whole, l3_off);
        }
        let last = u64::from(len) - before_last;
        let total = (segs - 1) * u64::from(self.frame_len(full as u32, l3_off))
            + u64::from(self.frame_len(last as u32, l3_off));
        if total > u64::from(u32::MAX) {
            u32::MAX
        } else {
            total as u32
        }
    }
}

/// A framing keyword: CAKE's name, what it adds to the overhead, the mpu
/// it sets (0: leaves it) and the cell mode it sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keyword {
    /// tc-cake(8)'s name.
    pub name: &'static str,
    /// Added to the overhead (keywords add up, as `pppoe-ptm ether-vlan`).
    pub overhead_bytes: i32,
    /// The mpu it sets, or 0.
    pub mpu_bytes: u16,
    /// The cell mode it sets.
    pub cells: Cells,
}

/// A link's cell mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cells {
    /// Leaves the mode as it is.
    Keep,
    /// No cells.
    None,
    /// ATM cells.
    Atm,
    /// PTM coding.
    Ptm,
}

/// CAKE's framing keywords with their values (iproute2's tc/q_cake.c
/// parser; `raw` and `conservative` set rather than add, see
/// [`Framing::from_keywords`]).
pub const KEYWORDS: [Keyword; 15] = [
    Keyword {
        name: "ipoa-vcmux",
        overhead_bytes: 8,
        mpu_bytes: 0,
        cells: Cells::Atm,
    },
    Keyword {
        name: "ipoa-llcsnap",
        overhead_bytes: 16,
        mpu_bytes: 0,
        cells: Cells::Atm,
    },
    Keyword {
        name: "bridged-vcmux",
        overhead_bytes: 24,
        mpu_bytes: 0,
        cells: Cells::Atm,
    },
    Keyword {
        name: "bridged-llcsnap",
        overhead_bytes: 32,
        mpu_bytes: 0,
        cells: Cells::Atm,
    },
    Keyword {
        name: "pppoa-vcmux",
        overhead_bytes: 10,
        mpu_bytes: 0,
        cells: Cells::Atm,
    },
    Keyword {
        name: "pppoa-llc",
        overhead_bytes: 14,
        mpu_bytes: 0,
        cells: Cells::Atm,
    },
    Keyword {
        name: "pppoe-vcmux",
        overhead_bytes: 32,
        mpu_bytes: 0,
        cells: Cells::Atm,
    },
    Keyword {
        name: "pppoe-llcsnap",
        overhead_bytes: 40,
        mpu_bytes: 0,
        cells: Cells::Atm,
    },
    Keyword {
        name: "pppoe-ptm",
        overhead_bytes: 30,
        mpu_bytes: 0,
        cells: Cells::Ptm,
    },
    Keyword {
        name: "bridged-ptm",
        overhead_bytes: 22,
        mpu_bytes: 0,
        cells: Cells::Ptm,
    },
    Keyword {
        name: "ethernet",
        overhead_bytes: 38,
        mpu_bytes: 84,
        cells: Cells::Keep,
    },
    Keyword {
        name: "ether-vlan",
        overhead_bytes: 4,
        mpu_bytes: 0,
        cells: Cells::Keep,
    },
    Keyword {
        name: "docsis",
        overhead_bytes: 18,
        mpu_bytes: 64,
        cells: Cells::None,
    },
    Keyword {
        name: "atm",
        overhead_bytes: 0,
        mpu_bytes: 0,
        cells: Cells::Atm,
    },
    Keyword {
        name: "ptm",
        overhead_bytes: 0,
        mpu_bytes: 0,
        cells: Cells::Ptm,
    },
];

/// Why a framing was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FramingError {
    /// The keyword at this position is not one CAKE names.
    UnknownKeyword(usize),
    /// The overhead is outside [`OVERHEAD_RANGE`].
    Overhead(i64),
    /// The mpu is outside [`MPU_RANGE`].
    Mpu(u32),
}

impl Framing {
    /// The framing that `keywords` (CAKE's, in order), then `overhead` and
    /// `mpu` when given, describe. As in tc: keywords add to the overhead,
    /// `conservative` sets it to 48 with ATM, `raw` clears everything
    /// before it, `noatm` clears the cell mode; an explicit overhead
    /// replaces the keywords' sum; any overhead counts from the network
    /// header.
    pub fn from_keywords<'a>(
        keywords: impl IntoIterator<Item = &'a str>,
        overhead: Option<i32>,
        mpu: Option<u16>,
    ) -> Result<Framing, FramingError> {
        let mut f = Framing::RAW;
        let mut total: i64 = 0;
        let mut set = false;
        for (at, word) in keywords.into_iter().enumerate() {
            match word {
                "raw" => {
                    f = Framing::RAW;
                    total = 0;
                    set = false;
                }
                "conservative" => {
                    total = 48;
                    f.atm = 1;
                    f.ptm = 0;
                    set = true;
                }
                "noatm" => {
                    f.atm = 0;
                    f.ptm = 0;
                }
                _ => {
                    let k = KEYWORDS
                        .iter()
                        .find(|k| k.name == word)
                        .ok_or(FramingError::UnknownKeyword(at))?;
                    total += i64::from(k.overhead_bytes);
                    set |= k.overhead_bytes != 0;
                    if k.mpu_bytes != 0 {
                        f.mpu_bytes = k.mpu_bytes;
                    }
                    match k.cells {
                        Cells::Keep => {}
                        Cells::None => (f.atm, f.ptm) = (0, 0),
                        Cells::Atm => (f.atm, f.ptm) = (1, 0),
                        Cells::Ptm => (f.atm, f.ptm) = (0, 1),
                    }
                }
            }
        }
        if let Some(o) = overhead {
            total = i64::from(o);
            set = true;
        }
        if let Some(m) = mpu {
            f.mpu_bytes = m;
        }
        let range = i64::from(*OVERHEAD_RANGE.start())..=i64::from(*OVERHEAD_RANGE.end());
        if !range.contains(&total) {
            return Err(FramingError::Overhead(total));
        }
        if !MPU_RANGE.contains(&f.mpu_bytes) {
            return Err(FramingError::Mpu(u32::from(f.mpu_bytes)));
        }
        f.overhead_bytes = total as i32;
        f.from_l3 = u16::from(set);
        Ok(f)
    }

    /// Every word [`Framing::from_keywords`] takes: [`KEYWORDS`]' names,
    /// then `conservative`, `noatm` and `raw`.
    pub fn keyword_names() -> impl Iterator<Item = &'static str> {
        KEYWORDS
            .iter()
            .map(|k| k.name)
            .chain(["conservative", "noatm", "raw"])
    }

    /// The cell mode's name: `atm`, `ptm` or `none`.
    pub fn cells_name(&self) -> &'static str {
        match (self.atm, self.ptm) {
            (1, _) => "atm",
            (_, 1) => "ptm",
            _ => "none",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cell_count_is_the_division_by_48_for_every_u32() {
        let check = |x: u64| assert_eq!((x * DIV48_MULT) >> DIV48_SHIFT, x / 48, "{x}");
        let limit = (1u64 << 32) + (1 << 20);
        for x in 0..200_000u64 {
            check(x);
        }
        for x in (u64::from(u32::MAX) - 200_000)..=u64::from(u32::MAX) + 600 {
            check(x);
        }
        for x in (limit - 100_000)..limit {
            check(x);
        }
        let mut x = 1u64;
        while x * 48 + 49 < limit {
            for d in [0, 1, 47, 48, 49] {
                check(x * 48 + d);
                check(x.saturating_sub(d));
            }
            x = x * 3 + 1;
        }
    }

    #[test]
    fn raw_counts_as_linux_sees_it() {
        let f = Framing::RAW;
        assert!(f.is_raw());
        for len in [0, 1, 64, 1514, 65_535, u32::MAX] {
            assert_eq!(f.frame_len(len, 14), len);
        }
        assert_eq!(f.wire_len(1514 * 3, 3, 1448, 66, 14), 1514 * 3 + 2 * 66);
        assert_eq!(
            f.wire_len(60_000, 40, 0, 66, 14),
            crate::rate::wire_len_bytes(60_000, 40, 66)
        );
    }

    /// CAKE's arithmetic, by hand: a 1500-byte IP packet in a 1514-byte
    /// frame under `pppoe-llcsnap` (40, ATM) is 1540 bytes, 33 cells of
    /// 48, 1749 bytes; under `ethernet` 1538; a 64-byte frame under
    /// `ethernet` reaches the mpu of 84; `bridged-ptm` adds 22 and then
    /// one in 64 rounded up.
    #[test]
    fn keywords_frame_as_cake_does() {
        let f = |w: &[&str]| Framing::from_keywords(w.iter().copied(), None, None).expect("ok");
        let atm = f(&["pppoe-llcsnap"]);
        assert_eq!((atm.overhead_bytes, atm.atm, atm.from_l3), (40, 1, 1));
        assert_eq!(atm.frame_len(1514, 14), 33 * 53);
        assert_eq!(atm.frame_len(60, 14), 2 * 53, "46 + 40 = 86 bytes, 2 cells");
        let eth = f(&["ethernet"]);
        assert_eq!(eth.frame_len(1514, 14), 1538);
        assert_eq!(eth.frame_len(60, 14), 84);
        let ptm = f(&["bridged-ptm"]);
        assert_eq!(ptm.frame_len(1514, 14), 1522 + 24);
        assert_eq!(ptm.frame_len(64 + 14 - 22, 14), 65, "64 bytes: one more");
        let vlan = f(&["pppoe-ptm", "ether-vlan"]);
        assert_eq!((vlan.overhead_bytes, vlan.ptm), (34, 1));
        let docsis = f(&["docsis"]);
        assert_eq!(
            (docsis.overhead_bytes, docsis.mpu_bytes, docsis.atm),
            (18, 64, 0)
        );
        let c = f(&["conservative"]);
        assert_eq!((c.overhead_bytes, c.atm), (48, 1));
        assert!(f(&["ethernet", "raw"]).is_raw());
        let noatm = f(&["pppoe-ptm", "noatm"]);
        assert_eq!((noatm.overhead_bytes, noatm.ptm, noatm.atm), (30, 0, 0));
        assert_eq!(
            Framing::from_keywords(["atm"], Some(-4), Some(96)).expect("ok"),
            Framing {
                overhead_bytes: -4,
                mpu_bytes: 96,
                from_l3: 1,
                atm: 1,
                ptm: 0,
                pad: 0
            }
        );
        assert_eq!(
            Framing::from_keywords(["dsl"], None, None),
            Err(FramingError::UnknownKeyword(0))
        );
        assert_eq!(
            Framing::from_keywords([], Some(257), None),
            Err(FramingError::Overhead(257))
        );
        assert_eq!(
            Framing::from_keywords([], None, Some(300)),
            Err(FramingError::Mpu(300))
        );
        let many = ["pppoe-llcsnap"; 7];
        assert_eq!(
            Framing::from_keywords(many, None, None),
            Err(FramingError::Overhead(280))
        );
    }

    /// A GSO packet costs what its segments would: under ATM the segments
    /// each round up to cells, which the packet as a whole would not.
    #[test]
    fn gso_packets_frame_per_segment() {
        let f = Framing::from_keywords(["pppoe-llcsnap"], None, None).expect("ok");
        let (headers, mss, segs) = (66u32, 1448u32, 10u32);
        let last = 1000;
        let len = headers + mss * (segs - 1) + last;
        let one = f.frame_len(headers + mss, 14);
        let tail = f.frame_len(headers + last, 14);
        assert_eq!(
            f.wire_len(len, segs, mss, headers, 14),
            (segs - 1) * one + tail
        );
        assert_eq!(f.frame_len(1, 14), 53, "a runt is one cell");
        assert_eq!(f.frame_len(0, 14), 53);
        let neg = Framing::from_keywords([], Some(-64), None).expect("ok");
        assert_eq!(neg.frame_len(40, 14), 0, "never below zero");
        assert_eq!(f.frame_len(u32::MAX, 0), u32::MAX, "saturates");
    }
}
