//! The consumer (without a group): assign partitions, seek, poll records.
//!
//! Runs on: the caller's task ([`Consumer`] is used from one task at a time:
//! its methods take `&mut self`) and the connections' reader threads, which
//! complete fetch responses.
//!
//! Fetches are long polls (the broker answers once `min_bytes` are there or
//! `max_wait` passed) and are pipelined, two deep: with the fetch being
//! answered, a *chained* fetch is in flight, which the broker answers from
//! where the first one's answer ends (`handlers::fetch` in the broker). So
//! while the client receives, checks and hands out one answer, the broker
//! already sends — or waits for data for — the next, and no round trip is
//! paid between them. A chained fetch carries the position its predecessor
//! started from; if the broker's chain does not match (another connection),
//! it answers from there instead, which the client sees as records it has
//! already had and skips. A chained answer that starts past a partition's
//! position (a gap: the chain was not what the client thought) is never
//! taken; the partition is asked again from its position. With `pipeline_fetches` off, the next fetch is
//! sent as soon as an answer arrives, from the positions just past its
//! batches (read off their headers), before those batches are checked and
//! read. A `seek` or `assign` drops the fetches in flight (their answers
//! would be for positions that no longer hold).
//!
//! Every batch is checked (CRC and record framing) before its records are
//! handed out; records below the position (a fetch returns whole batches,
//! so the first may start earlier) are skipped.
//!
//! While leaders move or brokers are unreachable, `poll` retries: a
//! partition whose leader moved goes to the leader the `NotLeader` answer
//! named, or its queue's metadata is asked for again; a poll that got
//! nothing for that reason waits a doubling backoff ([`crate::retry`]) and
//! returns no records. Only a failure that lasts
//! [`ConsumerConfig::retry_timeout`] is returned.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strand_net::message::{read_body, TailBuilder};
use strand_net::Frame;
use strand_wire::batch::{batch_length, BatchHeader, RecordBatch};
use strand_wire::flatbuffers::{FlatBufferBuilder, ForwardsUOffset, Vector, WIPOffset};
use strand_wire::*;

use crate::cluster::Cluster;
use crate::connection::{Connection, RESPONSE_GRACE};
use crate::error::ClientError;
use crate::retry::{retriable, sleep, Failing};

/// Where to read a partition from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seek {
    /// The oldest record still stored.
    Earliest,
    /// Only records produced from now on.
    Latest,
    Offset(u64),
    /// The first record with a timestamp at or after this (ms since the Unix
    /// epoch); the log end if there is none.
    Timestamp(i64),
}

/// Consumer settings.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// How long the broker may hold a fetch open waiting for data.
    pub max_wait: Duration,
    /// Bytes a fetch waits for before answering.
    pub min_bytes: u32,
    /// Most bytes per partition in one fetch (at least one whole batch).
    pub partition_max_bytes: u32,
    /// Most bytes in one fetch over all partitions.
    pub max_bytes: u32,
    /// Where partitions assigned without a seek start.
    pub start: Seek,
    /// Where to go when a position is outside the log (retention removed it,
    /// or it is past the end); `None`: `poll` fails with OffsetOutOfRange.
    pub reset_out_of_range: Option<Seek>,
    /// See [`crate::ProducerConfig::busy_poll`].
    pub busy_poll: Duration,
    /// Keep a chained fetch in flight behind the one being answered (see
    /// the module doc): the broker's answers follow each other without a
    /// round trip in between. Off: one fetch in flight.
    pub pipeline_fetches: bool,
    /// How long `poll` keeps retrying a retriable failure (a leader moving,
    /// a broker unreachable; see [`crate::retry::retriable`]) before it
    /// returns the error.
    pub retry_timeout: Duration,
    /// See [`crate::ProducerConfig::connect_timeout`].
    pub connect_timeout: Duration,
    /// A metadata request (and a new connection's first answer) gives up
    /// on a broker after this and asks the next one it knows.
    pub metadata_timeout: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            max_wait: Duration::from_millis(500),
            min_bytes: 1,
            partition_max_bytes: 1 << 20,
            max_bytes: 16 << 20,
            start: Seek::Latest,
            reset_out_of_range: None,
            busy_poll: Duration::ZERO,
            pipeline_fetches: true,
            retry_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(2),
            metadata_timeout: Duration::from_secs(2),
        }
    }
}

