//! Opening existing segment files: load or rebuild the index, verify the
//! batches after the last index entry, and find where the valid log ends.
//!
//! Runs on: the shard that opens the log (and, for sealed segments read
//! later, the shard whose cache opens them).

use std::ops::ControlFlow;
use std::path::Path;

use glommio::io::DmaFile;
use tracing::warn;

use super::io::{read_range, read_small_file, scan_range, write_small_file};
use super::{index_path, time_index_path};
use crate::error::{Result, StorageError};
use crate::index::SegmentIndex;
use crate::scan::ScanEnd;
use crate::Offset;

/// Read window for recovery scans.
const SCAN_WINDOW: usize = 1 << 20;

/// What [`load_segment`] found.
#[derive(Debug)]
pub(crate) struct LoadedSegment {
    /// The index, covering every valid batch.
    pub index: SegmentIndex,
    /// Position after the last valid batch.
    pub valid_end: u64,
    /// Offset after the last valid batch.
    pub next_offset: Offset,
    /// Why the valid part ends there.
    pub end: ScanEnd,
    /// Whether the index files were missing, damaged or out of step with
    /// the index the scan found (then written again).
    pub rebuilt: bool,
}

/// Loads the index files of the segment at `path` (base offset `base`,
/// `file_len` bytes) and scans from their last entry to the end of the
/// file; if they are missing or damaged, or the entry does not lead to a
/// valid batch, rebuilds the index by scanning the whole file.
///
/// Without `trust_index` (the log was not closed cleanly: a crash, a
/// power loss, a kill) every batch of the file is checked against its CRC
/// whatever the index says, so damage below the last index entry is found
/// here and not by a reader; the index files are written again only where
/// they differ from what the scan found.
pub(crate) async fn load_segment(
    file: &DmaFile,
    path: &Path,
    base: Offset,
    file_len: u64,
    batch_bytes_max: usize,
    index_interval: u32,
    trust_index: bool,
) -> Result<LoadedSegment> {
    let offsets = read_small_file(&index_path(path)).await?;
    let times = read_small_file(&time_index_path(path)).await?;
    let decoded = match (&offsets, &times) {
        (Some(o), Some(t)) => SegmentIndex::decode(o, t, file_len.max(1)),
        _ => Err("index files missing".to_string()),
    };
    match decoded {
        Ok(mut index) if trust_index && index.offset_entries() > 0 => {
            let (rel, pos) = index.lookup_offset(u32::MAX);
            index.truncate_to_position(pos);
            let pos = u64::from(pos);
            let found = scan_from(
                file,
                path,
                &mut index,
                base,
                pos,
                Offset(base.0 + u64::from(rel)),
                file_len,
                batch_bytes_max,
                index_interval,
            )
            .await?;
            if found.valid_end > pos || matches!(found.end, ScanEnd::Clean) {
                return Ok(found);
            }
        }
        Ok(_) => {}
        Err(why) => {
            if offsets.is_some() || times.is_some() || file_len > 0 {
                warn!(segment = %path.display(), "rebuilding index: {why}");
            }
        }
    }
    let mut index = SegmentIndex::new();
    let mut found = scan_from(
        file,
        path,
        &mut index,
        base,
        0,
        base,
        file_len,
        batch_bytes_max,
        index_interval,
    )
    .await?;
    // Written again only where the files differ from what the scan found.
    found.rebuilt = offsets.as_deref() != Some(&found.index.encode_offsets(0)[..])
        || times.as_deref() != Some(&found.index.encode_times(0)[..]);
    Ok(found)
}

