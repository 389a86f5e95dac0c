use bytes::Bytes;
use proptest::prelude::*;

use super::*;

const MAX: usize = 1 << 24;

type Rec = (Option<Vec<u8>>, Option<Vec<u8>>, Vec<(Vec<u8>, Option<Vec<u8>>)>, i64);

fn build(records: &[Rec]) -> BytesMut {
    let mut b = BatchBuilder::new();
    for (k, v, h, ts) in records {
        let headers: Vec<(&[u8], Option<&[u8]>)> = h.iter().map(|(k, v)| (&k[..], v.as_deref())).collect();
        b.push(k.as_deref(), v.as_deref(), &headers, *ts);
    }
    b.build()
}

fn arb_record() -> impl Strategy<Value = Rec> {
    (
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
        proptest::collection::vec(
            (
                proptest::collection::vec(any::<u8>(), 0..10),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..10)),
            ),
            0..3,
        ),
        1_600_000_000_000i64..1_800_000_000_000,
    )
}

proptest! {
    #[test]
    fn round_trip(records in proptest::collection::vec(arb_record(), 1..20), base in 0u64..u64::MAX / 2, epoch in any::<u32>()) {
        let bytes = build(&records);
        let batch = RecordBatch::stamped(bytes, MAX, Stamp {
            base_offset: Offset(base),
            leader_epoch: LeaderEpoch(epoch),
            log_append_time_ms: None,
        }).unwrap();
        prop_assert_eq!(batch.base_offset(), Offset(base));
        prop_assert_eq!(batch.header().leader_epoch, LeaderEpoch(epoch));
        prop_assert_eq!(batch.last_offset(), Offset(base + records.len() as u64 - 1));
        prop_assert_eq!(batch.max_timestamp(), records.iter().map(|r| r.3).max().unwrap());
        // The stamped batch still validates from scratch (the combined CRC is right).
        let again = RecordBatch::new(batch.bytes().clone(), MAX).unwrap();
        let got: Vec<Record> = again.records().collect();
        prop_assert_eq!(got.len(), records.len());
        for (i, (rec, want)) in got.iter().zip(&records).enumerate() {
            prop_assert_eq!(rec.offset, Offset(base + i as u64));
            prop_assert_eq!(rec.key.as_deref(), want.0.as_deref());
            prop_assert_eq!(rec.value.as_deref(), want.1.as_deref());
            prop_assert_eq!(rec.timestamp, want.3);
            let headers: Vec<(Vec<u8>, Option<Vec<u8>>)> =
                rec.headers.clone().map(|h| (h.key.to_vec(), h.value.map(|v| v.to_vec()))).collect();
            prop_assert_eq!(&headers, &want.2);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = validate(&data, MAX);
        if let Ok(batch) = RecordBatch::new(Bytes::from(data), MAX) {
            let _ = batch.records().count();
        }
    }
}

#[test]
fn every_single_byte_corruption_is_detected() {
    let records: Vec<Rec> = (0..5)
        .map(|i| {
            (
                Some(vec![i; 3]),
                Some(vec![i + 1; 50]),
                vec![(b"h".to_vec(), Some(vec![i]))],
                1_700_000_000_000 + i64::from(i),
            )
        })
        .collect();
    let good = RecordBatch::stamped(
        build(&records),
        MAX,
        Stamp {
            base_offset: Offset(1234),
            leader_epoch: LeaderEpoch(7),
            log_append_time_ms: None,
        },
    )
    .unwrap()
    .into_bytes();
    for i in 0..good.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bad = good.to_vec();
            bad[i] ^= flip;
            assert!(
                check_frame(&bad, MAX).is_err(),
                "flip {flip:#x} at byte {i} went unnoticed"
            );
        }
    }
}

#[test]
fn log_append_time_rewrites_timestamps() {
    let records: Vec<Rec> = vec![
        (None, Some(b"a".to_vec()), vec![], 5),
        (None, Some(b"b".to_vec()), vec![], 9),
    ];
    let batch = RecordBatch::stamped(
        build(&records),
        MAX,
        Stamp {
            base_offset: Offset(0),
            leader_epoch: LeaderEpoch(0),
            log_append_time_ms: Some(42),
        },
    )
    .unwrap();
    let again = RecordBatch::new(batch.into_bytes(), MAX).unwrap();
    assert_eq!(again.max_timestamp(), 42);
    assert!(again.records().all(|r| r.timestamp == 42));
}

