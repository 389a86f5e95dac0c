//! The partition log: a run of segments with one API — append, read, find
//! by time, truncate, make durable, enforce retention.
//!
//! Runs on: the shard that owns the partition. A [`Log`] is a cheap,
//! `!Send` handle (`Rc`); many tasks of the shard may use it at once
//! (producers appending, consumers reading, the retention timer). State
//! lives in a `RefCell` that is never borrowed across an `.await`; the file
//! I/O that reshapes the log (writes, fdatasync, roll, truncate) is
//! serialised by a one-permit semaphore, the *I/O lock*; fdatasync by a
//! second one, the *sync lock* (taken after the I/O lock when both are
//! needed).
//!
//! # Offsets
//! - *log start*: the first offset still stored (retention moves it up).
//! - *log end*: the offset the next appended record gets.
//! - *written*: every offset below it has been handed to the disk.
//! - *flushed*: every offset below it has been fdatasync'd: durable.
//! - *high watermark*: set by replication; what consumers may see. With one
//!   replica the broker moves it to the flushed or written offset. Kept
//!   across restarts by a lazily written checkpoint (`replica.rs`): a
//!   reopened log starts from it, not from its log end.
//!
//! # Leader epochs
//! Every batch carries the epoch of the leader that appended it; the log
//! keeps the history of where each epoch began (`crate::epochs`,
//! checkpointed beside the segments) in step with appends, truncation and
//! retention, for replication to find where a follower diverged.
//! [`Log::append`] stamps the leader's epoch; [`Log::append_replica`]
//! keeps a replicated batch as the leader stored it.
//!
//! # Group commit
//! `append` only stamps the batch and queues it (memory). A producer with
//! acks ≥ 1 then awaits [`Log::wait_durable`]. Making a batch durable takes
//! two steps, each behind its own lock: *write* (everything queued, in one
//! aligned write; the I/O lock) and *sync* (one fdatasync covering every
//! write completed before it; the sync lock). A waiter whose step is free
//! takes it for everyone queued so far; a waiter whose step is busy does not
//! queue on the lock but sleeps until some lock is released, then looks
//! again — most find their batch already durable. So one fdatasync serves
//! every producer of a round, and the next round's write runs while the
//! previous round's fdatasync is in flight.
//!
//! # Memory per partition
//! An idle open log holds: the `Log` and its state (≈ 1 KiB), its active
//! segment's partial last block (< 4 KiB), the active segment's index
//! (8 + 12 bytes per ~32 KiB of data: ≤ 640 KiB for a full 1 GiB segment,
//! nothing for an empty one), ≈ 100 bytes per sealed segment, and whatever
//! the tail cache holds (bounded per log and by the shard's budget). The
//! `many_partitions` test measures it: 1,000 partitions with four 64 KiB
//! segments each cost ≈ 34 KB of RSS per partition, of which ≈ 24.5 KiB is
//! tail cache (its limit there is 32 KiB) and ≈ 4 KiB the active segment's
//! bookkeeping. An appending log also holds a staging buffer for its next
//! write (64 KiB, doubling up to what is pending) and up to three ~4 MiB
//! read-ahead blocks while a reader goes through old data (plus any block
//! a batch handed out still slices, until that batch is dropped).
//!
//! # What opening checks
//! Sealed segments: the batches after their last index entry (CRC and
//! offsets) and that the file ends exactly after the last one; a damaged
//! one fails the open, naming the file. The active segment: every batch
//! from its last index entry on; the log is cut before the first torn,
//! zero or corrupt one. Bytes before the last index entry are trusted at
//! open (as Kafka trusts what precedes its recovery point); reads check
//! framing and offsets, and consumers check each batch's CRC.

mod journaled;
mod maintain;
mod producers;
mod read;
mod readahead;
pub(crate) use journaled::read_journal_id;
pub use journaled::JOURNAL_ID_FILE;
pub use readahead::foreign_drops;
mod replica;
mod write;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::DmaFile;
use glommio::sync::Semaphore;
use tracing::warn;

use crate::checkpoint::{self, CLEAN_CLOSE_FILE, DAMAGE_FILE};
use crate::config::{FsyncPolicy, LogConfig};
use crate::error::{Result, StorageError};
use crate::notify::Notify;
use crate::scan::ScanEnd;
use crate::segment::active::{ActiveSegment, Recovered};
use crate::segment::io::{align_down, read_range};
use crate::segment::recover::{load_sealed, load_segment, valid_batch_follows, write_index_files};
use crate::segment::{log_file_name, parse_log_file_name, SealedSegment};
use crate::shard::ShardStorage;
use crate::tail_cache::TailCache;
use crate::Offset;

