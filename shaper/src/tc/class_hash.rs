//! A model of the kernel's `Qdisc_class_hash`, and the search for an
//! insertion order that makes it list classes in a recorded order.
//!
//! The model (net/sched/sch_api.c, include/net/sch_generic.h): 4 buckets to
//! start; `qdisc_class_hash_insert` puts a class at the head of bucket
//! `qdisc_class_hash(classid, mask)`; after each insert,
//! `qdisc_class_hash_grow` doubles the table once it is more than 3/4 full,
//! moving the classes bucket by bucket, head to tail, each to the head of its
//! new bucket. Walks list buckets in index order, each head to tail.
//!
//! The search runs the history backwards from the recorded listing: the
//! last class inserted is at the head of its bucket; undoing a growth turns
//! each new bucket into its reversed sequence, and an old bucket is any
//! interleaving of the sequences of the two new buckets it split into, so a
//! bucket is kept as a set of fixed sequences whose fronts may be taken in
//! any order. A class can be taken (un-inserted) only once none of its child
//! classes is left, since the kernel needs a parent before its children.
//! Depth-first with backtracking, within a step budget.

use std::collections::{BTreeSet, VecDeque};

/// `qdisc_class_hash_init` starts with 4 buckets.
const INITIAL_BUCKETS: usize = 4;
/// Search steps before giving up (each step un-inserts one class).
const BUDGET: usize = 50_000;

/// `qdisc_class_hash` in include/net/sch_generic.h.
fn bucket(id: u32, buckets: usize) -> usize {
    let mut id = id;
    id ^= id >> 8;
    id ^= id >> 4;
    id as usize & (buckets - 1)
}

/// The counts after whose insert the table grew, and the final size, for
/// `n` inserts without deletions.
fn growth(n: usize) -> (Vec<usize>, usize) {
    let mut size = INITIAL_BUCKETS;
    let mut grew_at = Vec::new();
    for count in 1..=n {
        if count * 4 > size * 3 {
            grew_at.push(count);
            size *= 2;
        }
    }
    (grew_at, size)
}

/// The order in which the model lists classes inserted in `ids` order.
pub(crate) fn listing(ids: &[u32]) -> Vec<u32> {
    let mut table: Vec<VecDeque<u32>> = vec![VecDeque::new(); INITIAL_BUCKETS];
    for (i, &id) in ids.iter().enumerate() {
        let b = bucket(id, table.len());
        table[b].push_front(id);
        if (i + 1) * 4 > table.len() * 3 {
            let mut grown: Vec<VecDeque<u32>> = vec![VecDeque::new(); table.len() * 2];
            for old in &table {
                for &cl in old {
                    let b = bucket(cl, grown.len());
                    grown[b].push_front(cl);
                }
            }
            table = grown;
        }
    }
    table.into_iter().flatten().collect()
}

/// An insertion order of the classes in `recorded` (a listing) that the
/// model lists as recorded, inserting each class after its parent
/// (`parent_of`). `None` if there is none within the budget, or if
/// `recorded` cannot be a listing of this model at all.
pub(crate) fn insertion_order(
    recorded: &[u32],
    parent_of: impl Fn(u32) -> Option<u32>,
) -> Option<Vec<u32>> {
    let n = recorded.len();
    let (grew_at, size) = growth(n);
    let mut table: Vec<Vec<VecDeque<u32>>> = vec![Vec::new(); size];
    for &id in recorded {
        let b = bucket(id, size);
        match table[b].first_mut() {
            Some(seq) => seq.push_back(id),
            None => table[b].push(VecDeque::from([id])),
        }
    }
    if table
        .iter()
        .flatten()
        .flatten()
        .copied()
        .collect::<Vec<u32>>()
        != recorded
    {
        return None;
    }
    let mut search = Search {
        grew_at,
        children: recorded
            .iter()
            .map(|&id| {
                recorded
                    .iter()
                    .copied()
                    .filter(|&c| parent_of(c) == Some(id))
                    .collect()
            })
            .collect(),
        ids: recorded.to_vec(),
        present: recorded.iter().copied().collect(),
        taken: Vec::with_capacity(n),
        budget: BUDGET,
    };
    if !search.undo(table, n) {
        return None;
    }
    let order: Vec<u32> = search.taken.into_iter().rev().collect();
    (listing(&order) == recorded).then_some(order)
}

