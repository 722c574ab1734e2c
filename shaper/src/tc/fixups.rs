//! Where a kernel dump is not what the create path accepts: small, named
//! repairs of recorded options before replay, and the kinds that cannot be
//! replayed at all.
//!
//! Repairs (each from reading the kernel's dump and change functions):
//! - **htb qdisc**: `htb_dump` reports `tc_htb_glob.version` as the full
//!   `HTB_VER` (`0x30011`, "ver 3.17"), while `htb_init` accepts only
//!   `HTB_VER >> 16`; the version is shifted back. `direct_pkts` in the same
//!   struct is a counter, zeroed (create ignores it).
//! - **codel and fq_codel times**: the kernel keeps target, interval and
//!   ce_threshold in its codel time, nanoseconds >> `CODEL_SHIFT` (10),
//!   converting the microseconds it is given down (`(us * 1000) >> 10`) and
//!   the dump back down again (`codel_time_to_us`, include/net/codel.h). A
//!   dumped value replayed as it is therefore loses one codel unit each
//!   round: `5ms` is stored as 4882, dumped as 4999 us, replayed to 4881 and
//!   dumped as 4998, so repeated restores drift (`target 4.99ms`). The
//!   value replayed is the smallest whose conversion gives the recorded
//!   codel time back ([`codel_us_for_replay`]), so a restore is exact
//!   however often it happens.
//! - **pie and fq_pie targets**: the same in psched ticks of 64 ns
//!   (`PSCHED_NS2TICKS`), where a microsecond spans 15 ticks: a target of
//!   1003 us is stored as 15671 ticks, dumped as 1002 us, replayed to 15656
//!   and dumped as 1001. The dump cannot say which of the ticks in its
//!   microsecond the kernel had, so the value replayed is the smallest
//!   whose stored ticks dump the same: `tc -d` shows the same target after
//!   any number of restores.
//! - **Offload state in classifier flags**: u32, bpf, flower and matchall
//!   report `TCA_CLS_FLAGS_IN_HW`/`NOT_IN_HW` in the flags attribute that
//!   their create path checks with `tc_flags_valid()` (include/net/
//!   pkt_cls.h), which rejects those bits. They are masked off; the kernel
//!   sets them again. Per-filter counters (`*_PCNT`, `TCA_FLOWER_IN_HW_COUNT`)
//!   and padding are output-only and dropped.
//!
//! Kinds refused outright: red, choke and gred dump their parameters but not
//! the idle-time table (`TCA_*_STAB`) their change functions require.
//!
//! Non-goals: action options (replayed as dumped; their counters are
//! ignored by `tcf_action_init_1`).

use super::TcObject;
use super::message::{Attr, TCA_OPTIONS, encode_attrs, parse_attrs};

/// `TCA_HTB_INIT` in include/uapi/linux/pkt_sched.h.
const TCA_HTB_INIT: u16 = 2;
/// `struct tc_htb_glob`: version, rate2quantum, defcls, debug, direct_pkts.
const HTB_GLOB_LEN: usize = 20;
const HTB_GLOB_DIRECT_PKTS: usize = 16;

const TCA_CLS_FLAGS_IN_HW: u32 = 1 << 2;
const TCA_CLS_FLAGS_NOT_IN_HW: u32 = 1 << 3;

/// Per classifier kind: its flags attribute (masked) and its output-only
/// options (dropped), numbers from include/uapi/linux/pkt_cls.h.
const FILTER_FIXUPS: [(&str, u16, &[u16]); 4] = [
    // TCA_U32_FLAGS; TCA_U32_PCNT, TCA_U32_PAD
    ("u32", 11, &[9, 12]),
    // TCA_BPF_FLAGS_GEN; TCA_BPF_TAG, TCA_BPF_ID
    ("bpf", 9, &[10, 11]),
    // TCA_FLOWER_FLAGS; TCA_FLOWER_IN_HW_COUNT
    ("flower", 22, &[86]),
    // TCA_MATCHALL_FLAGS; TCA_MATCHALL_PCNT, TCA_MATCHALL_PAD
    ("matchall", 3, &[4, 5]),
];

