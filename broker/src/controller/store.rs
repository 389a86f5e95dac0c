//! The controller's Raft storage on disk: the log, the vote, snapshots, and
//! the state machine they feed.
//!
//! Runs on: shard 0.
//!
//! # Files (in `<data_dir>/__controller/`)
//! - `raft.log`: records back to back, each
//!   ```text
//!   0  4  len      u32 LE, bytes of payload
//!   4  4  crc      u32 LE, CRC-32 (crc32fast) of payload
//!   8  …  payload  JSON of a LogRecord: {"Entry": <openraft entry>} |
//!                  {"Truncate": <index>} | {"Purge": <log id>} | {"Committed": <log id or null>} |
//!                  {"Vote": <openraft vote>}
//!   ```
//!   Replaying the records in order rebuilds the log; the last `Vote` is
//!   the member's vote. A record cut short or failing its CRC ends the
//!   file (a torn tail from a crash): it and what follows are dropped.
//!   Purging rewrites the file with what is left (the vote first).
//!   The vote is a record, not a file of its own: saving it is one write
//!   and one fdatasync of the open log, where replacing a file took about
//!   ten file-system calls (open, write, fdatasync, close, rename, and the
//!   directory's open, fsync and close), and a voter answers a vote
//!   request only once its vote is saved. Through a slow file system
//!   (strand-chaos's FUSE pass-through, busy refilling a wiped node) that
//!   answer came after the candidate's 1 s limit, 156 times in a row, and
//!   the controller never elected a leader.
//! - `vote.json`: the vote as written before it became a record; read
//!   only when the log holds no `Vote` record.
//! - `snapshot.json`: replaced atomically (write a temporary file,
//!   fdatasync, rename, fsync the directory). It holds its openraft
//!   metadata and the [`MetadataTable`].
//!
//! Appends are written with glommio's buffered file and fdatasync'd before
//! openraft is told they are durable. Controller traffic is metadata (a few
//! records per queue change), so JSON's size does not matter.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::{BufferedFile, OpenOptions};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};

use super::runtime::GlommioRuntime;
use super::stm::{Command, ControllerError, MetadataStm};
use super::table::MetadataTable;

/// What a committed command answers: applied, or refused with a reason.
pub type CommandResult = Result<(), ControllerError>;

openraft::declare_raft_types!(
    /// The controller's Raft types.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = u64,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = GlommioRuntime,
);

type NodeId = u64;
type StoreResult<T> = Result<T, StorageError<NodeId>>;

#[derive(Debug, Serialize, Deserialize)]
enum LogRecord {
    Entry(Entry<TypeConfig>),
    Truncate(u64),
    Purge(LogId<NodeId>),
    Committed(Option<LogId<NodeId>>),
    Vote(Vote<NodeId>),
}

fn encode_record(record: &LogRecord, out: &mut Vec<u8>) {
    let payload = serde_json::to_vec(record).expect("log records always serialise");
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
}

/// How many records [`decode_records`] reads from `data`, and where they
/// end (for the fuzz target, which cannot name `LogRecord`).
pub(crate) fn count_records(data: &[u8]) -> (usize, usize) {
    let (records, end) = decode_records(data);
    (records.len(), end)
}

/// Decodes the records of a log file; returns them and the length of the
/// valid prefix (where a torn or corrupt record starts).
fn decode_records(data: &[u8]) -> (Vec<LogRecord>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while data.len() - at >= 8 {
        let len = u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]) as usize;
        let crc = u32::from_le_bytes([data[at + 4], data[at + 5], data[at + 6], data[at + 7]]);
        let Some(payload) = data.get(at + 8..at + 8 + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        match serde_json::from_slice(payload) {
            Ok(r) => out.push(r),
            Err(_) => break,
        }
        at += 8 + len;
    }
    (out, at)
}

fn io_err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Writes `bytes` to `path` atomically and durably.
async fn write_atomic(path: &Path, bytes: Vec<u8>) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .buffered_open(&tmp)
        .await
        .map_err(io_err)?;
    file.write_at(bytes, 0).await.map_err(io_err)?;
    file.fdatasync().await.map_err(io_err)?;
    file.close().await.map_err(io_err)?;
    glommio::io::rename(&tmp, path).await.map_err(io_err)?;
    sync_dir(path).await
}

async fn sync_dir(path: &Path) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let d = glommio::io::Directory::open(dir).await.map_err(io_err)?;
    d.sync().await.map_err(io_err)?;
    d.close().await.map_err(io_err)
}