/// One record as consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedRecord {
    pub queue: Arc<str>,
    pub partition: u32,
    pub offset: u64,
    /// Milliseconds since the Unix epoch (producer's or broker's time, per
    /// the queue's setting).
    pub timestamp_ms: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(Bytes, Option<Bytes>)>,
}

/// A partition's read position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    At(u64),
    /// To be looked up before the next fetch.
    Pending(Seek),
}

impl Position {
    fn of(seek: Seek) -> Position {
        match seek {
            Seek::Offset(o) => Position::At(o),
            other => Position::Pending(other),
        }
    }
}

type Key = (Arc<str>, u32);
type FrameFuture = Pin<Box<dyn Future<Output = Result<Frame, ClientError>> + Send>>;

/// A fetch that was sent and not yet read: the offsets it asked for (for a
/// chained one: where its predecessor started) and the responses to come
/// (one per leader).
struct InFlight {
    asked: Vec<(Key, u64)>,
    chained: bool,
    responses: Vec<FrameFuture>,
}

/// A consumer of assigned partitions.
pub struct Consumer {
    cluster: Arc<Cluster>,
    config: ConsumerConfig,
    positions: BTreeMap<Key, Position>,
    /// Oldest first: the fetch the next poll reads, then a chained one.
    in_flight: VecDeque<InFlight>,
    /// A failure met while other partitions had records: reported by the
    /// next poll.
    deferred_error: Option<ClientError>,
    /// Positions moved by `reset_out_of_range`, not yet taken.
    resets: Vec<OutOfRangeReset>,
    /// A partition's leader moved in the last poll (and no hint said
    /// where), or could not be asked where its positions are: if the poll
    /// got nothing, it backs off.
    moved: Option<ClientError>,
    /// The retriable failures since the last poll that went through.
    failing: Failing,
}

/// A position that was outside its partition's log (retention removed the
/// records, or it was past the end) and was moved per
/// [`ConsumerConfig::reset_out_of_range`]: records between `position` and
/// `log_start` were never read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfRangeReset {
    pub queue: Arc<str>,
    pub partition: u32,
    pub position: u64,
    pub log_start: u64,
    pub high_watermark: u64,
    pub to: Seek,
}

impl Consumer {
    /// A consumer for the cluster at `brokers` (`HOST:PORT[,HOST:PORT...]`).
    pub fn new(brokers: &str, config: ConsumerConfig) -> Result<Consumer, ClientError> {
        let timeouts = crate::Timeouts {
            connect: config.connect_timeout,
            metadata: config.metadata_timeout,
        };
        Ok(Consumer::with_cluster(
            Cluster::with_settings(brokers, config.busy_poll, timeouts)?,
            config,
        ))
    }

    /// A consumer over an existing cluster handle.
    pub(crate) fn with_cluster(cluster: Arc<Cluster>, config: ConsumerConfig) -> Consumer {
        Consumer {
            cluster,
            config,
            positions: BTreeMap::new(),
            in_flight: VecDeque::new(),
            deferred_error: None,
            resets: Vec::new(),
            moved: None,
            failing: Failing::default(),
        }
    }

    /// Reads these partitions of `queue` (added to what is assigned), from
    /// the configured start unless sought.
    pub fn assign(&mut self, queue: &str, partitions: &[u32]) {
        let q: Arc<str> = Arc::from(queue);
        for &p in partitions {
            self.positions
                .entry((q.clone(), p))
                .or_insert(Position::of(self.config.start));
        }
        self.in_flight.clear();
    }

    /// Reads every partition of `queue` (asks for its partition count);
    /// returns how many there are.
    pub async fn assign_all(&mut self, queue: &str) -> Result<u32, ClientError> {
        let info = self.cluster.refresh(queue).await?;
        let all: Vec<u32> = (0..info.partitions()).collect();
        self.assign(queue, &all);
        Ok(info.partitions())
    }

    /// Stops reading a partition.
    pub fn unassign(&mut self, queue: &str, partition: u32) {
        self.positions.remove(&(Arc::from(queue), partition));
        self.in_flight.clear();
    }

    /// Moves an assigned partition's position (looked up on the next poll).
    pub fn seek(&mut self, queue: &str, partition: u32, to: Seek) -> Result<(), ClientError> {
        let pos = self
            .positions
            .get_mut(&(Arc::from(queue), partition))
            .ok_or_else(|| ClientError::Invalid(format!("{queue}/{partition} is not assigned")))?;
        *pos = Position::of(to);
        self.in_flight.clear();
        Ok(())
    }

