//! `__groups` compaction against the real broker: with small segments and
//! a small compaction threshold, thousands of commits leave the group's
//! `__groups` partition bounded (its log start moves up), and after a
//! restart — which rebuilds the groups from the snapshot and the records
//! since — committed positions and ack-mode delivery counts are intact.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use strand_client::*;
use strand_wire::ErrorCode;

/// A 64 KiB segment (a segment holds at least a batch of the largest size:
/// 64 KiB too), a compaction every 128 KiB of growth.
const SMALL_GROUPS: &str = "groups_segment_bytes = 65536\ngroups_compact_bytes = 131072\nmax_message_bytes = 65536\n";

fn group_config() -> GroupConfig {
    GroupConfig {
        start: GroupStart::Earliest,
        session_timeout: Duration::from_secs(10),
        lock: Duration::from_secs(30),
        consumer: ConsumerConfig {
            max_wait: Duration::from_millis(100),
            ..ConsumerConfig::default()
        },
        ..GroupConfig::default()
    }
}

/// Receives until one record comes (at most 30 s).
fn receive_one(m: &mut GroupConsumer) -> Received {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "nothing received in 30 s");
        if let Some(r) = block_on(m.receive(1)).unwrap().into_iter().next() {
            return r;
        }
    }
}

/// The `__groups` partition of `group` as `queue describe` shows it.
fn groups_partition(addr: &str, group: &str) -> serde_json::Value {
    let p = strand_wire::partition_for_key(group.as_bytes(), 8);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["queue", "describe", "__groups", "--output", "json", "--brokers", addr])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    d["partitions"][p as usize].clone()
}

#[test]
fn compaction_bounds_the_groups_log_and_a_restart_keeps_positions_and_delivery_counts() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("groups.toml");
    std::fs::write(&config, SMALL_GROUPS).unwrap();
    let data = dir.path().join("data");
    let config = config.to_str().unwrap().to_string();
    let flags = ["--cores", "1", "--config", &config];
    let broker = Broker::start_with(&data, &flags);
    let addr = broker.addr.to_string();
    assert_eq!(broker.client().create_queue("q", 1), ErrorCode::None);
    let producer = Producer::new(&addr, ProducerConfig::default()).unwrap();
    for i in 0..50 {
        block_on(producer.send("q", None, format!("r{i}").as_bytes(), &[])).unwrap();
    }
    // Two groups on the same __groups partition: one in ack mode with a
    // record delivered twice, one committing thousands of times.
    let busy = "busy";
    let p = strand_wire::partition_for_key(busy.as_bytes(), 8);
    let acked = (0..1000)
        .map(|i| format!("acked-{i}"))
        .find(|g| strand_wire::partition_for_key(g.as_bytes(), 8) == p)
        .unwrap();
    let mut worker = block_on(GroupConsumer::subscribe(&addr, &acked, &["q"], group_config())).unwrap();
    for attempt in 1..=2 {
        let r = receive_one(&mut worker);
        assert_eq!((r.record.offset, r.attempt), (0, attempt));
        block_on(worker.nack(&r.record, Duration::ZERO, "boom")).unwrap();
    }
    drop(worker);
    let mut member = block_on(GroupConsumer::subscribe(&addr, busy, &["q"], group_config())).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while member.assignment().is_empty() {
        assert!(Instant::now() < deadline, "never assigned");
        block_on(member.poll()).unwrap();
    }
    let commits = 3000u64;
    for i in 0..commits {
        let offsets = BTreeMap::from([((std::sync::Arc::from("q"), 0), i % 50 + 1)]);
        block_on(member.commit_offsets(&offsets)).unwrap();
    }
    let last = (commits - 1) % 50 + 1;
    // The log start moves up once a compaction deleted segments.
    let deadline = Instant::now() + Duration::from_secs(20);
    let part = loop {
        let part = groups_partition(&addr, busy);
        if part["log_start"].as_u64().unwrap() > 0 {
            break part;
        }
        assert!(Instant::now() < deadline, "never compacted: {part}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let (end, stored) = (
        part["log_end"].as_u64().unwrap(),
        part["stored_bytes"].as_u64().unwrap(),
    );
    eprintln!("__groups/{p} after {commits} commits: {part}");
    assert!(end > commits, "{part}");
    assert!(stored < 512 << 10, "bounded: {stored} bytes kept of {end} records");
    block_on(member.close()).unwrap();

    assert!(broker.terminate().success());
    let broker = Broker::start_at(&data, &addr, &flags);
    let admin = Admin::connect(&addr).unwrap();
    let d = block_on(admin.describe_group(busy)).unwrap();
    assert_eq!(
        d.partitions.iter().map(|p| p.position).collect::<Vec<_>>(),
        vec![Some(last)],
        "the committed position after the restart"
    );
    // The nacked record comes a third time, its count kept.
    let mut worker = block_on(GroupConsumer::subscribe(&addr, &acked, &["q"], group_config())).unwrap();
    let r = receive_one(&mut worker);
    assert_eq!((r.record.offset, r.attempt), (0, 3));
    block_on(worker.ack(&r.record)).unwrap();
    drop(broker);
}
