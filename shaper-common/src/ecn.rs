//! Setting ECN's Congestion Experienced codepoint in an IP header, and
//! clearing the DSCP beside it (CAKE's `wash`).
//!
//! The ECN field is the two low bits of the IPv4 TOS byte and of the IPv6
//! traffic class (RFC 3168, section 5: 0 not-ECT, 1 ECT(1), 2 ECT(0), 3 CE).
//! Setting CE in IPv4 changes a checksummed header, so the header checksum
//! is updated incrementally, by RFC 1624's equation 3,
//! `HC' = ~(~HC + ~m + m')`, on the 16-bit word that holds the TOS byte.
//!
//! Invariant: the packet programs write the TOS byte and the checksum with
//! one store of [`IPV4_CE_SPAN`] bytes, so a header is rewritten whole or
//! not at all: never a new TOS beside a stale checksum.
//!
//! Units: bytes in network order, as they sit in the packet.
//! Non-goals: deciding whether to mark (that is the AQM's), options, and the
//! outer header of a tunnel.

/// Bytes of an IPv4 header from its first byte through the header checksum
/// (bytes 10 and 11): what one store rewrites to set CE.
pub const IPV4_CE_SPAN: usize = 12;

/// The ECN bits' value for CE.
pub const CE: u8 = 0b11;

/// One's-complement addition of 16-bit words, with the end-around carry.
#[inline(always)]
const fn ones_add(a: u16, b: u16) -> u16 {
    let sum = a as u32 + b as u32;
    ((sum & 0xffff) + (sum >> 16)) as u16
}

/// The header checksum after the 16-bit word `old` became `new` (all in host
/// order of the big-endian words), by RFC 1624's equation 3.
#[inline(always)]
pub const fn checksum_update(check: u16, old: u16, new: u16) -> u16 {
    !ones_add(ones_add(!check, !old), new)
}

/// Sets CE in the first [`IPV4_CE_SPAN`] bytes of an IPv4 header and updates
/// its checksum. Returns false, leaving the bytes alone, when the packet is
/// not ECN-capable (not-ECT must not be marked: RFC 3168, section 5) or is CE
/// already.
#[inline(always)]
pub fn ipv4_set_ce(h: &mut [u8; IPV4_CE_SPAN]) -> bool {
    let ecn = h[1] & CE;
    if ecn == 0 || ecn == CE {
        return false;
    }
    let old = u16::from_be_bytes([h[0], h[1]]);
    h[1] |= CE;
    let new = u16::from_be_bytes([h[0], h[1]]);
    let check = checksum_update(u16::from_be_bytes([h[10], h[11]]), old, new);
    [h[10], h[11]] = check.to_be_bytes();
    true
}

/// Sets CE in the second byte of an IPv6 header (the traffic class's low
/// nibble sits in its high nibble, so ECN is bits 4 and 5). Returns false,
/// leaving it alone, when the packet is not ECN-capable or is CE already.
#[inline(always)]
pub fn ipv6_set_ce(byte1: &mut u8) -> bool {
    let ecn = (*byte1 >> 4) & CE;
    if ecn == 0 || ecn == CE {
        return false;
    }
    *byte1 |= CE << 4;
    true
}

/// Clears the DSCP of the first [`IPV4_CE_SPAN`] bytes of an IPv4 header,
/// keeping the ECN bits, and updates its checksum. Returns false, leaving
/// the bytes alone, when the DSCP is 0 already.
#[inline(always)]
pub fn ipv4_clear_dscp(h: &mut [u8; IPV4_CE_SPAN]) -> bool {
    if h[1] & !CE == 0 {
        return false;
    }
    let old = u16::from_be_bytes([h[0], h[1]]);
    h[1] &= CE;
    let new = u16::from_be_bytes([h[0], h[1]]);
    let check = checksum_update(u16::from_be_bytes([h[10], h[11]]), old, new);
    [h[10], h[11]] = check.to_be_bytes();
    true
}

