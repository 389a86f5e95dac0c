//! Consumer groups on the client: [`GroupConsumer`] (subscribe, poll,
//! commit, rebalance callbacks) and the group requests [`crate::Admin`]
//! uses (list, describe, reset, delete).
//!
//! Runs on: the caller's task (poll, commit: `&mut self`) and one heartbeat
//! thread per group consumer.
//!
//! The broker assigns partitions (DESIGN.md §8). The heartbeat thread tells
//! the group's coordinator which partitions this member holds and learns
//! which it may hold now (the *grant*); `poll` applies the difference on the
//! caller's task: partitions no longer granted are committed (with
//! auto-commit), reported through `on_revoked` and dropped; new ones get
//! their committed position (or the group's start), are reported through
//! `on_assigned` and read. The heartbeat reports the partitions read *and*
//! those granted but not yet taken up, so the coordinator never grants a
//! partition to another member while this one may still read it; a
//! partition is released (left out of a heartbeat) only after `poll`
//! dropped it. Partitions that do not move keep flowing through a
//! rebalance.
//!
//! At-least-once: with auto-commit, each `poll` first commits the positions
//! reached by the records the previous `poll` returned (the caller has
//! handled them by then), and `close` commits the last ones. A member that
//! crashes has its uncommitted records delivered again to the partition's
//! next member.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use strand_net::message::{read_body, TailBuilder};
use strand_net::Frame;
use strand_wire::flatbuffers::{FlatBufferBuilder, ForwardsUOffset, Vector, WIPOffset};
use strand_wire::*;

use crate::cluster::Cluster;
use crate::consumer::{ConsumedRecord, Consumer, ConsumerConfig, OutOfRangeReset, Seek};
use crate::error::ClientError;
use crate::retry::{retriable, sleep, Failing};

/// The broker's internal queue of group state; its partition leaders are
/// the coordinators.
pub const GROUPS_QUEUE: &str = "__groups";

/// How the broker spreads partitions over a group's members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Per queue, contiguous ranges of partitions per member.
    Range,
    /// Partitions dealt to the members in turn.
    RoundRobin,
    /// Partitions stay with their member across rebalances where balance
    /// allows (the default).
    Sticky,
}

/// Where a new group reads partitions that have no committed position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupStart {
    Earliest,
    Latest,
}

/// A partition of a queue.
pub type QueuePartition = (Arc<str>, u32);

type Callback = Box<dyn FnMut(&[QueuePartition]) + Send>;

/// Group consumer settings.
pub struct GroupConfig {
    /// Used when the group is created by this member's join.
    pub strategy: Strategy,
    /// Used when the group is created by this member's join.
    pub start: GroupStart,
    /// The broker drops the member (and moves its partitions) after this
    /// long without a heartbeat.
    pub session_timeout: Duration,
    /// Commit positions automatically (see the module doc); else call
    /// [`GroupConsumer::commit`].
    pub auto_commit: bool,
    /// Shown by `strand group describe`.
    pub client_name: String,
    /// Fetch settings (`start` and `reset_out_of_range` are the group's).
    pub consumer: ConsumerConfig,
    /// Called from `poll` with partitions newly taken up.
    pub on_assigned: Option<Callback>,
    /// Called from `poll` with partitions given up (after their positions
    /// were committed, with auto-commit).
    pub on_revoked: Option<Callback>,
    /// Ack mode: how long a received record is this member's before the
    /// broker delivers it again (see [`GroupConsumer::renew`]).
    pub lock: Duration,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            strategy: Strategy::Sticky,
            start: GroupStart::Latest,
            session_timeout: Duration::from_secs(10),
            auto_commit: true,
            client_name: "strand-client".into(),
            consumer: ConsumerConfig::default(),
            on_assigned: None,
            on_revoked: None,
            lock: Duration::from_secs(30),
        }
    }
}

/// How long an operator's group call (list, describe, reset, delete)
/// retries while the coordinator moves.
const ADMIN_CALL_RETRY: Duration = Duration::from_secs(30);

/// Sends group requests to the group's coordinator.
#[derive(Clone)]
pub(crate) struct GroupCalls {
    cluster: Arc<Cluster>,
    group: String,
    /// How long a call retries while the coordinator moves or is
    /// unreachable (see [`crate::retry`]).
    retry_for: Duration,
}

impl GroupCalls {
    pub(crate) fn new(cluster: Arc<Cluster>, group: &str, retry_for: Duration) -> Result<GroupCalls, ClientError> {
        validate_queue_name(group).map_err(|m| ClientError::Invalid(format!("group name: {m}")))?;
        Ok(GroupCalls {
            cluster,
            group: group.to_string(),
            retry_for,
        })
    }

