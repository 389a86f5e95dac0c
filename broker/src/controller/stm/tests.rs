use super::*;

fn settings(partitions: u32, rf: u16) -> QueueSettings {
    QueueSettings {
        retention_ms: Some(7 * 24 * 3600 * 1000),
        ..QueueSettings::for_tests(partitions, rf)
    }
}

fn one_node() -> (MetadataStm, u64) {
    let mut stm = MetadataStm::new();
    stm.apply(
        1,
        &Command::RegisterBroker {
            id: 1,
            address: "127.0.0.1:9400".into(),
            shards: 2,
            incarnation: 1,
            directory: 1,
        },
    )
    .unwrap();
    (stm, 2)
}

#[test]
fn create_alter_delete() {
    let (mut stm, mut i) = one_node();
    let create = Command::CreateQueue {
        name: "orders".into(),
        settings: settings(3, 1),
    };
    stm.apply(i, &create).unwrap();
    i += 1;
    let q = stm.table().queue("orders").unwrap();
    assert_eq!((q.id, q.partitions.len()), (0, 3));
    assert!(q
        .partitions
        .iter()
        .all(|p| p.leader == 1 && p.replicas == vec![1] && p.isr == vec![1]));
    assert_eq!(
        stm.apply(i, &create),
        Err(ControllerError::QueueExists("orders".into()))
    );
    i += 1;

    let grow = Command::AlterQueue {
        name: "orders".into(),
        changes: QueueChanges {
            partitions: Some(5),
            retention_ms: Some(None),
            ..QueueChanges::default()
        },
    };
    stm.apply(i, &grow).unwrap();
    i += 1;
    let q = stm.table().queue("orders").unwrap();
    assert_eq!(
        (q.partitions.len(), q.settings.partitions, q.settings.retention_ms),
        (5, 5, None)
    );
    let shrink = Command::AlterQueue {
        name: "orders".into(),
        changes: QueueChanges {
            partitions: Some(2),
            ..QueueChanges::default()
        },
    };
    assert!(matches!(
        stm.apply(i, &shrink),
        Err(ControllerError::InvalidSettings(_))
    ));
    i += 1;
    assert_eq!(
        stm.table().queue("orders").unwrap().partitions.len(),
        5,
        "a refused command changes nothing"
    );

    stm.apply(i, &Command::DeleteQueue { name: "orders".into() }).unwrap();
    i += 1;
    assert!(stm.table().queue("orders").is_none());
    // Re-created, it is a new queue.
    stm.apply(i, &create).unwrap();
    assert_eq!(stm.table().queue("orders").unwrap().id, 1);
    assert_eq!(stm.table().applied_index, i);
}

#[test]
fn bad_commands_are_refused_with_their_reason() {
    let (mut stm, mut i) = one_node();
    let mut next = || {
        i += 1;
        i
    };
    let create = |name: &str, s: QueueSettings| Command::CreateQueue {
        name: name.into(),
        settings: s,
    };
    let err = |stm: &mut MetadataStm, at, c| stm.apply(at, &c).unwrap_err();
    assert!(matches!(
        err(&mut stm, next(), create("a/b", settings(1, 1))),
        ControllerError::InvalidName(_)
    ));
    assert!(matches!(
        err(&mut stm, next(), create("..", settings(1, 1))),
        ControllerError::InvalidName(_)
    ));
    assert!(matches!(
        err(&mut stm, next(), create("q", settings(0, 1))),
        ControllerError::InvalidSettings(_)
    ));
    assert_eq!(
        err(&mut stm, next(), create("q", settings(1, 3))),
        ControllerError::NotEnoughBrokers { wanted: 3, brokers: 1 }
    );
    let mut s = settings(1, 1);
    s.fsync = FsyncSetting::Interval { ms: 0, bytes: 0 };
    assert!(matches!(
        err(&mut stm, next(), create("q", s)),
        ControllerError::InvalidSettings(_)
    ));
    let mut s = settings(1, 1);
    s.retention_bytes = Some(0);
    assert!(matches!(
        err(&mut stm, next(), create("q", s)),
        ControllerError::InvalidSettings(_)
    ));
    assert!(matches!(
        err(&mut stm, next(), Command::DeleteQueue { name: "nope".into() }),
        ControllerError::UnknownQueue(_)
    ));
    assert!(stm.table().queues.is_empty());
    assert_eq!(
        ControllerError::UnknownQueue("x".into()).code(),
        strand_wire::ErrorCode::UnknownQueue
    );
}

#[test]
fn snapshot_restore_and_replay_agree() {
    // Three brokers, a mix of commands (some refused).
    let mut commands = vec![];
    for id in 1..=3 {
        commands.push(Command::RegisterBroker {
            id,
            address: format!("10.0.0.{id}:9400"),
            shards: 4,
            incarnation: 1,
            directory: 1,
        });
    }
    for q in 0..20u32 {
        commands.push(Command::CreateQueue {
            name: format!("q{}", q % 15),
            settings: settings(1 + q % 7, 1 + (q % 3) as u16),
        });
        if q % 4 == 0 {
            commands.push(Command::AlterQueue {
                name: format!("q{}", q % 15),
                changes: QueueChanges {
                    partitions: Some(9),
                    ..QueueChanges::default()
                },
            });
        }
        if q % 5 == 0 {
            commands.push(Command::DeleteQueue {
                name: format!("q{}", q % 6),
            });
        }
    }
    let replay = |cmds: &[Command]| {
        let mut stm = MetadataStm::new();
        let results: Vec<bool> = cmds
            .iter()
            .enumerate()
            .map(|(i, c)| stm.apply(i as u64 + 1, c).is_ok())
            .collect();
        (stm, results)
    };
    let (a, results_a) = replay(&commands);
    let (b, results_b) = replay(&commands);
    assert_eq!(a, b, "deterministic");
    assert_eq!(results_a, results_b);
    assert!(results_a.iter().any(|ok| !ok) && results_a.iter().filter(|ok| **ok).count() > 20);

    // Every partition has distinct replicas, led by its first replica.
    for q in a.table().queues.values() {
        for p in &q.partitions {
            let mut r = p.replicas.clone();
            r.sort();
            r.dedup();
            assert_eq!(r.len(), usize::from(q.settings.replication_factor));
            assert_eq!(p.leader, p.replicas[0]);
        }
    }

    // A snapshot taken halfway, restored, then the rest replayed: same table.
    let half = commands.len() / 2;
    let (mid, _) = replay(&commands[..half]);
    let mut restored = MetadataStm::new();
    restored.restore(&mid.snapshot()).unwrap();
    assert_eq!(restored, mid);
    for (i, c) in commands.iter().enumerate().skip(half) {
        let _ = restored.apply(i as u64 + 1, c);
    }
    assert_eq!(restored, a);
    assert!(MetadataStm::new().restore(b"{not json").is_err());
}

#[test]
#[should_panic(expected = "log order")]
fn applying_out_of_order_is_a_bug() {
    let (mut stm, _) = one_node();
    stm.apply_blank(1);
}

/// A table of `n` brokers, 10.0.0.1–n, each registered and alive.
pub(super) fn brokers(n: u64) -> (MetadataStm, u64) {
    let mut stm = MetadataStm::new();
    for id in 1..=n {
        stm.apply(
            id,
            &Command::RegisterBroker {
                id,
                address: format!("10.0.0.{id}:9400"),
                shards: 2,
                incarnation: 1,
                directory: 1,
            },
        )
        .unwrap();
    }
    (stm, n + 1)
}

/// [`brokers`], then a queue "q" with `partitions` of `rf` replicas;
/// returns the index of the last command applied.
fn brokers_and_queue(n: u64, partitions: u32, rf: u16) -> (MetadataStm, u64) {
    let (mut stm, index) = brokers(n);
    let create = Command::CreateQueue {
        name: "q".into(),
        settings: settings(partitions, rf),
    };
    stm.apply(index, &create).unwrap();
    (stm, index)
}

