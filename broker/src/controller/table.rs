//! The cluster metadata table: brokers, queues, partitions.
//!
//! Runs on: built on shard 0 by the controller's state machine, then shared
//! read-only with every shard (an `Arc<MetadataTable>` per change).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::acls::AclEntry;
use super::proposals::ProposalSession;
use super::users::UserRecord;

/// A node's id in the cluster (also its Raft node id).
pub type NodeId = u64;

/// A broker that registered with the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRecord {
    pub id: NodeId,
    /// Where clients reach it, `host:port`.
    pub address: String,
    /// Its shards, one per core (0: unknown, from an older log). Clients
    /// use it to connect to the shard that owns a partition.
    #[serde(default)]
    pub shards: u16,
    /// False once its lease with the controller leader expired (fenced):
    /// new partitions are not placed on it until it heartbeats again.
    /// Absent in tables written before liveness: alive.
    #[serde(default = "alive")]
    pub alive: bool,
    /// Which run of the broker process registered (random per start; 0 in
    /// tables written before it existed). A new one means the broker
    /// restarted, and may have lost what it had not fdatasync'd.
    #[serde(default)]
    pub incarnation: u64,
    /// In maintenance (`strand node drain`): it leads nothing it can hand
    /// to another in-sync replica, stays a follower, and is given no
    /// leadership by placement, failover or leader balancing while another
    /// replica can take it. Kept across its restarts until undrained.
    #[serde(default)]
    pub draining: bool,
    /// Being decommissioned (`strand node decommission`): each of its
    /// replicas moves to another broker (a reassignment each, see
    /// [`PartitionRecord::target`]), it leads nothing another in-sync
    /// replica can, and placement gives it nothing new. Kept across its
    /// restarts: once its last replica moved, it holds nothing and can be
    /// switched off.
    #[serde(default)]
    pub decommissioning: bool,
    /// Its data directory's id (random, made when the directory was first
    /// used: `broker/src/server/data_dir.rs`; 0 from brokers or tables
    /// that predate it). A registration with another id means the broker
    /// lost what it held (a replaced or wiped disk, a mount that failed):
    /// it leaves every ISR, and a partition it alone held waits for it to
    /// come back with this id ([`PartitionRecord::lost`]).
    #[serde(default)]
    pub directory: u64,
}

impl BrokerRecord {
    /// Draining or decommissioning: it leads nothing another in-sync
    /// replica can lead.
    pub fn in_maintenance(&self) -> bool {
        self.draining || self.decommissioning
    }
}

fn alive() -> bool {
    true
}

/// When a queue's appended data is fdatasync'd.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsyncSetting {
    Always,
    Interval { ms: u64, bytes: u64 },
}

/// A queue's settings, every one resolved (no "default" left).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSettings {
    pub partitions: u32,
    pub replication_factor: u16,
    /// `None`: kept forever.
    pub retention_ms: Option<u64>,
    /// `None`: no size limit.
    pub retention_bytes: Option<u64>,
    pub fsync: FsyncSetting,
    pub max_message_bytes: u32,
    /// Ack-mode deliveries of a record before it is dead-lettered (absent
    /// in tables written before the setting existed: the default).
    #[serde(default = "default_max_delivery_attempts")]
    pub max_delivery_attempts: u32,
    /// In-sync replicas an acks=all produce needs (0 in tables written
    /// before the setting: [`default_min_insync_replicas`]).
    #[serde(default)]
    pub min_insync_replicas: u16,
    /// A segment rolls before it grows past this (0: the broker's
    /// `segment_bytes`). Set by the broker for its own `__groups` (small
    /// segments, so compaction frees space soon); not a client setting.
    #[serde(default)]
    pub segment_bytes: u64,
}

impl QueueSettings {
    /// Settings for tests: `partitions` of `rf` replicas, fsync=always,
    /// 1 MiB messages, no retention, the defaults for the rest.
    #[cfg(test)]
    pub fn for_tests(partitions: u32, rf: u16) -> QueueSettings {
        QueueSettings {
            partitions,
            replication_factor: rf,
            retention_ms: None,
            retention_bytes: None,
            fsync: FsyncSetting::Always,
            max_message_bytes: 1 << 20,
            max_delivery_attempts: DEFAULT_MAX_DELIVERY_ATTEMPTS,
            min_insync_replicas: 0,
            segment_bytes: 0,
        }
    }

