//! The sans-I/O scanner at the heart of recovery and of every disk read:
//! given bytes that should start with a batch, it says whether a whole valid
//! batch is there, how many more bytes it needs, or why the log ends here.
//!
//! Runs on: the shard that opens or reads a log. No I/O: the callers read
//! the bytes; that keeps this fuzzable (`fuzz/`) and exhaustively testable.

use crate::batch::{self, BatchHeader, HEADER_LEN};
use crate::Offset;

/// A valid batch found by the scanner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScannedBatch {
    /// File position of the batch's first byte.
    pub position: u64,
    pub header: BatchHeader,
}

impl ScannedBatch {
    pub fn len(&self) -> u64 {
        u64::from(self.header.batch_length)
    }
    pub fn is_empty(&self) -> bool {
        self.header.batch_length == 0
    }
    /// File position right after the batch.
    pub fn end(&self) -> u64 {
        self.position + self.len()
    }
}

/// Why the valid part of a log ends where it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanEnd {
    /// The file ends exactly after the last batch.
    Clean,
    /// Zeros follow the last batch (pre-zeroed or padded space, never written).
    ZeroTail,
    /// The last batch was cut short by the end of the file (a torn write).
    Torn(String),
    /// Bytes are there but are not a valid batch, or the batch's offset does
    /// not follow its predecessor's.
    Corrupt(String),
    /// A valid batch from before the expected offset: the old contents of a
    /// recycled segment file (see the log's "Recycling"), never written over.
    Stale(String),
}

/// One step of a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanStep {
    Batch(ScannedBatch),
    /// The buffer holds only part of the next batch; read at least this many
    /// bytes from the same position and scan again.
    NeedMore(usize),
    End(ScanEnd),
}

/// Looks at the bytes `buf` found at file position `position`. `at_eof`
/// says whether the file ends where `buf` ends. `expected` is the offset
/// the next batch must start at (if known).
pub fn scan_one(buf: &[u8], position: u64, at_eof: bool, expected: Option<Offset>, batch_bytes_max: usize) -> ScanStep {
    scan_one_with(buf, position, at_eof, expected, batch_bytes_max, true)
}

/// [`scan_one`], with the CRC check optional: reads skip it (the consumer
/// checks every batch's CRC) and check only the framing and offsets.
pub fn scan_one_with(
    buf: &[u8],
    position: u64,
    at_eof: bool,
    expected: Option<Offset>,
    batch_bytes_max: usize,
    check_crc: bool,
) -> ScanStep {
    if buf.is_empty() {
        return if at_eof {
            ScanStep::End(ScanEnd::Clean)
        } else {
            ScanStep::NeedMore(HEADER_LEN)
        };
    }
    let Some(len) = batch::batch_length(buf) else {
        return if !at_eof {
            ScanStep::NeedMore(HEADER_LEN)
        } else if buf.iter().all(|&b| b == 0) {
            ScanStep::End(ScanEnd::ZeroTail)
        } else {
            ScanStep::End(ScanEnd::Torn(format!("{} stray bytes at the end", buf.len())))
        };
    };
    if len == 0 {
        return if buf[..8].iter().all(|&b| b == 0) {
            ScanStep::End(ScanEnd::ZeroTail)
        } else {
            ScanStep::End(ScanEnd::Corrupt("batch length 0 with a non-zero CRC".into()))
        };
    }
    let len = len as usize;
    if len < HEADER_LEN || len > batch_bytes_max {
        return ScanStep::End(ScanEnd::Corrupt(format!(
            "batch length {len} outside [{HEADER_LEN}, {batch_bytes_max}]"
        )));
    }
    if buf.len() < len {
        return if at_eof {
            ScanStep::End(ScanEnd::Torn(format!("batch of {len} bytes cut at {}", buf.len())))
        } else {
            ScanStep::NeedMore(len)
        };
    }
    let checked = if check_crc {
        batch::check_frame(&buf[..len], batch_bytes_max).map(|(h, _)| h)
    } else {
        batch::check_header(&buf[..len])
    };
    match checked {
        Err(e) => ScanStep::End(ScanEnd::Corrupt(e.to_string())),
        Ok(header) => match expected {
            Some(want) if header.base_offset < want => ScanStep::End(ScanEnd::Stale(format!(
                "batch of offset {} where {want} was expected",
                header.base_offset
            ))),
            Some(want) if header.base_offset != want => ScanStep::End(ScanEnd::Corrupt(format!(
                "batch starts at offset {} but {want} was expected",
                header.base_offset
            ))),
            _ => ScanStep::Batch(ScannedBatch { position, header }),
        },
    }
}

