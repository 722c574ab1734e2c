//! Summary statistics for lab results: mean, percentiles and Jain's
//! fairness index.
//!
//! Percentiles use the nearest-rank method: the p-th percentile of n sorted
//! samples is the sample at rank ⌈p/100 · n⌉ (1-based), so it is always one
//! of the samples, never an interpolation (an RTT that was measured, not
//! one in between). p = 0 gives the minimum.
//!
//! Every function returns `None` on empty input (and on NaN samples for the
//! percentiles) instead of a made-up number.
//!
//! Non-goals: confidence intervals, streaming estimators.

/// The arithmetic mean.
pub fn mean(samples: &[f64]) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    Some(samples.iter().sum::<f64>() / samples.len() as f64)
}

/// The `p`-th percentile (0 ≤ p ≤ 100) by nearest rank; `None` if empty, if
/// `p` is out of range, or if a sample is NaN.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if samples.is_empty() || !(0.0..=100.0).contains(&p) || samples.iter().any(|s| s.is_nan()) {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted.get(rank.clamp(1, n) - 1).copied()
}

/// p50, p90 and p99 of a set of samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Percentiles {
    /// The median.
    pub p50: f64,
    /// The 90th percentile.
    pub p90: f64,
    /// The 99th percentile.
    pub p99: f64,
}

impl Percentiles {
    /// The three percentiles of `samples`; `None` if empty or NaN.
    pub fn of(samples: &[f64]) -> Option<Self> {
        Some(Self {
            p50: percentile(samples, 50.0)?,
            p90: percentile(samples, 90.0)?,
            p99: percentile(samples, 99.0)?,
        })
    }
}

/// Jain's fairness index (Σx)² / (n · Σx²): 1 when all shares are equal,
/// 1/n when one takes everything. `None` if empty or all zero.
pub fn jain(shares: &[f64]) -> Option<f64> {
    let n = shares.len() as f64;
    let sum: f64 = shares.iter().sum();
    let sum_sq: f64 = shares.iter().map(|x| x * x).sum();
    if shares.is_empty() || sum_sq == 0.0 {
        return None;
    }
    Some(sum * sum / (n * sum_sq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_of_nothing_is_none() {
        assert_eq!(mean(&[]), None);
        assert_eq!(mean(&[1.0, 2.0, 6.0]), Some(3.0));
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 90.0), Some(90.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        // Unsorted input, few samples: rank ⌈0.5·4⌉ = 2, ⌈0.9·4⌉ = 4.
        let w = [40.0, 10.0, 30.0, 20.0];
        assert_eq!(percentile(&w, 50.0), Some(20.0));
        assert_eq!(percentile(&w, 90.0), Some(40.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
    }

    #[test]
    fn percentile_refuses_bad_input() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[1.0], 101.0), None);
        assert_eq!(percentile(&[1.0], -1.0), None);
        assert_eq!(percentile(&[1.0, f64::NAN], 50.0), None);
    }

    #[test]
    fn percentiles_struct() {
        let v: Vec<f64> = (1..=1000).map(f64::from).collect();
        let p = Percentiles::of(&v).expect("non-empty");
        assert_eq!((p.p50, p.p90, p.p99), (500.0, 900.0, 990.0));
        assert!(Percentiles::of(&[]).is_none());
    }

    #[test]
    fn jain_index() {
        assert_eq!(jain(&[5.0, 5.0, 5.0, 5.0]), Some(1.0));
        assert_eq!(jain(&[1.0, 0.0, 0.0, 0.0]), Some(0.25));
        let j = jain(&[30.0, 10.0]).expect("non-zero");
        // (40)² / (2 · 1000) = 0.8
        assert!((j - 0.8).abs() < 1e-12, "{j}");
        assert_eq!(jain(&[]), None);
        assert_eq!(jain(&[0.0, 0.0]), None);
    }
}
