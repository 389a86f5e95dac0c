//! Produce: append record batches to partitions (on their owning shards, in
//! parallel) and answer once each is stored per acks and the queue's fsync
//! policy. acks=0 gets no answer.
//!
//! A connection may bring at most [`NEW_PRODUCERS_PER_PARTITION`] producer
//! ids to one partition, and [`NEW_PRODUCERS_PER_CONNECTION`] in all,
//! within [`FORGET_AFTER_MS`](strand_storage::producers::FORGET_AFTER_MS)
//! ([`NewProducers`]): a producer starts at sequence 0, so each batch at
//! sequence 0 under an id the connection has not used there lately counts.
//! Past that, the batch is refused with `TooManyProducers` before it
//! reaches the partition. Without this one connection could fill a
//! partition's producer table
//! ([`MAX_PRODUCERS`](strand_storage::producers::MAX_PRODUCERS)) with fresh
//! ids and leave every other client's new producer refused for ten minutes
//! (issue 41, item 3); now that takes 16 connections, and a logged-in
//! user's new ids also count over all its connections to the node
//! (`max_producer_ids_per_principal`, and a quarter of a partition's table
//! per partition: `crate::limits::PrincipalProducers`, issue 42). (64 per
//! partition was too few for a real client: strand-chaos's producers, which
//! take a new id after every `UnknownProducer`, met 267 refusals in 30
//! minutes of faults.)
//! `strand-client` uses one id per partition per producer, and a new one
//! only after `UnknownProducer`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strand_net::frame::FrameHeader;
use strand_net::message::{split_tail, TailBuilder};
use strand_net::{FrameMut, OutFrame};
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{error_table, request, respond};
use crate::limits::{PrincipalProducers, ProducerLimit, ProducerWindow};
use crate::router::ask;
use crate::shard::messages::{PartitionRequest, Produced, WireError};
use crate::shard::Shard;

struct Part {
    queue: String,
    partition: u32,
    offset: u32,
    len: u32,
}

/// Producer ids one connection may bring to one partition within
/// [`NEW_PRODUCERS_WINDOW`].
pub const NEW_PRODUCERS_PER_PARTITION: usize = 1024;
/// Producer ids one connection may bring to all partitions within
/// [`NEW_PRODUCERS_WINDOW`].
pub const NEW_PRODUCERS_PER_CONNECTION: usize = 16_384;
/// As long as a partition keeps an idle producer before it may forget it.
const NEW_PRODUCERS_WINDOW: Duration = Duration::from_millis(strand_storage::producers::FORGET_AFTER_MS as u64);

/// The producer ids one connection brought to each partition lately (see
/// the module doc), and who it is.
#[derive(Default)]
pub struct NewProducers {
    window: RefCell<ProducerWindow>,
    /// The node's count per principal and the user this connection logged
    /// in as (set at login; none: no user, or `--auth none`).
    principal: RefCell<Option<(Arc<PrincipalProducers>, String)>>,
}

impl NewProducers {
    /// From now on the ids this connection brings count for `user` too,
    /// in the node's `counts`.
    pub fn count_for(&self, counts: Arc<PrincipalProducers>, user: String) {
        *self.principal.borrow_mut() = Some((counts, user));
    }

    /// Whether a batch at sequence 0 of producer `id` may go to
    /// `partition` of `queue` (and, if so, it is remembered).
    fn admit(&self, queue: &str, partition: u32, id: i64, now: Instant) -> Result<(), WireError> {
        let mut window = self.window.borrow_mut();
        if window.knows(queue, partition, id, now, NEW_PRODUCERS_WINDOW) {
            return Ok(());
        }
        let limits = (NEW_PRODUCERS_PER_PARTITION, NEW_PRODUCERS_PER_CONNECTION);
        window
            .room(queue, partition, now, NEW_PRODUCERS_WINDOW, limits)
            .map_err(|l| too_many("this connection", l, queue, partition))?;
        if let Some((counts, user)) = &*self.principal.borrow() {
            counts
                .admit(user, queue, partition, id, now, NEW_PRODUCERS_WINDOW)
                .map_err(|l| {
                    too_many(
                        &format!(
                            "user {user:?} (over all its connections to this broker; max_producer_ids_per_principal)"
                        ),
                        l,
                        queue,
                        partition,
                    )
                })?;
        }
        window.insert(queue, partition, id, now);
        Ok(())
    }

    /// Checks a partition's batch if it starts a producer (sequence 0; a
    /// batch without a producer id is not counted). The shard reads the
    /// same header to deduplicate (`append_once`).
    fn admit_batch(&self, queue: &str, partition: u32, records: &[u8], now: Instant) -> Result<(), WireError> {
        match strand_storage::batch::BatchHeader::parse(records) {
            Some(h) if h.producer_id >= 0 && h.base_sequence == 0 => self.admit(queue, partition, h.producer_id, now),
            _ => Ok(()),
        }
    }
}

