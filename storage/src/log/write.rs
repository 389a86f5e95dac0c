//! The write side of the log: append, the durability waits (group commit),
//! writing queued batches, fdatasync, and rolling segments.
//!
//! # Recycling
//! An fdatasync after O_DIRECT writes that *extend* a file commits the ext4
//! journal (new extents, new size); after writes over blocks the file
//! already has, it only flushes the data. Measured on the dev box with the
//! storage bench: 1 MiB batches with `fsync=always` reach ≈ 0.65 of the
//! raw write rate into a new file and ≈ 0.96 into a recycled one. So when
//! a roll finds sealed segments that the retention policy lets go
//! (`LogConfig::recycle_segments`, on by default), it deletes all but the
//! largest and renames that one to the new segment's name: the new segment
//! writes over the old batches instead of growing a file. A busy partition
//! whose retention is reached then rolls into freed files, and the disk
//! holds no more than it did (the file is moved, not kept aside). The
//! periodic retention pass still deletes what expires between rolls.
//!
//! Why it is safe: the file past the segment's written end holds the old
//! batches of the *same* log, whose offsets are all below the new
//! segment's base. Reads stop at the written end. Recovery expects the
//! first batch at the base and each next one right after, so it stops at
//! the first old batch ([`crate::scan::ScanEnd::Stale`]), at the zero
//! padding of the last block, or at a torn batch, and truncates the file
//! there, as after any crash. A roll seals the old segment (truncated to
//! its batches, fdatasync'd) before the rename, so a sealed segment never
//! holds old bytes. Truncation (replication) never recycles: what it
//! removes has offsets above what follows. A read of a segment that is
//! recycled under it is thrown away and answered with the new log start
//! (`read.rs`).
//!
//! # Write-through
//! With `fsync=always` (and `LogConfig::write_through`, on by default) the
//! active segment is opened `O_DSYNC`: a write completes only once it is
//! durable — the data, and the file size or extents it changed — the
//! contract of `fdatasync` after it (open(2), "synchronized I/O data
//! integrity completion"). So `write_locked` moves the flushed offset with
//! the written one and no fdatasync is issued. Why: an fdatasync goes
//! through io_uring's worker threads (it cannot be issued without
//! blocking), a wake-up and a sleep of a kernel thread each, after the
//! write's own round trip; a write-through write is one submission whose
//! completion comes after the kernel's flush. With 100 partitions each
//! taking a record every few milliseconds (the daily load, issue 27) there
//! is about one flush per record either way; measured there (11,600
//! records/s, acks=all, medians of three runs, bench/README (6)): p50 8.4
//! → 1.3 ms, p99 60 → 26 ms, and at 58,000/s p99 230 → 66 ms, at the same
//! machine CPU (the flush work moves from the broker's io_uring workers to
//! the kernel's), so the broker process's own CPU falls by a sixth to a
//! quarter without the machine's doing so. Pre-zeroing writes go through
//! too, in the background (a data write waits for one only when it
//! reaches the zeroed range, or when the next is due before the last has
//! landed). A roll still fdatasyncs the sealed segment (its truncation),
//! and a segment opened at start-up is made durable as before.

use std::path::Path;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use glommio::io::DmaFile;
use tracing::warn;

use super::maintain::{remove_index_files, remove_segment_files};
use super::{mono_ms, now_ms, AppendInfo, Log};
use crate::batch::{RecordBatch, Stamp};
use crate::config::{FsyncPolicy, LogConfig};
use crate::error::{Result, StorageError};
use crate::index::SegmentIndex;
use crate::segment::active::{self, ActiveSegment, Recovered};
use crate::segment::io::{sync_dir, write_small_file};
use crate::segment::recover::write_index_files;
use crate::segment::{index_path, log_file_name, time_index_path, OpenSegment};
use crate::{LeaderEpoch, Offset};

/// Index entries gathered in memory before they are appended to the files.
const INDEX_PERSIST_ENTRIES: usize = 64;

enum Blocked {
    Roll,
    Write,
    Reshaping,
    /// The shard journal gathers more than it may for its next frame:
    /// wait for that frame to be written.
    Journal(u64),
}

