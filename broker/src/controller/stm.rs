//! The controller's state machine: commands, how they apply, snapshots.
//!
//! Runs on: shard 0, inside the Raft member's state-machine store.
//!
//! # Encodings
//! A command in a Raft log entry is the JSON of [`Command`]; a snapshot is
//! the JSON of [`MetadataTable`]. Both are small (metadata, not data) and
//! JSON keeps them readable with `jq` when an operator must look. The
//! framing around them on disk (length, CRC) is the Raft store's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::acls::AclEntry;
pub use super::error::ControllerError;
use super::proposals::{CommandAnswer, ProposalId, ProposalSession, MAX_ANSWERS_PER_SESSION, MAX_SESSIONS_PER_NODE};
use super::table::{
    FsyncSetting, LostReplica, MetadataTable, NodeId, PartitionRecord, QueueRecord, QueueSettings, NO_LEADER,
};
use super::users::{self, StoredCredential, UserRecord};

/// Most partitions a queue may have.
pub const PARTITIONS_MAX: u32 = 10_000;
/// Largest `max_message_bytes` a queue may set.
pub const MESSAGE_BYTES_MAX: u32 = 64 << 20;

/// The replica that should lead `p` instead of its leader, if any: its
/// preferred replica (its first) once that is alive, not draining and in
/// the ISR; else, while the leader drains, another alive in-sync replica
/// that does not (one may have caught up since the drain began).
fn preferred_leader(
    p: &PartitionRecord,
    brokers: &std::collections::BTreeMap<NodeId, super::table::BrokerRecord>,
) -> Option<NodeId> {
    let preferred = *p.replicas.first()?;
    let ready = brokers.get(&preferred).is_some_and(|b| b.alive && !b.in_maintenance());
    if p.leader != preferred && ready && p.isr.contains(&preferred) {
        return Some(preferred);
    }
    let draining = |id: &NodeId| brokers.get(id).is_some_and(|b| b.in_maintenance());
    if !draining(&p.leader) {
        return None;
    }
    successor(p, brokers, p.leader).filter(|next| !draining(next))
}

/// Broker `id` leaves partition `p`'s ISR if it shares it, and its
/// leadership goes to the first other alive ISR member (or to no one), each
/// change bumping the epochs; where it alone is the ISR, it loses the
/// leadership too when `sole_too` (offline until it is back), else keeps
/// it in a new leader epoch ([`MetadataStm::leave_isrs`]).
fn leave_isr(
    p: &mut PartitionRecord,
    brokers: &BTreeMap<NodeId, super::table::BrokerRecord>,
    id: NodeId,
    sole_too: bool,
) {
    let sole = p.isr == [id];
    if !p.isr.contains(&id) && p.leader != id {
        return;
    }
    if sole && !sole_too {
        if p.leader == id {
            p.leader_epoch += 1;
            p.partition_epoch += 1;
        }
        return;
    }
    p.isr.retain(|r| *r != id || sole);
    if p.leader == id {
        p.leader = successor(p, brokers, id).unwrap_or(NO_LEADER);
        p.leader_epoch += 1;
    }
    p.partition_epoch += 1;
}

/// `lost.broker`'s replica of `p` no longer holds what it had: it leaves
/// the ISR (its leadership going to another alive member); where it alone
/// was the ISR, no replica is known to hold every committed record, and
/// the partition goes offline with an empty ISR and `lost` set.
fn lose_replica(p: &mut PartitionRecord, brokers: &BTreeMap<NodeId, super::table::BrokerRecord>, lost: LostReplica) {
    if p.isr != [lost.broker] {
        leave_isr(p, brokers, lost.broker, true);
        return;
    }
    p.isr.clear();
    if p.leader != NO_LEADER {
        p.leader = NO_LEADER;
        p.leader_epoch += 1;
    }
    p.lost = Some(lost);
    p.partition_epoch += 1;
}

/// The replica an unclean election of offline partition `p` picks when
/// none is named: the first alive in replica order, the broker that lost
/// the records and any whose directory was replaced after the partition
/// went offline last (empty of it too: a strand-chaos run's second wipe
/// was elected and the survivor's copy cut to nothing), then a draining
/// one. The broker that takes an operator's `strand queue elect
/// --unclean` names it in the command it proposes, so that every member
/// applies the same choice (one restored from an older snapshot lacks
/// the directory counters).
pub fn unclean_candidate(table: &MetadataTable, p: &PartitionRecord) -> Option<NodeId> {
    let lost = p.lost.map(|l| l.broker);
    let offline_since = p.lost.map_or(u64::MAX, |l| l.after);
    let rank = |r: &NodeId| {
        let emptied = Some(*r) == lost || table.directory_replaced_at.get(r).is_some_and(|at| *at > offline_since);
        let draining = table.brokers.get(r).is_some_and(|b| b.in_maintenance());
        (emptied, draining)
    };
    p.replicas
        .iter()
        .copied()
        .filter(|r| table.brokers.get(r).is_some_and(|b| b.alive))
        .min_by_key(rank)
}

