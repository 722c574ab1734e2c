//! Whole-machine CPU time from /proc/stat, sampled before and after a run.
//!
//! The aggregate `cpu` line counts jiffies (USER_HZ, normally 1/100 s) summed
//! over all CPUs in ten columns: user nice system idle iowait irq softirq
//! steal guest guest_nice. `guest` and `guest_nice` are already included in
//! `user` and `nice`, so the total leaves them out. Packet processing shows
//! up as `system` (socket calls, qdiscs on the sending path) and `softirq`
//! (forwarding, NAPI, qdisc dequeue); `irq` is included for completeness.
//!
//! The figure is a fraction of all CPU time over the interval (0..=1, where
//! 1 means every CPU busy), so a caller can divide by goodput for CPU per
//! Mbit/s. Namespaces share the machine's CPUs, so this measures the sender,
//! the router and the receiver together: compare states measured in the
//! same run, and subtract an unshaped run at the same goodput to isolate a
//! shaper's own cost.
//!
//! Non-goals: per-process or per-CPU accounting.

use super::LabError;

/// The aggregate `cpu` line of /proc/stat, in jiffies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Time in user mode (including guest time).
    pub user: u64,
    /// Niced user time (including guest_nice).
    pub nice: u64,
    /// Kernel mode, outside interrupts.
    pub system: u64,
    /// Idle.
    pub idle: u64,
    /// Idle while waiting for I/O.
    pub iowait: u64,
    /// Hard interrupts.
    pub irq: u64,
    /// Soft interrupts (network receive and transmit processing).
    pub softirq: u64,
    /// Stolen by the hypervisor.
    pub steal: u64,
}

impl CpuTimes {
    /// Reads /proc/stat now.
    pub fn now() -> Result<Self, LabError> {
        let path = "/proc/stat";
        let text = std::fs::read_to_string(path).map_err(|source| LabError::Io {
            what: "reading",
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses the aggregate `cpu` line of /proc/stat text. Kernels before
    /// 2.6.11 had fewer columns; missing trailing columns read as 0, but the
    /// first four must be there.
    pub fn parse(text: &str) -> Result<Self, LabError> {
        let err = |detail: String| LabError::Parse {
            command: "/proc/stat".to_owned(),
            detail,
        };
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some("cpu"))
            .ok_or_else(|| err("no aggregate `cpu` line".to_owned()))?;
        let mut values = [0u64; 8];
        let mut count = 0;
        for (slot, field) in values.iter_mut().zip(line.split_whitespace().skip(1)) {
            *slot = field
                .parse()
                .map_err(|_| err(format!("`{field}` is not a number in `{line}`")))?;
            count += 1;
        }
        if count < 4 {
            return Err(err(format!("too few columns in `{line}`")));
        }
        let [user, nice, system, idle, iowait, irq, softirq, steal] = values;
        Ok(Self {
            user,
            nice,
            system,
            idle,
            iowait,
            irq,
            softirq,
            steal,
        })
    }

    /// All jiffies counted (guest time is inside user and nice already).
    pub fn total(&self) -> u64 {
        self.user
            + self.nice
            + self.system
            + self.idle
            + self.iowait
            + self.irq
            + self.softirq
            + self.steal
    }
}

/// CPU use between two samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuUsage {
    /// Jiffies elapsed over all CPUs.
    pub total_jiffies: u64,
    /// Fraction of all CPU time in `system`.
    pub system: f64,
    /// Fraction in `softirq`.
    pub softirq: f64,
    /// Fraction in `irq`.
    pub irq: f64,
    /// Fraction in `user` + `nice`.
    pub user: f64,
}

impl CpuUsage {
    /// The use from `before` to `after`. Counters never go backwards; if one
    /// did (a wrapped or reset counter), it counts as zero.
    pub fn between(before: &CpuTimes, after: &CpuTimes) -> Self {
        let total = after.total().saturating_sub(before.total());
        let frac = |a: u64, b: u64| {
            if total == 0 {
                0.0
            } else {
                a.saturating_sub(b) as f64 / total as f64
            }
        };
        Self {
            total_jiffies: total,
            system: frac(after.system, before.system),
            softirq: frac(after.softirq, before.softirq),
            irq: frac(after.irq, before.irq),
            user: frac(after.user + after.nice, before.user + before.nice),
        }
    }

    /// The packet-processing share: system + softirq + irq, 0..=1.
    pub fn kernel(&self) -> f64 {
        self.system + self.softirq + self.irq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "\
cpu  167 3 663 643 10 2 5 1 0 0
cpu0 36 0 248 452 0 0 4 0 0 0
cpu1 131 3 415 191 10 2 1 1 0 0
intr 12345 0 0
ctxt 999
";

    #[test]
    fn parses_the_aggregate_line() {
        let t = CpuTimes::parse(STAT).expect("parses");
        assert_eq!(
            t,
            CpuTimes {
                user: 167,
                nice: 3,
                system: 663,
                idle: 643,
                iowait: 10,
                irq: 2,
                softirq: 5,
                steal: 1,
            }
        );
        assert_eq!(t.total(), 1494);
    }

    #[test]
    fn old_kernels_with_four_columns_parse() {
        let t = CpuTimes::parse("cpu 1 2 3 4\n").expect("parses");
        assert_eq!((t.user, t.idle, t.softirq), (1, 4, 0));
    }

    #[test]
    fn refuses_garbage() {
        assert!(CpuTimes::parse("cpu0 1 2 3 4\n").is_err(), "per-CPU only");
        assert!(CpuTimes::parse("cpu 1 2 x 4\n").is_err());
        assert!(CpuTimes::parse("cpu 1 2\n").is_err());
    }

    #[test]
    fn usage_is_a_fraction_of_elapsed_time() {
        let a = CpuTimes::parse(STAT).expect("parses");
        let b = CpuTimes {
            system: a.system + 30,
            softirq: a.softirq + 15,
            irq: a.irq + 5,
            user: a.user + 20,
            idle: a.idle + 130,
            ..a
        };
        let u = CpuUsage::between(&a, &b);
        assert_eq!(u.total_jiffies, 200);
        assert!((u.system - 0.15).abs() < 1e-12);
        assert!((u.softirq - 0.075).abs() < 1e-12);
        assert!((u.kernel() - 0.25).abs() < 1e-12);
        assert!((u.user - 0.1).abs() < 1e-12);
        // No time elapsed: zeros, not NaN.
        assert_eq!(CpuUsage::between(&a, &a).kernel(), 0.0);
    }
}