/// Why a qdisc of `kind` cannot be replayed from its dump, if it cannot.
pub(crate) fn unreplayable_qdisc(kind: &str) -> Option<&'static str> {
    match kind {
        "red" | "choke" | "gred" => Some(
            "the kernel dumps its parameters without the idle-time table (stab) that creating \
             it requires",
        ),
        _ => None,
    }
}

/// The kernel's codel time shift (`CODEL_SHIFT`, include/net/codel.h).
const CODEL_SHIFT: u32 = 10;

/// The kernel's psched time shift (`PSCHED_SHIFT`, include/net/pkt_sched.h):
/// pie and fq_pie keep their target in ticks of 64 ns.
const PSCHED_SHIFT: u32 = 6;

/// Per qdisc kind, the options that it is given in microseconds and keeps
/// in nanoseconds >> shift (include/uapi/linux/pkt_sched.h), with the shift.
const TIME_OPTIONS: [(&str, &[u16], u32); 4] = [
    // TCA_CODEL_TARGET, TCA_CODEL_INTERVAL, TCA_CODEL_CE_THRESHOLD
    ("codel", &[1, 3, 5], CODEL_SHIFT),
    // TCA_FQ_CODEL_TARGET, TCA_FQ_CODEL_INTERVAL, TCA_FQ_CODEL_CE_THRESHOLD
    ("fq_codel", &[1, 3, 7], CODEL_SHIFT),
    // TCA_PIE_TARGET (`pie_change`: PSCHED_NS2TICKS of the microseconds)
    ("pie", &[1], PSCHED_SHIFT),
    // TCA_FQ_PIE_TARGET (`fq_pie_change`, the same)
    ("fq_pie", &[3], PSCHED_SHIFT),
];

/// What the kernel stores for `us` given microseconds: `(us * 1000) >>
/// shift` (`fq_codel_change`, `pie_change`).
fn time_of_us(us: u32, shift: u32) -> u64 {
    (u64::from(us) * 1000) >> shift
}

/// What the kernel dumps for the stored time `t`: `(t << shift) / 1000`
/// (`codel_time_to_us`, `PSCHED_TICKS2NS(t) / NSEC_PER_USEC`).
fn us_of_time(t: u64, shift: u32) -> u64 {
    (t << shift) / 1000
}

/// The microseconds to replay for a dumped `dumped_us`, so that the kernel
/// stores a time that dumps as `dumped_us` again, however often it is
/// replayed: the smallest `us` storing the smallest such time. With codel's
/// shift that time is the one the kernel had (one microsecond is at most
/// one codel unit); with psched's a microsecond spans 15 ticks and the dump
/// cannot tell them apart, so it is the first of them, and what `tc` shows
/// stays exact. `dumped_us` itself when no time dumps as it (a value the
/// kernel could not have dumped).
pub(crate) fn us_for_replay(dumped_us: u32, shift: u32) -> u32 {
    // The smallest t with floor(t * 2^shift / 1000) == dumped_us.
    let t = (u64::from(dumped_us) * 1000).div_ceil(1 << shift);
    if us_of_time(t, shift) != u64::from(dumped_us) {
        return dumped_us;
    }
    // The smallest us with floor(us * 1000 / 2^shift) >= t.
    let us = (t << shift).div_ceil(1000);
    match u32::try_from(us) {
        Ok(us) if us_of_time(time_of_us(us, shift), shift) == u64::from(dumped_us) => us,
        _ => dumped_us,
    }
}

