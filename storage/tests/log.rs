//! The partition log end to end on a real glommio executor and real files.

mod common;

use std::rc::Rc;

use common::*;
use strand_storage::config::{FsyncPolicy, LogConfig};
use strand_storage::retention::RetentionPolicy;
use strand_storage::{LeaderEpoch, Offset, StorageError};

#[test]
fn append_read_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (shard, log) = open(&path, small_segments()).await;
        let mut next = 0;
        for tag in 0..200u64 {
            let records = 1 + (tag % 7) as u32;
            let base = append(&log, tag, records, 100 + (tag as usize * 37) % 900).await;
            assert_eq!(base, Offset(next));
            next += u64::from(records);
        }
        log.wait_durable(Offset(next - 1)).await.unwrap();
        assert_eq!(log.log_end(), Offset(next));
        assert_eq!(log.flushed_offset(), Offset(next));
        assert!(log.segment_count() > 3, "64 KiB segments must have rolled");
        let records = read_all(&log).await;
        assert_eq!(records.len() as u64, next);
        check_contents(&records, 0);

        // A read from the middle of a batch returns that whole batch.
        let mid = log.read(Offset(5), 1).await.unwrap();
        let first = strand_storage::batch::BatchHeader::parse(&mid.batches[0]).unwrap();
        assert!(first.base_offset <= Offset(5) && first.last_offset() >= Offset(5));
        assert!(matches!(
            log.read(Offset(next + 1), 10).await,
            Err(StorageError::OffsetOutOfRange { .. })
        ));
        assert!(log.read(Offset(next), 10).await.unwrap().batches.is_empty());

        log.close().await.unwrap();
        drop(log);
        // Reopened, everything comes from disk (the tail cache starts empty).
        let log = shard.open_log(log_dir(&path), small_segments()).await.unwrap();
        assert_eq!(log.log_end(), Offset(next));
        assert_eq!(log.cached_bytes(), 0);
        let again = read_all(&log).await;
        assert_eq!(again, records);
        assert_eq!(append(&log, 999, 3, 10).await, Offset(next));
    });
}

/// Group commit, with write + fdatasync and with write-through: 16
/// producers waiting for durability share the flushes (fdatasyncs, or
/// write-through writes), and the stats count each one.
#[test]
fn concurrent_producers_share_flushes() {
    for write_through in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let config = LogConfig {
                write_through,
                ..LogConfig::default()
            };
            let (_shard, log) = open(&path, config).await;
            let log = Rc::new(log);
            let mut tasks = Vec::new();
            for producer in 0..16u64 {
                let log = log.clone();
                tasks.push(glommio::spawn_local(async move {
                    for i in 0..20u64 {
                        let info = log
                            .append(
                                strand_storage::testkit::batch(producer * 1000 + i, 4, 200, TS),
                                LeaderEpoch(1),
                            )
                            .await
                            .unwrap();
                        log.wait_durable(info.last_offset).await.unwrap();
                        assert!(log.flushed_offset() > info.last_offset);
                    }
                }));
            }
            for t in tasks {
                t.await;
            }
            let stats = log.stats();
            assert_eq!(log.log_end(), Offset(16 * 20 * 4));
            // 320 acknowledged appends; group commit must have merged them.
            let flushes = if write_through {
                assert_eq!(stats.syncs, 0, "write-through needs no fdatasync: {stats:?}");
                assert_eq!(stats.write_through_writes, stats.writes, "{stats:?}");
                stats.write_through_writes
            } else {
                assert_eq!(stats.write_through_writes, 0, "{stats:?}");
                stats.syncs
            };
            assert!(flushes > 0 && flushes < 320 / 2, "{write_through}: {stats:?}");
            assert_eq!(read_all(&log).await.len(), 16 * 20 * 4);
            // One more durable append: the difference of two snapshots is
            // exactly its I/O.
            let batch = strand_storage::testkit::batch(99_999, 4, 200, TS);
            let len = batch.len() as u64;
            let info = log.append(batch, LeaderEpoch(1)).await.unwrap();
            log.wait_durable(info.last_offset).await.unwrap();
            let more = log.stats().since(&stats);
            let (syncs, through) = if write_through { (0, 1) } else { (1, 0) };
            assert_eq!(
                (
                    more.writes,
                    more.syncs,
                    more.write_through_writes,
                    more.bytes_written,
                    more.rolls
                ),
                (1, syncs, through, len, 0),
                "{more:?}"
            );
            assert_eq!(more.sync_buckets.iter().sum::<u64>(), syncs, "{more:?}");
            if !write_through {
                assert!(more.sync_ns > 0 && more.sync_ns < log.stats().sync_ns, "{more:?}");
            }
        });
    }
}