pub use crate::tail_cache::ReadBatches;

/// What an append assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: Offset,
    pub last_offset: Offset,
    /// The batch's max timestamp as stored (the broker's clock on
    /// log-append-time logs).
    pub max_timestamp: i64,
    pub bytes: usize,
}

/// Counters of the I/O a log has done since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Aligned data writes.
    pub writes: u64,
    /// fdatasync calls on the active segment.
    pub syncs: u64,
    /// Writes made durable as they completed (`LogConfig::write_through`):
    /// each one a flush of its own, with no fdatasync after it.
    pub write_through_writes: u64,
    /// Bytes of batches written.
    pub bytes_written: u64,
    /// Segments rolled.
    pub rolls: u64,
    /// Rolls whose new segment reused an expired segment's file.
    pub recycled: u64,
    /// Time spent in data writes and in fdatasync (summed, ns).
    pub write_ns: u64,
    pub sync_ns: u64,
    /// fdatasync latencies: counts per bucket of [`SYNC_BUCKETS_SECS`] (the
    /// last: above every bound).
    pub sync_buckets: [u64; SYNC_BUCKETS_SECS.len() + 1],
}

/// Upper bounds (seconds) of the fdatasync latency buckets in [`LogStats`].
pub const SYNC_BUCKETS_SECS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0,
];

impl LogStats {
    /// The I/O done between `earlier` (a snapshot of the same log) and
    /// `self`: every counter and bucket, subtracted.
    pub fn since(&self, earlier: &LogStats) -> LogStats {
        let mut sync_buckets = self.sync_buckets;
        for (bucket, before) in sync_buckets.iter_mut().zip(earlier.sync_buckets) {
            *bucket = bucket.saturating_sub(before);
        }
        LogStats {
            writes: self.writes.saturating_sub(earlier.writes),
            syncs: self.syncs.saturating_sub(earlier.syncs),
            write_through_writes: self.write_through_writes.saturating_sub(earlier.write_through_writes),
            bytes_written: self.bytes_written.saturating_sub(earlier.bytes_written),
            rolls: self.rolls.saturating_sub(earlier.rolls),
            recycled: self.recycled.saturating_sub(earlier.recycled),
            write_ns: self.write_ns.saturating_sub(earlier.write_ns),
            sync_ns: self.sync_ns.saturating_sub(earlier.sync_ns),
            sync_buckets,
        }
    }

    /// Adds one fdatasync that took `ns`.
    pub(crate) fn record_sync(&mut self, ns: u64) {
        self.syncs += 1;
        self.sync_ns += ns;
        let secs = ns as f64 / 1e9;
        self.sync_buckets[SYNC_BUCKETS_SECS.partition_point(|&b| b < secs)] += 1;
    }
}

/// A partition log. See the module doc.
#[derive(Clone)]
pub struct Log {
    inner: Rc<Inner>,
}

/// A log that is not kept open by being referred to (the shard's list of
/// journaling logs).
pub(crate) struct WeakLog(std::rc::Weak<Inner>);

impl ShardStorage {
    /// Opens (creating if missing) the log in `dir`, recovering it. (Here,
    /// not in `shard.rs`: the shard's storage sits below the logs it
    /// serves and does not name them.)
    pub async fn open_log(&self, dir: impl AsRef<Path>, config: LogConfig) -> Result<Log> {
        let dir = dir.as_ref().to_path_buf();
        // Segments of a log opened here before may still be cached, and
        // their files may have been replaced since (a repaired segment, a
        // re-created partition): drop them, so the log reads its files as
        // they are now.
        self.forget_dir(&dir);
        Log::open(self.clone(), dir, config).await
    }
}

impl WeakLog {
    pub fn upgrade(&self) -> Option<Log> {
        self.0.upgrade().map(|inner| Log { inner })
    }
}

struct Inner {
    dir: PathBuf,
    config: LogConfig,
    shard: ShardStorage,
    /// Set when the shard journal makes this log's appends durable
    /// (`journaled.rs`).
    journal: Option<journaled::LogJournal>,
    state: RefCell<State>,
    io_lock: Semaphore,
    /// Serialises fdatasync. Taken after `io_lock` when both are needed, so
    /// a write of the next group can run while the previous one syncs.
    sync_lock: Semaphore,
    /// Serialises writes of the high-watermark checkpoint (they share a
    /// temporary file), apart from the I/O lock appends need.
    checkpoint_lock: Semaphore,
    /// Woken whenever the I/O or sync lock is released: durability waiters that did
    /// not take the lock wait here instead of queueing on it.
    io_done: Notify,
}

