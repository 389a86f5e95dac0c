//! What replication needs of the log besides appending: the leader-epoch
//! history (kept in step with the batches, checkpointed, rebuilt from the
//! batch headers when its file is missing or does not match the log), the
//! high watermark's checkpoint, and where an epoch ends.
//!
//! Runs on: the shard that owns the log. File layouts: `crate::checkpoint`.
//!
//! - The epoch checkpoint is written before the batches of a new epoch
//!   (`write_locked`), after a truncation, and by [`Log::checkpoint`].
//! - The high watermark is written lazily: by [`Log::checkpoint`] (the
//!   broker calls it now and then, and at close). A restarted replica
//!   starts from the last one written, never from its log end: what it
//!   shows consumers was committed. A log without one (written before
//!   replication, or the file lost) starts at its log start; the broker
//!   moves a one-replica partition's to its flushed end at once.
//! - Opening trusts the epoch checkpoint only if, cut to the log's extent,
//!   it starts at the log start and its latest epoch is the last batch's;
//!   otherwise the history is rebuilt. Epochs never decrease along a log,
//!   so a segment whose first batch has the epoch of the next segment's
//!   first batch holds only that epoch: the rebuild reads each segment's
//!   first batch and walks only the segments in which the epoch changes.

use super::Log;
use crate::batch::BatchHeader;
use crate::checkpoint::{self, EPOCHS_FILE, HIGH_WATERMARK_FILE};
use crate::epochs::EpochHistory;
use crate::error::Result;
use crate::{LeaderEpoch, Offset};

/// Bytes read at a time while walking a segment for its epochs.
pub(super) const WALK_BYTES: usize = 1 << 20;

impl Log {
    /// The leader-epoch history (epoch → first offset), oldest first.
    pub fn epochs(&self) -> EpochHistory {
        self.inner.state.borrow().epochs.clone()
    }

    /// The epoch of the last batch, if the log holds any.
    pub fn latest_epoch(&self) -> Option<LeaderEpoch> {
        self.inner.state.borrow().epochs.latest().map(|e| e.epoch)
    }

    /// Where `epoch` ends in this log (see
    /// [`EpochHistory::end_offset_for`]): what a leader answers a follower
    /// whose last batch has that epoch.
    pub fn end_offset_for_epoch(&self, epoch: LeaderEpoch) -> Option<(LeaderEpoch, Offset)> {
        let st = self.inner.state.borrow();
        st.epochs.end_offset_for(epoch, st.log_end())
    }

    /// Writes the high watermark, the epoch history and a producer snapshot
    /// where they changed since last written. Cheap when nothing changed.
    pub async fn checkpoint(&self) -> Result<()> {
        let dirty = {
            let st = self.inner.state.borrow();
            st.check_usable(&self.inner.dir)?;
            st.epochs_dirty
        };
        if dirty {
            let _permit = self.lock().await?;
            self.save_epochs_locked().await?;
        }
        self.save_high_watermark().await?;
        self.save_producers(false).await
    }

    /// Writes the high watermark if it is not the one last written (under
    /// the checkpoint lock: writers share the temporary file).
    pub(super) async fn save_high_watermark(&self) -> Result<()> {
        let _permit = self.checkpoint_turn().await?;
        let hw = {
            let st = self.inner.state.borrow();
            // Damage keeps the checkpoint as it was: it is the evidence that
            // the log lost committed records, until the broker saw to it.
            // No higher than what is durable here: on an interval log the
            // high watermark follows written data, and a record below the
            // checkpoint must be one this log had made durable.
            let hw = st.high_watermark.min(st.durable());
            if st.high_watermark_saved == Some(hw) || st.damage.is_some() {
                return Ok(());
            }
            hw
        };
        checkpoint::write_atomically(
            &self.inner.dir,
            HIGH_WATERMARK_FILE,
            checkpoint::encode_high_watermark(hw),
            // Durable: a log found to end below it after a crash lost
            // committed records (`Log::damage`).
            true,
        )
        .await?;
        self.inner.state.borrow_mut().high_watermark_saved = Some(hw);
        Ok(())
    }

