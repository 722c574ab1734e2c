//! Rates as the packet path uses them: nanoseconds per byte in fixed point.
//!
//! The controller converts a rate once, at configuration time, into
//! `ns_per_byte_scaled = round(1e9 << shift / rate_bytes_per_s)` and a `shift`.
//! The packet path then computes a packet's transmission time as
//! `(len * ns_per_byte_scaled) >> shift`, rounded: one multiply, one shift, no
//! division (the same trick as CAKE's `rate_ns`/`rate_shft`, sch_cake.c).
//!
//! Invariants: `ns_per_byte_scaled < 2^32` and `len < 2^32`, so the product
//! never overflows a `u64`; `shift` is the largest that keeps the first bound,
//! which maximises precision (relative error below 2^-31 for every rate from
//! 1 kbit/s to 1 Tbit/s).
//!
//! Units: rates in bytes per second, times in nanoseconds, lengths in bytes.

/// Nanoseconds per second.
pub const NSEC_PER_SEC: u64 = 1_000_000_000;

/// The slowest rate the shaper accepts, in bytes per second (1 kbit/s).
pub const MIN_RATE_BYTES_PER_S: u64 = 125;
/// The fastest rate the shaper accepts, in bytes per second (1 Tbit/s).
pub const MAX_RATE_BYTES_PER_S: u64 = 125_000_000_000;

/// A rate converted for the packet path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaledRate {
    /// `1e9 / rate_bytes_per_s`, shifted left by `shift`, rounded.
    pub ns_per_byte_scaled: u64,
    /// Fixed-point shift of `ns_per_byte_scaled`.
    pub shift: u32,
}

impl ScaledRate {
    /// Converts a rate for the packet path. Call at configuration time only:
    /// this divides. Returns `None` when the rate is outside
    /// [`MIN_RATE_BYTES_PER_S`, `MAX_RATE_BYTES_PER_S`].
    pub fn from_bytes_per_s(rate_bytes_per_s: u64) -> Option<Self> {
        if !(MIN_RATE_BYTES_PER_S..=MAX_RATE_BYTES_PER_S).contains(&rate_bytes_per_s) {
            return None;
        }
        let rate = u128::from(rate_bytes_per_s);
        // Largest shift whose scaled value stays below 2^32. ns/byte is at
        // most 8e6 (< 2^23), so shift >= 9 always fits; 63 bounds the search.
        let mut shift = 63u32;
        loop {
            let scaled = ((u128::from(NSEC_PER_SEC) << shift) + rate / 2) / rate;
            if scaled < (1u128 << 32) {
                // Cannot truncate: just checked it is below 2^32.
                let ns_per_byte_scaled = scaled as u64;
                return Some(Self {
                    ns_per_byte_scaled,
                    shift,
                });
            }
            shift -= 1;
        }
    }

    /// Time on the wire of `len_bytes` at this rate, in nanoseconds, rounded
    /// to nearest. Packet-path safe: no division.
    #[inline(always)]
    pub fn tx_time_ns(&self, len_bytes: u32) -> u64 {
        // Cannot overflow: both factors are below 2^32 (module invariant).
        let product = u64::from(len_bytes) * self.ns_per_byte_scaled;
        // Round to nearest without adding (which could overflow): the bit just
        // below the cut decides. `shift >= 9` always, see `from_bytes_per_s`.
        (product >> self.shift) + ((product >> (self.shift - 1)) & 1)
    }
}

