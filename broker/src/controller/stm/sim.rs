//! A seeded simulation of the controller's state machine: random commands
//! (brokers registering from new runs, with a new data directory (a wiped
//! disk) or an earlier one (a disk mounted again), fenced, shut down,
//! drained, decommissioned; unclean elections; queues created, grown, deleted; partitions reassigned;
//! leaders' ISR changes, some stale; leader balancing) applied in a random
//! order, with the table's invariants checked after every step, and a
//! snapshot restored at random points that must apply on identically.
//! Half the commands carry a proposal id ([`Command::Once`]), and copies
//! of recent ones are committed again: a copy must change nothing and
//! answer what its first did.
//! Thousands of seeds run in a few seconds of `cargo test`; a failing seed
//! is named in the panic (`STRAND_SIM_SEED=N` runs only that one).
//!
//! The invariants, per partition:
//! - replicas are distinct, and as many as the replication factor (with a
//!   move in progress: the target is a prefix of them and has that many);
//! - the ISR is a subset of the replicas, in replica order, empty only
//!   while the partition waits for a lost replica (and then leaderless);
//! - the leader is an ISR member on an alive broker, or there is none;
//! - epochs never go back; a new leader comes with a new leader epoch, and
//!   any change of leader, ISR or replicas with a new partition epoch;
//! - a broker joins the ISR only through the leader's `AlterIsr`, and a
//!   new leader held everything committed: it was in the ISR before the
//!   command (or, for an `AlterIsr`, is in the ISR it sets) — or it is the
//!   lost replica the partition waited for, back with its directory, or an
//!   operator asked for an unclean election;
//! - a broker whose directory changed leads nothing and is in no ISR
//!   right after it registers, except where it came back to a directory a
//!   partition waited for.

use super::*;
use crate::controller::table::BrokerRecord;

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> Option<T> {
        (!from.is_empty()).then(|| from[self.below(from.len() as u64) as usize])
    }
}

const BROKERS: u64 = 5;

fn settings(partitions: u32, rf: u16) -> QueueSettings {
    QueueSettings::for_tests(partitions, rf)
}

