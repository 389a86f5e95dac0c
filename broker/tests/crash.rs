//! Acknowledged records survive `kill -9` of the broker: producers with
//! acks=1 on an fsync=always queue, and with acks=all on an fsync=interval
//! queue (acknowledged once written to the device), record what was
//! acknowledged; the broker is killed at a random moment, restarted, and
//! every acknowledged record is there, intact, at its offset. (acks=1 on an
//! fsync=interval queue is answered before the write, and may lose the
//! last milliseconds: not tested here, by design.) Also with small segments
//! and size retention, where segments roll into recycled files, and with
//! the shard journal (checkpoints a minute apart: what was acknowledged is
//! in the journal alone when the broker dies, and the restart replays it).

#![allow(clippy::unwrap_used)] // the crash helper runs outside #[test] fns

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use strand_wire::OffsetSpec;

/// (partition, base offset, last offset, tag) of each acknowledged batch.
type Acked = Arc<Mutex<Vec<(u32, u64, u64, String)>>>;

/// A producer thread: sends batch after batch to one partition, one at a
/// time, and records each acknowledged one, until `stop` or until the
/// broker goes away.
struct Sending {
    queue: &'static str,
    partition: u32,
    acks: i8,
    acked: Acked,
    stop: Arc<AtomicBool>,
}

impl Sending {
    /// `make(i)`: the tag and bytes of the i-th batch.
    fn spawn(
        self,
        addr: std::net::SocketAddr,
        make: impl Fn(u64) -> (String, bytes::Bytes) + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut c = Client::connect(addr);
            for i in 0.. {
                if self.stop.load(Ordering::SeqCst) {
                    return;
                }
                let (tag, batch) = make(i);
                // The connection dies with the broker: stop there.
                let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    c.produce(self.queue, self.partition, batch, self.acks)
                }));
                match sent {
                    Ok(Ok((base, last))) => self.acked.lock().unwrap().push((self.partition, base, last, tag)),
                    _ => return,
                }
            }
        })
    }
}

#[test]
fn acknowledged_records_survive_kill_9() {
    for seed in 1..=3u64 {
        crash_once(seed, strand_client::FsyncSpec::Always, 1, "");
    }
}

#[test]
fn acks_all_on_interval_queues_survive_kill_9() {
    for seed in 4..=5u64 {
        crash_once(seed, strand_client::FsyncSpec::Interval { ms: 1000, bytes: 0 }, -1, "");
    }
}

#[test]
fn acknowledged_records_survive_kill_9_with_the_shard_journal() {
    // acks=1 and acks=all (the high watermark follows the journal).
    for (seed, acks) in [(8u64, 1i8), (9, -1)] {
        crash_once(
            seed,
            strand_client::FsyncSpec::Always,
            acks,
            "journal = true\njournal_checkpoint_ms = 60000\n",
        );
    }
}

/// `config`: the broker's settings file, if not empty.
fn crash_once(seed: u64, fsync: strand_client::FsyncSpec, acks: i8, config: &str) {
    {
        let dir = tempfile::tempdir().unwrap();
        let settings = dir.path().join("strand.toml");
        std::fs::write(&settings, config).unwrap();
        let args: &[&str] = match config {
            "" => &[],
            _ => &["--config", settings.to_str().unwrap()],
        };
        let data = dir.path().join("data");
        let broker = Broker::start_with(&data, args);
        let admin = strand_client::Admin::connect(&broker.addr.to_string()).unwrap();
        let spec = strand_client::QueueSpec {
            partitions: Some(2),
            fsync: Some(fsync),
            ..Default::default()
        };
        strand_client::block_on(admin.create_queue("durable", &spec)).unwrap();
        let acked: Acked = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..2u32)
            .map(|p| {
                let sending = Sending {
                    queue: "durable",
                    partition: p,
                    acks,
                    acked: acked.clone(),
                    stop: stop.clone(),
                };
                sending.spawn(broker.addr, move |i| {
                    let tag = format!("s{seed}p{p}b{i}");
                    let batch = batch(&tag, 1 + i as u32 % 4, TS);
                    (tag, batch)
                })
            })
            .collect();
        // Let some batches through, then kill at a seeded moment.
        while acked.lock().unwrap().len() < 20 {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(10 + (seed * 7919) % 200));
        if config.contains("journal = true") {
            let frames = total(&scrape(&broker), "strand_journal_frames_total");
            assert!(frames > 0.0, "seed {seed}: the journal wrote no frame");
        }
        broker.kill9();
        stop.store(true, Ordering::SeqCst);
        for p in producers {
            let _ = p.join();
        }
        let acked = acked.lock().unwrap().clone();
        assert!(acked.len() >= 20);

        let broker = Broker::start_with(&data, args);
        let mut c = broker.client();
        for p in 0..2 {
            let records = c.fetch_all("durable", p, 0);
            for (_, base, last, tag) in acked.iter().filter(|a| a.0 == p) {
                for (k, offset) in (*base..=*last).enumerate() {
                    let (o, v) = &records[offset as usize];
                    assert_eq!(*o, offset, "seed {seed}");
                    assert_eq!(
                        v,
                        format!("{tag}-{k}").as_bytes(),
                        "seed {seed}: offset {offset} of partition {p}"
                    );
                }
            }
        }
        assert_eq!(broker.terminate().code(), Some(0));
    }
}

