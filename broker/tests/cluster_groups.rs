//! Consumer groups, ack mode and the dead-letter queue across three
//! `strand serve` processes on 127.0.0.1–3: the group's coordinator (the
//! leader of its `__groups` partition), the queue's partitions and
//! `<queue>.dlq` are led by different nodes, and every group command works
//! through any node. One cluster at a time (two cores).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::cluster::{metadata, Cluster};

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Followers out of the ISR after 2 s; leaderships stay where they are.
const QUICK: &str = "replica_lag_time_max_ms = 2000\nreplica_fetch_wait_ms = 200\nleader_balance_interval_ms = 0\n";

/// The node leading `group`'s `__groups` partition (its coordinator).
fn coordinator(c: &Cluster, group: &str) -> u8 {
    let leaders = metadata(&mut c.client(1), Some("__groups")).leaders;
    let p = strand_wire::partition_for_key(group.as_bytes(), leaders.len() as u32);
    leaders[p as usize] as u8
}

#[test]
fn ack_mode_and_the_dead_letter_queue_work_when_other_nodes_lead_the_partitions() {
    let _turn = turn();
    let c = Cluster::start_with(3, QUICK);
    let leaders = c.create_replicated("jobs", 3);
    assert_eq!(
        leaders.iter().collect::<BTreeSet<_>>().len(),
        3,
        "each node leads one: {leaders:?}"
    );
    let mut lines: Vec<String> = (0..30).map(|i| format!("k{}:job{i}", i % 4)).collect();
    lines.insert(12, "k1:poison".into());
    let mut produce = std::process::Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["produce", "jobs", "--key-separator", ":", "--acks", "all", "--brokers"])
        .arg(c.addr(2).to_string())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut produce.stdin.take().unwrap(), (lines.join("\n") + "\n").as_bytes()).unwrap();
    assert!(produce.wait().unwrap().success());

    // Through node 3, whichever node coordinates: every record once, the
    // poison one five times, then dead-lettered.
    let cmd = r#"v=$(cat); echo "$STRAND_PARTITION $STRAND_OFFSET $STRAND_DELIVERY_ATTEMPT $v"; test "$v" != poison"#;
    let out = c.strand(
        3,
        &[
            "consume",
            "jobs",
            "--group",
            "workers",
            "--from",
            "earliest",
            "--exec",
            cmd,
            "--retry-backoff",
            "50ms",
            "--idle-exit-ms",
            "3000",
        ],
    );
    let coordinated_by = coordinator(&c, "workers");
    eprintln!("partitions led by {leaders:?}, the group coordinated by node {coordinated_by}");
    let runs: Vec<(String, u32)> = out
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[3].to_string(), f[2].parse().unwrap())
        })
        .collect();
    let poison: Vec<u32> = runs.iter().filter(|r| r.0 == "poison").map(|r| r.1).collect();
    assert_eq!(poison, vec![1, 2, 3, 4, 5], "tried exactly five times: {out}");
    let others: BTreeSet<&String> = runs.iter().filter(|r| r.0 != "poison").map(|r| &r.0).collect();
    assert_eq!(others.len(), 30, "every other record: {out}");
    assert_eq!(runs.len(), 35, "each once: {out}");

    // The dead letter, and the group, seen through every node.
    for via in 1..=3u8 {
        let dead: serde_json::Value =
            serde_json::from_str(c.strand(via, &["dlq", "list", "jobs", "--output", "json"]).trim()).unwrap();
        let dead = dead.as_array().unwrap();
        assert_eq!(dead.len(), 1, "via {via}: {dead:?}");
        assert_eq!((&dead[0]["value"], &dead[0]["attempts"]), (&"poison".into(), &5.into()));
        let listed = c.strand(via, &["group", "list"]);
        assert!(listed.contains("workers"), "group list via {via}: {listed}");
        let described: serde_json::Value = serde_json::from_str(
            c.strand(via, &["group", "describe", "workers", "--output", "json"])
                .trim(),
        )
        .unwrap();
        let parts = described["partitions"].as_array().unwrap();
        assert_eq!(parts.len(), 3, "via {via}: {described}");
        for p in parts {
            assert_eq!(p["lag"], 0, "via {via}: {described}");
            assert!(p["log_end"].as_u64().unwrap() > 0, "via {via}: {described}");
        }
    }
    // A reset through a node that neither coordinates nor leads partition 0.
    let via = (1..=3u8)
        .find(|id| *id != coordinated_by && u32::from(*id) != leaders[0])
        .unwrap();
    c.strand(
        via,
        &[
            "group",
            "reset",
            "workers",
            "--queue",
            "jobs",
            "--partitions",
            "0",
            "--to",
            "earliest",
        ],
    );
    let described: serde_json::Value = serde_json::from_str(
        c.strand(via, &["group", "describe", "workers", "--output", "json"])
            .trim(),
    )
    .unwrap();
    let p0 = described["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["partition"] == 0)
        .unwrap();
    assert_eq!(p0["lag"], p0["log_end"], "reset to the start: {described}");
}

