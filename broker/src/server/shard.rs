//! One shard: a glommio executor pinned to a core, with its own storage,
//! partitions, listener and connections. Shard 0 also hosts the controller.
//!
//! Runs on: every shard (one per core).
//!
//! Requests for a partition another shard owns are forwarded over the
//! bounded mesh (`try_send`: a full queue is an `Overloaded` error, never a
//! blocked reactor). Shard 0 pushes every new metadata table to the other
//! shards and answers a metadata change only once all of them applied it.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::channels::channel_mesh::{Full, Receivers, Senders};
use strand_storage::notify::Notify;
use strand_storage::{LeaderEpoch, Offset, StorageError};
use strand_wire::ErrorCode;

use super::messages::*;
use super::partitions::{Partition, Partitions};
use crate::config::BrokerConfig;
use crate::controller::{Command, Controller, MetadataTable, ProposeError};
use crate::groups::{Coordinator, GROUPS_QUEUE};
use crate::idempotence::{Sequenced, Verdict};
use crate::routing::{shard_for, ShardId};

/// Everything a shard's tasks share.
pub struct Shard {
    pub id: ShardId,
    pub shards: u16,
    pub config: Arc<BrokerConfig>,
    pub partitions: Partitions,
    pub table: RefCell<Arc<MetadataTable>>,
    pub(super) peers: Senders<ShardMessage>,
    /// Shard 0: the controller member.
    pub controller: RefCell<Option<Rc<Controller>>>,
    /// Shard 0: highest table version every shard has applied.
    all_applied: Cell<u64>,
    all_applied_event: Notify,
    /// Shard 0: version of the newest table handed to `publish`.
    latest_published: Cell<u64>,
    /// One table is applied at a time.
    applying: glommio::sync::Semaphore,
    /// Requests being served (shutdown waits for them).
    pub in_flight: Cell<usize>,
    /// Requests and shard messages taken up since the start (the stall
    /// probe runs while this moves).
    pub requests_seen: Cell<u64>,
    pub stopping: Cell<bool>,
    /// The consumer groups of the `__groups` partitions this shard owns.
    pub groups: Coordinator,
    /// This shard's counters (see `crate::metrics`).
    pub metrics: crate::metrics::ShardMetrics,
}

impl Shard {
    pub fn new(
        id: ShardId,
        shards: u16,
        config: Arc<BrokerConfig>,
        partitions: Partitions,
        peers: Senders<ShardMessage>,
    ) -> Shard {
        Shard {
            id,
            shards,
            config,
            partitions,
            table: RefCell::new(Arc::new(MetadataTable::default())),
            peers,
            controller: RefCell::new(None),
            all_applied: Cell::new(0),
            all_applied_event: Notify::default(),
            latest_published: Cell::new(0),
            applying: glommio::sync::Semaphore::new(1),
            in_flight: Cell::new(0),
            requests_seen: Cell::new(0),
            stopping: Cell::new(false),
            groups: Coordinator::default(),
            metrics: crate::metrics::ShardMetrics::default(),
        }
    }

    pub fn table(&self) -> Arc<MetadataTable> {
        self.table.borrow().clone()
    }

    /// Installs a table here and opens/closes partitions to match (tables
    /// older than the one held are ignored).
    /// Tables apply one at a time; the partitions change first, so a
    /// request that sees a queue in the table finds its partitions open.
    pub async fn apply_table(&self, table: Arc<MetadataTable>) {
        let Ok(_turn) = self.applying.acquire_permit(1).await else {
            return;
        };
        if table.applied_index < self.table.borrow().applied_index {
            return;
        }
        self.partitions.apply(&table).await;
        self.groups.retain(|p| self.partitions.get(GROUPS_QUEUE, p).is_some());
        self.groups.forget_deleted_queues(&table);
        self.metrics.retain_queues(|q| table.queue(q).is_some());
        *self.table.borrow_mut() = table;
    }

