//! What one client may take of a broker (issue 42's limits), from
//! outside: connections over the per-address limit are closed as they
//! come, idle ones are closed after their timeout, and many half-sent
//! large frames hold a bounded amount of the broker's memory and are
//! closed after theirs, while an ordinary client is served throughout.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{batch, scrape, value, Broker, TS};

/// A settings file in `dir` with `lines`.
fn settings(dir: &Path, lines: &str) -> PathBuf {
    let file = dir.join("strand.toml");
    std::fs::write(&file, lines).unwrap();
    file
}

/// Whether the broker closed `stream` within `wait` (a read that ends or
/// is reset), as opposed to keeping it open and silent.
fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => panic!("the broker sent bytes unasked"),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => false,
        Err(_) => true, // reset
    }
}

/// The broker's resident memory, in bytes.
fn rss(broker: &Broker) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", broker.child.id())).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// A counter of the scrape, 0 when absent.
fn count(broker: &Broker, series: &str) -> f64 {
    value(&scrape(broker), series).unwrap_or(0.0)
}

#[test]
fn connections_over_the_per_address_limit_are_refused_and_idle_ones_closed() {
    let dir = tempfile::tempdir().unwrap();
    let file = settings(
        dir.path(),
        "max_connections_per_ip = 20\nmax_connection_rate_per_ip = 0\nconnection_idle_timeout_ms = 3000\n",
    );
    let data = dir.path().join("data");
    let broker = Broker::start_with(&data, &["--config", file.to_str().unwrap(), "--cores", "1"]);
    // The ready check's connection may still be closing: let it go.
    std::thread::sleep(Duration::from_millis(300));
    let mut held: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(broker.addr).unwrap()).collect();
    let mut over: Vec<TcpStream> = (0..5).map(|_| TcpStream::connect(broker.addr).unwrap()).collect();
    for s in &mut over {
        assert!(closed_within(s, Duration::from_secs(5)), "a 21st connection was kept");
    }
    // The twenty stay open while they are not yet idle.
    for s in held.iter_mut().take(3) {
        assert!(!closed_within(s, Duration::from_millis(200)));
    }
    let refused = "strand_connections_refused_total{shard=\"0\",reason=\"max_connections_per_ip\"}";
    assert_eq!(count(&broker, refused), 5.0);
    // Silent for the idle timeout: closed, and counted.
    for s in &mut held {
        assert!(closed_within(s, Duration::from_secs(10)), "an idle connection was kept");
    }
    let idle = "strand_connections_closed_total{shard=\"0\",reason=\"idle\"}";
    assert!(count(&broker, idle) >= 20.0, "{}", scrape(&broker));
    // Their places came back: a client is served again.
    let mut client = broker.client();
    assert_eq!(client.create_queue("after", 1), strand_wire::ErrorCode::None);
    assert!(client.produce("after", 0, batch("a", 3, TS), 1).is_ok());
}

