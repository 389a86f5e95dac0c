//! Fetch: whole record batches below each partition's high watermark, with
//! long polling — the answer waits until `min_bytes` are there or
//! `max_wait_ms` has passed. Batches go into the response's tail as they
//! came from the log (no copy).
//!
//! A wait is woken by new data on this shard's partitions; partitions of
//! other shards are looked at again every 10 ms while waiting.
//!
//! # Chained fetches (pipelining)
//! A consumer that waits for each answer before asking again leaves the
//! connection idle for a round trip per fetch. So a partition may be asked
//! for `chained`: "from where the previous fetch of this partition on this
//! connection ends", sent before that answer has arrived. Each connection
//! keeps [`FetchChains`]: for every partition fetched on it, where its last
//! fetch started and, once answered, where it ended (the offset after the
//! last batch it returned; its start when it returned none, or failed). A
//! chained fetch waits for its predecessor's answer to be made, checks that
//! the predecessor started at the request's `offset` (the client's view of
//! the chain), and reads from the predecessor's end; if it did not (the
//! chain was broken: a new connection, a seek), it reads from `offset`, as a
//! plain fetch — a duplicate the client skips, never a gap. Its long poll
//! starts once the predecessor's answer is made (within `MAX_WAIT_CAP` of
//! its arrival in all), so a consumer keeps one
//! fetch waiting in the broker while it reads the last answer: data that
//! arrives meanwhile goes out at once, without a round trip.
//!
//! # A plain fetch supersedes
//! A plain (not chained) fetch of a partition says the client reads it
//! again from `offset` (a seek, a new assignment, a broken chain): the
//! fetches of that partition before it on the connection are obsolete. They
//! stop long-polling and are answered at once with what there is — the
//! connection answers in request order, so otherwise the new fetch would
//! wait behind up to two long polls (20 s in the test
//! `a_plain_fetch_ends_the_long_polls_it_supersedes` before this). Fetches
//! of other partitions are not touched.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use strand_storage::notify::Notify;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{error_table, request, respond};
use crate::router::ask;
use crate::shard::messages::{Fetched, PartitionRequest, WireError};
use crate::shard::Shard;

/// Longest long poll accepted.
const MAX_WAIT_CAP: Duration = Duration::from_secs(30);
/// How often other shards' partitions are looked at while waiting.
const REMOTE_RECHECK: Duration = Duration::from_millis(10);

struct Want {
    queue: String,
    partition: u32,
    offset: u64,
    max_bytes: u32,
    chained: bool,
}

/// One connection's fetch chains (see the module doc).
#[derive(Default)]
pub struct FetchChains {
    last: RefCell<HashMap<(String, u32), Rc<Link>>>,
    /// Woken whenever a link's answer is made.
    answered: Notify,
    /// Woken whenever a plain fetch supersedes earlier ones (see [`Link`]).
    superseded: Notify,
    /// Fetches linked so far on this connection (the next one's number).
    fetches: Cell<u64>,
}

/// Above this many partitions fetched on one connection, only fetches still
/// being answered are remembered. With names that could be queues
/// (`validate_queue_name`: at most 200 bytes; no link is made for others),
/// the map stays small whatever a client sends.
const CHAINS_MAX: usize = super::PARTITIONS_PER_REQUEST_MAX;

/// One fetch of one partition: which fetch of the connection it is, where
/// it started (once known: a chained fetch learns it from its predecessor)
/// and where its answer ended.
struct Link {
    fetch: u64,
    start: Cell<Option<u64>>,
    end: Cell<Option<u64>>,
    /// Plain fetches of this partition on the connection so far, shared by
    /// its links, and their count when this one came. A plain fetch means
    /// the client reads the partition again from somewhere (a seek, a
    /// broken chain): the fetches before it are obsolete, and their long
    /// polls end at once rather than hold up the answers behind them.
    plain: Rc<Cell<u64>>,
    plain_seen: u64,
}

impl Link {
    fn superseded(&self) -> bool {
        self.plain.get() > self.plain_seen
    }
}

/// A fetch's place in its chains, made before its first await (handlers
/// start in arrival order, so links are made in request order). If the
/// fetch fails before it answers, dropping it answers "nothing read" for
/// every partition, so no successor waits forever.
struct Links<'a> {
    chains: &'a FetchChains,
    /// Per want (none for a name no queue can have).
    links: Vec<Option<Linked>>,
}

/// A want's link, and its predecessor's if it is chained.
type Linked = (Rc<Link>, Option<Rc<Link>>);

