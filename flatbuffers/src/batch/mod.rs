//! The record batch: the unit that producers build, the wire carries, the
//! log stores, replicas copy and consumers receive — the same bytes on every
//! hop, so the broker never re-encodes a message.
//!
//! Runs on: the client (encode), every shard (validate, stamp), recovery
//! (frame check) and consumers (iterate). All of it is plain code over byte
//! slices, no I/O — which is why it lives in `strand-wire`, usable by the
//! client without the broker's storage stack (`strand-storage` re-exports it).
//!
//! # Batch layout (all integers little-endian)
//!
//! ```text
//! offset size field              meaning
//!      0    4 crc                CRC-32 (IEEE, crc32fast) of bytes [4, batch_length)
//!      4    4 batch_length       bytes in the whole batch, this header included
//!      8    8 base_offset        offset of the first record (stamped by the broker)
//!     16    4 leader_epoch       epoch of the leader that appended it (stamped)
//!     20    1 magic              format version, always 1
//!     21    1 reserved           always 0
//!     22    2 attributes         bits 0-2 compression (0 = none, the only one served),
//!                                bit 3 timestamp type (0 create time, 1 log-append time),
//!                                bit 4 transactional, bit 5 control; the rest 0
//!     24    4 last_offset_delta  offset delta of the last record
//!     28    8 first_timestamp    ms since the Unix epoch of the first record
//!     36    8 max_timestamp      largest record timestamp in the batch (ms)
//!     44    8 producer_id        -1 when the producer is not idempotent
//!     52    2 producer_epoch     -1 likewise
//!     54    4 base_sequence      -1 likewise
//!     58    4 record_count       records that follow, at least 1
//!     62    … records
//! ```
//!
//! The CRC comes first so that it covers *every* other byte: a change of any
//! single byte anywhere in a batch is detected (CRC-32 catches every burst of
//! up to 32 bits). Kafka leaves the base offset and leader epoch outside its
//! CRC so the broker can stamp them without a second pass; Strand gets the
//! same effect differently: while validating, it computes the CRC of
//! `[20, len)` once, and after stamping it combines that with the CRC of the
//! new 16-byte prefix `[4, 20)` (`crc32fast::Hasher::combine`, O(log n)).
//! Only log-append-time queues, which rewrite the timestamps, pay a second
//! pass.
//!
//! # Record layout
//!
//! ```text
//! varint  length             bytes of the record after this field
//! u8      attributes         0
//! zigzag  timestamp_delta    ms after first_timestamp
//! varint  offset_delta       0, 1, 2 … (the record's index; the last equals last_offset_delta)
//! zigzag  key_length         -1 = no key
//! bytes   key
//! zigzag  value_length       -1 = null value
//! bytes   value
//! varint  header_count
//!   per header: varint key_length, bytes key, zigzag value_length (-1 = null), bytes value
//! ```
//!
//! `varint` is unsigned LEB128 and `zigzag` a zig-zag mapped LEB128 (see
//! [`crate::varint`]).

mod builder;
mod error;
mod records;

pub use builder::BatchBuilder;
pub use error::BatchError;
pub use records::{Header, HeaderIter, Record, RecordIter};

use bytes::{Bytes, BytesMut};

use crate::{LeaderEpoch, Offset};

/// Bytes in the fixed batch header.
pub const HEADER_LEN: usize = 62;
/// The only format version this code reads and writes.
pub const MAGIC: u8 = 1;

/// Field positions in the header; see the module doc.
pub mod field {
    pub const CRC: usize = 0;
    pub const BATCH_LENGTH: usize = 4;
    pub const BASE_OFFSET: usize = 8;
    pub const LEADER_EPOCH: usize = 16;
    pub const MAGIC: usize = 20;
    pub const RESERVED: usize = 21;
    pub const ATTRIBUTES: usize = 22;
    pub const LAST_OFFSET_DELTA: usize = 24;
    pub const FIRST_TIMESTAMP: usize = 28;
    pub const MAX_TIMESTAMP: usize = 36;
    pub const PRODUCER_ID: usize = 44;
    pub const PRODUCER_EPOCH: usize = 52;
    pub const BASE_SEQUENCE: usize = 54;
    pub const RECORD_COUNT: usize = 58;
    /// First byte the stamped prefix does not cover: [4, 20) is length,
    /// base offset and leader epoch.
    pub const BODY: usize = 20;
}