    /// Every assigned partition to `to`.
    pub fn seek_all(&mut self, to: Seek) {
        for pos in self.positions.values_mut() {
            *pos = Position::of(to);
        }
        self.in_flight.clear();
    }

    /// The offset of the next record to be returned for a partition, once
    /// known.
    pub fn position(&self, queue: &str, partition: u32) -> Option<u64> {
        match self.positions.get(&(Arc::from(queue), partition)) {
            Some(Position::At(o)) => Some(*o),
            _ => None,
        }
    }

    /// Positions moved since the last call because they were outside the
    /// log (see [`OutOfRangeReset`]); a caller reports them, since records
    /// may have been skipped.
    pub fn take_resets(&mut self) -> Vec<OutOfRangeReset> {
        std::mem::take(&mut self.resets)
    }

    /// The assigned partitions.
    pub fn assignment(&self) -> Vec<(Arc<str>, u32)> {
        self.positions.keys().cloned().collect()
    }

    /// The next records of the assigned partitions, in offset order per
    /// partition; empty if none came within `max_wait`, or while a
    /// retriable failure lasts (see the module doc).
    pub async fn poll(&mut self) -> Result<Vec<ConsumedRecord>, ClientError> {
        let polled = self.poll_once().await;
        let moved = self.moved.take();
        let failure = match polled {
            Ok(records) if !records.is_empty() => {
                self.failing.succeeded();
                return Ok(records);
            }
            Ok(records) => match moved {
                None => {
                    self.failing.succeeded();
                    return Ok(records);
                }
                Some(e) => e,
            },
            Err(e) if retriable(&e) => e,
            Err(e) => return Err(e),
        };
        match self.failing.failed(self.config.retry_timeout) {
            Some(wait) => {
                sleep(wait).await;
                Ok(Vec::new())
            }
            None => {
                self.failing.succeeded();
                Err(failure)
            }
        }
    }

    /// One round of [`Consumer::poll`], without its retries.
    async fn poll_once(&mut self) -> Result<Vec<ConsumedRecord>, ClientError> {
        if let Some(e) = self.deferred_error.take() {
            return Err(e);
        }
        if self.positions.is_empty() {
            return Err(ClientError::Invalid("no partition is assigned".into()));
        }
        let queues: Vec<Arc<str>> = self.positions.keys().map(|k| k.0.clone()).collect();
        for q in queues {
            self.cluster.queue(&q).await?; // leaders, cached
        }
        self.resolve_pending().await?;
        // A chained fetch is current as long as nothing cleared the queue
        // (a seek, an assignment, a broken chain) since it was sent.
        let current = self
            .in_flight
            .front()
            .is_some_and(|f| f.chained || self.still_current(f));
        if !current {
            self.in_flight.clear();
        }
        let mut in_flight = match self.in_flight.pop_front() {
            Some(f) => f,
            None => self.send_fetch(false)?,
        };
        let mut frames = Vec::new();
        for r in std::mem::take(&mut in_flight.responses) {
            frames.push(r.await);
        }
        // Each partition's run and position move together: a failure
        // elsewhere in the fetch neither drops nor skips them. An error is
        // returned once there are no records to hand out first.
        let mut runs = Vec::new();
        let mut broken = false;
        for frame in frames {
            if let Err(e) = frame.and_then(|f| self.read_fetch(&f, in_flight.chained, &mut runs, &mut broken)) {
                self.forget_if_moved(&e, &in_flight.asked);
                self.deferred_error.get_or_insert(e);
            }
        }
        if broken {
            self.in_flight.clear();
        }
        // Pipelining: the positions already stand past the runs (read off
        // their batch headers), so the next fetch is sent before these
        // records are checked and read — the broker works on it meanwhile
        // (unless a leader moved: the next poll asks for metadata first).
        // A chained fetch still in flight starts at these positions; the
        // one sent behind it says so.
        let leaders_known = self.positions.keys().all(|k| self.cluster.cached(&k.0).is_some());
        if leaders_known && self.positions.values().all(|p| matches!(p, Position::At(_))) {
            if self.in_flight.is_empty() {
                let next = self.send_fetch(false).ok();
                self.in_flight.extend(next);
            }
            if self.config.pipeline_fetches && self.in_flight.len() == 1 {
                let chained = self.send_fetch(true).ok();
                self.in_flight.extend(chained);
            }
        }
        let mut records = Vec::new();
        for run in runs {
            let before = records.len();
            if let Err(e) = read_batches(&run.key, run.position, run.bytes, &mut records) {
                // Nothing of a run with a bad batch is handed out: the
                // partition is read again from where it was (the fetches
                // just sent no longer match its position, so they are
                // dropped).
                records.truncate(before);
                self.positions.insert(run.key, Position::At(run.position));
                self.in_flight.clear();
                self.deferred_error.get_or_insert(e);
            }
        }
        if records.is_empty() {
            if let Some(e) = self.deferred_error.take() {
                return Err(e);
            }
        }
        Ok(records)
    }

