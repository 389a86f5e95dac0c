//! Why a record batch was rejected.

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
