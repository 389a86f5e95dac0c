//! The small files beside a partition's segments that carry replication
//! state across restarts, their byte layouts, and how they are written.
//!
//! Runs on: the shard that owns the log.
//!
//! # `leader-epochs` (the [`EpochHistory`])
//! All integers little-endian; 12 + 12·N bytes:
//!
//! | bytes          | field                                                  |
//! |----------------|--------------------------------------------------------|
//! | 0..4           | magic `SLE1`                                           |
//! | 4..8           | N, the entry count (u32)                               |
//! | 8 + 12i ..+4   | entry i: leader epoch (u32)                            |
//! | 12 + 12i ..+8  | entry i: its first offset (u64)                        |
//! | 8 + 12N ..+4   | CRC-32 (IEEE, `crc32fast`) of every byte before it     |
//!
//! Entries strictly increase in epoch and in offset.
//!
//! # `high-watermark`
//! 16 bytes: magic `SHW1` (0..4), the high watermark (u64, 4..12), CRC-32
//! of bytes 0..12 (12..16).
//!
//! # `<offset>.producers` (a [`ProducerTable`] snapshot)
//! The name is the log end the table stood at, 20 decimal digits (like a
//! segment's). All integers little-endian:
//!
//! | bytes      | field                                                      |
//! |------------|------------------------------------------------------------|
//! | 0..4       | magic `SPT1`                                               |
//! | 4..12      | the log end the snapshot was taken at (u64)                |
//! | 12..16     | P, the producer count (u32, ≤ `MAX_PRODUCERS`)             |
//! | then P ×   | a producer: its id (i64, ≥ 0), B its batch count (u8,     |
//! |            | 1..=`WINDOW`), then B × 32 bytes, oldest batch first:      |
//! |            | first sequence (i32), last sequence (i32), base offset     |
//! |            | (u64), last offset (u64), max timestamp (i64)              |
//! | last 4     | CRC-32 of every byte before it                             |
//!
//! Producers appear least recently used first, each once; sequences are
//! non-negative, and every batch lies below the snapshot's offset.
//!
//! # `__directory` (the data directory's id)
//! 16 bytes: magic `SDI1` (0..4), the id (u64, little-endian, 4..12, never
//! 0), CRC-32 of bytes 0..12 (12..16). Written once, when a broker first
//! starts on an empty data directory, durably (the same temporary file,
//! fdatasync, rename and directory fsync as below). The controller
//! records each broker's id and takes a new one for a lost disk (KIP-858's
//! directory ids): every replica the broker held is gone. Unlike the
//! files above, one that fails its checks is not read as absent: the
//! broker refuses to start and names it (a new id would declare the
//! directory's data lost).
//!
//! # Writing
//! Whole, to `NAME.tmp`, then renamed over `NAME`. The epoch history is
//! written durably (the temporary file fdatasync'd before the rename, the
//! directory fsync'd after): a crash leaves the old file or the new one,
//! and a truncation's history is on disk before anything is appended after
//! it. The high watermark (every 5 s, and no higher than what the log
//! holds durably) and producer snapshots are written durably too: an open
//! that finds the log below its checkpointed high watermark lost
//! committed records (`Log::damage`), and a producer table rebuilt
//! without its snapshots forgets producers.
//! A file that fails any check reads as absent: the log rebuilds its
//! epochs from the batch headers, and a high watermark it cannot read is
//! the log start (that only hides records until replication moves it
//! again; it never shows one that was not committed).

use std::path::Path;

use crate::epochs::{EpochHistory, EpochStart};
use crate::error::{Result, StorageError};
use crate::producers::{ProducerBatches, ProducerTable, MAX_PRODUCERS, WINDOW};
use crate::segment::io::{read_small_file, sync_dir};
use crate::{LeaderEpoch, Offset};

