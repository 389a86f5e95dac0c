//! TLS from outside (issue 42): the `strand` CLI against brokers started
//! with `--tls-cert/--tls-key`, one node and three (the links between
//! brokers then run TLS too); plaintext and TLS clients on the wrong
//! listener told so; mTLS; bad files refused at start in one line; a
//! certificate rotated by SIGHUP.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::cluster::Cluster;
use common::pki::{Pki, FRESH};
use common::{failed, ok, serve_command, until_ok, Broker};
use std::time::Duration;

/// `strand ARGS --brokers ADDR` with `tls` flags.
fn strand(addr: &str, args: &[&str], tls: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(args)
        .args(["--brokers", addr])
        .args(tls)
        .env_remove("STRAND_TLS_CA")
        .output()
        .unwrap()
}

/// `strand produce QUEUE --acks all` of `lines` on its stdin, which must
/// succeed.
fn produce(addr: &str, queue: &str, lines: &str, tls: &[&str]) {
    use std::io::Write;
    let mut producing = Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["produce", queue, "--acks", "all", "--brokers", addr])
        .args(tls)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    producing.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
    ok(&producing.wait_with_output().unwrap());
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn tls_broker(pki: &Pki, data: &Path, extra: &[&str]) -> Broker {
    let (cert, key, ca) = (pki.path("broker.pem"), pki.path("broker.key"), pki.path("ca.pem"));
    let mut args = vec![
        "--tls-cert",
        s(&cert),
        "--tls-key",
        s(&key),
        "--tls-ca",
        s(&ca),
        "--cores",
        "1",
    ];
    args.extend_from_slice(extra);
    Broker::start_with(data, &args)
}

#[test]
fn the_cli_talks_tls_and_wrong_clients_are_told_why() {
    let pki = Pki::new();
    pki.ca("ca", &[("broker", &["127.0.0.1"], FRESH)]);
    pki.ca("other", &[]);
    let data = pki.path("data");
    let broker = tls_broker(&pki, &data, &[]);
    let addr = broker.addr.to_string();
    let ca = pki.path("ca.pem");
    let tls = ["--tls-ca", s(&ca)];
    ok(&strand(
        &addr,
        &["queue", "create", "secret", "--partitions", "1"],
        &tls,
    ));
    produce(&addr, "secret", "one\ntwo\nthree\n", &tls);
    let read = ok(&strand(
        &addr,
        &["consume", "secret", "--from", "earliest", "--max", "3"],
        &tls,
    ));
    assert_eq!(read.lines().collect::<Vec<_>>(), ["one", "two", "three"], "{read}");
    // A record larger than a TLS record (and than rustls's default
    // buffer): 300 KiB each way.
    let large = "x".repeat(300 << 10);
    produce(&addr, "secret", &format!("{large}\n"), &tls);
    let read = ok(&strand(
        &addr,
        &["consume", "secret", "--from", "offset:3", "--max", "1"],
        &tls,
    ));
    assert_eq!(read.trim_end().len(), large.len());
    // The same CA by environment.
    let by_env = Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["queue", "list", "--brokers", &addr])
        .env("STRAND_TLS_CA", &ca)
        .output()
        .unwrap();
    assert!(ok(&by_env).contains("secret"));
    // Plaintext to a TLS listener: told, not left hanging.
    let plain = failed(&strand(&addr, &["queue", "list"], &[]));
    eprintln!("plain: {plain}");
    assert!(plain.contains("TLS"), "{plain}");
    // A CA that did not sign the broker's certificate.
    let other = pki.path("other.pem");
    let wrong = failed(&strand(&addr, &["queue", "list"], &["--tls-ca", s(&other)]));
    eprintln!("wrong: {wrong}");
    assert!(
        wrong.contains("TLS") && wrong.to_lowercase().contains("certificate"),
        "{wrong}"
    );
    // TLS to a plaintext listener.
    let plain_data = pki.path("plain");
    let plain_broker = Broker::start_with(&plain_data, &["--cores", "1"]);
    let to_plain = failed(&strand(&plain_broker.addr.to_string(), &["queue", "list"], &tls));
    eprintln!("to_plain: {to_plain}");
    assert!(to_plain.contains("does it listen with TLS"), "{to_plain}");
}