    /// Shard 0: waits (up to `limit`) until every shard applied the newest
    /// table published so far.
    pub async fn wait_all_applied(&self, limit: Duration) -> bool {
        let target = self.latest_published.get();
        let deadline = Instant::now() + limit;
        while self.all_applied.get() < target {
            let seen = self.all_applied_event.epoch();
            if self.all_applied.get() >= target {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = glommio::timer::timeout(left.min(Duration::from_millis(100)), async {
                self.all_applied_event.wait(seen).await;
                Ok(())
            })
            .await;
        }
        true
    }

    /// Shard 0: sends `table` to every other shard, applies it here, and
    /// records when all have.
    pub fn publish(self: &Rc<Self>, table: Arc<MetadataTable>) {
        self.latest_published
            .set(self.latest_published.get().max(table.applied_index));
        let shard = self.clone();
        glommio::spawn_local(async move {
            let mut acks = Vec::new();
            for peer in 0..usize::from(shard.shards) {
                if peer == usize::from(shard.id.0) {
                    continue;
                }
                let (tx, rx) = Answer::channel(shard.id.0);
                let msg = ShardMessage::Metadata {
                    table: table.clone(),
                    applied: tx,
                };
                if shard.peers.send_to(peer, msg).await.is_ok() {
                    acks.push(rx);
                }
            }
            shard.apply_table(table.clone()).await;
            for ack in acks {
                let _ = ack.await;
            }
            if table.applied_index > shard.all_applied.get() {
                shard.all_applied.set(table.applied_index);
                shard.all_applied_event.notify_all();
            }
        })
        .detach();
    }

    /// Commits a controller command (on shard 0, directly; elsewhere
    /// forwarded there) and resolves once every shard applied it.
    pub async fn propose(&self, command: Command) -> Result<(), ProposeError> {
        if self.id.0 != 0 {
            let (tx, rx) = Answer::channel(self.id.0);
            self.peers
                .try_send_to(0, ShardMessage::Propose { command, reply: tx })
                .map_err(|_| ProposeError::Unavailable("shard 0 is overloaded".into()))?;
            return rx
                .await
                .unwrap_or_else(|_| Err(ProposeError::Unavailable("shard 0 dropped the request".into())));
        }
        let controller = self
            .controller
            .borrow()
            .clone()
            .ok_or_else(|| ProposeError::Unavailable("the controller is not running".into()))?;
        let result = controller.propose(command).await;
        // Refused commands change nothing, but still wait: the caller then
        // sees every shard at least as new as this commit.
        self.wait_all_applied(Duration::from_secs(10)).await;
        result
    }

    /// The shard that owns a partition.
    pub fn owner(&self, queue: &str, partition: u32) -> ShardId {
        shard_for(queue, partition, self.shards)
    }

    /// Serves `request` here if this shard is `owner` (the partition's,
    /// from [`Shard::owner`]), else forwards it there.
    pub async fn route(self: &Rc<Self>, owner: ShardId, queue: String, partition: u32, request: PartitionRequest) {
        if owner == self.id {
            self.serve_partition(&queue, partition, request).await;
            return;
        }
        let msg = ShardMessage::Partition {
            queue,
            partition,
            request,
        };
        if let Err(e) = self.peers.try_send_to(usize::from(owner.0), msg) {
            let returned = match e {
                glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(m))
                | glommio::GlommioError::Closed(glommio::ResourceType::Channel(m)) => Some(m),
                _ => None,
            };
            if let Some(ShardMessage::Partition {
                queue,
                partition,
                request,
            }) = returned
            {
                let err = WireError::new(
                    ErrorCode::Overloaded,
                    format!("the broker is busy: too many requests queued for {queue}/{partition}; retry"),
                );
                reply_error(request, err);
            }
        }
    }