const _: () = assert!(field::RECORD_COUNT + 4 == HEADER_LEN);

/// Attribute bits.
pub mod attr {
    pub const COMPRESSION_MASK: u16 = 0b111;
    pub const LOG_APPEND_TIME: u16 = 1 << 3;
    pub const TRANSACTIONAL: u16 = 1 << 4;
    pub const CONTROL: u16 = 1 << 5;
    pub const KNOWN: u16 = COMPRESSION_MASK | LOG_APPEND_TIME | TRANSACTIONAL | CONTROL;
}

/// Smallest possible record: length, attributes, and four one-byte varints
/// plus the header count.
const RECORD_LEN_MIN: usize = 7;

fn u16_at(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([buf[at], buf[at + 1]])
}
fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}
fn u64_at(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

/// The decoded fixed header of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub crc: u32,
    pub batch_length: u32,
    pub base_offset: Offset,
    pub leader_epoch: LeaderEpoch,
    pub magic: u8,
    pub reserved: u8,
    pub attributes: u16,
    pub last_offset_delta: u32,
    pub first_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: u32,
}

impl BatchHeader {
    /// Decodes the header at the start of `buf`, or `None` if `buf` is
    /// shorter than [`HEADER_LEN`]. Checks nothing else.
    pub fn parse(buf: &[u8]) -> Option<BatchHeader> {
        if buf.len() < HEADER_LEN {
            return None;
        }
        Some(BatchHeader {
            crc: u32_at(buf, field::CRC),
            batch_length: u32_at(buf, field::BATCH_LENGTH),
            base_offset: Offset(u64_at(buf, field::BASE_OFFSET)),
            leader_epoch: LeaderEpoch(u32_at(buf, field::LEADER_EPOCH)),
            magic: buf[field::MAGIC],
            reserved: buf[field::RESERVED],
            attributes: u16_at(buf, field::ATTRIBUTES),
            last_offset_delta: u32_at(buf, field::LAST_OFFSET_DELTA),
            first_timestamp: u64_at(buf, field::FIRST_TIMESTAMP) as i64,
            max_timestamp: u64_at(buf, field::MAX_TIMESTAMP) as i64,
            producer_id: u64_at(buf, field::PRODUCER_ID) as i64,
            producer_epoch: u16_at(buf, field::PRODUCER_EPOCH) as i16,
            base_sequence: u32_at(buf, field::BASE_SEQUENCE) as i32,
            record_count: u32_at(buf, field::RECORD_COUNT),
        })
    }

    /// Offset of the last record in the batch.
    pub fn last_offset(&self) -> Offset {
        self.base_offset.plus(u64::from(self.last_offset_delta))
    }

    /// The offset right after this batch.
    pub fn next_offset(&self) -> Offset {
        self.last_offset().plus(1)
    }
}

/// Reads the `batch_length` field of a buffer that starts with a batch, if at
/// least 8 bytes are there. Readers use it to know how much more to read.
pub fn batch_length(buf: &[u8]) -> Option<u32> {
    (buf.len() >= field::BATCH_LENGTH + 4).then(|| u32_at(buf, field::BATCH_LENGTH))
}

/// Checks the framing of the batch that fills `buf` exactly: size, magic,
/// reserved byte and CRC. Returns the header and the CRC state of
/// `[20, len)` (used to restamp without a second pass). Does not look at the
/// records; [`validate`] does.
pub fn check_frame(buf: &[u8], max_len: usize) -> Result<(BatchHeader, crc32fast::Hasher), BatchError> {
    let header = check_header(buf)?;
    if buf.len() > max_len {
        return Err(BatchError::TooLarge {
            len: buf.len(),
            max: max_len,
        });
    }
    let mut body = crc32fast::Hasher::new();
    body.update(&buf[field::BODY..]);
    let computed = prefix_crc(&buf[field::BATCH_LENGTH..field::BODY], &body);
    if computed != header.crc {
        return Err(BatchError::CrcMismatch {
            stored: header.crc,
            computed,
        });
    }
    Ok((header, body))
}