/// The replica of `p` to lead instead of `instead`: the first in the ISR
/// that is alive, not draining if one is (maintenance yields to
/// availability); `None` if no other ISR member is alive.
fn successor(
    p: &PartitionRecord,
    brokers: &std::collections::BTreeMap<NodeId, super::table::BrokerRecord>,
    instead: NodeId,
) -> Option<NodeId> {
    let candidates = || {
        p.replicas
            .iter()
            .copied()
            .filter(|r| *r != instead && p.isr.contains(r))
            .filter_map(|r| brokers.get(&r).filter(|b| b.alive))
    };
    candidates()
        .find(|b| !b.in_maintenance())
        .or_else(|| candidates().next())
        .map(|b| b.id)
}

/// A change to the metadata, as proposed to the Raft group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A broker joins, updates its address or shard count, or comes back
    /// from fenced: it is alive from here on. Proposed by the controller
    /// leader when it grants a lease (`leases.rs`), which refuses an id
    /// whose lease another address holds.
    RegisterBroker {
        id: NodeId,
        address: String,
        /// Its shards (0 in logs written before brokers reported them).
        #[serde(default)]
        shards: u16,
        /// The broker process's run (`BrokerRecord::incarnation`). A new
        /// run hands the broker's leaderships to other in-sync replicas
        /// and takes it out of the ISRs, as a fence does: it may have lost
        /// records it had written but not fdatasync'd, which its followers
        /// hold, and must not go on leading in the epoch it wrote them in.
        #[serde(default)]
        incarnation: u64,
        /// Its data directory's id (`BrokerRecord::directory`; 0: a broker
        /// that predates directory ids, which changes nothing). Another id
        /// than the one recorded means the broker lost everything it held:
        /// it leaves every ISR, the last member of one too (that partition
        /// goes offline and waits: `PartitionRecord::lost`), and partitions
        /// that waited for this broker with this directory get it back as
        /// their leader.
        #[serde(default)]
        directory: u64,
    },
    /// The controller leader of Raft term `term` saw the broker's lease
    /// expire. Applies only from an entry written in that term: a leader
    /// deposed meanwhile (its leases are no longer the truth) fences no one,
    /// even if its proposal is forwarded to and committed by its successor.
    FenceBroker {
        id: NodeId,
        term: u64,
    },
    /// A broker stopping on purpose (SIGTERM: a controlled shutdown)
    /// hands over before it goes, as a fence would without waiting for its
    /// lease to expire: its leaderships move to another alive in-sync
    /// replica (a new leader epoch), it leaves every ISR it is not the last
    /// member of, and it takes no new partitions until it registers again.
    ShutdownBroker {
        id: NodeId,
        /// The run that asked (`BrokerRecord::incarnation`): a late entry
        /// from an earlier run does not touch the broker's next one.
        #[serde(default)]
        incarnation: u64,
    },
    /// Broker `id` goes into maintenance (`draining`: every leadership it
    /// holds moves to another alive in-sync replica where there is one, a
    /// new leader epoch each; it stays in the ISRs) or comes out of it
    /// (leader balancing then gives it its preferred leaderships back).
    DrainBroker {
        id: NodeId,
        draining: bool,
    },
    /// Broker `id` is decommissioned: every replica it holds moves to
    /// another broker (alive, not itself leaving, not already a replica:
    /// the one holding fewest replicas), each a reassignment (see
    /// [`PartitionRecord::target`]); it hands its leaderships over now, as a
    /// drain does, and placement gives it nothing new. Refused as a whole
    /// (`CannotDecommission`) when some partition would find no broker to
    /// move to.
    DecommissionBroker {
        id: NodeId,
    },
    /// Broker `id`'s decommission is cancelled: it is no longer leaving,
    /// and every move its decommission began that is still in progress
    /// takes it back in place of the broker that was to replace it
    /// ([`PartitionRecord::decommission_moves`]; in the order the replicas
    /// had before, where nothing else changed since); moves that completed
    /// stay, and other brokers' decommissions go on. The broker then takes
    /// new replicas again, and leader balancing gives it its preferred
    /// leaderships back. A broker that is not leaving is left as it is.
    CancelDecommission {
        id: NodeId,
    },
    /// Partition `partition` of `queue` moves to `replicas` (the first the
    /// preferred leader; as many as the queue's replication factor): new
    /// replicas catch up as followers, then the ones left out are removed
    /// (see [`PartitionRecord::target`]). A reassignment in progress is
    /// replaced (reassigning back to the replicas it started from cancels
    /// it).
    ReassignPartition {
        queue: String,
        partition: u32,
        replicas: Vec<NodeId>,
    },
    /// Every partition whose preferred replica (its first) is alive, not
    /// draining and in the ISR but does not lead is led by it again (and one
    /// led by a draining broker by another alive in-sync replica), in a new
    /// leader epoch
    /// (automatic leader balancing: after a failover, leaderships go back
    /// where placement spread them). Any ISR member holds everything
    /// committed, so the move loses nothing; the controller leader proposes
    /// it when [`MetadataStm::unbalanced_leaders`] finds some.
    BalanceLeaders,
    /// A partition's leader changes its ISR. Accepted only from the leader
    /// of `leader_epoch` that saw `partition_epoch` (else
    /// `StaleIsrChange`); the ISR must hold the leader, only replicas, and
    /// no fenced broker it did not already hold.
    AlterIsr {
        queue: String,
        partition: u32,
        leader: NodeId,
        leader_epoch: u32,
        partition_epoch: u32,
        isr: Vec<NodeId>,
    },
    /// The leader of `leader_epoch` lost writes it had taken: its log
    /// failed (a full disk) while memory held batches the disk does not,
    /// which followers may have fetched, and it is about to open the log
    /// again from what the disk holds. As a new run of the broker does for
    /// every partition (`RegisterBroker`), it leaves the ISR when others
    /// are in it and its leadership goes to another alive ISR member; alone
    /// in the ISR, it keeps leading in a new leader epoch (followers then
    /// find their logs diverged, not in step). From another leader or an
    /// older epoch (a late entry), nothing changes.
    LeaderLostWrites {
        queue: String,
        partition: u32,
        leader: NodeId,
        leader_epoch: u32,
    },
    /// Broker `broker`'s replica of partition `partition` of `queue` lost
    /// records it had made durable: opening it found a damaged or missing
    /// segment, a corrupt batch that later batches follow, or a log below
    /// its checkpointed high watermark (`strand_storage::Log::damage`). It
    /// leaves the ISR (its leadership goes to another alive ISR member) and
    /// catches up as a follower. Where it alone is the ISR, no replica is
    /// known to hold every committed record: the partition goes offline
    /// with an empty ISR ([`PartitionRecord::lost`], directory 0: no
    /// directory of it will come back whole) until an unclean election,
    /// which takes this replica last. Applies only at `partition_epoch`
    /// (what the broker saw when it asked), and while the broker is in the
    /// ISR: a late or repeated report changes nothing.
    ReplicaDamaged {
        queue: String,
        partition: u32,
        broker: NodeId,
        partition_epoch: u32,
    },
    /// An operator accepts losing records (`strand queue elect
    /// --unclean`): partition `partition` of `queue` (or every offline
    /// partition of it) gets a leader although no alive replica is known
    /// to hold everything it committed — `replica` if named, else the first
    /// alive replica that did not lose its data (nor had its directory
    /// replaced after the partition went offline; a draining one last). It
    /// is the ISR alone, in a new leader epoch; the other replicas truncate
    /// to it. Counted in `MetadataTable::unclean_elections`. Refused for a
    /// partition that has a leader.
    ElectUnclean {
        queue: String,
        partition: Option<u32>,
        replica: Option<NodeId>,
    },
    CreateQueue {
        name: String,
        settings: QueueSettings,
    },
    DeleteQueue {
        name: String,
    },
    /// Only the fields that are `Some` change.
    AlterQueue {
        name: String,
        changes: QueueChanges,
    },
    /// Creates user `name` or replaces its credentials (`strand user
    /// create`): only salted SCRAM keys, one per mechanism.
    PutUser {
        name: String,
        credentials: Vec<StoredCredential>,
    },
    /// Deletes user `name` and its ACLs; its connections already
    /// authenticated get `AuthenticationFailed` from then on
    /// (`handlers::still_a_user`).
    DeleteUser {
        name: String,
    },
    /// Allows `entry` (`strand acl add`); already there, nothing changes.
    AddAcl {
        entry: AclEntry,
    },
    /// Removes `entry` (`strand acl remove`); refused when absent.
    RemoveAcl {
        entry: AclEntry,
    },
    /// The key of unknown users' decoy salts (32 bytes), proposed by a
    /// broker at start: applies only while the table has none.
    SetDecoySecret {
        secret: Vec<u8>,
    },
    /// The first superusers of a cluster (`--superusers` with
    /// `STRAND_BOOTSTRAP_PASSWORD`, proposed by a broker at start): applies
    /// only while the cluster never held a user, so a later start with the
    /// variable still set brings no deleted user back and changes no
    /// password.
    BootstrapUsers {
        users: Vec<(String, Vec<StoredCredential>)>,
    },
    /// `command`, applied once however many times it is committed: the
    /// controller member that proposes it (`Controller::propose`) sends it
    /// again when it cannot tell whether a try was committed (the answer to
    /// a forwarded proposal lost with its connection, a leader that stepped
    /// down with the entry in its log), and a later copy answers what the
    /// first did ([`ProposalSession`]). Not nested.
    Once {
        id: ProposalId,
        command: Box<Command>,
    },
}

