//! Produce: append record batches to partitions (on their owning shards, in
//! parallel) and answer once each is stored per acks and the queue's fsync
//! policy. acks=0 gets no answer.

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::{split_tail, TailBuilder};
use strand_net::{FrameMut, OutFrame};
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{error_table, request, respond};
use crate::router::ask;
use crate::shard::messages::{PartitionRequest, Produced, WireError};
use crate::shard::Shard;

struct Part {
    queue: String,
    partition: u32,
    offset: u32,
    len: u32,
}

pub async fn handle(shard: &Rc<Shard>, header: FrameHeader, frame: FrameMut) -> Result<Option<OutFrame>, WireError> {
    let (acks, timeout_ms, parts) = {
        let req = request::<ProduceRequest>(&frame.body)?;
        let acks = req.acks();
        let timeout_ms = req.timeout_ms();
        if !(-1..=1).contains(&acks) {
            return Err(WireError::new(
                ErrorCode::InvalidRequest,
                format!("acks must be -1, 0 or 1, not {acks}"),
            ));
        }
        let mut parts = Vec::new();
        for q in req.queues().iter().flatten() {
            let queue = q.name().unwrap_or_default().to_string();
            for p in q.partitions().iter().flatten() {
                parts.push(Part {
                    queue: queue.clone(),
                    partition: p.partition(),
                    offset: p.records_offset(),
                    len: p.records_len(),
                });
            }
        }
        (acks, timeout_ms, parts)
    };
    super::check_entries(parts.len())?;
    // Split the tail into each partition's batches, uniquely owned (no copy).
    // The pieces must tile the tail exactly: a batch kept in memory then
    // pins only bytes that are batches.
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by_key(|&i| parts[i].offset);
    let slices: Vec<(u32, u32)> = order.iter().map(|&i| (parts[i].offset, parts[i].len)).collect();
    let tiled = slices.iter().try_fold(0u64, |at, &(offset, len)| {
        (u64::from(offset) == at).then_some(at + u64::from(len))
    });
    if tiled != Some(frame.tail.len() as u64) {
        return Err(WireError::new(
            ErrorCode::InvalidRequest,
            "record slices must cover the frame's tail exactly, without gaps or overlaps",
        ));
    }
    let pieces = split_tail(frame.tail, &slices).map_err(|e| WireError::new(e.code(), e.to_string()))?;
    let mut records: Vec<Option<bytes::BytesMut>> = (0..parts.len()).map(|_| None).collect();
    for (i, piece) in order.into_iter().zip(pieces) {
        records[i] = Some(piece);
    }
    let ask_one = |shard: Rc<Shard>, queue: String, partition: u32, records: Option<bytes::BytesMut>| async move {
        if crate::groups::is_internal(&queue) {
            return Err(WireError::new(
                ErrorCode::InvalidQueueName,
                format!("{queue:?} is one of the broker's own queues: clients cannot write to it"),
            ));
        }
        let records = records.unwrap_or_default();
        ask(&shard, queue, partition, |reply| PartitionRequest::Produce {
            records,
            acks,
            timeout_ms,
            reply,
        })
        .await
    };
    // A task per partition, for one partition too: the requests of a
    // connection start in the order they came (a task each), and their
    // partitions' appends must keep that order (a partition's next batch
    // may come in the next request). Had a lone partition been appended
    // inline, it would have overtaken the partitions an earlier request
    // handed to tasks: an idempotent producer's batch refused as out of
    // order, records reordered without idempotence.
    let tasks: Vec<_> = parts
        .iter()
        .zip(records)
        .map(|(part, records)| {
            glommio::spawn_local(ask_one(shard.clone(), part.queue.clone(), part.partition, records))
        })
        .collect();
    let mut results: Vec<Result<Produced, WireError>> = Vec::with_capacity(tasks.len());
    for t in tasks {
        results.push(t.await);
    }
    // Counted per queue entry of the request (its parts are consecutive, as
    // the response groups them): linear, no allocation.
    let mut k = 0;
    while k < parts.len() {
        let queue = &parts[k].queue;
        let (mut bytes, mut appended) = (0usize, false);
        while k < parts.len() && &parts[k].queue == queue {
            if let Ok(produced) = &results[k] {
                bytes += produced.stored_bytes;
                appended = true;
            }
            k += 1;
        }
        if appended {
            shard.metrics.produced(queue, bytes);
        }
    }
    if acks == 0 {
        return Ok(None);
    }
    let mut fbb = FlatBufferBuilder::new();
    let mut queues = Vec::new();
    let mut i = 0;
    while i < parts.len() {
        let queue = &parts[i].queue;
        let mut entries = Vec::new();
        while i < parts.len() && &parts[i].queue == queue {
            let r = &results[i];
            let error = error_table(&mut fbb, r.as_ref().err());
            let ok = r.as_ref().ok().cloned().unwrap_or_default();
            entries.push(ProducePartitionResult::create(
                &mut fbb,
                &ProducePartitionResultArgs {
                    partition: parts[i].partition,
                    error,
                    base_offset: ok.base_offset,
                    last_offset: ok.last_offset,
                    log_append_time_ms: ok.log_append_time_ms,
                    log_start: ok.log_start,
                },
            ));
            i += 1;
        }
        let entries = fbb.create_vector(&entries);
        let name = fbb.create_string(queue);
        queues.push(ProduceQueueResult::create(
            &mut fbb,
            &ProduceQueueResultArgs {
                name: Some(name),
                partitions: Some(entries),
            },
        ));
    }
    let queues = fbb.create_vector(&queues);
    let root = ProduceResponse::create(
        &mut fbb,
        &ProduceResponseArgs {
            error: None,
            queues: Some(queues),
        },
    );
    fbb.finish_minimal(root);
    Ok(Some(respond(header, &fbb, TailBuilder::default())))
}
