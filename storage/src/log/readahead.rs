//! Read-ahead for readers that go through a segment from disk, handing out
//! the bytes read without copying them.
//!
//! Disk reads go through *blocks* of about [`BLOCK`] bytes that start at
//! the 4 KiB page holding a batch start. A read takes the block that covers
//! what it needs (from this log's small block cache, else reads it now) and
//! returns a slice of it: the `Bytes` every returned batch slices share the
//! block's DMA buffer, so a fetch from disk is sent to the socket from the
//! memory the disk wrote into (no copy on the way). A block may end inside
//! a batch; the next block starts at the page of the first batch the block
//! does not hold whole, so every batch lies entirely in one block (a batch
//! cut by a block end is read again with the next block: the cost is at
//! most one batch per block of extra disk reads, nothing in memory).
//!
//! A block read ahead ends where a batch starts, when the segment's index
//! (an entry every ~32 KiB of batches) knows one within [`BLOCK`] bytes:
//! so it holds whole batches, and next to nothing is read twice.
//!
//! A read that starts within the previous one's range is *sequential* (a
//! consumer catching up, a follower): it reads whole blocks, and the
//! [`AHEAD`] (3) blocks after the one it uses are read in the background —
//! the first found by walking the batch lengths from the batch it is at,
//! once per block, each next one from the index's batch start near the end
//! of the one before — so it finds its next bytes in flight or in memory
//! and the disk never idles while the shard sends or the reader works.
//! Measured on the dev box with a 2 GiB catch-up (`strand-bench consume
//! --count 2097152`, builds alternating, a fresh broker and backlog each
//! run): one ahead median 1293 MiB/s and two ahead 1518 (six rounds); then
//! two ahead 1170 and three ahead 1746 (eight rounds, a slower hour); four
//! ahead was not clearly better than three (four noisy rounds) and holds
//! a block more per reading log. Blocks were 2 MiB then, and larger ones
//! looked slower — but that was the shard's registered I/O memory running
//! out (the broker's `io_memory_bytes`). With enough of it, a 4.7 GiB
//! catch-up of 1 MiB batches (`consume --count 5000000`, a fresh broker
//! and backlog per run, builds alternating): 2 MiB blocks 1773–2186 MiB/s
//! (six runs, median 2113), 4 MiB 2550–2836 (six, median 2709); in
//! earlier rounds 8 MiB 2710–2834 (three runs, for twice the memory) and
//! 4 MiB two ahead 2101–2589. With 1 MiB batches a 2 MiB block, which ends
//! at a batch start, held a single batch. Any other read (a seek, a redelivered
//! record) reads only what it needs. Reads of fewer than [`COPY_BELOW`]
//! bytes are copied out of their block, so a small fetch does not pin a
//! whole block. The cache drops its least recently used read block first.
//!
//! A block's bytes below the readable end of the file when it was read
//! never change (appends only add bytes after it; truncation clears the
//! cache), so a block is used for those bytes only, and a reader that needs
//! bytes past them reads a fresh block.
//!
//! Memory: at most [`CAPACITY`] blocks per log (≤ 20 MiB), freed when no
//! read used them for a while ([`Log::release_idle_readahead`]); a block
//! handed out lives on until the last batch slicing it is dropped. All the
//! logs of a shard share one budget for the blocks they hold
//! (`ShardStorageConfig::readahead_budget_bytes`, 64 MiB by default): a
//! block is read ahead, or kept once read, only if it fits. A reader whose
//! next block does not fit first gives up this log's blocks wholly behind
//! it, read or in flight, but the most recently used of those (a second
//! reader of the log, further back, keeps the block it is using); if it
//! still does not fit, it reads ahead no further, and a read that finds
//! nothing cached reads only what it needs, uncached. So with many
//! partitions read from disk at once, the shard holds a bounded amount of
//! memory and each reader still progresses (more slowly: one read per
//! fetch, no overlap).
//!
//! # Handing a shard's buffer out as `Bytes`
//! glommio's read buffers belong to the shard that read them (reference
//! counted with `Rc`, returned to that executor's pool), while `Bytes` may
//! travel to another thread. [`ShardBlock`] keeps that sound: its bytes
//! may be read from anywhere (nothing but the buffer, which it keeps alive,
//! is touched), and it is released only on the thread that made it; if the
//! last clone is dropped on another thread the block is leaked instead (and
//! counted in [`foreign_drops`]). The broker copies fetched batches that
//! go to another shard ([`crate::log::ReadBatches::detach`]), so that never
//! happens there.

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use glommio::io::{DmaFile, ReadResult};

