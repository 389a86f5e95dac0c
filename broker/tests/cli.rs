//! `strand queue …` against a running broker: exit codes, output, errors.

mod common;

use std::process::{Command, Output};

use common::*;

fn strand(args: &[&str], brokers: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(args)
        .env("STRAND_BROKERS", brokers)
        .env("RUST_LOG", "warn")
        .output()
        .expect("running strand")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn queue_commands_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let addr = broker.addr.to_string();

    let o = strand(
        &["queue", "create", "orders", "--partitions", "3", "--retention", "12h"],
        &addr,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = strand(&["queue", "list", "--output", "json"], &addr);
    assert!(o.status.success());
    let list: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(list, serde_json::json!([{ "name": "orders", "partitions": 3 }]));

    broker.client().produce("orders", 1, batch("x", 4, TS), 1).unwrap();
    let o = strand(&["queue", "describe", "orders", "--output", "json"], &addr);
    assert!(o.status.success(), "{}", stderr(&o));
    let d: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(d["retention_ms"], 12 * 3600 * 1000);
    assert_eq!(d["partitions"][1]["log_end"], 4);
    let o = strand(&["queue", "describe", "orders"], &addr);
    assert!(stdout(&o).contains("LOG_END"), "a table for people");

    let o = strand(&["queue", "alter", "orders", "--partitions", "5"], &addr);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = strand(&["queue", "list"], &addr);
    assert!(
        stdout(&o)
            .lines()
            .any(|l| l.starts_with("orders") && l.trim_end().ends_with('5')),
        "{}",
        stdout(&o)
    );

    // Errors: non-zero exit and one line on stderr.
    for (args, needle) in [
        (vec!["queue", "create", "bad/name"], "name"),
        (vec!["queue", "describe", "missing"], "does not exist"),
        (vec!["queue", "alter", "orders", "--partitions", "2"], "only grow"),
        (vec!["queue", "create", "x", "--retention", "3 weeks"], "duration"),
    ] {
        let o = strand(&args, &addr);
        assert!(!o.status.success(), "{args:?} should fail");
        let err = stderr(&o);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let o = strand(&["queue", "list"], "127.0.0.1:1");
    assert!(!o.status.success(), "no broker there");

    let o = strand(&["queue", "delete", "orders"], &addr);
    assert!(o.status.success());
    assert!(!dir.path().join("orders").exists());
}

/// Runs `strand` with `input` on stdin.
fn strand_stdin(args: &[&str], brokers: &str, input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(args)
        .env("STRAND_BROKERS", brokers)
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running strand");
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let input = input.to_vec();
    // Write from a thread: the child may exit (or fill its pipes) first.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().expect("waiting for strand");
    writer.join().expect("stdin writer");
    out
}

#[test]
fn produce_and_consume_thousands_of_keyed_lines() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let addr = broker.addr.to_string();
    let o = strand(&["queue", "create", "lines", "--partitions", "4"], &addr);
    assert!(o.status.success(), "{}", stderr(&o));

    let (keys, per_key) = (37, 100);
    let mut input = String::new();
    for i in 0..per_key {
        for k in 0..keys {
            input.push_str(&format!("user-{k}|{i} payload with spaces, commas and | bars\n"));
        }
    }
    let o = strand_stdin(
        &["produce", "lines", "--key-separator", "|", "--linger-ms", "2"],
        &addr,
        input.as_bytes(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o).trim(), format!("produced {}", keys * per_key));

    let total = (keys * per_key).to_string();
    let o = strand(
        &[
            "consume",
            "lines",
            "--from",
            "earliest",
            "--format",
            "json",
            "--max",
            &total,
            "--idle-exit-ms",
            "10000",
        ],
        &addr,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let mut per_key_seqs: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
    let mut partition_of: std::collections::HashMap<String, u64> = Default::default();
    for line in stdout(&o).lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        for field in ["queue", "partition", "offset", "key", "value", "timestamp_ms"] {
            assert!(v.get(field).is_some(), "{field} missing in {line}");
        }
        assert_eq!(v["queue"], "lines");
        let key = v["key"].as_str().unwrap().to_string();
        let value = v["value"].as_str().unwrap();
        let (seq, rest) = value.split_once(' ').unwrap();
        assert_eq!(rest, "payload with spaces, commas and | bars");
        let p = v["partition"].as_u64().unwrap();
        assert_eq!(
            *partition_of.entry(key.clone()).or_insert(p),
            p,
            "{key} moved partition"
        );
        per_key_seqs.entry(key).or_default().push(seq.parse().unwrap());
    }
    assert_eq!(per_key_seqs.len(), keys);
    for (key, seqs) in per_key_seqs {
        assert_eq!(
            seqs,
            (0..per_key).collect::<Vec<_>>(),
            "{key}: out of order or incomplete"
        );
    }

    // Values only, with --max; keyless lines; an idle exit when nothing comes.
    let o = strand_stdin(&["produce", "lines", "--acks", "1"], &addr, b"plain one\nplain two\r\n");
    assert!(o.status.success(), "{}", stderr(&o));
    let o = strand(
        &["consume", "lines", "--from", "latest", "--idle-exit-ms", "300"],
        &addr,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "");
}

#[test]
fn produce_and_consume_refuse_bad_input_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let addr = broker.addr.to_string();
    assert!(strand(&["queue", "create", "q"], &addr).status.success());

    for (args, needle) in [
        (vec!["produce", "missing"], "does not exist"),
        (vec!["produce", "bad/name"], "name"),
        (vec!["consume", "missing", "--idle-exit-ms", "100"], "does not exist"),
        (vec!["consume", "bad/name", "--idle-exit-ms", "100"], "name"),
        (vec!["consume", "q", "--from", "yesterday"], "--from"),
        (vec!["consume", "q", "--format", "xml"], "--format"),
        (vec!["produce", "q", "--acks", "2"], "--acks"),
    ] {
        let o = strand_stdin(&args, &addr, b"hello\n");
        assert!(!o.status.success(), "{args:?} should fail");
        let err = stderr(&o);
        let last = err.trim().lines().last().unwrap_or_default().to_string();
        assert!(last.starts_with("strand: ") && last.contains(needle), "{args:?}: {err}");
    }

    // A 64 MiB line is refused with a clear error; the lines around it go,
    // and the broker keeps serving.
    let mut input = b"before\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', 64 << 20));
    input.extend_from_slice(b"\nafter\n");
    let o = strand_stdin(&["produce", "q"], &addr, &input);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("produced 2"), "{err}");
    assert!(err.contains("line 2") && err.contains("MessageTooLarge"), "{err}");
    let o = strand(
        &[
            "consume",
            "q",
            "--from",
            "earliest",
            "--max",
            "2",
            "--idle-exit-ms",
            "5000",
        ],
        &addr,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "before\nafter\n");
}
