//! The journal's byte layout: file headers, frames and entries. Pure: no
//! I/O, so the recovery scan and the fuzz target run it on any bytes.
//!
//! All integers little-endian. CRC-32 is IEEE (`crc32fast`), as in every
//! other Strand file.
//!
//! # A journal file, `<seq>.journal`
//! Block 0 (4,096 bytes) is the file header; frames follow, each starting
//! on a 4 KiB boundary and padded with zeros to the next one (a frame is
//! one direct-I/O write, and no write ever rewrites a block an earlier,
//! acknowledged frame lies in).
//!
//! | bytes  | file header field                                          |
//! |--------|------------------------------------------------------------|
//! | 0..4   | magic `SJF1`                                               |
//! | 4..12  | the file's sequence number (u64; a recycled file gets a new one) |
//! | 12..20 | the LSN of the file's first frame (u64)                    |
//! | 20..24 | CRC-32 of bytes 0..20                                      |
//! | 24..4096 | zero                                                     |
//!
//! # A frame (one group commit)
//!
//! | bytes  | frame header field                                         |
//! |--------|------------------------------------------------------------|
//! | 0..4   | magic `SJR1`                                               |
//! | 4..8   | P, the length of the entries that follow the header (u32)  |
//! | 8..16  | the sequence number of the file it is in (u64): a frame left over from the file's previous use has an older one |
//! | 16..24 | its LSN (u64): frames are numbered 0, 1, 2 … across files, without gaps |
//! | 24..32 | replay-from LSN (u64, ≤ its LSN): every entry of a frame before this one is durable in its log's segments, so recovery starts there |
//! | 32..36 | N, the entry count (u32; 0 in a frame written only to record a newer replay-from) |
//! | 36..40 | CRC-32 of bytes 0..36 and of the P bytes of entries        |
//! | 40..40+P | N entries, back to back                                  |
//! | to the next 4 KiB boundary | zero                                   |
//!
//! # An entry (one log's part of a frame)
//!
//! | bytes  | entry field                                                |
//! |--------|------------------------------------------------------------|
//! | 0      | kind: 1 = batches, 2 = truncation, 3 = start-over          |
//! | 1..3   | D, the length of the log's directory name (u16, 1..=1024)  |
//! | 3..11  | the log's id (u64, from its `.journal-id` file: a log re-created in the same directory has another) |
//! | 11..15 | B, the body's length (u32)                                 |
//! | 15..15+D | the log's directory, UTF-8, relative to the data directory, `/`-separated, no `.` or `..` part |
//! | then B | the body                                                   |
//!
//! A *batches* body is one or more whole stored batches (the segment
//! format, `flatbuffers/src/batch`), back to back, each starting at the
//! offset after the one before. A *truncation* body is 8 bytes: the
//! offset (u64) the log was cut back to (`Log::truncate_to`: replication's
//! truncation to a divergence point). A *start-over* body is 8 bytes: the
//! offset (u64) an emptied log starts again at (`Log::start_over_at`: a
//! follower behind its leader's log start). Both are written, and
//! durable, before the log is changed.

use bytes::Bytes;

use crate::batch;
use crate::Offset;

/// The block size frames are aligned and padded to.
pub const BLOCK: usize = crate::DMA_ALIGN as usize;
/// The file header's length on disk (one block).
pub const FILE_HEADER_LEN: usize = BLOCK;
/// A frame header's length.
pub const FRAME_HEADER_LEN: usize = 40;
/// An entry's fixed part (before the directory name).
pub const ENTRY_HEADER_LEN: usize = 15;
/// The longest directory name an entry carries.
pub const DIR_MAX: usize = 1024;

const FILE_MAGIC: &[u8; 4] = b"SJF1";
const FRAME_MAGIC: &[u8; 4] = b"SJR1";
const KIND_BATCHES: u8 = 1;
const KIND_TRUNCATION: u8 = 2;
const KIND_START_OVER: u8 = 3;

/// A journal file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    pub seq: u64,
    pub first_lsn: u64,
}