/// A random command that the cluster could send in `table`'s state.
fn command(rng: &mut Rng, table: &MetadataTable) -> Command {
    let broker = 1 + rng.below(BROKERS);
    let incarnation = |id: NodeId| table.brokers.get(&id).map_or(1, |b: &BrokerRecord| b.incarnation);
    let directory = |id: NodeId| table.brokers.get(&id).map_or(1, |b: &BrokerRecord| b.directory);
    let partitions: Vec<(String, u32)> = table
        .queues
        .iter()
        .flat_map(|(n, q)| (0..q.partitions.len() as u32).map(move |p| (n.clone(), p)))
        .collect();
    match rng.below(14) {
        0 | 1 => Command::RegisterBroker {
            id: broker,
            address: format!("10.0.0.{broker}:9400"),
            shards: 1,
            // Mostly the same run coming back; sometimes a new run, with
            // a wiped disk, or the disk before that mounted again.
            incarnation: incarnation(broker) + u64::from(rng.below(3) == 0),
            directory: match rng.below(12) {
                0 => directory(broker) + 1,
                1 => directory(broker).saturating_sub(1).max(1),
                _ => directory(broker),
            },
        },
        2 => Command::FenceBroker { id: broker, term: 0 },
        3 => Command::ShutdownBroker {
            id: broker,
            incarnation: incarnation(broker),
        },
        4 => Command::DrainBroker {
            id: broker,
            draining: rng.below(2) == 0,
        },
        5 if rng.below(4) == 0 => Command::DecommissionBroker { id: broker },
        5 if rng.below(3) == 0 => Command::CancelDecommission { id: broker },
        6 => Command::CreateQueue {
            name: format!("q{}", rng.below(3)),
            settings: settings(1 + rng.below(3) as u32, 1 + rng.below(3) as u16),
        },
        7 if rng.below(3) == 0 => Command::DeleteQueue {
            name: format!("q{}", rng.below(3)),
        },
        8 => Command::AlterQueue {
            name: format!("q{}", rng.below(3)),
            changes: QueueChanges {
                partitions: Some(1 + rng.below(5) as u32),
                ..QueueChanges::default()
            },
        },
        9 => {
            let Some((queue, partition)) =
                rng.pick(&partitions.iter().map(|(q, p)| (q.as_str(), *p)).collect::<Vec<_>>())
            else {
                return Command::BalanceLeaders;
            };
            let rf = table.queues[queue].settings.replication_factor as usize;
            let mut ids: Vec<NodeId> = (1..=BROKERS).collect();
            for i in (1..ids.len()).rev() {
                ids.swap(i, rng.below(i as u64 + 1) as usize);
            }
            ids.truncate(rf);
            Command::ReassignPartition {
                queue: queue.to_string(),
                partition,
                replicas: ids,
            }
        }
        10 if rng.below(2) == 0 => Command::BalanceLeaders,
        10 if rng.below(3) == 0 => {
            let Some((queue, partition)) =
                rng.pick(&partitions.iter().map(|(q, p)| (q.as_str(), *p)).collect::<Vec<_>>())
            else {
                return Command::BalanceLeaders;
            };
            Command::ElectUnclean {
                queue: queue.to_string(),
                partition: (rng.below(2) == 0).then_some(partition),
                replica: (rng.below(3) == 0).then(|| 1 + rng.below(BROKERS)),
            }
        }
        10 if rng.below(2) == 0 => {
            // A replica found its log damaged at open (a member of the ISR,
            // or any replica), now and then late.
            let Some((queue, partition)) =
                rng.pick(&partitions.iter().map(|(q, p)| (q.as_str(), *p)).collect::<Vec<_>>())
            else {
                return Command::BalanceLeaders;
            };
            let p = &table.queues[queue].partitions[partition as usize];
            let pool = if p.isr.is_empty() || rng.below(4) == 0 {
                &p.replicas
            } else {
                &p.isr
            };
            Command::ReplicaDamaged {
                queue: queue.to_string(),
                partition,
                broker: rng.pick(pool).unwrap_or(1),
                partition_epoch: p.partition_epoch.saturating_sub(u32::from(rng.below(4) == 0)),
            }
        }
        10 => {
            // A leader lost writes (a full disk), now and then late.
            let Some((queue, partition)) =
                rng.pick(&partitions.iter().map(|(q, p)| (q.as_str(), *p)).collect::<Vec<_>>())
            else {
                return Command::BalanceLeaders;
            };
            let p = &table.queues[queue].partitions[partition as usize];
            Command::LeaderLostWrites {
                queue: queue.to_string(),
                partition,
                leader: p.leader,
                leader_epoch: p.leader_epoch.saturating_sub(u32::from(rng.below(4) == 0)),
            }
        }
        _ => {
            // The leader of a partition changes its ISR: some replicas
            // (itself among them), now and then with a stale epoch.
            let Some((queue, partition)) =
                rng.pick(&partitions.iter().map(|(q, p)| (q.as_str(), *p)).collect::<Vec<_>>())
            else {
                return Command::BalanceLeaders;
            };
            let p = &table.queues[queue].partitions[partition as usize];
            let mut isr: Vec<NodeId> = p.replicas.iter().copied().filter(|_| rng.below(3) != 0).collect();
            if !isr.contains(&p.leader) {
                isr.push(p.leader);
            }
            let stale = u32::from(rng.below(8) == 0);
            Command::AlterIsr {
                queue: queue.to_string(),
                partition,
                leader: p.leader,
                leader_epoch: p.leader_epoch,
                partition_epoch: p.partition_epoch.saturating_sub(stale),
                isr,
            }
        }
    }
}

