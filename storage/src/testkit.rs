//! Helpers shared by the storage tests, the crash-test child process and
//! the benchmarks: deterministic batches whose content can be re-derived
//! from the offset, and a way to run a future on a fresh glommio executor.

use std::future::Future;

use bytes::BytesMut;

use crate::batch::BatchBuilder;

/// A batch of `records` records whose values are `value_len` bytes derived
/// from `tag` and the record's index, with key `k<tag>`.
pub fn batch(tag: u64, records: u32, value_len: usize, timestamp_ms: i64) -> BytesMut {
    let mut b = BatchBuilder::with_capacity(records as usize * (value_len + 32) + 64);
    let key = format!("k{tag}");
    let mut value = vec![0u8; value_len];
    for i in 0..records {
        fill_value(&mut value, tag, i);
        b.push(Some(key.as_bytes()), Some(&value), &[], timestamp_ms);
    }
    b.build()
}

/// `batch` as a log stores it: stamped with offsets from `base` on, in
/// leader epoch 1.
pub fn stamp_at(batch: BytesMut, base: u64) -> crate::batch::RecordBatch {
    let stamp = crate::batch::Stamp {
        base_offset: crate::Offset(base),
        leader_epoch: crate::LeaderEpoch(1),
        log_append_time_ms: None,
    };
    crate::batch::RecordBatch::stamped(batch, 1 << 24, stamp).expect("a valid batch stamps")
}

/// The value [`batch`] puts in record `index` of the batch tagged `tag`.
pub fn fill_value(out: &mut [u8], tag: u64, index: u32) {
    let mut x = tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(index).wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Registered I/O memory of the executors [`run_on_executor`] makes: large
/// enough that the log's write buffers (up to `pending_bytes_max` plus a
/// block) come from glommio's pre-registered, pre-faulted pool rather than
/// fresh heap pages.
pub const EXECUTOR_IO_MEMORY: usize = 64 << 20;

/// Runs `make()`'s future on a new glommio executor thread and returns its
/// output. `make` runs on that thread, so the future need not be `Send`.
pub fn run_on_executor<F, Fut, T>(make: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(EXECUTOR_IO_MEMORY)
        .spawn(move || async move { make().await })
        .expect("spawning a glommio executor")
        .join()
        .expect("the executor thread panicked")
}

/// [`run_on_executor`] for tests: panics if the future has not finished
/// within `limit`, so a hang fails its test instead of stalling the whole
/// run (the executor thread is left behind; the test process ends anyway).
pub fn run_within<F, Fut, T>(limit: std::time::Duration, make: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_on_executor(make)
        })));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => v,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("the test's executor did not finish within {limit:?}: a hang"),
    }
}