    /// Serves a partition request on the owning shard.
    pub async fn serve_partition(self: &Rc<Self>, queue: &str, partition: u32, request: PartitionRequest) {
        let Some(part) = self.partitions.get(queue, partition) else {
            let table = self.table();
            let err = match table.queue(queue) {
                None => WireError::new(ErrorCode::UnknownQueue, format!("queue {queue:?} does not exist")),
                Some(q) if partition as usize >= q.partitions.len() => WireError::new(
                    ErrorCode::UnknownPartition,
                    format!("queue {queue:?} has {} partitions", q.partitions.len()),
                ),
                // Led here but not open: being (re)opened, or it failed to
                // open. NotLeader makes clients refresh and retry.
                Some(q) if q.partitions[partition as usize].leader == self.config.node_id => WireError::new(
                    ErrorCode::NotLeader,
                    format!(
                        "{queue}/{partition} is not open on this broker yet (opening, or it failed to open: \
                         see the broker's log); retry"
                    ),
                ),
                Some(q) => WireError::new(
                    ErrorCode::NotLeader,
                    format!(
                        "broker {} leads {queue}/{partition}",
                        q.partitions[partition as usize].leader
                    ),
                ),
            };
            reply_error(request, err);
            return;
        };
        match request {
            PartitionRequest::Produce { records, acks, reply } => {
                let result = self.produce(&part, records, acks).await;
                if result
                    .as_ref()
                    .is_err_and(|e| matches!(e.code, ErrorCode::OutOfOrderSequence | ErrorCode::UnknownProducer))
                {
                    self.metrics.sequence_refused();
                }
                reply.send(result);
            }
            PartitionRequest::Fetch {
                offset,
                max_bytes,
                reply,
            } => {
                let log = &part.log;
                let hw = log.high_watermark();
                let result = log
                    .read_below(Offset(offset), max_bytes as usize, hw)
                    .await
                    .map(|mut read| {
                        // Batches read from disk slice this shard's I/O
                        // buffers, which must not be freed on another
                        // thread: copied when the answer leaves the shard.
                        if reply.origin() != self.id.0 {
                            read.detach();
                        }
                        Fetched {
                            read,
                            high_watermark: hw.0,
                            log_start: log.log_start().0,
                        }
                    })
                    .map_err(storage_error);
                reply.send(result);
            }
            PartitionRequest::ListOffsets { query, reply } => {
                let log = &part.log;
                let result = match query {
                    OffsetQuery::Earliest => Ok((log.log_start().0, true)),
                    OffsetQuery::Latest => Ok((log.high_watermark().0, true)),
                    OffsetQuery::Timestamp(ts) => match log.offset_for_timestamp(ts).await {
                        Ok(Some(o)) if o < log.high_watermark() => Ok((o.0, true)),
                        Ok(_) => Ok((log.high_watermark().0, false)),
                        Err(e) => Err(storage_error(e)),
                    },
                };
                reply.send(result);
            }
            PartitionRequest::Group { op, reply } => {
                if queue != GROUPS_QUEUE {
                    let err = WireError::new(ErrorCode::InvalidRequest, format!("{queue} holds no groups"));
                    return reply.send(Err(err));
                }
                reply.send(self.groups.serve(self, partition, &part, *op).await);
            }
            PartitionRequest::Describe { reply } => {
                let log = &part.log;
                reply.send(Ok(PartitionStats {
                    log_start: log.log_start().0,
                    log_end: log.log_end().0,
                    high_watermark: log.high_watermark().0,
                    stored_bytes: log.size_bytes(),
                    segments: log.segment_count() as u32,
                }));
            }
        }
    }