use super::Log;
use crate::batch::batch_length;
use crate::budget::{ByteBudget, Reservation};
use crate::error::{Result, StorageError};
use crate::index::SegmentIndex;
use crate::segment::io::{align_down, align_up};
use crate::Offset;

/// Bytes per read-ahead block (more when one read needs more).
pub(super) const BLOCK: u64 = 4 << 20;
/// Blocks a sequential reader has read ahead of the one it uses.
const AHEAD: usize = 3;
/// Blocks kept per log (in flight or read): the one in use, those read
/// ahead, and one for a second reader or a straggler.
const CAPACITY: usize = AHEAD + 2;
/// Reads of fewer bytes than this are copied out of their block rather
/// than pinning all of it (a small fetch, a redelivered batch).
const COPY_BELOW: usize = (BLOCK / 8) as usize;

type BlockRead = glommio::Task<std::result::Result<ReadResult, String>>;

enum BlockState {
    InFlight(BlockRead),
    Ready(Rc<ReadResult>),
}

struct Block {
    /// The segment's base offset (its name, and unique in the log: the
    /// cache is cleared before a truncation could make one again).
    segment: u64,
    /// File position of the block's first byte (4 KiB aligned).
    start: u64,
    /// Bytes from `start` that held written data when it was read (the
    /// readable end then): the only bytes of it ever used.
    valid: u64,
    /// When it was last put or taken (the cache's use counter).
    used: u64,
    state: BlockState,
    /// Its bytes in the shard's read-ahead budget.
    held: Reservation,
}

impl Block {
    fn covers(&self, segment: u64, from: u64, to: u64) -> bool {
        self.segment == segment && self.start <= from && to <= self.start + self.valid
    }

    /// Whether it lies wholly before `pos` of `segment` (segments are
    /// named by base offset, so an earlier segment's blocks are behind).
    fn behind(&self, segment: u64, pos: u64) -> bool {
        self.segment < segment || (self.segment == segment && self.start + self.valid <= pos)
    }
}

/// The segment a read goes to: its file, path (for errors), base offset
/// and index (`None`: the active segment's, looked up when needed).
#[derive(Clone, Copy)]
pub(super) struct SegmentFile<'a> {
    pub file: &'a Rc<DmaFile>,
    pub path: &'a Path,
    pub base: Offset,
    pub index: Option<&'a SegmentIndex>,
}

/// The block cache of one log.
pub(super) struct ReadAhead {
    blocks: VecDeque<Block>,
    /// The shard's read-ahead budget, shared by every log's cache.
    budget: Rc<ByteBudget>,
    /// Bumped by `clear`: a block read before a clear is not put back.
    generation: u64,
    /// Monotonic ms of the last read through this cache.
    last_used_ms: u64,
    /// Counts puts and takes, to find the least recently used block.
    uses: u64,
    /// The last read: segment, first and last position. A read that
    /// starts within it is sequential (a reader going through the file) and
    /// reads ahead; any other reads only what it needs.
    last_read: Option<(u64, u64, u64)>,
    /// The last walk of a block's batches: segment, block start, and where
    /// the bytes of it walked, and where the first batch it does not hold
    /// whole starts (walked once per block).
    walked: Option<(u64, u64, u64, u64)>,
}

impl ReadAhead {
    pub(super) fn new(budget: Rc<ByteBudget>) -> ReadAhead {
        ReadAhead {
            blocks: VecDeque::new(),
            budget,
            generation: 0,
            last_used_ms: 0,
            uses: 0,
            last_read: None,
            walked: None,
        }
    }

