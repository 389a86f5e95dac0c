//! The file I/O the log needs, on glommio: windowed scans of a segment,
//! small whole-file reads and writes for indexes.

use std::ops::ControlFlow;
use std::path::Path;

use bytes::Bytes;
use glommio::io::{DmaFile, OpenOptions};

use crate::error::{Result, StorageError};
use crate::scan::{scan_one_with, ScanEnd, ScanStep, ScannedBatch};
use crate::{Offset, DMA_ALIGN};

pub(crate) fn align_down(v: u64) -> u64 {
    v & !(DMA_ALIGN - 1)
}

pub(crate) fn align_up(v: u64) -> u64 {
    (v + DMA_ALIGN - 1) & !(DMA_ALIGN - 1)
}

/// Reads `[pos, end)` of `file` (clamped to `end`), copying into shared bytes.
pub(crate) async fn read_range(file: &DmaFile, path: &Path, pos: u64, len: usize) -> Result<Bytes> {
    let start = align_down(pos);
    let skip = (pos - start) as usize;
    let size = align_up(skip as u64 + len as u64) as usize;
    let got = file
        .read_at_aligned(start, size)
        .await
        .map_err(|e| StorageError::glommio("reading", path, e))?;
    let have = got.len().saturating_sub(skip).min(len);
    Ok(Bytes::copy_from_slice(&got[skip..skip + have]))
}

/// The result of [`scan_range`].
#[derive(Debug)]
pub(crate) struct RangeScan {
    /// Position after the last batch visited (or accepted before stopping).
    pub valid_end: u64,
    /// Why the scan stopped; `None` when the visitor stopped it.
    pub end: Option<ScanEnd>,
}

/// Walks the batches of `file` from `pos` up to `end` (the bytes that may
/// hold batches), reading windows of at least `window` bytes. Each valid
/// batch goes to `visit` with its bytes (a slice of the window, not a copy);
/// the visitor returns `Break` to stop. `check_crc` false skips the CRC
/// (reads leave that to the consumer; recovery and opening check it).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn scan_range(
    file: &DmaFile,
    path: &Path,
    mut pos: u64,
    end: u64,
    mut expected: Option<Offset>,
    batch_bytes_max: usize,
    window: usize,
    check_crc: bool,
    mut visit: impl FnMut(&ScannedBatch, Bytes) -> ControlFlow<()>,
) -> Result<RangeScan> {
    let mut end = end;
    let mut buf = Bytes::new();
    let mut buf_pos = pos;
    loop {
        let offset_in_buf = (pos - buf_pos) as usize;
        let at_eof = buf_pos + buf.len() as u64 >= end;
        match scan_one_with(&buf[offset_in_buf..], pos, at_eof, expected, batch_bytes_max, check_crc) {
            ScanStep::Batch(b) => {
                let bytes = buf.slice(offset_in_buf..offset_in_buf + b.len() as usize);
                pos = b.end();
                expected = Some(b.header.next_offset());
                if visit(&b, bytes).is_break() {
                    return Ok(RangeScan {
                        valid_end: pos,
                        end: None,
                    });
                }
            }
            ScanStep::End(e) => {
                return Ok(RangeScan {
                    valid_end: pos,
                    end: Some(e),
                })
            }
            ScanStep::NeedMore(n) => {
                let len = (end - pos).min(n.max(window) as u64) as usize;
                buf = read_range(file, path, pos, len).await?;
                buf_pos = pos;
                if buf.len() < len {
                    // The file is shorter than the caller believed.
                    end = pos + buf.len() as u64;
                }
            }
        }
    }
}

/// Reads a whole small file; `None` if it does not exist.
pub(crate) async fn read_small_file(path: &Path) -> Result<Option<Vec<u8>>> {
    let file = match OpenOptions::new().read(true).buffered_open(path).await {
        Ok(f) => f,
        Err(glommio::GlommioError::IoError(e)) | Err(glommio::GlommioError::EnhancedIoError { source: e, .. })
            if e.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(None)
        }
        Err(e) => return Err(StorageError::glommio("opening", path, e)),
    };
    let len = file
        .file_size()
        .await
        .map_err(|e| StorageError::glommio("sizing", path, e))?;
    let data = file
        .read_at(0, len as usize)
        .await
        .map_err(|e| StorageError::glommio("reading", path, e))?;
    let out = data.to_vec();
    file.close()
        .await
        .map_err(|e| StorageError::glommio("closing", path, e))?;
    Ok(Some(out))
}

/// Writes `bytes` at `pos` of `path` (created if missing; `truncate` first
/// empties it). Buffered I/O, no fsync: indexes are rebuilt if lost.
pub(crate) async fn write_small_file(path: &Path, pos: u64, bytes: Vec<u8>, truncate: bool) -> Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(truncate)
        .buffered_open(path)
        .await
        .map_err(|e| StorageError::glommio("opening", path, e))?;
    if !bytes.is_empty() {
        file.write_at(bytes, pos)
            .await
            .map_err(|e| StorageError::glommio("writing", path, e))?;
    }
    file.close()
        .await
        .map_err(|e| StorageError::glommio("closing", path, e))
}

/// Removes a file; a file already gone is fine.
pub(crate) async fn remove_file(path: &Path) -> Result<()> {
    match glommio::io::remove(path).await {
        Ok(()) => Ok(()),
        Err(glommio::GlommioError::IoError(e)) | Err(glommio::GlommioError::EnhancedIoError { source: e, .. })
            if e.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(())
        }
        Err(e) => Err(StorageError::glommio("removing", path, e)),
    }
}

/// fsyncs a directory so that files created or removed in it survive a crash.
pub(crate) async fn sync_dir(dir: &Path) -> Result<()> {
    let d = glommio::io::Directory::open(dir)
        .await
        .map_err(|e| StorageError::glommio("opening directory", dir, e))?;
    d.sync()
        .await
        .map_err(|e| StorageError::glommio("syncing directory", dir, e))?;
    d.close()
        .await
        .map_err(|e| StorageError::glommio("closing directory", dir, e))
}