/// The changes of an `AlterQueue`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueChanges {
    /// The new partition count; it can only grow.
    pub partitions: Option<u32>,
    /// `Some(None)` removes the limit.
    pub retention_ms: Option<Option<u64>>,
    pub retention_bytes: Option<Option<u64>>,
    pub fsync: Option<FsyncSetting>,
    pub max_message_bytes: Option<u32>,
    pub max_delivery_attempts: Option<u32>,
    #[serde(default)]
    pub min_insync_replicas: Option<u16>,
}

/// The state machine: a table and the rules that change it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetadataStm {
    table: MetadataTable,
}

impl MetadataStm {
    pub fn new() -> MetadataStm {
        MetadataStm::default()
    }

    pub fn table(&self) -> &MetadataTable {
        &self.table
    }

    /// [`MetadataStm::apply_in_term`] for an entry of term 0.
    pub fn apply(&mut self, index: u64, command: &Command) -> Result<(), ControllerError> {
        self.apply_in_term(index, 0, command)
    }

    /// Applies the command committed at Raft log `index`, written by the
    /// leader of term `term`. A refused command still moves
    /// `applied_index` (it was committed; it just changed nothing else), so
    /// replay after a restart skips it the same way.
    pub fn apply_in_term(&mut self, index: u64, term: u64, command: &Command) -> Result<(), ControllerError> {
        assert!(index > self.table.applied_index, "commands apply in log order, once");
        self.table.applied_index = index;
        match command {
            Command::Once { id, command } => self.apply_once(index, term, id, command),
            command => self.apply_command(term, command),
        }
    }

