//! DescribeQueue: a queue's settings and each partition's offsets and size.

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{config_table, queue_name, request, respond};
use crate::router::ask;
use crate::shard::messages::{PartitionRequest, PartitionStats, WireError};
use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let name = queue_name(request::<DescribeQueueRequest>(body)?.name())?;
    let table = shard.table();
    let queue = table
        .queue(&name)
        .ok_or_else(|| WireError::new(ErrorCode::UnknownQueue, format!("queue {name:?} does not exist")))?;
    let mut tasks = Vec::new();
    for p in 0..queue.partitions.len() as u32 {
        let (shard, name) = (shard.clone(), name.clone());
        tasks.push(glommio::spawn_local(async move {
            ask(&shard, name, p, |reply| PartitionRequest::Describe { reply }).await
        }));
    }
    let mut stats = Vec::new();
    for t in tasks {
        // A partition that cannot answer (overloaded, not open) fails the
        // whole describe with its error rather than showing zeros.
        stats.push(t.await?);
    }
    let mut fbb = FlatBufferBuilder::new();
    let parts: Vec<_> = stats
        .iter()
        .enumerate()
        .map(|(i, s): (usize, &PartitionStats)| {
            PartitionState::create(
                &mut fbb,
                &PartitionStateArgs {
                    partition: i as u32,
                    leader: queue.partitions[i].leader as u32,
                    log_start: s.log_start,
                    log_end: s.log_end,
                    high_watermark: s.high_watermark,
                    stored_bytes: s.stored_bytes,
                    segments: s.segments,
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
