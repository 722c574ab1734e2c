//! The ingress redirect of `--ingress-mode ifb` on kernels without TCX: a
//! `matchall` filter on clsact ingress whose one action is `mirred egress
//! redirect` to the IFB, the filter sqm-scripts installs with `u32` (match
//! everything) for the same job.
//!
//! Why not `bpf_redirect` there: `ifb_xmit` (drivers/net/ifb.c) drops every
//! packet whose `skb->redirected` is not set, and `bpf_redirect` sets it
//! only since "bpf: Set skb redirect and from_ingress info in __bpf_tx_skb"
//! (D. Borkmann, bpf-next, April 2023; Linux 6.4). Kernels with TCX (6.6)
//! have it; below that, only tc's own `mirred` marks the packet
//! (`skb_set_redirected` in net/sched/act_mirred.c). On Debian's 6.1 the
//! IFB counted every BPF-redirected packet in `rx_dropped`.
//!
//! Wire format (include/uapi/linux/pkt_cls.h, tc_act/tc_mirred.h): the
//! filter's `TCA_OPTIONS` holds `TCA_MATCHALL_ACT`, a list of actions
//! numbered from 1, each `TCA_ACT_KIND` "mirred" plus `TCA_ACT_OPTIONS` with
//! `TCA_MIRRED_PARMS`, a 28-byte `struct tc_mirred`.
//!
//! Invariants: the filter is created with `NLM_F_EXCL` and priority 0 (the
//! kernel picks one below any existing filter's), and its priority and
//! handle come from the kernel's echo, so [`delete_ingress_redirect`]
//! removes exactly it. Non-goals: matching some packets only; redirects to
//! anything but an egress.

use super::message::{
    Attr, RTM_DELTFILTER, RTM_NEWTFILTER, TCA_KIND, TCA_OPTIONS, TcMessage, TcMsg,
};
use super::netlink::{NLM_F_CREATE, NLM_F_ECHO, NLM_F_EXCL, Netlink};
use super::{TcError, iface, open};

/// clsact's ingress hook: `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)`.
pub const CLSACT_INGRESS: u32 = 0xffff_fff2;
/// `ETH_P_ALL`: the filter sees every protocol.
const ETH_P_ALL: u16 = 0x0003;
/// The handle the filter asks for (matchall has one filter per priority).
const FILTER_HANDLE: u32 = 1;
/// `TCA_MATCHALL_ACT`.
const TCA_MATCHALL_ACT: u16 = 2;
/// `TCA_ACT_KIND`, `TCA_ACT_OPTIONS`.
const TCA_ACT_KIND: u16 = 1;
const TCA_ACT_OPTIONS: u16 = 2;
/// `TCA_MIRRED_PARMS`.
const TCA_MIRRED_PARMS: u16 = 2;
/// `TCA_EGRESS_REDIR`: move the packet to the target's egress.
const TCA_EGRESS_REDIR: i32 = 1;
/// `TC_ACT_STOLEN`: what `tc ... mirred egress redirect` sets as the
/// action's verdict (the packet is consumed).
const TC_ACT_STOLEN: i32 = 4;

/// Where [`add_ingress_redirect`] put its filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FilterId {
    /// The filter's priority (`pref` in `tc filter show`).
    pub priority: u16,
    /// The filter's handle.
    pub handle: u32,
}

/// `struct tc_mirred` for an egress redirect to `target_ifindex`: `tc_gen`
/// (index, capab, action, refcnt, bindcnt), then eaction and ifindex, all
/// 32-bit in host order.
fn mirred_parms(target_ifindex: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(28);
    for word in [0u32, 0] {
        p.extend_from_slice(&word.to_ne_bytes()); // index (kernel picks), capab
    }
    p.extend_from_slice(&TC_ACT_STOLEN.to_ne_bytes());
    for word in [0i32, 0] {
        p.extend_from_slice(&word.to_ne_bytes()); // refcnt, bindcnt
    }
    p.extend_from_slice(&TCA_EGRESS_REDIR.to_ne_bytes());
    p.extend_from_slice(&target_ifindex.to_ne_bytes());
    p
}

/// The request body that adds the filter to `ifindex`'s clsact ingress.
fn new_filter_body(ifindex: u32, target_ifindex: u32) -> Vec<u8> {
    let action = Attr::nested(
        1,
        &[
            Attr::string(TCA_ACT_KIND, "mirred"),
            Attr::nested(
                TCA_ACT_OPTIONS,
                &[Attr::bytes(TCA_MIRRED_PARMS, &mirred_parms(target_ifindex))],
            ),
        ],
    );
    let tcm = TcMsg {
        ifindex,
        handle: FILTER_HANDLE,
        parent: CLSACT_INGRESS,
        info: info(0),
    };
    TcMessage::encode(
        tcm,
        &[
            Attr::string(TCA_KIND, "matchall"),
            Attr::nested(TCA_OPTIONS, &[Attr::nested(TCA_MATCHALL_ACT, &[action])]),
        ],
    )
}

