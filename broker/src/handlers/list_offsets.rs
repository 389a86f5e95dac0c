//! ListOffsets: the earliest offset, the latest (the high watermark), or
//! the first offset at or after a timestamp, per partition.

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{error_table, request, respond};
use crate::router::ask;
use crate::shard::messages::{OffsetQuery, PartitionRequest, WireError};
use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let mut wants = Vec::new();
    {
        let req = request::<ListOffsetsRequest>(body)?;
        super::check_entries(super::partitions_named!(req))?;
        for q in req.queues().iter().flatten() {
            let queue = super::named_queue(q.name())?;
            for p in q.partitions().iter().flatten() {
                let query = match p.spec() {
                    OffsetSpec::Earliest => OffsetQuery::Earliest,
                    OffsetSpec::Latest => OffsetQuery::Latest,
                    OffsetSpec::Timestamp => OffsetQuery::Timestamp(p.timestamp_ms()),
                    other => {
                        return Err(WireError::new(
                            ErrorCode::InvalidRequest,
                            format!("unknown offset spec {}", other.0),
                        ))
                    }
                };
                wants.push((queue.clone(), p.partition(), query));
            }
        }
    }
    let mut tasks = Vec::new();
    for (queue, partition, query) in &wants {
        let (shard, queue, partition, query) = (shard.clone(), queue.clone(), *partition, *query);
        tasks.push(glommio::spawn_local(async move {
            ask(&shard, queue, partition, |reply| PartitionRequest::ListOffsets {
                query,
                reply,
            })
            .await
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await);
    }
    let mut fbb = FlatBufferBuilder::new();
    let mut queues = Vec::new();
    let mut i = 0;
    while i < wants.len() {
        let queue = wants[i].0.clone();
        let mut entries = Vec::new();
        while i < wants.len() && wants[i].0 == queue {
            let r: &Result<(u64, bool), WireError> = &results[i];
            let error = error_table(&mut fbb, r.as_ref().err());
            let (offset, found) = r.as_ref().ok().copied().unwrap_or((0, false));
            entries.push(ListOffsetsPartitionResult::create(
                &mut fbb,
                &ListOffsetsPartitionResultArgs {
                    partition: wants[i].1,
                    error,
                    offset,
                    found,
                },
            ));
            i += 1;
        }
        let entries = fbb.create_vector(&entries);
        let name = fbb.create_string(&queue);
        queues.push(ListOffsetsQueueResult::create(
            &mut fbb,
            &ListOffsetsQueueResultArgs {
                name: Some(name),
                partitions: Some(entries),
            },
        ));
    }
    let queues = fbb.create_vector(&queues);
    let root = ListOffsetsResponse::create(
        &mut fbb,
        &ListOffsetsResponseArgs {
            error: None,
            queues: Some(queues),
        },
    );
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}
