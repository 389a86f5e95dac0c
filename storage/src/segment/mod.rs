//! Segment files: a partition log is a run of segments, each a `.log` file
//! of batches back to back plus its `.index` and `.timeindex`.
//!
//! Runs on: the shard that owns the log.
//!
//! - File names are the segment's base offset, 20 digits zero-padded
//!   (`00000000000000524288.log`), so a directory listing sorts in log order.
//! - [`active::ActiveSegment`] is the one segment being appended to: it owns
//!   an O_DIRECT file and the direct-I/O write path. Sealing it
//!   ([`active::ActiveSegment::seal`]) yields a [`SealedSegment`], which is
//!   read-only and whose file and index are opened only when read, through
//!   the shard's cache (`shard.rs`).
//! - A `.log` file holds only whole batches; the active one may end in zeros
//!   (padding of the last 4 KiB block, or space zero-filled ahead of the
//!   writer). A sealed one is truncated to its exact length.

pub mod active;
pub(crate) mod io;
pub(crate) mod recover;

use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::DmaFile;

use crate::index::SegmentIndex;
use crate::Offset;

/// The `.log` file name of the segment starting at `base`.
pub fn log_file_name(base: Offset) -> String {
    format!("{:020}.log", base.0)
}

/// The offset index file that sits beside a `.log` file.
pub fn index_path(log_path: &Path) -> PathBuf {
    log_path.with_extension("index")
}

/// The time index file that sits beside a `.log` file.
pub fn time_index_path(log_path: &Path) -> PathBuf {
    log_path.with_extension("timeindex")
}

/// The base offset named by a `.log` file name, if it is one.
pub fn parse_log_file_name(name: &str) -> Option<Offset> {
    parse_offset_file_name(name, ".log")
}

/// The offset in a file name of 20 decimal digits and then `suffix`.
pub fn parse_offset_file_name(name: &str, suffix: &str) -> Option<Offset> {
    let digits = name.strip_suffix(suffix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(Offset)
}

/// What the log keeps in memory about a sealed segment: a few words, so a
/// partition with thousands of segments stays small. Files and indexes are
/// opened on demand ([`OpenSegment`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedSegment {
    pub path: PathBuf,
    pub base: Offset,
    /// Offset after the segment's last record.
    pub next_offset: Offset,
    /// Bytes in the file (exactly its batches).
    pub size: u64,
    /// Largest record timestamp, `None` only for an empty segment.
    pub max_timestamp: Option<i64>,
}

/// A sealed segment's open file and loaded index, held in the shard's
/// bounded cache while it is being read.
#[derive(Debug)]
pub struct OpenSegment {
    pub file: Rc<DmaFile>,
    pub index: SegmentIndex,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for base in [0u64, 524_288, u64::MAX] {
            let name = log_file_name(Offset(base));
            assert_eq!(name.len(), 24);
            assert_eq!(parse_log_file_name(&name), Some(Offset(base)));
        }
        assert_eq!(parse_log_file_name("0000000000000000000.log"), None);
        assert_eq!(parse_log_file_name("0000000000000000000a.log"), None);
        assert_eq!(parse_log_file_name("00000000000000000000.index"), None);
    }
}