/// Bytes a packet puts on the wire: its length, plus the headers that each
/// GSO segment after the first repeats (GSO/GRO super-packets carry one set
/// of headers for `gso_segs` segments). `headers_len` is 0 when unknown, and
/// then the length alone is charged. Saturates at `u32::MAX`.
#[inline(always)]
pub fn wire_len_bytes(len_bytes: u32, gso_segs: u32, headers_len: u32) -> u32 {
    if gso_segs <= 1 || headers_len == 0 || headers_len >= len_bytes {
        return len_bytes;
    }
    let extra = u64::from(gso_segs - 1) * u64::from(headers_len);
    let total = u64::from(len_bytes) + extra;
    if total > u64::from(u32::MAX) {
        u32::MAX
    } else {
        total as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_rates_out_of_range() {
        assert_eq!(ScaledRate::from_bytes_per_s(0), None);
        assert_eq!(ScaledRate::from_bytes_per_s(MIN_RATE_BYTES_PER_S - 1), None);
        assert_eq!(ScaledRate::from_bytes_per_s(MAX_RATE_BYTES_PER_S + 1), None);
        assert!(ScaledRate::from_bytes_per_s(MIN_RATE_BYTES_PER_S).is_some());
        assert!(ScaledRate::from_bytes_per_s(MAX_RATE_BYTES_PER_S).is_some());
    }

    #[test]
    fn tx_time_matches_exact_division() {
        // 20 Mbit/s: 1500 bytes take 600 us.
        let r = ScaledRate::from_bytes_per_s(2_500_000).expect("in range");
        assert_eq!(r.tx_time_ns(1500), 600_000);
        // 850 Mbit/s: 1514 bytes take 14.2494 us.
        let r = ScaledRate::from_bytes_per_s(106_250_000).expect("in range");
        assert_eq!(r.tx_time_ns(1514), 14_249);
        // 1 kbit/s: one byte takes 8 ms.
        let r = ScaledRate::from_bytes_per_s(125).expect("in range");
        assert_eq!(r.tx_time_ns(1), 8_000_000);
        // 1 Tbit/s: 64 KiB take 524.288 ns.
        let r = ScaledRate::from_bytes_per_s(125_000_000_000).expect("in range");
        assert_eq!(r.tx_time_ns(65_536), 524);
    }

    #[test]
    fn relative_error_is_tiny_over_the_whole_range() {
        let mut rate = MIN_RATE_BYTES_PER_S;
        while rate <= MAX_RATE_BYTES_PER_S {
            let r = ScaledRate::from_bytes_per_s(rate).expect("in range");
            assert!(r.ns_per_byte_scaled < 1 << 32, "rate {rate}");
            // A large (BIG TCP sized) packet so rounding of the result is negligible.
            let len = 1u32 << 22;
            let exact = u128::from(len) * u128::from(NSEC_PER_SEC) / u128::from(rate);
            let got = u128::from(r.tx_time_ns(len));
            let err = exact.abs_diff(got);
            assert!(
                err * 1_000_000 <= exact + 1_000_000,
                "rate {rate}: {got} vs {exact}"
            );
            rate = rate * 3 + 7;
        }
    }

    #[test]
    fn wire_len_counts_repeated_headers() {
        // Not GSO, or headers unknown: the length itself.
        assert_eq!(wire_len_bytes(1514, 0, 66), 1514);
        assert_eq!(wire_len_bytes(1514, 1, 66), 1514);
        assert_eq!(wire_len_bytes(60_000, 40, 0), 60_000);
        // 44 segments of 1448 bytes behind 66 bytes of Ethernet+IPv4+TCP(ts).
        let len = 66 + 44 * 1448;
        assert_eq!(wire_len_bytes(len, 44, 66), 44 * (66 + 1448));
        // Nonsense headers (longer than the packet) are ignored.
        assert_eq!(wire_len_bytes(100, 4, 100), 100);
        // Saturates instead of wrapping.
        assert_eq!(wire_len_bytes(u32::MAX - 10, 65_535, 200), u32::MAX);
    }

    #[test]
    fn huge_lengths_do_not_overflow() {
        let r = ScaledRate::from_bytes_per_s(MIN_RATE_BYTES_PER_S).expect("in range");
        let t = r.tx_time_ns(u32::MAX);
        assert_eq!(t, u64::from(u32::MAX) * 8_000_000);
    }
}
