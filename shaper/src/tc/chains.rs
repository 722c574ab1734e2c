//! Filter chains in the order they were recorded.
//!
//! A block keeps its chains in creation order (`tcf_chain_create` appends to
//! `block->chain_list`, net/sched/cls_api.c), and both `tc chain show` and
//! `tc filter show` list them in that order. A chain is created by the first
//! filter put into it, or explicitly (`RTM_NEWCHAIN`, `tc chain add`), which
//! is the only way to get an empty chain or a chain template.
//!
//! So replay gives a chain its own request only if it needs one (it has a
//! template, or no filters), and places that request so that, per parent,
//! the chains are first touched in the recorded order: before the first
//! filter of the next recorded chain, and before its own filters. Chains
//! with filters stay implicit, as they were (an explicit chain survives the
//! deletion of its last filter, an implicit one does not). If the filter
//! order that u32 numbering demands contradicts the chain order, the
//! snapshot is refused.

use super::message::Handle;
use super::step::{Request, Step};
use super::{Snapshot, TcError, TcObject};

/// Inserts the chain requests into `steps` (filter creations in their
/// working order). See the module docs.
pub(crate) fn place(s: &Snapshot, mut steps: Vec<Step>) -> Result<Vec<Step>, TcError> {
    let mut parents: Vec<u32> = Vec::new();
    for c in &s.chains {
        if !parents.contains(&c.parent) {
            parents.push(c.parent);
        }
    }
    for parent in parents {
        let recorded: Vec<&TcObject> = s.chains.iter().filter(|c| c.parent == parent).collect();
        let has_filters = |chain: u32| {
            s.filters
                .iter()
                .any(|f| f.parent == parent && f.chain() == chain)
        };
        let needs_request = |c: &TcObject| !c.kind().is_empty() || !has_filters(c.chain());
        let first_touch = |steps: &[Step], chain: u32| {
            steps
                .iter()
                .position(|st| st.parent == parent && st.chain() == chain)
        };
        for (pos, c) in recorded
            .iter()
            .enumerate()
            .filter(|(_, c)| needs_request(c))
        {
            let next_implicit = recorded[pos + 1..]
                .iter()
                .find(|n| !needs_request(n))
                .map(|n| n.chain());
            let mut at = next_implicit
                .and_then(|n| first_touch(&steps, n))
                .unwrap_or(steps.len());
            if let Some(own) = first_touch(&steps, c.chain()) {
                at = at.min(own);
            }
            let step = Step {
                what: Request::Chain,
                parent,
                handle: 0,
                info: 0,
                attrs: c.attrs.clone(),
            };
            steps.insert(at, step);
        }
        let want: Vec<u32> = recorded.iter().map(|c| c.chain()).collect();
        let mut got: Vec<u32> = Vec::new();
        for st in steps.iter().filter(|st| st.parent == parent) {
            if !got.contains(&st.chain()) {
                got.push(st.chain());
            }
        }
        if got != want {
            let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
            return Err(TcError::Unrestorable {
                what: format!("the filter chains of {}", Handle(parent)),
                reason: format!(
                    "they were created in the order {}, but the filters can only be replayed in an \
                     order that creates them as {}",
                    list(&want),
                    list(&got)
                ),
            });
        }
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tc::message::{Attr, TC_H_ROOT, TCA_CHAIN, TCA_KIND};

    const P: u32 = 0x10000;

    fn chain(index: u32) -> TcObject {
        TcObject {
            handle: 0,
            parent: P,
            info: 0,
            attrs: vec![Attr::u32(TCA_CHAIN, index)],
        }
    }

    fn filter(index: u32, handle: u32) -> TcObject {
        TcObject {
            handle,
            parent: P,
            info: 1 << 16,
            attrs: vec![Attr::string(TCA_KIND, "bpf"), Attr::u32(TCA_CHAIN, index)],
        }
    }

    fn step(o: &TcObject) -> Step {
        Step {
            what: Request::Filter,
            parent: o.parent,
            handle: o.handle,
            info: o.info,
            attrs: o.attrs.clone(),
        }
    }

    fn snap(chains: Vec<TcObject>, filters: Vec<TcObject>) -> Snapshot {
        let root = TcObject {
            handle: P,
            parent: TC_H_ROOT,
            info: 0,
            attrs: vec![Attr::string(TCA_KIND, "htb")],
        };
        Snapshot {
            ifindex: 1,
            qdiscs: vec![root],
            classes: vec![],
            chains,
            filters,
            u32_roots: vec![],
        }
    }

    fn order(steps: &[Step]) -> Vec<(bool, u32)> {
        steps
            .iter()
            .map(|s| (s.what == Request::Chain, s.chain()))
            .collect()
    }

    #[test]
    fn empty_chains_go_where_they_were_created() {
        let filters = vec![filter(0, 1), filter(3, 2)];
        let s = snap(
            vec![chain(5), chain(0), chain(3), chain(7)],
            filters.clone(),
        );
        let steps = place(&s, filters.iter().map(step).collect()).expect("placeable");
        assert_eq!(
            order(&steps),
            vec![(true, 5), (false, 0), (false, 3), (true, 7)]
        );
    }

    #[test]
    fn contradicting_filter_order_is_refused() {
        let filters = vec![filter(0, 1), filter(3, 2)];
        let s = snap(vec![chain(3), chain(0)], filters.clone());
        let e = place(&s, filters.iter().map(step).collect()).expect_err("order cannot be kept");
        assert!(e.to_string().contains("order 3, 0"), "{e}");
    }
}
