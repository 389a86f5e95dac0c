//! The in-memory tail of a log: the most recent batches, so that consumers
//! reading near the end never touch the disk.
//!
//! Runs on: the shard that owns the log. Each log has its own cache; all the
//! caches of a shard share one byte budget ([`ByteBudget`]).
//!
//! Invariant: the cache holds a contiguous run of batches ending at the log
//! end, and every batch not yet written to disk is in it (eviction skips
//! unwritten batches), so a read that misses the cache can always be served
//! from the disk.

use std::collections::VecDeque;
use std::rc::Rc;

use bytes::Bytes;

use crate::batch::RecordBatch;
use crate::budget::ByteBudget;
use crate::Offset;

/// Batches smaller than this are copied into the cache rather than shared.
const COPY_BELOW: usize = 64 << 10;

#[derive(Debug)]
struct Cached {
    base: Offset,
    next: Offset,
    bytes: Bytes,
}

/// Batches read from a log: whole batches, in offset order.
#[derive(Debug, Default, Clone)]
pub struct ReadBatches {
    pub batches: Vec<Bytes>,
    /// Sum of the batches' lengths.
    pub bytes: usize,
    /// Offset after the last batch returned (the next one to ask for).
    pub next_offset: Offset,
    /// Some batches slice this shard's I/O buffers (read from the segment
    /// file without a copy: see `log::readahead`); [`ReadBatches::detach`]
    /// before they go to another thread.
    pub from_disk: bool,
}

impl ReadBatches {
    pub(crate) fn empty(at: Offset) -> ReadBatches {
        ReadBatches {
            batches: Vec::new(),
            bytes: 0,
            next_offset: at,
            from_disk: false,
        }
    }

    /// Makes the batches safe to drop on any thread: those read from disk
    /// are copied out of the shard's I/O buffers (a buffer dropped on
    /// another thread would be leaked, not freed).
    pub fn detach(&mut self) {
        if !std::mem::take(&mut self.from_disk) {
            return;
        }
        // One allocation for them all, pinning nothing they sliced.
        let mut all = bytes::BytesMut::with_capacity(self.batches.iter().map(Bytes::len).sum());
        for b in &self.batches {
            all.extend_from_slice(b);
        }
        let mut all = all.freeze();
        for b in &mut self.batches {
            *b = all.split_to(b.len());
        }
    }

    /// Adds a batch; says whether more may be added within `max_bytes`
    /// (the first batch is always taken, so a reader always makes progress).
    pub(crate) fn take(&mut self, bytes: Bytes, next: Offset, max_bytes: usize) -> bool {
        self.bytes += bytes.len();
        self.batches.push(bytes);
        self.next_offset = next;
        self.bytes < max_bytes
    }

    /// Whether another batch of `len` bytes would still fit.
    pub(crate) fn fits(&self, len: usize, max_bytes: usize) -> bool {
        self.batches.is_empty() || self.bytes + len <= max_bytes
    }
}

#[derive(Debug)]
pub(crate) struct TailCache {
    batches: VecDeque<Cached>,
    bytes: usize,
    max_bytes: usize,
    budget: Rc<ByteBudget>,
}

impl TailCache {
    pub fn new(max_bytes: usize, budget: Rc<ByteBudget>) -> TailCache {
        TailCache {
            batches: VecDeque::new(),
            bytes: 0,
            max_bytes,
            budget,
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Adds the newest batch, then evicts old written batches while over
    /// this log's limit or the shard's budget.
    pub fn push(&mut self, batch: &RecordBatch, written: Offset) {
        if let Some(last) = self.batches.back() {
            assert_eq!(last.next, batch.base_offset(), "the cache holds a contiguous tail");
        }
        self.bytes += batch.len();
        self.budget.add(batch.len());
        // A small batch may be a slice of a much larger receive buffer;
        // holding the slice would pin all of it, so small ones are copied.
        let bytes = if batch.len() < COPY_BELOW {
            Bytes::copy_from_slice(batch.bytes())
        } else {
            batch.bytes().clone()
        };
        self.batches.push_back(Cached {
            base: batch.base_offset(),
            next: batch.next_offset(),
            bytes,
        });
        self.evict(written);
    }

    /// Evicts written batches from the front while over a limit.
    pub fn evict(&mut self, written: Offset) {
        while (self.bytes > self.max_bytes || self.budget.over())
            && self.batches.front().is_some_and(|f| f.next <= written)
        {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some(f) = self.batches.pop_front() {
            self.bytes -= f.bytes.len();
            self.budget.sub(f.bytes.len());
        }
    }

    /// Serves `[from, upto)` if the cache holds `from`; whole batches up to
    /// about `max_bytes`.
    pub fn read(&self, from: Offset, max_bytes: usize, upto: Offset) -> Option<ReadBatches> {
        let first = self.batches.front()?;
        if from < first.base {
            return None;
        }
        let start = self.batches.partition_point(|b| b.next <= from);
        let mut out = ReadBatches::empty(from);
        for b in self.batches.range(start..) {
            if b.next > upto || !out.fits(b.bytes.len(), max_bytes) || !out.take(b.bytes.clone(), b.next, max_bytes) {
                break;
            }
        }
        Some(out)
    }

    /// Drops every batch that holds an offset at or after `offset`.
    pub fn truncate(&mut self, offset: Offset) {
        while self.batches.back().is_some_and(|b| b.next > offset) {
            if let Some(b) = self.batches.pop_back() {
                self.bytes -= b.bytes.len();
                self.budget.sub(b.bytes.len());
            }
        }
    }

    /// Empties the cache (log closed or deleted).
    pub fn clear(&mut self) {
        while !self.batches.is_empty() {
            self.pop_front();
        }
    }
}

impl Drop for TailCache {
    fn drop(&mut self) {
        self.clear();
    }
}