/// Bytes of each record's value in the recycling test.
const PADDED: usize = 2000;

/// `{tag}-{k}` padded with dots to [`PADDED`] bytes.
fn padded(tag: &str, k: u32) -> Vec<u8> {
    let mut v = format!("{tag}-{k}").into_bytes();
    v.resize(PADDED, b'.');
    v
}

/// Bytes of each batch in the recycling test: a multiple of the 4 KiB
/// block, so every batch ends on a block boundary and what follows the last
/// one in a recycled file is an older batch of the same partition, whole
/// and with a valid CRC (not the zero padding of a partial block).
const BATCH_BYTES: usize = 8192;

/// The four records of batch `tag` and the batch itself, exactly
/// [`BATCH_BYTES`] long (the first value takes up the difference).
fn aligned_batch(tag: &str) -> (Vec<Vec<u8>>, bytes::Bytes) {
    let build = |values: &[Vec<u8>]| {
        let mut b = strand_storage::batch::BatchBuilder::new();
        for v in values {
            b.push(Some(tag.as_bytes()), Some(v), &[], TS);
        }
        b.build().freeze()
    };
    let mut values: Vec<Vec<u8>> = (0..4).map(|k| padded(tag, k)).collect();
    let len = build(&values).len();
    values[0].resize(PADDED + BATCH_BYTES - len, b'.');
    let batch = build(&values);
    assert_eq!(batch.len(), BATCH_BYTES);
    (values, batch)
}

/// Sum over the shards of a per-shard counter.
fn total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// 256 KiB segments and 1 MiB of size retention: the partition's new
/// segments go into the files retention frees, so when the broker is
/// killed, older batches of the same partition lie past the end of its
/// active segment. After the restart the log starts at a segment boundary,
/// holds no gap, and every acknowledged batch at or after its start is
/// there, intact.
#[test]
fn acknowledged_records_survive_kill_9_in_recycled_segments() {
    for seed in 6..=7u64 {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("strand.toml");
        std::fs::write(&config, "segment_bytes = 262144\nmax_message_bytes = 65536\n").unwrap();
        let data = dir.path().join("data");
        let args = ["--config", config.to_str().unwrap()];
        let broker = Broker::start_with(&data, &args);
        let admin = strand_client::Admin::connect(&broker.addr.to_string()).unwrap();
        let spec = strand_client::QueueSpec {
            partitions: Some(1),
            fsync: Some(strand_client::FsyncSpec::Always),
            retention_ms: Some(None),
            retention_bytes: Some(Some(1 << 20)),
            ..Default::default()
        };
        strand_client::block_on(admin.create_queue("recycled", &spec)).unwrap();
        let acked: Acked = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let sending = Sending {
            queue: "recycled",
            partition: 0,
            acks: 1,
            acked: acked.clone(),
            stop: stop.clone(),
        };
        let producer = sending.spawn(broker.addr, move |i| {
            let tag = format!("s{seed}b{i}");
            let (_, batch) = aligned_batch(&tag);
            (tag, batch)
        });
        // Until a few rolls went into recycled files, then a seeded moment.
        let deadline = Instant::now() + Duration::from_secs(60);
        while total(&scrape(&broker), "strand_segments_recycled_total") < 3.0 {
            assert!(Instant::now() < deadline, "seed {seed}: no segment was recycled");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(5 + (seed * 7919) % 100));
        broker.kill9();
        stop.store(true, Ordering::SeqCst);
        let _ = producer.join();
        let acked = acked.lock().unwrap().clone();

        let broker = Broker::start_with(&data, &args);
        let mut c = broker.client();
        let (start, _) = c.list_offset("recycled", 0, OffsetSpec::Earliest, 0);
        assert!(start > 0, "seed {seed}: retention never moved the start");
        let records = c.fetch_all("recycled", 0, start);
        for (i, (offset, _)) in records.iter().enumerate() {
            assert_eq!(
                *offset,
                start + i as u64,
                "seed {seed}: offsets from the start have no gap"
            );
        }
        let last = acked.iter().map(|a| a.2).max().unwrap();
        assert!(
            start + records.len() as u64 > last,
            "seed {seed}: acknowledged offset {last} lost"
        );
        let kept: Vec<_> = acked.iter().filter(|a| a.1 >= start).collect();
        assert!(
            kept.len() >= 20,
            "seed {seed}: only {} acknowledged batches kept",
            kept.len()
        );
        for (_, base, last, tag) in kept {
            let (values, _) = aligned_batch(tag);
            for (k, offset) in (*base..=*last).enumerate() {
                let (o, v) = &records[(offset - start) as usize];
                assert_eq!(*o, offset);
                assert_eq!(v, &values[k], "seed {seed}: offset {offset}");
            }
        }
        // Nothing past the last acknowledged batch but what was being
        // acknowledged when the broker died (at most a few requests).
        assert!(
            start + (records.len() as u64) <= last + 1 + 16 * 4,
            "seed {seed}: {} records past the last acknowledged offset {last}",
            start + records.len() as u64 - last - 1
        );
        assert_eq!(broker.terminate().code(), Some(0));
    }
}