/// The attributes to send to create the recorded qdisc `q`.
pub(crate) fn qdisc_attrs(q: &TcObject) -> Vec<Attr> {
    if let Some(&(_, times, shift)) = TIME_OPTIONS.iter().find(|(k, _, _)| *k == q.kind()) {
        return map_options(&q.attrs, |o| match o.as_u32() {
            Some(us) if times.contains(&o.number()) => Some(Attr {
                ty: o.ty,
                value: us_for_replay(us, shift).to_ne_bytes().to_vec(),
            }),
            _ => Some(o),
        });
    }
    if q.kind() != "htb" {
        return q.attrs.clone();
    }
    map_options(&q.attrs, |o| {
        if o.number() != TCA_HTB_INIT || o.value.len() < HTB_GLOB_LEN {
            return Some(o);
        }
        let mut glob = o.value.clone();
        let version = u32::from_ne_bytes([glob[0], glob[1], glob[2], glob[3]]);
        glob[..4].copy_from_slice(&(version >> 16).to_ne_bytes());
        glob[HTB_GLOB_DIRECT_PKTS..HTB_GLOB_LEN].fill(0);
        Some(Attr {
            ty: o.ty,
            value: glob,
        })
    })
}

/// The attributes to send to create the recorded filter `f`.
pub(crate) fn filter_attrs(f: &TcObject) -> Vec<Attr> {
    let Some(&(_, flags_attr, output_only)) = FILTER_FIXUPS.iter().find(|(k, _, _)| *k == f.kind())
    else {
        return f.attrs.clone();
    };
    map_options(&f.attrs, |o| {
        if output_only.contains(&o.number()) {
            return None;
        }
        match o.as_u32() {
            Some(flags) if o.number() == flags_attr => {
                let flags = flags & !(TCA_CLS_FLAGS_IN_HW | TCA_CLS_FLAGS_NOT_IN_HW);
                Some(Attr {
                    ty: o.ty,
                    value: flags.to_ne_bytes().to_vec(),
                })
            }
            _ => Some(o),
        }
    })
}