impl Log {
    /// Validates a producer's batch, stamps it with the next offsets and
    /// `epoch`, and queues it for the disk. Returns at once unless the queue
    /// is full or the segment must roll; await [`Log::wait_durable`] before
    /// acknowledging. On a validation error nothing changes. An `epoch`
    /// older than the log's latest is refused (`StaleEpoch`).
    pub async fn append(&self, batch: BytesMut, epoch: LeaderEpoch) -> Result<AppendInfo> {
        let config = &self.inner.config;
        self.queue(batch, |bytes, log_end| {
            let stamp = Stamp {
                base_offset: log_end,
                leader_epoch: epoch,
                log_append_time_ms: config.log_append_time.then(|| now_ms() as i64),
            };
            Ok(RecordBatch::stamped(bytes, config.batch_bytes_max, stamp)?)
        })
        .await
    }

    /// Validates a batch as the partition's leader stored it and queues it
    /// unchanged: its offsets, leader epoch and timestamps stay the
    /// leader's (a follower's append). Refused, changing nothing, when it
    /// does not start at this log's end (`NotAtLogEnd`), or its epoch is
    /// older than this log's latest (`StaleEpoch`). Durability as for
    /// [`Log::append`]. The bytes are kept as given (no copy: a slice of
    /// the fetch answer's frame).
    pub async fn append_replica(&self, batch: Bytes) -> Result<AppendInfo> {
        let max = self.inner.config.batch_bytes_max;
        self.queue(batch, |bytes, log_end| {
            let rb = RecordBatch::new(bytes, max)?;
            if rb.base_offset() != log_end {
                return Err(StorageError::NotAtLogEnd {
                    log_end,
                    batch_base: rb.base_offset(),
                });
            }
            Ok(rb)
        })
        .await
    }

    /// Queues the batch `make` builds from the bytes and the log end, once
    /// the log can take it (rolling the segment or writing queued batches
    /// first if need be); the batch's epoch must not be older than the log's.
    async fn queue<B: std::ops::Deref<Target = [u8]>>(
        &self,
        batch: B,
        make: impl Fn(B, Offset) -> Result<RecordBatch>,
    ) -> Result<AppendInfo> {
        let config = &self.inner.config;
        let len = batch.len();
        let mut batch = Some(batch);
        loop {
            let blocked = {
                let mut st = self.inner.state.borrow_mut();
                st.check_usable(&self.inner.dir)?;
                let now = mono_ms();
                if st.reshaping {
                    Blocked::Reshaping
                } else if st.active.needs_roll(len, now, config) {
                    Blocked::Roll
                } else if st.active.pending_bytes() > 0 && st.active.pending_bytes() + len > config.pending_bytes_max {
                    Blocked::Write
                } else if let Some(lsn) = self.inner.journal.as_ref().and_then(|j| j.journal.gathering_full()) {
                    Blocked::Journal(lsn)
                } else {
                    let Some(bytes) = batch.take() else {
                        unreachable!("the batch is taken only when appended")
                    };
                    let rb = make(bytes, st.log_end())?;
                    // A new epoch starts here (its checkpoint is written
                    // before these bytes); an older one is refused.
                    if st.epochs.observe(rb.header().leader_epoch, rb.base_offset())? {
                        st.epochs_dirty = true;
                    }
                    st.producers.note_stored(rb.header());
                    st.active.push(&rb, config.index_interval_bytes, now);
                    let written = st.active.written_offset();
                    st.cache.push(&rb, written);
                    if let Err(e) = self.journal_append(&mut st, rb.base_offset(), rb.bytes(), rb.next_offset()) {
                        // Queued but never to be durable: the log stops, as
                        // after a failed write.
                        drop(st);
                        return Err(self.fail(e));
                    }
                    return Ok(AppendInfo {
                        base_offset: rb.base_offset(),
                        last_offset: rb.last_offset(),
                        max_timestamp: rb.max_timestamp(),
                        bytes: rb.len(),
                    });
                }
            };
            if let Blocked::Journal(lsn) = blocked {
                if let Some(j) = &self.inner.journal {
                    j.journal.wait(lsn).await.map_err(|e| self.fail(e))?;
                }
                continue;
            }
            let _permit = self.lock().await?;
            match blocked {
                // Another producer may have rolled while this one waited.
                Blocked::Roll if self.inner.state.borrow().active.needs_roll(len, mono_ms(), config) => {
                    self.roll_locked().await?
                }
                Blocked::Roll => {}
                Blocked::Write => self.write_locked().await?,
                Blocked::Reshaping | Blocked::Journal(_) => {}
            }
        }
    }

