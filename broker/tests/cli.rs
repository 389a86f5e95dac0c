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
    assert_eq!(d["min_insync_replicas"], 1, "one replica: acks=all needs the leader");
    assert_eq!(d["partitions"][1]["log_end"], 4);
    assert_eq!(
        (&d["partitions"][1]["replicas"], &d["partitions"][1]["isr"]),
        (&serde_json::json!([1]), &serde_json::json!([1]))
    );
    assert_eq!(d["partitions"][1]["leader_epoch"], 0);
    let o = strand(&["queue", "describe", "orders"], &addr);
    assert!(stdout(&o).contains("LOG_END"), "a table for people");

    // One node: it leads the controller and every partition.
    let o = strand(&["cluster", "status", "--output", "json"], &addr);
    assert!(o.status.success(), "{}", stderr(&o));
    let status: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(
        status,
        serde_json::json!({"controller": 1, "offline_partitions": 0, "brokers": [
            {"id": 1, "address": addr, "alive": true, "leaders": 3, "replicas": 3, "under_replicated": 0}
        ]})
    );
    let o = strand(&["cluster", "status"], &addr);
    assert!(stdout(&o).contains("controller leader: 1"), "{}", stdout(&o));

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
        (
            vec!["queue", "create", "x", "--min-insync-replicas", "2"],
            "above the replication factor",
        ),
        (
            vec!["queue", "alter", "orders", "--min-insync-replicas", "3"],
            "above the replication factor",
        ),
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

/// `strand` with stdout a pipe whose reader is already gone (as when
/// piped into `head -1` that has read its line): EPIPE on the first write.
fn strand_into_closed_pipe(args: &[&str], brokers: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(args)
        .env("STRAND_BROKERS", brokers)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running strand");
    drop(child.stdout.take());
    child.wait_with_output().expect("waiting for strand")
}

