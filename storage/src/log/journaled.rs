//! A log whose appends the shard journal makes durable (`crate::journal`).
//!
//! Runs on: the shard that owns the log, with the shard's journal.
//!
//! A log journals when its policy is `fsync=always`, `LogConfig::journal`
//! is on and its shard has a journal (`ShardStorage::start_journal`). Then:
//! - every append (a producer's or a replica's) also goes into the journal,
//!   in the same step that queues it for the segment, so the journal holds
//!   the log's batches in log order;
//! - [`Log::wait_durable`] waits for the journal frame holding the batch,
//!   not for a write and flush of the segment: the *journaled* offset moves,
//!   and [`Log::flushed_offset`] (what replication and acks go by) is the
//!   larger of it and the segment's flushed offset;
//! - the segment is written behind, without `O_DSYNC`: when its staging
//!   buffer passes `pending_bytes_max`, and at a checkpoint
//!   ([`Log::checkpoint_journal`]: write, fdatasync, then drop the pins);
//!   the shard's checkpointer calls it once a log's oldest pin is older than
//!   the checkpoint interval, or for every log when the journal holds more
//!   files than its spare count;
//! - a truncation or start-over is journaled and durable before the log is
//!   cut, so recovery never brings back what it cut (`maintain.rs`);
//! - the log's directory holds `.journal-id`, a random id that names this
//!   log in journal entries (a log created again in the same directory
//!   gets another, so entries of the old one are not replayed into it); a
//!   clean close that made everything durable in the segment gives the
//!   directory a new one, so that the old entries (their truncations
//!   above all) are never applied to what a later open appends, journaled
//!   or not;
//! - a log that fails has the journal hold its oldest pinned frame until
//!   the journal is replayed (`Journal::hold_until_restart`): the log may
//!   be dropped first, and the replay must still find what only the
//!   journal held. That replay is the start-up one, or the broker's
//!   in-place one once the disk has room again (`strand-broker`'s
//!   `shard::recover`: the shard's journal stopped, its journaled logs
//!   closed, the journal replayed and started again, the logs reopened).

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;

use super::{mono_ms, Log, WeakLog};
use crate::error::{Result, StorageError};
use crate::journal::format::Change;
use crate::journal::{Journal, JournalPin};
use crate::Offset;

/// The file holding a log's journal id (16 hex digits).
pub const JOURNAL_ID_FILE: &str = ".journal-id";

/// How a log names itself in its shard's journal.
pub(super) struct LogJournal {
    pub journal: Journal,
    /// The log's directory, relative to the data directory.
    pub dir: String,
    pub id: u64,
}

/// A journal frame this log has entries in that its segment has not yet
/// made durable.
pub(super) struct PinnedFrame {
    pub lsn: u64,
    /// The offset after this log's last batch in the frame.
    pub end: Offset,
    /// When the first entry went in (mono ms).
    pub since_ms: u64,
    _pin: JournalPin,
}

/// The journal bookkeeping in the log's state.
#[derive(Default)]
pub(super) struct JournalState {
    /// Every offset below it is durable in the journal.
    pub journaled: Offset,
    /// Oldest first.
    pub frames: VecDeque<PinnedFrame>,
    /// Whether this open added anything to the journal.
    pub used: bool,
}

impl JournalState {
    /// Notes an entry of this log ending at `end` in frame `lsn`.
    fn note(&mut self, journal: &Journal, lsn: u64, end: Offset) {
        self.used = true;
        match self.frames.back_mut() {
            Some(last) if last.lsn == lsn => last.end = end,
            _ => self.frames.push_back(PinnedFrame {
                lsn,
                end,
                since_ms: mono_ms(),
                _pin: journal.pin(lsn),
            }),
        }
    }

    /// Drops the pins of frames whose entries are all below `flushed`
    /// (durable in the segment).
    pub fn release_below(&mut self, flushed: Offset) -> bool {
        let before = self.frames.len();
        while self.frames.front().is_some_and(|f| f.end <= flushed) {
            self.frames.pop_front();
        }
        self.frames.len() != before
    }

    /// After a cut to `end`: nothing past it is journaled any more.
    pub fn cut(&mut self, end: Offset) {
        self.journaled = self.journaled.min(end);
    }
}

