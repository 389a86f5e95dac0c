//! The partitions one shard owns: opened, closed and deleted to match the
//! metadata table, plus the shard-wide "new data" signal for long polls.
//!
//! Runs on: every shard, for the partitions `routing::shard_for` gives it
//! and of which this node holds a replica.
//!
//! Each open partition has a [`Role`] that follows the table: the leader
//! appends (stamping its leader epoch) and keeps a
//! [`crate::replica::leader::LeaderState`] of its followers, from which the
//! high watermark comes; a follower's log is written only by its fetcher
//! (`replication.rs`), and its high watermark is the leader's as last
//! fetched. A leadership change keeps the log open: only the role changes.
//!
//! On disk a partition is `<data_dir>/<queue>/<partition>/` with a
//! `.queue-id` file holding the queue's id: a queue deleted and created
//! again while this node was down has a new id, so its old data is removed
//! instead of being served as the new queue's.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;

use strand_storage::notify::Notify;
use strand_storage::{FsyncPolicy, Log, LogConfig, Offset, ShardStorage};

use crate::controller::{FsyncSetting, MetadataTable, NodeId, PartitionRecord, QueueSettings, NO_LEADER};
use crate::lease::{mono_ms, OwnLease};
use crate::replica::leader::{Holds, LeaderSettings, LeaderState, Position};
use crate::routing::{shard_for, ShardId};

/// What this node is for a partition it holds a replica of.
pub enum Role {
    /// It leads in leader epoch `epoch`: appends are stamped with it, and
    /// `state` follows the replicas for the high watermark and the ISR.
    Leader { epoch: u32, state: LeaderState },
    /// It follows `leader` ([`NO_LEADER`]: the partition is offline) in
    /// leader epoch `epoch`.
    Follower { leader: NodeId, epoch: u32 },
}

/// An open partition.
pub struct Partition {
    pub queue_id: u64,
    pub log: Log,
    pub settings: QueueSettings,
    /// Held by a produce request while it checks and appends a batch: an
    /// append can wait (a segment roll, a full write queue), and requests
    /// behind it must neither overtake it nor find it half done. FIFO.
    pub appending: glommio::sync::Semaphore,
    /// Leader or follower (see [`Role`]). A leader's state holds the
    /// queue's `min_insync_replicas`, kept up to date (changing it does not
    /// reopen the log).
    pub role: RefCell<Role>,
    /// Notified whenever what an acks=all produce of this partition waits
    /// for may have changed: its high watermark, its ISR, its role. (Not
    /// the shard-wide `Partitions::new_data`: a high watermark moving on
    /// one partition must not wake every waiter of the shard.)
    pub acks: Notify,
    /// This broker's lease with the controller: while it does not hold,
    /// the high watermark consumers see stays where it is
    /// (`crate::lease`), and `held_back` (the shard's) is set.
    lease: OwnLease,
    held_back: Rc<Cell<bool>>,
}

impl Partition {
    /// The leader epoch this replica is in.
    pub fn leader_epoch(&self) -> u32 {
        match &*self.role.borrow() {
            Role::Leader { epoch, .. } | Role::Follower { epoch, .. } => *epoch,
        }
    }

    /// The leader epoch, if this replica leads.
    pub fn leading(&self) -> Option<u32> {
        match &*self.role.borrow() {
            Role::Leader { epoch, .. } => Some(*epoch),
            Role::Follower { .. } => None,
        }
    }

    /// The node this replica follows, if it follows one.
    pub fn following(&self) -> Option<(NodeId, u32)> {
        match &*self.role.borrow() {
            Role::Follower { leader, epoch } if *leader != NO_LEADER => Some((*leader, *epoch)),
            _ => None,
        }
    }

    /// The leader's own log moved (written, fdatasync'd): the high
    /// watermark follows what every ISR member holds. Returns whether it
    /// moved (the leader's, which acks=all waits on, or the log's, which
    /// consumers see: a new leader's log may show more than its state
    /// has confirmed yet). Nothing on a follower.
    pub fn note_local(&self) -> bool {
        let at = Position {
            log_end: self.log.written_offset(),
            flushed: self.log.flushed_offset(),
        };
        let (moved, hw) = match &mut *self.role.borrow_mut() {
            Role::Leader { state, .. } => (state.on_local(at), state.high_watermark()),
            Role::Follower { .. } => return false,
        };
        self.moved(hw, moved)
    }