/// Broker `id` registering (again) as [`brokers`] registers it.
pub(super) fn back(id: NodeId) -> Command {
    Command::RegisterBroker {
        id,
        address: format!("10.0.0.{id}:9400"),
        shards: 2,
        incarnation: 1,
        directory: 1,
    }
}

/// (leaders, replicas) each broker holds in the table.
fn load(stm: &MetadataStm) -> std::collections::BTreeMap<NodeId, (usize, usize)> {
    let mut load = std::collections::BTreeMap::new();
    for p in stm.table().queues.values().flat_map(|q| &q.partitions) {
        load.entry(p.leader).or_insert((0, 0)).0 += 1;
        for r in &p.replicas {
            load.entry(*r).or_insert((0, 0)).1 += 1;
        }
    }
    load
}

#[test]
fn leaders_and_replicas_spread_evenly_over_the_brokers() {
    let (mut stm, mut index) = brokers(3);
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        let r = stm.apply(index, &c);
        index += 1;
        r
    };
    // Queue sizes that a per-queue rotation would pile onto one broker.
    for (i, partitions) in [1u32, 1, 1, 4, 2, 7, 1, 5].iter().enumerate() {
        apply(
            &mut stm,
            Command::CreateQueue {
                name: format!("q{i}"),
                settings: settings(*partitions, 1 + (i % 3) as u16),
            },
        )
        .unwrap();
    }
    apply(
        &mut stm,
        Command::AlterQueue {
            name: "q0".into(),
            changes: QueueChanges {
                partitions: Some(5),
                ..QueueChanges::default()
            },
        },
    )
    .unwrap();
    let load = load(&stm);
    let leaders: Vec<usize> = load.values().map(|l| l.0).collect();
    let replicas: Vec<usize> = load.values().map(|l| l.1).collect();
    assert_eq!(leaders.iter().sum::<usize>(), 26);
    assert!(
        leaders.iter().max().unwrap() - leaders.iter().min().unwrap() <= 1,
        "leaders per broker {leaders:?}"
    );
    assert!(
        replicas.iter().max().unwrap() - replicas.iter().min().unwrap() <= 1,
        "replicas per broker {replicas:?}"
    );
    for p in stm.table().queues.values().flat_map(|q| &q.partitions) {
        let mut distinct = p.replicas.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), p.replicas.len(), "distinct brokers: {p:?}");
        assert_eq!((p.leader, &p.isr), (p.replicas[0], &p.replicas));
    }
    // The same commands on another node place the same way.
    let (mut again, mut index) = brokers(3);
    for i in 0..8usize {
        let partitions = [1u32, 1, 1, 4, 2, 7, 1, 5][i];
        again
            .apply(
                index,
                &Command::CreateQueue {
                    name: format!("q{i}"),
                    settings: settings(partitions, 1 + (i % 3) as u16),
                },
            )
            .unwrap();
        index += 1;
    }
    assert_eq!(again.table().queues["q5"], stm.table().queues["q5"]);
}

#[test]
fn a_fenced_broker_gets_no_new_partitions_until_it_registers_again() {
    let (mut stm, index) = brokers(3);
    // A fence written by a leader of another term (deposed meanwhile) is void.
    stm.apply_in_term(index, 5, &Command::FenceBroker { id: 2, term: 4 })
        .unwrap();
    assert!(stm.table().brokers[&2].alive);
    stm.apply_in_term(index + 1, 4, &Command::FenceBroker { id: 2, term: 4 })
        .unwrap();
    assert!(!stm.table().brokers[&2].alive);
    stm.apply(
        index + 2,
        &Command::CreateQueue {
            name: "while-fenced".into(),
            settings: settings(6, 1),
        },
    )
    .unwrap();
    assert!(stm.table().queues["while-fenced"]
        .partitions
        .iter()
        .all(|p| p.replicas != vec![2]));
    assert_eq!(
        stm.apply(
            index + 4,
            &Command::CreateQueue {
                name: "rf3".into(),
                settings: settings(1, 3),
            },
        ),
        Err(ControllerError::NotEnoughBrokers { wanted: 3, brokers: 2 })
    );
    // Fencing a broker the table does not know changes nothing.
    let before = stm.table().brokers.clone();
    stm.apply_in_term(index + 5, 4, &Command::FenceBroker { id: 9, term: 4 })
        .unwrap();
    assert_eq!(stm.table().brokers, before);
    // Back: alive, and the next partitions go to it first (it leads none).
    stm.apply(
        index + 6,
        &Command::RegisterBroker {
            id: 2,
            address: "10.0.0.2:9400".into(),
            shards: 2,
            incarnation: 1,
            directory: 1,
        },
    )
    .unwrap();
    assert!(stm.table().brokers[&2].alive);
    stm.apply(
        index + 7,
        &Command::CreateQueue {
            name: "after".into(),
            settings: settings(2, 1),
        },
    )
    .unwrap();
    let leaders: Vec<NodeId> = stm.table().queues["after"]
        .partitions
        .iter()
        .map(|p| p.leader)
        .collect();
    assert_eq!(leaders, vec![2, 2]);
}

#[test]
fn a_fenced_leader_hands_over_to_the_isr_and_isr_changes_are_fenced_by_epochs() {
    let (mut stm, mut index) = brokers_and_queue(3, 1, 3);
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        index += 1;
        stm.apply(index, &c)
    };
    apply(
        &mut stm,
        Command::CreateQueue {
            name: "single".into(),
            settings: settings(1, 1),
        },
    )
    .unwrap();
    let part = |stm: &MetadataStm, q: &str| stm.table().queues[q].partitions[0].clone();
    let first = part(&stm, "q");
    let [a, b, c] = [first.replicas[0], first.replicas[1], first.replicas[2]];
    let lone = part(&stm, "single").leader;
    assert_eq!((first.leader, first.leader_epoch, first.partition_epoch), (a, 0, 0));

    // The leader is fenced: the next replica in the ISR leads, a new epoch.
    apply(&mut stm, Command::FenceBroker { id: a, term: 0 }).unwrap();
    let p = part(&stm, "q");
    assert_eq!((p.leader, p.leader_epoch, p.partition_epoch), (b, 1, 1));
    assert_eq!(p.isr, vec![b, c]);
    // Back, it does not take the lead; the leader lets it in again.
    apply(&mut stm, back(a)).unwrap();
    assert_eq!(part(&stm, "q").leader, b);
    let alter = |leader, leader_epoch, partition_epoch, isr: Vec<NodeId>| Command::AlterIsr {
        queue: "q".into(),
        partition: 0,
        leader,
        leader_epoch,
        partition_epoch,
        isr,
    };
    apply(&mut stm, alter(b, 1, 1, vec![c, b, a])).unwrap();
    let p = part(&stm, "q");
    assert_eq!(
        (p.isr.clone(), p.partition_epoch),
        (vec![a, b, c], 2),
        "in replica order"
    );
    // A change from a leader that did not see the last one, or from an old leader.
    for stale in [alter(b, 1, 1, vec![b]), alter(a, 0, 2, vec![a])] {
        assert!(matches!(
            apply(&mut stm, stale),
            Err(ControllerError::StaleIsrChange { leader, .. }) if leader == b
        ));
    }
    assert!(matches!(
        apply(&mut stm, alter(b, 1, 2, vec![a, c])),
        Err(ControllerError::InvalidIsr(_))
    ));
    assert!(matches!(
        apply(&mut stm, alter(b, 1, 2, vec![b, 7])),
        Err(ControllerError::InvalidIsr(_))
    ));
    assert_eq!(part(&stm, "q").partition_epoch, 2, "refusals change nothing");

    // Fenced one by one: the lead moves through the ISR; the last member
    // stays in it, and the partition waits offline for it.
    apply(&mut stm, Command::FenceBroker { id: b, term: 0 }).unwrap();
    assert_eq!((part(&stm, "q").leader, part(&stm, "q").isr.clone()), (a, vec![a, c]));
    apply(&mut stm, Command::FenceBroker { id: a, term: 0 }).unwrap();
    assert_eq!((part(&stm, "q").leader, part(&stm, "q").isr.clone()), (c, vec![c]));
    // Id 0 means "no leader": no broker may take it.
    assert_eq!(apply(&mut stm, back(0)), Err(ControllerError::InvalidBrokerId));
    assert!(!stm.table().brokers.contains_key(&0));
    // A fenced broker cannot be let in.
    let p = part(&stm, "q");
    assert!(matches!(
        apply(&mut stm, alter(c, p.leader_epoch, p.partition_epoch, vec![b, c])),
        Err(ControllerError::InvalidIsr(_))
    ));
    apply(&mut stm, Command::FenceBroker { id: c, term: 0 }).unwrap();
    let p = part(&stm, "q");
    assert_eq!((p.leader, p.isr.clone(), p.leader_epoch), (NO_LEADER, vec![c], 4));
    // Only an ISR member may lead again (no unclean election): a comes
    // back and the partition stays offline; c comes back and leads.
    apply(&mut stm, back(a)).unwrap();
    assert_eq!(part(&stm, "q").leader, NO_LEADER);
    apply(&mut stm, back(c)).unwrap();
    let p = part(&stm, "q");
    assert_eq!((p.leader, p.leader_epoch), (c, 5));
    // A one-replica partition (placed on b, which led nothing): offline
    // while its broker is fenced, its again once back.
    assert_eq!(lone, b);
    let s = part(&stm, "single");
    assert_eq!((s.leader, s.isr.clone()), (NO_LEADER, vec![b]));
    apply(&mut stm, back(b)).unwrap();
    assert_eq!(part(&stm, "single").leader, b);
}

