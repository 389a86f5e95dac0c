//! Fetch: whole record batches below each partition's high watermark, with
//! long polling — the answer waits until `min_bytes` are there or
//! `max_wait_ms` has passed. Batches go into the response's tail as they
//! came from the log (no copy).
//!
//! A wait is woken by new data on this shard's partitions; partitions of
//! other shards are looked at again every 10 ms while waiting.

use std::rc::Rc;
use std::time::{Duration, Instant};

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{ask, error_table, request, respond};
use crate::server::messages::{Fetched, PartitionRequest, WireError};
use crate::server::shard::Shard;

/// Longest long poll accepted.
const MAX_WAIT_CAP: Duration = Duration::from_secs(30);
/// How often other shards' partitions are looked at while waiting.
const REMOTE_RECHECK: Duration = Duration::from_millis(10);

struct Want {
    queue: String,
    partition: u32,
    offset: u64,
    max_bytes: u32,
}

pub async fn handle(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let (wants, max_wait, min_bytes, max_bytes) = {
        let req = request::<FetchRequest>(body)?;
        let mut wants = Vec::new();
        for q in req.queues().iter().flatten() {
            let queue = q.name().unwrap_or_default().to_string();
            for p in q.partitions().iter().flatten() {
                wants.push(Want {
                    queue: queue.clone(),
                    partition: p.partition(),
                    offset: p.offset(),
                    max_bytes: p.max_bytes(),
                });
            }
        }
        (
            wants,
            Duration::from_millis(u64::from(req.max_wait_ms())).min(MAX_WAIT_CAP),
            req.min_bytes() as usize,
            req.max_bytes() as usize,
        )
    };
    super::check_entries(wants.len())?;
    // Nothing may ask for more than a frame can carry back.
    let frame_room = (shard.config.max_frame_bytes as usize)
        .saturating_sub(1 << 20)
        .max(1 << 20);
    let max_bytes = max_bytes.min(frame_room);
    let min_bytes = min_bytes.min(max_bytes);
    let wants: Vec<Want> = wants
        .into_iter()
        .map(|w| Want {
            max_bytes: w.max_bytes.min(max_bytes as u32),
            ..w
        })
        .collect();
    let deadline = Instant::now() + max_wait;
    let all_local = wants.iter().all(|w| shard.owner(&w.queue, w.partition) == shard.id);
    let results = loop {
        let seen = shard.partitions.new_data.epoch();
        let results = fetch_all(shard, &wants).await;
        let total: usize = results.iter().map(|r| r.as_ref().map_or(0, |f| f.read.bytes)).sum();
        let failed = results.iter().any(|r| r.is_err());
        let now = Instant::now();
        if total >= min_bytes || failed || now >= deadline || shard.stopping.get() {
            break results;
        }
        let mut wait = deadline - now;
        if !all_local {
            wait = wait.min(REMOTE_RECHECK);
        }
        let _ = glommio::timer::timeout(wait, async {
            shard.partitions.new_data.wait(seen).await;
            Ok(())
        })
        .await;
    };
    let mut fbb = FlatBufferBuilder::new();
    let mut tail = TailBuilder::default();
    let mut queues = Vec::new();
    let mut i = 0;
    while i < wants.len() {
        let queue = &wants[i].queue;
        let mut entries = Vec::new();
        while i < wants.len() && &wants[i].queue == queue {
            let r = &results[i];
            let error = error_table(&mut fbb, r.as_ref().err());
            let fetched = r.as_ref().ok();
            let start = tail.len() as u32;
            // The first partition always gets its data; later ones only
            // within the request's byte budget.
            if let Some(f) = fetched {
                if tail.is_empty() || tail.len() + f.read.bytes <= max_bytes {
                    for b in &f.read.batches {
                        tail.push(b.clone());
                    }
                }
            }
            // Only data counts: a fetch naming a queue that does not exist
            // must not add a series (the counter map stays bounded by the
            // queues that exist).
            if tail.len() > start as usize {
                shard.metrics.fetched(queue, tail.len() - start as usize);
            }
            entries.push(FetchPartitionResult::create(
                &mut fbb,
                &FetchPartitionResultArgs {
                    partition: wants[i].partition,
                    error,
                    high_watermark: fetched.map_or(0, |f| f.high_watermark),
                    log_start: fetched.map_or(0, |f| f.log_start),
                    records_offset: start,
                    records_len: tail.len() as u32 - start,
                },
            ));
            i += 1;
        }
        let entries = fbb.create_vector(&entries);
        let name = fbb.create_string(queue);
        queues.push(FetchQueueResult::create(
            &mut fbb,
            &FetchQueueResultArgs {
                name: Some(name),
                partitions: Some(entries),
            },
        ));
    }
    let queues = fbb.create_vector(&queues);
    let root = FetchResponse::create(
        &mut fbb,
        &FetchResponseArgs {
            error: None,
            queues: Some(queues),
        },
    );
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, tail))
}

async fn fetch_all(shard: &Rc<Shard>, wants: &[Want]) -> Vec<Result<Fetched, WireError>> {
    let mut tasks = Vec::new();
    for w in wants {
        let (shard, queue, partition, offset, max_bytes) =
            (shard.clone(), w.queue.clone(), w.partition, w.offset, w.max_bytes);
        tasks.push(glommio::spawn_local(async move {
            ask(&shard, queue, partition, |reply| PartitionRequest::Fetch {
                offset,
                max_bytes,
                reply,
            })
            .await
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await);
    }
    out
}