    /// Moves the log's high watermark to the leader's `hw` while this
    /// broker holds its lease (without it, the controller may have given
    /// the leadership to a replica that lacks those records); wakes
    /// acks=all waiters if either moved (`state_moved`: the leader's own).
    fn moved(&self, hw: Offset, state_moved: bool) -> bool {
        let advanced = if self.lease.holds() {
            self.log.advance_high_watermark(hw)
        } else {
            if hw > self.log.high_watermark() {
                self.held_back.set(true);
            }
            false
        };
        let moved = advanced || state_moved;
        if moved {
            self.acks.notify_all();
        }
        moved
    }

    /// Follower `replica` fetched from `at.log_end` in this leader's epoch
    /// (its log agrees with the leader's): returns whether the high
    /// watermark moved (as [`Partition::note_local`] counts it).
    pub fn note_fetch(&self, replica: NodeId, at: Position) -> bool {
        let (moved, hw) = match &mut *self.role.borrow_mut() {
            Role::Leader { state, .. } => (state.on_fetch(replica, at, mono_ms()), state.high_watermark()),
            Role::Follower { .. } => return false,
        };
        self.moved(hw, moved)
    }

    /// Takes the role the table's `record` gives this node `me`: a new
    /// leader epoch makes a new role (a leader starts following its
    /// replicas afresh); the same epoch only brings the ISR up to date. A
    /// leader's high watermark then follows what its ISR holds. A record of
    /// an older leader epoch than the one this replica is in is refused
    /// (issue 41, item 5): within one controller history epochs only grow,
    /// and a table from another (a member whose applied entries never
    /// reached its log, a diverged snapshot) must not make an old leader
    /// lead again or a follower follow a deposed one.
    fn adopt(
        &self,
        name: (&str, u32),
        me: NodeId,
        record: &PartitionRecord,
        settings: &QueueSettings,
        lag_max_ms: u64,
        this_run: bool,
    ) {
        let epoch = record.leader_epoch;
        if let Some(held) = refused_epoch(self.leader_epoch(), record) {
            tracing::error!(
                queue = name.0,
                partition = name.1,
                held,
                offered = epoch,
                "refusing a metadata table whose leader epoch for this partition is older than the one applied: \
                 the role stays as it is"
            );
            return;
        }
        // Damage found at open (`Log::damage`) counts until the replica is
        // out of the ISR in a table of this run (`this_run`: one replayed
        // from before this run's registration may not yet show the report
        // that takes it out, and the current one may make it the sole
        // member): from then on it holds only what it catches up from a
        // leader, and may rejoin and lead as any follower.
        if self.log.damage().is_some() && this_run && !record.isr.contains(&me) {
            let clear = self.log.clear_damage();
            let (queue, partition) = (name.0.to_string(), name.1);
            glommio::spawn_local(async move {
                if let Err(e) = clear.await {
                    tracing::warn!(queue = %queue, partition, "removing the record of a damaged log: {e}");
                }
            })
            .detach();
        }
        // The ISR, the minimum or the role may change: waiters look again.
        self.acks.notify_all();
        {
            let mut role = self.role.borrow_mut();
            match &mut *role {
                Role::Leader { epoch: e, state } if *e == epoch && record.leader == me => {
                    if record.partition_epoch > state.partition_epoch() {
                        self.say_role(name, record, "leading: the ISR changed", state.high_watermark());
                    }
                    state.set_min_insync(settings.min_insync());
                    state.set_replicas(&record.replicas, &record.isr, mono_ms());
                    state.on_partition(record.isr.clone(), record.partition_epoch);
                }
                Role::Follower { leader, epoch: e } if *e == epoch && *leader == record.leader => return,
                // A log that lost records it had made durable must not lead
                // what others may hold more of: it serves nothing (produce
                // and replica fetches find no leader here) until the
                // controller takes it out of the ISR
                // (`Shard::report_damaged_replicas`).
                _ if record.leader == me && self.log.damage().is_some() => {
                    tracing::warn!(
                        queue = name.0,
                        partition = name.1,
                        epoch,
                        damage = self.log.damage().unwrap_or_default(),
                        "not leading: this replica lost records it had made durable; it waits for the controller to \
                         take it out of the ISR"
                    );
                    *role = Role::Follower {
                        leader: NO_LEADER,
                        epoch,
                    };
                    return;
                }
                _ if record.leader == me => {
                    let settings = LeaderSettings {
                        holds: match self.settings.fsync {
                            FsyncSetting::Always => Holds::Flushed,
                            FsyncSetting::Interval { .. } => Holds::Written,
                        },
                        lag_max_ms,
                        min_insync: settings.min_insync(),
                    };
                    let local = Position {
                        log_end: self.log.written_offset(),
                        flushed: self.log.flushed_offset(),
                    };
                    let state = LeaderState::new(
                        me,
                        &record.replicas,
                        record.isr.clone(),
                        settings,
                        local,
                        self.log.high_watermark(),
                        mono_ms(),
                    )
                    .at_partition_epoch(record.partition_epoch);
                    self.say_role(name, record, "leading", self.log.high_watermark());
                    *role = Role::Leader { epoch, state };
                }
                _ => {
                    self.say_role(name, record, "following", self.log.high_watermark());
                    *role = Role::Follower {
                        leader: record.leader,
                        epoch,
                    };
                    return;
                }
            }
        }
        self.note_local();
    }

