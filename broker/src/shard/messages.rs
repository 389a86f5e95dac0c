//! What shards send each other over the mesh (bounded channels): requests
//! for a partition another shard owns, proposals for the controller on
//! shard 0, new metadata tables from shard 0, and replies. The server
//! receives them (`server::mesh`). Every request
//! carries an [`Answer`] for its reply. Record batches move as
//! `BytesMut`/`Bytes` — ownership passes, bytes are not copied.
//!
//! Replies come back over the mesh too (DESIGN.md §5: "the reply comes back
//! the same way"), never by waking the waiting task from the answering
//! shard's thread: glommio 0.9's cross-thread ("foreign") wake path
//! deadlocked a shard under load here — it blocked forever inside
//! `SleepNotifier::queue_waker` while processing foreign wakes, and with it
//! every connection and partition of that shard. An [`Answer`] completed on
//! another shard is shipped to the waiting shard as a closure that runs
//! there, so every wake is a local one.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use bytes::BytesMut;
use futures_channel::oneshot;
use strand_storage::log::ReadBatches;
use strand_wire::ErrorCode;

use super::partitions::Partition;
use super::Shard;
use crate::controller::{Command, MetadataTable, NodeId, ProposeError};

/// An error to put in a response: code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
    /// With `NotLeader`: the partition's leader as this broker knows it
    /// (node, leader epoch), so the client can go there without asking
    /// for metadata first.
    pub leader: Option<(NodeId, u32)>,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> WireError {
        WireError {
            code,
            message: message.into(),
            leader: None,
        }
    }

    /// `NotLeader`, naming the leader `node` of `leader_epoch` (unless it
    /// is [`crate::controller::NO_LEADER`]).
    pub fn not_leader(message: impl Into<String>, node: NodeId, leader_epoch: u32) -> WireError {
        WireError {
            leader: (node != crate::controller::NO_LEADER).then_some((node, leader_epoch)),
            ..WireError::new(ErrorCode::NotLeader, message)
        }
    }
}

/// What a partition's owner answers to a produce.
#[derive(Debug, Clone, Default)]
pub struct Produced {
    pub base_offset: u64,
    pub last_offset: u64,
    pub log_append_time_ms: i64,
    pub log_start: u64,
    /// Bytes appended (an idempotent producer's resend of a stored batch
    /// appends none).
    pub stored_bytes: usize,
}

/// What a partition's owner answers to a fetch.
#[derive(Debug, Clone, Default)]
pub struct Fetched {
    /// The batches (`read.detach()` before they leave the shard that read
    /// them).
    pub read: ReadBatches,
    pub high_watermark: u64,
    pub log_start: u64,
}

/// A follower's fetch of one partition from its leader
/// (`replication.rs`; the wire's `ReplicaFetchPartition`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWant {
    /// The queue's id as the follower knows it (0: not said).
    pub queue_id: u64,
    /// The fetching follower.
    pub replica: NodeId,
    /// The leader epoch the follower is in.
    pub leader_epoch: u32,
    /// The follower's log end.
    pub fetch_offset: u64,
    /// The epoch of its last batch (`None`: its log holds none).
    pub last_epoch: Option<u32>,
    /// Its fdatasync'd offset.
    pub flushed_offset: u64,
    pub max_bytes: u32,
}

/// What a leader answers a follower's fetch: records from the fetch offset
/// (as stored, below the log end), or where the follower's last epoch ends
/// here if its log diverged (no records then).
#[derive(Debug, Clone, Default)]
pub struct ReplicaFetched {
    pub fetched: Fetched,
    /// `(epoch, end offset)` on a diverged log.
    pub diverging: Option<(u32, u64)>,
}

/// A partition's offsets and size, for DescribeQueue.
#[derive(Debug, Clone, Default)]
pub struct PartitionStats {
    pub log_start: u64,
    pub log_end: u64,
    pub high_watermark: u64,
    pub stored_bytes: u64,
    pub segments: u32,
}

/// Which offset ListOffsets asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetQuery {
    Earliest,
    Latest,
    Timestamp(i64),
}

/// The way back for one reply: completed on the shard that waits for it.
pub struct Answer<V: Send + 'static> {
    tx: Option<oneshot::Sender<V>>,
    /// The shard whose task awaits the receiver.
    origin: u16,
}

impl<V: Send + 'static> std::fmt::Debug for Answer<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Answer(to shard {})", self.origin)
    }
}