/// Holding the I/O lock; releasing it wakes the durability waiters.
pub(super) struct IoGuard<'a> {
    _permit: glommio::sync::Permit<'a>,
    notify: &'a Notify,
}

impl Drop for IoGuard<'_> {
    fn drop(&mut self) {
        self.notify.notify_all();
    }
}

struct State {
    sealed: BTreeMap<Offset, SealedSegment>,
    active: ActiveSegment,
    log_start: Offset,
    flushed: Offset,
    high_watermark: Offset,
    /// The high watermark in the checkpoint file (`None`: not written by
    /// this open).
    high_watermark_saved: Option<Offset>,
    /// Where each leader epoch began (`replica.rs`).
    epochs: crate::epochs::EpochHistory,
    /// The epoch checkpoint lags `epochs`.
    epochs_dirty: bool,
    /// Idempotent producers' last batches (`producers.rs`).
    producers: crate::producers::ProducerTable,
    /// The log end at the last snapshot this open wrote.
    producers_saved_at: Option<Offset>,
    /// The snapshot files in the directory, oldest first (listed when the
    /// table is rebuilt, kept up to date by the saves: no directory listing
    /// per save).
    producer_snapshots: Vec<Offset>,
    cache: TailCache,
    unsynced_bytes: u64,
    last_sync_ms: u64,
    /// A roll or truncation is moving files: appends wait for the I/O lock.
    reshaping: bool,
    /// A background zero-fill ahead of the writer: (start position, task).
    zeroing: Option<(u64, glommio::Task<()>)>,
    /// The window after the last disk read, being read in the background.
    readahead: readahead::ReadAhead,
    stats: LogStats,
    /// Why the log takes no more writes, and whether the disk was full.
    failed: Option<(String, bool)>,
    closed: bool,
    /// What the shard journal holds of this log (`journaled.rs`).
    journal: journaled::JournalState,
    /// Records this replica had made durable and lost, found by an open
    /// ([`Log::damage`]).
    damage: Option<String>,
}

impl State {
    fn log_end(&self) -> Offset {
        self.active.next_offset()
    }

    /// Every offset below it is durable, in the segment or the journal.
    fn durable(&self) -> Offset {
        self.flushed.max(self.journal.journaled)
    }

    fn check_usable(&self, dir: &Path) -> Result<()> {
        if let Some((reason, no_space)) = &self.failed {
            return Err(StorageError::LogFailed {
                dir: dir.to_path_buf(),
                reason: reason.clone(),
                no_space: *no_space,
            });
        }
        if self.closed {
            return Err(StorageError::Closed);
        }
        Ok(())
    }

    /// Where reads end: the log end; after a failed write what was written
    /// before it, to the segment or in a durable journal frame (memory may
    /// hold batches the disk does not). Refused once closed.
    fn readable_end(&self) -> Result<Offset> {
        if self.closed {
            return Err(StorageError::Closed);
        }
        Ok(match self.failed {
            Some(_) => self.active.written_offset().max(self.journal.journaled),
            None => self.log_end(),
        })
    }

    fn sync_due(&self, policy: FsyncPolicy, now_ms: u64) -> bool {
        match policy {
            FsyncPolicy::Always => self.flushed < self.active.written_offset(),
            FsyncPolicy::Interval {
                interval_ms,
                interval_bytes,
            } => {
                self.flushed < self.active.written_offset()
                    && ((interval_bytes > 0 && self.unsynced_bytes >= interval_bytes)
                        || (interval_ms > 0 && now_ms.saturating_sub(self.last_sync_ms) >= interval_ms))
            }
        }
    }
}

/// Milliseconds on a monotonic clock (since the first call in this
/// process): fsync intervals and segment ages do not jump with the wall
/// clock.
pub(crate) fn mono_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}

