//! ReplicaFetch: a follower's fetch from the leader of its partitions
//! (between brokers; the follower's side is `crate::replication`).
//!
//! Each partition is served on its owning shard
//! (`Shard::serve_replica_fetch`): the follower's position counts toward
//! the high watermark there, and the answer is records from its log end
//! (as stored: the leader's offsets, epochs and timestamps), or where its
//! last epoch ends if its log diverged. A long poll: answered once some
//! partition has records, a diverging answer or an error, or a high
//! watermark above the one the follower knows (so followers learn it
//! within a round trip), else after `max_wait_ms`. Woken by appends on
//! this shard's partitions; other shards' are looked at again every 10 ms.

use std::rc::Rc;
use std::time::{Duration, Instant};

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{error_table, request, respond};
use crate::controller::NodeId;
use crate::router::ask;
use crate::shard::messages::{PartitionRequest, ReplicaFetched, ReplicaWant, WireError};
use crate::shard::Shard;

/// Longest long poll accepted.
const MAX_WAIT_CAP: Duration = Duration::from_secs(30);
/// How often other shards' partitions are looked at while waiting.
const REMOTE_RECHECK: Duration = Duration::from_millis(10);

pub(crate) struct Want {
    queue: String,
    partition: u32,
    pub(crate) want: ReplicaWant,
    /// The high watermark the follower knows.
    high_watermark: u64,
}

/// The partitions a ReplicaFetch body asks for and how long it may wait
/// (at most [`MAX_WAIT_CAP`]), each partition's `max_bytes` cut to its
/// share of a frame of `max_frame_bytes` so the answer fits. Pure (the
/// fuzz target `replica_fetch_body` drives it).
pub(crate) fn parse(body: &[u8], max_frame_bytes: u32) -> Result<(Vec<Want>, Duration), WireError> {
    let (wants, max_wait) = {
        let req = request::<ReplicaFetchRequest>(body)?;
        let replica = req.replica_id();
        let mut wants = Vec::new();
        super::check_entries(super::partitions_named!(req))?;
        for q in req.queues().iter().flatten() {
            let queue = super::named_queue(q.name())?;
            for p in q.partitions().iter().flatten() {
                wants.push(Want {
                    queue: queue.clone(),
                    partition: p.partition(),
                    want: ReplicaWant {
                        queue_id: q.id(),
                        replica,
                        leader_epoch: p.leader_epoch(),
                        fetch_offset: p.fetch_offset(),
                        last_epoch: u32::try_from(p.last_epoch()).ok(),
                        flushed_offset: p.flushed_offset(),
                        max_bytes: p.max_bytes(),
                    },
                    high_watermark: p.high_watermark(),
                });
            }
        }
        (
            wants,
            Duration::from_millis(u64::from(req.max_wait_ms())).min(MAX_WAIT_CAP),
        )
    };
    // The answer must fit in a frame: each partition's share of the room.
    let share = share_of(max_frame_bytes, wants.len());
    let wants: Vec<Want> = wants
        .into_iter()
        .map(|w| Want {
            want: ReplicaWant {
                max_bytes: w.want.max_bytes.min(share),
                ..w.want
            },
            ..w
        })
        .collect();
    Ok((wants, max_wait))
}

/// Each of `partitions`' share of a frame of `max_frame_bytes` (less 1 MiB
/// for the rest of the answer), at least 64 KiB.
pub(crate) fn share_of(max_frame_bytes: u32, partitions: usize) -> u32 {
    (super::frame_room(max_frame_bytes) / partitions.max(1)).max(64 << 10) as u32
}

