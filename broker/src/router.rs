//! The router: reaching the owner of a partition, or the controller, from
//! any shard. Handlers, the group coordinator and whatever comes next ask
//! here; none of them knows where the owner runs.
//!
//! Runs on: the asking shard. Where the owner is:
//! - this shard: served in place ([`Shard::serve_partition`]);
//! - another shard of this node: sent over the bounded mesh (`try_send`: a
//!   full queue is an `Overloaded` answer, never a blocked reactor), and
//!   the reply comes back over the mesh to this shard
//!   (`crate::shard::messages`);
//! - another node: a request about a partition another node leads is sent
//!   there on this shard's peer link ([`call_node`]: the node's address from
//!   the table, the same frames, a deadline). The queue's describe gathers
//!   its partitions' state this way, and the group coordinator reads and
//!   writes data partitions through `leaders.rs`; a client's produce
//!   and fetch are answered `NotLeader` by the owning shard, and the client
//!   goes to the leader.
//!
//! Controller proposals go to shard 0, where the controller member runs
//! (it forwards them to the controller leader on another node if need be),
//! and resolve once every shard of this node applied the result; other
//! nodes' controller messages go to shard 0 too ([`controller_rpc`]).

use std::rc::Rc;
use std::time::Duration;

use strand_net::message::TailBuilder;
use strand_net::Frame;
use strand_wire::{Api, ErrorCode};

use crate::controller::network::Refusal;
use crate::controller::NodeId;
use crate::routing::ShardId;
use crate::shard::messages::{Answer, PartitionRequest, Reply, ShardMessage, WireError};
use crate::shard::{reply_error, Shard};

/// Sends a partition request to its owner and waits for the answer.
pub async fn ask<T: Send + 'static>(
    shard: &Rc<Shard>,
    queue: String,
    partition: u32,
    make: impl FnOnce(Reply<T>) -> PartitionRequest,
) -> Result<T, WireError> {
    let (tx, rx) = Answer::channel(shard.id.0);
    let owner = shard.owner(&queue, partition);
    // Counted while the owner has it.
    let _forwarded = (owner != shard.id).then(|| shard.metrics.forwarding());
    route(shard, owner, queue, partition, make(tx)).await;
    rx.await.unwrap_or_else(|_| {
        Err(WireError::new(
            ErrorCode::Internal,
            "the broker dropped the request (it is shutting down?); retry",
        ))
    })
}

/// Serves `request` here if this shard is `owner` (the partition's, from
/// [`Shard::owner`]), else forwards it there; the request's own answer
/// carries the result (or the reason it was not delivered).
pub async fn route(shard: &Rc<Shard>, owner: ShardId, queue: String, partition: u32, request: PartitionRequest) {
    if owner == shard.id {
        shard.serve_partition(&queue, partition, request).await;
        return;
    }
    let msg = ShardMessage::Partition {
        queue,
        partition,
        request,
    };
    if let Err(e) = shard.peers.try_send_to(usize::from(owner.0), msg) {
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

/// Hands another node's controller message to the controller member on
/// shard 0 (here, or over the mesh) and returns its answer.
pub async fn controller_rpc(
    shard: &Shard,
    op: strand_wire::ControllerOp,
    payload: Vec<u8>,
    caller: Option<NodeId>,
) -> Result<Vec<u8>, Refusal> {
    let unavailable = |message: &str| {
        Err(Refusal {
            code: ErrorCode::ControllerUnavailable,
            message: message.to_string(),
            leader: 0,
        })
    };
    if shard.id.0 == 0 {
        let controller = shard.controller.borrow().clone();
        return match controller {
            Some(c) => c.serve(op, &payload, caller).await,
            None => unavailable("the controller member is not running here yet"),
        };
    }
    let make = |reply| ShardMessage::ControllerRpc {
        op,
        payload,
        caller,
        reply,
    };
    shard.ask_shard_0(make, unavailable).await
}

/// Sends a request (`api`, a finished flatbuffer `body` and its `tail`) to
/// node `node` on this shard's peer link and waits for its answer, at most
/// `timeout`. The node's address is the one it registered in the table.
pub async fn call_node(
    shard: &Shard,
    node: NodeId,
    api: Api,
    body: &[u8],
    tail: TailBuilder,
    timeout: Duration,
) -> Result<Frame, WireError> {
    let address = shard.table().brokers.get(&node).map(|b| b.address.clone());
    let addr = address
        .as_deref()
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .ok_or_else(|| {
            WireError::new(
                ErrorCode::BrokerUnavailable,
                format!("node {node} has no address in the metadata; retry"),
            )
        })?;
    shard.nodes.get(addr).call(api, body, tail, timeout).await.map_err(|e| {
        let code = match e {
            crate::peer::PeerError::Timeout { .. } => ErrorCode::Timeout,
            crate::peer::PeerError::Unreachable { .. } => ErrorCode::BrokerUnavailable,
        };
        WireError::new(code, format!("node {node}: {e}; retry"))
    })
}
