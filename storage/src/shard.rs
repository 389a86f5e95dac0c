//! Resources the logs of one shard share: the direct-I/O probe file, the
//! bounded cache of open sealed segments (file descriptor + loaded index),
//! and the memory budgets of the tail caches and of read-ahead.
//!
//! Runs on: every shard, one [`ShardStorage`] each, created before any log
//! is opened on that shard's executor.
//!
//! # The probe file
//! glommio decides whether a device supports polled I/O by reading offset 0
//! of the first read-write `DmaFile` an executor opens. If that file is
//! empty the probe wrongly succeeds and every later read fails with
//! `EOPNOTSUPP` (os error 95). So [`ShardStorage::open`] first opens a
//! non-empty 4 KiB file, `<data_dir>/.strand-probe`, read-write.
//!
//! # File descriptors
//! An active segment keeps its file open (one descriptor per partition).
//! Sealed segments are opened on first read and kept in an LRU of at most
//! `open_sealed_segments_max` entries, so a shard with 1,000 partitions and
//! many segments each holds about 1,000 + that many descriptors.
//!
//! # Memory budgets
//! - Tail caches: `tail_cache_budget_bytes` for all of them together; a
//!   log evicts its oldest written batches while the shard is over it.
//! - Read-ahead: `readahead_budget_bytes` for every block the logs' block
//!   caches hold, in flight or read (`log::readahead`). A block is cached
//!   or read ahead only if it fits; past the budget a reader reads just
//!   what its fetch needs, uncached. So however many partitions are read
//!   from disk at once, the shard holds at most this much in read-ahead
//!   (plus the blocks that batches already handed out still slice, which
//!   the fetch responses in flight bound).

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;

use glommio::io::{DmaFile, OpenOptions};

use crate::budget::ByteBudget;
use crate::config::LogConfig;
use crate::error::{Result, StorageError};
use crate::journal::{Journal, JournalConfig};
use crate::segment::recover::load_sealed;
use crate::segment::{OpenSegment, SealedSegment};
use crate::DMA_ALIGN;

/// CPU time the calling thread has run (`CLOCK_THREAD_CPUTIME_ID`): on a
/// shard's thread, how much of a span the shard was on a CPU (the broker's
/// stall probe, the storage bench's busy share).
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `ts`, which lives on
    // this stack frame.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// Settings shared by all logs of a shard.
#[derive(Debug, Clone)]
pub struct ShardStorageConfig {
    /// Sealed segments kept open at once (each holds a descriptor and its index).
    pub open_sealed_segments_max: usize,
    /// Bytes all tail caches of the shard may hold together.
    pub tail_cache_budget_bytes: usize,
    /// Bytes all read-ahead blocks of the shard may hold together (a
    /// sequential reader holds up to five 4 MiB blocks).
    pub readahead_budget_bytes: usize,
}

impl Default for ShardStorageConfig {
    fn default() -> Self {
        ShardStorageConfig {
            open_sealed_segments_max: 256,
            tail_cache_budget_bytes: 256 << 20,
            readahead_budget_bytes: 64 << 20,
        }
    }
}

/// The storage of one shard. Cheap to clone (shared within the shard).
#[derive(Clone)]
pub struct ShardStorage {
    inner: Rc<Inner>,
}

struct Inner {
    data_dir: PathBuf,
    config: ShardStorageConfig,
    _probe: DmaFile,
    open: RefCell<SegmentLru>,
    budget: Rc<ByteBudget>,
    readahead_budget: Rc<ByteBudget>,
    /// The shard journal, once started (`start_journal`); its
    /// checkpointer stops once it is no longer this one (`stop_journal`).
    journal: RefCell<Option<Journal>>,
    /// The logs that journal, for the checkpointer.
    journaled: RefCell<Vec<Rc<dyn JournaledLog>>>,
}

/// A log that journals, as the shard's journal checkpointer sees it: a weak
/// handle (the log implements it in `log/journaled.rs`; this module does not
/// name the log, which sits above it and holds a `ShardStorage`).
pub(crate) trait JournaledLog {
    /// Whether the log is still open anywhere.
    fn alive(&self) -> bool;
    /// Whether the log is due a journal checkpoint.
    fn checkpoint_due(&self, interval_ms: u64, pressed: bool) -> bool;
    /// Checkpoints it; whether it released journal frames.
    fn checkpoint(&self) -> Pin<Box<dyn Future<Output = Result<bool>> + '_>>;
    /// Its directory, for messages.
    fn dir(&self) -> PathBuf;
}

#[derive(Default)]
struct SegmentLru {
    entries: HashMap<PathBuf, (Rc<OpenSegment>, u64)>,
    tick: u64,
}

