//! Which shard owns a partition.
//!
//! Runs on: every shard (a request that arrives on the wrong shard is
//! forwarded to the owner; see DESIGN.md §5).
//!
//! The owner is `(fnv1a64(queue name) + partition) mod shards`: a pure
//! function of the queue's name, the partition and the shard count, the
//! same on every shard and across restarts (FNV-1a is fixed by its
//! definition, unlike `std`'s hasher). Consecutive partitions of one queue
//! land on consecutive shards, so a queue with at least as many partitions
//! as shards uses them all evenly; the name's hash offsets queues from each
//! other so that partition 0 of every queue is not on shard 0.

use std::fmt;

/// A shard of one node: the index of its core's executor, `0..shards`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId(pub u16);

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard {}", self.0)
    }
}

pub use strand_wire::fnv1a64;

/// The shard that owns `partition` of `queue` on a node with `shards`
/// shards. Panics if `shards` is 0 (a node has at least one).
pub fn shard_for(queue: &str, partition: u32, shards: u16) -> ShardId {
    ShardId(strand_wire::shard_for_partition(queue, partition, shards))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_shard_owns_everything() {
        for p in 0..100 {
            assert_eq!(shard_for("orders", p, 1), ShardId(0));
        }
    }

    proptest! {
        #[test]
        fn partitions_spread_evenly(name in "[a-z]{1,20}", shards in 1u16..64, rounds in 1u32..5) {
            let mut count = vec![0u32; usize::from(shards)];
            for p in 0..u32::from(shards) * rounds {
                let s = shard_for(&name, p, shards);
                prop_assert!(s.0 < shards);
                prop_assert_eq!(s, shard_for(&name, p, shards), "pure");
                count[usize::from(s.0)] += 1;
            }
            // N × shards consecutive partitions: exactly N on every shard.
            prop_assert!(count.iter().all(|&c| c == rounds));
        }
    }
}
