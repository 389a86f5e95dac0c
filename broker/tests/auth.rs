//! SASL SCRAM from outside (issue 42): three brokers with `--auth scram`
//! log in to one another and replicate; the CLI logs in with `--user` and
//! `$STRAND_PASSWORD`; a wrong password is `AuthenticationFailed`; an
//! unauthenticated connection and an ordinary user calling the brokers'
//! internal APIs (a replica fetch naming an in-sync follower, a raw
//! controller message) get `NotAuthorized` and nothing moves; users are
//! created, listed and deleted by a superuser only; a user without ACLs may
//! not produce, consume, delete a queue or decommission a node, and once
//! allowed (`strand acl add`) may, on every node within a second.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use common::cluster::Cluster;
use common::{failed, ok, scrape, serve_command, until_ok, value, Client};
use std::time::Duration;
use strand_net::message::{body, TailBuilder};
use strand_net::scram::{ClientExchange, Mechanism};
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

const INTER_BROKER: &str = "broker-secret-1";
const BOOTSTRAP: &str = "admin-secret-1";

/// `strand ARGS --brokers ADDR`, logged in as `user` with `password`
/// (`None`: no login), `stdin` on its standard input.
fn strand_as(addr: &str, login: Option<(&str, &str)>, args: &[&str], stdin: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_strand"));
    command
        .args(args)
        .args(["--brokers", addr])
        .env_remove("STRAND_USER")
        .env_remove("STRAND_PASSWORD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some((user, password)) = login {
        command.env("STRAND_PASSWORD", password);
        // `strand acl`'s --user names the entry's user: it logs in as
        // $STRAND_USER.
        match args.first() {
            Some(&"acl") => command.env("STRAND_USER", user),
            _ => command.args(["--user", user]),
        };
    }
    let mut child = command.spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// Logs a raw connection in; returns the broker's error code.
fn log_in(client: &mut Client, user: &str, password: &str) -> ErrorCode {
    let f = client.call_body(
        Api::SaslHandshake,
        &strand_client::sasl::handshake_request(Mechanism::Sha256),
        TailBuilder::default(),
    );
    assert_eq!(
        common::error_code(body::<SaslHandshakeResponse>(&f).unwrap().error()),
        ErrorCode::None
    );
    let (mut scram, first) = ClientExchange::start(Mechanism::Sha256, user, password.as_bytes());
    let f = client.call_body(
        Api::SaslAuthenticate,
        &strand_client::sasl::authenticate_request(&first),
        TailBuilder::default(),
    );
    let r = body::<SaslAuthenticateResponse>(&f).unwrap();
    let code = common::error_code(r.error());
    if code != ErrorCode::None {
        return code;
    }
    let last = scram.final_message(r.auth_bytes().unwrap().bytes()).unwrap();
    let f = client.call_body(
        Api::SaslAuthenticate,
        &strand_client::sasl::authenticate_request(&last),
        TailBuilder::default(),
    );
    let r = body::<SaslAuthenticateResponse>(&f).unwrap();
    let code = common::error_code(r.error());
    if code == ErrorCode::None {
        scram.verify(r.auth_bytes().unwrap().bytes()).unwrap();
    }
    code
}

/// A replica fetch naming `replica` for partition 0 of `queue` at
/// `offset` (what a follower at the log end sends): its error code.
fn replica_fetch(client: &mut Client, queue: &str, replica: u64, epoch: u32, offset: u64) -> ErrorCode {
    let mut fbb = FlatBufferBuilder::new();
    let p = ReplicaFetchPartition::create(
        &mut fbb,
        &ReplicaFetchPartitionArgs {
            partition: 0,
            leader_epoch: epoch,
            fetch_offset: offset,
            last_epoch: epoch as i32,
            flushed_offset: offset,
            ..Default::default()
        },
    );
    let partitions = fbb.create_vector(&[p]);
    let name = fbb.create_string(queue);
    let q = ReplicaFetchQueue::create(
        &mut fbb,
        &ReplicaFetchQueueArgs {
            name: Some(name),
            partitions: Some(partitions),
            id: 0,
        },
    );
    let queues = fbb.create_vector(&[q]);
    let root = ReplicaFetchRequest::create(
        &mut fbb,
        &ReplicaFetchRequestArgs {
            replica_id: replica,
            max_wait_ms: 0,
            queues: Some(queues),
        },
    );
    fbb.finish_minimal(root);
    let f = client.call(Api::ReplicaFetch, &fbb, TailBuilder::default());
    common::error_code(body::<ReplicaFetchResponse>(&f).unwrap().error())
}

/// A raw controller message (log entries' op, any payload).
fn controller_call(client: &mut Client) -> ErrorCode {
    controller_op(client, ControllerOp(1), 2, "{}")
}

/// A controller message `op` said to be from node `from`, with `payload`.
fn controller_op(client: &mut Client, op: ControllerOp, from: u64, payload: &str) -> ErrorCode {
    let mut fbb = FlatBufferBuilder::new();
    let payload = fbb.create_vector(payload.as_bytes());
    let root = ControllerRequest::create(
        &mut fbb,
        &ControllerRequestArgs {
            op,
            from,
            payload: Some(payload),
        },
    );
    fbb.finish_minimal(root);
    let f = client.call(Api::Controller, &fbb, TailBuilder::default());
    common::error_code(body::<ControllerResponse>(&f).unwrap().error())
}

#[test]
fn three_brokers_with_scram_serve_logged_in_users_and_keep_internal_apis_to_brokers() {
    let mut cluster = Cluster::start_with_env(
        3,
        "auth = \"scram\"\nsuperusers = [\"admin\"]\n",
        &[
            ("STRAND_INTER_BROKER_PASSWORD", INTER_BROKER),
            ("STRAND_BOOTSTRAP_PASSWORD", BOOTSTRAP),
        ],
    );
    let addr = |id: u8| cluster.addr(id).to_string();
    let admin = Some(("admin", BOOTSTRAP));
    // The first superuser exists once the cluster started (any node's
    // bootstrap may have made it); replication runs over logged-in links.
    until_ok(Duration::from_secs(30), Duration::from_millis(200), || {
        strand_as(&addr(1), admin, &["queue", "list"], "")
    });
    ok(&strand_as(
        &addr(2),
        admin,
        &["queue", "create", "s", "--partitions", "1", "--replication-factor", "3"],
        "",
    ));
    ok(&strand_as(
        &addr(2),
        admin,
        &["queue", "create", "t", "--partitions", "1"],
        "",
    ));
    let lines: String = (0..50).map(|i| format!("record-{i}\n")).collect();
    ok(&strand_as(&addr(1), admin, &["produce", "s", "--acks", "all"], &lines));

    // No login, a wrong password, an unknown user.
    let none = failed(&strand_as(&addr(1), None, &["queue", "list"], ""));
    assert!(none.contains("NotAuthorized") && none.contains("SCRAM"), "{none}");
    let wrong = failed(&strand_as(&addr(1), Some(("admin", "nope")), &["queue", "list"], ""));
    assert!(wrong.contains("AuthenticationFailed"), "{wrong}");
    let unknown = failed(&strand_as(&addr(1), Some(("mallory", "x")), &["queue", "list"], ""));
    assert!(unknown.contains("AuthenticationFailed"), "{unknown}");
    let no_password = failed(&strand_as(&addr(1), Some(("admin", "")), &["queue", "list"], ""));
    assert!(no_password.contains("STRAND_PASSWORD"), "{no_password}");

    // A superuser makes an ordinary user; it works on every node.
    ok(&strand_as(&addr(1), admin, &["user", "create", "alice"], "alice-pw\n"));
    let listed = ok(&strand_as(&addr(3), admin, &["user", "list", "--output", "json"], ""));
    let users: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let find = |name: &str| users.as_array().unwrap().iter().find(|u| u["name"] == name).cloned();
    assert_eq!(find("admin").unwrap()["superuser"], true, "{listed}");
    assert_eq!(find("alice").unwrap()["superuser"], false, "{listed}");
    assert_eq!(find("alice").unwrap()["mechanisms"].as_array().unwrap().len(), 2);
    assert!(!listed.contains("alice-pw"), "no password in the listing");
    let alice = Some(("alice", "alice-pw"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !strand_as(&addr(3), alice, &["queue", "list"], "").status.success() {
        assert!(std::time::Instant::now() < deadline, "alice cannot log in on node 3");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Without ACLs alice may do nothing with queues, groups or nodes.
    for (args, stdin) in [
        (&["produce", "s", "--acks", "all"][..], "from-alice\n"),
        (&["consume", "s", "--from", "earliest", "--max", "1"], ""),
        (&["queue", "delete", "s"], ""),
        (&["node", "decommission", "3"], ""),
        (&["node", "drain", "1"], ""),
        (&["user", "create", "bob"], "bob-pw\n"),
        (&["user", "list"], ""),
        (
            &["acl", "add", "--user", "alice", "--operation", "admin", "--cluster"],
            "",
        ),
    ] {
        let refused = failed(&strand_as(&addr(1), alice, args, stdin));
        assert!(
            refused.contains("NotAuthorized") && refused.contains("alice"),
            "{args:?}: {refused}"
        );
    }
    // Granted, it works on every node within a second.
    for (op, flag, name) in [("produce", "--queue", "s"), ("consume", "--queue-prefix", "s")] {
        ok(&strand_as(
            &addr(1),
            admin,
            &["acl", "add", "--user", "alice", "--operation", op, flag, name],
            "",
        ));
    }
    let granted = std::time::Instant::now();
    for id in [3, 2, 1] {
        while !strand_as(&addr(id), alice, &["produce", "s", "--acks", "all"], "from-alice\n")
            .status
            .success()
        {
            assert!(
                granted.elapsed() < std::time::Duration::from_secs(1),
                "node {id}: not allowed within 1 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    let read = ok(&strand_as(
        &addr(2),
        alice,
        &["consume", "s", "--from", "earliest", "--max", "53"],
        "",
    ));
    assert!(read.contains("from-alice") && read.contains("record-49"), "{read}");
    let acls = ok(&strand_as(&addr(2), admin, &["acl", "list", "--output", "json"], ""));
    let acls: serde_json::Value = serde_json::from_str(&acls).unwrap();
    assert_eq!(
        acls,
        serde_json::json!([
            {"user": "alice", "operation": "produce", "resource_type": "queue", "resource_name": "s"},
            {"user": "alice", "operation": "consume", "resource_type": "queue-prefix", "resource_name": "s"},
        ])
    );
    // The broker's own queues and dead-letter queues are no user's,
    // whatever an entry says.
    for (op, flag, name) in [("consume", "--queue-prefix", "_"), ("create", "--cluster", "")] {
        let mut args = vec!["acl", "add", "--user", "alice", "--operation", op, flag];
        if !name.is_empty() {
            args.push(name);
        }
        ok(&strand_as(&addr(1), admin, &args, ""));
    }
    // (A group's first use makes __groups.)
    ok(&strand_as(
        &addr(1),
        admin,
        &["consume", "s", "--group", "g", "--from", "earliest", "--max", "1"],
        "",
    ));
    let internal = failed(&strand_as(
        &addr(1),
        alice,
        &["consume", "__groups", "--from", "earliest", "--max", "1"],
        "",
    ));
    assert!(
        internal.contains("NotAuthorized") && internal.contains("own queues"),
        "{internal}"
    );
    let dlq = failed(&strand_as(
        &addr(1),
        alice,
        &["queue", "create", "s.dlq", "--partitions", "1"],
        "",
    ));
    assert!(dlq.contains("NotAuthorized") && dlq.contains("dead-letter"), "{dlq}");
    for (op, flag, name) in [("consume", "--queue-prefix", "_"), ("create", "--cluster", "")] {
        let mut args = vec!["acl", "remove", "--user", "alice", "--operation", op, flag];
        if !name.is_empty() {
            args.push(name);
        }
        ok(&strand_as(&addr(1), admin, &args, ""));
    }
    // Still not another queue, nor deleting this one.
    let other = failed(&strand_as(&addr(1), alice, &["produce", "t", "--acks", "all"], "x\n"));
    assert!(other.contains("NotAuthorized"), "{other}");
    let delete = failed(&strand_as(&addr(1), alice, &["queue", "delete", "s"], ""));
    assert!(
        delete.contains("NotAuthorized") && delete.contains("delete"),
        "{delete}"
    );
    // Taken away, refused again.
    ok(&strand_as(
        &addr(3),
        admin,
        &[
            "acl",
            "remove",
            "--user",
            "alice",
            "--operation",
            "produce",
            "--queue",
            "s",
        ],
        "",
    ));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while strand_as(&addr(1), alice, &["produce", "s", "--acks", "all"], "late\n")
        .status
        .success()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "produce still allowed after acl remove"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // The internal APIs, unauthenticated and as alice: refused, nothing moves.
    let before: serde_json::Value = serde_json::from_str(&ok(&strand_as(
        &addr(1),
        admin,
        &["queue", "describe", "s", "--output", "json"],
        "",
    )))
    .unwrap();
    let p = &before["partitions"][0];
    let leader = p["leader"].as_u64().unwrap() as u8;
    let follower = p["isr"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_u64().unwrap())
        .find(|r| *r != u64::from(leader))
        .unwrap();
    let epoch = p["leader_epoch"].as_u64().unwrap() as u32;
    let end = p["log_end"].as_u64().unwrap();
    let mut anonymous = cluster.client(leader);
    assert_eq!(
        replica_fetch(&mut anonymous, "s", follower, epoch, end),
        ErrorCode::NotAuthorized
    );
    assert_eq!(controller_call(&mut anonymous), ErrorCode::NotAuthorized);
    let mut as_alice = cluster.client(leader);
    assert_eq!(log_in(&mut as_alice, "alice", "wrong"), ErrorCode::AuthenticationFailed);
    assert_eq!(log_in(&mut as_alice, "alice", "alice-pw"), ErrorCode::None);
    assert_eq!(
        replica_fetch(&mut as_alice, "s", follower, epoch, end),
        ErrorCode::NotAuthorized
    );
    assert_eq!(controller_call(&mut as_alice), ErrorCode::NotAuthorized);
    // A broker speaks only for itself: logged in as the third node (the
    // brokers' password, the name covered by the SCRAM proof), a replica
    // fetch naming the follower, a lease renewal for it, a message said to
    // be from it, log entries as the leader, an ISR change as the leader:
    // all refused. The bare inter-broker name logs in as no one.
    let third = (1..=3u64).find(|n| *n != u64::from(leader) && *n != follower).unwrap();
    let mut bare = cluster.client(leader);
    assert_eq!(
        log_in(&mut bare, "strand-broker", INTER_BROKER),
        ErrorCode::AuthenticationFailed
    );
    let mut as_third = cluster.client(leader);
    assert_eq!(
        log_in(&mut as_third, &format!("strand-broker.{third}"), INTER_BROKER),
        ErrorCode::None
    );
    assert_eq!(
        replica_fetch(&mut as_third, "s", follower, epoch, end),
        ErrorCode::NotAuthorized
    );
    let renewal = format!("{{\"id\":{follower},\"address\":\"127.0.0.9:1\",\"shards\":1}}");
    for (op, from, payload) in [
        (ControllerOp::BrokerHeartbeat, third, renewal.clone()),
        (ControllerOp::BrokerHeartbeat, follower, renewal),
        (ControllerOp(1), u64::from(leader), "{}".to_string()),
        (
            ControllerOp::Propose,
            third,
            format!(
                "{{\"AlterIsr\":{{\"queue\":\"s\",\"partition\":0,\"leader\":{leader},\"leader_epoch\":{epoch},\
                 \"partition_epoch\":0,\"isr\":[{leader}]}}}}"
            ),
        ),
        (
            ControllerOp::Propose,
            third,
            format!("{{\"FenceBroker\":{{\"id\":{follower},\"term\":1}}}}"),
        ),
    ] {
        assert_eq!(
            controller_op(&mut as_third, op, from, &payload),
            ErrorCode::NotAuthorized,
            "{op:?} from {from}: {payload}"
        );
    }
    let after: serde_json::Value = serde_json::from_str(&ok(&strand_as(
        &addr(1),
        admin,
        &["queue", "describe", "s", "--output", "json"],
        "",
    )))
    .unwrap();
    assert_eq!(before["partitions"], after["partitions"], "nothing moved");
    let metrics = scrape(cluster.node(leader));
    assert!(
        value(
            &metrics,
            "strand_authorization_denials_total{shard=\"0\",reason=\"ReplicaFetch\"}"
        )
        .unwrap()
            >= 2.0
    );
    assert!(
        value(
            &metrics,
            "strand_authentication_failures_total{shard=\"0\",reason=\"wrong_password\"}"
        )
        .unwrap()
            >= 1.0
    );

    // A deleted user no longer logs in.
    ok(&strand_as(&addr(2), admin, &["user", "delete", "alice"], ""));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let out = strand_as(&addr(1), alice, &["queue", "list"], "");
        if !out.status.success() {
            assert!(failed(&out).contains("AuthenticationFailed"));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "alice still logs in");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // And her session logged in before ends with her.
    let mut fbb = FlatBufferBuilder::new();
    let root = MetadataRequest::create(&mut fbb, &MetadataRequestArgs::default());
    fbb.finish_minimal(root);
    let f = as_alice.call(Api::Metadata, &fbb, TailBuilder::default());
    assert_eq!(
        common::error_code(body::<MetadataResponse>(&f).unwrap().error()),
        ErrorCode::AuthenticationFailed
    );

    // The leader the forged fetches were sent to dies: every acknowledged
    // record is on the replica that takes over (the forged fetch moved no
    // high watermark).
    let survivor = addr(if leader == 1 { 2 } else { 1 });
    cluster.kill9(leader);
    // Read until the new leader serves all (the failover waits for the dead
    // leader's lease, longer on a busy machine), at most 30 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let read = loop {
        let out = strand_as(
            &survivor,
            admin,
            &["consume", "s", "--from", "earliest", "--idle-exit-ms", "3000"],
            "",
        );
        let read = String::from_utf8_lossy(&out.stdout).to_string();
        if read.lines().any(|l| l == "record-49") || std::time::Instant::now() > deadline {
            break read;
        }
    };
    for i in 0..50 {
        assert!(
            read.lines().any(|l| l == format!("record-{i}")),
            "record-{i} lost: {read}"
        );
    }
    assert_eq!(read.lines().filter(|l| *l == "from-alice").count(), 3, "{read}");
}

#[test]
fn a_broker_refuses_to_start_open_off_loopback_or_scram_without_the_brokers_password() {
    let dir = tempfile::tempdir().unwrap();
    let start = |extra: &[&str], listen: &str| -> String {
        let mut command = serve_command(listen, &["--cores", "1"]);
        command
            .args(extra)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env_remove("STRAND_INTER_BROKER_PASSWORD");
        let out = command.output().unwrap();
        assert!(!out.status.success(), "started with {extra:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let open = start(&["--advertise", "127.0.0.1:9400"], "0.0.0.0:0");
    assert!(open.contains("--auth none") && open.contains("--auth scram"), "{open}");
    let scram = start(&["--auth", "scram"], "127.0.0.1:0");
    assert!(scram.contains("STRAND_INTER_BROKER_PASSWORD"), "{scram}");
}

/// One broker with `--auth scram` and the superuser admin (its password
/// `BOOTSTRAP`), on `cores` shards with the settings `toml`, its data in
/// `dir`; returned once admin may log in.
fn scram_broker(dir: &std::path::Path, cores: &str, toml: &str) -> common::Broker {
    std::fs::write(dir.join("s.toml"), toml).unwrap();
    let mut command = serve_command(
        "127.0.0.1:0",
        &["--cores", cores, "--auth", "scram", "--superusers", "admin"],
    );
    command
        .arg("--config")
        .arg(dir.join("s.toml"))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .env("STRAND_INTER_BROKER_PASSWORD", INTER_BROKER)
        .env("STRAND_BOOTSTRAP_PASSWORD", BOOTSTRAP);
    let broker = common::Broker::spawn(command, &dir.join("data"));
    let addr = broker.addr.to_string();
    until_ok(Duration::from_secs(30), Duration::from_millis(200), || {
        strand_as(&addr, Some(("admin", BOOTSTRAP)), &["queue", "list"], "")
    });
    broker
}

/// JoinGroup of `group` on `queue`: the member id, or the error code.
fn join(client: &mut Client, group: &str, queue: &str) -> Result<String, ErrorCode> {
    let mut fbb = FlatBufferBuilder::new();
    let g = fbb.create_string(group);
    let q = fbb.create_string(queue);
    let queues = fbb.create_vector(&[q]);
    let name = fbb.create_string("test");
    let root = JoinGroupRequest::create(
        &mut fbb,
        &JoinGroupRequestArgs {
            group: Some(g),
            queues: Some(queues),
            session_timeout_ms: 30_000,
            client_name: Some(name),
            ..Default::default()
        },
    );
    fbb.finish_minimal(root);
    let f = client.call(Api::JoinGroup, &fbb, TailBuilder::default());
    let r = body::<JoinGroupResponse>(&f).unwrap();
    match common::error_code(r.error()) {
        ErrorCode::None => Ok(r.member_id().unwrap().to_string()),
        other => Err(other),
    }
}

/// Heartbeat (`leave`: LeaveGroup) as member `member` of `group`.
fn as_member(client: &mut Client, group: &str, member: &str, leave: bool) -> ErrorCode {
    let mut fbb = FlatBufferBuilder::new();
    let g = fbb.create_string(group);
    let m = fbb.create_string(member);
    if leave {
        let root = LeaveGroupRequest::create(
            &mut fbb,
            &LeaveGroupRequestArgs {
                group: Some(g),
                member_id: Some(m),
            },
        );
        fbb.finish_minimal(root);
        let f = client.call(Api::LeaveGroup, &fbb, TailBuilder::default());
        common::error_code(body::<LeaveGroupResponse>(&f).unwrap().error())
    } else {
        let root = HeartbeatRequest::create(
            &mut fbb,
            &HeartbeatRequestArgs {
                group: Some(g),
                member_id: Some(m),
                owned: None,
            },
        );
        fbb.finish_minimal(root);
        let f = client.call(Api::Heartbeat, &fbb, TailBuilder::default());
        common::error_code(body::<HeartbeatResponse>(&f).unwrap().error())
    }
}

/// The queues a FetchOffsets of all `group`'s positions answers with.
fn fetch_offsets(client: &mut Client, group: &str) -> Vec<String> {
    let mut fbb = FlatBufferBuilder::new();
    let g = fbb.create_string(group);
    let root = FetchOffsetsRequest::create(
        &mut fbb,
        &FetchOffsetsRequestArgs {
            group: Some(g),
            queues: None,
        },
    );
    fbb.finish_minimal(root);
    let f = client.call(Api::FetchOffsets, &fbb, TailBuilder::default());
    let r = body::<FetchOffsetsResponse>(&f).unwrap();
    assert_eq!(common::error_code(r.error()), ErrorCode::None);
    r.queues()
        .iter()
        .flatten()
        .map(|q| q.queue().unwrap_or_default().to_string())
        .collect()
}

/// Within a group, a member is the user's that joined it: another user
/// with `consume` on the group may not heartbeat or leave as it; and a
/// group's answers (FetchOffsets, DescribeGroup) show a user only the
/// queues it may describe.
#[test]
fn a_users_group_member_is_its_own_and_group_answers_show_only_its_queues() {
    let dir = tempfile::tempdir().unwrap();
    let broker = scram_broker(dir.path(), "1", "");
    let addr = broker.addr.to_string();
    let admin = Some(("admin", BOOTSTRAP));
    for q in ["a", "b"] {
        ok(&strand_as(
            &addr,
            admin,
            &["queue", "create", q, "--partitions", "1"],
            "",
        ));
        ok(&strand_as(&addr, admin, &["produce", q], "x\ny\n"));
    }
    for user in ["alice", "bob"] {
        ok(&strand_as(
            &addr,
            admin,
            &["user", "create", user],
            &format!("{user}-pw\n"),
        ));
    }
    let grants: &[(&str, &str, &str, &str)] = &[
        ("alice", "consume", "--group", "g"),
        ("alice", "describe", "--group", "g"),
        ("alice", "consume", "--queue", "a"),
        ("alice", "describe", "--queue", "a"),
        ("bob", "consume", "--group", "g"),
        ("bob", "describe", "--group", "g"),
        ("bob", "consume", "--queue", "b"),
        ("bob", "describe", "--queue", "b"),
    ];
    for (user, op, kind, name) in grants {
        ok(&strand_as(
            &addr,
            admin,
            &["acl", "add", "--user", user, "--operation", op, kind, name],
            "",
        ));
    }
    // Both commit a position in g, each on its own queue.
    for (user, queue) in [("alice", "a"), ("bob", "b")] {
        let login = Some((user, if user == "alice" { "alice-pw" } else { "bob-pw" }));
        until_ok(Duration::from_secs(10), Duration::from_millis(100), || {
            strand_as(
                &addr,
                login,
                &["consume", queue, "--group", "g", "--idle-exit-ms", "1000"],
                "",
            )
        });
    }
    // A connection that has not logged in yet is counted as such.
    let _waiting = broker.client();
    let mut as_alice = broker.client();
    assert_eq!(log_in(&mut as_alice, "alice", "alice-pw"), ErrorCode::None);
    let by_state = |state: &str| {
        value(
            &scrape(&broker),
            &format!("strand_connections_by_state{{shard=\"0\",listener=\"client\",state=\"{state}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert!(
        by_state("login") >= 1.0 && by_state("open") >= 1.0,
        "{}",
        scrape(&broker)
    );
    assert_eq!(by_state("tls_handshake"), 0.0);
    let mut as_bob = broker.client();
    assert_eq!(log_in(&mut as_bob, "bob", "bob-pw"), ErrorCode::None);
    let member = join(&mut as_alice, "g", "a").unwrap();
    assert_eq!(as_member(&mut as_bob, "g", &member, false), ErrorCode::NotAuthorized);
    assert_eq!(as_member(&mut as_bob, "g", &member, true), ErrorCode::NotAuthorized);
    // Nothing moved: alice's member is still in the group, and hers.
    assert_eq!(as_member(&mut as_alice, "g", &member, false), ErrorCode::None);
    assert_eq!(fetch_offsets(&mut as_alice, "g"), vec!["a".to_string()]);
    assert_eq!(fetch_offsets(&mut as_bob, "g"), vec!["b".to_string()]);
    let bob_sees: String = ok(&strand_as(
        &addr,
        Some(("bob", "bob-pw")),
        &["group", "describe", "g", "--output", "json"],
        "",
    ))
    .split_whitespace()
    .collect();
    assert!(!bob_sees.contains("\"queue\":\"a\""), "{bob_sees}");
    let admin_sees: String = ok(&strand_as(
        &addr,
        admin,
        &["group", "describe", "g", "--output", "json"],
        "",
    ))
    .split_whitespace()
    .collect();
    assert!(
        admin_sees.contains("\"queue\":\"a\"") && admin_sees.contains("\"queue\":\"b\""),
        "{admin_sees}"
    );
    assert_eq!(as_member(&mut as_alice, "g", &member, true), ErrorCode::None);
    // Lists show a user what it may describe: bob's queues and groups, not
    // alice's queue nor a group of admin's; a queue he names but may not
    // describe is NotAuthorized.
    ok(&strand_as(
        &addr,
        admin,
        &["consume", "a", "--group", "h", "--idle-exit-ms", "1000"],
        "",
    ));
    let names = |who: Option<(&str, &str)>, what: &str| -> Vec<String> {
        let out = ok(&strand_as(&addr, who, &[what, "list", "--output", "json"], ""));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let mut names: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    let bob = Some(("bob", "bob-pw"));
    assert_eq!(names(bob, "queue"), ["b"]);
    assert_eq!(names(admin, "queue"), ["a", "b"]);
    assert_eq!(names(bob, "group"), ["g"]);
    assert_eq!(names(admin, "group"), ["g", "h"]);
    let refused = failed(&strand_as(&addr, bob, &["produce", "a"], "x\n"));
    assert!(refused.contains("NotAuthorized"), "{refused}");
    // Given another password, bob's open session ends (its next request).
    assert_eq!(fetch_offsets(&mut as_bob, "g"), vec!["b".to_string()]);
    ok(&strand_as(&addr, admin, &["user", "create", "bob"], "bob-new-pw\n"));
    assert_eq!(
        as_member(&mut as_bob, "g", &member, false),
        ErrorCode::AuthenticationFailed
    );
    broker.terminate();
}

/// A user's new producer ids are counted over all its connections to a
/// broker (`max_producer_ids_per_principal`): opening connections does not
/// let one user fill a partition's producer table; another user is apart.
#[test]
fn a_user_brings_at_most_so_many_producer_ids_over_all_its_connections() {
    let dir = tempfile::tempdir().unwrap();
    let broker = scram_broker(dir.path(), "2", "max_producer_ids_per_principal = 6\n");
    let addr = broker.addr.to_string();
    let admin = Some(("admin", BOOTSTRAP));
    ok(&strand_as(
        &addr,
        admin,
        &["queue", "create", "p", "--partitions", "2"],
        "",
    ));
    for user in ["alice", "bob"] {
        ok(&strand_as(
            &addr,
            admin,
            &["user", "create", user],
            &format!("{user}-pw\n"),
        ));
        ok(&strand_as(
            &addr,
            admin,
            &["acl", "add", "--user", user, "--operation", "produce", "--queue", "p"],
            "",
        ));
    }
    let starts = |producer_id: i64| {
        let mut b = strand_storage::batch::BatchBuilder::new();
        b.producer(producer_id, 0, 0);
        b.push(None, Some(b"v"), &[], common::TS);
        b.build().freeze()
    };
    // Three connections of alice's, two new producers each: six in all.
    let mut conns: Vec<Client> = (0..3).map(|_| broker.client()).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        assert_eq!(log_in(c, "alice", "alice-pw"), ErrorCode::None);
        for j in 0..2 {
            let id = (i * 2 + j) as i64;
            c.produce("p", (id % 2) as u32, starts(id), 1).unwrap();
        }
    }
    // A seventh, on any connection of hers: refused, naming her.
    let (code, message) = conns[0].produce("p", 0, starts(100), 1).unwrap_err();
    assert_eq!(code, ErrorCode::TooManyProducers, "{message}");
    assert!(message.contains("alice"), "{message}");
    let mut fresh = broker.client();
    assert_eq!(log_in(&mut fresh, "alice", "alice-pw"), ErrorCode::None);
    assert_eq!(
        fresh.produce("p", 1, starts(101), 1).unwrap_err().0,
        ErrorCode::TooManyProducers
    );
    // A producer she brought goes on; bob is counted apart.
    let mut go_on = strand_storage::batch::BatchBuilder::new();
    go_on.producer(0, 0, 1);
    go_on.push(None, Some(b"w"), &[], common::TS);
    conns[0].produce("p", 0, go_on.build().freeze(), 1).unwrap();
    let mut as_bob = broker.client();
    assert_eq!(log_in(&mut as_bob, "bob", "bob-pw"), ErrorCode::None);
    as_bob.produce("p", 0, starts(200), 1).unwrap();
    broker.terminate();
}
