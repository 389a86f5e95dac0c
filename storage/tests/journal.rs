//! Logs on the shard journal: acknowledged from the journal with the
//! segment written behind, many logs sharing a frame, checkpoints, and
//! replay after a crash (simulated by dropping the logs unclosed: what
//! only their memory held is gone) — also across a truncation, and not
//! into a log created again in the same directory.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use strand_storage::journal::JournalConfig;
use strand_storage::shard::ShardStorageConfig;
use strand_storage::{LeaderEpoch, Log, LogConfig, Offset, ShardStorage};

fn journal_config() -> JournalConfig {
    JournalConfig {
        file_bytes: 1 << 20,
        spare_files: 2,
        // Long: the tests checkpoint by hand unless they say otherwise.
        checkpoint_ms: 60_000,
        ..JournalConfig::default()
    }
}

fn journal_dir(dir: &Path) -> PathBuf {
    dir.join("__journal")
}

/// A shard storage on `dir` with its journal started.
async fn shard_with_journal(dir: &Path, config: JournalConfig) -> ShardStorage {
    let shard = ShardStorage::open(dir, ShardStorageConfig::default())
        .await
        .expect("opening the shard");
    shard
        .start_journal(&journal_dir(dir), config)
        .await
        .expect("starting the journal");
    shard
}

/// A journaling log `name` on a shard storage on `dir` (with its journal).
async fn journaled(dir: &Path, name: &str) -> (ShardStorage, Log) {
    let shard = shard_with_journal(dir, journal_config()).await;
    let log = shard
        .open_log(dir.join(name), no_time_retention())
        .await
        .expect("opening the log");
    (shard, log)
}

/// A journaling log `name` on `dir` holding batches `tags`, each durable.
async fn journaled_with(dir: &Path, name: &str, tags: std::ops::Range<u64>) -> (ShardStorage, Log) {
    let (shard, log) = journaled(dir, name).await;
    for tag in tags {
        append_durably(&log, tag).await;
    }
    (shard, log)
}

/// Appends batch `tag` and waits until it is durable.
async fn append_durably(log: &Log, tag: u64) -> Offset {
    let info = log
        .append(strand_storage::testkit::batch(tag, 2, 100, TS), LeaderEpoch(1))
        .await
        .expect("appending");
    log.wait_durable(info.last_offset).await.expect("durable");
    info.base_offset
}

/// The tags of the batches a log holds (the key of their first record).
async fn tags(log: &Log) -> Vec<String> {
    read_batches(log)
        .await
        .iter()
        .map(|b| {
            let batch = strand_storage::batch::RecordBatch::new(b.clone(), 1 << 20).expect("a valid batch");
            let key = batch.records().next().and_then(|r| r.key).expect("a keyed record");
            String::from_utf8_lossy(&key).into_owned()
        })
        .collect()
}

/// Replays the journal in `dir` on a fresh shard storage; returns it.
async fn replay(dir: &Path) -> strand_storage::replay::ReplayReport {
    let shard = ShardStorage::open(dir, ShardStorageConfig::default())
        .await
        .expect("opening the shard");
    shard
        .replay_journal(&journal_dir(dir), journal_config(), &no_time_retention())
        .await
        .expect("replaying")
}

#[test]
fn appends_are_acknowledged_from_the_journal_and_the_segment_is_written_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (shard, log) = journaled(&path, "q/0").await;
        assert!(log.journaled());
        for tag in 0..10 {
            append_durably(&log, tag).await;
        }
        assert_eq!(log.flushed_offset(), Offset(20));
        let (stats, journal) = (log.stats(), shard.journal().unwrap().stats());
        assert_eq!(
            (stats.writes, stats.syncs, stats.write_through_writes),
            (0, 0, 0),
            "{stats:?}"
        );
        assert_eq!(journal.frames, 10, "{journal:?}");
        // A checkpoint writes and fdatasyncs the segment, and unpins.
        assert!(log.checkpoint_journal().await.unwrap());
        let stats = log.stats();
        assert_eq!((stats.writes, stats.syncs), (1, 1), "{stats:?}");
        assert_eq!(shard.journal().unwrap().oldest_pin(), None);
        // An interval queue does not journal.
        let interval = LogConfig {
            fsync: strand_storage::FsyncPolicy::Interval {
                interval_ms: 100,
                interval_bytes: 0,
            },
            ..no_time_retention()
        };
        assert!(!shard.open_log(path.join("q/1"), interval).await.unwrap().journaled());
    });
}