#[test]
fn half_sent_large_frames_hold_bounded_memory_and_are_closed_while_others_are_served() {
    const SENDERS: usize = 40;
    const HALF: usize = 8 << 20;
    let dir = tempfile::tempdir().unwrap();
    // Two 16 MiB frames' room for large requests; a frame begun must be
    // whole within 3 s.
    let file = settings(
        dir.path(),
        "request_memory_bytes = 33554432\nconnection_in_flight_bytes = 16777216\nframe_receive_timeout_ms = 3000\n",
    );
    let data = dir.path().join("data");
    let broker = Broker::start_with(&data, &["--config", file.to_str().unwrap(), "--cores", "1"]);
    let mut client = broker.client();
    assert_eq!(client.create_queue("ordinary", 1), strand_wire::ErrorCode::None);
    let before = rss(&broker);
    // Each sender: the fixed fields of a produce frame of 16 MiB, then half
    // of its bytes, then nothing.
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let addr: SocketAddr = broker.addr;
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(8))).unwrap();
                let _ = s.write_all(&half_frame_head());
                let _ = s.write_all(&vec![0u8; HALF]);
                s // kept open, silent
            })
        })
        .collect();
    // While they send and stall, an ordinary client is served.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        assert!(client.produce("ordinary", 0, batch("o", 5, TS), 1).is_ok());
        std::thread::sleep(Duration::from_millis(50));
    }
    let streams: Vec<TcpStream> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    let grown = rss(&broker).saturating_sub(before);
    // Unbounded, 40 half frames would hold 320 MiB; the broker holds what
    // it reserved (32 MiB) and a read buffer per connection.
    eprintln!("the broker grew by {} MiB", grown >> 20);
    assert!(grown < 128 << 20, "the broker grew by {} MiB", grown >> 20);
    // The stalled frames are closed after their timeout, making room for
    // the next ones.
    let slow = "strand_connections_closed_total{shard=\"0\",reason=\"slow_frame\"}";
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(&broker, slow) < 2.0 {
        assert!(
            Instant::now() < deadline,
            "no stalled frame was closed: {}",
            scrape(&broker)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(client.produce("ordinary", 0, batch("o", 5, TS), 1).is_ok());
    drop(streams);
}

/// A client that pipelines fetches of large answers and never reads them
/// pins its connection's budget, not 64 answers: the broker stops reading
/// it while its answers wait, serves an ordinary client meanwhile, and
/// closes it once it has not taken what was written for the idle timeout
/// (before, it was kept for ever). Answers of data just written share the
/// log's buffers, so the memory they pin shows little here either way (9
/// MiB before the bound); answers read from disk each have their own.
#[test]
fn answers_a_client_does_not_read_hold_its_budget_and_it_is_closed() {
    const FETCHES: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    // 4 MiB frames, 8 MiB a connection: room for one fetch's answer and
    // its request, where 64 fetches of 4 MiB would hold 256 MiB.
    let file = settings(
        dir.path(),
        "max_frame_bytes = 4194304\nmax_message_bytes = 2097152\nconnection_in_flight_bytes = 8388608\n\
         connection_idle_timeout_ms = 3000\n",
    );
    let data = dir.path().join("data");
    let broker = Broker::start_with(&data, &["--config", file.to_str().unwrap(), "--cores", "1"]);
    let mut client = broker.client();
    assert_eq!(client.create_queue("big", 1), strand_wire::ErrorCode::None);
    assert_eq!(client.create_queue("ordinary", 1), strand_wire::ErrorCode::None);
    // 16 MiB in batches of 1 MiB (16 records of 64 KiB).
    let value = vec![7u8; 64 << 10];
    for _ in 0..16 {
        let mut b = strand_storage::batch::BatchBuilder::new();
        for _ in 0..16 {
            b.push(None, Some(&value), &[], TS);
        }
        assert!(client.produce("big", 0, b.build().freeze(), 1).is_ok());
    }
    let before = rss(&broker);
    let mut hog = broker.client();
    for _ in 0..FETCHES {
        hog.send_fetch("big", &[(0, 0)], 4 << 20, 0, 0, false);
    }
    // It reads nothing; an ordinary client is served meanwhile.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        assert!(client.produce("ordinary", 0, batch("o", 5, TS), 1).is_ok());
        std::thread::sleep(Duration::from_millis(50));
    }
    let grown = rss(&broker).saturating_sub(before);
    eprintln!("the broker grew by {} MiB", grown >> 20);
    assert!(grown < 64 << 20, "the broker grew by {} MiB", grown >> 20);
    // Not taking its answers for the idle timeout closes it.
    let slow = "strand_connections_closed_total{shard=\"0\",reason=\"slow_reader\"}";
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(&broker, slow) < 1.0 {
        assert!(Instant::now() < deadline, "the hog was kept: {}", scrape(&broker));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(client.produce("ordinary", 0, batch("o", 5, TS), 1).is_ok());
    drop(hog);
}

#[test]
fn queues_past_the_clusters_partition_room_are_refused_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let file = settings(dir.path(), "max_partition_replicas_per_shard = 40\n");
    let data = dir.path().join("data");
    let broker = Broker::start_with(&data, &["--config", file.to_str().unwrap(), "--cores", "1"]);
    let admin = strand_client::Admin::connect(&broker.addr.to_string()).unwrap();
    let spec = |partitions: u32| strand_client::QueueSpec {
        partitions: Some(partitions),
        ..strand_client::QueueSpec::default()
    };
    strand_client::block_on(admin.create_queue("a", &spec(20))).unwrap();
    // 20 held (and __groups' 8 if it was made), 30 more: over 40.
    let err = strand_client::block_on(admin.create_queue("b", &spec(30))).unwrap_err();
    assert_eq!(err.code(), Some(strand_wire::ErrorCode::InvalidConfig), "{err}");
    assert!(err.to_string().contains("max_partition_replicas_per_shard"), "{err}");
    let queues = strand_client::block_on(admin.list_queues()).unwrap();
    assert!(!queues.iter().any(|(q, _)| q == "b"), "{queues:?}");
    // Growing a queue past it is refused the same way.
    let err = strand_client::block_on(admin.alter_queue("a", &spec(60))).unwrap_err();
    assert_eq!(err.code(), Some(strand_wire::ErrorCode::InvalidConfig), "{err}");
    assert_eq!(
        strand_client::block_on(admin.describe_queue("a"))
            .unwrap()
            .partitions
            .len(),
        20
    );
    // What fits is still created.
    strand_client::block_on(admin.create_queue("c", &spec(4))).unwrap();
}