/// The cheap part of [`check_frame`]: length field, magic and reserved
/// byte, without the CRC. Used on the read path, where the consumer checks
/// the CRC of every batch it receives.
pub fn check_header(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(buf).ok_or(BatchError::TooShort {
        len: buf.len(),
        min: HEADER_LEN,
    })?;
    if header.batch_length as usize != buf.len() {
        return Err(BatchError::LengthMismatch {
            field: header.batch_length,
            actual: buf.len(),
        });
    }
    if header.magic != MAGIC {
        return Err(BatchError::BadMagic(header.magic));
    }
    if header.reserved != 0 {
        return Err(BatchError::BadReserved(header.reserved));
    }
    Ok(header)
}

/// CRC of `prefix ++ body` given the CRC state of `body`.
fn prefix_crc(prefix: &[u8], body: &crc32fast::Hasher) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(prefix);
    h.combine(body);
    h.finalize()
}

/// Full validation of a batch from a producer: [`check_frame`], then every
/// record is parsed and the header's counts, offset deltas and max timestamp
/// must agree with the records. Returns what [`check_frame`] returns.
pub fn validate(buf: &[u8], max_len: usize) -> Result<(BatchHeader, crc32fast::Hasher), BatchError> {
    let (header, body) = check_frame(buf, max_len)?;
    if header.attributes & !attr::KNOWN != 0 {
        return Err(BatchError::BadRecord {
            index: 0,
            reason: "unknown attribute bits set",
        });
    }
    if header.attributes & attr::COMPRESSION_MASK != 0 {
        return Err(BatchError::BadRecord {
            index: 0,
            reason: "compressed batches are not supported",
        });
    }
    let declared = header.record_count;
    if declared == 0 {
        return Err(BatchError::Empty(0));
    }
    if declared as usize > (buf.len() - HEADER_LEN) / RECORD_LEN_MIN {
        return Err(BatchError::RecordCount { declared, found: 0 });
    }
    let mut pos = HEADER_LEN;
    let mut found = 0u32;
    let mut last_delta: Option<u32> = None;
    let mut max_ts = i64::MIN;
    while pos < buf.len() && found < declared {
        let raw = records::parse_record(buf, pos).map_err(|reason| BatchError::BadRecord { index: found, reason })?;
        // Deltas are dense (0, 1, 2 …): a batch spans exactly its record
        // count of offsets, so no batch can push a segment past 2^32 offsets.
        if raw.offset_delta != found {
            return Err(BatchError::OffsetDelta {
                index: found,
                delta: raw.offset_delta,
            });
        }
        last_delta = Some(raw.offset_delta);
        max_ts = max_ts.max(header.first_timestamp.saturating_add(raw.timestamp_delta));
        found += 1;
        pos = raw.end;
    }
    if found != declared {
        return Err(BatchError::RecordCount { declared, found });
    }
    if pos != buf.len() {
        return Err(BatchError::TrailingBytes(buf.len() - pos));
    }
    let last = last_delta.unwrap_or(0);
    if last != header.last_offset_delta {
        return Err(BatchError::LastOffsetDelta {
            declared: header.last_offset_delta,
            found: last,
        });
    }
    if header.attributes & attr::LOG_APPEND_TIME == 0 && max_ts != header.max_timestamp {
        return Err(BatchError::MaxTimestamp {
            declared: header.max_timestamp,
            found: max_ts,
        });
    }
    Ok((header, body))
}

/// What the broker writes into a batch when it appends it.
#[derive(Debug, Clone, Copy)]
pub struct Stamp {
    pub base_offset: Offset,
    pub leader_epoch: LeaderEpoch,
    /// `Some(now_ms)` on queues that use log-append time: every record's
    /// timestamp becomes `now_ms` (first and max timestamp are set to it and
    /// the timestamp-type bit is set).
    pub log_append_time_ms: Option<i64>,
}