/// Three brokers, and queues `q` (3 partitions, 3 replicas) and `single`
/// (3 partitions, 1 replica); the last log index used.
fn three_brokers_two_queues() -> (MetadataStm, u64) {
    let (mut stm, mut index) = brokers(3);
    for (name, rf) in [("q", 3), ("single", 1)] {
        let create = Command::CreateQueue {
            name: name.into(),
            settings: settings(3, rf),
        };
        stm.apply(index, &create).unwrap();
        index += 1;
    }
    (stm, index - 1)
}

#[test]
fn a_broker_shutting_down_hands_its_leaderships_to_the_isr_and_is_back_once_it_registers() {
    let (mut stm, mut index) = three_brokers_two_queues();
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        index += 1;
        stm.apply(index, &c)
    };
    let leads = |stm: &MetadataStm, id: NodeId| stm.table().led_by(id).count();
    let going = 1;
    assert!(leads(&stm, going) > 0);
    let before = stm.table().queues.clone();
    // A late entry from an earlier run changes nothing.
    let table = stm.table().clone();
    apply(
        &mut stm,
        Command::ShutdownBroker {
            id: going,
            incarnation: 7,
        },
    )
    .unwrap();
    assert_eq!(
        *stm.table(),
        MetadataTable {
            applied_index: stm.table().applied_index,
            ..table
        }
    );
    apply(
        &mut stm,
        Command::ShutdownBroker {
            id: going,
            incarnation: 1,
        },
    )
    .unwrap();
    assert!(!stm.table().brokers[&going].alive);
    for (name, q) in &stm.table().queues {
        for (p, (now, was)) in q.partitions.iter().zip(&before[name].partitions).enumerate() {
            if was.isr.len() > 1 {
                // Replicated: led by another in-sync replica, in a new
                // epoch if the leader changed; out of the ISR.
                assert_ne!(now.leader, going, "{name}/{p}");
                assert!(
                    now.isr.contains(&now.leader) && !now.isr.contains(&going),
                    "{name}/{p}: {now:?}"
                );
                assert_eq!(now.leader_epoch, was.leader_epoch + u32::from(was.leader == going));
            } else if was.leader == going {
                // Its only replica: offline until it is back.
                assert_eq!(now.leader, NO_LEADER, "{name}/{p}");
            } else {
                assert_eq!(now, was, "{name}/{p}");
            }
        }
    }
    // No new partition goes to it; registered again, it leads its offline
    // partitions and is placed on again.
    apply(
        &mut stm,
        Command::CreateQueue {
            name: "later".into(),
            settings: settings(3, 2),
        },
    )
    .unwrap();
    assert!(stm.table().queues["later"]
        .partitions
        .iter()
        .all(|p| !p.replicas.contains(&going)));
    apply(&mut stm, back(going)).unwrap();
    assert!(stm.table().brokers[&going].alive);
    assert!(stm.table().queues["single"]
        .partitions
        .iter()
        .all(|p| p.leader != NO_LEADER));
    // A broker the table does not know changes nothing.
    let table = stm.table().clone();
    apply(&mut stm, Command::ShutdownBroker { id: 9, incarnation: 1 }).unwrap();
    assert_eq!(stm.table().queues, table.queues);
}

#[test]
fn a_broker_registering_from_a_new_run_hands_its_leaderships_over_first() {
    let (mut stm, mut index) = three_brokers_two_queues();
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        index += 1;
        stm.apply(index, &c)
    };
    let restarted = 2;
    let before = stm.table().queues.clone();
    // The same run renewing: nothing moves.
    apply(&mut stm, back(restarted)).unwrap();
    assert_eq!(stm.table().queues, before);
    // A new run (kill -9 and back within its lease): it may have lost what
    // it had not fdatasync'd, so it leads no replicated partition in its
    // old epoch and is out of their ISRs until it catches up.
    let new_run = Command::RegisterBroker {
        id: restarted,
        address: format!("10.0.0.{restarted}:9400"),
        shards: 2,
        incarnation: 2,
        directory: 1,
    };
    apply(&mut stm, new_run).unwrap();
    assert!(stm.table().brokers[&restarted].alive);
    assert_eq!(stm.table().brokers[&restarted].incarnation, 2);
    for (name, q) in &stm.table().queues {
        for (p, (now, was)) in q.partitions.iter().zip(&before[name].partitions).enumerate() {
            if was.replicas.len() > 1 {
                assert!(!now.isr.contains(&restarted), "{name}/{p}: {now:?}");
                assert_ne!(now.leader, restarted, "{name}/{p}");
            } else if was.leader == restarted {
                // Its only replica holds all that was committed: it leads
                // on, in a new epoch.
                assert_eq!(
                    (now.leader, now.isr.clone()),
                    (restarted, was.isr.clone()),
                    "{name}/{p}"
                );
                assert_eq!(now.leader_epoch, was.leader_epoch + 1, "{name}/{p}");
            } else {
                assert_eq!(now, was, "{name}/{p}");
            }
        }
    }
}

#[test]
fn a_leader_that_lost_writes_hands_over_or_leads_on_in_a_new_epoch() {
    let (mut stm, mut index) = three_brokers_two_queues();
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        index += 1;
        stm.apply(index, &c)
    };
    let lost = |queue: &str, p: &PartitionRecord, epoch: u32| Command::LeaderLostWrites {
        queue: queue.into(),
        partition: 0,
        leader: p.leader,
        leader_epoch: epoch,
    };
    // Replicated: it leaves the ISR and another member leads.
    let was = stm.table().queues["q"].partitions[0].clone();
    // A late entry (an older epoch, or not the leader) changes nothing.
    let before = stm.table().queues.clone();
    apply(&mut stm, lost("q", &was, was.leader_epoch + 1)).unwrap();
    let not_leader = Command::LeaderLostWrites {
        queue: "q".into(),
        partition: 0,
        leader: was.leader % 3 + 1,
        leader_epoch: was.leader_epoch,
    };
    apply(&mut stm, not_leader).unwrap();
    assert_eq!(stm.table().queues, before);
    apply(&mut stm, lost("q", &was, was.leader_epoch)).unwrap();
    let now = &stm.table().queues["q"].partitions[0];
    assert!(!now.isr.contains(&was.leader) && now.isr.len() == 2, "{now:?}");
    assert!(now.leader != was.leader && now.isr.contains(&now.leader), "{now:?}");
    assert_eq!(now.leader_epoch, was.leader_epoch + 1);
    // The other partitions are untouched.
    assert_eq!(stm.table().queues["q"].partitions[1..], before["q"].partitions[1..]);
    assert_eq!(stm.table().queues["single"], before["single"]);
    // Alone in its ISR: it leads on, in a new epoch.
    let was = stm.table().queues["single"].partitions[0].clone();
    apply(&mut stm, lost("single", &was, was.leader_epoch)).unwrap();
    let now = &stm.table().queues["single"].partitions[0];
    assert_eq!((now.leader, &now.isr), (was.leader, &was.isr));
    assert_eq!(now.leader_epoch, was.leader_epoch + 1);
    // An unknown queue or partition is no error (the queue may be gone).
    let gone = Command::LeaderLostWrites {
        queue: "gone".into(),
        partition: 9,
        leader: 1,
        leader_epoch: 0,
    };
    apply(&mut stm, gone).unwrap();
}