/// Clears the DSCP of an IPv6 header's first two bytes (the traffic class
/// is the low nibble of the first and the high nibble of the second; the
/// DSCP its upper six bits), keeping the ECN bits. Returns false, leaving
/// them alone, when the DSCP is 0 already. IPv6 has no header checksum.
#[inline(always)]
pub fn ipv6_clear_dscp(b: &mut [u8; 2]) -> bool {
    if b[0] & 0x0f == 0 && b[1] & 0xc0 == 0 {
        return false;
    }
    b[0] &= 0xf0;
    b[1] &= 0x3f;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IPv4 header checksum computed from scratch (RFC 791).
    fn full_checksum(h: &[u8; 20]) -> u16 {
        let mut sum = 0u16;
        for (i, pair) in h.chunks(2).enumerate() {
            if i != 5 {
                sum = ones_add(sum, u16::from_be_bytes([pair[0], pair[1]]));
            }
        }
        !sum
    }

    fn header(tos: u8, seed: u32) -> [u8; 20] {
        let mut h = [0u8; 20];
        h[0] = 0x45;
        h[1] = tos;
        let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        for b in h.iter_mut().skip(2) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = x as u8;
        }
        let c = full_checksum(&h);
        [h[10], h[11]] = c.to_be_bytes();
        h
    }

    #[test]
    fn the_incremental_checksum_equals_a_full_recomputation() {
        for tos in 0..=255u8 {
            for seed in 0..64 {
                let mut h = header(tos, seed);
                let mut span: [u8; IPV4_CE_SPAN] = [0; IPV4_CE_SPAN];
                span.copy_from_slice(&h[..IPV4_CE_SPAN]);
                let marked = ipv4_set_ce(&mut span);
                let ect = matches!(tos & 3, 1 | 2);
                assert_eq!(marked, ect, "tos {tos:#04x}");
                if !marked {
                    assert_eq!(span[..], h[..IPV4_CE_SPAN], "left alone");
                    continue;
                }
                h[..IPV4_CE_SPAN].copy_from_slice(&span);
                assert_eq!(h[1] & 3, CE);
                assert_eq!(
                    u16::from_be_bytes([h[10], h[11]]),
                    full_checksum(&h),
                    "tos {tos:#04x} seed {seed}"
                );
            }
        }
    }

    #[test]
    fn an_unchanged_word_leaves_the_checksum_alone() {
        for check in [0x0000, 0x1234, 0xb1e6, 0xfffe] {
            for word in [0x0000, 0x4500, 0x45ff, 0xffff] {
                assert_eq!(
                    checksum_update(check, word, word),
                    check,
                    "{check:#x} {word:#x}"
                );
            }
        }
    }

    #[test]
    fn ipv6_marks_only_ect() {
        for tc_low in 0..16u8 {
            let mut b = (tc_low << 4) | 0x0a;
            let before = b;
            let ect = matches!(tc_low & 3, 1 | 2);
            assert_eq!(ipv6_set_ce(&mut b), ect);
            if ect {
                assert_eq!(b, before | 0x30);
            } else {
                assert_eq!(b, before);
            }
        }
    }

    #[test]
    fn washing_clears_the_dscp_keeps_ecn_and_the_checksum_right() {
        // An IPv4 header with DSCP EF (46) and ECT(0).
        let mut h = [0u8; 20];
        h[0] = 0x45;
        h[1] = (46 << 2) | 0b10;
        h[8] = 64;
        h[9] = 6;
        h[12..20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        let c = full_checksum(&h);
        [h[10], h[11]] = c.to_be_bytes();
        let mut span: [u8; IPV4_CE_SPAN] = h[..IPV4_CE_SPAN].try_into().expect("12 bytes");
        assert!(ipv4_clear_dscp(&mut span));
        h[..IPV4_CE_SPAN].copy_from_slice(&span);
        assert_eq!(h[1], 0b10);
        assert_eq!(u16::from_be_bytes([h[10], h[11]]), full_checksum(&h));
        assert!(!ipv4_clear_dscp(&mut span));
        // IPv6: version 6, traffic class EF with ECT(1).
        let tc: u8 = (46 << 2) | 0b01;
        let mut b = [0x60 | (tc >> 4), (tc & 0x0f) << 4];
        assert!(ipv6_clear_dscp(&mut b));
        assert_eq!(b, [0x60, 0x10]);
        assert!(!ipv6_clear_dscp(&mut b));
    }
}