    /// Resolves once `last_offset` (an offset returned by `append`) is safe
    /// per the fsync policy: fdatasync'd for `Always`; written to the disk,
    /// and fdatasync'd if the interval has run out, for `Interval`.
    pub async fn wait_durable(&self, last_offset: Offset) -> Result<()> {
        if let Some(j) = &self.inner.journal {
            return self.wait_journaled(j, last_offset).await;
        }
        let policy = self.inner.config.fsync;
        loop {
            if self.durable_enough(last_offset, policy)? {
                return Ok(());
            }
            let seen = self.inner.io_done.epoch();
            let needs_write = self.inner.state.borrow().active.written_offset() <= last_offset;
            if needs_write {
                match self.try_lock() {
                    Some(_guard) => self.write_locked().await?,
                    None => self.inner.io_done.wait(seen).await,
                }
            } else {
                match self.try_lock_sync() {
                    Some(_guard) => self.sync_held().await?,
                    None => self.inner.io_done.wait(seen).await,
                }
            }
        }
    }

    pub(super) fn durable_enough(&self, last_offset: Offset, policy: FsyncPolicy) -> Result<bool> {
        let st = self.inner.state.borrow();
        st.check_usable(&self.inner.dir)?;
        if last_offset >= st.log_end() {
            return Err(StorageError::OffsetOutOfRange {
                requested: last_offset,
                log_start: st.log_start,
                log_end: st.log_end(),
            });
        }
        Ok(match policy {
            FsyncPolicy::Always => st.durable() > last_offset,
            FsyncPolicy::Interval { .. } => st.active.written_offset() > last_offset && !st.sync_due(policy, mono_ms()),
        })
    }

    /// Writes everything queued and fdatasyncs it, whatever the policy.
    pub async fn flush(&self) -> Result<()> {
        let _permit = self.lock().await?;
        self.write_locked().await?;
        self.sync_locked().await
    }

    /// Waits for a background zero-fill to land. Holds: the I/O lock (no new
    /// one can start meanwhile).
    pub(super) async fn finish_zeroing(&self) {
        let zeroing = self.inner.state.borrow_mut().zeroing.take();
        if let Some((_, task)) = zeroing {
            task.await;
        }
    }

    /// fdatasyncs the active segment once the sync lock is free. Holds: the
    /// I/O lock or nothing.
    pub(super) async fn sync_locked(&self) -> Result<()> {
        let _sync = self.lock_sync().await?;
        self.sync_held().await
    }

    /// Whether [`Log::tick`] has work now or later: records appended and
    /// not yet written, or written and not yet fdatasync'd. An owner's timer
    /// can sleep while none of its logs has any (an idle broker then wakes
    /// for nothing).
    pub fn unsettled(&self) -> bool {
        let st = self.inner.state.borrow();
        st.failed.is_none() && !st.closed && (st.active.pending_bytes() > 0 || st.flushed < st.active.written_offset())
    }

    /// Periodic work for `Interval` logs: fdatasync once the interval is up.
    /// The owner calls it from a timer (every few ms).
    pub async fn tick(&self) -> Result<()> {
        let policy = self.inner.config.fsync;
        let due = {
            let st = self.inner.state.borrow();
            st.failed.is_none() && !st.closed && (st.active.pending_bytes() > 0 || st.sync_due(policy, mono_ms()))
        };
        if due {
            {
                let _permit = self.lock().await?;
                self.write_locked().await?;
            }
            // The fdatasync holds only the sync lock: writes (and the
            // appends waiting for one) go on while it is in flight.
            if self.inner.state.borrow().sync_due(policy, mono_ms()) {
                self.sync_locked().await?;
            }
        }
        Ok(())
    }