#[test]
fn leaderships_go_back_to_preferred_replicas_that_are_alive_and_in_sync() {
    let (mut stm, mut index) = three_brokers_two_queues();
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        index += 1;
        stm.apply(index, &c)
    };
    assert!(
        MetadataStm::unbalanced_leaders(stm.table()).is_empty(),
        "placement leads with the first replica"
    );
    apply(&mut stm, Command::FenceBroker { id: 1, term: 0 }).unwrap();
    let moved: Vec<_> = stm.table().queues["q"]
        .partitions
        .iter()
        .filter(|p| p.replicas[0] == 1)
        .cloned()
        .collect();
    assert!(!moved.is_empty() && moved.iter().all(|p| p.leader != 1));
    // Back alive but not in sync: nothing to balance yet.
    apply(&mut stm, back(1)).unwrap();
    assert!(MetadataStm::unbalanced_leaders(stm.table()).is_empty());
    // In sync again (its leader let it in): it leads again, a new epoch.
    let at = stm.table().queues["q"]
        .partitions
        .iter()
        .position(|p| p.replicas[0] == 1)
        .unwrap();
    let p = stm.table().queues["q"].partitions[at].clone();
    let mut isr = p.isr.clone();
    isr.push(1);
    let alter = Command::AlterIsr {
        queue: "q".into(),
        partition: at as u32,
        leader: p.leader,
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
        isr,
    };
    apply(&mut stm, alter).unwrap();
    assert_eq!(MetadataStm::unbalanced_leaders(stm.table()), [(1, 1)].into());
    apply(&mut stm, Command::BalanceLeaders).unwrap();
    let now = &stm.table().queues["q"].partitions[at];
    assert_eq!((now.leader, now.leader_epoch), (1, p.leader_epoch + 1));
    assert!(MetadataStm::unbalanced_leaders(stm.table()).is_empty());
}

#[test]
fn a_draining_broker_hands_its_leaderships_over_stays_a_follower_and_leads_nothing_new() {
    let (mut stm, mut index) = three_brokers_two_queues();
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        index += 1;
        stm.apply(index, &c)
    };
    let leads = |stm: &MetadataStm, id: NodeId| stm.table().led_by(id).count();
    let drained = 2;
    assert!(leads(&stm, drained) > 0);
    let unknown = apply(&mut stm, Command::DrainBroker { id: 9, draining: true });
    assert_eq!(unknown, Err(ControllerError::UnknownBroker(9)));
    let before = stm.table().queues.clone();
    apply(
        &mut stm,
        Command::DrainBroker {
            id: drained,
            draining: true,
        },
    )
    .unwrap();
    assert!(stm.table().brokers[&drained].draining);
    for (name, q) in &stm.table().queues {
        for (p, (now, was)) in q.partitions.iter().zip(&before[name].partitions).enumerate() {
            assert_eq!(now.isr, was.isr, "{name}/{p}: the ISR is kept");
            if was.leader != drained {
                assert_eq!(now, was, "{name}/{p}: untouched");
            } else if was.isr == [drained] {
                // Nobody else holds it: it keeps leading (maintenance
                // yields to availability).
                assert_eq!(
                    (now.leader, now.leader_epoch),
                    (drained, was.leader_epoch),
                    "{name}/{p}"
                );
            } else {
                assert!(
                    now.leader != drained && now.isr.contains(&now.leader),
                    "{name}/{p}: {now:?}"
                );
                assert_eq!(now.leader_epoch, was.leader_epoch + 1, "{name}/{p}");
            }
        }
    }
    // Balancing gives it nothing back, and new partitions are not led by it.
    assert!(MetadataStm::unbalanced_leaders(stm.table()).is_empty());
    let create = Command::CreateQueue {
        name: "later".into(),
        settings: settings(6, 3),
    };
    apply(&mut stm, create).unwrap();
    let later = stm.table().queues["later"].clone();
    assert!(later
        .partitions
        .iter()
        .all(|p| p.leader != drained && p.replicas.contains(&drained)));
    // A restart keeps it in maintenance; a failover prefers another replica.
    apply(&mut stm, back(drained)).unwrap();
    assert!(stm.table().brokers[&drained].draining);
    let other = later.partitions[0].leader;
    apply(&mut stm, Command::FenceBroker { id: other, term: 0 }).unwrap();
    let p0 = &stm.table().queues["later"].partitions[0];
    assert!(p0.leader != drained && p0.leader != other, "{p0:?}");
    // Undrained: balancing hands its preferred leaderships back.
    apply(
        &mut stm,
        Command::DrainBroker {
            id: drained,
            draining: false,
        },
    )
    .unwrap();
    let to = MetadataStm::unbalanced_leaders(stm.table());
    assert!(to.get(&drained).is_some_and(|n| *n > 0), "{to:?}");
}

#[test]
fn a_draining_leader_hands_over_once_another_replica_is_in_sync_again() {
    let (mut stm, mut index) = three_brokers_two_queues();
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        index += 1;
        stm.apply(index, &c)
    };
    let drained = 2;
    let at = stm.table().queues["q"]
        .partitions
        .iter()
        .position(|p| p.leader == drained)
        .unwrap();
    let alter = |stm: &MetadataStm, isr: Vec<NodeId>| {
        let p = &stm.table().queues["q"].partitions[at];
        Command::AlterIsr {
            queue: "q".into(),
            partition: at as u32,
            leader: p.leader,
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
            isr,
        }
    };
    // Its followers fell behind: it is the partition's only in-sync replica.
    let shrink = alter(&stm, vec![drained]);
    apply(&mut stm, shrink).unwrap();
    apply(
        &mut stm,
        Command::DrainBroker {
            id: drained,
            draining: true,
        },
    )
    .unwrap();
    assert_eq!(
        stm.table().queues["q"].partitions[at].leader,
        drained,
        "nobody else can lead"
    );
    assert!(MetadataStm::unbalanced_leaders(stm.table()).is_empty());
    // They caught up: balancing moves the leadership off the draining broker.
    let replicas = stm.table().queues["q"].partitions[at].replicas.clone();
    let grow = alter(&stm, replicas);
    apply(&mut stm, grow).unwrap();
    assert_eq!(MetadataStm::unbalanced_leaders(stm.table()).values().sum::<usize>(), 1);
    apply(&mut stm, Command::BalanceLeaders).unwrap();
    let now = &stm.table().queues["q"].partitions[at];
    assert!(now.leader != drained && now.isr.contains(&now.leader), "{now:?}");
}

/// The `AlterIsr` the leader of `queue`/`partition` would send to make its
/// ISR `isr`.
fn alter_isr(stm: &MetadataStm, queue: &str, partition: u32, isr: Vec<NodeId>) -> Command {
    let p = &stm.table().queues[queue].partitions[partition as usize];
    Command::AlterIsr {
        queue: queue.into(),
        partition,
        leader: p.leader,
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
        isr,
    }
}

/// Moving partition 0 of "q" to `replicas`.
fn reassign(replicas: Vec<NodeId>) -> Command {
    Command::ReassignPartition {
        queue: "q".into(),
        partition: 0,
        replicas,
    }
}