    /// A proposal with an id: applied the first time it is committed;
    /// a later copy (the proposer sent it again, not knowing whether the
    /// first was committed) answers what the first did and changes nothing.
    /// See [`ProposalSession`].
    fn apply_once(&mut self, index: u64, term: u64, id: &ProposalId, command: &Command) -> CommandAnswer {
        if matches!(command, Command::Once { .. }) {
            return Err(ControllerError::InvalidProposal(
                "a proposal with an id inside another".into(),
            ));
        }
        let sessions = &mut self.table.proposals;
        let at = match sessions.iter().position(|s| s.node == id.node && s.run == id.run) {
            Some(at) => at,
            None => {
                let runs = sessions.iter().filter(|s| s.node == id.node).count();
                if runs >= MAX_SESSIONS_PER_NODE {
                    let oldest = sessions
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| s.node == id.node)
                        .min_by_key(|(_, s)| s.last_index)
                        .map(|(at, _)| at)
                        .expect("the node has sessions");
                    sessions.remove(oldest);
                }
                sessions.push(ProposalSession {
                    node: id.node,
                    run: id.run,
                    ..ProposalSession::default()
                });
                sessions.len() - 1
            }
        };
        let session = &mut sessions[at];
        session.last_index = index;
        if let Some(answer) = session.answered.get(&id.seq) {
            return answer.clone();
        }
        if id.seq < session.settled_below {
            return Err(ControllerError::InvalidProposal(format!(
                "proposal {} of node {}'s run {:x} came after its proposer stopped waiting for it",
                id.seq, id.node, id.run
            )));
        }
        if id.settled_below > session.settled_below {
            session.settled_below = id.settled_below;
            session.answered = session.answered.split_off(&id.settled_below);
        }
        let answer = self.apply_command(term, command);
        let session = &mut self.table.proposals[at];
        session.answered.insert(id.seq, answer.clone());
        while session.answered.len() > MAX_ANSWERS_PER_SESSION {
            let (first, _) = session.answered.pop_first().expect("not empty");
            session.settled_below = first + 1;
        }
        answer
    }

    /// Applies `command` (not [`Command::Once`]) written in term `term`.
    fn apply_command(&mut self, term: u64, command: &Command) -> CommandAnswer {
        match command {
            Command::Once { .. } => Err(ControllerError::InvalidProposal(
                "a proposal with an id inside another".into(),
            )),
            // Id 0 stands for "no leader" in partition records.
            Command::RegisterBroker { id: 0, .. } => Err(ControllerError::InvalidBrokerId),
            Command::RegisterBroker {
                id,
                address,
                shards,
                incarnation,
                directory,
            } => {
                let recorded = self.table.brokers.get(id).map_or(0, |b| b.directory);
                let replaced = recorded != 0 && *directory != 0 && recorded != *directory;
                if replaced {
                    self.table.directories_replaced += 1;
                    let at = self.table.directories_replaced;
                    self.table.directory_replaced_at.insert(*id, at);
                    self.forget_replicas_of(*id, recorded);
                }
                if let Some(b) = self.table.brokers.get_mut(id).filter(|b| b.incarnation != *incarnation) {
                    b.alive = false;
                    self.move_leaderships_off_replicated(*id);
                }
                let (draining, decommissioning) = self
                    .table
                    .brokers
                    .get(id)
                    .map_or((false, false), |b| (b.draining, b.decommissioning));
                self.table.brokers.insert(
                    *id,
                    super::table::BrokerRecord {
                        id: *id,
                        address: address.clone(),
                        shards: *shards,
                        alive: true,
                        incarnation: *incarnation,
                        draining,
                        decommissioning,
                        directory: if *directory != 0 { *directory } else { recorded },
                    },
                );
                if replaced {
                    self.lead_partitions_waiting_for(*id, *directory);
                }
                self.lead_offline_partitions(*id);
                Ok(())
            }
            Command::FenceBroker { id, term: of } => {
                if *of == term {
                    if let Some(b) = self.table.brokers.get_mut(id) {
                        b.alive = false;
                        self.move_leaderships_off(*id);
                    }
                }
                Ok(())
            }
            Command::ShutdownBroker { id, incarnation } => {
                if let Some(b) = self.table.brokers.get_mut(id).filter(|b| b.incarnation == *incarnation) {
                    b.alive = false;
                    self.move_leaderships_off(*id);
                }
                Ok(())
            }
            Command::DrainBroker { id, draining } => {
                let b = self
                    .table
                    .brokers
                    .get_mut(id)
                    .ok_or(ControllerError::UnknownBroker(*id))?;
                b.draining = *draining;
                if *draining {
                    self.move_to_preferred_leaders(Some(*id));
                }
                Ok(())
            }
            Command::BalanceLeaders => {
                self.move_to_preferred_leaders(None);
                Ok(())
            }
            Command::DecommissionBroker { id } => self.decommission(*id),
            Command::CancelDecommission { id } => self.cancel_decommission(*id),
            Command::ReassignPartition {
                queue,
                partition,
                replicas,
            } => self.reassign(queue, *partition, replicas),
            Command::AlterIsr {
                queue,
                partition,
                leader,
                leader_epoch,
                partition_epoch,
                isr,
            } => self.alter_isr(queue, *partition, *leader, *leader_epoch, *partition_epoch, isr),
            Command::LeaderLostWrites {
                queue,
                partition,
                leader,
                leader_epoch,
            } => {
                let brokers = &self.table.brokers;
                let record = self
                    .table
                    .queues
                    .get_mut(queue)
                    .and_then(|q| q.partitions.get_mut(*partition as usize))
                    .filter(|p| p.leader == *leader && p.leader_epoch == *leader_epoch);
                if let Some(p) = record {
                    leave_isr(p, brokers, *leader, false);
                }
                Ok(())
            }
            Command::ReplicaDamaged {
                queue,
                partition,
                broker,
                partition_epoch,
            } => {
                self.replica_damaged(queue, *partition, *broker, *partition_epoch);
                Ok(())
            }
            Command::ElectUnclean {
                queue,
                partition,
                replica,
            } => self.elect_unclean(queue, *partition, *replica),
            Command::CreateQueue { name, settings } => self.create_queue(name, settings),
            Command::DeleteQueue { name } => self
                .table
                .queues
                .remove(name)
                .map(|_| ())
                .ok_or_else(|| ControllerError::UnknownQueue(name.clone())),
            Command::AlterQueue { name, changes } => self.alter_queue(name, changes),
            Command::PutUser { name, credentials } => {
                users::check_name(name)?;
                users::check_credentials(credentials)?;
                let credentials = credentials.clone();
                self.table.users.insert(name.clone(), UserRecord { credentials });
                self.table.had_users = true;
                Ok(())
            }
            Command::DeleteUser { name } => {
                self.table
                    .users
                    .remove(name)
                    .ok_or_else(|| ControllerError::UnknownUser(name.clone()))?;
                self.table.acls.retain(|a| a.user != *name);
                Ok(())
            }
            Command::SetDecoySecret { secret } => {
                if secret.len() != 32 {
                    return Err(ControllerError::InvalidProposal(format!(
                        "the cluster's decoy-salt key must be 32 bytes, not {}",
                        secret.len()
                    )));
                }
                if self.table.decoy_secret.is_empty() {
                    self.table.decoy_secret = secret.clone();
                }
                Ok(())
            }
            Command::AddAcl { entry } => {
                entry.check()?;
                if let Err(at) = self.table.acls.binary_search(entry) {
                    self.table.acls.insert(at, entry.clone());
                }
                Ok(())
            }
            Command::RemoveAcl { entry } => match self.table.acls.binary_search(entry) {
                Ok(at) => {
                    self.table.acls.remove(at);
                    Ok(())
                }
                Err(_) => Err(ControllerError::UnknownAcl(format!(
                    "{} may {} on {} {:?}",
                    entry.user,
                    entry.operation.name(),
                    entry.resource.kind(),
                    entry.resource.name()
                ))),
            },
            Command::BootstrapUsers { users } => {
                if self.table.had_users {
                    return Ok(());
                }
                for (name, credentials) in users {
                    users::check_name(name)?;
                    users::check_credentials(credentials)?;
                }
                for (name, credentials) in users {
                    let credentials = credentials.clone();
                    self.table.users.insert(name.clone(), UserRecord { credentials });
                }
                self.table.had_users = !users.is_empty();
                Ok(())
            }
        }
    }

    /// The brokers [`Command::BalanceLeaders`] would give leaderships to,
    /// each with how many.
    pub fn unbalanced_leaders(table: &MetadataTable) -> BTreeMap<NodeId, usize> {
        let mut to = BTreeMap::new();
        for p in table.queues.values().flat_map(|q| q.partitions.iter()) {
            if let Some(preferred) = preferred_leader(p, &table.brokers) {
                *to.entry(preferred).or_default() += 1;
            }
        }
        to
    }

    /// A fenced (or shut down) broker leaves every ISR it is in (unless it
    /// is the last member: the partition then waits for it, offline) and
    /// every leadership it holds goes to the first replica that is in the
    /// ISR and alive, or to no one.
    fn move_leaderships_off(&mut self, fenced: NodeId) {
        self.leave_isrs(fenced, true);
    }

    /// A broker back from a new run leaves the ISRs it shares with others,
    /// and its leaderships of them go to another alive ISR member (a new
    /// leader epoch); partitions whose ISR it alone is keep it as leader
    /// (it holds all they committed: what it fdatasync'd), in a new leader
    /// epoch: followers outside the ISR may hold records this run lost, and
    /// must find their log diverged, not in step.
    fn move_leaderships_off_replicated(&mut self, id: NodeId) {
        self.leave_isrs(id, false);
    }

    /// Broker `id` leaves every ISR it shares, and its leaderships go to the
    /// first other alive ISR member (or to no one), each change bumping the
    /// epochs; partitions whose ISR it alone is lose their leader too when
    /// `sole_too` (a fence: offline until it is back), else stay as they are.
    fn leave_isrs(&mut self, id: NodeId, sole_too: bool) {
        let brokers = &self.table.brokers;
        for p in self.table.queues.values_mut().flat_map(|q| q.partitions.iter_mut()) {
            leave_isr(p, brokers, id, sole_too);
        }
    }

    /// Each partition (of those `led_by` leads, or all) that
    /// [`preferred_leader`] says should be led by another replica is led by
    /// it, in a new leader epoch: leader balancing, and a draining broker
    /// handing its leaderships over (it stays in the ISRs).
    fn move_to_preferred_leaders(&mut self, led_by: Option<NodeId>) {
        let brokers = &self.table.brokers;
        for p in self.table.queues.values_mut().flat_map(|q| q.partitions.iter_mut()) {
            if led_by.is_some_and(|id| p.leader != id) {
                continue;
            }
            if let Some(next) = preferred_leader(p, brokers) {
                p.leader = next;
                p.leader_epoch += 1;
                p.partition_epoch += 1;
            }
        }
    }

    /// Broker `id` came back without what it held in data directory
    /// `lost_directory`: it leaves every ISR it is in and its leaderships go
    /// to other alive ISR members, each change bumping the epochs. Where it
    /// alone is the ISR, no replica is known to hold every committed
    /// record: the partition goes offline with an empty ISR and waits for
    /// this broker with that directory ([`PartitionRecord::lost`]) or an
    /// unclean election — never led by an empty log.
    fn forget_replicas_of(&mut self, id: NodeId, lost_directory: u64) {
        let lost = LostReplica {
            broker: id,
            directory: lost_directory,
            after: self.table.directories_replaced,
        };
        let brokers = &self.table.brokers;
        for p in self.table.queues.values_mut().flat_map(|q| q.partitions.iter_mut()) {
            lose_replica(p, brokers, lost);
        }
    }

    /// Broker `id` registered with data directory `directory`: the
    /// partitions that waited for it with that directory
    /// ([`PartitionRecord::lost`]) have it back, their only replica holding
    /// everything they committed, as leader and ISR.
    fn lead_partitions_waiting_for(&mut self, id: NodeId, directory: u64) {
        for p in self.table.queues.values_mut().flat_map(|q| q.partitions.iter_mut()) {
            let back = p.lost.is_some_and(|l| l.broker == id && l.directory == directory);
            if back && p.replicas.contains(&id) {
                p.lost = None;
                p.isr = vec![id];
                p.leader = id;
                p.leader_epoch += 1;
                p.partition_epoch += 1;
            }
        }
    }

    /// [`Command::ReplicaDamaged`].
    fn replica_damaged(&mut self, queue: &str, partition: u32, broker: NodeId, partition_epoch: u32) {
        let lost = LostReplica {
            broker,
            directory: 0,
            after: self.table.directories_replaced,
        };
        let brokers = &self.table.brokers;
        let record = self
            .table
            .queues
            .get_mut(queue)
            .and_then(|q| q.partitions.get_mut(partition as usize))
            .filter(|p| p.partition_epoch == partition_epoch && p.isr.contains(&broker));
        if let Some(p) = record {
            lose_replica(p, brokers, lost);
        }
    }

    /// [`Command::ElectUnclean`].
    fn elect_unclean(
        &mut self,
        queue: &str,
        partition: Option<u32>,
        replica: Option<NodeId>,
    ) -> Result<(), ControllerError> {
        let table = &self.table;
        let q = table
            .queues
            .get(queue)
            .ok_or_else(|| ControllerError::UnknownQueue(queue.to_string()))?;
        let refuse = |why: String| Err(ControllerError::ElectionRefused(why));
        let chosen: Vec<usize> = match partition {
            Some(i) => {
                let Some(p) = q.partitions.get(i as usize) else {
                    return refuse(format!("{queue} has {} partitions, no {i}", q.partitions.len()));
                };
                if p.leader != NO_LEADER {
                    return refuse(format!(
                        "{queue}/{i} has a leader (broker {}): nothing to elect",
                        p.leader
                    ));
                }
                vec![i as usize]
            }
            None => (0..q.partitions.len())
                .filter(|i| q.partitions[*i].leader == NO_LEADER)
                .collect(),
        };
        if chosen.is_empty() {
            return refuse(format!("no partition of {queue} is offline"));
        }
        let alive = |id: &NodeId| table.brokers.get(id).is_some_and(|b| b.alive);
        // Plan first: refused as a whole.
        let mut leaders = Vec::with_capacity(chosen.len());
        for i in &chosen {
            let p = &q.partitions[*i];
            let leader = match replica {
                Some(r) if !p.replicas.contains(&r) => {
                    return refuse(format!(
                        "broker {r} is not a replica of {queue}/{i} (replicas {:?})",
                        p.replicas
                    ))
                }
                Some(r) if !alive(&r) => return refuse(format!("broker {r} is not alive")),
                Some(r) => r,
                None => match unclean_candidate(table, p) {
                    Some(best) => best,
                    None => {
                        return refuse(format!(
                            "no replica of {queue}/{i} is alive (replicas {:?}): start one",
                            p.replicas
                        ))
                    }
                },
            };
            leaders.push((*i, leader));
        }
        let Some(q) = self.table.queues.get_mut(queue) else {
            return Err(ControllerError::UnknownQueue(queue.to_string()));
        };
        for (i, leader) in leaders {
            let p = &mut q.partitions[i];
            p.leader = leader;
            p.isr = vec![leader];
            p.lost = None;
            p.leader_epoch += 1;
            p.partition_epoch += 1;
            self.table.unclean_elections += 1;
        }
        Ok(())
    }

    /// A broker back alive leads the offline partitions whose ISR holds it
    /// (it holds every committed record of them).
    fn lead_offline_partitions(&mut self, id: NodeId) {
        for p in self.table.queues.values_mut().flat_map(|q| q.partitions.iter_mut()) {
            if p.leader == NO_LEADER && p.isr.contains(&id) {
                p.leader = id;
                p.leader_epoch += 1;
                p.partition_epoch += 1;
            }
        }
    }

    fn alter_isr(
        &mut self,
        queue: &str,
        partition: u32,
        leader: NodeId,
        leader_epoch: u32,
        partition_epoch: u32,
        isr: &[NodeId],
    ) -> Result<(), ControllerError> {
        let brokers = &self.table.brokers;
        let alive = |id: &NodeId| brokers.get(id).is_some_and(|b| b.alive);
        let p = self
            .table
            .queues
            .get_mut(queue)
            .ok_or_else(|| ControllerError::UnknownQueue(queue.to_string()))?
            .partitions
            .get_mut(partition as usize)
            .ok_or_else(|| ControllerError::InvalidIsr(format!("{queue} has no partition {partition}")))?;
        if (p.leader, p.leader_epoch, p.partition_epoch) != (leader, leader_epoch, partition_epoch) {
            return Err(ControllerError::StaleIsrChange {
                what: format!(
                    "an ISR change of {queue}/{partition} from leader {leader} (leader epoch {leader_epoch}, \
                     partition epoch {partition_epoch})"
                ),
                leader: p.leader,
                leader_epoch: p.leader_epoch,
                partition_epoch: p.partition_epoch,
            });
        }
        let bad = |why: String| Err(ControllerError::InvalidIsr(format!("{queue}/{partition}: {why}")));
        if !isr.contains(&leader) {
            return bad(format!("{isr:?} does not hold the leader {leader}"));
        }
        if let Some(r) = isr.iter().find(|r| !p.replicas.contains(r)) {
            return bad(format!("{r} is not a replica (replicas {:?})", p.replicas));
        }
        if let Some(r) = isr.iter().find(|r| !p.isr.contains(r) && !alive(r)) {
            return bad(format!("broker {r} is fenced: it cannot join"));
        }
        // In replica order, each once.
        p.isr = p.replicas.iter().copied().filter(|r| isr.contains(r)).collect();
        p.partition_epoch += 1;
        reassign::complete_if_caught_up(p, brokers);
        Ok(())
    }

    /// Records that a Raft entry with no command (a leader's blank entry, a
    /// membership change) was applied at `index`.
    pub fn apply_blank(&mut self, index: u64) {
        assert!(index > self.table.applied_index, "entries apply in log order, once");
        self.table.applied_index = index;
    }

    fn create_queue(&mut self, name: &str, settings: &QueueSettings) -> Result<(), ControllerError> {
        strand_wire::validate_queue_name(name).map_err(ControllerError::InvalidName)?;
        if self.table.queues.contains_key(name) {
            return Err(ControllerError::QueueExists(name.to_string()));
        }
        validate_settings(settings)?;
        let mut placement = Placement::of(&self.table, settings.replication_factor)?;
        let id = self.table.next_queue_id;
        self.table.next_queue_id += 1;
        let partitions = (0..settings.partitions)
            .map(|_| placement.place(settings.replication_factor))
            .collect();
        self.table.queues.insert(
            name.to_string(),
            QueueRecord {
                id,
                name: name.to_string(),
                settings: settings.clone(),
                partitions,
            },
        );
        Ok(())
    }

    fn alter_queue(&mut self, name: &str, changes: &QueueChanges) -> Result<(), ControllerError> {
        let queue = self
            .table
            .queues
            .get(name)
            .ok_or_else(|| ControllerError::UnknownQueue(name.to_string()))?;
        let mut settings = queue.settings.clone();
        if let Some(n) = changes.partitions {
            if n < settings.partitions {
                return Err(ControllerError::InvalidSettings(format!(
                    "partitions can only grow ({} → {n})",
                    settings.partitions
                )));
            }
            settings.partitions = n;
        }
        if let Some(r) = changes.retention_ms {
            settings.retention_ms = r;
        }
        if let Some(r) = changes.retention_bytes {
            settings.retention_bytes = r;
        }
        if let Some(f) = changes.fsync {
            settings.fsync = f;
        }
        if let Some(m) = changes.max_message_bytes {
            settings.max_message_bytes = m;
        }
        if let Some(m) = changes.min_insync_replicas {
            settings.min_insync_replicas = m;
        }
        if let Some(m) = changes.max_delivery_attempts {
            settings.max_delivery_attempts = m;
        }
        validate_settings(&settings)?;
        let have = queue.partitions.len() as u32;
        let rf = settings.replication_factor;
        let mut placement = match settings.partitions > have {
            true => Some(Placement::of(&self.table, rf)?),
            false => None,
        };
        let queue = self
            .table
            .queues
            .get_mut(name)
            .ok_or_else(|| ControllerError::UnknownQueue(name.to_string()))?;
        if let Some(placement) = placement.as_mut() {
            for _ in have..settings.partitions {
                queue.partitions.push(placement.place(rf));
            }
        }
        queue.settings = settings;
        Ok(())
    }

    /// The snapshot of the table (JSON).
    pub fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(&self.table).expect("the table always serialises")
    }

    /// Replaces the state with a snapshot's.
    pub fn restore(&mut self, snapshot: &[u8]) -> Result<(), serde_json::Error> {
        self.table = serde_json::from_slice(snapshot)?;
        Ok(())
    }
}

