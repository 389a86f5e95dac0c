//! Building a batch on the producer side.

use bytes::BytesMut;

use super::{attr, field, HEADER_LEN, MAGIC};
use crate::varint;

/// Accumulates records and produces the bytes of one batch, base offset 0 and
/// leader epoch 0 (the broker stamps both).
///
/// ```
/// use strand_wire::batch::{BatchBuilder, RecordBatch};
/// let mut b = BatchBuilder::new();
/// b.push(Some(b"user-7"), Some(b"hello"), &[(b"trace", Some(b"abc"))], 1_700_000_000_000);
/// let batch = RecordBatch::new(b.build().freeze(), 1 << 20).unwrap();
/// assert_eq!(batch.records().next().unwrap().value.as_deref(), Some(&b"hello"[..]));
/// ```
#[derive(Debug)]
pub struct BatchBuilder {
    buf: Vec<u8>,
    count: u32,
    first_timestamp: i64,
    max_timestamp: i64,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    attributes: u16,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl BatchBuilder {
    pub fn new() -> BatchBuilder {
        Self::with_capacity(4096)
    }

    pub fn with_capacity(bytes: usize) -> BatchBuilder {
        let mut buf = Vec::with_capacity(bytes.max(HEADER_LEN));
        buf.resize(HEADER_LEN, 0);
        BatchBuilder {
            buf,
            count: 0,
            first_timestamp: 0,
            max_timestamp: i64::MIN,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            attributes: 0,
        }
    }

    /// Marks the batch as coming from an idempotent producer.
    pub fn producer(&mut self, id: i64, epoch: i16, base_sequence: i32) -> &mut Self {
        self.producer_id = id;
        self.producer_epoch = epoch;
        self.base_sequence = base_sequence;
        self
    }

    /// Sets the transactional attribute bit.
    pub fn transactional(&mut self, on: bool) -> &mut Self {
        if on {
            self.attributes |= attr::TRANSACTIONAL;
        } else {
            self.attributes &= !attr::TRANSACTIONAL;
        }
        self
    }

    /// Records pushed so far.
    pub fn len(&self) -> u32 {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// Bytes the batch would have if built now.
    pub fn size_bytes(&self) -> usize {
        self.buf.len()
    }

    /// Bytes a record would add to the batch.
    pub fn record_size(key: Option<&[u8]>, value: Option<&[u8]>, headers: &[(&[u8], Option<&[u8]>)]) -> usize {
        // Offset and timestamp deltas are guessed at their largest common size.
        let body = record_body_len(i64::MAX >> 20, u32::MAX >> 8, key, value, headers);
        varint::len_u64(body as u64) + body
    }

    /// Appends a record with the given timestamp (ms since the Unix epoch).
    pub fn push(
        &mut self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&[u8], Option<&[u8]>)],
        timestamp_ms: i64,
    ) {
        if self.count == 0 {
            self.first_timestamp = timestamp_ms;
        }
        self.max_timestamp = self.max_timestamp.max(timestamp_ms);
        let ts_delta = timestamp_ms.saturating_sub(self.first_timestamp);
        // Written in place: the body's length is computed first, so the
        // payload is copied once.
        let body = record_body_len(ts_delta, self.count, key, value, headers);
        let s = &mut self.buf;
        s.reserve(varint::len_u64(body as u64) + body);
        varint::put_u64(s, body as u64);
        let start = s.len();
        s.push(0); // record attributes
        varint::put_i64(s, ts_delta);
        varint::put_u64(s, u64::from(self.count));
        put_nullable(s, key);
        put_nullable(s, value);
        varint::put_u64(s, headers.len() as u64);
        for (k, v) in headers {
            varint::put_u64(s, k.len() as u64);
            s.extend_from_slice(k);
            put_nullable(s, *v);
        }
        debug_assert_eq!(s.len() - start, body);
        self.count += 1;
    }

    /// Finishes the batch. Panics if no record was pushed (an empty batch is
    /// not a valid batch).
    pub fn build(self) -> BytesMut {
        self.build_with_records_crc().0
    }

    /// [`build`](Self::build), also returning the CRC-32 of the records
    /// (bytes from [`HEADER_LEN`] on), with which [`super::set_producer`]
    /// can restamp the producer fields later without reading them again.
    pub fn build_with_records_crc(self) -> (BytesMut, u32) {
        assert!(self.count > 0, "a batch holds at least one record");
        let mut buf = self.buf;
        let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        buf[field::BATCH_LENGTH..field::BATCH_LENGTH + 4].copy_from_slice(&len.to_le_bytes());
        buf[field::MAGIC] = MAGIC;
        buf[field::ATTRIBUTES..field::ATTRIBUTES + 2].copy_from_slice(&self.attributes.to_le_bytes());
        buf[field::LAST_OFFSET_DELTA..field::LAST_OFFSET_DELTA + 4].copy_from_slice(&(self.count - 1).to_le_bytes());
        buf[field::FIRST_TIMESTAMP..field::FIRST_TIMESTAMP + 8].copy_from_slice(&self.first_timestamp.to_le_bytes());
        buf[field::MAX_TIMESTAMP..field::MAX_TIMESTAMP + 8].copy_from_slice(&self.max_timestamp.to_le_bytes());
        buf[field::PRODUCER_ID..field::PRODUCER_ID + 8].copy_from_slice(&self.producer_id.to_le_bytes());
        buf[field::PRODUCER_EPOCH..field::PRODUCER_EPOCH + 2].copy_from_slice(&self.producer_epoch.to_le_bytes());
        buf[field::BASE_SEQUENCE..field::BASE_SEQUENCE + 4].copy_from_slice(&self.base_sequence.to_le_bytes());
        buf[field::RECORD_COUNT..field::RECORD_COUNT + 4].copy_from_slice(&self.count.to_le_bytes());
        let records_crc = crc32fast::hash(&buf[HEADER_LEN..]);
        let crc = super::crc_with_records(&buf, records_crc);
        buf[field::CRC..field::CRC + 4].copy_from_slice(&crc.to_le_bytes());
        // A uniquely owned Vec converts without a copy.
        let built = match bytes::Bytes::from(buf).try_into_mut() {
            Ok(unique) => unique,
            Err(shared) => BytesMut::from(&shared[..]),
        };
        (built, records_crc)
    }
}

fn put_nullable(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => varint::put_i64(out, -1),
        Some(b) => {
            varint::put_i64(out, b.len() as i64);
            out.extend_from_slice(b);
        }
    }
}

fn nullable_len(bytes: Option<&[u8]>) -> usize {
    bytes.map_or(1, |b| varint::len_i64(b.len() as i64) + b.len())
}

fn record_body_len(
    ts_delta: i64,
    offset_delta: u32,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&[u8], Option<&[u8]>)],
) -> usize {
    1 + varint::len_i64(ts_delta)
        + varint::len_u64(u64::from(offset_delta))
        + nullable_len(key)
        + nullable_len(value)
        + varint::len_u64(headers.len() as u64)
        + headers
            .iter()
            .map(|(k, v)| varint::len_u64(k.len() as u64) + k.len() + nullable_len(*v))
            .sum::<usize>()
}