/// The open(2) flags of this process's descriptors of `file`, from
/// /proc/self/fdinfo.
fn open_flags_of(file: &std::path::Path) -> Vec<i32> {
    let mut flags = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").flatten() {
        if std::fs::read_link(entry.path()).ok().as_deref() != Some(file) {
            continue;
        }
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", entry.file_name().to_string_lossy()));
        let octal = info.ok().and_then(|i| {
            i.lines()
                .find_map(|l| l.strip_prefix("flags:").map(|f| f.trim().to_string()))
        });
        flags.extend(octal.and_then(|o| i32::from_str_radix(&o, 8).ok()));
    }
    flags
}

/// Write-through holds the active segment open O_DSYNC only on an
/// `fsync=always` log with it on: through a roll (a new file) and a reopen
/// (the existing one). An `fsync=interval` log never (its writes are
/// cheap, and made durable by the interval's fdatasync).
#[test]
fn only_a_write_through_log_opens_its_active_segment_o_dsync() {
    let cases = [
        (FsyncPolicy::Always, true, true),
        (FsyncPolicy::Always, false, false),
        (
            FsyncPolicy::Interval {
                interval_ms: 50,
                interval_bytes: 0,
            },
            true,
            false,
        ),
    ];
    for (fsync, write_through, dsync) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let config = LogConfig {
                fsync,
                write_through,
                ..small_segments()
            };
            let (shard, log) = open(&path, config.clone()).await;
            let active = |log: &strand_storage::Log| {
                let dir = log_dir(&path);
                let mut files: Vec<_> = std::fs::read_dir(&dir)
                    .unwrap()
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "log"))
                    .collect();
                files.sort();
                assert!(log.segment_count() == files.len(), "{files:?}");
                files.pop().unwrap()
            };
            let check = |file: std::path::PathBuf, when: &str| {
                let flags = open_flags_of(&file);
                assert!(!flags.is_empty(), "{when}: no descriptor of {}", file.display());
                assert!(
                    flags.iter().all(|f| (f & libc::O_DSYNC != 0) == dsync),
                    "{when}: {fsync:?}, write_through {write_through}: flags {flags:?}"
                );
            };
            check(active(&log), "new");
            // Past a roll (64 KiB segments).
            let mut last = Offset(0);
            for tag in 0..100u64 {
                last = log
                    .append(strand_storage::testkit::batch(tag, 4, 1000, TS), LeaderEpoch(1))
                    .await
                    .unwrap()
                    .last_offset;
            }
            log.flush().await.unwrap();
            assert!(log.segment_count() > 1, "rolled");
            assert!(log.flushed_offset() > last);
            check(active(&log), "rolled");
            log.close().await.unwrap();
            drop(log);
            let log = shard.open_log(log_dir(&path), config).await.unwrap();
            check(active(&log), "reopened");
            assert_eq!(read_all(&log).await.len(), 400);
        });
    }
}