/// A frame's header fields (the magic, lengths and CRC are checked, not kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub file_seq: u64,
    pub lsn: u64,
    pub replay_from: u64,
}

/// What an entry says about its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Whole batches, back to back, starting at `base`.
    Batches { base: Offset, bytes: Bytes },
    /// The log was cut back to end at this offset.
    Truncation { log_end: Offset },
    /// The log was emptied and started again at this offset.
    StartOver { at: Offset },
}

/// One log's part of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub dir: String,
    pub log_id: u64,
    pub change: Change,
}

/// Why bytes are not a frame (or not a file header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// All zero: nothing was ever written here.
    Zero,
    /// Fewer bytes than the header or the lengths it gives.
    Short,
    /// A frame of another use of this file, or out of turn.
    Stale { file_seq: u64, lsn: u64 },
    /// Magic, CRC or an entry does not check out.
    Corrupt(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Zero => f.write_str("zero bytes (nothing written)"),
            FrameError::Short => f.write_str("cut short"),
            FrameError::Stale { file_seq, lsn } => {
                write!(f, "a frame of an earlier use (file {file_seq}, LSN {lsn})")
            }
            FrameError::Corrupt(why) => f.write_str(why),
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Rounds `len` up to a whole number of blocks.
pub fn padded_len(len: usize) -> usize {
    len.div_ceil(BLOCK) * BLOCK
}

/// The file header block.
pub fn encode_file_header(header: FileHeader) -> Vec<u8> {
    let mut out = vec![0u8; FILE_HEADER_LEN];
    write_file_header(&mut out, header);
    out
}

/// Writes the file header block into `out` (at least [`FILE_HEADER_LEN`]
/// bytes; the block's tail is zeroed).
pub fn write_file_header(out: &mut [u8], header: FileHeader) {
    let out = &mut out[..FILE_HEADER_LEN];
    out[0..4].copy_from_slice(FILE_MAGIC);
    out[4..12].copy_from_slice(&header.seq.to_le_bytes());
    out[12..20].copy_from_slice(&header.first_lsn.to_le_bytes());
    let crc = crc32fast::hash(&out[0..20]);
    out[20..24].copy_from_slice(&crc.to_le_bytes());
    out[24..].fill(0);
}

/// Reads a file header from the first bytes of a file.
pub fn decode_file_header(buf: &[u8]) -> Result<FileHeader, FrameError> {
    if buf.len() < 24 {
        return Err(FrameError::Short);
    }
    if buf[0..24].iter().all(|&b| b == 0) {
        return Err(FrameError::Zero);
    }
    if &buf[0..4] != FILE_MAGIC {
        return Err(FrameError::Corrupt("not a journal file (bad magic)".into()));
    }
    if crc32fast::hash(&buf[0..20]) != u32_at(buf, 20) {
        return Err(FrameError::Corrupt("file header CRC mismatch".into()));
    }
    Ok(FileHeader {
        seq: u64_at(buf, 4),
        first_lsn: u64_at(buf, 12),
    })
}

/// Appends one entry's bytes to `out` (a frame being gathered). The
/// caller checks the directory ([`check_dir`]) and, for batches, that
/// `bytes` holds whole batches from `base` on.
pub fn encode_entry(out: &mut Vec<u8>, dir: &str, log_id: u64, change: &Change) {
    let offset;
    let (kind, body): (u8, &[u8]) = match change {
        Change::Batches { bytes, .. } => (KIND_BATCHES, bytes),
        Change::Truncation { log_end } => {
            offset = log_end.0.to_le_bytes();
            (KIND_TRUNCATION, &offset)
        }
        Change::StartOver { at } => {
            offset = at.0.to_le_bytes();
            (KIND_START_OVER, &offset)
        }
    };
    out.push(kind);
    out.extend_from_slice(&(dir.len() as u16).to_le_bytes());
    out.extend_from_slice(&log_id.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(dir.as_bytes());
    out.extend_from_slice(body);
}

/// The bytes an entry takes in a frame.
pub fn entry_len(dir: &str, change: &Change) -> usize {
    ENTRY_HEADER_LEN
        + dir.len()
        + match change {
            Change::Batches { bytes, .. } => bytes.len(),
            Change::Truncation { .. } | Change::StartOver { .. } => 8,
        }
}

/// Whether `dir` may name a log in an entry: 1..=[`DIR_MAX`] bytes, relative,
/// `/`-separated, without empty, `.` or `..` parts.
pub fn check_dir(dir: &str) -> Result<(), String> {
    if dir.is_empty() || dir.len() > DIR_MAX {
        return Err(format!("a directory name of {} bytes (1..={DIR_MAX})", dir.len()));
    }
    if dir
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(format!("{dir:?} is not a plain relative path"));
    }
    Ok(())
}

/// A whole frame, padded: the header (with `header`'s fields, the count and
/// the CRC) before the gathered `entries` (`count` of them).
pub fn encode_frame(header: FrameHeader, count: u32, entries: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; padded_len(FRAME_HEADER_LEN + entries.len())];
    write_frame(&mut out, header, count, entries);
    out
}

