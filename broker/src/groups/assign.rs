//! Server-side partition assignment: which member of a group should read
//! each partition of the queues its members subscribe to.
//!
//! Runs on: the coordinator's shard, whenever the group's membership or a
//! subscribed queue's partition count changes. Pure functions: members in,
//! target assignment out; the cooperative hand-over (a moved partition is
//! granted only once its old holder released it) is `group.rs`'s business.
//!
//! - `Range`: per queue, the subscribed members (in join order) take
//!   contiguous ranges; the first `n % k` take one more.
//! - `RoundRobin`: every (queue, partition), sorted, dealt in turn to the
//!   members (join order), skipping members not subscribed to the queue.
//! - `Sticky`: a partition stays with its previous member while that member
//!   is still in the group and subscribed; the rest go to the least loaded
//!   eligible member; then partitions move from the most to the least
//!   loaded member only while the counts differ by more than one. A join or
//!   a leave therefore moves as few partitions as balance allows.
//!
//! Members beyond the partition count get nothing: they are spares, and take
//! over when a rebalance finds partitions without a member.

use std::collections::BTreeMap;

/// A partition of a queue.
pub type Tp = (String, u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    Range,
    RoundRobin,
    Sticky,
}

/// A member as assignment sees it: its id and the queues it reads, in join
/// order.
#[derive(Debug, Clone)]
pub struct Subscriber {
    pub id: String,
    pub queues: Vec<String>,
}

impl Subscriber {
    fn reads(&self, queue: &str) -> bool {
        self.queues.iter().any(|q| q == queue)
    }
}

/// The target assignment: partition → member id. `counts` gives each
/// subscribed queue's partition count (queues missing from it do not exist
/// and get no assignment); `previous` is the last target (for `Sticky`).
pub fn assign(
    strategy: Strategy,
    members: &[Subscriber],
    counts: &BTreeMap<String, u32>,
    previous: &BTreeMap<Tp, String>,
) -> BTreeMap<Tp, String> {
    match strategy {
        Strategy::Range => range(members, counts),
        Strategy::RoundRobin => round_robin(members, counts),
        Strategy::Sticky => sticky(members, counts, previous),
    }
}

/// Every existing partition of the queues some member reads, sorted.
fn partitions(members: &[Subscriber], counts: &BTreeMap<String, u32>) -> Vec<Tp> {
    counts
        .iter()
        .filter(|(q, _)| members.iter().any(|m| m.reads(q)))
        .flat_map(|(q, n)| (0..*n).map(move |p| (q.clone(), p)))
        .collect()
}

fn range(members: &[Subscriber], counts: &BTreeMap<String, u32>) -> BTreeMap<Tp, String> {
    let mut out = BTreeMap::new();
    for (queue, &n) in counts {
        let readers: Vec<&Subscriber> = members.iter().filter(|m| m.reads(queue)).collect();
        if readers.is_empty() {
            continue;
        }
        let k = readers.len() as u32;
        let (each, extra) = (n / k, n % k);
        let mut next = 0;
        for (i, m) in readers.iter().enumerate() {
            let take = each + u32::from((i as u32) < extra);
            for p in next..next + take {
                out.insert((queue.clone(), p), m.id.clone());
            }
            next += take;
        }
    }
    out
}

fn round_robin(members: &[Subscriber], counts: &BTreeMap<String, u32>) -> BTreeMap<Tp, String> {
    let mut out = BTreeMap::new();
    if members.is_empty() {
        return out;
    }
    let mut turn = 0;
    for tp in partitions(members, counts) {
        // The next member (cyclically) that reads this queue; one exists,
        // since `partitions` lists only queues some member reads.
        for step in 0..members.len() {
            let m = &members[(turn + step) % members.len()];
            if m.reads(&tp.0) {
                out.insert(tp, m.id.clone());
                turn = (turn + step + 1) % members.len();
                break;
            }
        }
    }
    out
}

