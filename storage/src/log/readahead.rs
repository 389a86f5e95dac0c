//! Read-ahead for readers that go through a segment from disk.
//!
//! Disk reads go through fixed 1 MiB blocks aligned in the file. A read
//! takes the blocks it spans (from this log's small block cache when they
//! are there, else reads them now) and copies the wanted bytes out once;
//! then it starts reading the next [`DEPTH`] blocks in the background. A
//! sequential reader (a consumer catching up, a follower) so always finds
//! its next bytes in flight or in memory, and the disk never idles while
//! the shard copies or the reader works.
//!
//! Only blocks entirely below the readable end of the file are cached:
//! their bytes never change (truncation clears the cache). The block that
//! holds the end of the active segment is read afresh each time.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use glommio::io::{DmaFile, ReadResult};

use super::Log;
use crate::error::{Result, StorageError};
use crate::segment::io::align_up;

/// Bytes per read-ahead block.
pub(super) const BLOCK: u64 = 1 << 20;
/// Blocks read ahead of the last one a reader touched.
const DEPTH: u64 = 2;
/// Blocks kept per log (in flight or read).
const CAPACITY: usize = 4;

type BlockRead = glommio::Task<std::result::Result<ReadResult, String>>;

enum BlockState {
    InFlight(BlockRead),
    Ready(Rc<ReadResult>),
}

struct Block {
    path: PathBuf,
    index: u64,
    state: BlockState,
}

/// The block cache of one log.
#[derive(Default)]
pub(super) struct ReadAhead {
    blocks: VecDeque<Block>,
    /// Bumped by `clear`: a block read before a clear is not put back.
    generation: u64,
    /// Monotonic ms of the last read through this cache.
    last_used_ms: u64,
}

impl ReadAhead {
    fn take(&mut self, path: &Path, index: u64) -> Option<BlockState> {
        let at = self.blocks.iter().position(|b| b.index == index && b.path == path)?;
        self.blocks.remove(at).map(|b| b.state)
    }

    fn contains(&self, path: &Path, index: u64) -> bool {
        self.blocks.iter().any(|b| b.index == index && b.path == path)
    }

    fn put(&mut self, path: &Path, index: u64, state: BlockState) {
        while self.blocks.len() >= CAPACITY {
            self.blocks.pop_front();
        }
        self.blocks.push_back(Block {
            path: path.to_path_buf(),
            index,
            state,
        });
    }

    /// Forgets every block (the files may change: truncation).
    pub(super) fn clear(&mut self) {
        self.blocks.clear();
        self.generation += 1;
    }
}

impl Log {
    /// Frees the read-ahead blocks if nothing read through them for
    /// `idle_ms` (the shard calls this periodically, so a reader that went
    /// away does not keep up to 4 MiB per log).
    pub fn release_idle_readahead(&self, idle_ms: u64) {
        let mut st = self.inner.state.borrow_mut();
        if super::mono_ms().saturating_sub(st.readahead.last_used_ms) >= idle_ms {
            st.readahead.clear();
        }
    }

    /// Bytes `[pos, pos + len)` of the file, clamped to `end` (the readable
    /// end), copied once into shared bytes; then reads ahead.
    pub(super) async fn read_window(
        &self,
        file: &Rc<DmaFile>,
        path: &Path,
        pos: u64,
        len: usize,
        end: u64,
    ) -> Result<Bytes> {
        self.inner.state.borrow_mut().readahead.last_used_ms = super::mono_ms();
        let stop = (pos + len as u64).min(end);
        let mut out = BytesMut::with_capacity(stop.saturating_sub(pos) as usize);
        let mut last = pos / BLOCK;
        for index in pos / BLOCK..=stop.saturating_sub(1) / BLOCK {
            let block = self.block(file, path, index, end).await?;
            let start = index * BLOCK;
            let from = (pos.max(start) - start) as usize;
            let to = ((stop - start) as usize).min(block.len());
            if from >= to {
                break;
            }
            out.extend_from_slice(&block[from..to]);
            last = index;
        }
        for index in last + 1..=last + DEPTH {
            if (index + 1) * BLOCK > end {
                break;
            }
            let cached = self.inner.state.borrow().readahead.contains(path, index);
            if !cached {
                let task = spawn_block_read(file.clone(), index);
                self.inner
                    .state
                    .borrow_mut()
                    .readahead
                    .put(path, index, BlockState::InFlight(task));
            }
        }
        Ok(out.freeze())
    }

    /// One block, from the cache or read now.
    async fn block(&self, file: &Rc<DmaFile>, path: &Path, index: u64, end: u64) -> Result<Rc<ReadResult>> {
        let full = (index + 1) * BLOCK <= end;
        let generation = self.inner.state.borrow().readahead.generation;
        let found = self.inner.state.borrow_mut().readahead.take(path, index);
        let block = match found {
            Some(BlockState::Ready(block)) => block,
            Some(BlockState::InFlight(task)) => Rc::new(
                task.await
                    .map_err(|e| StorageError::io("reading", path, std::io::Error::other(e)))?,
            ),
            None => {
                let len = if full { BLOCK } else { align_up(end - index * BLOCK) };
                Rc::new(
                    file.read_at_aligned(index * BLOCK, len as usize)
                        .await
                        .map_err(|e| StorageError::glommio("reading", path, e))?,
                )
            }
        };
        let mut st = self.inner.state.borrow_mut();
        if full && st.readahead.generation == generation {
            st.readahead.put(path, index, BlockState::Ready(block.clone()));
        }
        Ok(block)
    }
}

fn spawn_block_read(file: Rc<DmaFile>, index: u64) -> BlockRead {
    glommio::spawn_local(async move {
        file.read_at_aligned(index * BLOCK, BLOCK as usize)
            .await
            .map_err(|e| e.to_string())
    })
}
