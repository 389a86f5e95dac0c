//! What replication needs of the log: a follower's append that keeps the
//! leader's batches as they are, the leader-epoch history (kept, persisted,
//! rebuilt, truncated) and the high watermark's checkpoint.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::BytesMut;
use common::*;
use strand_storage::batch::{BatchHeader, RecordBatch, Stamp};
use strand_storage::checkpoint::{EPOCHS_FILE, HIGH_WATERMARK_FILE};
use strand_storage::epochs::EpochHistory;
use strand_storage::retention::RetentionPolicy;
use strand_storage::{testkit, LeaderEpoch, Log, Offset, StorageError};

/// Appends batch `tag` (`records` records of 500 bytes) in `epoch`.
async fn append_in(log: &Log, epoch: u32, tag: u64, records: u32) -> Offset {
    log.append(testkit::batch(tag, records, 500, TS + tag as i64), LeaderEpoch(epoch))
        .await
        .unwrap()
        .base_offset
}

fn history(entries: &[(u32, u64)]) -> EpochHistory {
    EpochHistory::from_pairs(entries).unwrap()
}

#[test]
fn a_follower_append_keeps_the_leaders_offsets_epochs_and_timestamps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (shard, leader) = open(&path, small_segments()).await;
        let follower = shard.open_log(path.join("p1"), small_segments()).await.unwrap();
        for tag in 0..3 {
            append_in(&leader, 1, tag, 2).await;
        }
        for tag in 3..5 {
            append_in(&leader, 4, tag, 3).await;
        }
        let stored = read_batches(&leader).await;
        for b in &stored {
            let info = follower.append_replica(b.clone()).await.unwrap();
            assert_eq!(info.base_offset, BatchHeader::parse(b).unwrap().base_offset);
        }
        follower.wait_durable(Offset(11)).await.unwrap();
        assert_eq!(read_batches(&follower).await, stored, "byte for byte");
        assert_eq!(follower.epochs(), history(&[(1, 0), (4, 6)]));
        assert_eq!(follower.epochs(), leader.epochs());
        assert_eq!(follower.latest_epoch(), Some(LeaderEpoch(4)));

        // A batch that does not start at the log end changes nothing.
        let again = follower.append_replica(stored[4].clone()).await;
        assert!(
            matches!(
                again,
                Err(StorageError::NotAtLogEnd {
                    log_end: Offset(12),
                    batch_base: Offset(9)
                })
            ),
            "{again:?}"
        );
        // Nor does one of an older epoch, from a follower or a leader.
        let old = RecordBatch::stamped(
            testkit::batch(9, 1, 10, TS),
            1 << 20,
            Stamp {
                base_offset: Offset(12),
                leader_epoch: LeaderEpoch(3),
                log_append_time_ms: None,
            },
        )
        .unwrap();
        let stale = follower.append_replica(old.bytes().clone()).await;
        assert!(matches!(stale, Err(StorageError::StaleEpoch(_))), "{stale:?}");
        let stale = leader.append(testkit::batch(9, 1, 10, TS), LeaderEpoch(2)).await;
        assert!(matches!(stale, Err(StorageError::StaleEpoch(_))), "{stale:?}");
        // A damaged batch is refused by validation.
        let mut torn = BytesMut::from(&old.bytes()[..]);
        let last = torn.len() - 1;
        torn[last] ^= 1;
        assert!(follower.append_replica(torn.freeze()).await.is_err());
        assert_eq!((follower.log_end(), leader.log_end()), (Offset(12), Offset(12)));
        assert_eq!(follower.epochs(), history(&[(1, 0), (4, 6)]));
        leader.close().await.unwrap();
        follower.close().await.unwrap();
    });
}

