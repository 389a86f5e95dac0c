//! The metrics endpoint against a running broker: series values after
//! produce and consume (log end = what was produced, lag = what the group
//! has not consumed), `/health`, bad and slow requests, many concurrent
//! scrapes.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use strand_client::*;
use strand_wire::ErrorCode;

#[test]
fn series_follow_produce_and_consume() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    assert_eq!(broker.client().create_queue("m", 2), ErrorCode::None);
    let addr = broker.addr.to_string();
    let producer = Producer::new(&addr, ProducerConfig::default()).unwrap();
    for i in 0..100u32 {
        let key = format!("k{}", i % 2);
        block_on(producer.send("m", Some(key.as_bytes()), b"0123456789", &[])).unwrap();
    }
    // A group reads 60 of them and commits.
    let config = GroupConfig {
        start: GroupStart::Earliest,
        auto_commit: false,
        consumer: ConsumerConfig {
            max_wait: Duration::from_millis(100),
            ..ConsumerConfig::default()
        },
        ..GroupConfig::default()
    };
    let mut member = block_on(GroupConsumer::subscribe(&addr, "readers", &["m"], config)).unwrap();
    let mut read = 0;
    while read < 60 {
        for r in block_on(member.poll()).unwrap() {
            if read < 60 {
                block_on(member.commit_record(&r)).unwrap();
                read += 1;
            }
        }
    }
    block_on(member.close()).unwrap();

    let text = scrape(&broker);
    let end = |p: u32| {
        value(
            &text,
            &format!("strand_partition_log_end_offset{{queue=\"m\",partition=\"{p}\"}}"),
        )
        .unwrap()
    };
    let hw = |p: u32| {
        value(
            &text,
            &format!("strand_partition_high_watermark{{queue=\"m\",partition=\"{p}\"}}"),
        )
        .unwrap()
    };
    assert_eq!(end(0) + end(1), 100.0, "{text}");
    assert_eq!(hw(0) + hw(1), 100.0);
    let lag = |p: u32| {
        value(
            &text,
            &format!("strand_group_lag{{group=\"readers\",queue=\"m\",partition=\"{p}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(lag(0) + lag(1), 40.0, "lag = what the group has not consumed\n{text}");
    assert_eq!(value(&text, "strand_produce_requests_total{queue=\"m\"}"), Some(100.0));
    assert!(value(&text, "strand_produce_bytes_total{queue=\"m\"}").unwrap() > 1000.0);
    assert!(value(&text, "strand_fetch_bytes_total{queue=\"m\"}").unwrap() > 0.0);
    assert!(value(&text, "strand_group_rebalances_total{group=\"readers\"}").unwrap() >= 1.0);
    assert!(value(&text, "strand_partition_stored_bytes{queue=\"m\",partition=\"0\"}").unwrap() > 0.0);
    assert!(text.contains("strand_request_latency_seconds_bucket"), "{text}");
    assert!(text.contains("strand_connections{shard=\"0\"}"));
    // What the binary is: its version and the commit `strand --version`
    // names.
    let version = std::process::Command::new(env!("CARGO_BIN_EXE_strand"))
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8(version.stdout).unwrap();
    let commit = version
        .split("(commit ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no commit in {version:?}"));
    assert!(
        version.starts_with(&format!("strand {} (commit ", env!("CARGO_PKG_VERSION"))) && version.contains(", built "),
        "{version}"
    );
    let info = format!(
        "strand_build_info{{version=\"{}\",commit=\"{commit}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.contains(&info), "no {info} in {text}");
    // fsync=always: every produce was made durable, by write-through writes
    // (the default: `write_through`), with no fdatasync after them.
    let through: f64 = ["0", "1"]
        .iter()
        .filter_map(|shard| {
            value(
                &text,
                &format!("strand_write_through_writes_total{{shard=\"{shard}\"}}"),
            )
        })
        .sum();
    assert!(through >= 1.0, "{text}");
    for shard in ["0", "1"] {
        assert!(value(&text, &format!("strand_shard_forward_queue_depth{{shard=\"{shard}\"}}")).is_some());
        let stalls = value(&text, &format!("strand_reactor_stalls_total{{shard=\"{shard}\"}}")).unwrap();
        let off_cpu = value(
            &text,
            &format!("strand_reactor_stalls_off_cpu_total{{shard=\"{shard}\"}}"),
        )
        .unwrap();
        assert!(off_cpu <= stalls, "{off_cpu} of {stalls} stalls off the CPU");
        let busy = value(&text, &format!("strand_shard_busy_ratio{{shard=\"{shard}\"}}")).unwrap();
        assert!((0.0..=1.0).contains(&busy), "{busy}");
        assert!(value(&text, &format!("strand_shard_requests_in_flight{{shard=\"{shard}\"}}")).is_some());
    }
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn health_bad_requests_and_many_scrapers() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    assert_eq!(
        http(broker.metrics, "GET /health HTTP/1.1\r\n\r\n"),
        (200, "ok\n".to_string())
    );
    assert_eq!(http(broker.metrics, "GET /nope HTTP/1.1\r\n\r\n").0, 404);
    assert_eq!(http(broker.metrics, "POST /metrics HTTP/1.1\r\n\r\n").0, 405);
    assert_eq!(
        http(broker.metrics, &format!("GET /{} HTTP/1.1\r\n\r\n", "x".repeat(10_000))).0,
        431
    );
    // A client that sends half a request and stalls is cut off.
    let mut slow = TcpStream::connect(broker.metrics).unwrap();
    slow.write_all(b"GET /met").unwrap();
    // 100 concurrent scrapers, while the stalled one waits.
    let scrapers: Vec<_> = (0..100)
        .map(|_| {
            let m = broker.metrics;
            std::thread::spawn(move || http(m, "GET /metrics HTTP/1.1\r\n\r\n").0)
        })
        .collect();
    for s in scrapers {
        assert_eq!(s.join().unwrap(), 200);
    }
    slow.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = String::new();
    slow.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    // The broker serves on.
    assert_eq!(broker.client().create_queue("after", 1), ErrorCode::None);
    // Produce latency with and without 100 scrapers at once: measured and
    // printed (timing is not asserted in tests; see bench/).
    let producer = Producer::new(&broker.addr.to_string(), ProducerConfig::default()).unwrap();
    let sends = |n: usize| {
        let mut took: Vec<Duration> = (0..n)
            .map(|_| {
                let t = std::time::Instant::now();
                block_on(producer.send("after", None, b"x", &[])).unwrap();
                t.elapsed()
            })
            .collect();
        took.sort();
        (took[n / 2], took[n * 99 / 100])
    };
    let quiet = sends(300);
    let m = broker.metrics;
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let scrapers: Vec<_> = (0..100)
        .map(|_| {
            let busy = busy.clone();
            std::thread::spawn(move || {
                // Each scrapes every 200 ms: 500 scrapes a second in all.
                while busy.load(std::sync::atomic::Ordering::SeqCst) {
                    assert_eq!(http(m, "GET /metrics HTTP/1.1\r\n\r\n").0, 200);
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        })
        .collect();
    let scraped = sends(300);
    busy.store(false, std::sync::atomic::Ordering::SeqCst);
    for s in scrapers {
        s.join().unwrap();
    }
    eprintln!(
        "produce latency p50/p99: {:?}/{:?} alone, {:?}/{:?} under 100 scrapers (each every 200 ms)",
        quiet.0, quiet.1, scraped.0, scraped.1
    );
    assert_eq!(http(broker.metrics, "GET /health HTTP/1.1\r\n\r\n").0, 200);
}

#[test]
fn logs_can_be_json_lines() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = serve_command("127.0.0.1:0", &["--cores", "1", "--log-format", "json", "--data-dir"])
        .arg(dir.path())
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let line = std::io::BufReader::new(stderr).lines().next().unwrap().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["serve", "--log-format", "yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--log-format must be human or json"));
}

#[test]
fn strand_top_shows_rates_lag_and_hot_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    assert_eq!(broker.client().create_queue("hot", 4), ErrorCode::None);
    let addr = broker.addr.to_string();
    // A hot key: every record of one key lands on one partition.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s, a) = (stop.clone(), addr.clone());
    let load = std::thread::spawn(move || {
        let producer = Producer::new(&a, ProducerConfig::default()).unwrap();
        let mut i = 0u64;
        while !s.load(std::sync::atomic::Ordering::SeqCst) {
            let key: &[u8] = if i % 10 == 0 { b"cold" } else { b"the-hot-key" };
            block_on(producer.send("hot", Some(key), b"payload", &[])).unwrap();
            i += 1;
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_strand"))
        .args([
            "top",
            "--metrics",
            &broker.metrics.to_string(),
            "--interval-ms",
            "700",
            "--iterations",
            "2",
        ])
        .output()
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    load.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.matches("strand top").count(), 2, "{text}");
    assert!(text.lines().any(|l| l.starts_with("hot ")), "{text}");
    let hot = strand_wire::partition_for_key(b"the-hot-key", 4);
    assert!(
        text.contains(&format!("hot/{hot}: ")),
        "the hot key's partition is flagged:\n{text}"
    );
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["top", "--metrics", "127.0.0.1:1", "--iterations", "1"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert_eq!(String::from_utf8_lossy(&bad.stderr).trim_end().lines().count(), 1);
}

/// The sum of a counter over the broker's shards, and its value per shard.
fn per_shard(text: &str, series: &str, shards: u16) -> Vec<f64> {
    (0..shards)
        .map(|s| value(text, &format!("{series}{{shard=\"{s}\"}}")).unwrap_or(0.0))
        .collect()
}

/// A connection is served by the shard its client port picks (a
/// shard-aware client picks the port), and the client library's producer
/// and consumer send each partition's requests to its owning shard: none is
/// forwarded between cores. A request sent deliberately to the other shard
/// is forwarded, and counted.
#[test]
fn connections_are_served_by_the_shard_their_port_picks() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path()); // 2 shards
    let addr = broker.addr.to_string();
    let wait_for_connections = |want: &[f64]| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let got = per_shard(&scrape(&broker), "strand_connections", 2);
            if got == want {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "connections per shard {got:?}, want {want:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // Each shard in turn: the connection is counted by that shard alone.
    for shard in 0..2u16 {
        let conn = Connection::connect_placed(&addr, Duration::ZERO, Some((shard, 2))).unwrap();
        let port = conn.local_addr().unwrap().port();
        assert_eq!(strand_wire::shard_for_port(port, 2), shard);
        let mut want = vec![0.0; 2];
        want[usize::from(shard)] = 1.0;
        wait_for_connections(&want);
        drop(conn);
        wait_for_connections(&[0.0, 0.0]);
    }

    // Producer and consumer over 4 partitions (two per shard).
    assert_eq!(broker.client().create_queue("placed", 4), ErrorCode::None);
    let producer = Producer::new(&addr, ProducerConfig::default()).unwrap();
    for i in 0..400u32 {
        let key = format!("k{i}");
        block_on(producer.send("placed", Some(key.as_bytes()), b"v", &[])).unwrap();
    }
    let mut consumer = Consumer::new(
        &addr,
        ConsumerConfig {
            max_wait: Duration::from_millis(50),
            ..ConsumerConfig::default()
        },
    )
    .unwrap();
    consumer.assign("placed", &[0, 1, 2, 3]);
    consumer.seek_all(Seek::Earliest);
    let mut read = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while read < 400 {
        assert!(std::time::Instant::now() < deadline, "read {read} of 400");
        read += block_on(consumer.poll()).unwrap().len();
    }
    let forwarded = per_shard(&scrape(&broker), "strand_shard_forwarded_requests_total", 2);
    assert_eq!(forwarded, vec![0.0, 0.0], "requests forwarded per shard");

    // One produce sent on shard 0's connection for a partition of shard 1.
    let partition = (0..4)
        .find(|&p| strand_wire::shard_for_partition("placed", p, 2) == 1)
        .unwrap();
    let conn = Connection::connect_placed(&addr, Duration::ZERO, Some((0, 2))).unwrap();
    let mut batch = strand_wire::batch::BatchBuilder::new();
    batch.push(None, Some(b"across"), &[], 0);
    let (body, tail) = requests::produce("placed", partition, 1, batch.build().freeze());
    let frame = block_on(conn.request(strand_wire::Api::Produce, &body, tail)).unwrap();
    requests::produced(&frame).unwrap();
    let forwarded = per_shard(&scrape(&broker), "strand_shard_forwarded_requests_total", 2);
    assert_eq!(forwarded, vec![1.0, 0.0], "requests forwarded per shard");
}

/// A pipelined idempotent producer with linger 0 (the calling thread and the
/// sender thread both write batches) gets none of its batches refused as out
/// of order, and every record lands once, in order; a batch that is out of
/// order is counted.
#[test]
fn pipelined_sends_reach_the_leader_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    assert_eq!(broker.client().create_queue("seq", 1), ErrorCode::None);
    let addr = broker.addr.to_string();
    let producer = Producer::new(
        &addr,
        ProducerConfig {
            acks: Acks::Leader,
            batch_bytes: 16 << 10,
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    let n = 100_000u32;
    let mut last = None;
    for i in 0..n {
        last = Some(block_on(producer.enqueue("seq", None, &i.to_be_bytes(), &[])).unwrap());
    }
    block_on(producer.flush());
    assert!(block_on(last.unwrap()).is_ok());
    let text = scrape(&broker);
    let refused: f64 = per_shard(&text, "strand_produce_sequence_refusals_total", 2)
        .iter()
        .sum();
    assert_eq!(refused, 0.0, "batches refused as out of order");
    assert_eq!(
        value(&text, "strand_partition_log_end_offset{queue=\"seq\",partition=\"0\"}"),
        Some(f64::from(n))
    );
    let mut consumer = Consumer::new(&addr, ConsumerConfig::default()).unwrap();
    consumer.assign("seq", &[0]);
    consumer.seek_all(Seek::Earliest);
    let mut next = 0u32;
    while next < n {
        for r in block_on(consumer.poll()).unwrap() {
            assert_eq!(
                r.value.as_deref(),
                Some(&next.to_be_bytes()[..]),
                "record {} out of order",
                r.offset
            );
            next += 1;
        }
    }

    // One batch that skips ahead, straight on the wire: refused and counted.
    let mut raw = broker.client();
    let mut b = strand_wire::batch::BatchBuilder::new();
    b.producer(5, 0, 9);
    b.push(None, Some(b"ahead"), &[], 0);
    let err = raw.produce("seq", 0, b.build().freeze(), 1).unwrap_err();
    assert_eq!(err.0, ErrorCode::UnknownProducer, "{}", err.1);
    let refused: f64 = per_shard(&scrape(&broker), "strand_produce_sequence_refusals_total", 2)
        .iter()
        .sum();
    assert_eq!(refused, 1.0);

    // A resend of a stored batch is answered, and not counted as produced.
    let produced = || value(&scrape(&broker), "strand_produce_bytes_total{queue=\"seq\"}").unwrap();
    let before = produced();
    let mut b = strand_wire::batch::BatchBuilder::new();
    b.producer(6, 0, 0);
    b.push(None, Some(b"once"), &[], 0);
    let once = b.build().freeze();
    let first = raw.produce("seq", 0, once.clone(), 1).unwrap();
    assert_eq!(raw.produce("seq", 0, once.clone(), 1).unwrap(), first);
    assert_eq!(produced() - before, once.len() as f64);
}

/// Batches read from disk (a restarted broker: cold caches) and fetched over
/// a connection of the other shard travel between shards: they arrive whole
/// and none of the owning shard's I/O buffers is dropped on another thread
/// (the broker copies them on the way; a leak would be counted).
#[test]
fn batches_read_from_disk_for_another_shard_arrive_whole() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path()); // 2 shards
    assert_eq!(broker.client().create_queue("cold", 2), ErrorCode::None);
    let addr = broker.addr.to_string();
    let value = vec![7u8; 1000];
    for partition in 0..2u32 {
        let owner = strand_wire::shard_for_partition("cold", partition, 2);
        let conn = Connection::connect_placed(&addr, Duration::ZERO, Some((owner, 2))).unwrap();
        for _ in 0..30 {
            let mut batch = strand_wire::batch::BatchBuilder::new();
            for _ in 0..100 {
                batch.push(None, Some(&value), &[], 0);
            }
            let (body, tail) = requests::produce("cold", partition, 1, batch.build().freeze());
            let frame = block_on(conn.request(strand_wire::Api::Produce, &body, tail)).unwrap();
            requests::produced(&frame).unwrap();
        }
    }
    assert!(broker.terminate().success());
    let broker = Broker::start(dir.path());
    let addr = broker.addr.to_string();
    for partition in 0..2u32 {
        let owner = strand_wire::shard_for_partition("cold", partition, 2);
        let conn = Connection::connect_placed(&addr, Duration::ZERO, Some((1 - owner, 2))).unwrap();
        let mut offset = 0u64;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while offset < 3000 {
            assert!(
                std::time::Instant::now() < deadline,
                "{partition}: read to {offset} of 3000"
            );
            let body = requests::fetch("cold", partition, offset, 256 << 10);
            let frame = block_on(conn.request(strand_wire::Api::Fetch, &body, Default::default())).unwrap();
            for b in requests::fetched(&frame, "cold").unwrap() {
                let batch = strand_wire::batch::RecordBatch::new(b, usize::MAX).expect("whole, intact batches");
                let from = offset;
                for r in batch.records().filter(|r| r.offset.0 >= from) {
                    assert_eq!(r.offset.0, offset);
                    assert_eq!(r.value.as_deref(), Some(&value[..]));
                    offset += 1;
                }
            }
        }
    }
    let text = scrape(&broker);
    let forwarded: f64 = per_shard(&text, "strand_shard_forwarded_requests_total", 2)
        .iter()
        .sum();
    assert!(forwarded > 0.0, "the fetches crossed between shards");
    let leaked = text
        .lines()
        .find(|l| l.starts_with("strand_storage_foreign_buffer_drops_total"))
        .and_then(|l| l.split_whitespace().last())
        .expect("the leak counter is exported");
    assert_eq!(leaked, "0", "I/O buffers dropped on another shard");
}