// ---- the log ----------------------------------------------------------------

/// A vote saved slower than this is logged: a candidate waits for the
/// answer at most its minimum election timeout (1 s by default).
const SLOW_VOTE_SAVE: std::time::Duration = std::time::Duration::from_millis(200);

struct LogInner {
    path: PathBuf,
    file: Rc<BufferedFile>,
    file_len: u64,
    /// Set by a write or fdatasync that failed: the file may end in a
    /// partial record at a length `file_len` has already moved past. No
    /// later record is written after it (one that landed would sit beyond
    /// a corrupt record, durable, with an entry before it lost: a restart
    /// then refuses the whole log; found by strand-chaos's disk-full
    /// nemesis). openraft stops the member on the error and the broker
    /// exits to be started again, which cuts the torn tail.
    failed: Option<String>,
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    purged: Option<LogId<NodeId>>,
}

/// The Raft log and vote. Cheap to clone (shared on shard 0).
#[derive(Clone)]
pub struct LogStore {
    inner: Rc<RefCell<LogInner>>,
}

impl LogStore {
    /// Opens (creating) the log in `dir`, replaying it and dropping a torn tail.
    pub async fn open(dir: &Path) -> std::io::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("raft.log");
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let (records, valid) = decode_records(&data);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .buffered_open(&path)
            .await
            .map_err(io_err)?;
        if valid < data.len() {
            // A record cut short at the end is a torn write; a bad record with
            // more records after it is corruption: refuse to guess.
            let declared = data
                .get(valid..valid + 4)
                .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
            if valid + 8 + declared < data.len() {
                return Err(std::io::Error::other(format!(
                    "{}: corrupt record at byte {valid} with {} bytes after it",
                    path.display(),
                    data.len() - valid - 8 - declared
                )));
            }
            tracing::warn!(file = %path.display(), valid, len = data.len(), "dropping a torn tail of the controller log");
            file.truncate(valid as u64).await.map_err(io_err)?;
            file.fdatasync().await.map_err(io_err)?;
        }
        let mut inner = LogInner {
            path,
            file: Rc::new(file),
            file_len: valid as u64,
            failed: None,
            entries: BTreeMap::new(),
            vote: None,
            committed: None,
            purged: None,
        };
        for r in records {
            apply_record(&mut inner, r);
        }
        if inner.vote.is_none() {
            inner.vote = match std::fs::read(dir.join("vote.json")) {
                Ok(d) => Some(serde_json::from_slice(&d).map_err(io_err)?),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
        }
        Ok(LogStore {
            inner: Rc::new(RefCell::new(inner)),
        })
    }

    /// Appends records durably.
    /// Encodes `records`, applies them to the in-memory log (moving them:
    /// no clone), then appends them to the file and fdatasyncs it.
    async fn write_records(&self, records: Vec<LogRecord>) -> std::io::Result<()> {
        if let Some(why) = &self.inner.borrow().failed {
            return Err(std::io::Error::other(format!(
                "the controller log takes no more writes after a failed one ({why})"
            )));
        }
        let mut buf = Vec::new();
        for r in &records {
            encode_record(r, &mut buf);
        }
        {
            let mut inner = self.inner.borrow_mut();
            for r in records {
                apply_record(&mut inner, r);
            }
        }
        let (file, at) = {
            let mut inner = self.inner.borrow_mut();
            let at = inner.file_len;
            inner.file_len += buf.len() as u64;
            (inner.file.clone(), at)
        };
        let len = buf.len();
        let written = match file.write_at(buf, at).await {
            Ok(n) if n == len => file.fdatasync().await.map_err(io_err),
            Ok(n) => Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short write of {n} of {len} bytes"),
            )),
            Err(e) => Err(io_err(e)),
        };
        if let Err(e) = &written {
            self.inner.borrow_mut().failed.get_or_insert_with(|| e.to_string());
        }
        written
    }

    /// Rewrites the log file with only what is left (after a purge).
    async fn rewrite(&self) -> std::io::Result<()> {
        let (path, buf) = {
            let inner = self.inner.borrow();
            if let Some(why) = &inner.failed {
                return Err(std::io::Error::other(format!(
                    "the controller log takes no more writes after a failed one ({why})"
                )));
            }
            let mut buf = Vec::new();
            if let Some(v) = inner.vote {
                encode_record(&LogRecord::Vote(v), &mut buf);
            }
            if let Some(p) = inner.purged {
                encode_record(&LogRecord::Purge(p), &mut buf);
            }
            encode_record(&LogRecord::Committed(inner.committed), &mut buf);
            for e in inner.entries.values() {
                encode_record(&LogRecord::Entry(e.clone()), &mut buf);
            }
            (inner.path.clone(), buf)
        };
        let len = buf.len() as u64;
        write_atomic(&path, buf).await?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .buffered_open(&path)
            .await
            .map_err(io_err)?;
        let mut inner = self.inner.borrow_mut();
        inner.file = Rc::new(file);
        inner.file_len = len;
        Ok(())
    }
}