/// The journal id in `dir`, created (durably) if there is none.
pub(super) fn journal_id(dir: &Path) -> Result<u64> {
    let path = dir.join(JOURNAL_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => u64::from_str_radix(text.trim(), 16).map_err(|_| StorageError::CorruptSegment {
            path: path.clone(),
            position: 0,
            reason: format!("not a journal id: {text:?}"),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => new_journal_id(dir),
        Err(e) => Err(StorageError::io("reading", &path, e)),
    }
}

/// Gives `dir` a new random journal id, durably (written whole to a
/// temporary file, fsync'd, renamed over the old one, the directory
/// fsync'd).
fn new_journal_id(dir: &Path) -> Result<u64> {
    let path = dir.join(JOURNAL_ID_FILE);
    let id = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let tmp = dir.join(format!("{JOURNAL_ID_FILE}.tmp"));
    let write = || -> std::io::Result<()> {
        std::fs::write(&tmp, format!("{id:016x}\n"))?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| StorageError::io("writing", &path, e))?;
    Ok(id)
}

/// The journal id in `dir`, if it has one that reads (replay).
pub(crate) fn read_journal_id(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join(JOURNAL_ID_FILE)).ok()?;
    u64::from_str_radix(text.trim(), 16).ok()
}

impl Log {
    /// Whether this log's appends go through the shard journal.
    pub fn journaled(&self) -> bool {
        self.inner.journal.is_some()
    }

    /// Adds a just-queued batch to the journal. Called in the same borrow
    /// as the queueing: journal order is log order.
    pub(super) fn journal_append(
        &self,
        st: &mut super::State,
        base: Offset,
        bytes: &bytes::Bytes,
        end: Offset,
    ) -> Result<()> {
        let Some(j) = &self.inner.journal else {
            return Ok(());
        };
        let change = Change::Batches {
            base,
            bytes: bytes.clone(),
        };
        let lsn = j.journal.add(&j.dir, j.id, &change)?;
        st.journal.note(&j.journal, lsn, end);
        Ok(())
    }

    /// Journals a cut of the log (a truncation or a start-over) and waits
    /// until it is durable. Holds: the I/O lock.
    pub(super) async fn journal_cut(&self, change: Change) -> Result<Option<JournalPin>> {
        let Some(j) = &self.inner.journal else {
            return Ok(None);
        };
        let lsn = j.journal.add(&j.dir, j.id, &change).map_err(|e| self.fail(e))?;
        self.inner.state.borrow_mut().journal.used = true;
        let pin = j.journal.pin(lsn);
        j.journal.wait(lsn).await.map_err(|e| self.fail(e))?;
        Ok(Some(pin))
    }

    /// `wait_durable` for a journaling log: waits for the frame holding
    /// `last_offset`.
    pub(super) async fn wait_journaled(&self, j: &LogJournal, last_offset: Offset) -> Result<()> {
        loop {
            // Usable, in range (a truncation may have cut it), durable?
            if self.durable_enough(last_offset, crate::FsyncPolicy::Always)? {
                return Ok(());
            }
            // Frames are in order of LSN and of end offset alike.
            let lsn = {
                let frames = &self.inner.state.borrow().journal.frames;
                frames
                    .get(frames.partition_point(|f| f.end <= last_offset))
                    .map(|f| f.lsn)
            };
            let Some(lsn) = lsn else {
                // Not in the journal (appended before the log journaled):
                // through the segment.
                self.flush().await?;
                continue;
            };
            j.journal.wait(lsn).await.map_err(|e| self.fail(e))?;
            let durable = j.journal.durable_lsn();
            let mut st = self.inner.state.borrow_mut();
            let frames = &st.journal.frames;
            let end = frames
                .partition_point(|f| f.lsn < durable)
                .checked_sub(1)
                .map(|last| frames[last].end);
            if let Some(end) = end {
                st.journal.journaled = st.journal.journaled.max(end);
            }
        }
    }

    /// At a clean close, with everything written and fdatasync'd: drops
    /// the pins, has the journal record that, and — if this log journaled
    /// anything since it opened — gives its directory a new journal id, so
    /// that no replay applies this log's old entries again (their
    /// truncations would cut what a later open, maybe not journaling,
    /// appends). Holds: the I/O and sync locks.
    pub(super) async fn detach_from_journal(&self) -> Result<()> {
        let Some(j) = &self.inner.journal else {
            return Ok(());
        };
        let used = {
            let mut st = self.inner.state.borrow_mut();
            let flushed = st.flushed;
            st.journal.release_below(flushed);
            debug_assert!(
                st.journal.frames.is_empty(),
                "closing with journal entries the segment lacks"
            );
            st.journal.used
        };
        if used {
            new_journal_id(&self.inner.dir)?;
            // A journal stopped or failed meanwhile is replayed before it
            // starts again, and the new id makes that replay skip this
            // log's entries: the close stands without the frame.
            match j.journal.checkpoint().await {
                Err(StorageError::JournalFailed { .. }) | Ok(()) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Whether the checkpointer should checkpoint this log now: its oldest
    /// pinned frame is older than `interval_ms`, or `pressed` (the journal
    /// is over its files) and it pins any.
    pub fn journal_checkpoint_due(&self, interval_ms: u64, pressed: bool) -> bool {
        let st = self.inner.state.borrow();
        st.failed.is_none()
            && !st.closed
            && st
                .journal
                .frames
                .front()
                .is_some_and(|f| pressed || mono_ms().saturating_sub(f.since_ms) >= interval_ms)
    }

    /// Writes what the segment lacks, fdatasyncs it and drops the journal
    /// pins that covers. Returns whether any pin was dropped.
    pub async fn checkpoint_journal(&self) -> Result<bool> {
        {
            let _permit = self.lock().await?;
            self.write_locked().await?;
        }
        self.sync_locked().await?;
        let mut st = self.inner.state.borrow_mut();
        let flushed = st.flushed;
        Ok(st.journal.release_below(flushed))
    }
}

/// The shard's journal checkpointer reaches journaling logs through weak
/// handles (`shard::JournaledLog`): a log closed and dropped is skipped.
impl crate::shard::JournaledLog for WeakLog {
    fn alive(&self) -> bool {
        self.upgrade().is_some()
    }

    fn checkpoint_due(&self, interval_ms: u64, pressed: bool) -> bool {
        self.upgrade()
            .is_some_and(|log| log.journal_checkpoint_due(interval_ms, pressed))
    }

    fn checkpoint(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<bool>> + '_>> {
        Box::pin(async move {
            match self.upgrade() {
                Some(log) => log.checkpoint_journal().await,
                None => Ok(false),
            }
        })
    }

    fn dir(&self) -> std::path::PathBuf {
        self.upgrade().map(|log| log.dir().to_path_buf()).unwrap_or_default()
    }
}