#[test]
fn interval_policy_syncs_on_bytes_and_tick() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let config = LogConfig {
            fsync: FsyncPolicy::Interval {
                interval_ms: 50,
                interval_bytes: 1 << 20,
            },
            ..no_time_retention()
        };
        let (_shard, log) = open(&path, config).await;
        assert!(!log.unsettled(), "nothing appended: nothing for a tick to do");
        let info = log
            .append(strand_storage::testkit::batch(1, 10, 100, TS), LeaderEpoch(0))
            .await
            .unwrap();
        assert!(log.unsettled(), "appended: to write and sync");
        log.wait_durable(info.last_offset).await.unwrap();
        assert!(log.unsettled(), "written: to sync");
        // Written, not yet synced: the interval has not passed.
        assert!(log.written_offset() > info.last_offset);
        assert!(log.flushed_offset() <= info.last_offset);
        glommio::timer::sleep(std::time::Duration::from_millis(60)).await;
        log.tick().await.unwrap();
        assert!(log.flushed_offset() > info.last_offset);
        assert!(!log.unsettled(), "written and synced: settled");
        // Right after that sync, a tick writes what is queued but does not
        // fdatasync again before the interval has passed.
        let next = log
            .append(strand_storage::testkit::batch(3, 10, 100, TS), LeaderEpoch(0))
            .await
            .unwrap();
        let syncs = log.stats().syncs;
        log.tick().await.unwrap();
        assert!(log.written_offset() > next.last_offset, "a tick writes what is queued");
        assert_eq!(
            log.stats().syncs,
            syncs,
            "a tick within the interval must not fdatasync"
        );
        assert!(log.flushed_offset() <= next.last_offset);
        // Crossing the byte threshold syncs in the produce path.
        let big = log
            .append(strand_storage::testkit::batch(2, 1200, 1000, TS), LeaderEpoch(0))
            .await
            .unwrap();
        log.wait_durable(big.last_offset).await.unwrap();
        assert!(log.flushed_offset() > big.last_offset);
    });
}

/// Producers on an `fsync=interval` log with a byte threshold, and a
/// timer ticking every millisecond whose fdatasyncs overlap their writes:
/// whenever an append is acknowledged, fewer than the threshold's bytes are
/// written and not yet fdatasync'd. (A sync used to reset the count of
/// unsynced bytes to zero, forgetting the writes that completed while it
/// was in flight, so producers were acknowledged past the threshold.)
#[test]
fn interval_byte_threshold_holds_while_ticks_sync_alongside_writes() {
    const THRESHOLD: u64 = 48 << 10;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let config = LogConfig {
            fsync: FsyncPolicy::Interval {
                interval_ms: 1,
                interval_bytes: THRESHOLD,
            },
            ..no_time_retention()
        };
        let (_shard, log) = open(&path, config).await;
        let log = Rc::new(log);
        let stop = Rc::new(std::cell::Cell::new(false));
        let ticker = {
            let (log, stop) = (log.clone(), stop.clone());
            glommio::spawn_local(async move {
                while !stop.get() {
                    log.tick().await.unwrap();
                    glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                }
            })
        };
        // Every batch holds 16 records of at least 1,000 bytes each, so the
        // eight producers' batches (~128 KB) are well over the threshold.
        let min_record_bytes = 1000;
        let producers: Vec<_> = (0..8u64)
            .map(|p| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    for i in 0..60u64 {
                        let batch = strand_storage::testkit::batch(p * 1000 + i, 16, 1000, TS);
                        let info = log.append(batch, LeaderEpoch(0)).await.unwrap();
                        log.wait_durable(info.last_offset).await.unwrap();
                        let unsynced = log.written_offset().0 - log.flushed_offset().0;
                        assert!(
                            unsynced * min_record_bytes < THRESHOLD,
                            "acknowledged with {unsynced} records written and not fdatasync'd"
                        );
                    }
                })
            })
            .collect();
        for p in producers {
            p.await;
        }
        stop.set(true);
        ticker.await;
        assert!(log.stats().syncs > 0);
    });
}

#[test]
fn roll_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let config = LogConfig {
            segment_age_ms_max: 20,
            ..no_time_retention()
        };
        let (_shard, log) = open(&path, config).await;
        append(&log, 1, 1, 10).await;
        append(&log, 2, 1, 10).await;
        assert_eq!(log.segment_count(), 1);
        glommio::timer::sleep(std::time::Duration::from_millis(30)).await;
        append(&log, 3, 1, 10).await;
        assert_eq!(log.segment_count(), 2);
        let names: Vec<String> = std::fs::read_dir(log_dir(&path))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".log"))
            .collect();
        assert!(names.contains(&"00000000000000000002.log".to_string()), "{names:?}");
        check_contents(&read_all(&log).await, 0);
    });
}

