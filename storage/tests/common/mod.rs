//! Shared helpers for the storage integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use strand_storage::shard::ShardStorageConfig;
use strand_storage::testkit;
use strand_storage::{Log, LogConfig, Offset, ShardStorage};

/// Runs a test's future on its own executor, failing the test after 2
/// minutes (a hang must not stall CI).
pub fn run<F, Fut, T>(make: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
    T: Send + 'static,
{
    strand_storage::testkit::run_within(std::time::Duration::from_secs(120), make)
}

pub const TS: i64 = 1_700_000_000_000;

/// The default log config without time retention: the tests stamp records
/// around [`TS`] (2023), which a roll's retention would otherwise delete.
pub fn no_time_retention() -> LogConfig {
    LogConfig {
        retention_ms: None,
        ..LogConfig::default()
    }
}

/// A log in `dir/p0` on a fresh shard storage rooted at `dir`.
/// 64 KiB segments (a roll every few dozen small batches), 4 KiB index
/// steps, batches up to 32 KiB.
#[allow(dead_code)]
pub fn small_segments() -> LogConfig {
    LogConfig {
        segment_bytes_max: 64 << 10,
        index_interval_bytes: 4096,
        batch_bytes_max: 32 << 10,
        ..no_time_retention()
    }
}

pub async fn open(dir: &Path, config: LogConfig) -> (ShardStorage, Log) {
    let shard = ShardStorage::open(dir, ShardStorageConfig::default()).await.unwrap();
    let log = shard.open_log(dir.join("p0"), config).await.unwrap();
    (shard, log)
}

pub fn log_dir(dir: &Path) -> PathBuf {
    dir.join("p0")
}

/// Appends batch `tag` with `records` records and returns its base offset.
pub async fn append(log: &Log, tag: u64, records: u32, value_len: usize) -> Offset {
    let info = log
        .append(
            testkit::batch(tag, records, value_len, TS + tag as i64),
            strand_storage::LeaderEpoch(1),
        )
        .await
        .unwrap();
    info.base_offset
}

/// Every stored batch from the log start, as bytes.
pub async fn read_batches(log: &Log) -> Vec<bytes::Bytes> {
    let mut out = Vec::new();
    let mut from = log.log_start();
    loop {
        let got = log.read(from, 256 << 10).await.unwrap();
        if got.batches.is_empty() {
            return out;
        }
        out.extend(got.batches);
        from = got.next_offset;
    }
}

/// Reads the whole log from its start and returns (offset, key, value) of
/// every record.
pub async fn read_all(log: &Log) -> Vec<(u64, Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for b in read_batches(log).await {
        let batch = strand_storage::batch::RecordBatch::new(b, 1 << 24).expect("stored batches validate");
        for r in batch.records() {
            out.push((r.offset.0, r.key.unwrap().to_vec(), r.value.unwrap().to_vec()));
        }
    }
    out
}

/// Checks that records are numbered from `start` without gaps and that each
/// value matches what `testkit::batch` generated for its key's tag.
pub fn check_contents(records: &[(u64, Vec<u8>, Vec<u8>)], start: u64) {
    let mut index_in_batch = 0u32;
    let mut last_key: Vec<u8> = Vec::new();
    for (i, (offset, key, value)) in records.iter().enumerate() {
        assert_eq!(*offset, start + i as u64, "offsets must be contiguous");
        if *key != last_key {
            index_in_batch = 0;
            last_key = key.clone();
        }
        let tag: u64 = std::str::from_utf8(&key[1..]).unwrap().parse().unwrap();
        let mut want = vec![0u8; value.len()];
        testkit::fill_value(&mut want, tag, index_in_batch);
        assert_eq!(value, &want, "value of offset {offset}");
        index_in_batch += 1;
    }
}

/// Inodes of the segment files in `dir`.
pub fn segment_inodes(dir: &std::path::Path) -> Vec<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| e.metadata().unwrap().ino())
        .collect()
}
