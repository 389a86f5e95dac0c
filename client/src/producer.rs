//! The producer: records in, acknowledged (partition, offset) out.
//!
//! Runs on: the caller's threads ([`Producer::send`] / [`Producer::enqueue`]
//! append to a partition's open batch under one mutex), one sender thread
//! per producer (closes batches whose linger ran out, retries, refreshes
//! metadata, writes requests), and the connections' reader threads (which
//! complete deliveries from the responses).
//!
//! How a record travels:
//!
//! 1. **Partition.** With a key: `fnv1a64(key) mod partitions`
//!    ([`strand_wire::partition_for_key`]) — the same key always goes to the
//!    same partition while the count stays the same. Without a key: the
//!    queue's *sticky* partition, which moves on (round robin) each time its
//!    batch is closed, so keyless records form full batches and spread
//!    evenly over the partitions.
//! 2. **Batch.** Records join their partition's open batch. A batch is sent
//!    when it reaches [`ProducerConfig::batch_bytes`], when it has waited
//!    [`ProducerConfig::linger`], when its connection gets a request anyway
//!    (it rides along: see step 6), or on [`Producer::flush`] — and only
//!    while the partition has fewer than `max_in_flight_per_partition`
//!    requests out. With linger 0 a record goes at once if the partition is idle, and
//!    records that arrive while a request is out ride together in the next
//!    one: batching grows exactly as fast as the broker falls behind.
//!    These two settings are THE throughput/latency knob.
//! 3. **Buffer.** Records take [`ProducerConfig::buffer_bytes`] from enqueue
//!    to acknowledgement. When it is full, `enqueue` waits for room or fails
//!    with [`ClientError::BufferFull`] ([`WhenFull`]).
//! 4. **Retry.** Retriable failures (lost connection, NOT_LEADER, unknown
//!    partition, overloaded, timeout, out-of-order sequence) put the batch
//!    back in its partition's queue in record order and resend it after a
//!    backoff (doubling from `retry_backoff` to `retry_backoff_max`),
//!    refreshing metadata first when the broker said the partition moved,
//!    until `delivery_timeout` from the oldest record's enqueue.
//! 5. **Idempotence** (on by default). Each partition's batches go out under
//!    a random producer id with consecutive sequences (stamped when first
//!    sent; see `strand_storage::producers`). The leader stores a
//!    batch only if it follows the last one it holds from the producer (or
//!    is sequence 0 of a producer it does not know), answers a resend of one
//!    of the last five with the offsets it got the first time, and refuses
//!    the rest — out of order, or unknown producer — which the producer
//!    retries in order (after an unknown-producer answer, and after a batch
//!    that failed for good, under a new producer id from sequence 0). So up
//!    to [`IDEMPOTENT_MAX_IN_FLIGHT`] requests per partition are pipelined
//!    (the default) and a retry never reorders records nor duplicates
//!    them — also across a leader restart or a failover (every replica
//!    keeps the producer table, snapshotted beside its segments). Two cases
//!    stay at least once: a batch that failed for good and is sent again
//!    by the application, and a resend after the partition forgot the
//!    producer (`UnknownProducer`: idle ten minutes while the partition was
//!    full of others; the broker refuses new producers with
//!    `TooManyProducers` rather than forget an active one). Without
//!    idempotence keep `max_in_flight_per_partition` at 1 where per-key
//!    order matters.
//! 6. **Requests.** One batch per partition in a produce request (the
//!    broker appends a partition's batches one at a time, so only a lone
//!    batch's offsets follow from the base it reports; the producer checks
//!    the count), and the batches of every partition whose leader is served
//!    by the same connection ride in one request — with a linger, also
//!    those still lingering (Kafka's drain of a ready node: one request per
//!    connection per linger, however many partitions receive records). A
//!    connection takes at most
//!    [`ProducerConfig::max_requests_per_connection`] produce requests at a
//!    time; batches for it wait meanwhile and go together in the next one,
//!    so with many partitions the requests grow (and their number falls)
//!    exactly as fast as the broker falls behind — a partition's batches
//!    across requests, a connection's partitions within one (Kafka's
//!    `max.in.flight.requests.per.connection`). A request
//!    unanswered for [`crate::connection::RESPONSE_TIMEOUT`] fails its
//!    connection, and with it every request on it, which are then retried.
//!
//! Threads: with linger 0 and acks 1 or all, the calling thread writes an
//! idle partition's small batch itself (a blocking socket write of at most
//! one batch: the lowest latency); everything else — and with acks=0
//! everything, as a request without an answer leaves its partition idle
//! again at once — is written by the sender thread, while the caller's
//! records gather into the next batch. With more
//! than one request in flight per partition, those two writers may swap two
//! batches of a partition on the wire: an idempotent producer's leader
//! refuses the second-sequence one and it is resent after the first;
//! without idempotence that would reorder them. [`Producer::flush`] waits for the records enqueued before
//! it (each record has a sequence number; the producer keeps the first one
//! of every unfinished batch in order).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use strand_wire::batch::{BatchBuilder, HEADER_LEN};
use strand_wire::{partition_for_key, Api, ErrorCode};

use crate::cluster::{Cluster, QueueInfo, METADATA_MAX_AGE};
use crate::error::ClientError;
use crate::requests;

/// How many replicas must have a record before it counts as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// Fire and forget: done once written to the socket (no offset).
    None,
    /// The leader stored it (per the queue's fsync policy).
    Leader,
    /// Every in-sync replica stored it.
    All,
}

impl std::str::FromStr for Acks {
    type Err = String;

    /// `0`, `1`, or `all` (also `-1`), as the CLI and the bench take it.
    fn from_str(text: &str) -> Result<Acks, String> {
        match text {
            "0" => Ok(Acks::None),
            "1" => Ok(Acks::Leader),
            "all" | "-1" => Ok(Acks::All),
            other => Err(format!("--acks must be 0, 1 or all, not {other:?}")),
        }
    }
}

impl Acks {
    fn wire(self) -> i8 {
        match self {
            Acks::None => 0,
            Acks::Leader => 1,
            Acks::All => -1,
        }
    }
}

/// What `enqueue` does when the buffer is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Wait until acknowledgements free room (backpressure).
    Wait,
    /// Fail at once with [`ClientError::BufferFull`].
    Fail,
}

/// Producer settings.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    pub acks: Acks,
    /// A batch is sent once it holds this many bytes (capped by the queue's
    /// largest message).
    pub batch_bytes: usize,
    /// The longest a record waits for its batch to fill. Zero (the
    /// default: the lowest latency) sends a batch whenever its partition
    /// has a free request slot, so under load a batch holds what gathered
    /// while the requests before it were out: 1 MiB batches averaged
    /// 0.3–0.6 MiB at ~1 GB/s over four partitions. A few milliseconds (5
    /// is Kafka 4's default) fill them, with fewer requests for the same
    /// bytes: `strand-bench client` measured full batches and 1.26–1.72
    /// CPU s/GiB for the whole machine (broker included) with 5 ms, against
    /// 1.44–1.95 with 0 (bench/results/history.md, seventh session).
    /// [`ProducerStats::average_batch_bytes_since`] tells the batch size
    /// reached. Whenever a connection gets a request (a batch full, or its
    /// linger run out), the open batches of the other partitions it serves
    /// ride in it at once (Kafka's drain): with many partitions each
    /// receiving a record now and then, a linger of a few milliseconds
    /// makes one request per connection per linger, not one per record —
    /// the daily load (100 partitions, 11,600 records/s) went from 11,000
    /// produce requests a second to 740 with 5 ms, its journal broker from
    /// 1.16 to 0.41 cores (medians of three: bench/README.md (6)).
    pub linger: Duration,
    /// Bytes of records enqueued but not yet acknowledged, at most. Open
    /// batches also reserve their memory up front within this budget (all
    /// together at most `buffer_bytes`, plus 4 KiB each), so the producer's
    /// memory is about twice this at worst.
    pub buffer_bytes: usize,
    pub when_full: WhenFull,
    /// Requests out per partition (pipelining: the next batch goes while
    /// the broker stores the last). With `idempotence`, at most
    /// [`IDEMPOTENT_MAX_IN_FLIGHT`]; without it, above 1 a retry may reorder
    /// records.
    pub max_in_flight_per_partition: usize,
    /// Produce requests out per connection (one per broker shard, or per
    /// lane). While a connection has this many unanswered, batches for the
    /// partitions it serves wait, and then go together in one request: with
    /// 100 partitions and records trickling into each, that is what keeps
    /// the broker from handling (and answering) one request per record.
    /// Partitions stay independent within a request: each is stored and
    /// answered on its own. The count is read when a batch is taken, so a
    /// request from the calling thread and one from the sender thread may
    /// pass it together by one.
    pub max_requests_per_connection: usize,
    /// Stamp batches with a producer id and per-partition sequences, so the
    /// partition's leader stores each batch once and in order whatever is
    /// retried or pipelined (see `strand_storage::producers`; not
    /// with `Acks::None`, which gets no answers to retry on).
    pub idempotence: bool,
    pub retry_backoff: Duration,
    pub retry_backoff_max: Duration,
    /// A record that is not acknowledged this long after enqueue fails.
    pub delivery_timeout: Duration,
    /// The broker's time limit for a request (replication waits); never
    /// past what the batch has left of its `delivery_timeout`.
    pub request_timeout: Duration,
    /// A connect gives up on a broker after this and tries the next one
    /// it knows (see [`crate::Timeouts`]).
    pub connect_timeout: Duration,
    /// A metadata request (and a new connection's first answer) gives up
    /// on a broker after this and asks the next one it knows; a produce
    /// request out this long has its queue's metadata asked for again, and
    /// goes to the new leader if the old one was replaced meanwhile (a
    /// paused or cut-off leader answers nothing: waiting for the request's
    /// own timeout held every produce for it).
    pub metadata_timeout: Duration,
    /// Connections to a broker that does not report its shards; partition
    /// `p` uses connection `p mod connections_per_broker`. (A broker that
    /// does gets one connection per shard, each served by its shard: see
    /// `crate::cluster`.)
    pub connections_per_broker: usize,
    /// While requests are unanswered, each connection's reader polls the
    /// socket this long before sleeping: lower latency for a core's time.
    /// Zero (the default) never spins.
    pub busy_poll: Duration,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            acks: Acks::All,
            batch_bytes: 256 << 10,
            linger: Duration::ZERO,
            buffer_bytes: 64 << 20,
            when_full: WhenFull::Wait,
            max_in_flight_per_partition: IDEMPOTENT_MAX_IN_FLIGHT,
            max_requests_per_connection: DEFAULT_MAX_REQUESTS_PER_CONNECTION,
            idempotence: true,
            retry_backoff: Duration::from_millis(50),
            retry_backoff_max: Duration::from_secs(1),
            delivery_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(2),
            metadata_timeout: Duration::from_secs(2),
            connections_per_broker: 1,
            busy_poll: Duration::ZERO,
        }
    }
}

