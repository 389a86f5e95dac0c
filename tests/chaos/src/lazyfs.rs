//! A file system that forgets what was not synced: the `power-loss`
//! nemesis (Jepsen's LazyFS idea, in this process). Each node's data
//! directory is a FUSE mount that passes every call through to a backing
//! directory beside it, and remembers, per file, what a power cut would
//! take back: the bytes each write overwrote since the file's last sync
//! (an undo log) and the file's length at that sync. A power loss
//! ([`LazyDisk::power_loss`], with the node's processes already killed)
//! unmounts the file system (the kernel's caches of it go with it), puts
//! the overwritten bytes back newest first, cuts each file to its synced
//! length, and mounts it again.
//!
//! What counts as synced, file by file:
//! - `fsync` or `fdatasync` of any descriptor of the file: everything the
//!   file holds then (the call reaches the daemon as FUSE_FSYNC, also
//!   when io_uring issues it);
//! - a write through a descriptor opened `O_DSYNC` or `O_SYNC`: the whole
//!   file (the segment writer's write-through mode and the shard journal
//!   write so). Linux makes only that write's range durable; the two
//!   differ only for a file also written through a descriptor without
//!   `O_DSYNC`, which the broker does not do;
//! - a file that existed when it was first written after a mount or a
//!   power loss: as it was then.
//!
//! Names are kept: create, mkdir, rename, unlink and rmdir take effect at
//! once and survive a power loss, as on a journaling file system whose
//! metadata was committed; a file created and never synced comes back
//! empty (length 0), which is what ext4 gives a file renamed into place
//! without its data synced.
//!
//! O_DIRECT: the kernel's FUSE module takes `O_DIRECT` opens and sends
//! such reads and writes to the daemon as they are (no page cache), with
//! no alignment rule of its own; the daemon opens the backing file
//! without `O_DIRECT` (and without `O_APPEND`: the kernel already chose
//! each write's offset) and uses plain positioned reads and writes, so the
//! broker's aligned direct I/O works unchanged. Buffered writes reach the
//! daemon as they are made (no writeback cache is asked for).
//!
//! The daemon runs on one thread of this process and never touches its
//! own mount; the chaos run reaches the data directories through the
//! mount (the wipe and corrupt nemeses), like any other program.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::{File, Metadata, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    BackgroundSession, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

/// How long the kernel may keep names and attributes: everything changes
/// through this mount, and a power loss remounts (dropping them).
const TTL: Duration = Duration::from_secs(1);

/// What a power cut would take back from one file.
#[derive(Debug)]
struct Unsynced {
    /// Where the file is now (kept up to date by rename).
    path: PathBuf,
    /// Its length at its last sync.
    synced_len: u64,
    /// (offset, bytes there before a write), oldest first.
    undo: Vec<(u64, Vec<u8>)>,
}

/// The unsynced state of a node's files, by backing inode. It outlives
/// each mount: it is the node's disk.
#[derive(Debug, Default)]
pub struct Tracker {
    files: HashMap<u64, Unsynced>,
}

/// What one power loss took back.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Lost {
    /// Files that had unsynced changes.
    pub files: usize,
    /// Bytes put back or cut off.
    pub bytes: u64,
    /// The names of the files that lost the most, largest first (at most
    /// three).
    pub largest: Vec<(String, u64)>,
}

impl Tracker {
    fn entry(&mut self, ino: u64, path: &Path, len_now: u64) -> &mut Unsynced {
        self.files.entry(ino).or_insert_with(|| Unsynced {
            path: path.to_path_buf(),
            synced_len: len_now,
            undo: Vec::new(),
        })
    }

    /// Before `file` changes at `[offset, offset + len)`: keeps the bytes
    /// there that a sync had made durable.
    fn before_change(&mut self, ino: u64, path: &Path, file: &File, offset: u64, len: u64) -> std::io::Result<()> {
        let len_now = file.metadata()?.len();
        let entry = self.entry(ino, path, len_now);
        let end = offset.saturating_add(len).min(entry.synced_len);
        if offset < end {
            let mut old = vec![0u8; (end - offset) as usize];
            let mut got = 0;
            while got < old.len() {
                match file.read_at(&mut old[got..], offset + got as u64)? {
                    0 => break,
                    n => got += n,
                }
            }
            old.truncate(got);
            if !old.is_empty() {
                entry.undo.push((offset, old));
            }
        }
        Ok(())
    }