/// Checks settings on their own (not against the cluster).
fn validate_settings(s: &QueueSettings) -> Result<(), ControllerError> {
    let bad = |why: String| Err(ControllerError::InvalidSettings(why));
    if s.partitions == 0 || s.partitions > PARTITIONS_MAX {
        return bad(format!(
            "partitions must be 1 to {PARTITIONS_MAX}, not {}",
            s.partitions
        ));
    }
    if s.replication_factor == 0 {
        return bad("replication factor must be at least 1".into());
    }
    if s.retention_ms == Some(0) || s.retention_bytes == Some(0) {
        return bad("a retention limit of 0 would delete everything; leave it unset to keep forever".into());
    }
    if let FsyncSetting::Interval { ms, bytes } = s.fsync {
        if ms == 0 && bytes == 0 {
            return bad("an fsync interval needs ms or bytes".into());
        }
    }
    if s.min_insync_replicas > s.replication_factor {
        return bad(format!(
            "min insync replicas {} is above the replication factor {}: no acks=all produce could succeed",
            s.min_insync_replicas, s.replication_factor
        ));
    }
    if !(1..=1000).contains(&s.max_delivery_attempts) {
        return bad(format!(
            "max delivery attempts must be 1 to 1000, not {}",
            s.max_delivery_attempts
        ));
    }
    if s.segment_bytes != 0 && s.segment_bytes < 64 << 10 {
        return bad(format!(
            "segment bytes must be at least 64 KiB, not {}",
            s.segment_bytes
        ));
    }
    if s.max_message_bytes == 0 || s.max_message_bytes > MESSAGE_BYTES_MAX {
        return bad(format!(
            "max message bytes must be 1 to {MESSAGE_BYTES_MAX}, not {}",
            s.max_message_bytes
        ));
    }
    Ok(())
}