/// Wall-clock milliseconds since the Unix epoch (record timestamps).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Log {
    /// Opens the log in `dir` (created if missing): checks the sealed
    /// segments, recovers the active one (truncating a torn or corrupt
    /// tail), rebuilds missing or damaged indexes.
    pub(crate) async fn open(shard: ShardStorage, dir: PathBuf, mut config: LogConfig) -> Result<Log> {
        config.validate()?;
        std::fs::create_dir_all(&dir).map_err(|e| StorageError::io("creating", &dir, e))?;
        // Closed cleanly: the indexes are trusted (each segment is checked
        // from its last index entry). Else every batch of the active
        // segment is checked. The mark goes before anything is written, so
        // a crash from here on finds it gone.
        let clean_path = dir.join(CLEAN_CLOSE_FILE);
        let closed_cleanly = clean_path.exists();
        if closed_cleanly {
            std::fs::remove_file(&clean_path).map_err(|e| StorageError::io("removing", &clean_path, e))?;
            crate::segment::io::sync_dir(&dir).await?;
        }
        // Damage an earlier open found and the broker has not yet seen
        // through (`Log::damage`), and what this one finds: each recorded
        // durably before the cut it leads to (`record_damage`).
        let mut damage = read_damage(&dir)?;
        // Records below it were committed: damage there lost durable
        // records. (Read again, with the log's extent, by
        // `load_replication_state`.)
        let saved_hw =
            checkpoint::read(&dir, checkpoint::HIGH_WATERMARK_FILE, checkpoint::decode_high_watermark).await?;
        let journal = match (config.journal && config.fsync == FsyncPolicy::Always, shard.journal()) {
            (true, Some(journal)) => match journal_dir_name(shard.data_dir(), &dir) {
                Some(name) => Some(journaled::LogJournal {
                    journal,
                    dir: name,
                    id: journaled::journal_id(&dir)?,
                }),
                None => None,
            },
            _ => None,
        };
        if journal.is_some() {
            // The journal makes appends durable; the segment is written behind.
            config.write_through = false;
        }
        let mut bases = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| StorageError::io("listing", &dir, e))? {
            let entry = entry.map_err(|e| StorageError::io("listing", &dir, e))?;
            if let Some(base) = entry.file_name().to_str().and_then(parse_log_file_name) {
                bases.push(base);
            }
        }
        bases.sort();
        let mut active_base = bases.pop().unwrap_or(Offset::ZERO);

        let mut sealed = BTreeMap::new();
        let mut prev: Option<(PathBuf, Offset, u64)> = None;
        // A sealed segment found damaged: the log is cut there (see
        // `cut_at_damage`), and it becomes the active segment, scanned
        // only up to its last valid batch.
        let mut limit = None;
        for (i, base) in bases.iter().copied().enumerate() {
            let path = dir.join(log_file_name(base));
            let later = || -> Vec<Offset> { bases[i..].iter().copied().chain([active_base]).collect() };
            // A segment that does not start where the one before it ended
            // (a file lost): the log is cut at the end of the one before.
            if let Err(gap) = check_follows(prev.as_ref(), &path, base) {
                let (prev_base, prev_size) = cut_before(&mut sealed, &mut prev);
                damage = Some(record_damage(&dir, &format!("{gap}: the log was cut there")).await?);
                cut_at_damage(&dir, prev_base, prev_size, &gap.to_string(), &later(), false).await?;
                (active_base, limit) = (prev_base, Some(prev_size));
                break;
            }
            let file = DmaFile::open(&path)
                .await
                .map_err(|e| StorageError::glommio("opening", &path, e))?;
            let loaded = load_sealed(
                &file,
                &path,
                base,
                config.stored_batch_bytes_max(),
                config.index_interval_bytes,
            )
            .await;
            file.close()
                .await
                .map_err(|e| StorageError::glommio("closing", &path, e))?;
            let (loaded, size) = match loaded {
                Ok(loaded) => loaded,
                Err(StorageError::CorruptSegment { position, reason, .. }) => {
                    let why = format!(
                        "sealed segment {} damaged at position {position} ({reason}): the log was cut there",
                        path.display()
                    );
                    damage = Some(record_damage(&dir, &why).await?);
                    cut_at_damage(&dir, base, position, &reason, &later()[1..], true).await?;
                    (active_base, limit) = (base, Some(position));
                    break;
                }
                Err(e) => return Err(e),
            };
            prev = Some((path.clone(), loaded.next_offset, size));
            sealed.insert(
                base,
                SealedSegment {
                    path,
                    base,
                    next_offset: loaded.next_offset,
                    size,
                    max_timestamp: loaded.index.max_timestamp(),
                },
            );
        }
        let mut active_path = dir.join(log_file_name(active_base));
        if limit.is_none() {
            if let Err(gap) = check_follows(prev.as_ref(), &active_path, active_base) {
                let (prev_base, prev_size) = cut_before(&mut sealed, &mut prev);
                damage = Some(record_damage(&dir, &format!("{gap}: the log was cut there")).await?);
                cut_at_damage(&dir, prev_base, prev_size, &gap.to_string(), &[active_base], false).await?;
                (active_base, limit) = (prev_base, Some(prev_size));
                active_path = dir.join(log_file_name(active_base));
            }
        }
        let created = !active_path.exists();
        // A journaled log's segment is written behind its journal, which
        // the start-up replay applies after this open: its tail is no
        // evidence of damage.
        // (The start-up replay opens such a log without the journal: its
        // directory still carries the journal's id.)
        // On an fsync=always log a batch is durable before the next one is
        // written (or in the same synced write): a bad batch that later
        // ones follow lost durable records, wherever it lies. On an
        // interval log the disk may have kept a part of unsynced writes:
        // only below the checkpointed high watermark is it damage.
        let journaled_dir = journal.is_some() || dir.join(JOURNAL_ID_FILE).exists();
        let damage_below = match config.fsync {
            _ if journaled_dir => None,
            FsyncPolicy::Always => Some(Offset(u64::MAX)),
            FsyncPolicy::Interval { .. } => saved_hw,
        };
        let (active, active_damage) =
            open_active(&active_path, active_base, &config, limit, closed_cleanly, damage_below).await?;
        if created {
            crate::segment::io::sync_dir(&dir).await?;
        }
        damage = active_damage.or(damage);
        let log_end = active.next_offset();
        let log_start = sealed.keys().next().copied().unwrap_or(active_base);
        let state = State {
            sealed,
            active,
            log_start,
            flushed: log_end,
            // Until `load_replication_state` reads the checkpoint.
            high_watermark: log_start,
            high_watermark_saved: None,
            epochs: crate::epochs::EpochHistory::new(),
            epochs_dirty: false,
            producers: Default::default(),
            producers_saved_at: None,
            producer_snapshots: Vec::new(),
            cache: TailCache::new(config.tail_cache_bytes_max, shard.cache_budget()),
            unsynced_bytes: 0,
            last_sync_ms: mono_ms(),
            reshaping: false,
            zeroing: None,
            readahead: readahead::ReadAhead::new(shard.readahead_budget()),
            stats: LogStats::default(),
            failed: None,
            closed: false,
            journal: Default::default(),
            damage,
        };
        let log = Log {
            inner: Rc::new(Inner {
                dir,
                config,
                shard,
                journal,
                state: RefCell::new(state),
                io_lock: Semaphore::new(1),
                sync_lock: Semaphore::new(1),
                checkpoint_lock: Semaphore::new(1),
                io_done: Notify::default(),
            }),
        };
        log.load_replication_state().await?;
        log.rebuild_producers(false, true).await?;
        if log.journaled() {
            log.inner
                .shard
                .note_journaled(Rc::new(WeakLog(Rc::downgrade(&log.inner))));
        }
        Ok(log)
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }
    pub fn config(&self) -> &LogConfig {
        &self.inner.config
    }
    pub fn log_start(&self) -> Offset {
        self.inner.state.borrow().log_start
    }
    pub fn log_end(&self) -> Offset {
        self.inner.state.borrow().log_end()
    }
    /// Every offset below this one is durable: fdatasync'd (or written
    /// through) in the segment, or in a durable frame of the shard journal.
    pub fn flushed_offset(&self) -> Offset {
        self.inner.state.borrow().durable()
    }
    /// Whether the log takes no more writes because the disk was full
    /// (ENOSPC): closing it and opening it again recovers it once space is
    /// back. Never for a journaling log: its memory held batches that only
    /// the journal has made durable, and an open gets them back only from
    /// the start-up replay (the broker restarts for that).
    pub fn failed_for_space(&self) -> bool {
        !self.journaled()
            && self
                .inner
                .state
                .borrow()
                .failed
                .as_ref()
                .is_some_and(|(_, no_space)| *no_space)
    }
    /// Why this replica lost records it had made durable, if an open found
    /// that it did: a damaged sealed segment or a missing one, a corrupt
    /// batch that later batches follow, or (fsync=always) a log that ends
    /// below its checkpointed high watermark. Such a replica must not lead
    /// or stay in an ISR on its word: the broker reports it to the
    /// controller and clears it ([`Log::clear_damage`]) once the replica is
    /// out of the ISR, catching up from a leader like any follower. Kept
    /// across restarts until then (the `damaged` file; the high-watermark
    /// checkpoint is not lowered meanwhile).
    pub fn damage(&self) -> Option<String> {
        self.inner.state.borrow().damage.clone()
    }
    /// The broker saw this replica leave the ISR after [`Log::damage`]:
    /// from here on it holds only what it catches up from a leader.
    /// The log forgets the damage at once (the call, not the future);
    /// the future removes its record from the directory.
    pub fn clear_damage(&self) -> impl std::future::Future<Output = Result<()>> + 'static {
        let had = self.inner.state.borrow_mut().damage.take().is_some();
        let dir = self.inner.dir.clone();
        async move {
            if !had {
                return Ok(());
            }
            let path = dir.join(DAMAGE_FILE);
            match std::fs::remove_file(&path) {
                Ok(()) => crate::segment::io::sync_dir(&dir).await,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(StorageError::io("removing", &path, e)),
            }
        }
    }
    /// Whether the log takes no more writes (a failed write or fdatasync,
    /// whatever the cause).
    pub fn failed(&self) -> bool {
        self.inner.state.borrow().failed.is_some()
    }
    /// Bytes appended but not yet written to the segment (for a journaled
    /// log, what a replay of its journal would write at most, besides a
    /// partial block).
    pub fn unwritten_bytes(&self) -> u64 {
        self.inner.state.borrow().active.pending_bytes() as u64
    }
    /// Why the log takes no more writes, if it does not.
    pub fn failure(&self) -> Option<String> {
        self.inner
            .state
            .borrow()
            .failed
            .as_ref()
            .map(|(reason, _)| reason.clone())
    }
    /// Every offset below this one has been written to the disk: to the
    /// segment, or (a journaling log) in a durable journal frame.
    pub fn written_offset(&self) -> Offset {
        let st = self.inner.state.borrow();
        st.active.written_offset().max(st.journal.journaled)
    }
    pub fn high_watermark(&self) -> Offset {
        self.inner.state.borrow().high_watermark
    }
    /// Moves the high watermark forward to `offset` (clamped to the log
    /// end; it never moves back); returns whether it moved. The one rule for
    /// every caller (commit after a durable append, the interval tick,
    /// replication later).
    pub fn advance_high_watermark(&self, offset: Offset) -> bool {
        let mut st = self.inner.state.borrow_mut();
        let to = offset.min(st.log_end());
        let moved = to > st.high_watermark;
        if moved {
            st.high_watermark = to;
        }
        moved
    }
    /// I/O counters since the log was opened.
    pub fn stats(&self) -> LogStats {
        self.inner.state.borrow().stats
    }
    /// Sealed segments plus the active one.
    pub fn segment_count(&self) -> usize {
        self.inner.state.borrow().sealed.len() + 1
    }
    /// Bytes stored in all segments.
    pub fn size_bytes(&self) -> u64 {
        let st = self.inner.state.borrow();
        st.sealed.values().map(|s| s.size).sum::<u64>() + st.active.size()
    }
    /// Bytes this log's tail cache holds.
    pub fn cached_bytes(&self) -> usize {
        self.inner.state.borrow().cache.bytes()
    }
    /// Heap bytes held by the active segment's bookkeeping (partial block,
    /// index, queue), for memory accounting.
    pub fn active_heap_bytes(&self) -> usize {
        self.inner.state.borrow().active.heap_bytes()
    }

    /// The log takes no more writes after `e` (see
    /// [`StorageError::LogFailed`]).
    fn fail(&self, e: StorageError) -> StorageError {
        let (reason, no_space) = (e.to_string(), e.is_no_space());
        let mut st = self.inner.state.borrow_mut();
        if st.failed.is_none() {
            // What only the journal holds of this log must stay replayable
            // after this log (and its pins) is dropped: until the restart
            // (`journaled.rs`).
            if let (Some(j), Some(oldest)) = (&self.inner.journal, st.journal.frames.front()) {
                j.journal.hold_until_restart(oldest.lsn);
            }
        }
        st.failed.get_or_insert((reason.clone(), no_space));
        StorageError::LogFailed {
            dir: self.inner.dir.clone(),
            reason,
            no_space,
        }
    }

    /// Waits for the I/O lock.
    async fn lock(&self) -> Result<IoGuard<'_>> {
        self.guard(self.inner.io_lock.acquire_permit(1).await.ok())
            .ok_or(StorageError::Closed)
    }

    /// The I/O lock if it is free now.
    fn try_lock(&self) -> Option<IoGuard<'_>> {
        self.guard(self.inner.io_lock.try_acquire_permit(1).ok())
    }

    /// Waits for the sync lock.
    async fn lock_sync(&self) -> Result<IoGuard<'_>> {
        self.guard(self.inner.sync_lock.acquire_permit(1).await.ok())
            .ok_or(StorageError::Closed)
    }

    /// The sync lock if it is free now.
    fn try_lock_sync(&self) -> Option<IoGuard<'_>> {
        self.guard(self.inner.sync_lock.try_acquire_permit(1).ok())
    }

    /// Wraps a permit so that releasing it wakes the durability waiters.
    fn guard<'a>(&'a self, permit: Option<glommio::sync::Permit<'a>>) -> Option<IoGuard<'a>> {
        permit.map(|permit| IoGuard {
            _permit: permit,
            notify: &self.inner.io_done,
        })
    }
}

