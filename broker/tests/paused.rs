//! A paused broker (SIGSTOP: a VM stall, a long pause, a network black
//! hole — its kernel still accepts connections, and nothing answers) listed
//! first in `--brokers` (issue 41, item 2). Every CLI produce failed after
//! 60 s, although the other two nodes had elected a new leader within
//! seconds: the client asked the paused broker for metadata and waited out
//! a request's whole deadline, and a produce sent to the paused leader
//! waited for it too. Now a connect or metadata request gives up after
//! about two seconds and asks the next broker, and a produce out that long
//! looks the leader up again and goes to its successor.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::cluster::{read_all, Cluster};

const QUICK_ISR: &str = "replica_lag_time_max_ms = 2000\nreplica_fetch_wait_ms = 200\nleader_balance_interval_ms = 0\n";

/// `strand produce QUEUE --acks all --brokers BROKERS` of `lines`; its exit
/// status, stderr and how long it took (killed after 90 s).
fn produce(brokers: &str, queue: &str, lines: &[String]) -> (bool, String, Duration) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["produce", queue, "--acks", "all", "--brokers", brokers])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for l in lines {
        writeln!(stdin, "{l}").unwrap();
    }
    drop(stdin);
    let deadline = started + Duration::from_secs(90);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
    )
}

#[test]
fn a_paused_leader_listed_first_stops_no_produce() {
    let c = Cluster::start_with(3, QUICK_ISR);
    let queue = "steady";
    let leaders = c.create_replicated(queue, 1);
    let paused = leaders[0] as u8;
    let mut order = vec![paused];
    order.extend((1..=3).filter(|id| *id != paused));
    let brokers: Vec<String> = order.iter().map(|id| c.addr(*id).to_string()).collect();
    let brokers = brokers.join(",");
    c.node(paused).signal(libc::SIGSTOP);
    let mut sent = Vec::new();
    for round in 0..3 {
        let lines: Vec<String> = (0..40).map(|i| format!("r{round}-{i}")).collect();
        let (ok, said, took) = produce(&brokers, queue, &lines);
        eprintln!("round {round}: {took:?}: {said}");
        assert!(ok, "round {round} failed after {took:?}: {said}");
        assert!(
            took < Duration::from_secs(25),
            "round {round} took {took:?} with the first bootstrap broker paused"
        );
        sent.extend(lines);
    }
    // Operators' commands too: the paused broker costs seconds, not a
    // minute.
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["cluster", "status", "--output", "json", "--brokers", &brokers])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "cluster status took {:?}",
        started.elapsed()
    );
    // Every record is there, read through the other nodes.
    let via = c.addr(order[1]).to_string();
    let got = read_all(&via, queue, sent.len());
    let values: std::collections::BTreeSet<Vec<u8>> = got.values().cloned().collect();
    for v in &sent {
        assert!(values.contains(v.as_bytes()), "{v} lost");
    }
    c.node(paused).signal(libc::SIGCONT);
}
