//! Reading records out of a batch without copying: every key, value and
//! header is a `Bytes` slice of the batch's shared buffer.

use std::ops::Range;

use bytes::Bytes;

use super::{BatchHeader, HEADER_LEN};
use crate::varint;
use crate::Offset;

/// One record of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub offset: Offset,
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: HeaderIter,
}

/// One record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub key: Bytes,
    pub value: Option<Bytes>,
}

/// Where the parts of one record lie in its batch (positions into the batch).
#[derive(Debug)]
pub(crate) struct RawRecord {
    pub timestamp_delta: i64,
    pub offset_delta: u32,
    pub key: Option<Range<usize>>,
    pub value: Option<Range<usize>>,
    pub headers: Range<usize>,
    pub header_count: u32,
    /// Position right after the record.
    pub end: usize,
}

/// A cursor over a byte slice that fails softly with a reason.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    #[inline]
    fn u64(&mut self, what: &'static str) -> Result<u64, &'static str> {
        let (v, used) = varint::get_u64(&self.buf[self.pos..]).ok_or(what)?;
        self.pos += used;
        Ok(v)
    }
    #[inline]
    fn i64(&mut self, what: &'static str) -> Result<i64, &'static str> {
        let (v, used) = varint::get_i64(&self.buf[self.pos..]).ok_or(what)?;
        self.pos += used;
        Ok(v)
    }
    #[inline]
    fn take(&mut self, len: usize, what: &'static str) -> Result<Range<usize>, &'static str> {
        if len > self.buf.len() - self.pos {
            return Err(what);
        }
        let range = self.pos..self.pos + len;
        self.pos += len;
        Ok(range)
    }
    /// A zig-zag length where -1 means "absent".
    #[inline]
    fn nullable(&mut self, what: &'static str) -> Result<Option<Range<usize>>, &'static str> {
        match self.i64(what)? {
            -1 => Ok(None),
            n if n < 0 => Err(what),
            n => self.take(n as usize, what).map(Some),
        }
    }
}

/// Parses the record at `pos` of `batch`; the record must end inside `batch`.
#[inline]
pub(crate) fn parse_record(batch: &[u8], pos: usize) -> Result<RawRecord, &'static str> {
    let mut outer = Cursor { buf: batch, pos };
    let len = outer.u64("record length is not a varint")?;
    let body = outer.take(
        usize::try_from(len).map_err(|_| "record length overflows")?,
        "record runs past the batch end",
    )?;
    // Parse inside the record's own bounds so a field cannot spill over.
    let mut c = Cursor {
        buf: &batch[..body.end],
        pos: body.start,
    };
    let attributes = *batch.get(c.pos).ok_or("record has no attributes byte")?;
    if attributes != 0 {
        return Err("record attributes must be 0");
    }
    c.pos += 1;
    let timestamp_delta = c.i64("bad timestamp delta")?;
    let offset_delta = u32::try_from(c.u64("bad offset delta")?).map_err(|_| "offset delta over u32")?;
    let key = c.nullable("bad key length")?;
    let value = c.nullable("bad value length")?;
    let header_count = u32::try_from(c.u64("bad header count")?).map_err(|_| "header count over u32")?;
    let headers_start = c.pos;
    for _ in 0..header_count {
        let key_len = c.u64("bad header key length")?;
        c.take(
            usize::try_from(key_len).map_err(|_| "header key length overflows")?,
            "header key runs past the record",
        )?;
        c.nullable("bad header value length")?;
    }
    if c.pos != body.end {
        return Err("record length does not match its fields");
    }
    Ok(RawRecord {
        timestamp_delta,
        offset_delta,
        key,
        value,
        headers: headers_start..body.end,
        header_count,
        end: body.end,
    })
}

/// Iterator over the records of a batch whose framing was checked. A record
/// that fails to parse (possible only for batches that skipped [`super::validate`])
/// ends the iteration.
#[derive(Debug, Clone)]
pub struct RecordIter {
    bytes: Bytes,
    header: BatchHeader,
    pos: usize,
    remaining: u32,
}

impl RecordIter {
    pub(crate) fn new(bytes: Bytes, header: BatchHeader) -> RecordIter {
        RecordIter {
            bytes,
            header,
            pos: HEADER_LEN,
            remaining: header.record_count,
        }
    }
}

impl Iterator for RecordIter {
    type Item = Record;

    #[inline]
    fn next(&mut self) -> Option<Record> {
        if self.remaining == 0 || self.pos >= self.bytes.len() {
            return None;
        }
        let raw = parse_record(&self.bytes, self.pos).ok()?;
        self.pos = raw.end;
        self.remaining -= 1;
        let timestamp = if self.header.attributes & super::attr::LOG_APPEND_TIME != 0 {
            self.header.max_timestamp
        } else {
            self.header.first_timestamp.saturating_add(raw.timestamp_delta)
        };
        Some(Record {
            offset: self.header.base_offset.plus(u64::from(raw.offset_delta)),
            timestamp,
            key: raw.key.map(|r| self.bytes.slice(r)),
            value: raw.value.map(|r| self.bytes.slice(r)),
            headers: HeaderIter {
                bytes: self.bytes.slice(raw.headers),
                remaining: raw.header_count,
            },
        })
    }
}

/// Iterator over a record's headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderIter {
    bytes: Bytes,
    remaining: u32,
}

impl HeaderIter {
    pub fn len(&self) -> usize {
        self.remaining as usize
    }
    pub fn is_empty(&self) -> bool {
        self.remaining == 0
    }
}

impl Iterator for HeaderIter {
    type Item = Header;

    fn next(&mut self) -> Option<Header> {
        if self.remaining == 0 {
            return None;
        }
        let mut c = Cursor {
            buf: &self.bytes,
            pos: 0,
        };
        let key_len = c.u64("").ok()?;
        let key = c.take(usize::try_from(key_len).ok()?, "").ok()?;
        let value = c.nullable("").ok()?;
        let key = self.bytes.slice(key);
        let value = value.map(|r| self.bytes.slice(r));
        self.bytes = self.bytes.slice(c.pos..);
        self.remaining -= 1;
        Some(Header { key, value })
    }
}
