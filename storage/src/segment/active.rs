//! The active segment: the one segment of a log that grows, and its
//! direct-I/O write path.
//!
//! Runs on: the shard that owns the log.
//!
//! # How bytes reach the disk
//! Each appended batch is copied — once, at append time, while the previous
//! write is still in flight — into a *staging* DMA buffer that starts with
//! the in-memory copy of the last partial block handed to the disk. A write
//! ([`ActiveSegment::take_write`]) takes the staging buffer as it is, pads
//! it with zeros to a 4096-byte boundary and writes it at the aligned
//! position of that block: O_DIRECT needs aligned offsets, lengths and
//! buffers, so the partial block is rewritten each time with the same
//! leading bytes (a torn rewrite cannot damage them). The staging buffer
//! starts at 64 KiB and doubles as needed; an idle segment holds none.
//!
//! # Pre-zeroing
//! fdatasync after overwriting allocated blocks costs ≈ 54 µs here; after
//! extending the file ≈ 120 µs plus a journal commit. So when writes are
//! small (group commits of a few KiB), the appender also writes a chunk of
//! zeros (`zero_ahead_bytes`, default 1 MiB) ahead of the data once the
//! zeroed space runs low — in the background, off the commit path (a data
//! write into that range first waits for it) — and later fdatasyncs only
//! overwrite. Large writes
//! (≥ a quarter of the chunk) skip it: there, zeroing would double the bytes
//! written, while one extent allocation per MiB costs little. Recovery reads
//! the zeros as the end of the log. A segment written into a recycled file
//! (`log::write`, "Recycling") counts the file's old length as allocated
//! (`Recovered::file_len`) and zeroes nothing before it.

use std::path::PathBuf;
use std::rc::Rc;

use glommio::io::{DmaBuffer, DmaFile, OpenOptions};

use super::io::{align_down, align_up};
use super::SealedSegment;
use crate::batch::RecordBatch;
use crate::config::LogConfig;
use crate::index::SegmentIndex;
use crate::Offset;

/// How every open of an active segment's file for writing opens it (a new
/// one, a recycled one, the one found at start-up): read-write, and
/// `O_DSYNC` when the log writes through (`LogConfig::write_through`).
pub(crate) fn open_options(config: &LogConfig) -> OpenOptions {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .write(true)
        .custom_flags(if config.writes_through() { libc::O_DSYNC } else { 0 });
    options
}

/// Smallest staging buffer: a few small batches fit before it must grow.
const STAGING_MIN: u64 = 64 << 10;

/// The segment being appended to.
#[derive(Debug)]
pub struct ActiveSegment {
    pub(crate) path: PathBuf,
    pub(crate) base: Offset,
    pub(crate) file: Rc<DmaFile>,
    next_offset: Offset,
    /// Logical bytes, pending ones included.
    size: u64,
    /// Logical bytes handed to the disk (their writes completed).
    written_end: u64,
    /// Offset after the last batch handed to the disk.
    written_offset: Offset,
    /// Logical bytes taken into writes (completed or in flight).
    taken_end: u64,
    /// Bytes `[align_down(taken_end), taken_end)`: the partial last block,
    /// which the next write starts with.
    tail_block: Vec<u8>,
    /// The next write, filled as batches are appended: the partial last
    /// block, then the pending batches. `None` while nothing is pending.
    staging: Option<DmaBuffer>,
    pending_bytes: usize,
    pub(crate) index: SegmentIndex,
    /// Index entries already in the `.index` / `.timeindex` files.
    pub(crate) index_persisted: (usize, usize),
    /// File bytes already allocated (written with data or zeros).
    zeroed_until: u64,
    /// Monotonic ms of the first batch appended since the segment was
    /// created or opened; drives rolling by age.
    first_append_ms: Option<u64>,
}

/// What a recovery scan found in an existing active segment.
#[derive(Debug)]
pub struct Recovered {
    pub next_offset: Offset,
    pub size: u64,
    pub tail_block: Vec<u8>,
    pub index: SegmentIndex,
    pub file_len: u64,
}

/// One write prepared by [`ActiveSegment::take_write`]: do the I/O, then
/// hand `done` back to [`ActiveSegment::finish_write`].
pub(crate) struct WriteJob {
    pub buf: DmaBuffer,
    pub pos: u64,
    /// Zeros to write ahead of the data (buffer, position).
    pub zeros: Option<(DmaBuffer, u64)>,
    pub done: WriteDone,
}

/// The state a completed write moves the segment to.
#[derive(Debug)]
pub(crate) struct WriteDone {
    pub written_end: u64,
    pub written_offset: Offset,
    pub bytes: u64,
}

impl ActiveSegment {
    /// An active segment over `file`, in the state recovery found.
    pub(crate) fn new(path: PathBuf, base: Offset, file: Rc<DmaFile>, r: Recovered) -> ActiveSegment {
        assert_eq!(r.tail_block.len() as u64, r.size - align_down(r.size));
        ActiveSegment {
            path,
            base,
            file,
            next_offset: r.next_offset,
            size: r.size,
            written_end: r.size,
            written_offset: r.next_offset,
            taken_end: r.size,
            tail_block: r.tail_block,
            staging: None,
            pending_bytes: 0,
            index: r.index,
            index_persisted: (0, 0),
            zeroed_until: align_up(r.file_len.max(r.size)),
            first_append_ms: None,
        }
    }

