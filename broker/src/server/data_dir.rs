//! The broker's data directory: made absolute, locked for this process
//! alone, and removed again if this process made it and failed to start.
//!
//! Runs on: the main thread, before any shard starts.
//!
//! Why each step:
//! - **Absolute path.** glommio's `Directory::open` (which the controller's
//!   store syncs its directory with) hands a relative path to `openat` with
//!   a directory fd of -1, which fails with EBADF: every relative
//!   `--data-dir` (the default `./strand-data` among them) could not start.
//!   The path is resolved once here, so nothing later sees a relative one.
//! - **Lock.** Two brokers on one directory write the same segments, each
//!   believing it owns them, and acknowledged records are lost. The lock is
//!   an exclusive `flock` on `DIR/__lock`, taken before anything else in the
//!   directory is touched and held (by the open file) until the process
//!   exits, kill -9 included: the kernel drops it with the last descriptor.
//!   The file holds the owner's PID (as text) so a refused broker can name
//!   it. `__` names are reserved for the broker (no queue can be called
//!   that), so the file never meets a queue's directory.
//! - **Directory id** (`__directory`, `strand_storage::checkpoint` gives
//!   its bytes). Read once the lock is held, or made when absent (a new
//!   directory, or one from before directory ids): a random id, written
//!   durably. The broker registers it with the controller, which notices
//!   when a broker comes back with another one (a replaced or wiped disk,
//!   or a mount that failed and left an empty directory in its place):
//!   everything the broker held is gone, and it must not lead or count as
//!   in sync for any partition until it has caught up again (KIP-858). A
//!   damaged file refuses the start: a new id would declare the data lost.
//! - **No empty directory after a failed start.** A directory this process
//!   created is removed when the start fails before any shard ran. Once
//!   shards run, a shard that is ready accepts clients before the others
//!   are, so nothing is removed from then on.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "__lock";

/// Why the data directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("data directory {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("data directory {path} is in use by process {pid} (its {LOCK_FILE} is locked)")]
    InUse { path: PathBuf, pid: String },
    #[error(
        "data directory {path}: its id file {name} is damaged ({why}); if the directory's data is intact, remove \
         the file to give it a new id: its replicas then catch up from the others, and a partition only this \
         broker held waits for `strand queue elect --unclean`",
        name = strand_storage::checkpoint::DIRECTORY_ID_FILE
    )]
    DamagedId { path: PathBuf, why: String },
    #[error("data directory {path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// A data directory this process holds the lock of.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    /// Whether this process created the directory (and may remove it
    /// again if the start fails before any shard ran).
    made: bool,
    /// Its id (`__directory`), read or made when it was opened.
    id: u64,
    /// Open for as long as the lock is held.
    _lock: File,
}

impl DataDir {
    /// Creates `path` if need be, resolves it and takes its lock.
    pub fn open(path: &Path) -> Result<DataDir, DataDirError> {
        let io = |what, source| DataDirError::Io {
            path: path.to_path_buf(),
            what,
            source,
        };
        let not_a_dir = || DataDirError::NotADirectory(path.to_path_buf());
        match std::fs::metadata(path) {
            Ok(m) if !m.is_dir() => return Err(not_a_dir()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // A parent on the way is a file.
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => return Err(not_a_dir()),
            Err(e) => return Err(io("reading its metadata", e)),
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotADirectory | std::io::ErrorKind::AlreadyExists => not_a_dir(),
                _ => io("creating its parent", e),
            })?;
        }
        // Made here only if this call created it: a broker starting beside
        // this one on the same new path finds it existing.
        let made = match std::fs::create_dir(path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && path.is_dir() => false,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotADirectory
                ) =>
            {
                return Err(not_a_dir())
            }
            Err(e) => return Err(io("creating it", e)),
        };
        let absolute = std::fs::canonicalize(path).map_err(|e| io("resolving its path", e))?;
        // Refused: whoever holds the lock owns the directory, whoever made
        // it; nothing is removed.
        let lock = lock(&absolute)?;
        let id = directory_id(&absolute)?;
        Ok(DataDir {
            path: absolute,
            made,
            id,
            _lock: lock,
        })
    }

    /// The directory's id (see the module doc).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The absolute path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The start failed before any shard ran: removes the directory if
    /// this process made it (its parents stay: another broker may be
    /// starting beside this one in them).
    pub fn discard_if_new(self) {
        if self.made {
            if let Err(e) = std::fs::remove_dir_all(&self.path) {
                tracing::warn!("removing {} after a failed start: {e}", self.path.display());
            }
        }
    }
}

/// Takes the exclusive lock of `dir/__lock` and writes this process's PID
/// into it.
fn lock(dir: &Path) -> Result<File, DataDirError> {
    let path = dir.join(LOCK_FILE);
    let io = |what, source| DataDirError::Io {
        path: dir.to_path_buf(),
        what,
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| io("opening its lock file", e))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = match pid.trim() {
                "" => "unknown".to_string(),
                p => p.to_string(),
            };
            return Err(DataDirError::InUse {
                path: dir.to_path_buf(),
                pid,
            });
        }
        return Err(io("locking it", e));
    }
    file.set_len(0).map_err(|e| io("writing its lock file", e))?;
    file.rewind().map_err(|e| io("writing its lock file", e))?;
    writeln!(file, "{}", std::process::id()).map_err(|e| io("writing its lock file", e))?;
    Ok(file)
}

