//! What shards send each other over the mesh (bounded channels): requests
//! for a partition another shard owns, proposals for the controller on
//! shard 0, and new metadata tables from shard 0. Every message carries its
//! reply channel. Record batches move as `BytesMut`/`Bytes` — ownership
//! passes, bytes are not copied.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_channel::oneshot;
use strand_wire::ErrorCode;

use crate::controller::{Command, MetadataTable, ProposeError};

/// An error to put in a response: code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> WireError {
        WireError {
            code,
            message: message.into(),
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
}

/// What a partition's owner answers to a fetch.
#[derive(Debug, Clone, Default)]
pub struct Fetched {
    pub batches: Vec<Bytes>,
    pub bytes: usize,
    pub high_watermark: u64,
    pub log_start: u64,
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

pub type Reply<T> = oneshot::Sender<Result<T, WireError>>;

/// A request for the shard that owns a partition.
#[derive(Debug)]
pub enum PartitionRequest {
    Produce {
        records: BytesMut,
        acks: i8,
        reply: Reply<Produced>,
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
        reply: oneshot::Sender<Result<(), ProposeError>>,
    },
    /// From shard 0: a new table; `applied` is answered once this shard's
    /// partitions match it.
    Metadata {
        table: Arc<MetadataTable>,
        applied: oneshot::Sender<()>,
    },
}
