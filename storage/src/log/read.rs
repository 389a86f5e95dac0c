//! The read side of the log: fetch whole batches from an offset, and find
//! the first offset at or after a timestamp.
//!
//! Reads near the tail come from the tail cache (no I/O). Older data is read
//! from the segment file from the nearest index entry on, through the
//! read-ahead blocks (`readahead.rs`): every returned batch slices the DMA
//! buffer it was read into (no copy). The read path checks framing and offsets but
//! not CRCs: the consumer checks every batch's CRC, and opening a log checks
//! the CRCs of everything recovery relies on.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;
use glommio::io::DmaFile;

use super::readahead::SegmentFile;
use super::Log;
use crate::batch::RecordBatch;
use crate::error::{Result, StorageError};
use crate::scan::{scan_one_with, ScanEnd, ScanStep};
use crate::segment::SealedSegment;
use crate::tail_cache::ReadBatches;
use crate::Offset;

/// Where a read that missed the cache goes.
enum Source {
    Active {
        file: Rc<DmaFile>,
        path: PathBuf,
        base: Offset,
        entry: (u32, u32),
        end: u64,
    },
    Sealed(SealedSegment),
}

impl Log {
    /// Whole batches from the one holding `from`, up to about `max_bytes`
    /// (at least one batch), below the log end.
    pub async fn read(&self, from: Offset, max_bytes: usize) -> Result<ReadBatches> {
        self.read_below(from, max_bytes, Offset(u64::MAX)).await
    }

    /// [`Log::read`], returning only batches that end at or below `upto`
    /// (the high watermark, for consumers).
    pub async fn read_below(&self, mut from: Offset, max_bytes: usize, upto: Offset) -> Result<ReadBatches> {
        loop {
            let source = {
                let st = self.inner.state.borrow();
                let upto = upto.min(st.readable_end()?);
                if from < st.log_start || from > st.log_end() {
                    return Err(StorageError::OffsetOutOfRange {
                        requested: from,
                        log_start: st.log_start,
                        log_end: st.log_end(),
                    });
                }
                if from >= upto {
                    return Ok(ReadBatches::empty(from));
                }
                if let Some(hit) = st.cache.read(from, max_bytes, upto) {
                    return Ok(hit);
                }
                if from >= st.active.base {
                    let rel = (from.0 - st.active.base.0) as u32;
                    Source::Active {
                        file: st.active.file.clone(),
                        path: st.active.path.clone(),
                        base: st.active.base,
                        entry: st.active.index.lookup_offset(rel),
                        end: st.active.written_end(),
                    }
                } else {
                    match st.sealed.range(..=from).next_back() {
                        Some((_, seg)) if from < seg.next_offset => Source::Sealed(seg.clone()),
                        // `from` falls in a gap between segments: go on at the next one.
                        _ => {
                            from = st.sealed.range(from..).next().map_or(st.active.base, |(b, _)| *b);
                            continue;
                        }
                    }
                }
            };
            let upto = upto.min(self.log_end());
            let got = match source {
                Source::Active {
                    file,
                    path,
                    base,
                    entry,
                    end,
                } => {
                    let seg = SegmentFile {
                        file: &file,
                        path: &path,
                        base,
                        index: None,
                    };
                    self.read_segment(seg, entry, end, from, max_bytes, upto).await
                }
                Source::Sealed(seg) => {
                    async {
                        let open = self.inner.shard.sealed(&seg, &self.inner.config).await?;
                        let entry = open.index.lookup_offset((from.0 - seg.base.0) as u32);
                        let file = SegmentFile {
                            file: &open.file,
                            path: &seg.path,
                            base: seg.base,
                            index: Some(&open.index),
                        };
                        self.read_segment(file, entry, seg.size, from, max_bytes, upto).await
                    }
                    .await
                }
            };
            // Retention may have taken the segment while it was read (the
            // active one too, if it was sealed meanwhile): its file is then
            // gone or, recycled, being written over. What was read is not
            // trusted; the reader hears where the log starts now.
            let st = self.inner.state.borrow();
            if from < st.log_start {
                return Err(StorageError::OffsetOutOfRange {
                    requested: from,
                    log_start: st.log_start,
                    log_end: st.log_end(),
                });
            }
            return got;
        }
    }