    /// Sends a request to the coordinator (found through `__groups`'
    /// metadata; any broker before `__groups` exists) and checks the
    /// response's error. A retriable failure ([`crate::retry::retriable`]:
    /// the coordinator moved, is loading, or its broker is unreachable) is
    /// retried after a backoff, with the coordinator found again, until
    /// `retry_for` has passed.
    pub(crate) async fn call(
        &self,
        api: Api,
        fbb: &FlatBufferBuilder<'_>,
        check: impl Fn(&Frame) -> Result<(), ClientError>,
    ) -> Result<Frame, ClientError> {
        let mut failing = Failing::default();
        loop {
            let conn = match self.cluster.queue(GROUPS_QUEUE).await {
                Ok(info) => {
                    let p = partition_for_key(self.group.as_bytes(), info.partitions());
                    self.cluster.leader_connection(&info, p)
                }
                Err(_) => self.cluster.any_connection(),
            };
            let result = match conn {
                Ok(conn) => conn
                    .request(api, fbb.finished_data(), TailBuilder::default())
                    .await
                    .and_then(|frame| check(&frame).map(|()| frame)),
                Err(e) => Err(e),
            };
            let e = match result {
                Err(e) if retriable(&e) => e,
                other => return other,
            };
            // Not `Cluster::leader_moved`: a `NotLeader` here may be about
            // a data partition the coordinator asked for (its hint names
            // that partition's leader, not the coordinator's).
            if e.leader_moved() {
                self.cluster.forget_queue(GROUPS_QUEUE);
            }
            match failing.failed(self.retry_for) {
                Some(wait) => sleep(wait).await,
                None => return Err(e),
            }
        }
    }
}

fn read<'a, T>(frame: &'a Frame) -> Result<T::Inner, ClientError>
where
    T: strand_wire::flatbuffers::Follow<'a> + strand_wire::flatbuffers::Verifiable + 'a,
{
    read_body::<T>(&frame.body).map_err(|e| ClientError::Protocol(e.to_string()))
}

/// `[QueuePartitions]` from sorted partitions.
fn queue_partitions<'b>(
    fbb: &mut FlatBufferBuilder<'b>,
    tps: &BTreeSet<QueuePartition>,
) -> WIPOffset<Vector<'b, ForwardsUOffset<QueuePartitions<'b>>>> {
    strand_wire::groups::queue_partitions(fbb, tps.iter().map(|(q, p)| (&**q, *p)))
}

fn read_partitions(list: Option<Vector<'_, ForwardsUOffset<QueuePartitions<'_>>>>) -> BTreeSet<QueuePartition> {
    let mut out = BTreeSet::new();
    for qp in list.into_iter().flatten() {
        let q: Arc<str> = Arc::from(qp.queue().unwrap_or_default());
        out.extend(qp.partitions().into_iter().flatten().map(|p| (q.clone(), p)));
    }
    out
}

/// `[QueueOffsets]` from positions.
fn queue_offsets<'b>(
    fbb: &mut FlatBufferBuilder<'b>,
    offsets: &BTreeMap<QueuePartition, u64>,
) -> WIPOffset<Vector<'b, ForwardsUOffset<QueueOffsets<'b>>>> {
    let items = offsets
        .iter()
        .map(|((q, p), o)| (&**q, (*p, (*o).min(i64::MAX as u64) as i64)));
    strand_wire::groups::queue_offsets(fbb, items)
}

fn read_offsets(list: Option<Vector<'_, ForwardsUOffset<QueueOffsets<'_>>>>) -> BTreeMap<QueuePartition, Option<u64>> {
    let mut out = BTreeMap::new();
    for qo in list.into_iter().flatten() {
        let q: Arc<str> = Arc::from(qo.queue().unwrap_or_default());
        for po in qo.partitions().into_iter().flatten() {
            out.insert((q.clone(), po.partition()), u64::try_from(po.offset()).ok());
        }
    }
    out
}

/// What a member learned from its last join / heartbeat, shared between the
/// heartbeat thread and `poll`.
#[derive(Default)]
struct Membership {
    member_id: Option<String>,
    generation: u64,
    heartbeat_interval: Duration,
    /// Partitions the coordinator last said this member may hold.
    granted: BTreeSet<QueuePartition>,
    /// Partitions the coordinator last said it keeps back from this member
    /// for now (HeartbeatResponse.withheld).
    withheld: u32,
    /// Partitions `poll` reads.
    active: BTreeSet<QueuePartition>,
    /// Partitions `poll` is taking up (granted when it started; still
    /// reported as held until it is done, so nobody else gets them meanwhile).
    taking: BTreeSet<QueuePartition>,
    /// `poll` let partitions go: the heartbeat thread reports it at once.
    release_pending: bool,
    /// When the coordinator last answered a heartbeat.
    last_heartbeat: Option<std::time::Instant>,
    /// A failure `poll` should report (then cleared).
    error: Option<ClientError>,
    /// Bumped whenever `granted` changes; `poll` waits on it while idle.
    changes: u64,
    /// Tasks waiting (in `poll` / `receive`) for a deadline or a change; the
    /// heartbeat thread wakes them (no timer thread per wait).
    sleepers: Vec<(std::time::Instant, std::task::Waker)>,
}

impl Membership {
    /// Wakes the sleepers whose deadline passed (all of them if `all`);
    /// returns the earliest deadline left.
    fn wake_sleepers(&mut self, all: bool) -> Option<std::time::Instant> {
        let now = std::time::Instant::now();
        self.sleepers.retain(|(deadline, waker)| {
            let due = all || *deadline <= now;
            if due {
                waker.wake_by_ref();
            }
            !due
        });
        self.sleepers.iter().map(|(d, _)| *d).min()
    }
}

