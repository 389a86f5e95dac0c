//! Partition requests answered by the partition's leader, wherever it runs:
//! for work inside the broker that needs a partition it did not choose —
//! the group coordinator reading a data partition for ack mode, a group
//! describe or reset, and writing a dead letter to `<queue>.dlq` — where a
//! client would go to the leader itself.
//!
//! Runs on: the asking shard. Where the leader is, per this node's table:
//! - this node (or nowhere, or a queue this node does not know): asked of
//!   the owning shard through [`crate::router::ask`], which also gives the
//!   right refusal (`UnknownQueue`, `BrokerUnavailable` for an offline
//!   partition, `NotLeader` while it is being opened);
//! - another node: the same question as a client would put it (ListOffsets,
//!   Fetch without a long poll, Produce) on this shard's peer link
//!   ([`crate::router::call_node`]), and the answer read back; the leader's
//!   refusal keeps its code (`OffsetOutOfRange`, `NotLeader` with its hint
//!   when this node's table was behind). A leader that does not know the
//!   queue yet (this node applied its creation first: a dead-letter queue
//!   just made) is asked again for a while, then answered
//!   `BrokerUnavailable`, which callers retry.
//!
//! The answers are the ones a local ask gives: the same offsets, the same
//! whole batches below the high watermark.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use strand_client::{requests, ClientError};
use strand_net::message::TailBuilder;
use strand_wire::{Api, ErrorCode, OffsetSpec};

use crate::controller::{NodeId, NO_LEADER};
use crate::shard::messages::{Fetched, OffsetQuery, PartitionRequest, Produced, WireError};
use crate::shard::Shard;

/// How long a question to another node may take, besides an acks=all
/// produce's own wait for its replicas.
const NODE_TIMEOUT: Duration = Duration::from_secs(5);

/// Boxed: serving a partition request may serve a group request, which may
/// ask one of these (a future of unbounded size otherwise).
type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// The other node that leads `queue`/`partition` per this node's table;
/// `None` when it is led here, by nobody, or unknown here (the local ask
/// answers those).
fn elsewhere(shard: &Shard, queue: &str, partition: u32) -> Option<NodeId> {
    let table = shard.table();
    let leader = table.queue(queue)?.partitions.get(partition as usize)?.leader;
    (leader != shard.config.node_id && leader != NO_LEADER).then_some(leader)
}

/// An offset of a partition: its log start, its high watermark (the end
/// consumers see), or the first record at or after a time (and whether
/// there was one).
pub async fn list_offset(
    shard: &Rc<Shard>,
    queue: &str,
    partition: u32,
    query: OffsetQuery,
) -> Result<(u64, bool), WireError> {
    let Some(node) = elsewhere(shard, queue, partition) else {
        let asked: Boxed<'_, _> = Box::pin(crate::router::ask(shard, queue.to_string(), partition, |reply| {
            PartitionRequest::ListOffsets { query, reply }
        }));
        return asked.await;
    };
    let (spec, timestamp_ms) = match query {
        OffsetQuery::Earliest => (OffsetSpec::Earliest, 0),
        OffsetQuery::Latest => (OffsetSpec::Latest, 0),
        OffsetQuery::Timestamp(t) => (OffsetSpec::Timestamp, t),
    };
    let body = requests::list_offset(queue, partition, spec, timestamp_ms);
    let ask = Asked::new(node, queue, Api::ListOffsets, &body);
    ask.call(shard, NODE_TIMEOUT, requests::listed).await
}