/// Every reassignment in progress completes as the leaders would have it:
/// each target replica joins the ISR (one `AlterIsr` per partition).
fn catch_up_all(stm: &mut MetadataStm, index: &mut u64) {
    let moving: Vec<(String, u32, Vec<NodeId>)> = stm
        .table()
        .queues
        .iter()
        .flat_map(|(name, q)| {
            q.partitions.iter().enumerate().filter_map(move |(i, p)| {
                let target = p.target.as_ref()?;
                let mut isr = p.isr.clone();
                isr.extend(target.iter().filter(|r| !p.isr.contains(r)));
                Some((name.clone(), i as u32, isr))
            })
        })
        .collect();
    for (queue, partition, isr) in moving {
        *index += 1;
        let command = alter_isr(stm, &queue, partition, isr);
        stm.apply(*index, &command).unwrap();
    }
}

#[test]
fn a_reassignment_adds_the_new_replicas_and_removes_the_old_once_they_are_in_sync() {
    let (mut stm, mut index) = brokers_and_queue(4, 1, 3);
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        index += 1;
        stm.apply(index, &c)
    };
    let was = stm.table().queues["q"].partitions[0].clone();
    let leaving = was.leader;
    let staying: Vec<NodeId> = was.replicas.iter().copied().filter(|r| *r != leaving).collect();
    let newcomer = (1..=4).find(|id| !was.replicas.contains(id)).unwrap();
    let target = vec![newcomer, staying[0], staying[1]];
    apply(&mut stm, reassign(target.clone())).unwrap();
    let p = stm.table().queues["q"].partitions[0].clone();
    assert_eq!(p.target.as_ref(), Some(&target));
    assert_eq!(
        p.replicas,
        vec![newcomer, staying[0], staying[1], leaving],
        "target first"
    );
    assert_eq!(
        (p.leader, p.leader_epoch),
        (leaving, was.leader_epoch),
        "nothing moves yet"
    );
    assert!(!p.isr.contains(&newcomer));
    // The leader's ISR changes may now name the new replica...
    let join = alter_isr(&stm, "q", 0, p.replicas.clone());
    apply(&mut stm, join).unwrap();
    // ...and once it is in, the move completes: the old replica leaves, and
    // leadership goes to the target's first in-sync alive replica.
    let p = stm.table().queues["q"].partitions[0].clone();
    assert_eq!(p.target, None);
    assert_eq!(p.replicas, target);
    assert_eq!(p.isr, target);
    assert_eq!(p.leader, newcomer);
    assert_eq!(p.leader_epoch, was.leader_epoch + 1);
    // A reassignment to the replicas it has completes at once.
    let epoch = p.partition_epoch;
    apply(&mut stm, reassign(target.clone())).unwrap();
    let p = &stm.table().queues["q"].partitions[0];
    assert_eq!((p.target.as_ref(), &p.replicas, p.leader), (None, &target, newcomer));
    assert!(p.partition_epoch > epoch);
}

#[test]
fn a_reassignment_in_progress_can_be_replaced_and_bad_ones_are_refused() {
    let (mut stm, mut index) = brokers_and_queue(5, 2, 3);
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        index += 1;
        stm.apply(index, &c)
    };
    let before = stm.table().clone();
    let refused = [
        reassign(vec![1, 2]),
        reassign(vec![1, 1, 2]),
        reassign(vec![1, 2, 9]),
        Command::ReassignPartition {
            queue: "q".into(),
            partition: 7,
            replicas: vec![1, 2, 3],
        },
        Command::ReassignPartition {
            queue: "nope".into(),
            partition: 0,
            replicas: vec![1, 2, 3],
        },
    ];
    for c in refused {
        let r = apply(&mut stm, c.clone());
        assert!(r.is_err(), "{c:?}");
        assert_eq!(stm.table().queues, before.queues, "{c:?} changed nothing");
    }
    assert_eq!(
        apply(&mut stm, reassign(vec![1, 2, 9])),
        Err(ControllerError::UnknownBroker(9))
    );
    // A fenced broker cannot be a new replica.
    let original = stm.table().queues["q"].partitions[0].replicas.clone();
    let outsider = (1..=5).find(|id| !original.contains(id)).unwrap();
    apply(&mut stm, Command::FenceBroker { id: outsider, term: 0 }).unwrap();
    let mut to = original.clone();
    to[2] = outsider;
    assert!(matches!(
        apply(&mut stm, reassign(to.clone())),
        Err(ControllerError::InvalidReassignment(_))
    ));
    apply(&mut stm, back(outsider)).unwrap();
    // Moving to the outsider, then changing one's mind: back to the original
    // replicas completes at once, without the outsider.
    apply(&mut stm, reassign(to)).unwrap();
    assert!(stm.table().queues["q"].partitions[0].replicas.contains(&outsider));
    apply(&mut stm, reassign(original.clone())).unwrap();
    let p = &stm.table().queues["q"].partitions[0];
    assert_eq!((&p.replicas, &p.target), (&original, &None));
}

#[test]
fn decommissioning_moves_every_replica_off_the_broker_and_keeps_leaders_spread() {
    let (mut stm, mut index) = brokers(4);
    index -= 1;
    for (name, partitions) in [("a", 8), ("b", 5)] {
        index += 1;
        let create = Command::CreateQueue {
            name: name.into(),
            settings: settings(partitions, 3),
        };
        stm.apply(index, &create).unwrap();
    }
    let leaving = 4;
    let held = load(&stm)[&leaving].1;
    assert!(held > 0);
    index += 1;
    stm.apply(index, &Command::DecommissionBroker { id: leaving }).unwrap();
    assert!(stm.table().brokers[&leaving].decommissioning);
    assert_eq!(
        stm.table().led_by(leaving).count(),
        0,
        "it hands its leaderships over at once"
    );
    let moving = |stm: &MetadataStm| {
        stm.table()
            .queues
            .values()
            .flat_map(|q| &q.partitions)
            .filter(|p| p.target.is_some())
            .count()
    };
    assert_eq!(moving(&stm), held);
    // New partitions avoid it.
    index += 1;
    let later = Command::CreateQueue {
        name: "later".into(),
        settings: settings(4, 3),
    };
    stm.apply(index, &later).unwrap();
    assert!(stm.table().queues["later"]
        .partitions
        .iter()
        .all(|p| !p.replicas.contains(&leaving)));
    catch_up_all(&mut stm, &mut index);
    assert_eq!(moving(&stm), 0);
    let load = load(&stm);
    assert_eq!(load.get(&leaving), None, "it holds nothing: {load:?}");
    for q in stm.table().queues.values() {
        for p in &q.partitions {
            assert_eq!(p.replicas.len(), 3);
            assert_eq!(p.isr, p.replicas);
        }
    }
    // Balancing spreads the leaders over the three left: 17 partitions.
    index += 1;
    stm.apply(index, &Command::BalanceLeaders).unwrap();
    let leaders: Vec<usize> = (1..=3).map(|id| stm.table().led_by(id).count()).collect();
    assert!(leaders.iter().all(|n| (5..=6).contains(n)), "{leaders:?}");
    // It stays decommissioned across a restart.
    index += 1;
    stm.apply(index, &back(leaving)).unwrap();
    assert!(stm.table().brokers[&leaving].decommissioning);
}