/// A log directory's name in journal entries: its path relative to the
/// data directory, if it lies inside it and the name is one an entry can
/// carry.
fn journal_dir_name(data_dir: &Path, dir: &Path) -> Option<String> {
    let name = dir.strip_prefix(data_dir).ok()?.to_str()?.to_string();
    crate::journal::format::check_dir(&name).ok().map(|()| name)
}

/// The newest sealed segment loaded so far, taken back out of `sealed` to
/// become the active one: its base and size. Called only when `prev` is
/// set (a segment follows it).
fn cut_before(
    sealed: &mut BTreeMap<Offset, SealedSegment>,
    prev: &mut Option<(PathBuf, Offset, u64)>,
) -> (Offset, u64) {
    let size = prev.take().map_or(0, |(_, _, size)| size);
    let base = sealed.pop_last().map_or(Offset::ZERO, |(base, _)| base);
    (base, size)
}

/// A sealed segment of the log in `dir` (base `base`) holds a damaged
/// batch at `position` (a bit flipped on the disk, say), or the segment
/// after it is missing or misplaced (then `position` is its size): the log
/// is cut there, as a torn tail is. Its valid part stays (it becomes the
/// active segment), and the segments after it (`later`) are set aside,
/// renamed `*.log.damaged` (their index files removed), as is a copy of
/// the damaged segment whole (`copy_damaged`): nothing is deleted that may
/// be the only copy, and nothing past the damage is served. The open
/// records the damage ([`Log::damage`]): the broker takes the replica out
/// of the ISR before it may lead, and it catches up from a leader; an
/// operator removes the `.damaged` files once it has.
async fn cut_at_damage(
    dir: &Path,
    base: Offset,
    position: u64,
    reason: &str,
    later: &[Offset],
    copy_damaged: bool,
) -> Result<()> {
    let path = dir.join(log_file_name(base));
    if copy_damaged {
        copy_aside(&path).await?;
    }
    for b in later {
        let p = dir.join(log_file_name(*b));
        match std::fs::rename(&p, aside_name(&p)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StorageError::io("setting aside", &p, e)),
        }
        for index in [crate::segment::index_path(&p), crate::segment::time_index_path(&p)] {
            match std::fs::remove_file(&index) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io("removing", &index, e)),
            }
        }
    }
    crate::segment::io::sync_dir(dir).await?;
    warn!(
        segment = %path.display(),
        position,
        later_segments = later.len(),
        "a sealed segment is damaged ({reason}): the log is cut at its last valid batch and the {} segment(s) \
         after it set aside as *.log.damaged (with a copy of the damaged one); the replica catches up from its \
         leader",
        later.len()
    );
    Ok(())
}