#[test]
fn many_logs_share_a_frame() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let shard = shard_with_journal(&path, journal_config()).await;
        let mut logs = Vec::new();
        for p in 0..20 {
            logs.push(
                shard
                    .open_log(path.join(format!("q/{p}")), no_time_retention())
                    .await
                    .unwrap(),
            );
        }
        let tasks: Vec<_> = logs
            .iter()
            .cloned()
            .enumerate()
            .map(|(p, log)| {
                glommio::spawn_local(async move {
                    for i in 0..5 {
                        append_durably(&log, (p * 100 + i) as u64).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
        let frames = shard.journal().unwrap().stats().frames;
        assert!(frames <= 5 * 20 / 4, "{frames} frames for 100 appends of 20 logs");
        assert!(logs.iter().all(|l| l.flushed_offset() == Offset(10)));
    });
}

#[test]
fn what_only_the_journal_held_is_replayed_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        {
            let shard = shard_with_journal(&path, journal_config()).await;
            let a = shard.open_log(path.join("q/0"), no_time_retention()).await.unwrap();
            let b = shard.open_log(path.join("q/1"), no_time_retention()).await.unwrap();
            for tag in 0..4 {
                append_durably(&a, tag).await;
            }
            a.checkpoint_journal().await.unwrap();
            for tag in 4..8 {
                append_durably(&a, tag).await;
                append_durably(&b, 100 + tag).await;
            }
            // The crash: neither log is closed.
        }
        let report = replay(&path).await;
        assert_eq!(
            (report.logs, report.appended, report.skipped_logs),
            (2, 8, 0),
            "{report:?}"
        );
        let (_shard, a) = open_at(&path, "q/0").await;
        let want: Vec<String> = (0..8).map(|t| format!("k{t}")).collect();
        assert_eq!(tags(&a).await, want);
        let (_shard, b) = open_at(&path, "q/1").await;
        assert_eq!(tags(&b).await, (104..108).map(|t| format!("k{t}")).collect::<Vec<_>>());
        // The replay is recorded: a second one has nothing to do.
        drop((a, b));
        assert_eq!(replay(&path).await.entries, 0);
    });
}

async fn open_at(dir: &Path, name: &str) -> (ShardStorage, Log) {
    let shard = ShardStorage::open(dir, ShardStorageConfig::default())
        .await
        .expect("opening the shard");
    let log = shard
        .open_log(dir.join(name), no_time_retention())
        .await
        .expect("opening the log");
    (shard, log)
}

#[test]
fn a_truncation_is_not_undone_by_replay() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        {
            let (_shard, log) = journaled_with(&path, "q/0", 0..6).await;
            // A follower's divergence: cut back to offset 6 (3 batches), and
            // the new leader's batches follow.
            log.truncate_to(Offset(6)).await.unwrap();
            for tag in 10..13 {
                append_durably(&log, tag).await;
            }
        }
        let report = replay(&path).await;
        assert_eq!(report.logs, 1, "{report:?}");
        let (_shard, log) = open_at(&path, "q/0").await;
        let want: Vec<String> = [0, 1, 2, 10, 11, 12].iter().map(|t| format!("k{t}")).collect();
        assert_eq!(tags(&log).await, want);
    });
}

#[test]
fn a_start_over_is_replayed_and_what_came_before_it_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        {
            let (_shard, log) = journaled_with(&path, "q/0", 0..3).await;
            // A follower behind its leader's log start goes on from 100.
            log.start_over_at(Offset(100)).await.unwrap();
            let info = log
                .append_replica(bytes::Bytes::from(
                    strand_storage::testkit::stamp_at(strand_storage::testkit::batch(50, 2, 100, TS), 100)
                        .into_bytes()
                        .to_vec(),
                ))
                .await
                .unwrap();
            log.wait_durable(info.last_offset).await.unwrap();
        }
        replay(&path).await;
        let (_shard, log) = open_at(&path, "q/0").await;
        assert_eq!((log.log_start(), log.log_end()), (Offset(100), Offset(102)));
        assert_eq!(tags(&log).await, vec!["k50".to_string()]);
    });
}

#[test]
fn entries_of_a_log_created_again_in_the_same_directory_are_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        {
            let _written = journaled_with(&path, "q/0", 0..3).await;
        }
        // The queue was deleted and created again: a new, empty log.
        std::fs::remove_dir_all(path.join("q/0")).unwrap();
        {
            let shard = ShardStorage::open(&path, ShardStorageConfig::default()).await.unwrap();
            let log = shard.open_log(path.join("q/0"), no_time_retention()).await.unwrap();
            log.close().await.unwrap();
            // It is not journaled (no journal started), so it has no id
            // yet: give it one as a journaling open would.
            std::fs::write(
                path.join("q/0").join(strand_storage::log::JOURNAL_ID_FILE),
                "00000000000000aa\n",
            )
            .unwrap();
        }
        let report = replay(&path).await;
        assert_eq!((report.logs, report.skipped_logs), (0, 1), "{report:?}");
        let (_shard, log) = open_at(&path, "q/0").await;
        assert_eq!(log.log_end(), Offset(0));
    });
}