    /// Everything `ino` holds now is durable.
    fn synced(&mut self, ino: u64) {
        self.files.remove(&ino);
    }

    /// A new file: nothing of it is durable but its name.
    fn created(&mut self, ino: u64, path: &Path) {
        self.files.insert(
            ino,
            Unsynced {
                path: path.to_path_buf(),
                synced_len: 0,
                undo: Vec::new(),
            },
        );
    }

    fn removed(&mut self, ino: u64) {
        self.files.remove(&ino);
    }

    /// `from` (a file or a directory) is now at `to`.
    fn renamed(&mut self, from: &Path, to: &Path) {
        for u in self.files.values_mut() {
            if let Ok(rest) = u.path.strip_prefix(from) {
                u.path = match rest.as_os_str().is_empty() {
                    true => to.to_path_buf(),
                    false => to.join(rest),
                };
            }
        }
    }

    /// The power cut: every file back to what it held at its last sync.
    /// A file that is gone or is another file now is passed over.
    /// Every file is tried; the first failure is returned after.
    pub fn revert(&mut self) -> Result<Lost, String> {
        let mut lost = Lost::default();
        let mut failed = None;
        for (ino, u) in self.files.drain() {
            let revert_one = || -> std::io::Result<Option<u64>> {
                let file = match OpenOptions::new().read(true).write(true).open(&u.path) {
                    Ok(f) => f,
                    // Gone, or a directory now: not this file any more.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EISDIR | libc::ENOTDIR)) => {
                        return Ok(None)
                    }
                    Err(e) => return Err(e),
                };
                let md = file.metadata()?;
                if md.ino() != ino {
                    return Ok(None);
                }
                let mut bytes = md.len().saturating_sub(u.synced_len);
                for (offset, old) in u.undo.iter().rev() {
                    file.write_all_at(old, *offset)?;
                    bytes += old.len() as u64;
                }
                file.set_len(u.synced_len)?;
                Ok(Some(bytes))
            };
            let bytes = match revert_one() {
                Ok(Some(bytes)) => bytes,
                Ok(None) => continue,
                Err(e) => {
                    failed.get_or_insert(format!("power loss: reverting {}: {e}", u.path.display()));
                    continue;
                }
            };
            if bytes > 0 {
                lost.files += 1;
                lost.bytes += bytes;
                let name = u.path.file_name().unwrap_or_default().to_string_lossy().into_owned();
                lost.largest.push((name, bytes));
                lost.largest.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
                lost.largest.truncate(3);
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(lost),
        }
    }
}

/// An open file of the mount.
struct Handle {
    ino: u64,
    file: File,
    /// Opened O_DSYNC or O_SYNC: each write is durable as it completes.
    write_through: bool,
}

/// One directory entry: backing inode, kind, name.
type Listed = (u64, FileType, std::ffi::OsString);

struct Inner {
    /// Backing path of each inode the kernel knows (by backing inode).
    paths: HashMap<u64, PathBuf>,
    handles: HashMap<u64, Handle>,
    /// Each open directory's listing, as taken when it was opened (or read
    /// from its start again): offsets stay stable while entries are made
    /// and removed, as POSIX asks of readdir.
    listings: HashMap<u64, Vec<Listed>>,
    next_handle: u64,
}

/// The FUSE file system over one backing directory.
struct LazyFs {
    /// The backing directory's inode (FUSE's root is inode 1).
    root_ino: u64,
    inner: Mutex<Inner>,
    tracker: Arc<Mutex<Tracker>>,
}

fn errno(e: std::io::Error) -> Errno {
    Errno::from(e)
}