    /// `bytes` of the shard's budget for a block a reader at `pos` of
    /// `segment` wants; if they do not fit, this log's blocks that lie
    /// wholly behind `pos` (read or in flight) are given up first — this
    /// reader will not go back to them — except the most recently used of
    /// them, which may be a second reader's, further back in the log.
    /// `None`: the block is not to be kept.
    fn reserve(&mut self, bytes: usize, segment: u64, pos: u64) -> Option<Reservation> {
        if !self.budget.fits(bytes) {
            let spared = self
                .blocks
                .iter()
                .filter(|b| b.behind(segment, pos))
                .map(|b| b.used)
                .max();
            self.blocks
                .retain(|b| !b.behind(segment, pos) || Some(b.used) == spared);
        }
        self.budget.try_reserve(bytes)
    }

    fn take(&mut self, segment: u64, from: u64, to: u64) -> Option<Block> {
        let at = self.blocks.iter().position(|b| b.covers(segment, from, to))?;
        self.blocks.remove(at)
    }

    fn holds_start(&self, segment: u64, start: u64) -> bool {
        self.blocks.iter().any(|b| b.segment == segment && b.start == start)
    }

    /// Keeps a block (in place of one with the same start), making room by
    /// dropping the least recently used read block, or if every block is
    /// in flight the least recently used of those.
    fn put(&mut self, mut block: Block) {
        self.blocks
            .retain(|b| !(b.segment == block.segment && b.start == block.start));
        while self.blocks.len() >= CAPACITY {
            let victim = self
                .blocks
                .iter()
                .enumerate()
                .min_by_key(|(_, b)| (matches!(b.state, BlockState::InFlight(_)), b.used))
                .map(|(at, _)| at);
            match victim {
                Some(at) => drop(self.blocks.remove(at)),
                None => break,
            }
        }
        self.uses += 1;
        block.used = self.uses;
        self.blocks.push_back(block);
    }

    /// Whether a read from `pos` of `segment` continues the last one, and
    /// records it as the last.
    fn note_read(&mut self, segment: u64, pos: u64, stop: u64) -> bool {
        let sequential = self
            .last_read
            .is_some_and(|(s, from, to)| s == segment && from <= pos && pos <= to);
        self.last_read = Some((segment, pos, stop));
        sequential
    }

    /// Forgets every block (the files may change: truncation).
    pub(super) fn clear(&mut self) {
        self.blocks.clear();
        self.walked = None;
        self.generation += 1;
    }
}

impl Log {
    /// Frees the read-ahead blocks if nothing read through them for
    /// `idle_ms` (the shard calls this periodically, so a reader that went
    /// away does not keep up to [`CAPACITY`] blocks per log).
    pub fn release_idle_readahead(&self, idle_ms: u64) {
        let mut st = self.inner.state.borrow_mut();
        if super::mono_ms().saturating_sub(st.readahead.last_used_ms) >= idle_ms {
            st.readahead.clear();
        }
    }

    /// Bytes from `pos` (a batch start) of the file: up to `len` of them,
    /// and at least `need` (fewer only where the readable end `end` comes
    /// first), clamped to `end`. A slice of a read block, not a copy,
    /// unless it is small ([`COPY_BELOW`]); the flag says which (a slice
    /// must not be dropped on another thread: see the module doc). A
    /// sequential reader then has the block after it read ahead.
    pub(super) async fn read_window(
        &self,
        seg: SegmentFile<'_>,
        pos: u64,
        len: usize,
        need: usize,
        end: u64,
    ) -> Result<(Bytes, bool)> {
        let stop = (pos + len as u64).min(end);
        let must = (pos + need.min(len) as u64).min(end);
        if stop <= pos {
            return Ok((Bytes::new(), false));
        }
        let (generation, sequential) = {
            let mut st = self.inner.state.borrow_mut();
            st.readahead.last_used_ms = super::mono_ms();
            (st.readahead.generation, st.readahead.note_read(seg.base.0, pos, stop))
        };
        let want = if sequential {
            (align_down(pos) + BLOCK).max(stop)
        } else {
            stop
        };
        let (start, valid, block) = self.block(seg, pos, must, stop, want, end).await?;
        let from = (pos - start) as usize;
        let to = ((stop.min(start + valid) - start) as usize).max(from);
        if sequential {
            self.read_next_ahead(seg, generation, &block[..valid as usize], start, pos, end);
        }
        if to - from < COPY_BELOW {
            return Ok((Bytes::copy_from_slice(&block[from..to]), false));
        }
        Ok((ShardBlock::bytes(block).slice(from..to), true))
    }

