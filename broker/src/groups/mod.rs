//! Consumer groups: the coordinator (DESIGN.md §8).
//!
//! Runs on: the shard that owns the group's `__groups` partition. A group's
//! coordinator is the leader of partition `fnv1a64(group) % N` of the
//! internal queue [`GROUPS_QUEUE`] (created with [`GROUPS_PARTITIONS`]
//! partitions on the first group request); within a node, the shard that
//! owns that partition (`routing::shard_for`) serves every request of the
//! group, so a group's state is touched by one thread only and needs no lock.
//! Requests that arrive elsewhere are forwarded like any partition request.
//!
//! - `assign.rs`: the strategies (range, round-robin, sticky): pure.
//! - `group.rs`: one group's rules (members, sessions, generations, the
//!   cooperative hand-over, commit fencing): pure, time passed in.
//! - `ack.rs`: ack mode — per-record state (acquired / available / done,
//!   delivery counts) between a partition's position and the newest record
//!   handed out: pure.
//! - `record.rs`: the `__groups` records that make the durable part — the
//!   group's existence and settings, committed positions — survive
//!   restarts.
//! - `replay.rs`: rebuilding the groups from those records (from the
//!   newest snapshot on), and the snapshot compaction writes: pure.
//!
//! # Durability and replay
//! Every durable change is appended to the group's `__groups` partition
//! (fsync=always, replicated like data: RF = min(3, live brokers) when the
//! queue is created, the default minimum ISR, acks=all) and is committed
//! before it is applied and answered. The first request that reaches a
//! `__groups` partition's leader in a leader epoch (after a start, or after
//! leadership came to this replica) replays it from its start to its log
//! end, once the high watermark has reached that end (`replay`): later
//! records win, `Deleted` removes a group. A replica that stops leading
//! drops its groups.
//! Membership is not stored: after a restart members get `UnknownMember` at
//! their next heartbeat and join again (with the group's positions intact).
//! Generations start past the wall clock (ms) at each replay, so they do
//! not repeat across restarts. After a restart, members from before it may
//! read their partitions until their next heartbeat (at most
//! [`HEARTBEAT_MAX`] away) tells them to re-join: for [`RESTART_GRACE`]
//! only partitions a member reports holding are granted.
//!
//! `__groups` has no retention (a commit must not expire): it grows with
//! every commit, and in ack mode with every delivery and settle (about 60
//! bytes each; a settle request writes one batch of settles and one
//! commit, however many records it settles). Compaction bounds it: once a
//! partition grew `groups_compact_bytes`, its leader writes a snapshot of
//! its groups as of its high watermark and deletes the segments before it
//! ([`compact`]; the rebuild rules are `replay.rs`).

pub mod ack;
pub mod assign;
pub mod group;
pub mod record;
pub mod replay;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strand_storage::{Log, Offset};
use strand_wire::batch::RecordBatch;
use strand_wire::ErrorCode;

use self::ack::{AckState, Outcome};
use self::assign::{Strategy, Tp};
use self::group::{Group, GroupError, Member, Start};
use self::record::{GroupChange, Settled, Stored};
use self::replay::Rebuild;
use crate::controller::{Command, ControllerError, FsyncSetting, MetadataTable, ProposeError, QueueSettings};
use crate::shard::messages::{
    LocalTask, OffsetQuery, OpenPartition, PartitionCall, PartitionRequest, Reply, WireError,
};
use crate::shard::partitions::Partition;
use crate::shard::Shard;

/// The internal queue that holds group state.
pub const GROUPS_QUEUE: &str = "__groups";
/// Its partition count, fixed when it is created (coordinators are found by
/// hashing over it, so it never changes).
pub const GROUPS_PARTITIONS: u32 = 8;
/// Members heartbeat at least this often (whatever their session timeout)…
pub const HEARTBEAT_MAX: Duration = Duration::from_secs(3);
/// …so after a coordinator restart, partitions nobody reports holding are
/// granted only after this long (see `Group::grace_until`).
pub const RESTART_GRACE: Duration = Duration::from_secs(5);
/// Session timeouts a member may ask for.
pub const SESSION_TIMEOUT_MIN: Duration = Duration::from_millis(500);
pub const SESSION_TIMEOUT_MAX: Duration = Duration::from_secs(300);

/// Ack mode: most records between a partition's position and the newest
/// handed out.
pub const IN_FLIGHT_WINDOW: u64 = 2000;
/// How long the coordinator's own acks=all writes (`__groups`, dead
/// letters) may wait for the in-sync replicas.
const INTERNAL_WRITE_TIMEOUT_MS: u32 = 30_000;
/// How long a new coordinator waits for its `__groups` partition's high
/// watermark to reach the log end before it answers `Timeout` (retried).
const LOAD_WAIT: Duration = Duration::from_secs(5);
/// Ack mode: lock periods a member may ask for.
pub const LOCK_MIN: Duration = Duration::from_millis(100);
pub const LOCK_MAX: Duration = Duration::from_secs(3600);
/// Headers a dead-lettered record carries besides its own.
pub const DLQ_HEADERS: [&str; 5] = [
    "strand.source.queue",
    "strand.source.partition",
    "strand.source.offset",
    "strand.attempts",
    "strand.last_error",
];

/// The dead-letter queue of `queue`: `<queue>.dlq`, or, where that would
/// be longer than a queue name may be (`strand_wire::QUEUE_NAME_MAX`, 200
/// bytes), the first 187 bytes of the name, `-`, eight hex digits of the
/// whole name's FNV-1a hash and `.dlq` (200 bytes): every queue, a
/// dead-letter queue too, has a dead-letter queue that can be created. The
/// records keep their source queue's full name in `strand.source.queue`.
pub fn dlq_name(queue: &str) -> String {
    const SUFFIX: &str = ".dlq";
    let plain = format!("{queue}{SUFFIX}");
    if plain.len() <= strand_wire::QUEUE_NAME_MAX {
        return plain;
    }
    let hash = strand_wire::fnv1a64(queue.as_bytes()) as u32;
    let keep = strand_wire::QUEUE_NAME_MAX - SUFFIX.len() - 9;
    // Queue names are ASCII ([A-Za-z0-9._-]): any byte is a boundary.
    let prefix = queue.get(..keep).unwrap_or(queue);
    format!("{prefix}-{hash:08x}{SUFFIX}")
}

/// Why `offset` is no place to start reading `queue`/`partition`, whose
/// log holds offsets `start` to `end` (the end: where the next record
/// goes); `None` if it is one. The rule of `group reset --to offset:N` and
/// of `consume --from offset:N`.
pub fn offset_outside_log(queue: &str, partition: u32, offset: u64, start: u64, end: u64) -> Option<String> {
    (!(start..=end).contains(&offset))
        .then(|| format!("offset {offset} is outside {queue}/{partition}'s log (offsets {start} to {end})"))
}

/// Whether a queue name is reserved for the broker's own queues.
pub fn is_internal(queue: &str) -> bool {
    queue.starts_with("__")
}

/// Where a reset moves a group's positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTo {
    Earliest,
    Latest,
    Offset(u64),
    Timestamp(i64),
}

/// A member's join.
#[derive(Debug)]
pub struct JoinRequest {
    pub group: String,
    pub queues: Vec<String>,
    /// These two apply when the join creates the group.
    pub strategy: Strategy,
    pub start: Start,
    pub session_timeout: Duration,
    pub client_name: String,
}

impl GroupOp {
    /// The group and member an operation acts as, for those that name one.
    fn member(&self) -> Option<(&str, &str)> {
        match self {
            GroupOp::Heartbeat { group, member_id, .. }
            | GroupOp::Leave { group, member_id }
            | GroupOp::Commit { group, member_id, .. }
            | GroupOp::Receive { group, member_id, .. }
            | GroupOp::Settle { group, member_id, .. } => Some((group, member_id)),
            GroupOp::Join(_)
            | GroupOp::FetchOffsets { .. }
            | GroupOp::List
            | GroupOp::Describe { .. }
            | GroupOp::Reset { .. }
            | GroupOp::Delete { .. } => None,
        }
    }
}