#[test]
fn a_cancelled_decommission_moves_back_what_is_still_moving_and_keeps_what_moved() {
    let (mut stm, mut index) = brokers_and_queue(4, 8, 3);
    let leaving = 4;
    let before = stm.table().queues["q"].partitions.clone();
    let held: Vec<usize> = (0..before.len())
        .filter(|i| before[*i].replicas.contains(&leaving))
        .collect();
    assert!(held.len() >= 2, "{before:?}");
    index += 1;
    stm.apply(index, &Command::DecommissionBroker { id: leaving }).unwrap();
    // One move completes (its new replica caught up); the others do not.
    let done = held[0];
    let p = &stm.table().queues["q"].partitions[done];
    let mut isr = p.isr.clone();
    isr.extend(p.target.clone().unwrap().iter().filter(|r| !p.isr.contains(r)));
    index += 1;
    let caught_up = alter_isr(&stm, "q", done as u32, isr);
    stm.apply(index, &caught_up).unwrap();
    let moved = stm.table().queues["q"].partitions[done].clone();
    assert!(
        moved.target.is_none() && !moved.replicas.contains(&leaving),
        "{moved:?}"
    );
    assert!(moved.decommission_moves.is_empty());

    index += 1;
    stm.apply(index, &Command::CancelDecommission { id: leaving }).unwrap();
    assert!(!stm.table().brokers[&leaving].decommissioning);
    let after = &stm.table().queues["q"].partitions;
    assert_eq!(after[done].replicas, moved.replicas, "a completed move stays");
    for i in &held[1..] {
        let p = &after[*i];
        assert_eq!(
            p.replicas, before[*i].replicas,
            "partition {i} back where it was: {p:?}"
        );
        assert!(p.target.is_none() && p.decommission_moves.is_empty(), "{p:?}");
    }
    // It takes replicas again, and a second cancel changes nothing.
    let table = stm.table().clone();
    index += 1;
    stm.apply(index, &Command::CancelDecommission { id: leaving }).unwrap();
    assert_eq!(stm.table().queues, table.queues);
    index += 1;
    let later = Command::CreateQueue {
        name: "later".into(),
        settings: settings(8, 3),
    };
    stm.apply(index, &later).unwrap();
    assert!(stm.table().queues["later"]
        .partitions
        .iter()
        .any(|p| p.replicas.contains(&leaving)));
    assert_eq!(
        stm.apply(index + 1, &Command::CancelDecommission { id: 9 }),
        Err(ControllerError::UnknownBroker(9))
    );
}

/// Review of the first cut: a cancel moved back every partition a
/// decommission had touched, also those moved off another broker still
/// leaving.
#[test]
fn cancelling_one_decommission_leaves_another_going_on() {
    let (mut stm, mut index) = brokers_and_queue(6, 12, 3);
    let before = stm.table().queues["q"].partitions.clone();
    for id in [5, 6] {
        index += 1;
        stm.apply(index, &Command::DecommissionBroker { id }).unwrap();
    }
    index += 1;
    stm.apply(index, &Command::CancelDecommission { id: 6 }).unwrap();
    let table = stm.table();
    assert!(table.brokers[&5].decommissioning && !table.brokers[&6].decommissioning);
    for (i, p) in table.queues["q"].partitions.iter().enumerate() {
        let ends_with = p.target.as_ref().unwrap_or(&p.replicas);
        assert!(!ends_with.contains(&5), "partition {i} still heads for broker 5: {p:?}");
        if !before[i].replicas.contains(&5) {
            assert_eq!(ends_with, &before[i].replicas, "partition {i} back where it was: {p:?}");
        }
    }
}

#[test]
fn a_decommission_the_others_cannot_absorb_is_refused_whole() {
    let (mut stm, index) = three_brokers_two_queues();
    let before = stm.table().clone();
    let refused = stm.apply(index + 1, &Command::DecommissionBroker { id: 2 });
    assert!(
        matches!(
            refused,
            Err(ControllerError::CannotDecommission { id: 2, wanted: 3, .. })
        ),
        "{refused:?}"
    );
    assert_eq!(stm.table().queues, before.queues);
    assert_eq!(stm.table().brokers, before.brokers);
    assert_eq!(
        stm.apply(index + 2, &Command::DecommissionBroker { id: 7 }),
        Err(ControllerError::UnknownBroker(7))
    );
}

#[test]
fn a_reassignment_survives_a_snapshot() {
    let (mut stm, index) = brokers_and_queue(4, 2, 3);
    stm.apply(index + 1, &Command::DecommissionBroker { id: 1 }).unwrap();
    assert!(stm.table().queues["q"].partitions.iter().any(|p| p.target.is_some()));
    let mut restored = MetadataStm::new();
    restored.restore(&stm.snapshot()).unwrap();
    assert_eq!(restored, stm);
}

/// Broker `id` registering from a new run with data directory `directory`.
fn with_directory(id: NodeId, incarnation: u64, directory: u64) -> Command {
    Command::RegisterBroker {
        id,
        address: format!("10.0.0.{id}:9400"),
        shards: 2,
        incarnation,
        directory,
    }
}

/// Issue 41, item 1: the last in-sync replica of a partition is killed,
/// its disk wiped, and it comes back. It must not lead that partition
/// from an empty log (its followers would truncate to it: every
/// acknowledged record gone); the partition waits offline for the old
/// disk or an operator's unclean election. Where others are in sync, the
/// broker just leaves the ISR.
#[test]
fn a_broker_back_with_a_wiped_disk_leads_nothing_and_its_sole_partitions_wait() {
    let (mut stm, mut index) = three_brokers_two_queues();
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        index += 1;
        stm.apply(index, &c)
    };
    // q/0's ISR shrinks to its leader alone (its followers paused).
    let led = stm.table().queues["q"].partitions[0].clone();
    let wiped = led.leader;
    let shrink = alter_isr(&stm, "q", 0, vec![wiped]);
    apply(&mut stm, shrink).unwrap();
    let before = stm.table().clone();
    // Killed, its disk wiped, started again: a new run, a new directory.
    apply(&mut stm, with_directory(wiped, 2, 2)).unwrap();
    let t = stm.table();
    assert_eq!(t.brokers[&wiped].directory, 2);
    assert!(t.brokers[&wiped].alive);
    let p = &t.queues["q"].partitions[0];
    assert_eq!((p.leader, p.isr.clone()), (NO_LEADER, vec![]), "{p:?}");
    assert_eq!(
        p.lost,
        Some(LostReplica {
            broker: wiped,
            directory: 1,
            after: 1
        })
    );
    assert!(p.leader_epoch > led.leader_epoch && p.partition_epoch > before.queues["q"].partitions[0].partition_epoch);
    // Everywhere else it is out of every ISR and leads nothing; its RF 1
    // partitions wait too.
    for (name, q) in &t.queues {
        for (i, p) in q.partitions.iter().enumerate() {
            assert!(!p.isr.contains(&wiped) && p.leader != wiped, "{name}/{i}: {p:?}");
            let was = &before.queues[name].partitions[i];
            if was.isr == [wiped] {
                assert_eq!(p.lost.map(|l| l.broker), Some(wiped), "{name}/{i}");
            } else {
                assert!(p.lost.is_none() && p.leader != NO_LEADER, "{name}/{i}: {p:?}");
            }
        }
    }
    // The followers come back (they were paused, not restarted): nothing
    // makes them leaders, they hold no proof of every committed record.
    for id in (1..=3).filter(|id| *id != wiped) {
        apply(&mut stm, back(id)).unwrap();
        apply(&mut stm, with_directory(id, 1, 1)).unwrap();
    }
    apply(&mut stm, Command::BalanceLeaders).unwrap();
    assert_eq!(stm.table().queues["q"].partitions[0].leader, NO_LEADER);
    // Restarting again on the same new disk changes nothing for it.
    apply(&mut stm, with_directory(wiped, 3, 2)).unwrap();
    assert_eq!(stm.table().queues["q"].partitions[0].leader, NO_LEADER);
    // The old disk mounted again: the broker holds everything q/0
    // committed, and leads it again.
    let waiting = stm.table().queues["q"].partitions[0].clone();
    apply(&mut stm, with_directory(wiped, 4, 1)).unwrap();
    let p = &stm.table().queues["q"].partitions[0];
    assert_eq!((p.leader, p.isr.clone(), p.lost), (wiped, vec![wiped], None));
    assert_eq!(p.leader_epoch, waiting.leader_epoch + 1);
    assert_eq!(stm.table().unclean_elections, 0);
}

#[test]
fn a_broker_without_a_directory_id_changes_nothing() {
    let (mut stm, mut index) = three_brokers_two_queues();
    index += 1;
    // An older broker (no id): the recorded one stays, as a new run would.
    stm.apply(index, &with_directory(2, 1, 0)).unwrap();
    assert_eq!(stm.table().brokers[&2].directory, 1);
    // A table from before directory ids (none recorded) takes the first
    // id as it comes: nothing is lost.
    let mut restored = MetadataStm::new();
    let mut snapshot: serde_json::Value = serde_json::from_slice(&stm.snapshot()).unwrap();
    for b in snapshot["brokers"].as_object_mut().unwrap().values_mut() {
        b.as_object_mut().unwrap().remove("directory");
    }
    restored.restore(&serde_json::to_vec(&snapshot).unwrap()).unwrap();
    assert_eq!(restored.table().brokers[&1].directory, 0);
    let queues = restored.table().queues.clone();
    restored.apply(index + 1, &with_directory(1, 1, 5)).unwrap();
    assert_eq!(restored.table().brokers[&1].directory, 5);
    assert_eq!(restored.table().queues, queues);
}

