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
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    #[error("the log was closed")]
    Closed,
    #[error("log {dir} stopped after a failed write or fdatasync ({reason}); reopen it to recover")]
    LogFailed { dir: PathBuf, reason: String },
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