/// The exhaustion figures, behind `--ignored` (a minute and some
/// 4 GiB of socket buffers on this machine; `cargo test --release -p
/// strand-broker --test limits -- --ignored --nocapture`): 5,000 idle
/// connections from one address, then 1,000 connections each sending half
/// of a 16 MiB frame, at the default limits but 10,000 per address. The
/// broker's resident memory must stay within its stated bound
/// (`request_memory_bytes` per shard plus 64 KiB per connection, plus what
/// it held before); an ordinary producer's round trips meanwhile are
/// printed (p50/p99/max, closed loop), not asserted.
#[test]
#[ignore]
fn exhaustion_by_idle_connections_and_half_sent_frames() {
    const IDLE: usize = 5_000;
    const HALF_SENDERS: usize = 1_000;
    raise_open_files(20_000);
    let dir = tempfile::tempdir().unwrap();
    let file = settings(
        dir.path(),
        "max_connections_per_ip = 10000\nmax_connections = 10000\nmax_connection_rate_per_ip = 0\n",
    );
    let data = dir.path().join("data");
    let broker = Broker::start_with(&data, &["--config", file.to_str().unwrap(), "--cores", "2"]);
    let mut client = broker.client();
    assert_eq!(client.create_queue("ordinary", 1), strand_wire::ErrorCode::None);
    let before = rss(&broker);
    let idle: Vec<TcpStream> = (0..IDLE).map(|_| TcpStream::connect(broker.addr).unwrap()).collect();
    std::thread::sleep(Duration::from_secs(2));
    let with_idle = rss(&broker);
    eprintln!(
        "{IDLE} idle connections: the broker grew by {} MiB ({} KiB each)",
        with_idle.saturating_sub(before) >> 20,
        (with_idle.saturating_sub(before) / IDLE as u64) >> 10
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let senders: Vec<_> = (0..HALF_SENDERS)
        .map(|_| {
            let addr: SocketAddr = broker.addr;
            let stop = stop.clone();
            std::thread::Builder::new()
                .stack_size(64 << 10)
                .spawn(move || {
                    let Ok(mut s) = TcpStream::connect(addr) else { return };
                    let _ = s.write_all(&half_frame_head());
                    s.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
                    let chunk = vec![0u8; 256 << 10];
                    let mut sent = 0;
                    while sent < (8 << 20) && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        match s.write(&chunk) {
                            Ok(n) => sent += n,
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                ) => {}
                            Err(_) => return,
                        }
                    }
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                })
                .unwrap()
        })
        .collect();
    let mut took = Vec::new();
    let mut peak = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        let t = Instant::now();
        assert!(client.produce("ordinary", 0, batch("o", 5, TS), 1).is_ok());
        took.push(t.elapsed());
        peak = peak.max(rss(&broker));
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for s in senders {
        let _ = s.join();
    }
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    let grown = peak.saturating_sub(before);
    eprintln!(
        "with {HALF_SENDERS} half-sent 16 MiB frames too: peak growth {} MiB; ordinary produce round trips ({}): p50 {:?}, p99 {:?}, max {:?}",
        grown >> 20,
        took.len(),
        at(0.5),
        at(0.99),
        took[took.len() - 1]
    );
    let connections = (IDLE + HALF_SENDERS + 1) as u64;
    let bound = 2 * (256 << 20) + connections * (64 << 10) + (64 << 20);
    assert!(grown < bound, "grew {} MiB, bound {} MiB", grown >> 20, bound >> 20);
    drop(idle);
}

/// The fixed fields of a produce frame of 16 MiB.
fn half_frame_head() -> Vec<u8> {
    let frame_len = (16u32 << 20) - 4;
    let mut head = Vec::new();
    head.extend_from_slice(&frame_len.to_le_bytes());
    head.extend_from_slice(&(strand_wire::Api::Produce as u16).to_le_bytes());
    head.extend_from_slice(&0u16.to_le_bytes());
    head.extend_from_slice(&7u32.to_le_bytes());
    head.extend_from_slice(&64u32.to_le_bytes());
    head
}

/// Raises this process's open-file limit to `n` (at most the hard limit).
fn raise_open_files(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads and sets this process's own limit from a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = n.min(lim.rlim_max);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}