struct Shared {
    calls: GroupCalls,
    queues: Vec<String>,
    strategy: Strategy,
    start: GroupStart,
    session_timeout: Duration,
    client_name: String,
    state: Mutex<Membership>,
    /// Wakes the heartbeat thread early (a release to report, or stop).
    wake: Condvar,
    stop: AtomicBool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, Membership> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn join(&self) -> Result<(), ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let group = fbb.create_string(&self.calls.group);
        let qs: Vec<_> = self.queues.iter().map(|q| fbb.create_string(q)).collect();
        let queues = fbb.create_vector(&qs);
        let client_name = fbb.create_string(&self.client_name);
        let root = JoinGroupRequest::create(
            &mut fbb,
            &JoinGroupRequestArgs {
                group: Some(group),
                queues: Some(queues),
                strategy: match self.strategy {
                    Strategy::Range => AssignStrategy::Range,
                    Strategy::RoundRobin => AssignStrategy::RoundRobin,
                    Strategy::Sticky => AssignStrategy::Sticky,
                },
                start: match self.start {
                    GroupStart::Earliest => strand_wire::GroupStart::Earliest,
                    GroupStart::Latest => strand_wire::GroupStart::Latest,
                },
                session_timeout_ms: self.session_timeout.as_millis().min(u128::from(u32::MAX)) as u32,
                client_name: Some(client_name),
            },
        );
        fbb.finish_minimal(root);
        let frame = self
            .calls
            .call(Api::JoinGroup, &fbb, |f| {
                ClientError::check(read::<JoinGroupResponse>(f)?.error())
            })
            .await?;
        let r = read::<JoinGroupResponse>(&frame)?;
        let mut st = self.state();
        st.member_id = Some(r.member_id().unwrap_or_default().to_string());
        st.generation = r.generation();
        st.heartbeat_interval = Duration::from_millis(u64::from(r.heartbeat_interval_ms()).max(50));
        Ok(())
    }

    /// One heartbeat; joins first if this member has no id (or lost it).
    async fn heartbeat(&self) -> Result<(), ClientError> {
        let (member_id, owned) = {
            let st = self.state();
            let mut owned: BTreeSet<QueuePartition> = st.active.union(&st.granted).cloned().collect();
            owned.extend(st.taking.iter().cloned());
            (st.member_id.clone(), owned)
        };
        let Some(member_id) = member_id else {
            return self.join().await;
        };
        let mut fbb = FlatBufferBuilder::new();
        let group = fbb.create_string(&self.calls.group);
        let member = fbb.create_string(&member_id);
        let owned = queue_partitions(&mut fbb, &owned);
        let root = HeartbeatRequest::create(
            &mut fbb,
            &HeartbeatRequestArgs {
                group: Some(group),
                member_id: Some(member),
                owned: Some(owned),
            },
        );
        fbb.finish_minimal(root);
        match self
            .calls
            .call(Api::Heartbeat, &fbb, |f| {
                ClientError::check(read::<HeartbeatResponse>(f)?.error())
            })
            .await
        {
            Ok(frame) => {
                let r = read::<HeartbeatResponse>(&frame)?;
                let granted = read_partitions(r.assigned());
                let mut st = self.state();
                if st.member_id.as_deref() == Some(member_id.as_str()) {
                    st.last_heartbeat = Some(std::time::Instant::now());
                    st.generation = r.generation();
                    st.withheld = r.withheld();
                    if st.granted != granted {
                        st.granted = granted;
                        st.changes += 1;
                    }
                }
                Ok(())
            }
            // Expired or the coordinator restarted: join again. What this
            // member reads stays listed as owned in the next heartbeat, so
            // nobody else is granted it before `poll` lets go.
            Err(e) if matches!(e.code(), Some(ErrorCode::UnknownMember | ErrorCode::UnknownGroup)) => {
                {
                    let mut st = self.state();
                    st.member_id = None;
                    st.withheld = 0;
                    if !st.granted.is_empty() {
                        st.granted.clear();
                        st.changes += 1;
                    }
                }
                self.join().await
            }
            Err(e) => Err(e),
        }
    }

    async fn leave(&self) -> Result<(), ClientError> {
        let Some(member_id) = self.state().member_id.take() else {
            return Ok(());
        };
        let mut fbb = FlatBufferBuilder::new();
        let group = fbb.create_string(&self.calls.group);
        let member = fbb.create_string(&member_id);
        let root = LeaveGroupRequest::create(
            &mut fbb,
            &LeaveGroupRequestArgs {
                group: Some(group),
                member_id: Some(member),
            },
        );
        fbb.finish_minimal(root);
        self.calls
            .call(Api::LeaveGroup, &fbb, |f| {
                ClientError::check(read::<LeaveGroupResponse>(f)?.error())
            })
            .await
            .map(|_| ())
    }
}

/// The heartbeat thread: heartbeats every interval (sooner after a change,
/// so a hand-over completes in a few round trips), until told to stop;
/// then leaves the group.
fn heartbeat_loop(shared: Arc<Shared>) {
    let mut quick = 0;
    let mut next_beat = std::time::Instant::now();
    while !shared.stop.load(Ordering::SeqCst) {
        let release = std::mem::take(&mut shared.state().release_pending);
        if release || std::time::Instant::now() >= next_beat {
            let before = shared.state().changes;
            if let Err(e) = crate::block_on(shared.heartbeat()) {
                let fatal = matches!(
                    e.code(),
                    Some(ErrorCode::UnknownQueue | ErrorCode::InvalidRequest | ErrorCode::InvalidQueueName)
                );
                if fatal {
                    shared.state().error = Some(e);
                }
            }
            let mut st = shared.state();
            if st.changes != before {
                quick = 5;
                st.wake_sleepers(true);
            }
            let wait = if quick > 0 {
                quick -= 1;
                Duration::from_millis(20)
            } else {
                st.heartbeat_interval.max(Duration::from_millis(50))
            };
            next_beat = std::time::Instant::now() + wait;
            // A release made while that heartbeat was on its way goes now.
            if st.release_pending {
                continue;
            }
        }
        let mut st = shared.state();
        let until = st.wake_sleepers(false).map_or(next_beat, |d| d.min(next_beat));
        let _ = shared
            .wake
            .wait_timeout(st, until.saturating_duration_since(std::time::Instant::now()));
    }
    shared.state().wake_sleepers(true);
    let _ = crate::block_on(shared.leave());
}

