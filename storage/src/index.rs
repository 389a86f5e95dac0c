//! The sparse indexes of a segment: offset → file position and timestamp →
//! offset. Both can always be rebuilt from the segment itself.
//!
//! Runs on: the shard that owns the log. Pure data structures; the log
//! reads and writes their files.
//!
//! # File formats (little-endian, no header; entries back to back)
//!
//! `<base>.index`, 8 bytes an entry:
//! ```text
//! 0  4  relative_offset  batch base offset − segment base offset
//! 4  4  position         file position of that batch in <base>.log
//! ```
//! `<base>.timeindex`, 12 bytes an entry:
//! ```text
//! 0  8  timestamp        largest record timestamp (ms) in the segment up to and
//!                        including the batch below
//! 8  4  relative_offset  base offset of that batch − segment base offset
//! ```
//! Entries rise strictly in relative offset and position (offset index) and
//! in timestamp (time index). A file whose size is not a whole number of
//! entries, whose entries do not rise, or that points past the segment is
//! damaged and gets rebuilt.
//!
//! An entry is added for a batch when at least `index_interval_bytes` of
//! batches were appended since the previous entry (and for the first batch),
//! so a lookup lands within about that many bytes of its target.

/// Bytes of one offset index entry.
pub const OFFSET_ENTRY_LEN: usize = 8;
/// Bytes of one time index entry.
pub const TIME_ENTRY_LEN: usize = 12;

/// Both indexes of one segment plus the bookkeeping to grow them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentIndex {
    /// (relative offset, position).
    offsets: Vec<(u32, u32)>,
    /// (running max timestamp, relative offset).
    times: Vec<(i64, u32)>,
    bytes_since_entry: u64,
    /// Largest timestamp of any batch seen so far.
    max_timestamp: Option<i64>,
}

impl SegmentIndex {
    pub fn new() -> SegmentIndex {
        SegmentIndex::default()
    }

    /// Accounts for a batch appended (or found by a scan) at `position`.
    /// `interval` is the index interval in bytes.
    pub fn on_batch(&mut self, relative_offset: u32, position: u32, len: u32, max_timestamp: i64, interval: u32) {
        if self.offsets.is_empty() || self.bytes_since_entry >= u64::from(interval) {
            if let Some(&(last_rel, last_pos)) = self.offsets.last() {
                assert!(
                    relative_offset > last_rel && position > last_pos,
                    "index entries must rise"
                );
            }
            self.offsets.push((relative_offset, position));
            self.bytes_since_entry = 0;
            let running = self.max_timestamp.map_or(max_timestamp, |m| m.max(max_timestamp));
            if self.times.last().is_none_or(|&(ts, _)| running > ts) {
                self.times.push((running, relative_offset));
            }
        }
        self.bytes_since_entry += u64::from(len);
        self.max_timestamp = Some(self.max_timestamp.map_or(max_timestamp, |m| m.max(max_timestamp)));
    }

    /// The largest timestamp of the batches seen so far.
    pub fn max_timestamp(&self) -> Option<i64> {
        self.max_timestamp
    }

    pub fn offset_entries(&self) -> usize {
        self.offsets.len()
    }
    pub fn time_entries(&self) -> usize {
        self.times.len()
    }

    /// The entry to start scanning from to find `relative_offset`: the
    /// largest one at or below it, else the segment's start.
    pub fn lookup_offset(&self, relative_offset: u32) -> (u32, u32) {
        let i = self.offsets.partition_point(|&(rel, _)| rel <= relative_offset);
        if i == 0 {
            (0, 0)
        } else {
            self.offsets[i - 1]
        }
    }

    /// The last indexed batch start in `(after, at_most]` (file positions),
    /// if there is one: a position where a batch begins.
    pub fn batch_start_within(&self, after: u32, at_most: u32) -> Option<u32> {
        let i = self.offsets.partition_point(|&(_, pos)| pos <= at_most);
        let pos = self.offsets.get(i.checked_sub(1)?)?.1;
        (pos > after).then_some(pos)
    }

    /// The relative offset to start scanning from to find the first batch
    /// whose max timestamp is at or after `timestamp`: every batch before the
    /// returned one has only older records.
    pub fn lookup_time(&self, timestamp: i64) -> u32 {
        let i = self.times.partition_point(|&(ts, _)| ts < timestamp);
        if i == 0 {
            0
        } else {
            self.times[i - 1].1
        }
    }

    /// Drops the entries for batches at or after `position` (truncation).
    /// The running max timestamp is kept conservative (it may stay higher
    /// than what is left; lookups then only scan more).
    pub fn truncate_to_position(&mut self, position: u32) {
        let keep = self.offsets.partition_point(|&(_, pos)| pos < position);
        self.offsets.truncate(keep);
        let last_rel = self.offsets.last().map(|&(rel, _)| rel);
        self.times.retain(|&(_, rel)| last_rel.is_some_and(|l| rel <= l));
        // Force an entry for the next batch, so positions keep rising.
        self.bytes_since_entry = u64::MAX / 2;
        if self.offsets.is_empty() {
            self.max_timestamp = None;
            self.bytes_since_entry = 0;
        }
    }

    /// The offset index file's bytes from entry `from` on.
    pub fn encode_offsets(&self, from: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity((self.offsets.len().saturating_sub(from)) * OFFSET_ENTRY_LEN);
        for &(rel, pos) in self.offsets.iter().skip(from) {
            out.extend_from_slice(&rel.to_le_bytes());
            out.extend_from_slice(&pos.to_le_bytes());
        }
        out
    }