/// Issue 41 (a 30-minute strand-chaos run lost 41,173 acknowledged
/// records): a replica that found its log damaged at open must not lead
/// or stay in sync on its word. Shared with others, it leaves the ISR (and
/// its leadership); alone in it, the partition goes offline waiting for an
/// unclean election (before, it led its cut log and the others truncated
/// to it). A late report (another partition epoch) or one from a replica
/// outside the ISR changes nothing.
#[test]
fn a_damaged_replica_leaves_the_isr_and_alone_in_it_takes_its_partition_offline() {
    let (mut stm, mut index) = three_brokers_two_queues();
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        index += 1;
        stm.apply(index, &c)
    };
    let damaged = |stm: &MetadataStm, partition: u32, broker: NodeId| {
        let p = &stm.table().queues["q"].partitions[partition as usize];
        Command::ReplicaDamaged {
            queue: "q".into(),
            partition,
            broker,
            partition_epoch: p.partition_epoch,
        }
    };
    // Shared: the leader of q/1 leaves the ISR, another member leads.
    let before = stm.table().queues["q"].partitions[1].clone();
    let report = damaged(&stm, 1, before.leader);
    apply(&mut stm, report.clone()).unwrap();
    let p = stm.table().queues["q"].partitions[1].clone();
    assert!(!p.isr.contains(&before.leader) && p.isr.len() == 2, "{p:?}");
    assert!(p.leader != before.leader && p.isr.contains(&p.leader), "{p:?}");
    assert!(p.leader_epoch > before.leader_epoch && p.lost.is_none(), "{p:?}");
    // Repeated (late): nothing changes.
    apply(&mut stm, report).unwrap();
    assert_eq!(stm.table().queues["q"].partitions[1], p);
    // Alone: q/0's ISR is its leader, whose log is damaged.
    let sole = stm.table().queues["q"].partitions[0].leader;
    let shrink = alter_isr(&stm, "q", 0, vec![sole]);
    apply(&mut stm, shrink).unwrap();
    let follower = stm.table().queues["q"].partitions[0]
        .replicas
        .iter()
        .copied()
        .find(|r| *r != sole)
        .unwrap();
    let outside = damaged(&stm, 0, follower);
    let stale = Command::ReplicaDamaged {
        queue: "q".into(),
        partition: 0,
        broker: sole,
        partition_epoch: stm.table().queues["q"].partitions[0].partition_epoch - 1,
    };
    let before = stm.table().queues["q"].partitions[0].clone();
    apply(&mut stm, outside).unwrap();
    apply(&mut stm, stale).unwrap();
    assert_eq!(stm.table().queues["q"].partitions[0], before, "not in the ISR, or late");
    let report = damaged(&stm, 0, sole);
    apply(&mut stm, report).unwrap();
    let p = stm.table().queues["q"].partitions[0].clone();
    assert_eq!((p.leader, p.isr.clone()), (NO_LEADER, vec![]), "{p:?}");
    assert_eq!(p.lost.map(|l| (l.broker, l.directory)), Some((sole, 0)));
    assert!(p.leader_epoch > before.leader_epoch);
    // Its broker's next run does not bring it back; an unclean election
    // takes another replica.
    apply(&mut stm, with_directory(sole, 2, 1)).unwrap();
    assert_eq!(stm.table().queues["q"].partitions[0].leader, NO_LEADER);
    let elect = Command::ElectUnclean {
        queue: "q".into(),
        partition: Some(0),
        replica: None,
    };
    apply(&mut stm, elect).unwrap();
    let p = &stm.table().queues["q"].partitions[0];
    assert!(
        p.leader != sole && p.leader != NO_LEADER && p.isr == [p.leader],
        "{p:?}"
    );
}

#[test]
fn an_unclean_election_leads_an_offline_partition_with_a_replica_that_kept_its_data() {
    let (mut stm, mut index) = three_brokers_two_queues();
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        index += 1;
        stm.apply(index, &c)
    };
    let wiped = stm.table().queues["q"].partitions[0].leader;
    let shrink = alter_isr(&stm, "q", 0, vec![wiped]);
    apply(&mut stm, shrink).unwrap();
    apply(&mut stm, with_directory(wiped, 2, 2)).unwrap();
    let elect = |partition, replica| Command::ElectUnclean {
        queue: "q".into(),
        partition,
        replica,
    };
    let refused = |r: Result<(), ControllerError>| match r {
        Err(ControllerError::ElectionRefused(why)) => why,
        other => panic!("not refused: {other:?}"),
    };
    // A partition with a leader: nothing to elect.
    let why = refused(apply(&mut stm, elect(Some(1), None)));
    assert!(why.contains("q/1 has a leader"), "{why}");
    let why = refused(apply(&mut stm, elect(Some(7), None)));
    assert!(why.contains("no 7"), "{why}");
    let why = refused(apply(&mut stm, elect(Some(0), Some(9))));
    assert!(why.contains("broker 9 is not a replica"), "{why}");
    apply(&mut stm, elect(None, None)).unwrap();
    let p = &stm.table().queues["q"].partitions[0];
    // Not the broker known to have lost the data: a follower, which holds
    // what it had fetched.
    assert!(p.leader != wiped && p.leader != NO_LEADER, "{p:?}");
    assert_eq!((p.isr.clone(), p.lost), (vec![p.leader], None));
    assert_eq!(stm.table().unclean_elections, 1);
    // Nothing is offline now.
    let why = refused(apply(&mut stm, elect(None, None)));
    assert!(why.contains("no partition of q is offline"), "{why}");
    // A fenced replica is not elected when named.
    let single = stm.table().queues["single"].partitions[0].clone();
    let only = single.replicas[0];
    apply(&mut stm, Command::FenceBroker { id: only, term: 0 }).unwrap();
    let named = Command::ElectUnclean {
        queue: "single".into(),
        partition: Some(0),
        replica: Some(only),
    };
    let why = refused(apply(&mut stm, named));
    assert!(why.contains("is not alive"), "{why}");
    let any = Command::ElectUnclean {
        queue: "single".into(),
        partition: Some(0),
        replica: None,
    };
    let why = refused(apply(&mut stm, any));
    assert!(why.contains("no replica of single/0 is alive"), "{why}");
    assert_eq!(
        ControllerError::ElectionRefused(why).code(),
        strand_wire::ErrorCode::InvalidRequest
    );
}

/// A second replica's disk wiped after the partition went offline (a
/// strand-chaos run: two wipes in a row) holds nothing of it either: the
/// unclean election takes the replica that kept its directory, not the
/// first in replica order.
#[test]
fn an_unclean_election_passes_over_a_replica_wiped_after_the_partition_went_offline() {
    let (mut stm, mut index) = three_brokers_two_queues();
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        index += 1;
        stm.apply(index, &c)
    };
    let p0 = stm.table().queues["q"].partitions[0].clone();
    let wiped = p0.leader;
    let shrink = alter_isr(&stm, "q", 0, vec![wiped]);
    apply(&mut stm, shrink).unwrap();
    apply(&mut stm, with_directory(wiped, 2, 2)).unwrap();
    // The first other replica in order loses its disk too.
    let others: Vec<NodeId> = p0.replicas.iter().copied().filter(|r| *r != wiped).collect();
    apply(&mut stm, with_directory(others[0], 2, 3)).unwrap();
    assert_eq!(stm.table().directories_replaced, 2);
    let p = &stm.table().queues["q"].partitions[0];
    assert_eq!(p.lost.map(|l| (l.broker, l.after)), Some((wiped, 1)), "{p:?}");
    apply(
        &mut stm,
        Command::ElectUnclean {
            queue: "q".into(),
            partition: Some(0),
            replica: None,
        },
    )
    .unwrap();
    let p = &stm.table().queues["q"].partitions[0];
    assert_eq!(p.leader, others[1], "{p:?}");
}

