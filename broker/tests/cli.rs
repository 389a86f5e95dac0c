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