    /// The time index file's bytes from entry `from` on.
    pub fn encode_times(&self, from: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity((self.times.len().saturating_sub(from)) * TIME_ENTRY_LEN);
        for &(ts, rel) in self.times.iter().skip(from) {
            out.extend_from_slice(&ts.to_le_bytes());
            out.extend_from_slice(&rel.to_le_bytes());
        }
        out
    }

    /// Decodes both index files of a segment whose valid data is
    /// `segment_len` bytes. Returns why the files are damaged if they are.
    /// The result's interval bookkeeping starts a fresh interval; callers
    /// that continue appending scan the batches after the last entry through
    /// [`SegmentIndex::on_batch`] anyway.
    pub fn decode(offsets: &[u8], times: &[u8], segment_len: u64) -> Result<SegmentIndex, String> {
        if offsets.len() % OFFSET_ENTRY_LEN != 0 {
            return Err(format!(
                "offset index is {} bytes, not a multiple of {OFFSET_ENTRY_LEN}",
                offsets.len()
            ));
        }
        if times.len() % TIME_ENTRY_LEN != 0 {
            return Err(format!(
                "time index is {} bytes, not a multiple of {TIME_ENTRY_LEN}",
                times.len()
            ));
        }
        let mut index = SegmentIndex::new();
        for e in offsets.chunks_exact(OFFSET_ENTRY_LEN) {
            let rel = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
            let pos = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            if let Some(&(lr, lp)) = index.offsets.last() {
                if rel <= lr || pos <= lp {
                    return Err(format!("offset index entry {} does not rise", index.offsets.len()));
                }
            } else if rel != 0 || pos != 0 {
                return Err("offset index does not start at the segment's first batch".into());
            }
            if u64::from(pos) >= segment_len {
                return Err(format!(
                    "offset index points at {pos}, past the segment's {segment_len} bytes"
                ));
            }
            index.offsets.push((rel, pos));
        }
        let last_rel = index.offsets.last().map(|&(rel, _)| rel);
        for e in times.chunks_exact(TIME_ENTRY_LEN) {
            let mut ts = [0u8; 8];
            ts.copy_from_slice(&e[..8]);
            let ts = i64::from_le_bytes(ts);
            let rel = u32::from_le_bytes([e[8], e[9], e[10], e[11]]);
            if index.times.last().is_some_and(|&(lt, lr)| ts <= lt || rel <= lr) {
                return Err(format!("time index entry {} does not rise", index.times.len()));
            }
            if last_rel.is_none_or(|l| rel > l) {
                return Err("time index points past the offset index".into());
            }
            index.times.push((ts, rel));
        }
        index.max_timestamp = index.times.last().map(|&(ts, _)| ts);
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn files_round_trip_and_lookups_bound(lens in proptest::collection::vec(1u32..50_000, 1..300),
                                             ts in proptest::collection::vec(0i64..1_000_000, 300)) {
            let mut index = SegmentIndex::new();
            let mut pos = 0u32;
            let mut batches = Vec::new();
            for (i, len) in lens.iter().enumerate() {
                index.on_batch(i as u32 * 3, pos, *len, ts[i], 32 * 1024);
                batches.push((i as u32 * 3, pos, ts[i]));
                pos += len;
            }
            let again = SegmentIndex::decode(&index.encode_offsets(0), &index.encode_times(0), u64::from(pos)).unwrap();
            prop_assert_eq!(&again.offsets, &index.offsets);
            prop_assert_eq!(&again.times, &index.times);
            for &(rel, bpos, _) in &batches {
                let (erel, epos) = index.lookup_offset(rel + 1);
                // The entry is at or before the batch, and no more than one
                // interval plus one batch behind it.
                prop_assert!(erel <= rel && epos <= bpos);
                prop_assert!(bpos - epos < 32 * 1024 + 50_000);
            }
            // Every batch before the time lookup's answer is older than the target.
            for &(_, _, t) in &batches {
                let start = index.lookup_time(t);
                prop_assert!(batches.iter().filter(|b| b.0 < start).all(|b| b.2 < t));
            }
        }
    }

    #[test]
    fn damaged_files_are_refused() {
        let mut index = SegmentIndex::new();
        index.on_batch(0, 0, 40_000, 10, 32 * 1024);
        index.on_batch(5, 40_000, 40_000, 20, 32 * 1024);
        let offs = index.encode_offsets(0);
        let times = index.encode_times(0);
        assert!(SegmentIndex::decode(&offs[..offs.len() - 1], &times, 80_000).is_err());
        assert!(SegmentIndex::decode(&offs, &times[..5], 80_000).is_err());
        assert!(
            SegmentIndex::decode(&offs, &times, 30_000).is_err(),
            "points past the segment"
        );
        let mut swapped = offs.clone();
        swapped.rotate_left(OFFSET_ENTRY_LEN);
        assert!(SegmentIndex::decode(&swapped, &times, 80_000).is_err());
    }

    #[test]
    fn truncation_drops_entries_at_and_after_the_cut() {
        let mut index = SegmentIndex::new();
        for i in 0..10u32 {
            index.on_batch(i, i * 40_000, 40_000, i64::from(i), 32 * 1024);
        }
        index.truncate_to_position(4 * 40_000);
        assert_eq!(index.offset_entries(), 4);
        assert_eq!(index.lookup_offset(9), (3, 3 * 40_000));
        index.on_batch(4, 4 * 40_000, 100, 4, 32 * 1024);
        assert_eq!(index.offset_entries(), 5);
    }
}
