//! `strand serve` end to end: the real binary on loopback, spoken to with
//! the protocol codec.

mod common;

use common::*;
use std::os::unix::process::ExitStatusExt;
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
    let out = serve_command(&broker.addr.to_string(), &["--cores", "1", "--data-dir"])
        .arg(other.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use"), "{err}");
    // The first broker is untouched.
    assert_eq!(broker.client().create_queue("still-here", 1), ErrorCode::None);
}

/// `strand serve` as a person starts it: no `--data-dir` (so
/// `./strand-data`, relative to where it runs), and a relative path that
/// climbs (`sub/../x`). Both once failed to start: glommio opened the
/// controller's directory with a relative path and no directory fd.
#[test]
fn relative_data_directories_start_and_keep_their_data() {
    let cwd = tempfile::tempdir().unwrap();
    std::fs::create_dir(cwd.path().join("sub")).unwrap();
    for (args, dir) in [(&[][..], "strand-data"), (&["--data-dir", "sub/../x"][..], "x")] {
        let start = || {
            let mut command = serve_command("127.0.0.1:0", &["--cores", "1"]);
            command.current_dir(cwd.path()).args(args);
            Broker::spawn(command, &cwd.path().join(dir))
        };
        let broker = start();
        let mut c = broker.client();
        assert_eq!(c.create_queue("q", 1), ErrorCode::None);
        c.produce("q", 0, batch("kept", 3, TS), 1).unwrap();
        assert!(cwd.path().join(dir).join("q").join("0").is_dir(), "{args:?}");
        assert!(broker.terminate().success());
        let broker = start();
        assert_eq!(broker.client().fetch_all("q", 0, 0).len(), 3, "{args:?}");
    }
}

/// Two brokers on one data directory would each write its segments:
/// records acknowledged by either were lost after a restart. The second is
/// refused, naming the first; the first's data is intact.
#[test]
fn a_second_broker_on_the_same_data_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = Broker::start(dir.path());
    let mut c = first.client();
    assert_eq!(c.create_queue("q", 1), ErrorCode::None);
    for i in 0..10 {
        c.produce("q", 0, batch(&format!("a{i}"), 10, TS), 1).unwrap();
    }
    let out = serve_command("127.0.0.1:0", &["--cores", "1", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("is in use by process {}", first.child.id())),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "no ready line");
    for i in 10..20 {
        c.produce("q", 0, batch(&format!("a{i}"), 10, TS), 1).unwrap();
    }
    assert!(first.terminate().success());
    let again = Broker::start(dir.path());
    let records = again.client().fetch_all("q", 0, 0);
    assert_eq!(records.len(), 200, "every acknowledged record is there");
    assert!(records.iter().enumerate().all(|(i, (o, _))| *o == i as u64));
}

/// What the machine cannot hold is refused before anything is allocated
/// or created, naming what to lower.
#[test]
fn more_shards_or_memory_than_the_machine_has_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("big.toml");
    std::fs::write(&config, "tail_cache_budget_bytes = 1125899906842624\n").unwrap();
    let data = tmp.path().join("data");
    for (extra, says) in [
        (vec!["--cores", "4096"], "CPUs this process may run on"),
        (
            vec!["--cores", "1", "--config", config.to_str().unwrap()],
            "tail_cache_budget_bytes",
        ),
    ] {
        let started = std::time::Instant::now();
        let out = serve_command("127.0.0.1:0", &extra)
            .arg("--data-dir")
            .arg(&data)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{extra:?}: {err}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "refused at once"
        );
        assert!(!data.exists(), "{extra:?}: nothing created");
    }
}

