//! Three brokers with TLS and SCRAM together (issue 42's first test): the
//! CLI and the Rust client log in over TLS; a wrong password is
//! `AuthenticationFailed` and a user without ACLs `NotAuthorized`; and
//! every broker's certificate is rotated by SIGHUP, one after another,
//! while a producer sends acks=all records through all three: no produce
//! fails and every acknowledged record is read back.
//!
//! Its own test binary: it sets the Rust client's process-wide TLS and
//! login defaults.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::cluster::{assert_none_failed_none_lost, produce_keyed_until, Cluster};
use common::pki::{Pki, FRESH};
use common::{failed, ok, until_ok};

const INTER_BROKER: &str = "broker-secret-2";
const BOOTSTRAP: &str = "admin-secret-2";
const ALICE: &str = "alice-secret-2";

/// `strand ARGS --brokers ADDR --tls-ca CA`, logged in as `user` with
/// `password`, `stdin` on its standard input.
fn strand(addr: &str, ca: &std::path::Path, (user, password): (&str, &str), args: &[&str], stdin: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_strand"));
    command
        .args(args)
        .args(["--brokers", addr])
        .arg("--tls-ca")
        .arg(ca)
        .env("STRAND_PASSWORD", password)
        .env_remove("STRAND_TLS_CA")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // `strand acl`'s --user names the entry's user: it logs in as
    // $STRAND_USER.
    match args.first() {
        Some(&"acl") => command.env("STRAND_USER", user),
        _ => command.env_remove("STRAND_USER").args(["--user", user]),
    };
    let mut child = command.spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn three_brokers_with_tls_and_scram_rotate_certificates_under_load_and_lose_nothing() {
    let pki = Pki::new();
    let ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];
    pki.ca("ca", &[("broker", &ips, FRESH)]);
    pki.ca("next", &[("renewed", &ips, FRESH)]);
    // Clients and brokers trust both CAs through the rotation.
    let both = pki.write(
        "both.pem",
        &(std::fs::read_to_string(pki.path("ca.pem")).unwrap()
            + &std::fs::read_to_string(pki.path("next.pem")).unwrap()),
    );
    let settings = format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\ntls_ca = \"{}\"\nauth = \"scram\"\nsuperusers = [\"admin\"]\n",
        pki.path("broker.pem").display(),
        pki.path("broker.key").display(),
        both.display()
    );
    let cluster = Cluster::start_with_env(
        3,
        &settings,
        &[
            ("STRAND_INTER_BROKER_PASSWORD", INTER_BROKER),
            ("STRAND_BOOTSTRAP_PASSWORD", BOOTSTRAP),
        ],
    );
    let addr = |id: u8| cluster.addr(id).to_string();
    let admin = ("admin", BOOTSTRAP);
    until_ok(Duration::from_secs(30), Duration::from_millis(200), || {
        strand(&addr(1), &both, admin, &["queue", "list"], "")
    });
    ok(&strand(
        &addr(2),
        &both,
        admin,
        &[
            "queue",
            "create",
            "rot",
            "--partitions",
            "3",
            "--replication-factor",
            "3",
        ],
        "",
    ));
    ok(&strand(
        &addr(3),
        &both,
        admin,
        &["user", "create", "alice"],
        &format!("{ALICE}\n"),
    ));
    ok(&strand(
        &addr(3),
        &both,
        admin,
        &["user", "create", "bob"],
        "bob-secret\n",
    ));
    for op in ["produce", "consume"] {
        ok(&strand(
            &addr(1),
            &both,
            admin,
            &["acl", "add", "--user", "alice", "--operation", op, "--queue", "rot"],
            "",
        ));
    }
    // The CLI round trip as alice, once her ACLs reached the node.
    until_ok(Duration::from_secs(5), Duration::from_millis(50), || {
        strand(
            &addr(2),
            &both,
            ("alice", ALICE),
            &["produce", "rot", "--acks", "all"],
            "cli\n",
        )
    });
    let read = ok(&strand(
        &addr(3),
        &both,
        ("alice", ALICE),
        &["consume", "rot", "--from", "earliest", "--idle-exit-ms", "2000"],
        "",
    ));
    assert!(read.lines().any(|l| l == "cli"), "{read}");
    let wrong = failed(&strand(&addr(1), &both, ("alice", "not-hers"), &["queue", "list"], ""));
    assert!(wrong.contains("AuthenticationFailed"), "{wrong}");
    let denied = failed(&strand(
        &addr(1),
        &both,
        ("bob", "bob-secret"),
        &["produce", "rot"],
        "x\n",
    ));
    assert!(denied.contains("NotAuthorized") && denied.contains("bob"), "{denied}");

    // The Rust client, as alice over TLS: acks=all records through every
    // node while each broker's certificate is replaced and reloaded.
    let config = strand_client::tls::TlsFiles {
        ca: Some(both.clone()),
        ..Default::default()
    };
    config.install().unwrap();
    strand_client::sasl::set_default(Some(strand_client::sasl::Credentials::new("alice", ALICE)));
    let stop = Arc::new(AtomicBool::new(false));
    let producer = produce_keyed_until(&cluster, "rot", stop.clone());
    std::thread::sleep(Duration::from_secs(2));
    std::fs::copy(pki.path("renewed.pem"), pki.path("broker.pem")).unwrap();
    std::fs::copy(pki.path("renewed.key"), pki.path("broker.key")).unwrap();
    let next = pki.path("next.pem");
    for id in 1..=3u8 {
        cluster.node(id).signal(libc::SIGHUP);
        // New connections get the renewed certificate (only the next CA
        // trusted: the old one would fail).
        until_ok(Duration::from_secs(10), Duration::from_millis(100), || {
            strand(&addr(id), &next, admin, &["queue", "list"], "")
        });
        std::thread::sleep(Duration::from_secs(1));
    }
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::SeqCst);
    let produced = producer.join().unwrap();
    assert_none_failed_none_lost(&cluster, 1, "rot", produced, Default::default());
}