/// `tcm_info` of a filter: `TC_H_MAKE(priority << 16, htons(ETH_P_ALL))`.
fn info(priority: u16) -> u32 {
    (u32::from(priority) << 16) | u32::from(ETH_P_ALL.to_be())
}

/// Adds the match-everything filter that redirects all of `ifindex`'s
/// ingress to the egress of `target_ifindex`. Needs clsact on `ifindex`.
pub fn add_ingress_redirect(ifindex: u32, target_ifindex: u32) -> Result<FilterId, TcError> {
    let mut nl = open()?;
    add_with(&mut nl, ifindex, target_ifindex)
}

pub(super) fn add_with(
    nl: &mut Netlink,
    ifindex: u32,
    target_ifindex: u32,
) -> Result<FilterId, TcError> {
    let what = || {
        format!(
            "matchall filter with a mirred redirect on {} ingress",
            iface(ifindex)
        )
    };
    let replies = nl
        .request(
            RTM_NEWTFILTER,
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO,
            &new_filter_body(ifindex, target_ifindex),
        )
        .map_err(TcError::request("add", what()))?;
    replies
        .iter()
        .filter_map(|body| TcMessage::decode(body).ok())
        .find(|m| m.header.ifindex == ifindex && m.header.parent == CLSACT_INGRESS)
        .map(|m| FilterId {
            priority: u16::try_from(m.header.info >> 16).unwrap_or(0),
            handle: m.header.handle,
        })
        .ok_or_else(|| TcError::Malformed {
            op: "add",
            what: what(),
            detail: "the kernel did not echo the new filter".into(),
        })
}

/// Deletes the filter `id` from `ifindex`'s clsact ingress. Already gone
/// (`ENOENT`, or `EINVAL` when its priority's list went with it) is fine.
pub fn delete_ingress_redirect(ifindex: u32, id: FilterId) -> Result<(), TcError> {
    let mut nl = open()?;
    let tcm = TcMsg {
        ifindex,
        handle: id.handle,
        parent: CLSACT_INGRESS,
        info: info(id.priority),
    };
    let body = TcMessage::encode(tcm, &[Attr::string(TCA_KIND, "matchall")]);
    match nl.request(RTM_DELTFILTER, 0, &body) {
        Err(e) if matches!(e.errno(), Some(libc::ENOENT | libc::EINVAL)) => Ok(()),
        other => other.map(|_| ()).map_err(TcError::request(
            "delete",
            format!(
                "matchall filter pref {} on {} ingress",
                id.priority,
                iface(ifindex)
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::message::{find, parse_attrs};
    use super::*;

    #[test]
    fn the_filter_redirects_everything_to_the_target_egress() {
        let body = new_filter_body(7, 9);
        let m = TcMessage::decode(&body).expect("must decode");
        assert_eq!(m.header.parent, CLSACT_INGRESS);
        // Priority 0 (the kernel picks), protocol ETH_P_ALL in network order.
        assert_eq!(m.header.info, 0x0300);
        assert_eq!(
            find(&m.attrs, TCA_KIND).and_then(Attr::as_str),
            Some("matchall")
        );
        let opts =
            parse_attrs(&find(&m.attrs, TCA_OPTIONS).expect("options").value).expect("must parse");
        let acts = parse_attrs(&find(&opts, TCA_MATCHALL_ACT).expect("actions").value)
            .expect("must parse");
        assert_eq!(acts.len(), 1);
        assert_eq!(acts[0].number(), 1, "actions are numbered from 1");
        let act = parse_attrs(&acts[0].value).expect("must parse");
        assert_eq!(
            find(&act, TCA_ACT_KIND).and_then(Attr::as_str),
            Some("mirred")
        );
        let o = parse_attrs(&find(&act, TCA_ACT_OPTIONS).expect("opts").value).expect("parse");
        let parms = &find(&o, TCA_MIRRED_PARMS).expect("parms").value;
        assert_eq!(parms.len(), 28, "sizeof(struct tc_mirred)");
        let word = |i: usize| i32::from_ne_bytes(parms[i * 4..i * 4 + 4].try_into().expect("4"));
        assert_eq!(word(2), TC_ACT_STOLEN);
        assert_eq!(word(5), TCA_EGRESS_REDIR);
        assert_eq!(word(6), 9, "target ifindex");
    }

    #[test]
    fn info_puts_the_priority_above_the_protocol() {
        assert_eq!(info(49152), 0xc000_0300);
    }
}
