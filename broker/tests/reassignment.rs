//! Moving replicas between `strand serve` processes on 127.0.0.1–4 while
//! acks=all producers and consumers keep going: a partition reassigned to
//! a fourth node, and a node decommissioned. One cluster at a time (two
//! cores).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::{assert_none_failed_none_lost, describe, produce_keyed_until, segments, Cluster, Records};
use strand_client::{block_on, Consumer, ConsumerConfig, Seek};

/// Followers that stop fetching leave the ISR after 2 s; leader balancing
/// every 500 ms.
const QUICK: &str = "replica_lag_time_max_ms = 2000\nreplica_fetch_wait_ms = 200\nleader_balance_interval_ms = 500\n";

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `strand node describe ID --output json` through node `via`.
fn node(c: &Cluster, via: u8, id: u8) -> serde_json::Value {
    let out = c.strand(via, &["node", "describe", &id.to_string(), "--output", "json"]);
    serde_json::from_str(out.trim()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
        .unwrap_or_default()
}

/// Waits (up to `limit`) until `done`, failing with `what`.
fn until(what: &str, limit: Duration, done: &mut dyn FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A thread consuming every partition of `queue` from the start through
/// node 1 until `stop` (and then until it caught up with `acked`, shared
/// by the producer's join): records by (partition, offset).
fn consume_until(c: &Cluster, queue: &'static str, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Records> {
    let bootstrap = c.addr(1).to_string();
    std::thread::spawn(move || {
        let config = ConsumerConfig {
            start: Seek::Earliest,
            max_wait: Duration::from_millis(100),
            ..ConsumerConfig::default()
        };
        let mut consumer = Consumer::new(&bootstrap, config).unwrap();
        block_on(consumer.assign_all(queue)).unwrap();
        let mut got = BTreeMap::new();
        while !stop.load(Ordering::SeqCst) {
            for r in block_on(consumer.poll()).unwrap() {
                got.insert((r.partition, r.offset), r.value.map(|v| v.to_vec()).unwrap_or_default());
            }
        }
        got
    })
}

/// Stops the producer and consumer threads; no acks=all produce failed,
/// and every acknowledged record is there, read by the consumer that ran
/// throughout (what it had not reached yet read afterwards).
fn no_failure_no_loss(
    c: &Cluster,
    queue: &str,
    stop: &AtomicBool,
    producing: std::thread::JoinHandle<(Records, Vec<String>)>,
    consuming: std::thread::JoinHandle<Records>,
) {
    stop.store(true, Ordering::SeqCst);
    let produced = producing.join().unwrap();
    let got = consuming.join().unwrap();
    eprintln!("the consumer read {} records while the replicas moved", got.len());
    assert!(!got.is_empty(), "the consumer read nothing while the replicas moved");
    assert_none_failed_none_lost(c, 2, queue, produced, got);
}

/// A fourth node joins as a broker and is given nothing; a partition
/// reassigned to it under load catches up, and once the move completes the
/// new replica's segments are byte for byte the leader's, the replica it
/// replaced is gone from its old node's disk, and no produce failed.
#[test]
fn a_partition_reassigned_to_a_new_fourth_node_holds_identical_bytes() {
    let _turn = turn();
    let mut c = Cluster::start_with(3, QUICK);
    c.create_replicated("moving", 3);
    c.add_learner(4);
    let new = node(&c, 1, 4);
    assert_eq!((&new["replicas"], &new["leaders"]), (&0.into(), &0.into()), "{new}");
    let stop = Arc::new(AtomicBool::new(false));
    let producing = produce_keyed_until(&c, "moving", stop.clone());
    let consuming = consume_until(&c, "moving", stop.clone());
    std::thread::sleep(Duration::from_secs(1));
    let before = describe(&c, 1, "moving")["partitions"][0].clone();
    let old = ids(&before["replicas"]);
    // 4 first (the preferred leader), then two of the old: one goes.
    let (gone, target) = (old[0], vec![4, old[1], old[2]]);
    let to = target.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let said = c.strand(
        2,
        &["queue", "reassign", "moving", "--partition", "0", "--replicas", &to],
    );
    assert!(said.contains("moving moving/0"), "{said}");
    let started = Instant::now();
    until("the reassignment never completed", Duration::from_secs(60), &mut || {
        let p = describe(&c, 3, "moving")["partitions"][0].clone();
        ids(&p["replicas"]) == target && ids(&p["isr"]).len() == 3
    });
    eprintln!("moving/0 moved to {target:?} in {:?}", started.elapsed());
    std::thread::sleep(Duration::from_secs(1));
    no_failure_no_loss(&c, "moving", &stop, producing, consuming);
    // Balancing hands the preferred leadership to 4.
    until(
        "the new preferred replica never led",
        Duration::from_secs(15),
        &mut || describe(&c, 1, "moving")["partitions"][0]["leader"] == 4,
    );
    until(
        "the new replica's segments never matched the others'",
        Duration::from_secs(15),
        &mut || {
            let on_each: Vec<_> = target
                .iter()
                .map(|id| segments(&c.data_dir(*id as u8), "moving", 0))
                .collect();
            !on_each[0].is_empty() && on_each.iter().all(|s| *s == on_each[0])
        },
    );
    let removed = c.data_dir(gone as u8).join("moving").join("0");
    until(
        "the replaced replica's data is still on its old node",
        Duration::from_secs(10),
        &mut || !removed.exists(),
    );
}

/// Decommissioning is refused while the others cannot hold a partition's
/// three replicas; with a fourth node, every replica moves off the one
/// decommissioned while records keep coming (none fails, none is lost), it
/// ends holding nothing, and its data directory keeps no partition.
#[test]
fn decommissioning_a_node_under_load_moves_every_replica_and_loses_nothing() {
    let _turn = turn();
    let mut c = Cluster::start_with(3, QUICK);
    c.create_replicated("held", 1);
    c.add_learner(4);
    // A controller voter is not decommissioned, although broker 4 could
    // take its replicas (issue 41, item 7: only the playbook refused).
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["node", "decommission", "2", "--brokers", &c.addr(1).to_string()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("broker 2 is a controller voter"),
        "the refusal says why: {said}"
    );
    assert_eq!(node(&c, 1, 2)["decommissioning"], false);
    // Placed over all four brokers: node 4 holds some of it.
    c.strand(
        1,
        &[
            "queue",
            "create",
            "leaving",
            "--partitions",
            "4",
            "--replication-factor",
            "3",
        ],
    );
    let held = node(&c, 1, 4)["replicas"].as_u64().unwrap();
    assert!(held >= 2, "{held}");
    let stop = Arc::new(AtomicBool::new(false));
    let producing = produce_keyed_until(&c, "leaving", stop.clone());
    let consuming = consume_until(&c, "leaving", stop.clone());
    std::thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    let said = c.strand(3, &["node", "decommission", "4"]);
    assert!(said.contains("decommissioning"), "{said}");
    until("node 4 still holds replicas", Duration::from_secs(60), &mut || {
        let n = node(&c, 2, 4);
        n["replicas"] == 0 && n["moving_off"] == 0 && n["partitions"].as_array().unwrap().is_empty()
    });
    eprintln!("node 4 ({held} replicas) decommissioned in {:?}", started.elapsed());
    let n = node(&c, 1, 4);
    assert_eq!((&n["decommissioning"], &n["leaders"]), (&true.into(), &0.into()), "{n}");
    std::thread::sleep(Duration::from_secs(1));
    no_failure_no_loss(&c, "leaving", &stop, producing, consuming);
    for p in describe(&c, 1, "leaving")["partitions"].as_array().unwrap() {
        let replicas = ids(&p["replicas"]);
        assert!(replicas.len() == 3 && !replicas.contains(&4), "{p}");
    }
    let kept = c.data_dir(4).join("leaving");
    until(
        "node 4 still keeps partitions on disk",
        Duration::from_secs(10),
        &mut || std::fs::read_dir(&kept).map_or(true, |d| d.count() == 0),
    );
    // New queues avoid it.
    c.strand(
        1,
        &[
            "queue",
            "create",
            "after",
            "--partitions",
            "4",
            "--replication-factor",
            "3",
        ],
    );
    assert_eq!(node(&c, 1, 4)["replicas"], 0);
    // Cancelled (issue 41, item 7): it is no longer leaving, what moved
    // stays moved, and a queue made now gives it replicas again.
    let said = c.strand(2, &["node", "decommission", "4", "--cancel"]);
    assert!(said.contains("no longer decommissioning"), "{said}");
    assert_eq!(node(&c, 1, 4)["decommissioning"], false);
    assert_eq!(node(&c, 1, 4)["replicas"], 0);
    c.strand(
        1,
        &[
            "queue",
            "create",
            "back",
            "--partitions",
            "4",
            "--replication-factor",
            "3",
        ],
    );
    assert!(node(&c, 1, 4)["replicas"].as_u64().unwrap() >= 2);
}

/// Issue 41, item 7: a replica directory the table no longer gives its
/// broker (a queue deleted, or a replica moved, while the broker was down
/// and its close or delete never ran: a crash between them) stayed on disk
/// for good; the broker now removes it once it holds the whole table.
#[test]
fn a_replica_left_behind_while_its_broker_was_down_is_swept_at_its_start() {
    let _turn = turn();
    let mut c = Cluster::start_with(3, QUICK);
    c.create_replicated("gone", 2);
    c.create_replicated("kept", 1);
    c.kill9(3);
    let held = c.data_dir(3).join("gone");
    let copy = std::fs::read_to_string(held.join("0").join(".queue-id")).unwrap();
    c.strand(1, &["queue", "delete", "gone"]);
    // What node 3 holds of the deleted queue, as a crash between its close
    // and its delete leaves it, under a name its own log never opened.
    let stray = c.data_dir(3).join("stray");
    std::fs::create_dir_all(stray.join("0")).unwrap();
    std::fs::write(stray.join("0").join(".queue-id"), &copy).unwrap();
    // And a directory of a queue id the table has not reached: left alone.
    let future = c.data_dir(3).join("future");
    std::fs::create_dir_all(future.join("0")).unwrap();
    std::fs::write(future.join("0").join(".queue-id"), "999999").unwrap();
    c.restart(3);
    assert!(!held.exists(), "the deleted queue's copy is still on node 3's disk");
    assert!(!stray.exists(), "a replica left behind is still on node 3's disk");
    assert!(future.join("0").exists(), "a directory it cannot judge stays");
    assert!(
        c.data_dir(3).join("kept").join("0").exists(),
        "a live queue's copy stays"
    );
}