    /// Says (INFO) what this replica of `name` became under `record`: the
    /// sequence strand-chaos's runs are read by.
    fn say_role(&self, name: (&str, u32), record: &PartitionRecord, role: &'static str, high_watermark: Offset) {
        let (queue, partition) = name;
        tracing::info!(
            queue,
            partition,
            epoch = record.leader_epoch,
            partition_epoch = record.partition_epoch,
            leader = record.leader,
            isr = ?record.isr,
            log_end = self.log.log_end().0,
            flushed = self.log.flushed_offset().0,
            high_watermark = high_watermark.0,
            "{role}"
        );
    }
}

pub struct Partitions {
    storage: ShardStorage,
    data_dir: PathBuf,
    node_id: u64,
    shard: ShardId,
    shards: u16,
    /// The broker's log settings (`segment_bytes`, `recycle_segments`), under
    /// every queue's own.
    log_base: LogConfig,
    /// Queue → partition → open partition: looked up by `&str` on every
    /// request, without building a key.
    open: RefCell<HashMap<String, HashMap<u32, Rc<Partition>>>>,
    /// Notified whenever a partition's high watermark moves.
    pub new_data: Notify,
    /// Notified after an append to an `fsync=interval` partition: wakes
    /// the shard's interval timer, which sleeps while no such partition
    /// has anything to write or sync.
    pub interval_appends: Notify,
    /// Notified after every append to a partition this shard leads, and
    /// whenever a role changes: wakes followers' fetches waiting for
    /// records, and the fetchers.
    pub appended: Notify,
    /// Notified after every table applied (roles may have changed): the
    /// fetchers look at what this shard follows.
    pub roles_changed: Notify,
    /// A follower leaves the ISR after this long without catching up.
    replica_lag_time_max_ms: u64,
    /// This broker's lease with the controller (`crate::lease`).
    pub lease: OwnLease,
    /// Set when a partition of this shard held its high watermark back
    /// because the lease did not hold (`Partition::moved`).
    held_back: Rc<Cell<bool>>,
}

/// The log settings of a queue: its own, over the broker's `base`. A queue
/// whose largest message is above the broker's segment size gets segments
/// that large (a segment holds at least one batch).
pub fn log_config(settings: &QueueSettings, base: &LogConfig) -> LogConfig {
    LogConfig {
        segment_bytes_max: match settings.segment_bytes {
            0 => base.segment_bytes_max,
            own => own,
        }
        .max(u64::from(settings.max_message_bytes)),
        fsync: match settings.fsync {
            FsyncSetting::Always => FsyncPolicy::Always,
            FsyncSetting::Interval { ms, bytes } => FsyncPolicy::Interval {
                interval_ms: ms,
                interval_bytes: bytes,
            },
        },
        retention_ms: settings.retention_ms,
        retention_bytes: settings.retention_bytes,
        batch_bytes_max: settings.max_message_bytes as usize,
        ..base.clone()
    }
}

