//! DescribeQueue: a queue's settings and each partition's offsets and size.
//!
//! The partitions this node leads are asked of their shards; those led by
//! other nodes are asked of those nodes (one `DescribeQueue` each with
//! `only_led_here`, on the peer links: `crate::router::call_node`), so any
//! node describes the whole queue. An offline partition (no leader) is
//! shown with leader 0 and zero figures.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use strand_net::frame::FrameHeader;
use strand_net::message::{read_body, TailBuilder};
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{config_table, error_from_table, queue_name, request, respond};
use crate::controller::NodeId;
use crate::router::{ask, call_node};
use crate::shard::messages::{PartitionRequest, PartitionStats, WireError};
use crate::shard::Shard;

/// How long another node may take to describe its partitions.
const NODE_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn handle(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let req = request::<DescribeQueueRequest>(body)?;
    let only_led_here = req.only_led_here();
    let name = queue_name(req.name())?;
    let table = shard.table();
    let queue = table
        .queue(&name)
        .ok_or_else(|| WireError::new(ErrorCode::UnknownQueue, format!("queue {name:?} does not exist")))?;
    let me = shard.config.node_id;
    let mut local = Vec::new();
    let mut offline = Vec::new();
    let mut elsewhere: BTreeMap<NodeId, Vec<u32>> = BTreeMap::new();
    for (p, record) in queue.partitions.iter().enumerate() {
        let p = p as u32;
        if record.leader == crate::controller::NO_LEADER {
            // Offline: shown with leader 0 and no figures (its replicas,
            // ISR and epoch are what an operator needs now).
            offline.push(p);
            continue;
        }
        if record.leader == me {
            let (shard, name) = (shard.clone(), name.clone());
            local.push((
                p,
                glommio::spawn_local(async move {
                    ask(&shard, name, p, |reply| PartitionRequest::Describe { reply }).await
                }),
            ));
        } else if !only_led_here {
            elsewhere.entry(record.leader).or_default().push(p);
        }
    }
    let remote: Vec<_> = elsewhere
        .into_iter()
        .map(|(node, wanted)| {
            let (shard, name) = (shard.clone(), name.clone());
            glommio::spawn_local(async move { describe_on(&shard, node, &name, &wanted).await })
        })
        .collect();
    // A partition that cannot answer (overloaded, not open, its node
    // unreachable) fails the whole describe with its error rather than
    // showing zeros.
    let mut stats: BTreeMap<u32, PartitionStats> = BTreeMap::new();
    for (p, t) in local {
        stats.insert(p, t.await?);
    }
    for t in remote {
        stats.extend(t.await?);
    }
    if !only_led_here {
        stats.extend(offline.into_iter().map(|p| (p, PartitionStats::default())));
    }
    let mut fbb = FlatBufferBuilder::new();
    let parts: Vec<_> = stats
        .iter()
        .map(|(p, s)| {
            let record = &queue.partitions[*p as usize];
            let ids = |v: &[NodeId]| v.iter().map(|id| *id as u32).collect::<Vec<u32>>();
            let replicas = fbb.create_vector(&ids(&record.replicas));
            let isr = fbb.create_vector(&ids(&record.isr));
            PartitionState::create(
                &mut fbb,
                &PartitionStateArgs {
                    partition: *p,
                    leader: record.leader as u32,
                    log_start: s.log_start,
                    log_end: s.log_end,
                    high_watermark: s.high_watermark,
                    stored_bytes: s.stored_bytes,
                    segments: s.segments,
                    replicas: Some(replicas),
                    isr: Some(isr),
                    leader_epoch: record.leader_epoch,
                    lost_replica: record.lost.map(|l| l.broker as u32),
                },
            )
        })
        .collect();
    let parts = fbb.create_vector(&parts);
    let config = config_table(&mut fbb, &queue.settings);
    let name = fbb.create_string(&name);
    let root = DescribeQueueResponse::create(
        &mut fbb,
        &DescribeQueueResponseArgs {
            error: None,
            name: Some(name),
            config: Some(config),
            partitions: Some(parts),
        },
    );
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}

/// The state of partitions `wanted` of queue `name`, from `node`, which
/// leads them (as this node's table says).
async fn describe_on(
    shard: &Shard,
    node: NodeId,
    name: &str,
    wanted: &[u32],
) -> Result<Vec<(u32, PartitionStats)>, WireError> {
    let mut fbb = FlatBufferBuilder::new();
    let n = fbb.create_string(name);
    let root = DescribeQueueRequest::create(
        &mut fbb,
        &DescribeQueueRequestArgs {
            name: Some(n),
            only_led_here: true,
        },
    );
    fbb.finish_minimal(root);
    // The node may not have applied the queue's creation yet: it gets until
    // the deadline to catch up.
    let deadline = std::time::Instant::now() + NODE_TIMEOUT;
    let answered = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let frame = call_node(
            shard,
            node,
            Api::DescribeQueue,
            fbb.finished_data(),
            TailBuilder::default(),
            left,
        )
        .await?;
        let resp = read_body::<DescribeQueueResponse>(&frame.body).map_err(|e| {
            WireError::new(
                ErrorCode::Internal,
                format!("node {node} answered the describe with a malformed response: {e}"),
            )
        })?;
        match error_from_table(resp.error()) {
            Some(e) if e.code == ErrorCode::UnknownQueue && std::time::Instant::now() < deadline => {
                glommio::timer::sleep(Duration::from_millis(50)).await
            }
            Some(e) => return Err(e),
            None => break stats_of(&resp),
        }
    };
    wanted
        .iter()
        .map(|p| {
            answered.get(p).map(|s| (*p, s.clone())).ok_or_else(|| {
                WireError::new(
                    ErrorCode::NotLeader,
                    format!("node {node} no longer leads partition {p} of {name}; retry"),
                )
            })
        })
        .collect()
}

/// Each partition's figures in a DescribeQueue answer.
fn stats_of(resp: &DescribeQueueResponse<'_>) -> BTreeMap<u32, PartitionStats> {
    resp.partitions()
        .iter()
        .flatten()
        .map(|p| {
            (
                p.partition(),
                PartitionStats {
                    log_start: p.log_start(),
                    log_end: p.log_end(),
                    high_watermark: p.high_watermark(),
                    stored_bytes: p.stored_bytes(),
                    segments: p.segments(),
                },
            )
        })
        .collect()
}