/// Writes a whole frame into `out`, which is exactly its padded length
/// (the journal's direct-I/O buffer: the entries are copied once).
pub fn write_frame(out: &mut [u8], header: FrameHeader, count: u32, entries: &[u8]) {
    let len = FRAME_HEADER_LEN + entries.len();
    assert_eq!(out.len(), padded_len(len), "a frame fills its padded length");
    out[0..4].copy_from_slice(FRAME_MAGIC);
    out[4..8].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    out[8..16].copy_from_slice(&header.file_seq.to_le_bytes());
    out[16..24].copy_from_slice(&header.lsn.to_le_bytes());
    out[24..32].copy_from_slice(&header.replay_from.to_le_bytes());
    out[32..36].copy_from_slice(&count.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&out[0..36]);
    crc.update(entries);
    out[36..40].copy_from_slice(&crc.finalize().to_le_bytes());
    out[FRAME_HEADER_LEN..len].copy_from_slice(entries);
    out[len..].fill(0);
}

/// A decoded frame and the bytes it takes on disk (padding included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub header: FrameHeader,
    pub entries: Vec<Entry>,
    pub disk_len: usize,
}

/// Decodes the frame at the start of `buf` (a slice of a file image, so
/// the batches it holds are slices of it, not copies), expected to be
/// frame `lsn` of file `file_seq`.
pub fn decode_frame(buf: &Bytes, file_seq: u64, lsn: u64) -> Result<Frame, FrameError> {
    if buf.len() < FRAME_HEADER_LEN {
        return Err(if buf.iter().all(|&b| b == 0) {
            FrameError::Zero
        } else {
            FrameError::Short
        });
    }
    let head = &buf[..FRAME_HEADER_LEN];
    if head.iter().all(|&b| b == 0) {
        return Err(FrameError::Zero);
    }
    if &head[0..4] != FRAME_MAGIC {
        return Err(FrameError::Corrupt("bad frame magic".into()));
    }
    let payload = u32_at(head, 4) as usize;
    let header = FrameHeader {
        file_seq: u64_at(head, 8),
        lsn: u64_at(head, 16),
        replay_from: u64_at(head, 24),
    };
    let count = u32_at(head, 32);
    if buf.len() < FRAME_HEADER_LEN + payload {
        return Err(FrameError::Short);
    }
    let body = buf.slice(FRAME_HEADER_LEN..FRAME_HEADER_LEN + payload);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head[0..36]);
    crc.update(&body);
    if crc.finalize() != u32_at(head, 36) {
        // A torn write, or this block's older contents under a new header.
        return Err(FrameError::Corrupt(format!("frame CRC mismatch (LSN {})", header.lsn)));
    }
    if header.file_seq != file_seq || header.lsn != lsn {
        return Err(FrameError::Stale {
            file_seq: header.file_seq,
            lsn: header.lsn,
        });
    }
    if header.replay_from > header.lsn {
        return Err(FrameError::Corrupt(format!(
            "frame {lsn}: replay from {}, after itself",
            header.replay_from
        )));
    }
    let entries = decode_entries(&body, count).map_err(FrameError::Corrupt)?;
    Ok(Frame {
        header,
        entries,
        disk_len: padded_len(FRAME_HEADER_LEN + payload),
    })
}