impl Partitions {
    pub fn new(
        storage: ShardStorage,
        config: &crate::config::BrokerConfig,
        shard: ShardId,
        shards: u16,
        lease: OwnLease,
    ) -> Partitions {
        Partitions {
            storage,
            data_dir: config.data_dir.clone(),
            node_id: config.node_id,
            shard,
            shards,
            log_base: config.log_base(),
            open: RefCell::new(HashMap::new()),
            new_data: Notify::default(),
            interval_appends: Notify::default(),
            appended: Notify::default(),
            roles_changed: Notify::default(),
            replica_lag_time_max_ms: config.replica_lag_time_max_ms,
            lease,
            held_back: Rc::new(Cell::new(false)),
        }
    }

    /// The storage this shard's logs share (its memory budgets).
    pub fn storage(&self) -> &ShardStorage {
        &self.storage
    }

    pub fn get(&self, queue: &str, partition: u32) -> Option<Rc<Partition>> {
        self.open.borrow().get(queue)?.get(&partition).cloned()
    }

    /// Every open partition with its name.
    pub fn all(&self) -> Vec<((String, u32), Rc<Partition>)> {
        let open = self.open.borrow();
        let named = open
            .iter()
            .flat_map(|(q, parts)| parts.iter().map(move |(p, part)| ((q.clone(), *p), part.clone())));
        named.collect()
    }

    /// Every open partition (no names: for the frequent timers).
    pub fn logs(&self) -> Vec<Rc<Partition>> {
        self.open
            .borrow()
            .values()
            .flat_map(|parts| parts.values().cloned())
            .collect()
    }

    /// Once the lease holds, if a partition held its high watermark back
    /// while it did not (`Partition::moved`): every partition this shard
    /// leads moves the high watermark consumers see to the leader's, and
    /// the long polls wake if one moved.
    pub fn release_held_back(&self) {
        // The flag first: this runs for every acks=all answer.
        if !self.held_back.get() || !self.lease.holds() {
            return;
        }
        self.held_back.set(false);
        let mut moved = false;
        for part in self.logs() {
            moved |= part.note_local();
        }
        if moved {
            self.new_data.notify_all();
        }
    }

    /// `record` as this run may act on it: a table that does not show this
    /// run's registration (its incarnation) comes from before it — the
    /// controller log replayed at start-up, applied by the shards a moment
    /// later — and its leaderships of this node are not this run's (its
    /// registration moves them). Led by this node there, the partition is
    /// led by no one here until a table of this run's says otherwise.
    /// (Taking the lead from such a table, a restarted node went through
    /// an old ISR of itself alone and moved its high watermark over its
    /// whole log, records the others never had included: strand-chaos,
    /// seed 42, "truncating below the high watermark" after restarts.)
    fn as_this_run(&self, table: &MetadataTable, record: &PartitionRecord) -> PartitionRecord {
        as_run(self.node_id, self.lease.incarnation(), table, record)
    }

    /// Whether `table` comes after this run's registration (`as_run`).
    fn this_run(&self, table: &MetadataTable) -> bool {
        registered(self.node_id, self.lease.incarnation(), table)
    }

    fn remove(&self, queue: &str, partition: u32) {
        let mut open = self.open.borrow_mut();
        if let Some(parts) = open.get_mut(queue) {
            parts.remove(&partition);
            if parts.is_empty() {
                open.remove(queue);
            }
        }
    }

    fn dir(&self, queue: &str, partition: u32) -> PathBuf {
        self.data_dir.join(queue).join(partition.to_string())
    }