#[test]
fn header_lies_are_rejected() {
    let records: Vec<Rec> = vec![
        (None, Some(b"a".to_vec()), vec![], 5),
        (None, Some(b"b".to_vec()), vec![], 9),
    ];
    let good = build(&records);
    let recrc = |buf: &mut BytesMut| {
        let crc = crc32fast::hash(&buf[field::BATCH_LENGTH..]);
        buf[..4].copy_from_slice(&crc.to_le_bytes());
    };
    let mut count = good.clone();
    count[field::RECORD_COUNT] = 3;
    recrc(&mut count);
    assert!(matches!(validate(&count, MAX), Err(BatchError::RecordCount { .. })));

    let mut delta = good.clone();
    delta[field::LAST_OFFSET_DELTA] = 5;
    recrc(&mut delta);
    assert!(matches!(validate(&delta, MAX), Err(BatchError::LastOffsetDelta { .. })));

    let mut ts = good.clone();
    ts[field::MAX_TIMESTAMP] = 1;
    recrc(&mut ts);
    assert!(matches!(validate(&ts, MAX), Err(BatchError::MaxTimestamp { .. })));

    assert!(matches!(validate(&good, 10), Err(BatchError::TooLarge { .. })));
    assert!(matches!(
        validate(&good[..good.len() - 1], MAX),
        Err(BatchError::LengthMismatch { .. })
    ));
    assert!(matches!(validate(&good[..10], MAX), Err(BatchError::TooShort { .. })));
}

#[test]
fn offset_deltas_must_be_dense() {
    // Two records, same timestamp: record 2 is [len][attr][ts delta 0][offset delta 1]…
    let records: Vec<Rec> = vec![
        (None, Some(b"a".to_vec()), vec![], 5),
        (None, Some(b"b".to_vec()), vec![], 5),
    ];
    let mut buf = build(&records);
    let first_len = buf[HEADER_LEN] as usize; // one-byte varint (short record)
    let second = HEADER_LEN + 1 + first_len;
    let delta_at = second + 3;
    assert_eq!(buf[delta_at], 1, "the layout this test relies on");
    // A gap (0, 5) that keeps the header consistent is still refused: dense
    // deltas keep a batch from spanning more offsets than it has records.
    buf[delta_at] = 5;
    buf[field::LAST_OFFSET_DELTA] = 5;
    let crc = crc32fast::hash(&buf[field::BATCH_LENGTH..]);
    buf[..4].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        validate(&buf, MAX),
        Err(BatchError::OffsetDelta { index: 1, delta: 5 })
    ));
}

proptest! {
    /// Restamping the producer fields keeps the batch valid and equal to one
    /// built with those fields from the start (the CRC matches a full pass).
    #[test]
    fn set_producer_matches_a_fresh_build(
        records in proptest::collection::vec(arb_record(), 1..20),
        id in 0i64..i64::MAX,
        epoch in any::<i16>(),
        seq in 0i32..i32::MAX,
    ) {
        let build = |producer: Option<(i64, i16, i32)>| {
            let mut b = BatchBuilder::new();
            if let Some((id, epoch, seq)) = producer {
                b.producer(id, epoch, seq);
            }
            for (k, v, h, ts) in &records {
                let headers: Vec<(&[u8], Option<&[u8]>)> = h.iter().map(|(k, v)| (&k[..], v.as_deref())).collect();
                b.push(k.as_deref(), v.as_deref(), &headers, *ts);
            }
            b.build_with_records_crc()
        };
        let (mut restamped, records_crc) = build(None);
        set_producer(&mut restamped, id, epoch, seq, records_crc);
        let (fresh, _) = build(Some((id, epoch, seq)));
        prop_assert_eq!(&restamped[..], &fresh[..]);
        let (header, _) = validate(&restamped, usize::MAX).unwrap();
        prop_assert_eq!((header.producer_id, header.producer_epoch, header.base_sequence), (id, epoch, seq));
    }
}
