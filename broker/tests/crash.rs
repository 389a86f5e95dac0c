//! Acknowledged records survive `kill -9` of the broker: producers with
//! acks=1 on an fsync=always queue, and with acks=all on an fsync=interval
//! queue (acknowledged once written to the device), record what was
//! acknowledged; the broker is killed at a random moment, restarted, and
//! every acknowledged record is there, intact, at its offset. (acks=1 on an
//! fsync=interval queue is answered before the write, and may lose the
//! last milliseconds: not tested here, by design.)

#![allow(clippy::unwrap_used)] // the crash helper runs outside #[test] fns

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

/// (partition, base offset, last offset, tag) of each acknowledged batch.
type Acked = Arc<Mutex<Vec<(u32, u64, u64, String)>>>;

#[test]
fn acknowledged_records_survive_kill_9() {
    for seed in 1..=3u64 {
        crash_once(seed, strand_client::FsyncSpec::Always, 1);
    }
}

#[test]
fn acks_all_on_interval_queues_survive_kill_9() {
    for seed in 4..=5u64 {
        crash_once(seed, strand_client::FsyncSpec::Interval { ms: 1000, bytes: 0 }, -1);
    }
}

fn crash_once(seed: u64, fsync: strand_client::FsyncSpec, acks: i8) {
    {
        let dir = tempfile::tempdir().unwrap();
        let broker = Broker::start(dir.path());
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
                let (acked, stop, addr) = (acked.clone(), stop.clone(), broker.addr);
                std::thread::spawn(move || {
                    let mut c = Client::connect(addr);
                    for i in 0.. {
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        let tag = format!("s{seed}p{p}b{i}");
                        // The connection dies with the broker: stop there.
                        let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            c.produce("durable", p, batch(&tag, 1 + i % 4, TS), acks)
                        }));
                        match sent {
                            Ok(Ok((base, last))) => acked.lock().unwrap().push((p, base, last, tag)),
                            _ => return,
                        }
                    }
                })
            })
            .collect();
        // Let some batches through, then kill at a seeded moment.
        while acked.lock().unwrap().len() < 20 {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(10 + (seed * 7919) % 200));
        broker.kill9();
        stop.store(true, Ordering::SeqCst);
        for p in producers {
            let _ = p.join();
        }
        let acked = acked.lock().unwrap().clone();
        assert!(acked.len() >= 20);

        let broker = Broker::start(dir.path());
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