    /// Opens, closes and deletes partitions so that this shard holds exactly
    /// the replicas the table gives it, each in the role the table says.
    /// Errors are logged per partition: one bad partition does not keep the
    /// others from opening.
    pub async fn apply(&self, table: &MetadataTable) {
        let mut wanted: HashMap<(String, u32), (u64, QueueSettings, PartitionRecord)> = HashMap::new();
        for q in table.queues.values() {
            for (p, record) in q.partitions.iter().enumerate() {
                let p = p as u32;
                if record.replicas.contains(&self.node_id) && shard_for(&q.name, p, self.shards) == self.shard {
                    wanted.insert(
                        (q.name.clone(), p),
                        (q.id, q.settings.clone(), self.as_this_run(table, record)),
                    );
                }
            }
        }
        // Close what is no longer ours; delete what no longer exists.
        let current = self.all();
        for (key, part) in current {
            // A new partition count (or a setting the log does not use)
            // alone leaves existing partitions open.
            let same = |s: &QueueSettings| {
                QueueSettings {
                    partitions: part.settings.partitions,
                    max_delivery_attempts: part.settings.max_delivery_attempts,
                    min_insync_replicas: part.settings.min_insync_replicas,
                    ..s.clone()
                } == part.settings
            };
            let keep = wanted
                .get(&key)
                .is_some_and(|(id, s, _)| *id == part.queue_id && same(s));
            if keep {
                continue;
            }
            self.close_partition(&key.0, key.1, &part, table).await;
            // Deleted, or moved off this node (a reassignment completed):
            // the copy goes. (A settings change only reopens it.)
            let gone = table.queues.get(&key.0).is_none_or(|q| {
                q.id != part.queue_id
                    || q.partitions
                        .get(key.1 as usize)
                        .is_none_or(|p| !p.replicas.contains(&self.node_id))
            });
            if gone {
                self.delete_dir(&key.0, key.1);
            }
        }
        let this_run = self.this_run(table);
        for ((queue, p), (id, settings, record)) in wanted {
            if let Some(part) = self.get(&queue, p) {
                part.adopt(
                    (&queue, p),
                    self.node_id,
                    &record,
                    &settings,
                    self.replica_lag_time_max_ms,
                    this_run,
                );
                continue;
            }
            match self.open_partition(&queue, p, id, &settings).await {
                Ok(part) => self.install(queue, p, part, &record, this_run),
                Err(e) => tracing::error!(queue = %queue, partition = p, "cannot open partition: {e}"),
            }
        }
        self.roles_may_have_changed();
    }

    /// Puts a partition just opened here, in the role `record` gives it.
    fn install(&self, queue: String, p: u32, part: Partition, record: &PartitionRecord, this_run: bool) {
        part.adopt(
            (&queue, p),
            self.node_id,
            record,
            &part.settings,
            self.replica_lag_time_max_ms,
            this_run,
        );
        self.open
            .borrow_mut()
            .entry(queue)
            .or_default()
            .insert(p, Rc::new(part));
    }

    /// Roles and high watermarks may have changed: waiting fetches and
    /// acks look again.
    fn roles_may_have_changed(&self) {
        self.appended.notify_all();
        self.new_data.notify_all();
        self.roles_changed.notify_all();
    }

    /// Takes partition `p` of `queue` out of this shard and closes its log.
    /// An acks=all produce waiting on it learns at once that this replica
    /// no longer leads it (and who does, if `table` says), instead of timing
    /// out: its client retries at the leader.
    async fn close_partition(&self, queue: &str, p: u32, part: &Partition, table: &MetadataTable) {
        self.remove(queue, p);
        let (leader, epoch) = table
            .queues
            .get(queue)
            .and_then(|q| q.partitions.get(p as usize))
            .map_or((NO_LEADER, part.leader_epoch()), |r| (r.leader, r.leader_epoch));
        *part.role.borrow_mut() = Role::Follower { leader, epoch };
        part.acks.notify_all();
        if let Err(e) = part.log.close().await {
            tracing::warn!(queue, partition = p, "closing: {e}");
        }
    }

    /// The bytes one segment of a queue with `settings` takes on disk here
    /// (its own segment size, or the broker's).
    pub fn segment_bytes(&self, settings: &QueueSettings) -> u64 {
        log_config(settings, &self.log_base).segment_bytes_max
    }

