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
//! - `record.rs`: the `__groups` records that make the durable part — the
//!   group's existence and settings, committed positions — survive
//!   restarts.
//!
//! # Durability and replay
//! Every durable change is appended to the group's `__groups` partition
//! (fsync=always) and is durable before it is applied and answered. The
//! first request that reaches a `__groups` partition after it was opened
//! replays it from its start: later records win, `Deleted` removes a group.
//! Membership is not stored: after a restart members get `UnknownMember` at
//! their next heartbeat and join again (with the group's positions intact).
//! Generations restart from the partition's log end, which only grows, so a
//! generation is never reused across restarts.
//!
//! Limits: `__groups` has no retention (a commit must not expire), so it
//! grows with every commit (about 60 bytes each) and replay reads all of
//! it; compaction — a snapshot record per group and deleting what it
//! supersedes — is future work.

pub mod assign;
pub mod group;
pub mod record;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use strand_storage::Offset;
use strand_wire::batch::RecordBatch;
use strand_wire::ErrorCode;

use self::assign::{Strategy, Tp};
use self::group::{Group, GroupError, Member, Start};
use self::record::GroupChange;
use crate::controller::{Command, ControllerError, FsyncSetting, ProposeError, QueueSettings};
use crate::server::messages::{OffsetQuery, PartitionRequest, WireError};
use crate::server::partitions::Partition;
use crate::server::shard::Shard;

/// The internal queue that holds group state.
pub const GROUPS_QUEUE: &str = "__groups";
/// Its partition count, fixed when it is created (coordinators are found by
/// hashing over it, so it never changes).
pub const GROUPS_PARTITIONS: u32 = 8;
/// Session timeouts a member may ask for.
pub const SESSION_TIMEOUT_MIN: Duration = Duration::from_millis(500);
pub const SESSION_TIMEOUT_MAX: Duration = Duration::from_secs(300);

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
    },
    Done,
    Offsets {
        start: Start,
        offsets: Vec<(Tp, Option<u64>)>,
    },
    List(Vec<GroupSummary>),
    Describe(GroupDescription),
    Reset(Vec<(Tp, u64)>),
}

/// The groups of one replayed `__groups` partition.
struct Loaded {
    /// The `__groups` queue's id when replayed (a new queue is replayed anew).
    queue_id: u64,
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
    let settings = QueueSettings {
        partitions: GROUPS_PARTITIONS,
        replication_factor: 1,
        // A committed position must not expire (see the module doc).
        retention_ms: None,
        retention_bytes: None,
        fsync: FsyncSetting::Always,
        max_message_bytes: shard.config.max_message_bytes,
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

impl Coordinator {
    /// Serves `op` for `__groups` partition `p` (open here as `part`).
    pub async fn serve(
        &self,
        shard: &Rc<Shard>,
        p: u32,
        part: &Rc<Partition>,
        op: GroupOp,
    ) -> Result<GroupReply, WireError> {
        self.ensure_loaded(p, part).await?;
        match op {
            GroupOp::Join(join) => self.join(shard, p, part, join).await,
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
                    Ok(GroupReply::Heartbeat { generation, assigned })
                })
            }
            GroupOp::Leave { group, member_id } => self.with_group(p, &group, |g| {
                let mut queues = g.subscribed();
                queues.retain(|q| g.members().iter().any(|m| m.id != member_id && m.queues.contains(q)));
                g.leave(&member_id, counts(shard, &queues)).map_err(group_error)?;
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
                self.commit(shard, p, part, &group, offsets).await?;
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
            } => self.reset(shard, p, part, &group, &queue, partitions, to).await,
            GroupOp::Delete { group } => {
                self.with_group(p, &group, |g| Self::check_empty(&group, g, "deleted"))?;
                append(shard, part, &group, &[GroupChange::Deleted]).await?;
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

    async fn join(
        &self,
        shard: &Rc<Shard>,
        p: u32,
        part: &Rc<Partition>,
        join: JoinRequest,
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
                    "session timeout {session_timeout:?} is outside {SESSION_TIMEOUT_MIN:?}..={SESSION_TIMEOUT_MAX:?}"
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
        let exists = self.with_group(p, &group, |_| Ok(())).is_ok();
        if !exists {
            append(shard, part, &group, &[GroupChange::Created { strategy, start }]).await?;
            let seed = part.log.log_end().0;
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
                heartbeat_interval: (session_timeout / 3).max(Duration::from_millis(100)),
            })
        })
    }