/// A data directory that is a file, and a start that fails once the
/// directory is made (here: the client address cannot be bound), say so
/// and leave nothing behind.
#[test]
fn failed_starts_say_why_and_leave_no_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("file");
    std::fs::write(&file, b"not a directory").unwrap();
    let serve = |listen: &str, data: &std::path::Path| {
        serve_command(listen, &["--cores", "1", "--data-dir"])
            .arg(data)
            .output()
            .unwrap()
    };
    let out = serve("127.0.0.1:0", &file);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("strand: data directory {} is not a directory", file.display())),
        "{err}"
    );
    // 192.0.2.1 (TEST-NET-1) is no address of this machine: binding fails
    // (nothing is sent anywhere).
    let data = tmp.path().join("new/data");
    let out = serve_command("192.0.2.1:0", &["--cores", "1", "--auth", "none", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("binding 192.0.2.1:0"), "{err}");
    assert!(!tmp.path().join("new").exists(), "the directories it made are gone");
}

/// SIGTERM while the broker starts ends it at once (exit 0, as a stop
/// after the ready line does), and what it leaves is a directory the next
/// broker starts on.
#[test]
fn a_signal_during_start_up_stops_it() {
    for delay_ms in [0, 30, 100] {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let mut child = serve_command("127.0.0.1:0", &["--cores", "2", "--data-dir"])
            .arg(&data)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let started = std::time::Instant::now();
        let out = loop {
            if child.try_wait().unwrap().is_some() {
                break child.wait_with_output().unwrap();
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "still running 10 s after SIGTERM"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Before its handler is installed, SIGTERM's default action ends it.
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGTERM),
            "{:?}: {stderr}",
            out.status
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        let broker = Broker::start(&data);
        assert_eq!(
            broker.client().create_queue("after", 1),
            ErrorCode::None,
            "{delay_ms} ms"
        );
    }
}

/// A locked-memory limit too low for the shards' I/O memory is one warning
/// line saying what it costs and how to raise it (glommio's own warning
/// was five lines a shard). Root keeps CAP_IPC_LOCK, which lifts the
/// limit: it is dropped here with setpriv (which needs root).
#[test]
fn a_low_locked_memory_limit_is_one_clear_line() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: dropping CAP_IPC_LOCK with setpriv needs root (CI runs as root)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("sh")
        .args([
            "-c",
            "ulimit -l 1024 && exec setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock \"$@\"",
            "sh",
            env!("CARGO_BIN_EXE_strand"),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--cores",
            "2",
            "--data-dir",
        ])
        .arg(dir.path())
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut ready).unwrap();
    assert!(ready.contains("ready"), "{ready}");
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let about: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("ulimit -l") || l.contains("registering"))
        .collect();
    assert_eq!(about.len(), 1, "{err}");
    assert!(about[0].contains("1 MiB") && about[0].contains("LimitMEMLOCK"), "{err}");
    // Logs to a pipe are plain text: no colour codes.
    assert!(
        !err.contains('\u{1b}'),
        "escape codes in a log that is not a terminal: {err:?}"
    );
}