    /// The table's record of partition `p` of `queue` (as this run of the
    /// node sees it), if it still names this node a replica of `part`'s
    /// queue (the same queue id): what a partition closed to be opened
    /// again from its directory is reopened in.
    fn still_here(&self, table: &MetadataTable, queue: &str, p: u32, part: &Partition) -> Option<PartitionRecord> {
        let record = table
            .queues
            .get(queue)
            .filter(|q| q.id == part.queue_id)?
            .partitions
            .get(p as usize)
            .filter(|r| r.replicas.contains(&self.node_id))?;
        Some(self.as_this_run(table, record))
    }

    /// Closes partition `p` of `queue` and opens it again from what its
    /// directory holds (as a restart would), in the role `table` gives it:
    /// how a log that failed on a full disk comes back once space is
    /// (`shard/recover.rs`). Returns the reopened log's end.
    pub async fn reopen(&self, queue: &str, p: u32, table: &MetadataTable) -> Result<Offset, String> {
        let part = self.get(queue, p).ok_or("not open here")?;
        let record = self
            .still_here(table, queue, p, &part)
            .ok_or("no longer a replica here")?;
        self.close_partition(queue, p, &part, table).await;
        let reopened = self.open_partition(queue, p, part.queue_id, &part.settings).await?;
        let end = reopened.log.log_end();
        self.install(queue.to_string(), p, reopened, &record, self.this_run(table));
        self.roles_may_have_changed();
        Ok(end)
    }

    /// Brings this shard's journaled partitions back after their journal
    /// stopped (a full disk), as a restart of the broker would, without
    /// one: stops the shard journal (`ShardStorage::stop_journal`; nothing
    /// it started lands in its files afterwards), closes every journaled
    /// partition (one whose log still works writes and fdatasyncs all it
    /// holds), replays the journal's files into their directories, starts
    /// a journal again and reopens them in the roles `table` gives them.
    /// Leaders must have handed their leadership over first
    /// (`shard/recover.rs`): a log that failed held batches in memory the
    /// replay does not bring back. Returns how many it reopened. An error
    /// (the replay, or the new journal, failed) leaves the partitions
    /// closed: the caller restarts the broker.
    pub async fn restart_journal(
        &self,
        table: &MetadataTable,
        dir: &std::path::Path,
        config: strand_storage::journal::JournalConfig,
        reason: &str,
    ) -> Result<usize, String> {
        self.storage.stop_journal(reason).await;
        let journaled: Vec<_> = self
            .all()
            .into_iter()
            .filter(|(_, part)| part.log.journaled())
            .collect();
        for ((queue, p), part) in &journaled {
            self.close_partition(queue, *p, part, table).await;
        }
        super::recover::replay_journal(&self.storage, dir, config, &self.log_base, "in place").await?;
        self.storage
            .start_journal(dir, config)
            .await
            .map_err(|e| format!("starting the shard journal again: {e}"))?;
        let mut reopened = 0;
        for ((queue, p), part) in journaled {
            let Some(record) = self.still_here(table, &queue, p, &part) else {
                continue;
            };
            match self.open_partition(&queue, p, part.queue_id, &part.settings).await {
                Ok(open) => {
                    self.install(queue, p, open, &record, self.this_run(table));
                    reopened += 1;
                }
                Err(e) => tracing::error!(queue = %queue, partition = p, "reopening after the journal's replay: {e}"),
            }
        }
        self.roles_may_have_changed();
        Ok(reopened)
    }