/// A group request, as the coordinator's shard receives it.
#[derive(Debug)]
pub enum GroupOp {
    Join(JoinRequest),
    Heartbeat {
        group: String,
        member_id: String,
        owned: Vec<Tp>,
    },
    Leave {
        group: String,
        member_id: String,
    },
    Commit {
        group: String,
        member_id: String,
        generation: u64,
        offsets: Vec<(Tp, u64)>,
    },
    /// Empty `partitions`: every committed position.
    FetchOffsets {
        group: String,
        partitions: Vec<Tp>,
    },
    /// The groups of this `__groups` partition.
    List,
    Describe {
        group: String,
    },
    Reset {
        group: String,
        queue: String,
        partitions: Vec<u32>,
        to: ResetTo,
    },
    Delete {
        group: String,
    },
    /// Ack mode: hand out records of the member's partitions under a lock.
    Receive {
        group: String,
        member_id: String,
        max_records: u32,
        lock: Duration,
    },
    Settle {
        group: String,
        member_id: String,
        records: Vec<SettleItem>,
    },
}

/// One record settled by a member.
#[derive(Debug, Clone)]
pub struct SettleItem {
    pub tp: Tp,
    pub offset: u64,
    pub outcome: Outcome,
    pub reason: Option<String>,
}

/// Records handed out from one partition: whole batches, of which the
/// records at `offsets` (with their delivery attempt) are the member's.
#[derive(Debug, Clone)]
pub struct ReceivedPart {
    pub tp: Tp,
    pub batches: Vec<bytes::Bytes>,
    pub offsets: Vec<(u64, u32)>,
}

#[derive(Debug, Clone)]
pub struct GroupSummary {
    pub name: String,
    pub members: u32,
    pub generation: u64,
}

#[derive(Debug, Clone)]
pub struct MemberDescription {
    pub id: String,
    pub client_name: String,
    pub queues: Vec<String>,
    pub owned: Vec<Tp>,
}

#[derive(Debug, Clone)]
pub struct PartitionDescription {
    pub tp: Tp,
    pub member: Option<String>,
    pub position: Option<u64>,
    pub log_start: Option<u64>,
    pub log_end: Option<u64>,
    pub error: Option<WireError>,
}

#[derive(Debug, Clone)]
pub struct GroupDescription {
    pub strategy: Strategy,
    pub start: Start,
    pub generation: u64,
    pub members: Vec<MemberDescription>,
    pub partitions: Vec<PartitionDescription>,
}

/// Where a coordinator operation runs: the shard, the group's `__groups`
/// partition (its number and its open log) and the group.
#[derive(Clone, Copy)]
struct At<'a> {
    shard: &'a Rc<Shard>,
    p: u32,
    part: &'a Rc<Partition>,
    group: &'a str,
}

/// The coordinator's answer.
#[derive(Debug)]
pub enum GroupReply {
    Joined {
        member_id: String,
        generation: u64,
        heartbeat_interval: Duration,
    },
    Heartbeat {
        generation: u64,
        assigned: Vec<Tp>,
        /// Partitions meant for the member that it may not hold yet.
        withheld: u32,
    },
    Done,
    Offsets {
        start: Start,
        offsets: Vec<(Tp, Option<u64>)>,
    },
    List(Vec<GroupSummary>),
    Describe(GroupDescription),
    Reset(Vec<(Tp, u64)>),
    Received(Vec<ReceivedPart>),
}

/// The groups of one replayed `__groups` partition.
struct Loaded {
    /// The `__groups` queue's id when replayed (a new queue is replayed anew).
    queue_id: u64,
    /// The leader epoch it was replayed in: a replica that leads again
    /// after another did replays anew (that leader appended meanwhile).
    epoch: u32,
    groups: BTreeMap<String, Group>,
}

/// One shard's coordinator: the groups of the `__groups` partitions it owns.
pub struct Coordinator {
    loaded: RefCell<HashMap<u32, Loaded>>,
    /// One replay at a time.
    loading: glommio::sync::Semaphore,
    /// Unique part of this incarnation's member ids.
    nonce: u64,
    next_member: Cell<u64>,
    /// Rotates where receives start (fairness between partitions).
    next_turn: Cell<usize>,
    /// Per `__groups` partition led here: its size after its last
    /// compaction (see [`Coordinator::compact_grown`]).
    compacted: RefCell<HashMap<u32, u64>>,
}

impl Default for Coordinator {
    fn default() -> Self {
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Coordinator {
            loaded: RefCell::new(HashMap::new()),
            loading: glommio::sync::Semaphore::new(1),
            nonce,
            next_member: Cell::new(0),
            next_turn: Cell::new(0),
            compacted: RefCell::new(HashMap::new()),
        }
    }
}

fn group_error(e: GroupError) -> WireError {
    match e {
        GroupError::UnknownMember(m) => WireError::new(
            ErrorCode::UnknownMember,
            format!("no member {m:?} in the group (its session expired, or it left): join again"),
        ),
        GroupError::Fenced(m) => WireError::new(ErrorCode::FencedMember, m),
    }
}