fn sticky(
    members: &[Subscriber],
    counts: &BTreeMap<String, u32>,
    previous: &BTreeMap<Tp, String>,
) -> BTreeMap<Tp, String> {
    let by_id: BTreeMap<&str, &Subscriber> = members.iter().map(|m| (m.id.as_str(), m)).collect();
    let mut load: BTreeMap<&str, usize> = members.iter().map(|m| (m.id.as_str(), 0)).collect();
    let mut out: BTreeMap<Tp, String> = BTreeMap::new();
    let mut free = Vec::new();
    for tp in partitions(members, counts) {
        match previous.get(&tp).and_then(|id| by_id.get(id.as_str())) {
            Some(m) if m.reads(&tp.0) => {
                *load.entry(m.id.as_str()).or_default() += 1;
                out.insert(tp, m.id.clone());
            }
            _ => free.push(tp),
        }
    }
    let order: Vec<&str> = members.iter().map(|m| m.id.as_str()).collect();
    // Least loaded eligible member, ties to the earliest joined.
    let least = |load: &BTreeMap<&str, usize>, queue: &str| -> Option<&str> {
        order
            .iter()
            .copied()
            .filter(|id| by_id[id].reads(queue))
            .min_by_key(|id| load[id])
    };
    for tp in free {
        if let Some(id) = least(&load, &tp.0) {
            *load.entry(id).or_default() += 1;
            out.insert(tp, id.to_string());
        }
    }
    // Even out: move one partition at a time from the most loaded member to
    // a member with at least two fewer that can read it. Each move lowers
    // the sum of squared loads, so this ends; the bound is a guard.
    for _ in 0..out.len() * 2 + 1 {
        let mut moved = false;
        let mut donors: Vec<&str> = order.clone();
        donors.sort_by_key(|id| std::cmp::Reverse(load[id]));
        'donors: for donor in donors {
            let held: Vec<Tp> = out
                .iter()
                .filter(|(_, id)| id.as_str() == donor)
                .map(|(tp, _)| tp.clone())
                .collect();
            for tp in held.into_iter().rev() {
                if let Some(to) = least(&load, &tp.0) {
                    if load[to] + 1 < load[donor] {
                        *load.entry(donor).or_default() -= 1;
                        *load.entry(to).or_default() += 1;
                        out.insert(tp, to.to_string());
                        moved = true;
                        break 'donors;
                    }
                }
            }
        }
        if !moved {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{prop_assert, prop_assert_eq, proptest};

    fn subs(n: usize, queues: &[&str]) -> Vec<Subscriber> {
        (0..n)
            .map(|i| Subscriber {
                id: format!("m{i}"),
                queues: queues.iter().map(|q| q.to_string()).collect(),
            })
            .collect()
    }

    fn counts(list: &[(&str, u32)]) -> BTreeMap<String, u32> {
        list.iter().map(|(q, n)| (q.to_string(), *n)).collect()
    }

    fn loads(a: &BTreeMap<Tp, String>) -> BTreeMap<String, usize> {
        let mut l = BTreeMap::new();
        for id in a.values() {
            *l.entry(id.clone()).or_default() += 1;
        }
        l
    }

    #[test]
    fn range_gives_contiguous_ranges() {
        let a = assign(
            Strategy::Range,
            &subs(2, &["q"]),
            &counts(&[("q", 5)]),
            &BTreeMap::new(),
        );
        let owners: Vec<&str> = (0..5).map(|p| a[&("q".to_string(), p)].as_str()).collect();
        assert_eq!(owners, ["m0", "m0", "m0", "m1", "m1"]);
    }

    #[test]
    fn round_robin_deals_in_turn() {
        let a = assign(
            Strategy::RoundRobin,
            &subs(3, &["a", "b"]),
            &counts(&[("a", 2), ("b", 2)]),
            &BTreeMap::new(),
        );
        let owners: Vec<&str> = a.values().map(|s| s.as_str()).collect();
        assert_eq!(owners, ["m0", "m1", "m2", "m0"]);
    }

    #[test]
    fn spares_get_nothing_and_take_over() {
        let members = subs(3, &["q"]);
        let c = counts(&[("q", 2)]);
        let a = assign(Strategy::Sticky, &members, &c, &BTreeMap::new());
        assert_eq!(a.len(), 2);
        assert_eq!(loads(&a).len(), 2, "one member is a spare");
        // The member holding partition 0 leaves: the spare takes it; the
        // other partition stays put.
        let gone = a[&("q".to_string(), 0)].clone();
        let rest: Vec<Subscriber> = members.into_iter().filter(|m| m.id != gone).collect();
        let b = assign(Strategy::Sticky, &rest, &c, &a);
        assert_eq!(b[&("q".to_string(), 1)], a[&("q".to_string(), 1)]);
        assert_ne!(b[&("q".to_string(), 0)], gone);
    }

    #[test]
    fn only_subscribers_get_a_queue() {
        let mut members = subs(2, &["a"]);
        members[1].queues = vec!["b".into()];
        for s in [Strategy::Range, Strategy::RoundRobin, Strategy::Sticky] {
            let a = assign(s, &members, &counts(&[("a", 3), ("b", 1), ("c", 4)]), &BTreeMap::new());
            assert_eq!(a.len(), 4, "{s:?}: queue c has no reader");
            for ((q, _), id) in &a {
                assert_eq!(id, if q == "a" { "m0" } else { "m1" }, "{s:?}");
            }
        }
    }

    proptest! {
        /// Every strategy assigns every partition of a subscribed queue to
        /// exactly one member, and balances within one when all members read
        /// the same queues.
        #[test]
        fn complete_and_balanced(n_members in 1usize..8, parts in 1u32..40, second in 0u32..10, seed in 0usize..3) {
            let strategy = [Strategy::Range, Strategy::RoundRobin, Strategy::Sticky][seed];
            let members = subs(n_members, &["a", "b"]);
            let c = counts(&[("a", parts), ("b", second)]);
            let a = assign(strategy, &members, &c, &BTreeMap::new());
            prop_assert_eq!(a.len() as u32, parts + second);
            let l = loads(&a);
            let total = (parts + second) as usize;
            let (lo, hi) = (total / n_members, total.div_ceil(n_members));
            if strategy != Strategy::Range {
                for m in &members {
                    let got = l.get(&m.id).copied().unwrap_or(0);
                    prop_assert!(got >= lo && got <= hi, "{:?}: {} has {}", strategy, m.id, got);
                }
            }
        }

        /// Sticky: when one member joins, a partition moves only to the new
        /// member; when one leaves, only its partitions move.
        #[test]
        fn sticky_moves_little(n_members in 1usize..8, parts in 1u32..40) {
            let c = counts(&[("q", parts)]);
            let before = subs(n_members, &["q"]);
            let a = assign(Strategy::Sticky, &before, &c, &BTreeMap::new());
            let mut after = before.clone();
            after.push(Subscriber { id: "new".into(), queues: vec!["q".into()] });
            let b = assign(Strategy::Sticky, &after, &c, &a);
            for (tp, id) in &b {
                prop_assert!(id == &a[tp] || id == "new", "{:?} moved from {} to {}", tp, a[tp], id);
            }
            let left = before[0].id.clone();
            let fewer: Vec<Subscriber> = before.iter().skip(1).cloned().collect();
            let d = assign(Strategy::Sticky, &fewer, &c, &a);
            for (tp, id) in &d {
                prop_assert!(id == &a[tp] || a[tp] == left, "{:?} moved from {} to {}", tp, a[tp], id);
            }
        }
    }
}