#[test]
fn offsets_by_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (_shard, log) = open(&path, small_segments()).await;
        // Batch `tag` carries timestamp TS + tag * 10, 5 records each.
        for tag in 0..100u64 {
            log.append(
                strand_storage::testkit::batch(tag, 5, 300, TS + tag as i64 * 10),
                LeaderEpoch(0),
            )
            .await
            .unwrap();
        }
        assert!(log.segment_count() > 2);
        for tag in [0u64, 1, 17, 50, 99] {
            let ts = TS + tag as i64 * 10;
            assert_eq!(log.offset_for_timestamp(ts).await.unwrap(), Some(Offset(tag * 5)));
            assert_eq!(log.offset_for_timestamp(ts - 3).await.unwrap(), Some(Offset(tag * 5)));
        }
        assert_eq!(log.offset_for_timestamp(TS + 10_000).await.unwrap(), None);
        assert_eq!(log.offset_for_timestamp(0).await.unwrap(), Some(Offset(0)));
    });
}

#[test]
fn truncation_in_active_and_sealed_segments_and_below_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (shard, log) = open(&path, small_segments()).await;
        for tag in 0..120u64 {
            append(&log, tag, 2, 500).await;
        }
        let end = log.log_end().0;
        // Inside the active segment, mid-batch: the whole batch goes.
        let new_end = log.truncate_to(Offset(end - 3)).await.unwrap();
        assert_eq!(new_end, Offset(end - 4));
        // Into a sealed segment.
        let segments = log.segment_count();
        let new_end = log.truncate_to(Offset(41)).await.unwrap();
        assert_eq!(new_end, Offset(40));
        assert!(log.segment_count() < segments);
        assert_eq!(read_all(&log).await.len(), 40);
        // Appends continue at the new end, and it all survives a reopen.
        assert_eq!(append(&log, 500, 2, 500).await, Offset(40));
        log.close().await.unwrap();
        let log = shard.open_log(log_dir(&path), small_segments()).await.unwrap();
        let records = read_all(&log).await;
        assert_eq!(records.len(), 42);
        check_contents(&records, 0);
        // Below the log start: empty, restarting at the given offset.
        let end = log.truncate_to(Offset(0)).await.unwrap();
        assert_eq!((end, log.log_start(), log.segment_count()), (Offset(0), Offset(0), 1));
        assert_eq!(append(&log, 7, 1, 5).await, Offset(0));
    });
}

/// A log of small segments holding 200 batches of two records.
#[allow(clippy::unwrap_used)]
async fn open_filled(path: &std::path::Path) -> (strand_storage::ShardStorage, strand_storage::Log) {
    let (shard, log) = open(path, small_segments()).await;
    for tag in 0..200u64 {
        log.append(
            strand_storage::testkit::batch(tag, 2, 500, TS + tag as i64),
            LeaderEpoch(0),
        )
        .await
        .unwrap();
    }
    (shard, log)
}

#[test]
fn retention_deletes_whole_sealed_segments_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (_shard, log) = open_filled(&path).await;
        let segments = log.segment_count();
        let size = log.size_bytes();
        let by_size = RetentionPolicy {
            time_ms: None,
            bytes: Some(size / 2),
        };
        let start = log.enforce_retention(by_size, TS).await.unwrap().unwrap();
        assert!(log.size_bytes() <= size / 2 && log.size_bytes() > size / 2 - (64 << 10));
        assert_eq!(log.log_start(), start);
        assert!(matches!(
            log.read(Offset(0), 100).await,
            Err(StorageError::OffsetOutOfRange { .. })
        ));
        let kept = read_all(&log).await;
        check_contents(&kept, start.0);
        // Everything expired: only the active segment is left, data and all.
        let by_time = RetentionPolicy {
            time_ms: Some(1),
            bytes: None,
        };
        log.enforce_retention(by_time, TS + 1_000_000).await.unwrap();
        assert_eq!(log.segment_count(), 1);
        assert!(log.segment_count() < segments);
        let logs = std::fs::read_dir(log_dir(&path))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".log"))
            .count();
        assert_eq!(logs, 1, "only the active segment's file is left");
        assert_eq!(read_all(&log).await.last().unwrap().0, log.log_end().0 - 1);
    });
}