/// The queue commands as a new user meets them: bad values refused, every
/// setting settable at create and by alter, values shown as people write
/// them, the broker's own queues out of the way, and output into a closed
/// pipe ending quietly.
#[test]
fn queue_settings_and_output_for_people() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let addr = broker.addr.to_string();
    for (args, says) in [
        (vec!["queue", "create", "x", "--partitions", "0"], "--partitions"),
        (
            vec!["queue", "create", "x", "--max-message-bytes", "5GiB"],
            "below 4 GiB",
        ),
        (vec!["queue", "create", "x", "--fsync", "sometimes"], "--fsync"),
    ] {
        let o = strand(&args, &addr);
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    let o = strand(&["queue", "list", "--output", "json"], &addr);
    assert_eq!(stdout(&o).trim(), "[]", "x was not created");

    let o = strand(
        &[
            "queue",
            "create",
            "orders",
            "--partitions",
            "2",
            "--retention-bytes",
            "10GiB",
            "--fsync",
            "interval",
            "--max-message-bytes",
            "64KiB",
        ],
        &addr,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let describe = |addr: &str| -> serde_json::Value {
        let o = strand(&["queue", "describe", "orders", "--output", "json"], addr);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str(stdout(&o).trim()).unwrap()
    };
    let d = describe(&addr);
    assert_eq!(d["retention_bytes"], 10u64 << 30);
    assert_eq!(d["max_message_bytes"], 64 << 10);
    assert!(d["fsync"].as_str().unwrap().starts_with("interval"), "{d}");
    let o = strand(&["queue", "describe", "orders"], &addr);
    let text = stdout(&o);
    for line in [
        "retention              7d",
        "retention bytes        10GiB",
        "max message bytes      64KiB",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }

    let o = strand(&["queue", "alter", "orders"], &addr);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("nothing to change"), "{}", stderr(&o));
    let o = strand(
        &[
            "queue",
            "alter",
            "orders",
            "--retention-bytes",
            "unlimited",
            "--retention",
            "forever",
            "--fsync",
            "always",
            "--max-message-bytes",
            "2MiB",
        ],
        &addr,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let d = describe(&addr);
    assert_eq!(
        (d["retention_bytes"].as_i64(), d["retention_ms"].as_i64()),
        (Some(-1), Some(-1))
    );
    assert_eq!(
        (d["fsync"].as_str(), d["max_message_bytes"].as_u64()),
        (Some("always"), Some(2 << 20))
    );
    let text = stdout(&strand(&["queue", "describe", "orders"], &addr));
    assert!(
        text.contains("retention              forever") && text.contains("unlimited"),
        "{text}"
    );

    // A group makes __groups: listed only with --all.
    let o = strand(&["consume", "orders", "--group", "g", "--idle-exit-ms", "200"], &addr);
    assert!(o.status.success(), "{}", stderr(&o));
    let names = |args: &[&str]| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(stdout(&strand(args, &addr)).trim()).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|q| q["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&["queue", "list", "--output", "json"]), ["orders"]);
    assert_eq!(
        names(&["queue", "list", "--all", "--output", "json"]),
        ["__groups", "orders"]
    );

    // Output into a pipe nobody reads any more: exit 0, no panic.
    for args in [
        &["queue", "list"][..],
        &["queue", "describe", "orders"],
        &["group", "describe", "g"],
        &["group", "list"],
        &["dlq", "list", "orders"],
    ] {
        let o = strand_into_closed_pipe(args, &addr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).is_empty(), "{args:?}: {}", stderr(&o));
    }
}

/// Mistakes a new user makes, each answered with what went wrong.
#[test]
fn clear_answers_to_first_hour_mistakes() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let addr = broker.addr.to_string();
    assert!(strand(&["queue", "create", "q", "--partitions", "2"], &addr)
        .status
        .success());
    let o = strand_stdin(
        &["produce", "q", "--key-separator", ":"],
        &addr,
        b"a:1\nb:2\nc:3\nd:4\ne:5\n",
    );
    assert!(o.status.success(), "{}", stderr(&o));

    // Past the end: an error naming the range, not a replay from 0.
    let o = strand(&["consume", "q", "--from", "offset:50", "--max", "1"], &addr);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("OffsetOutOfRange") && err.contains("offset 50 is outside q/"),
        "{err}"
    );
    assert!(err.contains("(offsets 0 to "), "{err}");

    // The dead-letter queue before anything was dead-lettered.
    let o = strand(&["dlq", "list", "q", "--output", "json"], &addr);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "[]");
    let o = strand(&["dlq", "list", "q"], &addr);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 1, "a header, no rows");
    let o = strand(&["dlq", "list", "missing"], &addr);
    assert!(!o.status.success() && stdout(&o).is_empty());
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
    let o = strand(&["dlq", "replay", "q"], &addr);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "replayed 0");

    // A partition that does not exist is named.
    let o = strand(
        &["consume", "q", "--group", "g", "--from", "earliest", "--max", "5"],
        &addr,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = strand(
        &[
            "group",
            "reset",
            "g",
            "--queue",
            "q",
            "--partitions",
            "0,99",
            "--to",
            "earliest",
        ],
        &addr,
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("partition 99 does not exist"), "{}", stderr(&o));

    // The metrics port is not the client port.
    let o = strand(&["queue", "list"], &broker.metrics.to_string());
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("answered with HTTP: is it the metrics port?"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// Every argument and flag of every command has help text.
#[test]
fn every_argument_is_explained() {
    fn undocumented(path: &str) -> Vec<String> {
        let out = Command::new(env!("CARGO_BIN_EXE_strand"))
            .args(path.split_whitespace())
            .arg("--help")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout).to_string();
        let mut missing = Vec::new();
        let mut section = "";
        let lines: Vec<&str> = help.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.ends_with(':') && !line.starts_with(' ') {
                section = line;
                continue;
            }
            // An entry is `  -x, --name <V>  text`, `      --name  text` or
            // `  <NAME>  text`; deeper lines are the text of the one above.
            let entry = line.trim_start();
            let indent = line.len() - entry.len();
            let is_entry = (indent == 2 || indent == 6) && (entry.starts_with('-') || entry.starts_with('<'));
            if !(section == "Arguments:" || section == "Options:") || !is_entry {
                continue;
            }
            // `  -h, --help  Print help`: the name, two spaces, the text; a
            // name alone on its line has its text on the next.
            let has_text = entry.contains("  ") || lines.get(i + 1).is_some_and(|n| n.starts_with("          "));
            if !has_text {
                missing.push(format!("{path}: {entry}"));
            }
        }
        missing
    }
    let mut missing = Vec::new();
    for path in [
        "serve",
        "queue create",
        "queue list",
        "queue describe",
        "queue alter",
        "queue delete",
        "produce",
        "consume",
        "group list",
        "group describe",
        "group reset",
        "group delete",
        "dlq list",
        "dlq replay",
        "top",
    ] {
        missing.extend(undocumented(path));
    }
    assert!(missing.is_empty(), "arguments without help: {missing:#?}");
    let serve = Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&serve.stdout);
    assert!(!text.contains("once the metrics land"), "{text}");
}