fn time(secs: i64, nanos: i64) -> SystemTime {
    match secs >= 0 {
        true => UNIX_EPOCH + Duration::new(secs as u64, nanos as u32),
        false => UNIX_EPOCH,
    }
}

fn cstring(path: &Path) -> Result<CString, Errno> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

impl LazyFs {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tracker(&self) -> MutexGuard<'_, Tracker> {
        self.tracker.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fuse_ino(&self, backing: u64) -> INodeNo {
        match backing == self.root_ino {
            true => INodeNo::ROOT,
            false => INodeNo(backing),
        }
    }

    fn backing_ino(&self, ino: INodeNo) -> u64 {
        match ino == INodeNo::ROOT {
            true => self.root_ino,
            false => ino.0,
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.lock()
            .paths
            .get(&self.backing_ino(ino))
            .cloned()
            .ok_or(Errno::ESTALE)
    }

    fn attr(&self, md: &Metadata) -> FileAttr {
        FileAttr {
            ino: self.fuse_ino(md.ino()),
            size: md.len(),
            blocks: md.blocks(),
            atime: time(md.atime(), md.atime_nsec()),
            mtime: time(md.mtime(), md.mtime_nsec()),
            ctime: time(md.ctime(), md.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind: FileType::from_std(md.file_type()).unwrap_or(FileType::RegularFile),
            perm: (md.mode() & 0o7777) as u16,
            nlink: md.nlink() as u32,
            uid: md.uid(),
            gid: md.gid(),
            rdev: md.rdev() as u32,
            blksize: md.blksize() as u32,
            flags: 0,
        }
    }

    /// Learns `path` (a name just looked up or made) and its attributes.
    fn learn(&self, path: PathBuf) -> Result<FileAttr, Errno> {
        let md = std::fs::symlink_metadata(&path).map_err(errno)?;
        self.lock().paths.insert(md.ino(), path);
        Ok(self.attr(&md))
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path(parent)?.join(name))
    }

    /// Cuts or extends the file at `path` (or open as `file`) to `size`,
    /// keeping what a power cut would put back.
    fn truncate(&self, ino: u64, path: &Path, file: &File, size: u64) -> Result<(), Errno> {
        let len_now = file.metadata().map_err(errno)?.len();
        if size < len_now {
            self.tracker()
                .before_change(ino, path, file, size, len_now - size)
                .map_err(errno)?;
        } else {
            self.tracker().entry(ino, path, len_now);
        }
        file.set_len(size).map_err(errno)
    }

    fn open_backing(&self, path: &Path, flags: i32, create: Option<u32>) -> std::io::Result<File> {
        let mut options = OpenOptions::new();
        match flags & libc::O_ACCMODE {
            libc::O_RDONLY => options.read(true),
            // Written files are read too: a write first keeps the bytes
            // it overwrites.
            _ => options.read(true).write(true),
        };
        if let Some(mode) = create {
            options.create(true).mode(mode);
            if flags & libc::O_EXCL != 0 {
                options.create_new(true);
            }
        }
        // The kernel chose each write's offset; the backing file is read
        // and written in the page cache; truncation is done (and tracked)
        // apart; syncing is what this file system models.
        let keep = flags
            & !(libc::O_ACCMODE
                | libc::O_CREAT
                | libc::O_EXCL
                | libc::O_TRUNC
                | libc::O_APPEND
                | libc::O_DIRECT
                | libc::O_DSYNC
                | libc::O_SYNC);
        options.custom_flags(keep);
        options.open(path)
    }

    fn add_handle(&self, ino: u64, file: File, flags: i32) -> u64 {
        let mut inner = self.lock();
        inner.next_handle += 1;
        let fh = inner.next_handle;
        inner.handles.insert(
            fh,
            Handle {
                ino,
                file,
                write_through: flags & libc::O_DSYNC != 0,
            },
        );
        fh
    }

    /// The entries of directory `ino` now, with `.` and `..` first.
    fn list(&self, ino: INodeNo) -> Result<Vec<Listed>, Errno> {
        let dir = self.path(ino)?;
        let mut entries: Vec<Listed> = Vec::new();
        for e in std::fs::read_dir(&dir).map_err(errno)? {
            let e = e.map_err(errno)?;
            let kind = e
                .file_type()
                .ok()
                .and_then(FileType::from_std)
                .unwrap_or(FileType::RegularFile);
            entries.push((std::os::unix::fs::DirEntryExt::ino(&e), kind, e.file_name()));
        }
        entries.sort_by(|a, b| a.2.cmp(&b.2));
        let me = self.backing_ino(ino);
        let mut listed = vec![
            (me, FileType::Directory, ".".into()),
            (me, FileType::Directory, "..".into()),
        ];
        listed.extend(entries);
        Ok(listed)
    }

    fn with_handle<T>(&self, fh: FileHandle, f: impl FnOnce(&Handle) -> Result<T, Errno>) -> Result<T, Errno> {
        let inner = self.lock();
        let handle = inner.handles.get(&fh.0).ok_or(Errno::EBADF)?;
        f(handle)
    }

    #[allow(clippy::too_many_arguments)]
    fn do_setattr(
        &self,
        ino: INodeNo,
        fh: Option<FileHandle>,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        times: [Option<TimeOrNow>; 2],
    ) -> Result<FileAttr, Errno> {
        let path = self.path(ino)?;
        if let Some(mode) = mode {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777)).map_err(errno)?;
        }
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::lchown(&path, uid, gid).map_err(errno)?;
        }
        if let Some(size) = size {
            // Through the open file when there is one (ftruncate).
            let open = fh.and_then(|fh| self.with_handle(fh, |h| h.file.try_clone().map_err(errno)).ok());
            let file = match open {
                Some(f) => f,
                None => OpenOptions::new().read(true).write(true).open(&path).map_err(errno)?,
            };
            self.truncate(self.backing_ino(ino), &path, &file, size)?;
        }
        if times.iter().any(Option::is_some) {
            let spec = |t: Option<TimeOrNow>| match t {
                None => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_OMIT,
                },
                Some(TimeOrNow::Now) => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_NOW,
                },
                Some(TimeOrNow::SpecificTime(t)) => {
                    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
                    libc::timespec {
                        tv_sec: d.as_secs() as libc::time_t,
                        tv_nsec: i64::from(d.subsec_nanos()),
                    }
                }
            };
            let specs = [spec(times[0]), spec(times[1])];
            let c = cstring(&path)?;
            // SAFETY: a valid C path and two timespecs.
            if unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), specs.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) } != 0 {
                return Err(errno(std::io::Error::last_os_error()));
            }
        }
        self.learn(path)
    }

    fn do_write(&self, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let inner = self.lock();
        let handle = inner.handles.get(&fh.0).ok_or(Errno::EBADF)?;
        let path = inner.paths.get(&handle.ino).cloned().unwrap_or_default();
        let mut tracker = self.tracker();
        tracker
            .before_change(handle.ino, &path, &handle.file, offset, data.len() as u64)
            .map_err(errno)?;
        handle.file.write_all_at(data, offset).map_err(errno)?;
        if handle.write_through {
            tracker.synced(handle.ino);
        }
        Ok(data.len() as u32)
    }

    fn do_rename(&self, from: &Path, to: &Path, flags: RenameFlags) -> Result<(), Errno> {
        let replaced = std::fs::symlink_metadata(to).ok();
        let (a, b) = (cstring(from)?, cstring(to)?);
        // SAFETY: two valid C paths.
        let rc = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags.bits()) };
        if rc != 0 {
            return Err(errno(std::io::Error::last_os_error()));
        }
        let from_ino = std::fs::symlink_metadata(to).map(|md| md.ino()).ok();
        let replaced = replaced
            .filter(|md| md.is_file() && !flags.contains(RenameFlags::RENAME_EXCHANGE) && Some(md.ino()) != from_ino);
        let mut tracker = self.tracker();
        if let Some(md) = &replaced {
            tracker.removed(md.ino());
        }
        tracker.renamed(from, to);
        drop(tracker);
        let mut inner = self.lock();
        if let Some(md) = &replaced {
            inner.paths.remove(&md.ino());
        }
        for p in inner.paths.values_mut() {
            if let Ok(rest) = p.strip_prefix(from) {
                *p = match rest.as_os_str().is_empty() {
                    true => to.to_path_buf(),
                    false => to.join(rest),
                };
            }
        }
        Ok(())
    }
}