    pub fn next_offset(&self) -> Offset {
        self.next_offset
    }
    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn written_end(&self) -> u64 {
        self.written_end
    }
    pub fn written_offset(&self) -> Offset {
        self.written_offset
    }
    pub fn pending_bytes(&self) -> usize {
        self.pending_bytes
    }
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Whether `len` more bytes must go to a new segment (size or age).
    pub fn needs_roll(&self, len: usize, now_ms: u64, config: &LogConfig) -> bool {
        !self.is_empty()
            && (self.size + len as u64 > config.segment_bytes_max
                || self.next_offset.0 - self.base.0 + len as u64 > u64::from(u32::MAX)
                || self
                    .first_append_ms
                    .is_some_and(|t| now_ms.saturating_sub(t) >= config.segment_age_ms_max))
    }

    /// Records a stamped batch as appended: it is copied into the staging
    /// buffer of the next write (while an earlier write may be in flight, so
    /// the copy is off the disk's critical path).
    pub fn push(&mut self, batch: &RecordBatch, index_interval: u32, now_ms: u64) {
        assert_eq!(
            batch.base_offset(),
            self.next_offset,
            "batches must be appended in offset order"
        );
        let relative = u32::try_from(batch.base_offset().0 - self.base.0).expect("segment spans < 2^32 offsets");
        let position = u32::try_from(self.size).expect("segment is < 4 GiB");
        self.index.on_batch(
            relative,
            position,
            batch.len() as u32,
            batch.max_timestamp(),
            index_interval,
        );
        self.first_append_ms.get_or_insert(now_ms);
        let staged = self.tail_block.len() + self.pending_bytes;
        let needed = staged + batch.len();
        let staging = match self.staging.take() {
            Some(buf) if buf.len() >= needed => buf,
            old => {
                // Grow by doubling (or start): copy what is staged so far.
                let capacity = align_up((needed as u64).max(STAGING_MIN).next_power_of_two()) as usize;
                let mut buf = self.file.alloc_dma_buffer(capacity);
                match old {
                    Some(old) => buf.as_bytes_mut()[..staged].copy_from_slice(&old.as_bytes()[..staged]),
                    None => buf.as_bytes_mut()[..staged].copy_from_slice(&self.tail_block),
                }
                buf
            }
        };
        let mut staging = staging;
        staging.as_bytes_mut()[staged..needed].copy_from_slice(batch.bytes());
        self.staging = Some(staging);
        self.size += batch.len() as u64;
        self.next_offset = batch.next_offset();
        self.pending_bytes += batch.len();
    }

    /// Prepares one aligned write of everything pending, or `None` if nothing
    /// is pending. The staging buffer becomes the write; appends made while
    /// it is in flight start the next one.
    pub(crate) fn take_write(&mut self, config: &LogConfig) -> Option<WriteJob> {
        let mut buf = self.staging.take()?;
        let start = align_down(self.taken_end);
        assert_eq!((self.taken_end - start) as usize, self.tail_block.len());
        let total = self.tail_block.len() + self.pending_bytes;
        let aligned = align_up(total as u64) as usize;
        buf.trim_to_size(aligned);
        buf.as_bytes_mut()[total..].fill(0);
        let new_end = self.taken_end + self.pending_bytes as u64;
        let tail_start = (align_down(new_end) - start) as usize;
        self.tail_block.clear();
        self.tail_block.extend_from_slice(&buf.as_bytes()[tail_start..total]);
        self.taken_end = new_end;
        let bytes = self.pending_bytes as u64;
        self.pending_bytes = 0;

        let data_end = start + aligned as u64;
        let zero_chunk = config.zero_ahead_bytes;
        let mut zeros = None;
        self.zeroed_until = self.zeroed_until.max(data_end);
        // Never zero past the segment's largest size.
        let zero_len = zero_chunk.min(align_up(config.segment_bytes_max).saturating_sub(self.zeroed_until));
        if zero_len > 0 && bytes < zero_chunk / 4 && self.zeroed_until < data_end + zero_chunk / 2 {
            let mut z = self.file.alloc_dma_buffer(zero_len as usize);
            z.as_bytes_mut().fill(0);
            zeros = Some((z, self.zeroed_until));
            self.zeroed_until += zero_len;
        }
        Some(WriteJob {
            buf,
            pos: start,
            zeros,
            done: WriteDone {
                written_end: new_end,
                written_offset: self.next_offset,
                bytes,
            },
        })
    }

    /// Applies a completed write.
    pub(crate) fn finish_write(&mut self, done: WriteDone) {
        assert!(done.written_end > self.written_end, "writes complete in order");
        assert!(done.written_end <= self.taken_end);
        self.written_end = done.written_end;
        self.written_offset = done.written_offset;
    }

    /// Turns the segment into a sealed one. Everything must be written (and
    /// the file truncated to `size` by the caller).
    pub fn seal(self) -> (SealedSegment, Rc<DmaFile>, SegmentIndex) {
        assert!(
            self.staging.is_none() && self.written_end == self.size,
            "seal after the last write"
        );
        let meta = SealedSegment {
            path: self.path,
            base: self.base,
            next_offset: self.next_offset,
            size: self.size,
            max_timestamp: self.index.max_timestamp(),
        };
        (meta, self.file, self.index)
    }

    /// Bytes of heap this segment holds beyond its struct (for memory
    /// accounting in tests and docs).
    pub fn heap_bytes(&self) -> usize {
        self.tail_block.capacity()
            + self.staging.as_ref().map_or(0, |b| b.len())
            + self.index.offset_entries() * 8
            + self.index.time_entries() * 16
    }
}