/// The id in `dir/__directory`, made (and written durably) when the file
/// is absent; a damaged file is refused.
fn directory_id(dir: &Path) -> Result<u64, DataDirError> {
    use strand_storage::checkpoint::{decode_directory_id, encode_directory_id, DIRECTORY_ID_FILE};
    let path = dir.join(DIRECTORY_ID_FILE);
    let io = |what, source| DataDirError::Io {
        path: dir.to_path_buf(),
        what,
        source,
    };
    match std::fs::read(&path) {
        Ok(bytes) => {
            return decode_directory_id(&bytes).map_err(|why| DataDirError::DamagedId {
                path: dir.to_path_buf(),
                why,
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("reading its id file", e)),
    }
    let id = new_directory_id();
    let tmp = dir.join(format!("{DIRECTORY_ID_FILE}.tmp"));
    let mut file = File::create(&tmp).map_err(|e| io("writing its id file", e))?;
    file.write_all(&encode_directory_id(id))
        .and_then(|()| file.sync_all())
        .map_err(|e| io("writing its id file", e))?;
    drop(file);
    std::fs::rename(&tmp, &path).map_err(|e| io("writing its id file", e))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("syncing it", e))?;
    let others = std::fs::read_dir(dir)
        .map_err(|e| io("listing it", e))?
        .filter_map(Result::ok)
        .filter(|e| e.file_name() != LOCK_FILE && e.file_name() != DIRECTORY_ID_FILE)
        .count();
    match others {
        0 => tracing::info!("data directory {} is new: its id is {id:016x}", dir.display()),
        _ => tracing::info!(
            "data directory {} had no id (it predates directory ids): its id is {id:016x}",
            dir.display()
        ),
    }
    Ok(id)
}

/// A random directory id, never 0.
fn new_directory_id() -> u64 {
    rand::random::<u64>().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_open_is_refused_naming_the_owner() {
        let tmp = tempfile::tempdir().unwrap();
        let first = DataDir::open(&tmp.path().join("d")).unwrap();
        assert!(first.path().is_absolute());
        // flock locks belong to the open file: a second open in the same
        // process conflicts as another process's would.
        let err = DataDir::open(&tmp.path().join("d")).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, DataDirError::InUse { .. }), "{text}");
        assert!(
            text.contains(&format!("in use by process {}", std::process::id())),
            "{text}"
        );
        drop(first);
        DataDir::open(&tmp.path().join("d")).expect("free again once the holder is gone");
    }

    #[test]
    fn relative_paths_resolve_and_files_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let err = DataDir::open(&file).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("data directory {} is not a directory", file.display())
        );
        let err = DataDir::open(&file.join("below")).unwrap_err();
        assert!(matches!(err, DataDirError::NotADirectory(_)), "{err}");
        let nested = tmp.path().join("a/b/../c");
        let dir = DataDir::open(&nested).unwrap();
        assert_eq!(dir.path(), std::fs::canonicalize(tmp.path()).unwrap().join("a/c"));
    }

    #[test]
    fn the_directory_id_is_made_once_kept_across_opens_and_a_damaged_one_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("d");
        let first = DataDir::open(&path).unwrap();
        let id = first.id();
        assert_ne!(id, 0);
        drop(first);
        assert_eq!(DataDir::open(&path).unwrap().id(), id, "kept");
        // Wiped (a new disk): another id.
        std::fs::remove_dir_all(&path).unwrap();
        let wiped = DataDir::open(&path).unwrap();
        assert_ne!(wiped.id(), id);
        drop(wiped);
        let file = path.join(strand_storage::checkpoint::DIRECTORY_ID_FILE);
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[6] ^= 4;
        std::fs::write(&file, &bytes).unwrap();
        let err = DataDir::open(&path).unwrap_err();
        assert!(matches!(err, DataDirError::DamagedId { .. }), "{err}");
        assert!(
            err.to_string().contains("__directory is damaged (CRC mismatch)"),
            "{err}"
        );
        assert_eq!(
            std::fs::read(&file).unwrap(),
            bytes,
            "a damaged id is left for the operator"
        );
    }

    #[test]
    fn a_failed_start_removes_only_what_it_created() {
        let tmp = tempfile::tempdir().unwrap();
        let new = tmp.path().join("x/y");
        DataDir::open(&new).unwrap().discard_if_new();
        assert!(
            !new.exists() && tmp.path().join("x").is_dir(),
            "the directory goes, its parents stay"
        );
        let old = tmp.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::fs::write(old.join("keep"), b"data").unwrap();
        DataDir::open(&old).unwrap().discard_if_new();
        assert!(old.join("keep").exists());
        // A refused open removes nothing that was there.
        let held = DataDir::open(&old).unwrap();
        assert!(DataDir::open(&old).is_err());
        assert!(old.join("keep").exists() && old.join(LOCK_FILE).exists());
        drop(held);
    }
}