impl FetchChains {
    fn link(&self, wants: &[Want]) -> Links<'_> {
        let mut last = self.last.borrow_mut();
        if last.len() > CHAINS_MAX {
            last.retain(|_, l| l.end.get().is_none());
        }
        let fetch = self.fetches.get();
        self.fetches.set(fetch + 1);
        let mut superseding = false;
        let links: Vec<Option<Linked>> = wants
            .iter()
            .map(|w| {
                strand_wire::validate_queue_name(&w.queue).ok()?;
                let key = (w.queue.clone(), w.partition);
                // An earlier entry of this same request (a partition named
                // twice) is neither superseded by this one nor chained to.
                let before = last.get(&key).filter(|b| b.fetch != fetch).cloned();
                let plain = last.get(&key).map_or_else(Rc::default, |b| b.plain.clone());
                if !w.chained && before.is_some() {
                    plain.set(plain.get() + 1);
                    superseding = true;
                }
                let link = Rc::new(Link {
                    fetch,
                    start: Cell::new(None),
                    end: Cell::new(None),
                    plain_seen: plain.get(),
                    plain,
                });
                last.insert(key, link.clone());
                Some((link, before.filter(|_| w.chained)))
            })
            .collect();
        if superseding {
            self.superseded.notify_all();
        }
        Links { chains: self, links }
    }
}

impl Links<'_> {
    /// Where each want reads from: a chained one, once its predecessor has
    /// answered, from that answer's end if the chain holds.
    async fn starts(&self, wants: &mut [Want]) {
        for (w, linked) in wants.iter_mut().zip(&self.links) {
            let Some((link, before)) = linked else { continue };
            if let Some(before) = before {
                loop {
                    let seen = self.chains.answered.epoch();
                    if before.end.get().is_some() {
                        break;
                    }
                    self.chains.answered.wait(seen).await;
                }
                if before.start.get() == Some(w.offset) {
                    w.offset = before.end.get().unwrap_or(w.offset);
                }
            }
            link.start.set(Some(w.offset));
        }
    }

    /// Whether a later plain fetch on the connection asked again for one
    /// of this fetch's partitions.
    fn superseded(&self) -> bool {
        self.links.iter().flatten().any(|(link, _)| link.superseded())
    }

    /// Records where each want's answer ends.
    fn answer(&self, ends: impl Iterator<Item = u64>) {
        for (linked, end) in self.links.iter().zip(ends) {
            if let Some((link, _)) = linked {
                link.end.set(Some(end));
            }
        }
        self.chains.answered.notify_all();
    }
}

impl Drop for Links<'_> {
    fn drop(&mut self) {
        let mut unanswered = false;
        for (link, _) in self.links.iter().flatten() {
            if link.end.get().is_none() {
                // Nothing was read: a successor starts where this fetch did —
                // or, if this one never learnt its start, from the
                // successor's own offset (an unknown start breaks the chain).
                link.end.set(Some(link.start.get().unwrap_or(0)));
                unanswered = true;
            }
        }
        if unanswered {
            self.chains.answered.notify_all();
        }
    }
}

/// The most a fetch in `body` may be answered with: each partition at
/// most its `max_bytes` or one batch (a read returns at least one; a
/// queue's largest is `batch_of(queue)`), all of them at most the
/// request's `max_bytes` and one batch more, never more than a frame, plus
/// the answer's own fields (each partition's, an error's message
/// included); a frame for a body that does not read (the handler refuses
/// it in a few bytes). What the connection's budget holds for the answer
/// until it is written (`server::connection`).
pub(crate) fn answer_bound(body: &[u8], max_frame_bytes: u32, batch_of: &dyn Fn(&str) -> usize) -> usize {
    let frame = max_frame_bytes as usize;
    let Ok(req) = request::<FetchRequest>(body) else {
        return frame;
    };
    let (mut records, mut largest, mut count) = (0usize, 0usize, 0usize);
    for q in req.queues().iter().flatten() {
        let batch = batch_of(q.name().unwrap_or_default());
        largest = largest.max(batch);
        for p in q.partitions().iter().flatten() {
            records += (p.max_bytes() as usize).max(batch);
            count += 1;
        }
    }
    let fields = (64 << 10) + count * PARTITION_FIELDS_MAX;
    (records.min(req.max_bytes() as usize + largest) + fields).min(frame)
}

/// The most one partition's entry in an answer takes besides its records:
/// its fields and an error table with its message (which names the queue).
pub(crate) const PARTITION_FIELDS_MAX: usize = 64 + strand_wire::QUEUE_NAME_MAX + 256;