    /// Appends the batches in `records` and, for acks ≥ 1, waits until they
    /// are durable per the queue's policy; then moves the high watermark
    /// (one replica: what is durable is committed).
    pub(crate) async fn produce(
        self: &Rc<Self>,
        part: &Partition,
        mut records: bytes::BytesMut,
        acks: i8,
    ) -> Result<Produced, WireError> {
        let log = &part.log;
        let interval = matches!(log.config().fsync, strand_storage::FsyncPolicy::Interval { .. });
        if records.is_empty() {
            return Err(WireError::new(ErrorCode::InvalidRequest, "no record batch"));
        }
        let max = log.config().batch_bytes_max;
        // Several batches in one request: check them all before appending
        // any, so a bad one cannot leave the request half applied.
        let mut rest = &records[..];
        let mut count = 0;
        while !rest.is_empty() {
            let len = (strand_storage::batch::batch_length(rest).unwrap_or(0) as usize).min(rest.len());
            if count > 0 || len < rest.len() {
                strand_storage::batch::validate(&rest[..len], max)
                    .map_err(|e| storage_error(StorageError::InvalidBatch(e)))?;
            }
            count += 1;
            rest = &rest[len.max(1).min(rest.len())..];
        }
        let mut first = None;
        let mut last = None;
        let mut stored_bytes = 0;
        while !records.is_empty() {
            let len = strand_storage::batch::batch_length(&records).unwrap_or(0) as usize;
            if len > max {
                return Err(WireError::new(
                    ErrorCode::MessageTooLarge,
                    format!("record batch of {len} bytes is over the queue's limit of {max}"),
                ));
            }
            if len < strand_storage::batch::HEADER_LEN || len > records.len() {
                return Err(WireError::new(
                    ErrorCode::CorruptBatch,
                    format!(
                        "record batch length {len} does not fit the {} bytes sent",
                        records.len()
                    ),
                ));
            }
            let batch = records.split_to(len);
            let info = {
                let _turn = part
                    .appending
                    .acquire_permit(1)
                    .await
                    .map_err(|_| WireError::new(ErrorCode::NotLeader, "the partition is closing; retry"))?;
                append_once(part, batch).await?
            };
            // Wakes the interval timer (it sleeps while nothing is to be
            // written): per batch, so a later batch's failure cannot leave
            // an earlier one unwritten until the timer's next look.
            if interval {
                self.partitions.interval_appends.notify_all();
            }
            first.get_or_insert(info);
            last = Some(info);
            stored_bytes += info.bytes;
        }
        let (Some(first), Some(last)) = (first, last) else {
            return Err(WireError::new(ErrorCode::InvalidRequest, "no record batch"));
        };
        let commit = {
            let (log, shard) = (log.clone(), self.clone());
            async move {
                let result = log.wait_durable(last.last_offset).await;
                if result.is_ok() && log.advance_high_watermark(last.last_offset.plus(1)) {
                    shard.partitions.new_data.notify_all();
                }
                result
            }
        };
        // What an acknowledgement waits for (the schema's ProduceRequest.acks):
        // acks=0 nothing; acks=1 on an fsync=interval queue the append to
        // the leader's log — like Kafka's acks=1, whose leader answers from
        // its page cache: the records are written within milliseconds and
        // fdatasync'd per the interval, and a broker crash before then loses
        // them (REQUIREMENTS: only acks=all must survive kill -9); acks=1 on
        // fsync=always and acks=all wait until the records are durable per
        // the policy (written to the device, or fdatasync'd). Consumers see
        // records only once they are durable per the policy, whatever the
        // acks (the high watermark moves in `commit`).
        let wait = !matches!(
            (acks, log.config().fsync),
            (0, _) | (1, strand_storage::FsyncPolicy::Interval { .. })
        );
        if wait {
            commit.await.map_err(storage_error)?;
        } else {
            glommio::spawn_local(async move {
                if let Err(e) = commit.await {
                    tracing::warn!("an append answered before it was durable failed to become durable: {e}");
                }
            })
            .detach();
        }
        Ok(Produced {
            base_offset: first.base_offset.0,
            last_offset: last.last_offset.0,
            log_append_time_ms: if log.config().log_append_time {
                last.max_timestamp
            } else {
                -1
            },
            log_start: log.log_start().0,
            stored_bytes,
        })
    }

