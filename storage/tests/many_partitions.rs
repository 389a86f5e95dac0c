//! 1,000 partitions on one shard, with about 4,000 segment files: far more
//! files than the process may hold descriptors for. Each active segment
//! keeps its file open; sealed segments are opened on demand through the
//! shard's bounded cache. Also measures the memory an idle partition costs.
//!
//! This binary lowers its own soft `RLIMIT_NOFILE`, so it stays one test in
//! its own file (its own process).

mod common;

use std::future::Future;

use common::*;
use strand_storage::config::LogConfig;
use strand_storage::shard::ShardStorageConfig;
use strand_storage::{LeaderEpoch, Log, Offset, ShardStorage};

const PARTITIONS: usize = 1000;
/// Soft limit on open files for this process: room for the 1,000 active
/// segments, the shard's sealed-segment cache and the executor, not for
/// the sealed segments.
const FD_LIMIT: u64 = 1400;
const OPEN_SEALED_MAX: usize = 64;
/// Partitions worked on at once (each opens a few files while it rolls).
const WAVE: usize = 50;
/// Batches per partition, `RECORDS` records of `VALUE_LEN` bytes each
/// (≈ 12 KiB): five fill a 64 KiB segment, so 16 make four segments.
const BATCHES: u64 = 16;
const RECORDS: u32 = 12;
const VALUE_LEN: usize = 1000;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 64 << 10,
        batch_bytes_max: 32 << 10,
        index_interval_bytes: 4096,
        // The memory of an idle partition, not of a large tail cache.
        tail_cache_bytes_max: 32 << 10,
        // Pre-zeroing writes 1 MiB chunks, 16 times a whole 64 KiB segment.
        zero_ahead_bytes: 0,
        ..no_time_retention()
    }
}

/// Sets this process's soft limit on open files to [`FD_LIMIT`].
fn limit_open_files() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only into `limit`, a valid, exclusively
    // borrowed rlimit that outlives the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0, "getrlimit: {}", std::io::Error::last_os_error());
    assert!(
        limit.rlim_max >= FD_LIMIT as libc::rlim_t,
        "the hard limit on open files ({}) is below {FD_LIMIT}",
        limit.rlim_max
    );
    limit.rlim_cur = FD_LIMIT as libc::rlim_t;
    // SAFETY: setrlimit only reads `limit`, a valid rlimit that outlives the
    // call; it changes the soft limit of this test process alone.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

/// Resident memory of this process, in bytes.
#[allow(clippy::unwrap_used)]
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// File descriptors this process holds now.
#[allow(clippy::unwrap_used)]
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Runs `f(0)`, …, `f(n - 1)` as tasks on the current executor, `WAVE` at
/// a time, and returns their outputs in order.
async fn in_waves<T, F, Fut>(n: usize, f: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + 'static,
    T: 'static,
{
    let mut out = Vec::with_capacity(n);
    for start in (0..n).step_by(WAVE) {
        let tasks: Vec<_> = (start..(start + WAVE).min(n))
            .map(|i| glommio::spawn_local(f(i)))
            .collect();
        for task in tasks {
            out.push(task.await);
        }
    }
    out
}

/// Opens the logs of all partitions (`p0` … `p999`).
#[allow(clippy::unwrap_used)]
async fn open_all(shard: &ShardStorage) -> Vec<Log> {
    in_waves(PARTITIONS, |p| {
        let shard = shard.clone();
        let dir = shard.data_dir().join(format!("p{p}"));
        async move { shard.open_log(dir, config()).await.unwrap() }
    })
    .await
}

/// The tag of batch `b` of partition `p` (distinct within a partition, as
/// `check_contents` needs).
fn tag(p: usize, b: u64) -> u64 {
    p as u64 * 1000 + b
}

#[test]
fn a_thousand_partitions_on_one_shard() {
    limit_open_files();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let shard = ShardStorage::open(
            &path,
            ShardStorageConfig {
                open_sealed_segments_max: OPEN_SEALED_MAX,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let rss_before = rss_bytes();

        let logs = open_all(&shard).await;
        let ends = in_waves(PARTITIONS, |p| {
            let log = logs[p].clone();
            async move {
                let mut last = Offset(0);
                for b in 0..BATCHES {
                    let info = log
                        .append(
                            strand_storage::testkit::batch(tag(p, b), RECORDS, VALUE_LEN, TS + b as i64),
                            LeaderEpoch(1),
                        )
                        .await
                        .unwrap();
                    last = info.last_offset;
                }
                log.wait_durable(last).await.unwrap();
                log.log_end()
            }
        })
        .await;
        let records = BATCHES * u64::from(RECORDS);
        for (p, log) in logs.iter().enumerate() {
            assert_eq!(ends[p], Offset(records), "partition {p}");
            assert_eq!(log.flushed_offset(), Offset(records), "partition {p}");
            assert!(
                log.segment_count() >= 4,
                "partition {p}: {} segments",
                log.segment_count()
            );
        }
        let segment_files: usize = (0..PARTITIONS)
            .map(|p| {
                std::fs::read_dir(path.join(format!("p{p}")))
                    .unwrap()
                    .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".log"))
                    .count()
            })
            .sum();
        assert!(segment_files >= 4 * PARTITIONS, "{segment_files} segment files");
        assert!(shard.open_sealed_segments() <= OPEN_SEALED_MAX);

        // Memory of the idle partitions: everything durable, tail caches in place.
        let rss_after = rss_bytes();
        let per_partition = rss_after.saturating_sub(rss_before) / PARTITIONS as u64;
        let cached = shard.tail_cache_bytes() / PARTITIONS;
        let active_heap = logs.iter().map(Log::active_heap_bytes).sum::<usize>() / PARTITIONS;
        eprintln!("memory per partition: {per_partition} bytes");
        eprintln!(
            "  of which tail cache {cached} bytes, active segment bookkeeping {active_heap} bytes; \
             {segment_files} segment files, {} descriptors open (limit {FD_LIMIT})",
            open_fds()
        );
        assert!(
            per_partition < 256 << 10,
            "an idle partition costs {per_partition} bytes of memory"
        );

        // Every partition read whole from its start: the sealed segments are
        // opened through the shard's cache, which stays within its bound.
        for (p, log) in logs.iter().enumerate() {
            let got = read_all(log).await;
            assert_eq!(got.len() as u64, records, "partition {p}");
            check_contents(&got, 0);
            assert_eq!(got[0].1, format!("k{}", tag(p, 0)).into_bytes(), "partition {p}");
            assert!(
                shard.open_sealed_segments() <= OPEN_SEALED_MAX,
                "{} sealed segments open",
                shard.open_sealed_segments()
            );
        }
        assert_eq!(shard.open_sealed_segments(), OPEN_SEALED_MAX);
        eprintln!("after reading: {} descriptors open", open_fds());

        // Close everything and reopen it all: recovery of 1,000 logs.
        in_waves(PARTITIONS, |p| {
            let log = logs[p].clone();
            async move { log.close().await.unwrap() }
        })
        .await;
        drop(logs);
        let logs = open_all(&shard).await;
        for (p, log) in logs.iter().enumerate() {
            assert_eq!(log.log_end(), ends[p], "partition {p} after reopening");
            assert_eq!(log.segment_count(), 4, "partition {p}");
        }
        for p in (0..PARTITIONS).step_by(97) {
            let got = read_all(&logs[p]).await;
            assert_eq!(got.len() as u64, records, "partition {p}");
            check_contents(&got, 0);
        }
        assert!(shard.open_sealed_segments() <= OPEN_SEALED_MAX);
        eprintln!("after reopening: {} descriptors open", open_fds());
    });
}
