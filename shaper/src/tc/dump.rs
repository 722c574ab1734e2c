//! Reading the egress tree of one interface from the kernel.
//!
//! Order of questions: qdiscs (`RTM_GETQDISC`), classes (`RTM_GETTCLASS`),
//! then per qdisc and per class of the tree its filters (`RTM_GETTFILTER`)
//! and chains (`RTM_GETCHAIN`), then for every u32 filter its root table.
//!
//! Scope: the tree under `TC_H_ROOT`. The ingress/clsact qdisc (parent
//! `TC_H_INGRESS`) and its filters are left out, so restore never sees them.
//! Default children with handle 0 are listed (they show in `tc qdisc show`)
//! but cannot carry classes of their own or filters.
//!
//! The result is not yet checked for restorability; `check` does that.
//! Known problems that only the raw dump shows (rate estimators, visible
//! only in the statistics that are dropped here) are returned alongside.

use super::filters::U32_ROOT_ALIAS;
use super::message::{
    Attr, Handle, OUTPUT_ONLY, RTM_GETCHAIN, RTM_GETTCLASS, RTM_GETTFILTER, RTM_NEWCHAIN,
    RTM_NEWTCLASS, RTM_NEWTFILTER, TC_H_INGRESS, TC_H_ROOT, TCA_CHAIN, TCA_KIND, TCA_STATS2,
    TcMessage, TcMsg, find, parse_attrs,
};
use super::netlink::Netlink;
use super::{Snapshot, TcError, TcObject, U32Root, dump_qdiscs, iface};

/// `TCA_STATS_RATE_EST` and `TCA_STATS_RATE_EST64` inside `TCA_STATS2`
/// (include/uapi/linux/gen_stats.h): present only while a rate estimator
/// runs (`gnet_stats_copy_rate_est` in net/core/gen_stats.c).
const TCA_STATS_RATE_EST: u16 = 2;
const TCA_STATS_RATE_EST64: u16 = 5;

/// Dumps the egress tree of `ifindex`, plus problems found on the way.
pub(crate) fn dump_tree(
    nl: &mut Netlink,
    ifindex: u32,
) -> Result<(Snapshot, Vec<TcError>), TcError> {
    let name = iface(ifindex);
    let mut problems = Vec::new();
    let mut qdiscs = Vec::new();
    for m in dump_qdiscs(nl, ifindex)? {
        if m.header.parent == TC_H_INGRESS {
            continue;
        }
        let what = format!(
            "qdisc {} {} on {name}",
            kind_of(&m),
            Handle(m.header.handle)
        );
        qdiscs.push(object(m, false, &what, &mut problems));
    }
    // The root first; the rest keep dump order.
    qdiscs.sort_by_key(|q| q.parent != TC_H_ROOT);
    let majors: Vec<u32> = qdiscs.iter().map(|q| q.handle >> 16).collect();

    let mut classes = Vec::new();
    for m in dump(
        nl,
        ifindex,
        RTM_GETTCLASS,
        RTM_NEWTCLASS,
        0,
        &format!("classes of {name}"),
    )? {
        if m.header.ifindex == ifindex && majors.contains(&(m.header.handle >> 16)) {
            let what = format!(
                "class {} {} on {name}",
                kind_of(&m),
                Handle(m.header.handle)
            );
            classes.push(object(m, false, &what, &mut problems));
        }
    }

    // Filters hang off qdiscs with a handle and off classes of such qdiscs.
    let parents: Vec<u32> = qdiscs
        .iter()
        .map(|q| q.handle)
        .chain(classes.iter().map(|c| c.handle))
        .filter(|h| h >> 16 != 0)
        .collect();
    let mut filters = Vec::new();
    let mut chains = Vec::new();
    for parent in parents {
        let what = format!("filters of {} on {name}", Handle(parent));
        let mine = dump(nl, ifindex, RTM_GETTFILTER, RTM_NEWTFILTER, parent, &what)?
            .into_iter()
            .map(|m| TcObject {
                parent,
                ..object(m, true, &what, &mut problems)
            });
        filters.extend(mine);
        let what = format!("filter chains of {} on {name}", Handle(parent));
        for m in dump_chains(nl, ifindex, parent, &what)? {
            chains.push(TcObject {
                parent,
                ..object(m, false, &what, &mut problems)
            });
        }
    }

    let mut u32_roots = Vec::new();
    for f in filters
        .iter()
        .filter(|f| f.handle == 0 && f.kind() == "u32")
    {
        let handle = u32_root(nl, ifindex, f, &name)?;
        u32_roots.push(U32Root {
            parent: f.parent,
            chain: f.chain(),
            info: f.info,
            handle,
        });
    }
    Ok((
        Snapshot {
            ifindex,
            qdiscs,
            classes,
            chains,
            filters,
            u32_roots,
        },
        problems,
    ))
}