/// The `count` entries that fill `body` exactly.
fn decode_entries(body: &Bytes, count: u32) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::with_capacity(count.min(1024) as usize);
    let mut at = 0;
    for i in 0..count {
        let rest = &body[at..];
        if rest.len() < ENTRY_HEADER_LEN {
            return Err(format!("entry {i} is cut short"));
        }
        let kind = rest[0];
        let dir_len = u16_at(rest, 1) as usize;
        let log_id = u64_at(rest, 3);
        let body_len = u32_at(rest, 11) as usize;
        let start = at + ENTRY_HEADER_LEN;
        let end = start
            .checked_add(dir_len)
            .and_then(|e| e.checked_add(body_len))
            .filter(|&e| e <= body.len())
            .ok_or_else(|| format!("entry {i} runs past its frame"))?;
        let dir = std::str::from_utf8(&body[start..start + dir_len])
            .map_err(|_| format!("entry {i}: the directory is not UTF-8"))?;
        check_dir(dir).map_err(|why| format!("entry {i}: {why}"))?;
        let content = body.slice(start + dir_len..end);
        let change = match kind {
            KIND_BATCHES => Change::Batches {
                base: check_batches(&content).map_err(|why| format!("entry {i}: {why}"))?,
                bytes: content,
            },
            KIND_TRUNCATION if content.len() == 8 => Change::Truncation {
                log_end: Offset(u64_at(&content, 0)),
            },
            KIND_START_OVER if content.len() == 8 => Change::StartOver {
                at: Offset(u64_at(&content, 0)),
            },
            KIND_TRUNCATION | KIND_START_OVER => {
                return Err(format!("entry {i}: a truncation of {} bytes", content.len()))
            }
            other => return Err(format!("entry {i}: unknown kind {other}")),
        };
        entries.push(Entry {
            dir: dir.to_string(),
            log_id,
            change,
        });
        at = end;
    }
    if at != body.len() {
        return Err(format!("{} bytes after the last entry", body.len() - at));
    }
    Ok(entries)
}

/// Checks that `bytes` is whole batches, each at the offset after the one
/// before (their headers, not their CRCs: the frame's CRC covers them, and
/// replay validates each batch as a replica append does). Returns the
/// first one's base offset.
pub fn check_batches(bytes: &[u8]) -> Result<Offset, String> {
    let mut at = 0;
    let mut base = None;
    let mut next: Option<Offset> = None;
    while at < bytes.len() {
        let len = batch::batch_length(&bytes[at..])
            .map(|l| l as usize)
            .filter(|&l| l >= batch::HEADER_LEN && at + l <= bytes.len())
            .ok_or_else(|| format!("a batch at byte {at} is cut short"))?;
        let header = batch::check_header(&bytes[at..at + len]).map_err(|e| format!("a batch at byte {at}: {e}"))?;
        if let Some(next) = next {
            if header.base_offset != next {
                return Err(format!(
                    "a batch at offset {} follows one that ends before {next}",
                    header.base_offset
                ));
            }
        }
        base.get_or_insert(header.base_offset);
        next = Some(header.next_offset());
        at += len;
    }
    base.ok_or_else(|| "no batch".to_string())
}

/// Splits a batches body (already checked) into its batches.
pub fn split_batches(bytes: &Bytes) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let Some(len) = batch::batch_length(&bytes[at..]) else {
            break;
        };
        let end = (at + (len as usize).max(1)).min(bytes.len());
        out.push(bytes.slice(at..end));
        at = end;
    }
    out
}