/// The damage a log's earlier open recorded and the broker has not yet
/// seen through ([`Log::damage`]).
fn read_damage(dir: &Path) -> Result<Option<String>> {
    let path = dir.join(DAMAGE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StorageError::io("reading", &path, e)),
    }
}

/// Adds `why` to the damage recorded in `dir`, durably, before the cut it
/// leads to: a crash part-way through the cut must not leave a shorter log
/// that looks whole. Returns all that is recorded.
async fn record_damage(dir: &Path, why: &str) -> Result<String> {
    let all = match read_damage(dir)? {
        // Recorded already (a crash came between the record and the cut
        // it led to): the open that finds it again adds nothing.
        Some(before) if before.split("; then ").any(|w| w == why) => return Ok(before),
        Some(before) => format!("{before}; then {why}"),
        None => why.to_string(),
    };
    checkpoint::write_atomically(dir, DAMAGE_FILE, all.clone().into_bytes(), true).await?;
    Ok(all)
}

/// Where a damaged segment at `path`, or one after the damage, is set
/// aside: `*.log.damaged` beside it.
fn aside_name(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".damaged");
    PathBuf::from(name)
}

/// Copies the segment at `path` to [`aside_name`], durably.
async fn copy_aside(path: &Path) -> Result<()> {
    let aside = aside_name(path);
    std::fs::copy(path, &aside)
        .and_then(|_| std::fs::File::open(&aside)?.sync_all())
        .map_err(|e| StorageError::io("copying aside", path, e))?;
    crate::segment::io::sync_dir(dir_of(path)).await
}

