//! A partition log's leader-epoch history: at which offset each leader
//! epoch began. Replication asks it where a follower's log diverged from
//! the leader's ([`EpochHistory::end_offset_for`], Kafka's
//! OffsetsForLeaderEpoch).
//!
//! Runs on: the shard that owns the log, inside [`crate::Log`]. Sans I/O:
//! the log keeps it in step with its batches (append, truncation,
//! retention) and persists it as a checkpoint (`checkpoint.rs`).
//!
//! Invariant: entries are strictly increasing in both epoch and start
//! offset, because batches are appended with non-decreasing epochs; the
//! last entry's epoch is the epoch of the log's last batch.

use crate::{LeaderEpoch, Offset};

/// The first offset of a leader epoch in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochStart {
    pub epoch: LeaderEpoch,
    pub start: Offset,
}

/// A batch whose epoch is older than the log's latest: a leader never
/// appends one, and a follower must not accept one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a batch of leader epoch {batch} at offset {offset} follows epoch {latest}")]
pub struct StaleEpoch {
    pub batch: LeaderEpoch,
    pub latest: LeaderEpoch,
    pub offset: Offset,
}

/// See the module doc.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpochHistory {
    entries: Vec<EpochStart>,
}

impl EpochHistory {
    pub fn new() -> EpochHistory {
        EpochHistory::default()
    }

    /// A history from entries that must keep the invariant.
    pub fn from_entries(entries: Vec<EpochStart>) -> Result<EpochHistory, String> {
        for pair in entries.windows(2) {
            if pair[1].epoch <= pair[0].epoch || pair[1].start <= pair[0].start {
                return Err(format!(
                    "entries out of order: epoch {} at {} then epoch {} at {}",
                    pair[0].epoch, pair[0].start, pair[1].epoch, pair[1].start
                ));
            }
        }
        Ok(EpochHistory { entries })
    }

    /// [`EpochHistory::from_entries`] of `(epoch, start offset)` pairs.
    pub fn from_pairs(pairs: &[(u32, u64)]) -> Result<EpochHistory, String> {
        EpochHistory::from_entries(
            pairs
                .iter()
                .map(|(epoch, start)| EpochStart {
                    epoch: LeaderEpoch(*epoch),
                    start: Offset(*start),
                })
                .collect(),
        )
    }

    pub fn entries(&self) -> &[EpochStart] {
        &self.entries
    }

    /// The epoch of the log's last batch and where it began.
    pub fn latest(&self) -> Option<EpochStart> {
        self.entries.last().copied()
    }

    /// Notes a batch of `epoch` appended at `offset` (the log end before
    /// it). Returns whether a new epoch began; a batch of an older epoch
    /// than the latest is refused and changes nothing.
    pub fn observe(&mut self, epoch: LeaderEpoch, offset: Offset) -> Result<bool, StaleEpoch> {
        match self.entries.last() {
            Some(last) if epoch < last.epoch => Err(StaleEpoch {
                batch: epoch,
                latest: last.epoch,
                offset,
            }),
            Some(last) if epoch == last.epoch => Ok(false),
            _ => {
                self.entries.push(EpochStart { epoch, start: offset });
                Ok(true)
            }
        }
    }

    /// Where epoch `requested` ends in this log whose end is `log_end`:
    /// `(epoch, end)` with `epoch` the largest epoch here not above
    /// `requested` (or `requested` itself when it precedes every epoch
    /// here) and `end` the start of the first epoch above `requested` (the
    /// log end when `requested` is the latest). `None` when `requested` is
    /// above every epoch here, or the log has none: the asker keeps its log.
    pub fn end_offset_for(&self, requested: LeaderEpoch, log_end: Offset) -> Option<(LeaderEpoch, Offset)> {
        let latest = self.entries.last()?;
        if requested == latest.epoch {
            return Some((requested, log_end));
        }
        let higher = self.entries.iter().find(|e| e.epoch > requested)?;
        let floor = self.entries.iter().rev().find(|e| e.epoch <= requested);
        Some((floor.map_or(requested, |f| f.epoch), higher.start))
    }