#[allow(clippy::too_many_arguments)]
async fn scan_from(
    file: &DmaFile,
    path: &Path,
    index: &mut SegmentIndex,
    base: Offset,
    pos: u64,
    expected: Offset,
    file_len: u64,
    batch_bytes_max: usize,
    index_interval: u32,
) -> Result<LoadedSegment> {
    let mut next_offset = expected;
    let scan = scan_range(
        file,
        path,
        pos,
        file_len,
        Some(expected),
        batch_bytes_max,
        SCAN_WINDOW,
        true,
        |b, _| {
            let rel = u32::try_from(b.header.base_offset.0 - base.0).unwrap_or(u32::MAX);
            index.on_batch(
                rel,
                b.position as u32,
                b.header.batch_length,
                b.header.max_timestamp,
                index_interval,
            );
            next_offset = b.header.next_offset();
            ControlFlow::Continue(())
        },
    )
    .await?;
    Ok(LoadedSegment {
        index: std::mem::take(index),
        valid_end: scan.valid_end,
        next_offset,
        end: scan.end.unwrap_or(ScanEnd::Clean),
        rebuilt: false,
    })
}

/// Whether the log goes on past the bad batch at `position` (a scan of
/// the segment stopped there, expecting offset `next_offset`): read with
/// the length its header states, the bytes after it are a valid batch
/// holding later offsets. Then the bad batch is damage inside the log (a
/// bit flipped on the disk), not the torn end of a write that never
/// completed, and what follows it was written after it: records the log
/// lost, not merely a tail it never made durable. A flip in the length
/// field itself hides the rest from this look (the log is then taken for
/// torn at that batch).
pub(crate) async fn valid_batch_follows(
    file: &DmaFile,
    path: &Path,
    position: u64,
    next_offset: Offset,
    file_len: u64,
    batch_bytes_max: usize,
) -> Result<Option<Offset>> {
    use crate::batch::HEADER_LEN;
    use crate::scan::{scan_one, ScanStep};
    let header = read_range(file, path, position, HEADER_LEN).await?;
    let Some(len) = crate::batch::batch_length(&header) else {
        return Ok(None);
    };
    let len = u64::from(len);
    if len < HEADER_LEN as u64 || len > batch_bytes_max as u64 || position + len >= file_len {
        return Ok(None);
    }
    let after = position + len;
    let mut want = HEADER_LEN;
    loop {
        let take = want.min((file_len - after) as usize);
        let buf = read_range(file, path, after, take).await?;
        let at_eof = after + buf.len() as u64 >= file_len;
        match scan_one(&buf, after, at_eof, None, batch_bytes_max) {
            ScanStep::Batch(b) if b.header.base_offset > next_offset => return Ok(Some(b.header.base_offset)),
            ScanStep::NeedMore(more) if more > want && !at_eof => want = more,
            _ => return Ok(None),
        }
    }
}

/// Writes both index files of a segment from scratch.
pub(crate) async fn write_index_files(path: &Path, index: &SegmentIndex) -> Result<()> {
    write_small_file(&index_path(path), 0, index.encode_offsets(0), true).await?;
    write_small_file(&time_index_path(path), 0, index.encode_times(0), true).await
}

/// Loads a sealed segment strictly: it must hold only whole valid batches,
/// up to its last byte. Anything else is [`StorageError::CorruptSegment`]
/// naming the file and position.
pub(crate) async fn load_sealed(
    file: &DmaFile,
    path: &Path,
    base: Offset,
    batch_bytes_max: usize,
    index_interval: u32,
) -> Result<(LoadedSegment, u64)> {
    let file_len = file
        .file_size()
        .await
        .map_err(|e| StorageError::glommio("sizing", path, e))?;
    let loaded = load_segment(file, path, base, file_len, batch_bytes_max, index_interval, true).await?;
    if loaded.valid_end != file_len || loaded.end != ScanEnd::Clean {
        let reason = match &loaded.end {
            ScanEnd::Clean => "valid batches end before the file does".to_string(),
            ScanEnd::ZeroTail => "zeros where a batch should be".to_string(),
            ScanEnd::Torn(r) | ScanEnd::Corrupt(r) | ScanEnd::Stale(r) => r.clone(),
        };
        return Err(StorageError::CorruptSegment {
            path: path.to_path_buf(),
            position: loaded.valid_end,
            reason: format!("{reason} (first bad batch would hold offset {})", loaded.next_offset),
        });
    }
    if loaded.rebuilt {
        write_index_files(path, &loaded.index).await?;
    }
    Ok((loaded, file_len))
}