/// The outcome of scanning a whole in-memory buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanAll {
    pub batches: Vec<ScannedBatch>,
    /// Position right after the last valid batch: where the log ends.
    pub valid_end: u64,
    pub end: ScanEnd,
}

/// Scans `buf` (a whole file from `start`, or its tail) to its end.
pub fn scan_all(buf: &[u8], start: u64, mut expected: Option<Offset>, batch_bytes_max: usize) -> ScanAll {
    let mut at = 0usize;
    let mut batches = Vec::new();
    loop {
        match scan_one(&buf[at..], start + at as u64, true, expected, batch_bytes_max) {
            ScanStep::Batch(b) => {
                at += b.len() as usize;
                expected = Some(b.header.next_offset());
                batches.push(b);
            }
            ScanStep::End(end) => {
                return ScanAll {
                    batches,
                    valid_end: start + at as u64,
                    end,
                }
            }
            ScanStep::NeedMore(_) => unreachable!("at_eof scans never ask for more"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchBuilder;

    const MAX: usize = 1 << 20;

    /// Three stamped batches back to back, and the end position of each.
    fn log_bytes() -> (Vec<u8>, Vec<u64>) {
        let mut out = Vec::new();
        let mut ends = Vec::new();
        let mut next = 0u64;
        for n in 1..=3u8 {
            let mut b = BatchBuilder::new();
            for i in 0..n {
                b.push(Some(&[i]), Some(&[n; 100]), &[], 1000 + i64::from(i));
            }
            let batch = crate::testkit::stamp_at(b.build(), next);
            next = batch.next_offset().0;
            out.extend_from_slice(batch.bytes());
            ends.push(out.len() as u64);
        }
        (out, ends)
    }

    #[test]
    fn clean_zero_and_torn_ends() {
        let (log, ends) = log_bytes();
        let all = scan_all(&log, 0, Some(Offset(0)), MAX);
        assert_eq!(
            (all.batches.len(), all.valid_end, all.end.clone()),
            (3, ends[2], ScanEnd::Clean)
        );

        let mut zeroed = log.clone();
        zeroed.extend_from_slice(&[0u8; 5000]);
        let all = scan_all(&zeroed, 0, Some(Offset(0)), MAX);
        assert_eq!((all.valid_end, all.end), (ends[2], ScanEnd::ZeroTail));

        // A tail torn at every byte of the last batch ends the log right after
        // the second batch.
        for cut in ends[1] + 1..ends[2] {
            let all = scan_all(&log[..cut as usize], 0, Some(Offset(0)), MAX);
            assert_eq!(all.valid_end, ends[1], "cut at {cut}");
            assert!(matches!(
                all.end,
                ScanEnd::Torn(_) | ScanEnd::ZeroTail | ScanEnd::Corrupt(_)
            ));
        }
    }

    #[test]
    fn offset_gaps_are_corrupt_and_older_offsets_stale() {
        let (log, ends) = log_bytes();
        // A batch past the expected offset: records are missing.
        let all = scan_all(&log[ends[0] as usize..], ends[0], Some(Offset(0)), MAX);
        assert_eq!(all.valid_end, ends[0]);
        assert!(matches!(all.end, ScanEnd::Corrupt(_)), "{:?}", all.end);
        // A batch before it: a recycled file's old contents.
        let all = scan_all(&log, 0, Some(Offset(5)), MAX);
        assert_eq!(all.valid_end, 0);
        assert!(matches!(all.end, ScanEnd::Stale(_)), "{:?}", all.end);
        // Starting at the second batch with the right expectation works.
        let all = scan_all(&log[ends[0] as usize..], ends[0], Some(Offset(1)), MAX);
        assert_eq!((all.batches.len(), all.valid_end), (2, ends[2]));
    }

    #[test]
    fn partial_buffers_ask_for_more() {
        let (log, ends) = log_bytes();
        assert_eq!(scan_one(&log[..4], 0, false, None, MAX), ScanStep::NeedMore(HEADER_LEN));
        assert_eq!(
            scan_one(&log[..70], 0, false, None, MAX),
            ScanStep::NeedMore(ends[0] as usize)
        );
    }
}