/// Whole batches of a partition from the one holding `offset`, up to
/// `max_bytes` (at least one batch), below its high watermark; safe to
/// hand to another shard (see `ReadBatches::detach`).
pub async fn fetch(
    shard: &Rc<Shard>,
    queue: &str,
    partition: u32,
    offset: u64,
    max_bytes: u32,
) -> Result<Vec<Bytes>, WireError> {
    let Some(node) = elsewhere(shard, queue, partition) else {
        let asked: Boxed<'_, Result<Fetched, WireError>> =
            Box::pin(crate::router::ask(shard, queue.to_string(), partition, |reply| {
                PartitionRequest::Fetch {
                    offset,
                    max_bytes,
                    reply,
                }
            }));
        let mut fetched = asked.await?;
        fetched.read.detach();
        return Ok(fetched.read.batches);
    };
    // Answered at once: no long poll, and no chain with another fetch of
    // the partition on the same link.
    let body = requests::fetch(queue, partition, offset, max_bytes);
    let ask = Asked::new(node, queue, Api::Fetch, &body);
    ask.call(shard, NODE_TIMEOUT, |f| requests::fetched(f, queue)).await
}

/// Appends `records` (whole batches) to a partition with `acks` (-1: every
/// in-sync replica), waiting at most `timeout_ms` for the replicas.
pub async fn produce(
    shard: &Rc<Shard>,
    queue: &str,
    partition: u32,
    records: BytesMut,
    acks: i8,
    timeout_ms: u32,
) -> Result<Produced, WireError> {
    let Some(node) = elsewhere(shard, queue, partition) else {
        let asked: Boxed<'_, _> = Box::pin(crate::router::ask(shard, queue.to_string(), partition, |reply| {
            PartitionRequest::Produce {
                records,
                acks,
                timeout_ms,
                reply,
            }
        }));
        return asked.await;
    };
    let (body, tail) = requests::produce_with_timeout(queue, partition, acks, timeout_ms, records.freeze());
    let ask = Asked {
        tail,
        ..Asked::new(node, queue, Api::Produce, &body)
    };
    let wait = Duration::from_millis(u64::from(timeout_ms)) + NODE_TIMEOUT;
    let (base_offset, last_offset) = ask.call(shard, wait, requests::produced).await?;
    Ok(Produced {
        base_offset,
        last_offset,
        ..Produced::default()
    })
}

/// One question to the leader on another node.
struct Asked<'a> {
    node: NodeId,
    queue: &'a str,
    api: Api,
    body: &'a [u8],
    tail: TailBuilder,
}

impl<'a> Asked<'a> {
    fn new(node: NodeId, queue: &'a str, api: Api, body: &'a [u8]) -> Asked<'a> {
        Asked {
            node,
            queue,
            api,
            body,
            tail: TailBuilder::default(),
        }
    }

    /// Sends it (each attempt given `wait`) and reads the answer with
    /// `read`; while the leader does not know the queue yet, again every
    /// 50 ms for up to [`NODE_TIMEOUT`].
    async fn call<T>(
        &self,
        shard: &Rc<Shard>,
        wait: Duration,
        read: impl Fn(&strand_net::Frame) -> Result<T, ClientError>,
    ) -> Result<T, WireError> {
        let give_up = Instant::now() + NODE_TIMEOUT;
        loop {
            let frame =
                crate::router::call_node(shard, self.node, self.api, self.body, self.tail.clone(), wait).await?;
            match read(&frame).map_err(|e| leader_said(e, self.node)) {
                Err(e) if e.code == ErrorCode::UnknownQueue && Instant::now() < give_up => {
                    glommio::timer::sleep(Duration::from_millis(50)).await;
                }
                Err(e) if e.code == ErrorCode::UnknownQueue => {
                    return Err(WireError::new(
                        ErrorCode::BrokerUnavailable,
                        format!(
                            "node {} leads {} but has not applied its creation yet; retry",
                            self.node, self.queue
                        ),
                    ))
                }
                other => return other,
            }
        }
    }
}

/// Another node's answer as this broker's error: a refusal keeps its code,
/// message and leader hint; an answer that does not read is `Internal`.
fn leader_said(e: ClientError, node: NodeId) -> WireError {
    match e {
        ClientError::Broker { code, message, leader } => WireError {
            code: code.0,
            message: format!("node {node}: {message}"),
            leader: leader.map(|h| (NodeId::from(h.node), h.leader_epoch)),
        },
        other => WireError::new(ErrorCode::Internal, format!("node {node} answered: {other}")),
    }
}