#[test]
fn delete_before_drops_the_segments_wholly_below_an_offset_and_never_past_the_high_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (_shard, log) = open_filled(&path).await;
        assert!(log.segment_count() > 3);
        let end = log.log_end();
        // Nothing is committed yet: nothing goes.
        assert_eq!(log.delete_before(Offset(300)).await.unwrap(), None);
        log.advance_high_watermark(end);
        let start = log.delete_before(Offset(300)).await.unwrap().unwrap();
        assert!(start <= Offset(300) && start > Offset(0), "{start:?}");
        assert_eq!(log.log_start(), start);
        // Offset 300 is kept, and everything from the new start reads.
        check_contents(&read_all(&log).await, start.0);
        // Again at the same offset: nothing more to delete.
        assert_eq!(log.delete_before(Offset(300)).await.unwrap(), None);
        // Past the end: only the active segment is left.
        let last = log.delete_before(Offset(u64::MAX)).await.unwrap().unwrap();
        assert_eq!((log.segment_count(), log.log_end()), (1, end));
        check_contents(&read_all(&log).await, last.0);
    });
}

#[test]
fn a_roll_reuses_the_file_of_the_segment_retention_frees() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let config = || LogConfig {
        retention_bytes: Some(200 << 10),
        retention_ms: None,
        ..small_segments()
    };
    run(move || async move {
        let (shard, log) = open(&path, config()).await;
        let mut inodes = std::collections::HashSet::new();
        let mut next = 0;
        for tag in 0..1200u64 {
            let records = 1 + (tag % 3) as u32;
            assert_eq!(
                append(&log, tag, records, 300 + (tag as usize * 53) % 700).await,
                Offset(next)
            );
            next += u64::from(records);
            if tag % 8 == 0 {
                log.wait_durable(Offset(next - 1)).await.unwrap();
                inodes.extend(segment_inodes(&log_dir(&path)));
            }
        }
        log.wait_durable(Offset(next - 1)).await.unwrap();
        let stats = log.stats();
        assert!(stats.rolls > 12, "{stats:?}");
        // Size retention at each roll: the log holds about 200 KiB, and all
        // but the first few new segments went into freed files.
        assert!(log.size_bytes() <= (200 << 10) + (64 << 10), "{}", log.size_bytes());
        assert!(stats.recycled >= stats.rolls - 4, "{stats:?}");
        assert!(inodes.len() <= 6, "{} files for {} rolls", inodes.len(), stats.rolls);
        let start = log.log_start().0;
        assert!(start > 0);
        let kept = read_all(&log).await;
        assert_eq!(kept.len() as u64, next - start);
        check_contents(&kept, start);
        // The active segment writes over an older one: its file is longer
        // than its batches, and past them lie the old ones.
        let active = std::fs::read_dir(log_dir(&path))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .max()
            .unwrap();
        let active_len = std::fs::metadata(&active).unwrap().len();
        let active_base: u64 = active.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        let in_active: u64 = kept.iter().filter(|r| r.0 >= active_base).count() as u64;
        assert!(in_active > 0 && active_len >= 32 << 10, "{active_len}");

        // Reopened without a close (as after a crash): recovery stops where
        // the old contents begin, and nothing acknowledged is lost.
        drop((shard, log));
        let (_shard, log) = open(&path, config()).await;
        assert_eq!((log.log_start().0, log.log_end()), (start, Offset(next)));
        assert_eq!(read_all(&log).await, kept);
        assert_eq!(append(&log, 5000, 2, 100).await, Offset(next));
        log.close().await.unwrap();
    });
}

