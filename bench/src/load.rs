//! `strand-bench produce | consume | e2e`: load against running brokers
//! through strand-client, as an application sees it.
//!
//! - `produce`: `--producers` threads, each with its own [`Producer`], send
//!   `--message-bytes` records to `--queues` queues of `--partitions`
//!   partitions (created fresh with `--fsync`, unless `--queue` names an
//!   existing one) with the chosen `--keys`, `--batch-bytes`, `--linger-ms`
//!   and `--acks`, for `--seconds` or `--count` records. Without `--rate`
//!   they send as fast as the producer's buffer lets them (closed loop) and
//!   latency runs from the send call to the acknowledgement; with `--rate`
//!   (records/s over all producers) sends are due at fixed times and
//!   latency runs from the due time, so a stall counts against every record
//!   it delayed (corrected for coordinated omission).
//! - `consume`: `--consumers` threads read `--queue` from its earliest
//!   record, partitions dealt round robin, until `--count` records or
//!   `--seconds`; latency is per poll.
//! - `e2e`: consumers start at the end of fresh queues, then producers send
//!   at `--rate`; each record carries its due time, and latency runs from
//!   it to the moment a consumer hands the record out.
//! - Closed loop, for side-by-side figures with peers that report latency
//!   this way (iggy-bench with one message per batch, Kafka's
//!   EndToEndLatency): `produce --in-flight N` keeps at most N records of
//!   each producer unacknowledged, waiting for the oldest before sending
//!   the next (latency from the send to its acknowledgement);
//!   `e2e --in-flight N` (one producer, no `--rate`) sends the next record
//!   only once the consumer in this process has received all but N-1 of
//!   those sent (latency from the send to the receipt). A stall then
//!   delays the sends instead of counting against the records it would
//!   have delayed, so open-loop figures (`--rate`) stay the main ones.
//!
//! Last stdout line: JSON with `msgs_s`, `mib_s` (record values), `p50_us`,
//! `p99_us`, `p999_us`, `max_us`, `records`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use strand_client::{
    block_on, Acks, Admin, ConsumedRecord, Consumer, ConsumerConfig, FsyncSpec, Producer, ProducerConfig, QueueSpec,
    Seek,
};
use strand_wire::ErrorCode;

use crate::report::{machine_cpu_s, mib_s, round2, table, Latency};
use crate::storage::err;

/// How records are keyed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Keys {
    /// No key: sticky batches spread over the partitions.
    None,
    /// One of `n` keys, each as likely.
    Uniform(u64),
    /// One of `n` keys, key `k` (from 1) with weight `1 / k^s`: a few hot keys.
    Zipf(u64, f64),
}

impl std::str::FromStr for Keys {
    type Err = String;

    fn from_str(s: &str) -> Result<Keys, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let n = |i: usize| -> Result<u64, String> {
            parts
                .get(i)
                .and_then(|v| v.parse().ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("bad key count in {s:?}"))
        };
        match parts[0] {
            "none" if parts.len() == 1 => Ok(Keys::None),
            "uniform" if parts.len() == 2 => Ok(Keys::Uniform(n(1)?)),
            "zipf" if parts.len() == 2 || parts.len() == 3 => {
                let exponent = match parts.get(2) {
                    Some(e) => e.parse().map_err(|_| format!("bad zipf exponent in {s:?}"))?,
                    None => 1.0,
                };
                Ok(Keys::Zipf(n(1)?, exponent))
            }
            _ => Err(format!("--keys must be none, uniform:N or zipf:N[:S], not {s:?}")),
        }
    }
}

/// Draws keys per a [`Keys`] distribution (xorshift; no crate needed).
pub struct KeyGen {
    state: u64,
    keys: Keys,
    /// Zipf: cumulative weights, normalised to 1.
    cdf: Vec<f64>,
}