fn apply_record(inner: &mut LogInner, record: LogRecord) {
    match record {
        LogRecord::Entry(e) => {
            inner.entries.insert(e.log_id.index, e);
        }
        LogRecord::Truncate(index) => {
            inner.entries.split_off(&index);
        }
        LogRecord::Purge(id) => {
            inner.entries = inner.entries.split_off(&(id.index + 1));
            inner.purged = Some(id);
        }
        LogRecord::Committed(c) => inner.committed = c,
        LogRecord::Vote(v) => inner.vote = Some(v),
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        Ok(self
            .inner
            .borrow()
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        let inner = self.inner.borrow();
        let last = inner.entries.values().next_back().map(|e| e.log_id).or(inner.purged);
        Ok(LogState {
            last_purged_log_id: inner.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StoreResult<()> {
        let started = std::time::Instant::now();
        self.write_records(vec![LogRecord::Vote(*vote)])
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?;
        let took = started.elapsed();
        if took > SLOW_VOTE_SAVE {
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                "saving the controller vote took long: a vote request is answered only once it is saved"
            );
        }
        Ok(())
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<NodeId>>> {
        Ok(self.inner.borrow().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StoreResult<()> {
        self.write_records(vec![LogRecord::Committed(committed)])
            .await
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn read_committed(&mut self) -> StoreResult<Option<LogId<NodeId>>> {
        Ok(self.inner.borrow().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>>,
    {
        let records: Vec<LogRecord> = entries.into_iter().map(LogRecord::Entry).collect();
        let result = self.write_records(records).await;
        let failed = result.as_ref().err().map(|e| StorageIOError::write_logs(e).into());
        callback.log_io_completed(result);
        failed.map_or(Ok(()), Err)
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        self.write_records(vec![LogRecord::Truncate(log_id.index)])
            .await
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        apply_record(&mut self.inner.borrow_mut(), LogRecord::Purge(log_id));
        self.rewrite().await.map_err(|e| StorageIOError::write_logs(&e).into())
    }
}

// ---- the state machine ------------------------------------------------------

#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<NodeId, BasicNode>,
    table: MetadataTable,
}

struct SmInner {
    stm: MetadataStm,
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    snapshot: Option<(SnapshotMeta<NodeId, BasicNode>, Vec<u8>)>,
}

/// Called with the new table after every applied batch of entries.
pub type Publish = Rc<dyn Fn(&MetadataTable)>;

/// The state machine store. Cheap to clone (shared on shard 0).
#[derive(Clone)]
pub struct StateMachineStore {
    inner: Rc<RefCell<SmInner>>,
    dir: PathBuf,
    publish: Publish,
}

impl StateMachineStore {
    /// Opens the state machine in `dir`, restoring the last snapshot.
    pub fn open(dir: &Path, publish: Publish) -> std::io::Result<StateMachineStore> {
        let mut inner = SmInner {
            stm: MetadataStm::new(),
            applied: None,
            membership: StoredMembership::default(),
            snapshot: None,
        };
        match std::fs::read(dir.join("snapshot.json")) {
            Ok(d) => {
                let file: SnapshotFile = serde_json::from_slice(&d).map_err(io_err)?;
                let data = serde_json::to_vec(&file.table).map_err(io_err)?;
                inner.stm.restore(&data).map_err(io_err)?;
                inner.applied = file.meta.last_log_id;
                inner.membership = file.meta.last_membership.clone();
                inner.snapshot = Some((file.meta, data));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        publish(inner.stm.table());
        Ok(StateMachineStore {
            inner: Rc::new(RefCell::new(inner)),
            dir: dir.to_path_buf(),
            publish,
        })
    }

    /// The table as applied so far.
    pub fn table(&self) -> MetadataTable {
        self.inner.borrow().stm.table().clone()
    }

    /// `f` of the table as applied now (without copying it).
    pub fn with_table<R>(&self, f: impl FnOnce(&MetadataTable) -> R) -> R {
        f(self.inner.borrow().stm.table())
    }

    async fn save_snapshot(
        &self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        table: &MetadataTable,
    ) -> std::io::Result<()> {
        let file = SnapshotFile {
            meta: meta.clone(),
            table: table.clone(),
        };
        let bytes = serde_json::to_vec(&file).map_err(io_err)?;
        write_atomic(&self.dir.join("snapshot.json"), bytes).await
    }
}

/// The table's position for a Raft index: the state machine counts entries
/// from 1, Raft indexes from 0.
fn stm_index(log_id: &LogId<NodeId>) -> u64 {
    log_id.index + 1
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> StoreResult<Snapshot<TypeConfig>> {
        let (meta, table, data) = {
            let inner = self.inner.borrow();
            let id = inner
                .applied
                .map_or("empty".to_string(), |l| format!("{}-{}", l.leader_id, l.index));
            let meta = SnapshotMeta {
                last_log_id: inner.applied,
                last_membership: inner.membership.clone(),
                snapshot_id: id,
            };
            (meta, inner.stm.table().clone(), inner.stm.snapshot())
        };
        self.save_snapshot(&meta, &table)
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        self.inner.borrow_mut().snapshot = Some((meta.clone(), data.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> StoreResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>)> {
        let inner = self.inner.borrow();
        Ok((inner.applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StoreResult<Vec<CommandResult>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>>,
    {
        let mut out = Vec::new();
        {
            let mut inner = self.inner.borrow_mut();
            for e in entries {
                inner.applied = Some(e.log_id);
                let index = stm_index(&e.log_id);
                match e.payload {
                    EntryPayload::Blank => {
                        inner.stm.apply_blank(index);
                        out.push(Ok(()));
                    }
                    EntryPayload::Normal(command) => {
                        let term = e.log_id.leader_id.term;
                        out.push(inner.stm.apply_in_term(index, term, &command))
                    }
                    EntryPayload::Membership(m) => {
                        inner.stm.apply_blank(index);
                        inner.membership = StoredMembership::new(Some(e.log_id), m);
                        out.push(Ok(()));
                    }
                }
            }
        }
        let table = self.inner.borrow().stm.table().clone();
        (self.publish)(&table);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StoreResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StoreResult<()> {
        let data = snapshot.into_inner();
        let mut stm = MetadataStm::new();
        stm.restore(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &io_err(e)))?;
        self.save_snapshot(meta, stm.table())
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        let table = stm.table().clone();
        {
            let mut inner = self.inner.borrow_mut();
            inner.stm = stm;
            inner.applied = meta.last_log_id;
            inner.membership = meta.last_membership.clone();
            inner.snapshot = Some((meta.clone(), data));
        }
        (self.publish)(&table);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StoreResult<Option<Snapshot<TypeConfig>>> {
        Ok(self.inner.borrow().snapshot.as_ref().map(|(meta, data)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(data.clone())),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tmpfs of `kib` KiB mounted on a directory of its own (needs root,
    /// as the full-disk tests in `tests/full_disk.rs` do); unmounted when
    /// dropped.
    struct SmallTmpfs(tempfile::TempDir);

    impl SmallTmpfs {
        fn mount(kib: u64) -> SmallTmpfs {
            let dir = tempfile::tempdir().unwrap();
            let out = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "strand-test"])
                .arg(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "mount: {}", String::from_utf8_lossy(&out.stderr));
            SmallTmpfs(dir)
        }
    }

    impl Drop for SmallTmpfs {
        fn drop(&mut self) {
            // Busy while a file dropped on the executor is still being
            // closed: tried again, then detached lazily.
            let umount = |args: &[&str]| {
                std::process::Command::new("umount")
                    .args(args)
                    .arg(self.0.path())
                    .status()
                    .is_ok_and(|s| s.success())
            };
            for _ in 0..20 {
                if umount(&[]) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            umount(&["-l"]);
        }
    }

    fn entry(index: u64, payload: EntryPayload<TypeConfig>) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload,
        }
    }

    /// Bug 9 of strand-chaos (disk-full nemesis): a write that failed
    /// halfway had moved the log's length on, and a later small record (a
    /// vote's commit, once retention had freed space) landed beyond the
    /// torn one; a restart then refused the whole log (a corrupt record
    /// with records after it) and the node could not start again. Now the
    /// log takes no write after a failed one, and a reopen drops the torn
    /// tail.
    #[test]
    fn after_a_failed_write_the_log_takes_no_more_and_reopens_without_the_torn_record() {
        let fs = SmallTmpfs::mount(64);
        let root = fs.0.path().to_path_buf();
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let dir = root.join("__controller");
                let log = LogStore::open(&dir).await.unwrap();
                log.write_records(vec![LogRecord::Entry(entry(1, EntryPayload::Blank))])
                    .await
                    .unwrap();
                // The file system full to its last page.
                let ballast = root.join("ballast");
                {
                    use std::io::Write;
                    let mut f = std::fs::File::create(&ballast).unwrap();
                    while f.write_all(&[0u8; 4096]).is_ok() {}
                }
                let big = Command::DeleteQueue {
                    name: "x".repeat(16 << 10),
                };
                let failed = log
                    .write_records(vec![LogRecord::Entry(entry(2, EntryPayload::Normal(big)))])
                    .await
                    .unwrap_err();
                eprintln!("the big record: {failed}");
                // Space is back; a small record must not land after the torn one.
                std::fs::remove_file(&ballast).unwrap();
                let refused = log
                    .write_records(vec![LogRecord::Committed(Some(entry(1, EntryPayload::Blank).log_id))])
                    .await
                    .unwrap_err();
                assert!(refused.to_string().contains("no more writes"), "{refused}");
                drop(log);
                let reopened = LogStore::open(&dir).await.expect("the log opens again");
                let inner = reopened.inner.borrow();
                assert_eq!(inner.entries.keys().copied().collect::<Vec<_>>(), [1]);
                assert_eq!(inner.committed, None);
            })
            .unwrap()
            .join()
            .unwrap();
    }

    /// The vote is a record of the log: kept across a reopen and a purge's
    /// rewrite, newer than a `vote.json` an older version left, which is
    /// read only while the log holds no vote.
    #[test]
    fn the_vote_is_a_log_record_kept_across_reopens_and_purges() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let dir = root.join("__controller");
                std::fs::create_dir_all(&dir).unwrap();
                let old = Vote::new(1, 3);
                std::fs::write(dir.join("vote.json"), serde_json::to_vec(&old).unwrap()).unwrap();
                let mut log = LogStore::open(&dir).await.unwrap();
                assert_eq!(
                    log.read_vote().await.unwrap(),
                    Some(old),
                    "an older version's vote.json"
                );
                let ours = Vote::new(2, 1);
                log.save_vote(&ours).await.unwrap();
                let mut log = LogStore::open(&dir).await.unwrap();
                assert_eq!(log.read_vote().await.unwrap(), Some(ours), "the record wins");
                for i in 1..=3 {
                    log.write_records(vec![LogRecord::Entry(entry(i, EntryPayload::Blank))])
                        .await
                        .unwrap();
                }
                let newer = Vote::new(3, 2);
                log.save_vote(&newer).await.unwrap();
                log.purge(entry(2, EntryPayload::Blank).log_id).await.unwrap();
                std::fs::remove_file(dir.join("vote.json")).unwrap();
                let mut log = LogStore::open(&dir).await.unwrap();
                assert_eq!(log.read_vote().await.unwrap(), Some(newer), "kept by the rewrite");
                assert_eq!(log.inner.borrow().entries.keys().copied().collect::<Vec<_>>(), [3]);
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_is_dropped() {
        let mut buf = Vec::new();
        encode_record(&LogRecord::Truncate(5), &mut buf);
        encode_record(&LogRecord::Committed(None), &mut buf);
        encode_record(&LogRecord::Vote(Vote::new(4, 2)), &mut buf);
        let whole = buf.len();
        encode_record(&LogRecord::Truncate(9), &mut buf);
        let (records, valid) = decode_records(&buf);
        assert_eq!((records.len(), valid), (4, buf.len()));
        assert!(matches!(records[2], LogRecord::Vote(v) if v == Vote::new(4, 2)));
        for cut in whole..buf.len() {
            let (records, valid) = decode_records(&buf[..cut]);
            assert_eq!((records.len(), valid), (3, whole), "cut at {cut}");
        }
        let mut flipped = buf.clone();
        flipped[whole + 10] ^= 1;
        assert_eq!(decode_records(&flipped).1, whole);
    }
}