fn once(node: NodeId, run: u64, seq: u64, settled_below: u64, command: Command) -> Command {
    Command::Once {
        id: ProposalId {
            node,
            run,
            seq,
            settled_below,
        },
        command: Box::new(command),
    }
}

/// A proposer that lost the answer to a proposal sends it again; the copy
/// answers what the first did and changes nothing (before proposal ids, a
/// `queue create` whose forwarded answer was lost came back
/// `QueueAlreadyExists` although it had created the queue).
#[test]
fn a_proposal_committed_twice_applies_once() {
    let (mut stm, mut i) = one_node();
    let create = once(
        1,
        7,
        1,
        1,
        Command::CreateQueue {
            name: "orders".into(),
            settings: settings(1, 1),
        },
    );
    assert_eq!(stm.apply(i, &create), Ok(()));
    i += 1;
    let created = stm.table().clone();
    assert_eq!(stm.apply(i, &create), Ok(()), "the copy answers as the first did");
    i += 1;
    assert_eq!(stm.table().queues, created.queues);
    // A refusal is answered again as a refusal.
    let alter = once(
        1,
        7,
        2,
        1,
        Command::AlterQueue {
            name: "nope".into(),
            changes: QueueChanges::default(),
        },
    );
    let refused = Err(ControllerError::UnknownQueue("nope".into()));
    assert_eq!(stm.apply(i, &alter), refused);
    i += 1;
    assert_eq!(stm.apply(i, &alter), refused);
    i += 1;
    // The same numbers from another run or node are other proposals.
    let delete = |node, run| once(node, run, 1, 1, Command::DeleteQueue { name: "orders".into() });
    assert_eq!(stm.apply(i, &delete(1, 8)), Ok(()));
    i += 1;
    assert_eq!(
        stm.apply(i, &delete(2, 7)),
        Err(ControllerError::UnknownQueue("orders".into()))
    );
    i += 1;
    // Every member and every snapshot decides a copy the same way.
    let mut restored = MetadataStm::new();
    restored.restore(&stm.snapshot()).unwrap();
    assert_eq!(restored.apply(i, &create), Ok(()));
    assert_eq!(restored.table().queue("orders"), None);
}

/// Once the proposer says it sends nothing below a number again, those
/// answers are forgotten, and a copy committed that late is refused.
#[test]
fn a_settled_proposal_is_forgotten_and_a_late_copy_refused() {
    let (mut stm, mut i) = one_node();
    let create = |seq, settled_below, name: &str| {
        once(
            1,
            7,
            seq,
            settled_below,
            Command::CreateQueue {
                name: name.into(),
                settings: settings(1, 1),
            },
        )
    };
    stm.apply(i, &create(1, 1, "a")).unwrap();
    i += 1;
    stm.apply(i, &create(2, 1, "b")).unwrap();
    i += 1;
    assert_eq!(stm.table().proposals[0].answered.len(), 2);
    stm.apply(i, &create(3, 3, "c")).unwrap();
    i += 1;
    let session = &stm.table().proposals[0];
    assert_eq!((session.settled_below, session.answered.len()), (3, 1));
    stm.apply(i, &Command::DeleteQueue { name: "a".into() }).unwrap();
    i += 1;
    assert!(matches!(
        stm.apply(i, &create(1, 1, "a")),
        Err(ControllerError::InvalidProposal(_))
    ));
    assert_eq!(stm.table().queue("a"), None, "the late copy created nothing");
    i += 1;
    // Nested ids are refused.
    assert!(matches!(
        stm.apply(i, &once(1, 7, 9, 3, create(10, 3, "d"))),
        Err(ControllerError::InvalidProposal(_))
    ));
}

/// A node keeps a few runs' sessions (the least recently proposing goes).
#[test]
fn each_node_keeps_a_bounded_number_of_runs() {
    let (mut stm, mut i) = one_node();
    for run in 0..10 {
        for node in 1..=2 {
            stm.apply(
                i,
                &once(node, run, 1, 1, Command::DrainBroker { id: 1, draining: false }),
            )
            .unwrap();
            i += 1;
        }
    }
    let runs = |node| {
        let mut runs: Vec<u64> = stm
            .table()
            .proposals
            .iter()
            .filter(|s| s.node == node)
            .map(|s| s.run)
            .collect();
        runs.sort();
        runs
    };
    assert_eq!(runs(1), (2..10).collect::<Vec<u64>>());
    assert_eq!(runs(2), (2..10).collect::<Vec<u64>>());
}

fn credential(password: &str) -> Vec<StoredCredential> {
    let c = strand_net::scram::Credential::generate(
        strand_net::scram::Mechanism::Sha256,
        password.as_bytes(),
        strand_net::scram::MIN_ITERATIONS,
    )
    .unwrap();
    vec![StoredCredential::from_credential(&c)]
}

/// Users and their ACLs: created, replaced, deleted with their entries;
/// the first superusers only while the cluster never had a user.
#[test]
fn users_acls_and_the_bootstrap_apply_as_documented() {
    use crate::controller::acls::{Operation, ResourcePattern};
    let (mut stm, mut i) = one_node();
    let mut apply = |stm: &mut MetadataStm, c: Command| {
        let r = stm.apply(i, &c);
        i += 1;
        r
    };
    let boot = |name: &str| Command::BootstrapUsers {
        users: vec![(name.to_string(), credential("first"))],
    };
    apply(&mut stm, boot("admin")).unwrap();
    assert!(stm.table().users.contains_key("admin") && stm.table().had_users);
    apply(&mut stm, Command::DeleteUser { name: "admin".into() }).unwrap();
    apply(&mut stm, boot("admin")).unwrap();
    assert!(stm.table().users.is_empty(), "a second bootstrap changes nothing");
    let put = |name: &str| Command::PutUser {
        name: name.into(),
        credentials: credential("pw"),
    };
    apply(&mut stm, put("alice")).unwrap();
    assert!(matches!(
        apply(
            &mut stm,
            Command::PutUser {
                name: "bad".into(),
                credentials: Vec::new()
            }
        ),
        Err(ControllerError::InvalidUser(_))
    ));
    let acl = |op, resource| Command::AddAcl {
        entry: AclEntry {
            user: "alice".into(),
            operation: op,
            resource,
        },
    };
    apply(&mut stm, acl(Operation::Produce, ResourcePattern::Queue("q".into()))).unwrap();
    apply(&mut stm, acl(Operation::Produce, ResourcePattern::Queue("q".into()))).unwrap();
    apply(&mut stm, acl(Operation::Consume, ResourcePattern::Group("g".into()))).unwrap();
    assert_eq!(stm.table().acls.len(), 2, "an entry added twice is there once");
    assert!(matches!(
        apply(&mut stm, acl(Operation::Admin, ResourcePattern::Queue("q".into()))),
        Err(ControllerError::InvalidAcl(_))
    ));
    let Command::AddAcl { entry } = acl(Operation::Consume, ResourcePattern::Group("g".into())) else {
        unreachable!()
    };
    apply(&mut stm, Command::RemoveAcl { entry: entry.clone() }).unwrap();
    assert!(matches!(
        apply(&mut stm, Command::RemoveAcl { entry }),
        Err(ControllerError::UnknownAcl(_))
    ));
    assert_eq!(stm.table().acls.len(), 1);
    apply(&mut stm, Command::DeleteUser { name: "alice".into() }).unwrap();
    assert!(stm.table().acls.is_empty(), "a deleted user's ACLs go with it");
    assert!(matches!(
        apply(&mut stm, Command::DeleteUser { name: "alice".into() }),
        Err(ControllerError::UnknownUser(_))
    ));
    // Kept in snapshots.
    apply(&mut stm, put("bob")).unwrap();
    let mut restored = MetadataStm::new();
    restored.restore(&stm.snapshot()).unwrap();
    assert_eq!(restored.table(), stm.table());
}