    /// This shard's counters, partitions and group positions, for a scrape.
    pub fn snapshot(&self) -> crate::metrics::ShardSnapshot {
        let (positions, rebalances) = self.groups.positions();
        let mut snap = crate::metrics::ShardSnapshot {
            shard: self.id.0,
            positions,
            rebalances,
            fsync_buckets: vec![0; strand_storage::log::SYNC_BUCKETS_SECS.len() + 1],
            ..Default::default()
        };
        // One pass over the partitions: their gauges and fdatasync stats.
        for ((queue, partition), part) in self.partitions.all() {
            let log = &part.log;
            snap.partitions.push(crate::metrics::PartitionGauges {
                queue,
                partition,
                log_start: log.log_start().0,
                log_end: log.log_end().0,
                high_watermark: log.high_watermark().0,
                stored_bytes: log.size_bytes(),
            });
            let stats = log.stats();
            for (b, n) in snap.fsync_buckets.iter_mut().zip(stats.sync_buckets) {
                *b += n;
            }
            snap.fsync_sum_secs += stats.sync_ns as f64 / 1e9;
            snap.fsync_count += stats.syncs;
            snap.rolls += stats.rolls;
            snap.recycled += stats.recycled;
        }
        let storage = self.partitions.storage();
        snap.tail_cache_bytes = storage.tail_cache_bytes() as u64;
        snap.readahead_bytes = storage.readahead_bytes() as u64;
        snap.readahead_refused = storage.readahead_refused();
        self.metrics.fill(&mut snap);
        snap.busy_ratio = self
            .metrics
            .busy_ratio(glommio::executor().executor_stats().total_runtime());
        snap.requests_in_flight = self.in_flight.get() as u64;
        snap
    }

    /// Asks shard `peer` for its snapshot over the mesh; `None` if it has
    /// stopped.
    pub async fn ask_snapshot(&self, peer: u16) -> Option<crate::metrics::ShardSnapshot> {
        let (tx, rx) = Answer::channel(self.id.0);
        self.peers
            .send_to(usize::from(peer), ShardMessage::Stats { reply: tx })
            .await
            .ok()?;
        rx.await.ok()
    }

    /// Serves messages from other shards until they all hang up.
    pub fn start_mesh_receivers(self: &Rc<Self>, receivers: Receivers<ShardMessage>) {
        let receivers = Rc::new(receivers);
        for peer in 0..usize::from(self.shards) {
            if peer == usize::from(self.id.0) {
                continue;
            }
            let (shard, receivers) = (self.clone(), receivers.clone());
            glommio::spawn_local(async move {
                while let Ok(Some(msg)) = receivers.recv_from(peer).await {
                    // A reply only completes a channel: no task for it.
                    if let ShardMessage::Run(Deferred(work)) = msg {
                        work();
                        continue;
                    }
                    shard.requests_seen.set(shard.requests_seen.get() + 1);
                    let shard = shard.clone();
                    glommio::spawn_local(async move { shard.on_message(msg).await }).detach();
                }
            })
            .detach();
        }
    }

    async fn on_message(self: Rc<Self>, msg: ShardMessage) {
        match msg {
            ShardMessage::Partition {
                queue,
                partition,
                request,
            } => self.serve_partition(&queue, partition, request).await,
            ShardMessage::Propose { command, reply } => {
                reply.send(self.propose(command).await);
            }
            ShardMessage::Run(Deferred(work)) => work(), // (run by the receiver)
            ShardMessage::Metadata { table, applied } => {
                self.apply_table(table).await;
                applied.send(());
            }
            ShardMessage::Stats { reply } => reply.send(self.snapshot()),
            ShardMessage::Connection(fd) => super::connection::adopt(self, fd).await,
        }
    }
}

thread_local! {
    /// The shard this executor thread runs, for [`run_on_shard`].
    static CURRENT: RefCell<Weak<Shard>> = const { RefCell::new(Weak::new()) };
    /// Set once the shard has shut down: no more tasks may be spawned here.
    static TORN_DOWN: Cell<bool> = const { Cell::new(false) };
}

/// Marks this shard's executor as finished (its leftover tasks are dropped
/// outside it, where spawning would panic).
pub fn mark_torn_down() {
    TORN_DOWN.with(|t| t.set(true));
}

/// Marks `shard` as the one this thread runs.
pub fn set_current(shard: &Rc<Shard>) {
    CURRENT.with(|c| *c.borrow_mut() = Rc::downgrade(shard));
}