    /// Writes every queued batch in one aligned write. Holds: the I/O lock.
    pub(super) async fn write_locked(&self) -> Result<()> {
        // A new epoch's start is on disk before its batches are.
        if self.inner.state.borrow().epochs_dirty {
            self.save_epochs_locked().await?;
        }
        let (job, file, path) = {
            let mut st = self.inner.state.borrow_mut();
            st.check_usable(&self.inner.dir)?;
            match st.active.take_write(&self.inner.config) {
                None => return Ok(()),
                Some(job) => (job, st.active.file.clone(), st.active.path.clone()),
            }
        };
        let len = job.buf.len();
        // A zero-fill still in flight must land before data overwrites its range.
        let overlapping = {
            let mut st = self.inner.state.borrow_mut();
            match &st.zeroing {
                Some((start, _)) if job.pos + len as u64 > *start => st.zeroing.take(),
                _ => None,
            }
        };
        if let Some((_, zeroing)) = overlapping {
            zeroing.await;
        }
        let started = std::time::Instant::now();
        match file.write_at(job.buf, job.pos).await {
            Ok(n) if n == len => {}
            Ok(n) => {
                let short = std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    format!("short write of {n} of {len} bytes"),
                );
                return Err(self.fail(StorageError::io("writing", &path, short)));
            }
            Err(e) => return Err(self.fail(StorageError::glommio("writing", &path, e))),
        }
        if let Some((zeros, pos)) = job.zeros {
            // Off the commit path: the zeros are written in the background and
            // their extents become durable with a later fdatasync. A failure
            // loses only the fast path, so it is not fatal.
            self.finish_zeroing().await;
            let zeroing = glommio::spawn_local(async move {
                if let Err(e) = file.write_at(zeros, pos).await {
                    tracing::warn!(segment = %path.display(), "pre-zeroing failed: {e}");
                }
            });
            self.inner.state.borrow_mut().zeroing = Some((pos, zeroing));
        }
        {
            let mut st = self.inner.state.borrow_mut();
            st.stats.writes += 1;
            st.stats.write_ns += started.elapsed().as_nanos() as u64;
            st.stats.bytes_written += job.done.bytes;
            let (written, bytes) = (job.done.written_offset, job.done.bytes);
            st.active.finish_write(job.done);
            if self.inner.config.writes_through() {
                // Durable as it completed (O_DSYNC: "Write-through").
                st.flushed = st.flushed.max(written);
                st.stats.write_through_writes += 1;
            } else {
                st.unsynced_bytes += bytes;
            }
            st.cache.evict(written);
        }
        self.persist_index_locked(false).await
    }

    /// fdatasyncs the active segment: every write completed so far becomes
    /// durable. Holds: the sync lock. A failed fdatasync stops the log: the kernel may have dropped the dirty
    /// pages, so retrying could report data durable that is not.
    pub(super) async fn sync_held(&self) -> Result<()> {
        let (file, path, target, covered) = {
            let st = self.inner.state.borrow();
            st.check_usable(&self.inner.dir)?;
            if st.flushed >= st.active.written_offset() {
                return Ok(());
            }
            (
                st.active.file.clone(),
                st.active.path.clone(),
                st.active.written_offset(),
                st.unsynced_bytes,
            )
        };
        // What this fdatasync covers is fixed here: writes that complete
        // while it is in flight (a tick's sync holds only the sync lock)
        // stay unsynced, and their bytes stay counted.
        let (covered_since, started) = (mono_ms(), std::time::Instant::now());
        if let Err(e) = file.fdatasync().await {
            return Err(self.fail(StorageError::glommio("fdatasync", &path, e)));
        }
        let mut st = self.inner.state.borrow_mut();
        assert!(target >= st.flushed, "the flushed offset only rises");
        st.flushed = target;
        st.stats.record_sync(started.elapsed().as_nanos() as u64);
        st.unsynced_bytes = st.unsynced_bytes.saturating_sub(covered);
        st.last_sync_ms = covered_since;
        Ok(())
    }

    /// Appends the index entries gathered since the last time to the index
    /// files (all of them when `all`). Holds: the I/O lock.
    pub(super) async fn persist_index_locked(&self, all: bool) -> Result<()> {
        let (path, offsets, times, from, to) = {
            let st = self.inner.state.borrow();
            let (po, pt) = st.active.index_persisted;
            let (no, nt) = (st.active.index.offset_entries(), st.active.index.time_entries());
            if no == po && nt == pt || (!all && no - po < INDEX_PERSIST_ENTRIES) {
                return Ok(());
            }
            let index = &st.active.index;
            (
                st.active.path.clone(),
                index.encode_offsets(po),
                index.encode_times(pt),
                (po, pt),
                (no, nt),
            )
        };
        write_small_file(
            &index_path(&path),
            (from.0 * crate::index::OFFSET_ENTRY_LEN) as u64,
            offsets,
            false,
        )
        .await?;
        write_small_file(
            &time_index_path(&path),
            (from.1 * crate::index::TIME_ENTRY_LEN) as u64,
            times,
            false,
        )
        .await?;
        let mut st = self.inner.state.borrow_mut();
        if st.active.path == path {
            st.active.index_persisted = to;
        }
        Ok(())
    }

    /// Seals the active segment and starts a new one at the log end, if the
    /// active segment still needs it. Holds: the I/O lock.
    pub(super) async fn roll_locked(&self) -> Result<()> {
        self.inner.state.borrow_mut().reshaping = true;
        let result = self.roll_inner().await;
        self.inner.state.borrow_mut().reshaping = false;
        result
    }

    async fn roll_inner(&self) -> Result<()> {
        let _sync = self.lock_sync().await?;
        self.write_locked().await?;
        self.finish_zeroing().await;
        self.sync_held().await?;
        let (file, path, size, index, new_base) = {
            let st = self.inner.state.borrow();
            if st.active.is_empty() {
                return Ok(());
            }
            (
                st.active.file.clone(),
                st.active.path.clone(),
                st.active.size(),
                st.active.index.clone(),
                st.log_end(),
            )
        };
        // The sealed file holds exactly its batches: drop the zero padding.
        let io = |op, e| self.fail(StorageError::glommio(op, &path, e));
        file.truncate(size).await.map_err(|e| io("truncating", e))?;
        file.fdatasync().await.map_err(|e| io("fdatasync", e))?;
        write_index_files(&path, &index).await?;
        let new_path = self.inner.dir.join(log_file_name(new_base));
        // From here on a failure leaves the directory between two states (a
        // file at the new base, expired segments half removed): the log
        // fails rather than append past the new base into the old segment.
        let created = async {
            let made = self.new_segment_file(&new_path).await?;
            sync_dir(&self.inner.dir).await?;
            Ok::<_, StorageError>(made)
        };
        let (new_file, file_len) = created.await.map_err(|e| self.fail(e))?;
        {
            let mut st = self.inner.state.borrow_mut();
            let fresh = ActiveSegment::new(
                new_path,
                new_base,
                Rc::new(new_file),
                Recovered {
                    next_offset: new_base,
                    size: 0,
                    tail_block: Vec::new(),
                    index: SegmentIndex::new(),
                    file_len,
                },
            );
            let old = std::mem::replace(&mut st.active, fresh);
            let (meta, file, index) = old.seal();
            self.inner
                .shard
                .insert_open(meta.path.clone(), Rc::new(OpenSegment { file, index }));
            st.sealed.insert(meta.base, meta);
            st.stats.rolls += 1;
            st.stats.recycled += u64::from(file_len > 0);
        }
        // A reopened log notes the batches after its newest snapshot: with
        // one at every roll, at most the active segment's.
        self.save_producers(true).await
    }

    /// The file of a new segment at `path`, and the bytes it already holds:
    /// the largest of the sealed segments the retention policy lets go now,
    /// renamed (see "Recycling" above), else a new empty file. The other
    /// expired segments are deleted. Holds: the I/O lock, with the segment
    /// being sealed still the active one (retention never takes it).
    async fn new_segment_file(&self, path: &Path) -> Result<(DmaFile, u64)> {
        let config = &self.inner.config;
        let spare = match config.recycle_segments {
            true => self.take_expired(self.retention_policy(), now_ms() as i64),
            false => None,
        };
        if let Some((_, doomed)) = spare {
            // Oldest first, as retention deletes: a crash part-way leaves
            // the log without a prefix of its segments, never with a gap.
            let largest = doomed.iter().map(|s| s.size).max();
            let mut reused = None;
            for seg in doomed {
                if reused.is_some() || Some(seg.size) != largest {
                    remove_segment_files(&seg.path).await?;
                    continue;
                }
                match recycle(&seg.path, path, config).await {
                    // Its indexes go after the rename: a reader opening the
                    // old segment now fails to find it instead of rebuilding
                    // its index from the file being written over.
                    Ok(file) => {
                        reused = Some(file);
                        remove_index_files(&seg.path).await?;
                    }
                    Err(e) => {
                        warn!(segment = %seg.path.display(), "recycling failed, creating a new segment instead: {e}");
                        remove_segment_files(&seg.path).await?;
                    }
                }
            }
            if let Some(file) = reused {
                return Ok(file);
            }
        }
        let file = active::open_options(config)
            .create(true)
            .truncate(true)
            .dma_open(path)
            .await
            .map_err(|e| StorageError::glommio("creating", path, e))?;
        Ok((file, 0))
    }
}

/// Renames the segment file `old` to `new` and opens it for writing over.
async fn recycle(
    old: &Path,
    new: &Path,
    config: &LogConfig,
) -> std::result::Result<(DmaFile, u64), glommio::GlommioError<()>> {
    glommio::io::rename(old, new).await?;
    let file = active::open_options(config).dma_open(new).await?;
    let len = file.file_size().await?;
    Ok((file, len))
}
