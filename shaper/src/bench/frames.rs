//! Synthetic IPv4/TCP frames for the benchmark: one per flow, told apart by
//! source port and source address.
//!
//! Invariants: the IPv4 total length and header checksum are correct, the
//! TCP data offset is 5 (no options), the transport checksum is zero (the
//! classifier never reads it). Addresses come from 10.0.0.0/8 (source) and
//! 198.51.100.0/24 (destination, RFC 5737).
//!
//! Non-goals: IPv6, VLAN tags, options; the integration tests' builder
//! (`tests/src/packets.rs`) covers those.

/// Ethernet + IPv4 + TCP headers, in bytes.
pub const HEADERS_LEN: usize = 14 + 20 + 20;

/// Source ports used per source address before the address changes.
const PORTS_PER_ADDR: u32 = 50_000;

/// The IPv4 ECN codepoint of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ecn {
    /// Not ECN-capable: the AQM drops instead of marking.
    NotEct,
    /// ECT(0): ECN-capable, the AQM may CE-mark.
    Ect0,
}

/// The frame of flow `index` (source port `1024 + index % 50000`, source
/// address `10.0.0.0 + index / 50000`, destination 198.51.100.1:443), `len`
/// bytes long in total (at least [`HEADERS_LEN`]).
pub fn tcp_frame(index: u32, len: usize, ecn: Ecn) -> Vec<u8> {
    let len = len.max(HEADERS_LEN);
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]); // destination MAC
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]); // source MAC
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let ip_start = f.len();
    let tos = match ecn {
        Ecn::NotEct => 0u8,
        Ecn::Ect0 => 0b10,
    };
    // Fits: frames are far below 64 KiB.
    let total = u16::try_from(len - 14).unwrap_or(u16::MAX);
    f.extend_from_slice(&[0x45, tos]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0x12, 0x34, 0x40, 0x00, 64, 6, 0, 0]); // id, DF, TTL, TCP, csum
    let src = 0x0a00_0000u32 + index / PORTS_PER_ADDR;
    f.extend_from_slice(&src.to_be_bytes());
    f.extend_from_slice(&[198, 51, 100, 1]);
    let csum = internet_checksum(&f[ip_start..ip_start + 20]);
    f[ip_start + 10..ip_start + 12].copy_from_slice(&csum.to_be_bytes());
    // Below 1024 + 50000: fits a u16.
    let sport = u16::try_from(1024 + index % PORTS_PER_ADDR).unwrap_or(u16::MAX);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&443u16.to_be_bytes());
    f.extend_from_slice(&1u32.to_be_bytes()); // sequence
    f.extend_from_slice(&0u32.to_be_bytes()); // acknowledgement
    f.extend_from_slice(&[0x50, 0x18, 0x01, 0xf5, 0, 0, 0, 0]); // offset 5, PSH|ACK, window
    f.resize(len, 0);
    f
}

/// The frame of flow `index` from a host of its own: [`tcp_frame`] with
/// the source address `10.0.0.0 + index` (the mix for the pacer over
/// hosts, where each host then has one flow).
pub fn host_frame(index: u32, len: usize, ecn: Ecn) -> Vec<u8> {
    let mut f = tcp_frame(index, len, ecn);
    let ip = 14;
    let src = 0x0a00_0000u32.wrapping_add(index);
    f[ip + 12..ip + 16].copy_from_slice(&src.to_be_bytes());
    f[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
    let csum = internet_checksum(&f[ip..ip + 20]);
    f[ip + 10..ip + 12].copy_from_slice(&csum.to_be_bytes());
    f
}

/// The RFC 1071 one's-complement checksum of `bytes`.
fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for pair in bytes.chunks(2) {
        let hi = pair.first().copied().unwrap_or(0);
        let lo = pair.get(1).copied().unwrap_or(0);
        sum += u32::from(u16::from_be_bytes([hi, lo]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop above leaves at most 16 bits.
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_well_formed_and_distinct() {
        let a = tcp_frame(0, 128, Ecn::NotEct);
        let b = tcp_frame(50_001, 128, Ecn::Ect0);
        assert_eq!(a.len(), 128);
        assert_eq!(internet_checksum(&a[14..34]), 0);
        assert_eq!(internet_checksum(&b[14..34]), 0);
        assert_eq!(u16::from_be_bytes([a[16], a[17]]), 114);
        assert_eq!(a[15] & 3, 0);
        assert_eq!(b[15] & 3, 2);
        assert_eq!(&b[26..30], &[10, 0, 0, 1]);
        assert_eq!(u16::from_be_bytes([b[34], b[35]]), 1025);
        assert_ne!(a[26..38], b[26..38]);
        assert_eq!(tcp_frame(7, 10, Ecn::NotEct).len(), HEADERS_LEN);
    }
}