impl KeyGen {
    pub fn new(keys: Keys, seed: u64) -> KeyGen {
        let cdf = match keys {
            Keys::Zipf(n, s) => {
                let weights: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(s)).collect();
                let total: f64 = weights.iter().sum();
                weights
                    .iter()
                    .scan(0.0, |acc, w| {
                        *acc += w / total;
                        Some(*acc)
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        KeyGen {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            keys,
            cdf,
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    /// The next key's index, if records are keyed.
    pub fn next_index(&mut self) -> Option<u64> {
        match self.keys {
            Keys::None => None,
            Keys::Uniform(n) => Some(self.next_u64() % n),
            Keys::Zipf(..) => {
                let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                Some(self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) as u64)
            }
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub brokers: String,
    /// An existing queue to use (else fresh ones are created).
    #[arg(long)]
    pub queue: Option<String>,
    /// Fresh queues to spread the load over.
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    #[arg(long, default_value_t = 1)]
    pub partitions: u32,
    #[arg(long, default_value_t = 1)]
    pub producers: usize,
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,
    #[arg(long, default_value_t = 1000)]
    pub message_bytes: usize,
    /// none, uniform:N or zipf:N[:S].
    #[arg(long, default_value = "none")]
    pub keys: Keys,
    #[arg(long, default_value_t = 1 << 20)]
    pub batch_bytes: usize,
    #[arg(long, default_value_t = 0)]
    pub linger_ms: u64,
    /// 0, 1 or all.
    #[arg(long, default_value = "1")]
    pub acks: String,
    /// always or interval (fresh queues).
    #[arg(long, default_value = "always")]
    pub fsync: String,
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Records in total (instead of --seconds).
    #[arg(long)]
    pub count: Option<u64>,
    /// Records per second over all producers (open loop).
    #[arg(long)]
    pub rate: Option<u64>,
    /// Produce requests in flight per partition (the producer is
    /// idempotent: at most 5, and a retry never reorders records).
    #[arg(long, default_value_t = strand_client::IDEMPOTENT_MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// Produce requests in flight per connection: batches for a connection
    /// at its limit wait and go together, many partitions per request.
    #[arg(long, default_value_t = strand_client::DEFAULT_MAX_REQUESTS_PER_CONNECTION)]
    pub max_requests_per_connection: usize,
    /// Closed loop: records each producer may have unacknowledged (produce)
    /// or not yet received by the consumer (e2e, one producer); 1: one
    /// message in flight. Not with --rate.
    #[arg(long)]
    pub in_flight: Option<u64>,
    /// The broker's process id: the report then gives the broker's own CPU
    /// (`broker_cores`, from /proc/PID/stat, over the whole run), apart
    /// from the machine's.
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// consume: read the queue's first `--count` records this many times,
    /// one consumer seeking back to the start after each pass; the figures
    /// leave out a first, warm-up pass. With a backlog that fits the
    /// brokers' tail caches (16 MiB per partition) this is the rate they
    /// serve from memory. Keep `--count` a few MiB below what the queue
    /// holds: a pass that ends at the tail leaves long polls in flight, and
    /// the seek's fetch waits behind them (up to twice the 100 ms max wait).
    #[arg(long, default_value_t = 1)]
    pub passes: u32,
}

/// What one load run measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outcome {
    pub records: u64,
    pub bytes: u64,
    pub secs: f64,
    pub latency: Latency,
    /// The whole machine's CPU seconds over the same span as `secs`
    /// ([`crate::report::machine_cpu_s`]): broker, bench and kernel.
    pub cpu_s: f64,
}

impl Outcome {
    pub fn msgs_s(&self) -> f64 {
        self.records as f64 / self.secs.max(1e-9)
    }

    pub fn mib_s(&self) -> f64 {
        mib_s(self.bytes, self.secs)
    }

    /// Cores the machine kept busy on average meanwhile.
    pub fn cores_busy(&self) -> f64 {
        self.cpu_s / self.secs.max(1e-9)
    }

    /// The machine's CPU seconds per GiB of record values moved.
    pub fn cpu_s_per_gib(&self) -> f64 {
        crate::report::cpu_s_per_gib(self.cpu_s, self.bytes)
    }

    pub fn json(&self, scenario: &str) -> serde_json::Value {
        let mut m = self.latency.json("");
        m.insert("scenario".into(), scenario.into());
        m.insert("records".into(), self.records.into());
        m.insert("msgs_s".into(), round2(self.msgs_s()).into());
        m.insert("mib_s".into(), round2(self.mib_s()).into());
        m.insert("cores_busy".into(), round2(self.cores_busy()).into());
        m.insert("cpu_s_per_gib".into(), round2(self.cpu_s_per_gib()).into());
        serde_json::Value::Object(m)
    }

    pub fn print(&self, title: &str) {
        table(
            title,
            &[
                &[
                    ("records", self.records as f64, ""),
                    ("records per second", self.msgs_s(), "msg/s"),
                    ("record values", self.mib_s(), "MiB/s"),
                    ("machine CPU busy (all processes)", self.cores_busy(), "cores"),
                    ("  per GiB of record values", self.cpu_s_per_gib(), "CPU s"),
                ][..],
                &self.latency.rows("latency p50"),
            ]
            .concat(),
        );
    }
}

/// Creates a queue with a fresh name (so runs do not mix).
pub fn fresh_queue(admin: &Admin, prefix: &str, partitions: u32, fsync: FsyncSpec) -> Result<String, String> {
    for n in 0..10_000 {
        let name = format!("{prefix}-{n}");
        let spec = QueueSpec {
            partitions: Some(partitions),
            fsync: Some(fsync),
            ..QueueSpec::default()
        };
        match block_on(admin.create_queue(&name, &spec)) {
            Ok(()) => return Ok(name),
            Err(e) if e.code() == Some(ErrorCode::QueueAlreadyExists) => continue,
            Err(e) => return Err(format!("creating {name}: {e}")),
        }
    }
    Err("no free queue name".into())
}

/// The queues a run uses: `--queue`, or fresh ones.
fn queues(args: &Args, prefix: &str) -> Result<Vec<String>, String> {
    if let Some(q) = &args.queue {
        return Ok(vec![q.clone()]);
    }
    let admin = Admin::connect(&args.brokers).map_err(err)?;
    (0..args.queues.max(1))
        .map(|_| fresh_queue(&admin, prefix, args.partitions, args.fsync.parse::<FsyncSpec>()?))
        .collect()
}

/// The instant records' clock counts from (this process's first use).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since [`epoch`]: the clock records carry.
fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("constant, valid bounds")
}

/// Latencies and counts gathered from callbacks on the client's threads.
#[derive(Default)]
struct Tally {
    hist: Mutex<Option<Histogram<u64>>>,
    acked: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Tally {
    fn record(&self, nanos: u64) {
        if let Ok(mut h) = self.hist.lock() {
            h.get_or_insert_with(histogram).saturating_record(nanos);
        }
        self.acked.fetch_add(1, Ordering::Relaxed);
    }

    fn fail(&self, e: String) {
        if let Ok(mut f) = self.first_error.lock() {
            f.get_or_insert(e);
        }
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    fn latency(&self) -> Latency {
        match self.hist.lock().ok().and_then(|h| h.clone()) {
            Some(h) => Latency::from_nanos(&h),
            None => Latency::default(),
        }
    }
}

/// Sets its flag when dropped (a thread's end, however it ends).
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A record's answer, into the tally: latency from `due` if it was stored.
fn settle(tally: &Tally, due: Instant, result: Result<(), strand_client::ClientError>) {
    match result {
        Ok(()) => tally.record(due.elapsed().as_nanos() as u64),
        Err(e) => tally.fail(e.to_string()),
    }
}

/// Runs the producers until the deadline or count; returns the records and
/// value bytes acknowledged and the seconds it took, latencies in `tally`.
/// `gate(n)` runs after a producer sent its `n`th record and may hold it
/// back (the closed-loop e2e waits there for the consumer).
fn run_producers(
    args: &Args,
    queues: &[String],
    tally: &Arc<Tally>,
    stop: &AtomicBool,
    gate: &(dyn Fn(u64) + Sync),
) -> Result<(u64, f64), String> {
    if args.rate.is_some() && args.in_flight.is_some() {
        return Err("--in-flight is the closed loop, --rate the open one: give one of them".into());
    }
    if args.in_flight == Some(0) {
        return Err("--in-flight must be at least 1".into());
    }
    let acks: Acks = args.acks.parse()?;
    let producers = args.producers.max(1);
    let total = args.count;
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let start = Instant::now();
    let sent = std::thread::scope(|scope| -> Result<u64, String> {
        let handles: Vec<_> = (0..producers)
            .map(|i| {
                let tally = tally.clone();
                scope.spawn(move || -> Result<u64, String> {
                    let producer = Producer::new(
                        &args.brokers,
                        ProducerConfig {
                            acks,
                            batch_bytes: args.batch_bytes,
                            linger: Duration::from_millis(args.linger_ms),
                            max_in_flight_per_partition: args.max_in_flight.max(1),
                            max_requests_per_connection: args.max_requests_per_connection.max(1),
                            ..ProducerConfig::default()
                        },
                    )
                    .map_err(err)?;
                    let share = total.map(|t| t / producers as u64 + u64::from((i as u64) < t % producers as u64));
                    let interval = args
                        .rate
                        .map(|r| Duration::from_nanos(1_000_000_000 * producers as u64 / r.max(1)));
                    let mut keys = KeyGen::new(args.keys, i as u64 + 1);
                    let mut value = vec![b'x'; args.message_bytes.max(8)];
                    if interval.is_some() {
                        crate::report::precise_sleeps();
                    }
                    let started = Instant::now();
                    let mut n = 0u64;
                    let epoch = epoch();
                    let mut unanswered = std::collections::VecDeque::new();
                    loop {
                        // The clock is read once per record (it is not free
                        // here: a VM's clock source); the deadline every 64.
                        let timed_out = share.is_none() && n % 64 == 0 && Instant::now() >= deadline;
                        if share.is_some_and(|s| n >= s) || timed_out {
                            break;
                        }
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let due = match interval {
                            Some(iv) => {
                                let due = started + iv * n as u32;
                                // At its due time (see wait_until).
                                crate::report::wait_until(due);
                                due
                            }
                            None => Instant::now(),
                        };
                        let due_ns = due.saturating_duration_since(epoch).as_nanos() as u64;
                        value[..8].copy_from_slice(&due_ns.to_le_bytes());
                        let key = keys.next_index().map(|k| format!("key-{k}"));
                        let queue = &queues[(n as usize + i) % queues.len()];
                        let d = block_on(producer.enqueue(queue, key.as_deref().map(str::as_bytes), &value, &[]))
                            .map_err(err)?;
                        match args.in_flight {
                            // Closed loop: the oldest record's answer frees
                            // its place.
                            Some(limit) => {
                                unanswered.push_back((due, d));
                                while unanswered.len() as u64 >= limit {
                                    if let Some((due, d)) = unanswered.pop_front() {
                                        settle(&tally, due, block_on(d).map(|_| ()));
                                    }
                                }
                            }
                            None => {
                                let tally = tally.clone();
                                d.on_done(move |r| settle(&tally, due, r.map(|_| ())));
                            }
                        }
                        n += 1;
                        gate(n);
                    }
                    for (due, d) in unanswered {
                        settle(&tally, due, block_on(d).map(|_| ()));
                    }
                    block_on(producer.flush());
                    Ok(n)
                })
            })
            .collect();
        let mut sent = 0;
        for h in handles {
            sent += h.join().map_err(|_| "a producer thread panicked".to_string())??;
        }
        Ok(sent)
    })?;
    // Every send is settled once flushed; wait (bounded) for the callbacks.
    let settle = Instant::now() + Duration::from_secs(60);
    while tally.acked.load(Ordering::SeqCst) + tally.failed.load(Ordering::SeqCst) < sent {
        if Instant::now() > settle {
            return Err("acknowledgements stopped coming".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let secs = start.elapsed().as_secs_f64();
    if let Some(e) = tally.first_error.lock().map_err(err)?.take() {
        return Err(format!(
            "{} of {sent} records failed; the first: {e}",
            tally.failed.load(Ordering::SeqCst)
        ));
    }
    Ok((sent, secs))
}

pub fn produce(args: &Args) -> Result<Outcome, String> {
    let queues = queues(args, "bench-produce")?;
    let tally = Arc::new(Tally::default());
    let cpu = machine_cpu_s();
    let (records, secs) = run_producers(args, &queues, &tally, &AtomicBool::new(false), &|_| {})?;
    Ok(Outcome {
        records,
        bytes: records * args.message_bytes as u64,
        secs,
        latency: tally.latency(),
        cpu_s: machine_cpu_s() - cpu,
    })
}

/// One consumer per thread; partition `p` of every queue goes to consumer
/// `p mod consumers`. `on_record` sees every record; the loop ends when
/// `done` says so (checked after every poll) or at the deadline.
fn run_consumers(
    args: &Args,
    queues: &[String],
    start: Seek,
    ready: &AtomicU64,
    on_record: &(dyn Fn(&ConsumedRecord) + Sync),
    done: &(dyn Fn() -> bool + Sync),
    deadline: Instant,
) -> Result<Histogram<u64>, String> {
    let consumers = args.consumers.max(1);
    std::thread::scope(|scope| -> Result<Histogram<u64>, String> {
        let handles: Vec<_> = (0..consumers)
            .map(|i| {
                scope.spawn(move || -> Result<Histogram<u64>, String> {
                    let mut c = Consumer::new(
                        &args.brokers,
                        ConsumerConfig {
                            start,
                            max_wait: Duration::from_millis(100),
                            ..ConsumerConfig::default()
                        },
                    )
                    .map_err(err)?;
                    for q in queues {
                        let n = block_on(c.assign_all(q)).map_err(err)?;
                        for p in 0..n {
                            if p as usize % consumers != i {
                                c.unassign(q, p);
                            }
                        }
                    }
                    let mut polls = histogram();
                    if c.assignment().is_empty() {
                        ready.fetch_add(1, Ordering::SeqCst);
                        return Ok(polls);
                    }
                    // The first poll resolves the start positions.
                    let first = block_on(c.poll()).map_err(err)?;
                    ready.fetch_add(1, Ordering::SeqCst);
                    first.iter().for_each(on_record);
                    while !done() && Instant::now() < deadline {
                        let t = Instant::now();
                        let got = block_on(c.poll()).map_err(err)?;
                        polls.saturating_record(t.elapsed().as_nanos() as u64);
                        got.iter().for_each(on_record);
                    }
                    Ok(polls)
                })
            })
            .collect();
        let mut all = histogram();
        for h in handles {
            let part = h.join().map_err(|_| "a consumer thread panicked".to_string())??;
            all.add(&part).map_err(err)?;
        }
        Ok(all)
    })
}

pub fn consume(args: &Args) -> Result<Outcome, String> {
    let queue = args
        .queue
        .clone()
        .ok_or("consume needs --queue (an existing queue with records)")?;
    if args.passes > 1 {
        let per_pass = args.count.ok_or("consume --passes needs --count (records per pass)")?;
        if args.consumers > 1 {
            return Err("consume --passes reads with one consumer: leave out --consumers".into());
        }
        return consume_passes(args, &queue, per_pass);
    }
    let records = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let target = args.count.unwrap_or(u64::MAX);
    let (start, cpu) = (Instant::now(), machine_cpu_s());
    let polls = run_consumers(
        args,
        &[queue],
        Seek::Earliest,
        &AtomicU64::new(0),
        &|r| {
            records.fetch_add(1, Ordering::Relaxed);
            bytes.fetch_add(value_bytes(r), Ordering::Relaxed);
        },
        &|| records.load(Ordering::Relaxed) >= target,
        start + Duration::from_secs(args.seconds),
    )?;
    Ok(Outcome {
        records: records.load(Ordering::SeqCst),
        bytes: bytes.load(Ordering::SeqCst),
        secs: start.elapsed().as_secs_f64(),
        latency: Latency::from_nanos(&polls),
        cpu_s: machine_cpu_s() - cpu,
    })
}

/// [`consume`] with `--passes`: one consumer reads `per_pass` records from
/// the start of `queue`, seeks back, and again; pass 0 (connections,
/// metadata) is not counted.
fn consume_passes(args: &Args, queue: &str, per_pass: u64) -> Result<Outcome, String> {
    let mut c = Consumer::new(
        &args.brokers,
        ConsumerConfig {
            start: Seek::Earliest,
            max_wait: Duration::from_millis(100),
            ..ConsumerConfig::default()
        },
    )
    .map_err(err)?;
    block_on(c.assign_all(queue)).map_err(err)?;
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let mut polls = histogram();
    let (mut records, mut bytes, mut secs, mut cpu_s) = (0u64, 0u64, 0.0, 0.0);
    for pass in 0..=args.passes {
        c.seek_all(Seek::Earliest);
        let (start, cpu) = (Instant::now(), machine_cpu_s());
        let (mut n, mut b) = (0u64, 0u64);
        while n < per_pass {
            if Instant::now() > deadline {
                return Err(format!("pass {pass} read {n} of {per_pass} records in --seconds"));
            }
            let t = Instant::now();
            let got = block_on(c.poll()).map_err(err)?;
            if pass > 0 {
                polls.saturating_record(t.elapsed().as_nanos() as u64);
            }
            n += got.len() as u64;
            b += got.iter().map(value_bytes).sum::<u64>();
        }
        if pass > 0 {
            (records, bytes, secs) = (records + n, bytes + b, secs + start.elapsed().as_secs_f64());
            cpu_s += machine_cpu_s() - cpu;
        }
    }
    Ok(Outcome {
        records,
        bytes,
        secs,
        latency: Latency::from_nanos(&polls),
        cpu_s,
    })
}

/// The bytes of a consumed record's value: what `mib_s` counts.
fn value_bytes(r: &ConsumedRecord) -> u64 {
    r.value.as_ref().map_or(0, |v| v.len()) as u64
}

pub fn e2e(args: &Args) -> Result<Outcome, String> {
    if args.rate.is_none() && args.in_flight.is_none() {
        return Err("e2e needs --rate (records per second, open loop) or --in-flight N (closed loop)".into());
    }
    if args.in_flight.is_some() && args.producers > 1 {
        return Err("e2e --in-flight (closed loop) runs one producer: leave out --producers".into());
    }
    // Closed loop: records the consumers received, and a wake-up for the
    // producer waiting on them.
    let arrivals = (Mutex::new(0u64), std::sync::Condvar::new());
    // Set when the consumers stop (done, or failed): the closed loop's
    // producer then waits for nobody.
    let consumers_done = AtomicBool::new(false);
    let queues = queues(args, "bench-e2e")?;
    let received = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let e2e = Mutex::new(histogram());
    let ready = AtomicU64::new(0);
    let sent = AtomicU64::new(u64::MAX);
    let deadline = Instant::now() + Duration::from_secs(args.seconds + 60);
    let tally = Arc::new(Tally::default());
    let consumers = args.consumers.max(1) as u64;
    let (result, consumed) = std::thread::scope(|scope| {
        let consumed = scope.spawn(|| {
            let _done = SetOnDrop(&consumers_done);
            run_consumers(
                args,
                &queues,
                Seek::Latest,
                &ready,
                &|r| {
                    let due = r
                        .value
                        .as_ref()
                        .and_then(|v| v.get(..8))
                        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
                    if let Ok(mut h) = e2e.lock() {
                        h.saturating_record(now_ns().saturating_sub(due));
                    }
                    received.fetch_add(1, Ordering::Relaxed);
                    bytes.fetch_add(value_bytes(r), Ordering::Relaxed);
                    if args.in_flight.is_some() {
                        if let Ok(mut n) = arrivals.0.lock() {
                            *n += 1;
                            arrivals.1.notify_all();
                        }
                    }
                },
                &|| received.load(Ordering::Relaxed) >= sent.load(Ordering::Relaxed),
                deadline,
            )
        });
        // Producers start once every consumer sits at the end.
        while ready.load(Ordering::SeqCst) < consumers && !consumed.is_finished() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let cpu = machine_cpu_s();
        let gate = |sent: u64| {
            let Some(limit) = args.in_flight else { return };
            // Until all but limit - 1 of the records sent have arrived (a
            // lost record ends the wait at the deadline).
            let Ok(mut n) = arrivals.0.lock() else { return };
            while *n + limit <= sent && Instant::now() < deadline && !consumers_done.load(Ordering::SeqCst) {
                n = match arrivals.1.wait_timeout(n, Duration::from_millis(100)) {
                    Ok((n, _)) => n,
                    Err(_) => return,
                };
            }
        };
        let result = run_producers(args, &queues, &tally, &AtomicBool::new(false), &gate);
        let cpu_s = machine_cpu_s() - cpu;
        sent.store(result.as_ref().map_or(0, |r| r.0), Ordering::SeqCst);
        (result.map(|(records, secs)| (records, secs, cpu_s)), consumed.join())
    });
    let (records, secs, cpu_s) = result?;
    consumed.map_err(|_| "a consumer thread panicked".to_string())??;
    let got = received.load(Ordering::SeqCst);
    if got < records {
        return Err(format!("{got} of {records} records reached the consumers"));
    }
    let hist = e2e.lock().map_err(err)?;
    Ok(Outcome {
        records: got,
        bytes: bytes.load(Ordering::SeqCst),
        secs,
        latency: Latency::from_nanos(&hist),
        cpu_s,
    })
}

/// Runs a load scenario and prints its table and JSON line.
/// How sends are paced, for the report's title.
fn loop_kind(args: &Args) -> String {
    match (args.rate, args.in_flight) {
        (Some(r), _) => format!("open loop at {r}/s"),
        (None, Some(n)) => format!("closed loop, {n} in flight"),
        (None, None) => "as fast as the producer's buffer allows".into(),
    }
}

pub fn run(scenario: &str, args: Args) -> Result<(), String> {
    let broker_cpu = |pid| crate::report::process_cpu_s(pid).ok_or(format!("no process {pid} to read the CPU of"));
    let before = args.broker_pid.map(broker_cpu).transpose()?;
    let started = Instant::now();
    let outcome = match scenario {
        "produce" => produce(&args)?,
        "consume" => consume(&args)?,
        _ => e2e(&args)?,
    };
    let broker_cores = match (args.broker_pid, before) {
        (Some(pid), Some(before)) => Some((broker_cpu(pid)? - before) / started.elapsed().as_secs_f64().max(1e-9)),
        _ => None,
    };
    outcome.print(&format!(
        "{scenario} against {}: {} B records, {} producer(s), {} consumer(s), {} partition(s), keys {:?}, batch {} B, \
         linger {} ms, acks {}, {}",
        args.brokers,
        args.message_bytes,
        args.producers,
        args.consumers,
        args.partitions,
        args.keys,
        args.batch_bytes,
        args.linger_ms,
        args.acks,
        loop_kind(&args)
    ));
    if let Some(cores) = broker_cores {
        table("broker process", &[("CPU busy (its own, whole run)", cores, "cores")]);
    }
    let mut json = outcome.json(scenario);
    json["in_flight"] = args.in_flight.into();
    json["broker_cores"] = broker_cores.map(round2).into();
    println!("{json}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `strand` binary `cargo test --workspace` builds beside this test.
    fn strand_binary() -> std::path::PathBuf {
        let exe = std::env::current_exe().unwrap();
        let path = exe.parent().and_then(|deps| deps.parent()).unwrap().join("strand");
        assert!(
            path.exists(),
            "{} is missing: build it first (cargo build -p strand-broker), or run cargo test --workspace",
            path.display()
        );
        path
    }

    #[test]
    fn produce_consume_and_e2e_run_against_a_broker() {
        let dir = tempfile::tempdir().unwrap();
        let broker = crate::suite::OwnBroker::start(&strand_binary(), &dir.path().to_path_buf(), Some(2)).unwrap();
        let base = Args {
            brokers: broker.addr.clone(),
            queue: None,
            queues: 2,
            partitions: 3,
            producers: 2,
            consumers: 2,
            message_bytes: 200,
            keys: Keys::Zipf(50, 1.0),
            batch_bytes: 16 << 10,
            linger_ms: 1,
            acks: "all".into(),
            fsync: "interval".into(),
            seconds: 30,
            count: Some(3000),
            rate: None,
            max_in_flight: 2,
            max_requests_per_connection: strand_client::DEFAULT_MAX_REQUESTS_PER_CONNECTION,
            in_flight: None,
            broker_pid: None,
            passes: 1,
        };
        let produced = produce(&base).unwrap();
        assert_eq!(produced.records, 3000);
        assert_eq!(produced.bytes, 3000 * 200);
        assert!(produced.latency.p50_us > 0.0 && produced.latency.p99_us >= produced.latency.p50_us);

        // A queue of its own to read back exactly what went in.
        let one = Args {
            queues: 1,
            ..base.clone()
        };
        let admin = Admin::connect(&broker.addr).unwrap();
        let queue = fresh_queue(&admin, "bench-test", 3, FsyncSpec::Always).unwrap();
        produce(&Args {
            queue: Some(queue.clone()),
            count: Some(1000),
            ..one.clone()
        })
        .unwrap();
        let consumed = consume(&Args {
            queue: Some(queue.clone()),
            count: Some(1000),
            ..one.clone()
        })
        .unwrap();
        assert_eq!(consumed.records, 1000);
        // Passes: at least the first 600 records (whole batches) three
        // times over, the warm-up pass not counted.
        let passes = consume(&Args {
            queue: Some(queue),
            count: Some(600),
            passes: 3,
            consumers: 1,
            ..one.clone()
        })
        .unwrap();
        assert!((3 * 600..=3 * 1000).contains(&passes.records), "{}", passes.records);
        assert_eq!(passes.bytes, passes.records * 200);

        let open = e2e(&Args {
            count: None,
            seconds: 1,
            rate: Some(2000),
            ..one.clone()
        })
        .unwrap();
        assert!(open.records >= 1900, "{} records", open.records);
        assert!(open.latency.p50_us > 0.0);
        assert!(open.latency.p50_us < 1_000_000.0, "{:?}", open.latency);

        // Closed loop: one record in flight, so every record is a request
        // of its own (with linger 0); and an e2e round per record.
        let closed = Args {
            producers: 1,
            linger_ms: 0,
            in_flight: Some(1),
            count: Some(200),
            ..one
        };
        let before = broker.counters().unwrap().produce_requests;
        let produced = produce(&closed).unwrap();
        let requests = broker.counters().unwrap().produce_requests - before;
        assert_eq!((produced.records, requests), (200, 200.0));
        assert!(produced.latency.p50_us > 0.0);
        let e2e_closed = e2e(&Args {
            count: None,
            seconds: 1,
            ..closed.clone()
        })
        .unwrap();
        assert!(e2e_closed.records > 0 && e2e_closed.latency.p50_us > 0.0);
        assert!(
            produce(&Args {
                rate: Some(100),
                ..closed.clone()
            })
            .is_err(),
            "open or closed, not both"
        );
        assert!(e2e(&Args { producers: 2, ..closed }).is_err());
    }

    #[test]
    fn key_specs_parse() {
        assert_eq!("none".parse::<Keys>(), Ok(Keys::None));
        assert_eq!("uniform:10".parse::<Keys>(), Ok(Keys::Uniform(10)));
        assert_eq!("zipf:100".parse::<Keys>(), Ok(Keys::Zipf(100, 1.0)));
        assert_eq!("zipf:100:1.5".parse::<Keys>(), Ok(Keys::Zipf(100, 1.5)));
        for bad in ["", "uniform", "uniform:0", "zipf:x", "zipf:10:y", "hot"] {
            assert!(bad.parse::<Keys>().is_err(), "{bad}");
        }
    }

    #[test]
    fn zipf_keys_are_hot_and_uniform_keys_are_not() {
        let count = |keys: Keys| {
            let mut g = KeyGen::new(keys, 42);
            let mut c = vec![0u32; 100];
            for _ in 0..100_000 {
                c[g.next_index().unwrap() as usize] += 1;
            }
            c
        };
        let zipf = count(Keys::Zipf(100, 1.0));
        // Key 0 weighs 1/H(100) ≈ 19% of draws; key 99 ≈ 0.2%.
        assert!(zipf[0] > 15_000 && zipf[0] < 23_000, "{}", zipf[0]);
        assert!(zipf[99] < 600, "{}", zipf[99]);
        let uniform = count(Keys::Uniform(100));
        assert!(uniform.iter().all(|&n| (700..1300).contains(&n)), "{uniform:?}");
        assert_eq!(KeyGen::new(Keys::None, 1).next_index(), None);
    }
}