/// Where new partitions go: on live brokers only (none being
/// decommissioned), each partition's replicas on distinct brokers, each
/// new leader on the live broker that is the preferred leader (first
/// replica) of fewest partitions (and each follower on the one holding
/// fewest replicas), counting what the table already places (as it will be
/// once moves in progress complete) and what this placement added. Ties go to the lowest id. Deterministic: the same table
/// places the same way on every node.
struct Placement {
    /// (leaders, replicas) each live broker holds, by id.
    load: std::collections::BTreeMap<NodeId, (usize, usize)>,
    /// Live brokers in maintenance: a new partition's leader only when
    /// every live broker is.
    draining: std::collections::BTreeSet<NodeId>,
}

impl Placement {
    /// The load of the live brokers in `table`; refused when fewer than `rf`.
    fn of(table: &MetadataTable, rf: u16) -> Result<Placement, ControllerError> {
        let mut load: std::collections::BTreeMap<NodeId, (usize, usize)> = table
            .brokers
            .values()
            .filter(|b| b.alive && !b.decommissioning)
            .map(|b| (b.id, (0, 0)))
            .collect();
        if usize::from(rf) > load.len() {
            return Err(ControllerError::NotEnoughBrokers {
                wanted: rf,
                brokers: load.len(),
            });
        }
        // Counted as they will be once moves in progress complete and
        // leader balancing ran: preferred leaders, target replicas.
        for p in table.queues.values().flat_map(|q| &q.partitions) {
            let replicas = p.target.as_ref().unwrap_or(&p.replicas);
            for (i, r) in replicas.iter().enumerate() {
                if let Some(l) = load.get_mut(r) {
                    l.0 += usize::from(i == 0);
                    l.1 += 1;
                }
            }
        }
        let draining = table
            .brokers
            .values()
            .filter(|b| b.alive && b.in_maintenance())
            .map(|b| b.id)
            .collect();
        Ok(Placement { load, draining })
    }