#[test]
fn readers_of_old_segments_never_see_a_recycled_file_being_written_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let config = LogConfig {
            segment_bytes_max: 64 << 10,
            retention_bytes: Some(640 << 10),
            retention_ms: None,
            zero_ahead_bytes: 0,
            // Reads go to the files, not to memory.
            tail_cache_bytes_max: 0,
            ..small_segments()
        };
        let (_shard, log) = open(&path, config).await;
        let log = Rc::new(log);
        let done = Rc::new(std::cell::Cell::new(false));
        let raced = Rc::new(std::cell::Cell::new(0u64));
        // Readers chase the log start: their reads of the oldest segment
        // race the roll that recycles it.
        let mut readers = Vec::new();
        for _ in 0..3 {
            let (log, done, raced) = (log.clone(), done.clone(), raced.clone());
            readers.push(glommio::spawn_local(async move {
                let (mut good, mut moved) = (0u64, 0u64);
                let mut rng = 0x9E37_79B9_7F4A_7C15u64;
                while !done.get() {
                    // Anywhere in the log (the read-ahead blocks of a few
                    // segments cannot hold it all), mostly its oldest part.
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let (start, end) = (log.log_start().0, log.log_end().0);
                    let span = (end - start).max(1);
                    let from = Offset(start + rng % span / (1 + rng % 4));
                    match log.read(from, 8 << 10).await {
                        Ok(got) => {
                            let mut expected = from;
                            for b in got.batches {
                                let batch = strand_storage::batch::RecordBatch::new(b, 1 << 20)
                                    .expect("a batch handed out is intact");
                                assert!(
                                    batch.base_offset() <= expected && batch.next_offset() > expected,
                                    "batch {}..{} where {expected} was next",
                                    batch.base_offset(),
                                    batch.next_offset()
                                );
                                expected = batch.next_offset();
                                good += 1;
                            }
                        }
                        // The segment went while it was read (the start
                        // was checked when the read began).
                        Err(StorageError::OffsetOutOfRange { .. }) => {
                            moved += 1;
                            raced.set(raced.get() + 1);
                        }
                        Err(e) => panic!("read from {from}: {e}"),
                    }
                    glommio::timer::sleep(std::time::Duration::from_micros(50)).await;
                }
                (good, moved)
            }));
        }
        let mut next = 0;
        // Until some reads have raced a recycling (bounded).
        for tag in 0..40_000u64 {
            if tag >= 2000 && raced.get() >= 3 {
                break;
            }
            let info = log
                .append(strand_storage::testkit::batch(tag, 2, 400, TS), LeaderEpoch(1))
                .await
                .unwrap();
            assert_eq!(info.base_offset, Offset(next));
            next = info.last_offset.0 + 1;
            if tag % 4 == 0 {
                log.wait_durable(info.last_offset).await.unwrap();
            }
        }
        log.wait_durable(Offset(next - 1)).await.unwrap();
        done.set(true);
        let (mut good, mut moved) = (0, 0);
        for r in readers {
            let (g, m) = r.await;
            (good, moved) = (good + g, moved + m);
        }
        eprintln!("{good} batches read, {moved} reads found the log start moved");
        assert!(good > 0);
        assert!(moved >= 3, "no read raced a recycling: {moved}");
        assert!(log.stats().recycled > 10, "{:?}", log.stats());
        check_contents(&read_all(&log).await, log.log_start().0);
    });
}

#[test]
fn invalid_batches_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (_shard, log) = open(&path, LogConfig::default()).await;
        append(&log, 1, 3, 10).await;
        let mut bad = strand_storage::testkit::batch(2, 3, 10, TS);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let err = log.append(bad, LeaderEpoch(0)).await.unwrap_err();
        assert!(matches!(err, StorageError::InvalidBatch(_)), "{err}");
        let huge = LogConfig {
            batch_bytes_max: 1000,
            ..no_time_retention()
        };
        let (_s2, small) = open(&path.join("other"), huge).await;
        let err = small
            .append(strand_storage::testkit::batch(3, 10, 200, TS), LeaderEpoch(0))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("over the limit"), "{err}");
        assert_eq!(log.log_end(), Offset(3));
        assert_eq!(append(&log, 4, 1, 10).await, Offset(3));
    });
}