fn unknown_group(group: &str) -> WireError {
    WireError::new(ErrorCode::UnknownGroup, format!("group {group:?} does not exist"))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Partition counts of `queues` from the shard's metadata table (queues
/// that do not exist are left out).
fn counts(shard: &Shard, queues: &[String]) -> BTreeMap<String, u32> {
    let table = shard.table();
    queues
        .iter()
        .filter_map(|q| table.queue(q).map(|r| (q.clone(), r.partitions.len() as u32)))
        .collect()
}

/// The `__groups` partition count, creating the queue if it is missing.
pub async fn groups_partitions(shard: &Rc<Shard>) -> Result<u32, WireError> {
    if let Some(q) = shard.table().queue(GROUPS_QUEUE) {
        return Ok(q.partitions.len() as u32);
    }
    // Replicated like data: three copies where there are three brokers.
    let alive = shard.table().brokers.values().filter(|b| b.alive).count();
    let settings = QueueSettings {
        partitions: GROUPS_PARTITIONS,
        replication_factor: alive.clamp(1, 3) as u16,
        // A committed position must not expire (see the module doc).
        retention_ms: None,
        retention_bytes: None,
        fsync: FsyncSetting::Always,
        max_message_bytes: shard.config.max_message_bytes,
        max_delivery_attempts: crate::controller::DEFAULT_MAX_DELIVERY_ATTEMPTS,
        // The default: 2 with three replicas.
        min_insync_replicas: 0,
        segment_bytes: shard.config.groups_segment_bytes,
    };
    let command = Command::CreateQueue {
        name: GROUPS_QUEUE.to_string(),
        settings,
    };
    match shard.propose(command).await {
        Ok(()) | Err(ProposeError::Refused(ControllerError::QueueExists(_))) => {}
        Err(ProposeError::Refused(c)) => return Err(WireError::new(c.code(), c.to_string())),
        Err(ProposeError::Unavailable(m)) => return Err(WireError::new(ErrorCode::ControllerUnavailable, m)),
    }
    shard
        .table()
        .queue(GROUPS_QUEUE)
        .map(|q| q.partitions.len() as u32)
        .ok_or_else(|| {
            WireError::new(
                ErrorCode::ControllerUnavailable,
                "creating __groups did not take; retry",
            )
        })
}

/// The `__groups` partition that coordinates `group`.
pub async fn coordinator_partition(shard: &Rc<Shard>, group: &str) -> Result<u32, WireError> {
    let n = groups_partitions(shard).await?;
    Ok(strand_wire::partition_for_key(group.as_bytes(), n))
}

/// Sets up the coordinator on `shard` before it serves: its groups are
/// dropped with the `__groups` partitions the shard stops holding, and
/// their state of queues deleted (or created anew), at each metadata
/// table; a timer expires members' sessions.
pub fn start(shard: &Rc<Shard>) {
    let coordinator = shard.ext.get_or_default::<Coordinator>();
    shard.on_table_applied(Box::new(move |shard, table| {
        coordinator.retain(|p| {
            shard
                .partitions
                .get(GROUPS_QUEUE, p)
                .is_some_and(|part| part.leading().is_some())
        });
        coordinator.forget_deleted_queues(table);
    }));
    let s = shard.clone();
    glommio::spawn_local(async move {
        let coordinator = s.ext.get_or_default::<Coordinator>();
        while !s.stopping.get() {
            // A shard that coordinates no group has no session to expire.
            let every = if coordinator.is_empty() { 1000 } else { 100 };
            glommio::timer::sleep(Duration::from_millis(every)).await;
            coordinator.expire_sessions(&s);
        }
    })
    .detach();
    let s = shard.clone();
    glommio::spawn_local(async move {
        let coordinator = s.ext.get_or_default::<Coordinator>();
        while !s.stopping.get() {
            glommio::timer::sleep(COMPACT_CHECK).await;
            coordinator.compact_grown(&s).await;
        }
    })
    .detach();
}

/// How often a shard looks whether a `__groups` partition it leads grew
/// enough to compact.
const COMPACT_CHECK: Duration = Duration::from_secs(1);

/// Compacts a `__groups` partition this replica leads: writes a snapshot
/// of its groups as of its log end C once committed (rebuilt from the log, not
/// from memory: a change appended but not yet applied is in the log, and
/// one appended after C is newer than the snapshot whatever its position;
/// see `replay`), acks=all, then deletes the segments wholly below C.
/// Returns the new log start if it moved. Followers delete the same once
/// they hold it (`crate::replication` follows the leader's log start).
async fn compact(shard: &Rc<Shard>, part: &Rc<Partition>) -> Result<Option<Offset>, WireError> {
    let log = &part.log;
    let Some(epoch) = part.leading() else {
        return Ok(None);
    };
    // As of the log end, once the followers confirmed it: a high watermark
    // from a checkpoint may be stale after a start (it could fall inside
    // the previous snapshot, whose end marker it would not see).
    let end = log.log_end();
    if end > log.log_start() && log.high_watermark() < end {
        let deadline = Instant::now() + LOAD_WAIT;
        shard.wait_replicated(part, epoch, Offset(end.0 - 1), deadline).await?;
    }
    let covers = end;
    // A segment to delete (a __groups made before `segment_bytes` existed
    // rolls at 1 GiB: nothing to gain before that).
    if covers <= log.log_start() || !log.deletable_before(covers) {
        return Ok(None);
    }
    let table = shard.table();
    let (groups, found) = rebuild(log, covers, &table, 0).await?;
    if found.is_none() && log.log_start() > Offset(0) {
        return Err(WireError::new(
            ErrorCode::StorageError,
            format!(
                "__groups starts at {} with no complete snapshot before {}: not compacting",
                log.log_start().0,
                covers.0
            ),
        ));
    }
    let changes = replay::snapshot_changes(&groups);
    let batch_bytes = (part.settings.max_message_bytes as usize / 2).clamp(4 << 10, 256 << 10);
    let queue_id = |q: &str| table.queue(q).map_or(0, |r| r.id);
    for batch in record::snapshot_batches(&changes, covers.0, batch_bytes, now_ms(), queue_id) {
        shard.produce(part, batch, -1, INTERNAL_WRITE_TIMEOUT_MS).await?;
    }
    log.delete_before(covers).await.map_err(crate::shard::storage_error)
}

/// Adds the committed positions and rebalance counts of the groups this
/// shard coordinates to its metrics snapshot.
pub fn add_to_snapshot(shard: &Shard, snap: &mut crate::metrics::ShardSnapshot) {
    if let Some(coordinator) = shard.ext.get::<Coordinator>() {
        (snap.positions, snap.rebalances) = coordinator.positions();
    }
}

/// A group request on its way to the shard that owns its `__groups`
/// partition (see [`PartitionCall`]); build it with [`GroupCall::request`].
#[derive(Debug)]
pub struct GroupCall {
    op: GroupOp,
    /// The user whose ACLs decide (none: a superuser, a broker, `--auth
    /// none`): a member is its joiner's (`Group::check_owner`).
    user: Option<String>,
    reply: Reply<GroupReply>,
}

impl GroupCall {
    /// The partition request that carries `op`, sent by `user`, to its
    /// coordinator.
    pub fn request(op: GroupOp, user: Option<String>, reply: Reply<GroupReply>) -> PartitionRequest {
        PartitionRequest::Call(Box::new(GroupCall { op, user, reply }))
    }
}

impl PartitionCall for GroupCall {
    fn run(self: Box<Self>, at: OpenPartition) -> LocalTask {
        Box::pin(async move {
            let GroupCall { op, user, reply } = *self;
            let OpenPartition {
                shard,
                queue,
                partition,
                part,
            } = at;
            if queue != GROUPS_QUEUE {
                let err = WireError::new(ErrorCode::InvalidRequest, format!("{queue} holds no groups"));
                return reply.send(Err(err));
            }
            let coordinator = shard.ext.get_or_default::<Coordinator>();
            reply.send(coordinator.serve(&shard, partition, &part, op, user.as_deref()).await);
        })
    }

    fn fail(self: Box<Self>, err: WireError) {
        self.reply.send(Err(err));
    }
}

impl Coordinator {
    /// Serves `op` for `__groups` partition `p` (open here as `part`),
    /// sent by `user` (none: a superuser, a broker, `--auth none`), who
    /// may act only as the members it joined.
    pub async fn serve(
        &self,
        shard: &Rc<Shard>,
        p: u32,
        part: &Rc<Partition>,
        op: GroupOp,
        user: Option<&str>,
    ) -> Result<GroupReply, WireError> {
        self.ensure_loaded(shard, p, part).await?;
        if let Some((group, member_id)) = op.member() {
            let owned = self.with_group(p, group, |g| {
                g.check_owner(member_id, user)
                    .map_err(|e| WireError::new(ErrorCode::NotAuthorized, e))
            });
            match owned {
                Err(e) if e.code == ErrorCode::NotAuthorized => return Err(e),
                // An unknown group or member: the operation says so.
                _ => {}
            }
        }
        match op {
            GroupOp::Join(join) => self.join(shard, p, part, join, user).await,
            GroupOp::Heartbeat {
                group,
                member_id,
                mut owned,
            } => {
                owned.sort();
                owned.dedup();
                self.with_group(p, &group, |g| {
                    let c = counts(shard, &g.subscribed());
                    let (generation, assigned) = g
                        .heartbeat(&member_id, &owned, Instant::now(), c)
                        .map_err(group_error)?;
                    Ok(GroupReply::Heartbeat {
                        generation,
                        assigned,
                        withheld: g.withheld(&member_id),
                    })
                })
            }
            GroupOp::Leave { group, member_id } => self.with_group(p, &group, |g| {
                g.leave(&member_id, |queues| counts(shard, queues))
                    .map_err(group_error)?;
                Ok(GroupReply::Done)
            }),
            GroupOp::Commit {
                group,
                member_id,
                generation,
                offsets,
            } => {
                let tps: Vec<Tp> = offsets.iter().map(|(tp, _)| tp.clone()).collect();
                self.with_group(p, &group, |g| {
                    g.check_commit(&member_id, generation, &tps).map_err(group_error)?;
                    Ok(GroupReply::Done)
                })?;
                self.commit(
                    &At {
                        shard,
                        p,
                        part,
                        group: &group,
                    },
                    offsets,
                )
                .await?;
                Ok(GroupReply::Done)
            }
            GroupOp::FetchOffsets { group, partitions } => self.with_group(p, &group, |g| {
                let offsets = if partitions.is_empty() {
                    g.all_committed().map(|(tp, o)| (tp.clone(), Some(o))).collect()
                } else {
                    partitions
                        .into_iter()
                        .map(|tp| {
                            let o = g.committed(&tp);
                            (tp, o)
                        })
                        .collect()
                };
                Ok(GroupReply::Offsets {
                    start: g.start,
                    offsets,
                })
            }),
            GroupOp::List => {
                let loaded = self.loaded.borrow();
                let groups = loaded.get(&p).map(|l| &l.groups);
                let list = groups.into_iter().flatten().map(|(name, g)| GroupSummary {
                    name: name.clone(),
                    members: g.members().len() as u32,
                    generation: g.generation,
                });
                Ok(GroupReply::List(list.collect()))
            }
            GroupOp::Describe { group } => self.describe(shard, p, &group).await,
            GroupOp::Reset {
                group,
                queue,
                partitions,
                to,
            } => {
                self.reset(
                    &At {
                        shard,
                        p,
                        part,
                        group: &group,
                    },
                    &queue,
                    partitions,
                    to,
                )
                .await
            }
            GroupOp::Receive {
                group,
                member_id,
                max_records,
                lock,
            } => {
                self.receive(
                    &At {
                        shard,
                        p,
                        part,
                        group: &group,
                    },
                    &member_id,
                    max_records,
                    lock,
                )
                .await
            }
            GroupOp::Settle {
                group,
                member_id,
                records,
            } => {
                self.settle(
                    &At {
                        shard,
                        p,
                        part,
                        group: &group,
                    },
                    &member_id,
                    records,
                )
                .await
            }
            GroupOp::Delete { group } => {
                let write = append(shard, part, &group, &[GroupChange::Deleted]);
                self.while_empty(p, &group, "deleted", write).await?;
                if let Some(l) = self.loaded.borrow_mut().get_mut(&p) {
                    l.groups.remove(&group);
                }
                Ok(GroupReply::Done)
            }
        }
    }

    /// Runs `f` on a loaded group; `UnknownGroup` if there is none.
    fn with_group<T>(
        &self,
        p: u32,
        group: &str,
        f: impl FnOnce(&mut Group) -> Result<T, WireError>,
    ) -> Result<T, WireError> {
        let mut loaded = self.loaded.borrow_mut();
        let g = loaded
            .get_mut(&p)
            .and_then(|l| l.groups.get_mut(group))
            .ok_or_else(|| unknown_group(group))?;
        f(g)
    }

    fn check_empty(group: &str, g: &Group, what: &str) -> Result<(), WireError> {
        if g.members().is_empty() {
            return Ok(());
        }
        Err(WireError::new(
            ErrorCode::GroupNotEmpty,
            format!(
                "group {group:?} has {} active member(s); it can be {what} only when none is left \
                 (stop its consumers, or wait for their sessions to expire)",
                g.members().len()
            ),
        ))
    }

    /// Runs `write` (a reset or delete of `group`, `what` it is) if the
    /// group has no active member, refusing joins until it is written.
    async fn while_empty<T>(
        &self,
        p: u32,
        group: &str,
        what: &str,
        write: impl std::future::Future<Output = Result<T, WireError>>,
    ) -> Result<T, WireError> {
        self.with_group(p, group, |g| {
            Self::check_empty(group, g, what)?;
            g.busy = true;
            Ok(())
        })?;
        let written = write.await;
        // (After a delete the group is gone: nothing to clear.)
        let _ = self.with_group(p, group, |g| {
            g.busy = false;
            Ok(())
        });
        written
    }

    async fn join(
        &self,
        shard: &Rc<Shard>,
        p: u32,
        part: &Rc<Partition>,
        join: JoinRequest,
        user: Option<&str>,
    ) -> Result<GroupReply, WireError> {
        let JoinRequest {
            group,
            queues,
            strategy,
            start,
            session_timeout,
            client_name,
        } = join;
        if queues.is_empty() {
            return Err(WireError::new(
                ErrorCode::InvalidRequest,
                "a member must read at least one queue",
            ));
        }
        if !(SESSION_TIMEOUT_MIN..=SESSION_TIMEOUT_MAX).contains(&session_timeout) {
            return Err(WireError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "session timeout {session_timeout:?} must be between {SESSION_TIMEOUT_MIN:?} and {SESSION_TIMEOUT_MAX:?}"
                ),
            ));
        }
        let table = shard.table();
        for q in &queues {
            if table.queue(q).is_none() || is_internal(q) {
                return Err(WireError::new(
                    ErrorCode::UnknownQueue,
                    format!("queue {q:?} does not exist"),
                ));
            }
        }
        let exists = self.with_group(p, &group, |g| {
            if g.busy {
                return Err(WireError::new(
                    ErrorCode::Overloaded,
                    format!("group {group:?} is being reset or deleted; retry"),
                ));
            }
            Ok(())
        });
        if let Err(e) = &exists {
            if e.code == ErrorCode::Overloaded {
                return Err(e.clone());
            }
        }
        let exists = exists.is_ok();
        if !exists {
            append(shard, part, &group, &[GroupChange::Created { strategy, start }]).await?;
            let seed = generation_seed(part.log.log_end().0);
            if let Some(l) = self.loaded.borrow_mut().get_mut(&p) {
                l.groups
                    .entry(group.clone())
                    .or_insert_with(|| Group::created(strategy, start, seed));
            }
        }
        let n = self.next_member.get();
        self.next_member.set(n + 1);
        let name: String = client_name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .take(64)
            .collect();
        let member_id = format!(
            "{}-{:x}-{n}",
            if name.is_empty() { "member" } else { &name },
            self.nonce
        );
        let now = Instant::now();
        let member = Member {
            id: member_id.clone(),
            owner: user.map(str::to_string),
            client_name,
            queues,
            session_timeout,
            deadline: now + session_timeout,
        };
        self.with_group(p, &group, |g| {
            let mut all = g.subscribed();
            all.extend(member.queues.iter().cloned());
            g.join(member, counts(shard, &all));
            Ok(GroupReply::Joined {
                member_id,
                generation: g.generation,
                heartbeat_interval: (session_timeout / 3).clamp(Duration::from_millis(100), HEARTBEAT_MAX),
            })
        })
    }

    /// Makes `offsets` durable, then applies them as commits (an ack-mode
    /// position only moves forward).
    async fn commit(&self, at: &At<'_>, offsets: Vec<(Tp, u64)>) -> Result<(), WireError> {
        self.write_positions(at, offsets, false).await
    }

    /// Makes `offsets` durable, then applies them: as an operator's reset
    /// (`reset`: they may go back, and an ack-mode record state starts
    /// over) or as commits.
    async fn write_positions(&self, at: &At<'_>, offsets: Vec<(Tp, u64)>, reset: bool) -> Result<(), WireError> {
        let At { shard, p, part, group } = *at;
        if offsets.is_empty() {
            return Ok(());
        }
        let changes: Vec<GroupChange> = offsets
            .iter()
            .map(|((queue, partition), offset)| {
                let (queue, partition, offset) = (queue.clone(), *partition, *offset);
                match reset {
                    true => GroupChange::Reset {
                        queue,
                        partition,
                        offset,
                    },
                    false => GroupChange::Commit {
                        queue,
                        partition,
                        offset,
                    },
                }
            })
            .collect();
        let base = append(shard, part, group, &changes).await?;
        let table = shard.table();
        // The group may have been deleted meanwhile: then nothing to apply.
        let _ = self.with_group(p, group, |g| {
            for (i, (tp, offset)) in offsets.into_iter().enumerate() {
                if let Some(q) = table.queue(&tp.0) {
                    g.note_queue(&tp.0, q.id);
                }
                match reset {
                    true => g.apply_reset(tp, offset, base + i as u64),
                    false => g.apply_commit(tp, offset, base + i as u64),
                }
            }
            Ok(())
        });
        Ok(())
    }

    async fn describe(&self, shard: &Rc<Shard>, p: u32, group: &str) -> Result<GroupReply, WireError> {
        let (mut desc, tps) = self.with_group(p, group, |g| {
            let members = g
                .members()
                .iter()
                .map(|m| MemberDescription {
                    id: m.id.clone(),
                    client_name: m.client_name.clone(),
                    queues: m.queues.clone(),
                    owned: g.held_by(&m.id),
                })
                .collect();
            let mut queues = g.subscribed();
            queues.extend(g.all_committed().map(|((q, _), _)| q.clone()));
            queues.sort();
            queues.dedup();
            let mut tps: Vec<Tp> = Vec::new();
            for (q, n) in counts(shard, &queues) {
                tps.extend((0..n).map(|p| (q.clone(), p)));
            }
            let partitions = tps
                .iter()
                .map(|tp| PartitionDescription {
                    tp: tp.clone(),
                    member: g.holder(tp).map(str::to_string),
                    position: g.committed(tp),
                    log_start: None,
                    log_end: None,
                    error: None,
                })
                .collect();
            let desc = GroupDescription {
                strategy: g.strategy,
                start: g.start,
                generation: g.generation,
                members,
                partitions,
            };
            Ok((desc, tps))
        })?;
        for (d, tp) in desc.partitions.iter_mut().zip(tps) {
            let ends = async {
                let start = list_offset(shard, &tp, OffsetQuery::Earliest).await?;
                let end = list_offset(shard, &tp, OffsetQuery::Latest).await?;
                Ok::<_, WireError>((start, end))
            };
            match ends.await {
                Ok((s, e)) => (d.log_start, d.log_end) = (Some(s.0), Some(e.0)),
                Err(e) => d.error = Some(e),
            }
        }
        Ok(GroupReply::Describe(desc))
    }

    async fn reset(
        &self,
        at: &At<'_>,
        queue: &str,
        partitions: Vec<u32>,
        to: ResetTo,
    ) -> Result<GroupReply, WireError> {
        let At { shard, p, group, .. } = *at;
        self.with_group(p, group, |g| Self::check_empty(group, g, "reset"))?;
        let n = shard
            .table()
            .queue(queue)
            .map(|q| q.partitions.len() as u32)
            .ok_or_else(|| WireError::new(ErrorCode::UnknownQueue, format!("queue {queue:?} does not exist")))?;
        let partitions = if partitions.is_empty() {
            (0..n).collect()
        } else {
            partitions
        };
        let mut offsets = Vec::new();
        for q_p in partitions {
            if q_p >= n {
                return Err(WireError::new(
                    ErrorCode::UnknownPartition,
                    format!(
                        "partition {q_p} does not exist: queue {queue:?} has {n} (0 to {})",
                        n.saturating_sub(1)
                    ),
                ));
            }
            let tp = (queue.to_string(), q_p);
            let offset = match to {
                ResetTo::Earliest => list_offset(shard, &tp, OffsetQuery::Earliest).await?.0,
                ResetTo::Latest => list_offset(shard, &tp, OffsetQuery::Latest).await?.0,
                ResetTo::Timestamp(ts) => list_offset(shard, &tp, OffsetQuery::Timestamp(ts)).await?.0,
                ResetTo::Offset(o) => {
                    let start = list_offset(shard, &tp, OffsetQuery::Earliest).await?.0;
                    let end = list_offset(shard, &tp, OffsetQuery::Latest).await?.0;
                    if let Some(why) = offset_outside_log(queue, q_p, o, start, end) {
                        return Err(WireError::new(ErrorCode::OffsetOutOfRange, why));
                    }
                    o
                }
            };
            offsets.push((tp, offset));
        }
        // Members may have joined while the offsets were looked up; none
        // may join while the reset is written.
        self.while_empty(p, group, "reset", self.write_positions(at, offsets.clone(), true))
            .await?;
        Ok(GroupReply::Reset(offsets))
    }

    /// Ack mode: hands out up to `max` records of the partitions `member`
    /// holds (see `ack.rs`), each durable as `Delivered` before it is
    /// handed out. A partition that fails (its data unreadable, its
    /// dead-letter queue refusing) is skipped with a warning while others
    /// still deliver; the error is returned only if nothing was delivered.
    async fn receive(&self, at: &At<'_>, member: &str, max: u32, lock: Duration) -> Result<GroupReply, WireError> {
        let At { p, group, .. } = *at;
        if !(LOCK_MIN..=LOCK_MAX).contains(&lock) {
            return Err(WireError::new(
                ErrorCode::InvalidRequest,
                format!("lock period {lock:?} must be between {LOCK_MIN:?} and {LOCK_MAX:?}"),
            ));
        }
        let mut held = self.with_group(p, group, |g| {
            if !g.has_member(member) {
                return Err(group_error(GroupError::UnknownMember(member.to_string())));
            }
            Ok(g.held_by(member))
        })?;
        // Each receive starts at another partition, so a busy one cannot
        // starve the others.
        if !held.is_empty() {
            let turn = self.next_turn.get();
            self.next_turn.set(turn.wrapping_add(1));
            let n = held.len();
            held.rotate_left(turn % n);
        }
        let mut out = Vec::new();
        let mut left = max.max(1);
        let mut first_error = None;
        for tp in held {
            if left == 0 {
                break;
            }
            match self.receive_from(at, member, &tp, left, lock).await {
                Ok(Some(got)) => {
                    left = left.saturating_sub(got.offsets.len() as u32);
                    out.push(got);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(group, queue = %tp.0, partition = tp.1, "receive: {}", e.message);
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(GroupReply::Received(out)),
        }
    }

    /// One partition's part of a receive.
    async fn receive_from(
        &self,
        at: &At<'_>,
        member: &str,
        tp: &Tp,
        max: u32,
        lock: Duration,
    ) -> Result<Option<ReceivedPart>, WireError> {
        let At { shard, p, part, group } = *at;
        self.ensure_ack_state(at, tp).await?;
        // The queue's setting (deliveries before the dead-letter queue).
        let max_attempts = shard
            .table()
            .queue(&tp.0)
            .map_or(crate::controller::DEFAULT_MAX_DELIVERY_ATTEMPTS, |q| {
                q.settings.max_delivery_attempts
            });
        let now = Instant::now();
        let (plan, next) = self.with_group(p, group, |g| {
            let a = g.acks.get_mut(tp).ok_or_else(|| unknown_group(group))?;
            a.expire(now);
            Ok((a.plan(now, max, IN_FLIGHT_WINDOW, max_attempts), a.next))
        })?;
        for (offset, attempts, last_error) in plan.dead {
            self.dead_letter(at, tp, offset, attempts, last_error).await?;
        }
        let mut batches: Vec<bytes::Bytes> = Vec::new();
        let mut offsets: Vec<u64> = Vec::new();
        // The offsets of the last batch fetched: the plan's offsets rise, so
        // the ones that batch holds need no fetch of their own.
        let mut held: Option<std::ops::RangeInclusive<u64>> = None;
        for offset in plan.redeliver {
            if held.as_ref().is_some_and(|r| r.contains(&offset)) {
                offsets.push(offset);
                continue;
            }
            match fetch(shard, tp, offset, 1).await {
                Ok(got) => {
                    if let Some(b) = got.into_iter().next() {
                        held = strand_wire::batch::BatchHeader::parse(&b).map(|h| h.base_offset.0..=h.last_offset().0);
                        batches.push(b);
                        offsets.push(offset);
                    }
                }
                // Retention removed it while it waited: nothing to deliver.
                Err(e) if e.code == ErrorCode::OffsetOutOfRange => {
                    tracing::warn!(group, queue = %tp.0, partition = tp.1, offset, "a record waiting for redelivery was removed by retention");
                    self.finish(at, tp, |a| a.done(offset)).await?;
                }
                Err(e) => return Err(e),
            }
        }
        if plan.new > 0 {
            let got = match fetch(shard, tp, next, 1 << 20).await {
                Err(e) if e.code == ErrorCode::OffsetOutOfRange => {
                    self.skip_to_log_start(at, tp, next).await?;
                    return Ok(None);
                }
                other => other?,
            };
            let mut taken = 0;
            for b in got {
                let batch = RecordBatch::new(b.clone(), usize::MAX)
                    .map_err(|e| WireError::new(ErrorCode::CorruptBatch, e.to_string()))?;
                let mut used = false;
                for r in batch.records() {
                    if r.offset.0 >= next && taken < plan.new {
                        offsets.push(r.offset.0);
                        taken += 1;
                        used = true;
                    }
                }
                if used {
                    batches.push(b);
                }
                if taken >= plan.new {
                    break;
                }
            }
        }
        // Durable before handed out: the attempts they will be, for what is
        // still acquirable (another receive may have taken some meanwhile).
        let now = Instant::now();
        let planned = self.with_group(p, group, |g| {
            if g.holder(tp) != Some(member) {
                return Ok(Vec::new()); // the partition moved meanwhile
            }
            let a = g.acks.get(tp).ok_or_else(|| unknown_group(group))?;
            Ok(offsets
                .iter()
                .filter(|&&o| a.acquirable(o, now))
                .map(|&o| (o, a.attempts(o) + 1))
                .collect::<Vec<_>>())
        })?;
        if planned.is_empty() {
            return Ok(None);
        }
        let changes: Vec<GroupChange> = planned
            .iter()
            .map(|&(offset, attempts)| GroupChange::Delivered {
                queue: tp.0.clone(),
                partition: tp.1,
                offset,
                attempts,
            })
            .collect();
        append(shard, part, group, &changes).await?;
        let now = Instant::now();
        let delivered = self.with_group(p, group, |g| {
            if g.holder(tp) != Some(member) {
                return Ok(Vec::new());
            }
            let a = g.acks.get_mut(tp).ok_or_else(|| unknown_group(group))?;
            let wanted: Vec<u64> = planned.iter().map(|(o, _)| *o).collect();
            let taken = a.acquire(&wanted, member, now, lock);
            Ok(taken.into_iter().map(|o| (o, a.attempts(o))).collect::<Vec<_>>())
        })?;
        if delivered.is_empty() {
            return Ok(None);
        }
        Ok(Some(ReceivedPart {
            tp: tp.clone(),
            batches,
            offsets: delivered,
        }))
    }

    /// Ack mode: the record state of a partition, starting at its
    /// committed position (or the group's start).
    async fn ensure_ack_state(&self, at: &At<'_>, tp: &Tp) -> Result<(), WireError> {
        let At { shard, p, group, .. } = *at;
        let (exists, committed, start) =
            self.with_group(p, group, |g| Ok((g.acks.contains_key(tp), g.committed(tp), g.start)))?;
        if exists {
            return Ok(());
        }
        let position = match (committed, start) {
            (Some(o), _) => o,
            (None, Start::Earliest) => list_offset(shard, tp, OffsetQuery::Earliest).await?.0,
            (None, Start::Latest) => list_offset(shard, tp, OffsetQuery::Latest).await?.0,
        };
        self.with_group(p, group, |g| {
            g.acks.entry(tp.clone()).or_insert_with(|| AckState::new(position));
            Ok(())
        })?;
        // A start resolved now is recorded: the next reader starts here too.
        if committed.is_none() {
            self.commit(at, vec![(tp.clone(), position)]).await?;
        }
        Ok(())
    }

    /// Ack mode: the position fell below the log start (retention removed
    /// records nobody acknowledged): reset per the group's start policy
    /// (earliest: the log start; latest: the log end), say so loudly, and
    /// record it as a commit.
    async fn skip_to_log_start(&self, at: &At<'_>, tp: &Tp, position: u64) -> Result<(), WireError> {
        let At { shard, p, group, .. } = *at;
        let policy = self.with_group(p, group, |g| Ok(g.start))?;
        let query = match policy {
            Start::Earliest => OffsetQuery::Earliest,
            Start::Latest => OffsetQuery::Latest,
        };
        let to = list_offset(shard, tp, query).await?.0;
        tracing::warn!(
            group,
            queue = %tp.0,
            partition = tp.1,
            position,
            reset_to = to,
            "the group's position fell below the log start (retention removed records it had not acknowledged); \
             reset per its start policy ({policy:?}): {} records skipped",
            to.saturating_sub(position)
        );
        self.commit(at, vec![(tp.clone(), to)]).await
    }

    /// Copies a record to `<queue>.dlq` (its key, value and headers, plus
    /// `DLQ_HEADERS`), then records it as settled (done).
    async fn dead_letter(
        &self,
        at: &At<'_>,
        tp: &Tp,
        offset: u64,
        attempts: u32,
        last_error: Option<String>,
    ) -> Result<(), WireError> {
        let At { shard, part, group, .. } = *at;
        let got = match fetch(shard, tp, offset, 1).await {
            // Retention removed it: nothing left to move aside.
            Err(e) if e.code == ErrorCode::OffsetOutOfRange => {
                tracing::warn!(group, queue = %tp.0, partition = tp.1, offset, "a record due for the dead-letter queue was removed by retention");
                return self.finish(at, tp, |a| a.done(offset)).await;
            }
            other => other?,
        };
        let record = got
            .into_iter()
            .filter_map(|b| RecordBatch::new(b, usize::MAX).ok())
            .flat_map(|b| b.records().collect::<Vec<_>>())
            .find(|r| r.offset.0 == offset)
            .ok_or_else(|| {
                WireError::new(
                    ErrorCode::Internal,
                    format!("{}/{} has no record at {offset} to dead-letter", tp.0, tp.1),
                )
            })?;
        let source_partition = tp.1.to_string();
        let source_offset = offset.to_string();
        let attempts_text = attempts.to_string();
        let error = last_error.clone().unwrap_or_default();
        let mut headers: Vec<(bytes::Bytes, Option<bytes::Bytes>)> = record
            .headers
            .clone()
            .filter(|h| !DLQ_HEADERS.contains(&String::from_utf8_lossy(&h.key).as_ref()))
            .map(|h| (h.key, h.value))
            .collect();
        for (k, v) in DLQ_HEADERS.iter().zip([
            tp.0.as_str(),
            source_partition.as_str(),
            source_offset.as_str(),
            attempts_text.as_str(),
            error.as_str(),
        ]) {
            headers.push((
                bytes::Bytes::from_static(k.as_bytes()),
                Some(bytes::Bytes::copy_from_slice(v.as_bytes())),
            ));
        }
        let header_refs: Vec<(&[u8], Option<&[u8]>)> = headers.iter().map(|(k, v)| (&k[..], v.as_deref())).collect();
        let mut b = strand_wire::batch::BatchBuilder::new();
        b.producer(dead_letter_producer(group, tp, offset, attempts), 0, 0);
        b.push(
            record.key.as_deref(),
            record.value.as_deref(),
            &header_refs,
            record.timestamp,
        );
        let dlq = ensure_dlq(shard, &tp.0).await?;
        crate::leaders::produce(shard, &dlq, 0, b.build(), -1, INTERNAL_WRITE_TIMEOUT_MS).await?;
        let settled = GroupChange::Settled {
            queue: tp.0.clone(),
            partition: tp.1,
            offset,
            outcome: Settled::DeadLetter,
            reason: last_error,
        };
        append(shard, part, group, &[settled]).await?;
        tracing::info!(group, queue = %tp.0, partition = tp.1, offset, attempts, "dead-lettered");
        shard.metrics.dead_lettered(&tp.0);
        self.finish(at, tp, |a| a.done(offset)).await
    }

    /// Applies `change` to a partition's record state, then commits the
    /// position if the done prefix grew.
    async fn finish(&self, at: &At<'_>, tp: &Tp, change: impl FnOnce(&mut AckState)) -> Result<(), WireError> {
        let At { p, group, .. } = *at;
        let moved = self.with_group(p, group, |g| {
            let Some(a) = g.acks.get_mut(tp) else { return Ok(None) };
            change(a);
            Ok(a.advance().then_some(a.position))
        })?;
        match moved {
            Some(position) => self.commit(at, vec![(tp.clone(), position)]).await,
            None => Ok(()),
        }
    }

    /// Ack mode: settles records `member` holds, all or none.
    async fn settle(&self, at: &At<'_>, member: &str, records: Vec<SettleItem>) -> Result<GroupReply, WireError> {
        let At { shard, p, part, group } = *at;
        self.with_group(p, group, |g| {
            if !g.has_member(member) {
                return Err(group_error(GroupError::UnknownMember(member.to_string())));
            }
            for r in &records {
                let held = g.acks.get(&r.tp).is_some_and(|a| a.held_by(r.offset, member));
                if !held {
                    return Err(WireError::new(
                        ErrorCode::FencedMember,
                        format!(
                            "member {member} does not hold {}/{} offset {} (its lock ran out, it was settled, \
                             or the partition moved)",
                            r.tp.0, r.tp.1, r.offset
                        ),
                    ));
                }
            }
            Ok(())
        })?;
        let stored: Vec<GroupChange> = records
            .iter()
            .filter_map(|r| {
                let outcome = match r.outcome {
                    Outcome::Ack => Settled::Ack,
                    Outcome::Nack { .. } => Settled::Nack,
                    Outcome::DeadLetter | Outcome::Renew => return None,
                };
                Some(GroupChange::Settled {
                    queue: r.tp.0.clone(),
                    partition: r.tp.1,
                    offset: r.offset,
                    outcome,
                    reason: r.reason.clone(),
                })
            })
            .collect();
        if !stored.is_empty() {
            append(shard, part, group, &stored).await?;
        }
        let now = Instant::now();
        let mut moved: Vec<Tp> = Vec::new();
        for r in records {
            if r.outcome == Outcome::DeadLetter {
                let held = self.with_group(p, group, |g| {
                    Ok(g.acks
                        .get(&r.tp)
                        .filter(|a| a.held_by(r.offset, member))
                        .map(|a| a.attempts(r.offset)))
                })?;
                let Some(attempts) = held else { continue };
                let reason = r
                    .reason
                    .clone()
                    .or_else(|| Some("dead-lettered by the consumer".into()));
                self.dead_letter(at, &r.tp, r.offset, attempts, reason).await?;
                continue;
            }
            let (offset, outcome, reason) = (r.offset, r.outcome, r.reason);
            // Held when checked; if its lock ran out since (and another
            // receive took it), the settle changes nothing: it is that
            // delivery's to settle.
            let advanced = self.with_group(p, group, |g| {
                let Some(a) = g.acks.get_mut(&r.tp) else {
                    return Ok(false);
                };
                if !a.settle(offset, member, outcome, reason, now) {
                    tracing::debug!(offset, "settle of a record no longer held by its member ignored");
                }
                Ok(a.advance())
            })?;
            if advanced && !moved.contains(&r.tp) {
                moved.push(r.tp);
            }
        }
        // One durable commit for every partition whose done prefix grew (at
        // its position now, which a dead letter above may have moved too),
        // not one per settled record.
        let positions = self.with_group(p, group, |g| {
            Ok(moved
                .into_iter()
                .filter_map(|tp| g.acks.get(&tp).map(|a| a.position).map(|position| (tp, position)))
                .collect())
        })?;
        self.commit(at, positions).await?;
        Ok(GroupReply::Done)
    }

    /// Replays `__groups` partition `p` unless it already was (for this
    /// incarnation of the queue, in this leader epoch).
    async fn ensure_loaded(&self, shard: &Shard, p: u32, part: &Rc<Partition>) -> Result<(), WireError> {
        let ready = |c: &Self| {
            let loaded = c.loaded.borrow();
            loaded
                .get(&p)
                .is_some_and(|l| l.queue_id == part.queue_id && Some(l.epoch) == part.leading())
        };
        if ready(self) {
            return Ok(());
        }
        let Ok(_turn) = self.loading.acquire_permit(1).await else {
            return Err(WireError::new(ErrorCode::Internal, "the coordinator is shutting down"));
        };
        if ready(self) {
            return Ok(());
        }
        let Some(epoch) = part.leading() else {
            return Err(WireError::new(
                ErrorCode::NotLeader,
                "this broker no longer coordinates the group's __groups partition; find the coordinator again",
            ));
        };
        let mut groups = replay(shard, part, epoch, &shard.table()).await?;
        let grace = Instant::now() + RESTART_GRACE;
        for g in groups.values_mut() {
            g.grace_until = Some(grace);
        }
        tracing::info!(partition = p, groups = groups.len(), "replayed __groups");
        self.loaded.borrow_mut().insert(
            p,
            Loaded {
                queue_id: part.queue_id,
                epoch,
                groups,
            },
        );
        Ok(())
    }

    /// Whether no group is loaded on this shard.
    pub fn is_empty(&self) -> bool {
        self.loaded.borrow().values().all(|l| l.groups.is_empty())
    }

    /// Removes members whose session ran out (called from a shard timer).
    pub fn expire_sessions(&self, shard: &Shard) {
        let now = Instant::now();
        let mut loaded = self.loaded.borrow_mut();
        for l in loaded.values_mut() {
            for (name, g) in l.groups.iter_mut() {
                let gone = g.expire(now, |queues| counts(shard, queues));
                for m in gone {
                    tracing::info!(group = %name, member = %m, "session expired; rebalancing");
                }
            }
        }
    }

    /// Forgets positions and record state of queues that no longer exist
    /// (or were created anew) in `table`.
    pub fn forget_deleted_queues(&self, table: &MetadataTable) {
        let mut loaded = self.loaded.borrow_mut();
        for l in loaded.values_mut() {
            for g in l.groups.values_mut() {
                g.forget_queues(|q, id| table.queue(q).is_some_and(|r| r.id == id));
            }
        }
    }

    /// For the metrics: every (group, queue, partition, committed position)
    /// and every group's rebalance count, of the groups loaded here.
    #[allow(clippy::type_complexity)]
    pub fn positions(&self) -> (Vec<(String, String, u32, u64)>, Vec<(String, u64)>) {
        let loaded = self.loaded.borrow();
        let mut positions = Vec::new();
        let mut rebalances = Vec::new();
        for l in loaded.values() {
            for (name, g) in &l.groups {
                rebalances.push((name.clone(), g.rebalances));
                for ((q, p), o) in g.all_committed() {
                    positions.push((name.clone(), q.clone(), *p, o));
                }
            }
        }
        (positions, rebalances)
    }

    /// Compacts each `__groups` partition this shard leads that grew
    /// `groups_compact_bytes` past its size after its last compaction (or
    /// this broker's start): see [`compact`].
    pub async fn compact_grown(&self, shard: &Rc<Shard>) {
        let limit = shard.config.groups_compact_bytes;
        let partitions = shard
            .table()
            .queue(GROUPS_QUEUE)
            .map_or(0, |q| q.partitions.len() as u32);
        for p in 0..partitions {
            if limit == 0 || shard.stopping.get() {
                return;
            }
            let Some(part) = shard
                .partitions
                .get(GROUPS_QUEUE, p)
                .filter(|part| part.leading().is_some())
            else {
                continue;
            };
            let size = part.log.size_bytes();
            let after_last = *self.compacted.borrow_mut().entry(p).or_insert(size.min(limit));
            if size < after_last.saturating_add(limit) {
                continue;
            }
            let before = (part.log.log_start(), size);
            // Never while this shard replays a partition (a replay reads the
            // log in passes; see `rebuild`).
            let Ok(_turn) = self.loading.acquire_permit(1).await else {
                return;
            };
            match compact(shard, &part).await {
                Ok(start) => tracing::info!(
                    partition = p,
                    bytes_before = before.1,
                    bytes_after = part.log.size_bytes(),
                    log_start_before = before.0 .0,
                    log_start = start.unwrap_or(before.0).0,
                    "compacted __groups"
                ),
                Err(e) => tracing::warn!(partition = p, "compacting __groups: {}", e.message),
            }
            self.compacted.borrow_mut().insert(p, part.log.size_bytes());
        }
    }

    /// Forgets the groups of partitions this shard no longer leads.
    pub fn retain(&self, open: impl Fn(u32) -> bool) {
        self.loaded.borrow_mut().retain(|p, _| open(*p));
        self.compacted.borrow_mut().retain(|p, _| open(*p));
    }
}

/// Where a group's generations start in this coordinator's life: past
/// the wall clock in ms and the `__groups` log end, so generations do not
/// repeat across restarts (fencing also relies on member ids, which carry a
/// per-start nonce).
fn generation_seed(log_end: u64) -> u64 {
    (now_ms().max(0) as u64).max(log_end)
}

/// Appends `changes` of `group` as one batch and waits until it is durable;
/// returns the offset of the first record.
async fn append(
    shard: &Rc<Shard>,
    part: &Rc<Partition>,
    group: &str,
    changes: &[GroupChange],
) -> Result<u64, WireError> {
    let table = shard.table();
    let batch = record::batch(group, changes, now_ms(), |q| table.queue(q).map_or(0, |r| r.id));
    let produced = shard.produce(part, batch, -1, INTERNAL_WRITE_TIMEOUT_MS).await?;
    Ok(produced.base_offset)
}

/// One offset of a data partition, asked of its leader (on this node or
/// another: `crate::leaders`).
async fn list_offset(shard: &Rc<Shard>, tp: &Tp, query: OffsetQuery) -> Result<Offset, WireError> {
    let (offset, _found) = crate::leaders::list_offset(shard, &tp.0, tp.1, query).await?;
    Ok(Offset(offset))
}

/// Whole batches of a data partition from `offset` (at least the one
/// holding it), asked of its leader (on this node or another), safe to
/// hand to other shards.
async fn fetch(shard: &Rc<Shard>, tp: &Tp, offset: u64, max_bytes: u32) -> Result<Vec<Bytes>, WireError> {
    crate::leaders::fetch(shard, &tp.0, tp.1, offset, max_bytes).await
}

/// The producer id a dead letter is written under (sequence 0): the same
/// for every try at moving the same delivery aside, so the dead-letter
/// queue's leader stores a retried one once — a try whose answer was lost,
/// or refused after the append (`NotEnoughReplicas` while waiting for the
/// replicas) — and answers the retry with the first offsets, also after
/// a failover (the producer table is replicated with the log). From the
/// group, the record and its delivery count: a record dead-lettered again
/// later (after a reset) at the same count is stored once too.
fn dead_letter_producer(group: &str, tp: &Tp, offset: u64, attempts: u32) -> i64 {
    let key = format!("{group}\0{}\0{}\0{offset}\0{attempts}", tp.0, tp.1);
    // Non-negative: a negative id means "no producer".
    (strand_wire::fnv1a64(key.as_bytes()) >> 1) as i64
}

/// `<queue>.dlq`, created (one partition, the source's retention) if
/// missing; returns its name.
async fn ensure_dlq(shard: &Rc<Shard>, queue: &str) -> Result<String, WireError> {
    let name = dlq_name(queue);
    if shard.table().queue(&name).is_some() {
        return Ok(name);
    }
    let source = shard
        .table()
        .queue(queue)
        .map(|q| q.settings.clone())
        .ok_or_else(|| WireError::new(ErrorCode::UnknownQueue, format!("queue {queue:?} does not exist")))?;
    // Room for the headers a dead letter gains, within the frame limit.
    let max_message_bytes = source
        .max_message_bytes
        .saturating_add(64 << 10)
        .min(shard.config.max_frame_bytes.saturating_sub(64 << 10))
        .max(source.max_message_bytes);
    // As many replicas as the source has where the live brokers allow: a
    // dead-letter queue first needed while a broker is down gets fewer
    // rather than none (its records would wait for the broker otherwise).
    let alive = shard.table().brokers.values().filter(|b| b.alive).count();
    let replication_factor = source
        .replication_factor
        .min(u16::try_from(alive).unwrap_or(u16::MAX).max(1));
    if replication_factor < source.replication_factor {
        tracing::warn!(
            queue = %name,
            replication_factor,
            source = source.replication_factor,
            "creating a dead-letter queue with fewer replicas than its source: only {alive} brokers are alive"
        );
    }
    let settings = QueueSettings {
        partitions: 1,
        max_message_bytes,
        replication_factor,
        min_insync_replicas: source.min_insync_replicas.min(replication_factor),
        ..source
    };
    let command = Command::CreateQueue {
        name: name.clone(),
        settings,
    };
    match shard.propose(command).await {
        Ok(()) | Err(ProposeError::Refused(ControllerError::QueueExists(_))) => Ok(name),
        Err(ProposeError::Refused(c)) => Err(WireError::new(c.code(), format!("creating {name}: {c}"))),
        Err(ProposeError::Unavailable(m)) => Err(WireError::new(ErrorCode::ControllerUnavailable, m)),
    }
}

/// Rebuilds the groups of a `__groups` partition its replica leads (in
/// `epoch`) from its records: all of them, to the log end, once the high
/// watermark is there. A new leader's log may end past its high watermark
/// with records of the previous leader, committed or about to be; the
/// groups must hold them before anything is appended after them (a commit
/// lost from memory would move a position back). Waits at most
/// [`LOAD_WAIT`] for the followers.
async fn replay(
    shard: &Shard,
    part: &Partition,
    epoch: u32,
    table: &MetadataTable,
) -> Result<BTreeMap<String, Group>, WireError> {
    let log = &part.log;
    let end = log.log_end();
    if end > log.log_start() && log.high_watermark() < end {
        let deadline = Instant::now() + LOAD_WAIT;
        shard
            .wait_replicated(part, epoch, Offset(end.0 - 1), deadline)
            .await
            .map_err(|e| match e.code {
                ErrorCode::Timeout => WireError::new(
                    ErrorCode::Timeout,
                    format!(
                        "the coordinator is loading: its __groups partition's followers have not confirmed \
                         offset {} yet; retry",
                        end.0 - 1
                    ),
                ),
                _ => e,
            })?;
    }
    let (groups, _) = rebuild(log, end, table, generation_seed(log.log_end().0)).await?;
    Ok(groups)
}

/// The groups as the records of `log` below `end` leave them: the three
/// passes of [`replay::Rebuild`] (snapshot markers, the newest complete
/// snapshot, the records since), and the offset that snapshot covers. A
/// log start that moved during the passes (a compaction or a follower
/// deleting segments meanwhile) means a pass may have started past what it
/// needed: the passes run again.
async fn rebuild(
    log: &Log,
    end: Offset,
    table: &MetadataTable,
    seed: u64,
) -> Result<(BTreeMap<String, Group>, Option<u64>), WireError> {
    for _ in 0..5 {
        let start = log.log_start();
        let mut r = Rebuild::new(table, seed);
        each_record(log, start.0, end, true, |offset, _, stored| r.marker(offset, &stored)).await?;
        if let Some(begin) = r.snapshot_begin() {
            each_record(log, begin, end, false, |_, name, stored| {
                r.snapshot_record(name, stored)
            })
            .await?;
        }
        let from = r.tail_from(start.0);
        each_record(log, from, end, false, |offset, name, stored| {
            r.record(offset, name, stored)
        })
        .await?;
        if log.log_start() == start {
            let covers = r.covers();
            return Ok((r.finish(), covers));
        }
    }
    Err(WireError::new(
        ErrorCode::Timeout,
        "__groups kept moving its log start while it was read; retry",
    ))
}

/// Calls `each` with every readable record of `log` in [`from`, `end`):
/// its offset, its group and its value; unreadable ones are skipped (and
/// logged if `report`).
async fn each_record(
    log: &Log,
    from: u64,
    end: Offset,
    report: bool,
    mut each: impl FnMut(u64, String, Stored),
) -> Result<(), WireError> {
    let max = log.config().batch_bytes_max;
    let mut from = Offset(from).max(log.log_start());
    while from < end {
        let got = log
            .read_below(from, 1 << 20, end)
            .await
            .map_err(crate::shard::storage_error)?;
        if got.batches.is_empty() {
            break;
        }
        for bytes in got.batches {
            let batch = RecordBatch::new(bytes, max)
                .map_err(|e| WireError::new(ErrorCode::StorageError, format!("__groups holds a bad batch: {e}")))?;
            for r in batch.records() {
                if r.offset < from || r.offset >= end {
                    continue;
                }
                let (Some(key), Some(value)) = (r.key, r.value) else {
                    if report {
                        tracing::error!(offset = r.offset.0, "__groups record without a key or value; skipped");
                    }
                    continue;
                };
                let name = String::from_utf8_lossy(&key).into_owned();
                match record::decode(&value) {
                    Ok(stored) => each(r.offset.0, name, stored),
                    Err(e) if report => {
                        tracing::error!(offset = r.offset.0, group = %name, "unreadable __groups record ({e}); skipped")
                    }
                    Err(_) => {}
                }
            }
        }
        if got.next_offset <= from {
            break;
        }
        from = got.next_offset;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_valid_name_has_a_valid_dead_letter_queue() {
        assert_eq!(dlq_name("jobs"), "jobs.dlq");
        let longest_plain = "a".repeat(strand_wire::QUEUE_NAME_MAX - 4);
        assert_eq!(dlq_name(&longest_plain), format!("{longest_plain}.dlq"));
        for len in [strand_wire::QUEUE_NAME_MAX - 3, strand_wire::QUEUE_NAME_MAX] {
            for name in ["a".repeat(len), format!("{}.dlq", "b".repeat(len - 4))] {
                let dlq = dlq_name(&name);
                assert_eq!(dlq.len(), strand_wire::QUEUE_NAME_MAX, "{dlq}");
                assert!(strand_wire::validate_queue_name(&dlq).is_ok(), "{dlq}");
                assert!(dlq.ends_with(".dlq") && dlq != name);
                // Its own dead-letter queue fits too, and differs.
                assert_ne!(dlq_name(&dlq), dlq);
                assert!(strand_wire::validate_queue_name(&dlq_name(&dlq)).is_ok());
            }
        }
        // Long names that share a prefix get distinct dead-letter queues.
        let (a, b) = (format!("{}x", "p".repeat(199)), format!("{}y", "p".repeat(199)));
        assert_ne!(dlq_name(&a), dlq_name(&b));
    }
}
