//! One shard's state: a glommio executor pinned to a core, with its own
//! storage and partitions. Everything here runs on that shard's thread.
//!
//! Runs on: every shard (one per core). Shard 0 also hosts the controller.
//!
//! - this file: [`Shard`] (what a shard's tasks share), the typed slots the
//!   layers above keep per shard ([`Extensions`]: the group coordinator),
//!   and running work on another shard ([`run_on_shard`]);
//! - `messages.rs`: what shards send each other over the mesh, and the
//!   [`messages::Answer`] that brings a reply back to the waiting shard;
//! - `partitions.rs`: the partitions this shard owns (their roles), opened
//!   and closed to match the metadata table;
//! - `serve.rs`: serving a request for a partition this shard owns;
//! - `produce.rs`: the produce path (validation, idempotence, append,
//!   durability, high watermark);
//! - `metadata.rs`: the link to the controller — applying tables, shard 0
//!   publishing them and committing proposals;
//! - `stats.rs`: the shard's figures for a metrics scrape.
//!
//! Reaching a partition's owner from anywhere is the router's job
//! (`router.rs`); this module serves what reaches it and knows nothing
//! of the layers above (groups, handlers, server).

pub mod disk;
mod lease;
pub mod messages;
mod metadata;
pub mod partitions;
mod produce;
pub(crate) mod recover;
pub use recover::RECOVER_EVERY;
mod serve;
mod stats;

use std::any::{Any, TypeId};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use glommio::channels::channel_mesh::{Full, Senders};
use strand_storage::notify::Notify;
use strand_storage::StorageError;
use strand_wire::ErrorCode;

use crate::config::BrokerConfig;
use crate::controller::{Controller, MetadataTable};
use crate::routing::{shard_for, ShardId};
use messages::*;
use partitions::Partitions;

/// Called on a shard after it applied a new metadata table.
pub type TableHook = Box<dyn Fn(&Shard, &MetadataTable)>;

/// The exit status of a broker that stops for its supervisor (systemd's
/// `Restart=`) to start it again: its controller member stopped on a
/// storage error, or a shard could not bring its journaled partitions back
/// in place (EX_TEMPFAIL). Kept here, below `server`, which exits with it
/// too.
pub const EXIT_TO_RESTART: i32 = 75;

/// Everything a shard's tasks share.
pub struct Shard {
    pub id: ShardId,
    pub shards: u16,
    pub config: Arc<BrokerConfig>,
    pub partitions: Partitions,
    pub table: RefCell<Arc<MetadataTable>>,
    /// The mesh to the other shards of this node.
    pub(crate) peers: Senders<ShardMessage>,
    /// This shard's links to the other nodes (`router::call_node`).
    pub nodes: crate::peer::Peers,
    /// Shard 0: the controller member.
    pub controller: RefCell<Option<Rc<Controller>>>,
    /// The controller leader's node id as shard 0's member knows it (0:
    /// none), shared by every shard of the node for metadata answers.
    pub controller_leader: Arc<AtomicU64>,
    /// Shard 0: highest table version every shard has applied.
    all_applied: Cell<u64>,
    all_applied_event: Notify,
    /// Shard 0: version of the newest table handed to `publish`.
    latest_published: Cell<u64>,
    /// One table is applied at a time.
    applying: glommio::sync::Semaphore,
    /// Run after each table applied here (see [`Shard::on_table_applied`]).
    table_hooks: RefCell<Vec<TableHook>>,
    /// Requests being served (shutdown waits for them).
    pub in_flight: Cell<usize>,
    /// Requests and shard messages taken up since the start (the stall
    /// probe runs while this moves).
    pub requests_seen: Cell<u64>,
    pub stopping: Cell<bool>,
    /// Set once the node serves clients (the ready line); before, the
    /// listener is open for the controller's members only.
    pub serving: Cell<bool>,
    /// Per-shard state of the layers above (the group coordinator).
    pub ext: Extensions,
    /// This shard's counters (see `crate::metrics`).
    pub metrics: crate::metrics::ShardMetrics,
    /// The data directory's free space, looked at every second.
    pub disk: disk::DiskSpace,
}