    /// The checkpoint lock: writers of the high watermark share its
    /// temporary file, and producer snapshots are written and removed under
    /// it (`producers.rs`).
    pub(super) async fn checkpoint_turn(&self) -> Result<glommio::sync::Permit<'_>> {
        self.inner
            .checkpoint_lock
            .acquire_permit(1)
            .await
            .map_err(|_| crate::error::StorageError::Closed)
    }

    /// Writes the epoch history if it changed. Holds: the I/O lock (so
    /// writes of the history do not overtake each other).
    pub(super) async fn save_epochs_locked(&self) -> Result<()> {
        let history = {
            let mut st = self.inner.state.borrow_mut();
            if !st.epochs_dirty {
                return Ok(());
            }
            st.epochs_dirty = false;
            st.epochs.clone()
        };
        let written =
            checkpoint::write_atomically(&self.inner.dir, EPOCHS_FILE, checkpoint::encode_epochs(&history), true).await;
        if written.is_err() {
            self.inner.state.borrow_mut().epochs_dirty = true;
        }
        written
    }

    /// At open: the epoch history and the high watermark from their
    /// checkpoints, checked against the log (see the module doc).
    pub(super) async fn load_replication_state(&self) -> Result<()> {
        let dir = self.inner.dir.clone();
        let (log_start, log_end) = {
            let st = self.inner.state.borrow();
            (st.log_start, st.log_end())
        };
        let last = match log_end > log_start {
            true => self
                .first_header_from(Offset(log_end.0 - 1))
                .await?
                .map(|h| h.leader_epoch),
            false => None,
        };
        let saved = checkpoint::read(&dir, EPOCHS_FILE, checkpoint::decode_epochs).await?;
        let trusted = saved.and_then(|mut h| {
            h.truncate_end(log_end);
            h.truncate_start(log_start);
            let first_ok = h.entries().first().is_none_or(|e| e.start == log_start);
            (first_ok && h.latest().map(|e| e.epoch) == last).then_some(h)
        });
        let (epochs, dirty) = match trusted {
            Some(h) => (h, false),
            None => (self.rebuild_epochs(log_start, log_end).await?, true),
        };
        let saved_hw = checkpoint::read(&dir, HIGH_WATERMARK_FILE, checkpoint::decode_high_watermark).await?;
        let hw = saved_hw.map_or(log_start, |hw| hw.clamp(log_start, log_end));
        let mut st = self.inner.state.borrow_mut();
        // On an fsync=always log every committed record was fdatasync'd
        // here before the high watermark passed it: ending below the
        // checkpoint means records were lost after they were durable.
        let always = self.inner.config.fsync == crate::config::FsyncPolicy::Always;
        if let Some(saved) = saved_hw.filter(|saved| always && *saved > log_end && st.damage.is_none()) {
            st.damage = Some(format!(
                "the log ends at offset {log_end}, below the high watermark {saved} its checkpoint holds"
            ));
        }
        st.epochs = epochs;
        st.epochs_dirty = dirty;
        st.high_watermark = hw;
        Ok(())
    }

    /// The history from the batch headers (see the module doc).
    async fn rebuild_epochs(&self, log_start: Offset, log_end: Offset) -> Result<EpochHistory> {
        let mut history = EpochHistory::new();
        if log_end <= log_start {
            return Ok(history);
        }
        // Each segment's first offset (the first from the log start), and
        // the first batch's epoch there; then the log end.
        let mut bases: Vec<Offset> = {
            let st = self.inner.state.borrow();
            st.sealed.keys().copied().chain([st.active.base]).collect()
        };
        bases.retain(|b| *b < log_end);
        if let Some(first) = bases.first_mut() {
            *first = (*first).max(log_start);
        }
        let mut firsts = Vec::with_capacity(bases.len());
        for base in &bases {
            firsts.push(self.first_header_from(*base).await?);
        }
        let last = self.first_header_from(Offset(log_end.0 - 1)).await?;
        for (i, first) in firsts.iter().enumerate() {
            let Some(first) = first else { continue };
            let next_epoch = match firsts.get(i + 1) {
                Some(next) => next.map(|h| h.leader_epoch),
                None => last.map(|h| h.leader_epoch),
            };
            note(&mut history, first.leader_epoch, first.base_offset);
            if next_epoch != Some(first.leader_epoch) {
                let end = bases.get(i + 1).copied().unwrap_or(log_end);
                self.walk_headers(first.base_offset, end, |h| {
                    note(&mut history, h.leader_epoch, h.base_offset)
                })
                .await?;
            }
        }
        Ok(history)
    }

    /// The header of the batch holding `offset`, if there is one.
    async fn first_header_from(&self, offset: Offset) -> Result<Option<BatchHeader>> {
        let read = self.read(offset, 1).await?;
        Ok(read.batches.first().and_then(|b| BatchHeader::parse(b)))
    }
}

/// Notes a batch's epoch in a history being rebuilt; a batch older than the
/// latest epoch (which no leader writes) is logged and left out.
fn note(history: &mut EpochHistory, epoch: LeaderEpoch, base: Offset) {
    if let Err(e) = history.observe(epoch, base) {
        tracing::warn!("rebuilding leader epochs: {e}; ignored");
    }
}
