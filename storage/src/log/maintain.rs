//! Reshaping the log: truncation (replication), retention, close.

use std::collections::BTreeMap;

use super::{mono_ms, open_active, Log};
use crate::checkpoint::{self, CLEAN_CLOSE_FILE};
use crate::error::Result;
use crate::journal::format::Change;
use crate::retention::{cut_offset, RetentionPolicy, SegmentSummary};
use crate::scan::{scan_one_with, ScanStep};
use crate::segment::io::{read_range, remove_file, sync_dir};
use crate::segment::{index_path, log_file_name, time_index_path, SealedSegment};
use crate::Offset;

impl Log {
    /// Removes every record at or after `offset`. A batch is never split: if
    /// `offset` falls inside one, that whole batch goes. Returns the new log
    /// end. Truncating at or below the log start empties the log and starts
    /// it again at `offset` (a follower far behind its leader's retention).
    pub async fn truncate_to(&self, offset: Offset) -> Result<Offset> {
        self.reshape(offset, false).await
    }

    /// Empties the log and starts it again at `offset`, wherever its end
    /// is: a follower whose log ends before its leader's log start (the
    /// leader's retention removed what it would fetch) goes on from there.
    /// Everything before `offset` counts as committed (the leader retained
    /// only committed records past it): the high watermark starts there.
    pub async fn start_over_at(&self, offset: Offset) -> Result<()> {
        self.reshape(offset, true).await.map(|_| ())
    }

    async fn reshape(&self, offset: Offset, start_over: bool) -> Result<Offset> {
        let _permit = self.lock().await?;
        self.inner.state.borrow_mut().reshaping = true;
        let result = self.truncate_inner(offset, start_over).await;
        self.inner.state.borrow_mut().reshaping = false;
        result
    }

    async fn truncate_inner(&self, offset: Offset, start_over: bool) -> Result<Offset> {
        let _sync = self.lock_sync().await?;
        self.write_locked().await?;
        self.finish_zeroing().await;
        self.sync_held().await?;
        // Bytes read ahead may be about to change.
        self.inner.state.borrow_mut().readahead.clear();
        let (log_start, log_end, active_base) = {
            let st = self.inner.state.borrow();
            (st.log_start, st.log_end(), st.active.base)
        };
        if offset >= log_end && !start_over {
            return Ok(log_end);
        }
        let (keep_base, cut_pos, new_end) = if offset <= log_start || start_over {
            // Start over at `offset` in a fresh segment.
            (offset, None, offset)
        } else {
            let keep_base = if offset >= active_base {
                active_base
            } else {
                let st = self.inner.state.borrow();
                *st.sealed
                    .range(..=offset)
                    .next_back()
                    .map(|(b, _)| b)
                    .unwrap_or(&active_base)
            };
            // A batch is never split: the log ends where the batch holding
            // `offset` begins.
            let (pos, end) = self.batch_position(keep_base, offset).await?;
            (keep_base, Some(pos), end)
        };
        // The cut, with where the log will end, is durable in the journal
        // before any file changes: a replay after a crash part-way must not
        // bring back what it cuts. From here on a failure fails a journaled
        // log: the journal says the cut happened.
        let change = match start_over {
            true => Change::StartOver { at: offset },
            false => Change::Truncation { log_end: new_end },
        };
        let _cut_pin = self.journal_cut(change).await?;
        let result = self.cut_files(offset, start_over, keep_base, cut_pos).await;
        match (&self.inner.journal, result) {
            (Some(_), Err(e)) => Err(self.fail(e)),
            (_, result) => result,
        }
    }