impl Shard {
    pub fn new(
        id: ShardId,
        shards: u16,
        config: Arc<BrokerConfig>,
        partitions: Partitions,
        peers: Senders<ShardMessage>,
        controller_leader: Arc<AtomicU64>,
        peer: crate::frame_io::PeerSecurity,
    ) -> Shard {
        Shard {
            id,
            shards,
            nodes: crate::peer::Peers::new(config.max_frame_bytes, peer),
            config,
            partitions,
            table: RefCell::new(Arc::new(MetadataTable::default())),
            peers,
            controller: RefCell::new(None),
            controller_leader,
            all_applied: Cell::new(0),
            all_applied_event: Notify::default(),
            latest_published: Cell::new(0),
            applying: glommio::sync::Semaphore::new(1),
            table_hooks: RefCell::new(Vec::new()),
            in_flight: Cell::new(0),
            requests_seen: Cell::new(0),
            stopping: Cell::new(false),
            serving: Cell::new(false),
            ext: Extensions::default(),
            metrics: crate::metrics::ShardMetrics::default(),
            disk: disk::DiskSpace::default(),
        }
    }

    /// `StorageFull` while the data directory's free space is below its
    /// threshold (see [`disk`]).
    pub fn disk_refusal(&self) -> Option<WireError> {
        self.disk.refusal(self.config.node_id, &self.config.data_dir)
    }

    pub fn table(&self) -> Arc<MetadataTable> {
        self.table.borrow().clone()
    }

    /// The shard of this node that owns a partition.
    pub fn owner(&self, queue: &str, partition: u32) -> ShardId {
        shard_for(queue, partition, self.shards)
    }

    /// Runs `hook` after every table this shard applies from now on (once
    /// its partitions match the table): how a layer above drops state of
    /// partitions and queues that went away.
    pub fn on_table_applied(&self, hook: TableHook) {
        self.table_hooks.borrow_mut().push(hook);
    }
}

/// Per-shard state that the layers above this one keep on the shard, one
/// value per type (the group coordinator's loaded groups): the shard holds
/// it without depending on those layers.
#[derive(Default)]
pub struct Extensions(RefCell<HashMap<TypeId, Rc<dyn Any>>>);

impl Extensions {
    /// This shard's `T`, made with `T::default()` on first use.
    pub fn get_or_default<T: Default + 'static>(&self) -> Rc<T> {
        let mut map = self.0.borrow_mut();
        let slot = map
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Rc::new(T::default()) as Rc<dyn Any>)
            .clone();
        drop(map);
        match slot.downcast::<T>() {
            Ok(value) => value,
            Err(_) => unreachable!("an extension is stored under its own type's id"),
        }
    }

    /// This shard's `T`, if something made it.
    pub fn get<T: 'static>(&self) -> Option<Rc<T>> {
        let slot = self.0.borrow().get(&TypeId::of::<T>())?.clone();
        slot.downcast::<T>().ok()
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

/// Answers a partition request with an error.
pub fn reply_error(request: PartitionRequest, err: WireError) {
    match request {
        PartitionRequest::Produce { reply, .. } => reply.send(Err(err)),
        PartitionRequest::Fetch { reply, .. } => reply.send(Err(err)),
        PartitionRequest::ReplicaFetch { reply, .. } => reply.send(Err(err)),
        PartitionRequest::ListOffsets { reply, .. } => reply.send(Err(err)),
        PartitionRequest::Describe { reply } => reply.send(Err(err)),
        PartitionRequest::Call(call) => call.fail(err),
    }
}

/// The wire error for a storage error.
pub fn storage_error(e: StorageError) -> WireError {
    use strand_storage::BatchError;
    let code = match &e {
        StorageError::InvalidBatch(BatchError::TooLarge { .. }) => ErrorCode::MessageTooLarge,
        StorageError::InvalidBatch(_) => ErrorCode::CorruptBatch,
        StorageError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
        e if e.is_no_space() => ErrorCode::StorageFull,
        // The replica closed under the request (it moved away, or its
        // queue changed): the client asks the leader again.
        StorageError::Closed => ErrorCode::NotLeader,
        _ => ErrorCode::StorageError,
    };
    WireError::new(code, e.to_string())
}

/// A mesh of `shards` peers for `ShardMessage`s.
pub type Mesh = glommio::channels::channel_mesh::MeshBuilder<ShardMessage, Full>;