    /// The offset of the first record whose timestamp is at or after
    /// `timestamp_ms`, or `None` if every record is older.
    pub async fn offset_for_timestamp(&self, timestamp_ms: i64) -> Result<Option<Offset>> {
        let start = {
            let st = self.inner.state.borrow();
            st.readable_end()?;
            let sealed = st
                .sealed
                .values()
                .find(|s| s.max_timestamp.is_some_and(|t| t >= timestamp_ms))
                .cloned();
            match sealed {
                Some(seg) => Err(seg),
                None if st.active.index.max_timestamp().is_some_and(|t| t >= timestamp_ms) => Ok(st
                    .active
                    .base
                    .plus(u64::from(st.active.index.lookup_time(timestamp_ms)))),
                None => return Ok(None),
            }
        };
        let mut from = match start {
            Ok(from) => from,
            Err(seg) => match self.inner.shard.sealed(&seg, &self.inner.config).await {
                Ok(open) => seg.base.plus(u64::from(open.index.lookup_time(timestamp_ms))),
                // Retention took the segment meanwhile: what is left of the
                // log starts later.
                Err(_) if seg.base < self.log_start() => self.log_start(),
                Err(e) => return Err(e),
            },
        };
        from = from.max(self.log_start());
        loop {
            let got = self.read(from, 1 << 20).await?;
            if got.batches.is_empty() {
                return Ok(None);
            }
            for bytes in got.batches {
                if crate::batch::BatchHeader::parse(&bytes).is_some_and(|h| h.max_timestamp >= timestamp_ms) {
                    let batch = RecordBatch::new(bytes, self.inner.config.stored_batch_bytes_max())?;
                    return Ok(batch.records().find(|r| r.timestamp >= timestamp_ms).map(|r| r.offset));
                }
            }
            from = got.next_offset;
        }
    }

    /// Reads whole batches of segment `seg` from the one holding `from`.
    /// `entry` is the index entry (relative offset, position) to start at
    /// and `end` the bytes of the file that hold written batches. Disk reads
    /// go through the read-ahead blocks (`readahead.rs`).
    async fn read_segment(
        &self,
        seg: SegmentFile<'_>,
        entry: (u32, u32),
        end: u64,
        from: Offset,
        max_bytes: usize,
        upto: Offset,
    ) -> Result<ReadBatches> {
        let SegmentFile { path, base, .. } = seg;
        let batch_bytes_max = self.inner.config.stored_batch_bytes_max();
        let mut out = ReadBatches::empty(from);
        let mut pos = u64::from(entry.1);
        let mut expected = base.plus(u64::from(entry.0));
        // One read covers the index gap (≤ one interval plus a batch) and max_bytes.
        let window = (max_bytes + (64 << 10)).min(batch_bytes_max * 2);
        let mut want = window;
        let mut buf = Bytes::new();
        // Whether `buf` slices a read-ahead block (see `ReadBatches::from_disk`).
        let mut buf_is_block = false;
        let mut buf_pos = pos;
        loop {
            let at = (pos - buf_pos) as usize;
            let at_eof = buf_pos + buf.len() as u64 >= end;
            match scan_one_with(&buf[at..], pos, at_eof, Some(expected), batch_bytes_max, false) {
                ScanStep::Batch(b) => {
                    let next = b.header.next_offset();
                    if next > from {
                        if next > upto || !out.fits(b.len() as usize, max_bytes) {
                            break;
                        }
                        out.from_disk |= buf_is_block;
                        if !out.take(buf.slice(at..at + b.len() as usize), next, max_bytes) {
                            break;
                        }
                    }
                    pos = b.end();
                    expected = next;
                }
                ScanStep::NeedMore(n) => {
                    // Past the batches asked for: stop rather than read more.
                    if !out.batches.is_empty() && out.bytes + n > max_bytes {
                        break;
                    }
                    let len = (end - pos).min(n.max(want) as u64) as usize;
                    (buf, buf_is_block) = self.read_window(seg, pos, len, n, end).await?;
                    buf_pos = pos;
                    want = max_bytes.saturating_sub(out.bytes).max(64 << 10);
                    if buf.len() < n.min(len) {
                        return Err(corrupt(
                            path,
                            pos,
                            format!("file ends {} bytes after position {pos}, {end} expected", buf.len()),
                        ));
                    }
                }
                ScanStep::End(ScanEnd::Clean) => return Ok(out),
                ScanStep::End(e) => return Err(corrupt(path, pos, format!("{e:?} while reading offset {expected}"))),
            }
        }
        Ok(out)
    }
}

fn corrupt(path: &Path, position: u64, reason: String) -> StorageError {
    StorageError::CorruptSegment {
        path: path.to_path_buf(),
        position,
        reason,
    }
}
