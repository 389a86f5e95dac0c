//! Newtypes that keep offsets and leader epochs apart from plain integers.

use std::fmt;

/// A record's position in its partition: 0 for the first record ever appended,
/// then one more for each record. Offsets are never reused, even after
/// retention deletes old segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Offset(pub u64);

impl Offset {
    pub const ZERO: Offset = Offset(0);

    /// The offset `n` records later.
    pub fn plus(self, n: u64) -> Offset {
        Offset(self.0 + n)
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The epoch of the partition leader that appended a batch; replication uses
/// it to find where a follower's log diverged from the leader's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LeaderEpoch(pub u32);

impl fmt::Display for LeaderEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