/// The leader-epoch checkpoint's file name.
pub const EPOCHS_FILE: &str = "leader-epochs";
/// The high-watermark checkpoint's file name.
pub const HIGH_WATERMARK_FILE: &str = "high-watermark";
/// Present (empty) while a log is closed cleanly: written last by
/// `Log::close`, removed first by `Log::open`. Without it an open checks
/// every batch of the active segment, not just those after its last index
/// entry.
pub const CLEAN_CLOSE_FILE: &str = "closed-cleanly";
/// Present while a log's open found that it lost records it had made
/// durable (`Log::damage`): UTF-8 text saying what, removed once the
/// broker took the replica out of the ISR.
pub const DAMAGE_FILE: &str = "damaged";

const EPOCHS_MAGIC: &[u8; 4] = b"SLE1";
const HIGH_WATERMARK_MAGIC: &[u8; 4] = b"SHW1";
const PRODUCERS_MAGIC: &[u8; 4] = b"SPT1";
const DIRECTORY_ID_MAGIC: &[u8; 4] = b"SDI1";

/// The data directory id's file name (in the data directory itself).
pub const DIRECTORY_ID_FILE: &str = "__directory";

/// The file name of the producer snapshot taken at log end `offset`.
pub fn producers_file_name(offset: Offset) -> String {
    format!("{:020}.producers", offset.0)
}

/// The offset a producer snapshot's file name carries.
pub fn parse_producers_file_name(name: &str) -> Option<Offset> {
    crate::segment::parse_offset_file_name(name, ".producers")
}