impl<V: Send + 'static> Answer<V> {
    /// An answer to be awaited on shard `origin` (the caller's shard).
    pub fn channel(origin: u16) -> (Answer<V>, oneshot::Receiver<V>) {
        let (tx, rx) = oneshot::channel();
        (Answer { tx: Some(tx), origin }, rx)
    }

    /// The shard the answer goes to.
    pub fn origin(&self) -> u16 {
        self.origin
    }

    /// Completes it: at once on the origin shard, else over the mesh.
    pub fn send(mut self, value: V) {
        if let Some(tx) = self.tx.take() {
            run_on_shard(self.origin, Box::new(move || drop(tx.send(value))));
        }
    }
}

impl<V: Send + 'static> Drop for Answer<V> {
    /// Dropped unanswered: the waiter learns it on its own shard too.
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            run_on_shard(self.origin, Box::new(move || drop(tx)));
        }
    }
}

/// Work for the shard it is sent to (completing an [`Answer`]).
pub struct Deferred(pub Box<dyn FnOnce() + Send>);

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deferred")
    }
}

fn run_on_shard(origin: u16, work: Box<dyn FnOnce() + Send>) {
    super::run_on_shard(origin, Deferred(work));
}

/// A partition request's reply.
pub type Reply<T> = Answer<Result<T, WireError>>;

/// A request for the shard that owns a partition.
#[derive(Debug)]
pub enum PartitionRequest {
    Produce {
        records: BytesMut,
        acks: i8,
        /// How long an acks=all produce may wait for the in-sync replicas.
        timeout_ms: u32,
        reply: Reply<Produced>,
    },
    /// A follower's fetch (served by the leader only).
    ReplicaFetch {
        want: ReplicaWant,
        reply: Reply<ReplicaFetched>,
    },
    Fetch {
        offset: u64,
        max_bytes: u32,
        reply: Reply<Fetched>,
    },
    ListOffsets {
        query: OffsetQuery,
        reply: Reply<(u64, bool)>,
    },
    Describe {
        reply: Reply<PartitionStats>,
    },
    /// Work of a layer above the shard, done where the partition is open:
    /// a consumer-group request for its `__groups` partition, which the
    /// coordinator serves (`groups`).
    Call(Box<dyn PartitionCall>),
}

/// A task that stays on its shard.
pub type LocalTask = Pin<Box<dyn Future<Output = ()>>>;

/// A partition open on the shard that owns it, and that shard.
pub struct OpenPartition {
    pub shard: Rc<Shard>,
    pub queue: String,
    pub partition: u32,
    pub part: Rc<Partition>,
}

/// Work that a layer above the shard does on the shard that owns a
/// partition (the group coordinator's requests travel to their
/// `__groups` partition like any partition request): routed and served
/// like the others, without the shard knowing what it is.
pub trait PartitionCall: Send + std::fmt::Debug {
    /// Runs on the owning shard, where the partition is open.
    fn run(self: Box<Self>, at: OpenPartition) -> LocalTask;

    /// Answers with `err` instead (the partition is not open there, or the
    /// request could not be delivered).
    fn fail(self: Box<Self>, err: WireError);
}

/// Messages between shards.
#[derive(Debug)]
pub enum ShardMessage {
    Partition {
        queue: String,
        partition: u32,
        request: PartitionRequest,
    },
    /// For shard 0: commit a controller command; the reply comes once every
    /// shard has applied the resulting table.
    Propose {
        command: Command,
        reply: Answer<Result<(), ProposeError>>,
    },
    /// From shard 0: a new table; `applied` is answered once this shard's
    /// partitions match it.
    Metadata {
        table: Arc<MetadataTable>,
        applied: Answer<()>,
    },
    /// For shard 0: another node's controller message (`op` with its JSON
    /// payload) for the controller member here.
    ControllerRpc {
        op: strand_wire::ControllerOp,
        payload: Vec<u8>,
        /// The logged-in broker that sent it (`crate::auth`; none: `--auth none`).
        caller: Option<crate::controller::NodeId>,
        reply: Answer<Result<Vec<u8>, crate::controller::network::Refusal>>,
    },
    /// A reply (or other work) to run on the receiving shard.
    Run(Deferred),
    /// For the metrics endpoint: this shard's counters and gauges.
    Stats {
        reply: Answer<crate::metrics::ShardSnapshot>,
    },
    /// A client connection another shard accepted, for this shard to serve
    /// (its client port picked this shard: `strand_wire::shard_for_port`).
    /// Dropping the message closes the socket and gives its place among
    /// the node's connections back.
    Connection(std::os::fd::OwnedFd, crate::limits::ConnectionSlot),
}
