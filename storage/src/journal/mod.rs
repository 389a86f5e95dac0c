//! The shard journal: one write-ahead file stream per shard that makes the
//! appends of all its partitions durable together.
//!
//! Runs on: one shard (one glommio executor); every log of the shard that
//! journals adds its batches here. `!Send`, like the logs.
//!
//! # Why
//! With `fsync=always` a partition's append is durable only after a flush
//! of its own segment. With many partitions and small batches (the daily
//! load of issue 27: 100 partitions, 11,600 records/s) nearly every record
//! costs its partition one write and one device flush, whatever is batched
//! around it, and that bounds the broker's CPU and latency. The journal
//! puts every partition's new batches of a round into one frame, written
//! by one direct-I/O `O_DSYNC` write: one flush per round for the whole
//! shard. The partition segments are then written behind, without a flush
//! per append, and flushed at checkpoints (BookKeeper's journal,
//! ScyllaDB's commitlog).
//!
//! # How
//! - [`Journal::add`] copies an entry (a log's batches, or a truncation)
//!   into the frame being gathered and returns that frame's LSN;
//!   [`Journal::wait`] resolves once the frame is durable. The first waiter
//!   whose frame is not yet written writes it (with everything gathered so
//!   far) while the next round gathers: group commit, one frame in flight.
//! - A log holds a [`JournalPin`] on the oldest frame whose entries its
//!   segment has not yet made durable, and drops it after the fdatasync
//!   that covers them. Each frame records *replay-from*, the oldest pinned
//!   LSN: recovery replays from the newest frame's replay-from
//!   (`recover.rs`).
//! - Frames go into files of about [`JournalConfig::file_bytes`]; a file
//!   whose frames are all below replay-from is renamed and written over as
//!   a later file (its old frames read as stale), so frame writes overwrite
//!   blocks instead of growing files; past [`JournalConfig::spare_files`]
//!   spare files it is deleted. Until files come free that way (a new
//!   journal), [`Journal::prepare_spare`] zero-fills one ahead, so frames
//!   never allocate blocks as they are written.
//! - A failed write fails the journal: every waiter gets the error and no
//!   later frame is written (the kernel may have dropped the pages, so a
//!   retry could report durable what is not).
//!
//! Byte layout: `format.rs`. Recovery: `recover.rs`; [`Journal::open`]
//! returns the plan and a pin holding the replayed frames until the caller
//! has applied them.

pub mod format;
pub mod recover;

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;
use glommio::io::{DmaFile, OpenOptions};
use glommio::sync::Semaphore;

use crate::error::{Result, StorageError};
use crate::notify::Notify;
use crate::segment::io::sync_dir;
use format::{Change, FileHeader, FrameHeader, FILE_HEADER_LEN};
pub use recover::Plan;

/// Settings of a shard's journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalConfig {
    /// A file takes frames up to about this size (a frame never spans two;
    /// a larger frame gets a file of its own).
    pub file_bytes: u64,
    /// Files no longer needed that are kept to be written over.
    pub spare_files: usize,
    /// A log's segment is written and fdatasync'd (its pins dropped) once
    /// its oldest pinned frame is this old (ms); sooner for every log while
    /// the journal holds more files than `spare_files`.
    pub checkpoint_ms: u64,
    /// After a frame of more than one entry (appends arrive faster than
    /// frames are written), the next one gathers until it holds as many
    /// entries or this long (µs) has passed since the last started,
    /// whichever comes first: fewer, fuller frames under a steady stream,
    /// and fewer wake-ups of everything that waits on them, for up to this
    /// much more latency. A few clients that each wait for their answer
    /// are all in the next frame as soon as they have sent again; after a
    /// frame of one entry (a lone one) the next goes at once. 0: never
    /// waits.
    pub frame_spacing_us: u64,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            file_bytes: 64 << 20,
            spare_files: 4,
            checkpoint_ms: 1_000,
            frame_spacing_us: 1_000,
        }
    }
}