    /// Places one partition with `rf` replicas (at most the live brokers).
    fn place(&mut self, rf: u16) -> PartitionRecord {
        let draining = &self.draining;
        let pick = |load: &std::collections::BTreeMap<NodeId, (usize, usize)>,
                    taken: &[NodeId],
                    key: fn(&(usize, usize)) -> (usize, usize)| {
            // A draining broker leads only if every one is.
            let leading = taken.is_empty();
            load.iter()
                .filter(|(id, _)| !taken.contains(id))
                .min_by_key(|(id, l)| (leading && draining.contains(id), key(l), **id))
                .map(|(id, _)| *id)
        };
        let mut replicas: Vec<NodeId> = Vec::with_capacity(usize::from(rf));
        while replicas.len() < usize::from(rf) {
            // The leader by leaders held (then replicas); followers by replicas.
            let key: fn(&(usize, usize)) -> (usize, usize) = match replicas.is_empty() {
                true => |l| (l.0, l.1),
                false => |l| (l.1, l.0),
            };
            let Some(id) = pick(&self.load, &replicas, key) else {
                break;
            };
            if let Some(l) = self.load.get_mut(&id) {
                l.0 += usize::from(replicas.is_empty());
                l.1 += 1;
            }
            replicas.push(id);
        }
        PartitionRecord {
            leader: replicas[0],
            leader_epoch: 0,
            isr: replicas.clone(),
            replicas,
            partition_epoch: 0,
            target: None,
            lost: None,
            decommission_moves: Vec::new(),
        }
    }
}

mod reassign;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
