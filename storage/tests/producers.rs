//! The log's idempotent-producer table: noted by every append (a leader's
//! and a follower's), snapshotted, and rebuilt after a clean close, a crash
//! (no close), a roll, a truncation and damaged or stale snapshots — so a
//! batch resent across any of them is answered with its first offsets.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::BytesMut;
use common::*;
use strand_storage::batch::BatchBuilder;
use strand_storage::checkpoint::{parse_producers_file_name, producers_file_name};
use strand_storage::producers::{Sequenced, Verdict};
use strand_storage::{LeaderEpoch, Log, Offset};

/// Producer `pid`'s batch of `records` 500-byte records from sequence `seq`.
fn sequenced(pid: i64, seq: i32, records: u32) -> (BytesMut, Sequenced) {
    let mut b = BatchBuilder::new();
    b.producer(pid, 0, seq);
    for i in 0..records {
        b.push(Some(b"k"), Some(&[i as u8; 500]), &[], TS);
    }
    (b.build(), Sequenced::of(pid, seq, records).unwrap())
}

/// Appends producer `pid`'s next batch (10 records from `seq`) after
/// checking it would be appended; returns it with where it went.
async fn produce(log: &Log, pid: i64, seq: i32) -> (Sequenced, (u64, u64, i64)) {
    let (bytes, s) = sequenced(pid, seq, 10);
    assert_eq!(log.check_producer(s), Verdict::Append, "producer {pid} at {seq}");
    let info = log.append(bytes, LeaderEpoch(1)).await.unwrap();
    (s, (info.base_offset.0, info.last_offset.0, info.max_timestamp))
}

fn snapshots(dir: &std::path::Path) -> Vec<Offset> {
    let mut found: Vec<Offset> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| parse_producers_file_name(e.unwrap().file_name().to_str()?))
        .collect();
    found.sort();
    found
}

#[test]
fn resent_batches_are_known_after_a_crash_a_clean_close_and_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (shard, log) = open(&path, small_segments()).await;
        // Producer 8 is seen only in the first segment; 7 throughout
        // (10 records of ~500 bytes a batch: a roll every dozen batches).
        let (early, early_at) = produce(&log, 8, 0).await;
        let mut last = Vec::new();
        for i in 0..40 {
            last.push(produce(&log, 7, i * 10).await);
        }
        log.wait_durable(Offset(log.log_end().0 - 1)).await.unwrap();
        assert!(log.segment_count() >= 3, "rolled");
        let dir = log_dir(&path);
        let at_roll = snapshots(&dir);
        assert!(!at_roll.is_empty() && at_roll.len() <= 2, "{at_roll:?}");
        assert!(*at_roll.last().unwrap() < log.log_end(), "taken at a roll");
        let known = |log: &Log| {
            for (s, at) in &last[last.len() - 5..] {
                assert_eq!(log.check_producer(*s), Verdict::Duplicate(*at));
            }
            assert_eq!(log.check_producer(early), Verdict::Duplicate(early_at));
            assert_eq!(log.check_producer(sequenced(7, 400, 1).1), Verdict::Append);
        };
        known(&log);

        // A crash (no close): the roll's snapshot, then the active segment.
        drop(log);
        let reopen = || async { shard.open_log(log_dir(&path), small_segments()).await.unwrap() };
        let log = reopen().await;
        known(&log);
        // A clean close leaves a snapshot at the log end.
        log.close().await.unwrap();
        let end = log.log_end();
        drop(log);
        assert_eq!(snapshots(&dir).last(), Some(&end));
        let log = reopen().await;
        known(&log);
        drop(log);

        // A damaged newest snapshot: the one before serves.
        std::fs::write(dir.join(producers_file_name(end)), b"SPT1 torn").unwrap();
        let log = reopen().await;
        known(&log);
        drop(log);
        // One past the log end (taken before a tail was lost) is removed,
        // not believed.
        let past = dir.join(producers_file_name(Offset(1 << 40)));
        std::fs::write(&past, b"anything").unwrap();
        let log = reopen().await;
        assert!(!past.exists());
        known(&log);
        drop(log);
        // Without any readable snapshot (both came back empty after a power
        // loss: a 30-minute strand-chaos run stored a retry twice, its
        // producer's last batch in an older segment) every batch from the
        // log start is noted: producer 8, last seen segments ago, is known.
        for offset in snapshots(&dir) {
            std::fs::write(dir.join(producers_file_name(offset)), b"").unwrap();
        }
        let log = reopen().await;
        known(&log);
        let (s, at) = last[last.len() - 1];
        assert_eq!(log.check_producer(s), Verdict::Duplicate(at));
        log.close().await.unwrap();
    });
}

#[test]
fn a_follower_notes_its_leaders_producers_and_truncation_forgets_what_it_cuts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (shard, leader) = open(&path, small_segments()).await;
        let follower = shard.open_log(path.join("p1"), small_segments()).await.unwrap();
        let mut sent = Vec::new();
        for i in 0..6 {
            sent.push(produce(&leader, 7, i * 10).await);
        }
        for b in read_batches(&leader).await {
            follower.append_replica(b).await.unwrap();
        }
        // The follower, made leader, answers a resend from memory.
        for (s, at) in &sent[1..] {
            assert_eq!(follower.check_producer(*s), Verdict::Duplicate(*at));
        }
        // A snapshot at 60, then a truncation below it to 30: batches 3..6
        // are gone, and so is the snapshot that names them.
        follower.checkpoint().await.unwrap();
        let dir1 = path.join("p1");
        assert_eq!(snapshots(&dir1), vec![Offset(60)]);
        assert_eq!(follower.truncate_to(Offset(30)).await.unwrap(), Offset(30));
        assert!(
            snapshots(&dir1).iter().all(|o| *o <= Offset(30)),
            "{:?}",
            snapshots(&dir1)
        );
        let after_cut = |log: &Log| {
            for (s, at) in &sent[..3] {
                assert_eq!(log.check_producer(*s), Verdict::Duplicate(*at));
            }
            assert_eq!(
                log.check_producer(sent[3].0),
                Verdict::Append,
                "cut: the next batch again"
            );
            assert_eq!(log.check_producer(sent[4].0), Verdict::OutOfOrder { expected: 30 });
        };
        after_cut(&follower);
        follower.checkpoint().await.unwrap();
        drop(follower);
        let follower = shard.open_log(path.join("p1"), small_segments()).await.unwrap();
        after_cut(&follower);
        // Starting over (behind the leader's log start) forgets everyone.
        follower.start_over_at(Offset(1000)).await.unwrap();
        assert_eq!(follower.producer_count(), 0);
        assert!(snapshots(&dir1).iter().all(|o| *o >= Offset(1000)));
        drop(follower);
        let follower = shard.open_log(path.join("p1"), small_segments()).await.unwrap();
        assert_eq!(follower.producer_count(), 0);
        assert_eq!(follower.check_producer(sent[5].0), Verdict::Unknown);
        follower.close().await.unwrap();
        leader.close().await.unwrap();
    });
}