/// Checks the invariants of `after` (and against `before`, for `command`).
fn check(before: &MetadataTable, after: &MetadataTable, command: &Command) -> Result<(), String> {
    after
        .check_structure()
        .map_err(|e| format!("{e} (after {command:?})"))?;
    for (name, q) in &after.queues {
        for (i, p) in q.partitions.iter().enumerate() {
            let at = format!("{name}/{i} after {command:?}: {p:?}");
            let Some(was) = before
                .queues
                .get(name)
                .filter(|b| b.id == q.id)
                .and_then(|b| b.partitions.get(i))
            else {
                continue;
            };
            if p.leader_epoch < was.leader_epoch || p.partition_epoch < was.partition_epoch {
                return Err(format!("an epoch went back from {was:?}: {at}"));
            }
            if p.leader != was.leader && p.leader_epoch == was.leader_epoch {
                return Err(format!("a new leader in the same leader epoch as {was:?}: {at}"));
            }
            let changed = (p.leader, &p.isr, &p.replicas) != (was.leader, &was.isr, &was.replicas);
            if changed && p.partition_epoch == was.partition_epoch {
                return Err(format!("changed in the same partition epoch as {was:?}: {at}"));
            }
            let alter = matches!(command, Command::AlterIsr { .. });
            let unclean = matches!(command, Command::ElectUnclean { .. });
            // The lost replica back with the directory it was lost with.
            let found = match (command, was.lost) {
                (Command::RegisterBroker { id, directory, .. }, Some(l)) => {
                    l.broker == *id && l.directory == *directory
                }
                _ => false,
            };
            if !alter && !unclean && !found && p.isr.iter().any(|r| !was.isr.contains(r)) {
                return Err(format!("a broker joined the ISR without the leader: was {was:?}: {at}"));
            }
            let held = if alter { &p.isr } else { &was.isr };
            if p.leader != was.leader && p.leader != NO_LEADER && !held.contains(&p.leader) && !unclean && !found {
                return Err(format!("a leader that may lack committed records: was {was:?}: {at}"));
            }
            if unclean && p.leader != was.leader && (was.leader != NO_LEADER || p.isr != [p.leader]) {
                return Err(format!(
                    "an unclean election of a led partition, or not alone in its ISR: {at}"
                ));
            }
            // A damaged replica neither leads nor stays in sync; alone in
            // the ISR, its partition waits for an unclean election.
            if let Command::ReplicaDamaged { broker, .. } = command {
                if was.isr.contains(broker) && p.partition_epoch != was.partition_epoch {
                    if p.leader == *broker || p.isr.contains(broker) {
                        return Err(format!("a damaged replica leads or is in sync: {at}"));
                    }
                    if was.isr == [*broker] && (p.leader != NO_LEADER || p.lost.is_none_or(|l| l.broker != *broker)) {
                        return Err(format!("a damaged last in-sync replica left its partition led: {at}"));
                    }
                }
            }
            // A broker back with another directory holds nothing.
            if let Command::RegisterBroker { id, directory, .. } = command {
                let before = before.brokers.get(id).map_or(0, |b| b.directory);
                let wiped = before != 0 && *directory != 0 && before != *directory;
                if wiped && !found && (p.leader == *id || p.isr.contains(id)) {
                    return Err(format!(
                        "a broker back with another directory leads or is in sync: {at}"
                    ));
                }
            }
        }
    }
    Ok(())
}