/// Runs `work` on shard `target`: here if this is it (or this thread is no
/// shard), else sent over the mesh — waiting for room rather than dropping
/// it, since a lost reply would hang its request.
pub fn run_on_shard(target: u16, work: Deferred) {
    let here = CURRENT.with(|c| c.borrow().upgrade());
    let Some(shard) = here.filter(|s| s.id.0 != target) else {
        return (work.0)();
    };
    match shard.peers.try_send_to(usize::from(target), ShardMessage::Run(work)) {
        Ok(()) => {}
        // After shutdown nobody waits for replies: no task to spawn then.
        Err(glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(msg))) if !TORN_DOWN.with(Cell::get) => {
            glommio::spawn_local(async move {
                let _ = shard.peers.send_to(usize::from(target), msg).await;
            })
            .detach();
        }
        // The target has stopped (shutdown), or this shard has: nobody
        // waits any more.
        Err(_) => {}
    }
}

/// Appends one batch of a produce request, unless its producer's sequence
/// says otherwise ([`crate::idempotence`]): a duplicate is answered with the
/// offsets it was stored at; a batch out of order is refused
/// (`OutOfOrderSequence`, which the producer retries in order).
async fn append_once(part: &Partition, batch: bytes::BytesMut) -> Result<strand_storage::AppendInfo, WireError> {
    let seq = strand_storage::batch::BatchHeader::parse(&batch)
        .and_then(|h| Sequenced::of(h.producer_id, h.base_sequence, h.record_count));
    let Some(seq) = seq else {
        return part.log.append(batch, LeaderEpoch(0)).await.map_err(storage_error);
    };
    let verdict = part.producers.borrow().check(seq);
    let (code, why) = match verdict {
        Verdict::Append => {
            let info = part.log.append(batch, LeaderEpoch(0)).await.map_err(storage_error)?;
            let stored = (info.base_offset.0, info.last_offset.0, info.max_timestamp);
            part.producers.borrow_mut().appended(seq, stored);
            return Ok(info);
        }
        Verdict::Duplicate((base, last, max_timestamp)) => {
            return Ok(strand_storage::AppendInfo {
                base_offset: Offset(base),
                last_offset: Offset(last),
                max_timestamp,
                bytes: 0,
            })
        }
        Verdict::OutOfOrder { expected } => (
            ErrorCode::OutOfOrderSequence,
            format!("out of order: the partition expects sequence {expected} next"),
        ),
        Verdict::Unknown => (
            ErrorCode::UnknownProducer,
            "this leader does not know the producer (restarted, moved, or forgot it); go on under a new \
             producer id from sequence 0"
                .to_string(),
        ),
    };
    tracing::debug!(
        producer = seq.producer_id,
        sequence = seq.first,
        "produce refused: {why}"
    );
    Err(WireError::new(
        code,
        format!("producer {}, sequence {}: {why}", seq.producer_id, seq.first),
    ))
}

/// Answers a partition request with an error.
pub fn reply_error(request: PartitionRequest, err: WireError) {
    match request {
        PartitionRequest::Produce { reply, .. } => reply.send(Err(err)),
        PartitionRequest::Fetch { reply, .. } => reply.send(Err(err)),
        PartitionRequest::ListOffsets { reply, .. } => reply.send(Err(err)),
        PartitionRequest::Describe { reply } => reply.send(Err(err)),
        PartitionRequest::Group { reply, .. } => reply.send(Err(err)),
    }
}

/// The wire error for a storage error.
pub fn storage_error(e: StorageError) -> WireError {
    use strand_storage::BatchError;
    let code = match &e {
        StorageError::InvalidBatch(BatchError::TooLarge { .. }) => ErrorCode::MessageTooLarge,
        StorageError::InvalidBatch(_) => ErrorCode::CorruptBatch,
        StorageError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
        StorageError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => ErrorCode::StorageFull,
        _ => ErrorCode::StorageError,
    };
    WireError::new(code, e.to_string())
}

/// A mesh of `shards` peers for `ShardMessage`s.
pub type Mesh = glommio::channels::channel_mesh::MeshBuilder<ShardMessage, Full>;