#[test]
fn client_certificates_are_required_with_a_client_ca() {
    let pki = Pki::new();
    pki.ca("ca", &[("broker", &["127.0.0.1"], FRESH), ("alice", &[], FRESH)]);
    pki.ca("other", &[("mallory", &[], FRESH)]);
    let data = pki.path("data");
    let client_ca = pki.path("ca.pem");
    let broker = tls_broker(&pki, &data, &["--tls-client-ca", s(&client_ca)]);
    let addr = broker.addr.to_string();
    let ca = pki.path("ca.pem");
    let without = failed(&strand(&addr, &["queue", "list"], &["--tls-ca", s(&ca)]));
    eprintln!("without: {without}");
    assert!(without.contains("TLS"), "{without}");
    let (alice, alice_key) = (pki.path("alice.pem"), pki.path("alice.key"));
    let with = ["--tls-ca", s(&ca), "--tls-cert", s(&alice), "--tls-key", s(&alice_key)];
    ok(&strand(&addr, &["queue", "create", "m", "--partitions", "1"], &with));
    let (mallory, mallory_key) = (pki.path("mallory.pem"), pki.path("mallory.key"));
    let stranger = [
        "--tls-ca",
        s(&ca),
        "--tls-cert",
        s(&mallory),
        "--tls-key",
        s(&mallory_key),
    ];
    let refused = failed(&strand(&addr, &["queue", "list"], &stranger));
    eprintln!("refused: {refused}");
    assert!(refused.contains("TLS"), "{refused}");
}

#[test]
fn bad_certificate_files_are_refused_at_start_in_one_line() {
    let pki = Pki::new();
    pki.ca(
        "ca",
        &[
            ("broker", &["127.0.0.1"], FRESH),
            ("other", &["127.0.0.1"], FRESH),
            ("expired", &["127.0.0.1"], (-30, -1)),
        ],
    );
    let refusal = |cert: &str, key: &str| -> String {
        let mut command = serve_command("127.0.0.1:0", &["--cores", "1"]);
        command
            .arg("--data-dir")
            .arg(pki.path(&format!("data-{cert}-{key}")))
            .args(["--tls-cert", s(&pki.path(cert)), "--tls-key", s(&pki.path(key))])
            .args(["--tls-ca", s(&pki.path("ca.pem"))]);
        let out = command.output().unwrap();
        assert!(!out.status.success(), "started with {cert} and {key}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let mismatched = refusal("broker.pem", "other.key");
    eprintln!("mismatched: {mismatched}");
    assert!(
        mismatched.contains("other.key") && mismatched.contains("broker.pem"),
        "{mismatched}"
    );
    let expired = refusal("expired.pem", "expired.key");
    eprintln!("expired: {expired}");
    assert!(
        expired.contains("expired.pem") && expired.contains("expired"),
        "{expired}"
    );
    let missing = refusal("missing.pem", "broker.key");
    eprintln!("missing: {missing}");
    assert!(missing.contains("missing.pem"), "{missing}");
}

#[test]
fn a_certificate_rotated_by_sighup_is_served_to_new_connections() {
    let pki = Pki::new();
    pki.ca("ca", &[("broker", &["127.0.0.1"], FRESH)]);
    pki.ca("next", &[("rotated", &["127.0.0.1"], FRESH)]);
    let data = pki.path("data");
    let broker = tls_broker(&pki, &data, &[]);
    let addr = broker.addr.to_string();
    let next = pki.path("next.pem");
    // Before: the certificate of the first CA only.
    failed(&strand(&addr, &["queue", "list"], &["--tls-ca", s(&next)]));
    std::fs::copy(pki.path("rotated.pem"), pki.path("broker.pem")).unwrap();
    std::fs::copy(pki.path("rotated.key"), pki.path("broker.key")).unwrap();
    broker.signal(libc::SIGHUP);
    until_ok(Duration::from_secs(10), Duration::from_millis(100), || {
        strand(&addr, &["queue", "list"], &["--tls-ca", s(&next)])
    });
}

#[test]
fn three_brokers_replicate_and_elect_over_tls() {
    let pki = Pki::new();
    pki.ca("ca", &[("broker", &["127.0.0.1", "127.0.0.2", "127.0.0.3"], FRESH)]);
    let settings = format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\ntls_ca = \"{}\"\n",
        pki.path("broker.pem").display(),
        pki.path("broker.key").display(),
        pki.path("ca.pem").display()
    );
    let cluster = Cluster::start_with(3, &settings);
    let ca = pki.path("ca.pem");
    let tls = ["--tls-ca", s(&ca)];
    let addr = cluster.addr(2).to_string();
    ok(&strand(
        &addr,
        &["queue", "create", "r", "--partitions", "2", "--replication-factor", "3"],
        &tls,
    ));
    let lines: String = (0..50).map(|i| format!("record-{i}\n")).collect();
    produce(&addr, "r", &lines, &tls);
    // acks=all over RF 3 went through the followers' TLS links; every
    // node's view of the queue says all three are in sync.
    let described = ok(&strand(
        &cluster.addr(3).to_string(),
        &["queue", "describe", "r", "--output", "json"],
        &tls,
    ));
    let v: serde_json::Value = serde_json::from_str(&described).unwrap();
    for p in v["partitions"].as_array().unwrap() {
        assert_eq!(p["isr"].as_array().unwrap().len(), 3, "{described}");
    }
}

/// `systemctl reload` (SIGHUP) never stops a broker, TLS or not.
#[test]
fn a_broker_without_tls_takes_sighup_and_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(&dir.path().join("data"), &["--cores", "1"]);
    broker.signal(libc::SIGHUP);
    std::thread::sleep(std::time::Duration::from_millis(300));
    ok(&strand(&broker.addr.to_string(), &["queue", "list"], &[]));
}