    /// Makes `offsets` durable, then applies them.
    async fn commit(
        &self,
        shard: &Rc<Shard>,
        p: u32,
        part: &Rc<Partition>,
        group: &str,
        offsets: Vec<(Tp, u64)>,
    ) -> Result<(), WireError> {
        if offsets.is_empty() {
            return Ok(());
        }
        let changes: Vec<GroupChange> = offsets
            .iter()
            .map(|((queue, partition), offset)| GroupChange::Commit {
                queue: queue.clone(),
                partition: *partition,
                offset: *offset,
            })
            .collect();
        let base = append(shard, part, group, &changes).await?;
        // The group may have been deleted meanwhile: then nothing to apply.
        let _ = self.with_group(p, group, |g| {
            for (i, (tp, offset)) in offsets.into_iter().enumerate() {
                g.apply_commit(tp, offset, base + i as u64);
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

    #[allow(clippy::too_many_arguments)]
    async fn reset(
        &self,
        shard: &Rc<Shard>,
        p: u32,
        part: &Rc<Partition>,
        group: &str,
        queue: &str,
        partitions: Vec<u32>,
        to: ResetTo,
    ) -> Result<GroupReply, WireError> {
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
                    format!("queue {queue:?} has {n} partitions"),
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
                    if !(start..=end).contains(&o) {
                        return Err(WireError::new(
                            ErrorCode::OffsetOutOfRange,
                            format!("offset {o} is outside {queue}/{q_p}'s log ({start}..={end})"),
                        ));
                    }
                    o
                }
            };
            offsets.push((tp, offset));
        }
        // Members may have joined while the offsets were looked up.
        self.with_group(p, group, |g| Self::check_empty(group, g, "reset"))?;
        self.commit(shard, p, part, group, offsets.clone()).await?;
        Ok(GroupReply::Reset(offsets))
    }

    /// Replays `__groups` partition `p` unless it already was (for this
    /// incarnation of the queue).
    async fn ensure_loaded(&self, p: u32, part: &Rc<Partition>) -> Result<(), WireError> {
        let ready = |c: &Self| c.loaded.borrow().get(&p).is_some_and(|l| l.queue_id == part.queue_id);
        if ready(self) {
            return Ok(());
        }
        let Ok(_turn) = self.loading.acquire_permit(1).await else {
            return Err(WireError::new(ErrorCode::Internal, "the coordinator is shutting down"));
        };
        if ready(self) {
            return Ok(());
        }
        let groups = replay(part).await?;
        tracing::info!(partition = p, groups = groups.len(), "replayed __groups");
        self.loaded.borrow_mut().insert(
            p,
            Loaded {
                queue_id: part.queue_id,
                groups,
            },
        );
        Ok(())
    }

    /// Removes members whose session ran out (called from a shard timer).
    pub fn expire_sessions(&self, shard: &Shard) {
        let now = Instant::now();
        let mut loaded = self.loaded.borrow_mut();
        for l in loaded.values_mut() {
            for (name, g) in l.groups.iter_mut() {
                if g.members().iter().all(|m| m.deadline > now) {
                    continue;
                }
                let queues = subscribed_after_expiry(g, now);
                let gone = g.expire(now, || counts(shard, &queues));
                for m in gone {
                    tracing::info!(group = %name, member = %m, "session expired; rebalancing");
                }
            }
        }
    }

    /// Forgets the groups of partitions this shard no longer holds.
    pub fn retain(&self, open: impl Fn(u32) -> bool) {
        self.loaded.borrow_mut().retain(|p, _| open(*p));
    }
}

/// Queues read by the members that survive an expiry at `now`.
fn subscribed_after_expiry(g: &Group, now: Instant) -> Vec<String> {
    let mut qs: Vec<String> = g
        .members()
        .iter()
        .filter(|m| m.deadline > now)
        .flat_map(|m| m.queues.iter().cloned())
        .collect();
    qs.sort();
    qs.dedup();
    qs
}

/// Appends `changes` of `group` as one batch and waits until it is durable;
/// returns the offset of the first record.
async fn append(
    shard: &Rc<Shard>,
    part: &Rc<Partition>,
    group: &str,
    changes: &[GroupChange],
) -> Result<u64, WireError> {
    let batch = record::batch(group, changes, now_ms());
    let produced = shard.produce(&part.log, batch, -1).await?;
    Ok(produced.base_offset)
}

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// One offset of a data partition, asked of the shard that owns it.
/// (Boxed: serving a partition request may serve a group request, which
/// may ask this.)
async fn list_offset(shard: &Rc<Shard>, tp: &Tp, query: OffsetQuery) -> Result<Offset, WireError> {
    let asked: Boxed<'_, Result<(u64, bool), WireError>> =
        Box::pin(crate::handlers::ask(shard, tp.0.clone(), tp.1, |reply| {
            PartitionRequest::ListOffsets { query, reply }
        }));
    let (offset, _found) = asked.await?;
    Ok(Offset(offset))
}

/// Rebuilds the groups of a `__groups` partition from its records.
async fn replay(part: &Partition) -> Result<BTreeMap<String, Group>, WireError> {
    let log = &part.log;
    let end = log.high_watermark();
    let seed = log.log_end().0;
    let max = log.config().batch_bytes_max;
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    let mut from = log.log_start();
    while from < end {
        let got = log
            .read_below(from, 1 << 20, end)
            .await
            .map_err(crate::server::shard::storage_error)?;
        if got.batches.is_empty() {
            break;
        }
        for bytes in got.batches {
            let batch = RecordBatch::new(bytes, max)
                .map_err(|e| WireError::new(ErrorCode::StorageError, format!("__groups holds a bad batch: {e}")))?;
            for r in batch.records() {
                if r.offset < from {
                    continue;
                }
                let (Some(key), Some(value)) = (r.key, r.value) else {
                    tracing::error!(offset = r.offset.0, "__groups record without a key or value; skipped");
                    continue;
                };
                let name = String::from_utf8_lossy(&key).into_owned();
                match record::decode(&value) {
                    Ok(change) => apply(&mut groups, name, change, r.offset.0, seed),
                    Err(e) => {
                        tracing::error!(offset = r.offset.0, group = %name, "unreadable __groups record ({e}); skipped")
                    }
                }
            }
        }
        from = got.next_offset;
    }
    Ok(groups)
}

/// Applies one replayed change.
fn apply(groups: &mut BTreeMap<String, Group>, name: String, change: GroupChange, offset: u64, seed: u64) {
    match change {
        GroupChange::Created { strategy, start } => {
            groups
                .entry(name)
                .or_insert_with(|| Group::created(strategy, start, seed));
        }
        GroupChange::Commit {
            queue,
            partition,
            offset: position,
        } => {
            if let Some(g) = groups.get_mut(&name) {
                g.apply_commit((queue, partition), position, offset);
            }
        }
        GroupChange::Deleted => {
            groups.remove(&name);
        }
    }
}
