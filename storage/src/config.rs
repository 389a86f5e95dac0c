//! Per-log configuration. The broker builds one from a queue's settings.

use crate::error::{Result, StorageError};
use crate::DMA_ALIGN;

/// When appended data is made durable with `fdatasync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Every acknowledged batch is fdatasync'd first. Batches appended while
    /// an fdatasync is in flight share the next one (group commit).
    Always,
    /// Data is written to the device at once but fdatasync'd only when
    /// `interval_ms` has passed or `interval_bytes` were written since the
    /// last one, whichever comes first.
    Interval { interval_ms: u64, interval_bytes: u64 },
}

/// How one partition log behaves. Sizes are in bytes, durations in ms.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Roll the active segment before it would grow past this. At most 4 GiB
    /// (index entries hold 32-bit file positions).
    pub segment_bytes_max: u64,
    /// Roll the active segment once its first batch is this old.
    pub segment_age_ms_max: u64,
    /// One index entry per this many bytes of batches.
    pub index_interval_bytes: u32,
    /// Largest batch accepted.
    pub batch_bytes_max: usize,
    pub fsync: FsyncPolicy,
    /// Delete sealed segments whose newest record is older than this.
    pub retention_ms: Option<u64>,
    /// Delete the oldest sealed segments while the log is larger than this.
    pub retention_bytes: Option<u64>,
    /// Appended bytes not yet handed to the disk before `append` waits for a
    /// write: bounds memory when producers outrun the disk.
    pub pending_bytes_max: usize,
    /// Most bytes of recent batches this log keeps in memory for readers
    /// near the tail (the shard's budget may hold it lower).
    pub tail_cache_bytes_max: usize,
    /// Bytes zero-filled ahead of the writer in the active segment (0 turns
    /// pre-zeroing off). See `segment::active` for when it is done.
    pub zero_ahead_bytes: u64,
    /// Stamp every batch with the broker's clock instead of the producer's.
    pub log_append_time: bool,
    /// When a roll finds sealed segments past the retention policy, reuse
    /// the largest of them as the new segment's file instead of deleting it
    /// and creating a fresh one (see `log::write`, "Recycling").
    pub recycle_segments: bool,
    /// With `fsync: Always`, open the active segment with `O_DSYNC`: each
    /// write is durable when it completes (the kernel flushes the device's
    /// cache for it — a FUA write where the device has one — and commits the
    /// file size or extents the write changed), so no fdatasync follows.
    /// Off: each write is followed by an fdatasync. See `log::write`,
    /// "Write-through".
    pub write_through: bool,
    /// With `fsync: Always` and a shard journal (`ShardStorage::start_journal`),
    /// make appends durable through the journal, one write for all of the
    /// shard's logs, and write the segment behind (`log::journaled`). Then
    /// `write_through` does not apply. Without a shard journal: no effect.
    pub journal: bool,
}

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;
pub const DAY_MS: u64 = 24 * 3600 * 1000;

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes_max: GIB,
            segment_age_ms_max: 7 * DAY_MS,
            index_interval_bytes: 32 * KIB as u32,
            batch_bytes_max: 16 * MIB as usize,
            fsync: FsyncPolicy::Always,
            retention_ms: Some(7 * DAY_MS),
            retention_bytes: None,
            pending_bytes_max: 8 * MIB as usize,
            tail_cache_bytes_max: 16 * MIB as usize,
            zero_ahead_bytes: MIB,
            log_append_time: false,
            recycle_segments: true,
            write_through: true,
            journal: true,
        }
    }
}

impl LogConfig {
    /// Largest batch the log will *read* (recovery, reads): any batch that
    /// fits in a segment. Not `batch_bytes_max`, which limits only new
    /// appends: lowering a queue's message limit must not turn batches
    /// stored under the old limit into "corruption".
    pub fn stored_batch_bytes_max(&self) -> usize {
        self.segment_bytes_max as usize
    }

    /// Whether the active segment is written through (`write_through`,
    /// which only `fsync: Always` uses).
    pub(crate) fn writes_through(&self) -> bool {
        self.write_through && self.fsync == FsyncPolicy::Always
    }

    /// Checks the relations between settings; the log refuses to open with a
    /// config that fails.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(StorageError::InvalidConfig(why));
        if self.segment_bytes_max < 64 * KIB || self.segment_bytes_max > u64::from(u32::MAX) {
            return bad(format!(
                "segment_bytes_max {} must be in [64 KiB, 4 GiB)",
                self.segment_bytes_max
            ));
        }
        if (self.batch_bytes_max as u64) > self.segment_bytes_max {
            return bad(format!(
                "batch_bytes_max {} is larger than segment_bytes_max {}",
                self.batch_bytes_max, self.segment_bytes_max
            ));
        }
        if self.batch_bytes_max > u32::MAX as usize {
            return bad("batch_bytes_max must fit in 32 bits".into());
        }
        if self.index_interval_bytes == 0 {
            return bad("index_interval_bytes must be > 0".into());
        }
        if self.segment_age_ms_max == 0 {
            return bad("segment_age_ms_max must be > 0".into());
        }
        if self.zero_ahead_bytes % DMA_ALIGN != 0 {
            return bad(format!("zero_ahead_bytes must be a multiple of {DMA_ALIGN}"));
        }
        if let FsyncPolicy::Interval {
            interval_ms,
            interval_bytes,
        } = self.fsync
        {
            if interval_ms == 0 && interval_bytes == 0 {
                return bad("an fsync interval needs ms or bytes".into());
            }
        }
        Ok(())
    }
}