/// `strand tune` reads and writes the host under `--root`: a fake tree
/// here, with what a broker needs and one setting to change.
#[test]
fn tune_checks_applies_and_scripts_against_a_root() {
    let root = tempfile::tempdir().unwrap();
    let put = |path: &str, value: &str| {
        let file = root.path().join(path.trim_start_matches('/'));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, value).unwrap();
    };
    put("/proc/sys/kernel/osrelease", "6.1.0-18-amd64");
    put(
        "/proc/self/limits",
        "Max open files 1048576 1048576 files\nMax locked memory unlimited unlimited bytes\n",
    );
    put("/sys/devices/system/cpu/online", "0-3");
    put("/proc/sys/vm/swappiness", "60");
    let tune = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_strand"))
            .arg("tune")
            .args(args)
            .args(["--cores", "2", "--data-dir", "/var/lib/strand"])
            .arg("--root")
            .arg(root.path())
            .output()
            .unwrap()
    };
    let check = tune(&["check", "--output", "json"]);
    assert!(check.status.success(), "{}{}", stdout(&check), stderr(&check));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&check)).unwrap();
    let row = |doc: &serde_json::Value, name: &str| {
        doc["tuners"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {doc}"))
    };
    assert_eq!(row(&doc, "swappiness")["pass"], false);
    assert_eq!(row(&doc, "cpu_cores")["current"], "2 shard(s); CPUs online: 0-3 (4)");
    assert_eq!(doc["required_failed"], false);

    let script = tune(&["script"]);
    assert!(
        stdout(&script).contains("/proc/sys/vm/swappiness"),
        "{}",
        stdout(&script)
    );
    assert_eq!(
        std::fs::read_to_string(root.path().join("proc/sys/vm/swappiness")).unwrap(),
        "60"
    );

    let apply = tune(&["apply", "--output", "json"]);
    assert!(apply.status.success(), "{}{}", stdout(&apply), stderr(&apply));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&apply)).unwrap();
    assert_eq!(row(&doc, "swappiness")["outcome"], "changed");
    assert_eq!(row(&doc, "swappiness")["pass"], true);
    assert_eq!(
        std::fs::read_to_string(root.path().join("proc/sys/vm/swappiness")).unwrap(),
        "1"
    );

    // A required tuner failing (more shards than CPUs) is exit 1; a root
    // that is not a directory, exit 2.
    put("/sys/devices/system/cpu/online", "0");
    let check = tune(&["check"]);
    assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
    assert!(stdout(&check).contains("FAIL  cpu_cores"), "{}", stdout(&check));
    let bad = Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["tune", "check", "--root", "/no/such/dir"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("--root /no/such/dir: not a directory"),
        "{}",
        stderr(&bad)
    );
}
