//! The one error type of `strand-storage`.
//!
//! Operating errors (I/O failures, bad input from a producer, damaged files)
//! are returned as [`StorageError`]; programmer errors (a broken invariant)
//! panic through `assert!`.

use std::path::PathBuf;

use crate::Offset;

pub use strand_wire::batch::BatchError;

/// Every error `strand-storage` returns.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid record batch: {0}")]
    InvalidBatch(#[from] BatchError),
    #[error("offset {requested} is out of range [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        requested: Offset,
        log_start: Offset,
        log_end: Offset,
    },
    #[error("corrupt sealed segment {path} at byte {position}: {reason}")]
    CorruptSegment {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    /// The shard journal cannot be replayed without losing acknowledged
    /// records (a needed frame is missing or damaged).
    #[error("journal {dir}: {reason}")]
    CorruptJournal { dir: PathBuf, reason: String },
    /// A frame write of the shard journal failed: the journal, and every
    /// log of the shard that journals, takes no more writes. What it had
    /// made durable comes back with the start-up replay.
    #[error(
        "the shard journal {dir} takes no more writes after a failed write ({reason}); its partitions take none \
         either until the broker restarts, which replays what was acknowledged"
    )]
    JournalFailed {
        dir: PathBuf,
        reason: String,
        no_space: bool,
    },
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    #[error("the log was closed")]
    Closed,
    /// A write, fdatasync or roll failed: the log takes no more writes
    /// (its memory may hold what the disk does not); reads go on below
    /// what was written before. Opening it again (a broker restart, or the
    /// broker's own reopening after a full disk) recovers what the disk
    /// holds.
    #[error(
        "log {dir} takes no more writes after a failed write or fdatasync ({reason}); reads go on; after a full \
         disk the broker reopens it by itself once there is space again, after any other failure restart the \
         broker once the cause is fixed"
    )]
    LogFailed {
        dir: PathBuf,
        reason: String,
        /// The cause was a full disk (ENOSPC).
        no_space: bool,
    },
    /// A replicated batch that does not start where this log ends.
    #[error("a replicated batch starts at offset {batch_base}, but this log ends at {log_end}")]
    NotAtLogEnd { log_end: Offset, batch_base: Offset },
    #[error(transparent)]
    StaleEpoch(#[from] crate::epochs::StaleEpoch),
}

impl StorageError {
    /// Wraps an I/O failure with the operation and the file it was on.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StorageError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Converts a glommio error, keeping the operation and file for the message.
    /// Whether the disk was full (ENOSPC), here or when the log failed.
    pub fn is_no_space(&self) -> bool {
        match self {
            StorageError::Io { source, .. } => source.raw_os_error() == Some(libc::ENOSPC),
            StorageError::LogFailed { no_space, .. } | StorageError::JournalFailed { no_space, .. } => *no_space,
            _ => false,
        }
    }

    pub fn glommio<T>(op: &'static str, path: impl Into<PathBuf>, err: glommio::GlommioError<T>) -> Self {
        let source = match err {
            glommio::GlommioError::IoError(e) => e,
            glommio::GlommioError::EnhancedIoError { source, .. } => source,
            other => std::io::Error::other(other.to_string()),
        };
        Self::io(op, path, source)
    }
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;