#[test]
fn the_checkpointer_writes_segments_behind_and_the_journal_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let config = JournalConfig {
            checkpoint_ms: 50,
            ..journal_config()
        };
        let shard = shard_with_journal(&path, config).await;
        let log = shard.open_log(path.join("q/0"), no_time_retention()).await.unwrap();
        // ~4 MiB through a journal of 1 MiB files over ~400 ms: without
        // checkpoints every file would stay, with them files are written
        // over.
        for tag in 0..200 {
            glommio::timer::sleep(Duration::from_millis(2)).await;
            let info = log
                .append(strand_storage::testkit::batch(tag, 20, 1000, TS), LeaderEpoch(1))
                .await
                .unwrap();
            log.wait_durable(info.last_offset).await.unwrap();
        }
        glommio::timer::sleep(Duration::from_millis(300)).await;
        let journal = shard.journal().unwrap();
        assert!(log.stats().syncs >= 1, "{:?}", log.stats());
        assert_eq!(journal.oldest_pin(), None);
        let files = std::fs::read_dir(journal_dir(&path)).unwrap().count();
        assert!(files <= 4, "{files} journal files");
        assert!(journal.stats().files_recycled >= 1, "{:?}", journal.stats());
    });
}

#[test]
fn a_cut_inside_a_batch_is_journaled_where_the_log_really_ends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        {
            // Another log's entry, never checkpointed, keeps the replay
            // starting before everything below.
            let (shard, _other) = journaled_with(&path, "q/1", 100..101).await;
            // Batches of 2 records: tags 0..6 at offsets 0, 2, … 10.
            let log = shard.open_log(path.join("q/0"), no_time_retention()).await.unwrap();
            for tag in 0..6 {
                append_durably(&log, tag).await;
            }
            // Offset 7 is inside the batch at 6: the whole batch goes, and
            // the log ends at 6; the new leader's batches follow from there.
            assert_eq!(log.truncate_to(Offset(7)).await.unwrap(), Offset(6));
            for tag in 10..13 {
                append_durably(&log, tag).await;
            }
        }
        replay(&path).await;
        let (_shard, log) = open_at(&path, "q/0").await;
        let want: Vec<String> = [0, 1, 2, 10, 11, 12].iter().map(|t| format!("k{t}")).collect();
        assert_eq!(tags(&log).await, want);
        assert_eq!(log.log_end(), Offset(12));
    });
}

#[test]
fn a_cleanly_closed_logs_entries_are_not_replayed_onto_what_it_holds_later() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (shard, other) = {
            // Another log's entry, never checkpointed, keeps the replay
            // starting before everything below.
            let (shard, other) = journaled_with(&path, "q/1", 100..101).await;
            let log = shard.open_log(path.join("q/0"), no_time_retention()).await.unwrap();
            for tag in 0..6 {
                append_durably(&log, tag).await;
            }
            log.truncate_to(Offset(6)).await.unwrap();
            for tag in 10..13 {
                append_durably(&log, tag).await;
            }
            log.close().await.unwrap();
            (shard, other)
        };
        {
            // Opened again without the journal (its queue went to
            // fsync=interval): appends past the journal's truncation.
            let interval = LogConfig {
                fsync: strand_storage::FsyncPolicy::Interval {
                    interval_ms: 1000,
                    interval_bytes: 0,
                },
                ..no_time_retention()
            };
            let log = shard.open_log(path.join("q/0"), interval).await.unwrap();
            assert!(!log.journaled());
            for tag in 20..23 {
                append(&log, tag, 2, 100).await;
            }
            log.flush().await.unwrap();
            // The crash: not closed.
        }
        drop((shard, other));
        let report = replay(&path).await;
        assert_eq!((report.cuts, report.skipped_logs), (0, 1), "{report:?}");
        let (_shard, log) = open_at(&path, "q/0").await;
        let want: Vec<String> = [0, 1, 2, 10, 11, 12, 20, 21, 22]
            .iter()
            .map(|t| format!("k{t}"))
            .collect();
        assert_eq!(tags(&log).await, want);
    });
}

#[test]
fn appends_that_nobody_waits_for_do_not_gather_without_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (shard, log) = journaled(&path, "q/0").await;
        // 24 MiB appended, none waited for (acks=0): the journal writes a
        // frame once 16 MiB are gathered, before taking more.
        for tag in 0..24 {
            log.append(strand_storage::testkit::batch(tag, 1, 1 << 20, TS), LeaderEpoch(1))
                .await
                .unwrap();
        }
        let journal = shard.journal().unwrap();
        assert!(journal.stats().frames >= 1, "{:?}", journal.stats());
        assert!(journal.gathering_full().is_none());
    });
}

#[test]
fn a_high_watermark_past_what_the_segment_held_survives_the_replay() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        {
            let (_shard, log) = journaled_with(&path, "q/0", 0..5).await;
            // Committed up to the end; the segment holds none of it yet.
            log.advance_high_watermark(log.log_end());
            log.checkpoint().await.unwrap();
            assert_eq!(log.stats().writes, 0);
        }
        replay(&path).await;
        let (_shard, log) = open_at(&path, "q/0").await;
        assert_eq!((log.log_end(), log.high_watermark()), (Offset(10), Offset(10)));
    });
}