/// The `leader-epochs` file's bytes.
pub fn encode_epochs(history: &EpochHistory) -> Vec<u8> {
    let entries = history.entries();
    let mut out = Vec::with_capacity(12 + 12 * entries.len());
    out.extend_from_slice(EPOCHS_MAGIC);
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e.epoch.0.to_le_bytes());
        out.extend_from_slice(&e.start.0.to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads a `leader-epochs` file's bytes, or says why they are not one.
pub fn decode_epochs(bytes: &[u8]) -> Result<EpochHistory, String> {
    let body = checked_body(bytes, EPOCHS_MAGIC, 12)?;
    let count = u32::from_le_bytes(word(body, 4)) as usize;
    if body.len() != 8 + 12 * count {
        return Err(format!("{} bytes for {count} entries", bytes.len()));
    }
    let entries = (0..count)
        .map(|i| {
            let at = 8 + 12 * i;
            EpochStart {
                epoch: LeaderEpoch(u32::from_le_bytes(word(body, at))),
                start: Offset(u64::from_le_bytes(long(body, at + 4))),
            }
        })
        .collect();
    EpochHistory::from_entries(entries)
}

/// The `high-watermark` file's bytes.
pub fn encode_high_watermark(offset: Offset) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(HIGH_WATERMARK_MAGIC);
    out.extend_from_slice(&offset.0.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads a `high-watermark` file's bytes, or says why they are not one.
pub fn decode_high_watermark(bytes: &[u8]) -> Result<Offset, String> {
    let body = checked_body(bytes, HIGH_WATERMARK_MAGIC, 16)?;
    if body.len() != 12 {
        return Err(format!("{} bytes, not 16", bytes.len()));
    }
    Ok(Offset(u64::from_le_bytes(long(body, 4))))
}

/// The `__directory` file's bytes for id `id`.
pub fn encode_directory_id(id: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(DIRECTORY_ID_MAGIC);
    out.extend_from_slice(&id.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads a `__directory` file's bytes, or says why they are not one.
pub fn decode_directory_id(bytes: &[u8]) -> Result<u64, String> {
    let body = checked_body(bytes, DIRECTORY_ID_MAGIC, 16)?;
    if body.len() != 12 {
        return Err(format!("{} bytes, not 16", bytes.len()));
    }
    match u64::from_le_bytes(long(body, 4)) {
        0 => Err("id 0 (never written)".into()),
        id => Ok(id),
    }
}

/// A producer snapshot's bytes: `table` as it stood at log end `offset`.
pub fn encode_producers(offset: Offset, table: &ProducerTable) -> Vec<u8> {
    let entries = table.entries();
    let mut out = Vec::with_capacity(20 + entries.len() * (9 + 32 * WINDOW));
    out.extend_from_slice(PRODUCERS_MAGIC);
    out.extend_from_slice(&offset.0.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for p in &entries {
        out.extend_from_slice(&p.producer_id.to_le_bytes());
        out.push(p.batches.len() as u8);
        for (first, last, (base, last_offset, max_timestamp)) in &p.batches {
            out.extend_from_slice(&first.to_le_bytes());
            out.extend_from_slice(&last.to_le_bytes());
            out.extend_from_slice(&base.to_le_bytes());
            out.extend_from_slice(&last_offset.to_le_bytes());
            out.extend_from_slice(&max_timestamp.to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads a producer snapshot's bytes: (the log end it was taken at, the
/// table), or says why they are not one.
pub fn decode_producers(bytes: &[u8]) -> Result<(Offset, ProducerTable), String> {
    let body = checked_body(bytes, PRODUCERS_MAGIC, 20)?;
    let offset = u64::from_le_bytes(long(body, 4));
    let count = u32::from_le_bytes(word(body, 12)) as usize;
    if count > MAX_PRODUCERS {
        return Err(format!("{count} producers, more than {MAX_PRODUCERS}"));
    }
    let mut at = 16;
    let mut seen = std::collections::HashSet::with_capacity(count);
    let mut entries = Vec::with_capacity(count);
    for i in 0..count {
        let head = body
            .get(at..at + 9)
            .ok_or_else(|| format!("cut in producer {i} of {count}"))?;
        let producer_id = i64::from_le_bytes(long(head, 0));
        let n = usize::from(head[8]);
        if producer_id < 0 || !seen.insert(producer_id) {
            return Err(format!("producer id {producer_id}: negative or repeated"));
        }
        if n == 0 || n > WINDOW {
            return Err(format!("producer {producer_id}: {n} batches (1..={WINDOW})"));
        }
        at += 9;
        let rows = body
            .get(at..at + 32 * n)
            .ok_or_else(|| format!("cut in producer {producer_id}'s batches"))?;
        at += 32 * n;
        let batches = rows
            .chunks_exact(32)
            .map(|r| {
                let first = i32::from_le_bytes(word(r, 0));
                let last = i32::from_le_bytes(word(r, 4));
                let (base, last_offset) = (u64::from_le_bytes(long(r, 8)), u64::from_le_bytes(long(r, 16)));
                let max_timestamp = i64::from_le_bytes(long(r, 24));
                if first < 0 || last < 0 || base > last_offset || last_offset >= offset {
                    return Err(format!(
                        "producer {producer_id}: batch {first}..={last} at {base}..={last_offset} is not a \
                         stored batch below {offset}"
                    ));
                }
                Ok((first, last, (base, last_offset, max_timestamp)))
            })
            .collect::<Result<Vec<_>, String>>()?;
        entries.push(ProducerBatches { producer_id, batches });
    }
    if at != body.len() {
        return Err(format!("{} bytes after the last producer", body.len() - at));
    }
    Ok((Offset(offset), ProducerTable::from_entries(entries)))
}

/// The bytes before the CRC, once the length, magic and CRC check out.
fn checked_body<'a>(bytes: &'a [u8], magic: &[u8; 4], min_len: usize) -> Result<&'a [u8], String> {
    if bytes.len() < min_len {
        return Err(format!("{} bytes: too short", bytes.len()));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if &body[..4] != magic {
        return Err("not this kind of checkpoint (magic)".into());
    }
    let stored = u32::from_le_bytes(word(crc, 0));
    if crc32fast::hash(body) != stored {
        return Err("CRC mismatch".into());
    }
    Ok(body)
}

fn word(bytes: &[u8], at: usize) -> [u8; 4] {
    let mut w = [0; 4];
    w.copy_from_slice(&bytes[at..at + 4]);
    w
}

fn long(bytes: &[u8], at: usize) -> [u8; 8] {
    let mut w = [0; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    w
}

/// Replaces `dir/name` with `bytes` (see the module doc); `durable`: a
/// crash leaves the old file or the new one, and the new one once this
/// returns.
pub(crate) async fn write_atomically(dir: &Path, name: &str, bytes: Vec<u8>, durable: bool) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let file = glommio::io::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .buffered_open(&tmp)
        .await
        .map_err(|e| StorageError::glommio("opening", &tmp, e))?;
    file.write_at(bytes, 0)
        .await
        .map_err(|e| StorageError::glommio("writing", &tmp, e))?;
    if durable {
        file.fdatasync()
            .await
            .map_err(|e| StorageError::glommio("syncing", &tmp, e))?;
    }
    file.close()
        .await
        .map_err(|e| StorageError::glommio("closing", &tmp, e))?;
    let path = dir.join(name);
    glommio::io::rename(&tmp, &path)
        .await
        .map_err(|e| StorageError::glommio("renaming", &path, e))?;
    match durable {
        true => sync_dir(dir).await,
        false => Ok(()),
    }
}

/// What `dir/name` holds, decoded; `None` when it is absent or fails its
/// checks (the reason is logged).
pub(crate) async fn read<T>(dir: &Path, name: &str, decode: fn(&[u8]) -> Result<T, String>) -> Result<Option<T>> {
    let path = dir.join(name);
    let Some(bytes) = read_small_file(&path).await? else {
        return Ok(None);
    };
    match decode(&bytes) {
        Ok(v) => Ok(Some(v)),
        Err(why) => {
            tracing::warn!("ignoring {}: {why}", path.display());
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_ids_round_trip_and_every_corruption_is_caught() {
        let bytes = encode_directory_id(0x0123_4567_89ab_cdef);
        assert_eq!(bytes.len(), 16);
        assert_eq!(&bytes[..12], b"SDI1\xef\xcd\xab\x89\x67\x45\x23\x01");
        assert_eq!(decode_directory_id(&bytes), Ok(0x0123_4567_89ab_cdef));
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut bad = bytes.clone();
                bad[i] ^= 1 << bit;
                assert!(decode_directory_id(&bad).is_err(), "byte {i} bit {bit}");
            }
        }
        for len in 0..bytes.len() {
            assert!(decode_directory_id(&bytes[..len]).is_err(), "cut at {len}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_directory_id(&longer).is_err());
        assert!(decode_directory_id(&encode_directory_id(0))
            .unwrap_err()
            .contains("id 0"));
        // Another checkpoint's bytes are not a directory id.
        assert!(decode_directory_id(&encode_high_watermark(Offset(5))).is_err());
    }

    #[test]
    fn epochs_round_trip_and_every_corruption_is_caught() {
        let h = EpochHistory::from_entries(vec![
            EpochStart {
                epoch: LeaderEpoch(0),
                start: Offset(0),
            },
            EpochStart {
                epoch: LeaderEpoch(4),
                start: Offset(1 << 40),
            },
        ])
        .unwrap();
        let bytes = encode_epochs(&h);
        assert_eq!(bytes.len(), 12 + 24);
        assert_eq!(&bytes[..8], b"SLE1\x02\0\0\0");
        assert_eq!(decode_epochs(&bytes), Ok(h));
        assert_eq!(
            decode_epochs(&encode_epochs(&EpochHistory::new())),
            Ok(EpochHistory::new())
        );
        // Any flipped bit, any cut.
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut bad = bytes.clone();
                bad[i] ^= 1 << bit;
                assert!(decode_epochs(&bad).is_err(), "byte {i} bit {bit}");
            }
        }
        for len in 0..bytes.len() {
            assert!(decode_epochs(&bytes[..len]).is_err(), "cut at {len}");
        }
        // A well-formed file whose entries break the order is refused too.
        let mut disordered = b"SLE1\x02\0\0\0".to_vec();
        for (epoch, start) in [(3u32, 10u64), (2, 20)] {
            disordered.extend_from_slice(&epoch.to_le_bytes());
            disordered.extend_from_slice(&start.to_le_bytes());
        }
        let crc = crc32fast::hash(&disordered);
        disordered.extend_from_slice(&crc.to_le_bytes());
        assert!(decode_epochs(&disordered).unwrap_err().contains("out of order"));
    }

    /// (first sequence, last sequence, base offset, last offset).
    type Row = (i32, i32, u64, u64);

    fn table(producers: &[(i64, &[Row])]) -> ProducerTable {
        ProducerTable::from_entries(
            producers
                .iter()
                .map(|(id, batches)| ProducerBatches {
                    producer_id: *id,
                    batches: batches.iter().map(|&(f, l, b, e)| (f, l, (b, e, -5))).collect(),
                })
                .collect(),
        )
    }

    #[test]
    fn producer_snapshots_round_trip_and_every_corruption_is_caught() {
        let t = table(&[(3, &[(0, 4, 0, 4), (5, 5, 9, 9)]), (i64::MAX, &[(i32::MAX, 2, 10, 13)])]);
        let bytes = encode_producers(Offset(14), &t);
        assert_eq!(bytes.len(), 16 + (9 + 64) + (9 + 32) + 4);
        assert_eq!(&bytes[..4], b"SPT1");
        let (offset, back) = decode_producers(&bytes).unwrap();
        assert_eq!(offset, Offset(14));
        assert_eq!(
            back.entries(),
            t.entries(),
            "least recently used first, batches oldest first"
        );
        assert_eq!(encode_producers(offset, &back), bytes);
        let empty = encode_producers(Offset(0), &ProducerTable::default());
        assert_eq!(decode_producers(&empty).map(|(o, t)| (o, t.len())), Ok((Offset(0), 0)));
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut bad = bytes.clone();
                bad[i] ^= 1 << bit;
                assert!(decode_producers(&bad).is_err(), "byte {i} bit {bit}");
            }
        }
        for len in 0..bytes.len() {
            assert!(decode_producers(&bytes[..len]).is_err(), "cut at {len}");
        }
        // Well-formed but impossible contents are refused too.
        let resealed = |mut b: Vec<u8>| {
            b.truncate(b.len() - 4);
            let crc = crc32fast::hash(&b);
            b.extend_from_slice(&crc.to_le_bytes());
            b
        };
        let mut below = bytes.clone();
        below[4..12].copy_from_slice(&13u64.to_le_bytes());
        assert!(decode_producers(&resealed(below)).unwrap_err().contains("below 13"));
        let mut negative = bytes.clone();
        negative[16..24].copy_from_slice(&(-1i64).to_le_bytes());
        assert!(decode_producers(&resealed(negative)).unwrap_err().contains("negative"));
        let mut none = bytes.clone();
        none[24] = 0;
        assert!(decode_producers(&resealed(none)).is_err());
        let mut twice = bytes.clone();
        twice[16 + 73..16 + 73 + 8].copy_from_slice(&3i64.to_le_bytes());
        assert!(decode_producers(&resealed(twice)).unwrap_err().contains("repeated"));
        assert!(decode_producers(&encode_high_watermark(Offset(1))).is_err());
    }

    #[test]
    fn high_watermarks_round_trip_and_every_corruption_is_caught() {
        let bytes = encode_high_watermark(Offset(123_456_789));
        assert_eq!(bytes.len(), 16);
        assert_eq!(decode_high_watermark(&bytes), Ok(Offset(123_456_789)));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(decode_high_watermark(&bad).is_err(), "byte {i}");
        }
        assert!(decode_high_watermark(&bytes[..15]).is_err());
        assert!(decode_high_watermark(&encode_epochs(&EpochHistory::new())).is_err());
    }
}