/// Where a record was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub partition: u32,
    /// `None` only with [`Acks::None`].
    pub offset: Option<u64>,
}

/// The fate of one batch, shared by its records' [`Delivery`] futures: one
/// allocation and one completion per batch, not per record.
struct Outcome {
    partition: u32,
    state: Mutex<OutcomeState>,
}

/// Runs once with a record's result, on the thread that completes it.
type Callback = Box<dyn FnOnce(Result<Delivered, ClientError>) + Send>;

#[derive(Default)]
struct OutcomeState {
    /// The base offset (`None` for acks=0), or the failure.
    result: Option<Result<Option<u64>, ClientError>>,
    wakers: Vec<Waker>,
    /// Callbacks with their records' places in the batch.
    callbacks: Vec<(u32, Callback)>,
}

impl Outcome {
    fn new(partition: u32) -> Arc<Outcome> {
        Arc::new(Outcome {
            partition,
            state: Mutex::default(),
        })
    }

    fn finish(&self, result: Result<Option<u64>, ClientError>) {
        let (wakers, callbacks) = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.result = Some(result.clone());
            (std::mem::take(&mut st.wakers), std::mem::take(&mut st.callbacks))
        };
        for (index, f) in callbacks {
            f(self.delivered(&result, index));
        }
        for w in wakers {
            w.wake();
        }
    }

    fn delivered(&self, result: &Result<Option<u64>, ClientError>, index: u32) -> Result<Delivered, ClientError> {
        match result {
            Ok(base) => Ok(Delivered {
                partition: self.partition,
                offset: base.map(|b| b + u64::from(index)),
            }),
            Err(e) => Err(e.clone()),
        }
    }
}

/// The future of one record's acknowledgement.
pub struct Delivery {
    outcome: Arc<Outcome>,
    /// The record's place in its batch.
    index: u32,
}

impl Delivery {
    /// Calls `f` with the result instead of being awaited — at once if it
    /// is known, else on the thread that learns it (a connection's reader:
    /// keep `f` short). The lowest-latency way to hear of an ack, as no
    /// other thread has to be woken first. `f` must not block (and must not
    /// wait on this producer's buffer): it may run on a connection's reader
    /// thread or with the producer's state locked.
    pub fn on_done(self, f: impl FnOnce(Result<Delivered, ClientError>) + Send + 'static) {
        let mut st = self.outcome.state.lock().unwrap_or_else(|p| p.into_inner());
        match &st.result {
            Some(result) => {
                let result = self.outcome.delivered(result, self.index);
                drop(st);
                f(result);
            }
            None => st.callbacks.push((self.index, Box::new(f))),
        }
    }
}

impl Future for Delivery {
    type Output = Result<Delivered, ClientError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = self.outcome.state.lock().unwrap_or_else(|p| p.into_inner());
        match &st.result {
            Some(result) => Poll::Ready(self.outcome.delivered(result, self.index)),
            None => {
                if !st.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    st.wakers.push(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

/// A producer: cheap to clone, all clones share one buffer and sender
/// thread. Dropping the last clone stops the sender thread; records not yet
/// sent then fail with [`ClientError::Closed`] (call [`Producer::flush`]
/// first to wait for them).
#[derive(Clone)]
pub struct Producer {
    handle: Arc<Handle>,
}

struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_all();
    }
}

struct Shared {
    cluster: Arc<Cluster>,
    config: ProducerConfig,
    state: Mutex<State>,
    /// Wakes the sender thread.
    wake: Condvar,
    /// Capacity the open batches reserved up front, all together
    /// ([`Reservation`]).
    reserved: Arc<AtomicUsize>,
}

/// The hash of the per-record queue lookups (two per record): eight bytes
/// per multiply, then a final mix so that the top bits (hashbrown's tags)
/// and the low bits (its buckets) both depend on every byte. A queue name
/// hashes in a few nanoseconds (FNV-1a, a multiply per byte, cost the
/// producer's thread ~10 % of its time at a million records a second; SipHash
/// more). No one outside picks these keys, so no flooding resistance.
#[derive(Default)]
struct NameHash(u64);

const NAME_HASH_K: u64 = 0x9E37_79B9_7F4A_7C15;

impl std::hash::Hasher for NameHash {
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        h ^ (h >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            h = (h ^ u64::from_le_bytes(word)).wrapping_mul(NAME_HASH_K).rotate_left(31);
        }
        let rest = words.remainder();
        // The length goes into the last word: "a" and "a\0" differ.
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        let last = u64::from_le_bytes(word) ^ ((bytes.len() as u64) << 56);
        self.0 = (h ^ last).wrapping_mul(NAME_HASH_K).rotate_left(31);
    }
}

type QueueMap = HashMap<String, QueueState, std::hash::BuildHasherDefault<NameHash>>;

#[derive(Default)]
struct State {
    queues: QueueMap,
    /// Bytes of records enqueued and not yet completed.
    buffered: usize,
    space_waiters: Vec<Waker>,
    flush_waiters: Vec<Waker>,
    /// Records enqueued so far (the next record's sequence number).
    next_seq: u64,
    /// The first record's sequence number of every batch not yet done: a
    /// flush that began when `next_seq` was S is done once none is below S.
    incomplete: BTreeSet<u64>,
    /// Open batches whose first record is below this go regardless of
    /// linger (a flush is waiting for them).
    flush_until: u64,
    /// Queues whose metadata must be asked for again before sending.
    stale: HashSet<String>,
    /// When a queue's metadata was last asked for because a request of it
    /// waited past the metadata timeout (at most once per timeout).
    watched: HashMap<String, Instant>,
    /// A batch could go but for its connection's request limit: the next
    /// response wakes the sender thread.
    waiting_for_connection: bool,
    /// This producer's produce requests out per connection: what
    /// `max_requests_per_connection` limits ([`RequestsOut`]).
    requests_out: RequestsOut,
    stats: ProducerStats,
    closed: bool,
}

/// This producer's produce requests written and not yet answered (nor
/// failed), per connection ([`crate::connection::Connection::id`]).
/// Counted under the state lock, so every answer that frees a slot is seen
/// (`Shared::finish`); a connection's other requests (metadata) do not
/// count. A request is counted once written and uncounted when answered,
/// and the answer may come first: a count may be -1 for a moment. Only
/// connections with a count other than 0 have an entry (a handful: one per
/// broker shard at most), so a linear search serves the per-record look.
#[derive(Default)]
struct RequestsOut(Vec<(usize, i64)>);

impl RequestsOut {
    /// Connection `id`'s requests out.
    fn of(&self, id: usize) -> i64 {
        self.0.iter().find(|(c, _)| *c == id).map_or(0, |(_, n)| *n)
    }

    /// Adds `n` (1: written, -1: answered) to connection `id`'s count.
    fn add(&mut self, id: usize, n: i64) {
        match self.0.iter().position(|(c, _)| *c == id) {
            Some(i) => {
                self.0[i].1 += n;
                if self.0[i].1 == 0 {
                    self.0.swap_remove(i);
                }
            }
            None => self.0.push((id, n)),
        }
    }
}

/// What a producer has sent so far ([`Producer::stats`]): the batch size it
/// reaches shows whether `batch_bytes` and `linger` work as meant (Kafka's
/// `batch-size-avg`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProducerStats {
    /// Produce requests sent, each with the batches of one or more
    /// partitions (resends included; a request whose connection failed
    /// before it was written counts too).
    pub requests: u64,
    /// Batches in them (one per partition and request).
    pub batches: u64,
    /// Bytes of the batches.
    pub batch_bytes: u64,
    /// Records in them (a resend counts its records again).
    pub records: u64,
    /// Resends of batches after a retriable failure.
    pub retries: u64,
}

impl ProducerStats {
    /// The average batch sent between `earlier` and `self`, in bytes (0 if
    /// none).
    pub fn average_batch_bytes_since(&self, earlier: &ProducerStats) -> u64 {
        let batches = self.batches.saturating_sub(earlier.batches);
        self.batch_bytes.saturating_sub(earlier.batch_bytes) / batches.max(1)
    }
}