/// The directory holding `path`.
fn dir_of(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("."))
}

/// Segments tile the offsets: each starts exactly where the one before it
/// ends (retention and truncation remove whole segments from the ends, so
/// no gap can appear in between). `prev` is the previous segment's path and
/// end; `path` and `base` the next one's.
fn check_follows(prev: Option<&(PathBuf, Offset, u64)>, path: &Path, base: Offset) -> Result<()> {
    match prev {
        Some((_, next, _)) if base < *next => Err(StorageError::CorruptSegment {
            path: path.to_path_buf(),
            position: 0,
            reason: format!("segment starts at offset {base} but the previous one ends at {next}"),
        }),
        Some((prev_path, next, size)) if base > *next => Err(StorageError::CorruptSegment {
            path: prev_path.clone(),
            position: *size,
            reason: format!("segment ends at offset {next} but the next one starts at {base}: its tail is missing"),
        }),
        _ => Ok(()),
    }
}

/// Opens (creating if missing) the segment at `path` as the active one:
/// loads or rebuilds its index, truncates anything after the last valid
/// batch (and anything from `limit` on), makes that durable, and reads the
/// partial last block back into memory.
///
/// Unless the log was `closed_cleanly`, every batch of the segment is
/// checked. A corrupt batch that a valid later batch follows is copied
/// aside with the whole segment (`*.log.damaged`) before the cut; below
/// `damage_below` it is damage to records the log had made durable,
/// recorded (`record_damage`) before the cut, and the second value says
/// so. (Elsewhere, such a batch may be an unsynced write the disk kept
/// only in part, out of order.)
async fn open_active(
    path: &Path,
    base: Offset,
    config: &LogConfig,
    limit: Option<u64>,
    closed_cleanly: bool,
    damage_below: Option<Offset>,
) -> Result<(ActiveSegment, Option<String>)> {
    let file = crate::segment::active::open_options(config)
        .create(true)
        .dma_open(path)
        .await
        .map_err(|e| StorageError::glommio("opening", path, e))?;
    let file_len = file
        .file_size()
        .await
        .map_err(|e| StorageError::glommio("sizing", path, e))?;
    let scan_len = limit.map_or(file_len, |l| l.min(file_len));
    let loaded = load_segment(
        &file,
        path,
        base,
        scan_len,
        config.stored_batch_bytes_max(),
        config.index_interval_bytes,
        closed_cleanly,
    )
    .await?;
    let mut damage = None;
    if let ScanEnd::Corrupt(why) = &loaded.end {
        let position = loaded.valid_end;
        let next = loaded.next_offset;
        let batch_max = config.stored_batch_bytes_max();
        if let Some(later) = valid_batch_follows(&file, path, position, next, scan_len, batch_max).await? {
            copy_aside(path).await?;
            if damage_below.is_some_and(|below| next < below) {
                let why = format!(
                    "the batch at position {position} of {} (offset {next}) is damaged ({why}) and batches from \
                     offset {later} follow it: the log was cut there (the segment copied aside as *.log.damaged)",
                    path.display()
                );
                damage = Some(record_damage(dir_of(path), &why).await?);
            } else {
                warn!(
                    segment = %path.display(),
                    position,
                    "a corrupt batch that batches from offset {later} follow, where unsynced writes may be kept in \
                     part: cut there, the segment copied aside as *.log.damaged"
                );
            }
        }
    }
    match &loaded.end {
        ScanEnd::Torn(why) | ScanEnd::Corrupt(why) => warn!(
            segment = %path.display(),
            position = loaded.valid_end,
            "truncating the log's tail after the last valid batch: {why}"
        ),
        ScanEnd::Stale(why) => tracing::debug!(
            segment = %path.display(),
            position = loaded.valid_end,
            "the log ends where a recycled file's old contents begin: {why}"
        ),
        ScanEnd::Clean | ScanEnd::ZeroTail => {}
    }
    if file_len != loaded.valid_end {
        file.truncate(loaded.valid_end)
            .await
            .map_err(|e| StorageError::glommio("truncating", path, e))?;
    }
    // Whatever recovery keeps must be durable before anything new is acknowledged.
    file.fdatasync()
        .await
        .map_err(|e| StorageError::glommio("syncing", path, e))?;
    let tail_start = align_down(loaded.valid_end);
    let tail_block = if tail_start == loaded.valid_end {
        Vec::new()
    } else {
        read_range(&file, path, tail_start, (loaded.valid_end - tail_start) as usize)
            .await?
            .to_vec()
    };
    write_index_files(path, &loaded.index).await?;
    let persisted = (loaded.index.offset_entries(), loaded.index.time_entries());
    let mut active = ActiveSegment::new(
        path.to_path_buf(),
        base,
        Rc::new(file),
        Recovered {
            next_offset: loaded.next_offset,
            size: loaded.valid_end,
            tail_block,
            index: loaded.index,
            file_len: loaded.valid_end,
        },
    );
    active.index_persisted = persisted;
    Ok((active, damage))
}
