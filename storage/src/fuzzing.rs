//! Entry points shared by the `cargo fuzz` targets (`storage/fuzz/`) and
//! the property tests that run the same code in CI. Each one must never
//! panic, whatever the input, and checks the invariants of what it parses.

use bytes::Bytes;

use crate::batch::{self, RecordBatch};
use crate::scan;
use crate::Offset;

const MAX: usize = 1 << 24;

/// Batch parsing: validation, iteration, and that a batch that validates
/// still validates after a stamp.
pub fn batch_parse(data: &[u8]) {
    let Ok(rb) = RecordBatch::new(Bytes::copy_from_slice(data), MAX) else {
        return;
    };
    let records: Vec<_> = rb.records().collect();
    assert_eq!(records.len(), rb.header().record_count as usize);
    assert_eq!(records.last().map(|r| r.offset), Some(rb.last_offset()));
    for r in &records {
        assert!(r.headers.clone().count() == r.headers.len());
    }
    let mut copy = bytes::BytesMut::from(data);
    let stamp = batch::Stamp {
        base_offset: Offset(7),
        leader_epoch: crate::LeaderEpoch(3),
        log_append_time_ms: None,
    };
    batch::stamp(&mut copy, MAX, stamp).expect("a valid batch stamps");
    assert!(batch::check_frame(&copy, MAX).is_ok());
}

/// The recovery scan over an arbitrary file image: the batches it accepts
/// are contiguous, valid, and end where it says the log ends.
pub fn recovery_scan(data: &[u8]) {
    let expected = batch::BatchHeader::parse(data).map(|h| h.base_offset);
    let all = scan::scan_all(data, 0, expected, MAX);
    assert!(all.valid_end as usize <= data.len());
    let mut at = 0u64;
    for b in &all.batches {
        assert_eq!(b.position, at);
        assert!(batch::check_frame(&data[b.position as usize..b.end() as usize], MAX).is_ok());
        at = b.end();
    }
    assert_eq!(at, all.valid_end);
    for w in all.batches.windows(2) {
        assert_eq!(w[0].header.next_offset(), w[1].header.base_offset);
    }
}

/// The checkpoint files (`crate::checkpoint`): whatever the bytes, decoding
/// never panics, and what decodes encodes back to the same bytes.
pub fn checkpoints(data: &[u8]) {
    use crate::checkpoint::{decode_epochs, decode_high_watermark, encode_epochs, encode_high_watermark};
    if let Ok(history) = decode_epochs(data) {
        assert_eq!(encode_epochs(&history), data);
    }
    if let Ok(hw) = decode_high_watermark(data) {
        assert_eq!(encode_high_watermark(hw), data);
    }
    if let Ok((offset, table)) = crate::checkpoint::decode_producers(data) {
        assert_eq!(crate::checkpoint::encode_producers(offset, &table), data);
    }
    if let Ok(id) = crate::checkpoint::decode_directory_id(data) {
        assert_eq!(crate::checkpoint::encode_directory_id(id), data);
    }
}