    /// Removes the segments past the cut and reopens the one it falls in
    /// (`cut_pos`: the position in the segment at `keep_base`; `None`: start
    /// over, empty, at `keep_base`). Holds: the I/O and sync locks.
    async fn cut_files(
        &self,
        offset: Offset,
        start_over: bool,
        keep_base: Offset,
        cut_pos: Option<u64>,
    ) -> Result<Offset> {
        let config = &self.inner.config;
        let doomed = match cut_pos {
            None => {
                let mut doomed = paths(self.take_sealed(|_| true));
                doomed.push(self.inner.state.borrow().active.path.clone());
                doomed
            }
            Some(_) => {
                let active_base = self.inner.state.borrow().active.base;
                let mut doomed = paths(self.take_sealed(|b| b >= keep_base));
                if keep_base != active_base {
                    doomed.retain(|p| *p != self.inner.dir.join(log_file_name(keep_base)));
                    doomed.push(self.inner.state.borrow().active.path.clone());
                }
                doomed
            }
        };
        debug_assert!(cut_pos.is_some() || keep_base == offset);
        // Newest first: a crash part-way leaves a shorter log, never a gap.
        let mut doomed = doomed;
        doomed.sort();
        for path in doomed.iter().rev() {
            self.inner.shard.forget(path);
            remove_segment_files(path).await?;
        }
        let path = self.inner.dir.join(log_file_name(keep_base));
        self.inner.shard.forget(&path);
        let (active, _) = open_active(&path, keep_base, config, Some(cut_pos.unwrap_or(0)), true, None).await?;
        sync_dir(&self.inner.dir).await?;
        let end = {
            let mut st = self.inner.state.borrow_mut();
            st.active = active;
            // Readers may have read ahead meanwhile, from the files as they were.
            st.readahead.clear();
            let end = st.log_end();
            if cut_pos.is_none() {
                st.log_start = keep_base;
            }
            if start_over {
                st.cache.clear();
            } else {
                st.cache.truncate(end);
            }
            st.flushed = end;
            st.journal.cut(end);
            // Everything before the cut was synced above.
            st.journal.frames.clear();
            st.high_watermark = if start_over { end } else { st.high_watermark.min(end) };
            if start_over {
                // None of the epochs the log held has a batch any more.
                st.epochs = crate::epochs::EpochHistory::new();
                st.epochs_dirty = true;
            } else if st.epochs.truncate_end(end) {
                st.epochs_dirty = true;
            }
            let start = st.log_start;
            if st.epochs.truncate_start(start) {
                st.epochs_dirty = true;
            }
            end
        };
        // The history must not name epochs the log no longer has.
        self.save_epochs_locked().await?;
        // Nor the producer table batches it no longer has.
        self.rebuild_producers(start_over, false).await?;
        Ok(end)
    }

    /// Removes the sealed segments whose base matches `pred` from the map,
    /// returning their paths.
    fn take_sealed(&self, pred: impl Fn(Offset) -> bool) -> Vec<SealedSegment> {
        let mut st = self.inner.state.borrow_mut();
        let all = std::mem::take(&mut st.sealed);
        let (gone, kept): (BTreeMap<Offset, SealedSegment>, BTreeMap<Offset, SealedSegment>) =
            all.into_iter().partition(|(b, _)| pred(*b));
        st.sealed = kept;
        gone.into_values().collect()
    }

    /// File position of the batch holding `offset` in the segment at
    /// `base`, and that batch's base offset (where a cut there leaves the
    /// log's end); the segment's end and next offset if no batch holds it.
    async fn batch_position(&self, base: Offset, offset: Offset) -> Result<(u64, Offset)> {
        let path = self.inner.dir.join(log_file_name(base));
        let rel = (offset.0 - base.0) as u32;
        let active = {
            let st = self.inner.state.borrow();
            if st.active.base == base {
                Ok((
                    st.active.file.clone(),
                    st.active.index.lookup_offset(rel),
                    st.active.size(),
                ))
            } else {
                Err(st.sealed.get(&base).cloned().ok_or(crate::StorageError::Closed))
            }
        };
        let (file, entry, end) = match active {
            Ok(found) => found,
            Err(seg) => {
                let seg = seg?;
                let open = self.inner.shard.sealed(&seg, &self.inner.config).await?;
                (open.file.clone(), open.index.lookup_offset(rel), seg.size)
            }
        };
        let mut pos = u64::from(entry.1);
        let mut expected = base.plus(u64::from(entry.0));
        loop {
            let head = read_range(&file, &path, pos, crate::batch::HEADER_LEN).await?;
            let len = crate::batch::batch_length(&head).unwrap_or(0) as u64;
            let whole = read_range(&file, &path, pos, len as usize).await?;
            match scan_one_with(
                &whole,
                pos,
                true,
                Some(expected),
                self.inner.config.stored_batch_bytes_max(),
                false,
            ) {
                ScanStep::Batch(b) if b.header.next_offset() > offset => return Ok((pos, b.header.base_offset)),
                ScanStep::Batch(b) => {
                    pos = b.end();
                    expected = b.header.next_offset();
                }
                _ if pos >= end => return Ok((end, expected)),
                other => {
                    return Err(crate::StorageError::CorruptSegment {
                        path,
                        position: pos,
                        reason: format!("{other:?} while looking for offset {offset}"),
                    })
                }
            }
        }
    }