fn run(seed: u64, steps: usize) {
    let mut rng = Rng(seed);
    let mut stm = MetadataStm::new();
    // Three brokers to start with.
    let mut log: Vec<Command> = (1..=3).map(super::tests::back).collect();
    for c in &log {
        let index = stm.table().applied_index + 1;
        let _ = stm.apply(index, c);
    }
    let mut restored: Option<(MetadataStm, usize)> = None;
    // Proposals with ids: per proposing node (1–3) its run, next number
    // and what it still counts as in flight; the recent ones with their
    // answers, to commit again.
    let mut numbered: [(u64, u64); 3] = [(seed, 1), (seed + 1, 1), (seed + 2, 1)];
    let mut recent: Vec<(Command, CommandAnswer)> = Vec::new();
    for step in 0..steps {
        let mut command = command(&mut rng, stm.table());
        if rng.below(2) == 0 {
            let node = rng.below(3) as usize;
            if rng.below(20) == 0 {
                // The node restarted: a new run.
                numbered[node] = (rng.next(), 1);
            }
            let (run, seq) = &mut numbered[node];
            let id = ProposalId {
                node: node as u64 + 1,
                run: *run,
                seq: *seq,
                settled_below: seq.saturating_sub(rng.below(4)).max(1),
            };
            *seq += 1;
            command = Command::Once {
                id,
                command: Box::new(command),
            };
        }
        let before = stm.table().clone();
        let index = before.applied_index + 1;
        let answer = stm.apply(index, &command);
        log.push(command.clone());
        let inner = match &command {
            Command::Once { command, .. } => command,
            command => command,
        };
        if let Err(e) = check(&before, stm.table(), inner) {
            panic!("seed {seed}, step {step}: {e}");
        }
        if matches!(command, Command::Once { .. }) {
            recent.push((command.clone(), answer));
            if recent.len() > 8 {
                let _oldest = recent.remove(0);
            }
        }
        // A proposal committed again changes nothing but its session, and
        // answers what it first did (or, settled meanwhile, is refused).
        if !recent.is_empty() && rng.below(8) == 0 {
            let (again, first) = recent[rng.below(recent.len() as u64) as usize].clone();
            let before = stm.table().clone();
            let index = before.applied_index + 1;
            let answer = stm.apply(index, &again);
            log.push(again.clone());
            let settled = matches!(answer, Err(ControllerError::InvalidProposal(_)));
            assert!(
                answer == first || settled,
                "seed {seed}, step {step}: a copy of {again:?} answered {answer:?}, the first {first:?}"
            );
            let strip = |t: &MetadataTable| MetadataTable {
                applied_index: 0,
                proposals: Vec::new(),
                ..t.clone()
            };
            assert_eq!(
                strip(&before),
                strip(stm.table()),
                "seed {seed}, step {step}: a copy of {again:?} changed the table"
            );
        }
        if restored.is_none() && rng.below(50) == 0 {
            let mut r = MetadataStm::new();
            r.restore(&stm.snapshot())
                .unwrap_or_else(|e| panic!("seed {seed}: restoring: {e}"));
            restored = Some((r, log.len()));
        }
    }
    // The snapshot, with the rest of the log applied, is the same table.
    if let Some((mut r, from)) = restored {
        for c in &log[from..] {
            let index = r.table().applied_index + 1;
            let _ = r.apply(index, c);
        }
        assert_eq!(r, stm, "seed {seed}: snapshot and replay disagree");
    }
}

#[test]
fn the_controller_keeps_its_invariants_under_random_commands() {
    if let Some(seed) = std::env::var("STRAND_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        return run(seed, 400);
    }
    for seed in 0..2_000 {
        run(seed, 200);
    }
}

/// The simulation's checks catch what they claim to: a hand-broken table.
#[test]
fn the_checks_fail_on_a_broken_table() {
    let (mut stm, index) = super::tests::brokers(3);
    let create = Command::CreateQueue {
        name: "q".into(),
        settings: settings(1, 3),
    };
    stm.apply(index, &create).unwrap();
    let good = stm.table().clone();
    let noop = Command::BalanceLeaders;
    assert_eq!(check(&good, &good, &noop), Ok(()));
    let broken: [fn(&mut PartitionRecord); 6] = [
        |p| p.isr.clear(),
        // Waiting for a lost replica while led.
        |p| {
            p.lost = Some(LostReplica {
                broker: p.leader,
                directory: 1,
                after: 0,
            })
        },
        |p| p.replicas[1] = p.replicas[0],
        |p| p.leader = 9,
        // Another leader in the same leader epoch.
        |p| {
            p.leader = p.replicas[1];
            p.partition_epoch += 1;
        },
        |p| p.leader_epoch -= 1,
    ];
    for (i, f) in broken.iter().enumerate() {
        let mut before = good.clone();
        before.queues.get_mut("q").unwrap().partitions[0].leader_epoch = 3;
        let mut after = before.clone();
        f(&mut after.queues.get_mut("q").unwrap().partitions[0]);
        assert!(check(&before, &after, &noop).is_err(), "case {i}");
    }
}