impl ShardStorage {
    /// Prepares `data_dir` (created if missing) for this executor. Must be
    /// called on the executor that will run the logs, before any of them.
    pub async fn open(data_dir: impl AsRef<Path>, config: ShardStorageConfig) -> Result<ShardStorage> {
        let data_dir = data_dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&data_dir).map_err(|e| StorageError::io("creating", &data_dir, e))?;
        let probe_path = data_dir.join(".strand-probe");
        // The file must hold data *before* glommio opens it (the probe reads
        // it during the open), so it is filled through std first.
        let len = std::fs::metadata(&probe_path).map_or(0, |m| m.len());
        if len < DMA_ALIGN {
            std::fs::write(&probe_path, [b'S'; DMA_ALIGN as usize])
                .map_err(|e| StorageError::io("writing", &probe_path, e))?;
        }
        let probe = OpenOptions::new()
            .read(true)
            .write(true)
            .dma_open(&probe_path)
            .await
            .map_err(|e| StorageError::glommio("opening", &probe_path, e))?;
        Ok(ShardStorage {
            inner: Rc::new(Inner {
                data_dir,
                budget: ByteBudget::new(config.tail_cache_budget_bytes),
                readahead_budget: ByteBudget::new(config.readahead_budget_bytes),
                config,
                _probe: probe,
                open: RefCell::new(SegmentLru::default()),
                journal: RefCell::new(None),
                journaled: RefCell::new(Vec::new()),
            }),
        })
    }

    pub fn data_dir(&self) -> &Path {
        &self.inner.data_dir
    }

    /// Drops the cached sealed segments of the log in `dir` (closing their
    /// files once no read holds them).
    pub(crate) fn forget_dir(&self, dir: &Path) {
        self.inner
            .open
            .borrow_mut()
            .entries
            .retain(|path, _| path.parent() != Some(dir));
    }

    pub(crate) fn cache_budget(&self) -> Rc<ByteBudget> {
        self.inner.budget.clone()
    }

    pub(crate) fn readahead_budget(&self) -> Rc<ByteBudget> {
        self.inner.readahead_budget.clone()
    }

    /// Bytes held by all tail caches of the shard.
    pub fn tail_cache_bytes(&self) -> usize {
        self.inner.budget.used()
    }

    /// Bytes held by all read-ahead blocks of the shard (in flight or read).
    pub fn readahead_bytes(&self) -> usize {
        self.inner.readahead_budget.used()
    }

    /// Blocks not read ahead or not kept because the read-ahead budget was
    /// spent (their readers read only what each fetch needed).
    pub fn readahead_refused(&self) -> u64 {
        self.inner.readahead_budget.refused()
    }

    /// Sealed segments currently open.
    pub fn open_sealed_segments(&self) -> usize {
        self.inner.open.borrow().entries.len()
    }

    /// The open file and index of a sealed segment, opening it if needed.
    pub(crate) async fn sealed(&self, seg: &SealedSegment, config: &LogConfig) -> Result<Rc<OpenSegment>> {
        {
            let mut lru = self.inner.open.borrow_mut();
            lru.tick += 1;
            let tick = lru.tick;
            if let Some((open, used)) = lru.entries.get_mut(&seg.path) {
                *used = tick;
                return Ok(open.clone());
            }
        }
        let file = DmaFile::open(&seg.path)
            .await
            .map_err(|e| StorageError::glommio("opening", &seg.path, e))?;
        let (loaded, _) = load_sealed(
            &file,
            &seg.path,
            seg.base,
            config.stored_batch_bytes_max(),
            config.index_interval_bytes,
        )
        .await?;
        let open = Rc::new(OpenSegment {
            file: Rc::new(file),
            index: loaded.index,
        });
        self.insert_open(seg.path.clone(), open.clone());
        Ok(open)
    }

    /// Puts an open segment into the LRU (a segment just sealed keeps its file).
    pub(crate) fn insert_open(&self, path: PathBuf, open: Rc<OpenSegment>) {
        let mut lru = self.inner.open.borrow_mut();
        lru.tick += 1;
        let tick = lru.tick;
        lru.entries.insert(path, (open, tick));
        while lru.entries.len() > self.inner.config.open_sealed_segments_max {
            let oldest = lru
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(p, _)| p.clone());
            match oldest {
                // Dropping the last Rc closes the file (glommio closes it asynchronously).
                Some(p) => lru.entries.remove(&p),
                None => break,
            };
        }
    }

    /// The shard journal, if started.
    pub fn journal(&self) -> Option<Journal> {
        self.inner.journal.borrow().clone()
    }

    /// Starts the shard journal in `dir`: logs opened from now on with
    /// `fsync=always` (and `LogConfig::journal`) journal their appends
    /// (`log::journaled`), and a background task checkpoints them
    /// (`JournalConfig::checkpoint_ms`) and keeps a zero-filled spare file
    /// ready (`Journal::prepare_spare`; the first one before this
    /// returns). Whatever the journal held must
    /// have been replayed first ([`ShardStorage::replay_journal`]): a
    /// journal with entries to replay is refused.
    pub async fn start_journal(&self, dir: &Path, config: JournalConfig) -> Result<Journal> {
        let (journal, plan, _replayed) = Journal::open(dir, config).await?;
        if !plan.entries.is_empty() {
            return Err(StorageError::CorruptJournal {
                dir: dir.to_path_buf(),
                reason: format!(
                    "{} entries from frame {} on are not replayed yet",
                    plan.entries.len(),
                    plan.replay_from
                ),
            });
        }
        *self.inner.journal.borrow_mut() = Some(journal.clone());
        // The first frame's file must not be one that grows with every
        // frame (each write would then sync the file's size too): a fresh
        // journal zero-fills its first file before anything is appended.
        if let Err(e) = journal.prepare_spare().await {
            tracing::warn!(journal = %dir.display(), "journal spare file: {e}");
        }
        let weak = Rc::downgrade(&self.inner);
        let own = journal.clone();
        glommio::spawn_local(async move {
            let tick = std::time::Duration::from_millis((config.checkpoint_ms / 4).clamp(10, 250));
            loop {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let shard = ShardStorage { inner };
                if !shard.journal().is_some_and(|current| current.same(&own)) {
                    return;
                }
                shard.checkpoint_pass(&own).await;
                if let Err(e) = own.prepare_spare().await {
                    tracing::warn!(journal = %own.dir().display(), "journal spare file: {e}");
                }
                drop(shard);
                glommio::timer::sleep(tick).await;
            }
        })
        .detach();
        Ok(journal)
    }

    /// Stops the shard journal (`Journal::stop`) and forgets it: logs
    /// opened from now on do not journal, and its checkpointer ends. The
    /// logs that journaled must be closed before its files are replayed
    /// ([`ShardStorage::replay_journal`]) and a journal is started again:
    /// how the broker brings a shard's journaled partitions back after a
    /// full disk without a restart.
    pub async fn stop_journal(&self, reason: &str) {
        let journal = self.inner.journal.borrow_mut().take();
        if let Some(journal) = journal {
            journal.stop(reason).await;
        }
    }

    /// One pass of the journal checkpointer: checkpoints the logs that are
    /// due, then lets the journal record the newer replay-from.
    async fn checkpoint_pass(&self, journal: &Journal) {
        if journal.failed().is_some() {
            // Its logs take nothing more, and its frames nothing at all:
            // the broker brings them back through a replay (or a restart).
            return;
        }
        let config = *journal.config();
        let pressed = journal.files_in_use() > config.spare_files;
        let logs: Vec<Rc<dyn JournaledLog>> = {
            let mut weak = self.inner.journaled.borrow_mut();
            weak.retain(|w| w.alive());
            weak.clone()
        };
        let mut released = false;
        for log in logs {
            if log.checkpoint_due(config.checkpoint_ms, pressed) {
                match log.checkpoint().await {
                    Ok(dropped) => released |= dropped,
                    Err(e) => tracing::warn!(log = %log.dir().display(), "journal checkpoint: {e}"),
                }
            }
        }
        if released {
            if let Err(e) = journal.checkpoint().await {
                tracing::warn!("journal checkpoint frame: {e}");
            }
        }
    }

    /// Notes a log that journals (for the checkpointer).
    pub(crate) fn note_journaled(&self, log: Rc<dyn JournaledLog>) {
        self.inner.journaled.borrow_mut().push(log);
    }

    /// Forgets a segment (deleted by retention or truncation).
    pub(crate) fn forget(&self, path: &Path) {
        self.inner.open.borrow_mut().entries.remove(path);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::thread_cpu_time;

    /// A spinning thread gathers CPU time (never more than the wall time it
    /// spun); a sleeping one gathers next to none. The spin is bounded by CPU
    /// time reached, not by wall time: on a loaded machine 20 ms of wall time
    /// may hold half as much CPU (CI saw 9.5 ms).
    #[test]
    fn thread_cpu_time_counts_running_not_sleeping() {
        let ms = Duration::from_millis;
        let start = (Instant::now(), thread_cpu_time());
        while thread_cpu_time() - start.1 < ms(20) && start.0.elapsed() < ms(10_000) {
            std::hint::spin_loop();
        }
        // CPU read before wall: the CPU span lies inside the wall span.
        let cpu = thread_cpu_time() - start.1;
        let wall = start.0.elapsed();
        assert!(cpu >= ms(20), "{cpu:?} of CPU for {wall:?} of spinning");
        assert!(cpu <= wall, "{cpu:?} of CPU in only {wall:?}");
        let start = thread_cpu_time();
        std::thread::sleep(ms(20));
        assert!(thread_cpu_time() - start < ms(5));
    }
}