/// `attrs` with each attribute inside `TCA_OPTIONS` passed through `f`
/// (`None` drops it). Options that do not parse as attributes (pfifo's
/// plain struct) are left alone.
fn map_options(attrs: &[Attr], f: impl Fn(Attr) -> Option<Attr>) -> Vec<Attr> {
    attrs
        .iter()
        .map(|a| {
            if a.number() != TCA_OPTIONS {
                return a.clone();
            }
            match parse_attrs(&a.value) {
                Ok(options) => {
                    let repaired: Vec<Attr> = options.into_iter().filter_map(&f).collect();
                    Attr {
                        ty: a.ty,
                        value: encode_attrs(&repaired),
                    }
                }
                Err(_) => a.clone(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tc::message::TCA_KIND;

    #[test]
    fn a_replayed_codel_time_is_stored_as_it_was_however_often() {
        // Every stored time up to 10 s, dumped and replayed: the same time.
        for t in (0..9_765_625u64).step_by(7) {
            let dumped = u32::try_from(us_of_time(t, CODEL_SHIFT)).expect("fits");
            let replay = us_for_replay(dumped, CODEL_SHIFT);
            assert_eq!(
                time_of_us(replay, CODEL_SHIFT),
                t,
                "t {t}, dumped {dumped}, replay {replay}"
            );
        }
        // The figures of the module docs: 5ms drifts without the repair.
        assert_eq!(time_of_us(5000, CODEL_SHIFT), 4882);
        assert_eq!(us_of_time(4882, CODEL_SHIFT), 4999);
        assert_eq!(time_of_us(4999, CODEL_SHIFT), 4881);
        assert_eq!(us_for_replay(4999, CODEL_SHIFT), 5000);
    }

    #[test]
    fn a_replayed_pie_target_dumps_as_it_did_however_often() {
        // Every target a user can give up to 10 s: set, dumped, then
        // replayed twice, it dumps as the first dump each time.
        for us in (0..10_000_000u32).step_by(3) {
            let dumped = u32::try_from(us_of_time(time_of_us(us, PSCHED_SHIFT), PSCHED_SHIFT))
                .expect("fits");
            let mut shown = dumped;
            for round in 0..2 {
                let replay = us_for_replay(shown, PSCHED_SHIFT);
                shown = u32::try_from(us_of_time(time_of_us(replay, PSCHED_SHIFT), PSCHED_SHIFT))
                    .expect("fits");
                assert_eq!(shown, dumped, "target {us} us, round {round}");
            }
        }
        // Without the repair a target of 1003 us drifts by one per restore.
        assert_eq!(time_of_us(1003, PSCHED_SHIFT), 15_671);
        assert_eq!(us_of_time(15_671, PSCHED_SHIFT), 1002);
        assert_eq!(
            us_of_time(time_of_us(1002, PSCHED_SHIFT), PSCHED_SHIFT),
            1001
        );
        assert_eq!(us_for_replay(1002, PSCHED_SHIFT), 1003);
    }

    #[test]
    fn fq_codel_times_are_repaired_and_other_options_kept() {
        let target = Attr {
            ty: 1,
            value: 4999u32.to_ne_bytes().to_vec(),
        };
        let limit = Attr {
            ty: 2,
            value: 4999u32.to_ne_bytes().to_vec(),
        };
        let q = object("fq_codel", vec![target, limit]);
        let attrs = qdisc_attrs(&q);
        let opts = attrs
            .iter()
            .find(|a| a.number() == TCA_OPTIONS)
            .expect("options");
        let parsed = parse_attrs(&opts.value).expect("parses");
        assert_eq!(parsed[0].as_u32(), Some(5000), "target repaired");
        assert_eq!(parsed[1].as_u32(), Some(4999), "limit is not a time");
    }

    fn object(kind: &str, options: Vec<Attr>) -> TcObject {
        TcObject {
            handle: 1,
            parent: 0x10000,
            info: 0,
            attrs: vec![
                Attr::string(TCA_KIND, kind),
                Attr::nested(TCA_OPTIONS, &options),
            ],
        }
    }

    #[test]
    fn htb_version_is_shifted_back_and_counter_zeroed() {
        let glob: Vec<u8> = [0x30011u32, 10, 0x30, 0, 77]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let q = object(
            "htb",
            vec![Attr::bytes(TCA_HTB_INIT, &glob), Attr::u32(5, 1000)],
        );
        let attrs = qdisc_attrs(&q);
        let opts = parse_attrs(&attrs[1].value).expect("options parse");
        let want: Vec<u8> = [3u32, 10, 0x30, 0, 0]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        assert_eq!(
            opts,
            vec![Attr::bytes(TCA_HTB_INIT, &want), Attr::u32(5, 1000)]
        );
        assert_eq!(attrs[1].ty, q.attrs[1].ty, "the nested flag is kept");
    }

    #[test]
    fn offload_flags_and_counters_are_repaired() {
        let f = object(
            "u32",
            vec![
                Attr::u32(11, 0x8 | 0x1),
                Attr::bytes(9, &[0; 16]),
                Attr::u32(1, 0x10010),
            ],
        );
        let attrs = filter_attrs(&f);
        let opts = parse_attrs(&attrs[1].value).expect("options parse");
        assert_eq!(opts, vec![Attr::u32(11, 0x1), Attr::u32(1, 0x10010)]);
    }

    #[test]
    fn other_kinds_and_plain_struct_options_pass_unchanged() {
        let q = TcObject {
            handle: 1,
            parent: 0x10000,
            info: 0,
            attrs: vec![
                Attr::string(TCA_KIND, "pfifo"),
                Attr::bytes(TCA_OPTIONS, &[100, 0, 0, 0]),
            ],
        };
        assert_eq!(qdisc_attrs(&q), q.attrs);
        let odd = object("htb", vec![]);
        assert_eq!(filter_attrs(&odd), odd.attrs);
        assert!(unreplayable_qdisc("red").is_some());
        assert!(unreplayable_qdisc("htb").is_none());
    }
}