    /// Deletes whole sealed segments past the retention policy (never the
    /// active one) and moves the log start up. Returns the new log start if
    /// it moved.
    pub async fn enforce_retention(&self, policy: RetentionPolicy, now_ms: i64) -> Result<Option<Offset>> {
        let _permit = self.lock().await?;
        self.inner.state.borrow().check_usable(&self.inner.dir)?;
        let Some((cut, doomed)) = self.take_expired(policy, now_ms) else {
            return Ok(None);
        };
        for seg in &doomed {
            remove_segment_files(&seg.path).await?;
        }
        Ok(Some(cut))
    }

    /// Takes the sealed segments past `policy` out of the log: the log start
    /// moves past them and the shard closes their files, so no new read
    /// reaches them (a read already under way checks the log start again
    /// when its I/O is done). The caller deletes (or recycles) the files.
    /// Holds: the I/O lock.
    pub(super) fn take_expired(&self, policy: RetentionPolicy, now_ms: i64) -> Option<(Offset, Vec<SealedSegment>)> {
        let cut = {
            let st = self.inner.state.borrow();
            let summaries: Vec<SegmentSummary> = st
                .sealed
                .values()
                .map(|s| SegmentSummary {
                    base: s.base,
                    size: s.size,
                    max_timestamp: s.max_timestamp,
                })
                .collect();
            cut_offset(policy, &summaries, st.active.base, st.active.size(), now_ms)?
        };
        self.take_below(cut)
    }

    /// Deletes the sealed segments that hold only records below `offset`
    /// (never the active one, never past the high watermark): the log start
    /// moves to the base of the segment holding `offset` — Kafka's
    /// DeleteRecords at segment granularity, for a log whose older records
    /// a snapshot replaced (`__groups`) and for a follower keeping up with
    /// its leader's log start. Returns the new log start if it moved.
    pub async fn delete_before(&self, offset: Offset) -> Result<Option<Offset>> {
        // Nothing to delete (the usual case of a follower keeping up): no lock.
        if self.delete_cut(offset).is_none() {
            return Ok(None);
        }
        let _permit = self.lock().await?;
        self.inner.state.borrow().check_usable(&self.inner.dir)?;
        let Some((cut, doomed)) = self.delete_cut(offset).and_then(|cut| self.take_below(cut)) else {
            return Ok(None);
        };
        for seg in &doomed {
            remove_segment_files(&seg.path).await?;
        }
        Ok(Some(cut))
    }

    /// Whether [`Log::delete_before`] of `offset` would delete a segment.
    pub fn deletable_before(&self, offset: Offset) -> bool {
        self.delete_cut(offset).is_some()
    }

    /// Where [`Log::delete_before`] of `offset` cuts: the base of the
    /// segment holding `offset` (at most the high watermark), if a sealed
    /// segment lies below it.
    fn delete_cut(&self, offset: Offset) -> Option<Offset> {
        let st = self.inner.state.borrow();
        let upto = offset.min(st.high_watermark);
        let cut = st
            .sealed
            .keys()
            .copied()
            .chain(std::iter::once(st.active.base))
            .filter(|b| *b <= upto)
            .max()?;
        st.sealed.keys().any(|b| *b < cut).then_some(cut)
    }