    /// The log was truncated to end at `offset`: epochs that began at or
    /// after it are gone. Returns whether anything changed.
    pub fn truncate_end(&mut self, offset: Offset) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.start < offset);
        self.entries.len() != before
    }

    /// The log now starts at `offset` (retention): epochs that ended before
    /// it are gone, and the one it falls in starts there. Returns whether
    /// anything changed.
    pub fn truncate_start(&mut self, offset: Offset) -> bool {
        // The last entry starting at or before `offset` covers it.
        let Some(covering) = self.entries.iter().rposition(|e| e.start <= offset) else {
            return false;
        };
        let changed = covering > 0 || self.entries[covering].start != offset;
        self.entries.drain(..covering);
        self.entries[0].start = offset;
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(epoch: u32, start: u64) -> EpochStart {
        EpochStart {
            epoch: LeaderEpoch(epoch),
            start: Offset(start),
        }
    }

    fn history(entries: &[(u32, u64)]) -> EpochHistory {
        EpochHistory::from_pairs(entries).unwrap()
    }

    #[test]
    fn appends_start_epochs_and_refuse_older_ones() {
        let mut h = EpochHistory::new();
        assert_eq!(h.observe(LeaderEpoch(0), Offset(0)), Ok(true));
        assert_eq!(h.observe(LeaderEpoch(0), Offset(5)), Ok(false));
        assert_eq!(h.observe(LeaderEpoch(3), Offset(9)), Ok(true));
        assert_eq!(
            h.observe(LeaderEpoch(2), Offset(12)),
            Err(StaleEpoch {
                batch: LeaderEpoch(2),
                latest: LeaderEpoch(3),
                offset: Offset(12)
            })
        );
        assert_eq!(h, history(&[(0, 0), (3, 9)]));
        assert!(EpochHistory::from_entries(vec![e(1, 0), e(1, 5)]).is_err());
        assert!(EpochHistory::from_entries(vec![e(1, 5), e(2, 5)]).is_err());
    }

    #[test]
    fn end_offsets_follow_kafkas_offsets_for_leader_epoch() {
        let h = history(&[(1, 0), (3, 10), (6, 25)]);
        let end = Offset(40);
        // The latest epoch ends at the log end.
        assert_eq!(h.end_offset_for(LeaderEpoch(6), end), Some((LeaderEpoch(6), end)));
        // An epoch here ends where the next begins.
        assert_eq!(
            h.end_offset_for(LeaderEpoch(1), end),
            Some((LeaderEpoch(1), Offset(10)))
        );
        assert_eq!(
            h.end_offset_for(LeaderEpoch(3), end),
            Some((LeaderEpoch(3), Offset(25)))
        );
        // An epoch this log never had: the largest below it, ending where
        // the next one above it begins.
        assert_eq!(
            h.end_offset_for(LeaderEpoch(4), end),
            Some((LeaderEpoch(3), Offset(25)))
        );
        // Below every epoch here: the first one's start.
        let later = history(&[(5, 100)]);
        assert_eq!(
            later.end_offset_for(LeaderEpoch(2), end),
            Some((LeaderEpoch(2), Offset(100)))
        );
        // Above every epoch here, or nothing here: no answer.
        assert_eq!(h.end_offset_for(LeaderEpoch(7), end), None);
        assert_eq!(EpochHistory::new().end_offset_for(LeaderEpoch(0), end), None);
    }

    #[test]
    fn truncation_at_either_end_keeps_the_history_consistent() {
        let mut h = history(&[(1, 0), (3, 10), (6, 25)]);
        assert!(!h.truncate_end(Offset(30)));
        assert!(h.truncate_end(Offset(25)));
        assert_eq!(h, history(&[(1, 0), (3, 10)]));
        assert!(h.truncate_end(Offset(4)));
        assert_eq!(h, history(&[(1, 0)]));
        assert!(h.truncate_end(Offset(0)));
        assert_eq!(h, EpochHistory::new());

        let mut h = history(&[(1, 0), (3, 10), (6, 25)]);
        assert!(!h.truncate_start(Offset(0)));
        assert!(h.truncate_start(Offset(12)));
        assert_eq!(h, history(&[(3, 12), (6, 25)]));
        assert!(h.truncate_start(Offset(25)));
        assert_eq!(h, history(&[(6, 25)]));
        assert!(h.truncate_start(Offset(31)));
        assert_eq!(h, history(&[(6, 31)]));
        // Nothing covers an offset before the first epoch.
        let mut later = history(&[(5, 100)]);
        assert!(!later.truncate_start(Offset(50)));
    }
}