pub async fn handle(
    shard: &Rc<Shard>,
    chains: &FetchChains,
    header: FrameHeader,
    body: &[u8],
) -> Result<OutFrame, WireError> {
    let (wants, max_wait, min_bytes, max_bytes) = {
        let req = request::<FetchRequest>(body)?;
        let mut wants = Vec::new();
        super::check_entries(super::partitions_named!(req))?;
        for q in req.queues().iter().flatten() {
            let queue = super::named_queue(q.name())?;
            for p in q.partitions().iter().flatten() {
                wants.push(Want {
                    queue: queue.clone(),
                    partition: p.partition(),
                    offset: p.offset(),
                    max_bytes: p.max_bytes(),
                    chained: p.chained(),
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
    // Nothing may ask for more than a frame can carry back.
    let max_bytes = max_bytes.min(super::frame_room(shard.config.max_frame_bytes));
    let min_bytes = min_bytes.min(max_bytes);
    let mut wants: Vec<Want> = wants
        .into_iter()
        .map(|w| Want {
            max_bytes: w.max_bytes.min(max_bytes as u32),
            ..w
        })
        .collect();
    let arrived = Instant::now();
    let links = chains.link(&wants);
    links.starts(&mut wants).await;
    // A chained fetch's long poll starts once its predecessor is answered;
    // all told it waits at most MAX_WAIT_CAP, well inside a client's
    // response timeout.
    let deadline = (Instant::now() + max_wait).min(arrived + MAX_WAIT_CAP);
    let all_local = wants.iter().all(|w| shard.owner(&w.queue, w.partition) == shard.id);
    let results = loop {
        let seen = shard.partitions.new_data.epoch();
        let superseded_seen = chains.superseded.epoch();
        let results = fetch_all(shard, &wants).await;
        let total: usize = results.iter().map(|r| r.as_ref().map_or(0, |f| f.read.bytes)).sum();
        let failed = results.iter().any(|r| r.is_err());
        let now = Instant::now();
        let done = total >= min_bytes || failed || now >= deadline || shard.stopping.get();
        if done || links.superseded() {
            break results;
        }
        let mut wait = deadline - now;
        if !all_local {
            wait = wait.min(REMOTE_RECHECK);
        }
        let _ = glommio::timer::timeout(wait, async {
            futures_lite::future::or(
                shard.partitions.new_data.wait(seen),
                chains.superseded.wait(superseded_seen),
            )
            .await;
            Ok(())
        })
        .await;
    };
    let mut fbb = FlatBufferBuilder::new();
    let mut tail = TailBuilder::default();
    let mut queues = Vec::new();
    let mut ends = Vec::with_capacity(wants.len());
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
            let mut end = wants[i].offset;
            if let Some(f) = fetched {
                if tail.is_empty() || tail.len() + f.read.bytes <= max_bytes {
                    for b in &f.read.batches {
                        tail.push(b.clone());
                    }
                    if !f.read.batches.is_empty() {
                        end = f.read.next_offset.0;
                    }
                }
            }
            ends.push(end);
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
    links.answer(ends.into_iter());
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
    let asks = wants.iter().map(|w| {
        let (shard, queue, partition, offset, max_bytes) =
            (shard.clone(), w.queue.clone(), w.partition, w.offset, w.max_bytes);
        async move {
            ask(&shard, queue, partition, |reply| PartitionRequest::Fetch {
                offset,
                max_bytes,
                reply,
            })
            .await
        }
    });
    super::all_of(asks.collect()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fetch body of `partitions` partitions of one queue, each asking
    /// `partition_max` bytes, `max_bytes` in all.
    fn body(partitions: u32, partition_max: u32, max_bytes: u32) -> Vec<u8> {
        let config = strand_client::ConsumerConfig {
            partition_max_bytes: partition_max,
            max_bytes,
            ..strand_client::ConsumerConfig::default()
        };
        let parts: Vec<(u32, u64)> = (0..partitions).map(|p| (p, 0)).collect();
        strand_client::requests::fetch_parts("q", &parts, &config, false)
    }

    #[test]
    fn a_fetch_holds_room_for_what_it_asks_not_a_whole_frame() {
        const MIB: u32 = 1 << 20;
        let each = |n: usize| (64 << 10) + n * PARTITION_FIELDS_MAX;
        let one_mib = |_: &str| MIB as usize;
        // A consumer of two partitions, 1 MiB each: 2 MiB and the fields.
        let two = answer_bound(&body(2, MIB, 16 * MIB), 16 * MIB, &one_mib);
        assert_eq!(two, 2 * MIB as usize + each(2));
        // A partition asking less still gets one whole batch: its queue's.
        let small = answer_bound(&body(1, 1000, 16 * MIB), 16 * MIB, &one_mib);
        assert_eq!(small, MIB as usize + each(1));
        let eight = |_: &str| 8 * MIB as usize;
        let large = answer_bound(&body(1, 1000, 16 * MIB), 16 * MIB, &eight);
        assert_eq!(large, 8 * MIB as usize + each(1));
        // Many partitions: the request's total and one batch more, at most
        // a frame.
        let ten = answer_bound(&body(10, MIB, 4 * MIB), 16 * MIB, &one_mib);
        assert_eq!(ten, 5 * MIB as usize + each(10));
        let hundred = answer_bound(&body(100, MIB, 64 * MIB), 16 * MIB, &one_mib);
        assert_eq!(hundred, 16 * MIB as usize);
        // A body that does not read: a frame (the handler refuses it).
        assert_eq!(answer_bound(b"junk", 16 * MIB, &one_mib), 16 * MIB as usize);
    }
}