#[test]
fn the_high_watermark_only_moves_forward_and_stays_within_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (_shard, log) = open(&path, small_segments()).await;
        append(&log, 1, 3, 100).await;
        assert!(log.advance_high_watermark(Offset(2)));
        assert!(!log.advance_high_watermark(Offset(1)), "never back");
        assert!(!log.advance_high_watermark(Offset(2)), "no move, no news");
        assert!(log.advance_high_watermark(Offset(99)));
        assert_eq!(log.high_watermark(), Offset(3), "clamped to the log end");
        log.close().await.unwrap();
    });
}

/// Batches from a few KiB to over half the 4 MiB read-ahead block, read back from
/// disk (a reopened log) with fetch sizes small and large: every batch comes
/// back whole and unchanged, whichever block it lies in, and bytes handed
/// out of a shard's read buffers are freed on that shard only.
#[test]
fn disk_reads_hand_out_whole_batches_of_every_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let config = || LogConfig {
        segment_bytes_max: 16 << 20,
        batch_bytes_max: 4 << 20,
        tail_cache_bytes_max: 0,
        ..no_time_retention()
    };
    run(move || async move {
        let (shard, log) = open(&path, config()).await;
        let mut next = 0u64;
        for tag in 0..60u64 {
            // 1 to ~3,000 records of 1,000 bytes: 1 KB to ~3 MB a batch.
            let records = [1, 3, 17, 600, 1030, 1100, 2500, 3000][(tag * 7 % 8) as usize];
            append(&log, tag, records, 1000).await;
            next += u64::from(records);
        }
        log.flush().await.unwrap();
        log.close().await.unwrap();
        drop(log);
        let log = shard.open_log(log_dir(&path), config()).await.unwrap();
        assert!(log.segment_count() > 2, "16 MiB segments must have rolled");
        let whole = read_all(&log).await;
        assert_eq!(whole.len() as u64, next);
        check_contents(&whole, 0);
        for max in [1, 64 << 10, 1 << 20, 3 << 20, 8 << 20] {
            let mut from = Offset(0);
            let mut seen = 0;
            let mut slicing_blocks = 0;
            while from < log.log_end() {
                let got = log.read(from, max).await.unwrap();
                slicing_blocks += usize::from(got.from_disk);
                // A small fetch of small batches is a copy: it pins no 4 MiB
                // block (a fetch of one large batch may slice its block).
                if max <= 64 << 10 && got.bytes < 256 << 10 {
                    assert!(
                        !got.from_disk,
                        "a fetch of {} bytes (max {max}) slices a block",
                        got.bytes
                    );
                }
                for b in &got.batches {
                    let batch = strand_storage::batch::RecordBatch::new(b.clone(), 4 << 20).expect("whole batches");
                    for r in batch.records().filter(|r| r.offset >= from) {
                        assert_eq!(r.offset.0, seen);
                        assert_eq!(
                            r.value.unwrap(),
                            whole[seen as usize].2,
                            "offset {seen}, fetches of {max}"
                        );
                        seen += 1;
                    }
                }
                from = got.next_offset;
            }
            assert_eq!(seen, next, "fetches of {max}");
            // Large fetches slice the blocks read from disk (no copy).
            if max >= 1 << 20 {
                assert!(slicing_blocks > 0, "fetches of {max}");
            }
        }
        // A batch read from disk dropped on another thread is leaked there
        // (counted), never freed into this shard's buffers; detached, it
        // is bytes of its own.
        let before = strand_storage::log::foreign_drops();
        let got = log.read(Offset(0), 1 << 20).await.unwrap();
        let batch = got.batches[0].clone();
        drop(got);
        std::thread::spawn(move || drop(batch)).join().unwrap();
        assert_eq!(strand_storage::log::foreign_drops(), before + 1);
        let mut got = log.read(Offset(0), 1 << 20).await.unwrap();
        assert!(got.from_disk, "a 1 MiB fetch from disk slices its block");
        let batches = got.batches.clone();
        got.detach();
        assert!(!got.from_disk);
        assert_eq!(got.batches, batches, "the copies hold the same bytes");
        drop(batches);
        std::thread::spawn(move || drop(got)).join().unwrap();
        assert_eq!(strand_storage::log::foreign_drops(), before + 1);
    });
}