pub async fn handle(
    shard: &Rc<Shard>,
    producers: &NewProducers,
    header: FrameHeader,
    frame: FrameMut,
) -> Result<Option<OutFrame>, WireError> {
    let (acks, timeout_ms, parts) = {
        let req = request::<ProduceRequest>(&frame.body)?;
        let acks = req.acks();
        // A client may ask for no longer a wait than the broker allows.
        let cap = u32::try_from(shard.config.max_request_timeout_ms).unwrap_or(u32::MAX);
        let timeout_ms = req.timeout_ms().min(cap);
        if !(-1..=1).contains(&acks) {
            return Err(WireError::new(
                ErrorCode::InvalidRequest,
                format!("acks must be -1, 0 or 1, not {acks}"),
            ));
        }
        let mut parts = Vec::new();
        super::check_entries(super::partitions_named!(req))?;
        for q in req.queues().iter().flatten() {
            let queue = super::named_queue(q.name())?;
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
    let ask_one = |shard: Rc<Shard>,
                   queue: String,
                   partition: u32,
                   records: Option<bytes::BytesMut>,
                   refused: Option<WireError>| async move {
        if let Some(e) = refused {
            return Err(e);
        }
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
    // New producer ids are judged here, before any task starts: in the
    // order the connection's requests came.
    let now = Instant::now();
    let tasks: Vec<_> = parts
        .iter()
        .zip(records)
        .map(|(part, records)| {
            let refused = producers
                .admit_batch(&part.queue, part.partition, records.as_deref().unwrap_or_default(), now)
                .err();
            glommio::spawn_local(ask_one(
                shard.clone(),
                part.queue.clone(),
                part.partition,
                records,
                refused,
            ))
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

/// `TooManyProducers`: `who` brought as many producer ids as `limit`
/// allows.
fn too_many(who: &str, limit: ProducerLimit, queue: &str, partition: u32) -> WireError {
    let minutes = NEW_PRODUCERS_WINDOW.as_secs() / 60;
    let what = match limit {
        ProducerLimit::Partition(n) => format!("{n} producer ids to partition {partition} of {queue:?}"),
        ProducerLimit::All(n) => format!("{n} producer ids"),
    };
    WireError::new(
        ErrorCode::TooManyProducers,
        format!("{who} brought {what} within {minutes} minutes: reuse producers (a producer keeps its id), or wait"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(r: Result<(), WireError>) -> bool {
        matches!(r, Err(e) if e.code == ErrorCode::TooManyProducers)
    }

    /// Before this limit a client could open fresh producer ids on one
    /// connection until the partition's table was full of them (issue 41,
    /// item 3).
    #[test]
    fn a_connection_brings_at_most_so_many_producer_ids_to_a_partition() {
        let p = NewProducers::default();
        let t0 = Instant::now();
        for id in 0..NEW_PRODUCERS_PER_PARTITION as i64 {
            p.admit("q", 0, id, t0).unwrap();
        }
        assert!(refused(p.admit("q", 0, 1_000_000, t0)));
        // A producer it already brought goes on; another partition is apart.
        p.admit("q", 0, 7, t0).unwrap();
        p.admit("q", 1, 1_000_000, t0).unwrap();
        p.admit("other", 0, 1_000_000, t0).unwrap();
        // Once the first ids are as old as a partition keeps idle ones,
        // new ones come in again.
        let later = t0 + NEW_PRODUCERS_WINDOW;
        p.admit("q", 0, 1_000_000, later).unwrap();
    }

    #[test]
    fn a_connection_brings_at_most_so_many_producer_ids_in_all() {
        let p = NewProducers::default();
        let t0 = Instant::now();
        let per = NEW_PRODUCERS_PER_PARTITION as i64;
        for id in 0..NEW_PRODUCERS_PER_CONNECTION as i64 {
            p.admit("q", (id / per) as u32, id, t0).unwrap();
        }
        assert!(refused(p.admit("q", 100_000, -5, t0)));
        let later = t0 + NEW_PRODUCERS_WINDOW;
        p.admit("q", 100_000, 5, later).unwrap();
        assert_eq!(p.window.borrow().total(), 1);
    }

    #[test]
    fn only_a_batch_at_sequence_zero_with_a_producer_id_counts() {
        let p = NewProducers::default();
        let t0 = Instant::now();
        let batch = |producer_id: i64, base_sequence: i32| {
            let mut b = strand_storage::batch::BatchBuilder::new();
            b.producer(producer_id, 0, base_sequence);
            b.push(Some(b"k"), Some(b"v"), &[], 0);
            b.build().to_vec()
        };
        for id in 0..NEW_PRODUCERS_PER_PARTITION as i64 {
            p.admit_batch("q", 0, &batch(id, 0), t0).unwrap();
        }
        assert!(refused(p.admit_batch("q", 0, &batch(999_999, 0), t0)));
        p.admit_batch("q", 0, &batch(999_999, 5), t0).unwrap();
        p.admit_batch("q", 0, &batch(-1, 0), t0).unwrap();
        p.admit_batch("q", 0, b"short", t0).unwrap();
    }
}