    /// A block holding `[pos, must)`: cached, in flight, or read now (from
    /// the page of `pos` up to `want`, clamped to the readable end, and kept
    /// in the cache; up to `stop` only, uncached, if the shard's read-ahead
    /// budget has no room for it). Returns its start, how many of its bytes
    /// hold data, and its bytes.
    async fn block(
        &self,
        seg: SegmentFile<'_>,
        pos: u64,
        must: u64,
        stop: u64,
        want: u64,
        end: u64,
    ) -> Result<(u64, u64, Rc<ReadResult>)> {
        let SegmentFile { file, path, base, .. } = seg;
        let (generation, found) = {
            let mut st = self.inner.state.borrow_mut();
            (st.readahead.generation, st.readahead.take(base.0, pos, must))
        };
        let (start, valid, block, held) = match found {
            Some(Block {
                start,
                valid,
                state: BlockState::Ready(block),
                held,
                ..
            }) => (start, valid, block, Some(held)),
            Some(Block {
                start,
                valid,
                state: BlockState::InFlight(task),
                held,
                ..
            }) => (
                start,
                valid,
                Rc::new(
                    task.await
                        .map_err(|e| StorageError::io("reading", path, std::io::Error::other(e)))?,
                ),
                Some(held),
            ),
            None => {
                let start = align_down(pos);
                let mut valid = want.min(end) - start;
                let held = self
                    .inner
                    .state
                    .borrow_mut()
                    .readahead
                    .reserve(align_up(valid) as usize, base.0, pos);
                if held.is_none() {
                    valid = stop.min(end) - start;
                }
                let block = file
                    .read_at_aligned(start, align_up(valid) as usize)
                    .await
                    .map_err(|e| StorageError::glommio("reading", path, e))?;
                (start, valid, Rc::new(block), held)
            }
        };
        let valid = valid.min(block.len() as u64);
        let mut st = self.inner.state.borrow_mut();
        if let Some(held) = held.filter(|_| st.readahead.generation == generation) {
            st.readahead.put(Block {
                segment: base.0,
                start,
                valid,
                used: 0,
                state: BlockState::Ready(block.clone()),
                held,
            });
        }
        Ok((start, valid, block))
    }