/// A member of a consumer group: reads the partitions the broker assigns it.
pub struct GroupConsumer {
    shared: Arc<Shared>,
    consumer: Consumer,
    auto_commit: bool,
    /// Positions handed out by `poll` and not yet committed.
    uncommitted: BTreeMap<QueuePartition, u64>,
    /// Partitions taken up without a committed position, whose start is
    /// committed once resolved.
    fresh: BTreeSet<QueuePartition>,
    on_assigned: Option<Callback>,
    on_revoked: Option<Callback>,
    heartbeat: Option<JoinHandle<()>>,
    max_wait: Duration,
    lock: Duration,
}

/// A record handed out in ack mode: settle it with
/// [`GroupConsumer::ack`], [`GroupConsumer::nack`] or
/// [`GroupConsumer::dead_letter`] before its lock runs out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub record: ConsumedRecord,
    /// 1 for a first delivery.
    pub attempt: u32,
}

impl GroupConsumer {
    /// Joins `group` (creating it on first use) to read `queues` from the
    /// cluster at `brokers`.
    pub async fn subscribe(
        brokers: &str,
        group: &str,
        queues: &[&str],
        mut config: GroupConfig,
    ) -> Result<GroupConsumer, ClientError> {
        if queues.is_empty() {
            return Err(ClientError::Invalid("subscribe to at least one queue".into()));
        }
        let timeouts = crate::Timeouts {
            connect: config.consumer.connect_timeout,
            metadata: config.consumer.metadata_timeout,
        };
        let cluster = Cluster::with_settings(brokers, config.consumer.busy_poll, timeouts)?;
        // A member's calls retry for one heartbeat interval (a third of the
        // session): the heartbeat thread, which also wakes waiting polls
        // and runs the leave at close, must not sit in one call for a
        // whole session while the coordinator moves.
        let calls = GroupCalls::new(cluster.clone(), group, config.session_timeout / 3)?;
        // Positions come from the group; one outside the log (retention
        // removed records nobody read) is reset per the group's start
        // policy — earliest: what is left; latest: the end — and reported
        // through `take_resets`, never silently.
        config.consumer.reset_out_of_range = Some(match config.start {
            GroupStart::Earliest => Seek::Earliest,
            GroupStart::Latest => Seek::Latest,
        });
        let max_wait = config.consumer.max_wait;
        let shared = Arc::new(Shared {
            calls,
            queues: queues.iter().map(|q| q.to_string()).collect(),
            strategy: config.strategy,
            start: config.start,
            session_timeout: config.session_timeout,
            client_name: config.client_name,
            state: Mutex::new(Membership::default()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        shared.join().await?;
        shared.heartbeat().await?;
        let s = shared.clone();
        let heartbeat = std::thread::Builder::new()
            .name(format!("strand-group-{group}"))
            .spawn(move || heartbeat_loop(s))
            .map_err(|e| ClientError::Invalid(format!("starting the heartbeat thread: {e}")))?;
        Ok(GroupConsumer {
            shared,
            consumer: Consumer::with_cluster(cluster, config.consumer),
            auto_commit: config.auto_commit,
            uncommitted: BTreeMap::new(),
            fresh: BTreeSet::new(),
            on_assigned: config.on_assigned,
            on_revoked: config.on_revoked,
            heartbeat: Some(heartbeat),
            max_wait,
            lock: config.lock,
        })
    }

    /// This member's id, once joined.
    pub fn member_id(&self) -> Option<String> {
        self.shared.state().member_id.clone()
    }

    /// The partitions this member reads now.
    pub fn assignment(&self) -> Vec<QueuePartition> {
        self.shared.state().active.iter().cloned().collect()
    }

    /// Whether this member waits for partitions the group means it to read:
    /// it is (re-)joining, the coordinator keeps some back for now (another
    /// member has not released them yet, or the coordinator restarted
    /// moments ago and waits for members from before it), or `poll` has not
    /// taken up a grant yet. A reader that stops when idle should not count
    /// this time as idle.
    ///
    /// Only while the coordinator answers: a member whose last heartbeat
    /// answer is a session old (the coordinator is down or unreachable) is
    /// not waiting for partitions but failing, and says so through `poll`.
    pub fn waiting_for_partitions(&self) -> bool {
        let st = self.shared.state();
        let answering = st
            .last_heartbeat
            .is_some_and(|t| t.elapsed() < self.shared.session_timeout);
        answering && (st.member_id.is_none() || st.withheld > 0 || st.granted != st.active)
    }

    /// Positions moved because they fell outside the log (retention): the
    /// records in between were never read. Report them.
    pub fn take_resets(&mut self) -> Vec<OutOfRangeReset> {
        self.consumer.take_resets()
    }

    /// The next records of this member's partitions; empty if none came
    /// within the fetch's max wait (or the member holds no partition: a
    /// spare). Applies assignment changes first, and with auto-commit
    /// commits what the previous poll returned.
    pub async fn poll(&mut self) -> Result<Vec<ConsumedRecord>, ClientError> {
        if let Some(e) = self.shared.state().error.take() {
            return Err(e);
        }
        self.rebalance().await?;
        if self.auto_commit {
            match self.commit().await {
                // The partition moved on, or this member re-joins: those
                // records go to their next reader (at-least-once).
                Err(e) if is_fenced(&e) => {}
                other => other?,
            }
        }
        if self.shared.state().active.is_empty() {
            self.wait_for_assignment(self.max_wait).await;
            return Ok(Vec::new());
        }
        let records = self.consumer.poll().await?;
        // A partition's records come together, in offset order: its last
        // one sets the position (one map entry per partition, not per record).
        for (i, r) in records.iter().enumerate() {
            let last_of_run = records
                .get(i + 1)
                .is_none_or(|n| n.partition != r.partition || n.queue != r.queue);
            if last_of_run {
                self.uncommitted.insert((r.queue.clone(), r.partition), r.offset + 1);
            }
        }
        self.record_start_positions().await?;
        Ok(records)
    }

    /// Commits the positions reached by the records `poll` returned.
    pub async fn commit(&mut self) -> Result<(), ClientError> {
        if self.uncommitted.is_empty() {
            return Ok(());
        }
        let offsets = std::mem::take(&mut self.uncommitted);
        self.commit_offsets(&offsets).await.inspect_err(|e| {
            // Kept for the next try, unless this member no longer holds
            // the partitions (fenced: their next reader has them).
            if is_fenced(e) {
                return;
            }
            let active = self.shared.state().active.clone();
            for (tp, o) in &offsets {
                if active.contains(tp) {
                    self.uncommitted.entry(tp.clone()).or_insert(*o);
                }
            }
        })
    }

    /// Commits `offsets` (queue, partition → offset of the next record to
    /// read) of partitions this member holds.
    pub async fn commit_offsets(&self, offsets: &BTreeMap<QueuePartition, u64>) -> Result<(), ClientError> {
        let (member_id, generation) = {
            let st = self.shared.state();
            let id = st
                .member_id
                .clone()
                .ok_or_else(|| ClientError::broker(ErrorCode::UnknownMember, "not a member right now (re-joining)"))?;
            (id, st.generation)
        };
        let mut fbb = FlatBufferBuilder::new();
        let group = fbb.create_string(&self.shared.calls.group);
        let member = fbb.create_string(&member_id);
        let queues = queue_offsets(&mut fbb, offsets);
        let root = CommitOffsetsRequest::create(
            &mut fbb,
            &CommitOffsetsRequestArgs {
                group: Some(group),
                member_id: Some(member),
                generation,
                queues: Some(queues),
            },
        );
        fbb.finish_minimal(root);
        self.shared
            .calls
            .call(Api::CommitOffsets, &fbb, |f| {
                ClientError::check(read::<CommitOffsetsResponse>(f)?.error())
            })
            .await
            .map(|_| ())
    }

    /// Commits the position just past `record` (the per-message commit of
    /// `strand consume --group`).
    pub async fn commit_record(&mut self, record: &ConsumedRecord) -> Result<(), ClientError> {
        let tp = (record.queue.clone(), record.partition);
        let offsets = BTreeMap::from([(tp.clone(), record.offset + 1)]);
        self.commit_offsets(&offsets).await?;
        if self.uncommitted.get(&tp).is_some_and(|&o| o <= record.offset + 1) {
            self.uncommitted.remove(&tp);
        }
        Ok(())
    }

    /// Applies the latest grant: drops partitions no longer granted (after
    /// committing them), takes up new ones at their committed positions.
    async fn rebalance(&mut self) -> Result<(), ClientError> {
        let (granted, active) = {
            let mut st = self.shared.state();
            // No answer for a whole session: the coordinator has given this
            // member's partitions to others by now. Stop reading them.
            let stale = st
                .last_heartbeat
                .is_some_and(|t| t.elapsed() >= self.shared.session_timeout);
            if stale && !st.granted.is_empty() {
                st.granted.clear();
                st.changes += 1;
            }
            // The usual case: nothing to apply, nothing to copy.
            if st.granted == st.active {
                return Ok(());
            }
            (st.granted.clone(), st.active.clone())
        };
        let revoked: Vec<QueuePartition> = active.difference(&granted).cloned().collect();
        if !revoked.is_empty() {
            if self.auto_commit {
                let offsets: BTreeMap<QueuePartition, u64> = revoked
                    .iter()
                    .filter_map(|tp| self.uncommitted.remove(tp).map(|o| (tp.clone(), o)))
                    .collect();
                if !offsets.is_empty() {
                    // Fenced means another member has it already: its
                    // records from here on are that member's.
                    if let Err(e) = self.commit_offsets(&offsets).await {
                        if e.code() != Some(ErrorCode::FencedMember) && e.code() != Some(ErrorCode::UnknownMember) {
                            return Err(e);
                        }
                    }
                }
            }
            for tp in &revoked {
                self.consumer.unassign(&tp.0, tp.1);
                self.uncommitted.remove(tp);
            }
            if let Some(cb) = self.on_revoked.as_mut() {
                cb(&revoked);
            }
            let mut st = self.shared.state();
            for tp in &revoked {
                st.active.remove(tp);
                self.fresh.remove(tp);
            }
            st.release_pending = true;
            drop(st);
            // Tell the coordinator now: the new member waits for it.
            self.shared.wake.notify_all();
        }
        let added: BTreeSet<QueuePartition> = granted.difference(&active).cloned().collect();
        if !added.is_empty() {
            self.shared.state().taking = added.clone();
            let fetched = self.fetch_offsets(&added).await;
            // Only what is still granted now is taken up: a grant withdrawn
            // meanwhile was never read.
            let added: BTreeSet<QueuePartition> = {
                let mut st = self.shared.state();
                st.taking.clear();
                if fetched.is_err() {
                    return fetched.map(|_| ());
                }
                let still: BTreeSet<QueuePartition> = added.intersection(&st.granted).cloned().collect();
                st.active.extend(still.iter().cloned());
                still
            };
            let (start, committed) = fetched?;
            for tp in &added {
                self.consumer.assign(&tp.0, &[tp.1]);
                let seek = match committed.get(tp).copied().flatten() {
                    Some(o) => Seek::Offset(o),
                    None => {
                        self.fresh.insert(tp.clone());
                        start
                    }
                };
                self.consumer.seek(&tp.0, tp.1, seek)?;
            }
            if let Some(cb) = self.on_assigned.as_mut().filter(|_| !added.is_empty()) {
                let list: Vec<QueuePartition> = added.into_iter().collect();
                cb(&list);
            }
        }
        Ok(())
    }

    /// A partition taken up without a committed position starts at the
    /// group's start, resolved on the first fetch: that position is
    /// committed at once, so a member that dies before committing anything
    /// does not make the next one start later (at a newer "latest").
    async fn record_start_positions(&mut self) -> Result<(), ClientError> {
        let resolved: BTreeMap<QueuePartition, u64> = self
            .fresh
            .iter()
            .filter(|tp| !self.uncommitted.contains_key(*tp))
            .filter_map(|tp| self.consumer.position(&tp.0, tp.1).map(|o| (tp.clone(), o)))
            .collect();
        if resolved.is_empty() {
            return Ok(());
        }
        for tp in resolved.keys() {
            self.fresh.remove(tp);
        }
        match self.commit_offsets(&resolved).await {
            Err(e) if is_fenced(&e) => Ok(()),
            other => other,
        }
    }

    async fn fetch_offsets(
        &self,
        tps: &BTreeSet<QueuePartition>,
    ) -> Result<(Seek, BTreeMap<QueuePartition, Option<u64>>), ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let group = fbb.create_string(&self.shared.calls.group);
        let queues = queue_partitions(&mut fbb, tps);
        let root = FetchOffsetsRequest::create(
            &mut fbb,
            &FetchOffsetsRequestArgs {
                group: Some(group),
                queues: Some(queues),
            },
        );
        fbb.finish_minimal(root);
        let frame = self
            .shared
            .calls
            .call(Api::FetchOffsets, &fbb, |f| {
                ClientError::check(read::<FetchOffsetsResponse>(f)?.error())
            })
            .await?;
        let r = read::<FetchOffsetsResponse>(&frame)?;
        let start = if r.start() == strand_wire::GroupStart::Earliest {
            Seek::Earliest
        } else {
            Seek::Latest
        };
        Ok((start, read_offsets(r.queues())))
    }

    /// Ack mode: up to `max` records of this member's partitions, each
    /// this member's until its lock runs out; waits up to the fetch's max
    /// wait for some. Within a partition a record that waits for
    /// redelivery holds back the ones after it (per-key order).
    pub async fn receive(&mut self, max: u32) -> Result<Vec<Received>, ClientError> {
        if let Some(e) = self.shared.state().error.take() {
            return Err(e);
        }
        self.rebalance().await?;
        if self.shared.state().active.is_empty() {
            self.wait_for_assignment(self.max_wait).await;
            return Ok(Vec::new());
        }
        let deadline = std::time::Instant::now() + self.max_wait;
        loop {
            let got = self.receive_once(max).await?;
            if !got.is_empty() || std::time::Instant::now() >= deadline {
                return Ok(got);
            }
            self.wait_for_assignment(Duration::from_millis(20)).await;
        }
    }

    async fn receive_once(&self, max: u32) -> Result<Vec<Received>, ClientError> {
        let member_id = self
            .member_id()
            .ok_or_else(|| ClientError::broker(ErrorCode::UnknownMember, "not a member right now (re-joining)"))?;
        let mut fbb = FlatBufferBuilder::new();
        let group = fbb.create_string(&self.shared.calls.group);
        let member = fbb.create_string(&member_id);
        let root = ReceiveRequest::create(
            &mut fbb,
            &ReceiveRequestArgs {
                group: Some(group),
                member_id: Some(member),
                max_records: max,
                lock_ms: self.lock.as_millis().min(u128::from(u32::MAX)) as u32,
            },
        );
        fbb.finish_minimal(root);
        let frame = self
            .shared
            .calls
            .call(Api::Receive, &fbb, |f| {
                ClientError::check(read::<ReceiveResponse>(f)?.error())
            })
            .await?;
        let r = read::<ReceiveResponse>(&frame)?;
        let mut out = Vec::new();
        for part in r.partitions().into_iter().flatten() {
            let queue: Arc<str> = Arc::from(part.queue().unwrap_or_default());
            let attempts: BTreeMap<u64, u32> = part
                .offsets()
                .into_iter()
                .flatten()
                .zip(part.attempts().into_iter().flatten())
                .collect();
            let run = crate::consumer::tail_run(&frame, part.records_offset(), part.records_len(), "receive")?;
            let mut records = Vec::new();
            crate::consumer::read_batches(&(queue, part.partition()), 0, run, &mut records)?;
            out.extend(records.into_iter().filter_map(|record| {
                attempts
                    .get(&record.offset)
                    .map(|&attempt| Received { record, attempt })
            }));
        }
        Ok(out)
    }

    /// Ack mode: `record` is handled.
    pub async fn ack(&self, record: &ConsumedRecord) -> Result<(), ClientError> {
        self.settle(&[record], strand_wire::Outcome::Ack, Duration::ZERO, None)
            .await
    }

    /// Ack mode: `record` was not handled: deliver it again after `delay`
    /// (it goes to the dead-letter queue once out of attempts). `reason`
    /// is kept as its last error.
    pub async fn nack(&self, record: &ConsumedRecord, delay: Duration, reason: &str) -> Result<(), ClientError> {
        self.settle(&[record], strand_wire::Outcome::Nack, delay, Some(reason))
            .await
    }

    /// Ack mode: move `record` to the queue's dead-letter queue now.
    pub async fn dead_letter(&self, record: &ConsumedRecord, reason: &str) -> Result<(), ClientError> {
        self.settle(
            &[record],
            strand_wire::Outcome::DeadLetter,
            Duration::ZERO,
            Some(reason),
        )
        .await
    }

    /// Ack mode: keeps these records this member's for another lock period.
    pub async fn renew(&self, records: &[&ConsumedRecord]) -> Result<(), ClientError> {
        self.settle(records, strand_wire::Outcome::Renew, Duration::ZERO, None)
            .await
    }

    async fn settle(
        &self,
        records: &[&ConsumedRecord],
        outcome: strand_wire::Outcome,
        delay: Duration,
        reason: Option<&str>,
    ) -> Result<(), ClientError> {
        let member_id = self
            .member_id()
            .ok_or_else(|| ClientError::broker(ErrorCode::UnknownMember, "not a member right now (re-joining)"))?;
        let mut fbb = FlatBufferBuilder::new();
        let group = fbb.create_string(&self.shared.calls.group);
        let member = fbb.create_string(&member_id);
        // One copy of the reason, and of each queue name, in the request.
        let reason = reason.map(|t| fbb.create_string(t));
        let items: Vec<_> = records
            .iter()
            .map(|r| {
                let queue = fbb.create_shared_string(&r.queue);
                SettleRecord::create(
                    &mut fbb,
                    &SettleRecordArgs {
                        queue: Some(queue),
                        partition: r.partition,
                        offset: r.offset,
                        outcome,
                        delay_ms: delay.as_millis().min(u128::from(u32::MAX)) as u32,
                        reason,
                    },
                )
            })
            .collect();
        let items = fbb.create_vector(&items);
        let root = SettleRequest::create(
            &mut fbb,
            &SettleRequestArgs {
                group: Some(group),
                member_id: Some(member),
                records: Some(items),
            },
        );
        fbb.finish_minimal(root);
        self.shared
            .calls
            .call(Api::Settle, &fbb, |f| {
                ClientError::check(read::<SettleResponse>(f)?.error())
            })
            .await
            .map(|_| ())
    }

    /// Waits up to `limit` (less if the assignment changes).
    async fn wait_for_assignment(&self, limit: Duration) {
        let seen = self.shared.state().changes;
        let deadline = std::time::Instant::now() + limit;
        // No runtime timer here: the heartbeat thread wakes the task at the
        // deadline or when the grant changes.
        std::future::poll_fn(|cx| {
            let mut st = self.shared.state();
            if st.changes != seen || std::time::Instant::now() >= deadline || self.shared.stop.load(Ordering::SeqCst) {
                return std::task::Poll::Ready(());
            }
            st.sleepers.push((deadline, cx.waker().clone()));
            drop(st);
            self.shared.wake.notify_all();
            std::task::Poll::Pending
        })
        .await
    }

    /// Commits (with auto-commit), leaves the group (its partitions move to
    /// the other members at once) and stops the heartbeat thread.
    pub async fn close(mut self) -> Result<(), ClientError> {
        let committed = if self.auto_commit { self.commit().await } else { Ok(()) };
        self.stop();
        committed
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
    }
}

impl Drop for GroupConsumer {
    /// Leaves the group (without committing: call `close` for that).
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether an error means this member no longer holds what it tried to
/// commit or settle (the partition moved, its session ended): the records
/// go to their next reader.
pub fn is_fenced(e: &ClientError) -> bool {
    matches!(e.code(), Some(ErrorCode::FencedMember | ErrorCode::UnknownMember))
}

/// A group as `Admin::list_groups` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupListing {
    pub name: String,
    pub members: u32,
    pub generation: u64,
}

/// A member as `Admin::describe_group` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMemberInfo {
    pub member_id: String,
    pub client_name: String,
    pub queues: Vec<String>,
    pub owned: Vec<QueuePartition>,
}

/// A partition the group reads, with its lag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPartitionInfo {
    pub queue: String,
    pub partition: u32,
    pub member_id: Option<String>,
    /// Committed position.
    pub position: Option<u64>,
    /// High watermark.
    pub log_end: Option<u64>,
    pub lag: Option<u64>,
    /// Why `log_end` is unknown.
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    pub name: String,
    pub strategy: Strategy,
    pub start: GroupStart,
    pub generation: u64,
    pub members: Vec<GroupMemberInfo>,
    pub partitions: Vec<GroupPartitionInfo>,
}