impl JournalConfig {
    pub fn validate(&self) -> Result<()> {
        if self.file_bytes < (1 << 20) || self.file_bytes % crate::DMA_ALIGN != 0 {
            return Err(StorageError::InvalidConfig(format!(
                "journal file_bytes {} must be at least 1 MiB and a multiple of 4 KiB",
                self.file_bytes
            )));
        }
        if self.checkpoint_ms == 0 {
            return Err(StorageError::InvalidConfig("journal checkpoint_ms must be > 0".into()));
        }
        if self.frame_spacing_us > FRAME_SPACING_MAX_US {
            return Err(StorageError::InvalidConfig(format!(
                "journal frame_spacing_us {} is over {FRAME_SPACING_MAX_US}",
                self.frame_spacing_us
            )));
        }
        Ok(())
    }
}

/// Largest [`JournalConfig::frame_spacing_us`]: the spacing is added to
/// acknowledgements' latency.
pub const FRAME_SPACING_MAX_US: u64 = 1_000_000;

/// Bytes of entries a frame gathers before appends wait for it to be
/// written ([`Journal::gathering_full`]).
pub const GATHER_MAX: usize = 16 << 20;

/// [`Journal::prepare_spare`] zero-fills a file only while the disk keeps
/// this many times `file_bytes` free beside it: the zeros must never take
/// the room a segment or a frame needs.
pub const PREPARE_ROOM_FILES: u64 = 4;

/// Zeros per write when preparing a spare file.
const PREPARE_CHUNK: usize = 1 << 20;

/// Largest gathering buffer kept for reuse after its frame is written.
const GATHER_KEEP: usize = 4 << 20;

/// The name of journal file `seq`.
pub fn file_name(seq: u64) -> String {
    format!("{seq:020}.journal")
}

fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".journal")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Counters since the journal was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Frames written (each one write and one flush).
    pub frames: u64,
    /// Entries in them.
    pub entries: u64,
    /// Bytes written, padding included.
    pub bytes: u64,
    /// Files started, and how many of them were spare files written over.
    pub files_started: u64,
    pub files_recycled: u64,
    /// Spare files zero-filled ahead ([`Journal::prepare_spare`]).
    pub files_prepared: u64,
}

/// A shard's journal. Cheap to clone (shared within the shard).
#[derive(Clone)]
pub struct Journal {
    inner: Rc<Inner>,
}

struct Inner {
    dir: PathBuf,
    config: JournalConfig,
    state: RefCell<State>,
    /// One frame write at a time.
    write_lock: Semaphore,
    /// Woken after every frame write (and on failure), and when a spare's
    /// zero-fill ends.
    written: Notify,
    /// Woken when the frame being gathered reaches the entries a frame
    /// waiting out its spacing awaits (`State::awaited_entries`).
    gathered_enough: Notify,
}

/// A file whose frames may still be replayed.
struct OldFile {
    path: PathBuf,
    /// Its newest frame.
    last_lsn: u64,
}

struct State {
    /// The file frames go into: `None` until the first frame.
    file: Option<OpenFile>,
    old: VecDeque<OldFile>,
    spare: Vec<PathBuf>,
    next_file_seq: u64,
    /// The LSN of the frame being gathered.
    next_lsn: u64,
    /// Every frame below this LSN is durable.
    durable: u64,
    gathering: Vec<u8>,
    gathered: u32,
    /// The buffer of the frame last written, emptied, for the next one to
    /// gather into (no regrowing a fresh one per frame).
    spare_gathering: Vec<u8>,
    /// Pinned LSNs (with counts): replay must start at the oldest.
    pins: BTreeMap<u64, usize>,
    /// The replay-from the newest durable frame records.
    recorded_from: u64,
    /// Why a frame write failed, and whether the disk was full.
    failed: Option<(String, bool)>,
    /// A spare file is being zero-filled.
    preparing: bool,
    /// When the last frame write started, and how many entries it carried
    /// ([`JournalConfig::frame_spacing_us`]).
    last_frame: Option<(std::time::Instant, u32)>,
    /// The entries a frame waiting out its spacing waits for (0: none
    /// waits): the add that brings `gathered` to it wakes that frame.
    awaited_entries: u32,
    stats: JournalStats,
}

struct OpenFile {
    file: Rc<DmaFile>,
    path: PathBuf,
    seq: u64,
    /// Where its next frame goes.
    pos: u64,
}