struct QueueState {
    info: Arc<QueueInfo>,
    sticky: u32,
    parts: Vec<PartState>,
}

#[derive(Default)]
struct PartState {
    open: Option<OpenBatch>,
    ready: VecDeque<ReadyBatch>,
    in_flight: usize,
    /// The size the last closed batch reached: the next one starts with that
    /// much room (a stream of full batches never grows one by doubling).
    last_batch_bytes: usize,
    /// A batch of this partition is being written to its connection: the
    /// next waits, so batches reach the socket in the order they were taken
    /// (the calling thread and the sender thread both write).
    writing: bool,
    /// Idempotence: the producer id this partition's batches go out under
    /// and the next batch's base sequence; `None` until the first send, and
    /// again after a batch failed for good (the next send starts a new id).
    sequence: Option<(i64, i32)>,
    /// The connection its last request went to (its id): whether it may
    /// send now depends on that connection's requests out
    /// (`State::requests_out`). A leader that moved is found again when
    /// the batch is written.
    lane: Option<usize>,
    /// When each request in flight was taken, oldest first: one out past
    /// the metadata timeout has the queue's metadata asked for again, and
    /// a leader that moved meanwhile has its connection abandoned
    /// (`sender_loop`).
    sent_at: VecDeque<Instant>,
}

impl PartState {
    /// Closes the open batch, if any, noting its size.
    fn close_open(&mut self) -> Option<ReadyBatch> {
        let open = self.open.take()?;
        self.last_batch_bytes = open.builder.size_bytes();
        Some(open.close())
    }
}

struct OpenBatch {
    builder: BatchBuilder,
    /// The capacity it reserved when it opened (released when it closes).
    _reserved: Reservation,
    /// The sequence number of its first record.
    first_seq: u64,
    since: Instant,
    deadline: Instant,
    outcome: Arc<Outcome>,
    accounted: usize,
}

struct ReadyBatch {
    bytes: Bytes,
    /// CRC-32 of the records (restamping the producer fields needs it).
    records_crc: u32,
    /// The (producer id, base sequence) it was last sent with, if idempotent.
    stamp: Option<(i64, i32)>,
    first_seq: u64,
    outcome: Arc<Outcome>,
    records: usize,
    accounted: usize,
    attempts: u32,
    not_before: Instant,
    deadline: Instant,
    /// Why its last attempt failed (it waits to be sent again): what its
    /// failure says if its delivery timeout runs out before then.
    last_error: Option<ClientError>,
}

impl ReadyBatch {
    /// Writes the idempotent producer's id and base sequence into the batch
    /// (O(header): see `strand_wire::batch::set_producer`).
    fn stamp(&mut self, producer_id: i64, sequence: i32) {
        let bytes = std::mem::take(&mut self.bytes);
        // Unshared unless a request carrying it is still in the works.
        let mut buf = bytes
            .try_into_mut()
            .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
        strand_wire::batch::set_producer(&mut buf, producer_id, 0, sequence, self.records_crc);
        self.bytes = buf.freeze();
        self.stamp = Some((producer_id, sequence));
    }
}

/// A producer id nobody else uses, in all likelihood: 63 random bits (std's
/// hasher keys are random per process and per call).
fn random_producer_id() -> i64 {
    (crate::random_u64() >> 1) as i64
}

/// `seq + n` in the sequence space `0..=i32::MAX`.
fn next_sequence(seq: i32, n: usize) -> i32 {
    ((seq as u64 + n as u64) % (i32::MAX as u64 + 1)) as i32
}

impl OpenBatch {
    fn close(self) -> ReadyBatch {
        let records = self.builder.len() as usize;
        let (bytes, records_crc) = self.builder.build_with_records_crc();
        ReadyBatch {
            records,
            first_seq: self.first_seq,
            bytes: bytes.freeze(),
            records_crc,
            stamp: None,
            outcome: self.outcome,
            accounted: self.accounted,
            attempts: 0,
            not_before: self.since,
            last_error: None,
            deadline: self.deadline,
        }
    }
}

/// Capacity an open batch reserved before its records came, counted in
/// [`Shared::reserved`] from the batch's start until it closes. A batch
/// that will fill reserves its whole size, and the open batches together
/// reserve at most `buffer_bytes` (plus 4 KiB each): many partitions cannot
/// reserve far more memory than the buffer, and one busy partition gets its
/// whole batch up front even under backpressure. (The reservation used to be
/// limited by the buffer's free room, which backpressure keeps near zero:
/// every batch started at 4 KiB and grew by doubling, and the reallocations
/// copied for ~7 % of the enqueuing thread's time at a million records a
/// second.)
struct Reservation {
    bytes: usize,
    total: Arc<AtomicUsize>,
}

