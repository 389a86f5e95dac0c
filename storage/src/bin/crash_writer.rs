//! `strand-storage-crash-writer DIR SEED [recycle] [journal]`: the child process of
//! the crash test (`tests/crash.rs`). Appends to the log in `DIR/p0` with
//! `fsync=always` from four concurrent producers and prints one line per
//! batch once it is durable: `<base offset> <last offset> <tag>`. The
//! leader epoch moves up every 5 batches of producer 0; every 10th batch of producer 1
//! also moves the high watermark to the end of its batch and checkpoints
//! it, then prints `hw <offset>`. The parent kills it with SIGKILL at a
//! random moment and checks that every printed batch survived, that the
//! epoch history matches the batches, and that the high watermark is at
//! least the last one printed. With `recycle`, size retention keeps about three
//! segments, so most segments are written into recycled files. With
//! `journal`, the shard journal (`DIR/__journal`, checkpoints every 50 ms)
//! makes the appends durable and the segment is written behind. Exits by
//! itself after 20 s so it can never be left running.

use std::cell::Cell;
use std::io::Write;
use std::rc::Rc;
use std::time::{Duration, Instant};

use strand_storage::journal::JournalConfig;
use strand_storage::shard::ShardStorageConfig;
use strand_storage::{testkit, FsyncPolicy, LeaderEpoch, LogConfig, ShardStorage, StorageError};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(seed)) = (args.next(), args.next().and_then(|s| s.parse::<u64>().ok())) else {
        eprintln!("usage: strand-storage-crash-writer DIR SEED [recycle] [journal]");
        std::process::exit(2);
    };
    let flags: Vec<String> = args.collect();
    let recycle = flags.iter().any(|f| f == "recycle");
    let journal = flags.iter().any(|f| f == "journal");
    testkit::run_on_executor(move || async move {
        let shard = ShardStorage::open(&dir, ShardStorageConfig::default())
            .await
            .expect("opening the shard");
        if journal {
            let config = JournalConfig {
                file_bytes: 1 << 20,
                spare_files: 2,
                checkpoint_ms: 50,
                ..JournalConfig::default()
            };
            shard
                .start_journal(std::path::Path::new(&format!("{dir}/__journal")), config)
                .await
                .expect("starting the journal");
        }
        let config = LogConfig {
            fsync: FsyncPolicy::Always,
            segment_bytes_max: 256 << 10,
            batch_bytes_max: 64 << 10,
            index_interval_bytes: 4096,
            // The records are stamped in 2023: no time retention. With
            // `recycle`, size retention at each roll (about three segments
            // kept), so new segments go into freed files.
            retention_ms: None,
            retention_bytes: recycle.then_some(768 << 10),
            ..LogConfig::default()
        };
        let log = Rc::new(
            shard
                .open_log(format!("{dir}/p0"), config)
                .await
                .expect("opening the log"),
        );
        assert_eq!(log.journaled(), journal);
        let deadline = Instant::now() + Duration::from_secs(20);
        let epoch = Rc::new(Cell::new(1u32));
        let mut producers = Vec::new();
        for p in 0..4u64 {
            let (log, epoch) = (log.clone(), epoch.clone());
            producers.push(glommio::spawn_local(async move {
                let mut rng = seed.wrapping_mul(31).wrapping_add(p) | 1;
                for i in 0u64.. {
                    if Instant::now() > deadline {
                        return;
                    }
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let tag = (seed << 40) | (p << 32) | i;
                    let records = 1 + (rng % 8) as u32;
                    let value_len = 1 + (rng >> 8) as usize % 3000;
                    if p == 0 && i % 5 == 4 {
                        epoch.set(epoch.get() + 1);
                    }
                    // Another producer may append in a newer epoch while
                    // this one waits for room: then this one takes it too.
                    let info = loop {
                        let batch = testkit::batch(tag, records, value_len, 1_700_000_000_000);
                        match log.append(batch, LeaderEpoch(epoch.get())).await {
                            Err(StorageError::StaleEpoch(_)) => continue,
                            other => break other.expect("append"),
                        }
                    };
                    log.wait_durable(info.last_offset).await.expect("durable");
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{} {} {tag}", info.base_offset, info.last_offset).expect("stdout");
                    out.flush().expect("stdout");
                    drop(out);
                    if p == 1 && i % 10 == 9 {
                        log.advance_high_watermark(info.last_offset.plus(1));
                        log.checkpoint().await.expect("checkpoint");
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "hw {}", log.high_watermark()).expect("stdout");
                        out.flush().expect("stdout");
                    }
                }
            }));
        }
        for p in producers {
            p.await;
        }
    });
}