impl State {
    fn replay_from(&self, lsn: u64) -> u64 {
        self.pins.keys().next().map_or(lsn, |&oldest| oldest.min(lsn))
    }
}

/// Holding the write lock; releasing it wakes every waiter (one that
/// found the lock taken sleeps until then, whoever held it and whether or
/// not a frame was written).
struct WriteGuard<'a> {
    _permit: glommio::sync::Permit<'a>,
    written: &'a Notify,
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.written.notify_all();
    }
}

/// Holds frames from an LSN on for recovery: while it lives, every later
/// frame says to replay from here at the latest. Dropped by a log once its
/// segment's fdatasync covers its entries from that frame on.
pub struct JournalPin {
    inner: Rc<Inner>,
    lsn: u64,
}

impl JournalPin {
    pub fn lsn(&self) -> u64 {
        self.lsn
    }
}

impl Drop for JournalPin {
    fn drop(&mut self) {
        let mut st = self.inner.state.borrow_mut();
        if let Some(n) = st.pins.get_mut(&self.lsn) {
            *n -= 1;
            if *n == 0 {
                st.pins.remove(&self.lsn);
            }
        }
    }
}

impl Journal {
    /// Opens the journal in `dir` (created if missing): scans its files and
    /// plans the replay. The pin returned holds the replayed frames (and
    /// their files) until the caller has applied the plan's entries to the
    /// logs and made them durable there. The writer starts a new file with
    /// its first frame. Reads whole files: start-up only.
    pub async fn open(dir: impl AsRef<Path>, config: JournalConfig) -> Result<(Journal, Plan, JournalPin)> {
        config.validate()?;
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| StorageError::io("creating", &dir, e))?;
        let mut scans = Vec::new();
        let mut spare = Vec::new();
        let mut names: Vec<(u64, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| StorageError::io("listing", &dir, e))? {
            let entry = entry.map_err(|e| StorageError::io("listing", &dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(seq) = parse_file_name(&name) {
                names.push((seq, entry.path()));
            }
        }
        names.sort();
        for (_, path) in &names {
            let image = Bytes::from(std::fs::read(path).map_err(|e| StorageError::io("reading", path, e))?);
            match recover::scan_file(&image) {
                Ok(scan) => scans.push((path.display().to_string(), scan)),
                // Created but never started, or not ours to read: reusable.
                Err(_) => spare.push(path.clone()),
            }
        }
        let plan = recover::plan(&scans).map_err(|reason| StorageError::CorruptJournal {
            dir: dir.clone(),
            reason,
        })?;
        // Files with frames from replay-from on stay until the replay is
        // applied; the others are spare already.
        let mut old = VecDeque::new();
        for (name, scan) in &scans {
            let path = PathBuf::from(name);
            match scan.frames.last() {
                Some(last) if last.header.lsn >= plan.replay_from => old.push_back(OldFile {
                    path,
                    last_lsn: last.header.lsn,
                }),
                _ => spare.push(path),
            }
        }
        let next_file_seq = plan.next_file_seq.max(names.last().map_or(0, |(s, _)| s + 1));
        let mut pins = BTreeMap::new();
        pins.insert(plan.replay_from, 1);
        let journal = Journal {
            inner: Rc::new(Inner {
                dir,
                config,
                state: RefCell::new(State {
                    file: None,
                    old,
                    spare,
                    next_file_seq,
                    next_lsn: plan.next_lsn,
                    durable: plan.next_lsn,
                    gathering: Vec::new(),
                    gathered: 0,
                    spare_gathering: Vec::new(),
                    pins,
                    recorded_from: plan.replay_from,
                    failed: None,
                    preparing: false,
                    last_frame: None,
                    awaited_entries: 0,
                    stats: JournalStats::default(),
                }),
                write_lock: Semaphore::new(1),
                written: Notify::default(),
                gathered_enough: Notify::default(),
            }),
        };
        let pin = JournalPin {
            inner: journal.inner.clone(),
            lsn: plan.replay_from,
        };
        Ok((journal, plan, pin))
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    pub fn config(&self) -> &JournalConfig {
        &self.inner.config
    }

    /// Gathers an entry into the next frame and returns that frame's LSN
    /// (await [`Journal::wait`] with it). Refused after a failed write.
    /// `dir` must be one [`format::check_dir`] takes (a log checks its name
    /// once, when it opens).
    pub fn add(&self, dir: &str, log_id: u64, change: &Change) -> Result<u64> {
        debug_assert!(format::check_dir(dir).is_ok(), "{dir:?}");
        let mut st = self.inner.state.borrow_mut();
        self.check(&st)?;
        format::encode_entry(&mut st.gathering, dir, log_id, change);
        st.gathered += 1;
        if st.gathered == st.awaited_entries {
            self.inner.gathered_enough.notify_all();
        }
        Ok(st.next_lsn)
    }

    /// The LSN of the frame being gathered when it holds [`GATHER_MAX`]
    /// bytes or more: appends wait for it to be written before adding
    /// more (the gathering buffer, and a frame, stay bounded however fast
    /// producers that do not wait for acknowledgements append).
    pub fn gathering_full(&self) -> Option<u64> {
        let st = self.inner.state.borrow();
        (st.gathering.len() >= GATHER_MAX).then_some(st.next_lsn)
    }

    /// Pins `lsn` (see [`JournalPin`]).
    pub fn pin(&self, lsn: u64) -> JournalPin {
        *self.inner.state.borrow_mut().pins.entry(lsn).or_default() += 1;
        JournalPin {
            inner: self.inner.clone(),
            lsn,
        }
    }

    /// Resolves once frame `lsn` (from [`Journal::add`]) is durable.
    ///
    /// Not cancel-safe while it writes a frame: a future dropped mid-write
    /// would leave that frame's LSN unwritten and the next one written in
    /// its place (which recovery reads as stale). Callers await it to the
    /// end (the broker's produce and replication tasks are never timed
    /// out around it).
    pub async fn wait(&self, lsn: u64) -> Result<()> {
        loop {
            let seen = self.inner.written.epoch();
            {
                let st = self.inner.state.borrow();
                self.check(&st)?;
                if st.durable > lsn {
                    return Ok(());
                }
            }
            match self.inner.write_lock.try_acquire_permit(1) {
                Ok(permit) => {
                    let _guard = WriteGuard {
                        _permit: permit,
                        written: &self.inner.written,
                    };
                    // The tasks already runnable add first: the other
                    // partitions of the request whose append got here
                    // first join this frame rather than the next.
                    yield_once().await;
                    self.space_frame().await;
                    self.write_frame(false).await?;
                }
                Err(_) => self.inner.written.wait(seen).await,
            }
        }
    }

    /// Makes the journal record that recovery may start later than its
    /// newest frame says, once pins dropped since (a log's checkpoint, the
    /// replay at start-up): writes a frame with no entries if nothing else
    /// is gathered. Without it, a quiet journal would replay, after a
    /// crash, entries that its logs hold durably already — harmless for
    /// them (replay skips what is there), but it keeps old truncations
    /// around for logs that stopped journaling since.
    pub async fn checkpoint(&self) -> Result<()> {
        let _guard = WriteGuard {
            _permit: (self.inner.write_lock.acquire_permit(1).await).map_err(|_| StorageError::Closed)?,
            written: &self.inner.written,
        };
        let lsn = {
            let st = self.inner.state.borrow();
            self.check(&st)?;
            if st.replay_from(st.next_lsn) <= st.recorded_from {
                return Ok(());
            }
            st.next_lsn
        };
        self.write_frame(true).await?;
        debug_assert!(self.durable_lsn() > lsn);
        Ok(())
    }

    /// Holds frame `lsn` and every later one for recovery until the
    /// process ends: a journaled log that failed holds what its segment
    /// lacks this way, for the start-up replay (it may be dropped before
    /// the broker restarts, and its pins with it).
    pub fn hold_until_restart(&self, lsn: u64) {
        *self.inner.state.borrow_mut().pins.entry(lsn).or_default() += 1;
    }

    /// Stops the journal for good, to be replayed from its files and
    /// started again (the broker's in-place recovery after a full disk):
    /// fails it with `reason` if no frame write has failed it yet (every
    /// add and wait is refused from now on, and [`Journal::failed`] says
    /// why), then waits until no frame write and no spare's
    /// zero-fill is in flight, so that nothing this instance started
    /// lands in its files after this returns.
    pub async fn stop(&self, reason: &str) {
        self.inner
            .state
            .borrow_mut()
            .failed
            .get_or_insert_with(|| (reason.to_string(), false));
        self.inner.written.notify_all();
        self.inner.gathered_enough.notify_all();
        if let Ok(permit) = self.inner.write_lock.acquire_permit(1).await {
            drop(permit);
        }
        loop {
            let seen = self.inner.written.epoch();
            if !self.inner.state.borrow().preparing {
                return;
            }
            // (`prepare_spare` notifies when it ends.)
            self.inner.written.wait(seen).await;
        }
    }

    /// Whether `other` is this very journal (not another one opened in
    /// the same directory).
    pub fn same(&self, other: &Journal) -> bool {
        Rc::ptr_eq(&self.inner, &other.inner)
    }

    /// Why the journal takes nothing more, if it does not (a frame write
    /// failed, or [`Journal::stop`]).
    pub fn failed(&self) -> Option<String> {
        self.inner
            .state
            .borrow()
            .failed
            .as_ref()
            .map(|(reason, _)| reason.clone())
    }

    /// Every frame below this LSN is durable.
    pub fn durable_lsn(&self) -> u64 {
        self.inner.state.borrow().durable
    }

    /// The oldest pinned LSN, if any.
    pub fn oldest_pin(&self) -> Option<u64> {
        self.inner.state.borrow().pins.keys().next().copied()
    }

    /// Files holding frames that may still be replayed, the one being
    /// written included: the logs pinning the oldest should flush once this
    /// passes the spare files' count.
    pub fn files_in_use(&self) -> usize {
        let st = self.inner.state.borrow();
        st.old.len() + usize::from(st.file.is_some())
    }

    pub fn stats(&self) -> JournalStats {
        self.inner.state.borrow().stats
    }

    /// With no spare file to go to next, zero-fills a new one of
    /// `file_bytes` and fdatasyncs it, so that the frames written into it
    /// later overwrite allocated blocks: an `O_DSYNC` write that allocates
    /// (a fresh file) commits the file system's metadata journal and runs
    /// on a kernel worker thread, one that overwrites is a plain device
    /// write and flush. Spares of files written before do this already;
    /// this covers a journal that has not yet wrapped around (a new broker,
    /// or a load growing). Skipped while the disk has less than
    /// [`PREPARE_ROOM_FILES`] files' worth free. Runs beside the writer
    /// (the checkpointer calls it); returns whether it prepared one.
    pub async fn prepare_spare(&self) -> Result<bool> {
        let seq = {
            let mut st = self.inner.state.borrow_mut();
            if !st.spare.is_empty() || st.failed.is_some() || st.preparing {
                return Ok(false);
            }
            let room = self.inner.config.file_bytes.saturating_mul(PREPARE_ROOM_FILES);
            if crate::space::statvfs(&self.inner.dir).map_or(true, |(free, _)| free < room) {
                return Ok(false);
            }
            st.preparing = true;
            // Its name is taken now: a frame's new file gets a later one.
            let seq = st.next_file_seq;
            st.next_file_seq += 1;
            seq
        };
        let path = self.inner.dir.join(file_name(seq));
        let result = zero_fill(&path, self.inner.config.file_bytes).await;
        self.inner.state.borrow_mut().preparing = false;
        // (A `stop` may wait for it.)
        self.inner.written.notify_all();
        match result {
            Ok(()) => {
                let mut st = self.inner.state.borrow_mut();
                st.spare.push(path);
                st.stats.files_prepared += 1;
                Ok(true)
            }
            Err(e) => {
                // A half-filled file is no use; recovery would take it as a
                // spare (it has no header) if this fails too.
                let _ = crate::segment::io::remove_file(&path).await;
                Err(e)
            }
        }
    }

    fn check(&self, st: &State) -> Result<()> {
        match &st.failed {
            Some((reason, no_space)) => Err(StorageError::JournalFailed {
                dir: self.inner.dir.clone(),
                reason: reason.clone(),
                no_space: *no_space,
            }),
            None => Ok(()),
        }
    }

    /// If the last frame carried more than one entry, waits until this
    /// one has gathered as many or [`JournalConfig::frame_spacing_us`] has
    /// passed since the last started, whichever comes first. Holds: the
    /// write lock (appends keep gathering into the frame meanwhile).
    ///
    /// Waiting for as many entries as last time keeps a few clients that
    /// each wait for their answer (the same entries come back every round)
    /// from waiting out the spacing once they are all in; under a steady
    /// stream of appends each frame gathers at least as many as the last,
    /// so frames fill up until the spacing is what ends the wait.
    async fn space_frame(&self) {
        let spacing = std::time::Duration::from_micros(self.inner.config.frame_spacing_us);
        let (started, expected) = match self.inner.state.borrow().last_frame {
            Some((started, entries)) if entries > 1 => (started, entries),
            _ => return,
        };
        let since = started.elapsed();
        let seen = self.inner.gathered_enough.epoch();
        {
            let mut st = self.inner.state.borrow_mut();
            if since >= spacing || st.gathered >= expected {
                return;
            }
            st.awaited_entries = expected;
        }
        // Woken by the add that brings the frame to `expected` entries, or
        // timed out at the spacing: either way the frame goes.
        let _ = glommio::timer::timeout(spacing - since, async {
            self.inner.gathered_enough.wait(seen).await;
            Ok(())
        })
        .await;
        self.inner.state.borrow_mut().awaited_entries = 0;
    }

    /// Writes what is gathered as one frame (`even_empty`: also with
    /// nothing gathered). Holds: the write lock.
    async fn write_frame(&self, even_empty: bool) -> Result<()> {
        let (frame, lsn, count) = {
            let mut st = self.inner.state.borrow_mut();
            if st.gathered == 0 && !even_empty {
                return Ok(());
            }
            let lsn = st.next_lsn;
            st.next_lsn += 1;
            let count = std::mem::take(&mut st.gathered);
            st.last_frame = Some((std::time::Instant::now(), count));
            let spare = std::mem::take(&mut st.spare_gathering);
            let entries = std::mem::replace(&mut st.gathering, spare);
            (entries, lsn, count)
        };
        let result = self.write_gathered(frame, lsn, count).await;
        if let Err(e) = &result {
            let failure = (e.to_string(), e.is_no_space());
            self.inner.state.borrow_mut().failed.get_or_insert(failure);
        }
        result
    }

    async fn write_gathered(&self, entries: Vec<u8>, lsn: u64, count: u32) -> Result<()> {
        let frame_len = format::padded_len(format::FRAME_HEADER_LEN + entries.len()) as u64;
        let fits = {
            let st = self.inner.state.borrow();
            st.file
                .as_ref()
                .is_some_and(|f| f.pos == FILE_HEADER_LEN as u64 || f.pos + frame_len <= self.inner.config.file_bytes)
        };
        let new_file = match fits {
            true => None,
            false => Some(self.start_file(lsn).await?),
        };
        let (file, path, seq, pos) = {
            let st = self.inner.state.borrow();
            let f = st.file.as_ref().expect("a file was started");
            (f.file.clone(), f.path.clone(), f.seq, f.pos)
        };
        let replay_from = self.inner.state.borrow().replay_from(lsn);
        let header = FrameHeader {
            file_seq: seq,
            lsn,
            replay_from,
        };
        // A new file's header goes in the same write as its first frame;
        // the entries are copied once, into the direct-I/O buffer.
        let (write_pos, head) = match new_file {
            Some(_) => (0, FILE_HEADER_LEN),
            None => (pos, 0),
        };
        let len = head + frame_len as usize;
        let mut buf = file.alloc_dma_buffer(len);
        if let Some(file_header) = new_file {
            format::write_file_header(buf.as_bytes_mut(), file_header);
        }
        format::write_frame(&mut buf.as_bytes_mut()[head..], header, count, &entries);
        self.give_back_gathering(entries);
        write_whole(&file, buf, write_pos, &path, "writing").await?;
        let doomed: Vec<PathBuf> = {
            let mut st = self.inner.state.borrow_mut();
            if let Some(f) = st.file.as_mut() {
                f.pos = write_pos + len as u64;
            }
            st.durable = lsn + 1;
            st.recorded_from = replay_from;
            st.stats.frames += 1;
            st.stats.entries += u64::from(count);
            st.stats.bytes += len as u64;
            // Files wholly before the replay-from this frame recorded are
            // no longer needed. (Not the pins' oldest now: a pin dropped
            // while the frame was in flight still holds what recovery from
            // this frame would replay.)
            while st.old.front().is_some_and(|f| f.last_lsn < replay_from) {
                let done = st.old.pop_front().expect("checked");
                st.spare.push(done.path);
            }
            let extra = st.spare.len().saturating_sub(self.inner.config.spare_files);
            st.spare.drain(..extra).collect()
        };
        for path in doomed {
            crate::segment::io::remove_file(&path).await?;
        }
        Ok(())
    }

    /// Keeps a written frame's gathering buffer for a later frame (unless
    /// it grew large: a burst's buffer is not held on to).
    fn give_back_gathering(&self, mut entries: Vec<u8>) {
        if entries.capacity() <= GATHER_KEEP {
            entries.clear();
            self.inner.state.borrow_mut().spare_gathering = entries;
        }
    }

    /// Moves to a new file whose first frame is `lsn`: a spare one renamed,
    /// else a new one. Returns its header, to be written with the frame.
    /// Holds: the write lock.
    async fn start_file(&self, lsn: u64) -> Result<FileHeader> {
        let (seq, spare) = {
            let mut st = self.inner.state.borrow_mut();
            let seq = st.next_file_seq;
            st.next_file_seq += 1;
            (seq, st.spare.pop())
        };
        let path = self.inner.dir.join(file_name(seq));
        let recycled = match &spare {
            Some(old) => glommio::io::rename(old, &path).await.is_ok(),
            None => false,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .custom_flags(libc::O_DSYNC)
            .dma_open(&path)
            .await
            .map_err(|e| StorageError::glommio("creating", &path, e))?;
        // Its name must survive a crash before a frame in it is acknowledged.
        sync_dir(&self.inner.dir).await?;
        let mut st = self.inner.state.borrow_mut();
        if let Some(prev) = st.file.take() {
            // Its last frame is the one before this.
            if lsn > 0 {
                st.old.push_back(OldFile {
                    path: prev.path,
                    last_lsn: lsn - 1,
                });
            }
        }
        st.file = Some(OpenFile {
            file: Rc::new(file),
            path,
            seq,
            pos: FILE_HEADER_LEN as u64,
        });
        st.stats.files_started += 1;
        st.stats.files_recycled += u64::from(recycled);
        Ok(FileHeader { seq, first_lsn: lsn })
    }
}

/// Writes all of `buf` at `pos` (a short write is an error: direct I/O
/// writes whole blocks or fails).
async fn write_whole(
    file: &DmaFile,
    buf: glommio::io::DmaBuffer,
    pos: u64,
    path: &Path,
    what: &'static str,
) -> Result<()> {
    let len = buf.len();
    match file.write_at(buf, pos).await {
        Ok(n) if n == len => Ok(()),
        Ok(n) => {
            let short = std::io::Error::new(std::io::ErrorKind::WriteZero, format!("short write of {n} of {len}"));
            Err(StorageError::io(what, path, short))
        }
        Err(e) => Err(StorageError::glommio(what, path, e)),
    }
}

/// Creates `path` holding `len` zero bytes, written and fdatasync'd.
async fn zero_fill(path: &Path, len: u64) -> Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .dma_open(path)
        .await
        .map_err(|e| StorageError::glommio("creating", path, e))?;
    let mut pos = 0;
    while pos < len {
        let n = PREPARE_CHUNK.min((len - pos) as usize);
        let mut buf = file.alloc_dma_buffer(n);
        buf.as_bytes_mut().fill(0);
        write_whole(&file, buf, pos, path, "zero-filling").await?;
        pos += n as u64;
    }
    file.fdatasync()
        .await
        .map_err(|e| StorageError::glommio("syncing", path, e))?;
    file.close()
        .await
        .map_err(|e| StorageError::glommio("closing", path, e))?;
    Ok(())
}

/// Puts the calling task at the back of its queue once: the executor runs
/// the tasks runnable before it first (at once when there are none).
async fn yield_once() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await;
}

#[cfg(test)]
mod tests;