/// Dumps one message type for `parent` (0: all) and decodes the answers.
fn dump(
    nl: &mut Netlink,
    ifindex: u32,
    ty: u16,
    reply: u16,
    parent: u32,
    what: &str,
) -> Result<Vec<TcMessage>, TcError> {
    let body = TcMessage::encode(
        TcMsg {
            ifindex,
            parent,
            ..TcMsg::default()
        },
        &[],
    );
    let bodies = nl
        .dump(ty, reply, &body)
        .map_err(TcError::request("dump", what))?;
    bodies
        .iter()
        .map(|b| TcMessage::decode(b))
        .collect::<Result<_, _>>()
        .map_err(|detail| TcError::Malformed {
            op: "dump",
            what: what.to_owned(),
            detail,
        })
}

/// Chains of `parent`; none on kernels without `RTM_GETCHAIN` (before 4.19).
fn dump_chains(
    nl: &mut Netlink,
    ifindex: u32,
    parent: u32,
    what: &str,
) -> Result<Vec<TcMessage>, TcError> {
    match dump(nl, ifindex, RTM_GETCHAIN, RTM_NEWCHAIN, parent, what) {
        Err(e) if e.errno() == Some(libc::EOPNOTSUPP) => Ok(Vec::new()),
        other => other,
    }
}

/// Asks which root hash table the u32 filter `header` owns: a get with
/// handle `TC_U32_ROOT` answers with `tp->root` (`u32_get`, cls_u32.c).
fn u32_root(nl: &mut Netlink, ifindex: u32, header: &TcObject, name: &str) -> Result<u32, TcError> {
    let what = format!(
        "the root table of u32 filter pref {} on {} of {name}",
        header.prio(),
        Handle(header.parent)
    );
    let tcm = TcMsg {
        ifindex,
        handle: U32_ROOT_ALIAS,
        parent: header.parent,
        info: header.info,
    };
    let body = TcMessage::encode(
        tcm,
        &[
            Attr::string(TCA_KIND, "u32"),
            Attr::u32(TCA_CHAIN, header.chain()),
        ],
    );
    let replies = nl
        .request(RTM_GETTFILTER, 0, &body)
        .map_err(TcError::request("get", what.clone()))?;
    let reply = replies.first().ok_or_else(|| TcError::Malformed {
        op: "get",
        what: what.clone(),
        detail: "no reply".into(),
    })?;
    let m = TcMessage::decode(reply).map_err(|detail| TcError::Malformed {
        op: "get",
        what,
        detail,
    })?;
    Ok(m.header.handle)
}

/// A snapshot object from a dumped message: output-only attributes dropped,
/// `tcm_info` kept only for filters. Records a running rate estimator.
fn object(m: TcMessage, keep_info: bool, what: &str, problems: &mut Vec<TcError>) -> TcObject {
    if let Some(stats) = find(&m.attrs, TCA_STATS2)
        && let Ok(stats) = parse_attrs(&stats.value)
        && stats
            .iter()
            .any(|a| matches!(a.number(), TCA_STATS_RATE_EST | TCA_STATS_RATE_EST64))
    {
        problems.push(TcError::Unrestorable {
            what: what.to_owned(),
            reason: "it has a rate estimator (tc ... estimator), and the kernel does not dump \
                     the estimator's interval and time constant"
                .into(),
        });
    }
    let attrs = m
        .attrs
        .into_iter()
        .filter(|a| !OUTPUT_ONLY.contains(&a.number()))
        .collect();
    TcObject {
        handle: m.header.handle,
        parent: m.header.parent,
        info: if keep_info { m.header.info } else { 0 },
        attrs,
    }
}

fn kind_of(m: &TcMessage) -> &str {
    find(&m.attrs, TCA_KIND)
        .and_then(Attr::as_str)
        .unwrap_or("?")
}