#[test]
fn the_epoch_history_survives_reopens_and_is_rebuilt_when_its_file_is_missing_or_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (shard, log) = open(&path, small_segments()).await;
        // Epoch 0 over several segments, 2 from a mid-segment offset, 5 last.
        let mut expected = Vec::new();
        for (epoch, tags) in [(0u32, 0..60u64), (2, 60..75), (5, 75..80)] {
            for tag in tags {
                let base = append_in(&log, epoch, tag, 8).await;
                if expected.last().is_none_or(|(e, _)| *e != epoch) {
                    expected.push((epoch, base.0));
                }
            }
        }
        let expected = history(&expected);
        assert!(log.segment_count() > 3, "several segments");
        assert_eq!(log.epochs(), expected);
        let end = log.log_end();
        assert_eq!(
            log.end_offset_for_epoch(LeaderEpoch(0)),
            Some((LeaderEpoch(0), Offset(480)))
        );
        assert_eq!(
            log.end_offset_for_epoch(LeaderEpoch(3)),
            Some((LeaderEpoch(2), Offset(600)))
        );
        assert_eq!(log.end_offset_for_epoch(LeaderEpoch(5)), Some((LeaderEpoch(5), end)));
        assert_eq!(log.end_offset_for_epoch(LeaderEpoch(6)), None);
        log.close().await.unwrap();
        drop(log);

        let epochs_file = log_dir(&path).join(EPOCHS_FILE);
        let reopen = || async { shard.open_log(log_dir(&path), small_segments()).await.unwrap() };
        let log = reopen().await;
        assert_eq!(log.epochs(), expected, "from the checkpoint");
        log.close().await.unwrap();
        drop(log);
        for damage in ["missing", "garbage", "stale"] {
            match damage {
                "missing" => std::fs::remove_file(&epochs_file).unwrap(),
                "garbage" => std::fs::write(&epochs_file, b"SLE1 not a checkpoint").unwrap(),
                _ => std::fs::write(
                    &epochs_file,
                    strand_storage::checkpoint::encode_epochs(&history(&[(0, 0), (2, 480)])),
                )
                .unwrap(),
            }
            let log = reopen().await;
            assert_eq!(log.epochs(), expected, "rebuilt when the file is {damage}");
            log.close().await.unwrap();
            let saved = std::fs::read(&epochs_file).unwrap();
            assert_eq!(
                strand_storage::checkpoint::decode_epochs(&saved).unwrap(),
                expected,
                "and written again"
            );
        }
    });
}

#[test]
fn truncation_and_retention_keep_the_epoch_history_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (shard, log) = open(&path, small_segments()).await;
        for tag in 0..50u64 {
            append_in(&log, 1, tag, 8).await;
        }
        for tag in 50..60u64 {
            append_in(&log, 3, tag, 8).await;
        }
        assert!(log.segment_count() > 2, "several segments");
        assert_eq!(log.epochs(), history(&[(1, 0), (3, 400)]));
        // A follower cuts its divergent tail, then takes the new leader's.
        assert_eq!(log.truncate_to(Offset(401)).await.unwrap(), Offset(400));
        assert_eq!(log.epochs(), history(&[(1, 0)]));
        append_in(&log, 7, 99, 8).await;
        assert_eq!(log.epochs(), history(&[(1, 0), (7, 400)]));
        // Retention moves the start: the first epoch starts there.
        let start = log
            .enforce_retention(
                RetentionPolicy {
                    time_ms: None,
                    bytes: Some(40 << 10),
                },
                0,
            )
            .await
            .unwrap()
            .expect("old segments go");
        assert_eq!(log.epochs(), history(&[(1, start.0), (7, 400)]));
        assert_eq!(
            log.end_offset_for_epoch(LeaderEpoch(1)),
            Some((LeaderEpoch(1), Offset(400)))
        );
        log.close().await.unwrap();
        drop(log);
        let log = shard.open_log(log_dir(&path), small_segments()).await.unwrap();
        assert_eq!(log.epochs(), history(&[(1, start.0), (7, 400)]));
        // Truncated below the start: an empty log, no epochs.
        log.truncate_to(Offset(3)).await.unwrap();
        assert_eq!(log.epochs(), EpochHistory::new());
        append_in(&log, 8, 1, 1).await;
        assert_eq!(log.epochs(), history(&[(8, 3)]));
        log.close().await.unwrap();
    });
}

