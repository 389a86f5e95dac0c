//! Partitions without a leader, on real `strand serve` processes.
//!
//! A disk lost under a partition's last in-sync replica (issue 41, item 1):
//! voters on 127.0.0.1–3 and a broker without a vote on 127.0.0.4. The partition's follower is paused until
//! the ISR is its leader alone; the leader is killed with kill -9, its data
//! directory deleted (a replaced disk, or a mount that failed) and started
//! again; the follower resumes. Before directory ids the partition came
//! back led by the empty replica, and the follower truncated to it: every
//! acknowledged record gone. Now it waits, offline and saying why, until
//! an operator accepts the loss (`strand queue elect --unclean`), and the
//! follower's copy leads with every record it held.
//!
//! And a consumer of a queue with an offline partition reads the others
//! (it read nothing at all: found by the first test).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::cluster::{describe, read_all, Cluster};
use strand_client::{block_on, Acks, Admin, PartitionPlacement, Producer, ProducerConfig};

/// Followers that stop fetching leave the ISR after 2 s; leaderships stay
/// where failover put them.
const QUICK_ISR: &str = "replica_lag_time_max_ms = 2000\nreplica_fetch_wait_ms = 200\nleader_balance_interval_ms = 0\n";

/// Partition `p` of `queue` as node `via`'s metadata shows it, once
/// `ready` holds for it (within 30 s). (Metadata, not describe: describe
/// asks every leader for its figures, and one is paused.)
fn partition_when(
    c: &Cluster,
    via: u8,
    queue: &str,
    p: usize,
    what: &str,
    ready: impl Fn(&PartitionPlacement) -> bool,
) -> PartitionPlacement {
    let admin = Admin::connect(&c.addr(via).to_string()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let cluster = block_on(admin.describe_cluster()).unwrap();
        let part = cluster
            .partitions
            .into_iter()
            .find(|x| x.queue == queue && x.partition == p as u32)
            .unwrap();
        if ready(&part) {
            return part;
        }
        assert!(Instant::now() < deadline, "{queue}/{p} never {what}: {part:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An acks=all producer through node 1.
fn acks_all(c: &Cluster) -> Producer {
    let config = ProducerConfig {
        acks: Acks::All,
        ..ProducerConfig::default()
    };
    Producer::new(&c.addr(1).to_string(), config).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn a_wiped_disk_never_leads_what_it_alone_held_in_sync() {
    let _turn = turn();
    let mut c = Cluster::start_with(3, QUICK_ISR);
    c.add_learner(4);
    let queue = "kept";
    let (p, follower, via, acked) = killed_alone_in_sync(&mut c, queue);
    // The leader's disk is lost: its directory gone, started again.
    std::fs::remove_dir_all(c.data_dir(4)).unwrap();
    c.restart(4);
    c.node(follower).signal(libc::SIGCONT);
    // Offline, waiting for the replica that had the data, and saying so.
    let part = partition_when(&c, via, queue, p, "went offline for the lost replica", |part| {
        part.lost_replica == Some(4)
    });
    assert_eq!((part.leader, part.isr.clone()), (0, vec![]), "{part:?}");
    let part = describe(&c, via, queue)["partitions"][p].clone();
    assert_eq!(part["lost_replica"], 4, "{part}");
    assert_eq!(ids(&part["isr"]), Vec::<u64>::new(), "{part}");
    let reason = part["offline_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("offline: waiting for a replica with the data")
            && reason.ends_with("or `strand queue elect --unclean` to accept loss"),
        "{reason}"
    );
    let status: serde_json::Value =
        serde_json::from_str(c.strand(via, &["cluster", "status", "--output", "json"]).trim()).unwrap();
    let offline = status["offline"].as_array().unwrap();
    assert!(
        offline
            .iter()
            .any(|o| o["queue"] == queue && o["partition"] == p && o["lost_replica"] == 4),
        "{status}"
    );
    let text = c.strand(via, &["queue", "describe", queue]);
    assert!(
        text.contains(&format!("partition {p}: offline: waiting for a replica with the data")),
        "{text}"
    );
    // It stays so: no leader comes back by itself (the wiped broker
    // registers, renews, the follower is back).
    std::thread::sleep(Duration::from_secs(4));
    let part = &describe(&c, via, queue)["partitions"][p];
    assert_eq!(
        (part["leader"].clone(), part["lost_replica"].clone()),
        (0.into(), 4.into()),
        "{part}"
    );
    // An unclean election only on the operator's word: the follower's copy,
    // not the empty one, leads, and every record it held is readable.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["queue", "elect", queue, "--brokers", &c.addr(via).to_string()])
        .output()
        .unwrap();
    assert!(!refused.status.success(), "an election without --unclean ran");
    let p_text = p.to_string();
    c.strand(via, &["queue", "elect", queue, "--partition", &p_text, "--unclean"]);
    let part = partition_when(&c, via, queue, p, "was led again", |part| part.leader != 0);
    assert_eq!(part.leader, u32::from(follower), "{part:?}");
    // The CLI reads them too (another partition of the queue may still be
    // offline: broker 4 led two).
    let consumed = c.strand(
        via,
        &[
            "consume",
            queue,
            "--from",
            "earliest",
            "--max",
            "50",
            "--idle-exit-ms",
            "20000",
        ],
    );
    assert_eq!(consumed.lines().count(), 50, "{consumed}");
    assert_all_read(&c, via, queue, p, &acked);
    // The wiped broker catches up as a follower and is in sync again.
    partition_when(&c, via, queue, p, "took the wiped broker back in sync", |part| {
        part.isr.len() == 2
    });
    let scraped = common::scrape(c.node(via));
    assert_eq!(
        common::value(&scraped, "strand_unclean_elections_total"),
        Some(1.0),
        "{scraped}"
    );
}

#[test]
fn a_consumer_reads_the_partitions_that_have_a_leader_while_another_has_none() {
    let _turn = turn();
    let mut c = Cluster::start_with(3, QUICK_ISR);
    let queue = "some-down";
    c.strand(1, &["queue", "create", queue, "--partitions", "3"]);
    let d = describe(&c, 1, queue);
    let leaders: Vec<u8> = (0..3)
        .map(|p| d["partitions"][p]["leader"].as_u64().unwrap() as u8)
        .collect();
    // Records in every partition.
    let producer = acks_all(&c);
    let mut acked = std::collections::BTreeMap::new();
    for i in 0..60 {
        let (key, value) = (format!("k{i}"), format!("v{i}"));
        let d = block_on(producer.send(queue, Some(key.as_bytes()), value.as_bytes(), &[])).unwrap();
        acked.insert((d.partition, d.offset.unwrap()), value.into_bytes());
    }
    drop(producer);
    // The only replica of one partition dies: first unreachable, then
    // offline once its lease runs out.
    let down = *leaders.iter().find(|l| **l != 1).unwrap();
    c.kill9(down);
    let readable: Vec<((u32, u64), Vec<u8>)> = acked
        .iter()
        .filter(|((p, _), _)| leaders[*p as usize] != down)
        .map(|(k, v)| (*k, v.clone()))
        .collect();
    assert!(!readable.is_empty());
    let got = read_all(&c.addr(1).to_string(), queue, readable.len());
    for (at, value) in &readable {
        assert_eq!(
            got.get(at),
            Some(value),
            "record at {at:?} not read while another partition is down"
        );
    }
}

/// KIP-853's case: a controller voter whose disk was wiped must not vote
/// as if it kept its log. Voter 2 is down while a queue is created (the
/// entry committed on voters 1 and 3); voter 1 dies, voter 3's disk is
/// wiped. With voters 2 and 3 started again, the two make a majority — but
/// only voter 3's lost log held the entry beside voter 1's: a leader
/// elected with the wiped voter's vote would lack the queue. The wiped
/// voter votes in nothing until it caught up with a leader (nor while it
/// asks whether the group exists), so the group waits for voter 1, and
/// the queue survives.
#[test]
fn a_voter_with_a_wiped_disk_votes_only_once_it_caught_up() {
    let _turn = turn();
    let mut c = Cluster::start_with(3, QUICK_ISR);
    c.kill9(2);
    // Committed by voters 1 and 3 (through 1: whichever of them leads).
    c.strand(1, &["queue", "create", "remembered", "--partitions", "1"]);
    c.kill9(1);
    c.kill9(3);
    std::fs::remove_dir_all(c.data_dir(3)).unwrap();
    // The wiped voter first: it asks the others whether the group exists
    // and, with none up, goes on asking. Voter 2 then starts and
    // campaigns at once; a vote granted while the wiped voter still asked
    // (before, it voted until it heard the group existed) elects voter 2.
    let wiped = c.start_again(3);
    std::thread::sleep(Duration::from_secs(2));
    let mut lacking = c.start_again(2);
    // Voter 2 lacks the queue; with the wiped voter's vote it would lead
    // and serve without it.
    if lacking.ready_within(Duration::from_secs(10)) {
        c.started(2, lacking);
        let seen = common::cluster::metadata(&mut c.client(2), None);
        panic!(
            "voter 2 serves, led by {}, without the committed queue: {:?}",
            seen.controller, seen.queues
        );
    }
    // Voter 1 back: it leads (its log is the longer), the others catch up
    // and serve, and every node has the queue.
    let first = c.start_again(1);
    c.started(1, first);
    c.started(2, lacking);
    c.started(3, wiped);
    for id in 1..=3 {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !common::cluster::metadata(&mut c.client(id), None)
            .queues
            .contains(&"remembered".to_string())
        {
            assert!(Instant::now() < deadline, "node {id} never saw the queue");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // It votes again: voter 1 dies once more, and 2 and 3 elect a leader.
    c.kill9(1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while common::cluster::metadata(&mut c.client(2), None).controller == 0 {
        assert!(Instant::now() < deadline, "no controller leader without voter 1");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A replica whose log came back short (issue 41, corruption): broker 4
/// leads a partition of three replicas and is killed with kill -9; the
/// tail of its log is damaged (the last batches' bytes flipped, as a
/// power loss or a bad disk leaves them: cut at open by their CRC) and it
/// is started again at once, while the replica that takes over is paused
/// (broker 4 cannot catch up from it). Broker 4 is first in the replica
/// order: were it still in the ISR, the failover from the paused replica
/// would pick it, and the third replica would cut its acknowledged
/// records to match its short log. Its registration takes it out of the
/// ISRs it shares instead: the third replica leads, and every
/// acknowledged record is read.
#[test]
fn a_replica_that_lost_its_tail_at_open_does_not_lead_while_another_is_in_sync() {
    let _turn = turn();
    let mut c = Cluster::start_with(3, QUICK_ISR);
    c.add_learner(4);
    c.add_learner(5);
    let queue = "damaged";
    let (p, replicas) = led_by_4(&c, queue, 5, 3);
    let (took_over, third) = (replicas[1] as u8, replicas[2] as u8);
    partition_when(&c, 1, queue, p, "had its replicas in sync", |part| part.isr.len() == 3);
    let acked = produce_acked(&c, queue, 5, p, 100);
    c.kill9(4);
    damage_tail(&c.data_dir(4).join(queue).join(p.to_string()));
    c.node(took_over).signal(libc::SIGSTOP);
    c.restart(4);
    let via = (1..=3).find(|id| *id != took_over).unwrap();
    // The paused replica is fenced; the third leads (not broker 4).
    let part = partition_when(
        &c,
        via,
        queue,
        p,
        "was led by a replica other than the paused one",
        |part| part.leader != 0 && part.leader != u32::from(took_over) && part.leader != 4,
    );
    assert_eq!(part.leader, u32::from(third), "{part:?}");
    assert_all_read(&c, via, queue, p, &acked);
    c.node(took_over).signal(libc::SIGCONT);
}

/// A sole in-sync replica whose log is damaged in the middle (issue 41: a
/// 30-minute strand-chaos run lost 41,173 acknowledged records this way).
/// Broker 4 leads a partition of two replicas; its follower, holding every
/// record, is paused until the ISR is broker 4 alone; broker 4 is killed
/// with kill -9, one byte of a record in the middle of its log flipped
/// (later batches intact: a bad disk, not a torn write), and it starts
/// again. Before, it led the log cut at the flip, and the follower
/// truncated its acknowledged records to match. Now the damage is found at
/// open and reported: the partition waits offline, saying why, and an
/// unclean election takes the follower, which holds every record.
#[test]
fn a_sole_in_sync_replica_with_a_damaged_log_does_not_lead_it() {
    let _turn = turn();
    let mut c = Cluster::start_with(3, QUICK_ISR);
    c.add_learner(4);
    let queue = "rotten";
    let (p, follower, via, acked) = killed_alone_in_sync(&mut c, queue);
    flip_value(&c.data_dir(4).join(queue).join(p.to_string()), b"v25");
    c.restart(4);
    c.node(follower).signal(libc::SIGCONT);
    let part = partition_when(&c, via, queue, p, "went offline for the damaged replica", |part| {
        part.lost_replica == Some(4)
    });
    assert_eq!((part.leader, part.isr.clone()), (0, vec![]), "{part:?}");
    let reason = describe(&c, via, queue)["partitions"][p]["offline_reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(reason.contains("a damaged log"), "{reason}");
    // It stays so.
    std::thread::sleep(Duration::from_secs(3));
    let part = partition_when(&c, via, queue, p, "stayed offline", |_| true);
    assert_eq!(part.leader, 0, "{part:?}");
    let p_text = p.to_string();
    c.strand(via, &["queue", "elect", queue, "--partition", &p_text, "--unclean"]);
    let part = partition_when(&c, via, queue, p, "was led again", |part| part.leader != 0);
    assert_eq!(part.leader, u32::from(follower), "{part:?}");
    assert_all_read(&c, via, queue, p, &acked);
    // Broker 4 catches up from the follower and is in sync again.
    partition_when(&c, via, queue, p, "took broker 4 back in sync", |part| {
        part.isr.len() == 2
    });
}

/// Creates `queue` (8 partitions, 2 replicas) and takes a partition
/// broker 4 leads (placement spreads leaders: two of eight), its follower
/// a voter: 50 records acknowledged by both replicas, then the follower
/// paused until the ISR is broker 4 alone, then broker 4 killed with kill
/// -9. Returns the partition, the (paused) follower, a voter to ask that
/// is not paused, and the records (offset, value).
fn killed_alone_in_sync(c: &mut Cluster, queue: &str) -> (usize, u8, u8, Vec<(u64, String)>) {
    let (p, replicas) = led_by_4(c, queue, 8, 2);
    let follower = replicas[1] as u8;
    partition_when(c, 1, queue, p, "had both replicas in sync", |part| part.isr.len() == 2);
    let acked = produce_acked(c, queue, 8, p, 50);
    c.node(follower).signal(libc::SIGSTOP);
    let via = (1..=3).find(|id| *id != follower).unwrap();
    partition_when(c, via, queue, p, "shrank to its leader", |part| part.isr == [4]);
    c.kill9(4);
    (p, follower, via, acked)
}

/// The newest segment file of `dir` (a partition directory).
fn newest_segment(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .max()
        .unwrap()
}

/// Flips the byte after the first byte of `value` in the newest segment
/// of `dir` (a partition directory): that batch fails its CRC, the
/// batches after it stay valid.
fn flip_value(dir: &std::path::Path, value: &[u8]) {
    let newest = newest_segment(dir);
    let mut bytes = std::fs::read(&newest).unwrap();
    let at = bytes
        .windows(value.len())
        .position(|w| w == value)
        .expect("the value is in the segment");
    bytes[at + 1] ^= 0xFF;
    std::fs::write(&newest, bytes).unwrap();
}

/// Creates `queue` (`partitions`, replication factor `rf`) and finds a
/// partition broker 4 leads: its number and replicas (broker 4 first).
fn led_by_4(c: &Cluster, queue: &str, partitions: u32, rf: u32) -> (usize, Vec<u64>) {
    let (n, rf) = (partitions.to_string(), rf.to_string());
    c.strand(
        1,
        &[
            "queue",
            "create",
            queue,
            "--partitions",
            &n,
            "--replication-factor",
            &rf,
        ],
    );
    let d = describe(c, 1, queue);
    let (p, replicas) = d["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .find_map(|(i, part)| (part["leader"] == 4).then(|| (i, ids(&part["replicas"]))))
        .expect("broker 4 leads a partition");
    assert_eq!(replicas[0], 4, "{replicas:?}");
    (p, replicas)
}

/// `count` keyed acks=all records into partition `p` of `queue` (of
/// `partitions`): each one's offset and value.
fn produce_acked(c: &Cluster, queue: &str, partitions: u32, p: usize, count: usize) -> Vec<(u64, String)> {
    let keys: Vec<String> = (0..)
        .map(|i| format!("k{i}"))
        .filter(|k| strand_wire::partition_for_key(k.as_bytes(), partitions) == p as u32)
        .take(5)
        .collect();
    let producer = acks_all(c);
    (0..count)
        .map(|i| {
            let value = format!("v{i}");
            let d = block_on(producer.send(queue, Some(keys[i % 5].as_bytes()), value.as_bytes(), &[])).unwrap();
            assert_eq!(d.partition, p as u32);
            (d.offset.unwrap(), value)
        })
        .collect()
}

/// Every record of `acked` (offset, value) is read from partition `p` of
/// `queue` through node `via`.
fn assert_all_read(c: &Cluster, via: u8, queue: &str, p: usize, acked: &[(u64, String)]) {
    let got = read_all(&c.addr(via).to_string(), queue, acked.len());
    for (offset, value) in acked {
        assert_eq!(
            got.get(&(p as u32, *offset)).map(|v| v.as_slice()),
            Some(value.as_bytes()),
            "record at {p}/{offset} lost"
        );
    }
}

/// Flips the last 300 written bytes of the newest segment in `dir` (a
/// partition directory): the last batches fail their CRC at open.
fn damage_tail(dir: &std::path::Path) {
    let newest = newest_segment(dir);
    let mut bytes = std::fs::read(&newest).unwrap();
    let end = bytes.iter().rposition(|b| *b != 0).unwrap() + 1;
    for b in &mut bytes[end.saturating_sub(300)..end] {
        *b ^= 0xA5;
    }
    std::fs::write(&newest, bytes).unwrap();
}