impl Filesystem for LazyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent, name).and_then(|p| self.learn(p)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        // Through the open file when there is one (it may have no name now).
        let by_handle = fh.and_then(|fh| self.with_handle(fh, |h| h.file.metadata().map_err(errno)).ok());
        let md = match by_handle {
            Some(md) => Ok(md),
            None => self.path(ino).and_then(|p| std::fs::symlink_metadata(p).map_err(errno)),
        };
        match md {
            Ok(md) => reply.attr(&TTL, &self.attr(&md)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.do_setattr(ino, fh, mode, uid, gid, size, [atime, mtime]) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let made = self.child(parent, name).and_then(|path| {
            std::fs::DirBuilder::new()
                .mode(mode & !umask & 0o7777)
                .create(&path)
                .map_err(errno)?;
            self.learn(path)
        });
        match made {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let done = self.child(parent, name).and_then(|path| {
            let md = std::fs::symlink_metadata(&path).map_err(errno)?;
            std::fs::remove_file(&path).map_err(errno)?;
            if md.nlink() <= 1 {
                self.tracker().removed(md.ino());
                // Its name is gone: a stale lookup by inode fails rather
                // than reach whatever takes the name next.
                self.lock().paths.remove(&md.ino());
            }
            Ok(())
        });
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self
            .child(parent, name)
            .and_then(|p| std::fs::remove_dir(p).map_err(errno))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let done = self
            .child(parent, name)
            .and_then(|from| Ok((from, self.child(newparent, newname)?)))
            .and_then(|(from, to)| self.do_rename(&from, &to, flags));
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let opened = self.path(ino).and_then(|path| {
            let file = self.open_backing(&path, flags.0, None).map_err(errno)?;
            if flags.0 & libc::O_TRUNC != 0 {
                self.truncate(self.backing_ino(ino), &path, &file, 0)?;
            }
            Ok(self.add_handle(self.backing_ino(ino), file, flags.0))
        });
        match opened {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let read = self.with_handle(fh, |h| {
            let mut buf = vec![0u8; size as usize];
            let mut got = 0;
            while got < buf.len() {
                match h.file.read_at(&mut buf[got..], offset + got as u64).map_err(errno)? {
                    0 => break,
                    n => got += n,
                }
            }
            buf.truncate(got);
            Ok(buf)
        });
        match read {
            Ok(buf) => reply.data(&buf),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.do_write(fh, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.lock().handles.remove(&fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.tracker().synced(self.backing_ino(ino));
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.list(ino) {
            Ok(listed) => {
                let mut inner = self.lock();
                inner.next_handle += 1;
                let fh = inner.next_handle;
                inner.listings.insert(fh, listed);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if offset == 0 {
            match self.list(ino) {
                Ok(listed) => {
                    self.lock().listings.insert(fh.0, listed);
                }
                Err(e) => return reply.error(e),
            }
        }
        let inner = self.lock();
        let Some(listed) = inner.listings.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, (backing, kind, name)) in listed.iter().enumerate().skip(offset as usize) {
            if reply.add(self.fuse_ino(*backing), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.lock().listings.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let root = self.lock().paths.get(&self.root_ino).cloned().unwrap_or_default();
        let c = match cstring(&root) {
            Ok(c) => c,
            Err(e) => return reply.error(e),
        };
        // SAFETY: a valid C path and a zeroed statvfs to fill.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return reply.error(errno(std::io::Error::last_os_error()));
        }
        reply.statfs(
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        );
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let made = self.child(parent, name).and_then(|path| {
            let existed = std::fs::symlink_metadata(&path).ok();
            let file = self
                .open_backing(&path, flags, Some(mode & !umask & 0o7777))
                .map_err(errno)?;
            let md = file.metadata().map_err(errno)?;
            match existed {
                None => self.tracker().created(md.ino(), &path),
                Some(_) if flags & libc::O_TRUNC != 0 => self.truncate(md.ino(), &path, &file, 0)?,
                Some(_) => {}
            }
            let attr = self.learn(path)?;
            Ok((attr, self.add_handle(md.ino(), file, flags)))
        });
        match made {
            Ok((attr, fh)) => reply.created(&TTL, &attr, Generation(0), FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let done = (|| {
            let inner = self.lock();
            let handle = inner.handles.get(&fh.0).ok_or(Errno::EBADF)?;
            if mode & (libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE) != 0 {
                return Err(Errno::EOPNOTSUPP);
            }
            if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
                let path = inner.paths.get(&handle.ino).cloned().unwrap_or_default();
                self.tracker()
                    .before_change(handle.ino, &path, &handle.file, offset, length)
                    .map_err(errno)?;
            } else {
                let len_now = handle.file.metadata().map_err(errno)?.len();
                let path = inner.paths.get(&handle.ino).cloned().unwrap_or_default();
                self.tracker().entry(handle.ino, &path, len_now);
            }
            // SAFETY: fallocate(2) on a descriptor the handle owns.
            let rc = unsafe { libc::fallocate(handle.file.as_raw_fd(), mode, offset as i64, length as i64) };
            match rc {
                0 => Ok(()),
                _ => Err(errno(std::io::Error::last_os_error())),
            }
        })();
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

/// A node's data directory as a [`LazyFs`] mount over a backing directory.
pub struct LazyDisk {
    backing: PathBuf,
    mount: PathBuf,
    tracker: Arc<Mutex<Tracker>>,
    session: Option<BackgroundSession>,
}

impl LazyDisk {
    /// Mounts `mount` (made if missing) over `backing` (made if missing).
    pub fn mount(backing: &Path, mount: &Path) -> Result<LazyDisk, String> {
        for dir in [backing, mount] {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let mut disk = LazyDisk {
            backing: backing.to_path_buf(),
            mount: mount.to_path_buf(),
            tracker: Arc::new(Mutex::new(Tracker::default())),
            session: None,
        };
        disk.start()?;
        Ok(disk)
    }

    fn start(&mut self) -> Result<(), String> {
        let root = std::fs::metadata(&self.backing).map_err(|e| format!("{}: {e}", self.backing.display()))?;
        let fs = LazyFs {
            root_ino: root.ino(),
            inner: Mutex::new(Inner {
                paths: HashMap::from([(root.ino(), self.backing.clone())]),
                handles: HashMap::new(),
                listings: HashMap::new(),
                next_handle: 0,
            }),
            tracker: self.tracker.clone(),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("strand-lazyfs".into()),
            fuser::MountOption::DefaultPermissions,
        ];
        // Other users (the brokers run as this user, but a test may not).
        config.acl = fuser::SessionACL::All;
        let session = fuser::spawn_mount(fs, &self.mount, &config)
            .map_err(|e| format!("mounting the lazy file system at {}: {e}", self.mount.display()))?;
        self.session = Some(session);
        Ok(())
    }

    /// Unmounts (tried for 5 s while busy, then detached) and waits for
    /// the daemon thread to end, which it does once the kernel lets go of
    /// the file system: only then may the backing files change.
    fn stop(&mut self) -> Result<(), String> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let target = cstring(&self.mount).map_err(|_| format!("{}: not a C path", self.mount.display()))?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            // SAFETY: umount2(2) on a valid C path.
            if unsafe { libc::umount2(target.as_ptr(), 0) } == 0 {
                break;
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINVAL) {
                break; // not mounted any more
            }
            if Instant::now() > deadline {
                // SAFETY: as above.
                unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !session.guard.is_finished() {
            if Instant::now() > deadline {
                return Err(format!(
                    "{}: unmounted, but a process still holds a file of it",
                    self.mount.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Its mount handle finds the file system gone, and says nothing.
        let _ = session.join();
        Ok(())
    }

    /// The power cut, with every process that used the mount already
    /// killed: unmount, take back every unsynced change, mount again.
    pub fn power_loss(&mut self) -> Result<Lost, String> {
        self.stop()?;
        let lost = self.tracker.lock().unwrap_or_else(|p| p.into_inner()).revert()?;
        self.start()?;
        Ok(lost)
    }
}

impl Drop for LazyDisk {
    fn drop(&mut self) {
        // Detached if busy (it goes when released).
        let _ = self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mounted() -> Option<(tempfile::TempDir, LazyDisk)> {
        if !crate::network::is_root() || !Path::new("/dev/fuse").exists() {
            eprintln!("skipped: needs root and /dev/fuse");
            return None;
        }
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let disk = LazyDisk::mount(&tmp.path().join("backing"), &tmp.path().join("data")).unwrap();
        Some((tmp, disk))
    }

    /// Needs root and /dev/fuse (skipped otherwise): what was synced stays
    /// and what was not goes, for buffered, O_DIRECT and O_DSYNC writes,
    /// overwrites, truncation, a file never synced, and a rename.
    #[test]
    fn a_power_loss_keeps_what_was_synced_and_drops_the_rest() {
        let Some((tmp, mut disk)) = mounted() else { return };
        let data = tmp.path().join("data");
        // Synced, then overwritten in part and extended, unsynced.
        let kept = data.join("kept");
        let f = File::create(&kept).unwrap();
        f.write_all_at(b"hello world", 0).unwrap();
        f.sync_data().unwrap();
        f.write_all_at(b"HELLO", 0).unwrap();
        f.write_all_at(b" and more", 11).unwrap();
        drop(f);
        // Never synced, then renamed into place (the classic lost file).
        std::fs::write(data.join("tmp"), b"not synced").unwrap();
        std::fs::rename(data.join("tmp"), data.join("renamed")).unwrap();
        // Synced, then cut short, unsynced.
        let cut = data.join("cut");
        let f = File::create(&cut).unwrap();
        f.write_all_at(&[7u8; 8192], 0).unwrap();
        f.sync_all().unwrap();
        f.set_len(100).unwrap();
        drop(f);
        // O_DIRECT, aligned, then synced with fdatasync; then one more
        // block unsynced.
        let direct = data.join("direct");
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&direct)
            .unwrap();
        let block = Aligned([5u8; 4096]);
        f.write_all_at(&block.0, 0).unwrap();
        f.sync_data().unwrap();
        f.write_all_at(&Aligned([6u8; 4096]).0, 4096).unwrap();
        drop(f);
        // O_DSYNC: durable as written.
        let dsync = data.join("dsync");
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .custom_flags(libc::O_DSYNC)
            .open(&dsync)
            .unwrap();
        f.write_all_at(b"durable", 0).unwrap();
        drop(f);

        // A directory of many entries is removed whole: readdir's offsets
        // stay put while its entries go.
        let many = data.join("many");
        std::fs::create_dir(&many).unwrap();
        for i in 0..400 {
            std::fs::write(many.join(format!("{i:024}")), b"x").unwrap();
        }
        std::fs::remove_dir_all(&many).unwrap();

        let lost = disk.power_loss().unwrap();
        assert_eq!(std::fs::read(&kept).unwrap(), b"hello world");
        assert_eq!(std::fs::read(data.join("renamed")).unwrap(), b"");
        assert_eq!(std::fs::read(&cut).unwrap(), vec![7u8; 8192]);
        assert_eq!(std::fs::read(&direct).unwrap(), vec![5u8; 4096]);
        assert_eq!(std::fs::read(&dsync).unwrap(), b"durable");
        assert_eq!(lost.files, 4, "{lost:?}");
        // A second power loss takes nothing more.
        assert_eq!(disk.power_loss().unwrap(), Lost::default());
        drop(disk);
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        assert!(!mounts.contains(&data.display().to_string()), "still mounted");
    }

    #[repr(align(4096))]
    struct Aligned([u8; 4096]);
}
