//! Receiving what the other shards of this node send over the mesh
//! (`crate::shard::messages::ShardMessage`) and handing each message to
//! the layer that serves it: partition requests to the shard, proposals to
//! the controller member (shard 0), tables to the shard, metrics scrapes,
//! and client connections another shard accepted for this one.
//!
//! Runs on: every shard, one receiving task per other shard.

use std::rc::Rc;

use glommio::channels::channel_mesh::Receivers;

use crate::shard::messages::{Deferred, ShardMessage};
use crate::shard::Shard;

/// Serves messages from other shards until they all hang up.
pub fn start_receivers(shard: &Rc<Shard>, receivers: Receivers<ShardMessage>) {
    let receivers = Rc::new(receivers);
    for peer in 0..usize::from(shard.shards) {
        if peer == usize::from(shard.id.0) {
            continue;
        }
        let (shard, receivers) = (shard.clone(), receivers.clone());
        glommio::spawn_local(async move {
            while let Ok(Some(msg)) = receivers.recv_from(peer).await {
                // A reply only completes a channel: no task for it.
                if let ShardMessage::Run(Deferred(work)) = msg {
                    work();
                    continue;
                }
                shard.requests_seen.set(shard.requests_seen.get() + 1);
                let shard = shard.clone();
                glommio::spawn_local(async move { on_message(shard, msg).await }).detach();
            }
        })
        .detach();
    }
}

async fn on_message(shard: Rc<Shard>, msg: ShardMessage) {
    match msg {
        ShardMessage::Partition {
            queue,
            partition,
            request,
        } => shard.serve_partition(&queue, partition, request).await,
        ShardMessage::Propose { command, reply } => {
            reply.send(shard.commit_proposal(command).await);
        }
        ShardMessage::ControllerRpc {
            op,
            payload,
            caller,
            reply,
        } => {
            reply.send(crate::router::controller_rpc(&shard, op, payload, caller).await);
        }
        ShardMessage::Run(Deferred(work)) => work(), // (run by the receiver)
        ShardMessage::Metadata { table, applied } => {
            shard.apply_table(table).await;
            applied.send(());
        }
        ShardMessage::Stats { reply } => reply.send(super::metrics_http::snapshot(&shard)),
        ShardMessage::Connection(fd, slot) => super::connection::adopt(shard, fd, slot).await,
    }
}