struct Search {
    grew_at: Vec<usize>,
    /// Children of `ids[i]`, by index.
    children: Vec<Vec<u32>>,
    ids: Vec<u32>,
    present: BTreeSet<u32>,
    /// Classes un-inserted so far, last inserted first.
    taken: Vec<u32>,
    budget: usize,
}

impl Search {
    /// Un-inserts class number `count` and recurses; true when all are out.
    fn undo(&mut self, mut table: Vec<Vec<VecDeque<u32>>>, count: usize) -> bool {
        if count == 0 {
            return true;
        }
        if self.budget == 0 {
            return false;
        }
        self.budget -= 1;
        if self.grew_at.contains(&count) {
            table = shrink(table);
        }
        for b in 0..table.len() {
            for s in 0..table[b].len() {
                let Some(&id) = table[b][s].front() else {
                    continue;
                };
                if !self.can_take(id) {
                    continue;
                }
                let mut next = table.clone();
                next[b][s].pop_front();
                if next[b][s].is_empty() {
                    next[b].remove(s);
                }
                self.present.remove(&id);
                self.taken.push(id);
                if self.undo(next, count - 1) {
                    return true;
                }
                self.taken.pop();
                self.present.insert(id);
            }
        }
        false
    }

    /// A class can be the last inserted only if none of its children is left.
    fn can_take(&self, id: u32) -> bool {
        let Some(i) = self.ids.iter().position(|&x| x == id) else {
            return false;
        };
        !self.children[i].iter().any(|c| self.present.contains(c))
    }
}

/// Undoes one growth: bucket `j` of the half-size table holds the reversed
/// sequences of new buckets `j` and `j + half`, in any interleaving.
fn shrink(table: Vec<Vec<VecDeque<u32>>>) -> Vec<Vec<VecDeque<u32>>> {
    let half = table.len() / 2;
    let mut old: Vec<Vec<VecDeque<u32>>> = vec![Vec::new(); half];
    for (j, seqs) in table.into_iter().enumerate() {
        for seq in seqs {
            old[j % half].push(seq.into_iter().rev().collect());
        }
    }
    old
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_lists_newest_first_and_grows_at_three_quarters() {
        assert_eq!(listing(&[0x10001, 0x10010]), vec![0x10010, 0x10001]);
        assert_eq!(growth(4), (vec![4], 8));
        assert_eq!(growth(12), (vec![4, 7], 16));
        assert_eq!(growth(13), (vec![4, 7, 13], 32));
    }

    /// The order the kernel was observed to list after inserting these
    /// (from `tc class show` on 6.18, test many_classes_... in tc_restore).
    #[test]
    fn model_matches_an_observed_kernel_listing() {
        let created = [
            0x50, 0x3, 0x21, 0x7, 0x99, 0x12, 0x40, 0x33, 0x5, 0x8, 0x61, 0x2,
        ]
        .map(|m| 0x10000 | m);
        let observed = [
            0x33, 0x99, 0x2, 0x21, 0x3, 0x12, 0x40, 0x5, 0x50, 0x61, 0x7, 0x8,
        ]
        .map(|m| 0x10000 | m);
        assert_eq!(listing(&created), observed);
    }

    #[test]
    fn search_finds_an_order_respecting_parents() {
        let created: Vec<u32> = [
            0x50, 0x3, 0x21, 0x7, 0x99, 0x12, 0x40, 0x33, 0x5, 0x8, 0x61, 0x2, 0x77, 0x13, 0x1,
        ]
        .iter()
        .map(|m| 0x10000 | m)
        .collect();
        let parent_of = |c: u32| match c & 0xffff {
            0x21 | 0x33 => Some(0x10003),
            0x13 => Some(0x10012),
            _ => None,
        };
        let recorded = listing(&created);
        let order = insertion_order(&recorded, parent_of).expect("an order exists");
        assert_eq!(listing(&order), recorded);
        let pos = |id: u32| order.iter().position(|&x| x == id);
        assert!(
            pos(0x10003) < pos(0x10021)
                && pos(0x10003) < pos(0x10033)
                && pos(0x10012) < pos(0x10013)
        );
    }

    #[test]
    fn impossible_listings_are_rejected() {
        // Not grouped by bucket: no insertion order lists it.
        assert_eq!(
            insertion_order(&[0x10001, 0x10002, 0x10011], |_| None),
            None
        );
    }
}