/// A journal file image (`crate::journal::format`): the scan never panics,
/// every frame it accepts encodes back to the bytes it was read from, and
/// planning a replay over it never panics either.
pub fn journal_file(data: &[u8]) {
    use crate::journal::{format, recover};
    let image = Bytes::copy_from_slice(data);
    let Ok(scan) = recover::scan_file(&image) else {
        return;
    };
    let mut at = format::FILE_HEADER_LEN;
    for frame in &scan.frames {
        let mut gathered = Vec::new();
        for e in &frame.entries {
            format::encode_entry(&mut gathered, &e.dir, e.log_id, &e.change);
        }
        let encoded = format::encode_frame(frame.header, frame.entries.len() as u32, &gathered);
        let used = format::FRAME_HEADER_LEN + gathered.len();
        assert_eq!(&encoded[..used], &data[at..at + used]);
        assert_eq!(encoded.len(), frame.disk_len);
        for e in &frame.entries {
            let (items, _) = recover::items_of([&e.change]);
            let _ = recover::replay_actions(Offset(0), &items);
        }
        at += frame.disk_len;
    }
    assert_eq!(at as u64, scan.valid_end);
    let _ = recover::plan(&[("fuzz".to_string(), scan)]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchBuilder;
    use proptest::prelude::*;

    fn seed_image(n: u8) -> Vec<u8> {
        let mut out = Vec::new();
        let mut next = 0;
        for i in 0..n {
            let mut b = BatchBuilder::new();
            b.push(Some(&[i]), Some(&[i; 30]), &[(b"k", Some(b"v"))], 100);
            let rb = RecordBatch::stamped(
                b.build(),
                MAX,
                batch::Stamp {
                    base_offset: Offset(next),
                    leader_epoch: crate::LeaderEpoch(0),
                    log_append_time_ms: None,
                },
            )
            .unwrap();
            next = rb.next_offset().0;
            out.extend_from_slice(rb.bytes());
        }
        out
    }

    proptest! {
        #[test]
        fn fuzz_entry_points_hold_on_mutated_images(n in 1u8..4, edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4), cut in any::<usize>()) {
            let mut image = seed_image(n);
            for (at, v) in edits {
                let i = at % image.len();
                image[i] = v;
            }
            let cut = cut % (image.len() + 1);
            recovery_scan(&image[..cut]);
            recovery_scan(&image);
            let first = batch::batch_length(&image).map_or(0, |l| l as usize).min(image.len());
            batch_parse(&image[..first]);
            batch_parse(&image);
        }

        #[test]
        fn journal_scanning_holds_on_mutated_files(n in 1u8..4, edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4), cut in any::<usize>()) {
            use crate::journal::format;
            let mut image = format::encode_file_header(format::FileHeader { seq: 2, first_lsn: 5 });
            for i in 0..u64::from(n) {
                let mut gathered = Vec::new();
                let change = format::Change::Batches { base: Offset(0), bytes: Bytes::from(seed_image(n)) };
                format::encode_entry(&mut gathered, "q/0", i, &change);
                format::encode_entry(&mut gathered, "q/1", i, &format::Change::Truncation { log_end: Offset(i) });
                let header = format::FrameHeader { file_seq: 2, lsn: 5 + i, replay_from: 5 };
                image.extend_from_slice(&format::encode_frame(header, 2, &gathered));
            }
            journal_file(&image);
            for (at, v) in edits {
                let i = at % image.len();
                image[i] = v;
            }
            journal_file(&image[..cut % (image.len() + 1)]);
            journal_file(&image);
        }

        #[test]
        fn checkpoint_decoding_holds_on_mutated_files(entries in proptest::collection::vec((0u32..50, 0u64..1000), 0..5), edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3), cut in any::<usize>(), hw in any::<u64>()) {
            let mut sorted: Vec<(u32, u64)> = entries;
            sorted.sort();
            sorted.dedup_by_key(|e| e.0);
            let history = crate::epochs::EpochHistory::from_entries(
                sorted
                    .iter()
                    .enumerate()
                    .map(|(i, (epoch, _))| crate::epochs::EpochStart {
                        epoch: crate::LeaderEpoch(*epoch),
                        start: Offset(i as u64 * 10),
                    })
                    .collect(),
            )
            .unwrap();
            let mut producers = crate::producers::ProducerTable::default();
            for (i, (id, _)) in sorted.iter().enumerate() {
                let seq = crate::producers::Sequenced::of(i64::from(*id), 0, 3).unwrap();
                producers.appended(seq, (i as u64 * 3, i as u64 * 3 + 2, 0));
            }
            for mut file in [
                crate::checkpoint::encode_epochs(&history),
                crate::checkpoint::encode_high_watermark(Offset(hw)),
                crate::checkpoint::encode_producers(Offset(sorted.len() as u64 * 3), &producers),
                crate::checkpoint::encode_directory_id(hw | 1),
            ] {
                checkpoints(&file);
                for (at, v) in &edits {
                    let i = at % file.len();
                    file[i] = *v;
                }
                checkpoints(&file[..cut % (file.len() + 1)]);
                checkpoints(&file);
            }
        }
    }
}