    /// In-sync replicas an acks=all produce needs.
    pub fn min_insync(&self) -> usize {
        match self.min_insync_replicas {
            0 => default_min_insync_replicas(self.replication_factor),
            n => usize::from(n),
        }
    }
}

/// acks=all needs this many in-sync replicas unless a queue says: 2 with
/// three replicas or more (one may be lost without losing an acknowledged
/// record and still accept writes), else 1.
pub fn default_min_insync_replicas(replication_factor: u16) -> usize {
    if replication_factor >= 3 {
        2
    } else {
        1
    }
}

/// The default of [`QueueSettings::max_delivery_attempts`].
pub const DEFAULT_MAX_DELIVERY_ATTEMPTS: u32 = 5;

fn default_max_delivery_attempts() -> u32 {
    DEFAULT_MAX_DELIVERY_ATTEMPTS
}

/// No leader: every in-sync replica is fenced, or the last one lost its
/// data (the partition is offline until one comes back; an unclean
/// election only when an operator asks for one: `strand queue elect
/// --unclean`).
pub const NO_LEADER: NodeId = 0;

/// The last in-sync replica of a partition, which came back with another
/// data directory than the one it held the partition's records in: only
/// that broker with that directory holds everything the partition
/// committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostReplica {
    pub broker: NodeId,
    /// The directory id ([`BrokerRecord::directory`]) it held them in.
    pub directory: u64,
    /// [`MetadataTable::directories_replaced`] when the partition went
    /// offline: a replica whose broker's directory was replaced later
    /// ([`MetadataTable::directory_replaced_at`]) holds nothing of it, and
    /// an unclean election takes it last (0 in older tables).
    #[serde(default)]
    pub after: u64,
}

/// One partition: where its replicas live and who leads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRecord {
    /// The first is the preferred leader.
    pub replicas: Vec<NodeId>,
    /// [`NO_LEADER`] while offline.
    pub leader: NodeId,
    /// Bumped on every leader change.
    pub leader_epoch: u32,
    /// In-sync replicas, in replica order (the leader among them).
    pub isr: Vec<NodeId>,
    /// Bumped on every change of leader or ISR: an ISR change is accepted
    /// only from the leader that saw the current one (absent in older
    /// tables: 0).
    #[serde(default)]
    pub partition_epoch: u32,
    /// A reassignment in progress (`strand queue reassign`, a
    /// decommission): the replicas the partition ends with, the first the
    /// preferred leader. Meanwhile `replicas` holds these first, then the
    /// ones it removes: new replicas follow the leader like any other, and
    /// once every one of these is in the ISR, `replicas` becomes this list,
    /// the others leave (the leader too, in a new leader epoch, if it is not
    /// in it) and this goes back to `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Vec<NodeId>>,
    /// The decommissions moving this partition, while that move is in
    /// progress: one entry per leaving broker, so that cancelling that
    /// broker's decommission moves the partition back
    /// ([`DecommissionMove`]). Cleared when the move completes or an
    /// operator's reassignment replaces it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decommission_moves: Vec<DecommissionMove>,
    /// Set while the partition is offline because its last in-sync replica
    /// lost its data: the ISR is empty, no replica is known to hold every
    /// committed record but that broker's old directory, and the partition
    /// waits for it (the broker registering with that directory again
    /// leads it) or for an unclean election (`strand queue elect
    /// --unclean`, which accepts the loss). Never set with a leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<LostReplica>,
}

/// One decommission's part in a partition's move: broker `leaving` is
/// replaced by `replacement`; before, the partition was headed for
/// `before` (its replicas, or the target of a move then in progress).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecommissionMove {
    pub leaving: NodeId,
    pub replacement: NodeId,
    pub before: Vec<NodeId>,
}

/// A queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRecord {
    /// Unique for the cluster's lifetime: a queue deleted and created again
    /// under the same name gets a new id.
    pub id: u64,
    pub name: String,
    pub settings: QueueSettings,
    /// Indexed by partition number.
    pub partitions: Vec<PartitionRecord>,
}