    async fn open_partition(
        &self,
        queue: &str,
        p: u32,
        id: u64,
        settings: &QueueSettings,
    ) -> Result<Partition, String> {
        let dir = self.dir(queue, p);
        let marker = dir.join(".queue-id");
        // Queue ids only grow: data of a lower id is an earlier queue of the
        // same name (deleted while this node was down) and goes; data of a
        // higher id means this table is older than the disk — leave it.
        let found = std::fs::read_to_string(&marker)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        if let Some(found) = found {
            if found > id {
                return Err(format!(
                    "the data on disk belongs to a newer queue (id {found}) than this table's ({id})"
                ));
            }
            if found < id {
                tracing::info!(
                    queue,
                    partition = p,
                    "removing data of an earlier queue of the same name"
                );
                std::fs::remove_dir_all(&dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
            }
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        std::fs::write(&marker, id.to_string()).map_err(|e| format!("writing {}: {e}", marker.display()))?;
        let log = self
            .storage
            .open_log(&dir, log_config(settings, &self.log_base))
            .await
            .map_err(|e| e.to_string())?;
        // The high watermark is the checkpoint's until the role is known:
        // a leader moves it to what its ISR holds, a follower to its
        // leader's.
        Ok(Partition {
            queue_id: id,
            log,
            settings: settings.clone(),
            appending: glommio::sync::Semaphore::new(1),
            role: RefCell::new(Role::Follower {
                leader: NO_LEADER,
                epoch: 0,
            }),
            acks: Notify::default(),
            lease: self.lease.clone(),
            held_back: self.held_back.clone(),
        })
    }

    fn delete_dir(&self, queue: &str, p: u32) {
        let dir = self.dir(queue, p);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %dir.display(), "deleting: {e}");
            }
        }
        // The queue's directory goes once its last partition has.
        let _ = std::fs::remove_dir(self.data_dir.join(queue));
    }

    /// Deletes the partition directories the table no longer gives this
    /// node (issue 41, item 7): a replica moved off it, or a queue deleted
    /// (or deleted and created again), while it was down — nothing else
    /// ever would. Run once the whole controller log is applied (an early
    /// table lacks queues created later); a directory is judged by its
    /// `.queue-id` ([`leftover`]), and one it cannot judge stays. Returns
    /// how many went.
    pub fn sweep_leftovers(&self, table: &MetadataTable) -> usize {
        let Ok(queues) = std::fs::read_dir(&self.data_dir) else {
            return 0;
        };
        let mut swept = 0;
        for queue in queues.flatten() {
            let name = queue.file_name().to_string_lossy().into_owned();
            let Ok(parts) = std::fs::read_dir(queue.path()) else {
                continue;
            };
            for part in parts.flatten() {
                let Some(p) = part.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                let on_disk = std::fs::read_to_string(part.path().join(".queue-id"))
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok());
                let Some(on_disk) = on_disk else { continue };
                if self.get(&name, p).is_some() {
                    continue;
                }
                if let Some(why) = leftover(table, self.node_id, &name, p, on_disk) {
                    tracing::info!(queue = %name, partition = p, "removing a replica left behind: {why}");
                    self.delete_dir(&name, p);
                    swept += 1;
                }
            }
        }
        swept
    }

    /// Closes every partition (shutdown): everything written is flushed.
    pub async fn close_all(&self) {
        let all = self.all();
        self.open.borrow_mut().clear();
        for ((queue, p), part) in all {
            if let Err(e) = part.log.close().await {
                tracing::warn!(queue = %queue, partition = p, "closing: {e}");
            }
        }
    }
}

/// Why the directory of partition `p` of queue `name`, holding queue id
/// `on_disk`, is left behind on node `node` under the complete `table`;
/// `None`: it belongs (or cannot be judged: a queue id the table has not
/// reached).
fn leftover(table: &MetadataTable, node: NodeId, name: &str, p: u32, on_disk: u64) -> Option<&'static str> {
    let Some(q) = table.queue(name) else {
        return (on_disk < table.next_queue_id).then_some("its queue was deleted");
    };
    if on_disk < q.id {
        return Some("its queue was deleted and created again");
    }
    if on_disk > q.id {
        return None;
    }
    let record = q.partitions.get(p as usize)?;
    let holds = record.replicas.contains(&node) || record.target.as_ref().is_some_and(|t| t.contains(&node));
    (!holds).then_some("the replica moved to other brokers")
}

/// The leader epoch held, when `record` carries an older one (to refuse).
fn refused_epoch(held: u32, record: &PartitionRecord) -> Option<u32> {
    (record.leader_epoch < held).then_some(held)
}

/// [`Partitions::as_this_run`] for node `node` in its run `incarnation`.
fn as_run(node: NodeId, incarnation: u64, table: &MetadataTable, record: &PartitionRecord) -> PartitionRecord {
    let mut record = record.clone();
    if record.leader == node && !registered(node, incarnation, table) {
        record.leader = NO_LEADER;
    }
    record
}