/// Where `reset_group` moves positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTarget {
    Earliest,
    Latest,
    Offset(u64),
    /// Ms since the Unix epoch.
    Timestamp(i64),
}

fn opt(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

pub(crate) async fn list_groups(cluster: &Arc<Cluster>) -> Result<Vec<GroupListing>, ClientError> {
    let mut fbb = FlatBufferBuilder::new();
    let root = ListGroupsRequest::create(&mut fbb, &ListGroupsRequestArgs::default());
    fbb.finish_minimal(root);
    let conn = cluster.any_connection()?;
    let frame = conn
        .request(Api::ListGroups, fbb.finished_data(), TailBuilder::default())
        .await?;
    let r = read::<ListGroupsResponse>(&frame)?;
    ClientError::check(r.error())?;
    Ok(r.groups()
        .into_iter()
        .flatten()
        .map(|g| GroupListing {
            name: g.name().unwrap_or_default().to_string(),
            members: g.members(),
            generation: g.generation(),
        })
        .collect())
}

pub(crate) async fn describe_group(cluster: &Arc<Cluster>, group: &str) -> Result<GroupDescription, ClientError> {
    let calls = GroupCalls::new(cluster.clone(), group, ADMIN_CALL_RETRY)?;
    let mut fbb = FlatBufferBuilder::new();
    let g = fbb.create_string(group);
    let root = DescribeGroupRequest::create(&mut fbb, &DescribeGroupRequestArgs { group: Some(g) });
    fbb.finish_minimal(root);
    let frame = calls
        .call(Api::DescribeGroup, &fbb, |f| {
            ClientError::check(read::<DescribeGroupResponse>(f)?.error())
        })
        .await?;
    let r = read::<DescribeGroupResponse>(&frame)?;
    let members = r
        .members()
        .into_iter()
        .flatten()
        .map(|m| GroupMemberInfo {
            member_id: m.member_id().unwrap_or_default().to_string(),
            client_name: m.client_name().unwrap_or_default().to_string(),
            queues: m.queues().into_iter().flatten().map(str::to_string).collect(),
            owned: read_partitions(m.owned()).into_iter().collect(),
        })
        .collect();
    let partitions = r
        .partitions()
        .into_iter()
        .flatten()
        .map(|p| GroupPartitionInfo {
            queue: p.queue().unwrap_or_default().to_string(),
            partition: p.partition(),
            member_id: p.member_id().map(str::to_string),
            position: opt(p.position()),
            log_end: opt(p.log_end()),
            lag: opt(p.lag()),
            error: p.error().and_then(|e| e.message()).map(str::to_string),
        })
        .collect();
    Ok(GroupDescription {
        name: group.to_string(),
        strategy: match r.strategy() {
            AssignStrategy::Range => Strategy::Range,
            AssignStrategy::RoundRobin => Strategy::RoundRobin,
            _ => Strategy::Sticky,
        },
        start: if r.start() == strand_wire::GroupStart::Earliest {
            GroupStart::Earliest
        } else {
            GroupStart::Latest
        },
        generation: r.generation(),
        members,
        partitions,
    })
}

pub(crate) async fn reset_group(
    cluster: &Arc<Cluster>,
    group: &str,
    queue: &str,
    partitions: &[u32],
    to: ResetTarget,
) -> Result<Vec<(u32, u64)>, ClientError> {
    let calls = GroupCalls::new(cluster.clone(), group, ADMIN_CALL_RETRY)?;
    let mut fbb = FlatBufferBuilder::new();
    let g = fbb.create_string(group);
    let q = fbb.create_string(queue);
    let ps = fbb.create_vector(partitions);
    let (to, value) = match to {
        ResetTarget::Earliest => (ResetTo::Earliest, 0),
        ResetTarget::Latest => (ResetTo::Latest, 0),
        ResetTarget::Offset(o) => (ResetTo::Offset, o.min(i64::MAX as u64) as i64),
        ResetTarget::Timestamp(t) => (ResetTo::Timestamp, t),
    };
    let root = ResetGroupRequest::create(
        &mut fbb,
        &ResetGroupRequestArgs {
            group: Some(g),
            queue: Some(q),
            partitions: Some(ps),
            to,
            value,
        },
    );
    fbb.finish_minimal(root);
    let frame = calls
        .call(Api::ResetGroup, &fbb, |f| {
            ClientError::check(read::<ResetGroupResponse>(f)?.error())
        })
        .await?;
    let r = read::<ResetGroupResponse>(&frame)?;
    Ok(read_offsets(r.queues())
        .into_iter()
        .filter_map(|((_, p), o)| o.map(|o| (p, o)))
        .collect())
}

pub(crate) async fn delete_group(cluster: &Arc<Cluster>, group: &str) -> Result<(), ClientError> {
    let calls = GroupCalls::new(cluster.clone(), group, ADMIN_CALL_RETRY)?;
    let mut fbb = FlatBufferBuilder::new();
    let g = fbb.create_string(group);
    let root = DeleteGroupRequest::create(&mut fbb, &DeleteGroupRequestArgs { group: Some(g) });
    fbb.finish_minimal(root);
    calls
        .call(Api::DeleteGroup, &fbb, |f| {
            ClientError::check(read::<DeleteGroupResponse>(f)?.error())
        })
        .await
        .map(|_| ())
}
