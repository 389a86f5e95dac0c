//! Partition replication across three `strand serve` processes on
//! 127.0.0.1–3: followers fetch from the leader, acks=all waits for every
//! in-sync replica, and a leader killed with kill -9 loses no acknowledged
//! record and stores no resent one twice. One cluster at a time (two cores).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::{
    assert_none_failed_none_lost, describe, metadata, produce_keyed_until, read_all, segments, Cluster, Records,
};
use strand_client::{block_on, Acks, Consumer, ConsumerConfig, Producer, ProducerConfig, Seek};

/// Followers that stop fetching leave the ISR after 2 s (not 10).
const QUICK: &str = "replica_lag_time_max_ms = 2000\nreplica_fetch_wait_ms = 200\n";
/// [`QUICK`], and leaderships stay where failover put them (no automatic
/// balancing to move them while a test looks).
const QUICK_ISR: &str = "replica_lag_time_max_ms = 2000\nreplica_fetch_wait_ms = 200\nleader_balance_interval_ms = 0\n";

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn replicas_hold_byte_identical_segments_once_acks_all_returns() {
    let _turn = turn();
    let c = Cluster::start_with(3, QUICK_ISR);
    c.create_replicated("mirrored", 3);
    let producer = Producer::new(
        &c.addr(2).to_string(),
        ProducerConfig {
            acks: Acks::All,
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    let mut acked = BTreeMap::new();
    for i in 0..300u32 {
        let (key, value) = (format!("k{}", i % 17), format!("v{i}"));
        let d = block_on(producer.send("mirrored", Some(key.as_bytes()), value.as_bytes(), &[])).unwrap();
        acked.insert((d.partition, d.offset.unwrap()), value.into_bytes());
    }
    // Acknowledged: every in-sync replica has it on disk, and consumers
    // see it.
    assert_eq!(read_all(&c.addr(3).to_string(), "mirrored", acked.len()), acked);
    for p in 0..3 {
        let on_each: Vec<_> = (1..=3).map(|id| segments(&c.data_dir(id), "mirrored", p)).collect();
        assert!(!on_each[0].is_empty() && on_each[0].iter().any(|(_, b)| !b.is_empty()));
        assert!(
            on_each.iter().all(|s| *s == on_each[0]),
            "partition {p}: the replicas' segments differ"
        );
        let d = describe(&c, 1, "mirrored");
        assert_eq!(d["partitions"][p as usize]["isr"].as_array().unwrap().len(), 3, "{d}");
    }
}

#[test]
fn a_killed_leader_loses_no_acknowledged_record_and_rejoins_the_isr() {
    let _turn = turn();
    let mut c = Cluster::start_with(3, QUICK_ISR);
    let leaders = c.create_replicated("ledger", 1);
    let old = leaders[0] as u8;
    let via = (1..=3).find(|id| *id != old).unwrap();
    let producer = Producer::new(
        &c.addr(via).to_string(),
        ProducerConfig {
            acks: Acks::All,
            delivery_timeout: Duration::from_secs(30),
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    // Keyed records with a sequence per key; the leader dies a third of
    // the way.
    let mut acked: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut killed_at = None;
    for i in 0..600u32 {
        if i == 200 {
            c.kill9(old);
            killed_at = Some(Instant::now());
        }
        let (key, value) = (format!("k{}", i % 5), format!("k{}:{}", i % 5, i / 5));
        match block_on(producer.send("ledger", Some(key.as_bytes()), value.as_bytes(), &[])) {
            Ok(d) => {
                acked.insert(d.offset.unwrap(), value.into_bytes());
            }
            Err(e) => panic!("record {i} failed: {e}"),
        }
    }
    let new = metadata(&mut c.client(via), Some("ledger")).leaders[0] as u8;
    assert!(new != old && new != 0, "leadership moved off node {old}: {new}");
    eprintln!(
        "leader {old} killed; {new} led after {:?}",
        killed_at.unwrap().elapsed()
    );
    // Everything acknowledged is where its acknowledgement said, in order
    // per key (offsets grow with each key's sequence).
    let got = read_all(&c.addr(via).to_string(), "ledger", acked.len());
    for (offset, value) in &acked {
        assert_eq!(got.get(&(0, *offset)), Some(value), "acknowledged offset {offset} lost");
    }
    // And stored once: a record resent to the new leader after the kill
    // is known there (its producer table came with the replicated batches).
    let mut seen = std::collections::BTreeSet::new();
    for ((_, offset), value) in &got {
        assert!(
            seen.insert(value),
            "{} stored twice (again at {offset})",
            String::from_utf8_lossy(value)
        );
    }
    let mut last: BTreeMap<String, (u64, u32)> = BTreeMap::new();
    for ((_, offset), value) in &got {
        let text = String::from_utf8(value.clone()).unwrap();
        let (key, seq) = text.split_once(':').unwrap();
        let seq: u32 = seq.parse().unwrap();
        if let Some((at, before)) = last.get(key) {
            assert!(seq >= *before, "key {key}: {seq} at {offset} after {before} at {at}");
        }
        last.insert(key.to_string(), (*offset, seq));
    }
    // The new leader says the partition is under-replicated.
    let series = |name: &str| format!("{name}{{queue=\"ledger\",partition=\"0\"}}");
    let gauges = |c: &Cluster| {
        let text = common::scrape(c.node(new));
        let get = |name: &str| common::value(&text, &series(name));
        (
            get("strand_partition_isr_size"),
            get("strand_partition_under_replicated"),
        )
    };
    assert_eq!(gauges(&c), (Some(2.0), Some(1.0)));
    let status: serde_json::Value =
        serde_json::from_str(c.strand(via, &["cluster", "status", "--output", "json"]).trim()).unwrap();
    assert_eq!(
        status["brokers"][usize::from(new - 1)]["under_replicated"],
        1,
        "{status}"
    );
    // The old leader comes back as a follower and rejoins the ISR.
    c.restart(old);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let d = describe(&c, via, "ledger");
        let isr = d["partitions"][0]["isr"].as_array().unwrap().len();
        if isr == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "node {old} never rejoined the ISR: {d}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(gauges(&c), (Some(3.0), Some(0.0)));
}

#[test]
fn acks_all_fails_while_both_followers_are_paused_and_succeeds_once_they_resume() {
    let _turn = turn();
    let c = Cluster::start_with(3, QUICK_ISR);
    let leader = c.create_replicated("paused", 1)[0] as u8;
    let followers: Vec<u8> = (1..=3).filter(|id| *id != leader).collect();
    let producer = |delivery_timeout| acks_all_to(&c, leader, delivery_timeout, Duration::from_secs(2));
    block_on(producer(Duration::from_secs(10)).send("paused", None, b"before", &[])).unwrap();
    while_paused(&c, &followers, || {
        // No in-sync replica but the leader answers: never acknowledged
        // (the ISR cannot shrink either: the controller has lost its
        // majority).
        let err = block_on(producer(Duration::from_secs(5)).send("paused", None, b"during", &[])).unwrap_err();
        assert!(
            matches!(err, strand_client::ClientError::Timeout(_)),
            "acks=all with both followers paused: {err}"
        );
        eprintln!("while paused: {err}");
    });
    // Resumed: acknowledged again, and consumers see it.
    let d = block_on(producer(Duration::from_secs(30)).send("paused", None, b"after", &[])).unwrap();
    let got = read_all(&c.addr(leader).to_string(), "paused", d.offset.unwrap() as usize + 1);
    assert_eq!(got.values().next().map(Vec::as_slice), Some(&b"before"[..]));
    assert_eq!(got.get(&(0, d.offset.unwrap())).map(Vec::as_slice), Some(&b"after"[..]));
}

/// Bug 8 of strand-chaos (seed 42, 30 minutes): a leader cut off from
/// the controller went on acknowledging after the controller had fenced
/// it and elected another leader. Now a broker holds its own lease
/// (`strand_broker::lease`): cut off from the controller's majority for
/// longer than `broker_session_ms`, it takes and acknowledges nothing,
/// even for a partition whose only replica it is (before, these went on
/// being acknowledged with no controller at all); renewed, it goes on.
#[test]
fn a_leader_cut_off_from_the_controller_acknowledges_nothing_once_its_lease_ran_out() {
    let _turn = turn();
    let c = Cluster::start_with(3, QUICK_ISR);
    c.strand(
        1,
        &[
            "queue",
            "create",
            "cut",
            "--partitions",
            "1",
            "--replication-factor",
            "1",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let leader = loop {
        let leaders = metadata(&mut c.client(1), Some("cut")).leaders;
        if let [l] = leaders[..] {
            if l != 0 {
                break l as u8;
            }
        }
        assert!(Instant::now() < deadline, "no leader for cut: {leaders:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let others: Vec<u8> = (1..=3).filter(|id| *id != leader).collect();
    let producer = |delivery_timeout| acks_all_to(&c, leader, delivery_timeout, Duration::from_secs(1));
    block_on(producer(Duration::from_secs(10)).send("cut", None, b"before", &[])).unwrap();
    // The controller loses its majority: the leader's renewals fail.
    while_paused(&c, &others, || {
        // A whole session (3 s) and more.
        std::thread::sleep(Duration::from_millis(3500));
        let err = block_on(producer(Duration::from_secs(2)).send("cut", None, b"during", &[])).unwrap_err();
        eprintln!("with its lease run out: {err}");
        assert!(err.to_string().contains("lease"), "refused for its lease: {err}");
    });
    // The controller back: renewed, it takes records again.
    let d = block_on(producer(Duration::from_secs(30)).send("cut", None, b"after", &[])).unwrap();
    assert_eq!(d.offset, Some(1), "the refused record was never stored");
    let got = read_all(&c.addr(leader).to_string(), "cut", 2);
    let values: Vec<&[u8]> = got.values().map(Vec::as_slice).collect();
    assert_eq!(values, [&b"before"[..], &b"after"[..]]);
}

/// An acks=all producer that sends to node `node` only.
fn acks_all_to(c: &Cluster, node: u8, delivery_timeout: Duration, request_timeout: Duration) -> Producer {
    let config = ProducerConfig {
        acks: Acks::All,
        delivery_timeout,
        request_timeout,
        ..ProducerConfig::default()
    };
    Producer::new(&c.addr(node).to_string(), config).unwrap()
}

/// Runs `check` while `nodes` are paused (SIGSTOP), and resumes them
/// before its panic, if any, goes on.
fn while_paused(c: &Cluster, nodes: &[u8], check: impl FnOnce() + std::panic::UnwindSafe) {
    for id in nodes {
        c.node(*id).signal(libc::SIGSTOP);
    }
    let result = std::panic::catch_unwind(check);
    for id in nodes {
        c.node(*id).signal(libc::SIGCONT);
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn a_rolling_restart_with_sigterm_fails_no_acks_all_produce() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _turn = turn();
    // Leases of a minute, each node down for 4 s, records given 3 s: a
    // stopped leader's partitions keep taking records only if it hands
    // them over itself before it goes (with the hand-over left out of
    // `wait_for_stop`, 2 of 217 records failed here).
    let mut c = Cluster::start_with(3, &format!("{QUICK_ISR}broker_session_ms = 60000\n"));
    c.create_replicated("rolling", 3);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let producing = produce_keyed_until(&c, "rolling", stop.clone());
    let until_in_sync = |c: &Cluster, via: u8| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let d = describe(c, via, "rolling");
            let parts = d["partitions"].as_array().unwrap();
            if parts.iter().all(|p| p["isr"].as_array().unwrap().len() == 3) {
                return;
            }
            assert!(Instant::now() < deadline, "the ISRs never filled again: {d}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    std::thread::sleep(Duration::from_millis(500));
    for id in 1..=3u8 {
        let via = if id == 1 { 2 } else { 1 };
        let leading = describe(&c, via, "rolling")["partitions"].to_string();
        let started = Instant::now();
        let status = c.terminate(id);
        assert!(status.success(), "node {id} stopped with {status}");
        let stopped = started.elapsed();
        std::thread::sleep(Duration::from_secs(4));
        c.restart(id);
        until_in_sync(&c, via);
        eprintln!(
            "node {id}: stopped in {stopped:?}, back in every ISR {:?} after SIGTERM; before: {leading}",
            started.elapsed()
        );
    }
    stop.store(true, Ordering::SeqCst);
    assert_none_failed_none_lost(&c, 1, "rolling", producing.join().unwrap(), Records::new());
}

#[test]
fn acks_all_needs_the_queues_min_insync_replicas() {
    let _turn = turn();
    let mut c = Cluster::start_with(3, QUICK_ISR);
    let leader = c.create_replicated("strict", 1)[0] as u8;
    c.strand(1, &["queue", "alter", "strict", "--min-insync-replicas", "3"]);
    assert_eq!(describe(&c, 1, "strict")["min_insync_replicas"], 3);
    let send = |c: &Cluster, value: &[u8]| {
        let config = ProducerConfig {
            acks: Acks::All,
            delivery_timeout: Duration::from_secs(4),
            ..ProducerConfig::default()
        };
        let producer = Producer::new(&c.addr(leader).to_string(), config).unwrap();
        block_on(producer.send("strict", None, value, &[]))
    };
    send(&c, b"three in sync").unwrap();
    // A follower dies: once it is fenced and out of the ISR, two in sync
    // are too few.
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    c.kill9(follower);
    let deadline = Instant::now() + Duration::from_secs(20);
    while describe(&c, leader, "strict")["partitions"][0]["isr"]
        .as_array()
        .unwrap()
        .len()
        != 2
    {
        assert!(Instant::now() < deadline, "the ISR never shrank");
        std::thread::sleep(Duration::from_millis(100));
    }
    let err = send(&c, b"two in sync").unwrap_err();
    assert!(err.to_string().contains("NotEnoughReplicas"), "{err}");
    // Two are enough once the queue says so.
    c.strand(leader, &["queue", "alter", "strict", "--min-insync-replicas", "2"]);
    send(&c, b"two are enough").unwrap();
}

#[test]
fn leadership_goes_back_to_the_preferred_replica_once_it_is_in_sync_again() {
    let _turn = turn();
    let mut c = Cluster::start_with(3, &format!("{QUICK}leader_balance_interval_ms = 500\n"));
    let preferred = c.create_replicated("balanced", 1)[0] as u8;
    let other = (1..=3).find(|id| *id != preferred).unwrap();
    let leader_seen = |c: &Cluster| metadata(&mut c.client(other), Some("balanced")).leaders[0] as u8;
    let until = |c: &Cluster, what: &str, done: &dyn Fn(u8) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let leader = leader_seen(c);
            if done(leader) {
                return leader;
            }
            assert!(Instant::now() < deadline, "{what}: leader still {leader}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    c.kill9(preferred);
    until(&c, "failover", &|l| l != preferred && l != 0);
    c.restart(preferred);
    let back = Instant::now();
    until(&c, "back to the preferred replica", &|l| l == preferred);
    eprintln!("node {preferred} led again {:?} after its restart", back.elapsed());
    let producer = Producer::new(
        &c.addr(other).to_string(),
        ProducerConfig {
            acks: Acks::All,
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    block_on(producer.send("balanced", None, b"on the preferred leader", &[])).unwrap();
}

/// A leader paused (SIGSTOP) until the controller fences it, holding
/// records only it has (acks=1 while its followers were paused too): a new
/// leader is elected from the ISR and takes acks=all produces; the old one,
/// resumed, learns it no longer leads, truncates the tail nobody else has,
/// and every replica ends up with the same log.
#[test]
fn a_paused_leader_steps_down_and_truncates_its_divergent_tail_once_resumed() {
    let _turn = turn();
    let c = Cluster::start_with(3, QUICK_ISR);
    let old = c.create_replicated("deposed", 1)[0] as u8;
    let followers: Vec<u8> = (1..=3).filter(|id| *id != old).collect();
    let acks_all = |via: u8| {
        let config = ProducerConfig {
            acks: Acks::All,
            delivery_timeout: Duration::from_secs(30),
            ..ProducerConfig::default()
        };
        Producer::new(&c.addr(via).to_string(), config).unwrap()
    };
    block_on(acks_all(old).send("deposed", None, b"committed", &[])).unwrap();
    let signal = |ids: &[u8], sig| ids.iter().for_each(|id| c.node(*id).signal(sig));
    signal(&followers, libc::SIGSTOP);
    let outcome = std::panic::catch_unwind(|| {
        // acks=1 answers once the leader has a batch. The first may still
        // reach the followers: the answer to a fetch they sent before they
        // stopped lands in their sockets. Once that fetch is answered
        // (data, or empty after `replica_fetch_wait_ms`) none is left: the
        // second stays on the leader alone.
        let ts = 1_700_000_000_000;
        let mut client = c.client(old);
        assert_eq!(
            client.produce("deposed", 0, common::batch("maybe", 3, ts), 1),
            Ok((1, 3))
        );
        std::thread::sleep(Duration::from_millis(400));
        let tail = common::batch("only-on-the-old-leader", 3, ts);
        assert_eq!(client.produce("deposed", 0, tail, 1), Ok((4, 6)));
    });
    signal(&[old], libc::SIGSTOP);
    signal(&followers, libc::SIGCONT);
    let outcome = outcome.and_then(|()| {
        std::panic::catch_unwind(|| {
            let paused = Instant::now();
            let deadline = paused + Duration::from_secs(30);
            let new = loop {
                let leader = metadata(&mut c.client(followers[0]), Some("deposed")).leaders[0] as u8;
                if leader != old && leader != 0 {
                    break leader;
                }
                assert!(Instant::now() < deadline, "node {old} paused and still leads");
                std::thread::sleep(Duration::from_millis(100));
            };
            eprintln!("node {old} paused; node {new} led after {:?}", paused.elapsed());
            let producer = acks_all(new);
            for i in 0..5 {
                block_on(producer.send("deposed", None, format!("after-{i}").as_bytes(), &[])).unwrap();
            }
            new
        })
    });
    signal(&[old], libc::SIGCONT);
    let new = outcome.unwrap();
    // Resumed: a follower of `new`, its own tail gone, in the ISR again,
    // and every replica's log byte for byte the same.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let on_each: Vec<_> = (1..=3).map(|id| segments(&c.data_dir(id), "deposed", 0)).collect();
        let isr = describe(&c, new, "deposed")["partitions"][0]["isr"]
            .as_array()
            .unwrap()
            .len();
        if isr == 3 && on_each.iter().all(|s| *s == on_each[0]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {old} never caught up: ISR {isr}, segments the same: {:?}",
            on_each.iter().map(|s| *s == on_each[0]).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(metadata(&mut c.client(old), Some("deposed")).leaders[0] as u8, new);
    let got: Vec<String> = read_all(&c.addr(old).to_string(), "deposed", 6)
        .into_values()
        .map(|v| String::from_utf8(v).unwrap())
        .collect();
    let maybe: Vec<String> = (0..3).map(|i| format!("maybe-{i}")).collect();
    let reached = got.get(1..4) == Some(&maybe[..]);
    let want: Vec<String> = ["committed".to_string()]
        .into_iter()
        .chain(maybe.iter().filter(|_| reached).cloned())
        .chain((0..5).map(|i| format!("after-{i}")))
        .collect();
    assert_eq!(got, want, "the old leader's unreplicated tail is gone everywhere");
    eprintln!("the first acks=1 batch reached the followers: {reached}");
}

/// The coordinators' own queue is replicated like data: `__groups` gets
/// three replicas on a three-node cluster (min ISR 2), all in sync.
#[test]
fn the_groups_queue_gets_three_replicas_on_three_brokers() {
    let _turn = turn();
    let c = Cluster::start_with(3, QUICK_ISR);
    // The first group request creates `__groups` (its answer may be
    // NotLeader: the groups of a `__groups` partition led by another node
    // are not listed through this one yet).
    let _ = std::process::Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["group", "list", "--brokers", &c.addr(2).to_string()])
        .output()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let d = describe(&c, 3, "__groups");
        let parts = d["partitions"].as_array().cloned().unwrap_or_default();
        let full = |key: &str| parts.iter().all(|p| p[key].as_array().is_some_and(|r| r.len() == 3));
        if parts.len() == 8 && full("replicas") && full("isr") {
            break;
        }
        assert!(Instant::now() < deadline, "__groups: {d}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A producer and a consumer that know only node 1 keep working after
/// node 1 is killed: metadata comes from the brokers an earlier answer
/// named, the partition node 1 led fails over, the consumer follows every
/// leader without returning an error, and nothing acknowledged is missing.
/// A produce sent to a follower is answered `NotLeader` naming the leader
/// and its epoch (the hint clients follow without asking for metadata).
#[test]
fn clients_that_know_only_a_killed_broker_keep_producing_and_consuming() {
    let _turn = turn();
    let mut c = Cluster::start_with(3, QUICK_ISR);
    let leaders = c.create_replicated("roaming", 3);
    assert!(leaders.contains(&1), "node 1 leads a partition: {leaders:?}");

    // The hint, on the wire: partition 0 produced to through a follower.
    let seen = metadata(&mut c.client(1), Some("roaming"));
    let (leader, epoch) = (seen.leaders[0], seen.leader_epochs[0]);
    let follower = (1..=3u8).find(|id| u32::from(*id) != leader).unwrap();
    let conn = strand_client::Connection::connect(&c.addr(follower).to_string()).unwrap();
    let mut batch = strand_wire::batch::BatchBuilder::new();
    batch.push(None, Some(b"astray"), &[], 0);
    let (body, tail) = strand_client::requests::produce("roaming", 0, -1, batch.build().freeze());
    let err = block_on(conn.request(strand_wire::Api::Produce, &body, tail))
        .and_then(|f| strand_client::requests::produced(&f))
        .unwrap_err();
    assert_eq!(err.code(), Some(strand_wire::ErrorCode::NotLeader), "{err}");
    assert_eq!(
        err.leader_hint(),
        Some(strand_client::LeaderHint {
            node: leader,
            leader_epoch: epoch
        }),
        "{err}"
    );

    let only_node_1 = c.addr(1).to_string();
    let producer = Producer::new(
        &only_node_1,
        ProducerConfig {
            acks: Acks::All,
            delivery_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(5),
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    let mut consumer = Consumer::new(
        &only_node_1,
        ConsumerConfig {
            start: Seek::Earliest,
            max_wait: Duration::from_millis(200),
            retry_timeout: Duration::from_secs(30),
            ..ConsumerConfig::default()
        },
    )
    .unwrap();
    block_on(consumer.assign_all("roaming")).unwrap();
    // The consumer reads all along, on a thread of its own; any error
    // `poll` returns fails the test.
    type Got = std::sync::Arc<std::sync::Mutex<BTreeMap<(u32, u64), Vec<u8>>>>;
    let got: Got = Default::default();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reading = {
        let (got, stop) = (got.clone(), stop.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
                for r in block_on(consumer.poll()).expect("poll returned an error") {
                    let value = r.value.map(|v| v.to_vec()).unwrap_or_default();
                    got.lock().unwrap().insert((r.partition, r.offset), value);
                }
            }
        })
    };
    let mut acked = BTreeMap::new();
    let mut killed_at = None;
    for i in 0..300u32 {
        if i == 100 {
            c.kill9(1);
            killed_at = Some(Instant::now());
        }
        let (key, value) = (format!("k{}", i % 7), format!("v{i}"));
        let d = block_on(producer.send("roaming", Some(key.as_bytes()), value.as_bytes(), &[]))
            .unwrap_or_else(|e| panic!("record {i} failed: {e}"));
        acked.insert((d.partition, d.offset.unwrap()), value.into_bytes());
    }
    eprintln!(
        "node 1 killed; 200 records acknowledged after {:?}",
        killed_at.unwrap().elapsed()
    );
    let led = metadata(&mut c.client(2), Some("roaming")).leaders;
    assert!(!led.contains(&1), "node 1 still leads: {led:?}");
    // The consumer catches up with everything acknowledged.
    let deadline = Instant::now() + Duration::from_secs(30);
    let missing = |got: &Got| {
        let got = got.lock().unwrap();
        acked.iter().filter(|(at, v)| got.get(*at) != Some(*v)).count()
    };
    while missing(&got) > 0 && !reading.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    reading.join().expect("the consumer failed");
    assert_eq!(missing(&got), 0, "acknowledged records not consumed");
}

/// A follower's fetch names the queue's id: a leader whose queue of that
/// name has another id (deleted and created again while one of the two had
/// not heard) answers `UnknownQueue` and counts nothing of it.
#[test]
fn a_replica_fetch_for_another_incarnation_of_the_queue_is_refused() {
    use strand_net::message::body;
    use strand_wire::flatbuffers::FlatBufferBuilder;
    use strand_wire::*;
    let _turn = turn();
    let c = Cluster::start_with(3, QUICK_ISR);
    let leader = c.create_replicated("reborn", 1)[0] as u8;
    let seen = metadata(&mut c.client(leader), Some("reborn"));
    let follower = (1..=3u8).find(|id| *id != leader).unwrap();
    let fetch = |queue_id: u64| {
        let mut fbb = FlatBufferBuilder::new();
        let p = ReplicaFetchPartition::create(
            &mut fbb,
            &ReplicaFetchPartitionArgs {
                partition: 0,
                leader_epoch: seen.leader_epochs[0],
                ..Default::default()
            },
        );
        let partitions = fbb.create_vector(&[p]);
        let name = fbb.create_string("reborn");
        let q = ReplicaFetchQueue::create(
            &mut fbb,
            &ReplicaFetchQueueArgs {
                name: Some(name),
                partitions: Some(partitions),
                id: queue_id,
            },
        );
        let queues = fbb.create_vector(&[q]);
        let root = ReplicaFetchRequest::create(
            &mut fbb,
            &ReplicaFetchRequestArgs {
                replica_id: u64::from(follower),
                max_wait_ms: 0,
                queues: Some(queues),
            },
        );
        fbb.finish_minimal(root);
        let f = c.client(leader).call(Api::ReplicaFetch, &fbb, Default::default());
        let resp = body::<ReplicaFetchResponse>(&f).unwrap();
        assert!(resp.error().is_none_or(|e| e.code() == ErrorCode::None));
        let r = resp.queues().unwrap().get(0).partitions().unwrap().get(0);
        r.error().map_or(ErrorCode::None, |e| e.code())
    };
    assert_eq!(fetch(seen.queue_id + 1), ErrorCode::UnknownQueue);
    assert_eq!(fetch(seen.queue_id), ErrorCode::None);
    assert_eq!(fetch(0), ErrorCode::None, "an older follower that does not say");
}

/// The offsets a node's partition directory holds segments from (their
/// file names), oldest first.
fn segment_bases(dir: &Path, queue: &str, partition: u32) -> Vec<u64> {
    let mut bases: Vec<u64> = segments(dir, queue, partition)
        .iter()
        .filter_map(|(name, _)| name.strip_suffix(".log")?.parse().ok())
        .collect();
    bases.sort_unstable();
    bases
}

/// A follower that was down while retention removed, on the leader, every
/// record it would fetch next starts over at the leader's log start,
/// catches up and rejoins the ISR; the segments it then holds are the
/// leader's, byte for byte.
#[test]
fn a_follower_behind_the_leaders_log_start_starts_over_there_and_rejoins() {
    let _turn = turn();
    // Segments not recycled: a reused file keeps an older segment's bytes
    // past its end, which the byte comparison below would count.
    let small = format!("{QUICK_ISR}segment_bytes = 65536\nmax_message_bytes = 65536\nrecycle_segments = false\n");
    let mut c = Cluster::start_with(3, &small);
    let p = "1";
    c.strand(
        1,
        &[
            "queue",
            "create",
            "trimmed",
            "--partitions",
            p,
            "--replication-factor",
            "3",
            "--retention-bytes",
            "196608",
        ],
    );
    let leader = loop {
        let l = metadata(&mut c.client(1), Some("trimmed")).leaders;
        if l.first().is_some_and(|l| *l != 0) {
            break l[0] as u8;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let away = (1..=3u8).find(|id| *id != leader).unwrap();
    let producer = Producer::new(
        &c.addr(leader).to_string(),
        ProducerConfig {
            acks: Acks::All,
            delivery_timeout: Duration::from_secs(30),
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    let value = vec![b'x'; 4000];
    let send = |n: usize| {
        for _ in 0..n {
            block_on(producer.send("trimmed", None, &value, &[])).unwrap();
        }
    };
    send(10);
    let away_end = segment_bases(&c.data_dir(away), "trimmed", 0);
    c.kill9(away);
    // About 1.2 MB: some twenty 64 KiB segments, of which retention keeps
    // about three (it looks every 10 s).
    send(300);
    let deadline = Instant::now() + Duration::from_secs(40);
    let log_start = loop {
        let start = describe(&c, leader, "trimmed")["partitions"][0]["log_start"]
            .as_u64()
            .unwrap();
        if start > 100 {
            break start;
        }
        assert!(Instant::now() < deadline, "retention never moved the log start");
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!("node {away} held segments {away_end:?}; the leader's log starts at {log_start}");
    c.restart(away);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let d = describe(&c, leader, "trimmed");
        if d["partitions"][0]["isr"].as_array().unwrap().len() == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "node {away} never rejoined the ISR: {d}");
        std::thread::sleep(Duration::from_millis(200));
    }
    send(1);
    let bases = segment_bases(&c.data_dir(away), "trimmed", 0);
    assert!(
        bases.first().is_some_and(|b| *b >= log_start),
        "node {away} starts at {bases:?}, the leader's log at {log_start}"
    );
    // Every segment both hold is the same (retention may since have
    // removed older ones on one of them).
    let on_leader: BTreeMap<String, Vec<u8>> = segments(&c.data_dir(leader), "trimmed", 0).into_iter().collect();
    let mut compared = 0;
    for (name, bytes) in segments(&c.data_dir(away), "trimmed", 0) {
        if let Some(theirs) = on_leader.get(&name) {
            assert!(*theirs == bytes, "segment {name} differs");
            compared += 1;
        }
    }
    assert!(compared > 0, "no segment in common");
}

/// `strand node drain`: the node's leaderships move to the other in-sync
/// replicas while acks=all records keep coming (none fails), it stays in
/// every ISR, `node list` shows it draining with no leadership, a restart
/// keeps it so, and `node undrain` gives its preferred leaderships back.
#[test]
fn a_drained_node_leads_nothing_until_undrained_and_no_produce_fails() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _turn = turn();
    let mut c = Cluster::start_with(
        3,
        "replica_lag_time_max_ms = 2000\nreplica_fetch_wait_ms = 200\nleader_balance_interval_ms = 500\n",
    );
    let leaders = c.create_replicated("maint", 3);
    let drained = 2u8;
    assert!(leaders.contains(&u32::from(drained)), "{leaders:?}");
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let producing = produce_keyed_until(&c, "maint", stop.clone());
    let led_by = |c: &Cluster, id: u8| {
        let leaders = metadata(&mut c.client(1), Some("maint")).leaders;
        leaders.iter().filter(|l| **l == u32::from(id)).count()
    };
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    std::thread::sleep(Duration::from_millis(500));
    let said = c.strand(1, &["node", "drain", &drained.to_string()]);
    assert!(said.contains("draining"), "{said}");
    until("the drained node still leads", &|| led_by(&c, drained) == 0);
    let d = describe(&c, 1, "maint");
    for p in d["partitions"].as_array().unwrap() {
        assert_eq!(
            p["isr"].as_array().unwrap().len(),
            3,
            "it stays a follower in sync: {d}"
        );
    }
    let list: serde_json::Value =
        serde_json::from_str(c.strand(3, &["node", "list", "--output", "json"]).trim()).unwrap();
    let entry = list
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == u64::from(drained))
        .unwrap();
    assert_eq!(
        (&entry["draining"], &entry["leaders"], &entry["replicas"]),
        (&true.into(), &0.into(), &3.into())
    );
    assert!(entry["disk_free_bytes"].as_u64().is_some_and(|f| f > 0), "{entry}");
    // A restart keeps it in maintenance (balancing runs every 500 ms).
    assert!(c.terminate(drained).success());
    c.restart(drained);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(led_by(&c, drained), 0, "led again after its restart");
    c.strand(1, &["node", "undrain", &drained.to_string()]);
    until("its preferred leaderships never came back", &|| led_by(&c, drained) > 0);
    stop.store(true, Ordering::SeqCst);
    assert_none_failed_none_lost(&c, 1, "maint", producing.join().unwrap(), Records::new());
}

/// A follower that comes back behind by a large batch on each of several
/// partitions of one leader gets them over several fetches, each answer
/// within a frame: before, the leader answered one batch per partition at
/// once (each partition's read holds at least one batch, whatever its
/// share), an answer larger than the follower may read, and the follower
/// closed its link and asked the same again for ever.
#[test]
fn a_follower_behind_by_large_batches_on_many_partitions_catches_up() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // 2 MiB frames: room for about one 900 KiB batch per answer.
    let mut cluster = Cluster::start_with(3, &format!("{QUICK_ISR}max_frame_bytes = 2097152\n"));
    cluster.create_replicated("wide", 8);
    let follower = 3u8;
    cluster.kill9(follower);
    // Wait until no partition is led by the dead one.
    let deadline = Instant::now() + Duration::from_secs(30);
    let others: Vec<u8> = (1..=3u8).filter(|n| *n != follower).collect();
    let leaders = loop {
        let seen = metadata(&mut cluster.client(others[0]), Some("wide")).leaders;
        if seen.len() == 8 && seen.iter().all(|l| *l != 0 && *l != u32::from(follower)) {
            break seen;
        }
        assert!(
            Instant::now() < deadline,
            "leadership never left node {follower}: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let value = vec![5u8; 64 << 10];
    for (p, leader) in leaders.iter().enumerate() {
        let mut b = strand_storage::batch::BatchBuilder::new();
        for _ in 0..14 {
            b.push(None, Some(&value), &[], common::TS);
        }
        let mut client = cluster.client(*leader as u8);
        client.produce("wide", p as u32, b.build().freeze(), 1).unwrap();
    }
    let node = cluster.start_again(follower);
    cluster.started(follower, node);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = describe(&cluster, others[0], "wide");
        let caught_up = v["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["isr"].as_array().is_some_and(|isr| isr.len() == 3));
        if caught_up {
            break;
        }
        assert!(Instant::now() < deadline, "node {follower} never caught up: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