/// Whether `table` holds node `node`'s registration of its run `incarnation`.
fn registered(node: NodeId, incarnation: u64, table: &MetadataTable) -> bool {
    table.brokers.get(&node).is_some_and(|b| b.incarnation == incarnation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::BrokerRecord;

    fn broker(id: NodeId, incarnation: u64) -> BrokerRecord {
        BrokerRecord {
            id,
            address: format!("127.0.0.1:{}", 9400 + id),
            shards: 1,
            alive: true,
            incarnation,
            draining: false,
            decommissioning: false,
            directory: 1,
        }
    }

    #[test]
    fn replicas_left_behind_are_told_from_those_that_belong() {
        use crate::controller::{QueueRecord, QueueSettings};
        let mut table = MetadataTable {
            next_queue_id: 10,
            ..MetadataTable::default()
        };
        table.queues.insert(
            "q".into(),
            QueueRecord {
                id: 5,
                name: "q".into(),
                settings: QueueSettings::for_tests(1, 3),
                partitions: vec![led_by(1)], // replicas 1, 2, 3
            },
        );
        assert_eq!(leftover(&table, 2, "q", 0, 5), None, "a replica of it");
        assert_eq!(
            leftover(&table, 4, "q", 0, 5),
            Some("the replica moved to other brokers")
        );
        assert_eq!(
            leftover(&table, 2, "q", 0, 3),
            Some("its queue was deleted and created again")
        );
        assert_eq!(leftover(&table, 2, "q", 0, 7), None, "newer than the table: left alone");
        assert_eq!(leftover(&table, 2, "gone", 0, 4), Some("its queue was deleted"));
        assert_eq!(leftover(&table, 2, "gone", 0, 12), None);
        assert_eq!(leftover(&table, 2, "q", 3, 5), None, "no such partition: left alone");
        let mut moving = table.clone();
        moving.queues.get_mut("q").unwrap().partitions[0].target = Some(vec![1, 2, 4]);
        assert_eq!(leftover(&moving, 4, "q", 0, 5), None, "a target replica catching up");
    }

    #[test]
    fn a_record_of_an_older_leader_epoch_is_refused() {
        let record = led_by(1); // leader epoch 7
        assert_eq!(refused_epoch(8, &record), Some(8), "older than the one applied");
        assert_eq!(refused_epoch(7, &record), None, "the same epoch: the ISR may change");
        assert_eq!(refused_epoch(0, &record), None, "a partition just opened");
    }

    fn led_by(leader: NodeId) -> PartitionRecord {
        PartitionRecord {
            replicas: vec![1, 2, 3],
            leader,
            leader_epoch: 7,
            isr: vec![leader],
            partition_epoch: 9,
            target: None,
            lost: None,
            decommission_moves: Vec::new(),
        }
    }

    /// Bug 10 (strand-chaos, seed 42): a restarted node replays tables of
    /// its earlier run in which it led with an ISR of itself alone; it must
    /// not lead from them, or it moves its high watermark over records the
    /// others never had.
    #[test]
    fn a_node_takes_no_leadership_from_a_table_of_an_earlier_run() {
        let this_run = 0xBEEF;
        let mut table = MetadataTable::default();
        // Replayed: the node registered under its previous run.
        table.brokers.insert(1, broker(1, 0xDEAD));
        table.brokers.insert(2, broker(2, 5));
        let seen = as_run(1, this_run, &table, &led_by(1));
        assert_eq!(seen.leader, NO_LEADER);
        assert_eq!(
            (seen.leader_epoch, &seen.isr),
            (7, &vec![1]),
            "the rest as the table says"
        );
        // Another's leadership stands (the node follows it).
        assert_eq!(as_run(1, this_run, &table, &led_by(2)), led_by(2));
        // Not registered at all yet: no leadership either.
        table.brokers.remove(&1);
        assert_eq!(as_run(1, this_run, &table, &led_by(1)).leader, NO_LEADER);
        // Once the table shows this run's registration, it leads.
        table.brokers.insert(1, broker(1, this_run));
        assert_eq!(as_run(1, this_run, &table, &led_by(1)), led_by(1));
    }
}