#[test]
fn a_reopened_log_starts_from_its_checkpointed_high_watermark_not_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (shard, log) = open(&path, small_segments()).await;
        for tag in 0..5u64 {
            append_in(&log, 1, tag, 2).await;
        }
        log.wait_durable(Offset(9)).await.unwrap();
        assert_eq!(log.high_watermark(), Offset(0), "nothing committed yet");
        log.advance_high_watermark(Offset(4));
        log.checkpoint().await.unwrap();
        log.advance_high_watermark(Offset(8));
        // A crash: no close, so no checkpoint of 8.
        drop(log);
        let reopen = || async { shard.open_log(log_dir(&path), small_segments()).await.unwrap() };
        let log = reopen().await;
        assert_eq!((log.log_end(), log.high_watermark()), (Offset(10), Offset(4)));
        // A clean close writes it.
        log.advance_high_watermark(Offset(9));
        log.close().await.unwrap();
        drop(log);
        let log = reopen().await;
        assert_eq!(log.high_watermark(), Offset(9));
        // Never past the log end, whatever the file says.
        log.truncate_to(Offset(6)).await.unwrap();
        assert_eq!(log.high_watermark(), Offset(6));
        drop(log);
        let log = reopen().await;
        assert_eq!(log.high_watermark(), Offset(6));
        drop(log);
        // A file that cannot be read is no high watermark: the log start.
        let file = log_dir(&path).join(HIGH_WATERMARK_FILE);
        for damage in ["garbage", "missing"] {
            match damage {
                "garbage" => std::fs::write(&file, [7u8; 16]).unwrap(),
                _ => std::fs::remove_file(&file).unwrap(),
            }
            let log = reopen().await;
            assert_eq!(log.high_watermark(), log.log_start(), "{damage}");
            drop(log);
        }
    });
}

#[test]
fn a_follower_behind_its_leaders_log_start_starts_over_there() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (shard, leader) = open(&path, small_segments()).await;
        let follower = shard.open_log(path.join("p1"), small_segments()).await.unwrap();
        for tag in 0..3 {
            append_in(&follower, 1, tag, 2).await;
        }
        follower.wait_durable(Offset(5)).await.unwrap();
        // The leader went on to 400 and then dropped everything below 300.
        for tag in 0..200 {
            append_in(&leader, 2, tag, 2).await;
        }
        let start = Offset(300);
        follower.start_over_at(start).await.unwrap();
        assert_eq!((follower.log_start(), follower.log_end()), (start, start));
        assert_eq!(
            follower.high_watermark(),
            start,
            "what the leader retained was committed"
        );
        assert_eq!(follower.epochs(), EpochHistory::new());
        assert!(read_batches(&follower).await.is_empty());
        // It takes the leader's batches from there, and keeps them.
        let from_leader: Vec<_> = read_batches(&leader)
            .await
            .into_iter()
            .filter(|b| BatchHeader::parse(b).unwrap().base_offset >= start)
            .collect();
        for b in &from_leader {
            follower.append_replica(b.clone()).await.unwrap();
        }
        follower.wait_durable(Offset(399)).await.unwrap();
        follower.close().await.unwrap();
        drop(follower);
        let follower = shard.open_log(path.join("p1"), small_segments()).await.unwrap();
        assert_eq!((follower.log_start(), follower.log_end()), (start, Offset(400)));
        assert_eq!(read_batches(&follower).await, from_leader);
        assert_eq!(follower.epochs(), history(&[(2, 300)]));
        // A log start at or below its end works the same way.
        follower.start_over_at(Offset(350)).await.unwrap();
        assert_eq!((follower.log_start(), follower.log_end()), (Offset(350), Offset(350)));
        assert_eq!(append_in(&follower, 3, 9, 1).await, Offset(350));
    });
}