/// `--auth mtls`: a client certificate's subject CN is the user, and the
/// brokers' certificates name the inter-broker user, so three brokers
/// replicate over links only they may use; ACLs apply to certificate
/// users as to SCRAM ones.
#[test]
fn with_mtls_the_certificate_names_the_user_and_acls_apply() {
    let pki = Pki::new();
    pki.ca(
        "ca",
        &[
            ("strand-broker.1", &["127.0.0.1"], FRESH),
            ("strand-broker.2", &["127.0.0.2"], FRESH),
            ("strand-broker.3", &["127.0.0.3"], FRESH),
            ("admin", &[], FRESH),
            ("alice", &[], FRESH),
        ],
    );
    let settings = format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\ntls_client_ca = \"{}\"\nauth = \"mtls\"\nsuperusers = [\"admin\"]\n",
        pki.path("strand-broker.{node}.pem").display(),
        pki.path("strand-broker.{node}.key").display(),
        pki.path("ca.pem").display()
    );
    let cluster = Cluster::start_with(3, &settings);
    let ca = pki.path("ca.pem");
    let (admin, admin_key) = (pki.path("admin.pem"), pki.path("admin.key"));
    let (alice, alice_key) = (pki.path("alice.pem"), pki.path("alice.key"));
    let as_admin = ["--tls-ca", s(&ca), "--tls-cert", s(&admin), "--tls-key", s(&admin_key)];
    let as_alice = ["--tls-ca", s(&ca), "--tls-cert", s(&alice), "--tls-key", s(&alice_key)];
    let addr = |id: u8| cluster.addr(id).to_string();
    ok(&strand(
        &addr(2),
        &["queue", "create", "m", "--partitions", "1", "--replication-factor", "3"],
        &as_admin,
    ));
    // acks=all over RF 3: the followers' fetches went through as brokers.
    produce(&addr(1), "m", "one\n", &as_admin);
    let refused = failed(&strand(&addr(3), &["queue", "delete", "m"], &as_alice));
    assert!(
        refused.contains("NotAuthorized") && refused.contains("alice"),
        "{refused}"
    );
    ok(&strand(
        &addr(1),
        &["acl", "add", "--user", "alice", "--operation", "delete", "--queue", "m"],
        &as_admin,
    ));
    until_ok(Duration::from_secs(5), Duration::from_millis(50), || {
        strand(&addr(3), &["queue", "delete", "m"], &as_alice)
    });
    // A login by password is not how this broker names users.
    let scram = Command::new(env!("CARGO_BIN_EXE_strand"))
        .args(["queue", "list", "--brokers", &addr(1), "--user", "admin"])
        .args(as_admin)
        .env("STRAND_PASSWORD", "x")
        .output()
        .unwrap();
    assert!(failed(&scram).contains("certificate"));
}

/// With `--auth mtls` a broker whose certificate does not carry its own
/// login name (`<inter_broker_user>.<node_id>`) is refused at start (the
/// others would take it for a user, or for another broker), in one line
/// naming the file: a user's name, the bare inter-broker user, another
/// node's.
#[test]
fn with_mtls_a_broker_certificate_must_name_the_broker_and_its_node() {
    let pki = Pki::new();
    let names = ["broker", "strand-broker", "strand-broker.2"];
    let leaves: Vec<(&str, &[&str], (i64, i64))> = names.iter().map(|n| (*n, &["127.0.0.1"][..], FRESH)).collect();
    pki.ca("ca", &leaves);
    for name in names {
        let (cert, key, ca) = (
            pki.path(&format!("{name}.pem")),
            pki.path(&format!("{name}.key")),
            pki.path("ca.pem"),
        );
        let out = serve_command("127.0.0.1:0", &["--cores", "1", "--auth", "mtls", "--node-id", "1"])
            .args(["--tls-cert", s(&cert), "--tls-key", s(&key), "--tls-client-ca", s(&ca)])
            .arg("--data-dir")
            .arg(pki.path("data"))
            .output()
            .unwrap();
        let refused = failed(&out);
        assert!(
            refused.contains(&format!("{name}.pem"))
                && refused.contains(&format!("\"{name}\""))
                && refused.contains("\"strand-broker.1\""),
            "{refused}"
        );
    }
}

