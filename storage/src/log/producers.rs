//! The log's idempotent-producer table (`crate::producers`): checked by the
//! produce path, noted by every append, snapshotted beside the segments and
//! rebuilt at open and after a truncation.
//!
//! Runs on: the shard that owns the log. Snapshot layout:
//! `crate::checkpoint`; when they are written and how the table is rebuilt:
//! `crate::producers`, "Snapshots".
//!
//! Snapshot files are written and removed under the checkpoint lock, so a
//! snapshot being written when a truncation runs cannot land after the
//! truncation removed those past its cut (it would describe batches the log
//! no longer has). Lock order: the I/O lock, then the checkpoint lock.

use std::path::PathBuf;

use tracing::warn;

use super::Log;
use crate::batch::BatchHeader;
use crate::checkpoint::{self, decode_producers, encode_producers, parse_producers_file_name, producers_file_name};
use crate::error::{Result, StorageError};
use crate::producers::{ProducerTable, Sequenced, Verdict};
use crate::segment::io::{remove_file, sync_dir};
use crate::Offset;

/// Snapshots kept: the newest and the one before (should the newest be
/// damaged).
const SNAPSHOTS_KEPT: usize = 2;

impl Log {
    /// What to do with a producer's batch (see `crate::producers`). The
    /// caller appends one batch at a time per partition from this check to
    /// the append, which notes the batch.
    pub fn check_producer(&self, batch: Sequenced) -> Verdict {
        self.inner.state.borrow().producers.check(batch)
    }

    /// Producers the table remembers.
    pub fn producer_count(&self) -> usize {
        self.inner.state.borrow().producers.len()
    }

    /// Writes a snapshot of the producer table at the log end: always when
    /// `always`, else only if the log moved since the last one (so the
    /// batches a reopen must note are at most those of one checkpoint
    /// period, idempotent or not). Then removes all but the newest
    /// [`SNAPSHOTS_KEPT`].
    pub(super) async fn save_producers(&self, always: bool) -> Result<()> {
        let _permit = self.checkpoint_turn().await?;
        let (end, bytes) = {
            let mut st = self.inner.state.borrow_mut();
            let end = st.log_end();
            if !always && st.producers_saved_at == Some(end) {
                return Ok(());
            }
            st.producers_saved_at = Some(end);
            (end, encode_producers(end, &st.producers))
        };
        let name = producers_file_name(end);
        if let Err(e) = checkpoint::write_atomically(&self.inner.dir, &name, bytes, true).await {
            self.inner.state.borrow_mut().producers_saved_at = None;
            return Err(e);
        }
        let doomed: Vec<Offset> = {
            let mut st = self.inner.state.borrow_mut();
            if st.producer_snapshots.last() != Some(&end) {
                st.producer_snapshots.push(end);
            }
            let extra = st.producer_snapshots.len().saturating_sub(SNAPSHOTS_KEPT);
            st.producer_snapshots.drain(..extra).collect()
        };
        for offset in doomed {
            remove_file(&self.inner.dir.join(producers_file_name(offset))).await?;
        }
        Ok(())
    }

    /// Rebuilds the table from the newest readable snapshot at or below the
    /// log end and the batches after it (see `crate::producers`); snapshots
    /// past the log end (taken before a crash lost the tail, or before a
    /// truncation) are removed first, durably. `empty`: start from an empty
    /// table and remove every snapshot (a log started over). At open, and
    /// by a truncation under the I/O lock. With no readable snapshot the
    /// batches are read from the log start when `whole_log` (at open: a
    /// producer forgotten there could have a retry stored twice), else
    /// from the active segment (a truncation: a retention's worth of
    /// headers read under the I/O lock would hold replication up; a
    /// producer last seen before it is then unknown to this replica).
    pub(super) async fn rebuild_producers(&self, empty: bool, whole_log: bool) -> Result<()> {
        let _permit = self.checkpoint_turn().await?;
        let (log_start, log_end, active_base) = {
            let st = self.inner.state.borrow();
            (st.log_start, st.log_end(), st.active.base.max(st.log_start))
        };
        let mut snapshots = self.producer_snapshots()?;
        let mut removed = false;
        while let Some((offset, path)) = snapshots.last() {
            if !empty && *offset <= log_end {
                break;
            }
            remove_file(path).await?;
            snapshots.pop();
            removed = true;
        }
        if removed {
            sync_dir(&self.inner.dir).await?;
        }
        self.inner.state.borrow_mut().producer_snapshots = snapshots.iter().map(|(o, _)| *o).collect();
        let mut base = None;
        for (_, path) in snapshots.iter().rev() {
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if let Some(found) = checkpoint::read(&self.inner.dir, name, decode_producers).await? {
                base = Some(found);
                break;
            }
        }
        let had_snapshot = base.is_some();
        let (from, mut table) = match base {
            Some((offset, table)) => (offset.max(log_start), table),
            None if whole_log => (log_start, ProducerTable::default()),
            None => (active_base, ProducerTable::default()),
        };
        if let Err(e) = self.note_batches(&mut table, from, log_end).await {
            // Damage in older segments (found by readers only) must not
            // keep the log from opening: the active segment's batches then.
            if had_snapshot || from >= active_base {
                return Err(e);
            }
            warn!(
                dir = %self.inner.dir.display(),
                "rebuilding the producer table from the log start: {e}; from the active segment instead (a producer \
                 last seen before it is unknown)"
            );
            table = ProducerTable::default();
            self.note_batches(&mut table, active_base, log_end).await?;
        }
        self.inner.state.borrow_mut().producers = table;
        Ok(())
    }

    /// Notes in `table` every batch of the log from `from` to `to`.
    async fn note_batches(&self, table: &mut ProducerTable, from: Offset, to: Offset) -> Result<()> {
        self.walk_headers(from, to, |h| {
            if h.base_offset >= from {
                table.note_stored(h);
            }
        })
        .await
    }

    /// The producer snapshot files in the log's directory, oldest first.
    fn producer_snapshots(&self) -> Result<Vec<(Offset, PathBuf)>> {
        let dir = &self.inner.dir;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| StorageError::io("listing", dir, e))? {
            let entry = entry.map_err(|e| StorageError::io("listing", dir, e))?;
            if let Some(offset) = entry.file_name().to_str().and_then(parse_producers_file_name) {
                found.push((offset, entry.path()));
            }
        }
        found.sort();
        Ok(found)
    }

    /// Calls `each` with the header of every batch from the one holding
    /// `from` up to `end`.
    pub(super) async fn walk_headers(
        &self,
        mut from: Offset,
        end: Offset,
        mut each: impl FnMut(&BatchHeader),
    ) -> Result<()> {
        while from < end {
            let read = self.read(from, super::replica::WALK_BYTES).await?;
            if read.batches.is_empty() || read.next_offset <= from {
                break;
            }
            for b in &read.batches {
                if let Some(h) = BatchHeader::parse(b) {
                    each(&h);
                }
            }
            from = read.next_offset;
        }
        Ok(())
    }
}
