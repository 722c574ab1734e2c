//! Where a kernel dump is not what the create path accepts: small, named
//! repairs of recorded options before replay, and the kinds that cannot be
//! replayed at all.
//!
//! Repairs (each from reading the kernel's dump and change functions):
//! - **htb qdisc**: `htb_dump` reports `tc_htb_glob.version` as the full
//!   `HTB_VER` (`0x30011`, "ver 3.17"), while `htb_init` accepts only
//!   `HTB_VER >> 16`; the version is shifted back. `direct_pkts` in the same
//!   struct is a counter, zeroed (create ignores it).
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

/// The attributes to send to create the recorded qdisc `q`.
pub(crate) fn qdisc_attrs(q: &TcObject) -> Vec<Attr> {
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
