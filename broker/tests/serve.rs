//! `strand serve` end to end: the real binary on loopback, spoken to with
//! the protocol codec.

mod common;

use common::*;
use strand_wire::{ErrorCode, OffsetSpec};

#[test]
fn produce_from_many_connections_and_fetch_back_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let mut admin = broker.client();
    assert_eq!(admin.create_queue("orders", 4), ErrorCode::None);
    assert_eq!(admin.create_queue("orders", 4), ErrorCode::QueueAlreadyExists);

    // Three connections, each producing to every partition.
    let addr = broker.addr;
    let producers: Vec<_> = (0..3)
        .map(|c| {
            std::thread::spawn(move || {
                let mut client = Client::connect(addr);
                for round in 0..10 {
                    for p in 0..4 {
                        let tag = format!("c{c}r{round}p{p}");
                        client.produce("orders", p, batch(&tag, 5, TS + round), 1).unwrap();
                    }
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    for p in 0..4 {
        let records = admin.fetch_all("orders", p, 0);
        assert_eq!(records.len(), 3 * 10 * 5, "partition {p}");
        for (i, (offset, _)) in records.iter().enumerate() {
            assert_eq!(*offset, i as u64, "offsets are dense and in order");
        }
        // Each connection's batches arrive in the order it sent them.
        for c in 0..3 {
            let mine: Vec<String> = records
                .iter()
                .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
                .filter(|v| v.starts_with(&format!("c{c}r")))
                .collect();
            let expected: Vec<String> = (0..10)
                .flat_map(|r| (0..5).map(move |i| format!("c{c}r{r}p{p}-{i}")))
                .collect();
            assert_eq!(mine, expected);
        }
        assert_eq!(admin.list_offset("orders", p, OffsetSpec::Earliest, 0), (0, true));
        assert_eq!(admin.list_offset("orders", p, OffsetSpec::Latest, 0), (150, true));
        // Round 7 was produced with timestamp TS + 7: its first record.
        let (at, found) = admin.list_offset("orders", p, OffsetSpec::Timestamp, TS + 7);
        assert!(found);
        let records_at: Vec<_> = records.iter().filter(|(o, _)| *o >= at).collect();
        assert!(String::from_utf8(records_at[0].1.clone()).unwrap().contains("r7"));
        assert_eq!(
            admin.list_offset("orders", p, OffsetSpec::Timestamp, TS + 1000),
            (150, false)
        );
    }
    assert_eq!(broker.terminate().code(), Some(0));
}

#[test]
fn long_poll_wakes_on_new_data() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let mut admin = broker.client();
    assert_eq!(admin.create_queue("events", 2), ErrorCode::None);
    for p in 0..2 {
        let addr = broker.addr;
        let waiter = std::thread::spawn(move || {
            let mut c = Client::connect(addr);
            let started = std::time::Instant::now();
            let (batches, _) = c.fetch("events", p, 0, 20_000, 1).unwrap();
            (batches.len(), started.elapsed())
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        admin.produce("events", p, batch("late", 1, TS), 1).unwrap();
        let (got, waited) = waiter.join().unwrap();
        assert_eq!(got, 1, "the long poll returned the new batch");
        assert!(
            waited < std::time::Duration::from_secs(20),
            "woken by the data, not the timeout"
        );
    }
    // With nothing new, the poll ends at max_wait with no data.
    let (batches, hw) = admin.fetch("events", 0, 1, 200, 1).unwrap();
    assert!(batches.is_empty());
    assert_eq!(hw, 1);
}

/// Chained fetches (sent before the answer they follow): each starts where
/// the previous fetch of the partition on the connection ends; a chain that
/// does not match reads from the request's offset (a duplicate, never a
/// gap); at the tail, the chained fetch waits in the broker and takes the
/// next data at once.
#[test]
fn chained_fetches_follow_on_and_never_skip() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let mut admin = broker.client();
    assert_eq!(admin.create_queue("chain", 1), ErrorCode::None);
    for i in 0..5 {
        admin.produce("chain", 0, batch(&format!("b{i}"), 3, TS), 1).unwrap();
    }
    let bases = |c: &mut Client, n: usize| -> Vec<u64> {
        (0..n)
            .map(|_| {
                let (batches, _) = fetched(&c.recv()).unwrap();
                assert_eq!(batches.len(), 1, "max_bytes 1: one batch an answer");
                batches[0].base_offset().0
            })
            .collect()
    };
    let mut c = broker.client();
    // A plain fetch, then two chained ones, all sent before any answer.
    c.send_fetch("chain", &[(0, 0)], 1, 0, 0, false);
    c.send_fetch("chain", &[(0, 0)], 1, 0, 0, true);
    c.send_fetch("chain", &[(0, 3)], 1, 0, 0, true);
    assert_eq!(bases(&mut c, 3), [0, 3, 6]);
    // The chain says the last fetch started at 7: it started at 6, so this
    // one reads from 7 — the batch holding it, again.
    c.send_fetch("chain", &[(0, 7)], 1, 0, 0, true);
    assert_eq!(bases(&mut c, 1), [6]);
    // A new connection has no chain: from the offset.
    let mut fresh = broker.client();
    fresh.send_fetch("chain", &[(0, 9)], 1, 0, 0, true);
    assert_eq!(bases(&mut fresh, 1), [9]);
    // A partition named twice in one chained request is answered (its second
    // entry cannot wait for the first).
    let id = fresh.send_fetch("chain", &[(0, 9), (0, 9)], 1, 0, 0, true);
    assert_eq!(fresh.recv().header.correlation_id, id);

    // At the tail: a long poll and one chained behind it, then two batches.
    let mut tail = broker.client();
    tail.send_fetch("chain", &[(0, 15)], 1 << 20, 20_000, 1, false);
    tail.send_fetch("chain", &[(0, 15)], 1 << 20, 20_000, 1, true);
    let started = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_millis(200));
    admin.produce("chain", 0, batch("late1", 2, TS), 1).unwrap();
    let first = fetched(&tail.recv()).unwrap().0;
    assert_eq!(first[0].base_offset().0, 15);
    admin.produce("chain", 0, batch("late2", 2, TS), 1).unwrap();
    let second = fetched(&tail.recv()).unwrap().0;
    assert_eq!(
        second[0].base_offset().0,
        17,
        "the chained fetch starts where the first ended"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "woken by the data, not the timeouts"
    );
}

#[test]
fn a_plain_fetch_ends_the_long_polls_it_supersedes() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let mut admin = broker.client();
    assert_eq!(admin.create_queue("seek", 2), ErrorCode::None);
    for p in 0..2 {
        admin.produce("seek", p, batch("a", 3, TS), 1).unwrap();
        admin.produce("seek", p, batch("b", 3, TS), 1).unwrap();
    }
    // At the tail: a long poll and a chained one behind it, as a pipelined
    // consumer leaves them; then it seeks back, and fetches from 0. The
    // answers come in request order, so without ending the long polls the
    // seek's answer would wait 20 s behind them.
    let mut c = broker.client();
    c.send_fetch("seek", &[(0, 6)], 1 << 20, 10_000, 1, false);
    c.send_fetch("seek", &[(0, 6)], 1 << 20, 10_000, 1, true);
    let started = Instant::now();
    let id = c.send_fetch("seek", &[(0, 0)], 1 << 20, 10_000, 1, false);
    for _ in 0..2 {
        assert!(fetched(&c.recv()).unwrap().0.is_empty(), "nothing past the tail");
    }
    let seek = c.recv();
    assert_eq!(seek.header.correlation_id, id);
    assert_eq!(fetched(&seek).unwrap().0[0].base_offset().0, 0);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    // Another partition's plain fetch leaves a long poll alone.
    let started = Instant::now();
    c.send_fetch("seek", &[(0, 6)], 1 << 20, 800, 1, false);
    c.send_fetch("seek", &[(1, 0)], 1 << 20, 800, 1, false);
    assert!(fetched(&c.recv()).unwrap().0.is_empty());
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(fetched(&c.recv()).unwrap().0[0].base_offset().0, 0);
    // Nor does a plain fetch supersede itself when it names a partition twice.
    let started = Instant::now();
    c.send_fetch("seek", &[(0, 6), (0, 6)], 1 << 20, 800, 1, false);
    assert!(fetched(&c.recv()).unwrap().0.is_empty());
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn restart_keeps_queues_and_data_and_delete_removes_files() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let mut c = broker.client();
    assert_eq!(c.create_queue("keep", 3), ErrorCode::None);
    for i in 0..20u32 {
        c.produce("keep", i % 3, batch(&format!("b{i}"), 3, TS), 1).unwrap();
    }
    drop(c);
    assert_eq!(broker.terminate().code(), Some(0), "SIGTERM exits 0");

    let broker = Broker::start(dir.path());
    let mut c = broker.client();
    let mut total = 0;
    for p in 0..3 {
        total += c.fetch_all("keep", p, 0).len();
    }
    assert_eq!(total, 60);
    assert_eq!(
        c.create_queue("keep", 3),
        ErrorCode::QueueAlreadyExists,
        "the queue survived"
    );
    assert!(dir.path().join("keep").exists());
    assert_eq!(c.delete_queue("keep"), ErrorCode::None);
    assert!(!dir.path().join("keep").exists(), "delete removes the queue's files");
    assert_eq!(c.fetch("keep", 0, 0, 0, 0).unwrap_err(), ErrorCode::UnknownQueue);
    assert_eq!(c.delete_queue("keep"), ErrorCode::UnknownQueue);
    // Created again, it starts empty.
    assert_eq!(c.create_queue("keep", 1), ErrorCode::None);
    assert!(c.fetch_all("keep", 0, 0).is_empty());
}

#[test]
fn bad_requests_get_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(dir.path(), &[]);
    let mut c = broker.client();
    assert_eq!(c.create_queue("a/b", 1), ErrorCode::InvalidQueueName);
    assert_eq!(c.create_queue("..", 1), ErrorCode::InvalidQueueName);
    assert_eq!(
        c.create_queue_rf("rf3", 1, 3),
        ErrorCode::InvalidConfig,
        "one node serves RF 1 only"
    );
    let err = c.produce("nope", 0, batch("x", 1, TS), 1).unwrap_err();
    assert_eq!(err.0, ErrorCode::UnknownQueue);
    assert_eq!(c.create_queue("q", 2), ErrorCode::None);
    assert_eq!(
        c.produce("q", 7, batch("x", 1, TS), 1).unwrap_err().0,
        ErrorCode::UnknownPartition
    );
    // A corrupt batch (flipped payload byte) is refused; the log is unchanged.
    let mut bad = batch("x", 3, TS).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    assert_eq!(c.produce("q", 0, bad.into(), 1).unwrap_err().0, ErrorCode::CorruptBatch);
    // Over the 1 MiB default message limit.
    let big = {
        let mut b = strand_storage::batch::BatchBuilder::new();
        b.push(None, Some(&vec![7u8; 1_100_000]), &[], TS);
        b.build().freeze()
    };
    assert_eq!(c.produce("q", 0, big, 1).unwrap_err().0, ErrorCode::MessageTooLarge);
    assert_eq!(c.fetch("q", 0, 5, 0, 0).unwrap_err(), ErrorCode::OffsetOutOfRange);
    assert_eq!(c.produce("q", 0, batch("ok", 1, TS), 1).unwrap(), (0, 0));
}

#[test]
fn a_second_broker_on_a_busy_port_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let other = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_strand"))
        .args([
            "serve",
            "--cores",
            "1",
            "--listen",
            &broker.addr.to_string(),
            "--data-dir",
        ])
        .arg(other.path())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use"), "{err}");
    // The first broker is untouched.
    assert_eq!(broker.client().create_queue("still-here", 1), ErrorCode::None);
}