/// Everything the controller knows. Cloned into every shard on change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataTable {
    /// Raft log index of the last command applied (0: none).
    pub applied_index: u64,
    pub brokers: BTreeMap<NodeId, BrokerRecord>,
    pub queues: BTreeMap<String, QueueRecord>,
    /// The id the next created queue gets.
    pub next_queue_id: u64,
    /// Partitions given a leader by an unclean election since the cluster
    /// began (`strand_unclean_elections_total`).
    #[serde(default)]
    pub unclean_elections: u64,
    /// How many times a broker came back with another data directory
    /// since the cluster began (a wiped or replaced disk).
    #[serde(default)]
    pub directories_replaced: u64,
    /// Per broker, [`MetadataTable::directories_replaced`] right after its
    /// directory was last replaced (absent: never).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub directory_replaced_at: BTreeMap<NodeId, u64>,
    /// The proposals each proposer run may still send again, with their
    /// answers (see [`super::proposals`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub proposals: Vec<ProposalSession>,
    /// SASL users by name: only their salted SCRAM keys (`super::users`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub users: BTreeMap<String, UserRecord>,
    /// The cluster has held a user (`BootstrapUsers` applies only before).
    #[serde(default)]
    pub had_users: bool,
    /// Who may do what (`super::acls`), sorted, without repeats.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acls: Vec<AclEntry>,
    /// Keys the decoy salt a SCRAM login for an unknown name is shown
    /// (`strand_net::scram::decoy_salt`): random, set once, the same on
    /// every broker, so no broker tells a known name from an unknown one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decoy_secret: Vec<u8>,
}

impl MetadataTable {
    /// The table's structural invariants, per partition (the controller
    /// simulation checks them after every command, and the fuzz target
    /// `controller_payload` after any command a payload decodes to):
    /// replicas distinct and as many as the replication factor (with a
    /// move in progress: the target a prefix of them with that many, and
    /// not heading for a decommissioning broker); the ISR a subset of the
    /// replicas, in replica order, empty exactly while the partition waits
    /// for a lost replica (and then leaderless); the leader an ISR member
    /// on an alive broker, or none. `Err` names the first broken one.
    pub fn check_structure(&self) -> Result<(), String> {
        for (name, q) in &self.queues {
            let rf = usize::from(q.settings.replication_factor);
            for (i, p) in q.partitions.iter().enumerate() {
                // Only on a finding: this runs over every partition.
                let at = || format!("{name}/{i}: {p:?}");
                let mut distinct = p.replicas.clone();
                distinct.sort();
                distinct.dedup();
                if distinct.len() != p.replicas.len() {
                    return Err(format!("replicas repeat a broker: {}", at()));
                }
                match &p.target {
                    Some(t) if t.len() != rf || !p.replicas.starts_with(t) => {
                        return Err(format!(
                            "the target is not a prefix of the replicas of the replication factor: {}",
                            at()
                        ))
                    }
                    None if p.replicas.len() != rf => {
                        return Err(format!("not as many replicas as the factor: {}", at()))
                    }
                    _ => {}
                }
                if p.isr.iter().any(|r| !p.replicas.contains(r)) {
                    return Err(format!("the ISR holds a non-replica: {}", at()));
                }
                let leaving = |r: &NodeId| self.brokers.get(r).is_some_and(|b| b.decommissioning);
                if p.target.as_ref().is_some_and(|t| t.iter().any(leaving)) {
                    return Err(format!("a move heads for a decommissioning broker: {}", at()));
                }
                if !p.decommission_moves.is_empty() && p.target.is_none() {
                    return Err(format!("a decommission's move is remembered without a move: {}", at()));
                }
                if p.isr.is_empty() != p.lost.is_some() || (p.lost.is_some() && p.leader != NO_LEADER) {
                    return Err(format!(
                        "an empty ISR without a lost replica, or the reverse, or led: {}",
                        at()
                    ));
                }
                let in_order: Vec<NodeId> = p.replicas.iter().copied().filter(|r| p.isr.contains(r)).collect();
                if in_order != p.isr {
                    return Err(format!("the ISR is not in replica order: {}", at()));
                }
                if p.leader != NO_LEADER {
                    if !p.isr.contains(&p.leader) {
                        return Err(format!("the leader is not in the ISR: {}", at()));
                    }
                    if !self.brokers.get(&p.leader).is_some_and(|b| b.alive) {
                        return Err(format!("the leader is not alive: {}", at()));
                    }
                }
            }
        }
        Ok(())
    }

    pub fn queue(&self, name: &str) -> Option<&QueueRecord> {
        self.queues.get(name)
    }

    /// The partitions (queue, partition) led by `node`.
    pub fn led_by(&self, node: NodeId) -> impl Iterator<Item = (&QueueRecord, u32)> {
        self.queues.values().flat_map(move |q| {
            q.partitions
                .iter()
                .enumerate()
                .filter(move |(_, p)| p.leader == node)
                .map(move |(i, _)| (q, i as u32))
        })
    }
}
