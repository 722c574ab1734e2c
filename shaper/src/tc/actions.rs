//! Waiting for the actions of deleted filters to be released before the
//! recorded filters are created again.
//!
//! Why: deleting a qdisc unlinks its filters at once but frees them later
//! (`tcf_queue_work`: after an RCU grace period, on `tc_filter_wq`), and
//! with them the references they hold on their actions. A filter created
//! meanwhile with the same action index binds to the old action instead of
//! creating one (`tcf_idr_check_alloc` in net/sched/act_api.c), so `tc`
//! shows `ref 2 bind 2` until the old filter's work runs. Waiting until each
//! recorded action index is free or unbound (a standalone action made with
//! `tc actions add` stays, with `bindcnt` 0) gives the recorded counts.
//!
//! Actions are found in the filter options of the classifiers listed in
//! `ACTION_LISTS`; each action's index is the first field of the `tc_gen`
//! header that starts every action's parameter struct (pkt_cls.h). Actions
//! of other classifiers are not waited for; the restore is still correct,
//! only their reference counts may read high for a moment.

use std::time::{Duration, Instant};

use super::TcObject;
use super::message::{Attr, TCA_OPTIONS, encode_attrs, find, parse_attrs};
use super::netlink::Netlink;

const RTM_GETACTION: u16 = 50;
/// `TCA_ACT_TAB` (= `TCA_ROOT_TAB`) in rtnetlink.h.
const TCA_ACT_TAB: u16 = 1;
/// `TCA_ACT_KIND`, `TCA_ACT_OPTIONS`, `TCA_ACT_INDEX` in pkt_cls.h.
const TCA_ACT_KIND: u16 = 1;
const TCA_ACT_OPTIONS: u16 = 2;
const TCA_ACT_INDEX: u16 = 3;
/// Offset of `bindcnt` in `tc_gen` (index, capab, action, refcnt, bindcnt)
/// and in `struct tc_police` (5 words, two 12-byte `tc_ratespec`, refcnt).
const TC_GEN_BINDCNT: usize = 16;
const TC_POLICE_BINDCNT: usize = 48;

/// The option carrying a classifier's action list (`TCA_<KIND>_ACT`).
const ACTION_LISTS: [(&str, u16); 8] = [
    ("u32", 7),
    ("bpf", 1),
    ("flower", 3),
    ("matchall", 2),
    ("basic", 3),
    ("fw", 4),
    ("route", 6),
    ("cgroup", 1),
];

/// How long to wait for the kernel's deferred filter destruction.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);
const SETTLE_POLL: Duration = Duration::from_millis(10);

/// `(kind, index)` of every action in the recorded filters.
pub(crate) fn recorded_actions(filters: &[TcObject]) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for f in filters {
        let Some(&(_, list_attr)) = ACTION_LISTS.iter().find(|(k, _)| *k == f.kind()) else {
            continue;
        };
        let Some(options) = f.options().and_then(|o| parse_attrs(&o.value).ok()) else {
            continue;
        };
        let Some(list) = find(&options, list_attr).and_then(|l| parse_attrs(&l.value).ok()) else {
            continue;
        };
        for action in list.iter().filter_map(|a| parse_attrs(&a.value).ok()) {
            let kind = find(&action, TCA_ACT_KIND).and_then(Attr::as_str);
            let index = find(&action, TCA_ACT_OPTIONS)
                .and_then(|o| parse_attrs(&o.value).ok())
                .and_then(|o| tc_gen(kind?, &o).map(|g| g.0));
            if let (Some(kind), Some(index)) = (kind, index)
                && !out.iter().any(|(k, i)| k == kind && *i == index)
            {
                out.push((kind.to_owned(), index));
            }
        }
    }
    out
}

