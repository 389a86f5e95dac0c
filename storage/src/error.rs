//! The one error type of `strand-storage`.
//!
//! Operating errors (I/O failures, bad input from a producer, damaged files)
//! are returned as [`StorageError`]; programmer errors (a broken invariant)
//! panic through `assert!`.

use std::path::PathBuf;

use crate::Offset;

/// Why a record batch was rejected. Each variant names the first check that
/// failed, so a producer (or an operator reading a log line) knows what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("batch is {len} bytes, shorter than the {min}-byte header")]
    TooShort { len: usize, min: usize },
    #[error("batch length field says {field} bytes but {actual} bytes were given")]
    LengthMismatch { field: u32, actual: usize },
    #[error("batch is {len} bytes, over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("unsupported batch magic {0} (this broker speaks magic 1)")]
    BadMagic(u8),
    #[error("reserved header byte is {0}, must be 0")]
    BadReserved(u8),
    #[error("CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("batch declares {0} records; a batch holds at least one")]
    Empty(u32),
    #[error("record {index} is malformed: {reason}")]
    BadRecord { index: u32, reason: &'static str },
    #[error("batch declares {declared} records but holds {found}")]
    RecordCount { declared: u32, found: u32 },
    #[error("offset deltas must be 0, 1, 2 …; record {index} has delta {delta}")]
    OffsetDelta { index: u32, delta: u32 },
    #[error("last offset delta is {declared} in the header but {found} in the records")]
    LastOffsetDelta { declared: u32, found: u32 },
    #[error("max timestamp is {declared} in the header but {found} in the records")]
    MaxTimestamp { declared: i64, found: i64 },
    #[error("{0} trailing bytes after the last record")]
    TrailingBytes(usize),
}

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