/// Serves a follower's fetch; `caller` is the logged-in broker that sent
/// it, which must be the replica the fetch names (a fetch counts towards
/// the high watermark as that replica's).
pub async fn handle(
    shard: &Rc<Shard>,
    header: FrameHeader,
    body: &[u8],
    caller: Option<NodeId>,
) -> Result<OutFrame, WireError> {
    let (wants, max_wait) = parse(body, shard.config.max_frame_bytes)?;
    if let Some(w) = wants.first() {
        crate::auth::check_sent_by(caller, w.want.replica, "a replica fetch")?;
    }
    let deadline = Instant::now() + max_wait;
    let all_local = wants.iter().all(|w| shard.owner(&w.queue, w.partition) == shard.id);
    let results = loop {
        let seen = shard.partitions.appended.epoch();
        let hw_seen = shard.partitions.new_data.epoch();
        let results = fetch_all(shard, &wants).await;
        let news = results.iter().zip(&wants).any(|(r, w)| match r {
            Ok(f) => {
                !f.fetched.read.batches.is_empty()
                    || f.diverging.is_some()
                    || f.fetched.high_watermark > w.high_watermark
            }
            Err(_) => true,
        });
        let now = Instant::now();
        if news || now >= deadline || shard.stopping.get() {
            break results;
        }
        let mut wait = deadline - now;
        if !all_local {
            wait = wait.min(REMOTE_RECHECK);
        }
        let _ = glommio::timer::timeout(wait, async {
            futures_lite::future::or(
                shard.partitions.appended.wait(seen),
                shard.partitions.new_data.wait(hw_seen),
            )
            .await;
            Ok(())
        })
        .await;
    };
    let mut fbb = FlatBufferBuilder::new();
    let mut tail = TailBuilder::default();
    let mut queues = Vec::new();
    // The answer must fit in a frame the follower reads: each partition's
    // read holds at least one batch, whatever its share, so past the room
    // a partition's batches wait for the next fetch (the first always
    // goes: a follower behind by one large batch still gets it).
    let frame_room = super::frame_room(shard.config.max_frame_bytes);
    let answered: Vec<(&Want, &Result<ReplicaFetched, WireError>)> = wants.iter().zip(&results).collect();
    for run in answered.chunk_by(|a, b| a.0.queue == b.0.queue) {
        let mut entries = Vec::with_capacity(run.len());
        for (want, r) in run {
            let error = error_table(&mut fbb, r.as_ref().err());
            let ok = r.as_ref().ok();
            let start = tail.len() as u32;
            if let Some(f) = ok.filter(|f| tail.is_empty() || tail.len() + f.fetched.read.bytes <= frame_room) {
                for b in &f.fetched.read.batches {
                    tail.push(b.clone());
                }
            }
            let diverging = ok.and_then(|f| f.diverging);
            entries.push(ReplicaFetchPartitionResult::create(
                &mut fbb,
                &ReplicaFetchPartitionResultArgs {
                    partition: want.partition,
                    error,
                    high_watermark: ok.map_or(0, |f| f.fetched.high_watermark),
                    log_start: ok.map_or(0, |f| f.fetched.log_start),
                    diverging_epoch: diverging.map_or(-1, |(e, _)| i32::try_from(e).unwrap_or(i32::MAX)),
                    diverging_end_offset: diverging.map_or(0, |(_, o)| o),
                    records_offset: start,
                    records_len: tail.len() as u32 - start,
                },
            ));
        }
        let entries = fbb.create_vector(&entries);
        let name = fbb.create_string(&run[0].0.queue);
        queues.push(ReplicaFetchQueueResult::create(
            &mut fbb,
            &ReplicaFetchQueueResultArgs {
                name: Some(name),
                partitions: Some(entries),
            },
        ));
    }
    let queues = fbb.create_vector(&queues);
    let root = ReplicaFetchResponse::create(
        &mut fbb,
        &ReplicaFetchResponseArgs {
            error: None,
            queues: Some(queues),
        },
    );
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, tail))
}

async fn fetch_all(shard: &Rc<Shard>, wants: &[Want]) -> Vec<Result<ReplicaFetched, WireError>> {
    let asks = wants.iter().map(|w| {
        let (shard, queue, partition, want) = (shard.clone(), w.queue.clone(), w.partition, w.want);
        async move {
            ask(&shard, queue, partition, |reply| PartitionRequest::ReplicaFetch {
                want,
                reply,
            })
            .await
        }
    });
    super::all_of(asks.collect()).await
}