/// `(index, bindcnt)` from the parameter struct among an action's options:
/// the first attribute long enough to hold it (every action dumps its
/// parameters first, e.g. `tcf_mirred_dump`). police's `tc_police` has the
/// index first too, but `bindcnt` after two rate specs.
fn tc_gen(kind: &str, options: &[Attr]) -> Option<(u32, u32)> {
    let bindcnt_at = if kind == "police" {
        TC_POLICE_BINDCNT
    } else {
        TC_GEN_BINDCNT
    };
    let p = options.iter().find(|a| a.value.len() >= bindcnt_at + 4)?;
    let word = |at: usize| {
        u32::from_ne_bytes([
            p.value[at],
            p.value[at + 1],
            p.value[at + 2],
            p.value[at + 3],
        ])
    };
    Some((word(0), word(bindcnt_at)))
}

/// Waits until none of `actions` is bound to a filter any more. Gives up
/// quietly after `SETTLE_TIMEOUT` (logged): the restore is still correct.
pub(crate) fn wait_until_unbound(nl: &mut Netlink, actions: &[(String, u32)]) {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    for (kind, index) in actions {
        while is_bound(nl, kind, *index) {
            if Instant::now() >= deadline {
                tracing::warn!(kind = %kind, index, "old tc action still bound after the filters were deleted");
                return;
            }
            std::thread::sleep(SETTLE_POLL);
        }
    }
}

/// True if action `kind` `index` exists and is bound to some filter.
fn is_bound(nl: &mut Netlink, kind: &str, index: u32) -> bool {
    let one = Attr::nested(
        1,
        &[
            Attr::string(TCA_ACT_KIND, kind),
            Attr::u32(TCA_ACT_INDEX, index),
        ],
    );
    let mut body = vec![0u8; 4]; // struct tcamsg: family and padding
    body.extend_from_slice(&encode_attrs(&[Attr::nested(TCA_ACT_TAB, &[one])]));
    // ENOENT (gone) and any other failure both end the wait for this one.
    let Ok(replies) = nl.request(RTM_GETACTION, 0, &body) else {
        return false;
    };
    let bindcnt = replies.first().and_then(|r| r.get(4..)).and_then(|attrs| {
        let tab = parse_attrs(attrs).ok()?;
        let actions = parse_attrs(&find(&tab, TCA_ACT_TAB)?.value).ok()?;
        let action = parse_attrs(&actions.first()?.value).ok()?;
        let options = parse_attrs(&find(&action, TCA_OPTIONS)?.value).ok()?;
        tc_gen(kind, &options).map(|g| g.1)
    });
    bindcnt.is_some_and(|b| b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tc::message::TCA_KIND;

    fn mirred(index: u32, bindcnt: u32) -> Attr {
        let parms: Vec<u8> = [index, 0, 3, 1, bindcnt, 1, 5]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let options = [
            Attr::bytes(2, &parms),
            Attr::bytes(4, &[]),
            Attr::bytes(1, &[0; 32]),
        ];
        Attr::nested(
            1,
            &[
                Attr::string(TCA_ACT_KIND, "mirred"),
                Attr::nested(TCA_ACT_OPTIONS, &options),
            ],
        )
    }

    #[test]
    fn actions_of_u32_filters_are_found_once() {
        let opts = Attr::nested(
            TCA_OPTIONS,
            &[
                Attr::u32(1, 0x10010),
                Attr::nested(7, &[mirred(4, 1), mirred(9, 1)]),
            ],
        );
        let f = TcObject {
            handle: 0x8000_0800,
            parent: 0x10000,
            info: 0,
            attrs: vec![Attr::string(TCA_KIND, "u32"), opts],
        };
        let got = recorded_actions(&[f.clone(), f]);
        assert_eq!(
            got,
            vec![("mirred".to_owned(), 4), ("mirred".to_owned(), 9)]
        );
    }

    #[test]
    fn bind_count_offsets() {
        let generic: Vec<u8> = [4u32, 0, 3, 1, 2]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        assert_eq!(tc_gen("gact", &[Attr::bytes(2, &generic)]), Some((4, 2)));
        let mut police = vec![0u8; 56];
        police[..4].copy_from_slice(&6u32.to_ne_bytes());
        police[48..52].copy_from_slice(&1u32.to_ne_bytes());
        assert_eq!(tc_gen("police", &[Attr::bytes(1, &police)]), Some((6, 1)));
        assert_eq!(tc_gen("gact", &[Attr::bytes(2, &[0; 8])]), None);
    }
}