/// A group member reading a queue whose partitions three nodes lead; the
/// coordinator's node is killed with kill -9 half way: the group goes on
/// with the new coordinator, nothing committed is read again past what the
/// last commit covered, no record is missed, no committed position moves
/// back.
#[test]
fn a_group_goes_on_when_its_coordinator_is_killed() {
    use strand_client::{block_on, GroupConfig, GroupConsumer, GroupStart, Producer, ProducerConfig};
    let _turn = turn();
    let mut c = Cluster::start_with(3, QUICK);
    c.create_replicated("ledger", 3);
    let all = (1..=3).map(|id| c.addr(id).to_string()).collect::<Vec<_>>().join(",");
    let producer = Producer::new(
        &all,
        ProducerConfig {
            acks: strand_client::Acks::All,
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    let send = |from: u32, to: u32| {
        for i in from..to {
            let key = format!("k{}", i % 5);
            block_on(producer.send("ledger", Some(key.as_bytes()), format!("r{i}").as_bytes(), &[])).unwrap();
        }
    };
    send(0, 200);
    let config = GroupConfig {
        start: GroupStart::Earliest,
        session_timeout: Duration::from_secs(10),
        ..GroupConfig::default()
    };
    let mut member = block_on(GroupConsumer::subscribe(&all, "auditors", &["ledger"], config)).unwrap();
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    let read_until = |member: &mut GroupConsumer, seen: &mut BTreeMap<String, u32>, want: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen.len() < want {
            assert!(Instant::now() < deadline, "{} of {want} records read", seen.len());
            for r in block_on(member.poll()).expect("poll") {
                let v = String::from_utf8(r.value.unwrap().to_vec()).unwrap();
                *seen.entry(v).or_default() += 1;
            }
        }
    };
    read_until(&mut member, &mut seen, 200);
    block_on(member.commit()).unwrap();
    let positions = |c: &Cluster, via: u8| -> BTreeMap<u64, u64> {
        let d: serde_json::Value = serde_json::from_str(
            c.strand(via, &["group", "describe", "auditors", "--output", "json"])
                .trim(),
        )
        .unwrap();
        d["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["partition"].as_u64().unwrap(), p["position"].as_u64().unwrap_or(0)))
            .collect()
    };
    let dead = coordinator(&c, "auditors");
    let survivor = (1..=3u8).find(|id| *id != dead).unwrap();
    let before = positions(&c, survivor);
    assert_eq!(before.values().sum::<u64>(), 200, "{before:?}");
    c.kill9(dead);
    send(200, 400);
    read_until(&mut member, &mut seen, 400);
    // The new coordinator knows no member (membership is not stored): a
    // commit before the member joined again is refused (fenced), and what
    // it covered is not committed; the member polls (joining again) and
    // commits what it reads next. So: more records each round, until a
    // commit covers everything sent.
    let mut sent = 400u32;
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        match block_on(member.commit()) {
            Ok(()) => {
                let now = positions(&c, survivor);
                if now.values().sum::<u64>() == u64::from(sent) {
                    break now;
                }
            }
            Err(e) => assert!(strand_client::is_fenced(&e), "commit: {e}"),
        }
        assert!(Instant::now() < deadline, "never committed all {sent} records");
        send(sent, sent + 10);
        sent += 10;
        read_until(&mut member, &mut seen, sent as usize);
    };
    assert_ne!(coordinator(&c, "auditors"), dead, "a new coordinator");
    for (p, at) in &before {
        assert!(
            after[p] >= *at,
            "partition {p}'s commit moved back: {before:?} then {after:?}"
        );
    }
    assert_eq!(after.values().sum::<u64>(), u64::from(sent), "{after:?}");
    let again: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    eprintln!("node {dead} (the coordinator) killed; read again: {again:?}");
    assert!(
        seen.keys().all(|v| v[1..].parse::<u32>().unwrap() < sent) && seen.len() == sent as usize,
        "every record read"
    );
    // Nothing committed before the kill is read again.
    assert!(
        again.iter().all(|(v, _)| v[1..].parse::<u32>().unwrap() >= 200),
        "records below the commit were read again: {again:?}"
    );
}

/// Ack mode: a record that fails every time is delivered three times, the
/// coordinator's node is killed with kill -9, and the new coordinator goes
/// on counting: the record is delivered twice more (five in all, the
/// queue's `max_delivery_attempts`) and dead-lettered once.
#[test]
fn delivery_counts_survive_a_coordinator_failover() {
    use strand_client::{block_on, GroupConfig, GroupConsumer, GroupStart};
    let _turn = turn();
    let mut c = Cluster::start_with(3, QUICK);
    c.create_replicated("tasks", 1);
    let mut produce = std::process::Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["produce", "tasks", "--acks", "all", "--brokers"])
        .arg(c.addr(1).to_string())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut produce.stdin.take().unwrap(), b"poison\n").unwrap();
    assert!(produce.wait().unwrap().success());
    let all = (1..=3).map(|id| c.addr(id).to_string()).collect::<Vec<_>>().join(",");
    let config = GroupConfig {
        start: GroupStart::Earliest,
        session_timeout: Duration::from_secs(10),
        lock: Duration::from_secs(5),
        ..GroupConfig::default()
    };
    let mut member = block_on(GroupConsumer::subscribe(&all, "workers", &["tasks"], config)).unwrap();
    // Receives the record and nacks it, until `attempts` deliveries were
    // seen; errors while the cluster moves are counted, not fatal.
    let mut attempts = Vec::new();
    let mut errors = Vec::new();
    let mut fail_until = |member: &mut GroupConsumer, n: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while attempts.len() < n {
            assert!(Instant::now() < deadline, "deliveries {attempts:?}, errors {errors:?}");
            match block_on(member.receive(1)) {
                Ok(got) => {
                    for r in got {
                        attempts.push(r.attempt);
                        if let Err(e) = block_on(member.nack(&r.record, Duration::ZERO, "it fails")) {
                            errors.push(e.to_string());
                        }
                    }
                }
                Err(e) => {
                    errors.push(e.to_string());
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    };
    fail_until(&mut member, 3);
    let dead = coordinator(&c, "workers");
    c.kill9(dead);
    fail_until(&mut member, 5);
    eprintln!(
        "coordinator {dead} killed after three deliveries; deliveries {attempts:?}; errors meanwhile: {errors:?}"
    );
    assert_eq!(attempts, [1, 2, 3, 4, 5], "errors: {errors:?}");
    let survivor = (1..=3u8).find(|id| *id != dead).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // The next receive moves it aside (and delivers nothing).
        let sixth = block_on(member.receive(1)).unwrap();
        assert!(sixth.is_empty(), "a sixth delivery: attempt {}", sixth[0].attempt);
        let listed: serde_json::Value =
            serde_json::from_str(c.strand(survivor, &["dlq", "list", "tasks", "--output", "json"]).trim()).unwrap();
        let dead_letters = listed.as_array().unwrap();
        if !dead_letters.is_empty() {
            assert_eq!(dead_letters.len(), 1, "{listed}");
            assert_eq!(dead_letters[0]["attempts"], 5, "{listed}");
            break;
        }
        assert!(Instant::now() < deadline, "never dead-lettered");
        std::thread::sleep(Duration::from_millis(200));
    }
}