/// `GET path` on the metrics endpoint over TLS (trusting `ca`), with
/// `login` as basic auth: the status and the body.
fn https_get(addr: std::net::SocketAddr, ca: &Path, path: &str, login: Option<(&str, &str)>) -> (u16, String) {
    use base64::Engine;
    use std::io::{Read, Write};
    let files = strand_client::tls::TlsFiles {
        ca: Some(ca.to_path_buf()),
        cert: None,
        key: None,
    };
    let config = files.client_config().unwrap().unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let auth = login.map_or(String::new(), |(u, p)| {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
        format!("Authorization: Basic {token}\r\n")
    });
    write!(tls, "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n").unwrap();
    let mut text = String::new();
    let _ = tls.read_to_string(&mut text);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

/// [`https_get`], again while the endpoint says its password checks are
/// busy (429: at most a tenth of shard 0's time goes to them).
fn https_get_checked(addr: std::net::SocketAddr, ca: &Path, path: &str, login: Option<(&str, &str)>) -> (u16, String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, text) = https_get(addr, ca, path, login);
        if status != 429 || std::time::Instant::now() > deadline {
            return (status, text);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The metrics endpoint with `metrics_tls` and `metrics_basic_auth`: TLS
/// with the listener's certificate; `/metrics` only for a cluster user that
/// is a superuser or allowed describe on the cluster (401 without a login
/// or with a wrong password, 403 for another user); `/health` open.
#[test]
fn the_metrics_endpoint_takes_tls_and_basic_auth() {
    let pki = Pki::new();
    pki.ca("ca", &[("broker", &["127.0.0.1"], FRESH)]);
    let ca = pki.path("ca.pem");
    let settings = pki.write(
        "broker.toml",
        &format!(
            "tls_cert = \"{}\"\ntls_key = \"{}\"\ntls_ca = \"{}\"\nauth = \"scram\"\nsuperusers = [\"admin\"]\n\
             metrics_tls = true\nmetrics_basic_auth = true\n",
            pki.path("broker.pem").display(),
            pki.path("broker.key").display(),
            ca.display()
        ),
    );
    let mut command = serve_command("127.0.0.1:0", &["--cores", "1", "--config", s(&settings)]);
    command
        .arg("--data-dir")
        .arg(pki.path("data"))
        .env("STRAND_INTER_BROKER_PASSWORD", "brokers")
        .env("STRAND_BOOTSTRAP_PASSWORD", "admin-pw");
    let broker = Broker::spawn(command, &pki.path("data"));
    let metrics = broker.metrics;
    assert_eq!(https_get(metrics, &ca, "/health", None).0, 200);
    let (status, text) = https_get(metrics, &ca, "/metrics", None);
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("WWW-Authenticate: Basic"), "{text}");
    // The first superuser exists once the broker bootstrapped it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, text) = https_get_checked(metrics, &ca, "/metrics", Some(("admin", "admin-pw")));
        if status == 200 {
            assert!(text.contains("strand_connections"), "{text}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{status}: {text}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(
        https_get_checked(metrics, &ca, "/metrics", Some(("admin", "wrong"))).0,
        401
    );
    // Another user: forbidden until allowed describe on the cluster.
    let addr = broker.addr.to_string();
    let cli = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_strand"))
            .args(args)
            .args(["--brokers", &addr, "--tls-ca", s(&ca)])
            .env("STRAND_USER", "admin")
            .env("STRAND_PASSWORD", "admin-pw")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        ok(&child.wait_with_output().unwrap())
    };
    cli(&["user", "create", "prometheus"], "scrape-pw\n");
    assert_eq!(
        https_get_checked(metrics, &ca, "/metrics", Some(("prometheus", "scrape-pw"))).0,
        403
    );
    cli(
        &[
            "acl",
            "add",
            "--user",
            "prometheus",
            "--operation",
            "describe",
            "--cluster",
        ],
        "",
    );
    assert_eq!(
        https_get_checked(metrics, &ca, "/metrics", Some(("prometheus", "scrape-pw"))).0,
        200
    );
    // Plain HTTP gets no HTTP answer from a TLS endpoint.
    use std::io::{Read, Write};
    let mut plain = std::net::TcpStream::connect(metrics).unwrap();
    plain
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    plain.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(!answer.starts_with(b"HTTP"), "{}", String::from_utf8_lossy(&answer));
}