/// Validates `buf` ([`validate`]), then writes the stamp into it and fixes
/// the CRC. On error `buf` is unchanged.
pub fn stamp(buf: &mut [u8], max_len: usize, stamp: Stamp) -> Result<BatchHeader, BatchError> {
    let (_, body) = validate(buf, max_len)?;
    buf[field::BASE_OFFSET..field::BASE_OFFSET + 8].copy_from_slice(&stamp.base_offset.0.to_le_bytes());
    buf[field::LEADER_EPOCH..field::LEADER_EPOCH + 4].copy_from_slice(&stamp.leader_epoch.0.to_le_bytes());
    let crc = match stamp.log_append_time_ms {
        None => prefix_crc(&buf[field::BATCH_LENGTH..field::BODY], &body),
        Some(now_ms) => {
            let attributes = u16_at(buf, field::ATTRIBUTES) | attr::LOG_APPEND_TIME;
            buf[field::ATTRIBUTES..field::ATTRIBUTES + 2].copy_from_slice(&attributes.to_le_bytes());
            buf[field::FIRST_TIMESTAMP..field::FIRST_TIMESTAMP + 8].copy_from_slice(&now_ms.to_le_bytes());
            buf[field::MAX_TIMESTAMP..field::MAX_TIMESTAMP + 8].copy_from_slice(&now_ms.to_le_bytes());
            crc32fast::hash(&buf[field::BATCH_LENGTH..])
        }
    };
    buf[field::CRC..field::CRC + 4].copy_from_slice(&crc.to_le_bytes());
    // Pair assertion: what we wrote must read back as a valid frame.
    debug_assert!(check_frame(buf, max_len).is_ok());
    BatchHeader::parse(buf).ok_or(BatchError::TooShort {
        len: buf.len(),
        min: HEADER_LEN,
    })
}

/// The batch CRC of `buf` (a whole batch) given the CRC-32 of its records
/// (bytes from [`HEADER_LEN`] on): the header is hashed, the records are
/// not read again (`crc32fast::Hasher::combine`).
pub fn crc_with_records(buf: &[u8], records_crc: u32) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&buf[field::BATCH_LENGTH..HEADER_LEN]);
    let records_len = buf.len().saturating_sub(HEADER_LEN) as u64;
    crc.combine(&crc32fast::Hasher::new_with_initial_len(records_crc, records_len));
    crc.finalize()
}

/// Writes an idempotent producer's id, epoch and base sequence into a built
/// batch and fixes its CRC, given the CRC-32 of its records (from
/// [`BatchBuilder::build_with_records_crc`]): O(header), however large the
/// batch. A producer stamps a batch when it first sends it, and again if it
/// must resend it under a new producer id.
pub fn set_producer(buf: &mut [u8], producer_id: i64, epoch: i16, base_sequence: i32, records_crc: u32) {
    buf[field::PRODUCER_ID..field::PRODUCER_ID + 8].copy_from_slice(&producer_id.to_le_bytes());
    buf[field::PRODUCER_EPOCH..field::PRODUCER_EPOCH + 2].copy_from_slice(&epoch.to_le_bytes());
    buf[field::BASE_SEQUENCE..field::BASE_SEQUENCE + 4].copy_from_slice(&base_sequence.to_le_bytes());
    let crc = crc_with_records(buf, records_crc);
    buf[field::CRC..field::CRC + 4].copy_from_slice(&crc.to_le_bytes());
}

/// A batch whose framing has been checked, over shared bytes: cloning it or
/// iterating its records never copies the payload.
#[derive(Debug, Clone)]
pub struct RecordBatch {
    header: BatchHeader,
    bytes: Bytes,
}

impl RecordBatch {
    /// Fully validates `bytes` (see [`validate`]).
    pub fn new(bytes: Bytes, max_len: usize) -> Result<RecordBatch, BatchError> {
        let (header, _) = validate(&bytes, max_len)?;
        Ok(RecordBatch { header, bytes })
    }

    /// Validates and stamps a producer's batch, then freezes it.
    pub fn stamped(mut bytes: BytesMut, max_len: usize, stamp_with: Stamp) -> Result<RecordBatch, BatchError> {
        let header = stamp(&mut bytes, max_len, stamp_with)?;
        Ok(RecordBatch {
            header,
            bytes: bytes.freeze(),
        })
    }

    pub fn header(&self) -> &BatchHeader {
        &self.header
    }
    pub fn base_offset(&self) -> Offset {
        self.header.base_offset
    }
    pub fn last_offset(&self) -> Offset {
        self.header.last_offset()
    }
    pub fn next_offset(&self) -> Offset {
        self.header.next_offset()
    }
    pub fn max_timestamp(&self) -> i64 {
        self.header.max_timestamp
    }
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    /// The batch as stored and sent.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }
    /// The records, sliced out of the shared bytes.
    pub fn records(&self) -> RecordIter {
        RecordIter::new(self.bytes.clone(), self.header)
    }
}

#[cfg(test)]
mod tests;