impl Reservation {
    fn new(bytes: usize, total: &Arc<AtomicUsize>) -> Reservation {
        total.fetch_add(bytes, Ordering::Relaxed);
        Reservation {
            bytes,
            total: total.clone(),
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.total.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// A batch on its way to its partition's leader.
struct Outgoing {
    partition: u32,
    /// The queue (its name is the key in `State::queues`).
    info: Arc<QueueInfo>,
    batch: ReadyBatch,
}

/// Most requests an idempotent producer has out per partition: the batches
/// a partition's leader remembers per producer to answer a retry.
pub const IDEMPOTENT_MAX_IN_FLIGHT: usize = 5;

/// [`ProducerConfig::max_requests_per_connection`]'s default.
pub const DEFAULT_MAX_REQUESTS_PER_CONNECTION: usize = 5;

/// Most bytes of batches one produce request carries (one batch at least,
/// whatever its size): well inside a broker's frame limit (16 MiB by
/// default), so that gathering many partitions' batches never makes a
/// request the broker refuses.
const REQUEST_BYTES_MAX: usize = 4 << 20;

/// Most partitions one produce request carries (the broker takes up to
/// 10,000).
const REQUEST_PARTITIONS_MAX: usize = 1000;

/// Most a new batch allocates before its first record.
const MAX_PREALLOCATED: usize = 4 << 20;

/// Largest batch the enqueuing thread writes to the socket itself.
const INLINE_SEND_MAX: usize = 64 << 10;

/// The size of the batch a partition would send next, if it has one.
fn next_batch_bytes(part: &PartState) -> Option<usize> {
    match (part.ready.front(), &part.open) {
        (Some(b), _) => Some(b.bytes.len()),
        (None, Some(o)) => Some(o.builder.size_bytes()),
        (None, None) => None,
    }
}

/// The connection a partition's last request went to (`PartState::lane`).
fn lane_of(st: &State, queue: &str, partition: u32) -> Option<usize> {
    st.queues
        .get(queue)
        .and_then(|q| q.parts.get(partition as usize))
        .and_then(|p| p.lane)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Producer {
    /// A producer for the cluster at `brokers` (`HOST:PORT[,HOST:PORT...]`).
    /// Connects on first use.
    pub fn new(brokers: &str, config: ProducerConfig) -> Result<Producer, ClientError> {
        if config.batch_bytes == 0
            || config.buffer_bytes == 0
            || config.max_in_flight_per_partition == 0
            || config.max_requests_per_connection == 0
        {
            return Err(ClientError::Invalid(
                "batch_bytes, buffer_bytes, max_in_flight_per_partition and max_requests_per_connection must be \
                 above 0"
                    .into(),
            ));
        }
        if config.idempotence && config.max_in_flight_per_partition > IDEMPOTENT_MAX_IN_FLIGHT {
            return Err(ClientError::Invalid(format!(
                "max_in_flight_per_partition {} is over {IDEMPOTENT_MAX_IN_FLIGHT}, the most an idempotent \
                 producer may pipeline (the broker remembers that many batches per producer)",
                config.max_in_flight_per_partition
            )));
        }
        let shared = Arc::new(Shared {
            cluster: Cluster::with_settings(
                brokers,
                config.busy_poll,
                crate::Timeouts {
                    connect: config.connect_timeout,
                    metadata: config.metadata_timeout,
                },
            )?,
            config,
            state: Mutex::default(),
            wake: Condvar::new(),
            reserved: Arc::default(),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("strand-producer".into())
            .spawn(move || sender_loop(&s))
            .map_err(|e| ClientError::Invalid(format!("cannot start the sender thread: {e}")))?;
        Ok(Producer {
            handle: Arc::new(Handle { shared }),
        })
    }

    /// Sends a record and waits for its acknowledgement.
    pub async fn send(
        &self,
        queue: &str,
        key: Option<&[u8]>,
        value: &[u8],
        headers: &[(&str, &[u8])],
    ) -> Result<Delivered, ClientError> {
        self.enqueue(queue, key, value, headers).await?.await
    }

    /// Puts a record into its partition's batch (waiting for buffer room if
    /// it is full and [`WhenFull::Wait`]) and returns the future of its
    /// acknowledgement. Records enqueued one after another by one task are
    /// stored in that order within their partition.
    pub async fn enqueue(
        &self,
        queue: &str,
        key: Option<&[u8]>,
        value: &[u8],
        headers: &[(&str, &[u8])],
    ) -> Result<Delivery, ClientError> {
        let shared = &self.handle.shared;
        let headers: Vec<(&[u8], Option<&[u8]>)> = headers.iter().map(|(k, v)| (k.as_bytes(), Some(*v))).collect();
        let size = BatchBuilder::record_size(key, Some(value), &headers);
        let mut record = Some((key, value, headers));
        loop {
            // One lock per record: the producer's own copy of the queue's
            // metadata (the sender thread refreshes it) is read under it.
            let step = futures_lite::future::poll_fn(|cx| shared.try_append(cx, queue, &mut record, size)).await;
            match step {
                Some(done) => return done,
                // A queue new to this producer: the cluster's cache, or a
                // Metadata request, then try again.
                None => {
                    let info = shared.cluster.queue(queue).await?;
                    shared.install(&mut shared.lock(), &info);
                }
            }
        }
    }

    /// Sends every open batch now and waits until every record enqueued
    /// before the call is acknowledged or failed (records enqueued meanwhile
    /// do not hold it up).
    pub async fn flush(&self) {
        let shared = &self.handle.shared;
        let target = {
            let mut st = shared.lock();
            st.flush_until = st.flush_until.max(st.next_seq);
            st.next_seq
        };
        shared.wake.notify_one();
        futures_lite::future::poll_fn(|cx| {
            let mut st = shared.lock();
            if st.closed || st.incomplete.first().is_none_or(|&first| first >= target) {
                return Poll::Ready(());
            }
            st.flush_waiters.push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Bytes of records enqueued and not yet acknowledged.
    pub fn buffered_bytes(&self) -> usize {
        self.handle.shared.lock().buffered
    }

    /// What the producer has sent so far.
    pub fn stats(&self) -> ProducerStats {
        self.handle.shared.lock().stats
    }
}

/// A record on its way into a batch: key, value, headers.
type Record<'a> = (Option<&'a [u8]>, &'a [u8], Vec<(&'a [u8], Option<&'a [u8]>)>);

impl Shared {
    /// [`Producer::enqueue`]'s step under the lock: `None` if the producer
    /// does not know the queue yet, else the outcome (`record` taken), or
    /// pending until the buffer has room.
    fn try_append(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        queue: &str,
        record: &mut Option<Record<'_>>,
        size: usize,
    ) -> Poll<Option<Result<Delivery, ClientError>>> {
        let mut st = self.lock();
        if st.closed {
            return Poll::Ready(Some(Err(ClientError::Closed)));
        }
        let Some(max_message_bytes) = st.queues.get(queue).map(|q| q.info.max_message_bytes) else {
            return Poll::Ready(None);
        };
        let limit = (max_message_bytes as usize).min(self.config.buffer_bytes);
        if size + HEADER_LEN > limit {
            return Poll::Ready(Some(Err(ClientError::MessageTooLarge {
                bytes: size + HEADER_LEN,
                limit,
            })));
        }
        if st.buffered > 0 && st.buffered + size > self.config.buffer_bytes {
            if self.config.when_full == WhenFull::Fail {
                return Poll::Ready(Some(Err(ClientError::BufferFull {
                    buffered: st.buffered,
                    limit: self.config.buffer_bytes,
                })));
            }
            st.space_waiters.push(cx.waker().clone());
            return Poll::Pending;
        }
        let Some((key, value, headers)) = record.take() else {
            return Poll::Ready(Some(Err(ClientError::Closed)));
        };
        let Some((partition, delivery, news, sendable)) = self.append(&mut st, queue, key, value, &headers, size)
        else {
            unreachable!("the queue was found above, under the same lock")
        };
        // With no linger, an idle partition sends a small batch at once
        // from here (the lowest latency); a large one goes through the
        // sender thread, so copying it into the socket overlaps the
        // building of the next. So does every batch with acks=0: such a
        // request is done once written, so the partition is idle again at
        // once, and writing inline would cost a system call per record
        // (batches form only while the sender thread writes).
        let inline = match sendable {
            Some(bytes)
                if bytes <= INLINE_SEND_MAX && self.config.linger.is_zero() && self.config.acks != Acks::None =>
            {
                self.take_partition(&mut st, queue, partition, Instant::now(), false)
            }
            // (A notify is a futex syscall: once per batch, not per record.)
            Some(_) if news => {
                self.wake.notify_one();
                None
            }
            _ => None,
        };
        drop(st);
        if let Some(out) = inline {
            self.dispatch(vec![out]);
        }
        Poll::Ready(Some(Ok(delivery)))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update keeps the state whole before it can panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a queue's metadata into the producer's copy: a queue new to it,
    /// or newer metadata (leaders) of one it has, unless that has fewer
    /// partitions (partitions are never taken away from under batches).
    fn install(&self, st: &mut State, info: &Arc<QueueInfo>) {
        match st.queues.get_mut(&info.name) {
            Some(qs) if qs.info.partitions() <= info.partitions() => qs.info = info.clone(),
            Some(_) => {}
            None => {
                st.queues.insert(
                    info.name.clone(),
                    QueueState {
                        info: info.clone(),
                        sticky: (now_ms() as u32) % info.partitions(),
                        parts: Vec::new(),
                    },
                );
            }
        }
    }

    /// Adds a record to its partition's open batch; returns the partition,
    /// the record's delivery, whether a batch started or closed, and what
    /// the partition could send now (`next_batch_bytes`); `None` if
    /// the producer does not know the queue ([`Shared::install`]).
    fn append(
        &self,
        st: &mut State,
        queue: &str,
        key: Option<&[u8]>,
        value: &[u8],
        headers: &[(&[u8], Option<&[u8]>)],
        size: usize,
    ) -> Option<(u32, Delivery, bool, Option<usize>)> {
        let cfg = &self.config;
        let qs = st.queues.get_mut(queue)?;
        let batch_limit = cfg
            .batch_bytes
            .min(qs.info.max_message_bytes as usize)
            .max(HEADER_LEN + 1);
        let partitions = qs.info.partitions();
        if qs.parts.len() != partitions as usize {
            qs.parts.resize_with(partitions as usize, PartState::default);
        }
        let fits = |p: &PartState| {
            p.open
                .as_ref()
                .is_none_or(|o| o.builder.size_bytes() + size <= batch_limit)
        };
        let partition = match key {
            Some(k) => partition_for_key(k, partitions),
            None => {
                if !fits(&qs.parts[qs.sticky as usize]) {
                    // The sticky batch is full: close it, move on.
                    let part = &mut qs.parts[qs.sticky as usize];
                    if let Some(closed) = part.close_open() {
                        part.ready.push_back(closed);
                    }
                    qs.sticky = (qs.sticky + 1) % partitions;
                }
                qs.sticky
            }
        };
        let part = &mut qs.parts[partition as usize];
        if !fits(part) {
            if let Some(closed) = part.close_open() {
                part.ready.push_back(closed);
            }
        }
        // A batch that will fill (its partition is busy, or there is a
        // linger) gets its whole size up front: growing by doubling copied
        // and page-faulted about as much again as the batch itself. One that
        // may leave at once starts as large as the partition's last batch.
        let fills = part.in_flight >= cfg.max_in_flight_per_partition || !cfg.linger.is_zero();
        let wanted = if fills { batch_limit } else { part.last_batch_bytes };
        let wanted = wanted.min(batch_limit).min(MAX_PREALLOCATED);
        // Within what the open batches together may still reserve (see
        // `Reservation`).
        let budget = cfg.buffer_bytes.saturating_sub(self.reserved.load(Ordering::Relaxed));
        let capacity = wanted.min(budget).max(4096);
        let seq = st.next_seq;
        st.next_seq += 1;
        let new_batch = part.open.is_none();
        if new_batch {
            st.incomplete.insert(seq);
        }
        let open = part.open.get_or_insert_with(|| {
            let now = Instant::now();
            let capacity = capacity.max(size + HEADER_LEN);
            OpenBatch {
                first_seq: seq,
                _reserved: Reservation::new(capacity, &self.reserved),
                builder: BatchBuilder::with_capacity(capacity),
                since: now,
                deadline: now + cfg.delivery_timeout,
                outcome: Outcome::new(partition),
                accounted: 0,
            }
        });
        let delivery = Delivery {
            outcome: open.outcome.clone(),
            index: open.builder.len(),
        };
        open.builder.push(key, Some(value), headers, now_ms());
        open.accounted += size;
        let full = open.builder.size_bytes() >= batch_limit;
        if full {
            if let Some(closed) = part.close_open() {
                part.ready.push_back(closed);
            }
            if key.is_none() {
                qs.sticky = (qs.sticky + 1) % partitions;
            }
        }
        let sendable = match self.partition_may_send(part) {
            true if self.connection_free(&st.requests_out, part) => next_batch_bytes(part),
            true => {
                // It goes once its connection answers one of its requests.
                st.waiting_for_connection = true;
                None
            }
            false => None,
        };
        st.buffered += size;
        // The sender thread cares only when a batch starts (its linger
        // clock) or closes (it can go): not about every record.
        Some((partition, delivery, new_batch || full, sendable))
    }

    /// Whether the partition itself may send a request now (something to
    /// send, and its connection's limit, [`Shared::connection_free`],
    /// aside): a free request slot, no batch of it being written, and — after
    /// a producer-id reset — no request still out under the retired id (the
    /// leader keeps no order between two ids, so those must come back and be
    /// requeued in place first; their completion wakes the sender).
    fn partition_may_send(&self, part: &PartState) -> bool {
        let cfg = &self.config;
        let draining = cfg.idempotence && cfg.acks != Acks::None && part.sequence.is_none() && part.in_flight > 0;
        part.in_flight < cfg.max_in_flight_per_partition && !part.writing && !draining
    }

    /// Whether the connection the partition last sent on takes another
    /// request now (`max_requests_per_connection`, against
    /// `State::requests_out`).
    fn connection_free(&self, requests_out: &RequestsOut, part: &PartState) -> bool {
        part.lane
            .is_none_or(|id| requests_out.of(id) < self.config.max_requests_per_connection as i64)
    }

    /// The batches of one partition that may go now, if any: ready ones
    /// first, then the open one once its linger ran out (or on flush), or
    /// at once when `riding` (a request to its connection goes anyway).
    fn take_partition(
        &self,
        st: &mut State,
        queue: &str,
        partition: u32,
        now: Instant,
        riding: bool,
    ) -> Option<Outgoing> {
        let flush_until = st.flush_until;
        let cfg = &self.config;
        let qs = st.queues.get_mut(queue)?;
        let part = qs.parts.get_mut(partition as usize)?;
        if !self.partition_may_send(part) || part.ready.front().is_some_and(|b| b.not_before > now) {
            return None;
        }
        if !self.connection_free(&st.requests_out, part) {
            // The next response wakes the sender thread for it.
            st.waiting_for_connection = true;
            return None;
        }
        // One batch of a partition per request: the broker appends a request's batches for
        // a partition one by one, so only a single batch's offsets follow
        // from the base offset it reports.
        let mut batch = None;
        if let Some(b) = part.ready.pop_front() {
            batch = Some(b);
        } else if part
            .open
            .as_ref()
            .is_some_and(|o| riding || o.first_seq < flush_until || o.since + cfg.linger <= now)
        {
            if let Some(closed) = part.close_open() {
                batch = Some(closed);
                if qs.sticky == partition {
                    qs.sticky = (qs.sticky + 1) % qs.info.partitions();
                }
            }
        }
        let mut batch = batch?;
        if cfg.idempotence && cfg.acks != Acks::None {
            // Sequences go out in send order, which is the records' order
            // (retries are put back in place). A batch sent before under
            // this id keeps its stamp: a resend the broker may recognise.
            let (id, next) = part.sequence.get_or_insert_with(|| (random_producer_id(), 0));
            if batch.stamp.map(|(stamped, _)| stamped) != Some(*id) {
                let seq = *next;
                *next = next_sequence(seq, batch.records);
                batch.stamp(*id, seq);
            }
        }
        part.in_flight += 1;
        part.sent_at.push_back(now);
        part.writing = true;
        st.stats.batches += 1;
        st.stats.batch_bytes += batch.bytes.len() as u64;
        st.stats.records += batch.records as u64;
        st.stats.retries += u64::from(batch.attempts > 0);
        Some(Outgoing {
            partition,
            info: qs.info.clone(),
            batch,
        })
    }

    /// Everything that may go now, and when to look again.
    fn take_sendable(&self, st: &mut State, now: Instant) -> (Vec<Outgoing>, Option<Instant>) {
        let mut out = Vec::new();
        let keys: Vec<(String, u32)> = st
            .queues
            .iter()
            .flat_map(|(q, qs)| {
                qs.parts
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.open.is_some() || !p.ready.is_empty())
                    .map(move |(i, _)| (q.clone(), i as u32))
            })
            .collect();
        let mut waiting = Vec::new();
        for (q, p) in keys {
            match self.take_partition(st, &q, p, now, false) {
                Some(o) => out.push(o),
                None => waiting.push((q, p)),
            }
        }
        // Open batches whose connection gets a request now ride in it,
        // their linger not run out (Kafka's drain of a ready node): with
        // many partitions each lingering on its own, every expiry would be
        // a request of one batch. (With no linger, every open batch that
        // may go has gone already.)
        if !out.is_empty() && !self.config.linger.is_zero() {
            let sending: HashSet<Option<usize>> = out.iter().map(|o| lane_of(st, &o.info.name, o.partition)).collect();
            for (q, p) in waiting {
                let lane = lane_of(st, &q, p);
                if lane.is_none() || sending.contains(&lane) {
                    out.extend(self.take_partition(st, &q, p, now, true));
                }
            }
        }
        // The next moment something may become sendable.
        let mut next: Option<Instant> = None;
        let mut blocked = false;
        for qs in st.queues.values() {
            for p in &qs.parts {
                // (A partition being written is looked at again when its
                // write ends: `dispatch` wakes the sender.)
                if !self.partition_may_send(p) {
                    continue;
                }
                // (One whose connection is at its limit, when that answers;
                // a retry still backing off too.)
                if !self.connection_free(&st.requests_out, p) {
                    blocked |= p.open.is_some() || !p.ready.is_empty();
                    continue;
                }
                let t = match (p.ready.front(), &p.open) {
                    (Some(b), _) => Some(b.not_before),
                    (None, Some(o)) => Some(o.since + self.config.linger),
                    (None, None) => None,
                };
                next = match (next, t) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        if blocked {
            st.waiting_for_connection = true;
        }
        (out, next)
    }

    /// Writes the batches taken to their partitions' leaders, one request
    /// per connection (more when they are over [`REQUEST_BYTES_MAX`] or
    /// [`REQUEST_PARTITIONS_MAX`] together); the responses complete them on
    /// the connections' reader threads. A batch already past its delivery
    /// timeout fails here instead of going.
    fn dispatch(self: &Arc<Self>, outs: Vec<Outgoing>) {
        let lanes = self.config.connections_per_broker;
        let now = Instant::now();
        let mut requests: Vec<(crate::connection::Connection, Vec<Outgoing>, usize)> = Vec::new();
        // What to mark once written: each batch's partition and its connection.
        let mut sent = Vec::with_capacity(outs.len());
        for out in outs {
            if out.batch.deadline <= now {
                sent.push((out.info.clone(), out.partition, None));
                let late = out.batch.last_error.clone().unwrap_or_else(|| {
                    ClientError::Timeout("the batch waited for its turn past its delivery timeout".into())
                });
                self.complete(out, Err(late));
                continue;
            }
            match self.cluster.leader_lane(&out.info, out.partition, lanes) {
                Ok(conn) => {
                    sent.push((out.info.clone(), out.partition, Some(conn.id())));
                    let len = out.batch.bytes.len();
                    let open = requests.iter_mut().find(|(c, batches, bytes)| {
                        c.id() == conn.id()
                            && batches.len() < REQUEST_PARTITIONS_MAX
                            && bytes + len <= REQUEST_BYTES_MAX
                    });
                    match open {
                        Some((_, batches, bytes)) => {
                            batches.push(out);
                            *bytes += len;
                        }
                        None => requests.push((conn, vec![out], len)),
                    }
                }
                Err(e) => {
                    sent.push((out.info.clone(), out.partition, None));
                    self.complete(out, Err(e));
                }
            }
        }
        let written = requests.len() as u64;
        let answered: Vec<usize> = match self.config.acks {
            Acks::None => Vec::new(),
            _ => requests.iter().map(|(conn, _, _)| conn.id()).collect(),
        };
        for (conn, batches, _) in requests {
            self.write_request(&conn, batches);
        }
        // Their bytes are in the sockets (or failed): the partitions' next
        // batches may go, and the requests count against their connections
        // (an answer that came first has taken its one off already).
        let mut st = self.lock();
        st.stats.requests += written;
        for id in answered {
            st.requests_out.add(id, 1);
        }
        let mut more = false;
        for (info, partition, conn) in sent {
            if let Some(part) = st
                .queues
                .get_mut(&info.name)
                .and_then(|q| q.parts.get_mut(partition as usize))
            {
                part.writing = false;
                if conn.is_some() {
                    part.lane = conn;
                }
                more |= !part.ready.is_empty() || part.open.is_some();
            }
        }
        drop(st);
        // (A futex call: only when something of those partitions waits.)
        if more {
            self.wake.notify_one();
        }
    }

    /// Writes one produce request with `batches` (one per partition) to
    /// `conn` (`dispatch` counts it against the connection).
    fn write_request(self: &Arc<Self>, conn: &crate::connection::Connection, batches: Vec<Outgoing>) {
        let acks = self.config.acks;
        // A record fails once its `delivery_timeout` is up: the request
        // waits (at the broker, and here for its answer) no longer than the
        // batch with the most time left has (the others are answered as
        // late as that at worst; a batch already past its time does not go:
        // `dispatch`). (A request waited the whole `request_timeout`, 30 s
        // by default, past a 10 s delivery timeout: the 29.2 s without an
        // ack in a 12-minute strand-chaos run was a produce held by a leader
        // that had been replaced.)
        let now = Instant::now();
        let left = batches
            .iter()
            .map(|b| b.batch.deadline.saturating_duration_since(now))
            .max()
            .unwrap_or_default();
        let wait = self.config.request_timeout.min(left.max(Duration::from_millis(1)));
        let timeout_ms = wait.as_millis().min(u128::from(u32::MAX)) as u32;
        let (body, tail) = {
            // Each queue once, with its partitions' batches.
            let mut queues: Vec<(&str, Vec<(u32, Bytes)>)> = Vec::new();
            for b in &batches {
                let entry = (b.partition, b.batch.bytes.clone());
                match queues.iter_mut().find(|(q, _)| *q == b.info.name) {
                    Some((_, parts)) => parts.push(entry),
                    None => queues.push((&b.info.name, vec![entry])),
                }
            }
            requests::produce_many(&queues, acks.wire(), timeout_ms)
        };
        if acks == Acks::None {
            let sent = conn.send(Api::Produce, &body, tail, None);
            for b in batches {
                self.complete(b, sent.clone().map(|()| None));
            }
            return;
        }
        let id = conn.id();
        let (me, slot) = (self.clone(), Arc::new(Mutex::new(Some(batches))));
        let s = slot.clone();
        let on_response = Box::new(move |r: Result<strand_net::Frame, ClientError>| {
            let batches = s.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(batches) = batches {
                me.complete_each(batches, r, id);
            }
        });
        let due = wait + crate::connection::RESPONSE_GRACE;
        if let Err(e) = conn.send_within(Api::Produce, &body, tail, Some(on_response), due) {
            let batches = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            let mut freed = Some(id);
            for b in batches.into_iter().flatten() {
                self.finish(b, Err(e.clone()), freed.take());
            }
        }
    }

    /// Finishes every batch of a request on connection `conn` from its
    /// response (or the failure that replaced it): each by its own
    /// partition's answer; the request's slot is free.
    fn complete_each(&self, batches: Vec<Outgoing>, response: Result<strand_net::Frame, ClientError>, conn: usize) {
        let mut results: Vec<Option<Result<(u64, u64), ClientError>>> = batches.iter().map(|_| None).collect();
        let whole = response.and_then(|frame| {
            // The broker answers in the request's order: look there first.
            let mut next = 0;
            requests::produced_each(&frame, |queue, partition, result| {
                let is = |i: usize| {
                    batches
                        .get(i)
                        .is_some_and(|b| b.partition == partition && b.info.name == queue)
                };
                let at = if is(next) {
                    Some(next)
                } else {
                    (0..batches.len()).find(|&i| is(i))
                };
                if let Some(i) = at {
                    results[i].get_or_insert(result);
                    next = i + 1;
                }
            })
        });
        let mut freed = Some(conn);
        for (b, result) in batches.into_iter().zip(results) {
            let result = match (&whole, result) {
                (Err(e), _) => Err(e.clone()),
                (Ok(()), Some(r)) => r.map(Some),
                (Ok(()), None) => Err(ClientError::Protocol(format!(
                    "the produce response does not answer partition {} of {}",
                    b.partition, b.info.name
                ))),
            };
            self.finish(b, result, freed.take());
        }
    }

    /// Finishes a request: hands out offsets, or schedules a retry, or
    /// fails the records.
    fn complete(&self, out: Outgoing, result: Result<Option<(u64, u64)>, ClientError>) {
        self.finish(out, result, None)
    }

    /// [`Shared::complete`], and with `freed` the request that carried the
    /// batch is over: one fewer out on that connection (under the same
    /// lock: the batches waiting for it are then looked at).
    fn finish(&self, out: Outgoing, result: Result<Option<(u64, u64)>, ClientError>, freed: Option<usize>) {
        let now = Instant::now();
        let mut b = out.batch;
        let result = match result {
            Ok(Some((base, last))) if last.checked_sub(base).map(|d| d + 1) != Some(b.records as u64) => Err(
                ClientError::Protocol(format!("{} records stored at offsets {base}..={last}", b.records)),
            ),
            other => other.map(|r| r.map(|(base, _)| base)),
        };
        let mut st = self.lock();
        if let Some(id) = freed {
            st.requests_out.add(id, -1);
        }
        let known = st
            .queues
            .get(&out.info.name)
            .is_some_and(|q| (out.partition as usize) < q.parts.len());
        let finished = match result {
            Err(e) if retriable(&e) && now < b.deadline && known && !st.closed => {
                if e.leader_moved() {
                    match self.cluster.leader_moved(&out.info.name, out.partition, &e) {
                        Some(info) => self.install(&mut st, &info),
                        None => {
                            st.stale.insert(out.info.name.clone());
                        }
                    }
                }
                // The leader forgot this producer id: go on under a new one
                // (unless that happened already), from sequence 0.
                if e.code() == Some(ErrorCode::UnknownProducer) {
                    if let Some(part) = st
                        .queues
                        .get_mut(&out.info.name)
                        .and_then(|q| q.parts.get_mut(out.partition as usize))
                    {
                        if b.stamp.map(|(id, _)| id) == part.sequence.map(|(id, _)| id) {
                            part.sequence = None;
                        }
                    }
                }
                b.attempts += 1;
                b.last_error = Some(e.clone());
                b.not_before =
                    now + crate::retry::backoff(b.attempts, self.config.retry_backoff, self.config.retry_backoff_max);
                if let Some(part) = st
                    .queues
                    .get_mut(&out.info.name)
                    .and_then(|q| q.parts.get_mut(out.partition as usize))
                {
                    part.in_flight = part.in_flight.saturating_sub(1);
                    part.sent_at.pop_front();
                    // Back in record order (ahead of everything after it,
                    // which may have been sent meanwhile and fail too):
                    // nothing of this partition overtakes it.
                    let at = part
                        .ready
                        .iter()
                        .position(|r| r.first_seq > b.first_seq)
                        .unwrap_or(part.ready.len());
                    part.ready.insert(at, b);
                }
                None
            }
            Err(e) if retriable(&e) && now >= b.deadline => Some((
                b,
                Err(ClientError::Timeout(format!(
                    "not acknowledged within {:?} (last error: {e})",
                    self.config.delivery_timeout
                ))),
            )),
            other => Some((b, other)),
        };
        let mut wake = Vec::new();
        // The sender thread is told only when this response gives it work:
        // a batch to retry, or the partition's next batch now that a request
        // slot is free, or batches waiting for their connection's request
        // slot (this response may have freed it). (Waking it for every
        // response cost a context switch each.)
        let for_connection = std::mem::take(&mut st.waiting_for_connection);
        let mut sender_has_work = finished.is_none() || for_connection;
        if let Some((b, result)) = &finished {
            if let Some(part) = st
                .queues
                .get_mut(&out.info.name)
                .and_then(|q| q.parts.get_mut(out.partition as usize))
            {
                part.in_flight = part.in_flight.saturating_sub(1);
                part.sent_at.pop_front();
                sender_has_work |= !part.ready.is_empty() || part.open.is_some();
                // A batch that failed for good leaves a gap the broker would
                // refuse everything after: go on under a new producer id
                // (batches sent under the old one are restamped on resend).
                let failed_stamp = b.stamp.filter(|_| result.is_err());
                if failed_stamp.is_some_and(|(id, _)| part.sequence.is_some_and(|(current, _)| current == id)) {
                    part.sequence = None;
                }
            }
            st.buffered -= b.accounted;
            st.incomplete.remove(&b.first_seq);
            wake.append(&mut st.space_waiters);
            wake.append(&mut st.flush_waiters);
        }
        drop(st);
        // Before the acknowledgements: the next batch goes out while they
        // are delivered (a batch's callbacks can take a while).
        if sender_has_work {
            self.wake.notify_one();
        }
        if let Some((b, result)) = finished {
            b.outcome.finish(result);
        }
        for w in wake {
            w.wake();
        }
    }

    /// Queues with a request out longer than the metadata timeout, not
    /// looked at for as long (their metadata is asked for again: a leader
    /// paused or cut off answers nothing, while the others name its
    /// successor), and when the next one will be due.
    fn overdue(&self, st: &mut State, now: Instant) -> (Vec<String>, Option<Instant>) {
        let after = self.config.metadata_timeout;
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (name, qs) in &st.queues {
            let Some(oldest) = qs.parts.iter().filter_map(|p| p.sent_at.front()).min() else {
                continue;
            };
            let at = match st.watched.get(name) {
                Some(last) => (*oldest + after).max(*last + after),
                None => *oldest + after,
            };
            if at <= now {
                due.push(name.clone());
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        for name in &due {
            st.watched.insert(name.clone(), now);
        }
        (due, next)
    }

    /// The connections to abandon now that `info` is the queue's metadata:
    /// those of partitions with requests out whose leader moved to another
    /// broker in a newer leader epoch (the old one is paused, cut off or
    /// replaced: its answer may never come, and the new leader takes the
    /// resend — the idempotent producer's sequence makes it no duplicate).
    fn moved_leaders(&self, st: &State, info: &QueueInfo) -> Vec<(usize, String)> {
        let Some(qs) = st.queues.get(&info.name) else {
            return Vec::new();
        };
        let mut moved = Vec::new();
        for (p, part) in qs.parts.iter().enumerate() {
            let (Some(conn), true) = (part.lane, part.in_flight > 0) else {
                continue;
            };
            let was = (qs.info.leaders.get(p), qs.info.leader_epochs.get(p));
            let now = (info.leaders.get(p), info.leader_epochs.get(p));
            if let ((Some(&old), Some(&old_epoch)), (Some(&new), Some(&epoch))) = (was, now) {
                if new != old && epoch > old_epoch && !moved.iter().any(|(c, _)| *c == conn) {
                    moved.push((
                        conn,
                        format!(
                            "{}/{p} is led by broker {new} now (leader epoch {epoch}), not {old}: its requests there \
                             are sent again",
                            info.name
                        ),
                    ));
                }
            }
        }
        moved
    }

    /// Fails every record not yet sent (the producer is gone).
    fn fail_unsent(&self, st: &mut State) {
        let mut failed = Vec::new();
        for qs in st.queues.values_mut() {
            for p in &mut qs.parts {
                let open = p.open.take().map(OpenBatch::close).into_iter();
                failed.extend(open.chain(p.ready.drain(..)));
            }
        }
        for b in failed {
            st.buffered -= b.accounted;
            st.incomplete.remove(&b.first_seq);
            b.outcome.finish(Err(ClientError::Closed));
        }
        for w in st.space_waiters.drain(..).chain(st.flush_waiters.drain(..)) {
            w.wake();
        }
    }
}

/// Whether sending again may succeed: what [`crate::retry::retriable`]
/// says, and the produce answers an idempotent producer mends by sending
/// again (out-of-order sequence, unknown producer). UnknownQueue too: the
/// queue existed at enqueue, so a broker that does not know it is
/// restarting or behind (as Kafka treats UNKNOWN_TOPIC_OR_PARTITION); a
/// deleted queue fails at the timeout.
fn retriable(e: &ClientError) -> bool {
    crate::retry::retriable(e)
        || matches!(
            e.code(),
            Some(
                ErrorCode::UnknownQueue
                    | ErrorCode::OutOfOrderSequence
                    | ErrorCode::UnknownProducer
                    | ErrorCode::TooManyProducers
            )
        )
}

/// The sender thread: sends what lingered long enough, retries after their
/// backoff, refreshes stale metadata; sleeps until the next of those moments
/// or until woken.
fn sender_loop(shared: &Arc<Shared>) {
    let mut last_refresh = Instant::now();
    loop {
        let (outgoing, stale) = {
            let mut st = shared.lock();
            loop {
                if st.closed {
                    shared.fail_unsent(&mut st);
                    return;
                }
                // Now and then every queue's metadata is asked for again, so
                // added partitions get used (enqueue reads only our copy).
                let refresh_due = last_refresh + METADATA_MAX_AGE;
                if Instant::now() >= refresh_due {
                    let names: Vec<String> = st.queues.keys().cloned().collect();
                    st.stale.extend(names);
                    last_refresh = Instant::now();
                }
                // A request out past the metadata timeout: has its leader
                // moved?
                let (overdue, watch) = shared.overdue(&mut st, Instant::now());
                st.stale.extend(overdue);
                // Metadata first: batches taken now would hold their
                // partitions' write turn through the refresh.
                let stale: Vec<String> = st.stale.drain().collect();
                if !stale.is_empty() {
                    break (Vec::new(), stale);
                }
                let (out, next) = shared.take_sendable(&mut st, Instant::now());
                if !out.is_empty() {
                    break (out, stale);
                }
                // (At least every metadata timeout: a request written by a
                // calling thread does not wake this one, and is watched
                // from its next look.)
                let look = Instant::now() + shared.config.metadata_timeout;
                let until = [next, watch, Some(look)]
                    .into_iter()
                    .flatten()
                    .fold(refresh_due, Instant::min);
                let wait = until
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_micros(50));
                st = shared
                    .wake
                    .wait_timeout(st, wait)
                    .map_or_else(|p| p.into_inner().0, |r| r.0);
            }
        };
        for queue in stale {
            // A failed refresh leaves the old metadata; the retry's backoff
            // paces the next attempt.
            match crate::block_on(shared.cluster.refresh(&queue)) {
                // (`append` gives new partitions their state when a record
                // first goes to them.)
                Ok(info) => {
                    let moved = {
                        let mut st = shared.lock();
                        let moved = shared.moved_leaders(&st, &info);
                        shared.install(&mut st, &info);
                        moved
                    };
                    for (conn, why) in moved {
                        shared.cluster.abandon_connection(conn, &why);
                    }
                }
                // A deleted queue with nothing left to send is forgotten, so
                // the producer's state does not grow with every queue it
                // ever wrote to; the next send to it asks again.
                Err(e) if e.code() == Some(ErrorCode::UnknownQueue) => {
                    let mut st = shared.lock();
                    let idle = st.queues.get(&queue).is_some_and(|qs| {
                        qs.parts
                            .iter()
                            .all(|p| p.open.is_none() && p.ready.is_empty() && p.in_flight == 0)
                    });
                    if idle {
                        st.queues.remove(&queue);
                        shared.cluster.forget_queue(&queue);
                    }
                }
                Err(_) => {}
            }
        }
        if !outgoing.is_empty() {
            shared.dispatch(outgoing);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Shared {
        shared_with(ProducerConfig::default())
    }

    fn shared_with(config: ProducerConfig) -> Shared {
        Shared {
            cluster: Cluster::new("127.0.0.1:1").unwrap(),
            config,
            state: Mutex::default(),
            wake: Condvar::new(),
            reserved: Arc::default(),
        }
    }

    /// An open batch of `records` records begun at `since`.
    fn open_batch(first_seq: u64, records: u32, since: Instant) -> OpenBatch {
        let mut builder = BatchBuilder::new();
        for i in 0..records {
            builder.push(None, Some(&i.to_le_bytes()), &[], 0);
        }
        OpenBatch {
            builder,
            _reserved: Reservation::new(0, &Arc::default()),
            first_seq,
            since,
            deadline: since + Duration::from_secs(60),
            outcome: Outcome::new(0),
            accounted: 0,
        }
    }

    fn ready(first_seq: u64, records: u32) -> ReadyBatch {
        open_batch(first_seq, records, Instant::now()).close()
    }

    /// One queue "q" with one partition holding `batches` ready.
    fn state_with(batches: Vec<ReadyBatch>) -> State {
        let mut st = State::default();
        let info = Arc::new(QueueInfo {
            name: "q".into(),
            leaders: vec![1],
            max_message_bytes: u32::MAX,
            ..QueueInfo::default()
        });
        let mut part = PartState::default();
        part.ready.extend(batches);
        st.queues.insert(
            "q".into(),
            QueueState {
                info,
                sticky: 0,
                parts: vec![part],
            },
        );
        st
    }

    /// Issue 41, item 2: a request out past the metadata timeout has its
    /// queue looked up again (at most once per timeout), and a leader that
    /// moved to another broker in a newer epoch has the old connection
    /// abandoned — not a move back, nor a new epoch on the same broker.
    #[test]
    fn a_request_out_too_long_looks_its_leader_up_and_a_moved_one_is_abandoned() {
        let shared = shared();
        let after = shared.config.metadata_timeout;
        let mut st = state_with(Vec::new());
        let now = Instant::now();
        assert_eq!(shared.overdue(&mut st, now), (Vec::new(), None), "nothing out");
        {
            let part = &mut st.queues.get_mut("q").unwrap().parts[0];
            part.in_flight = 1;
            part.lane = Some(7);
            part.sent_at.push_back(now);
        }
        assert_eq!(shared.overdue(&mut st, now), (Vec::new(), Some(now + after)));
        let late = now + after;
        assert_eq!(shared.overdue(&mut st, late), (vec!["q".to_string()], None));
        assert_eq!(
            shared.overdue(&mut st, late + after / 2),
            (Vec::new(), Some(late + after)),
            "not again before another timeout"
        );
        let info = |leader: u32, epoch: u32| QueueInfo {
            name: "q".into(),
            leaders: vec![leader],
            leader_epochs: vec![epoch],
            ..QueueInfo::default()
        };
        st.queues.get_mut("q").unwrap().info = Arc::new(info(1, 4));
        let moved = shared.moved_leaders(&st, &info(2, 5));
        assert_eq!(moved.len(), 1);
        assert_eq!(moved[0].0, 7);
        assert!(
            moved[0].1.contains("led by broker 2 now (leader epoch 5), not 1"),
            "{}",
            moved[0].1
        );
        assert!(shared.moved_leaders(&st, &info(1, 5)).is_empty(), "the same leader");
        assert!(shared.moved_leaders(&st, &info(2, 3)).is_empty(), "an older answer");
        st.queues.get_mut("q").unwrap().parts[0].in_flight = 0;
        assert!(shared.moved_leaders(&st, &info(2, 5)).is_empty(), "nothing out there");
    }

    #[test]
    fn name_hash_tells_names_apart() {
        use std::hash::BuildHasher;
        let hasher = std::hash::BuildHasherDefault::<NameHash>::default();
        let mut names: Vec<String> = (0..2000).map(|i| format!("orders-{i}")).collect();
        names.extend(["", "a", "a\0", "\0", "12345678", "123456781", "bench-produce-0"].map(String::from));
        let hashes: HashSet<u64> = names.iter().map(|n| hasher.hash_one(n.as_str())).collect();
        assert_eq!(hashes.len(), names.len(), "a collision");
        // hashbrown's tag is the top 7 bits and its bucket the low bits:
        // both must spread.
        let tags: HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        let buckets: HashSet<u64> = hashes.iter().map(|h| h & 1023).collect();
        assert_eq!(tags.len(), 128, "top bits");
        assert!(buckets.len() > 800, "low bits: {} of 1024 buckets", buckets.len());
    }

    #[test]
    fn open_batches_reserve_at_most_the_buffer_and_release_it() {
        let buffer = 8 << 20;
        let s = shared_with(ProducerConfig {
            buffer_bytes: buffer,
            batch_bytes: 1 << 20,
            linger: Duration::from_millis(5),
            ..ProducerConfig::default()
        });
        let info = Arc::new(QueueInfo {
            name: "q".into(),
            leaders: vec![1; 64],
            max_message_bytes: u32::MAX,
            ..QueueInfo::default()
        });
        let mut st = State::default();
        s.install(&mut st, &info);
        for k in 0..1000 {
            let key = format!("k{k}");
            let size = BatchBuilder::record_size(Some(key.as_bytes()), Some(b"v"), &[]);
            assert!(s.append(&mut st, "q", Some(key.as_bytes()), b"v", &[], size).is_some());
        }
        let parts = &mut st.queues.get_mut("q").unwrap().parts;
        let open = parts.iter().filter(|p| p.open.is_some()).count();
        assert_eq!(open, 64, "every partition has a batch open");
        let reserved = s.reserved.load(Ordering::Relaxed);
        // A linger means every batch will fill: the first eight get their
        // whole 1 MiB, the rest 4 KiB.
        assert_eq!(reserved, buffer + (open - 8) * 4096);
        let closed: Vec<ReadyBatch> = parts.iter_mut().filter_map(PartState::close_open).collect();
        assert_eq!(closed.len(), 64);
        assert_eq!(s.reserved.load(Ordering::Relaxed), 0, "closing releases");
    }

    fn header(out: &Outgoing) -> strand_wire::batch::BatchHeader {
        strand_wire::batch::BatchHeader::parse(&out.batch.bytes).unwrap()
    }

    #[test]
    fn batches_are_stamped_with_consecutive_sequences_in_send_order() {
        let s = shared();
        let mut st = state_with(vec![ready(0, 3), ready(3, 2), ready(5, 4)]);
        let mut seqs = Vec::new();
        let mut id = None;
        while let Some(out) = s.take_partition(&mut st, "q", 0, Instant::now(), false) {
            let h = header(&out);
            assert!(
                strand_wire::batch::validate(&out.batch.bytes, usize::MAX).is_ok(),
                "restamped CRC"
            );
            assert_eq!(*id.get_or_insert(h.producer_id), h.producer_id, "one id");
            seqs.push(h.base_sequence);
            st.queues.get_mut("q").unwrap().parts[0].writing = false;
        }
        assert_eq!(seqs, [0, 3, 5]);
        assert!(id.unwrap() >= 0);
    }

    #[test]
    fn a_new_producer_id_waits_for_requests_under_the_old_one() {
        let s = shared();
        let mut st = state_with(vec![ready(0, 1), ready(1, 1)]);
        let first = s.take_partition(&mut st, "q", 0, Instant::now(), false).unwrap();
        let old_id = header(&first).producer_id;
        let part = &mut st.queues.get_mut("q").unwrap().parts[0];
        part.writing = false;
        // The first batch failed for good: the id is retired while the
        // partition still has a request out (in_flight 1, the first's).
        part.sequence = None;
        assert!(
            s.take_partition(&mut st, "q", 0, Instant::now(), false).is_none(),
            "sent under a new id too early"
        );
        // Its request came back: the next batch goes under a new id from 0.
        st.queues.get_mut("q").unwrap().parts[0].in_flight = 0;
        let next = s.take_partition(&mut st, "q", 0, Instant::now(), false).unwrap();
        let h = header(&next);
        assert_ne!(h.producer_id, old_id);
        assert_eq!(h.base_sequence, 0);
    }

    #[test]
    fn a_resend_under_the_same_id_keeps_its_stamp_and_one_under_a_new_id_is_restamped() {
        let s = shared();
        let mut st = state_with(vec![ready(0, 2)]);
        let out = s.take_partition(&mut st, "q", 0, Instant::now(), false).unwrap();
        let (id, seq) = (header(&out).producer_id, header(&out).base_sequence);
        let mut batch = out.batch;
        {
            let part = &mut st.queues.get_mut("q").unwrap().parts[0];
            part.writing = false;
            part.in_flight = 0;
            part.ready.push_front(batch);
        }
        let again = s.take_partition(&mut st, "q", 0, Instant::now(), false).unwrap();
        assert_eq!((header(&again).producer_id, header(&again).base_sequence), (id, seq));
        batch = again.batch;
        {
            let part = &mut st.queues.get_mut("q").unwrap().parts[0];
            part.writing = false;
            part.in_flight = 0;
            part.sequence = None; // the leader forgot the producer
            part.ready.push_front(batch);
        }
        let fresh = s.take_partition(&mut st, "q", 0, Instant::now(), false).unwrap();
        assert_ne!(header(&fresh).producer_id, id);
        assert_eq!(header(&fresh).base_sequence, 0);
        assert!(strand_wire::batch::validate(&fresh.batch.bytes, usize::MAX).is_ok());
    }

    #[test]
    fn a_connection_at_its_request_limit_holds_batches_back_and_says_so() {
        let with_limit = |max_requests_per_connection| {
            shared_with(ProducerConfig {
                max_requests_per_connection,
                ..ProducerConfig::default()
            })
        };
        let mut st = state_with(vec![ready(0, 1)]);
        // The partition's connection (id 7) has one request of ours out.
        st.queues.get_mut("q").unwrap().parts[0].lane = Some(7);
        st.requests_out.add(7, 1);
        let now = Instant::now();
        assert!(with_limit(1).take_partition(&mut st, "q", 0, now, false).is_none());
        assert!(st.waiting_for_connection, "the next response must wake the sender");
        assert!(!with_limit(1).connection_free(&st.requests_out, &st.queues["q"].parts[0]));
        // Nor does the sender thread set a timer for it: the answer wakes it.
        st.waiting_for_connection = false;
        let (taken, next) = with_limit(1).take_sendable(&mut st, now);
        assert!(taken.is_empty() && next.is_none());
        assert!(st.waiting_for_connection);
        // Answered: the slot is free and the batch goes.
        st.requests_out.add(7, -1);
        assert!(st.requests_out.0.is_empty(), "a count at 0 is dropped");
        assert!(with_limit(1).take_partition(&mut st, "q", 0, now, false).is_some());
        // An answer counted before its write: the count dips below 0 and
        // comes back.
        let mut counts = RequestsOut::default();
        counts.add(9, -1);
        assert_eq!(counts.of(9), -1);
        counts.add(9, 1);
        assert!(counts.0.is_empty());
        // A record enqueued meanwhile says so too (nothing else would wake
        // the sender thread for it).
        let mut st = state_with(vec![]);
        st.queues.get_mut("q").unwrap().parts[0].lane = Some(7);
        st.requests_out.add(7, 1);
        let size = BatchBuilder::record_size(None, Some(b"v"), &[]);
        let (_, _, _, sendable) = with_limit(1).append(&mut st, "q", None, b"v", &[], size).unwrap();
        assert!(sendable.is_none() && st.waiting_for_connection);
        // Another request allowed: it would have gone too.
        let mut st = state_with(vec![ready(0, 1)]);
        st.queues.get_mut("q").unwrap().parts[0].lane = Some(7);
        st.requests_out.add(7, 1);
        assert!(with_limit(2)
            .take_partition(&mut st, "q", 0, Instant::now(), false)
            .is_some());
    }

    #[test]
    fn open_batches_ride_in_a_request_their_connection_gets_before_their_linger_runs_out() {
        let linger = Duration::from_millis(5);
        let s = shared_with(ProducerConfig {
            linger,
            ..ProducerConfig::default()
        });
        let now = Instant::now();
        let mut st = state_with(vec![]);
        let qs = st.queues.get_mut("q").unwrap();
        // Partitions 0 and 1 went on connection 1 last, 2 on connection 2,
        // 3 never went anywhere.
        qs.parts = [Some(1), Some(1), Some(2), None]
            .into_iter()
            .enumerate()
            .map(|(i, lane)| PartState {
                lane,
                open: Some(open_batch(i as u64, 1, now)),
                ..PartState::default()
            })
            .collect();
        let taken = |outs: &[Outgoing]| outs.iter().map(|o| o.partition).collect::<Vec<_>>();
        // No linger has run out: nothing goes, and the sender looks again
        // when the first does.
        let (outs, next) = s.take_sendable(&mut st, now);
        assert!(outs.is_empty());
        assert_eq!(next, Some(now + linger));
        // Partition 0's has: its connection gets a request, and partition
        // 1's batch rides in it (and 3's, whose connection is not known);
        // partition 2's connection gets none, so its batch lingers on.
        st.queues.get_mut("q").unwrap().parts[0].open.as_mut().unwrap().since = now - linger;
        let (outs, next) = s.take_sendable(&mut st, now);
        assert_eq!(taken(&outs), [0, 1, 3]);
        assert_eq!(next, Some(now + linger), "partition 2's linger");
        let parts = &st.queues["q"].parts;
        assert!(parts[2].open.is_some() && parts.iter().filter(|p| p.open.is_some()).count() == 1);
        // With no linger there is nothing to ride: every open batch goes.
        let s = shared();
        let mut st = state_with(vec![]);
        st.queues.get_mut("q").unwrap().parts[0].open = Some(open_batch(0, 1, now));
        assert_eq!(taken(&s.take_sendable(&mut st, now).0), [0]);
    }

    #[test]
    fn stats_count_each_send_and_a_resend_as_a_retry() {
        let s = shared();
        let mut st = state_with(vec![ready(0, 2), ready(2, 3)]);
        let first = s.take_partition(&mut st, "q", 0, Instant::now(), false).unwrap();
        let len = first.batch.bytes.len() as u64;
        let mut batch = first.batch;
        // It failed retriably: `complete` counts the attempt and puts it back.
        batch.attempts += 1;
        {
            let part = &mut st.queues.get_mut("q").unwrap().parts[0];
            part.writing = false;
            part.in_flight = 0;
            part.ready.push_front(batch);
        }
        let again = s.take_partition(&mut st, "q", 0, Instant::now(), false).unwrap();
        assert_eq!(again.batch.bytes.len() as u64, len);
        st.queues.get_mut("q").unwrap().parts[0].writing = false;
        let second = s.take_partition(&mut st, "q", 0, Instant::now(), false).unwrap();
        let stats = st.stats;
        // (Requests are counted when written: `dispatch`.)
        assert_eq!((stats.batches, stats.retries, stats.records), (3, 1, 2 + 2 + 3));
        assert_eq!(stats.batch_bytes, 2 * len + second.batch.bytes.len() as u64);
        let earlier = ProducerStats {
            batches: 2,
            batch_bytes: 2 * len,
            ..ProducerStats::default()
        };
        assert_eq!(
            stats.average_batch_bytes_since(&earlier),
            second.batch.bytes.len() as u64
        );
        assert_eq!(stats.average_batch_bytes_since(&stats), 0);
    }
}