    fn still_current(&self, f: &InFlight) -> bool {
        f.asked.len() == self.positions.len()
            && f.asked
                .iter()
                .all(|(k, o)| self.positions.get(k) == Some(&Position::At(*o)))
    }

    /// Looks up the offsets of positions given as earliest/latest/timestamp.
    async fn resolve_pending(&mut self) -> Result<(), ClientError> {
        let pending: Vec<(Key, Seek)> = self
            .positions
            .iter()
            .filter_map(|(k, p)| match p {
                Position::Pending(s) => Some((k.clone(), *s)),
                Position::At(_) => None,
            })
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        // Each partition's leader knows its offsets.
        let mut by_conn: HashMap<usize, (Connection, Vec<(Key, Seek)>)> = HashMap::new();
        for (key, seek) in pending {
            let conn = match self.leader_of(&key.0, key.1, false) {
                Ok(conn) => conn,
                Err(e) if retriable(&e) => {
                    self.moved.get_or_insert(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            by_conn
                .entry(conn.id())
                .or_insert_with(|| (conn, Vec::new()))
                .1
                .push((key, seek));
        }
        // A leader that fails (offline, moved, unreachable) holds back only
        // its own partitions: the others are read meanwhile, and the poll
        // backs off only if it gets nothing ([`Consumer::poll`]).
        for (_, (conn, seeks)) in by_conn {
            match list_offsets(&conn, &seeks).await {
                Ok(found) => {
                    for (key, offset) in found {
                        self.positions.insert(key, Position::At(offset));
                    }
                }
                Err(e) if retriable(&e) => {
                    self.forget_if_moved(&e, &seeks);
                    self.moved.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// After NOT_LEADER, an unknown partition or a lost connection about a
    /// whole request, the leaders of its partitions are asked for again on
    /// the next poll (a hint names one partition's leader: not theirs).
    fn forget_if_moved<T>(&self, e: &ClientError, keys: &[(Key, T)]) {
        if e.leader_moved() {
            for ((queue, _), _) in keys {
                self.cluster.forget_queue(queue);
            }
        }
    }

    /// Sends one fetch per leader for every assigned partition, from the
    /// positions, or — `chained` — from where the fetch in flight from the
    /// positions ends.
    /// A partition whose leader cannot be reached is left out (and the poll
    /// backs off if it gets nothing): the others are read meanwhile.
    fn send_fetch(&mut self, chained: bool) -> Result<InFlight, ClientError> {
        let mut by_conn: HashMap<usize, (Connection, Vec<(Key, u64)>)> = HashMap::new();
        let mut asked = Vec::new();
        for (key, pos) in &self.positions {
            let Position::At(offset) = *pos else { continue };
            let conn = match self.leader_of(&key.0, key.1, true) {
                Ok(conn) => conn,
                Err(e) if retriable(&e) => {
                    self.moved.get_or_insert(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            by_conn
                .entry(conn.id())
                .or_insert_with(|| (conn, Vec::new()))
                .1
                .push((key.clone(), offset));
            asked.push((key.clone(), offset));
        }
        let mut responses: Vec<FrameFuture> = Vec::new();
        // A chained fetch waits behind the one before it: two long polls.
        let due = self.config.max_wait * 2 + RESPONSE_GRACE;
        for (_, (conn, wants)) in by_conn {
            let body = fetch_request(&self.config, &wants, chained);
            responses.push(Box::pin(conn.request_within(
                Api::Fetch,
                &body,
                TailBuilder::default(),
                due,
            )));
        }
        Ok(InFlight {
            asked,
            chained,
            responses,
        })
    }

    /// The connection to a partition's leader (any broker while its
    /// metadata is not cached); for `fetches`, the leader's connection for
    /// fetches, apart from the one offset lookups and group commits use, so
    /// they never wait behind a long poll (`Cluster::fetch_connection`).
    fn leader_of(&self, queue: &str, partition: u32, fetches: bool) -> Result<Connection, ClientError> {
        match self.cluster.cached(queue) {
            Some(info) if fetches => self.cluster.fetch_connection(&info, partition),
            Some(info) => self.cluster.leader_connection(&info, partition),
            None => self.cluster.any_connection(),
        }
    }

    /// Takes each partition's run of batches out of one fetch response and
    /// moves its position past them (records are read later: `read_batches`).
    /// Sets `broken` when a position moved otherwise (an out-of-range reset)
    /// or a `chained` fetch's run starts past its position: the fetches in
    /// flight behind this one no longer follow on.
    fn read_fetch(
        &mut self,
        frame: &Frame,
        chained: bool,
        out: &mut Vec<Run>,
        broken: &mut bool,
    ) -> Result<(), ClientError> {
        let resp = read_body::<FetchResponse>(&frame.body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        ClientError::check(resp.error())?;
        for q in resp.queues().iter().flatten() {
            let name = q.name().unwrap_or_default();
            for p in q.partitions().iter().flatten() {
                let key: Key = (Arc::from(name), p.partition());
                let Some(Position::At(position)) = self.positions.get(&key).copied() else {
                    continue; // unassigned meanwhile
                };
                if let Err(e) = ClientError::check(p.error()) {
                    match e.code() {
                        _ if e.leader_moved() => {
                            if self.cluster.leader_moved(name, p.partition(), &e).is_none() {
                                self.moved = Some(e);
                            }
                            continue;
                        }
                        Some(ErrorCode::OffsetOutOfRange) => {
                            if let Some(reset) = self.config.reset_out_of_range {
                                self.resets.push(OutOfRangeReset {
                                    queue: key.0.clone(),
                                    partition: key.1,
                                    position,
                                    log_start: p.log_start(),
                                    high_watermark: p.high_watermark(),
                                    to: reset,
                                });
                                self.positions.insert(key, Position::of(reset));
                                *broken = true;
                                continue;
                            }
                            self.deferred_error.get_or_insert(ClientError::broker(
                                ErrorCode::OffsetOutOfRange,
                                format!(
                                    "{name}/{}: offset {position} is outside the log (start {}, high watermark {})",
                                    p.partition(),
                                    p.log_start(),
                                    p.high_watermark()
                                ),
                            ));
                            continue;
                        }
                        // Busy or timed out: this partition is asked again next time.
                        Some(ErrorCode::Overloaded | ErrorCode::Timeout) => continue,
                        _ => {
                            self.deferred_error.get_or_insert(e);
                            continue;
                        }
                    }
                }
                let run = tail_run(frame, p.records_offset(), p.records_len(), "fetch")?;
                let (first, next) = run_bounds(&key, position, &run)?;
                if chained && first.is_some_and(|first| first > position) {
                    // The broker's chain started past the position (its
                    // records were not sent): never skip them. Asked again
                    // from the position, by a plain fetch.
                    *broken = true;
                    continue;
                }
                self.positions.insert(key.clone(), Position::At(next));
                out.push(Run {
                    key,
                    position,
                    bytes: run,
                });
            }
        }
        Ok(())
    }
}

/// One partition's batches from a fetch response, not yet checked or read.
struct Run {
    key: Key,
    /// The partition's position when the fetch was sent.
    position: u64,
    bytes: Bytes,
}

/// The base offset of a run's first batch (`None` for an empty run) and
/// the offset after the run (at least `position`), from the batch headers
/// alone: what the next fetch asks for. The batches are checked when their
/// records are read ([`read_batches`]).
fn run_bounds(key: &Key, mut position: u64, run: &[u8]) -> Result<(Option<u64>, u64), ClientError> {
    let mut first = None;
    let mut rest = run;
    while !rest.is_empty() {
        let len = whole_batch_len(&key.0, key.1, rest)?;
        let header = BatchHeader::parse(&rest[..len]).ok_or_else(|| torn(&key.0, key.1))?;
        first.get_or_insert(header.base_offset.0);
        position = position.max(header.next_offset().0);
        rest = &rest[len..];
    }
    Ok((first, position))
}

/// The records `[offset, offset + len)` of a response frame's tail (where
/// the body says a partition's batches are).
pub(crate) fn tail_run(frame: &Frame, offset: u32, len: u32, api: &str) -> Result<Bytes, ClientError> {
    let (start, end) = (offset as usize, offset as usize + len as usize);
    if end > frame.tail.len() {
        return Err(ClientError::Protocol(format!(
            "{api} response: records at {start}..{end} past the frame's tail of {} bytes",
            frame.tail.len()
        )));
    }
    Ok(frame.tail.slice(start..end))
}

/// The length of the batch `run` starts with, which `run` must hold whole.
pub(crate) fn whole_batch_len(queue: &str, partition: u32, run: &[u8]) -> Result<usize, ClientError> {
    batch_length(run)
        .map(|l| l as usize)
        .filter(|&l| l > 0 && l <= run.len())
        .ok_or_else(|| torn(queue, partition))
}

fn torn(queue: &str, partition: u32) -> ClientError {
    ClientError::Protocol(format!("{queue}/{partition}: a torn batch in a fetch"))
}

/// Appends the records at or after `position` from a run of whole batches;
/// returns the next position.
pub(crate) fn read_batches(
    key: &Key,
    mut position: u64,
    mut run: Bytes,
    out: &mut Vec<ConsumedRecord>,
) -> Result<u64, ClientError> {
    while !run.is_empty() {
        let len = whole_batch_len(&key.0, key.1, &run)?;
        let bytes = run.split_to(len);
        let batch = RecordBatch::new(bytes, len)
            .map_err(|e| ClientError::Protocol(format!("{}/{}: corrupt batch in a fetch: {e}", key.0, key.1)))?;
        for r in batch.records() {
            if r.offset.0 < position {
                continue;
            }
            out.push(ConsumedRecord {
                queue: key.0.clone(),
                partition: key.1,
                offset: r.offset.0,
                timestamp_ms: r.timestamp,
                key: r.key,
                value: r.value,
                headers: r.headers.map(|h| (h.key, h.value)).collect(),
            });
        }
        position = position.max(batch.next_offset().0);
    }
    Ok(position)
}

/// One table per queue over entries keyed by (queue, partition): `part`
/// builds each partition's entry, `queue` the queue's table around them.
/// Fetch and ListOffsets requests both have this shape.
fn per_queue<'b, T, P: 'b, Q: 'b>(
    fbb: &mut FlatBufferBuilder<'b>,
    entries: &[(Key, T)],
    part: impl Fn(&mut FlatBufferBuilder<'b>, u32, &T) -> WIPOffset<P>,
    queue: impl Fn(
        &mut FlatBufferBuilder<'b>,
        WIPOffset<&'b str>,
        WIPOffset<Vector<'b, ForwardsUOffset<P>>>,
    ) -> WIPOffset<Q>,
) -> WIPOffset<Vector<'b, ForwardsUOffset<Q>>> {
    let mut by_queue: BTreeMap<&str, Vec<WIPOffset<P>>> = BTreeMap::new();
    for ((name, partition), value) in entries {
        let p = part(fbb, *partition, value);
        by_queue.entry(name).or_default().push(p);
    }
    let queues: Vec<_> = by_queue
        .into_iter()
        .map(|(name, parts)| {
            let parts = fbb.create_vector(&parts);
            let name = fbb.create_string(name);
            queue(fbb, name, parts)
        })
        .collect();
    fbb.create_vector(&queues)
}

pub(crate) fn fetch_request(config: &ConsumerConfig, wants: &[(Key, u64)], chained: bool) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let queues = per_queue(
        &mut fbb,
        wants,
        |fbb, partition, offset| {
            FetchPartition::create(
                fbb,
                &FetchPartitionArgs {
                    partition,
                    offset: *offset,
                    max_bytes: config.partition_max_bytes,
                    chained,
                },
            )
        },
        |fbb, name, partitions| {
            FetchQueue::create(
                fbb,
                &FetchQueueArgs {
                    name: Some(name),
                    partitions: Some(partitions),
                },
            )
        },
    );
    let root = FetchRequest::create(
        &mut fbb,
        &FetchRequestArgs {
            max_wait_ms: config.max_wait.as_millis().min(u128::from(u32::MAX)) as u32,
            min_bytes: config.min_bytes,
            max_bytes: config.max_bytes,
            queues: Some(queues),
        },
    );
    fbb.finish_minimal(root);
    fbb.finished_data().to_vec()
}

/// Asks for the offsets of `seeks` (earliest, latest or by timestamp).
async fn list_offsets(conn: &Connection, seeks: &[(Key, Seek)]) -> Result<Vec<(Key, u64)>, ClientError> {
    let mut fbb = FlatBufferBuilder::new();
    let queues = per_queue(
        &mut fbb,
        seeks,
        |fbb, partition, seek| {
            let (spec, timestamp_ms) = match seek {
                Seek::Earliest => (OffsetSpec::Earliest, 0),
                Seek::Latest | Seek::Offset(_) => (OffsetSpec::Latest, 0),
                Seek::Timestamp(t) => (OffsetSpec::Timestamp, *t),
            };
            ListOffsetsPartition::create(
                fbb,
                &ListOffsetsPartitionArgs {
                    partition,
                    spec,
                    timestamp_ms,
                },
            )
        },
        |fbb, name, partitions| {
            ListOffsetsQueue::create(
                fbb,
                &ListOffsetsQueueArgs {
                    name: Some(name),
                    partitions: Some(partitions),
                },
            )
        },
    );
    let root = ListOffsetsRequest::create(&mut fbb, &ListOffsetsRequestArgs { queues: Some(queues) });
    fbb.finish_minimal(root);
    let frame = conn
        .request(Api::ListOffsets, fbb.finished_data(), TailBuilder::default())
        .await?;
    let resp = read_body::<ListOffsetsResponse>(&frame.body).map_err(|e| ClientError::Protocol(e.to_string()))?;
    ClientError::check(resp.error())?;
    let mut found = Vec::new();
    for q in resp.queues().iter().flatten() {
        let name: Arc<str> = Arc::from(q.name().unwrap_or_default());
        for p in q.partitions().iter().flatten() {
            ClientError::check(p.error()).map_err(|e| {
                ClientError::broker(
                    e.code().unwrap_or(ErrorCode::Internal),
                    format!("{name}/{}: {e}", p.partition()),
                )
            })?;
            found.push(((name.clone(), p.partition()), p.offset()));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strand_wire::batch::{stamp, BatchBuilder, Stamp};
    use strand_wire::{LeaderEpoch, Offset};

    /// A stored batch of `records` records at `base`.
    fn stored(base: u64, records: u32) -> Vec<u8> {
        let mut b = BatchBuilder::new();
        for i in 0..records {
            b.push(None, Some(format!("v{}", base + u64::from(i)).as_bytes()), &[], 1_000);
        }
        let mut bytes = b.build();
        let stamp_with = Stamp {
            base_offset: Offset(base),
            leader_epoch: LeaderEpoch(1),
            log_append_time_ms: None,
        };
        stamp(&mut bytes, usize::MAX, stamp_with).unwrap();
        bytes.to_vec()
    }

    fn key() -> Key {
        (Arc::from("q"), 0)
    }

    #[test]
    fn the_next_position_comes_from_the_batch_headers_alone() {
        let mut run = stored(10, 3);
        run.extend(stored(13, 5));
        assert_eq!(run_bounds(&key(), 11, &run).unwrap(), (Some(10), 18));
        // Reading the records agrees, skipping those below the position.
        let mut out = Vec::new();
        assert_eq!(
            read_batches(&key(), 11, Bytes::from(run.clone()), &mut out).unwrap(),
            18
        );
        assert_eq!(
            out.iter().map(|r| r.offset).collect::<Vec<_>>(),
            (11..18).collect::<Vec<_>>()
        );
        // A position past the run stays where it is; an empty run moves nothing.
        assert_eq!(run_bounds(&key(), 30, &run).unwrap().1, 30);
        assert_eq!(run_bounds(&key(), 7, &[]).unwrap(), (None, 7));
    }

    #[test]
    fn a_torn_run_is_refused_by_the_header_walk() {
        let mut run = stored(0, 4);
        run.extend(stored(4, 4));
        for cut in [1, 11, run.len() - 1] {
            let e = run_bounds(&key(), 0, &run[..cut]).unwrap_err();
            assert!(e.to_string().contains("torn"), "{e}");
        }
        // A damaged record body passes the header walk (headers are intact)
        // but not the CRC check when the records are read.
        let last = run.len() - 1;
        run[last] ^= 0xff;
        assert_eq!(run_bounds(&key(), 0, &run).unwrap().1, 8);
        let mut out = Vec::new();
        assert!(read_batches(&key(), 0, Bytes::from(run), &mut out).is_err());
    }
}