/// Four logs of one shard read from disk at once, each by a sequential
/// reader in 1 MiB fetches. Unbounded, each would hold up to its whole
/// 12 MiB in 4 MiB read-ahead blocks (48 MiB in all); with an 8 MiB shard budget the
/// shard never holds more than that, some blocks are refused, every
/// reader still gets all of its records intact and in order, and the
/// budget is whole again once the blocks are released.
#[test]
fn readers_of_many_logs_share_the_shards_read_ahead_budget() {
    const BUDGET: usize = 8 << 20;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let (bounded, refused) = read_logs_at_once(&path.join("bounded"), BUDGET).await;
        assert!(bounded <= BUDGET, "held {bounded} bytes of read-ahead, budget {BUDGET}");
        assert!(refused > 0, "four sequential readers must run out of an 8 MiB budget");
        let (unbounded, refused) = read_logs_at_once(&path.join("unbounded"), 256 << 20).await;
        assert!(
            unbounded > BUDGET,
            "without the bound the readers hold more ({unbounded} bytes): else this test shows nothing"
        );
        assert_eq!(refused, 0);
    });
}

/// Writes 12 MiB to each of four logs of a new shard whose read-ahead
/// budget is `budget`, reads them back from disk concurrently, checks every
/// record, and returns the most read-ahead memory the shard held at any
/// step and how many blocks its budget refused.
#[allow(clippy::unwrap_used)]
async fn read_logs_at_once(dir: &std::path::Path, budget: usize) -> (usize, u64) {
    use strand_storage::shard::ShardStorageConfig;
    let config = LogConfig {
        segment_bytes_max: 8 << 20,
        batch_bytes_max: 2 << 20,
        tail_cache_bytes_max: 0,
        ..no_time_retention()
    };
    let shard = strand_storage::ShardStorage::open(
        dir,
        ShardStorageConfig {
            readahead_budget_bytes: budget,
            ..ShardStorageConfig::default()
        },
    )
    .await
    .unwrap();
    let mut logs = Vec::new();
    for p in 0..4u64 {
        let log = shard.open_log(dir.join(format!("p{p}")), config.clone()).await.unwrap();
        for tag in 0..12 {
            append(&log, p * 100 + tag, 1000, 1000).await;
        }
        log.flush().await.unwrap();
        logs.push(log);
    }
    let most = Rc::new(std::cell::Cell::new(0usize));
    let readers: Vec<_> = logs
        .iter()
        .cloned()
        .map(|log| {
            let (shard, most) = (shard.clone(), most.clone());
            glommio::spawn_local(async move {
                let mut records = Vec::new();
                let mut from = Offset(0);
                while from < log.log_end() {
                    let got = log.read(from, 1 << 20).await.unwrap();
                    most.set(most.get().max(shard.readahead_bytes()));
                    for b in got.batches {
                        let batch = strand_storage::batch::RecordBatch::new(b, 1 << 24).unwrap();
                        for r in batch.records().filter(|r| r.offset >= from) {
                            records.push((r.offset.0, r.key.unwrap().to_vec(), r.value.unwrap().to_vec()));
                        }
                    }
                    from = got.next_offset;
                    // Let the other readers and the reads ahead run.
                    glommio::yield_if_needed().await;
                }
                check_contents(&records, 0);
                assert_eq!(records.len() as u64, log.log_end().0);
            })
        })
        .collect();
    for reader in readers {
        reader.await;
    }
    for log in &logs {
        log.release_idle_readahead(0);
    }
    assert_eq!(shard.readahead_bytes(), 0, "released blocks give their bytes back");
    for log in logs {
        log.close().await.unwrap();
    }
    (most.get(), shard.readahead_refused())
}