    /// Takes the sealed segments whose base is below `cut` (the base of a
    /// kept segment) out of the log, as [`Log::take_expired`] says.
    fn take_below(&self, cut: Offset) -> Option<(Offset, Vec<SealedSegment>)> {
        let doomed = self.take_sealed(|b| b < cut);
        if doomed.is_empty() {
            return None;
        }
        {
            let mut st = self.inner.state.borrow_mut();
            st.log_start = st.log_start.max(cut);
            let start = st.log_start;
            // Written with the next checkpoint; opening cuts a stale one.
            if st.epochs.truncate_start(start) {
                st.epochs_dirty = true;
            }
            st.high_watermark = st.high_watermark.max(start);
        }
        for seg in &doomed {
            self.inner.shard.forget(&seg.path);
        }
        Some((cut, doomed))
    }

    /// The retention policy of this log's config.
    pub fn retention_policy(&self) -> RetentionPolicy {
        RetentionPolicy {
            time_ms: self.inner.config.retention_ms,
            bytes: self.inner.config.retention_bytes,
        }
    }

    /// Writes and fdatasyncs everything, persists the active index, and
    /// closes the log: later calls fail with `Closed`. A failed log (see
    /// [`StorageError::LogFailed`]) writes nothing more of its data: it
    /// saves what it can of its checkpoints and closes, so that the
    /// directory can be opened again (recovering what the disk holds).
    pub async fn close(&self) -> Result<()> {
        let _permit = self.lock().await?;
        if self.inner.state.borrow().closed {
            return Ok(());
        }
        // Appends wait for the I/O lock from here on, and then find the log
        // closed: none is taken (and journaled, and acknowledged) after the
        // last write.
        self.inner.state.borrow_mut().reshaping = true;
        let result = self.close_locked().await;
        self.inner.state.borrow_mut().reshaping = false;
        result
    }

    /// `close` once it holds the I/O lock. A close that fails part way (a
    /// full disk: the journal failed under a log not marked failed itself)
    /// still closes: the log takes nothing more and its cached segment
    /// files are let go — else a deleted queue's files stayed open and
    /// their space was not freed until a restart — and the error is
    /// returned. The log is marked failed first, so what only the journal
    /// holds of it stays replayable until the restart (as after any failed
    /// write); the next open recovers from the disk and that replay.
    async fn close_locked(&self) -> Result<()> {
        let _sync = self.lock_sync().await?;
        let result = if self.inner.state.borrow().failed.is_some() {
            self.finish_zeroing().await;
            // Best effort: the next open checks its data against them
            // (and rebuilds what is missing) as after a crash.
            let _ = self.save_epochs_locked().await;
            let _ = self.save_high_watermark().await;
            Ok(())
        } else {
            match self.close_cleanly().await {
                Ok(()) => Ok(()),
                Err(e) => {
                    self.finish_zeroing().await;
                    // Failed: what only the journal holds of this log stays
                    // replayable until the restart (`fail`).
                    Err(self.fail(e))
                }
            }
        };
        self.inner.shard.forget_dir(&self.inner.dir);
        let mut st = self.inner.state.borrow_mut();
        st.closed = true;
        st.cache.clear();
        st.readahead.clear();
        st.last_sync_ms = mono_ms();
        result
    }

    /// Everything written, synced and checkpointed, marked a clean close.
    async fn close_cleanly(&self) -> Result<()> {
        self.write_locked().await?;
        self.finish_zeroing().await;
        self.sync_held().await?;
        // The segment holds everything: the journal need not.
        self.detach_from_journal().await?;
        self.persist_index_locked(true).await?;
        self.save_epochs_locked().await?;
        // The high watermark as it is now (the next open starts from it).
        self.save_high_watermark().await?;
        // The next open then has no batch to note.
        self.save_producers(true).await?;
        // Everything above is durable: the next open may trust the
        // indexes (`Log::open`).
        checkpoint::write_atomically(&self.inner.dir, CLEAN_CLOSE_FILE, Vec::new(), true).await
    }
}

fn paths(segments: Vec<SealedSegment>) -> Vec<std::path::PathBuf> {
    segments.into_iter().map(|s| s.path).collect()
}

pub(super) async fn remove_segment_files(path: &std::path::Path) -> Result<()> {
    remove_file(path).await?;
    remove_index_files(path).await
}

/// Removes the offset and time index files of the segment at `path`.
pub(super) async fn remove_index_files(path: &std::path::Path) -> Result<()> {
    remove_file(&index_path(path)).await?;
    remove_file(&time_index_path(path)).await
}