/// Waits (up to 5 s) until every thread of process `pid` is stopped
/// (state `T` in /proc/PID/task/*/stat).
fn wait_until_stopped(pid: i32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let stopped = || {
        std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
            tasks.flatten().all(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|s| {
                        s.rfind(')')
                            .and_then(|i| s[i + 1..].split_whitespace().next().map(str::to_string))
                    })
                    .is_some_and(|state| state == "T" || state == "t")
            })
        })
    };
    while !stopped() {
        assert!(std::time::Instant::now() < deadline, "process {pid} did not stop");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A peer link (a broker's connection to another broker) against a real
/// broker: answered; while that broker is paused (SIGSTOP) a call fails at
/// its deadline instead of hanging; once it is resumed, calls are answered
/// again on the same link (the late answer to the call that gave up is
/// dropped).
#[test]
fn a_peer_link_fails_at_its_deadline_while_the_peer_is_paused() {
    use std::time::{Duration, Instant};
    use strand_broker::peer::{PeerError, PeerLink};
    use strand_net::frame::FrameLimits;
    use strand_net::message::TailBuilder;
    use strand_wire::flatbuffers::FlatBufferBuilder;
    use strand_wire::*;

    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(dir.path(), &["--cores", "1"]);
    let (addr, pid) = (broker.addr, broker.child.id() as i32);
    glommio::LocalExecutorBuilder::default()
        .io_memory(1 << 20)
        .spawn(move || async move {
            let mut fbb = FlatBufferBuilder::new();
            let root = ApiVersionsRequest::create(&mut fbb, &ApiVersionsRequestArgs { client_name: None });
            fbb.finish_minimal(root);
            let body = fbb.finished_data().to_vec();
            let link = PeerLink::new(addr, FrameLimits::default(), Default::default());
            let call = |timeout| link.call(Api::ApiVersions, &body, TailBuilder::default(), timeout);
            let f = call(Duration::from_secs(10)).await.unwrap();
            assert_eq!(f.header.api, Api::ApiVersions as u16);
            // SAFETY: signals to the broker this test started.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            // kill returns before every thread has stopped (a thread running
            // on another CPU stops at its next interrupt, late on a busy VM):
            // wait until all of them are.
            wait_until_stopped(pid);
            let started = Instant::now();
            let err = call(Duration::from_millis(500)).await.unwrap_err();
            let took = started.elapsed();
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
            assert!(matches!(err, PeerError::Timeout { .. }), "{err}");
            assert!(took < Duration::from_secs(3), "{took:?}");
            // Another API now: the late ApiVersions answer must not be
            // taken for this call's.
            let mut fbb = FlatBufferBuilder::new();
            let root = MetadataRequest::create(&mut fbb, &MetadataRequestArgs { queues: None });
            fbb.finish_minimal(root);
            let f = link
                .call(
                    Api::Metadata,
                    fbb.finished_data(),
                    TailBuilder::default(),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
            assert_eq!(f.header.api, Api::Metadata as u16);
        })
        .unwrap()
        .join()
        .unwrap();
    assert!(broker.terminate().success());
}

/// Answers ready at the same moment go out together (one send, up to 64
/// KiB; a larger one on its own): many pipelined requests of one
/// connection, answers of a few hundred bytes, of ~20 KB and of more than
/// 64 KiB interleaved, all come back whole and in request order.
#[test]
fn pipelined_answers_come_back_whole_and_in_order_whatever_their_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let mut admin = broker.client();
    assert_eq!(admin.create_queue("mixed", 1), ErrorCode::None);
    // Eight batches of 20 records of 1,000 bytes (~20 KB each).
    let value = vec![b'v'; 1000];
    for i in 0..8i64 {
        let mut b = strand_storage::batch::BatchBuilder::new();
        for _ in 0..20 {
            b.push(None, Some(&value), &[], TS + i);
        }
        admin.produce("mixed", 0, b.build().freeze(), 1).unwrap();
    }
    let mut c = broker.client();
    let mut sent = Vec::new();
    for i in 0..90u64 {
        let (id, want) = match i % 3 {
            0 => {
                let (body, tail) = strand_client::requests::produce("mixed", 0, 1, batch("small", 1, TS));
                (c.send_body(strand_wire::Api::Produce, &body, tail), None)
            }
            // One ~20 KB batch from offset (i % 8) * 20.
            1 => {
                let at = (i % 8) * 20;
                (
                    c.send_fetch("mixed", &[(0, at)], 30_000, 0, 1, false),
                    Some((at, 100_000)),
                )
            }
            // Everything from 0: over 64 KiB.
            _ => (
                c.send_fetch("mixed", &[(0, 0)], 1 << 20, 0, 1, false),
                Some((0, 70_000)),
            ),
        };
        sent.push((id, want));
    }
    for (id, want) in sent {
        let f = c.recv();
        assert_eq!(f.header.correlation_id, id, "answers in request order");
        match want {
            None => {
                strand_client::requests::produced(&f).unwrap();
            }
            Some((at, bound)) => {
                let (batches, _) = fetched(&f).unwrap();
                assert_eq!(batches[0].base_offset().0, at);
                let bytes: usize = batches.iter().map(|b| b.len()).sum();
                if at == 0 && bound == 70_000 {
                    assert!(bytes > bound, "{bytes}");
                } else {
                    assert!(bytes < bound, "{bytes}");
                }
            }
        }
    }
}