    /// Starts reading the block after `block` (the bytes holding data of a
    /// block that starts at `start`, with a batch at `pos`): from the page
    /// of the first batch it does not hold whole, unless that block is
    /// cached, there is nothing past `block` below `end`, or the cache was
    /// cleared since `generation`. It ends at the last batch start the
    /// segment's index knows within [`BLOCK`] bytes, if any.
    fn read_next_ahead(&self, seg: SegmentFile<'_>, generation: u64, block: &[u8], start: u64, pos: u64, end: u64) {
        let SegmentFile { file, base, index, .. } = seg;
        let held = block.len() as u64;
        // A walk of a shorter block with the same start (read uncached, or
        // before more was written) may stop early: walk this one again.
        let walked = match self.inner.state.borrow().readahead.walked {
            Some((segment, s, h, at)) if segment == base.0 && s == start && h == held && at >= pos => Some(at),
            _ => None,
        };
        let at = walked.unwrap_or_else(|| {
            let mut at = pos;
            while let Some(n) = block
                .get((at - start) as usize..)
                .and_then(batch_length)
                .filter(|&n| n > 0 && at + u64::from(n) <= start + held)
            {
                at += u64::from(n);
            }
            at
        });
        let mut st = self.inner.state.borrow_mut();
        st.readahead.walked = Some((base.0, start, held, at));
        if align_down(at) <= start || st.readahead.generation != generation {
            return;
        }
        // AHEAD blocks after this one: the first starts at the page of the
        // first batch this block does not hold whole, each next one where
        // the index knows a batch start near the end of the one before.
        let mut at = at;
        for _ in 0..AHEAD {
            let next = align_down(at);
            if at >= end {
                return;
            }
            let within = |index: &SegmentIndex| {
                let as_u32 = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
                index.batch_start_within(as_u32(at), as_u32(next + BLOCK))
            };
            let batch_end = match index {
                Some(index) => within(index),
                None if st.active.base == base => within(&st.active.index),
                None => None,
            };
            let stop = batch_end.map_or(next + BLOCK, u64::from);
            if !st.readahead.holds_start(base.0, next) {
                let valid = stop.min(end) - next;
                let len = align_up(valid) as usize;
                // Past the shard's budget: read no further ahead.
                let Some(held) = st.readahead.reserve(len, base.0, pos) else {
                    return;
                };
                let task = spawn_block_read(file.clone(), next, len);
                st.readahead.put(Block {
                    segment: base.0,
                    start: next,
                    valid,
                    used: 0,
                    state: BlockState::InFlight(task),
                    held,
                });
            }
            // Without a known batch start the next block's start is not
            // known before this one is read.
            match batch_end {
                Some(b) if u64::from(b) > at => at = u64::from(b),
                _ => return,
            }
        }
    }
}

fn spawn_block_read(file: Rc<DmaFile>, start: u64, len: usize) -> BlockRead {
    glommio::spawn_local(async move { file.read_at_aligned(start, len).await.map_err(|e| e.to_string()) })
}

/// Times a [`ShardBlock`] was dropped off the thread that read it (and so
/// leaked rather than freed there); 0 when batches from disk stay on their
/// shard, as the broker arranges.
pub fn foreign_drops() -> u64 {
    FOREIGN_DROPS.load(Ordering::Relaxed)
}

static FOREIGN_DROPS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's number (from [`THREADS`]), taken on first use.
    static THREAD_ID: u64 = THREADS.fetch_add(1, Ordering::Relaxed);
}

/// Numbers threads for [`ShardBlock`]: unlike a thread-local's address,
/// never reused by a later thread.
static THREADS: AtomicU64 = AtomicU64::new(1);

fn thread_mark() -> Option<u64> {
    THREAD_ID.try_with(|id| *id).ok()
}

/// A block read by this shard, as the owner of `Bytes` slicing it (see the
/// module doc: readable anywhere, freed only on its own thread).
struct ShardBlock {
    block: ManuallyDrop<Rc<ReadResult>>,
    home: Option<u64>,
}

impl ShardBlock {
    fn bytes(block: Rc<ReadResult>) -> Bytes {
        Bytes::from_owner(ShardBlock {
            block: ManuallyDrop::new(block),
            home: thread_mark(),
        })
    }
}

// SAFETY: the only thing another thread does with a `ShardBlock` is read
// the buffer's bytes (`as_ref`), which the `Rc` it holds keeps allocated
// and which nothing writes after the read completed; the `Rc`'s counts are
// touched only by `drop`, and only on the thread that made it (elsewhere
// the block is leaked).
unsafe impl Send for ShardBlock {}

impl AsRef<[u8]> for ShardBlock {
    fn as_ref(&self) -> &[u8] {
        &self.block
    }
}

impl Drop for ShardBlock {
    fn drop(&mut self) {
        if self.home.is_some() && thread_mark() == self.home {
            // SAFETY: dropped once, here, on the thread that owns the `Rc`.
            unsafe { ManuallyDrop::drop(&mut self.block) };
        } else {
            FOREIGN_DROPS.fetch_add(1, Ordering::Relaxed);
        }
    }
}
