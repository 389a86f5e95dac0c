//! `strand-storage`: the storage engine of a Strand broker.
//!
//! One [`Log`] per partition replica, driven by the shard (one glommio
//! executor, one core) that owns the partition. Nothing here is shared
//! between threads: every type is `!Send` by design and lives on its shard.
//!
//! Map of the crate, bottom up:
//! - [`batch`]: the record batch format (byte layout in its doc), building,
//!   validating, stamping and iterating batches. Pure functions, defined in
//!   `strand-wire` (the client uses them too) and re-exported here.
//! - [`scan`]: the sans-I/O recovery scanner: walks batches in a buffer and
//!   says where the valid log ends and why.
//! - [`index`]: the sparse offset and time indexes of a segment and their
//!   file formats.
//! - [`segment`]: segment files (naming, the active segment's direct-I/O
//!   appender, sealed segments).
//! - [`log`]: the partition log — append, read, find by time, truncate,
//!   durability (group commit), recovery on open, retention, and segment
//!   recycling (a roll writes into the file of a segment retention frees:
//!   `log::write`, "Recycling").
//! - [`producers`]: the pure idempotent-producer table (which batch is a
//!   duplicate, which is out of order); the log keeps one, snapshotted.
//! - [`retention`]: the pure retention policy (segments, now → cut offset).
//! - [`epochs`]: the pure leader-epoch history (epoch → first offset, where
//!   an epoch ends); [`checkpoint`]: its file and the high watermark's,
//!   byte layouts and atomic writes.
//! - [`journal`]: the shard journal: one write-ahead stream per shard that
//!   makes every partition's appends of a round durable with one write
//!   (format, group commit, recovery plan); [`replay`]: its replay into the
//!   logs at start-up; `log::journaled`: a log's side of it.
//! - [`shard`]: per-shard resources shared by the logs of one shard: the
//!   direct-I/O probe file, the file-descriptor cache for sealed segments and
//!   the memory budgets ([`budget`]) of the tail caches and of read-ahead.

pub mod budget;
pub mod checkpoint;
pub mod config;
pub mod epochs;
pub mod error;
pub mod fuzzing;
pub mod index;
pub mod journal;
pub mod log;
pub mod notify;
pub mod producers;
pub mod replay;
pub mod retention;
pub mod scan;
pub mod segment;
pub mod shard;
pub mod space;
mod tail_cache;
pub mod testkit;

pub use config::{FsyncPolicy, LogConfig};
pub use error::{BatchError, Result, StorageError};
pub use log::{AppendInfo, Log, LogStats, ReadBatches};
pub use shard::ShardStorage;
pub use strand_wire::{batch, varint};
pub use strand_wire::{LeaderEpoch, Offset};

/// Keeps freed large buffers in the heap for reuse instead of handing them
/// back to the kernel. Readers get a fresh ~1 MiB buffer per fetch from
/// disk, and faulting in new zeroed pages for each cost a quarter of the
/// CPU in profiles. Call once at process start (the broker and the bench
/// do), before other threads start.
pub fn tune_process_allocator() {
    // SAFETY: mallopt only changes glibc malloc tunables; called before any
    // other thread runs.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// Alignment of every direct-I/O write: file position, length and buffer.
pub const DMA_ALIGN: u64 = 4096;
